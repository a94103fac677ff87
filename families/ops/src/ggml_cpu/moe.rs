//! llama.cpp's expert routing and mixing (`llm_graph_context::
//! build_moe_ffn`) in ggml's `f32` ops.

use super::{sigmoid, soft_max};

/// The experts a token picks and their weights, as `build_moe_ffn` with
/// sigmoid gating forms them: `probs = sigmoid(logits)` (ggml's unary op),
/// the selection scores `probs + bias`, then [`pick`].
pub fn route_sigmoid(
    logits: &[f32],
    bias: Option<&[f32]>,
    k: usize,
    normalize: bool,
    scale: f32,
) -> Vec<(usize, f32)> {
    let probs: Vec<f32> = logits.iter().map(|&l| sigmoid(l)).collect();
    let select: Vec<f32> = match bias {
        Some(b) => probs.iter().zip(b).map(|(&p, &b)| p + b).collect(),
        None => probs.clone(),
    };
    pick(&probs, &select, k, normalize, scale)
}

/// The experts a token picks and their weights, as `build_moe_ffn` with
/// softmax gating forms them: `probs = soft_max(logits)` ([`soft_max`],
/// scale 1, no mask), selected by `probs` themselves, then [`pick`].
pub fn route_softmax(logits: &[f32], k: usize, normalize: bool, scale: f32) -> Vec<(usize, f32)> {
    let mut probs = logits.to_vec();
    soft_max(&mut probs, 1.0, None).expect("no mask to mismatch");
    pick(&probs, &probs, k, normalize, scale)
}

/// `build_moe_ffn`'s selection and weights: `ggml_argsort_top_k` of
/// `select` (descending; `std::sort` of so few is an insertion sort, so
/// ties keep the lower index first), the weights `probs` of the picked;
/// with `normalize` divided by their `ggml_sum_rows` (an `f64` sum rounded
/// to `f32`) clamped below at 2^-14; times `scale` unless it is 0 or 1.
/// Returns `(expert, weight)` in the picked order.
pub fn pick(
    probs: &[f32],
    select: &[f32],
    k: usize,
    normalize: bool,
    scale: f32,
) -> Vec<(usize, f32)> {
    let mut order: Vec<usize> = (0..probs.len()).collect();
    order.sort_by(|&a, &b| select[b].total_cmp(&select[a]));
    order.truncate(k);
    let mut picked: Vec<(usize, f32)> = order.into_iter().map(|e| (e, probs[e])).collect();
    if normalize {
        let sum = picked.iter().map(|&(_, w)| f64::from(w)).sum::<f64>() as f32;
        let sum = sum.max(6.103_515_6e-5);
        picked.iter_mut().for_each(|(_, w)| *w /= sum);
    }
    if scale != 0.0 && scale != 1.0 {
        picked.iter_mut().for_each(|(_, w)| *w *= scale);
    }
    picked
}

/// `build_moe_ffn`'s aggregate: each expert's output times its weight
/// (`ggml_mul`), then `ggml_add` of the products in the picked order.
/// `outputs` holds one row per picked expert; `out` gets the sum.
pub fn mix(outputs: &[Vec<f32>], weights: &[f32], out: &mut [f32]) {
    out.fill(0.0);
    for (i, (y, &w)) in outputs.iter().zip(weights).enumerate() {
        for (o, &v) in out.iter_mut().zip(y) {
            let p = v * w;
            *o = if i == 0 { p } else { *o + p };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_picks_by_biased_score_and_weighs_unbiased() {
        let logits = [0.5f32, -1.0, 2.0, 0.25];
        let bias = [0.0f32, 2.0, 0.0, 0.0];
        let p: Vec<f32> = logits.iter().map(|&l| sigmoid(l)).collect();
        // Expert 1 is picked for its bias, weighed by its own sigmoid.
        let picked = route_sigmoid(&logits, Some(&bias), 2, false, 1.0);
        assert_eq!(picked, vec![(1, p[1]), (2, p[2])]);
        let sum = (f64::from(p[1]) + f64::from(p[2])) as f32;
        let normed = route_sigmoid(&logits, Some(&bias), 2, true, 2.5);
        assert_eq!(normed, vec![(1, p[1] / sum * 2.5), (2, p[2] / sum * 2.5)]);
        // Ties keep the lower index first.
        let tied = route_sigmoid(&[1.0, 1.0, 1.0], None, 2, false, 0.0);
        assert_eq!(tied.iter().map(|t| t.0).collect::<Vec<_>>(), [0, 1]);
        // A zero sum is clamped, not divided by.
        let zero = route_sigmoid(&[-200.0, -200.0], None, 2, true, 1.0);
        assert!(zero.iter().all(|t| t.1 == 0.0));
    }

    #[test]
    fn softmax_routing_weighs_the_picked_by_their_probabilities() {
        let logits = [0.5f32, -1.0, 2.0, 0.25];
        let mut p = logits.to_vec();
        soft_max(&mut p, 1.0, None).unwrap();
        let picked = route_softmax(&logits, 2, false, 0.0);
        assert_eq!(picked, vec![(2, p[2]), (0, p[0])]);
        let sum = (f64::from(p[2]) + f64::from(p[0])) as f32;
        let normed = route_softmax(&logits, 2, true, 0.0);
        assert_eq!(normed, vec![(2, p[2] / sum), (0, p[0] / sum)]);
    }

    #[test]
    fn mix_weighs_then_adds_in_the_picked_order() {
        let outs = vec![vec![1.0f32, 3.0], vec![0.1, 1e8]];
        let mut out = [9.0f32; 2];
        mix(&outs, &[0.3, 1e-8], &mut out);
        assert_eq!(out, [1.0 * 0.3 + 0.1 * 1e-8, 3.0 * 0.3 + 1e8 * 1e-8]);
    }
}
