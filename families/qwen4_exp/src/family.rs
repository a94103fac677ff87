//! The family as the kit's contract ([`family_kit::Family`], what the
//! binary's driver runs) and its conformance tests
//! ([`family_kit::conformance_tests!`]) drive it: its fixture, its load
//! and a greedy decode through the seam.

use family_kit::{
    Decoder, ExpertStaging, Family, FamilyUnderTest, FixtureSpec, LoadError, Numerics, Traffic,
};
use seam::gguf::{GgufModel, GgufWriter};
use seam::platform::{Platform, Queue};

use crate::Qwen4Exp;
use crate::device::DeviceDecoder;
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
        let mut state = State::new(&forward, Numerics::default());
        let mut token = 1;
        for pos in 0..steps {
            let logits = forward.step(&mut state, token, pos);
            if let Some(e) = forward.weights().error() {
                return Err(LoadError::Forward(e));
            }
            token = family_ops::argmax(&logits) as u32;
            after_step();
        }
        Ok(())
    }
}

/// qwen4exp's decoder: the forward pass over [`SeamWeights`], the prompt
/// as one ubatch (llama.cpp's batched prefill), then one position at a
/// time, every weight asked of the seam on every use.
pub struct Qwen4ExpDecoder<'m> {
    forward: Model<SeamWeights<'m>>,
    state: State,
}

impl std::fmt::Debug for Qwen4ExpDecoder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qwen4ExpDecoder")
            .field("pos", &self.state.len())
            .finish()
    }
}

impl<'m> Qwen4ExpDecoder<'m> {
    /// A decoder of `model` (loaded from `gguf`) whose weights are staged
    /// on `platform`, its caches as `numerics` says.
    ///
    /// # Errors
    ///
    /// The model does not fit the forward pass, or `numerics` asks for
    /// flash attention.
    pub fn new(
        model: &'m Qwen4Exp,
        gguf: &'m GgufModel,
        platform: &'m dyn Platform,
        queue: &'m dyn Queue,
        numerics: Numerics,
    ) -> Result<Qwen4ExpDecoder<'m>, LoadError> {
        family_kit::numerics::refuse_flash_attn("qwen4_exp", numerics)?;
        let forward = Model::new(SeamWeights::new(model, gguf, platform, queue))
            .map_err(|e| LoadError::Forward(e.to_string()))?;
        let state = State::new(&forward, numerics);
        Ok(Qwen4ExpDecoder { forward, state })
    }

    /// The weights (what the reader keeps dequantized).
    pub fn weights(&self) -> &SeamWeights<'m> {
        self.forward.weights()
    }
}

impl Qwen4ExpDecoder<'_> {
    /// `value`, or the first error the weights recorded while the forward
    /// pass made it (a pass cannot return one).
    fn recorded<T>(&self, value: T) -> Result<T, LoadError> {
        match self.forward.weights().error() {
            Some(e) => Err(LoadError::Forward(e)),
            None => Ok(value),
        }
    }

    /// A prompt the forward pass takes: not empty, every token in the
    /// vocabulary.
    fn check_prompt(&self, tokens: &[u32]) -> Result<(), LoadError> {
        if tokens.is_empty() {
            return Err(LoadError::empty_prompt());
        }
        let n_vocab = self.forward.n_vocab();
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(LoadError::Forward(format!(
                "token {t} is not below the vocabulary size {n_vocab}"
            )));
        }
        Ok(())
    }

    /// The QSA indexer's pooled block keys of layer `il` so far (what its
    /// selection scores; the device path's must be these bits), `None`
    /// for a layer without attention.
    pub fn qsa_pooled_keys(&self, il: usize) -> Option<&[Vec<f32>]> {
        self.state.qsa_pooled_keys(il)
    }

    /// Feeds `tokens` as one ubatch, as llama.cpp's batched prefill does
    /// ([`Model::prefill`]); returns every position's logits.
    ///
    /// # Errors
    ///
    /// An empty prompt, a token out of the vocabulary, or the seam failed
    /// to hand out a weight.
    pub fn prefill_all(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>, LoadError> {
        self.check_prompt(tokens)?;
        let logits = self.forward.prefill(&mut self.state, tokens);
        self.recorded(logits)
    }
}

impl Decoder for Qwen4ExpDecoder<'_> {
    /// The prompt as one ubatch with only its last position's logits
    /// asked for ([`Model::prefill_last`]), as llama.cpp's greedy runs
    /// feed it.
    fn prefill(&mut self, tokens: &[u32]) -> Result<Vec<f32>, LoadError> {
        self.check_prompt(tokens)?;
        let logits = self.forward.prefill_last(&mut self.state, tokens);
        self.recorded(logits)
    }

    fn step(&mut self, token: u32) -> Result<Vec<f32>, LoadError> {
        let n_vocab = self.forward.n_vocab();
        if token as usize >= n_vocab {
            return Err(LoadError::Forward(format!(
                "token {token} is not below the vocabulary size {n_vocab}"
            )));
        }
        let pos = self.state.len();
        let logits = self.forward.step(&mut self.state, token, pos);
        self.recorded(logits)
    }

    fn traffic(&self) -> Traffic {
        self.forward.weights().reader().traffic()
    }
}

/// The decoder the driver runs: the device path where the platform has
/// an op layer ([`Family::device_decoder`]), else the host path.
pub type Qwen4ExpAnyDecoder<'m> = family_kit::HostOrDevice<Qwen4ExpDecoder<'m>, DeviceDecoder<'m>>;

/// Small tensors `decoder` keeps dequantized: by the host reader, or on
/// the device.
pub fn kept_dequantized(decoder: &Qwen4ExpAnyDecoder<'_>) -> usize {
    decoder.either(|h| h.weights().reader().kept().0, |d| d.kept())
}

impl Family for Qwen4ExpFamily {
    const NAME: &'static str = "qwen4_exp";
    const MMAP_REQUIRED: Option<&'static str> =
        Some("stages expert rows and gathers PLE rows as borrows of the mapped file");
    type Companion = ();
    type Model<'c> = Qwen4Exp;
    type Decoder<'m> = Qwen4ExpAnyDecoder<'m>;

    fn fixture() -> GgufWriter {
        crate::fixture::fixture()
    }

    fn load<'c>(gguf: &'c GgufModel, _: &'c ()) -> Result<Qwen4Exp, LoadError> {
        Qwen4Exp::load(gguf)
    }

    fn n_vocab(model: &Qwen4Exp) -> usize {
        model.manifest().layout.n_vocab as usize
    }

    fn decoder<'m>(
        model: &'m Qwen4Exp,
        gguf: &'m GgufModel,
        platform: &'m dyn Platform,
        queue: &'m dyn Queue,
        numerics: Numerics,
    ) -> Result<Qwen4ExpAnyDecoder<'m>, LoadError> {
        Qwen4ExpDecoder::new(model, gguf, platform, queue, numerics).map(Qwen4ExpAnyDecoder::Host)
    }

    const STAGES_ALL_EXPERTS: bool = true;

    fn device_decoder<'m>(
        model: &'m Qwen4Exp,
        gguf: &'m GgufModel,
        platform: &'m dyn Platform,
        queue: &'m dyn Queue,
        ops: Box<dyn device_ops::Ops + 'm>,
        staging: ExpertStaging,
        numerics: Numerics,
    ) -> Result<Qwen4ExpAnyDecoder<'m>, LoadError> {
        DeviceDecoder::new(model, gguf, platform, queue, ops, numerics)?
            .with_staging(staging)
            .map(|d| Qwen4ExpAnyDecoder::Device(Box::new(d)))
    }
}
