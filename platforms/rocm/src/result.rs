//! Checked HIP calls: each wrapper makes one call of the [`Hip`] table and
//! turns its `hipError_t` into a [`HipError`] naming the call, the code and
//! HIP's own message.
//!
//! Calls that work on "the current device" (allocation, streams, memory
//! info) use the calling thread's device: HIP keeps it per thread, so the
//! owning layer calls [`set_device`] first, on whichever thread it runs.

use std::ffi::{CStr, c_char, c_int, c_void};

use crate::sys::{self, Hip, HipErrorCode, HipStream};

/// A HIP call that returned an error.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{call}: {message} (hipError_t {code})")]
pub struct HipError {
    /// The HIP function (`"hipMalloc"`).
    pub call: &'static str,
    /// The `hipError_t` it returned.
    pub code: HipErrorCode,
    /// HIP's text for the code (`hipGetErrorString`).
    pub message: String,
}

impl HipError {
    /// Whether the device ran out of memory (`hipErrorOutOfMemory`).
    pub fn is_out_of_memory(&self) -> bool {
        self.code == sys::HIP_ERROR_OUT_OF_MEMORY
    }

    /// Whether the runtime found no device (`hipErrorNoDevice`).
    pub fn is_no_device(&self) -> bool {
        self.code == sys::HIP_ERROR_NO_DEVICE
    }
}

/// HIP's text for `code`.
pub fn error_string(hip: &Hip, code: HipErrorCode) -> String {
    // SAFETY: hipGetErrorString takes any code and returns a pointer to a
    // static string (or null, handled below).
    let text = unsafe { (hip.get_error_string)(code) };
    if text.is_null() {
        return "unknown HIP error".into();
    }
    // SAFETY: non-null, it points to a NUL-terminated string that lives as
    // long as the runtime (a static table in libamdhip64).
    unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned()
}

fn check(hip: &Hip, call: &'static str, code: HipErrorCode) -> Result<(), HipError> {
    if code == sys::HIP_SUCCESS {
        Ok(())
    } else {
        Err(HipError {
            call,
            code,
            message: error_string(hip, code),
        })
    }
}

/// `hipInit(0)`.
///
/// # Errors
///
/// The runtime cannot start (no driver, no device).
pub fn init(hip: &Hip) -> Result<(), HipError> {
    // SAFETY: hipInit takes flags by value; 0 is the only valid value.
    check(hip, "hipInit", unsafe { (hip.init)(0) })
}

/// `hipRuntimeGetVersion`: `major * 10_000_000 + minor * 100_000 + patch`.
///
/// # Errors
///
/// The runtime refuses.
pub fn runtime_version(hip: &Hip) -> Result<c_int, HipError> {
    let mut version = 0;
    // SAFETY: writes one int through a valid pointer.
    check(hip, "hipRuntimeGetVersion", unsafe {
        (hip.runtime_get_version)(&mut version)
    })?;
    Ok(version)
}

/// `hipGetDeviceCount`.
///
/// # Errors
///
/// The runtime refuses (`hipErrorNoDevice` when there is none).
pub fn device_count(hip: &Hip) -> Result<c_int, HipError> {
    let mut count = 0;
    // SAFETY: writes one int through a valid pointer.
    check(hip, "hipGetDeviceCount", unsafe {
        (hip.get_device_count)(&mut count)
    })?;
    Ok(count)
}

/// `hipSetDevice`: makes `ordinal` the calling thread's current device.
///
/// # Errors
///
/// No such device.
pub fn set_device(hip: &Hip, ordinal: c_int) -> Result<(), HipError> {
    // SAFETY: takes an int by value; HIP validates it.
    check(hip, "hipSetDevice", unsafe { (hip.set_device)(ordinal) })
}

/// `hipDeviceGetAttribute` by the attribute's number (see [`sys`]).
///
/// # Errors
///
/// No such device, or an attribute this runtime does not know.
pub fn device_attribute(hip: &Hip, attribute: c_int, ordinal: c_int) -> Result<c_int, HipError> {
    let mut value = 0;
    // SAFETY: writes one int through a valid pointer; HIP validates the
    // attribute and the ordinal.
    check(hip, "hipDeviceGetAttribute", unsafe {
        (hip.device_get_attribute)(&mut value, attribute, ordinal)
    })?;
    Ok(value)
}

/// `hipDeviceGet` then `hipDeviceGetName`.
///
/// # Errors
///
/// No such device.
pub fn device_name(hip: &Hip, ordinal: c_int) -> Result<String, HipError> {
    let mut device = 0;
    // SAFETY: writes one hipDevice_t (an int) through a valid pointer.
    check(hip, "hipDeviceGet", unsafe {
        (hip.device_get)(&mut device, ordinal)
    })?;
    let mut name = [0 as c_char; 256];
    // SAFETY: HIP writes at most `len` bytes, NUL included, into `name`,
    // which has that many.
    check(hip, "hipDeviceGetName", unsafe {
        (hip.device_get_name)(name.as_mut_ptr(), name.len() as c_int, device)
    })?;
    let bytes: Vec<u8> = name
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// `hipMemGetInfo` of the current device: `(free, total)` bytes.
///
/// # Errors
///
/// The runtime refuses.
pub fn mem_get_info(hip: &Hip) -> Result<(usize, usize), HipError> {
    let (mut free, mut total) = (0, 0);
    // SAFETY: writes two size_t through valid pointers.
    check(hip, "hipMemGetInfo", unsafe {
        (hip.mem_get_info)(&mut free, &mut total)
    })?;
    Ok((free, total))
}

/// `hipMalloc` on the current device. The allocation is the caller's to
/// give back with [`free`]. Zero bytes give a null pointer.
///
/// # Errors
///
/// Out of memory (see [`HipError::is_out_of_memory`]).
pub fn malloc(hip: &Hip, len: usize) -> Result<*mut c_void, HipError> {
    let mut ptr = std::ptr::null_mut();
    // SAFETY: writes one pointer through a valid pointer.
    check(hip, "hipMalloc", unsafe { (hip.malloc)(&mut ptr, len) })?;
    Ok(ptr)
}

/// `hipFree`.
///
/// # Safety
///
/// `ptr` came from [`malloc`] and is freed once; no queued work still uses
/// it.
///
/// # Errors
///
/// The runtime refuses.
pub unsafe fn free(hip: &Hip, ptr: *mut c_void) -> Result<(), HipError> {
    // SAFETY: the caller's contract.
    check(hip, "hipFree", unsafe { (hip.free)(ptr) })
}

/// `hipHostMalloc(hipHostMallocDefault)`: pinned host memory, the caller's
/// to give back with [`host_free`]. Zero bytes give a null pointer.
///
/// # Errors
///
/// Out of memory.
pub fn host_malloc(hip: &Hip, len: usize) -> Result<*mut c_void, HipError> {
    let mut ptr = std::ptr::null_mut();
    // SAFETY: writes one pointer through a valid pointer.
    check(hip, "hipHostMalloc", unsafe {
        (hip.host_malloc)(&mut ptr, len, sys::HIP_HOST_MALLOC_DEFAULT)
    })?;
    Ok(ptr)
}

/// `hipHostFree`.
///
/// # Safety
///
/// `ptr` came from [`host_malloc`] and is freed once; nothing reads it any
/// more (no queued copy, no live slice).
///
/// # Errors
///
/// The runtime refuses.
pub unsafe fn host_free(hip: &Hip, ptr: *mut c_void) -> Result<(), HipError> {
    // SAFETY: the caller's contract.
    check(hip, "hipHostFree", unsafe { (hip.host_free)(ptr) })
}

/// `hipStreamCreateWithFlags(hipStreamNonBlocking)` on the current device:
/// a stream that does not wait for the null stream. The caller destroys it
/// with [`stream_destroy`].
///
/// # Errors
///
/// The runtime refuses.
pub fn stream_create_non_blocking(hip: &Hip) -> Result<HipStream, HipError> {
    let mut stream = std::ptr::null_mut();
    // SAFETY: writes one handle through a valid pointer.
    check(hip, "hipStreamCreateWithFlags", unsafe {
        (hip.stream_create_with_flags)(&mut stream, sys::HIP_STREAM_NON_BLOCKING)
    })?;
    Ok(stream)
}

/// `hipStreamSynchronize`.
///
/// # Safety
///
/// `stream` is alive (created, not yet destroyed).
///
/// # Errors
///
/// Work queued on the stream failed.
pub unsafe fn stream_synchronize(hip: &Hip, stream: HipStream) -> Result<(), HipError> {
    // SAFETY: the caller's contract.
    check(hip, "hipStreamSynchronize", unsafe {
        (hip.stream_synchronize)(stream)
    })
}

/// `hipStreamDestroy`.
///
/// # Safety
///
/// `stream` is alive and destroyed once.
///
/// # Errors
///
/// The runtime refuses.
pub unsafe fn stream_destroy(hip: &Hip, stream: HipStream) -> Result<(), HipError> {
    // SAFETY: the caller's contract.
    check(hip, "hipStreamDestroy", unsafe {
        (hip.stream_destroy)(stream)
    })
}

/// `hipMemcpyAsync(hipMemcpyHostToDevice)`: queues a copy of `src` to the
/// device address `dst` on `stream`.
///
/// # Safety
///
/// `dst..dst + src.len()` lies inside one live device allocation; `stream`
/// is alive; `src` stays valid and unchanged until the stream is
/// synchronized (the device may read it until then).
///
/// # Errors
///
/// The copy cannot be queued.
pub unsafe fn memcpy_htod_async(
    hip: &Hip,
    dst: *mut c_void,
    src: &[u8],
    stream: HipStream,
) -> Result<(), HipError> {
    // SAFETY: the caller's contract.
    check(hip, "hipMemcpyAsync", unsafe {
        (hip.memcpy_async)(
            dst,
            src.as_ptr().cast(),
            src.len(),
            sys::HIP_MEMCPY_HOST_TO_DEVICE,
            stream,
        )
    })
}

/// `hipMemcpy(hipMemcpyDeviceToHost)`: copies the device bytes at `src`
/// into `dst`, synchronously (on the null stream, which does not wait for
/// non-blocking streams: synchronize those first).
///
/// # Safety
///
/// `src..src + dst.len()` lies inside one live device allocation.
///
/// # Errors
///
/// The copy failed.
pub unsafe fn memcpy_dtoh(hip: &Hip, dst: &mut [u8], src: *const c_void) -> Result<(), HipError> {
    // SAFETY: the caller's contract; `dst` is written only during the call.
    check(hip, "hipMemcpy", unsafe {
        (hip.memcpy)(
            dst.as_mut_ptr().cast(),
            src,
            dst.len(),
            sys::HIP_MEMCPY_DEVICE_TO_HOST,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(code: HipErrorCode) -> HipError {
        HipError {
            call: "hipMalloc",
            code,
            message: "out of memory".into(),
        }
    }

    #[test]
    fn an_error_names_the_call_the_message_and_the_code() {
        assert_eq!(
            error(2).to_string(),
            "hipMalloc: out of memory (hipError_t 2)"
        );
    }

    #[test]
    fn out_of_memory_and_no_device_are_recognized_by_code() {
        assert!(error(sys::HIP_ERROR_OUT_OF_MEMORY).is_out_of_memory());
        assert!(!error(1).is_out_of_memory());
        assert!(error(sys::HIP_ERROR_NO_DEVICE).is_no_device());
        assert!(!error(sys::HIP_ERROR_INVALID_DEVICE).is_no_device());
    }
}
