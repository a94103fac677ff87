//! The op-by-op conformance check on a GPU: every op of [`CudaOps`] on
//! random inputs against the CPU reference, weights staged by the seam on
//! the device and read there.
//!
//! Built only with the `gpu-tests` feature, so it never runs (and never
//! passes) where there is no GPU; where it runs it needs one, and fails
//! naming why when it finds none. Build the binary here and run it on the
//! GPU machine (no Rust needed there):
//!
//! ```text
//! cargo test -p platform-cuda --features gpu-tests --test gpu_ops --no-run
//! # prints the binary: target/debug/deps/gpu_ops-<hash>
//! LD_LIBRARY_PATH=<dir with libnvrtc.so> ./gpu_ops-<hash> --nocapture
//! ```
//!
//! `SEAM_CUDA_DEVICE` picks the ordinal (default 0).

use device_ops::Ops;
use device_ops::conformance::{self, Staging, WEIGHT_TYPES};
use platform_cuda::CudaPlatform;
use platform_cuda::ops::CudaOps;
use seam::platform::Platform;

#[test]
fn cuda_ops_match_the_cpu_reference() {
    let ordinal: i32 = std::env::var("SEAM_CUDA_DEVICE")
        .ok()
        .map(|v| v.parse().expect("SEAM_CUDA_DEVICE is an ordinal"))
        .unwrap_or(0);
    let platform = CudaPlatform::open(ordinal)
        .unwrap_or_else(|e| panic!("this test needs a CUDA device and found none usable: {e}"));
    let queue = platform.backend().create_queue().unwrap();
    let ops = CudaOps::new(&platform, &*queue).unwrap_or_else(|e| panic!("{e}"));
    let report = conformance::check(
        &ops,
        Staging {
            platform: &platform,
            queue: &*queue,
        },
        WEIGHT_TYPES,
    );
    println!(
        "{} ({}), {:?}\n{}",
        platform.probe().name,
        ops.device_name(),
        ops.counters(),
        report.table()
    );
    report.assert_passed();
    assert_eq!(ops.counters().weight_read_back_bytes, 0);
    // The weights (a table, three or four matrices of few rows and two
    // expert stacks per type; muse_glimmer's ops: the projector's products by
    // three weights) were staged on the device (a part that reads
    // pageable memory would hand the host bytes out instead; H200 stages).
    if platform.needs_weight_staging() {
        assert_eq!(
            platform.stage_counters().snapshot().uploads,
            WEIGHT_TYPES
                .iter()
                .map(|t| 6 + u64::from(t.block_size() == 32))
                .sum::<u64>()
                + 3
        );
    }
}
