//! Tests of the fake device and the sink: the seam's tests convict its
//! rules only as far as these devices behave as documented (copies land at
//! synchronize, the log is in order, failures are injected by index, the
//! two addressability answers are independent).

use seam::backend_check::{PATTERN, queue_pattern_copy};
use seam::platform::{
    Backend, DeviceBuffer, DeviceError, HostRelease, Platform, Queue, ResidencyPolicy,
};

use super::*;

fn release(weight: &str) -> HostRelease {
    HostRelease {
        weight: weight.into(),
        borrowed: true,
        offset: 4096,
        len: 10_000,
        released: 8192,
    }
}

fn read(backend: &dyn Backend, buffer: &dyn DeviceBuffer) -> Vec<u8> {
    let mut out = vec![0xAA; buffer.len() as usize];
    backend.read_back(buffer, 0, &mut out).unwrap();
    out
}

/// A buffer and a queue of another backend.
struct Foreign;

impl DeviceBuffer for Foreign {
    fn len(&self) -> u64 {
        16
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Queue for Foreign {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[test]
fn copies_land_only_at_synchronize_and_the_log_is_in_order() {
    let fake = FakePlatform::new(FakeConfig::default());
    let b = fake.backend();
    let q = b.create_queue().unwrap();
    let buf = b.allocate(8).unwrap();
    let id = buf.as_any().downcast_ref::<FakeBuffer>().unwrap().id();
    queue_pattern_copy(b, 0, 3, &*buf, 2, &*q).unwrap();
    assert_eq!(read(b, &*buf), [0; 8], "nothing lands before synchronize");
    b.host_pages_released(&release("early"));
    b.synchronize(&*q).unwrap();
    let p = &PATTERN;
    assert_eq!(
        read(b, &*buf),
        [0, 0, p[0], p[1], p[2], 0, 0, 0],
        "the bytes land at synchronize, where they were sent"
    );
    b.host_pages_released(&release("late"));
    drop(buf);
    let released = |weight: &str, pending_copies| Event::Release {
        weight: weight.into(),
        borrowed: true,
        offset: 4096,
        len: 10_000,
        released: 8192,
        pending_copies,
    };
    assert_eq!(
        fake.events(),
        [
            Event::Alloc { buffer: id, len: 8 },
            Event::CopyQueued {
                buffer: id,
                offset: 2,
                len: 3
            },
            released("early", 1),
            Event::CopyCompleted { buffer: id, len: 3 },
            Event::Synchronize,
            released("late", 0),
            Event::Free { buffer: id },
        ]
    );
    assert_eq!(
        fake.counters(),
        FakeCounters {
            allocs: 1,
            frees: 1,
            copies_queued: 1,
            copies_completed: 1,
            synchronizes: 1,
            releases: 2,
            device_bytes: 0,
            peak_device_bytes: 8,
        }
    );
}

#[test]
fn device_bytes_and_peak_follow_allocations_and_frees() {
    let fake = FakePlatform::new(FakeConfig::default());
    let b = fake.backend();
    let x = b.allocate(100).unwrap();
    let y = b.allocate(50).unwrap();
    assert_eq!(
        (
            fake.counters().device_bytes,
            fake.counters().peak_device_bytes
        ),
        (150, 150)
    );
    drop(x);
    let z = b.allocate(20).unwrap();
    assert_eq!(
        (
            fake.counters().device_bytes,
            fake.counters().peak_device_bytes
        ),
        (70, 150)
    );
    assert_eq!((y.len(), z.len()), (50, 20));
    assert!(!y.is_empty());
    let ids: Vec<u64> = [&y, &z]
        .iter()
        .map(|b| b.as_any().downcast_ref::<FakeBuffer>().unwrap().id())
        .collect();
    assert_ne!(ids[0], ids[1], "buffer ids are unique");
}

#[test]
fn injected_failures_hit_the_allocation_or_copy_of_that_index() {
    let fake = FakePlatform::new(FakeConfig {
        fail_alloc: Some(1),
        fail_copy: Some(1),
        ..FakeConfig::default()
    });
    let b = fake.backend();
    let q = b.create_queue().unwrap();
    let first = b.allocate(4).unwrap();
    assert_eq!(
        b.allocate(4).err(),
        Some(DeviceError::OutOfMemory { bytes: 4 })
    );
    let third = b.allocate(4).unwrap();
    queue_pattern_copy(b, 0, 4, &*first, 0, &*q).unwrap();
    assert!(matches!(
        queue_pattern_copy(b, 4, 4, &*third, 0, &*q),
        Err(DeviceError::CopyFailed(_))
    ));
    queue_pattern_copy(b, 8, 4, &*third, 0, &*q).unwrap();
    b.synchronize(&*q).unwrap();
    assert_eq!(
        (read(b, &*first), read(b, &*third)),
        (PATTERN[0..4].to_vec(), PATTERN[8..12].to_vec())
    );
    let c = fake.counters();
    assert_eq!((c.allocs, c.copies_queued, c.copies_completed), (2, 2, 2));
}

#[test]
fn misuse_is_refused() {
    let fake = FakePlatform::new(FakeConfig::default());
    let b = fake.backend();
    let q = b.create_queue().unwrap();
    let buf = b.allocate(8).unwrap();
    let misuse = |r: Result<(), DeviceError>| matches!(r, Err(DeviceError::Misuse(_)));
    assert!(misuse(queue_pattern_copy(b, 0, 4, &*buf, 5, &*q)));
    assert!(misuse(queue_pattern_copy(b, 0, 4, &*buf, u64::MAX, &*q)));
    assert!(misuse(queue_pattern_copy(b, 0, 4, &Foreign, 0, &*q)));
    assert!(misuse(queue_pattern_copy(b, 0, 4, &*buf, 0, &Foreign)));
    assert!(misuse(b.synchronize(&Foreign)));
    assert!(misuse(b.read_back(&*buf, 4, &mut [0; 5])));
    assert!(misuse(b.read_back(&Foreign, 0, &mut [0; 1])));
    assert_eq!(fake.counters().copies_queued, 0);
    assert_eq!(b.allocate_pinned(16).unwrap().map(|_| ()), None);
    assert_eq!(q.native(), None, "the fake has no vendor stream");
}

#[test]
fn the_two_addressability_answers_and_the_policy_are_independent() {
    let policy = ResidencyPolicy {
        release_host_weights_after_upload: false,
        drop_page_cache: true,
    };
    for (host, device) in [(false, false), (true, false), (false, true), (true, true)] {
        let fake = FakePlatform::new(FakeConfig {
            host_memory_is_device_addressable: host,
            device_memory_is_host_addressable: device,
            policy,
            ..FakeConfig::default()
        });
        assert_eq!(fake.host_memory_is_device_addressable(), host);
        assert_eq!(fake.backend().device_memory_is_host_addressable(), device);
        assert_eq!(fake.residency_policy(), policy);
        assert!(fake.needs_weight_staging());
        assert_eq!(fake.backend().name(), "fake");
        assert!(std::ptr::addr_eq(
            fake.fake_backend() as *const FakeBackend,
            fake.backend() as *const dyn Backend
        ));
    }
    let a = FakePlatform::new(FakeConfig::default());
    let b = FakePlatform::new(FakeConfig::default());
    assert_ne!(a.device_id(), b.device_id());
    assert_eq!(a.stage_counters().snapshot(), Default::default());
}

#[test]
fn the_sink_hashes_what_arrives_in_order_and_keeps_nothing() {
    use sha2::{Digest, Sha256};
    let sink = SinkPlatform::new();
    let b = sink.backend();
    let q = b.create_queue().unwrap();
    let buf = b.allocate(6).unwrap();
    assert_eq!(SinkPlatform::digest(&*buf), None);
    queue_pattern_copy(b, 0, 3, &*buf, 0, &*q).unwrap();
    assert!(matches!(
        queue_pattern_copy(b, 100, 3, &*buf, 0, &*q),
        Err(DeviceError::Misuse(_))
    ));
    assert!(matches!(
        queue_pattern_copy(b, 3, 4, &*buf, 3, &*q),
        Err(DeviceError::Misuse(_))
    ));
    assert_eq!(SinkPlatform::digest(&*buf), None, "not every byte arrived");
    queue_pattern_copy(b, 3, 3, &*buf, 3, &*q).unwrap();
    b.synchronize(&*q).unwrap();
    let expected: [u8; 32] = Sha256::digest(&PATTERN[..6]).into();
    assert_eq!(SinkPlatform::digest(&*buf), Some(expected));
    assert_eq!(buf.sha256(), Some(expected));
    assert!(matches!(
        b.read_back(&*buf, 0, &mut [0; 6]),
        Err(DeviceError::Misuse(_))
    ));
    b.host_pages_released(&release("w"));
    assert_eq!(
        sink.report(),
        SinkReport {
            received_bytes: 6,
            device_bytes: 6,
            released_bytes: 8192,
        }
    );
    drop(buf);
    assert_eq!(sink.report().device_bytes, 0);
    assert!(sink.needs_weight_staging() && !sink.host_memory_is_device_addressable());
    assert!(!b.device_memory_is_host_addressable());
}
