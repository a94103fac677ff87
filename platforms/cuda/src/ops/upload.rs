//! Small host-to-device uploads (token ids, positions, masks) without a
//! stream synchronize each: the bytes are copied into a pinned arena and
//! the copy is queued from there, so the host may go on at once (the
//! driver does not say when it has consumed a pageable source, so a copy
//! from pageable memory has to be waited for). The arena is reused from
//! its start only after the stream was synchronized, when every copy
//! queued from it has completed.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{result, sys};
use seam::platform::DeviceError;

use crate::{Context, driver_error};

/// The arena's size: many steps of small uploads between synchronizes.
pub(crate) const ARENA_BYTES: usize = 4 << 20;
/// Offsets in the arena are multiples of this.
const ALIGN: usize = 256;

/// A pinned host arena and how much of it copies queued since the last
/// synchronize use.
pub(crate) struct UploadArena {
    ctx: Arc<Context>,
    base: *mut u8,
    used: usize,
}

// SAFETY: the arena is only reached through the `Mutex` in `CudaOps`; the
// pinned pointer is valid on any thread.
unsafe impl Send for UploadArena {}

impl UploadArena {
    /// A new arena of [`ARENA_BYTES`] pinned bytes.
    pub(crate) fn new(ctx: Arc<Context>) -> Result<UploadArena, DeviceError> {
        ctx.bind()?;
        // SAFETY: the context is current; freed once in `Drop`.
        let base = unsafe { result::malloc_host(ARENA_BYTES, 0) }
            .map_err(|e| driver_error("cuMemAllocHost", e))?;
        Ok(UploadArena {
            ctx,
            base: base.cast::<u8>(),
            used: 0,
        })
    }

    /// Whether `len` bytes fit the arena at all (larger uploads go the
    /// synchronous way).
    pub(crate) fn fits(len: usize) -> bool {
        len <= ARENA_BYTES
    }

    /// Queues the copy of `bytes` to `dst` on `stream` from the arena.
    /// `synchronize` is called first when the arena is full, after which
    /// the whole arena is free again.
    ///
    /// # Safety
    ///
    /// `dst` must hold `bytes.len()` bytes, and `stream` be a live stream
    /// of the arena's context.
    pub(crate) unsafe fn queue_copy(
        &mut self,
        dst: u64,
        bytes: &[u8],
        stream: sys::CUstream,
        synchronize: impl FnOnce() -> Result<(), DeviceError>,
    ) -> Result<(), DeviceError> {
        debug_assert!(Self::fits(bytes.len()));
        if self.used + bytes.len() > ARENA_BYTES {
            synchronize()?;
            self.used = 0;
        }
        // SAFETY: `used + len <= ARENA_BYTES` (checked above, `len` fits),
        // so the destination range lies in the arena; no copy queued since
        // the last synchronize reads this range (offsets only grow until
        // then).
        let staged = unsafe {
            let at = self.base.add(self.used);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), at, bytes.len());
            std::slice::from_raw_parts(at.cast_const(), bytes.len())
        };
        self.ctx.bind()?;
        // SAFETY: `dst` holds `bytes.len()` bytes (the caller's promise);
        // `staged` is pinned and stays untouched until the next
        // synchronize, after which the copy has completed.
        unsafe { result::memcpy_htod_async(dst, staged, stream) }
            .map_err(|e| driver_error("cuMemcpyHtoDAsync", e))?;
        self.used = (self.used + bytes.len()).div_ceil(ALIGN) * ALIGN;
        Ok(())
    }

    /// The stream was synchronized: every queued copy has completed.
    pub(crate) fn synchronized(&mut self) {
        self.used = 0;
    }
}

impl Drop for UploadArena {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: allocated by cuMemAllocHost in `new`, freed once; the
            // op layer synchronizes its stream before dropping the arena.
            let _ = unsafe { result::free_host(self.base.cast::<c_void>()) };
        }
    }
}
