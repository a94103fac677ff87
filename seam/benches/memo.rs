//! The cost of `resident_weight` on its hot paths: the memoized device copy
//! (a weight already staged on a fake device) and the CPU's host bytes. It
//! is called for every weight on every forward step, so it must cost
//! nanoseconds (the brief: under 50 ns for the memoized path).

use std::hint::black_box;
use std::sync::Arc;

use criterion::Criterion;
use platform_fake::{FakeConfig, FakePlatform};
use platform_host::HostPlatform;
use seam::borrow::{Borrow, MappedFile};
use seam::gguf::GgmlType;
use seam::platform::Platform;
use seam::weight::{Role, Weight};
use seam::{Resident, resident_weight};

fn weights() -> (Weight, Weight) {
    let bytes: Vec<u8> = (0..64 << 10).map(|i| i as u8).collect();
    let map = MappedFile::anonymous("bench", &bytes).unwrap();
    let borrow = Borrow::new(Arc::clone(&map), 0, bytes.len() as u64).unwrap();
    let dims = vec![bytes.len() as u64];
    (
        Weight::borrowed(
            "borrowed",
            GgmlType::I8,
            dims.clone(),
            Role::new("bench"),
            borrow,
        ),
        Weight::owned("owned", GgmlType::I8, dims, Role::new("bench"), bytes),
    )
}

fn memo(c: &mut Criterion) {
    let fake = FakePlatform::new(FakeConfig::default());
    let queue = fake.backend().create_queue().unwrap();
    let (borrowed, owned) = weights();
    for w in [&borrowed, &owned] {
        let r = resident_weight(w, &fake, &*queue).unwrap();
        assert!(matches!(r, Resident::Device(_)));
    }
    let platform: &dyn Platform = &fake;
    c.bench_function("resident_weight/fake/memoized", |b| {
        b.iter(|| {
            resident_weight(
                black_box(&borrowed),
                black_box(platform),
                black_box(&*queue),
            )
            .map(|r| r.device_copy().is_some())
        })
    });
    assert_eq!(
        fake.stage_counters().snapshot().uploads,
        2,
        "the bench never staged again"
    );

    let host = HostPlatform::new();
    let host_queue = host.backend().create_queue().unwrap();
    let platform: &dyn Platform = &host;
    c.bench_function("resident_weight/host/borrow", |b| {
        b.iter(|| {
            resident_weight(
                black_box(&borrowed),
                black_box(platform),
                black_box(&*host_queue),
            )
            .map(|r| r.device_copy().is_none())
        })
    });
    let (_, owned_on_host) = weights();
    c.bench_function("resident_weight/host/owned", |b| {
        b.iter(|| {
            resident_weight(
                black_box(&owned_on_host),
                black_box(platform),
                black_box(&*host_queue),
            )
            .map(|r| r.device_copy().is_none())
        })
    });
    assert_eq!(host.stage_counters().snapshot().uploads, 0);
}

/// Runs the benchmarks (criterion's own `main`, without its macros' items
/// that have no docs).
fn main() {
    let mut c = Criterion::default().configure_from_args();
    memo(&mut c);
    c.final_summary();
}
