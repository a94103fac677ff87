//! WordPiece (llama.cpp's `llm_tokenizer_wpm_session`): the text
//! normalized (NFD's first code point and accents dropped, lowercased, as
//! the vocabulary says) and split at white space and punctuation; each word,
//! with a leading `▁`, greedily as the longest tokens that cover it, or the
//! unknown token when some part has none.

use crate::error::TokenizerError;
use crate::unicode::{flags, nfd_first, to_lower};
use crate::vocab::Vocab;

/// Appends the tokens of `text` to `out`.
pub(crate) fn encode(vocab: &Vocab, text: &str, out: &mut Vec<u32>) -> Result<(), TokenizerError> {
    for word in words(vocab, text) {
        if word.is_empty() {
            continue;
        }
        let word = format!("\u{2581}{word}");
        let n = word.len();
        let first = out.len();
        let mut i = 0;
        while i < n {
            let longest = (i + 1..=n.min(i + vocab.max_token_len + 1))
                .rev()
                .filter(|&j| word.is_char_boundary(i) && word.is_char_boundary(j))
                .find_map(|j| vocab.id(&word[i..j]).map(|id| (id, j)));
            match longest {
                Some((id, j)) => {
                    out.push(id);
                    i = j;
                }
                None => {
                    out.truncate(first);
                    break;
                }
            }
        }
        if out.len() == first {
            out.push(vocab.unk()?);
        }
    }
    Ok(())
}

/// BERT's pre-tokenization (llama.cpp's `preprocess`).
fn words(vocab: &Vocab, text: &str) -> Vec<String> {
    let o = vocab.options;
    let mut words = vec![String::new()];
    for c in text.chars() {
        let c = if o.strip_accents { nfd_first(c) } else { c };
        let f = flags(c);
        if f.whitespace() {
            if !words.last().is_some_and(String::is_empty) {
                words.push(String::new());
            }
            continue;
        }
        if c == '\0' || c == '\u{FFFD}' || f.control() || (o.strip_accents && f.mark()) {
            continue;
        }
        let alone = f.punctuation() || ((c as u32) < 0x7F && f.symbol()) || is_chinese(c);
        let c = if o.lowercase { to_lower(c) } else { c };
        let last = words.last_mut().expect("words is never empty");
        if alone {
            if !last.is_empty() {
                words.push(String::new());
            }
            let last = words.last_mut().expect("words is never empty");
            last.push(c);
            words.push(String::new());
        } else {
            last.push(c);
        }
    }
    if words.last().is_some_and(String::is_empty) {
        words.pop();
    }
    words
}

/// The CJK blocks BERT splits one character at a time (with HF's 0x2B920
/// where 0x2B820 was meant, as llama.cpp keeps it).
fn is_chinese(c: char) -> bool {
    matches!(c as u32,
        0x4E00..=0x9FFF
        | 0x3400..=0x4DBF
        | 0x20000..=0x2A6DF
        | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F
        | 0x2B920..=0x2CEAF
        | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}
