//! Softmax, sigmoid and softplus.

/// Numerically stable softmax of `x`, in place: `exp(x_i - max) / Σ`, the
/// exponentials and their sum in `f64`.
///
/// `-inf` entries (masked out) get probability 0. When every entry is
/// `-inf` (nothing to attend to) the result is all zeros rather than NaN.
/// An empty slice is left as is.
pub fn softmax(x: &mut [f32]) {
    let mut e: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
    softmax_f64(&mut e);
    for (x, e) in x.iter_mut().zip(e) {
        *x = e as f32;
    }
}

/// [`softmax`] on `f64` values, in place.
pub(crate) fn softmax_f64(x: &mut [f64]) {
    let max = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        x.fill(0.0);
        return;
    }
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in x.iter_mut() {
        *v /= sum;
    }
}

/// The logistic function `1 / (1 + exp(-x))`, computed in `f64`.
pub fn sigmoid(x: f32) -> f32 {
    sigmoid_f64(f64::from(x)) as f32
}

/// ggml's softplus, computed in `f64`: `x` above 20, else `ln(1 +
/// exp(x))` (qwen4exp's decay gate, `docs/families/qwen4_exp.md` 5.3).
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        f64::from(x).exp().ln_1p() as f32
    }
}

pub(crate) fn sigmoid_f64(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_checked() {
        let mut x = [0.0f32, 0.0];
        softmax(&mut x);
        assert_eq!(x, [0.5, 0.5]);
        // ln 3 vs 0: 3/4 and 1/4.
        let mut x = [3f32.ln(), 0.0, f32::NEG_INFINITY];
        softmax(&mut x);
        assert!((x[0] - 0.75).abs() < 1e-7 && (x[1] - 0.25).abs() < 1e-7);
        assert_eq!(x[2], 0.0);
        let mut masked = [f32::NEG_INFINITY; 3];
        softmax(&mut masked);
        assert_eq!(masked, [0.0; 3]);
        softmax(&mut []);
        assert_eq!(sigmoid(0.0), 0.5);
        assert_eq!(sigmoid(-200.0), 0.0);
        assert_eq!(sigmoid(200.0), 1.0);
        assert_eq!(softplus(0.0), 2f32.ln());
        assert_eq!(softplus(25.0), 25.0);
        assert_eq!(softplus(-200.0), 0.0);
        assert!((softplus(1.0) - 1.313_261_7).abs() < 1e-6);
    }

    #[test]
    fn stable_for_large_logits_and_matches_naive() {
        // A naive exp(1000) overflows; the max shift keeps it exact.
        let mut x = [1000.0f32, 999.0, 998.0];
        softmax(&mut x);
        let e = [1.0, (-1f64).exp(), (-2f64).exp()];
        let s: f64 = e.iter().sum();
        for (g, w) in x.iter().zip(e) {
            assert!((f64::from(*g) - w / s).abs() < 1e-7);
        }
        let logits: Vec<f32> = (0..50)
            .map(|i| ((i * 17) % 29) as f32 * 0.3 - 4.0)
            .collect();
        let mut p = logits.clone();
        softmax(&mut p);
        let ex: Vec<f64> = logits.iter().map(|&v| f64::from(v).exp()).collect();
        let s: f64 = ex.iter().sum();
        for (g, e) in p.iter().zip(&ex) {
            let w = e / s;
            assert!(
                (f64::from(*g) - w).abs() <= f64::from(f32::EPSILON) * w,
                "{g} {w}"
            );
        }
        assert!((p.iter().map(|&v| f64::from(v)).sum::<f64>() - 1.0).abs() < 1e-6);
    }
}
