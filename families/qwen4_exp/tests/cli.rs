//! The `qwen4_exp` binary (the kit's driver over qwen4exp) as a child
//! process: the JSON report's counters and decode figures on the fake
//! device, the fixture writer, and bad flags refused in one line.

use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_qwen4_exp"))
        .args(args)
        .output()
        .expect("the binary runs")
}

fn json(args: &[&str]) -> serde_json::Value {
    let out = run(args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}

fn u(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a u64: {v}"))
}

#[test]
fn fake_device_json_shows_each_weight_staged_and_released_once() {
    let r = json(&["--device", "fake", "--json"]);
    assert_eq!(r["arch"], "qwen4exp");
    assert_eq!(r["device"], "fake");
    assert_eq!(u(&r["steps"]), 4, "the driver's default");
    assert_eq!(
        r["prompt"],
        serde_json::json!([1, 2, 3]),
        "the driver's default"
    );
    assert_eq!(r["generated"].as_array().unwrap().len(), 4);
    let fam = &r["family"];
    assert_eq!(fam["name"], "qwen4_exp");
    assert_eq!(
        fam["model"]["full_attention_layers"],
        serde_json::json!([2])
    );
    assert_eq!(fam["model"]["ple_layer"], 0);

    let w = &fam["weights"];
    let dense = u(&w["dense"]);
    let experts_made = u(&w["experts_made"]);
    let staged = u(&w["staged"]);
    // The forward pass stages what it reads: every expert it made, and
    // the dense weights it reads (not every claimed one need be).
    assert!(
        staged > experts_made && staged - experts_made <= dense,
        "{w}"
    );
    assert_eq!(u(&w["expert_stacks"]), 9);
    assert_eq!(u(&w["lazy_tables"]), 1);
    assert_eq!(u(&w["whole_stacks_staged"]), 0);
    // 3 MoE layers x 3 kinds x at most 4 experts: some never picked.
    assert!(
        experts_made > 0 && experts_made <= 3 * 3 * 4,
        "{experts_made}"
    );

    let seam = &r["seam"];
    assert_eq!(u(&seam["uploads"]), staged);
    assert_eq!(u(&seam["releases"]), staged);
    let fake = &r["fake"];
    // The staged weights, and the device path's kernel outputs (fake
    // device allocations too).
    assert!(u(&fake["allocs"]) > staged, "{fake}");
    assert_eq!(u(&fake["copies_completed"]), staged);
    assert_eq!(u(&fake["releases"]), staged);
    // The device path's state and activations live there too.
    assert!(
        u(&fake["device_bytes"]) > u(&seam["uploaded_bytes"]),
        "{fake}"
    );

    // The decode: one prefill, then a step per token but the last; the
    // fake device has an op layer, so the device path decodes: kernels
    // launched on every call, nothing of a staged weight read back, only
    // activations (the logits, the router's logits, the QSA indexer's
    // query and pooled keys, the PLE gate's dot products).
    let d = &r["decode"];
    assert_eq!((u(&d["steps"]), u(&d["prompt_tokens"])), (4, 3));
    let per_call = |k: &str| -> Vec<u64> {
        d[k].as_array()
            .unwrap_or_else(|| panic!("{k}: {d}"))
            .iter()
            .map(u)
            .collect()
    };
    let weights_back = per_call("weight_read_back_bytes");
    assert_eq!(weights_back.len(), 4, "{d}");
    assert_eq!(weights_back, [0; 4], "{d}");
    assert!(per_call("read_back_bytes").iter().all(|&b| b > 0), "{d}");
    assert!(per_call("kernel_launches").iter().all(|&k| k > 0), "{d}");
    let transfers = per_call("host_transfers");
    assert!(transfers.iter().sum::<u64>() > u(&seam["uploads"]), "{d}");
    assert!(d["tokens_per_second"].as_f64().unwrap() > 0.0, "{d}");
    assert!(d["prefill_seconds"].as_f64().unwrap() > 0.0, "{d}");

    // The stacks and the table never went up whole.
    let census = &fam["census"];
    let stacks = u(&census["routes"]["expert_stack"]["bytes"]);
    let table = u(&census["routes"]["lazy_table"]["bytes"]);
    let dense_bytes = u(&census["routes"]["dense"]["bytes"]);
    let uploaded = u(&seam["uploaded_bytes"]);
    assert!(uploaded < u(&r["file_bytes"]));
    assert!(uploaded < dense_bytes + stacks);
    assert!(table > 0);
    assert_eq!(census["roles"]["ffn_up_exps"]["route"], "expert_stack");
    assert_eq!(census["dropped"].as_array().unwrap().len(), 4);

    // More steps reuse the memos: uploads grow only by newly picked experts.
    let longer = json(&["--device", "fake", "--json", "--steps", "12"]);
    let lw = &longer["family"]["weights"];
    assert_eq!(u(&longer["seam"]["uploads"]), u(&lw["staged"]));
    assert!(u(&lw["staged"]) <= u(&lw["dense"]) + u(&lw["experts_made"]));
    assert!(u(&lw["experts_made"]) >= experts_made);
    assert!(u(&lw["experts_made"]) <= 3 * 3 * 4);
}

#[test]
fn host_device_uploads_nothing() {
    let r = json(&["--device", "host", "--json", "--steps", "2"]);
    assert_eq!(u(&r["seam"]["uploads"]), 0);
    assert!(r["fake"].is_null());
    // The host reads the mapped weights in place: nothing read back.
    assert_eq!(
        r["decode"]["weight_read_back_bytes"],
        serde_json::json!([0, 0])
    );
    assert_eq!(r["decode"]["host_transfers"], serde_json::json!([0, 0]));
}

#[test]
fn write_fixture_then_load_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let out = run(&["--write-fixture", path.to_str().unwrap()]);
    assert!(out.status.success());
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes, qwen4_exp::fixture::fixture().to_bytes());
    let r = json(&[path.to_str().unwrap(), "--device", "fake", "--json"]);
    assert_eq!(
        u(&r["seam"]["uploads"]),
        u(&r["family"]["weights"]["staged"])
    );
}

/// The sink keeps nothing, and a decode reads the staged weights back: it
/// is refused up front, in one line (no policy line, nothing loaded).
#[test]
fn the_sink_cannot_decode_and_says_why_in_one_line() {
    let out = run(&["--device", "sink", "--steps", "1"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("qwen4_exp: error: --device sink: the sink keeps no weight to read back"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn bad_forward_pass_flags_exit_2_with_one_line() {
    for (args, says) in [
        (
            &["--tokens", "1,x,3"][..],
            "expected comma-separated token ids",
        ),
        (&["--tokens", ""][..], "expected comma-separated token ids"),
        (
            &["--steps", "-1"][..],
            "invalid value '-1' for '--steps <STEPS>'",
        ),
        (
            &["--tokens", "1,99999"][..],
            "token 99999 is not below the vocabulary size",
        ),
    ] {
        let out = run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().last().unwrap_or("");
        assert!(last.contains(says), "{args:?}: {err}");
        assert!(last.starts_with("qwen4_exp: error:"), "{err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn the_built_in_fixture_decodes_through_the_seam() {
    let r = json(&[
        "--device", "fake", "--json", "--tokens", "1,2,3", "--steps", "3",
    ]);
    assert_eq!(r["generated"].as_array().unwrap().len(), 3, "{r}");
    assert_eq!(r["seam"]["uploads"], r["seam"]["releases"]);
}

#[test]
fn mmap_off_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_qwen4_exp"))
        .args(["--device", "fake"])
        .env("VT_GGUF_MMAP", "0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("mmap=off"), "{err}");
}

#[test]
fn a_refused_file_exits_2_naming_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.gguf");
    let mut spec = qwen4_exp::fixture::tiny();
    spec.remove_tensor("blk.0.ssm_out.weight");
    spec.writer().write_file(&path).unwrap();
    let out = run(&[path.to_str().unwrap(), "--device", "fake"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err.lines().last().unwrap();
    assert!(
        last.contains("blk.0.ssm_out.weight") && last.contains("bad.gguf"),
        "{err}"
    );
}

/// The binary loads through a session: the knobs from the environment
/// reach it (the policy line names each with its source) and the ring is
/// the staging path on a staging device.
#[test]
fn the_binary_loads_through_a_session_with_the_knobs_and_the_ring() {
    let r = family_kit::conformance::the_binary_loads_through_a_session(
        env!("CARGO_BIN_EXE_qwen4_exp"),
        &["--device", "fake", "--json", "--steps", "1"],
    );
    assert_eq!(r["device"], "fake");
}
