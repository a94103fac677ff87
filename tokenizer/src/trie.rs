//! A byte trie (llama.cpp's `naive_trie`): the UGM and RWKV tokenizers
//! walk it for every token that starts at a position.

use std::collections::BTreeMap;

/// A node: its children by byte and the token that ends here.
#[derive(Default)]
struct Node {
    children: BTreeMap<u8, u32>,
    value: Option<u32>,
}

/// Byte strings with a token id each.
pub(crate) struct Trie {
    nodes: Vec<Node>,
}

/// A node of a [`Trie`].
#[derive(Clone, Copy)]
pub(crate) struct At(u32);

impl Trie {
    pub(crate) fn new() -> Trie {
        Trie {
            nodes: vec![Node::default()],
        }
    }

    /// Adds `key` with `value` (a key added twice keeps the later value).
    pub(crate) fn insert(&mut self, key: &[u8], value: u32) {
        let mut at = 0usize;
        for &b in key {
            at = match self.nodes[at].children.get(&b) {
                Some(&next) => next as usize,
                None => {
                    let next = self.nodes.len();
                    self.nodes.push(Node::default());
                    self.nodes[at].children.insert(b, next as u32);
                    next
                }
            };
        }
        self.nodes[at].value = Some(value);
    }

    /// The root.
    pub(crate) fn root(&self) -> At {
        At(0)
    }

    /// The child of `at` by `b`.
    pub(crate) fn step(&self, at: At, b: u8) -> Option<At> {
        self.nodes[at.0 as usize].children.get(&b).map(|&n| At(n))
    }

    /// The token ending at `at`.
    pub(crate) fn value(&self, at: At) -> Option<u32> {
        self.nodes[at.0 as usize].value
    }

    /// How far `key` walks down the trie, whether or not a token ends
    /// there (llama.cpp's `get_longest_prefix`).
    pub(crate) fn walk_len(&self, key: &[u8]) -> usize {
        let mut at = self.root();
        for (i, &b) in key.iter().enumerate() {
            match self.step(at, b) {
                Some(next) => at = next,
                None => return i,
            }
        }
        key.len()
    }
}
