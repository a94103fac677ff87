//! Attention on the device op layer, written once for every family that
//! has it: full or sliding-window attention over a device [`KvCache`],
//! with optional per-head Q/K norms, partial RoPE, a softcap of the
//! scores, an output gate and sandwich norms (a norm before the block and
//! one after its output projection), and the final logits (norm, head,
//! scale, softcap).
//!
//! - [`DeviceWeights`]: what a block computes with: the op layer, the
//!   platform and queue the seam stages on, and the small tensors (norm
//!   gains, biases, `{1}` scales) dequantized on the device once and kept
//!   there. Every product reads the staged weight in place
//!   ([`Ops::matmul`] on what `seam::resident_weight` hands out): nothing
//!   of a weight comes back to the host.
//! - [`AttentionLayer`]: one layer's weights and shape; [`attention`] runs
//!   `n` tokens (`[n, E]`, at positions `pos0..pos0 + n`) through it,
//!   appending their K/V to the layer's cache, and gives the new residual.
//! - [`LogitsHead`] and [`logits`]: the last token's logits.
//! - [`cache_dtype`]: the caches' element type for a [`Numerics`].
//!
//! The arithmetic is the ops' (ggml's CPU arithmetic on the reference and
//! fake devices), step for step as llama.cpp's graph builds it: a family
//! whose host pass is llama.cpp's CPU graph gets the same logits on the
//! fake device.
//!
//! **Architecture Invariant:** written against [`device_ops::Ops`] only;
//! no family, platform or vendor name.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use device_ops::{
    Attention, AttnMask, DType, DeviceTensor, GgmlRope, KvCache, KvSpec, NormWeight, OpError, Ops,
    Scores,
};
use seam::platform::{Platform, Queue};
use seam::weight::Weight;

use crate::{CacheType, LoadError, Numerics};

/// A failed op as a forward-pass error.
pub fn op_err(e: OpError) -> LoadError {
    LoadError::Forward(e.to_string())
}

/// Slots of a layer's first cache; a full cache is copied into one of
/// twice the room ([`KvCache::reserve`]).
pub const FIRST_CTX: usize = 16;

/// The device caches' element type for `numerics`: the op layer stores K
/// and V alike, in f32 or f16.
///
/// # Errors
///
/// `numerics` asks for flash attention, for K and V of different types,
/// or for bf16.
pub fn cache_dtype(numerics: Numerics) -> Result<DType, LoadError> {
    crate::numerics::refuse_flash_attn("the device path", numerics)?;
    match (numerics.cache_type_k, numerics.cache_type_v) {
        (CacheType::F32, CacheType::F32) => Ok(DType::F32),
        (CacheType::F16, CacheType::F16) => Ok(DType::F16),
        (k, v) => Err(LoadError::Forward(format!(
            "the device caches store K and V alike as f32 or f16, not k={k} v={v}"
        ))),
    }
}

/// What a block computes with on one device: the op layer, where the seam
/// stages (platform and queue), and the small tensors kept dequantized
/// there, by weight name.
pub struct DeviceWeights<'m> {
    ops: Rc<dyn Ops + 'm>,
    platform: &'m dyn Platform,
    queue: &'m dyn Queue,
    kept: RefCell<HashMap<String, Arc<DeviceTensor>>>,
}

impl std::fmt::Debug for DeviceWeights<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceWeights")
            .field("device", &self.ops.device_name())
            .field("kept", &self.kept.borrow().len())
            .finish()
    }
}

impl<'m> DeviceWeights<'m> {
    /// Weights staged on `platform` through `queue`, computed on by `ops`
    /// (that platform's op layer).
    pub fn new(
        ops: Rc<dyn Ops + 'm>,
        platform: &'m dyn Platform,
        queue: &'m dyn Queue,
    ) -> DeviceWeights<'m> {
        DeviceWeights {
            ops,
            platform,
            queue,
            kept: RefCell::new(HashMap::new()),
        }
    }

    /// The op layer.
    pub fn ops(&self) -> &dyn Ops {
        &*self.ops
    }

    /// The op layer, to share.
    pub fn shared_ops(&self) -> Rc<dyn Ops + 'm> {
        Rc::clone(&self.ops)
    }

    /// The platform the weights are staged on.
    pub fn platform(&self) -> &'m dyn Platform {
        self.platform
    }

    /// Small tensors kept dequantized on the device.
    pub fn kept(&self) -> usize {
        self.kept.borrow().len()
    }

    /// What the seam hands out for `w` (staging it on first use), passed
    /// to `f` with the op layer.
    fn with_resident<T>(
        &self,
        w: &Weight,
        f: impl FnOnce(&dyn Ops, &seam::Resident<'_>) -> Result<T, OpError>,
    ) -> Result<T, LoadError> {
        let r = seam::resident_weight(w, self.platform, self.queue)
            .map_err(|e| LoadError::Forward(format!("{}: {e}", w.name())))?;
        f(&*self.ops, &r).map_err(op_err)
    }

    /// `w · x` (`x` `[n, ne0]`), the weight read where the seam staged it.
    ///
    /// # Errors
    ///
    /// The seam failed to stage `w`, or the op refused.
    pub fn matmul(&self, w: &Weight, x: &DeviceTensor) -> Result<DeviceTensor, LoadError> {
        self.with_resident(w, |o, r| o.matmul(w, r, x))
    }

    /// `w · x` as [`Ops::matmul_f64`] computes it (a float64 reference's
    /// products), the weight read where the seam staged it.
    ///
    /// # Errors
    ///
    /// As [`DeviceWeights::matmul`].
    pub fn matmul_f64(&self, w: &Weight, x: &DeviceTensor) -> Result<DeviceTensor, LoadError> {
        self.with_resident(w, |o, r| o.matmul_f64(w, r, x))
    }

    /// Expert products ([`Ops::matmul_id`]) of the stack (or any weight
    /// of three dims) `w` at the device-side `ids`, read where the seam
    /// staged it.
    ///
    /// # Errors
    ///
    /// As [`DeviceWeights::matmul`].
    pub fn matmul_id(
        &self,
        w: &Weight,
        x: &DeviceTensor,
        ids: &DeviceTensor,
    ) -> Result<DeviceTensor, LoadError> {
        self.with_resident(w, |o, r| o.matmul_id(w, r, x, ids))
    }

    /// Asks the seam for `w` (staging it on first use), as every weight a
    /// step reads is asked, where the host reads its own bytes.
    ///
    /// # Errors
    ///
    /// The seam failed to stage `w`.
    pub fn stage(&self, w: &Weight) -> Result<(), LoadError> {
        self.with_resident(w, |_, _| Ok(()))
    }

    /// Rows `ids` (I32) of the table `w`, dequantized on the device.
    ///
    /// # Errors
    ///
    /// As [`DeviceWeights::matmul`].
    pub fn get_rows(&self, w: &Weight, ids: &DeviceTensor) -> Result<DeviceTensor, LoadError> {
        self.with_resident(w, |o, r| o.get_rows(w, r, ids))
    }

    /// The small tensor `w` dequantized on the device as `shape` (the same
    /// shape at every use), kept there.
    ///
    /// # Errors
    ///
    /// As [`DeviceWeights::matmul`], or `shape` is not `w`'s count.
    pub fn small(&self, w: &Weight, shape: &[usize]) -> Result<Arc<DeviceTensor>, LoadError> {
        if let Some(t) = self.kept.borrow().get(w.name()) {
            return Ok(Arc::clone(t));
        }
        let t = Arc::new(self.with_resident(w, |o, r| o.dequantize(w, r)?.reshape(shape))?);
        self.kept
            .borrow_mut()
            .insert(w.name().to_owned(), Arc::clone(&t));
        Ok(t)
    }

    /// RMSNorm of each row of `x` (`[rows, cols]`) times the gains `w`
    /// (`[cols]`).
    ///
    /// # Errors
    ///
    /// As [`DeviceWeights::small`].
    pub fn norm(&self, x: &DeviceTensor, w: &Weight, eps: f32) -> Result<DeviceTensor, LoadError> {
        let (_, cols) = x.rows_cols("rms_norm").map_err(op_err)?;
        let g = self.small(w, &[cols])?;
        self.ops
            .rms_norm(x, eps, NormWeight::Scale(&g))
            .map_err(op_err)
    }

    /// `p`'s product with `x`: `W · x`, times the `{1}` scale, plus the
    /// bias, each where the projection has it.
    ///
    /// # Errors
    ///
    /// As [`DeviceWeights::matmul`].
    pub fn project(&self, p: &Projection<'_>, x: &DeviceTensor) -> Result<DeviceTensor, LoadError> {
        let mut y = self.matmul(p.weight, x)?;
        if let Some(s) = p.scale {
            let s = self.small(s, &[1])?;
            y = self.ops.mul(&y, &s).map_err(op_err)?;
        }
        if let Some(b) = p.bias {
            let (_, cols) = y.rows_cols("project").map_err(op_err)?;
            let b = self.small(b, &[cols])?;
            y = self.ops.add(&y, &b).map_err(op_err)?;
        }
        Ok(y)
    }
}

/// A product with an optional `{1}` scale and bias after it.
#[derive(Clone, Copy, Debug)]
pub struct Projection<'w> {
    /// The matrix.
    pub weight: &'w Weight,
    /// A `{1}` factor of the product.
    pub scale: Option<&'w Weight>,
    /// A bias added after the scale.
    pub bias: Option<&'w Weight>,
}

impl<'w> Projection<'w> {
    /// The matrix alone.
    pub fn plain(weight: &'w Weight) -> Projection<'w> {
        Projection {
            weight,
            scale: None,
            bias: None,
        }
    }
}

/// Which cache slots a layer's queries see.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Span {
    /// Every position up to the query's own.
    Full,
    /// The last `window` positions, the query's own included.
    SlidingWindow(usize),
}

/// One attention layer: its weights and shape.
#[derive(Clone, Copy, Debug)]
pub struct AttentionLayer<'w> {
    /// The norm before the block (its gains), if any.
    pub pre_norm: Option<&'w Weight>,
    /// The queries' projection (`n_head · head_dim` out).
    pub q: Projection<'w>,
    /// The keys' (`n_head_kv · head_dim` out).
    pub k: Projection<'w>,
    /// The values' (`n_head_kv · head_dim` out).
    pub v: Projection<'w>,
    /// Per-head RMSNorm gains of Q (`[head_dim]`), if any.
    pub q_norm: Option<&'w Weight>,
    /// Per-head RMSNorm gains of K, if any.
    pub k_norm: Option<&'w Weight>,
    /// The output gate's projection: the attention's output times
    /// `sigmoid(gate · x)` (`n_head · head_dim` out), if any.
    pub gate: Option<&'w Weight>,
    /// The output projection.
    pub output: Projection<'w>,
    /// The norm after the output projection (a sandwich norm), if any.
    pub post_norm: Option<&'w Weight>,
    /// The shape and arithmetic.
    pub shape: AttentionShape,
}

/// An attention layer's shape and its arithmetic's parameters.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    /// Query heads.
    pub n_head: usize,
    /// K/V heads (dividing `n_head`).
    pub n_head_kv: usize,
    /// Size of a head (K and V alike).
    pub head_dim: usize,
    /// eps of the pre-norm and the head norms.
    pub eps: f32,
    /// eps of the post-norm.
    pub post_norm_eps: f32,
    /// RoPE of Q and K (its `n_rot` may be part of a head), or none.
    pub rope: Option<GgmlRope>,
    /// Which slots a query sees.
    pub span: Span,
    /// The scores' scale and softcap.
    pub scores: Scores,
}

/// An empty cache of `n_head_kv` K/V heads of `head_dim` with room for
/// `n_ctx` slots of `dtype` (grown by doubling as tokens come).
///
/// # Errors
///
/// The device failed.
pub fn new_cache(
    ops: &dyn Ops,
    n_head_kv: usize,
    head_dim: usize,
    n_ctx: usize,
    dtype: DType,
) -> Result<KvCache, LoadError> {
    KvCache::new(
        ops,
        KvSpec {
            n_ctx,
            n_head_kv,
            head_dim_k: head_dim,
            head_dim_v: head_dim,
            dtype,
        },
    )
    .map_err(op_err)
}

/// Per-head RMSNorm of `x` (`[n, heads · head_dim]`) with gains `w`.
fn head_norm(
    dw: &DeviceWeights<'_>,
    x: DeviceTensor,
    w: &Weight,
    head_dim: usize,
    eps: f32,
) -> Result<DeviceTensor, LoadError> {
    let shape = x.shape().to_vec();
    let heads = x.len() / head_dim;
    let y = dw.norm(&x.reshape(&[heads, head_dim]).map_err(op_err)?, w, eps)?;
    y.reshape(&shape).map_err(op_err)
}

/// The positions `pos0..pos0 + n` on the device (`I32 [n]`).
///
/// # Errors
///
/// A position past `i32`, or the device failed.
pub fn positions(ops: &dyn Ops, pos0: usize, n: usize) -> Result<DeviceTensor, LoadError> {
    let p: Vec<i32> = (pos0..pos0 + n)
        .map(|p| i32::try_from(p).map_err(|_| LoadError::Forward(format!("position {p} past i32"))))
        .collect::<Result<_, _>>()?;
    ops.upload_i32(&p, &[n]).map_err(op_err)
}

/// `n` tokens (`h` `[n, E]`, the residual, at positions `pos0..pos0 + n`;
/// `pos` their [`positions`]) through `layer`, their K/V appended to
/// `cache` (whose filled slots are positions `0..pos0`): `h` plus the
/// block's output, `[n, E]`. Each query sees the slots its [`Span`] allows
/// up to its own position.
///
/// # Errors
///
/// The cache is not at `pos0`, or as the ops.
pub fn attention(
    dw: &DeviceWeights<'_>,
    layer: &AttentionLayer<'_>,
    cache: &mut KvCache,
    h: &DeviceTensor,
    pos0: usize,
    pos: &DeviceTensor,
) -> Result<DeviceTensor, LoadError> {
    let s = &layer.shape;
    let o = dw.ops();
    if cache.len() != pos0 {
        return Err(LoadError::Forward(format!(
            "attention at position {pos0} over a cache of {} slots",
            cache.len()
        )));
    }
    let (n, _) = h.rows_cols("attention").map_err(op_err)?;
    let normed;
    let x = match layer.pre_norm {
        Some(w) => {
            normed = dw.norm(h, w, s.eps)?;
            &normed
        }
        None => h,
    };
    let mut q = dw.project(&layer.q, x)?;
    let mut k = dw.project(&layer.k, x)?;
    let v = dw.project(&layer.v, x)?;
    if let Some(w) = layer.q_norm {
        q = head_norm(dw, q, w, s.head_dim, s.eps)?;
    }
    if let Some(w) = layer.k_norm {
        k = head_norm(dw, k, w, s.head_dim, s.eps)?;
    }
    if let Some(rope) = &s.rope {
        q = o.rope_ggml(&q, pos, s.head_dim, rope).map_err(op_err)?;
        k = o.rope_ggml(&k, pos, s.head_dim, rope).map_err(op_err)?;
    }
    cache.reserve(o, pos0 + n).map_err(op_err)?;
    cache.append(o, &k, &v).map_err(op_err)?;
    let mask = match s.span {
        Span::Full => AttnMask::Causal { pos0 },
        Span::SlidingWindow(window) => AttnMask::SlidingWindow { pos0, window },
    };
    let mut a = o
        .attention(
            &q,
            cache,
            &Attention {
                n_head: s.n_head,
                scores: s.scores,
                mask,
            },
        )
        .map_err(op_err)?;
    if let Some(g) = layer.gate {
        let g = dw.matmul(g, x)?;
        a = o.mul_sigmoid(&a, &g).map_err(op_err)?;
    }
    let mut out = dw.project(&layer.output, &a)?;
    if let Some(w) = layer.post_norm {
        out = dw.norm(&out, w, s.post_norm_eps)?;
    }
    o.add(h, &out).map_err(op_err)
}

/// The head that turns the last hidden state into logits.
#[derive(Clone, Copy, Debug)]
pub struct LogitsHead<'w> {
    /// The final norm's gains.
    pub norm: &'w Weight,
    /// Its eps.
    pub eps: f32,
    /// The output matrix (`n_vocab` rows).
    pub output: &'w Weight,
    /// A factor of the logits (`ggml_scale`), if any.
    pub scale: Option<f32>,
    /// The final logit softcap ([`Ops::softcap`]), if any.
    pub softcap: Option<f32>,
}

/// The logits of the last row of `h` (`[n, E]`), on the device: `[1,
/// n_vocab]`.
///
/// # Errors
///
/// As the ops.
pub fn logits(
    dw: &DeviceWeights<'_>,
    head: &LogitsHead<'_>,
    h: &DeviceTensor,
) -> Result<DeviceTensor, LoadError> {
    let o = dw.ops();
    let (n, _) = h.rows_cols("logits").map_err(op_err)?;
    let picked;
    let last = if n > 1 {
        let id =
            i32::try_from(n - 1).map_err(|_| LoadError::Forward(format!("{n} rows past i32")))?;
        let id = o.upload_i32(&[id], &[1]).map_err(op_err)?;
        picked = o.gather_rows(h, &id).map_err(op_err)?;
        &picked
    } else {
        h
    };
    let x = dw.norm(last, head.norm, head.eps)?;
    let mut z = dw.matmul(head.output, &x)?;
    if let Some(s) = head.scale {
        z = o.scale(&z, s).map_err(op_err)?;
    }
    if let Some(c) = head.softcap {
        z = o.softcap(&z, c).map_err(op_err)?;
    }
    Ok(z)
}
