//! What the `qwen4_exp` binary adds to the kit's driver
//! ([`family_kit::driver`]): the model `--write-generated` writes, and its
//! part of the report (the layer kinds, the census, the weights staged by
//! route, the largest weight in `f32`).

use family_kit::FixtureSpec;
use family_kit::driver::{Failure, FamilyBinary, FamilyReport, Files, NoFlags, Run};
use serde_json::json;

use crate::family::Qwen4ExpAnyDecoder;
use crate::{LayerKind, Qwen4Exp, Qwen4ExpFamily, Route, fixture};

fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1048576.0
}

impl FamilyBinary for Qwen4ExpFamily {
    type Flags = NoFlags;
    const ABOUT: &'static str =
        "qwen4exp: check a file against the manifest and decode greedily through the seam";

    fn generated(layers: u64) -> Option<FixtureSpec> {
        Some(fixture::generated(&fixture::Shape::checkpoint(layers)))
    }

    fn companion(_: &NoFlags, _: &mut Files<'_, '_>) -> Result<(), Failure> {
        Ok(())
    }

    fn report(
        _: &NoFlags,
        _: &Run<'_, '_>,
        model: &Qwen4Exp,
        _: &(),
        decoder: &Qwen4ExpAnyDecoder<'_>,
    ) -> Result<FamilyReport, Failure> {
        let hp = model.hparams();
        let census = model.census();
        let count_route = |r: Route| {
            model
                .manifest()
                .tensors
                .iter()
                .filter(|t| t.route == r)
                .count()
        };
        let layers_of = |k: LayerKind| -> Vec<usize> {
            (0..hp.n_layer).filter(|&l| hp.layers[l] == k).collect()
        };
        let largest = model
            .manifest()
            .tensors
            .iter()
            .map(|t| 4 * t.dims.canonical().iter().product::<u64>())
            .max()
            .unwrap_or(0);
        let json = json!({
            "model": {
                "n_layer": hp.n_layer,
                "block_count": hp.block_count,
                "gdn_layers": layers_of(LayerKind::Gdn),
                "full_attention_layers": layers_of(LayerKind::FullAttention),
                "ple_layer": hp.ple.as_ref().map(|p| p.layer),
                "hc": hp.hc,
                "n_expert": hp.n_expert,
                "n_expert_used": hp.n_expert_used,
                "n_embd": hp.n_embd,
            },
            "census": census,
            "drop_rules": model.manifest().drop_rules(),
            "weights": {
                "dense": count_route(Route::Dense),
                "expert_stacks": count_route(Route::ExpertStack),
                "lazy_tables": count_route(Route::LazyTable),
                "experts_made": model.experts_made().count(),
                "staged": model.staged_weights(),
                "whole_stacks_staged": model.whole_stacks_staged(),
                "kept_dequantized": crate::family::kept_dequantized(decoder),
            },
            "largest_weight_f32_mib": mib(largest),
        });
        let text = format!(
            "qwen4exp: {} layers ({} GDN, {} full attention), {} experts ({} used), hc {}; \
             {} weights staged, {} experts made, {} stacks staged whole\n",
            hp.n_layer,
            layers_of(LayerKind::Gdn).len(),
            hp.full_attention_layers().len(),
            hp.n_expert,
            hp.n_expert_used.first().copied().unwrap_or(0),
            hp.hc,
            model.staged_weights(),
            model.experts_made().count(),
            model.whole_stacks_staged(),
        );
        Ok(FamilyReport::new(json, text))
    }
}
