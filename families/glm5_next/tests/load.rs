//! The hyperparameters and the manifest on variants of the built-in
//! fixture and on the committed test-llama-archs files: both architecture
//! spellings, llama.cpp's defaults, refusals by key name (the NaN-making
//! `kpool_select_tail` false among them), and what is dropped by name.

use glm5_next::{Glm5Next, LayerKind, fixture};
use seam::borrow::MapOptions;
use seam::gguf::{GgmlType, GgufModel, Value};

fn load(spec: &family_kit::FixtureSpec) -> Result<(tempfile::TempDir, Glm5Next), String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.gguf");
    spec.write_file(&path).unwrap();
    let gguf = GgufModel::open(&path, MapOptions { prefault: false }).unwrap();
    Glm5Next::load(&gguf)
        .map(|m| (dir, m))
        .map_err(|e| e.to_string())
}

#[track_caller]
fn refused(spec: &family_kit::FixtureSpec, needles: &[&str]) {
    let e = load(spec).expect_err("refused");
    for n in needles {
        assert!(e.contains(n), "{e} does not name {n}");
    }
}

fn key(k: &str) -> String {
    format!("glm5-next.{k}")
}

#[test]
fn the_fixture_has_3_kda_layers_to_1_mla_and_three_banks_per_moe_layer() {
    let (_d, m) = load(&fixture::fixture()).unwrap();
    let hp = m.hparams();
    assert_eq!(
        hp.layers,
        [
            LayerKind::Kda,
            LayerKind::Kda,
            LayerKind::Kda,
            LayerKind::Mla
        ]
    );
    assert_eq!(m.banks().len(), 3);
    assert_eq!(hp.arch, "glm5-next");
    // swiglu_clamp_shexp absent: it copies swiglu_clamp_exp.
    assert_eq!(hp.clamp_shexp, vec![1.5; 4]);
}

#[test]
fn both_architecture_spellings_are_accepted() {
    let spec = fixture::fixture();
    let mut renamed = family_kit::FixtureSpec {
        metadata: spec
            .metadata
            .iter()
            .map(|(k, v)| (k.replace("glm5-next.", "glm5next."), v.clone()))
            .collect(),
        tensors: spec.tensors.clone(),
        ..spec.clone()
    };
    renamed.set_key("general.architecture", Value::String("glm5next".into()));
    let (_d, m) = load(&renamed).unwrap();
    assert_eq!(m.hparams().arch, "glm5next");
    // Keys are read under the spelling the file uses.
    renamed.remove_key("glm5next.kda.head_dim");
    refused(&renamed, &["glm5next.kda.head_dim"]);
}

#[test]
fn kpool_select_tail_false_or_absent_is_refused_by_name() {
    let k = key("attention.indexer.kpool_select_tail");
    let mut spec = fixture::fixture();
    spec.set_key(&k, Value::Bool(false));
    refused(&spec, &[&k, "NaN"]);
    spec.remove_key(&k);
    refused(&spec, &[&k]);
}

#[test]
fn out_of_domain_keys_are_refused_by_name() {
    let cases: [(&str, Value, &str); 6] = [
        ("rope.dimension_count", Value::U32(64), "NoPE"),
        ("hyper_connection.count", Value::U32(2), "must be 4"),
        ("attention.indexer.kpool", Value::U32(3), "divide"),
        ("expert_used_count", Value::U32(5), "of 4 experts"),
        ("expert_gating_func", Value::U32(1), "sigmoid"),
        (
            "attention.indexer.types",
            Value::Bool(false),
            "first MLA layer",
        ),
    ];
    for (k, v, why) in cases {
        let mut spec = fixture::fixture();
        spec.set_key(&key(k), v);
        refused(&spec, &[&key(k), why]);
    }
}

#[test]
fn hostile_sizes_are_refused_by_name_not_a_panic() {
    let mut spec = fixture::fixture();
    spec.set_key(&key("kda.head_dim"), Value::U64(1 << 62));
    refused(&spec, &["blk.0.attn_q.weight"]);
    let mut spec = fixture::fixture();
    spec.set_key(&key("attention.key_length_mla"), Value::U64(u64::MAX / 2));
    refused(&spec, &["blk.3.attn_q_b.weight"]);
    let mut spec = fixture::fixture();
    spec.set_key(
        &key("hyper_connection.sinkhorn_iterations"),
        Value::U64(1 << 40),
    );
    refused(
        &spec,
        &[&key("hyper_connection.sinkhorn_iterations"), "at most"],
    );
}

#[test]
fn absent_optional_keys_take_llama_cpp_defaults() {
    let mut spec = fixture::fixture();
    for k in [
        "kda.gate_lower_bound",
        "expert_weights_scale",
        "expert_weights_norm",
        "swiglu_clamp_exp",
        "attention.layer_norm_epsilon",
    ] {
        assert!(spec.remove_key(&key(k)), "{k}");
    }
    let (_d, m) = load(&spec).unwrap();
    let hp = m.hparams();
    assert_eq!(hp.gate_lower_bound, None, "softplus decay");
    assert_eq!(hp.expert_weights_scale, 1.0);
    assert!(!hp.expert_weights_norm);
    assert_eq!(hp.clamp_exp, vec![0.0; 4]);
    assert_eq!(hp.clamp_shexp, vec![0.0; 4]);
    assert_eq!(hp.eps_ln, 0.0);
}

#[test]
fn mtp_blocks_scales_and_kda_biases_are_dropped_by_name_others_refused() {
    let mut spec = fixture::fixture();
    spec.set_key(&key("block_count"), Value::U32(5));
    spec.set_key(&key("nextn_predict_layers"), Value::U32(1));
    spec.set_key(
        &key("attention.head_count_kv"),
        Value::Array(seam::gguf::Array::U32(vec![0, 0, 0, 1, 1])),
    );
    spec.add_tensor("blk.4.nextn.eh_proj.weight", GgmlType::F32, &[128, 64]);
    spec.add_tensor("blk.1.attn_q.bias", GgmlType::F32, &[64]);
    spec.add_tensor("blk.3.attn_output.scale", GgmlType::F32, &[1]);
    spec.add_tensor("blk.2.ffn_up_exps.input_scale", GgmlType::F32, &[4]);
    let (_d, m) = load(&spec).unwrap();
    assert_eq!(m.hparams().n_layer, 4);
    let dropped: Vec<&str> = m.census().dropped.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(dropped.len(), 4, "{dropped:?}");
    // A bias on an MLA layer is not one llama.cpp loads: refused.
    spec.add_tensor("blk.3.attn_q.bias", GgmlType::F32, &[64]);
    refused(&spec, &["blk.3.attn_q.bias"]);
}

#[test]
fn the_committed_test_llama_archs_files_load_with_their_census() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/glm5_next");
    for stem in ["s7-d05-sparse", "s7-d05-mixed"] {
        let gguf = GgufModel::open(
            &dir.join(format!("{stem}.gguf")),
            MapOptions { prefault: false },
        )
        .unwrap();
        let m = Glm5Next::load(&gguf).unwrap();
        assert_eq!(m.hparams().layers, [LayerKind::Mla, LayerKind::Kda]);
        assert_eq!(m.banks().len(), 1);
        assert_eq!(m.census().routes["expert_stack"].count, 3);
        // .scale / .input_scale and the KDA q/k/v biases.
        assert!(m.census().dropped.len() >= 30, "{stem}");
    }
    // Layer 2 shares layer 0's selection: it claims no indexer.
    let gguf = GgufModel::open(
        &dir.join("s7-d05-shared3-slim.gguf"),
        MapOptions { prefault: false },
    )
    .unwrap();
    let m = Glm5Next::load(&gguf).unwrap();
    assert_eq!(m.hparams().idx_full, [true, true, false]);
    assert!(m.manifest().handle("blk.0.indexer.proj.weight").is_some());
    assert!(m.manifest().handle("blk.2.indexer.proj.weight").is_none());
}
