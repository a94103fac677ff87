//! The `muse-glimmer.*` keys as llama.cpp reads them
//! (`docs/families/muse_glimmer.md` section 1): an absent optional key
//! takes the architecture's own value (softcap 30, pattern every 4th layer
//! full, RoPE base 10000), never a neutral one.

use family_kit::{LoadError, Meta};
use seam::gguf::{Header, Value};
use serde::Serialize;

/// The GGUF architecture name.
pub const ARCH: &str = "muse-glimmer";

/// The eps of the post-attention and post-FFN norms: a constant of the
/// architecture, no key (`muse-glimmer.cpp:62-63`).
pub const POST_NORM_EPS: f32 = 1e-8;

/// The final logit softcap when the key is absent: llama.cpp's hparams
/// default (`src/llama-hparams.h:136`), not "no cap".
pub const DEFAULT_SOFTCAP: f32 = 30.0;

/// The sliding-window pattern period when the key is absent
/// (`llama-model.cpp:3434-3441`): layers 3, 7, 11, ... are full.
pub const DEFAULT_SWA_PERIOD: u64 = 4;

/// The hyperparameters of a muse-glimmer text model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Hparams {
    /// Hidden width E.
    pub n_embd: usize,
    /// Layers.
    pub n_layer: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Head size (keys and values).
    pub head_dim: usize,
    /// FFN width.
    pub n_ff: usize,
    /// Vocabulary (rows of `token_embd`).
    pub n_vocab: usize,
    /// Rotated dims of a head (SWA layers).
    pub n_rot: usize,
    /// RoPE base of the SWA layers (full layers have no RoPE).
    pub rope_base: f32,
    /// The RMSNorm eps (embedding, pre-norms, q/k norms, output norm).
    pub eps: f32,
    /// The sliding window, the query's own position included.
    pub n_swa: usize,
    /// Per layer: sliding-window (roped) or full (no RoPE).
    pub is_swa: Vec<bool>,
    /// Final logit softcap `c` (0: off).
    pub softcap: f32,
    /// The logits multiplier.
    pub logit_scale: f32,
}

fn usize_of(meta: &Meta<'_>, name: &str, v: u64) -> Result<usize, LoadError> {
    usize::try_from(v).map_err(|_| meta.bad(name, format!("{v} does not fit this machine")))
}

/// One value for every layer, or a refusal naming the key.
fn uniform(
    meta: &Meta<'_>,
    name: &str,
    n_layer: usize,
    block_count: u64,
) -> Result<Option<u64>, LoadError> {
    match meta.per_layer(name, n_layer, block_count)? {
        None => Ok(None),
        Some(v) => match v.first() {
            Some(&first) if v.iter().all(|&x| x == first) => Ok(Some(first)),
            Some(_) => Err(meta.bad(
                name,
                format!("per-layer values {v:?} differ; muse-glimmer layers share one"),
            )),
            None => Err(meta.bad(name, "an empty array")),
        },
    }
}

impl Hparams {
    /// Reads and checks the keys of `header`; `n_vocab` is the row count of
    /// `token_embd.weight` (checked by the manifest).
    ///
    /// # Errors
    ///
    /// A required key is absent, a key has the wrong type or an
    /// inconsistent value (named).
    pub fn from_header(header: &Header, n_vocab: u64) -> Result<Hparams, LoadError> {
        let meta = Meta::for_arch(header, &[ARCH])?;
        meta.req_positive("context_length")?;
        let n_embd = usize_of(
            &meta,
            "embedding_length",
            meta.req_positive("embedding_length")?,
        )?;
        let block_count = meta.req_positive("block_count")?;
        let n_layer = usize_of(&meta, "block_count", block_count)?;
        let n_ff = uniform(&meta, "feed_forward_length", n_layer, block_count)?.unwrap_or(0);
        let n_ff = usize_of(
            &meta,
            "feed_forward_length",
            meta.positive("feed_forward_length", n_ff)?,
        )?;
        let n_head = uniform(&meta, "attention.head_count", n_layer, block_count)?
            .ok_or_else(|| meta.missing("attention.head_count"))?;
        let n_head = meta.positive("attention.head_count", n_head)?;
        let n_head_kv =
            uniform(&meta, "attention.head_count_kv", n_layer, block_count)?.unwrap_or(n_head);
        let n_head_kv = meta.positive("attention.head_count_kv", n_head_kv)?;
        if n_head % n_head_kv != 0 {
            return Err(meta.bad(
                "attention.head_count_kv",
                format!("{n_head_kv} does not divide attention.head_count {n_head}"),
            ));
        }
        let hd_k = match meta.opt_u64("attention.key_length")? {
            Some(v) => v,
            None => n_embd as u64 / n_head,
        };
        let hd_k = meta.positive("attention.key_length", hd_k)?;
        let hd_v = meta.opt_u64("attention.value_length")?.unwrap_or(hd_k);
        if hd_v != hd_k {
            return Err(meta.bad(
                "attention.value_length",
                format!(
                    "{hd_v} differs from attention.key_length {hd_k} (the graph asserts them equal)"
                ),
            ));
        }
        for name in ["attention.key_length_swa", "attention.value_length_swa"] {
            if let Some(v) = meta.opt_u64(name)?
                && v != hd_k
            {
                return Err(meta.bad(name, format!("{v} differs from the full layers' head size {hd_k}: llama.cpp uses one head size for every layer")));
            }
        }
        let eps = meta
            .opt_f32("attention.layer_norm_rms_epsilon")?
            .ok_or_else(|| meta.missing("attention.layer_norm_rms_epsilon"))?;
        if !(eps.is_finite() && eps >= 0.0) {
            return Err(meta.bad("attention.layer_norm_rms_epsilon", format!("{eps}")));
        }
        let n_swa = meta.req_positive("attention.sliding_window")?;
        let is_swa = match meta.get("attention.sliding_window_pattern") {
            Some(Value::Array(_)) => meta
                .opt_bool_array("attention.sliding_window_pattern")?
                .unwrap_or_default(),
            Some(_) => {
                let n = meta.req_u64("attention.sliding_window_pattern")?;
                (0..block_count)
                    .map(|il| n == 0 || il % n < n - 1)
                    .collect()
            }
            None => (0..block_count)
                .map(|il| il % DEFAULT_SWA_PERIOD < DEFAULT_SWA_PERIOD - 1)
                .collect(),
        };
        meta.check_per_layer_len(
            "attention.sliding_window_pattern",
            is_swa.len(),
            n_layer,
            block_count,
        )?;
        let n_rot_full = meta.opt_u64("rope.dimension_count")?.unwrap_or(hd_k);
        // The graph uses layer 0's n_rot for every layer (llama-graph.cpp:1468).
        let n_rot = if is_swa[0] {
            meta.opt_u64("rope.dimension_count_swa")?
                .unwrap_or(n_rot_full)
        } else {
            n_rot_full
        };
        if n_rot % 2 != 0 || n_rot > hd_k {
            return Err(meta.bad(
                "rope.dimension_count",
                format!("{n_rot} must be even and at most the head size {hd_k}"),
            ));
        }
        let base = meta.opt_f32("rope.freq_base")?.unwrap_or(10000.0);
        let rope_base = meta.opt_f32("rope.freq_base_swa")?.unwrap_or(base);
        if !(rope_base.is_finite() && rope_base > 0.0) {
            return Err(meta.bad("rope.freq_base_swa", format!("{rope_base} must be > 0")));
        }
        let softcap = meta
            .opt_f32("final_logit_softcapping")?
            .unwrap_or(DEFAULT_SOFTCAP);
        if !(softcap.is_finite() && softcap >= 0.0) {
            return Err(meta.bad("final_logit_softcapping", format!("{softcap}")));
        }
        let logit_scale = meta
            .opt_f32("logit_scale")?
            .ok_or_else(|| meta.missing("logit_scale"))?;
        if !logit_scale.is_finite() {
            return Err(meta.bad("logit_scale", format!("{logit_scale}")));
        }
        Ok(Hparams {
            n_embd,
            n_layer,
            n_head: usize_of(&meta, "attention.head_count", n_head)?,
            n_head_kv: usize_of(&meta, "attention.head_count_kv", n_head_kv)?,
            head_dim: usize_of(&meta, "attention.key_length", hd_k)?,
            n_ff,
            n_vocab: usize_of(&meta, "vocab_size", n_vocab)?,
            n_rot: usize_of(&meta, "rope.dimension_count", n_rot)?,
            rope_base,
            eps,
            n_swa: usize_of(&meta, "attention.sliding_window", n_swa)?,
            is_swa: is_swa[..n_layer].to_vec(),
            softcap,
            logit_scale,
        })
    }

    /// Query width `n_head · head_dim`.
    pub fn n_q(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Key/value width `n_head_kv · head_dim`.
    pub fn n_kv(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}

#[cfg(test)]
mod tests {
    use seam::gguf::{Array, GgufModel};

    use super::*;

    fn hparams(edit: impl FnOnce(&mut family_kit::FixtureSpec)) -> Hparams {
        let mut spec = crate::fixture::tiny();
        edit(&mut spec);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.gguf");
        spec.write_file(&path).unwrap();
        let model = GgufModel::open(&path, seam::borrow::MapOptions { prefault: false }).unwrap();
        Hparams::from_header(model.header(), 64).unwrap()
    }

    #[test]
    fn absent_keys_take_the_architectures_values() {
        let key = |k: &str| format!("{ARCH}.{k}");
        let h = hparams(|s| {
            for k in [
                "final_logit_softcapping",
                "attention.head_count_kv",
                "rope.freq_base_swa",
                "attention.key_length",
                "attention.value_length",
            ] {
                assert!(s.remove_key(&key(k)), "{k}");
            }
            s.set_key(&key("rope.freq_base"), Value::F32(500.0));
        });
        assert_eq!(h.softcap, DEFAULT_SOFTCAP);
        assert_eq!(h.n_head_kv, h.n_head);
        assert_eq!(h.head_dim, 64 / 2);
        assert_eq!(h.rope_base, 500.0);
        assert_eq!(h.n_rot, h.head_dim);
        assert_eq!(h.is_swa, [true, true, true, false]);
        let pattern =
            |v: Value| hparams(|s| s.set_key(&key("attention.sliding_window_pattern"), v)).is_swa;
        assert_eq!(pattern(Value::U32(2)), [true, false, true, false]);
        assert_eq!(pattern(Value::U32(0)), [true; 4]);
        assert_eq!(
            pattern(Value::Array(Array::Bool(vec![false, true, true, false]))),
            [false, true, true, false]
        );
        assert_eq!(
            pattern(Value::Array(Array::U8(vec![0, 0, 1, 1]))),
            [false, false, true, true]
        );
        assert_eq!(
            hparams(|s| s.set_key(&key("final_logit_softcapping"), Value::F32(0.0))).softcap,
            0.0
        );
    }
}
