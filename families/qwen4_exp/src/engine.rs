//! The forward pass's weights through the seam, as a real engine reads them.
//!
//! Every weight a step reads is asked of [`seam::resident_weight`] on every
//! step: dense weights whole, experts one at a time as sub-span borrows of
//! their stack ([`Qwen4Exp::expert`]), per-layer-embedding rows gathered
//! from the mapped table. What the kernel reads is the host view (CPU) or the
//! device copy read back (a staging device; the CPU kernels stand in for the
//! device's). Dequantized values are cached per weight, so the arithmetic is
//! done once while the seam is still asked each step (its memoized path
//! costs nanoseconds).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use seam::gguf::{GgufModel, Value};
use seam::platform::{Platform, Queue};
use seam::weight::Weight;
use seam::{Resident, resident_weight};

use crate::error::Error;
use crate::forward::Weights;
use crate::model::{ExpertKind, Qwen4Exp};

/// [`Weights`] backed by the seam.
pub struct SeamWeights<'a> {
    model: &'a Qwen4Exp,
    gguf: &'a GgufModel,
    platform: &'a dyn Platform,
    queue: &'a dyn Queue,
    cache: Mutex<HashMap<String, Arc<[f32]>>>,
    first_error: Mutex<Option<String>>,
}

/// An expert stack's tensor name: (layer, which matrices).
fn expert_stack(name: &str) -> Option<(usize, &'static [ExpertKind])> {
    let rest = name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let kinds: &'static [ExpertKind] = match rest {
        "ffn_gate_exps.weight" => &[ExpertKind::Gate],
        "ffn_up_exps.weight" => &[ExpertKind::Up],
        "ffn_down_exps.weight" => &[ExpertKind::Down],
        // The merged stack: an expert's gate rows, then its up rows.
        "ffn_gate_up_exps.weight" => &[ExpertKind::Gate, ExpertKind::Up],
        _ => return None,
    };
    Some((layer.parse().ok()?, kinds))
}

impl<'a> SeamWeights<'a> {
    /// Weights of `model` (loaded from `gguf`) staged on `platform`.
    pub fn new(
        model: &'a Qwen4Exp,
        gguf: &'a GgufModel,
        platform: &'a dyn Platform,
        queue: &'a dyn Queue,
    ) -> SeamWeights<'a> {
        SeamWeights {
            model,
            gguf,
            platform,
            queue,
            cache: Mutex::new(HashMap::new()),
            first_error: Mutex::new(None),
        }
    }

    /// The first error the seam reported. A step cannot return one, so a
    /// weight the seam failed to hand out (a device error, a file truncated
    /// under the load) reads as zeros of its size for the rest of the step
    /// instead of stopping the pass with a panic; the step's caller checks
    /// this after every step and reports the error, never the step's
    /// output ([`greedy`], dflash's target).
    pub fn error(&self) -> Option<String> {
        self.first_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn fail(&self, e: impl std::fmt::Display) -> Option<Arc<[f32]>> {
        self.first_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(|| e.to_string());
        None
    }

    /// Asks the seam for `weight` (every call: what a step does), and
    /// dequantizes what the kernel may read, once.
    fn resident_f32(&self, key: &str, weight: &Weight) -> Option<Arc<[f32]>> {
        let resident = match resident_weight(weight, self.platform, self.queue) {
            Ok(r) => r,
            Err(e) => return self.fail(e),
        };
        if let Some(hit) = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
        {
            return Some(Arc::clone(hit));
        }
        let bytes: Vec<u8> = match resident {
            Resident::Host(view) => view.to_vec(),
            Resident::Device(copy) => {
                let mut out = vec![0u8; copy.buffer().len() as usize];
                if let Err(e) = self
                    .platform
                    .backend()
                    .read_back(copy.buffer(), 0, &mut out)
                {
                    return self.fail(e);
                }
                out
            }
        };
        let values = self.dequantize(weight, &bytes)?;
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.to_owned(), Arc::clone(&values));
        Some(values)
    }

    fn dequantize(&self, weight: &Weight, bytes: &[u8]) -> Option<Arc<[f32]>> {
        let block = weight.ggml_type().block_size() as usize;
        let n = bytes.len() / weight.ggml_type().type_size() as usize * block;
        let mut out = vec![0f32; n];
        match family_ops::dequantize(weight.ggml_type(), bytes, &mut out) {
            Ok(()) => Some(out.into()),
            Err(e) => self.fail(e),
        }
    }

    fn expert_rows(
        &self,
        layer: usize,
        kinds: &[ExpertKind],
        first: usize,
        n: usize,
    ) -> Option<Arc<[f32]>> {
        let name = |kind: ExpertKind| match kind {
            ExpertKind::Gate => "ffn_gate_exps",
            ExpertKind::Up => "ffn_up_exps",
            ExpertKind::Down => "ffn_down_exps",
        };
        // Rows per expert: n covers one expert of every matrix in `kinds`.
        let per_matrix = n / kinds.len();
        if per_matrix == 0 || !first.is_multiple_of(n) {
            return self.fail(format!(
                "layer {layer}: rows {first}+{n} are not one whole expert"
            ));
        }
        let expert = (first / n) as u64;
        let mut values = Vec::with_capacity(n);
        for &kind in kinds {
            let weight = match self.model.expert(layer, kind, expert) {
                Ok(w) => w,
                Err(e) => return self.fail(e),
            };
            let key = format!("blk.{layer}.{}[{expert}]", name(kind));
            values.extend_from_slice(&self.resident_f32(&key, weight)?);
        }
        Some(values.into())
    }

    fn ple_rows(&self, first: usize, n: usize) -> Option<Arc<[f32]>> {
        let table = match self.model.ple_table() {
            Ok(t) => t,
            Err(e) => return self.fail(e),
        };
        let mut values = Vec::new();
        for row in first..first + n {
            let bytes = match self.model.ple_row(row as u64) {
                Ok(b) => b,
                Err(e) => return self.fail(e),
            };
            values.extend_from_slice(&self.dequantize(table, bytes)?);
        }
        Some(values.into())
    }

    /// `values`, or, when the seam failed on a tensor that exists (an
    /// error is recorded), `n` zeros that stand in until the step ends.
    fn or_zeros_after_error(&self, values: Option<Arc<[f32]>>, n: usize) -> Option<Arc<[f32]>> {
        match values {
            None if self.error().is_some() => Some(vec![0f32; n].into()),
            other => other,
        }
    }

    fn f32_of(&self, name: &str) -> Option<Arc<[f32]>> {
        let weight = self.model.weight(name)?;
        if weight.flags().expert_streamed {
            return self.fail(format!("{name} is read in slices, never whole"));
        }
        self.resident_f32(name, weight)
    }

    fn rows_of(&self, name: &str, first: usize, n: usize) -> Option<Arc<[f32]>> {
        if let Some((layer, kinds)) = expert_stack(name) {
            return self.expert_rows(layer, kinds, first, n);
        }
        if name == "per_layer_token_embd.weight" {
            return self.ple_rows(first, n);
        }
        let ne0 = usize::try_from(*self.dims(name)?.first()?).ok()?;
        let all = self.f32(name)?;
        all.get(first * ne0..(first + n) * ne0).map(Arc::from)
    }
}

impl Weights for SeamWeights<'_> {
    fn f32(&self, name: &str) -> Option<Arc<[f32]>> {
        let values = self.f32_of(name);
        let n = self
            .dims(name)
            .and_then(|d| usize::try_from(d.iter().product::<u64>()).ok());
        match n {
            Some(n) => self.or_zeros_after_error(values, n),
            None => values,
        }
    }

    fn dims(&self, name: &str) -> Option<Vec<u64>> {
        self.gguf.tensor(name).map(|t| t.dims.clone())
    }

    fn metadata(&self, key: &str) -> Option<&Value> {
        self.gguf.metadata(key)
    }

    fn rows(&self, name: &str, first: usize, n: usize) -> Option<Arc<[f32]>> {
        let values = self.rows_of(name, first, n);
        let ne0 = self
            .dims(name)
            .and_then(|d| usize::try_from(*d.first()?).ok());
        match ne0 {
            Some(ne0) => self.or_zeros_after_error(values, n * ne0),
            None => values,
        }
    }
}

/// Greedy decoding through the seam: feeds `prompt`, then `n` greedy
/// tokens; returns the generated tokens and the last position's logits.
///
/// # Errors
///
/// The model's hyperparameters or tensors do not fit the forward pass, or
/// the seam failed to hand out a weight.
pub fn greedy(
    weights: SeamWeights<'_>,
    prompt: &[u32],
    n: usize,
) -> Result<(Vec<u32>, Vec<f32>), Error> {
    let model = crate::forward::Model::new(weights).map_err(|e| Error::Forward(e.to_string()))?;
    if let Some(&t) = prompt.iter().find(|&&t| t as usize >= model.n_vocab()) {
        return Err(Error::Forward(format!(
            "token {t} is not below the vocabulary size {}",
            model.n_vocab()
        )));
    }
    let mut state = crate::forward::State::new(&model);
    let check = |model: &crate::forward::Model<SeamWeights<'_>>| match model.weights().error() {
        Some(e) => Err(Error::Forward(e)),
        None => Ok(()),
    };
    let mut logits = Vec::new();
    for (pos, &t) in prompt.iter().enumerate() {
        logits = model.step(&mut state, t, pos);
        check(&model)?;
    }
    let mut generated = Vec::with_capacity(n);
    for i in 0..n {
        // The same choice as `forward::Model::greedy` (first maximum).
        let next = crate::forward::math::argmax(&logits) as u32;
        generated.push(next);
        if i + 1 < n {
            logits = model.step(&mut state, next, prompt.len() + i);
            check(&model)?;
        }
    }
    Ok((generated, logits))
}
