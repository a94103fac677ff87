//! The hyper-connections with a mixing matrix (DeepSeek-V4's mHC, as
//! glm5-next builds them: `build_hc_pre` and `build_hc_post` with the
//! fused `ggml_dsv4_hc_comb`, `ggml_dsv4_hc_pre` and `ggml_dsv4_hc_post`,
//! `ops.cpp`), for one token. The matrix is `comb[dst + hc · src]`.

use crate::{OpsError, check_len};

/// `ggml_dsv4_hc_pre` for one token: `out_i = scale · Σ_c x[c][i] ·
/// w[c]`, the rounded products added over the streams in order (not
/// contracted in the oracle's build).
///
/// # Errors
///
/// `x` is not `w.len()` streams of `out.len()` values.
pub fn hc_pre_weighted(x: &[f32], w: &[f32], scale: f32, out: &mut [f32]) -> Result<(), OpsError> {
    let n = out.len();
    check_len("hc_pre x", w.len() * n, x.len())?;
    for (i, o) in out.iter_mut().enumerate() {
        let mut sum = 0f32;
        for (c, &wc) in w.iter().enumerate() {
            let p = x[c * n + i] * wc;
            sum += p;
        }
        *o = scale * sum;
    }
    Ok(())
}

/// `ggml_dsv4_hc_comb` for one token: `logits[dst + hc · src] · scale +
/// base[..]` (fused), a softmax over `dst` for each `src` (libm `expf`,
/// `f32` sums, the reciprocal multiplied in, then `+ eps` fused), one
/// normalization over `src` for each `dst` (`sum` starting at `eps`), then
/// `n_iter - 1` times over `dst` then over `src`.
///
/// # Errors
///
/// `logits` and `base` are not `hc · hc` values.
pub fn hc_comb(
    logits: &[f32],
    scale: f32,
    base: &[f32],
    hc: usize,
    eps: f32,
    n_iter: usize,
) -> Result<Vec<f32>, OpsError> {
    check_len("hc_comb logits", hc * hc, logits.len())?;
    check_len("hc_comb base", hc * hc, base.len())?;
    let mut comb = vec![0f32; hc * hc];
    for src in 0..hc {
        let row = src * hc..(src + 1) * hc;
        let mut max = f32::NEG_INFINITY;
        for i in row.clone() {
            comb[i] = logits[i].mul_add(scale, base[i]);
            max = max.max(comb[i]);
        }
        let mut sum = 0f32;
        for i in row.clone() {
            comb[i] = (comb[i] - max).exp();
            sum += comb[i];
        }
        let inv = 1.0 / sum;
        for i in row {
            comb[i] = comb[i].mul_add(inv, eps);
        }
    }
    let norm_cols = |comb: &mut [f32]| {
        for dst in 0..hc {
            let sum = (0..hc).fold(eps, |s, src| s + comb[dst + hc * src]);
            let inv = 1.0 / sum;
            (0..hc).for_each(|src| comb[dst + hc * src] *= inv);
        }
    };
    let norm_rows = |comb: &mut [f32]| {
        for src in 0..hc {
            let sum = (0..hc).fold(eps, |s, dst| s + comb[dst + hc * src]);
            let inv = 1.0 / sum;
            (0..hc).for_each(|dst| comb[dst + hc * src] *= inv);
        }
    };
    norm_cols(&mut comb);
    for _ in 1..n_iter {
        norm_rows(&mut comb);
        norm_cols(&mut comb);
    }
    Ok(comb)
}

/// `ggml_dsv4_hc_post` for one token: stream `dst` of the result is
/// `x_i · post[dst] + Σ_src residual[src][i] · comb[dst + hc · src]`, each
/// product rounded, added in `src` order.
///
/// # Errors
///
/// `residual` is not `post.len()` streams of `x.len()` values, or `comb`
/// not their square.
pub fn hc_post_mixed(
    x: &[f32],
    residual: &[f32],
    post: &[f32],
    comb: &[f32],
) -> Result<Vec<f32>, OpsError> {
    let (n, hc) = (x.len(), post.len());
    check_len("hc_post residual", hc * n, residual.len())?;
    check_len("hc_post comb", hc * hc, comb.len())?;
    let mut out = vec![0f32; hc * n];
    for dst in 0..hc {
        for i in 0..n {
            let mut sum = x[i] * post[dst];
            for src in 0..hc {
                let p = residual[src * n + i] * comb[dst + hc * src];
                sum += p;
            }
            out[dst * n + i] = sum;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    //! Hashes from `tools/oracle/ggml_kernel_refs.c`'s `hyper_mix_ops`.

    use super::super::refs::{fnv, row};
    use super::*;

    #[test]
    fn comb_pre_and_post_are_ggmls_fused_ops() {
        let mixes = row(24, 41, 3.0);
        let scale = row(3, 42, 1.0);
        let base = row(24, 43, 1.0);
        let comb = hc_comb(&mixes[8..], scale[2], &base[8..], 4, 1e-6, 2).unwrap();
        assert_eq!(comb[0].to_bits(), 0x3e91_2602);
        assert_eq!(fnv(&comb), 0x81d4_eeb4_acf8_befa);
        let x = row(160, 44, 2.0);
        let w = row(4, 45, 1.0);
        let mut pre = vec![0f32; 40];
        hc_pre_weighted(&x, &w, 1.0, &mut pre).unwrap();
        assert_eq!(fnv(&pre), 0x869f_1ecb_4268_106b);
        let y = row(40, 46, 2.0);
        let post = row(4, 47, 1.0);
        let out = hc_post_mixed(&y, &x, &post, &comb).unwrap();
        assert_eq!(out[0].to_bits(), 0xbdec_06c4);
        assert_eq!(fnv(&out), 0x5659_d42c_14e7_7f03);
        // Fused products in the post land elsewhere.
        let fused: Vec<f32> = (0..160)
            .map(|at| {
                let (dst, i) = (at / 40, at % 40);
                (0..4).fold(y[i] * post[dst], |s, src| {
                    x[src * 40 + i].mul_add(comb[dst + 4 * src], s)
                })
            })
            .collect();
        assert_ne!(fnv(&fused), fnv(&out));
        assert!(hc_comb(&mixes[..15], 1.0, &base[..16], 4, 1e-6, 2).is_err());
        assert!(hc_pre_weighted(&x[1..], &w, 1.0, &mut pre).is_err());
        assert!(hc_post_mixed(&y, &x, &post, &comb[1..]).is_err());
    }
}
