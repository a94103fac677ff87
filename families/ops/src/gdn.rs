//! Gated DeltaNet's two recurrences (qwen4exp's linear-attention layers,
//! `docs/families/qwen4_exp.md` section 5, steps 4 and 8), one token at a
//! time, in `f64` as `tools/oracle/qwen4exp_ref.py` computes them:
//!
//! - [`causal_conv_silu`]: the short causal depthwise convolution over the
//!   last `d_conv − 1` inputs (the conv state), then SiLU;
//! - [`delta_rule`]: the gated delta rule on one V head's state matrix.

use crate::{OpsError, check_len};

/// One token through the causal depthwise convolution of kernel `d_conv`
/// and SiLU: for each channel `ch` of `x`,
/// `out[ch] = silu(Σ_{k < d_conv−1} state[k][ch] · w[ch][k] + x[ch] ·
/// w[ch][d_conv−1])`, the sum in `f64` with `k` ascending (oldest input
/// first), `silu(a) = a · 1 / (1 + exp(−a))`. Then the state moves on: its
/// oldest row goes, `x` becomes its newest.
///
/// Layouts (row-major): `state` is `[d_conv − 1][channels]`, oldest row
/// first (zeros at the start of a sequence); `w` is `[channels][d_conv]`
/// (ggml's `ssm_conv1d.weight`, index `k + ch · d_conv`); `x` and `out`
/// are `[channels]`. `d_conv` is read off `w`'s length.
///
/// # Errors
///
/// No channels, `w` not whole kernels of the channels, or a state or
/// output of another length.
pub fn causal_conv_silu(
    state: &mut [f64],
    x: &[f64],
    w: &[f32],
    out: &mut [f64],
) -> Result<(), OpsError> {
    let channels = x.len();
    if channels == 0 || w.is_empty() || !w.len().is_multiple_of(channels) {
        return Err(OpsError::Invalid(format!(
            "causal_conv_silu: {} kernel weights over {channels} channels",
            w.len()
        )));
    }
    let d_conv = w.len() / channels;
    check_len(
        "causal_conv_silu state",
        (d_conv - 1) * channels,
        state.len(),
    )?;
    check_len("causal_conv_silu out", channels, out.len())?;
    for (ch, o) in out.iter_mut().enumerate() {
        let wc = &w[ch * d_conv..(ch + 1) * d_conv];
        let mut acc = 0.0;
        for (k, row) in state.chunks_exact(channels).enumerate() {
            acc += row[ch] * f64::from(wc[k]);
        }
        acc += x[ch] * f64::from(wc[d_conv - 1]);
        *o = silu_f64(acc);
    }
    if d_conv > 1 {
        state.copy_within(channels.., 0);
        let n = state.len();
        state[n - channels..].copy_from_slice(x);
    }
    Ok(())
}

/// `a · 1 / (1 + exp(−a))` in `f64` (qwen4_exp's `silu`).
pub fn silu_f64(a: f64) -> f64 {
    a * (1.0 / (1.0 + (-a).exp()))
}

/// One token through the gated delta rule of one V head, state
/// `m[i · S + c]` (`i` a key dimension, `c` a value dimension; zeros at the
/// start of a sequence), `S = q.len()`:
///
/// ```text
/// M    = exp(g) · M
/// d[c] = (v[c] − Σ_i M[i,c] · k[i]) · beta
/// M[i,c] += k[i] · d[c]
/// out[c] = (Σ_i M[i,c] · q[i]) / sqrt(S)
/// ```
///
/// `q` and `k` are the head's L2-normalized query and key, `g` the log of
/// the decay (`softplus(alpha + dt_bias) · a`, at most 0), `beta` the
/// write strength (a sigmoid). Every sum runs over `i` ascending in `f64`.
///
/// # Errors
///
/// `S = 0`, or a length that is not `S` (`S²` for the state).
pub fn delta_rule(
    m: &mut [f64],
    q: &[f64],
    k: &[f64],
    v: &[f64],
    g: f64,
    beta: f64,
    out: &mut [f64],
) -> Result<(), OpsError> {
    let s = q.len();
    if s == 0 {
        return Err(OpsError::Invalid("delta_rule: a head of 0".into()));
    }
    check_len("delta_rule state", s * s, m.len())?;
    check_len("delta_rule k", s, k.len())?;
    check_len("delta_rule v", s, v.len())?;
    check_len("delta_rule out", s, out.len())?;
    let decay = g.exp();
    m.iter_mut().for_each(|x| *x *= decay);
    let mut d = vec![0.0; s];
    for (i, &ki) in k.iter().enumerate() {
        for (dc, &mv) in d.iter_mut().zip(&m[i * s..(i + 1) * s]) {
            *dc += mv * ki;
        }
    }
    for (dc, &vc) in d.iter_mut().zip(v) {
        *dc = (vc - *dc) * beta;
    }
    for (i, &ki) in k.iter().enumerate() {
        for (mv, &dv) in m[i * s..(i + 1) * s].iter_mut().zip(&d) {
            *mv += ki * dv;
        }
    }
    out.fill(0.0);
    for (i, &qi) in q.iter().enumerate() {
        for (oc, &mv) in out.iter_mut().zip(&m[i * s..(i + 1) * s]) {
            *oc += mv * qi;
        }
    }
    let sqrt_s = (s as f64).sqrt();
    out.iter_mut().for_each(|x| *x /= sqrt_s);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conv_hand_checked_and_the_state_moves_on() {
        // Two channels, d_conv 3: w[ch] = [1, 2, 3] and [0.5, 0, -1].
        let w = [1.0, 2.0, 3.0, 0.5, 0.0, -1.0];
        let mut state = vec![0.0; 4];
        let mut out = [0.0; 2];
        causal_conv_silu(&mut state, &[1.0, 2.0], &w, &mut out).unwrap();
        assert_eq!(out, [silu_f64(3.0), silu_f64(-2.0)]);
        assert_eq!(state, [0.0, 0.0, 1.0, 2.0]);
        causal_conv_silu(&mut state, &[-1.0, 4.0], &w, &mut out).unwrap();
        // ch0: 0·1 + 1·2 + (−1)·3 = −1; ch1: 0·0.5 + 2·0 + 4·(−1) = −4.
        assert_eq!(out, [silu_f64(-1.0), silu_f64(-4.0)]);
        assert_eq!(state, [1.0, 2.0, -1.0, 4.0]);
        // d_conv 1: no state, a plain scale.
        let mut none: [f64; 0] = [];
        causal_conv_silu(&mut none, &[2.0], &[0.25], &mut out[..1]).unwrap();
        assert_eq!(out[0], silu_f64(0.5));
        assert!((silu_f64(1.0) - 0.731_058_578_630_004_9).abs() < 1e-15);
    }

    #[test]
    fn conv_lengths_are_checked() {
        let mut st = vec![0.0; 4];
        let mut out = [0.0; 2];
        let w = [0.0; 6];
        assert!(causal_conv_silu(&mut st, &[0.0; 2], &w[..5], &mut out).is_err());
        assert!(causal_conv_silu(&mut st[..3], &[0.0; 2], &w, &mut out).is_err());
        assert!(causal_conv_silu(&mut st, &[0.0; 2], &w, &mut out[..1]).is_err());
        assert!(causal_conv_silu(&mut st, &[], &w, &mut out).is_err());
    }

    #[test]
    fn delta_rule_hand_checked() {
        // S = 2, M = 0: d = v · beta, M = k dᵀ, out = (k·q) d / sqrt 2.
        let (q, k, v) = ([1.0, 0.0], [0.6, 0.8], [2.0, -1.0]);
        let mut m = vec![0.0; 4];
        let mut out = [0.0; 2];
        delta_rule(&mut m, &q, &k, &v, 0.0, 0.5, &mut out).unwrap();
        assert_eq!(m, [0.6, -0.3, 0.8, -0.4]);
        let r2 = 2f64.sqrt();
        assert_eq!(out, [0.6 / r2, -0.3 / r2]);
        // The same key again with full strength writes v exactly (k is a
        // unit vector), after a decay of e^-1.
        delta_rule(&mut m, &q, &k, &v, -1.0, 1.0, &mut out).unwrap();
        let kk: Vec<f64> = (0..2)
            .map(|c| (0..2).map(|i| m[i * 2 + c] * k[i]).sum::<f64>())
            .collect();
        assert!(
            (kk[0] - 2.0).abs() < 1e-12 && (kk[1] + 1.0).abs() < 1e-12,
            "{kk:?}"
        );
        assert!(delta_rule(&mut m[..3], &q, &k, &v, 0.0, 1.0, &mut out).is_err());
        assert!(delta_rule(&mut m, &q, &k[..1], &v, 0.0, 1.0, &mut out).is_err());
        assert!(delta_rule(&mut [], &[], &[], &[], 0.0, 1.0, &mut []).is_err());
    }
}
