//! The built-in tiny fixture: a glm-dsa file written in code with the kit's
//! deterministic tensor bytes, mixed ggml types (Q8_0, Q4_0, F16, BF16,
//! F32), under 2 MiB. The public checkpoint's quirks in small: four trunk
//! layers plus an MTP block (`blk.4`, `nextn.*` included), no
//! `attention.indexer.types` key with a 2^20 context (so the GLM-5.2 table:
//! layers 0-2 full, 3 shared), indexer tensors on every block, a leading
//! dense layer, four sigmoid-routed experts (top 2, `exp_probs_b`, norm,
//! scale 2.5) and a shared expert; indexer top_k 2, so a prompt of three
//! tokens already selects.

use std::path::Path;

use family_kit::{FixtureSpec, FixtureTensor};
use seam::gguf::{GgmlType, GgufError, Value};

use crate::hparams::ARCH;

const E: u64 = 64;
const VOCAB: u64 = 64;
const HEADS: u64 = 2;
const LORA: u64 = 64;
const ROT: u64 = 16;
const DK: u64 = 48;
const DV: u64 = 32;
const IDX: (u64, u64) = (2, 64);
const N_EXPERT: u64 = 4;
const N_FF_EXP: u64 = 32;
const N_FF: u64 = 64;
/// Trunk layers; the MTP block is one more.
const N_LAYER: u64 = 4;

fn kv(name: &str, v: Value) -> (String, Value) {
    (format!("{ARCH}.{name}"), v)
}

/// The built-in fixture's metadata and tensor table.
pub fn fixture() -> FixtureSpec {
    use GgmlType::{BF16, F16, F32, Q4_0, Q8_0};
    let u = |v: u64| Value::U32(v as u32);
    let metadata = vec![
        (
            "general.architecture".to_owned(),
            Value::String(ARCH.into()),
        ),
        kv("block_count", u(N_LAYER + 1)),
        kv("nextn_predict_layers", u(1)),
        kv("context_length", u(1 << 20)),
        kv("embedding_length", u(E)),
        kv("feed_forward_length", u(N_FF)),
        kv("expert_feed_forward_length", u(N_FF_EXP)),
        kv("expert_count", u(N_EXPERT)),
        kv("expert_used_count", u(2)),
        kv("expert_shared_count", u(1)),
        kv("leading_dense_block_count", u(1)),
        kv("expert_weights_scale", Value::F32(2.5)),
        kv("expert_weights_norm", Value::Bool(true)),
        kv("expert_gating_func", u(2)),
        kv("attention.head_count", u(HEADS)),
        kv("attention.head_count_kv", u(1)),
        kv("attention.key_length", u(LORA + ROT)),
        kv("attention.value_length", u(LORA)),
        kv("attention.key_length_mla", u(DK)),
        kv("attention.value_length_mla", u(DV)),
        kv("attention.q_lora_rank", u(LORA)),
        kv("attention.kv_lora_rank", u(LORA)),
        kv("attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        kv("rope.dimension_count", u(ROT)),
        kv("rope.freq_base", Value::F32(10000.0)),
        kv("attention.indexer.head_count", u(IDX.0)),
        kv("attention.indexer.key_length", u(IDX.1)),
        kv("attention.indexer.top_k", u(2)),
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
    t("output.weight".into(), F16, &[E, VOCAB]);
    for l in 0..=N_LAYER {
        let n = |s: &str| format!("blk.{l}.{s}");
        t(n("attn_norm.weight"), F32, &[E]);
        t(n("attn_q_a.weight"), Q8_0, &[E, LORA]);
        t(n("attn_q_a_norm.weight"), F32, &[LORA]);
        t(n("attn_q_b.weight"), F16, &[LORA, HEADS * DK]);
        t(n("attn_kv_a_mqa.weight"), Q8_0, &[E, LORA + ROT]);
        t(n("attn_kv_a_norm.weight"), F32, &[LORA]);
        t(n("attn_k_b.weight"), F16, &[DK - ROT, LORA, HEADS]);
        t(n("attn_v_b.weight"), Q8_0, &[LORA, DV, HEADS]);
        t(n("attn_output.weight"), Q4_0, &[HEADS * DV, E]);
        t(n("ffn_norm.weight"), F32, &[E]);
        t(n("indexer.attn_q_b.weight"), F16, &[LORA, IDX.0 * IDX.1]);
        t(n("indexer.attn_k.weight"), BF16, &[E, IDX.1]);
        t(n("indexer.k_norm.weight"), F32, &[IDX.1]);
        t(n("indexer.k_norm.bias"), F32, &[IDX.1]);
        t(n("indexer.proj.weight"), F32, &[E, IDX.0]);
        if l == 0 {
            t(n("ffn_gate.weight"), Q8_0, &[E, N_FF]);
            t(n("ffn_up.weight"), Q8_0, &[E, N_FF]);
            t(n("ffn_down.weight"), F16, &[N_FF, E]);
        } else {
            t(n("ffn_gate_inp.weight"), F32, &[E, N_EXPERT]);
            t(n("exp_probs_b.bias"), F32, &[N_EXPERT]);
            t(n("ffn_gate_exps.weight"), Q8_0, &[E, N_FF_EXP, N_EXPERT]);
            t(n("ffn_up_exps.weight"), Q4_0, &[E, N_FF_EXP, N_EXPERT]);
            t(n("ffn_down_exps.weight"), Q8_0, &[N_FF_EXP, E, N_EXPERT]);
            t(n("ffn_gate_shexp.weight"), F16, &[E, N_FF_EXP]);
            t(n("ffn_up_shexp.weight"), F16, &[E, N_FF_EXP]);
            t(n("ffn_down_shexp.weight"), F16, &[N_FF_EXP, E]);
        }
        if l == N_LAYER {
            t(n("nextn.eh_proj.weight"), F16, &[2 * E, E]);
            t(n("nextn.enorm.weight"), F32, &[E]);
            t(n("nextn.hnorm.weight"), F32, &[E]);
            t(n("nextn.shared_head_norm.weight"), F32, &[E]);
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
