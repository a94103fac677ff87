//! The `muse_glimmer` binary as a child process: the JSON report's counts
//! on the fake device (uploads = releases, per route), the projector's own
//! census and counts, the broken projectors refused by name in one line,
//! the fixture writer and `--dump-logits`.

use std::path::PathBuf;
use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_muse_glimmer"))
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

fn data(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/muse_glimmer")
        .join(name);
    p.to_str().expect("utf-8 path").to_owned()
}

#[track_caller]
fn one_line(out: &Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{:?}: {stderr}", out.status);
    assert_eq!(stderr.matches('\n').count(), 1, "not one line:\n{stderr}");
    assert!(stderr.starts_with("muse_glimmer: error: "), "{stderr}");
    for n in needles {
        assert!(stderr.contains(n), "expected {n:?} in {stderr}");
    }
    assert!(out.stdout.is_empty());
}

#[test]
fn fake_device_json_shows_uploads_equal_releases_per_route() {
    let r = json(&["--device", "fake", "--json", "--steps", "5"]);
    assert_eq!(r["arch"], "muse-glimmer");
    assert_eq!(r["device"], "fake");
    assert_eq!(r["generated"].as_array().unwrap().len(), 5);
    assert_eq!(
        r["family"]["model"]["is_swa"],
        serde_json::json!([true, true, true, false])
    );
    assert_eq!(r["family"]["model"]["softcap"], 10.0);
    let claimed = u(&r["family"]["weights"]["claimed"]);
    assert_eq!(claimed, 4 * 14 + 3 + 3);
    let dense = &r["family"]["routes"]["dense"];
    assert_eq!(
        (u(&dense["tensors"]), u(&dense["staged"])),
        (claimed, claimed)
    );
    assert_eq!(
        r["family"]["routes"].as_object().unwrap().len(),
        1,
        "a dense family: one route"
    );
    let seam = &r["seam"];
    assert_eq!(
        (u(&seam["uploads"]), u(&seam["releases"])),
        (claimed, claimed)
    );
    assert_eq!(u(&seam["uploaded_bytes"]), u(&dense["bytes"]));
    let fake = &r["fake"];
    // The staged weights, and the device path's kernel outputs and caches
    // (fake device allocations too).
    assert!(u(&fake["allocs"]) > claimed, "{fake}");
    assert_eq!(u(&fake["copies_completed"]), claimed);
    assert_eq!(u(&fake["releases"]), claimed);
    // The decode: one prefill, then a step per token but the last; the
    // fake device has an op layer, so the device path decodes: kernels
    // launched on every call, nothing of a staged weight read back, only
    // the logits (64 of them).
    let d = &r["decode"];
    let per_call = |k: &str| -> Vec<u64> {
        d[k].as_array()
            .unwrap_or_else(|| panic!("{k}: {d}"))
            .iter()
            .map(u)
            .collect()
    };
    assert_eq!(per_call("weight_read_back_bytes"), [0; 5], "{d}");
    assert_eq!(per_call("read_back_bytes"), [64 * 4; 5], "{d}");
    assert!(per_call("kernel_launches").iter().all(|&k| k > 0), "{d}");
    // The unused scale is dropped by name, never staged.
    assert_eq!(
        r["family"]["census"]["dropped"][0]["name"],
        "blk.0.ffn_up.scale"
    );
    assert!(r["family"]["mmproj"].is_null());
}

#[test]
fn the_good_projector_loads_through_the_seam_with_its_own_counts() {
    let r = json(&[
        &data("s7-d05-softcap.gguf"),
        "--device",
        "fake",
        "--json",
        "--steps",
        "2",
        "--mmproj",
        &data("mmproj-none.gguf"),
    ]);
    let mm = &r["family"]["mmproj"];
    let claimed = u(&mm["census"]["claimed_tensors"]);
    assert_eq!(claimed, 74);
    assert_eq!(u(&mm["routes"]["dense"]["staged"]), claimed);
    assert_eq!(u(&mm["staged_at_load"]), claimed);
    assert_eq!(
        (u(&mm["seam"]["uploads"]), u(&mm["seam"]["releases"])),
        (claimed, claimed)
    );
    assert_eq!((u(&mm["tokens"]), u(&mm["token_width"])), (16, 256));
    // Encoded where the weights are: on the fake device's op layer,
    // nothing of a weight read back.
    assert_eq!(mm["encoded_on"], "fake");
    assert_eq!(u(&mm["weight_read_back_bytes"]), 0);
    let text = &r["family"]["text_seam"];
    assert_eq!(u(&text["uploads"]), u(&r["family"]["weights"]["claimed"]));
    assert_eq!(u(&r["seam"]["uploads"]), u(&text["uploads"]) + claimed);
    assert_eq!(u(&r["seam"]["releases"]), u(&r["seam"]["uploads"]));
}

#[test]
fn the_projector_encodes_on_the_host_where_the_text_model_decodes_there() {
    let r = json(&[
        &data("s7-d05-softcap.gguf"),
        "--device",
        "host",
        "--json",
        "--steps",
        "1",
        "--mmproj",
        &data("mmproj-none.gguf"),
    ]);
    let mm = &r["family"]["mmproj"];
    assert_eq!(mm["encoded_on"], "host");
    assert_eq!((u(&mm["tokens"]), u(&mm["token_width"])), (16, 256));
}

#[test]
fn broken_projectors_are_refused_by_name_in_one_line() {
    let text = data("s7-d05-softcap.gguf");
    for (file, says) in [
        (
            "mmproj-patch-missing.gguf",
            &["tensor \"v.patch_embd.weight\"", "absent"][..],
        ),
        (
            "mmproj-patch-shape.gguf",
            &[
                "tensor \"v.patch_embd.weight\"",
                "16 of its 32 output channels are missing",
            ][..],
        ),
        (
            "mmproj-patch-short.gguf",
            &[
                "tensor \"v.patch_embd.weight\" is incomplete",
                "3072 bytes missing",
            ][..],
        ),
        (
            "mmproj-other-model.gguf",
            &[
                "clip.projector_type",
                "\"gemma3\": a projector for another model",
            ][..],
        ),
    ] {
        let out = run(&[&text, "--device", "fake", "--mmproj", &data(file)]);
        one_line(&out, says);
    }
    // The built-in fixture (E 64) with a projector for E 256.
    one_line(
        &run(&["--device", "fake", "--mmproj", &data("mmproj-none.gguf")]),
        &["mm.2.weight", "embedding_length"],
    );
}

#[test]
fn write_fixture_then_load_it_and_dump_logits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let out = run(&["--write-fixture", path.to_str().unwrap()]);
    assert!(out.status.success());
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes, muse_glimmer::fixture::fixture().to_bytes());
    assert!(bytes.len() < 2 << 20, "{} bytes", bytes.len());
    let dump = dir.path().join("logits.f32");
    let r = json(&[
        path.to_str().unwrap(),
        "--device",
        "host",
        "--json",
        "--tokens",
        "5,6",
        "--steps",
        "1",
        "--dump-logits",
        dump.to_str().unwrap(),
    ]);
    assert_eq!(u(&r["seam"]["uploads"]), 0);
    let logits: Vec<f32> = std::fs::read(&dump)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(logits.len(), 64);
    assert_eq!(
        muse_glimmer::forward::argmax(&logits),
        u(&r["generated"][0]) as u32
    );
}

#[test]
fn bad_flags_exit_2_with_one_line() {
    one_line(
        &run(&["--tokens", "1,x,3"]),
        &["expected comma-separated token ids"],
    );
    one_line(
        &run(&["--tokens", ""]),
        &["expected comma-separated token ids"],
    );
    one_line(
        &run(&["--device", "host", "--tokens", "1,99999"]),
        &["token 99999 is not below the vocabulary size 64"],
    );
    one_line(&run(&["--device", "warp"]), &["warp"]);
}

#[test]
fn the_binary_loads_through_a_session_with_the_knobs_and_the_ring() {
    let r = family_kit::conformance::the_binary_loads_through_a_session(
        env!("CARGO_BIN_EXE_muse_glimmer"),
        &[
            &data("s7-d05-softcap.gguf"),
            "--device",
            "fake",
            "--json",
            "--steps",
            "1",
            "--mmproj",
            &data("mmproj-none.gguf"),
        ],
    );
    // Both files' weights went through the session's ring.
    assert!(u(&r["seam"]["uploads"]) > u(&r["family"]["text_seam"]["uploads"]));
}

/// `--write-generated`'s model at the public checkpoint's 52 layers (as a
/// sparse file: header written, data as holes) passes the manifest check:
/// about 30B parameters, every fourth layer full, the 2048-token window.
#[test]
fn the_generated_model_at_52_layers_is_a_30b_model_that_passes_the_manifest() {
    use muse_glimmer::fixture::{Shape, quantized};
    use seam::borrow::MapOptions;
    use seam::gguf::GgufModel;
    let spec = quantized(&Shape::checkpoint(52));
    let params: u64 = spec
        .tensors
        .iter()
        .map(|t| t.dims.iter().product::<u64>())
        .sum();
    assert!((28e9..32e9).contains(&(params as f64)), "{params}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("generated.gguf");
    // The streaming writer's fills are never called by a sparse write.
    spec.streaming_writer()
        .unwrap()
        .write_sparse(&path)
        .unwrap();
    let gguf = GgufModel::open(&path, MapOptions { prefault: false }).unwrap();
    let model = muse_glimmer::MuseGlimmer::load(&gguf).expect("the manifest check passes");
    let hp = model.hparams();
    assert_eq!((hp.n_layer, hp.n_embd, hp.n_swa), (52, 5120, 2048));
    let full: Vec<usize> = (0..52).filter(|&l| !hp.is_swa[l]).collect();
    assert_eq!(full, (0..13).map(|i| 4 * i + 3).collect::<Vec<_>>());
}
