//! The device path on a GPU against llama.cpp's generated goldens
//! (`tests/data/glm_moe_dsa/gen-*.golden.json`, `family_kit::golden`):
//! every position of each one-token run without flash attention (the
//! prompt fed a token at a time, then the greedy tokens), every stack
//! staged, the run's cache types; one JSON line per run with the largest
//! difference to llama.cpp's CPU logits, so a script can set it beside
//! llama.cpp's own CUDA build on the same files. The batched runs are not
//! compared (the device path's batched prefill gives its last position
//! only), nor the flash-attention runs (the device path refuses flash
//! attention).
//!
//! Built only with the `gpu-tests` feature (`cargo test -p glm_moe_dsa
//! --features gpu-tests --test gpu_goldens --no-run`), run on the GPU
//! machine from the repository root. `SEAM_GOLDEN_DEVICE` picks the device
//! (default `cuda`; `fake` rehearses it anywhere), `SEAM_TEST_DATA` the
//! data folder (default `tests/data`, relative to the working directory).

use std::path::PathBuf;

use family_kit::ExpertStaging;
use family_kit::golden::{device_runs, feed_one_token_run};
use glm_moe_dsa::GlmMoeDsa;
use glm_moe_dsa::device::DeviceDecoder;
use seam::borrow::MapOptions;
use seam::gguf::GgufModel;

#[test]
fn the_device_path_on_the_generated_goldens() {
    let env = |k: &str| std::env::var(k).ok();
    let name = env("SEAM_GOLDEN_DEVICE").unwrap_or_else(|| "cuda".into());
    let device = seam_devices::open(seam_devices::parse(&name).unwrap(), &env)
        .unwrap_or_else(|e| panic!("this test needs the device {name}: {e}"));
    let platform = device.platform();
    let dir = PathBuf::from(env("SEAM_TEST_DATA").unwrap_or_else(|| "tests/data".into()))
        .join("glm_moe_dsa");
    let compared = device_runs(&dir, &name, &|path, prompt, run| {
        let gguf = GgufModel::open(path, MapOptions::default()).map_err(|e| e.to_string())?;
        let model = GlmMoeDsa::load(&gguf).map_err(|e| e.to_string())?;
        let queue = platform
            .backend()
            .create_queue()
            .map_err(|e| e.to_string())?;
        let ops = device.ops(&*queue).ok_or("no op layer")??;
        let mut d = DeviceDecoder::new(
            &model,
            platform,
            &*queue,
            ops,
            ExpertStaging::All,
            run.numerics,
        )
        .map_err(|e| e.to_string())?;
        feed_one_token_run(&mut d, prompt, run)
    })
    .unwrap();
    assert!(compared > 0, "no one-token run in {}", dir.display());
}
