//! The CPU as a seam platform.
//!
//! Kernels read the host bytes of a weight directly: nothing is staged
//! (`needs_weight_staging` is false), so `resident_weight` hands out the
//! borrow itself and nothing is ever released. The backend still implements
//! every memory operation (plain heap memory, synchronous copies) so code
//! that stages explicitly works here too.
//!
//! **Architecture Invariant:** this crate knows the seam and nothing else.

use std::any::Any;
use std::sync::Mutex;

use seam::platform::{
    Backend, DeviceBuffer, DeviceError, DeviceId, Platform, Queue, ResidencyPolicy, StageCounters,
    StagingCopy, buffer_range,
};

/// Host memory as a "device" buffer.
pub struct HostBuffer {
    bytes: Mutex<Vec<u8>>,
}

impl DeviceBuffer for HostBuffer {
    fn len(&self) -> u64 {
        self.bytes.lock().unwrap_or_else(|e| e.into_inner()).len() as u64
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The host's (trivial) queue: copies complete when they are made.
pub struct HostQueue;

impl Queue for HostQueue {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The CPU's memory operations.
#[derive(Debug, Default)]
pub struct HostBackend;

fn host_buffer(buf: &dyn DeviceBuffer) -> Result<&HostBuffer, DeviceError> {
    buf.as_any()
        .downcast_ref::<HostBuffer>()
        .ok_or_else(|| DeviceError::Misuse("not a host buffer".into()))
}

impl Backend for HostBackend {
    fn name(&self) -> String {
        "host".into()
    }

    fn allocate(&self, len: u64) -> Result<Box<dyn DeviceBuffer>, DeviceError> {
        let n = usize::try_from(len).map_err(|_| DeviceError::OutOfMemory { bytes: len })?;
        let mut bytes = Vec::new();
        bytes
            .try_reserve_exact(n)
            .map_err(|_| DeviceError::OutOfMemory { bytes: len })?;
        bytes.resize(n, 0);
        Ok(Box::new(HostBuffer {
            bytes: Mutex::new(bytes),
        }))
    }

    fn create_queue(&self) -> Result<Box<dyn Queue>, DeviceError> {
        Ok(Box::new(HostQueue))
    }

    fn copy_to_device_async(&self, copy: StagingCopy<'_>) -> Result<(), DeviceError> {
        let (src, dst, dst_offset) = (copy.src(), copy.dst(), copy.dst_offset());
        let mut bytes = host_buffer(dst)?
            .bytes
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let r = buffer_range(dst_offset, src.len(), bytes.len() as u64)?;
        bytes[r].copy_from_slice(src);
        Ok(())
    }

    fn synchronize(&self, _queue: &dyn Queue) -> Result<(), DeviceError> {
        Ok(())
    }

    fn read_back(
        &self,
        src: &dyn DeviceBuffer,
        src_offset: u64,
        dst: &mut [u8],
    ) -> Result<(), DeviceError> {
        let bytes = host_buffer(src)?
            .bytes
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let r = buffer_range(src_offset, dst.len(), bytes.len() as u64)?;
        dst.copy_from_slice(&bytes[r]);
        Ok(())
    }

    fn device_memory_is_host_addressable(&self) -> bool {
        true
    }
}

/// The CPU platform.
#[derive(Debug)]
pub struct HostPlatform {
    backend: HostBackend,
    id: DeviceId,
    counters: StageCounters,
}

impl Default for HostPlatform {
    fn default() -> Self {
        HostPlatform::new()
    }
}

impl HostPlatform {
    /// The CPU.
    pub fn new() -> HostPlatform {
        HostPlatform {
            backend: HostBackend,
            id: DeviceId::fresh(),
            counters: StageCounters::default(),
        }
    }
}

impl Platform for HostPlatform {
    fn backend(&self) -> &dyn Backend {
        &self.backend
    }
    fn device_id(&self) -> DeviceId {
        self.id
    }
    fn needs_weight_staging(&self) -> bool {
        false
    }
    fn host_memory_is_device_addressable(&self) -> bool {
        true
    }
    fn residency_policy(&self) -> ResidencyPolicy {
        // Nothing is uploaded, so nothing is released; keep the host copies.
        ResidencyPolicy {
            release_host_weights_after_upload: false,
            drop_page_cache: false,
        }
    }
    fn stage_counters(&self) -> &StageCounters {
        &self.counters
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_and_reads_back_synchronously() {
        let b = HostBackend;
        let q = b.create_queue().unwrap();
        let buf = b.allocate(8).unwrap();
        seam::backend_check::queue_pattern_copy(&b, 0, 3, &*buf, 2, &*q).unwrap();
        // No synchronize: the host copies at once.
        let mut out = [0u8; 8];
        b.read_back(&*buf, 0, &mut out).unwrap();
        let p = &seam::backend_check::PATTERN;
        assert_eq!(out, [0, 0, p[0], p[1], p[2], 0, 0, 0]);
        let err = seam::backend_check::queue_pattern_copy(&b, 0, 3, &*buf, 6, &*q);
        assert!(matches!(err, Err(DeviceError::Misuse(_))));
    }

    #[test]
    fn host_platform_never_stages() {
        let p = HostPlatform::new();
        assert!(!p.needs_weight_staging());
        assert!(p.host_memory_is_device_addressable());
        assert!(p.backend().device_memory_is_host_addressable());
        assert_ne!(p.device_id(), HostPlatform::new().device_id());
    }
}
