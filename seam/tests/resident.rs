//! `resident_weight` and the release of a staged weight's host bytes,
//! convicted rule by rule on the fake device (asynchronous copies that land
//! only at synchronize, an ordered event log, answers that may disagree,
//! injected failures) and on the host platform.
//!
//! Each release condition of the brief has a case that fails when it is
//! deleted: the matrix flips every input (borrow or owned, file-backed or
//! not, either addressability answer, the owned-release policy); a missing
//! synchronize leaves the fake's device copy empty (`read_back` differs) and
//! logs a release with a copy pending; a release outside the once-block
//! shows as more than one release per weight over 1,000 forward steps.

use std::path::PathBuf;
use std::sync::{Arc, Barrier};

use platform_fake::{Event, FakeConfig, FakeCounters, FakePlatform};
use platform_host::HostPlatform;
use rstest::rstest;
use seam::borrow::{Borrow, MapOptions, MappedFile, page_size};
use seam::gguf::GgmlType;
use seam::platform::{DeviceError, Platform, Queue, ResidencyPolicy, StageCounts};
use seam::policy::WithPolicy;
use seam::residency::mapping_rss;
use seam::ring::{RingConfig, StagingRing};
use seam::weight::{DeviceCopy, HostView, Role, Weight, WeightFlags};
use seam::{Resident, SeamError, resident_weight};
use seam_tools::demo::pseudo_random_bytes;
use sha2::{Digest, Sha256};

const MIB: u64 = 1 << 20;
/// A file of several MiB, so the span's whole-page interior is large.
const FILE_LEN: u64 = 4 * MIB;
/// Not page-aligned at either end: the partial pages there stay resident.
const SPAN_OFFSET: u64 = 1000;
const SPAN_LEN: u64 = 3 * MIB + 123;

fn sha(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// Bytes of whole pages inside `[offset, offset + len)`: what a borrow's
/// release gives back.
fn interior(offset: u64, len: u64) -> u64 {
    let page = page_size();
    ((offset + len) / page * page).saturating_sub(offset.div_ceil(page) * page)
}

/// A file in a temporary directory and its mapping.
struct FileFixture {
    dir: tempfile::TempDir,
    path: PathBuf,
    bytes: Vec<u8>,
    map: Arc<MappedFile>,
}

fn file_fixture(seed: u64, len: u64) -> FileFixture {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("weights-{seed}.bin"));
    let bytes = pseudo_random_bytes(seed, len as usize);
    std::fs::write(&path, &bytes).unwrap();
    let map = MappedFile::open(&path, MapOptions::default()).unwrap();
    FileFixture {
        dir,
        path,
        bytes,
        map,
    }
}

/// Whether two byte strings are equal, without printing megabytes when
/// they are not. (Hashes are compared where the claim is about a digest;
/// plain equality is the same check and costs less in a debug build.)
#[track_caller]
fn check_same(got: &[u8], expected: &[u8], what: &str) {
    assert!(
        got.len() == expected.len() && got == expected,
        "{what}: bytes differ"
    );
}

/// The resident bytes of the mapping that holds `bytes`.
fn rss_of(bytes: &[u8]) -> u64 {
    mapping_rss(bytes.as_ptr())
        .unwrap()
        .expect("the bytes are mapped")
}

fn queue(platform: &dyn Platform) -> Box<dyn Queue> {
    platform.backend().create_queue().unwrap()
}

/// The bytes the device holds for `copy`.
fn device_bytes(platform: &dyn Platform, copy: &DeviceCopy) -> Vec<u8> {
    let mut out = vec![0u8; copy.buffer().len() as usize];
    platform
        .backend()
        .read_back(copy.buffer(), 0, &mut out)
        .unwrap();
    out
}

fn fake(
    platform_addressable: bool,
    backend_addressable: bool,
    release_owned: bool,
) -> FakePlatform {
    FakePlatform::new(FakeConfig {
        host_memory_is_device_addressable: platform_addressable,
        device_memory_is_host_addressable: backend_addressable,
        policy: ResidencyPolicy {
            release_host_weights_after_upload: release_owned,
            drop_page_cache: true,
        },
        ..FakeConfig::default()
    })
}

fn borrowed(name: &str, borrow: Borrow) -> Weight {
    let len = borrow.len();
    Weight::borrowed(name, GgmlType::I8, vec![len], Role::new("test"), borrow)
}

fn owned(name: &str, bytes: Vec<u8>) -> Weight {
    let len = bytes.len() as u64;
    Weight::owned(name, GgmlType::I8, vec![len], Role::new("test"), bytes)
}

/// Stages `weight` (expecting success) and returns its device copy.
#[track_caller]
fn stage<'w>(weight: &'w Weight, platform: &dyn Platform, queue: &dyn Queue) -> &'w DeviceCopy {
    match resident_weight(weight, platform, queue) {
        Ok(Resident::Device(copy)) => copy,
        other => panic!("{}: expected a device copy, got {other:?}", weight.name()),
    }
}

/// A weight staged: its name, its length, and `(borrowed, released bytes)`
/// when its host bytes were given back.
type Staged<'a> = (&'a str, u64, Option<(bool, u64)>);

/// What the fake's log must show for weights staged one after another:
/// for each, Alloc, CopyQueued and CopyCompleted of one buffer, Synchronize,
/// then (iff `release` is given: `(borrowed, released bytes)`) a Release
/// logged with no copy pending. Nothing else, in exactly that order.
#[track_caller]
fn check_log(events: &[Event], expected: &[Staged<'_>]) {
    let mut it = events.iter();
    for &(name, len, release) in expected {
        let (
            Some(Event::Alloc { buffer: a, len: l0 }),
            Some(Event::CopyQueued {
                buffer: b,
                offset: 0,
                len: l1,
            }),
        ) = (it.next(), it.next())
        else {
            panic!("{name}: expected Alloc, CopyQueued in {events:#?}");
        };
        let (Some(Event::CopyCompleted { buffer: c, len: l2 }), Some(Event::Synchronize)) =
            (it.next(), it.next())
        else {
            panic!("{name}: expected CopyCompleted, Synchronize in {events:#?}");
        };
        assert!(
            a == b && b == c,
            "{name}: one buffer for alloc, copy and completion: {events:#?}"
        );
        assert_eq!([*l0, *l1, *l2], [len; 3], "{name}: lengths");
        if let Some((borrowed, released)) = release {
            let next = it.next();
            assert!(
                matches!(
                    next,
                    Some(Event::Release {
                        weight,
                        borrowed: b,
                        released: r,
                        len: l,
                        pending_copies: 0,
                        ..
                    }) if weight == name && *b == borrowed && *r == released && *l == len
                ),
                "{name}: the release follows the completed copy: {events:#?}"
            );
        }
    }
    assert_eq!(it.next(), None, "nothing more is logged: {events:#?}");
}

/// Counts of events by kind: allocs, copies queued, copies completed,
/// synchronizes, releases, frees. Asserts every release saw no pending copy.
#[track_caller]
fn count_events(events: &[Event]) -> [u64; 6] {
    let mut n = [0u64; 6];
    for e in events {
        let i = match e {
            Event::Alloc { .. } => 0,
            Event::CopyQueued { .. } => 1,
            Event::CopyCompleted { .. } => 2,
            Event::Synchronize => 3,
            Event::Release { pending_copies, .. } => {
                assert_eq!(*pending_copies, 0, "released with a copy pending: {e:?}");
                4
            }
            Event::Free { .. } => 5,
            // These fakes cannot register host memory.
            Event::Registered { .. } | Event::Unregistered { .. } => {
                panic!("a registration on a fake without it: {e:?}")
            }
        };
        n[i] += 1;
    }
    n
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Host {
    Borrow,
    Owned,
}

/// The matrix of the brief's release rules. A borrow's pages are released
/// iff it is file-backed and neither side addresses the other's memory
/// (whatever the owned-release policy says); an owned buffer is given back
/// iff the policy says so (whatever the rest says; "file-backed" owned bytes
/// are an owned copy read from the file).
#[rstest]
fn release_happens_exactly_when_the_brief_says(
    #[values(Host::Borrow, Host::Owned)] host: Host,
    #[values(true, false)] file_backed: bool,
    #[values(false, true)] platform_addressable: bool,
    #[values(false, true)] backend_addressable: bool,
    #[values(false, true)] release_owned: bool,
) {
    let fx = file_fixture(7, FILE_LEN);
    let span = SPAN_OFFSET as usize..(SPAN_OFFSET + SPAN_LEN) as usize;
    let original = fx.bytes[span.clone()].to_vec();
    let weight = match (host, file_backed) {
        (Host::Borrow, true) => borrowed(
            "w",
            Borrow::new(Arc::clone(&fx.map), SPAN_OFFSET, SPAN_LEN).unwrap(),
        ),
        (Host::Borrow, false) => {
            let anon = MappedFile::anonymous("anonymous", &fx.bytes).unwrap();
            assert!(!anon.is_file_backed());
            borrowed("w", Borrow::new(anon, SPAN_OFFSET, SPAN_LEN).unwrap())
        }
        (Host::Owned, true) => owned("w", std::fs::read(&fx.path).unwrap()[span].to_vec()),
        (Host::Owned, false) => owned("w", original.clone()),
    };
    let released = match host {
        Host::Borrow => file_backed && !platform_addressable && !backend_addressable,
        Host::Owned => release_owned,
    };
    let platform = fake(platform_addressable, backend_addressable, release_owned);
    check(&weight, &platform, &original, released);
}

/// Stages `weight` on `platform` and checks the upload, the device bytes,
/// the log, the counters and the host side against `released`.
#[track_caller]
fn check(weight: &Weight, platform: &FakePlatform, original: &[u8], released: bool) {
    let len = original.len() as u64;
    let borrow = match weight.host_view() {
        Some(HostView::Borrow(b)) => Some(b.clone()),
        _ => None,
    };
    let file_backed_borrow = borrow.as_ref().filter(|b| b.file().is_file_backed());
    let rss_before = file_backed_borrow.map(|b| {
        seam_tools::demo::fault_in_pages(b.file().bytes());
        rss_of(b.bytes())
    });

    let q = queue(platform);
    let copy = stage(weight, platform, &*q);
    assert_eq!(copy.device(), platform.device_id());
    assert!(std::ptr::eq(copy, weight.device_copy().unwrap()));
    // The fake lands copies only at synchronize: equal bytes convict a
    // missing synchronize.
    check_same(&device_bytes(platform, copy), original, "device bytes");

    let rss_after = file_backed_borrow.map(|b| rss_of(b.bytes()));
    let released_bytes = match (&borrow, released) {
        (_, false) => 0,
        (Some(b), true) => interior(b.offset(), b.len()),
        (None, true) => len,
    };
    assert!(released_bytes > 0 || !released);
    let expected_release = released.then_some((borrow.is_some(), released_bytes));
    check_log(
        &platform.events(),
        &[(weight.name(), len, expected_release)],
    );
    let counts = StageCounts {
        uploads: 1,
        uploaded_bytes: len,
        releases: u64::from(released),
        released_page_bytes: released_bytes,
        released_span_bytes: if released { len } else { 0 },
        receives: 0,
        received_bytes: 0,
    };
    assert_eq!(platform.stage_counters().snapshot(), counts);
    assert_eq!(
        platform.counters(),
        fake_counts(1, u64::from(released), len)
    );

    if let (Some(before), Some(after)) = (rss_before, rss_after) {
        if released {
            assert!(
                before >= after + released_bytes,
                "the span's whole pages leave the mapping's Rss: {before} -> {after}, released {released_bytes}"
            );
        } else {
            assert!(
                after >= before,
                "nothing leaves the mapping's Rss: {before} -> {after}"
            );
        }
    }
    match &borrow {
        // A borrow stays readable; released pages fault identical bytes back.
        Some(b) => check_same(b.bytes(), original, "bytes through the borrow"),
        None => match weight.host_view() {
            None => assert!(released, "owned bytes are gone only when released"),
            Some(view) => {
                assert!(!released, "released owned bytes are gone");
                check_same(&view, original, "owned bytes");
            }
        },
    }

    // The memoized path: the same copy, nothing staged or released again.
    let events = platform.events();
    for _ in 0..3 {
        assert!(std::ptr::eq(stage(weight, platform, &*q), copy));
    }
    assert_eq!(platform.events(), events);
    assert_eq!(platform.stage_counters().snapshot(), counts);
}

fn fake_counts(uploads: u64, releases: u64, device_bytes: u64) -> FakeCounters {
    FakeCounters {
        allocs: uploads,
        frees: 0,
        copies_queued: uploads,
        copies_completed: uploads,
        synchronizes: uploads,
        releases,
        device_bytes,
        peak_device_bytes: device_bytes,
    }
}

/// Several weights through 1,000 forward steps: one copy and one release
/// each, all on the first step; the other 999 steps log nothing.
#[test]
fn a_thousand_forward_steps_stage_and_release_each_weight_once() {
    let fx = file_fixture(11, FILE_LEN);
    let anon = MappedFile::anonymous("anonymous", &fx.bytes).unwrap();
    let spans = [(0, MIB), (MIB + 17, MIB), (2 * MIB + 4096, 8192)];
    let mut weights: Vec<(Weight, Vec<u8>, bool)> = Vec::new();
    for (i, &(off, len)) in spans.iter().enumerate() {
        let b = Borrow::new(Arc::clone(&fx.map), off, len).unwrap();
        let bytes = b.bytes().to_vec();
        weights.push((borrowed(&format!("file.{i}"), b), bytes, true));
    }
    let b = Borrow::new(anon, 3 * MIB, 5000).unwrap();
    weights.push((borrowed("anon", b.clone()), b.bytes().to_vec(), false));
    for i in 0..2 {
        let bytes = pseudo_random_bytes(100 + i, 70_000);
        weights.push((owned(&format!("owned.{i}"), bytes.clone()), bytes, true));
    }
    let platform = FakePlatform::new(FakeConfig::default());
    let q = queue(&platform);

    let mut first: Vec<*const DeviceCopy> = Vec::new();
    let mut log_after_first_step = Vec::new();
    for step in 0..1000 {
        for (i, (w, _, _)) in weights.iter().enumerate() {
            let copy: *const DeviceCopy = stage(w, &platform, &*q);
            if step == 0 {
                first.push(copy);
            } else {
                assert_eq!(
                    copy,
                    first[i],
                    "step {step}: {} is the memoized copy",
                    w.name()
                );
            }
        }
        if step == 0 {
            log_after_first_step = platform.events();
        }
    }
    let n = weights.len() as u64;
    let n_released = weights.iter().filter(|(_, _, r)| *r).count() as u64;
    let total: u64 = weights.iter().map(|(_, b, _)| b.len() as u64).sum();
    let events = platform.events();
    assert_eq!(events, log_after_first_step, "steps 2..=1000 log nothing");
    assert_eq!(count_events(&events), [n, n, n, n, n_released, 0]);
    assert_eq!(platform.counters(), fake_counts(n, n_released, total));
    let counts = platform.stage_counters().snapshot();
    assert_eq!(
        (counts.uploads, counts.uploaded_bytes, counts.releases),
        (n, total, n_released)
    );
    let expected: Vec<_> = weights
        .iter()
        .map(|(w, bytes, r)| {
            let release = match w.host() {
                seam::weight::HostBytes::Borrow(b) => {
                    r.then(|| (true, interior(b.offset(), b.len())))
                }
                seam::weight::HostBytes::Owned(_) => Some((false, bytes.len() as u64)),
            };
            (w.name(), bytes.len() as u64, release)
        })
        .collect();
    check_log(&events, &expected);
    for (w, bytes, _) in &weights {
        let copy = w.device_copy().unwrap();
        check_same(&device_bytes(&platform, copy), bytes, w.name());
    }
}

/// Eight threads make the first call on one weight at once: one upload, one
/// release, one copy that every thread gets. Repeated on fresh weights to
/// give a race many chances.
#[test]
fn concurrent_first_calls_stage_and_release_once() {
    const THREADS: usize = 8;
    const ROUNDS: u64 = 12;
    let fx = file_fixture(13, FILE_LEN);
    let platform = FakePlatform::new(FakeConfig::default());
    let q = queue(&platform);
    let span = FILE_LEN / ROUNDS;
    for round in 0..ROUNDS {
        let b = Borrow::new(Arc::clone(&fx.map), round * span + 1, span - 1).unwrap();
        let original = b.bytes().to_vec();
        let weight = borrowed(&format!("w.{round}"), b);
        let barrier = Barrier::new(THREADS);
        let copies: Vec<usize> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..THREADS)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        stage(&weight, &platform, &*q) as *const DeviceCopy as usize
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let memo = weight.device_copy().unwrap() as *const DeviceCopy as usize;
        assert!(
            copies.iter().all(|&c| c == memo),
            "round {round}: every thread gets the memo"
        );
        let r = round + 1;
        let counts = platform.stage_counters().snapshot();
        assert_eq!((counts.uploads, counts.releases), (r, r), "round {round}");
        let events = platform.events();
        // The weights of earlier rounds were dropped: their buffers freed.
        assert_eq!(
            count_events(&events),
            [r, r, r, r, r, round],
            "round {round}"
        );
        let copy = weight.device_copy().unwrap();
        check_same(&device_bytes(&platform, copy), &original, "device bytes");
    }
}

/// Pages given back are read again from the file: the same bytes, and the
/// mapping's Rss rises again as they fault back in.
#[test]
fn bytes_read_through_a_released_borrow_equal_the_original() {
    let fx = file_fixture(17, FILE_LEN);
    let b = Borrow::new(Arc::clone(&fx.map), SPAN_OFFSET, SPAN_LEN).unwrap();
    let original = sha(&fx.bytes[SPAN_OFFSET as usize..(SPAN_OFFSET + SPAN_LEN) as usize]);
    let weight = borrowed("w", b.clone());
    let platform = FakePlatform::new(FakeConfig::default());
    seam_tools::demo::fault_in_pages(fx.map.bytes());
    let full = rss_of(b.bytes());
    stage(&weight, &platform, &*queue(&platform));
    let dropped = rss_of(b.bytes());
    let released = interior(SPAN_OFFSET, SPAN_LEN);
    assert!(full >= dropped + released, "{full} -> {dropped}");
    assert_eq!(sha(b.bytes()), original);
    assert!(
        rss_of(b.bytes()) >= dropped + released,
        "the pages faulted back in"
    );
}

/// A borrow keeps its deleted file's inode alive: staged after the file is
/// gone, the device gets the file's bytes and the released pages read back.
#[test]
fn a_borrowed_weight_outlives_the_deletion_of_its_file() {
    let fx = file_fixture(19, FILE_LEN);
    let b = Borrow::new(Arc::clone(&fx.map), SPAN_OFFSET, SPAN_LEN).unwrap();
    let original = sha(&fx.bytes[SPAN_OFFSET as usize..(SPAN_OFFSET + SPAN_LEN) as usize]);
    let weight = borrowed("w", b.clone());
    std::fs::remove_file(&fx.path).unwrap();
    assert!(!fx.path.exists() && fx.dir.path().exists());
    let platform = FakePlatform::new(FakeConfig::default());
    let copy = stage(&weight, &platform, &*queue(&platform));
    assert_eq!(sha(&device_bytes(&platform, copy)), original);
    assert_eq!(platform.stage_counters().snapshot().releases, 1);
    assert_eq!(sha(b.bytes()), original);
}

#[derive(Clone, Copy, Debug)]
enum Fail {
    Alloc,
    Copy,
}

/// An injected allocation or copy failure is a `SeamError::Device` naming
/// the weight; the memo stays empty, nothing is released (no Release event,
/// counters 0, owned bytes kept, no page leaves the mapping), the failed
/// buffer is freed; a retry then stages and releases once.
#[rstest]
fn injected_failures_stage_nothing_and_a_retry_succeeds(
    #[values(Fail::Alloc, Fail::Copy)] fail: Fail,
    #[values(Host::Borrow, Host::Owned)] host: Host,
) {
    let fx = file_fixture(23, FILE_LEN);
    let b = Borrow::new(Arc::clone(&fx.map), SPAN_OFFSET, SPAN_LEN).unwrap();
    let original = b.bytes().to_vec();
    let weight = match host {
        Host::Borrow => borrowed("the.weight", b.clone()),
        Host::Owned => owned("the.weight", original.clone()),
    };
    let platform = FakePlatform::new(FakeConfig {
        fail_alloc: matches!(fail, Fail::Alloc).then_some(0),
        fail_copy: matches!(fail, Fail::Copy).then_some(0),
        ..FakeConfig::default()
    });
    let q = queue(&platform);
    seam_tools::demo::fault_in_pages(fx.map.bytes());
    let rss_before = rss_of(b.bytes());

    let err = resident_weight(&weight, &platform, &*q).unwrap_err();
    let message = err.to_string();
    match (fail, err) {
        (
            Fail::Alloc,
            SeamError::Device {
                weight: name,
                source: DeviceError::OutOfMemory { bytes },
            },
        ) => {
            assert_eq!((name.as_str(), bytes), ("the.weight", SPAN_LEN));
        }
        (
            Fail::Copy,
            SeamError::Device {
                weight: name,
                source: DeviceError::CopyFailed(_),
            },
        ) => {
            assert_eq!(name, "the.weight");
        }
        (_, other) => panic!("{fail:?}: got {other:?}"),
    }
    assert!(message.contains("\"the.weight\""), "{message}");
    assert!(weight.device_copy().is_none(), "the memo stays empty");
    assert_eq!(platform.stage_counters().snapshot(), StageCounts::default());
    let counters = platform.counters();
    assert_eq!((counters.releases, counters.device_bytes), (0, 0));
    let events = platform.events();
    assert_eq!(count_events(&events)[4], 0, "no release: {events:?}");
    match fail {
        Fail::Alloc => assert_eq!(events, []),
        Fail::Copy => assert!(
            matches!(events[..], [Event::Alloc { buffer: a, .. }, Event::Free { buffer: f }] if a == f)
        ),
    }
    check_same(
        &weight.host_view().expect("host bytes kept"),
        &original,
        "host bytes",
    );
    assert!(rss_of(b.bytes()) >= rss_before, "no page was given back");

    let copy = stage(&weight, &platform, &*q);
    check_same(&device_bytes(&platform, copy), &original, "device bytes");
    let counts = platform.stage_counters().snapshot();
    assert_eq!((counts.uploads, counts.releases), (1, 1));
    let n = count_events(&platform.events());
    assert_eq!(
        (n[0], n[1], n[4]),
        (2 - u64::from(matches!(fail, Fail::Alloc)), 1, 1)
    );
}

/// An expert-streamed stack is refused by name on every platform, before
/// anything is allocated.
#[test]
fn expert_streamed_weights_are_refused_by_name() {
    let weight = owned("blk.0.ffn_up_exps.weight", vec![1; 4096]).with_flags(WeightFlags {
        expert_streamed: true,
    });
    let fake = FakePlatform::new(FakeConfig::default());
    let host = HostPlatform::new();
    for platform in [&fake as &dyn Platform, &host] {
        match resident_weight(&weight, platform, &*queue(platform)) {
            Err(e @ SeamError::ExpertStreamed { .. }) => {
                assert!(
                    e.to_string().contains("\"blk.0.ffn_up_exps.weight\""),
                    "{e}"
                );
                let SeamError::ExpertStreamed { weight: name } = e else {
                    unreachable!()
                };
                assert_eq!(name, "blk.0.ffn_up_exps.weight");
            }
            other => panic!("expected ExpertStreamed, got {other:?}"),
        }
    }
    assert!(weight.device_copy().is_none());
    assert_eq!(fake.events(), []);
    assert_eq!(fake.stage_counters().snapshot(), StageCounts::default());
    assert!(weight.host_view().is_some());
}

/// A weight staged on one device is never handed to another, neither on the
/// memoized path nor by staging it a second time.
#[test]
fn a_weight_staged_on_one_device_is_refused_on_another() {
    let weight = owned("w", pseudo_random_bytes(29, 10_000));
    let a = FakePlatform::new(FakeConfig::default());
    let b = FakePlatform::new(FakeConfig::default());
    stage(&weight, &a, &*queue(&a));
    let a_events = a.events();
    for _ in 0..2 {
        match resident_weight(&weight, &b, &*queue(&b)) {
            Err(SeamError::WrongDevice {
                weight: name,
                staged,
                asked,
            }) => {
                assert_eq!(
                    (name.as_str(), staged, asked),
                    ("w", a.device_id(), b.device_id())
                );
            }
            other => panic!("expected WrongDevice, got {other:?}"),
        }
    }
    assert_eq!(b.events(), []);
    assert_eq!(b.stage_counters().snapshot(), StageCounts::default());
    assert_eq!(a.events(), a_events);
    assert_eq!(weight.device_copy().unwrap().device(), a.device_id());
}

/// On the CPU, kernels read the borrow itself: `Resident::Host` with the
/// very bytes of the mapping, nothing allocated, staged or released.
#[test]
fn host_platform_hands_out_the_borrow_and_never_stages() {
    let fx = file_fixture(31, FILE_LEN);
    let b = Borrow::new(Arc::clone(&fx.map), SPAN_OFFSET, SPAN_LEN).unwrap();
    let weight = borrowed("w", b.clone());
    let kept = owned("o", pseudo_random_bytes(37, 5000));
    let host = HostPlatform::new();
    let q = queue(&host);
    seam_tools::demo::fault_in_pages(fx.map.bytes());
    let rss_before = rss_of(b.bytes());
    for _ in 0..3 {
        let r = resident_weight(&weight, &host, &*q).unwrap();
        assert!(r.device_copy().is_none());
        let Resident::Host(view) = r else {
            panic!("expected host bytes, got {r:?}")
        };
        assert!(matches!(view, HostView::Borrow(v) if std::ptr::eq(v.bytes(), b.bytes())));
        assert!(
            std::ptr::eq(&*view, b.bytes()),
            "the borrow's own bytes, not a copy"
        );
        let Resident::Host(view) = resident_weight(&kept, &host, &*q).unwrap() else {
            panic!("host bytes")
        };
        assert!(std::ptr::eq(&*view, &*kept.host_view().unwrap()));
    }
    assert!(weight.device_copy().is_none() && kept.device_copy().is_none());
    assert_eq!(host.stage_counters().snapshot(), StageCounts::default());
    assert!(rss_of(b.bytes()) >= rss_before);
}

/// An owned buffer given back after upload cannot be handed to the CPU.
#[test]
fn released_owned_bytes_are_gone_for_a_host_platform() {
    let weight = owned("w", pseudo_random_bytes(41, 3000));
    let fake = FakePlatform::new(FakeConfig::default());
    stage(&weight, &fake, &*queue(&fake));
    assert!(weight.host_view().is_none());
    let host = HostPlatform::new();
    match resident_weight(&weight, &host, &*queue(&host)) {
        Err(e @ SeamError::HostBytesGone { .. }) => assert!(e.to_string().contains("\"w\""), "{e}"),
        other => panic!("expected HostBytesGone, got {other:?}"),
    }
}

/// `Resident::device_copy` answers for both variants.
#[test]
fn resident_device_copy_is_the_copy_or_none() {
    let weight = owned("w", vec![5; 100]);
    let fake = FakePlatform::new(FakeConfig::default());
    let r = resident_weight(&weight, &fake, &*queue(&fake)).unwrap();
    assert!(std::ptr::eq(
        r.device_copy().unwrap(),
        weight.device_copy().unwrap()
    ));
    let host = HostPlatform::new();
    let other = owned("v", vec![5; 100]);
    assert!(
        resident_weight(&other, &host, &*queue(&host))
            .unwrap()
            .device_copy()
            .is_none()
    );
}

/// Under a ring, a weight below its direct limit that borrows a file is
/// read with `pread`, not copied from the mapping: staging many small
/// weights (experts picked one at a time) leaves no page of the mapping
/// resident. Copied from the mapping, each left its edge pages behind (no
/// whole page lies inside 3,000 bytes, so its release drops nothing) and,
/// by the kernel's fault-around, its neighbours'. An anonymous borrow (no
/// file to read) is still copied from its bytes.
#[test]
fn small_file_borrows_under_a_ring_never_fault_the_mapping_in() {
    let fx = file_fixture(53, FILE_LEN);
    let fake = FakePlatform::new(FakeConfig::default());
    let config = RingConfig {
        buffer_bytes: 256 << 10,
        buffers: 2,
        readers: 1,
        direct_io: seam::ring::Mode::Off,
        direct_below: 64 << 10,
        lanes: 1,
        ..RingConfig::default()
    };
    let ring = StagingRing::new(fake.backend(), config).unwrap();
    let platform = WithPolicy::new(&fake, fake.residency_policy()).with_ring(ring);
    let q = queue(&platform);
    let resident = || mapping_rss(fx.map.bytes().as_ptr()).unwrap().unwrap();
    let before = resident();
    let weights: Vec<(Weight, u64)> = (0..64u64)
        .map(|i| {
            let at = 11 + 40_000 * i;
            let w = borrowed(
                &format!("small.{i}"),
                Borrow::new(Arc::clone(&fx.map), at, 3000).unwrap(),
            );
            (w, at)
        })
        .collect();
    for (w, at) in &weights {
        let copy = stage(w, &platform, &*q);
        let at = *at as usize;
        check_same(
            &device_bytes(&fake, copy),
            &fx.bytes[at..at + 3000],
            w.name(),
        );
    }
    let after = resident();
    assert!(
        after <= before,
        "the mapping went from {before} to {after} resident bytes over 64 small weights"
    );
    assert_eq!(platform.staging_ring().unwrap().counts().transfers, 0);
    // An anonymous borrow has no file to read: it is copied from its bytes.
    let anon = MappedFile::anonymous("anonymous", &fx.bytes[..8192]).unwrap();
    let w = borrowed("anon.small", Borrow::new(anon, 5, 3000).unwrap());
    let copy = stage(&w, &platform, &*q);
    check_same(&device_bytes(&fake, copy), &fx.bytes[5..3005], w.name());
}

/// With a staging ring, a weight of at least `direct_below` bytes goes
/// through the ring in chunks (a file-backed borrow read from its file, an
/// anonymous borrow or owned buffer from memory), a smaller one goes
/// directly; either way the device holds the host bytes and the release
/// comes after every chunk's copy completed.
#[test]
fn a_staging_ring_copies_large_weights_in_chunks_and_releases_after_them() {
    const CHUNK: u64 = 256 << 10;
    const DIRECT_BELOW: u64 = 64 << 10;
    let fx = file_fixture(43, FILE_LEN);
    let anon = MappedFile::anonymous("anonymous", &fx.bytes).unwrap();
    let cases: Vec<(Weight, Vec<u8>, bool)> = vec![
        (
            borrowed(
                "file.large",
                Borrow::new(Arc::clone(&fx.map), SPAN_OFFSET, SPAN_LEN).unwrap(),
            ),
            fx.bytes[SPAN_OFFSET as usize..(SPAN_OFFSET + SPAN_LEN) as usize].to_vec(),
            true,
        ),
        (
            borrowed(
                "file.at_limit",
                Borrow::new(Arc::clone(&fx.map), 5, DIRECT_BELOW).unwrap(),
            ),
            fx.bytes[5..5 + DIRECT_BELOW as usize].to_vec(),
            true,
        ),
        (
            borrowed(
                "file.small",
                Borrow::new(Arc::clone(&fx.map), 7, DIRECT_BELOW - 1).unwrap(),
            ),
            fx.bytes[7..7 + DIRECT_BELOW as usize - 1].to_vec(),
            false,
        ),
        (
            borrowed("anon.large", Borrow::new(anon, 3, MIB).unwrap()),
            fx.bytes[3..3 + MIB as usize].to_vec(),
            true,
        ),
        {
            let bytes = pseudo_random_bytes(47, 600_000);
            (owned("owned.large", bytes.clone()), bytes, true)
        },
    ];
    let fake = FakePlatform::new(FakeConfig::default());
    let config = RingConfig {
        buffer_bytes: CHUNK,
        buffers: 2,
        readers: 2,
        direct_io: seam::ring::Mode::Off,
        direct_below: DIRECT_BELOW,
        lanes: 1,
        ..RingConfig::default()
    };
    let ring = StagingRing::new(fake.backend(), config).unwrap();
    let platform = WithPolicy::new(&fake, fake.residency_policy()).with_ring(ring);
    assert!(platform.staging_ring().is_some());
    let q = queue(&platform);
    for (weight, original, through_ring) in &cases {
        let before = fake.events().len();
        let copy = stage(weight, &platform, &*q);
        check_same(&device_bytes(&fake, copy), original, weight.name());
        let events = fake.events()[before..].to_vec();
        let Some(Event::Alloc { buffer, len }) = events.first() else {
            panic!("{events:?}")
        };
        assert_eq!(*len, original.len() as u64);
        let queued: Vec<(u64, u64)> = events
            .iter()
            .filter_map(|e| match e {
                Event::CopyQueued {
                    buffer: b,
                    offset,
                    len,
                } => {
                    assert_eq!(b, buffer);
                    Some((*offset, *len))
                }
                _ => None,
            })
            .collect();
        let expected: Vec<(u64, u64)> = if *through_ring {
            (0..*len)
                .step_by(CHUNK as usize)
                .map(|o| (o, CHUNK.min(len - o)))
                .collect()
        } else {
            vec![(0, *len)]
        };
        assert_eq!(queued, expected, "{}", weight.name());
        // An anonymous borrow is never released; the others are.
        let released = match weight.host() {
            seam::weight::HostBytes::Borrow(b) => b.file().is_file_backed(),
            seam::weight::HostBytes::Owned(_) => true,
        };
        let n = count_events(&events);
        let what = weight.name();
        let copies = queued.len() as u64;
        assert_eq!(
            (n[1], n[2], n[4]),
            (copies, copies, u64::from(released)),
            "{what}: {events:?}"
        );
        if released {
            let release = events
                .iter()
                .position(|e| matches!(e, Event::Release { .. }))
                .unwrap();
            let last_completion = events
                .iter()
                .rposition(|e| matches!(e, Event::CopyCompleted { .. }))
                .unwrap();
            assert!(
                last_completion < release,
                "{what}: released before its copies completed: {events:?}"
            );
            assert!(
                matches!(events[release - 1], Event::Synchronize),
                "{events:?}"
            );
        }
    }
    let counts = fake.stage_counters().snapshot();
    assert_eq!(
        (counts.uploads, counts.releases),
        (cases.len() as u64, cases.len() as u64 - 1)
    );
}
