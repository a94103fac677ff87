//! Unigram (llama.cpp's `llm_tokenizer_ugm_session`, after SentencePiece):
//! the text normalized by the vocabulary's precompiled charsmap (a
//! XOR-compressed double array of replacement prefixes), spaces escaped,
//! then the tokenization of highest total score by Viterbi over a trie of
//! the tokens; a code point no token covers is the unknown token, and
//! unknowns in a row are one.

use crate::error::TokenizerError;
use crate::trie::Trie;
use crate::vocab::{Vocab, attr};

/// The parts of a UGM vocabulary built once.
pub(crate) struct Ugm {
    /// The XCDA entries.
    xcda: Vec<u32>,
    /// NUL-terminated replacement strings the XCDA points into.
    replacements: Vec<u8>,
    /// Normal, user-defined and unused tokens.
    tokens: Trie,
    /// User-defined tokens, matched before normalization.
    user_defined: Trie,
    unknown_score: f32,
}

impl Ugm {
    /// Builds the tries and reads the charsmap.
    pub(crate) fn new(vocab: &Vocab) -> Result<Ugm, TokenizerError> {
        let (mut xcda, mut replacements) = (Vec::new(), Vec::new());
        let map = &vocab.charsmap;
        if !map.is_empty() {
            let bad = |why: String| TokenizerError::Key {
                file: vocab.file.clone(),
                key: "tokenizer.ggml.precompiled_charsmap".into(),
                why,
            };
            let head: [u8; 4] = map
                .get(..4)
                .and_then(|h| h.try_into().ok())
                .ok_or_else(|| {
                    bad(format!(
                        "{} bytes: too short for its size header",
                        map.len()
                    ))
                })?;
            let blob = u32::from_le_bytes(head) as usize;
            if blob.saturating_add(4) >= map.len() {
                return Err(bad(format!(
                    "its double array claims {blob} bytes, and the charsmap has {}",
                    map.len()
                )));
            }
            xcda = map[4..4 + blob]
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            replacements = map[4 + blob..].to_vec();
        }
        let (mut tokens, mut user_defined) = (Trie::new(), Trie::new());
        let (mut min_score, mut max_score) = (f32::MAX, -f32::MAX);
        for (id, t) in vocab.tokens.iter().enumerate() {
            if t.attr & attr::NORMAL != 0 {
                min_score = min_score.min(t.score);
                max_score = max_score.max(t.score);
            }
            if t.attr & (attr::NORMAL | attr::USER_DEFINED | attr::UNUSED) != 0 {
                tokens.insert(t.text.as_bytes(), id as u32);
            }
            if t.attr & attr::USER_DEFINED != 0 {
                user_defined.insert(t.text.as_bytes(), 0);
            }
        }
        let _ = max_score;
        Ok(Ugm {
            xcda,
            replacements,
            tokens,
            user_defined,
            unknown_score: min_score - 10.0,
        })
    }

    /// Appends the tokens of `text` to `out`.
    pub(crate) fn encode(
        &self,
        vocab: &Vocab,
        text: &str,
        out: &mut Vec<u32>,
    ) -> Result<(), TokenizerError> {
        let normalized = self.normalize(vocab, text.as_bytes())?;
        let n = normalized.len();
        if n == 0 {
            return Ok(());
        }
        let unk = vocab.special.unk;
        // (token, where it starts, total score) of the best tokenization
        // ending at each byte.
        let mut best: Vec<(Option<u32>, usize, f64)> = vec![(unk, 0, -f64::MAX); n + 1];
        best[0] = (unk, 0, 0.0);
        let mut offset = 0;
        while offset < n {
            let cp_len = utf8_len(normalized[offset]).min(n - offset);
            let base = best[offset].2;
            let mut single_found = false;
            let mut node = self.tokens.step(self.tokens.root(), normalized[offset]);
            let mut end = offset + 1;
            while let Some(at) = node {
                if let Some(id) = self.tokens.value(at) {
                    if end - offset == cp_len {
                        single_found = true;
                    }
                    let t = &vocab.tokens[id as usize];
                    let score = if t.attr & attr::USER_DEFINED != 0 {
                        0.0
                    } else {
                        f64::from(t.score)
                    };
                    let challenger = base + score;
                    if challenger > best[end].2 {
                        best[end] = (Some(id), offset, challenger);
                    }
                }
                if end >= n {
                    break;
                }
                node = self.tokens.step(at, normalized[end]);
                end += 1;
            }
            if !single_found {
                let challenger = base + f64::from(self.unknown_score);
                let end = offset + cp_len;
                if challenger > best[end].2 {
                    best[end] = (unk, offset, challenger);
                }
            }
            offset += cp_len;
        }
        let first = out.len();
        let mut at = n;
        let mut prev_unknown = false;
        loop {
            let (id, start, _) = best[at];
            let unknown = id == unk;
            if !(prev_unknown && unknown) {
                out.push(id.ok_or_else(|| {
                    TokenizerError::Encode(format!(
                        "{}: the text needs the unknown token, and the vocabulary has none",
                        vocab.file.display()
                    ))
                })?);
            }
            if start == 0 {
                break;
            }
            prev_unknown = unknown;
            at = start;
        }
        out[first..].reverse();
        Ok(())
    }

    /// The text normalized and its spaces escaped (llama.cpp's
    /// `normalize`).
    fn normalize(&self, vocab: &Vocab, input: &[u8]) -> Result<Vec<u8>, TokenizerError> {
        let o = vocab.options;
        let space: &[u8] = if o.escape_whitespaces {
            "\u{2581}".as_bytes()
        } else {
            b" "
        };
        // treat_whitespace_as_suffix is never set by llama.cpp.
        let (prepend, merge) = (o.add_space_prefix, o.remove_extra_whitespaces);
        let mut out = Vec::with_capacity(input.len() * 3);
        let (mut space_prepended, mut in_word) = (false, false);
        let mut offset = 0;
        while offset < input.len() {
            let (piece, consumed) = self.normalize_prefix(vocab, input, offset)?;
            for &c in piece {
                if c != b' ' {
                    if !in_word {
                        in_word = true;
                        if (prepend && !space_prepended) || merge {
                            out.extend_from_slice(space);
                            space_prepended = true;
                        }
                    }
                    out.push(c);
                } else {
                    in_word = false;
                    if !merge {
                        out.extend_from_slice(space);
                    }
                }
            }
            offset += consumed;
        }
        Ok(out)
    }

    /// The normalization of the input's prefix at `offset`, and how many
    /// input bytes it consumed.
    fn normalize_prefix<'a>(
        &'a self,
        vocab: &Vocab,
        input: &'a [u8],
        offset: usize,
    ) -> Result<(&'a [u8], usize), TokenizerError> {
        let rest = &input[offset..];
        let user = self.user_defined.walk_len(rest);
        if user > 0 {
            return Ok((&rest[..user], user));
        }
        let bad = || {
            TokenizerError::Encode(format!(
                "{}: tokenizer.ggml.precompiled_charsmap: an index outside the charsmap",
                vocab.file.display()
            ))
        };
        let (mut longest, mut longest_at) = (0usize, 0usize);
        if !self.xcda.is_empty() {
            let node = |i: usize| self.xcda.get(i).copied().ok_or_else(bad);
            let base = |p: u32| (p >> 10) << ((p & (1 << 9)) >> 6);
            let mut index = base(node(0)?) as usize;
            for (k, &c) in rest.iter().enumerate() {
                if c == 0 {
                    break;
                }
                index ^= c as usize;
                let p = node(index)?;
                if p & ((1 << 31) | 0xFF) != u32::from(c) {
                    break;
                }
                let leaf = (p >> 8) & 1 == 1;
                index ^= base(p) as usize;
                if leaf {
                    longest = k + 1;
                    longest_at = (node(index)? & ((1 << 31) - 1)) as usize;
                }
            }
        }
        if longest > 0 {
            let tail = self.replacements.get(longest_at..).ok_or_else(bad)?;
            let len = tail.iter().position(|&b| b == 0).ok_or_else(|| {
                TokenizerError::Encode(format!(
                    "{}: tokenizer.ggml.precompiled_charsmap: an unterminated replacement",
                    vocab.file.display()
                ))
            })?;
            return Ok((&tail[..len], longest));
        }
        match valid_utf8_len(rest) {
            Some(len) => Ok((&rest[..len], len)),
            None => Ok(("\u{FFFD}".as_bytes(), 1)),
        }
    }
}

/// The length llama.cpp's `unicode_len_utf8` gives a lead byte.
pub(crate) fn utf8_len(lead: u8) -> usize {
    match lead >> 4 {
        0xC | 0xD => 2,
        0xE => 3,
        0xF => 4,
        _ => 1,
    }
}

/// The length of the code point at the start of `b` if its encoding is
/// well formed as llama.cpp's `unicode_cpt_from_utf8` checks it.
fn valid_utf8_len(b: &[u8]) -> Option<usize> {
    let cont = |i: usize| b.get(i).is_some_and(|&x| x & 0xC0 == 0x80);
    let lead = *b.first()?;
    let len = if lead & 0x80 == 0 {
        1
    } else if lead & 0x40 == 0 {
        return None;
    } else if lead & 0x20 == 0 {
        2
    } else if lead & 0x10 == 0 {
        3
    } else if lead & 0x08 == 0 {
        4
    } else {
        return None;
    };
    (1..len).all(cont).then_some(len)
}
