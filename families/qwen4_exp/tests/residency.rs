//! Host memory while the `qwen4_exp` binary decodes a generated
//! qwen4exp-shaped model (about 200 MB of quantized weights, about 900 MB
//! in `f32`), measured in the child process by its decode sampler:
//!
//! - on the host, peak `RssAnon` during decoding grows by less than the
//!   largest single weight dequantized plus 256 MiB (the forward reads
//!   quantized rows; a cache of every weight in `f32` would exceed it);
//! - on the fake staging device, the model mapping's resident bytes stay a
//!   small part of the file through every decode step (staged weights are
//!   read from their device copies, their host pages released once).

use std::path::Path;
use std::process::Command;

use qwen4_exp::fixture::{Shape, generated};

const MIB: f64 = 1048576.0;

/// A model mid-way between the tiny fixture and the checkpoint.
fn shape() -> Shape {
    Shape {
        e: 1024,
        n_vocab: 32_000,
        n_layer: 2,
        n_expert: 64,
        n_expert_used: 4,
        n_ff: 512,
        ssm: (128, 4, 8),
        attn: (8, 2, 128),
    }
}

fn decode(path: &Path, device: &str) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_qwen4_exp"))
        .arg(path)
        .args([
            "--device", device, "--tokens", "1,2,3", "--steps", "3", "--json",
        ])
        .output()
        .expect("the binary runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}

fn f(v: &serde_json::Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn decoding_a_generated_model_keeps_host_memory_bounded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("generated.gguf");
    let spec = generated(&shape());
    let file = spec
        .streaming_writer()
        .and_then(|w| w.write_file(&path))
        .expect("write the generated model") as f64;
    let all_f32: f64 = spec
        .tensors
        .iter()
        .map(|t| 4.0 * t.dims.iter().product::<u64>() as f64)
        .sum();

    let host = decode(&path, "host");
    let r = &host["decode_residency"];
    let largest = f(&host["family"]["largest_weight_f32_mib"]) * MIB;
    let grew = (f(&r["rss_anon_peak_mib"]) - f(&r["rss_anon_start_mib"])) * MIB;
    // The bound must be one a cache of every weight in f32 breaks.
    assert!(all_f32 > largest + 256.0 * MIB, "{all_f32} {largest}");
    assert!(
        grew < largest + 256.0 * MIB,
        "RssAnon grew {:.1} MiB while decoding; the bound is {:.1} MiB",
        grew / MIB,
        (largest + 256.0 * MIB) / MIB
    );

    let fake = decode(&path, "fake");
    assert_eq!(
        fake["generated"], host["generated"],
        "the same greedy tokens"
    );
    let seam = &fake["seam"];
    assert!(seam["uploads"].as_u64().unwrap() > 0);
    assert_eq!(seam["uploads"], seam["releases"]);
    let r = &fake["decode_residency"];
    let mapping = f(&r["mapping_rss_peak_mib"]) * MIB;
    assert!(
        mapping < file / 4.0,
        "the mapping held {:.1} MiB of a {:.1} MiB file while decoding on a staging device",
        mapping / MIB,
        file / MIB
    );
}
