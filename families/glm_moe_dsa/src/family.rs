//! The family as the kit's contract ([`family_kit::Family`], what the
//! binary's driver runs) and its conformance tests
//! ([`family_kit::conformance_tests!`]) drive it: its fixture, its load
//! and a greedy decode through the seam.

use family_kit::{
    ExpertStaging, Family, FamilyUnderTest, FixtureSpec, HostOrDevice, LoadError, Numerics,
    WeightReader,
};
use seam::gguf::{GgufModel, GgufWriter};
use seam::platform::{Platform, Queue};

use crate::GlmMoeDsa;
use crate::device::DeviceDecoder;
use crate::forward::{State, greedy};

/// The decoder the driver runs: the device path where the platform has an
/// op layer ([`Family::device_decoder`]), else the host path.
pub type GlmMoeDsaDecoder<'m> = HostOrDevice<State<'m>, DeviceDecoder<'m>>;

/// glm-dsa under the conformance tests.
#[derive(Debug)]
pub struct GlmMoeDsaFamily;

impl FamilyUnderTest for GlmMoeDsaFamily {
    const F32_TENSOR: &'static str = "output_norm.weight";
    const REQUIRED_KEY: &'static str = "glm-dsa.attention.kv_lora_rank";

    fn fixture() -> FixtureSpec {
        crate::fixture::fixture()
    }

    fn check(model: &GgufModel) -> Result<(), LoadError> {
        GlmMoeDsa::load(model).map(|_| ())
    }

    fn decode(
        model: &GgufModel,
        platform: &dyn Platform,
        queue: &dyn Queue,
        steps: usize,
        after_step: &mut dyn FnMut(),
    ) -> Result<(), LoadError> {
        let loaded = GlmMoeDsa::load(model)?;
        let reader = WeightReader::new(platform, queue);
        greedy(
            &loaded,
            reader,
            Numerics::default(),
            &[1, 2, 3],
            steps,
            after_step,
        )
        .map(|_| ())
    }
}

impl Family for GlmMoeDsaFamily {
    const NAME: &'static str = "glm_moe_dsa";
    const MMAP_REQUIRED: Option<&'static str> =
        Some("stages each routed expert as a borrow of the mapped file");
    type Companion = ();
    type Model<'c> = GlmMoeDsa;
    type Decoder<'m> = GlmMoeDsaDecoder<'m>;

    fn fixture() -> GgufWriter {
        crate::fixture::fixture().writer()
    }

    fn load<'c>(gguf: &'c GgufModel, _: &'c ()) -> Result<GlmMoeDsa, LoadError> {
        GlmMoeDsa::load(gguf)
    }

    fn n_vocab(model: &GlmMoeDsa) -> usize {
        model.n_vocab()
    }

    fn decoder<'m>(
        model: &'m GlmMoeDsa,
        _: &'m GgufModel,
        platform: &'m dyn Platform,
        queue: &'m dyn Queue,
        numerics: Numerics,
    ) -> Result<GlmMoeDsaDecoder<'m>, LoadError> {
        State::new(model, WeightReader::new(platform, queue), numerics).map(HostOrDevice::Host)
    }

    const STAGES_ALL_EXPERTS: bool = true;

    fn device_decoder<'m>(
        model: &'m GlmMoeDsa,
        _: &'m GgufModel,
        platform: &'m dyn Platform,
        queue: &'m dyn Queue,
        ops: Box<dyn device_ops::Ops + 'm>,
        staging: ExpertStaging,
        numerics: Numerics,
    ) -> Result<GlmMoeDsaDecoder<'m>, LoadError> {
        DeviceDecoder::new(model, platform, queue, ops, staging, numerics)
            .map(|d| HostOrDevice::Device(Box::new(d)))
    }
}
