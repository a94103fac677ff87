//! The GGUF header parser: header, metadata and tensor infos, validated
//! before anything they claim is allocated.
//!
//! The parser reads from the mapped bytes through a cursor that knows how
//! many bytes remain, so every count and length is checked against the file
//! before it sizes an allocation, and every error names the byte offset and
//! the field. It touches only the header pages: tensor data is never read.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use super::error::{GgufError, GgufErrorKind, Result};
use super::types::GgmlType;
use super::value::{Array, Value, ValueType};

/// The reference implementation's cap on a string's bytes or an array's
/// elements.
pub const MAX_STRING_OR_ARRAY_LEN: u64 = 1 << 30;
/// ggml's `GGML_MAX_NAME`: names hold at most 63 bytes plus a NUL.
pub const MAX_TENSOR_NAME_LEN: u64 = 63;
/// ggml's `GGML_MAX_DIMS`.
pub const MAX_DIMS: u32 = 4;
/// The alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The metadata key holding the data alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";

/// The smallest tensor info in bytes: name length (8) + n_dims (4) + type
/// (4) + offset (8), with an empty name and no dims.
const MIN_TENSOR_INFO_SIZE: u64 = 24;
/// The smallest metadata pair: key length (8) + one key byte + type (4) +
/// a one-byte value.
const MIN_KV_SIZE: u64 = 14;
/// The most items reserved up front for a claimed count. A count is only
/// checked against the bytes that remain, and in-memory items are several
/// times larger than their smallest encoding: reserving what a header
/// claims would let a large (or sparse) file ask for more memory than it
/// holds. Past this, vectors grow as items are actually read.
const MAX_PREALLOC: u64 = 1 << 16;

/// The capacity to reserve for `count` claimed items.
fn prealloc(count: u64) -> usize {
    count.min(MAX_PREALLOC) as usize
}

/// One tensor's entry in the tensor table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor's name.
    pub name: String,
    /// The element type.
    pub ggml_type: GgmlType,
    /// Dimensions in GGUF order (ne0, the innermost, first).
    pub dims: Vec<u64>,
    /// Absolute byte offset of the data in its file.
    pub offset: u64,
    /// Bytes of data.
    pub n_bytes: u64,
    /// The shard (0 for a single file).
    pub split: usize,
}

impl TensorInfo {
    /// Dimensions in row-major (torch) order: the reverse of GGUF order.
    pub fn shape_row_major(&self) -> Vec<u64> {
        self.dims.iter().rev().copied().collect()
    }

    /// The number of elements.
    pub fn n_elements(&self) -> u64 {
        // Validated at parse time not to overflow.
        self.dims.iter().product()
    }
}

/// The parsed header of one GGUF file.
#[derive(Clone, Debug)]
pub struct Header {
    /// The format version (2 or 3).
    pub version: u32,
    /// Metadata pairs in file order.
    pub metadata: Vec<(String, Value)>,
    /// Index of each key in `metadata`.
    pub(crate) key_index: HashMap<String, usize>,
    /// The tensor table in file order, offsets absolute.
    pub tensors: Vec<TensorInfo>,
    /// The data alignment.
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_offset: u64,
}

impl Header {
    /// The metadata value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    file: &'a Path,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn err(&self, at: usize, field: impl Into<String>, kind: GgufErrorKind) -> GgufError {
        GgufError::new(self.file, at as u64, field, kind)
    }

    fn take(&mut self, n: u64, field: &dyn Fn() -> String) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.err(
                self.pos,
                field(),
                GgufErrorKind::Truncated {
                    need: n,
                    have: self.remaining(),
                },
            ));
        }
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.buf[start..self.pos])
    }

    fn array<const N: usize>(&mut self, field: &dyn Fn() -> String) -> Result<[u8; N]> {
        let bytes = self.take(N as u64, field)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    fn u32(&mut self, field: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    fn i32(&mut self, field: &dyn Fn() -> String) -> Result<i32> {
        Ok(i32::from_le_bytes(self.array(field)?))
    }

    fn u64(&mut self, field: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    /// A bool: one byte, 0 or 1 (the format's only two values; anything
    /// else is a corrupt or hostile file, not "true").
    fn bool(&mut self, field: &dyn Fn() -> String) -> Result<bool> {
        let at = self.pos;
        match self.array::<1>(field)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(self.err(
                at,
                field(),
                GgufErrorKind::BadValue(format!("bool of value {b} (0 or 1 only)")),
            )),
        }
    }

    fn i64(&mut self, field: &dyn Fn() -> String) -> Result<i64> {
        Ok(i64::from_le_bytes(self.array(field)?))
    }

    /// Checks that `count` items of at least `min_size` bytes each fit in
    /// what remains; `at` is where the count was read.
    fn check_count(
        &self,
        at: usize,
        count: u64,
        min_size: u64,
        field: &dyn Fn() -> String,
    ) -> Result<()> {
        let need = count.saturating_mul(min_size);
        if need > self.remaining() {
            return Err(self.err(
                at,
                field(),
                GgufErrorKind::CountTooLarge {
                    count,
                    need,
                    have: self.remaining(),
                },
            ));
        }
        Ok(())
    }

    fn string(&mut self, field: &dyn Fn() -> String) -> Result<String> {
        let at = self.pos;
        let len = self.u64(&|| format!("{} length", field()))?;
        if len > MAX_STRING_OR_ARRAY_LEN {
            return Err(self.err(at, field(), GgufErrorKind::LengthLimit(len)));
        }
        let bytes = self.take(len, field)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(self.err(at + 8, field(), GgufErrorKind::InvalidUtf8)),
        }
    }

    fn value_type(&mut self, field: &dyn Fn() -> String) -> Result<ValueType> {
        let at = self.pos;
        let id = self.i32(field)?;
        ValueType::from_id(id)
            .ok_or_else(|| self.err(at, field(), GgufErrorKind::UnknownValueType(id)))
    }

    fn scalar(&mut self, ty: ValueType, field: &dyn Fn() -> String) -> Result<Value> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(field)?[0]),
            ValueType::I8 => Value::I8(self.array::<1>(field)?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(field)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(field)?)),
            ValueType::U32 => Value::U32(self.u32(field)?),
            ValueType::I32 => Value::I32(self.i32(field)?),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(field)?)),
            ValueType::Bool => Value::Bool(self.bool(field)?),
            ValueType::String => Value::String(self.string(field)?),
            ValueType::U64 => Value::U64(self.u64(field)?),
            ValueType::I64 => Value::I64(self.i64(field)?),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(field)?)),
            ValueType::Array => unreachable!("arrays are read by `value`"),
        })
    }

    fn value(&mut self, ty: ValueType, field: &dyn Fn() -> String) -> Result<Value> {
        if ty != ValueType::Array {
            return self.scalar(ty, field);
        }
        let elem_at = self.pos;
        let elem = self.value_type(&|| format!("{} array element type", field()))?;
        if elem == ValueType::Array {
            return Err(self.err(elem_at, field(), GgufErrorKind::NestedArray));
        }
        let count_at = self.pos;
        let count_field = || format!("{} array count", field());
        let count = self.u64(&count_field)?;
        if count > MAX_STRING_OR_ARRAY_LEN {
            return Err(self.err(count_at, count_field(), GgufErrorKind::LengthLimit(count)));
        }
        self.check_count(count_at, count, elem.min_encoded_size(), &count_field)?;
        let n = count as usize;
        macro_rules! read_vec {
            ($variant:ident, $read:expr) => {{
                let mut v = Vec::with_capacity(prealloc(count));
                for i in 0..n {
                    let item_field = || format!("{}[{}]", field(), i);
                    v.push($read(&mut *self, &item_field as &dyn Fn() -> String)?);
                }
                Array::$variant(v)
            }};
        }
        type C<'b, 'c> = &'b mut Cursor<'c>;
        let array = match elem {
            ValueType::U8 => read_vec!(U8, |c: C, f| c.array::<1>(f).map(|b| b[0])),
            ValueType::I8 => read_vec!(I8, |c: C, f| c.array::<1>(f).map(|b| b[0] as i8)),
            ValueType::U16 => read_vec!(U16, |c: C, f| c.array(f).map(u16::from_le_bytes)),
            ValueType::I16 => read_vec!(I16, |c: C, f| c.array(f).map(i16::from_le_bytes)),
            ValueType::U32 => read_vec!(U32, |c: C, f| c.u32(f)),
            ValueType::I32 => read_vec!(I32, |c: C, f| c.i32(f)),
            ValueType::F32 => read_vec!(F32, |c: C, f| c.array(f).map(f32::from_le_bytes)),
            ValueType::Bool => read_vec!(Bool, |c: C, f| c.bool(f)),
            ValueType::String => read_vec!(String, |c: C, f| c.string(f)),
            ValueType::U64 => read_vec!(U64, |c: C, f| c.u64(f)),
            ValueType::I64 => read_vec!(I64, |c: C, f| c.i64(f)),
            ValueType::F64 => read_vec!(F64, |c: C, f| c.array(f).map(f64::from_le_bytes)),
            ValueType::Array => unreachable!("nested arrays rejected above"),
        };
        Ok(Value::Array(array))
    }
}

/// Parses and validates the header of a GGUF file held in `buf` (the whole
/// file, typically a mapping). `file` names the file in errors; `split` is
/// recorded in each tensor info.
///
/// # Errors
///
/// Any malformed field, with its offset and name.
pub fn parse_header(buf: &[u8], file: &Path, split: usize) -> Result<Header> {
    let mut c = Cursor { buf, pos: 0, file };
    let magic: [u8; 4] = c.array(&|| "magic".into())?;
    if &magic != b"GGUF" {
        return Err(c.err(0, "magic", GgufErrorKind::BadMagic(magic)));
    }
    let version = c.u32(&|| "version".into())?;
    if !(2..=3).contains(&version) {
        return Err(c.err(4, "version", GgufErrorKind::UnsupportedVersion(version)));
    }
    let tensor_count_at = c.pos;
    let tensor_count = c.u64(&|| "tensor_count".into())?;
    let kv_count_at = c.pos;
    let kv_count = c.u64(&|| "metadata_kv_count".into())?;
    c.check_count(kv_count_at, kv_count, MIN_KV_SIZE, &|| {
        "metadata_kv_count".into()
    })?;
    // Tensor infos follow the metadata, so both must fit together; the
    // tensor count is checked again once the metadata has been read.
    c.check_count(tensor_count_at, tensor_count, MIN_TENSOR_INFO_SIZE, &|| {
        "tensor_count".into()
    })?;

    let mut metadata = Vec::with_capacity(prealloc(kv_count));
    let mut key_index = HashMap::with_capacity(prealloc(kv_count));
    // Where the alignment's value type tag is, for its error.
    let mut alignment_at = 0;
    for i in 0..kv_count {
        let key_at = c.pos;
        let key = c.string(&|| format!("metadata[{i}] key"))?;
        if key.is_empty() {
            return Err(c.err(
                key_at,
                format!("metadata[{i}] key"),
                GgufErrorKind::EmptyKey,
            ));
        }
        if key_index.contains_key(&key) {
            return Err(c.err(
                key_at,
                format!("metadata[{i}] key"),
                GgufErrorKind::DuplicateKey(key),
            ));
        }
        if key == ALIGNMENT_KEY {
            alignment_at = c.pos;
        }
        let ty = c.value_type(&|| format!("metadata[{i}] {key:?} type"))?;
        let value = c.value(ty, &|| format!("metadata[{i}] {key:?} value"))?;
        key_index.insert(key.clone(), metadata.len());
        metadata.push((key, value));
    }

    let alignment = match key_index.get(ALIGNMENT_KEY).map(|&i| &metadata[i].1) {
        None => DEFAULT_ALIGNMENT,
        Some(Value::U32(a)) if *a != 0 && a.is_power_of_two() => u64::from(*a),
        Some(other) => {
            // Strings and arrays are shown by size: the error is one line.
            let shown = match other {
                Value::String(s) => format!("STRING of {} bytes", s.len()),
                Value::Array(a) => format!("{} of {} elements", other.type_name(), a.len()),
                v => format!("{} {}", v.type_name(), v.to_json()),
            };
            return Err(c.err(
                alignment_at,
                format!("metadata {ALIGNMENT_KEY:?}"),
                GgufErrorKind::BadAlignment(shown),
            ));
        }
    };

    c.check_count(tensor_count_at, tensor_count, MIN_TENSOR_INFO_SIZE, &|| {
        "tensor_count".into()
    })?;
    let mut names = HashSet::with_capacity(prealloc(tensor_count));
    // Where each tensor's offset field is, for errors found once the data
    // section's start is known.
    let mut raw = Vec::with_capacity(prealloc(tensor_count));
    let mut tensors = Vec::with_capacity(prealloc(tensor_count));
    for i in 0..tensor_count {
        let name_at = c.pos;
        let name = c.string(&|| format!("tensor[{i}] name"))?;
        let field = |what: &str| format!("tensor[{i}] {name:?} {what}");
        if name.len() as u64 > MAX_TENSOR_NAME_LEN {
            return Err(c.err(
                name_at,
                field("name"),
                GgufErrorKind::NameTooLong(name.len() as u64),
            ));
        }
        if !names.insert(name.clone()) {
            return Err(c.err(name_at, field("name"), GgufErrorKind::DuplicateName(name)));
        }
        let n_dims_at = c.pos;
        let n_dims = c.u32(&|| field("n_dims"))?;
        if n_dims > MAX_DIMS {
            return Err(c.err(
                n_dims_at,
                field("n_dims"),
                GgufErrorKind::TooManyDims(n_dims),
            ));
        }
        let dims_at = c.pos;
        let mut dims_raw = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            let at = c.pos;
            let ne = c.i64(&|| field(&format!("dims[{d}]")))?;
            if ne < 0 {
                return Err(c.err(
                    at,
                    field(&format!("dims[{d}]")),
                    GgufErrorKind::NegativeDim(ne),
                ));
            }
            dims_raw.push(ne);
        }
        let dims: Vec<u64> = dims_raw.iter().map(|&d| d as u64).collect();
        if dims
            .iter()
            .try_fold(1i64, |acc, &d| acc.checked_mul(d as i64))
            .is_none()
        {
            return Err(c.err(
                dims_at,
                field("dims"),
                GgufErrorKind::DimsOverflow(dims_raw),
            ));
        }
        let type_at = c.pos;
        let type_id = c.i32(&|| field("type"))?;
        let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| {
            c.err(
                type_at,
                field("type"),
                GgufErrorKind::UnknownGgmlType(type_id),
            )
        })?;
        let ne0 = dims.first().copied().unwrap_or(1);
        let row_bytes = ggml_type.row_bytes(ne0).ok_or_else(|| {
            c.err(
                dims_at,
                field("dims[0]"),
                GgufErrorKind::NotBlockMultiple {
                    ne0,
                    ty: ggml_type.name(),
                    block: ggml_type.block_size(),
                },
            )
        })?;
        let n_bytes = dims
            .iter()
            .skip(1)
            .try_fold(row_bytes, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| {
                c.err(
                    dims_at,
                    field("dims"),
                    GgufErrorKind::DimsOverflow(dims_raw.clone()),
                )
            })?;
        let offset_at = c.pos;
        let offset = c.u64(&|| field("offset"))?;
        if !offset.is_multiple_of(alignment) {
            return Err(c.err(
                offset_at,
                field("offset"),
                GgufErrorKind::MisalignedOffset { offset, alignment },
            ));
        }
        raw.push(offset_at);
        tensors.push(TensorInfo {
            name,
            ggml_type,
            dims,
            offset,
            n_bytes,
            split,
        });
    }

    let data_offset = (c.pos as u64).div_ceil(alignment) * alignment;
    let file_len = buf.len() as u64;
    for (t, &offset_at) in tensors.iter_mut().zip(&raw) {
        let start = data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        match (start, end) {
            (Some(start), Some(end)) if end <= file_len => t.offset = start,
            _ => {
                return Err(GgufError::new(
                    file,
                    offset_at as u64,
                    format!("tensor {:?} offset", t.name),
                    GgufErrorKind::OutOfRange {
                        start: start.unwrap_or(u64::MAX),
                        end: end.unwrap_or(u64::MAX),
                        file_len,
                    },
                ));
            }
        }
    }
    check_no_overlap(&tensors, &raw, file)?;

    Ok(Header {
        version,
        metadata,
        key_index,
        tensors,
        alignment,
        data_offset,
    })
}

/// Fails when two tensors with data share a byte.
fn check_no_overlap(tensors: &[TensorInfo], offset_fields: &[usize], file: &Path) -> Result<()> {
    let mut order: Vec<usize> = (0..tensors.len())
        .filter(|&i| tensors[i].n_bytes > 0)
        .collect();
    order.sort_by_key(|&i| tensors[i].offset);
    for pair in order.windows(2) {
        let (a, b) = (&tensors[pair[0]], &tensors[pair[1]]);
        if b.offset < a.offset + a.n_bytes {
            return Err(GgufError::new(
                file,
                offset_fields[pair[1]] as u64,
                format!("tensor {:?} offset", b.name),
                GgufErrorKind::Overlap {
                    other: a.name.clone(),
                },
            ));
        }
    }
    Ok(())
}
