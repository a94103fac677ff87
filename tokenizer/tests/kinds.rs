//! The kinds the llama.cpp sdist has no test vocabulary for, on two small
//! vocabularies the oracle wrote (`tools/oracle/tokenizer_goldens.py`,
//! committed in `tests/data/tokenizer/`): Unigram (`t5`: Viterbi over
//! scored pieces, a user-defined token, unknowns in a row as one, the space
//! prefix, extra spaces removed, EOS added) and RWKV (escaped byte tokens,
//! the longest match). Ids and decodings equal llama.cpp's
//! (`kinds.json`).

use std::path::{Path, PathBuf};

use seam::borrow::MapOptions;
use seam::gguf::GgufModel;
use seam_tokenizer::{Kind, Tokenizer};

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/tokenizer")
}

#[track_caller]
fn check(file: &str, kind: Kind) {
    let text = std::fs::read_to_string(data().join("kinds.json")).expect("the golden");
    let golden: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let model = GgufModel::open(&data().join(file), MapOptions::default()).expect("opens");
    let tok = Tokenizer::from_gguf(&model).expect("the vocabulary");
    assert_eq!(tok.kind(), kind);
    let texts = golden["texts"].as_array().expect("texts");
    for add in [false, true] {
        let ids = golden[file][format!("ids-{add}")].as_array().expect("ids");
        let decoded = golden[file][format!("decode-{add}")]
            .as_array()
            .expect("decodings");
        for ((text, want), want_text) in texts.iter().zip(ids).zip(decoded) {
            let text = text.as_str().expect("a text");
            let want: Vec<u32> = want
                .as_array()
                .expect("ids")
                .iter()
                .map(|i| i.as_u64().expect("an id") as u32)
                .collect();
            let got = tok.encode(text, add, false).expect("encodes");
            assert_eq!(got, want, "{file}, add_special {add}: {text:?}");
            let back = tok.decode(&got, false, true).expect("decodes");
            assert_eq!(
                String::from_utf8_lossy(&back),
                want_text.as_str().expect("text"),
                "{file}: {text:?}"
            );
        }
    }
}

#[test]
fn unigram_gives_llama_cpps_ids() {
    check("ugm-small.gguf", Kind::Ugm);
}

#[test]
fn rwkv_gives_llama_cpps_ids() {
    check("rwkv-small.gguf", Kind::Rwkv);
}
