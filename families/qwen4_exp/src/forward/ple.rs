//! The PLE n-gram hash embedding (spec section 8), applied to the residual
//! streams before its layer's HC mix.

use family_ops::ggml_cpu::{self, Ubatch};
use family_ops::{NormWeight, rms_norm_in_place};

use super::hyper::{Hyper, PleHyper};
use super::{ForwardError, Model, Need, Weights};

/// The dilated conv's history: the last `(K − 1)·n` normed gated values
/// (hc_dim each), oldest first, zeros before the sequence start.
#[derive(Debug, Clone)]
pub(super) struct PleState {
    hist: Vec<Vec<f32>>,
}

impl PleState {
    pub(super) fn new(p: &PleHyper, hp: &Hyper) -> PleState {
        PleState {
            hist: vec![vec![0.0; hp.hc * hp.n_embd]; (p.conv_kernel - 1) * p.ngram],
        }
    }
}

pub(super) fn check(hp: &Hyper, b: &str, need: &Need<'_>) -> Result<(), ForwardError> {
    let p = hp.ple.as_ref().expect("PLE layer");
    let (e, hc) = (hp.n_embd, hp.hc);
    need(&format!("{b}ple_key.weight"), Some(e * hc * e))?;
    need(&format!("{b}ple_value.weight"), Some(e * e))?;
    need(&format!("{b}ple_norm_key.weight"), Some(e * hc))?;
    need(&format!("{b}ple_norm_query.weight"), Some(e * hc))?;
    need(&format!("{b}ple_norm_conv.weight"), Some(e * hc))?;
    need(
        &format!("{b}ple_conv1d.weight"),
        Some(p.conv_kernel * e * hc),
    )?;
    need("per_layer_token_embd.weight", None)
}

/// The table rows of the token at the end of `tokens` (spec 8.1).
pub(crate) fn rows(p: &PleHyper, tokens: &[u32]) -> Vec<u64> {
    let pos = tokens.len() - 1;
    let mut ctx = vec![u64::from(tokens[pos])];
    let mut cut = false;
    for s in 1..p.ngram {
        let t = if cut || s > pos {
            None
        } else {
            Some(u64::from(tokens[pos - s]))
        };
        cut = cut || t.is_none() || t == Some(p.eos);
        ctx.push(if cut { p.eos } else { t.unwrap_or(p.eos) });
    }
    let mut rows = Vec::with_capacity(p.n_heads());
    for g in 2..=p.ngram {
        let mixed = (0..g).fold(0u64, |acc, j| acc ^ ctx[j].wrapping_mul(p.multipliers[j]));
        for k in 0..p.per_gram {
            let h = (g - 2) * p.per_gram + k;
            rows.push(mixed % p.vocab_sizes[h] + p.offsets[h]);
        }
    }
    rows
}

impl<W: Weights> Model<W> {
    /// `R += gv + silu(conv)` for the newest token of `tokens`
    /// (`build_ple`): per stream `c`, the key and the residual RMS-normed
    /// times their gains, `s = Σ k·q / sqrt(E)` (`ggml_sum_rows` of the
    /// products), the gate `sigmoid(sgn(s)·sqrt(max(|s|, 1e-6)))`, `gv` the
    /// value times it, `nv` that normed; the dilated conv a sum of its
    /// taps' products in order.
    pub(super) fn ple(
        &self,
        b: &str,
        p: &PleHyper,
        st: &mut PleState,
        tokens: &[u32],
        r: &mut [f32],
        ub: Ubatch,
    ) {
        let (e, hc) = (self.hp.n_embd, self.hp.hc);
        let eps = self.hp.eps as f32;
        let mut emb = Vec::with_capacity(e);
        for row in rows(p, tokens) {
            let w = self
                .w
                .rows("per_layer_token_embd.weight", row as usize, 1)
                .unwrap_or_else(|| panic!("per_layer_token_embd row {row} out of range"));
            emb.extend_from_slice(&w);
        }
        let mut key = self.mv(&format!("{b}ple_key.weight"), &emb, ub);
        let value = self.mv(&format!("{b}ple_value.weight"), &emb, ub);
        let nk = self.w(&format!("{b}ple_norm_key.weight"));
        let nq = self.w(&format!("{b}ple_norm_query.weight"));
        let nc = self.w(&format!("{b}ple_norm_conv.weight"));
        let inv_sqrt_e = 1.0 / (e as f32).sqrt();
        let mut gv = Vec::with_capacity(hc * e);
        let mut nv = Vec::with_capacity(hc * e);
        for c in 0..hc {
            let span = c * e..(c + 1) * e;
            let kn = &mut key[span.clone()];
            rms_norm_in_place(kn, eps, NormWeight::Scale(&nk[span.clone()])).expect("gain of E");
            let mut qn = r[span.clone()].to_vec();
            rms_norm_in_place(&mut qn, eps, NormWeight::Scale(&nq[span.clone()]))
                .expect("gain of E");
            let prods: Vec<f32> = kn.iter().zip(&qn).map(|(&k, &q)| k * q).collect();
            let gate = gate(ggml_cpu::sum(&prods) * inv_sqrt_e);
            let gvc: Vec<f32> = value.iter().map(|&v| v * gate).collect();
            let mut nvc = gvc.clone();
            rms_norm_in_place(&mut nvc, eps, NormWeight::Scale(&nc[span])).expect("gain of E");
            nv.extend(nvc);
            gv.extend(gvc);
        }
        // conv_t[ch] = Σ_k w[ch·K + k] · nv_{t − (K−1−k)·n}[ch], the taps'
        // products added in order (one ggml_add per tap).
        let (kk, n) = (p.conv_kernel, p.ngram);
        let w = self.w(&format!("{b}ple_conv1d.weight"));
        let hl = st.hist.len();
        let mut conv = vec![0f32; hc * e];
        for (ch, out) in conv.iter_mut().enumerate() {
            for k in 0..kk {
                let d = (kk - 1 - k) * n;
                let x = if d == 0 { nv[ch] } else { st.hist[hl - d][ch] };
                let term = x * w[ch * kk + k];
                *out = if k == 0 { term } else { *out + term };
            }
        }
        ggml_cpu::silu_row(&mut conv);
        for ((rv, &g), &c) in r.iter_mut().zip(&gv).zip(&conv) {
            *rv += g + c;
        }
        if hl > 0 {
            st.hist.remove(0);
            st.hist.push(nv);
        }
    }
}

/// The PLE gate of a stream from its scaled dot product `s = k·q/√E`:
/// `sigmoid(sgn(s) · sqrt(max(|s|, 1e-6)))` in `f32` as ggml's unary ops
/// compute it (`sgn(0) = 0`).
pub(crate) fn gate(s: f32) -> f32 {
    let sgn = if s > 0.0 {
        1.0
    } else if s < 0.0 {
        -1.0
    } else {
        0.0
    };
    ggml_cpu::sigmoid(sgn * s.abs().max(1e-6).sqrt())
}
