//! The load session: the resolved prefault reaches the mapping (the file's
//! pages are resident after open exactly when it is on), the ring is built
//! and used on a staging device only, weights stay alive and staged after
//! `stage_all`, `mmap` off makes owned copies, and residency is sampled.

use std::path::{Path, PathBuf};
use std::time::Duration;

use platform_fake::{FakeConfig, FakePlatform};
use platform_host::HostPlatform;
use seam::gguf::{GgmlType, GgufModel, GgufWriter};
use seam::platform::Platform;
use seam::policy::Source;
use seam::residency::mapping_rss;
use seam::session::{Env, LoadError, Session, SessionOptions};
use seam::weight::{HostBytes, Role};
use seam_tools::demo::pseudo_random_bytes;

const MIB: u64 = 1 << 20;
const BIG: u64 = 8 * MIB;

/// A model with one tensor of 8 MiB and one of 1 KiB, in a fresh file.
fn model_file(dir: &Path) -> PathBuf {
    let path = dir.join("model.gguf");
    let mut w = GgufWriter::new();
    w.add_tensor(
        "big.weight",
        GgmlType::I8,
        &[BIG],
        pseudo_random_bytes(1, BIG as usize),
    )
    .unwrap();
    w.add_tensor(
        "small.weight",
        GgmlType::I8,
        &[1024],
        pseudo_random_bytes(2, 1024),
    )
    .unwrap();
    w.write_file(&path).unwrap();
    path
}

fn env(vars: &[(&str, &str)]) -> SessionOptions {
    SessionOptions {
        env: Env::vars(vars.iter().copied()),
        ..SessionOptions::default()
    }
}

/// Resident bytes of the model's mapping.
fn mapped_rss(model: &GgufModel) -> u64 {
    let shard = &model.shards()[0];
    mapping_rss(shard.mapped().bytes().as_ptr())
        .unwrap()
        .expect("the mapping is listed in smaps")
}

/// `VT_GGUF_PREFAULT` through the session decides what is resident after
/// open: on, the whole file is mapped in (MAP_POPULATE); off, only the
/// header the parser read. A literal in place of the resolved value fails
/// one of the two, on either device.
#[test]
fn the_resolved_prefault_decides_what_is_resident_after_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = model_file(dir.path());
    let fake = FakePlatform::new(FakeConfig::default());
    let host = HostPlatform::new();
    for platform in [&fake as &dyn Platform, &host] {
        for (value, on) in [("on", true), ("off", false)] {
            let session = Session::new(platform, &env(&[("VT_GGUF_PREFAULT", value)])).unwrap();
            assert_eq!(session.policy().prefault.value.0, on);
            assert_eq!(
                session.policy().prefault.source,
                Source::Env("VT_GGUF_PREFAULT")
            );
            assert!(
                session
                    .policy_line()
                    .contains(&format!("prefault={value} (env VT_GGUF_PREFAULT)")),
                "{}",
                session.policy_line()
            );
            let model = session.open(&path).unwrap();
            let rss = mapped_rss(&model);
            if on {
                assert!(rss >= BIG, "prefault on: {rss} bytes resident");
            } else {
                assert!(rss < MIB, "prefault off: {rss} bytes resident");
            }
        }
    }
}

/// Without an explicit answer the device decides: off where weights are
/// staged (the fake), on where kernels read host memory (the CPU).
#[test]
fn without_a_knob_the_device_default_prefaults_the_cpu_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = model_file(dir.path());
    let fake = FakePlatform::new(FakeConfig::default());
    let host = HostPlatform::new();
    for (platform, on) in [(&fake as &dyn Platform, false), (&host, true)] {
        let session = Session::new(platform, &env(&[])).unwrap();
        assert_eq!(session.policy().prefault.source, Source::DeviceDefault);
        let rss = mapped_rss(&session.open(&path).unwrap());
        assert_eq!(rss >= BIG, on, "{} bytes resident", rss);
    }
}

/// On a staging device the session builds the ring the knobs ask for and
/// large weights go through it; small ones, and every weight on the CPU,
/// do not; `VT_PINNED_H2D_MIB=0` turns it off.
#[test]
fn the_ring_is_built_and_used_on_a_staging_device_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = model_file(dir.path());
    let fake = FakePlatform::new(FakeConfig::default());
    let session = Session::new(&fake, &env(&[("VT_PINNED_H2D_MIB", "1")])).unwrap();
    assert!(session.platform().staging_ring().is_some());
    let model = session.open(&path).unwrap();
    let weights = session.stage_all(&model, &|_| Ok(())).unwrap();
    assert_eq!(weights.len(), 2);
    let counts = session.ring_counts().expect("a ring on the fake device");
    assert_eq!((counts.transfers, counts.bytes), (1, BIG));
    assert_eq!(fake.stage_counters().snapshot().uploads, 2);

    // With the direct-copy threshold at 0, every weight takes the ring.
    let all = Session::new(
        &fake,
        &env(&[
            ("VT_PINNED_H2D_MIB", "1"),
            ("VT_PINNED_H2D_DIRECT_BELOW", "0"),
        ]),
    )
    .unwrap();
    assert!(
        all.policy_line()
            .contains("direct_below=0 (env VT_PINNED_H2D_DIRECT_BELOW)")
    );
    all.stage_all(&all.open(&path).unwrap(), &|_| Ok(()))
        .unwrap();
    let counts = all.ring_counts().unwrap();
    assert_eq!((counts.transfers, counts.bytes), (2, BIG + 1024));

    let off = Session::new(&fake, &env(&[("VT_PINNED_H2D_MIB", "0")])).unwrap();
    assert!(off.ring_counts().is_none());
    let host = HostPlatform::new();
    let on_host = Session::new(&host, &env(&[("VT_PINNED_H2D_MIB", "1")])).unwrap();
    assert!(on_host.ring_counts().is_none());
    assert!(on_host.platform().staging_ring().is_none());
}

/// `stage_all` hands back every weight in table order, staged: asked
/// again, the memo answers and nothing is uploaded twice; the callback
/// sees each tensor once with its index.
#[test]
fn staged_weights_stay_alive_and_memoized() {
    let dir = tempfile::tempdir().unwrap();
    let path = model_file(dir.path());
    let fake = FakePlatform::new(FakeConfig::default());
    let session = Session::new(&fake, &env(&[])).unwrap();
    let model = session.open(&path).unwrap();
    let seen = std::sync::Mutex::new(Vec::new());
    let weights = session
        .stage_all(&model, &|s| {
            assert_eq!(s.tensor.name, s.weight.name());
            assert!(s.resident.device_copy().is_some());
            seen.lock().unwrap().push(s.index);
            Ok(())
        })
        .unwrap();
    let mut seen = seen.into_inner().unwrap();
    seen.sort_unstable();
    assert_eq!(seen, [0, 1]);
    let names: Vec<&str> = weights.iter().map(|w| w.name()).collect();
    assert_eq!(names, ["big.weight", "small.weight"]);
    for w in &weights {
        assert_eq!(w.role().as_str(), "tensor");
        let copy = session.resident(w).unwrap().device_copy().unwrap();
        assert_eq!(copy.buffer().len(), w.host().len());
    }
    assert_eq!(fake.stage_counters().snapshot().uploads, 2);
    assert_eq!(fake.counters().device_bytes, BIG + 1024);
    drop(weights);
    assert_eq!(fake.counters().device_bytes, 0, "freed with the weights");
}

/// A callback's error stops the load and is returned.
#[test]
fn an_error_of_the_callback_stops_the_load() {
    let dir = tempfile::tempdir().unwrap();
    let path = model_file(dir.path());
    let fake = FakePlatform::new(FakeConfig::default());
    let session = Session::new(&fake, &env(&[("VT_PINNED_H2D_MIB", "0")])).unwrap();
    let model = session.open(&path).unwrap();
    let err = session
        .stage_all(&model, &|_| {
            Err(LoadError::PageCache(std::io::Error::other("planted")))
        })
        .unwrap_err();
    assert!(err.to_string().contains("planted"), "{err}");
    assert_eq!(fake.stage_counters().snapshot().uploads, 1);
}

/// `stage_picked` stages only what `pick` chooses and hands those back
/// with their table indices; the callback's own error type comes out
/// unchanged and stops the load.
#[test]
fn stage_picked_stages_only_the_picked_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let path = model_file(dir.path());
    let fake = FakePlatform::new(FakeConfig::default());
    let session = Session::new(&fake, &env(&[])).unwrap();
    let model = session.open(&path).unwrap();
    let seen = std::sync::Mutex::new(Vec::new());
    let staged = session
        .stage_picked::<LoadError>(
            &model,
            &|index, tensor| index == 1 && tensor.name == "small.weight",
            &|s| {
                seen.lock()
                    .unwrap()
                    .push((s.index, s.weight.name().to_owned()));
                Ok(())
            },
        )
        .unwrap();
    assert_eq!(
        staged
            .iter()
            .map(|(i, w)| (*i, w.name()))
            .collect::<Vec<_>>(),
        [(1, "small.weight")]
    );
    assert_eq!(seen.into_inner().unwrap(), [(1, "small.weight".to_owned())]);
    assert_eq!(fake.stage_counters().snapshot().uploads, 1);
    assert_eq!(
        fake.counters().device_bytes,
        1024,
        "the big one was not staged"
    );

    /// An engine's own error, which a `LoadError` converts into.
    #[derive(Debug)]
    enum Engine {
        Load(LoadError),
        Callback(&'static str),
    }
    impl From<LoadError> for Engine {
        fn from(e: LoadError) -> Engine {
            Engine::Load(e)
        }
    }
    let err = session
        .stage_picked(&model, &|_, _| true, &|_| Err(Engine::Callback("stop")))
        .unwrap_err();
    assert!(matches!(err, Engine::Callback("stop")), "{err:?}");
    let nothing = session
        .stage_picked::<Engine>(&model, &|_, _| false, &|_| Ok(()))
        .unwrap();
    assert!(nothing.is_empty());
    // A staging failure arrives as the engine's own wrapping of it.
    let failing = FakePlatform::new(FakeConfig {
        fail_alloc: Some(0),
        ..FakeConfig::default()
    });
    let session = Session::new(&failing, &env(&[("VT_PINNED_H2D_MIB", "0")])).unwrap();
    let err = session
        .stage_picked::<Engine>(&model, &|index, _| index == 0, &|_| Ok(()))
        .unwrap_err();
    let Engine::Load(LoadError::Seam(e)) = err else {
        panic!("{err:?}")
    };
    assert!(e.to_string().contains("big.weight"), "{e}");
}

/// With `mmap` off the session reads tensors into owned buffers, which are
/// given back after upload; with it on, weights are borrows.
#[test]
fn mmap_off_makes_owned_weights() {
    let dir = tempfile::tempdir().unwrap();
    let path = model_file(dir.path());
    let fake = FakePlatform::new(FakeConfig::default());
    for (value, owned) in [("off", true), ("on", false)] {
        let session = Session::new(&fake, &env(&[("VT_GGUF_MMAP", value)])).unwrap();
        let model = session.open(&path).unwrap();
        let tensor = model.tensor("small.weight").unwrap();
        let weight = session.weight(&model, tensor, Role::new("w")).unwrap();
        assert_eq!(matches!(weight.host(), HostBytes::Owned(_)), owned);
        assert_eq!(
            &weight.host_view().unwrap()[..],
            &pseudo_random_bytes(2, 1024)[..]
        );
        session.resident(&weight).unwrap();
        assert_eq!(weight.host_view().is_none(), owned, "owned is given back");
    }
}

/// The environment wins over the config file, the config file over the
/// default; a config key no knob has is an error naming it.
#[test]
fn knobs_come_from_env_then_config_then_default() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("seam.json");
    std::fs::write(
        &config,
        r#"{"vllm_cpp": {"mmap": {"prefault": true}, "pinned_h2d": {"buffers": 3}}}"#,
    )
    .unwrap();
    let fake = FakePlatform::new(FakeConfig::default());
    let options = |vars: &[(&str, &str)]| SessionOptions {
        config: Some(config.clone()),
        ..env(vars)
    };
    let from_config = Session::new(&fake, &options(&[])).unwrap();
    assert_eq!(
        from_config.policy().prefault.source,
        Source::Config("vllm_cpp.mmap.prefault")
    );
    assert!(from_config.policy().prefault.value.0);
    assert_eq!(from_config.ring_policy().buffers.value, 3);
    let from_env = Session::new(&fake, &options(&[("VT_GGUF_PREFAULT", "0")])).unwrap();
    assert!(!from_env.policy().prefault.value.0);
    std::fs::write(&config, r#"{"vllm_cpp.mmap.prefetch": true}"#).unwrap();
    let err = Session::new(&fake, &options(&[])).unwrap_err();
    assert!(err.to_string().contains("vllm_cpp.mmap.prefetch"), "{err}");
}

/// Threads of this process named `name`.
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter(|t| {
            let comm = t.as_ref().unwrap().path().join("comm");
            std::fs::read_to_string(comm).is_ok_and(|c| c.trim() == name)
        })
        .count()
}

/// Waits (up to 2 s) until `n` threads are named `name`: a new thread
/// names itself once it runs, an ended one leaves `/proc` once reaped.
#[track_caller]
fn expect_threads(name: &str, n: usize) {
    let until = std::time::Instant::now() + Duration::from_secs(2);
    while threads_named(name) != n && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(threads_named(name), n, "threads named {name}");
}

/// Asked to sample, the session samples from open until
/// `finish_sampling` (or until dropped), on one named thread, with the
/// device bytes staged so far; not asked, it samples nothing. (The only
/// test here that samples, so the thread count is this test's.)
#[test]
fn residency_is_sampled_when_asked() {
    use seam::session::SAMPLER_THREAD;
    let dir = tempfile::tempdir().unwrap();
    let path = model_file(dir.path());
    let fake = FakePlatform::new(FakeConfig::default());
    let sampling_options = SessionOptions {
        sample_every: Some(Duration::from_millis(1)),
        ..env(&[])
    };
    let threads = threads_named(SAMPLER_THREAD);
    let sampled = Session::new(&fake, &sampling_options).unwrap();
    expect_threads(SAMPLER_THREAD, threads + 1);
    std::thread::sleep(Duration::from_millis(30));
    assert!(sampled.elapsed() >= Duration::from_millis(30));
    sampled
        .stage_all(&sampled.open(&path).unwrap(), &|_| Ok(()))
        .unwrap();
    let sampling = sampled.finish_sampling();
    expect_threads(SAMPLER_THREAD, threads);
    assert!(sampling.samples.len() >= 2, "{}", sampling.samples.len());
    assert_eq!(sampling.samples[0].device_bytes, 0);
    assert_eq!(
        sampling.samples.last().unwrap().device_bytes,
        BIG + 1024,
        "the last sample follows the staging"
    );
    assert!(sampling.baseline.rss > 0 && sampling.after.rss > 0);
    assert!(sampling.peak_of(|r| r.rss) >= sampling.after.rss);
    assert!(
        sampled.finish_sampling().samples.is_empty(),
        "finished once"
    );
    // On the CPU nothing is copied to a device.
    let host = HostPlatform::new();
    let on_host = Session::new(&host, &sampling_options).unwrap();
    on_host
        .stage_all(&on_host.open(&path).unwrap(), &|_| Ok(()))
        .unwrap();
    let last = on_host.finish_sampling().samples.pop().unwrap();
    assert_eq!(last.device_bytes, 0);
    // Dropped unfinished, the session stops its sampler.
    let dropped = Session::new(&fake, &sampling_options).unwrap();
    expect_threads(SAMPLER_THREAD, threads + 1);
    drop(dropped);
    expect_threads(SAMPLER_THREAD, threads);
    let quiet = Session::new(&fake, &env(&[])).unwrap();
    expect_threads(SAMPLER_THREAD, threads);
    std::thread::sleep(Duration::from_millis(5));
    assert!(quiet.finish_sampling().samples.is_empty());
}

/// The session's environment is the one it was given.
#[test]
fn env_vars_are_read_from_the_map_given() {
    let vars = Env::vars([("A", "1")]);
    assert_eq!(vars.get("A").as_deref(), Some("1"));
    assert_eq!(vars.get("PATH"), None);
    assert!(Env::Process.get("PATH").is_some());
}

/// With no knob set, the ring is the built-in shape (`RingConfig`'s
/// default: 4 x 64 MiB in 2 lanes, one reader per core up to 16), and the
/// session says which device and policy it holds.
#[test]
fn the_default_ring_is_the_built_in_shape() {
    use seam::ring::RingConfig;
    let fake = FakePlatform::new(FakeConfig::default());
    let session = Session::new(&fake, &env(&[])).unwrap();
    let shape = RingConfig::default();
    assert_eq!(session.ring_policy().ring_config(), Some(shape));
    assert_eq!(
        (
            shape.buffer_bytes,
            shape.buffers,
            shape.lanes,
            shape.direct_io
        ),
        (64 * MIB, 4, 2, seam::ring::Mode::Off)
    );
    assert_eq!(shape.direct_below, MIB);
    assert_eq!(shape.total_bytes(), 256 * MIB);
    assert!((2..=16).contains(&shape.readers));
    let ring = session.platform().staging_ring().unwrap();
    assert_eq!(ring.config(), shape);
    assert_eq!(ring.lanes(), 2);
    assert_eq!(session.ring_counts().unwrap(), Default::default());
    let debug = format!("{session:?}");
    assert!(
        debug.contains("fake") && debug.contains("prefault=off"),
        "{debug}"
    );
}

/// Sessions loading at once on one host share its cores: each device's
/// default ring gets `cores / sessions` readers (one session alone gets
/// them all), so a sharded load does not run more readers than cores.
#[test]
fn sessions_on_one_host_share_its_cores_in_the_device_default() {
    use seam::platform::TransferCaps;
    use seam::ring::{device_default, host_cores};
    use seam::session::cores_per_session;
    let dma = FakeConfig {
        caps: TransferCaps {
            pinned_dma: true,
            register_host: false,
        },
        ..FakeConfig::default()
    };
    let fake = FakePlatform::new(dma);
    for sessions in [0, 1, 2, 3] {
        let options = SessionOptions {
            sessions_on_host: sessions,
            ..env(&[])
        };
        let session = Session::new(&fake, &options).unwrap();
        let share = cores_per_session(host_cores(), sessions);
        assert_eq!(session.ring_policy().cores, share, "{sessions} sessions");
        assert_eq!(
            session.ring_policy().ring_config(),
            device_default(share, fake.backend().transfer_caps()),
            "{sessions} sessions"
        );
    }
    for (cores, sessions, share) in [
        (32, 2, 16),
        (32, 0, 32),
        (32, 1, 32),
        (3, 4, 1),
        (33, 2, 16),
    ] {
        assert_eq!(
            cores_per_session(cores, sessions),
            share,
            "{cores} cores, {sessions} sessions"
        );
    }
}

/// Debug output of a weight names it, its type, shape and role, and its
/// device copy once staged (device and length), never the bytes.
#[test]
fn debug_output_of_a_weight_and_its_device_copy() {
    let dir = tempfile::tempdir().unwrap();
    let path = model_file(dir.path());
    let fake = FakePlatform::new(FakeConfig::default());
    let session = Session::new(&fake, &env(&[])).unwrap();
    let model = session.open(&path).unwrap();
    let tensor = model.tensor("small.weight").unwrap();
    let weight = session.weight(&model, tensor, Role::new("norm")).unwrap();
    let before = format!("{weight:?}");
    for part in ["small.weight", "I8", "1024", "norm", "device: None"] {
        assert!(before.contains(part), "{part} in {before}");
    }
    let copy = session.resident(&weight).unwrap().device_copy().unwrap();
    let staged = format!("{copy:?}");
    assert!(
        staged.starts_with("DeviceCopy") && staged.contains("len: 1024"),
        "{staged}"
    );
    assert!(format!("{weight:?}").contains("DeviceCopy"));
    assert_eq!(copy.device(), fake.device_id());
}
