//! qwen4exp decoding through the device op layer ([`device_ops::Ops`]):
//! the forward pass of [`crate::forward`] (the host reference) composed
//! from the ops, its state on the device.
//!
//! - Every product reads the staged weight in place ([`Ops::matmul`] on
//!   what [`seam::resident_weight`] hands out); small tensors (norm gains,
//!   conv kernels, biases, scales) are dequantized on the device once and
//!   kept there.
//! - State on the device: per attention layer a [`KvCache`] (grown by
//!   doubling), per GDN layer its conv window and delta-rule matrices, the
//!   PLE layer's dilated conv as one conv window per phase of the n-gram
//!   (a conv of dilation `n` is `n` interleaved convs of dilation 1), the
//!   `hc` residual streams as one `[hc, E]` tensor (`[n · hc, E]` for a
//!   batch of `n` prompt tokens).
//! - Hyper-connections compose from the ops: the per-stream norms are
//!   `rms_norm` rows times the `[hc, E]` gains, the stream sum a
//!   [`Ops::mix_experts`] of the streams with weight `1/hc`, the combine a
//!   `mix_experts` of the output repeated over the streams with the
//!   per-stream factors.
//! - What comes back to the host (activations, never weights): the
//!   router's logits (the picks follow the host path's stable order
//!   exactly, `softmax` then `argsort` in `f64`, so expert ties pick as
//!   the host does, and the picked experts are staged on first pick as
//!   the host path stages them), the QSA indexer's query and each pooled
//!   block key once (the block scores and `libstdcxx_top_k` on the host;
//!   the selection goes back as an additive mask), the PLE gate's `hc`
//!   dot products (its signed square root on the host), and the logits.
//! - The PLE n-gram table is `expert_streamed`: its rows are read from the
//!   mapping on the host and uploaded (host transfers, no weight read
//!   back), as the host path reads them.

use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use device_ops::{
    Attention, AttnMask, DType, DeviceTensor, KvCache, MultiRope, NormWeight, OpError, Ops,
    OuterFactor,
};
use family_kit::blocks::attention::{FIRST_CTX, new_cache, op_err};
use family_kit::reader::table_row;
use family_kit::{Decoder, ExpertStaging, LoadError, Numerics, Traffic};
use seam::gguf::GgufModel;
use seam::platform::{Platform, Queue};
use seam::weight::Weight;

use crate::forward::{Hyper, PleHyper};
use crate::model::{ExpertKind, Qwen4Exp};

/// Threads staging weights at once for `--stage all` (each with its own
/// queue), as a load spreads over the ring's lanes.
const STAGING_WORKERS: usize = 4;

/// Tokens of a prompt fed at once (llama.cpp's default `n_ubatch`): the
/// activations of a batch are `hc` streams of E per token.
const PREFILL_BATCH: usize = 512;

fn fwd(why: impl Into<String>) -> LoadError {
    LoadError::Forward(why.into())
}

/// A GDN layer's device state.
struct GdnDev {
    conv: DeviceTensor,
    m: DeviceTensor,
}

/// An attention layer's device state and its QSA indexer's.
struct AttnDev {
    cache: KvCache,
    /// Sum of the raw indexer keys of the block being filled.
    kraw_sum: Option<DeviceTensor>,
    /// Raw indexer keys in the block being filled.
    kraw_n: usize,
    /// Pooled, normed, roped block keys (read back once each).
    pooled: Vec<Vec<f32>>,
}

enum LayerDev {
    Gdn(GdnDev),
    Attn(AttnDev),
}

/// qwen4exp's decoder on a device: the forward pass composed from
/// [`Ops`]. A prompt goes in batches of up to 512 tokens, each op
/// over every token's rows (attention causal over the batch); what the
/// host decides per token (expert picks staged on first pick, the QSA
/// selection, the PLE gate) stays a token at a time inside the batch.
pub struct DeviceDecoder<'m> {
    model: &'m Qwen4Exp,
    platform: &'m dyn Platform,
    queue: &'m dyn Queue,
    /// Shared with whatever else computes on the same op layer (dflash's
    /// draft reads nothing of this decoder's state, only its ops).
    ops: Rc<dyn Ops + 'm>,
    hp: Hyper,
    n_vocab: usize,
    output: &'static str,
    /// Small tensors dequantized on the device, by name.
    small: HashMap<String, Arc<DeviceTensor>>,
    layers: Vec<LayerDev>,
    /// The PLE conv windows, one per phase of the n-gram.
    ple_conv: Vec<DeviceTensor>,
    tokens: Vec<u32>,
    /// `[1, hc]` of `1 / hc`: the stream mean's weights.
    inv_hc: DeviceTensor,
    /// `[1, n_embd]` of ones: the PLE stream dots' other operand.
    ones_embd: DeviceTensor,
    /// `[n, hc]` of ones for the batch of `n` tokens in flight (the
    /// batched stream sums' weights), kept while `n` stays.
    batch_ones: Option<DeviceTensor>,
    /// Read-backs made (the op counters count uploads with them).
    read_backs: std::cell::Cell<u64>,
    /// Every expert stack staged whole: the router's picks stay on the
    /// device ([`DeviceDecoder::with_every_expert_staged`]).
    stacks_staged: bool,
}

/// The device caches' element type for `numerics`
/// ([`family_kit::blocks::attention::cache_dtype`]).
///
/// # Errors
///
/// As that function.
pub fn kv_dtype(numerics: Numerics) -> Result<DType, LoadError> {
    family_kit::blocks::attention::cache_dtype(numerics)
}

impl std::fmt::Debug for DeviceDecoder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceDecoder")
            .field("device", &self.ops.device_name())
            .field("pos", &self.tokens.len())
            .finish()
    }
}

impl<'m> DeviceDecoder<'m> {
    /// The QSA indexer's pooled block keys of layer `il` so far, read back
    /// once each (the host path's bits), `None` for a layer without
    /// attention.
    pub fn qsa_pooled_keys(&self, il: usize) -> Option<&[Vec<f32>]> {
        match self.layers.get(il)? {
            LayerDev::Attn(st) => Some(&st.pooled),
            LayerDev::Gdn(_) => None,
        }
    }

    /// A decoder of `model` (loaded from `gguf`) whose weights are staged
    /// on `platform` through `queue` and multiplied by `ops` (that
    /// platform's op layer), at position 0.
    ///
    /// # Errors
    ///
    /// The model does not fit the forward pass, or the device failed.
    pub fn new(
        model: &'m Qwen4Exp,
        gguf: &'m GgufModel,
        platform: &'m dyn Platform,
        queue: &'m dyn Queue,
        ops: Box<dyn Ops + 'm>,
        numerics: Numerics,
    ) -> Result<DeviceDecoder<'m>, LoadError> {
        DeviceDecoder::with_shared_ops(model, gguf, platform, queue, Rc::from(ops), numerics)
    }

    /// As [`DeviceDecoder::new`], on an op layer shared with others (a
    /// second sequence of the same model, a draft model): tensors made by
    /// one user of `ops` are the others' inputs, and its counters count
    /// them all.
    ///
    /// # Errors
    ///
    /// As [`DeviceDecoder::new`].
    pub fn with_shared_ops(
        model: &'m Qwen4Exp,
        gguf: &'m GgufModel,
        platform: &'m dyn Platform,
        queue: &'m dyn Queue,
        ops: Rc<dyn Ops + 'm>,
        numerics: Numerics,
    ) -> Result<DeviceDecoder<'m>, LoadError> {
        let kv_dtype = kv_dtype(numerics)?;
        // The host reference's checks (every tensor, every count).
        let host = crate::forward::Model::new(crate::engine::SeamWeights::new(
            model, gguf, platform, queue,
        ))
        .map_err(|e| fwd(e.to_string()))?;
        let hp = host.hyper().clone();
        let n_vocab = host.n_vocab();
        let output = if gguf.tensor("output.weight").is_some() {
            "output.weight"
        } else {
            "token_embd.weight"
        };
        if let Some(p) = &hp.ple
            && p.conv_kernel < 2
        {
            return Err(fwd("a PLE conv kernel below 2 has no device path"));
        }
        let mut layers = Vec::with_capacity(hp.n_layer);
        let s = hp.ssm_state;
        let cd = s * (2 * hp.ssm_k_heads + hp.ssm_v_heads);
        for il in 0..hp.n_layer {
            layers.push(if hp.recurrent[il] {
                LayerDev::Gdn(GdnDev {
                    conv: ops
                        .zeros(DType::F32, &[hp.ssm_conv - 1, cd])
                        .map_err(op_err)?,
                    m: ops
                        .zeros(DType::F32, &[hp.ssm_v_heads, s, s])
                        .map_err(op_err)?,
                })
            } else {
                LayerDev::Attn(AttnDev {
                    cache: new_cache(&*ops, hp.n_head_kv[il], hp.head_dim, FIRST_CTX, kv_dtype)?,
                    kraw_sum: None,
                    kraw_n: 0,
                    pooled: Vec::new(),
                })
            });
        }
        let ple_conv = match &hp.ple {
            Some(p) => (0..p.ngram)
                .map(|_| {
                    ops.zeros(DType::F32, &[p.conv_kernel - 1, hp.hc * hp.n_embd])
                        .map_err(op_err)
                })
                .collect::<Result<_, _>>()?,
            None => Vec::new(),
        };
        let inv_hc = ops
            .upload_f32(&vec![1.0 / hp.hc as f32; hp.hc], &[1, hp.hc])
            .map_err(op_err)?;
        let ones_embd = ops
            .upload_f32(&vec![1.0; hp.n_embd], &[1, hp.n_embd])
            .map_err(op_err)?;
        Ok(DeviceDecoder {
            model,
            platform,
            queue,
            ops,
            hp,
            n_vocab,
            output,
            small: HashMap::new(),
            layers,
            ple_conv,
            tokens: Vec::new(),
            inv_hc,
            ones_embd,
            batch_ones: None,
            read_backs: std::cell::Cell::new(0),
            stacks_staged: false,
        })
    }

    /// This decoder with every dense weight and every expert stack staged
    /// whole now (`--stage all`), in parallel: the MoE layers then route on
    /// the device and multiply the picked experts by device-side ids
    /// ([`Ops::route`], [`Ops::matmul_id`]), so nothing of the router comes
    /// to the host. The PLE table is never staged (its rows are read from
    /// the mapping, as on the other path).
    ///
    /// # Errors
    ///
    /// The seam failed to stage a weight.
    pub fn with_every_expert_staged(mut self) -> Result<Self, LoadError> {
        let mut all: Vec<&Weight> = self.model.dense_weights().collect();
        for il in 0..self.hp.n_layer {
            for kind in [ExpertKind::Gate, ExpertKind::Up, ExpertKind::Down] {
                let w = self
                    .model
                    .whole_expert_stack(il, kind)
                    .map_err(|e| fwd(e.to_string()))?;
                if !all.iter().any(|&x| std::ptr::eq(x, w)) {
                    all.push(w);
                }
            }
        }
        family_kit::weights::stage_in_parallel(&all, self.platform, STAGING_WORKERS)?;
        self.stacks_staged = true;
        Ok(self)
    }

    /// This decoder staging its experts as `staging` says: as it is for
    /// [`ExpertStaging::OnPick`], else
    /// [`DeviceDecoder::with_every_expert_staged`].
    ///
    /// # Errors
    ///
    /// As [`DeviceDecoder::with_every_expert_staged`].
    pub fn with_staging(self, staging: ExpertStaging) -> Result<Self, LoadError> {
        match staging {
            ExpertStaging::All => self.with_every_expert_staged(),
            ExpertStaging::OnPick => Ok(self),
        }
    }

    /// How this decoder stages its experts.
    pub fn staging(&self) -> ExpertStaging {
        if self.stacks_staged {
            ExpertStaging::All
        } else {
            ExpertStaging::OnPick
        }
    }

    /// The op layer (its counters).
    pub fn ops(&self) -> &dyn Ops {
        &*self.ops
    }

    /// The op layer, to share ([`DeviceDecoder::with_shared_ops`]).
    pub fn shared_ops(&self) -> Rc<dyn Ops + 'm> {
        Rc::clone(&self.ops)
    }

    /// Positions fed so far.
    pub fn position(&self) -> usize {
        self.tokens.len()
    }

    /// Feeds `token` at the next position, as [`Decoder::step`] does; its
    /// logits and the hidden state after each layer of `taps` (0-based,
    /// any order, repeats allowed): the mean of the `hc` residual streams,
    /// as the host path's `Model::step_taps` gives it. The taps come back
    /// to the host (activations, `taps.len() · n_embd` values).
    ///
    /// # Errors
    ///
    /// A tap layer out of range, or as [`Decoder::step`].
    pub fn step_taps(
        &mut self,
        token: u32,
        taps: &[usize],
    ) -> Result<(Vec<f32>, Vec<Vec<f32>>), LoadError> {
        if let Some(&l) = taps.iter().find(|&&l| l >= self.hp.n_layer) {
            return Err(fwd(format!(
                "tap layer {l} is not below the layer count {}",
                self.hp.n_layer
            )));
        }
        self.forward(&[token], taps)
    }

    /// Small tensors kept dequantized on the device.
    pub fn kept(&self) -> usize {
        self.small.len()
    }

    /// `t` back on the host (activations only), counted.
    fn read_back(&self, t: &DeviceTensor) -> Result<Vec<f32>, OpError> {
        self.read_backs.set(self.read_backs.get() + 1);
        self.ops.read_back(t)
    }

    /// The claimed dense weight `name`.
    fn weight(&self, name: &str) -> Result<&'m Weight, LoadError> {
        let w = self
            .model
            .weight(name)
            .ok_or_else(|| fwd(format!("{name}: no such weight")))?;
        if w.flags().expert_streamed {
            return Err(fwd(format!("{name} is read in slices, never whole")));
        }
        Ok(w)
    }

    /// `w · x`, the weight read where the seam staged it.
    fn mm_w(&self, w: &Weight, x: &DeviceTensor) -> Result<DeviceTensor, LoadError> {
        let r = seam::resident_weight(w, self.platform, self.queue)
            .map_err(|e| fwd(format!("{}: {e}", w.name())))?;
        self.ops.matmul(w, &r, x).map_err(op_err)
    }

    /// The matrix `name` times `x`.
    fn mm(&self, name: &str, x: &DeviceTensor) -> Result<DeviceTensor, LoadError> {
        self.mm_w(self.weight(name)?, x)
    }

    /// The small tensor `name` dequantized on the device in `shape`
    /// (the same shape at every use), kept there.
    fn small(&mut self, name: &str, shape: &[usize]) -> Result<Arc<DeviceTensor>, LoadError> {
        if let Some(t) = self.small.get(name) {
            return Ok(Arc::clone(t));
        }
        let w = self.weight(name)?;
        let r = seam::resident_weight(w, self.platform, self.queue)
            .map_err(|e| fwd(format!("{name}: {e}")))?;
        let t = Arc::new(
            self.ops
                .dequantize(w, &r)
                .and_then(|t| t.reshape(shape))
                .map_err(op_err)?,
        );
        self.small.insert(name.to_owned(), Arc::clone(&t));
        Ok(t)
    }

    /// `weight(base) · x`, times `base.scale` where the file has it.
    fn mm_scaled(&mut self, base: &str, x: &DeviceTensor) -> Result<DeviceTensor, LoadError> {
        let y = self.mm(&format!("{base}.weight"), x)?;
        let sname = format!("{base}.scale");
        if let Some(w) = self.model.weight(&sname) {
            // The first element, as the host path reads it.
            let n = usize::try_from(w.dims().iter().product::<u64>())
                .map_err(|_| fwd(format!("{sname}: too many elements")))?;
            let s = self.small(&sname, &[1, n])?;
            if n == 1 {
                return self.ops.mul(&y, &s).map_err(op_err);
            }
            let first = self.ops.slice_cols(&s, 0, 1).map_err(op_err)?;
            return self.ops.mul(&y, &first).map_err(op_err);
        }
        Ok(y)
    }

    /// `y` times element `e` of the per-expert scale `base.scale`, if any.
    fn expert_scaled(
        &mut self,
        base: &str,
        e: usize,
        y: DeviceTensor,
    ) -> Result<DeviceTensor, LoadError> {
        let sname = format!("{base}.scale");
        if self.model.weight(&sname).is_none() {
            return Ok(y);
        }
        let n = self.model.hparams().n_expert as usize;
        let s = self.small(&sname, &[1, n])?;
        let s = self.ops.slice_cols(&s, e, 1).map_err(op_err)?;
        self.ops.mul(&y, &s).map_err(op_err)
    }

    /// Per-stream RMSNorm of `r` (`[hc, E]`, or `[n · hc, E]` for `n`
    /// tokens) times the gains `[hc · E]`, in `r`'s shape.
    fn stream_norm(&mut self, r: &DeviceTensor, gains: &str) -> Result<DeviceTensor, LoadError> {
        let (e, hc) = (self.hp.n_embd, self.hp.hc);
        let g = self.small(gains, &[hc, e])?;
        // Row `i` of `r` is stream `i % hc`: the gains row by row.
        self.ops
            .rms_norm(r, self.hp.eps as f32, NormWeight::Scale(&g))
            .map_err(op_err)
    }

    /// The stream index tensor of `n` tokens: `I32 [n · hc]`, token `t`'s
    /// `hc` rows each `t` (a per-token value repeated over its streams).
    fn token_of_stream(&self, n: usize) -> Result<DeviceTensor, LoadError> {
        let ids: Vec<i32> = (0..n)
            .flat_map(|t| std::iter::repeat_n(t as i32, self.hp.hc))
            .collect();
        self.ops.upload_i32(&ids, &[ids.len()]).map_err(op_err)
    }

    /// Rows `rows` of `x` (`[n, cols]`): `[rows.len(), cols]`.
    fn rows_of(
        &self,
        x: &DeviceTensor,
        rows: std::ops::Range<usize>,
    ) -> Result<DeviceTensor, LoadError> {
        let ids: Vec<i32> = rows.map(|r| r as i32).collect();
        let ids = self.ops.upload_i32(&ids, &[ids.len()]).map_err(op_err)?;
        self.ops.gather_rows(x, &ids).map_err(op_err)
    }

    /// HC_MIX of `n` tokens' streams (`r`, `[n · hc, E]`): the mixed
    /// inputs `[n, E]` and the inject logits `[n, hc]`.
    fn hc_mix(
        &mut self,
        r: &DeviceTensor,
        pre: &str,
        inject: bool,
    ) -> Result<(DeviceTensor, Option<DeviceTensor>), LoadError> {
        let (e, hc) = (self.hp.n_embd, self.hp.hc);
        let n = r.len() / (hc * e);
        let flat = self
            .stream_norm(r, &format!("{pre}_norm.weight"))?
            .reshape(&[n, hc * e])
            .map_err(op_err)?;
        let lo = self.mm(&format!("{pre}_down.weight"), &flat)?;
        let lo = self.ops.silu_scaled(&lo, 1.0 / hc as f32).map_err(op_err)?;
        let gate = self.mm(&format!("{pre}_up.weight"), &lo)?;
        let (mixed, flat) = if n == 1 {
            let flat = flat.reshape(&[hc, e]).map_err(op_err)?;
            let mixed = self.ops.gated_mean_rows(&flat, &gate).map_err(op_err)?;
            (mixed, flat.reshape(&[1, hc * e]).map_err(op_err)?)
        } else {
            // gated_mean_rows per token, as its three ops (the same
            // arithmetic by its contract): `x ⊙ sigmoid(g)`, each token's
            // streams added in order (a mix of weights 1, exact), then
            // times `1/hc`.
            let o = &*self.ops;
            let ones = match self.batch_ones.take() {
                Some(t) if t.len() == n * hc => t,
                _ => o.upload_f32(&vec![1.0; n * hc], &[n, hc]).map_err(op_err)?,
            };
            let gated = o
                .mul_sigmoid(&flat, &gate)
                .and_then(|t| t.reshape(&[n, hc, e]))
                .map_err(op_err)?;
            let sum = o.mix_experts(&gated, &ones).map_err(op_err)?;
            self.batch_ones = Some(ones);
            (o.scale(&sum, 1.0 / hc as f32).map_err(op_err)?, flat)
        };
        let inj = if inject {
            Some(self.mm(&format!("{pre}_inject.weight"), &flat)?)
        } else {
            None
        };
        Ok((mixed, inj))
    }

    /// HC_COMBINE: `R[c] += y · 2·sigmoid(inj[c] / hc)` for each of `n`
    /// tokens (`r` `[n · hc, E]`, `y` `[n, E]`, `inj` `[n, hc]`);
    /// `streams` is [`DeviceDecoder::token_of_stream`] of `n > 1`.
    fn hc_combine(
        &self,
        r: &DeviceTensor,
        y: &DeviceTensor,
        inj: &DeviceTensor,
        streams: Option<&DeviceTensor>,
    ) -> Result<DeviceTensor, LoadError> {
        let (e, hc) = (self.hp.n_embd, self.hp.hc);
        let o = &*self.ops;
        let gate = OuterFactor::Sigmoid {
            pre: 1.0 / hc as f32,
            post: 2.0,
        };
        let Some(streams) = streams else {
            return o.add_outer(r, inj, y, gate).map_err(op_err);
        };
        let w = o
            .scale(
                &o.sigmoid(&o.scale(inj, 1.0 / hc as f32).map_err(op_err)?)
                    .map_err(op_err)?,
                2.0,
            )
            .map_err(op_err)?;
        // add_outer per token, as its ops (the same arithmetic by its
        // contract): each token's output repeated over its streams, scaled
        // by the stream's factor, added.
        let rows = r.len() / e;
        let yr = o
            .gather_rows(y, streams)
            .and_then(|t| t.reshape(&[rows, 1, e]))
            .map_err(op_err)?;
        let scaled = o
            .mix_experts(&yr, &w.reshape(&[rows, 1]).map_err(op_err)?)
            .map_err(op_err)?;
        debug_assert_eq!(rows % hc, 0);
        o.add(r, &scaled).map_err(op_err)
    }

    /// One token through GDN layer `il`.
    fn gdn(&mut self, il: usize, b: &str, x: &DeviceTensor) -> Result<DeviceTensor, LoadError> {
        let hp = self.hp.clone();
        let (s, hv, hk) = (hp.ssm_state, hp.ssm_v_heads, hp.ssm_k_heads);
        let eps = hp.eps as f32;
        let kd = s * hk;
        let qkv = self.mm_scaled(&format!("{b}attn_qkv"), x)?;
        let z = self.mm_scaled(&format!("{b}attn_gate"), x)?;
        let beta = self.mm_scaled(&format!("{b}ssm_beta"), x)?;
        let alpha = self.mm_scaled(&format!("{b}ssm_alpha"), x)?;
        let cd = s * (2 * hk + hv);
        let dt = self.small(&format!("{b}ssm_dt.bias"), &[hv])?;
        let a = self.small(&format!("{b}ssm_a"), &[hv])?;
        let conv_w = self.small(&format!("{b}ssm_conv1d.weight"), &[cd, hp.ssm_conv])?;
        let norm = self.small(&format!("{b}ssm_norm.weight"), &[s])?;
        let o = &*self.ops;
        let (g, beta) = o.delta_gates(&alpha, &beta, &dt, &a).map_err(op_err)?;
        let LayerDev::Gdn(st) = &mut self.layers[il] else {
            return Err(fwd(format!("layer {il} is not a GDN layer")));
        };
        let c = o.ssm_conv(&mut st.conv, &qkv, &conv_w).map_err(op_err)?;
        let nt = qkv.len() / cd;
        let heads = |start: usize, n: usize| -> Result<DeviceTensor, OpError> {
            let t = o.slice_cols(&c, start, n * s)?.reshape(&[nt * n, s])?;
            o.l2_norm(&t, eps)?.reshape(&[nt, n * s])
        };
        let qt = heads(0, hk).map_err(op_err)?;
        let kt = heads(kd, hk).map_err(op_err)?;
        let vt = o.slice_cols(&c, 2 * kd, hv * s).map_err(op_err)?;
        let out = o
            .delta_net(&mut st.m, [&qt, &kt, &vt], &g, &beta)
            .map_err(op_err)?;
        let on = o
            .rms_norm(
                &out.reshape(&[nt * hv, s]).map_err(op_err)?,
                eps,
                NormWeight::Scale(&norm),
            )
            .map_err(op_err)?
            .reshape(&[nt, hv * s])
            .map_err(op_err)?;
        let gated = o.mul_sigmoid(&on, &z).map_err(op_err)?;
        self.mm_scaled(&format!("{b}ssm_out"), &gated)
    }

    /// The IMROPE positions of `n` text tokens at `p0, p0 + 1, ...`
    /// (`I32 [n, 4]`, `p, p, p, 0` each).
    fn text_positions(&self, p0: usize, n: usize) -> Result<DeviceTensor, LoadError> {
        let p4: Vec<[usize; 4]> = (p0..p0 + n).map(|p| [p, p, p, 0]).collect();
        self.positions(&p4)
    }

    /// The IMROPE positions `p4` (`t, h, w, e` of each row) on the device.
    fn positions(&self, p4: &[[usize; 4]]) -> Result<DeviceTensor, LoadError> {
        let flat: Vec<i32> = p4
            .iter()
            .flatten()
            .map(|&v| i32::try_from(v).unwrap_or(i32::MAX))
            .collect();
        self.ops.upload_i32(&flat, &[p4.len(), 4]).map_err(op_err)
    }

    /// IMROPE of `x` (`[n, heads · width]`) at `pos` ([`Self::positions`]
    /// of its `n` rows).
    fn rope(
        &self,
        x: &DeviceTensor,
        width: usize,
        pos: &DeviceTensor,
    ) -> Result<DeviceTensor, LoadError> {
        let hp = &self.hp;
        self.ops
            .imrope(
                x,
                pos,
                width,
                &MultiRope {
                    n_rot: hp.n_rot,
                    freq_base: hp.freq_base as f32,
                    sections: hp.sections,
                },
            )
            .map_err(op_err)
    }

    /// Per-head RMSNorm of `x` (`[n, heads · width]`) with gains `[width]`.
    fn head_norm(
        &mut self,
        x: DeviceTensor,
        width: usize,
        gains: &str,
    ) -> Result<DeviceTensor, LoadError> {
        let g = self.small(gains, &[width])?;
        let n = x.len() / width;
        let rows = x.shape().first().copied().unwrap_or(1);
        self.ops
            .rms_norm(
                &x.reshape(&[n, width]).map_err(op_err)?,
                self.hp.eps as f32,
                NormWeight::Scale(&g),
            )
            .map_err(op_err)?
            .reshape(&[rows, n * width / rows])
            .map_err(op_err)
    }

    /// The queries of `n` tokens (`x` `[n, E]`, at positions `pos0,
    /// pos0 + 1, ...`) through attention layer `il`, each seeing the
    /// positions up to its own.
    fn attention(
        &mut self,
        il: usize,
        b: &str,
        x: &DeviceTensor,
        pos0: usize,
    ) -> Result<DeviceTensor, LoadError> {
        let hp = self.hp.clone();
        let (hd, nh) = (hp.head_dim, hp.n_head[il]);
        let n = x.len() / hp.n_embd;
        let qg = self.mm_scaled(&format!("{b}attn_q"), x)?;
        let qg = qg.reshape(&[n * nh, 2 * hd]).map_err(op_err)?;
        let q = self
            .ops
            .slice_cols(&qg, 0, hd)
            .map_err(op_err)?
            .reshape(&[n, nh * hd])
            .map_err(op_err)?;
        let gate = self
            .ops
            .slice_cols(&qg, hd, hd)
            .map_err(op_err)?
            .reshape(&[n, nh * hd])
            .map_err(op_err)?;
        let q = self.head_norm(q, hd, &format!("{b}attn_q_norm.weight"))?;
        let k = self.mm_scaled(&format!("{b}attn_k"), x)?;
        let k = self.head_norm(k, hd, &format!("{b}attn_k_norm.weight"))?;
        let v = self.mm_scaled(&format!("{b}attn_v"), x)?;
        // One positions tensor for the queries and the keys.
        let pos = self.text_positions(pos0, n)?;
        let q = self.rope(&q, hd, &pos)?;
        let k = self.rope(&k, hd, &pos)?;
        {
            let LayerDev::Attn(st) = &mut self.layers[il] else {
                return Err(fwd(format!("layer {il} is not an attention layer")));
            };
            let need = st.cache.len() + n;
            st.cache.reserve(&*self.ops, need).map_err(op_err)?;
            st.cache.append(&*self.ops, &k, &v).map_err(op_err)?;
        }
        let mask_t = if hp.compress[il] == 0 {
            None
        } else {
            // Each query's QSA selection as a row of an additive mask
            // (none where every query sees all its positions).
            let n_kv = pos0 + n;
            let mut mask = vec![f32::NEG_INFINITY; n * n_kv];
            let mut selective = false;
            // The indexer's projections over the n tokens at once (one
            // ubatch, as ggml sums a prompt's): the keys, and the queries
            // once a token of them selects.
            let kraw = self.mm(&format!("{b}indexer.k_proj.weight"), x)?;
            let width = hp.qsa_width(il);
            let qi = if pos0 + n > width {
                Some(self.mm(&format!("{b}indexer.q_proj.weight"), x)?)
            } else {
                None
            };
            let mut per_token = Vec::with_capacity(n);
            if n == 1 {
                per_token.push((kraw, qi));
            } else {
                for t in 0..n {
                    let qt = match &qi {
                        Some(q) if pos0 + t >= width => Some(self.rows_of(q, t..t + 1)?),
                        _ => None,
                    };
                    per_token.push((self.rows_of(&kraw, t..t + 1)?, qt));
                }
            }
            for (t, (kt, qt)) in per_token.into_iter().enumerate() {
                let p = pos0 + t;
                let row = &mut mask[t * n_kv..(t + 1) * n_kv];
                match self.qsa_select(il, b, kt, qt, p, n > 1)? {
                    Some(sel) => {
                        selective = true;
                        for (m, &s) in row.iter_mut().zip(&sel) {
                            if s {
                                *m = 0.0;
                            }
                        }
                    }
                    None => row[..=p].fill(0.0),
                }
            }
            if selective {
                Some(self.ops.upload_f32(&mask, &[n, n_kv]).map_err(op_err)?)
            } else {
                None
            }
        };
        let LayerDev::Attn(st) = &self.layers[il] else {
            return Err(fwd(format!("layer {il} is not an attention layer")));
        };
        let attn = Attention {
            n_head: nh,
            scores: family_ops::Scores {
                scale: (1.0 / (hd as f64).sqrt()) as f32,
                softcap: None,
            },
            mask: match &mask_t {
                Some(m) => AttnMask::Additive(m),
                None if n == 1 => AttnMask::All,
                None => AttnMask::Causal { pos0 },
            },
        };
        let out = self.ops.attention(&q, &st.cache, &attn).map_err(op_err)?;
        let out = self.ops.mul_sigmoid(&out, &gate).map_err(op_err)?;
        self.mm_scaled(&format!("{b}attn_output"), &out)
    }

    /// The cells `0..=pos` the query attends (spec 6.1), `None` for all;
    /// pools this token's indexer key (`kraw`, its `k_proj` product) into
    /// its block. `qi`: its `q_proj` product, there from the first
    /// position that selects (`Hyper::qsa_width`), `None` before.
    fn qsa_select(
        &mut self,
        il: usize,
        b: &str,
        kraw: DeviceTensor,
        qi: Option<DeviceTensor>,
        pos: usize,
        many: bool,
    ) -> Result<Option<Vec<bool>>, LoadError> {
        let hp = self.hp.clone();
        let r = hp.compress[il];
        if r == 0 {
            return Ok(None);
        }
        let id = hp.idx_dim;
        // llama.cpp pools the raw keys from the K cache, so they are
        // rounded as it stores them (an F16 cache), as the host path
        // rounds them.
        let LayerDev::Attn(st) = &self.layers[il] else {
            return Err(fwd(format!("layer {il} is not an attention layer")));
        };
        let kraw = match st.cache.spec().dtype {
            DType::F16 => self.ops.round_f16(&kraw).map_err(op_err)?,
            _ => kraw,
        };
        // The pooled keys' norm, staged at the first indexer step as the
        // host path stages it (before the first block is full).
        self.small(&format!("{b}indexer.k_norm.weight"), &[id])?;
        let full = {
            let LayerDev::Attn(st) = &mut self.layers[il] else {
                return Err(fwd(format!("layer {il} is not an attention layer")));
            };
            let sum = match st.kraw_sum.take() {
                Some(s) => self.ops.add(&s, &kraw).map_err(op_err)?,
                None => kraw,
            };
            st.kraw_n += 1;
            if st.kraw_n == r {
                st.kraw_n = 0;
                Some((sum, st.pooled.len()))
            } else {
                st.kraw_sum = Some(sum);
                None
            }
        };
        if let Some((sum, blk)) = full {
            let mean = self.ops.scale(&sum, 1.0 / r as f32).map_err(op_err)?;
            let kb = self.head_norm(mean, id, &format!("{b}indexer.k_norm.weight"))?;
            // A pooled key sits at its block's first position in all four
            // sections (spec 6.1), as the host path ropes it.
            let kb = self.rope(&kb, id, &self.positions(&[[blk * r; 4]])?)?;
            let kb = self.read_back(&kb).map_err(op_err)?;
            if let LayerDev::Attn(st) = &mut self.layers[il] {
                st.pooled.push(kb);
            }
        }
        let Some(qi) = qi else {
            return Ok(None);
        };
        let width = hp.qsa_width(il);
        let qi = self.head_norm(qi, id, &format!("{b}indexer.q_norm.weight"))?;
        let qi = self.rope(&qi, id, &self.text_positions(pos, 1)?)?;
        let qi = self.read_back(&qi).map_err(op_err)?;
        let LayerDev::Attn(st) = &self.layers[il] else {
            return Err(fwd(format!("layer {il} is not an attention layer")));
        };
        let tiled = hp.n_idx_head > 1 || many;
        let sel = crate::forward::qsa_cells(&st.pooled, &qi, r, width, pos, tiled);
        Ok(Some(sel))
    }

    /// The per-expert scale `name` (`[n_expert]`) at the picks `ids`
    /// (`[1, k]`): `[k, 1]`, or `None` where the file has no such scale.
    fn picked_scale(
        &mut self,
        name: &str,
        ids: &DeviceTensor,
    ) -> Result<Option<DeviceTensor>, LoadError> {
        if self.model.weight(name).is_none() {
            return Ok(None);
        }
        let n = self.model.hparams().n_expert as usize;
        let table = self.small(name, &[n, 1])?;
        let k = ids.len();
        let s = self.ops.gather_rows(&table, ids).map_err(op_err)?;
        Ok(Some(s.reshape(&[k, 1]).map_err(op_err)?))
    }

    /// `y` (`[n, k, cols]`, a row per token's pick) times each pick's
    /// `scale` (`[n · k, 1]`): `[n · k, cols]`.
    fn scaled_per_pick(
        &self,
        y: DeviceTensor,
        scale: Option<&DeviceTensor>,
    ) -> Result<DeviceTensor, LoadError> {
        let (k, cols) = (y.shape()[0] * y.shape()[1], y.shape()[2]);
        match scale {
            Some(s) => self
                .ops
                .mix_experts(&y.reshape(&[k, 1, cols]).map_err(op_err)?, s)
                .map_err(op_err),
            None => y.reshape(&[k, cols]).map_err(op_err),
        }
    }

    /// The routed experts' output for `n` tokens (`x` `[n, E]`) of layer
    /// `il` with every stack staged whole: routed on the device (softmax, the top
    /// `n_expert_used` in llama.cpp's tie order, renormalized) and
    /// multiplied by the picks' ids where they are.
    fn routed_on_device(
        &mut self,
        il: usize,
        b: &str,
        x: &DeviceTensor,
    ) -> Result<DeviceTensor, LoadError> {
        let k = self.hp.n_expert_used[il];
        let n = x.len() / self.hp.n_embd;
        let router = self.mm(&format!("{b}ffn_gate_inp.weight"), x)?;
        let routing = device_ops::DeviceRouting {
            gating: device_ops::Gating::Softmax,
            k,
            bias: None,
            normalize: true,
            scale: 1.0,
        };
        let (ids, wts) = self.ops.route(&router, &routing).map_err(op_err)?;
        let stack = |kind| {
            self.model
                .whole_expert_stack(il, kind)
                .map_err(|e| fwd(e.to_string()))
        };
        let staged = |w: &'m Weight| {
            seam::resident_weight(w, self.platform, self.queue)
                .map_err(|e| fwd(format!("{}: {e}", w.name())))
        };
        let fused = self
            .model
            .merged_gate_up(il)
            .map_err(|e| fwd(e.to_string()))?;
        let (gate_s, up_s) = if fused {
            let s = format!("{b}ffn_up_exps.scale");
            (s.clone(), s)
        } else {
            (
                format!("{b}ffn_gate_exps.scale"),
                format!("{b}ffn_up_exps.scale"),
            )
        };
        let (gt, up) = if fused {
            let w = stack(ExpertKind::Gate)?;
            let gu = self
                .ops
                .matmul_id(w, &staged(w)?, x, &ids)
                .map_err(op_err)?;
            let ff = gu.shape()[2] / 2;
            let gu = gu.reshape(&[n * k, 2 * ff]).map_err(op_err)?;
            let g = self.ops.slice_cols(&gu, 0, ff).map_err(op_err)?;
            let u = self.ops.slice_cols(&gu, ff, ff).map_err(op_err)?;
            (
                g.reshape(&[n, k, ff]).map_err(op_err)?,
                u.reshape(&[n, k, ff]).map_err(op_err)?,
            )
        } else {
            let (wg, wu) = (stack(ExpertKind::Gate)?, stack(ExpertKind::Up)?);
            (
                self.ops
                    .matmul_id(wg, &staged(wg)?, x, &ids)
                    .map_err(op_err)?,
                self.ops
                    .matmul_id(wu, &staged(wu)?, x, &ids)
                    .map_err(op_err)?,
            )
        };
        let sg = self.picked_scale(&gate_s, &ids)?;
        let su = self.picked_scale(&up_s, &ids)?;
        let gt = self.scaled_per_pick(gt, sg.as_ref())?;
        let up = self.scaled_per_pick(up, su.as_ref())?;
        let act = self.ops.swiglu(&gt, &up).map_err(op_err)?;
        let wd = stack(ExpertKind::Down)?;
        let d = self
            .ops
            .matmul_id(wd, &staged(wd)?, &act, &ids)
            .map_err(op_err)?;
        // A per-expert down scale multiplies the pick's output before the
        // mix, as the host path scales it.
        let d = match self.picked_scale(&format!("{b}ffn_down_exps.scale"), &ids)? {
            Some(s) => {
                let cols = d.shape()[2];
                self.scaled_per_pick(d, Some(&s))?
                    .reshape(&[n, k, cols])
                    .map_err(op_err)?
            }
            None => d,
        };
        self.ops.mix_experts(&d, &wts).map_err(op_err)
    }

    /// The MoE output for `n` tokens (`x` `[n, E]`) of layer `il`.
    fn moe(&mut self, il: usize, b: &str, x: &DeviceTensor) -> Result<DeviceTensor, LoadError> {
        if self.stacks_staged {
            let routed = self.routed_on_device(il, b, x)?;
            return self.with_shared_expert(b, x, routed);
        }
        let e_dim = self.hp.n_embd;
        let n = x.len() / e_dim;
        // The router over the n tokens at once: one ubatch, summed as
        // ggml's `mul_mat` sums a prompt's, so a near tie between two
        // experts resolves as on the host. The picks and weights as the
        // host path makes them (ggml's softmax, its argsort, the
        // normalized weights): the router's logits come back, the weights
        // never do.
        let router = self.mm(&format!("{b}ffn_gate_inp.weight"), x)?;
        let logits = self.read_back(&router).map_err(op_err)?;
        let n_expert = logits.len() / n;
        if n == 1 {
            let routed = self.picked_experts(il, b, x, &logits)?;
            return self.with_shared_expert(b, x, routed);
        }
        // The host stages each token's experts on first pick: a token at
        // a time.
        let mut routed = self.ops.zeros(DType::F32, &[n, e_dim]).map_err(op_err)?;
        for (t, lt) in logits.chunks_exact(n_expert).enumerate() {
            let xt = self.rows_of(x, t..t + 1)?;
            let y = self.picked_experts(il, b, &xt, lt)?;
            self.ops.write_rows(&mut routed, t, &y).map_err(op_err)?;
        }
        self.with_shared_expert(b, x, routed)
    }

    /// The routed experts' output for one token (`x` `[1, E]`) of layer
    /// `il` whose router logits are `logits`, each expert staged on its
    /// first pick.
    fn picked_experts(
        &mut self,
        il: usize,
        b: &str,
        x: &DeviceTensor,
        logits: &[f32],
    ) -> Result<DeviceTensor, LoadError> {
        let e_dim = self.hp.n_embd;
        let picked = family_ops::ggml_cpu::moe::route_softmax(
            logits,
            self.hp.n_expert_used[il],
            true,
            self.hp.expert_weights_scale,
        );
        let fused = self
            .model
            .weight(&format!("{b}ffn_gate_up_exps.weight"))
            .is_some();
        let (gate_b, up_b, down_b) = (
            format!("{b}ffn_gate_exps"),
            format!("{b}ffn_up_exps"),
            format!("{b}ffn_down_exps"),
        );
        let mut out = self.ops.zeros(DType::F32, &[1, e_dim]).map_err(op_err)?;
        for &(e, weight) in &picked {
            let expert = |kind| {
                self.model
                    .expert(il, kind, e as u64)
                    .map_err(|err| fwd(err.to_string()))
            };
            let (wg, wu, wd) = (
                expert(ExpertKind::Gate)?,
                expert(ExpertKind::Up)?,
                expert(ExpertKind::Down)?,
            );
            let gt = self.mm_w(wg, x)?;
            let up = self.mm_w(wu, x)?;
            let (gt, up) = if fused {
                (
                    self.expert_scaled(&up_b, e, gt)?,
                    self.expert_scaled(&up_b, e, up)?,
                )
            } else {
                (
                    self.expert_scaled(&gate_b, e, gt)?,
                    self.expert_scaled(&up_b, e, up)?,
                )
            };
            let act = self.ops.swiglu(&gt, &up).map_err(op_err)?;
            let d = self.mm_w(wd, &act)?;
            let d = self.expert_scaled(&down_b, e, d)?;
            let d = self.ops.scale(&d, weight).map_err(op_err)?;
            out = self.ops.add(&out, &d).map_err(op_err)?;
        }
        Ok(out)
    }

    /// `routed` plus the shared expert's output for `x`, gated.
    fn with_shared_expert(
        &mut self,
        b: &str,
        x: &DeviceTensor,
        routed: DeviceTensor,
    ) -> Result<DeviceTensor, LoadError> {
        let e_dim = self.hp.n_embd;
        let n = x.len() / e_dim;
        let up = self.mm_scaled(&format!("{b}ffn_up_shexp"), x)?;
        let gt = self.mm_scaled(&format!("{b}ffn_gate_shexp"), x)?;
        let act = self.ops.swiglu(&gt, &up).map_err(op_err)?;
        let sh = self.mm_scaled(&format!("{b}ffn_down_shexp"), &act)?;
        let gsh = self.mm(&format!("{b}ffn_gate_inp_shexp.weight"), x)?;
        if n == 1 {
            // routed + sigmoid(g) · shared in one op (the same arithmetic
            // as the sigmoid, a mix of one pick and the add).
            let gate = OuterFactor::Sigmoid {
                pre: 1.0,
                post: 1.0,
            };
            return self.ops.add_outer(&routed, &gsh, &sh, gate).map_err(op_err);
        }
        let gsh = self.ops.sigmoid(&gsh).map_err(op_err)?;
        let shg = self
            .ops
            .mix_experts(
                &sh.reshape(&[n, 1, e_dim]).map_err(op_err)?,
                &gsh.reshape(&[n, 1]).map_err(op_err)?,
            )
            .map_err(op_err)?;
        self.ops.add(&routed, &shg).map_err(op_err)
    }

    /// The PLE key and value products (`[n, hc · E]` each) of the `n`
    /// tokens at `pos0..`: their embedding rows read from the mapping (the
    /// table is never staged) and uploaded, multiplied at once (one
    /// ubatch, as ggml sums a prompt's).
    fn ple_products(
        &mut self,
        b: &str,
        p: &PleHyper,
        pos0: usize,
        n: usize,
    ) -> Result<(DeviceTensor, DeviceTensor), LoadError> {
        let table = self
            .model
            .weight("per_layer_token_embd.weight")
            .ok_or_else(|| fwd("per_layer_token_embd.weight: no such weight"))?;
        let mut emb = Vec::new();
        for pos in pos0..pos0 + n {
            for row in crate::forward::ple_rows(p, &self.tokens[..=pos]) {
                emb.extend(table_row(table, row)?);
            }
        }
        let emb = self
            .ops
            .upload_f32(&emb, &[n, emb.len() / n])
            .map_err(op_err)?;
        let key = self.mm(&format!("{b}ple_key.weight"), &emb)?;
        let value = self.mm(&format!("{b}ple_value.weight"), &emb)?;
        Ok((key, value))
    }

    /// `R += gv + silu(conv)` for the token at `pos` (spec section 8;
    /// `r` its `[hc, E]` streams, `key` and `value` its rows of
    /// [`DeviceDecoder::ple_products`]).
    fn ple(
        &mut self,
        b: &str,
        p: &PleHyper,
        r: &DeviceTensor,
        pos: usize,
        key: DeviceTensor,
        value: DeviceTensor,
    ) -> Result<DeviceTensor, LoadError> {
        let (e, hc) = (self.hp.n_embd, self.hp.hc);
        let kn = self.stream_norm(
            &key.reshape(&[hc, e]).map_err(op_err)?,
            &format!("{b}ple_norm_key.weight"),
        )?;
        let qn = self.stream_norm(r, &format!("{b}ple_norm_query.weight"))?;
        // Per-stream dot products as ggml's `sum_rows` of the products
        // forms them: the products rounded to f32, added in f64 in order
        // (a dot with ones), rounded once.
        let o = &*self.ops;
        let prods = o
            .mul(
                &kn.reshape(&[hc, e]).map_err(op_err)?,
                &qn.reshape(&[hc, e]).map_err(op_err)?,
            )
            .map_err(op_err)?;
        let dots = o.dot_rows_f64(&prods, &self.ones_embd).map_err(op_err)?;
        let dots = self.read_back(&dots).map_err(op_err)?;
        let inv_sqrt_e = 1.0 / (e as f32).sqrt();
        let gates: Vec<f32> = dots
            .iter()
            .map(|&d| crate::forward::ple_gate(d * inv_sqrt_e))
            .collect();
        let gates = self.ops.upload_f32(&gates, &[hc, 1]).map_err(op_err)?;
        let zeros = self.ops.zeros(DType::F32, &[hc, e]).map_err(op_err)?;
        let gv = self
            .ops
            .add_outer(&zeros, &gates, &value, OuterFactor::Plain)
            .map_err(op_err)?;
        let nv = self.stream_norm(&gv, &format!("{b}ple_norm_conv.weight"))?;
        let nv = nv.reshape(&[1, hc * e]).map_err(op_err)?;
        let cw = self.small(&format!("{b}ple_conv1d.weight"), &[hc * e, p.conv_kernel])?;
        let phase = pos % p.ngram;
        let conv = self
            .ops
            .ssm_conv(&mut self.ple_conv[phase], &nv, &cw)
            .map_err(op_err)?;
        let add = self
            .ops
            .add(&gv, &conv.reshape(&[hc, e]).map_err(op_err)?)
            .map_err(op_err)?;
        self.ops.add(r, &add).map_err(op_err)
    }

    /// Feeds `tokens` at the next positions, all at once (each op over
    /// every token's rows; what the host decides per token, a token at a
    /// time); the last token's logits and, for a single token, the stream
    /// means after the layers of `taps`.
    fn forward(
        &mut self,
        tokens: &[u32],
        taps: &[usize],
    ) -> Result<(Vec<f32>, Vec<Vec<f32>>), LoadError> {
        let n = tokens.len();
        if n == 0 {
            return Err(fwd("no tokens to feed"));
        }
        if n > 1 && !taps.is_empty() {
            return Err(fwd("taps are taken one token at a time"));
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= self.n_vocab) {
            return Err(fwd(format!(
                "token {t} is not below the vocabulary size {}",
                self.n_vocab
            )));
        }
        let pos0 = self.tokens.len();
        self.tokens.extend_from_slice(tokens);
        let mut tapped = vec![Vec::new(); taps.len()];
        let hp = self.hp.clone();
        let (e, hc) = (hp.n_embd, hp.hc);
        // Each token's embedding in each of its streams: `[n · hc, E]`.
        let ids: Vec<i32> = tokens
            .iter()
            .flat_map(|&t| std::iter::repeat_n(t as i32, hc))
            .collect();
        let ids = self.ops.upload_i32(&ids, &[n * hc]).map_err(op_err)?;
        let tw = self.weight("token_embd.weight")?;
        let tr = seam::resident_weight(tw, self.platform, self.queue)
            .map_err(|err| fwd(format!("token_embd.weight: {err}")))?;
        let mut r = self
            .ops
            .get_rows(tw, &tr, &ids)
            .and_then(|t| t.reshape(&[n * hc, e]))
            .map_err(op_err)?;
        let mut streams = if n > 1 {
            Some(self.token_of_stream(n)?)
        } else {
            None
        };
        for il in 0..hp.n_layer {
            let b = format!("blk.{il}.");
            if let Some(p) = &hp.ple
                && p.layer == il
            {
                let (keys, values) = self.ple_products(&b, p, pos0, n)?;
                if n == 1 {
                    r = self.ple(&b, p, &r, pos0, keys, values)?;
                } else {
                    for t in 0..n {
                        let rt = self.rows_of(&r, t * hc..(t + 1) * hc)?;
                        let (kt, vt) = (
                            self.rows_of(&keys, t..t + 1)?,
                            self.rows_of(&values, t..t + 1)?,
                        );
                        let rt = self.ple(&b, p, &rt, pos0 + t, kt, vt)?;
                        self.ops.write_rows(&mut r, t * hc, &rt).map_err(op_err)?;
                    }
                }
            }
            let (x, inj) = self.hc_mix(&r, &format!("{b}hc_attn"), true)?;
            let y = if hp.recurrent[il] {
                self.gdn(il, &b, &x)?
            } else {
                self.attention(il, &b, &x, pos0)?
            };
            let inj = inj.ok_or_else(|| fwd("hc_attn_inject"))?;
            if n > 1 && il + 1 == hp.n_layer {
                // Only the last token's logits are asked for: its rows go
                // on alone past the last attention (llama.cpp's
                // `inp_out_ids`), so the rest sums as one token's.
                let y = self.rows_of(&y, n - 1..n)?;
                let inj = self.rows_of(&inj, n - 1..n)?;
                let last = self.rows_of(&r, (n - 1) * hc..n * hc)?;
                r = self.hc_combine(&last, &y, &inj, None)?;
                streams = None;
            } else {
                r = self.hc_combine(&r, &y, &inj, streams.as_ref())?;
            }
            let (x, inj) = self.hc_mix(&r, &format!("{b}hc_ffn"), true)?;
            let y = self.moe(il, &b, &x)?;
            let inj = inj.ok_or_else(|| fwd("hc_ffn_inject"))?;
            r = self.hc_combine(&r, &y, &inj, streams.as_ref())?;
            if taps.contains(&il) {
                // The streams' mean, as the host path takes it.
                let r3 = r.reshape(&[1, hc, e]).map_err(op_err)?;
                let mean = self.ops.mix_experts(&r3, &self.inv_hc).map_err(op_err)?;
                r = r3.reshape(&[hc, e]).map_err(op_err)?;
                let mean = self.read_back(&mean).map_err(op_err)?;
                for (slot, _) in taps.iter().enumerate().filter(|&(_, &l)| l == il) {
                    tapped[slot] = mean.clone();
                }
            }
        }
        // The last layer left the last token's streams alone.
        let (h, _) = self.hc_mix(&r, "output_hc", false)?;
        let logits = self.mm(self.output, &h)?;
        Ok((self.read_back(&logits).map_err(op_err)?, tapped))
    }
}

impl Decoder for DeviceDecoder<'_> {
    fn prefill(&mut self, tokens: &[u32]) -> Result<Vec<f32>, LoadError> {
        if tokens.is_empty() {
            return Err(LoadError::empty_prompt());
        }
        let mut logits = Vec::new();
        for chunk in tokens.chunks(PREFILL_BATCH) {
            logits = self.forward(chunk, &[])?.0;
        }
        Ok(logits)
    }

    fn step(&mut self, token: u32) -> Result<Vec<f32>, LoadError> {
        Ok(self.forward(&[token], &[])?.0)
    }

    fn traffic(&self) -> Traffic {
        let c = self.ops.counters();
        Traffic {
            read_back_bytes: c.read_back_bytes,
            weight_read_back_bytes: c.weight_read_back_bytes,
            read_backs: self.read_backs.get(),
            kernel_launches: Some(c.kernel_launches),
        }
    }
}
