//! Gated DeltaNet layer (spec section 5), one token at a time.

use super::hyper::Hyper;
use super::math::{l2, rms, sigmoid, softplus};
use super::{ForwardError, Model, Need, Weights};

/// A GDN layer's state: the last `d_conv − 1` conv inputs and the
/// delta-rule matrix per V head.
#[derive(Debug, Clone)]
pub(super) struct GdnState {
    /// `d_conv − 1` rows of conv_dim, oldest first (zeros at the start),
    /// row-major (`family_ops::causal_conv_silu`'s layout).
    conv: Vec<f64>,
    /// Per V head, `M[i·S + c]` (i: key dim, c: value dim).
    m: Vec<Vec<f64>>,
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
    pub(super) fn gdn(&self, b: &str, st: &mut GdnState, x: &[f64]) -> Vec<f64> {
        let hp = &self.hp;
        let (s, hv, hk) = (hp.ssm_state, hp.ssm_v_heads, hp.ssm_k_heads);
        let dc = hp.ssm_conv;
        let qkv = self.mm_scaled(&format!("{b}attn_qkv"), x);
        let z = self.mm_scaled(&format!("{b}attn_gate"), x);
        let beta: Vec<f64> = self
            .mm_scaled(&format!("{b}ssm_beta"), x)
            .into_iter()
            .map(sigmoid)
            .collect();
        let alpha = self.mm_scaled(&format!("{b}ssm_alpha"), x);
        let dt = self.w(&format!("{b}ssm_dt.bias"));
        let a = self.w(&format!("{b}ssm_a"));
        let g: Vec<f64> = (0..hv)
            .map(|j| softplus(alpha[j] + f64::from(dt[j])) * f64::from(a[j]))
            .collect();

        // Causal depthwise conv: W[ch·d_conv + k], k ascending, oldest first.
        let cw = self.w(&format!("{b}ssm_conv1d.weight"));
        let mut c = vec![0.0; qkv.len()];
        family_ops::causal_conv_silu(&mut st.conv, &qkv, &cw, &mut c)
            .expect("conv shapes checked in Model::new");
        debug_assert_eq!(cw.len(), dc * qkv.len());

        let kd = s * hk;
        let q: Vec<Vec<f64>> = c[..kd].chunks_exact(s).map(|h| l2(h, hp.eps)).collect();
        let k: Vec<Vec<f64>> = c[kd..2 * kd]
            .chunks_exact(s)
            .map(|h| l2(h, hp.eps))
            .collect();
        let v = &c[2 * kd..];
        let norm = self.w(&format!("{b}ssm_norm.weight"));
        let mut out = Vec::with_capacity(s * hv);
        for j in 0..hv {
            let (qj, kj) = (&q[j % hk], &k[j % hk]);
            let vj = &v[j * s..(j + 1) * s];
            let mut o = vec![0.0; s];
            family_ops::delta_rule(&mut st.m[j], qj, kj, vj, g[j], beta[j], &mut o)
                .expect("state shapes checked in Model::new");
            let on = rms(&o, hp.eps, Some(&norm));
            let zj = &z[j * s..(j + 1) * s];
            out.extend(on.iter().zip(zj).map(|(&ov, &zv)| ov * sigmoid(zv)));
        }
        self.mm_scaled(&format!("{b}ssm_out"), &out)
    }
}
