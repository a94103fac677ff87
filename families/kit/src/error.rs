//! The load errors every family shares: each refusal names the metadata key
//! or the tensor it is about.

use seam::SeamError;
use seam::borrow::BorrowError;
use seam::gguf::{GgmlType, GgufError};

use crate::manifest::TypeClass;

/// Why a family's file could not be loaded, or a weight not handed out.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The forward pass could not run (its hyperparameters or tensors, or a
    /// weight the seam could not hand out).
    #[error("forward pass: {0}")]
    Forward(String),
    /// `general.architecture` is absent or names another architecture.
    #[error("general.architecture is {}, not {expected:?}", found.as_deref().map_or_else(|| "absent".to_owned(), |a| format!("{a:?}")))]
    WrongArchitecture {
        /// The architecture the family reads.
        expected: &'static str,
        /// What the file says (`None`: the key is absent).
        found: Option<String>,
    },
    /// A required metadata key is absent.
    #[error("metadata key {key:?} is required but absent")]
    MissingKey {
        /// The full key (`qwen4exp.ssm.conv_kernel`).
        key: String,
    },
    /// A metadata key holds a value of the wrong type.
    #[error("metadata key {key:?} is {found}, expected {expected}")]
    KeyType {
        /// The full key.
        key: String,
        /// What the family reads there.
        expected: &'static str,
        /// The value's GGUF type (`STRING`, `ARRAY[FLOAT32]`).
        found: String,
    },
    /// A metadata key's value is out of its domain (or disagrees with
    /// another key).
    #[error("metadata key {key:?}: {reason}")]
    KeyValue {
        /// The full key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A tensor the manifest requires is not in the file.
    #[error("tensor {name:?} is required by the {arch} manifest but absent from the file")]
    MissingTensor {
        /// The architecture whose manifest requires it.
        arch: &'static str,
        /// The tensor's name.
        name: String,
    },
    /// A tensor of the file is neither claimed by the manifest nor dropped
    /// by name.
    #[error(
        "tensor {name:?} is in the file but neither claimed by the {arch} manifest nor dropped by name"
    )]
    ExtraTensor {
        /// The architecture whose manifest does not claim it.
        arch: &'static str,
        /// The tensor's name.
        name: String,
    },
    /// A tensor of the file is refused by name, on purpose (a table the
    /// family borrows from elsewhere, a file published broken).
    #[error("tensor {name:?}: {reason}")]
    RefusedTensor {
        /// The tensor's name.
        name: String,
        /// Why it is refused.
        reason: String,
    },
    /// A claimed tensor has other dims than the hyperparameters imply.
    #[error("tensor {name:?} has dims {found:?}, expected {expected}")]
    WrongShape {
        /// The tensor's name.
        name: String,
        /// The expected dims (GGUF order), as the rule reads.
        expected: String,
        /// The dims in the file.
        found: Vec<u64>,
    },
    /// A claimed tensor has a ggml type its role does not allow.
    #[error("tensor {name:?} is {found}, expected {expected}")]
    WrongType {
        /// The tensor's name.
        name: String,
        /// The types its role allows.
        expected: TypeClass,
        /// The type in the file.
        found: GgmlType,
    },
    /// The file could not be read, or a tensor's range is outside it.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// A sub-span (one expert's rows, one table row) could not be borrowed.
    #[error("tensor {name:?}: {source}")]
    Borrow {
        /// The tensor's name.
        name: String,
        /// The borrow's error.
        #[source]
        source: BorrowError,
    },
    /// The seam refused or failed to stage a weight.
    #[error(transparent)]
    Seam(#[from] SeamError),
    /// A weight's bytes could not be read back from its device or
    /// dequantized.
    #[error("weight {name:?}: {reason}")]
    Read {
        /// The weight.
        name: String,
        /// Why.
        reason: String,
    },
    /// A layer index past the model's layers.
    #[error("layer {layer} is out of range ({n_layer} layers)")]
    NoSuchLayer {
        /// The layer asked for.
        layer: usize,
        /// The model's layers.
        n_layer: usize,
    },
    /// An expert index past the layer's experts.
    #[error("expert {expert} of layer {layer} is out of range ({n_expert} experts)")]
    NoSuchExpert {
        /// The layer.
        layer: usize,
        /// The expert asked for.
        expert: u64,
        /// The experts of a layer.
        n_expert: u64,
    },
    /// A row past the end of a table or matrix.
    #[error("{name} row {row} is out of range ({rows} rows)")]
    RowOutOfRange {
        /// The weight.
        name: String,
        /// The row asked for.
        row: u64,
        /// Its rows.
        rows: u64,
    },
    /// A family's own refusal, in its words (dflash: the draft does not fit
    /// its target).
    #[error("{0}")]
    Refused(String),
    /// The model has no such optional part (a table its metadata leaves out).
    #[error("the model has no {what}")]
    Absent {
        /// What is absent, and why.
        what: &'static str,
    },
}

impl LoadError {
    /// A prompt of no tokens, as every decoder and greedy loop refuses it
    /// (one wording for all the families).
    pub fn empty_prompt() -> LoadError {
        LoadError::Forward("the prompt is empty".into())
    }
}
