//! The family as the kit's contract ([`family_kit::Family`], what the
//! binary's driver runs) and its conformance tests
//! ([`family_kit::conformance_tests!`]) drive it: its fixture, its load
//! and a greedy decode through the seam.

use std::path::PathBuf;

use family_kit::{
    ExpertStaging, Family, FamilyUnderTest, FixtureSpec, LoadError, Numerics, Traffic,
};
use seam::gguf::{GgufModel, GgufWriter};
use seam::platform::{Platform, Queue};

use crate::device::DeviceDecoder;
use crate::forward::{Decoder, greedy};
use crate::mmproj::Projector;
use crate::model::MuseGlimmer;

/// muse-glimmer under the conformance tests.
#[derive(Debug)]
pub struct MuseGlimmerFamily;

impl FamilyUnderTest for MuseGlimmerFamily {
    const F32_TENSOR: &'static str = "output_norm.weight";
    const REQUIRED_KEY: &'static str = "muse-glimmer.logit_scale";

    fn fixture() -> FixtureSpec {
        crate::fixture::tiny()
    }

    fn check(model: &GgufModel) -> Result<(), LoadError> {
        MuseGlimmer::load(model).map(|_| ())
    }

    fn decode(
        model: &GgufModel,
        platform: &dyn Platform,
        queue: &dyn Queue,
        steps: usize,
        after_step: &mut dyn FnMut(),
    ) -> Result<(), LoadError> {
        let loaded = MuseGlimmer::load(model)?;
        let mut decoder = Decoder::new(&loaded, platform, queue, Numerics::default())?;
        greedy(&mut decoder, &[1], steps, after_step).map(|_| ())
    }
}

/// The projector a muse-glimmer model may come with (the binary's
/// `--mmproj`), opened through the same session and checked against its
/// manifest: the family's [`Family::Companion`] (`None` without one).
pub struct ProjectorFile {
    /// Where it was opened from.
    pub path: PathBuf,
    /// The file.
    pub gguf: GgufModel,
    /// Its checked manifest and weights.
    pub projector: Projector,
}

impl std::fmt::Debug for ProjectorFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProjectorFile")
            .field("path", &self.path)
            .finish()
    }
}

/// muse-glimmer's decoder for the family contract, on the host or on a
/// device. On the host, [`Decoder`] with the prompt fed one token at a
/// time, as [`greedy`] feeds it (and the binary always has);
/// [`Decoder::prefill`] instead takes the prompt as one ubatch, as
/// llama.cpp's batched prefill does, which rounds differently. On a device
/// ([`DeviceDecoder`]), the prompt in batches, each row rounded as the host
/// path's one-token pass rounds it: the same logits.
#[derive(Debug)]
pub enum MuseGlimmerDecoder<'m> {
    /// The host path ([`crate::forward`]).
    Host(Decoder<'m>),
    /// The device op layer ([`crate::device`]).
    Device(DeviceDecoder<'m>),
}

impl MuseGlimmerDecoder<'_> {
    /// Small tensors kept dequantized (on the host or on the device).
    pub fn kept(&self) -> usize {
        match self {
            MuseGlimmerDecoder::Host(d) => d.reader().kept().0,
            MuseGlimmerDecoder::Device(d) => d.kept(),
        }
    }
}

impl family_kit::Decoder for MuseGlimmerDecoder<'_> {
    fn prefill(&mut self, tokens: &[u32]) -> Result<Vec<f32>, LoadError> {
        let d = match self {
            MuseGlimmerDecoder::Host(d) => d,
            MuseGlimmerDecoder::Device(d) => return d.prefill(tokens),
        };
        family_kit::prefill_by_steps(tokens, |t| d.step(t))
    }

    fn step(&mut self, token: u32) -> Result<Vec<f32>, LoadError> {
        match self {
            MuseGlimmerDecoder::Host(d) => d.step(token),
            MuseGlimmerDecoder::Device(d) => d.step(token),
        }
    }

    fn traffic(&self) -> Traffic {
        match self {
            MuseGlimmerDecoder::Host(d) => d.reader().traffic(),
            MuseGlimmerDecoder::Device(d) => d.traffic(),
        }
    }
}

impl Family for MuseGlimmerFamily {
    const NAME: &'static str = "muse_glimmer";
    const MMAP_REQUIRED: Option<&'static str> = None;
    type Companion = Option<ProjectorFile>;
    type Model<'c> = MuseGlimmer;
    type Decoder<'m> = MuseGlimmerDecoder<'m>;

    fn fixture() -> GgufWriter {
        crate::fixture::fixture()
    }

    fn load<'c>(
        gguf: &'c GgufModel,
        _: &'c Option<ProjectorFile>,
    ) -> Result<MuseGlimmer, LoadError> {
        MuseGlimmer::load(gguf)
    }

    fn n_vocab(model: &MuseGlimmer) -> usize {
        model.hparams().n_vocab
    }

    fn decoder<'m>(
        model: &'m MuseGlimmer,
        _: &'m GgufModel,
        platform: &'m dyn Platform,
        queue: &'m dyn Queue,
        numerics: Numerics,
    ) -> Result<MuseGlimmerDecoder<'m>, LoadError> {
        Decoder::new(model, platform, queue, numerics).map(MuseGlimmerDecoder::Host)
    }

    fn device_decoder<'m>(
        model: &'m MuseGlimmer,
        _: &'m GgufModel,
        platform: &'m dyn Platform,
        queue: &'m dyn Queue,
        ops: Box<dyn device_ops::Ops + 'm>,
        staging: ExpertStaging,
        numerics: Numerics,
    ) -> Result<MuseGlimmerDecoder<'m>, LoadError> {
        staging.only_on_pick(Self::NAME)?;
        DeviceDecoder::new(model, platform, queue, ops, numerics).map(MuseGlimmerDecoder::Device)
    }

    fn companion_files(companion: &Option<ProjectorFile>) -> Vec<&GgufModel> {
        companion.iter().map(|p| &p.gguf).collect()
    }
}
