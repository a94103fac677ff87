//! Test files rewritten from committed ones: metadata and tensors edited,
//! the rest copied byte for byte.

use std::path::Path;

use seam::borrow::MapOptions;
use seam::gguf::{GgmlType, GgufModel, GgufWriter, Value};

/// One tensor of a rewritten file.
pub struct Part {
    /// Its name.
    pub name: String,
    /// Its type.
    pub ty: GgmlType,
    /// Its dims.
    pub dims: Vec<u64>,
    /// Its bytes.
    pub bytes: Vec<u8>,
}

/// `src` rewritten to `dst` with `meta` applied to its metadata and
/// `tensors` to its tensors.
pub fn rewrite(
    src: &Path,
    dst: &Path,
    meta: impl Fn(&mut Vec<(String, Value)>),
    tensors: impl Fn(&mut Vec<Part>),
) {
    let gguf = GgufModel::open(src, MapOptions::default()).expect("open");
    let mut metadata: Vec<(String, Value)> = gguf.header().metadata.clone();
    meta(&mut metadata);
    let mut parts: Vec<Part> = gguf
        .tensors()
        .iter()
        .map(|t| Part {
            name: t.name.clone(),
            ty: t.ggml_type,
            dims: t.dims.clone(),
            bytes: gguf.tensor_borrow(t).expect("borrow").bytes().to_vec(),
        })
        .collect();
    tensors(&mut parts);
    let mut w = GgufWriter::new();
    for (k, v) in metadata {
        if k != "general.alignment" {
            w.add_metadata(k, v);
        }
    }
    for p in parts {
        w.add_tensor(p.name, p.ty, &p.dims, p.bytes)
            .expect("tensor");
    }
    w.write_file(dst).expect("write");
}
