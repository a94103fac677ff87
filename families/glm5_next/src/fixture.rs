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

const E: u64 = 64;
const VOCAB: u64 = 64;
const N_LAYER: u64 = 4;
const HEADS: u64 = 2;
const KDA_DIM: u64 = 32;
const D_CONV: u64 = 4;
const Q_LORA: u64 = 64;
const KV_LORA: u64 = 64;
const DK: u64 = 32;
const DV: u64 = 32;
const IDX_HEADS: u64 = 2;
const IDX_DIM: u64 = 32;
const KPOOL: u64 = 4;
const N_EXPERT: u64 = 4;
const N_FF_EXP: u64 = 32;
const N_FF: u64 = 64;
/// Layers whose `head_count_kv` is 0 (KDA); the others are MLA.
const KV_HEADS: [u32; N_LAYER as usize] = [0, 0, 0, 1];

fn kv(name: &str, v: Value) -> (String, Value) {
    (format!("{ARCH}.{name}"), v)
}

/// The fixture's metadata and tensor table.
pub fn fixture() -> FixtureSpec {
    use GgmlType::{BF16, F16, F32, Q4_0, Q8_0};
    let metadata = vec![
        ("general.architecture".to_owned(), Value::String(ARCH.into())),
        kv("block_count", Value::U32(N_LAYER as u32)),
        kv("context_length", Value::U32(256)),
        kv("embedding_length", Value::U32(E as u32)),
        kv("feed_forward_length", Value::U32(N_FF as u32)),
        kv("leading_dense_block_count", Value::U32(1)),
        kv("attention.head_count", Value::U32(HEADS as u32)),
        kv(
            "attention.head_count_kv",
            Value::Array(Array::U32(KV_HEADS.to_vec())),
        ),
        kv("attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        kv("attention.layer_norm_epsilon", Value::F32(1e-5)),
        kv("attention.key_length_mla", Value::U32(DK as u32)),
        kv("attention.value_length_mla", Value::U32(DV as u32)),
        kv("attention.q_lora_rank", Value::U32(Q_LORA as u32)),
        kv("attention.kv_lora_rank", Value::U32(KV_LORA as u32)),
        kv("rope.dimension_count", Value::U32(0)),
        kv("ssm.conv_kernel", Value::U32(D_CONV as u32)),
        kv("kda.head_dim", Value::U32(KDA_DIM as u32)),
        kv("kda.gate_lower_bound", Value::F32(-5.0)),
        kv("expert_count", Value::U32(N_EXPERT as u32)),
        kv("expert_used_count", Value::U32(2)),
        kv("expert_feed_forward_length", Value::U32(N_FF_EXP as u32)),
        kv("expert_shared_count", Value::U32(1)),
        kv("expert_weights_scale", Value::F32(2.5)),
        kv("expert_weights_norm", Value::Bool(true)),
        kv("expert_gating_func", Value::U32(2)),
        kv("swiglu_clamp_exp", Value::F32(1.5)),
        kv("attention.indexer.head_count", Value::U32(IDX_HEADS as u32)),
        kv("attention.indexer.key_length", Value::U32(IDX_DIM as u32)),
        kv("attention.indexer.top_k", Value::U32(8)),
        kv("attention.indexer.kpool", Value::U32(KPOOL as u32)),
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
    t("token_embd.weight".into(), Q8_0, &[E, VOCAB]);
    t("output_norm.weight".into(), F32, &[E]);
    t("output.weight".into(), Q8_0, &[E, VOCAB]);
    let di = KDA_DIM * HEADS;
    for l in 0..N_LAYER {
        let n = |s: &str| format!("blk.{l}.{s}");
        t(n("attn_norm.weight"), F32, &[E]);
        t(n("ffn_norm.weight"), F32, &[E]);
        for p in ["hc_attn", "hc_ffn"] {
            t(n(&format!("{p}_fn.weight")), F32, &[4 * E, 24]);
            t(n(&format!("{p}_base.weight")), F32, &[24]);
            t(n(&format!("{p}_scale.weight")), F32, &[3]);
        }
        if KV_HEADS[l as usize] == 0 {
            for x in ["q", "k", "v"] {
                t(n(&format!("attn_{x}.weight")), F16, &[E, di]);
                t(n(&format!("ssm_conv1d_{x}.weight")), F32, &[D_CONV, 1, di]);
            }
            t(n("ssm_f_a.weight"), F32, &[E, KDA_DIM]);
            t(n("ssm_f_b.weight"), F32, &[KDA_DIM, di]);
            t(n("ssm_dt.bias"), F32, &[di]);
            t(n("ssm_a"), F32, &[HEADS]);
            t(n("ssm_beta.weight"), F32, &[E, HEADS]);
            t(n("ssm_g_a.weight"), F32, &[E, KDA_DIM]);
            t(n("ssm_g_b.weight"), F32, &[KDA_DIM, di]);
            t(n("ssm_norm.weight"), F32, &[KDA_DIM]);
            t(n("attn_output.weight"), F32, &[di, E]);
        } else {
            t(n("attn_q_a.weight"), F32, &[E, Q_LORA]);
            t(n("attn_q_a_norm.weight"), F32, &[Q_LORA]);
            t(n("attn_q_b.weight"), BF16, &[Q_LORA, HEADS * DK]);
            t(n("attn_kv_a_mqa.weight"), BF16, &[E, KV_LORA]);
            t(n("attn_kv_a_norm.weight"), F32, &[KV_LORA]);
            t(n("attn_k_b.weight"), F32, &[DK, KV_LORA, HEADS]);
            t(n("attn_v_b.weight"), F32, &[KV_LORA, DV, HEADS]);
            t(n("attn_output.weight"), F32, &[HEADS * DV, E]);
            t(
                n("indexer.attn_q_b.weight"),
                F16,
                &[Q_LORA, IDX_HEADS * IDX_DIM],
            );
            t(n("indexer.attn_k.weight"), F32, &[E, IDX_DIM]);
            t(n("indexer.k_norm.weight"), F32, &[IDX_DIM]);
            t(n("indexer.k_norm.bias"), F32, &[IDX_DIM]);
            t(n("indexer.proj.weight"), F32, &[E, IDX_HEADS]);
            t(n("indexer_compressor_gate.weight"), F32, &[E, IDX_DIM]);
            t(n("indexer_compressor_ape.weight"), F32, &[IDX_DIM, KPOOL]);
        }
        if l == 0 {
            t(n("ffn_gate.weight"), Q8_0, &[E, N_FF]);
            t(n("ffn_up.weight"), Q8_0, &[E, N_FF]);
            t(n("ffn_down.weight"), Q8_0, &[N_FF, E]);
        } else {
            t(n("ffn_gate_inp.weight"), F32, &[E, N_EXPERT]);
            t(n("exp_probs_b.bias"), F32, &[N_EXPERT]);
            t(n("ffn_gate_exps.weight"), Q8_0, &[E, N_FF_EXP, N_EXPERT]);
            t(n("ffn_up_exps.weight"), Q8_0, &[E, N_FF_EXP, N_EXPERT]);
            t(n("ffn_down_exps.weight"), Q4_0, &[N_FF_EXP, E, N_EXPERT]);
            t(n("ffn_gate_shexp.weight"), F16, &[E, N_FF_EXP]);
            t(n("ffn_up_shexp.weight"), F16, &[E, N_FF_EXP]);
            t(n("ffn_down_shexp.weight"), F16, &[N_FF_EXP, E]);
        }
    }
    FixtureSpec { metadata, tensors }
}

/// Writes the fixture to `path`; returns its size.
///
/// # Errors
///
/// The file cannot be written.
pub fn write_fixture(path: &Path) -> Result<u64, GgufError> {
    fixture().write_file(path)
}
