//! One Python exception class per kind of load error, each a subclass of
//! `seam.SeamError`, its message the line `seam load` prints after
//! `seam: error: ` for the same failure (control bytes escaped, one line).
//!
//! | class | raised for |
//! |---|---|
//! | `GgufError` | a malformed or unreadable file (`file`, `offset`, `field` attributes) |
//! | `PolicyError` | a bad knob: an environment variable, a keyword, the config file |
//! | `RingError` | the staging ring could not be set up |
//! | `StagingError` | staging a weight failed (`seam::SeamError`) |
//! | `DeviceError` | the device: unknown, unavailable, or a device operation failed |
//! | `SamplerError`, `PageCacheError`, `ReadError` | the session's other failures |

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use seam::session::LoadError;

create_exception!(
    seam,
    SeamError,
    PyException,
    "Base class of every error of the seam."
);
create_exception!(
    seam,
    GgufError,
    SeamError,
    "The file is malformed or cannot be read; `file`, `offset` and `field` name where."
);
create_exception!(
    seam,
    PolicyError,
    SeamError,
    "A knob (environment variable, keyword or config key) or the config file is wrong."
);
create_exception!(
    seam,
    RingError,
    SeamError,
    "The staging ring could not be set up."
);
create_exception!(seam, StagingError, SeamError, "Staging a weight failed.");
create_exception!(
    seam,
    DeviceError,
    SeamError,
    "The device is unknown or unavailable, or a device operation failed."
);
create_exception!(
    seam,
    SamplerError,
    SeamError,
    "The residency sampler could not be started."
);
create_exception!(
    seam,
    PageCacheError,
    SeamError,
    "Dropping the page cache of released weights failed."
);
create_exception!(
    seam,
    ReadError,
    SeamError,
    "Reading a tensor into an owned buffer (mmap off) failed."
);

/// The line `seam load` prints for `error` after `seam: error: `.
pub fn cli_line(error: &dyn std::fmt::Display) -> String {
    seam::text::terminal_safe(&error.to_string().replace('\n', " ")).into_owned()
}

/// `error` as the exception of its kind.
pub fn load_error(error: LoadError) -> PyErr {
    let line = cli_line(&error);
    match error {
        LoadError::Gguf(e) => Python::attach(|py| {
            let err = GgufError::new_err(line);
            let value = err.value(py);
            let set = value
                .setattr("file", e.file.to_string_lossy().into_owned())
                .and_then(|()| value.setattr("offset", e.offset))
                .and_then(|()| value.setattr("field", e.field.clone()));
            match set {
                Ok(()) => err,
                Err(failed) => failed,
            }
        }),
        LoadError::Policy(_) => PolicyError::new_err(line),
        LoadError::Ring(_) => RingError::new_err(line),
        LoadError::Seam(_) => StagingError::new_err(line),
        LoadError::Device(_) => DeviceError::new_err(line),
        LoadError::Sampler(_) => SamplerError::new_err(line),
        LoadError::PageCache(_) => PageCacheError::new_err(line),
        LoadError::Read { .. } => ReadError::new_err(line),
        // A kind added to the seam later: the base class, the same line.
        _ => SeamError::new_err(line),
    }
}

/// A staging failure (`seam::SeamError`) as `StagingError`.
pub fn staging_error(error: seam::SeamError) -> PyErr {
    load_error(LoadError::Seam(error))
}

/// Adds the exception classes to the module.
pub fn add_to(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("SeamError", py.get_type::<SeamError>())?;
    m.add("GgufError", py.get_type::<GgufError>())?;
    m.add("PolicyError", py.get_type::<PolicyError>())?;
    m.add("RingError", py.get_type::<RingError>())?;
    m.add("StagingError", py.get_type::<StagingError>())?;
    m.add("DeviceError", py.get_type::<DeviceError>())?;
    m.add("SamplerError", py.get_type::<SamplerError>())?;
    m.add("PageCacheError", py.get_type::<PageCacheError>())?;
    m.add("ReadError", py.get_type::<ReadError>())?;
    Ok(())
}
