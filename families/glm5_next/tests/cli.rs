//! The `glm5_next` binary as a child process: the JSON report's counters
//! on the fake device (uploads = releases, counts per route, the banks
//! staged per expert, the device path's decode with no weight read back),
//! the mapping's resident bytes through decode, the
//! fixture writer, `--dump-logits`, and bad input as one line, exit 2.

use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_glm5_next");

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
    assert!(stderr.starts_with("glm5_next: error: "), "{stderr}");
    for n in needles {
        assert!(stderr.contains(n), "expected {n:?} in {stderr}");
    }
}

#[test]
fn fake_device_json_shows_uploads_equal_releases_and_counts_per_route() {
    let r = json(&[
        "--device",
        "fake",
        "--json",
        "--tokens",
        "1,2,3,4,5",
        "--steps",
        "4",
    ]);
    assert_eq!(r["arch"], "glm5-next");
    assert_eq!(r["device"], "fake");
    assert_eq!(
        r["family"]["model"]["kda_layers"],
        serde_json::json!([0, 1, 2])
    );
    assert_eq!(r["family"]["model"]["mla_layers"], serde_json::json!([3]));
    assert_eq!(r["generated"].as_array().unwrap().len(), 4);

    let w = &r["family"]["weights"];
    let (dense, made, staged) = (u(&w["dense"]), u(&w["experts_made"]), u(&w["staged"]));
    assert_eq!(staged, dense + made);
    assert_eq!(
        u(&w["expert_stacks"]),
        9,
        "three banks in each of three MoE layers"
    );
    assert_eq!(u(&w["whole_stacks_staged"]), 0);
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
    // activations (the logits, the routers' logits, the pools' scores).
    let d = &r["decode"];
    let per_call = |k: &str| -> Vec<u64> {
        d[k].as_array()
            .unwrap_or_else(|| panic!("{k}: {d}"))
            .iter()
            .map(u)
            .collect()
    };
    let calls = per_call("weight_read_back_bytes");
    assert!(!calls.is_empty() && calls.iter().all(|&b| b == 0), "{d}");
    assert!(per_call("read_back_bytes").iter().all(|&b| b > 0), "{d}");
    assert!(per_call("kernel_launches").iter().all(|&k| k > 0), "{d}");

    // Counts per route, in the census: every bank an expert stack, staged
    // by expert only.
    let routes = &r["family"]["census"]["routes"];
    assert_eq!(u(&routes["expert_stack"]["count"]), 9);
    assert_eq!(u(&routes["dense"]["count"]), dense);
    let stacks = u(&routes["expert_stack"]["bytes"]);
    let dense_bytes = u(&routes["dense"]["bytes"]);
    let uploaded = u(&seam["uploaded_bytes"]);
    // Dense weights whole, banks by expert: at most every expert once.
    assert!(uploaded >= dense_bytes && uploaded - dense_bytes <= stacks);
    for role in ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"] {
        assert_eq!(
            r["family"]["census"]["roles"][role]["route"],
            "expert_stack"
        );
    }
    let per_bank = r["family"]["experts_staged_per_bank"].as_object().unwrap();
    assert_eq!(per_bank.len(), 9);
    assert_eq!(per_bank.values().map(u).sum::<u64>(), made);
    for (bank, n) in per_bank {
        // 8 positions x 2 picks of 4 experts: at least 2, at most 4 each.
        assert!((2..=4).contains(&u(n)), "{bank}: {n}");
    }
}

/// A fixture of about 75 MB, mostly expert banks (64 experts, 2 used): on
/// the fake device the mapping's resident bytes, sampled in the child while
/// it decodes, stay under a quarter of the file (staged weights' pages are
/// given back; unpicked experts are never read). The page-exact check,
/// that no released weight is read back from the mapping, is the kit's
/// conformance test `the_mapping_stays_released_during_decode`.
#[test]
fn the_mapping_stays_under_a_quarter_of_the_file_through_decode_on_the_fake_device() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.gguf");
    let shape = glm5_next::fixture::Shape {
        e: 512,
        vocab: 4096,
        heads: 4,
        kda_dim: 128,
        lora: 512,
        head_dim: 128,
        idx: (4, 128),
        n_expert: 64,
        n_ff_exp: 256,
        n_ff: 1024,
        kv_lora: 512,
        ..glm5_next::fixture::Shape::tiny()
    };
    let spec = glm5_next::fixture::fixture_of(&shape);
    let file = spec.write_file(&path).unwrap() as f64;
    let r = json(&[
        path.to_str().unwrap(),
        "--device",
        "fake",
        "--json",
        "--tokens",
        "1,2",
        "--steps",
        "2",
    ]);
    let res = &r["decode_residency"];
    let bytes = |v: &serde_json::Value| v.as_f64().unwrap() * 1048576.0;
    assert!(u(&res["samples"]) > 0, "{res}");
    assert!(file > 64.0 * 1048576.0, "{file}");
    assert!(
        bytes(&res["mapping_rss_peak_mib"]) < file / 4.0,
        "{res} of {file}"
    );
    assert!(
        bytes(&res["mapping_rss_end_mib"]) < file / 4.0,
        "{res} of {file}"
    );
    assert_eq!(u(&r["family"]["weights"]["whole_stacks_staged"]), 0);
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
    let cases: [(&str, Edit); 3] = [
        ("blk.3.indexer.proj.weight", |s| {
            s.remove_tensor("blk.3.indexer.proj.weight");
        }),
        ("glm5-next.attention.indexer.kpool_select_tail", |s| {
            s.set_key(
                "glm5-next.attention.indexer.kpool_select_tail",
                seam::gguf::Value::Bool(false),
            );
        }),
        ("blk.2.ffn_up_exps.weight", |s| {
            s.tensor_mut("blk.2.ffn_up_exps.weight").unwrap().dims[2] = 5;
        }),
    ];
    for (i, (name, edit)) in cases.into_iter().enumerate() {
        let path = dir.path().join(format!("bad{i}.gguf"));
        let mut spec = glm5_next::fixture::fixture();
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
        env!("CARGO_BIN_EXE_glm5_next"),
        &[
            "--device", "fake", "--json", "--tokens", "1,2,3", "--steps", "1",
        ],
    );
    assert_eq!(r["arch"], "glm5-next");
}

#[test]
fn stage_all_on_the_fake_device_stages_every_bank_whole_and_decodes_on_the_device() {
    let args = [
        "--device",
        "fake",
        "--json",
        "--tokens",
        "1,2,3,4,5",
        "--steps",
        "4",
    ];
    let r = json(&[&args[..], &["--stage", "all"]].concat());
    assert_eq!(r["decode"]["stage"], "all");
    let w = &r["family"]["weights"];
    assert_eq!(u(&w["experts_made"]), 0, "no expert staged on a pick");
    // The banks themselves stay streamed: each is staged as its own
    // whole-stack weight (three banks of three layers).
    assert_eq!(u(&w["whole_stacks_staged"]), 0);
    assert_eq!(u(&w["staged"]), u(&w["dense"]) + 9);
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
    assert_eq!(r["generated"], json(&args)["generated"]);
}

/// `--write-generated`'s model at the public checkpoint's 45 layers (as a
/// sparse file: header written, data as holes) passes the manifest check
/// in the public 3 KDA : 1 MLA pattern, with quantized types only where
/// llama.cpp's GPU path multiplies (norms, gates and small tables F32).
#[test]
fn the_generated_model_at_45_layers_passes_the_manifest_in_the_public_pattern() {
    use glm5_next::fixture::{Shape, generated};
    use seam::borrow::MapOptions;
    use seam::gguf::{GgmlType, GgufModel};
    let spec = generated(&Shape::checkpoint(45));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("generated.gguf");
    // The streaming writer's fills are never called by a sparse write.
    let size = spec
        .streaming_writer()
        .unwrap()
        .write_sparse(&path)
        .unwrap();
    assert!(size > 100 << 30, "{size}");
    let gguf = GgufModel::open(&path, MapOptions { prefault: false }).unwrap();
    let model = glm5_next::Glm5Next::load(&gguf).expect("the manifest check passes");
    let kinds: Vec<glm5_next::LayerKind> = model.hparams().layers.clone();
    assert_eq!(kinds.len(), 45);
    for (l, k) in kinds.iter().enumerate() {
        let mla = l % 4 == 3;
        assert_eq!(*k == glm5_next::LayerKind::Mla, mla, "layer {l}: {k:?}");
    }
    for t in &spec.tensors {
        let small = t.dims.iter().product::<u64>() <= 8 << 20;
        assert!(
            small || t.ggml_type != GgmlType::F32,
            "{} is a large F32 matrix",
            t.name
        );
    }
}
