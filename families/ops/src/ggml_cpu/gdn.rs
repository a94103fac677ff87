//! Gated DeltaNet's ops as ggml's CPU backend computes them: the short
//! causal convolution (`ggml_ssm_conv`), the L2 norm of the queries and
//! keys (`build_gdn_l2_norm`: an RMSNorm then a scale) and the fused
//! recurrence (`ggml_gated_delta_net`, `ops.cpp`), for one token.

use super::dot_f32;
use crate::{NormWeight, OpsError, check_len, rms_norm_in_place};

/// `ggml_ssm_conv` for one token: channel `ch`'s output is `Σ_t
/// window[t] · kernel[ch][t]` over its `d_conv` taps, oldest first, each
/// product rounded then added (the C's `sumf += s * c`, not contracted in
/// the oracle's build).
/// `state` holds each channel's last `d_conv - 1` inputs, oldest first
/// (`state[ch · (d_conv - 1) + t]`), `x` the new input; the window is the
/// state then `x`, and the state moves on by one. `kernel` is
/// `[channels][d_conv]` (GGUF's `ssm_conv1d`, `ne0 = d_conv`).
///
/// # Errors
///
/// The lengths do not fit `x.len()` channels.
pub fn ssm_conv(
    state: &mut [f32],
    x: &[f32],
    kernel: &[f32],
    out: &mut [f32],
) -> Result<(), OpsError> {
    let channels = x.len();
    check_len("ssm_conv out", channels, out.len())?;
    if channels == 0 {
        return Ok(());
    }
    let d_conv = kernel.len() / channels;
    check_len("ssm_conv kernel", channels * d_conv, kernel.len())?;
    check_len(
        "ssm_conv state",
        channels * d_conv.saturating_sub(1),
        state.len(),
    )?;
    if d_conv == 0 {
        out.fill(0.0);
        return Ok(());
    }
    let hist = d_conv - 1;
    for ch in 0..channels {
        let taps = &kernel[ch * d_conv..(ch + 1) * d_conv];
        let past = &mut state[ch * hist..(ch + 1) * hist];
        let mut sum = 0f32;
        for (t, &w) in taps.iter().enumerate() {
            let v = if t < hist { past[t] } else { x[ch] };
            sum += v * w;
        }
        out[ch] = sum;
        if hist > 0 {
            past.rotate_left(1);
            past[hist - 1] = x[ch];
        }
    }
    Ok(())
}

/// `build_gdn_l2_norm` of one head: `ggml_rms_norm` with `eps / n`, then
/// `ggml_scale` by `1 / sqrtf(n)` (`n` the head's length).
///
/// # Errors
///
/// Never for a non-empty head (the RMSNorm has no weight to mismatch).
pub fn l2_norm(x: &mut [f32], eps: f32) -> Result<(), OpsError> {
    let n = x.len() as f32;
    rms_norm_in_place(x, eps / n, NormWeight::None)?;
    let s = 1.0 / n.sqrt();
    x.iter_mut().for_each(|v| *v *= s);
    Ok(())
}

/// `ggml_gated_delta_net` for one V head and one token (scalar gate):
/// the state `M` (`S × S`, `state[j · S + i]` = key `i`, value `j`, ggml's
/// transposed layout) decays by `expf(g)`; `delta_j = (v_j - M_j · k) ·
/// beta` ([`dot_f32`]); `M_j += k · delta_j` (`ggml_vec_mad_f32`, fused);
/// `out_j = (M_j · q) / sqrtf(S)` ([`dot_f32`], then the scale).
///
/// # Errors
///
/// The lengths do not fit `S = v.len()`.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_net(
    state: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: f32,
    beta: f32,
    out: &mut [f32],
) -> Result<(), OpsError> {
    let s = v.len();
    check_len("gated_delta_net state", s * s, state.len())?;
    check_len("gated_delta_net q", s, q.len())?;
    check_len("gated_delta_net k", s, k.len())?;
    check_len("gated_delta_net out", s, out.len())?;
    let decay = g.exp();
    state.iter_mut().for_each(|m| *m *= decay);
    let delta: Vec<f32> = state
        .chunks_exact(s.max(1))
        .zip(v)
        .map(|(m, &vj)| (vj - dot_f32(m, k)) * beta)
        .collect();
    for (m, &dj) in state.chunks_exact_mut(s.max(1)).zip(&delta) {
        for (mi, &ki) in m.iter_mut().zip(k) {
            *mi = ki.mul_add(dj, *mi);
        }
    }
    let scale = 1.0 / (s as f32).sqrt();
    for (o, m) in out.iter_mut().zip(state.chunks_exact(s.max(1))) {
        *o = dot_f32(m, q) * scale;
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
    fn ssm_conv_is_ggmls() {
        // 40 channels of windows of 6: a state of 3, then 3 tokens.
        let sx = row(6 * 40, 4, 2.0);
        let kernel = row(4 * 40, 5, 0.7);
        let mut state: Vec<f32> = sx.chunks_exact(6).flat_map(|w| w[..3].to_vec()).collect();
        let mut got = Vec::new();
        for t in 0..3 {
            let x: Vec<f32> = sx.chunks_exact(6).map(|w| w[3 + t]).collect();
            let mut out = vec![0f32; 40];
            ssm_conv(&mut state, &x, &kernel, &mut out).unwrap();
            got.extend(out);
        }
        assert_eq!(fnv(&got), 0x6a0f_cfa4_2de5_3f1b);
        let want: [u32; 6] = [
            0x3f8d_f981,
            0xbf5b_bdea,
            0xbee6_0417,
            0x3f3b_5b07,
            0xbec3_06bf,
            0x3e48_82bc,
        ];
        assert_eq!(
            got[..6].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            want
        );
        // The state holds the last 3 inputs of each channel.
        assert_eq!(state[..3], sx[3..6]);
        assert!(ssm_conv(&mut state, &[0.0; 39], &kernel, &mut [0.0; 39]).is_err());
    }

    #[test]
    fn l2_norm_is_an_rms_norm_then_a_scale() {
        let mut x = row(3 * 128, 3, 2.0);
        for h in x.chunks_exact_mut(128) {
            l2_norm(h, 1e-6).unwrap();
        }
        assert_eq!(fnv(&x), 0x8636_59ee_9d21_9472);
    }

    #[test]
    fn gated_delta_net_is_ggmls() {
        // S 32, 2 K heads, 4 V heads (V head h reads K head h mod 2), 3
        // tokens; the output then the final state, as ggml packs them.
        let (s, hk, hv, t) = (32, 2, 4, 3);
        let qk = |seed| {
            let mut x = row(s * hk * t, seed, 1.0);
            for h in x.chunks_exact_mut(s) {
                rms_norm_in_place(h, 1e-6, NormWeight::None).unwrap();
                h.iter_mut().for_each(|v| *v *= 0.2);
            }
            x
        };
        let (q, k) = (qk(9), qk(10));
        let v = row(s * hv * t, 11, 1.5);
        let g: Vec<f32> = row(hv * t, 12, 0.5).into_iter().map(|g| g - 0.6).collect();
        let beta: Vec<f32> = row(hv * t, 13, 2.0).into_iter().map(sigmoid).collect();
        let mut state = row(s * s * hv, 14, 0.3);
        let mut out = vec![0f32; s * hv * t];
        for tok in 0..t {
            for h in 0..hv {
                let kh = (tok * hk + h % hk) * s;
                let o = (tok * hv + h) * s;
                gated_delta_net(
                    &mut state[h * s * s..(h + 1) * s * s],
                    &q[kh..kh + s],
                    &k[kh..kh + s],
                    &v[o..o + s],
                    g[tok * hv + h],
                    beta[tok * hv + h],
                    &mut out[o..o + s],
                )
                .unwrap();
            }
        }
        out.extend(&state);
        assert_eq!(fnv(&out), 0x8759_6a09_d61c_067a);
    }
}
