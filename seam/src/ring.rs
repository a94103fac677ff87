//! The staging ring: large host-to-device copies go through a few pinned
//! host buffers (default 4 x 64 MiB), filled by reader threads and copied
//! asynchronously, each buffer reused only after its copy completed.
//!
//! The whole model is never pinned or registered (pinning a mapped 67 GiB
//! model hung ROCm). A file-backed source is read with `pread` (optionally
//! `O_DIRECT`) straight into the ring, so its pages never enter this
//! process's mapping: host residency during a load is the ring plus the
//! page cache the kernel keeps, whatever the model's size. The readers
//! advise the kernel to read the next window ahead (`WILLNEED`).
//!
//! Each buffer has its own queue; synchronizing that queue is the buffer's
//! "event". Copies into one destination are issued in file order, so a
//! device that hashes what it receives sees the bytes in order.
//!
//! With no knob set, a device that copies by DMA gets the shape measured
//! best on the H200 machine ([`device_default`]); reads are buffered or
//! `O_DIRECT` per chunk by what the page cache holds ([`direct`]); and
//! large weights may go by [`registered`] windows instead of the buffers.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

use memmap2::MmapMut;

use crate::backend::{
    Backend, DeviceBuffer, DeviceError, HostRegistration, PinnedBuffer, Queue, StagingCopy,
    TransferCaps,
};
use crate::borrow::MappedFile;
use crate::knob::{Knob, PolicyConfig, PolicyError, Resolved, Source, resolve_knob, source_name};

mod budget;
pub mod direct;
pub mod registered;
#[cfg(test)]
mod tests;

use budget::InFlightBudget;
pub use direct::Mode;

/// `O_DIRECT` reads in flight at once over a whole ring, whatever its
/// readers: on the H200 machine's disk a 32 GiB model read cold at 1.92
/// GB/s with 4 direct readers, 1.75-1.85 with 8 to 24 (more requests at
/// once interleave at the disk instead of filling it), so a ring of many
/// readers for the warm page cache reads cold chunks 4 at a time.
pub const DIRECT_READS_AT_ONCE: u64 = 4;

/// Weights on the registered path at once, over all lanes. The driver
/// serializes registration: on the H200 machine a 32 GiB model moved at
/// 13-17 GB/s with every lane registering (register and unregister cost
/// about 0.12 s per GB, and more lanes or windows made it slower, 8.5 GB/s
/// with 16), while the ring alone moved 49 GB/s, bound by the page-cache
/// copy. With one weight registering at a time, the registered windows'
/// DMA adds to the ring's copies instead of replacing them.
pub const REGISTERING_WEIGHTS_AT_ONCE: u64 = 1;

/// The alignment `O_DIRECT` reads need (offset, length and address).
const DIRECT_IO_ALIGN: u64 = 4096;

/// How the ring is shaped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingConfig {
    /// Bytes per buffer.
    pub buffer_bytes: u64,
    /// Number of buffers.
    pub buffers: u64,
    /// Reader threads filling them.
    pub readers: u64,
    /// Read files with `O_DIRECT` (`on`), buffered (`off`), or per chunk by
    /// what the page cache holds (`auto`); falls back to buffered reads
    /// where the file system refuses `O_DIRECT`.
    pub direct_io: Mode,
    /// Weights smaller than this many bytes skip the chunked pipeline (it
    /// costs more than it saves for them): one copy, from a `pread` of
    /// their file where they borrow one (so their pages never enter the
    /// process), else from their host bytes.
    pub direct_below: u64,
    /// Independent pipelines sharing the buffers and readers, so several
    /// weights can be staged at once.
    pub lanes: u64,
    /// Registered windows for large weights of a file mapping (`auto`: a
    /// window is registered only when the page cache holds it).
    pub registered: Mode,
    /// Bytes per registered window.
    pub window_bytes: u64,
    /// Weights whose whole pages are fewer bytes than this never take the
    /// registered path.
    pub registered_min: u64,
    /// Registered windows at once over all lanes: host growth beyond the
    /// ring is at most this many windows.
    pub windows_in_flight: u64,
}

impl Default for RingConfig {
    /// The built-in shape: 4 x 64 MiB in 2 lanes, one reader per core (at
    /// most 16), buffered reads, weights under 1 MiB copied directly.
    fn default() -> Self {
        RingConfig {
            buffer_bytes: 64 << 20,
            buffers: 4,
            readers: default_readers(),
            direct_io: Mode::Off,
            direct_below: DEFAULT_DIRECT_BELOW,
            lanes: 2,
            registered: Mode::Off,
            window_bytes: DEFAULT_WINDOW_MIB << 20,
            registered_min: DEFAULT_REGISTERED_MIN_MIB << 20,
            windows_in_flight: DEFAULT_WINDOWS_IN_FLIGHT,
        }
    }
}

/// The ring's shape for a device with `caps` on a host with `cores` cores,
/// or `None` where the built-in shape stands (a device whose copy is a
/// host `memcpy`: the fake and sink devices keep today's bounds).
///
/// The rule is the H200 machines' measurements (32 GiB model, warm):
/// - 16 cores: 4 x 64 MiB in 2 lanes with 16 readers reached 12.1 GB/s, a
///   third of the page-cache read ceiling, while 16 x 8 MiB in 4 lanes
///   reached 31.6-45.5 GB/s: smaller buffers let more readers copy out of
///   the page cache at once, and more lanes keep the copy engine fed
///   between weights.
/// - 32 cores: 16 readers reached 44.7 GB/s against a 32-thread read
///   ceiling of 49.7; 24 readers with 24 buffers in 6 lanes 48.9, and 32
///   readers in 8 lanes 48.0 (past 24 the bus and the memory are the
///   limit).
///
/// So: one reader per core (2..=24), one 8 MiB buffer per reader (at least
/// 16), a lane per 4 readers (1..=6), and `auto` reads, so a cold chunk
/// goes `O_DIRECT` at the disk's pace instead of through the page cache.
pub fn device_default(cores: u64, caps: TransferCaps) -> Option<RingConfig> {
    if !caps.pinned_dma {
        return None;
    }
    let readers = cores.clamp(2, MAX_DEVICE_DEFAULT_READERS);
    Some(RingConfig {
        buffer_bytes: 8 << 20,
        buffers: readers.max(16),
        readers,
        direct_io: Mode::Auto,
        lanes: (readers / 4).clamp(1, 6),
        ..RingConfig::default()
    })
}

/// The most readers the device default takes (see [`device_default`]).
pub const MAX_DEVICE_DEFAULT_READERS: u64 = 24;

/// The host's cores, as the device default counts them.
pub fn host_cores() -> u64 {
    std::thread::available_parallelism().map_or(4, |n| n.get() as u64)
}

impl RingConfig {
    /// Bytes of host memory the ring holds.
    pub fn total_bytes(&self) -> u64 {
        self.buffer_bytes * self.buffers
    }
}

/// Where the bytes of one staged weight come from.
#[derive(Clone, Copy)]
pub(crate) enum RingSource<'a> {
    /// `len` bytes of an open file at `offset`, read with `pread`.
    File {
        /// The file.
        file: &'a File,
        /// Its path, to reopen with `O_DIRECT`.
        path: &'a Path,
        /// Absolute offset.
        offset: u64,
        /// The file's mapping: `mincore` asks it what the page cache holds,
        /// and registered windows are ranges of it.
        map: &'a MappedFile,
    },
    /// Bytes in memory (an owned buffer, an anonymous mapping).
    Bytes(&'a [u8]),
}

/// An error of a ring transfer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RingError {
    /// Reading the source failed.
    #[error("reading {path} at byte {offset}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Absolute offset of the failed read.
        offset: u64,
        /// The error.
        source: std::io::Error,
    },
    /// The device failed.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// The ring's host memory could not be allocated.
    #[error("allocating the staging ring: {0}")]
    Alloc(std::io::Error),
}

enum SlotMemory {
    Pinned(Box<dyn PinnedBuffer>),
    Plain(MmapMut),
}

impl SlotMemory {
    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            SlotMemory::Pinned(p) => p.as_mut_slice(),
            SlotMemory::Plain(m) => m,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotState {
    /// Unused since the last transfer ended.
    Free,
    /// A reader is filling it with this chunk.
    Filling(u64),
    /// Holds this chunk: `len` bytes starting `start` bytes into the buffer.
    Filled {
        chunk: u64,
        start: usize,
        len: usize,
    },
    /// This chunk's copy is queued on the slot's queue.
    InFlight(u64),
}

struct Slot {
    memory: Mutex<SlotMemory>,
    queue: Box<dyn Queue>,
    state: Mutex<SlotState>,
    changed: Condvar,
}

/// What a ring has carried.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RingCounts {
    /// Weights copied through the ring.
    pub transfers: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Whether the buffers are pinned.
    pub pinned: bool,
    /// Chunks read with `O_DIRECT`.
    pub direct_chunks: u64,
    /// Chunks of a file read buffered.
    pub buffered_chunks: u64,
    /// `O_DIRECT` reads the system refused, read buffered instead.
    pub direct_fallbacks: u64,
    /// Registered windows copied.
    pub registered_windows: u64,
    /// Their bytes.
    pub registered_bytes: u64,
    /// Nanoseconds spent registering them (the path's fixed cost).
    pub register_ns: u64,
    /// Nanoseconds spent unregistering them and dropping their pages.
    pub unregister_ns: u64,
    /// Registrations the backend refused (those windows went through the
    /// ring, and registration stopped for the ring's lifetime).
    pub register_failures: u64,
    /// The most windows registered at once.
    pub windows_peak: u64,
    /// The most `O_DIRECT` reads in flight at once.
    pub direct_reads_peak: u64,
    /// The most weights on the registered path at once.
    pub registering_weights_peak: u64,
}

/// The ring's running counts behind [`RingCounts`].
#[derive(Default)]
struct Counters {
    transfers: AtomicU64,
    bytes: AtomicU64,
    direct_chunks: AtomicU64,
    buffered_chunks: AtomicU64,
    direct_fallbacks: AtomicU64,
    registered_windows: AtomicU64,
    registered_bytes: AtomicU64,
    register_ns: AtomicU64,
    unregister_ns: AtomicU64,
    register_failures: AtomicU64,
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// A ring of host buffers for chunked host-to-device copies.
pub struct StagingRing {
    config: RingConfig,
    pinned: bool,
    caps: TransferCaps,
    counters: Counters,
    budget: InFlightBudget,
    /// `O_DIRECT` reads at once, over all lanes and readers.
    direct_reads: InFlightBudget,
    /// Weights taking the registered path at once; the other lanes use the
    /// buffers meanwhile.
    registering_weights: InFlightBudget,
    /// Queues of registered windows, reused.
    window_queues: Mutex<Vec<Box<dyn Queue>>>,
    /// The backend refused a registration: no more are tried.
    registration_refused: AtomicBool,
    /// Independent pipelines: weights staged from several threads at once
    /// each take a free lane, so one weight's pipeline fills while
    /// another's drains.
    lanes: Vec<Mutex<Lane>>,
    next_lane: AtomicU64,
}

/// One pipeline: its buffers (each with its own queue) and reader count.
struct Lane {
    slots: Vec<Slot>,
    readers: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl StagingRing {
    /// Allocates the ring's buffers (pinned where `backend` has pinned
    /// memory, else page-aligned anonymous memory) and one queue each.
    ///
    /// # Errors
    ///
    /// An allocation failed.
    pub fn new(backend: &dyn Backend, config: RingConfig) -> Result<StagingRing, RingError> {
        // O_DIRECT reads whole aligned blocks around the chunk.
        let slot_len = (config.buffer_bytes + 2 * DIRECT_IO_ALIGN) as usize;
        // Each lane runs at least one reader and holds at least one buffer,
        // so lanes beyond either would add threads or memory past the knobs.
        let lanes = config
            .lanes
            .clamp(1, config.buffers.min(config.readers).max(1));
        let mut pinned = true;
        let mut all_lanes = Vec::with_capacity(lanes as usize);
        for lane in 0..lanes {
            // Buffers and readers are totals, shared out among the lanes.
            let share = |total: u64| (total / lanes + u64::from(lane < total % lanes)).max(1);
            let mut slots = Vec::new();
            for _ in 0..share(config.buffers) {
                let memory = match backend.allocate_pinned(slot_len)? {
                    Some(p) => SlotMemory::Pinned(p),
                    None => {
                        pinned = false;
                        SlotMemory::Plain(MmapMut::map_anon(slot_len).map_err(RingError::Alloc)?)
                    }
                };
                slots.push(Slot {
                    memory: Mutex::new(memory),
                    queue: backend.create_queue()?,
                    state: Mutex::new(SlotState::Free),
                    changed: Condvar::new(),
                });
            }
            all_lanes.push(Mutex::new(Lane {
                slots,
                readers: share(config.readers),
            }));
        }
        Ok(StagingRing {
            config,
            pinned,
            caps: backend.transfer_caps(),
            counters: Counters::default(),
            budget: InFlightBudget::new(config.windows_in_flight),
            direct_reads: InFlightBudget::new(DIRECT_READS_AT_ONCE),
            registering_weights: InFlightBudget::new(REGISTERING_WEIGHTS_AT_ONCE),
            window_queues: Mutex::new(Vec::new()),
            registration_refused: AtomicBool::new(false),
            lanes: all_lanes,
            next_lane: AtomicU64::new(0),
        })
    }

    /// The number of lanes (weights that can be in flight at once).
    pub fn lanes(&self) -> usize {
        self.lanes.len()
    }

    /// A free lane, or (all busy) the next one in turn, waited for.
    fn acquire_lane(&self) -> MutexGuard<'_, Lane> {
        for lane in &self.lanes {
            match lane.try_lock() {
                Ok(guard) => return guard,
                // A transfer on it panicked; `transfer_range` reset it.
                Err(std::sync::TryLockError::Poisoned(p)) => return p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {}
            }
        }
        let turn = self.next_lane.fetch_add(1, Ordering::Relaxed) as usize % self.lanes.len();
        lock(&self.lanes[turn])
    }

    /// The ring's shape.
    pub fn config(&self) -> RingConfig {
        self.config
    }

    /// Whether the buffers are pinned (the backend had pinned memory).
    pub fn is_pinned(&self) -> bool {
        self.pinned
    }

    /// What the ring has carried so far.
    pub fn counts(&self) -> RingCounts {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RingCounts {
            transfers: get(&c.transfers),
            bytes: get(&c.bytes),
            pinned: self.pinned,
            direct_chunks: get(&c.direct_chunks),
            buffered_chunks: get(&c.buffered_chunks),
            direct_fallbacks: get(&c.direct_fallbacks),
            registered_windows: get(&c.registered_windows),
            registered_bytes: get(&c.registered_bytes),
            register_ns: get(&c.register_ns),
            unregister_ns: get(&c.unregister_ns),
            register_failures: get(&c.register_failures),
            windows_peak: self.budget.peak(),
            direct_reads_peak: self.direct_reads.peak(),
            registering_weights_peak: self.registering_weights.peak(),
        }
    }

    /// Copies `len` bytes of `source` to `dst[0..len]` through the ring and
    /// waits until the device has all of them. Only the seam stages through
    /// the ring (from `resident_weight`).
    ///
    /// # Errors
    ///
    /// A read or a device operation failed; the ring is drained and usable
    /// again.
    pub(crate) fn transfer(
        &self,
        backend: &dyn Backend,
        source: RingSource<'_>,
        len: u64,
        dst: &dyn DeviceBuffer,
    ) -> Result<(), RingError> {
        match source {
            RingSource::File { map, offset, .. }
                if self.registers(map, offset, len) && self.registering_weights.try_take() =>
            {
                let moved = self.transfer_registered(backend, source, map, offset, len, dst);
                self.registering_weights.give();
                moved?;
            }
            _ => self.transfer_range(backend, source, 0..len, dst)?,
        }
        add(&self.counters.transfers, 1);
        add(&self.counters.bytes, len);
        Ok(())
    }

    /// Whether a weight of `len` bytes at `offset` of `map` takes the
    /// registered path.
    fn registers(&self, map: &MappedFile, offset: u64, len: u64) -> bool {
        if self.registration_refused.load(Ordering::Relaxed) || !map.is_file_backed() {
            return false;
        }
        let addr = map.bytes().as_ptr() as u64 + offset;
        let page = crate::borrow::page_size();
        let plan = registered::plan_windows(addr, len, page, self.config.window_bytes);
        let interior = plan.tail.start - plan.head.end;
        registered::takes_registered_path(
            self.config.registered,
            self.caps,
            interior,
            self.config.registered_min,
        )
    }

    /// Copies bytes `range` of `source` to the same range of `dst` through
    /// one lane's buffers, and waits until the device has them.
    fn transfer_range(
        &self,
        backend: &dyn Backend,
        source: RingSource<'_>,
        range: std::ops::Range<u64>,
        dst: &dyn DeviceBuffer,
    ) -> Result<(), RingError> {
        let (start, len) = (range.start, range.end - range.start);
        if len == 0 {
            return Ok(());
        }
        let lane = self.acquire_lane();
        let lane = &*lane;
        let direct = match source {
            RingSource::File { path, .. } if self.config.direct_io != Mode::Off => {
                open_direct(path)
            }
            _ => None,
        };
        let chunks = len.div_ceil(self.chunk_bytes());
        let next_chunk = AtomicU64::new(0);
        let failed = AtomicBool::new(false);
        let first_error: Mutex<Option<RingError>> = Mutex::new(None);
        let fail = |e: RingError| {
            lock(&first_error).get_or_insert(e);
            stop_lane(lane, &failed);
        };
        // A reader or the issuer that panics (in a backend's copy or
        // synchronize) ends the others' waits, and the lane is drained and
        // reset below before the panic goes on to the caller.
        let pipeline = std::panic::catch_unwind(AssertUnwindSafe(|| {
            std::thread::scope(|scope| {
                for _ in 0..lane.readers {
                    scope.spawn(|| {
                        let _wake = StopLaneOnPanic {
                            lane,
                            failed: &failed,
                        };
                        self.read_chunks(
                            lane,
                            backend,
                            source,
                            direct.as_ref(),
                            (start, len),
                            &next_chunk,
                            &failed,
                            &fail,
                        );
                    });
                }
                let _wake = StopLaneOnPanic {
                    lane,
                    failed: &failed,
                };
                for chunk in 0..chunks {
                    if let Err(e) = self.issue(lane, backend, chunk, dst, start, &failed) {
                        fail(e);
                        return;
                    }
                }
            })
        }));
        // Drain: every queued copy completes before the ring is reused or
        // the caller releases the source.
        let mut drain_error = None;
        for slot in &lane.slots {
            let mut state = lock(&slot.state);
            if matches!(*state, SlotState::InFlight(_))
                && let Err(e) = backend.synchronize(&*slot.queue)
            {
                drain_error.get_or_insert(RingError::Device(e));
            }
            *state = SlotState::Free;
        }
        if let Err(panic) = pipeline {
            std::panic::resume_unwind(panic);
        }
        match lock(&first_error).take().or(drain_error) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Bytes per chunk: a buffer's worth (at least one).
    fn chunk_bytes(&self) -> u64 {
        self.config.buffer_bytes.max(1)
    }

    /// A reader's loop: claims the next chunk, fills its slot, until the
    /// chunks run out or the transfer failed.
    #[allow(clippy::too_many_arguments)]
    fn read_chunks(
        &self,
        lane: &Lane,
        backend: &dyn Backend,
        source: RingSource<'_>,
        direct: Option<&File>,
        (start, len): (u64, u64),
        next_chunk: &AtomicU64,
        failed: &AtomicBool,
        fail: &dyn Fn(RingError),
    ) {
        let chunk_bytes = self.chunk_bytes();
        let chunks = len.div_ceil(chunk_bytes);
        loop {
            let chunk = next_chunk.fetch_add(1, Ordering::SeqCst);
            if chunk >= chunks || failed.load(Ordering::SeqCst) {
                return;
            }
            let pos = chunk * chunk_bytes;
            let want = (len - pos).min(chunk_bytes) as usize;
            if let Err(e) = self.fill(
                lane,
                backend,
                chunk,
                source,
                direct,
                start + pos,
                want,
                failed,
            ) {
                fail(e);
                return;
            }
            // Reading ahead would fill the page cache that direct reads
            // keep out of it.
            if self.config.direct_io == Mode::Off {
                readahead(
                    source,
                    start + pos + chunk_bytes * lane.readers,
                    chunk_bytes,
                );
            }
        }
    }

    /// A reader: waits for `chunk`'s slot to be reusable, waits for its
    /// previous copy to complete, and fills it.
    #[allow(clippy::too_many_arguments)]
    fn fill(
        &self,
        lane: &Lane,
        backend: &dyn Backend,
        chunk: u64,
        source: RingSource<'_>,
        direct: Option<&File>,
        pos: u64,
        want: usize,
        failed: &AtomicBool,
    ) -> Result<(), RingError> {
        let n = lane.slots.len() as u64;
        let slot = &lane.slots[(chunk % n) as usize];
        let mut state = lock(&slot.state);
        // The slot's previous chunk (chunk - n) must have been issued.
        loop {
            if failed.load(Ordering::SeqCst) {
                return Ok(());
            }
            match *state {
                SlotState::Free if chunk < n => break,
                SlotState::InFlight(prev) if prev + n == chunk => break,
                _ => state = slot.changed.wait(state).unwrap_or_else(|e| e.into_inner()),
            }
        }
        if matches!(*state, SlotState::InFlight(_)) {
            // The buffer's "event": its copy must complete before reuse.
            backend.synchronize(&*slot.queue)?;
        }
        *state = SlotState::Filling(chunk);
        drop(state);
        let mut memory = lock(&slot.memory);
        let start = self.read_chunk(source, direct, pos, want, memory.bytes_mut())?;
        drop(memory);
        let mut state = lock(&slot.state);
        *state = SlotState::Filled {
            chunk,
            start,
            len: want,
        };
        slot.changed.notify_all();
        Ok(())
    }

    /// The issuer: waits for `chunk` to be filled and queues its copy.
    fn issue(
        &self,
        lane: &Lane,
        backend: &dyn Backend,
        chunk: u64,
        dst: &dyn DeviceBuffer,
        dst_start: u64,
        failed: &AtomicBool,
    ) -> Result<(), RingError> {
        let slot = &lane.slots[(chunk % lane.slots.len() as u64) as usize];
        let mut state = lock(&slot.state);
        let (start, len) = loop {
            if failed.load(Ordering::SeqCst) {
                return Ok(());
            }
            match *state {
                SlotState::Filled {
                    chunk: c,
                    start,
                    len,
                } if c == chunk => break (start, len),
                _ => state = slot.changed.wait(state).unwrap_or_else(|e| e.into_inner()),
            }
        };
        let mut memory = lock(&slot.memory);
        let bytes = &memory.bytes_mut()[start..start + len];
        let at = dst_start + chunk * self.chunk_bytes();
        // SAFETY: the slot's bytes stay valid and unchanged until its queue
        // is synchronized: a reader synchronizes the queue before refilling
        // the slot (`fill`), and `transfer` synchronizes every in-flight
        // slot before returning; the ring (and its memory) outlives both.
        let copy = unsafe { StagingCopy::new(bytes, dst, at, &*slot.queue) };
        backend.copy_to_device_async(copy)?;
        drop(memory);
        *state = SlotState::InFlight(chunk);
        slot.changed.notify_all();
        Ok(())
    }
}

impl StagingRing {
    /// Reads `want` bytes at `pos` of `source` into `buf`, `O_DIRECT` or
    /// buffered as the knob and (with `auto`) the page cache say; returns
    /// where in `buf` they start (non-zero only for an aligned `O_DIRECT`
    /// read).
    fn read_chunk(
        &self,
        source: RingSource<'_>,
        direct: Option<&File>,
        pos: u64,
        want: usize,
        buf: &mut [u8],
    ) -> Result<usize, RingError> {
        match source {
            RingSource::Bytes(bytes) => {
                let pos = pos as usize;
                buf[..want].copy_from_slice(&bytes[pos..pos + want]);
                Ok(0)
            }
            RingSource::File {
                file,
                path,
                offset,
                map,
            } => {
                let at = offset + pos;
                let mode = self.config.direct_io;
                let resident = match mode {
                    Mode::Auto => map
                        .bytes()
                        .get(at as usize..at as usize + want)
                        .and_then(direct::resident_share),
                    _ => None,
                };
                if direct::reads_direct(mode, resident) {
                    // `direct` is `None` where the file system refused the
                    // `O_DIRECT` open (tmpfs): read buffered, and count it.
                    let read = direct.and_then(|d| {
                        self.direct_reads.take();
                        let read = read_direct(d, at, want, buf);
                        self.direct_reads.give();
                        read
                    });
                    if let Some(start) = read {
                        add(&self.counters.direct_chunks, 1);
                        return Ok(start);
                    }
                    add(&self.counters.direct_fallbacks, 1);
                }
                read_exact_at(file, path, at, &mut buf[..want])?;
                add(&self.counters.buffered_chunks, 1);
                Ok(0)
            }
        }
    }

    /// Copies a weight by registered windows: the head and tail (partial
    /// pages) through the ring, each whole-page window registered, copied
    /// asynchronously, and unregistered with its pages dropped once its copy
    /// completed; at most [`RingConfig::windows_in_flight`] windows are
    /// registered at once over all lanes.
    fn transfer_registered(
        &self,
        backend: &dyn Backend,
        source: RingSource<'_>,
        map: &MappedFile,
        offset: u64,
        len: u64,
        dst: &dyn DeviceBuffer,
    ) -> Result<(), RingError> {
        let span = &map.bytes()[offset as usize..(offset + len) as usize];
        let page = crate::borrow::page_size();
        let plan =
            registered::plan_windows(span.as_ptr() as u64, len, page, self.config.window_bytes);
        self.transfer_range(backend, source, plan.head.clone(), dst)?;
        let mut in_flight: std::collections::VecDeque<InFlightWindow> = Default::default();
        let mut result = Ok(());
        for window in &plan.windows {
            let bytes = &span[window.start as usize..window.end as usize];
            let resident = match self.config.registered {
                Mode::Auto => direct::resident_share(bytes),
                _ => None,
            };
            let registers = !self.registration_refused.load(Ordering::Relaxed)
                && registered::registers_window(self.config.registered, resident);
            if !registers {
                result = self.transfer_range(backend, source, window.clone(), dst);
            } else {
                // Hold at most the budget: complete our own oldest window
                // rather than wait while holding one.
                while !self.budget.try_take() {
                    match in_flight.pop_front() {
                        Some(w) => {
                            if let Err(e) = self.complete_window(backend, map, offset, w) {
                                result = result.and(Err(e));
                            }
                        }
                        None => {
                            self.budget.take();
                            break;
                        }
                    }
                }
                match self.start_window(backend, bytes, window.clone(), dst) {
                    Ok(Some(w)) => in_flight.push_back(w),
                    Ok(None) => {
                        self.budget.give();
                        result = self.transfer_range(backend, source, window.clone(), dst);
                    }
                    Err(e) => {
                        self.budget.give();
                        result = Err(e);
                    }
                }
            }
            if result.is_err() {
                break;
            }
        }
        // Every registered window completes and is released, error or not.
        while let Some(w) = in_flight.pop_front() {
            if let Err(e) = self.complete_window(backend, map, offset, w) {
                result = result.and(Err(e));
            }
        }
        result?;
        self.transfer_range(backend, source, plan.tail.clone(), dst)
    }

    /// Registers `bytes` and queues their copy to `dst[window]`; `None`
    /// when the backend refused the registration (from then on the ring
    /// carries every window).
    fn start_window(
        &self,
        backend: &dyn Backend,
        bytes: &[u8],
        window: std::ops::Range<u64>,
        dst: &dyn DeviceBuffer,
    ) -> Result<Option<InFlightWindow>, RingError> {
        let started = Instant::now();
        let registration = match backend.register_host(bytes) {
            Ok(r) => r,
            Err(_) => {
                add(&self.counters.register_failures, 1);
                self.registration_refused.store(true, Ordering::Relaxed);
                return Ok(None);
            }
        };
        add(
            &self.counters.register_ns,
            started.elapsed().as_nanos() as u64,
        );
        let queue = match lock(&self.window_queues).pop() {
            Some(q) => q,
            None => backend.create_queue()?,
        };
        // SAFETY: `bytes` are a range of the weight's file mapping, which
        // outlives this transfer and is never written; the copy completes
        // before `complete_window` synchronizes `queue` and only then is
        // the registration dropped and the pages given back, and
        // `transfer_registered` completes every window before it returns.
        let copy = unsafe { StagingCopy::new(bytes, dst, window.start, &*queue) };
        let queued = backend.copy_to_device_async(copy);
        if let Err(e) = queued {
            // Nothing was queued: the registration may go at once.
            drop(registration);
            lock(&self.window_queues).push(queue);
            return Err(e.into());
        }
        Ok(Some(InFlightWindow {
            registration,
            queue,
            window,
        }))
    }

    /// Waits for a window's copy, unregisters it, drops its pages from this
    /// process and gives its place in the budget back.
    fn complete_window(
        &self,
        backend: &dyn Backend,
        map: &MappedFile,
        offset: u64,
        w: InFlightWindow,
    ) -> Result<(), RingError> {
        let synced = backend.synchronize(&*w.queue);
        let started = Instant::now();
        let len = w.registration.len() as u64;
        drop(w.registration);
        // Registering faulted the window's pages into the mapping: give
        // them back now, so host growth stays within the budget.
        let _ = map.drop_resident_pages(
            offset + w.window.start,
            w.window.end - w.window.start,
            false,
        );
        add(
            &self.counters.unregister_ns,
            started.elapsed().as_nanos() as u64,
        );
        lock(&self.window_queues).push(w.queue);
        self.budget.give();
        synced?;
        add(&self.counters.registered_windows, 1);
        add(&self.counters.registered_bytes, len);
        Ok(())
    }
}

/// Marks a lane's transfer failed and wakes every thread waiting on one
/// of its slots (each re-checks `failed` under the slot's lock, so none
/// misses the wake-up).
fn stop_lane(lane: &Lane, failed: &AtomicBool) {
    failed.store(true, Ordering::SeqCst);
    for slot in &lane.slots {
        let _guard = lock(&slot.state);
        slot.changed.notify_all();
    }
}

/// Held by each reader and the issuer of a transfer: when its thread
/// unwinds, the lane stops, so the others do not wait forever for a chunk
/// the panicking one would have filled or issued.
struct StopLaneOnPanic<'a> {
    lane: &'a Lane,
    failed: &'a AtomicBool,
}

impl Drop for StopLaneOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            stop_lane(self.lane, self.failed);
        }
    }
}

/// A registered window whose copy is queued.
struct InFlightWindow {
    registration: Box<dyn HostRegistration>,
    queue: Box<dyn Queue>,
    window: std::ops::Range<u64>,
}

fn open_direct(path: &Path) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .ok()
}

/// An `O_DIRECT` read of the aligned blocks around `[at, at + want)`;
/// `None` when the kernel refuses it (the caller reads buffered instead).
fn read_direct(file: &File, at: u64, want: usize, buf: &mut [u8]) -> Option<usize> {
    let aligned = at / DIRECT_IO_ALIGN * DIRECT_IO_ALIGN;
    let start = (at - aligned) as usize;
    let end = (start + want).div_ceil(DIRECT_IO_ALIGN as usize) * DIRECT_IO_ALIGN as usize;
    if end > buf.len() || !(buf.as_ptr() as u64).is_multiple_of(DIRECT_IO_ALIGN) {
        return None;
    }
    let mut done = 0;
    while done < start + want {
        match file.read_at(&mut buf[done..end], aligned + done as u64) {
            Ok(0) | Err(_) => return None,
            Ok(k) => done += k,
        }
    }
    Some(start)
}

/// Asks the kernel to read the next window ahead (advisory; errors ignored).
fn readahead(source: RingSource<'_>, pos: u64, len: u64) {
    if let RingSource::File { file, offset, .. } = source {
        use std::os::fd::AsRawFd;
        // SAFETY: posix_fadvise only advises the kernel about a range of an
        // open descriptor; it touches no memory of ours.
        unsafe {
            libc::posix_fadvise(
                file.as_raw_fd(),
                (offset + pos) as libc::off_t,
                len as libc::off_t,
                libc::POSIX_FADV_WILLNEED,
            );
        }
    }
}

/// Staging buffer size in MiB (0 disables the ring: direct copies).
pub const PINNED_H2D_MIB: Knob = Knob {
    env: "VT_PINNED_H2D_MIB",
    key: "vllm_cpp.pinned_h2d.mib",
};
/// Number of staging buffers.
pub const PINNED_H2D_BUFFERS: Knob = Knob {
    env: "VT_PINNED_H2D_BUFFERS",
    key: "vllm_cpp.pinned_h2d.buffers",
};
/// Reader threads filling the ring.
pub const PINNED_H2D_READERS: Knob = Knob {
    env: "VT_PINNED_H2D_READERS",
    key: "vllm_cpp.pinned_h2d.readers",
};
/// Lanes: weights staged at once, each through its own share of the ring.
pub const PINNED_H2D_LANES: Knob = Knob {
    env: "VT_PINNED_H2D_LANES",
    key: "vllm_cpp.pinned_h2d.lanes",
};
/// Weights under this many bytes skip the ring's pipeline (one copy, of a
/// `pread` of their file where they borrow one).
pub const PINNED_H2D_DIRECT_BELOW: Knob = Knob {
    env: "VT_PINNED_H2D_DIRECT_BELOW",
    key: "vllm_cpp.pinned_h2d.direct_below",
};
/// Read with `O_DIRECT`: on, off, or `auto` (per chunk, by what the page
/// cache holds).
pub const DIRECT_IO: Knob = Knob {
    env: "VT_GGUF_DIRECT_IO",
    key: "vllm_cpp.mmap.direct_io",
};
/// Registered windows for large weights: on, off, or `auto` (a window is
/// registered when the page cache holds it).
pub const REGISTERED_WINDOWS: Knob = Knob {
    env: "VT_REGISTERED_WINDOWS",
    key: "vllm_cpp.pinned_h2d.registered",
};
/// MiB per registered window.
pub const REGISTERED_WINDOW_MIB: Knob = Knob {
    env: "VT_REGISTERED_WINDOW_MIB",
    key: "vllm_cpp.pinned_h2d.window_mib",
};
/// Weights with fewer whole-page MiB than this never take the registered
/// path.
pub const REGISTERED_MIN_MIB: Knob = Knob {
    env: "VT_REGISTERED_MIN_MIB",
    key: "vllm_cpp.pinned_h2d.registered_min_mib",
};
/// Registered windows at once over all lanes.
pub const REGISTERED_IN_FLIGHT: Knob = Knob {
    env: "VT_REGISTERED_IN_FLIGHT",
    key: "vllm_cpp.pinned_h2d.registered_in_flight",
};
/// The ring's knobs.
pub const RING_KNOBS: &[Knob] = &[
    PINNED_H2D_MIB,
    PINNED_H2D_BUFFERS,
    PINNED_H2D_READERS,
    PINNED_H2D_LANES,
    PINNED_H2D_DIRECT_BELOW,
    DIRECT_IO,
    REGISTERED_WINDOWS,
    REGISTERED_WINDOW_MIB,
    REGISTERED_MIN_MIB,
    REGISTERED_IN_FLIGHT,
];

/// Reader threads by default: one per core, at most 16 (page-cache copies
/// scale with cores; past 16 the bus is the limit).
pub fn default_readers() -> u64 {
    host_cores().clamp(2, 16)
}

/// `buf.len()` bytes of `file` (at `path`, for the error) from byte
/// `offset`, by `pread`: how the seam reads a file borrow it stages, so its
/// pages never enter the process.
pub(crate) fn read_exact_at(
    file: &File,
    path: &Path,
    offset: u64,
    buf: &mut [u8],
) -> Result<(), RingError> {
    file.read_exact_at(buf, offset)
        .map_err(|source| RingError::Read {
            path: path.display().to_string(),
            offset,
            source,
        })
}

/// Weights under this size skip the ring.
pub const DEFAULT_DIRECT_BELOW: u64 = 1 << 20;
/// MiB per registered window by default: four in flight stay within the
/// 96 MiB the issue allows beyond the ring.
pub const DEFAULT_WINDOW_MIB: u64 = 16;
/// Whole-page MiB below which a weight never takes the registered path.
pub const DEFAULT_REGISTERED_MIN_MIB: u64 = 64;
/// Registered windows in flight by default: four windows of 16 MiB stay
/// within the 96 MiB the issue allows beyond the ring.
pub const DEFAULT_WINDOWS_IN_FLIGHT: u64 = 4;

/// The ring's resolved knobs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingPolicy {
    /// MiB per buffer (0: no ring).
    pub mib: Resolved<u64>,
    /// Buffers.
    pub buffers: Resolved<u64>,
    /// Reader threads.
    pub readers: Resolved<u64>,
    /// Lanes.
    pub lanes: Resolved<u64>,
    /// Weights under this many bytes skip the ring.
    pub direct_below: Resolved<u64>,
    /// `O_DIRECT` reads.
    pub direct_io: Resolved<Mode>,
    /// Registered windows.
    pub registered: Resolved<Mode>,
    /// MiB per registered window.
    pub window_mib: Resolved<u64>,
    /// Whole-page MiB below which a weight is not registered.
    pub registered_min_mib: Resolved<u64>,
    /// Registered windows at once.
    pub registered_in_flight: Resolved<u64>,
    /// The host cores the device default was shaped for (this session's
    /// share of them when several load at once).
    pub cores: u64,
}

impl RingPolicy {
    /// Resolves the ring's knobs: environment, then config, then the
    /// device's default ([`device_default`] for a host of `cores` cores and
    /// a device with `caps`), else the built-in 4 x 64 MiB in 2 lanes, one
    /// reader per core (at most 16) and buffered reads.
    ///
    /// # Errors
    ///
    /// A value does not parse, or buffers, readers, lanes or the window is
    /// 0.
    pub fn resolve(
        env: &dyn Fn(&str) -> Option<String>,
        config: Option<&PolicyConfig>,
        cores: u64,
        caps: TransferCaps,
    ) -> Result<RingPolicy, PolicyError> {
        let (shape, source) = match device_default(cores, caps) {
            Some(shape) => (shape, Source::DeviceDefault),
            None => (RingConfig::default(), Source::BuiltIn),
        };
        let default = |value| Resolved {
            value,
            source: source.clone(),
        };
        let mode = |value| Resolved {
            value,
            source: source.clone(),
        };
        let policy = RingPolicy {
            mib: resolve_knob(
                PINNED_H2D_MIB,
                env,
                config,
                default(shape.buffer_bytes >> 20),
            )?,
            buffers: resolve_knob(PINNED_H2D_BUFFERS, env, config, default(shape.buffers))?,
            readers: resolve_knob(PINNED_H2D_READERS, env, config, default(shape.readers))?,
            lanes: resolve_knob(PINNED_H2D_LANES, env, config, default(shape.lanes))?,
            direct_below: resolve_knob(
                PINNED_H2D_DIRECT_BELOW,
                env,
                config,
                default(shape.direct_below),
            )?,
            direct_io: resolve_knob(DIRECT_IO, env, config, mode(shape.direct_io))?,
            registered: resolve_knob(REGISTERED_WINDOWS, env, config, mode(shape.registered))?,
            window_mib: resolve_knob(
                REGISTERED_WINDOW_MIB,
                env,
                config,
                default(shape.window_bytes >> 20),
            )?,
            registered_min_mib: resolve_knob(
                REGISTERED_MIN_MIB,
                env,
                config,
                default(shape.registered_min >> 20),
            )?,
            registered_in_flight: resolve_knob(
                REGISTERED_IN_FLIGHT,
                env,
                config,
                default(shape.windows_in_flight),
            )?,
            cores,
        };
        for (knob, r) in [
            (PINNED_H2D_BUFFERS, &policy.buffers),
            (PINNED_H2D_READERS, &policy.readers),
            (PINNED_H2D_LANES, &policy.lanes),
            (REGISTERED_IN_FLIGHT, &policy.registered_in_flight),
        ] {
            if r.value == 0 || r.value > 64 {
                return Err(PolicyError::BadValue {
                    source_name: source_name(knob, &r.source, config),
                    value: r.value.to_string(),
                    expected: "an integer in 1..=64",
                });
            }
        }
        for (knob, r, low) in [
            (PINNED_H2D_MIB, &policy.mib, 0),
            (REGISTERED_WINDOW_MIB, &policy.window_mib, 1),
            (REGISTERED_MIN_MIB, &policy.registered_min_mib, 0),
        ] {
            if r.value < low || r.value > 4096 {
                return Err(PolicyError::BadValue {
                    source_name: source_name(knob, &r.source, config),
                    value: r.value.to_string(),
                    expected: if low == 0 {
                        "MiB in 0..=4096"
                    } else {
                        "MiB in 1..=4096"
                    },
                });
            }
        }
        Ok(policy)
    }

    /// The ring's shape, or `None` when the ring is off (0 MiB).
    pub fn ring_config(&self) -> Option<RingConfig> {
        (self.mib.value > 0).then_some(RingConfig {
            buffer_bytes: self.mib.value << 20,
            buffers: self.buffers.value,
            readers: self.readers.value,
            direct_io: self.direct_io.value,
            direct_below: self.direct_below.value,
            lanes: self.lanes.value,
            registered: self.registered.value,
            window_bytes: self.window_mib.value << 20,
            registered_min: self.registered_min_mib.value << 20,
            windows_in_flight: self.registered_in_flight.value,
        })
    }

    /// The ring's part of the resolution line.
    pub fn summary_line(&self) -> String {
        format!(
            "ring: pinned_h2d_mib={} ({}), buffers={} ({}), readers={} ({}), lanes={} ({}), direct_below={} ({}), direct_io={} ({}), registered={} ({}), window_mib={} ({}), registered_min_mib={} ({}), registered_in_flight={} ({})",
            self.mib.value,
            self.mib.source,
            self.buffers.value,
            self.buffers.source,
            self.readers.value,
            self.readers.source,
            self.lanes.value,
            self.lanes.source,
            self.direct_below.value,
            self.direct_below.source,
            self.direct_io.value,
            self.direct_io.source,
            self.registered.value,
            self.registered.source,
            self.window_mib.value,
            self.window_mib.source,
            self.registered_min_mib.value,
            self.registered_min_mib.source,
            self.registered_in_flight.value,
            self.registered_in_flight.source,
        )
    }
}
