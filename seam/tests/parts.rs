//! Real parts as the seam sees them: one row per part with the attributes
//! its driver reports, the policy `DevicePolicy::from_probe` derives, and
//! what a load on a fake device configured as that part does (stages or
//! not, prefault default, release of borrows and of owned buffers, the
//! mapping's residency after the load).
//!
//! Where each attribute value comes from is cited on its row. The rule under
//! test: pageable memory access decides; "integrated" decides nothing,
//! because a `cuMemAlloc`/`hipMalloc` allocation is a separate copy on
//! integrated parts too (the seed's wedged host was such an APU).

use std::sync::Arc;

use platform_fake::{FakeConfig, FakePlatform};
use rstest::rstest;
use seam::borrow::{Borrow, MapOptions, MappedFile, page_size};
use seam::gguf::GgmlType;
use seam::platform::{DevicePolicy, DeviceProbe, Platform};
use seam::policy::prefault_for_device;
use seam::residency::mapping_rss;
use seam::weight::{HostView, Role, Weight};
use seam::{Resident, resident_weight};
use seam_tools::demo::pseudo_random_bytes;

const MIB: u64 = 1 << 20;

/// What a part's driver reports (the two attributes the policy reads).
#[derive(Clone, Copy, Debug)]
struct Attributes {
    pageable_memory_access: bool,
    integrated: bool,
}

/// What the seam must do on that part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Expected {
    stages: bool,
    prefault: bool,
    releases_borrows: bool,
    releases_owned: bool,
}

/// Stages every weight, prefault off, gives host bytes back.
const STAGE_AND_RELEASE: Expected = Expected {
    stages: true,
    prefault: false,
    releases_borrows: true,
    releases_owned: true,
};

/// Kernels read the mapped file: nothing staged, nothing released.
const READ_IN_PLACE: Expected = Expected {
    stages: false,
    prefault: true,
    releases_borrows: false,
    releases_owned: false,
};

fn probe(name: &str, attributes: Attributes) -> DeviceProbe {
    DeviceProbe {
        ordinal: 0,
        name: name.to_owned(),
        total_bytes: 1 << 36,
        free_bytes: 1 << 35,
        pageable_memory_access: attributes.pageable_memory_access,
        integrated: attributes.integrated,
    }
}

/// Three weights over one file-backed mapping, spans not page-aligned.
struct Model {
    _dir: tempfile::TempDir,
    map: Arc<MappedFile>,
    weights: Vec<Weight>,
}

fn model() -> Model {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("part.gguf");
    std::fs::write(&path, pseudo_random_bytes(12, (6 * MIB) as usize)).unwrap();
    let map = MappedFile::open(&path, MapOptions::default()).unwrap();
    let spans = [
        (100, 2 * MIB),
        (2 * MIB + 100, 2 * MIB),
        (4 * MIB + 100, MIB),
    ];
    let weights = spans
        .iter()
        .enumerate()
        .map(|(i, &(offset, len))| {
            let borrow = Borrow::new(Arc::clone(&map), offset, len).unwrap();
            Weight::borrowed(
                format!("blk.{i}.weight"),
                GgmlType::I8,
                vec![len],
                Role::new("test"),
                borrow,
            )
        })
        .collect();
    Model {
        _dir: dir,
        map,
        weights,
    }
}

fn mapping_resident(map: &MappedFile) -> u64 {
    mapping_rss(map.bytes().as_ptr()).unwrap().unwrap()
}

/// The row check: the derived policy, then a load of three borrows and
/// one owned buffer on a fake device configured as the part.
#[track_caller]
fn check(name: &str, attributes: Attributes, expected: Expected) {
    let policy = DevicePolicy::from_probe(&probe(name, attributes));
    let device = FakePlatform::new(FakeConfig::for_device(policy));
    let got_prefault = prefault_for_device(&device);
    let queue = device.backend().create_queue().unwrap();

    let m = model();
    seam_tools::demo::fault_in_pages(m.map.bytes());
    let before = mapping_resident(&m.map);
    assert!(before >= 5 * MIB, "{name}: the mapping was faulted in");

    for weight in &m.weights {
        match resident_weight(weight, &device, &*queue).unwrap() {
            Resident::Device(copy) => assert_eq!(copy.buffer().len(), weight.host().len()),
            Resident::Host(HostView::Borrow(borrow)) => {
                // Handed out in place: the weight's own borrow, no copy.
                let seam::weight::HostBytes::Borrow(own) = weight.host() else {
                    panic!("{name}: the weight is a borrow");
                };
                assert!(std::ptr::eq(borrow, own), "{name}");
            }
            Resident::Host(HostView::Owned(_)) => panic!("{name}: a borrow came back owned"),
        }
    }
    let owned = Weight::owned(
        "owned.weight",
        GgmlType::I8,
        vec![4096],
        Role::new("test"),
        vec![7u8; 4096],
    );
    resident_weight(&owned, &device, &*queue).unwrap();
    let counts = device.stage_counters().snapshot();
    let after = mapping_resident(&m.map);

    let got = Expected {
        stages: device.needs_weight_staging(),
        prefault: got_prefault,
        releases_borrows: counts.releases >= 3 && after <= 8 * page_size(),
        releases_owned: owned.host_view().is_none(),
    };
    assert_eq!(got, expected, "{name}: {policy:?}, {counts:?}, rss {after}");
    // Each staged weight uploaded once; released once where the part releases.
    let staged = if expected.stages { 4 } else { 0 };
    let released = u64::from(expected.releases_borrows) * 3 + u64::from(expected.releases_owned);
    assert_eq!(
        (counts.uploads, counts.releases),
        (staged, released),
        "{name}"
    );
    if !expected.releases_borrows {
        assert!(
            after >= before,
            "{name}: nothing given back ({after} < {before})"
        );
    }
    // The borrows stay readable whatever happened to their pages.
    for w in &m.weights {
        let view = w.host_view().unwrap();
        let offset = view.as_ptr() as usize - m.map.bytes().as_ptr() as usize;
        assert!(
            view[..] == m.map.bytes()[offset..offset + view.len()],
            "{name}"
        );
    }
}

#[rstest]
// H100/H200 (DGX, PCIe or SXM on x86): discrete, no pageable access
// without HMM. Read on this project's H200 machine (driver 580): its loads
// released every staged borrow (RssFile after 0.3 MiB), which the seam
// does only when both flags read 0; deviceQuery there: "Integrated GPU
// sharing Host Memory: No".
#[case::dgx_h100_h200(false, false, STAGE_AND_RELEASE)]
// Jetson AGX Orin (sm_87): CUDA_DEVICE_ATTRIBUTE_INTEGRATED = 1; Tegra has
// CUDA's limited unified-memory paradigm, PAGEABLE_MEMORY_ACCESS = 0 (CUDA
// C++ Programming Guide 13.x, 4.1 "Unified Memory on Windows, WSL, and
// Tegra"; CUDA for Tegra AppNote 13.x, "Memory Management").
#[case::orin(false, true, STAGE_AND_RELEASE)]
// Jetson Thor (sm_110): integrated, Tegra's limited paradigm likewise
// (same two sources): INTEGRATED = 1, PAGEABLE_MEMORY_ACCESS = 0.
#[case::thor(false, true, STAGE_AND_RELEASE)]
// GH200 (Grace Hopper, NVLink-C2C with ATS): hardware-coherent, so
// PAGEABLE_MEMORY_ACCESS = 1 (and ..._USES_HOST_PAGE_TABLES = 1); a
// discrete Hopper die, INTEGRATED = 0 (Programming Guide 4.1.1, "Unified
// Memory on Devices with Full CUDA Unified Memory Support").
#[case::gh200(true, false, READ_IN_PLACE)]
// Strix Halo, Radeon 8060S (gfx1151): an APU, hipDeviceAttributeIntegrated
// = 1; RDNA parts have no XNACK, so hipDeviceAttributePageableMemoryAccess
// = 0 (HIP docs, "Unified memory management": pageable access needs HMM
// with XNACK). The seed's wedged host.
#[case::strix_gfx1151(false, true, STAGE_AND_RELEASE)]
// MI300X (gfx942) with the default HSA_XNACK=0: discrete, Integrated = 0,
// PageableMemoryAccess = 0 (same HIP page: XNACK off, no pageable access).
#[case::mi300x(false, false, STAGE_AND_RELEASE)]
// MI300X with HSA_XNACK=1 on an HMM kernel: PageableMemoryAccess = 1.
#[case::mi300x_xnack(true, false, READ_IN_PLACE)]
// A discrete Radeon (RX 7900 XTX, gfx1100): Integrated = 0, no XNACK,
// PageableMemoryAccess = 0.
#[case::radeon_rx7900xtx(false, false, STAGE_AND_RELEASE)]
fn part_policy_and_load(
    #[case] pageable_memory_access: bool,
    #[case] integrated: bool,
    #[case] expected: Expected,
) {
    let name = format!("pageable={pageable_memory_access} integrated={integrated}");
    check(
        &name,
        Attributes {
            pageable_memory_access,
            integrated,
        },
        expected,
    );
}

/// The name never decides: an APU's name on a discrete probe, and the
/// reverse, get their attributes' policy.
#[test]
fn the_name_is_never_consulted() {
    let discrete = Attributes {
        pageable_memory_access: false,
        integrated: false,
    };
    let apu = Attributes {
        pageable_memory_access: false,
        integrated: true,
    };
    for attributes in [discrete, apu] {
        assert_eq!(
            DevicePolicy::from_probe(&probe("AMD Ryzen AI Max+ 395 (gfx1151)", attributes)),
            DevicePolicy::from_probe(&probe("NVIDIA H200", attributes)),
        );
    }
}
