//! The `dflash` binary's outputs: `--dump-logits` and `--write-fixture`
//! naming one of its input models are refused before any work, and the
//! model is untouched.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_dflash");

#[test]
fn outputs_over_an_input_model_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let draft = dir.path().join("d.gguf");
    let out = Command::new(BIN)
        .arg("--write-fixture")
        .arg(&draft)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before = std::fs::read(&draft).unwrap();
    let d = draft.to_str().unwrap();
    for args in [vec![d, "--dump-logits", d], vec![d, "--write-fixture", d]] {
        let out = Command::new(BIN).args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.matches('\n').count(), 1, "{stderr}");
        assert!(stderr.starts_with("dflash: error: --"), "{stderr}");
        assert!(
            stderr.contains(&format!("{d}: is the input {d}")),
            "{stderr}"
        );
    }
    assert_eq!(std::fs::read(&draft).unwrap(), before);
}
