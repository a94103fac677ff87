//! The draft forward pass (families.md, dflash), on the CPU in `f32`
//! with `family-ops` (RMSNorm, NEOX RoPE; the products and the attention
//! as the device op layer's CPU reference computes them, ggml's CPU
//! arithmetic through `family_ops::ggml_cpu`, so the device draft stays
//! equal to this one; the draft has no llama.cpp counterpart to match).
//!
//! The target's hidden states at the tap layers (concatenated) go through
//! `fc` and `enc.output_norm` once per committed position ([`DraftRunner::push_context`]);
//! every draft layer projects them to its context K/V. The block
//! `[anchor] + [mask] x (block_size - 1)` is embedded with the target's
//! table; Qwen3-style layers (RMSNorm, q/k/v/o with q/k norms, NEOX RoPE,
//! SwiGLU) attend over the context and the whole block (non-causal inside
//! the block); `output_norm` and the target's output head give the logits,
//! and positions `1..` are the drafts.
//!
//! Every weight is asked of [`seam::resident_weight`] on every use, through
//! the kit's [`WeightReader`]: matrices (the target's output head included)
//! are read by quantized rows, the embedding by row gathers, and only the
//! norms are kept dequantized.

use family_ops::ggml_cpu::Ubatch;
use std::sync::Arc;

use family_kit::WeightReader;
use family_ops::{AttentionShape, NormWeight, Rope, RopeMode};
use seam::platform::{Platform, Queue};
use seam::weight::Weight;

use crate::model::{Dflash, Error};

/// Runs a draft through the seam; holds the projected context.
pub struct DraftRunner<'a> {
    draft: &'a Dflash<'a>,
    /// Reads every weight through the seam: matrices by quantized rows,
    /// small tensors kept dequantized (keyed by the weight).
    reader: WeightReader<'a>,
    /// `enc.output_norm(fc · taps)` per committed position.
    context: Vec<Vec<f32>>,
}

fn ops(e: family_ops::OpsError) -> Error {
    Error::Mismatch(e.to_string())
}

/// `x / rms(x) · gamma`.
fn rms(x: &[f32], eps: f32, gamma: &[f32]) -> Result<Vec<f32>, Error> {
    let mut out = vec![0f32; x.len()];
    family_ops::rms_norm(x, eps, NormWeight::Scale(gamma), &mut out).map_err(ops)?;
    Ok(out)
}

/// Per-head RMSNorm (q/k norms).
fn head_norm(x: &mut [f32], head_dim: usize, eps: f32, gamma: &[f32]) -> Result<(), Error> {
    for head in x.chunks_exact_mut(head_dim) {
        family_ops::rms_norm_in_place(head, eps, NormWeight::Scale(gamma)).map_err(ops)?;
    }
    Ok(())
}

pub use family_ops::argmax;

impl<'a> DraftRunner<'a> {
    /// A runner of `draft` on `platform`, with no context yet.
    pub fn new(
        draft: &'a Dflash<'a>,
        platform: &'a dyn Platform,
        queue: &'a dyn Queue,
    ) -> DraftRunner<'a> {
        DraftRunner {
            draft,
            reader: WeightReader::new(platform, queue),
            context: Vec::new(),
        }
    }

    /// The draft.
    pub fn draft(&self) -> &Dflash<'a> {
        self.draft
    }

    /// Committed positions whose context the runner holds.
    pub fn context_len(&self) -> usize {
        self.context.len()
    }

    fn own(&self, name: &str) -> Result<&'a Weight, Error> {
        self.draft.weight(name).ok_or_else(|| Error::Tensor {
            name: name.to_owned(),
            why: "missing".into(),
        })
    }

    /// A small weight (a norm) dequantized.
    fn vector(&self, name: &str) -> Result<Arc<[f32]>, Error> {
        Ok(self.reader.vector(self.own(name)?)?)
    }

    /// `W · x` for one token (`mv_at` with `Ubatch::One`).
    fn mv(&self, w: &'a Weight, x: &[f32]) -> Result<Vec<f32>, Error> {
        self.mv_at(w, x, Ubatch::One)
    }

    /// `W · x`, by quantized rows, as ggml's CPU `mul_mat` computes it for
    /// a token at `ub` of its ubatch (`family_ops::ggml_cpu::matvec`, as
    /// the target's host pass and the device's `matmul` compute it: a
    /// block's rows are one ubatch); a type it does not reproduce: `x`
    /// rounded as ggml rounds it, dotted in `f64`.
    fn mv_at(&self, w: &'a Weight, x: &[f32], ub: Ubatch) -> Result<Vec<f32>, Error> {
        if family_ops::ggml_cpu::is_emulated(w.ggml_type()) {
            return Ok(self.reader.matvec_ggml(w, x, ub)?);
        }
        let xq = family_ops::as_ggml_multiplies(w.ggml_type(), x).map_err(ops)?;
        Ok(self.reader.matvec_f32(w, &xq)?)
    }

    /// Adds one committed position: `taps` is the target's hidden states at
    /// the tap layers, concatenated in `target_layers` order.
    ///
    /// # Errors
    ///
    /// `taps` has the wrong width, or the seam failed.
    pub fn push_context(&mut self, taps: &[f32]) -> Result<(), Error> {
        let hp = self.draft.hparams();
        let width = hp.target_layers.len() * self.draft.target_n_embd();
        if taps.len() != width {
            return Err(Error::Mismatch(format!(
                "{} tap values, fc takes {width}",
                taps.len()
            )));
        }
        let h = self.mv(self.own("fc.weight")?, taps)?;
        let c = rms(&h, hp.eps as f32, &self.vector("enc.output_norm.weight")?)?;
        self.context.push(c);
        Ok(())
    }

    /// Drafts `block_size - 1` tokens after `anchor`, which sits at the
    /// position after the context.
    ///
    /// # Errors
    ///
    /// The anchor is out of the vocabulary, or the seam failed.
    pub fn propose(&self, anchor: u32) -> Result<Vec<u32>, Error> {
        Ok(self
            .block_logits(anchor)?
            .iter()
            .map(|l| argmax(l) as u32)
            .collect())
    }

    /// The logits of the block's positions `1..block_size` after `anchor`
    /// (what [`DraftRunner::propose`] takes the argmax of).
    ///
    /// # Errors
    ///
    /// As [`DraftRunner::propose`].
    pub fn block_logits(&self, anchor: u32) -> Result<Vec<Vec<f32>>, Error> {
        let hp = self.draft.hparams();
        let (e, hd, bs) = (hp.n_embd, hp.head_dim, hp.block_size);
        let eps = hp.eps as f32;
        let n_vocab = self.draft.token_embd().dims()[1] as usize;
        if anchor as usize >= n_vocab {
            return Err(Error::Mismatch(format!(
                "anchor {anchor} is not below the vocabulary {n_vocab}"
            )));
        }
        let rope = Rope {
            n_rot: hd,
            freq_base: hp.rope_base as f32,
            mode: RopeMode::Neox,
        };
        let shape = AttentionShape {
            n_head: hp.n_head,
            n_head_kv: hp.n_head_kv,
            head_dim_k: hd,
            head_dim_v: hd,
        };
        let table = self.draft.token_embd();
        let n_ctx = self.context.len();
        let mut xs: Vec<Vec<f32>> = Vec::with_capacity(bs);
        for j in 0..bs {
            let t = if j == 0 { anchor } else { hp.mask_token } as usize;
            let row = self.reader.rows(table, t, 1)?;
            debug_assert_eq!(row.len(), e);
            xs.push(row);
        }
        let scale = 1.0 / (hd as f32).sqrt();
        // The block's positions are one ubatch (llama.cpp's dflash graph
        // runs them together): its products take ggml's several-token sums.
        let ub = |j: usize| Ubatch::of(j, bs);
        for l in 0..hp.n_layer {
            let w = |s: &str| self.own(&format!("blk.{l}.{s}.weight"));
            let v = |s: &str| self.vector(&format!("blk.{l}.{s}.weight"));
            let (wq, wk, wv, wo) = (w("attn_q")?, w("attn_k")?, w("attn_v")?, w("attn_output")?);
            let (qn, kn) = (v("attn_q_norm")?, v("attn_k_norm")?);
            let attn_norm = v("attn_norm")?;
            // Context K/V (from the projected taps), then the block's: one
            // cache slot after another.
            let (mut keys, mut vals) = (Vec::new(), Vec::new());
            let mut kv = |h: &[f32], pos: usize, at: Ubatch| -> Result<(), Error> {
                let mut k = self.mv_at(wk, h, at)?;
                head_norm(&mut k, hd, eps, &kn)?;
                family_ops::rope(&mut k, hd, pos, &rope).map_err(ops)?;
                keys.extend(k);
                vals.extend(self.mv_at(wv, h, at)?);
                Ok(())
            };
            // A context position's K/V were made when it came (one token).
            for (p, c) in self.context.iter().enumerate() {
                kv(c, p, Ubatch::One)?;
            }
            let hs = xs
                .iter()
                .map(|x| rms(x, eps, &attn_norm))
                .collect::<Result<Vec<_>, _>>()?;
            for (j, h) in hs.iter().enumerate() {
                kv(h, n_ctx + j, ub(j))?;
            }
            for (j, h) in hs.iter().enumerate() {
                let mut q = self.mv_at(wq, h, ub(j))?;
                head_norm(&mut q, hd, eps, &qn)?;
                family_ops::rope(&mut q, hd, n_ctx + j, &rope).map_err(ops)?;
                let mut out = vec![0f32; hp.n_head * hd];
                // Non-causal: every context and block position, over an
                // F32 cache as ggml computes it (the device's `attention`).
                let cells = family_ops::ggml_cpu::KvCells {
                    k: &keys,
                    k_stride: hp.n_head_kv * hd,
                    v: &vals,
                    v_stride: hp.n_head_kv * hd,
                    first_cell: 0,
                    mask: None,
                    k_type: family_ops::CacheType::F32,
                    v_type: family_ops::CacheType::F32,
                };
                family_ops::ggml_cpu::attention_cached(&q, &cells, &shape, scale, ub(j), &mut out)
                    .map_err(ops)?;
                for (x, o) in xs[j].iter_mut().zip(self.mv_at(wo, &out, ub(j))?) {
                    *x += o;
                }
            }
            let (ffn_norm, gate, up, down) =
                (v("ffn_norm")?, w("ffn_gate")?, w("ffn_up")?, w("ffn_down")?);
            for (j, x) in xs.iter_mut().enumerate() {
                let h = rms(x, eps, &ffn_norm)?;
                // ggml's SwiGLU (`silu(g) · u`, its rounding), as the
                // device's `swiglu` computes it.
                let g = self.mv_at(gate, &h, ub(j))?;
                let mut act = vec![0f32; g.len()];
                family_ops::ggml_cpu::swiglu(&g, &self.mv_at(up, &h, ub(j))?, &mut act)
                    .map_err(ops)?;
                for (xi, d) in x.iter_mut().zip(self.mv_at(down, &act, ub(j))?) {
                    *xi += d;
                }
            }
        }
        let out_norm = self.vector("output_norm.weight")?;
        let head = self.draft.output_head();
        let mut logits = Vec::with_capacity(bs - 1);
        // The head over the block's rows (the anchor's dropped after).
        for (j, x) in xs.iter().enumerate().skip(1) {
            logits.push(self.mv_at(head, &rms(x, eps, &out_norm)?, ub(j))?);
        }
        Ok(logits)
    }
}
