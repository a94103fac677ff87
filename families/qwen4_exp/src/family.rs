//! The family as the kit's conformance tests drive it
//! ([`family_kit::conformance_tests!`]): its fixture, its load and a greedy
//! decode through the seam.

use family_kit::{FamilyUnderTest, FixtureSpec, LoadError};
use seam::gguf::GgufModel;
use seam::platform::{Platform, Queue};

use crate::Qwen4Exp;
use crate::engine::SeamWeights;
use crate::forward::{Model, State};

/// qwen4exp under the conformance tests.
#[derive(Debug)]
pub struct Qwen4ExpFamily;

impl FamilyUnderTest for Qwen4ExpFamily {
    const F32_TENSOR: &'static str = "output_hc_norm.weight";
    const REQUIRED_KEY: &'static str = "qwen4exp.ssm.conv_kernel";

    fn fixture() -> FixtureSpec {
        crate::fixture::tiny()
    }

    fn check(model: &GgufModel) -> Result<(), LoadError> {
        Qwen4Exp::load(model).map(|_| ())
    }

    fn decode(
        model: &GgufModel,
        platform: &dyn Platform,
        queue: &dyn Queue,
        steps: usize,
        after_step: &mut dyn FnMut(),
    ) -> Result<(), LoadError> {
        let loaded = Qwen4Exp::load(model)?;
        let forward = Model::new(SeamWeights::new(&loaded, model, platform, queue))
            .map_err(|e| LoadError::Forward(e.to_string()))?;
        let mut state = State::new(&forward);
        let mut token = 1;
        for pos in 0..steps {
            let logits = forward.step(&mut state, token, pos);
            if let Some(e) = forward.weights().error() {
                return Err(LoadError::Forward(e));
            }
            token = crate::forward::math::argmax(&logits) as u32;
            after_step();
        }
        Ok(())
    }
}
