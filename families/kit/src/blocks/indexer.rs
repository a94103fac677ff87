//! The lightning indexer (DeepSeek's sparse attention): which cached cells
//! a query attends. A full layer's indexer scores every cached key
//! against its query, `Σ_h w_h · relu(q_h · k)`, and keeps the `top_k`
//! best (`ggml_top_k`, libstdc++'s order at ties); a shared layer reuses
//! the last full layer's [`Selection`].
//!
//! The host path computes it over host slices ([`rotate_query`],
//! [`finish_key`], [`pick_cells`]); the device block ([`select`]) computes
//! the same with the ops (`rope_ggml`, `hadamard`, `layer_norm`,
//! `lightning_scores`), its keys kept on the device ([`IndexerKeys`]); only
//! the scores come back, and both paths pick the cells from them with
//! [`mask_of_best`].

use device_ops::{AttnMask, DType, DeviceTensor, GgmlRope};
use family_ops::ggml_cpu;
use family_ops::{CacheType, OpsError, libstdcxx_top_k};

use super::attention::FIRST_CTX;
use super::context::{BlockContext, op_err};
use crate::{Handle, LoadError};

/// The indexer's weights.
#[derive(Clone, Copy, Debug)]
pub struct IndexerWeights {
    /// The query's projection from the latent query (`[q_lora, n_head ·
    /// head_dim]`).
    pub q_b: Handle,
    /// The key's projection from the layer input.
    pub k: Handle,
    /// The key's LayerNorm gain, if any (F32).
    pub k_norm: Option<Handle>,
    /// The key's LayerNorm bias, if any (F32).
    pub k_norm_b: Option<Handle>,
    /// The heads' weights' projection from the layer input.
    pub proj: Handle,
}

/// The indexer's sizes.
#[derive(Clone, Copy, Debug)]
pub struct IndexerShape {
    /// Query heads.
    pub n_head: usize,
    /// Dims of a query head and of the key (a power of two).
    pub head_dim: usize,
    /// Cells kept.
    pub top_k: usize,
    /// The rotation of the leading dims of each head.
    pub rope: GgmlRope,
    /// How a key is stored (llama.cpp keeps them in the K cache's type).
    pub cache: CacheType,
    /// The key's LayerNorm epsilon (llama.cpp's `f_norm_eps`).
    pub key_norm_eps: f32,
}

/// The query of one position from its projection (`n_head` heads of
/// `head_dim`): RoPE at `position`, then the Hadamard rotation of each
/// head.
///
/// # Errors
///
/// The shape does not fit.
pub fn rotate_query(q: &mut [f32], shape: &IndexerShape, position: usize) -> Result<(), OpsError> {
    let p = i32::try_from(position)
        .map_err(|_| OpsError::Invalid(format!("position {position} past i32")))?;
    ggml_cpu::rope_ext(q, shape.head_dim, p, &shape.rope)?;
    ggml_cpu::fwht(q, shape.head_dim)
}

/// The key of one position from its projection: LayerNorm (the shape's
/// `key_norm_eps`), times the gain, plus the bias, RoPE at
/// `position`, the Hadamard rotation, rounded as the cache stores it.
///
/// # Errors
///
/// The shape does not fit.
pub fn finish_key(
    k: &mut [f32],
    gain: Option<&[f32]>,
    bias: Option<&[f32]>,
    shape: &IndexerShape,
    position: usize,
) -> Result<(), OpsError> {
    ggml_cpu::norm(k, shape.key_norm_eps);
    if let Some(g) = gain {
        k.iter_mut().zip(g).for_each(|(k, g)| *k *= g);
    }
    if let Some(b) = bias {
        k.iter_mut().zip(b).for_each(|(k, b)| *k += b);
    }
    rotate_query(k, shape, position)?;
    shape.cache.store_in_place(k);
    Ok(())
}

/// The heads' weights from their projection, times `1 / sqrt(head_dim ·
/// n_head)`.
pub fn scale_head_weights(w: &mut [f32], shape: &IndexerShape) {
    let scale = head_weight_scale(shape);
    w.iter_mut().for_each(|v| *v *= scale);
}

/// The factor of the heads' weights, `1 / sqrt(head_dim · n_head)`.
pub fn head_weight_scale(shape: &IndexerShape) -> f32 {
    1.0 / ((shape.head_dim * shape.n_head) as f32).sqrt()
}

/// The additive mask (`0` picked, `-inf` not) over the cells of `keys`
/// (`head_dim` values each, oldest first): every cell while there are at
/// most `top_k`, else the `top_k` of the best scores.
pub fn pick_cells(q: &[f32], keys: &[f32], w: &[f32], shape: &IndexerShape) -> Vec<f32> {
    let n_cells = keys.len() / shape.head_dim;
    if n_cells <= shape.top_k {
        return vec![0.0; n_cells];
    }
    let row: Vec<f64> = keys
        .chunks_exact(shape.head_dim)
        .map(|kj| f64::from(ggml_cpu::lightning_score(q, kj, w, 0.0)))
        .collect();
    mask_of_best(&row, shape.top_k)
}

/// The additive mask of the `top_k` best `scores` (`ggml_top_k`,
/// libstdc++'s order at ties): `0` picked, `-inf` not.
pub fn mask_of_best(scores: &[f64], top_k: usize) -> Vec<f32> {
    let mut mask = vec![f32::NEG_INFINITY; scores.len()];
    for j in libstdcxx_top_k(scores, top_k) {
        mask[j] = 0.0;
    }
    mask
}

/// The cells each of `n` tokens at `pos0..pos0 + n` attends (an additive
/// mask of `n` rows over the cells of the last one's position), on the
/// host and, once asked for, on the device.
#[derive(Debug)]
pub struct Selection {
    cells: Vec<f32>,
    rows: usize,
    pos0: usize,
    device: Option<DeviceTensor>,
}

impl Selection {
    /// A selection of `rows` tokens from `pos0` whose cells are `cells`
    /// (`rows · (pos0 + rows)` values, row by row).
    pub fn new(cells: Vec<f32>, rows: usize, pos0: usize) -> Selection {
        Selection {
            cells,
            rows,
            pos0,
            device: None,
        }
    }

    /// The additive mask, row by row.
    pub fn cells(&self) -> &[f32] {
        &self.cells
    }

    /// Whether each row sees every cell up to its own position (no cell
    /// dropped but the later tokens').
    fn causal(&self) -> bool {
        let n_kv = self.pos0 + self.rows;
        self.cells
            .chunks_exact(n_kv.max(1))
            .enumerate()
            .all(|(t, row)| {
                let p = self.pos0 + t;
                row.iter().enumerate().all(|(j, &c)| {
                    if j <= p {
                        c == 0.0
                    } else {
                        c == f32::NEG_INFINITY
                    }
                })
            })
    }

    /// The mask of [`device_ops::Ops::attention`]: every filled cell for a
    /// token that sees them all (adding 0 changes no score), causal for
    /// tokens that see every earlier one, else the mask uploaded once.
    ///
    /// # Errors
    ///
    /// The upload failed.
    pub fn attn_mask(&mut self, cx: &BlockContext<'_>) -> Result<AttnMask<'_>, LoadError> {
        if self.causal() {
            return Ok(if self.rows == 1 {
                AttnMask::All
            } else {
                AttnMask::Causal { pos0: self.pos0 }
            });
        }
        if self.device.is_none() {
            let n_kv = self.pos0 + self.rows;
            self.device = Some(
                cx.ops()
                    .upload_f32(&self.cells, &[self.rows, n_kv])
                    .map_err(op_err)?,
            );
        }
        Ok(AttnMask::Additive(
            self.device.as_ref().expect("uploaded above"),
        ))
    }
}

/// The indexer's keys of one full layer, on the device (`[room, head_dim]`
/// in the K cache's element type, each key rounded as it is written).
#[derive(Debug)]
pub struct IndexerKeys {
    keys: DeviceTensor,
    len: usize,
}

impl IndexerKeys {
    /// An empty store of keys of `shape` holding `dtype` (F32 or F16).
    ///
    /// # Errors
    ///
    /// The device failed.
    pub fn new(
        cx: &BlockContext<'_>,
        shape: &IndexerShape,
        dtype: DType,
    ) -> Result<IndexerKeys, LoadError> {
        IndexerKeys::of_width(cx, shape.head_dim, dtype)
    }

    /// An empty store of rows of `width` holding `dtype` (F32 or F16): an
    /// indexer's keys, or any row a position adds to a cache of the K
    /// type (the k-pool's gates and pooled keys).
    ///
    /// # Errors
    ///
    /// The device failed.
    pub fn of_width(
        cx: &BlockContext<'_>,
        width: usize,
        dtype: DType,
    ) -> Result<IndexerKeys, LoadError> {
        let keys = cx.ops().zeros(dtype, &[FIRST_CTX, width]).map_err(op_err)?;
        Ok(IndexerKeys { keys, len: 0 })
    }

    /// The store (`[room, width]`, the first [`IndexerKeys::len`] rows
    /// filled).
    pub fn rows(&self) -> &DeviceTensor {
        &self.keys
    }

    /// Keys stored.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends the keys `k` (`[n, head_dim]`), each value rounded to the
    /// store's type, growing the store where full.
    ///
    /// # Errors
    ///
    /// Rows of another width, or an op failed.
    pub fn push(&mut self, cx: &BlockContext<'_>, k: &DeviceTensor) -> Result<(), LoadError> {
        let ops = cx.ops();
        let n = k.shape()[0];
        let (mut room, d) = (self.keys.shape()[0], self.keys.shape()[1]);
        if self.len + n > room {
            while self.len + n > room {
                room *= 2;
            }
            let mut bigger = ops.zeros(self.keys.dtype(), &[room, d]).map_err(op_err)?;
            ops.write_rows(&mut bigger, 0, &self.keys).map_err(op_err)?;
            self.keys = bigger;
        }
        ops.write_rows(&mut self.keys, self.len, k)
            .map_err(op_err)?;
        self.len += n;
        Ok(())
    }
}

/// A full layer's selection for `n` tokens at `pos0..pos0 + n` (`x` `[n,
/// E]` the layer input, `qr` `[n, q_lora]` the normed latent queries), on
/// the device: the queries and the keys rotated and the keys stored in
/// `keys`, every earlier key scored for each token; the scores come back
/// and the cells are picked as the host path picks them
/// ([`mask_of_best`]).
///
/// # Errors
///
/// A weight the seam could not stage, or an op failed.
pub fn select(
    cx: &BlockContext<'_>,
    w: &IndexerWeights,
    shape: &IndexerShape,
    keys: &mut IndexerKeys,
    x: &DeviceTensor,
    qr: &DeviceTensor,
    pos0: usize,
) -> Result<Selection, LoadError> {
    let ops = cx.ops();
    let d = shape.head_dim;
    let (n, _) = x.rows_cols("indexer").map_err(op_err)?;
    let pos = cx.positions(pos0, n)?;
    let q = cx.matmul(w.q_b, qr)?;
    let q = ops
        .rope_ggml(&q, &pos, d, &shape.rope)
        .and_then(|q| ops.hadamard(&q, d))
        .map_err(op_err)?;
    let k = cx.matmul(w.k, x)?;
    let mut k = ops.layer_norm(&k, shape.key_norm_eps).map_err(op_err)?;
    if let Some(g) = w.k_norm {
        k = ops.mul(&k, &*cx.small(g)?).map_err(op_err)?;
    }
    if let Some(b) = w.k_norm_b {
        k = ops.add(&k, &*cx.small(b)?).map_err(op_err)?;
    }
    let k = ops
        .rope_ggml(&k, &pos, d, &shape.rope)
        .and_then(|k| ops.hadamard(&k, d))
        .map_err(op_err)?;
    keys.push(cx, &k)?;
    // Made even when every cell is picked: each weight is asked of the
    // seam on every step.
    let hw = cx.matmul(w.proj, x)?;
    let hw = ops.scale(&hw, head_weight_scale(shape)).map_err(op_err)?;
    let n_kv = pos0 + n;
    let mut cells = Vec::with_capacity(n * n_kv);
    for t in 0..n {
        let seen = pos0 + t + 1;
        if seen <= shape.top_k {
            cells.extend(std::iter::repeat_n(0.0, seen));
        } else {
            let (qt, wt) = if n == 1 {
                (None, None)
            } else {
                (
                    Some(cx.rows_of(&q, t..t + 1)?),
                    Some(cx.rows_of(&hw, t..t + 1)?),
                )
            };
            let scores = ops
                .lightning_scores(
                    qt.as_ref().unwrap_or(&q),
                    &keys.keys,
                    seen,
                    wt.as_ref().unwrap_or(&hw),
                )
                .map_err(op_err)?;
            let scores: Vec<f64> = cx.read_back(&scores)?.into_iter().map(f64::from).collect();
            cells.extend(mask_of_best(&scores, shape.top_k));
        }
        cells.extend(std::iter::repeat_n(f32::NEG_INFINITY, n_kv - seen));
    }
    Ok(Selection::new(cells, n, pos0))
}
