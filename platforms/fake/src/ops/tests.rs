//! The fake device through the conformance check: every op on the fake
//! device's own buffers, weights staged by the seam and never read back.

use device_ops::conformance::{self, Staging, WEIGHT_TYPES};
use device_ops::{CpuOps, OpError, Ops};
use seam::gguf::GgmlType;
use seam::platform::Platform;
use seam::resident_weight;
use seam::weight::{Role, Weight};

use super::fake_ops;
use crate::{FakeConfig, FakePlatform};

#[test]
fn fake_device_passes_the_conformance_check_without_reading_a_weight_back() {
    let platform = FakePlatform::new(FakeConfig::default());
    let queue = platform.backend().create_queue().unwrap();
    let ops = fake_ops(&platform);
    let report = conformance::check(
        &ops,
        Staging {
            platform: &platform,
            queue: &*queue,
        },
        WEIGHT_TYPES,
    );
    report.assert_passed();
    let c = ops.counters();
    assert_eq!(c.weight_read_back_bytes, 0, "{c:?}");
    // Every read-back the fake backend saw is one the ops counted: the
    // check's own reads of activations, none of a weight.
    let (calls, bytes) = platform.fake_backend().read_backs();
    assert_eq!(bytes, c.read_back_bytes, "{c:?}");
    assert!(calls > 0 && calls < c.host_transfers, "{calls} {c:?}");
    // Each weight was staged once, by the seam.
    assert_eq!(
        platform.stage_counters().snapshot().uploads,
        WEIGHT_TYPES.len() as u64
    );
}

#[test]
fn weights_of_another_device_or_seen_from_the_cpu_are_refused() {
    let a = FakePlatform::new(FakeConfig::default());
    let b = FakePlatform::new(FakeConfig::default());
    let qa = a.backend().create_queue().unwrap();
    let w = Weight::owned(
        "w",
        GgmlType::F32,
        vec![4, 2],
        Role::new("t"),
        vec![0u8; 32],
    );
    let r = resident_weight(&w, &a, &*qa).unwrap();
    let ops_b = fake_ops(&b);
    let ids = ops_b.upload_i32(&[0], &[1]).unwrap();
    assert!(matches!(
        ops_b.get_rows(&w, &r, &ids),
        Err(OpError::ForeignWeight { op: "get_rows", .. })
    ));
    // The CPU cannot read a device copy: that would be a read-back.
    let cpu = CpuOps::cpu();
    assert!(matches!(
        cpu.dequantize(&w, &r),
        Err(OpError::ForeignWeight { .. })
    ));
    // On its own device it reads the copy in place.
    let ops_a = fake_ops(&a);
    let t = ops_a.dequantize(&w, &r).unwrap();
    assert_eq!(ops_a.read_back(&t).unwrap(), [0.0; 8]);
    assert_eq!(a.fake_backend().read_backs(), (1, 32));
}
