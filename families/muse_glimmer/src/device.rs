//! muse-glimmer decoding through the device op layer
//! ([`device_ops::Ops`]): the forward pass of [`crate::forward`] (the host
//! reference, llama.cpp's CPU graph) composed from the kit's shared blocks
//! ([`family_kit::blocks::attention`]: sliding-window and full attention
//! with head norms, RoPE on the sliding-window layers only, the output
//! gate and sandwich norms; the final logits with the logit scale and
//! softcap) and a SwiGLU FFN between sandwich norms.
//!
//! - Every product reads the staged weight in place; norm gains, biases
//!   and `{1}` scales are dequantized on the device once and kept there.
//!   Nothing of a weight comes back to the host.
//! - State on the device: one [`KvCache`] per layer (every position: a
//!   sliding-window layer's mask hides what is past its window, so its
//!   cells sit where llama.cpp's do and ggml's sums take the same lanes).
//! - A prompt goes in batches of up to 512 tokens, each op over every
//!   token's rows (attention causal over the batch). Each row is computed
//!   as ggml computes one token (the reference's products take ggml's
//!   one-token paths), so the logits are the host path's fed a token at a
//!   time ([`crate::family::MuseGlimmerDecoder`]'s prefill).
//! - What comes back: the last position's logits.

use std::cell::Cell;
use std::rc::Rc;

use device_ops::{DeviceTensor, GgmlRope, KvCache, NormWeight, Ops, RopeMode, Scores};
use family_kit::blocks::attention::{
    self as attn, AttentionLayer, AttentionShape, DeviceWeights, LogitsHead, Projection, Span,
    cache_dtype, op_err,
};
use family_kit::{Decoder, LoadError, Numerics, Traffic};
use seam::platform::{Platform, Queue};

use crate::hparams::POST_NORM_EPS;
use crate::model::MuseGlimmer;

/// Tokens of a prompt fed at once (llama.cpp's default `n_ubatch`).
const PREFILL_BATCH: usize = 512;

fn fwd(why: impl Into<String>) -> LoadError {
    LoadError::Forward(why.into())
}

/// muse-glimmer's decoder on a device: the forward pass composed from
/// [`Ops`], its caches there.
pub struct DeviceDecoder<'m> {
    model: &'m MuseGlimmer,
    dw: DeviceWeights<'m>,
    caches: Vec<KvCache>,
    pos: usize,
    /// Read-backs made (the op counters count their bytes).
    read_backs: Cell<u64>,
}

impl std::fmt::Debug for DeviceDecoder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceDecoder")
            .field("device", &self.dw.ops().device_name())
            .field("pos", &self.pos)
            .finish()
    }
}

impl<'m> DeviceDecoder<'m> {
    /// A decoder of `model` whose weights are staged on `platform` through
    /// `queue` and computed on by `ops` (that platform's op layer), its
    /// caches as `numerics` says, at position 0.
    ///
    /// # Errors
    ///
    /// `numerics` asks for what the device path does not compute (flash
    /// attention, K and V of different types, bf16), or the device failed.
    pub fn new(
        model: &'m MuseGlimmer,
        platform: &'m dyn Platform,
        queue: &'m dyn Queue,
        ops: Box<dyn Ops + 'm>,
        numerics: Numerics,
    ) -> Result<DeviceDecoder<'m>, LoadError> {
        let dtype = cache_dtype(numerics)?;
        let dw = DeviceWeights::new(Rc::from(ops), platform, queue);
        let mut decoder = DeviceDecoder {
            model,
            dw,
            caches: Vec::new(),
            pos: 0,
            read_backs: Cell::new(0),
        };
        decoder.caches = (0..model.hparams().n_layer)
            .map(|il| {
                let shape = decoder.layer(il).shape;
                attn::new_cache(
                    decoder.dw.ops(),
                    shape.n_head_kv,
                    shape.head_dim,
                    attn::FIRST_CTX,
                    dtype,
                )
            })
            .collect::<Result<_, _>>()?;
        Ok(decoder)
    }

    /// The op layer (its counters).
    pub fn ops(&self) -> &dyn Ops {
        self.dw.ops()
    }

    /// The op layer, to share (the projector's encoder on the same device).
    pub fn shared_ops(&self) -> Rc<dyn Ops + 'm> {
        self.dw.shared_ops()
    }

    /// Small tensors kept dequantized on the device.
    pub fn kept(&self) -> usize {
        self.dw.kept()
    }

    /// Positions fed so far.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Layer `il` as the shared attention block takes it.
    fn layer(&self, il: usize) -> AttentionLayer<'m> {
        let m = self.model;
        let hp = m.hparams();
        let l = &m.layers()[il];
        let opt = |h: Option<family_kit::Handle>| h.map(|h| m.get(h));
        let swa = hp.is_swa[il];
        AttentionLayer {
            pre_norm: Some(m.get(l.attn_norm)),
            q: Projection {
                weight: m.get(l.q),
                scale: opt(l.q_scale),
                bias: opt(l.q_bias),
            },
            k: Projection {
                weight: m.get(l.k),
                scale: opt(l.k_scale),
                bias: opt(l.k_bias),
            },
            v: Projection {
                weight: m.get(l.v),
                scale: opt(l.v_scale),
                bias: opt(l.v_bias),
            },
            q_norm: Some(m.get(l.q_norm)),
            k_norm: Some(m.get(l.k_norm)),
            gate: Some(m.get(l.gate)),
            output: Projection {
                weight: m.get(l.output),
                scale: opt(l.o_scale),
                bias: None,
            },
            post_norm: Some(m.get(l.post_attention_norm)),
            shape: AttentionShape {
                n_head: hp.n_head,
                n_head_kv: hp.n_head_kv,
                head_dim: hp.head_dim,
                eps: hp.eps,
                post_norm_eps: POST_NORM_EPS,
                // Full layers have no RoPE (muse-glimmer.cpp:87-88).
                rope: swa.then(|| GgmlRope::plain(hp.n_rot, RopeMode::Normal, hp.rope_base)),
                span: if swa {
                    Span::SlidingWindow(hp.n_swa)
                } else {
                    Span::Full
                },
                scores: Scores::scale(1.0 / (hp.head_dim as f32).sqrt()),
            },
        }
    }

    /// The FFN of layer `il` over `h` (`[n, E]`): `h` plus the
    /// post-normed SwiGLU of the pre-normed `h`.
    fn ffn(&self, il: usize, h: &DeviceTensor) -> Result<DeviceTensor, LoadError> {
        let m = self.model;
        let l = &m.layers()[il];
        let (dw, o) = (&self.dw, self.dw.ops());
        let y = dw.norm(h, m.get(l.ffn_norm), m.hparams().eps)?;
        let g = dw.matmul(m.get(l.ffn_gate), &y)?;
        let u = dw.matmul(m.get(l.ffn_up), &y)?;
        let act = o.swiglu(&g, &u).map_err(op_err)?;
        let d = dw.matmul(m.get(l.ffn_down), &act)?;
        let d = dw.norm(&d, m.get(l.post_ffw_norm), POST_NORM_EPS)?;
        o.add(h, &d).map_err(op_err)
    }

    /// Feeds `tokens` at the next positions, all at once; the last one's
    /// logits on the device (`[1, n_vocab]`).
    fn forward(&mut self, tokens: &[u32]) -> Result<DeviceTensor, LoadError> {
        let m = self.model;
        let hp = m.hparams();
        let n = tokens.len();
        if n == 0 {
            return Err(fwd("no tokens to feed"));
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= hp.n_vocab) {
            return Err(fwd(format!(
                "token {t} is not below the vocabulary size {}",
                hp.n_vocab
            )));
        }
        let pos0 = self.pos;
        let o = self.dw.shared_ops();
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let ids = o.upload_i32(&ids, &[n]).map_err(op_err)?;
        let h = self.dw.get_rows(m.token_embd(), &ids)?;
        let mut h = o.rms_norm(&h, hp.eps, NormWeight::None).map_err(op_err)?;
        let pos = attn::positions(&*o, pos0, n)?;
        for il in 0..hp.n_layer {
            let layer = self.layer(il);
            h = attn::attention(&self.dw, &layer, &mut self.caches[il], &h, pos0, &pos)?;
            h = self.ffn(il, &h)?;
        }
        let head = LogitsHead {
            norm: m.output_norm(),
            eps: hp.eps,
            output: m.output(),
            scale: Some(hp.logit_scale),
            softcap: (hp.softcap != 0.0).then_some(hp.softcap),
        };
        let logits = attn::logits(&self.dw, &head, &h)?;
        self.pos += n;
        Ok(logits)
    }

    /// `logits` back on the host, counted.
    fn read_back(&self, logits: &DeviceTensor) -> Result<Vec<f32>, LoadError> {
        self.read_backs.set(self.read_backs.get() + 1);
        self.dw.ops().read_back(logits).map_err(op_err)
    }
}

impl Decoder for DeviceDecoder<'_> {
    fn prefill(&mut self, tokens: &[u32]) -> Result<Vec<f32>, LoadError> {
        let mut last = None;
        for chunk in tokens.chunks(PREFILL_BATCH) {
            last = Some(self.forward(chunk)?);
        }
        // No chunk: an empty prompt.
        let last = last.ok_or_else(LoadError::empty_prompt)?;
        self.read_back(&last)
    }

    fn step(&mut self, token: u32) -> Result<Vec<f32>, LoadError> {
        let logits = self.forward(&[token])?;
        self.read_back(&logits)
    }

    fn traffic(&self) -> Traffic {
        let c = self.dw.ops().counters();
        Traffic {
            read_back_bytes: c.read_back_bytes,
            weight_read_back_bytes: c.weight_read_back_bytes,
            read_backs: self.read_backs.get(),
            kernel_launches: Some(c.kernel_launches),
        }
    }
}
