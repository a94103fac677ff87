//! Full attention with QSA block selection (spec section 6;
//! `build_layer_attn`, `build_qsa_top_k`, `build_attn_qsa`), one query at a
//! time over this layer's K/V cache.

use family_ops::ggml_cpu::{self, KvCells, MultiRope, Ubatch};
use family_ops::{AttentionShape, CacheType, NormWeight, libstdcxx_top_k, rms_norm_in_place};

use super::hyper::Hyper;
use super::{ForwardError, Model, Need, Weights};

/// A full-attention layer's caches, one row per position (llama.cpp keeps
/// position `p` in cell `p`).
#[derive(Debug, Clone, Default)]
pub(super) struct AttnState {
    /// The element types K and V are stored as (llama.cpp's cache types;
    /// the QSA indexer's keys are stored as K's).
    cache: [CacheType; 2],
    /// Normed, roped keys (n_head_kv · head_dim per cell), as stored.
    k: Vec<f32>,
    /// Values (n_head_kv · head_dim per cell), as stored.
    v: Vec<f32>,
    /// QSA indexer keys, raw (no norm, no rope), as stored: idx_dim per
    /// cell.
    kraw: Vec<f32>,
    /// One pooled, normed, roped key per full block.
    pooled: Vec<Vec<f32>>,
}

impl AttnState {
    /// One pooled, normed, roped key per full block so far.
    pub(super) fn pooled_keys(&self) -> &[Vec<f32>] {
        &self.pooled
    }

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

/// The positions of a text token at `p`: `(p, p, p, 0)`.
fn text_pos(p: usize) -> [i32; 4] {
    let p = p as i32;
    [p, p, p, 0]
}

impl<W: Weights> Model<W> {
    /// IMROPE of every head of `x` (heads of `width`) at `pos`.
    fn imrope(&self, x: &mut [f32], width: usize, pos: [i32; 4]) {
        let hp = &self.hp;
        ggml_cpu::rope_multi(
            x,
            width,
            hp.n_rot,
            pos,
            hp.freq_base as f32,
            hp.sections,
            MultiRope::Interleaved,
        )
        .expect("n_rot even and within the head and the indexer's head: checked in hparams");
    }

    /// One query at `pos` through full-attention layer `il` (`b` = `blk.N.`).
    pub(super) fn attention(
        &self,
        il: usize,
        b: &str,
        st: &mut AttnState,
        x: &[f32],
        pos: usize,
        ub: Ubatch,
    ) -> Vec<f32> {
        let hp = &self.hp;
        let (hd, nh, nkv) = (hp.head_dim, hp.n_head[il], hp.n_head_kv[il]);
        let eps = hp.eps as f32;
        let mask = self.qsa_select(il, b, st, x, pos, ub);
        let qg = self.mm_scaled(&format!("{b}attn_q"), x, ub);
        let qn = self.w(&format!("{b}attn_q_norm.weight"));
        let kn = self.w(&format!("{b}attn_k_norm.weight"));
        // attn_q holds [q | gate] per head.
        let mut q = Vec::with_capacity(nh * hd);
        let mut gate = Vec::with_capacity(nh * hd);
        for h in qg.chunks_exact(2 * hd) {
            let mut qh = h[..hd].to_vec();
            rms_norm_in_place(&mut qh, eps, NormWeight::Scale(&qn)).expect("q_norm of head_dim");
            q.extend(qh);
            gate.extend_from_slice(&h[hd..]);
        }
        let mut k = self.mm_scaled(&format!("{b}attn_k"), x, ub);
        for h in k.chunks_exact_mut(hd) {
            rms_norm_in_place(h, eps, NormWeight::Scale(&kn)).expect("k_norm of head_dim");
        }
        let mut v = self.mm_scaled(&format!("{b}attn_v"), x, ub);
        self.imrope(&mut q, hd, text_pos(pos));
        self.imrope(&mut k, hd, text_pos(pos));
        st.cache[0].store_in_place(&mut k);
        st.cache[1].store_in_place(&mut v);
        st.k.extend(k);
        st.v.extend(v);
        debug_assert_eq!(st.k.len(), (pos + 1) * nkv * hd);

        let cells = KvCells {
            k: &st.k,
            k_stride: nkv * hd,
            v: &st.v,
            v_stride: nkv * hd,
            first_cell: 0,
            mask: mask.as_deref(),
            k_type: st.cache[0],
            v_type: st.cache[1],
        };
        let shape = AttentionShape {
            n_head: nh,
            n_head_kv: nkv,
            head_dim_k: hd,
            head_dim_v: hd,
        };
        let mut out = vec![0f32; nh * hd];
        let scale = 1.0 / (hd as f32).sqrt();
        ggml_cpu::attention_cached(&q, &cells, &shape, scale, ub, &mut out)
            .expect("cache shapes follow the heads");
        for (o, &g) in out.iter_mut().zip(&gate) {
            *o *= ggml_cpu::sigmoid(g);
        }
        self.mm_scaled(&format!("{b}attn_output"), &out, ub)
    }

    /// Which cells `0..=pos` the query at `pos` attends (spec 6.1), as an
    /// additive mask (`None`: every one); caches this token's indexer key
    /// and any newly full block's pooled key.
    fn qsa_select(
        &self,
        il: usize,
        b: &str,
        st: &mut AttnState,
        x: &[f32],
        pos: usize,
        ub: Ubatch,
    ) -> Option<Vec<f32>> {
        let hp = &self.hp;
        let r = hp.compress[il];
        if r == 0 {
            return None;
        }
        let (id, eps) = (hp.idx_dim, hp.eps as f32);
        let mut kraw = self.mv(&format!("{b}indexer.k_proj.weight"), x, ub);
        st.cache[0].store_in_place(&mut kraw);
        st.kraw.extend(kraw);
        let knorm = self.w(&format!("{b}indexer.k_norm.weight"));
        // Pooled keys: the block's rows added in order, times 1/r, normed,
        // roped at the block's first position.
        while st.pooled.len() < (pos + 1) / r {
            let blk = st.pooled.len();
            let rows = &st.kraw[blk * r * id..(blk + 1) * r * id];
            let mut kb = rows[..id].to_vec();
            for row in rows.chunks_exact(id).skip(1) {
                kb.iter_mut().zip(row).for_each(|(m, &v)| *m += v);
            }
            let inv_r = 1.0 / r as f32;
            kb.iter_mut().for_each(|m| *m *= inv_r);
            rms_norm_in_place(&mut kb, eps, NormWeight::Scale(&knorm)).expect("k_norm of idx_dim");
            self.imrope(&mut kb, id, [(blk * r) as i32; 4]);
            st.pooled.push(kb);
        }

        let width = hp.qsa_width(il);
        if pos < width {
            return None;
        }
        let qnorm = self.w(&format!("{b}indexer.q_norm.weight"));
        let mut qi = self.mv(&format!("{b}indexer.q_proj.weight"), x, ub);
        for h in qi.chunks_exact_mut(id) {
            rms_norm_in_place(h, eps, NormWeight::Scale(&qnorm)).expect("q_norm of idx_dim");
        }
        self.imrope(&mut qi, id, text_pos(pos));
        let sel = qsa_cells(
            &st.pooled,
            &qi,
            r,
            width,
            pos,
            hp.n_idx_head > 1 || ub.is_many(),
        );
        let mask = sel
            .into_iter()
            .map(|s| if s { 0.0 } else { f32::NEG_INFINITY })
            .collect();
        Some(mask)
    }
}

/// The cells `0..=pos` a query attends (spec 6.1; `build_qsa_top_k`) once
/// `pos` is past `width` (`top_k + r - 1`): each full block's score
/// `Σ_h relu(pooled · q_h)` (the heads' `relu`s added in order; the dots
/// one `mul_mat` of the heads' columns, llamafile's tinyBLAS when `tiled`),
/// the incomplete tail always in (`1e9`), then libstdc++'s `top_k` of
/// `width` cells. `pooled` holds each full block's normed, roped key,
/// `qi` the query's heads (of the pooled keys' width).
pub(crate) fn qsa_cells(
    pooled: &[Vec<f32>],
    qi: &[f32],
    r: usize,
    width: usize,
    pos: usize,
    tiled: bool,
) -> Vec<bool> {
    let tail_start = (pos + 1) / r * r;
    let mut row = vec![f64::NEG_INFINITY; pos + 1];
    for (blk, kb) in pooled[..tail_start / r].iter().enumerate() {
        let mut score = 0f32;
        for (h, qh) in qi.chunks_exact(kb.len().max(1)).enumerate() {
            let dot = if tiled {
                ggml_cpu::dot_tinyblas(kb, qh)
            } else {
                ggml_cpu::dot_f32(kb, qh)
            };
            let relu = if dot > 0.0 { dot } else { 0.0 };
            score = if h == 0 { relu } else { score + relu };
        }
        row[blk * r..(blk + 1) * r].fill(f64::from(score));
    }
    row[tail_start..].fill(1e9);
    let mut sel = vec![false; pos + 1];
    sel[tail_start..].fill(true);
    for j in libstdcxx_top_k(&row, width) {
        sel[j] = true;
    }
    sel
}
