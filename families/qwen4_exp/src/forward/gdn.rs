//! Gated DeltaNet layer (spec section 5; `build_layer_attn_linear`), one
//! token at a time (llama.cpp's fused `gated_delta_net` runs a ubatch's
//! tokens in order, with the same arithmetic).

use family_ops::ggml_cpu::{self, Ubatch};
use family_ops::{NormWeight, rms_norm_in_place};

use super::hyper::Hyper;
use super::{ForwardError, Model, Need, Weights};

/// A GDN layer's state: the last `d_conv − 1` conv inputs per channel and
/// the delta-rule matrix per V head.
#[derive(Debug, Clone)]
pub(super) struct GdnState {
    /// Per channel, its last `d_conv − 1` inputs, oldest first (zeros at
    /// the start): `family_ops::ggml_cpu::ssm_conv`'s layout.
    conv: Vec<f32>,
    /// Per V head, `S × S` in ggml's layout (`m[j·S + i]`: key `i`, value
    /// `j`).
    m: Vec<Vec<f32>>,
}

impl GdnState {
    pub(super) fn new(hp: &Hyper) -> GdnState {
        let s = hp.ssm_state;
        GdnState {
            conv: vec![0.0; conv_dim(hp) * (hp.ssm_conv - 1)],
            m: vec![vec![0.0; s * s]; hp.ssm_v_heads],
        }
    }
}

fn conv_dim(hp: &Hyper) -> usize {
    hp.ssm_state * (2 * hp.ssm_k_heads + hp.ssm_v_heads)
}

pub(super) fn check(hp: &Hyper, b: &str, need: &Need<'_>) -> Result<(), ForwardError> {
    let (e, s, hv) = (hp.n_embd, hp.ssm_state, hp.ssm_v_heads);
    let cd = conv_dim(hp);
    need(&format!("{b}attn_qkv.weight"), Some(e * cd))?;
    need(&format!("{b}attn_gate.weight"), Some(e * s * hv))?;
    need(&format!("{b}ssm_conv1d.weight"), Some(hp.ssm_conv * cd))?;
    need(&format!("{b}ssm_dt.bias"), Some(hv))?;
    need(&format!("{b}ssm_a"), Some(hv))?;
    need(&format!("{b}ssm_beta.weight"), Some(e * hv))?;
    need(&format!("{b}ssm_alpha.weight"), Some(e * hv))?;
    need(&format!("{b}ssm_norm.weight"), Some(s))?;
    need(&format!("{b}ssm_out.weight"), Some(s * hv * e))
}

impl<W: Weights> Model<W> {
    /// One token through GDN layer `b` (`blk.N.`).
    pub(super) fn gdn(&self, b: &str, st: &mut GdnState, x: &[f32], ub: Ubatch) -> Vec<f32> {
        let hp = &self.hp;
        let (s, hv, hk) = (hp.ssm_state, hp.ssm_v_heads, hp.ssm_k_heads);
        let eps = hp.eps as f32;
        let qkv = self.mm_scaled(&format!("{b}attn_qkv"), x, ub);
        let z = self.mm_scaled(&format!("{b}attn_gate"), x, ub);
        let beta: Vec<f32> = self
            .mm_scaled(&format!("{b}ssm_beta"), x, ub)
            .into_iter()
            .map(ggml_cpu::sigmoid)
            .collect();
        let alpha = self.mm_scaled(&format!("{b}ssm_alpha"), x, ub);
        let dt = self.w(&format!("{b}ssm_dt.bias"));
        let a = self.w(&format!("{b}ssm_a"));
        // gate = softplus(alpha + dt) · a (ssm_a holds -exp(A_log)).
        let g: Vec<f32> = (0..hv)
            .map(|j| ggml_cpu::softplus(alpha[j] + dt[j]) * a[j])
            .collect();

        let cw = self.w(&format!("{b}ssm_conv1d.weight"));
        let mut c = vec![0f32; qkv.len()];
        ggml_cpu::ssm_conv(&mut st.conv, &qkv, &cw, &mut c)
            .expect("conv shapes checked in Model::new");
        ggml_cpu::silu_row(&mut c);

        let kd = s * hk;
        let (qk, v) = c.split_at_mut(2 * kd);
        for head in qk.chunks_exact_mut(s) {
            ggml_cpu::l2_norm(head, eps).expect("a head of ssm_state");
        }
        let (q, k) = qk.split_at(kd);
        let norm = self.w(&format!("{b}ssm_norm.weight"));
        let mut out = vec![0f32; s * hv];
        for j in 0..hv {
            // V head j reads K head j mod hk (ggml's broadcast).
            let kh = (j % hk) * s..(j % hk + 1) * s;
            let o = &mut out[j * s..(j + 1) * s];
            ggml_cpu::gated_delta_net(
                &mut st.m[j],
                &q[kh.clone()],
                &k[kh],
                &v[j * s..(j + 1) * s],
                g[j],
                beta[j],
                o,
            )
            .expect("state shapes checked in Model::new");
            // build_norm_gated: RMSNorm times its gain, times sigmoid(z).
            rms_norm_in_place(o, eps, NormWeight::Scale(&norm)).expect("ssm_norm of S");
            for (ov, &zv) in o.iter_mut().zip(&z[j * s..(j + 1) * s]) {
                *ov *= ggml_cpu::sigmoid(zv);
            }
        }
        self.mm_scaled(&format!("{b}ssm_out"), &out, ub)
    }
}
