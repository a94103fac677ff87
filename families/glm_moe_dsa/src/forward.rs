//! The CPU forward pass, one token at a time, as
//! docs/families/glm_moe_dsa.md (sections 3-7) states it and
//! tools/oracle/glmdsa_ref.py computes it (activations in `f64`, rounded as
//! ggml rounds them for each weight's type before a product). Every weight
//! is asked of `seam::resident_weight` on every use through the kit's
//! [`WeightReader`] (matrices read by rows, only small vectors kept
//! dequantized); a routed expert is its sub-span weight, staged when the
//! router picks it. The caches are the MLA latent with its rope key and the
//! indexer keys of full layers.

use family_kit::{Handle, LoadError, Numerics, WeightReader};
use family_ops::{Gating, Rope, RopeMode, Routing, as_ggml_multiplies_f64, libstdcxx_top_k};
use seam::weight::Weight;

use crate::model::{AttnHandles, EXPERT_ROLES, Ffn, GlmMoeDsa, IndexerHandles, Swiglu};

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn silu(x: f64) -> f64 {
    x * sigmoid(x)
}

fn softmax(x: &mut [f64]) {
    let m = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - m).exp();
        sum += *v;
    }
    x.iter_mut().for_each(|v| *v /= sum);
}

/// `rms(x) * w`, raw gamma: `x / sqrt(mean(x²) + eps) * w`.
fn rms_w(x: &[f64], eps: f32, w: &[f32]) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let s = 1.0 / (ms + f64::from(eps)).sqrt();
    x.iter()
        .zip(w)
        .map(|(v, &w)| v * s * f64::from(w))
        .collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// One full layer's indexer key and the MLA cache of every layer.
#[derive(Debug, Default)]
struct Cache {
    /// The normed latent `c` of every position.
    latent: Vec<Vec<f64>>,
    /// The roped shared key of every position.
    k_pe: Vec<Vec<f64>>,
    /// Indexer keys per position (full layers only).
    idx_k: Vec<Vec<f64>>,
}

/// A sequence being decoded: its caches and position.
pub struct State<'m> {
    model: &'m GlmMoeDsa,
    reader: WeightReader<'m>,
    caches: Vec<Cache>,
    pos: usize,
    /// The caches' element types: the latent and the rope key are
    /// llama.cpp's K cache.
    numerics: Numerics,
}

impl std::fmt::Debug for State<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State").field("pos", &self.pos).finish()
    }
}

impl<'m> State<'m> {
    /// An empty sequence of `model` whose weights are read by `reader`,
    /// its caches as `numerics` says.
    ///
    /// # Errors
    ///
    /// `numerics` asks for flash attention, which this pass does not do.
    pub fn new(
        model: &'m GlmMoeDsa,
        reader: WeightReader<'m>,
        numerics: Numerics,
    ) -> Result<State<'m>, LoadError> {
        family_kit::numerics::refuse_flash_attn("glm_moe_dsa", numerics)?;
        let caches = (0..model.hparams().n_layer)
            .map(|_| Cache::default())
            .collect();
        Ok(State {
            model,
            reader,
            caches,
            pos: 0,
            numerics,
        })
    }

    /// The reader.
    pub fn reader(&self) -> &WeightReader<'m> {
        &self.reader
    }

    fn w(&self, h: Handle) -> &'m Weight {
        self.model.get(h)
    }

    fn vec(&self, h: Handle) -> Result<std::sync::Arc<[f32]>, LoadError> {
        self.reader.vector(self.w(h))
    }

    /// Rows `first..first + n` of `w` times `x`, `x` rounded as ggml does.
    fn mv_rows(
        &self,
        w: &'m Weight,
        first: usize,
        n: usize,
        x: &[f64],
    ) -> Result<Vec<f64>, LoadError> {
        self.reader
            .matvec(w, first, n, &as_ggml_multiplies_f64(w.ggml_type(), x))
    }

    fn mv(&self, h: Handle, x: &[f64]) -> Result<Vec<f64>, LoadError> {
        let w = self.w(h);
        self.reader
            .matvec_all(w, &as_ggml_multiplies_f64(w.ggml_type(), x))
    }

    /// `mv` times the first value of an optional `.scale` tensor.
    fn mv_scaled(
        &self,
        h: Handle,
        scale: Option<Handle>,
        x: &[f64],
    ) -> Result<Vec<f64>, LoadError> {
        let mut y = self.mv(h, x)?;
        if let Some(s) = scale {
            let s = f64::from(self.vec(s)?[0]);
            y.iter_mut().for_each(|v| *v *= s);
        }
        Ok(y)
    }

    /// ROPE_NORM (interleaved pairs) of the leading `n_rot` dims of each
    /// `head`-wide head of `x`, at the current position.
    fn rope(&self, x: &[f64], head: usize) -> Result<Vec<f64>, LoadError> {
        let hp = self.model.hparams();
        let mut v: Vec<f32> = x.iter().map(|&v| v as f32).collect();
        let rope = Rope {
            n_rot: hp.n_rot,
            freq_base: hp.freq_base,
            mode: RopeMode::Normal,
        };
        family_ops::rope(&mut v, head, self.pos, &rope)
            .map_err(|e| LoadError::Forward(format!("rope: {e}")))?;
        Ok(v.into_iter().map(f64::from).collect())
    }

    /// Feeds `token` at the next position; returns its logits.
    ///
    /// # Errors
    ///
    /// The token is out of the vocabulary, or a weight could not be read.
    pub fn step(&mut self, token: u32) -> Result<Vec<f32>, LoadError> {
        let model = self.model;
        let hp = model.hparams();
        let h = model.handles();
        if token as usize >= model.n_vocab() {
            return Err(LoadError::Forward(format!(
                "token {token} is outside the vocabulary of {}",
                model.n_vocab()
            )));
        }
        let mut x: Vec<f64> = self
            .reader
            .rows(self.w(h.token_embd), token as usize, 1)?
            .into_iter()
            .map(f64::from)
            .collect();
        let mut prev_sel: Option<Vec<usize>> = None;
        for (il, layer) in h.layers.iter().enumerate() {
            let a_in = rms_w(&x, hp.eps, &self.vec(layer.attn_norm)?);
            let a = self.attention(il, &layer.attn, &a_in, &mut prev_sel)?;
            x.iter_mut().zip(&a).for_each(|(x, a)| *x += a);
            let f_in = rms_w(&x, hp.eps, &self.vec(layer.ffn_norm)?);
            let f = self.ffn(il, &layer.ffn, &f_in)?;
            x.iter_mut().zip(&f).for_each(|(x, f)| *x += f);
        }
        let out = rms_w(&x, hp.eps, &self.vec(h.output_norm)?);
        let logits = self.mv(h.output, &out)?;
        self.pos += 1;
        Ok(logits.into_iter().map(|v| v as f32).collect())
    }

    /// The cells position `self.pos` attends (ascending), from a full
    /// layer's indexer (section 5).
    fn select(
        &mut self,
        il: usize,
        ix: &IndexerHandles,
        x: &[f64],
        qr: &[f64],
    ) -> Result<Vec<usize>, LoadError> {
        let hp = self.model.hparams();
        let (ih, idim, p) = (hp.idx_heads, hp.idx_dim, self.pos);
        let k = self.mv(ix.k, x)?;
        let mean = k.iter().sum::<f64>() / idim as f64;
        let var = k.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / idim as f64;
        // LayerNorm with eps 0: glm-dsa never sets f_norm_eps (section 5).
        let inv = 1.0 / var.sqrt();
        let gamma = ix.k_norm.map(|g| self.vec(g)).transpose()?;
        let beta = ix.k_norm_b.map(|b| self.vec(b)).transpose()?;
        let k: Vec<f64> = (0..idim)
            .map(|d| {
                let g = gamma.as_ref().map_or(1.0, |g| f64::from(g[d]));
                let b = beta.as_ref().map_or(0.0, |b| f64::from(b[d]));
                (k[d] - mean) * inv * g + b
            })
            .collect();
        let k = self.rope(&k, idim)?;
        self.caches[il].idx_k.push(k);
        // Read even when every cell is picked: each weight is asked of the
        // seam on every step.
        let q = self.rope(&self.mv(ix.q_b, qr)?, idim)?;
        let scale = ((idim * ih) as f64).sqrt();
        let w: Vec<f64> = self.mv(ix.proj, x)?.iter().map(|v| v / scale).collect();
        if p < hp.top_k {
            return Ok((0..=p).collect());
        }
        // The oracle's scores are f32 (ggml_lightning_indexer).
        let row: Vec<f64> = self.caches[il]
            .idx_k
            .iter()
            .map(|kj| {
                let s: f64 = (0..ih)
                    .map(|h| dot(&q[h * idim..(h + 1) * idim], kj).max(0.0) * w[h])
                    .sum();
                f64::from(s as f32)
            })
            .collect();
        let mut sel = libstdcxx_top_k(&row, hp.top_k.min(p + 1));
        sel.sort_unstable();
        Ok(sel)
    }

    fn attention(
        &mut self,
        il: usize,
        m: &AttnHandles,
        x: &[f64],
        prev_sel: &mut Option<Vec<usize>>,
    ) -> Result<Vec<f64>, LoadError> {
        let hp = self.model.hparams();
        let (nh, dk, dv, dn, lat) = (hp.n_head, hp.dk, hp.dv, hp.dn(), hp.kv_lora);
        let qr = rms_w(&self.mv(m.q_a, x)?, hp.eps, &self.vec(m.q_a_norm)?);
        let q = self.mv(m.q_b, &qr)?;
        let kvp = self.mv(m.kv_a, x)?;
        let c = rms_w(&kvp[..lat], hp.eps, &self.vec(m.kv_a_norm)?);
        let k_pe = self.rope(&kvp[lat..], hp.n_rot)?;
        let k_b = self.w(m.k_b);
        let mut qa = Vec::with_capacity(nh);
        let mut q_pe = Vec::with_capacity(nh);
        for h in 0..nh {
            let head = &q[h * dk..(h + 1) * dk];
            qa.push(self.mv_rows(k_b, h * lat, lat, &head[..dn])?);
            q_pe.push(self.rope(&head[dn..], hp.n_rot)?);
        }
        let stored = |v: Vec<f64>| -> Vec<f64> {
            let k = self.numerics.cache_type_k;
            v.into_iter()
                .map(|x| f64::from(k.stored(x as f32)))
                .collect()
        };
        let (c, k_pe) = (stored(c), stored(k_pe));
        self.caches[il].latent.push(c);
        self.caches[il].k_pe.push(k_pe);
        let sel = match &m.indexer {
            Some(ix) => {
                let sel = self.select(il, ix, x, &qr)?;
                *prev_sel = Some(sel.clone());
                sel
            }
            None => prev_sel.clone().ok_or_else(|| {
                LoadError::Forward(format!("layer {il} shares a selection no layer made"))
            })?,
        };
        let cache = &self.caches[il];
        let scale = 1.0 / (dk as f64).sqrt();
        let v_b = self.w(m.v_b);
        let mut u = Vec::with_capacity(nh * dv);
        for h in 0..nh {
            let mut s: Vec<f64> = sel
                .iter()
                .map(|&j| (dot(&qa[h], &cache.latent[j]) + dot(&q_pe[h], &cache.k_pe[j])) * scale)
                .collect();
            softmax(&mut s);
            let mut o = vec![0.0; lat];
            for (a, &j) in s.iter().zip(&sel) {
                o.iter_mut()
                    .zip(&cache.latent[j])
                    .for_each(|(o, c)| *o += a * c);
            }
            u.extend(self.mv_rows(v_b, h * dv, dv, &o)?);
        }
        self.mv_scaled(m.out, m.out_scale, &u)
    }

    fn swiglu(&self, f: &Swiglu, x: &[f64]) -> Result<Vec<f64>, LoadError> {
        let g = self.mv_scaled(f.w[0], f.scale[0], x)?;
        let u = self.mv_scaled(f.w[1], f.scale[1], x)?;
        let a: Vec<f64> = g.iter().zip(&u).map(|(&g, &u)| silu(g) * u).collect();
        self.mv_scaled(f.w[2], f.scale[2], &a)
    }

    fn ffn(&self, il: usize, ffn: &Ffn, x: &[f64]) -> Result<Vec<f64>, LoadError> {
        let hp = self.model.hparams();
        match *ffn {
            Ffn::Dense(ref f) => self.swiglu(f, x),
            Ffn::Moe {
                router,
                bias,
                stacks,
                stack_scales,
                ref shared,
            } => {
                let logits: Vec<f32> = self.mv(router, x)?.iter().map(|&v| v as f32).collect();
                let bias = bias.map(|b| self.vec(b)).transpose()?;
                let choices = family_ops::route(
                    &logits,
                    &Routing {
                        gating: Gating::Sigmoid,
                        k: hp.n_expert_used,
                        bias: bias.as_deref(),
                        normalize: hp.expert_weights_norm,
                        scale: hp.expert_weights_scale,
                    },
                )
                .map_err(|e| LoadError::Forward(format!("layer {il} router: {e}")))?;
                let scales: Vec<Option<std::sync::Arc<[f32]>>> = stack_scales
                    .iter()
                    .map(|s| s.map(|s| self.vec(s)).transpose())
                    .collect::<Result<_, _>>()?;
                let times = |v: &mut [f64], part: usize, e: usize| {
                    if let Some(s) = &scales[part] {
                        let s = f64::from(s[e]);
                        v.iter_mut().for_each(|x| *x *= s);
                    }
                };
                let model = self.model;
                let ff = hp.n_ff_exp[il];
                let mut out = self.swiglu(shared, x)?;
                for c in choices {
                    let e = c.expert;
                    let gw = model.expert(stacks[0], e, EXPERT_ROLES[0])?;
                    let uw = model.expert(stacks[1], e, EXPERT_ROLES[1])?;
                    let dw = model.expert(stacks[2], e, EXPERT_ROLES[2])?;
                    let mut g = self.mv_rows(gw, 0, ff, x)?;
                    times(&mut g, 0, e);
                    let mut u = self.mv_rows(uw, 0, ff, x)?;
                    times(&mut u, 1, e);
                    let a: Vec<f64> = g.iter().zip(&u).map(|(&g, &u)| silu(g) * u).collect();
                    let mut y = self.mv_rows(dw, 0, hp.n_embd, &a)?;
                    times(&mut y, 2, e);
                    let w = f64::from(c.weight);
                    out.iter_mut().zip(&y).for_each(|(o, y)| *o += w * y);
                }
                Ok(out)
            }
        }
    }
}

pub use family_kit::Decoded;

/// The family contract's decoder ([`family_kit::Decoder`]): the prompt fed
/// one token at a time, as [`greedy`] feeds it.
impl family_kit::Decoder for State<'_> {
    fn prefill(&mut self, tokens: &[u32]) -> Result<Vec<f32>, LoadError> {
        if tokens.is_empty() {
            return Err(LoadError::Forward("the prompt is empty".into()));
        }
        let mut logits = Vec::new();
        for &t in tokens {
            logits = self.step(t)?;
        }
        Ok(logits)
    }

    fn step(&mut self, token: u32) -> Result<Vec<f32>, LoadError> {
        State::step(self, token)
    }

    fn traffic(&self) -> family_kit::Traffic {
        self.reader.traffic()
    }
}

/// Feeds `prompt` one token at a time, then decodes `steps` tokens
/// greedily (argmax, ties to the lower id), calling `after_step` after the
/// prompt and after each step.
///
/// # Errors
///
/// An empty prompt, a token out of the vocabulary, or a weight the seam
/// failed to hand out.
pub fn greedy(
    model: &GlmMoeDsa,
    reader: WeightReader<'_>,
    numerics: Numerics,
    prompt: &[u32],
    steps: usize,
    after_step: &mut dyn FnMut(),
) -> Result<Decoded, LoadError> {
    let mut state = State::new(model, reader, numerics)?;
    family_kit::greedy(prompt, steps, &mut |t| state.step(t), after_step)
}
