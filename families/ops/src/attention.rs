//! Scaled dot-product attention for one query over a K/V cache.

use crate::softmax::softmax_f64;
use crate::{OpsError, check_len};

/// Head counts and sizes of an attention layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads; divides `n_head`. Query head `h` reads K/V head
    /// `h / (n_head / n_head_kv)` (GQA: consecutive query heads share a K/V
    /// head, as ggml's broadcast and HF's `repeat_kv` do).
    pub n_head_kv: usize,
    /// Size of a query/key head.
    pub head_dim_k: usize,
    /// Size of a value head (and of an output head).
    pub head_dim_v: usize,
}

/// Which cached positions the query may attend to. The cache slot `j`
/// holds the token at position `j`.
#[derive(Clone, Copy, Debug)]
pub enum Mask<'a> {
    /// Every slot (a non-causal block, an encoder).
    All,
    /// Slots at or before the query's position: `j <= query_pos`.
    Causal {
        /// The query token's position.
        query_pos: usize,
    },
    /// Causal and within the last `window` positions:
    /// `j <= query_pos && query_pos - j < window` (llama.cpp's standard
    /// sliding window and HF's `sliding_window` agree on this).
    SlidingWindow {
        /// The query token's position.
        query_pos: usize,
        /// Window length, the query's own position included.
        window: usize,
    },
    /// An explicit mask, one entry per cache slot: `true` = visible.
    Explicit(&'a [bool]),
    /// An additive mask, one entry per cache slot, added to the slot's
    /// score after the scale (and the softcap); `-inf` hides the slot
    /// (ggml's `soft_max_ext` mask, llama.cpp's `kq_mask`).
    Additive(&'a [f32]),
}

impl Mask<'_> {
    fn visible(&self, j: usize) -> bool {
        match *self {
            Mask::All => true,
            Mask::Causal { query_pos } => j <= query_pos,
            Mask::SlidingWindow { query_pos, window } => j <= query_pos && query_pos - j < window,
            Mask::Explicit(m) => m[j],
            Mask::Additive(m) => m[j] != f32::NEG_INFINITY,
        }
    }

    /// What the mask adds to slot `j`'s score.
    fn bias(&self, j: usize) -> f64 {
        match *self {
            Mask::Additive(m) => f64::from(m[j]),
            _ => 0.0,
        }
    }
}

/// How a query-key dot product becomes a score.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scores {
    /// The factor of the dot product (usually `1 / sqrt(head_dim_k)`).
    pub scale: f32,
    /// The logit softcap `c`: the scaled dot `s` becomes `c · tanh(s /
    /// c)` (ggml's `flash_attn_ext` `logit_softcap`, Gemma 2), before the
    /// mask is added; `None` for none.
    pub softcap: Option<f32>,
}

impl Scores {
    /// The scale alone.
    pub fn scale(scale: f32) -> Scores {
        Scores {
            scale,
            softcap: None,
        }
    }

    /// The score of a dot product `qk` (in `f64`).
    pub fn of(&self, qk: f64) -> f64 {
        let s = f64::from(self.scale) * qk;
        match self.softcap {
            Some(c) => f64::from(c) * (s / f64::from(c)).tanh(),
            None => s,
        }
    }
}
/// Checks an attention call's lengths against `shape` (the layouts of
/// [`attention`]) and returns the number of cache slots in `k`.
///
/// # Errors
///
/// The shape does not divide or a length does not fit.
pub(crate) fn checked_cache_len(
    shape: &AttentionShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &[f32],
) -> Result<usize, OpsError> {
    let AttentionShape {
        n_head,
        n_head_kv,
        head_dim_k: dk,
        head_dim_v: dv,
    } = *shape;
    if n_head == 0 || n_head_kv == 0 || dk == 0 || dv == 0 || !n_head.is_multiple_of(n_head_kv) {
        return Err(OpsError::Invalid(format!(
            "attention: {n_head} query heads over {n_head_kv} K/V heads of {dk}/{dv}"
        )));
    }
    let (k_slot, v_slot) = (n_head_kv * dk, n_head_kv * dv);
    if !k.len().is_multiple_of(k_slot) {
        return Err(OpsError::Invalid(format!(
            "attention: {} key values are not whole slots of {k_slot}",
            k.len()
        )));
    }
    let n_kv = k.len() / k_slot;
    check_len("attention q", n_head * dk, q.len())?;
    check_len("attention v", n_kv * v_slot, v.len())?;
    check_len("attention out", n_head * dv, out.len())?;
    Ok(n_kv)
}

/// `out_h = Σ_j softmax_j(scale · q_h · k_{j,g(h)}) · v_{j,g(h)}` for each
/// query head `h`, over the visible cache slots.
///
/// Layouts (row-major): `q` is `[n_head][head_dim_k]`; `k` is
/// `[n_kv][n_head_kv][head_dim_k]` and `v` is `[n_kv][n_head_kv][head_dim_v]`
/// (one cache slot after another, every head of a slot together); `out` is
/// `[n_head][head_dim_v]`. `n_kv` is read off `k`'s length.
///
/// Scores, softmax and the weighted sum run in `f64`, rounded once. A head
/// with no visible slot gets zeros (not NaN).
pub fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    shape: &AttentionShape,
    scale: f32,
    mask: Mask<'_>,
    out: &mut [f32],
) -> Result<(), OpsError> {
    attention_scored(q, k, v, shape, &Scores::scale(scale), mask, out)
}

/// [`attention`] with the scores of `scores` (a scale and an optional
/// softcap): slot `j`'s score is `scores.of(q_h · k_j)` plus what the mask
/// adds (an additive mask's entry, else 0).
pub fn attention_scored(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    shape: &AttentionShape,
    scores_of: &Scores,
    mask: Mask<'_>,
    out: &mut [f32],
) -> Result<(), OpsError> {
    let AttentionShape {
        n_head,
        n_head_kv,
        head_dim_k: dk,
        head_dim_v: dv,
    } = *shape;
    let n_kv = checked_cache_len(shape, q, k, v, out)?;
    let (k_slot, v_slot) = (n_head_kv * dk, n_head_kv * dv);
    match mask {
        Mask::Explicit(m) => check_len("attention mask", n_kv, m.len())?,
        Mask::Additive(m) => check_len("attention mask", n_kv, m.len())?,
        _ => {}
    }
    if let Some(c) = scores_of.softcap
        && !(c.is_finite() && c > 0.0)
    {
        return Err(OpsError::Invalid(format!("attention: softcap {c}")));
    }

    let group = n_head / n_head_kv;
    let visible: Vec<usize> = (0..n_kv).filter(|&j| mask.visible(j)).collect();
    let mut scores = vec![0f64; visible.len()];
    let mut acc = vec![0f64; dv];
    for (h, (qh, oh)) in q.chunks_exact(dk).zip(out.chunks_exact_mut(dv)).enumerate() {
        let g = h / group;
        for (s, &j) in scores.iter_mut().zip(&visible) {
            let kj = &k[j * k_slot + g * dk..][..dk];
            *s = scores_of.of(crate::dot_f64(qh, kj)) + mask.bias(j);
        }
        softmax_f64(&mut scores);
        acc.fill(0.0);
        for (&p, &j) in scores.iter().zip(&visible) {
            let vj = &v[j * v_slot + g * dv..][..dv];
            for (a, &x) in acc.iter_mut().zip(vj) {
                *a += p * f64::from(x);
            }
        }
        for (o, a) in oh.iter_mut().zip(&acc) {
            *o = *a as f32;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Naive f64 reference with the GQA mapping written out per head and
    /// the mask as a predicate on (query position, key position).
    fn naive(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        s: &AttentionShape,
        n_kv: usize,
        scale: f64,
        visible: impl Fn(usize) -> bool,
    ) -> Vec<f64> {
        let mut out = vec![0.0; s.n_head * s.head_dim_v];
        for h in 0..s.n_head {
            let kvh = h * s.n_head_kv / s.n_head;
            let mut logits = Vec::new();
            for j in (0..n_kv).filter(|&j| visible(j)) {
                let mut d = 0.0;
                for i in 0..s.head_dim_k {
                    d += f64::from(q[h * s.head_dim_k + i])
                        * f64::from(k[(j * s.n_head_kv + kvh) * s.head_dim_k + i]);
                }
                logits.push((j, d * scale));
            }
            let m = logits.iter().map(|l| l.1).fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = logits.iter().map(|l| (l.1 - m).exp()).sum();
            for &(j, l) in &logits {
                let p = (l - m).exp() / z;
                for i in 0..s.head_dim_v {
                    out[h * s.head_dim_v + i] +=
                        p * f64::from(v[(j * s.n_head_kv + kvh) * s.head_dim_v + i]);
                }
            }
        }
        out
    }

    fn data(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 37 + seed * 11) % 53) as f32 / 13.0 - 2.0)
            .collect()
    }

    fn close(got: &[f32], want: &[f64]) {
        for (g, w) in got.iter().zip(want) {
            assert!(
                (f64::from(*g) - w).abs() <= 1e-6 * w.abs().max(1.0),
                "{g} vs {w}"
            );
        }
    }

    #[test]
    fn gqa_with_every_mask_matches_naive() {
        let s = AttentionShape {
            n_head: 6,
            n_head_kv: 2,
            head_dim_k: 8,
            head_dim_v: 5,
        };
        let n_kv = 9;
        let q = data(s.n_head * s.head_dim_k, 1);
        let k = data(n_kv * s.n_head_kv * s.head_dim_k, 2);
        let v = data(n_kv * s.n_head_kv * s.head_dim_v, 3);
        let scale = 1.0 / (s.head_dim_k as f32).sqrt();
        let explicit = [true, false, true, true, false, false, true, false, true];
        type Visible = Box<dyn Fn(usize) -> bool>;
        let cases: Vec<(Mask, Visible)> = vec![
            (Mask::All, Box::new(|_| true)),
            (Mask::Causal { query_pos: 5 }, Box::new(|j| j <= 5)),
            (
                Mask::SlidingWindow {
                    query_pos: 7,
                    window: 3,
                },
                Box::new(|j| (5..=7).contains(&j)),
            ),
            (Mask::Explicit(&explicit), Box::new(move |j| explicit[j])),
        ];
        for (mask, pred) in cases {
            let mut out = vec![0f32; s.n_head * s.head_dim_v];
            attention(&q, &k, &v, &s, scale, mask, &mut out).unwrap();
            close(&out, &naive(&q, &k, &v, &s, n_kv, f64::from(scale), pred));
        }
    }

    #[test]
    fn hand_checked() {
        // One head, two slots; q·k = 0 and ln 3: weights 1/4 and 3/4.
        let s = AttentionShape {
            n_head: 1,
            n_head_kv: 1,
            head_dim_k: 1,
            head_dim_v: 2,
        };
        let q = [1.0];
        let k = [0.0, 3f32.ln()];
        let v = [4.0, 0.0, 0.0, 8.0];
        let mut out = [0.0; 2];
        attention(&q, &k, &v, &s, 1.0, Mask::All, &mut out).unwrap();
        close(&out, &[1.0, 6.0]);
        // Causal at position 0 sees only slot 0.
        attention(&q, &k, &v, &s, 1.0, Mask::Causal { query_pos: 0 }, &mut out).unwrap();
        assert_eq!(out, [4.0, 0.0]);
        // A window of 0 sees nothing: zeros.
        let w0 = Mask::SlidingWindow {
            query_pos: 1,
            window: 0,
        };
        attention(&q, &k, &v, &s, 1.0, w0, &mut out).unwrap();
        assert_eq!(out, [0.0, 0.0]);
        // Two query heads sharing one K/V head see the same keys.
        let s2 = AttentionShape { n_head: 2, ..s };
        let mut out2 = [0.0; 4];
        attention(&[1.0, 1.0], &k, &v, &s2, 1.0, Mask::All, &mut out2).unwrap();
        assert_eq!(out2[..2], out2[2..]);
    }

    #[test]
    fn shapes_are_checked() {
        let s = AttentionShape {
            n_head: 3,
            n_head_kv: 2,
            head_dim_k: 2,
            head_dim_v: 2,
        };
        let mut out = [0.0; 6];
        assert!(
            attention(
                &[0.0; 6],
                &[0.0; 8],
                &[0.0; 8],
                &s,
                1.0,
                Mask::All,
                &mut out
            )
            .is_err()
        );
        let s = AttentionShape { n_head: 2, ..s };
        let mut out = [0.0; 4];
        assert!(
            attention(
                &[0.0; 4],
                &[0.0; 7],
                &[0.0; 8],
                &s,
                1.0,
                Mask::All,
                &mut out
            )
            .is_err()
        );
        assert!(
            attention(
                &[0.0; 4],
                &[0.0; 8],
                &[0.0; 6],
                &s,
                1.0,
                Mask::All,
                &mut out
            )
            .is_err()
        );
        let m = [true; 3];
        assert!(
            attention(
                &[0.0; 4],
                &[0.0; 8],
                &[0.0; 8],
                &s,
                1.0,
                Mask::Explicit(&m),
                &mut out
            )
            .is_err()
        );
        attention(
            &[0.0; 4],
            &[0.0; 8],
            &[0.0; 8],
            &s,
            1.0,
            Mask::All,
            &mut out,
        )
        .unwrap();
    }

    #[test]
    fn additive_masks_and_softcap_match_naive() {
        let s = AttentionShape {
            n_head: 4,
            n_head_kv: 2,
            head_dim_k: 6,
            head_dim_v: 3,
        };
        let n_kv = 7;
        let q = data(s.n_head * s.head_dim_k, 4);
        let k = data(n_kv * s.n_head_kv * s.head_dim_k, 5);
        let v = data(n_kv * s.n_head_kv * s.head_dim_v, 6);
        let add = [
            0.0,
            f32::NEG_INFINITY,
            -1.5,
            0.25,
            f32::NEG_INFINITY,
            2.0,
            0.0,
        ];
        for softcap in [None, Some(1.5f32)] {
            let scores = Scores {
                scale: 0.4,
                softcap,
            };
            let mut out = vec![0f32; s.n_head * s.head_dim_v];
            attention_scored(&q, &k, &v, &s, &scores, Mask::Additive(&add), &mut out).unwrap();
            // Naive: the capped score plus the mask, softmax over the
            // finite ones.
            let mut want = vec![0f64; out.len()];
            for h in 0..s.n_head {
                let g = h / 2;
                let logits: Vec<(usize, f64)> = (0..n_kv)
                    .filter(|&j| add[j].is_finite())
                    .map(|j| {
                        let mut d = 0.0;
                        for i in 0..s.head_dim_k {
                            d += f64::from(q[h * s.head_dim_k + i])
                                * f64::from(k[(j * 2 + g) * s.head_dim_k + i]);
                        }
                        let sc = 0.4f64 * d;
                        let sc = softcap.map_or(sc, |c| {
                            let c = f64::from(c);
                            c * (sc / c).tanh()
                        });
                        (j, sc + f64::from(add[j]))
                    })
                    .collect();
                let m = logits.iter().map(|l| l.1).fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = logits.iter().map(|l| (l.1 - m).exp()).sum();
                for &(j, l) in &logits {
                    for c in 0..s.head_dim_v {
                        want[h * s.head_dim_v + c] +=
                            (l - m).exp() / z * f64::from(v[(j * 2 + g) * s.head_dim_v + c]);
                    }
                }
            }
            close(&out, &want);
        }
        // The softcap bounds every score: a huge q gives scores within ±c,
        // so no slot takes all the weight.
        let big: Vec<f32> = q.iter().map(|x| x * 1e4).collect();
        let mut capped = vec![0f32; s.n_head * s.head_dim_v];
        let scores = Scores {
            scale: 1.0,
            softcap: Some(0.5),
        };
        attention_scored(&big, &k, &v, &s, &scores, Mask::All, &mut capped).unwrap();
        let mut plain = vec![0f32; capped.len()];
        attention(&big, &k, &v, &s, 1.0, Mask::All, &mut plain).unwrap();
        assert_ne!(capped, plain);
        // A bad softcap and a mask of another length are refused.
        let bad = Scores {
            scale: 1.0,
            softcap: Some(0.0),
        };
        assert!(attention_scored(&q, &k, &v, &s, &bad, Mask::All, &mut plain).is_err());
        assert!(
            attention_scored(
                &q,
                &k,
                &v,
                &s,
                &scores,
                Mask::Additive(&add[1..]),
                &mut plain
            )
            .is_err()
        );
    }
}
