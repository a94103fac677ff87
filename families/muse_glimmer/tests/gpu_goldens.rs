//! The device path on a GPU against llama.cpp's generated goldens
//! (`tests/data/muse_glimmer/gen-*.golden.json`, `family_kit::golden`):
//! every position of each one-token run without flash attention (the
//! prompt fed a token at a time, then the greedy tokens), the run's cache
//! types; one JSON line per run with the largest difference to llama.cpp's
//! CPU logits, so a script can set it beside llama.cpp's own CUDA build on
//! the same files (issue 28). The batched runs are not compared (the
//! device path's batched prefill gives the last position only), nor the
//! flash-attention runs (the device path has none). Then the projector
//! encoded on the device against llama.cpp's `mm_encode` embeddings
//! (`mmproj-none.embd.json`), one JSON line.
//!
//! Built only with the `gpu-tests` feature (`cargo test -p muse_glimmer
//! --features gpu-tests --test gpu_goldens --no-run`), run on the GPU
//! machine from the repository root. `SEAM_GOLDEN_DEVICE` picks the device
//! (default `cuda`; `fake` rehearses it anywhere), `SEAM_TEST_DATA` the
//! data folder (default `tests/data`, relative to the working directory).

use std::path::PathBuf;
use std::rc::Rc;

use family_kit::blocks::attention::DeviceWeights;
use family_kit::golden::{device_runs, feed_one_token_run};
use muse_glimmer::MuseGlimmer;
use muse_glimmer::device::DeviceDecoder;
use muse_glimmer::mmproj::{Image, Projector};
use seam::borrow::MapOptions;
use seam::gguf::GgufModel;

fn env(k: &str) -> Option<String> {
    std::env::var(k).ok()
}

fn data() -> PathBuf {
    PathBuf::from(env("SEAM_TEST_DATA").unwrap_or_else(|| "tests/data".into())).join("muse_glimmer")
}

#[test]
fn the_device_path_on_the_generated_goldens_and_the_projector() {
    let name = env("SEAM_GOLDEN_DEVICE").unwrap_or_else(|| "cuda".into());
    let device = seam_devices::open(seam_devices::parse(&name).unwrap(), &env)
        .unwrap_or_else(|e| panic!("this test needs the device {name}: {e}"));
    let platform = device.platform();
    let dir = data();
    let compared = device_runs(&dir, &name, &|path, prompt, run| {
        let gguf = GgufModel::open(path, MapOptions::default()).map_err(|e| e.to_string())?;
        let model = MuseGlimmer::load(&gguf).map_err(|e| e.to_string())?;
        let queue = platform
            .backend()
            .create_queue()
            .map_err(|e| e.to_string())?;
        let ops = device.ops(&*queue).ok_or("no op layer")??;
        let mut d = DeviceDecoder::new(&model, platform, &*queue, ops, run.numerics)
            .map_err(|e| e.to_string())?;
        feed_one_token_run(&mut d, prompt, run)
    })
    .unwrap();
    assert!(compared > 0, "no one-token run in {}", dir.display());

    // The projector on the device against llama.cpp's embeddings.
    let gguf = GgufModel::open(&dir.join("mmproj-none.gguf"), MapOptions::default()).unwrap();
    let projector = Projector::load(&gguf).unwrap();
    let text = std::fs::read_to_string(dir.join("mmproj-none.embd.json")).unwrap();
    let golden: serde_json::Value = serde_json::from_str(&text).unwrap();
    let dim = |k: &str| golden[k].as_u64().unwrap() as usize;
    let want: Vec<f64> = golden["embeddings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let queue = platform.backend().create_queue().unwrap();
    let ops = device.ops(&*queue).expect("an op layer").unwrap();
    let dw = DeviceWeights::new(Rc::from(ops), platform, &*queue);
    let got = projector
        .encode_on_device(&dw, &Image::synthetic(dim("width"), dim("height")))
        .unwrap();
    let diff = got
        .iter()
        .flatten()
        .zip(&want)
        .fold(0f64, |m, (&g, &w)| m.max((f64::from(g) - w).abs()));
    let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
    println!(
        "{}",
        serde_json::json!({"projector": "mmproj-none", "device": name,
            "tokens": got.len(), "max_abs_diff": diff, "max_abs_embd": scale,
            "weight_read_back_bytes": dw.ops().counters().weight_read_back_bytes})
    );
    assert_eq!(got.len() * dim("n_embd"), want.len());
    assert_eq!(dw.ops().counters().weight_read_back_bytes, 0);
    assert!(diff <= 1e-3 * scale.max(1.0), "projector {diff:.3e}");
}
