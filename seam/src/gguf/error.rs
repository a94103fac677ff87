//! Errors of the GGUF layer: each names the file, the byte offset and the
//! field, so one line tells an operator where a file is broken.

use std::path::{Path, PathBuf};

/// A GGUF file could not be opened, read or written.
#[derive(Debug, thiserror::Error)]
#[error(
    "{}: byte {offset}: {}: {kind}",
    crate::text::path_safe(file),
    crate::text::terminal_safe(field)
)]
pub struct GgufError {
    /// The file the error is about.
    pub file: PathBuf,
    /// The byte offset in that file where the offending field starts.
    pub offset: u64,
    /// The field, e.g. `tensor[3] "blk.0.attn_q.weight" dims[1]`.
    pub field: String,
    /// What is wrong with it.
    pub kind: GgufErrorKind,
}

/// What is wrong with a field.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufErrorKind {
    /// An I/O error from the operating system.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The file ends inside the field.
    #[error("truncated: needs {need} bytes, {have} remain")]
    Truncated {
        /// Bytes the field needs.
        need: u64,
        /// Bytes left in the file.
        have: u64,
    },
    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file (magic {}, expected \"GGUF\")", magic_text(.0))]
    BadMagic([u8; 4]),
    /// A version this reader does not read (it reads 2 and 3).
    #[error("unsupported version {0} (supported: 2, 3)")]
    UnsupportedVersion(u32),
    /// A count that cannot fit in the bytes that remain.
    #[error("count {count} needs at least {need} bytes, only {have} remain")]
    CountTooLarge {
        /// The claimed count.
        count: u64,
        /// The smallest number of bytes that many items take.
        need: u64,
        /// Bytes left in the file.
        have: u64,
    },
    /// A string or array longer than the reference's cap of 2^30.
    #[error("length {0} exceeds the limit of 2^30")]
    LengthLimit(u64),
    /// A string that is not UTF-8.
    #[error("string is not valid UTF-8")]
    InvalidUtf8,
    /// A metadata value type tag outside 0..=12.
    #[error("unknown metadata value type {0}")]
    UnknownValueType(i32),
    /// An array whose elements are arrays.
    #[error("arrays of arrays are not allowed")]
    NestedArray,
    /// A ggml type id that no table knows (or that upstream removed).
    #[error("unknown ggml type id {0}")]
    UnknownGgmlType(i32),
    /// More than four dimensions.
    #[error("{0} dimensions (at most 4)")]
    TooManyDims(u32),
    /// A negative dimension.
    #[error("negative dimension {0}")]
    NegativeDim(i64),
    /// Dimensions whose product overflows.
    #[error("product of dimensions {0:?} overflows")]
    DimsOverflow(Vec<i64>),
    /// ne0 is not a whole number of blocks of the tensor's type.
    #[error("ne0 = {ne0} is not a multiple of the {ty} block size {block}")]
    NotBlockMultiple {
        /// The first dimension.
        ne0: u64,
        /// The type's name.
        ty: &'static str,
        /// The type's block size.
        block: u64,
    },
    /// `general.alignment` is zero, not a power of two or of the wrong type.
    #[error("alignment must be a non-zero power of two u32, got {0}")]
    BadAlignment(String),
    /// A tensor offset that is not a multiple of the alignment.
    #[error("offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedOffset {
        /// The relative offset.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// A tensor whose bytes reach past the end of the file.
    #[error("data [{start}, {end}) reaches past the end of the file ({file_len} bytes)")]
    OutOfRange {
        /// Absolute start.
        start: u64,
        /// Absolute end (exclusive); `u64::MAX` when the sum overflows.
        end: u64,
        /// The file's length.
        file_len: u64,
    },
    /// Two tensors whose byte ranges overlap.
    #[error("data overlaps tensor {other:?}")]
    Overlap {
        /// The other tensor's name.
        other: String,
    },
    /// A metadata key that appears twice.
    #[error("duplicate key {0:?}")]
    DuplicateKey(String),
    /// A tensor name that appears twice.
    #[error("duplicate tensor name {0:?}")]
    DuplicateName(String),
    /// An empty metadata key.
    #[error("empty key")]
    EmptyKey,
    /// A tensor name of 64 bytes or more (ggml's limit, NUL included).
    #[error("tensor name of {0} bytes (at most 63)")]
    NameTooLong(u64),
    /// A metadata value of the wrong type for a key the reader interprets.
    #[error("expected {expected}, found {found}")]
    WrongType {
        /// The type the key must have.
        expected: &'static str,
        /// The type it has.
        found: String,
    },
    /// The path is not a regular file.
    #[error("{0}, not a regular file")]
    NotRegular(&'static str),
    /// The file changed since it was opened.
    #[error("the file changed while it was being read: {0}")]
    Changed(String),
    /// A value outside what the format allows (a bool that is not 0 or 1).
    #[error("{0}")]
    BadValue(String),
    /// A split model whose shards disagree with their metadata.
    #[error("{0}")]
    Split(String),
    /// A value the writer cannot encode.
    #[error("{0}")]
    Unwritable(String),
}

/// Four magic bytes as text and hex: `"GGML" (47 47 4d 4c)`, with bytes
/// that are not printable ASCII escaped in the text.
fn magic_text(magic: &[u8; 4]) -> String {
    let text: String = magic
        .iter()
        .flat_map(|&b| std::ascii::escape_default(b))
        .map(char::from)
        .collect();
    let hex: Vec<String> = magic.iter().map(|b| format!("{b:02x}")).collect();
    format!("\"{text}\" ({})", hex.join(" "))
}

impl GgufError {
    /// An error about `field` at `offset` of `file`.
    pub fn new(file: &Path, offset: u64, field: impl Into<String>, kind: GgufErrorKind) -> Self {
        GgufError {
            file: file.to_path_buf(),
            offset,
            field: field.into(),
            kind,
        }
    }

    /// An I/O error about the file as a whole.
    pub fn io(file: &Path, op: &str, err: std::io::Error) -> Self {
        GgufError::new(file, 0, op, GgufErrorKind::Io(err))
    }
}

/// Results of the GGUF layer.
pub type Result<T, E = GgufError> = std::result::Result<T, E>;
