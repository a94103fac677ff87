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
    let mut hasher = Sha256::new();
    borrow.read_releasing(64 << 20, |chunk| hasher.update(chunk));
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

fn tensor_json(t: &TensorInfo, sha256: Option<String>) -> Json {
    let mut o = json!({
        "name": t.name,
        "ggml_type": t.ggml_type.name(),
        "dims": t.dims,
        "offset": t.offset,
        "n_bytes": t.n_bytes,
        "split": t.split,
    });
    if let Some(h) = sha256 {
        o["sha256"] = Json::String(h);
    }
    o
}

/// The tensor's sha256 when `hash` is set.
fn maybe_hash(model: &GgufModel, t: &TensorInfo, hash: bool) -> Result<Option<String>> {
    if !hash {
        return Ok(None);
    }
    Ok(Some(sha256_hex_releasing(&model.tensor_borrow(t)?)))
}

/// The metadata of a header, serialized as a JSON object in file order.
struct MetadataMap<'a>(&'a [(String, Value)]);

impl serde::Serialize for MetadataMap<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

/// Writes the JSON report of `seam inspect --json [--hash]` to `out`,
/// streaming: the metadata (a tokenizer's arrays included) is never copied
/// into a JSON tree.
///
/// # Errors
///
/// A tensor's bytes cannot be borrowed, or writing fails.
pub fn write_inspect_json(
    model: &GgufModel,
    hash: bool,
    out: &mut dyn std::io::Write,
) -> std::result::Result<(), Box<dyn std::error::Error>> {
    let header = model.header();
    let tensors = model
        .tensors()
        .iter()
        .map(|t| Ok(tensor_json(t, maybe_hash(model, t, hash)?)))
        .collect::<Result<Vec<_>>>()?;
    if hash {
        // Hashes of a file that changed while they were taken match
        // neither version.
        model.check_unchanged()?;
    }
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

/// The human-readable report of `seam inspect`; keys and names with
/// control bytes are shown escaped ([`terminal_safe`]).
///
/// # Errors
///
/// As [`write_inspect_json`].
pub fn inspect_text(model: &GgufModel, hash: bool) -> Result<String> {
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
        if hash { "  sha256" } else { "" }
    );
    for t in model.tensors() {
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
        if let Some(h) = maybe_hash(model, t, hash)? {
            let _ = write!(s, "  {h}");
        }
        s.push('\n');
    }
    if hash {
        model.check_unchanged()?;
    }
    Ok(s)
}
