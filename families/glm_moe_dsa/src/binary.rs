//! What the `glm_moe_dsa` binary adds to the kit's driver
//! ([`family_kit::driver`]): no flags of its own, the model
//! `--write-generated` writes (the public checkpoint's sizes), and its part
//! of the report (the hyperparameters, the census, the tensors per route with
//! a device copy, the experts staged per stack).

use std::collections::BTreeMap;

use family_kit::FixtureSpec;
use family_kit::driver::{Failure, FamilyBinary, FamilyReport, Files, NoFlags, Run};
use serde_json::json;

use crate::family::GlmMoeDsaDecoder;
use crate::model::Ffn;
use crate::{GlmMoeDsa, GlmMoeDsaFamily};

impl FamilyBinary for GlmMoeDsaFamily {
    type Flags = NoFlags;
    const ABOUT: &'static str =
        "glm-dsa: check a file against the manifest and decode greedily through the seam";

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
        model: &GlmMoeDsa,
        _: &(),
        decoder: &GlmMoeDsaDecoder<'_>,
    ) -> Result<FamilyReport, Failure> {
        let hp = model.hparams();
        let weights = model.weights();
        // Per route: claimed tensors, and those with a device copy now.
        let mut routes: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
        for (spec, w) in model.manifest().tensors.iter().zip(weights.all()) {
            let e = routes.entry(spec.route.name()).or_default();
            e.0 += 1;
            e.1 += usize::from(w.device_copy().is_some());
        }
        let routes: BTreeMap<&str, serde_json::Value> = routes
            .into_iter()
            .map(|(r, (n, staged))| (r, json!({"tensors": n, "staged_now": staged})))
            .collect();
        // Per expert stack, its experts with a device copy (each staged once).
        let mut per_stack: BTreeMap<&str, usize> = BTreeMap::new();
        for layer in &model.handles().layers {
            if let Ffn::Moe { stacks, .. } = layer.ffn {
                for h in stacks {
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
                    per_stack.insert(name, staged);
                }
            }
        }
        let json = json!({
            "model": hp,
            "census": model.census(),
            "drop_rules": model.manifest().drop_rules(),
            "routes": routes,
            "weights": {
                "experts_made": weights.experts_made().count(),
                "staged": weights.staged(),
                "whole_stacks_staged": weights.whole_stacks_staged(),
                "kept_dequantized": decoder.either(|h| h.reader().kept().0, |d| d.kept()),
            },
            "experts_staged_per_stack": per_stack,
        });
        let text = format!(
            "glm-dsa: {} layers; {} experts made, {} stacks staged whole\n",
            hp.n_layer,
            weights.experts_made().count(),
            weights.whole_stacks_staged(),
        );
        Ok(FamilyReport::new(json, text))
    }
}
