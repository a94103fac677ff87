//! The built-in tiny fixture: a deterministic qwen4exp file (under 1 MiB)
//! written in code with `seam::gguf::GgufWriter`.
//!
//! Shape: E = 256, 4 blocks of which the last is an MTP block
//! (`nextn_predict_layers` = 1, dropped by name), so 3 layers: 0 and 1
//! gated DeltaNet (`full_attention_interval` = 3), 2 full attention with
//! the QSA indexer. hc = 4 streams, low rank 4. 4 experts (2 used),
//! n_ff_exp = n_ff_shexp = 32. PLE on layer 0: 3-grams, 2 heads per gram
//! (4 heads of 64), a table of 80 rows. Mixed types: Q8_0, Q4_K, Q6_K,
//! IQ4_NL, IQ2_XXS, BF16, F16, F32. One unused attention bias on layer 2
//! (dropped by name).
//!
//! Values: float tensors hold small finite numbers (norm gammas near 1,
//! `ssm_a` negative); quantized blocks hold pseudo-random quants with their
//! f16 scales set to 0.01, so every tensor dequantizes to finite numbers.

use std::path::Path;

pub use family_kit::fixture::{BlockScales, FixtureSpec, FixtureTensor};
use seam::gguf::{Array, GgmlType, GgufError, GgufWriter, Value};

/// The fixture's expert count.
pub const N_EXPERT: u64 = 4;
/// The fixture's layers (block_count less the MTP block).
pub const N_LAYER: usize = 3;
/// The fixture's PLE table rows.
pub const PLE_ROWS: u64 = 80;

fn kv(name: &str, v: Value) -> (String, Value) {
    (format!("qwen4exp.{name}"), v)
}

/// The shape of a generated model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// E.
    pub e: u64,
    /// The vocabulary.
    pub n_vocab: u64,
    /// Layers (every `interval`-th full attention).
    pub n_layer: u64,
    /// Experts.
    pub n_expert: u64,
    /// Experts used.
    pub n_expert_used: u64,
    /// Expert and shared-expert FFN width.
    pub n_ff: u64,
    /// GDN: state size, K heads, V heads.
    pub ssm: (u64, u64, u64),
    /// Attention: heads, KV heads, head dim.
    pub attn: (u64, u64, u64),
}

impl Shape {
    /// The public checkpoint's hidden sizes (Qwen3-Next-80B-A3B's, which
    /// the qwen4exp converter keeps: E 2048, 512 experts of 512, 10 used,
    /// GDN 16 K and 32 V heads of 128, attention 16 heads over 2 of 256,
    /// a 248,320-token vocabulary) with `n_layer` layers.
    pub fn checkpoint(n_layer: u64) -> Shape {
        Shape {
            e: 2048,
            n_vocab: 248_320,
            n_layer,
            n_expert: 512,
            n_expert_used: 10,
            n_ff: 512,
            ssm: (128, 16, 32),
            attn: (16, 2, 256),
        }
    }
}

/// A model of `shape` with every type quantized (Q8_0 for the small
/// matrices, Q4_K for experts, Q6_K output), no PLE and no MTP block: a
/// qwen4exp-shaped model of gigabytes, written streamed
/// ([`FixtureSpec::streaming_writer`]), its blocks scaled to a trained
/// model's magnitude ([`BlockScales::FanIn`]).
pub fn generated(shape: &Shape) -> FixtureSpec {
    let mut spec = tiny();
    spec.block_scales = BlockScales::FanIn { gain: 1 };
    let sh = *shape;
    let (e, hc) = (sh.e, 4u64);
    let lr = 4u64;
    let hc_dim = hc * e;
    let (s, hk, hv) = sh.ssm;
    let (key_dim, value_dim) = (s * hk, s * hv);
    let conv_dim = 2 * key_dim + value_dim;
    let (n_head, n_head_kv, hd) = sh.attn;
    let (idx_h, idx_d) = (4u64, 128u64);
    let n_exp = sh.n_expert;
    for (k, v) in [
        ("embedding_length", Value::U32(e as u32)),
        // The public checkpoint's, so a 512-token prompt is within it.
        ("context_length", Value::U32(262_144)),
        ("block_count", Value::U32(sh.n_layer as u32)),
        ("nextn_predict_layers", Value::U32(0)),
        ("expert_count", Value::U32(n_exp as u32)),
        ("expert_used_count", Value::U32(sh.n_expert_used as u32)),
        ("expert_feed_forward_length", Value::U32(sh.n_ff as u32)),
        (
            "expert_shared_feed_forward_length",
            Value::U32(sh.n_ff as u32),
        ),
        ("attention.head_count", Value::U32(n_head as u32)),
        ("attention.head_count_kv", Value::U32(n_head_kv as u32)),
        ("attention.key_length", Value::U32(hd as u32)),
        ("attention.value_length", Value::U32(hd as u32)),
        ("rope.dimension_count", Value::U32(64)),
        ("ssm.inner_size", Value::U32(value_dim as u32)),
        ("ssm.state_size", Value::U32(s as u32)),
        ("ssm.time_step_rank", Value::U32(hv as u32)),
        ("ssm.group_count", Value::U32(hk as u32)),
        ("full_attention_interval", Value::U32(2)),
        ("attention.indexer.head_count", Value::U32(idx_h as u32)),
        ("attention.indexer.key_length", Value::U32(idx_d as u32)),
        (
            "attention.compress_ratios",
            Value::Array(Array::U32(vec![0; sh.n_layer as usize])),
        ),
    ] {
        spec.set_key(&format!("qwen4exp.{k}"), v);
    }
    for k in [
        "ple.layers",
        "ple.ngram_size",
        "ple.heads_per_ngram",
        "ple.conv_kernel",
        "ple.eos_token_id",
        "embedding_length_per_layer_input",
        "ple.layer_multipliers",
        "ple.head_offsets",
        "ple.head_vocab_sizes",
    ] {
        spec.remove_key(&format!("qwen4exp.{k}"));
    }
    spec.remove_key("tokenizer.ggml.tokens");
    spec.remove_key("tokenizer.ggml.token_type");
    spec.remove_key("tokenizer.ggml.scores");
    spec.set_key("qwen4exp.vocab_size", Value::U32(sh.n_vocab as u32));
    use GgmlType::{F32, Q4_K, Q6_K, Q8_0};
    spec.tensors.clear();
    let mut t = |name: String, ty: GgmlType, dims: &[u64]| spec.add_tensor(&name, ty, dims);
    t("token_embd.weight".into(), Q8_0, &[e, sh.n_vocab]);
    t("output.weight".into(), Q6_K, &[e, sh.n_vocab]);
    t("output_hc_norm.weight".into(), F32, &[e, hc]);
    t("output_hc_down.weight".into(), Q8_0, &[hc_dim, lr]);
    t("output_hc_up.weight".into(), F32, &[lr, hc_dim]);
    for l in 0..sh.n_layer {
        let b = |suffix: &str| format!("blk.{l}.{suffix}");
        for p in ["hc_attn", "hc_ffn"] {
            t(b(&format!("{p}_norm.weight")), F32, &[e, hc]);
            t(b(&format!("{p}_down.weight")), Q8_0, &[hc_dim, lr]);
            t(b(&format!("{p}_up.weight")), F32, &[lr, hc_dim]);
            t(b(&format!("{p}_inject.weight")), Q8_0, &[hc_dim, hc]);
        }
        if (l + 1) % 2 != 0 {
            t(b("attn_qkv.weight"), Q8_0, &[e, conv_dim]);
            t(b("attn_gate.weight"), Q8_0, &[e, value_dim]);
            t(b("ssm_conv1d.weight"), F32, &[4, conv_dim]);
            t(b("ssm_dt.bias"), F32, &[hv]);
            t(b("ssm_a"), F32, &[hv]);
            t(b("ssm_beta.weight"), Q8_0, &[e, hv]);
            t(b("ssm_alpha.weight"), Q8_0, &[e, hv]);
            t(b("ssm_norm.weight"), F32, &[s]);
            t(b("ssm_out.weight"), Q8_0, &[value_dim, e]);
        } else {
            t(b("attn_q.weight"), Q8_0, &[e, 2 * hd * n_head]);
            t(b("attn_k.weight"), Q8_0, &[e, hd * n_head_kv]);
            t(b("attn_v.weight"), Q8_0, &[e, hd * n_head_kv]);
            t(b("attn_output.weight"), Q8_0, &[hd * n_head, e]);
            t(b("attn_q_norm.weight"), F32, &[hd]);
            t(b("attn_k_norm.weight"), F32, &[hd]);
            t(b("indexer.q_proj.weight"), Q8_0, &[e, idx_h * idx_d]);
            t(b("indexer.k_proj.weight"), Q8_0, &[e, idx_d]);
            t(b("indexer.q_norm.weight"), F32, &[idx_d]);
            t(b("indexer.k_norm.weight"), F32, &[idx_d]);
        }
        t(b("ffn_gate_inp.weight"), F32, &[e, n_exp]);
        t(b("ffn_gate_exps.weight"), Q4_K, &[e, sh.n_ff, n_exp]);
        t(b("ffn_up_exps.weight"), Q4_K, &[e, sh.n_ff, n_exp]);
        t(b("ffn_down_exps.weight"), Q8_0, &[sh.n_ff, e, n_exp]);
        t(b("ffn_gate_inp_shexp.weight"), F32, &[e]);
        t(b("ffn_gate_shexp.weight"), Q8_0, &[e, sh.n_ff]);
        t(b("ffn_up_shexp.weight"), Q8_0, &[e, sh.n_ff]);
        t(b("ffn_down_shexp.weight"), Q8_0, &[sh.n_ff, e]);
    }
    spec
}

/// The built-in tiny model.
pub fn tiny() -> FixtureSpec {
    {
        use GgmlType::{BF16, F16, F32, IQ2_XXS, IQ4_NL, Q4_K, Q6_K, Q8_0};
        let (e, hc, lr) = (256u64, 4u64, 4u64);
        let hc_dim = hc * e;
        let (n_vocab, n_exp, ff, ff_sh) = (64u64, N_EXPERT, 32u64, 32u64);
        let (s, hk, hv, d_conv) = (32u64, 1u64, 2u64, 4u64);
        let (key_dim, value_dim) = (s * hk, s * hv);
        let conv_dim = 2 * key_dim + value_dim;
        let (n_head, n_head_kv, hd) = (2u64, 1u64, 32u64);
        let (idx_h, idx_d) = (2u64, 32u64);
        let ple_head_dim = 64u64;

        let metadata = vec![
            (
                "general.architecture".to_owned(),
                Value::String("qwen4exp".into()),
            ),
            (
                "general.name".to_owned(),
                Value::String("qwen4_exp built-in tiny fixture".into()),
            ),
            // A placeholder vocabulary in the shape llama.cpp's own test
            // models use, so the oracle can load the fixture.
            (
                "tokenizer.ggml.model".to_owned(),
                Value::String("test".into()),
            ),
            (
                "tokenizer.ggml.tokens".to_owned(),
                Value::Array(Array::String(
                    (0..n_vocab).map(|i| format!("<t{i}>")).collect(),
                )),
            ),
            (
                "tokenizer.ggml.token_type".to_owned(),
                Value::Array(Array::I32(vec![1; n_vocab as usize])),
            ),
            (
                "tokenizer.ggml.scores".to_owned(),
                Value::Array(Array::F32(vec![0.0; n_vocab as usize])),
            ),
            kv("context_length", Value::U32(256)),
            kv("embedding_length", Value::U32(e as u32)),
            kv("block_count", Value::U32(4)),
            kv("nextn_predict_layers", Value::U32(1)),
            kv("expert_count", Value::U32(n_exp as u32)),
            kv("expert_used_count", Value::U32(2)),
            kv("expert_feed_forward_length", Value::U32(ff as u32)),
            kv(
                "expert_shared_feed_forward_length",
                Value::U32(ff_sh as u32),
            ),
            kv("attention.head_count", Value::U32(n_head as u32)),
            kv("attention.head_count_kv", Value::U32(n_head_kv as u32)),
            kv("attention.key_length", Value::U32(hd as u32)),
            kv("attention.value_length", Value::U32(hd as u32)),
            kv("attention.layer_norm_rms_epsilon", Value::F32(1e-6)),
            kv("rope.dimension_count", Value::U32(16)),
            kv("rope.freq_base", Value::F32(10000.0)),
            kv(
                "rope.dimension_sections",
                Value::Array(Array::I32(vec![3, 3, 2, 0])),
            ),
            kv("ssm.conv_kernel", Value::U32(d_conv as u32)),
            kv("ssm.inner_size", Value::U32(value_dim as u32)),
            kv("ssm.state_size", Value::U32(s as u32)),
            kv("ssm.time_step_rank", Value::U32(hv as u32)),
            kv("ssm.group_count", Value::U32(hk as u32)),
            kv("full_attention_interval", Value::U32(3)),
            kv("hyper_connection.count", Value::U32(hc as u32)),
            kv("hyper_connection.low_rank", Value::U32(lr as u32)),
            kv("attention.indexer.head_count", Value::U32(idx_h as u32)),
            kv("attention.indexer.key_length", Value::U32(idx_d as u32)),
            kv("attention.indexer.top_k", Value::U32(8)),
            kv(
                "attention.compress_ratios",
                Value::Array(Array::U32(vec![0, 0, 4, 0])),
            ),
            kv("ple.layers", Value::Array(Array::U32(vec![0]))),
            kv("ple.ngram_size", Value::U32(3)),
            kv("ple.heads_per_ngram", Value::U32(2)),
            kv("ple.conv_kernel", Value::U32(4)),
            kv("ple.eos_token_id", Value::U32(0)),
            kv(
                "embedding_length_per_layer_input",
                Value::U32(ple_head_dim as u32),
            ),
            kv(
                "ple.layer_multipliers",
                Value::Array(Array::U64(vec![1, 3, 5])),
            ),
            kv(
                "ple.head_offsets",
                Value::Array(Array::U64(vec![0, 16, 32, 48])),
            ),
            kv(
                "ple.head_vocab_sizes",
                Value::Array(Array::U64(vec![16, 16, 16, 16])),
            ),
        ];

        let mut tensors = Vec::new();
        let mut t = |name: String, ggml_type: GgmlType, dims: &[u64]| {
            tensors.push(FixtureTensor {
                name,
                ggml_type,
                dims: dims.to_vec(),
            });
        };
        t("token_embd.weight".into(), Q8_0, &[e, n_vocab]);
        t("output.weight".into(), Q6_K, &[e, n_vocab]);
        t("output_hc_norm.weight".into(), F32, &[e, hc]);
        t("output_hc_down.weight".into(), Q8_0, &[hc_dim, lr]);
        t("output_hc_up.weight".into(), F16, &[lr, hc_dim]);
        t(
            "per_layer_token_embd.weight".into(),
            IQ4_NL,
            &[ple_head_dim, PLE_ROWS],
        );
        for l in 0..N_LAYER {
            let b = |suffix: &str| format!("blk.{l}.{suffix}");
            for p in ["hc_attn", "hc_ffn"] {
                t(b(&format!("{p}_norm.weight")), F32, &[e, hc]);
                t(b(&format!("{p}_down.weight")), Q8_0, &[hc_dim, lr]);
                t(b(&format!("{p}_up.weight")), F16, &[lr, hc_dim]);
                t(b(&format!("{p}_inject.weight")), Q8_0, &[hc_dim, hc]);
            }
            if l < 2 {
                t(b("attn_qkv.weight"), Q4_K, &[e, conv_dim]);
                t(b("attn_gate.weight"), IQ4_NL, &[e, value_dim]);
                t(b("ssm_conv1d.weight"), F32, &[d_conv, conv_dim]);
                t(b("ssm_dt.bias"), F32, &[hv]);
                t(b("ssm_a"), F32, &[hv]);
                t(b("ssm_beta.weight"), Q8_0, &[e, hv]);
                t(b("ssm_alpha.weight"), Q8_0, &[e, hv]);
                t(b("ssm_norm.weight"), F32, &[s]);
                t(b("ssm_out.weight"), Q8_0, &[value_dim, e]);
            } else {
                t(b("attn_q.weight"), Q4_K, &[e, 2 * hd * n_head]);
                t(b("attn_q.bias"), F32, &[2 * hd * n_head]);
                t(b("attn_k.weight"), Q8_0, &[e, hd * n_head_kv]);
                t(b("attn_v.weight"), Q8_0, &[e, hd * n_head_kv]);
                t(b("attn_output.weight"), Q8_0, &[hd * n_head, e]);
                t(b("attn_q_norm.weight"), F32, &[hd]);
                t(b("attn_k_norm.weight"), F32, &[hd]);
                t(b("indexer.q_proj.weight"), Q8_0, &[e, idx_h * idx_d]);
                t(b("indexer.k_proj.weight"), BF16, &[e, idx_d]);
                t(b("indexer.q_norm.weight"), F32, &[idx_d]);
                t(b("indexer.k_norm.weight"), F32, &[idx_d]);
            }
            if l == 0 {
                t(b("ple_key.weight"), IQ2_XXS, &[e, hc_dim]);
                t(b("ple_value.weight"), Q4_K, &[e, e]);
                t(b("ple_norm_key.weight"), F32, &[e, hc]);
                t(b("ple_norm_query.weight"), F32, &[e, hc]);
                t(b("ple_norm_conv.weight"), F16, &[e, hc]);
                t(b("ple_conv1d.weight"), F16, &[4, hc_dim]);
            }
            t(b("ffn_gate_inp.weight"), F32, &[e, n_exp]);
            let gate_type = if l == 1 { IQ2_XXS } else { Q4_K };
            t(b("ffn_gate_exps.weight"), gate_type, &[e, ff, n_exp]);
            t(b("ffn_up_exps.weight"), IQ4_NL, &[e, ff, n_exp]);
            t(b("ffn_down_exps.weight"), Q8_0, &[ff, e, n_exp]);
            t(b("ffn_gate_inp_shexp.weight"), F32, &[e]);
            t(b("ffn_gate_shexp.weight"), Q4_K, &[e, ff_sh]);
            t(b("ffn_up_shexp.weight"), IQ4_NL, &[e, ff_sh]);
            t(b("ffn_down_shexp.weight"), Q8_0, &[ff_sh, e]);
        }
        // The MTP block (dropped by name).
        t("blk.3.nextn.enorm.weight".into(), F32, &[e]);
        t("blk.3.nextn.hnorm.weight".into(), F32, &[e]);
        t("blk.3.ffn_gate_inp.weight".into(), F32, &[e, n_exp]);

        FixtureSpec {
            metadata,
            tensors,
            ..FixtureSpec::default()
        }
    }
}

/// The built-in fixture's writer.
pub fn fixture() -> GgufWriter {
    tiny().writer()
}

/// Writes the built-in fixture to `path`; returns its size.
///
/// # Errors
///
/// The file cannot be written.
pub fn write_fixture(path: &Path) -> Result<u64, GgufError> {
    fixture().write_file(path)
}
