//! Byte-level BPE (llama.cpp's `llm_tokenizer_bpe_session`): each word of
//! the pre-tokenizer merged pairwise, the lowest-ranked merge first (the
//! leftmost of equal ranks); a piece that is no token becomes its bytes'
//! tokens. Also the `hybriddna` and `whitespace` sessions around it.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::error::TokenizerError;
use crate::pretok::{Pre, PreTokenizer};
use crate::unicode::{flags, to_lower};
use crate::vocab::Vocab;

const NONE: usize = usize::MAX;

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: usize,
    next: usize,
}

/// Appends the tokens of `text` to `out`.
pub(crate) fn encode(
    vocab: &Vocab,
    pre: &PreTokenizer,
    text: &str,
    out: &mut Vec<u32>,
) -> Result<(), TokenizerError> {
    let words = pre.split(text).map_err(|e| {
        TokenizerError::Encode(format!("{}: pre-tokenizing: {e}", vocab.file.display()))
    })?;
    for word in &words {
        encode_word(vocab, pre, word, out)?;
    }
    Ok(())
}

fn encode_word(
    vocab: &Vocab,
    pre: &PreTokenizer,
    word: &str,
    out: &mut Vec<u32>,
) -> Result<(), TokenizerError> {
    let mut symbols: Vec<Symbol> = Vec::new();
    let whole = (vocab.options.ignore_merges && vocab.id(word).is_some())
        || (vocab.pre == Some(Pre::Gemma4)
            && word.bytes().all(|b| b == b'\n')
            && vocab.id(word).is_some());
    if whole {
        symbols.push(Symbol {
            start: 0,
            len: word.len(),
            prev: NONE,
            next: NONE,
        });
    } else {
        for (i, c) in word.char_indices() {
            let len = c.len_utf8();
            symbols.push(Symbol {
                start: i,
                len,
                prev: if symbols.is_empty() {
                    NONE
                } else {
                    symbols.len() - 1
                },
                next: if i + len == word.len() {
                    NONE
                } else {
                    symbols.len() + 1
                },
            });
        }
    }
    let text = |s: &Symbol| &word[s.start..s.start + s.len];
    // (rank, left) smallest first; the pair's text when pushed.
    let mut queue: BinaryHeap<Reverse<(u32, usize, usize, String)>> = BinaryHeap::new();
    let mut buf = String::new();
    let mut spaced = false;
    let mut add = |symbols: &[Symbol], queue: &mut BinaryHeap<_>, left: usize, right: usize| {
        if left == NONE || right == NONE {
            return;
        }
        let (l, r) = (text(&symbols[left]), text(&symbols[right]));
        // llama.cpp asserts that no merge pair holds a space (a raw UTF-8
        // word of a `gpt2` file under the `whitespace` pre-tokenizer).
        if l.contains(' ') || r.contains(' ') {
            spaced = true;
            return;
        }
        if let Some(rank) = vocab.merge_rank(l, r, &mut buf) {
            queue.push(Reverse((rank, left, right, format!("{l}{r}"))));
        }
    };
    for i in 1..symbols.len() {
        add(&symbols, &mut queue, i - 1, i);
    }
    while let Some(Reverse((_, left, right, pair))) = queue.pop() {
        let (l, r) = (symbols[left], symbols[right]);
        if l.len == 0 || r.len == 0 {
            continue;
        }
        // Stale: one side has changed since the pair was queued.
        if l.start + l.len != r.start
            || l.len + r.len != pair.len()
            || word[l.start..r.start + r.len] != pair
        {
            continue;
        }
        symbols[left].len += r.len;
        symbols[right].len = 0;
        symbols[left].next = r.next;
        if r.next != NONE {
            symbols[r.next].prev = left;
        }
        let (prev, next) = (symbols[left].prev, symbols[left].next);
        add(&symbols, &mut queue, prev, left);
        add(&symbols, &mut queue, left, next);
    }
    if spaced {
        return Err(TokenizerError::Encode(format!(
            "{}: the pre-tokenizer left a space in a word to merge, which llama.cpp refuses (it aborts)",
            vocab.file.display()
        )));
    }
    for s in symbols.iter().filter(|s| s.len > 0) {
        let piece = text(s);
        match vocab.id(piece) {
            Some(id) => out.push(id),
            None => {
                for &b in piece.as_bytes() {
                    // Each byte of the encoded piece as a one-byte token
                    // (so only ASCII ones can match), or SPM-style
                    // `<0xXX>` where the words are raw UTF-8.
                    let id = if pre.byte_encodes() {
                        b.is_ascii()
                            .then(|| vocab.id(&(b as char).to_string()))
                            .flatten()
                    } else {
                        vocab.id(&format!("<0x{b:02X}>"))
                    };
                    out.extend(id);
                }
            }
        }
    }
    Ok(())
}

/// `hybriddna`: text outside `<dna>...</dna>` as BPE, the DNA inside as
/// k-mers of six (llama.cpp's `llm_tokenizer_hybriddna_session`).
pub(crate) fn encode_hybrid_dna(
    vocab: &Vocab,
    pre: &PreTokenizer,
    text: &str,
    out: &mut Vec<u32>,
) -> Result<(), TokenizerError> {
    const OPEN: &str = "<dna>";
    const CLOSE: &str = "</dna>";
    let (Some(begin), Some(end), Some(oov)) = (vocab.id(OPEN), vocab.id(CLOSE), vocab.id("<oov>"))
    else {
        return encode(vocab, pre, text, out);
    };
    let mut pos = 0;
    while pos < text.len() {
        let Some(start) = text[pos..].find(OPEN).map(|s| s + pos) else {
            encode(vocab, pre, &text[pos..], out)?;
            break;
        };
        if start > pos {
            encode(vocab, pre, &text[pos..start], out)?;
        }
        out.push(begin);
        let content = start + OPEN.len();
        let close = text[content..].find(CLOSE).map(|c| c + content);
        let seq = text[content..close.unwrap_or(text.len())].to_ascii_uppercase();
        let kmer = |k: &str| {
            vocab
                .id(&format!("{k}{}", crate::vocab::DNA_KMER_MARKER))
                .unwrap_or(oov)
        };
        let bytes = seq.as_bytes();
        let mut i = 0;
        while i + 6 <= bytes.len() {
            out.push(kmer(&String::from_utf8_lossy(&bytes[i..i + 6])));
            i += 6;
        }
        if i < bytes.len() {
            let mut k = String::from_utf8_lossy(&bytes[i..]).into_owned();
            k.extend(std::iter::repeat_n('A', 6 - (bytes.len() - i)));
            out.push(kmer(&k));
        }
        match close {
            Some(c) => {
                out.push(end);
                pos = c + CLOSE.len();
            }
            None => break,
        }
    }
    Ok(())
}

/// `whitespace`: white space dropped, each run between as BPE (llama.cpp's
/// `llm_tokenizer_whitespace_session`).
pub(crate) fn encode_whitespace(
    vocab: &Vocab,
    pre: &PreTokenizer,
    text: &str,
    out: &mut Vec<u32>,
) -> Result<(), TokenizerError> {
    let mut segment = String::new();
    for c in text.chars() {
        if flags(c).whitespace() {
            if !segment.is_empty() {
                encode(vocab, pre, &segment, out)?;
                segment.clear();
            }
        } else {
            segment.push(if vocab.options.lowercase {
                to_lower(c)
            } else {
                c
            });
        }
    }
    if !segment.is_empty() {
        encode(vocab, pre, &segment, out)?;
    }
    Ok(())
}
