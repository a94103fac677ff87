//! The GGUF format: read without copying tensor data, write for fixtures.
//!
//! [`GgufModel::open`] maps a file (or every shard of a split model) and
//! parses only the header; [`GgufModel::tensor_borrow`] hands out zero-copy
//! [`Borrow`](crate::borrow::Borrow)s of tensor data. Every count, length and
//! offset in a header is checked against the file before it sizes anything,
//! and every error names the file, the byte offset and the field.

mod error;
mod file;
mod read;
mod types;
mod value;
mod write;

pub use error::{GgufError, GgufErrorKind, Result};
pub use file::{
    GgufFile, GgufModel, SPLIT_COUNT_KEY, SPLIT_NO_KEY, SPLIT_TENSORS_COUNT_KEY, split_shard_path,
};
pub use read::{
    ALIGNMENT_KEY, DEFAULT_ALIGNMENT, Header, MAX_DIMS, MAX_STRING_OR_ARRAY_LEN,
    MAX_TENSOR_NAME_LEN, TensorInfo, parse_header,
};
pub use types::GgmlType;
pub use value::{Array, Value, ValueType};
pub use write::{FillFn, GgufWriter, TensorData};

#[cfg(test)]
mod tests;
