//! The built-in tiny draft, written in code with `seam::gguf::GgufWriter`,
//! matching the qwen4_exp built-in target fixture (n_embd 256, vocabulary
//! 64, 3 layers): 2 draft layers, 2 heads of 32 over 1 K/V head, SwiGLU
//! of 64, block size 4, taps on target layers 0 and 2 (stored 1 and 3),
//! mask token 63. All tensors F32 with small pseudo-random values (norm
//! gammas near 1). No `token_embd` and no `output`.

use std::path::Path;

use seam::gguf::{Array, GgmlType, GgufError, GgufWriter, Value};
use seam_tools::demo::fill_pseudo_random;

use crate::model::{ARCH, Hparams};

/// A draft fixture before it is written; the tests make refused variants.
#[derive(Clone, Debug, PartialEq)]
pub struct DraftSpec {
    /// The hyperparameters written.
    pub hparams: Hparams,
    /// One tap's width (the target's n_embd), which sizes `fc`.
    pub target_n_embd: usize,
    /// Extra tensors (name, dims), F32: e.g. a `token_embd.weight` the
    /// draft must not hold.
    pub extra: Vec<(String, Vec<u64>)>,
    /// Overrides `fc.weight`'s input width.
    pub fc_width: Option<u64>,
}

impl DraftSpec {
    /// The built-in tiny draft.
    pub fn tiny() -> DraftSpec {
        DraftSpec {
            hparams: Hparams {
                n_embd: 256,
                n_layer: 2,
                n_head: 2,
                n_head_kv: 1,
                head_dim: 32,
                n_ff: 64,
                block_size: 4,
                target_layers: vec![0, 2],
                mask_token: 63,
                eps: 1e-6,
                rope_base: 10000.0,
            },
            target_n_embd: 256,
            extra: Vec::new(),
            fc_width: None,
        }
    }

    /// The writer: deterministic bytes per tensor.
    pub fn writer(&self) -> GgufWriter {
        let hp = &self.hparams;
        let mut w = GgufWriter::new();
        let key = |k: &str| format!("{ARCH}.{k}");
        w.add_metadata("general.architecture", Value::String(ARCH.into()));
        w.add_metadata(
            "general.name",
            Value::String("dflash built-in tiny draft".into()),
        );
        for (k, v) in [
            ("embedding_length", hp.n_embd),
            ("block_count", hp.n_layer),
            ("attention.head_count", hp.n_head),
            ("attention.head_count_kv", hp.n_head_kv),
            ("attention.key_length", hp.head_dim),
            ("attention.value_length", hp.head_dim),
            ("feed_forward_length", hp.n_ff),
            ("block_size", hp.block_size),
        ] {
            w.add_metadata(key(k), Value::U32(v as u32));
        }
        w.add_metadata(
            key("attention.layer_norm_rms_epsilon"),
            Value::F32(hp.eps as f32),
        );
        w.add_metadata(key("rope.freq_base"), Value::F32(hp.rope_base as f32));
        // Stored +1.
        w.add_metadata(
            key("target_layers"),
            Value::Array(Array::I32(
                hp.target_layers.iter().map(|&l| l as i32 + 1).collect(),
            )),
        );
        w.add_metadata("tokenizer.ggml.mask_token_id", Value::U32(hp.mask_token));
        let mut tensors = hp.tensors(self.target_n_embd);
        if let Some(width) = self.fc_width {
            tensors[0].1[0] = width;
        }
        tensors.extend(self.extra.iter().cloned());
        for (name, dims) in tensors {
            let bytes = f32_bytes(&name, &dims);
            w.add_tensor(name, GgmlType::F32, &dims, bytes)
                .expect("F32 tensors have whole blocks");
        }
        w
    }
}

/// The built-in draft's writer.
pub fn fixture() -> GgufWriter {
    DraftSpec::tiny().writer()
}

/// Writes the built-in draft to `path`; returns its size.
///
/// # Errors
///
/// The file cannot be written.
pub fn write_fixture(path: &Path) -> Result<u64, GgufError> {
    fixture().write_file(path)
}

fn f32_bytes(name: &str, dims: &[u64]) -> Vec<u8> {
    let n: u64 = dims.iter().product();
    // FNV-1a of the name.
    let seed = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let mut words = vec![0u8; n as usize * 4];
    fill_pseudo_random(seed, 0, &mut words);
    words
        .chunks_exact(4)
        .flat_map(|c| {
            let u = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            let x = (u >> 8) as f32 / (1u32 << 23) as f32 - 1.0;
            let v = if name.contains("norm") {
                1.0 + 0.1 * x
            } else {
                0.1 * x
            };
            v.to_le_bytes()
        })
        .collect()
}
