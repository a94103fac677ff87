//! Tests of the GGUF layer: a property that whatever the writer writes the
//! reader reads back exactly (metadata of every type, tensors of every ggml
//! type, versions 2 and 3, every alignment, single files and split shards),
//! plus unit tests of tensor shapes and of the writer's errors.

use std::path::Path;

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;

use super::{
    ALIGNMENT_KEY, Array, DEFAULT_ALIGNMENT, GgmlType, GgufErrorKind, GgufModel, GgufWriter,
    SPLIT_COUNT_KEY, SPLIT_NO_KEY, SPLIT_TENSORS_COUNT_KEY, TensorInfo, Value, parse_header,
};
use crate::borrow::MapOptions;

/// A file to write: what the property generates.
#[derive(Clone, Debug)]
struct Fixture {
    version: u32,
    /// `None`: leave the default (32) and write no alignment key.
    alignment: Option<u32>,
    metadata: Vec<(String, Value)>,
    tensors: Vec<FixtureTensor>,
    /// Tensors per shard when written split.
    max_tensors: usize,
}

#[derive(Clone, Debug)]
struct FixtureTensor {
    name: String,
    ggml_type: GgmlType,
    dims: Vec<u64>,
    bytes: Vec<u8>,
}

impl Fixture {
    fn writer(&self) -> GgufWriter {
        let mut w = GgufWriter::new();
        w.set_version(self.version);
        if let Some(a) = self.alignment {
            w.set_alignment(a).unwrap();
        }
        for (k, v) in &self.metadata {
            w.add_metadata(k.clone(), v.clone());
        }
        for t in &self.tensors {
            w.add_tensor(t.name.clone(), t.ggml_type, &t.dims, t.bytes.clone())
                .unwrap();
        }
        w
    }

    fn alignment(&self) -> u64 {
        self.alignment.map_or(DEFAULT_ALIGNMENT, u64::from)
    }

    /// The metadata the reader must see: the alignment key (if set) is
    /// written first, then the pairs in order.
    fn expected_metadata(&self) -> Vec<(String, Value)> {
        let mut m = Vec::new();
        if let Some(a) = self.alignment {
            m.push((ALIGNMENT_KEY.to_owned(), Value::U32(a)));
        }
        m.extend(self.metadata.iter().cloned());
        m
    }
}

/// Any string, control characters and NUL included.
fn any_string() -> impl Strategy<Value = String> {
    proptest::string::string_regex("(?s).{0,12}").unwrap()
}

fn f32_bits() -> impl Strategy<Value = f32> {
    // Every bit pattern: NaNs with payloads, infinities, subnormals, -0.
    any::<u32>().prop_map(f32::from_bits)
}

fn f64_bits() -> impl Strategy<Value = f64> {
    any::<u64>().prop_map(f64::from_bits)
}

fn any_array() -> impl Strategy<Value = Array> {
    const N: std::ops::Range<usize> = 0..6;
    prop_oneof![
        vec(any::<u8>(), N).prop_map(Array::U8),
        vec(any::<i8>(), N).prop_map(Array::I8),
        vec(any::<u16>(), N).prop_map(Array::U16),
        vec(any::<i16>(), N).prop_map(Array::I16),
        vec(any::<u32>(), N).prop_map(Array::U32),
        vec(any::<i32>(), N).prop_map(Array::I32),
        vec(f32_bits(), N).prop_map(Array::F32),
        vec(any::<bool>(), N).prop_map(Array::Bool),
        vec(any_string(), N).prop_map(Array::String),
        vec(any::<u64>(), N).prop_map(Array::U64),
        vec(any::<i64>(), N).prop_map(Array::I64),
        vec(f64_bits(), N).prop_map(Array::F64),
    ]
}

fn any_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<u8>().prop_map(Value::U8),
        any::<i8>().prop_map(Value::I8),
        any::<u16>().prop_map(Value::U16),
        any::<i16>().prop_map(Value::I16),
        any::<u32>().prop_map(Value::U32),
        any::<i32>().prop_map(Value::I32),
        f32_bits().prop_map(Value::F32),
        any::<bool>().prop_map(Value::Bool),
        any_string().prop_map(Value::String),
        any_array().prop_map(Value::Array),
        any::<u64>().prop_map(Value::U64),
        any::<i64>().prop_map(Value::I64),
        f64_bits().prop_map(Value::F64),
    ]
}

/// Deterministic, varied bytes (a xorshift stream).
fn pattern(mut seed: u64, n: usize) -> Vec<u8> {
    seed |= 1;
    (0..n)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        })
        .collect()
}

/// A tensor of any type: 0 to 4 dims, ne0 a whole number of blocks (1 to
/// 3), outer dims 0 to 2 (so some tensors have no bytes).
fn any_tensor() -> impl Strategy<Value = (GgmlType, Vec<u64>, u64)> {
    (
        select(GgmlType::ALL),
        0..=4usize,
        1..=3u64,
        vec(0..=2u64, 3),
        any::<u64>(),
    )
        .prop_map(|(ty, n_dims, blocks, outer, seed)| {
            // A scalar (no dims) is one element: a whole block only when
            // the block is one element.
            let n_dims = if ty.block_size() > 1 {
                n_dims.max(1)
            } else {
                n_dims
            };
            let mut dims = Vec::new();
            if n_dims > 0 {
                dims.push(ty.block_size() * blocks);
                dims.extend_from_slice(&outer[..n_dims - 1]);
            }
            (ty, dims, seed)
        })
}

fn n_bytes(ty: GgmlType, dims: &[u64]) -> u64 {
    let row = ty.row_bytes(dims.first().copied().unwrap_or(1)).unwrap();
    dims.iter().skip(1).product::<u64>() * row
}

fn fixture() -> impl Strategy<Value = Fixture> {
    (
        select(&[2u32, 3][..]),
        select(&[None, Some(1u32), Some(8), Some(32), Some(64), Some(256)][..]),
        vec((any_string(), any_value()), 0..10),
        vec(
            (
                proptest::string::string_regex("\\PC{0,8}").unwrap(),
                any_tensor(),
            ),
            0..6,
        ),
        1..=3usize,
    )
        .prop_map(
            |(version, alignment, metadata, tensors, max_tensors)| Fixture {
                version,
                alignment,
                // Prefixes keep keys unique, non-empty and clear of the keys the
                // reader interprets (alignment, split).
                metadata: metadata
                    .into_iter()
                    .enumerate()
                    .map(|(i, (k, v))| (format!("k{i}.{k}"), v))
                    .collect(),
                tensors: tensors
                    .into_iter()
                    .enumerate()
                    .map(|(i, (name, (ggml_type, dims, seed)))| {
                        let n = n_bytes(ggml_type, &dims) as usize;
                        FixtureTensor {
                            // At most 3 + 8 * 4 bytes: under the 63-byte limit.
                            name: format!("t{i}.{name}"),
                            ggml_type,
                            dims,
                            bytes: pattern(seed, n),
                        }
                    })
                    .collect(),
                max_tensors,
            },
        )
}

/// Equality that compares floats by their bits, so NaN equals itself.
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::F32(x), Value::F32(y)) => x.to_bits() == y.to_bits(),
        (Value::F64(x), Value::F64(y)) => x.to_bits() == y.to_bits(),
        (Value::Array(Array::F32(x)), Value::Array(Array::F32(y))) => x
            .iter()
            .map(|f| f.to_bits())
            .eq(y.iter().map(|f| f.to_bits())),
        (Value::Array(Array::F64(x)), Value::Array(Array::F64(y))) => x
            .iter()
            .map(|f| f.to_bits())
            .eq(y.iter().map(|f| f.to_bits())),
        _ => a == b,
    }
}

#[track_caller]
fn assert_same_metadata(got: &[(String, Value)], want: &[(String, Value)]) {
    assert_eq!(got.len(), want.len(), "metadata count: {got:?} vs {want:?}");
    for ((gk, gv), (wk, wv)) in got.iter().zip(want) {
        assert_eq!(gk, wk);
        assert!(same_value(gv, wv), "{wk}: read {gv:?}, wrote {wv:?}");
    }
}

/// Checks a tensor table against the fixture's tensors (`split` gives each
/// tensor's shard) and that `bytes_of` returns each tensor's bytes.
#[track_caller]
fn assert_same_tensors(
    got: &[TensorInfo],
    want: &[FixtureTensor],
    split: impl Fn(usize) -> usize,
    bytes_of: impl Fn(&TensorInfo) -> Vec<u8>,
) {
    assert_eq!(got.len(), want.len(), "tensor count");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.name, w.name);
        assert_eq!(g.ggml_type, w.ggml_type, "{}", w.name);
        assert_eq!(g.dims, w.dims, "{}", w.name);
        assert_eq!(g.n_bytes, w.bytes.len() as u64, "{}", w.name);
        assert_eq!(g.split, split(i), "{}", w.name);
        assert_eq!(bytes_of(g), w.bytes, "{}: bytes", w.name);
    }
}

/// The whole round trip of one fixture: bytes in memory, a file, and split
/// shards.
fn round_trip(f: &Fixture, dir: &Path) {
    let writer = f.writer();
    let bytes = writer.to_bytes();
    assert_eq!(writer.file_size(), bytes.len() as u64);

    // In memory, through the parser.
    let h = parse_header(&bytes, Path::new("mem.gguf"), 0).unwrap();
    assert_eq!(h.version, f.version);
    assert_eq!(h.alignment, f.alignment());
    assert!(h.data_offset.is_multiple_of(h.alignment));
    assert_same_metadata(&h.metadata, &f.expected_metadata());
    let mut next = h.data_offset;
    for t in &h.tensors {
        // Packed in order, each padded to the alignment (as the reference
        // requires).
        assert_eq!(t.offset, next, "{} offset", t.name);
        next += t.n_bytes.div_ceil(h.alignment) * h.alignment;
    }
    assert_eq!(next, bytes.len() as u64, "file length");
    assert_same_tensors(
        &h.tensors,
        &f.tensors,
        |_| 0,
        |t| bytes[t.offset as usize..(t.offset + t.n_bytes) as usize].to_vec(),
    );

    // As a file, through the model and its borrows.
    let path = dir.join("model.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let model = GgufModel::open(&path, MapOptions::default()).unwrap();
    assert_eq!(model.shards().len(), 1);
    assert_same_metadata(&model.header().metadata, &f.expected_metadata());
    assert_same_tensors(
        model.tensors(),
        &f.tensors,
        |_| 0,
        |t| model.tensor_borrow(t).unwrap().bytes().to_vec(),
    );

    // Split: all metadata in the first shard, plus the split keys.
    let paths = writer.write_split(dir, "split", f.max_tensors).unwrap();
    let shards = f.tensors.len().div_ceil(f.max_tensors).max(1);
    assert_eq!(paths.len(), shards);
    let model = GgufModel::open(&paths[0], MapOptions::default()).unwrap();
    assert_eq!(model.shards().len(), shards);
    let mut want = f.expected_metadata();
    want.push((SPLIT_NO_KEY.into(), Value::U16(0)));
    want.push((SPLIT_COUNT_KEY.into(), Value::U16(shards as u16)));
    want.push((
        SPLIT_TENSORS_COUNT_KEY.into(),
        Value::I32(f.tensors.len() as i32),
    ));
    assert_same_metadata(&model.header().metadata, &want);
    for (i, shard) in model.shards().iter().enumerate() {
        assert_eq!(shard.header().version, f.version);
        assert_eq!(shard.header().alignment, f.alignment());
        assert_eq!(shard.path(), paths[i]);
    }
    assert_same_tensors(
        model.tensors(),
        &f.tensors,
        |i| i / f.max_tensors,
        |t| model.tensor_borrow(t).unwrap().bytes().to_vec(),
    );
    for p in paths {
        std::fs::remove_file(p).unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn what_the_writer_writes_the_reader_reads(f in fixture()) {
        let dir = tempfile::tempdir().unwrap();
        round_trip(&f, dir.path());
    }
}

/// One fixture with every value type and every ggml type, so the property's
/// coverage does not depend on the draw.
#[test]
fn every_type_round_trips() {
    let mut metadata = vec![
        ("u8".to_owned(), Value::U8(u8::MAX)),
        ("i8".into(), Value::I8(i8::MIN)),
        ("u16".into(), Value::U16(u16::MAX)),
        ("i16".into(), Value::I16(i16::MIN)),
        ("u32".into(), Value::U32(u32::MAX)),
        ("i32".into(), Value::I32(i32::MIN)),
        ("f32".into(), Value::F32(f32::NAN)),
        ("bool".into(), Value::Bool(true)),
        ("string".into(), Value::String("ü\0\n".into())),
        ("u64".into(), Value::U64(u64::MAX)),
        ("i64".into(), Value::I64(i64::MIN)),
        ("f64".into(), Value::F64(-0.0)),
        ("empty".into(), Value::Array(Array::String(Vec::new()))),
    ];
    let arrays = [
        Array::U8(vec![1]),
        Array::I8(vec![-1]),
        Array::U16(vec![2]),
        Array::I16(vec![-2]),
        Array::U32(vec![3]),
        Array::I32(vec![-3]),
        Array::F32(vec![f32::NEG_INFINITY, f32::from_bits(0x7fc0_0001)]),
        Array::Bool(vec![true, false]),
        Array::String(vec![String::new(), "x".into()]),
        Array::U64(vec![4]),
        Array::I64(vec![-4]),
        Array::F64(vec![f64::from_bits(0x7ff0_0000_0000_0001)]),
    ];
    for a in arrays {
        metadata.push((format!("array.{}", a.elem_type().name()), Value::Array(a)));
    }
    let tensors = GgmlType::ALL
        .iter()
        .enumerate()
        .map(|(i, &ty)| {
            let dims = vec![ty.block_size() * 2, 3];
            FixtureTensor {
                name: format!("t.{}", ty.name()),
                ggml_type: ty,
                bytes: pattern(i as u64, n_bytes(ty, &dims) as usize),
                dims,
            }
        })
        .collect();
    let f = Fixture {
        version: 3,
        alignment: Some(64),
        metadata,
        tensors,
        max_tensors: 10,
    };
    let dir = tempfile::tempdir().unwrap();
    round_trip(&f, dir.path());
}

#[test]
fn a_sparse_write_has_the_full_size_holes_of_zeros_and_no_fill_called() {
    let mut w = GgufWriter::new();
    w.add_metadata("k", Value::U32(7));
    w.add_tensor_fill(
        "big",
        GgmlType::F32,
        &[1 << 20, 64],
        Box::new(|_, _| panic!("a sparse write fills nothing")),
    )
    .unwrap();
    w.add_tensor("small", GgmlType::F32, &[4], vec![1; 16])
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.gguf");
    let size = w.write_sparse(&path).unwrap();
    assert_eq!(size, w.file_size());
    assert_eq!(std::fs::metadata(&path).unwrap().len(), size);
    let m = GgufModel::open(&path, MapOptions { prefault: false }).unwrap();
    assert_eq!(m.tensors().len(), 2);
    let t = m.tensor("small").unwrap();
    assert_eq!(
        m.tensor_borrow(t).unwrap().bytes(),
        &[0; 16],
        "a hole reads as zeros"
    );
}

fn info(dims: &[u64]) -> TensorInfo {
    TensorInfo {
        name: "t".into(),
        ggml_type: GgmlType::F32,
        dims: dims.to_vec(),
        offset: 0,
        n_bytes: 0,
        split: 0,
    }
}

#[test]
fn shape_row_major_reverses_gguf_order() {
    assert_eq!(info(&[4096, 32000]).shape_row_major(), [32000, 4096]);
    assert_eq!(info(&[2, 3, 5, 7]).shape_row_major(), [7, 5, 3, 2]);
    assert_eq!(info(&[8]).shape_row_major(), [8]);
    assert_eq!(info(&[]).shape_row_major(), Vec::<u64>::new());
    assert_eq!(info(&[2, 3, 5, 7]).n_elements(), 210);
    assert_eq!(info(&[]).n_elements(), 1);
    assert_eq!(info(&[4, 0]).n_elements(), 0);
}

/// Checks that `result` is the writer's `Unwritable` error about `field`,
/// its message containing `what`.
#[track_caller]
fn check_unwritable<T>(result: super::Result<T>, field: &str, what: &str) {
    let Err(err) = result else {
        panic!("the writer accepted what it must refuse ({field}: {what})");
    };
    assert_eq!(err.field, field);
    match &err.kind {
        GgufErrorKind::Unwritable(msg) => assert!(msg.contains(what), "{msg:?} lacks {what:?}"),
        other => panic!("expected Unwritable, got {other:?}"),
    }
}

#[test]
fn writer_refuses_what_it_cannot_encode() {
    let mut w = GgufWriter::new();
    check_unwritable(w.set_alignment(0), ALIGNMENT_KEY, "not a power of two");
    check_unwritable(w.set_alignment(48), ALIGNMENT_KEY, "not a power of two");
    w.add_tensor("a", GgmlType::F32, &[2], vec![0; 8]).unwrap();
    check_unwritable(
        w.add_tensor("a", GgmlType::F32, &[2], vec![0; 8]),
        "tensor \"a\"",
        "duplicate",
    );
    check_unwritable(
        w.add_tensor("b", GgmlType::F32, &[1, 1, 1, 1, 1], vec![0; 4]),
        "tensor \"b\"",
        "5 dims",
    );
    check_unwritable(
        w.add_tensor("c", GgmlType::Q4_K, &[100], vec![]),
        "tensor \"c\"",
        "not a multiple",
    );
    check_unwritable(
        w.add_tensor_fill("c", GgmlType::Q4_0, &[], Box::new(|_, _| ())),
        "tensor \"c\"",
        "not a multiple",
    );
    check_unwritable(
        w.add_tensor("d", GgmlType::F32, &[2, 2], vec![0; 15]),
        "tensor \"d\"",
        "15 bytes given, the shape needs 16",
    );
    check_unwritable(
        w.add_tensor_fill("e", GgmlType::F32, &[1 << 40, 1 << 40], Box::new(|_, _| ())),
        "tensor \"e\"",
        "overflows",
    );
    let dir = tempfile::tempdir().unwrap();
    check_unwritable(w.write_split(dir.path(), "m", 0), "split", "at least 1");
    // Nothing refused was added: the file holds the one good tensor.
    let h = parse_header(&w.to_bytes(), Path::new("w.gguf"), 0).unwrap();
    assert_eq!(h.tensors.len(), 1);
    assert_eq!(h.alignment, DEFAULT_ALIGNMENT);
    assert!(h.metadata.is_empty());
}

#[test]
fn writer_replaces_keys_instead_of_repeating_them() {
    let mut w = GgufWriter::new();
    w.add_metadata("k", Value::U8(1))
        .add_metadata("k", Value::U8(2));
    w.set_alignment(8).unwrap().set_alignment(16).unwrap();
    let h = parse_header(&w.to_bytes(), Path::new("w.gguf"), 0).unwrap();
    assert_same_metadata(
        &h.metadata,
        &[
            ("k".into(), Value::U8(2)),
            (ALIGNMENT_KEY.into(), Value::U32(16)),
        ],
    );
    assert_eq!(h.alignment, 16);
}
