//! Hostile conditions through the `qwen4_exp` binary: the model truncated
//! before the forward pass reads it (host: the mapped read faults; fake:
//! staging reads a short file), outputs over the model or into a missing
//! folder, and a bad file: always one stderr line and exit 2, never a
//! panic or a signal. The child is held at its policy line (printed once
//! the model is accepted) while the file is cut; see `support/held.rs`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

// The harness also has what only the `seam` tests use.
#[allow(dead_code)]
#[path = "../../../tests/support/held.rs"]
mod held;

use held::{assert_exit_2, spawn_held};

const BIN: &str = env!("CARGO_BIN_EXE_qwen4_exp");

fn fixture(dir: &Path) -> PathBuf {
    let path = dir.join("q.gguf");
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

/// The forward pass over a model truncated after it was accepted: one
/// line naming the file, exit 2, on the host (a faulting mapped read) and
/// on the fake device (staging).
#[test]
fn forward_after_truncation_is_one_line_not_a_panic_or_signal() {
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
            &format!("qwen4_exp: error: {p}"),
            &["the file changed while it was being read"],
        );
        assert!(out.stdout.is_empty(), "{device}: {}", out.stdout);
    }
}

/// `--dump-logits` and `--write-fixture` naming the model are refused, and
/// the model is untouched; a missing folder is named before the load.
#[test]
fn outputs_over_the_model_or_into_missing_folders_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = fixture(dir.path());
    let p = path.to_str().unwrap();
    let before = std::fs::read(&path).unwrap();
    let dump_logits_to = |out: &str| {
        run(&[
            p,
            "--device",
            "host",
            "--tokens",
            "1",
            "--steps",
            "1",
            "--dump-logits",
            out,
        ])
    };
    let o = dump_logits_to(p);
    one_line(
        &o,
        &format!("qwen4_exp: error: --dump-logits {p}: is the input {p}"),
        &[],
    );
    let o = run(&[p, "--write-fixture", p]);
    one_line(
        &o,
        &format!("qwen4_exp: error: --write-fixture {p}: is the input {p}"),
        &[],
    );
    assert_eq!(std::fs::read(&path).unwrap(), before);
    let missing = dir.path().join("none/l.bin");
    let m = missing.to_str().unwrap();
    one_line(
        &dump_logits_to(m),
        &format!("qwen4_exp: error: --dump-logits {m}: folder "),
        &[],
    );
}

/// A bad file: one line, its error (the policy line comes only with an
/// accepted file); an architecture is named as text, not `Some(..)`.
#[test]
fn a_bad_file_is_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.gguf");
    std::fs::write(&bad, b"GGUF").unwrap();
    let b = bad.to_str().unwrap();
    one_line(
        &run(&[b, "--device", "host"]),
        &format!("qwen4_exp: error: {b}: byte 4: "),
        &[],
    );

    let mut w = seam::gguf::GgufWriter::new();
    w.add_metadata(
        "general.architecture",
        seam::gguf::Value::String("gemma3".into()),
    );
    let other = dir.path().join("gemma.gguf");
    w.write_file(&other).unwrap();
    let o = run(&[other.to_str().unwrap(), "--device", "host"]);
    one_line(
        &o,
        "qwen4_exp: error: ",
        &["general.architecture is \"gemma3\", not \"qwen4exp\""],
    );
}

/// A weight the seam fails to hand out in the middle of a forward pass (a
/// device error here; a short read of a truncated file on the sink's ring
/// is the same to the forward pass) ends greedy decoding with that error,
/// not a panic of the forward pass, whichever copy fails.
#[test]
fn a_weight_failing_mid_forward_is_an_error_not_a_panic() {
    use platform_fake::{FakeConfig, FakePlatform};
    use qwen4_exp::engine::{SeamWeights, greedy};
    use seam::platform::Platform;

    let dir = tempfile::tempdir().unwrap();
    let path = fixture(dir.path());
    let gguf = seam::gguf::GgufModel::open(&path, Default::default()).unwrap();
    for fail_copy in [0, 1, 7, 20] {
        // A model's weights keep their device memo: a fresh one per device.
        let model = qwen4_exp::Qwen4Exp::load(&gguf).unwrap();
        let fake = FakePlatform::new(FakeConfig {
            fail_copy: Some(fail_copy),
            ..FakeConfig::default()
        });
        let queue = fake.backend().create_queue().unwrap();
        let result = greedy(
            SeamWeights::new(&model, &gguf, &fake, &*queue),
            family_kit::Numerics::default(),
            &[1, 2],
            2,
        );
        let err = result
            .expect_err("a failed copy must fail the decode")
            .to_string();
        assert!(
            err.contains(&format!("injected failure of copy {fail_copy}")),
            "{err}"
        );
    }
}
