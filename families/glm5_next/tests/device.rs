//! The device decoder ([`glm5_next::device::DeviceDecoder`]) on the fake
//! device against the host path ([`glm5_next::forward::State`]), the
//! prompt a token at a time then greedy steps: the same logits bit for bit
//! at every position (the fake device runs the CPU reference, ggml's own
//! arithmetic, as the host path does), and no byte of a staged weight read
//! back after any step; on the fixture, the committed models and every
//! generated golden's model, with F32 and F16 caches. With every bank
//! staged whole (`--stage all`), the routing on the device
//! ([`device_ops::Ops::route`], the experts by device-side ids): the same
//! logits bit for bit again, and no expert staged on a pick.

use std::path::{Path, PathBuf};

use family_kit::golden::{max_bit_diff, with_each_model};
use family_kit::{CacheType, Decoder, ExpertStaging, Family, Numerics, WeightReader};
use glm5_next::device::DeviceDecoder;
use glm5_next::forward::State;
use glm5_next::{Glm5Next, Glm5NextFamily};
use platform_fake::ops::fake_ops;
use platform_fake::{FakeConfig, FakePlatform};
use seam::borrow::MapOptions;
use seam::gguf::GgufModel;
use seam::platform::Platform;

fn data() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/glm5_next")
}

/// Runs `prompt` a token at a time, then `steps` greedy tokens (the
/// host's choices), on the host path and on the device path (each on its
/// own fake staging device); checks the device's traffic after every
/// position; returns the worst difference of any position's logits.
#[track_caller]
fn compare(
    path: &Path,
    prompt: &[u32],
    steps: usize,
    staging: ExpertStaging,
    numerics: Numerics,
) -> f64 {
    let gguf = GgufModel::open(path, MapOptions::default()).expect("open");
    // One model a device: a weight is staged on one device.
    let (model, dev_model) = (
        Glm5Next::load(&gguf).expect("load"),
        Glm5Next::load(&gguf).expect("load"),
    );
    let host_dev = FakePlatform::new(FakeConfig::default());
    let host_q = host_dev.backend().create_queue().unwrap();
    let dev = FakePlatform::new(FakeConfig::default());
    let dev_q = dev.backend().create_queue().unwrap();
    let mut host = State::new(
        &model,
        WeightReader::new(&host_dev, &*host_q),
        prompt.len(),
        numerics,
    )
    .expect("host");
    let mut device = DeviceDecoder::new(
        &dev_model,
        &dev,
        &*dev_q,
        Box::new(fake_ops(&dev)),
        staging,
        prompt.len(),
        numerics,
    )
    .expect("device decoder");
    assert_eq!(device.staging(), staging);
    let whole_staged = || {
        dev_model
            .weights()
            .whole_stacks_made()
            .filter(|w| w.device_copy().is_some())
            .count()
    };
    let stacks_before = whole_staged();
    let mut worst = 0f64;
    let mut token = prompt[0];
    for i in 0..prompt.len() + steps {
        if i < prompt.len() {
            token = prompt[i];
        }
        let want = host.step(token).expect("host step");
        let got = device.step(token).expect("device step");
        worst = worst.max(max_bit_diff(&got, &want));
        let t = device.traffic();
        assert_eq!(
            t.weight_read_back_bytes,
            0,
            "{}: position {i}: a staged weight came back",
            path.display()
        );
        assert!(t.read_back_bytes > 0 && t.kernel_launches.unwrap() > 0);
        token = family_ops::argmax(&want) as u32;
    }
    if staging == ExpertStaging::All {
        assert!(stacks_before > 0, "no bank staged whole");
        assert_eq!(
            dev_model.weights().experts_made().count(),
            0,
            "an expert was staged on a pick"
        );
    } else {
        assert_eq!(whole_staged(), 0);
        assert!(dev_model.weights().experts_made().count() > 0);
    }
    worst
}

fn fixture_file(dir: &tempfile::TempDir) -> PathBuf {
    let path = dir.path().join("fixture.gguf");
    glm5_next::fixture::fixture()
        .writer()
        .write_file(&path)
        .expect("write the fixture");
    path
}

#[test]
fn the_device_decoder_matches_the_host_path_bit_for_bit_on_the_fixture() {
    let dir = tempfile::tempdir().unwrap();
    let path = fixture_file(&dir);
    for numerics in [Numerics::F32_CACHE, Numerics::F16_CACHE] {
        let d = compare(
            &path,
            &[1, 2, 3, 4, 5, 6, 7, 8, 9],
            8,
            ExpertStaging::OnPick,
            numerics,
        );
        eprintln!("fixture {numerics:?}: max |device - host| {d:e}");
        assert_eq!(d, 0.0, "{numerics:?}");
    }
}

#[test]
fn the_device_decoder_matches_the_host_path_bit_for_bit_on_the_committed_models() {
    let dir = data();
    for name in ["s7-d05-sparse", "s7-d05-shared3-slim", "s7-d05-mixed"] {
        let golden =
            family_kit::golden::read(&dir.join(format!("{name}.golden.json"))).expect("golden");
        let prompt = family_kit::golden::token_ids(&golden["prompt"]).expect("prompt");
        for numerics in [Numerics::F32_CACHE, Numerics::F16_CACHE] {
            let d = compare(
                &dir.join(format!("{name}.gguf")),
                &prompt,
                8,
                ExpertStaging::OnPick,
                numerics,
            );
            eprintln!("{name} {numerics:?}: max |device - host| {d:e}");
            assert_eq!(d, 0.0, "{name} {numerics:?}");
        }
    }
}

#[test]
fn the_device_decoder_matches_the_host_path_bit_for_bit_on_every_generated_golden() {
    let n = with_each_model(&data(), &mut |g, path| {
        for numerics in [Numerics::F32_CACHE, Numerics::F16_CACHE] {
            let d = compare(path, &g.prompt, 8, ExpertStaging::OnPick, numerics);
            eprintln!("{} {numerics:?}: max |device - host| {d:e}", g.name());
            assert_eq!(d, 0.0, "{} {numerics:?}", g.name());
        }
        Ok(())
    })
    .expect("the goldens' models");
    assert!(n > 0);
}

#[test]
fn the_family_contract_decodes_on_the_device_and_refuses_flash_attention_and_bf16_caches() {
    let dir = tempfile::tempdir().unwrap();
    let path = fixture_file(&dir);
    let gguf = GgufModel::open(&path, MapOptions::default()).expect("open");
    let model = Glm5Next::load(&gguf).expect("load");
    let dev = FakePlatform::new(FakeConfig::default());
    let q = dev.backend().create_queue().unwrap();
    let mut d = Glm5NextFamily::device_decoder(
        &model,
        &gguf,
        &dev,
        &*q,
        Box::new(fake_ops(&dev)),
        ExpertStaging::OnPick,
        Numerics::F32_CACHE,
    )
    .expect("device decoder");
    assert!(matches!(d, family_kit::HostOrDevice::Device(_)));
    let logits = d.prefill(&[1, 2, 3]).expect("prefill");
    assert_eq!(logits.len(), model.n_vocab());
    d.step(family_ops::argmax(&logits) as u32).expect("step");
    assert_eq!(d.traffic().weight_read_back_bytes, 0);
    assert!(d.either(|h| h.reader().kept().0, |d| d.kept()) > 0);
    let refused = |staging, numerics| {
        Glm5NextFamily::device_decoder(
            &model,
            &gguf,
            &dev,
            &*q,
            Box::new(fake_ops(&dev)),
            staging,
            numerics,
        )
        .expect_err("refused")
        .to_string()
    };
    for err in [
        refused(
            ExpertStaging::OnPick,
            Numerics {
                flash_attn: true,
                ..Numerics::F32_CACHE
            },
        ),
        refused(
            ExpertStaging::OnPick,
            Numerics {
                cache_type_k: CacheType::Bf16,
                ..Numerics::F32_CACHE
            },
        ),
    ] {
        assert!(!err.contains('\n') && !err.is_empty(), "{err}");
    }
}

#[test]
fn a_selection_llama_cpp_scatters_over_the_cache_matches_bit_for_bit() {
    // top_k 128 of pools of 4: 32 pools and 3 tail slots, past the 128
    // slots llama.cpp gathers, so the latent attention runs over the
    // cache with the selection as a mask.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("scattered.gguf");
    let mut spec = glm5_next::fixture::fixture();
    spec.set_key(
        "glm5-next.attention.indexer.top_k",
        seam::gguf::Value::U32(128),
    );
    spec.write_file(&path).expect("write");
    for numerics in [Numerics::F32_CACHE, Numerics::F16_CACHE] {
        let d = compare(
            &path,
            &[5, 4, 3, 2, 1, 6, 7, 8, 9, 10, 11],
            8,
            ExpertStaging::OnPick,
            numerics,
        );
        eprintln!("top_k 128 {numerics:?}: max |device - host| {d:e}");
        assert_eq!(d, 0.0, "{numerics:?}");
    }
}

#[test]
fn with_every_bank_staged_the_device_routes_and_matches_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = fixture_file(&dir);
    for path in [
        fixture,
        data().join("s7-d05-sparse.gguf"),
        data().join("s7-d05-mixed.gguf"),
    ] {
        for numerics in [Numerics::F32_CACHE, Numerics::F16_CACHE] {
            let d = compare(&path, &[1, 2, 3, 4, 5], 6, ExpertStaging::All, numerics);
            eprintln!(
                "{} --stage all {numerics:?}: max |device - host| {d:e}",
                path.display()
            );
            assert_eq!(d, 0.0, "{} {numerics:?}", path.display());
        }
    }
}
