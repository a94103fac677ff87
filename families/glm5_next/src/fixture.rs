//! The built-in tiny fixture: a glm5-next file written in code with the
//! kit's deterministic tensor bytes, mixed ggml types (Q8_0, Q4_0, F16,
//! BF16, F32), under 2 MiB. Four main layers in the public checkpoint's
//! pattern (3 KDA : 1 MLA, `head_count_kv` [0, 0, 0, 1]), a leading dense
//! layer then three MoE layers (three banks each), a sparse pooled-key
//! indexer (top_k 8 = 2 pools of 4), clamped SwiGLU.
//!
//! [`generated`]: the same layout at the sizes of the public checkpoint's
//! class ([`Shape::checkpoint`]) with quantized types, for the benchmark
//! (`--write-generated`).

use std::path::Path;

use family_kit::fixture::{BlockScales, GlmFfnTypes, GlmFfnWidths, glm_ffn_tensors};
use family_kit::{FixtureSpec, FixtureTensor};
use seam::gguf::{Array, GgmlType, GgufError, Value};

use crate::hparams::ARCH;

const D_CONV: u64 = 4;
const KPOOL: u64 = 4;
/// `head_count_kv` of layer `l`: 0 (KDA) but for every fourth layer
/// (MLA), the public checkpoint's 3 : 1 pattern.
fn kv_heads(l: u64) -> u32 {
    u32::from(l % 4 == 3)
}

/// The sizes of a fixture (the layer pattern is fixed).
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
    /// The q LoRA rank.
    pub lora: u64,
    /// The kv LoRA rank.
    pub kv_lora: u64,
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
    /// Experts used per token.
    pub n_expert_used: u64,
    /// Indexer top-k.
    pub top_k: u64,
    /// Layers (the first dense).
    pub n_layer: u64,
    /// `context_length`.
    pub n_ctx: u64,
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
            kv_lora: 64,
            n_expert_used: 2,
            top_k: 8,
            n_layer: 4,
            n_ctx: 256,
        }
    }

    /// Sizes of the public checkpoint's class with `n_layer` layers
    /// (GLM-5.3-Flash: 45 layers, about 320B parameters with 18B active;
    /// its hidden sizes are not published with the file's metadata here,
    /// so they are assumed from the GLM-5 line: E 5120, 64 heads, KDA heads
    /// of 128, q/kv LoRA 2048/512, MLA heads of 192, 256 experts of 2048
    /// with 8 used, a dense first layer of 12288, indexer 32 heads of 128
    /// with top-k 2048, a 154,880-token vocabulary).
    pub fn checkpoint(n_layer: u64) -> Shape {
        Shape {
            e: 5120,
            vocab: 154_880,
            heads: 64,
            kda_dim: 128,
            lora: 2048,
            kv_lora: 512,
            head_dim: 192,
            idx: (32, 128),
            n_expert: 256,
            n_ff_exp: 2048,
            n_ff: 12288,
            n_expert_used: 8,
            top_k: 2048,
            n_layer,
            n_ctx: 131_072,
        }
    }
}

/// The ggml types a fixture's tensors take, by role.
struct Types {
    embd: GgmlType,
    output: GgmlType,
    /// KDA q, k, v.
    kda_qkv: GgmlType,
    /// KDA and MLA output.
    attn_output: (GgmlType, GgmlType),
    /// `attn_q_a`, `attn_q_b`, `attn_kv_a_mqa`.
    mla_a_b: (GgmlType, GgmlType, GgmlType),
    /// `attn_k_b`, `attn_v_b`.
    mla_kv_b: GgmlType,
    /// `indexer.attn_q_b`, `indexer.attn_k`.
    indexer: (GgmlType, GgmlType),
    ffn: GlmFfnTypes,
}

impl Types {
    /// The tiny fixture's mix.
    fn tiny() -> Types {
        use GgmlType::{BF16, F16, F32, Q4_0, Q8_0};
        Types {
            embd: Q8_0,
            output: Q8_0,
            kda_qkv: F16,
            attn_output: (F32, F32),
            mla_a_b: (F32, BF16, BF16),
            mla_kv_b: F32,
            indexer: (F16, F32),
            ffn: GlmFfnTypes {
                dense: (Q8_0, Q8_0),
                experts: (Q8_0, Q8_0, Q4_0),
                shexp: F16,
            },
        }
    }

    /// A Q4_K_M-like mix: Q4_K matrices, Q8_0 where rows are short
    /// (`attn_k_b`, `attn_v_b`, the indexer), Q6_K output.
    fn quantized() -> Types {
        use GgmlType::{Q4_K, Q6_K, Q8_0};
        Types {
            embd: Q4_K,
            output: Q6_K,
            kda_qkv: Q4_K,
            attn_output: (Q4_K, Q4_K),
            mla_a_b: (Q4_K, Q4_K, Q4_K),
            mla_kv_b: Q8_0,
            indexer: (Q8_0, Q8_0),
            ffn: GlmFfnTypes {
                dense: (Q4_K, Q4_K),
                experts: (Q4_K, Q4_K, Q4_K),
                shexp: Q4_K,
            },
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

/// A fixture of `shape` with the tiny fixture's types (quantized dims
/// must be multiples of 32).
pub fn fixture_of(shape: &Shape) -> FixtureSpec {
    fixture_typed(shape, &Types::tiny())
}

/// A model of `shape` with quantized types, its blocks scaled to a trained
/// model's magnitude ([`BlockScales::FanIn`]): gigabytes at
/// [`Shape::checkpoint`], written streamed
/// ([`FixtureSpec::streaming_writer`]).
pub fn generated(shape: &Shape) -> FixtureSpec {
    let mut spec = fixture_typed(shape, &Types::quantized());
    spec.block_scales = BlockScales::FanIn { gain: 1 };
    // llama.cpp sizes an MLA layer's cache rows by these (the latent's
    // width, as its own glm5-next files say); absent, it takes E / heads.
    for k in ["attention.key_length", "attention.value_length"] {
        spec.set_key(&format!("{ARCH}.{k}"), Value::U32(shape.kv_lora as u32));
    }
    spec
}

fn fixture_typed(shape: &Shape, ty: &Types) -> FixtureSpec {
    use GgmlType::F32;
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
        kv_lora,
        n_expert_used,
        top_k,
        n_layer,
        n_ctx,
    } = shape;
    let dv = dk;
    let heads_kv: Vec<u32> = (0..n_layer).map(kv_heads).collect();
    let (d_conv, kpool) = (D_CONV, KPOOL);
    let metadata = vec![
        (
            "general.architecture".to_owned(),
            Value::String(ARCH.into()),
        ),
        kv("block_count", Value::U32(n_layer as u32)),
        kv("context_length", Value::U32(n_ctx as u32)),
        kv("embedding_length", Value::U32(e as u32)),
        kv("feed_forward_length", Value::U32(n_ff as u32)),
        kv("leading_dense_block_count", Value::U32(1)),
        kv("attention.head_count", Value::U32(heads as u32)),
        kv(
            "attention.head_count_kv",
            Value::Array(Array::U32(heads_kv)),
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
        kv("expert_used_count", Value::U32(n_expert_used as u32)),
        kv("expert_feed_forward_length", Value::U32(n_ff_exp as u32)),
        kv("expert_shared_count", Value::U32(1)),
        kv("expert_weights_scale", Value::F32(2.5)),
        kv("expert_weights_norm", Value::Bool(true)),
        kv("expert_gating_func", Value::U32(2)),
        kv("swiglu_clamp_exp", Value::F32(1.5)),
        kv("attention.indexer.head_count", Value::U32(idx_heads as u32)),
        kv("attention.indexer.key_length", Value::U32(idx_dim as u32)),
        kv("attention.indexer.top_k", Value::U32(top_k as u32)),
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
    t("token_embd.weight".into(), ty.embd, &[e, vocab]);
    t("output_norm.weight".into(), F32, &[e]);
    t("output.weight".into(), ty.output, &[e, vocab]);
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
        if kv_heads(l) == 0 {
            for x in ["q", "k", "v"] {
                t(n(&format!("attn_{x}.weight")), ty.kda_qkv, &[e, di]);
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
            t(n("attn_output.weight"), ty.attn_output.0, &[di, e]);
        } else {
            t(n("attn_q_a.weight"), ty.mla_a_b.0, &[e, q_lora]);
            t(n("attn_q_a_norm.weight"), F32, &[q_lora]);
            t(n("attn_q_b.weight"), ty.mla_a_b.1, &[q_lora, heads * dk]);
            t(n("attn_kv_a_mqa.weight"), ty.mla_a_b.2, &[e, kv_lora]);
            t(n("attn_kv_a_norm.weight"), F32, &[kv_lora]);
            t(n("attn_k_b.weight"), ty.mla_kv_b, &[dk, kv_lora, heads]);
            t(n("attn_v_b.weight"), ty.mla_kv_b, &[kv_lora, dv, heads]);
            t(n("attn_output.weight"), ty.attn_output.1, &[heads * dv, e]);
            t(
                n("indexer.attn_q_b.weight"),
                ty.indexer.0,
                &[q_lora, idx_heads * idx_dim],
            );
            t(n("indexer.attn_k.weight"), ty.indexer.1, &[e, idx_dim]);
            t(n("indexer.k_norm.weight"), F32, &[idx_dim]);
            t(n("indexer.k_norm.bias"), F32, &[idx_dim]);
            t(n("indexer.proj.weight"), F32, &[e, idx_heads]);
            t(n("indexer_compressor_gate.weight"), F32, &[e, idx_dim]);
            t(n("indexer_compressor_ape.weight"), F32, &[idx_dim, kpool]);
        }
        let widths = GlmFfnWidths {
            e,
            n_ff,
            n_ff_exp,
            n_expert,
        };
        for f in glm_ffn_tensors(l, widths, l > 0, &ty.ffn) {
            t(f.name, f.ggml_type, &f.dims);
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
