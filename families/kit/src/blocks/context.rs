//! [`BlockContext`]: what the MoE, MLA and indexer blocks compute with:
//! the device's weights ([`DeviceWeights`]: the op layer, where the seam
//! stages, small tensors kept on the device) and a model's loaded weights
//! by [`Handle`].

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use device_ops::{DeviceTensor, Ops};
use seam::platform::{Platform, Queue};
use seam::weight::Weight;

pub use super::attention::op_err;
use super::attention::{DeviceWeights, Projection};
use crate::{Handle, LoadError, LoadedWeights, Traffic};

/// A device's weights ([`DeviceWeights`]) with a model's
/// [`LoadedWeights`], the F32 vectors the host reads between read-backs,
/// and the read-backs counted.
pub struct BlockContext<'m> {
    device: DeviceWeights<'m>,
    weights: &'m LoadedWeights,
    /// Small F32 vectors the host reads (a router's bias), from their host
    /// bytes, by weight name.
    host_vectors: RefCell<HashMap<String, Arc<[f32]>>>,
    /// Read-backs made (the op counters count their bytes).
    read_backs: Cell<u64>,
}

impl std::fmt::Debug for BlockContext<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockContext")
            .field("device", &self.device)
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
            device: DeviceWeights::new(ops, platform, queue),
            weights,
            host_vectors: RefCell::new(HashMap::new()),
            read_backs: Cell::new(0),
        }
    }

    /// The device's weights.
    pub fn device(&self) -> &DeviceWeights<'m> {
        &self.device
    }

    /// The op layer.
    pub fn ops(&self) -> &dyn Ops {
        self.device.ops()
    }

    /// The platform weights are staged on.
    pub fn platform(&self) -> &'m dyn Platform {
        self.device.platform()
    }

    /// The loaded weights.
    pub fn weights(&self) -> &'m LoadedWeights {
        self.weights
    }

    /// The weight of `h`.
    pub fn weight(&self, h: Handle) -> &'m Weight {
        self.weights.get(h)
    }

    /// The weight of `h` times `x`.
    ///
    /// # Errors
    ///
    /// As [`DeviceWeights::matmul`].
    pub fn matmul(&self, h: Handle, x: &DeviceTensor) -> Result<DeviceTensor, LoadError> {
        self.device.matmul(self.weight(h), x)
    }

    /// The weight of `h` times `x`, times the optional `{1}` `scale`
    /// (ggml's `mul`).
    ///
    /// # Errors
    ///
    /// As [`DeviceWeights::project`].
    pub fn matmul_scaled(
        &self,
        h: Handle,
        scale: Option<Handle>,
        x: &DeviceTensor,
    ) -> Result<DeviceTensor, LoadError> {
        let p = Projection {
            weight: self.weight(h),
            scale: scale.map(|s| self.weight(s)),
            bias: None,
        };
        self.device.project(&p, x)
    }

    /// The small tensor of `h` dequantized on the device (its values, one
    /// dim), kept there.
    ///
    /// # Errors
    ///
    /// As [`DeviceWeights::small`].
    pub fn small(&self, h: Handle) -> Result<Arc<DeviceTensor>, LoadError> {
        let w = self.weight(h);
        let n = usize::try_from(w.dims().iter().product::<u64>())
            .map_err(|_| LoadError::Forward(format!("{}: too many values", w.name())))?;
        self.device.small(w, &[n])
    }

    /// `rms_norm(x) · w` of each row, `w` the gains of `h`.
    ///
    /// # Errors
    ///
    /// As [`DeviceWeights::norm`].
    pub fn rms_norm(
        &self,
        x: &DeviceTensor,
        h: Handle,
        eps: f32,
    ) -> Result<DeviceTensor, LoadError> {
        self.device.norm(x, self.weight(h), eps)
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
        self.device.stage(w)?;
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

    /// `t` back on the host (activations only), counted.
    ///
    /// # Errors
    ///
    /// The op failed.
    pub fn read_back(&self, t: &DeviceTensor) -> Result<Vec<f32>, LoadError> {
        self.read_backs.set(self.read_backs.get() + 1);
        self.ops().read_back(t).map_err(op_err)
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
        self.ops().upload_i32(&p, &[n]).map_err(op_err)
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
        let ids = self.ops().upload_i32(&ids, &[ids.len()]).map_err(op_err)?;
        self.ops().gather_rows(x, &ids).map_err(op_err)
    }

    /// Small tensors kept dequantized on the device.
    pub fn kept(&self) -> usize {
        self.device.kept()
    }

    /// What crossed from the device to the host so far.
    pub fn traffic(&self) -> Traffic {
        let c = self.ops().counters();
        Traffic {
            read_back_bytes: c.read_back_bytes,
            weight_read_back_bytes: c.weight_read_back_bytes,
            read_backs: self.read_backs.get(),
            kernel_launches: Some(c.kernel_launches),
        }
    }
}
