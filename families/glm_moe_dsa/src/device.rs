//! glm-dsa decoding through the device op layer ([`device_ops::Ops`]):
//! the forward pass of [`crate::forward`] (the host reference) composed
//! from the kit's blocks ([`family_kit::blocks`]), its state on the
//! device.
//!
//! - Every product reads the staged weight in place; norm gains and
//!   scales are dequantized on the device once and kept there.
//! - State on the device: per layer MLA's latent cache
//!   ([`mla::LatentCache`]) and per full layer the indexer's keys
//!   ([`IndexerKeys`]), in the K cache's type (F32 or F16), grown by
//!   doubling.
//! - What comes back to the host (activations, never weights): the
//!   router's logits where experts are staged on first pick (the picks
//!   are the host path's own routing; the router's bias is read from its
//!   host bytes), each full layer's indexer scores past `top_k` cells (the
//!   top-k picked on the host as the host path picks it; the selection
//!   goes back as an additive mask), and the logits.
//! - A prompt is fed in batches of up to 512 tokens, each op over every
//!   token's rows (the attention causal over the batch and as each token's
//!   indexer picks); experts picked on the host go a token at a time. The
//!   reference's products compute each row as one token does, so the
//!   logits are the host path's token-at-a-time ones.

use std::rc::Rc;

use device_ops::{DeviceTensor, Gating, Ops};
use family_kit::blocks::BlockContext;
use family_kit::blocks::context::op_err;
use family_kit::blocks::indexer::{self, IndexerKeys, IndexerWeights, Selection};
use family_kit::blocks::mla::{self, LatentCache, MlaShape, MlaWeights};
use family_kit::blocks::moe::{self, RoutedWeights, RoutingRule, SwigluWeights};
use family_kit::{Decoder, ExpertStaging, LoadError, Numerics, Traffic};
use seam::platform::{Platform, Queue};
use seam::weight::Weight;

use crate::GlmMoeDsa;
use crate::model::{EXPERT_ROLES, Ffn};

/// Tokens of a prompt fed at once (llama.cpp's default `n_ubatch`).
const PREFILL_BATCH: usize = 512;

fn fwd(why: impl Into<String>) -> LoadError {
    LoadError::Forward(why.into())
}

/// One layer's FFN as the kit's blocks take it.
enum FfnBlock {
    Dense(SwigluWeights),
    Routed(RoutedWeights),
}

/// One layer's blocks and state.
struct LayerDev {
    attn: MlaWeights,
    indexer: Option<IndexerWeights>,
    /// The indexer's keys (full layers).
    keys: Option<IndexerKeys>,
    cache: LatentCache,
    ffn: FfnBlock,
}

/// glm-dsa's decoder on a device: the forward pass composed from the
/// kit's blocks over [`Ops`], a token at a time.
pub struct DeviceDecoder<'m> {
    model: &'m GlmMoeDsa,
    cx: BlockContext<'m>,
    layers: Vec<LayerDev>,
    mla: MlaShape,
    routing: RoutingRule,
    indexer: indexer::IndexerShape,
    /// `0..n_head`: MLA's per-head picks of `k_b` and `v_b`.
    heads: DeviceTensor,
    staging: ExpertStaging,
    pos: usize,
}

impl std::fmt::Debug for DeviceDecoder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceDecoder")
            .field("device", &self.cx.ops().device_name())
            .field("pos", &self.pos)
            .finish()
    }
}

impl<'m> DeviceDecoder<'m> {
    /// A decoder of `model` whose weights are staged on `platform` through
    /// `queue` and multiplied by `ops` (that platform's op layer), at
    /// position 0, its experts staged as `staging` says (every stack and
    /// every dense weight staged now for [`ExpertStaging::All`]).
    ///
    /// # Errors
    ///
    /// Flash attention or a cache type the device path does not keep, a
    /// weight the seam could not stage, or the device failed.
    pub fn new(
        model: &'m GlmMoeDsa,
        platform: &'m dyn Platform,
        queue: &'m dyn Queue,
        ops: Box<dyn Ops + 'm>,
        staging: ExpertStaging,
        numerics: Numerics,
    ) -> Result<DeviceDecoder<'m>, LoadError> {
        let dtype = mla::latent_dtype(numerics)?;
        let cx = BlockContext::new(Rc::from(ops), platform, queue, model.weights());
        let hp = model.hparams();
        let h = model.handles();
        let mla = MlaShape {
            n_head: hp.n_head,
            head_dim_nope: hp.dn(),
            head_dim_rope: hp.n_rot,
            head_dim_v: hp.dv,
            kv_lora: hp.kv_lora,
            eps: hp.eps,
            rope: model.rope(),
        };
        let routing = RoutingRule {
            gating: Gating::Sigmoid,
            k: hp.n_expert_used,
            normalize: hp.expert_weights_norm,
            scale: hp.expert_weights_scale,
        };
        let indexer_shape = model.indexer_shape(numerics);
        let mut layers = Vec::with_capacity(h.layers.len());
        for l in &h.layers {
            let ffn = match l.ffn {
                Ffn::Dense(ref f) => FfnBlock::Dense(*f),
                Ffn::Moe {
                    router,
                    bias,
                    stacks,
                    stack_scales,
                    ref shared,
                } => FfnBlock::Routed(RoutedWeights {
                    router,
                    bias,
                    stacks,
                    expert_roles: EXPERT_ROLES,
                    stack_scales,
                    shared: Some(*shared),
                }),
            };
            let keys = match l.attn.indexer {
                Some(_) => Some(IndexerKeys::new(&cx, &indexer_shape, dtype)?),
                None => None,
            };
            layers.push(LayerDev {
                attn: l.attn.mla,
                indexer: l.attn.indexer,
                keys,
                cache: LatentCache::new(&cx, &mla, dtype)?,
                ffn,
            });
        }
        if staging == ExpertStaging::All {
            let mut all: Vec<&Weight> = model.weights().dense().collect();
            for l in &layers {
                if let FfnBlock::Routed(m) = &l.ffn {
                    all.extend(moe::whole_stacks(&cx, m)?);
                }
            }
            moe::stage_all(&cx, &all)?;
        }
        let heads = mla::head_ids(&cx, 1, hp.n_head)?;
        Ok(DeviceDecoder {
            model,
            indexer: indexer_shape,
            cx,
            layers,
            mla,
            routing,
            heads,
            staging,
            pos: 0,
        })
    }

    /// How this decoder stages its experts.
    pub fn staging(&self) -> ExpertStaging {
        self.staging
    }

    /// The op layer (its counters).
    pub fn ops(&self) -> &dyn Ops {
        self.cx.ops()
    }

    /// Small tensors kept dequantized on the device.
    pub fn kept(&self) -> usize {
        self.cx.kept()
    }

    /// Feeds `tokens` at the next positions, all at once (each op over
    /// every token's rows, attention causal over the batch and as each
    /// token's indexer picks; experts picked on the host, a token at a
    /// time); returns the last token's logits.
    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>, LoadError> {
        let model = self.model;
        let n_vocab = model.n_vocab();
        let n = tokens.len();
        if n == 0 {
            return Err(fwd("no tokens to feed"));
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(fwd(format!(
                "token {t} is outside the vocabulary of {n_vocab}"
            )));
        }
        let cx = &self.cx;
        let h = model.handles();
        let eps = model.hparams().eps;
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let ids = cx.ops().upload_i32(&ids, &[n]).map_err(op_err)?;
        let te = cx.weight(h.token_embd);
        let mut x = cx.device().get_rows(te, &ids)?;
        let batch_heads;
        let heads = if n == 1 {
            &self.heads
        } else {
            batch_heads = mla::head_ids(cx, n, self.mla.n_head)?;
            &batch_heads
        };
        let mut selection: Option<Selection> = None;
        for (il, (layer, lh)) in self.layers.iter_mut().zip(&h.layers).enumerate() {
            let a_in = cx.rms_norm(&x, lh.attn_norm, eps)?;
            let qr = mla::latent_query(cx, &layer.attn, &self.mla, &a_in)?;
            if let (Some(ix), Some(keys)) = (&layer.indexer, &mut layer.keys) {
                selection = Some(indexer::select(
                    cx,
                    ix,
                    &self.indexer,
                    keys,
                    &a_in,
                    &qr,
                    self.pos,
                )?);
            }
            let sel = selection
                .as_mut()
                .ok_or_else(|| fwd(format!("layer {il} shares a selection no layer made")))?;
            let mask = sel.attn_mask(cx)?;
            let a = mla::attend(
                cx,
                &layer.attn,
                &self.mla,
                &mut layer.cache,
                heads,
                &a_in,
                &qr,
                self.pos,
                mask,
            )?;
            x = cx.ops().add(&x, &a).map_err(op_err)?;
            let f_in = cx.rms_norm(&x, lh.ffn_norm, eps)?;
            let f = match &layer.ffn {
                FfnBlock::Dense(f) => moe::swiglu_ffn(cx, f, &f_in)?,
                FfnBlock::Routed(m) => moe::routed_ffn(cx, m, &self.routing, self.staging, &f_in)?,
            };
            x = cx.ops().add(&x, &f).map_err(op_err)?;
        }
        // Only the last token's logits are asked for.
        let last = if n == 1 { x } else { cx.rows_of(&x, n - 1..n)? };
        let last = cx.rms_norm(&last, h.output_norm, eps)?;
        let logits = cx.matmul(h.output, &last)?;
        self.pos += n;
        cx.read_back(&logits)
    }
}

impl Decoder for DeviceDecoder<'_> {
    fn prefill(&mut self, tokens: &[u32]) -> Result<Vec<f32>, LoadError> {
        if tokens.is_empty() {
            return Err(LoadError::empty_prompt());
        }
        let mut logits = Vec::new();
        for chunk in tokens.chunks(PREFILL_BATCH) {
            logits = self.forward(chunk)?;
        }
        Ok(logits)
    }

    fn step(&mut self, token: u32) -> Result<Vec<f32>, LoadError> {
        self.forward(&[token])
    }

    fn traffic(&self) -> Traffic {
        self.cx.traffic()
    }
}
