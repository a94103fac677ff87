//! Hostile conditions through the `muse_glimmer` binary and the library:
//! the model truncated after it was accepted (held at its policy line while
//! the file is cut), outputs over an input, a bad file, and a weight the
//! seam fails to hand out mid-decode: one stderr line and exit 2 (or an
//! error), never a panic or a signal.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

// The harness also has what only the `seam` tests use.
#[allow(dead_code)]
#[path = "../../../tests/support/held.rs"]
mod held;

use held::{assert_exit_2, spawn_held};

const BIN: &str = env!("CARGO_BIN_EXE_muse_glimmer");

fn fixture(dir: &Path) -> PathBuf {
    let path = dir.join("m.gguf");
    let out = Command::new(BIN)
        .arg("--write-fixture")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    path
}

fn run(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

#[track_caller]
fn one_line(out: &Output, prefix: &str, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{:?}: {stderr}", out.status);
    assert_eq!(stderr.matches('\n').count(), 1, "not one line:\n{stderr}");
    assert!(
        stderr.starts_with(prefix),
        "expected {prefix:?}..., got {stderr}"
    );
    for n in needles {
        assert!(stderr.contains(n), "expected {n:?} in {stderr}");
    }
}

#[test]
fn decode_after_truncation_is_one_line_not_a_panic_or_signal() {
    let dir = tempfile::tempdir().unwrap();
    for device in ["host", "fake"] {
        let path = fixture(dir.path());
        let p = path.to_str().unwrap();
        let held = spawn_held(
            Command::new(BIN).args([p, "--device", device, "--tokens", "1,2", "--steps", "1"]),
        );
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(0)
            .unwrap();
        let out = held.release();
        assert_exit_2(
            &out,
            "muse_glimmer: error: ",
            &["the file changed while it was being read"],
        );
        assert!(out.stdout.is_empty(), "{device}: {}", out.stdout);
    }
}

#[test]
fn outputs_over_an_input_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = fixture(dir.path());
    let p = path.to_str().unwrap();
    let before = std::fs::read(&path).unwrap();
    one_line(
        &run(&[p, "--device", "host", "--dump-logits", p]),
        &format!("muse_glimmer: error: --dump-logits {p}: is the input {p}"),
        &[],
    );
    one_line(
        &run(&[p, "--write-fixture", p]),
        &format!("muse_glimmer: error: --write-fixture {p}: is the input {p}"),
        &[],
    );
    let mm = dir.path().join("mm.gguf");
    std::fs::write(&mm, b"x").unwrap();
    let m = mm.to_str().unwrap();
    one_line(
        &run(&[p, "--mmproj", m, "--dump-logits", m]),
        &format!("muse_glimmer: error: --dump-logits {m}: is the input {m}"),
        &[],
    );
    assert_eq!(std::fs::read(&path).unwrap(), before);
}

#[test]
fn a_bad_file_or_projector_is_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.gguf");
    std::fs::write(&bad, b"GGUF").unwrap();
    let b = bad.to_str().unwrap();
    one_line(
        &run(&[b, "--device", "host"]),
        &format!("muse_glimmer: error: {b}: byte 4: "),
        &[],
    );
    one_line(
        &run(&["--device", "host", "--mmproj", b]),
        &format!("muse_glimmer: error: {b}: byte 4: "),
        &[],
    );
    let good = fixture(dir.path());
    // The text model given as a projector: named by its architecture.
    one_line(
        &run(&["--device", "host", "--mmproj", good.to_str().unwrap()]),
        "muse_glimmer: error: ",
        &["general.architecture is \"muse-glimmer\", not \"clip\""],
    );
}

/// Keys with values the forward pass cannot use are refused by name at load.
#[test]
fn inconsistent_keys_are_refused_by_name() {
    use muse_glimmer::MuseGlimmer;
    use seam::gguf::{GgufModel, Value};
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, Value, &str); 5] = [
        (
            "muse-glimmer.attention.head_count_kv",
            Value::U32(3),
            "does not divide",
        ),
        (
            "muse-glimmer.attention.key_length_swa",
            Value::U32(16),
            "one head size for every layer",
        ),
        (
            "muse-glimmer.feed_forward_length",
            Value::U32(0),
            "must be > 0",
        ),
        (
            "muse-glimmer.rope.dimension_count",
            Value::U32(33),
            "must be even",
        ),
        (
            "muse-glimmer.attention.sliding_window_pattern",
            Value::Array(seam::gguf::Array::Bool(vec![true])),
            "per-layer array of 1",
        ),
    ];
    for (key, value, says) in cases {
        let mut spec = muse_glimmer::fixture::tiny();
        spec.set_key(key, value);
        let path = dir.path().join("k.gguf");
        spec.write_file(&path).unwrap();
        let gguf = GgufModel::open(&path, Default::default()).unwrap();
        let e = MuseGlimmer::load(&gguf).unwrap_err().to_string();
        assert!(e.contains(key) && e.contains(says), "{key}: {e}");
    }
}

#[test]
fn a_weight_failing_mid_decode_is_an_error_not_a_panic() {
    use muse_glimmer::MuseGlimmer;
    use muse_glimmer::forward::{Decoder, greedy};
    use platform_fake::{FakeConfig, FakePlatform};
    use seam::platform::Platform;

    let dir = tempfile::tempdir().unwrap();
    let path = fixture(dir.path());
    let gguf = seam::gguf::GgufModel::open(&path, Default::default()).unwrap();
    for fail_copy in [0, 1, 7, 40] {
        let model = MuseGlimmer::load(&gguf).unwrap();
        let fake = FakePlatform::new(FakeConfig {
            fail_copy: Some(fail_copy),
            ..FakeConfig::default()
        });
        let queue = fake.backend().create_queue().unwrap();
        let mut decoder =
            Decoder::new(&model, &fake, &*queue, family_kit::Numerics::default()).unwrap();
        let err = greedy(&mut decoder, &[1, 2], 2, &mut || {})
            .expect_err("a failed copy must fail the decode")
            .to_string();
        assert!(
            err.contains(&format!("injected failure of copy {fail_copy}")),
            "{err}"
        );
    }
}

/// A file that does not match the manifest, through the binary: one line
/// naming the tensor or key.
#[test]
fn a_file_off_the_manifest_is_one_line_naming_the_tensor_or_key() {
    use seam::gguf::GgmlType;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("off.gguf");
    let p = path.to_str().unwrap().to_owned();
    type Edit<'a> = &'a dyn Fn(&mut family_kit::FixtureSpec);
    let cases: [(Edit<'_>, &str); 5] = [
        (
            &|s| assert!(s.remove_tensor("blk.2.ffn_up.weight")),
            "\"blk.2.ffn_up.weight\" is required",
        ),
        (
            &|s| s.add_tensor("blk.1.extra.weight", GgmlType::F32, &[64]),
            "\"blk.1.extra.weight\" is in the file but neither claimed",
        ),
        (
            &|s| s.tensor_mut("blk.3.attn_gate.weight").unwrap().dims[1] = 32,
            "\"blk.3.attn_gate.weight\" has dims [64, 32]",
        ),
        (
            &|s| s.tensor_mut("blk.0.ffn_norm.weight").unwrap().ggml_type = GgmlType::F16,
            "\"blk.0.ffn_norm.weight\" is F16, expected F32",
        ),
        (
            &|s| assert!(s.remove_key("muse-glimmer.attention.sliding_window")),
            "\"muse-glimmer.attention.sliding_window\" is required",
        ),
    ];
    for (edit, says) in cases {
        let mut spec = muse_glimmer::fixture::tiny();
        edit(&mut spec);
        spec.write_file(&path).unwrap();
        one_line(
            &run(&[&p, "--device", "fake"]),
            &format!("muse_glimmer: error: {p}: "),
            &[says],
        );
    }
}
