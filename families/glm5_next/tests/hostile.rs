//! Hostile conditions through the `glm5_next` binary: the model truncated
//! after it was accepted and before the forward pass reads it (host: the
//! mapped read faults; fake: staging reads a short file), outputs over the
//! model or into a missing folder, a bad file; always one stderr line and
//! exit 2, never a panic or a signal. And a weight the seam fails to hand
//! out mid-forward ends decoding with its error. The child is held at its
//! policy line (printed once the model is accepted) while the file is cut;
//! see `tests/support/held.rs`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

// The harness also has what only the `seam` tests use.
#[allow(dead_code)]
#[path = "../../../tests/support/held.rs"]
mod held;

use held::{assert_exit_2, spawn_held};

const BIN: &str = env!("CARGO_BIN_EXE_glm5_next");

fn fixture(dir: &Path) -> PathBuf {
    let path = dir.join("g.gguf");
    glm5_next::fixture::write_fixture(&path).unwrap();
    path
}

fn run(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

#[track_caller]
fn one_line(out: &Output, prefix: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{:?}: {stderr}", out.status);
    assert_eq!(stderr.matches('\n').count(), 1, "not one line:\n{stderr}");
    assert!(
        stderr.starts_with(prefix),
        "expected {prefix:?}..., got {stderr}"
    );
}

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
            &format!("glm5_next: error: {p}"),
            &["the file changed while it was being read"],
        );
        assert!(out.stdout.is_empty(), "{device}: {}", out.stdout);
    }
}

#[test]
fn outputs_over_the_model_or_into_missing_folders_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = fixture(dir.path());
    let p = path.to_str().unwrap();
    let before = std::fs::read(&path).unwrap();
    let dump = |out: &str| run(&[p, "--device", "host", "--steps", "1", "--dump-logits", out]);
    one_line(
        &dump(p),
        &format!("glm5_next: error: --dump-logits {p}: is the input {p}"),
    );
    one_line(
        &run(&[p, "--write-fixture", p]),
        &format!("glm5_next: error: --write-fixture {p}: is the input {p}"),
    );
    assert_eq!(std::fs::read(&path).unwrap(), before);
    let missing = dir.path().join("none/l.bin");
    let m = missing.to_str().unwrap();
    one_line(
        &dump(m),
        &format!("glm5_next: error: --dump-logits {m}: folder "),
    );
}

#[test]
fn a_bad_file_is_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.gguf");
    std::fs::write(&bad, b"GGUF").unwrap();
    let b = bad.to_str().unwrap();
    one_line(
        &run(&[b, "--device", "host"]),
        &format!("glm5_next: error: {b}: byte 4: "),
    );
    let mut w = seam::gguf::GgufWriter::new();
    w.add_metadata(
        "general.architecture",
        seam::gguf::Value::String("gemma3".into()),
    );
    let other = dir.path().join("gemma.gguf");
    w.write_file(&other).unwrap();
    let o = run(&[other.to_str().unwrap(), "--device", "host"]);
    one_line(&o, "glm5_next: error: ");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("general.architecture is \"gemma3\", not \"glm5-next\""),
        "{err}"
    );
}

#[test]
fn a_weight_failing_mid_forward_is_an_error_not_a_panic() {
    use family_kit::WeightReader;
    use glm5_next::Glm5Next;
    use glm5_next::forward::greedy;
    use platform_fake::{FakeConfig, FakePlatform};
    use seam::platform::Platform;

    let dir = tempfile::tempdir().unwrap();
    let path = fixture(dir.path());
    let gguf = seam::gguf::GgufModel::open(&path, Default::default()).unwrap();
    // 0: token_embd; 60: a layer's weight; 120: past the dense ones, an expert.
    for fail_copy in [0, 1, 60, 120] {
        // A model's weights keep their device memo: a fresh one per device.
        let model = Glm5Next::load(&gguf).unwrap();
        let fake = FakePlatform::new(FakeConfig {
            fail_copy: Some(fail_copy),
            ..FakeConfig::default()
        });
        let queue = fake.backend().create_queue().unwrap();
        let reader = WeightReader::new(&fake, &*queue);
        let err = greedy(
            &model,
            reader,
            family_kit::Numerics::default(),
            &[1, 2],
            2,
            &mut || {},
        )
        .expect_err("a failed copy must fail the decode")
        .to_string();
        assert!(
            err.contains(&format!("injected failure of copy {fail_copy}")),
            "{err}"
        );
    }
}
