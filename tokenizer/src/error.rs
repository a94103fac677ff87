//! The tokenizer's one error: a file refused (naming the file and the
//! key), or a text or token it cannot encode or decode.

use std::path::PathBuf;

/// What the tokenizer refused.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// The file has no `tokenizer.ggml.model`.
    #[error("{}: the file has no tokenizer (no tokenizer.ggml.model)", file.display())]
    Absent {
        /// The file.
        file: PathBuf,
    },
    /// `tokenizer.ggml.model` is `test`: llama.cpp's placeholder of test
    /// models, which stands for no text.
    #[error(
        "{}: tokenizer.ggml.model is \"test\", llama.cpp's placeholder vocabulary of test models: it has no text to tokenize",
        file.display()
    )]
    TestVocabulary {
        /// The file.
        file: PathBuf,
    },
    /// `tokenizer.ggml.model` says the file has no vocabulary.
    #[error("{}: tokenizer.ggml.model is {model:?}: the file has no vocabulary", file.display())]
    NoVocabulary {
        /// The file.
        file: PathBuf,
        /// The key's value.
        model: String,
    },
    /// `tokenizer.ggml.model` names a tokenizer llama.cpp does not know.
    #[error(
        "{}: tokenizer.ggml.model: unknown tokenizer {model:?} (known: llama, gpt2, gemma4, hybriddna, whitespace, bert, t5, rwkv)",
        file.display()
    )]
    UnknownModel {
        /// The file.
        file: PathBuf,
        /// The key's value.
        model: String,
    },
    /// `tokenizer.ggml.model` names a tokenizer llama.cpp reads and this
    /// crate does not.
    #[error("{}: tokenizer.ggml.model: the {model:?} tokenizer is not supported", file.display())]
    Unsupported {
        /// The file.
        file: PathBuf,
        /// The key's value.
        model: String,
    },
    /// `tokenizer.ggml.pre` names a pre-tokenizer llama.cpp does not know.
    #[error("{}: tokenizer.ggml.pre: unknown pre-tokenizer {pre:?}", file.display())]
    UnknownPre {
        /// The file.
        file: PathBuf,
        /// The key's value.
        pre: String,
    },
    /// A tokenizer key is missing, of the wrong type or inconsistent.
    #[error("{}: {key}: {why}", file.display())]
    Key {
        /// The file.
        file: PathBuf,
        /// The metadata key.
        key: String,
        /// What is wrong with it.
        why: String,
    },
    /// A token id outside the vocabulary.
    #[error("token {id} is not below the vocabulary size {n_tokens}")]
    TokenOutOfRange {
        /// The id.
        id: u32,
        /// The vocabulary's size.
        n_tokens: usize,
    },
    /// A text the vocabulary cannot encode (llama.cpp would abort).
    #[error("{0}")]
    Encode(String),
}
