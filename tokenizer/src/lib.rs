//! The tokenizer a GGUF file carries in its metadata, encoding and decoding
//! as llama.cpp does (`src/llama-vocab.cpp` of the llama.cpp that
//! llama-cpp-python 0.3.36 vendors).
//!
//! [`Tokenizer::from_gguf`] reads `tokenizer.ggml.model`, `.pre`,
//! `.tokens`, `.scores`, `.token_type`, `.merges`, the special ids, the
//! add-BOS/EOS/SEP and space-prefix flags, and builds the tokenizer of the
//! file's kind ([`Kind`]): SentencePiece BPE (`llama`), byte-level BPE
//! (`gpt2`, with each `tokenizer.ggml.pre` name's pre-tokenizer as
//! llama.cpp defines it, and `gemma4`, `hybriddna`, `whitespace`),
//! WordPiece (`bert`), Unigram (`t5`) and RWKV (`rwkv`). A model or
//! pre-tokenizer name llama.cpp does not know is refused by name; so are
//! llama.cpp's placeholder vocabulary of test models (`test`) and a file
//! without a tokenizer.
//!
//! [`Tokenizer::encode`] is `llama_tokenize(vocab, text, add_special,
//! parse_special)`: special tokens split the text first (control ones only
//! with `parse_special`), the rest goes through the kind's algorithm.
//! [`Tokenizer::decode`] is `llama_detokenize`, [`Tokenizer::piece`]
//! `llama_token_to_piece`. [`TextStream`] turns generated ids into text as
//! they come, holding back bytes a later token could still change.
//!
//! The file's metadata is untrusted: a missing or mistyped key is a
//! [`TokenizerError`] naming the file and the key, never a panic; nothing
//! is sized by a count the header claims (the arrays are the ones the GGUF
//! reader already checked against the file's bytes).
//!
//! **Architecture Invariant:** this crate depends on the seam for reading
//! GGUF metadata only; it stages nothing and knows no device.

mod bpe;
mod error;
mod pretok;
mod rwkv;
mod spm;
mod trie;
mod ugm;
mod unicode;
mod vocab;
mod wpm;

use std::path::Path;

use seam::gguf::{GgufModel, Header, Value};

pub use error::TokenizerError;
pub use pretok::Pre;
pub use vocab::Kind;

use crate::pretok::PreTokenizer;
use crate::trie::Trie;
use crate::ugm::Ugm;
use crate::vocab::{Vocab, attr};

/// What the kind needs built once.
enum Engine {
    Spm,
    Bpe(PreTokenizer),
    Wpm,
    Ugm(Box<Ugm>),
    Rwkv(Trie),
}

/// A GGUF file's tokenizer.
pub struct Tokenizer {
    vocab: Vocab,
    engine: Engine,
    /// What each token decodes to, special tokens' text included
    /// (llama.cpp's `cache_token_to_piece`).
    pieces: Vec<Vec<u8>>,
}

/// A piece of the text to encode: raw text (a byte range) or a special
/// token found in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fragment {
    Text(usize, usize),
    Token(u32),
}

impl Tokenizer {
    /// The tokenizer of `model` (its first file's metadata).
    ///
    /// # Errors
    ///
    /// The file has no tokenizer, llama.cpp's test placeholder, an unknown
    /// model or pre-tokenizer, or a missing or mistyped key.
    pub fn from_gguf(model: &GgufModel) -> Result<Tokenizer, TokenizerError> {
        let file = model.shards().first().map_or(Path::new(""), |s| s.path());
        Tokenizer::from_header(model.header(), file)
    }

    /// The tokenizer of `header`, the metadata of `file` (named in errors).
    ///
    /// # Errors
    ///
    /// As [`Tokenizer::from_gguf`].
    pub fn from_header(header: &Header, file: &Path) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_metadata(&|key| header.get(key), file)
    }

    /// The tokenizer of the metadata `get` looks keys up in (of `file`,
    /// named in errors): a header with keys changed, as tests and tools
    /// make them.
    ///
    /// # Errors
    ///
    /// As [`Tokenizer::from_gguf`].
    pub fn from_metadata<'a>(
        get: &'a dyn Fn(&str) -> Option<&'a Value>,
        file: &'a Path,
    ) -> Result<Tokenizer, TokenizerError> {
        let vocab = Vocab::load(get, file)?;
        let engine = match vocab.kind {
            Kind::Spm => Engine::Spm,
            Kind::Bpe => Engine::Bpe(PreTokenizer::new(vocab.pre.unwrap_or(Pre::Default))),
            Kind::Wpm => Engine::Wpm,
            Kind::Ugm => Engine::Ugm(Box::new(Ugm::new(&vocab)?)),
            Kind::Rwkv => Engine::Rwkv(rwkv::trie(&vocab)),
        };
        let pieces = (0..vocab.tokens.len())
            .map(|id| piece_for_cache(&vocab, id))
            .collect::<Result<_, _>>()?;
        Ok(Tokenizer {
            vocab,
            engine,
            pieces,
        })
    }

    /// The tokenizer's kind.
    pub fn kind(&self) -> Kind {
        self.vocab.kind
    }

    /// `tokenizer.ggml.model`.
    pub fn model(&self) -> &str {
        &self.vocab.model
    }

    /// The pre-tokenizer of a BPE vocabulary.
    pub fn pre(&self) -> Option<Pre> {
        self.vocab.pre
    }

    /// `tokenizer.ggml.pre` as the file names it (empty when absent).
    pub fn pre_name(&self) -> &str {
        &self.vocab.pre_name
    }

    /// The number of tokens.
    pub fn n_tokens(&self) -> usize {
        self.vocab.tokens.len()
    }

    /// The beginning-of-sequence token.
    pub fn bos(&self) -> Option<u32> {
        self.vocab.special.bos
    }

    /// The end-of-sequence token.
    pub fn eos(&self) -> Option<u32> {
        self.vocab.special.eos
    }

    /// Whether encoding with `add_special` starts with the BOS token.
    pub fn adds_bos(&self) -> bool {
        match self.vocab.kind {
            Kind::Wpm => true,
            Kind::Rwkv => false,
            _ => self.vocab.options.add_bos,
        }
    }

    /// Whether `id` ends a generation (llama.cpp's `llama_vocab_is_eog`).
    pub fn is_eog(&self, id: u32) -> bool {
        self.vocab.eog.contains(&id)
    }

    /// The tokens that end a generation.
    pub fn eog(&self) -> impl Iterator<Item = u32> + '_ {
        self.vocab.eog.iter().copied()
    }

    /// The token's text in the vocabulary.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.vocab.tokens.get(id as usize).map(|t| t.text.as_str())
    }

    /// `text` as token ids (`llama_tokenize`): with `add_special`, the
    /// BOS/EOS/SEP tokens the vocabulary asks for; with `parse_special`,
    /// control tokens written in the text are those tokens (user-defined
    /// ones always are).
    ///
    /// # Errors
    ///
    /// The text needs a token the vocabulary lacks (a byte token, the
    /// unknown token, a BOS it asks for), or a pattern gave up.
    pub fn encode(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let v = &self.vocab;
        let o = v.options;
        let fragments = if text.is_empty() {
            Vec::new()
        } else {
            self.partition(text, parse_special)
        };
        let required = |id: Option<u32>, what: &str| {
            id.ok_or_else(|| {
                TokenizerError::Encode(format!(
                    "{}: the vocabulary asks for a {what} token and names none",
                    v.file.display()
                ))
            })
        };
        let mut out = Vec::new();
        match &self.engine {
            Engine::Spm => {
                if add_special && o.add_bos {
                    out.push(required(v.special.bos, "BOS")?);
                }
                let mut prev_special = true;
                for f in fragments {
                    match f {
                        Fragment::Text(start, len) => {
                            let mut t = String::new();
                            if o.add_space_prefix && prev_special {
                                t.push(' ');
                            }
                            t.push_str(&text[start..start + len]);
                            spm::encode(v, &t.replace(' ', "\u{2581}"), &mut out)?;
                            prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
                if add_special && o.add_eos {
                    out.push(required(v.special.eos, "EOS")?);
                }
            }
            Engine::Bpe(pre) => {
                if add_special && o.add_bos {
                    out.push(required(v.special.bos, "BOS")?);
                }
                for f in fragments {
                    match f {
                        Fragment::Text(start, len) => {
                            let raw = &text[start..start + len];
                            let escaped;
                            let t = if o.escape_whitespaces {
                                escaped = raw.replace(' ', "\u{2581}");
                                &escaped
                            } else {
                                raw
                            };
                            match v.model.as_str() {
                                "hybriddna" => bpe::encode_hybrid_dna(v, pre, t, &mut out)?,
                                "whitespace" => bpe::encode_whitespace(v, pre, t, &mut out)?,
                                _ => bpe::encode(v, pre, t, &mut out)?,
                            }
                        }
                        Fragment::Token(id) => out.push(id),
                    }
                }
                if add_special && o.add_eos {
                    out.push(required(v.special.eos, "EOS")?);
                }
            }
            Engine::Wpm => {
                if add_special {
                    out.push(required(v.special.bos, "BOS")?);
                }
                for f in fragments {
                    match f {
                        Fragment::Text(start, len) => {
                            wpm::encode(v, &text[start..start + len], &mut out)?
                        }
                        Fragment::Token(id) => out.push(id),
                    }
                }
                if add_special {
                    out.push(required(v.special.sep, "SEP")?);
                }
            }
            Engine::Ugm(ugm) => {
                if add_special && o.add_bos {
                    out.push(required(v.special.bos, "BOS")?);
                }
                for f in fragments {
                    match f {
                        Fragment::Text(start, len) => {
                            ugm.encode(v, &text[start..start + len], &mut out)?
                        }
                        Fragment::Token(id) => out.push(id),
                    }
                }
                if add_special && o.add_eos {
                    out.push(required(v.special.eos, "EOS")?);
                }
            }
            Engine::Rwkv(trie) => {
                for f in fragments {
                    match f {
                        Fragment::Text(start, len) => {
                            rwkv::encode(v, trie, &text[start..start + len], &mut out)?
                        }
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
        }
        Ok(out)
    }

    /// The text split at the special tokens written in it, longest token
    /// first (llama.cpp's `tokenizer_st_partition`).
    fn partition(&self, text: &str, parse_special: bool) -> Vec<Fragment> {
        let v = &self.vocab;
        let bytes = text.as_bytes();
        let mut fragments = vec![Fragment::Text(0, text.len())];
        for &id in &v.special_cache {
            let token = &v.tokens[id as usize];
            if !parse_special && token.attr & (attr::CONTROL | attr::UNKNOWN) != 0 {
                continue;
            }
            let needle = token.text.as_str();
            let mut next = Vec::with_capacity(fragments.len());
            for f in fragments {
                let Fragment::Text(mut off, mut len) = f else {
                    next.push(f);
                    continue;
                };
                loop {
                    let Some(at) = text[off..off + len].find(needle).map(|m| m + off) else {
                        if len > 0 {
                            next.push(Fragment::Text(off, len));
                        }
                        break;
                    };
                    let mut left = at - off;
                    if token.attr & attr::LSTRIP != 0 {
                        while left > 0 && is_c_space(bytes[off + left - 1]) {
                            left -= 1;
                        }
                    }
                    if left > 0 {
                        next.push(Fragment::Text(off, left));
                    }
                    next.push(Fragment::Token(id));
                    let end = at + needle.len();
                    if end >= off + len {
                        break;
                    }
                    let (mut r_off, mut r_len) = (end, off + len - end);
                    if token.attr & attr::RSTRIP != 0 {
                        while r_len > 0 && is_c_space(bytes[r_off]) {
                            r_off += 1;
                            r_len -= 1;
                        }
                    }
                    (off, len) = (r_off, r_len);
                }
            }
            fragments = next;
        }
        fragments
    }

    /// What token `id` decodes to (`llama_token_to_piece` without lstrip):
    /// control and unknown tokens are empty unless `special`.
    ///
    /// # Errors
    ///
    /// `id` is outside the vocabulary.
    pub fn piece(&self, id: u32, special: bool) -> Result<&[u8], TokenizerError> {
        let token = self
            .vocab
            .tokens
            .get(id as usize)
            .ok_or(TokenizerError::TokenOutOfRange {
                id,
                n_tokens: self.n_tokens(),
            })?;
        if !special && token.attr & (attr::UNKNOWN | attr::CONTROL) != 0 {
            return Ok(&[]);
        }
        Ok(&self.pieces[id as usize])
    }

    /// `ids` as text (`llama_detokenize`): with `remove_special`, a leading
    /// BOS and a trailing EOS the vocabulary adds are dropped; with
    /// `unparse_special`, control and unknown tokens render their text. The
    /// bytes may be invalid UTF-8 where the ids split a character.
    ///
    /// # Errors
    ///
    /// An id outside the vocabulary.
    pub fn decode(
        &self,
        ids: &[u32],
        remove_special: bool,
        unparse_special: bool,
    ) -> Result<Vec<u8>, TokenizerError> {
        let v = &self.vocab;
        let o = v.options;
        let mut ids = ids;
        let mut remove_space = o.add_space_prefix;
        if remove_special && o.add_bos && !ids.is_empty() && Some(ids[0]) == v.special.bos {
            remove_space = false;
            ids = &ids[1..];
        }
        if remove_special && o.add_eos && ids.last().is_some_and(|&l| Some(l) == v.special.eos) {
            ids = &ids[..ids.len() - 1];
        }
        let mut text = Vec::new();
        for &id in ids {
            let mut piece = self.piece(id, unparse_special)?;
            if remove_space {
                piece = piece.strip_prefix(b" ").unwrap_or(piece);
            }
            remove_space = false;
            text.extend_from_slice(piece);
        }
        if o.clean_spaces {
            text = clean_spaces(&text);
        }
        Ok(text)
    }
}

/// C's `isspace` in the "C" locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

/// The piece of token `id` with its special text (llama.cpp's
/// `token_to_piece_for_cache`).
fn piece_for_cache(v: &Vocab, id: usize) -> Result<Vec<u8>, TokenizerError> {
    let t = &v.tokens[id];
    let text = t.text.as_bytes();
    let special = attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED;
    let unescape = || t.text.replace('\u{2581}', " ").into_bytes();
    Ok(match v.kind {
        Kind::Rwkv => rwkv::unescape(&t.text),
        _ if t.attr & special != 0 => text.to_vec(),
        Kind::Spm | Kind::Wpm | Kind::Ugm if t.attr & attr::NORMAL != 0 => unescape(),
        Kind::Bpe if t.attr & attr::NORMAL != 0 => {
            if v.options.escape_whitespaces {
                unescape()
            } else {
                decode_byte_level(&t.text)
            }
        }
        Kind::Wpm if t.attr & attr::BYTE != 0 => {
            return Err(TokenizerError::Key {
                file: v.file.clone(),
                key: "tokenizer.ggml.token_type".into(),
                why: format!(
                    "token {id} is a byte token, which a WordPiece vocabulary cannot have"
                ),
            });
        }
        _ if t.attr & attr::BYTE != 0 => {
            let hex = text
                .get(3..(3 + 2).min(text.len()))
                .ok_or_else(|| TokenizerError::Key {
                    file: v.file.clone(),
                    key: "tokenizer.ggml.tokens".into(),
                    why: format!("byte token {id} is {:?}, not <0xXX>", t.text),
                })?;
            vec![strtol_hex(hex)]
        }
        _ => Vec::new(),
    })
}

/// C's `strtol(s, NULL, 16)` of at most two characters, cut to a byte.
fn strtol_hex(s: &[u8]) -> u8 {
    let mut i = 0;
    while i < s.len() && is_c_space(s[i]) {
        i += 1;
    }
    let negative = s.get(i) == Some(&b'-');
    if matches!(s.get(i), Some(b'-' | b'+')) {
        i += 1;
    }
    let mut value: i64 = 0;
    while let Some(d) = s.get(i).and_then(|&c| (c as char).to_digit(16)) {
        value = value * 16 + i64::from(d);
        i += 1;
    }
    (if negative { -value } else { value }) as u8
}

/// A byte-level token's bytes (llama.cpp's `llama_decode_text`): a
/// character outside GPT-2's byte alphabet is written out, as there.
fn decode_byte_level(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match unicode::char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
    out
}

/// llama.cpp's `clean_up_tokenization_spaces`: no space before `?!.,`, a
/// lone apostrophe between spaces joined to the word before, no space
/// before `'s`, `'m`, `'re`, `'ve`.
fn clean_spaces(text: &[u8]) -> Vec<u8> {
    let pass1 = {
        let mut out = Vec::with_capacity(text.len());
        for (i, &x) in text.iter().enumerate() {
            if i > 0 && text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
                out.pop();
            }
            out.push(x);
        }
        out
    };
    let pass2 = {
        let mut t = pass1;
        let n = t.len();
        let mut out = Vec::with_capacity(n);
        let mut i = 0;
        while i < n {
            let x = t[i];
            if i > 0 && x == b'\'' && i + 1 < n && t[i - 1] == b' ' && t[i + 1] == b' ' {
                out.pop();
                // The space after is dropped, and reads as NUL from now on.
                t[i + 1] = 0;
                out.push(x);
                i += 2;
                continue;
            }
            out.push(x);
            i += 1;
        }
        out
    };
    let t = pass2;
    let mut out = Vec::with_capacity(t.len());
    for (i, &x) in t.iter().enumerate() {
        if i > 0 && t[i - 1] == b' ' && x == b'\'' && i + 1 < t.len() {
            let x1 = t[i + 1];
            let remove = match x1 {
                b's' | b'm' => true,
                b'r' | b'v' => t.get(i + 2) == Some(&b'e'),
                _ => false,
            };
            if remove {
                out.pop();
            }
        }
        out.push(x);
    }
    out
}

/// Generated ids as text, as it becomes final: each push returns the bytes
/// no later token can change (a character whose bytes are not all there
/// waits for the rest; where the vocabulary cleans spaces, a trailing space
/// or ` '` waits for what follows). [`TextStream::finish`] returns the
/// rest. All the bytes together are `decode(ids, false, false)`.
pub struct TextStream<'t> {
    tokenizer: &'t Tokenizer,
    ids: Vec<u32>,
    emitted: usize,
}

impl<'t> TextStream<'t> {
    /// A stream with no ids yet.
    pub fn new(tokenizer: &'t Tokenizer) -> TextStream<'t> {
        TextStream {
            tokenizer,
            ids: Vec::new(),
            emitted: 0,
        }
    }

    /// Adds `id`; returns the bytes now final.
    ///
    /// # Errors
    ///
    /// `id` is outside the vocabulary.
    pub fn push(&mut self, id: u32) -> Result<Vec<u8>, TokenizerError> {
        self.ids.push(id);
        let text = self.tokenizer.decode(&self.ids, false, false)?;
        let mut ready = text.len();
        if let Err(e) = std::str::from_utf8(&text[self.emitted.min(ready)..])
            && e.error_len().is_none()
        {
            ready = self.emitted + e.valid_up_to();
        }
        if self.tokenizer.vocab.options.clean_spaces {
            // A space that a following `?!.,` or `'s`, `'re`... removes.
            let tail = &text[..ready];
            if let Some(space) = tail.iter().rposition(|&b| b == b' ')
                && matches!(&tail[space + 1..], b"" | b"'" | b"'r" | b"'v")
            {
                ready = space;
            }
        }
        Ok(self.take(&text, ready))
    }

    /// The bytes not returned yet.
    ///
    /// # Errors
    ///
    /// Never in practice (the ids were decoded before).
    pub fn finish(&mut self) -> Result<Vec<u8>, TokenizerError> {
        let text = self.tokenizer.decode(&self.ids, false, false)?;
        let len = text.len();
        Ok(self.take(&text, len))
    }

    fn take(&mut self, text: &[u8], ready: usize) -> Vec<u8> {
        if ready <= self.emitted {
            return Vec::new();
        }
        let out = text[self.emitted..ready].to_vec();
        self.emitted = ready;
        out
    }
}

#[cfg(test)]
mod tests;
