//! The CPU forward pass as docs/families/glm_moe_dsa.md (sections 3-7)
//! states it, in ggml's `f32` arithmetic as llama.cpp's CPU build computes
//! it (`family_ops::ggml_cpu`: the products' kernels with the activations
//! converted to each weight's `vec_dot_type`, RMSNorm, LayerNorm, RoPE,
//! the Hadamard rotation and fused score of the indexer, the attention
//! over the cache's element type, the experts' routing and mix), so the
//! logits are llama.cpp's own on quantized files and F16 caches
//! (docs/families/glm_moe_dsa.md, "Numerics"). Every weight is asked of
//! `seam::resident_weight` on every use through the kit's
//! [`WeightReader`] (matrices read by rows, only small vectors kept
//! dequantized); a routed expert is its sub-span weight, staged when the
//! router picks it. The caches are llama.cpp's: the MLA K cache (the
//! latent and the rope key, V a view of it) and the indexer's key cache of
//! full layers, each in the K cache's type.

use family_kit::blocks::indexer;
use family_kit::{Handle, LoadError, Numerics, WeightReader};
use family_ops::ggml_cpu::{self, KvCells, Ubatch};
use family_ops::{AttentionShape, NormWeight, rms_norm_in_place};
use seam::weight::Weight;

use crate::model::{AttnHandles, EXPERT_ROLES, Ffn, GlmMoeDsa, IndexerHandles, Swiglu};

fn ops(what: &str) -> impl Fn(family_ops::OpsError) -> LoadError + '_ {
    move |e| LoadError::Forward(format!("{what}: {e}"))
}

/// One layer's caches, each cell as stored (rounded to the K cache type).
#[derive(Debug, Default)]
struct Cache {
    /// `[latent | rope key]` of every position (llama.cpp's K; V is its
    /// first `kv_lora` values).
    kv: Vec<f32>,
    /// The indexer's rotated keys of every position (full layers only).
    idx_k: Vec<f32>,
}

/// A sequence being decoded: its caches and position.
pub struct State<'m> {
    model: &'m GlmMoeDsa,
    reader: WeightReader<'m>,
    caches: Vec<Cache>,
    pos: usize,
    /// The caches' element types: the latent, the rope key and the
    /// indexer keys are llama.cpp's K cache.
    numerics: Numerics,
    /// The ubatch the token being fed belongs to: ggml sums the products
    /// of float weights (and the attention) in another order for several
    /// tokens at once.
    ubatch: Ubatch,
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
    /// None today (every [`Numerics`] is computed: flash attention as
    /// llama.cpp's CPU build runs it, `family_ops::ggml_cpu::attention_flash`);
    /// the `Result` is the family contract's.
    pub fn new(
        model: &'m GlmMoeDsa,
        reader: WeightReader<'m>,
        numerics: Numerics,
    ) -> Result<State<'m>, LoadError> {
        let caches = (0..model.hparams().n_layer)
            .map(|_| Cache::default())
            .collect();
        Ok(State {
            model,
            reader,
            caches,
            pos: 0,
            numerics,
            ubatch: Ubatch::One,
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

    /// Rows `first..first + n` of `w` times `x` as ggml's `mul_mat` (or,
    /// with `ubatch` [`Ubatch::One`], `mul_mat_id`'s `vec_dot`) computes
    /// them.
    fn mm_rows(
        &self,
        w: &'m Weight,
        first: usize,
        n: usize,
        x: &[f32],
        ubatch: Ubatch,
    ) -> Result<Vec<f32>, LoadError> {
        self.reader.matvec_llama_rows(w, first, n, x, ubatch)
    }

    /// All rows of `h` times `x` (a dense `mul_mat` of this ubatch).
    fn mm(&self, h: Handle, x: &[f32]) -> Result<Vec<f32>, LoadError> {
        let w = self.w(h);
        let rows = w.dims().iter().skip(1).product::<u64>() as usize;
        self.mm_rows(w, 0, rows, x, self.ubatch)
    }

    /// [`State::mm`] times the optional `{1}` `.scale` (`ggml_mul`).
    fn mm_scaled(
        &self,
        h: Handle,
        scale: Option<Handle>,
        x: &[f32],
    ) -> Result<Vec<f32>, LoadError> {
        let mut y = self.mm(h, x)?;
        if let Some(s) = scale {
            let s = self.vec(s)?[0];
            y.iter_mut().for_each(|v| *v *= s);
        }
        Ok(y)
    }

    /// `rms_norm(x) * w` (ggml's `rms_norm` then `mul`).
    fn rms(&self, x: &mut [f32], w: Handle) -> Result<(), LoadError> {
        let eps = self.model.hparams().eps;
        let gamma = self.vec(w)?;
        rms_norm_in_place(x, eps, NormWeight::Scale(&gamma)).map_err(ops("rms_norm"))
    }

    /// ROPE_NORM of the leading `n_rot` values of each `head`-wide head of
    /// `x` at the current position.
    fn rope(&self, x: &mut [f32], head: usize) -> Result<(), LoadError> {
        let hp = self.model.hparams();
        ggml_cpu::rope(x, head, self.pos, hp.n_rot, hp.freq_base).map_err(ops("rope"))
    }

    /// Feeds `tokens` as llama.cpp's batched prefill does (one ubatch of
    /// them all): the same pass as [`State::step`] token after token,
    /// with ggml's several-token kernels ([`Ubatch::of`]) when there are
    /// two or more. Returns the logits of every position.
    ///
    /// # Errors
    ///
    /// As [`State::step`].
    pub fn prefill_all(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>, LoadError> {
        let logits = tokens
            .iter()
            .enumerate()
            .map(|(i, &t)| {
                self.ubatch = Ubatch::of(i, tokens.len());
                self.step(t)
            })
            .collect();
        self.ubatch = Ubatch::One;
        logits
    }

    /// Feeds `token` at the next position; returns its logits.
    ///
    /// # Errors
    ///
    /// The token is out of the vocabulary, or a weight could not be read.
    pub fn step(&mut self, token: u32) -> Result<Vec<f32>, LoadError> {
        let model = self.model;
        let h = model.handles();
        if token as usize >= model.n_vocab() {
            return Err(LoadError::Forward(format!(
                "token {token} is outside the vocabulary of {}",
                model.n_vocab()
            )));
        }
        let mut x = self.reader.rows(self.w(h.token_embd), token as usize, 1)?;
        let mut prev_sel: Option<Vec<f32>> = None;
        for (il, layer) in h.layers.iter().enumerate() {
            let mut a_in = x.clone();
            self.rms(&mut a_in, layer.attn_norm)?;
            let a = self.attention(il, &layer.attn, &a_in, &mut prev_sel)?;
            x.iter_mut().zip(&a).for_each(|(x, a)| *x += a);
            let mut f_in = x.clone();
            self.rms(&mut f_in, layer.ffn_norm)?;
            let f = self.ffn(il, &layer.ffn, &f_in)?;
            x.iter_mut().zip(&f).for_each(|(x, f)| *x += f);
        }
        self.rms(&mut x, h.output_norm)?;
        let logits = self.mm(h.output, &x)?;
        self.pos += 1;
        Ok(logits)
    }

    /// The mask of the cells position `self.pos` attends (`0` picked,
    /// `-inf` not), from a full layer's indexer (section 5): its key
    /// stored, every cached key scored, the `top_k` best picked
    /// (`ggml_top_k`, libstdc++'s order at ties).
    fn select(
        &mut self,
        il: usize,
        ix: &IndexerHandles,
        x: &[f32],
        qr: &[f32],
    ) -> Result<Vec<f32>, LoadError> {
        let shape = self.model.indexer_shape(self.numerics);
        let p = self.pos;
        let mut q = self.mm(ix.q_b, qr)?;
        indexer::rotate_query(&mut q, &shape, p).map_err(ops("indexer query"))?;
        let mut k = self.mm(ix.k, x)?;
        let gain = ix.k_norm.map(|g| self.vec(g)).transpose()?;
        let bias = ix.k_norm_b.map(|b| self.vec(b)).transpose()?;
        indexer::finish_key(&mut k, gain.as_deref(), bias.as_deref(), &shape, p)
            .map_err(ops("indexer key"))?;
        self.caches[il].idx_k.extend_from_slice(&k);
        // Read even when every cell is picked: each weight is asked of the
        // seam on every step.
        let mut w = self.mm(ix.proj, x)?;
        indexer::scale_head_weights(&mut w, &shape);
        Ok(indexer::pick_cells(&q, &self.caches[il].idx_k, &w, &shape))
    }

    fn attention(
        &mut self,
        il: usize,
        attn: &AttnHandles,
        x: &[f32],
        prev_sel: &mut Option<Vec<f32>>,
    ) -> Result<Vec<f32>, LoadError> {
        let m = &attn.mla;
        let hp = self.model.hparams();
        let (nh, dk, dv, dn, lat, r) = (hp.n_head, hp.dk, hp.dv, hp.dn(), hp.kv_lora, hp.n_rot);
        let mut qr = self.mm(m.q_a, x)?;
        self.rms(&mut qr, m.q_a_norm)?;
        let sel = match &attn.indexer {
            Some(ix) => {
                let sel = self.select(il, ix, x, &qr)?;
                *prev_sel = Some(sel.clone());
                sel
            }
            None => prev_sel.clone().ok_or_else(|| {
                LoadError::Forward(format!("layer {il} shares a selection no layer made"))
            })?,
        };
        let q = self.mm(m.q_b, &qr)?;
        let mut kvp = self.mm(m.kv_a, x)?;
        let (c, k_pe) = kvp.split_at_mut(lat);
        self.rope(k_pe, r)?;
        self.rms(c, m.kv_a_norm)?;
        // The query of each head: `[k_b · q_nope | roped q_pe]`.
        let k_b = self.w(m.k_b);
        // q_nope is a strided view of q: an F32 k_b takes it as is, by
        // vec_dot; any other type converts it (contiguous) first.
        let k_b_ubatch = match k_b.ggml_type() {
            seam::gguf::GgmlType::F32 => Ubatch::One,
            _ => self.ubatch,
        };
        let mut q_cat = Vec::with_capacity(nh * (lat + r));
        for h in 0..nh {
            let head = &q[h * dk..(h + 1) * dk];
            q_cat.extend(self.mm_rows(k_b, h * lat, lat, &head[..dn], k_b_ubatch)?);
            let mut pe = head[dn..].to_vec();
            self.rope(&mut pe, r)?;
            q_cat.extend(pe);
        }
        self.numerics.cache_type_k.store_in_place(&mut kvp);
        let cache = &mut self.caches[il];
        cache.kv.extend_from_slice(&kvp);
        let cells = KvCells {
            k: &cache.kv,
            k_stride: lat + r,
            v: &cache.kv,
            v_stride: lat + r,
            first_cell: 0,
            mask: Some(&sel),
            k_type: self.numerics.cache_type_k,
            // V is a view of the K cache.
            v_type: self.numerics.cache_type_k,
        };
        let shape = AttentionShape {
            n_head: nh,
            n_head_kv: 1,
            head_dim_k: lat + r,
            head_dim_v: lat,
        };
        let mut kqv = vec![0f32; nh * lat];
        let scale = 1.0 / (dk as f32).sqrt();
        ggml_cpu::attention_llama(
            &q_cat,
            &cells,
            &shape,
            scale,
            self.ubatch,
            self.numerics.flash_attn,
            &mut kqv,
        )
        .map_err(ops("attention"))?;
        // Flash attention's output reaches v_b permuted, strided with
        // several heads: an F32 v_b takes it as is, by vec_dot.
        let v_b = self.w(m.v_b);
        let v_b_ubatch = match v_b.ggml_type() {
            seam::gguf::GgmlType::F32 if self.numerics.flash_attn && nh > 1 => Ubatch::One,
            _ => self.ubatch,
        };
        let mut u = Vec::with_capacity(nh * dv);
        for (h, l) in kqv.chunks_exact(lat).enumerate() {
            u.extend(self.mm_rows(v_b, h * dv, dv, l, v_b_ubatch)?);
        }
        self.mm_scaled(m.out, m.out_scale, &u)
    }

    /// `build_ffn` with SiLU, parallel gate: `down(swiglu(gate·x, up·x))`,
    /// each product times its optional scale.
    fn swiglu(&self, f: &Swiglu, x: &[f32]) -> Result<Vec<f32>, LoadError> {
        let u = self.mm_scaled(f.w[1], f.scale[1], x)?;
        let g = self.mm_scaled(f.w[0], f.scale[0], x)?;
        let mut a = vec![0f32; g.len()];
        ggml_cpu::swiglu(&g, &u, &mut a).map_err(ops("swiglu"))?;
        self.mm_scaled(f.w[2], f.scale[2], &a)
    }

    fn ffn(&self, il: usize, ffn: &Ffn, x: &[f32]) -> Result<Vec<f32>, LoadError> {
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
                let logits = self.mm(router, x)?;
                let bias = bias.map(|b| self.vec(b)).transpose()?;
                let picked = ggml_cpu::moe::route_sigmoid(
                    &logits,
                    bias.as_deref(),
                    hp.n_expert_used,
                    hp.expert_weights_norm,
                    hp.expert_weights_scale,
                );
                let scales: Vec<Option<std::sync::Arc<[f32]>>> = stack_scales
                    .iter()
                    .map(|s| s.map(|s| self.vec(s)).transpose())
                    .collect::<Result<_, _>>()?;
                let times = |v: &mut [f32], part: usize, e: usize| {
                    if let Some(s) = &scales[part] {
                        let s = s[e];
                        v.iter_mut().for_each(|x| *x *= s);
                    }
                };
                let model = self.model;
                let ff = hp.n_ff_exp[il];
                // mul_mat_id: each expert's rows by vec_dot, whatever the
                // ubatch.
                let id = Ubatch::One;
                let mut outs = Vec::with_capacity(picked.len());
                for &(e, _) in &picked {
                    let gw = model.expert(stacks[0], e, EXPERT_ROLES[0])?;
                    let uw = model.expert(stacks[1], e, EXPERT_ROLES[1])?;
                    let dw = model.expert(stacks[2], e, EXPERT_ROLES[2])?;
                    let mut u = self.mm_rows(uw, 0, ff, x, id)?;
                    times(&mut u, 1, e);
                    let mut g = self.mm_rows(gw, 0, ff, x, id)?;
                    times(&mut g, 0, e);
                    let mut a = vec![0f32; ff];
                    ggml_cpu::swiglu(&g, &u, &mut a).map_err(ops("swiglu"))?;
                    let mut y = self.mm_rows(dw, 0, hp.n_embd, &a, id)?;
                    times(&mut y, 2, e);
                    outs.push(y);
                }
                let weights: Vec<f32> = picked.iter().map(|&(_, w)| w).collect();
                let mut out = vec![0f32; hp.n_embd];
                ggml_cpu::moe::mix(&outs, &weights, &mut out);
                let sh = self.swiglu(shared, x)?;
                out.iter_mut().zip(&sh).for_each(|(o, s)| *o += s);
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
        family_kit::prefill_by_steps(tokens, |t| State::step(self, t))
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
