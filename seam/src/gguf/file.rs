//! Opening GGUF files: one mapped shard ([`GgufFile`]) and a whole model,
//! split or not ([`GgufModel`]).
//!
//! Opening maps the file and parses only its header; tensor data stays on
//! disk until someone reads a [`Borrow`] of it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::error::{GgufError, GgufErrorKind, Result};
use super::read::{Header, TensorInfo, parse_header};
use super::value::Value;
use crate::borrow::{Borrow, BorrowError, MapOptions, MappedFile};

/// Metadata key: this shard's index, from 0.
pub const SPLIT_NO_KEY: &str = "split.no";
/// Metadata key: the number of shards.
pub const SPLIT_COUNT_KEY: &str = "split.count";
/// Metadata key: the number of tensors over all shards.
pub const SPLIT_TENSORS_COUNT_KEY: &str = "split.tensors.count";
/// Metadata key: the model's architecture (every shard must agree).
pub const ARCHITECTURE_KEY: &str = "general.architecture";

/// One mapped GGUF file and its parsed header.
#[derive(Debug)]
pub struct GgufFile {
    mapped: Arc<MappedFile>,
    header: Header,
}

fn borrow_error(path: &Path, err: BorrowError) -> GgufError {
    match err {
        BorrowError::Os { op, source, .. } => GgufError::io(path, op, source),
        BorrowError::NotRegular { kind, .. } => {
            GgufError::new(path, 0, "file", GgufErrorKind::NotRegular(kind))
        }
        BorrowError::Changed { what, .. } => {
            GgufError::new(path, 0, "file", GgufErrorKind::Changed(what))
        }
        other => GgufError::new(path, 0, "file", GgufErrorKind::Split(other.to_string())),
    }
}

impl GgufFile {
    /// Maps `path` and parses its header as shard `split`.
    ///
    /// # Errors
    ///
    /// The file cannot be mapped, or its header is malformed.
    pub fn open(path: &Path, options: MapOptions, split: usize) -> Result<GgufFile> {
        let mapped = MappedFile::open(path, options).map_err(|e| borrow_error(path, e))?;
        let header = parse_header(mapped.bytes(), path, split)?;
        Ok(GgufFile { mapped, header })
    }

    /// The parsed header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The mapping.
    pub fn mapped(&self) -> &Arc<MappedFile> {
        &self.mapped
    }

    /// The path it was opened from.
    pub fn path(&self) -> &Path {
        self.mapped.path()
    }
}

/// A GGUF model: one file, or all shards of a split model opened from the
/// first.
#[derive(Debug)]
pub struct GgufModel {
    shards: Vec<GgufFile>,
    tensors: Vec<TensorInfo>,
}

/// The shard names of a split model: `PREFIX-00001-of-00003.gguf` ->
/// (`PREFIX`, 1, 3).
fn parse_split_name(path: &Path) -> Option<(String, u32, u32)> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    if no.len() != 5 || count.len() != 5 {
        return None;
    }
    Some((prefix.to_owned(), no.parse().ok()?, count.parse().ok()?))
}

/// The path of shard `no` (from 1) of `count` next to `first`.
pub fn split_shard_path(first: &Path, prefix: &str, no: u32, count: u32) -> PathBuf {
    first.with_file_name(format!("{prefix}-{no:05}-of-{count:05}.gguf"))
}

fn split_u64(file: &GgufFile, key: &str) -> Result<Option<u64>> {
    match file.header.get(key) {
        None => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            GgufError::new(
                file.path(),
                0,
                format!("metadata {key:?}"),
                GgufErrorKind::WrongType {
                    expected: "an unsigned integer",
                    found: v.type_name(),
                },
            )
        }),
    }
}

/// A metadata value as text for messages: absent, or its value.
fn shown(v: Option<&Value>) -> String {
    v.map_or_else(|| "absent".to_owned(), |v| v.to_json().to_string())
}

/// Checks that shard `no` (from 0) says so and agrees with the first shard
/// on the shard count, the architecture and the model's tensor count: a
/// stray shard of another model (or of another split of the same one) is
/// refused rather than mixed in.
fn check_shard_agrees(first: &GgufFile, shard: &GgufFile, no: u64) -> Result<()> {
    let err = |key: &str, msg: String| {
        Err(GgufError::new(
            shard.path(),
            0,
            format!("metadata {key:?}"),
            GgufErrorKind::Split(msg),
        ))
    };
    match split_u64(shard, SPLIT_NO_KEY)? {
        Some(n) if n == no => {}
        Some(n) => return err(SPLIT_NO_KEY, format!("expected {no}, found {n}")),
        None => return err(SPLIT_NO_KEY, format!("expected {no}, found none")),
    }
    // llama.cpp's gguf-split writes the split keys in every shard and the
    // model's metadata (the architecture) in the first only: a key absent
    // from a later shard agrees; numbers agree by value, whatever their
    // integer type.
    for key in [SPLIT_COUNT_KEY, SPLIT_TENSORS_COUNT_KEY, ARCHITECTURE_KEY] {
        let (a, b) = (first.header.get(key), shard.header.get(key));
        let same = match (a, b) {
            (_, None) => key == ARCHITECTURE_KEY,
            (Some(a), Some(b)) => a == b || a.as_u64().is_some_and(|n| b.as_u64() == Some(n)),
            (None, Some(_)) => false,
        };
        if !same {
            return err(
                key,
                format!(
                    "{} here, {} in the first shard {}",
                    shown(b),
                    shown(a),
                    crate::text::path_safe(first.path())
                ),
            );
        }
    }
    Ok(())
}

impl GgufModel {
    /// Opens a model from `path`: a single file, or the first shard of a
    /// split model, whose other shards are found by name beside it.
    ///
    /// # Errors
    ///
    /// Any shard is malformed, missing, out of order, or the shards' tensor
    /// total disagrees with `split.tensors.count`.
    pub fn open(path: &Path, options: MapOptions) -> Result<GgufModel> {
        let first = GgufFile::open(path, options, 0)?;
        let count = split_u64(&first, SPLIT_COUNT_KEY)?.unwrap_or(1);
        let no = split_u64(&first, SPLIT_NO_KEY)?.unwrap_or(0);
        let split_err = |msg: String| GgufError::new(path, 0, "split", GgufErrorKind::Split(msg));
        if no != 0 {
            return Err(split_err(format!(
                "this is shard {no} (from 0) of a split model: open the first shard"
            )));
        }
        if count == 0 || count > 9999 {
            return Err(split_err(format!("split.count {count} is not in 1..=9999")));
        }
        let mut shards = vec![first];
        if count > 1 {
            let (prefix, file_no, file_count) = parse_split_name(path).ok_or_else(|| {
                split_err(format!(
                    "split.count is {count} but the name is not PREFIX-00001-of-{count:05}.gguf"
                ))
            })?;
            if file_no != 1 || u64::from(file_count) != count {
                return Err(split_err(format!(
                    "the name says shard {file_no} of {file_count}, the metadata says shard 1 of {count}"
                )));
            }
            for i in 1..count as u32 {
                let shard_path = split_shard_path(path, &prefix, i + 1, file_count);
                let shard = GgufFile::open(&shard_path, options, i as usize)?;
                check_shard_agrees(&shards[0], &shard, u64::from(i))?;
                shards.push(shard);
            }
        }
        let total: usize = shards.iter().map(|s| s.header.tensors.len()).sum();
        if let Some(expected) = split_u64(&shards[0], SPLIT_TENSORS_COUNT_KEY)?
            && expected != total as u64
        {
            return Err(split_err(format!(
                "split.tensors.count is {expected} but the shards hold {total} tensors"
            )));
        }
        let mut tensors = Vec::with_capacity(total);
        let mut seen = std::collections::HashSet::with_capacity(total);
        for shard in &shards {
            for t in &shard.header.tensors {
                if !seen.insert(t.name.as_str()) {
                    return Err(GgufError::new(
                        shard.path(),
                        0,
                        format!("tensor {:?}", t.name),
                        GgufErrorKind::DuplicateName(t.name.clone()),
                    ));
                }
                tensors.push(t.clone());
            }
        }
        Ok(GgufModel { shards, tensors })
    }

    /// The shards, first to last (one for an unsplit file).
    pub fn shards(&self) -> &[GgufFile] {
        &self.shards
    }

    /// The header of the first shard, which holds the model's metadata.
    pub fn header(&self) -> &Header {
        &self.shards[0].header
    }

    /// A metadata value (from the first shard).
    pub fn metadata(&self, key: &str) -> Option<&Value> {
        self.header().get(key)
    }

    /// Every tensor of every shard, in shard then file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// A zero-copy borrow of `tensor`'s bytes in its shard's mapping.
    ///
    /// # Errors
    ///
    /// The tensor does not belong to this model (its shard index or range is
    /// not in it).
    pub fn tensor_borrow(&self, tensor: &TensorInfo) -> Result<Borrow> {
        let shard = self.shards.get(tensor.split).ok_or_else(|| {
            GgufError::new(
                self.shards[0].path(),
                0,
                format!("tensor {:?} split", tensor.name),
                GgufErrorKind::Split(format!("no shard {}", tensor.split)),
            )
        })?;
        Borrow::new(Arc::clone(&shard.mapped), tensor.offset, tensor.n_bytes)
            .map_err(|e| borrow_error(shard.path(), e))
    }

    /// Checks that no shard changed since it was opened
    /// ([`MappedFile::check_unchanged`]); run after every pass that reads
    /// tensor bytes.
    ///
    /// # Errors
    ///
    /// A shard's size, times or inode moved (the error names it and what
    /// changed), or it cannot be stat'ed.
    pub fn check_unchanged(&self) -> Result<()> {
        for shard in &self.shards {
            shard
                .mapped
                .check_unchanged()
                .map_err(|e| borrow_error(shard.path(), e))?;
        }
        Ok(())
    }

    /// The sum of all tensors' bytes.
    pub fn total_tensor_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.n_bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::parse_split_name;
    use std::path::Path;

    #[test]
    fn split_names() {
        assert_eq!(
            parse_split_name(Path::new("/m/qwen-UD-IQ1_S-00001-of-00003.gguf")),
            Some(("qwen-UD-IQ1_S".into(), 1, 3))
        );
        assert_eq!(parse_split_name(Path::new("model.gguf")), None);
        assert_eq!(parse_split_name(Path::new("m-1-of-3.gguf")), None);
    }
}
