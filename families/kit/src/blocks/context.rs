//! [`BlockContext`]: what every block computes with.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use device_ops::{DeviceTensor, NormWeight, OpError, Ops};
use seam::Resident;
use seam::platform::{Platform, Queue};
use seam::weight::Weight;

use crate::{Handle, LoadError, LoadedWeights, Traffic};

/// A failed op as a decoder's error.
pub fn op_err(e: OpError) -> LoadError {
    LoadError::Forward(e.to_string())
}

/// The ops of one device, the platform and queue its weights are staged
/// on, a model's loaded weights, and the small tensors (norm gains,
/// biases, scales) kept dequantized on the device once read.
pub struct BlockContext<'m> {
    ops: Rc<dyn Ops + 'm>,
    platform: &'m dyn Platform,
    queue: &'m dyn Queue,
    weights: &'m LoadedWeights,
    /// Small tensors dequantized on the device, by weight name.
    small: RefCell<HashMap<String, Arc<DeviceTensor>>>,
    /// Small F32 vectors the host reads (a router's bias, a norm the
    /// host applies), from their host bytes, by weight name.
    host_vectors: RefCell<HashMap<String, Arc<[f32]>>>,
    /// Read-backs made (the op counters count their bytes).
    read_backs: Cell<u64>,
}

impl std::fmt::Debug for BlockContext<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockContext")
            .field("device", &self.ops.device_name())
            .field("kept", &self.small.borrow().len())
            .finish()
    }
}

impl<'m> BlockContext<'m> {
    /// A context computing through `ops` (the op layer of `platform`),
    /// staging `weights` on `platform` through `queue`.
    pub fn new(
        ops: Rc<dyn Ops + 'm>,
        platform: &'m dyn Platform,
        queue: &'m dyn Queue,
        weights: &'m LoadedWeights,
    ) -> BlockContext<'m> {
        BlockContext {
            ops,
            platform,
            queue,
            weights,
            small: RefCell::new(HashMap::new()),
            host_vectors: RefCell::new(HashMap::new()),
            read_backs: Cell::new(0),
        }
    }

    /// The op layer.
    pub fn ops(&self) -> &dyn Ops {
        &*self.ops
    }

    /// The platform weights are staged on.
    pub fn platform(&self) -> &'m dyn Platform {
        self.platform
    }

    /// The loaded weights.
    pub fn weights(&self) -> &'m LoadedWeights {
        self.weights
    }

    /// The weight of `h`.
    pub fn weight(&self, h: Handle) -> &'m Weight {
        self.weights.get(h)
    }

    /// What a kernel may read of `w`, staged on first use.
    ///
    /// # Errors
    ///
    /// The seam failed to stage it.
    pub fn resident(&self, w: &'m Weight) -> Result<Resident<'m>, LoadError> {
        seam::resident_weight(w, self.platform, self.queue)
            .map_err(|e| LoadError::Forward(format!("{}: {e}", w.name())))
    }

    /// `w · x` ([`Ops::matmul`]), the weight read where the seam staged it.
    ///
    /// # Errors
    ///
    /// As [`BlockContext::resident`], or the op failed.
    pub fn matmul_weight(
        &self,
        w: &'m Weight,
        x: &DeviceTensor,
    ) -> Result<DeviceTensor, LoadError> {
        let r = self.resident(w)?;
        self.ops.matmul(w, &r, x).map_err(op_err)
    }

    /// The weight of `h` times `x`.
    ///
    /// # Errors
    ///
    /// As [`BlockContext::matmul_weight`].
    pub fn matmul(&self, h: Handle, x: &DeviceTensor) -> Result<DeviceTensor, LoadError> {
        self.matmul_weight(self.weight(h), x)
    }

    /// The weight of `h` times `x`, times the first value of the optional
    /// `scale` (a `{1}` `.scale` tensor, ggml's `mul`).
    ///
    /// # Errors
    ///
    /// As [`BlockContext::matmul_weight`].
    pub fn matmul_scaled(
        &self,
        h: Handle,
        scale: Option<Handle>,
        x: &DeviceTensor,
    ) -> Result<DeviceTensor, LoadError> {
        let y = self.matmul(h, x)?;
        match scale {
            Some(s) => {
                let s = self.small(s)?;
                if s.len() == 1 {
                    return self.ops.mul(&y, &s).map_err(op_err);
                }
                let first = self.ops.slice_cols(&s, 0, 1).map_err(op_err)?;
                self.ops.mul(&y, &first).map_err(op_err)
            }
            None => Ok(y),
        }
    }

    /// Expert products ([`Ops::matmul_id`]) of the stack (or any weight of
    /// three dims) `w` at the device-side `ids`.
    ///
    /// # Errors
    ///
    /// As [`BlockContext::matmul_weight`].
    pub fn matmul_id(
        &self,
        w: &'m Weight,
        x: &DeviceTensor,
        ids: &DeviceTensor,
    ) -> Result<DeviceTensor, LoadError> {
        let r = self.resident(w)?;
        self.ops.matmul_id(w, &r, x, ids).map_err(op_err)
    }

    /// The small tensor of `h` dequantized on the device as `[1, n]` (its
    /// `n` values), kept there.
    ///
    /// # Errors
    ///
    /// As [`BlockContext::resident`], or the op failed.
    pub fn small(&self, h: Handle) -> Result<Arc<DeviceTensor>, LoadError> {
        let w = self.weight(h);
        if let Some(t) = self.small.borrow().get(w.name()) {
            return Ok(Arc::clone(t));
        }
        let r = self.resident(w)?;
        let t = self.ops.dequantize(w, &r).map_err(op_err)?;
        let n = t.len();
        let t = Arc::new(t.reshape(&[1, n]).map_err(op_err)?);
        self.small
            .borrow_mut()
            .insert(w.name().to_owned(), Arc::clone(&t));
        Ok(t)
    }

    /// The F32 vector of `h` from its host bytes (the mapping, never a
    /// device copy: nothing is read back), kept: what the host computes
    /// with between read-backs. The weight is asked of the seam all the
    /// same, as every weight a step reads is.
    ///
    /// # Errors
    ///
    /// Not F32, its host bytes were given back, or the seam failed.
    pub fn host_vector(&self, h: Handle) -> Result<Arc<[f32]>, LoadError> {
        let w = self.weight(h);
        self.resident(w)?;
        if let Some(v) = self.host_vectors.borrow().get(w.name()) {
            return Ok(Arc::clone(v));
        }
        if w.ggml_type() != seam::gguf::GgmlType::F32 {
            return Err(LoadError::Forward(format!(
                "{}: read on the host as F32, not {}",
                w.name(),
                w.ggml_type()
            )));
        }
        let view = w.host_view().ok_or_else(|| {
            LoadError::Forward(format!("{}: its host bytes were given back", w.name()))
        })?;
        let v: Arc<[f32]> = view
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        self.host_vectors
            .borrow_mut()
            .insert(w.name().to_owned(), Arc::clone(&v));
        Ok(v)
    }

    /// `rms_norm(x) · w` of each row, `w` the gain of `h`.
    ///
    /// # Errors
    ///
    /// As [`BlockContext::small`].
    pub fn rms_norm(
        &self,
        x: &DeviceTensor,
        h: Handle,
        eps: f32,
    ) -> Result<DeviceTensor, LoadError> {
        let g = self.small(h)?;
        self.ops
            .rms_norm(x, eps, NormWeight::Scale(&g))
            .map_err(op_err)
    }

    /// `t` back on the host (activations only), counted.
    ///
    /// # Errors
    ///
    /// The op failed.
    pub fn read_back(&self, t: &DeviceTensor) -> Result<Vec<f32>, LoadError> {
        self.read_backs.set(self.read_backs.get() + 1);
        self.ops.read_back(t).map_err(op_err)
    }

    /// `n` positions from `pos0` (`I32 [n]`), uploaded.
    ///
    /// # Errors
    ///
    /// A position past `i32`, or the op failed.
    pub fn positions(&self, pos0: usize, n: usize) -> Result<DeviceTensor, LoadError> {
        let p: Vec<i32> = (pos0..pos0 + n)
            .map(|p| {
                i32::try_from(p).map_err(|_| LoadError::Forward(format!("position {p} past i32")))
            })
            .collect::<Result<_, _>>()?;
        self.ops.upload_i32(&p, &[n]).map_err(op_err)
    }

    /// Rows `rows` of `x` (`[n, cols]` F32): `[rows.len(), cols]`.
    ///
    /// # Errors
    ///
    /// A row past `x`, or the op failed.
    pub fn rows_of(
        &self,
        x: &DeviceTensor,
        rows: std::ops::Range<usize>,
    ) -> Result<DeviceTensor, LoadError> {
        let ids: Vec<i32> = rows.map(|r| r as i32).collect();
        let ids = self.ops.upload_i32(&ids, &[ids.len()]).map_err(op_err)?;
        self.ops.gather_rows(x, &ids).map_err(op_err)
    }

    /// Small tensors kept dequantized on the device.
    pub fn kept(&self) -> usize {
        self.small.borrow().len()
    }

    /// What crossed from the device to the host so far.
    pub fn traffic(&self) -> Traffic {
        let c = self.ops.counters();
        Traffic {
            read_back_bytes: c.read_back_bytes,
            weight_read_back_bytes: c.weight_read_back_bytes,
            read_backs: self.read_backs.get(),
            kernel_launches: Some(c.kernel_launches),
        }
    }
}
