//! dflash on the fake device's op layer against the host path: the
//! target's logits ([`DeviceTarget`] over qwen4_exp's `DeviceDecoder`)
//! and the draft's block logits ([`DeviceDraft`]) within 1e-4 of the host
//! path's at every position (the taps within 1e-6 of their largest
//! magnitude: the device keeps the residual streams in `f32`, the host in
//! `f64`, and the taps reach 1e4), speculation with the same
//! tokens and acceptance figures, no byte of a staged weight read back
//! after any step of either model, and the same uploads and releases on
//! the fake staging device.

use std::cell::Cell;
use std::rc::Rc;

use device_ops::Ops;
use dflash::Dflash;
use dflash::device::DeviceDraft;
use dflash::fixture::DraftSpec;
use dflash::forward::DraftRunner;
use dflash::spec::{DeviceTarget, Proposer, QwenTarget, SpecReport, TargetStep, speculate};
use family_kit::golden::max_bit_diff;
use platform_fake::ops::fake_ops;
use platform_fake::{FakeConfig, FakePlatform};
use qwen4_exp::Qwen4Exp;
use qwen4_exp::device::DeviceDecoder;
use qwen4_exp::engine::{SeamWeights, greedy};
use seam::borrow::MapOptions;
use seam::gguf::GgufModel;
use seam::platform::Platform;

const TOL: f64 = 1e-4;

struct Files {
    _dir: tempfile::TempDir,
    target: GgufModel,
    draft: GgufModel,
}

fn files() -> Files {
    let dir = tempfile::tempdir().expect("tempdir");
    let (t, d) = (
        dir.path().join("target.gguf"),
        dir.path().join("draft.gguf"),
    );
    qwen4_exp::fixture::write_fixture(&t).expect("write target");
    DraftSpec::tiny()
        .writer()
        .write_file(&d)
        .expect("write draft");
    let opts = MapOptions { prefault: false };
    Files {
        target: GgufModel::open(&t, opts).expect("open target"),
        draft: GgufModel::open(&d, opts).expect("open draft"),
        _dir: dir,
    }
}

fn no_weight_read_back(ops: &dyn Ops, what: &str) {
    let c = ops.counters();
    assert_eq!(
        c.weight_read_back_bytes, 0,
        "{what}: a product read a staged weight back"
    );
    assert!(c.kernel_launches > 0, "{what}: no kernel launched");
}

/// The same uploads, bytes and releases on both fake devices.
fn same_staging(host: &FakePlatform, dev: &FakePlatform) {
    let (hs, ds) = (
        host.stage_counters().snapshot(),
        dev.stage_counters().snapshot(),
    );
    assert!(hs.uploads > 0);
    assert_eq!(ds.uploads, hs.uploads, "uploads");
    assert_eq!(ds.releases, hs.releases, "releases");
    assert_eq!(ds.uploaded_bytes, hs.uploaded_bytes, "uploaded bytes");
    assert_eq!(
        dev.counters().releases,
        host.counters().releases,
        "fake releases"
    );
}

#[test]
fn the_device_target_and_draft_match_the_host_path_at_every_position() {
    let f = files();
    // One model a device: a weight is staged on one device.
    let (target, dev_target) = (
        Qwen4Exp::load(&f.target).expect("target"),
        Qwen4Exp::load(&f.target).expect("target"),
    );
    let draft = Dflash::load(&f.draft, &target).expect("draft");
    let dev_draft = Dflash::load(&f.draft, &dev_target).expect("draft");
    let taps = &draft.hparams().target_layers;
    let host_dev = FakePlatform::new(FakeConfig::default());
    let host_q = host_dev.backend().create_queue().unwrap();
    let dev = FakePlatform::new(FakeConfig::default());
    let dev_q = dev.backend().create_queue().unwrap();

    let host_target = QwenTarget::new(
        SeamWeights::new(&target, &f.target, &host_dev, &*host_q),
        taps,
        family_kit::Numerics::F32_CACHE,
    )
    .expect("host target");
    let mut host_state = host_target.start();
    let mut host_runner = DraftRunner::new(&draft, &host_dev, &*host_q);
    let ops: Rc<dyn Ops + '_> = Rc::new(fake_ops(&dev));
    let decoder = DeviceDecoder::with_shared_ops(
        &dev_target,
        &f.target,
        &dev,
        &*dev_q,
        Rc::clone(&ops),
        family_kit::Numerics::F32_CACHE,
    )
    .expect("device decoder");
    let dev_target_step = DeviceTarget::new(decoder, taps).expect("device target");
    let mut dev_state = dev_target_step.start();
    let mut dev_runner =
        DeviceDraft::new(&dev_draft, &dev, &*dev_q, Rc::clone(&ops)).expect("device draft");

    let prompt = [1u32, 2, 3];
    let steps = 10;
    let (mut worst_logits, mut worst_taps, mut worst_draft) = (0f64, 0f64, 0f64);
    let mut feed = prompt.to_vec();
    let mut i = 0;
    while i < feed.len() && i < prompt.len() + steps {
        let t = feed[i];
        let (hl, ht) = host_target.step(&mut host_state, t).expect("host step");
        let (dl, dt) = dev_target_step
            .step(&mut dev_state, t)
            .expect("device step");
        no_weight_read_back(&*ops, &format!("target, position {i}"));
        let (dlog, dtap) = (max_bit_diff(&hl, &dl), max_bit_diff(&ht, &dt));
        let tap_max = ht.iter().fold(1f64, |m, &v| m.max(f64::from(v).abs()));
        assert!(dlog <= TOL, "position {i}: target logits {dlog:.3e} apart");
        assert!(
            dtap <= 1e-6 * tap_max,
            "position {i}: taps {dtap:.3e} apart (largest {tap_max:.3e})"
        );
        assert_eq!(
            family_ops::argmax(&dl),
            family_ops::argmax(&hl),
            "position {i}: greedy picks"
        );
        worst_logits = worst_logits.max(dlog);
        worst_taps = worst_taps.max(dtap / tap_max);

        // Each draft takes its own path's taps, then drafts a block.
        host_runner.push_context(&ht).expect("host context");
        dev_runner.push_context(&ht).expect("device context");
        no_weight_read_back(&*ops, &format!("draft context, position {i}"));
        let anchor = family_ops::argmax(&hl) as u32;
        let hb = host_runner.block_logits(anchor).expect("host block");
        let db = dev_runner.block_logits(anchor).expect("device block");
        no_weight_read_back(&*ops, &format!("draft block, position {i}"));
        assert_eq!(hb.len(), db.len(), "block rows");
        assert_eq!(hb.len(), draft.hparams().block_size - 1);
        for (j, (h, d)) in hb.iter().zip(&db).enumerate() {
            let diff = max_bit_diff(h, d);
            assert!(
                diff <= TOL,
                "position {i}, draft {j}: logits {diff:.3e} apart"
            );
            assert_eq!(
                family_ops::argmax(h),
                family_ops::argmax(d),
                "position {i}, draft {j}: picks"
            );
            worst_draft = worst_draft.max(diff);
        }
        if i + 1 >= prompt.len() {
            feed.push(anchor);
        }
        i += 1;
    }
    println!(
        "max abs diff: target logits {worst_logits:.3e}, draft logits {worst_draft:.3e}; taps {worst_taps:.3e} of their largest; over {i} positions"
    );
    assert_eq!(dev_runner.context_len(), host_runner.context_len());
    same_staging(&host_dev, &dev);
    assert_eq!(ops.counters().weight_read_back_bytes, 0);
}

/// A target that checks the op layer after every step.
struct Checked<'a, 'm> {
    target: &'a DeviceTarget<'m>,
    steps: Cell<usize>,
}

impl TargetStep for Checked<'_, '_> {
    type State = usize;
    fn start(&self) -> usize {
        self.target.start()
    }
    fn step(&self, state: &mut usize, token: u32) -> Result<(Vec<f32>, Vec<f32>), dflash::Error> {
        let out = self.target.step(state, token)?;
        self.steps.set(self.steps.get() + 1);
        no_weight_read_back(
            self.target.decoder().ops(),
            &format!("target step {}", self.steps.get()),
        );
        Ok(out)
    }
}

/// A proposer that checks the op layer after every call.
struct CheckedDraft<'a> {
    runner: DeviceDraft<'a>,
    calls: usize,
}

impl Proposer for CheckedDraft<'_> {
    fn push_context(&mut self, taps: &[f32]) -> Result<(), dflash::Error> {
        self.runner.push_context(taps)?;
        self.calls += 1;
        no_weight_read_back(self.runner.ops(), &format!("draft call {}", self.calls));
        Ok(())
    }
    fn propose(&mut self, anchor: u32) -> Result<Vec<u32>, dflash::Error> {
        let d = self.runner.propose(anchor)?;
        self.calls += 1;
        no_weight_read_back(self.runner.ops(), &format!("draft call {}", self.calls));
        Ok(d)
    }
}

/// Speculation of `n` tokens after `prompt` on the host path and on the
/// device path, each on its own fake device.
fn speculate_both(prompt: &[u32], n: usize) -> (SpecReport, SpecReport) {
    let f = files();
    let (target, dev_target) = (
        Qwen4Exp::load(&f.target).expect("target"),
        Qwen4Exp::load(&f.target).expect("target"),
    );
    let draft = Dflash::load(&f.draft, &target).expect("draft");
    let dev_draft = Dflash::load(&f.draft, &dev_target).expect("draft");
    let taps = &draft.hparams().target_layers;
    let host_dev = FakePlatform::new(FakeConfig::default());
    let host_q = host_dev.backend().create_queue().unwrap();
    let dev = FakePlatform::new(FakeConfig::default());
    let dev_q = dev.backend().create_queue().unwrap();

    let verifier = QwenTarget::new(
        SeamWeights::new(&target, &f.target, &host_dev, &*host_q),
        taps,
        family_kit::Numerics::F32_CACHE,
    )
    .expect("host target");
    let mut runner = DraftRunner::new(&draft, &host_dev, &*host_q);
    let host = speculate(&verifier, &mut runner, prompt, n).expect("host speculation");

    let ops: Rc<dyn Ops + '_> = Rc::new(fake_ops(&dev));
    let decoder = DeviceDecoder::with_shared_ops(
        &dev_target,
        &f.target,
        &dev,
        &*dev_q,
        Rc::clone(&ops),
        family_kit::Numerics::F32_CACHE,
    )
    .expect("device decoder");
    let dev_verifier = DeviceTarget::new(decoder, taps).expect("device target");
    let checked = Checked {
        target: &dev_verifier,
        steps: Cell::new(0),
    };
    let mut dev_runner = CheckedDraft {
        runner: DeviceDraft::new(&dev_draft, &dev, &*dev_q, Rc::clone(&ops)).expect("device draft"),
        calls: 0,
    };
    let device = speculate(&checked, &mut dev_runner, prompt, n).expect("device speculation");
    assert_eq!(checked.steps.get(), device.target_steps);
    same_staging(&host_dev, &dev);
    assert_eq!(ops.counters().weight_read_back_bytes, 0);

    // Both are the target's own greedy tokens.
    let (reference, _) = greedy(
        SeamWeights::new(&target, &f.target, &host_dev, &*host_q),
        family_kit::Numerics::F32_CACHE,
        prompt,
        n,
    )
    .expect("greedy");
    assert_eq!(host.tokens, reference);

    // A proposer that knows the answer (all of each block, or only its
    // first draft): accepted drafts and rejections, the same on both
    // targets (a fresh sequence each).
    for right in [usize::MAX, 1] {
        let oracle = || Oracle {
            reference: reference.clone(),
            seen: 0,
            prompt: prompt.len(),
            right,
        };
        let h = speculate(&verifier, &mut oracle(), prompt, n).expect("host oracle");
        let decoder = DeviceDecoder::with_shared_ops(
            &dev_target,
            &f.target,
            &dev,
            &*dev_q,
            Rc::clone(&ops),
            family_kit::Numerics::F32_CACHE,
        )
        .expect("device decoder");
        let t = DeviceTarget::new(decoder, taps).expect("device target");
        let checked = Checked {
            target: &t,
            steps: Cell::new(0),
        };
        let d = speculate(&checked, &mut oracle(), prompt, n).expect("device oracle");
        assert_eq!(d, h, "oracle right={right}");
        assert_eq!(d.tokens, reference, "oracle right={right}");
        if n > 1 {
            assert!(d.accepted > 0, "oracle right={right}: {d:?}");
        }
    }
    (host, device)
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
    fn push_context(&mut self, _taps: &[f32]) -> Result<(), dflash::Error> {
        self.seen += 1;
        Ok(())
    }
    fn propose(&mut self, _anchor: u32) -> Result<Vec<u32>, dflash::Error> {
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
fn speculation_on_the_device_gives_the_host_paths_tokens_and_figures() {
    for n in [1, 2, 5, 12] {
        let (host, device) = speculate_both(&[1, 2, 3], n);
        println!("n {n}: {device:?}");
        assert_eq!(device, host, "n {n}");
    }
    let (host, device) = speculate_both(&[7], 9);
    assert_eq!(device, host);
    assert!(device.proposed > 0);
}

#[test]
fn a_device_target_cannot_go_back() {
    let f = files();
    let target = Qwen4Exp::load(&f.target).expect("target");
    let draft = Dflash::load(&f.draft, &target).expect("draft");
    let dev = FakePlatform::new(FakeConfig::default());
    let q = dev.backend().create_queue().unwrap();
    let decoder = DeviceDecoder::new(
        &target,
        &f.target,
        &dev,
        &*q,
        Box::new(fake_ops(&dev)),
        family_kit::Numerics::F32_CACHE,
    )
    .expect("decoder");
    let t = DeviceTarget::new(decoder, &draft.hparams().target_layers).expect("target");
    let mut s = t.start();
    let mut old = s;
    t.step(&mut s, 1).expect("step");
    let err = t.step(&mut old, 2).expect_err("a step from an old state");
    assert!(err.to_string().contains("cannot go back"), "{err}");
    // A tap layer past the target's layers is refused.
    let decoder = DeviceDecoder::new(
        &target,
        &f.target,
        &dev,
        &*q,
        Box::new(fake_ops(&dev)),
        family_kit::Numerics::F32_CACHE,
    )
    .expect("decoder");
    let t = DeviceTarget::new(decoder, &[99]).expect("target");
    let err = t.step(&mut t.start(), 1).expect_err("tap 99");
    assert!(err.to_string().contains("tap layer 99"), "{err}");
}
