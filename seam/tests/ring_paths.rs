//! The ring's read and copy paths on the fake device: `O_DIRECT` reads
//! (unaligned spans, the page cache left alone, the fallback where the file
//! system refuses; the refusal itself is tested in the ring's unit tests), `auto` choosing per chunk by what the page cache holds,
//! and registered windows (whole pages, each unregistered after its copy
//! completed, bounded in flight, never for small weights, neighbours never
//! sharing a registered page).

use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;

use platform_fake::{Event, FakeConfig, FakePlatform};
use seam::borrow::{Borrow, MapOptions, MappedFile, page_size};
use seam::gguf::GgmlType;
use seam::platform::{Platform, TransferCaps};
use seam::policy::WithPolicy;
use seam::ring::{
    DIRECT_READS_AT_ONCE, Mode, RingConfig, RingCounts, StagingRing, direct::resident_share,
};
use seam::weight::{Role, Weight};
use seam::{Resident, resident_weight};
use seam_tools::demo::{fault_in_pages, pseudo_random_bytes};

const KIB: u64 = 1024;
const MIB: u64 = 1 << 20;

/// Writes `len` pseudo-random bytes to `dir/name`, drops them from the page
/// cache, and maps the file.
fn cold_file(dir: &Path, name: &str, len: u64) -> (Vec<u8>, Arc<MappedFile>) {
    let path = dir.join(name);
    let bytes = pseudo_random_bytes(len, len as usize);
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(&bytes).unwrap();
    f.sync_all().unwrap();
    // SAFETY: advice on an open descriptor; touches no memory.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    (
        bytes,
        MappedFile::open(&path, MapOptions::default()).unwrap(),
    )
}

fn ring(fake: &FakePlatform, config: RingConfig) -> WithPolicy<'_> {
    let ring = StagingRing::new(fake.backend(), config).unwrap();
    WithPolicy::new(fake, fake.residency_policy()).with_ring(ring)
}

fn weight(name: &str, map: &Arc<MappedFile>, offset: u64, len: u64) -> Weight {
    let borrow = Borrow::new(Arc::clone(map), offset, len).unwrap();
    Weight::borrowed(name, GgmlType::I8, vec![len], Role::new("test"), borrow)
}

/// Stages `w` and checks the device holds exactly `expected`.
#[track_caller]
fn stage_and_check(w: &Weight, platform: &dyn Platform, expected: &[u8]) {
    let queue = platform.backend().create_queue().unwrap();
    let copy = match resident_weight(w, platform, &*queue) {
        Ok(Resident::Device(copy)) => copy,
        other => panic!("{}: {other:?}", w.name()),
    };
    let mut got = vec![0u8; expected.len()];
    platform
        .backend()
        .read_back(copy.buffer(), 0, &mut got)
        .unwrap();
    assert!(got == expected, "{}: device bytes differ", w.name());
}

fn counts(platform: &WithPolicy<'_>) -> RingCounts {
    platform.staging_ring().unwrap().counts()
}

fn shape(direct_io: Mode) -> RingConfig {
    RingConfig {
        buffer_bytes: 256 * KIB,
        buffers: 4,
        readers: 2,
        lanes: 1,
        direct_io,
        direct_below: 4 * KIB,
        ..RingConfig::default()
    }
}

#[test]
fn direct_reads_handle_unaligned_spans_and_leave_the_page_cache_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (bytes, map) = cold_file(dir.path(), "w.bin", 3 * MIB);
    let fake = FakePlatform::new(FakeConfig::default());
    let platform = ring(&fake, shape(Mode::On));
    // Odd offsets and lengths: the aligned blocks around each chunk are read.
    let (offset, len) = (4097 + 3, 2 * MIB + 12345);
    let w = weight("w", &map, offset, len);
    stage_and_check(
        &w,
        &platform,
        &bytes[offset as usize..(offset + len) as usize],
    );
    let c = counts(&platform);
    assert_eq!(c.direct_chunks, len.div_ceil(256 * KIB), "{c:?}");
    assert_eq!((c.buffered_chunks, c.direct_fallbacks), (0, 0), "{c:?}");
    let cached = resident_share(map.bytes()).unwrap();
    assert!(
        cached < 0.1,
        "direct reads left {cached} of the file cached"
    );
}

#[test]
fn direct_reads_go_a_few_at_a_time_whatever_the_readers() {
    let dir = tempfile::tempdir().unwrap();
    let (bytes, map) = cold_file(dir.path(), "w.bin", 16 * MIB);
    let fake = FakePlatform::new(FakeConfig::default());
    let platform = ring(
        &fake,
        RingConfig {
            buffers: 16,
            readers: 16,
            lanes: 4,
            ..shape(Mode::On)
        },
    );
    let weights: Vec<_> = (0..4u64)
        .map(|i| weight(&format!("w{i}"), &map, i * 4 * MIB, 4 * MIB))
        .collect();
    std::thread::scope(|s| {
        for (i, w) in weights.iter().enumerate() {
            let (platform, bytes) = (&platform, &bytes);
            let at = i * 4 * MIB as usize;
            s.spawn(move || stage_and_check(w, platform, &bytes[at..at + 4 * MIB as usize]));
        }
    });
    let c = counts(&platform);
    assert_eq!(c.direct_chunks, 64, "{c:?}");
    assert!(
        (1..=DIRECT_READS_AT_ONCE).contains(&c.direct_reads_peak),
        "{c:?}"
    );
}

#[test]
fn where_the_file_system_refuses_o_direct_reads_fall_back_to_buffered() {
    // tmpfs refuses O_DIRECT.
    let Ok(dir) = tempfile::tempdir_in("/dev/shm") else {
        return;
    };
    let (bytes, map) = cold_file(dir.path(), "w.bin", MIB + 100);
    let fake = FakePlatform::new(FakeConfig::default());
    let platform = ring(&fake, shape(Mode::On));
    let w = weight("w", &map, 100, MIB);
    stage_and_check(&w, &platform, &bytes[100..100 + MIB as usize]);
    // Kernels before 6.6 refuse O_DIRECT on tmpfs (each chunk then falls
    // back); newer ones accept it. Either way every chunk is accounted for.
    let c = counts(&platform);
    assert_eq!(c.direct_fallbacks, c.buffered_chunks, "{c:?}");
    assert_eq!(c.direct_chunks + c.direct_fallbacks, 4, "{c:?}");
}

#[test]
fn auto_reads_cached_chunks_buffered_and_cold_ones_direct() {
    let dir = tempfile::tempdir().unwrap();
    let chunk = MIB;
    let (bytes, map) = cold_file(dir.path(), "w.bin", 8 * chunk);
    // Cache the first two chunks only (no readahead past them).
    let f = std::fs::File::open(dir.path().join("w.bin")).unwrap();
    // SAFETY: advice on an open descriptor; touches no memory.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
    let mut buf = vec![0u8; (2 * chunk) as usize];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut buf, 0).unwrap();
    assert!(resident_share(&map.bytes()[..2 * chunk as usize]).unwrap() > 0.9);
    let fake = FakePlatform::new(FakeConfig::default());
    let platform = ring(
        &fake,
        RingConfig {
            buffer_bytes: chunk,
            ..shape(Mode::Auto)
        },
    );
    let w = weight("w", &map, 0, 8 * chunk);
    stage_and_check(&w, &platform, &bytes);
    let c = counts(&platform);
    assert_eq!((c.buffered_chunks, c.direct_chunks), (2, 6), "{c:?}");
    let rest = resident_share(&map.bytes()[2 * chunk as usize..]).unwrap();
    assert!(rest < 0.2, "auto left {rest} of the cold part cached");
}

fn registering(min: u64, mode: Mode, lanes: u64) -> (FakePlatform, RingConfig) {
    let fake = FakePlatform::new(FakeConfig {
        caps: TransferCaps {
            pinned_dma: true,
            register_host: true,
        },
        ..FakeConfig::default()
    });
    let config = RingConfig {
        registered: mode,
        window_bytes: 64 * KIB,
        registered_min: min,
        lanes,
        buffers: 2 * lanes,
        // Buffered reads would read ahead into the next windows.
        ..shape(Mode::Auto)
    };
    (fake, config)
}

/// The registrations in `events`: each whole pages, unregistered with no
/// copy pending from it, never more than the budget at once.
fn check_registrations(events: &[Event], limit: u64) -> Vec<(u64, u64)> {
    let page = page_size();
    let mut registered = Vec::new();
    for e in events {
        match e {
            Event::Registered { addr, len } => {
                assert_eq!((addr % page, len % page), (0, 0));
                registered.push((*addr, *len));
            }
            Event::Unregistered {
                pending_copies,
                live,
                ..
            } => {
                assert_eq!(*pending_copies, 0, "unregistered before its copy completed");
                assert!(*live <= limit, "{live} windows live, limit {limit}");
            }
            _ => {}
        }
    }
    let unregistered = events
        .iter()
        .filter(|e| matches!(e, Event::Unregistered { .. }))
        .count();
    assert_eq!(unregistered, registered.len(), "every window unregistered");
    registered
}

#[test]
fn large_weights_go_by_registered_windows_and_edges_by_the_ring() {
    let dir = tempfile::tempdir().unwrap();
    let (bytes, map) = cold_file(dir.path(), "w.bin", 2 * MIB);
    let (fake, config) = registering(256 * KIB, Mode::On, 1);
    let platform = ring(&fake, config);
    let (offset, len) = (1000u64, MIB + 777);
    let w = weight("w", &map, offset, len);
    stage_and_check(
        &w,
        &platform,
        &bytes[offset as usize..(offset + len) as usize],
    );
    let registered = check_registrations(&fake.events(), config.windows_in_flight);
    let base = map.bytes().as_ptr() as u64;
    let page = page_size();
    let (first, last) = (
        (base + offset).div_ceil(page) * page,
        (base + offset + len) / page * page,
    );
    // The windows tile the span's whole pages exactly, in order.
    let mut at = first;
    for (addr, l) in &registered {
        assert_eq!(*addr, at);
        assert!(*l <= 64 * KIB);
        at += l;
    }
    assert_eq!(at, last);
    let c = counts(&platform);
    assert_eq!(c.registered_windows, registered.len() as u64);
    assert_eq!(c.registered_bytes, last - first);
    assert!(
        c.windows_peak >= 1 && c.windows_peak <= config.windows_in_flight,
        "{c:?}"
    );
    assert_eq!(c.register_failures, 0);
    // Edges (head and tail) went through the ring's buffers.
    assert_eq!(c.buffered_chunks + c.direct_chunks, 2, "{c:?}");
    // The windows' pages were given back as each completed.
    let mapped = seam::residency::mapped_pages(
        &map.bytes()[first as usize - base as usize..][..(last - first) as usize],
    );
    assert_eq!(mapped.unwrap(), 0, "registered pages left mapped");
}

#[test]
fn small_weights_never_register_and_neighbours_never_share_a_page() {
    let dir = tempfile::tempdir().unwrap();
    let (bytes, map) = cold_file(dir.path(), "w.bin", 5 * MIB);
    let (fake, config) = registering(512 * KIB, Mode::On, 2);
    let platform = ring(&fake, config);
    // A small weight: ring only.
    let small = weight("small", &map, 10, 300 * KIB);
    stage_and_check(&small, &platform, &bytes[10..10 + 300 * KIB as usize]);
    assert!(check_registrations(&fake.events(), config.windows_in_flight).is_empty());
    // Two large neighbours sharing a page, staged at once on two lanes.
    let split = MIB + 4097 + 13;
    let a = weight("a", &map, 400 * KIB, split - 400 * KIB);
    let b = weight("b", &map, split, 3 * MIB);
    std::thread::scope(|s| {
        s.spawn(|| stage_and_check(&a, &platform, &bytes[400 * KIB as usize..split as usize]));
        s.spawn(|| {
            stage_and_check(
                &b,
                &platform,
                &bytes[split as usize..(split + 3 * MIB) as usize],
            )
        });
    });
    let registered = check_registrations(&fake.events(), config.windows_in_flight);
    assert!(!registered.is_empty());
    let c = counts(&platform);
    assert_eq!(
        c.register_failures, 0,
        "an overlapping registration was tried"
    );
}

#[test]
fn windows_in_flight_follow_the_knob_over_all_lanes() {
    let dir = tempfile::tempdir().unwrap();
    let (bytes, map) = cold_file(dir.path(), "w.bin", 8 * MIB);
    let (fake, mut config) = registering(256 * KIB, Mode::On, 4);
    config.windows_in_flight = 2;
    let platform = ring(&fake, config);
    let weights: Vec<_> = (0..4u64)
        .map(|i| weight(&format!("w{i}"), &map, i * 2 * MIB + 100, 2 * MIB - 200))
        .collect();
    std::thread::scope(|s| {
        for (i, w) in weights.iter().enumerate() {
            let (platform, bytes) = (&platform, &bytes);
            let at = i * 2 * MIB as usize + 100;
            s.spawn(move || stage_and_check(w, platform, &bytes[at..at + 2 * MIB as usize - 200]));
        }
    });
    let registered = check_registrations(&fake.events(), 2);
    assert!(registered.len() >= 30, "{} windows", registered.len());
    let c = counts(&platform);
    assert!((1..=2).contains(&c.windows_peak), "{c:?}");
    // One weight registers at a time; the others that arrived meanwhile
    // went through the buffers (weights 2 MiB, so 8 chunks each).
    assert_eq!(c.registering_weights_peak, 1, "{c:?}");
    let base = map.bytes().as_ptr() as u64;
    let registered_weights = (0..4u64)
        .filter(|i| {
            let (from, to) = (base + i * 2 * MIB, base + (i + 1) * 2 * MIB);
            registered.iter().any(|(addr, _)| (from..to).contains(addr))
        })
        .count() as u64;
    assert!(registered_weights >= 1);
    // A registered weight sends its head and tail through the buffers, a
    // weight through the ring its 8 chunks.
    assert_eq!(
        c.buffered_chunks + c.direct_chunks,
        2 * registered_weights + 8 * (4 - registered_weights),
        "{registered_weights} weights registered: {c:?}"
    );
}

#[test]
fn after_a_refused_registration_the_ring_carries_whole_weights() {
    let dir = tempfile::tempdir().unwrap();
    let (bytes, map) = cold_file(dir.path(), "w.bin", 4 * MIB);
    let (fake, config) = registering(256 * KIB, Mode::On, 1);
    let platform = ring(&fake, config);
    // Someone else holds the first weight's pages registered: its first
    // window is refused, and with it registration for the ring's life.
    let held = fake
        .backend()
        .register_host(&map.bytes()[..MIB as usize])
        .unwrap();
    let first = weight("first", &map, 0, MIB);
    stage_and_check(&first, &platform, &bytes[..MIB as usize]);
    assert_eq!(counts(&platform).register_failures, 1);
    drop(held);
    let before = counts(&platform);
    let second = weight("second", &map, 2 * MIB, MIB);
    stage_and_check(
        &second,
        &platform,
        &bytes[2 * MIB as usize..3 * MIB as usize],
    );
    let after = counts(&platform);
    // One range of four 256 KiB chunks, not sixteen 64 KiB windows.
    let chunks = |c: &RingCounts| c.buffered_chunks + c.direct_chunks;
    assert_eq!(chunks(&after) - chunks(&before), 4, "{after:?}");
    assert_eq!(after.registered_windows, before.registered_windows);
    assert_eq!(after.register_failures, 1);
}

#[test]
fn the_registered_minimum_counts_whole_pages_where_the_span_lies() {
    let page = page_size();
    let dir = tempfile::tempdir().unwrap();
    let (bytes, map) = cold_file(dir.path(), "w.bin", 4 * MIB);
    let (fake, config) = registering(3 * page, Mode::On, 1);
    let platform = ring(&fake, config);
    // 100 bytes into a page: a span one byte short of three whole pages
    // holds two (a span placed otherwise, or its edges added instead of
    // taken away, would count three).
    let at = 2 * MIB + 100;
    let short = weight("short", &map, at, 4 * page - 101);
    stage_and_check(
        &short,
        &platform,
        &bytes[at as usize..(at + 4 * page - 101) as usize],
    );
    assert!(
        check_registrations(&fake.events(), config.windows_in_flight).is_empty(),
        "two whole pages registered against a three-page minimum"
    );
    let whole = weight("whole", &map, at, 4 * page);
    stage_and_check(
        &whole,
        &platform,
        &bytes[at as usize..(at + 4 * page) as usize],
    );
    let registered = check_registrations(&fake.events(), config.windows_in_flight);
    assert_eq!(
        registered.iter().map(|(_, l)| l).sum::<u64>(),
        3 * page,
        "{registered:?}"
    );
}

#[test]
fn auto_registers_only_windows_the_page_cache_holds() {
    let dir = tempfile::tempdir().unwrap();
    let (bytes, map) = cold_file(dir.path(), "w.bin", 2 * MIB);
    let (fake, config) = registering(256 * KIB, Mode::Auto, 1);
    let platform = ring(&fake, config);
    let cold = weight("cold", &map, 0, MIB);
    stage_and_check(&cold, &platform, &bytes[..MIB as usize]);
    assert!(
        check_registrations(&fake.events(), config.windows_in_flight).is_empty(),
        "cold windows registered"
    );
    let _ = std::fs::read(dir.path().join("w.bin")).unwrap();
    let warm = weight("warm", &map, MIB, MIB);
    stage_and_check(&warm, &platform, &bytes[MIB as usize..]);
    assert_eq!(
        check_registrations(&fake.events(), config.windows_in_flight).len(),
        16
    );
}

#[test]
fn a_completed_window_gives_back_its_own_pages_and_no_neighbours() {
    let dir = tempfile::tempdir().unwrap();
    let (bytes, map) = cold_file(dir.path(), "w.bin", 8 * MIB);
    let (fake, config) = registering(256 * KIB, Mode::On, 1);
    let platform = ring(&fake, config);
    let page = page_size();
    // A page-aligned weight of sixteen and a bit windows in the middle of
    // the file, every page of the file mapped before it is staged: the
    // window at the weight's start must give back its own pages, not the
    // file's first ones, and the last window only its own, not the pages
    // that follow the weight.
    let (offset, len) = (MIB, MIB + 777);
    fault_in_pages(map.bytes());
    let all = map.bytes().len() as u64 / page;
    assert_eq!(seam::residency::mapped_pages(map.bytes()).unwrap(), all);
    let w = weight("w", &map, offset, len);
    stage_and_check(
        &w,
        &platform,
        &bytes[offset as usize..(offset + len) as usize],
    );
    assert!(counts(&platform).registered_windows >= 16);
    let before = &map.bytes()[..offset as usize];
    let after = &map.bytes()[(offset + len).div_ceil(page) as usize * page as usize..];
    assert_eq!(
        seam::residency::mapped_pages(before).unwrap(),
        before.len() as u64 / page,
        "pages before the weight given back"
    );
    assert_eq!(
        seam::residency::mapped_pages(after).unwrap(),
        after.len() as u64 / page,
        "pages after the weight given back"
    );
    let own =
        &map.bytes()[offset as usize..(offset + len) as usize / page as usize * page as usize];
    assert_eq!(seam::residency::mapped_pages(own).unwrap(), 0);
}
