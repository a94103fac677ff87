//! The public GLM-5.3 checkpoint's shape (`tests/data/glm_moe_dsa/
//! real_shape.json`: its metadata and tensor table, README there) as a
//! sparse GGUF in a temporary directory (header written, data left as
//! holes, ~202 GiB apparent, a few hundred KiB on disk): it passes the
//! manifest check, and its census gives the bytes per route and the
//! experts' share.

use family_kit::manifest::Route;
use glm_moe_dsa::GlmMoeDsa;
use seam::borrow::MapOptions;
use seam::gguf::{GgmlType, GgufModel, GgufWriter, Value};

fn real_shape() -> serde_json::Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/glm_moe_dsa/real_shape.json");
    serde_json::from_slice(&std::fs::read(path).expect("real_shape.json")).expect("JSON")
}

fn writer(shape: &serde_json::Value) -> GgufWriter {
    let mut w = GgufWriter::new();
    for m in shape["metadata"].as_array().unwrap() {
        let v = &m["value"];
        let value = match m["type"].as_str().unwrap() {
            "string" => Value::String(v.as_str().unwrap().into()),
            "u32" => Value::U32(u32::try_from(v.as_u64().unwrap()).unwrap()),
            "f32" => Value::F32(v.as_f64().unwrap() as f32),
            "bool" => Value::Bool(v.as_bool().unwrap()),
            other => panic!("metadata type {other}"),
        };
        w.add_metadata(m["key"].as_str().unwrap(), value);
    }
    for t in shape["tensors"].as_array().unwrap() {
        let ty = GgmlType::from_name(t["type"].as_str().unwrap()).expect("a ggml type");
        let dims: Vec<u64> = t["dims"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        w.add_tensor_fill(
            t["name"].as_str().unwrap(),
            ty,
            &dims,
            Box::new(|_, _| unreachable!("a sparse write fills nothing")),
        )
        .expect("a valid tensor");
    }
    w
}

#[test]
fn the_real_shape_passes_the_manifest_and_its_census_counts_the_experts() {
    let shape = real_shape();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("glm-5.3-shape.gguf");
    let size = writer(&shape).write_sparse(&path).expect("sparse write");
    assert!(size > 200 << 30, "{size}");
    let gguf = GgufModel::open(&path, MapOptions { prefault: false }).expect("open");
    let model = GlmMoeDsa::load(&gguf).expect("the manifest check passes");
    let hp = model.hparams();
    assert_eq!((hp.n_layer, hp.block_count), (78, 79));
    // No types key, context 2^20: the GLM-5.2 table, 21 full layers.
    assert_eq!(hp.idx_full.iter().filter(|&&f| f).count(), 21);
    assert_eq!(hp.expert_weights_scale, 2.5);

    let c = model.census();
    let stacks = &c.routes[Route::ExpertStack.name()];
    let dense = &c.routes[Route::Dense.name()];
    // 75 trunk MoE layers x 3 claimed; the MTP block's 3 are dropped.
    assert_eq!(stacks.count, 225);
    let dropped = |prefix: &str| {
        c.dropped
            .iter()
            .filter(|d| d.name.starts_with(prefix))
            .count()
    };
    let in_file = |prefix: &str| {
        shape["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["name"].as_str().unwrap().starts_with(prefix))
            .count()
    };
    assert!(in_file("blk.78.nextn.") >= 3);
    assert_eq!(
        dropped("blk.78."),
        in_file("blk.78."),
        "the whole MTP block"
    );
    // 57 shared layers x 5 indexer tensors.
    let shared_idx = c
        .dropped
        .iter()
        .filter(|d| d.name.contains(".indexer.") && !d.name.starts_with("blk.78."))
        .count();
    assert_eq!(shared_idx, 57 * 5);
    assert_eq!(c.file_tensors, 1809);
    assert_eq!(c.claimed_tensors + c.dropped.len(), c.file_tensors);
    let file_stack_bytes: u64 = shape["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["name"].as_str().unwrap().contains("_exps."))
        .map(|t| t["bytes"].as_u64().unwrap())
        .sum();
    let dropped_bytes: u64 = c.dropped.iter().map(|d| d.bytes).sum();
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    let share = stacks.bytes as f64 / c.file_bytes as f64;
    let file_share = file_stack_bytes as f64 / c.file_bytes as f64;
    eprintln!(
        "real shape: file {:.2} GiB, {} tensors; claimed {:.2} GiB ({} tensors): expert stacks {:.2} GiB ({} stacks), dense {:.2} GiB ({} tensors); dropped {:.2} GiB ({} tensors); expert share of the file {:.2}% (claimed stacks) / {:.2}% (all 228 stacks incl. MTP)",
        gib(c.file_bytes),
        c.file_tensors,
        gib(c.claimed_bytes),
        c.claimed_tensors,
        gib(stacks.bytes),
        stacks.count,
        gib(dense.bytes),
        dense.count,
        gib(dropped_bytes),
        c.dropped.len(),
        100.0 * share,
        100.0 * file_share,
    );
    assert_eq!(stacks.bytes + dense.bytes, c.claimed_bytes);
    // The generator's census (all 228 stacks): 94.19% of 202.35 GiB.
    let want = shape["census"]["expert_share"].as_f64().unwrap();
    assert!((file_share - want).abs() < 1e-4, "{file_share} vs {want}");
    assert!((0.92..0.94).contains(&share), "{share}");
}

/// `--write-generated` at the public checkpoint's 78 trunk layers is its
/// tensor table without the MTP block: every name, type and dims the same
/// (so the benchmark's model has the public file's sizes and types), and
/// it passes the manifest check.
#[test]
fn the_generated_model_at_78_layers_is_the_real_shape_without_its_mtp_block() {
    let shape = real_shape();
    let table = |it: &mut dyn Iterator<Item = (String, String, Vec<u64>)>| {
        let mut v: Vec<_> = it.collect();
        v.sort();
        v
    };
    let want = table(
        &mut shape["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| !t["name"].as_str().unwrap().starts_with("blk.78."))
            .map(|t| {
                (
                    t["name"].as_str().unwrap().to_owned(),
                    t["type"].as_str().unwrap().to_owned(),
                    t["dims"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|d| d.as_u64().unwrap())
                        .collect(),
                )
            }),
    );
    let spec = glm_moe_dsa::fixture::generated(&glm_moe_dsa::fixture::Shape::checkpoint(78));
    let got = table(&mut spec.tensors.iter().map(|t| {
        (
            t.name.clone(),
            t.ggml_type.name().to_owned(),
            t.dims.clone(),
        )
    }));
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g, w);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("generated.gguf");
    // The streaming writer's fills are never called by a sparse write.
    spec.streaming_writer()
        .unwrap()
        .write_sparse(&path)
        .expect("sparse write");
    let gguf = GgufModel::open(&path, MapOptions { prefault: false }).expect("open");
    let model = GlmMoeDsa::load(&gguf).expect("the manifest check passes");
    assert_eq!(
        (model.hparams().n_layer, model.hparams().block_count),
        (78, 78)
    );
}
