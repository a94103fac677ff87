//! glm5-next decoding through the device op layer ([`device_ops::Ops`]):
//! the forward pass of [`crate::forward`] (the host reference) composed
//! from the kit's blocks ([`family_kit::blocks`]) and glm5_next's ops,
//! its state on the device, a token at a time.
//!
//! - Every product reads the staged weight in place; norm gains, biases,
//!   mHC's scales and bases, the short convolutions' kernels and KDA's
//!   gates' parameters are dequantized on the device once and kept there.
//! - mHC: the `hc` streams stay on the device as one row; the mixes are a
//!   product, the weights and the Sinkhorn combination one op
//!   ([`device_ops::Ops::hc_weights`]), the layer input and the streams
//!   after the layer the fused `hc_pre_weighted` / `hc_post_mixed`.
//! - KDA: the short convolutions' windows (`ssm_conv`) and the delta
//!   rule's states (`delta_net` with a gate a key channel,
//!   [`device_ops::Ops::kda_gate`]) on the device, written in place.
//! - MLA without a rope part ([`mla::attend_slots`] over the k-pool's slot
//!   list where llama.cpp gathers, [`mla::attend`] over the cache with the
//!   selection as a mask where it scatters), its latent cache and the
//!   k-pool's keys, gates and pooled keys ([`kpool::KpoolCache`]) in the K
//!   cache's type (F32 or F16).
//! - What comes back to the host (activations, never weights): the pools'
//!   scores of each full MLA layer (the slot list is made on the host, as
//!   the host path makes it, [`kpool::slots`]), the router's logits where
//!   experts are staged on first pick (the picks are the host path's own
//!   routing; the router's bias read from its host bytes), and the logits.
//!   With every bank staged whole before the first token (`--stage all`,
//!   [`ExpertStaging::All`]: each bank a separate whole-stack weight, the
//!   kit's `LoadedWeights::whole_stack`) the routing stays on the device.

use std::rc::Rc;

use device_ops::{AttnMask, DType, DeviceTensor, Gating, GgmlRope, HcSinkhorn, Ops, RopeMode};
use family_kit::blocks::BlockContext;
use family_kit::blocks::context::op_err;
use family_kit::blocks::kpool::{self, KpoolCache, KpoolShape, KpoolWeights};
use family_kit::blocks::mla::{self, LatentCache, MlaShape, MlaWeights};
use family_kit::blocks::moe::{self, RoutedWeights, RoutingRule, SwigluClamps, SwigluWeights};
use family_kit::{Decoder, ExpertStaging, Handle, LoadError, Numerics, Traffic};
use seam::platform::{Platform, Queue};
use seam::weight::Weight;

use crate::Glm5Next;
use crate::forward::L2_EPS;
use crate::model::{Ffn, HcHandles, KdaHandles, Mixer};

fn fwd(why: impl Into<String>) -> LoadError {
    LoadError::Forward(why.into())
}

/// A KDA layer's weights and state on the device.
struct KdaDev {
    w: KdaHandles,
    /// The q, k, v short convolutions' kernels (`[d_inner, d_conv]`).
    conv_w: [DeviceTensor; 3],
    /// Their windows (`[d_conv - 1, d_inner]`).
    conv: [DeviceTensor; 3],
    /// The delta rule's state of each head (`[n_head, S, S]`).
    state: DeviceTensor,
}

/// An MLA layer's blocks and state.
struct MlaDev {
    attn: MlaWeights,
    indexer: Option<(KpoolWeights, KpoolCache)>,
    cache: LatentCache,
}

enum MixerDev {
    Kda(Box<KdaDev>),
    Mla(Box<MlaDev>),
}

enum FfnBlock {
    Dense(SwigluWeights),
    Routed(RoutedWeights),
}

/// One layer's blocks and state.
struct LayerDev {
    hc_attn: HcHandles,
    hc_ffn: HcHandles,
    attn_norm: Handle,
    ffn_norm: Handle,
    mixer: MixerDev,
    ffn: FfnBlock,
    routing: RoutingRule,
    clamps: SwigluClamps,
}

/// glm5-next's decoder on a device: the forward pass composed from the
/// kit's blocks over [`Ops`], a token at a time.
pub struct DeviceDecoder<'m> {
    model: &'m Glm5Next,
    cx: BlockContext<'m>,
    layers: Vec<LayerDev>,
    mla: MlaShape,
    kpool: KpoolShape,
    sinkhorn: HcSinkhorn,
    /// `0..n_head`: MLA's per-head picks of `k_b` and `v_b`.
    heads: DeviceTensor,
    /// `hc` ones: the streams' mean is their sum weighed by these.
    ones: DeviceTensor,
    staging: ExpertStaging,
    pos: usize,
    /// The prompt's length (the pool-score row during the prompt).
    n_prefill: usize,
}

impl std::fmt::Debug for DeviceDecoder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceDecoder")
            .field("device", &self.cx.ops().device_name())
            .field("pos", &self.pos)
            .finish()
    }
}

fn swiglu(w: [Handle; 3]) -> SwigluWeights {
    SwigluWeights {
        w,
        scale: [None; 3],
    }
}

impl<'m> DeviceDecoder<'m> {
    /// A decoder of `model` whose weights are staged on `platform` through
    /// `queue` and multiplied by `ops` (that platform's op layer), at
    /// position 0, for a prompt of `n_prefill` tokens (as
    /// [`crate::forward::State::new`]; [`Decoder::prefill`] at position 0
    /// sets it), its experts staged as `staging` says (every bank and
    /// every dense weight staged now for [`ExpertStaging::All`]).
    ///
    /// # Errors
    ///
    /// Flash attention or a cache type the device path does not keep, a
    /// weight the seam could not stage, or the device failed.
    pub fn new(
        model: &'m Glm5Next,
        platform: &'m dyn Platform,
        queue: &'m dyn Queue,
        ops: Box<dyn Ops + 'm>,
        staging: ExpertStaging,
        n_prefill: usize,
        numerics: Numerics,
    ) -> Result<DeviceDecoder<'m>, LoadError> {
        let dtype = mla::latent_dtype(numerics)?;
        let cx = BlockContext::new(Rc::from(ops), platform, queue, model.weights());
        let hp = model.hparams();
        let h = model.handles();
        let mla = MlaShape {
            n_head: hp.n_head,
            head_dim_nope: hp.dk,
            head_dim_rope: 0,
            head_dim_v: hp.dv,
            kv_lora: hp.kv_lora,
            eps: hp.eps,
            // No rope part: never applied.
            rope: GgmlRope::plain(0, RopeMode::Normal, 1e4),
        };
        let kpool = model.kpool_shape();
        let (nh, s, di) = (hp.n_head, hp.kda_head_dim, hp.d_inner());
        let mut layers = Vec::with_capacity(h.layers.len());
        for (il, l) in h.layers.iter().enumerate() {
            let mixer = match l.mixer {
                Mixer::Kda(w) => {
                    let zeros = || {
                        cx.ops()
                            .zeros(DType::F32, &[hp.d_conv - 1, di])
                            .map_err(op_err)
                    };
                    let kernel = |h: Handle| -> Result<DeviceTensor, LoadError> {
                        let k = cx.small(h)?;
                        cx.ops()
                            .slice_cols(&k, 0, di * hp.d_conv)
                            .and_then(|t| t.reshape(&[di, hp.d_conv]))
                            .map_err(op_err)
                    };
                    MixerDev::Kda(Box::new(KdaDev {
                        w,
                        conv_w: [kernel(w.conv[0])?, kernel(w.conv[1])?, kernel(w.conv[2])?],
                        conv: [zeros()?, zeros()?, zeros()?],
                        state: cx.ops().zeros(DType::F32, &[nh, s, s]).map_err(op_err)?,
                    }))
                }
                Mixer::Mla(m) => MixerDev::Mla(Box::new(MlaDev {
                    attn: m.mla,
                    indexer: match m.indexer {
                        Some(ix) => Some((ix, KpoolCache::new(&cx, &kpool, dtype)?)),
                        None => None,
                    },
                    cache: LatentCache::new(&cx, &mla, dtype)?,
                })),
            };
            let ffn = match l.ffn {
                Ffn::Dense(w) => FfnBlock::Dense(swiglu(w)),
                Ffn::Moe {
                    router,
                    bias,
                    banks,
                    shared,
                } => {
                    let each = banks.each();
                    FfnBlock::Routed(RoutedWeights {
                        router,
                        bias: Some(bias),
                        stacks: each.map(|(h, _)| h),
                        expert_roles: each.map(|(_, r)| r),
                        stack_scales: [None; 3],
                        shared: Some(swiglu(shared)),
                    })
                }
            };
            layers.push(LayerDev {
                hc_attn: l.hc_attn,
                hc_ffn: l.hc_ffn,
                attn_norm: l.attn_norm,
                ffn_norm: l.ffn_norm,
                mixer,
                ffn,
                routing: RoutingRule {
                    gating: Gating::Sigmoid,
                    k: hp.n_expert_used[il],
                    normalize: hp.expert_weights_norm,
                    scale: hp.expert_weights_scale,
                },
                clamps: SwigluClamps {
                    experts: SwigluClamps::limit(hp.clamp_exp[il]),
                    shared: SwigluClamps::limit(hp.clamp_shexp[il]),
                },
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
        let ones = cx
            .ops()
            .upload_f32(&vec![1.0; hp.hc], &[hp.hc])
            .map_err(op_err)?;
        Ok(DeviceDecoder {
            model,
            cx,
            layers,
            mla,
            kpool,
            sinkhorn: HcSinkhorn {
                hc: hp.hc,
                eps: hp.hc_eps,
                iters: hp.sinkhorn_iters,
            },
            heads,
            ones,
            staging,
            pos: 0,
            n_prefill,
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

    /// Feeds `token` at the next position; returns its logits.
    ///
    /// # Errors
    ///
    /// The token is out of the vocabulary, a weight the seam could not
    /// stage, or an op failed.
    pub fn step(&mut self, token: u32) -> Result<Vec<f32>, LoadError> {
        let streams = self.feed(token)?;
        let logits = self.head(&streams)?;
        self.cx.read_back(&logits)
    }

    /// The output head over the streams of the last token fed:
    /// `build_hc_mean` (the streams added in order, then times 1/hc), the
    /// output norm and the output projection; the logits on the device.
    fn head(&self, streams: &DeviceTensor) -> Result<DeviceTensor, LoadError> {
        let hp = self.model.hparams();
        let h = self.model.handles();
        let cx = &self.cx;
        let mean = cx
            .ops()
            .hc_pre_weighted(streams, &self.ones, 1.0 / hp.hc as f32)
            .map_err(op_err)?;
        let mean = cx.rms_norm(&mean, h.output_norm, hp.eps)?;
        cx.matmul(h.output, &mean)
    }

    /// Feeds `token` at the next position through every layer; its
    /// streams (`[1, hc · E]`) on the device.
    fn feed(&mut self, token: u32) -> Result<DeviceTensor, LoadError> {
        let model = self.model;
        let n_vocab = model.n_vocab();
        if token as usize >= n_vocab {
            return Err(fwd(format!(
                "token {token} is outside the vocabulary of {n_vocab}"
            )));
        }
        let hp = model.hparams();
        let h = model.handles();
        let (hc, n_embd, eps) = (hp.hc, hp.n_embd, hp.eps);
        let cx = &self.cx;
        let ops = cx.ops();
        // The streams: the token's embedding in each, as one row.
        let ids = ops
            .upload_i32(&vec![token as i32; hc], &[hc])
            .map_err(op_err)?;
        let te = cx.weight(h.token_embd);
        let mut streams = cx
            .device()
            .get_rows(te, &ids)?
            .reshape(&[1, hc * n_embd])
            .map_err(op_err)?;
        let mut selection: Option<Vec<Option<usize>>> = None;
        for (il, layer) in self.layers.iter_mut().enumerate() {
            let (x, post, comb) = hc_pre(cx, &self.sinkhorn, &streams, &layer.hc_attn, eps)?;
            let x = cx.rms_norm(&x, layer.attn_norm, eps)?;
            let y = match &mut layer.mixer {
                MixerDev::Kda(k) => kda(cx, model, k, &x)?,
                MixerDev::Mla(m) => {
                    let qr = mla::latent_query(cx, &m.attn, &self.mla, &x)?;
                    if let Some((w, cache)) = &mut m.indexer {
                        selection = Some(kpool::select(
                            cx,
                            w,
                            &self.kpool,
                            cache,
                            &x,
                            &qr,
                            self.pos,
                            self.n_prefill,
                        )?);
                    }
                    let sel = selection.as_deref().ok_or_else(|| {
                        fwd(format!("layer {il} shares a selection no layer made"))
                    })?;
                    if kpool::is_gathered(1, sel.len()) {
                        let slots = kpool::slot_ids(cx, sel)?;
                        mla::attend_slots(
                            cx,
                            &m.attn,
                            &self.mla,
                            &mut m.cache,
                            &self.heads,
                            &x,
                            &qr,
                            self.pos,
                            &slots,
                        )?
                    } else {
                        let mask = kpool::scattered_mask(cx, sel, self.pos)?;
                        mla::attend(
                            cx,
                            &m.attn,
                            &self.mla,
                            &mut m.cache,
                            &self.heads,
                            &x,
                            &qr,
                            self.pos,
                            AttnMask::Additive(&mask),
                        )?
                    }
                }
            };
            streams = hc_post(cx, &y, &streams, &post, &comb)?;
            let (x, post, comb) = hc_pre(cx, &self.sinkhorn, &streams, &layer.hc_ffn, eps)?;
            let x = cx.rms_norm(&x, layer.ffn_norm, eps)?;
            let y = match &layer.ffn {
                FfnBlock::Dense(f) => moe::swiglu_ffn_clamped(cx, f, layer.clamps.shared, &x)?,
                FfnBlock::Routed(m) => {
                    moe::routed_ffn_clamped(cx, m, &layer.routing, layer.clamps, self.staging, &x)?
                }
            };
            streams = hc_post(cx, &y, &streams, &post, &comb)?;
        }
        self.pos += 1;
        Ok(streams)
    }
}

/// mHC pre (`build_hc_pre`) of the streams (`[1, hc · E]`): the layer
/// input `[1, E]`, the post weights and the combination.
fn hc_pre(
    cx: &BlockContext<'_>,
    sinkhorn: &HcSinkhorn,
    streams: &DeviceTensor,
    w: &HcHandles,
    eps: f32,
) -> Result<(DeviceTensor, DeviceTensor, DeviceTensor), LoadError> {
    let ops = cx.ops();
    let flat = ops
        .rms_norm(streams, eps, device_ops::NormWeight::None)
        .map_err(op_err)?;
    let mix = cx.matmul(w.fn_, &flat)?;
    let (pre, post, comb) = ops
        .hc_weights(&mix, &*cx.small(w.scale)?, &*cx.small(w.base)?, sinkhorn)
        .map_err(op_err)?;
    let x = ops.hc_pre_weighted(streams, &pre, 1.0).map_err(op_err)?;
    Ok((x, post, comb))
}

/// mHC post: the streams after a layer's output `y`, as one row.
fn hc_post(
    cx: &BlockContext<'_>,
    y: &DeviceTensor,
    streams: &DeviceTensor,
    post: &DeviceTensor,
    comb: &DeviceTensor,
) -> Result<DeviceTensor, LoadError> {
    let n = streams.len();
    cx.ops()
        .hc_post_mixed(y, streams, post, comb)
        .and_then(|t| t.reshape(&[1, n]))
        .map_err(op_err)
}

/// A KDA layer of one token (`x` `[1, E]`, normed): the short
/// convolutions, the gate a key channel, the delta rule, the per-head
/// norm gated by the output gate, the output projection.
fn kda(
    cx: &BlockContext<'_>,
    model: &Glm5Next,
    k: &mut KdaDev,
    x: &DeviceTensor,
) -> Result<DeviceTensor, LoadError> {
    let hp = model.hparams();
    let (nh, s, di) = (hp.n_head, hp.kda_head_dim, hp.d_inner());
    let ops = cx.ops();
    let w = &k.w;
    let mut qkv = Vec::with_capacity(3);
    for i in 0..3 {
        let u = cx.matmul(w.qkv[i], x)?;
        qkv.push(
            ops.ssm_conv(&mut k.conv[i], &u, &k.conv_w[i])
                .map_err(op_err)?,
        );
    }
    let g = cx.matmul(w.f_b, &cx.matmul(w.f_a, x)?)?;
    let g = ops
        .kda_gate(
            &g,
            &*cx.small(w.dt_bias)?,
            &*cx.small(w.a)?,
            hp.gate_lower_bound,
        )
        .map_err(op_err)?;
    let beta = ops.sigmoid(&cx.matmul(w.beta, x)?).map_err(op_err)?;
    let g2 = cx.matmul(w.g_b, &cx.matmul(w.g_a, x)?)?;
    let mut qkv = qkv.into_iter();
    let (q, kk, v) = match (qkv.next(), qkv.next(), qkv.next()) {
        (Some(q), Some(k), Some(v)) => (q, k, v),
        _ => unreachable!("three projections"),
    };
    let unit = |t: DeviceTensor| -> Result<DeviceTensor, LoadError> {
        t.reshape(&[nh, s])
            .and_then(|t| ops.l2_norm(&t, L2_EPS))
            .and_then(|t| t.reshape(&[1, di]))
            .map_err(op_err)
    };
    let (q, kk) = (unit(q)?, unit(kk)?);
    let out = ops
        .delta_net(&mut k.state, [&q, &kk, &v], &g, &beta)
        .and_then(|t| t.reshape(&[nh, s]))
        .map_err(op_err)?;
    let out = cx.rms_norm(&out, w.norm, hp.eps)?;
    let out = g2
        .reshape(&[nh, s])
        .and_then(|g2| ops.mul_sigmoid(&out, &g2))
        .and_then(|t| t.reshape(&[1, di]))
        .map_err(op_err)?;
    cx.matmul(w.out, &out)
}

impl Decoder for DeviceDecoder<'_> {
    fn prefill(&mut self, tokens: &[u32]) -> Result<Vec<f32>, LoadError> {
        // Only the last token's logits are wanted: the others skip the
        // output head and nothing of theirs is read back, so the host
        // queues token after token without waiting for the device.
        let (&last, rest) = tokens.split_last().ok_or_else(LoadError::empty_prompt)?;
        if self.pos == 0 {
            self.n_prefill = tokens.len();
        }
        for &t in rest {
            self.feed(t)?;
        }
        self.step(last)
    }

    fn step(&mut self, token: u32) -> Result<Vec<f32>, LoadError> {
        DeviceDecoder::step(self, token)
    }

    fn traffic(&self) -> Traffic {
        self.cx.traffic()
    }
}
