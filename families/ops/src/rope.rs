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

/// The position index (0 `t`, 1 `h`, 2 `w`, 3 `e`) rotation pair `i`
/// takes in IMROPE of `sections` (ggml's `rope_multi` with
/// `GGML_ROPE_TYPE_IMROPE`): sectors interleave `t, h, w` by `sector % 3`
/// within three times each section, the rest take `e`.
pub fn imrope_section(i: usize, sections: [usize; 4]) -> usize {
    let [s0, s1, s2, _] = sections.map(|v| v.saturating_mul(3));
    let sect = sections.iter().fold(0usize, |a, &b| a.saturating_add(b));
    // numpy's `i % 0` is 0.
    let sector = if sect == 0 { 0 } else { i % sect };
    if sector % 3 == 1 && sector < s1 {
        1
    } else if sector % 3 == 2 && sector < s2 {
        2
    } else if sector % 3 == 0 && sector < s0 {
        0
    } else {
        3
    }
}

/// IMROPE (qwen4exp, `docs/families/qwen4_exp.md` section 7) of every head
/// of `x` (heads of `head_dim`) in place, in `f64`: NEOX pairing `(i, i +
/// n_rot/2)` on the first `n_rot` dims, pair `i` turning by `θ =
/// pos4[imrope_section(i)] · base^(-2i/n_rot)` at positions `pos4 = (t, h,
/// w, e)` (a text token at `p`: `(p, p, p, 0)`).
///
/// # Errors
///
/// `x` not whole heads, `n_rot` odd or past the head.
pub fn imrope(
    x: &mut [f64],
    head_dim: usize,
    pos4: [f64; 4],
    n_rot: usize,
    base: f64,
    sections: [usize; 4],
) -> Result<(), OpsError> {
    if head_dim == 0
        || !x.len().is_multiple_of(head_dim)
        || !n_rot.is_multiple_of(2)
        || n_rot > head_dim
    {
        return Err(OpsError::Invalid(format!(
            "imrope: {} values in heads of {head_dim}, n_rot {n_rot}",
            x.len()
        )));
    }
    let half = n_rot / 2;
    let cs: Vec<(f64, f64)> = (0..half)
        .map(|i| {
            let theta =
                pos4[imrope_section(i, sections)] * base.powf(-2.0 * i as f64 / n_rot as f64);
            (theta.cos(), theta.sin())
        })
        .collect();
    for head in x.chunks_exact_mut(head_dim) {
        for (i, &(c, s)) in cs.iter().enumerate() {
            let x0 = head[i];
            let x1 = head[i + half];
            head[i] = x0 * c - x1 * s;
            head[i + half] = x0 * s + x1 * c;
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

    #[test]
    fn imrope_sections_and_a_text_token() {
        // Sections [2, 1, 1, 0]: sectors 0..4 of each 4 pairs: t, h, w, t.
        let sec = [2, 1, 1, 0];
        let picks: Vec<usize> = (0..8).map(|i| imrope_section(i, sec)).collect();
        assert_eq!(picks, [0, 1, 2, 0, 0, 1, 2, 0]);
        // Sections [1, 1, 0, 2]: w has none, sector 2 and 3 take e.
        assert_eq!(
            (0..4)
                .map(|i| imrope_section(i, [1, 1, 0, 2]))
                .collect::<Vec<_>>(),
            [0, 1, 3, 3]
        );
        // A text token (p, p, p, 0): pairs of t/h/w turn as NEOX RoPE at p,
        // pairs of e do not turn.
        let x: Vec<f32> = (0..16).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut neox = x.clone();
        let r = Rope {
            n_rot: 8,
            freq_base: 1000.0,
            mode: RopeMode::Neox,
        };
        rope(&mut neox, 8, 5, &r).unwrap();
        let mut im: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
        imrope(&mut im, 8, [5.0, 5.0, 5.0, 0.0], 8, 1000.0, sec).unwrap();
        for (a, b) in neox.iter().zip(&im) {
            assert!((f64::from(*a) - b).abs() < 1e-6, "{a} {b}");
        }
        let mut im: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
        imrope(&mut im, 8, [5.0, 5.0, 5.0, 0.0], 8, 1000.0, [1, 1, 0, 2]).unwrap();
        // Pairs 2 and 3 (e) are left as they were.
        for d in [2, 3, 6, 7] {
            assert_eq!(im[d], f64::from(x[d]));
        }
        assert!(imrope(&mut im, 8, [0.0; 4], 10, 1000.0, sec).is_err());
        assert!(imrope(&mut im[..7], 8, [0.0; 4], 8, 1000.0, sec).is_err());
    }
}
