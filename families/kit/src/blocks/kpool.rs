//! The k-pool indexer (glm5-next's sparse attention): each position's
//! indexer key and pool gate are cached; every `kpool` positions the
//! complete pool's keys are pooled into one key (a softmax over the
//! members of gate plus position embedding, per dim); a query scores the
//! pooled keys (the lightning score), and attends the best pools' slots
//! plus the tail of the incomplete pool, as llama.cpp's gather lays them
//! out (`glm5-next.cpp`, `llama-memory-hybrid-idx.cpp`): a slot list.
//!
//! The slot list is made once, on the host, from the pools' scores
//! ([`slots`]): by the host path over host slices, and by the device block
//! ([`select`]) from the scores it reads back (the keys, gates and pooled
//! keys stay on the device, [`KpoolCache`]).

use device_ops::{DType, DeviceTensor};
use family_ops::libstdcxx_top_k;

use super::context::{BlockContext, op_err};
use super::indexer::IndexerKeys;
use crate::{Handle, LoadError};

/// The largest ubatch llama.cpp attends through gathered latents
/// (`build_inp_kpool`'s `max_ub`).
const GATHER_MAX_UBATCH: usize = 16;

/// The cells of the indexer's cache below which llama.cpp scatters the
/// selection over the whole cache instead of gathering it: its `n_kv` is
/// the cache's cells padded to 256 (at most the context), so a selection
/// of 128 slots or more is never gathered at the contexts the goldens run.
const GATHER_MAX_SLOTS: usize = 128;

/// Whether llama.cpp attends a slot list of `n_slots` of a ubatch of
/// `ubatch_len` tokens gathered (the slots in their order, [`
/// device_ops::Ops::attention_slots`]) rather than scattered over the
/// cache (causal, the selected cells unmasked).
pub fn is_gathered(ubatch_len: usize, n_slots: usize) -> bool {
    ubatch_len <= GATHER_MAX_UBATCH && n_slots < GATHER_MAX_SLOTS
}

/// The k-pool indexer's weights.
#[derive(Clone, Copy, Debug)]
pub struct KpoolWeights {
    /// The query's projection from the latent query.
    pub q_b: Handle,
    /// The key's projection from the layer input.
    pub k: Handle,
    /// The key's LayerNorm gain (F32).
    pub k_norm: Handle,
    /// The key's LayerNorm bias (F32).
    pub k_norm_b: Handle,
    /// The heads' weights' projection from the layer input.
    pub proj: Handle,
    /// The pool gate's projection from the layer input.
    pub gate: Handle,
    /// The pool's position embedding (`[kpool, head_dim]`, F32).
    pub ape: Handle,
}

/// The k-pool indexer's sizes.
#[derive(Clone, Copy, Debug)]
pub struct KpoolShape {
    /// Query heads.
    pub n_head: usize,
    /// Dims of a query head, of the key and of the gate.
    pub head_dim: usize,
    /// Positions a pool.
    pub kpool: usize,
    /// Positions attended (`top_k / kpool` pools at most).
    pub top_k: usize,
    /// The key's LayerNorm epsilon.
    pub key_norm_eps: f32,
}

/// The slot list position `pos` attends from the scores of the complete
/// pools (`scores[b]` of pool `b`, `(pos + 1) / kpool` of them), in the
/// slots of llama.cpp's gather: `n_top` pools of `kpool` slots, the
/// scored pools by descending score (`libstdcxx_top_k`, then a stable
/// sort) then dead slots, then `kpool - 1` tail slots `pos, pos - 1, ...`
/// (dead past the tail). `None` is a dead slot. `n_prefill` is the
/// prompt's length: during the prompt llama.cpp sizes the pool-score row
/// by the pools of the whole batch (it only matters for score ties).
pub fn slots(
    scores: &[f32],
    pos: usize,
    n_prefill: usize,
    shape: &KpoolShape,
) -> Vec<Option<usize>> {
    let kp = shape.kpool;
    let nv = (pos + 1) / kp;
    let n_real = if pos < n_prefill { n_prefill / kp } else { nv };
    let n_pool = 64usize.max((n_real + 1).div_ceil(64) * 64);
    let n_top = n_pool.min(shape.top_k / kp);
    // Every complete pool is scored (fewer than `n_pool` of them).
    let mut row = vec![f64::NEG_INFINITY; n_pool];
    for (r, &s) in row.iter_mut().zip(scores.iter().take(nv)) {
        *r = f64::from(s);
    }
    let mut live: Vec<usize> = libstdcxx_top_k(&row, n_top)
        .into_iter()
        .filter(|&b| row[b].is_finite())
        .collect();
    // ggml_argsort (descending) of the picked scores: std::sort, an
    // insertion sort at these lengths, so ties keep top_k's order.
    live.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
    let mut out: Vec<Option<usize>> = Vec::with_capacity(kp * n_top + kp - 1);
    for r in 0..n_top {
        match live.get(r) {
            Some(&b) => out.extend((b * kp..(b + 1) * kp).map(Some)),
            None => out.extend(std::iter::repeat_n(None, kp)),
        }
    }
    let n_tail = (pos + 1) % kp;
    out.extend((0..kp - 1).map(|k| (k < n_tail).then(|| pos - k)));
    out
}

/// One layer's k-pool cache on the device, in the K cache's type: each
/// position's key and gate, and the pooled key of each complete pool.
#[derive(Debug)]
pub struct KpoolCache {
    keys: IndexerKeys,
    gates: IndexerKeys,
    pooled: IndexerKeys,
}

impl KpoolCache {
    /// An empty cache of `shape` holding `dtype` (F32 or F16).
    ///
    /// # Errors
    ///
    /// The device failed.
    pub fn new(
        cx: &BlockContext<'_>,
        shape: &KpoolShape,
        dtype: DType,
    ) -> Result<KpoolCache, LoadError> {
        let d = shape.head_dim;
        Ok(KpoolCache {
            keys: IndexerKeys::of_width(cx, d, dtype)?,
            gates: IndexerKeys::of_width(cx, d, dtype)?,
            pooled: IndexerKeys::of_width(cx, d, dtype)?,
        })
    }
}

/// The slot list of one token at `pos` (`x` `[1, E]` the layer input, `qr`
/// `[1, q_lora]` its normed latent query), on the device: its key
/// (LayerNormed, then the gain and bias) and gate stored in `cache`, the
/// pool it completes pooled ([`device_ops::Ops::pool_keys`]), the complete
/// pools scored ([`device_ops::Ops::lightning_scores`]); the scores come
/// back and the slots are [`slots`].
///
/// # Errors
///
/// A weight the seam could not stage, or an op failed.
#[allow(clippy::too_many_arguments)]
pub fn select(
    cx: &BlockContext<'_>,
    w: &KpoolWeights,
    shape: &KpoolShape,
    cache: &mut KpoolCache,
    x: &DeviceTensor,
    qr: &DeviceTensor,
    pos: usize,
    n_prefill: usize,
) -> Result<Vec<Option<usize>>, LoadError> {
    let ops = cx.ops();
    let (kp, d) = (shape.kpool, shape.head_dim);
    let k = cx.matmul(w.k, x)?;
    let k = ops.layer_norm(&k, shape.key_norm_eps).map_err(op_err)?;
    let k = ops.mul(&k, &*cx.small(w.k_norm)?).map_err(op_err)?;
    let k = ops.add(&k, &*cx.small(w.k_norm_b)?).map_err(op_err)?;
    let gate = cx.matmul(w.gate, x)?;
    let q = cx.matmul(w.q_b, qr)?;
    let scale = 1.0 / ((d * shape.n_head) as f32).sqrt();
    let wt = ops.scale(&cx.matmul(w.proj, x)?, scale).map_err(op_err)?;
    cache.keys.push(cx, &k)?;
    cache.gates.push(cx, &gate)?;
    if (pos + 1).is_multiple_of(kp) {
        let ape = cx.small(w.ape)?;
        let ape = ops
            .slice_cols(&ape, 0, kp * d)
            .and_then(|t| t.reshape(&[kp, d]))
            .map_err(op_err)?;
        let pool = ops
            .pool_keys(cache.keys.rows(), cache.gates.rows(), pos + 1 - kp, &ape)
            .map_err(op_err)?;
        cache.pooled.push(cx, &pool)?;
    }
    let nv = cache.pooled.len();
    let scores = if nv == 0 {
        Vec::new()
    } else {
        let s = ops
            .lightning_scores(&q, cache.pooled.rows(), nv, &wt)
            .map_err(op_err)?;
        cx.read_back(&s)?
    };
    Ok(slots(&scores, pos, n_prefill, shape))
}

/// The slot list as the device's ids (`I32`, `-1` a dead slot).
///
/// # Errors
///
/// A cell past `i32`, or the upload failed.
pub fn slot_ids(cx: &BlockContext<'_>, slots: &[Option<usize>]) -> Result<DeviceTensor, LoadError> {
    let ids: Vec<i32> = slots
        .iter()
        .map(|s| match *s {
            None => Ok(-1),
            Some(j) => {
                i32::try_from(j).map_err(|_| LoadError::Forward(format!("cell {j} past i32")))
            }
        })
        .collect::<Result<_, _>>()?;
    cx.ops().upload_i32(&ids, &[ids.len()]).map_err(op_err)
}

/// The slot list as the additive mask of one token at `pos` attending the
/// cache scattered (`[1, pos + 1]`: 0 at a selected cell, `-inf` else),
/// uploaded.
///
/// # Errors
///
/// The upload failed.
pub fn scattered_mask(
    cx: &BlockContext<'_>,
    slots: &[Option<usize>],
    pos: usize,
) -> Result<DeviceTensor, LoadError> {
    let mut mask = vec![f32::NEG_INFINITY; pos + 1];
    for &j in slots.iter().flatten() {
        if let Some(m) = mask.get_mut(j) {
            *m = 0.0;
        }
    }
    cx.ops().upload_f32(&mask, &[1, pos + 1]).map_err(op_err)
}
