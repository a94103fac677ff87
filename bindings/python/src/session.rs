//! `seam.open(path, device, **knobs)` and the `Session` it returns: a
//! `seam::session::Session` on a device opened as `seam load` opens it,
//! with the model mapped, its tensor table, and the weights made so far.
//!
//! A weight is made once per session and tensor (a borrow of the mapping)
//! and staged through the seam (`Session::resident`, or
//! `Session::stage_picked` for many at once, in parallel across the
//! ring's lanes); a `Tensor` handed to Python holds the weight and the
//! whole session ([`Loaded`]), so dropping the Python `Session` while a
//! tensor (or an array exported from it) is alive frees nothing that
//! tensor reads.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use pyo3::exceptions::PyKeyError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyIterator, PyList};
use seam::gguf::{GgufModel, TensorInfo};
use seam::session::{LoadError, Session, SessionOptions};
use seam::weight::{Role, Weight};
use seam_devices::{Device, DeviceSpec};

use crate::errors::{DeviceError, cli_line, load_error, staging_error};
use crate::knobs::session_env;
use crate::tensor::PyTensor;

/// The session's type with the lifetime of the device it borrows.
type SessionOn<'p> = Session<'p>;

self_cell::self_cell!(
    /// A device and the session that borrows it, owned together.
    struct DeviceSession {
        owner: Device,
        #[covariant]
        dependent: SessionOn,
    }
);

/// Everything a staged weight's reader needs alive: the device, the
/// session, the mapped model and the weights made so far. Shared (`Arc`)
/// by the Python `Session`, every `Tensor` and every DLPack export.
pub struct Loaded {
    /// The weights made so far, by tensor index (dropped first: a device
    /// copy is freed before its device).
    weights: Mutex<Vec<Option<Arc<Weight>>>>,
    /// The device and the session on it.
    device_session: DeviceSession,
    /// The mapped model.
    model: GgufModel,
    /// The device as named (`cuda:0`, `host`).
    spec: DeviceSpec,
    /// The path opened.
    path: PathBuf,
    /// Tensor index by name.
    by_name: HashMap<String, usize>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Loaded {
    /// Opens the device named by `spec`, a session on it with `options`,
    /// and maps the model at `path`: what `seam load` does before staging,
    /// in the same order (so the same input fails with the same line).
    fn open(spec: DeviceSpec, path: &Path, options: &SessionOptions) -> PyResult<Loaded> {
        let env = |name: &str| options.env.get(name);
        let device =
            seam_devices::open(spec, &env).map_err(|e| DeviceError::new_err(cli_line(&e)))?;
        let device_session =
            DeviceSession::try_new(device, |device| Session::new(device.platform(), options))
                .map_err(load_error)?;
        let model = device_session
            .borrow_dependent()
            .open(path)
            .map_err(load_error)?;
        let by_name = model
            .tensors()
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(Loaded {
            weights: Mutex::new(vec![None; model.tensors().len()]),
            device_session,
            model,
            spec,
            path: path.to_path_buf(),
            by_name,
        })
    }

    /// The seam's session.
    pub fn session(&self) -> &Session<'_> {
        self.device_session.borrow_dependent()
    }

    /// The opened device.
    pub fn device(&self) -> &Device {
        self.device_session.borrow_owner()
    }

    /// The device as named.
    pub fn spec(&self) -> DeviceSpec {
        self.spec
    }

    /// The tensor at `index` of the model's table.
    pub fn tensor(&self, index: usize) -> &TensorInfo {
        &self.model.tensors()[index]
    }

    /// The index of the tensor named `name`, or a `KeyError`.
    fn index_of(&self, name: &str) -> PyResult<usize> {
        self.by_name
            .get(name)
            .copied()
            .ok_or_else(|| PyKeyError::new_err(name.to_owned()))
    }

    /// The weight of tensor `index`, made on first use and kept.
    fn weight(&self, index: usize) -> Result<Arc<Weight>, LoadError> {
        let mut weights = lock(&self.weights);
        if let Some(w) = &weights[index] {
            return Ok(Arc::clone(w));
        }
        let made = Arc::new(self.session().weight(
            &self.model,
            self.tensor(index),
            Role::new("tensor"),
        )?);
        weights[index] = Some(Arc::clone(&made));
        Ok(made)
    }
}

/// Why `stage_all` stopped: the seam's error, or the progress callback's.
enum Stop {
    Load(LoadError),
    Callback(PyErr),
}

impl From<LoadError> for Stop {
    fn from(e: LoadError) -> Stop {
        Stop::Load(e)
    }
}

/// One tensor of the model's table: `name`, `ggml_type` (`"Q4_K"`), `dims`
/// in GGUF order (ne0 first), `offset` (absolute, in its file), `n_bytes`,
/// `split` (shard index), as `seam inspect --json` lists it.
#[pyclass(name = "TensorInfo", module = "seam", frozen, get_all)]
pub struct PyTensorInfo {
    /// The name.
    name: String,
    /// The ggml type's name.
    ggml_type: &'static str,
    /// Dimensions in GGUF order.
    dims: Vec<u64>,
    /// Absolute byte offset in its file.
    offset: u64,
    /// Bytes of data.
    n_bytes: u64,
    /// The shard.
    split: usize,
}

#[pymethods]
impl PyTensorInfo {
    fn __repr__(&self) -> String {
        format!(
            "TensorInfo(name={:?}, ggml_type={:?}, dims={:?}, n_bytes={})",
            self.name, self.ggml_type, self.dims, self.n_bytes
        )
    }
}

impl From<&TensorInfo> for PyTensorInfo {
    fn from(t: &TensorInfo) -> PyTensorInfo {
        PyTensorInfo {
            name: t.name.clone(),
            ggml_type: t.ggml_type.name(),
            dims: t.dims.clone(),
            offset: t.offset,
            n_bytes: t.n_bytes,
            split: t.split,
        }
    }
}

/// A model mapped for loading onto one device. Made by `seam.open`.
#[pyclass(name = "Session", module = "seam", frozen)]
pub struct PySession {
    loaded: Arc<Loaded>,
}

/// Opens a session: `device` is `"cuda[:N]"`, `"rocm[:N]"`, `"host"`,
/// `"fake"` or `"sink"` (`None`: the first CUDA GPU, else the CPU, as
/// `seam load` picks), `config` a JSON file of `vllm_cpp.*` knobs, and each
/// keyword a knob named as its `VT_*` variable without the prefix
/// (`pinned_h2d_mib=8`): environment (keywords over the process's
/// variables) > config > device default. The model is mapped, nothing is
/// staged yet.
#[pyfunction]
#[pyo3(signature = (path, device=None, *, config=None, **knobs))]
pub fn open(
    py: Python<'_>,
    path: PathBuf,
    device: Option<&str>,
    config: Option<PathBuf>,
    knobs: Option<&Bound<'_, PyDict>>,
) -> PyResult<PySession> {
    let options = SessionOptions {
        env: session_env(knobs)?,
        config,
        ..SessionOptions::default()
    };
    let spec = match device {
        Some(text) => seam_devices::parse(text).map_err(|e| DeviceError::new_err(cli_line(&e)))?,
        None => py.detach(seam_devices::best_present),
    };
    let loaded = py.detach(|| Loaded::open(spec, &path, &options))?;
    Ok(PySession {
        loaded: Arc::new(loaded),
    })
}

#[pymethods]
impl PySession {
    /// The device (`"cuda:0"`, `"host"`, `"fake"`).
    #[getter]
    fn device(&self) -> String {
        self.loaded.spec.name()
    }

    /// The file opened (the first shard of a split model).
    #[getter]
    fn path(&self) -> PathBuf {
        self.loaded.path.clone()
    }

    /// The line naming each resolved knob and where it came from, as
    /// `seam load` prints it.
    #[getter]
    fn policy_line(&self) -> String {
        self.loaded.session().policy_line()
    }

    /// The seam's counters for the device: `uploads`, `uploaded_bytes`,
    /// `releases`, `released_span_bytes`, `released_page_bytes`.
    #[getter]
    fn counts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.loaded.session().platform().stage_counters().snapshot();
        let out = PyDict::new(py);
        out.set_item("uploads", c.uploads)?;
        out.set_item("uploaded_bytes", c.uploaded_bytes)?;
        out.set_item("releases", c.releases)?;
        out.set_item("released_span_bytes", c.released_span_bytes)?;
        out.set_item("released_page_bytes", c.released_page_bytes)?;
        Ok(out)
    }

    /// The tensor table, in file order.
    #[getter]
    fn tensors(&self) -> Vec<PyTensorInfo> {
        self.loaded
            .model
            .tensors()
            .iter()
            .map(PyTensorInfo::from)
            .collect()
    }

    /// The table's entry for `name` (`KeyError` if there is none).
    fn tensor(&self, name: &str) -> PyResult<PyTensorInfo> {
        Ok(self.loaded.tensor(self.loaded.index_of(name)?).into())
    }

    fn __len__(&self) -> usize {
        self.loaded.model.tensors().len()
    }

    fn __contains__(&self, name: &str) -> bool {
        self.loaded.by_name.contains_key(name)
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyIterator>> {
        PyList::new(py, self.tensors())?.try_iter()
    }

    fn __repr__(&self) -> String {
        format!(
            "Session(path={:?}, device={:?}, tensors={})",
            self.loaded.path,
            self.loaded.spec.name(),
            self.loaded.model.tensors().len()
        )
    }

    /// What a kernel on the device reads for tensor `name`, staged on
    /// first use through `seam::resident_weight` and memoized: a `Tensor`
    /// to hand to `torch.from_dlpack` / `numpy.from_dlpack`.
    fn resident(&self, py: Python<'_>, name: &str) -> PyResult<PyTensor> {
        let index = self.loaded.index_of(name)?;
        let weight = self.loaded.weight(index).map_err(load_error)?;
        py.detach(|| self.loaded.session().resident(&weight).map(drop))
            .map_err(staging_error)?;
        Ok(PyTensor::new(Arc::clone(&self.loaded), index, weight))
    }

    /// Stages every tensor (or those of `names`) in parallel across the
    /// ring's lanes (`seam::session::Session::stage_picked`), calling
    /// `progress(name, done_bytes, total_bytes)` after each one staged
    /// here; returns their `Tensor`s in table order. A tensor staged
    /// before (by `resident`) is not staged again. An exception of
    /// `progress` stops the load and is raised.
    #[pyo3(signature = (progress=None, names=None))]
    fn stage_all(
        &self,
        py: Python<'_>,
        progress: Option<Py<PyAny>>,
        names: Option<Vec<String>>,
    ) -> PyResult<Vec<PyTensor>> {
        let loaded = &*self.loaded;
        let n = loaded.model.tensors().len();
        let wanted: Vec<bool> = match &names {
            None => vec![true; n],
            Some(names) => {
                let mut wanted = vec![false; n];
                for name in names {
                    wanted[loaded.index_of(name)?] = true;
                }
                wanted
            }
        };
        let made: Vec<bool> = lock(&loaded.weights).iter().map(Option::is_some).collect();
        let pick = |i: usize| wanted[i] && !made[i];
        let total: u64 = (0..n)
            .filter(|&i| pick(i))
            .map(|i| loaded.tensor(i).n_bytes)
            .sum();
        let done = AtomicU64::new(0);
        let on_staged = |staged: seam::session::Staged<'_>| -> Result<(), Stop> {
            let so_far =
                done.fetch_add(staged.tensor.n_bytes, Ordering::Relaxed) + staged.tensor.n_bytes;
            match &progress {
                None => Ok(()),
                Some(callback) => Python::attach(|py| {
                    callback
                        .call1(py, (staged.tensor.name.as_str(), so_far, total))
                        .map(drop)
                        .map_err(Stop::Callback)
                }),
            }
        };
        let staged = py.detach(|| {
            loaded
                .session()
                .stage_picked(&loaded.model, &|i, _| pick(i), &on_staged)
        });
        let staged = staged.map_err(|stop| match stop {
            Stop::Load(e) => load_error(e),
            Stop::Callback(e) => e,
        })?;
        {
            let mut weights = lock(&loaded.weights);
            for (index, weight) in staged {
                // A weight another thread made meanwhile is kept; this
                // copy is dropped.
                weights[index].get_or_insert_with(|| Arc::new(weight));
            }
        }
        let mut out = Vec::new();
        for index in (0..n).filter(|&i| wanted[i]) {
            let weight = loaded.weight(index).map_err(load_error)?;
            // Memoized for what was staged above; stages one made before
            // but never staged (its staging failed then).
            py.detach(|| loaded.session().resident(&weight).map(drop))
                .map_err(staging_error)?;
            out.push(PyTensor::new(Arc::clone(&self.loaded), index, weight));
        }
        Ok(out)
    }
}
