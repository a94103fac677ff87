//! A simulated staging device, for tests and for `seam load --device fake`.
//!
//! Unlike a no-op backend it is asynchronous on purpose: a queued copy takes
//! its bytes when queued (as a driver stages pageable memory) but lands in
//! the device buffer only at [`Backend::synchronize`], so a caller that
//! skips the synchronize finds an empty device copy. It keeps an ordered
//! [`Event`] log (alloc, copy queued, copy completed, synchronize, release,
//! free) and counters, its two host-addressability answers are set per test
//! and may disagree with each other, and it can be told to fail an
//! allocation or a copy.
//!
//! [`ops`] is the fake device's op layer: the CPU reference
//! (`device-ops`) run on the fake device's own buffers.
//!
//! **Architecture Invariant:** this crate knows the seam and the device op
//! layer, nothing else (no vendor).

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use seam::platform::{
    Backend, DeviceBuffer, DeviceError, DeviceId, DevicePolicy, HostRegistration, HostRelease,
    Platform, Queue, ResidencyPolicy, StageCounters, StagingCopy, TransferCaps, buffer_range,
};

mod collective;
pub mod ops;
mod sink;
pub use collective::FakeCollective;
pub use sink::{SinkPlatform, SinkReport};

/// One thing the fake device did, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A device buffer was allocated.
    Alloc {
        /// The buffer's id.
        buffer: u64,
        /// Its size.
        len: u64,
    },
    /// A copy was queued.
    CopyQueued {
        /// The destination buffer.
        buffer: u64,
        /// Offset in the buffer.
        offset: u64,
        /// Bytes.
        len: u64,
    },
    /// A queued copy landed in its buffer (at synchronize).
    CopyCompleted {
        /// The destination buffer.
        buffer: u64,
        /// Bytes.
        len: u64,
    },
    /// A queue was synchronized.
    Synchronize,
    /// The seam gave a weight's host bytes back.
    Release {
        /// The weight.
        weight: String,
        /// A borrow (else an owned buffer).
        borrowed: bool,
        /// Where the weight's host span starts in its file (0 when owned).
        offset: u64,
        /// The weight's host span in bytes.
        len: u64,
        /// Bytes given back.
        released: u64,
        /// Copies queued but not completed at that moment (must be 0).
        pending_copies: u64,
    },
    /// Host memory was registered (page-aligned, overlapping no live
    /// registration).
    Registered {
        /// Its address.
        addr: u64,
        /// Its length.
        len: u64,
    },
    /// A registration was dropped.
    Unregistered {
        /// Its address.
        addr: u64,
        /// Its length.
        len: u64,
        /// Copies from it queued but not completed at that moment (must be
        /// 0).
        pending_copies: u64,
        /// Registrations live just before (this one included).
        live: u64,
    },
    /// A device buffer was freed.
    Free {
        /// The buffer's id.
        buffer: u64,
    },
}

/// How a fake device answers and fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FakeConfig {
    /// The platform's answer: kernels read device copies (`false`: they
    /// read the host bytes, as on a part with pageable memory access).
    pub needs_weight_staging: bool,
    /// The platform's answer: the device reads host memory.
    pub host_memory_is_device_addressable: bool,
    /// The backend's answer: the host reads device memory.
    pub device_memory_is_host_addressable: bool,
    /// The platform's residency policy.
    pub policy: ResidencyPolicy,
    /// Fail the allocation with this index (0 = the first).
    pub fail_alloc: Option<u64>,
    /// Fail the copy with this index (0 = the first).
    pub fail_copy: Option<u64>,
    /// What the backend offers for copies (pinned DMA, registration).
    pub caps: TransferCaps,
}

impl Default for FakeConfig {
    /// A discrete device: neither side addresses the other's memory.
    fn default() -> Self {
        FakeConfig {
            needs_weight_staging: true,
            host_memory_is_device_addressable: false,
            device_memory_is_host_addressable: false,
            policy: ResidencyPolicy::default(),
            fail_alloc: None,
            fail_copy: None,
            caps: TransferCaps::default(),
        }
    }
}

impl FakeConfig {
    /// A fake device that answers as a real part would: its
    /// [`DevicePolicy`] (from [`DevicePolicy::from_probe`] on the attributes
    /// the part's driver reports) and the residency policy that goes with it.
    pub fn for_device(policy: DevicePolicy) -> FakeConfig {
        FakeConfig {
            needs_weight_staging: policy.needs_weight_staging,
            host_memory_is_device_addressable: policy.host_memory_is_device_addressable,
            device_memory_is_host_addressable: policy.device_memory_is_host_addressable,
            policy: policy.residency_policy(),
            ..FakeConfig::default()
        }
    }
}

/// Counts of what the fake device did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FakeCounters {
    /// Allocations.
    pub allocs: u64,
    /// Frees.
    pub frees: u64,
    /// Copies queued.
    pub copies_queued: u64,
    /// Copies completed.
    pub copies_completed: u64,
    /// Synchronizes.
    pub synchronizes: u64,
    /// Releases the seam reported.
    pub releases: u64,
    /// Bytes held on the device now.
    pub device_bytes: u64,
    /// Most bytes ever held on the device.
    pub peak_device_bytes: u64,
}

#[derive(Default)]
struct State {
    events: Vec<Event>,
    counters: FakeCounters,
    pending: u64,
    /// Source ranges (address, length) of copies queued and not completed.
    pending_sources: Vec<(u64, u64)>,
    /// Live registrations (address, length).
    registered: Vec<(u64, u64)>,
    /// `read_back` calls and their bytes.
    read_backs: u64,
    read_back_bytes: u64,
}

/// A fake registration: unregistered (and logged) when dropped.
struct FakeRegistration {
    addr: u64,
    len: u64,
    shared: Arc<Shared>,
}

impl HostRegistration for FakeRegistration {
    fn len(&self) -> usize {
        self.len as usize
    }
}

impl Drop for FakeRegistration {
    fn drop(&mut self) {
        let mut s = self.shared.lock();
        let (addr, end) = (self.addr, self.addr + self.len);
        let pending_copies = s
            .pending_sources
            .iter()
            .filter(|(a, l)| *a < end && a + l > addr)
            .count() as u64;
        let live = s.registered.len() as u64;
        s.registered.retain(|r| *r != (self.addr, self.len));
        s.events.push(Event::Unregistered {
            addr: self.addr,
            len: self.len,
            pending_copies,
            live,
        });
    }
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    next_id: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A fake device buffer: bytes in host memory the seam cannot be handed as
/// host bytes (it sits behind the backend).
pub struct FakeBuffer {
    id: u64,
    bytes: Arc<Mutex<Vec<u8>>>,
    shared: Arc<Shared>,
}

impl DeviceBuffer for FakeBuffer {
    fn len(&self) -> u64 {
        self.lock().len() as u64
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl FakeBuffer {
    fn lock(&self) -> MutexGuard<'_, Vec<u8>> {
        self.bytes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The buffer's id in the event log.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The bytes as a kernel on the fake device reads them, in place: for
    /// the fake device's op layer ([`ops`]). Not a read-back (nothing is
    /// counted as a transfer); a host-side check reads through
    /// [`Backend::read_back`].
    pub fn kernel_bytes(&self) -> Vec<u8> {
        self.lock().clone()
    }

    /// The address of the buffer's bytes: the fake device's device
    /// address, as `platform_cuda::CudaBuffer::device_ptr` is a CUDA one.
    /// The fake device's memory is host memory, so a staged copy can be
    /// handed to a consumer that reads it in place (the Python package's
    /// DLPack export). The address is fixed for the buffer's life: its
    /// bytes are allocated once and only ever written in place. Reading
    /// through it is reading device memory: valid while the buffer lives,
    /// and not ordered with a write of the op layer (which writes only
    /// its own outputs and states, never a staged weight).
    pub fn device_ptr(&self) -> u64 {
        self.lock().as_ptr() as u64
    }
}

impl Drop for FakeBuffer {
    fn drop(&mut self) {
        let len = self.lock().len() as u64;
        let mut s = self.shared.lock();
        s.events.push(Event::Free { buffer: self.id });
        s.counters.frees += 1;
        s.counters.device_bytes -= len;
    }
}

struct PendingCopy {
    dst: Arc<Mutex<Vec<u8>>>,
    buffer: u64,
    offset: usize,
    /// Where the bytes came from (to match registrations).
    src_addr: u64,
    bytes: Vec<u8>,
}

/// A fake queue: holds copies until synchronize.
pub struct FakeQueue {
    pending: Mutex<Vec<PendingCopy>>,
}

impl Queue for FakeQueue {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The fake device's memory operations.
pub struct FakeBackend {
    config: FakeConfig,
    shared: Arc<Shared>,
    copies: AtomicU64,
    allocs: AtomicU64,
}

fn fake_buffer(buf: &dyn DeviceBuffer) -> Result<&FakeBuffer, DeviceError> {
    buf.as_any()
        .downcast_ref::<FakeBuffer>()
        .ok_or_else(|| DeviceError::Misuse("not a fake buffer".into()))
}

fn fake_queue(queue: &dyn Queue) -> Result<&FakeQueue, DeviceError> {
    queue
        .as_any()
        .downcast_ref::<FakeQueue>()
        .ok_or_else(|| DeviceError::Misuse("not a fake queue".into()))
}

impl FakeBackend {
    /// An allocation, as [`Backend::allocate`] makes it (counted, logged,
    /// failing where told to).
    fn allocate_fake(&self, len: u64) -> Result<FakeBuffer, DeviceError> {
        let index = self.allocs.fetch_add(1, Ordering::Relaxed);
        if self.config.fail_alloc == Some(index) {
            return Err(DeviceError::OutOfMemory { bytes: len });
        }
        let n = usize::try_from(len).map_err(|_| DeviceError::OutOfMemory { bytes: len })?;
        let mut bytes = Vec::new();
        bytes
            .try_reserve_exact(n)
            .map_err(|_| DeviceError::OutOfMemory { bytes: len })?;
        bytes.resize(n, 0);
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let mut s = self.shared.lock();
        s.events.push(Event::Alloc { buffer: id, len });
        s.counters.allocs += 1;
        s.counters.device_bytes += len;
        s.counters.peak_device_bytes = s.counters.peak_device_bytes.max(s.counters.device_bytes);
        drop(s);
        Ok(FakeBuffer {
            id,
            bytes: Arc::new(Mutex::new(bytes)),
            shared: Arc::clone(&self.shared),
        })
    }

    /// A kernel's output on the fake device: a new buffer (an allocation,
    /// counted and logged as any) holding `bytes`. For the fake device's
    /// op layer ([`ops`]); a weight reaches the device only through the
    /// seam's staging copy.
    ///
    /// # Errors
    ///
    /// The allocation fails (injected, or out of memory).
    pub fn kernel_output(&self, bytes: Vec<u8>) -> Result<FakeBuffer, DeviceError> {
        let buf = self.allocate_fake(bytes.len() as u64)?;
        *buf.lock() = bytes;
        Ok(buf)
    }

    /// Read-backs so far: `(calls, bytes)`.
    pub fn read_backs(&self) -> (u64, u64) {
        let s = self.shared.lock();
        (s.read_backs, s.read_back_bytes)
    }
}

impl Backend for FakeBackend {
    fn name(&self) -> String {
        "fake".into()
    }

    fn allocate(&self, len: u64) -> Result<Box<dyn DeviceBuffer>, DeviceError> {
        Ok(Box::new(self.allocate_fake(len)?))
    }

    fn create_queue(&self) -> Result<Box<dyn Queue>, DeviceError> {
        Ok(Box::new(FakeQueue {
            pending: Mutex::new(Vec::new()),
        }))
    }

    fn copy_to_device_async(&self, copy: StagingCopy<'_>) -> Result<(), DeviceError> {
        let (src, dst, dst_offset) = (copy.src(), copy.dst(), copy.dst_offset());
        let queue = copy.queue();
        let index = self.copies.fetch_add(1, Ordering::Relaxed);
        if self.config.fail_copy == Some(index) {
            return Err(DeviceError::CopyFailed(format!(
                "injected failure of copy {index}"
            )));
        }
        let buf = fake_buffer(dst)?;
        let queue = fake_queue(queue)?;
        let r = buffer_range(dst_offset, src.len(), buf.lock().len() as u64)?;
        // The device's copy of the data is taken now but lands at synchronize.
        let staged = PendingCopy {
            dst: Arc::clone(&buf.bytes),
            buffer: buf.id,
            offset: r.start,
            src_addr: src.as_ptr() as u64,
            bytes: src.to_vec(),
        };
        let mut s = self.shared.lock();
        s.events.push(Event::CopyQueued {
            buffer: buf.id,
            offset: dst_offset,
            len: src.len() as u64,
        });
        s.counters.copies_queued += 1;
        s.pending += 1;
        s.pending_sources
            .push((src.as_ptr() as u64, src.len() as u64));
        drop(s);
        queue
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(staged);
        Ok(())
    }

    fn synchronize(&self, queue: &dyn Queue) -> Result<(), DeviceError> {
        let queue = fake_queue(queue)?;
        let copies = std::mem::take(&mut *queue.pending.lock().unwrap_or_else(|e| e.into_inner()));
        let mut s = self.shared.lock();
        for copy in &copies {
            if let Some(i) = s
                .pending_sources
                .iter()
                .position(|p| *p == (copy.src_addr, copy.bytes.len() as u64))
            {
                s.pending_sources.swap_remove(i);
            }
            s.events.push(Event::CopyCompleted {
                buffer: copy.buffer,
                len: copy.bytes.len() as u64,
            });
            s.counters.copies_completed += 1;
            s.pending -= 1;
        }
        s.events.push(Event::Synchronize);
        s.counters.synchronizes += 1;
        drop(s);
        for copy in copies {
            // A buffer freed before its copy landed is kept alive by the Arc
            // until here; the write is then harmless.
            let mut dst = copy.dst.lock().unwrap_or_else(|e| e.into_inner());
            dst[copy.offset..copy.offset + copy.bytes.len()].copy_from_slice(&copy.bytes);
        }
        Ok(())
    }

    fn read_back(
        &self,
        src: &dyn DeviceBuffer,
        src_offset: u64,
        dst: &mut [u8],
    ) -> Result<(), DeviceError> {
        let buf = fake_buffer(src)?;
        let bytes = buf.lock();
        let r = buffer_range(src_offset, dst.len(), bytes.len() as u64)?;
        dst.copy_from_slice(&bytes[r]);
        drop(bytes);
        let mut s = self.shared.lock();
        s.read_backs += 1;
        s.read_back_bytes += dst.len() as u64;
        Ok(())
    }

    fn device_memory_is_host_addressable(&self) -> bool {
        self.config.device_memory_is_host_addressable
    }

    fn transfer_caps(&self) -> TransferCaps {
        self.config.caps
    }

    /// Registers whole pages only, and refuses a range overlapping a live
    /// registration, as CUDA does (`HOST_MEMORY_ALREADY_REGISTERED`).
    fn register_host(&self, bytes: &[u8]) -> Result<Box<dyn HostRegistration>, DeviceError> {
        if !self.config.caps.register_host {
            return Err(DeviceError::Misuse("registration is off".into()));
        }
        let page = seam::borrow::page_size();
        let (addr, len) = (bytes.as_ptr() as u64, bytes.len() as u64);
        if len == 0 || !addr.is_multiple_of(page) || !len.is_multiple_of(page) {
            return Err(DeviceError::Misuse(format!(
                "registering [{addr:#x}, +{len}): not whole pages"
            )));
        }
        let mut s = self.shared.lock();
        if s.registered
            .iter()
            .any(|(a, l)| *a < addr + len && a + l > addr)
        {
            return Err(DeviceError::CopyFailed(format!(
                "[{addr:#x}, +{len}) overlaps a registered range"
            )));
        }
        s.registered.push((addr, len));
        s.events.push(Event::Registered { addr, len });
        drop(s);
        Ok(Box::new(FakeRegistration {
            addr,
            len,
            shared: Arc::clone(&self.shared),
        }))
    }

    fn host_pages_released(&self, release: &HostRelease) {
        let mut s = self.shared.lock();
        let pending_copies = s.pending;
        s.events.push(Event::Release {
            weight: release.weight.clone(),
            borrowed: release.borrowed,
            offset: release.offset,
            len: release.len,
            released: release.released,
            pending_copies,
        });
        s.counters.releases += 1;
    }
}

/// A fake staging platform.
pub struct FakePlatform {
    backend: FakeBackend,
    id: DeviceId,
    counters: StageCounters,
}

impl FakePlatform {
    /// A fake device configured by `config`.
    pub fn new(config: FakeConfig) -> FakePlatform {
        FakePlatform {
            backend: FakeBackend {
                config,
                shared: Arc::new(Shared::default()),
                copies: AtomicU64::new(0),
                allocs: AtomicU64::new(0),
            },
            id: DeviceId::fresh(),
            counters: StageCounters::default(),
        }
    }

    /// The event log so far.
    pub fn events(&self) -> Vec<Event> {
        self.backend.shared.lock().events.clone()
    }

    /// The device's counters.
    pub fn counters(&self) -> FakeCounters {
        self.backend.shared.lock().counters
    }

    /// The fake backend.
    pub fn fake_backend(&self) -> &FakeBackend {
        &self.backend
    }
}

impl Platform for FakePlatform {
    fn backend(&self) -> &dyn Backend {
        &self.backend
    }
    fn device_id(&self) -> DeviceId {
        self.id
    }
    fn needs_weight_staging(&self) -> bool {
        self.backend.config.needs_weight_staging
    }
    fn host_memory_is_device_addressable(&self) -> bool {
        self.backend.config.host_memory_is_device_addressable
    }
    fn residency_policy(&self) -> ResidencyPolicy {
        self.backend.config.policy
    }
    fn stage_counters(&self) -> &StageCounters {
        &self.counters
    }
}

#[cfg(test)]
mod tests;
