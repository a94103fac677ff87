//! Hyper-connections (spec section 4; `build_hc_mix`, `build_hc_combine`):
//! HC_MIX and HC_COMBINE over `hc` residual streams of E, stored
//! stream-major in one vector.

use family_ops::ggml_cpu::{self, Ubatch};
use family_ops::{NormWeight, rms_norm_in_place};

use super::{Model, Weights};

impl<W: Weights> Model<W> {
    /// HC_MIX with the weights `{pre}_{norm,down,up,inject}.weight`: the
    /// mixed input (E) and, if the block has an inject matrix, the hc
    /// inject logits. Each stream RMS-normed times its gain; `lo =
    /// silu(down · xn / hc)`; `gate = up · lo`; the streams gated and
    /// averaged by the fused `hc_pre`; `inject · xn`.
    pub(super) fn hc_mix(&self, r: &[f32], pre: &str, ub: Ubatch) -> (Vec<f32>, Option<Vec<f32>>) {
        let (e, hc) = (self.hp.n_embd, self.hp.hc);
        let eps = self.hp.eps as f32;
        let norm = self.w(&format!("{pre}_norm.weight"));
        let mut xn = r.to_vec();
        for (x, g) in xn.chunks_exact_mut(e).zip(norm.chunks_exact(e)) {
            rms_norm_in_place(x, eps, NormWeight::Scale(g)).expect("gains checked in Model::new");
        }
        let inv_hc = 1.0 / hc as f32;
        let mut lo = self.mv(&format!("{pre}_down.weight"), &xn, ub);
        lo.iter_mut().for_each(|v| *v *= inv_hc);
        ggml_cpu::silu_row(&mut lo);
        let gate = self.mv(&format!("{pre}_up.weight"), &lo, ub);
        let mut mixed = vec![0f32; e];
        ggml_cpu::hc_pre_gated(&xn, &gate, hc, inv_hc, &mut mixed)
            .expect("hc_up has hc streams of E rows: checked in Model::new");
        let inject = format!("{pre}_inject.weight");
        let inj = self.w.has(&inject).then(|| self.mv(&inject, &xn, ub));
        (mixed, inj)
    }

    /// HC_COMBINE: `R[c] += y · 2·sigmoid(inj[c] / hc)` (the fused
    /// `hc_post`).
    pub(super) fn hc_combine(&self, r: &mut [f32], y: &[f32], inj: &[f32]) {
        let inv_hc = 1.0 / self.hp.hc as f32;
        let w: Vec<f32> = inj
            .iter()
            .map(|&i| ggml_cpu::sigmoid(i * inv_hc) * 2.0)
            .collect();
        ggml_cpu::hc_post(y, r, &w).expect("hc streams of E: checked in Model::new");
    }
}
