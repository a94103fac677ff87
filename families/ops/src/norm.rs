//! RMSNorm.

use crate::{OpsError, check_len};

/// The weight an RMSNorm multiplies by, and how.
///
/// Families differ in what the file stores: some store the gain itself
/// (often already folded as `1 + w` by the converter), some store the raw
/// `w` of a model whose forward multiplies by `1 + w`. A shape check cannot
/// tell them apart; pick the variant the family's forward uses for the
/// stored tensor.
#[derive(Clone, Copy, Debug)]
pub enum NormWeight<'a> {
    /// No weight: `x / rms(x)`.
    None,
    /// Multiply by the stored values: `x / rms(x) * w`.
    Scale(&'a [f32]),
    /// Multiply by one plus the stored values: `x / rms(x) * (1 + w)`.
    OnePlus(&'a [f32]),
}

/// `out = x / sqrt(mean(x²) + eps) · weight`.
///
/// Rounding follows ggml's `rms_norm` then `mul`: the squares are formed in
/// `f32` and summed in `f64`, the mean is rounded to `f32`, the scale is
/// `1 / sqrt(mean + eps)` in `f32`, and each output is `(x · scale) · w`
/// (with `1 + w` formed in `f32` for [`NormWeight::OnePlus`]).
pub fn rms_norm(
    x: &[f32],
    eps: f32,
    weight: NormWeight<'_>,
    out: &mut [f32],
) -> Result<(), OpsError> {
    check_len("rms_norm out", x.len(), out.len())?;
    out.copy_from_slice(x);
    rms_norm_in_place(out, eps, weight)
}

/// [`rms_norm`] over `x` itself.
pub fn rms_norm_in_place(x: &mut [f32], eps: f32, weight: NormWeight<'_>) -> Result<(), OpsError> {
    match weight {
        NormWeight::None => {}
        NormWeight::Scale(w) | NormWeight::OnePlus(w) => {
            check_len("rms_norm weight", x.len(), w.len())?
        }
    }
    if x.is_empty() {
        return Ok(());
    }
    let sum: f64 = x.iter().map(|&v| f64::from(v * v)).sum();
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    match weight {
        NormWeight::None => x.iter_mut().for_each(|v| *v *= scale),
        NormWeight::Scale(w) => x.iter_mut().zip(w).for_each(|(v, &w)| *v = *v * scale * w),
        NormWeight::OnePlus(w) => x
            .iter_mut()
            .zip(w)
            .for_each(|(v, &w)| *v = *v * scale * (1.0 + w)),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(x: &[f32], eps: f64, w: Option<&[f64]>) -> Vec<f64> {
        let n = x.len() as f64;
        let ms = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / n;
        let r = 1.0 / (ms + eps).sqrt();
        x.iter()
            .enumerate()
            .map(|(i, &v)| f64::from(v) * r * w.map_or(1.0, |w| w[i]))
            .collect()
    }

    fn close(got: &[f32], want: &[f64]) {
        for (g, w) in got.iter().zip(want) {
            let tol = 4.0 * f64::from(f32::EPSILON) * w.abs().max(1e-30);
            assert!((f64::from(*g) - w).abs() <= tol, "{g} vs {w}");
        }
    }

    #[test]
    fn hand_checked() {
        // mean(x²) = (9 + 16) / 2 = 12.5; eps 0 -> x / sqrt(12.5).
        let mut out = [0.0; 2];
        rms_norm(&[3.0, -4.0], 0.0, NormWeight::None, &mut out).unwrap();
        close(&out, &[3.0 / 12.5f64.sqrt(), -4.0 / 12.5f64.sqrt()]);
        // All equal -> ±1 before the weight.
        rms_norm(&[2.0, -2.0], 0.0, NormWeight::Scale(&[0.5, 3.0]), &mut out).unwrap();
        assert_eq!(out, [0.5, -3.0]);
        rms_norm(
            &[2.0, -2.0],
            0.0,
            NormWeight::OnePlus(&[0.5, 3.0]),
            &mut out,
        )
        .unwrap();
        assert_eq!(out, [1.5, -4.0]);
    }

    #[test]
    fn matches_naive_f64() {
        let x: Vec<f32> = (0..96)
            .map(|i| ((i * 29) % 41) as f32 * 0.37 - 7.0)
            .collect();
        let w: Vec<f32> = (0..96)
            .map(|i| ((i * 13) % 17) as f32 * 0.05 - 0.3)
            .collect();
        let w64: Vec<f64> = w.iter().map(|&v| f64::from(v)).collect();
        let w1: Vec<f64> = w.iter().map(|&v| 1.0 + f64::from(v)).collect();
        let eps = 1e-6;
        let mut out = vec![0.0; 96];
        rms_norm(&x, eps, NormWeight::None, &mut out).unwrap();
        close(&out, &naive(&x, f64::from(eps), None));
        rms_norm(&x, eps, NormWeight::Scale(&w), &mut out).unwrap();
        close(&out, &naive(&x, f64::from(eps), Some(&w64)));
        let mut inplace = x.clone();
        rms_norm_in_place(&mut inplace, eps, NormWeight::OnePlus(&w)).unwrap();
        close(&inplace, &naive(&x, f64::from(eps), Some(&w1)));
    }

    #[test]
    fn eps_dominates_zero_input_and_lengths_are_checked() {
        let mut out = [1.0; 3];
        rms_norm(&[0.0; 3], 1e-5, NormWeight::None, &mut out).unwrap();
        assert_eq!(out, [0.0; 3]);
        assert!(rms_norm(&[1.0; 3], 1e-5, NormWeight::Scale(&[1.0; 2]), &mut out).is_err());
        assert!(rms_norm(&[1.0; 2], 1e-5, NormWeight::None, &mut out).is_err());
    }
}
