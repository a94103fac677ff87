//! Multi-head latent attention (DeepSeek's MLA) with absorbed `k_b` and
//! `v_b`, as llama.cpp's `build_attn_mla` computes it: each head's query
//! is `[k_b · q_nope | roped q_pe]`, attending one latent KV head whose
//! key is `[normed latent | roped k_pe]` and whose value is the latent;
//! each head's output goes back through `v_b`, then the output
//! projection. The latent cache is llama.cpp's K cache, in its element
//! type ([`latent_dtype`]).

use device_ops::{Attention, AttnMask, DType, DeviceTensor, GgmlRope, KvCache, KvSpec, Scores};

use super::attention::{FIRST_CTX, cache_dtype};
use super::context::{BlockContext, op_err};
use crate::{Handle, LoadError, Numerics};

/// MLA's weights.
#[derive(Clone, Copy, Debug)]
pub struct MlaWeights {
    /// The latent query's projection.
    pub q_a: Handle,
    /// Its RMSNorm gain.
    pub q_a_norm: Handle,
    /// The heads' queries from the latent query (`[q_lora, n_head ·
    /// (nope + rope)]`).
    pub q_b: Handle,
    /// The latent KV and the rope key from the input (`[E, kv_lora +
    /// rope]`).
    pub kv_a: Handle,
    /// The latent KV's RMSNorm gain.
    pub kv_a_norm: Handle,
    /// Per head, the latent from the no-rope query (`[nope, kv_lora,
    /// n_head]`).
    pub k_b: Handle,
    /// Per head, the value from the latent (`[kv_lora, v, n_head]`).
    pub v_b: Handle,
    /// The output projection.
    pub out: Handle,
    /// The output's optional `{1}` scale.
    pub out_scale: Option<Handle>,
}

/// MLA's sizes.
#[derive(Clone, Copy, Debug)]
pub struct MlaShape {
    /// Query heads.
    pub n_head: usize,
    /// The no-rope part of a query head.
    pub head_dim_nope: usize,
    /// The rope part of a query head and the rope key.
    pub head_dim_rope: usize,
    /// A value head.
    pub head_dim_v: usize,
    /// The latent KV's size.
    pub kv_lora: usize,
    /// The RMSNorms' epsilon.
    pub eps: f32,
    /// The rope part's rotation.
    pub rope: GgmlRope,
}

impl MlaShape {
    /// The scores' scale: `1 / sqrt(nope + rope)`, a head's full query.
    pub fn scale(&self) -> f32 {
        1.0 / ((self.head_dim_nope + self.head_dim_rope) as f32).sqrt()
    }
}

/// The latent cache's element type for `numerics`: llama.cpp keeps the
/// latent and the rope key in the K cache (V is a view of it).
///
/// # Errors
///
/// Flash attention, or a K cache type other than F32 and F16.
pub fn latent_dtype(numerics: Numerics) -> Result<DType, LoadError> {
    cache_dtype(Numerics {
        cache_type_v: numerics.cache_type_k,
        ..numerics
    })
}

/// One layer's latent cache: keys `[latent | rope key]`, values the
/// latent (the same rounded values llama.cpp's V view reads).
#[derive(Debug)]
pub struct LatentCache {
    cache: KvCache,
}

impl LatentCache {
    /// An empty cache of `shape` holding `dtype` on `cx`'s device.
    ///
    /// # Errors
    ///
    /// The device failed.
    pub fn new(cx: &BlockContext<'_>, shape: &MlaShape, dtype: DType) -> Result<Self, LoadError> {
        let spec = KvSpec {
            n_ctx: FIRST_CTX,
            n_head_kv: 1,
            head_dim_k: shape.kv_lora + shape.head_dim_rope,
            head_dim_v: shape.kv_lora,
            dtype,
        };
        Ok(LatentCache {
            cache: KvCache::new(cx.ops(), spec).map_err(op_err)?,
        })
    }

    /// Filled positions.
    pub fn len(&self) -> usize {
        self.cache.len()
    }

    /// Whether none is filled.
    pub fn is_empty(&self) -> bool {
        self.cache.is_empty()
    }
}

/// The normed latent query of `x` (`[1, E]`): what the heads' queries and
/// an indexer's query are projected from.
///
/// # Errors
///
/// A weight the seam could not stage, or an op failed.
pub fn latent_query(
    cx: &BlockContext<'_>,
    w: &MlaWeights,
    shape: &MlaShape,
    x: &DeviceTensor,
) -> Result<DeviceTensor, LoadError> {
    let q = cx.matmul(w.q_a, x)?;
    cx.rms_norm(&q, w.q_a_norm, shape.eps)
}

/// The attention output of `n` tokens at positions `pos0..pos0 + n` (`x`
/// `[n, E]`, `qr` their [`latent_query`]), their latents appended to
/// `cache` first, the cells each sees as `mask` says. `heads` holds
/// `0..n_head` for each token (`I32 [n, n_head]`, [`head_ids`]): the picks
/// that multiply each head by its own slice of `k_b` and `v_b`.
///
/// # Errors
///
/// A weight the seam could not stage, or an op failed.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    cx: &BlockContext<'_>,
    w: &MlaWeights,
    shape: &MlaShape,
    cache: &mut LatentCache,
    heads: &DeviceTensor,
    x: &DeviceTensor,
    qr: &DeviceTensor,
    pos0: usize,
    mask: AttnMask<'_>,
) -> Result<DeviceTensor, LoadError> {
    let (n, _) = x.rows_cols("mla").map_err(op_err)?;
    let q_cat = queries_and_append(cx, w, shape, cache, heads, x, qr, pos0)?;
    let attn = Attention {
        n_head: shape.n_head,
        scores: Scores {
            scale: shape.scale(),
            softcap: None,
        },
        mask,
    };
    let kqv = cx
        .ops()
        .attention(&q_cat, &cache.cache, &attn)
        .map_err(op_err)?;
    heads_out(cx, w, shape, heads, kqv, n)
}

/// [`attend`] for one token at `pos` whose cells are a slot list
/// (`slots`: `I32`, a cell each, `-1` a dead slot), attended in slot order
/// as llama.cpp's gathered k-pool attention does
/// ([`device_ops::Ops::attention_slots`]); without a rope part (the
/// latent is the key and the value).
///
/// # Errors
///
/// A rope part, more than one token, a weight the seam could not stage,
/// or an op failed.
#[allow(clippy::too_many_arguments)]
pub fn attend_slots(
    cx: &BlockContext<'_>,
    w: &MlaWeights,
    shape: &MlaShape,
    cache: &mut LatentCache,
    heads: &DeviceTensor,
    x: &DeviceTensor,
    qr: &DeviceTensor,
    pos: usize,
    slots: &DeviceTensor,
) -> Result<DeviceTensor, LoadError> {
    let (n, _) = x.rows_cols("mla").map_err(op_err)?;
    if n != 1 || shape.head_dim_rope != 0 {
        return Err(LoadError::Forward(format!(
            "a slot list is attended by one token without a rope part, not {n} tokens with {}",
            shape.head_dim_rope
        )));
    }
    let q = queries_and_append(cx, w, shape, cache, heads, x, qr, pos)?;
    let kqv = cx
        .ops()
        .attention_slots(&q, cache.cache.k(), slots, shape.scale())
        .map_err(op_err)?;
    heads_out(cx, w, shape, heads, kqv, n)
}

/// The heads' queries `[k_b · q_nope | roped q_pe]` of `n` tokens (`[n,
/// n_head · (kv_lora + rope)]`), their latents and rope keys appended to
/// `cache`. Without a rope part (`head_dim_rope` 0) a query is `k_b ·
/// q` and a key the normed latent.
#[allow(clippy::too_many_arguments)]
fn queries_and_append(
    cx: &BlockContext<'_>,
    w: &MlaWeights,
    shape: &MlaShape,
    cache: &mut LatentCache,
    heads: &DeviceTensor,
    x: &DeviceTensor,
    qr: &DeviceTensor,
    pos0: usize,
) -> Result<DeviceTensor, LoadError> {
    let ops = cx.ops();
    let (nh, dn, r, lat) = (
        shape.n_head,
        shape.head_dim_nope,
        shape.head_dim_rope,
        shape.kv_lora,
    );
    let (n, _) = x.rows_cols("mla").map_err(op_err)?;
    let q = cx
        .matmul(w.q_b, qr)?
        .reshape(&[n * nh, dn + r])
        .map_err(op_err)?;
    let kvp = cx.matmul(w.kv_a, x)?;
    // The key: the normed latent, then the rope key where there is one.
    let (q_cat, k, c) = if r == 0 {
        let q_lat = per_head(cx, w.k_b, &q, heads)?
            .reshape(&[n, nh * lat])
            .map_err(op_err)?;
        let c = cx.rms_norm(&kvp, w.kv_a_norm, shape.eps)?;
        (q_lat, None, c)
    } else {
        let pos = cx.positions(pos0, n)?;
        let q_nope = ops.slice_cols(&q, 0, dn).map_err(op_err)?;
        let q_pe = ops
            .slice_cols(&q, dn, r)
            .and_then(|t| t.reshape(&[n, nh * r]))
            .map_err(op_err)?;
        let q_pe = ops
            .rope_ggml(&q_pe, &pos, r, &shape.rope)
            .and_then(|t| t.reshape(&[n * nh, r]))
            .map_err(op_err)?;
        let q_lat = per_head(cx, w.k_b, &q_nope, heads)?
            .reshape(&[n * nh, lat])
            .map_err(op_err)?;
        let q_cat = ops
            .concat_cols(&q_lat, &q_pe)
            .and_then(|t| t.reshape(&[n, nh * (lat + r)]))
            .map_err(op_err)?;
        let c = ops.slice_cols(&kvp, 0, lat).map_err(op_err)?;
        let c = cx.rms_norm(&c, w.kv_a_norm, shape.eps)?;
        let k_pe = ops.slice_cols(&kvp, lat, r).map_err(op_err)?;
        let k_pe = ops.rope_ggml(&k_pe, &pos, r, &shape.rope).map_err(op_err)?;
        let k = ops.concat_cols(&c, &k_pe).map_err(op_err)?;
        (q_cat, Some(k), c)
    };
    let need = cache.cache.len() + n;
    cache.cache.reserve(ops, need).map_err(op_err)?;
    cache
        .cache
        .append(ops, k.as_ref().unwrap_or(&c), &c)
        .map_err(op_err)?;
    Ok(q_cat)
}

/// Each head's latent output (`kqv`, `n · n_head` rows of `kv_lora`)
/// through its slice of `v_b`, then the output projection.
fn heads_out(
    cx: &BlockContext<'_>,
    w: &MlaWeights,
    shape: &MlaShape,
    heads: &DeviceTensor,
    kqv: DeviceTensor,
    n: usize,
) -> Result<DeviceTensor, LoadError> {
    let kqv = kqv
        .reshape(&[n * shape.n_head, shape.kv_lora])
        .map_err(op_err)?;
    let u = per_head(cx, w.v_b, &kqv, heads)?
        .reshape(&[n, shape.n_head * shape.head_dim_v])
        .map_err(op_err)?;
    cx.matmul_scaled(w.out, w.out_scale, &u)
}

/// Each head's row of `x` (`[n · n_head, ne0]`) times its own matrix of the
/// per-head weight of `h` (`[ne0, rows, n_head]`, picked by `heads`); a
/// single head's weight has two dims (GGUF drops a trailing 1).
fn per_head(
    cx: &BlockContext<'_>,
    h: Handle,
    x: &DeviceTensor,
    heads: &DeviceTensor,
) -> Result<DeviceTensor, LoadError> {
    let w = cx.weight(h);
    if w.dims().len() == 2 {
        return cx.device().matmul(w, x);
    }
    cx.device().matmul_id(w, x, heads)
}

/// `0..n_head` for each of `n` tokens, the picks of [`attend`] (`I32 [n,
/// n_head]`), uploaded.
///
/// # Errors
///
/// The upload failed.
pub fn head_ids(cx: &BlockContext<'_>, n: usize, n_head: usize) -> Result<DeviceTensor, LoadError> {
    let ids: Vec<i32> = (0..n).flat_map(|_| 0..n_head as i32).collect();
    cx.ops().upload_i32(&ids, &[n, n_head]).map_err(op_err)
}
