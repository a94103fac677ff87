//! The built-in demo model: a small, deterministic GGUF that the CLI writes
//! when no file is given, so the README's main command runs anywhere.

use crate::gguf::{GgmlType, GgufWriter, Value};

/// A deterministic pseudo-random byte stream (SplitMix64), so fixtures and
/// generated models are reproducible without a dependency.
pub fn fill_pseudo_random(seed: u64, offset: u64, buf: &mut [u8]) {
    let mut word_index = offset / 8;
    let mut skip = (offset % 8) as usize;
    let mut i = 0;
    while i < buf.len() {
        let mut z = seed
            .wrapping_add(word_index.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        for &b in &z.to_le_bytes()[skip..] {
            if i == buf.len() {
                break;
            }
            buf[i] = b;
            i += 1;
        }
        skip = 0;
        word_index += 1;
    }
}

/// Bytes of a tensor of `n` bytes generated from `seed`.
pub fn pseudo_random_bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    fill_pseudo_random(seed, 0, &mut v);
    v
}

/// The demo model: a two-layer toy with mixed ggml types (about 1 MiB).
pub fn demo_model() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", Value::String("seam-demo".into()))
        .add_metadata("general.name", Value::String("seam built-in demo".into()))
        .add_metadata("seam-demo.block_count", Value::U32(2))
        .add_metadata("seam-demo.embedding_length", Value::U32(256));
    let mut add = |name: &str, ty: GgmlType, dims: &[u64], seed: u64| {
        let n = ty.row_bytes(dims[0]).expect("whole blocks") * dims[1..].iter().product::<u64>();
        w.add_tensor(name, ty, dims, pseudo_random_bytes(seed, n as usize))
            .expect("demo tensors are valid");
    };
    add("token_embd.weight", GgmlType::Q8_0, &[256, 512], 1);
    for l in 0..2u64 {
        add(
            &format!("blk.{l}.attn_norm.weight"),
            GgmlType::F32,
            &[256],
            10 + l,
        );
        add(
            &format!("blk.{l}.attn_qkv.weight"),
            GgmlType::Q4_K,
            &[256, 768],
            20 + l,
        );
        add(
            &format!("blk.{l}.attn_output.weight"),
            GgmlType::Q6_K,
            &[256, 256],
            30 + l,
        );
        add(
            &format!("blk.{l}.ffn_up_exps.weight"),
            GgmlType::IQ4_NL,
            &[256, 512, 4],
            40 + l,
        );
        add(
            &format!("blk.{l}.ffn_down_exps.weight"),
            GgmlType::Q5_K,
            &[512, 256, 4],
            50 + l,
        );
    }
    add("output_norm.weight", GgmlType::F32, &[256], 60);
    add("output.weight", GgmlType::F16, &[256, 512], 61);
    w
}
