//! Hyperparameters from `glm5-next.*` metadata (docs/families/glm5_next.md,
//! section 1), with llama.cpp's own defaults for absent optional keys and
//! refusals by key name where llama.cpp would compute garbage.

use family_kit::{LoadError, Meta};
use seam::gguf::{Array, Header, Value};
use serde::Serialize;

/// The architecture name llama.cpp registers (`src/llama-arch.cpp:156`).
pub const ARCH: &str = "glm5-next";
/// Both accepted spellings of `general.architecture` (the project's
/// reference calls it `glm5next`); keys are read under the one the file uses.
pub const ARCH_NAMES: [&str; 2] = [ARCH, "glm5next"];

/// The most Sinkhorn iterations accepted (the public checkpoint uses a
/// handful).
pub const MAX_SINKHORN: usize = 1000;

/// What a main layer's mixer is (`head_count_kv[il] == 0` marks KDA).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerKind {
    /// Kimi delta attention (linear attention with per-channel decay).
    Kda,
    /// NoPE multi-head latent attention with the pooled-key indexer.
    Mla,
}

/// The model's hyperparameters.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Hparams {
    /// The architecture spelling of the file (`glm5-next` or `glm5next`).
    pub arch: &'static str,
    /// `block_count` (main layers and MTP blocks).
    pub block_count: usize,
    /// Main layers: `block_count - nextn_predict_layers`.
    pub n_layer: usize,
    /// E.
    pub n_embd: usize,
    /// Heads of KDA and of MLA (uniform).
    pub n_head: usize,
    /// Per main layer, its mixer.
    pub layers: Vec<LayerKind>,
    /// Epsilon of every RMSNorm.
    pub eps: f32,
    /// Epsilon of the indexer's key LayerNorm (default 0).
    pub eps_ln: f32,
    /// MLA qk head dim (NoPE).
    pub dk: usize,
    /// MLA v head dim.
    pub dv: usize,
    /// q LoRA rank.
    pub q_lora: usize,
    /// kv LoRA rank (the latent).
    pub kv_lora: usize,
    /// KDA short-conv kernel.
    pub d_conv: usize,
    /// KDA head dim.
    pub kda_head_dim: usize,
    /// `kda.gate_lower_bound` (absent: the softplus decay).
    pub gate_lower_bound: Option<f32>,
    /// Routed experts.
    pub n_expert: usize,
    /// Experts used per layer.
    pub n_expert_used: Vec<usize>,
    /// Expert FFN width per layer.
    pub n_ff_exp: Vec<usize>,
    /// Shared experts (the shared FFN is `n_ff_exp * n_shared` wide).
    pub n_shared: usize,
    /// Dense FFN width of the leading dense layers.
    pub n_ff: usize,
    /// Leading layers with a dense FFN.
    pub n_dense: usize,
    /// Routed weights times this (1 when absent, 0 or 1).
    pub expert_weights_scale: f32,
    /// Renormalise the routed weights.
    pub expert_weights_norm: bool,
    /// SwiGLU clamp of the routed experts per layer (0 = off).
    pub clamp_exp: Vec<f32>,
    /// SwiGLU clamp of the shared expert and the dense FFN per layer
    /// (absent: `clamp_exp`).
    pub clamp_shexp: Vec<f32>,
    /// Indexer heads.
    pub idx_heads: usize,
    /// Indexer head dim.
    pub idx_dim: usize,
    /// Indexer top_k, in tokens.
    pub top_k: usize,
    /// Pool size.
    pub kpool: usize,
    /// Per main layer: a full indexer (`true`) or the previous full
    /// layer's selection reused (`false`); meaningful on MLA layers.
    pub idx_full: Vec<bool>,
    /// mHC streams (4).
    pub hc: usize,
    /// Sinkhorn iterations (>= 1).
    pub sinkhorn_iters: usize,
    /// mHC epsilon.
    pub hc_eps: f32,
}

fn usize_of(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

/// A scalar or per-layer float key, one value per main layer.
fn per_layer_f32(
    meta: &Meta<'_>,
    name: &str,
    n_layer: usize,
    block_count: u64,
) -> Result<Option<Vec<f32>>, LoadError> {
    let Some(v) = meta.get(name) else {
        return Ok(None);
    };
    let values: Vec<f32> = match v {
        Value::F32(x) => vec![*x; n_layer],
        Value::F64(x) => vec![*x as f32; n_layer],
        Value::Array(Array::F32(a)) => a.clone(),
        Value::Array(Array::F64(a)) => a.iter().map(|&x| x as f32).collect(),
        other => {
            return Err(LoadError::KeyType {
                key: meta.key(name),
                expected: "a float or a per-layer array of floats",
                found: other.type_name(),
            });
        }
    };
    if values.len() != n_layer {
        meta.check_per_layer_len(name, values.len(), n_layer, block_count)?;
    }
    Ok(Some(values[..n_layer].to_vec()))
}

fn req_f32(meta: &Meta<'_>, name: &str) -> Result<f32, LoadError> {
    meta.opt_f32(name)?.ok_or_else(|| meta.missing(name))
}

impl Hparams {
    /// Reads and checks the hyperparameters.
    ///
    /// # Errors
    ///
    /// Another architecture, a required key absent, a key of the wrong
    /// type, or a value out of its domain (each naming the key).
    pub fn from_header(header: &Header) -> Result<Hparams, LoadError> {
        let meta = Meta::for_arch(header, &ARCH_NAMES)?;
        let m = &meta;
        let block_count = m.req_positive("block_count")?;
        let nextn = m.opt_u64("nextn_predict_layers")?.unwrap_or(0);
        if nextn >= block_count {
            return Err(m.bad(
                "nextn_predict_layers",
                format!("{nextn} leaves no main layer of block_count {block_count}"),
            ));
        }
        let n_layer = usize_of(block_count - nextn);
        let n_embd = usize_of(m.req_positive("embedding_length")?);
        let per = |name: &str| m.per_layer(name, n_layer, block_count);

        let heads =
            per("attention.head_count")?.ok_or_else(|| m.missing("attention.head_count"))?;
        let n_head = usize_of(heads[0]);
        if n_head == 0 || heads.iter().any(|&h| h != heads[0]) {
            return Err(m.bad(
                "attention.head_count",
                "must be one value > 0 for every layer (KDA and MLA heads are equal)",
            ));
        }
        let kv =
            per("attention.head_count_kv")?.ok_or_else(|| m.missing("attention.head_count_kv"))?;
        let layers: Vec<LayerKind> = kv
            .iter()
            .map(|&k| {
                if k == 0 {
                    LayerKind::Kda
                } else {
                    LayerKind::Mla
                }
            })
            .collect();

        let eps = req_f32(m, "attention.layer_norm_rms_epsilon")?;
        let eps_ln = m.opt_f32("attention.layer_norm_epsilon")?.unwrap_or(0.0);
        let dk = usize_of(m.req_positive("attention.key_length_mla")?);
        let dv = usize_of(m.req_positive("attention.value_length_mla")?);
        let q_lora = usize_of(m.req_positive("attention.q_lora_rank")?);
        let kv_lora = usize_of(m.req_positive("attention.kv_lora_rank")?);
        if let Some(rot) = m.opt_u64("rope.dimension_count")?
            && rot != 0
        {
            return Err(m.bad(
                "rope.dimension_count",
                format!("{rot}: glm5-next's MLA is NoPE (the graph asserts 0)"),
            ));
        }
        let d_conv = usize_of(m.req_positive("ssm.conv_kernel")?);
        let kda_head_dim = usize_of(m.req_positive("kda.head_dim")?);
        let gate_lower_bound = m
            .opt_f32("kda.gate_lower_bound")?
            .filter(|lb| lb.is_finite());

        let n_expert = usize_of(m.opt_u64("expert_count")?.unwrap_or(0));
        let n_dense = usize_of(m.opt_u64("leading_dense_block_count")?.unwrap_or(0)).min(n_layer);
        let moe_layers = n_layer > n_dense;
        let n_expert_used: Vec<usize> = per("expert_used_count")?
            .unwrap_or_else(|| vec![0; n_layer])
            .into_iter()
            .map(usize_of)
            .collect();
        if moe_layers {
            if n_expert == 0 {
                return Err(m.missing("expert_count"));
            }
            if let Some(&k) = n_expert_used[n_dense..]
                .iter()
                .find(|&&k| k == 0 || k > n_expert)
            {
                return Err(m.bad(
                    "expert_used_count",
                    format!("{k} of {n_expert} experts: must be 1..={n_expert}"),
                ));
            }
        }
        let n_ff_exp: Vec<usize> = per("expert_feed_forward_length")?
            .ok_or_else(|| m.missing("expert_feed_forward_length"))?
            .into_iter()
            .map(usize_of)
            .collect();
        let n_shared = usize_of(
            m.opt_u64("expert_shared_count")?
                .ok_or_else(|| m.missing("expert_shared_count"))?,
        );
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
                    format!("{other}: glm5-next routes with sigmoid (2) only"),
                ));
            }
        }
        let clamp_exp = per_layer_f32(m, "swiglu_clamp_exp", n_layer, block_count)?
            .unwrap_or_else(|| vec![0.0; n_layer]);
        let clamp_shexp = per_layer_f32(m, "swiglu_clamp_shexp", n_layer, block_count)?
            .unwrap_or_else(|| clamp_exp.clone());

        let idx_heads = usize_of(m.req_positive("attention.indexer.head_count")?);
        let idx_dim = usize_of(m.req_positive("attention.indexer.key_length")?);
        let top_k = usize_of(m.req_positive("attention.indexer.top_k")?);
        let kpool = usize_of(m.req_u64("attention.indexer.kpool")?);
        if kpool < 2 || !top_k.is_multiple_of(kpool) {
            return Err(m.bad(
                "attention.indexer.kpool",
                format!("{kpool}: must be > 1 and divide attention.indexer.top_k {top_k}"),
            ));
        }
        // llama.cpp's default is false, and false never attends the
        // incomplete tail pool: position 0 attends nothing and its logits
        // are NaN (checked on s7-d05-sparse). Refused, not computed.
        if m.opt_bool("attention.indexer.kpool_select_tail")? != Some(true) {
            return Err(m.bad(
                "attention.indexer.kpool_select_tail",
                "false or absent (llama.cpp's default false): a token in an incomplete pool \
                 would not attend itself and llama.cpp returns NaN logits; only true is supported",
            ));
        }
        let idx_full = match m.get("attention.indexer.types") {
            None => vec![true; n_layer],
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
        if let Some(first) = layers.iter().position(|&k| k == LayerKind::Mla)
            && !idx_full[first]
        {
            return Err(m.bad(
                "attention.indexer.types",
                format!("layer {first}, the first MLA layer, shares a selection no layer made"),
            ));
        }

        let hc = usize_of(m.req_u64("hyper_connection.count")?);
        if hc != 4 {
            return Err(m.bad("hyper_connection.count", format!("{hc}: must be 4")));
        }
        let sinkhorn_iters = usize_of(m.req_positive("hyper_connection.sinkhorn_iterations")?);
        // A bound of this family (llama.cpp has none): every token runs the
        // iterations twice per layer, so a hostile count would stall decode.
        if sinkhorn_iters > MAX_SINKHORN {
            return Err(m.bad(
                "hyper_connection.sinkhorn_iterations",
                format!("{sinkhorn_iters}: at most {MAX_SINKHORN}"),
            ));
        }
        let hc_eps = req_f32(m, "hyper_connection.epsilon")?;

        Ok(Hparams {
            arch: meta.arch(),
            block_count: usize_of(block_count),
            n_layer,
            n_embd,
            n_head,
            layers,
            eps,
            eps_ln,
            dk,
            dv,
            q_lora,
            kv_lora,
            d_conv,
            kda_head_dim,
            gate_lower_bound,
            n_expert,
            n_expert_used,
            n_ff_exp,
            n_shared,
            n_ff,
            n_dense,
            expert_weights_scale,
            expert_weights_norm,
            clamp_exp,
            clamp_shexp,
            idx_heads,
            idx_dim,
            top_k,
            kpool,
            idx_full,
            hc,
            sinkhorn_iters,
            hc_eps,
        })
    }

    /// KDA inner width: `kda.head_dim * n_head`.
    pub fn d_inner(&self) -> usize {
        self.kda_head_dim.saturating_mul(self.n_head)
    }

    /// Whether layer `il` has the routed experts (else a dense FFN).
    pub fn is_moe(&self, il: usize) -> bool {
        il >= self.n_dense
    }
}
