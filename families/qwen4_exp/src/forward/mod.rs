//! The CPU forward pass of qwen4exp (docs/families/qwen4_exp.md, sections
//! 3-9), as llama.cpp's CPU backend runs the `qwen4exp` graph
//! (`src/models/qwen4exp.cpp`), bit for bit on the x86 build the oracle
//! uses.
//!
//! Activations are `f32`, and every op repeats ggml's arithmetic through
//! `family_ops::ggml_cpu`: the products round their activations to the
//! weight's `vec_dot_type` and sum in the kernel's order (`vec_dot`, the
//! repacked Q4_0/Q4_K/IQ4_NL kernels, llamafile's tinyBLAS for several
//! tokens); RMSNorm, the GDN conv, L2 norm and delta rule, the
//! hyper-connections' fused pre and post, IMROPE, the attention over the
//! cache as its type stores it, the softmax routing and the mix of the
//! experts, the PLE gate and dilated conv, each in ggml's order. A value
//! one ulp from ggml's can round the other way at a Q8_0/Q8_K/F16
//! conversion and move this model's logits by 1e-2
//! (docs/families/qwen4_exp.md, section 10), so nothing here is left to
//! another order.
//!
//! - [`Weights`]: how the pass reads weights and metadata: matrices are
//!   multiplied or gathered by rows, never handed out whole
//!   ([`crate::engine::SeamWeights`] reads them through the seam).
//! - [`Model`]: hyperparameters ([`Hyper`]) plus weights;
//!   [`Model::step`] runs one token at position `pos` and returns its
//!   logits, [`Model::prefill`] a prompt as one ubatch (llama.cpp's
//!   batched prefill: its products of several tokens sum in another
//!   order), [`Model::greedy`] decodes.
//! - [`State`]: what persists between steps: per GDN layer the conv window
//!   and the delta-rule state, per attention layer the K/V cache (rows
//!   stored as the cache type rounds them) and the QSA indexer's key
//!   cache, the PLE conv history and the tokens seen. Hyper-connections
//!   keep nothing between tokens.
//!
//! Modules per concept: `hyper` (the hyperparameters in its units), `hc`
//! (hyper-connections), `gdn`, `attention` (full attention with QSA),
//! `moe`, `ple`.

mod attention;
mod gdn;
mod hc;
mod hyper;
mod moe;
mod ple;

use std::sync::Arc;

use family_ops::ggml_cpu::Ubatch;

use crate::hparams::Hparams;
use crate::model::ExpertKind;

pub(crate) use attention::qsa_cells;
pub use hyper::{Hyper, PleHyper};
pub(crate) use ple::{gate as ple_gate, rows as ple_rows};

/// Why a model could not be built for the forward pass.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ForwardError {
    /// A metadata key is missing, of the wrong type or out of range.
    #[error("metadata {key}: {why}")]
    Metadata {
        /// The full key.
        key: String,
        /// What is wrong with it.
        why: String,
    },
    /// A tensor the pass needs is missing, or has the wrong element count.
    #[error("tensor {name}: {why}")]
    Tensor {
        /// The tensor's name.
        name: String,
        /// What is wrong with it.
        why: String,
    },
}

/// Where the forward pass gets its weights and metadata from.
///
/// [`crate::engine::SeamWeights`] backs it with `seam::resident_weight`:
/// each weight is asked of the seam on every use (the memo makes repeats
/// free). Matrices are only ever multiplied ([`Weights::matvec`],
/// [`Weights::expert_matvec`]) or gathered by rows ([`Weights::rows`]), so
/// an implementation reads quantized rows a chunk at a time and never holds
/// a matrix dequantized; only small tensors come whole
/// ([`Weights::vector`]).
pub trait Weights {
    /// The small tensor `name` (a norm gamma, a bias, a convolution kernel,
    /// a scale) whole as `f32` (GGUF element order: `ne0` fastest), or
    /// `None` if the file has no such tensor.
    fn vector(&self, name: &str) -> Option<Arc<[f32]>>;

    /// The matrix `name` (rows of `x.len()` elements) times `x`, as ggml's
    /// CPU `mul_mat` computes it for one token of `ubatch`
    /// (`family_ops::ggml_cpu::matvec`).
    fn matvec(&self, name: &str, x: &[f32], ubatch: Ubatch) -> Option<Vec<f32>>;

    /// Expert `expert`'s `kind` matrix of layer `layer` times `x` (for the
    /// merged gate-up stack, gate is the first half of the expert's rows
    /// and up the second), as ggml's `mul_mat_id` computes it for the
    /// tokens that picked the expert (`ubatch`: `Ubatch::expert`).
    fn expert_matvec(
        &self,
        layer: usize,
        kind: ExpertKind,
        expert: usize,
        x: &[f32],
        ubatch: Ubatch,
    ) -> Option<Vec<f32>>;

    /// Rows `first..first + n` of `name` (rows of `ne0` elements)
    /// dequantized: embedding lookups and table gathers.
    fn rows(&self, name: &str, first: usize, n: usize) -> Option<Arc<[f32]>>;

    /// The tensor's dims in GGUF order (`ne0` first).
    fn dims(&self, name: &str) -> Option<Vec<u64>>;

    /// Whether the tensor exists.
    fn has(&self, name: &str) -> bool {
        self.dims(name).is_some()
    }

    /// The model's hyperparameters.
    fn hparams(&self) -> &Hparams;
}

/// A qwen4exp model ready to run: hyperparameters and weights.
#[derive(Debug)]
pub struct Model<W> {
    w: W,
    hp: Hyper,
    n_vocab: usize,
    /// `output.weight`, or `token_embd.weight` when tied.
    output: &'static str,
}

/// Per-layer persistent state.
#[derive(Debug, Clone)]
enum LayerState {
    Gdn(gdn::GdnState),
    Attn(attention::AttnState),
}

/// Everything that persists between [`Model::step`]s of one sequence.
#[derive(Debug, Clone)]
pub struct State {
    /// Tokens fed so far (position = index).
    tokens: Vec<u32>,
    layers: Vec<LayerState>,
    ple: Option<ple::PleState>,
}

impl State {
    /// The QSA indexer's pooled block keys of layer `il` so far (what its
    /// selection scores), `None` for a layer without attention.
    pub fn qsa_pooled_keys(&self, il: usize) -> Option<&[Vec<f32>]> {
        match self.layers.get(il)? {
            LayerState::Attn(st) => Some(st.pooled_keys()),
            LayerState::Gdn(_) => None,
        }
    }

    /// An empty sequence: zero GDN/conv states, empty caches whose K and V
    /// are stored as `numerics` says (flash attention is not this pass's:
    /// [`Qwen4ExpDecoder`](crate::family::Qwen4ExpDecoder) refuses it).
    pub fn new<W: Weights>(model: &Model<W>, numerics: family_kit::Numerics) -> State {
        let hp = &model.hp;
        let layers = (0..hp.n_layer)
            .map(|il| {
                if hp.recurrent[il] {
                    LayerState::Gdn(gdn::GdnState::new(hp))
                } else {
                    LayerState::Attn(attention::AttnState::new([
                        numerics.cache_type_k,
                        numerics.cache_type_v,
                    ]))
                }
            })
            .collect();
        State {
            tokens: Vec::new(),
            layers,
            ple: hp.ple.as_ref().map(|p| ple::PleState::new(p, hp)),
        }
    }

    /// The number of tokens fed so far (the next position).
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether no token has been fed.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

impl<W: Weights> Model<W> {
    /// Reads the hyperparameters and checks that every tensor the pass
    /// needs exists with the element count the hyperparameters imply.
    ///
    /// # Errors
    ///
    /// A metadata key or a tensor is missing or inconsistent.
    pub fn new(weights: W) -> Result<Model<W>, ForwardError> {
        let hp = Hyper::from_hparams(weights.hparams());
        let emb = weights
            .dims("token_embd.weight")
            .ok_or_else(|| tensor_err("token_embd.weight", "missing"))?;
        if emb.len() != 2 || emb[0] != hp.n_embd as u64 {
            return Err(tensor_err("token_embd.weight", "dims are not {E, n_vocab}"));
        }
        let n_vocab = emb[1] as usize;
        let output = if weights.has("output.weight") {
            "output.weight"
        } else {
            "token_embd.weight"
        };
        let model = Model {
            w: weights,
            hp,
            n_vocab,
            output,
        };
        model.check()?;
        Ok(model)
    }

    /// The hyperparameters.
    pub fn hyper(&self) -> &Hyper {
        &self.hp
    }

    /// The vocabulary size (rows of the output matrix).
    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// The weights.
    pub fn weights(&self) -> &W {
        &self.w
    }

    /// Element counts of everything the pass reads.
    fn check(&self) -> Result<(), ForwardError> {
        let hp = &self.hp;
        let (e, hc) = (hp.n_embd, hp.hc);
        let need = |name: &str, n: Option<usize>| -> Result<(), ForwardError> {
            let dims = self
                .w
                .dims(name)
                .ok_or_else(|| tensor_err(name, "missing"))?;
            let got: u64 = dims.iter().product();
            match n {
                Some(n) if got != n as u64 => {
                    Err(tensor_err(name, format!("{got} elements, expected {n}")))
                }
                _ => Ok(()),
            }
        };
        need(self.output, Some(e * self.n_vocab))?;
        let hc_block = |pre: &str, inject: bool| -> Result<(), ForwardError> {
            need(&format!("{pre}_norm.weight"), Some(e * hc))?;
            need(&format!("{pre}_down.weight"), None)?;
            need(&format!("{pre}_up.weight"), None)?;
            if inject {
                need(&format!("{pre}_inject.weight"), Some(e * hc * hc))?;
            }
            Ok(())
        };
        hc_block("output_hc", false)?;
        for il in 0..hp.n_layer {
            let b = format!("blk.{il}.");
            hc_block(&format!("{b}hc_attn"), true)?;
            hc_block(&format!("{b}hc_ffn"), true)?;
            if hp.recurrent[il] {
                gdn::check(hp, &b, &need)?;
            } else {
                attention::check(hp, il, &b, &need)?;
            }
            moe::check(&self.w, hp, il, &b, &need)?;
            if hp.ple.as_ref().is_some_and(|p| p.layer == il) {
                ple::check(hp, &b, &need)?;
            }
        }
        Ok(())
    }

    /// A small weight that [`Model::new`] checked exists.
    fn w(&self, name: &str) -> Arc<[f32]> {
        self.w
            .vector(name)
            .unwrap_or_else(|| panic!("weight {name} could not be read"))
    }

    /// An optional small weight (`.scale` tensors).
    fn opt(&self, name: &str) -> Option<Arc<[f32]>> {
        if self.w.has(name) {
            self.w.vector(name)
        } else {
            None
        }
    }

    /// The matrix `name` (checked by [`Model::new`]) times `x`.
    fn mv(&self, name: &str, x: &[f32], ub: Ubatch) -> Vec<f32> {
        self.w
            .matvec(name, x, ub)
            .unwrap_or_else(|| panic!("weight {name} could not be read"))
    }

    /// One expert's `kind` matrix of layer `il` times `x`.
    fn expert_mv(&self, il: usize, kind: ExpertKind, e: usize, x: &[f32], ub: Ubatch) -> Vec<f32> {
        self.w
            .expert_matvec(il, kind, e, x, ub)
            .unwrap_or_else(|| panic!("layer {il} expert {e} {kind:?} could not be read"))
    }

    /// The scalar `.scale` of matrix `base` (without `.weight`), if any.
    fn scale(&self, base: &str) -> Option<f32> {
        self.opt(&format!("{base}.scale"))
            .and_then(|s| s.first().copied())
    }

    /// `weight(base) · x`, times `base.scale` if the file has it
    /// (`build_lora_mm` with its scale: a `ggml_mul` after the product).
    fn mm_scaled(&self, base: &str, x: &[f32], ub: Ubatch) -> Vec<f32> {
        let mut y = self.mv(&format!("{base}.weight"), x, ub);
        if let Some(s) = self.scale(base) {
            y.iter_mut().for_each(|v| *v *= s);
        }
        y
    }

    /// Runs token `token` at position `pos` (which must be `state.len()`:
    /// tokens go in order) as a ubatch of its own and returns its logits.
    ///
    /// # Panics
    ///
    /// `pos` is not the next position, or `token` is not in the vocabulary.
    pub fn step(&self, state: &mut State, token: u32, pos: usize) -> Vec<f32> {
        self.step_taps(state, token, pos, &[]).0
    }

    /// Feeds `tokens` as one ubatch, as llama.cpp's batched prefill does:
    /// layer after layer over every token (each token's products take
    /// ggml's several-token kernels, an expert's those of the tokens that
    /// picked it; the attention sees the cache up to its own position);
    /// returns every position's logits. One token is [`Model::step`].
    ///
    /// # Panics
    ///
    /// A token is not in the vocabulary.
    pub fn prefill(&self, state: &mut State, tokens: &[u32]) -> Vec<Vec<f32>> {
        self.ubatch(state, tokens, &[], Outputs::Every).0
    }

    /// [`Model::prefill`] with only the last position's logits asked for,
    /// as llama.cpp's graph computes them then (`inp_out_ids`): the last
    /// layer's rows after its attention are the last token's alone, so its
    /// products past that point are one token's. Returns those logits.
    ///
    /// # Panics
    ///
    /// As [`Model::prefill`].
    pub fn prefill_last(&self, state: &mut State, tokens: &[u32]) -> Vec<f32> {
        let (mut logits, _) = self.ubatch(state, tokens, &[], Outputs::Last);
        logits.pop().unwrap_or_default()
    }

    /// [`Model::step`], also returning the hidden state after each layer of
    /// `taps` (in `taps` order): the mean of the `hc` residual streams
    /// after that layer, `n_embd` values (summed in `f64`). A drafter
    /// (dflash) reads the target's hidden states here.
    ///
    /// # Panics
    ///
    /// As [`Model::step`], or a tap layer is not below `n_layer`.
    pub fn step_taps(
        &self,
        state: &mut State,
        token: u32,
        pos: usize,
        taps: &[usize],
    ) -> (Vec<f32>, Vec<Vec<f32>>) {
        assert_eq!(pos, state.tokens.len(), "positions must be consecutive");
        let (mut logits, tapped) = self.ubatch(state, &[token], taps, Outputs::Every);
        (logits.pop().expect("one token's logits"), tapped)
    }

    /// One ubatch through `qwen4exp.cpp`'s graph, layer after layer: the
    /// logits of every position or of the last (`outputs`), and the last
    /// token's taps.
    fn ubatch(
        &self,
        state: &mut State,
        tokens: &[u32],
        taps: &[usize],
        outputs: Outputs,
    ) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
        assert!(
            taps.iter().all(|&l| l < self.hp.n_layer),
            "tap layer out of range"
        );
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= self.n_vocab) {
            panic!("token {t} out of vocabulary");
        }
        let n = tokens.len();
        let pos0 = state.tokens.len();
        state.tokens.extend_from_slice(tokens);
        let hp = &self.hp;
        let e = hp.n_embd;
        let ub = |t: usize| Ubatch::of(t, n);
        // Per token, hc streams of E, stream-major (hc copies of the
        // embedding).
        let mut rs: Vec<Vec<f32>> = tokens
            .iter()
            .map(|&t| {
                let emb = self
                    .w
                    .rows("token_embd.weight", t as usize, 1)
                    .expect("token_embd.weight row");
                (0..hp.hc).flat_map(|_| emb.iter().copied()).collect()
            })
            .collect();
        let mut tapped = vec![Vec::new(); taps.len()];
        for il in 0..hp.n_layer {
            let b = format!("blk.{il}.");
            if let (Some(p), Some(ps)) = (&hp.ple, state.ple.as_mut())
                && p.layer == il
            {
                for (t, r) in rs.iter_mut().enumerate() {
                    self.ple(&b, p, ps, &state.tokens[..=pos0 + t], r, ub(t));
                }
            }
            for (t, r) in rs.iter_mut().enumerate() {
                let (x, inj) = self.hc_mix(r, &format!("{b}hc_attn"), ub(t));
                let y = match &mut state.layers[il] {
                    LayerState::Gdn(s) => self.gdn(&b, s, &x, ub(t)),
                    LayerState::Attn(s) => self.attention(il, &b, s, &x, pos0 + t, ub(t)),
                };
                self.hc_combine(r, &y, &inj.expect("hc_attn_inject"));
            }
            if outputs == Outputs::Last && il + 1 == hp.n_layer {
                // The rows that give no logits end here (llama.cpp's
                // `inp_out_ids`): the rest of the graph is per token.
                rs.drain(..n - 1);
            }
            let m = rs.len();
            let ub = |t: usize| Ubatch::of(t, m);
            // The router first for every token: an expert's product takes
            // the kernel of the tokens that picked it.
            let mixed: Vec<_> = rs
                .iter()
                .enumerate()
                .map(|(t, r)| self.hc_mix(r, &format!("{b}hc_ffn"), ub(t)))
                .collect();
            let picks: Vec<_> = mixed
                .iter()
                .enumerate()
                .map(|(t, (x, _))| self.route(il, &b, x, ub(t)))
                .collect();
            let mut counts = std::collections::HashMap::new();
            for &(ex, _) in picks.iter().flatten() {
                *counts.entry(ex).or_insert(0usize) += 1;
            }
            for (t, (r, (x, inj))) in rs.iter_mut().zip(mixed).enumerate() {
                let y = self.moe(il, &b, &x, &picks[t], &counts, ub(t));
                self.hc_combine(r, &y, &inj.expect("hc_ffn_inject"));
            }
            let last = &rs[m - 1];
            for (slot, _) in taps.iter().enumerate().filter(|&(_, &l)| l == il) {
                tapped[slot] = (0..e)
                    .map(|i| {
                        let sum: f64 = (0..hp.hc).map(|s| f64::from(last[s * e + i])).sum();
                        (sum / hp.hc as f64) as f32
                    })
                    .collect();
            }
        }
        let m = rs.len();
        let ub = |t: usize| Ubatch::of(t, m);
        let logits = rs
            .iter()
            .enumerate()
            .map(|(t, r)| {
                let (h, _) = self.hc_mix(r, "output_hc", ub(t));
                debug_assert_eq!(h.len(), e);
                self.mv(self.output, &h, ub(t))
            })
            .collect();
        (logits, tapped)
    }

    /// Greedy decoding from a fresh state of `numerics`: feeds `prompt`
    /// one token at a time, then picks the argmax (first on ties) `n`
    /// times, feeding each pick but the last.
    pub fn greedy(&self, prompt: &[u32], n: usize, numerics: family_kit::Numerics) -> Vec<u32> {
        let mut state = State::new(self, numerics);
        let mut logits = Vec::new();
        for (pos, &t) in prompt.iter().enumerate() {
            logits = self.step(&mut state, t, pos);
        }
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            if logits.is_empty() {
                break;
            }
            let t = family_ops::argmax(&logits) as u32;
            out.push(t);
            if i + 1 < n {
                let pos = state.len();
                logits = self.step(&mut state, t, pos);
            }
        }
        out
    }
}

fn tensor_err(name: &str, why: impl Into<String>) -> ForwardError {
    ForwardError::Tensor {
        name: name.to_owned(),
        why: why.into(),
    }
}

/// Which positions of a ubatch give logits (llama.cpp's `inp_out_ids`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outputs {
    /// Every position's (the goldens' batched runs).
    Every,
    /// The last position's (a prefill before greedy steps).
    Last,
}

/// The element-count check a block's `check` gets: `need(name, Some(n))`
/// requires `n` elements, `need(name, None)` only presence.
type Need<'a> = dyn Fn(&str, Option<usize>) -> Result<(), ForwardError> + 'a;
