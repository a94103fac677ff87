//! SentencePiece BPE (llama.cpp's `llm_tokenizer_spm_session`): the text's
//! characters merged pairwise, the pair whose merge is the highest-scored
//! token first (the leftmost of equal scores), until no pair is a token;
//! a character that is no token becomes its bytes' tokens.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use crate::error::TokenizerError;
use crate::vocab::Vocab;

const NONE: usize = usize::MAX;

/// A run of the text's bytes, linked to its neighbours.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: usize,
    next: usize,
}

struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    size: usize,
}

impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        // Highest score first, then the leftmost.
        self.score
            .total_cmp(&other.score)
            .then(other.left.cmp(&self.left))
    }
}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}

/// Appends the tokens of `text` (spaces already escaped) to `out`.
pub(crate) fn encode(vocab: &Vocab, text: &str, out: &mut Vec<u32>) -> Result<(), TokenizerError> {
    let bytes = text.as_bytes();
    let mut symbols: Vec<Symbol> = Vec::new();
    let mut at = 0;
    for (i, c) in text.char_indices() {
        let len = c.len_utf8();
        symbols.push(Symbol {
            start: i,
            len,
            prev: if symbols.is_empty() {
                NONE
            } else {
                symbols.len() - 1
            },
            next: if i + len == bytes.len() {
                NONE
            } else {
                symbols.len() + 1
            },
        });
        at = i + len;
    }
    debug_assert_eq!(at, bytes.len());
    let mut queue = BinaryHeap::new();
    let mut rev_merge: HashMap<&str, (usize, usize)> = HashMap::new();
    let mut try_add =
        |symbols: &[Symbol], queue: &mut BinaryHeap<Bigram>, left: usize, right: usize| {
            if left == NONE || right == NONE {
                return;
            }
            let start = symbols[left].start;
            let size = symbols[left].len + symbols[right].len;
            let piece = &text[start..start + size];
            let Some(id) = vocab.id(piece) else { return };
            queue.push(Bigram {
                left,
                right,
                score: vocab.tokens[id as usize].score,
                size,
            });
            rev_merge.insert(piece, (left, right));
        };
    for i in 1..symbols.len() {
        try_add(&symbols, &mut queue, i - 1, i);
    }
    while let Some(b) = queue.pop() {
        let (l, r) = (symbols[b.left], symbols[b.right]);
        if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
            continue;
        }
        symbols[b.left].len += r.len;
        symbols[b.right].len = 0;
        symbols[b.left].next = r.next;
        if r.next != NONE {
            symbols[r.next].prev = b.left;
        }
        let (prev, next) = (symbols[b.left].prev, symbols[b.left].next);
        try_add(&symbols, &mut queue, prev, b.left);
        try_add(&symbols, &mut queue, b.left, next);
    }
    let mut i = if symbols.is_empty() { NONE } else { 0 };
    while i != NONE {
        let s = symbols[i];
        resegment(vocab, text, &symbols, &rev_merge, s, out)?;
        i = s.next;
    }
    Ok(())
}

/// A final symbol's tokens: its own, else the halves it was merged from,
/// else its bytes'.
fn resegment(
    vocab: &Vocab,
    text: &str,
    symbols: &[Symbol],
    rev_merge: &HashMap<&str, (usize, usize)>,
    s: Symbol,
    out: &mut Vec<u32>,
) -> Result<(), TokenizerError> {
    let piece = &text[s.start..s.start + s.len];
    if let Some(id) = vocab.id(piece) {
        out.push(id);
        return Ok(());
    }
    if let Some(&(l, r)) = rev_merge.get(piece)
        && symbols[l].len < s.len
        && symbols[r].len < s.len
    {
        resegment(vocab, text, symbols, rev_merge, symbols[l], out)?;
        return resegment(vocab, text, symbols, rev_merge, symbols[r], out);
    }
    for &b in piece.as_bytes() {
        out.push(vocab.spm_byte_token(b)?);
    }
    Ok(())
}
