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
    // Each weight (a table, three or four matrices of few rows and two
    // expert stacks per type; muse_glimmer's ops: the projector's products by
    // three weights) was staged once, by the seam.
    assert_eq!(
        platform.stage_counters().snapshot().uploads,
        WEIGHT_TYPES
            .iter()
            .map(|t| 6 + u64::from(t.block_size() == 32))
            .sum::<u64>()
            + 3
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

#[test]
fn states_are_written_in_place_on_the_fake_device() {
    use device_ops::{DType, KvCache, KvSpec};
    let platform = FakePlatform::new(FakeConfig::default());
    let ops = fake_ops(&platform);
    let spec = KvSpec {
        n_ctx: 8,
        n_head_kv: 1,
        head_dim_k: 4,
        head_dim_v: 2,
        dtype: DType::F32,
    };
    let mut cache = KvCache::new(&ops, spec).unwrap();
    let k = ops.upload_f32(&[1.0; 8], &[2, 4]).unwrap();
    let v = ops.upload_f32(&[2.0; 4], &[2, 2]).unwrap();
    let before = platform.counters();
    cache.append(&ops, &k, &v).unwrap();
    cache.append(&ops, &k, &v).unwrap();
    // Four appends of rows, no new buffer: the cache is written where it
    // is, and nothing came back.
    let after = platform.counters();
    assert_eq!(after.allocs, before.allocs, "{after:?}");
    assert_eq!(after.device_bytes, before.device_bytes);
    assert_eq!(platform.fake_backend().read_backs(), (0, 0));
    assert_eq!(cache.len(), 4);
    assert_eq!(
        ops.read_back(cache.v()).unwrap(),
        [[2.0; 8].as_slice(), &[0.0; 8]].concat()
    );
    // A conv state too: one new buffer (the output), the state kept.
    let mut st = ops.zeros(DType::F32, &[2, 3]).unwrap();
    let w = ops.upload_f32(&[1.0; 9], &[3, 3]).unwrap();
    let x = ops.upload_f32(&[1.0, 2.0, 3.0], &[1, 3]).unwrap();
    let before = platform.counters();
    ops.ssm_conv(&mut st, &x, &w).unwrap();
    assert_eq!(platform.counters().allocs, before.allocs + 1);
    assert_eq!(ops.read_back(&st).unwrap(), [0.0, 0.0, 0.0, 1.0, 2.0, 3.0]);
}

/// An update writes where the buffer is: the device address a staged copy
/// was exported by (`FakeBuffer::device_ptr`) never moves.
#[test]
fn an_update_writes_in_place_at_the_device_address() {
    use device_ops::HostStorage;
    let platform = FakePlatform::new(FakeConfig::default());
    let storage = super::FakeStorage {
        platform: &platform,
    };
    let buf = storage.kernel_write(vec![1, 2, 3, 4]).unwrap();
    let fake = buf.as_any().downcast_ref::<crate::FakeBuffer>().unwrap();
    let addr = fake.device_ptr();
    storage.kernel_update(&*buf, vec![5, 6, 7, 8]).unwrap();
    assert_eq!(fake.device_ptr(), addr, "the update moved the buffer");
    // SAFETY: `addr` is the address of the 4 bytes of `buf`, alive until
    // the end of the test, and nothing writes them while they are read.
    let seen = unsafe { std::slice::from_raw_parts(addr as *const u8, 4) };
    assert_eq!(seen, [5, 6, 7, 8]);
}
