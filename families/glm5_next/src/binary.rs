//! What the `glm5_next` binary adds to the kit's driver
//! ([`family_kit::driver`]): no flags of its own, the model
//! `--write-generated` writes (the public checkpoint's sizes), and its part
//! of the report (the layer kinds, the census, the weights staged by route
//! and the experts staged per bank).

use std::collections::BTreeMap;

use family_kit::FixtureSpec;
use family_kit::driver::{Failure, FamilyBinary, FamilyReport, Files, NoFlags, Run};
use family_kit::manifest::Route;
use serde_json::json;

use crate::family::Glm5NextDecoder;
use crate::{Glm5Next, Glm5NextFamily, LayerKind};

impl FamilyBinary for Glm5NextFamily {
    type Flags = NoFlags;
    const ABOUT: &'static str =
        "glm5-next: check a file against the manifest and decode greedily through the seam";

    fn generated(layers: u64) -> Option<FixtureSpec> {
        Some(crate::fixture::generated(
            &crate::fixture::Shape::checkpoint(layers),
        ))
    }

    fn companion(_: &NoFlags, _: &mut Files<'_, '_>) -> Result<(), Failure> {
        Ok(())
    }

    fn report(
        _: &NoFlags,
        _: &Run<'_, '_>,
        model: &Glm5Next,
        _: &(),
        decoder: &Glm5NextDecoder<'_>,
    ) -> Result<FamilyReport, Failure> {
        let hp = model.hparams();
        let weights = model.weights();
        let count_route = |r: Route| {
            model
                .manifest()
                .tensors
                .iter()
                .filter(|t| t.route == r)
                .count()
        };
        // Per bank, its experts with a device copy (each staged once).
        let banks: BTreeMap<&str, usize> = model
            .banks()
            .iter()
            .flat_map(|b| b.each())
            .map(|(h, _)| {
                let name = model.get(h).name();
                let staged = weights
                    .experts_made()
                    .filter(|w| w.device_copy().is_some())
                    .filter(|w| {
                        w.name()
                            .strip_prefix(name)
                            .is_some_and(|r| r.starts_with('['))
                    })
                    .count();
                (name, staged)
            })
            .collect();
        let layers_of = |k: LayerKind| -> Vec<usize> {
            (0..hp.n_layer).filter(|&l| hp.layers[l] == k).collect()
        };
        let json = json!({
            "model": {
                "n_layer": hp.n_layer,
                "block_count": hp.block_count,
                "kda_layers": layers_of(LayerKind::Kda),
                "mla_layers": layers_of(LayerKind::Mla),
                "n_expert": hp.n_expert,
                "n_expert_used": hp.n_expert_used,
                "n_embd": hp.n_embd,
                "hc": hp.hc,
            },
            "census": model.census(),
            "drop_rules": model.manifest().drop_rules(),
            "weights": {
                "dense": count_route(Route::Dense),
                "expert_stacks": count_route(Route::ExpertStack),
                "lazy_tables": count_route(Route::LazyTable),
                "experts_made": weights.experts_made().count(),
                "staged": weights.staged(),
                "whole_stacks_staged": weights.whole_stacks_staged(),
                "kept_dequantized": decoder.either(|h| h.reader().kept().0, |d| d.kept()),
            },
            "experts_staged_per_bank": banks,
        });
        let text = format!(
            "glm5-next: {} layers ({} KDA, {} MLA); {} experts made, {} banks staged whole\n",
            hp.n_layer,
            layers_of(LayerKind::Kda).len(),
            layers_of(LayerKind::Mla).len(),
            weights.experts_made().count(),
            weights.whole_stacks_staged(),
        );
        Ok(FamilyReport::new(json, text))
    }
}
