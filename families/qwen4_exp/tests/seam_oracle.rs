//! The forward pass through the seam, end to end: the `qwen4_exp` binary
//! decodes the oracle fixture's prompt on the fake staging device (every
//! weight asked of `resident_weight` on every step, experts one at a time,
//! PLE rows gathered) and must give llama.cpp's greedy tokens and
//! last-position logits, with each staged weight uploaded and released once.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value as Json;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/qwen4exp/llama-archs-d05.gguf")
}

fn golden() -> Json {
    let path = fixture().with_extension("golden.json");
    // The golden's metadata copy holds a `-Infinity`, which JSON lacks.
    let text = std::fs::read_to_string(path)
        .unwrap()
        .replace("-Infinity", "null");
    serde_json::from_str(&text).unwrap()
}

#[track_caller]
fn check(device: &str) {
    let golden = golden();
    let prompt: Vec<String> = golden["prompt"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.to_string())
        .collect();
    let greedy = golden["greedy"].as_array().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let dump = dir.path().join("logits.bin");
    let out = Command::new(env!("CARGO_BIN_EXE_qwen4_exp"))
        .arg(fixture())
        .args(["--device", device, "--json", "--tokens", &prompt.join(",")])
        // The golden's caches are F32.
        .args(["--cache-type-k", "f32", "--cache-type-v", "f32"])
        .args(["--steps", &greedy.len().to_string(), "--dump-logits"])
        .arg(&dump)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Json = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report["generated"].as_array().unwrap(),
        greedy,
        "{device}: greedy tokens"
    );

    let bytes = std::fs::read(&dump).unwrap();
    let logits: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let expected = golden["step_logits"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(logits.len(), expected.len());
    let worst = logits
        .iter()
        .zip(&expected)
        .map(|(a, b)| (f64::from(*a) - b.as_f64().unwrap()).abs())
        .fold(0.0, f64::max);
    assert!(worst <= 1e-3, "{device}: last logits differ by {worst}");

    let seam = &report["seam"];
    if device == "fake" {
        let uploads = seam["uploads"].as_u64().unwrap();
        assert!(uploads > 50, "{seam}");
        assert_eq!(
            seam["releases"], seam["uploads"],
            "one release per upload: {seam}"
        );
        // Allocations count the device path's kernel outputs as well.
        assert_eq!(
            report["fake"]["copies_completed"].as_u64().unwrap(),
            uploads,
            "one copy per weight"
        );
        let decode = &report["decode"];
        assert!(
            decode["weight_read_back_bytes"]
                .as_array()
                .unwrap()
                .iter()
                .all(|b| b.as_u64() == Some(0)),
            "the device path reads no weight back: {decode}"
        );
        assert_eq!(report["family"]["weights"]["whole_stacks_staged"], 0);
    } else {
        assert_eq!(seam["uploads"], 0, "the CPU reads host bytes: {seam}");
    }
}

#[test]
fn greedy_decoding_through_the_seam_matches_llama_cpp_on_the_fake_device() {
    check("fake");
}

#[test]
fn greedy_decoding_on_the_host_reads_the_mapped_file() {
    check("host");
}
