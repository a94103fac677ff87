//! The three routed expert banks (`ffn_{gate,up,down}_exps`) of every MoE
//! layer take the expert route on the fake staging device: each expert a
//! sub-span borrow staged when the router picks it, one at a time, each
//! once, released once; no bank staged whole. And the rule for marking a
//! bank resident (src/model.rs): refused, by name, by the seam and by the
//! load.

use std::collections::BTreeMap;

use family_kit::WeightReader;
use family_kit::manifest::Route;
use glm5_next::forward::greedy;
use glm5_next::{Glm5Next, LoadOptions, fixture};
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

#[test]
fn every_bank_stages_its_experts_one_at_a_time_each_once_never_whole() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = open(&dir);
    let model = Glm5Next::load(&gguf).expect("load");
    let platform = FakePlatform::new(FakeConfig::default());
    let queue = platform.backend().create_queue().unwrap();
    let prompt = [1, 2, 3, 4, 5, 6, 7, 8];
    let steps = 5;
    let reader = WeightReader::new(&platform, &*queue);
    let mut after = 0;
    greedy(
        &model,
        reader,
        family_kit::Numerics::default(),
        &prompt,
        steps,
        &mut || after += 1,
    )
    .expect("decode");
    assert_eq!(after, steps + 1);
    let hp = model.hparams();
    // 12 positions, each MoE layer picks n_used of n_expert experts per
    // position: more picks than experts, so an expert is picked again and
    // must not be staged again.
    let positions = prompt.len() + steps - 1;
    let moe_layers = (0..hp.n_layer).filter(|&l| hp.is_moe(l)).count();
    assert!(moe_layers >= 3, "the fixture has {moe_layers} MoE layers");
    assert!(positions * hp.n_expert_used[hp.n_dense] > hp.n_expert);

    // Each bank: name -> (file offset, bytes).
    let mut banks = BTreeMap::new();
    for b in model.banks() {
        for (h, _) in b.each() {
            let spec = &model.manifest().tensors[h.0];
            assert_eq!(spec.route, Route::ExpertStack, "{}", spec.name);
            let info = gguf.tensor(&spec.name).unwrap();
            let borrow = gguf.tensor_borrow(info).unwrap();
            banks.insert(spec.name.clone(), (borrow.offset(), borrow.len()));
        }
    }
    assert_eq!(banks.len(), 3 * moe_layers);

    let events = platform.events();
    // Per bank, the experts released (by index), in order.
    let mut staged: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut open_alloc: Option<u64> = None;
    for e in &events {
        match e {
            Event::Alloc { len, .. } => {
                assert!(
                    open_alloc.is_none(),
                    "a weight was allocated while another was being staged: {events:?}"
                );
                open_alloc = Some(*len);
            }
            Event::Release {
                weight,
                offset,
                len,
                ..
            } => {
                let alloc = open_alloc.take().expect("a release follows its allocation");
                assert!(
                    !banks.contains_key(weight),
                    "bank {weight} was staged whole"
                );
                let Some((bank, idx)) = weight.strip_suffix(']').and_then(|w| w.rsplit_once('['))
                else {
                    continue;
                };
                let (bank_off, bank_len) = banks[bank];
                let expert: u64 = idx.parse().unwrap();
                let per = bank_len / hp.n_expert as u64;
                assert_eq!(*len, per, "{weight}: one expert's bytes");
                assert_eq!(*offset, bank_off + expert * per, "{weight}: its own rows");
                assert!(
                    alloc >= per && alloc < bank_len,
                    "{weight}: allocated {alloc}"
                );
                staged.entry(bank.to_owned()).or_default().push(expert);
            }
            _ => {}
        }
    }
    for bank in banks.keys() {
        let experts = staged
            .get(bank)
            .unwrap_or_else(|| panic!("no expert of {bank} was staged"));
        let mut unique = experts.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(
            &unique.len(),
            &experts.len(),
            "{bank}: staged twice: {experts:?}"
        );
    }
    // The three banks of a layer stage the same experts (the router's picks).
    for b in model.banks() {
        let [g, u, d] = b.each().map(|(h, _)| {
            let mut v = staged[&model.manifest().tensors[h.0].name].clone();
            v.sort_unstable();
            v
        });
        assert_eq!(g, u);
        assert_eq!(g, d);
    }
    let made = model.weights().experts_made().count();
    assert_eq!(made, staged.values().map(Vec::len).sum::<usize>());
    assert_eq!(model.weights().whole_stacks_staged(), 0);
    let seam = platform.stage_counters().snapshot();
    assert_eq!(seam.uploads, seam.releases);
}

#[test]
fn a_bank_asked_resident_is_refused_by_name_by_the_seam_and_the_load() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = open(&dir);
    let model = Glm5Next::load(&gguf).expect("load");
    let platform = FakePlatform::new(FakeConfig::default());
    let queue = platform.backend().create_queue().unwrap();
    for b in model.banks() {
        for (h, _) in b.each() {
            let bank = model.get(h);
            assert!(bank.flags().expert_streamed, "{}", bank.name());
            match resident_weight(bank, &platform, &*queue) {
                Err(e @ SeamError::ExpertStreamed { .. }) => {
                    assert!(e.to_string().contains(bank.name()), "{e}");
                }
                other => panic!("{}: {other:?}", bank.name()),
            }
        }
    }
    assert_eq!(platform.counters().allocs, 0, "nothing staged");
    // The shared expert is dense: resident by the ordinary route.
    let shexp = model
        .manifest()
        .handle("blk.1.ffn_up_shexp.weight")
        .expect("shared expert");
    assert!(resident_weight(model.get(shexp), &platform, &*queue).is_ok());

    let bank = "blk.2.ffn_down_exps.weight".to_owned();
    let e = Glm5Next::load_with(
        &gguf,
        &LoadOptions {
            resident_banks: vec![bank.clone()],
        },
    )
    .expect_err("a bank marked resident");
    let msg = e.to_string();
    assert!(
        msg.contains(&bank) && msg.contains("never resident whole"),
        "{msg}"
    );
    let e = Glm5Next::load_with(
        &gguf,
        &LoadOptions {
            resident_banks: vec!["blk.1.ffn_up_shexp.weight".into()],
        },
    )
    .expect_err("not a bank");
    assert!(e.to_string().contains("not a routed expert bank"), "{e}");
    assert!(Glm5Next::load_with(&gguf, &LoadOptions::default()).is_ok());
}
