//! llama.cpp's attention without flash attention over a cache of any
//! element type, as ggml's CPU backend computes it
//! (`llm_graph_context::build_attn_mha`, `llama-graph.cpp`):
//!
//! - `kq = mul_mat(k, q)`: `q` converted to the K cache's type first (the
//!   `vec_dot_type` of an F16 or BF16 `src0`), then `ggml_vec_dot_f16` /
//!   `_bf16` / `_f32` per cell, or llamafile's tinyBLAS ([`dot_tinyblas`])
//!   when the ubatch has several tokens and `q` is contiguous (always once
//!   converted; an F32 `q` only with one head, the permuted view of
//!   several is not);
//! - `soft_max_ext(kq, mask, scale)` over the cells ([`soft_max`]);
//! - `kqv = mul_mat(v, kq)`: the probabilities converted to the V cache's
//!   type first, then a dot over the cells per value dimension (tinyBLAS
//!   for several tokens).
//!
//! MLA keeps its latent (and rope key) as K and reads V as a view of K's
//! first dimensions: [`KvCells`] takes each side with its own stride.

use half::{bf16, f16};

use super::{STEP, Ubatch, dot_bf16, dot_f16, dot_f32, dot_tinyblas, soft_max, tinyblas_takes};
use crate::{AttentionShape, CacheType, OpsError, check_len};

/// The visible cells of one layer's cache, as the attention reads them.
#[derive(Clone, Copy, Debug)]
pub struct KvCells<'a> {
    /// The keys of `n` consecutive cells: cell `j`'s key head `g` is
    /// `k[j * k_stride + g * head_dim_k..][..head_dim_k]`, its values as
    /// stored (already rounded to `k_type`).
    pub k: &'a [f32],
    /// Values between two cells' keys.
    pub k_stride: usize,
    /// The values, cell `j`'s head `g` at `v[j * v_stride + g *
    /// head_dim_v..][..head_dim_v]` (MLA: the keys themselves, read up to
    /// the latent's width).
    pub v: &'a [f32],
    /// Values between two cells' values.
    pub v_stride: usize,
    /// The cache cell of the first one: ggml's SIMD lanes follow the cell
    /// index (llama.cpp keeps position `p` in cell `p` while the cache has
    /// not wrapped).
    pub first_cell: usize,
    /// What `soft_max_ext` adds to each cell's scaled score (`0` keeps,
    /// `-inf` drops), one per cell; `None`: every cell is visible.
    pub mask: Option<&'a [f32]>,
    /// The K cache's element type: `q` is converted to it.
    pub k_type: CacheType,
    /// The V cache's element type: the probabilities are converted to it.
    pub v_type: CacheType,
}

impl KvCells<'_> {
    /// How many cells there are, the shape, `q` and `out` checked against
    /// each other (`q`: `[n_head][dk]`, `out`: `[n_head][dv]`).
    pub(crate) fn checked(
        &self,
        shape: &AttentionShape,
        q: &[f32],
        out: &[f32],
    ) -> Result<usize, OpsError> {
        let AttentionShape {
            n_head,
            n_head_kv,
            head_dim_k: dk,
            head_dim_v: dv,
        } = *shape;
        if n_head == 0 || n_head_kv == 0 || dk == 0 || dv == 0 || !n_head.is_multiple_of(n_head_kv)
        {
            return Err(OpsError::Invalid(format!(
                "attention: {n_head} query heads over {n_head_kv} K/V heads of {dk}/{dv}"
            )));
        }
        check_len("attention q", n_head * dk, q.len())?;
        check_len("attention out", n_head * dv, out.len())?;
        self.count(shape)
    }

    /// How many cells there are, checked against the shape.
    fn count(&self, shape: &AttentionShape) -> Result<usize, OpsError> {
        let (kw, vw) = (
            shape.n_head_kv * shape.head_dim_k,
            shape.n_head_kv * shape.head_dim_v,
        );
        if self.k_stride < kw || self.v_stride < vw {
            return Err(OpsError::Invalid(format!(
                "cached attention: strides {}/{} under the heads' {kw}/{vw}",
                self.k_stride, self.v_stride
            )));
        }
        let n = match self.k.len() {
            0 => 0,
            len if len >= kw => (len - kw) / self.k_stride + 1,
            _ => 0,
        };
        if n > 0 && self.k.len() != (n - 1) * self.k_stride + kw {
            return Err(OpsError::Invalid(format!(
                "cached attention: {} key values are not cells of stride {}",
                self.k.len(),
                self.k_stride
            )));
        }
        if n > 0 && self.v.len() < (n - 1) * self.v_stride + vw {
            return Err(OpsError::Length {
                what: "cached attention v",
                expected: (n - 1) * self.v_stride + vw,
                got: self.v.len(),
            });
        }
        if let Some(m) = self.mask {
            check_len("cached attention mask", n, m.len())?;
        }
        Ok(n)
    }
}

/// `x` as a cache of type `ty` rounds it (what ggml's `from_float` to the
/// `vec_dot_type` does to `q` or the probabilities).
fn converted(ty: CacheType, x: &[f32]) -> Vec<f32> {
    match ty {
        CacheType::F32 => x.to_vec(),
        CacheType::F16 => x.iter().map(|&v| f16::from_f32(v).to_f32()).collect(),
        CacheType::Bf16 => x.iter().map(|&v| bf16::from_f32(v).to_f32()).collect(),
    }
}

/// `ggml_vec_dot` of the type's kernel ([`dot_f32`], [`dot_f16`],
/// [`dot_bf16`]), or tinyBLAS's sum when `tiled`.
fn dot_as(ty: CacheType, tiled: bool, x: &[f32], y: &[f32]) -> f32 {
    match ty {
        _ if tiled => dot_tinyblas(x, y),
        CacheType::F32 => dot_f32(x, y),
        CacheType::F16 => dot_f16(x, y),
        CacheType::Bf16 => dot_bf16(x, y),
    }
}

/// Whether the scores (`q · k`) and the output (`p · v`) of a query of
/// `ubatch` over `span` cells (padded to whole 32s) take llamafile's
/// tinyBLAS ([`dot_tinyblas`]) rather than `vec_dot`: several tokens, and
/// for the scores a `q` converted to K's type (contiguous then) or an F32
/// `q` whose permuted view is contiguous (`q_contiguous`); `kq` is
/// contiguous (llama.cpp pads the cells to whole 256s).
pub fn attention_tiles(
    ubatch: Ubatch,
    span: usize,
    dk: usize,
    dv: usize,
    k_type: CacheType,
    q_contiguous: bool,
) -> (bool, bool) {
    let kq = tinyblas_takes(ubatch, span, dk) && (k_type != CacheType::F32 || q_contiguous);
    (kq, tinyblas_takes(ubatch, dv, STEP))
}

/// llama.cpp's non-flash attention of one query (`q`: `[n_head][dk]`) over
/// `cells`, as ggml's CPU backend computes it for a ubatch of `ubatch`
/// tokens (see the module documentation); `out` is `[n_head][dv]`. Query
/// head `h` reads K/V head `h / (n_head / n_head_kv)`. A head with no
/// visible cell gets NaN, as ggml's softmax of an all `-inf` row.
///
/// # Errors
///
/// The shape does not divide or a length does not fit.
pub fn attention_cached(
    q: &[f32],
    cells: &KvCells<'_>,
    shape: &AttentionShape,
    scale: f32,
    ubatch: Ubatch,
    out: &mut [f32],
) -> Result<(), OpsError> {
    // `q` arrives as `[dk, n_head, n_tokens]` and is permuted: contiguous
    // with one head.
    let contiguous = shape.n_head == 1;
    attention_cached_q(q, contiguous, cells, shape, scale, ubatch, out)
}

/// [`attention_cached`] for a `q` whose permuted view
/// (`[dk, n_tokens, n_head]`) is contiguous or not as `q_contiguous` says:
/// glm5-next's absorbed `q` is (it is the permuted output of a
/// `mul_mat`), whatever its heads. With an F32 K cache and several tokens,
/// a contiguous `q` takes llamafile's tinyBLAS, another `vec_dot`.
///
/// # Errors
///
/// As [`attention_cached`].
pub fn attention_cached_q(
    q: &[f32],
    q_contiguous: bool,
    cells: &KvCells<'_>,
    shape: &AttentionShape,
    scale: f32,
    ubatch: Ubatch,
    out: &mut [f32],
) -> Result<(), OpsError> {
    let n = cells.checked(shape, q, out)?;
    let AttentionShape {
        n_head,
        n_head_kv,
        head_dim_k: dk,
        head_dim_v: dv,
    } = *shape;
    if n == 0 {
        out.fill(0.0);
        return Ok(());
    }
    // The cells from the last whole 32 before the first one to the next
    // whole 32 after the last: the cells around them are masked (weight
    // 0), which adds nothing to ggml's sums but fixes their lanes.
    let first = cells.first_cell;
    let base = first - first % STEP;
    let span = (first + n - base).next_multiple_of(STEP);
    let at = first - base;
    let group = n_head / n_head_kv;
    let (kq_tiled, kqv_tiled) = attention_tiles(ubatch, span, dk, dv, cells.k_type, q_contiguous);
    let mut p = vec![0f32; span];
    let mut vcol = vec![0f32; span];
    for (h, (qh, oh)) in q.chunks_exact(dk).zip(out.chunks_exact_mut(dv)).enumerate() {
        let g = h / group;
        let qc = converted(cells.k_type, qh);
        p.fill(f32::NEG_INFINITY);
        for j in 0..n {
            let kj = &cells.k[j * cells.k_stride + g * dk..][..dk];
            p[at + j] = dot_as(cells.k_type, kq_tiled, kj, &qc);
        }
        // The mask is added after the scale; outside the cells, -inf.
        let mut mask = vec![f32::NEG_INFINITY; span];
        for j in 0..n {
            mask[at + j] = cells.mask.map_or(0.0, |m| m[j]);
        }
        for (s, m) in p.iter_mut().zip(&mask) {
            if *m == f32::NEG_INFINITY {
                *s = 0.0;
            }
        }
        soft_max(&mut p, scale, Some(&mask))?;
        let pc = converted(cells.v_type, &p);
        for (d, o) in oh.iter_mut().enumerate() {
            vcol.fill(0.0);
            for j in 0..n {
                vcol[at + j] = cells.v[j * cells.v_stride + g * dv + d];
            }
            *o = dot_as(cells.v_type, kqv_tiled, &vcol, &pc);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::refs::{fnv, row};
    use super::*;

    /// `tools/oracle/ggml_kernel_refs.c`'s `attn`: one K/V head of 64
    /// cells of `ty`, `n_head` query heads of 40, values of 32, token `t`
    /// of `n_tokens` seeing cells `0..=34 + t`; the output laid out as
    /// ggml's `kqv` (`[n_head][n_tokens][dv]`).
    fn attn(ty: CacheType, n_head: usize, n_tokens: usize) -> Vec<f32> {
        let (dk, dv, n_kv) = (40, 32, 64);
        let q = row(dk * n_head * n_tokens, 21, 2.0);
        let mut k = row(dk * n_kv, 22, 1.5);
        ty.store_in_place(&mut k);
        // V is stored transposed ([dv][n_kv]); the cells want [n_kv][dv].
        let mut vt = row(n_kv * dv, 23, 3.0);
        ty.store_in_place(&mut vt);
        let v: Vec<f32> = (0..n_kv * dv)
            .map(|i| vt[(i % dv) * n_kv + i / dv])
            .collect();
        let shape = AttentionShape {
            n_head,
            n_head_kv: 1,
            head_dim_k: dk,
            head_dim_v: dv,
        };
        let ubatch = if n_tokens > 1 {
            Ubatch::Many
        } else {
            Ubatch::One
        };
        let mut out = vec![0f32; dv * n_tokens * n_head];
        for t in 0..n_tokens {
            let visible = 35 + t;
            let cells = KvCells {
                k: &k[..visible * dk],
                k_stride: dk,
                v: &v[..visible * dv],
                v_stride: dv,
                first_cell: 0,
                mask: None,
                k_type: ty,
                v_type: ty,
            };
            let qt = &q[t * n_head * dk..][..n_head * dk];
            let mut o = vec![0f32; n_head * dv];
            let scale = 1.0 / (dk as f32).sqrt();
            attention_cached(qt, &cells, &shape, scale, ubatch, &mut o).unwrap();
            for h in 0..n_head {
                out[(h * n_tokens + t) * dv..][..dv].copy_from_slice(&o[h * dv..][..dv]);
            }
        }
        out
    }

    #[test]
    fn cached_attention_is_ggmls_for_f16_and_f32_caches_one_token_and_batched() {
        // (type, heads, tokens, fnv of ggml's bits, its first value).
        let cases = [
            (
                CacheType::F16,
                2,
                1,
                0xebda_5c04_0163_35ffu64,
                0xbe26_600fu32,
            ),
            (CacheType::F16, 2, 3, 0x3a41_59c3_afeb_d3d3, 0xbe26_6010),
            (CacheType::F32, 1, 3, 0x0d8a_4af6_d8c1_91b1, 0xbe26_6c6e),
            (CacheType::F32, 2, 3, 0xcf39_ae21_6964_b9d8, 0xbe26_6c72),
        ];
        for (ty, n_head, n_tokens, want, first) in cases {
            let got = attn(ty, n_head, n_tokens);
            assert_eq!(
                got[0].to_bits(),
                first,
                "{ty} {n_head} heads {n_tokens} tokens"
            );
            assert_eq!(fnv(&got), want, "{ty} {n_head} heads {n_tokens} tokens");
        }
    }

    #[test]
    fn a_contiguous_q_takes_tinyblas_for_an_f32_cache() {
        // Two heads over one K/V head: with a contiguous q each head is
        // the one-head case (tinyBLAS for kq); with a strided one, vec_dot.
        let (k, v, q) = (row(40 * 8, 5, 1.0), row(32 * 8, 6, 1.0), row(80, 7, 2.0));
        let cells = KvCells {
            k: &k,
            k_stride: 40,
            v: &v,
            v_stride: 32,
            first_cell: 0,
            mask: None,
            k_type: CacheType::F32,
            v_type: CacheType::F32,
        };
        let shape = |n_head| AttentionShape {
            n_head,
            n_head_kv: 1,
            head_dim_k: 40,
            head_dim_v: 32,
        };
        let run = |contiguous: bool| {
            let mut out = vec![0f32; 64];
            attention_cached_q(
                &q,
                contiguous,
                &cells,
                &shape(2),
                0.2,
                Ubatch::Many,
                &mut out,
            )
            .unwrap();
            out
        };
        let mut per_head = Vec::new();
        for h in 0..2 {
            let mut o = vec![0f32; 32];
            attention_cached(
                &q[40 * h..40 * (h + 1)],
                &cells,
                &shape(1),
                0.2,
                Ubatch::Many,
                &mut o,
            )
            .unwrap();
            per_head.extend(o);
        }
        assert_eq!(run(true), per_head);
        assert_ne!(run(false), per_head, "vec_dot's kq sums elsewhere");
        let mut strided = vec![0f32; 64];
        attention_cached(&q, &cells, &shape(2), 0.2, Ubatch::Many, &mut strided).unwrap();
        assert_eq!(strided, run(false));
    }

    #[test]
    fn a_mask_drops_cells_and_v_may_be_a_view_of_k() {
        // MLA: V is the first 8 values of each 12-value key.
        let k = row(12 * 5, 3, 1.0);
        let q = row(12, 4, 1.0);
        let shape = AttentionShape {
            n_head: 1,
            n_head_kv: 1,
            head_dim_k: 12,
            head_dim_v: 8,
        };
        fn cells<'a>(k: &'a [f32], mask: Option<&'a [f32]>) -> KvCells<'a> {
            KvCells {
                k,
                k_stride: 12,
                v: k,
                v_stride: 12,
                first_cell: 7,
                mask,
                k_type: CacheType::F16,
                v_type: CacheType::F16,
            }
        }
        let run = |c: &KvCells<'_>| {
            let mut out = [0f32; 8];
            attention_cached(&q, c, &shape, 0.3, Ubatch::One, &mut out).map(|()| out)
        };
        let mask = [0.0, f32::NEG_INFINITY, 0.0, 0.0, 0.0];
        let masked = run(&cells(&k, Some(&mask))).unwrap();
        let no_mask = run(&cells(&k, None)).unwrap();
        assert_ne!(masked, no_mask, "the mask drops a cell");
        let v_of_k: Vec<f32> = (0..8).map(|d| k[d]).collect();
        assert!(masked.iter().zip(&v_of_k).any(|(a, b)| a != b));
        // A mask of the wrong length, a stride under the head: refused.
        assert!(run(&cells(&k, Some(&mask[1..]))).is_err());
        let mut bad = cells(&k, None);
        bad.v_stride = 7;
        assert!(run(&bad).is_err());
        // One visible cell: its value, the probabilities being 1.
        let one = run(&cells(&k[..12], None)).unwrap();
        assert_eq!(one[..], k[..8]);
    }
}
