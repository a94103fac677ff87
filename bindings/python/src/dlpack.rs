//! What a staged weight is as a DLPack tensor, and the export itself.
//!
//! The element types are exported as themselves with the GGUF shape
//! reversed to row-major (`F32`, `F16`, `BF16`, `F64`, `I8`..`I64`); every
//! block-quantized type as its raw blocks, `uint8` of the tensor's byte
//! length (a consumer's kernel decodes them). The bytes are never copied:
//! the capsule points at the device copy or the mapping, and its context
//! holds what keeps them valid ([`Keep`]) until the consumer's tensor is
//! freed. A view of the mapping is exported read-only (the mapping is
//! `PROT_READ`; NumPy honours the flag, PyTorch has no read-only tensors);
//! a device copy is the consumer's to write, as any device tensor.
//!
//! The DLPack structs and the protocol's negotiation (`max_version` picks
//! the versioned or the legacy ABI, `dl_device` and `copy` are checked,
//! the capsule is single-use) are dlpark's.

use std::ffi::c_void;
use std::sync::Arc;

use dlpark::DlpackFlags;
use dlpark::ffi::{
    DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned,
};
use dlpark::metadata::Dynamic;
use dlpark::python::{ExportAbi, ExportRequest};
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use seam::gguf::{GgmlType, TensorInfo};
use seam::weight::Weight;

use crate::session::Loaded;

/// How a tensor of one ggml type is exported: its DLPack element type and
/// its NumPy/PyTorch name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Element {
    /// The DLPack element type.
    pub dtype: DLDataType,
    /// The name NumPy and PyTorch give it (`"float32"`, `"uint8"`).
    pub name: &'static str,
    /// Whether this is a block type exported as its raw bytes.
    pub raw_blocks: bool,
}

const fn element(code: DLDataTypeCode, bits: u8, name: &'static str) -> Element {
    Element {
        dtype: DLDataType::scalar(code, bits),
        name,
        raw_blocks: false,
    }
}

/// Raw bytes: a block type's export, and any tensor's `Tensor.raw()`.
pub const RAW_BYTES: Element = Element {
    dtype: DLDataType::scalar(DLDataTypeCode::UINT, 8),
    name: "uint8",
    raw_blocks: true,
};

/// The export of `ty`.
pub fn element_of(ty: GgmlType) -> Element {
    match ty {
        GgmlType::F32 => element(DLDataTypeCode::FLOAT, 32, "float32"),
        GgmlType::F16 => element(DLDataTypeCode::FLOAT, 16, "float16"),
        GgmlType::BF16 => element(DLDataTypeCode::BFLOAT, 16, "bfloat16"),
        GgmlType::F64 => element(DLDataTypeCode::FLOAT, 64, "float64"),
        GgmlType::I8 => element(DLDataTypeCode::INT, 8, "int8"),
        GgmlType::I16 => element(DLDataTypeCode::INT, 16, "int16"),
        GgmlType::I32 => element(DLDataTypeCode::INT, 32, "int32"),
        GgmlType::I64 => element(DLDataTypeCode::INT, 64, "int64"),
        _ => RAW_BYTES,
    }
}

/// The exported shape of `tensor`: the GGUF dims reversed (row-major,
/// outermost first) for an element type; `[n_bytes]` for raw blocks.
pub fn export_shape(tensor: &TensorInfo) -> Vec<u64> {
    if element_of(tensor.ggml_type).raw_blocks {
        vec![tensor.n_bytes]
    } else {
        tensor.shape_row_major()
    }
}

/// The shape gguf-py's `GGUFReader` gives a tensor's data (what vLLM's
/// GGUF iterator yields): the GGUF dims reversed, the innermost of a block
/// type counted in bytes (`ne0 / block_size * type_size`).
pub fn gguf_py_shape(tensor: &TensorInfo) -> Vec<u64> {
    let mut shape = tensor.shape_row_major();
    if element_of(tensor.ggml_type).raw_blocks
        && let (Some(last), Some(row)) = (
            shape.last_mut(),
            tensor
                .dims
                .first()
                .and_then(|&ne0| tensor.ggml_type.row_bytes(ne0)),
        )
    {
        *last = row;
    }
    shape
}

/// What keeps an exported tensor's bytes valid: the weight (its borrow
/// keeps the mapping, its memo the device copy), the whole session (the
/// device, its context and queue), and an owned host buffer (`mmap` off)
/// the view points into.
pub struct Keep {
    /// The session, device and model.
    _loaded: Arc<Loaded>,
    /// The weight.
    _weight: Arc<Weight>,
    /// An owned host buffer the data pointer is in.
    _owned: Option<Arc<[u8]>>,
}

/// One export: where the bytes are, on which device, as what.
pub struct Export {
    /// The first byte (a device address on a device).
    pub data: *mut c_void,
    /// The device the address is on.
    pub device: DLDevice,
    /// Whether the consumer must not write (a view of the mapping).
    pub read_only: bool,
    /// The element type.
    pub element: Element,
    /// The shape, outermost first.
    pub shape: Vec<u64>,
    /// What keeps the bytes valid.
    pub keep: Arc<Keep>,
}

impl Keep {
    /// What keeps `weight` of `loaded` valid, with an owned buffer the data
    /// pointer is in.
    pub fn new(loaded: Arc<Loaded>, weight: Arc<Weight>, owned: Option<Arc<[u8]>>) -> Keep {
        Keep {
            _loaded: loaded,
            _weight: weight,
            _owned: owned,
        }
    }
}

/// The CPU as a DLPack device.
pub const CPU: DLDevice = DLDevice::CPU;

/// CUDA device `ordinal` as a DLPack device.
pub fn cuda(ordinal: i32) -> DLDevice {
    DLDevice {
        device_type: DLDeviceType::CUDA,
        device_id: ordinal,
    }
}

fn shape_i64(shape: &[u64]) -> PyResult<Vec<i64>> {
    shape
        .iter()
        .map(|&d| {
            i64::try_from(d)
                .map_err(|_| PyBufferError::new_err(format!("dimension {d} exceeds DLPack's i64")))
        })
        .collect()
}

impl Export {
    /// The flags a versioned export carries.
    fn flags(&self) -> DlpackFlags {
        if self.read_only {
            DlpackFlags::READ_ONLY
        } else {
            DlpackFlags::empty()
        }
    }

    /// A fresh managed tensor of ABI `M`, its context a clone of
    /// [`Export::keep`].
    fn managed<M: dlpark::ManagedTensorBase>(&self) -> PyResult<dlpark::Managed<M>> {
        let mut init = Dynamic::compact(shape_i64(&self.shape)?)
            .initialize_as::<M>(Arc::clone(&self.keep))
            .map_err(|e| PyBufferError::new_err(e.to_string()))?;
        init.set_data(self.data)
            .set_device(self.device)
            .set_dtype(self.element.dtype);
        // A no-op on the legacy ABI, which has no flags.
        init.set_flags(self.flags())
            .map_err(|e| PyBufferError::new_err(e.to_string()))?;
        // SAFETY: `data` is the first of the tensor's `n_bytes` bytes on
        // `device` (the device copy or the mapping), laid out compact
        // row-major as `shape` of `dtype` (raw blocks as `[n_bytes]` bytes);
        // the context (`keep`) owns the weight, its device copy or mapping,
        // and the session, so the bytes stay valid and unmoved until the
        // consumer drops the tensor; `shape` and strides are copied into the
        // allocation; the flags are true: read-only where the bytes are the
        // read-only mapping, never `IS_COPIED`.
        Ok(unsafe { init.finish() })
    }

    /// The capsule for a `__dlpack__` call's arguments.
    pub fn capsule(&self, py: Python<'_>, request: ExportRequest<'_>) -> PyResult<Py<PyAny>> {
        // The legacy ABI has no flags: a legacy consumer gets none (NumPy
        // marks an unversioned import read-only by itself).
        let flags = match request.abi() {
            ExportAbi::Versioned => self.flags(),
            ExportAbi::Legacy => DlpackFlags::empty(),
        };
        // Nothing to order on the consumer's stream: the seam synchronized
        // the staging copy before it handed the weight out.
        request.export_zero_copy(
            py,
            self.device,
            flags,
            || self.managed::<DLManagedTensor>(),
            || self.managed::<DLManagedTensorVersioned>(),
        )
    }
}
