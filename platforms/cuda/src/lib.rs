//! NVIDIA GPUs as a seam platform.
//!
//! Layers, as in cudarc: cudarc's `sys` (libcuda loaded at run time, so the
//! workspace builds and tests with no CUDA installed) and `result` (checked
//! calls), then this crate's owning types (device buffers, streams, pinned
//! host buffers, each freed in `Drop`) behind the seam's `Backend` and
//! `Platform` traits.
//!
//! Opening a device never panics: cudarc's loader panics when libcuda is
//! missing, so [`CudaPlatform::open`] checks for the library first and
//! answers `DeviceError::Unavailable` naming what it searched.
//!
//! The policy comes from the device's own attributes ([`probe`]): pageable
//! memory access decides; the integrated flag is reported, and decides
//! nothing (a `cuMemAlloc` allocation is a separate copy on Jetson parts
//! too); never from its name.
//!
//! **Architecture Invariant:** this crate knows the seam and CUDA, nothing
//! else.

use std::any::Any;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::result;
use cudarc::driver::sys;
use seam::platform::{
    Backend, DeviceBuffer, DeviceError, DeviceId, HostRegistration, NativeQueue, PinnedBuffer,
    Platform, Queue, ResidencyPolicy, StageCounters, StagingCopy, TransferCaps, buffer_range,
};

pub mod nccl;
pub mod ops;
pub mod probe;
pub mod tensor_parallel;

use probe::{DevicePolicy, DeviceProbe};

fn driver_error(what: &str, e: result::DriverError) -> DeviceError {
    let text = e
        .error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{e:?}"));
    DeviceError::CopyFailed(format!("{what}: {text}"))
}

/// The library names cudarc searches for libcuda.
pub fn library_candidates() -> Vec<String> {
    cudarc::get_lib_name_candidates("cuda")
}

/// Whether libcuda can be loaded.
pub fn library_present() -> bool {
    // SAFETY: this only tries to dlopen the candidate names; it calls
    // nothing in the library.
    unsafe { sys::is_culib_present() }
}

/// A primary context, made current on each thread before any call.
struct Context {
    ctx: sys::CUcontext,
    device: sys::CUdevice,
}

// SAFETY: a CUDA context handle may be used from any thread once made
// current there; every call through `Context` makes it current first.
unsafe impl Send for Context {}
// SAFETY: as above; the driver synchronizes access to a context itself.
unsafe impl Sync for Context {}

impl Context {
    fn bind(&self) -> Result<(), DeviceError> {
        // SAFETY: `ctx` is the primary context retained in `open` and
        // released only in `Drop`, so it is valid here.
        unsafe { result::ctx::set_current(self.ctx) }
            .map_err(|e| driver_error("cuCtxSetCurrent", e))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: `device` came from `device::get`, and its primary context
        // was retained once in `open`.
        let _ = unsafe { result::primary_ctx::release(self.device) };
    }
}

/// Device memory.
pub struct CudaBuffer {
    ptr: sys::CUdeviceptr,
    len: u64,
    ctx: Arc<Context>,
}

impl DeviceBuffer for CudaBuffer {
    fn len(&self) -> u64 {
        self.len
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl CudaBuffer {
    /// The device address.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }
}

impl Drop for CudaBuffer {
    fn drop(&mut self) {
        if self.len > 0 && self.ctx.bind().is_ok() {
            // SAFETY: `ptr` was returned by cuMemAlloc in this context and is
            // freed once, here; queued copies into it completed before the
            // seam handed the buffer out.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// A CUDA stream.
pub struct CudaQueue {
    stream: sys::CUstream,
    ctx: Arc<Context>,
}

// SAFETY: a stream handle may be used from any thread with its context
// current; the driver orders work on it.
unsafe impl Send for CudaQueue {}
// SAFETY: as above.
unsafe impl Sync for CudaQueue {}

impl Queue for CudaQueue {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn native(&self) -> Option<NativeQueue> {
        Some(NativeQueue {
            api: "cuda",
            handle: self.stream as usize,
        })
    }
}

impl Drop for CudaQueue {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: the stream was created in this context; pending work
            // is waited for before it is destroyed.
            unsafe {
                let _ = result::stream::synchronize(self.stream);
                let _ = result::stream::destroy(self.stream);
            }
        }
    }
}

/// Page-locked host memory (`cuMemAllocHost`).
pub struct CudaPinned {
    ptr: *mut u8,
    len: usize,
    ctx: Arc<Context>,
}

// SAFETY: the buffer is owned exclusively by this value; the pointer is only
// dereferenced through `&self`/`&mut self`.
unsafe impl Send for CudaPinned {}
// SAFETY: shared access only reads (`as_slice`).
unsafe impl Sync for CudaPinned {}

impl PinnedBuffer for CudaPinned {
    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` points to `len` bytes allocated by cuMemAllocHost,
        // alive until `Drop`; `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
    fn as_slice(&self) -> &[u8] {
        // SAFETY: as above, shared.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for CudaPinned {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: allocated by cuMemAllocHost in this context, freed once.
            let _ = unsafe { result::free_host(self.ptr.cast::<c_void>()) };
        }
    }
}

/// A range of host memory page-locked with `cuMemHostRegister`
/// (read-only), unregistered when dropped.
struct CudaRegistration {
    ptr: *mut c_void,
    len: usize,
    ctx: Arc<Context>,
}

// SAFETY: the registration only holds the address to unregister; the
// driver's unregistration may be called from any thread with the context
// current.
unsafe impl Send for CudaRegistration {}
// SAFETY: shared access reads only `len`.
unsafe impl Sync for CudaRegistration {}

impl HostRegistration for CudaRegistration {
    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for CudaRegistration {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: `ptr` was registered in this context by
            // `register_host` and is unregistered once, here; the seam drops
            // a registration only after the copies reading it completed.
            let _ = unsafe { sys::cuMemHostUnregister(self.ptr) };
        }
    }
}

/// A CUDA device's memory operations.
pub struct CudaBackend {
    ctx: Arc<Context>,
    probe: DeviceProbe,
    policy: DevicePolicy,
}

fn cuda_buffer(buf: &dyn DeviceBuffer) -> Result<&CudaBuffer, DeviceError> {
    buf.as_any()
        .downcast_ref::<CudaBuffer>()
        .ok_or_else(|| DeviceError::Misuse("not a CUDA buffer".into()))
}

fn cuda_queue(queue: &dyn Queue) -> Result<&CudaQueue, DeviceError> {
    queue
        .as_any()
        .downcast_ref::<CudaQueue>()
        .ok_or_else(|| DeviceError::Misuse("not a CUDA stream".into()))
}

impl Backend for CudaBackend {
    fn name(&self) -> String {
        format!("cuda:{}", self.probe.ordinal)
    }

    fn allocate(&self, len: u64) -> Result<Box<dyn DeviceBuffer>, DeviceError> {
        self.ctx.bind()?;
        let ptr = if len == 0 {
            0
        } else {
            let n = usize::try_from(len).map_err(|_| DeviceError::OutOfMemory { bytes: len })?;
            // SAFETY: the context is current; the allocation is freed in
            // `CudaBuffer::drop`.
            unsafe { result::malloc_sync(n) }.map_err(|e| match e.0 {
                sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY => {
                    DeviceError::OutOfMemory { bytes: len }
                }
                _ => driver_error("cuMemAlloc", e),
            })?
        };
        Ok(Box::new(CudaBuffer {
            ptr,
            len,
            ctx: Arc::clone(&self.ctx),
        }))
    }

    fn create_queue(&self) -> Result<Box<dyn Queue>, DeviceError> {
        self.ctx.bind()?;
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(|e| driver_error("cuStreamCreate", e))?;
        Ok(Box::new(CudaQueue {
            stream,
            ctx: Arc::clone(&self.ctx),
        }))
    }

    fn copy_to_device_async(&self, copy: StagingCopy<'_>) -> Result<(), DeviceError> {
        let (src, dst, dst_offset) = (copy.src(), copy.dst(), copy.dst_offset());
        let queue = copy.queue();
        let buf = cuda_buffer(dst)?;
        let queue = cuda_queue(queue)?;
        buffer_range(dst_offset, src.len(), buf.len)?;
        if src.is_empty() {
            return Ok(());
        }
        self.ctx.bind()?;
        // SAFETY: the range lies inside `buf` (checked); the seam keeps
        // `src` alive and unchanged until the stream is synchronized (the
        // contract of `StagingCopy`, which only the seam can make).
        unsafe { result::memcpy_htod_async(buf.ptr + dst_offset, src, queue.stream) }
            .map_err(|e| driver_error("cuMemcpyHtoDAsync", e))
    }

    fn synchronize(&self, queue: &dyn Queue) -> Result<(), DeviceError> {
        let queue = cuda_queue(queue)?;
        self.ctx.bind()?;
        // SAFETY: the stream was created in this context and is alive.
        unsafe { result::stream::synchronize(queue.stream) }
            .map_err(|e| driver_error("cuStreamSynchronize", e))
    }

    fn read_back(
        &self,
        src: &dyn DeviceBuffer,
        src_offset: u64,
        dst: &mut [u8],
    ) -> Result<(), DeviceError> {
        let buf = cuda_buffer(src)?;
        buffer_range(src_offset, dst.len(), buf.len)?;
        if dst.is_empty() {
            return Ok(());
        }
        self.ctx.bind()?;
        // SAFETY: the range lies inside `buf` (checked); the copy is
        // synchronous, so `dst` is only written during the call.
        unsafe { result::memcpy_dtoh_sync(dst, buf.ptr + src_offset) }
            .map_err(|e| driver_error("cuMemcpyDtoH", e))
    }

    fn allocate_pinned(&self, len: usize) -> Result<Option<Box<dyn PinnedBuffer>>, DeviceError> {
        self.ctx.bind()?;
        // SAFETY: the context is current; freed in `CudaPinned::drop`.
        let ptr = unsafe { result::malloc_host(len, 0) }
            .map_err(|e| driver_error("cuMemAllocHost", e))?;
        Ok(Some(Box::new(CudaPinned {
            ptr: ptr.cast::<u8>(),
            len,
            ctx: Arc::clone(&self.ctx),
        })))
    }

    fn device_memory_is_host_addressable(&self) -> bool {
        self.policy.device_memory_is_host_addressable
    }

    /// A discrete device (weights staged, not integrated) copies pinned
    /// memory by DMA; any staging device can register host memory.
    fn transfer_caps(&self) -> TransferCaps {
        TransferCaps {
            pinned_dma: self.policy.needs_weight_staging && !self.probe.integrated,
            register_host: self.policy.needs_weight_staging,
        }
    }

    fn register_host(&self, bytes: &[u8]) -> Result<Box<dyn HostRegistration>, DeviceError> {
        if bytes.is_empty() {
            return Err(DeviceError::Misuse("registering no bytes".into()));
        }
        self.ctx.bind()?;
        let ptr = bytes.as_ptr().cast_mut().cast::<c_void>();
        // SAFETY: `bytes` is a live range of a read-only file mapping that
        // the seam keeps mapped and unchanged until the registration is
        // dropped; READ_ONLY asks the driver for no write access to it.
        unsafe { sys::cuMemHostRegister_v2(ptr, bytes.len(), sys::CU_MEMHOSTREGISTER_READ_ONLY) }
            .result()
            .map_err(|e| driver_error("cuMemHostRegister(READ_ONLY)", e))?;
        Ok(Box::new(CudaRegistration {
            ptr,
            len: bytes.len(),
            ctx: Arc::clone(&self.ctx),
        }))
    }
}

/// A CUDA device as a seam platform.
pub struct CudaPlatform {
    backend: CudaBackend,
    id: DeviceId,
    counters: StageCounters,
}

fn unavailable(what: &str, e: result::DriverError) -> DeviceError {
    match driver_error(what, e) {
        DeviceError::CopyFailed(msg) => DeviceError::Unavailable(msg),
        other => other,
    }
}

/// Initializes the driver; `Unavailable` naming the searched library names
/// when libcuda is absent.
fn init_driver() -> Result<(), DeviceError> {
    if !library_present() {
        return Err(DeviceError::Unavailable(format!(
            "libcuda not found (searched {})",
            library_candidates().join(", ")
        )));
    }
    result::init().map_err(|e| unavailable("cuInit", e))
}

/// The number of CUDA devices.
///
/// # Errors
///
/// libcuda is absent or the driver fails to initialize.
pub fn device_count() -> Result<i32, DeviceError> {
    init_driver()?;
    result::device::get_count().map_err(|e| unavailable("cuDeviceGetCount", e))
}

fn attribute(device: sys::CUdevice, attr: sys::CUdevice_attribute) -> Result<i32, DeviceError> {
    // SAFETY: `device` came from `device::get`.
    unsafe { result::device::get_attribute(device, attr) }
        .map_err(|e| unavailable("cuDeviceGetAttribute", e))
}

impl CudaPlatform {
    /// Opens device `ordinal`: loads libcuda, retains the primary context and
    /// probes the device.
    ///
    /// # Errors
    ///
    /// `Unavailable` with the reason: no library, no such device, a driver
    /// error.
    pub fn open(ordinal: i32) -> Result<CudaPlatform, DeviceError> {
        let count = device_count()?;
        if ordinal < 0 || ordinal >= count {
            return Err(DeviceError::Unavailable(format!(
                "cuda:{ordinal}: no such device ({count} CUDA device(s) present)"
            )));
        }
        let device = result::device::get(ordinal).map_err(|e| unavailable("cuDeviceGet", e))?;
        // SAFETY: `device` came from `device::get`; released in `Context::drop`.
        let ctx = unsafe { result::primary_ctx::retain(device) }
            .map_err(|e| unavailable("cuDevicePrimaryCtxRetain", e))?;
        let ctx = Arc::new(Context { ctx, device });
        ctx.bind()?;
        let (free, total) = result::mem_get_info().map_err(|e| unavailable("cuMemGetInfo", e))?;
        let probe = DeviceProbe {
            ordinal,
            name: result::device::get_name(device).unwrap_or_else(|_| "unknown".into()),
            total_bytes: total as u64,
            free_bytes: free as u64,
            pageable_memory_access: attribute(
                device,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS,
            )? != 0,
            integrated: attribute(
                device,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_INTEGRATED,
            )? != 0,
        };
        let policy = DevicePolicy::from_probe(&probe);
        Ok(CudaPlatform {
            backend: CudaBackend { ctx, probe, policy },
            id: DeviceId::fresh(),
            counters: StageCounters::default(),
        })
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

impl Platform for CudaPlatform {
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

    /// On a machine without libcuda (CI), opening fails with a reason
    /// naming the searched libraries instead of panicking; with libcuda it
    /// either opens or names the driver's reason.
    #[test]
    fn open_never_panics_and_names_why() {
        match CudaPlatform::open(0) {
            Ok(p) => {
                assert!(p.probe().total_bytes > 0);
                // An engine orders its kernels after staging on this stream.
                let queue = p.backend().create_queue().unwrap();
                let native = queue.native().expect("a CUDA queue has its stream");
                assert_eq!(native.api, "cuda");
                let own = queue.as_any().downcast_ref::<CudaQueue>().unwrap();
                assert_eq!(native.handle, own.stream as usize);
                assert_ne!(native.handle, 0, "a created stream, not the default");
            }
            Err(DeviceError::Unavailable(why)) => {
                if !library_present() {
                    assert!(why.contains("libcuda not found"), "{why}");
                    assert!(why.contains("libcuda.so"), "{why}");
                }
            }
            Err(other) => panic!("unexpected error {other:?}"),
        }
        match CudaPlatform::open(-1) {
            Err(DeviceError::Unavailable(_)) => {}
            other => panic!(
                "ordinal -1 must be unavailable, got {:?}",
                other.map(|_| ())
            ),
        }
    }
}
