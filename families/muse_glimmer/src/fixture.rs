//! The built-in tiny fixture: 4 layers (0 to 2 sliding-window, 3 full:
//! the absent pattern key's every-4th rule), E 64, 2 heads over 1 KV head
//! of 32, n_ff 96, vocab 64, window 4, mixed ggml types (Q8_0, Q4_0, F16,
//! BF16, F32), a bias and the used and unused `.scale` tensors on layer 0.
//! Deterministic bytes from the kit's fixture helpers; a few KiB.

use std::path::Path;

use family_kit::{FixtureSpec, FixtureTensor};
use seam::gguf::{GgmlType, GgufError, GgufWriter, Value};

use crate::hparams::ARCH;

/// Head size of every generated model.
const HD: u64 = 32;

/// The sizes of a generated model: heads of 32, `E / 32` query heads over
/// half as many K/V heads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Hidden width (a multiple of 64).
    pub n_embd: u64,
    /// Layers.
    pub n_layer: u64,
    /// FFN width (a multiple of 32).
    pub n_ff: u64,
    /// Vocabulary.
    pub n_vocab: u64,
}

impl Shape {
    /// The built-in fixture's.
    pub fn tiny() -> Shape {
        Shape {
            n_embd: 64,
            n_layer: 4,
            n_ff: 96,
            n_vocab: 64,
        }
    }
}

/// The fixture's spec (metadata and tensor table), editable by tests.
pub fn tiny() -> FixtureSpec {
    generated(&Shape::tiny())
}

/// A model of `shape` with the fixture's types and values (write it with
/// `streaming_writer` when it is large).
pub fn generated(shape: &Shape) -> FixtureSpec {
    let (e, n_layer, n_ff, n_vocab) = (shape.n_embd, shape.n_layer, shape.n_ff, shape.n_vocab);
    let n_head = e / HD;
    let n_head_kv = (n_head / 2).max(1);
    let key = |k: &str| format!("{ARCH}.{k}");
    let metadata = vec![
        (
            "general.architecture".to_owned(),
            Value::String(ARCH.into()),
        ),
        (key("context_length"), Value::U32(128)),
        (key("embedding_length"), Value::U32(e as u32)),
        (key("block_count"), Value::U32(n_layer as u32)),
        (key("feed_forward_length"), Value::U32(n_ff as u32)),
        (key("attention.head_count"), Value::U32(n_head as u32)),
        (key("attention.head_count_kv"), Value::U32(n_head_kv as u32)),
        (key("attention.key_length"), Value::U32(HD as u32)),
        (key("attention.value_length"), Value::U32(HD as u32)),
        (key("attention.layer_norm_rms_epsilon"), Value::F32(1e-5)),
        (key("attention.sliding_window"), Value::U32(4)),
        (key("rope.freq_base_swa"), Value::F32(10000.0)),
        (key("logit_scale"), Value::F32(0.5)),
        (key("final_logit_softcapping"), Value::F32(10.0)),
    ];
    let (n_q, n_kv) = (n_head * HD, n_head_kv * HD);
    let mut tensors = Vec::new();
    let mut t = |name: String, ggml_type, dims: &[u64]| {
        tensors.push(FixtureTensor {
            name,
            ggml_type,
            dims: dims.to_vec(),
        })
    };
    t("token_embd.weight".into(), GgmlType::Q8_0, &[e, n_vocab]);
    t("output_norm.weight".into(), GgmlType::F32, &[e]);
    t("output.weight".into(), GgmlType::F16, &[e, n_vocab]);
    for l in 0..n_layer {
        let p = |s: &str| format!("blk.{l}.{s}");
        t(p("attn_norm.weight"), GgmlType::F32, &[e]);
        t(p("attn_q.weight"), GgmlType::F16, &[e, n_q]);
        t(p("attn_k.weight"), GgmlType::BF16, &[e, n_kv]);
        t(p("attn_v.weight"), GgmlType::Q8_0, &[e, n_kv]);
        t(p("attn_q_norm.weight"), GgmlType::F32, &[HD]);
        t(p("attn_k_norm.weight"), GgmlType::F32, &[HD]);
        t(p("attn_gate.weight"), GgmlType::Q4_0, &[e, n_q]);
        t(p("attn_output.weight"), GgmlType::Q8_0, &[n_q, e]);
        t(p("post_attention_norm.weight"), GgmlType::F32, &[e]);
        t(p("ffn_norm.weight"), GgmlType::F32, &[e]);
        t(p("ffn_gate.weight"), GgmlType::Q8_0, &[e, n_ff]);
        t(p("ffn_up.weight"), GgmlType::F16, &[e, n_ff]);
        t(p("ffn_down.weight"), GgmlType::Q4_0, &[n_ff, e]);
        t(p("post_ffw_norm.weight"), GgmlType::F32, &[e]);
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
        ..FixtureSpec::default()
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
