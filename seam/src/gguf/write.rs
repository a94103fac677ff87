//! The GGUF writer: valid files (alignment, padding, split shards) for
//! fixtures, tests and generated benchmark models.
//!
//! Tensor data is either bytes in memory or a fill function called chunk by
//! chunk, so a generated 32 GiB model is written at disk speed without ever
//! being held in memory.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::error::{GgufError, GgufErrorKind, Result};
use super::file::{SPLIT_COUNT_KEY, SPLIT_NO_KEY, SPLIT_TENSORS_COUNT_KEY, split_shard_path};
use super::read::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAX_DIMS};
use super::types::GgmlType;
use super::value::{Array, Value};

/// Fills `buf` with a tensor's bytes starting at byte `offset` of the tensor.
pub type FillFn = Box<dyn Fn(u64, &mut [u8]) + Send + Sync>;

/// Where a tensor's bytes come from when the file is written.
pub enum TensorData {
    /// Bytes held in memory.
    Bytes(Vec<u8>),
    /// Generated on the fly in chunks.
    Fill(FillFn),
}

struct PendingTensor {
    name: String,
    ggml_type: GgmlType,
    dims: Vec<u64>,
    n_bytes: u64,
    data: TensorData,
}

/// Builds a GGUF file in memory (metadata and tensor table) and writes it.
pub struct GgufWriter {
    version: u32,
    alignment: u64,
    metadata: Vec<(String, Value)>,
    tensors: Vec<PendingTensor>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter::new()
    }
}

/// The chunk size used to write generated tensor data.
const FILL_CHUNK: usize = 8 << 20;

fn unwritable(field: impl Into<String>, msg: impl Into<String>) -> GgufError {
    GgufError::new(
        Path::new("<writer>"),
        0,
        field,
        GgufErrorKind::Unwritable(msg.into()),
    )
}

impl GgufWriter {
    /// An empty version-3 file with the default alignment (32).
    pub fn new() -> GgufWriter {
        GgufWriter {
            version: 3,
            alignment: DEFAULT_ALIGNMENT,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Sets the format version written (2 or 3; the layouts are the same).
    pub fn set_version(&mut self, version: u32) -> &mut Self {
        self.version = version;
        self
    }

    /// Sets the data alignment and records it as `general.alignment`.
    ///
    /// # Errors
    ///
    /// `alignment` is zero, not a power of two or over `u32::MAX`.
    pub fn set_alignment(&mut self, alignment: u32) -> Result<&mut Self> {
        if alignment == 0 || !alignment.is_power_of_two() {
            return Err(unwritable(
                ALIGNMENT_KEY,
                format!("alignment {alignment} is not a power of two"),
            ));
        }
        self.alignment = u64::from(alignment);
        self.metadata.retain(|(k, _)| k != ALIGNMENT_KEY);
        self.metadata
            .push((ALIGNMENT_KEY.to_owned(), Value::U32(alignment)));
        Ok(self)
    }

    /// Adds (or replaces) a metadata pair.
    pub fn add_metadata(&mut self, key: impl Into<String>, value: Value) -> &mut Self {
        let key = key.into();
        match self.metadata.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.metadata.push((key, value)),
        }
        self
    }

    /// The metadata added so far.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    fn check_tensor(&self, name: &str, ggml_type: GgmlType, dims: &[u64]) -> Result<u64> {
        let field = format!("tensor {name:?}");
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(unwritable(field, "duplicate tensor name"));
        }
        if dims.len() > MAX_DIMS as usize {
            return Err(unwritable(
                field,
                format!("{} dims (at most 4)", dims.len()),
            ));
        }
        let ne0 = dims.first().copied().unwrap_or(1);
        let row = ggml_type.row_bytes(ne0).ok_or_else(|| {
            unwritable(
                &field,
                format!("ne0 {ne0} is not a multiple of the {ggml_type} block"),
            )
        })?;
        dims.iter()
            .skip(1)
            .try_fold(row, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| unwritable(&field, "size overflows"))
    }

    /// Adds a tensor whose bytes are in memory; `dims` in GGUF order.
    ///
    /// # Errors
    ///
    /// The name is taken, the shape is invalid for the type, or `bytes` is
    /// not exactly the tensor's size.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        ggml_type: GgmlType,
        dims: &[u64],
        bytes: Vec<u8>,
    ) -> Result<&mut Self> {
        let name = name.into();
        let n_bytes = self.check_tensor(&name, ggml_type, dims)?;
        if bytes.len() as u64 != n_bytes {
            return Err(unwritable(
                format!("tensor {name:?}"),
                format!("{} bytes given, the shape needs {n_bytes}", bytes.len()),
            ));
        }
        self.tensors.push(PendingTensor {
            name,
            ggml_type,
            dims: dims.to_vec(),
            n_bytes,
            data: TensorData::Bytes(bytes),
        });
        Ok(self)
    }

    /// Adds a tensor whose bytes are generated by `fill` while writing.
    ///
    /// # Errors
    ///
    /// The name is taken or the shape is invalid for the type.
    pub fn add_tensor_fill(
        &mut self,
        name: impl Into<String>,
        ggml_type: GgmlType,
        dims: &[u64],
        fill: FillFn,
    ) -> Result<&mut Self> {
        let name = name.into();
        let n_bytes = self.check_tensor(&name, ggml_type, dims)?;
        self.tensors.push(PendingTensor {
            name,
            ggml_type,
            dims: dims.to_vec(),
            n_bytes,
            data: TensorData::Fill(fill),
        });
        Ok(self)
    }

    /// The tensors added so far: name, type and bytes.
    pub fn tensor_sizes(&self) -> Vec<(&str, GgmlType, u64)> {
        self.tensors
            .iter()
            .map(|t| (t.name.as_str(), t.ggml_type, t.n_bytes))
            .collect()
    }

    /// The total size of the file [`GgufWriter::write_file`] would write.
    pub fn file_size(&self) -> u64 {
        let tensors: Vec<&PendingTensor> = self.tensors.iter().collect();
        let header = encode_header(self.version, self.alignment, &self.metadata, &tensors);
        let data: u64 = tensors
            .iter()
            .map(|t| t.n_bytes.div_ceil(self.alignment) * self.alignment)
            .sum();
        header.len() as u64 + data
    }

    /// Writes the whole file to `out`; returns the bytes written.
    ///
    /// # Errors
    ///
    /// Writing fails.
    pub fn write_to(&self, out: &mut dyn Write) -> std::io::Result<u64> {
        let tensors: Vec<&PendingTensor> = self.tensors.iter().collect();
        write_file_body(out, self.version, self.alignment, &self.metadata, &tensors)
    }

    /// The whole file as bytes (for small fixtures).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_to(&mut out)
            .expect("writing to a Vec cannot fail");
        out
    }

    /// Writes the file to `path`.
    ///
    /// # Errors
    ///
    /// The file cannot be created or written.
    pub fn write_file(&self, path: &Path) -> Result<u64> {
        let file = File::create(path).map_err(|e| GgufError::io(path, "create", e))?;
        let mut out = BufWriter::with_capacity(FILL_CHUNK, file);
        let n = self
            .write_to(&mut out)
            .map_err(|e| GgufError::io(path, "write", e))?;
        out.flush().map_err(|e| GgufError::io(path, "write", e))?;
        Ok(n)
    }

    /// Writes the header to `path` and leaves every tensor's data as a hole:
    /// a sparse file of [`GgufWriter::file_size`] bytes whose data reads as
    /// zeros (a real-shape model of hundreds of GiB in a few MiB of disk).
    /// No tensor's bytes or fill function is used. Returns the file size.
    ///
    /// # Errors
    ///
    /// The file cannot be created, written or extended.
    pub fn write_sparse(&self, path: &Path) -> Result<u64> {
        let tensors: Vec<&PendingTensor> = self.tensors.iter().collect();
        let header = encode_header(self.version, self.alignment, &self.metadata, &tensors);
        let size = self.file_size();
        let mut file = File::create(path).map_err(|e| GgufError::io(path, "create", e))?;
        file.write_all(&header)
            .map_err(|e| GgufError::io(path, "write", e))?;
        file.set_len(size)
            .map_err(|e| GgufError::io(path, "extend", e))?;
        Ok(size)
    }

    /// Writes a split model: shards `PREFIX-0000N-of-0000M.gguf` in `dir`,
    /// at most `max_tensors` tensors each, all metadata in the first shard
    /// and `split.no`/`split.count`/`split.tensors.count` in every shard.
    /// Returns the shard paths, first to last.
    ///
    /// # Errors
    ///
    /// `max_tensors` is 0 or a shard cannot be written.
    pub fn write_split(
        &self,
        dir: &Path,
        prefix: &str,
        max_tensors: usize,
    ) -> Result<Vec<PathBuf>> {
        if max_tensors == 0 {
            return Err(unwritable("split", "max_tensors must be at least 1"));
        }
        let groups: Vec<Vec<&PendingTensor>> = self
            .tensors
            .chunks(max_tensors)
            .map(|c| c.iter().collect())
            .collect();
        let groups = if groups.is_empty() {
            vec![Vec::new()]
        } else {
            groups
        };
        let count =
            u16::try_from(groups.len()).map_err(|_| unwritable("split", "too many shards"))?;
        let total = i32::try_from(self.tensors.len())
            .map_err(|_| unwritable("split", "too many tensors"))?;
        let first = dir.join(format!("{prefix}-00001-of-{count:05}.gguf"));
        let mut paths = Vec::with_capacity(groups.len());
        for (i, group) in groups.iter().enumerate() {
            let mut metadata = if i == 0 {
                self.metadata.clone()
            } else if self.alignment != DEFAULT_ALIGNMENT {
                vec![(ALIGNMENT_KEY.to_owned(), Value::U32(self.alignment as u32))]
            } else {
                Vec::new()
            };
            metadata.push((SPLIT_NO_KEY.to_owned(), Value::U16(i as u16)));
            metadata.push((SPLIT_COUNT_KEY.to_owned(), Value::U16(count)));
            metadata.push((SPLIT_TENSORS_COUNT_KEY.to_owned(), Value::I32(total)));
            let path = split_shard_path(&first, prefix, i as u32 + 1, u32::from(count));
            let file = File::create(&path).map_err(|e| GgufError::io(&path, "create", e))?;
            let mut out = BufWriter::with_capacity(FILL_CHUNK, file);
            write_file_body(&mut out, self.version, self.alignment, &metadata, group)
                .and_then(|_| out.flush())
                .map_err(|e| GgufError::io(&path, "write", e))?;
            paths.push(path);
        }
        Ok(paths)
    }
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_array(out: &mut Vec<u8>, a: &Array) {
    out.extend_from_slice(&a.elem_type().id().to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! each {
        ($v:expr) => {
            for x in $v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        Array::U8(v) => out.extend_from_slice(v),
        Array::I8(v) => each!(v),
        Array::U16(v) => each!(v),
        Array::I16(v) => each!(v),
        Array::U32(v) => each!(v),
        Array::I32(v) => each!(v),
        Array::F32(v) => each!(v),
        Array::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
        Array::String(v) => v.iter().for_each(|s| put_string(out, s)),
        Array::U64(v) => each!(v),
        Array::I64(v) => each!(v),
        Array::F64(v) => each!(v),
    }
}

/// Encodes one metadata value (without its type tag).
pub(crate) fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_string(out, s),
        Value::Array(a) => put_array(out, a),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

/// The header (magic to the padded end of the tensor infos).
fn encode_header(
    version: u32,
    alignment: u64,
    metadata: &[(String, Value)],
    tensors: &[&PendingTensor],
) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(b"GGUF");
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata {
        put_string(&mut out, key);
        out.extend_from_slice(&value.value_type().id().to_le_bytes());
        put_value(&mut out, value);
    }
    let mut offset = 0u64;
    for t in tensors {
        put_string(&mut out, &t.name);
        out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&t.ggml_type.id().to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        offset += t.n_bytes.div_ceil(alignment) * alignment;
    }
    let padded = (out.len() as u64).div_ceil(alignment) * alignment;
    out.resize(padded as usize, 0);
    out
}

fn write_file_body(
    out: &mut dyn Write,
    version: u32,
    alignment: u64,
    metadata: &[(String, Value)],
    tensors: &[&PendingTensor],
) -> std::io::Result<u64> {
    let header = encode_header(version, alignment, metadata, tensors);
    out.write_all(&header)?;
    let mut written = header.len() as u64;
    let zeros = vec![0u8; alignment as usize];
    let mut chunk = Vec::new();
    for t in tensors {
        match &t.data {
            TensorData::Bytes(b) => out.write_all(b)?,
            TensorData::Fill(fill) => {
                chunk.resize(FILL_CHUNK.min(t.n_bytes as usize), 0);
                let mut done = 0u64;
                while done < t.n_bytes {
                    let n = (t.n_bytes - done).min(FILL_CHUNK as u64) as usize;
                    fill(done, &mut chunk[..n]);
                    out.write_all(&chunk[..n])?;
                    done += n as u64;
                }
            }
        }
        let pad = t.n_bytes.div_ceil(alignment) * alignment - t.n_bytes;
        out.write_all(&zeros[..pad as usize])?;
        written += t.n_bytes + pad;
    }
    Ok(written)
}
