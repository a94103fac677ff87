//! The device decoder ([`muse_glimmer::device::DeviceDecoder`]) on the
//! fake device against the host path (llama.cpp's CPU graph bit for bit):
//! the same logits to the bit (tolerance 0) at every prompt position and
//! greedy step, fed a token at a time and as batched prefills, with F32
//! and F16 caches; no byte of a staged weight read back after any call;
//! the committed goldens' llama.cpp logits (one token at a time) matched
//! to the bit through the device path.

use std::path::{Path, PathBuf};

use family_kit::golden::{max_abs_diff, max_bit_diff, with_each_model};
use family_kit::{Decoder as _, Numerics};
use muse_glimmer::MuseGlimmer;
use muse_glimmer::device::DeviceDecoder;
use muse_glimmer::forward::Decoder;
use platform_fake::ops::fake_ops;
use platform_fake::{FakeConfig, FakePlatform};
use seam::borrow::MapOptions;
use seam::gguf::GgufModel;
use seam::platform::Platform;

fn data() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/muse_glimmer")
}

/// How far a batched prefill's logits (and the steps after it) may be from
/// the host's token at a time: ggml's several-token sums against one
/// token's.
const BATCHED_TOL: f64 = 1e-4;

/// The rows of `prompt` then the steps `feed` (each the token fed after
/// the row before), on the host path (one token at a time) and on the
/// device path (the prompt in batches of `batch`; 1: a token at a time),
/// each on its own fake device: every row the device gives (each prompt
/// position when `batch` is 1, else each batch's last) must equal the
/// host's to the bit, and no weight byte may come back after any call.
/// Fed in batches, the device sums as ggml sums a ubatch (the reference's
/// products of several rows: llamafile's tinyBLAS for a float weight of a
/// multiple of 4 rows, the attention's too) and the host a token at a
/// time: its rows, and the steps after them, within [`BATCHED_TOL`].
/// Returns the host's rows (every position).
fn compare(
    path: &Path,
    prompt: &[u32],
    feed: &[u32],
    batch: usize,
    numerics: Numerics,
) -> Vec<Vec<f32>> {
    let gguf = GgufModel::open(path, MapOptions::default()).expect("open");
    // One model a device: a weight is staged on one device.
    let (model, dev_model) = (
        MuseGlimmer::load(&gguf).expect("load"),
        MuseGlimmer::load(&gguf).expect("load"),
    );
    let host_dev = FakePlatform::new(FakeConfig::default());
    let host_q = host_dev.backend().create_queue().unwrap();
    let dev = FakePlatform::new(FakeConfig::default());
    let dev_q = dev.backend().create_queue().unwrap();
    let mut host = Decoder::new(&model, &host_dev, &*host_q, numerics).expect("host decoder");
    let mut device = DeviceDecoder::new(
        &dev_model,
        &dev,
        &*dev_q,
        Box::new(fake_ops(&dev)),
        numerics,
    )
    .expect("device decoder");
    let mut rows = Vec::new();
    let tol = if batch == 1 { 0.0 } else { BATCHED_TOL };
    let check = |what: String, h: &[f32], d: &[f32], device: &DeviceDecoder<'_>| {
        let diff = max_bit_diff(h, d);
        assert!(
            diff <= tol,
            "{what}: device logits {diff:.3e} from the host's"
        );
        let t = device.traffic();
        assert_eq!(t.weight_read_back_bytes, 0, "{what}: a weight read back");
        assert!(t.kernel_launches.unwrap_or(0) > 0);
    };
    for (b, chunk) in prompt.chunks(batch).enumerate() {
        for &t in chunk {
            rows.push(host.step(t).expect("host step"));
        }
        if batch == 1 {
            let d = device.step(chunk[0]).expect("device step");
            check(format!("position {b}"), rows.last().unwrap(), &d, &device);
        } else {
            let d = device.prefill(chunk).expect("device prefill");
            check(format!("batch {b}"), rows.last().unwrap(), &d, &device);
        }
    }
    for (i, &t) in feed.iter().enumerate() {
        rows.push(host.step(t).expect("host step"));
        let d = device.step(t).expect("device step");
        check(format!("step {i}"), rows.last().unwrap(), &d, &device);
    }
    assert_eq!(device.position(), prompt.len() + feed.len());
    // The host path reads its weights back; the device path never does.
    assert!(host.reader().traffic().weight_read_back_bytes > 0);
    assert_eq!(device.traffic().weight_read_back_bytes, 0);
    rows
}

/// The host's greedy tokens after `prompt` (the argmax of each row from
/// the last prompt position on), `n` of them.
fn greedy_feed(path: &Path, prompt: &[u32], n: usize, numerics: Numerics) -> Vec<u32> {
    let gguf = GgufModel::open(path, MapOptions::default()).expect("open");
    let model = MuseGlimmer::load(&gguf).expect("load");
    let p = platform_host::HostPlatform::new();
    let q = p.backend().create_queue().unwrap();
    let mut host = Decoder::new(&model, &p, &*q, numerics).expect("host decoder");
    let mut row = Vec::new();
    for &t in prompt {
        row = host.step(t).unwrap();
    }
    let mut out = Vec::new();
    for _ in 0..n {
        let t = family_ops::argmax(&row) as u32;
        out.push(t);
        row = host.step(t).unwrap();
    }
    out
}

fn fixture_file(dir: &Path) -> PathBuf {
    let path = dir.join("muse.gguf");
    muse_glimmer::fixture::fixture().write_file(&path).unwrap();
    path
}

#[test]
fn the_device_decoder_equals_the_host_path_on_the_fixture() {
    let dir = tempfile::tempdir().unwrap();
    let path = fixture_file(dir.path());
    // Past the window of 4 and the first cache's 16 slots (grown once).
    let prompt: Vec<u32> = (0..19).map(|i| (i * 7 + 1) % 64).collect();
    for numerics in [Numerics::F32_CACHE, Numerics::default()] {
        let feed = greedy_feed(&path, &prompt, 5, numerics);
        for batch in [1, 6, prompt.len()] {
            compare(&path, &prompt, &feed, batch, numerics);
            println!("fixture, {numerics:?}, batches of {batch}: logits equal");
        }
    }
}

#[test]
fn the_device_decoder_refuses_flash_attention_and_mixed_cache_types() {
    let dir = tempfile::tempdir().unwrap();
    let path = fixture_file(dir.path());
    let gguf = GgufModel::open(&path, MapOptions::default()).expect("open");
    let model = MuseGlimmer::load(&gguf).expect("load");
    let dev = FakePlatform::new(FakeConfig::default());
    let q = dev.backend().create_queue().unwrap();
    for numerics in [
        Numerics {
            flash_attn: true,
            ..Numerics::default()
        },
        Numerics {
            cache_type_k: family_kit::CacheType::F32,
            ..Numerics::default()
        },
    ] {
        let err = DeviceDecoder::new(&model, &dev, &*q, Box::new(fake_ops(&dev)), numerics)
            .expect_err("refused");
        println!("{numerics:?}: {err}");
    }
}

/// The committed goldens' prompt one token at a time through the device
/// path: llama.cpp's `incremental.logits` to the bit, and the host path's
/// rows to the bit fed as one batched prefill too.
#[test]
fn the_device_decoder_gives_llama_cpps_logits_on_the_committed_goldens() {
    for stem in ["s7-d05-softcap", "s7-d05-mixed"] {
        let golden = family_kit::golden::read(&data().join(format!("{stem}.golden.json"))).unwrap();
        let prompt = family_kit::golden::token_ids(&golden["prompt"]).expect("prompt");
        let incremental =
            family_kit::golden::logit_rows(&golden["incremental"]["logits"]).expect("rows");
        let path = data().join(format!("{stem}.gguf"));
        // The goldens ran llama.cpp with F32 caches.
        let rows = compare(&path, &prompt, &[], 1, Numerics::F32_CACHE);
        let worst = rows
            .iter()
            .zip(&incremental)
            .map(|(r, g)| max_abs_diff(r, g))
            .fold(0.0f64, f64::max);
        println!("{stem}: one token at a time, {worst:.3e} from llama.cpp");
        assert_eq!(rows.len(), incremental.len());
        assert_eq!(
            worst, 0.0,
            "{stem}: the device path is llama.cpp's to the bit"
        );
    }
}

/// The committed goldens' batched run (llama.cpp fed the prompt as one
/// ubatch, then stepped greedily: `prefill_logits`, `step_logits`) through
/// the device path fed the same way: its batched sums are llama.cpp's
/// (s7-d05-mixed's prefill, 0.06 from its own incremental logits, to the
/// bit; s7-d05-softcap's within 1e-6, its softcapped scores summed in
/// f64), and every step after it to the bit.
#[test]
fn the_device_batched_prefill_gives_llama_cpps_batched_logits_on_the_committed_goldens() {
    for (stem, prefill_tol) in [("s7-d05-softcap", 1e-6), ("s7-d05-mixed", 0.0)] {
        let golden = family_kit::golden::read(&data().join(format!("{stem}.golden.json"))).unwrap();
        let prompt = family_kit::golden::token_ids(&golden["prompt"]).expect("prompt");
        let path = data().join(format!("{stem}.gguf"));
        let gguf = GgufModel::open(&path, MapOptions::default()).expect("open");
        let model = MuseGlimmer::load(&gguf).expect("load");
        let dev = FakePlatform::new(FakeConfig::default());
        let dev_q = dev.backend().create_queue().unwrap();
        // The goldens ran llama.cpp with F32 caches.
        let mut device = DeviceDecoder::new(
            &model,
            &dev,
            &*dev_q,
            Box::new(fake_ops(&dev)),
            Numerics::F32_CACHE,
        )
        .expect("device decoder");
        let last = device.prefill(&prompt).expect("device prefill");
        let mut step = |t: u32| device.step(t).map_err(|e| e.to_string());
        let f = family_kit::golden::check_batched_last(&golden, &last, &mut step, prefill_tol)
            .unwrap_or_else(|e| panic!("{stem}: {e}"));
        println!(
            "{stem}: batched prefill {:.3e} from llama.cpp's, steps {:.3e}",
            f.prompt, f.steps
        );
        assert_eq!(f.steps, 0.0, "{stem}: the steps are llama.cpp's to the bit");
        assert_eq!(device.traffic().weight_read_back_bytes, 0);
    }
}

/// Every generated golden's one-token runs without flash attention (F32
/// and F16 caches) through the device path: llama.cpp's rows, prompt and
/// greedy steps, to the bit.
#[test]
fn the_device_decoder_gives_llama_cpps_logits_on_the_generated_goldens() {
    let mut runs = 0;
    let goldens = with_each_model(&data(), &mut |g, path| {
        for run in g
            .runs
            .iter()
            .filter(|r| !r.batched && !r.numerics.flash_attn)
        {
            let feed = &run.greedy[..run.greedy.len().saturating_sub(1)];
            let rows = compare(path, &g.prompt, feed, 1, run.numerics);
            let c = run.compare(&rows, g.prompt.len());
            println!(
                "{} {}: {:.3e} from llama.cpp (row {}), greedy equal {}",
                g.name(),
                run.label(),
                c.max_abs_diff,
                c.worst_row,
                c.greedy_equal
            );
            assert_eq!(c.max_abs_diff, 0.0, "{} {}", g.name(), run.label());
            assert!(c.greedy_equal);
            runs += 1;
        }
        Ok(())
    })
    .expect("the goldens' models");
    assert!(goldens > 0);
    assert!(runs >= goldens, "{runs} runs");
}

/// The projector encoded on the fake device equals the host encoder's
/// embeddings to the bit (an image whose patch grid is the position
/// table's, and one resized bilinearly), nothing of a weight read back,
/// only the embeddings.
#[test]
fn the_projector_encodes_on_the_device_as_on_the_host() {
    use family_kit::WeightReader;
    use family_kit::blocks::attention::DeviceWeights;
    use muse_glimmer::mmproj::{Image, Projector};

    let gguf =
        GgufModel::open(&data().join("mmproj-none.gguf"), MapOptions::default()).expect("open");
    let (host_proj, dev_proj) = (
        Projector::load(&gguf).expect("load"),
        Projector::load(&gguf).expect("load"),
    );
    let host = platform_host::HostPlatform::new();
    let host_q = host.backend().create_queue().unwrap();
    let reader = WeightReader::new(&host, &*host_q);
    let dev = FakePlatform::new(FakeConfig::default());
    let dev_q = dev.backend().create_queue().unwrap();
    let dw = DeviceWeights::new(std::rc::Rc::new(fake_ops(&dev)), &dev, &*dev_q);
    for (w, h) in [(16, 16), (32, 24)] {
        let image = Image::synthetic(w, h);
        let want = host_proj.encode(&reader, &image).expect("host encode");
        let before = dw.ops().counters();
        let got = dev_proj
            .encode_on_device(&dw, &image)
            .expect("device encode");
        let after = dw.ops().counters();
        assert_eq!(got.len(), want.len());
        let worst = got
            .iter()
            .zip(&want)
            .map(|(g, w)| max_bit_diff(g, w))
            .fold(0.0f64, f64::max);
        println!(
            "projector {w}x{h}: {} tokens of {}, {worst:.3e} from the host's, {} launches",
            got.len(),
            got[0].len(),
            after.kernel_launches - before.kernel_launches
        );
        assert_eq!(
            worst, 0.0,
            "{w}x{h}: the device's embeddings are the host's"
        );
        assert_eq!(after.weight_read_back_bytes, 0, "a weight read back");
        let values: usize = got.iter().map(Vec::len).sum();
        assert_eq!(
            after.read_back_bytes - before.read_back_bytes,
            4 * values as u64,
            "only the embeddings come back"
        );
    }
    // Each of the projector's weights was staged once, on the device.
    for w in dev_proj.weights().all() {
        assert!(w.device_copy().is_some(), "{} staged", w.name());
    }
}

/// A batched prefill runs each op over every token's rows: a prompt of 19
/// costs fewer kernel launches than 3 single tokens.
#[test]
fn a_batched_prefill_launches_each_op_once_for_the_batch() {
    let dir = tempfile::tempdir().unwrap();
    let path = fixture_file(dir.path());
    let gguf = GgufModel::open(&path, MapOptions::default()).expect("open");
    let model = MuseGlimmer::load(&gguf).expect("load");
    let dev = FakePlatform::new(FakeConfig::default());
    let q = dev.backend().create_queue().unwrap();
    let mut d = DeviceDecoder::new(
        &model,
        &dev,
        &*q,
        Box::new(fake_ops(&dev)),
        Numerics::default(),
    )
    .expect("device decoder");
    let launches = |d: &DeviceDecoder<'_>| d.traffic().kernel_launches.unwrap_or(0);
    let prompt: Vec<u32> = (0..19).map(|i| (i * 7 + 1) % 64).collect();
    d.prefill(&prompt).expect("prefill");
    let batch = launches(&d);
    let before = launches(&d);
    d.step(3).expect("step");
    let step = launches(&d) - before;
    println!("prompt of 19: {batch} launches; a step: {step}");
    assert!(
        batch < 3 * step,
        "{batch} launches for the batch, {step} a step"
    );
    assert_eq!(
        d.traffic().read_backs,
        2,
        "the logits of each call, nothing else"
    );
}
