//! The hyperparameters of a qwen4exp file, read from its `qwen4exp.*`
//! metadata (docs/families/qwen4_exp.md, section 1).
//!
//! Absent keys take the defaults llama.cpp's `qwen4exp` loader gives them;
//! a required key that is absent, of the wrong type or out of its domain is
//! refused with an error naming the key.

use family_kit::Meta;
use seam::gguf::{Header, Value};
use serde::Serialize;

use crate::error::Error;

/// The GGUF architecture name.
pub const ARCH: &str = "qwen4exp";

/// The full metadata key of `name` (`ssm.conv_kernel` ->
/// `qwen4exp.ssm.conv_kernel`).
pub fn key(name: &str) -> String {
    format!("{ARCH}.{name}")
}

/// What a layer's token mixer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerKind {
    /// Gated DeltaNet (linear attention, recurrent).
    Gdn,
    /// Full (QSA) attention.
    FullAttention,
}

/// The gated-DeltaNet shape (`qwen4exp.ssm.*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Ssm {
    /// `ssm.conv_kernel`: d_conv.
    pub conv_kernel: u64,
    /// `ssm.inner_size`: d_inner = state_size x time_step_rank.
    pub inner_size: u64,
    /// `ssm.state_size`: S (head_k_dim = head_v_dim).
    pub state_size: u64,
    /// `ssm.time_step_rank`: Hv, the V heads.
    pub n_v_heads: u64,
    /// `ssm.group_count`: Hk, the Q/K heads.
    pub n_k_heads: u64,
}

impl Ssm {
    /// S x Hk.
    pub fn key_dim(&self) -> u64 {
        self.state_size * self.n_k_heads
    }

    /// S x Hv.
    pub fn value_dim(&self) -> u64 {
        self.state_size * self.n_v_heads
    }

    /// 2 key_dim + value_dim: the channels of `attn_qkv` and the conv.
    pub fn conv_dim(&self) -> u64 {
        2 * self.key_dim() + self.value_dim()
    }
}

/// The QSA indexer (`qwen4exp.attention.indexer.*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Indexer {
    /// `head_count`.
    pub n_head: u64,
    /// `key_length`: idx_dim.
    pub head_dim: u64,
    /// `top_k`, in tokens.
    pub top_k: u64,
}

/// The per-layer n-gram hash embedding (`qwen4exp.ple.*`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Ple {
    /// The one layer it is applied on (a GDN layer).
    pub layer: usize,
    /// `ple.ngram_size`: n (2..=8).
    pub ngram_size: u64,
    /// `ple.heads_per_ngram`.
    pub heads_per_ngram: u64,
    /// (n - 1) x heads_per_ngram (at most 64).
    pub n_heads: u64,
    /// `ple.conv_kernel`: K_ple.
    pub conv_kernel: u64,
    /// `ple.eos_token_id`.
    pub eos_token_id: u64,
    /// `ple.image_token_id`, if present (unused for text).
    pub image_token_id: Option<u64>,
    /// `embedding_length_per_layer_input`: the width of one table row.
    pub head_dim: u64,
    /// `ple.layer_multipliers`: m[0..n).
    pub layer_multipliers: Vec<u64>,
    /// `ple.head_offsets`: off[h].
    pub head_offsets: Vec<u64>,
    /// `ple.head_vocab_sizes`: voc[h].
    pub head_vocab_sizes: Vec<u64>,
}

impl Ple {
    /// The rows `per_layer_token_embd` must have at least:
    /// max over heads of off[h] + voc[h].
    pub fn min_rows(&self) -> u64 {
        (0..self.n_heads as usize)
            .map(|h| self.head_offsets[h] + self.head_vocab_sizes[h])
            .max()
            .unwrap_or(0)
    }
}

/// The hyperparameters.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Hparams {
    /// The vocabulary size, when the metadata says it (`qwen4exp.vocab_size`
    /// or the length of `tokenizer.ggml.tokens`); else `token_embd` says it.
    pub n_vocab: Option<u64>,
    /// `context_length`.
    pub context_length: u64,
    /// `embedding_length`: E.
    pub n_embd: u64,
    /// `block_count`: every block in the file, MTP blocks included.
    pub block_count: u64,
    /// `nextn_predict_layers` (default 0): trailing MTP blocks.
    pub nextn_predict_layers: u64,
    /// block_count - nextn_predict_layers: the layers the forward pass runs.
    pub n_layer: usize,
    /// `expert_count`.
    pub n_expert: u64,
    /// `expert_used_count` per layer (scalar or per-layer array).
    pub n_expert_used: Vec<u64>,
    /// The expert FFN width per layer (`expert_feed_forward_length`, else
    /// `feed_forward_length / expert_used_count`).
    pub n_ff_exp: Vec<u64>,
    /// The shared-expert FFN width per layer
    /// (`expert_shared_feed_forward_length`, else `feed_forward_length`).
    pub n_ff_shexp: Vec<u64>,
    /// `attention.head_count` per layer.
    pub n_head: Vec<u64>,
    /// `attention.head_count_kv` per layer (default n_head).
    pub n_head_kv: Vec<u64>,
    /// `attention.key_length` (= `value_length`; default E / n_head).
    pub head_dim: u64,
    /// `attention.layer_norm_rms_epsilon`.
    pub rms_eps: f32,
    /// `rope.dimension_count` (default head_dim).
    pub n_rot: u64,
    /// `rope.freq_base` (default 10000).
    pub rope_freq_base: f32,
    /// `expert_weights_scale`: the routed experts' weights are multiplied
    /// by it unless it is 0 or 1 (default 0).
    pub expert_weights_scale: f32,
    /// `rope.dimension_sections` (IMROPE; shorter arrays padded with 0).
    pub rope_sections: [u64; 4],
    /// The gated-DeltaNet shape.
    pub ssm: Ssm,
    /// `hyper_connection.count`: hc, the residual streams.
    pub hc: u64,
    /// `hyper_connection.low_rank`.
    pub hc_low_rank: u64,
    /// The QSA indexer.
    pub indexer: Indexer,
    /// `attention.compress_ratios` per layer (default 0: dense attention).
    pub compress_ratios: Vec<u64>,
    /// What each layer's mixer is.
    pub layers: Vec<LayerKind>,
    /// `full_attention_interval` as used (`None` when
    /// `attention.recurrent_layers` decided).
    pub full_attention_interval: Option<u64>,
    /// The per-layer embedding, if any.
    pub ple: Option<Ple>,
}

fn positive(name: &str, v: u64) -> Result<u64, Error> {
    if v == 0 {
        Err(bad(name, "must be > 0"))
    } else {
        Ok(v)
    }
}

fn bad(name: &str, reason: impl Into<String>) -> Error {
    Error::KeyValue {
        key: key(name),
        reason: reason.into(),
    }
}

impl Hparams {
    /// Reads the hyperparameters from a file's metadata.
    ///
    /// # Errors
    ///
    /// The architecture is not `qwen4exp`; a required key is absent; a key
    /// has the wrong type or a value out of its domain. Each error names
    /// the key.
    pub fn from_header(header: &Header) -> Result<Hparams, Error> {
        let m = Meta::for_arch(header, &[ARCH])?;

        let n_vocab = match m.opt_u64("vocab_size")? {
            Some(n) => Some(n),
            None => match header.get("tokenizer.ggml.tokens") {
                Some(Value::Array(a)) => Some(a.len() as u64),
                _ => None,
            },
        };
        let context_length = m.req_u64("context_length")?;
        let n_embd = m.req_positive("embedding_length")?;
        let block_count = m.req_positive("block_count")?;
        let nextn_predict_layers = m.opt_u64("nextn_predict_layers")?.unwrap_or(0);
        if nextn_predict_layers >= block_count {
            return Err(bad(
                "nextn_predict_layers",
                format!("{nextn_predict_layers} leaves no layers of block_count {block_count}"),
            ));
        }
        let n_layer = usize::try_from(block_count - nextn_predict_layers)
            .ok()
            .filter(|&n| n <= 4096)
            .ok_or_else(|| bad("block_count", format!("{block_count} is implausibly large")))?;

        // MoE. qwen4exp is MoE-only: the default 0 cannot run.
        let n_expert = m.opt_u64("expert_count")?.unwrap_or(0);
        positive("expert_count", n_expert)
            .map_err(|_| bad("expert_count", "is 0 or absent; qwen4exp is MoE-only"))?;
        let n_expert_used = m
            .per_layer("expert_used_count", n_layer, block_count)?
            .unwrap_or_else(|| vec![0; n_layer]);
        for &u in &n_expert_used {
            if u == 0 || u > n_expert {
                return Err(bad(
                    "expert_used_count",
                    format!("{u} is not in 1..={n_expert} (expert_count)"),
                ));
            }
        }
        let n_ff = m.per_layer("feed_forward_length", n_layer, block_count)?;
        let n_ff_of = |l: usize| n_ff.as_ref().map_or(0, |v| v[l]);
        let n_ff_exp_key = m
            .per_layer("expert_feed_forward_length", n_layer, block_count)?
            .unwrap_or_else(|| vec![0; n_layer]);
        let n_ff_exp: Vec<u64> = (0..n_layer)
            .map(|l| match n_ff_exp_key[l] {
                0 => n_ff_of(l) / n_expert_used[l],
                v => v,
            })
            .collect();
        if n_ff_exp.contains(&0) {
            return Err(if n_ff.is_none() {
                Error::MissingKey {
                    key: key("expert_feed_forward_length"),
                }
            } else {
                bad(
                    "expert_feed_forward_length",
                    "is 0 on a layer and feed_forward_length / expert_used_count is 0 too",
                )
            });
        }
        let n_ff_shexp_key = m
            .per_layer("expert_shared_feed_forward_length", n_layer, block_count)?
            .unwrap_or_else(|| vec![0; n_layer]);
        let n_ff_shexp: Vec<u64> = (0..n_layer)
            .map(|l| match n_ff_shexp_key[l] {
                0 => n_ff_of(l),
                v => v,
            })
            .collect();
        if n_ff_shexp.contains(&0) {
            return Err(if n_ff.is_none() {
                Error::MissingKey {
                    key: key("expert_shared_feed_forward_length"),
                }
            } else {
                bad(
                    "expert_shared_feed_forward_length",
                    "is 0 on a layer and feed_forward_length is 0 too",
                )
            });
        }

        // Which layers are GDN.
        let (layers, full_attention_interval): (Vec<LayerKind>, Option<u64>) =
            match m.opt_bool_array("attention.recurrent_layers")? {
                Some(recurrent) => {
                    m.check_per_layer_len(
                        "attention.recurrent_layers",
                        recurrent.len(),
                        n_layer,
                        block_count,
                    )?;
                    let kinds = recurrent[..n_layer]
                        .iter()
                        .map(|&r| {
                            if r {
                                LayerKind::Gdn
                            } else {
                                LayerKind::FullAttention
                            }
                        })
                        .collect();
                    (kinds, None)
                }
                None => {
                    let interval = m.opt_u64("full_attention_interval")?.unwrap_or(4);
                    positive("full_attention_interval", interval)?;
                    let kinds = (0..n_layer as u64)
                        .map(|i| {
                            if (i + 1) % interval != 0 {
                                LayerKind::Gdn
                            } else {
                                LayerKind::FullAttention
                            }
                        })
                        .collect();
                    (kinds, Some(interval))
                }
            };

        // Attention.
        let n_head = m
            .per_layer("attention.head_count", n_layer, block_count)?
            .ok_or_else(|| Error::MissingKey {
                key: key("attention.head_count"),
            })?;
        let n_head_kv = m
            .per_layer("attention.head_count_kv", n_layer, block_count)?
            .unwrap_or_else(|| n_head.clone());
        for l in 0..n_layer {
            if layers[l] == LayerKind::FullAttention {
                if n_head[l] == 0 {
                    return Err(bad(
                        "attention.head_count",
                        format!("is 0 on full-attention layer {l}"),
                    ));
                }
                if n_head_kv[l] == 0 || !n_head[l].is_multiple_of(n_head_kv[l]) {
                    return Err(bad(
                        "attention.head_count_kv",
                        format!(
                            "{} does not divide head_count {} on layer {l}",
                            n_head_kv[l], n_head[l]
                        ),
                    ));
                }
            }
        }
        let first_heads = n_head.iter().copied().find(|&h| h > 0).unwrap_or(0);
        let default_head_dim = n_embd.checked_div(first_heads).unwrap_or(0);
        let key_length = m
            .opt_u64("attention.key_length")?
            .unwrap_or(default_head_dim);
        let value_length = m
            .opt_u64("attention.value_length")?
            .unwrap_or(default_head_dim);
        if key_length != value_length {
            return Err(bad(
                "attention.value_length",
                format!("{value_length} differs from attention.key_length {key_length}"),
            ));
        }
        let head_dim = positive("attention.key_length", key_length)?;
        let rms_eps = m
            .opt_f32("attention.layer_norm_rms_epsilon")?
            .ok_or_else(|| Error::MissingKey {
                key: key("attention.layer_norm_rms_epsilon"),
            })?;
        if !(rms_eps.is_finite() && rms_eps >= 0.0) {
            return Err(bad(
                "attention.layer_norm_rms_epsilon",
                format!("{rms_eps} is not a finite non-negative number"),
            ));
        }
        let n_rot = m.opt_u64("rope.dimension_count")?.unwrap_or(head_dim);
        if n_rot > head_dim || !n_rot.is_multiple_of(2) {
            return Err(bad(
                "rope.dimension_count",
                format!("{n_rot} is odd or larger than the head dim {head_dim}"),
            ));
        }
        let rope_freq_base = m.opt_f32("rope.freq_base")?.unwrap_or(10000.0);
        let expert_weights_scale = m.opt_f32("expert_weights_scale")?.unwrap_or(0.0);
        if !expert_weights_scale.is_finite() {
            return Err(bad(
                "expert_weights_scale",
                format!("{expert_weights_scale} is not finite"),
            ));
        }
        let sections =
            m.opt_u64_array("rope.dimension_sections")?
                .ok_or_else(|| Error::MissingKey {
                    key: key("rope.dimension_sections"),
                })?;
        if sections.is_empty() || sections.len() > 4 {
            return Err(bad(
                "rope.dimension_sections",
                format!("{} entries; expected 1 to 4", sections.len()),
            ));
        }
        let mut rope_sections = [0u64; 4];
        rope_sections[..sections.len()].copy_from_slice(&sections);

        // Gated DeltaNet.
        let ssm = Ssm {
            conv_kernel: m.req_positive("ssm.conv_kernel")?,
            inner_size: m.req_positive("ssm.inner_size")?,
            state_size: m.req_positive("ssm.state_size")?,
            n_v_heads: m.req_positive("ssm.time_step_rank")?,
            n_k_heads: m.req_positive("ssm.group_count")?,
        };
        if ssm.inner_size != ssm.value_dim() {
            return Err(bad(
                "ssm.inner_size",
                format!(
                    "{} is not ssm.state_size x ssm.time_step_rank = {}",
                    ssm.inner_size,
                    ssm.value_dim()
                ),
            ));
        }
        if !ssm.n_v_heads.is_multiple_of(ssm.n_k_heads) {
            return Err(bad(
                "ssm.group_count",
                format!(
                    "{} does not divide ssm.time_step_rank {}",
                    ssm.n_k_heads, ssm.n_v_heads
                ),
            ));
        }

        // Hyper-connections and the indexer.
        let hc = m.req_u64("hyper_connection.count")?;
        if hc < 2 {
            return Err(bad("hyper_connection.count", format!("{hc} must be > 1")));
        }
        let hc_low_rank = m.req_positive("hyper_connection.low_rank")?;
        let indexer = Indexer {
            n_head: m.req_positive("attention.indexer.head_count")?,
            head_dim: m.req_positive("attention.indexer.key_length")?,
            top_k: m.req_positive("attention.indexer.top_k")?,
        };
        if indexer.head_dim < n_rot {
            return Err(bad(
                "attention.indexer.key_length",
                format!(
                    "{} is smaller than rope.dimension_count {n_rot} (the indexer is roped with it)",
                    indexer.head_dim
                ),
            ));
        }
        let compress_ratios = m
            .per_layer("attention.compress_ratios", n_layer, block_count)?
            .unwrap_or_else(|| vec![0; n_layer]);

        let ple = read_ple(&m, &layers, n_embd)?;

        Ok(Hparams {
            n_vocab,
            context_length,
            n_embd,
            block_count,
            nextn_predict_layers,
            n_layer,
            n_expert,
            n_expert_used,
            n_ff_exp,
            n_ff_shexp,
            n_head,
            n_head_kv,
            head_dim,
            rms_eps,
            n_rot,
            rope_freq_base,
            expert_weights_scale,
            rope_sections,
            ssm,
            hc,
            hc_low_rank,
            indexer,
            compress_ratios,
            layers,
            full_attention_interval,
            ple,
        })
    }

    /// hc x E: the width of all residual streams together.
    pub fn hc_dim(&self) -> u64 {
        self.hc * self.n_embd
    }

    /// The layers whose mixer is full attention.
    pub fn full_attention_layers(&self) -> Vec<usize> {
        (0..self.n_layer)
            .filter(|&l| self.layers[l] == LayerKind::FullAttention)
            .collect()
    }
}

fn read_ple(m: &Meta<'_>, layers: &[LayerKind], n_embd: u64) -> Result<Option<Ple>, Error> {
    let list = m.opt_u64_array("ple.layers")?.unwrap_or_default();
    let layer = match list.as_slice() {
        [] => return Ok(None),
        [one] => *one,
        more => {
            return Err(bad(
                "ple.layers",
                format!("{} entries; exactly one is supported", more.len()),
            ));
        }
    };
    let layer = usize::try_from(layer)
        .ok()
        .filter(|&l| l < layers.len())
        .ok_or_else(|| {
            bad(
                "ple.layers",
                format!("layer {layer} is not one of the {} layers", layers.len()),
            )
        })?;
    if layers[layer] != LayerKind::Gdn {
        return Err(bad(
            "ple.layers",
            format!("layer {layer} is a full-attention layer; PLE must be on a GDN layer"),
        ));
    }
    let ngram_size = m.req_u64("ple.ngram_size")?;
    if !(2..=8).contains(&ngram_size) {
        return Err(bad(
            "ple.ngram_size",
            format!("{ngram_size} is not in 2..=8"),
        ));
    }
    let heads_per_ngram = m.req_positive("ple.heads_per_ngram")?;
    let n_heads = (ngram_size - 1)
        .checked_mul(heads_per_ngram)
        .filter(|&n| n <= 64)
        .ok_or_else(|| {
            bad(
                "ple.heads_per_ngram",
                format!("(ngram_size - 1) x {heads_per_ngram} is over 64 heads"),
            )
        })?;
    let conv_kernel = m.req_positive("ple.conv_kernel")?;
    let eos_token_id = m.req_u64("ple.eos_token_id")?;
    let image_token_id = m.opt_u64("ple.image_token_id")?;
    let head_dim = m.req_positive("embedding_length_per_layer_input")?;
    if n_heads * head_dim != n_embd {
        return Err(bad(
            "embedding_length_per_layer_input",
            format!(
                "{n_heads} heads x {head_dim} is not embedding_length {n_embd} (the width ple_key reads)"
            ),
        ));
    }
    let array = |name: &str, at_least: u64| -> Result<Vec<u64>, Error> {
        let v = m
            .opt_u64_array(name)?
            .ok_or_else(|| Error::MissingKey { key: key(name) })?;
        if (v.len() as u64) < at_least {
            return Err(bad(
                name,
                format!("{} entries; at least {at_least} needed", v.len()),
            ));
        }
        Ok(v)
    };
    let layer_multipliers = array("ple.layer_multipliers", ngram_size)?;
    let head_offsets = array("ple.head_offsets", n_heads)?;
    let head_vocab_sizes = array("ple.head_vocab_sizes", n_heads)?;
    for h in 0..n_heads as usize {
        if head_offsets[h] > i32::MAX as u64 {
            return Err(bad(
                "ple.head_offsets",
                format!("head {h}: {} does not fit int32", head_offsets[h]),
            ));
        }
        if head_vocab_sizes[h] == 0 || head_vocab_sizes[h] > i32::MAX as u64 {
            return Err(bad(
                "ple.head_vocab_sizes",
                format!("head {h}: {} is not in 1..=int32 max", head_vocab_sizes[h]),
            ));
        }
    }
    Ok(Some(Ple {
        layer,
        ngram_size,
        heads_per_ngram,
        n_heads,
        conv_kernel,
        eos_token_id,
        image_token_id,
        head_dim,
        layer_multipliers,
        head_offsets,
        head_vocab_sizes,
    }))
}
