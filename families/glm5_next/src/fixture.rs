//! The built-in tiny fixture: a glm5-next file written in code with the
//! kit's deterministic tensor bytes, mixed ggml types (Q8_0, Q4_0, F16,
//! BF16, F32), under 2 MiB. Four main layers in the public checkpoint's
//! pattern (3 KDA : 1 MLA, `head_count_kv` [0, 0, 0, 1]), a leading dense
//! layer then three MoE layers (three banks each), a sparse pooled-key
//! indexer (top_k 8 = 2 pools of 4), clamped SwiGLU.

use std::path::Path;

use family_kit::{FixtureSpec, FixtureTensor};
use seam::gguf::{Array, GgmlType, GgufError, Value};

use crate::hparams::ARCH;

const D_CONV: u64 = 4;
const KPOOL: u64 = 4;
/// Layers whose `head_count_kv` is 0 (KDA); the others are MLA.
const KV_HEADS: [u32; 4] = [0, 0, 0, 1];

/// The sizes of a fixture (the layer pattern and types are fixed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// E.
    pub e: u64,
    /// Vocabulary.
    pub vocab: u64,
    /// Heads (KDA and MLA).
    pub heads: u64,
    /// KDA head dim.
    pub kda_dim: u64,
    /// q and kv LoRA ranks.
    pub lora: u64,
    /// MLA qk and v head dims.
    pub head_dim: u64,
    /// Indexer heads and head dim.
    pub idx: (u64, u64),
    /// Routed experts.
    pub n_expert: u64,
    /// Expert FFN width.
    pub n_ff_exp: u64,
    /// Dense FFN width.
    pub n_ff: u64,
}

impl Shape {
    /// The built-in tiny fixture's (about 0.7 MB).
    pub fn tiny() -> Shape {
        Shape {
            e: 64,
            vocab: 64,
            heads: 2,
            kda_dim: 32,
            lora: 64,
            head_dim: 32,
            idx: (2, 32),
            n_expert: 4,
            n_ff_exp: 32,
            n_ff: 64,
        }
    }
}

fn kv(name: &str, v: Value) -> (String, Value) {
    (format!("{ARCH}.{name}"), v)
}

/// The built-in fixture's metadata and tensor table.
pub fn fixture() -> FixtureSpec {
    fixture_of(&Shape::tiny())
}

/// A fixture of `shape` (quantized dims must be multiples of 32).
pub fn fixture_of(shape: &Shape) -> FixtureSpec {
    use GgmlType::{BF16, F16, F32, Q4_0, Q8_0};
    let &Shape {
        e,
        vocab,
        heads,
        kda_dim,
        lora: q_lora,
        head_dim: dk,
        idx: (idx_heads, idx_dim),
        n_expert,
        n_ff_exp,
        n_ff,
    } = shape;
    let (kv_lora, dv, n_layer) = (q_lora, dk, KV_HEADS.len() as u64);
    let (d_conv, kpool) = (D_CONV, KPOOL);
    let metadata = vec![
        (
            "general.architecture".to_owned(),
            Value::String(ARCH.into()),
        ),
        kv("block_count", Value::U32(n_layer as u32)),
        kv("context_length", Value::U32(256)),
        kv("embedding_length", Value::U32(e as u32)),
        kv("feed_forward_length", Value::U32(n_ff as u32)),
        kv("leading_dense_block_count", Value::U32(1)),
        kv("attention.head_count", Value::U32(heads as u32)),
        kv(
            "attention.head_count_kv",
            Value::Array(Array::U32(KV_HEADS.to_vec())),
        ),
        kv("attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        kv("attention.layer_norm_epsilon", Value::F32(1e-5)),
        kv("attention.key_length_mla", Value::U32(dk as u32)),
        kv("attention.value_length_mla", Value::U32(dv as u32)),
        kv("attention.q_lora_rank", Value::U32(q_lora as u32)),
        kv("attention.kv_lora_rank", Value::U32(kv_lora as u32)),
        kv("rope.dimension_count", Value::U32(0)),
        kv("ssm.conv_kernel", Value::U32(d_conv as u32)),
        kv("kda.head_dim", Value::U32(kda_dim as u32)),
        kv("kda.gate_lower_bound", Value::F32(-5.0)),
        kv("expert_count", Value::U32(n_expert as u32)),
        kv("expert_used_count", Value::U32(2)),
        kv("expert_feed_forward_length", Value::U32(n_ff_exp as u32)),
        kv("expert_shared_count", Value::U32(1)),
        kv("expert_weights_scale", Value::F32(2.5)),
        kv("expert_weights_norm", Value::Bool(true)),
        kv("expert_gating_func", Value::U32(2)),
        kv("swiglu_clamp_exp", Value::F32(1.5)),
        kv("attention.indexer.head_count", Value::U32(idx_heads as u32)),
        kv("attention.indexer.key_length", Value::U32(idx_dim as u32)),
        kv("attention.indexer.top_k", Value::U32(8)),
        kv("attention.indexer.kpool", Value::U32(kpool as u32)),
        kv("attention.indexer.kpool_select_tail", Value::Bool(true)),
        kv("hyper_connection.count", Value::U32(4)),
        kv("hyper_connection.sinkhorn_iterations", Value::U32(2)),
        kv("hyper_connection.epsilon", Value::F32(1e-6)),
    ];
    let mut tensors = Vec::new();
    let mut t = |name: String, ggml_type: GgmlType, dims: &[u64]| {
        tensors.push(FixtureTensor {
            name,
            ggml_type,
            dims: dims.to_vec(),
        });
    };
    t("token_embd.weight".into(), Q8_0, &[e, vocab]);
    t("output_norm.weight".into(), F32, &[e]);
    t("output.weight".into(), Q8_0, &[e, vocab]);
    let di = kda_dim * heads;
    for l in 0..n_layer {
        let n = |s: &str| format!("blk.{l}.{s}");
        t(n("attn_norm.weight"), F32, &[e]);
        t(n("ffn_norm.weight"), F32, &[e]);
        for p in ["hc_attn", "hc_ffn"] {
            t(n(&format!("{p}_fn.weight")), F32, &[4 * e, 24]);
            t(n(&format!("{p}_base.weight")), F32, &[24]);
            t(n(&format!("{p}_scale.weight")), F32, &[3]);
        }
        if KV_HEADS[l as usize] == 0 {
            for x in ["q", "k", "v"] {
                t(n(&format!("attn_{x}.weight")), F16, &[e, di]);
                t(n(&format!("ssm_conv1d_{x}.weight")), F32, &[d_conv, 1, di]);
            }
            t(n("ssm_f_a.weight"), F32, &[e, kda_dim]);
            t(n("ssm_f_b.weight"), F32, &[kda_dim, di]);
            t(n("ssm_dt.bias"), F32, &[di]);
            t(n("ssm_a"), F32, &[heads]);
            t(n("ssm_beta.weight"), F32, &[e, heads]);
            t(n("ssm_g_a.weight"), F32, &[e, kda_dim]);
            t(n("ssm_g_b.weight"), F32, &[kda_dim, di]);
            t(n("ssm_norm.weight"), F32, &[kda_dim]);
            t(n("attn_output.weight"), F32, &[di, e]);
        } else {
            t(n("attn_q_a.weight"), F32, &[e, q_lora]);
            t(n("attn_q_a_norm.weight"), F32, &[q_lora]);
            t(n("attn_q_b.weight"), BF16, &[q_lora, heads * dk]);
            t(n("attn_kv_a_mqa.weight"), BF16, &[e, kv_lora]);
            t(n("attn_kv_a_norm.weight"), F32, &[kv_lora]);
            t(n("attn_k_b.weight"), F32, &[dk, kv_lora, heads]);
            t(n("attn_v_b.weight"), F32, &[kv_lora, dv, heads]);
            t(n("attn_output.weight"), F32, &[heads * dv, e]);
            t(
                n("indexer.attn_q_b.weight"),
                F16,
                &[q_lora, idx_heads * idx_dim],
            );
            t(n("indexer.attn_k.weight"), F32, &[e, idx_dim]);
            t(n("indexer.k_norm.weight"), F32, &[idx_dim]);
            t(n("indexer.k_norm.bias"), F32, &[idx_dim]);
            t(n("indexer.proj.weight"), F32, &[e, idx_heads]);
            t(n("indexer_compressor_gate.weight"), F32, &[e, idx_dim]);
            t(n("indexer_compressor_ape.weight"), F32, &[idx_dim, kpool]);
        }
        if l == 0 {
            t(n("ffn_gate.weight"), Q8_0, &[e, n_ff]);
            t(n("ffn_up.weight"), Q8_0, &[e, n_ff]);
            t(n("ffn_down.weight"), Q8_0, &[n_ff, e]);
        } else {
            t(n("ffn_gate_inp.weight"), F32, &[e, n_expert]);
            t(n("exp_probs_b.bias"), F32, &[n_expert]);
            t(n("ffn_gate_exps.weight"), Q8_0, &[e, n_ff_exp, n_expert]);
            t(n("ffn_up_exps.weight"), Q8_0, &[e, n_ff_exp, n_expert]);
            t(n("ffn_down_exps.weight"), Q4_0, &[n_ff_exp, e, n_expert]);
            t(n("ffn_gate_shexp.weight"), F16, &[e, n_ff_exp]);
            t(n("ffn_up_shexp.weight"), F16, &[e, n_ff_exp]);
            t(n("ffn_down_shexp.weight"), F16, &[n_ff_exp, e]);
        }
    }
    FixtureSpec {
        metadata,
        tensors,
        ..FixtureSpec::default()
    }
}

/// Writes the fixture to `path`; returns its size.
///
/// # Errors
///
/// The file cannot be written.
pub fn write_fixture(path: &Path) -> Result<u64, GgufError> {
    fixture().write_file(path)
}
