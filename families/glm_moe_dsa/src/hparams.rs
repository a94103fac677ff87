//! Hyperparameters from `glm-dsa.*` metadata (docs/families/glm_moe_dsa.md,
//! section 1), with llama.cpp's own defaults for absent optional keys and
//! refusals by key name where a file is outside the spec.

use family_kit::{LoadError, Meta};
use seam::gguf::{Header, Value};
use serde::Serialize;

/// The architecture name llama.cpp registers.
pub const ARCH: &str = "glm-dsa";

/// From this context length on, a file without `attention.indexer.types`
/// gets the GLM-5.2 default table (`glm-dsa.cpp:59-65`).
pub const DEFAULT_TABLE_CONTEXT: u64 = 1 << 20;

/// `GLM_5_2_DEFAULT_INDEXER_TYPES` (`glm-dsa.cpp:6-27`): layers 0 and 1
/// full, then full, shared, shared, shared; 78 entries, shared past them.
pub fn glm_5_2_default_types(n_layer: usize) -> Vec<bool> {
    (0..n_layer)
        .map(|il| il < 78 && (il < 2 || (il - 2) % 4 == 0))
        .collect()
}

/// The model's hyperparameters.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Hparams {
    /// `block_count` (trunk layers and MTP blocks).
    pub block_count: usize,
    /// Trunk layers: `block_count - nextn_predict_layers`.
    pub n_layer: usize,
    /// `context_length` (it picks the default indexer types).
    pub n_ctx_train: u64,
    /// E.
    pub n_embd: usize,
    /// H.
    pub n_head: usize,
    /// Epsilon of every RMSNorm.
    pub eps: f32,
    /// `key_length_mla` (Dk = qk_nope + n_rot).
    pub dk: usize,
    /// `value_length_mla` (Dv).
    pub dv: usize,
    /// `rope.dimension_count` (R).
    pub n_rot: usize,
    /// `rope.freq_base`.
    pub freq_base: f32,
    /// q LoRA rank.
    pub q_lora: usize,
    /// kv LoRA rank (the latent).
    pub kv_lora: usize,
    /// Routed experts.
    pub n_expert: usize,
    /// Experts used per token.
    pub n_expert_used: usize,
    /// Expert FFN width per trunk layer.
    pub n_ff_exp: Vec<usize>,
    /// Shared experts (the shared FFN is `n_ff_exp * n_shared` wide).
    pub n_shared: usize,
    /// Dense FFN width of the leading dense layers.
    pub n_ff: usize,
    /// Leading layers with a dense FFN.
    pub n_dense: usize,
    /// Routed weights times this (absent, 0 or 1: 1).
    pub expert_weights_scale: f32,
    /// Renormalise the routed weights.
    pub expert_weights_norm: bool,
    /// Indexer heads.
    pub idx_heads: usize,
    /// Indexer head dim.
    pub idx_dim: usize,
    /// Indexer top_k, in tokens.
    pub top_k: usize,
    /// Per trunk layer: a full indexer (`true`) or the last full layer's
    /// selection reused (`false`).
    pub idx_full: Vec<bool>,
}

fn usize_of(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

impl Hparams {
    /// Reads and checks the hyperparameters.
    ///
    /// # Errors
    ///
    /// Another architecture, a required key absent, a key of the wrong
    /// type, or a value out of the spec (each naming the key).
    pub fn from_header(header: &Header) -> Result<Hparams, LoadError> {
        let meta = Meta::for_arch(header, &[ARCH])?;
        let m = &meta;
        let block_count = m.req_positive("block_count")?;
        let nextn = m.opt_u64("nextn_predict_layers")?.unwrap_or(0);
        if nextn >= block_count {
            return Err(m.bad(
                "nextn_predict_layers",
                format!("{nextn} leaves no trunk layer of block_count {block_count}"),
            ));
        }
        let n_layer = usize_of(block_count - nextn);
        let n_ctx_train = m.req_positive("context_length")?;
        let n_embd = usize_of(m.req_positive("embedding_length")?);
        let per = |name: &str| m.per_layer(name, n_layer, block_count);
        let uniform = |name: &str| -> Result<Option<u64>, LoadError> {
            match per(name)? {
                None => Ok(None),
                Some(v) if v.iter().all(|&x| x == v[0]) => Ok(Some(v[0])),
                Some(_) => Err(m.bad(name, "must be one value for every layer")),
            }
        };
        let n_head = usize_of(
            uniform("attention.head_count")?.ok_or_else(|| m.missing("attention.head_count"))?,
        );
        if n_head == 0 {
            return Err(m.bad("attention.head_count", "0 heads"));
        }
        let eps = m
            .opt_f32("attention.layer_norm_rms_epsilon")?
            .ok_or_else(|| m.missing("attention.layer_norm_rms_epsilon"))?;
        let q_lora = usize_of(m.req_positive("attention.q_lora_rank")?);
        let kv_lora = usize_of(m.req_positive("attention.kv_lora_rank")?);
        // llama.cpp throws when either MLA length is 0 (`is_mla()` false).
        let dk = usize_of(m.req_positive("attention.key_length_mla")?);
        let dv = usize_of(m.req_positive("attention.value_length_mla")?);
        let key_length = match m.opt_u64("attention.key_length")? {
            Some(k) => k,
            None => (n_embd / n_head) as u64,
        };
        let n_rot = usize_of(m.opt_u64("rope.dimension_count")?.unwrap_or(key_length));
        if n_rot == 0 || !n_rot.is_multiple_of(2) || n_rot >= dk {
            return Err(m.bad(
                "rope.dimension_count",
                format!("{n_rot}: must be even, > 0 and below key_length_mla {dk}"),
            ));
        }
        let freq_base = m.opt_f32("rope.freq_base")?.unwrap_or(10000.0);
        if !(freq_base.is_finite() && freq_base > 0.0) {
            return Err(m.bad("rope.freq_base", format!("{freq_base}")));
        }
        // Linear scaling by 0 or 1 is none (llama.cpp: factor 0 means 1);
        // test-llama-archs writes it so.
        let linear_no_op = matches!(m.get("rope.scaling.type"), Some(Value::String(s)) if s == "linear")
            && matches!(
                m.opt_f32("rope.scaling.factor")?,
                None | Some(0.0) | Some(1.0)
            );
        if let Some(v) = m.get("rope.scaling.type")
            && !matches!(v, Value::String(s) if s == "none")
            && !linear_no_op
        {
            return Err(m.bad(
                "rope.scaling.type",
                "rope scaling (YaRN) is outside this family's spec (GLM-5.x has none)",
            ));
        }

        let n_dense = usize_of(m.opt_u64("leading_dense_block_count")?.unwrap_or(0)).min(n_layer);
        let n_expert = usize_of(m.opt_u64("expert_count")?.unwrap_or(0));
        let n_expert_used = usize_of(uniform("expert_used_count")?.unwrap_or(0));
        if n_expert == 0 {
            return Err(m.missing("expert_count"));
        }
        if n_expert_used == 0 || n_expert_used > n_expert {
            return Err(m.bad(
                "expert_used_count",
                format!("{n_expert_used} of {n_expert} experts: must be 1..={n_expert}"),
            ));
        }
        let n_ff_exp: Vec<usize> = per("expert_feed_forward_length")?
            .ok_or_else(|| m.missing("expert_feed_forward_length"))?
            .into_iter()
            .map(usize_of)
            .collect();
        let n_shared = usize_of(m.req_u64("expert_shared_count")?);
        let n_ff = usize_of(m.opt_u64("feed_forward_length")?.unwrap_or(0));
        if n_dense > 0 && n_ff == 0 {
            return Err(m.missing("feed_forward_length"));
        }
        let scale = m.opt_f32("expert_weights_scale")?.unwrap_or(0.0);
        let expert_weights_scale = if scale == 0.0 { 1.0 } else { scale };
        let expert_weights_norm = m.opt_bool("expert_weights_norm")?.unwrap_or(false);
        // llama.cpp: absent (none) means sigmoid; 2 is sigmoid.
        match m.opt_u64("expert_gating_func")? {
            None | Some(0) | Some(2) => {}
            Some(other) => {
                return Err(m.bad(
                    "expert_gating_func",
                    format!("{other}: glm-dsa routes with sigmoid (2) only"),
                ));
            }
        }
        if let Some(g) = m.opt_u64("expert_group_count")?
            && g > 1
        {
            return Err(m.bad(
                "expert_group_count",
                format!("{g}: group-limited routing is outside this family's spec"),
            ));
        }

        let idx_heads = usize_of(m.req_positive("attention.indexer.head_count")?);
        let idx_dim = usize_of(m.req_positive("attention.indexer.key_length")?);
        if !idx_dim.is_power_of_two() || idx_dim < 64 || idx_dim < n_rot {
            return Err(m.bad(
                "attention.indexer.key_length",
                format!(
                    "{idx_dim}: must be a power of two >= 64 and >= rope.dimension_count {n_rot}"
                ),
            ));
        }
        let top_k = usize_of(m.req_positive("attention.indexer.top_k")?);
        let idx_full = match m.get("attention.indexer.types") {
            None if n_ctx_train < DEFAULT_TABLE_CONTEXT => vec![true; n_layer],
            None => glm_5_2_default_types(n_layer),
            Some(Value::Bool(b)) => vec![*b; n_layer],
            Some(v) if v.as_u64().is_some() => vec![v.as_u64() != Some(0); n_layer],
            Some(_) => {
                let v = m
                    .opt_bool_array("attention.indexer.types")?
                    .unwrap_or_default();
                m.check_per_layer_len("attention.indexer.types", v.len(), n_layer, block_count)?;
                v[..n_layer].to_vec()
            }
        };
        if !idx_full[0] {
            return Err(m.bad(
                "attention.indexer.types",
                "layer 0 is shared: it would reuse a selection no layer made",
            ));
        }

        Ok(Hparams {
            block_count: usize_of(block_count),
            n_layer,
            n_ctx_train,
            n_embd,
            n_head,
            eps,
            dk,
            dv,
            n_rot,
            freq_base,
            q_lora,
            kv_lora,
            n_expert,
            n_expert_used,
            n_ff_exp,
            n_shared,
            n_ff,
            n_dense,
            expert_weights_scale,
            expert_weights_norm,
            idx_heads,
            idx_dim,
            top_k,
            idx_full,
        })
    }

    /// qk_nope: `key_length_mla - n_rot`.
    pub fn dn(&self) -> usize {
        self.dk - self.n_rot
    }

    /// Whether trunk layer `il` has the routed experts (else a dense FFN).
    pub fn is_moe(&self, il: usize) -> bool {
        il >= self.n_dense
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_glm_5_2_table_is_full_at_0_1_2_6_10_and_shared_past_78() {
        let t = glm_5_2_default_types(80);
        let full: Vec<usize> = (0..80).filter(|&i| t[i]).collect();
        let want: Vec<usize> = [0, 1].into_iter().chain((2..78).step_by(4)).collect();
        assert_eq!(full, want);
        assert_eq!(full.len(), 21);
        assert!(!t[78] && !t[79]);
    }
}
