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
//! Every weight is asked of [`seam::resident_weight`] on every use; what the
//! kernel reads (the host view, or the device copy read back) is dequantized
//! once per weight.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use seam::platform::{Platform, Queue};
use seam::weight::Weight;
use seam::{Resident, resident_weight};

use crate::model::{Dflash, Error};

/// Runs a draft through the seam; holds the projected context.
pub struct DraftRunner<'a> {
    draft: &'a Dflash<'a>,
    platform: &'a dyn Platform,
    queue: &'a dyn Queue,
    /// Dequantized values per weight (keyed by the weight's address).
    cache: Mutex<HashMap<usize, Arc<[f32]>>>,
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

fn matvec(w: &[f32], x: &[f64]) -> Vec<f64> {
    w.chunks_exact(x.len())
        .map(|row| row.iter().zip(x).map(|(&a, &b)| f64::from(a) * b).sum())
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
            platform,
            queue,
            cache: Mutex::new(HashMap::new()),
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

    /// Asks the seam for `weight` (every call) and dequantizes what the
    /// kernel may read, once.
    fn values(&self, weight: &Weight) -> Result<Arc<[f32]>, Error> {
        let resident = resident_weight(weight, self.platform, self.queue)?;
        let key = std::ptr::from_ref(weight) as usize;
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(hit) = cache.get(&key) {
            return Ok(Arc::clone(hit));
        }
        let bytes: Vec<u8> = match resident {
            Resident::Host(view) => view.to_vec(),
            Resident::Device(copy) => {
                let mut out = vec![0u8; copy.buffer().len() as usize];
                self.platform
                    .backend()
                    .read_back(copy.buffer(), 0, &mut out)
                    .map_err(|e| Error::Dequantize {
                        name: weight.name().to_owned(),
                        why: e.to_string(),
                    })?;
                out
            }
        };
        let n: u64 = weight.dims().iter().product();
        let mut out = vec![0f32; n as usize];
        family_ops::dequantize(weight.ggml_type(), &bytes, &mut out).map_err(|e| {
            Error::Dequantize {
                name: weight.name().to_owned(),
                why: e.to_string(),
            }
        })?;
        let values: Arc<[f32]> = out.into();
        cache.insert(key, Arc::clone(&values));
        Ok(values)
    }

    fn own(&self, name: &str) -> Result<Arc<[f32]>, Error> {
        let w = self.draft.weight(name).ok_or_else(|| Error::Tensor {
            name: name.to_owned(),
            why: "missing".into(),
        })?;
        self.values(w)
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
        let h = matvec(&self.own("fc.weight")?, &x);
        let c = rms(&h, hp.eps, &self.own("enc.output_norm.weight")?);
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
        let table = self.values(self.draft.token_embd())?;
        let n_ctx = self.context.len();
        let mut xs: Vec<Vec<f64>> = (0..bs)
            .map(|j| {
                let t = if j == 0 { anchor } else { hp.mask_token } as usize;
                table[t * e..(t + 1) * e]
                    .iter()
                    .map(|&v| f64::from(v))
                    .collect()
            })
            .collect();
        let scale = 1.0 / (hd as f64).sqrt();
        for l in 0..hp.n_layer {
            let w = |s: &str| self.own(&format!("blk.{l}.{s}.weight"));
            let (wq, wk, wv, wo) = (w("attn_q")?, w("attn_k")?, w("attn_v")?, w("attn_output")?);
            let (qn, kn) = (w("attn_q_norm")?, w("attn_k_norm")?);
            let attn_norm = w("attn_norm")?;
            let kv = |h: &[f64], pos: usize| {
                let mut k = matvec(&wk, h);
                head_norm(&mut k, hd, hp.eps, &kn);
                rope(&mut k, hd, pos, hp.rope_base);
                (k, matvec(&wv, h))
            };
            // Context K/V (from the projected taps), then the block's.
            let mut keys = Vec::with_capacity(n_ctx + bs);
            let mut vals = Vec::with_capacity(n_ctx + bs);
            for (p, c) in self.context.iter().enumerate() {
                let (k, v) = kv(c, p);
                keys.push(k);
                vals.push(v);
            }
            let hs: Vec<Vec<f64>> = xs.iter().map(|x| rms(x, hp.eps, &attn_norm)).collect();
            for (j, h) in hs.iter().enumerate() {
                let (k, v) = kv(h, n_ctx + j);
                keys.push(k);
                vals.push(v);
            }
            for (j, h) in hs.iter().enumerate() {
                let mut q = matvec(&wq, h);
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
                for (x, o) in xs[j].iter_mut().zip(matvec(&wo, &out)) {
                    *x += o;
                }
            }
            let (ffn_norm, gate, up, down) =
                (w("ffn_norm")?, w("ffn_gate")?, w("ffn_up")?, w("ffn_down")?);
            for x in xs.iter_mut() {
                let h = rms(x, hp.eps, &ffn_norm);
                let act: Vec<f64> = matvec(&gate, &h)
                    .into_iter()
                    .zip(matvec(&up, &h))
                    .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                    .collect();
                for (xi, d) in x.iter_mut().zip(matvec(&down, &act)) {
                    *xi += d;
                }
            }
        }
        let out_norm = self.own("output_norm.weight")?;
        let head = self.values(self.draft.output_head())?;
        Ok(xs[1..]
            .iter()
            .map(|x| {
                let logits: Vec<f32> = matvec(&head, &rms(x, hp.eps, &out_norm))
                    .into_iter()
                    .map(|v| v as f32)
                    .collect();
                argmax(&logits) as u32
            })
            .collect())
    }
}
