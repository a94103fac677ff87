//! ggml's `rope_ext` in `f32` as its CPU build computes it
//! (`ggml_compute_forward_rope_flt`): the angle cache of
//! `ggml_rope_cache_init` (an `f32` running product of the angle, YaRN's
//! ramp where `ext_factor` is not 0, `cosf`/`sinf` times the magnitude
//! scale), then `rotate_pairs` in normal or NEOX mode over the leading
//! `n_rot` values of each head, the rest copied.

use crate::{OpsError, RopeMode};

/// The parameters of ggml's `rope_ext` (its op params, in `f32`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GgmlRope {
    /// Leading values of each head that rotate (`n_dims`): even, at most
    /// the head.
    pub n_rot: usize,
    /// Pairing: normal `(2i, 2i + 1)` or NEOX `(i, i + n_rot / 2)`.
    pub mode: RopeMode,
    /// The frequencies' base.
    pub freq_base: f32,
    /// Position interpolation (`1 / rope scaling factor`; 1 for none).
    pub freq_scale: f32,
    /// YaRN's extrapolation mix (0 for none).
    pub ext_factor: f32,
    /// The magnitude scale of the rotation (1 for none).
    pub attn_factor: f32,
    /// YaRN's fast correction (ggml's default 32).
    pub beta_fast: f32,
    /// YaRN's slow correction (ggml's default 1).
    pub beta_slow: f32,
    /// The context the model was trained on (YaRN's correction dims).
    pub n_ctx_orig: usize,
}

impl GgmlRope {
    /// Plain RoPE of `n_rot` values in `mode` at `freq_base`: no scaling,
    /// no YaRN (what `ggml_rope` computes).
    pub fn plain(n_rot: usize, mode: RopeMode, freq_base: f32) -> GgmlRope {
        GgmlRope {
            n_rot,
            mode,
            freq_base,
            freq_scale: 1.0,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            n_ctx_orig: 0,
        }
    }

    /// YaRN's correction dims (`ggml_rope_yarn_corr_dims`).
    pub fn corr_dims(&self) -> [f32; 2] {
        let n_dims = self.n_rot as f32;
        let corr_dim = |beta: f32| {
            n_dims * (self.n_ctx_orig as f32 / (beta * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * self.freq_base.ln())
        };
        let start = corr_dim(self.beta_fast).floor();
        let end = corr_dim(self.beta_slow).ceil();
        [start.max(0.0), end.min(n_dims - 1.0)]
    }

    /// The ratio of one pair's angle to the previous one's
    /// (`powf(freq_base, -2 / n_rot)`).
    pub fn theta_scale(&self) -> f32 {
        self.freq_base.powf(-2.0 / self.n_rot as f32)
    }

    /// The magnitude the sine and cosine are scaled by: `attn_factor`,
    /// times YaRN's `1 + 0.1 ln(1 / freq_scale)` where `ext_factor` is not 0.
    pub fn mscale(&self) -> f32 {
        let mut mscale = self.attn_factor;
        if self.ext_factor != 0.0 {
            mscale *= 1.0 + 0.1 * (1.0 / self.freq_scale).ln();
        }
        mscale
    }

    /// `(cos θ_i, sin θ_i)` of each pair `i` at `position`, scaled by the
    /// magnitude (`ggml_rope_cache_init`).
    pub fn cache(&self, position: i32) -> Vec<(f32, f32)> {
        let theta_scale = self.theta_scale();
        let corr = self.corr_dims();
        let mscale = self.mscale();
        let mut theta_extrap = position as f32;
        let mut cache = Vec::with_capacity(self.n_rot / 2);
        for i in 0..self.n_rot / 2 {
            let theta_interp = self.freq_scale * theta_extrap;
            let mut theta = theta_interp;
            if self.ext_factor != 0.0 {
                // rope_yarn_ramp of i0 = 2i.
                let y = (i as f32 - corr[0]) / (corr[1] - corr[0]).max(0.001);
                let ramp_mix = (1.0 - y.clamp(0.0, 1.0)) * self.ext_factor;
                theta = theta_interp * (1.0 - ramp_mix) + theta_extrap * ramp_mix;
            }
            cache.push((theta.cos() * mscale, theta.sin() * mscale));
            theta_extrap *= theta_scale;
        }
        cache
    }
}

/// Rotates every head (`head_dim` values) of `x` for the token at
/// `position` as ggml's `rope_ext` does in `f32`: the rotation
/// `fma(x0, cos, -(x1·sin))`, `fma(x0, sin, x1·cos)` as GCC contracts
/// `rotate_pairs`.
///
/// # Errors
///
/// `x` is not whole heads, `n_rot` is odd or past the head, or the base or
/// the scale is not finite and positive.
pub fn rope_ext(
    x: &mut [f32],
    head_dim: usize,
    position: i32,
    rope: &GgmlRope,
) -> Result<(), OpsError> {
    let n_rot = rope.n_rot;
    if head_dim == 0
        || !x.len().is_multiple_of(head_dim)
        || !n_rot.is_multiple_of(2)
        || n_rot > head_dim
    {
        return Err(OpsError::Invalid(format!(
            "rope: {} values in heads of {head_dim}, n_rot {n_rot}",
            x.len()
        )));
    }
    let finite_positive = |v: f32| v.is_finite() && v > 0.0;
    if !finite_positive(rope.freq_base) || !finite_positive(rope.freq_scale) {
        return Err(OpsError::Invalid(format!(
            "rope: freq_base {} freq_scale {}",
            rope.freq_base, rope.freq_scale
        )));
    }
    let cache = rope.cache(position);
    let half = n_rot / 2;
    for head in x.chunks_exact_mut(head_dim) {
        for (i, &(cos, sin)) in cache.iter().enumerate() {
            let (a, b) = match rope.mode {
                RopeMode::Normal => (2 * i, 2 * i + 1),
                RopeMode::Neox => (i, i + half),
            };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0.mul_add(cos, -(x1 * sin));
            head[b] = x0.mul_add(sin, x1 * cos);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_mode_turns_adjacent_pairs_by_a_running_f32_angle() {
        let x: Vec<f32> = (0..16).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let mut y = x.clone();
        rope_ext(&mut y, 16, 7, &GgmlRope::plain(8, RopeMode::Normal, 1e4)).unwrap();
        let theta_scale = 1e4f32.powf(-2.0 / 8.0);
        let theta = 7.0 * theta_scale * theta_scale;
        let (s, c) = (theta.sin(), theta.cos());
        assert_eq!(y[4], x[4].mul_add(c, -(x[5] * s)));
        assert_eq!(y[5], x[4].mul_add(s, x[5] * c));
        assert_eq!(&y[8..], &x[8..]);
    }

    #[test]
    fn neox_pairs_half_apart_and_leaves_the_tail() {
        let x: Vec<f32> = (0..8).map(|i| i as f32 + 1.0).collect();
        let mut y = x.clone();
        rope_ext(&mut y, 8, 1, &GgmlRope::plain(4, RopeMode::Neox, 1e4)).unwrap();
        // Pair 0 is (0, 2) at angle 1.
        let (s, c) = 1f32.sin_cos();
        assert_eq!(y[0], 1f32.mul_add(c, -(3.0 * s)));
        assert_eq!(y[2], 1f32.mul_add(s, 3.0 * c));
        assert_eq!(&y[4..], &x[4..]);
    }

    #[test]
    fn yarn_scales_the_magnitude_and_interpolates() {
        let mut r = GgmlRope::plain(8, RopeMode::Normal, 1e4);
        r.freq_scale = 0.25;
        r.ext_factor = 1.0;
        r.n_ctx_orig = 4096;
        let c = r.cache(100);
        let m = 1.0 + 0.1 * 4f32.ln();
        // Pair 0 lies below the ramp's start: pure extrapolation.
        assert!((c[0].0 - 100f32.cos() * m).abs() < 1e-6);
        // Pair 3 lies past the ramp's end: pure interpolation.
        let theta = 100.0 * 1e4f32.powf(-2.0 / 8.0).powi(3) * 0.25;
        assert!((c[3].1 - theta.sin() * m).abs() < 1e-5, "{c:?}");
    }
}
