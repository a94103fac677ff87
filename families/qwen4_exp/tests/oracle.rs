//! The CPU forward pass against llama.cpp: `tests/data/qwen4exp/`
//! holds test-llama-archs' tiny qwen4exp model (`-d 0.5`), two
//! requantizations of it, and what llama.cpp computes for them
//! (tools/oracle/goldens.py, llama_goldens.py).
//!
//! Each golden is checked on both of llama.cpp's paths: the prompt as one
//! batch ([`Model::prefill`]) against its `prefill_logits`, then the greedy
//! steps on that cache against `step_logits`; and the prompt a token at a
//! time against its token-by-token rerun (`incremental.logits`), then the
//! steps on that cache against `incremental.step_logits` where the golden
//! has them. Every row within 1e-5 (issue 25 asks 1e-3; the pass repeats
//! ggml's arithmetic, so the figures are 0 against goldens made by this
//! oracle's build, and 1e-5 catches a regression that 1e-3 would let
//! through), the greedy tokens the golden's.

use std::path::PathBuf;

use family_kit::Numerics;
use family_kit::golden::max_abs_diff as max_diff;
use family_ops::libstdcxx_top_k;
use qwen4_exp::Qwen4Exp;
use qwen4_exp::engine::SeamWeights;
use qwen4_exp::forward::{Model, State};
use seam::borrow::MapOptions;
use seam::gguf::GgufModel;
use seam::platform::Platform;

const TOL: f64 = 1e-5;

fn data() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/qwen4exp")
}

fn rows(v: &serde_json::Value) -> Vec<Vec<f64>> {
    family_kit::golden::logit_rows(v).expect("golden logit rows")
}

fn tokens(v: &serde_json::Value) -> Vec<u32> {
    family_kit::golden::token_ids(v).expect("golden tokens")
}

fn argmax(x: &[f32]) -> u32 {
    family_ops::argmax(x) as u32
}

/// The largest difference of `ours` from `golden`, row by row; infinite
/// when the row counts differ.
fn worst(ours: &[Vec<f32>], golden: &[Vec<f64>]) -> f64 {
    if ours.len() != golden.len() {
        return f64::INFINITY;
    }
    ours.iter()
        .zip(golden)
        .map(|(o, g)| max_diff(o, g))
        .fold(0.0, f64::max)
}

/// The logits after the prompt (the last of `prompt_rows`) and after each
/// greedy token but the last, fed a token at a time on `state`; asserts
/// each step's argmax is the golden's greedy token.
fn steps<W: qwen4_exp::forward::Weights>(
    model: &Model<W>,
    state: &mut State,
    last: Vec<f32>,
    greedy: &[u32],
    stem: &str,
) -> Vec<Vec<f32>> {
    let mut out = vec![last];
    for (i, &t) in greedy.iter().enumerate() {
        let row = out.last().expect("a row");
        assert_eq!(argmax(row), t, "{stem}: greedy step {i}");
        if i + 1 < greedy.len() {
            let pos = state.len();
            out.push(model.step(state, t, pos));
        }
    }
    out
}

/// Runs the golden `stem.golden.json` against `stem.gguf` of the data
/// folder on both of llama.cpp's paths (see the module documentation);
/// returns the largest difference over every row.
fn check_golden(stem: &str) -> f64 {
    let golden = family_kit::golden::read(&data().join(format!("{stem}.golden.json"))).unwrap();
    let gguf = GgufModel::open(&data().join(format!("{stem}.gguf")), MapOptions::default())
        .expect("open fixture");
    // Through the seam on the host: the forward reads the mapped file's
    // quantized rows, as every decode does.
    let loaded = Qwen4Exp::load(&gguf).expect("load");
    let platform = platform_host::HostPlatform::new();
    let queue = platform.backend().create_queue().expect("queue");
    let model = Model::new(SeamWeights::new(&loaded, &gguf, &platform, &*queue)).expect("model");
    let prompt = tokens(&golden["prompt"]);
    let greedy = tokens(&golden["greedy"]);
    let inc = golden.get("incremental");
    let figures = [
        ("prefill_logits", golden.get("prefill_logits")),
        ("step_logits", golden.get("step_logits")),
        ("incremental.logits", inc.and_then(|v| v.get("logits"))),
        (
            "incremental.step_logits",
            inc.and_then(|v| v.get("step_logits")),
        ),
    ];
    assert!(
        figures[..3].iter().all(|f| f.1.is_some()),
        "{stem}: rows missing"
    );

    // Batched: the prompt as one ubatch, the steps on its cache.
    let mut state = State::new(&model, Numerics::F32_CACHE);
    let mut batched = model.prefill(&mut state, &prompt);
    let last = batched.last().expect("a prompt").clone();
    let batched_steps = steps(&model, &mut state, last, &greedy, stem);
    // One token at a time, the steps on that cache.
    let mut state = State::new(&model, Numerics::F32_CACHE);
    let one: Vec<Vec<f32>> = prompt
        .iter()
        .enumerate()
        .map(|(pos, &t)| model.step(&mut state, t, pos))
        .collect();
    let one_steps = steps(
        &model,
        &mut state,
        one.last().expect("a prompt").clone(),
        &greedy,
        stem,
    );
    batched.truncate(prompt.len());

    let mut all = 0.0f64;
    for ((name, rows_of), ours) in
        figures
            .into_iter()
            .zip([&batched, &batched_steps, &one, &one_steps])
    {
        let Some(v) = rows_of else { continue };
        let d = worst(ours, &rows(v));
        println!("{stem}: {name}: max abs diff {d:.3e}");
        assert!(d <= TOL, "{stem}: {name} differ by {d:.3e} > {TOL}");
        all = all.max(d);
    }
    assert_eq!(
        model.greedy(&prompt, greedy.len(), Numerics::F32_CACHE),
        greedy,
        "Model::greedy"
    );
    all
}

#[test]
fn matches_llama_cpp_goldens() {
    check_golden("llama-archs-d05");
}

/// The same model (indexer sliced to 4 heads) requantized by
/// `llama-quantize`: Q8_0 with the output Q6_K, the experts' gate-up Q4_K
/// and the hyper-connection ups F16 (tests/data/qwen4exp/README.md).
#[test]
fn mixed_type_golden_matches_llama_cpp_within_1e_3() {
    check_golden("mixed");
}

/// The same model (indexer sliced to 4 heads) with Q4_K on the 2-D
/// attention projections (`attn_qkv` and `attn_gate`, `attn_q` and
/// `attn_k`; repacked to `q4_K_8x8` by ggml's CPU backend), the rest Q8_0
/// (tests/data/qwen4exp/README.md). llama.cpp's batched prefill and its
/// one-token path differ here by up to 6.9e-2 (the repacked Q4_K's `gemm`
/// and `gemv` round apart, and the activations' Q8_K conversion carries it
/// on): this pass matches each path on its own.
#[test]
fn q4k_attention_golden_matches_llama_cpp_one_token_path_within_1e_3() {
    check_golden("attn-q4k");
}

/// libstdc++'s `__heap_select` membership on ties: the expected sets are
/// what `libstdcxx_top_k` in tools/oracle/qwen4exp_ref.py returns (sorted).
#[test]
fn top_k_tie_order() {
    let ninf = f64::NEG_INFINITY;
    let cases: [(&[f64], usize, &[usize]); 3] = [
        (
            &[2.0, 2.0, 2.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1e9, 1e9, ninf],
            7,
            &[0, 1, 2, 3, 4, 8, 9],
        ),
        (
            &[1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1e9, 1e9, ninf],
            7,
            &[0, 1, 3, 4, 5, 8, 9],
        ),
        (
            &[
                1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1e9,
            ],
            6,
            &[0, 1, 2, 3, 4, 12],
        ),
    ];
    for (row, k, want) in cases {
        let mut got = libstdcxx_top_k(row, k);
        got.sort_unstable();
        assert_eq!(got, want, "top {k} of {row:?}");
    }
    let mut all = libstdcxx_top_k(cases[0].0, 20);
    all.sort_unstable();
    assert_eq!(all, (0..cases[0].0.len()).collect::<Vec<_>>());
}
