//! The CPU forward pass (`docs/families/muse_glimmer.md` section 3), one
//! token at a time over a K/V cache. Every weight is asked of
//! `seam::resident_weight` on every use, through the kit's
//! [`WeightReader`]: matrices a chunk of rows at a time, never kept
//! dequantized; only the small tensors (norms, biases, scales) are kept.
//! Activations are `f32`; the products, the attention (over the caches'
//! element types: `q` and the probabilities converted to F16 for an F16
//! cache), RoPE, SiLU and the gate's sigmoid follow ggml's x86 CPU kernels
//! bit for bit (`family_ops::ggml_cpu`, for the weight types
//! `ggml_cpu::is_emulated` covers; others fall back to
//! `family_ops::as_ggml_multiplies` and an `f64` dot), so the logits are
//! llama.cpp's own (`docs/families/muse_glimmer.md`, "Numerics").

use family_kit::{LoadError, Numerics, WeightReader};
use family_ops::ggml_cpu::{self, KvCells, Ubatch};
use family_ops::{AttentionShape, NormWeight, Rope, RopeMode, rms_norm_in_place};
use seam::platform::{Platform, Queue};
use seam::weight::Weight;

use crate::hparams::POST_NORM_EPS;
use crate::model::MuseGlimmer;

fn ops(e: family_ops::OpsError) -> LoadError {
    LoadError::Forward(e.to_string())
}

/// A decoding session: the model, its reader and the K/V cache.
pub struct Decoder<'m> {
    model: &'m MuseGlimmer,
    reader: WeightReader<'m>,
    /// Per layer, the keys and values of the positions it attends to (a
    /// sliding-window layer: the last `n_swa`).
    k_cache: Vec<Vec<f32>>,
    v_cache: Vec<Vec<f32>>,
    pos: usize,
    /// The caches' element types (each K and V row rounded as stored).
    numerics: Numerics,
    /// The ubatch the token being fed belongs to: ggml sums the products
    /// of float weights in another order for several tokens at once.
    ubatch: Ubatch,
}

impl std::fmt::Debug for Decoder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder").field("pos", &self.pos).finish()
    }
}

impl<'m> Decoder<'m> {
    /// A decoder of `model` whose weights are staged on `platform`, its
    /// caches as `numerics` says.
    ///
    /// # Errors
    ///
    /// None today (every [`Numerics`] is computed: flash attention as
    /// llama.cpp's CPU build runs it, `family_ops::ggml_cpu::attention_flash`);
    /// the `Result` is the family contract's.
    pub fn new(
        model: &'m MuseGlimmer,
        platform: &'m dyn Platform,
        queue: &'m dyn Queue,
        numerics: Numerics,
    ) -> Result<Decoder<'m>, LoadError> {
        let n = model.hparams().n_layer;
        Ok(Decoder {
            model,
            reader: WeightReader::new(platform, queue),
            k_cache: vec![Vec::new(); n],
            v_cache: vec![Vec::new(); n],
            pos: 0,
            numerics,
            ubatch: Ubatch::One,
        })
    }

    /// The reader (what it keeps dequantized).
    pub fn reader(&self) -> &WeightReader<'m> {
        &self.reader
    }

    /// Positions fed so far.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// `W·x` with `x` rounded as ggml's CPU matmul rounds it for `W`'s type
    /// (F16/BF16, or quantized to Q8_0/Q8_K): what llama.cpp computes.
    fn matvec(&self, w: &'m Weight, x: &[f32]) -> Result<Vec<f32>, LoadError> {
        if ggml_cpu::is_emulated(w.ggml_type()) {
            return self.reader.matvec_ggml(w, x, self.ubatch);
        }
        let x = family_ops::as_ggml_multiplies(w.ggml_type(), x).map_err(ops)?;
        self.reader.matvec_f32(w, &x)
    }

    fn norm(&self, w: &'m Weight, x: &mut [f32], eps: f32) -> Result<(), LoadError> {
        let gamma = self.reader.vector(w)?;
        rms_norm_in_place(x, eps, NormWeight::Scale(&gamma)).map_err(ops)
    }

    /// `W·x`, times the optional `{1}` scale, plus the optional bias.
    fn projection(
        &self,
        w: &'m Weight,
        scale: Option<&'m Weight>,
        bias: Option<&'m Weight>,
        x: &[f32],
    ) -> Result<Vec<f32>, LoadError> {
        let mut y = self.matvec(w, x)?;
        if let Some(s) = scale {
            let s = self.reader.vector(s)?[0];
            y.iter_mut().for_each(|v| *v *= s);
        }
        if let Some(b) = bias {
            let b = self.reader.vector(b)?;
            y.iter_mut().zip(b.iter()).for_each(|(v, &b)| *v += b);
        }
        Ok(y)
    }

    /// Feeds `tokens` as llama.cpp's batched prefill does (one ubatch of
    /// them all): the same pass as [`Decoder::step`] token after token,
    /// with ggml's several-token matmul paths ([`Ubatch::of`]: which one
    /// takes a token depends on the ubatch's size and the token's place in
    /// it) when there are two or more. Returns the logits of every position.
    ///
    /// # Errors
    ///
    /// As [`Decoder::step`].
    pub fn prefill(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>, LoadError> {
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
    /// The token is out of the vocabulary, or the seam failed to hand out
    /// a weight.
    pub fn step(&mut self, token: u32) -> Result<Vec<f32>, LoadError> {
        let m = self.model;
        let hp = m.hparams();
        if token as usize >= hp.n_vocab {
            return Err(LoadError::Forward(format!(
                "token {token} is not below the vocabulary size {}",
                hp.n_vocab
            )));
        }
        let pos = self.pos;
        let hd = hp.head_dim;
        let opt = |h: Option<family_kit::Handle>| h.map(|h| m.get(h));
        let mut h = self.reader.rows(m.token_embd(), token as usize, 1)?;
        rms_norm_in_place(&mut h, hp.eps, NormWeight::None).map_err(ops)?;
        let rope = Rope {
            n_rot: hp.n_rot,
            freq_base: hp.rope_base,
            mode: RopeMode::Normal,
        };
        for (il, l) in m.layers().iter().enumerate() {
            let mut x = h.clone();
            self.norm(m.get(l.attn_norm), &mut x, hp.eps)?;
            let mut q = self.projection(m.get(l.q), opt(l.q_scale), opt(l.q_bias), &x)?;
            let mut k = self.projection(m.get(l.k), opt(l.k_scale), opt(l.k_bias), &x)?;
            let mut v = self.projection(m.get(l.v), opt(l.v_scale), opt(l.v_bias), &x)?;
            let gate = self.matvec(m.get(l.gate), &x)?;
            let q_norm = self.reader.vector(m.get(l.q_norm))?;
            let k_norm = self.reader.vector(m.get(l.k_norm))?;
            for head in q.chunks_exact_mut(hd) {
                rms_norm_in_place(head, hp.eps, NormWeight::Scale(&q_norm)).map_err(ops)?;
            }
            for head in k.chunks_exact_mut(hd) {
                rms_norm_in_place(head, hp.eps, NormWeight::Scale(&k_norm)).map_err(ops)?;
            }
            let swa = hp.is_swa[il];
            // Full layers have no RoPE (muse-glimmer.cpp:87-88).
            if swa {
                ggml_cpu::rope(&mut q, hd, pos, rope.n_rot, rope.freq_base).map_err(ops)?;
                ggml_cpu::rope(&mut k, hd, pos, rope.n_rot, rope.freq_base).map_err(ops)?;
            }
            self.numerics.cache_type_k.store_in_place(&mut k);
            self.numerics.cache_type_v.store_in_place(&mut v);
            self.k_cache[il].extend_from_slice(&k);
            self.v_cache[il].extend_from_slice(&v);
            // A sliding-window layer keeps only its window: every slot it
            // holds is visible (memory bounded by the window, not the
            // context); a full layer keeps every position.
            if swa {
                let keep = hp.n_swa * hp.n_kv();
                for cache in [&mut self.k_cache[il], &mut self.v_cache[il]] {
                    if cache.len() > keep {
                        cache.drain(..cache.len() - keep);
                    }
                }
            }
            // The cached positions run up to this one; llama.cpp keeps
            // position p in cell p, which fixes ggml's lanes.
            let first_cell = pos + 1 - self.k_cache[il].len() / hp.n_kv();
            let shape = AttentionShape {
                n_head: hp.n_head,
                n_head_kv: hp.n_head_kv,
                head_dim_k: hd,
                head_dim_v: hd,
            };
            let mut a = vec![0f32; hp.n_q()];
            let scale = 1.0 / (hd as f32).sqrt();
            let cells = KvCells {
                k: &self.k_cache[il],
                k_stride: hp.n_kv(),
                v: &self.v_cache[il],
                v_stride: hp.n_kv(),
                first_cell,
                mask: None,
                k_type: self.numerics.cache_type_k,
                v_type: self.numerics.cache_type_v,
            };
            ggml_cpu::attention_llama(
                &q,
                &cells,
                &shape,
                scale,
                self.ubatch,
                self.numerics.flash_attn,
                &mut a,
            )
            .map_err(ops)?;
            a.iter_mut()
                .zip(&gate)
                .for_each(|(a, &g)| *a *= ggml_cpu::sigmoid(g));
            let mut o = self.projection(m.get(l.output), opt(l.o_scale), None, &a)?;
            self.norm(m.get(l.post_attention_norm), &mut o, POST_NORM_EPS)?;
            let f_in: Vec<f32> = o.iter().zip(&h).map(|(o, h)| o + h).collect();
            let mut y = f_in.clone();
            self.norm(m.get(l.ffn_norm), &mut y, hp.eps)?;
            let g = self.matvec(m.get(l.ffn_gate), &y)?;
            let u = self.matvec(m.get(l.ffn_up), &y)?;
            let mut act = vec![0f32; g.len()];
            ggml_cpu::swiglu(&g, &u, &mut act).map_err(ops)?;
            let mut y = self.matvec(m.get(l.ffn_down), &act)?;
            self.norm(m.get(l.post_ffw_norm), &mut y, POST_NORM_EPS)?;
            h = y.iter().zip(&f_in).map(|(y, f)| y + f).collect();
        }
        self.norm(m.output_norm(), &mut h, hp.eps)?;
        let mut logits = self.matvec(m.output(), &h)?;
        let c = hp.softcap;
        // ggml_scale by the logit scale, then the softcap (by 1/c, tanh,
        // by c).
        for z in &mut logits {
            *z *= hp.logit_scale;
            if c != 0.0 {
                *z = ggml_cpu::softcap(*z, c);
            }
        }
        self.pos += 1;
        Ok(logits)
    }
}

/// The index of the first maximum (greedy choice).
pub fn argmax(logits: &[f32]) -> u32 {
    family_ops::argmax(logits) as u32
}

/// Feeds `prompt`, then decodes `n` tokens greedily; returns the generated
/// tokens and the logits of every position fed (prompt, then each
/// generated token but the last), calling `after_step` after each.
///
/// # Errors
///
/// As [`Decoder::step`]; an empty prompt.
pub fn greedy(
    decoder: &mut Decoder<'_>,
    prompt: &[u32],
    n: usize,
    after_step: &mut dyn FnMut(),
) -> Result<(Vec<u32>, Vec<Vec<f32>>), LoadError> {
    if prompt.is_empty() {
        return Err(LoadError::empty_prompt());
    }
    let mut all = Vec::with_capacity(prompt.len() + n);
    for &t in prompt {
        all.push(decoder.step(t)?);
        after_step();
    }
    let mut generated = Vec::with_capacity(n);
    for i in 0..n {
        let next = argmax(all.last().expect("a prompt"));
        generated.push(next);
        if i + 1 < n {
            all.push(decoder.step(next)?);
            after_step();
        }
    }
    Ok((generated, all))
}
