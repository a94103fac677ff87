//! The `glm_moe_dsa` binary as a child process: the JSON report's counters
//! on the fake device (uploads = releases, counts per route, experts staged
//! per stack, no stack whole), the fixture writer, `--dump-logits`, and bad
//! input or a refused file as one line, exit 2.

use std::process::{Command, Output};

use seam::gguf::Value;

const BIN: &str = env!("CARGO_BIN_EXE_glm_moe_dsa");

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
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

#[track_caller]
fn one_line(out: &Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{:?}: {stderr}", out.status);
    assert_eq!(stderr.matches('\n').count(), 1, "not one line:\n{stderr}");
    assert!(stderr.starts_with("glm_moe_dsa: error: "), "{stderr}");
    for n in needles {
        assert!(stderr.contains(n), "expected {n:?} in {stderr}");
    }
}

#[test]
fn fake_device_json_shows_uploads_equal_releases_and_counts_per_route() {
    let r = json(&[
        "--device", "fake", "--json", "--tokens", "1,2,3,4", "--steps", "4",
    ]);
    assert_eq!(r["arch"], "glm-dsa");
    assert_eq!(r["device"], "fake");
    assert_eq!(r["generated"].as_array().unwrap().len(), 4);
    assert_eq!(
        r["family"]["model"]["idx_full"],
        serde_json::json!([true, true, true, false]),
        "no types key and a 2^20 context: the GLM-5.2 table"
    );

    let routes = &r["family"]["routes"];
    let dense = u(&routes["dense"]["tensors"]);
    assert_eq!(
        u(&routes["dense"]["staged_now"]),
        dense,
        "every dense weight staged"
    );
    assert_eq!(u(&routes["expert_stack"]["tensors"]), 9, "3 MoE layers x 3");
    assert_eq!(
        u(&routes["expert_stack"]["staged_now"]),
        0,
        "no stack whole"
    );
    let w = &r["family"]["weights"];
    let (made, staged) = (u(&w["experts_made"]), u(&w["staged"]));
    assert_eq!(staged, dense + made);
    assert_eq!(u(&w["whole_stacks_staged"]), 0);
    let per_stack = r["family"]["experts_staged_per_stack"].as_object().unwrap();
    assert_eq!(per_stack.len(), 9);
    assert_eq!(per_stack.values().map(u).sum::<u64>(), made);
    assert!(per_stack.values().all(|n| (1..=4).contains(&u(n))));

    let seam = &r["seam"];
    assert_eq!(u(&seam["uploads"]), staged);
    assert_eq!(u(&seam["releases"]), staged);
    let fake = &r["fake"];
    // The staged weights, and the device path's kernel outputs and state
    // (fake device allocations too).
    assert!(u(&fake["allocs"]) > staged, "{fake}");
    assert_eq!(u(&fake["copies_completed"]), staged);
    assert_eq!(u(&fake["releases"]), staged);

    // The fake device has an op layer, so the device path decodes: kernels
    // launched on every call, nothing of a staged weight read back, only
    // activations (the logits, the routers' logits, the indexers'
    // projections).
    let d = &r["decode"];
    let per_call = |k: &str| -> Vec<u64> {
        d[k].as_array()
            .unwrap_or_else(|| panic!("{k}: {d}"))
            .iter()
            .map(u)
            .collect()
    };
    assert_eq!(per_call("weight_read_back_bytes"), [0; 4], "{d}");
    assert!(per_call("read_back_bytes").iter().all(|&b| b > 0), "{d}");
    assert!(per_call("kernel_launches").iter().all(|&k| k > 0), "{d}");

    // The census: routes by count and bytes; the MTP block and the shared
    // layer's indexer dropped by name.
    let census = &r["family"]["census"]["routes"];
    assert_eq!(u(&census["expert_stack"]["count"]), 9);
    assert_eq!(u(&census["dense"]["count"]), dense);
    let dropped: Vec<&str> = r["family"]["census"]["dropped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert!(
        dropped.contains(&"blk.4.nextn.eh_proj.weight"),
        "{dropped:?}"
    );
    assert!(dropped.contains(&"blk.4.ffn_up_exps.weight"), "{dropped:?}");
    assert!(
        dropped.contains(&"blk.3.indexer.proj.weight"),
        "{dropped:?}"
    );
    assert!(
        !dropped.iter().any(|d| d.starts_with("blk.2.indexer")),
        "{dropped:?}"
    );
}

#[test]
fn host_device_uploads_nothing() {
    let r = json(&["--device", "host", "--json", "--steps", "2"]);
    assert_eq!(u(&r["seam"]["uploads"]), 0);
    assert!(r["fake"].is_null());
}

#[test]
fn write_fixture_then_decode_it_and_dump_the_logits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let p = path.to_str().unwrap();
    let out = run(&["--write-fixture", p]);
    assert!(out.status.success());
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(size < 2 << 20, "the fixture is {size} bytes");
    let dump = dir.path().join("l.bin");
    let r = json(&[
        p,
        "--device",
        "fake",
        "--json",
        "--tokens",
        "3,1",
        "--steps",
        "2",
        "--dump-logits",
        dump.to_str().unwrap(),
    ]);
    assert_eq!(
        u(&r["seam"]["uploads"]),
        u(&r["family"]["weights"]["staged"])
    );
    let bytes = std::fs::read(&dump).unwrap();
    assert_eq!(bytes.len() as u64, 4 * u(&r["n_vocab"]));
    let logits: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert!(logits.iter().all(|v| v.is_finite()));
}

#[test]
fn bad_input_exits_2_with_one_line() {
    one_line(&run(&["--tokens", "1,x"]), &["--tokens \"1,x\""]);
    one_line(
        &run(&["--tokens", "1,999", "--device", "host"]),
        &["token 999"],
    );
    one_line(&run(&["--device", "nonsense"]), &["nonsense"]);
    one_line(
        &run(&["/nonexistent/m.gguf", "--device", "host"]),
        &["/nonexistent/m.gguf"],
    );
}

#[test]
fn a_refused_file_exits_2_naming_the_tensor_or_key() {
    let dir = tempfile::tempdir().unwrap();
    type Edit = fn(&mut family_kit::FixtureSpec);
    let cases: [(&str, Edit); 6] = [
        // A full layer without its indexer.
        ("blk.2.indexer.proj.weight", |s| {
            s.remove_tensor("blk.2.indexer.proj.weight");
        }),
        ("glm-dsa.attention.indexer.types", |s| {
            s.set_key(
                "glm-dsa.attention.indexer.types",
                Value::Array(seam::gguf::Array::U32(vec![0, 1, 1, 1])),
            );
        }),
        ("glm-dsa.expert_gating_func", |s| {
            s.set_key("glm-dsa.expert_gating_func", Value::U32(1));
        }),
        ("glm-dsa.expert_feed_forward_length", |s| {
            s.remove_key("glm-dsa.expert_feed_forward_length");
        }),
        ("blk.2.ffn_up_exps.weight", |s| {
            s.tensor_mut("blk.2.ffn_up_exps.weight").unwrap().dims[2] = 5;
        }),
        // A scale llama.cpp has no slot for.
        ("blk.1.attn_q_a.scale", |s| {
            s.add_tensor("blk.1.attn_q_a.scale", seam::gguf::GgmlType::F32, &[1]);
        }),
    ];
    for (i, (name, edit)) in cases.into_iter().enumerate() {
        let path = dir.path().join(format!("bad{i}.gguf"));
        let mut spec = glm_moe_dsa::fixture::fixture();
        edit(&mut spec);
        spec.write_file(&path).unwrap();
        let p = path.to_str().unwrap();
        one_line(&run(&[p, "--device", "fake"]), &[name, p]);
    }
}

/// `VT_*` knobs reach the binary's load session (the policy line names
/// them) and the ring carries its weights on the fake staging device.
#[test]
fn the_binary_loads_through_a_session_with_the_knobs_and_the_ring() {
    let r = family_kit::conformance::the_binary_loads_through_a_session(
        env!("CARGO_BIN_EXE_glm_moe_dsa"),
        &["--device", "fake", "--json", "--steps", "1"],
    );
    assert_eq!(r["device"], "fake");
}

#[test]
fn stage_all_on_the_fake_device_stages_every_stack_whole_and_decodes_on_the_device() {
    let r = json(&[
        "--device", "fake", "--stage", "all", "--json", "--tokens", "1,2,3,4", "--steps", "4",
    ]);
    assert_eq!(r["decode"]["stage"], "all");
    let w = &r["family"]["weights"];
    assert_eq!(u(&w["experts_made"]), 0, "no expert staged on a pick");
    let staged = u(&w["staged"]);
    let dense = u(&r["family"]["routes"]["dense"]["tensors"]);
    assert_eq!(staged, dense + 9, "every dense weight and 9 stacks whole");
    let d = &r["decode"];
    assert!(
        d["weight_read_back_bytes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|b| b.as_u64() == Some(0)),
        "{d}"
    );
    // The same greedy tokens as with experts staged on their first pick.
    let picked = json(&[
        "--device", "fake", "--json", "--tokens", "1,2,3,4", "--steps", "4",
    ]);
    assert_eq!(r["generated"], picked["generated"]);
}
