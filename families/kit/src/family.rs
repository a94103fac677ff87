//! The family contract: what a program needs of a model family to decode
//! with it, whatever runs the arithmetic.
//!
//! A family names itself, writes its built-in fixture, builds its model
//! from a GGUF a session opened, and hands out a [`Decoder`]: `prefill`
//! takes the prompt and `step` one token, each returning the logits of
//! the last position fed. Today every decoder computes on the host over
//! the kit's [`WeightReader`](crate::WeightReader) (host `Vec<f32>`
//! logits); the device op layer to come implements the same traits with
//! its state on the device.
//!
//! [`decode`] is the greedy loop over a decoder that every family binary
//! runs (through `driver`, behind the `driver` feature), with what each
//! forward call cost: its time, the bytes it read back from the device,
//! the transfers between host and device and the kernels it launched
//! ([`DecodeReport`], the `decode` key of a family binary's report).
//!
//! **Architecture Invariant:** the contract knows no platform and no
//! command line: it is the library's, so an engine that links a family
//! without its binary (`--no-default-features`) implements or uses it.

use std::time::Instant;

use seam::gguf::{GgufModel, GgufWriter};
use seam::platform::{Platform, Queue};
use serde::Serialize;

use crate::error::LoadError;
use crate::numerics::Numerics;

/// A model family, as a program that decodes with it needs it.
pub trait Family {
    /// The family's name, as its binary is named (`qwen4_exp`): every
    /// stderr line of the binary starts with it.
    const NAME: &'static str;

    /// Why the family cannot run with `mmap=off` (it hands out borrows of
    /// the mapped file), or `None` where it can.
    const MMAP_REQUIRED: Option<&'static str>;

    /// What the model borrows besides its own file, opened first through
    /// the same session: dflash's qwen4exp target, muse_glimmer's optional
    /// projector; `()` for a family of one file.
    type Companion;

    /// The loaded model (claimed weights, nothing staged yet); it may
    /// borrow the companion.
    type Model<'c>;

    /// A decoding sequence over a model on one device.
    type Decoder<'m>: Decoder;

    /// The built-in tiny fixture, written to a temporary file when a
    /// binary is given no file.
    fn fixture() -> GgufWriter;

    /// Builds the model from `gguf`, a file the session opened, and its
    /// companion: the manifest's two-way check, nothing staged.
    ///
    /// # Errors
    ///
    /// The family refuses the file (the error names the key or tensor).
    fn load<'c>(
        gguf: &'c GgufModel,
        companion: &'c Self::Companion,
    ) -> Result<Self::Model<'c>, LoadError>;

    /// The vocabulary's size: a token id must be below it.
    fn n_vocab(model: &Self::Model<'_>) -> usize;

    /// A decoder of `model` (loaded from `gguf`) whose weights are staged
    /// on `platform` through `queue`, at position 0, computing as
    /// `numerics` says (its caches' element types, flash attention).
    ///
    /// # Errors
    ///
    /// The model does not fit the forward pass, or the family does not
    /// offer a choice of `numerics` (the error names it).
    fn decoder<'m>(
        model: &'m Self::Model<'_>,
        gguf: &'m GgufModel,
        platform: &'m dyn Platform,
        queue: &'m dyn Queue,
        numerics: Numerics,
    ) -> Result<Self::Decoder<'m>, LoadError>;

    /// Whether the family's device path can stage every expert stack whole
    /// before the first token ([`ExpertStaging::All`]).
    const STAGES_ALL_EXPERTS: bool = false;

    /// A decoder of `model` as [`Family::decoder`] makes it, computing
    /// through `ops` (the op layer of `platform`, launching on `queue`)
    /// where the family has a device path, its experts staged as
    /// `staging` says (only [`ExpertStaging::OnPick`] unless
    /// [`Family::STAGES_ALL_EXPERTS`]). The default is the host path
    /// ([`Family::decoder`]); `ops` is dropped unused.
    ///
    /// # Errors
    ///
    /// As [`Family::decoder`], or the device failed.
    #[allow(clippy::too_many_arguments)]
    fn device_decoder<'m>(
        model: &'m Self::Model<'_>,
        gguf: &'m GgufModel,
        platform: &'m dyn Platform,
        queue: &'m dyn Queue,
        ops: Box<dyn device_ops::Ops + 'm>,
        staging: ExpertStaging,
        numerics: Numerics,
    ) -> Result<Self::Decoder<'m>, LoadError> {
        drop(ops);
        staging.only_on_pick(Self::NAME)?;
        Self::decoder(model, gguf, platform, queue, numerics)
    }

    /// The files the companion holds open, checked unchanged after every
    /// pass as the model's own file is.
    fn companion_files(companion: &Self::Companion) -> Vec<&GgufModel> {
        let _ = companion;
        Vec::new()
    }
}

/// When a device decoder stages a mixture-of-experts model's experts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ExpertStaging {
    /// Each expert on its first pick, as a sub-span of its stack: a model
    /// whose experts are never picked never pays for them, and the host
    /// learns the picks (to stage them) on every step.
    #[default]
    #[serde(rename = "picked")]
    OnPick,
    /// Every stack whole (and every dense weight) before the first token:
    /// the router's picks stay on the device, where the expert products
    /// read them.
    All,
}

impl ExpertStaging {
    /// Refuses [`ExpertStaging::All`] for `family`, whose device path
    /// stages experts on their first pick only (or has none).
    ///
    /// # Errors
    ///
    /// `self` is [`ExpertStaging::All`]; the error names the family.
    pub fn only_on_pick(self, family: &str) -> Result<(), LoadError> {
        if self == ExpertStaging::All {
            return Err(LoadError::Forward(format!(
                "{family} stages experts on their first pick only"
            )));
        }
        Ok(())
    }

    /// The word the command line takes for it (`--stage picked|all`).
    pub fn word(self) -> &'static str {
        match self {
            ExpertStaging::OnPick => "picked",
            ExpertStaging::All => "all",
        }
    }
}

impl std::str::FromStr for ExpertStaging {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "picked" => Ok(ExpertStaging::OnPick),
            "all" => Ok(ExpertStaging::All),
            _ => Err(format!("{s:?} is not picked or all")),
        }
    }
}

/// A decoding sequence: its caches, its position and its device.
pub trait Decoder {
    /// Feeds `tokens` from the current position; returns the logits of the
    /// last one.
    ///
    /// # Errors
    ///
    /// An empty prompt, a token outside the vocabulary, or a weight the
    /// seam failed to hand out.
    fn prefill(&mut self, tokens: &[u32]) -> Result<Vec<f32>, LoadError>;

    /// Feeds `token` at the next position; returns its logits.
    ///
    /// # Errors
    ///
    /// A token outside the vocabulary, or a weight the seam failed to hand
    /// out.
    fn step(&mut self, token: u32) -> Result<Vec<f32>, LoadError>;

    /// What the decoder moved and launched so far (totals since it was
    /// made).
    fn traffic(&self) -> Traffic;
}

/// A prefill as the host paths run it: each token through `step` in turn,
/// the last one's logits.
///
/// # Errors
///
/// An empty prompt ([`LoadError::empty_prompt`]), or what `step` returns.
pub fn prefill_by_steps(
    tokens: &[u32],
    mut step: impl FnMut(u32) -> Result<Vec<f32>, LoadError>,
) -> Result<Vec<f32>, LoadError> {
    let (&last, rest) = tokens.split_last().ok_or_else(LoadError::empty_prompt)?;
    for &t in rest {
        step(t)?;
    }
    step(last)
}

/// A family's decoder: its host path, or its device path where the device
/// has an op layer ([`Family::device_decoder`]; boxed, its blocks' state
/// being the larger).
#[derive(Debug)]
pub enum HostOrDevice<H, D> {
    /// The host forward.
    Host(H),
    /// The forward composed from the device's ops.
    Device(Box<D>),
}

impl<H, D> HostOrDevice<H, D> {
    /// `host` of the host path's decoder or `device` of the device
    /// path's, whichever this is.
    pub fn either<T>(&self, host: impl FnOnce(&H) -> T, device: impl FnOnce(&D) -> T) -> T {
        match self {
            HostOrDevice::Host(h) => host(h),
            HostOrDevice::Device(d) => device(d),
        }
    }
}

impl<H: Decoder, D: Decoder> Decoder for HostOrDevice<H, D> {
    fn prefill(&mut self, tokens: &[u32]) -> Result<Vec<f32>, LoadError> {
        match self {
            HostOrDevice::Host(d) => d.prefill(tokens),
            HostOrDevice::Device(d) => d.prefill(tokens),
        }
    }

    fn step(&mut self, token: u32) -> Result<Vec<f32>, LoadError> {
        match self {
            HostOrDevice::Host(d) => d.step(token),
            HostOrDevice::Device(d) => d.step(token),
        }
    }

    fn traffic(&self) -> Traffic {
        match self {
            HostOrDevice::Host(d) => d.traffic(),
            HostOrDevice::Device(d) => d.traffic(),
        }
    }
}

/// What a decoder moved between host and device and launched, as totals
/// ([`Decoder::traffic`]) or for one forward call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Traffic {
    /// Bytes the host received from the device: weights and activations
    /// alike.
    pub read_back_bytes: u64,
    /// Of those, bytes of staged weights.
    pub weight_read_back_bytes: u64,
    /// Transfers from the device to the host.
    pub read_backs: u64,
    /// Device kernels launched; `None` where the decoder cannot count them.
    pub kernel_launches: Option<u64>,
}

impl Traffic {
    /// What happened between `before` and `self` (totals of one decoder).
    pub fn since(self, before: Traffic) -> Traffic {
        Traffic {
            read_back_bytes: self.read_back_bytes.saturating_sub(before.read_back_bytes),
            weight_read_back_bytes: self
                .weight_read_back_bytes
                .saturating_sub(before.weight_read_back_bytes),
            read_backs: self.read_backs.saturating_sub(before.read_backs),
            kernel_launches: match (self.kernel_launches, before.kernel_launches) {
                (Some(now), Some(then)) => Some(now.saturating_sub(then)),
                _ => None,
            },
        }
    }
}

/// One forward call of a [`decode`]: the prefill, or one step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Call {
    /// Wall time of the call.
    pub seconds: f64,
    /// What the decoder moved and launched during the call.
    pub traffic: Traffic,
    /// Weights the seam copied to the device during the call (an expert
    /// staged on its first pick; every weight on the first call).
    pub uploads: u64,
}

/// What [`decode`] produced.
#[derive(Clone, Debug, PartialEq)]
pub struct GreedyRun {
    /// The greedy tokens.
    pub generated: Vec<u32>,
    /// The logits of the last position fed to the model: with one step,
    /// the prompt's last position; with N, the position of generated token
    /// N-1 (the logits generated token N came from).
    pub logits: Vec<f32>,
    /// The forward calls: the prefill (which gives the first token), then
    /// one per step after it (each gives the next token).
    pub calls: Vec<Call>,
}

/// Feeds `prompt` to `decoder` in one prefill, then decodes `steps` tokens
/// greedily (argmax, ties to the lower id), each step feeding the token
/// before it; `platform` is where the decoder's weights are staged (its
/// upload count, per call). The last generated token is never fed, so
/// `steps` tokens take `steps - 1` steps after the prefill.
///
/// # Errors
///
/// An empty prompt, or what the decoder returns.
pub fn decode(
    decoder: &mut dyn Decoder,
    platform: &dyn Platform,
    prompt: &[u32],
    steps: usize,
) -> Result<GreedyRun, LoadError> {
    decode_with(decoder, platform, prompt, steps, &mut |_| true)
}

/// [`decode`], handing each generated token to `on_token` as soon as it is
/// chosen (to stream its text); the decode stops after a token for which
/// `on_token` returns `false` (an end-of-generation token), that token
/// kept as the last one generated.
///
/// # Errors
///
/// As [`decode`].
pub fn decode_with(
    decoder: &mut dyn Decoder,
    platform: &dyn Platform,
    prompt: &[u32],
    steps: usize,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<GreedyRun, LoadError> {
    if prompt.is_empty() {
        return Err(LoadError::empty_prompt());
    }
    let mut calls = Vec::with_capacity(steps.max(1));
    let mut logits = timed(decoder, platform, &mut calls, |d| d.prefill(prompt))?;
    let mut generated = Vec::with_capacity(steps);
    for i in 0..steps {
        let next = family_ops::argmax(&logits) as u32;
        generated.push(next);
        if !on_token(next) {
            break;
        }
        if i + 1 < steps {
            logits = timed(decoder, platform, &mut calls, |d| d.step(next))?;
        }
    }
    Ok(GreedyRun {
        generated,
        logits,
        calls,
    })
}

/// Runs `feed` on `decoder`, adding its [`Call`] to `calls`.
fn timed(
    decoder: &mut dyn Decoder,
    platform: &dyn Platform,
    calls: &mut Vec<Call>,
    feed: impl FnOnce(&mut dyn Decoder) -> Result<Vec<f32>, LoadError>,
) -> Result<Vec<f32>, LoadError> {
    let uploads = || platform.stage_counters().snapshot().uploads;
    let (traffic, up, start) = (decoder.traffic(), uploads(), Instant::now());
    let logits = feed(decoder)?;
    calls.push(Call {
        seconds: start.elapsed().as_secs_f64(),
        traffic: decoder.traffic().since(traffic),
        uploads: uploads().saturating_sub(up),
    });
    Ok(logits)
}

/// The `decode` key of a family binary's report. The four traffic figures
/// are per forward call: entry 0 is the prefill (which gives the first
/// token), entry i the step that gives token i.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DecodeReport {
    /// Tokens decoded (`--steps`).
    pub steps: usize,
    /// Tokens of the prompt.
    pub prompt_tokens: usize,
    /// Tokens generated: `steps`, or fewer where an end-of-generation
    /// token stopped a `--prompt` run.
    pub generated_tokens: usize,
    /// Wall time of the prefill.
    pub prefill_seconds: f64,
    /// Prompt tokens per second of the prefill.
    pub prefill_tokens_per_second: Option<f64>,
    /// Wall time of the steps after the prefill.
    pub seconds: f64,
    /// Steps after the prefill per second of them; `None` when no step ran
    /// after the prefill (`--steps` 0 or 1).
    pub tokens_per_second: Option<f64>,
    /// Bytes read back from the device, per call.
    pub read_back_bytes: Vec<u64>,
    /// Bytes of staged weights read back from the device, per call.
    pub weight_read_back_bytes: Vec<u64>,
    /// Transfers between host and device, per call: read-backs plus the
    /// weights the seam copied up during the call.
    pub host_transfers: Vec<u64>,
    /// Device kernels launched, per call (`null` where not counted).
    pub kernel_launches: Vec<Option<u64>>,
    /// When the experts were staged (`--stage`).
    pub stage: ExpertStaging,
}

impl DecodeReport {
    /// The report of `decoded`, a decode of `prompt_tokens` and `steps`.
    pub fn new(decoded: &GreedyRun, prompt_tokens: usize, steps: usize) -> DecodeReport {
        let (prefill, rest) = match decoded.calls.split_first() {
            Some((first, rest)) => (first.seconds, rest),
            None => (0.0, &[][..]),
        };
        let seconds: f64 = rest.iter().map(|c| c.seconds).sum();
        let per_call = |f: fn(&Call) -> u64| decoded.calls.iter().map(f).collect::<Vec<_>>();
        DecodeReport {
            steps,
            prompt_tokens,
            generated_tokens: decoded.generated.len(),
            prefill_seconds: prefill,
            prefill_tokens_per_second: (!decoded.calls.is_empty() && prefill > 0.0)
                .then(|| prompt_tokens as f64 / prefill),
            seconds,
            tokens_per_second: (!rest.is_empty() && seconds > 0.0)
                .then(|| rest.len() as f64 / seconds),
            read_back_bytes: per_call(|c| c.traffic.read_back_bytes),
            weight_read_back_bytes: per_call(|c| c.traffic.weight_read_back_bytes),
            host_transfers: per_call(|c| c.traffic.read_backs + c.uploads),
            kernel_launches: decoded
                .calls
                .iter()
                .map(|c| c.traffic.kernel_launches)
                .collect(),
            stage: ExpertStaging::OnPick,
        }
    }
}

#[cfg(test)]
mod tests {
    use platform_fake::{FakeConfig, FakePlatform};

    use super::*;

    #[test]
    fn prefill_by_steps_feeds_every_token_in_order_and_gives_the_last_logits() {
        let mut fed = Vec::new();
        let logits = prefill_by_steps(&[4, 7, 9], |t| {
            fed.push(t);
            Ok(vec![t as f32])
        })
        .unwrap();
        assert_eq!((fed, logits), (vec![4, 7, 9], vec![9.0]));
        // The first error ends it; an empty prompt steps nothing.
        let mut fed = Vec::new();
        let e = prefill_by_steps(&[1, 2, 3], |t| {
            fed.push(t);
            if t == 2 {
                Err(LoadError::Forward("two".into()))
            } else {
                Ok(vec![])
            }
        })
        .unwrap_err();
        assert_eq!(
            (fed, e.to_string()),
            (vec![1, 2], "forward pass: two".into())
        );
        let e = prefill_by_steps(&[], |_| unreachable!("no token to step")).unwrap_err();
        assert_eq!(e.to_string(), LoadError::empty_prompt().to_string());
        assert_eq!(e.to_string(), "forward pass: the prompt is empty");
    }

    /// Favours token (last fed + 1) % 4; every call reads back 10 bytes
    /// per token fed and launches nothing it can count after `uncounted`
    /// calls.
    struct Counting {
        fed: Vec<u32>,
        prefills: usize,
        traffic: Traffic,
        uncounted_from: usize,
    }

    impl Counting {
        fn feed(&mut self, tokens: &[u32]) -> Vec<f32> {
            self.fed.extend(tokens);
            let calls = self.prefills + self.fed.len();
            self.traffic.read_back_bytes += 10 * tokens.len() as u64;
            self.traffic.weight_read_back_bytes += 8 * tokens.len() as u64;
            self.traffic.read_backs += 1;
            self.traffic.kernel_launches = (calls < self.uncounted_from)
                .then(|| self.traffic.kernel_launches.unwrap_or(0) + 3);
            let mut l = vec![0.0; 4];
            l[((tokens[tokens.len() - 1] + 1) % 4) as usize] = 1.0;
            l
        }
    }

    impl Decoder for Counting {
        fn prefill(&mut self, tokens: &[u32]) -> Result<Vec<f32>, LoadError> {
            self.prefills += 1;
            Ok(self.feed(tokens))
        }
        fn step(&mut self, token: u32) -> Result<Vec<f32>, LoadError> {
            Ok(self.feed(&[token]))
        }
        fn traffic(&self) -> Traffic {
            self.traffic
        }
    }

    fn counting(uncounted_from: usize) -> Counting {
        Counting {
            fed: Vec::new(),
            prefills: 0,
            traffic: Traffic {
                kernel_launches: Some(0),
                ..Traffic::default()
            },
            uncounted_from,
        }
    }

    #[test]
    fn one_prefill_then_a_step_per_token_but_the_last_with_per_call_figures() {
        let platform = FakePlatform::new(FakeConfig::default());
        let mut d = counting(usize::MAX);
        let out = decode(&mut d, &platform, &[2, 0], 3).unwrap();
        assert_eq!(out.generated, [1, 2, 3]);
        assert_eq!(d.prefills, 1);
        assert_eq!(d.fed, [2, 0, 1, 2], "the last token is never fed");
        assert_eq!(out.logits, [0.0, 0.0, 0.0, 1.0], "after feeding 2");
        assert_eq!(out.calls.len(), 3);
        let r = DecodeReport::new(&out, 2, 3);
        assert_eq!((r.steps, r.prompt_tokens), (3, 2));
        assert_eq!(r.read_back_bytes, [20, 10, 10]);
        assert_eq!(r.weight_read_back_bytes, [16, 8, 8]);
        assert_eq!(r.host_transfers, [1, 1, 1], "nothing uploaded");
        assert_eq!(r.kernel_launches, [Some(3), Some(3), Some(3)]);
        assert!(r.seconds >= 0.0 && r.prefill_seconds >= 0.0);

        // One step: the prompt's last position, and no step to time.
        let mut d = counting(usize::MAX);
        let out = decode(&mut d, &platform, &[3, 1], 1).unwrap();
        assert_eq!(out.generated, [2]);
        assert_eq!(d.fed, [3, 1]);
        assert_eq!(out.logits, [0.0, 0.0, 1.0, 0.0]);
        let r = DecodeReport::new(&out, 2, 1);
        assert_eq!(r.tokens_per_second, None);
        assert_eq!(r.seconds, 0.0);
        assert_eq!(r.read_back_bytes, [20]);

        let err = decode(&mut counting(0), &platform, &[], 1).unwrap_err();
        assert!(err.to_string().contains("empty"), "{err}");
    }

    #[test]
    fn a_token_the_callback_refuses_is_the_last_and_is_never_fed() {
        let platform = FakePlatform::new(FakeConfig::default());
        let mut d = counting(usize::MAX);
        let mut seen = Vec::new();
        let out = decode_with(&mut d, &platform, &[0], 5, &mut |t| {
            seen.push(t);
            t != 2
        })
        .unwrap();
        assert_eq!(out.generated, [1, 2]);
        assert_eq!(seen, [1, 2], "each token as it is chosen");
        assert_eq!(d.fed, [0, 1], "the stopping token is not fed");
        let r = DecodeReport::new(&out, 1, 5);
        assert_eq!((r.steps, r.generated_tokens, r.prompt_tokens), (5, 2, 1));
        assert!(r.prefill_tokens_per_second.is_some_and(|v| v > 0.0));
    }

    #[test]
    fn a_launch_count_lost_midway_is_null_not_a_number() {
        let platform = FakePlatform::new(FakeConfig::default());
        // Counted for the prefill (call 1, 2 tokens -> 3 counted calls),
        // not from the third token fed on.
        let mut d = counting(4);
        let out = decode(&mut d, &platform, &[1, 2], 3).unwrap();
        let r = DecodeReport::new(&out, 2, 3);
        assert_eq!(r.kernel_launches, [Some(3), None, None]);
    }
}
