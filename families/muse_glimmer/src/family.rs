//! The family as the kit's conformance tests drive it
//! ([`family_kit::conformance_tests!`]): its fixture, its load and a greedy
//! decode through the seam.

use family_kit::{FamilyUnderTest, FixtureSpec, LoadError};
use seam::gguf::GgufModel;
use seam::platform::{Platform, Queue};

use crate::forward::{Decoder, greedy};
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
        let mut decoder = Decoder::new(&loaded, platform, queue);
        greedy(&mut decoder, &[1], steps, after_step).map(|_| ())
    }
}
