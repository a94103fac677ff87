//! The draft as the kit's conformance tests drive it
//! ([`family_kit::conformance_tests!`]): its fixture, its load over the
//! qwen4_exp built-in target, and speculative decoding through the seam.

use std::sync::atomic::{AtomicU64, Ordering};

use family_kit::{FamilyUnderTest, FixtureSpec, FixtureTensor, LoadError};
use qwen4_exp::Qwen4Exp;
use qwen4_exp::engine::SeamWeights;
use seam::borrow::MapOptions;
use seam::gguf::{GgmlType, GgufModel};
use seam::platform::{Platform, Queue};
use seam_tools::demo::TempGguf;

use crate::Dflash;
use crate::fixture::DraftSpec;
use crate::forward::DraftRunner;
use crate::spec::{QwenTarget, speculate};

/// dflash under the conformance tests.
#[derive(Debug)]
pub struct DflashFamily;

fn load_err(e: crate::Error) -> LoadError {
    match e {
        crate::Error::Load(e) => e,
        other => LoadError::Forward(other.to_string()),
    }
}

/// The built-in target, written to a temporary file and opened.
fn target() -> Result<(TempGguf, GgufModel), LoadError> {
    // One file per call: tests run in parallel in one process.
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let n = CALLS.fetch_add(1, Ordering::Relaxed);
    let file = TempGguf::write(
        &qwen4_exp::fixture::fixture(),
        &format!("dflash-target-{n}"),
    )
    .map_err(|e| LoadError::Forward(e.to_string()))?;
    let model = GgufModel::open(file.path(), MapOptions { prefault: false })?;
    Ok((file, model))
}

impl FamilyUnderTest for DflashFamily {
    const F32_TENSOR: &'static str = "output_norm.weight";
    const REQUIRED_KEY: &'static str = "dflash.block_size";

    fn fixture() -> FixtureSpec {
        let d = DraftSpec::tiny();
        FixtureSpec {
            metadata: d.writer().metadata().to_vec(),
            tensors: d
                .hparams
                .tensors(d.target_n_embd)
                .into_iter()
                .map(|(name, dims)| FixtureTensor {
                    name,
                    ggml_type: GgmlType::F32,
                    dims,
                })
                .collect(),
        }
    }

    fn check(model: &GgufModel) -> Result<(), LoadError> {
        let (_file, gguf) = target()?;
        let target = Qwen4Exp::load(&gguf)?;
        Dflash::load(model, &target).map(|_| ()).map_err(load_err)
    }

    fn decode(
        model: &GgufModel,
        platform: &dyn Platform,
        queue: &dyn Queue,
        steps: usize,
        after_step: &mut dyn FnMut(),
    ) -> Result<(), LoadError> {
        let (_file, gguf) = target()?;
        let target = Qwen4Exp::load(&gguf)?;
        let draft = Dflash::load(model, &target).map_err(load_err)?;
        let verifier = QwenTarget::new(
            SeamWeights::new(&target, &gguf, platform, queue),
            &draft.hparams().target_layers,
        )
        .map_err(load_err)?;
        for n in 1..=steps {
            let mut runner = DraftRunner::new(&draft, platform, queue);
            speculate(&verifier, &mut runner, &[1, 2, 3], n).map_err(load_err)?;
            after_step();
        }
        Ok(())
    }
}
