//! Dequantization against gguf-py: the vectors in `tests/data/dequant/`
//! (written by `tools/dequant_vectors.py` with `gguf.quants.dequantize`,
//! gguf 0.19.0) must come out bit for bit, for every supported type.

use std::path::PathBuf;

use family_ops::{OpsError, SUPPORTED, dequantize, dequantize_row, matvec};
use seam::gguf::GgmlType;
use serde_json::Value;

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/dequant")
}

struct Vector {
    ty: GgmlType,
    input: Vec<u8>,
    expected: Vec<f32>,
}

fn vectors() -> Vec<Vector> {
    let index = std::fs::read_to_string(data_dir().join("index.json")).expect("index.json");
    let index: Value = serde_json::from_str(&index).unwrap();
    let mut out = Vec::new();
    for entry in index["types"].as_array().unwrap() {
        let name = entry["type"].as_str().unwrap();
        let ty = GgmlType::from_name(name).unwrap_or_else(|| panic!("unknown type {name}"));
        let field = |k: &str| entry[k].as_u64().unwrap();
        assert_eq!(field("id"), ty.id() as u64, "{name}");
        assert_eq!(field("block_size"), ty.block_size(), "{name}");
        assert_eq!(field("type_size"), ty.type_size(), "{name}");
        let data = std::fs::read(data_dir().join(format!("{name}.bin"))).unwrap();
        let input_bytes = field("input_bytes") as usize;
        let n_values = field("n_values") as usize;
        assert_eq!(
            input_bytes as u64,
            field("n_blocks") * ty.type_size(),
            "{name}"
        );
        assert_eq!(
            n_values as u64,
            field("n_blocks") * ty.block_size(),
            "{name}"
        );
        assert_eq!(data.len(), input_bytes + 4 * n_values, "{name}");
        let (input, values) = data.split_at(input_bytes);
        let expected = values
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        out.push(Vector {
            ty,
            input: input.to_vec(),
            expected,
        });
    }
    out
}

/// Every supported type has vectors, and every vector's type is supported.
#[test]
fn vectors_cover_every_supported_type() {
    let have: Vec<GgmlType> = vectors().iter().map(|v| v.ty).collect();
    for ty in SUPPORTED {
        assert!(have.contains(ty), "no vectors for {ty}");
    }
    for ty in &have {
        assert!(SUPPORTED.contains(ty), "vectors for unsupported {ty}");
    }
}

/// Bit-exact agreement with gguf-py (NaN never occurs: the generator
/// redraws blocks until the oracle's values are finite). -0.0 and +0.0 are
/// told apart.
#[test]
fn bit_exact_against_gguf_py() {
    let mut failures = Vec::new();
    for v in vectors() {
        let mut got = vec![f32::NAN; v.expected.len()];
        dequantize(v.ty, &v.input, &mut got).unwrap();
        let bad: Vec<usize> = (0..got.len())
            .filter(|&i| got[i].to_bits() != v.expected[i].to_bits())
            .collect();
        if let Some(&i) = bad.first() {
            failures.push(format!(
                "{}: {} of {} values differ; first at {i} (block {}): got {} want {}",
                v.ty,
                bad.len(),
                got.len(),
                i as u64 / v.ty.block_size(),
                got[i],
                v.expected[i]
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Rows of a matrix decode the same as the whole buffer, and a matvec
/// over the vectors (as a matrix of rows of one or more blocks) is the
/// f64 dot of the expected values.
#[test]
fn rows_and_matvec_agree_with_the_vectors() {
    for v in vectors() {
        let bs = v.ty.block_size() as usize;
        let ts = v.ty.type_size() as usize;
        let n_blocks = v.input.len() / ts;
        // The largest row of whole blocks that divides the data, up to 4.
        let per_row = (1..=4).rev().find(|&b| n_blocks.is_multiple_of(b)).unwrap();
        let (ne0, rows) = (per_row * bs, n_blocks / per_row);
        let mut row = vec![0f32; ne0];
        for r in 0..rows {
            dequantize_row(v.ty, &v.input, ne0, r, &mut row).unwrap();
            assert_eq!(row, v.expected[r * ne0..(r + 1) * ne0], "{} row {r}", v.ty);
        }
        let x: Vec<f32> = (0..ne0).map(|i| ((i * 7) % 5) as f32 - 2.0).collect();
        let mut out = vec![0f32; rows];
        matvec(v.ty, &v.input, ne0, rows, &x, &mut out).unwrap();
        for (r, &o) in out.iter().enumerate() {
            let want: f64 = v.expected[r * ne0..(r + 1) * ne0]
                .iter()
                .zip(&x)
                .map(|(&w, &x)| f64::from(w) * f64::from(x))
                .sum();
            assert_eq!(o, want as f32, "{} row {r}", v.ty);
        }
    }
}

#[test]
fn unsupported_types_are_a_typed_error() {
    for ty in [
        GgmlType::Q8_1,
        GgmlType::Q8_K,
        GgmlType::I32,
        GgmlType::F64,
        GgmlType::Q1_0,
    ] {
        let bytes = vec![0u8; ty.type_size() as usize];
        let mut out = vec![0f32; ty.block_size() as usize];
        assert_eq!(
            dequantize(ty, &bytes, &mut out),
            Err(OpsError::Unsupported(ty))
        );
    }
}
