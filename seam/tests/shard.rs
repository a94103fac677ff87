//! Sharded staging over N fake devices (issue 9, the CPU part).
//!
//! A small GGUF (a Q8_0 matrix split by rows, a Q8_0 expert stack split by
//! experts, an F32 norm replicated, an F32 matrix for the matmul check) is
//! planned over 1 to 4 devices and staged through `resident_weight` on one
//! `FakePlatform` per device. Each device's copies are read back and
//! checked against the bytes the writer wrote; the row and expert shards
//! must cover each split tensor exactly once; each shard must be uploaded
//! once and released once on its own device; and the mapping's resident
//! pages must be given back as for a single device.
//!
//! The row-split matmul is the CPU stand-in for the multi-GPU test: each
//! device's output rows of `y = W x`, computed from its read-back shard and
//! concatenated, equal the full product. (A column split would leave
//! partial sums of every output to be added across devices: an all-reduce,
//! which NCCL does on GPUs.)

use std::path::Path;
use std::sync::Arc;

use platform_fake::{Event, FakeCollective, FakeConfig, FakePlatform};
use proptest::prelude::*;
use rstest::rstest;
use seam::borrow::{Borrow, MapOptions, MappedFile, page_size};
use seam::collective::Collective;
use seam::gguf::{GgmlType, GgufModel, GgufWriter};
use seam::platform::{Platform, StageCounts};
use seam::residency::mapping_rss;
use seam::shard::{
    DeviceShard, ShardError, ShardPart, ShardPlan, ShardSpec, ShardStrategy, ShardedWeights,
    WeightPlan, replicated_readers, split_even, stage_shards, stage_shards_once,
};
use seam::weight::{HostBytes, Role, Weight};
use seam_tools::demo::pseudo_random_bytes;
use sha2::{Digest, Sha256};

/// A Q8_0 matrix: rows of 4096 elements (128 blocks, 4352 bytes, not a
/// multiple of the page), 1001 rows (odd against 2, 3 and 4 devices).
const MATRIX: &str = "blk.0.attn_q.weight";
const MATRIX_DIMS: [u64; 2] = [4096, 1001];
/// A Q8_0 expert stack [ne0, ne1, n_expert]: 10 experts of 96 rows.
const EXPERTS: &str = "blk.0.ffn_down_exps.weight";
const EXPERTS_DIMS: [u64; 3] = [512, 96, 10];
/// An F32 norm: replicated.
const NORM: &str = "blk.0.attn_norm.weight";
const NORM_DIMS: [u64; 1] = [4096];
/// An F32 matrix [in, out] for the matmul check.
const MATMUL: &str = "blk.0.ffn_up.weight";
const MATMUL_IN: u64 = 64;
const MATMUL_OUT: u64 = 37;

/// Deterministic F32 values in [-1, 1).
fn floats(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn f32_values(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn sha(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// The fixture: a GGUF file in a temporary directory, its model, and the
/// bytes the writer wrote for each tensor.
struct Fixture {
    _dir: tempfile::TempDir,
    model: GgufModel,
    tensors: Vec<(&'static str, Vec<u8>)>,
}

impl Fixture {
    fn bytes(&self, name: &str) -> &[u8] {
        &self.tensors.iter().find(|(n, _)| *n == name).unwrap().1
    }

    fn mapping(&self) -> &Arc<MappedFile> {
        self.model.shards()[0].mapped()
    }
}

fn q8_0_bytes(seed: u64, dims: &[u64]) -> Vec<u8> {
    let row = GgmlType::Q8_0.row_bytes(dims[0]).unwrap();
    let n = row * dims[1..].iter().product::<u64>();
    pseudo_random_bytes(seed, n as usize)
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sharded.gguf");
    let tensors = vec![
        (MATRIX, q8_0_bytes(1, &MATRIX_DIMS)),
        (EXPERTS, q8_0_bytes(2, &EXPERTS_DIMS)),
        (NORM, f32_bytes(&floats(3, NORM_DIMS[0] as usize))),
        (
            MATMUL,
            f32_bytes(&floats(4, (MATMUL_IN * MATMUL_OUT) as usize)),
        ),
    ];
    let mut w = GgufWriter::new();
    let shapes: [(GgmlType, &[u64]); 4] = [
        (GgmlType::Q8_0, &MATRIX_DIMS),
        (GgmlType::Q8_0, &EXPERTS_DIMS),
        (GgmlType::F32, &NORM_DIMS),
        (GgmlType::F32, &[MATMUL_IN, MATMUL_OUT]),
    ];
    for ((name, bytes), (ty, dims)) in tensors.iter().zip(shapes) {
        w.add_tensor(*name, ty, dims, bytes.clone()).unwrap();
    }
    w.write_file(&path).unwrap();
    let model = GgufModel::open(&path, MapOptions::default()).unwrap();
    Fixture {
        _dir: dir,
        model,
        tensors,
    }
}

fn fakes(n: usize) -> Vec<FakePlatform> {
    (0..n)
        .map(|_| FakePlatform::new(FakeConfig::default()))
        .collect()
}

fn dyns(platforms: &[FakePlatform]) -> Vec<&dyn Platform> {
    platforms.iter().map(|p| p as &dyn Platform).collect()
}

fn plan(fixture: &Fixture, n: usize) -> ShardPlan {
    ShardPlan::for_model(&fixture.model, n, |t| {
        (Role::new("test"), ShardStrategy::by_shape(&t.dims))
    })
    .unwrap()
}

/// The bytes device `platform` holds for `weight`.
fn device_bytes(platform: &dyn Platform, weight: &Weight) -> Vec<u8> {
    let copy = weight.device_copy().expect("the shard is staged");
    assert_eq!(copy.device(), platform.device_id(), "on its own device");
    let mut out = vec![0u8; copy.buffer().len() as usize];
    platform
        .backend()
        .read_back(copy.buffer(), 0, &mut out)
        .unwrap();
    out
}

fn borrow_of(weight: &Weight) -> &Borrow {
    match weight.host() {
        HostBytes::Borrow(b) => b,
        HostBytes::Owned(_) => panic!("a shard of a borrowed weight is a borrow"),
    }
}

/// The resident bytes of the mapping.
fn rss(map: &MappedFile) -> u64 {
    mapping_rss(map.bytes().as_ptr())
        .unwrap()
        .expect("the file is mapped")
}

/// Checks that the split tensor's shards, over all devices, cover every
/// byte of it exactly once.
#[track_caller]
fn assert_covered_once(weights: &ShardedWeights, tensor: usize, n_bytes: u64) {
    let mut hits = vec![0u8; n_bytes as usize];
    for sw in weights.devices().iter().flatten() {
        if sw.tensor == tensor {
            for hit in
                &mut hits[sw.shard.byte_range.start as usize..sw.shard.byte_range.end as usize]
            {
                *hit += 1;
            }
        }
    }
    if let Some(i) = hits.iter().position(|&h| h != 1) {
        panic!("tensor {tensor}: byte {i} is covered {} times", hits[i]);
    }
}

#[rstest]
fn shards_land_on_their_devices_once_and_release_their_pages(#[values(1, 2, 3, 4)] n: usize) {
    let fx = fixture();
    let plan = plan(&fx, n);
    assert_eq!(plan.n_devices(), n);
    let weights = plan.model_weights(&fx.model).unwrap();
    let map = Arc::clone(fx.mapping());

    // Every tensor's pages are resident before staging.
    let data_bytes: u64 = fx.model.total_tensor_bytes();
    for t in fx.model.tensors() {
        seam_tools::demo::fault_in_pages(fx.model.tensor_borrow(t).unwrap().bytes());
    }
    let rss_before = rss(&map);
    assert!(
        rss_before + page_size() >= data_bytes,
        "faulted in: {rss_before} of {data_bytes}"
    );

    let platforms = fakes(n);
    let staged = stage_shards(&weights, &dyns(&platforms)).unwrap();

    // The plan's shape: what each strategy gives to whom.
    let total_shards: usize = weights.devices().iter().map(Vec::len).sum();
    for (tensor, wp) in plan.weights().iter().enumerate() {
        let source = fx.bytes(&wp.spec.name);
        assert_eq!(wp.n_bytes, source.len() as u64, "{}", wp.spec.name);
        match wp.spec.strategy {
            ShardStrategy::Replicate => {
                assert_eq!(wp.spec.name, NORM);
                assert_eq!(wp.shards.len(), n, "whole on every device");
            }
            ShardStrategy::Rows | ShardStrategy::Experts => {
                assert_covered_once(&weights, tensor, wp.n_bytes);
                // The concatenation of the shards, in device order, is the
                // tensor: no overlap, no gap, nothing reordered.
                let mut whole = Vec::new();
                for (d, p) in platforms.iter().enumerate() {
                    for sw in weights.device(d).iter().filter(|s| s.tensor == tensor) {
                        whole.extend(device_bytes(p, &sw.weight));
                    }
                }
                assert_eq!(sha(&whole), sha(source), "{}", wp.spec.name);
            }
        }
    }
    let matrix = plan.weight(MATRIX).unwrap();
    assert_eq!(matrix.spec.strategy, ShardStrategy::Rows);
    assert_eq!(matrix.shards.len(), n);
    for s in &matrix.shards {
        // Whole rows, hence whole Q8_0 blocks.
        assert_eq!(s.byte_range.start % matrix.row_bytes, 0);
        assert_eq!(s.len() % matrix.row_bytes, 0);
        assert_eq!(s.byte_range.start % GgmlType::Q8_0.type_size(), 0);
        let ShardPart::Rows(rows) = &s.part else {
            panic!("a row shard")
        };
        assert_eq!(s.dims, vec![MATRIX_DIMS[0], rows.end - rows.start]);
        let even = MATRIX_DIMS[1] / n as u64;
        assert!((even..=even + 1).contains(&(rows.end - rows.start)));
    }
    let experts = plan.weight(EXPERTS).unwrap();
    assert_eq!(experts.spec.strategy, ShardStrategy::Experts);
    for s in &experts.shards {
        let ShardPart::Experts(e) = &s.part else {
            panic!("an expert shard")
        };
        let expert_bytes = experts.row_bytes * EXPERTS_DIMS[1];
        assert_eq!(s.byte_range, e.start * expert_bytes..e.end * expert_bytes);
        assert_eq!(
            s.dims,
            vec![EXPERTS_DIMS[0], EXPERTS_DIMS[1], e.end - e.start]
        );
    }

    for (d, p) in platforms.iter().enumerate() {
        let shards = weights.device(d);
        // Each device received exactly the bytes of its shards, and its
        // shards are zero-copy sub-spans of the file's mapping.
        for sw in shards {
            let name = sw.weight.name();
            let tensor = fx.model.tensor(name).unwrap();
            let expected = &fx.bytes(name)
                [sw.shard.byte_range.start as usize..sw.shard.byte_range.end as usize];
            assert_eq!(sw.shard.device, d);
            assert_eq!(
                sha(&device_bytes(p, &sw.weight)),
                sha(expected),
                "{name} on {d}"
            );
            let b = borrow_of(&sw.weight);
            assert!(Arc::ptr_eq(b.file(), &map), "the same mapping");
            assert_eq!(b.file_identity(), map.identity());
            assert_eq!(b.offset(), tensor.offset + sw.shard.byte_range.start);
            assert_eq!(b.len(), sw.shard.len());
            assert_eq!(sw.weight.dims(), sw.shard.dims.as_slice());
        }
        let norm = shards.iter().find(|s| s.weight.name() == NORM).unwrap();
        assert_eq!(device_bytes(p, &norm.weight), fx.bytes(NORM), "whole norm");

        // Uploaded once and released once per shard, on this device.
        let planned: u64 = shards.iter().map(|s| s.shard.len()).sum();
        assert_eq!(planned, plan.device_bytes()[d]);
        let counts = p.stage_counters().snapshot();
        assert_eq!(staged[d].device, d);
        assert_eq!(staged[d].shards, shards.len());
        assert_eq!(staged[d].planned_bytes, planned);
        assert_eq!(staged[d].counts, counts, "first staging counts it all");
        assert_eq!(counts.uploads, shards.len() as u64);
        assert_eq!(counts.uploaded_bytes, planned);
        assert_eq!(counts.releases, shards.len() as u64);
        assert_eq!(counts.released_span_bytes, planned);
        let events = p.events();
        let count = |f: fn(&Event) -> bool| events.iter().filter(|e| f(e)).count();
        assert_eq!(count(|e| matches!(e, Event::Alloc { .. })), shards.len());
        assert_eq!(
            count(|e| matches!(e, Event::CopyQueued { .. })),
            shards.len()
        );
        let mut released: Vec<&str> = events
            .iter()
            .filter_map(|e| match e {
                Event::Release {
                    weight,
                    borrowed,
                    pending_copies,
                    ..
                } => {
                    assert!(*borrowed);
                    assert_eq!(*pending_copies, 0, "released after the copy landed");
                    Some(weight.as_str())
                }
                _ => None,
            })
            .collect();
        let mut names: Vec<&str> = shards.iter().map(|s| s.weight.name()).collect();
        released.sort_unstable();
        names.sort_unstable();
        assert_eq!(released, names, "each shard released once, on its device");
    }

    // Staging again is the memo: nothing uploaded, nothing released.
    let again = stage_shards(&weights, &dyns(&platforms)).unwrap();
    for (d, s) in again.iter().enumerate() {
        assert_eq!(s.counts, StageCounts::default(), "device {d}");
        assert_eq!(platforms[d].counters().copies_queued, s.shards as u64);
    }

    // Host residency: the shards' whole pages were given back, as on one
    // device. What stays is at most the partial page at either end of each
    // shard, and the header's page.
    let rss_after = rss(&map);
    let bound = page_size() * (2 * total_shards as u64 + 1);
    assert!(
        rss_after <= bound,
        "{n} devices: mapping Rss {rss_after} after staging, bound {bound} ({total_shards} shards)"
    );
    assert!(
        rss_after * 4 <= rss_before,
        "{n} devices: Rss {rss_before} -> {rss_after}"
    );
}

/// `y = W x` for `W` of GGUF dims `[in, out]` (row `r` is output `r`).
fn matvec(w: &[f32], x: &[f32]) -> Vec<f32> {
    w.chunks_exact(x.len())
        .map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum())
        .collect()
}

#[rstest]
fn row_split_matmul_concatenates_to_the_full_product(#[values(1, 2, 3, 4)] n: usize) {
    let fx = fixture();
    let plan = plan(&fx, n);
    assert_eq!(
        plan.weight(MATMUL).unwrap().spec.strategy,
        ShardStrategy::Rows
    );
    let weights = plan.model_weights(&fx.model).unwrap();
    let platforms = fakes(n);
    stage_shards(&weights, &dyns(&platforms)).unwrap();

    let x = floats(5, MATMUL_IN as usize);
    let full = matvec(&f32_values(fx.bytes(MATMUL)), &x);
    // Each device computes its output rows from what it holds; a row split
    // needs only a concatenation (a column split would need an all-reduce).
    let mut gathered = Vec::new();
    for (d, p) in platforms.iter().enumerate() {
        for sw in weights
            .device(d)
            .iter()
            .filter(|s| s.weight.name() == MATMUL)
        {
            let w = f32_values(&device_bytes(p, &sw.weight));
            let ShardPart::Rows(rows) = &sw.shard.part else {
                panic!("a row shard")
            };
            assert_eq!(
                rows.start,
                gathered.len() as u64,
                "device order is row order"
            );
            let partial = matvec(&w, &x);
            assert_eq!(partial.len() as u64, rows.end - rows.start);
            gathered.extend(partial);
        }
    }
    assert_eq!(gathered.len(), full.len());
    for (i, (a, b)) in gathered.iter().zip(&full).enumerate() {
        assert!((a - b).abs() <= 1e-5, "y[{i}]: {a} vs {b}");
    }
}

fn spec(name: &str, ggml_type: GgmlType, dims: &[u64], strategy: ShardStrategy) -> ShardSpec {
    ShardSpec {
        name: name.into(),
        ggml_type,
        dims: dims.to_vec(),
        role: Role::new("test"),
        strategy,
    }
}

#[test]
fn shapes_that_do_not_fit_their_strategy_are_refused() {
    let shape = |s: ShardSpec| matches!(WeightPlan::new(s, 2), Err(ShardError::Shape { .. }));
    assert!(shape(spec("v", GgmlType::F32, &[8], ShardStrategy::Rows)));
    assert!(shape(spec(
        "m",
        GgmlType::F32,
        &[8, 4],
        ShardStrategy::Experts
    )));
    assert!(shape(spec(
        "s",
        GgmlType::F32,
        &[8, 4, 2, 2],
        ShardStrategy::Experts
    )));
    // A row that is not whole blocks cannot be split on a block boundary.
    assert!(shape(spec(
        "q",
        GgmlType::Q8_0,
        &[48, 4],
        ShardStrategy::Rows
    )));
    assert!(shape(spec(
        "o",
        GgmlType::F32,
        &[u64::MAX, 2],
        ShardStrategy::Rows
    )));
    assert!(matches!(
        WeightPlan::new(spec("m", GgmlType::F32, &[8, 4], ShardStrategy::Rows), 0),
        Err(ShardError::NoDevices)
    ));
    assert!(matches!(ShardPlan::new(0, []), Err(ShardError::NoDevices)));
}

#[test]
fn more_devices_than_rows_leaves_the_last_devices_without_a_shard() {
    let wp = WeightPlan::new(spec("m", GgmlType::F16, &[4, 2], ShardStrategy::Rows), 4).unwrap();
    assert_eq!(
        wp.shards,
        vec![
            DeviceShard {
                device: 0,
                byte_range: 0..8,
                part: ShardPart::Rows(0..1),
                dims: vec![4, 1],
            },
            DeviceShard {
                device: 1,
                byte_range: 8..16,
                part: ShardPart::Rows(1..2),
                dims: vec![4, 1],
            },
        ]
    );
    let e = WeightPlan::new(
        spec("e", GgmlType::F32, &[2, 3, 5], ShardStrategy::Experts),
        3,
    )
    .unwrap();
    let groups: Vec<_> = e.shards.iter().map(|s| s.part.clone()).collect();
    assert_eq!(
        groups,
        vec![
            ShardPart::Experts(0..2),
            ShardPart::Experts(2..4),
            ShardPart::Experts(4..5)
        ]
    );
    assert_eq!(e.shards[2].byte_range, 96..120);
}

fn write_one(path: &Path, dims: &[u64]) -> GgufModel {
    let n = dims.iter().product::<u64>() as usize;
    let mut w = GgufWriter::new();
    w.add_tensor("t", GgmlType::I8, dims, pseudo_random_bytes(9, n))
        .unwrap();
    w.write_file(path).unwrap();
    GgufModel::open(path, MapOptions::default()).unwrap()
}

#[test]
fn staging_needs_one_distinct_device_per_planned_device_and_the_planned_size() {
    let dir = tempfile::tempdir().unwrap();
    let model = write_one(&dir.path().join("one.gguf"), &[16, 8]);
    let plan = ShardPlan::for_model(&model, 2, |_| (Role::new("t"), ShardStrategy::Rows)).unwrap();
    let weights = plan.model_weights(&model).unwrap();
    let platforms = fakes(3);
    assert!(matches!(
        stage_shards(&weights, &dyns(&platforms)),
        Err(ShardError::DeviceCount {
            planned: 2,
            given: 3
        })
    ));
    let same: [&dyn Platform; 2] = [&platforms[0], &platforms[0]];
    assert!(matches!(
        stage_shards(&weights, &same),
        Err(ShardError::SameDevice {
            first: 0,
            second: 1
        })
    ));
    assert_eq!(platforms[0].counters().copies_queued, 0, "nothing staged");

    // A borrow of the wrong size, and a tensor the model lacks.
    let t = &model.tensors()[0];
    let borrow = model.tensor_borrow(t).unwrap();
    let short = borrow.sub_span(0, borrow.len() - 1).unwrap();
    assert!(matches!(
        plan.weights()[0].shard_weights(&short),
        Err(ShardError::Length { .. })
    ));
    let other = write_one(&dir.path().join("other.gguf"), &[16, 8]);
    let renamed =
        ShardPlan::new(2, [spec("u", GgmlType::I8, &[16, 8], ShardStrategy::Rows)]).unwrap();
    assert!(matches!(
        renamed.model_weights(&other),
        Err(ShardError::UnknownTensor(name)) if name == "u"
    ));
}

proptest! {
    #[test]
    fn row_ranges_partition_the_rows(
        rows in 0u64..5000,
        row_bytes in 1u64..300,
        n in 1usize..17,
    ) {
        let ranges = split_even(rows, n);
        prop_assert_eq!(ranges.len(), n);
        let mut next = 0;
        for r in &ranges {
            prop_assert_eq!(r.start, next);
            prop_assert!(r.end >= r.start);
            let len = r.end - r.start;
            prop_assert!(len == rows / n as u64 || len == rows / n as u64 + 1);
            next = r.end;
        }
        prop_assert_eq!(next, rows);

        // The plan: the non-empty ranges, in device order, on whole rows.
        let wp = WeightPlan::new(
            spec("w", GgmlType::I8, &[row_bytes, rows], ShardStrategy::Rows),
            n,
        )
        .unwrap();
        prop_assert_eq!(wp.row_bytes, row_bytes);
        prop_assert_eq!(wp.n_bytes, rows * row_bytes);
        let kept: Vec<_> = ranges.iter().enumerate().filter(|(_, r)| r.end > r.start).collect();
        prop_assert_eq!(wp.shards.len(), kept.len());
        for (s, (d, r)) in wp.shards.iter().zip(kept) {
            prop_assert_eq!(s.device, d);
            prop_assert_eq!(&s.part, &ShardPart::Rows(r.clone()));
            prop_assert_eq!(&s.byte_range, &(r.start * row_bytes..r.end * row_bytes));
            prop_assert_eq!(&s.dims, &vec![row_bytes, r.end - r.start]);
        }
    }
}

/// The fixture planned with its norm and its F32 matrix replicated (two
/// replicated weights, so their reads are dealt to devices 0 and 1).
fn plan_replicating(fixture: &Fixture, n: usize) -> ShardPlan {
    ShardPlan::for_model(&fixture.model, n, |t| {
        let strategy = if t.name == MATMUL {
            ShardStrategy::Replicate
        } else {
            ShardStrategy::by_shape(&t.dims)
        };
        (Role::new("test"), strategy)
    })
    .unwrap()
}

fn collectives(group: &[FakeCollective]) -> Vec<&dyn Collective> {
    group.iter().map(|c| c as &dyn Collective).collect()
}

/// With collectives, each replicated weight is read from the file by one
/// device and reaches the others by broadcast: over all devices the bytes
/// read equal the model's bytes (each byte once), every device holds the
/// file's bytes, and the copies received count as receives. Staging every
/// replicated weight on every device from the file (no broadcast) reads
/// more, which is what the counts must tell apart.
#[rstest]
fn replicated_weights_are_read_once_and_broadcast(#[values(1, 2, 3)] n: usize) {
    let fixture = fixture();
    let plan = plan_replicating(&fixture, n);
    let weights = plan.model_weights(&fixture.model).unwrap();
    let platforms = fakes(n);
    let group = FakeCollective::group(n);
    let staged = stage_shards_once(&weights, &dyns(&platforms), &collectives(&group)).unwrap();

    let model_bytes: u64 = fixture.tensors.iter().map(|(_, b)| b.len() as u64).sum();
    let read: u64 = staged.iter().map(|s| s.counts.uploaded_bytes).sum();
    assert_eq!(read, model_bytes, "each byte of the file read once");
    let replicated = [NORM, MATMUL];
    let replicated_bytes: u64 = replicated
        .iter()
        .map(|name| fixture.bytes(name).len() as u64)
        .sum();
    let received: u64 = staged.iter().map(|s| s.counts.received_bytes).sum();
    assert_eq!(received, replicated_bytes * (n as u64 - 1));

    let readers = replicated_readers(&weights);
    assert_eq!(readers.len(), 2);
    let mut read_by: Vec<usize> = readers.values().copied().collect();
    read_by.sort();
    assert_eq!(read_by, if n == 1 { vec![0, 0] } else { vec![0, 1] });
    for (d, (platform, shards)) in platforms.iter().zip(weights.devices()).enumerate() {
        let receives = shards
            .iter()
            .filter(|s| readers.get(&s.tensor).is_some_and(|&r| r != d))
            .count() as u64;
        assert_eq!(staged[d].counts.receives, receives, "device {d}");
        for sw in shards {
            let whole = fixture.bytes(sw.weight.name());
            let want = &whole[sw.shard.byte_range.start as usize..sw.shard.byte_range.end as usize];
            assert_eq!(
                sha(&device_bytes(platform, &sw.weight)),
                sha(want),
                "device {d}: {}",
                sw.weight.name()
            );
        }
    }

    // Without collectives every device reads every replicated weight.
    let again = plan.model_weights(&fixture.model).unwrap();
    let platforms = fakes(n);
    let staged = stage_shards(&again, &dyns(&platforms)).unwrap();
    let read: u64 = staged.iter().map(|s| s.counts.uploaded_bytes).sum();
    assert_eq!(read, model_bytes + replicated_bytes * (n as u64 - 1));
}

/// The ranks must agree on every broadcast: collectives out of rank order,
/// of another group size, or replicated weights already resident are
/// refused before anything is staged; a device that fails before the
/// broadcasts makes the others skip them (no rank waits for it), and its
/// own failure is the one reported.
#[test]
fn broadcasts_need_agreeing_ranks_and_a_failure_stops_them_all() {
    let fixture = fixture();
    let plan = plan_replicating(&fixture, 2);
    let weights = plan.model_weights(&fixture.model).unwrap();
    let platforms = fakes(2);
    let group = FakeCollective::group(2);
    let swapped = [&group[1] as &dyn Collective, &group[0]];
    assert!(matches!(
        stage_shards_once(&weights, &dyns(&platforms), &swapped),
        Err(ShardError::Ranks {
            index: 0,
            rank: 1,
            ..
        })
    ));
    let three = FakeCollective::group(3);
    assert!(matches!(
        stage_shards_once(&weights, &dyns(&platforms), &collectives(&three[..2])),
        Err(ShardError::Ranks { n_ranks: 3, .. })
    ));
    assert!(matches!(
        stage_shards_once(&weights, &dyns(&platforms), &collectives(&group[..1])),
        Err(ShardError::Ranks { .. })
    ));
    assert_eq!(platforms[0].counters().allocs, 0, "nothing staged");

    // A replicated weight already resident on one device.
    let norm = weights
        .device(1)
        .iter()
        .find(|s| s.weight.name() == NORM)
        .unwrap();
    let queue = platforms[1].backend().create_queue().unwrap();
    seam::resident_weight(&norm.weight, &platforms[1], &*queue).unwrap();
    assert!(matches!(
        stage_shards_once(&weights, &dyns(&platforms), &collectives(&group)),
        Err(ShardError::AlreadyResident { device: 1, .. })
    ));

    // Device 1 fails its first allocation: device 0 reads its shards and
    // then makes no broadcast.
    let weights = plan.model_weights(&fixture.model).unwrap();
    let platforms = [
        FakePlatform::new(FakeConfig::default()),
        FakePlatform::new(FakeConfig {
            fail_alloc: Some(0),
            ..FakeConfig::default()
        }),
    ];
    let group = FakeCollective::group(2);
    let err = stage_shards_once(&weights, &dyns(&platforms), &collectives(&group)).unwrap_err();
    assert!(matches!(err, ShardError::Seam { device: 1, .. }), "{err}");
    assert_eq!(platforms[0].stage_counters().snapshot().receives, 0);
}
