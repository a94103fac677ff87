//! Greedy speculative decoding: the draft proposes a block, the target
//! verifies it from a cloned state, the longest prefix equal to the
//! target's own greedy choices is accepted, then the target's token.
//! The tokens produced are the target's own greedy tokens.

use family_kit::Numerics;
use std::cell::RefCell;

use qwen4_exp::device::DeviceDecoder;
use qwen4_exp::engine::SeamWeights;
use qwen4_exp::forward::{Model, State};
use serde::Serialize;

use crate::forward::{DraftRunner, argmax};
use crate::model::Error;

/// A target the loop can step: one token at the state's next position,
/// returning its logits and its hidden states at the draft's tap layers
/// (concatenated).
pub trait TargetStep {
    /// What persists between steps; cloned to verify a proposal.
    type State: Clone;
    /// An empty sequence.
    fn start(&self) -> Self::State;
    /// Feeds `token`.
    ///
    /// # Errors
    ///
    /// The target failed.
    fn step(&self, state: &mut Self::State, token: u32) -> Result<(Vec<f32>, Vec<f32>), Error>;
}

/// What proposes a block: the draft, or a test's stand-in.
pub trait Proposer {
    /// Takes one committed position's taps.
    ///
    /// # Errors
    ///
    /// The proposer failed.
    fn push_context(&mut self, taps: &[f32]) -> Result<(), Error>;
    /// Proposes the tokens after `anchor`.
    ///
    /// # Errors
    ///
    /// The proposer failed.
    fn propose(&mut self, anchor: u32) -> Result<Vec<u32>, Error>;
}

impl Proposer for DraftRunner<'_> {
    fn push_context(&mut self, taps: &[f32]) -> Result<(), Error> {
        DraftRunner::push_context(self, taps)
    }
    fn propose(&mut self, anchor: u32) -> Result<Vec<u32>, Error> {
        DraftRunner::propose(self, anchor)
    }
}

/// The qwen4exp forward pass through the seam, with its tap layers.
pub struct QwenTarget<'a> {
    model: Model<SeamWeights<'a>>,
    taps: Vec<usize>,
    numerics: Numerics,
}

impl<'a> QwenTarget<'a> {
    /// The target pass over `weights`, tapping `taps` (0-based layers),
    /// its caches as `numerics` says.
    ///
    /// # Errors
    ///
    /// The model does not fit the forward pass, or `numerics` asks for
    /// flash attention.
    pub fn new(
        weights: SeamWeights<'a>,
        taps: &[usize],
        numerics: Numerics,
    ) -> Result<QwenTarget<'a>, Error> {
        family_kit::numerics::refuse_flash_attn("dflash's target", numerics)
            .map_err(|e| Error::Target(e.to_string()))?;
        let model = Model::new(weights).map_err(|e| Error::Target(e.to_string()))?;
        Ok(QwenTarget {
            model,
            taps: taps.to_vec(),
            numerics,
        })
    }
}

impl TargetStep for QwenTarget<'_> {
    type State = State;
    fn start(&self) -> State {
        State::new(&self.model, self.numerics)
    }
    fn step(&self, state: &mut State, token: u32) -> Result<(Vec<f32>, Vec<f32>), Error> {
        if token as usize >= self.model.n_vocab() {
            return Err(Error::Target(format!(
                "token {token} is not below the vocabulary size {}",
                self.model.n_vocab()
            )));
        }
        let pos = state.len();
        let (logits, taps) = self.model.step_taps(state, token, pos, &self.taps);
        if let Some(e) = self.model.weights().error() {
            return Err(Error::Target(e));
        }
        Ok((logits, taps.concat()))
    }
}

/// The qwen4exp target on a device ([`DeviceDecoder`], its state on the
/// device), with its tap layers. It holds one sequence and cannot go back:
/// its [`TargetStep::State`] is the position, and a step from a position
/// other than the decoder's is refused. [`speculate`] always commits the
/// state it verified with, so it never needs to.
pub struct DeviceTarget<'m> {
    decoder: RefCell<DeviceDecoder<'m>>,
    taps: Vec<usize>,
}

impl std::fmt::Debug for DeviceTarget<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceTarget")
            .field("taps", &self.taps)
            .finish_non_exhaustive()
    }
}

impl<'m> DeviceTarget<'m> {
    /// The target pass of `decoder` (at position 0), tapping `taps`
    /// (0-based layers).
    ///
    /// # Errors
    ///
    /// The decoder has fed a position already.
    pub fn new(decoder: DeviceDecoder<'m>, taps: &[usize]) -> Result<DeviceTarget<'m>, Error> {
        if decoder.position() != 0 {
            return Err(Error::Target(format!(
                "the device decoder is at position {}, not 0",
                decoder.position()
            )));
        }
        Ok(DeviceTarget {
            decoder: RefCell::new(decoder),
            taps: taps.to_vec(),
        })
    }

    /// The decoder (its op layer and counters).
    pub fn decoder(&self) -> std::cell::Ref<'_, DeviceDecoder<'m>> {
        self.decoder.borrow()
    }
}

impl TargetStep for DeviceTarget<'_> {
    type State = usize;
    fn start(&self) -> usize {
        0
    }
    fn step(&self, state: &mut usize, token: u32) -> Result<(Vec<f32>, Vec<f32>), Error> {
        let mut d = self.decoder.borrow_mut();
        if *state != d.position() {
            return Err(Error::Target(format!(
                "a step at position {state}: the device target is at {} and cannot go back",
                d.position()
            )));
        }
        let (logits, taps) = d
            .step_taps(token, &self.taps)
            .map_err(|e| Error::Target(e.to_string()))?;
        *state += 1;
        Ok((logits, taps.concat()))
    }
}

/// What a speculative run did.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SpecReport {
    /// The generated tokens (the target's greedy tokens).
    pub tokens: Vec<u32>,
    /// Draft-and-verify rounds.
    pub rounds: usize,
    /// Draft tokens proposed.
    pub proposed: usize,
    /// Draft tokens accepted.
    pub accepted: usize,
    /// `accepted / proposed` (0 when none proposed).
    pub acceptance_rate: f64,
    /// Target steps taken (prompt included).
    pub target_steps: usize,
}

/// Feeds `prompt` to `target`, then generates `n` tokens speculatively
/// with `proposer`, verifying greedily.
///
/// # Errors
///
/// The prompt is empty, or the target or proposer failed.
pub fn speculate<T: TargetStep>(
    target: &T,
    proposer: &mut dyn Proposer,
    prompt: &[u32],
    n: usize,
) -> Result<SpecReport, Error> {
    if prompt.is_empty() {
        return Err(Error::Target("an empty prompt".into()));
    }
    let mut state = target.start();
    let mut logits = Vec::new();
    let mut steps = 0;
    for &t in prompt {
        let (l, taps) = target.step(&mut state, t)?;
        proposer.push_context(&taps)?;
        logits = l;
        steps += 1;
    }
    let mut tokens = vec![argmax(&logits) as u32];
    let (mut rounds, mut proposed, mut accepted) = (0, 0, 0);
    while tokens.len() < n {
        // The anchor: the last token, not yet fed to the target.
        let anchor = *tokens.last().expect("one token at least");
        let drafts = proposer.propose(anchor)?;
        rounds += 1;
        proposed += drafts.len();
        // Verify from a clone: the committed state is replaced only by
        // what the target itself would have produced.
        let mut work = state.clone();
        let (l, taps) = target.step(&mut work, anchor)?;
        steps += 1;
        let mut fed = vec![taps];
        let mut choice = argmax(&l) as u32;
        for &d in &drafts {
            if d != choice || tokens.len() >= n {
                break;
            }
            accepted += 1;
            tokens.push(d);
            let (l, taps) = target.step(&mut work, d)?;
            steps += 1;
            fed.push(taps);
            choice = argmax(&l) as u32;
        }
        // The target's own token after the accepted prefix.
        tokens.push(choice);
        state = work;
        for taps in &fed {
            proposer.push_context(taps)?;
        }
    }
    tokens.truncate(n);
    Ok(SpecReport {
        tokens,
        rounds,
        proposed,
        accepted,
        acceptance_rate: if proposed == 0 {
            0.0
        } else {
            accepted as f64 / proposed as f64
        },
        target_steps: steps,
    })
}
