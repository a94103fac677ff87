//! Device memory for the op layer's outputs and scratch, reused instead of
//! freed: `cuMemAlloc` costs tens of microseconds and `cuMemFree` waits for
//! the whole device, so an allocation per op output (thousands per decode
//! step) made the GPU wait on the host after every op.
//!
//! Every buffer of a pool is written and read by kernels and copies on ONE
//! stream (its [`CudaOps`](super::CudaOps)' queue), so a buffer handed back
//! while kernels that read it are still queued can be handed out again at
//! once: whatever writes it next is queued after them on the same stream.
//! Sizes repeat from step to step, so buffers are kept by their size rounded
//! up to [`GRANULE`] bytes; beyond [`KEEP_BYTES`] kept a returned buffer is
//! freed instead (a cache grown by doubling leaves its old rooms behind).

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{result, sys};
use seam::platform::{DeviceBuffer, DeviceError};

use crate::{Context, driver_error};

/// Sizes are kept in multiples of this many bytes.
pub(crate) const GRANULE: u64 = 256;
/// At most this many bytes are kept for reuse; a buffer returned past it
/// is freed.
pub(crate) const KEEP_BYTES: u64 = 1 << 30;

/// Freed buffers by rounded size, and their total.
#[derive(Default)]
struct Kept {
    by_size: HashMap<u64, Vec<sys::CUdeviceptr>>,
    bytes: u64,
}

/// The buffers of one op layer.
pub(crate) struct BufferPool {
    ctx: Arc<Context>,
    kept: Mutex<Kept>,
}

impl BufferPool {
    pub(crate) fn new(ctx: Arc<Context>) -> Arc<BufferPool> {
        Arc::new(BufferPool {
            ctx,
            kept: Mutex::new(Kept::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A buffer of `len` bytes (its contents undefined): a kept one of the
    /// same rounded size, else a new allocation.
    pub(crate) fn take(self: &Arc<Self>, len: u64) -> Result<PooledBuffer, DeviceError> {
        let size = len.max(1).div_ceil(GRANULE) * GRANULE;
        let reused = {
            let mut kept = self.lock();
            let ptr = kept.by_size.get_mut(&size).and_then(Vec::pop);
            if ptr.is_some() {
                kept.bytes -= size;
            }
            ptr
        };
        let ptr = match reused {
            Some(p) => p,
            None => {
                self.ctx.bind()?;
                let n =
                    usize::try_from(size).map_err(|_| DeviceError::OutOfMemory { bytes: len })?;
                // SAFETY: the context is current; the allocation is freed
                // once, by `give_back` or the pool's drop.
                unsafe { result::malloc_sync(n) }.map_err(|e| match e.0 {
                    sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY => {
                        DeviceError::OutOfMemory { bytes: len }
                    }
                    _ => driver_error("cuMemAlloc", e),
                })?
            }
        };
        static SERIAL: AtomicU64 = AtomicU64::new(1);
        Ok(PooledBuffer {
            ptr,
            len,
            size,
            serial: SERIAL.fetch_add(1, Ordering::Relaxed),
            pool: Arc::clone(self),
        })
    }

    /// Keeps `ptr` (of rounded `size`) for reuse, or frees it past the
    /// bound.
    fn give_back(&self, ptr: sys::CUdeviceptr, size: u64) {
        {
            let mut kept = self.lock();
            if kept.bytes + size <= KEEP_BYTES {
                kept.bytes += size;
                kept.by_size.entry(size).or_default().push(ptr);
                return;
            }
        }
        if self.ctx.bind().is_ok() {
            // SAFETY: `ptr` came from cuMemAlloc in this context and is no
            // longer handed out; cuMemFree waits for the work using it.
            let _ = unsafe { result::free_sync(ptr) };
        }
    }

    /// Bytes kept for reuse now.
    pub(crate) fn kept_bytes(&self) -> u64 {
        self.lock().bytes
    }
}

impl Drop for BufferPool {
    fn drop(&mut self) {
        let kept = std::mem::take(&mut *self.lock());
        if self.ctx.bind().is_err() {
            return;
        }
        for ptr in kept.by_size.into_values().flatten() {
            // SAFETY: each kept pointer came from cuMemAlloc in this
            // context and is held by no buffer (the last buffer holding the
            // pool is gone); freed once, here.
            let _ = unsafe { result::free_sync(ptr) };
        }
    }
}

/// A buffer of a [`BufferPool`], handed back to it when dropped.
pub(crate) struct PooledBuffer {
    ptr: sys::CUdeviceptr,
    len: u64,
    size: u64,
    /// Unique in the process for each hand-out, so a buffer handed out
    /// again is never taken for what it held before.
    serial: u64,
    pool: Arc<BufferPool>,
}

impl PooledBuffer {
    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }

    /// This hand-out's serial number.
    pub(crate) fn serial(&self) -> u64 {
        self.serial
    }
}

impl DeviceBuffer for PooledBuffer {
    fn len(&self) -> u64 {
        self.len
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for PooledBuffer {
    fn drop(&mut self) {
        self.pool.give_back(self.ptr, self.size);
    }
}
