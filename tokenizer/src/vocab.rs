//! The vocabulary read from a GGUF header, as llama.cpp's
//! `llama_vocab::impl::load` reads it: the tokens with their scores and
//! attributes, the merges, the special ids and the flags, the tokens that
//! end a generation, and the pieces each token decodes to.
//!
//! Every key is type-checked as llama.cpp checks it; nothing is sized by
//! what a header claims (the arrays are the ones the GGUF reader already
//! holds, and every array read against the token list is checked to be at
//! least as long).

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use seam::gguf::{Array, Value};

use crate::error::TokenizerError;
use crate::pretok::{Pre, PreFlags, pre_for_name};

/// llama.cpp's token attributes (`llama_token_attr`).
pub(crate) mod attr {
    pub(crate) const UNKNOWN: u32 = 1 << 0;
    pub(crate) const UNUSED: u32 = 1 << 1;
    pub(crate) const NORMAL: u32 = 1 << 2;
    pub(crate) const CONTROL: u32 = 1 << 3;
    pub(crate) const USER_DEFINED: u32 = 1 << 4;
    pub(crate) const BYTE: u32 = 1 << 5;
    pub(crate) const LSTRIP: u32 = 1 << 7;
    pub(crate) const RSTRIP: u32 = 1 << 8;
}

/// The tokenizer's algorithm (llama.cpp's `llama_vocab_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// SentencePiece BPE (`llama`).
    Spm,
    /// Byte-level BPE (`gpt2`, `gemma4`, `hybriddna`, `whitespace`).
    Bpe,
    /// WordPiece (`bert`).
    Wpm,
    /// Unigram (`t5`).
    Ugm,
    /// RWKV's greedy trie (`rwkv`).
    Rwkv,
}

/// One token.
pub(crate) struct Token {
    pub(crate) text: String,
    pub(crate) score: f32,
    pub(crate) attr: u32,
}

/// The special ids a vocabulary names (`None`: llama.cpp's
/// `LLAMA_TOKEN_NULL`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Specials {
    pub(crate) bos: Option<u32>,
    pub(crate) eos: Option<u32>,
    pub(crate) eot: Option<u32>,
    pub(crate) eom: Option<u32>,
    pub(crate) unk: Option<u32>,
    pub(crate) sep: Option<u32>,
    pub(crate) pad: Option<u32>,
    pub(crate) mask: Option<u32>,
    pub(crate) fim_pre: Option<u32>,
    pub(crate) fim_suf: Option<u32>,
    pub(crate) fim_mid: Option<u32>,
    pub(crate) fim_pad: Option<u32>,
    pub(crate) fim_rep: Option<u32>,
    pub(crate) fim_sep: Option<u32>,
}

/// The flags that shape encoding and decoding.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Options {
    pub(crate) add_space_prefix: bool,
    pub(crate) add_bos: bool,
    pub(crate) add_eos: bool,
    pub(crate) add_sep: bool,
    pub(crate) ignore_merges: bool,
    pub(crate) clean_spaces: bool,
    pub(crate) remove_extra_whitespaces: bool,
    pub(crate) escape_whitespaces: bool,
    pub(crate) lowercase: bool,
    pub(crate) strip_accents: bool,
}

/// The vocabulary.
pub(crate) struct Vocab {
    pub(crate) file: PathBuf,
    pub(crate) model: String,
    pub(crate) kind: Kind,
    /// The pre-tokenizer name as the file gives it (empty when absent).
    pub(crate) pre_name: String,
    /// BPE only.
    pub(crate) pre: Option<Pre>,
    pub(crate) tokens: Vec<Token>,
    pub(crate) token_to_id: HashMap<String, u32>,
    /// BPE merges by their text, `left right` (split at the first space
    /// after the first byte), to their rank (the first of a repeated one).
    pub(crate) merges: HashMap<String, u32>,
    pub(crate) max_token_len: usize,
    pub(crate) special: Specials,
    pub(crate) options: Options,
    pub(crate) eog: BTreeSet<u32>,
    /// Control, user-defined and unknown tokens, longest text first.
    pub(crate) special_cache: Vec<u32>,
    /// UGM's charsmap (`tokenizer.ggml.precompiled_charsmap`).
    pub(crate) charsmap: Vec<u8>,
}

/// The DNA k-mer marker suffix of `hybriddna` vocabularies (U+E000), erased
/// from the k-mers' text.
pub(crate) const DNA_KMER_MARKER: &str = "\u{E000}";

struct Meta<'a> {
    get: &'a dyn Fn(&str) -> Option<&'a Value>,
    file: &'a Path,
}

impl Meta<'_> {
    fn bad(&self, key: &str, why: impl Into<String>) -> TokenizerError {
        TokenizerError::Key {
            file: self.file.to_path_buf(),
            key: key.to_owned(),
            why: why.into(),
        }
    }

    fn wrong_type(&self, key: &str, want: &str, got: &Value) -> TokenizerError {
        self.bad(key, format!("expected {want}, found {}", type_name(got)))
    }

    fn string(&self, key: &str) -> Result<Option<&str>, TokenizerError> {
        match (self.get)(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.wrong_type(key, "a string", v)),
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>, TokenizerError> {
        match (self.get)(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.wrong_type(key, "a bool", v)),
        }
    }

    fn u32(&self, key: &str) -> Result<Option<u32>, TokenizerError> {
        match (self.get)(key) {
            None => Ok(None),
            Some(Value::U32(x)) => Ok(Some(*x)),
            Some(v) => Err(self.wrong_type(key, "a UINT32", v)),
        }
    }

    fn array(&self, key: &str) -> Result<Option<&Array>, TokenizerError> {
        match (self.get)(key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(v) => Err(self.wrong_type(key, "an array", v)),
        }
    }
}

fn type_name(v: &Value) -> String {
    match v {
        Value::Array(a) => format!("an array of {}", a.elem_type().name()),
        Value::U8(_) => "a UINT8".into(),
        Value::I8(_) => "an INT8".into(),
        Value::U16(_) => "a UINT16".into(),
        Value::I16(_) => "an INT16".into(),
        Value::U32(_) => "a UINT32".into(),
        Value::I32(_) => "an INT32".into(),
        Value::F32(_) => "a FLOAT32".into(),
        Value::Bool(_) => "a BOOL".into(),
        Value::String(_) => "a STRING".into(),
        Value::U64(_) => "a UINT64".into(),
        Value::I64(_) => "an INT64".into(),
        Value::F64(_) => "a FLOAT64".into(),
    }
}

/// The texts llama.cpp recognizes as ending a generation.
const EOG_TEXTS: [&str; 22] = [
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

const EOT_TEXTS: [&str; 11] = [
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: [&str; 1] = ["<|eom_id|>"];
const FIM_PRE_TEXTS: [&str; 8] = [
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: [&str; 8] = [
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: [&str; 8] = [
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: [&str; 5] = ["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: [&str; 5] = [
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: [&str; 1] = ["<|file_sep|>"];

impl Vocab {
    /// Reads the vocabulary from the metadata of `file` (`get` looks a key
    /// up).
    pub(crate) fn load<'a>(
        get: &'a dyn Fn(&str) -> Option<&'a Value>,
        file: &'a Path,
    ) -> Result<Vocab, TokenizerError> {
        let m = Meta { get, file };
        let file_buf = file.to_path_buf();
        let Some(model) = m.string("tokenizer.ggml.model")? else {
            return Err(TokenizerError::Absent { file: file_buf });
        };
        let model = model.to_owned();
        let mut pre_name = m.string("tokenizer.ggml.pre")?.unwrap_or("").to_owned();
        let raw_pre_name = pre_name.clone();
        let mut special = Specials::default();
        let mut options = Options {
            escape_whitespaces: true,
            lowercase: true,
            strip_accents: true,
            ..Options::default()
        };
        let mut merges_needed = false;
        let kind = match model.as_str() {
            "no_vocab" | "none" => {
                return Err(TokenizerError::NoVocabulary {
                    file: file_buf,
                    model,
                });
            }
            "test" => return Err(TokenizerError::TestVocabulary { file: file_buf }),
            "plamo2" => {
                return Err(TokenizerError::Unsupported {
                    file: file_buf,
                    model,
                });
            }
            "llama" => {
                special.bos = Some(1);
                special.eos = Some(2);
                special.unk = Some(0);
                Kind::Spm
            }
            "bert" => {
                special.bos = Some(101);
                special.unk = Some(100);
                special.sep = Some(102);
                special.pad = Some(0);
                special.mask = Some(103);
                options.add_sep = true;
                Kind::Wpm
            }
            "gpt2" | "hybriddna" | "whitespace" => {
                merges_needed = pre_name != "kimi-k2";
                special.bos = Some(11);
                special.eos = Some(11);
                Kind::Bpe
            }
            "gemma4" => {
                merges_needed = true;
                pre_name = "gemma4".into();
                Kind::Bpe
            }
            "t5" => {
                special.eos = Some(1);
                special.unk = Some(2);
                special.pad = Some(0);
                Kind::Ugm
            }
            "rwkv" => Kind::Rwkv,
            _ => {
                return Err(TokenizerError::UnknownModel {
                    file: file_buf,
                    model,
                });
            }
        };

        let mut merges: HashMap<String, u32> = HashMap::new();
        if kind == Kind::Bpe {
            match m.array("tokenizer.ggml.merges")? {
                Some(Array::String(list)) => {
                    merges.reserve(list.len());
                    for (rank, merge) in list.iter().enumerate() {
                        // A merge without a space after its first byte is
                        // llama.cpp's pair ("", ""), which no lookup asks.
                        if merge.bytes().skip(1).any(|b| b == b' ') {
                            merges.entry(merge.clone()).or_insert(rank as u32);
                        }
                    }
                }
                Some(other) => {
                    return Err(m.bad(
                        "tokenizer.ggml.merges",
                        format!(
                            "expected an array of STRING, found an array of {}",
                            other.elem_type().name()
                        ),
                    ));
                }
                None if merges_needed => {
                    return Err(m.bad(
                        "tokenizer.ggml.merges",
                        "missing (a BPE vocabulary needs its merges)",
                    ));
                }
                None => {}
            }
        }

        let mut pre = None;
        match kind {
            Kind::Bpe => {
                options.add_space_prefix = false;
                options.escape_whitespaces = false;
                options.clean_spaces = true;
                let (p, flags) = if pre_name.is_empty() {
                    (Pre::Default, PreFlags::default())
                } else {
                    pre_for_name(&pre_name).ok_or_else(|| TokenizerError::UnknownPre {
                        file: file_buf.clone(),
                        pre: pre_name.clone(),
                    })?
                };
                pre = Some(p);
                options.ignore_merges |= flags.ignore_merges;
                options.add_bos |= flags.add_bos;
                options.add_sep |= flags.add_sep;
                options.escape_whitespaces |= flags.escape_whitespaces;
                if flags.keep_spaces {
                    options.clean_spaces = false;
                }
                if flags.no_bos_token {
                    special.bos = None;
                }
                if p == Pre::Whitespace {
                    options.lowercase = false;
                }
            }
            Kind::Spm => {
                options.add_space_prefix = true;
                options.add_bos = true;
            }
            Kind::Wpm => {
                options.clean_spaces = true;
                options.add_bos = true;
                options.add_sep = true;
            }
            Kind::Ugm => options.add_eos = true,
            Kind::Rwkv => {}
        }
        if let Some(b) = m.bool("tokenizer.ggml.add_space_prefix")? {
            options.add_space_prefix = b;
        }
        if let Some(b) = m.bool("tokenizer.ggml.remove_extra_whitespaces")? {
            options.remove_extra_whitespaces = b;
        }

        let texts = match m.array("tokenizer.ggml.tokens")? {
            Some(Array::String(t)) => t,
            Some(other) => {
                return Err(m.bad(
                    "tokenizer.ggml.tokens",
                    format!(
                        "expected an array of STRING, found an array of {}",
                        other.elem_type().name()
                    ),
                ));
            }
            None => return Err(m.bad("tokenizer.ggml.tokens", "missing (the vocabulary's tokens)")),
        };
        let n = texts.len();
        if u32::try_from(n).is_err() {
            return Err(m.bad(
                "tokenizer.ggml.tokens",
                format!("{n} tokens do not fit token ids"),
            ));
        }
        let scores: Option<Vec<f32>> = match m.array("tokenizer.ggml.scores")? {
            None => None,
            Some(Array::F32(s)) if s.len() >= n => Some(s[..n].to_vec()),
            Some(Array::I32(s)) if s.len() >= n => Some(s[..n].iter().map(|&x| x as f32).collect()),
            Some(a @ (Array::F32(_) | Array::I32(_))) => {
                return Err(m.bad(
                    "tokenizer.ggml.scores",
                    format!("{} scores for {n} tokens", a.len()),
                ));
            }
            Some(other) => {
                return Err(m.bad(
                    "tokenizer.ggml.scores",
                    format!(
                        "expected an array of FLOAT32 or INT32, found an array of {}",
                        other.elem_type().name()
                    ),
                ));
            }
        };
        let types: Option<&[i32]> = match m.array("tokenizer.ggml.token_type")? {
            None => None,
            Some(Array::I32(t)) if t.len() >= n => Some(&t[..n]),
            Some(Array::I32(t)) => {
                return Err(m.bad(
                    "tokenizer.ggml.token_type",
                    format!("{} token types for {n} tokens", t.len()),
                ));
            }
            Some(other) => {
                return Err(m.bad(
                    "tokenizer.ggml.token_type",
                    format!(
                        "expected an array of INT32, found an array of {}",
                        other.elem_type().name()
                    ),
                ));
            }
        };

        let mut tokens = Vec::with_capacity(n);
        let mut token_to_id = HashMap::with_capacity(n);
        let mut max_token_len = 0;
        for (i, text) in texts.iter().enumerate() {
            let text = if text.is_empty() {
                format!("[EMPTY_{i}]")
            } else {
                text.clone()
            };
            token_to_id.insert(text.clone(), i as u32);
            max_token_len = max_token_len.max(text.len());
            let attr = match types.map(|t| t[i]) {
                None | Some(1) => attr::NORMAL,
                Some(2) => attr::UNKNOWN,
                Some(3) => attr::CONTROL,
                Some(4) => attr::USER_DEFINED,
                Some(5) => attr::UNUSED,
                Some(6) => attr::BYTE,
                Some(_) => 0,
            };
            tokens.push(Token {
                text,
                score: scores.as_ref().map_or(0.0, |s| s[i]),
                attr,
            });
        }
        if model == "hybriddna"
            && let Some(&oov) = token_to_id.get("<oov>")
        {
            for t in &mut tokens[oov as usize + 1..] {
                if t.text.len() > DNA_KMER_MARKER.len() && t.text.ends_with(DNA_KMER_MARKER) {
                    t.text.truncate(t.text.len() - DNA_KMER_MARKER.len());
                }
            }
        }

        let charsmap = match (kind, m.array("tokenizer.ggml.precompiled_charsmap")?) {
            (Kind::Ugm, Some(Array::U8(b))) => b.clone(),
            (Kind::Ugm, Some(Array::I8(b))) => b.iter().map(|&x| x as u8).collect(),
            (Kind::Ugm, Some(other)) => {
                return Err(m.bad(
                    "tokenizer.ggml.precompiled_charsmap",
                    format!(
                        "expected an array of UINT8 or INT8, found an array of {}",
                        other.elem_type().name()
                    ),
                ));
            }
            _ => Vec::new(),
        };

        let mut vocab = Vocab {
            file: file_buf,
            model,
            kind,
            pre_name,
            pre,
            tokens,
            token_to_id,
            merges,
            max_token_len,
            special,
            options,
            eog: BTreeSet::new(),
            special_cache: Vec::new(),
            charsmap,
        };
        vocab.read_specials(&m)?;
        vocab.find_eog();
        vocab.special_cache = (0..n as u32)
            .filter(|&id| {
                vocab.tokens[id as usize].attr
                    & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN)
                    != 0
            })
            .collect();
        // llama.cpp sorts with std::sort (not stable); equal lengths keep
        // id order here.
        vocab
            .special_cache
            .sort_by_key(|&id| std::cmp::Reverse(vocab.tokens[id as usize].text.len()));
        vocab.set_strip_attributes(&m, &raw_pre_name)?;
        Ok(vocab)
    }

    /// The special ids and flags from their keys, then the end-of-turn,
    /// fill-in-the-middle and unused tokens llama.cpp finds by their text.
    fn read_specials(&mut self, m: &Meta<'_>) -> Result<(), TokenizerError> {
        let n = self.tokens.len();
        let read = |key: &str, id: &mut Option<u32>| -> Result<(), TokenizerError> {
            if id.is_some_and(|i| i as usize >= n) {
                *id = None;
            }
            // An id outside the vocabulary keeps the default (llama.cpp
            // warns).
            if let Some(new) = m.u32(key)?
                && (new as usize) < n
            {
                *id = Some(new);
            }
            Ok(())
        };
        let s = &mut self.special;
        read("tokenizer.ggml.bos_token_id", &mut s.bos)?;
        read("tokenizer.ggml.eos_token_id", &mut s.eos)?;
        read("tokenizer.ggml.eot_token_id", &mut s.eot)?;
        read("tokenizer.ggml.eom_token_id", &mut s.eom)?;
        read("tokenizer.ggml.unknown_token_id", &mut s.unk)?;
        read("tokenizer.ggml.seperator_token_id", &mut s.sep)?;
        read("tokenizer.ggml.padding_token_id", &mut s.pad)?;
        read("tokenizer.ggml.mask_token_id", &mut s.mask)?;
        read("tokenizer.ggml.fim_pre_token_id", &mut s.fim_pre)?;
        read("tokenizer.ggml.fim_suf_token_id", &mut s.fim_suf)?;
        read("tokenizer.ggml.fim_mid_token_id", &mut s.fim_mid)?;
        read("tokenizer.ggml.fim_pad_token_id", &mut s.fim_pad)?;
        read("tokenizer.ggml.fim_rep_token_id", &mut s.fim_rep)?;
        read("tokenizer.ggml.fim_sep_token_id", &mut s.fim_sep)?;
        // The deprecated names of three of them, read last.
        read("tokenizer.ggml.prefix_token_id", &mut s.fim_pre)?;
        read("tokenizer.ggml.suffix_token_id", &mut s.fim_suf)?;
        read("tokenizer.ggml.middle_token_id", &mut s.fim_mid)?;
        let o = &mut self.options;
        if let Some(b) = m.bool("tokenizer.ggml.add_bos_token")? {
            o.add_bos = b;
        }
        if let Some(b) = m.bool("tokenizer.ggml.add_eos_token")? {
            o.add_eos = b;
        }
        if let Some(b) = m.bool("tokenizer.ggml.add_sep_token")? {
            o.add_sep = b;
        }
        if self.pre == Some(Pre::Gemma4) {
            o.add_bos = true;
        }
        if let Some(b) = m.bool("tokenizer.ggml.normalizer.lowercase")? {
            o.lowercase = b;
        }
        o.strip_accents = o.lowercase;
        if let Some(b) = m.bool("tokenizer.ggml.normalizer.strip_accents")? {
            o.strip_accents = b;
        }

        // Found by text where no key named them (llama.cpp walks a hash
        // map; here the lowest id of the texts wins), and made control.
        for (texts, slot) in [
            (&EOT_TEXTS[..], 0usize),
            (&EOM_TEXTS[..], 1),
            (&FIM_PRE_TEXTS[..], 2),
            (&FIM_SUF_TEXTS[..], 3),
            (&FIM_MID_TEXTS[..], 4),
            (&FIM_PAD_TEXTS[..], 5),
            (&FIM_REP_TEXTS[..], 6),
            (&FIM_SEP_TEXTS[..], 7),
        ] {
            let s = &mut self.special;
            let id = match slot {
                0 => &mut s.eot,
                1 => &mut s.eom,
                2 => &mut s.fim_pre,
                3 => &mut s.fim_suf,
                4 => &mut s.fim_mid,
                5 => &mut s.fim_pad,
                6 => &mut s.fim_rep,
                _ => &mut s.fim_sep,
            };
            if id.is_some() {
                continue;
            }
            let found = texts
                .iter()
                .filter_map(|t| self.token_to_id.get(*t).copied())
                .min();
            if let Some(found) = found {
                *id = Some(found);
                self.tokens[found as usize].attr |= attr::CONTROL;
            }
        }
        for t in &mut self.tokens {
            if t.attr & attr::CONTROL != 0 && t.text.contains("unused") {
                t.attr |= attr::UNUSED;
            }
        }
        Ok(())
    }

    /// The tokens that end a generation (llama.cpp's `special_eog_ids`).
    fn find_eog(&mut self) {
        let s = self.special;
        self.eog
            .extend([s.fim_pad, s.fim_rep, s.fim_sep].into_iter().flatten());
        for text in EOG_TEXTS {
            if let Some(&id) = self.token_to_id.get(text) {
                self.eog.insert(id);
                self.tokens[id as usize].attr |= attr::CONTROL;
            }
        }
        for text in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(&id) = self.token_to_id.get(text) {
                self.tokens[id as usize].attr = attr::USER_DEFINED;
            }
        }
        self.eog.extend([s.eos, s.eot, s.eom].into_iter().flatten());
        let with_text = |v: &Vocab, t: &str| {
            v.eog
                .iter()
                .copied()
                .filter(|&id| v.tokens[id as usize].text == t)
                .collect::<Vec<_>>()
        };
        // o200k_harmony and solar-open: <|end|> is not an end there.
        let (has_return, has_call, has_flush) = (
            !with_text(self, "<|return|>").is_empty(),
            !(with_text(self, "<|call|>").is_empty() && with_text(self, "<|calls|>").is_empty()),
            !with_text(self, "<|flush|>").is_empty(),
        );
        let ends = with_text(self, "<|end|>");
        if let Some(&end) = ends.last()
            && has_call
            && (has_return || has_flush)
        {
            self.eog.remove(&end);
            self.tokens[end as usize].attr = attr::USER_DEFINED;
        }
        // Gemma 4 and PLaMo have a normal </s>.
        let normal_s = !with_text(self, "<|tool_response>").is_empty()
            || !with_text(self, "<|plamo:eos|>").is_empty();
        if let Some(&s_id) = with_text(self, "</s>").last()
            && normal_s
        {
            self.eog.remove(&s_id);
            self.tokens[s_id as usize].attr = attr::NORMAL;
        }
    }

    /// The strip attributes llama.cpp sets by model and pre-tokenizer name.
    fn set_strip_attributes(&mut self, m: &Meta<'_>, pre_name: &str) -> Result<(), TokenizerError> {
        let name = m.string("general.name")?.unwrap_or("").to_lowercase();
        let arch = m.string("general.architecture")?.unwrap_or("");
        let contains_any = |s: &str, subs: &[&str]| subs.iter().any(|x| s.contains(x));
        let mut set = |text: &str, bit: u32, on: bool| {
            if let Some(&id) = self.token_to_id.get(text) {
                let a = &mut self.tokens[id as usize].attr;
                *a = if on { *a | bit } else { *a & !bit };
            }
        };
        if contains_any(pre_name, &["jina-v2-de", "jina-v2-es", "jina-v2-code"])
            || contains_any(arch, &["nomic-bert-moe", "jina-bert-v3"])
        {
            set("<mask>", attr::LSTRIP, true);
        } else if contains_any(&name, &["phi-3", "phi3"]) {
            for &id in &self.special_cache {
                self.tokens[id as usize].attr |= attr::RSTRIP;
            }
            let mut set = |text: &str, on: bool| {
                if let Some(&id) = self.token_to_id.get(text) {
                    let a = &mut self.tokens[id as usize].attr;
                    *a = if on {
                        *a | attr::RSTRIP
                    } else {
                        *a & !attr::RSTRIP
                    };
                }
            };
            set("</s>", true);
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                set(t, false);
            }
        } else if name.contains("modern-bert") {
            set("[MASK]", attr::LSTRIP, true);
        }
        Ok(())
    }

    /// The rank of merging `left` and `right` (`buf` is scratch space).
    pub(crate) fn merge_rank(&self, left: &str, right: &str, buf: &mut String) -> Option<u32> {
        // The pair is the merge `left right` only where that text splits
        // back into it: no space in `left` after its first byte.
        if left.bytes().skip(1).any(|b| b == b' ') {
            return None;
        }
        buf.clear();
        buf.push_str(left);
        buf.push(' ');
        buf.push_str(right);
        self.merges.get(buf.as_str()).copied()
    }

    /// The id of `text`.
    pub(crate) fn id(&self, text: &str) -> Option<u32> {
        self.token_to_id.get(text).copied()
    }

    /// The byte token of `b` (llama.cpp's `byte_to_token` for SPM and UGM:
    /// `<0xXX>`, else the byte itself as text).
    pub(crate) fn spm_byte_token(&self, b: u8) -> Result<u32, TokenizerError> {
        self.id(&format!("<0x{b:02X}>"))
            .or_else(|| {
                b.is_ascii()
                    .then(|| self.id(&(b as char).to_string()))
                    .flatten()
            })
            .ok_or_else(|| {
                TokenizerError::Encode(format!(
                    "{}: the vocabulary has no token for byte 0x{b:02X}",
                    self.file.display()
                ))
            })
    }

    /// The unknown token, where encoding needs it.
    pub(crate) fn unk(&self) -> Result<u32, TokenizerError> {
        self.special.unk.ok_or_else(|| {
            TokenizerError::Encode(format!(
                "{}: the text needs the unknown token, and the vocabulary has none",
                self.file.display()
            ))
        })
    }
}
