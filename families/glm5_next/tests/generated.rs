//! llama.cpp on quantized models made again from their recipes
//! (`tests/data/glm5_next/gen-*.golden.json`, `family_kit::golden::
//! Generated`: a committed model's shape, the tensor types llama-quantize
//! chose for a file type, this project's values of a seed and a gain).
//! Every run of every golden (F32 and F16 caches, the prompt batched and
//! one token at a time, then the greedy steps) within 1e-3 at every row,
//! with llama.cpp's greedy choices; each run's figure is printed.

use std::path::{Path, PathBuf};

use family_kit::WeightReader;
use family_kit::golden::{Run, check_generated, report};
use glm5_next::Glm5Next;
use glm5_next::forward::State;
use platform_host::HostPlatform;
use seam::borrow::MapOptions;
use seam::gguf::GgufModel;
use seam::platform::Platform;

/// The rows of `run` as this pass computes them on the model at `path`.
fn decode(path: &Path, prompt: &[u32], run: &Run) -> Result<Vec<Vec<f32>>, String> {
    let gguf = GgufModel::open(path, MapOptions::default()).map_err(|e| e.to_string())?;
    let model = Glm5Next::load(&gguf).map_err(|e| e.to_string())?;
    let platform = HostPlatform::new();
    let queue = platform
        .backend()
        .create_queue()
        .map_err(|e| e.to_string())?;
    let reader = WeightReader::new(&platform, &*queue);
    let mut state =
        State::new(&model, reader, prompt.len(), run.numerics).map_err(|e| e.to_string())?;
    let mut rows = if run.batched {
        state.prefill_all(prompt).map_err(|e| e.to_string())?
    } else {
        prompt
            .iter()
            .map(|&t| state.step(t))
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?
    };
    for &t in &run.greedy[..run.greedy.len().saturating_sub(1)] {
        rows.push(state.step(t).map_err(|e| e.to_string())?);
    }
    Ok(rows)
}

#[test]
fn every_generated_golden_within_1e_3_with_llama_cpps_greedy_choices() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/glm5_next");
    let outcomes = check_generated(&dir, &decode).expect("generated goldens");
    assert!(
        !outcomes.is_empty(),
        "no generated golden in {}",
        dir.display()
    );
    let (text, failed) = report(&outcomes, 1e-3, &|_| None);
    eprint!("{text}");
    assert!(failed.is_empty(), "past 1e-3: {failed:#?}");
}
