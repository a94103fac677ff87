//! The PLE n-gram hash embedding (spec section 8), applied to the residual
//! streams before its layer's HC mix.

use super::hyper::{Hyper, PleHyper};
use super::math::{dot, rms, sigmoid, sign, silu};
use super::{ForwardError, Model, Need, Weights};

/// The dilated conv's history: the last `(K − 1)·n` normed gated values
/// (hc_dim each), oldest first, zeros before the sequence start.
#[derive(Debug, Clone)]
pub(super) struct PleState {
    hist: Vec<Vec<f64>>,
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
    /// `R += gv + silu(conv)` for the newest token of `tokens`.
    pub(super) fn ple(
        &self,
        b: &str,
        p: &PleHyper,
        st: &mut PleState,
        tokens: &[u32],
        r: &mut [f64],
    ) {
        let (e, hc) = (self.hp.n_embd, self.hp.hc);
        let eps = self.hp.eps;
        let mut emb = Vec::with_capacity(e);
        for row in rows(p, tokens) {
            let w = self
                .w
                .rows("per_layer_token_embd.weight", row as usize, 1)
                .unwrap_or_else(|| panic!("per_layer_token_embd row {row} out of range"));
            emb.extend(w.iter().map(|&v| f64::from(v)));
        }
        let key = self.mv(&format!("{b}ple_key.weight"), &emb);
        let value = self.mv(&format!("{b}ple_value.weight"), &emb);
        let nk = self.w(&format!("{b}ple_norm_key.weight"));
        let nq = self.w(&format!("{b}ple_norm_query.weight"));
        let nc = self.w(&format!("{b}ple_norm_conv.weight"));
        let sqrt_e = (e as f64).sqrt();
        let mut gv = Vec::with_capacity(hc * e);
        let mut nv = Vec::with_capacity(hc * e);
        for c in 0..hc {
            let span = c * e..(c + 1) * e;
            let kn = rms(&key[span.clone()], eps, Some(&nk[span.clone()]));
            let qn = rms(&r[span.clone()], eps, Some(&nq[span.clone()]));
            let s = dot(&kn, &qn) / sqrt_e;
            let gate = sigmoid(sign(s) * s.abs().max(1e-6).sqrt());
            let gvc: Vec<f64> = value.iter().map(|&v| v * gate).collect();
            nv.extend(rms(&gvc, eps, Some(&nc[span])));
            gv.extend(gvc);
        }
        // conv_t[ch] = Σ_k w[ch·K + k] · nv_{t − (K−1−k)·n}[ch]
        let (kk, n) = (p.conv_kernel, p.ngram);
        let w = self.w(&format!("{b}ple_conv1d.weight"));
        let hl = st.hist.len();
        for ch in 0..hc * e {
            let wc = &w[ch * kk..(ch + 1) * kk];
            let mut acc = 0.0;
            for (k, &wk) in wc.iter().enumerate() {
                let d = (kk - 1 - k) * n;
                let x = if d == 0 { nv[ch] } else { st.hist[hl - d][ch] };
                acc += x * f64::from(wk);
            }
            r[ch] += gv[ch] + silu(acc);
        }
        if hl > 0 {
            st.hist.remove(0);
            st.hist.push(nv);
        }
    }
}
