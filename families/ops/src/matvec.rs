//! A quantized weight times an `f32` vector.

use seam::gguf::GgmlType;

use crate::dequant::{dequantize, is_supported, row_bytes};
use crate::{OpsError, check_len, dot_f64};

/// `out[r] = Σ_i W[r][i] · x[i]` for a weight of `rows` rows of `ne0`
/// elements of `ty` (GGUF dims `[ne0, rows]`, or `[ne0, ne1, ne2, ...]`
/// with `rows = ne1 · ne2 · ...`; one expert of a 3-D stack is its own
/// contiguous range of rows), in the row-major bytes `weight`.
///
/// Each row is dequantized into one scratch row of `ne0` values, then
/// dotted with `x` in `f64` and rounded once to `f32`; the whole matrix is
/// never dequantized at once. Every length is checked before anything is
/// written.
pub fn matvec(
    ty: GgmlType,
    weight: &[u8],
    ne0: usize,
    rows: usize,
    x: &[f32],
    out: &mut [f32],
) -> Result<(), OpsError> {
    for_each_row(ty, weight, ne0, rows, x.len(), out, |row, o| {
        *o = dot_f64(row, x) as f32;
    })
}

/// [`matvec`] for `f64` activations: `out[r] = Σ_i W[r][i] · x[i]` with
/// each row dequantized to `f32` (one scratch row at a time), widened
/// exactly and accumulated in `f64` in index order, so it equals the dot of
/// the dequantized matrix with `x` in `f64` (the numpy float64 reference's
/// numbers). The matrix is never dequantized whole.
pub fn matvec_f64(
    ty: GgmlType,
    weight: &[u8],
    ne0: usize,
    rows: usize,
    x: &[f64],
    out: &mut [f64],
) -> Result<(), OpsError> {
    for_each_row(ty, weight, ne0, rows, x.len(), out, |row, o| {
        *o = row.iter().zip(x).map(|(&w, &v)| f64::from(w) * v).sum();
    })
}

/// The one row loop of both products: checks the type and every length
/// (`rows` rows of `ne0` elements in `weight`, `x` of `ne0`, `out` of
/// `rows`) before anything is written, then dequantizes one
/// row at a time into a single scratch row and hands it to `each` with its
/// output slot.
fn for_each_row<T: Default + Copy>(
    ty: GgmlType,
    weight: &[u8],
    ne0: usize,
    rows: usize,
    x_len: usize,
    out: &mut [T],
    mut each: impl FnMut(&[f32], &mut T),
) -> Result<(), OpsError> {
    if !is_supported(ty) {
        return Err(OpsError::Unsupported(ty));
    }
    let rb = row_bytes(ty, ne0)?;
    let total = rb
        .checked_mul(rows)
        .ok_or_else(|| OpsError::Invalid(format!("{rows} rows of {rb} bytes overflow")))?;
    check_len("matvec weight bytes", total, weight.len())?;
    check_len("matvec x", ne0, x_len)?;
    check_len("matvec out", rows, out.len())?;
    if rb == 0 {
        out.fill(T::default());
        return Ok(());
    }
    let mut row = vec![0f32; ne0];
    for (bytes, o) in weight.chunks_exact(rb).zip(out.iter_mut()) {
        dequantize(ty, bytes, &mut row)?;
        each(&row, o);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::*;

    /// Q8_0 rows of 64 (2 blocks): block b of row r has scale s(r, b) and
    /// codes c(r, b, j).
    fn q8_matrix(rows: usize) -> (Vec<u8>, Vec<Vec<f64>>) {
        let mut bytes = Vec::new();
        let mut dense = Vec::new();
        for r in 0..rows {
            let mut row = Vec::new();
            for b in 0..2 {
                let scale = f16::from_f32(0.25 * (r + 1) as f32 - 0.5 * b as f32);
                bytes.extend(scale.to_le_bytes());
                for j in 0..32 {
                    let q = ((r * 37 + b * 11 + j * 5) % 255) as i32 - 127;
                    bytes.push(q as i8 as u8);
                    row.push(f64::from(scale.to_f32()) * f64::from(q));
                }
            }
            dense.push(row);
        }
        (bytes, dense)
    }

    #[test]
    fn q8_0_matvec_matches_dense_f64() {
        let rows = 5;
        let (bytes, dense) = q8_matrix(rows);
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 7) % 13) as f32 * 0.125 - 0.7)
            .collect();
        let mut out = vec![0f32; rows];
        matvec(GgmlType::Q8_0, &bytes, 64, rows, &x, &mut out).unwrap();
        for (r, row) in dense.iter().enumerate() {
            let want: f64 = row.iter().zip(&x).map(|(&w, &x)| w * f64::from(x)).sum();
            assert_eq!(out[r], want as f32, "row {r}");
        }
    }

    #[test]
    fn f32_identity() {
        let n = 4;
        let mut bytes = Vec::new();
        for r in 0..n {
            for c in 0..n {
                bytes.extend(if r == c { 1f32 } else { 0f32 }.to_le_bytes());
            }
        }
        let x = [1.5, -2.0, 3.25, 0.0];
        let mut out = [9.0; 4];
        matvec(GgmlType::F32, &bytes, n, n, &x, &mut out).unwrap();
        assert_eq!(out, x);
    }

    #[test]
    fn lengths_are_checked() {
        let (bytes, _) = q8_matrix(2);
        let x = vec![0f32; 64];
        let mut out = vec![0f32; 2];
        assert!(matches!(
            matvec(GgmlType::Q8_0, &bytes[1..], 64, 2, &x, &mut out),
            Err(OpsError::Length { .. })
        ));
        assert!(matches!(
            matvec(GgmlType::Q8_0, &bytes, 64, 2, &x[1..], &mut out),
            Err(OpsError::Length { .. })
        ));
        assert!(matches!(
            matvec(GgmlType::Q8_0, &bytes, 64, 2, &x, &mut out[1..]),
            Err(OpsError::Length { .. })
        ));
        assert!(matches!(
            matvec(GgmlType::Q8_0, &bytes, 48, 2, &x[..48], &mut out),
            Err(OpsError::RowNotWholeBlocks { .. })
        ));
        assert_eq!(
            matvec(GgmlType::Q8_K, &bytes, 64, 2, &x, &mut out),
            Err(OpsError::Unsupported(GgmlType::Q8_K))
        );
    }

    #[test]
    fn q8_0_matvec_f64_is_the_f64_dot_of_the_dequantized_rows() {
        let rows = 3;
        let (bytes, dense) = q8_matrix(rows);
        let x: Vec<f64> = (0..64).map(|i| (i as f64 * 0.37).sin()).collect();
        let mut out = vec![0f64; rows];
        matvec_f64(GgmlType::Q8_0, &bytes, 64, rows, &x, &mut out).unwrap();
        for (r, row) in dense.iter().enumerate() {
            let want: f64 = row.iter().zip(&x).map(|(&w, &x)| w * x).sum();
            assert_eq!(out[r], want, "row {r}");
        }
        assert!(matches!(
            matvec_f64(GgmlType::Q8_0, &bytes, 64, rows, &x[1..], &mut out),
            Err(OpsError::Length { .. })
        ));
    }
}
