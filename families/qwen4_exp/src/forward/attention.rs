//! Full attention with QSA block selection (spec section 6), one query at a
//! time over this layer's K/V cache.

use super::hyper::Hyper;
use super::math::{dot, rms, sigmoid, softmax};
use super::rope::{imrope, text_pos};
use super::{ForwardError, Model, Need, Weights};
use family_ops::{CacheType, libstdcxx_top_k};

/// A full-attention layer's cache, one entry per position.
#[derive(Debug, Clone, Default)]
pub(super) struct AttnState {
    /// The element types K and V are stored as (llama.cpp's cache types).
    cache: [CacheType; 2],
    /// Normed, roped keys (n_head_kv · head_dim).
    k: Vec<Vec<f64>>,
    /// Values (n_head_kv · head_dim).
    v: Vec<Vec<f64>>,
    /// QSA indexer keys, raw (idx_dim; no norm, no rope).
    kraw: Vec<Vec<f64>>,
    /// One pooled, normed, roped key per full block.
    pooled: Vec<Vec<f64>>,
}

impl AttnState {
    /// An empty cache whose K and V rows are stored as `cache` says.
    pub(super) fn new(cache: [CacheType; 2]) -> AttnState {
        AttnState {
            cache,
            ..AttnState::default()
        }
    }
}

pub(super) fn check(hp: &Hyper, il: usize, b: &str, need: &Need<'_>) -> Result<(), ForwardError> {
    let (e, hd) = (hp.n_embd, hp.head_dim);
    let (nh, nkv) = (hp.n_head[il], hp.n_head_kv[il]);
    if nh == 0 || nkv == 0 || nh % nkv != 0 {
        return Err(ForwardError::Metadata {
            key: "qwen4exp.attention.head_count_kv".into(),
            why: format!("layer {il}: {nh} heads over {nkv} kv heads"),
        });
    }
    need(&format!("{b}attn_q.weight"), Some(e * 2 * hd * nh))?;
    need(&format!("{b}attn_k.weight"), Some(e * hd * nkv))?;
    need(&format!("{b}attn_v.weight"), Some(e * hd * nkv))?;
    need(&format!("{b}attn_output.weight"), Some(hd * nh * e))?;
    need(&format!("{b}attn_q_norm.weight"), Some(hd))?;
    need(&format!("{b}attn_k_norm.weight"), Some(hd))?;
    if hp.compress[il] > 0 {
        let (ih, id) = (hp.n_idx_head, hp.idx_dim);
        need(&format!("{b}indexer.q_proj.weight"), Some(e * ih * id))?;
        need(&format!("{b}indexer.k_proj.weight"), Some(e * id))?;
        need(&format!("{b}indexer.q_norm.weight"), Some(id))?;
        need(&format!("{b}indexer.k_norm.weight"), Some(id))?;
    }
    Ok(())
}

impl<W: Weights> Model<W> {
    /// One query at `pos` through full-attention layer `il` (`b` = `blk.N.`).
    pub(super) fn attention(
        &self,
        il: usize,
        b: &str,
        st: &mut AttnState,
        x: &[f64],
        pos: usize,
    ) -> Vec<f64> {
        let hp = &self.hp;
        let (hd, nh, nkv) = (hp.head_dim, hp.n_head[il], hp.n_head_kv[il]);
        let rope = |v: &mut [f64], width: usize, p4: [f64; 4]| {
            imrope(v, width, p4, hp.n_rot, hp.freq_base, hp.sections)
        };
        let qg = self.mm_scaled(&format!("{b}attn_q"), x);
        let qn = self.w(&format!("{b}attn_q_norm.weight"));
        let kn = self.w(&format!("{b}attn_k_norm.weight"));
        let mut q = Vec::with_capacity(nh * hd);
        let mut gate = Vec::with_capacity(nh * hd);
        for h in qg.chunks_exact(2 * hd) {
            q.extend(rms(&h[..hd], hp.eps, Some(&qn)));
            gate.extend_from_slice(&h[hd..]);
        }
        let mut k: Vec<f64> = self
            .mm_scaled(&format!("{b}attn_k"), x)
            .chunks_exact(hd)
            .flat_map(|h| rms(h, hp.eps, Some(&kn)))
            .collect();
        let v = self.mm_scaled(&format!("{b}attn_v"), x);
        rope(&mut q, hd, text_pos(pos));
        rope(&mut k, hd, text_pos(pos));
        let stored = |t: CacheType, x: Vec<f64>| -> Vec<f64> {
            x.into_iter()
                .map(|x| f64::from(t.stored(x as f32)))
                .collect()
        };
        st.k.push(stored(st.cache[0], k));
        st.v.push(stored(st.cache[1], v));
        debug_assert_eq!(st.k.len(), pos + 1);

        let sel = self.qsa_select(il, b, st, x, pos);

        let grp = nh / nkv;
        let inv = 1.0 / (hd as f64).sqrt();
        let mut out = Vec::with_capacity(nh * hd);
        let cells: Vec<usize> = (0..=pos).filter(|&j| sel[j]).collect();
        for h in 0..nh {
            let kv = h / grp;
            let qh = &q[h * hd..(h + 1) * hd];
            let mut a: Vec<f64> = cells
                .iter()
                .map(|&j| dot(qh, &st.k[j][kv * hd..(kv + 1) * hd]) * inv)
                .collect();
            softmax(&mut a);
            let mut o = vec![0.0; hd];
            for (&j, &aj) in cells.iter().zip(&a) {
                for (ov, &vv) in o.iter_mut().zip(&st.v[j][kv * hd..(kv + 1) * hd]) {
                    *ov += aj * vv;
                }
            }
            out.extend(o);
        }
        for (o, &g) in out.iter_mut().zip(&gate) {
            *o *= sigmoid(g);
        }
        self.mm_scaled(&format!("{b}attn_output"), &out)
    }

    /// Which cells `0..=pos` the query at `pos` attends (spec 6.1); caches
    /// this token's indexer key and any newly full block's pooled key.
    fn qsa_select(
        &self,
        il: usize,
        b: &str,
        st: &mut AttnState,
        x: &[f64],
        pos: usize,
    ) -> Vec<bool> {
        let hp = &self.hp;
        let r = hp.compress[il];
        if r == 0 {
            return vec![true; pos + 1];
        }
        let rope = |v: &mut [f64], p4: [f64; 4]| {
            imrope(v, hp.idx_dim, p4, hp.n_rot, hp.freq_base, hp.sections)
        };
        st.kraw
            .push(self.mv(&format!("{b}indexer.k_proj.weight"), x));
        let knorm = self.w(&format!("{b}indexer.k_norm.weight"));
        while st.pooled.len() < (pos + 1) / r {
            let blk = st.pooled.len();
            let mut mean = vec![0.0; hp.idx_dim];
            for row in &st.kraw[blk * r..(blk + 1) * r] {
                for (m, &v) in mean.iter_mut().zip(row) {
                    *m += v;
                }
            }
            mean.iter_mut().for_each(|m| *m /= r as f64);
            let mut kb = rms(&mean, hp.eps, Some(&knorm));
            rope(&mut kb, [(blk * r) as f64; 4]);
            st.pooled.push(kb);
        }

        let width = hp.top_k + r - 1;
        if pos < width {
            return vec![true; pos + 1];
        }
        let qnorm = self.w(&format!("{b}indexer.q_norm.weight"));
        let mut qi: Vec<f64> = self
            .mv(&format!("{b}indexer.q_proj.weight"), x)
            .chunks_exact(hp.idx_dim)
            .flat_map(|h| rms(h, hp.eps, Some(&qnorm)))
            .collect();
        rope(&mut qi, text_pos(pos));
        let tail_start = (pos + 1) / r * r;
        let mut row = vec![f64::NEG_INFINITY; pos + 1];
        for (blk, kb) in st.pooled[..tail_start / r].iter().enumerate() {
            let score: f64 = qi
                .chunks_exact(hp.idx_dim)
                .map(|qh| dot(qh, kb).max(0.0))
                .sum();
            row[blk * r..(blk + 1) * r].fill(score);
        }
        row[tail_start..].fill(1e9);
        let mut sel = vec![false; pos + 1];
        sel[tail_start..].fill(true);
        for j in libstdcxx_top_k(&row, width) {
            sel[j] = true;
        }
        sel
    }
}
