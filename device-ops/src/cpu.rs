//! The CPU reference as an [`Ops`]: [`ReferenceOps`] runs
//! [`crate::reference`] over any storage that lets a kernel read its
//! buffers in place ([`HostStorage`]); [`CpuOps`] is it over host memory.
//! The fake device (`platform-fake`) is the same over its own buffers.

use std::any::Any;

use seam::Resident;
use seam::platform::{DeviceBuffer, DeviceError};
use seam::weight::Weight;

use crate::reference::{self, HostAttnMask, HostNorm};
use crate::{
    Attention, AttnMask, CounterCell, DType, DeviceRouting, DeviceTensor, KvCache, MultiRope,
    NormWeight, OpCounters, OpError, Ops, OpsId, OuterFactor, Rope, WeightShape, check_add_outer,
    check_attention, check_delta_gates, check_delta_net, check_gated_mean_rows, check_gather_rows,
    check_imrope, check_mask, check_matmul_id, check_mix_experts, check_norm_weight, check_repeat,
    check_rope, check_route, check_same, check_slice_cols, check_ssm_conv, check_tensor,
    check_upload, check_write_rows, f32s_from_le, i32s_from_le, le_bytes, matmul_shape,
};

/// A kernel over a weight's bytes, giving its output values.
pub type WeightKernel<'a> = dyn FnMut(&[u8]) -> Result<Vec<f32>, OpError> + 'a;

/// Where a reference device keeps its buffers, and how its kernels reach
/// them.
pub trait HostStorage: Send + Sync {
    /// The device's name.
    fn name(&self) -> String;

    /// A kernel's read of `buf`, in place (not a read-back: nothing is
    /// counted or copied to the host as a transfer).
    ///
    /// # Errors
    ///
    /// `buf` is not this storage's.
    fn kernel_read(&self, buf: &dyn DeviceBuffer) -> Result<Vec<u8>, DeviceError>;

    /// A kernel's output: a new buffer holding `bytes`.
    ///
    /// # Errors
    ///
    /// The device cannot allocate it.
    fn kernel_write(&self, bytes: Vec<u8>) -> Result<Box<dyn DeviceBuffer>, DeviceError>;

    /// A kernel's write of `buf` in place: its bytes become `bytes` (the
    /// same length). The states a sequence carries (a KV cache, a conv or
    /// delta-rule state) are written this way.
    ///
    /// # Errors
    ///
    /// `buf` is not this storage's, or `bytes` is not its length.
    fn kernel_update(&self, buf: &dyn DeviceBuffer, bytes: Vec<u8>) -> Result<(), DeviceError>;

    /// An upload of host bytes (a transfer).
    ///
    /// # Errors
    ///
    /// As [`HostStorage::kernel_write`].
    fn upload(&self, bytes: Vec<u8>) -> Result<Box<dyn DeviceBuffer>, DeviceError>;

    /// A read-back of `buf` to the host (a transfer).
    ///
    /// # Errors
    ///
    /// `buf` is not this storage's.
    fn read_back(&self, buf: &dyn DeviceBuffer) -> Result<Vec<u8>, DeviceError>;

    /// Calls `f` with a staged weight's bytes as a kernel reads them, in
    /// place: the device copy, or the host bytes where the device reads
    /// host memory. Never a read-back.
    ///
    /// # Errors
    ///
    /// The weight lives where this device cannot read it (another device,
    /// or device memory for the CPU).
    fn with_weight(
        &self,
        op: &'static str,
        weight: &Weight,
        resident: &Resident<'_>,
        f: &mut WeightKernel<'_>,
    ) -> Result<Vec<f32>, OpError>;
}

/// The CPU reference over a [`HostStorage`]: each op reads its inputs in
/// place, computes with [`crate::reference`] (family-ops) and writes a new
/// buffer; one kernel launch counted per op.
pub struct ReferenceOps<S> {
    storage: S,
    id: OpsId,
    counters: CounterCell,
}

impl<S: HostStorage> ReferenceOps<S> {
    /// The reference over `storage`.
    pub fn new(storage: S) -> ReferenceOps<S> {
        ReferenceOps {
            storage,
            id: OpsId::fresh(),
            counters: CounterCell::default(),
        }
    }

    /// The storage.
    pub fn storage(&self) -> &S {
        &self.storage
    }

    /// `t`'s bytes as a kernel reads them, after checking it is this
    /// device's tensor of element type `dtype`.
    fn checked_bytes(
        &self,
        op: &'static str,
        what: &'static str,
        t: &DeviceTensor,
        dtype: DType,
    ) -> Result<Vec<u8>, OpError> {
        check_tensor(self, op, what, t, dtype)?;
        self.storage
            .kernel_read(t.buffer())
            .map_err(OpError::device(op))
    }

    fn f32s(
        &self,
        op: &'static str,
        what: &'static str,
        t: &DeviceTensor,
    ) -> Result<Vec<f32>, OpError> {
        let bytes = self.checked_bytes(op, what, t, DType::F32)?;
        Ok(f32s_from_le(&bytes[..t.len() * 4]))
    }

    /// A KV cache's rows as f32: F32 as they are, F16 widened.
    fn cache_f32s(
        &self,
        op: &'static str,
        what: &'static str,
        t: &DeviceTensor,
    ) -> Result<Vec<f32>, OpError> {
        if t.dtype() != DType::F16 {
            return self.f32s(op, what, t);
        }
        let bytes = self.checked_bytes(op, what, t, DType::F16)?;
        Ok(bytes[..t.len() * 2]
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect())
    }

    fn i32s(
        &self,
        op: &'static str,
        what: &'static str,
        t: &DeviceTensor,
    ) -> Result<Vec<i32>, OpError> {
        let bytes = self.checked_bytes(op, what, t, DType::I32)?;
        Ok(i32s_from_le(&bytes[..t.len() * 4]))
    }

    fn output(
        &self,
        op: &'static str,
        values: &[f32],
        shape: &[usize],
    ) -> Result<DeviceTensor, OpError> {
        self.counters.launch();
        let buf = self
            .storage
            .kernel_write(le_bytes(values))
            .map_err(OpError::device(op))?;
        DeviceTensor::from_buffer(self.id, buf, DType::F32, shape)
    }

    fn output_i32(
        &self,
        op: &'static str,
        values: &[i32],
        shape: &[usize],
    ) -> Result<DeviceTensor, OpError> {
        let buf = self
            .storage
            .kernel_write(le_bytes(values))
            .map_err(OpError::device(op))?;
        DeviceTensor::from_buffer(self.id, buf, DType::I32, shape)
    }

    /// A kernel's write of `t` in place (one launch counted).
    fn update(&self, op: &'static str, t: &DeviceTensor, values: &[f32]) -> Result<(), OpError> {
        self.counters.launch();
        let mut bytes = le_bytes(values);
        bytes.resize(t.buffer().len() as usize, 0);
        self.storage
            .kernel_update(t.buffer(), bytes)
            .map_err(OpError::device(op))
    }

    fn upload(
        &self,
        op: &'static str,
        bytes: Vec<u8>,
        dtype: DType,
        shape: &[usize],
    ) -> Result<DeviceTensor, OpError> {
        let n = bytes.len();
        let buf = self.storage.upload(bytes).map_err(OpError::device(op))?;
        self.counters.upload(n);
        DeviceTensor::from_buffer(self.id, buf, dtype, shape)
    }

    fn weight_values(
        &self,
        op: &'static str,
        weight: &Weight,
        resident: &Resident<'_>,
        f: &mut WeightKernel<'_>,
    ) -> Result<Vec<f32>, OpError> {
        self.storage.with_weight(op, weight, resident, f)
    }

    fn unary(
        &self,
        op: &'static str,
        x: &DeviceTensor,
        f: impl Fn(&[f32]) -> Vec<f32>,
    ) -> Result<DeviceTensor, OpError> {
        let v = self.f32s(op, "x", x)?;
        self.output(op, &f(&v), x.shape())
    }

    fn binary(
        &self,
        op: &'static str,
        a: &DeviceTensor,
        b: &DeviceTensor,
        f: impl Fn(f32, f32) -> f32,
    ) -> Result<DeviceTensor, OpError> {
        let av = self.f32s(op, "a", a)?;
        let bv = self.f32s(op, "b", b)?;
        check_repeat(op, a, b)?;
        self.output(op, &reference::binary(&av, &bv, f), a.shape())
    }
}

impl<S: HostStorage> Ops for ReferenceOps<S> {
    fn id(&self) -> OpsId {
        self.id
    }

    fn device_name(&self) -> String {
        self.storage.name()
    }

    fn upload_f32(&self, data: &[f32], shape: &[usize]) -> Result<DeviceTensor, OpError> {
        check_upload("upload", data.len(), shape)?;
        self.upload("upload", le_bytes(data), DType::F32, shape)
    }

    fn upload_i32(&self, data: &[i32], shape: &[usize]) -> Result<DeviceTensor, OpError> {
        check_upload("upload", data.len(), shape)?;
        self.upload("upload", le_bytes(data), DType::I32, shape)
    }

    fn read_back(&self, t: &DeviceTensor) -> Result<Vec<f32>, OpError> {
        const OP: &str = "read_back";
        check_tensor(self, OP, "t", t, DType::F32)?;
        let bytes = self
            .storage
            .read_back(t.buffer())
            .map_err(OpError::device(OP))?;
        let n = t.len() * 4;
        self.counters.read_back(n);
        Ok(f32s_from_le(&bytes[..n]))
    }

    fn matmul(
        &self,
        weight: &Weight,
        resident: &Resident<'_>,
        x: &DeviceTensor,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "matmul";
        let w = WeightShape::of(OP, weight, resident)?;
        let shape = matmul_shape(OP, &w, x)?;
        let xv = self.f32s(OP, "x", x)?;
        let y = self.weight_values(OP, weight, resident, &mut |bytes| {
            reference::matmul(w.ty, &bytes[..w.rows * w.row_bytes], w.ne0, w.rows, &xv)
        })?;
        self.output(OP, &y, &shape)
    }

    fn matmul_id(
        &self,
        weight: &Weight,
        resident: &Resident<'_>,
        x: &DeviceTensor,
        ids: &DeviceTensor,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "matmul_id";
        let w = WeightShape::of(OP, weight, resident)?;
        let xv = self.f32s(OP, "x", x)?;
        let idv = self.i32s(OP, "ids", ids)?;
        let dims = check_matmul_id(OP, weight, &w, x, ids)?;
        let y = self.weight_values(OP, weight, resident, &mut |bytes| {
            reference::matmul_id(
                w.ty,
                &bytes[..w.rows * w.row_bytes],
                w.ne0,
                w.row_bytes,
                &dims,
                &xv,
                &idv,
                weight.name(),
            )
        })?;
        self.output(OP, &y, &[dims.n, dims.k, dims.rows])
    }

    fn get_rows(
        &self,
        weight: &Weight,
        resident: &Resident<'_>,
        ids: &DeviceTensor,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "get_rows";
        let w = WeightShape::of(OP, weight, resident)?;
        let idv = self.i32s(OP, "ids", ids)?;
        let mut shape = ids.shape().to_vec();
        shape.push(w.ne0);
        crate::byte_len(OP, DType::F32, &shape)?;
        let y = self.weight_values(OP, weight, resident, &mut |bytes| {
            reference::get_rows(
                w.ty,
                &bytes[..w.rows * w.row_bytes],
                w.ne0,
                w.rows,
                &idv,
                weight.name(),
            )
        })?;
        self.output(OP, &y, &shape)
    }

    fn dequantize(
        &self,
        weight: &Weight,
        resident: &Resident<'_>,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "dequantize";
        let w = WeightShape::of(OP, weight, resident)?;
        let shape = [w.rows, w.ne0];
        crate::byte_len(OP, DType::F32, &shape)?;
        let y = self.weight_values(OP, weight, resident, &mut |bytes| {
            let mut out = vec![0f32; w.rows * w.ne0];
            family_ops::dequantize(w.ty, &bytes[..w.rows * w.row_bytes], &mut out)
                .map_err(OpError::reference(OP))?;
            Ok(out)
        })?;
        self.output(OP, &y, &shape)
    }

    fn rms_norm(
        &self,
        x: &DeviceTensor,
        eps: f32,
        weight: NormWeight<'_>,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "rms_norm";
        let xv = self.f32s(OP, "x", x)?;
        let (_, cols) = x.rows_cols(OP)?;
        let wv = match weight {
            NormWeight::None => None,
            NormWeight::Scale(w) | NormWeight::OnePlus(w) => {
                check_norm_weight(OP, x, w)?;
                Some(self.f32s(OP, "weight", w)?)
            }
        };
        let hn = match (weight, wv.as_deref()) {
            (NormWeight::Scale(_), Some(w)) => HostNorm::Scale(w),
            (NormWeight::OnePlus(_), Some(w)) => HostNorm::OnePlus(w),
            _ => HostNorm::None,
        };
        let y = reference::rms_norm(&xv, cols, eps, hn)?;
        self.output(OP, &y, x.shape())
    }

    fn rope(
        &self,
        x: &DeviceTensor,
        positions: &DeviceTensor,
        head_dim: usize,
        rope: &Rope,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "rope";
        let xv = self.f32s(OP, "x", x)?;
        let pv = self.i32s(OP, "positions", positions)?;
        check_rope(OP, x, positions, head_dim, rope)?;
        let (_, cols) = x.rows_cols(OP)?;
        let y = reference::rope(&xv, cols, &pv, head_dim, rope)?;
        self.output(OP, &y, x.shape())
    }

    fn imrope(
        &self,
        x: &DeviceTensor,
        positions: &DeviceTensor,
        head_dim: usize,
        rope: &MultiRope,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "imrope";
        let xv = self.f32s(OP, "x", x)?;
        let pv = self.i32s(OP, "positions", positions)?;
        check_imrope(OP, x, positions, head_dim, rope)?;
        let (_, cols) = x.rows_cols(OP)?;
        let y = reference::imrope(&xv, cols, &pv, head_dim, rope)?;
        self.output(OP, &y, x.shape())
    }

    fn softmax(
        &self,
        x: &DeviceTensor,
        scale: f32,
        mask: Option<&DeviceTensor>,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "softmax";
        let xv = self.f32s(OP, "x", x)?;
        let (_, cols) = x.rows_cols(OP)?;
        let mv = match mask {
            Some(m) => {
                let v = self.f32s(OP, "mask", m)?;
                check_mask(OP, x, m)?;
                Some(v)
            }
            None => None,
        };
        let y = reference::softmax(&xv, cols, scale, mv.as_deref())?;
        self.output(OP, &y, x.shape())
    }

    fn silu(&self, x: &DeviceTensor) -> Result<DeviceTensor, OpError> {
        let cols = x.shape().last().copied().unwrap_or(0);
        self.unary("silu", x, |v| reference::silu(v, cols))
    }

    fn delta_gates(
        &self,
        alpha: &DeviceTensor,
        beta: &DeviceTensor,
        dt_bias: &DeviceTensor,
        a: &DeviceTensor,
    ) -> Result<(DeviceTensor, DeviceTensor), OpError> {
        const OP: &str = "delta_gates";
        let av = self.f32s(OP, "alpha", alpha)?;
        let bv = self.f32s(OP, "beta", beta)?;
        let dv = self.f32s(OP, "dt_bias", dt_bias)?;
        let sv = self.f32s(OP, "a", a)?;
        check_delta_gates(OP, alpha, beta, dt_bias, a)?;
        let (g, b) = reference::delta_gates(&av, &bv, &dv, &sv);
        Ok((
            self.output(OP, &g, alpha.shape())?,
            self.output(OP, &b, beta.shape())?,
        ))
    }

    fn silu_scaled(&self, x: &DeviceTensor, s: f32) -> Result<DeviceTensor, OpError> {
        let cols = x.shape().last().copied().unwrap_or(0);
        self.unary("silu_scaled", x, |v| {
            reference::silu(&v.iter().map(|&x| x * s).collect::<Vec<_>>(), cols)
        })
    }

    fn gelu(&self, x: &DeviceTensor) -> Result<DeviceTensor, OpError> {
        self.unary("gelu", x, reference::gelu)
    }

    fn swiglu(&self, gate: &DeviceTensor, up: &DeviceTensor) -> Result<DeviceTensor, OpError> {
        const OP: &str = "swiglu";
        let g = self.f32s(OP, "gate", gate)?;
        let u = self.f32s(OP, "up", up)?;
        check_same(OP, "up", gate, up)?;
        let (_, cols) = gate.rows_cols(OP)?;
        let y = reference::swiglu(&g, &u, cols)?;
        self.output(OP, &y, gate.shape())
    }

    fn add(&self, a: &DeviceTensor, b: &DeviceTensor) -> Result<DeviceTensor, OpError> {
        self.binary("add", a, b, |x, y| x + y)
    }

    fn mul(&self, a: &DeviceTensor, b: &DeviceTensor) -> Result<DeviceTensor, OpError> {
        self.binary("mul", a, b, |x, y| x * y)
    }

    fn mul_sigmoid(&self, a: &DeviceTensor, b: &DeviceTensor) -> Result<DeviceTensor, OpError> {
        self.binary("mul_sigmoid", a, b, |x, y| {
            x * family_ops::ggml_cpu::sigmoid(y)
        })
    }

    fn scale(&self, a: &DeviceTensor, s: f32) -> Result<DeviceTensor, OpError> {
        self.unary("scale", a, |v| v.iter().map(|&x| x * s).collect())
    }

    fn sigmoid(&self, x: &DeviceTensor) -> Result<DeviceTensor, OpError> {
        self.unary("sigmoid", x, |v| {
            v.iter()
                .map(|&x| family_ops::ggml_cpu::sigmoid(x))
                .collect()
        })
    }

    fn softplus(&self, x: &DeviceTensor) -> Result<DeviceTensor, OpError> {
        self.unary("softplus", x, |v| {
            v.iter()
                .map(|&x| family_ops::ggml_cpu::softplus(x))
                .collect()
        })
    }

    fn l2_norm(&self, x: &DeviceTensor, eps: f32) -> Result<DeviceTensor, OpError> {
        const OP: &str = "l2_norm";
        let xv = self.f32s(OP, "x", x)?;
        let (_, cols) = x.rows_cols(OP)?;
        self.output(OP, &reference::l2_norm(&xv, cols, eps), x.shape())
    }

    fn slice_cols(
        &self,
        x: &DeviceTensor,
        start: usize,
        len: usize,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "slice_cols";
        let xv = self.f32s(OP, "x", x)?;
        let shape = check_slice_cols(OP, x, start, len)?;
        let (_, cols) = x.rows_cols(OP)?;
        self.output(OP, &reference::slice_cols(&xv, cols, start, len), &shape)
    }

    fn zeros(&self, dtype: DType, shape: &[usize]) -> Result<DeviceTensor, OpError> {
        const OP: &str = "zeros";
        let bytes = crate::byte_len(OP, dtype, shape)?;
        self.counters.launch();
        let buf = self
            .storage
            .kernel_write(vec![0; bytes])
            .map_err(OpError::device(OP))?;
        DeviceTensor::from_buffer(self.id, buf, dtype, shape)
    }

    fn read_back_i32(&self, t: &DeviceTensor) -> Result<Vec<i32>, OpError> {
        const OP: &str = "read_back";
        check_tensor(self, OP, "t", t, DType::I32)?;
        let bytes = self
            .storage
            .read_back(t.buffer())
            .map_err(OpError::device(OP))?;
        let n = t.len() * 4;
        self.counters.read_back(n);
        Ok(i32s_from_le(&bytes[..n]))
    }

    fn write_rows(
        &self,
        dst: &mut DeviceTensor,
        row0: usize,
        src: &DeviceTensor,
    ) -> Result<(), OpError> {
        const OP: &str = "write_rows";
        if dst.dtype() == DType::F16 && src.dtype() == DType::F16 {
            // F16 rows copied as they are (a cache grown).
            let mut bytes = self.checked_bytes(OP, "dst", dst, DType::F16)?;
            let sb = self.checked_bytes(OP, "src", src, DType::F16)?;
            check_write_rows(OP, dst, row0, src)?;
            let (_, cols) = dst.rows_cols(OP)?;
            let at = row0 * cols * 2;
            bytes[at..at + sb.len()].copy_from_slice(&sb);
            self.counters.launch();
            return self
                .storage
                .kernel_update(dst.buffer(), bytes)
                .map_err(OpError::device(OP));
        }
        if dst.dtype() == DType::F16 {
            // Rounded to nearest even f16 (as `reference::kv_stored`), in
            // the buffer's bytes.
            let mut bytes = self.checked_bytes(OP, "dst", dst, DType::F16)?;
            let sv = self.f32s(OP, "src", src)?;
            check_write_rows(OP, dst, row0, src)?;
            let (_, cols) = dst.rows_cols(OP)?;
            let at = row0 * cols * 2;
            for (b, &v) in bytes[at..at + 2 * sv.len()].chunks_exact_mut(2).zip(&sv) {
                b.copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
            }
            self.counters.launch();
            return self
                .storage
                .kernel_update(dst.buffer(), bytes)
                .map_err(OpError::device(OP));
        }
        let mut d = self.f32s(OP, "dst", dst)?;
        let sv = self.f32s(OP, "src", src)?;
        check_write_rows(OP, dst, row0, src)?;
        let (_, cols) = dst.rows_cols(OP)?;
        d[row0 * cols..row0 * cols + sv.len()].copy_from_slice(&sv);
        self.update(OP, dst, &d)
    }

    fn attention(
        &self,
        q: &DeviceTensor,
        cache: &KvCache,
        attn: &Attention<'_>,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "attention";
        let qv = self.f32s(OP, "q", q)?;
        let kv = self.cache_f32s(OP, "k cache", cache.k())?;
        let vv = self.cache_f32s(OP, "v cache", cache.v())?;
        let dims = check_attention(OP, q, cache, attn)?;
        let mv = match attn.mask {
            AttnMask::Additive(m) => Some(self.f32s(OP, "mask", m)?),
            _ => None,
        };
        let mask = match (attn.mask, mv.as_deref()) {
            (AttnMask::Causal { pos0 }, _) => HostAttnMask::Causal { pos0 },
            (AttnMask::SlidingWindow { pos0, window }, _) => {
                HostAttnMask::SlidingWindow { pos0, window }
            }
            (AttnMask::Additive(_), Some(m)) => HostAttnMask::Additive {
                mask: m,
                rows: dims.mask_rows,
            },
            _ => HostAttnMask::All,
        };
        let y = reference::attention(
            &qv,
            &kv,
            &vv,
            dims.n_kv,
            &dims.shape,
            &attn.scores,
            mask,
            cache.spec().dtype,
        )?;
        let mut shape = q.shape().to_vec();
        if let Some(last) = shape.last_mut() {
            *last = dims.shape.n_head * dims.shape.head_dim_v;
        }
        self.output(OP, &y, &shape)
    }

    fn route(
        &self,
        logits: &DeviceTensor,
        routing: &DeviceRouting<'_>,
    ) -> Result<(DeviceTensor, DeviceTensor), OpError> {
        const OP: &str = "route";
        let lv = self.f32s(OP, "logits", logits)?;
        let bv = routing.bias.map(|b| self.f32s(OP, "bias", b)).transpose()?;
        let (rows, n_expert) = check_route(OP, logits, routing)?;
        let host = family_ops::Routing {
            gating: routing.gating,
            k: routing.k,
            bias: bv.as_deref(),
            normalize: routing.normalize,
            scale: routing.scale,
        };
        let (ids, weights) = reference::route(&lv, n_expert, &host)?;
        let mut shape = logits.shape().to_vec();
        if let Some(last) = shape.last_mut() {
            *last = routing.k;
        }
        debug_assert_eq!(ids.len(), rows * routing.k);
        let w = self.output(OP, &weights, &shape)?;
        Ok((self.output_i32(OP, &ids, &shape)?, w))
    }

    fn mix_experts(&self, y: &DeviceTensor, w: &DeviceTensor) -> Result<DeviceTensor, OpError> {
        const OP: &str = "mix_experts";
        let yv = self.f32s(OP, "y", y)?;
        let wv = self.f32s(OP, "w", w)?;
        let (n, k, cols) = check_mix_experts(OP, y, w)?;
        let out = reference::mix_experts(&yv, &wv, n, k, cols)?;
        self.output(OP, &out, &[n, cols])
    }

    fn add_outer(
        &self,
        r: &DeviceTensor,
        s: &DeviceTensor,
        y: &DeviceTensor,
        factor: OuterFactor,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "add_outer";
        let rv = self.f32s(OP, "r", r)?;
        let sv = self.f32s(OP, "s", s)?;
        let yv = self.f32s(OP, "y", y)?;
        check_add_outer(OP, r, s, y)?;
        self.output(OP, &reference::add_outer(&rv, &sv, &yv, factor), r.shape())
    }

    fn gated_mean_rows(&self, x: &DeviceTensor, g: &DeviceTensor) -> Result<DeviceTensor, OpError> {
        const OP: &str = "gated_mean_rows";
        let xv = self.f32s(OP, "x", x)?;
        let gv = self.f32s(OP, "g", g)?;
        let (m, n) = check_gated_mean_rows(OP, x, g)?;
        let out = reference::gated_mean_rows(&xv, &gv, m, n)?;
        self.output(OP, &out, &[1, n])
    }

    fn gather_rows(
        &self,
        table: &DeviceTensor,
        ids: &DeviceTensor,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "gather_rows";
        let tv = self.f32s(OP, "table", table)?;
        let iv = self.i32s(OP, "ids", ids)?;
        let (rows, cols, shape) = check_gather_rows(OP, table, ids)?;
        let out = reference::gather_rows(&tv, rows, cols, &iv)?;
        self.output(OP, &out, &shape)
    }

    fn argmax(&self, x: &DeviceTensor) -> Result<DeviceTensor, OpError> {
        const OP: &str = "argmax";
        let xv = self.f32s(OP, "x", x)?;
        let (rows, cols) = x.rows_cols(OP)?;
        let ids = reference::argmax(&xv, rows, cols);
        self.counters.launch();
        let shape = match &x.shape()[..x.shape().len() - 1] {
            [] => vec![1],
            lead => lead.to_vec(),
        };
        self.output_i32(OP, &ids, &shape)
    }

    fn ssm_conv(
        &self,
        state: &mut DeviceTensor,
        x: &DeviceTensor,
        w: &DeviceTensor,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "ssm_conv";
        let mut sv = self.f32s(OP, "state", state)?;
        let xv = self.f32s(OP, "x", x)?;
        let wv = self.f32s(OP, "w", w)?;
        let (_, channels, _) = check_ssm_conv(OP, state, x, w)?;
        let y = reference::ssm_conv(&mut sv, &xv, channels, &wv)?;
        let out = self.output(OP, &y, x.shape())?;
        self.update(OP, state, &sv)?;
        Ok(out)
    }

    fn delta_net(
        &self,
        state: &mut DeviceTensor,
        qkv: [&DeviceTensor; 3],
        g: &DeviceTensor,
        beta: &DeviceTensor,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "delta_net";
        let mut sv = self.f32s(OP, "state", state)?;
        let qv = self.f32s(OP, "q", qkv[0])?;
        let kv = self.f32s(OP, "k", qkv[1])?;
        let vv = self.f32s(OP, "v", qkv[2])?;
        let gv = self.f32s(OP, "g", g)?;
        let bv = self.f32s(OP, "beta", beta)?;
        let dims = check_delta_net(OP, state, qkv, g, beta)?;
        let y = reference::delta_net(&mut sv, [&qv, &kv, &vv], &gv, &bv, &dims)?;
        let out = self.output(OP, &y, qkv[2].shape())?;
        self.update(OP, state, &sv)?;
        Ok(out)
    }

    fn counters(&self) -> OpCounters {
        self.counters.snapshot()
    }

    // glm_moe_dsa's ops

    fn rope_ggml(
        &self,
        x: &DeviceTensor,
        positions: &DeviceTensor,
        head_dim: usize,
        rope: &crate::GgmlRope,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "rope_ggml";
        let xv = self.f32s(OP, "x", x)?;
        let pv = self.i32s(OP, "positions", positions)?;
        crate::check_rope_ggml(OP, x, positions, head_dim, rope)?;
        let (_, cols) = x.rows_cols(OP)?;
        let y = reference::rope_ggml(&xv, cols, &pv, head_dim, rope)?;
        self.output(OP, &y, x.shape())
    }

    fn concat_cols(&self, a: &DeviceTensor, b: &DeviceTensor) -> Result<DeviceTensor, OpError> {
        const OP: &str = "concat_cols";
        let av = self.f32s(OP, "a", a)?;
        let bv = self.f32s(OP, "b", b)?;
        let shape = crate::check_concat_cols(OP, a, b)?;
        let (_, ca) = a.rows_cols(OP)?;
        let (_, cb) = b.rows_cols(OP)?;
        self.output(OP, &reference::concat_cols(&av, ca, &bv, cb), &shape)
    }

    fn layer_norm(&self, x: &DeviceTensor, eps: f32) -> Result<DeviceTensor, OpError> {
        const OP: &str = "layer_norm";
        let xv = self.f32s(OP, "x", x)?;
        let (_, cols) = x.rows_cols(OP)?;
        self.output(OP, &reference::layer_norm(&xv, cols, eps), x.shape())
    }

    fn hadamard(&self, x: &DeviceTensor, n: usize) -> Result<DeviceTensor, OpError> {
        const OP: &str = "hadamard";
        let xv = self.f32s(OP, "x", x)?;
        crate::check_hadamard(OP, x, n)?;
        self.output(OP, &reference::hadamard(&xv, n)?, x.shape())
    }

    fn lightning_scores(
        &self,
        q: &DeviceTensor,
        keys: &DeviceTensor,
        n_keys: usize,
        w: &DeviceTensor,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "lightning_scores";
        let qv = self.f32s(OP, "q", q)?;
        let wv = self.f32s(OP, "w", w)?;
        let kv = self.cache_f32s(OP, "keys", keys)?;
        let (_, d) = crate::check_lightning_scores(OP, q, keys, n_keys, w)?;
        let scores = reference::lightning_scores(&qv, &kv[..n_keys * d], d, &wv);
        self.output(OP, &scores, &[1, n_keys])
    }

    // muse_glimmer's ops

    fn softcap(&self, x: &DeviceTensor, c: f32) -> Result<DeviceTensor, OpError> {
        const OP: &str = "softcap";
        crate::check_softcap(OP, c)?;
        self.unary(OP, x, |v| {
            v.iter()
                .map(|&x| family_ops::ggml_cpu::softcap(x, c))
                .collect()
        })
    }

    fn matmul_f64(
        &self,
        weight: &Weight,
        resident: &Resident<'_>,
        x: &DeviceTensor,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "matmul_f64";
        let w = WeightShape::of(OP, weight, resident)?;
        let shape = matmul_shape(OP, &w, x)?;
        let xv = self.f32s(OP, "x", x)?;
        let y = self.weight_values(OP, weight, resident, &mut |bytes| {
            reference::matmul_f64(w.ty, &bytes[..w.rows * w.row_bytes], w.ne0, w.rows, &xv)
        })?;
        self.output(OP, &y, &shape)
    }

    fn dot_rows_f64(&self, a: &DeviceTensor, b: &DeviceTensor) -> Result<DeviceTensor, OpError> {
        const OP: &str = "dot_rows_f64";
        let av = self.f32s(OP, "a", a)?;
        let bv = self.f32s(OP, "b", b)?;
        let (n, m, k) = crate::check_dot_rows(OP, a, b)?;
        let y = family_ops::projector::dot_rows_f64(&av, &bv, k);
        self.output(OP, &y, &[n, m])
    }

    fn transpose(&self, x: &DeviceTensor) -> Result<DeviceTensor, OpError> {
        const OP: &str = "transpose";
        let xv = self.f32s(OP, "x", x)?;
        let (shape, r, c) = crate::transposed_shape(OP, x)?;
        self.output(OP, &reference::transpose(&xv, r, c), &shape)
    }

    fn layer_norm_f64(
        &self,
        x: &DeviceTensor,
        eps: f32,
        w: Option<&DeviceTensor>,
        b: Option<&DeviceTensor>,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "layer_norm_f64";
        let xv = self.f32s(OP, "x", x)?;
        let (_, cols) = x.rows_cols(OP)?;
        let wv = w.map(|w| self.f32s(OP, "w", w)).transpose()?;
        let bv = b.map(|b| self.f32s(OP, "b", b)).transpose()?;
        if let Some(w) = w {
            crate::check_row_vector(OP, "w", w, cols)?;
        }
        if let Some(b) = b {
            crate::check_row_vector(OP, "b", b, cols)?;
        }
        let y = reference::layer_norm_f64(&xv, cols, eps, wv.as_deref(), bv.as_deref());
        self.output(OP, &y, x.shape())
    }

    fn gelu_erf(&self, x: &DeviceTensor) -> Result<DeviceTensor, OpError> {
        self.unary("gelu_erf", x, |v| {
            v.iter()
                .map(|&x| family_ops::projector::gelu_erf(x))
                .collect()
        })
    }

    fn round_f16(&self, x: &DeviceTensor) -> Result<DeviceTensor, OpError> {
        self.unary("round_f16", x, reference::round_f16)
    }

    // glm5_next's ops

    fn kda_gate(
        &self,
        alpha: &DeviceTensor,
        dt_bias: &DeviceTensor,
        a: &DeviceTensor,
        lower_bound: Option<f32>,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "kda_gate";
        let av = self.f32s(OP, "alpha", alpha)?;
        let dv = self.f32s(OP, "dt_bias", dt_bias)?;
        let sv = self.f32s(OP, "a", a)?;
        let (_, _, per_head) = crate::check_kda_gate(OP, alpha, dt_bias, a)?;
        let g = reference::kda_gate(&av, &dv, &sv, per_head, lower_bound);
        self.output(OP, &g, alpha.shape())
    }

    fn hc_weights(
        &self,
        mix: &DeviceTensor,
        scale: &DeviceTensor,
        base: &DeviceTensor,
        sinkhorn: &crate::HcSinkhorn,
    ) -> Result<(DeviceTensor, DeviceTensor, DeviceTensor), OpError> {
        const OP: &str = "hc_weights";
        let mv = self.f32s(OP, "mix", mix)?;
        let sv = self.f32s(OP, "scale", scale)?;
        let bv = self.f32s(OP, "base", base)?;
        crate::check_hc_weights(OP, mix, scale, base, sinkhorn)?;
        let (pre, post, comb) = reference::hc_weights(&mv, &sv, &bv, sinkhorn)?;
        let hc = sinkhorn.hc;
        Ok((
            self.output(OP, &pre, &[1, hc])?,
            self.output(OP, &post, &[1, hc])?,
            self.output(OP, &comb, &[1, hc * hc])?,
        ))
    }

    fn hc_pre_weighted(
        &self,
        x: &DeviceTensor,
        w: &DeviceTensor,
        scale: f32,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "hc_pre_weighted";
        let xv = self.f32s(OP, "x", x)?;
        let wv = self.f32s(OP, "w", w)?;
        let (_, n) = crate::check_hc_pre_weighted(OP, x, w)?;
        self.output(OP, &reference::hc_pre_weighted(&xv, &wv, scale)?, &[1, n])
    }

    fn hc_post_mixed(
        &self,
        y: &DeviceTensor,
        residual: &DeviceTensor,
        post: &DeviceTensor,
        comb: &DeviceTensor,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "hc_post_mixed";
        let yv = self.f32s(OP, "y", y)?;
        let rv = self.f32s(OP, "residual", residual)?;
        let pv = self.f32s(OP, "post", post)?;
        let cv = self.f32s(OP, "comb", comb)?;
        let (hc, n) = crate::check_hc_post_mixed(OP, y, residual, post, comb)?;
        let out = reference::hc_post_mixed(&yv, &rv, &pv, &cv)?;
        self.output(OP, &out, &[hc, n])
    }

    fn pool_keys(
        &self,
        keys: &DeviceTensor,
        gates: &DeviceTensor,
        first: usize,
        ape: &DeviceTensor,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "pool_keys";
        let kv = self.cache_f32s(OP, "keys", keys)?;
        let gv = self.cache_f32s(OP, "gates", gates)?;
        let av = self.f32s(OP, "ape", ape)?;
        let (kp, d) = crate::check_pool_keys(OP, keys, gates, first, ape)?;
        let rows = first * d..(first + kp) * d;
        let pool = reference::pool_keys(&kv[rows.clone()], &gv[rows], &av, d)?;
        self.output(OP, &pool, &[1, d])
    }

    fn attention_slots(
        &self,
        q: &DeviceTensor,
        kv: &DeviceTensor,
        slots: &DeviceTensor,
        scale: f32,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "attention_slots";
        let qv = self.f32s(OP, "q", q)?;
        let cv = self.cache_f32s(OP, "kv", kv)?;
        let sv = self.i32s(OP, "slots", slots)?;
        let (n_head, d, _) = crate::check_attention_slots(OP, q, kv, slots)?;
        let out = reference::attention_slots(&qv, &cv, d, &sv, scale)?;
        self.output(OP, &out, &[1, n_head * d])
    }

    fn swiglu_clamp(
        &self,
        gate: &DeviceTensor,
        up: &DeviceTensor,
        limit: f32,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "swiglu_clamp";
        let g = self.f32s(OP, "gate", gate)?;
        let u = self.f32s(OP, "up", up)?;
        check_same(OP, "up", gate, up)?;
        self.output(OP, &reference::swiglu_clamp(&g, &u, limit)?, gate.shape())
    }
}

/// A buffer in host memory: the CPU device's (a kernel may write it in
/// place, hence the lock).
struct CpuBuffer(std::sync::Mutex<Vec<u8>>);

impl CpuBuffer {
    fn new(bytes: Vec<u8>) -> CpuBuffer {
        CpuBuffer(std::sync::Mutex::new(bytes))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl DeviceBuffer for CpuBuffer {
    fn len(&self) -> u64 {
        self.lock().len() as u64
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Host memory as a reference device's storage.
#[derive(Debug, Default)]
pub struct CpuStorage;

fn cpu_buffer(buf: &dyn DeviceBuffer) -> Result<&CpuBuffer, DeviceError> {
    buf.as_any()
        .downcast_ref::<CpuBuffer>()
        .ok_or_else(|| DeviceError::Misuse("not a CPU tensor buffer".into()))
}

impl HostStorage for CpuStorage {
    fn name(&self) -> String {
        "cpu".into()
    }
    fn kernel_read(&self, buf: &dyn DeviceBuffer) -> Result<Vec<u8>, DeviceError> {
        Ok(cpu_buffer(buf)?.lock().clone())
    }
    fn kernel_write(&self, bytes: Vec<u8>) -> Result<Box<dyn DeviceBuffer>, DeviceError> {
        Ok(Box::new(CpuBuffer::new(bytes)))
    }
    fn kernel_update(&self, buf: &dyn DeviceBuffer, bytes: Vec<u8>) -> Result<(), DeviceError> {
        let mut b = cpu_buffer(buf)?.lock();
        if b.len() != bytes.len() {
            return Err(DeviceError::Misuse(format!(
                "an update of {} bytes to a buffer of {}",
                bytes.len(),
                b.len()
            )));
        }
        *b = bytes;
        Ok(())
    }
    fn upload(&self, bytes: Vec<u8>) -> Result<Box<dyn DeviceBuffer>, DeviceError> {
        Ok(Box::new(CpuBuffer::new(bytes)))
    }
    fn read_back(&self, buf: &dyn DeviceBuffer) -> Result<Vec<u8>, DeviceError> {
        Ok(cpu_buffer(buf)?.lock().clone())
    }
    /// The CPU reads host bytes only: a weight staged on a device is
    /// refused (reading it would be a read-back).
    fn with_weight(
        &self,
        op: &'static str,
        weight: &Weight,
        resident: &Resident<'_>,
        f: &mut WeightKernel<'_>,
    ) -> Result<Vec<f32>, OpError> {
        match resident {
            Resident::Host(view) => f(view),
            Resident::Device(copy) => Err(OpError::ForeignWeight {
                op,
                weight: weight.name().to_owned(),
                device: self.name(),
                why: format!("it is staged on device {:?}", copy.device()),
            }),
        }
    }
}

/// The CPU device: the reference over host memory (weights as the seam
/// hands them out on the host platform, `Resident::Host`).
pub type CpuOps = ReferenceOps<CpuStorage>;

impl CpuOps {
    /// The CPU device.
    pub fn cpu() -> CpuOps {
        ReferenceOps::new(CpuStorage)
    }
}
