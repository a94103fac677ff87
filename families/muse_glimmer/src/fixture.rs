//! The built-in tiny fixture: 4 layers (0 to 2 sliding-window, 3 full:
//! the absent pattern key's every-4th rule), E 64, 2 heads over 1 KV head
//! of 32, n_ff 96, vocab 64, window 4, mixed ggml types (Q8_0, Q4_0, F16,
//! BF16, F32), a bias and the used and unused `.scale` tensors on layer 0.
//! Deterministic bytes from the kit's fixture helpers; a few KiB.
//!
//! [`Shape::checkpoint`] with [`quantized`]: the public checkpoint's
//! class with quantized types, for the benchmark (`--write-generated`).

use std::path::Path;

use family_kit::fixture::BlockScales;
use family_kit::{FixtureSpec, FixtureTensor};
use seam::gguf::{GgmlType, GgufError, GgufWriter, Value};

use crate::hparams::ARCH;

/// The sizes of a generated model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Hidden width (a multiple of 64).
    pub n_embd: u64,
    /// Query heads, K/V heads, head size.
    pub heads: (u64, u64, u64),
    /// `attention.sliding_window`.
    pub window: u64,
    /// `context_length`.
    pub n_ctx: u64,
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
            heads: (2, 1, 32),
            window: 4,
            n_ctx: 128,
            n_layer: 4,
            n_ff: 96,
            n_vocab: 64,
        }
    }

    /// The public checkpoint's class with `n_layer` layers (a 30B dense
    /// model of 52 layers, llama.cpp's `LLM_TYPE_30B` for muse-glimmer; the
    /// hidden sizes are not published with the file's metadata here, so
    /// they are assumed: E 5120, 40 heads of 128 over 8 K/V heads, FFN
    /// 27648, a 262,144-token vocabulary, a 2048-token window).
    pub fn checkpoint(n_layer: u64) -> Shape {
        Shape {
            n_embd: 5120,
            heads: (40, 8, 128),
            window: 2048,
            n_ctx: 131_072,
            n_layer,
            n_ff: 27648,
            n_vocab: 262_144,
        }
    }
}

/// The ggml types of a model's matrices, by role.
struct Types {
    embd: GgmlType,
    output: GgmlType,
    /// q, k, v, gate, output.
    attn: [GgmlType; 5],
    /// gate, up, down.
    ffn: [GgmlType; 3],
    /// The bias and `.scale` tensors of layer 0.
    extras: bool,
}

/// The fixture's spec (metadata and tensor table), editable by tests.
pub fn tiny() -> FixtureSpec {
    generated(&Shape::tiny())
}

/// A model of `shape` with the fixture's types and values (write it with
/// `streaming_writer` when it is large).
pub fn generated(shape: &Shape) -> FixtureSpec {
    use GgmlType::{BF16, F16, Q4_0, Q8_0};
    let types = Types {
        embd: Q8_0,
        output: F16,
        attn: [F16, BF16, Q8_0, Q4_0, Q8_0],
        ffn: [Q8_0, F16, Q4_0],
        extras: true,
    };
    spec_of(shape, &types)
}

/// A model of `shape` with Q4_K matrices and a Q6_K output, its blocks
/// scaled to a trained model's magnitude ([`BlockScales::FanIn`]):
/// gigabytes at [`Shape::checkpoint`], written streamed
/// ([`FixtureSpec::streaming_writer`]).
pub fn quantized(shape: &Shape) -> FixtureSpec {
    use GgmlType::{Q4_K, Q6_K};
    let types = Types {
        embd: Q4_K,
        output: Q6_K,
        attn: [Q4_K; 5],
        ffn: [Q4_K; 3],
        extras: false,
    };
    let mut spec = spec_of(shape, &types);
    spec.block_scales = BlockScales::FanIn { gain: 1 };
    spec
}

fn spec_of(shape: &Shape, ty: &Types) -> FixtureSpec {
    let (e, n_layer, n_ff, n_vocab) = (shape.n_embd, shape.n_layer, shape.n_ff, shape.n_vocab);
    let (n_head, n_head_kv, hd) = shape.heads;
    let key = |k: &str| format!("{ARCH}.{k}");
    let metadata = vec![
        (
            "general.architecture".to_owned(),
            Value::String(ARCH.into()),
        ),
        (key("context_length"), Value::U32(shape.n_ctx as u32)),
        (key("embedding_length"), Value::U32(e as u32)),
        (key("block_count"), Value::U32(n_layer as u32)),
        (key("feed_forward_length"), Value::U32(n_ff as u32)),
        (key("attention.head_count"), Value::U32(n_head as u32)),
        (key("attention.head_count_kv"), Value::U32(n_head_kv as u32)),
        (key("attention.key_length"), Value::U32(hd as u32)),
        (key("attention.value_length"), Value::U32(hd as u32)),
        (key("attention.layer_norm_rms_epsilon"), Value::F32(1e-5)),
        (
            key("attention.sliding_window"),
            Value::U32(shape.window as u32),
        ),
        (key("rope.freq_base_swa"), Value::F32(10000.0)),
        (key("logit_scale"), Value::F32(0.5)),
        (key("final_logit_softcapping"), Value::F32(10.0)),
    ];
    let (n_q, n_kv) = (n_head * hd, n_head_kv * hd);
    let mut tensors = Vec::new();
    let mut t = |name: String, ggml_type, dims: &[u64]| {
        tensors.push(FixtureTensor {
            name,
            ggml_type,
            dims: dims.to_vec(),
        })
    };
    t("token_embd.weight".into(), ty.embd, &[e, n_vocab]);
    t("output_norm.weight".into(), GgmlType::F32, &[e]);
    t("output.weight".into(), ty.output, &[e, n_vocab]);
    for l in 0..n_layer {
        let p = |s: &str| format!("blk.{l}.{s}");
        t(p("attn_norm.weight"), GgmlType::F32, &[e]);
        t(p("attn_q.weight"), ty.attn[0], &[e, n_q]);
        t(p("attn_k.weight"), ty.attn[1], &[e, n_kv]);
        t(p("attn_v.weight"), ty.attn[2], &[e, n_kv]);
        t(p("attn_q_norm.weight"), GgmlType::F32, &[hd]);
        t(p("attn_k_norm.weight"), GgmlType::F32, &[hd]);
        t(p("attn_gate.weight"), ty.attn[3], &[e, n_q]);
        t(p("attn_output.weight"), ty.attn[4], &[n_q, e]);
        t(p("post_attention_norm.weight"), GgmlType::F32, &[e]);
        t(p("ffn_norm.weight"), GgmlType::F32, &[e]);
        t(p("ffn_gate.weight"), ty.ffn[0], &[e, n_ff]);
        t(p("ffn_up.weight"), ty.ffn[1], &[e, n_ff]);
        t(p("ffn_down.weight"), ty.ffn[2], &[n_ff, e]);
        t(p("post_ffw_norm.weight"), GgmlType::F32, &[e]);
        if ty.extras && l == 0 {
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
