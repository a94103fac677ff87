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

use crate::Glm5Next;
use crate::device::DeviceDecoder;
use crate::forward::{State, greedy};

/// glm5-next's decoder: the device's op layer where the device has one
/// ([`Family::device_decoder`]), else the host path.
pub type Glm5NextDecoder<'m> = HostOrDevice<State<'m>, DeviceDecoder<'m>>;

/// glm5-next under the conformance tests.
#[derive(Debug)]
pub struct Glm5NextFamily;

impl FamilyUnderTest for Glm5NextFamily {
    const F32_TENSOR: &'static str = "output_norm.weight";
    const REQUIRED_KEY: &'static str = "glm5-next.hyper_connection.sinkhorn_iterations";

    fn fixture() -> FixtureSpec {
        crate::fixture::fixture()
    }

    fn check(model: &GgufModel) -> Result<(), LoadError> {
        Glm5Next::load(model).map(|_| ())
    }

    fn decode(
        model: &GgufModel,
        platform: &dyn Platform,
        queue: &dyn Queue,
        steps: usize,
        after_step: &mut dyn FnMut(),
    ) -> Result<(), LoadError> {
        let loaded = Glm5Next::load(model)?;
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

impl Family for Glm5NextFamily {
    const NAME: &'static str = "glm5_next";
    const MMAP_REQUIRED: Option<&'static str> =
        Some("stages each routed expert as a borrow of the mapped file");
    type Companion = ();
    type Model<'c> = Glm5Next;
    type Decoder<'m> = Glm5NextDecoder<'m>;

    fn fixture() -> GgufWriter {
        crate::fixture::fixture().writer()
    }

    fn load<'c>(gguf: &'c GgufModel, _: &'c ()) -> Result<Glm5Next, LoadError> {
        Glm5Next::load(gguf)
    }

    fn n_vocab(model: &Glm5Next) -> usize {
        model.n_vocab()
    }

    fn decoder<'m>(
        model: &'m Glm5Next,
        _: &'m GgufModel,
        platform: &'m dyn Platform,
        queue: &'m dyn Queue,
        numerics: Numerics,
    ) -> Result<Glm5NextDecoder<'m>, LoadError> {
        State::new(model, WeightReader::new(platform, queue), 0, numerics).map(HostOrDevice::Host)
    }

    const STAGES_ALL_EXPERTS: bool = true;

    fn device_decoder<'m>(
        model: &'m Glm5Next,
        _: &'m GgufModel,
        platform: &'m dyn Platform,
        queue: &'m dyn Queue,
        ops: Box<dyn device_ops::Ops + 'm>,
        staging: ExpertStaging,
        numerics: Numerics,
    ) -> Result<Glm5NextDecoder<'m>, LoadError> {
        DeviceDecoder::new(model, platform, queue, ops, staging, 0, numerics)
            .map(|d| HostOrDevice::Device(Box::new(d)))
    }
}
