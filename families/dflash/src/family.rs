//! The draft as the kit's contract ([`family_kit::Family`], what the
//! binary's driver runs) and its conformance tests
//! ([`family_kit::conformance_tests!`]) drive it: its fixture, its load
//! over a qwen4exp target, and decoding through the seam.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use family_kit::{
    ExpertStaging, Family, FamilyUnderTest, FixtureSpec, FixtureTensor, LoadError, Numerics,
};
use qwen4_exp::Qwen4Exp;
use qwen4_exp::device::DeviceDecoder;
use qwen4_exp::engine::SeamWeights;
use qwen4_exp::family::{Qwen4ExpAnyDecoder, Qwen4ExpDecoder};
use seam::borrow::MapOptions;
use seam::gguf::{GgmlType, GgufModel, GgufWriter};
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
            ..FixtureSpec::default()
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
            Numerics::default(),
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

/// The qwen4exp target a draft runs over, opened through the same session:
/// the family's [`Family::Companion`].
pub struct Target {
    /// Where it was opened from.
    pub path: PathBuf,
    /// The file.
    pub gguf: GgufModel,
    /// The loaded target.
    pub model: Qwen4Exp,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target").field("path", &self.path).finish()
    }
}

/// A draft loaded over its target: the family's [`Family::Model`].
#[derive(Debug)]
pub struct DraftOverTarget<'t> {
    /// The draft, borrowing the target's tables.
    pub draft: Dflash<'t>,
    /// The target.
    pub target: &'t Target,
}

/// The family contract over dflash: the decoder is the target's own greedy
/// pass ([`Qwen4ExpDecoder`] on the host path, [`DeviceDecoder`] where
/// the device has an op layer), which verifies every token speculation
/// produces; the binary runs the speculation itself after it and checks
/// the two agree.
impl Family for DflashFamily {
    const NAME: &'static str = "dflash";
    const MMAP_REQUIRED: Option<&'static str> = Some(
        "decodes with a qwen4exp target, which stages expert rows and gathers PLE rows as borrows of the mapped file",
    );
    type Companion = Target;
    type Model<'c> = DraftOverTarget<'c>;
    type Decoder<'m> = Qwen4ExpAnyDecoder<'m>;

    fn fixture() -> GgufWriter {
        crate::fixture::fixture()
    }

    fn load<'c>(gguf: &'c GgufModel, target: &'c Target) -> Result<DraftOverTarget<'c>, LoadError> {
        let draft = Dflash::load(gguf, &target.model).map_err(|e| match e {
            crate::Error::Load(e) => e,
            other => LoadError::Refused(other.to_string()),
        })?;
        Ok(DraftOverTarget { draft, target })
    }

    fn n_vocab(model: &DraftOverTarget<'_>) -> usize {
        family_kit::TargetTables::n_vocab(&model.target.model)
    }

    fn decoder<'m>(
        model: &'m DraftOverTarget<'_>,
        _: &'m GgufModel,
        platform: &'m dyn Platform,
        queue: &'m dyn Queue,
        numerics: Numerics,
    ) -> Result<Qwen4ExpAnyDecoder<'m>, LoadError> {
        let target = model.target;
        Qwen4ExpDecoder::new(&target.model, &target.gguf, platform, queue, numerics)
            .map(Qwen4ExpAnyDecoder::Host)
    }

    const STAGES_ALL_EXPERTS: bool = true;

    fn device_decoder<'m>(
        model: &'m DraftOverTarget<'_>,
        _: &'m GgufModel,
        platform: &'m dyn Platform,
        queue: &'m dyn Queue,
        ops: Box<dyn device_ops::Ops + 'm>,
        staging: ExpertStaging,
        numerics: Numerics,
    ) -> Result<Qwen4ExpAnyDecoder<'m>, LoadError> {
        let target = model.target;
        DeviceDecoder::new(&target.model, &target.gguf, platform, queue, ops, numerics)?
            .with_staging(staging)
            .map(|d| Qwen4ExpAnyDecoder::Device(Box::new(d)))
    }

    fn companion_files(target: &Target) -> Vec<&GgufModel> {
        vec![&target.gguf]
    }
}
