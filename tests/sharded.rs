//! `seam load --devices` end to end: the binary loads a generated model over
//! several fake devices as a child process, and its report must show each
//! shard holding the file's bytes at its range, the split tensors
//! partitioned over the ranks, each replicated tensor read by one rank and
//! received by the others, the bytes read over all ranks equal to the
//! model's, and host growth bounded by the rings (plus the fake devices' own
//! copies, which live in host memory). Multi-device lists that
//! cannot run answer in one line with exit status 2.

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Output};

use seam::borrow::MapOptions;
use seam::gguf::GgufModel;
use serde_json::Value as Json;
use sha2::{Digest, Sha256};

/// Bytes of host memory a load may use beyond its rings.
const ALLOWANCE_MIB: f64 = 96.0;

fn seam(args: &[&str], file: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_seam"))
        .args(args)
        .arg(file)
        .env("VT_PINNED_H2D_MIB", "4")
        .output()
        .expect("run seam")
}

fn file_sha(file: &std::fs::File, range: &Json) -> String {
    let (start, end) = (range[0].as_u64().unwrap(), range[1].as_u64().unwrap());
    let mut bytes = vec![0u8; (end - start) as usize];
    file.read_exact_at(&mut bytes, start).unwrap();
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn sharded_fake_load_reads_each_byte_once_and_holds_the_files_shards() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gen-160MiB.gguf");
    seam_tools::demo::generated_model(160 << 20, 5)
        .write_file(&path)
        .unwrap();
    let model = GgufModel::open(&path, MapOptions::default()).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    for (devices, split) in [("fake,fake", "experts"), ("fake,fake,fake", "rows")] {
        let out = seam(
            &[
                "load",
                "--json",
                "--hash",
                "--devices",
                devices,
                "--shard",
                split,
            ],
            &path,
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: Json = serde_json::from_slice(&out.stdout).unwrap();
        let ranks = report["ranks"].as_array().unwrap();
        let n = ranks.len();
        assert_eq!(n, devices.split(',').count());
        assert_eq!(report["split"], split);

        // Every shard: the file's bytes at its range; who holds what.
        let mut holders: HashMap<String, Vec<(usize, Json)>> = HashMap::new();
        for rank in ranks {
            let r = rank["rank"].as_u64().unwrap() as usize;
            for s in rank["per_shard"].as_array().unwrap() {
                let name = s["name"].as_str().unwrap().to_owned();
                assert_eq!(
                    s["sha256"].as_str().unwrap(),
                    file_sha(&file, &s["file_bytes"]),
                    "rank {r}: {name}"
                );
                holders.entry(name).or_default().push((r, s.clone()));
            }
        }
        let mut replicated = 0u64;
        for t in model.tensors() {
            let got = &holders[&t.name];
            let (start, end) = (t.offset, t.offset + t.n_bytes);
            if got[0].1["part"] == "whole" {
                replicated += t.n_bytes;
                let ranks: Vec<usize> = got.iter().map(|(r, _)| *r).collect();
                assert_eq!(ranks, (0..n).collect::<Vec<_>>(), "{}", t.name);
                let readers = got.iter().filter(|(_, s)| s["source"] == "file").count();
                assert_eq!(readers, 1, "{} read by one rank", t.name);
                continue;
            }
            let mut spans: Vec<(u64, u64)> = got
                .iter()
                .map(|(_, s)| {
                    let b = s["file_bytes"].as_array().unwrap();
                    (b[0].as_u64().unwrap(), b[1].as_u64().unwrap())
                })
                .collect();
            spans.sort();
            let mut at = start;
            for (a, b) in spans {
                assert_eq!(a, at, "{}: a gap or an overlap", t.name);
                at = b;
            }
            assert_eq!(at, end, "{}: covered to its end", t.name);
        }
        assert!(replicated > 0);

        let totals = &report["totals"];
        let bytes = model.total_tensor_bytes();
        assert_eq!(totals["bytes"].as_u64().unwrap(), bytes);
        assert_eq!(
            totals["read_bytes"].as_u64().unwrap(),
            bytes,
            "each byte read once"
        );
        assert_eq!(totals["replicated_bytes"].as_u64().unwrap(), replicated);
        assert_eq!(
            totals["received_bytes"].as_u64().unwrap(),
            replicated * (n as u64 - 1)
        );
        assert_eq!(totals["covers_each_tensor_once"], true);
        // A fake device keeps its copies in this process's memory: they
        // count on top of the rings.
        let rss = &report["rss"];
        let rings = rss["rings_mib"].as_f64().unwrap();
        assert_eq!(rings, 16.0 * n as f64, "4 x 4 MiB per device");
        let held = totals["device_bytes"].as_u64().unwrap() as f64 / 1048576.0;
        let growth = rss["growth_mib"].as_f64().unwrap();
        assert!(
            growth <= held + rings + ALLOWANCE_MIB,
            "host grew {growth:.1} MiB: held {held:.1} + rings {rings} + {ALLOWANCE_MIB}"
        );
    }
}

#[test]
fn device_lists_that_cannot_run_answer_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gen-8MiB.gguf");
    seam_tools::demo::generated_model(8 << 20, 1)
        .write_file(&path)
        .unwrap();
    let one_line = |out: &Output| {
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        let errors: Vec<&str> = err
            .lines()
            .filter(|l| l.starts_with("seam: error:"))
            .collect();
        assert_eq!(errors.len(), 1, "{err}");
        errors[0].to_owned()
    };
    let mixed = one_line(&seam(&["load", "--devices", "fake,cuda:0"], &path));
    assert!(mixed.contains("all fake or all cuda"), "{mixed}");
    let twice = one_line(&seam(&["load", "--devices", "cuda:1,cuda:1"], &path));
    assert!(twice.contains("named twice"), "{twice}");
    let split = one_line(&seam(
        &["load", "--devices", "fake,fake", "--shard", "cols"],
        &path,
    ));
    assert!(split.contains("expected rows or experts"), "{split}");

    // Two GPUs: without libnccl (CI) the NCCL path says so; elsewhere it
    // loads or names its reason.
    let gpus = seam(&["load", "--devices", "cuda:0,cuda:1"], &path);
    if !platform_cuda::nccl::library_present() {
        let line = one_line(&gpus);
        assert!(
            line.contains("NCCL unavailable: libnccl not found"),
            "{line}"
        );
    } else if !gpus.status.success() {
        one_line(&gpus);
    }
    let matmul = Command::new(env!("CARGO_BIN_EXE_seam"))
        .args(["matmul-check", "--devices", "cuda:0,cuda:1"])
        .output()
        .unwrap();
    if !platform_cuda::nccl::library_present() {
        let line = one_line(&matmul);
        assert!(line.contains("NCCL unavailable"), "{line}");
    }
}
