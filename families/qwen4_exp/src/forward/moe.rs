//! MoE with a sigmoid-gated shared expert (spec section 9).

use super::hyper::Hyper;
use super::math::{dot_w, sigmoid, silu, softmax};
use super::{ForwardError, Model, Need, Weights};
use crate::model::ExpertKind;

/// Expert stack dims: `(n_ff, n_expert, fused)`. `fused` when the file has
/// one `ffn_gate_up_exps` {E, 2·n_ff, n_expert}.
fn expert_dims<W: Weights>(w: &W, b: &str) -> Option<(usize, usize, bool)> {
    let down = w.dims(&format!("{b}ffn_down_exps.weight"))?;
    if down.len() != 3 {
        return None;
    }
    let (n_ff, n_exp) = (down[0] as usize, down[2] as usize);
    Some((n_ff, n_exp, w.has(&format!("{b}ffn_gate_up_exps.weight"))))
}

pub(super) fn check<W: Weights>(
    w: &W,
    hp: &Hyper,
    il: usize,
    b: &str,
    need: &Need<'_>,
) -> Result<(), ForwardError> {
    let e = hp.n_embd;
    let (n_ff, n_exp, fused) = expert_dims(w, b).ok_or_else(|| ForwardError::Tensor {
        name: format!("{b}ffn_down_exps.weight"),
        why: "missing or not 3-D".into(),
    })?;
    if hp.n_expert_used[il] == 0 || hp.n_expert_used[il] > n_exp {
        return Err(ForwardError::Metadata {
            key: "qwen4exp.expert_used_count".into(),
            why: format!("layer {il}: {} of {n_exp} experts", hp.n_expert_used[il]),
        });
    }
    need(&format!("{b}ffn_gate_inp.weight"), Some(e * n_exp))?;
    need(&format!("{b}ffn_down_exps.weight"), Some(n_ff * e * n_exp))?;
    if fused {
        need(
            &format!("{b}ffn_gate_up_exps.weight"),
            Some(e * 2 * n_ff * n_exp),
        )?;
    } else {
        need(&format!("{b}ffn_gate_exps.weight"), Some(e * n_ff * n_exp))?;
        need(&format!("{b}ffn_up_exps.weight"), Some(e * n_ff * n_exp))?;
    }
    need(&format!("{b}ffn_gate_inp_shexp.weight"), Some(e))?;
    need(&format!("{b}ffn_gate_shexp.weight"), None)?;
    need(&format!("{b}ffn_up_shexp.weight"), None)?;
    need(&format!("{b}ffn_down_shexp.weight"), None)
}

impl<W: Weights> Model<W> {
    /// Per-expert factor `e` of an expert stack's `.scale`, if any.
    fn expert_scale(&self, base: &str, e: usize) -> Option<f64> {
        self.opt(&format!("{base}.scale"))
            .and_then(|s| s.get(e).copied())
            .map(f64::from)
    }

    /// MoE output for one token of layer `il` (`b` = `blk.N.`).
    pub(super) fn moe(&self, il: usize, b: &str, x: &[f64]) -> Vec<f64> {
        let hp = &self.hp;
        let e_dim = hp.n_embd;
        let (n_ff, _, fused) = expert_dims(&self.w, b).expect("checked in Model::new");
        let mut p = self.mv(&format!("{b}ffn_gate_inp.weight"), x);
        softmax(&mut p);
        // Stable argsort, descending (np.argsort(-p, kind="stable")).
        let mut order: Vec<usize> = (0..p.len()).collect();
        order.sort_by(|&a, &c| p[c].total_cmp(&p[a]));
        let sel = &order[..hp.n_expert_used[il]];
        let sum: f64 = sel.iter().map(|&e| p[e]).sum();
        let denom = sum.max(6.103515625e-5);

        let mut out = vec![0.0; e_dim];
        let gate_b = format!("{b}ffn_gate_exps");
        let up_b = format!("{b}ffn_up_exps");
        let down_b = format!("{b}ffn_down_exps");
        for &e in sel {
            let we = p[e] / denom;
            let scaled = |mut y: Vec<f64>, s: Option<f64>| {
                if let Some(s) = s {
                    y.iter_mut().for_each(|v| *v *= s);
                }
                y
            };
            let (gt, up) = if fused {
                // One scale for the merged stack's gate and up rows.
                let s = self.expert_scale(&up_b, e);
                (
                    scaled(self.expert_mv(il, ExpertKind::Gate, e, x), s),
                    scaled(self.expert_mv(il, ExpertKind::Up, e, x), s),
                )
            } else {
                (
                    scaled(
                        self.expert_mv(il, ExpertKind::Gate, e, x),
                        self.expert_scale(&gate_b, e),
                    ),
                    scaled(
                        self.expert_mv(il, ExpertKind::Up, e, x),
                        self.expert_scale(&up_b, e),
                    ),
                )
            };
            debug_assert_eq!(gt.len(), n_ff);
            let act: Vec<f64> = gt.iter().zip(&up).map(|(&g, &u)| silu(g) * u).collect();
            let d = scaled(
                self.expert_mv(il, ExpertKind::Down, e, &act),
                self.expert_scale(&down_b, e),
            );
            for (o, &dv) in out.iter_mut().zip(&d) {
                *o += we * dv;
            }
        }

        let up = self.mm_scaled(&format!("{b}ffn_up_shexp"), x);
        let gt = self.mm_scaled(&format!("{b}ffn_gate_shexp"), x);
        let act: Vec<f64> = gt.iter().zip(&up).map(|(&g, &u)| silu(g) * u).collect();
        let sh = self.mm_scaled(&format!("{b}ffn_down_shexp"), &act);
        let gsh = sigmoid(dot_w(&self.w(&format!("{b}ffn_gate_inp_shexp.weight")), x));
        for (o, &s) in out.iter_mut().zip(&sh) {
            *o += gsh * s;
        }
        out
    }
}
