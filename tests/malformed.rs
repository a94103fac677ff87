//! Malformed GGUF files: a corpus built in code, each case breaking one
//! field of an otherwise valid file. For each, `seam inspect` (table and
//! `--json`) must exit with status 2 and print exactly one line naming the
//! file, the byte offset and the field, and `GgufModel::open` must return
//! the matching error kind at the same offset and field.
//!
//! The files come from a small raw builder ([`Spec`]) that records where
//! every field starts, so each case computes its expected offset instead of
//! hard-coding it; `base_is_valid_and_matches_the_writer` checks that the
//! builder writes the very bytes `GgufWriter` writes for the base file.

use std::path::Path;
use std::process::Command;

use seam::borrow::MapOptions;
use seam::gguf::{Array, GgmlType, GgufErrorKind, GgufModel, GgufWriter, Value};

// Metadata value type tags.
const T_U8: i32 = 0;
const T_I8: i32 = 1;
const T_U16: i32 = 2;
const T_I16: i32 = 3;
const T_U32: i32 = 4;
const T_I32: i32 = 5;
const T_F32: i32 = 6;
const T_BOOL: i32 = 7;
const T_STRING: i32 = 8;
const T_ARRAY: i32 = 9;
const T_U64: i32 = 10;
const T_I64: i32 = 11;
const T_F64: i32 = 12;

/// ggml type ids used by the base file.
const GGML_F32: i32 = 0;
const GGML_Q4_0: i32 = 2;

/// A metadata pair, encoded raw (the value without its type tag).
#[derive(Clone)]
struct Kv {
    key: Vec<u8>,
    ty: i32,
    value: Vec<u8>,
}

/// A tensor info, raw: any n_dims, dims, type id and offset.
#[derive(Clone)]
struct Tensor {
    name: Vec<u8>,
    n_dims: u32,
    dims: Vec<i64>,
    ty: i32,
    offset: u64,
}

/// A GGUF file as raw fields; counts default to the lengths of the lists.
#[derive(Clone)]
struct Spec {
    magic: [u8; 4],
    version: u32,
    tensor_count: Option<u64>,
    kv_count: Option<u64>,
    kvs: Vec<Kv>,
    tensors: Vec<Tensor>,
    /// Zero bytes after the header, which is padded to 32.
    data_len: usize,
}

/// Where the fields of one metadata pair start.
struct KvAt {
    key: usize,
    ty: usize,
    value: usize,
}

/// Where the fields of one tensor info start.
struct TensorAt {
    name: usize,
    n_dims: usize,
    dims: usize,
    ty: usize,
    offset: usize,
}

/// A built file and where its fields are.
struct Built {
    bytes: Vec<u8>,
    keys: Vec<String>,
    kv: Vec<KvAt>,
    names: Vec<String>,
    t: Vec<TensorAt>,
    data_offset: usize,
}

fn string(s: &[u8]) -> Vec<u8> {
    let mut out = (s.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(s);
    out
}

fn array(elem: i32, count: u64, elems: &[u8]) -> Vec<u8> {
    let mut out = elem.to_le_bytes().to_vec();
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(elems);
    out
}

fn kv(key: &str, ty: i32, value: impl Into<Vec<u8>>) -> Kv {
    Kv {
        key: key.as_bytes().to_vec(),
        ty,
        value: value.into(),
    }
}

const PADDING: &str = "The first pair is long, so that the metadata count still fits \
    in what remains when a later field is truncated: each case then fails at \
    the field it names and not at the count. The first tensor's long name \
    does the same for the tensor count, so truncated tensor fields are in \
    the second tensor.";
const T0: &str = "token_embd.weight.with.a.long.name.for.the.count.check";
const T1: &str = "blk.0.attn_q.weight";

/// The valid base file: one pair of every value type, a string array, an
/// F32 tensor of 32 bytes and a Q4_0 tensor of 36 bytes.
fn base() -> Spec {
    let strings = [string(b"a"), string(b"bc")].concat();
    Spec {
        magic: *b"GGUF",
        version: 3,
        tensor_count: None,
        kv_count: None,
        kvs: vec![
            kv("general.description", T_STRING, string(PADDING.as_bytes())),
            kv("test.u8", T_U8, [7u8]),
            kv("test.i8", T_I8, (-7i8).to_le_bytes()),
            kv("test.u16", T_U16, 1616u16.to_le_bytes()),
            kv("test.i16", T_I16, (-1616i16).to_le_bytes()),
            kv("test.u32", T_U32, 323232u32.to_le_bytes()),
            kv("test.i32", T_I32, (-323232i32).to_le_bytes()),
            kv("test.f32", T_F32, 0.5f32.to_le_bytes()),
            kv("test.bool", T_BOOL, [1u8]),
            kv("test.string", T_STRING, string(b"hello")),
            kv(
                "test.array",
                T_ARRAY,
                array(T_U32, 3, &[1u32, 2, 3].map(u32::to_le_bytes).concat()),
            ),
            kv("test.u64", T_U64, 646464u64.to_le_bytes()),
            kv("test.i64", T_I64, (-646464i64).to_le_bytes()),
            kv("test.f64", T_F64, 0.25f64.to_le_bytes()),
            kv("test.strings", T_ARRAY, array(T_STRING, 2, &strings)),
        ],
        tensors: vec![
            Tensor {
                name: T0.as_bytes().to_vec(),
                n_dims: 2,
                dims: vec![4, 2],
                ty: GGML_F32,
                offset: 0,
            },
            Tensor {
                name: T1.as_bytes().to_vec(),
                n_dims: 2,
                dims: vec![32, 2],
                ty: GGML_Q4_0,
                offset: 32,
            },
        ],
        // 32 bytes of F32, then 36 of Q4_0 padded to 64.
        data_len: 96,
    }
}

/// The base file written by the real writer.
fn base_by_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add_metadata("general.description", Value::String(PADDING.into()))
        .add_metadata("test.u8", Value::U8(7))
        .add_metadata("test.i8", Value::I8(-7))
        .add_metadata("test.u16", Value::U16(1616))
        .add_metadata("test.i16", Value::I16(-1616))
        .add_metadata("test.u32", Value::U32(323232))
        .add_metadata("test.i32", Value::I32(-323232))
        .add_metadata("test.f32", Value::F32(0.5))
        .add_metadata("test.bool", Value::Bool(true))
        .add_metadata("test.string", Value::String("hello".into()))
        .add_metadata("test.array", Value::Array(Array::U32(vec![1, 2, 3])))
        .add_metadata("test.u64", Value::U64(646464))
        .add_metadata("test.i64", Value::I64(-646464))
        .add_metadata("test.f64", Value::F64(0.25))
        .add_metadata(
            "test.strings",
            Value::Array(Array::String(vec!["a".into(), "bc".into()])),
        );
    w.add_tensor(T0, GgmlType::F32, &[4, 2], vec![0; 32])
        .unwrap()
        .add_tensor(T1, GgmlType::Q4_0, &[32, 2], vec![0; 36])
        .unwrap();
    w
}

impl Spec {
    fn build(&self) -> Built {
        let mut out = Vec::new();
        out.extend_from_slice(&self.magic);
        out.extend_from_slice(&self.version.to_le_bytes());
        let tensor_count = self.tensor_count.unwrap_or(self.tensors.len() as u64);
        out.extend_from_slice(&tensor_count.to_le_bytes());
        let kv_count = self.kv_count.unwrap_or(self.kvs.len() as u64);
        out.extend_from_slice(&kv_count.to_le_bytes());
        let mut kv = Vec::new();
        for p in &self.kvs {
            let key = out.len();
            out.extend_from_slice(&string(&p.key));
            let ty = out.len();
            out.extend_from_slice(&p.ty.to_le_bytes());
            let value = out.len();
            out.extend_from_slice(&p.value);
            kv.push(KvAt { key, ty, value });
        }
        let mut t = Vec::new();
        for x in &self.tensors {
            let name = out.len();
            out.extend_from_slice(&string(&x.name));
            let n_dims = out.len();
            out.extend_from_slice(&x.n_dims.to_le_bytes());
            let dims = out.len();
            for d in &x.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            let ty = out.len();
            out.extend_from_slice(&x.ty.to_le_bytes());
            let offset = out.len();
            out.extend_from_slice(&x.offset.to_le_bytes());
            t.push(TensorAt {
                name,
                n_dims,
                dims,
                ty,
                offset,
            });
        }
        let data_offset = out.len().div_ceil(32) * 32;
        out.resize(data_offset + self.data_len, 0);
        Built {
            bytes: out,
            keys: self
                .kvs
                .iter()
                .map(|p| String::from_utf8_lossy(&p.key).into_owned())
                .collect(),
            kv,
            names: self
                .tensors
                .iter()
                .map(|x| String::from_utf8_lossy(&x.name).into_owned())
                .collect(),
            t,
            data_offset,
        }
    }

    fn kv_mut(&mut self, key: &str) -> &mut Kv {
        self.kvs
            .iter_mut()
            .find(|p| p.key == key.as_bytes())
            .unwrap()
    }
}

impl Built {
    /// The index of a metadata key.
    fn k(&self, key: &str) -> usize {
        self.keys.iter().position(|k| k == key).unwrap()
    }

    /// Where the pair `key` is.
    fn at(&self, key: &str) -> &KvAt {
        &self.kv[self.k(key)]
    }

    /// The parser's name of a part of pair `key`: `metadata[i] "key" what`.
    fn kv_field(&self, key: &str, what: &str) -> String {
        format!("metadata[{}] {key:?} {what}", self.k(key))
    }

    /// The parser's name of a part of tensor `i`: `tensor[i] "name" what`.
    fn t_field(&self, i: usize, what: &str) -> String {
        format!("tensor[{i}] {:?} {what}", self.names[i])
    }

    /// The field of a tensor whose data range is wrong.
    fn range_field(&self, i: usize) -> String {
        format!("tensor {:?} offset", self.names[i])
    }

    /// The bytes up to (not including) `end`.
    fn cut(&self, end: usize) -> Vec<u8> {
        self.bytes[..end].to_vec()
    }

    /// The bytes with `new` written at `at`.
    fn patched(&self, at: usize, new: &[u8]) -> Vec<u8> {
        let mut b = self.bytes.clone();
        b[at..at + new.len()].copy_from_slice(new);
        b
    }
}

type KindCheck = Box<dyn Fn(&GgufErrorKind) -> bool>;

macro_rules! kind {
    ($($p:tt)*) => {
        Box::new(move |k: &GgufErrorKind| matches!(k, GgufErrorKind::$($p)*)) as KindCheck
    };
}

/// One malformed file and the error it must produce.
struct Case {
    name: String,
    bytes: Vec<u8>,
    /// The file is extended (sparsely) to this length after writing.
    sparse_len: Option<u64>,
    field: String,
    offset: usize,
    kind: KindCheck,
}

struct Corpus(Vec<Case>);

impl Corpus {
    fn add(
        &mut self,
        name: &str,
        bytes: Vec<u8>,
        field: impl Into<String>,
        offset: usize,
        kind: KindCheck,
    ) {
        assert!(
            !self.0.iter().any(|c| c.name == name),
            "duplicate case {name}"
        );
        self.0.push(Case {
            name: name.into(),
            bytes,
            sparse_len: None,
            field: field.into(),
            offset,
            kind,
        });
    }
}

/// Builds `base()` changed by `f`.
fn with(f: impl FnOnce(&mut Spec)) -> Built {
    let mut s = base();
    f(&mut s);
    s.build()
}

fn truncation_cases(c: &mut Corpus) {
    let b = base().build();
    c.add(
        "empty",
        Vec::new(),
        "magic",
        0,
        kind!(Truncated { need: 4, have: 0 }),
    );
    c.add(
        "trunc_magic",
        b.cut(2),
        "magic",
        0,
        kind!(Truncated { need: 4, have: 2 }),
    );
    c.add(
        "trunc_version",
        b.cut(6),
        "version",
        4,
        kind!(Truncated { need: 4, have: 2 }),
    );
    c.add(
        "trunc_tensor_count",
        b.cut(12),
        "tensor_count",
        8,
        kind!(Truncated { need: 8, have: 4 }),
    );
    c.add(
        "trunc_kv_count",
        b.cut(20),
        "metadata_kv_count",
        16,
        kind!(Truncated { need: 8, have: 4 }),
    );

    let u8at = b.at("test.u8");
    c.add(
        "trunc_key_length",
        b.cut(u8at.key + 3),
        "metadata[1] key length",
        u8at.key,
        kind!(Truncated { need: 8, have: 3 }),
    );
    c.add(
        "trunc_key_bytes",
        b.cut(u8at.key + 8 + 2),
        "metadata[1] key",
        u8at.key + 8,
        kind!(Truncated { need: 7, have: 2 }),
    );
    c.add(
        "trunc_value_type",
        b.cut(u8at.ty + 2),
        b.kv_field("test.u8", "type"),
        u8at.ty,
        kind!(Truncated { need: 4, have: 2 }),
    );

    // A value of each fixed-size type, cut one byte short.
    for (key, size) in [
        ("test.u8", 1),
        ("test.i8", 1),
        ("test.u16", 2),
        ("test.i16", 2),
        ("test.u32", 4),
        ("test.i32", 4),
        ("test.f32", 4),
        ("test.bool", 1),
        ("test.u64", 8),
        ("test.i64", 8),
        ("test.f64", 8),
    ] {
        let at = b.at(key).value;
        c.add(
            &format!("trunc_value_{}", key.trim_start_matches("test.")),
            b.cut(at + size - 1),
            b.kv_field(key, "value"),
            at,
            kind!(Truncated { need, have } if *need == size as u64 && *have == size as u64 - 1),
        );
    }

    let s = b.at("test.string").value;
    c.add(
        "trunc_string_length",
        b.cut(s + 5),
        b.kv_field("test.string", "value length"),
        s,
        kind!(Truncated { need: 8, have: 5 }),
    );
    c.add(
        "trunc_string_bytes",
        b.cut(s + 8 + 2),
        b.kv_field("test.string", "value"),
        s + 8,
        kind!(Truncated { need: 5, have: 2 }),
    );

    let a = b.at("test.array").value;
    c.add(
        "trunc_array_elem_type",
        b.cut(a + 2),
        b.kv_field("test.array", "value array element type"),
        a,
        kind!(Truncated { need: 4, have: 2 }),
    );
    c.add(
        "trunc_array_count",
        b.cut(a + 4 + 5),
        b.kv_field("test.array", "value array count"),
        a + 4,
        kind!(Truncated { need: 8, have: 5 }),
    );
    // Fixed-size elements are checked as a whole against what remains, at
    // the count: cut inside the second u32, 12 bytes are claimed, 6 remain.
    c.add(
        "trunc_array_elements",
        b.cut(a + 12 + 4 + 2),
        b.kv_field("test.array", "value array count"),
        a + 4,
        kind!(CountTooLarge {
            count: 3,
            need: 12,
            have: 6
        }),
    );
    // Inside the second string of a string array ("a" takes 9 bytes).
    let sa = b.at("test.strings").value;
    let str1 = sa + 12 + 9;
    c.add(
        "trunc_string_array_element",
        b.cut(str1 + 8 + 1),
        b.kv_field("test.strings", "value[1]"),
        str1 + 8,
        kind!(Truncated { need: 2, have: 1 }),
    );

    // Tensor fields: in the second tensor, so the tensor count still fits.
    let t = &b.t[1];
    c.add(
        "trunc_tensor_name_length",
        b.cut(t.name + 4),
        "tensor[1] name length",
        t.name,
        kind!(Truncated { need: 8, have: 4 }),
    );
    c.add(
        "trunc_tensor_name",
        b.cut(t.name + 8 + 5),
        "tensor[1] name",
        t.name + 8,
        kind!(Truncated { need: 19, have: 5 }),
    );
    c.add(
        "trunc_n_dims",
        b.cut(t.n_dims + 1),
        b.t_field(1, "n_dims"),
        t.n_dims,
        kind!(Truncated { need: 4, have: 1 }),
    );
    c.add(
        "trunc_dim",
        b.cut(t.dims + 8 + 3),
        b.t_field(1, "dims[1]"),
        t.dims + 8,
        kind!(Truncated { need: 8, have: 3 }),
    );
    c.add(
        "trunc_ggml_type",
        b.cut(t.ty + 3),
        b.t_field(1, "type"),
        t.ty,
        kind!(Truncated { need: 4, have: 3 }),
    );
    c.add(
        "trunc_offset",
        b.cut(t.offset + 7),
        b.t_field(1, "offset"),
        t.offset,
        kind!(Truncated { need: 8, have: 7 }),
    );
    // The header is whole but the second tensor's data is cut short.
    c.add(
        "trunc_tensor_data",
        b.cut(b.data_offset + 32 + 10),
        b.range_field(1),
        t.offset,
        kind!(OutOfRange { .. }),
    );
}

fn header_cases(c: &mut Corpus) {
    let b = base().build();
    c.add(
        "bad_magic",
        b.patched(0, b"GGUG"),
        "magic",
        0,
        kind!(BadMagic(m) if m == b"GGUG"),
    );
    c.add(
        "magic_lowercase",
        b.patched(0, b"gguf"),
        "magic",
        0,
        kind!(BadMagic(_)),
    );
    for v in [0u32, 1, 4, u32::MAX] {
        c.add(
            &format!("version_{v}"),
            b.patched(4, &v.to_le_bytes()),
            "version",
            4,
            kind!(UnsupportedVersion(x) if *x == v),
        );
    }
    for (name, n) in [("max", u64::MAX), ("2e40", 1 << 40)] {
        c.add(
            &format!("tensor_count_{name}"),
            b.patched(8, &n.to_le_bytes()),
            "tensor_count",
            8,
            kind!(CountTooLarge { count, .. } if *count == n),
        );
        c.add(
            &format!("kv_count_{name}"),
            b.patched(16, &n.to_le_bytes()),
            "metadata_kv_count",
            16,
            kind!(CountTooLarge { count, .. } if *count == n),
        );
    }
}

fn metadata_cases(c: &mut Corpus) {
    let b = base().build();
    let u8at = b.at("test.u8");
    let s = b.at("test.string").value;
    let a = b.at("test.array").value;

    c.add(
        "key_length_max",
        b.patched(u8at.key, &u64::MAX.to_le_bytes()),
        "metadata[1] key",
        u8at.key,
        kind!(LengthLimit(u64::MAX)),
    );
    c.add(
        "string_length_max",
        b.patched(s, &u64::MAX.to_le_bytes()),
        b.kv_field("test.string", "value"),
        s,
        kind!(LengthLimit(u64::MAX)),
    );
    c.add(
        "string_length_over_cap",
        b.patched(s, &((1u64 << 30) + 1).to_le_bytes()),
        b.kv_field("test.string", "value"),
        s,
        kind!(LengthLimit(0x4000_0001)),
    );
    // At the cap, so only the bytes that remain refuse it.
    c.add(
        "string_length_at_cap",
        b.patched(s, &(1u64 << 30).to_le_bytes()),
        b.kv_field("test.string", "value"),
        s + 8,
        kind!(Truncated {
            need: 0x4000_0000,
            ..
        }),
    );
    c.add(
        "array_count_max",
        b.patched(a + 4, &u64::MAX.to_le_bytes()),
        b.kv_field("test.array", "value array count"),
        a + 4,
        kind!(LengthLimit(u64::MAX)),
    );
    c.add(
        "array_count_at_cap",
        b.patched(a + 4, &(1u64 << 30).to_le_bytes()),
        b.kv_field("test.array", "value array count"),
        a + 4,
        kind!(CountTooLarge {
            count: 0x4000_0000,
            need: 0x1_0000_0000,
            ..
        }),
    );
    c.add(
        "nested_array",
        b.patched(a, &T_ARRAY.to_le_bytes()),
        b.kv_field("test.array", "value"),
        a,
        kind!(NestedArray),
    );
    c.add(
        "unknown_array_elem_type",
        b.patched(a, &13i32.to_le_bytes()),
        b.kv_field("test.array", "value array element type"),
        a,
        kind!(UnknownValueType(13)),
    );
    for ty in [13i32, -1, i32::MAX] {
        c.add(
            &format!("unknown_value_type_{ty}"),
            b.patched(u8at.ty, &ty.to_le_bytes()),
            b.kv_field("test.u8", "type"),
            u8at.ty,
            kind!(UnknownValueType(x) if *x == ty),
        );
    }

    // "test.i8" has the same length as "test.u8".
    let i8at = b.at("test.i8");
    c.add(
        "duplicate_key",
        b.patched(i8at.key + 8, b"test.u8"),
        "metadata[2] key",
        i8at.key,
        kind!(DuplicateKey(k) if k == "test.u8"),
    );
    let e = with(|s| s.kv_mut("test.u8").key.clear());
    c.add(
        "empty_key",
        e.bytes.clone(),
        "metadata[1] key",
        e.kv[1].key,
        kind!(EmptyKey),
    );
    c.add(
        "key_invalid_utf8",
        b.patched(u8at.key + 8 + 4, &[0xff]),
        "metadata[1] key",
        u8at.key + 8,
        kind!(InvalidUtf8),
    );
    // An unpaired surrogate encoded as UTF-8 is not UTF-8 either.
    c.add(
        "string_value_surrogate",
        b.patched(s + 8 + 1, &[0xed, 0xa0, 0x80]),
        b.kv_field("test.string", "value"),
        s + 8,
        kind!(InvalidUtf8),
    );
    let sa = b.at("test.strings").value;
    c.add(
        "string_array_invalid_utf8",
        b.patched(sa + 12 + 8, &[0xc3]),
        b.kv_field("test.strings", "value[0]"),
        sa + 12 + 8,
        kind!(InvalidUtf8),
    );

    // general.alignment: zero, not a power of two, and of the wrong types.
    let bad_alignments: [(&str, i32, Vec<u8>); 6] = [
        ("zero", T_U32, 0u32.to_le_bytes().to_vec()),
        ("48", T_U32, 48u32.to_le_bytes().to_vec()),
        (
            "2e31_plus_1",
            T_U32,
            ((1u32 << 31) + 1).to_le_bytes().to_vec(),
        ),
        ("u64", T_U64, 32u64.to_le_bytes().to_vec()),
        ("i32", T_I32, 32i32.to_le_bytes().to_vec()),
        ("string", T_STRING, string(b"32")),
    ];
    for (name, ty, value) in bad_alignments {
        let b = with(|s| s.kvs.push(kv("general.alignment", ty, value)));
        c.add(
            &format!("alignment_{name}"),
            b.bytes.clone(),
            "metadata \"general.alignment\"",
            b.at("general.alignment").ty,
            kind!(BadAlignment(_)),
        );
    }
}

fn tensor_cases(c: &mut Corpus) {
    let b = base().build();
    let t = &b.t[1];

    for id in [4i32, 5, 31, 36, 43, 99, -1, i32::MIN] {
        c.add(
            &format!("ggml_type_{id}"),
            b.patched(t.ty, &id.to_le_bytes()),
            b.t_field(1, "type"),
            t.ty,
            kind!(UnknownGgmlType(x) if *x == id),
        );
    }
    for n in [5u32, u32::MAX] {
        c.add(
            &format!("n_dims_{n}"),
            b.patched(t.n_dims, &n.to_le_bytes()),
            b.t_field(1, "n_dims"),
            t.n_dims,
            kind!(TooManyDims(x) if *x == n),
        );
    }
    c.add(
        "negative_dim",
        b.patched(t.dims + 8, &(-1i64).to_le_bytes()),
        b.t_field(1, "dims[1]"),
        t.dims + 8,
        kind!(NegativeDim(-1)),
    );
    c.add(
        "negative_dim_min",
        b.patched(t.dims, &i64::MIN.to_le_bytes()),
        b.t_field(1, "dims[0]"),
        t.dims,
        kind!(NegativeDim(i64::MIN)),
    );
    // The element count overflows.
    let big = [1i64 << 32, 1 << 32].map(i64::to_le_bytes).concat();
    c.add(
        "dims_elements_overflow",
        b.patched(t.dims, &big),
        b.t_field(1, "dims"),
        t.dims,
        kind!(DimsOverflow(d) if d == &[1i64 << 32, 1 << 32]),
    );
    let four = with(|s| {
        s.tensors[1].n_dims = 4;
        s.tensors[1].dims = vec![1 << 16; 4];
    });
    c.add(
        "dims_four_overflow",
        four.bytes.clone(),
        four.t_field(1, "dims"),
        four.t[1].dims,
        kind!(DimsOverflow(_)),
    );
    // 2^62 elements fit; 2^62 F32 elements (2^64 bytes) do not.
    let bytes = [1i64 << 31, 1 << 31].map(i64::to_le_bytes).concat();
    c.add(
        "dims_bytes_overflow",
        b.patched(b.t[0].dims, &bytes),
        b.t_field(0, "dims"),
        b.t[0].dims,
        kind!(DimsOverflow(_)),
    );
    c.add(
        "ne0_not_block_multiple",
        b.patched(t.dims, &33i64.to_le_bytes()),
        b.t_field(1, "dims[0]"),
        t.dims,
        kind!(NotBlockMultiple {
            ne0: 33,
            block: 32,
            ..
        }),
    );

    let long = with(|s| s.tensors[1].name = vec![b'x'; 64]);
    c.add(
        "tensor_name_too_long",
        long.bytes.clone(),
        long.t_field(1, "name"),
        long.t[1].name,
        kind!(NameTooLong(64)),
    );
    c.add(
        "tensor_name_invalid_utf8",
        b.patched(t.name + 8 + 3, &[0x80]),
        "tensor[1] name",
        t.name + 8,
        kind!(InvalidUtf8),
    );
    let dup = with(|s| s.tensors[1].name = T0.as_bytes().to_vec());
    c.add(
        "duplicate_tensor_name",
        dup.bytes.clone(),
        dup.t_field(1, "name"),
        dup.t[1].name,
        kind!(DuplicateName(n) if n == T0),
    );

    c.add(
        "misaligned_offset",
        b.patched(t.offset, &33u64.to_le_bytes()),
        b.t_field(1, "offset"),
        t.offset,
        kind!(MisalignedOffset {
            offset: 33,
            alignment: 32
        }),
    );
    let a64 = with(|s| {
        s.kvs
            .push(kv("general.alignment", T_U32, 64u32.to_le_bytes()))
    });
    c.add(
        "misaligned_offset_alignment_64",
        a64.bytes.clone(),
        a64.t_field(1, "offset"),
        a64.t[1].offset,
        kind!(MisalignedOffset {
            offset: 32,
            alignment: 64
        }),
    );
    c.add(
        "offset_past_end",
        b.patched(t.offset, &(1u64 << 20).to_le_bytes()),
        b.range_field(1),
        t.offset,
        kind!(OutOfRange { .. }),
    );
    // data_offset + offset overflows.
    c.add(
        "offset_overflows",
        b.patched(t.offset, &(!31u64).to_le_bytes()),
        b.range_field(1),
        t.offset,
        kind!(OutOfRange {
            start: u64::MAX,
            end: u64::MAX,
            ..
        }),
    );
    // The start fits in a u64, start + size does not.
    let near = (u64::MAX - b.data_offset as u64) & !31;
    c.add(
        "offset_plus_size_overflows",
        b.patched(t.offset, &near.to_le_bytes()),
        b.range_field(1),
        t.offset,
        kind!(OutOfRange { start, end: u64::MAX, .. } if *start != u64::MAX),
    );
    c.add(
        "overlapping_tensors",
        b.patched(t.offset, &0u64.to_le_bytes()),
        b.range_field(1),
        t.offset,
        kind!(Overlap { other } if other == T0),
    );
    // The second tensor's data comes first; the first tensor overlaps it.
    let swapped = with(|s| {
        s.tensors[0].offset = 32;
        s.tensors[1].offset = 0;
    });
    c.add(
        "overlapping_tensors_out_of_order",
        swapped.bytes.clone(),
        swapped.range_field(0),
        swapped.t[0].offset,
        kind!(Overlap { other } if other == T1),
    );
}

/// Counts that fit a large file but not memory: a 64 GiB sparse file
/// whose header claims 2^32 pairs (or 2^31 tensors) must not make the
/// reader reserve room for all of them up front.
fn sparse_cases(c: &mut Corpus) {
    const LEN: u64 = 64 << 30;
    let mut header = b"GGUF".to_vec();
    header.extend_from_slice(&3u32.to_le_bytes());
    header.extend_from_slice(&0u64.to_le_bytes());
    header.extend_from_slice(&(1u64 << 32).to_le_bytes());
    // The first key (all zeros in a sparse file) is empty.
    c.add(
        "sparse_kv_count_2e32",
        header.clone(),
        "metadata[0] key",
        24,
        kind!(EmptyKey),
    );
    header[8..16].copy_from_slice(&(1u64 << 31).to_le_bytes());
    header[16..24].copy_from_slice(&0u64.to_le_bytes());
    // Tensor 0 is an empty-named scalar; tensor 1 repeats its name.
    c.add(
        "sparse_tensor_count_2e31",
        header,
        "tensor[1] \"\" name",
        48,
        kind!(DuplicateName(n) if n.is_empty()),
    );
    for case in c.0.iter_mut().filter(|c| c.name.starts_with("sparse_")) {
        case.sparse_len = Some(LEN);
    }
}

fn corpus() -> Vec<Case> {
    let mut c = Corpus(Vec::new());
    truncation_cases(&mut c);
    header_cases(&mut c);
    metadata_cases(&mut c);
    tensor_cases(&mut c);
    sparse_cases(&mut c);
    c.0
}

/// Writes `case` to `dir`, runs `seam inspect` (table and JSON) on it and
/// opens it with the library; all must report the case's field and offset.
#[track_caller]
fn check(dir: &Path, case: &Case) {
    let path = dir.join(format!("{}.gguf", case.name));
    std::fs::write(&path, &case.bytes).unwrap();
    if let Some(len) = case.sparse_len {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(len)
            .unwrap();
    }
    let name = &case.name;
    let prefix = format!(
        "seam: error: {}: byte {}: {}: ",
        path.display(),
        case.offset,
        case.field
    );
    for json in [false, true] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_seam"));
        cmd.arg("inspect").arg(&path);
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let how = if json { "inspect --json" } else { "inspect" };
        assert_eq!(
            out.status.code(),
            Some(2),
            "{name}: {how}: exit status {:?} (a signal is None), stderr:\n{stderr}",
            out.status
        );
        assert!(out.stdout.is_empty(), "{name}: {how}: printed to stdout");
        assert!(
            stderr.ends_with('\n') && stderr.matches('\n').count() == 1,
            "{name}: {how}: stderr is not exactly one line:\n{stderr}"
        );
        assert!(
            stderr.starts_with(&prefix),
            "{name}: {how}: expected a line starting with\n  {prefix}\ngot\n  {stderr}"
        );
    }
    let err = GgufModel::open(&path, MapOptions::default())
        .err()
        .unwrap_or_else(|| panic!("{name}: the library accepted the file"));
    assert_eq!(err.file, path, "{name}: file");
    assert_eq!(err.offset, case.offset as u64, "{name}: offset ({err})");
    assert_eq!(err.field, case.field, "{name}: field ({err})");
    assert!(
        (case.kind)(&err.kind),
        "{name}: unexpected kind {:?}",
        err.kind
    );
}

#[test]
fn malformed_files_fail_with_one_line_naming_file_offset_and_field() {
    let cases = corpus();
    assert!(cases.len() >= 30, "only {} cases", cases.len());
    let dir = tempfile::tempdir().unwrap();
    for case in &cases {
        check(dir.path(), case);
    }
}

/// The base file is valid, parses to what it says, and the raw builder
/// writes exactly the bytes the real writer writes: so the offsets the
/// cases compute are those of a real file.
#[test]
fn base_is_valid_and_matches_the_writer() {
    let built = base().build();
    assert_eq!(built.bytes, base_by_writer().to_bytes());

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("base.gguf");
    std::fs::write(&path, &built.bytes).unwrap();
    for json in [false, true] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_seam"));
        cmd.arg("inspect").arg(&path);
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let model = GgufModel::open(&path, MapOptions::default()).unwrap();
    assert_eq!(model.header().metadata.len(), 15);
    assert_eq!(model.metadata("test.i16"), Some(&Value::I16(-1616)));
    let t: Vec<_> = model
        .tensors()
        .iter()
        .map(|t| (t.name.as_str(), t.offset, t.n_bytes))
        .collect();
    let d = built.data_offset as u64;
    assert_eq!(t, [(T0, d, 32), (T1, d + 32, 36)]);

    // Edge values that are valid: a 63-byte name, the alignment key at 32,
    // n_dims 0 (a scalar), a zero dimension, an empty string and array.
    let edge = with(|s| {
        s.tensors[1].name = vec![b'y'; 63];
        s.tensors[0].n_dims = 0;
        s.tensors[0].dims.clear();
        s.tensors[1].dims[1] = 0;
        s.kvs
            .push(kv("general.alignment", T_U32, 32u32.to_le_bytes()));
        s.kvs.push(kv("test.empty", T_STRING, string(b"")));
        s.kvs
            .push(kv("test.empty_array", T_ARRAY, array(T_F64, 0, &[])));
    });
    let header = seam::gguf::parse_header(&edge.bytes, &path, 0).unwrap();
    assert_eq!(header.tensors[0].n_bytes, 4);
    assert_eq!(header.tensors[1].n_bytes, 0);
    assert_eq!(header.tensors[1].name.len(), 63);
}
