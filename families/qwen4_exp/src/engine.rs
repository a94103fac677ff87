//! The forward pass's weights through the seam, as a real engine reads them.
//!
//! Every weight a step reads is asked of [`seam::resident_weight`] on every
//! use, through the kit's [`WeightReader`]: dense weights whole, experts one
//! at a time as sub-span borrows of their stack ([`Qwen4Exp::expert`]),
//! per-layer-embedding rows gathered from the mapped table. What the kernel
//! reads is the host view (CPU) or the device copy read back (a staging
//! device; the CPU kernels stand in for the device's). Matrices are read a
//! chunk of quantized rows at a time and never kept dequantized; only small
//! tensors are (norms, biases, kernels, scales), so a decode step's memory
//! is its activations and caches, not the model in `f32`.

use std::sync::{Arc, Mutex};

use family_kit::WeightReader;
use family_kit::reader::table_row;
use family_ops::as_ggml_multiplies;
use family_ops::ggml_cpu::{self, Ubatch};
use seam::gguf::GgufModel;
use seam::platform::{Platform, Queue};
use seam::weight::Weight;

use crate::error::Error;
use crate::forward::Weights;
use crate::model::{ExpertKind, Qwen4Exp};

/// [`Weights`] backed by the seam.
pub struct SeamWeights<'a> {
    model: &'a Qwen4Exp,
    gguf: &'a GgufModel,
    reader: WeightReader<'a>,
    first_error: Mutex<Option<String>>,
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
            reader: WeightReader::new(platform, queue),
            first_error: Mutex::new(None),
        }
    }

    /// The reader (what it keeps dequantized).
    pub fn reader(&self) -> &WeightReader<'a> {
        &self.reader
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

    fn ok<T>(&self, r: Result<T, Error>) -> Option<T> {
        r.map_err(|e| {
            self.first_error
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert_with(|| e.to_string());
        })
        .ok()
    }

    /// `n` zeros where the seam failed on a weight that exists (an error is
    /// recorded): they stand in until the step ends and its caller reports
    /// the error.
    fn zeros_after_error<T: Clone + Default>(&self, n: u64) -> Option<Vec<T>> {
        let n = usize::try_from(n).ok()?;
        self.error().is_some().then(|| vec![T::default(); n])
    }

    /// `w · x` as ggml's CPU `mul_mat` computes it for one token of
    /// `ubatch` (`family_ops::ggml_cpu::matvec`); a type it does not
    /// reproduce multiplies the activations ggml would round, dotted in
    /// `f64` (`family_ops::matvec`).
    fn product(&self, w: &'a Weight, x: &[f32], ubatch: Ubatch) -> Result<Vec<f32>, Error> {
        if ggml_cpu::is_emulated(w.ggml_type()) {
            return self.reader.matvec_ggml(w, x, ubatch);
        }
        let x = as_ggml_multiplies(w.ggml_type(), x)
            .map_err(|e| Error::Forward(format!("{}: {e}", w.name())))?;
        self.reader.matvec_f32(w, &x)
    }

    /// The claimed dense weight `name` (through the manifest's handle).
    fn dense(&self, name: &str) -> Option<&'a Weight> {
        let weight = self.model.weight(name)?;
        if weight.flags().expert_streamed {
            return self.ok(Err(Error::Forward(format!(
                "{name} is read in slices, never whole"
            ))));
        }
        Some(weight)
    }
}

impl Weights for SeamWeights<'_> {
    fn vector(&self, name: &str) -> Option<Arc<[f32]>> {
        let w = self.dense(name)?;
        self.ok(self.reader.vector(w)).or_else(|| {
            self.zeros_after_error(w.dims().iter().product())
                .map(Arc::from)
        })
    }

    fn matvec(&self, name: &str, x: &[f32], ubatch: Ubatch) -> Option<Vec<f32>> {
        let w = self.dense(name)?;
        self.ok(self.product(w, x, ubatch))
            .or_else(|| self.zeros_after_error(rows_of(w)))
    }

    fn expert_matvec(
        &self,
        layer: usize,
        kind: ExpertKind,
        expert: usize,
        x: &[f32],
        ubatch: Ubatch,
    ) -> Option<Vec<f32>> {
        let w = self.ok(self.model.expert(layer, kind, expert as u64))?;
        self.ok(self.product(w, x, ubatch))
            .or_else(|| self.zeros_after_error(rows_of(w)))
    }

    fn rows(&self, name: &str, first: usize, n: usize) -> Option<Arc<[f32]>> {
        let weight = self.model.weight(name)?;
        if weight.flags().expert_streamed {
            // A lazy table: rows gathered from the mapping, never staged.
            let mut out = Vec::new();
            for row in first..first + n {
                match self.ok(table_row(weight, row as u64)) {
                    Some(values) => out.extend(values),
                    None => {
                        return self
                            .zeros_after_error(row_len(weight) * n as u64)
                            .map(Arc::from);
                    }
                }
            }
            return Some(out.into());
        }
        self.ok(self.reader.rows(weight, first, n))
            .or_else(|| self.zeros_after_error(row_len(weight) * n as u64))
            .map(Arc::from)
    }

    fn dims(&self, name: &str) -> Option<Vec<u64>> {
        self.gguf.tensor(name).map(|t| t.dims.clone())
    }

    fn hparams(&self) -> &crate::hparams::Hparams {
        self.model.hparams()
    }
}

/// The rows of a matrix weight (GGUF's `ne1`): a matvec's output length.
fn rows_of(weight: &Weight) -> u64 {
    weight.dims().get(1).copied().unwrap_or(1)
}

/// The elements of one row (GGUF's `ne0`).
fn row_len(weight: &Weight) -> u64 {
    weight.dims().first().copied().unwrap_or(0)
}

/// Greedy decoding through the seam: feeds `prompt` as one ubatch (as the
/// binary and llama.cpp's batched prefill do), then `n` greedy tokens one
/// at a time; returns the generated tokens and the last position's logits.
///
/// # Errors
///
/// The model's hyperparameters or tensors do not fit the forward pass, or
/// the seam failed to hand out a weight.
pub fn greedy(
    weights: SeamWeights<'_>,
    numerics: family_kit::Numerics,
    prompt: &[u32],
    n: usize,
) -> Result<(Vec<u32>, Vec<f32>), Error> {
    let model = crate::forward::Model::new(weights).map_err(|e| Error::Forward(e.to_string()))?;
    if prompt.is_empty() {
        return Err(Error::Forward("the prompt is empty".into()));
    }
    if let Some(&t) = prompt.iter().find(|&&t| t as usize >= model.n_vocab()) {
        return Err(Error::Forward(format!(
            "token {t} is not below the vocabulary size {}",
            model.n_vocab()
        )));
    }
    family_kit::numerics::refuse_flash_attn("qwen4_exp", numerics)
        .map_err(|e| Error::Forward(e.to_string()))?;
    let mut state = crate::forward::State::new(&model, numerics);
    let check = |model: &crate::forward::Model<SeamWeights<'_>>| match model.weights().error() {
        Some(e) => Err(Error::Forward(e)),
        None => Ok(()),
    };
    let mut logits = model.prefill_last(&mut state, prompt);
    check(&model)?;
    let mut generated = Vec::with_capacity(n);
    for i in 0..n {
        // The same choice as `forward::Model::greedy` (first maximum).
        let next = family_ops::argmax(&logits) as u32;
        generated.push(next);
        if i + 1 < n {
            logits = model.step(&mut state, next, prompt.len() + i);
            check(&model)?;
        }
    }
    Ok((generated, logits))
}
