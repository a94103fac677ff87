//! llama.cpp on quantized models made again from their recipes
//! (`tests/data/glm_moe_dsa/gen-*.golden.json`, `family_kit::golden::
//! Generated`: a committed model's shape, the tensor types llama-quantize
//! chose for a file type, this project's values of a seed and a gain).
//! Every run of every golden (F32 and F16 caches, the prompt batched and
//! one token at a time, then the greedy steps) within 1e-3 at every row,
//! with llama.cpp's greedy choices; each run's figure is printed.
//!
//! Except llama.cpp's batched runs of a file whose `attn_k_b` its CPU
//! build repacks (Q4_0, IQ4_NL, Q4_K: `kv_lora_rank` rows, a multiple of
//! 8): there llama.cpp's own batched logits are wrong. `k_b` multiplies
//! `q_nope`, a strided view of `q` (its rows `n_embd_head_k` apart, `q_pe`
//! between them), and the repacked `mul_mat` quantizes each 4 rows of the
//! ubatch with `ggml_quantize_mat_t(x + i11 * nb11, ..., 4, ne10)`, which
//! reads row `r` at `x + r * ne10`: tokens 1-3 of every 4 multiply parts
//! of other tokens' `q` (`q_nope_absorbed-0` is the first tensor that
//! differs, at position 1; llama.cpp's one-token path, `gemv` after a
//! per-row `from_float`, is right, and this pass equals it). Those runs are
//! held at their first row (the one token whose rows are read right before
//! anything else differs) and their figure printed.

use std::path::{Path, PathBuf};

use family_kit::WeightReader;
use family_kit::golden::{Generated, Run, RunOutcome, check_generated, report};
use glm_moe_dsa::GlmMoeDsa;
use glm_moe_dsa::forward::State;
use platform_host::HostPlatform;
use seam::borrow::MapOptions;
use seam::gguf::GgufModel;
use seam::platform::Platform;

/// The rows of `run` as this pass computes them on the model at `path`.
fn decode(path: &Path, prompt: &[u32], run: &Run) -> Result<Vec<Vec<f32>>, String> {
    let gguf = GgufModel::open(path, MapOptions::default()).map_err(|e| e.to_string())?;
    let model = GlmMoeDsa::load(&gguf).map_err(|e| e.to_string())?;
    let platform = HostPlatform::new();
    let queue = platform
        .backend()
        .create_queue()
        .map_err(|e| e.to_string())?;
    let mut state = State::new(&model, WeightReader::new(&platform, &*queue), run.numerics)
        .map_err(|e| e.to_string())?;
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

/// Whether llama.cpp's batched path repacks the golden's `attn_k_b` and
/// so reads the wrong activations for it (see the module doc).
fn k_b_repacked(g: &Generated) -> bool {
    g.recipe.types.iter().any(|(name, ty)| {
        name.ends_with(".attn_k_b.weight") && ["Q4_0", "IQ4_NL", "Q4_K"].contains(&ty.as_str())
    })
}

#[test]
fn every_generated_golden_within_1e_3_with_llama_cpps_greedy_choices() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/glm_moe_dsa");
    let outcomes = check_generated(&dir, &decode).expect("generated goldens");
    assert!(
        !outcomes.is_empty(),
        "no generated golden in {}",
        dir.display()
    );
    let goldens = Generated::all_in(&dir).expect("goldens");
    let llama_cpp_wrong = |o: &RunOutcome| {
        let wrong = o.run.starts_with("batched")
            && goldens
                .iter()
                .any(|g| g.name() == o.golden && k_b_repacked(g));
        wrong.then(|| "llama.cpp's repacked k_b reads the wrong rows: held at row 0".to_owned())
    };
    let (text, failed) = report(&outcomes, 1e-3, &llama_cpp_wrong);
    eprint!("{text}");
    assert!(failed.is_empty(), "past 1e-3: {failed:#?}");
    // Where llama.cpp's batched rows are wrong, its first row is right.
    let tmp = tempfile::tempdir().expect("tempdir");
    for g in goldens.iter().filter(|g| k_b_repacked(g)) {
        let model = tmp.path().join("m.gguf");
        g.write_model(&model).expect("model");
        for run in g.runs.iter().filter(|r| r.batched) {
            let ours = decode(&model, &g.prompt, run).expect("decode");
            let d = family_kit::golden::max_abs_diff(
                &ours[0],
                &run.logits[0]
                    .iter()
                    .map(|&x| f64::from(x))
                    .collect::<Vec<_>>(),
            );
            assert!(d <= 1e-3, "{} {}: row 0: {d:e}", g.name(), run.label());
        }
    }
}
