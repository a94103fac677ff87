//! AMD GPUs as a seam platform, through HIP (`libamdhip64`) loaded at run
//! time.
//!
//! Layers, as in the CUDA platform: [`sys`] (the HIP runtime opened with
//! `libloading` and a table of the calls used), [`result`] (checked calls
//! returning [`HipError`]), then this file's owning types
//! (device buffers, streams, pinned host buffers, each freed in `Drop`)
//! behind the seam's `Backend` and `Platform` traits.
//!
//! # Why a small `libloading` table
//!
//! The design card named `hip-sys`. Its 0.1.2 is raw bindgen FFI whose
//! build script panics without ROCm headers, and it is unmaintained (last
//! commit June 2024): the workspace would stop building on every machine
//! without ROCm, CI included. `cubecl-hip-sys` does load HIP at run time and
//! builds without ROCm, but it is raw bindgen output of the whole runtime
//! (and hiprtc), released once per HIP version, for the eighteen calls a
//! staging backend makes. So this crate declares those calls itself
//! ([`sys::Hip`]), each signature and constant checked by hand against
//! HIP's headers (ROCm 6.x, with ROCm 5.0 and 7 compared: see [`sys`]),
//! opens the library once (a `OnceLock`), and answers its absence with an
//! error naming every path searched. No build script, no bindgen, and
//! `libloading` is already in the lock file through `cudarc`.
//!
//! # Opening never panics
//!
//! [`RocmPlatform::open`] answers `DeviceError::Unavailable` with the reason:
//! the library absent (naming [`library_candidates`]), a runtime older than
//! HIP 5.0 (whose attribute numbering differs), `hipInit` failing, or no
//! such device.
//!
//! # Threads
//!
//! HIP's current device is per thread. Every operation calls
//! `hipSetDevice(ordinal)` on the calling thread first, since the seam's
//! staging ring queues copies and synchronizes from its reader threads.
//!
//! # Policy
//!
//! From the device's attributes, never its name ([`probe`]): a device with
//! pageable memory access reads the host pages (nothing staged, nothing
//! released); every other device stages, and its staged borrows' pages are
//! given back. An integrated GPU (an APU such as gfx1151, which reports no
//! pageable access) stages and releases like a discrete one: `hipMalloc`
//! is a separate copy there too.
//!
//! # Large copies always go through the ring
//!
//! Direct copies of large tensors from pageable (mapped) memory are what
//! hung the seed engine on ROCm; the staging ring of pinned buffers
//! (`hipHostMalloc`, through [`Backend::allocate_pinned`]) ended it. So
//! `seam load` refuses `VT_PINNED_H2D_MIB=0` on ROCm: the CLI checks
//! [`REQUIRES_STAGING_RING`]. Small tensors below the ring's direct
//! threshold may still be copied directly, as the brief allows.
//!
//! **Architecture Invariant:** this crate knows the seam and HIP, nothing
//! else.

use std::any::Any;
use std::ffi::c_void;
use std::fmt;

use seam::platform::{
    Backend, DeviceBuffer, DeviceError, DeviceId, NativeQueue, PinnedBuffer, Platform, Queue,
    ResidencyPolicy, StageCounters, StagingCopy,
};

pub mod probe;
pub mod result;
pub mod sys;

use probe::{DevicePolicy, DeviceProbe};
use result::HipError;
use sys::{Hip, HipStream, LoadError};

/// Whether loads onto this platform must stage large copies through the
/// pinned ring: always. `seam load --device rocm` refuses a policy that
/// disables the ring (`VT_PINNED_H2D_MIB=0`).
pub const REQUIRES_STAGING_RING: bool = true;

/// The names and paths searched for the HIP runtime, in order.
pub fn library_candidates() -> Vec<String> {
    sys::LIBRARY_CANDIDATES
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// Whether the HIP runtime can be loaded (searched once per process).
pub fn library_present() -> bool {
    sys::library().is_ok()
}

/// The candidate the HIP runtime was loaded from, if it was.
pub fn library_path() -> Option<&'static str> {
    sys::library().ok().map(Hip::path)
}

/// A HIP runtime version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct RuntimeVersion {
    /// Major (6 for ROCm 6.x).
    pub major: i32,
    /// Minor.
    pub minor: i32,
    /// Patch (HIP's build number, such as 41133).
    pub patch: i32,
}

impl RuntimeVersion {
    /// Decodes `hipRuntimeGetVersion`'s
    /// `major * 10_000_000 + minor * 100_000 + patch`.
    pub fn from_hip(version: i32) -> RuntimeVersion {
        RuntimeVersion {
            major: version / 10_000_000,
            minor: version / 100_000 % 100,
            patch: version % 100_000,
        }
    }
}

impl fmt::Display for RuntimeVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

fn unavailable(e: HipError) -> DeviceError {
    DeviceError::Unavailable(e.to_string())
}

fn failed(e: HipError) -> DeviceError {
    DeviceError::CopyFailed(e.to_string())
}

/// An allocation's error: out of memory by its code, else a failure.
fn allocation_error(e: HipError, bytes: u64) -> DeviceError {
    if e.is_out_of_memory() {
        DeviceError::OutOfMemory { bytes }
    } else {
        failed(e)
    }
}

/// Refuses runtimes whose attribute numbering is not the one in [`sys`].
fn check_runtime_version(version: i32) -> Result<RuntimeVersion, DeviceError> {
    let v = RuntimeVersion::from_hip(version);
    if version < sys::MIN_RUNTIME_VERSION {
        return Err(DeviceError::Unavailable(format!(
            "HIP runtime {v} is older than 5.0, whose device attribute numbering this platform uses"
        )));
    }
    Ok(v)
}

/// The loaded runtime, checked to be new enough.
fn runtime_from(
    loaded: Result<&'static Hip, &LoadError>,
) -> Result<(&'static Hip, RuntimeVersion), DeviceError> {
    let hip = loaded.map_err(|e| DeviceError::Unavailable(e.to_string()))?;
    let version = result::runtime_version(hip).map_err(unavailable)?;
    Ok((hip, check_runtime_version(version)?))
}

/// The HIP runtime's version.
///
/// # Errors
///
/// The library is absent, or the runtime is older than HIP 5.0.
pub fn runtime_version() -> Result<RuntimeVersion, DeviceError> {
    runtime_from(sys::library()).map(|(_, v)| v)
}

/// Initializes the runtime and counts devices; a runtime that finds none
/// (`hipErrorNoDevice`) counts zero.
fn count_from(
    loaded: Result<&'static Hip, &LoadError>,
) -> Result<(&'static Hip, i32), DeviceError> {
    let (hip, _) = runtime_from(loaded)?;
    match result::init(hip).and_then(|()| result::device_count(hip)) {
        Ok(n) => Ok((hip, n)),
        Err(e) if e.is_no_device() => Ok((hip, 0)),
        Err(e) => Err(unavailable(e)),
    }
}

/// The number of HIP devices.
///
/// # Errors
///
/// The library is absent, too old, or the runtime fails to initialize.
pub fn device_count() -> Result<i32, DeviceError> {
    count_from(sys::library()).map(|(_, n)| n)
}

/// One device of the loaded runtime, made current on the calling thread
/// before each call.
#[derive(Clone, Copy)]
struct Device {
    hip: &'static Hip,
    ordinal: i32,
}

impl Device {
    fn bind(&self) -> Result<(), HipError> {
        result::set_device(self.hip, self.ordinal)
    }
}

/// Device memory (`hipMalloc`).
pub struct RocmBuffer {
    ptr: *mut c_void,
    len: u64,
    device: Device,
}

// SAFETY: `ptr` is a device address the host never dereferences; it is
// only passed to HIP calls, which may come from any thread once the device
// is made current there (every call through `Device::bind` does).
unsafe impl Send for RocmBuffer {}
// SAFETY: as above; shared access only reads the address and length.
unsafe impl Sync for RocmBuffer {}

impl DeviceBuffer for RocmBuffer {
    fn len(&self) -> u64 {
        self.len
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl RocmBuffer {
    /// The device address.
    pub fn device_ptr(&self) -> u64 {
        self.ptr.addr() as u64
    }
}

impl Drop for RocmBuffer {
    fn drop(&mut self) {
        if !self.ptr.is_null() && self.device.bind().is_ok() {
            // SAFETY: `ptr` came from hipMalloc on this device and is freed
            // once, here; queued copies into it completed before the seam
            // handed the buffer out (and hipFree waits for the device).
            let _ = unsafe { result::free(self.device.hip, self.ptr) };
        }
    }
}

/// A HIP stream (non-blocking).
pub struct RocmQueue {
    stream: HipStream,
    device: Device,
}

// SAFETY: a stream handle may be used from any thread with its device
// current; the runtime orders the work queued on it.
unsafe impl Send for RocmQueue {}
// SAFETY: as above; HIP's stream calls are thread-safe.
unsafe impl Sync for RocmQueue {}

impl Queue for RocmQueue {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn native(&self) -> Option<NativeQueue> {
        Some(NativeQueue {
            api: "hip",
            handle: self.stream as usize,
        })
    }
}

impl Drop for RocmQueue {
    fn drop(&mut self) {
        if self.device.bind().is_ok() {
            // SAFETY: the stream was created on this device and is destroyed
            // once, here, after its pending work is waited for.
            unsafe {
                let _ = result::stream_synchronize(self.device.hip, self.stream);
                let _ = result::stream_destroy(self.device.hip, self.stream);
            }
        }
    }
}

/// Page-locked host memory (`hipHostMalloc`), for the staging ring.
pub struct RocmPinned {
    ptr: *mut u8,
    len: usize,
    device: Device,
}

// SAFETY: the buffer is owned exclusively by this value; the pointer is only
// dereferenced through `&self`/`&mut self`.
unsafe impl Send for RocmPinned {}
// SAFETY: shared access only reads (`as_slice`).
unsafe impl Sync for RocmPinned {}

impl PinnedBuffer for RocmPinned {
    fn as_mut_slice(&mut self) -> &mut [u8] {
        if self.ptr.is_null() {
            return &mut [];
        }
        // SAFETY: `ptr` points to `len` bytes from hipHostMalloc, alive until
        // `Drop`; `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
    fn as_slice(&self) -> &[u8] {
        if self.ptr.is_null() {
            return &[];
        }
        // SAFETY: as above, shared.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for RocmPinned {
    fn drop(&mut self) {
        if !self.ptr.is_null() && self.device.bind().is_ok() {
            // SAFETY: allocated by hipHostMalloc, freed once, here; no slice
            // outlives `self`, and the ring synchronizes a buffer's copies
            // before dropping it (hipHostFree also waits for the device).
            let _ = unsafe { result::host_free(self.device.hip, self.ptr.cast()) };
        }
    }
}

/// An AMD GPU's memory operations.
pub struct RocmBackend {
    device: Device,
    probe: DeviceProbe,
    policy: DevicePolicy,
}

impl RocmBackend {
    fn own_buffer<'a>(&self, buf: &'a dyn DeviceBuffer) -> Result<&'a RocmBuffer, DeviceError> {
        let buf = buf
            .as_any()
            .downcast_ref::<RocmBuffer>()
            .ok_or_else(|| DeviceError::Misuse("not a ROCm buffer".into()))?;
        if buf.device.ordinal != self.device.ordinal {
            return Err(DeviceError::Misuse(format!(
                "a buffer of rocm:{} used on rocm:{}",
                buf.device.ordinal, self.device.ordinal
            )));
        }
        Ok(buf)
    }

    fn own_queue<'a>(&self, queue: &'a dyn Queue) -> Result<&'a RocmQueue, DeviceError> {
        let queue = queue
            .as_any()
            .downcast_ref::<RocmQueue>()
            .ok_or_else(|| DeviceError::Misuse("not a ROCm stream".into()))?;
        if queue.device.ordinal != self.device.ordinal {
            return Err(DeviceError::Misuse(format!(
                "a stream of rocm:{} used on rocm:{}",
                queue.device.ordinal, self.device.ordinal
            )));
        }
        Ok(queue)
    }
}

/// `[offset, offset + len)` must lie inside a buffer of `size` bytes.
fn check_range(offset: u64, len: usize, size: u64) -> Result<(), DeviceError> {
    match offset.checked_add(len as u64) {
        Some(end) if end <= size => Ok(()),
        _ => Err(DeviceError::Misuse(format!(
            "range [{offset}, +{len}) outside a buffer of {size} bytes"
        ))),
    }
}

/// The device address `offset` bytes into `buf` (checked to fit by
/// [`check_range`], so `offset` fits the host's address width: the buffer's
/// length came from a `usize`).
fn at(buf: &RocmBuffer, offset: u64) -> *mut c_void {
    buf.ptr.cast::<u8>().wrapping_add(offset as usize).cast()
}

impl Backend for RocmBackend {
    fn name(&self) -> String {
        format!("rocm:{}", self.device.ordinal)
    }

    fn allocate(&self, len: u64) -> Result<Box<dyn DeviceBuffer>, DeviceError> {
        let n = usize::try_from(len).map_err(|_| DeviceError::OutOfMemory { bytes: len })?;
        let ptr = if n == 0 {
            std::ptr::null_mut()
        } else {
            self.device.bind().map_err(failed)?;
            let ptr = result::malloc(self.device.hip, n).map_err(|e| allocation_error(e, len))?;
            if ptr.is_null() {
                return Err(DeviceError::CopyFailed(format!(
                    "hipMalloc({n}) returned null"
                )));
            }
            ptr
        };
        Ok(Box::new(RocmBuffer {
            ptr,
            len,
            device: self.device,
        }))
    }

    fn create_queue(&self) -> Result<Box<dyn Queue>, DeviceError> {
        self.device.bind().map_err(failed)?;
        let stream = result::stream_create_non_blocking(self.device.hip).map_err(failed)?;
        Ok(Box::new(RocmQueue {
            stream,
            device: self.device,
        }))
    }

    fn copy_to_device_async(&self, copy: StagingCopy<'_>) -> Result<(), DeviceError> {
        let (src, dst, dst_offset) = (copy.src(), copy.dst(), copy.dst_offset());
        let queue = copy.queue();
        let buf = self.own_buffer(dst)?;
        let queue = self.own_queue(queue)?;
        check_range(dst_offset, src.len(), buf.len)?;
        if src.is_empty() {
            return Ok(());
        }
        self.device.bind().map_err(failed)?;
        // SAFETY: the range lies inside `buf`, a live allocation of this
        // device (checked); the stream is alive (owned by `queue`); the
        // seam keeps `src` alive and unchanged until the stream is
        // synchronized (the contract of `StagingCopy`, which only the seam
        // can make).
        unsafe {
            result::memcpy_htod_async(self.device.hip, at(buf, dst_offset), src, queue.stream)
        }
        .map_err(failed)
    }

    fn synchronize(&self, queue: &dyn Queue) -> Result<(), DeviceError> {
        let queue = self.own_queue(queue)?;
        self.device.bind().map_err(failed)?;
        // SAFETY: the stream is alive: `queue` owns it and destroys it only
        // in `Drop`.
        unsafe { result::stream_synchronize(self.device.hip, queue.stream) }.map_err(failed)
    }

    fn read_back(
        &self,
        src: &dyn DeviceBuffer,
        src_offset: u64,
        dst: &mut [u8],
    ) -> Result<(), DeviceError> {
        let buf = self.own_buffer(src)?;
        check_range(src_offset, dst.len(), buf.len)?;
        if dst.is_empty() {
            return Ok(());
        }
        self.device.bind().map_err(failed)?;
        // SAFETY: the range lies inside `buf`, a live allocation of this
        // device (checked); the copy is synchronous, so `dst` is written only
        // during the call.
        unsafe { result::memcpy_dtoh(self.device.hip, dst, at(buf, src_offset)) }.map_err(failed)
    }

    fn allocate_pinned(&self, len: usize) -> Result<Option<Box<dyn PinnedBuffer>>, DeviceError> {
        let ptr = if len == 0 {
            std::ptr::null_mut()
        } else {
            self.device.bind().map_err(failed)?;
            let ptr = result::host_malloc(self.device.hip, len)
                .map_err(|e| allocation_error(e, len as u64))?;
            if ptr.is_null() {
                return Err(DeviceError::CopyFailed(format!(
                    "hipHostMalloc({len}) returned null"
                )));
            }
            ptr
        };
        Ok(Some(Box::new(RocmPinned {
            ptr: ptr.cast(),
            len,
            device: self.device,
        })))
    }

    fn device_memory_is_host_addressable(&self) -> bool {
        self.policy.device_memory_is_host_addressable
    }
}

/// An AMD GPU as a seam platform.
pub struct RocmPlatform {
    backend: RocmBackend,
    id: DeviceId,
    counters: StageCounters,
}

/// Opens device `ordinal` of the runtime `loaded` (the process's, or an
/// error standing in for it in tests).
fn open_from(
    loaded: Result<&'static Hip, &LoadError>,
    ordinal: i32,
) -> Result<RocmPlatform, DeviceError> {
    let (hip, count) = count_from(loaded)?;
    if ordinal < 0 || ordinal >= count {
        return Err(DeviceError::Unavailable(format!(
            "rocm:{ordinal}: no such device ({count} ROCm device(s) present)"
        )));
    }
    let device = Device { hip, ordinal };
    device.bind().map_err(unavailable)?;
    let (free, total) = result::mem_get_info(hip).map_err(unavailable)?;
    let attribute =
        |attribute| result::device_attribute(hip, attribute, ordinal).map_err(unavailable);
    let probe = DeviceProbe {
        ordinal,
        name: result::device_name(hip, ordinal).unwrap_or_else(|_| "unknown".into()),
        total_bytes: total as u64,
        free_bytes: free as u64,
        pageable_memory_access: attribute(sys::HIP_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS)? != 0,
        integrated: attribute(sys::HIP_DEVICE_ATTRIBUTE_INTEGRATED)? != 0,
    };
    let policy = DevicePolicy::from_probe(&probe);
    Ok(RocmPlatform {
        backend: RocmBackend {
            device,
            probe,
            policy,
        },
        id: DeviceId::fresh(),
        counters: StageCounters::default(),
    })
}

impl RocmPlatform {
    /// Opens device `ordinal`: loads the HIP runtime (once per process),
    /// initializes it and probes the device.
    ///
    /// # Errors
    ///
    /// `Unavailable` with the reason: the library absent (naming every
    /// candidate searched), a runtime older than HIP 5.0, `hipInit` failing,
    /// no such device, or a HIP error while probing.
    pub fn open(ordinal: i32) -> Result<RocmPlatform, DeviceError> {
        open_from(sys::library(), ordinal)
    }

    /// What the device reported.
    pub fn probe(&self) -> &DeviceProbe {
        &self.backend.probe
    }

    /// The policy derived from the probe.
    pub fn device_policy(&self) -> DevicePolicy {
        self.backend.policy
    }
}

impl Platform for RocmPlatform {
    fn backend(&self) -> &dyn Backend {
        &self.backend
    }
    fn device_id(&self) -> DeviceId {
        self.id
    }
    fn needs_weight_staging(&self) -> bool {
        self.backend.policy.needs_weight_staging
    }
    fn host_memory_is_device_addressable(&self) -> bool {
        self.backend.policy.host_memory_is_device_addressable
    }
    fn residency_policy(&self) -> ResidencyPolicy {
        self.backend.policy.residency_policy()
    }
    fn stage_counters(&self) -> &StageCounters {
        &self.counters
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn unavailable_reason<T>(r: Result<T, DeviceError>) -> String {
        match r {
            Err(DeviceError::Unavailable(why)) => why,
            Err(other) => panic!("expected Unavailable, got {other:?}"),
            Ok(_) => panic!("expected Unavailable, got Ok"),
        }
    }

    fn bogus_library() -> LoadError {
        sys::load_from(&[
            "/nonexistent/seam-rocm/libamdhip64.so",
            "libseam-rocm-absent.so.6",
        ])
        .err()
        .expect("bogus paths cannot load")
    }

    /// Without the runtime, opening and counting answer `Unavailable`
    /// naming every path searched, whatever machine runs the test.
    #[test]
    fn an_absent_library_makes_every_entry_point_unavailable() {
        let err = bogus_library();
        for why in [
            unavailable_reason(open_from(Err(&err), 0)),
            unavailable_reason(open_from(Err(&err), -1)),
            unavailable_reason(count_from(Err(&err))),
            unavailable_reason(runtime_from(Err(&err))),
        ] {
            assert!(why.contains("HIP runtime (libamdhip64) not found"), "{why}");
            assert!(
                why.contains("/nonexistent/seam-rocm/libamdhip64.so"),
                "{why}"
            );
            assert!(why.contains("libseam-rocm-absent.so.6"), "{why}");
        }
    }

    /// The process's own search: on a machine without ROCm (CI, this
    /// development machine) opening fails naming every candidate; with ROCm
    /// it opens or names the runtime's reason. Never a panic.
    #[test]
    fn open_never_panics_and_names_why() {
        assert_eq!(library_present(), sys::library().is_ok());
        assert_eq!(library_present(), library_path().is_some());
        match RocmPlatform::open(0) {
            Ok(p) => {
                assert!(p.probe().total_bytes > 0);
                assert_eq!(p.backend().name(), "rocm:0");
                assert!(p.needs_weight_staging());
                // An engine orders its kernels after staging on this stream.
                let queue = p.backend().create_queue().unwrap();
                let native = queue.native().expect("a HIP queue has its stream");
                assert_eq!(native.api, "hip");
                let own = queue.as_any().downcast_ref::<RocmQueue>().unwrap();
                assert_eq!(native.handle, own.stream as usize);
            }
            Err(DeviceError::Unavailable(why)) => {
                if !library_present() {
                    for candidate in library_candidates() {
                        assert!(why.contains(&candidate), "{candidate} not named in {why}");
                    }
                }
            }
            Err(other) => panic!("unexpected error {other:?}"),
        }
        let why = unavailable_reason(RocmPlatform::open(-1));
        assert!(!why.is_empty());
        if !library_present() {
            assert!(unavailable_reason(device_count()).contains("not found"));
            assert!(unavailable_reason(runtime_version()).contains("/opt/rocm/lib/libamdhip64.so"));
        }
    }

    #[test]
    fn candidates_are_the_documented_names() {
        assert_eq!(
            library_candidates(),
            [
                "libamdhip64.so",
                "libamdhip64.so.7",
                "libamdhip64.so.6",
                "libamdhip64.so.5",
                "/opt/rocm/lib/libamdhip64.so",
            ]
        );
    }

    #[test]
    fn runtimes_older_than_hip_5_are_refused() {
        // HIP 4.5 numbered the attributes differently.
        let why = unavailable_reason(check_runtime_version(40_521_432));
        assert!(
            why.contains("4.5.21432") && why.contains("older than 5.0"),
            "{why}"
        );
        assert_eq!(
            check_runtime_version(50_013_601),
            Ok(RuntimeVersion {
                major: 5,
                minor: 0,
                patch: 13601
            })
        );
        assert_eq!(
            check_runtime_version(60_241_133).map(|v| v.to_string()),
            Ok("6.2.41133".into())
        );
        assert_eq!(
            check_runtime_version(70_051_831).map(|v| v.to_string()),
            Ok("7.0.51831".into())
        );
    }

    #[test]
    fn ranges_outside_a_buffer_are_misuse() {
        assert_eq!(check_range(0, 16, 16), Ok(()));
        assert_eq!(check_range(16, 0, 16), Ok(()));
        assert!(matches!(
            check_range(1, 16, 16),
            Err(DeviceError::Misuse(_))
        ));
        assert!(matches!(
            check_range(u64::MAX, 1, 16),
            Err(DeviceError::Misuse(_))
        ));
    }

    #[test]
    fn out_of_memory_is_told_apart_from_other_failures() {
        let error = |code| HipError {
            call: "hipMalloc",
            code,
            message: "m".into(),
        };
        assert_eq!(
            allocation_error(error(sys::HIP_ERROR_OUT_OF_MEMORY), 7),
            DeviceError::OutOfMemory { bytes: 7 }
        );
        assert_eq!(
            allocation_error(error(1), 7),
            DeviceError::CopyFailed("hipMalloc: m (hipError_t 1)".into())
        );
    }
}
