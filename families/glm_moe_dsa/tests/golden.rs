//! The CPU forward pass against llama.cpp: `tests/data/glm_moe_dsa/` holds
//! fixtures and what llama.cpp computes for them (README there). Both of
//! llama.cpp's paths are checked ([`family_kit::golden::check_path`]): the
//! prompt fed one token at a time against the golden's `incremental`
//! logits, and fed as one batched prefill ([`State::prefill_all`]) against
//! its `prefill_logits`; then the positions after each greedy step against
//! `step_logits`, and the greedy tokens must be the golden's.
//!
//! The pass computes as llama.cpp's CPU build does (ggml's `f32` kernels,
//! the activations converted to each weight's `vec_dot_type`), so it lands
//! on llama.cpp's bits on every golden here (0 difference, F32 and the
//! F32/F16/Q8_0 `public` file alike); the gate is the 1e-3. The
//! goldens ran llama.cpp with F32 caches ([`Numerics::F32_CACHE`]).
//! Without the activations' rounding the mixed file's error is 13 (the
//! indexer's top-k and the expert choice turn a rounding into a different
//! pick); in `f64` with that rounding, 1e-6 there and up to 2.2e-5 on the
//! F32 ones.

use std::path::PathBuf;

use family_kit::{Numerics, WeightReader};
use glm_moe_dsa::GlmMoeDsa;
use glm_moe_dsa::forward::State;
use platform_host::HostPlatform;
use seam::borrow::MapOptions;
use seam::gguf::GgufModel;
use seam::platform::Platform;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/glm_moe_dsa")
        .join(name)
}

/// Runs the golden `stem` against `model` both ways
/// ([`family_kit::golden::check_path`]); returns the largest difference.
#[track_caller]
fn check(model: &str, stem: &str, tol: f64) -> f64 {
    let golden = family_kit::golden::read(&data(&format!("{stem}.golden.json"))).expect("golden");
    let gguf = GgufModel::open(&data(model), MapOptions { prefault: false }).expect("model");
    let model = GlmMoeDsa::load(&gguf).expect("load");
    let platform = HostPlatform::new();
    let queue = platform.backend().create_queue().expect("queue");
    let prompt = family_kit::golden::token_ids(&golden["prompt"]).expect("prompt");
    let mut worst = 0.0f64;
    for batched in [false, true] {
        let reader = WeightReader::new(&platform, &*queue);
        let mut state = State::new(&model, reader, Numerics::F32_CACHE).expect("state");
        let rows = if batched {
            state.prefill_all(&prompt).expect("prefill")
        } else {
            prompt
                .iter()
                .map(|&t| state.step(t).expect("step"))
                .collect()
        };
        let mut step = |t: u32| state.step(t).map_err(|e| e.to_string());
        let f = family_kit::golden::check_path(&golden, batched, &rows, &mut step, tol)
            .unwrap_or_else(|e| panic!("{stem}: {e}"));
        eprintln!(
            "{stem} {}: max |diff| prompt {:e}, steps {:e} (tolerance {tol:e})",
            if batched { "batched" } else { "one-token" },
            f.prompt,
            f.steps
        );
        worst = worst.max(f.prompt).max(f.steps);
    }
    worst
}

#[test]
fn public_f32_golden_matches_llama_cpp_within_1e_3() {
    check("public-f32.gguf", "public-f32", 1e-3);
}

#[test]
fn explicit_types_golden_matches_llama_cpp_within_1e_3() {
    check("explicit.gguf", "explicit", 1e-3);
}

#[test]
fn mixed_types_golden_matches_llama_cpp_within_1e_3() {
    check("public.gguf", "public", 1e-3);
}

#[test]
fn llama_archs_s42_golden_matches_llama_cpp_within_1e_3() {
    check("llama-archs-s42.gguf", "llama-archs-s42", 1e-3);
}

#[test]
fn llama_archs_s7d05_golden_matches_llama_cpp_within_1e_3() {
    check("llama-archs-s7d05.gguf", "llama-archs-s7d05", 1e-3);
}
