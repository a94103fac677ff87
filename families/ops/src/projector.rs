//! The float64 arithmetic of a ViT projector's encoder (muse-glimmer's
//! `--mmproj`, `tools/oracle/muse_glimmer_mmproj_ref.py`'s numbers): exact
//! GELU, LayerNorm and the products of activations with activations, each
//! value computed in `f64` and rounded once to `f32`. The host encoder and
//! the device op layer's reference both compute with these.

/// `erf` to about 1e-11 (Taylor series below 4; beyond, `erfc` < 2e-8).
pub fn erf(x: f64) -> f64 {
    let a = x.abs();
    if a >= 4.0 {
        return x.signum();
    }
    let (mut term, mut sum, x2) = (a, a, a * a);
    for n in 1..120 {
        term *= -x2 / n as f64;
        let add = term / (2 * n + 1) as f64;
        sum += add;
        if add.abs() < 1e-17 {
            break;
        }
    }
    (2.0 / std::f64::consts::PI.sqrt() * sum).copysign(x)
}

/// The exact GELU, `x · Φ(x) = 0.5 · x · (1 + erf(x / √2))`, in `f64`,
/// rounded once.
pub fn gelu_erf(x: f32) -> f32 {
    let x = f64::from(x);
    (0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2))) as f32
}

/// LayerNorm of one row in `f64`: `(x - mean) / sqrt(var + eps)`, times
/// `w` and plus `b` where given (each `x.len()` long), rounded once.
pub fn layer_norm(x: &mut [f32], eps: f32, w: Option<&[f32]>, b: Option<&[f32]>) {
    let n = x.len() as f64;
    let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let var = x
        .iter()
        .map(|&v| (f64::from(v) - mean).powi(2))
        .sum::<f64>()
        / n;
    let inv = 1.0 / (var + f64::from(eps)).sqrt();
    for (i, v) in x.iter_mut().enumerate() {
        let mut y = (f64::from(*v) - mean) * inv;
        if let Some(w) = w {
            y *= f64::from(w[i]);
        }
        if let Some(b) = b {
            y += f64::from(b[i]);
        }
        *v = y as f32;
    }
}

/// Every row of `a` (`[n, k]`) dotted with every row of `b` (`[m, k]`):
/// `[n, m]`, each dot's products summed in `f64` in index order, rounded
/// once (a patch embedding's kernel, a bilinear resize's weights).
pub fn dot_rows_f64(a: &[f32], b: &[f32], k: usize) -> Vec<f32> {
    if k == 0 {
        return Vec::new();
    }
    let mut out = Vec::with_capacity((a.len() / k) * (b.len() / k));
    for ar in a.chunks_exact(k) {
        for br in b.chunks_exact(k) {
            out.push(crate::dot_f64(ar, br) as f32);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_known_values() {
        for (x, want) in [
            (0.0, 0.0),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (-2.0, -0.995_322_265_018_952_7),
            (3.5, 0.999_999_256_901_627_7),
        ] {
            assert!(
                (erf(x) - want).abs() < 1e-12,
                "erf({x}) = {} vs {want}",
                erf(x)
            );
        }
    }

    #[test]
    fn dot_rows_are_every_pair_in_f64() {
        let a = [1.0f32, 2.0, 3.0, 4.0];
        let b = [1.0f32, 0.0, 0.5, 0.5, 1e8, 1.0];
        assert_eq!(
            dot_rows_f64(&a, &b, 2),
            [1.0, 1.5, 1e8 + 2.0, 3.0, 3.5, 3e8 + 4.0]
        );
    }

    #[test]
    fn layer_norm_centres_and_scales() {
        let mut x = [1.0f32, 2.0, 3.0, 4.0];
        layer_norm(&mut x, 0.0, Some(&[2.0; 4]), Some(&[1.0; 4]));
        let m: f32 = x.iter().sum::<f32>() / 4.0;
        assert!((m - 1.0).abs() < 1e-6, "{x:?}");
    }
}
