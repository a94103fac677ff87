//! Residency end to end: the `seam` binary loads a generated model of a few
//! hundred MiB as a child process (so no other test's memory is counted),
//! and its JSON report must show host memory bounded by the staging ring
//! plus a small allowance, every page given back, and every tensor's bytes
//! arriving intact.

use std::path::Path;
use std::process::Command;

use seam::borrow::MapOptions;
use seam::gguf::GgufModel;
use serde_json::Value as Json;

/// Bytes of host memory a load may use beyond its ring (the brief's bound).
const ALLOWANCE_MIB: f64 = 96.0;

fn load(file: &Path, device: &str, env: &[(&str, &str)]) -> Json {
    let out = Command::new(env!("CARGO_BIN_EXE_seam"))
        .args(["load", "--json", "--hash", "--device", device])
        .arg(file)
        .envs(env.iter().copied())
        .output()
        .expect("run seam load");
    assert!(
        out.status.success(),
        "seam load failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("seam load --json prints JSON")
}

/// The sha256 of every tensor as the file holds it.
fn file_hashes(file: &Path) -> Vec<(String, String)> {
    let model = GgufModel::open(file, MapOptions::default()).unwrap();
    model
        .tensors()
        .iter()
        .map(|t| {
            let borrow = model.tensor_borrow(t).unwrap();
            (
                t.name.clone(),
                seam_tools::inspect::sha256_hex_releasing(&borrow),
            )
        })
        .collect()
}

#[track_caller]
fn check_report(report: &Json, expected: &[(String, String)], ring_mib: f64) {
    let tensors = report["per_tensor"].as_array().unwrap();
    assert_eq!(tensors.len(), expected.len());
    for (got, (name, sha)) in tensors.iter().zip(expected) {
        assert_eq!(got["name"], name.as_str());
        assert_eq!(got["sha256"], sha.as_str(), "tensor {name}");
    }
    let bytes = report["bytes"].as_u64().unwrap();
    assert_eq!(report["device_bytes"].as_u64().unwrap(), bytes);
    assert_eq!(report["released_bytes"].as_u64().unwrap(), bytes);
    let rss = &report["rss"];
    let grew = rss["peak_mib"].as_f64().unwrap() - rss["baseline_mib"].as_f64().unwrap();
    assert!(
        grew <= ring_mib + ALLOWANCE_MIB,
        "host grew {grew:.1} MiB, bound {ring_mib} + {ALLOWANCE_MIB}: {rss}"
    );
    let file_after = rss["rss_file_after_mib"].as_f64().unwrap();
    assert!(
        file_after <= 16.0,
        "RssFile after {file_after:.1} MiB: {rss}"
    );
}

#[test]
fn sink_load_of_a_generated_model_stays_within_the_ring() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gen-384MiB.gguf");
    seam_tools::demo::generated_model(384 << 20, 7)
        .write_file(&file)
        .unwrap();
    let expected = file_hashes(&file);
    assert!(expected.len() > 100);

    // A 4 x 4 MiB ring: tensors of up to 9 MiB go through it in chunks.
    let ring = [("VT_PINNED_H2D_MIB", "4"), ("VT_PINNED_H2D_BUFFERS", "4")];
    let report = load(&file, "sink", &ring);
    check_report(&report, &expected, 16.0);
    assert_eq!(report["policy"]["pinned_h2d_mib"]["value"], "4");
    assert_eq!(
        report["policy"]["pinned_h2d_mib"]["source"],
        "env VT_PINNED_H2D_MIB"
    );

    // Direct copies (no ring) still deliver every byte and give every page
    // back; the peak is then about the largest tensor.
    let direct = load(&file, "sink", &[("VT_PINNED_H2D_MIB", "0")]);
    check_report(&direct, &expected, 0.0);
}

#[test]
fn fake_load_releases_every_staged_borrow() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gen-64MiB.gguf");
    seam_tools::demo::generated_model(64 << 20, 3)
        .write_file(&file)
        .unwrap();
    let expected = file_hashes(&file);
    let report = load(&file, "fake", &[]);
    let bytes = report["bytes"].as_u64().unwrap();
    assert_eq!(
        report["counts"]["uploads"].as_u64().unwrap(),
        expected.len() as u64
    );
    assert_eq!(
        report["counts"]["releases"].as_u64().unwrap(),
        expected.len() as u64
    );
    assert_eq!(report["released_bytes"].as_u64().unwrap(), bytes);
    for (got, (name, sha)) in report["per_tensor"]
        .as_array()
        .unwrap()
        .iter()
        .zip(&expected)
    {
        assert_eq!(got["sha256"], sha.as_str(), "tensor {name}");
    }
    // A 64 MiB model fits in this host's room: the staging device's
    // default keeps its page cache, and the report says why (issue 26).
    let drop = &report["policy"]["drop_page_cache"];
    assert_eq!(drop["value"], "off", "{drop}");
    let source = drop["source"].as_str().unwrap();
    assert!(
        source.starts_with("device default: 64.0 MiB fits in 1/2 of "),
        "{source}"
    );
    assert!(
        report["policy_line"]
            .as_str()
            .unwrap()
            .contains(&format!("drop_page_cache=off ({source})")),
        "{report}"
    );
}
