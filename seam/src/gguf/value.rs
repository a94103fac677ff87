//! GGUF metadata values: the thirteen value types and typed arrays.
//!
//! Arrays keep one typed vector each (`Vec<u8>`, not `Vec<Value>`), so an
//! array never costs more memory than a small multiple of its bytes in the
//! file: a header cannot make the reader allocate much more than it holds.

use serde_json::json;

/// The on-disk value type tag of a metadata value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ValueType {
    /// 0: unsigned 8-bit integer.
    U8,
    /// 1: signed 8-bit integer.
    I8,
    /// 2: unsigned 16-bit integer.
    U16,
    /// 3: signed 16-bit integer.
    I16,
    /// 4: unsigned 32-bit integer.
    U32,
    /// 5: signed 32-bit integer.
    I32,
    /// 6: 32-bit float.
    F32,
    /// 7: boolean stored as one byte.
    Bool,
    /// 8: string (u64 length, UTF-8 bytes, no NUL).
    String,
    /// 9: array (element type, u64 count, elements).
    Array,
    /// 10: unsigned 64-bit integer.
    U64,
    /// 11: signed 64-bit integer.
    I64,
    /// 12: 64-bit float.
    F64,
}

impl ValueType {
    /// The type with this on-disk tag.
    pub fn from_id(id: i32) -> Option<ValueType> {
        Some(match id {
            0 => ValueType::U8,
            1 => ValueType::I8,
            2 => ValueType::U16,
            3 => ValueType::I16,
            4 => ValueType::U32,
            5 => ValueType::I32,
            6 => ValueType::F32,
            7 => ValueType::Bool,
            8 => ValueType::String,
            9 => ValueType::Array,
            10 => ValueType::U64,
            11 => ValueType::I64,
            12 => ValueType::F64,
            _ => return None,
        })
    }

    /// The on-disk tag.
    pub fn id(self) -> i32 {
        match self {
            ValueType::U8 => 0,
            ValueType::I8 => 1,
            ValueType::U16 => 2,
            ValueType::I16 => 3,
            ValueType::U32 => 4,
            ValueType::I32 => 5,
            ValueType::F32 => 6,
            ValueType::Bool => 7,
            ValueType::String => 8,
            ValueType::Array => 9,
            ValueType::U64 => 10,
            ValueType::I64 => 11,
            ValueType::F64 => 12,
        }
    }

    /// The smallest number of bytes one value of this type occupies in a
    /// file (a string's length prefix; an array's type and count). Used to
    /// check a claimed count against the bytes that remain.
    pub fn min_encoded_size(self) -> u64 {
        match self {
            ValueType::U8 | ValueType::I8 | ValueType::Bool => 1,
            ValueType::U16 | ValueType::I16 => 2,
            ValueType::U32 | ValueType::I32 | ValueType::F32 => 4,
            ValueType::U64 | ValueType::I64 | ValueType::F64 | ValueType::String => 8,
            ValueType::Array => 12,
        }
    }

    /// The name gguf-py uses (`"UINT8"`, `"STRING"`).
    pub fn name(self) -> &'static str {
        match self {
            ValueType::U8 => "UINT8",
            ValueType::I8 => "INT8",
            ValueType::U16 => "UINT16",
            ValueType::I16 => "INT16",
            ValueType::U32 => "UINT32",
            ValueType::I32 => "INT32",
            ValueType::F32 => "FLOAT32",
            ValueType::Bool => "BOOL",
            ValueType::String => "STRING",
            ValueType::Array => "ARRAY",
            ValueType::U64 => "UINT64",
            ValueType::I64 => "INT64",
            ValueType::F64 => "FLOAT64",
        }
    }
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// UINT8.
    U8(u8),
    /// INT8.
    I8(i8),
    /// UINT16.
    U16(u16),
    /// INT16.
    I16(i16),
    /// UINT32.
    U32(u32),
    /// INT32.
    I32(i32),
    /// FLOAT32.
    F32(f32),
    /// BOOL.
    Bool(bool),
    /// STRING.
    String(String),
    /// ARRAY of one element type.
    Array(Array),
    /// UINT64.
    U64(u64),
    /// INT64.
    I64(i64),
    /// FLOAT64.
    F64(f64),
}

/// A metadata array: one typed vector per element type. Arrays of arrays do
/// not exist in GGUF (the reference rejects them, and so does this reader).
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    /// Array of UINT8.
    U8(Vec<u8>),
    /// Array of INT8.
    I8(Vec<i8>),
    /// Array of UINT16.
    U16(Vec<u16>),
    /// Array of INT16.
    I16(Vec<i16>),
    /// Array of UINT32.
    U32(Vec<u32>),
    /// Array of INT32.
    I32(Vec<i32>),
    /// Array of FLOAT32.
    F32(Vec<f32>),
    /// Array of BOOL.
    Bool(Vec<bool>),
    /// Array of STRING.
    String(Vec<String>),
    /// Array of UINT64.
    U64(Vec<u64>),
    /// Array of INT64.
    I64(Vec<i64>),
    /// Array of FLOAT64.
    F64(Vec<f64>),
}

impl Array {
    /// The element type.
    pub fn elem_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn to_json(&self) -> serde_json::Value {
        match self {
            Array::U8(v) => json!(v),
            Array::I8(v) => json!(v),
            Array::U16(v) => json!(v),
            Array::I16(v) => json!(v),
            Array::U32(v) => json!(v),
            Array::I32(v) => json!(v),
            Array::F32(v) => v.iter().map(|&x| float_json(f64::from(x))).collect(),
            Array::Bool(v) => json!(v),
            Array::String(v) => json!(v),
            Array::U64(v) => json!(v),
            Array::I64(v) => json!(v),
            Array::F64(v) => v.iter().map(|&x| float_json(x)).collect(),
        }
    }
}

/// A float as JSON: a number when finite, else the string `"NaN"`,
/// `"Infinity"` or `"-Infinity"` (JSON has no such numbers, and `null`
/// would lose that there was a value at all).
fn float_json(x: f64) -> serde_json::Value {
    match non_finite_name(x) {
        Some(name) => json!(name),
        None => json!(x),
    }
}

fn non_finite_name(x: f64) -> Option<&'static str> {
    if x.is_nan() {
        Some("NaN")
    } else if x == f64::INFINITY {
        Some("Infinity")
    } else if x == f64::NEG_INFINITY {
        Some("-Infinity")
    } else {
        None
    }
}

/// An `f32` serialized as the `f64` it widens to exactly (what gguf-py's
/// reader gives, so outside checks compare equal); non-finite values as
/// [`float_json`] names them.
struct F32(f32);

impl serde::Serialize for F32 {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        F64(f64::from(self.0)).serialize(s)
    }
}

/// An `f64`, non-finite values named.
struct F64(f64);

impl serde::Serialize for F64 {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match non_finite_name(self.0) {
            Some(name) => s.serialize_str(name),
            None => s.serialize_f64(self.0),
        }
    }
}

impl Value {
    /// The value's type tag.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// The type as gguf-py names it, arrays as `ARRAY[ELEM]`.
    pub fn type_name(&self) -> String {
        match self {
            Value::Array(a) => format!("ARRAY[{}]", a.elem_type().name()),
            v => v.value_type().name().to_string(),
        }
    }

    /// The value as an unsigned integer, if it is a non-negative integer of
    /// any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a string slice, if it is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as JSON (non-finite floats become the strings `"NaN"`,
    /// `"Infinity"`, `"-Infinity"`).
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Value::U8(v) => json!(v),
            Value::I8(v) => json!(v),
            Value::U16(v) => json!(v),
            Value::I16(v) => json!(v),
            Value::U32(v) => json!(v),
            Value::I32(v) => json!(v),
            Value::F32(v) => float_json(f64::from(*v)),
            Value::Bool(v) => json!(v),
            Value::String(v) => json!(v),
            Value::Array(a) => a.to_json(),
            Value::U64(v) => json!(v),
            Value::I64(v) => json!(v),
            Value::F64(v) => float_json(*v),
        }
    }
}

/// Serializes like [`Value::to_json`] without building a JSON tree (a
/// tokenizer's arrays hold hundreds of thousands of strings): f32 values are
/// widened to f64 (exactly), non-finite floats written as strings.
impl serde::Serialize for Value {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::U8(v) => s.serialize_u8(*v),
            Value::I8(v) => s.serialize_i8(*v),
            Value::U16(v) => s.serialize_u16(*v),
            Value::I16(v) => s.serialize_i16(*v),
            Value::U32(v) => s.serialize_u32(*v),
            Value::I32(v) => s.serialize_i32(*v),
            Value::F32(v) => F32(*v).serialize(s),
            Value::Bool(v) => s.serialize_bool(*v),
            Value::String(v) => s.serialize_str(v),
            Value::Array(a) => a.serialize(s),
            Value::U64(v) => s.serialize_u64(*v),
            Value::I64(v) => s.serialize_i64(*v),
            Value::F64(v) => F64(*v).serialize(s),
        }
    }
}

impl serde::Serialize for Array {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Array::U8(v) => s.collect_seq(v),
            Array::I8(v) => s.collect_seq(v),
            Array::U16(v) => s.collect_seq(v),
            Array::I16(v) => s.collect_seq(v),
            Array::U32(v) => s.collect_seq(v),
            Array::I32(v) => s.collect_seq(v),
            Array::F32(v) => s.collect_seq(v.iter().map(|&x| F32(x))),
            Array::Bool(v) => s.collect_seq(v),
            Array::String(v) => s.collect_seq(v),
            Array::U64(v) => s.collect_seq(v),
            Array::I64(v) => s.collect_seq(v),
            Array::F64(v) => s.collect_seq(v.iter().map(|&x| F64(x))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Array, Value};

    /// Streaming serialization writes exactly what the JSON tree holds.
    #[test]
    fn serialize_matches_to_json() {
        let values = [
            Value::U8(7),
            Value::I8(-3),
            Value::U16(65535),
            Value::I16(-2),
            Value::U32(1),
            Value::I32(-1),
            Value::F32(0.1),
            Value::F32(f32::NAN),
            Value::Bool(true),
            Value::String("π \"q\"".into()),
            Value::U64(u64::MAX),
            Value::I64(i64::MIN),
            Value::F64(-0.0),
            Value::Array(Array::F32(vec![0.1, 2.5, f32::INFINITY])),
            Value::Array(Array::String(vec!["a".into(), "".into()])),
            Value::Array(Array::Bool(vec![])),
            Value::Array(Array::I16(vec![-1, 2])),
        ];
        for v in &values {
            assert_eq!(serde_json::to_value(v).unwrap(), v.to_json(), "{v:?}");
        }
    }

    /// Floats are numbers (an f32 widened exactly, as gguf-py reads it) and
    /// non-finite values are named, not `null`.
    #[test]
    fn floats_are_numbers_and_non_finite_values_strings() {
        let text = |v: &Value| serde_json::to_string(v).unwrap();
        assert_eq!(text(&Value::F32(0.5)), "0.5");
        assert_eq!(text(&Value::F32(0.1)), "0.10000000149011612");
        assert_eq!(text(&Value::F64(0.1)), "0.1");
        assert_eq!(text(&Value::F32(f32::NAN)), "\"NaN\"");
        assert_eq!(text(&Value::F64(f64::NEG_INFINITY)), "\"-Infinity\"");
        assert_eq!(
            text(&Value::Array(Array::F32(vec![1.5, f32::INFINITY]))),
            "[1.5,\"Infinity\"]"
        );
        assert_eq!(Value::F32(f32::NAN).to_json(), serde_json::json!("NaN"));
    }
}
