//! The page-cache default of a staging device (issue 26): a model that
//! fits in the host's room keeps its pages cached after a load, so the next
//! load reads the page cache; one larger than the room (an injected memory
//! figure stands in for a small host) is dropped; a knob wins either way;
//! the policy line names the decision and its reason. Checked through a
//! session on the fake device with `mincore` on a fresh mapping (the page
//! cache's state, not this process's residency).

use std::path::{Path, PathBuf};

use platform_fake::{FakeConfig, FakePlatform};
use platform_host::HostPlatform;
use seam::borrow::{MapOptions, MappedFile};
use seam::gguf::{GgmlType, GgufWriter};
use seam::host_memory::HostMemory;
use seam::platform::Platform;
use seam::policy::{Source, Switch};
use seam::session::{Env, Session, SessionOptions};
use seam_tools::demo::pseudo_random_bytes;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A model of four 8 MiB tensors, written and synced (so its cached pages
/// are clean and can be dropped), then read whole into the page cache.
/// (The folio that holds the header stays cached after a drop: the seam
/// drops the interiors of tensor spans, and a kernel that caches the file
/// in large folios keeps a folio that is not wholly inside them; hence
/// "dropped" below means at most a tenth of the file.)
fn cached_model(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    let mut w = GgufWriter::new();
    for i in 0..4u64 {
        let name = format!("t{i}.weight");
        w.add_tensor(
            name,
            GgmlType::I8,
            &[8 * MIB],
            pseudo_random_bytes(i, 8 << 20),
        )
        .unwrap();
    }
    w.write_file(&path).unwrap();
    std::fs::File::open(&path).unwrap().sync_all().unwrap();
    std::fs::read(&path).unwrap();
    assert!(
        cached_share(&path) > 0.99,
        "the file is cached before the load"
    );
    path
}

/// The share of the file's pages in the page cache.
fn cached_share(path: &Path) -> f64 {
    let map = MappedFile::open(path, MapOptions::default()).unwrap();
    seam::ring::direct::resident_share(map.bytes()).expect("mincore")
}

fn host(available: u64, cgroup_room: Option<u64>) -> HostMemory {
    HostMemory {
        total: available,
        available,
        cgroup_room,
    }
}

fn options(vars: &[(&str, &str)], host_memory: HostMemory) -> SessionOptions {
    SessionOptions {
        env: Env::vars(vars.iter().copied()),
        host_memory: Some(host_memory),
        ..SessionOptions::default()
    }
}

/// Loads `path` through a session on `platform`; returns the policy line
/// and what of the file the page cache holds after the load.
fn load(platform: &dyn Platform, path: &Path, options: &SessionOptions) -> (String, f64) {
    let session = Session::new(platform, options).unwrap();
    let model = session.open(path).unwrap();
    let weights = session.stage_all(&model, &|_| Ok(())).unwrap();
    assert!(weights.iter().all(|w| w.device_copy().is_some()));
    let line = session.policy_line();
    drop(weights);
    drop(model);
    (line, cached_share(path))
}

#[test]
fn a_model_that_fits_stays_cached_and_one_that_does_not_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let path = cached_model(dir.path(), "model.gguf");
    let fake = FakePlatform::new(FakeConfig::default());

    let (line, share) = load(&fake, &path, &options(&[], host(64 * GIB, None)));
    assert!(share > 0.99, "kept: {share} cached; {line}");
    assert!(
        line.contains(
            "drop_page_cache=off (device default: 32.0 MiB fits in 1/2 of 64.0 GiB available)"
        ),
        "{line}"
    );

    // A host whose room is smaller than twice the model: dropped.
    let (line, share) = load(&fake, &path, &options(&[], host(48 * MIB, None)));
    assert!(share < 0.1, "dropped: {share} cached; {line}");
    assert!(
        line.contains(
            "drop_page_cache=on (device default: 32.0 MiB is more than 1/2 of 48.0 MiB available)"
        ),
        "{line}"
    );

    // The cgroup's room binds where it is the smaller figure, and says so.
    std::fs::read(&path).unwrap();
    let (line, share) = load(&fake, &path, &options(&[], host(64 * GIB, Some(48 * MIB))));
    assert!(share < 0.1, "dropped: {share} cached; {line}");
    assert!(
        line.contains("1/2 of 48.0 MiB available to the cgroup)"),
        "{line}"
    );
}

#[test]
fn a_knob_wins_over_the_sized_default_either_way() {
    let dir = tempfile::tempdir().unwrap();
    let path = cached_model(dir.path(), "model.gguf");
    let fake = FakePlatform::new(FakeConfig::default());

    // On with a host that has room: dropped all the same.
    let on = options(&[("VT_GGUF_DROP_PAGE_CACHE", "on")], host(64 * GIB, None));
    let (line, share) = load(&fake, &path, &on);
    assert!(share < 0.1, "{share} cached; {line}");
    assert!(
        line.contains("drop_page_cache=on (env VT_GGUF_DROP_PAGE_CACHE)"),
        "{line}"
    );

    // Off on a host with no room: kept all the same.
    std::fs::read(&path).unwrap();
    let off = options(&[("VT_GGUF_DROP_PAGE_CACHE", "off")], host(MIB, None));
    let (line, share) = load(&fake, &path, &off);
    assert!(share > 0.99, "{share} cached; {line}");
    assert!(
        line.contains("drop_page_cache=off (env VT_GGUF_DROP_PAGE_CACHE)"),
        "{line}"
    );
}

/// A device whose default keeps the page cache (the CPU reads the mapping)
/// keeps it whatever the host's room: only a dropping default is sized.
#[test]
fn a_device_that_keeps_the_cache_is_not_sized() {
    let dir = tempfile::tempdir().unwrap();
    let path = cached_model(dir.path(), "model.gguf");
    let host_platform = HostPlatform::new();
    let session = Session::new(&host_platform, &options(&[], host(MIB, None))).unwrap();
    let _model = session.open(&path).unwrap();
    let policy = session.policy();
    assert_eq!(policy.drop_page_cache.value, Switch(false));
    assert_eq!(policy.drop_page_cache.source, Source::DeviceDefault);
    assert!(!session.platform().residency_policy().drop_page_cache);
}

/// The decision weighs every model the session opened: a second model
/// that, with the first, no longer fits turns the drop on for both.
#[test]
fn every_model_opened_counts_toward_the_room() {
    let dir = tempfile::tempdir().unwrap();
    let first = cached_model(dir.path(), "first.gguf");
    let second = cached_model(dir.path(), "second.gguf");
    let file_bytes = std::fs::metadata(&first).unwrap().len();
    let fake = FakePlatform::new(FakeConfig::default());
    // Room for one model's files twice over, not for two.
    let room = 2 * file_bytes + 4096;
    let session = Session::new(&fake, &options(&[], host(room, None))).unwrap();
    assert_eq!(
        session.policy().drop_page_cache.source,
        Source::DeviceDefault,
        "nothing sized before a model is opened"
    );
    let _a = session.open(&first).unwrap();
    assert!(!session.platform().residency_policy().drop_page_cache);
    assert_eq!(session.policy().drop_page_cache.value, Switch(false));
    let _b = session.open(&second).unwrap();
    assert!(session.platform().residency_policy().drop_page_cache);
    let policy = session.policy();
    assert_eq!(policy.drop_page_cache.value, Switch(true));
    assert!(
        policy
            .drop_page_cache
            .source
            .to_string()
            .contains("is more than 1/2"),
        "{}",
        policy.drop_page_cache.source
    );
}
