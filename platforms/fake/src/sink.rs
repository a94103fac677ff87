//! A sink device: a staging device that verifies what it receives (a
//! running sha256 per device buffer) and keeps nothing, so a model larger
//! than host memory can be "loaded" on a CPU-only machine to measure what
//! the load costs the host.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use seam::platform::{
    Backend, DeviceBuffer, DeviceError, DeviceId, HostRelease, Platform, Queue, ResidencyPolicy,
    StageCounters, StagingCopy,
};
use sha2::{Digest, Sha256};

/// A sink buffer: a length, a running hash and how much has arrived.
pub struct SinkBuffer {
    len: u64,
    state: Mutex<(Sha256, u64)>,
    totals: Arc<Totals>,
}

impl DeviceBuffer for SinkBuffer {
    fn len(&self) -> u64 {
        self.len
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn sha256(&self) -> Option<[u8; 32]> {
        self.digest()
    }
}

impl Drop for SinkBuffer {
    fn drop(&mut self) {
        self.totals
            .device_bytes
            .fetch_sub(self.len, Ordering::Relaxed);
    }
}

impl SinkBuffer {
    /// The sha256 of everything received, once every byte has arrived.
    pub fn digest(&self) -> Option<[u8; 32]> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        (state.1 == self.len).then(|| state.0.clone().finalize().into())
    }
}

struct SinkQueue;

impl Queue for SinkQueue {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[derive(Default)]
struct Totals {
    received_bytes: AtomicU64,
    device_bytes: AtomicU64,
    released_bytes: AtomicU64,
}

/// What a sink device saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SinkReport {
    /// Bytes copied to it.
    pub received_bytes: u64,
    /// Bytes of buffers alive now (accounted, never held).
    pub device_bytes: u64,
    /// Host bytes the seam reported given back.
    pub released_bytes: u64,
}

/// The sink's memory operations.
pub struct SinkBackend {
    totals: Arc<Totals>,
}

impl Backend for SinkBackend {
    fn name(&self) -> String {
        "sink".into()
    }

    fn allocate(&self, len: u64) -> Result<Box<dyn DeviceBuffer>, DeviceError> {
        self.totals.device_bytes.fetch_add(len, Ordering::Relaxed);
        Ok(Box::new(SinkBuffer {
            len,
            state: Mutex::new((Sha256::new(), 0)),
            totals: Arc::clone(&self.totals),
        }))
    }

    fn create_queue(&self) -> Result<Box<dyn Queue>, DeviceError> {
        Ok(Box::new(SinkQueue))
    }

    fn copy_to_device_async(&self, copy: StagingCopy<'_>) -> Result<(), DeviceError> {
        let (src, dst, dst_offset) = (copy.src(), copy.dst(), copy.dst_offset());
        let buf = dst
            .as_any()
            .downcast_ref::<SinkBuffer>()
            .ok_or_else(|| DeviceError::Misuse("not a sink buffer".into()))?;
        let mut state = buf.state.lock().unwrap_or_else(|e| e.into_inner());
        // A running hash needs the bytes in order.
        if dst_offset != state.1 || dst_offset + src.len() as u64 > buf.len {
            return Err(DeviceError::Misuse(format!(
                "sink copies must arrive in order: expected offset {}, got {dst_offset} (+{})",
                state.1,
                src.len()
            )));
        }
        state.0.update(src);
        state.1 += src.len() as u64;
        self.totals
            .received_bytes
            .fetch_add(src.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn synchronize(&self, _queue: &dyn Queue) -> Result<(), DeviceError> {
        Ok(())
    }

    fn read_back(
        &self,
        _src: &dyn DeviceBuffer,
        _offset: u64,
        _dst: &mut [u8],
    ) -> Result<(), DeviceError> {
        Err(DeviceError::Misuse(
            "a sink keeps nothing to read back; use SinkBuffer::digest".into(),
        ))
    }

    fn device_memory_is_host_addressable(&self) -> bool {
        false
    }

    fn host_pages_released(&self, release: &HostRelease) {
        self.totals
            .released_bytes
            .fetch_add(release.released, Ordering::Relaxed);
    }
}

/// A sink platform: a discrete staging device that keeps nothing.
pub struct SinkPlatform {
    backend: SinkBackend,
    id: DeviceId,
    counters: StageCounters,
}

impl Default for SinkPlatform {
    fn default() -> Self {
        SinkPlatform::new()
    }
}

impl SinkPlatform {
    /// A new sink.
    pub fn new() -> SinkPlatform {
        SinkPlatform {
            backend: SinkBackend {
                totals: Arc::new(Totals::default()),
            },
            id: DeviceId::fresh(),
            counters: StageCounters::default(),
        }
    }

    /// What it saw so far.
    pub fn report(&self) -> SinkReport {
        let t = &self.backend.totals;
        SinkReport {
            received_bytes: t.received_bytes.load(Ordering::Relaxed),
            device_bytes: t.device_bytes.load(Ordering::Relaxed),
            released_bytes: t.released_bytes.load(Ordering::Relaxed),
        }
    }

    /// The digest of a buffer this sink made.
    pub fn digest(buffer: &dyn DeviceBuffer) -> Option<[u8; 32]> {
        buffer.as_any().downcast_ref::<SinkBuffer>()?.digest()
    }
}

impl Platform for SinkPlatform {
    fn backend(&self) -> &dyn Backend {
        &self.backend
    }
    fn device_id(&self) -> DeviceId {
        self.id
    }
    fn needs_weight_staging(&self) -> bool {
        true
    }
    fn host_memory_is_device_addressable(&self) -> bool {
        false
    }
    fn residency_policy(&self) -> ResidencyPolicy {
        ResidencyPolicy::default()
    }
    fn stage_counters(&self) -> &StageCounters {
        &self.counters
    }
}
