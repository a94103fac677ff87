//! MoE with a sigmoid-gated shared expert (spec section 9;
//! `build_layer_ffn`, `llm_graph_context::build_moe_ffn`).

use std::collections::HashMap;

use family_ops::ggml_cpu::{self, Ubatch, moe};

use super::hyper::Hyper;
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
    fn expert_scale(&self, base: &str, e: usize) -> Option<f32> {
        self.opt(&format!("{base}.scale"))
            .and_then(|s| s.get(e).copied())
    }

    /// The experts token `x` picks in layer `il` and their weights
    /// (`build_moe_ffn`'s softmax gating, normalized weights).
    pub(super) fn route(&self, il: usize, b: &str, x: &[f32], ub: Ubatch) -> Vec<(usize, f32)> {
        let hp = &self.hp;
        let logits = self.mv(&format!("{b}ffn_gate_inp.weight"), x, ub);
        moe::route_softmax(&logits, hp.n_expert_used[il], true, hp.expert_weights_scale)
    }

    /// MoE output for one token of layer `il` (`b` = `blk.N.`) that picked
    /// `picked`: each expert's rows as `mul_mat_id` computes them (the
    /// kernel of the `counts[e]` tokens of the ubatch that picked expert
    /// `e`), mixed in the picked order, then the shared expert gated by
    /// `sigmoid(gate_inp_shexp · x)`.
    pub(super) fn moe(
        &self,
        il: usize,
        b: &str,
        x: &[f32],
        picked: &[(usize, f32)],
        counts: &HashMap<usize, usize>,
        ub: Ubatch,
    ) -> Vec<f32> {
        let hp = &self.hp;
        let (n_ff, _, fused) = expert_dims(&self.w, b).expect("checked in Model::new");
        let gate_b = format!("{b}ffn_gate_exps");
        let up_b = format!("{b}ffn_up_exps");
        let down_b = format!("{b}ffn_down_exps");
        let scaled = |mut y: Vec<f32>, s: Option<f32>| {
            if let Some(s) = s {
                y.iter_mut().for_each(|v| *v *= s);
            }
            y
        };
        let mut outputs = Vec::with_capacity(picked.len());
        for &(e, _) in picked {
            let eub = Ubatch::expert(counts.get(&e).copied().unwrap_or(1));
            // A merged stack has one scale for its gate and up rows.
            let (gate_s, up_s) = if fused {
                (self.expert_scale(&up_b, e), self.expert_scale(&up_b, e))
            } else {
                (self.expert_scale(&gate_b, e), self.expert_scale(&up_b, e))
            };
            let gt = scaled(self.expert_mv(il, ExpertKind::Gate, e, x, eub), gate_s);
            let up = scaled(self.expert_mv(il, ExpertKind::Up, e, x, eub), up_s);
            debug_assert_eq!(gt.len(), n_ff);
            let mut act = vec![0f32; n_ff];
            ggml_cpu::swiglu(&gt, &up, &mut act).expect("gate and up of n_ff");
            outputs.push(scaled(
                self.expert_mv(il, ExpertKind::Down, e, &act, eub),
                self.expert_scale(&down_b, e),
            ));
        }
        let weights: Vec<f32> = picked.iter().map(|&(_, w)| w).collect();
        let mut out = vec![0f32; hp.n_embd];
        moe::mix(&outputs, &weights, &mut out);

        let up = self.mm_scaled(&format!("{b}ffn_up_shexp"), x, ub);
        let gt = self.mm_scaled(&format!("{b}ffn_gate_shexp"), x, ub);
        let mut act = vec![0f32; gt.len()];
        ggml_cpu::swiglu(&gt, &up, &mut act).expect("shared gate and up alike");
        let sh = self.mm_scaled(&format!("{b}ffn_down_shexp"), &act, ub);
        let gsh = self.mv(&format!("{b}ffn_gate_inp_shexp.weight"), x, ub);
        let gsh = ggml_cpu::sigmoid(gsh[0]);
        for (o, &s) in out.iter_mut().zip(&sh) {
            *o += s * gsh;
        }
        out
    }
}
