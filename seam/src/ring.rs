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

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

use memmap2::MmapMut;

use crate::backend::{Backend, DeviceBuffer, DeviceError, PinnedBuffer, Queue, StagingCopy};
use crate::knob::{
    Knob, PolicyConfig, PolicyError, Resolved, Source, Switch, resolve_knob, source_name,
};

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
    /// Read files with `O_DIRECT` (falls back to buffered reads where the
    /// file system refuses it).
    pub direct_io: bool,
    /// Weights smaller than this many bytes are copied directly from their
    /// host bytes (a chunked pipeline costs more than it saves for them).
    pub direct_below: u64,
    /// Independent pipelines sharing the buffers and readers, so several
    /// weights can be staged at once.
    pub lanes: u64,
}

impl Default for RingConfig {
    /// The built-in shape: 4 x 64 MiB in 2 lanes, one reader per core (at
    /// most 16), buffered reads, weights under 1 MiB copied directly.
    fn default() -> Self {
        RingConfig {
            buffer_bytes: 64 << 20,
            buffers: 4,
            readers: default_readers(),
            direct_io: false,
            direct_below: DEFAULT_DIRECT_BELOW,
            lanes: 2,
        }
    }
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
}

/// A ring of host buffers for chunked host-to-device copies.
pub struct StagingRing {
    config: RingConfig,
    pinned: bool,
    transfers: AtomicU64,
    transferred_bytes: AtomicU64,
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
        let lanes = config.lanes.clamp(1, config.buffers.max(1));
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
            transfers: AtomicU64::new(0),
            transferred_bytes: AtomicU64::new(0),
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
            if let Ok(guard) = lane.try_lock() {
                return guard;
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
        RingCounts {
            transfers: self.transfers.load(Ordering::Relaxed),
            bytes: self.transferred_bytes.load(Ordering::Relaxed),
            pinned: self.pinned,
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
        let lane = self.acquire_lane();
        let lane = &*lane;
        let direct = match source {
            RingSource::File { path, .. } if self.config.direct_io => open_direct(path),
            _ => None,
        };
        let chunk_bytes = self.config.buffer_bytes.max(1);
        let chunks = len.div_ceil(chunk_bytes);
        let next_chunk = AtomicU64::new(0);
        let failed = AtomicBool::new(false);
        let first_error: Mutex<Option<RingError>> = Mutex::new(None);
        let fail = |e: RingError| {
            lock(&first_error).get_or_insert(e);
            failed.store(true, Ordering::SeqCst);
            for slot in &lane.slots {
                let _guard = lock(&slot.state);
                slot.changed.notify_all();
            }
        };
        std::thread::scope(|scope| {
            for _ in 0..lane.readers {
                scope.spawn(|| {
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
                            direct.as_ref(),
                            pos,
                            want,
                            &failed,
                        ) {
                            fail(e);
                            return;
                        }
                        readahead(source, pos + chunk_bytes * lane.readers, chunk_bytes);
                    }
                });
            }
            for chunk in 0..chunks {
                if let Err(e) = self.issue(lane, backend, chunk, dst, chunk_bytes, &failed) {
                    fail(e);
                    return;
                }
            }
        });
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
        match lock(&first_error).take().or(drain_error) {
            Some(e) => Err(e),
            None => {
                self.transfers.fetch_add(1, Ordering::Relaxed);
                self.transferred_bytes.fetch_add(len, Ordering::Relaxed);
                Ok(())
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
        let start = read_chunk(source, direct, pos, want, memory.bytes_mut())?;
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
        chunk_bytes: u64,
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
        // SAFETY: the slot's bytes stay valid and unchanged until its queue
        // is synchronized: a reader synchronizes the queue before refilling
        // the slot (`fill`), and `transfer` synchronizes every in-flight
        // slot before returning; the ring (and its memory) outlives both.
        let copy = unsafe { StagingCopy::new(bytes, dst, chunk * chunk_bytes, &*slot.queue) };
        backend.copy_to_device_async(copy)?;
        drop(memory);
        *state = SlotState::InFlight(chunk);
        slot.changed.notify_all();
        Ok(())
    }
}

fn open_direct(path: &Path) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .ok()
}

/// Reads `want` bytes at `pos` of `source` into `buf`; returns where in
/// `buf` they start (non-zero only for an aligned `O_DIRECT` read).
fn read_chunk(
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
        RingSource::File { file, path, offset } => {
            let at = offset + pos;
            if let Some(direct) = direct
                && let Some(start) = read_direct(direct, at, want, buf)
            {
                return Ok(start);
            }
            file.read_exact_at(&mut buf[..want], at)
                .map_err(|source| RingError::Read {
                    path: path.display().to_string(),
                    offset: at,
                    source,
                })?;
            Ok(0)
        }
    }
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
/// Weights under this many bytes skip the ring (copied directly).
pub const PINNED_H2D_DIRECT_BELOW: Knob = Knob {
    env: "VT_PINNED_H2D_DIRECT_BELOW",
    key: "vllm_cpp.pinned_h2d.direct_below",
};
/// Read with `O_DIRECT`.
pub const DIRECT_IO: Knob = Knob {
    env: "VT_GGUF_DIRECT_IO",
    key: "vllm_cpp.mmap.direct_io",
};
/// The ring's knobs.
pub const RING_KNOBS: &[Knob] = &[
    PINNED_H2D_MIB,
    PINNED_H2D_BUFFERS,
    PINNED_H2D_READERS,
    PINNED_H2D_LANES,
    PINNED_H2D_DIRECT_BELOW,
    DIRECT_IO,
];

/// Reader threads by default: one per core, at most 16 (page-cache copies
/// scale with cores; past 16 the bus is the limit).
pub fn default_readers() -> u64 {
    std::thread::available_parallelism()
        .map_or(4, |n| n.get() as u64)
        .clamp(2, 16)
}

/// Weights under this size skip the ring.
pub const DEFAULT_DIRECT_BELOW: u64 = 1 << 20;

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
    pub direct_io: Resolved<Switch>,
}

impl RingPolicy {
    /// Resolves the ring's knobs: environment, then config, then the
    /// built-in 4 x 64 MiB in 2 lanes, one reader per core (at most 16) and
    /// buffered reads.
    ///
    /// # Errors
    ///
    /// A value does not parse, or buffers or readers is 0.
    pub fn resolve(
        env: &dyn Fn(&str) -> Option<String>,
        config: Option<&PolicyConfig>,
    ) -> Result<RingPolicy, PolicyError> {
        let built_in = |value| Resolved {
            value,
            source: Source::BuiltIn,
        };
        let shape = RingConfig::default();
        let policy = RingPolicy {
            mib: resolve_knob(
                PINNED_H2D_MIB,
                env,
                config,
                built_in(shape.buffer_bytes >> 20),
            )?,
            buffers: resolve_knob(PINNED_H2D_BUFFERS, env, config, built_in(shape.buffers))?,
            readers: resolve_knob(PINNED_H2D_READERS, env, config, built_in(shape.readers))?,
            lanes: resolve_knob(PINNED_H2D_LANES, env, config, built_in(shape.lanes))?,
            direct_below: resolve_knob(
                PINNED_H2D_DIRECT_BELOW,
                env,
                config,
                built_in(shape.direct_below),
            )?,
            direct_io: resolve_knob(
                DIRECT_IO,
                env,
                config,
                Resolved {
                    value: Switch(shape.direct_io),
                    source: Source::BuiltIn,
                },
            )?,
        };
        for (knob, r) in [
            (PINNED_H2D_BUFFERS, &policy.buffers),
            (PINNED_H2D_READERS, &policy.readers),
            (PINNED_H2D_LANES, &policy.lanes),
        ] {
            if r.value == 0 || r.value > 64 {
                return Err(PolicyError::BadValue {
                    source_name: source_name(knob, &r.source, config),
                    value: r.value.to_string(),
                    expected: "an integer in 1..=64",
                });
            }
        }
        if policy.mib.value > 4096 {
            return Err(PolicyError::BadValue {
                source_name: source_name(PINNED_H2D_MIB, &policy.mib.source, config),
                value: policy.mib.value.to_string(),
                expected: "MiB in 0..=4096",
            });
        }
        Ok(policy)
    }

    /// The ring's shape, or `None` when the ring is off (0 MiB).
    pub fn ring_config(&self) -> Option<RingConfig> {
        (self.mib.value > 0).then_some(RingConfig {
            buffer_bytes: self.mib.value << 20,
            buffers: self.buffers.value,
            readers: self.readers.value,
            direct_io: self.direct_io.value.0,
            direct_below: self.direct_below.value,
            lanes: self.lanes.value,
        })
    }

    /// The ring's part of the resolution line.
    pub fn summary_line(&self) -> String {
        format!(
            "ring: pinned_h2d_mib={} ({}), buffers={} ({}), readers={} ({}), lanes={} ({}), direct_below={} ({}), direct_io={} ({})",
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
            self.direct_io.source
        )
    }
}
