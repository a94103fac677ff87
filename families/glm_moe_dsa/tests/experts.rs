//! The routed expert stacks (`ffn_{gate,up,down}_exps`) take the expert
//! route on the fake staging device: an expert is a sub-span borrow of its
//! own rows, staged only when the router picks it, each once, released
//! once; no stack is ever staged whole, nor accepted whole by the seam.

use std::collections::{BTreeMap, BTreeSet};

use family_kit::WeightReader;
use family_kit::manifest::Route;
use glm_moe_dsa::forward::greedy;
use glm_moe_dsa::model::Ffn;
use glm_moe_dsa::{GlmMoeDsa, fixture};
use platform_fake::{Event, FakeConfig, FakePlatform};
use seam::borrow::MapOptions;
use seam::gguf::GgufModel;
use seam::platform::Platform;
use seam::{SeamError, resident_weight};

fn open(dir: &tempfile::TempDir) -> GgufModel {
    let path = dir.path().join("f.gguf");
    fixture::write_fixture(&path).expect("write fixture");
    GgufModel::open(&path, MapOptions { prefault: false }).expect("open")
}

/// Stack name -> (file offset, bytes), for every stack of the model.
fn stacks(model: &GlmMoeDsa, gguf: &GgufModel) -> BTreeMap<String, (u64, u64)> {
    let mut out = BTreeMap::new();
    for layer in &model.handles().layers {
        if let Ffn::Moe { stacks, .. } = layer.ffn {
            for h in stacks {
                let spec = &model.manifest().tensors[h.0];
                assert_eq!(spec.route, Route::ExpertStack, "{}", spec.name);
                let borrow = gguf
                    .tensor_borrow(gguf.tensor(&spec.name).unwrap())
                    .unwrap();
                out.insert(spec.name.clone(), (borrow.offset(), borrow.len()));
            }
        }
    }
    out
}

/// Decodes on a fake device; returns per stack the experts released, in
/// order, after checking each release is one expert's own rows.
fn staged_experts(
    model: &GlmMoeDsa,
    gguf: &GgufModel,
    prompt: &[u32],
    steps: usize,
) -> BTreeMap<String, Vec<u64>> {
    let platform = FakePlatform::new(FakeConfig::default());
    let queue = platform.backend().create_queue().unwrap();
    let reader = WeightReader::new(&platform, &*queue);
    greedy(
        model,
        reader,
        family_kit::Numerics::default(),
        prompt,
        steps,
        &mut || {},
    )
    .expect("decode");
    let stacks = stacks(model, gguf);
    let n_expert = model.hparams().n_expert as u64;
    let mut staged: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for e in platform.events() {
        let Event::Release {
            weight,
            offset,
            len,
            ..
        } = e
        else {
            continue;
        };
        assert!(!stacks.contains_key(&weight), "stack {weight} staged whole");
        let Some((stack, idx)) = weight.strip_suffix(']').and_then(|w| w.rsplit_once('[')) else {
            continue;
        };
        let (stack_off, stack_len) = stacks[stack];
        let expert: u64 = idx.parse().unwrap();
        let per = stack_len / n_expert;
        assert_eq!(len, per, "{weight}: one expert's bytes");
        assert_eq!(offset, stack_off + expert * per, "{weight}: its own rows");
        staged.entry(stack.to_owned()).or_default().push(expert);
    }
    let seam = platform.stage_counters().snapshot();
    assert_eq!(seam.uploads, seam.releases, "every upload released");
    assert_eq!(model.weights().whole_stacks_staged(), 0);
    staged
}

#[test]
fn one_token_stages_only_the_picked_experts_of_each_stack() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = open(&dir);
    let model = GlmMoeDsa::load(&gguf).expect("load");
    let hp = model.hparams();
    assert!(hp.n_expert_used < hp.n_expert);
    // One position: each MoE layer picks n_used of n_expert experts.
    let staged = staged_experts(&model, &gguf, &[1], 1);
    let stacks = stacks(&model, &gguf);
    assert_eq!(staged.len(), stacks.len(), "every stack staged some expert");
    for (stack, experts) in &staged {
        assert_eq!(
            experts.len(),
            hp.n_expert_used,
            "{stack}: only the picked experts: {experts:?}"
        );
    }
}

#[test]
fn over_many_steps_each_expert_is_staged_once_and_stacks_never_whole() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = open(&dir);
    let model = GlmMoeDsa::load(&gguf).expect("load");
    let hp = model.hparams();
    let (prompt, steps) = ([1, 2, 3, 4, 5, 6], 5);
    // More picks than experts: an expert picked again must not be staged
    // again.
    assert!((prompt.len() + steps - 1) * hp.n_expert_used > hp.n_expert);
    let staged = staged_experts(&model, &gguf, &prompt, steps);
    for (stack, experts) in &staged {
        let unique: BTreeSet<u64> = experts.iter().copied().collect();
        assert_eq!(
            unique.len(),
            experts.len(),
            "{stack}: staged twice: {experts:?}"
        );
    }
    // The three stacks of a layer stage the same experts (the router's).
    for layer in &model.handles().layers {
        if let Ffn::Moe { stacks, .. } = layer.ffn {
            let [g, u, d] = stacks.map(|h| {
                let mut v = staged[&model.manifest().tensors[h.0].name].clone();
                v.sort_unstable();
                v
            });
            assert_eq!(g, u);
            assert_eq!(g, d);
        }
    }
    let made = model.weights().experts_made().count();
    assert_eq!(made, staged.values().map(Vec::len).sum::<usize>());
}

#[test]
fn the_seam_refuses_a_stack_whole_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = open(&dir);
    let model = GlmMoeDsa::load(&gguf).expect("load");
    let platform = FakePlatform::new(FakeConfig::default());
    let queue = platform.backend().create_queue().unwrap();
    let names = stacks(&model, &gguf);
    assert_eq!(names.len(), 9, "three MoE layers of three stacks");
    for name in names.keys() {
        let stack = model.get(model.manifest().handle(name).unwrap());
        assert!(stack.flags().expert_streamed, "{name}");
        match resident_weight(stack, &platform, &*queue) {
            Err(e @ SeamError::ExpertStreamed { .. }) => {
                assert!(e.to_string().contains(name), "{e}");
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    assert_eq!(platform.counters().allocs, 0, "nothing staged");
}
