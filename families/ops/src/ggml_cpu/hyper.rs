//! The hyper-connections' fused ops as ggml's CPU backend computes them
//! (`ggml_dsv4_hc_pre_gated`, `ggml_dsv4_hc_post` without a mixing
//! matrix, `ops.cpp`): `hc` residual streams of `n` values each, stream
//! after stream.

use crate::{OpsError, check_len};

/// `ggml_dsv4_hc_pre_gated` for one token: `out_i = scale · Σ_c x[c][i] ·
/// sigmoid(gate[c][i])`, the sigmoid `1 / (1 + expf(-g))` (libm), the
/// rounded products added over the streams in order.
///
/// # Errors
///
/// `x` and `gate` are not `hc` streams of `out.len()` values.
pub fn hc_pre_gated(
    x: &[f32],
    gate: &[f32],
    hc: usize,
    scale: f32,
    out: &mut [f32],
) -> Result<(), OpsError> {
    let n = out.len();
    check_len("hc_pre x", hc * n, x.len())?;
    check_len("hc_pre gate", hc * n, gate.len())?;
    for (i, o) in out.iter_mut().enumerate() {
        let mut sum = 0f32;
        for c in 0..hc {
            let w = 1.0 / (1.0 + (-gate[c * n + i]).exp());
            sum += x[c * n + i] * w;
        }
        *o = scale * sum;
    }
    Ok(())
}

/// `ggml_dsv4_hc_post` with the identity mixing for one token: stream `c`
/// of `residual` becomes `residual[c][i] + x_i · post[c]`, the product
/// rounded (not contracted in the oracle's build).
///
/// # Errors
///
/// `residual` is not `post.len()` streams of `x.len()` values.
pub fn hc_post(x: &[f32], residual: &mut [f32], post: &[f32]) -> Result<(), OpsError> {
    let n = x.len();
    check_len("hc_post residual", post.len() * n, residual.len())?;
    for (r, &p) in residual.chunks_exact_mut(n.max(1)).zip(post) {
        for (rv, &xv) in r.iter_mut().zip(x) {
            *rv += xv * p;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Hashes from `tools/oracle/ggml_hybrid_refs.c`.

    use super::super::refs::{fnv, row};
    use super::super::sigmoid;
    use super::*;

    #[test]
    fn hc_pre_and_post_are_ggmls() {
        let (n, hc) = (24, 4);
        let x = row(n * hc * 2, 15, 3.0);
        let g = row(n * hc * 2, 16, 4.0);
        let mut pre = vec![0f32; n * 2];
        for t in 0..2 {
            let s = t * n * hc..(t + 1) * n * hc;
            hc_pre_gated(&x[s.clone()], &g[s], hc, 0.25, &mut pre[t * n..(t + 1) * n]).unwrap();
        }
        assert_eq!(fnv(&pre), 0xe46e_bbcf_ce4c_a923);
        let bo = row(n * 2, 17, 2.0);
        let w: Vec<f32> = row(hc * 2, 18, 3.0)
            .into_iter()
            .map(|v| sigmoid(v) * 2.0)
            .collect();
        let mut post = x.clone();
        for t in 0..2 {
            hc_post(
                &bo[t * n..(t + 1) * n],
                &mut post[t * n * hc..(t + 1) * n * hc],
                &w[t * hc..(t + 1) * hc],
            )
            .unwrap();
        }
        assert_eq!(fnv(&post), 0xbab5_6a1b_c976_2289);
        assert!(hc_post(&bo[..n], &mut post[..n], &w[..2]).is_err());
    }
}
