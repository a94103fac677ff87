//! The ring's rules, each on given facts: the device default shape, the
//! three-way knobs, the per-chunk read choice, the window plan and the
//! registered path's choice, the bound on windows in flight, and the
//! order of a lane's buffers (a reader and the issuer each on a slot).

use std::collections::BTreeMap;

use super::budget::InFlightBudget;
use super::direct::{self, Mode, reads_direct, resident_share};
use super::registered::{plan_windows, registers_window, takes_registered_path};
use super::{
    DEFAULT_WINDOWS_IN_FLIGHT, RingConfig, RingPolicy, RingSource, SlotState, StagingRing,
    device_default, host_cores, lock,
};
use crate::backend::{Backend, DeviceBuffer, DeviceError, Queue, StagingCopy, TransferCaps};
use crate::knob::{KnobValue, PolicyConfig, Source};

const MIB: u64 = 1 << 20;
const DMA: TransferCaps = TransferCaps {
    pinned_dma: true,
    register_host: true,
};

#[test]
fn a_dma_device_gets_the_measured_shape_scaled_to_the_host() {
    // The H200 machine: 16 cores -> the tuned 16 x 8 MiB, 4 lanes, 16
    // readers, auto reads.
    let h200 = device_default(16, DMA).unwrap();
    assert_eq!(
        (h200.buffers, h200.buffer_bytes, h200.lanes, h200.readers),
        (16, 8 * MIB, 4, 16)
    );
    assert_eq!(h200.direct_io, Mode::Auto);
    assert_eq!(h200.registered, Mode::Off);
    assert_eq!(h200.total_bytes(), 128 * MIB);
    // Readers follow the cores (2..=24), a buffer per reader (at least
    // 16), lanes one per 4 readers (1..=6).
    for (cores, readers, buffers, lanes) in [
        (1, 2, 16, 1),
        (2, 2, 16, 1),
        (7, 7, 16, 1),
        (8, 8, 16, 2),
        (12, 12, 16, 3),
        (17, 17, 17, 4),
        (24, 24, 24, 6),
        (32, 24, 24, 6),
        (128, 24, 24, 6),
    ] {
        let shape = device_default(cores, DMA).unwrap();
        assert_eq!(
            (shape.readers, shape.buffers, shape.lanes),
            (readers, buffers, lanes),
            "{cores} cores"
        );
        assert_eq!(shape.buffer_bytes, 8 * MIB);
    }
    // A device whose copy is a memcpy (fake, sink) keeps the built-in shape.
    let memcpy = TransferCaps {
        pinned_dma: false,
        register_host: true,
    };
    assert_eq!(device_default(16, memcpy), None);
    assert_eq!(device_default(16, TransferCaps::default()), None);
}

fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn the_resolution_line_says_device_default_and_knobs_still_win() {
    let none = vars(&[]);
    let p = RingPolicy::resolve(&|k| none.get(k).cloned(), None, 16, DMA).unwrap();
    assert_eq!(p.ring_config(), device_default(16, DMA));
    for source in [
        &p.mib.source,
        &p.buffers.source,
        &p.lanes.source,
        &p.readers.source,
    ] {
        assert_eq!(*source, Source::DeviceDefault);
    }
    assert_eq!(p.direct_io.source, Source::DeviceDefault);
    let line = p.summary_line();
    assert!(line.contains("pinned_h2d_mib=8 (device default)"), "{line}");
    assert!(line.contains("lanes=4 (device default)"), "{line}");
    assert!(line.contains("direct_io=auto (device default)"), "{line}");

    let env = vars(&[("VT_PINNED_H2D_MIB", "64"), ("VT_GGUF_DIRECT_IO", "off")]);
    let p = RingPolicy::resolve(&|k| env.get(k).cloned(), None, 16, DMA).unwrap();
    assert_eq!(p.mib.value, 64);
    assert_eq!(p.mib.source, Source::Env("VT_PINNED_H2D_MIB"));
    assert_eq!(p.direct_io.value, Mode::Off);
    assert_eq!(p.buffers.source, Source::DeviceDefault);
    let config = PolicyConfig::parse(
        std::path::Path::new("c.json"),
        r#"{"vllm_cpp.pinned_h2d.lanes": 2, "vllm_cpp.pinned_h2d.registered": "auto"}"#,
        super::RING_KNOBS,
    )
    .unwrap();
    let p = RingPolicy::resolve(&|k| none.get(k).cloned(), Some(&config), 16, DMA).unwrap();
    assert_eq!((p.lanes.value, p.registered.value), (2, Mode::Auto));
    assert_eq!(p.lanes.source, Source::Config("vllm_cpp.pinned_h2d.lanes"));

    // No DMA: the built-in shape, and the line says so.
    let p =
        RingPolicy::resolve(&|k| none.get(k).cloned(), None, 16, TransferCaps::default()).unwrap();
    assert_eq!(p.ring_config(), Some(RingConfig::default()));
    assert_eq!(p.mib.source, Source::BuiltIn);
    assert!(
        p.summary_line()
            .contains("pinned_h2d_mib=64 (built-in default)")
    );

    for (k, v) in [
        ("VT_REGISTERED_WINDOW_MIB", "0"),
        ("VT_REGISTERED_MIN_MIB", "5000"),
        ("VT_REGISTERED_WINDOWS", "sometimes"),
    ] {
        let env = vars(&[(k, v)]);
        let err = RingPolicy::resolve(&|n| env.get(n).cloned(), None, 16, DMA).unwrap_err();
        assert!(err.to_string().contains(k), "{err}");
    }
    // The range an error states is the knob's own: a window may not be 0
    // MiB, a minimum may.
    for (k, v, range) in [
        ("VT_REGISTERED_WINDOW_MIB", "0", "MiB in 1..=4096"),
        ("VT_REGISTERED_MIN_MIB", "5000", "MiB in 0..=4096"),
        ("VT_PINNED_H2D_MIB", "5000", "MiB in 0..=4096"),
    ] {
        let env = vars(&[(k, v)]);
        let err = RingPolicy::resolve(&|n| env.get(n).cloned(), None, 16, DMA).unwrap_err();
        assert!(err.to_string().contains(range), "{k}: {err}");
    }
}

#[test]
fn three_way_knobs_read_on_off_and_auto() {
    for (text, mode) in [
        ("auto", Mode::Auto),
        (" AUTO ", Mode::Auto),
        ("on", Mode::On),
        ("1", Mode::On),
        ("yes", Mode::On),
        ("off", Mode::Off),
        ("0", Mode::Off),
        ("false", Mode::Off),
    ] {
        assert_eq!(Mode::from_env(text), Some(mode), "{text:?}");
    }
    assert_eq!(Mode::from_env("2"), None);
    assert_eq!(Mode::from_json(&serde_json::json!(true)), Some(Mode::On));
    assert_eq!(Mode::from_json(&serde_json::json!(0)), Some(Mode::Off));
    assert_eq!(Mode::from_json(&serde_json::json!(1)), Some(Mode::On));
    assert_eq!(
        Mode::from_json(&serde_json::json!("auto")),
        Some(Mode::Auto)
    );
    assert_eq!(Mode::from_json(&serde_json::json!(2)), None);
    assert_eq!(Mode::from_json(&serde_json::json!(null)), None);
    assert_eq!(
        [Mode::Off, Mode::On, Mode::Auto].map(|m| m.to_string()),
        ["off", "on", "auto"]
    );
}

#[test]
fn auto_reads_a_chunk_directly_only_when_the_cache_holds_less_than_half() {
    assert!(!reads_direct(Mode::Off, Some(0.0)));
    assert!(reads_direct(Mode::On, Some(1.0)));
    assert!(reads_direct(Mode::Auto, Some(0.0)));
    assert!(reads_direct(Mode::Auto, Some(0.49)));
    assert!(!reads_direct(Mode::Auto, Some(0.5)));
    assert!(!reads_direct(Mode::Auto, Some(1.0)));
    assert!(!reads_direct(Mode::Auto, None), "unknown: buffered");
}

#[test]
fn mincore_sees_what_the_page_cache_holds_of_a_file() {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.bin");
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(&vec![7u8; 4 << 20]).unwrap();
    f.sync_all().unwrap();
    // SAFETY: advice on an open descriptor; touches no memory.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let map = crate::borrow::MappedFile::open(&path, Default::default()).unwrap();
    let cold = resident_share(map.bytes()).unwrap();
    assert!(cold < 0.1, "after DONTNEED {cold}");
    let _ = std::fs::read(&path).unwrap();
    let warm = resident_share(map.bytes()).unwrap();
    assert!((0.9..=1.0).contains(&warm), "after a read {warm}");
    // A share, not a count: the pages cached over the pages asked about.
    let page_count = |n: usize| &map.bytes()[..n * crate::borrow::page_size() as usize];
    assert_eq!(resident_share(page_count(3)), Some(1.0));
    // An unaligned range is asked about its whole pages.
    let page = crate::borrow::page_size() as usize;
    assert_eq!(resident_share(&map.bytes()[page + 1..page + 2]), Some(1.0));
    assert_eq!(resident_share(&[]), None);
}

/// Checks a plan covers `[0, len)` in order, every window whole pages.
fn check_plan(addr: u64, len: u64, page: u64, window: u64) {
    let plan = plan_windows(addr, len, page, window);
    let mut at = plan.head.end;
    assert_eq!(plan.head.start, 0);
    for w in &plan.windows {
        assert_eq!(w.start, at, "{addr:#x}+{len}: contiguous");
        assert!(w.end > w.start);
        assert_eq!((addr + w.start) % page, 0, "window start on a page");
        assert_eq!((w.end - w.start) % page, 0, "whole pages");
        assert!(w.end - w.start <= window.max(page));
        at = w.end;
    }
    assert_eq!(plan.tail.start, at);
    assert_eq!(plan.tail.end, len);
    assert!(
        plan.head.end < page && plan.tail.end - plan.tail.start < page || plan.windows.is_empty()
    );
}

#[test]
fn windows_are_whole_pages_and_the_edges_go_to_the_ring() {
    let page = 4096;
    let plan = plan_windows(0x1000_0010, 10 * page, page, 4 * page);
    assert_eq!(plan.head, 0..page - 0x10);
    assert_eq!(
        plan.windows,
        vec![
            page - 0x10..5 * page - 0x10,
            5 * page - 0x10..9 * page - 0x10,
            9 * page - 0x10..10 * page - 0x10
        ]
    );
    assert_eq!(plan.tail, 10 * page - 0x10..10 * page);
    // Aligned both ends: no edges.
    let plan = plan_windows(0x2000_0000, 8 * page, page, 16 * page);
    assert_eq!((plan.head, plan.tail.clone()), (0..0, 8 * page..8 * page));
    assert_eq!(plan.windows, vec![0..8 * page]);
    // No whole page: all through the ring.
    for (addr, len) in [(0x10, 100), (0x10, page), (page - 1, 2), (0, page - 1)] {
        let plan = plan_windows(addr, len, page, 4 * page);
        assert!(plan.windows.is_empty(), "{addr}+{len}");
        assert_eq!(plan.head, 0..len);
    }
    for addr in [0, 1, page - 1, page, 3 * page + 17] {
        for len in [0, 1, page, page + 1, 3 * page - 5, 40 * page + 3] {
            for window in [1, page, 3 * page + 5, 64 * page] {
                check_plan(addr, len, page, window);
            }
        }
    }
}

#[test]
fn neighbouring_spans_never_share_a_registered_page() {
    let page = 4096;
    // Two weights back to back, the boundary inside a page.
    for split in [1, page - 1, page + 5, 7 * page + 3] {
        let (a, b) = ((0x10_0000 + 17, split), (0x10_0000 + 17 + split, 9 * page));
        let pa = plan_windows(a.0, a.1, page, 2 * page);
        let pb = plan_windows(b.0, b.1, page, 2 * page);
        let pages = |base: u64, p: &super::registered::WindowPlan| -> Vec<u64> {
            p.windows
                .iter()
                .flat_map(|w| ((base + w.start) / page)..((base + w.end) / page))
                .collect()
        };
        let (x, y) = (pages(a.0, &pa), pages(b.0, &pb));
        assert!(
            x.iter().all(|p| !y.contains(p)),
            "split {split}: {x:?} {y:?}"
        );
    }
}

#[test]
fn the_registered_path_is_taken_only_when_allowed_able_and_large() {
    let min = 64 * MIB;
    assert!(takes_registered_path(Mode::On, DMA, min, min));
    assert!(takes_registered_path(Mode::Auto, DMA, 2 * min, min));
    assert!(
        !takes_registered_path(Mode::On, DMA, min - 1, min),
        "small weights use the ring"
    );
    assert!(!takes_registered_path(Mode::Off, DMA, 10 * min, min));
    let unable = TransferCaps {
        pinned_dma: true,
        register_host: false,
    };
    assert!(!takes_registered_path(Mode::On, unable, 10 * min, min));
    assert!(
        !takes_registered_path(Mode::On, DMA, 0, 0),
        "nothing to register"
    );
    // Per window: auto registers what the page cache holds.
    assert!(registers_window(Mode::On, None));
    assert!(!registers_window(Mode::Off, Some(1.0)));
    assert!(registers_window(Mode::Auto, Some(0.9)));
    assert!(!registers_window(Mode::Auto, Some(0.1)));
    assert!(!registers_window(Mode::Auto, None));
    assert_eq!(direct::AUTO_DIRECT_BELOW_RESIDENT, 0.5);
}

#[test]
fn windows_in_flight_never_exceed_the_budget() {
    let budget = InFlightBudget::new(DEFAULT_WINDOWS_IN_FLIGHT);
    let held = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..8 {
            let (budget, held) = (&budget, &held);
            s.spawn(move || {
                for i in 0..200 {
                    if (t + i) % 3 == 0 {
                        budget.take();
                    } else if !budget.try_take() {
                        continue;
                    }
                    let now = held.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                    assert!(now <= DEFAULT_WINDOWS_IN_FLIGHT, "{now} in flight");
                    std::thread::yield_now();
                    held.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    budget.give();
                }
            });
        }
    });
    assert!(budget.peak() <= DEFAULT_WINDOWS_IN_FLIGHT);
    assert!(budget.peak() >= 1);
    for _ in 0..DEFAULT_WINDOWS_IN_FLIGHT {
        assert!(budget.try_take());
    }
    assert!(!budget.try_take(), "a fifth window waits");
    budget.give();
    assert!(budget.try_take());
}

#[test]
fn the_window_budget_is_its_limit_and_at_least_one() {
    for (limit, takes) in [(2, 2), (9, 9), (0, 1)] {
        let budget = InFlightBudget::new(limit);
        for _ in 0..takes {
            assert!(budget.try_take(), "limit {limit}");
        }
        assert!(!budget.try_take(), "limit {limit}: one more waits");
        assert_eq!(budget.peak(), takes);
    }
}

#[test]
fn a_refused_direct_read_is_none_so_the_caller_reads_buffered() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.bin");
    let bytes: Vec<u8> = (0..3 * 4096 + 100).map(|i| (i % 251) as u8).collect();
    std::fs::File::create(&path)
        .unwrap()
        .write_all(&bytes)
        .unwrap();
    let Some(file) = super::open_direct(&path) else {
        return; // this file system refuses O_DIRECT at open: the same fallback
    };
    let mut aligned = memmap2::MmapMut::map_anon(6 * 4096).unwrap();
    // An unaligned offset and length read the aligned blocks around them.
    let start = super::read_direct(&file, 4096 + 7, 5000, &mut aligned).unwrap();
    assert_eq!(start, 7);
    assert_eq!(&aligned[7..5007], &bytes[4096 + 7..4096 + 5007]);
    // The end of the file: a short last block is enough.
    let start = super::read_direct(&file, 3 * 4096, 100, &mut aligned).unwrap();
    assert_eq!(&aligned[start..start + 100], &bytes[3 * 4096..]);
    // Refused: an unaligned buffer, a buffer too small, a read past the end.
    assert_eq!(super::read_direct(&file, 0, 100, &mut aligned[1..]), None);
    assert_eq!(
        super::read_direct(&file, 0, 5000, &mut aligned[..4096]),
        None
    );
    assert_eq!(super::read_direct(&file, 3 * 4096, 200, &mut aligned), None);
    // Past the end of a file of whole blocks: the first read comes back
    // short by whole blocks, and the next, at the end, reads nothing (a
    // next read placed anywhere but after the first would find bytes).
    let whole = dir.path().join("e.bin");
    std::fs::write(&whole, vec![5u8; 4 * 4096]).unwrap();
    let file = super::open_direct(&whole).unwrap();
    assert_eq!(
        super::read_direct(&file, 2 * 4096, 3 * 4096, &mut aligned),
        None
    );
}

#[test]
fn host_cores_are_the_cores_this_process_may_use() {
    let cores = std::thread::available_parallelism().unwrap().get() as u64;
    assert_eq!(host_cores(), cores);
    assert!(host_cores() >= 1);
}

/// A backend whose copies do nothing: enough for a ring's readers and
/// issuer. With `panics_at`, its `copy_to_device_async` (`in_copy`) or its
/// `synchronize` panics once, at that call.
#[derive(Default)]
struct CopiesNothing {
    in_copy: bool,
    panics_at: Option<u64>,
    calls: std::sync::atomic::AtomicU64,
}

impl CopiesNothing {
    fn maybe_panic(&self, here: bool) {
        use std::sync::atomic::Ordering;
        if here && Some(self.calls.fetch_add(1, Ordering::SeqCst)) == self.panics_at {
            panic!("backend panicked");
        }
    }
}

struct NoDeviceQueue;

impl Queue for NoDeviceQueue {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

struct NoBytes;

impl DeviceBuffer for NoBytes {
    fn len(&self) -> u64 {
        1 << 20
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Backend for CopiesNothing {
    fn name(&self) -> String {
        "copies-nothing".into()
    }
    fn allocate(&self, _: u64) -> Result<Box<dyn DeviceBuffer>, DeviceError> {
        Ok(Box::new(NoBytes))
    }
    fn create_queue(&self) -> Result<Box<dyn Queue>, DeviceError> {
        Ok(Box::new(NoDeviceQueue))
    }
    fn copy_to_device_async(&self, _: StagingCopy<'_>) -> Result<(), DeviceError> {
        self.maybe_panic(self.in_copy);
        Ok(())
    }
    fn synchronize(&self, _: &dyn Queue) -> Result<(), DeviceError> {
        self.maybe_panic(!self.in_copy);
        Ok(())
    }
    fn read_back(&self, _: &dyn DeviceBuffer, _: u64, _: &mut [u8]) -> Result<(), DeviceError> {
        Err(DeviceError::Unavailable("copies nothing".into()))
    }
    fn device_memory_is_host_addressable(&self) -> bool {
        false
    }
}

/// One lane of two 4 KiB buffers and two readers.
fn two_buffers() -> RingConfig {
    RingConfig {
        buffer_bytes: 4096,
        buffers: 2,
        readers: 2,
        lanes: 1,
        ..RingConfig::default()
    }
}

#[test]
fn a_free_slot_takes_only_the_chunk_of_the_first_round() {
    // Two buffers: chunks 0 and 1 take them free; chunk 2 must wait until
    // chunk 0's copy was queued from buffer 0. A reader of chunk 2 that
    // arrives first (its reader of chunk 0 was preempted after claiming
    // it) must not fill the free buffer: the issuer, waiting for chunk 0
    // there, would wait forever.
    let ring = StagingRing::new(&CopiesNothing::default(), two_buffers()).unwrap();
    let lane = lock(&ring.lanes[0]);
    let lane = &*lane;
    let bytes = vec![7u8; 3 * 4096];
    let failed = std::sync::atomic::AtomicBool::new(false);
    let fill = |chunk: u64| {
        ring.fill(
            lane,
            &CopiesNothing::default(),
            chunk,
            RingSource::Bytes(&bytes),
            None,
            chunk * 4096,
            4096,
            &failed,
        )
    };
    let state = |slot: usize| *lock(&lane.slots[slot].state);
    fill(1).unwrap();
    assert_eq!(
        state(1),
        SlotState::Filled {
            chunk: 1,
            start: 0,
            len: 4096
        }
    );
    std::thread::scope(|s| {
        let early = s.spawn(|| fill(2));
        // Long enough for a reader that does not wait to have filled it.
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert_eq!(state(0), SlotState::Free, "chunk 2 took chunk 0's buffer");
        // End the wait the way a failed transfer does (under the slot's
        // lock, so the reader cannot miss the wake-up).
        let guard = lock(&lane.slots[0].state);
        failed.store(true, std::sync::atomic::Ordering::SeqCst);
        lane.slots[0].changed.notify_all();
        drop(guard);
        early.join().unwrap().unwrap();
    });
    assert_eq!(state(0), SlotState::Free);
}

#[test]
fn the_issuer_copies_only_its_own_chunk_from_a_filled_buffer() {
    let ring = StagingRing::new(&CopiesNothing::default(), two_buffers()).unwrap();
    let lane = lock(&ring.lanes[0]);
    let lane = &*lane;
    let filled = SlotState::Filled {
        chunk: 0,
        start: 0,
        len: 4096,
    };
    *lock(&lane.slots[0].state) = filled;
    let failed = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        // Buffer 0 holds chunk 0; the issuer of chunk 2 must wait for its
        // own chunk there, not copy chunk 0's bytes to chunk 2's place.
        let issuer =
            s.spawn(|| ring.issue(lane, &CopiesNothing::default(), 2, &NoBytes, 0, &failed));
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert_eq!(*lock(&lane.slots[0].state), filled, "chunk 0 issued as 2");
        let guard = lock(&lane.slots[0].state);
        failed.store(true, std::sync::atomic::Ordering::SeqCst);
        lane.slots[0].changed.notify_all();
        drop(guard);
        issuer.join().unwrap().unwrap();
    });
}

#[test]
fn a_panicking_backend_stops_the_transfer_and_leaves_the_ring_usable() {
    // The issuer panics in a copy (readers would wait for their slots to
    // be issued), or a reader panics in a synchronize before refilling
    // its buffer (the issuer would wait for that chunk): either way the
    // panic reaches the caller, nothing waits forever, and the ring's next
    // transfer runs.
    for in_copy in [true, false] {
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let backend = CopiesNothing {
                in_copy,
                panics_at: Some(1),
                ..CopiesNothing::default()
            };
            let ring = StagingRing::new(&backend, two_buffers()).unwrap();
            let bytes = vec![3u8; 8 * 4096];
            let transfer =
                || ring.transfer_range(&backend, RingSource::Bytes(&bytes), 0..8 * 4096, &NoBytes);
            let panicked =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(transfer)).is_err();
            let next = transfer().is_ok();
            done.send((panicked, next)).unwrap();
        });
        let outcome = finished
            .recv_timeout(std::time::Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("in_copy {in_copy}: the transfer never ended"));
        assert_eq!(outcome, (true, true), "in_copy {in_copy}");
    }
}
