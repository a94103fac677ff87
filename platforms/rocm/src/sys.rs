//! The raw layer: the HIP runtime (`libamdhip64`) opened at run time with
//! `libloading`, and the table of the few HIP calls the backend makes.
//!
//! Nothing here is linked at build time, so the crate builds and tests on a
//! machine without ROCm. The library is searched once per process
//! ([`library`], a `OnceLock`); its absence is an error value naming every
//! path tried ([`LoadError`]), never a panic.
//!
//! The signatures and the numeric values below are transcribed from HIP's
//! own headers, `include/hip/hip_runtime_api.h` and
//! `include/hip/driver_types.h` of github.com/ROCm/HIP at tags rocm-6.0.0 and
//! rocm-6.2.0 and at HIP 6.3 (the repository's last release before HIP moved
//! into ROCm/rocm-systems, `projects/hip/`, whose ROCm 7 header has the same
//! values). The device attributes are passed by number: the enum
//! `hipDeviceAttribute_t` was renumbered between HIP 4.x and 5.0 (in 4.5,
//! `hipDeviceAttributeIntegrated` was 25 and
//! `hipDeviceAttributePageableMemoryAccess` 50) and has kept the numbers used
//! here from 5.0 through 7.x, so the platform refuses runtimes older than
//! [`MIN_RUNTIME_VERSION`].

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

use libloading::Library;

/// `hipError_t`: a C enum, returned in a 32-bit register.
pub type HipErrorCode = c_int;
/// `hipStream_t` (`struct ihipStream_t*`).
pub type HipStream = *mut c_void;
/// `hipDevice_t` (`int`).
pub type HipDevice = c_int;

/// `hipSuccess`.
pub const HIP_SUCCESS: HipErrorCode = 0;
/// `hipErrorOutOfMemory`.
pub const HIP_ERROR_OUT_OF_MEMORY: HipErrorCode = 2;
/// `hipErrorNoDevice`: `hipGetDeviceCount` (and `hipInit`) found no device.
pub const HIP_ERROR_NO_DEVICE: HipErrorCode = 100;
/// `hipErrorInvalidDevice`: an ordinal out of range.
pub const HIP_ERROR_INVALID_DEVICE: HipErrorCode = 101;

/// `hipDeviceAttributeIntegrated` (`hipDeviceAttribute_t`, HIP 5.0 to 7.x:
/// the 17th entry after `hipDeviceAttributeCudaCompatibleBegin = 0`): the
/// GPU is integrated (an APU) rather than discrete.
pub const HIP_DEVICE_ATTRIBUTE_INTEGRATED: c_int = 16;
/// `hipDeviceAttributePageableMemoryAccess` (`hipDeviceAttribute_t`, HIP
/// 5.0 to 7.x): the device coherently accesses pageable host memory without
/// `hipHostRegister`.
pub const HIP_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS: c_int = 65;

/// `hipStreamNonBlocking`: the stream does not synchronize with the null
/// stream.
pub const HIP_STREAM_NON_BLOCKING: c_uint = 0x01;
/// `hipHostMallocDefault`: plain pinned host memory.
pub const HIP_HOST_MALLOC_DEFAULT: c_uint = 0x0;
/// `hipMemcpyHostToDevice` (`hipMemcpyKind`, driver_types.h).
pub const HIP_MEMCPY_HOST_TO_DEVICE: c_int = 1;
/// `hipMemcpyDeviceToHost` (`hipMemcpyKind`, driver_types.h).
pub const HIP_MEMCPY_DEVICE_TO_HOST: c_int = 2;

/// The oldest HIP runtime whose `hipDeviceAttribute_t` numbering matches the
/// constants above (5.0.0, as `hipRuntimeGetVersion` reports it:
/// `major * 10_000_000 + minor * 100_000 + patch`).
pub const MIN_RUNTIME_VERSION: c_int = 50_000_000;

/// Where the HIP runtime is looked for, in order: the loader's search path
/// (the development symlink, then the sonames of ROCm 7, 6 and 5), then the
/// default ROCm install.
pub const LIBRARY_CANDIDATES: &[&str] = &[
    "libamdhip64.so",
    "libamdhip64.so.7",
    "libamdhip64.so.6",
    "libamdhip64.so.5",
    "/opt/rocm/lib/libamdhip64.so",
];

/// The HIP runtime could not be opened from any candidate.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("HIP runtime (libamdhip64) not found (searched {}){}", .searched.join(", "), details(.failures))]
pub struct LoadError {
    /// Every name or path tried, in order.
    pub searched: Vec<String>,
    /// Why each failed: `(candidate, reason)`.
    pub failures: Vec<(String, String)>,
}

/// The failures worth printing: a candidate that exists but cannot be used
/// (a missing dependency, a missing symbol), not a plain "no such file".
fn details(failures: &[(String, String)]) -> String {
    failures
        .iter()
        .filter(|(_, why)| !why.contains("No such file or directory"))
        .map(|(name, why)| format!("; {name}: {why}"))
        .collect()
}

fn describe(e: &libloading::Error) -> String {
    match std::error::Error::source(e) {
        Some(source) => format!("{e}: {source}"),
        None => e.to_string(),
    }
}

/// Declares the table: one field per HIP call, its C symbol and signature.
macro_rules! hip_table {
    ($( $(#[$doc:meta])* $field:ident = $symbol:literal : fn($($arg:ty),*) -> $ret:ty; )*) => {
        /// The HIP calls the backend makes, resolved from one loaded
        /// `libamdhip64`. The function pointers stay valid while the library
        /// is loaded, that is as long as this value lives.
        pub struct Hip {
            $( $(#[$doc])* pub $field: unsafe extern "C" fn($($arg),*) -> $ret, )*
            path: String,
            _library: Library,
        }

        /// The C symbols of the table, in order.
        pub const SYMBOLS: &[&str] = &[$($symbol),*];

        impl Hip {
            /// Resolves every call of the table in `library`.
            ///
            /// # Safety
            ///
            /// `library` must be a HIP runtime: each symbol is taken to have
            /// the signature declared in the table.
            unsafe fn resolve(library: Library, path: String) -> Result<Hip, String> {
                $(
                    // SAFETY: the caller guarantees `library` is a HIP
                    // runtime, whose `$symbol` has this signature
                    // (hip_runtime_api.h); the pointer is copied out and
                    // kept next to the library that owns it.
                    let $field = *unsafe {
                        library.get::<unsafe extern "C" fn($($arg),*) -> $ret>(
                            concat!($symbol, "\0").as_bytes(),
                        )
                    }
                    .map_err(|e| format!("{}: {}", $symbol, describe(&e)))?;
                )*
                Ok(Hip { $($field,)* path, _library: library })
            }
        }
    };
}

hip_table! {
    /// `hipError_t hipInit(unsigned int flags)`; flags must be 0.
    init = "hipInit": fn(c_uint) -> HipErrorCode;
    /// `hipError_t hipRuntimeGetVersion(int* runtimeVersion)`.
    runtime_get_version = "hipRuntimeGetVersion": fn(*mut c_int) -> HipErrorCode;
    /// `hipError_t hipGetDeviceCount(int* count)`.
    get_device_count = "hipGetDeviceCount": fn(*mut c_int) -> HipErrorCode;
    /// `hipError_t hipSetDevice(int deviceId)`: the calling thread's
    /// current device.
    set_device = "hipSetDevice": fn(c_int) -> HipErrorCode;
    /// `hipError_t hipDeviceGet(hipDevice_t* device, int ordinal)`.
    device_get = "hipDeviceGet": fn(*mut HipDevice, c_int) -> HipErrorCode;
    /// `hipError_t hipDeviceGetAttribute(int* pi, hipDeviceAttribute_t attr,
    /// int deviceId)`.
    device_get_attribute = "hipDeviceGetAttribute": fn(*mut c_int, c_int, c_int) -> HipErrorCode;
    /// `hipError_t hipDeviceGetName(char* name, int len, hipDevice_t device)`.
    device_get_name = "hipDeviceGetName": fn(*mut c_char, c_int, HipDevice) -> HipErrorCode;
    /// `hipError_t hipMemGetInfo(size_t* free, size_t* total)`, of the
    /// current device.
    mem_get_info = "hipMemGetInfo": fn(*mut usize, *mut usize) -> HipErrorCode;
    /// `hipError_t hipMalloc(void** ptr, size_t size)`, on the current
    /// device.
    malloc = "hipMalloc": fn(*mut *mut c_void, usize) -> HipErrorCode;
    /// `hipError_t hipFree(void* ptr)`.
    free = "hipFree": fn(*mut c_void) -> HipErrorCode;
    /// `hipError_t hipHostMalloc(void** ptr, size_t size, unsigned int
    /// flags)`. HIP 6.3's header marks it deprecated in favour of
    /// `hipExtHostAlloc`, but every runtime from 5.0 on exports it.
    host_malloc = "hipHostMalloc": fn(*mut *mut c_void, usize, c_uint) -> HipErrorCode;
    /// `hipError_t hipHostFree(void* ptr)`.
    host_free = "hipHostFree": fn(*mut c_void) -> HipErrorCode;
    /// `hipError_t hipStreamCreateWithFlags(hipStream_t* stream, unsigned int
    /// flags)`, on the current device.
    stream_create_with_flags = "hipStreamCreateWithFlags": fn(*mut HipStream, c_uint) -> HipErrorCode;
    /// `hipError_t hipStreamSynchronize(hipStream_t stream)`.
    stream_synchronize = "hipStreamSynchronize": fn(HipStream) -> HipErrorCode;
    /// `hipError_t hipStreamDestroy(hipStream_t stream)`.
    stream_destroy = "hipStreamDestroy": fn(HipStream) -> HipErrorCode;
    /// `hipError_t hipMemcpyAsync(void* dst, const void* src, size_t
    /// sizeBytes, hipMemcpyKind kind, hipStream_t stream)`.
    memcpy_async = "hipMemcpyAsync": fn(*mut c_void, *const c_void, usize, c_int, HipStream) -> HipErrorCode;
    /// `hipError_t hipMemcpy(void* dst, const void* src, size_t sizeBytes,
    /// hipMemcpyKind kind)`: synchronous, on the null stream.
    memcpy = "hipMemcpy": fn(*mut c_void, *const c_void, usize, c_int) -> HipErrorCode;
    /// `const char* hipGetErrorString(hipError_t hipError)`: a static
    /// string.
    get_error_string = "hipGetErrorString": fn(HipErrorCode) -> *const c_char;
}

impl Hip {
    /// The candidate the runtime was opened from.
    pub fn path(&self) -> &str {
        &self.path
    }
}

/// Opens the first candidate that loads and has every call of the table.
///
/// # Errors
///
/// No candidate qualifies: the error names every candidate and why the
/// usable-looking ones failed.
pub fn load_from<S: AsRef<str>>(candidates: &[S]) -> Result<Hip, LoadError> {
    let mut failures = Vec::new();
    for candidate in candidates {
        let name = candidate.as_ref();
        // SAFETY: opening a library runs its initializers. The candidates
        // name the HIP runtime, which is built to be opened this way (its
        // initializers only set up the runtime); a name that does not exist
        // fails without running anything.
        let library = match unsafe { Library::new(name) } {
            Ok(library) => library,
            Err(e) => {
                failures.push((name.to_string(), describe(&e)));
                continue;
            }
        };
        // SAFETY: `library` was opened under a HIP runtime's name; a library
        // that merely has the name but lacks a call is refused here.
        match unsafe { Hip::resolve(library, name.to_string()) } {
            Ok(hip) => return Ok(hip),
            Err(why) => failures.push((name.to_string(), format!("missing HIP call {why}"))),
        }
    }
    Err(LoadError {
        searched: candidates.iter().map(|c| c.as_ref().to_string()).collect(),
        failures,
    })
}

/// The process's HIP runtime, searched once among [`LIBRARY_CANDIDATES`].
///
/// # Errors
///
/// The runtime is absent (the same error on every call).
pub fn library() -> Result<&'static Hip, &'static LoadError> {
    static HIP: OnceLock<Result<Hip, LoadError>> = OnceLock::new();
    HIP.get_or_init(|| load_from(LIBRARY_CANDIDATES)).as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bogus_paths_name_every_candidate_in_order() {
        let paths = [
            "/nonexistent/seam-rocm-test/libamdhip64.so",
            "/nonexistent/seam-rocm-test/libamdhip64.so.6",
            "libseam-rocm-test-no-such-library.so.5",
        ];
        let err = load_from(&paths).err().expect("bogus paths cannot load");
        assert_eq!(err.searched, paths.map(String::from).to_vec());
        assert_eq!(err.failures.len(), paths.len());
        let text = err.to_string();
        assert!(
            text.starts_with("HIP runtime (libamdhip64) not found (searched "),
            "{text}"
        );
        let mut at = 0;
        for path in paths {
            let found = text[at..]
                .find(path)
                .unwrap_or_else(|| panic!("{path} missing or out of order in {text}"));
            at += found + path.len();
        }
        // Plain "no such file" failures are not repeated after the list.
        assert!(!text.contains("No such file"), "{text}");
    }

    #[test]
    fn no_candidates_is_an_error_not_a_panic() {
        let err = load_from::<&str>(&[]).err().expect("nothing to load");
        assert!(err.searched.is_empty() && err.failures.is_empty());
        assert_eq!(
            err.to_string(),
            "HIP runtime (libamdhip64) not found (searched )"
        );
    }

    /// A library that loads but is not HIP is refused, naming the first
    /// missing call, and the search goes on.
    #[test]
    fn a_library_without_the_hip_calls_is_refused() {
        let err = load_from(&["libc.so.6", "/nonexistent/libamdhip64.so"])
            .err()
            .expect("libc is not HIP");
        assert_eq!(err.searched, ["libc.so.6", "/nonexistent/libamdhip64.so"]);
        let (name, why) = &err.failures[0];
        assert_eq!(name, "libc.so.6");
        assert!(why.starts_with("missing HIP call hipInit"), "{why}");
        let text = err.to_string();
        assert!(
            text.contains("libc.so.6: missing HIP call hipInit"),
            "{text}"
        );
    }

    #[test]
    fn the_table_lists_every_call_the_backend_needs() {
        for call in [
            "hipInit",
            "hipGetDeviceCount",
            "hipSetDevice",
            "hipDeviceGetAttribute",
            "hipDeviceGetName",
            "hipMemGetInfo",
            "hipMalloc",
            "hipFree",
            "hipHostMalloc",
            "hipHostFree",
            "hipStreamCreateWithFlags",
            "hipStreamSynchronize",
            "hipStreamDestroy",
            "hipMemcpyAsync",
            "hipMemcpy",
            "hipGetErrorString",
        ] {
            assert!(SYMBOLS.contains(&call), "{call} missing from the table");
        }
    }

    #[test]
    fn the_global_search_uses_the_documented_candidates() {
        match library() {
            Ok(hip) => assert!(LIBRARY_CANDIDATES.contains(&hip.path())),
            Err(e) => assert_eq!(e.searched, LIBRARY_CANDIDATES),
        }
        // Searched once: the same answer, the same allocation.
        assert!(match (library(), library()) {
            (Ok(a), Ok(b)) => std::ptr::eq(a, b),
            (Err(a), Err(b)) => std::ptr::eq(a, b),
            _ => false,
        });
    }
}
