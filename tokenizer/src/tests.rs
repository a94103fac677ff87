//! Tests of the tokenizer on vocabularies built in code: what a hostile or
//! broken file gets (a typed error naming the file and the key), the
//! algorithms' rules on toy vocabularies, special tokens, decoding and the
//! text stream. Equality with llama.cpp itself is `tests/llama_vocabs.rs`'s
//! and `tests/kinds.rs`'s.

use std::collections::HashMap;
use std::path::Path;

use seam::gguf::{Array, Value};

use super::*;

fn strings(v: &[&str]) -> Value {
    Value::Array(Array::String(v.iter().map(|s| (*s).to_owned()).collect()))
}

/// A vocabulary's keys, editable.
struct Keys(HashMap<String, Value>);

impl Keys {
    fn spm(tokens: &[(&str, f32, i32)]) -> Keys {
        let mut k = Keys(HashMap::new());
        k.set("tokenizer.ggml.model", Value::String("llama".into()));
        k.set(
            "tokenizer.ggml.tokens",
            strings(&tokens.iter().map(|t| t.0).collect::<Vec<_>>()),
        );
        k.set(
            "tokenizer.ggml.scores",
            Value::Array(Array::F32(tokens.iter().map(|t| t.1).collect())),
        );
        k.set(
            "tokenizer.ggml.token_type",
            Value::Array(Array::I32(tokens.iter().map(|t| t.2).collect())),
        );
        k
    }

    fn bpe(tokens: &[&str], merges: &[&str], pre: &str) -> Keys {
        let mut k = Keys(HashMap::new());
        k.set("tokenizer.ggml.model", Value::String("gpt2".into()));
        k.set("tokenizer.ggml.pre", Value::String(pre.into()));
        k.set("tokenizer.ggml.tokens", strings(tokens));
        k.set("tokenizer.ggml.merges", strings(merges));
        k
    }

    fn set(&mut self, key: &str, v: Value) -> &mut Keys {
        self.0.insert(key.to_owned(), v);
        self
    }

    fn remove(&mut self, key: &str) -> &mut Keys {
        self.0.remove(key);
        self
    }

    fn tokenizer(&self) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_metadata(&|k| self.0.get(k), Path::new("model.gguf"))
    }
}

/// Token types.
const N: i32 = 1;
const UNK: i32 = 2;
const CTRL: i32 = 3;
const USER: i32 = 4;
const BYTE: i32 = 6;

/// A small SentencePiece vocabulary: `<unk>`, `<s>`, `</s>`, byte tokens
/// for `a`..`e` and newline, pieces with scores.
fn spm() -> Keys {
    Keys::spm(&[
        ("<unk>", 0.0, UNK),
        ("<s>", 0.0, CTRL),
        ("</s>", 0.0, CTRL),
        ("<0x0A>", 0.0, BYTE),
        ("<0xC3>", 0.0, BYTE),
        ("<0xA9>", 0.0, BYTE),
        ("▁", -1.0, N),
        ("a", -2.0, N),
        ("b", -2.0, N),
        ("c", -2.0, N),
        ("ab", -3.0, N),
        ("bc", -1.5, N),
        ("▁a", -2.5, N),
        ("▁abc", -4.0, N),
        ("<tool>", 0.0, USER),
        ("<|end|>", 0.0, CTRL),
    ])
}

#[track_caller]
fn refused(keys: &Keys, says: &str) {
    match keys.tokenizer() {
        Ok(_) => panic!("accepted; expected an error saying {says:?}"),
        Err(e) => {
            let e = e.to_string();
            assert!(e.starts_with("model.gguf: "), "names the file: {e}");
            assert!(e.contains(says), "{e:?} does not say {says:?}");
        }
    }
}

#[test]
fn a_file_without_a_usable_tokenizer_is_refused_by_name() {
    refused(spm().remove("tokenizer.ggml.model"), "has no tokenizer");
    refused(
        spm().set("tokenizer.ggml.model", Value::String("test".into())),
        "placeholder vocabulary",
    );
    refused(
        spm().set("tokenizer.ggml.model", Value::String("none".into())),
        "no vocabulary",
    );
    refused(
        spm().set("tokenizer.ggml.model", Value::String("wordsoup".into())),
        "unknown tokenizer \"wordsoup\"",
    );
    refused(
        spm().set("tokenizer.ggml.model", Value::String("plamo2".into())),
        "\"plamo2\" tokenizer is not supported",
    );
    refused(
        spm().set("tokenizer.ggml.model", Value::U32(3)),
        "tokenizer.ggml.model: expected a string, found a UINT32",
    );
    refused(
        &Keys::bpe(&["a", "b"], &["a b"], "gpt-9"),
        "tokenizer.ggml.pre: unknown pre-tokenizer \"gpt-9\"",
    );
}

#[test]
fn mistyped_or_short_keys_are_errors_naming_the_key() {
    refused(
        spm().remove("tokenizer.ggml.tokens"),
        "tokenizer.ggml.tokens: missing",
    );
    refused(
        spm().set("tokenizer.ggml.tokens", Value::Array(Array::I32(vec![1]))),
        "tokenizer.ggml.tokens: expected an array of STRING, found an array of INT32",
    );
    refused(
        spm().set(
            "tokenizer.ggml.scores",
            Value::Array(Array::F32(vec![0.0; 3])),
        ),
        "tokenizer.ggml.scores: 3 scores for 16 tokens",
    );
    refused(
        spm().set(
            "tokenizer.ggml.token_type",
            Value::Array(Array::I32(vec![1; 15])),
        ),
        "tokenizer.ggml.token_type: 15 token types for 16 tokens",
    );
    refused(
        spm().set("tokenizer.ggml.bos_token_id", Value::I32(1)),
        "tokenizer.ggml.bos_token_id: expected a UINT32, found an INT32",
    );
    refused(
        spm().set("tokenizer.ggml.add_bos_token", Value::U8(1)),
        "tokenizer.ggml.add_bos_token: expected a bool",
    );
    refused(
        Keys::bpe(&["a", "b"], &[], "gpt-2").remove("tokenizer.ggml.merges"),
        "tokenizer.ggml.merges: missing",
    );
    // A byte token too short for its `<0xXX>` text.
    let mut k = spm();
    let mut tokens = match k.0.get("tokenizer.ggml.tokens") {
        Some(Value::Array(Array::String(t))) => t.clone(),
        _ => unreachable!(),
    };
    tokens[3] = "<0".into();
    refused(
        k.set("tokenizer.ggml.tokens", Value::Array(Array::String(tokens))),
        "byte token 3",
    );
    // A UGM charsmap whose double array claims more than it has.
    let mut ugm = spm();
    ugm.set("tokenizer.ggml.model", Value::String("t5".into()));
    let mut map = 1000u32.to_le_bytes().to_vec();
    map.extend([0; 8]);
    ugm.set(
        "tokenizer.ggml.precompiled_charsmap",
        Value::Array(Array::U8(map)),
    );
    refused(
        &ugm,
        "tokenizer.ggml.precompiled_charsmap: its double array claims 1000 bytes",
    );
}

#[test]
fn an_out_of_range_special_id_keeps_the_default_and_ids_outside_decode_as_errors() {
    let tok = spm()
        .set("tokenizer.ggml.bos_token_id", Value::U32(99))
        .tokenizer()
        .unwrap();
    assert_eq!(tok.bos(), Some(1));
    assert!(matches!(
        tok.decode(&[7, 16], false, false),
        Err(TokenizerError::TokenOutOfRange {
            id: 16,
            n_tokens: 16
        })
    ));
}

#[test]
fn spm_merges_the_best_scored_pair_first_and_falls_back_to_bytes() {
    let tok = spm().tokenizer().unwrap();
    assert_eq!(tok.kind(), Kind::Spm);
    // "▁abc": "bc" (-1.5) merges first, then "▁a" (-2.5), then the two
    // into "▁abc" ("ab" lost its "b").
    assert_eq!(tok.encode("abc", false, false).unwrap(), [13]);
    // "▁cab": only "ab" is a token.
    assert_eq!(tok.encode("cab", false, false).unwrap(), [6, 9, 10]);
    // BOS added as the vocabulary says; é is two byte tokens; \n is a byte.
    assert_eq!(tok.encode("a\né", true, false).unwrap(), [1, 12, 3, 4, 5]);
    // A byte with no token: refused, not a panic.
    let e = tok.encode("d", false, false).unwrap_err().to_string();
    assert!(e.contains("no token for byte 0x64"), "{e}");
    assert_eq!(
        tok.decode(&[13], false, false).unwrap(),
        b"abc",
        "the prefix space goes"
    );
    // Only from the first token: here the BOS, which decodes to nothing.
    assert_eq!(
        tok.decode(&[1, 12, 3, 4, 5], false, false).unwrap(),
        " a\né".as_bytes()
    );
    assert_eq!(
        tok.decode(&[1, 12, 3, 4, 5], true, false).unwrap(),
        " a\né".as_bytes()
    );
    assert_eq!(tok.decode(&[1, 12], false, true).unwrap(), b"<s> a");
}

#[test]
fn special_tokens_split_the_text_as_llama_cpp_does() {
    let tok = spm().tokenizer().unwrap();
    // User-defined tokens always; control ones only with parse_special.
    // Text after a special token gets the space prefix again.
    assert_eq!(tok.encode("a<tool>a", false, false).unwrap(), [12, 14, 12]);
    assert!(!matches!(tok.encode("a<|end|>", false, false), Ok(ids) if ids.contains(&15)));
    assert_eq!(tok.encode("a<|end|>", false, true).unwrap(), [12, 15]);
    assert!(tok.is_eog(15) && tok.is_eog(2) && !tok.is_eog(1));
    // lstrip/rstrip: phi-3's names make special tokens eat the spaces
    // around them.
    let tok = spm()
        .set("general.name", Value::String("Phi-3 mini".into()))
        .tokenizer()
        .unwrap();
    // phi-3's names give special tokens rstrip: the space after <tool>
    // goes, the one before stays.
    assert_eq!(
        tok.encode("a <tool> a", false, false).unwrap(),
        [12, 6, 14, 12]
    );
}

#[test]
fn bpe_merges_by_rank_and_ignores_them_where_the_word_is_a_token() {
    // Byte-level: "Ġ" is the space.
    let tokens = [
        "h", "e", "l", "o", "Ġ", "he", "ll", "hell", "hello", "Ġh", "ello",
    ];
    let merges = ["h e", "l l", "he ll", "hell o", "Ġ h"];
    let tok = Keys::bpe(&tokens, &merges, "gpt-2").tokenizer().unwrap();
    assert_eq!(tok.kind(), Kind::Bpe);
    assert_eq!(tok.pre(), Some(Pre::Gpt2));
    assert_eq!(tok.encode("hello", false, false).unwrap(), [8]);
    // "Ġhell": "h e" (rank 0) takes the h before "Ġ h" (rank 4) can.
    assert_eq!(tok.encode(" hell", false, false).unwrap(), [4, 7]);
    assert_eq!(tok.decode(&[4, 7], false, false).unwrap(), b" hell");
    // Llama 3's pre-tokenizer ignores the merges of a word that is a token.
    let tok = Keys::bpe(&tokens, &["h e", "l l"], "llama3")
        .tokenizer()
        .unwrap();
    assert_eq!(tok.encode("ello", false, false).unwrap(), [10]);
    let tok = Keys::bpe(&tokens, &["h e", "l l"], "gpt-2")
        .tokenizer()
        .unwrap();
    assert_eq!(tok.encode("ello", false, false).unwrap(), [1, 6, 3]);
}

#[test]
fn a_merge_pair_with_a_space_is_an_error_where_llama_cpp_aborts() {
    // A gpt2 file under the `whitespace` pre-tokenizer keeps raw spaces.
    let tok = Keys::bpe(&["a", "b", " "], &[], "whitespace")
        .tokenizer()
        .unwrap();
    assert_eq!(tok.encode("a b", false, false).unwrap(), [0, 2, 1]);
    let e = tok.encode("a  b", false, false).unwrap_err().to_string();
    assert!(e.contains("left a space in a word to merge"), "{e}");
}

#[test]
fn cleaning_spaces_follows_llama_cpps_three_passes() {
    let clean = |s: &str| String::from_utf8(clean_spaces(s.as_bytes())).unwrap();
    assert_eq!(clean("Hello , world ! ok ."), "Hello, world! ok.");
    assert_eq!(clean("a ' b"), "a'b");
    assert_eq!(
        clean("a ' ' b"),
        "a'' b",
        "the second quote follows a removed space"
    );
    assert_eq!(
        clean("it 's I 'm we 're you 've they 'll he 'd"),
        "it's I'm we're you've they 'll he 'd"
    );
    assert_eq!(clean(""), "");
}

#[test]
fn the_stream_holds_back_what_a_later_token_can_change() {
    // Bytes of é split over two tokens; a space a later "," removes.
    let tokens = ["Ã", "©", "a", "Ġ", ",", "Ġa"];
    let tok = Keys::bpe(&tokens, &[], "gpt-2").tokenizer().unwrap();
    let mut s = TextStream::new(&tok);
    assert_eq!(s.push(2).unwrap(), b"a");
    assert_eq!(s.push(0).unwrap(), b"", "half of é waits");
    assert_eq!(s.push(1).unwrap(), "é".as_bytes());
    assert_eq!(s.push(3).unwrap(), b"", "a trailing space waits");
    assert_eq!(s.push(4).unwrap(), b",", "and is cleaned away");
    assert_eq!(s.push(5).unwrap(), b" a");
    assert_eq!(s.push(3).unwrap(), b"");
    assert_eq!(s.finish().unwrap(), b" ");
    let all = [2, 0, 1, 3, 4, 5, 3];
    assert_eq!(tok.decode(&all, false, false).unwrap(), "aé, a ".as_bytes());
}

#[test]
fn bytes_of_c_strtol() {
    assert_eq!(strtol_hex(b"0A"), 10);
    assert_eq!(strtol_hex(b"ff"), 255);
    assert_eq!(strtol_hex(b""), 0);
    assert_eq!(strtol_hex(b"0x"), 0);
    assert_eq!(strtol_hex(b"-1"), 255);
    assert_eq!(strtol_hex(b" 7"), 7);
}
