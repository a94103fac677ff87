//! The built-in tiny fixture: 3 layers (0 and 1 sliding-window, 2 full:
//! the absent pattern key's every-4th rule), E 64, 2 heads over 1 KV head
//! of 32, n_ff 96, vocab 64, window 4, mixed ggml types (Q8_0, Q4_0, F16,
//! BF16, F32), a bias and the used and unused `.scale` tensors on layer 0.
//! Deterministic bytes from the kit's fixture helpers; a few KiB.

use std::path::Path;

use family_kit::{FixtureSpec, FixtureTensor};
use seam::gguf::{GgmlType, GgufError, GgufWriter, Value};

use crate::hparams::ARCH;

const E: u64 = 64;
const N_LAYER: u64 = 3;
const N_HEAD: u64 = 2;
const N_HEAD_KV: u64 = 1;
const HD: u64 = 32;
const N_FF: u64 = 96;
const N_VOCAB: u64 = 64;

/// The fixture's spec (metadata and tensor table), editable by tests.
pub fn tiny() -> FixtureSpec {
    let key = |k: &str| format!("{ARCH}.{k}");
    let metadata = vec![
        (
            "general.architecture".to_owned(),
            Value::String(ARCH.into()),
        ),
        (key("context_length"), Value::U32(128)),
        (key("embedding_length"), Value::U32(E as u32)),
        (key("block_count"), Value::U32(N_LAYER as u32)),
        (key("feed_forward_length"), Value::U32(N_FF as u32)),
        (key("attention.head_count"), Value::U32(N_HEAD as u32)),
        (key("attention.head_count_kv"), Value::U32(N_HEAD_KV as u32)),
        (key("attention.key_length"), Value::U32(HD as u32)),
        (key("attention.value_length"), Value::U32(HD as u32)),
        (key("attention.layer_norm_rms_epsilon"), Value::F32(1e-5)),
        (key("attention.sliding_window"), Value::U32(4)),
        (key("rope.freq_base_swa"), Value::F32(10000.0)),
        (key("logit_scale"), Value::F32(0.5)),
        (key("final_logit_softcapping"), Value::F32(10.0)),
    ];
    let (n_q, n_kv) = (N_HEAD * HD, N_HEAD_KV * HD);
    let mut tensors = Vec::new();
    let mut t = |name: String, ggml_type, dims: &[u64]| {
        tensors.push(FixtureTensor {
            name,
            ggml_type,
            dims: dims.to_vec(),
        })
    };
    t("token_embd.weight".into(), GgmlType::Q8_0, &[E, N_VOCAB]);
    t("output_norm.weight".into(), GgmlType::F32, &[E]);
    t("output.weight".into(), GgmlType::F16, &[E, N_VOCAB]);
    for l in 0..N_LAYER {
        let p = |s: &str| format!("blk.{l}.{s}");
        t(p("attn_norm.weight"), GgmlType::F32, &[E]);
        t(p("attn_q.weight"), GgmlType::F16, &[E, n_q]);
        t(p("attn_k.weight"), GgmlType::BF16, &[E, n_kv]);
        t(p("attn_v.weight"), GgmlType::Q8_0, &[E, n_kv]);
        t(p("attn_q_norm.weight"), GgmlType::F32, &[HD]);
        t(p("attn_k_norm.weight"), GgmlType::F32, &[HD]);
        t(p("attn_gate.weight"), GgmlType::Q4_0, &[E, n_q]);
        t(p("attn_output.weight"), GgmlType::Q8_0, &[n_q, E]);
        t(p("post_attention_norm.weight"), GgmlType::F32, &[E]);
        t(p("ffn_norm.weight"), GgmlType::F32, &[E]);
        t(p("ffn_gate.weight"), GgmlType::Q8_0, &[E, N_FF]);
        t(p("ffn_up.weight"), GgmlType::F16, &[E, N_FF]);
        t(p("ffn_down.weight"), GgmlType::Q4_0, &[N_FF, E]);
        t(p("post_ffw_norm.weight"), GgmlType::F32, &[E]);
        if l == 0 {
            t(p("attn_q.bias"), GgmlType::F32, &[n_q]);
            t(p("attn_q.scale"), GgmlType::F32, &[1]);
            t(p("attn_output.scale"), GgmlType::F32, &[1]);
            t(p("ffn_up.scale"), GgmlType::F32, &[1]);
        }
    }
    FixtureSpec {
        metadata: metadata.into_iter().collect(),
        tensors,
    }
}

/// The fixture's writer.
pub fn fixture() -> GgufWriter {
    tiny().writer()
}

/// Writes the fixture to `path`; returns its size.
///
/// # Errors
///
/// The file cannot be written.
pub fn write_fixture(path: &Path) -> Result<u64, GgufError> {
    tiny().write_file(path)
}
