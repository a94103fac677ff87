//! `seam inspect`: what is in a GGUF file, as a table or as JSON.
//!
//! The JSON shape is a contract that outside checks read (the brief's
//! Command-line contracts): `version`, `alignment`, `metadata` (key ->
//! value), `tensors` as `{name, ggml_type, dims, offset, n_bytes, split}`
//! plus `sha256` with hashing on.

use std::fmt::Write as _;

use serde_json::{Value as Json, json};
use sha2::{Digest, Sha256};

use seam::borrow::Borrow;
use seam::gguf::{GgufModel, Result, TensorInfo, Value};
use seam::text::terminal_safe;

/// The sha256 of a borrow's bytes, in lowercase hex. The borrow's resident
/// pages are given back afterwards (the file's page cache is kept), so
/// hashing a model larger than memory keeps this process small.
pub fn sha256_hex_releasing(borrow: &Borrow) -> String {
    sha256_hex_releasing_counted(borrow, &mut |_| {})
}

/// [`sha256_hex_releasing`], calling `on_chunk(bytes)` after each chunk
/// (64 MiB) is hashed.
fn sha256_hex_releasing_counted(borrow: &Borrow, on_chunk: &mut dyn FnMut(u64)) -> String {
    let mut hasher = Sha256::new();
    borrow.read_releasing(64 << 20, |chunk| {
        hasher.update(chunk);
        on_chunk(chunk.len() as u64);
    });
    hex(&hasher.finalize())
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn tensor_json(t: &TensorInfo, sha256: Option<&str>) -> Json {
    let mut o = json!({
        "name": t.name,
        "ggml_type": t.ggml_type.name(),
        "dims": t.dims,
        "offset": t.offset,
        "n_bytes": t.n_bytes,
        "split": t.split,
    });
    if let Some(h) = sha256 {
        o["sha256"] = Json::String(h.to_owned());
    }
    o
}

/// The sha256 of every tensor's bytes (`seam inspect --hash`), in the
/// order of the tensor table; `on_progress(done, total)` in bytes after
/// each chunk. The file is checked unchanged afterwards: hashes of a file
/// that changed while they were taken match neither version.
///
/// # Errors
///
/// A tensor's bytes cannot be borrowed, or the file changed.
pub fn tensor_hashes(model: &GgufModel, on_progress: &dyn Fn(u64, u64)) -> Result<Vec<String>> {
    let total = model.total_tensor_bytes();
    let mut done = 0;
    let hashes = model
        .tensors()
        .iter()
        .map(|t| {
            let borrow = model.tensor_borrow(t)?;
            Ok(sha256_hex_releasing_counted(&borrow, &mut |n| {
                done += n;
                on_progress(done, total);
            }))
        })
        .collect::<Result<Vec<_>>>()?;
    model.check_unchanged()?;
    Ok(hashes)
}

/// Tensor `i`'s entry of `hashes`, if hashes were taken.
fn hash_of(hashes: Option<&[String]>, i: usize) -> Option<&str> {
    hashes.and_then(|h| h.get(i)).map(String::as_str)
}

/// The metadata of a header, serialized as a JSON object in file order.
struct MetadataMap<'a>(&'a [(String, Value)]);

impl serde::Serialize for MetadataMap<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

/// Writes the JSON report of `seam inspect --json [--hash]` to `out`,
/// with each tensor's sha256 from `hashes` ([`tensor_hashes`]) where given,
/// streaming: the metadata (a tokenizer's arrays included) is never copied
/// into a JSON tree.
///
/// # Errors
///
/// Writing fails.
pub fn write_inspect_json(
    model: &GgufModel,
    hashes: Option<&[String]>,
    out: &mut dyn std::io::Write,
) -> std::result::Result<(), Box<dyn std::error::Error>> {
    let header = model.header();
    let tensors = model
        .tensors()
        .iter()
        .enumerate()
        .map(|(i, t)| tensor_json(t, hash_of(hashes, i)))
        .collect::<Vec<_>>();
    #[derive(serde::Serialize)]
    struct Report<'a> {
        version: u32,
        alignment: u64,
        shards: usize,
        metadata: MetadataMap<'a>,
        tensors: Vec<Json>,
    }
    let report = Report {
        version: header.version,
        alignment: header.alignment,
        shards: model.shards().len(),
        metadata: MetadataMap(&header.metadata),
        tensors,
    };
    serde_json::to_writer_pretty(&mut *out, &report)?;
    out.write_all(b"\n")?;
    Ok(())
}

fn summarize(v: &Value) -> String {
    match v {
        Value::Array(a) if a.len() > 8 => format!("{} ({} elements)", v.type_name(), a.len()),
        Value::String(s) if s.len() > 80 => format!("{:?}...", &s[..s.floor_char_boundary(77)]),
        Value::String(s) => format!("{s:?}"),
        // JSON escapes control characters in strings (an array's too).
        other => other.to_json().to_string(),
    }
}

/// The human-readable report of `seam inspect`, with each tensor's sha256
/// from `hashes` ([`tensor_hashes`]) where given; keys and names with
/// control bytes are shown escaped ([`terminal_safe`]).
pub fn inspect_text(model: &GgufModel, hashes: Option<&[String]>) -> String {
    let header = model.header();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "GGUF v{}, alignment {}, {} shard(s), {} metadata keys, {} tensors, {} tensor bytes",
        header.version,
        header.alignment,
        model.shards().len(),
        header.metadata.len(),
        model.tensors().len(),
        model.total_tensor_bytes()
    );
    let _ = writeln!(s, "\nmetadata:");
    for (k, v) in &header.metadata {
        let _ = writeln!(
            s,
            "  {:<40} {:<14} {}",
            terminal_safe(k),
            v.type_name(),
            summarize(v)
        );
    }
    let _ = writeln!(s, "\ntensors:");
    let _ = writeln!(
        s,
        "  {:<48} {:<8} {:<28} {:>14} {:>12} {:>5}{}",
        "name",
        "type",
        "dims (ne0 first)",
        "offset",
        "bytes",
        "split",
        if hashes.is_some() { "  sha256" } else { "" }
    );
    for (i, t) in model.tensors().iter().enumerate() {
        let dims = format!("{:?}", t.dims);
        let _ = write!(
            s,
            "  {:<48} {:<8} {:<28} {:>14} {:>12} {:>5}",
            terminal_safe(&t.name),
            t.ggml_type.name(),
            dims,
            t.offset,
            t.n_bytes,
            t.split
        );
        if let Some(h) = hash_of(hashes, i) {
            let _ = write!(s, "  {h}");
        }
        s.push('\n');
    }
    s
}
