//! The qwen4exp load side on the built-in fixture: the manifest, each
//! refusal (naming the tensor or key), and the residency contract on the
//! fake device.

use std::path::Path;

use platform_fake::{Event, FakeConfig, FakePlatform};
use qwen4_exp::fixture::{FixtureSpec, N_EXPERT, N_LAYER, PLE_ROWS};
use qwen4_exp::sim::pick_experts;
use qwen4_exp::{
    Error, ExpertKind, Hparams, LayerKind, Qwen4Exp, Route, TypeClass, simulate_decode,
};
use seam::borrow::MapOptions;
use seam::gguf::{Array, GgmlType, GgufModel, Value};
use seam::platform::Platform;
use seam::{SeamError, resident_weight};

fn open(spec: &FixtureSpec, dir: &Path) -> GgufModel {
    let path = dir.join("q.gguf");
    spec.writer().write_file(&path).unwrap();
    GgufModel::open(&path, MapOptions::default()).unwrap()
}

fn load(spec: &FixtureSpec) -> Result<Qwen4Exp, Error> {
    let dir = tempfile::tempdir().unwrap();
    Qwen4Exp::load(&open(spec, dir.path()))
}

fn load_err(spec: &FixtureSpec) -> Error {
    match load(spec) {
        Ok(_) => panic!("the variant loaded"),
        Err(e) => e,
    }
}

#[test]
fn fixture_is_small_deterministic_and_dequantizes_to_finite_numbers() {
    let a = qwen4_exp::fixture::fixture().to_bytes();
    let b = qwen4_exp::fixture::fixture().to_bytes();
    assert_eq!(a, b);
    assert!(a.len() < 1 << 20, "{} bytes", a.len());
    let dir = tempfile::tempdir().unwrap();
    let model = open(&qwen4_exp::fixture::tiny(), dir.path());
    let mut types = std::collections::BTreeSet::new();
    for t in model.tensors() {
        types.insert(t.ggml_type);
        let bytes = model.tensor_borrow(t).unwrap();
        let mut out = vec![0f32; t.n_elements() as usize];
        family_ops::dequantize(t.ggml_type, bytes.bytes(), &mut out).unwrap();
        assert!(out.iter().all(|x| x.is_finite()), "{}", t.name);
    }
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::IQ4_NL,
        GgmlType::IQ2_XXS,
    ] {
        assert!(types.contains(&ty), "{ty}");
    }
}

#[test]
fn manifest_from_the_fixture() {
    let model = load(&qwen4_exp::fixture::tiny()).unwrap();
    let hp = model.hparams();
    assert_eq!(hp.n_layer, N_LAYER);
    assert_eq!(hp.block_count, 4);
    assert_eq!(hp.nextn_predict_layers, 1);
    assert_eq!(
        hp.layers,
        [LayerKind::Gdn, LayerKind::Gdn, LayerKind::FullAttention]
    );
    assert_eq!(hp.full_attention_interval, Some(3));
    assert_eq!(hp.n_expert, N_EXPERT);
    assert_eq!(hp.n_expert_used, [2, 2, 2]);
    assert_eq!((hp.n_ff_exp[0], hp.n_ff_shexp[0]), (32, 32));
    assert_eq!((hp.hc, hp.hc_low_rank, hp.hc_dim()), (4, 4, 1024));
    assert_eq!(
        (hp.head_dim, hp.n_rot, hp.rope_sections),
        (32, 16, [3, 3, 2, 0])
    );
    assert_eq!(hp.ssm.conv_dim(), 128);
    assert_eq!(hp.compress_ratios, [0, 0, 4]);
    let ple = hp.ple.as_ref().unwrap();
    assert_eq!((ple.layer, ple.n_heads, ple.head_dim), (0, 4, 64));
    assert_eq!(ple.min_rows(), 64);
    assert_eq!(model.manifest().layout.n_vocab, 64);
    assert!(!model.manifest().layout.tied_output);

    // Every tensor named once; routes as the family says.
    let specs = &model.manifest().tensors;
    let names: std::collections::HashSet<_> = specs.iter().map(|t| &t.name).collect();
    assert_eq!(names.len(), specs.len());
    let route = |r| specs.iter().filter(|t| t.route == r).count();
    assert_eq!(route(Route::ExpertStack), 3 * N_LAYER);
    assert_eq!(route(Route::LazyTable), 1);
    assert_eq!(route(Route::Dense), specs.len() - 3 * N_LAYER - 1);
    let spec = |n: &str| model.manifest().spec(n).unwrap();
    assert_eq!(spec("per_layer_token_embd.weight").route, Route::LazyTable);
    assert_eq!(spec("blk.1.ffn_down_exps.weight").route, Route::ExpertStack);
    assert_eq!(
        spec("blk.1.ffn_down_exps.weight").role.as_str(),
        "ffn_down_exps"
    );
    assert_eq!(spec("blk.0.ssm_norm.weight").types, TypeClass::F32);
    assert_eq!(spec("blk.0.ple_conv1d.weight").types, TypeClass::Float);
    assert_eq!(spec("blk.2.attn_q.weight").types, TypeClass::Any);
    assert!(model.manifest().spec("blk.2.attn_qkv.weight").is_none());
    assert!(model.manifest().spec("blk.1.ple_key.weight").is_none());

    // Stacks and the table are expert-streamed; dense weights are not.
    for (w, t) in model.weights().iter().zip(specs) {
        assert_eq!(w.name(), t.name);
        assert_eq!(
            w.flags().expert_streamed,
            t.route != Route::Dense,
            "{}",
            t.name
        );
    }

    // Dropped by name: the MTP block and the unused attention bias.
    let dropped: Vec<&str> = model.dropped().iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        dropped,
        [
            "blk.2.attn_q.bias",
            "blk.3.nextn.enorm.weight",
            "blk.3.nextn.hnorm.weight",
            "blk.3.ffn_gate_inp.weight"
        ]
    );

    // The census adds up to the file.
    let c = model.census();
    let dropped_bytes: u64 = c.dropped.iter().map(|d| d.bytes).sum();
    assert_eq!(c.claimed_bytes + dropped_bytes, c.file_bytes);
    assert_eq!(c.claimed_tensors + c.dropped.len(), c.file_tensors);
    assert_eq!(c.claimed_tensors, specs.len());
    let role_total: u64 = c.roles.values().map(|r| r.bytes).sum();
    assert_eq!(role_total, c.claimed_bytes);
    let route_total: u64 = c.routes.values().map(|r| r.bytes).sum();
    assert_eq!(route_total, c.claimed_bytes);
    let gate = &c.roles["ffn_gate_exps"];
    assert_eq!((gate.route, gate.count), (Route::ExpertStack, 3));
    assert_eq!(gate.types["IQ2_XXS"], 1);
    assert_eq!(c.routes["lazy_table"].count, 1);
    let json = serde_json::to_value(c).unwrap();
    assert_eq!(json["roles"]["per_layer_token_embd"]["route"], "lazy_table");
}

#[test]
fn a_missing_tensor_is_refused_by_name() {
    let mut spec = qwen4_exp::fixture::tiny();
    assert!(spec.remove_tensor("blk.1.ssm_a"));
    let e = load_err(&spec);
    assert!(
        matches!(&e, Error::MissingTensor { name, .. } if name == "blk.1.ssm_a"),
        "{e}"
    );
    assert!(e.to_string().contains("\"blk.1.ssm_a\""), "{e}");
}

#[test]
fn an_extra_tensor_is_refused_by_name() {
    for name in [
        "blk.0.mystery.weight",
        "blk.4.attn_norm.weight",
        "rope_freqs.weight",
    ] {
        let mut spec = qwen4_exp::fixture::tiny();
        spec.add_tensor(name, GgmlType::F32, &[16]);
        let e = load_err(&spec);
        assert!(
            matches!(&e, Error::ExtraTensor { name: n, .. } if n == name),
            "{e}"
        );
        assert!(e.to_string().contains(name), "{e}");
    }
    // Full-attention biases are dropped only on full-attention layers.
    let mut spec = qwen4_exp::fixture::tiny();
    spec.add_tensor("blk.0.attn_q.bias", GgmlType::F32, &[128]);
    assert!(
        matches!(load_err(&spec), Error::ExtraTensor { name, .. } if name == "blk.0.attn_q.bias")
    );
}

#[test]
fn a_wrong_shape_is_refused_by_name() {
    let mut spec = qwen4_exp::fixture::tiny();
    spec.tensor_mut("blk.2.attn_k.weight").unwrap().dims = vec![256, 64];
    let e = load_err(&spec);
    match &e {
        Error::WrongShape {
            name,
            expected,
            found,
        } => {
            assert_eq!(name, "blk.2.attn_k.weight");
            assert_eq!(expected, "[256, 32]");
            assert_eq!(found, &[256, 64]);
        }
        other => panic!("{other}"),
    }
    assert!(e.to_string().contains("blk.2.attn_k.weight"));

    // An expert stack with a wrong expert count.
    let mut spec = qwen4_exp::fixture::tiny();
    spec.tensor_mut("blk.0.ffn_down_exps.weight").unwrap().dims = vec![32, 256, 3];
    assert!(
        matches!(load_err(&spec), Error::WrongShape { name, .. } if name == "blk.0.ffn_down_exps.weight")
    );

    // The PLE table needs max(off + voc) = 64 rows at least.
    let mut spec = qwen4_exp::fixture::tiny();
    spec.tensor_mut("per_layer_token_embd.weight").unwrap().dims = vec![64, 63];
    assert!(
        matches!(load_err(&spec), Error::WrongShape { name, .. } if name == "per_layer_token_embd.weight")
    );

    // The {E, hc} norms may be stored reshaped.
    let mut spec = qwen4_exp::fixture::tiny();
    spec.tensor_mut("blk.1.hc_ffn_norm.weight").unwrap().dims = vec![1024];
    spec.tensor_mut("output_hc_norm.weight").unwrap().dims = vec![512, 2];
    load(&spec).unwrap();
}

#[test]
fn a_wrong_type_is_refused_by_name() {
    let mut spec = qwen4_exp::fixture::tiny();
    spec.tensor_mut("blk.0.ssm_norm.weight").unwrap().ggml_type = GgmlType::F16;
    let e = load_err(&spec);
    assert!(
        matches!(&e, Error::WrongType { name, expected: TypeClass::F32, found: GgmlType::F16 }
            if name == "blk.0.ssm_norm.weight"),
        "{e}"
    );
    assert!(e.to_string().contains("blk.0.ssm_norm.weight"), "{e}");

    let mut spec = qwen4_exp::fixture::tiny();
    spec.tensor_mut("blk.0.ple_norm_key.weight")
        .unwrap()
        .ggml_type = GgmlType::Q8_0;
    assert!(
        matches!(load_err(&spec), Error::WrongType { name, expected: TypeClass::Float, .. }
            if name == "blk.0.ple_norm_key.weight")
    );

    // Matrices may have any type.
    let mut spec = qwen4_exp::fixture::tiny();
    spec.tensor_mut("blk.2.attn_output.weight")
        .unwrap()
        .ggml_type = GgmlType::IQ4_NL;
    load(&spec).unwrap();
}

#[test]
fn a_missing_or_mistyped_key_is_refused_by_name() {
    for key in [
        "qwen4exp.ssm.state_size",
        "qwen4exp.attention.layer_norm_rms_epsilon",
        "qwen4exp.rope.dimension_sections",
        "qwen4exp.hyper_connection.low_rank",
        "qwen4exp.attention.indexer.top_k",
        "qwen4exp.embedding_length_per_layer_input",
        "qwen4exp.ple.head_offsets",
        "qwen4exp.context_length",
    ] {
        let mut spec = qwen4_exp::fixture::tiny();
        assert!(spec.remove_key(key), "{key}");
        let e = load_err(&spec);
        assert!(
            matches!(&e, Error::MissingKey { key: k } if k == key),
            "{key}: {e}"
        );
        assert!(e.to_string().contains(key), "{e}");
    }

    let mut spec = qwen4_exp::fixture::tiny();
    spec.set_key("qwen4exp.hyper_connection.count", Value::String("4".into()));
    let e = load_err(&spec);
    assert!(
        matches!(&e, Error::KeyType { key, found, .. }
            if key == "qwen4exp.hyper_connection.count" && found == "STRING"),
        "{e}"
    );

    let mut spec = qwen4_exp::fixture::tiny();
    spec.set_key("qwen4exp.ssm.inner_size", Value::U32(96));
    assert!(
        matches!(load_err(&spec), Error::KeyValue { key, .. } if key == "qwen4exp.ssm.inner_size")
    );

    // PLE must sit on a GDN layer.
    let mut spec = qwen4_exp::fixture::tiny();
    spec.set_key("qwen4exp.ple.layers", Value::Array(Array::U32(vec![2])));
    assert!(matches!(load_err(&spec), Error::KeyValue { key, .. } if key == "qwen4exp.ple.layers"));

    let mut spec = qwen4_exp::fixture::tiny();
    spec.set_key("general.architecture", Value::String("qwen3next".into()));
    assert!(
        matches!(load_err(&spec), Error::WrongArchitecture { found: Some(a), .. } if a == "qwen3next")
    );
}

#[test]
fn recurrent_layers_win_over_the_interval_and_the_interval_defaults_to_4() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = qwen4_exp::fixture::tiny();
    spec.set_key(
        "qwen4exp.attention.recurrent_layers",
        Value::Array(Array::Bool(vec![true, false, true, false])),
    );
    let hp = Hparams::from_header(open(&spec, dir.path()).header()).unwrap();
    assert_eq!(
        hp.layers,
        [LayerKind::Gdn, LayerKind::FullAttention, LayerKind::Gdn]
    );
    assert_eq!(hp.full_attention_interval, None);
    // The file's tensors no longer fit: refused by name.
    let e = load_err(&spec);
    assert!(
        matches!(&e, Error::ExtraTensor { name, .. } if name == "blk.1.attn_qkv.weight"),
        "{e}"
    );

    let mut spec = qwen4_exp::fixture::tiny();
    spec.remove_key("qwen4exp.full_attention_interval");
    let hp = Hparams::from_header(open(&spec, dir.path()).header()).unwrap();
    assert_eq!(hp.full_attention_interval, Some(4));
    assert_eq!(hp.layers, [LayerKind::Gdn; 3]);
}

#[test]
fn a_merged_gate_up_stack_is_claimed_and_sliced_per_expert() {
    let mut spec = qwen4_exp::fixture::tiny();
    assert!(spec.remove_tensor("blk.0.ffn_gate_exps.weight"));
    assert!(spec.remove_tensor("blk.0.ffn_up_exps.weight"));
    spec.add_tensor(
        "blk.0.ffn_gate_up_exps.weight",
        GgmlType::Q4_K,
        &[256, 64, 4],
    );
    let model = load(&spec).unwrap();
    let stacks = model.manifest().experts[0];
    assert!(stacks.merged && stacks.gate == stacks.up);
    let stack = model.expert_stack(0, ExpertKind::Gate).unwrap();
    let all = model.weight("blk.0.ffn_gate_up_exps.weight").unwrap();
    assert!(std::ptr::eq(stack, all));
    let stack_bytes = all.host_view().unwrap();
    let expert_bytes = 144 * 64;
    for e in 0..N_EXPERT {
        let gate = model.expert(0, ExpertKind::Gate, e).unwrap();
        let up = model.expert(0, ExpertKind::Up, e).unwrap();
        assert_eq!(gate.dims(), [256, 32]);
        assert_eq!(up.dims(), [256, 32]);
        let base = (e * expert_bytes) as usize;
        let half = expert_bytes as usize / 2;
        assert_eq!(&*gate.host_view().unwrap(), &stack_bytes[base..base + half]);
        assert_eq!(
            &*up.host_view().unwrap(),
            &stack_bytes[base + half..base + 2 * half]
        );
    }
    // Layer 1 keeps separate stacks.
    assert!(!model.manifest().experts[1].merged);
}

#[test]
fn tied_output_is_accepted() {
    let mut spec = qwen4_exp::fixture::tiny();
    spec.remove_tensor("output.weight");
    let model = load(&spec).unwrap();
    assert!(model.manifest().layout.tied_output);
    assert!(model.manifest().spec("output.weight").is_none());
}

/// The fake-device run: each staged weight is copied once and released
/// once across all steps; stacks and the table are never staged whole.
#[test]
fn decode_steps_on_the_fake_device_stage_each_weight_once() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = open(&qwen4_exp::fixture::tiny(), dir.path());
    let file = std::fs::read(gguf.shards()[0].path()).unwrap();
    let infos = gguf.tensors().to_vec();
    let model = Qwen4Exp::load(&gguf).unwrap();
    drop(gguf);
    let fake = FakePlatform::new(FakeConfig::default());
    let queue = fake.backend().create_queue().unwrap();

    let one = simulate_decode(&model, &fake, &*queue, 1, 7).unwrap();
    let n_dense = model.dense_weights().count();
    assert_eq!(one.dense_calls, n_dense as u64);
    assert_eq!(one.expert_calls, 3 * 2 * N_LAYER as u64);
    assert_eq!(one.ple_rows, 4);
    let after_one = fake.stage_counters().snapshot();
    // One step: every dense weight and 2 experts x 3 matrices per layer.
    assert_eq!(after_one.uploads, n_dense as u64 + 6 * N_LAYER as u64);

    let report = simulate_decode(&model, &fake, &*queue, 6, 7).unwrap();
    assert_eq!(report.dense_calls, 6 * n_dense as u64);
    let counts = fake.stage_counters().snapshot();
    let fake_counts = fake.counters();
    let experts_made = model.experts_made().count();
    // Distinct picks over the 6 steps, from the same generator.
    let mut picked = std::collections::HashSet::new();
    for step in 0..6 {
        for layer in 0..N_LAYER {
            for e in pick_experts(7, step, layer, N_EXPERT, 2) {
                picked.insert((layer, e));
            }
        }
    }
    assert_eq!(experts_made, 3 * picked.len());
    let staged = n_dense + experts_made;
    assert_eq!(model.staged_weights(), staged);
    assert_eq!(counts.uploads, staged as u64);
    assert_eq!(counts.releases, staged as u64);
    assert_eq!(fake_counts.allocs, staged as u64);
    assert_eq!(fake_counts.copies_completed, staged as u64);
    assert_eq!(fake_counts.releases, staged as u64);
    assert_eq!(fake_counts.frees, 0);

    // Repeated steps add no uploads.
    simulate_decode(&model, &fake, &*queue, 6, 7).unwrap();
    model.stage_dense(&fake, &*queue).unwrap();
    assert_eq!(fake.stage_counters().snapshot(), counts);
    assert_eq!(fake.counters().allocs, staged as u64);

    // Each release came after its copy completed, once per weight.
    let mut released = std::collections::HashSet::new();
    for ev in fake.events() {
        if let Event::Release {
            weight,
            borrowed,
            pending_copies,
            ..
        } = ev
        {
            assert!(borrowed && pending_copies == 0, "{weight}");
            assert!(released.insert(weight.clone()), "{weight} released twice");
        }
    }
    assert_eq!(released.len(), staged);

    // The stacks and the table were never staged whole, and cannot be.
    assert_eq!(model.whole_stacks_staged(), 0);
    for w in model.weights().iter().filter(|w| w.flags().expert_streamed) {
        assert!(w.device_copy().is_none(), "{}", w.name());
        let err = resident_weight(w, &fake, &*queue).unwrap_err();
        assert!(matches!(err, SeamError::ExpertStreamed { .. }), "{err}");
    }
    let stack_bytes: u64 = model
        .weights()
        .iter()
        .filter(|w| w.flags().expert_streamed)
        .map(|w| w.host().len())
        .sum();
    let dense_bytes: u64 = model.dense_weights().map(|w| w.host().len()).sum();
    let expert_bytes: u64 = model.experts_made().map(|w| w.host().len()).sum();
    assert_eq!(counts.uploaded_bytes, dense_bytes + expert_bytes);
    assert!(counts.uploaded_bytes < model.census().file_bytes);
    assert!(counts.uploaded_bytes < dense_bytes + stack_bytes);

    // A staged expert's device bytes are its rows in the file.
    let info = infos
        .iter()
        .find(|t| t.name == "blk.1.ffn_down_exps.weight")
        .unwrap();
    let per_expert = info.n_bytes / N_EXPERT;
    assert_eq!(per_expert, 34 * 256);
    for e in 0..N_EXPERT {
        let w = model.expert(1, ExpertKind::Down, e).unwrap();
        let Some(copy) = w.device_copy() else {
            continue;
        };
        let mut dev = vec![0u8; per_expert as usize];
        fake.backend()
            .read_back(copy.buffer(), 0, &mut dev)
            .unwrap();
        let at = (info.offset + e * per_expert) as usize;
        assert_eq!(dev, &file[at..at + per_expert as usize], "expert {e}");
        assert_eq!(w.name(), format!("blk.1.ffn_down_exps.weight[{e}]"));
        assert_eq!(w.dims(), [32, 256]);
        assert_eq!(w.role().as_str(), "ffn_down_exps");
        // The cache hands out the same weight (and memo) every time.
        assert!(std::ptr::eq(
            w,
            model.expert(1, ExpertKind::Down, e).unwrap()
        ));
    }
    // A dense weight's device bytes are its bytes in the file too.
    let w = model.weight("blk.2.attn_q.weight").unwrap();
    let info = infos.iter().find(|t| t.name == w.name()).unwrap();
    let mut dev = vec![0u8; info.n_bytes as usize];
    fake.backend()
        .read_back(w.device_copy().unwrap().buffer(), 0, &mut dev)
        .unwrap();
    assert_eq!(
        dev,
        &file[info.offset as usize..(info.offset + info.n_bytes) as usize]
    );
}

#[test]
fn ple_rows_are_gathered_from_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = open(&qwen4_exp::fixture::tiny(), dir.path());
    let file = std::fs::read(gguf.shards()[0].path()).unwrap();
    let info = gguf.tensor("per_layer_token_embd.weight").unwrap().clone();
    let model = Qwen4Exp::load(&gguf).unwrap();
    let row_bytes = 2 * 18;
    for row in [0, 1, 63, PLE_ROWS - 1] {
        let at = (info.offset + row * row_bytes) as usize;
        assert_eq!(
            model.ple_row(row).unwrap(),
            &file[at..at + row_bytes as usize]
        );
    }
    assert!(matches!(
        model.ple_row(PLE_ROWS),
        Err(Error::RowOutOfRange {
            row: PLE_ROWS,
            rows: PLE_ROWS,
            ..
        })
    ));
    assert!(matches!(
        model.expert(0, ExpertKind::Gate, N_EXPERT),
        Err(Error::NoSuchExpert { .. })
    ));
    assert!(matches!(
        model.expert(N_LAYER, ExpertKind::Gate, 0),
        Err(Error::NoSuchLayer { .. })
    ));
}

#[test]
fn on_the_host_nothing_is_uploaded() {
    let model = load(&qwen4_exp::fixture::tiny()).unwrap();
    let host = platform_host::HostPlatform::new();
    let queue = host.backend().create_queue().unwrap();
    let report = simulate_decode(&model, &host, &*queue, 2, 0).unwrap();
    assert!(report.expert_calls > 0);
    assert_eq!(host.stage_counters().snapshot().uploads, 0);
    assert_eq!(model.staged_weights(), 0);
}

#[test]
fn a_model_without_ple_claims_no_ple_tensors() {
    let mut spec = qwen4_exp::fixture::tiny();
    assert!(spec.remove_key("qwen4exp.ple.layers"));
    let e = load_err(&spec);
    assert!(
        matches!(&e, Error::ExtraTensor { name, .. } if name == "per_layer_token_embd.weight"),
        "{e}"
    );
    for name in [
        "per_layer_token_embd.weight",
        "blk.0.ple_key.weight",
        "blk.0.ple_value.weight",
        "blk.0.ple_norm_key.weight",
        "blk.0.ple_norm_query.weight",
        "blk.0.ple_norm_conv.weight",
        "blk.0.ple_conv1d.weight",
    ] {
        assert!(spec.remove_tensor(name), "{name}");
    }
    let model = load(&spec).unwrap();
    assert!(model.hparams().ple.is_none());
    assert!(matches!(model.ple_row(0), Err(Error::Absent { .. })));
    let fake = FakePlatform::new(FakeConfig::default());
    let queue = fake.backend().create_queue().unwrap();
    let report = simulate_decode(&model, &fake, &*queue, 2, 1).unwrap();
    assert_eq!(report.ple_rows, 0);
    assert_eq!(
        fake.stage_counters().snapshot().uploads,
        model.staged_weights() as u64
    );
}
