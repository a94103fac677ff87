//! The device op layer: a device tensor and one op trait per device, between
//! the families and the platforms.
//!
//! A family computes through [`Ops`], written once; each device implements
//! it: the CPU reference here ([`CpuOps`], `family-ops` as it is), the fake
//! device in `platform-fake` (the same reference run on the fake device's
//! own buffers) and CUDA in `platform-cuda` (kernels compiled at run time by
//! NVRTC). The contract, which every implementation keeps and
//! [`conformance`] checks op by op:
//!
//! - A [`DeviceTensor`] is a buffer on one device, an element type
//!   ([`DType`]) and a shape, outermost dimension first, the last one
//!   contiguous (`[n, ne0]`: `n` rows of `ne0`). Tensors are made by an
//!   [`Ops`] ([`Ops::upload_f32`], an op's output) and belong to it: an op
//!   given another device's tensor answers [`OpError::ForeignTensor`].
//! - A weight is what the seam staged: a [`Weight`] and the [`Resident`]
//!   that [`seam::resident_weight`] handed out for it. An op reads the
//!   staged copy in place; no op reads a weight back to the host
//!   ([`OpCounters::weight_read_back_bytes`] stays 0).
//! - Products round the activations as ggml's CPU does for the weight's
//!   type ([`family_ops::as_ggml_multiplies`]: F16/BF16 for those types,
//!   Q8_0 blocks for 32-element quants, Q8_K for K-quants), so a device
//!   picks the same top-k as the host path.
//! - Shapes are untrusted: every op checks them before it allocates or
//!   launches anything and answers a typed [`OpError`] naming the op and
//!   the shapes; nothing panics.
//! - A sequence's state lives on the device: a [`KvCache`] appended in
//!   place, the conv and delta-rule states of qwen4exp's gated delta-net
//!   written in place; [`Ops::argmax`] and [`Ops::route`] leave their ids
//!   there, so a greedy step reads back 4 bytes.
//!
//! **Architecture Invariant:** this crate knows the seam and `family-ops`,
//! no platform and no vendor API.

use std::sync::atomic::{AtomicU64, Ordering};

use seam::Resident;
use seam::gguf::GgmlType;
use seam::platform::{DeviceBuffer, DeviceError};
use seam::weight::Weight;

pub use family_ops::grids;
pub use family_ops::{Gating, Rope, RopeMode, Scores};

mod cpu;
pub mod libm_rounding;
pub mod reference;
pub use cpu::{CpuOps, CpuStorage, HostStorage, ReferenceOps, WeightKernel};

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;

/// The element type of a [`DeviceTensor`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    /// 32-bit float (activations).
    F32,
    /// 32-bit signed integer (token ids, positions).
    I32,
    /// IEEE half (a [`KvCache`]'s rows with `KvSpec::dtype` F16: each
    /// value rounded to nearest even when written, widened exactly when
    /// read). Only a cache holds it; the other ops take and give F32.
    F16,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 => 2,
        }
    }
}

/// The identity of one [`Ops`] instance; its tensors carry it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OpsId(u64);

impl OpsId {
    /// A new identity, distinct from every other in the process.
    pub fn fresh() -> OpsId {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        OpsId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// A tensor on one device: a buffer, an element type and a shape
/// (outermost first, the last dimension contiguous).
pub struct DeviceTensor {
    buffer: Box<dyn DeviceBuffer>,
    dtype: DType,
    shape: Vec<usize>,
    owner: OpsId,
}

impl std::fmt::Debug for DeviceTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceTensor")
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("owner", &self.owner)
            .finish()
    }
}

impl DeviceTensor {
    /// A tensor over `buffer`, for the [`Ops`] implementation `owner` that
    /// made the buffer (an upload, an op's output). Families get tensors
    /// from [`Ops`], never from here.
    ///
    /// # Errors
    ///
    /// The shape's element count overflows or does not fit the buffer.
    pub fn from_buffer(
        owner: OpsId,
        buffer: Box<dyn DeviceBuffer>,
        dtype: DType,
        shape: &[usize],
    ) -> Result<DeviceTensor, OpError> {
        let bytes = byte_len("tensor", dtype, shape)?;
        if bytes as u64 > buffer.len() {
            return Err(OpError::Invalid {
                op: "tensor",
                why: format!(
                    "shape {shape:?} of {dtype:?} needs {bytes} bytes, the buffer has {}",
                    buffer.len()
                ),
            });
        }
        Ok(DeviceTensor {
            buffer,
            dtype,
            shape: shape.to_vec(),
            owner,
        })
    }

    /// The buffer (for the implementation that made it).
    pub fn buffer(&self) -> &dyn DeviceBuffer {
        &*self.buffer
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shape, outermost first.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The implementation that made it.
    pub fn owner(&self) -> OpsId {
        self.owner
    }

    /// The same buffer under another shape of as many elements (heads as
    /// rows and back); nothing is copied.
    ///
    /// # Errors
    ///
    /// The element counts differ or the shape overflows.
    pub fn reshape(self, shape: &[usize]) -> Result<DeviceTensor, OpError> {
        let bytes = byte_len("reshape", self.dtype, shape)?;
        if bytes != self.len() * self.dtype.size() {
            return Err(OpError::Shape {
                op: "reshape",
                what: "shape",
                got: shape.to_vec(),
                expected: format!("{} elements (the tensor is {:?})", self.len(), self.shape),
            });
        }
        Ok(DeviceTensor {
            shape: shape.to_vec(),
            ..self
        })
    }

    /// `(rows, cols)`: the last dimension and the product of the others.
    ///
    /// # Errors
    ///
    /// A tensor of rank 0.
    pub fn rows_cols(&self, op: &'static str) -> Result<(usize, usize), OpError> {
        match self.shape.split_last() {
            Some((&cols, outer)) => Ok((outer.iter().product(), cols)),
            None => Err(OpError::Invalid {
                op,
                why: "a tensor of rank 0 has no rows".into(),
            }),
        }
    }
}

/// Bytes of a tensor of `shape` and `dtype`, checked for overflow.
///
/// # Errors
///
/// The product overflows.
pub fn byte_len(op: &'static str, dtype: DType, shape: &[usize]) -> Result<usize, OpError> {
    shape
        .iter()
        .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| OpError::Invalid {
            op,
            why: format!("shape {shape:?} overflows"),
        })
}

/// What [`Ops::add_outer`] multiplies `y` by for row `c`, from its weight
/// `s[c]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OuterFactor {
    /// `s[c]` itself.
    Plain,
    /// `post · sigmoid(pre · s[c])`, each step rounded to f32 as
    /// [`Ops::scale`], [`Ops::sigmoid`] and [`Ops::scale`] round it: a
    /// hyper-connection's inject gate (`2 · sigmoid(inj / hc)`), a shared
    /// expert's (`sigmoid(g)`), in the combine's one op.
    Sigmoid {
        /// The scale before the sigmoid.
        pre: f32,
        /// The scale after it.
        post: f32,
    },
}

impl OuterFactor {
    /// The factor of weight `s` (the reference arithmetic).
    pub fn of(self, s: f32) -> f32 {
        match self {
            OuterFactor::Plain => s,
            OuterFactor::Sigmoid { pre, post } => family_ops::ggml_cpu::sigmoid(s * pre) * post,
        }
    }
}

/// The weight an RMSNorm multiplies by, on the device.
#[derive(Clone, Copy, Debug)]
pub enum NormWeight<'a> {
    /// No weight: `x / rms(x)`.
    None,
    /// `x / rms(x) * w`.
    Scale(&'a DeviceTensor),
    /// `x / rms(x) * (1 + w)`.
    OnePlus(&'a DeviceTensor),
}

/// What went wrong in an op. Each variant names the op.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpError {
    /// Two shapes that must agree do not.
    #[error("{op}: {what} has shape {got:?}, expected {expected}")]
    Shape {
        /// The op.
        op: &'static str,
        /// Which operand.
        what: &'static str,
        /// Its shape.
        got: Vec<usize>,
        /// What the other operands imply.
        expected: String,
    },
    /// A tensor of the wrong element type.
    #[error("{op}: {what} is {got:?}, expected {expected:?}")]
    DType {
        /// The op.
        op: &'static str,
        /// Which operand.
        what: &'static str,
        /// Its type.
        got: DType,
        /// The type the op takes.
        expected: DType,
    },
    /// A weight whose dims, type or bytes do not fit the op.
    #[error("{op}: weight {weight} ({ty}, dims {dims:?}): {why}")]
    Weight {
        /// The op.
        op: &'static str,
        /// The weight's name.
        weight: String,
        /// Its type.
        ty: GgmlType,
        /// Its GGUF dims.
        dims: Vec<u64>,
        /// What does not fit.
        why: String,
    },
    /// A weight type this device's op does not cover.
    #[error("{op}: {device} has no kernel for {ty} (weight {weight})")]
    UnsupportedType {
        /// The op.
        op: &'static str,
        /// The device.
        device: String,
        /// The weight's type.
        ty: GgmlType,
        /// The weight's name.
        weight: String,
    },
    /// A row index outside the table.
    #[error("{op}: row {row} of weight {weight} is out of range ({rows} rows)")]
    RowOutOfRange {
        /// The op.
        op: &'static str,
        /// The weight.
        weight: String,
        /// The index asked for.
        row: i64,
        /// The rows the table has.
        rows: u64,
    },
    /// A tensor made by another device (or another op instance).
    #[error("{op}: {what} belongs to another device than {device}")]
    ForeignTensor {
        /// The op.
        op: &'static str,
        /// Which operand.
        what: &'static str,
        /// This device.
        device: String,
    },
    /// A weight staged where this device cannot read it.
    #[error("{op}: weight {weight} is not readable by {device}: {why}")]
    ForeignWeight {
        /// The op.
        op: &'static str,
        /// The weight.
        weight: String,
        /// This device.
        device: String,
        /// Where it lives instead.
        why: String,
    },
    /// Another argument outside its domain.
    #[error("{op}: {why}")]
    Invalid {
        /// The op.
        op: &'static str,
        /// What is wrong.
        why: String,
    },
    /// The device failed.
    #[error("{op}: {source}")]
    Device {
        /// The op.
        op: &'static str,
        /// The device's error.
        source: DeviceError,
    },
    /// The CPU reference refused the arguments.
    #[error("{op}: {source}")]
    Reference {
        /// The op.
        op: &'static str,
        /// family-ops' error.
        source: family_ops::OpsError,
    },
    /// The device's kernels could not be built or loaded (NVRTC absent or
    /// failing, a module the driver refuses).
    #[error("kernels unavailable on {device}: {why}")]
    Kernels {
        /// The device.
        device: String,
        /// Why.
        why: String,
    },
}

impl OpError {
    /// A device error of `op`.
    pub fn device(op: &'static str) -> impl FnOnce(DeviceError) -> OpError {
        move |source| OpError::Device { op, source }
    }

    /// A family-ops error of `op`.
    pub fn reference(op: &'static str) -> impl FnOnce(family_ops::OpsError) -> OpError {
        move |source| OpError::Reference { op, source }
    }
}

/// What an [`Ops`] did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpCounters {
    /// Kernels launched (one per op on the fake and CPU devices; on CUDA
    /// every launch, an op may take two).
    pub kernel_launches: u64,
    /// Bytes copied from the device to the host ([`Ops::read_back`], and
    /// any check an op reads back).
    pub read_back_bytes: u64,
    /// Bytes of staged weights read back to the host: 0 for every op here.
    pub weight_read_back_bytes: u64,
    /// Host-to-device and device-to-host transfers (uploads, read-backs).
    pub host_transfers: u64,
    /// Bytes uploaded from the host.
    pub upload_bytes: u64,
}

/// The counters an implementation updates (atomics, so ops may run from
/// several threads).
#[derive(Debug, Default)]
pub struct CounterCell {
    kernel_launches: AtomicU64,
    read_back_bytes: AtomicU64,
    weight_read_back_bytes: AtomicU64,
    host_transfers: AtomicU64,
    upload_bytes: AtomicU64,
}

impl CounterCell {
    /// One kernel launched.
    pub fn launch(&self) {
        self.kernel_launches.fetch_add(1, Ordering::Relaxed);
    }
    /// One upload of `bytes`.
    pub fn upload(&self, bytes: usize) {
        self.host_transfers.fetch_add(1, Ordering::Relaxed);
        self.upload_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }
    /// One read-back of `bytes` of activations.
    pub fn read_back(&self, bytes: usize) {
        self.host_transfers.fetch_add(1, Ordering::Relaxed);
        self.read_back_bytes
            .fetch_add(bytes as u64, Ordering::Relaxed);
    }
    /// One read-back of `bytes` of a staged weight (counted in both).
    pub fn weight_read_back(&self, bytes: usize) {
        self.read_back(bytes);
        self.weight_read_back_bytes
            .fetch_add(bytes as u64, Ordering::Relaxed);
    }
    /// The counts now.
    pub fn snapshot(&self) -> OpCounters {
        OpCounters {
            kernel_launches: self.kernel_launches.load(Ordering::Relaxed),
            read_back_bytes: self.read_back_bytes.load(Ordering::Relaxed),
            weight_read_back_bytes: self.weight_read_back_bytes.load(Ordering::Relaxed),
            host_transfers: self.host_transfers.load(Ordering::Relaxed),
            upload_bytes: self.upload_bytes.load(Ordering::Relaxed),
        }
    }
}

/// The operations of one device. Object safe: a family holds a
/// `&dyn Ops` picked at run time.
///
/// Every op checks its operands (owner, element type, shapes) before it
/// allocates or launches, and returns a new tensor; inputs are never
/// changed, except the state an op takes by `&mut` (a [`KvCache`]'s rows
/// through [`Ops::write_rows`], the conv and delta-rule states of
/// [`Ops::ssm_conv`] and [`Ops::delta_net`]), which it writes in place on
/// the device.
pub trait Ops: Send + Sync {
    /// This instance's identity (its tensors carry it).
    fn id(&self) -> OpsId;

    /// The device's name (`"cpu"`, `"fake"`, `"cuda:0"`).
    fn device_name(&self) -> String;

    /// Uploads host activations of `shape`.
    ///
    /// # Errors
    ///
    /// `data` does not hold `shape`'s elements, or the device failed.
    fn upload_f32(&self, data: &[f32], shape: &[usize]) -> Result<DeviceTensor, OpError>;

    /// Uploads host integers (token ids, positions) of `shape`.
    ///
    /// # Errors
    ///
    /// As [`Ops::upload_f32`].
    fn upload_i32(&self, data: &[i32], shape: &[usize]) -> Result<DeviceTensor, OpError>;

    /// Copies an F32 tensor back to the host (counted in
    /// [`OpCounters::read_back_bytes`]).
    ///
    /// # Errors
    ///
    /// Another device's tensor, not F32, or the device failed.
    fn read_back(&self, t: &DeviceTensor) -> Result<Vec<f32>, OpError>;

    /// `y = x · Wᵀ`: a staged weight of GGUF dims `[ne0, rows...]` times
    /// `x` (`[n, ne0]`, any leading dims), giving `[n, rows]` (`x`'s leading
    /// dims, then the weight's rows). The weight is dequantized on the fly
    /// where it lives; `x` is rounded as ggml's CPU rounds activations for
    /// the weight's type (the reference: ggml's one-token `mul_mat`
    /// arithmetic bit for bit for the types `family_ops::ggml_cpu`
    /// reproduces, [`reference::matmul`]; a device sums in its own order).
    ///
    /// # Errors
    ///
    /// Shapes that do not fit, a type without a kernel here, a weight this
    /// device cannot read.
    fn matmul(
        &self,
        weight: &Weight,
        resident: &Resident<'_>,
        x: &DeviceTensor,
    ) -> Result<DeviceTensor, OpError>;

    /// Expert products (ggml's `mul_mat_id`): a staged expert stack of
    /// GGUF dims `[ne0, rows, n_expert]` and the picks `ids` (`I32 [n, k]`,
    /// on the device, as [`Ops::route`] leaves them): `y[i][t] =
    /// W[ids[i][t]] · x̃` with `x̃` row `i` of `x` (`[n, ne0]`, one input per
    /// token) or row `i · k + t` (`[n · k, ne0]`, one per pick), rounded as
    /// [`Ops::matmul`] rounds it. Gives `[n, k, rows]`.
    ///
    /// The device does not read the ids back: where the reference refuses
    /// an id outside the stack, a device writes NaN to that pick's row.
    ///
    /// # Errors
    ///
    /// As [`check_matmul_id`] and [`Ops::matmul`].
    fn matmul_id(
        &self,
        weight: &Weight,
        resident: &Resident<'_>,
        x: &DeviceTensor,
        ids: &DeviceTensor,
    ) -> Result<DeviceTensor, OpError>;

    /// Rows `ids` (I32, any shape) of a staged table of GGUF dims `[ne0,
    /// rows...]`, dequantized: `ids.shape() + [ne0]`.
    ///
    /// # Errors
    ///
    /// An id outside the table, or as [`Ops::matmul`].
    fn get_rows(
        &self,
        weight: &Weight,
        resident: &Resident<'_>,
        ids: &DeviceTensor,
    ) -> Result<DeviceTensor, OpError>;

    /// A whole staged weight dequantized to F32 on the device: `[rows,
    /// ne0]` (norm gains, biases: small tensors).
    ///
    /// # Errors
    ///
    /// As [`Ops::matmul`].
    fn dequantize(&self, weight: &Weight, resident: &Resident<'_>)
    -> Result<DeviceTensor, OpError>;

    /// RMSNorm of each row (`family_ops::rms_norm`'s rounding): `x /
    /// sqrt(mean(x²) + eps)`, times the weight if any: `[cols]`, or `[m,
    /// cols]` with `m` dividing the rows, row `i` times weight row `i % m`
    /// (a hyper-connection's per-stream gains over its streams' rows).
    ///
    /// # Errors
    ///
    /// As [`check_norm_weight`].
    fn rms_norm(
        &self,
        x: &DeviceTensor,
        eps: f32,
        weight: NormWeight<'_>,
    ) -> Result<DeviceTensor, OpError>;

    /// RoPE (`family_ops::rope`) of each row of `x` (one token's heads of
    /// `head_dim`) at `positions` (I32, one per row).
    ///
    /// # Errors
    ///
    /// Rows not whole heads, `n_rot` odd or past the head, a position count
    /// that is not the row count, a negative position.
    fn rope(
        &self,
        x: &DeviceTensor,
        positions: &DeviceTensor,
        head_dim: usize,
        rope: &Rope,
    ) -> Result<DeviceTensor, OpError>;

    /// IMROPE (qwen4exp's multi-section RoPE; the reference is ggml's
    /// `rope_multi` in `f32`, `family_ops::ggml_cpu::rope_multi`) of each
    /// row of `x` (one token's heads of `head_dim`) at `positions` (`I32
    /// [rows, 4]`: `t, h, w, e` a row; a text token at `p` is `p, p, p,
    /// 0`).
    ///
    /// # Errors
    ///
    /// As [`check_imrope`].
    fn imrope(
        &self,
        x: &DeviceTensor,
        positions: &DeviceTensor,
        head_dim: usize,
        rope: &MultiRope,
    ) -> Result<DeviceTensor, OpError>;

    /// ggml's `soft_max_ext` of each row (`family_ops::ggml_cpu::soft_max`):
    /// `softmax(x · scale + mask)`, the mask (`[m, cols]`, `m` dividing the
    /// rows) repeated over the rows; `-inf` drops an entry.
    ///
    /// # Errors
    ///
    /// A mask of another width or a row count that does not divide.
    fn softmax(
        &self,
        x: &DeviceTensor,
        scale: f32,
        mask: Option<&DeviceTensor>,
    ) -> Result<DeviceTensor, OpError>;

    /// SiLU, element-wise (the reference: ggml's unary op over each row,
    /// `family_ops::ggml_cpu::silu_row`: whole 8s vectorized, the rest with
    /// libm's `expf`).
    ///
    /// # Errors
    ///
    /// Another device's tensor, not F32.
    fn silu(&self, x: &DeviceTensor) -> Result<DeviceTensor, OpError>;

    /// SiLU of `x · s` (the product rounded to f32 as [`Ops::scale`]
    /// rounds it), element-wise: a scale and its activation in one op.
    ///
    /// # Errors
    ///
    /// As [`Ops::silu`].
    fn silu_scaled(&self, x: &DeviceTensor, s: f32) -> Result<DeviceTensor, OpError>;

    /// GELU, element-wise (the tanh form, [`reference::gelu`]).
    ///
    /// # Errors
    ///
    /// As [`Ops::silu`].
    fn gelu(&self, x: &DeviceTensor) -> Result<DeviceTensor, OpError>;

    /// `silu(gate) · up` (`family_ops::ggml_cpu::swiglu`, row by row).
    ///
    /// # Errors
    ///
    /// The shapes differ.
    fn swiglu(&self, gate: &DeviceTensor, up: &DeviceTensor) -> Result<DeviceTensor, OpError>;

    /// `a + b`, `b` repeated over `a` (its element count divides `a`'s and
    /// its shape is a suffix of `a`'s).
    ///
    /// # Errors
    ///
    /// `b` does not repeat over `a`.
    fn add(&self, a: &DeviceTensor, b: &DeviceTensor) -> Result<DeviceTensor, OpError>;

    /// `a · b` element-wise, `b` repeated as in [`Ops::add`].
    ///
    /// # Errors
    ///
    /// As [`Ops::add`].
    fn mul(&self, a: &DeviceTensor, b: &DeviceTensor) -> Result<DeviceTensor, OpError>;

    /// `a · sigmoid(b)` element-wise, `b` repeated as in [`Ops::add`], the
    /// sigmoid rounded as [`Ops::sigmoid`] rounds it: a gate and its
    /// product in one op.
    ///
    /// # Errors
    ///
    /// As [`Ops::add`].
    fn mul_sigmoid(&self, a: &DeviceTensor, b: &DeviceTensor) -> Result<DeviceTensor, OpError>;

    /// `a · s`.
    ///
    /// # Errors
    ///
    /// As [`Ops::silu`].
    fn scale(&self, a: &DeviceTensor, s: f32) -> Result<DeviceTensor, OpError>;

    /// The logistic function, element-wise (ggml's unary op in `f32`,
    /// `family_ops::ggml_cpu::sigmoid`).
    ///
    /// # Errors
    ///
    /// As [`Ops::silu`].
    fn sigmoid(&self, x: &DeviceTensor) -> Result<DeviceTensor, OpError>;

    /// ggml's softplus, element-wise (`family_ops::ggml_cpu::softplus`).
    ///
    /// # Errors
    ///
    /// As [`Ops::silu`].
    fn softplus(&self, x: &DeviceTensor) -> Result<DeviceTensor, OpError>;

    /// Gated DeltaNet's gates of `n` tokens from their projections
    /// (`alpha`, `beta`: `[n, n_v_heads]`): the log decay `g =
    /// softplus(alpha + dt_bias) · a` and `sigmoid(beta)`, `dt_bias` and
    /// `a` (`n_v_heads` each) repeated over the tokens, each step rounded
    /// as [`Ops::add`], [`Ops::softplus`], [`Ops::mul`] and
    /// [`Ops::sigmoid`] round it: `(g, beta)`, the inputs of
    /// [`Ops::delta_net`], in one op.
    ///
    /// # Errors
    ///
    /// As [`check_delta_gates`].
    fn delta_gates(
        &self,
        alpha: &DeviceTensor,
        beta: &DeviceTensor,
        dt_bias: &DeviceTensor,
        a: &DeviceTensor,
    ) -> Result<(DeviceTensor, DeviceTensor), OpError>;

    /// `x / sqrt(Σ x² + eps)` of each row as llama.cpp's Gated DeltaNet
    /// computes it (`family_ops::ggml_cpu::l2_norm`: an RMSNorm with `eps /
    /// cols`, then a scale by `1 / sqrtf(cols)`; reshape to one head a row
    /// first).
    ///
    /// # Errors
    ///
    /// As [`Ops::silu`].
    fn l2_norm(&self, x: &DeviceTensor, eps: f32) -> Result<DeviceTensor, OpError>;

    /// Columns `start..start + len` of each row of `x` (F32), copied: `x`'s
    /// leading dims and `len` (a fused projection's parts: q, k and v of a
    /// delta-net's conv output).
    ///
    /// # Errors
    ///
    /// The columns are past `x`'s rows.
    fn slice_cols(
        &self,
        x: &DeviceTensor,
        start: usize,
        len: usize,
    ) -> Result<DeviceTensor, OpError>;

    /// A new tensor of `shape` and `dtype` holding zeros (a state at the
    /// start of a sequence), made on the device: nothing is uploaded.
    ///
    /// # Errors
    ///
    /// The shape overflows, or the device failed.
    fn zeros(&self, dtype: DType, shape: &[usize]) -> Result<DeviceTensor, OpError>;

    /// Copies an I32 tensor back to the host (counted in
    /// [`OpCounters::read_back_bytes`]): the ids of [`Ops::argmax`] and
    /// [`Ops::route`].
    ///
    /// # Errors
    ///
    /// Another device's tensor, not I32, or the device failed.
    fn read_back_i32(&self, t: &DeviceTensor) -> Result<Vec<i32>, OpError>;

    /// Writes `src`'s rows into `dst` in place, from row `row0`:
    /// `dst[row0 + i] = src[i]` (a KV cache's append, [`KvCache::append`]).
    /// `src` F32, `dst` F32 or F16 (each value rounded to nearest even
    /// f16), rows of the same width; the other rows of `dst` are left as
    /// they are.
    ///
    /// # Errors
    ///
    /// Another width or element type, or rows past `dst`'s end
    /// ([`check_write_rows`]).
    fn write_rows(
        &self,
        dst: &mut DeviceTensor,
        row0: usize,
        src: &DeviceTensor,
    ) -> Result<(), OpError>;

    /// Attention of the query rows `q` (`[n_q, n_head · head_dim_k]`) over
    /// the first `cache.len()` slots of `cache` (slot `j` holds position
    /// `j`): ggml's attention without flash attention for each row
    /// (`family_ops::ggml_cpu::attention_cached`: over an F16 cache `q` and
    /// the probabilities converted to F16 for the two products; with a
    /// softcap `family_ops::attention_scored`), with query row `i`'s mask
    /// from `attn.mask`. Gives `[n_q, n_head · head_dim_v]`.
    /// GQA: query head `h` reads K/V head `h / (n_head / n_head_kv)`.
    ///
    /// # Errors
    ///
    /// As [`check_attention`].
    fn attention(
        &self,
        q: &DeviceTensor,
        cache: &KvCache,
        attn: &Attention<'_>,
    ) -> Result<DeviceTensor, OpError>;

    /// Top-k expert routing of each row of router logits
    /// (`[n, n_expert]`) as [`reference::route`] does it
    /// (ggml's `f32` softmax or sigmoid, then `family_ops::route_probs`
    /// with `TieOrder::Libstdcxx`: the selection bias, the `k` experts llama.cpp's CPU
    /// `top_k` picks, libstdc++'s heap-select members where scores tie
    /// across the `k`-th place, listed highest first and equal scores by
    /// index, then the norm and the scale): the expert ids (`I32 [n, k]`)
    /// and their weights (`F32 [n, k]`), both on the device.
    ///
    /// The device does not check values: where the reference refuses a NaN
    /// logit, a device ranks it by `f32::total_cmp` (a positive NaN first).
    ///
    /// # Errors
    ///
    /// As [`check_route`].
    fn route(
        &self,
        logits: &DeviceTensor,
        routing: &DeviceRouting<'_>,
    ) -> Result<(DeviceTensor, DeviceTensor), OpError>;

    /// The mix of each token's expert outputs (`build_moe_ffn`'s
    /// aggregate, `family_ops::ggml_cpu::moe::mix`): `y` `[n, k, cols]` (as
    /// [`Ops::matmul_id`] gives them) weighed by `w` `[n, k]` (as
    /// [`Ops::route`] gives them), each product rounded and added over the
    /// picks in order in `f32`: `[n, cols]`. With `k = 1` it scales each row by its
    /// own factor (a shared expert's gate).
    ///
    /// # Errors
    ///
    /// `w` is not `[n, k]` of `y`'s `[n, k, cols]`.
    fn mix_experts(&self, y: &DeviceTensor, w: &DeviceTensor) -> Result<DeviceTensor, OpError>;

    /// `r + f(s) ⊗ y`: `r` `[m, n]` (rows of `n`, `m` of them), `s`
    /// holding `m` values and `y` holding `n` (any shapes): `out[c][j] =
    /// r[c][j] + f(s[c]) · y[j]` with `f` as `factor` says, the product
    /// rounded to f32 once, then the sum (what `y` repeated over `m` rows,
    /// [`Ops::mix_experts`] with `k = 1` and [`Ops::add`] give, in one op):
    /// a hyper-connection's combine adds a layer's output to every stream
    /// with the stream's own gate.
    ///
    /// # Errors
    ///
    /// Another device's tensor, not F32, or the lengths do not fit.
    fn add_outer(
        &self,
        r: &DeviceTensor,
        s: &DeviceTensor,
        y: &DeviceTensor,
        factor: OuterFactor,
    ) -> Result<DeviceTensor, OpError>;

    /// The mean over the rows of `x ⊙ sigmoid(g)`: `x` `[m, n]`, `g` of
    /// as many values, `[1, n]` out: `out[j] = Σ_c w · (x[c][j] ·
    /// sigmoid(g[c][j]))` with `w = 1/m` rounded to f32, as ggml's fused
    /// `hc_pre` computes it (`family_ops::ggml_cpu::hc_pre_gated`: the
    /// gated products added over the rows in order in `f32`, then times
    /// `w`): a hyper-connection's gated mix of its streams.
    ///
    /// # Errors
    ///
    /// Another device's tensor, not F32, `g` of another length, or `x` of
    /// no rows.
    fn gated_mean_rows(&self, x: &DeviceTensor, g: &DeviceTensor) -> Result<DeviceTensor, OpError>;

    /// Rows `ids` (I32, any shape) of `table` (`[rows, cols]` F32, a
    /// tensor of this device, such as a per-expert scale kept there):
    /// `ids.shape() + [cols]`, so a value picked by device-side ids (a
    /// route's) never comes to the host. The device does not read the ids
    /// back: where the reference refuses an id outside the table, a device
    /// writes NaN to that row.
    ///
    /// # Errors
    ///
    /// Another device's tensor, `table` not F32 or `ids` not I32.
    fn gather_rows(
        &self,
        table: &DeviceTensor,
        ids: &DeviceTensor,
    ) -> Result<DeviceTensor, OpError>;

    /// The index of the first largest value of each row of `x` (`[n,
    /// cols]`, `family_ops::argmax`: ties to the lower index, a NaN never
    /// wins unless it is first): `I32 [n]` (greedy decoding reads back 4
    /// bytes a token); `[1]` for a single row of rank 1.
    ///
    /// # Errors
    ///
    /// Another device's tensor, not F32, rank 0.
    fn argmax(&self, x: &DeviceTensor) -> Result<DeviceTensor, OpError>;

    /// Gated DeltaNet's short causal convolution and SiLU over `x`'s rows
    /// (`[n, channels]`, one token a row, oldest first), carrying `state`
    /// (`[d_conv − 1, channels]`, oldest row first) from the tokens before:
    /// ggml's `ssm_conv` then SiLU token by token
    /// (`family_ops::ggml_cpu::ssm_conv`, `silu_row`), with the kernel `w`
    /// (`[channels, d_conv]`, ggml's `ssm_conv1d.weight` dequantized). Gives
    /// `[n, channels]`; `state` then holds the last `d_conv − 1` inputs.
    ///
    /// # Errors
    ///
    /// As [`check_ssm_conv`].
    fn ssm_conv(
        &self,
        state: &mut DeviceTensor,
        x: &DeviceTensor,
        w: &DeviceTensor,
    ) -> Result<DeviceTensor, OpError>;

    /// Gated DeltaNet's delta rule over `n` tokens (ggml's fused
    /// `gated_delta_net` in `f32`, `family_ops::ggml_cpu::gated_delta_net`,
    /// token by token):
    /// `state` (`[n_v_heads, S, S]`, `M[i][c]` of key dim `i` and value dim
    /// `c`), `q` and `k` (`[n, n_k_heads · S]`, L2-normalized), `v` (`[n,
    /// n_v_heads · S]`), `g` (the log decay: `[n, n_v_heads]`, one a head,
    /// or KDA's `[n, n_v_heads · S]`, one a key channel: the state's row of
    /// key `i` decays by `expf(g_i)`, `family_ops::ggml_cpu::gated_delta_net_kda`)
    /// and `beta` (`[n, n_v_heads]`).
    /// V head `j` reads q/k head `j mod n_k_heads`. Gives `[n, n_v_heads ·
    /// S]`, the heads' outputs divided by `sqrt(S)`.
    ///
    /// # Errors
    ///
    /// As [`check_delta_net`].
    fn delta_net(
        &self,
        state: &mut DeviceTensor,
        qkv: [&DeviceTensor; 3],
        g: &DeviceTensor,
        beta: &DeviceTensor,
    ) -> Result<DeviceTensor, OpError>;

    /// What this instance did so far.
    fn counters(&self) -> OpCounters;

    // glm_moe_dsa's ops

    /// ggml's `rope_ext` in `f32` (`family_ops::ggml_cpu::rope_ext`: the
    /// running `f32` angle, YaRN's ramp and magnitude, normal or NEOX
    /// pairs, a partial `n_rot` with the rest copied) of each row of `x`
    /// (one token's heads of `head_dim`) at `positions` (I32, one per row).
    ///
    /// # Errors
    ///
    /// As [`check_rope_ggml`].
    fn rope_ggml(
        &self,
        x: &DeviceTensor,
        positions: &DeviceTensor,
        head_dim: usize,
        rope: &GgmlRope,
    ) -> Result<DeviceTensor, OpError>;

    /// The columns of `b` after those of `a`, row by row (F32, the same
    /// row count): `a`'s leading dims and `cols(a) + cols(b)` (MLA's query
    /// and key, `[latent | rope part]`).
    ///
    /// # Errors
    ///
    /// As [`check_concat_cols`].
    fn concat_cols(&self, a: &DeviceTensor, b: &DeviceTensor) -> Result<DeviceTensor, OpError>;

    /// ggml's `norm` of each row without a weight
    /// (`family_ops::ggml_cpu::norm`): `(x - mean) / sqrt(var + eps)` (the
    /// lightning indexer's key).
    ///
    /// # Errors
    ///
    /// Another device's tensor, not F32, rank 0.
    fn layer_norm(&self, x: &DeviceTensor, eps: f32) -> Result<DeviceTensor, OpError>;

    /// The orthonormal fast Walsh-Hadamard transform of each run of `n`
    /// values of each row (`family_ops::ggml_cpu::fwht`: times `1 /
    /// sqrt(n)`, then the butterflies at strides 1, 2, 4, ...): the
    /// indexer's rotation of its query heads and key.
    ///
    /// # Errors
    ///
    /// As [`check_hadamard`].
    fn hadamard(&self, x: &DeviceTensor, n: usize) -> Result<DeviceTensor, OpError>;

    /// The lightning indexer's score of each of the first `n_keys` rows of
    /// `keys` (`[rows, d]`, F32 or F16 as a cache stores them) for one
    /// token's query `q` (`n_head · d` values) and head weights `w`
    /// (`n_head` values): `Σ_h max(q_h · k, 0) · w_h`
    /// (`family_ops::ggml_cpu::lightning_score`). Gives `[1, n_keys]`.
    ///
    /// # Errors
    ///
    /// As [`check_lightning_scores`].
    fn lightning_scores(
        &self,
        q: &DeviceTensor,
        keys: &DeviceTensor,
        n_keys: usize,
        w: &DeviceTensor,
    ) -> Result<DeviceTensor, OpError>;

    // muse_glimmer's ops

    /// A final logit softcap `c`, element-wise
    /// (`family_ops::ggml_cpu::softcap`: llama.cpp's `ggml_scale(1/c)`,
    /// `ggml_tanh`, `ggml_scale(c)`, each step rounded to `f32`): every
    /// value lands in `(-c, c)`.
    ///
    /// # Errors
    ///
    /// As [`Ops::silu`], or `c` not finite and positive
    /// ([`check_softcap`]).
    fn softcap(&self, x: &DeviceTensor, c: f32) -> Result<DeviceTensor, OpError>;

    /// `y = x · Wᵀ` as [`Ops::matmul`] shapes it, the arithmetic of a
    /// float64 reference (a projector's: [`reference::matmul_f64`], `x`
    /// rounded as ggml rounds the activations of the weight's type, each
    /// dot summed in `f64` and rounded once). A device sums in its own
    /// order (the conformance check's `Tolerance::MATMUL`).
    ///
    /// # Errors
    ///
    /// As [`Ops::matmul`].
    fn matmul_f64(
        &self,
        weight: &Weight,
        resident: &Resident<'_>,
        x: &DeviceTensor,
    ) -> Result<DeviceTensor, OpError>;

    /// Every row of `a` (`[n, k]`, any leading dims) dotted with every row
    /// of `b` (`[m, k]`): `[n, m]`, each dot summed in `f64` in index order
    /// and rounded once (`family_ops::projector::dot_rows_f64`): products
    /// of activations by activations (a patch embedding's dequantized
    /// kernel, a bilinear resize's weights).
    ///
    /// # Errors
    ///
    /// As [`check_dot_rows`].
    fn dot_rows_f64(&self, a: &DeviceTensor, b: &DeviceTensor) -> Result<DeviceTensor, OpError>;

    /// The last two dims of `x` (F32, rank 2 or more) swapped, copied:
    /// `[..., r, c]` becomes `[..., c, r]`.
    ///
    /// # Errors
    ///
    /// As [`Ops::silu`], or rank below 2.
    fn transpose(&self, x: &DeviceTensor) -> Result<DeviceTensor, OpError>;

    /// LayerNorm of each row in `f64` (`family_ops::projector::layer_norm`):
    /// `(x - mean) / sqrt(var + eps)`, times `w` and plus `b` (`[cols]`
    /// each) where given, rounded once.
    ///
    /// # Errors
    ///
    /// As [`Ops::silu`], or `w` or `b` not `[cols]` ([`check_row_vector`]).
    fn layer_norm_f64(
        &self,
        x: &DeviceTensor,
        eps: f32,
        w: Option<&DeviceTensor>,
        b: Option<&DeviceTensor>,
    ) -> Result<DeviceTensor, OpError>;

    /// The exact GELU, element-wise (`family_ops::projector::gelu_erf`:
    /// `0.5 · x · (1 + erf(x / √2))` in `f64`, rounded once).
    ///
    /// # Errors
    ///
    /// As [`Ops::silu`].
    fn gelu_erf(&self, x: &DeviceTensor) -> Result<DeviceTensor, OpError>;

    /// Each value rounded to the nearest even f16 and widened back
    /// ([`reference::round_f16`]): what ggml's F16 im2col keeps of a
    /// value.
    ///
    /// # Errors
    ///
    /// As [`Ops::silu`].
    fn round_f16(&self, x: &DeviceTensor) -> Result<DeviceTensor, OpError>;

    // glm5_next's ops

    /// KDA's log decay of each key channel (`glm5-next.cpp`): `g1 =
    /// alpha + dt_bias` (`alpha` `[n, n_head · S]`, `dt_bias` one a
    /// channel), then with `a` (one a head, broadcast over its `S`
    /// channels) either `softplus(g1) · a` or, with a `lower_bound`,
    /// `sigmoid(-(g1 · a)) · lower_bound`, each step an `f32` op as ggml's unary and binary ops
    /// round it (`family_ops::ggml_cpu::{softplus, sigmoid}`): the `g` of
    /// [`Ops::delta_net`] with [`DeltaGate::PerKey`].
    ///
    /// # Errors
    ///
    /// As [`check_kda_gate`].
    fn kda_gate(
        &self,
        alpha: &DeviceTensor,
        dt_bias: &DeviceTensor,
        a: &DeviceTensor,
        lower_bound: Option<f32>,
    ) -> Result<DeviceTensor, OpError>;

    /// mHC's weights of one token from its mixes (`build_hc_pre`): `mix`
    /// (`2·hc + hc²` values, `fn · flat`), `scale` (3 values) and `base`
    /// (as `mix`) give `pre_c = sigmoid(mix_c · scale_0 + base_c) + eps`,
    /// `post_c = sigmoid(mix_{hc+c} · scale_1 + base_{hc+c}) · 2` (each
    /// step rounded, ggml's element-wise ops) and the Sinkhorn combination
    /// of the rest (`family_ops::ggml_cpu::hc_comb` with `scale_2`, `eps`
    /// and `iters`): `(pre [1, hc], post [1, hc], comb [1, hc²])`,
    /// `comb[dst + hc · src]`.
    ///
    /// # Errors
    ///
    /// As [`check_hc_weights`].
    fn hc_weights(
        &self,
        mix: &DeviceTensor,
        scale: &DeviceTensor,
        base: &DeviceTensor,
        sinkhorn: &HcSinkhorn,
    ) -> Result<(DeviceTensor, DeviceTensor, DeviceTensor), OpError>;

    /// `scale · Σ_c x[c] · w[c]` of the `hc` runs of `n` values of `x`
    /// (`hc · n` values, any shape: `[hc, n]` or the streams as one row;
    /// `w` `hc` values): `[1, n]`, the rounded products added over the rows in
    /// order (`family_ops::ggml_cpu::hc_pre_weighted`): mHC's layer input
    /// from its streams, and with `w` all ones the streams' mean.
    ///
    /// # Errors
    ///
    /// As [`check_hc_pre_weighted`].
    fn hc_pre_weighted(
        &self,
        x: &DeviceTensor,
        w: &DeviceTensor,
        scale: f32,
    ) -> Result<DeviceTensor, OpError>;

    /// mHC's streams after a layer (`family_ops::ggml_cpu::hc_post_mixed`):
    /// stream `dst` is `y · post[dst] + Σ_src residual[src] · comb[dst +
    /// hc · src]`, each product rounded, added in `src` order: `y` `n`
    /// values, `residual` `hc · n` (any shape), `post` `hc` values and
    /// `comb` `hc²`. Gives `[hc, n]`.
    ///
    /// # Errors
    ///
    /// As [`check_hc_post_mixed`].
    fn hc_post_mixed(
        &self,
        y: &DeviceTensor,
        residual: &DeviceTensor,
        post: &DeviceTensor,
        comb: &DeviceTensor,
    ) -> Result<DeviceTensor, OpError>;

    /// The k-pool indexer's pooled key of rows `first..first + kp` of
    /// `keys` and `gates` (`[rows, d]`, F32 or F16 as a cache stores them):
    /// for each dim `d`, the softmax over the pool's members of `gate +
    /// ape` (`ape` `[kp, d]`, the position embedding) weighs the keys,
    /// summed (`family_ops::ggml_cpu::{soft_max, sum}`). Gives `[1, d]`.
    ///
    /// # Errors
    ///
    /// As [`check_pool_keys`].
    fn pool_keys(
        &self,
        keys: &DeviceTensor,
        gates: &DeviceTensor,
        first: usize,
        ape: &DeviceTensor,
    ) -> Result<DeviceTensor, OpError>;

    /// Attention of one token's `n_head` query rows (`q` `[n_head, d]` or
    /// `[1, n_head · d]`) over the slot list `slots` (I32, a row of
    /// `cells` each, `-1` a dead slot) of one latent head whose keys and
    /// values are the same rows (`kv` `[rows, d]`, F32 or F16 widened),
    /// as llama.cpp's gathered k-pool attention computes it: a live slot's
    /// score `dot_f32(cell, q_h)`, a dead one's 0 masked to `-inf`,
    /// `soft_max` with `scale` in slot order, each output channel the
    /// `dot_f32` of the slots' values (0 where dead) with the weights.
    /// Gives `[1, n_head · d]`.
    ///
    /// # Errors
    ///
    /// As [`check_attention_slots`].
    fn attention_slots(
        &self,
        q: &DeviceTensor,
        kv: &DeviceTensor,
        slots: &DeviceTensor,
        scale: f32,
    ) -> Result<DeviceTensor, OpError>;

    /// The clamped SwiGLU of `build_ffn` with a limit
    /// (`family_ops::ggml_cpu::swiglu_clamp`): `g = min(gate, limit)`, `u =
    /// clamp(up, -limit, limit)`, `g / (1 + expf(-g)) · u`, element-wise
    /// over tensors of one shape.
    ///
    /// # Errors
    ///
    /// As [`Ops::swiglu`].
    fn swiglu_clamp(
        &self,
        gate: &DeviceTensor,
        up: &DeviceTensor,
        limit: f32,
    ) -> Result<DeviceTensor, OpError>;
}

// --- checks every implementation shares -------------------------------------

/// Checks that `t` belongs to `ops` and has `dtype`.
///
/// # Errors
///
/// [`OpError::ForeignTensor`] or [`OpError::DType`].
pub fn check_tensor(
    ops: &dyn Ops,
    op: &'static str,
    what: &'static str,
    t: &DeviceTensor,
    dtype: DType,
) -> Result<(), OpError> {
    if t.owner != ops.id() {
        return Err(OpError::ForeignTensor {
            op,
            what,
            device: ops.device_name(),
        });
    }
    if t.dtype != dtype {
        return Err(OpError::DType {
            op,
            what,
            got: t.dtype,
            expected: dtype,
        });
    }
    Ok(())
}

/// Checks that `data` holds `shape`'s elements.
///
/// # Errors
///
/// [`OpError::Shape`].
pub fn check_upload(op: &'static str, len: usize, shape: &[usize]) -> Result<(), OpError> {
    let bytes = byte_len(op, DType::F32, shape)?;
    if bytes / 4 != len {
        return Err(OpError::Shape {
            op,
            what: "shape",
            got: shape.to_vec(),
            expected: format!("{len} elements (the data given)"),
        });
    }
    Ok(())
}

/// A staged weight's geometry, checked: `rows` rows of `ne0` elements of
/// `ty`, `row_bytes` each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightShape {
    /// The ggml type.
    pub ty: GgmlType,
    /// Elements per row (GGUF `ne0`).
    pub ne0: usize,
    /// Rows (the product of the other dims).
    pub rows: usize,
    /// Bytes per row.
    pub row_bytes: usize,
}

impl WeightShape {
    /// Checks `weight`'s dims and type against what it holds: `resident`
    /// must be at least `rows · row_bytes` long.
    ///
    /// # Errors
    ///
    /// [`OpError::Weight`]: no dims, a row that is not whole blocks, an
    /// overflow, or fewer bytes than the dims say.
    pub fn of(
        op: &'static str,
        weight: &Weight,
        resident: &Resident<'_>,
    ) -> Result<WeightShape, OpError> {
        let bad = |why: String| OpError::Weight {
            op,
            weight: weight.name().to_owned(),
            ty: weight.ggml_type(),
            dims: weight.dims().to_vec(),
            why,
        };
        let ty = weight.ggml_type();
        let dims = weight.dims();
        let (&ne0, rest) = dims.split_first().ok_or_else(|| bad("no dims".into()))?;
        let rows = rest
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or_else(|| bad("the row count overflows".into()))?;
        let row_bytes = ty
            .row_bytes(ne0)
            .ok_or_else(|| bad(format!("a row of {ne0} is not whole blocks of {ty}")))?;
        let total = row_bytes
            .checked_mul(rows)
            .ok_or_else(|| bad("the byte count overflows".into()))?;
        let have = match resident {
            Resident::Host(view) => view.len() as u64,
            Resident::Device(copy) => copy.buffer().len(),
        };
        if have < total {
            return Err(bad(format!("holds {have} bytes, the dims need {total}")));
        }
        let to_usize = |v: u64| usize::try_from(v).map_err(|_| bad(format!("{v} > usize")));
        Ok(WeightShape {
            ty,
            ne0: to_usize(ne0)?,
            rows: to_usize(rows)?,
            row_bytes: to_usize(row_bytes)?,
        })
    }
}

/// Checks that `b` repeats over `a` (element-wise ops): `b`'s shape is a
/// suffix of `a`'s (leading 1s of `b` aside) and not empty unless `a` is.
///
/// # Errors
///
/// [`OpError::Shape`].
pub fn check_repeat(op: &'static str, a: &DeviceTensor, b: &DeviceTensor) -> Result<(), OpError> {
    let mut bs: &[usize] = b.shape();
    while let Some((&1, rest)) = bs.split_first() {
        bs = rest;
    }
    if !a.shape().ends_with(bs) || (b.is_empty() && !a.is_empty()) {
        return Err(OpError::Shape {
            op,
            what: "b",
            got: b.shape().to_vec(),
            expected: format!("a suffix of a's shape {:?}", a.shape()),
        });
    }
    Ok(())
}

/// The checks of [`Ops::rms_norm`]'s weight `w` for `x`: whole rows of
/// `x`'s width, a count `m` of them that divides `x`'s rows; gives `m`.
///
/// # Errors
///
/// [`OpError::Shape`].
pub fn check_norm_weight(
    op: &'static str,
    x: &DeviceTensor,
    w: &DeviceTensor,
) -> Result<usize, OpError> {
    let (rows, cols) = x.rows_cols(op)?;
    let m = w.len().checked_div(cols).unwrap_or(0);
    if m == 0 || m * cols != w.len() || !rows.is_multiple_of(m) {
        return Err(OpError::Shape {
            op,
            what: "weight",
            got: w.shape().to_vec(),
            expected: format!(
                "[{cols}] or [m, {cols}] with m dividing {rows} (x is {:?})",
                x.shape()
            ),
        });
    }
    Ok(m)
}

/// The checks of [`Ops::delta_gates`]: `beta` of `alpha`'s shape,
/// `dt_bias` and `a` of its width; gives `(n, n_v_heads)`.
///
/// # Errors
///
/// [`OpError::Shape`].
pub fn check_delta_gates(
    op: &'static str,
    alpha: &DeviceTensor,
    beta: &DeviceTensor,
    dt_bias: &DeviceTensor,
    a: &DeviceTensor,
) -> Result<(usize, usize), OpError> {
    check_same(op, "beta", alpha, beta)?;
    let (n, hv) = alpha.rows_cols(op)?;
    for (what, t) in [("dt_bias", dt_bias), ("a", a)] {
        if t.len() != hv {
            return Err(OpError::Shape {
                op,
                what,
                got: t.shape().to_vec(),
                expected: format!("{hv} values (alpha is {:?})", alpha.shape()),
            });
        }
    }
    Ok((n, hv))
}

/// Checks the same shape.
///
/// # Errors
///
/// [`OpError::Shape`].
pub fn check_same(
    op: &'static str,
    what: &'static str,
    a: &DeviceTensor,
    b: &DeviceTensor,
) -> Result<(), OpError> {
    if a.shape() != b.shape() {
        return Err(OpError::Shape {
            op,
            what,
            got: b.shape().to_vec(),
            expected: format!("{:?}", a.shape()),
        });
    }
    Ok(())
}

/// The output shape of [`Ops::matmul`], after checking `x` against the
/// weight: `x`'s leading dims and the weight's rows.
///
/// # Errors
///
/// [`OpError::Shape`]: `x`'s last dim is not the weight's `ne0`.
pub fn matmul_shape(
    op: &'static str,
    w: &WeightShape,
    x: &DeviceTensor,
) -> Result<Vec<usize>, OpError> {
    let (_, cols) = x.rows_cols(op)?;
    if cols != w.ne0 {
        return Err(OpError::Shape {
            op,
            what: "x",
            got: x.shape().to_vec(),
            expected: format!("[.., {}] (the weight's ne0)", w.ne0),
        });
    }
    let mut shape = x.shape()[..x.shape().len() - 1].to_vec();
    shape.push(w.rows);
    byte_len(op, DType::F32, &shape)?;
    Ok(shape)
}

/// The checks of [`Ops::rope`]: `x` rows of whole heads, `n_rot` even and
/// within the head, a finite positive base, one position per row.
///
/// # Errors
///
/// [`OpError::Invalid`] or [`OpError::Shape`].
pub fn check_rope(
    op: &'static str,
    x: &DeviceTensor,
    positions: &DeviceTensor,
    head_dim: usize,
    rope: &Rope,
) -> Result<(), OpError> {
    let (rows, cols) = x.rows_cols(op)?;
    if head_dim == 0 || !cols.is_multiple_of(head_dim) {
        return Err(OpError::Shape {
            op,
            what: "x",
            got: x.shape().to_vec(),
            expected: format!("rows of whole heads of {head_dim}"),
        });
    }
    if !rope.n_rot.is_multiple_of(2) || rope.n_rot > head_dim {
        return Err(OpError::Invalid {
            op,
            why: format!(
                "n_rot {} must be even and at most the head size {head_dim}",
                rope.n_rot
            ),
        });
    }
    if !(rope.freq_base.is_finite() && rope.freq_base > 0.0) {
        return Err(OpError::Invalid {
            op,
            why: format!("freq_base {}", rope.freq_base),
        });
    }
    if positions.len() != rows {
        return Err(OpError::Shape {
            op,
            what: "positions",
            got: positions.shape().to_vec(),
            expected: format!("{rows} positions (one per row of x {:?})", x.shape()),
        });
    }
    Ok(())
}

/// The parameters of [`Ops::imrope`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MultiRope {
    /// Leading dims of each head that rotate (even, at most the head).
    pub n_rot: usize,
    /// The frequencies' base.
    pub freq_base: f32,
    /// `rope.dimension_sections` (`t, h, w, e`).
    pub sections: [usize; 4],
}

/// The checks of [`Ops::imrope`]: `x` rows of whole heads, `n_rot` even
/// and within the head, a finite positive base, sections summing to at
/// most `i32::MAX / 3`, `positions` `[rows, 4]`.
///
/// # Errors
///
/// [`OpError::Invalid`] or [`OpError::Shape`].
pub fn check_imrope(
    op: &'static str,
    x: &DeviceTensor,
    positions: &DeviceTensor,
    head_dim: usize,
    rope: &MultiRope,
) -> Result<(), OpError> {
    let (rows, cols) = x.rows_cols(op)?;
    if head_dim == 0 || !cols.is_multiple_of(head_dim) {
        return Err(OpError::Shape {
            op,
            what: "x",
            got: x.shape().to_vec(),
            expected: format!("rows of whole heads of {head_dim}"),
        });
    }
    let sections = rope
        .sections
        .iter()
        .try_fold(0usize, |a, &b| a.checked_add(b));
    if !rope.n_rot.is_multiple_of(2)
        || rope.n_rot > head_dim
        || !(rope.freq_base.is_finite() && rope.freq_base > 0.0)
        || sections.is_none_or(|s| s > (i32::MAX / 3) as usize)
    {
        return Err(OpError::Invalid {
            op,
            why: format!("{rope:?} for heads of {head_dim}"),
        });
    }
    if positions.rows_cols(op)? != (rows, 4) || positions.shape().len() != 2 {
        return Err(OpError::Shape {
            op,
            what: "positions",
            got: positions.shape().to_vec(),
            expected: format!("[{rows}, 4] (t, h, w, e of each row of x {:?})", x.shape()),
        });
    }
    Ok(())
}

/// The checks of [`Ops::softmax`]'s mask: `[m, cols]` with `m` dividing
/// `x`'s rows.
///
/// # Errors
///
/// [`OpError::Shape`].
pub fn check_mask(op: &'static str, x: &DeviceTensor, mask: &DeviceTensor) -> Result<(), OpError> {
    let (rows, cols) = x.rows_cols(op)?;
    let (mrows, mcols) = mask.rows_cols(op)?;
    if mcols != cols || mrows == 0 || !rows.is_multiple_of(mrows) {
        return Err(OpError::Shape {
            op,
            what: "mask",
            got: mask.shape().to_vec(),
            expected: format!("[m, {cols}] with m dividing {rows} (x is {:?})", x.shape()),
        });
    }
    Ok(())
}

/// The shape of a [`KvCache`]: `n_ctx` slots of `n_head_kv` heads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvSpec {
    /// Slots (positions) the cache holds.
    pub n_ctx: usize,
    /// K/V heads.
    pub n_head_kv: usize,
    /// Size of a key head.
    pub head_dim_k: usize,
    /// Size of a value head.
    pub head_dim_v: usize,
    /// The element type of the stored rows: F32, or F16 (llama.cpp's
    /// default KV cache type: each value rounded to nearest even f16 when
    /// appended, read back as f32 by attention; the reference is
    /// [`reference::kv_stored`]). The ops read the type from here.
    pub dtype: DType,
}

/// A KV cache on one device: K rows `[n_ctx, n_head_kv · head_dim_k]` and V
/// rows `[n_ctx, n_head_kv · head_dim_v]`, slot `j` holding position `j`,
/// the first [`KvCache::len`] slots filled.
#[derive(Debug)]
pub struct KvCache {
    spec: KvSpec,
    k: DeviceTensor,
    v: DeviceTensor,
    len: usize,
}

impl KvCache {
    /// An empty cache of `spec` on `ops`' device (zeros, made there).
    ///
    /// # Errors
    ///
    /// A zero dimension, an element type other than F32 or F16, an
    /// overflow, or the device failed.
    pub fn new(ops: &dyn Ops, spec: KvSpec) -> Result<KvCache, OpError> {
        const OP: &str = "kv_cache";
        if !matches!(spec.dtype, DType::F32 | DType::F16) {
            return Err(OpError::DType {
                op: OP,
                what: "cache",
                got: spec.dtype,
                expected: DType::F32,
            });
        }
        if spec.n_ctx == 0 || spec.n_head_kv == 0 || spec.head_dim_k == 0 || spec.head_dim_v == 0 {
            return Err(OpError::Invalid {
                op: OP,
                why: format!("a dimension of {spec:?} is 0"),
            });
        }
        let width = |d: usize| {
            spec.n_head_kv
                .checked_mul(d)
                .ok_or_else(|| OpError::Invalid {
                    op: OP,
                    why: format!("{spec:?} overflows"),
                })
        };
        let k = ops.zeros(spec.dtype, &[spec.n_ctx, width(spec.head_dim_k)?])?;
        let v = ops.zeros(spec.dtype, &[spec.n_ctx, width(spec.head_dim_v)?])?;
        Ok(KvCache { spec, k, v, len: 0 })
    }

    /// Appends the K and V rows of one position or more (`[n, n_head_kv ·
    /// head_dim_k]` and `[n, n_head_kv · head_dim_v]`) at slots `len()..len()
    /// + n`.
    ///
    /// # Errors
    ///
    /// Rows of another width, another count of K and V rows, more than the
    /// cache has room for; the cache is unchanged then.
    pub fn append(
        &mut self,
        ops: &dyn Ops,
        k: &DeviceTensor,
        v: &DeviceTensor,
    ) -> Result<(), OpError> {
        const OP: &str = "kv_append";
        let (nk, _) = k.rows_cols(OP)?;
        let (nv, _) = v.rows_cols(OP)?;
        if nk != nv {
            return Err(OpError::Shape {
                op: OP,
                what: "v",
                got: v.shape().to_vec(),
                expected: format!("{nk} rows (as k {:?})", k.shape()),
            });
        }
        check_write_rows(OP, &self.k, self.len, k)?;
        check_write_rows(OP, &self.v, self.len, v)?;
        ops.write_rows(&mut self.k, self.len, k)?;
        ops.write_rows(&mut self.v, self.len, v)?;
        self.len += nk;
        Ok(())
    }

    /// Room for `need` slots: where the cache has less, it becomes one of
    /// twice the room (or more), every slot copied at its place (F16 rows
    /// as they are stored), the filled count kept.
    ///
    /// # Errors
    ///
    /// An overflow, or the device failed; the cache is unchanged then.
    pub fn reserve(&mut self, ops: &dyn Ops, need: usize) -> Result<(), OpError> {
        if need <= self.spec.n_ctx {
            return Ok(());
        }
        let mut spec = self.spec;
        while spec.n_ctx < need {
            spec.n_ctx = spec.n_ctx.checked_mul(2).ok_or_else(|| OpError::Invalid {
                op: "kv_reserve",
                why: format!("room for {need} slots overflows"),
            })?;
        }
        let mut bigger = KvCache::new(ops, spec)?;
        ops.write_rows(&mut bigger.k, 0, &self.k)?;
        ops.write_rows(&mut bigger.v, 0, &self.v)?;
        bigger.len = self.len;
        *self = bigger;
        Ok(())
    }

    /// Forgets every slot from `len` on (a new sequence: 0).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Filled slots.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no slot is filled.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The shape.
    pub fn spec(&self) -> &KvSpec {
        &self.spec
    }

    /// The K rows (all `n_ctx` slots; the first [`KvCache::len`] filled).
    pub fn k(&self) -> &DeviceTensor {
        &self.k
    }

    /// The V rows, as [`KvCache::k`].
    pub fn v(&self) -> &DeviceTensor {
        &self.v
    }

    /// The layer's head shape for `n_head` query heads.
    pub fn shape(&self, n_head: usize) -> family_ops::AttentionShape {
        family_ops::AttentionShape {
            n_head,
            n_head_kv: self.spec.n_head_kv,
            head_dim_k: self.spec.head_dim_k,
            head_dim_v: self.spec.head_dim_v,
        }
    }
}

/// Which cache slots each query row of [`Ops::attention`] sees.
#[derive(Clone, Copy, Debug)]
pub enum AttnMask<'a> {
    /// Every filled slot.
    All,
    /// Causal: query row `i` is at position `pos0 + i` and sees slots
    /// `j <= pos0 + i`.
    Causal {
        /// The first query row's position.
        pos0: usize,
    },
    /// Causal within the last `window` positions (`family_ops::Mask::
    /// SlidingWindow`): `j <= p && p - j < window` for `p = pos0 + i`.
    SlidingWindow {
        /// The first query row's position.
        pos0: usize,
        /// The window, the query's own position included.
        window: usize,
    },
    /// An additive mask `[m, cache.len()]` (F32), row `i % m` for query row
    /// `i`, added to the scores; `-inf` hides a slot.
    Additive(&'a DeviceTensor),
}

/// The arguments of [`Ops::attention`] besides the query and the cache.
#[derive(Clone, Copy, Debug)]
pub struct Attention<'a> {
    /// Query heads (a multiple of the cache's K/V heads).
    pub n_head: usize,
    /// The scale and the optional softcap of the scores.
    pub scores: family_ops::Scores,
    /// Which slots each row sees.
    pub mask: AttnMask<'a>,
}

/// The router of [`Ops::route`] (`family_ops::Routing` with its bias on the
/// device).
#[derive(Clone, Copy, Debug)]
pub struct DeviceRouting<'a> {
    /// Logits to probabilities.
    pub gating: Gating,
    /// Experts chosen per row.
    pub k: usize,
    /// The selection bias, `[n_expert]` F32 (selection only).
    pub bias: Option<&'a DeviceTensor>,
    /// Divide the chosen weights by their sum.
    pub normalize: bool,
    /// Then multiply them by this.
    pub scale: f32,
}

/// What [`check_matmul_id`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertDims {
    /// Tokens (rows of `ids`).
    pub n: usize,
    /// Picks per token.
    pub k: usize,
    /// Rows of one expert.
    pub rows: usize,
    /// Experts in the stack.
    pub n_expert: usize,
    /// Whether `x` has one row per pick (else one per token).
    pub per_pick: bool,
}

/// The checks of [`Ops::matmul_id`]: a stack of three GGUF dims whose rows
/// `w` describes, `ids` `[n, k]`, `x` rows of the stack's `ne0`, `n` or
/// `n · k` of them.
///
/// # Errors
///
/// [`OpError::Weight`] or [`OpError::Shape`].
pub fn check_matmul_id(
    op: &'static str,
    weight: &Weight,
    w: &WeightShape,
    x: &DeviceTensor,
    ids: &DeviceTensor,
) -> Result<ExpertDims, OpError> {
    let dims = weight.dims();
    let (rows, n_expert) = match *dims {
        [_, r, e] => (
            usize::try_from(r).unwrap_or(usize::MAX),
            usize::try_from(e).unwrap_or(usize::MAX),
        ),
        _ => {
            return Err(OpError::Weight {
                op,
                weight: weight.name().to_owned(),
                ty: weight.ggml_type(),
                dims: dims.to_vec(),
                why: "an expert stack has dims [ne0, rows, n_expert]".into(),
            });
        }
    };
    let (n, k) = ids.rows_cols(op)?;
    let (xrows, cols) = x.rows_cols(op)?;
    let per_pick = xrows != n;
    if cols != w.ne0 || (per_pick && Some(xrows) != n.checked_mul(k)) {
        return Err(OpError::Shape {
            op,
            what: "x",
            got: x.shape().to_vec(),
            expected: format!("[{n} or {n} x {k}, {}] (ids are {:?})", w.ne0, ids.shape()),
        });
    }
    byte_len(op, DType::F32, &[n, k, rows])?;
    Ok(ExpertDims {
        n,
        k,
        rows,
        n_expert,
        per_pick,
    })
}

/// The checks of [`Ops::mix_experts`]: `y` of rank 3 `[n, k, cols]` and
/// `w` `[n, k]`; gives `(n, k, cols)`.
///
/// # Errors
///
/// [`OpError::Shape`].
pub fn check_mix_experts(
    op: &'static str,
    y: &DeviceTensor,
    w: &DeviceTensor,
) -> Result<(usize, usize, usize), OpError> {
    let [n, k, cols] = *y.shape() else {
        return Err(OpError::Shape {
            op,
            what: "y",
            got: y.shape().to_vec(),
            expected: "[n, k, cols]".into(),
        });
    };
    if w.shape() != [n, k] {
        return Err(OpError::Shape {
            op,
            what: "w",
            got: w.shape().to_vec(),
            expected: format!("[{n}, {k}] (y is {:?})", y.shape()),
        });
    }
    Ok((n, k, cols))
}

/// The checks of [`Ops::add_outer`]: gives `(m, n)`.
///
/// # Errors
///
/// [`OpError::Shape`].
pub fn check_add_outer(
    op: &'static str,
    r: &DeviceTensor,
    s: &DeviceTensor,
    y: &DeviceTensor,
) -> Result<(usize, usize), OpError> {
    let (m, n) = r.rows_cols(op)?;
    for (what, t, want) in [("s", s, m), ("y", y, n)] {
        if t.len() != want {
            return Err(OpError::Shape {
                op,
                what,
                got: t.shape().to_vec(),
                expected: format!("{want} values (r is {:?})", r.shape()),
            });
        }
    }
    Ok((m, n))
}

/// The checks of [`Ops::gated_mean_rows`]: gives `(m, n)`, `m > 0`.
///
/// # Errors
///
/// [`OpError::Shape`].
pub fn check_gated_mean_rows(
    op: &'static str,
    x: &DeviceTensor,
    g: &DeviceTensor,
) -> Result<(usize, usize), OpError> {
    let (m, n) = x.rows_cols(op)?;
    if g.len() != x.len() || m == 0 {
        return Err(OpError::Shape {
            op,
            what: "g",
            got: g.shape().to_vec(),
            expected: format!("as many values as x {:?}, of at least one row", x.shape()),
        });
    }
    Ok((m, n))
}

/// The checks of [`Ops::gather_rows`]: gives `(rows, cols)` of the table
/// and the output shape `ids.shape() + [cols]`.
///
/// # Errors
///
/// [`OpError::Shape`] (a table of rank 0) or an overflowing output.
pub fn check_gather_rows(
    op: &'static str,
    table: &DeviceTensor,
    ids: &DeviceTensor,
) -> Result<(usize, usize, Vec<usize>), OpError> {
    let (rows, cols) = table.rows_cols(op)?;
    let mut shape = ids.shape().to_vec();
    shape.push(cols);
    byte_len(op, DType::F32, &shape)?;
    Ok((rows, cols, shape))
}

/// The checks of [`Ops::slice_cols`]: `start + len` within `x`'s rows;
/// gives the output shape.
///
/// # Errors
///
/// [`OpError::Shape`].
pub fn check_slice_cols(
    op: &'static str,
    x: &DeviceTensor,
    start: usize,
    len: usize,
) -> Result<Vec<usize>, OpError> {
    let (_, cols) = x.rows_cols(op)?;
    if start.checked_add(len).is_none_or(|end| end > cols) {
        return Err(OpError::Shape {
            op,
            what: "x",
            got: x.shape().to_vec(),
            expected: format!("rows of at least {start} + {len} columns"),
        });
    }
    let mut shape = x.shape().to_vec();
    if let Some(last) = shape.last_mut() {
        *last = len;
    }
    Ok(shape)
}

/// The checks of [`Ops::write_rows`]: F32 rows into F32 or F16 rows of
/// one width (F16 rows into F16, copied as they are), `row0 + n` within
/// `dst`. (Owners are checked by the op.)
///
/// # Errors
///
/// [`OpError::DType`], [`OpError::Shape`].
pub fn check_write_rows(
    op: &'static str,
    dst: &DeviceTensor,
    row0: usize,
    src: &DeviceTensor,
) -> Result<(), OpError> {
    for (what, t, ok) in [
        ("dst", dst, matches!(dst.dtype(), DType::F32 | DType::F16)),
        (
            "src",
            src,
            src.dtype() == DType::F32 || src.dtype() == dst.dtype(),
        ),
    ] {
        if !ok {
            return Err(OpError::DType {
                op,
                what,
                got: t.dtype(),
                expected: DType::F32,
            });
        }
    }
    let (rows, cols) = dst.rows_cols(op)?;
    let (n, scols) = src.rows_cols(op)?;
    if scols != cols || row0.checked_add(n).is_none_or(|end| end > rows) {
        return Err(OpError::Shape {
            op,
            what: "src",
            got: src.shape().to_vec(),
            expected: format!(
                "rows of {cols} fitting from row {row0} in {rows} (dst is {:?})",
                dst.shape()
            ),
        });
    }
    Ok(())
}

/// What [`check_attention`] found: the head shape and the rows.
#[derive(Clone, Copy, Debug)]
pub struct AttentionDims {
    /// The heads.
    pub shape: family_ops::AttentionShape,
    /// Query rows.
    pub n_q: usize,
    /// Filled cache slots.
    pub n_kv: usize,
    /// Rows of an additive mask (1 otherwise).
    pub mask_rows: usize,
}

/// The checks of [`Ops::attention`]: `n_head` a non-zero multiple of the
/// cache's K/V heads, `q` rows of `n_head · head_dim_k`, a finite scale, a
/// finite positive softcap, an additive mask `[m, cache.len()]` with `m`
/// dividing the rows. (Owners and element types are checked by the op.)
///
/// # Errors
///
/// [`OpError::Invalid`] or [`OpError::Shape`].
pub fn check_attention(
    op: &'static str,
    q: &DeviceTensor,
    cache: &KvCache,
    attn: &Attention<'_>,
) -> Result<AttentionDims, OpError> {
    let spec = cache.spec();
    if attn.n_head == 0 || !attn.n_head.is_multiple_of(spec.n_head_kv) {
        return Err(OpError::Invalid {
            op,
            why: format!(
                "{} query heads over {} K/V heads",
                attn.n_head, spec.n_head_kv
            ),
        });
    }
    let sc = attn.scores;
    if !sc.scale.is_finite() || sc.softcap.is_some_and(|c| !(c.is_finite() && c > 0.0)) {
        return Err(OpError::Invalid {
            op,
            why: format!("scale {} softcap {:?}", sc.scale, sc.softcap),
        });
    }
    let (n_q, cols) = q.rows_cols(op)?;
    let want = attn.n_head.checked_mul(spec.head_dim_k);
    if want != Some(cols) {
        return Err(OpError::Shape {
            op,
            what: "q",
            got: q.shape().to_vec(),
            expected: format!("[n, {} heads x {}]", attn.n_head, spec.head_dim_k),
        });
    }
    byte_len(op, DType::F32, &[n_q, attn.n_head, spec.head_dim_v])?;
    let n_kv = cache.len();
    let mask_rows = match attn.mask {
        AttnMask::Additive(m) => {
            let (mrows, mcols) = m.rows_cols(op)?;
            if mcols != n_kv || mrows == 0 || !n_q.is_multiple_of(mrows) {
                return Err(OpError::Shape {
                    op,
                    what: "mask",
                    got: m.shape().to_vec(),
                    expected: format!("[m, {n_kv}] with m dividing {n_q} query rows"),
                });
            }
            mrows
        }
        AttnMask::Causal { pos0 } | AttnMask::SlidingWindow { pos0, .. } => {
            if pos0.checked_add(n_q).is_none_or(|e| e > i64::MAX as usize) {
                return Err(OpError::Invalid {
                    op,
                    why: format!("position {pos0} overflows"),
                });
            }
            1
        }
        AttnMask::All => 1,
    };
    Ok(AttentionDims {
        shape: cache.shape(attn.n_head),
        n_q,
        n_kv,
        mask_rows,
    })
}

/// The checks of [`Ops::route`]: `k` in `1..=n_expert`, a bias of one row
/// of `n_expert`, a finite scale; gives `(rows, n_expert)`. (Owners and
/// element types are checked by the op.)
///
/// # Errors
///
/// [`OpError::Invalid`] or [`OpError::Shape`].
pub fn check_route(
    op: &'static str,
    logits: &DeviceTensor,
    routing: &DeviceRouting<'_>,
) -> Result<(usize, usize), OpError> {
    let (rows, n_expert) = logits.rows_cols(op)?;
    if routing.k == 0 || routing.k > n_expert || !routing.scale.is_finite() {
        return Err(OpError::Invalid {
            op,
            why: format!(
                "k = {} of {n_expert} experts, scale {}",
                routing.k, routing.scale
            ),
        });
    }
    if let Some(b) = routing.bias
        && b.len() != n_expert
    {
        return Err(OpError::Shape {
            op,
            what: "bias",
            got: b.shape().to_vec(),
            expected: format!("[{n_expert}] (logits are {:?})", logits.shape()),
        });
    }
    Ok((rows, n_expert))
}

/// The checks of [`Ops::ssm_conv`]: `w` `[channels, d_conv]` with `d_conv
/// >= 1`, `state` `[d_conv - 1, channels]`, `x` rows of `channels`; gives
/// `(n, channels, d_conv)`.
///
/// # Errors
///
/// [`OpError::Shape`].
pub fn check_ssm_conv(
    op: &'static str,
    state: &DeviceTensor,
    x: &DeviceTensor,
    w: &DeviceTensor,
) -> Result<(usize, usize, usize), OpError> {
    let (n, channels) = x.rows_cols(op)?;
    let (wrows, d_conv) = w.rows_cols(op)?;
    if wrows != channels || d_conv == 0 || channels == 0 {
        return Err(OpError::Shape {
            op,
            what: "w",
            got: w.shape().to_vec(),
            expected: format!("[{channels}, d_conv >= 1] (x is {:?})", x.shape()),
        });
    }
    let (srows, scols) = state.rows_cols(op)?;
    if srows != d_conv - 1 || scols != channels {
        return Err(OpError::Shape {
            op,
            what: "state",
            got: state.shape().to_vec(),
            expected: format!("[{}, {channels}]", d_conv - 1),
        });
    }
    Ok((n, channels, d_conv))
}

/// How [`Ops::delta_net`]'s log decay is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeltaGate {
    /// One value a V head (Gated DeltaNet: `[n, n_v_heads]`).
    PerHead,
    /// One value a key channel of each V head (KDA: `[n, n_v_heads · S]`).
    PerKey,
}

/// What [`check_delta_net`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaNetDims {
    /// Tokens.
    pub n: usize,
    /// The head size `S`.
    pub s: usize,
    /// Q/K heads.
    pub n_k_heads: usize,
    /// V heads (a multiple of the Q/K heads).
    pub n_v_heads: usize,
    /// The log decay's layout.
    pub gate: DeltaGate,
}

/// The checks of [`Ops::delta_net`]: `state` `[n_v_heads, S, S]`, `q` and
/// `k` `[n, n_k_heads · S]` with `n_k_heads` dividing `n_v_heads`, `v`
/// `[n, n_v_heads · S]`, `g` `[n, n_v_heads]` or `[n, n_v_heads · S]`
/// ([`DeltaGate`]), `beta` `[n, n_v_heads]`.
///
/// # Errors
///
/// [`OpError::Shape`].
pub fn check_delta_net(
    op: &'static str,
    state: &DeviceTensor,
    qkv: [&DeviceTensor; 3],
    g: &DeviceTensor,
    beta: &DeviceTensor,
) -> Result<DeltaNetDims, OpError> {
    let [q, k, v] = qkv;
    let (hv, s) = match *state.shape() {
        [hv, s, s2] if s == s2 && s > 0 && hv > 0 => (hv, s),
        _ => {
            return Err(OpError::Shape {
                op,
                what: "state",
                got: state.shape().to_vec(),
                expected: "[n_v_heads, S, S], both non-zero".into(),
            });
        }
    };
    let (n, qcols) = q.rows_cols(op)?;
    let hk = qcols / s;
    let bad = |what, t: &DeviceTensor, expected: String| OpError::Shape {
        op,
        what,
        got: t.shape().to_vec(),
        expected,
    };
    if hk == 0 || qcols != hk * s || !hv.is_multiple_of(hk) {
        return Err(bad(
            "q",
            q,
            format!("[n, n_k_heads x {s}] with n_k_heads dividing {hv}"),
        ));
    }
    for (what, t, cols) in [("k", k, hk * s), ("v", v, hv * s), ("beta", beta, hv)] {
        if t.rows_cols(op)? != (n, cols) {
            return Err(bad(what, t, format!("{n} rows of {cols}")));
        }
    }
    let gate = match g.rows_cols(op)? {
        (gn, c) if gn == n && c == hv => DeltaGate::PerHead,
        (gn, c) if gn == n && c == hv * s => DeltaGate::PerKey,
        _ => {
            return Err(bad(
                "g",
                g,
                format!("{n} rows of {hv} (a head) or {} (a key channel)", hv * s),
            ));
        }
    };
    Ok(DeltaNetDims {
        n,
        s,
        n_k_heads: hk,
        n_v_heads: hv,
        gate,
    })
}

/// `n` little-endian `f32` bytes as values.
pub fn f32s_from_le(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// `n` little-endian `i32` bytes as values.
pub fn i32s_from_le(bytes: &[u8]) -> Vec<i32> {
    bytes
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Values as little-endian bytes.
pub fn le_bytes<T: Copy + ToLe>(values: &[T]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le()).collect()
}

/// A 4-byte value's little-endian bytes.
pub trait ToLe {
    /// The bytes.
    fn to_le(self) -> [u8; 4];
}

impl ToLe for f32 {
    fn to_le(self) -> [u8; 4] {
        self.to_le_bytes()
    }
}

impl ToLe for i32 {
    fn to_le(self) -> [u8; 4] {
        self.to_le_bytes()
    }
}

// glm_moe_dsa's ops

pub use family_ops::ggml_cpu::GgmlRope;

/// The checks of [`Ops::rope_ggml`]: as [`check_rope`] (rows of whole
/// heads, `n_rot` even and within the head, a finite positive base, one
/// position per row), and a finite positive `freq_scale`.
///
/// # Errors
///
/// [`OpError::Invalid`] or [`OpError::Shape`].
pub fn check_rope_ggml(
    op: &'static str,
    x: &DeviceTensor,
    positions: &DeviceTensor,
    head_dim: usize,
    rope: &GgmlRope,
) -> Result<(), OpError> {
    let plain = Rope {
        n_rot: rope.n_rot,
        freq_base: rope.freq_base,
        mode: rope.mode,
    };
    check_rope(op, x, positions, head_dim, &plain)?;
    if !(rope.freq_scale.is_finite() && rope.freq_scale > 0.0) {
        return Err(OpError::Invalid {
            op,
            why: format!("freq_scale {}", rope.freq_scale),
        });
    }
    Ok(())
}

/// The checks of [`Ops::concat_cols`]: as many rows in `a` and `b`, and
/// the output's shape (`a`'s leading dims, the columns summed).
///
/// # Errors
///
/// [`OpError::Shape`].
pub fn check_concat_cols(
    op: &'static str,
    a: &DeviceTensor,
    b: &DeviceTensor,
) -> Result<Vec<usize>, OpError> {
    let (ra, ca) = a.rows_cols(op)?;
    let (rb, cb) = b.rows_cols(op)?;
    if ra != rb {
        return Err(OpError::Shape {
            op,
            what: "b",
            got: b.shape().to_vec(),
            expected: format!("{ra} rows (as a {:?})", a.shape()),
        });
    }
    let mut shape = a.shape().to_vec();
    if let Some(last) = shape.last_mut() {
        *last = ca + cb;
    }
    Ok(shape)
}

/// The checks of [`Ops::hadamard`]: `n` a power of two dividing the rows.
///
/// # Errors
///
/// [`OpError::Invalid`] or [`OpError::Shape`].
pub fn check_hadamard(op: &'static str, x: &DeviceTensor, n: usize) -> Result<(), OpError> {
    let (_, cols) = x.rows_cols(op)?;
    if !n.is_power_of_two() {
        return Err(OpError::Invalid {
            op,
            why: format!("a transform of {n} values: not a power of two"),
        });
    }
    if !cols.is_multiple_of(n) {
        return Err(OpError::Shape {
            op,
            what: "x",
            got: x.shape().to_vec(),
            expected: format!("rows of whole runs of {n}"),
        });
    }
    Ok(())
}

/// The checks of [`Ops::lightning_scores`]: `keys` `[rows, d]` F32 or F16
/// with `n_keys` at most its rows, `q` whole heads of `d`, `w` one value a
/// head. Returns `(n_head, d)`.
///
/// # Errors
///
/// [`OpError::DType`] or [`OpError::Shape`].
pub fn check_lightning_scores(
    op: &'static str,
    q: &DeviceTensor,
    keys: &DeviceTensor,
    n_keys: usize,
    w: &DeviceTensor,
) -> Result<(usize, usize), OpError> {
    if !matches!(keys.dtype(), DType::F32 | DType::F16) {
        return Err(OpError::DType {
            op,
            what: "keys",
            got: keys.dtype(),
            expected: DType::F32,
        });
    }
    let (rows, d) = keys.rows_cols(op)?;
    if n_keys > rows || d == 0 {
        return Err(OpError::Shape {
            op,
            what: "keys",
            got: keys.shape().to_vec(),
            expected: format!("at least {n_keys} rows of some values"),
        });
    }
    let n_head = w.len();
    if n_head == 0 || q.len() != n_head * d {
        return Err(OpError::Shape {
            op,
            what: "q",
            got: q.shape().to_vec(),
            expected: format!("{n_head} heads of {d} (one a value of w)"),
        });
    }
    Ok((n_head, d))
}

// glm5_next's ops

/// The checks of [`Ops::kda_gate`]: `alpha` `[n, c]`, `dt_bias` `c`
/// values, `a` of a length dividing `c` (one a head of `c / len(a)`
/// channels). Gives `(n, c, channels a head)`.
///
/// # Errors
///
/// [`OpError::Shape`].
pub fn check_kda_gate(
    op: &'static str,
    alpha: &DeviceTensor,
    dt_bias: &DeviceTensor,
    a: &DeviceTensor,
) -> Result<(usize, usize, usize), OpError> {
    let (n, c) = alpha.rows_cols(op)?;
    if dt_bias.len() != c {
        return Err(OpError::Shape {
            op,
            what: "dt_bias",
            got: dt_bias.shape().to_vec(),
            expected: format!("{c} values (alpha is {:?})", alpha.shape()),
        });
    }
    if a.is_empty() || !c.is_multiple_of(a.len()) {
        return Err(OpError::Shape {
            op,
            what: "a",
            got: a.shape().to_vec(),
            expected: format!("one value a head of the {c} channels"),
        });
    }
    Ok((n, c, c / a.len()))
}

/// mHC's Sinkhorn combination ([`Ops::hc_weights`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HcSinkhorn {
    /// Streams.
    pub hc: usize,
    /// The epsilon added to `pre` and in every normalization.
    pub eps: f32,
    /// Sinkhorn iterations.
    pub iters: usize,
}

/// The checks of [`Ops::hc_weights`]: `mix` and `base` `2·hc + hc²`
/// values, `scale` 3, `hc` and `iters` non-zero.
///
/// # Errors
///
/// [`OpError::Invalid`] or [`OpError::Shape`].
pub fn check_hc_weights(
    op: &'static str,
    mix: &DeviceTensor,
    scale: &DeviceTensor,
    base: &DeviceTensor,
    sinkhorn: &HcSinkhorn,
) -> Result<(), OpError> {
    let hc = sinkhorn.hc;
    if hc == 0 || sinkhorn.iters == 0 {
        return Err(OpError::Invalid {
            op,
            why: format!("{hc} streams, {} iterations", sinkhorn.iters),
        });
    }
    let n = 2 * hc + hc * hc;
    for (what, t, len) in [("mix", mix, n), ("scale", scale, 3), ("base", base, n)] {
        if t.len() != len {
            return Err(OpError::Shape {
                op,
                what,
                got: t.shape().to_vec(),
                expected: format!("{len} values ({hc} streams)"),
            });
        }
    }
    Ok(())
}

/// The checks of [`Ops::hc_pre_weighted`]: `x` F32 of `hc · n` values,
/// `w` `hc` values (at least one). Gives `(hc, n)`.
///
/// # Errors
///
/// [`OpError::Shape`].
pub fn check_hc_pre_weighted(
    op: &'static str,
    x: &DeviceTensor,
    w: &DeviceTensor,
) -> Result<(usize, usize), OpError> {
    let hc = w.len();
    if hc == 0 || !x.len().is_multiple_of(hc) {
        return Err(OpError::Shape {
            op,
            what: "w",
            got: w.shape().to_vec(),
            expected: format!("a value a run of x {:?}", x.shape()),
        });
    }
    Ok((hc, x.len() / hc))
}

/// The checks of [`Ops::hc_post_mixed`]: `post` `hc` values (at least
/// one), `y` `n`, `residual` `hc · n`, `comb` `hc²`. Gives `(hc, n)`.
///
/// # Errors
///
/// [`OpError::Shape`].
pub fn check_hc_post_mixed(
    op: &'static str,
    y: &DeviceTensor,
    residual: &DeviceTensor,
    post: &DeviceTensor,
    comb: &DeviceTensor,
) -> Result<(usize, usize), OpError> {
    let (hc, n) = (post.len(), y.len());
    for (what, t, len) in [
        ("post", post, hc.max(1)),
        ("residual", residual, hc * n),
        ("comb", comb, hc * hc),
    ] {
        if t.len() != len {
            return Err(OpError::Shape {
                op,
                what,
                got: t.shape().to_vec(),
                expected: format!("{len} values ({hc} streams of {n})"),
            });
        }
    }
    Ok((hc, n))
}

/// `t` is F32 or F16 (a cache's rows).
fn check_cache_rows(op: &'static str, what: &'static str, t: &DeviceTensor) -> Result<(), OpError> {
    if matches!(t.dtype(), DType::F32 | DType::F16) {
        Ok(())
    } else {
        Err(OpError::DType {
            op,
            what,
            got: t.dtype(),
            expected: DType::F32,
        })
    }
}

/// The checks of [`Ops::pool_keys`]: `keys` and `gates` F32 or F16 (one
/// type) of the same shape `[rows, d]`, `ape` `[kp, d]` with `first + kp` at most
/// `rows`. Gives `(kp, d)`.
///
/// # Errors
///
/// [`OpError::DType`] or [`OpError::Shape`].
pub fn check_pool_keys(
    op: &'static str,
    keys: &DeviceTensor,
    gates: &DeviceTensor,
    first: usize,
    ape: &DeviceTensor,
) -> Result<(usize, usize), OpError> {
    check_cache_rows(op, "keys", keys)?;
    if gates.dtype() != keys.dtype() {
        return Err(OpError::DType {
            op,
            what: "gates",
            got: gates.dtype(),
            expected: keys.dtype(),
        });
    }
    let (rows, d) = keys.rows_cols(op)?;
    if gates.rows_cols(op)? != (rows, d) {
        return Err(OpError::Shape {
            op,
            what: "gates",
            got: gates.shape().to_vec(),
            expected: format!("{:?} (as keys)", keys.shape()),
        });
    }
    let (kp, ad) = ape.rows_cols(op)?;
    if ad != d || kp == 0 || first.checked_add(kp).is_none_or(|end| end > rows) {
        return Err(OpError::Shape {
            op,
            what: "ape",
            got: ape.shape().to_vec(),
            expected: format!("[kp, {d}] with rows {first}..{first} + kp within {rows}"),
        });
    }
    Ok((kp, d))
}

/// The checks of [`Ops::attention_slots`]: `kv` F32 or F16 `[rows, d]`,
/// `q` whole rows of `d`, `slots` I32, at least one. Gives `(n_head, d, rows)`.
///
/// # Errors
///
/// [`OpError::DType`] or [`OpError::Shape`].
pub fn check_attention_slots(
    op: &'static str,
    q: &DeviceTensor,
    kv: &DeviceTensor,
    slots: &DeviceTensor,
) -> Result<(usize, usize, usize), OpError> {
    check_cache_rows(op, "kv", kv)?;
    if slots.dtype() != DType::I32 {
        return Err(OpError::DType {
            op,
            what: "slots",
            got: slots.dtype(),
            expected: DType::I32,
        });
    }
    if slots.is_empty() {
        return Err(OpError::Shape {
            op,
            what: "slots",
            got: slots.shape().to_vec(),
            expected: "at least one slot".into(),
        });
    }
    let (rows, d) = kv.rows_cols(op)?;
    if d == 0 || q.is_empty() || !q.len().is_multiple_of(d) {
        return Err(OpError::Shape {
            op,
            what: "q",
            got: q.shape().to_vec(),
            expected: format!("whole heads of {d} (kv is {:?})", kv.shape()),
        });
    }
    Ok((q.len() / d, d, rows))
}

#[cfg(test)]
mod tests;

// muse_glimmer's ops

/// The check of [`Ops::softcap`]: the cap is finite and positive.
///
/// # Errors
///
/// [`OpError::Invalid`].
pub fn check_softcap(op: &'static str, c: f32) -> Result<(), OpError> {
    if c.is_finite() && c > 0.0 {
        Ok(())
    } else {
        Err(OpError::Invalid {
            op,
            why: format!("a softcap of {c} (it must be finite and positive)"),
        })
    }
}

/// The checks of [`Ops::dot_rows_f64`]: rows of the same width; `(n, m,
/// k)`.
///
/// # Errors
///
/// [`OpError::Shape`].
pub fn check_dot_rows(
    op: &'static str,
    a: &DeviceTensor,
    b: &DeviceTensor,
) -> Result<(usize, usize, usize), OpError> {
    let (n, k) = a.rows_cols(op)?;
    let (m, kb) = b.rows_cols(op)?;
    if kb != k {
        return Err(OpError::Shape {
            op,
            what: "b",
            got: b.shape().to_vec(),
            expected: format!("rows of {k} (a is {:?})", a.shape()),
        });
    }
    Ok((n, m, k))
}

/// The check of a per-column vector (a LayerNorm's `w` or `b`): `cols`
/// values.
///
/// # Errors
///
/// [`OpError::Shape`].
pub fn check_row_vector(
    op: &'static str,
    what: &'static str,
    v: &DeviceTensor,
    cols: usize,
) -> Result<(), OpError> {
    if v.len() != cols {
        return Err(OpError::Shape {
            op,
            what,
            got: v.shape().to_vec(),
            expected: format!("{cols} values"),
        });
    }
    Ok(())
}

/// The shape of [`Ops::transpose`]'s output and `(rows, cols)` of the
/// swapped dims.
///
/// # Errors
///
/// Rank below 2.
pub fn transposed_shape(
    op: &'static str,
    x: &DeviceTensor,
) -> Result<(Vec<usize>, usize, usize), OpError> {
    let s = x.shape();
    if s.len() < 2 {
        return Err(OpError::Shape {
            op,
            what: "x",
            got: s.to_vec(),
            expected: "rank 2 or more".into(),
        });
    }
    let (r, c) = (s[s.len() - 2], s[s.len() - 1]);
    let mut out = s.to_vec();
    let n = out.len();
    out[n - 2] = c;
    out[n - 1] = r;
    Ok((out, r, c))
}
