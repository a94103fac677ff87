//! The text model's manifest (`docs/families/muse_glimmer.md` section 2),
//! checked both ways, and its weights borrowed by handle.

use family_kit::{
    Census, Dims, Handle, LoadError, LoadedWeights, Manifest, ManifestBuilder, Route, TypeClass,
};
use seam::gguf::GgufModel;
use seam::weight::Weight;

use crate::hparams::{ARCH, Hparams};

/// The handles of one layer's tensors.
#[derive(Clone, Debug)]
pub struct LayerHandles {
    /// Pre-attention norm (folded gamma).
    pub attn_norm: Handle,
    /// Q, K, V projections.
    pub q: Handle,
    /// K projection.
    pub k: Handle,
    /// V projection.
    pub v: Handle,
    /// Optional biases of Q, K, V (added after the matmul and its scale).
    pub q_bias: Option<Handle>,
    /// K bias.
    pub k_bias: Option<Handle>,
    /// V bias.
    pub v_bias: Option<Handle>,
    /// Optional `{1}` scales llama.cpp applies: Q, K, V, output.
    pub q_scale: Option<Handle>,
    /// K scale.
    pub k_scale: Option<Handle>,
    /// V scale.
    pub v_scale: Option<Handle>,
    /// Output-projection scale.
    pub o_scale: Option<Handle>,
    /// Per-head Q norm.
    pub q_norm: Handle,
    /// Per-head K norm.
    pub k_norm: Handle,
    /// The attention output gate.
    pub gate: Handle,
    /// The attention output projection.
    pub output: Handle,
    /// Post-attention norm.
    pub post_attention_norm: Handle,
    /// Pre-FFN norm.
    pub ffn_norm: Handle,
    /// FFN gate.
    pub ffn_gate: Handle,
    /// FFN up.
    pub ffn_up: Handle,
    /// FFN down.
    pub ffn_down: Handle,
    /// Post-FFN norm.
    pub post_ffw_norm: Handle,
}

/// A loaded muse-glimmer text model: hyperparameters, manifest, weights.
pub struct MuseGlimmer {
    hparams: Hparams,
    manifest: Manifest,
    census: Census,
    weights: LoadedWeights,
    token_embd: Handle,
    output_norm: Handle,
    output: Handle,
    layers: Vec<LayerHandles>,
}

impl std::fmt::Debug for MuseGlimmer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MuseGlimmer")
            .field("hparams", &self.hparams)
            .field("tensors", &self.manifest.tensors.len())
            .finish()
    }
}

/// `.scale` and `.input_scale` tensors llama.cpp loads but never applies
/// for this architecture (`muse-glimmer.cpp:102,158-163`): dropped by name.
fn unused_scale(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("blk.") else {
        return false;
    };
    let Some((layer, suffix)) = rest.split_once('.') else {
        return false;
    };
    layer.parse::<u32>().is_ok()
        && (suffix.ends_with(".input_scale")
            || matches!(
                suffix,
                "attn_gate.scale" | "ffn_gate.scale" | "ffn_up.scale" | "ffn_down.scale"
            ))
}

impl MuseGlimmer {
    /// Reads the keys, checks the tensor table against the manifest both
    /// ways and borrows every claimed weight (nothing is read or staged).
    ///
    /// # Errors
    ///
    /// A key or a tensor does not fit (named).
    pub fn load(model: &GgufModel) -> Result<MuseGlimmer, LoadError> {
        // The vocabulary is the embedding table's rows (no key holds it).
        let n_vocab = model
            .tensor("token_embd.weight")
            .ok_or_else(|| LoadError::MissingTensor {
                arch: ARCH,
                name: "token_embd.weight".into(),
            })?
            .dims
            .get(1)
            .copied()
            .unwrap_or(1);
        let hp = Hparams::from_header(model.header(), n_vocab)?;
        let (e, v, hd) = (hp.n_embd as u64, hp.n_vocab as u64, hp.head_dim as u64);
        let (n_q, n_kv, n_ff) = (hp.n_q() as u64, hp.n_kv() as u64, hp.n_ff as u64);
        let mut b = ManifestBuilder::new(ARCH, model.tensors());
        let token_embd = b.global(
            "token_embd",
            Dims::Exact(vec![e, v]),
            TypeClass::Any,
            Route::Dense,
        );
        let output_norm = b.global(
            "output_norm",
            Dims::Exact(vec![e]),
            TypeClass::F32,
            Route::Dense,
        );
        let output = b.global(
            "output",
            Dims::Exact(vec![e, v]),
            TypeClass::Any,
            Route::Dense,
        );
        let mut layers = Vec::with_capacity(hp.n_layer);
        for l in 0..hp.n_layer {
            let norm = |b: &mut ManifestBuilder, s: &str, role, n| {
                b.layer(
                    l,
                    &format!("{s}.weight"),
                    role,
                    Dims::Exact(vec![n]),
                    TypeClass::F32,
                )
            };
            let mat = |b: &mut ManifestBuilder, s: &str, role, i, o| {
                b.layer(
                    l,
                    &format!("{s}.weight"),
                    role,
                    Dims::Exact(vec![i, o]),
                    TypeClass::Any,
                )
            };
            let opt = |b: &mut ManifestBuilder, name: String, role, n| {
                b.optional(
                    name,
                    role,
                    Some(l),
                    Dims::Exact(vec![n]),
                    TypeClass::F32,
                    Route::Dense,
                )
            };
            let p = format!("blk.{l}.");
            layers.push(LayerHandles {
                attn_norm: norm(&mut b, "attn_norm", "attn_norm", e),
                q: mat(&mut b, "attn_q", "attn_q", e, n_q),
                k: mat(&mut b, "attn_k", "attn_k", e, n_kv),
                v: mat(&mut b, "attn_v", "attn_v", e, n_kv),
                q_bias: opt(&mut b, format!("{p}attn_q.bias"), "attn_q_bias", n_q),
                k_bias: opt(&mut b, format!("{p}attn_k.bias"), "attn_k_bias", n_kv),
                v_bias: opt(&mut b, format!("{p}attn_v.bias"), "attn_v_bias", n_kv),
                q_scale: opt(&mut b, format!("{p}attn_q.scale"), "attn_scale", 1),
                k_scale: opt(&mut b, format!("{p}attn_k.scale"), "attn_scale", 1),
                v_scale: opt(&mut b, format!("{p}attn_v.scale"), "attn_scale", 1),
                o_scale: opt(&mut b, format!("{p}attn_output.scale"), "attn_scale", 1),
                q_norm: norm(&mut b, "attn_q_norm", "attn_q_norm", hd),
                k_norm: norm(&mut b, "attn_k_norm", "attn_k_norm", hd),
                gate: mat(&mut b, "attn_gate", "attn_gate", e, n_q),
                output: mat(&mut b, "attn_output", "attn_output", n_q, e),
                post_attention_norm: norm(&mut b, "post_attention_norm", "post_attention_norm", e),
                ffn_norm: norm(&mut b, "ffn_norm", "ffn_norm", e),
                ffn_gate: mat(&mut b, "ffn_gate", "ffn_gate", e, n_ff),
                ffn_up: mat(&mut b, "ffn_up", "ffn_up", e, n_ff),
                ffn_down: mat(&mut b, "ffn_down", "ffn_down", n_ff, e),
                post_ffw_norm: norm(&mut b, "post_ffw_norm", "post_ffw_norm", e),
            });
        }
        b.drop_when(
            "blk.N.{attn_gate,ffn_gate,ffn_up,ffn_down}.scale, blk.N.*.input_scale",
            "loaded but never applied by llama.cpp for muse-glimmer",
            unused_scale,
        );
        let manifest = b.build();
        manifest.check(model.tensors())?;
        let census = manifest.census(model.tensors());
        let weights = LoadedWeights::load(&manifest, model)?;
        Ok(MuseGlimmer {
            hparams: hp,
            manifest,
            census,
            weights,
            token_embd,
            output_norm,
            output,
            layers,
        })
    }

    /// The hyperparameters.
    pub fn hparams(&self) -> &Hparams {
        &self.hparams
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The census of the file against the manifest.
    pub fn census(&self) -> &Census {
        &self.census
    }

    /// Every claimed weight.
    pub fn weights(&self) -> &LoadedWeights {
        &self.weights
    }

    /// The weight of `handle`.
    pub fn get(&self, handle: Handle) -> &Weight {
        self.weights.get(handle)
    }

    /// The token embedding table.
    pub fn token_embd(&self) -> &Weight {
        self.get(self.token_embd)
    }

    /// The final norm.
    pub fn output_norm(&self) -> &Weight {
        self.get(self.output_norm)
    }

    /// The output head.
    pub fn output(&self) -> &Weight {
        self.get(self.output)
    }

    /// The handles of layer `l`'s tensors.
    pub fn layers(&self) -> &[LayerHandles] {
        &self.layers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_unused_scales_are_dropped() {
        for name in [
            "blk.0.attn_gate.scale",
            "blk.12.ffn_down.scale",
            "blk.1.attn_q.input_scale",
        ] {
            assert!(unused_scale(name), "{name}");
        }
        for name in [
            "blk.0.attn_q.scale",
            "blk.0.attn_output.scale",
            "blk.x.ffn_up.scale",
            "ffn_up.scale",
        ] {
            assert!(!unused_scale(name), "{name}");
        }
    }
}
