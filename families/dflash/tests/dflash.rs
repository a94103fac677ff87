//! dflash over the qwen4_exp built-in target: speculation equals the
//! target's greedy tokens; the borrowed tables are the target's own weights
//! (staged once, released once, whichever model asks first); refusals.

use dflash::fixture::DraftSpec;
use dflash::forward::DraftRunner;
use dflash::spec::{Proposer, QwenTarget, speculate};
use dflash::{Dflash, Error, TargetTables};
use platform_fake::{Event, FakeConfig, FakePlatform};
use qwen4_exp::Qwen4Exp;
use qwen4_exp::engine::{SeamWeights, greedy};
use seam::borrow::MapOptions;
use seam::gguf::{GgmlType, GgufModel};
use seam::platform::Platform;
use seam::weight::{Role, Weight};

struct Files {
    _dir: tempfile::TempDir,
    target: GgufModel,
    draft: GgufModel,
}

fn files(spec: &DraftSpec) -> Files {
    let dir = tempfile::tempdir().expect("tempdir");
    let (t, d) = (
        dir.path().join("target.gguf"),
        dir.path().join("draft.gguf"),
    );
    qwen4_exp::fixture::write_fixture(&t).expect("write target");
    spec.writer().write_file(&d).expect("write draft");
    let opts = MapOptions { prefault: false };
    Files {
        target: GgufModel::open(&t, opts).expect("open target"),
        draft: GgufModel::open(&d, opts).expect("open draft"),
        _dir: dir,
    }
}

fn spec_vs_greedy(prompt: &[u32], n: usize) {
    let f = files(&DraftSpec::tiny());
    let target = Qwen4Exp::load(&f.target).expect("target");
    let draft = Dflash::load(&f.draft, &target).expect("draft");
    let platform = FakePlatform::new(FakeConfig::default());
    let queue = platform.backend().create_queue().expect("queue");
    let (reference, _) = greedy(
        SeamWeights::new(&target, &f.target, &platform, &*queue),
        family_kit::Numerics::F32_CACHE,
        prompt,
        n,
    )
    .expect("greedy");
    let verifier = QwenTarget::new(
        SeamWeights::new(&target, &f.target, &platform, &*queue),
        &draft.hparams().target_layers,
        family_kit::Numerics::F32_CACHE,
    )
    .expect("verifier");
    let mut runner = DraftRunner::new(&draft, &platform, &*queue);
    let report = speculate(&verifier, &mut runner, prompt, n).expect("speculate");
    assert_eq!(report.tokens, reference);
    assert_eq!(report.tokens.len(), n);
    assert!(report.proposed > 0);

    // A proposer that knows the answer (all, or only its first draft):
    // the accepted path gives the same tokens, with fewer rounds.
    for right in [usize::MAX, 1] {
        let mut oracle = Oracle {
            reference: reference.clone(),
            seen: 0,
            prompt: prompt.len(),
            right,
        };
        let report = speculate(&verifier, &mut oracle, prompt, n).expect("oracle");
        assert_eq!(report.tokens, reference, "oracle right={right}");
        assert!(report.accepted > 0, "oracle right={right}: {report:?}");
    }
}

/// Proposes the reference tokens after the anchor; the first `right` of
/// each block are right, the rest wrong.
struct Oracle {
    reference: Vec<u32>,
    seen: usize,
    prompt: usize,
    right: usize,
}

impl Proposer for Oracle {
    fn push_context(&mut self, _taps: &[f32]) -> Result<(), Error> {
        self.seen += 1;
        Ok(())
    }
    fn propose(&mut self, _anchor: u32) -> Result<Vec<u32>, Error> {
        // The anchor is reference[seen - prompt]; drafts follow it.
        let at = self.seen - self.prompt + 1;
        Ok((0..3)
            .map(|i| match self.reference.get(at + i) {
                Some(&t) if i < self.right => t,
                Some(&t) => (t + 1) % 64,
                None => 0,
            })
            .collect())
    }
}

#[test]
fn speculation_equals_target_greedy_short() {
    spec_vs_greedy(&[1, 2, 3], 6);
}

#[test]
fn speculation_equals_target_greedy_24() {
    spec_vs_greedy(&[5, 9], 24);
}

fn releases_of(platform: &FakePlatform, name: &str) -> usize {
    platform
        .events()
        .iter()
        .filter(|e| matches!(e, Event::Release { weight, .. } if weight == name))
        .count()
}

/// Stages the target's dense weights and runs the draft once, in the order
/// asked; returns (uploads, device bytes) after each half.
fn stage_both(draft_first: bool) -> (u64, u64) {
    let f = files(&DraftSpec::tiny());
    let target = Qwen4Exp::load(&f.target).expect("target");
    let draft = Dflash::load(&f.draft, &target).expect("draft");
    // Shared by reference, never copied.
    assert!(std::ptr::eq(
        draft.token_embd(),
        target.weight("token_embd.weight").unwrap()
    ));
    assert!(std::ptr::eq(
        draft.output_head(),
        target.weight("output.weight").unwrap()
    ));
    assert_eq!(draft.census().borrowed_host_bytes_added, 0);
    let own_bytes: u64 = draft.weights().iter().map(|w| w.host().len()).sum();
    assert_eq!(own_bytes, draft.census().own_bytes);

    let platform = FakePlatform::new(FakeConfig::default());
    let queue = platform.backend().create_queue().expect("queue");
    let n_dense = target.dense_weights().count() as u64;
    let n_own = draft.weights().len() as u64;
    let run_draft = || {
        let mut runner = DraftRunner::new(&draft, &platform, &*queue);
        let taps = vec![0.5f32; 2 * 256];
        runner.push_context(&taps).expect("context");
        runner.propose(7).expect("propose");
        runner.propose(8).expect("propose again");
    };
    let uploads = || platform.stage_counters().snapshot().uploads;
    if draft_first {
        run_draft();
        assert_eq!(uploads(), n_own + 2, "the draft staged the tables");
        target.stage_dense(&platform, &*queue).expect("target");
    } else {
        target.stage_dense(&platform, &*queue).expect("target");
        let (u0, b0) = (uploads(), platform.counters().device_bytes);
        assert_eq!(u0, n_dense);
        run_draft();
        // The draft adds its own weights only: the tables add 0 uploads
        // and 0 device bytes.
        assert_eq!(uploads() - u0, n_own);
        assert_eq!(platform.counters().device_bytes - b0, own_bytes);
    }
    assert_eq!(uploads(), n_dense + n_own, "each weight staged once");
    for name in ["token_embd.weight", "output.weight"] {
        assert_eq!(releases_of(&platform, name), 1, "{name} released once");
        let w = target.weight(name).unwrap();
        assert!(w.device_copy().is_some());
    }
    (uploads(), platform.counters().device_bytes)
}

#[test]
fn tables_staged_once_draft_first() {
    stage_both(true);
}

#[test]
fn tables_staged_once_target_first() {
    stage_both(false);
}

#[test]
fn both_orders_hold_the_same_device_bytes() {
    assert_eq!(stage_both(true), stage_both(false));
}

fn refusal(spec: &DraftSpec) -> String {
    let f = files(spec);
    let target = Qwen4Exp::load(&f.target).expect("target");
    Dflash::load(&f.draft, &target)
        .expect_err("refused")
        .to_string()
}

#[test]
fn refuses_fc_width_not_matching_taps() {
    let mut spec = DraftSpec::tiny();
    spec.fc_width = Some(256);
    let msg = refusal(&spec);
    assert!(msg.contains("fc.weight") && msg.contains("taps"), "{msg}");
}

#[test]
fn refuses_tap_layer_past_the_target() {
    let mut spec = DraftSpec::tiny();
    spec.hparams.target_layers = vec![0, 3];
    let msg = refusal(&spec);
    assert!(msg.contains("tap layer 3"), "{msg}");
}

#[test]
fn refuses_own_token_embd() {
    let mut spec = DraftSpec::tiny();
    spec.extra.push(("token_embd.weight".into(), vec![256, 64]));
    let msg = refusal(&spec);
    assert!(
        msg.contains("token_embd.weight") && msg.contains("borrows"),
        "{msg}"
    );
}

/// A target with only the tables it is given.
struct Stub {
    embd: Option<Weight>,
    out: Option<Weight>,
}

impl TargetTables for Stub {
    fn token_embd(&self) -> Option<&Weight> {
        self.embd.as_ref()
    }
    fn output_head(&self) -> Option<&Weight> {
        self.out.as_ref()
    }
    fn n_embd(&self) -> usize {
        256
    }
    fn n_vocab(&self) -> usize {
        64
    }
    fn n_layer(&self) -> usize {
        3
    }
}

fn table(name: &str) -> Option<Weight> {
    Some(Weight::owned(
        name,
        GgmlType::F32,
        vec![256, 64],
        Role::new("table"),
        vec![0u8; 256 * 64 * 4],
    ))
}

#[test]
fn stub_target_tables_are_borrowed_or_missing_named() {
    let f = files(&DraftSpec::tiny());
    let full = Stub {
        embd: table("token_embd.weight"),
        out: table("output.weight"),
    };
    let draft = Dflash::load(&f.draft, &full).expect("stub with both tables");
    assert!(std::ptr::eq(
        draft.token_embd(),
        full.embd.as_ref().unwrap()
    ));
    assert!(std::ptr::eq(
        draft.output_head(),
        full.out.as_ref().unwrap()
    ));
    drop(draft);

    let no_embd = Stub {
        embd: None,
        out: table("output.weight"),
    };
    let msg = Dflash::load(&f.draft, &no_embd).unwrap_err().to_string();
    assert!(msg.contains("lacks token_embd"), "{msg}");
    let no_out = Stub {
        embd: table("token_embd.weight"),
        out: None,
    };
    let msg = Dflash::load(&f.draft, &no_out).unwrap_err().to_string();
    assert!(msg.contains("lacks output"), "{msg}");
}

/// The binary loads through a session: `VT_GGUF_PREFAULT` reaches it (the
/// policy line names it with its source) and on the fake device, a staging
/// device, the ring carries the weights.
#[test]
fn the_binary_loads_through_a_session_with_the_knobs_and_the_ring() {
    let r = family_kit::conformance::the_binary_loads_through_a_session(
        env!("CARGO_BIN_EXE_dflash"),
        &["--device", "fake", "--json", "--steps", "2"],
    );
    let spec = &r["family"]["speculation"]["tokens"];
    assert_eq!(spec.as_array().map(Vec::len), Some(2));
    assert_eq!(spec, &r["generated"], "the target's greedy tokens");
    assert_eq!(r["family"]["matches_target_greedy"], true);
}
