//! RWKV's tokenizer (llama.cpp's `llm_tokenizer_rwkv_session`): the
//! longest token at each position, over the tokens' unescaped bytes.

use crate::error::TokenizerError;
use crate::trie::Trie;
use crate::vocab::Vocab;

/// A token's text unescaped (`\t`, `\n`, `\r`, `\xHH`, `\\`).
pub(crate) fn unescape(escaped: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(escaped.len());
    let (mut escaping, mut hex_left, mut hex) = (false, 0u8, 0u8);
    for c in escaped.bytes() {
        if hex_left > 0 {
            let v = if c >= b'a' {
                c.wrapping_sub(b'a').wrapping_add(10)
            } else {
                c.wrapping_sub(b'0')
            };
            hex = hex.wrapping_shl(4).wrapping_add(v);
            hex_left -= 1;
            if hex_left == 0 {
                out.push(hex);
                hex = 0;
            }
            continue;
        }
        if escaping {
            match c {
                b't' => out.push(b'\t'),
                b'n' => out.push(b'\n'),
                b'r' => out.push(b'\r'),
                b'x' => hex_left = 2,
                _ => out.push(c),
            }
            escaping = false;
            continue;
        }
        if c == b'\\' {
            escaping = true;
            continue;
        }
        out.push(c);
    }
    out
}

/// The trie of every token's unescaped bytes.
pub(crate) fn trie(vocab: &Vocab) -> Trie {
    let mut trie = Trie::new();
    for (id, t) in vocab.tokens.iter().enumerate() {
        trie.insert(&unescape(&t.text), id as u32);
    }
    trie
}

/// Appends the tokens of `text` to `out`.
pub(crate) fn encode(
    vocab: &Vocab,
    trie: &Trie,
    text: &str,
    out: &mut Vec<u32>,
) -> Result<(), TokenizerError> {
    let bytes = text.as_bytes();
    let mut pos = 0;
    while pos < bytes.len() {
        let Some(mut node) = trie.step(trie.root(), bytes[pos]) else {
            out.push(vocab.unk()?);
            pos += 1;
            continue;
        };
        let (mut id, mut end) = (None, pos);
        let mut at = pos;
        loop {
            if let Some(v) = trie.value(node) {
                id = Some(v);
                end = at + 1;
            }
            if at + 1 >= bytes.len() {
                break;
            }
            at += 1;
            match trie.step(node, bytes[at]) {
                Some(n) => node = n,
                None => break,
            }
        }
        // llama.cpp pushes token 0 and loops forever when no prefix is a
        // whole token; that cannot be encoded.
        let Some(id) = id else {
            return Err(TokenizerError::Encode(format!(
                "{}: no token covers byte {pos} of the text",
                vocab.file.display()
            )));
        };
        out.push(id);
        pos = end;
    }
    Ok(())
}
