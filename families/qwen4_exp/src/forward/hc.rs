//! Hyper-connections (spec section 4): HC_MIX and HC_COMBINE over `hc`
//! residual streams of E, stored stream-major in one vector.

use super::math::{rms, sigmoid, silu};
use super::{Model, Weights};

impl<W: Weights> Model<W> {
    /// HC_MIX with the weights `{pre}_{norm,down,up,inject}.weight`: the
    /// mixed input (E) and, if the block has an inject matrix, the hc
    /// inject logits.
    pub(super) fn hc_mix(&self, r: &[f64], pre: &str) -> (Vec<f64>, Option<Vec<f64>>) {
        let (e, hc) = (self.hp.n_embd, self.hp.hc);
        let norm = self.w(&format!("{pre}_norm.weight"));
        let flat: Vec<f64> = r
            .chunks_exact(e)
            .zip(norm.chunks_exact(e))
            .flat_map(|(rc, nc)| rms(rc, self.hp.eps, Some(nc)))
            .collect();
        let lo: Vec<f64> = self
            .mv(&format!("{pre}_down.weight"), &flat)
            .into_iter()
            .map(|v| silu(v / hc as f64))
            .collect();
        let gate = self.mv(&format!("{pre}_up.weight"), &lo);
        let mut mixed = vec![0.0; e];
        for (xc, gc) in flat.chunks_exact(e).zip(gate.chunks_exact(e)) {
            for ((m, &x), &g) in mixed.iter_mut().zip(xc).zip(gc) {
                *m += x * sigmoid(g);
            }
        }
        for m in &mut mixed {
            *m /= hc as f64;
        }
        let inject = format!("{pre}_inject.weight");
        let inj = self.w.has(&inject).then(|| self.mv(&inject, &flat));
        (mixed, inj)
    }

    /// HC_COMBINE: `R[c] += y · 2·sigmoid(inj[c] / hc)`.
    pub(super) fn hc_combine(&self, r: &mut [f64], y: &[f64], inj: &[f64]) {
        let hc = self.hp.hc as f64;
        for (rc, &ic) in r.chunks_exact_mut(self.hp.n_embd).zip(inj) {
            let w = 2.0 * sigmoid(ic / hc);
            for (rv, &yv) in rc.iter_mut().zip(y) {
                *rv += yv * w;
            }
        }
    }
}
