//! Top-k expert routing for mixture-of-experts layers.

use crate::softmax::{sigmoid_f64, softmax_f64};
use crate::top_k::libstdcxx_top_k;
use crate::{OpsError, check_len};

/// Which experts [`route_with`] picks where selection scores tie across
/// the `k`-th place (the chosen are listed highest first either way, equal
/// scores by index).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TieOrder {
    /// The lower index wins (a stable sort by score): what [`route`] does,
    /// and what the families' host paths and their goldens were built on.
    #[default]
    LowerIndex,
    /// llama.cpp's CPU `top_k` (`std::partial_sort`): the members
    /// libstdc++'s `__heap_select` keeps ([`libstdcxx_top_k`]), then sorted
    /// by score. The device op layer's `route` picks these.
    Libstdcxx,
}

/// How router logits become per-expert probabilities.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    /// Softmax over all experts (Qwen-style MoE).
    Softmax,
    /// Independent sigmoids (DeepSeek-V3 / GLM-style MoE).
    Sigmoid,
}

/// A router's configuration.
#[derive(Clone, Copy, Debug)]
pub struct Routing<'a> {
    /// Logits to probabilities.
    pub gating: Gating,
    /// Experts chosen per token.
    pub k: usize,
    /// A per-expert bias added to the probabilities for *selection only*
    /// (`exp_probs_b`); the mixing weights stay unbiased.
    pub bias: Option<&'a [f32]>,
    /// Divide the chosen weights by their sum (`expert_weights_norm`, or
    /// "renormalize" after a softmax top-k).
    pub normalize: bool,
    /// Multiply the (normalized) weights by this (`expert_weights_scale`;
    /// 1.0 for none).
    pub scale: f32,
}

/// One chosen expert and its mixing weight.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ExpertChoice {
    /// Index of the expert.
    pub expert: usize,
    /// Weight of its output in the mix.
    pub weight: f32,
}

/// Chooses `k` experts for one token from its router `logits` (one per
/// expert), as llama.cpp's `build_moe_ffn` does:
///
/// 1. `p = softmax(logits)` or `p = sigmoid(logits)`, computed in `f64` and
///    rounded to `f32`;
/// 2. selection scores `p + bias` (in `f32`; `p` without a bias);
/// 3. the `k` highest selection scores, highest first, ties to the lower
///    index ([`TieOrder::LowerIndex`]; [`route_with`] takes the other);
/// 4. weights `p` of the chosen (unbiased); if `normalize`, divided by
///    their sum (summed in `f64`, rounded, then an `f32` division; a zero
///    sum leaves them as is); then multiplied by `scale`.
///
/// Softmax-then-top-k with renormalization equals a softmax over the top-k
/// logits. NaN logits or biases are an error.
pub fn route(logits: &[f32], routing: &Routing<'_>) -> Result<Vec<ExpertChoice>, OpsError> {
    route_with(logits, routing, TieOrder::LowerIndex)
}

/// [`route`] with the experts picked at a tie on the `k`-th place as
/// `ties` says; the steps are otherwise the same. The chosen are listed
/// highest selection score first, equal scores by index.
///
/// # Errors
///
/// As [`route`].
pub fn route_with(
    logits: &[f32],
    routing: &Routing<'_>,
    ties: TieOrder,
) -> Result<Vec<ExpertChoice>, OpsError> {
    // `k` and the bias's length are route_probs' to check.
    let any_nan = logits
        .iter()
        .chain(routing.bias.unwrap_or(&[]))
        .any(|v| v.is_nan());
    if any_nan {
        return Err(OpsError::Invalid("route: NaN in logits or bias".into()));
    }

    let mut p: Vec<f64> = logits.iter().map(|&v| f64::from(v)).collect();
    match routing.gating {
        Gating::Softmax => softmax_f64(&mut p),
        Gating::Sigmoid => p.iter_mut().for_each(|v| *v = sigmoid_f64(*v)),
    }
    let p: Vec<f32> = p.into_iter().map(|v| v as f32).collect();
    route_probs(p, routing, ties)
}

/// Steps 2-4 of [`route`] (selection, ties as `ties` says, weights) over
/// probabilities `p` a caller formed itself (ggml's `f32` softmax, say).
///
/// # Errors
///
/// `k` is 0 or past the experts, or the bias is not one per expert.
pub fn route_probs(
    p: Vec<f32>,
    routing: &Routing<'_>,
    ties: TieOrder,
) -> Result<Vec<ExpertChoice>, OpsError> {
    let n = p.len();
    if routing.k == 0 || routing.k > n {
        return Err(OpsError::Invalid(format!(
            "route: k = {} of {n} experts",
            routing.k
        )));
    }
    if let Some(b) = routing.bias {
        check_len("route bias", n, b.len())?;
    }
    let select: Vec<f32> = match routing.bias {
        Some(b) => p.iter().zip(b).map(|(&p, &b)| p + b).collect(),
        None => p.clone(),
    };

    let mut order: Vec<usize> = match ties {
        TieOrder::LowerIndex => (0..n).collect(),
        TieOrder::Libstdcxx => {
            // No NaN (refused above), and no -0.0 among sums of
            // non-negative probabilities and a bias: `>` in f64 orders the
            // scores as in f32.
            let scores: Vec<f64> = select.iter().map(|&v| f64::from(v)).collect();
            let mut members = libstdcxx_top_k(&scores, routing.k);
            members.sort_unstable();
            members
        }
    };
    // Stable sort: equal scores keep index order.
    order.sort_by(|&a, &b| select[b].total_cmp(&select[a]));
    order.truncate(routing.k);

    let mut chosen: Vec<ExpertChoice> = order
        .into_iter()
        .map(|e| ExpertChoice {
            expert: e,
            weight: p[e],
        })
        .collect();
    if routing.normalize {
        let sum = chosen.iter().map(|c| f64::from(c.weight)).sum::<f64>() as f32;
        if sum != 0.0 {
            chosen.iter_mut().for_each(|c| c.weight /= sum);
        }
    }
    chosen.iter_mut().for_each(|c| c.weight *= routing.scale);
    Ok(chosen)
}

/// The mix of the chosen experts' outputs: `out[c] = Σ_t weights[t] ·
/// outputs[t][c]` (`outputs` is `[k][cols]`, one row per chosen expert, in
/// the order chosen), each product and the sum (over `t` ascending) in
/// `f64`, rounded once.
///
/// # Errors
///
/// `outputs` is not `weights.len()` rows of `out.len()`.
pub fn mix_experts(outputs: &[f32], weights: &[f32], out: &mut [f32]) -> Result<(), OpsError> {
    let cols = out.len();
    check_len("mix_experts outputs", weights.len() * cols, outputs.len())?;
    for (c, o) in out.iter_mut().enumerate() {
        let mut acc = 0f64;
        for (t, &w) in weights.iter().enumerate() {
            acc += f64::from(w) * f64::from(outputs[t * cols + c]);
        }
        *o = acc as f32;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(gating: Gating, k: usize) -> Routing<'static> {
        Routing {
            gating,
            k,
            bias: None,
            normalize: false,
            scale: 1.0,
        }
    }

    #[test]
    fn softmax_topk_renormalized_hand_checked() {
        // logits ln 1, ln 2, ln 3, ln 4: softmax 0.1 0.2 0.3 0.4; top 2 =
        // experts 3 and 2, renormalized 4/7 and 3/7.
        let logits: Vec<f32> = [1f32, 2.0, 3.0, 4.0].iter().map(|v| v.ln()).collect();
        let r = route(&logits, &plain(Gating::Softmax, 2)).unwrap();
        assert_eq!(r.iter().map(|c| c.expert).collect::<Vec<_>>(), [3, 2]);
        assert!((r[0].weight - 0.4).abs() < 1e-7 && (r[1].weight - 0.3).abs() < 1e-7);
        let r = route(
            &logits,
            &Routing {
                normalize: true,
                ..plain(Gating::Softmax, 2)
            },
        )
        .unwrap();
        assert!((r[0].weight - 4.0 / 7.0).abs() < 1e-7);
        assert!((r[1].weight - 3.0 / 7.0).abs() < 1e-7);
        // k = all, renormalized: the plain softmax.
        let r = route(
            &logits,
            &Routing {
                normalize: true,
                ..plain(Gating::Softmax, 4)
            },
        )
        .unwrap();
        let total: f32 = r.iter().map(|c| c.weight).sum();
        assert!((total - 1.0).abs() < 1e-6);
    }

    #[test]
    fn sigmoid_bias_selects_but_does_not_weigh() {
        // sigmoid(0) = 0.5, sigmoid(1) ≈ 0.731, sigmoid(-1) ≈ 0.269.
        let logits = [0.0f32, 1.0, -1.0];
        // Selection scores 0.5, 0.231, 0.869: the bias lifts expert 2 to the
        // top and drops expert 1 out.
        let bias = [0.0f32, -0.5, 0.6];
        let routing = Routing {
            gating: Gating::Sigmoid,
            k: 2,
            bias: Some(&bias),
            normalize: true,
            scale: 2.5,
        };
        let r = route(&logits, &routing).unwrap();
        assert_eq!(r.iter().map(|c| c.expert).collect::<Vec<_>>(), [2, 0]);
        let s = |x: f64| 1.0 / (1.0 + (-x).exp());
        let (w2, w0) = (s(-1.0), s(0.0));
        let want = [2.5 * w2 / (w2 + w0), 2.5 * w0 / (w2 + w0)];
        for (c, w) in r.iter().zip(want) {
            assert!(
                (f64::from(c.weight) - w).abs() < 1e-6,
                "{} vs {w}",
                c.weight
            );
        }
        // Without the bias: experts 1 and 0, weights unnormalized x 2.5.
        let r = route(
            &logits,
            &Routing {
                bias: None,
                normalize: false,
                ..routing
            },
        )
        .unwrap();
        assert_eq!(r.iter().map(|c| c.expert).collect::<Vec<_>>(), [1, 0]);
        assert!((f64::from(r[0].weight) - 2.5 * s(1.0)).abs() < 1e-6);
        assert_eq!(r[1].weight, 1.25);
    }

    #[test]
    fn matches_naive_f64_and_breaks_ties_by_index() {
        let n = 16;
        let logits: Vec<f32> = (0..n).map(|i| ((i * 7) % 11) as f32 * 0.4 - 2.0).collect();
        let r = route(
            &logits,
            &Routing {
                normalize: true,
                ..plain(Gating::Softmax, 5)
            },
        )
        .unwrap();
        // Naive: sort indices by logit (stable), softmax over the top 5.
        let mut idx: Vec<usize> = (0..n).collect();
        idx.sort_by(|&a, &b| logits[b].partial_cmp(&logits[a]).unwrap());
        let top = &idx[..5];
        let z: f64 = top.iter().map(|&i| f64::from(logits[i]).exp()).sum();
        for (c, &i) in r.iter().zip(top) {
            assert_eq!(c.expert, i);
            let w = f64::from(logits[i]).exp() / z;
            assert!((f64::from(c.weight) - w).abs() < 1e-6);
        }
        // Equal logits: lowest indices first.
        let r = route(&[1.0; 4], &plain(Gating::Sigmoid, 2)).unwrap();
        assert_eq!(r.iter().map(|c| c.expert).collect::<Vec<_>>(), [0, 1]);
    }

    /// The rows of qwen4_exp's `top_k_tie_order` oracle test as softmax
    /// logits (equal logits give equal probabilities): the libstdc++ pick
    /// is that test's set, the lower-index pick another where the tie
    /// straddles the k-th place.
    #[test]
    fn libstdcxx_ties_pick_the_heap_select_members() {
        let ninf = f32::NEG_INFINITY;
        let cases: [(&[f32], usize, &[usize], bool); 3] = [
            (
                &[2.0, 2.0, 2.0, 2.0, 1.0, 1.0, 1.0, 1.0, 5.0, 5.0, ninf],
                7,
                &[0, 1, 2, 3, 4, 8, 9],
                false,
            ),
            (
                &[1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 5.0, 5.0, ninf],
                7,
                &[0, 1, 3, 4, 5, 8, 9],
                true,
            ),
            (&[1.0; 10], 3, &[0, 1, 2], false),
        ];
        for (logits, k, want, differs) in cases {
            for gating in [Gating::Softmax, Gating::Sigmoid] {
                let r = route_with(logits, &plain(gating, k), TieOrder::Libstdcxx).unwrap();
                let ids: Vec<usize> = r.iter().map(|c| c.expert).collect();
                // Highest first, equal scores by index.
                let mut set = ids.clone();
                set.sort_unstable();
                assert_eq!(set, want, "{gating:?} top {k} of {logits:?}");
                let mut by_score = ids.clone();
                by_score.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
                assert_eq!(ids, by_score);
                let low = route(logits, &plain(gating, k)).unwrap();
                let mut low: Vec<usize> = low.iter().map(|c| c.expert).collect();
                low.sort_unstable();
                assert_eq!(low != want, differs, "{gating:?} top {k} of {logits:?}");
            }
        }
        // Without ties both rules agree.
        let logits: Vec<f32> = (0..16).map(|i| ((i * 7) % 16) as f32 * 0.3).collect();
        for k in 1..=16 {
            let a = route_with(&logits, &plain(Gating::Softmax, k), TieOrder::Libstdcxx).unwrap();
            let b = route(&logits, &plain(Gating::Softmax, k)).unwrap();
            assert_eq!(a, b);
        }
    }

    #[test]
    fn bad_arguments() {
        assert!(route(&[0.0; 3], &plain(Gating::Softmax, 0)).is_err());
        assert!(route(&[0.0; 3], &plain(Gating::Softmax, 4)).is_err());
        assert!(route(&[0.0, f32::NAN], &plain(Gating::Softmax, 1)).is_err());
        let bias = [0.0; 2];
        let r = Routing {
            bias: Some(&bias),
            ..plain(Gating::Sigmoid, 1)
        };
        assert!(route(&[0.0; 3], &r).is_err());
    }

    #[test]
    fn mix_experts_hand_checked() {
        let outputs = [1.0, 2.0, 10.0, 20.0, -4.0, 0.5];
        let mut out = [0.0; 2];
        mix_experts(&outputs, &[0.5, 0.25, 1.0], &mut out).unwrap();
        assert_eq!(out, [0.5 + 2.5 - 4.0, 1.0 + 5.0 + 0.5]);
        assert!(mix_experts(&outputs[..5], &[0.5, 0.25, 1.0], &mut out).is_err());
        mix_experts(&[], &[], &mut []).unwrap();
    }
}
