//! The projector: the good fixture loads, stages each of its weights
//! through the seam once (uploads = releases) and encodes the synthetic
//! image as llama.cpp does (`mmproj-none.embd.json`, from
//! tools/oracle/mm_encode.cpp); the broken ones are refused naming
//! `v.patch_embd.weight` and what is missing, or the other model's type.

use std::collections::BTreeMap;
use std::path::PathBuf;

mod support;

use family_kit::WeightReader;
use muse_glimmer::mmproj::{Image, Projector, explain_open_error};
use platform_fake::{Event, FakeConfig, FakePlatform};
use seam::borrow::MapOptions;
use seam::gguf::{GgmlType, GgufModel, Value};
use seam::platform::Platform;
use support::{Part, rewrite};

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/muse_glimmer")
        .join(name)
}

fn open(name: &str) -> GgufModel {
    GgufModel::open(&data(name), MapOptions::default()).expect("open")
}

#[track_caller]
fn refused(name: &str, expect: &[&str]) {
    let e = Projector::load(&open(name))
        .expect_err("a broken projector was accepted")
        .to_string();
    for want in expect {
        assert!(e.contains(want), "{name}: {e:?} does not say {want:?}");
    }
}

#[test]
fn an_incomplete_patch_embedding_is_refused_by_name() {
    refused(
        "mmproj-patch-missing.gguf",
        &[
            "\"v.patch_embd.weight\"",
            "incomplete patch embedding: absent",
            "[4, 4, 3, 32]",
        ],
    );
    refused(
        "mmproj-patch-shape.gguf",
        &[
            "\"v.patch_embd.weight\"",
            "dims [4, 4, 3, 16]",
            "16 of its 32 output channels are missing",
        ],
    );
}

#[test]
fn a_projector_cut_short_in_its_patch_embedding_is_refused_by_name() {
    let e = GgufModel::open(&data("mmproj-patch-short.gguf"), MapOptions::default())
        .expect_err("a file cut short opened");
    let line = explain_open_error(&e).expect("explained");
    assert!(
        line.contains("tensor \"v.patch_embd.weight\" is incomplete")
            && line.contains("3072 of its 6144 bytes in (3072 bytes missing)"),
        "{line}"
    );
}

#[test]
fn a_projector_for_another_model_is_refused_by_its_type() {
    refused(
        "mmproj-other-model.gguf",
        &["clip.projector_type", "\"gemma3\"", "another model"],
    );
}

#[test]
fn the_text_model_is_not_a_projector() {
    refused(
        "s7-d05-softcap.gguf",
        &["general.architecture", "muse-glimmer", "\"clip\""],
    );
}

#[test]
fn the_good_projector_stages_each_weight_once_and_matches_llama_cpp() {
    let gguf = open("mmproj-none.gguf");
    let projector = Projector::load(&gguf).expect("load");
    projector.check_text_width(256).expect("E 256");
    assert!(
        projector
            .check_text_width(128)
            .unwrap_err()
            .to_string()
            .contains("mm.2.weight")
    );
    let platform = FakePlatform::new(FakeConfig::default());
    let queue = platform.backend().create_queue().expect("queue");
    let reader = WeightReader::new(&platform, &*queue);
    let text = std::fs::read_to_string(data("mmproj-none.embd.json")).expect("embd json");
    let golden: serde_json::Value = serde_json::from_str(&text).expect("parse");
    let (w, h) = (
        golden["width"].as_u64().unwrap() as usize,
        golden["height"].as_u64().unwrap() as usize,
    );
    let n_embd = golden["n_embd"].as_u64().unwrap() as usize;
    let want: Vec<f64> = golden["embeddings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    // Staged at load, each weight once; the encodes stage nothing more.
    assert_eq!(projector.stage(&platform, &*queue).expect("stage"), 74);
    assert_eq!(platform.stage_counters().snapshot().uploads, 74);
    for _ in 0..2 {
        let got = projector
            .encode(&reader, &Image::synthetic(w, h))
            .expect("encode");
        assert_eq!(got.len() * n_embd, want.len());
        let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
        let diff = got
            .iter()
            .flatten()
            .zip(&want)
            .fold(0f64, |m, (&g, &w)| m.max((f64::from(g) - w).abs()));
        assert!(
            diff <= 1e-3 * scale.max(1.0),
            "max abs diff {diff} (max |embd| {scale})"
        );
        eprintln!(
            "projector: {} tokens, max abs diff {diff:.3e}, max |embd| {scale:.3}",
            got.len()
        );
    }
    let mut per_weight: BTreeMap<String, usize> = BTreeMap::new();
    for e in platform.events() {
        if let Event::Release { weight, .. } = e {
            *per_weight.entry(weight).or_default() += 1;
        }
    }
    let seam = platform.stage_counters().snapshot();
    let claimed = projector.census().claimed_tensors as u64;
    assert_eq!(claimed, 74, "{:?}", projector.census());
    assert_eq!(
        (seam.uploads, seam.releases),
        (claimed, claimed),
        "{seam:?}"
    );
    assert!(per_weight.values().all(|&n| n == 1), "{per_weight:?}");
    assert_eq!(per_weight.len() as u64, claimed);
}

/// `mmproj-none.gguf` rewritten with `meta` and `tensors` applied, loaded:
/// the error.
fn refusal(meta: impl Fn(&mut Vec<(String, Value)>), tensors: impl Fn(&mut Vec<Part>)) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mmproj.gguf");
    rewrite(&data("mmproj-none.gguf"), &path, meta, tensors);
    let gguf = GgufModel::open(&path, MapOptions::default()).expect("open");
    Projector::load(&gguf).expect_err("accepted").to_string()
}

#[test]
fn the_projector_manifest_is_checked_both_ways_by_name() {
    let keep = |_: &mut Vec<(String, Value)>| {};
    let e = refusal(keep, |t| t.retain(|p| p.name != "mm.1.weight"));
    assert!(
        e.contains("\"mm.1.weight\" is required") && e.contains("absent"),
        "{e}"
    );
    let e = refusal(keep, |t| t.retain(|p| p.name != "v.blk.2.attn_out.weight"));
    assert!(e.contains("\"v.blk.2.attn_out.weight\" is required"), "{e}");
    let e = refusal(keep, |t| {
        t.push(Part {
            name: "v.blk.0.surplus.weight".into(),
            ty: GgmlType::F32,
            dims: vec![32],
            bytes: vec![0; 128],
        })
    });
    assert!(
        e.contains("\"v.blk.0.surplus.weight\" is in the file but neither claimed"),
        "{e}"
    );
    let e = refusal(keep, |t| {
        let p = t.iter_mut().find(|p| p.name == "v.pre_ln.weight").unwrap();
        p.ty = GgmlType::F16;
        p.bytes.truncate(64);
    });
    assert!(
        e.contains("\"v.pre_ln.weight\" is F16, expected F32"),
        "{e}"
    );
    let e = refusal(keep, |t| {
        let p = t
            .iter_mut()
            .find(|p| p.name == "v.position_embd.weight")
            .unwrap();
        p.dims = vec![32, 8];
        p.bytes.truncate(32 * 8 * 4);
    });
    assert!(
        e.contains("\"v.position_embd.weight\" has dims [32, 8]"),
        "{e}"
    );
    let e = refusal(|m| m.retain(|(k, _)| k != "clip.vision.patch_size"), |_| {});
    assert!(e.contains("\"clip.vision.patch_size\" is required"), "{e}");
    let e = refusal(
        |m| {
            for (k, v) in m.iter_mut() {
                if k == "clip.has_vision_encoder" {
                    *v = Value::Bool(false);
                }
            }
        },
        |_| {},
    );
    assert!(e.contains("clip.has_vision_encoder"), "{e}");
}
