//! The device decoder ([`qwen4_exp::device::DeviceDecoder`]) on the fake
//! device against the host path ([`qwen4_exp::family::Qwen4ExpDecoder`]):
//! the same logits within 1e-4 at every prompt position and greedy step,
//! no byte of a staged weight read back after any step, and the same
//! uploads and releases on the fake staging device. With every expert
//! stack staged whole (`--stage all`), the same logits again, no expert
//! staged on a pick, and not one router logit read back.

use std::path::{Path, PathBuf};

use family_kit::golden::max_bit_diff;
use family_kit::{Decoder, ExpertStaging, Numerics};
use platform_fake::ops::fake_ops;
use platform_fake::{FakeConfig, FakePlatform};
use qwen4_exp::Qwen4Exp;
use qwen4_exp::device::DeviceDecoder;
use qwen4_exp::family::Qwen4ExpDecoder;
use seam::borrow::MapOptions;
use seam::gguf::GgufModel;
use seam::platform::Platform;

const TOL: f64 = 1e-4;

fn data() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/qwen4exp")
}

/// Runs `prompt` one token at a time, then `steps` greedy tokens, on the
/// host path and on the device path (each on its own fake device); checks
/// every position's logits and the device's traffic; returns the worst
/// difference and the greedy tokens.
fn compare(
    path: &Path,
    prompt: &[u32],
    steps: usize,
    staging: ExpertStaging,
    numerics: Numerics,
) -> (f64, Vec<u32>) {
    let gguf = GgufModel::open(path, MapOptions::default()).expect("open");
    // One model a device: a weight is staged on one device.
    let (model, dev_model) = (
        Qwen4Exp::load(&gguf).expect("load"),
        Qwen4Exp::load(&gguf).expect("load"),
    );
    let host_dev = FakePlatform::new(FakeConfig::default());
    let host_q = host_dev.backend().create_queue().unwrap();
    let dev = FakePlatform::new(FakeConfig::default());
    let dev_q = dev.backend().create_queue().unwrap();
    let mut host =
        Qwen4ExpDecoder::new(&model, &gguf, &host_dev, &*host_q, numerics).expect("host decoder");
    let mut device = DeviceDecoder::new(
        &dev_model,
        &gguf,
        &dev,
        &*dev_q,
        Box::new(fake_ops(&dev)),
        numerics,
    )
    .expect("device decoder")
    .with_staging(staging)
    .expect("stage every stack");
    let stage_all = staging == ExpertStaging::All;
    // With every stack staged, the same decoder picking experts on the
    // host: its read-backs less the routers' are the stage-all decoder's.
    let pick_model = Qwen4Exp::load(&gguf).expect("load");
    let pick_dev = FakePlatform::new(FakeConfig::default());
    let pick_q = pick_dev.backend().create_queue().unwrap();
    let mut picked = stage_all.then(|| {
        DeviceDecoder::new(
            &pick_model,
            &gguf,
            &pick_dev,
            &*pick_q,
            Box::new(fake_ops(&pick_dev)),
            numerics,
        )
        .expect("picking decoder")
    });
    let router_bytes = (model.hparams().n_expert as usize * 4 * model.hparams().n_layer) as u64;
    if stage_all {
        assert!(dev_model.whole_stacks_made().count() > 0);
        for w in dev_model.whole_stacks_made() {
            assert!(w.device_copy().is_some(), "{} staged whole", w.name());
        }
    }

    let mut worst: f64 = 0.0;
    let mut generated = Vec::new();
    let mut feed = prompt.to_vec();
    let mut pooled_seen = false;
    for i in 0..prompt.len() + steps - 1 {
        let t = if i < prompt.len() {
            feed[i]
        } else {
            *generated.last().unwrap()
        };
        let h = host.step(t).expect("host step");
        let before = device.traffic().read_back_bytes;
        let d = device.step(t).expect("device step");
        if let Some(p) = picked.as_mut() {
            let p_before = p.traffic().read_back_bytes;
            p.step(t).expect("picking step");
            assert_eq!(
                (p.traffic().read_back_bytes - p_before)
                    - (device.traffic().read_back_bytes - before),
                router_bytes,
                "position {i}: the stage-all decoder reads back all but the routers' logits"
            );
        }
        let diff = max_bit_diff(&h, &d);
        let scale = h.iter().fold(0f32, |m, v| m.max(v.abs()));
        println!("position {i}: max abs diff {diff:.3e}, max |logit| {scale:.3e}");
        worst = worst.max(diff);
        let traffic = device.traffic();
        assert_eq!(
            traffic.weight_read_back_bytes, 0,
            "position {i}: a product read a staged weight back"
        );
        assert!(traffic.kernel_launches.unwrap_or(0) > 0);
        assert!(
            diff <= TOL,
            "position {i}: device logits {diff:.3e} from the host's"
        );
        // What the QSA selection scores (a selection moves only where a
        // ranking flips, which the logits rarely show): within a few ulps
        // of the host's (the products' sums may take another order; an
        // F16 cache's rounding of the raw keys moves them by about 1e-4).
        for il in 0..model.hparams().n_layer {
            let (hk, dk) = (host.qsa_pooled_keys(il), device.qsa_pooled_keys(il));
            assert_eq!(
                hk.map(|k| k.len()),
                dk.map(|k| k.len()),
                "position {i}, layer {il}: pooled blocks"
            );
            for (b, (h, d)) in hk.unwrap_or(&[]).iter().zip(dk.unwrap_or(&[])).enumerate() {
                let scale = h.iter().fold(0f32, |m, v| m.max(v.abs()));
                let far = h
                    .iter()
                    .zip(d)
                    .map(|(h, d)| f64::from((h - d).abs()) / f64::from(scale))
                    .fold(0f64, f64::max);
                assert!(
                    far <= 1e-5,
                    "{numerics:?}, position {i}, layer {il}, block {b}: the QSA indexer's pooled key {far:.2e} from the host's"
                );
            }
            pooled_seen |= host.qsa_pooled_keys(il).is_some_and(|k| !k.is_empty());
        }
        if i + 1 >= prompt.len() {
            generated.push(family_ops::argmax(&h) as u32);
            assert_eq!(
                family_ops::argmax(&d),
                family_ops::argmax(&h),
                "position {i}: greedy picks"
            );
        }
        feed.push(t);
    }
    assert!(pooled_seen, "no QSA block was pooled");
    if stage_all {
        assert_eq!(
            dev_model.experts_made().count(),
            0,
            "no expert staged on a pick"
        );
        assert_eq!(device.traffic().weight_read_back_bytes, 0);
        return (worst, generated);
    }
    let (hs, ds) = (
        host_dev.stage_counters().snapshot(),
        dev.stage_counters().snapshot(),
    );
    assert_eq!(ds.uploads, hs.uploads, "uploads");
    assert_eq!(ds.releases, hs.releases, "releases");
    assert_eq!(ds.uploaded_bytes, hs.uploaded_bytes, "uploaded bytes");
    assert_eq!(
        dev.counters().releases,
        host_dev.counters().releases,
        "fake releases"
    );
    // The host path reads its weights back; the device path never does.
    assert!(host.traffic().weight_read_back_bytes > 0);
    assert_eq!(device.traffic().weight_read_back_bytes, 0);
    (worst, generated)
}

#[test]
fn the_device_decoder_matches_the_host_path_on_the_fixture() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.gguf");
    qwen4_exp::fixture::fixture().write_file(&path).unwrap();
    // The driver's default prompt, and steps past the first QSA selection
    // (position 11: top-k 8 of blocks of 4) and the PLE conv's full window.
    // F32 caches, and llama.cpp's default F16 caches (rows rounded as
    // stored on both paths).
    for numerics in [Numerics::F32_CACHE, Numerics::default()] {
        for staging in [ExpertStaging::OnPick, ExpertStaging::All] {
            let (worst, tokens) = compare(&path, &[1, 2, 3], 13, staging, numerics);
            println!(
                "fixture, {staging:?}, {numerics:?}: max abs logit diff {worst:.3e}, greedy {tokens:?}"
            );
        }
    }
}

#[test]
fn the_device_decoder_matches_the_host_path_on_the_d05_golden() {
    let stem = "llama-archs-d05";
    let golden = family_kit::golden::read(&data().join(format!("{stem}.golden.json"))).unwrap();
    let prompt = family_kit::golden::token_ids(&golden["prompt"]).expect("prompt");
    let greedy = family_kit::golden::token_ids(&golden["greedy"]).expect("greedy");
    for staging in [ExpertStaging::OnPick, ExpertStaging::All] {
        let path = data().join(format!("{stem}.gguf"));
        // The golden's caches are F32.
        let (worst, tokens) = compare(&path, &prompt, greedy.len(), staging, Numerics::F32_CACHE);
        println!("{stem}, {staging:?}: max abs logit diff {worst:.3e}, greedy {tokens:?}");
        assert_eq!(tokens, greedy, "the golden's greedy tokens");
    }
}

/// The prompt fed in batches (`Decoder::prefill`, split at `split` so the
/// second batch starts past position 0) against the host path fed the
/// same batches as ubatches (llama.cpp's batched prefill, its several-token
/// kernels, only the last position's logits asked for): the last prompt position's logits and `steps` greedy steps
/// after it equal to the bit, nothing of a weight read back; with
/// every stack staged the prompt costs less than half the kernel launches
/// of feeding it a token at a time (the ops run over every token's rows
/// at once; the PLE and QSA layers' per-token work stays per token).
fn compare_batched(
    path: &Path,
    prompt: &[u32],
    split: usize,
    steps: usize,
    staging: ExpertStaging,
    numerics: Numerics,
) {
    let gguf = GgufModel::open(path, MapOptions::default()).expect("open");
    let (model, dev_model) = (
        Qwen4Exp::load(&gguf).expect("load"),
        Qwen4Exp::load(&gguf).expect("load"),
    );
    let host_dev = FakePlatform::new(FakeConfig::default());
    let host_q = host_dev.backend().create_queue().unwrap();
    let dev = FakePlatform::new(FakeConfig::default());
    let dev_q = dev.backend().create_queue().unwrap();
    let mut host =
        Qwen4ExpDecoder::new(&model, &gguf, &host_dev, &*host_q, numerics).expect("host decoder");
    let mut device = DeviceDecoder::new(
        &dev_model,
        &gguf,
        &dev,
        &*dev_q,
        Box::new(fake_ops(&dev)),
        numerics,
    )
    .expect("device decoder")
    .with_staging(staging)
    .expect("staging");
    host.prefill(&prompt[..split]).expect("host first batch");
    let h = host.prefill(&prompt[split..]).expect("host second batch");
    let launches = |d: &DeviceDecoder<'_>| d.traffic().kernel_launches.unwrap_or(0);
    let l0 = launches(&device);
    device.prefill(&prompt[..split]).expect("first batch");
    let d = device.prefill(&prompt[split..]).expect("second batch");
    let prefill_launches = launches(&device) - l0;
    let diff = max_bit_diff(&h, &d);
    println!(
        "{staging:?}: prompt of {} in batches of {split} and {}: {diff:.3e}, {prefill_launches} launches",
        prompt.len(),
        prompt.len() - split
    );
    assert_eq!(
        diff, 0.0,
        "last prompt position: {diff:.3e} from the host's"
    );
    let mut t = family_ops::argmax(&h) as u32;
    assert_eq!(family_ops::argmax(&d) as u32, t, "the first greedy pick");
    let mut step_launches = 0;
    for i in 0..steps {
        let h = host.step(t).expect("host step");
        let before = launches(&device);
        let d = device.step(t).expect("device step");
        step_launches = launches(&device) - before;
        println!("{staging:?}: step {i}: {step_launches} launches");
        let diff = max_bit_diff(&h, &d);
        assert_eq!(diff, 0.0, "step {i} after the batches: {diff:.3e}");
        t = family_ops::argmax(&h) as u32;
        assert_eq!(family_ops::argmax(&d) as u32, t, "step {i}: greedy picks");
    }
    assert_eq!(device.traffic().weight_read_back_bytes, 0);
    if staging == ExpertStaging::All {
        assert!(
            2 * prefill_launches < prompt.len() as u64 * step_launches,
            "{prefill_launches} launches for two batches, {step_launches} a step"
        );
    }
}

#[test]
fn the_batched_prefill_matches_the_host_path_on_the_fixture() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.gguf");
    qwen4_exp::fixture::fixture().write_file(&path).unwrap();
    // Past the first QSA selection (position 11) and the PLE conv's full
    // window inside the batches; the split crosses a QSA block and grows
    // the KV cache (16 slots) inside the second batch, an F32 cache and an
    // F16 one (grown with its rows as stored).
    let prompt: Vec<u32> = (0..21).map(|i| (i * 7 + 1) % 64).collect();
    for numerics in [Numerics::F32_CACHE, Numerics::default()] {
        for staging in [ExpertStaging::All, ExpertStaging::OnPick] {
            compare_batched(&path, &prompt, 6, 4, staging, numerics);
        }
    }
}

#[test]
fn the_batched_prefill_matches_the_host_path_on_the_d05_golden() {
    let stem = "llama-archs-d05";
    let golden = family_kit::golden::read(&data().join(format!("{stem}.golden.json"))).unwrap();
    let prompt = family_kit::golden::token_ids(&golden["prompt"]).expect("prompt");
    let path = data().join(format!("{stem}.gguf"));
    for staging in [ExpertStaging::All, ExpertStaging::OnPick] {
        compare_batched(&path, &prompt, 5, 3, staging, Numerics::F32_CACHE);
    }
}
