//! The lightning indexer of DeepSeek-sparse attention as ggml's CPU backend
//! computes it: the Hadamard rotation of its queries and keys
//! (`ggml_compute_forward_fwht`, the `mul_mat` that llama.cpp marks
//! `GGML_HINT_SRC0_IS_HADAMARD`) and the fused score
//! (`ggml_compute_forward_lightning_indexer`).

use super::dot_f32;

/// The fast Walsh-Hadamard transform of each row of `n` (a power of two)
/// in `x`, orthonormal: every value times `1 / sqrt(n)` first, then the
/// butterflies `(u + v, u - v)` at strides 1, 2, 4, ... (ggml's scalar
/// passes below 8 and its 8-lane passes above give the same sums).
///
/// # Errors
///
/// `n` is not a power of two or `x` is not whole rows of it.
pub fn fwht(x: &mut [f32], n: usize) -> Result<(), crate::OpsError> {
    if !n.is_power_of_two() || !x.len().is_multiple_of(n) {
        return Err(crate::OpsError::Invalid(format!(
            "fwht: {} values in rows of {n}",
            x.len()
        )));
    }
    let scale = 1.0 / (n as f32).sqrt();
    for row in x.chunks_exact_mut(n) {
        row.iter_mut().for_each(|v| *v *= scale);
        let mut len = 1;
        while len < n {
            for i in (0..n).step_by(2 * len) {
                for j in i..i + len {
                    let (u, v) = (row[j], row[j + len]);
                    row[j] = u + v;
                    row[j + len] = u - v;
                }
            }
            len *= 2;
        }
    }
    Ok(())
}

/// One key's score for one token (`ggml_compute_forward_lightning_indexer`):
/// `Σ_h max(q_h · k, 0) · w_h` over the heads in order, each `q_h · k` by
/// [`dot_f32`] (the key widened from the cache's type), each term added by
/// a fused multiply-add (GCC contracts `score += MAX(qk, 0) * w`), then the
/// mask value added (`0` or `-inf`, stored as F16).
///
/// `q` holds `w.len()` heads of `k.len()` values.
pub fn lightning_score(q: &[f32], k: &[f32], w: &[f32], mask: f32) -> f32 {
    let d = k.len();
    let mut score = 0f32;
    for (qh, &wh) in q.chunks_exact(d).zip(w) {
        score = dot_f32(qh, k).max(0.0).mul_add(wh, score);
    }
    score + mask
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::super::refs::{fnv, row};
    use super::*;

    #[test]
    fn fwht_is_ggmls_hadamard_mul_mat() {
        let mut x = row(256, 32, 2.0);
        fwht(&mut x, 128).unwrap();
        assert_eq!(x[0].to_bits(), 0xbeaf_9b62);
        assert_eq!(fnv(&x), 0x84b6_e848_18cc_1d23);
        // Orthonormal: twice is the identity, up to rounding.
        let x0 = row(256, 32, 2.0);
        fwht(&mut x, 128).unwrap();
        assert!(x.iter().zip(&x0).all(|(a, b)| (a - b).abs() < 1e-5));
        assert!(fwht(&mut x, 96).is_err());
        assert!(fwht(&mut x[..100], 64).is_err());
    }

    #[test]
    fn lightning_score_is_ggmls_fused_indexer() {
        let q = row(128, 33, 1.0);
        let k: Vec<f32> = row(320, 34, 1.0)
            .iter()
            .map(|&v| f16::from_f32(v).to_f32())
            .collect();
        let w = row(2, 35, 0.3);
        let got: Vec<f32> = k
            .chunks_exact(64)
            .enumerate()
            .map(|(j, kj)| {
                let mask = if j == 3 { f32::NEG_INFINITY } else { 0.0 };
                lightning_score(&q, kj, &w, mask)
            })
            .collect();
        assert_eq!(got[0].to_bits(), 0xbee3_ca64);
        assert_eq!(got[1], 0.0, "both heads' dots below zero");
        assert_eq!(got[3], f32::NEG_INFINITY);
        assert_eq!(fnv(&got), 0xd5a5_243d_8d71_d51e);
    }
}
