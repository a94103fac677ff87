//! The family as the kit's conformance tests drive it
//! ([`family_kit::conformance_tests!`]): its fixture, its load and a greedy
//! decode through the seam.

use family_kit::{FamilyUnderTest, FixtureSpec, LoadError, WeightReader};
use seam::gguf::GgufModel;
use seam::platform::{Platform, Queue};

use crate::GlmMoeDsa;
use crate::forward::greedy;

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
        greedy(&loaded, reader, &[1, 2, 3], steps, after_step).map(|_| ())
    }
}
