//! The family's one error type: every refusal names the metadata key or
//! the tensor it is about.

use seam::SeamError;
use seam::borrow::BorrowError;
use seam::gguf::{GgmlType, GgufError};

use crate::manifest::TypeClass;

/// Why a qwen4exp file could not be loaded, or a weight not handed out.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The forward pass could not run (its hyperparameters or tensors, or a
    /// weight the seam could not hand out).
    #[error("forward pass: {0}")]
    Forward(String),
    /// `general.architecture` is absent or names another architecture.
    #[error("general.architecture is {}, not \"qwen4exp\"", found.as_deref().map_or_else(|| "absent".to_owned(), |a| format!("{a:?}")))]
    WrongArchitecture {
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
    #[error("tensor {name:?} is required by the qwen4exp manifest but absent from the file")]
    MissingTensor {
        /// The tensor's name.
        name: String,
    },
    /// A tensor of the file is neither claimed by the manifest nor dropped
    /// by name.
    #[error(
        "tensor {name:?} is in the file but neither claimed by the qwen4exp manifest nor dropped by name"
    )]
    ExtraTensor {
        /// The tensor's name.
        name: String,
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
    /// One expert's rows could not be borrowed from its stack.
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
    /// The model has no per-layer embedding (no `qwen4exp.ple.layers`).
    #[error("the model has no per-layer embedding (qwen4exp.ple.layers is absent or empty)")]
    NoPle,
    /// A row past the end of `per_layer_token_embd.weight`.
    #[error("per_layer_token_embd.weight row {row} is out of range ({rows} rows)")]
    PleRowOutOfRange {
        /// The row asked for.
        row: u64,
        /// The table's rows.
        rows: u64,
    },
}
