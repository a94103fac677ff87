//! Decode steps of weight access, without the arithmetic: what a forward
//! step asks of the seam. Each step makes every dense weight resident,
//! stages a deterministic pseudo-random pick of `expert_used_count`
//! experts per layer (one sub-span weight per matrix), and gathers one PLE
//! row per PLE head.
//!
//! This is a stand-in for the forward pass, to show the residency contract
//! on a real (or fixture) file: every staged weight copied once and
//! released once across all steps, the stacks and the table never staged
//! whole.

use seam::platform::{Platform, Queue};
use serde::Serialize;

use crate::error::Error;
use crate::model::{ExpertKind, Qwen4Exp};

/// What [`simulate_decode`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DecodeReport {
    /// Steps run.
    pub steps: u64,
    /// `resident_weight` calls on dense weights.
    pub dense_calls: u64,
    /// `resident_weight` calls on expert sub-span weights.
    pub expert_calls: u64,
    /// PLE rows gathered from the table's borrow.
    pub ple_rows: u64,
    /// Their bytes.
    pub ple_bytes: u64,
    /// A checksum of the gathered bytes (so the reads are real).
    pub ple_checksum: u64,
}

/// SplitMix64 of `x`.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn stream(seed: u64, step: u64, salt: u64) -> impl FnMut() -> u64 {
    let mut state = mix(seed ^ mix(step ^ mix(salt)));
    move || {
        state = mix(state);
        state
    }
}

/// `k` distinct experts of `n_expert`, chosen pseudo-randomly from
/// (`seed`, `step`, `layer`): what a router might pick.
pub fn pick_experts(seed: u64, step: u64, layer: usize, n_expert: u64, k: u64) -> Vec<u64> {
    let mut next = stream(seed, step, layer as u64);
    let mut all: Vec<u64> = (0..n_expert).collect();
    let k = k.min(n_expert) as usize;
    // A partial Fisher-Yates shuffle.
    for i in 0..k {
        let j = i + (next() % (n_expert - i as u64)) as usize;
        all.swap(i, j);
    }
    all.truncate(k);
    all
}

/// The PLE rows one step gathers: one per head h, `off[h] + r % voc[h]`
/// for a pseudo-random r (the shape of the real n-gram hash rows).
pub fn pick_ple_rows(model: &Qwen4Exp, seed: u64, step: u64) -> Vec<u64> {
    let Some(ple) = model.hparams().ple.as_ref() else {
        return Vec::new();
    };
    let mut next = stream(seed, step, u64::MAX);
    (0..ple.n_heads as usize)
        .map(|h| ple.head_offsets[h] + next() % ple.head_vocab_sizes[h])
        .collect()
}

/// Runs `steps` decode steps of weight access on `platform`.
///
/// # Errors
///
/// The seam failed to stage a weight, or a PLE row is out of range.
pub fn simulate_decode(
    model: &Qwen4Exp,
    platform: &dyn Platform,
    queue: &dyn Queue,
    steps: u64,
    seed: u64,
) -> Result<DecodeReport, Error> {
    let hp = model.hparams();
    let mut report = DecodeReport {
        steps,
        ..DecodeReport::default()
    };
    for step in 0..steps {
        for layer in 0..hp.n_layer {
            if hp.ple.as_ref().is_some_and(|p| p.layer == layer) {
                for row in pick_ple_rows(model, seed, step) {
                    let bytes = model.ple_row(row)?;
                    report.ple_rows += 1;
                    report.ple_bytes += bytes.len() as u64;
                    report.ple_checksum = bytes
                        .iter()
                        .fold(report.ple_checksum, |a, &b| a.rotate_left(5) ^ u64::from(b));
                }
            }
            let picked = pick_experts(seed, step, layer, hp.n_expert, hp.n_expert_used[layer]);
            for e in picked {
                for kind in ExpertKind::ALL {
                    model.stage_expert(layer, kind, e, platform, queue)?;
                    report.expert_calls += 1;
                }
            }
        }
        report.dense_calls += model.stage_dense(platform, queue)? as u64;
    }
    Ok(report)
}
