//! What the `dflash` binary adds to the kit's driver
//! ([`family_kit::driver`]): `--target TARGET.gguf` (a qwen4exp model; the
//! qwen4_exp built-in fixture when absent), and after the target's greedy
//! decode, speculative decoding with the draft over it: its tokens must be
//! the target's greedy tokens (the run fails, after its report, when they
//! are not), with the acceptance figures and the draft's census.

use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Instant;

use family_kit::driver::{Failure, FamilyBinary, FamilyReport, Files, Run};
use qwen4_exp::Qwen4Exp;
use qwen4_exp::device::DeviceDecoder;
use qwen4_exp::engine::SeamWeights;
use qwen4_exp::family::Qwen4ExpAnyDecoder;
use seam::text::path_safe;
use serde_json::json;

use crate::device::DeviceDraft;
use crate::family::{DraftOverTarget, Target};
use crate::forward::DraftRunner;
use crate::spec::{DeviceTarget, QwenTarget, SpecReport, speculate};
use crate::{DflashFamily, TargetTables};

/// dflash's own flags.
#[derive(Debug, clap::Args)]
pub struct DflashFlags {
    /// The target GGUF, a qwen4exp model (default: the qwen4_exp built-in
    /// tiny fixture).
    #[arg(long, value_name = "FILE")]
    pub target: Option<PathBuf>,
}

impl FamilyBinary for DflashFamily {
    type Flags = DflashFlags;
    const ABOUT: &'static str =
        "dflash: speculative decoding with a draft over its qwen4exp target, through the seam";

    fn inputs(flags: &DflashFlags) -> Vec<&Path> {
        flags.target.iter().map(PathBuf::as_path).collect()
    }

    fn companion(flags: &DflashFlags, files: &mut Files<'_, '_>) -> Result<Target, Failure> {
        let path = match &flags.target {
            Some(p) => p.clone(),
            None => files.built_in(&qwen4_exp::fixture::fixture(), "dflash-target")?,
        };
        let gguf = files.session().open(&path)?;
        let model =
            Qwen4Exp::load(&gguf).map_err(|e| Failure(format!("{}: {e}", path_safe(&path))))?;
        Ok(Target { path, gguf, model })
    }

    fn report(
        _: &DflashFlags,
        run: &Run<'_, '_>,
        model: &DraftOverTarget<'_>,
        target: &Target,
        decoder: &Qwen4ExpAnyDecoder<'_>,
    ) -> Result<FamilyReport, Failure> {
        let (platform, queue) = (run.session.platform(), run.session.queue());
        let draft = &model.draft;
        let taps = &draft.hparams().target_layers;
        let on_device = matches!(decoder, Qwen4ExpAnyDecoder::Device(_));
        let start = Instant::now();
        // Where the greedy pass ran on the device, the speculation does too:
        // a second target sequence and the draft on the same op layer.
        let spec = match decoder {
            Qwen4ExpAnyDecoder::Device(d) => (|| -> Result<SpecReport, crate::Error> {
                let ops = d.shared_ops();
                // The verifier stages as the greedy pass did (the stacks
                // are staged already: the seam's memo hands them out).
                let target_decoder = DeviceDecoder::with_shared_ops(
                    &target.model,
                    &target.gguf,
                    platform,
                    queue,
                    Rc::clone(&ops),
                    run.numerics,
                )?
                .with_staging(d.staging())?;
                let verifier = DeviceTarget::new(target_decoder, taps)?;
                let mut runner = DeviceDraft::new(draft, platform, queue, ops)?;
                speculate(&verifier, &mut runner, run.prompt, run.steps)
            })(),
            Qwen4ExpAnyDecoder::Host(_) => (|| {
                let verifier = QwenTarget::new(
                    SeamWeights::new(&target.model, &target.gguf, platform, queue),
                    taps,
                    run.numerics,
                )?;
                let mut runner = DraftRunner::new(draft, platform, queue);
                speculate(&verifier, &mut runner, run.prompt, run.steps)
            })(),
        };
        let seconds = start.elapsed().as_secs_f64();
        // Files changed under the pass explain a failed one too.
        target.gguf.check_unchanged()?;
        run.gguf.check_unchanged()?;
        let spec = spec.map_err(|e| Failure(format!("{}: {e}", path_safe(run.path))))?;
        let matches = spec.tokens == run.generated;
        let tables_shared = target
            .model
            .token_embd()
            .is_some_and(|t| std::ptr::eq(draft.token_embd(), t))
            && target
                .model
                .output_head()
                .is_some_and(|t| std::ptr::eq(draft.output_head(), t));
        let c = draft.census();
        let text = format!(
            "dflash: speculation{} -> {:?} ({} target greedy) in {seconds:.3} s\n\
             {} rounds, {}/{} drafts accepted ({:.1}%), {} target steps\n\
             census: draft {} tensors ({:.1} KiB own); borrowed from the target {:?} (+{} host bytes, shared: {tables_shared})\n",
            if on_device { " on the device" } else { "" },
            spec.tokens,
            if matches { "==" } else { "!=" },
            spec.rounds,
            spec.accepted,
            spec.proposed,
            100.0 * spec.acceptance_rate,
            spec.target_steps,
            c.own_tensors,
            c.own_bytes as f64 / 1024.0,
            c.borrowed,
            c.borrowed_host_bytes_added,
        );
        let json = json!({
            "target": target.path,
            "draft": draft.hparams(),
            "speculation": spec,
            "speculation_seconds": seconds,
            "speculation_on_device": on_device,
            "matches_target_greedy": matches,
            "census": c,
            "tables_shared_with_target": tables_shared,
        });
        Ok(FamilyReport {
            problem: (!matches).then(|| {
                format!(
                    "speculation {:?} differs from the target's greedy {:?}",
                    spec.tokens, run.generated
                )
            }),
            ..FamilyReport::new(json, text)
        })
    }
}
