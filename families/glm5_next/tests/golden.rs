//! The CPU forward pass against llama.cpp: `tests/data/glm5_next/` holds
//! test-llama-archs' glm5-next models and what llama.cpp computes for them
//! (tools/oracle/fixtures_muse_glm5.sh; README there). The prompt goes in
//! one token at a time; every prompt position is checked against the
//! golden's `incremental.logits` (llama.cpp's prompt one token at a time,
//! the path this pass follows) and `prefill_logits` (its batched prompt),
//! the positions after each greedy step against `step_logits`, and the
//! greedy tokens must be the golden's.
//!
//! Tolerances (docs/families/glm5_next.md, section 10), 1e-3 absolute for
//! every golden against the one-token path and the steps:
//! - `s7-d05-sparse` (F32 weights) and `s7-d05-shared3-slim` (F32, 3
//!   layers: MLA, KDA, then an MLA layer with a shared indexer reusing layer
//!   0's selection): the batched prompt within 1e-3 as well.
//! - `s7-d05-mixed` (Q8_0, Q4_0, F16, BF16 weights): llama.cpp's own batched
//!   prompt differs from its one-token path by up to 2.2e-2 here (position
//!   4; the activations it rounds to F16/Q8_0 fall on the other side of a
//!   rounding boundary), so no pass can be within 1e-3 of both. This pass
//!   decodes one token at a time as the one-token path does, and is held to
//!   1e-3 against it (observed 9.5e-7) and against the steps; against the
//!   batched prompt, to 1e-3 beyond llama.cpp's own one-token-vs-batched
//!   difference at the same position. The attention's scores are
//!   ill-conditioned (hundreds, from terms that cancel): the latent path is
//!   computed in ggml's `f32` arithmetic (`family_ops::ggml_cpu`), without
//!   which position 26 is 1.3e-2 off (an F16 rounding of the shared
//!   expert's input flips).
use std::path::PathBuf;

use family_kit::WeightReader;
use glm5_next::Glm5Next;
use glm5_next::forward::greedy;
use platform_host::HostPlatform;
use seam::borrow::MapOptions;
use seam::gguf::GgufModel;
use seam::platform::Platform;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/glm5_next")
        .join(name)
}

fn rows(v: &serde_json::Value) -> Vec<Vec<f64>> {
    family_kit::golden::logit_rows(v).expect("golden logit rows")
}

fn tokens(v: &serde_json::Value) -> Vec<u32> {
    family_kit::golden::token_ids(v).expect("golden tokens")
}

use family_kit::golden::max_abs_diff as max_diff;

/// How the batched prompt (`prefill_logits`) is held.
#[derive(Clone, Copy)]
enum Prefill {
    /// Within the tolerance, like every other row.
    Tolerance,
    /// Within the tolerance beyond llama.cpp's own one-token-vs-batched
    /// difference at that position.
    BeyondOwnDifference,
}

/// Runs the golden `stem`; returns the largest difference seen.
#[track_caller]
fn check(stem: &str, tol: f64, prefill_gate: Prefill) -> f64 {
    let golden: serde_json::Value = serde_json::from_slice(
        &std::fs::read(data(&format!("{stem}.golden.json"))).expect("golden"),
    )
    .expect("golden JSON");
    let gguf = GgufModel::open(
        &data(&format!("{stem}.gguf")),
        MapOptions { prefault: false },
    )
    .expect("model");
    let model = Glm5Next::load(&gguf).expect("load");
    let platform = HostPlatform::new();
    let queue = platform.backend().create_queue().expect("queue");
    let prompt = tokens(&golden["prompt"]);
    let want_tokens = tokens(&golden["greedy"]);
    let prefill = rows(&golden["prefill_logits"]);
    let steps = rows(&golden["step_logits"]);
    let reader = WeightReader::new(&platform, &*queue);
    // The goldens ran llama.cpp with F32 caches.
    let out = greedy(
        &model,
        reader,
        family_kit::Numerics::F32_CACHE,
        &prompt,
        want_tokens.len(),
        &mut || {},
    )
    .expect("decode");
    assert_eq!(out.generated, want_tokens, "{stem}: greedy tokens");
    assert_eq!(out.logits.len(), prompt.len() + want_tokens.len() - 1);
    let inc = rows(&golden["incremental"]["logits"]);
    assert_eq!(inc.len(), prompt.len(), "{stem}: one-token rows");
    assert_eq!(prefill.len(), prompt.len(), "{stem}: batched rows");
    let mut worst = 0.0f64;
    for (p, want) in prefill.iter().enumerate() {
        let d = max_diff(&out.logits[p], want);
        let allowed = match prefill_gate {
            Prefill::Tolerance => tol,
            Prefill::BeyondOwnDifference => {
                let own = inc[p]
                    .iter()
                    .zip(want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f64::max);
                tol + own
            }
        };
        assert!(
            d <= allowed,
            "{stem}: batched prompt position {p}: max |diff| {d:e} > {allowed:e}"
        );
    }
    for (s, want) in steps.iter().enumerate() {
        let d = max_diff(&out.logits[prompt.len() - 1 + s], want);
        assert!(d <= tol, "{stem}: step {s}: max |diff| {d:e} > {tol:e}");
        worst = worst.max(d);
    }
    for (p, want) in inc.iter().enumerate() {
        let d = max_diff(&out.logits[p], want);
        assert!(
            d <= tol,
            "{stem}: 1-token position {p}: max |diff| {d:e} > {tol:e}"
        );
        worst = worst.max(d);
    }
    let batched = prefill
        .iter()
        .enumerate()
        .map(|(p, want)| max_diff(&out.logits[p], want))
        .fold(0.0, f64::max);
    eprintln!(
        "{stem}: max |diff| {worst:e} over the 1-token prompt and the steps (tolerance {tol:e}); vs llama.cpp's batched prompt {batched:e}"
    );
    worst
}

#[test]
fn sparse_f32_golden_matches_llama_cpp_within_1e_3() {
    check("s7-d05-sparse", 1e-3, Prefill::Tolerance);
}

#[test]
fn shared_indexer_f32_golden_matches_llama_cpp_within_1e_3() {
    check("s7-d05-shared3-slim", 1e-3, Prefill::Tolerance);
}

#[test]
fn mixed_types_golden_matches_llama_cpp_within_1e_3() {
    check("s7-d05-mixed", 1e-3, Prefill::BeyondOwnDifference);
}
