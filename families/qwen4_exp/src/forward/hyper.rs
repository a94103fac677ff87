//! The hyperparameters in the forward pass's units (`usize`, `f64`), taken
//! from [`crate::hparams::Hparams`] (docs/families/qwen4_exp.md, section
//! 1): the metadata is read once, by the kit's reader.

use crate::hparams::{Hparams, LayerKind};

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
    /// `expert_weights_scale` (0: none).
    pub expert_weights_scale: f32,
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

impl Hyper {
    /// The first position whose query selects QSA blocks in layer `il`
    /// (spec 6.1: `top_k + r - 1`, `r` the layer's compress ratio, not 0).
    pub fn qsa_width(&self, il: usize) -> usize {
        self.top_k + self.compress[il] - 1
    }

    /// The forward pass's view of the family's [`Hparams`] (read and
    /// checked once, by the kit's metadata reader).
    pub fn from_hparams(hp: &Hparams) -> Hyper {
        let us = |v: &[u64]| v.iter().map(|&x| x as usize).collect::<Vec<usize>>();
        Hyper {
            n_embd: hp.n_embd as usize,
            n_layer: hp.n_layer,
            eps: f64::from(hp.rms_eps),
            hc: hp.hc as usize,
            n_head: us(&hp.n_head),
            n_head_kv: us(&hp.n_head_kv),
            head_dim: hp.head_dim as usize,
            n_rot: hp.n_rot as usize,
            freq_base: f64::from(hp.rope_freq_base),
            sections: hp.rope_sections.map(|s| s as usize),
            recurrent: hp.layers.iter().map(|&k| k == LayerKind::Gdn).collect(),
            compress: us(&hp.compress_ratios),
            top_k: hp.indexer.top_k as usize,
            n_idx_head: hp.indexer.n_head as usize,
            idx_dim: hp.indexer.head_dim as usize,
            n_expert_used: us(&hp.n_expert_used),
            expert_weights_scale: hp.expert_weights_scale,
            ssm_state: hp.ssm.state_size as usize,
            ssm_v_heads: hp.ssm.n_v_heads as usize,
            ssm_k_heads: hp.ssm.n_k_heads as usize,
            ssm_conv: hp.ssm.conv_kernel as usize,
            ple: hp.ple.as_ref().map(|p| PleHyper {
                layer: p.layer,
                ngram: p.ngram_size as usize,
                per_gram: p.heads_per_ngram as usize,
                conv_kernel: p.conv_kernel as usize,
                eos: p.eos_token_id,
                head_dim: p.head_dim as usize,
                multipliers: p.layer_multipliers.clone(),
                offsets: p.head_offsets.clone(),
                vocab_sizes: p.head_vocab_sizes.clone(),
            }),
        }
    }
}
