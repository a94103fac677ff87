//! The `qwen4_exp` binary as a child process: the JSON report's counters on
//! the fake device, the fixture writer, and the forward-pass flags' refusal.

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
    assert_eq!(u(&r["steps"]), 4);
    assert_eq!(r["model"]["full_attention_layers"], serde_json::json!([2]));
    assert_eq!(r["model"]["ple_layer"], 0);

    let dense = u(&r["weights"]["dense"]);
    let experts_made = u(&r["weights"]["experts_made"]);
    let staged = u(&r["weights"]["staged"]);
    assert_eq!(staged, dense + experts_made);
    assert_eq!(u(&r["weights"]["expert_stacks"]), 9);
    assert_eq!(u(&r["weights"]["lazy_tables"]), 1);
    assert_eq!(u(&r["weights"]["whole_stacks_staged"]), 0);

    let seam = &r["seam"];
    assert_eq!(u(&seam["uploads"]), staged);
    assert_eq!(u(&seam["releases"]), staged);
    let fake = &r["fake"];
    assert_eq!(u(&fake["allocs"]), staged);
    assert_eq!(u(&fake["copies_completed"]), staged);
    assert_eq!(u(&fake["releases"]), staged);
    assert_eq!(u(&fake["device_bytes"]), u(&seam["uploaded_bytes"]));

    // 4 steps asked for every dense weight 4 times; the seam copied it once.
    assert_eq!(u(&r["decode"]["dense_calls"]), 4 * dense);
    assert_eq!(u(&r["decode"]["expert_calls"]), 4 * 3 * 2 * 3);
    assert!(experts_made < u(&r["decode"]["expert_calls"]));
    assert_eq!(u(&r["decode"]["ple_rows"]), 4 * 4);

    // The stacks and the table never went up whole.
    let census = &r["census"];
    let stacks = u(&census["routes"]["expert_stack"]["bytes"]);
    let table = u(&census["routes"]["lazy_table"]["bytes"]);
    let dense_bytes = u(&census["routes"]["dense"]["bytes"]);
    let uploaded = u(&seam["uploaded_bytes"]);
    assert!(uploaded < u(&r["file_bytes"]));
    assert!(uploaded < dense_bytes + stacks);
    assert!(uploaded >= dense_bytes && uploaded - dense_bytes < stacks);
    assert!(table > 0);
    assert_eq!(census["roles"]["ffn_up_exps"]["route"], "expert_stack");
    assert_eq!(census["dropped"].as_array().unwrap().len(), 4);

    // More steps reuse the memos: uploads grow only by newly picked experts.
    let longer = json(&["--device", "fake", "--json", "--steps", "12"]);
    assert_eq!(
        u(&longer["seam"]["uploads"]),
        u(&longer["weights"]["dense"]) + u(&longer["weights"]["experts_made"])
    );
    assert!(u(&longer["weights"]["experts_made"]) <= 3 * 3 * 4);
}

#[test]
fn host_device_uploads_nothing() {
    let r = json(&["--device", "host", "--json", "--steps", "2"]);
    assert_eq!(u(&r["seam"]["uploads"]), 0);
    assert!(r["fake"].is_null());
}

#[test]
fn write_fixture_then_load_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let out = run(&["--write-fixture", path.to_str().unwrap()]);
    assert!(out.status.success());
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes, qwen4_exp::fixture::fixture().to_bytes());
    let r = json(&[path.to_str().unwrap(), "--device", "sink", "--json"]);
    assert_eq!(u(&r["seam"]["uploads"]), u(&r["weights"]["staged"]));
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
            &["--dump-logits", "/tmp/never-written.f32"][..],
            "--dump-logits needs --tokens",
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
