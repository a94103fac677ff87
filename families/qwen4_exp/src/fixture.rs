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

use seam::gguf::{Array, GgmlType, GgufError, GgufWriter, Value};
use seam_tools::demo::fill_pseudo_random;

/// One tensor of a fixture.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FixtureTensor {
    /// Its name.
    pub name: String,
    /// Its type.
    pub ggml_type: GgmlType,
    /// Its dims (GGUF order).
    pub dims: Vec<u64>,
}

/// A fixture before it is written: metadata and tensor table, editable (the
/// tests make refused variants from it).
#[derive(Clone, Debug, PartialEq)]
pub struct FixtureSpec {
    /// Metadata pairs in file order.
    pub metadata: Vec<(String, Value)>,
    /// Tensors in file order.
    pub tensors: Vec<FixtureTensor>,
}

/// The fixture's expert count.
pub const N_EXPERT: u64 = 4;
/// The fixture's layers (block_count less the MTP block).
pub const N_LAYER: usize = 3;
/// The fixture's PLE table rows.
pub const PLE_ROWS: u64 = 80;

fn kv(name: &str, v: Value) -> (String, Value) {
    (format!("qwen4exp.{name}"), v)
}

impl FixtureSpec {
    /// The built-in tiny model.
    pub fn tiny() -> FixtureSpec {
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

        FixtureSpec { metadata, tensors }
    }

    /// The tensor named `name`.
    pub fn tensor_mut(&mut self, name: &str) -> Option<&mut FixtureTensor> {
        self.tensors.iter_mut().find(|t| t.name == name)
    }

    /// Removes the tensor `name`; whether it was there.
    pub fn remove_tensor(&mut self, name: &str) -> bool {
        let before = self.tensors.len();
        self.tensors.retain(|t| t.name != name);
        self.tensors.len() != before
    }

    /// Adds a tensor at the end.
    pub fn add_tensor(&mut self, name: &str, ggml_type: GgmlType, dims: &[u64]) {
        self.tensors.push(FixtureTensor {
            name: name.to_owned(),
            ggml_type,
            dims: dims.to_vec(),
        });
    }

    /// Removes the metadata key `key` (full name); whether it was there.
    pub fn remove_key(&mut self, key: &str) -> bool {
        let before = self.metadata.len();
        self.metadata.retain(|(k, _)| k != key);
        self.metadata.len() != before
    }

    /// Sets (or adds) the metadata key `key` (full name).
    pub fn set_key(&mut self, key: &str, value: Value) {
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.metadata.push((key.to_owned(), value)),
        }
    }

    /// The writer for this fixture: deterministic bytes per tensor.
    ///
    /// # Panics
    ///
    /// A tensor's ne0 is not a whole number of its type's blocks (the
    /// tests' variants keep them whole).
    pub fn writer(&self) -> GgufWriter {
        let mut w = GgufWriter::new();
        for (k, v) in &self.metadata {
            w.add_metadata(k.clone(), v.clone());
        }
        for t in &self.tensors {
            let bytes = tensor_bytes(&t.name, t.ggml_type, &t.dims);
            w.add_tensor(t.name.clone(), t.ggml_type, &t.dims, bytes)
                .expect("fixture tensors have whole blocks");
        }
        w
    }
}

/// The built-in fixture's writer.
pub fn fixture() -> GgufWriter {
    FixtureSpec::tiny().writer()
}

/// Writes the built-in fixture to `path`; returns its size.
///
/// # Errors
///
/// The file cannot be written.
pub fn write_fixture(path: &Path) -> Result<u64, GgufError> {
    fixture().write_file(path)
}

fn name_seed(name: &str) -> u64 {
    // FNV-1a.
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// f16 bits of 0.01.
const SCALE_F16: [u8; 2] = 0x211F_u16.to_le_bytes();

fn f32_to_f16_bits(x: f32) -> u16 {
    // Values here are small and normal in f16, or zero.
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32 - 127 + 15;
    if !(1..31).contains(&exp) {
        return sign;
    }
    let mant = ((bits >> 13) & 0x3ff) as u16;
    sign | ((exp as u16) << 10) | mant
}

/// The deterministic bytes of fixture tensor `name`.
fn tensor_bytes(name: &str, ty: GgmlType, dims: &[u64]) -> Vec<u8> {
    let n_elems: u64 = dims.iter().product();
    let n_bytes = ty.row_bytes(dims[0]).expect("whole blocks") * (n_elems / dims[0]);
    let seed = name_seed(name);
    let mut raw = vec![0u8; n_bytes as usize];
    fill_pseudo_random(seed, 0, &mut raw);
    let float_values = || {
        let mut words = vec![0u8; n_elems as usize * 4];
        fill_pseudo_random(seed, 0, &mut words);
        words
            .chunks_exact(4)
            .map(|c| {
                // In [-1, 1).
                let u = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                let x = (u >> 8) as f32 / (1u32 << 23) as f32 - 1.0;
                if name.ends_with("ssm_a") {
                    -(0.5 + 0.5 * x.abs())
                } else if name.contains("norm") {
                    1.0 + 0.1 * x
                } else {
                    0.1 * x
                }
            })
            .collect::<Vec<f32>>()
    };
    match ty {
        GgmlType::F32 => float_values()
            .into_iter()
            .flat_map(f32::to_le_bytes)
            .collect(),
        GgmlType::F16 => float_values()
            .into_iter()
            .flat_map(|x| f32_to_f16_bits(x).to_le_bytes())
            .collect(),
        GgmlType::BF16 => float_values()
            .into_iter()
            .flat_map(|x| ((x.to_bits() >> 16) as u16).to_le_bytes())
            .collect(),
        _ => {
            // The f16 scales of each block: (offset, count).
            let scales: &[usize] = match ty {
                GgmlType::Q4_K => &[0, 2],
                GgmlType::Q6_K => &[208],
                _ => &[0],
            };
            for block in raw.chunks_exact_mut(ty.type_size() as usize) {
                for &at in scales {
                    block[at..at + 2].copy_from_slice(&SCALE_F16);
                }
            }
            raw
        }
    }
}
