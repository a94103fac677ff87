//! The built-in tiny fixture: a glm-dsa file written in code with the kit's
//! deterministic tensor bytes, mixed ggml types (Q8_0, Q4_0, F16, BF16,
//! F32), under 2 MiB. The public checkpoint's quirks in small: four trunk
//! layers plus an MTP block (`blk.4`, `nextn.*` included), no
//! `attention.indexer.types` key with a 2^20 context (so the GLM-5.2 table:
//! layers 0-2 full, 3 shared), indexer tensors on every block, a leading
//! dense layer, four sigmoid-routed experts (top 2, `exp_probs_b`, norm,
//! scale 2.5) and a shared expert; indexer top_k 2, so a prompt of three
//! tokens already selects.
//!
//! [`generated`]: the same layout at the public checkpoint's sizes
//! (`tests/data/glm_moe_dsa/real_shape.json`) and its types, for the
//! benchmark (`--write-generated`).

use std::path::Path;

use family_kit::fixture::{BlockScales, GlmFfnTypes, GlmFfnWidths, glm_ffn_tensors};
use family_kit::{FixtureSpec, FixtureTensor};
use seam::gguf::{GgmlType, GgufError, Value};

use crate::hparams::ARCH;

/// The sizes of a fixture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// E.
    pub e: u64,
    /// Vocabulary.
    pub vocab: u64,
    /// Attention heads.
    pub heads: u64,
    /// q and kv LoRA ranks.
    pub lora: (u64, u64),
    /// RoPE dims of a key.
    pub rot: u64,
    /// MLA qk (with the RoPE part) and v head dims.
    pub dk_dv: (u64, u64),
    /// Indexer heads and head dim.
    pub idx: (u64, u64),
    /// Indexer top-k.
    pub idx_top_k: u64,
    /// Routed experts, and used per token.
    pub n_expert: (u64, u64),
    /// Expert (and shared-expert) FFN width.
    pub n_ff_exp: u64,
    /// Dense FFN width.
    pub n_ff: u64,
    /// Trunk layers.
    pub n_layer: u64,
    /// Leading dense layers.
    pub n_dense: u64,
    /// An MTP block after the trunk.
    pub mtp: bool,
}

impl Shape {
    /// The built-in tiny fixture's.
    pub fn tiny() -> Shape {
        Shape {
            e: 64,
            vocab: 64,
            heads: 2,
            lora: (64, 64),
            rot: 16,
            dk_dv: (48, 32),
            idx: (2, 64),
            idx_top_k: 2,
            n_expert: (4, 2),
            n_ff_exp: 32,
            n_ff: 64,
            n_layer: 4,
            n_dense: 1,
            mtp: true,
        }
    }

    /// The public checkpoint's sizes (GLM-5.3: E 6144, 64 heads, q/kv
    /// LoRA 2048/512, 256 experts of 2048 with 8 used, 3 leading dense
    /// layers of 12288, indexer 32 heads of 128 with top-k 2048, a
    /// 154,880-token vocabulary) with `n_layer` trunk layers (at most 3
    /// of them dense) and no MTP block.
    pub fn checkpoint(n_layer: u64) -> Shape {
        Shape {
            e: 6144,
            vocab: 154_880,
            heads: 64,
            lora: (2048, 512),
            rot: 64,
            dk_dv: (256, 256),
            idx: (32, 128),
            idx_top_k: 2048,
            n_expert: (256, 8),
            n_ff_exp: 2048,
            n_ff: 12288,
            n_layer,
            n_dense: n_layer.min(3),
            mtp: false,
        }
    }
}

/// The ggml types a fixture's tensors take, by role.
struct Types {
    embd: GgmlType,
    output: GgmlType,
    /// `attn_q_a`, `attn_kv_a_mqa`.
    attn_a: GgmlType,
    attn_q_b: GgmlType,
    attn_kv_b: (GgmlType, GgmlType),
    attn_output: GgmlType,
    /// `indexer.attn_q_b`, `indexer.attn_k`.
    indexer: (GgmlType, GgmlType),
    ffn: GlmFfnTypes,
    nextn_eh: GgmlType,
}

impl Types {
    /// The tiny fixture's mix.
    fn tiny() -> Types {
        use GgmlType::{BF16, F16, Q4_0, Q8_0};
        Types {
            embd: Q8_0,
            output: F16,
            attn_a: Q8_0,
            attn_q_b: F16,
            attn_kv_b: (F16, Q8_0),
            attn_output: Q4_0,
            indexer: (F16, BF16),
            ffn: GlmFfnTypes {
                dense: (Q8_0, F16),
                experts: (Q8_0, Q4_0, Q8_0),
                shexp: F16,
            },
            nextn_eh: F16,
        }
    }

    /// The types `real_shape.json` assumes of the public file.
    fn public() -> Types {
        use GgmlType::{IQ2_S, IQ2_XXS, Q4_K, Q6_K, Q8_0};
        Types {
            embd: Q4_K,
            output: Q6_K,
            attn_a: Q4_K,
            attn_q_b: Q4_K,
            attn_kv_b: (Q8_0, Q8_0),
            attn_output: Q4_K,
            indexer: (Q8_0, Q8_0),
            ffn: GlmFfnTypes {
                dense: (Q4_K, Q4_K),
                experts: (IQ2_XXS, IQ2_XXS, IQ2_S),
                shexp: Q4_K,
            },
            nextn_eh: Q8_0,
        }
    }
}

fn kv(name: &str, v: Value) -> (String, Value) {
    (format!("{ARCH}.{name}"), v)
}

/// The built-in fixture's metadata and tensor table.
pub fn fixture() -> FixtureSpec {
    fixture_of(&Shape::tiny(), &Types::tiny())
}

/// A model of `shape` with the public file's types, its blocks scaled to
/// a trained model's magnitude ([`BlockScales::FanIn`]): gigabytes at
/// [`Shape::checkpoint`], written streamed
/// ([`FixtureSpec::streaming_writer`]).
pub fn generated(shape: &Shape) -> FixtureSpec {
    let mut spec = fixture_of(shape, &Types::public());
    spec.block_scales = BlockScales::FanIn { gain: 1 };
    spec
}

fn fixture_of(sh: &Shape, ty: &Types) -> FixtureSpec {
    use GgmlType::F32;
    let u = |v: u64| Value::U32(v as u32);
    let &Shape {
        e,
        vocab,
        heads,
        lora: (q_lora, kv_lora),
        rot,
        dk_dv: (dk, dv),
        idx,
        n_ff_exp,
        n_ff,
        ..
    } = sh;
    let (n_expert, n_used) = sh.n_expert;
    let mtp = u64::from(sh.mtp);
    let metadata = vec![
        (
            "general.architecture".to_owned(),
            Value::String(ARCH.into()),
        ),
        kv("block_count", u(sh.n_layer + mtp)),
        kv("nextn_predict_layers", u(mtp)),
        kv("context_length", u(1 << 20)),
        kv("embedding_length", u(e)),
        kv("feed_forward_length", u(n_ff)),
        kv("expert_feed_forward_length", u(n_ff_exp)),
        kv("expert_count", u(n_expert)),
        kv("expert_used_count", u(n_used)),
        kv("expert_shared_count", u(1)),
        kv("leading_dense_block_count", u(sh.n_dense)),
        kv("expert_weights_scale", Value::F32(2.5)),
        kv("expert_weights_norm", Value::Bool(true)),
        kv("expert_gating_func", u(2)),
        kv("attention.head_count", u(heads)),
        kv("attention.head_count_kv", u(1)),
        kv("attention.key_length", u(kv_lora + rot)),
        kv("attention.value_length", u(kv_lora)),
        kv("attention.key_length_mla", u(dk)),
        kv("attention.value_length_mla", u(dv)),
        kv("attention.q_lora_rank", u(q_lora)),
        kv("attention.kv_lora_rank", u(kv_lora)),
        kv("attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        kv("rope.dimension_count", u(rot)),
        kv("rope.freq_base", Value::F32(10000.0)),
        kv("attention.indexer.head_count", u(idx.0)),
        kv("attention.indexer.key_length", u(idx.1)),
        kv("attention.indexer.top_k", u(sh.idx_top_k)),
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
    let last = sh.n_layer + mtp;
    for l in 0..last {
        let n = |s: &str| format!("blk.{l}.{s}");
        t(n("attn_norm.weight"), F32, &[e]);
        t(n("attn_q_a.weight"), ty.attn_a, &[e, q_lora]);
        t(n("attn_q_a_norm.weight"), F32, &[q_lora]);
        t(n("attn_q_b.weight"), ty.attn_q_b, &[q_lora, heads * dk]);
        t(n("attn_kv_a_mqa.weight"), ty.attn_a, &[e, kv_lora + rot]);
        t(n("attn_kv_a_norm.weight"), F32, &[kv_lora]);
        t(
            n("attn_k_b.weight"),
            ty.attn_kv_b.0,
            &[dk - rot, kv_lora, heads],
        );
        t(n("attn_v_b.weight"), ty.attn_kv_b.1, &[kv_lora, dv, heads]);
        t(n("attn_output.weight"), ty.attn_output, &[heads * dv, e]);
        t(n("ffn_norm.weight"), F32, &[e]);
        t(
            n("indexer.attn_q_b.weight"),
            ty.indexer.0,
            &[q_lora, idx.0 * idx.1],
        );
        t(n("indexer.attn_k.weight"), ty.indexer.1, &[e, idx.1]);
        t(n("indexer.k_norm.weight"), F32, &[idx.1]);
        t(n("indexer.k_norm.bias"), F32, &[idx.1]);
        t(n("indexer.proj.weight"), F32, &[e, idx.0]);
        let widths = GlmFfnWidths {
            e,
            n_ff,
            n_ff_exp,
            n_expert,
        };
        for f in glm_ffn_tensors(l, widths, l >= sh.n_dense, &ty.ffn) {
            t(f.name, f.ggml_type, &f.dims);
        }
        if sh.mtp && l == sh.n_layer {
            t(n("nextn.eh_proj.weight"), ty.nextn_eh, &[2 * e, e]);
            t(n("nextn.enorm.weight"), F32, &[e]);
            t(n("nextn.hnorm.weight"), F32, &[e]);
            t(n("nextn.shared_head_norm.weight"), F32, &[e]);
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
