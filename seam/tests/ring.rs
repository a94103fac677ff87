//! The staging ring's rules, convicted by what a device and the page cache
//! see: concurrent stagers spread over the lanes and wait their turn when
//! every lane is busy; a ring reports pinned buffers exactly when its
//! backend gave it some and stages through them; `O_DIRECT` is used when
//! (and only when) the ring's shape says so; each reader advises the kernel
//! of the window it will read next, no other; readers that outnumber the
//! buffers refill each buffer with its next chunk in order.
//!
//! A hang is a failure here, not a stall: every staging runs under a
//! watchdog ([`within`]), so a ring that deadlocks fails its test.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, Condvar, Mutex};
use std::time::{Duration, Instant};

use platform_fake::{Event, FakeConfig, FakePlatform};
use seam::borrow::{Borrow, MapOptions, MappedFile, page_size};
use seam::gguf::GgmlType;
use seam::platform::{
    Backend, DeviceBuffer, DeviceError, DeviceId, HostRelease, PinnedBuffer, Platform, Queue,
    ResidencyPolicy, StageCounters, StagingCopy,
};
use seam::policy::WithPolicy;
use seam::ring::{Mode, RingConfig, StagingRing};
use seam::weight::{Role, Weight};
use seam::{Resident, resident_weight};
use seam_tools::demo::pseudo_random_bytes;

/// How long a staging may take before the test calls it hung.
const WATCHDOG: Duration = Duration::from_secs(15);

/// Runs `f` on its own thread and returns its result; panics if it does
/// not finish within [`WATCHDOG`] (a deadlocked ring) or panicked.
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(WATCHDOG) {
        Ok(v) => v,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: still staging after {WATCHDOG:?} (deadlocked)")
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("{what}: panicked"),
    }
}

fn owned(name: &str, bytes: Vec<u8>) -> Weight {
    let len = bytes.len() as u64;
    Weight::owned(name, GgmlType::I8, vec![len], Role::new("test"), bytes)
}

fn borrowed(name: &str, borrow: Borrow) -> Weight {
    let len = borrow.len();
    Weight::borrowed(name, GgmlType::I8, vec![len], Role::new("test"), borrow)
}

/// Stages `weight` and returns what the device holds for it.
#[track_caller]
fn stage_and_read_back(weight: &Weight, platform: &dyn Platform) -> Vec<u8> {
    let queue = platform.backend().create_queue().unwrap();
    let copy = match resident_weight(weight, platform, &*queue) {
        Ok(Resident::Device(copy)) => copy,
        other => panic!("{}: expected a device copy, got {other:?}", weight.name()),
    };
    let mut out = vec![0u8; copy.buffer().len() as usize];
    platform
        .backend()
        .read_back(copy.buffer(), 0, &mut out)
        .unwrap();
    out
}

/// Host memory standing in for a device's pinned memory: `len` bytes
/// starting `skew` bytes past a 4096-byte boundary.
struct HeapPinned {
    memory: Vec<u8>,
    start: usize,
    len: usize,
}

impl HeapPinned {
    fn new(len: usize, skew: usize) -> HeapPinned {
        let memory = vec![0u8; len + 8192];
        let start = (4096 - memory.as_ptr() as usize % 4096) % 4096 + skew;
        HeapPinned { memory, start, len }
    }
}

impl PinnedBuffer for HeapPinned {
    fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.memory[self.start..self.start + self.len]
    }
    fn as_slice(&self) -> &[u8] {
        &self.memory[self.start..self.start + self.len]
    }
}

/// What [`Hooked`] does besides the fake's work.
#[derive(Default)]
struct Hooks {
    /// Hand out pinned buffers (the fake has none).
    pinned: bool,
    /// Where they start past a 4096-byte boundary.
    pinned_skew: usize,
    /// Bytes fewer than asked for (a buffer exactly one chunk long).
    pinned_short: usize,
    /// Hold each copy this long before queuing it (a slow bus).
    copy_delay: Duration,
    /// Hold each copy until this many copies are being issued at once (or
    /// the watchdog's time passed).
    rendezvous: usize,
}

/// The fake device behind a backend with [`Hooks`]; it records the pinned
/// buffers it handed out, the source of every copy, and whether every
/// rendezvous was met.
struct Hooked {
    fake: FakePlatform,
    hooks: Hooks,
    pinned: Mutex<Vec<(usize, usize)>>,
    sources: Mutex<Vec<usize>>,
    arrived: Mutex<usize>,
    arrival: Condvar,
    rendezvous_missed: AtomicBool,
}

impl Hooked {
    fn new(hooks: Hooks) -> Hooked {
        Hooked {
            fake: FakePlatform::new(FakeConfig::default()),
            hooks,
            pinned: Mutex::new(Vec::new()),
            sources: Mutex::new(Vec::new()),
            arrived: Mutex::new(0),
            arrival: Condvar::new(),
            rendezvous_missed: AtomicBool::new(false),
        }
    }
}

impl Backend for Hooked {
    fn name(&self) -> String {
        "hooked-fake".into()
    }
    fn allocate(&self, len: u64) -> Result<Box<dyn DeviceBuffer>, DeviceError> {
        self.fake.backend().allocate(len)
    }
    fn create_queue(&self) -> Result<Box<dyn Queue>, DeviceError> {
        self.fake.backend().create_queue()
    }
    fn copy_to_device_async(&self, copy: StagingCopy<'_>) -> Result<(), DeviceError> {
        self.sources
            .lock()
            .unwrap()
            .push(copy.src().as_ptr() as usize);
        if self.hooks.rendezvous > 0 {
            let mut arrived = self.arrived.lock().unwrap();
            *arrived += 1;
            self.arrival.notify_all();
            let (arrived, wait) = self
                .arrival
                .wait_timeout_while(arrived, WATCHDOG / 2, |n| *n < self.hooks.rendezvous)
                .unwrap();
            if wait.timed_out() {
                self.rendezvous_missed.store(true, Ordering::SeqCst);
            }
            drop(arrived);
        }
        std::thread::sleep(self.hooks.copy_delay);
        self.fake.backend().copy_to_device_async(copy)
    }
    fn synchronize(&self, queue: &dyn Queue) -> Result<(), DeviceError> {
        self.fake.backend().synchronize(queue)
    }
    fn read_back(
        &self,
        src: &dyn DeviceBuffer,
        src_offset: u64,
        dst: &mut [u8],
    ) -> Result<(), DeviceError> {
        self.fake.backend().read_back(src, src_offset, dst)
    }
    fn allocate_pinned(&self, len: usize) -> Result<Option<Box<dyn PinnedBuffer>>, DeviceError> {
        if !self.hooks.pinned {
            return Ok(None);
        }
        let len = len - self.hooks.pinned_short;
        let buffer = HeapPinned::new(len, self.hooks.pinned_skew);
        self.pinned
            .lock()
            .unwrap()
            .push((buffer.as_slice().as_ptr() as usize, len));
        Ok(Some(Box::new(buffer)))
    }
    fn device_memory_is_host_addressable(&self) -> bool {
        self.fake.backend().device_memory_is_host_addressable()
    }
    fn host_pages_released(&self, release: &HostRelease) {
        self.fake.backend().host_pages_released(release);
    }
}

impl Platform for Hooked {
    fn backend(&self) -> &dyn Backend {
        self
    }
    fn device_id(&self) -> DeviceId {
        self.fake.device_id()
    }
    fn needs_weight_staging(&self) -> bool {
        self.fake.needs_weight_staging()
    }
    fn host_memory_is_device_addressable(&self) -> bool {
        self.fake.host_memory_is_device_addressable()
    }
    fn residency_policy(&self) -> ResidencyPolicy {
        self.fake.residency_policy()
    }
    fn stage_counters(&self) -> &StageCounters {
        self.fake.stage_counters()
    }
}

/// A ring of `buffers` buffers of `chunk` bytes in `lanes` lanes, read by
/// `readers` threads, buffered reads, every weight through it.
fn shape(chunk: u64, buffers: u64, readers: u64, lanes: u64) -> RingConfig {
    RingConfig {
        buffer_bytes: chunk,
        buffers,
        readers,
        direct_io: Mode::Off,
        direct_below: 1,
        lanes,
        registered: Mode::Off,
        ..RingConfig::default()
    }
}

/// Rule: a ring reports pinned buffers exactly when its backend handed it
/// pinned memory, and then every chunk is copied out of those buffers.
#[test]
fn a_ring_is_pinned_exactly_when_its_backend_has_pinned_memory_and_stages_through_it() {
    const CHUNK: u64 = 64 << 10;
    let config = shape(CHUNK, 2, 2, 1);
    let plain = FakePlatform::new(FakeConfig::default());
    let ring = StagingRing::new(plain.backend(), config).unwrap();
    assert!(!ring.is_pinned(), "the fake has no pinned memory");
    assert!(!ring.counts().pinned);

    let hooked = Hooked::new(Hooks {
        pinned: true,
        ..Hooks::default()
    });
    let ring = StagingRing::new(&hooked, config).unwrap();
    assert!(ring.is_pinned(), "every buffer came from allocate_pinned");
    assert!(ring.counts().pinned);
    let platform = WithPolicy::new(&hooked, hooked.residency_policy()).with_ring(ring);
    let bytes = pseudo_random_bytes(5, 5 * CHUNK as usize + 17);
    let weight = owned("pinned.large", bytes.clone());
    assert!(stage_and_read_back(&weight, &platform) == bytes);
    let pinned = hooked.pinned.lock().unwrap().clone();
    let sources = hooked.sources.lock().unwrap().clone();
    assert_eq!(pinned.len(), 2, "one pinned buffer per ring buffer");
    assert_eq!(sources.len(), 6, "six chunks");
    for src in sources {
        assert!(
            pinned
                .iter()
                .any(|&(start, len)| (start..start + len).contains(&src)),
            "a chunk was copied from {src:#x}, outside the pinned buffers {pinned:x?}"
        );
    }
}

/// Rule: with two lanes, two weights staged at the same time are in flight
/// at the same time (each copy waits until the other's copy is issued too;
/// one shared lane would leave the first waiting for the second forever).
#[test]
fn two_lanes_carry_two_weights_at_once() {
    within("two weights on two lanes", || {
        let hooked = Hooked::new(Hooks {
            rendezvous: 2,
            ..Hooks::default()
        });
        let ring = StagingRing::new(&hooked, shape(64 << 10, 2, 2, 2)).unwrap();
        assert_eq!(ring.lanes(), 2);
        let platform = WithPolicy::new(&hooked, hooked.residency_policy()).with_ring(ring);
        let start = Barrier::new(2);
        std::thread::scope(|s| {
            for seed in 0..2u64 {
                let (platform, start) = (&platform, &start);
                s.spawn(move || {
                    let bytes = pseudo_random_bytes(seed, 64 << 10);
                    let weight = owned(&format!("w{seed}"), bytes.clone());
                    start.wait();
                    assert!(stage_and_read_back(&weight, platform) == bytes);
                });
            }
        });
        assert!(
            !hooked.rendezvous_missed.load(Ordering::SeqCst),
            "a copy waited in vain for the other lane's copy: the weights were staged one after the other"
        );
    });
}

/// Rule: a ring has no more lanes than readers or buffers (each lane runs
/// at least one reader thread and holds at least one buffer, so more lanes
/// would run more threads or hold more memory than the knobs say).
#[test]
fn lanes_never_outnumber_the_readers_or_the_buffers() {
    let fake = FakePlatform::new(FakeConfig::default());
    for ((buffers, readers, lanes), want) in [
        ((8, 4, 6), 4),
        ((3, 8, 6), 3),
        ((8, 8, 6), 6),
        ((8, 8, 0), 1),
    ] {
        let ring =
            StagingRing::new(fake.backend(), shape(64 << 10, buffers, readers, lanes)).unwrap();
        assert_eq!(
            ring.lanes(),
            want,
            "{buffers} buffers, {readers} readers, {lanes} lanes"
        );
    }
}

/// Rule: when more weights are staged at once than there are lanes, each
/// waits for a lane in turn and every one lands intact (slow copies keep
/// every lane busy while the others arrive).
#[test]
fn stagers_beyond_the_lanes_wait_their_turn_and_all_land() {
    const STAGERS: u64 = 8;
    within("eight weights on two lanes", || {
        let hooked = Hooked::new(Hooks {
            copy_delay: Duration::from_millis(40),
            ..Hooks::default()
        });
        let ring = StagingRing::new(&hooked, shape(32 << 10, 2, 2, 2)).unwrap();
        let platform = WithPolicy::new(&hooked, hooked.residency_policy()).with_ring(ring);
        for round in 0..2u64 {
            let start = Barrier::new(STAGERS as usize);
            std::thread::scope(|s| {
                for i in 0..STAGERS {
                    let (platform, start) = (&platform, &start);
                    s.spawn(move || {
                        let bytes = pseudo_random_bytes(round * STAGERS + i, 32 << 10);
                        let weight = owned(&format!("r{round}.w{i}"), bytes.clone());
                        start.wait();
                        assert!(stage_and_read_back(&weight, platform) == bytes);
                    });
                }
            });
        }
        let counts = platform.staging_ring().unwrap().counts();
        assert_eq!(counts.transfers, 2 * STAGERS);
    });
}

/// Rule: readers that outnumber the buffers take each buffer in chunk
/// order: a buffer is refilled only with the chunk one ring-length after
/// the one it held, and only once that one's copy is queued. Every chunk is
/// then queued in file order and the device holds the bytes; a reader that
/// took a buffer out of turn would leave the issuer waiting forever.
#[test]
fn readers_beyond_the_buffers_refill_each_buffer_in_chunk_order() {
    const CHUNK: u64 = 4096;
    const CHUNKS: u64 = 24;
    within("eight readers on two buffers", || {
        let fake = FakePlatform::new(FakeConfig::default());
        let ring = StagingRing::new(fake.backend(), shape(CHUNK, 2, 8, 1)).unwrap();
        let platform = WithPolicy::new(&fake, fake.residency_policy()).with_ring(ring);
        for i in 0..150u64 {
            let bytes = pseudo_random_bytes(i, (CHUNKS * CHUNK - i) as usize);
            let weight = owned(&format!("w{i}"), bytes.clone());
            let before = fake.events().len();
            assert!(stage_and_read_back(&weight, &platform) == bytes, "w{i}");
            let offsets: Vec<u64> = fake.events()[before..]
                .iter()
                .filter_map(|e| match e {
                    Event::CopyQueued { offset, .. } => Some(*offset),
                    _ => None,
                })
                .collect();
            let expected: Vec<u64> = (0..CHUNKS).map(|c| c * CHUNK).collect();
            assert_eq!(offsets, expected, "w{i}");
        }
    });
}

/// A file of `len` pseudo-random bytes under the target's scratch
/// directory (on the disk of the build, which takes `O_DIRECT`; `/tmp` may
/// be a tmpfs, which does not).
struct ColdFile {
    _dir: tempfile::TempDir,
    path: PathBuf,
    bytes: Vec<u8>,
}

fn cold_file(seed: u64, len: usize) -> ColdFile {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("weights.bin");
    let bytes = pseudo_random_bytes(seed, len);
    std::fs::write(&path, &bytes).unwrap();
    let file = File::open(&path).unwrap();
    file.sync_all().unwrap();
    // Precondition: the file system takes O_DIRECT reads (else the ring
    // falls back to buffered reads and nothing here could tell).
    {
        use std::os::unix::fs::{FileExt, OpenOptionsExt};
        let direct = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .unwrap_or_else(|e| panic!("{}: O_DIRECT refused: {e}", path.display()));
        let mut block = memmap2::MmapMut::map_anon(4096).unwrap();
        direct
            .read_exact_at(&mut block, 0)
            .unwrap_or_else(|e| panic!("{}: O_DIRECT read failed: {e}", path.display()));
    }
    evict(&path);
    ColdFile {
        _dir: dir,
        path,
        bytes,
    }
}

/// Drops the (clean, synced) file's pages from the page cache and checks
/// they are gone.
fn evict(path: &Path) {
    let file = File::open(path).unwrap();
    for _ in 0..50 {
        // SAFETY: posix_fadvise only advises the kernel about an open
        // descriptor's range; it touches no memory of ours.
        let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0, "posix_fadvise(DONTNEED)");
        if cached_pages(path).iter().all(|&c| !c) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{}: the page cache kept the file", path.display());
}

/// For each page of the file, whether it is in the page cache (mincore on
/// a fresh mapping reports page-cache state).
fn cached_pages(path: &Path) -> Vec<bool> {
    let file = File::open(path).unwrap();
    // SAFETY: a read-only shared mapping of a file this test owns and does
    // not modify while it is mapped.
    let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
    let mut vec = vec![0u8; map.len().div_ceil(page_size() as usize)];
    // SAFETY: `map` is a live mapping of `map.len()` bytes at a page-aligned
    // address; `vec` has one byte per page of it.
    let rc = unsafe {
        libc::mincore(
            map.as_ptr() as *mut libc::c_void,
            map.len(),
            vec.as_mut_ptr(),
        )
    };
    assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
    vec.iter().map(|&b| b & 1 == 1).collect()
}

/// Stages `[offset, offset + len)` of the file at `path` (holding
/// `file_bytes`) through a ring of shape `config` and checks what the
/// device holds; the release leaves the page cache alone, so what the
/// ring's reads and advice cached stays observable.
fn stage_file_span(path: &Path, file_bytes: &[u8], offset: u64, len: u64, config: RingConfig) {
    let fake = FakePlatform::new(FakeConfig::default());
    let policy = ResidencyPolicy {
        drop_page_cache: false,
        ..fake.residency_policy()
    };
    let ring = StagingRing::new(fake.backend(), config).unwrap();
    let platform = WithPolicy::new(&fake, policy).with_ring(ring);
    let map = MappedFile::open(path, MapOptions { prefault: false }).unwrap();
    let weight = borrowed("file", Borrow::new(map, offset, len).unwrap());
    let got = stage_and_read_back(&weight, &platform);
    assert!(got == file_bytes[offset as usize..(offset + len) as usize]);
}

/// Pages `[first, end)` of the file.
fn pages(first: u64, end: u64) -> std::ops::Range<usize> {
    let page = page_size();
    (first / page) as usize..end.div_ceil(page) as usize
}

/// Rule: `direct_io` in the ring's shape decides how files are read: with
/// it, reads bypass the page cache (`O_DIRECT`); without it, they go
/// through it. The first chunk is the witness: no reader advises it, so
/// only its read can bring it into the page cache.
#[test]
fn direct_io_reads_bypass_the_page_cache_and_buffered_reads_fill_it() {
    const CHUNK: u64 = 128 << 10;
    const LEN: u64 = 4 * CHUNK;
    for direct_io in [Mode::On, Mode::Off] {
        let cold = cold_file(11, LEN as usize);
        let config = RingConfig {
            direct_io,
            ..shape(CHUNK, 2, 1, 1)
        };
        let (path, bytes) = (cold.path.clone(), cold.bytes.clone());
        within("a file through the ring", move || {
            stage_file_span(&path, &bytes, 0, LEN, config);
        });
        let cached = cached_pages(&cold.path);
        let first_chunk = &cached[pages(0, CHUNK)];
        if direct_io == Mode::On {
            assert!(
                first_chunk.iter().all(|&c| !c),
                "direct_io: the first chunk was read through the page cache: {first_chunk:?}"
            );
        } else {
            assert!(
                first_chunk.iter().all(|&c| c),
                "buffered: the first chunk's read left it outside the page cache: {first_chunk:?}"
            );
        }
    }
}

/// Rule: `O_DIRECT` reads go only into 4096-aligned memory; a backend's
/// pinned buffer that is not (here 512 bytes past a boundary, which the
/// disk itself would accept) is filled with buffered reads instead, so the
/// first chunk lands in the page cache even with `direct_io` set.
#[test]
fn direct_io_into_unaligned_pinned_memory_falls_back_to_buffered_reads() {
    const CHUNK: u64 = 128 << 10;
    const LEN: u64 = 4 * CHUNK;
    let cold = cold_file(17, LEN as usize);
    let (path, bytes) = (cold.path.clone(), cold.bytes.clone());
    within("a file through unaligned pinned buffers", move || {
        let hooked = Hooked::new(Hooks {
            pinned: true,
            pinned_skew: 512,
            ..Hooks::default()
        });
        let config = RingConfig {
            direct_io: Mode::On,
            ..shape(CHUNK, 2, 1, 1)
        };
        let ring = StagingRing::new(&hooked, config).unwrap();
        let policy = ResidencyPolicy {
            drop_page_cache: false,
            ..hooked.residency_policy()
        };
        let platform = WithPolicy::new(&hooked, policy).with_ring(ring);
        let map = MappedFile::open(&path, MapOptions { prefault: false }).unwrap();
        let weight = borrowed("file", Borrow::new(map, 0, LEN).unwrap());
        assert!(stage_and_read_back(&weight, &platform) == bytes);
    });
    let cached = cached_pages(&cold.path);
    let first_chunk = &cached[pages(0, CHUNK)];
    assert!(
        first_chunk.iter().all(|&c| c),
        "the first chunk was read with O_DIRECT into unaligned memory: {first_chunk:?}"
    );
}

/// Rule: an `O_DIRECT` read stays inside the slot's memory. With pinned
/// buffers exactly one chunk long, a chunk at an aligned offset fills the
/// buffer to its last byte and is read directly (it stays out of the page
/// cache); a chunk at an unaligned offset would need the aligned blocks
/// around it, more than the buffer holds, and is read buffered (cached).
#[test]
fn direct_reads_stay_inside_the_pinned_buffer() {
    const CHUNK: u64 = 128 << 10;
    const LEN: u64 = 2 * CHUNK;
    for (offset, direct) in [(0u64, true), (512, false)] {
        let cold = cold_file(19, (LEN + 4096) as usize);
        let (path, bytes) = (cold.path.clone(), cold.bytes.clone());
        within("a file through one-chunk pinned buffers", move || {
            let hooked = Hooked::new(Hooks {
                pinned: true,
                pinned_short: 8192,
                ..Hooks::default()
            });
            let config = RingConfig {
                direct_io: Mode::On,
                ..shape(CHUNK, 2, 1, 1)
            };
            let ring = StagingRing::new(&hooked, config).unwrap();
            let policy = ResidencyPolicy {
                drop_page_cache: false,
                ..hooked.residency_policy()
            };
            let platform = WithPolicy::new(&hooked, policy).with_ring(ring);
            let map = MappedFile::open(&path, MapOptions { prefault: false }).unwrap();
            let weight = borrowed("file", Borrow::new(map, offset, LEN).unwrap());
            let expected = &bytes[offset as usize..(offset + LEN) as usize];
            assert!(stage_and_read_back(&weight, &platform) == expected);
        });
        let cached = cached_pages(&cold.path);
        // The chunk's whole pages (an unaligned chunk's first page is
        // shared with nothing the ring reads otherwise).
        let first_chunk = &cached[pages(offset, offset + CHUNK)];
        assert!(
            first_chunk.iter().all(|&c| c != direct),
            "offset {offset}: expected the first chunk read {}: {first_chunk:?}",
            if direct { "directly" } else { "buffered" }
        );
    }
}

/// Rule: each reader, having filled chunk `c`, advises the kernel to read
/// chunk `c + readers` of the weight's span (the next it will read), and
/// nothing else. The last `readers` chunks' advice reaches past the span:
/// with the kernel's own readahead off for the file (`FADV_RANDOM`, so a
/// buffered read caches only what it reads), exactly the first `readers`
/// chunk-lengths after the span end up in the page cache (the advice is
/// asynchronous: waited for); the rest of the file after the span, and the
/// bytes before it, never.
#[test]
fn each_reader_advises_exactly_the_window_it_reads_next() {
    const CHUNK: u64 = 128 << 10;
    const CHUNKS: u64 = 8;
    const READERS: u64 = 2;
    // A page-aligned span after a prefix, followed by a tail of 4 chunks.
    const OFFSET: u64 = 64 << 10;
    const END: u64 = OFFSET + CHUNKS * CHUNK;
    const FILE_LEN: u64 = END + 4 * CHUNK;
    let cold = cold_file(13, FILE_LEN as usize);
    let (path, bytes) = (cold.path.clone(), cold.bytes.clone());
    within("a file through the ring", move || {
        let fake = FakePlatform::new(FakeConfig::default());
        let policy = ResidencyPolicy {
            drop_page_cache: false,
            ..fake.residency_policy()
        };
        let ring = StagingRing::new(fake.backend(), shape(CHUNK, 2, READERS, 1)).unwrap();
        let platform = WithPolicy::new(&fake, policy).with_ring(ring);
        let map = MappedFile::open(&path, MapOptions { prefault: false }).unwrap();
        let fd = map.file().expect("a file-backed mapping").as_raw_fd();
        // SAFETY: posix_fadvise only advises the kernel about an open
        // descriptor; it touches no memory of ours.
        let rc = unsafe { libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_RANDOM) };
        assert_eq!(rc, 0, "posix_fadvise(RANDOM)");
        let weight = borrowed("file", Borrow::new(map, OFFSET, CHUNKS * CHUNK).unwrap());
        assert!(stage_and_read_back(&weight, &platform) == bytes[OFFSET as usize..END as usize]);
    });
    let advised = pages(END, END + READERS * CHUNK);
    let deadline = Instant::now() + WATCHDOG / 2;
    let cached = loop {
        let cached = cached_pages(&cold.path);
        if cached[advised.clone()].iter().all(|&c| c) || Instant::now() > deadline {
            break cached;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let count = |r: std::ops::Range<usize>| cached[r].iter().filter(|&&c| c).count();
    let (before, tail_rest) = (pages(0, OFFSET), pages(END + READERS * CHUNK, FILE_LEN));
    assert_eq!(
        (count(advised.clone()), count(before), count(tail_rest)),
        (advised.len(), 0, 0),
        "cached pages: advised past the span, before the span, rest of the file: {cached:?}"
    );
}

/// Rule: the ring's counts (buffers, readers, lanes) take 1..=64 and its
/// buffer size 0..=4096 MiB; a value outside is an error naming the
/// variable, a value at either end is taken.
#[test]
fn ring_knobs_take_their_ranges_to_the_ends_and_refuse_past_them() {
    use seam::ring::RingPolicy;
    let resolve = |var: &'static str, value: &'static str| {
        RingPolicy::resolve(
            &move |v: &str| (v == var).then(|| value.to_string()),
            None,
            16,
            Default::default(),
        )
    };
    for var in [
        "VT_PINNED_H2D_BUFFERS",
        "VT_PINNED_H2D_READERS",
        "VT_PINNED_H2D_LANES",
    ] {
        for ok in ["1", "64"] {
            assert!(resolve(var, ok).is_ok(), "{var}={ok} refused");
        }
        for bad in ["0", "65"] {
            let err = resolve(var, bad).expect_err(&format!("{var}={bad} taken"));
            assert!(err.to_string().contains(var), "{err}");
        }
    }
    for ok in ["0", "4096"] {
        assert!(resolve("VT_PINNED_H2D_MIB", ok).is_ok(), "mib={ok} refused");
    }
    let err = resolve("VT_PINNED_H2D_MIB", "4097").expect_err("mib=4097 taken");
    assert!(err.to_string().contains("VT_PINNED_H2D_MIB"), "{err}");
}
