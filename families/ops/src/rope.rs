//! Rotary position embedding.

use crate::OpsError;

/// Which pairs of a head's dimensions rotate together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeMode {
    /// ggml's normal mode (GPT-J / original LLaMA style, "interleaved"):
    /// pair `i` is `(2i, 2i + 1)`.
    Normal,
    /// ggml's NEOX mode (GPT-NeoX / HF `rotate_half`): pair `i` is
    /// `(i, i + n_rot / 2)`.
    Neox,
}

/// RoPE parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    /// Leading dimensions of each head that rotate (ggml's `n_dims`); even,
    /// at most the head size. The rest pass through unchanged.
    pub n_rot: usize,
    /// Base of the frequencies (`rope.freq_base`, e.g. 10000).
    pub freq_base: f32,
    /// Pairing of dimensions.
    pub mode: RopeMode,
}

/// Rotates every head of `x` (`x.len() / head_dim` heads of `head_dim`
/// values, one token) for the token at `position`.
///
/// Pair `i` (of `n_rot / 2`) turns by `θ_i = position · base^(-2i/n_rot)`:
/// `(a, b) -> (a cos θ - b sin θ, a sin θ + b cos θ)`. The angle, its sine
/// and cosine and the rotation are computed in `f64` and rounded once, so
/// this is closer to exact than ggml, whose angle is an `f32` running
/// product (its error grows like `position · i · 2^-24` radians).
pub fn rope(x: &mut [f32], head_dim: usize, position: usize, rope: &Rope) -> Result<(), OpsError> {
    let Rope {
        n_rot,
        freq_base,
        mode,
    } = *rope;
    if head_dim == 0 || !x.len().is_multiple_of(head_dim) {
        return Err(OpsError::Invalid(format!(
            "rope: {} values are not whole heads of {head_dim}",
            x.len()
        )));
    }
    if n_rot % 2 != 0 || n_rot > head_dim {
        return Err(OpsError::Invalid(format!(
            "rope: n_rot {n_rot} must be even and at most the head size {head_dim}"
        )));
    }
    if !(freq_base.is_finite() && freq_base > 0.0) {
        return Err(OpsError::Invalid(format!("rope: freq_base {freq_base}")));
    }
    let half = n_rot / 2;
    let angles: Vec<(f64, f64)> = (0..half)
        .map(|i| {
            let inv_freq = f64::from(freq_base).powf(-2.0 * i as f64 / n_rot as f64);
            (position as f64 * inv_freq).sin_cos()
        })
        .collect();
    for head in x.chunks_exact_mut(head_dim) {
        for (i, &(sin, cos)) in angles.iter().enumerate() {
            let (ia, ib) = match mode {
                RopeMode::Normal => (2 * i, 2 * i + 1),
                RopeMode::Neox => (i, i + half),
            };
            let (a, b) = (f64::from(head[ia]), f64::from(head[ib]));
            head[ia] = (a * cos - b * sin) as f32;
            head[ib] = (a * sin + b * cos) as f32;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Naive f64 reference: build the full rotated vector from the
    /// definition, as HF's `rotate_half` (NEOX) or the complex-number form
    /// (normal) writes it.
    fn naive(
        x: &[f32],
        head_dim: usize,
        pos: f64,
        n_rot: usize,
        base: f64,
        neox: bool,
    ) -> Vec<f64> {
        let mut out: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
        for h in 0..x.len() / head_dim {
            let v = &x[h * head_dim..(h + 1) * head_dim];
            let o = &mut out[h * head_dim..(h + 1) * head_dim];
            for d in 0..n_rot {
                let i = if neox { d % (n_rot / 2) } else { d / 2 };
                let theta = pos / base.powf(2.0 * i as f64 / n_rot as f64);
                let partner = if neox { (d + n_rot / 2) % n_rot } else { d ^ 1 };
                let first = if neox { d < n_rot / 2 } else { d % 2 == 0 };
                let rot = if first {
                    -f64::from(v[partner])
                } else {
                    f64::from(v[partner])
                };
                o[d] = f64::from(v[d]) * theta.cos() + rot * theta.sin();
            }
        }
        out
    }

    fn check(mode: RopeMode, n_rot: usize, pos: usize) {
        let head_dim = 16;
        let x: Vec<f32> = (0..3 * head_dim)
            .map(|i| ((i * 31) % 23) as f32 * 0.2 - 2.0)
            .collect();
        let mut got = x.clone();
        let p = Rope {
            n_rot,
            freq_base: 10000.0,
            mode,
        };
        rope(&mut got, head_dim, pos, &p).unwrap();
        let want = naive(
            &x,
            head_dim,
            pos as f64,
            n_rot,
            10000.0,
            mode == RopeMode::Neox,
        );
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (f64::from(*g) - w).abs() <= 1e-6 * w.abs().max(1.0),
                "{mode:?} {g} {w}"
            );
        }
    }

    #[test]
    fn matches_naive_f64() {
        for mode in [RopeMode::Normal, RopeMode::Neox] {
            for n_rot in [16, 8] {
                for pos in [0, 1, 7, 4095] {
                    check(mode, n_rot, pos);
                }
            }
        }
    }

    #[test]
    fn hand_checked() {
        // Position 1, n_rot 2: one pair turning by exactly 1 radian.
        let p = Rope {
            n_rot: 2,
            freq_base: 10000.0,
            mode: RopeMode::Normal,
        };
        let mut x = [1.0f32, 0.0, 5.0];
        rope(&mut x, 3, 1, &p).unwrap();
        assert_eq!(x, [1f64.cos() as f32, 1f64.sin() as f32, 5.0]);
        // NEOX with n_rot 4 pairs (0, 2) and (1, 3); pair 1 turns by
        // pos / base^(1/2) = 2 / 100.
        let p = Rope {
            n_rot: 4,
            freq_base: 10000.0,
            mode: RopeMode::Neox,
        };
        let mut x = [0.0f32, 1.0, 0.0, 0.0];
        rope(&mut x, 4, 2, &p).unwrap();
        assert_eq!(x, [0.0, 0.02f64.cos() as f32, 0.0, 0.02f64.sin() as f32]);
        // Position 0 is the identity.
        let mut y = [0.3f32, -1.25, 7.0, 2.0];
        let before = y;
        rope(&mut y, 4, 0, &p).unwrap();
        assert_eq!(y, before);
    }

    #[test]
    fn bad_arguments() {
        let p = Rope {
            n_rot: 3,
            freq_base: 10000.0,
            mode: RopeMode::Normal,
        };
        assert!(rope(&mut [0.0; 4], 4, 1, &p).is_err());
        let p = Rope { n_rot: 6, ..p };
        assert!(rope(&mut [0.0; 4], 4, 1, &p).is_err());
        let p = Rope { n_rot: 4, ..p };
        assert!(rope(&mut [0.0; 6], 4, 1, &p).is_err());
        assert!(rope(&mut [0.0; 4], 0, 1, &p).is_err());
        let p = Rope {
            freq_base: 0.0,
            ..p
        };
        assert!(rope(&mut [0.0; 4], 4, 1, &p).is_err());
    }
}
