//! The hyperparameters the forward pass needs, read from `qwen4exp.*`
//! metadata (docs/families/qwen4_exp.md, section 1).
//!
//! This duplicates part of [`crate::hparams`] on purpose for now: the
//! forward pass reads exactly what `tools/oracle/qwen4exp_ref.py` reads, and
//! nothing else. The two can be merged once both settle.

use seam::gguf::{Array, Value};

use super::{ForwardError, Weights};

/// The arch prefix of every key.
const PREFIX: &str = "qwen4exp.";

/// The PLE (n-gram hash embedding) parameters (spec section 8).
#[derive(Clone, Debug, PartialEq)]
pub struct PleHyper {
    /// The single layer it is applied on (before that layer's HC mix).
    pub layer: usize,
    /// `ple.ngram_size` n: window length, and the conv dilation.
    pub ngram: usize,
    /// `ple.heads_per_ngram`.
    pub per_gram: usize,
    /// `ple.conv_kernel` K.
    pub conv_kernel: usize,
    /// `ple.eos_token_id`.
    pub eos: u64,
    /// `embedding_length_per_layer_input`: the width of one table row.
    pub head_dim: usize,
    /// `ple.layer_multipliers` (at least `ngram`).
    pub multipliers: Vec<u64>,
    /// `ple.head_offsets` (at least `n_heads()`).
    pub offsets: Vec<u64>,
    /// `ple.head_vocab_sizes` (at least `n_heads()`).
    pub vocab_sizes: Vec<u64>,
}

impl PleHyper {
    /// `(n − 1) · per_gram`.
    pub fn n_heads(&self) -> usize {
        (self.ngram - 1) * self.per_gram
    }
}

/// Hyperparameters, per layer where the key may be per-layer.
#[derive(Clone, Debug, PartialEq)]
pub struct Hyper {
    /// `embedding_length` E.
    pub n_embd: usize,
    /// `block_count − nextn_predict_layers`.
    pub n_layer: usize,
    /// `attention.layer_norm_rms_epsilon`.
    pub eps: f64,
    /// `hyper_connection.count` hc.
    pub hc: usize,
    /// `attention.head_count`, per layer.
    pub n_head: Vec<usize>,
    /// `attention.head_count_kv`, per layer (default `n_head`).
    pub n_head_kv: Vec<usize>,
    /// `attention.key_length` (default E / n_head).
    pub head_dim: usize,
    /// `rope.dimension_count` (default head_dim).
    pub n_rot: usize,
    /// `rope.freq_base` (default 10000).
    pub freq_base: f64,
    /// `rope.dimension_sections` (4 ints).
    pub sections: [usize; 4],
    /// Whether each layer is gated DeltaNet (else full attention).
    pub recurrent: Vec<bool>,
    /// `attention.compress_ratios` per layer (0: dense).
    pub compress: Vec<usize>,
    /// `attention.indexer.top_k`, in tokens.
    pub top_k: usize,
    /// `attention.indexer.head_count`.
    pub n_idx_head: usize,
    /// `attention.indexer.key_length`.
    pub idx_dim: usize,
    /// `expert_used_count`, per layer.
    pub n_expert_used: Vec<usize>,
    /// `ssm.state_size` S.
    pub ssm_state: usize,
    /// `ssm.time_step_rank` Hv.
    pub ssm_v_heads: usize,
    /// `ssm.group_count` Hk.
    pub ssm_k_heads: usize,
    /// `ssm.conv_kernel`.
    pub ssm_conv: usize,
    /// The PLE parameters, if the file has `ple.layers`.
    pub ple: Option<PleHyper>,
}

/// Every integer (or bool) of a scalar or array value.
fn ints(v: &Value) -> Option<Vec<i128>> {
    fn conv<T: Copy>(v: &[T], f: impl Fn(T) -> i128) -> Option<Vec<i128>> {
        Some(v.iter().map(|&x| f(x)).collect())
    }
    match v {
        Value::U8(x) => Some(vec![i128::from(*x)]),
        Value::I8(x) => Some(vec![i128::from(*x)]),
        Value::U16(x) => Some(vec![i128::from(*x)]),
        Value::I16(x) => Some(vec![i128::from(*x)]),
        Value::U32(x) => Some(vec![i128::from(*x)]),
        Value::I32(x) => Some(vec![i128::from(*x)]),
        Value::U64(x) => Some(vec![i128::from(*x)]),
        Value::I64(x) => Some(vec![i128::from(*x)]),
        Value::Bool(x) => Some(vec![i128::from(*x)]),
        Value::Array(a) => match a {
            Array::U8(v) => conv(v, i128::from),
            Array::I8(v) => conv(v, i128::from),
            Array::U16(v) => conv(v, i128::from),
            Array::I16(v) => conv(v, i128::from),
            Array::U32(v) => conv(v, i128::from),
            Array::I32(v) => conv(v, i128::from),
            Array::U64(v) => conv(v, i128::from),
            Array::I64(v) => conv(v, i128::from),
            Array::Bool(v) => conv(v, i128::from),
            _ => None,
        },
        _ => None,
    }
}

/// Reads keys of one model's metadata.
struct Meta<'a, W: ?Sized> {
    w: &'a W,
}

impl<W: Weights + ?Sized> Meta<'_, W> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.w.metadata(&format!("{PREFIX}{key}"))
    }

    fn bad(key: &str, why: impl Into<String>) -> ForwardError {
        ForwardError::Metadata {
            key: format!("{PREFIX}{key}"),
            why: why.into(),
        }
    }

    fn list(&self, key: &str) -> Result<Option<Vec<i128>>, ForwardError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => ints(v)
                .map(Some)
                .ok_or_else(|| Self::bad(key, format!("not an integer: {}", v.type_name()))),
        }
    }

    fn usize_opt(&self, key: &str) -> Result<Option<usize>, ForwardError> {
        match self.list(key)? {
            None => Ok(None),
            Some(v) if v.len() == 1 => usize::try_from(v[0])
                .map(Some)
                .map_err(|_| Self::bad(key, "negative")),
            Some(_) => Err(Self::bad(key, "an array where a scalar is expected")),
        }
    }

    fn usize_req(&self, key: &str) -> Result<usize, ForwardError> {
        self.usize_opt(key)?
            .ok_or_else(|| Self::bad(key, "required and missing"))
    }

    fn u64s(&self, key: &str) -> Result<Vec<u64>, ForwardError> {
        self.list(key)?
            .ok_or_else(|| Self::bad(key, "required and missing"))?
            .into_iter()
            .map(|x| u64::try_from(x).map_err(|_| Self::bad(key, "negative element")))
            .collect()
    }

    fn float_opt(&self, key: &str) -> Result<Option<f64>, ForwardError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::F32(x)) => Ok(Some(f64::from(*x))),
            Some(Value::F64(x)) => Ok(Some(*x)),
            Some(v) => match ints(v) {
                Some(i) if i.len() == 1 => Ok(Some(i[0] as f64)),
                _ => Err(Self::bad(key, format!("not a number: {}", v.type_name()))),
            },
        }
    }

    /// A scalar (repeated) or per-layer array; `default` if missing.
    fn per_layer(
        &self,
        key: &str,
        n_layer: usize,
        default: Option<usize>,
    ) -> Result<Vec<usize>, ForwardError> {
        let v = match (self.list(key)?, default) {
            (Some(v), _) => v,
            (None, Some(d)) => return Ok(vec![d; n_layer]),
            (None, None) => return Err(Self::bad(key, "required and missing")),
        };
        let v: Vec<usize> = v
            .into_iter()
            .map(|x| usize::try_from(x).map_err(|_| Self::bad(key, "negative element")))
            .collect::<Result<_, _>>()?;
        match v.len() {
            1 => Ok(vec![v[0]; n_layer]),
            n if n >= n_layer => Ok(v[..n_layer].to_vec()),
            n => Err(Self::bad(key, format!("{n} entries for {n_layer} layers"))),
        }
    }
}

impl Hyper {
    /// Reads the hyperparameters from `w`'s metadata.
    ///
    /// # Errors
    ///
    /// A required key is missing, or a key has the wrong type or an
    /// out-of-range value; the error names the key.
    pub fn from_metadata<W: Weights + ?Sized>(w: &W) -> Result<Hyper, ForwardError> {
        let m = Meta { w };
        match w.metadata("general.architecture").and_then(Value::as_str) {
            Some("qwen4exp") => {}
            other => {
                return Err(ForwardError::Metadata {
                    key: "general.architecture".into(),
                    why: format!("expected \"qwen4exp\", found {other:?}"),
                });
            }
        }
        let n_embd = m.usize_req("embedding_length")?;
        let n_layer_all = m.usize_req("block_count")?;
        let nextn = m.usize_opt("nextn_predict_layers")?.unwrap_or(0);
        let n_layer = n_layer_all
            .checked_sub(nextn)
            .ok_or_else(|| Meta::<W>::bad("nextn_predict_layers", "exceeds block_count"))?;
        let eps = m
            .float_opt("attention.layer_norm_rms_epsilon")?
            .ok_or_else(|| Meta::<W>::bad("attention.layer_norm_rms_epsilon", "required"))?;
        let hc = m.usize_req("hyper_connection.count")?;
        if hc < 2 {
            return Err(Meta::<W>::bad("hyper_connection.count", "must be > 1"));
        }
        let n_head = m.per_layer("attention.head_count", n_layer, None)?;
        let n_head_kv = match m.list("attention.head_count_kv")? {
            None => n_head.clone(),
            Some(_) => m.per_layer("attention.head_count_kv", n_layer, None)?,
        };
        let head0 = n_head.iter().copied().find(|&h| h > 0).unwrap_or(1);
        let head_dim = m
            .usize_opt("attention.key_length")?
            .unwrap_or(n_embd / head0);
        let v_len = m.usize_opt("attention.value_length")?.unwrap_or(head_dim);
        if v_len != head_dim {
            return Err(Meta::<W>::bad(
                "attention.value_length",
                "must equal attention.key_length",
            ));
        }
        let n_rot = m.usize_opt("rope.dimension_count")?.unwrap_or(head_dim);
        let freq_base = m.float_opt("rope.freq_base")?.unwrap_or(10000.0);
        let sec = m
            .list("rope.dimension_sections")?
            .ok_or_else(|| Meta::<W>::bad("rope.dimension_sections", "required"))?;
        if sec.len() < 4 || sec.iter().any(|&s| s < 0) {
            return Err(Meta::<W>::bad(
                "rope.dimension_sections",
                "needs 4 non-negative ints",
            ));
        }
        let sections = [sec[0], sec[1], sec[2], sec[3]].map(|s| s as usize);
        let recurrent: Vec<bool> = match m.list("attention.recurrent_layers")? {
            Some(_) => m
                .per_layer("attention.recurrent_layers", n_layer, None)?
                .into_iter()
                .map(|v| v != 0)
                .collect(),
            None => {
                let iv = m.usize_opt("full_attention_interval")?.unwrap_or(4);
                (0..n_layer).map(|i| (i + 1) % iv.max(1) != 0).collect()
            }
        };
        let compress = m.per_layer("attention.compress_ratios", n_layer, Some(0))?;
        let top_k = m.usize_req("attention.indexer.top_k")?;
        let n_idx_head = m.usize_req("attention.indexer.head_count")?;
        let idx_dim = m.usize_req("attention.indexer.key_length")?;
        let n_expert_used = m.per_layer("expert_used_count", n_layer, Some(0))?;
        let ssm_state = m.usize_req("ssm.state_size")?;
        let ssm_v_heads = m.usize_req("ssm.time_step_rank")?;
        let ssm_k_heads = m.usize_req("ssm.group_count")?;
        let ssm_conv = m.usize_req("ssm.conv_kernel")?;
        if ssm_k_heads == 0 || ssm_v_heads % ssm_k_heads != 0 {
            return Err(Meta::<W>::bad(
                "ssm.group_count",
                "must divide ssm.time_step_rank",
            ));
        }
        if ssm_conv == 0 {
            return Err(Meta::<W>::bad("ssm.conv_kernel", "must be > 0"));
        }
        if n_rot % 2 != 0 || n_rot > head_dim || n_rot > idx_dim {
            return Err(Meta::<W>::bad(
                "rope.dimension_count",
                "must be even and fit head_dim and the indexer key length",
            ));
        }
        let ple = match m.list("ple.layers")? {
            None => None,
            Some(v) if v.is_empty() => None,
            Some(v) if v.len() > 1 => {
                return Err(Meta::<W>::bad("ple.layers", "at most one layer"));
            }
            Some(v) => {
                let layer = usize::try_from(v[0])
                    .ok()
                    .filter(|&l| l < n_layer)
                    .ok_or_else(|| Meta::<W>::bad("ple.layers", "layer out of range"))?;
                let p = PleHyper {
                    layer,
                    ngram: m.usize_req("ple.ngram_size")?,
                    per_gram: m.usize_req("ple.heads_per_ngram")?,
                    conv_kernel: m.usize_req("ple.conv_kernel")?,
                    eos: m
                        .list("ple.eos_token_id")?
                        .and_then(|v| v.first().copied())
                        .and_then(|x| u64::try_from(x).ok())
                        .ok_or_else(|| Meta::<W>::bad("ple.eos_token_id", "required"))?,
                    head_dim: m.usize_req("embedding_length_per_layer_input")?,
                    multipliers: m.u64s("ple.layer_multipliers")?,
                    offsets: m.u64s("ple.head_offsets")?,
                    vocab_sizes: m.u64s("ple.head_vocab_sizes")?,
                };
                if p.ngram < 2 || p.conv_kernel == 0 || p.head_dim == 0 {
                    return Err(Meta::<W>::bad("ple.ngram_size", "PLE sizes out of range"));
                }
                if p.multipliers.len() < p.ngram
                    || p.offsets.len() < p.n_heads()
                    || p.vocab_sizes.len() < p.n_heads()
                    || p.vocab_sizes.contains(&0)
                {
                    return Err(Meta::<W>::bad(
                        "ple.head_vocab_sizes",
                        "multipliers/offsets/vocab sizes too short or zero",
                    ));
                }
                if p.n_heads() * p.head_dim != n_embd {
                    return Err(Meta::<W>::bad(
                        "embedding_length_per_layer_input",
                        "(n−1)·heads_per_ngram·head_dim must equal embedding_length",
                    ));
                }
                if !recurrent[layer] {
                    return Err(Meta::<W>::bad("ple.layers", "must be a GDN layer"));
                }
                Some(p)
            }
        };
        Ok(Hyper {
            n_embd,
            n_layer,
            eps,
            hc,
            n_head,
            n_head_kv,
            head_dim,
            n_rot,
            freq_base,
            sections,
            recurrent,
            compress,
            top_k,
            n_idx_head,
            idx_dim,
            n_expert_used,
            ssm_state,
            ssm_v_heads,
            ssm_k_heads,
            ssm_conv,
            ple,
        })
    }
}
