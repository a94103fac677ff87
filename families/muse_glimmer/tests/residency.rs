//! Host memory while the `muse_glimmer` binary decodes a generated model
//! (about 16 MB of mixed-type weights, about 50 MB in `f32`), measured in
//! the child process by its decode sampler:
//!
//! - on the host, peak `RssAnon` during decoding grows by less than 16 MiB:
//!   the forward reads quantized rows, and a cache of every weight in
//!   `f32` would exceed it;
//! - on the fake staging device, the mapping's resident bytes stay a small
//!   part of the file through every decode step and are a few pages at its
//!   end (staged weights are read from their device copies, their host
//!   pages released once); uploads = releases; the same greedy tokens.

use std::path::Path;
use std::process::Command;

use muse_glimmer::fixture::{Shape, generated};

const MIB: f64 = 1048576.0;

fn decode(path: &Path, device: &str) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_muse_glimmer"))
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
    let spec = generated(&Shape {
        n_embd: 512,
        heads: (16, 8, 32),
        n_layer: 2,
        n_ff: 1024,
        n_vocab: 8_000,
        ..Shape::tiny()
    });
    let file = spec
        .streaming_writer()
        .and_then(|w| w.write_file(&path))
        .expect("write the generated model") as f64;
    let all_f32: f64 = spec
        .tensors
        .iter()
        .map(|t| 4.0 * t.dims.iter().product::<u64>() as f64)
        .sum();
    let bound = 16.0 * MIB;
    assert!(all_f32 > 2.0 * bound, "{all_f32}");

    let host = decode(&path, "host");
    let r = &host["decode_residency"];
    let grew = (f(&r["rss_anon_peak_mib"]) - f(&r["rss_anon_start_mib"])) * MIB;
    assert!(
        grew < bound,
        "RssAnon grew {:.1} MiB while decoding",
        grew / MIB
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
    let peak = f(&r["mapping_rss_peak_mib"]) * MIB;
    let end = f(&r["mapping_rss_end_mib"]) * MIB;
    assert!(
        peak < file / 4.0,
        "the mapping held {:.1} MiB of a {:.1} MiB file",
        peak / MIB,
        file / MIB
    );
    assert!(
        end < 4.0 * MIB,
        "the mapping ends decoding with {:.1} MiB resident",
        end / MIB
    );
}
