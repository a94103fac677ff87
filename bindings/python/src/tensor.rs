//! `seam.Tensor`: a weight the seam staged, as a DLPack producer.
//!
//! `torch.from_dlpack(t)` / `numpy.from_dlpack(t)` read it where it is: a
//! CUDA copy as a tensor on that GPU, the host's view of the mapping (and
//! the fake device's buffer, host memory) as a CPU array. The sink keeps
//! no bytes, so its tensors export nothing (their `sha256()` still answers,
//! from the sink's running hash).

use std::ffi::c_void;
use std::sync::Arc;

use dlpark::python::ExportRequest;
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use seam::Resident;
use seam::gguf::TensorInfo;
use seam::weight::{HostView, Weight};
use seam_devices::Device;

use crate::dlpack::{
    self, Element, Export, Keep, RAW_BYTES, element_of, export_shape, gguf_py_shape,
};
use crate::errors::{DeviceError, cli_line, staging_error};
use crate::session::Loaded;

/// A staged weight. Made by `Session.resident` and `Session.stage_all`;
/// holds the weight and its whole session, so it (and every array exported
/// from it) stays valid after the `Session` object is gone.
#[pyclass(name = "Tensor", module = "seam", frozen)]
pub struct PyTensor {
    loaded: Arc<Loaded>,
    index: usize,
    weight: Arc<Weight>,
    /// Exported as its raw bytes whatever its type ([`PyTensor::raw`]).
    raw: bool,
}

impl PyTensor {
    /// Tensor `index` of `loaded`, whose weight (`weight`) is staged.
    pub fn new(loaded: Arc<Loaded>, index: usize, weight: Arc<Weight>) -> PyTensor {
        PyTensor {
            loaded,
            index,
            weight,
            raw: false,
        }
    }

    fn info(&self) -> &TensorInfo {
        self.loaded.tensor(self.index)
    }

    /// How it is exported.
    fn element(&self) -> Element {
        if self.raw {
            RAW_BYTES
        } else {
            element_of(self.info().ggml_type)
        }
    }

    /// The exported shape.
    fn export_shape(&self) -> Vec<u64> {
        if self.raw {
            vec![self.info().n_bytes]
        } else {
            export_shape(self.info())
        }
    }

    /// Where the staged bytes are and what keeps them valid.
    fn export(&self) -> PyResult<Export> {
        let resident = self
            .loaded
            .session()
            .resident(&self.weight)
            .map_err(staging_error)?;
        let keep = |owned| {
            Arc::new(Keep::new(
                Arc::clone(&self.loaded),
                Arc::clone(&self.weight),
                owned,
            ))
        };
        let (data, device, read_only, keep) = match resident {
            Resident::Host(HostView::Borrow(b)) => (
                b.bytes().as_ptr() as *mut c_void,
                dlpack::CPU,
                true,
                keep(None),
            ),
            Resident::Host(HostView::Owned(bytes)) => (
                bytes.as_ptr() as *mut c_void,
                dlpack::CPU,
                true,
                keep(Some(bytes)),
            ),
            Resident::Device(copy) => {
                let buffer = copy.buffer().as_any();
                if let (Some(cuda), Device::Cuda(platform)) = (
                    buffer.downcast_ref::<platform_cuda::CudaBuffer>(),
                    self.loaded.device(),
                ) {
                    let ordinal = platform.probe().ordinal;
                    (
                        cuda.device_ptr() as *mut c_void,
                        dlpack::cuda(ordinal),
                        false,
                        keep(None),
                    )
                } else if let Some(fake) = buffer.downcast_ref::<platform_fake::FakeBuffer>() {
                    // The fake device's memory is host memory.
                    (
                        fake.device_ptr() as *mut c_void,
                        dlpack::CPU,
                        false,
                        keep(None),
                    )
                } else if copy.buffer().sha256().is_some() {
                    return Err(PyBufferError::new_err(format!(
                        "{}: the {} device keeps no bytes (it hashed and discarded them: see sha256())",
                        self.info().name,
                        self.loaded.spec().name()
                    )));
                } else {
                    return Err(PyBufferError::new_err(format!(
                        "{}: a copy on {} cannot be exported through DLPack yet",
                        self.info().name,
                        self.loaded.spec().name()
                    )));
                }
            }
        };
        Ok(Export {
            data,
            device,
            read_only,
            element: self.element(),
            shape: self.export_shape(),
            keep,
        })
    }
}

#[pymethods]
impl PyTensor {
    /// The tensor's name.
    #[getter]
    fn name(&self) -> &str {
        &self.info().name
    }

    /// The ggml type's name (`"Q4_K"`).
    #[getter]
    fn ggml_type(&self) -> &'static str {
        self.info().ggml_type.name()
    }

    /// The ggml type's id (what vLLM calls the weight type).
    #[getter]
    fn ggml_type_id(&self) -> i32 {
        self.info().ggml_type.id()
    }

    /// Dimensions in GGUF order (ne0 first).
    #[getter]
    fn dims(&self) -> Vec<u64> {
        self.info().dims.clone()
    }

    /// Bytes of data.
    #[getter]
    fn n_bytes(&self) -> u64 {
        self.info().n_bytes
    }

    /// The device it is staged on (`"cuda:0"`, `"host"`, `"fake"`).
    #[getter]
    fn device(&self) -> String {
        self.loaded.spec().name()
    }

    /// The exported element type (`"float32"`, `"bfloat16"`; `"uint8"` for
    /// the raw blocks of a quantized type).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.element().name
    }

    /// Whether the export is raw bytes (a block type's, or any type's
    /// through [`raw`](Self::raw)).
    #[getter]
    fn raw_blocks(&self) -> bool {
        self.element().raw_blocks
    }

    /// The exported shape: the GGUF dims reversed (row-major), or
    /// `(n_bytes,)` for raw bytes.
    #[getter]
    fn shape(&self) -> Vec<u64> {
        self.export_shape()
    }

    /// The same staged bytes exported as `uint8` of the tensor's byte
    /// length, whatever its type (NumPy has no bfloat16; a hash or a byte
    /// comparison wants the bytes).
    fn raw(&self) -> PyTensor {
        PyTensor {
            loaded: Arc::clone(&self.loaded),
            index: self.index,
            weight: Arc::clone(&self.weight),
            raw: true,
        }
    }

    /// The shape gguf-py's reader (and so vLLM's GGUF iterator) gives this
    /// tensor: the dims reversed, a block type's innermost in bytes.
    #[getter]
    fn gguf_py_shape(&self) -> Vec<u64> {
        gguf_py_shape(self.info())
    }

    /// The sha256 (hex) of the bytes as the device holds them, as `seam
    /// load --hash` prints it (a device copy is read back in chunks; the
    /// sink answers from its running hash).
    fn sha256(&self, py: Python<'_>) -> PyResult<String> {
        py.detach(|| {
            let session = self.loaded.session();
            let resident = session.resident(&self.weight).map_err(staging_error)?;
            seam_tools::load::device_sha256(session.platform(), &resident)
                .map_err(|e| DeviceError::new_err(cli_line(&e)))
        })
    }

    /// `(device type, device id)` of DLPack: `(1, 0)` for the CPU (host
    /// views, the fake device), `(2, N)` for `cuda:N`.
    fn __dlpack_device__(&self) -> PyResult<(u32, i32)> {
        let device = self.export()?.device;
        Ok((device.device_type.0, device.device_id))
    }

    /// A DLPack capsule of the staged bytes, no copy (`copy=True` and a
    /// `dl_device` other than the tensor's are refused with `BufferError`).
    /// `stream` is accepted and needs nothing: the seam synchronized the
    /// staging copy before the weight was handed out.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<Bound<'_, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(u32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let request = ExportRequest::parse(stream.as_ref(), max_version, dl_device, copy)?;
        self.export()?.capsule(py, request)
    }

    fn __repr__(&self) -> String {
        let t = self.info();
        format!(
            "Tensor(name={:?}, ggml_type={:?}, dims={:?}, device={:?}{})",
            t.name,
            t.ggml_type.name(),
            t.dims,
            self.loaded.spec().name(),
            if self.raw { ", raw" } else { "" }
        )
    }
}
