//! The draft forward pass (families.md, dflash), on the CPU in `f64`.
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

use std::sync::Arc;

use family_kit::WeightReader;
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
    context: Vec<Vec<f64>>,
}

fn rms(x: &[f64], eps: f64, gamma: &[f32]) -> Vec<f64> {
    let mean = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (mean + eps).sqrt();
    x.iter()
        .zip(gamma)
        .map(|(&v, &g)| v * inv * f64::from(g))
        .collect()
}

/// NEOX RoPE over whole heads: pairs `(i, i + head_dim/2)`.
fn rope(x: &mut [f64], head_dim: usize, pos: usize, base: f64) {
    let half = head_dim / 2;
    for head in x.chunks_exact_mut(head_dim) {
        for i in 0..half {
            let theta = pos as f64 * base.powf(-2.0 * i as f64 / head_dim as f64);
            let (s, c) = theta.sin_cos();
            let (x0, x1) = (head[i], head[i + half]);
            head[i] = x0 * c - x1 * s;
            head[i + half] = x0 * s + x1 * c;
        }
    }
}

/// Per-head RMSNorm (q/k norms).
fn head_norm(x: &mut [f64], head_dim: usize, eps: f64, gamma: &[f32]) {
    for head in x.chunks_exact_mut(head_dim) {
        let normed = rms(head, eps, gamma);
        head.copy_from_slice(&normed);
    }
}

/// The index of the first largest element.
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

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

    /// `W · x` for the draft's matrix `name`, by quantized rows.
    fn mv(&self, name: &str, x: &[f64]) -> Result<Vec<f64>, Error> {
        Ok(self.reader.matvec_all(self.own(name)?, x)?)
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
        let x: Vec<f64> = taps.iter().map(|&v| f64::from(v)).collect();
        let h = self.mv("fc.weight", &x)?;
        let c = rms(&h, hp.eps, &self.vector("enc.output_norm.weight")?);
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
        let hp = self.draft.hparams();
        let (e, hd, bs) = (hp.n_embd, hp.head_dim, hp.block_size);
        let (nh, nkv) = (hp.n_head, hp.n_head_kv);
        let n_vocab = self.draft.token_embd().dims()[1] as usize;
        if anchor as usize >= n_vocab {
            return Err(Error::Mismatch(format!(
                "anchor {anchor} is not below the vocabulary {n_vocab}"
            )));
        }
        let table = self.draft.token_embd();
        let n_ctx = self.context.len();
        let mut xs: Vec<Vec<f64>> = Vec::with_capacity(bs);
        for j in 0..bs {
            let t = if j == 0 { anchor } else { hp.mask_token } as usize;
            let row = self.reader.rows(table, t, 1)?;
            debug_assert_eq!(row.len(), e);
            xs.push(row.iter().map(|&v| f64::from(v)).collect());
        }
        let mv = |w: &'a Weight, x: &[f64]| -> Result<Vec<f64>, Error> {
            Ok(self.reader.matvec_all(w, x)?)
        };
        let scale = 1.0 / (hd as f64).sqrt();
        for l in 0..hp.n_layer {
            let w = |s: &str| self.own(&format!("blk.{l}.{s}.weight"));
            let (wq, wk, wv, wo) = (w("attn_q")?, w("attn_k")?, w("attn_v")?, w("attn_output")?);
            let v = |s: &str| self.vector(&format!("blk.{l}.{s}.weight"));
            let (qn, kn) = (v("attn_q_norm")?, v("attn_k_norm")?);
            let attn_norm = v("attn_norm")?;
            let kv = |h: &[f64], pos: usize| -> Result<(Vec<f64>, Vec<f64>), Error> {
                let mut k = mv(wk, h)?;
                head_norm(&mut k, hd, hp.eps, &kn);
                rope(&mut k, hd, pos, hp.rope_base);
                Ok((k, mv(wv, h)?))
            };
            // Context K/V (from the projected taps), then the block's.
            let mut keys = Vec::with_capacity(n_ctx + bs);
            let mut vals = Vec::with_capacity(n_ctx + bs);
            for (p, c) in self.context.iter().enumerate() {
                let (k, v) = kv(c, p)?;
                keys.push(k);
                vals.push(v);
            }
            let hs: Vec<Vec<f64>> = xs.iter().map(|x| rms(x, hp.eps, &attn_norm)).collect();
            for (j, h) in hs.iter().enumerate() {
                let (k, v) = kv(h, n_ctx + j)?;
                keys.push(k);
                vals.push(v);
            }
            for (j, h) in hs.iter().enumerate() {
                let mut q = mv(wq, h)?;
                head_norm(&mut q, hd, hp.eps, &qn);
                rope(&mut q, hd, n_ctx + j, hp.rope_base);
                let mut out = vec![0.0; nh * hd];
                for head in 0..nh {
                    let g = head / (nh / nkv);
                    let qh = &q[head * hd..(head + 1) * hd];
                    // Non-causal: every context and block position.
                    let mut s: Vec<f64> = keys
                        .iter()
                        .map(|k| {
                            let kh = &k[g * hd..(g + 1) * hd];
                            qh.iter().zip(kh).map(|(a, b)| a * b).sum::<f64>() * scale
                        })
                        .collect();
                    let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let mut sum = 0.0;
                    for v in s.iter_mut() {
                        *v = (*v - max).exp();
                        sum += *v;
                    }
                    for (p, &a) in s.iter().enumerate() {
                        let vh = &vals[p][g * hd..(g + 1) * hd];
                        for (o, &v) in out[head * hd..(head + 1) * hd].iter_mut().zip(vh) {
                            *o += a / sum * v;
                        }
                    }
                }
                for (x, o) in xs[j].iter_mut().zip(mv(wo, &out)?) {
                    *x += o;
                }
            }
            let (ffn_norm, gate, up, down) =
                (v("ffn_norm")?, w("ffn_gate")?, w("ffn_up")?, w("ffn_down")?);
            for x in xs.iter_mut() {
                let h = rms(x, hp.eps, &ffn_norm);
                let act: Vec<f64> = mv(gate, &h)?
                    .into_iter()
                    .zip(mv(up, &h)?)
                    .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                    .collect();
                for (xi, d) in x.iter_mut().zip(mv(down, &act)?) {
                    *xi += d;
                }
            }
        }
        let out_norm = self.vector("output_norm.weight")?;
        let head = self.draft.output_head();
        let mut drafts = Vec::with_capacity(bs - 1);
        for x in &xs[1..] {
            let logits: Vec<f32> = mv(head, &rms(x, hp.eps, &out_norm))?
                .into_iter()
                .map(|v| v as f32)
                .collect();
            drafts.push(argmax(&logits) as u32);
        }
        Ok(drafts)
    }
}
