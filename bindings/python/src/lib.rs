//! The `seam` Python package's native module (`seam._seam`): a load
//! session on a device ([`session::PySession`]), the staged weights it
//! hands out ([`tensor::PyTensor`], exported without a copy through
//! DLPack), one exception class per kind of load error ([`errors`]) and
//! the process's host residency.
//!
//! Nothing here re-implements the seam: the session is
//! `seam::session::Session` (knobs resolved by the seam's own policy
//! machinery, staging through `seam::resident_weight`, the release rules
//! unchanged), the device is opened as `seam load` opens it
//! (`seam-devices`), and a Python keyword knob is the environment variable
//! of the same name ([`knobs`]).
//!
//! **Architecture Invariant:** the seam knows nothing of Python or DLPack;
//! this crate is a binary-like leaf, as the CLI is, and no crate depends on
//! it.

use pyo3::prelude::*;
use pyo3::types::PyDict;

mod dlpack;
mod errors;
mod knobs;
mod session;
mod tensor;

/// The process's host residency now, in bytes: `peak` (VmHWM), `rss`
/// (VmRSS), `rss_file`, `rss_anon`, read from `/proc/self/status`.
#[pyfunction]
fn residency(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let r = seam::residency::current()
        .map_err(|e| errors::SeamError::new_err(format!("reading /proc/self/status: {e}")))?;
    let out = PyDict::new(py);
    out.set_item("peak", r.peak)?;
    out.set_item("rss", r.rss)?;
    out.set_item("rss_file", r.rss_file)?;
    out.set_item("rss_anon", r.rss_anon)?;
    Ok(out)
}

/// Resets the process's peak (VmHWM) to its RSS now, so a later
/// `residency()["peak"]` measures only what follows.
#[pyfunction]
fn reset_peak() -> PyResult<()> {
    seam::residency::reset_peak()
        .map_err(|e| errors::SeamError::new_err(format!("writing /proc/self/clear_refs: {e}")))
}

/// Writes the generated model `cargo xtask gen-gguf --size SIZE --seed
/// SEED` writes (`seam_tools::demo::generated_model`, byte for byte) to
/// `path`; returns its size. Benchmark tooling (a GPU machine without Rust
/// makes its test model with the wheel it tests), not part of the API.
#[pyfunction]
#[pyo3(signature = (path, size, seed=0))]
fn _write_generated_model(
    py: Python<'_>,
    path: std::path::PathBuf,
    size: u64,
    seed: u64,
) -> PyResult<u64> {
    py.detach(|| seam_tools::demo::generated_model(size, seed).write_file(&path))
        .map_err(|e| errors::load_error(e.into()))
}

/// The module: classes, functions and exception classes.
#[pymodule]
#[pyo3(name = "_seam")]
fn seam_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<session::PySession>()?;
    m.add_class::<session::PyTensorInfo>()?;
    m.add_class::<tensor::PyTensor>()?;
    m.add_function(wrap_pyfunction!(session::open, m)?)?;
    m.add_function(wrap_pyfunction!(knobs::knob_names, m)?)?;
    m.add_function(wrap_pyfunction!(residency, m)?)?;
    m.add_function(wrap_pyfunction!(reset_peak, m)?)?;
    m.add_function(wrap_pyfunction!(_write_generated_model, m)?)?;
    errors::add_to(m)
}
