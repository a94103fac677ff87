//! The draft forward pass of [`crate::forward`] (the host reference)
//! composed from the device op layer ([`device_ops::Ops`]), its state on
//! the device.
//!
//! - Every product reads the staged weight in place ([`Ops::matmul`] on
//!   what [`seam::resident_weight`] hands out, the target's output head
//!   included); the embedding rows are gathered where the table lives
//!   ([`Ops::get_rows`]); the norms are dequantized on the device once,
//!   on first use, and kept there.
//! - State on the device: per draft layer a [`KvCache`] of the context's
//!   K/V (the projected taps, normed and roped at their positions),
//!   grown by doubling. A proposal appends the block's K/V after the
//!   context, attends over all of it (non-causal, [`AttnMask::All`]) and
//!   truncates the cache back to the context.
//! - The context's K/V are made when the next proposal needs them (as the
//!   host path makes them only in [`DraftRunner::propose`]), so the draft
//!   stages exactly the weights the host path stages.
//! - What comes to the device from the host: the taps (the target's
//!   hidden states at its tap layers, `target_layers · n_embd` values a
//!   position), the block's token ids and the positions. What comes back:
//!   the block's logits.
//!
//! [`DraftRunner::propose`]: crate::forward::DraftRunner::propose

use std::collections::HashMap;
use std::rc::Rc;

use device_ops::{Attention, AttnMask, DType, DeviceTensor, KvCache, KvSpec, NormWeight, Ops};
use family_ops::{Rope, RopeMode};
use seam::platform::{Platform, Queue};
use seam::weight::Weight;

use crate::forward::argmax;
use crate::model::{Dflash, Error};
use crate::spec::Proposer;

/// The draft on a device: [`crate::forward::DraftRunner`]'s pass composed
/// from [`Ops`].
pub struct DeviceDraft<'a> {
    draft: &'a Dflash<'a>,
    platform: &'a dyn Platform,
    queue: &'a dyn Queue,
    ops: Rc<dyn Ops + 'a>,
    /// Norms dequantized on the device, by name.
    small: HashMap<String, Rc<DeviceTensor>>,
    /// Per draft layer, the context's K/V.
    ctx: Vec<KvCache>,
    /// `enc.output_norm(fc · taps)` of positions whose K/V are not made
    /// yet, oldest first.
    pending: Vec<DeviceTensor>,
    /// Committed positions (those in `ctx` and those pending).
    n_ctx: usize,
}

impl std::fmt::Debug for DeviceDraft<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceDraft")
            .field("device", &self.ops.device_name())
            .field("context", &self.n_ctx)
            .finish()
    }
}

impl<'a> DeviceDraft<'a> {
    /// A runner of `draft` whose weights are staged on `platform` through
    /// `queue` and multiplied by `ops` (that platform's op layer, shared
    /// with the target's decoder), with no context yet.
    ///
    /// # Errors
    ///
    /// The device failed to make the caches.
    pub fn new(
        draft: &'a Dflash<'a>,
        platform: &'a dyn Platform,
        queue: &'a dyn Queue,
        ops: Rc<dyn Ops + 'a>,
    ) -> Result<DeviceDraft<'a>, Error> {
        let hp = draft.hparams();
        let spec = KvSpec {
            n_ctx: family_kit::blocks::attention::FIRST_CTX,
            n_head_kv: hp.n_head_kv,
            head_dim_k: hp.head_dim,
            head_dim_v: hp.head_dim,
            dtype: DType::F32,
        };
        let ctx = (0..hp.n_layer)
            .map(|_| KvCache::new(&*ops, spec))
            .collect::<Result<_, _>>()?;
        Ok(DeviceDraft {
            draft,
            platform,
            queue,
            ops,
            small: HashMap::new(),
            ctx,
            pending: Vec::new(),
            n_ctx: 0,
        })
    }

    /// The op layer (its counters).
    pub fn ops(&self) -> &dyn Ops {
        &*self.ops
    }

    /// Committed positions whose context the runner holds.
    pub fn context_len(&self) -> usize {
        self.n_ctx
    }

    fn own(&self, name: &str) -> Result<&'a Weight, Error> {
        self.draft.weight(name).ok_or_else(|| Error::Tensor {
            name: name.to_owned(),
            why: "missing".into(),
        })
    }

    /// `x · Wᵀ`, the weight read where the seam staged it.
    fn mm(&self, w: &Weight, x: &DeviceTensor) -> Result<DeviceTensor, Error> {
        let r = seam::resident_weight(w, self.platform, self.queue)?;
        Ok(self.ops.matmul(w, &r, x)?)
    }

    /// The norm `name` dequantized on the device (`[n]`), kept there.
    fn norm(&mut self, name: &str) -> Result<Rc<DeviceTensor>, Error> {
        if let Some(t) = self.small.get(name) {
            return Ok(Rc::clone(t));
        }
        let w = self.own(name)?;
        let r = seam::resident_weight(w, self.platform, self.queue)?;
        let t = self.ops.dequantize(w, &r)?;
        let n = t.len();
        let t = Rc::new(t.reshape(&[n])?);
        self.small.insert(name.to_owned(), Rc::clone(&t));
        Ok(t)
    }

    /// RMSNorm of each row of `x` times the norm `name`.
    fn rms(&mut self, x: &DeviceTensor, name: &str) -> Result<DeviceTensor, Error> {
        let g = self.norm(name)?;
        let eps = self.draft.hparams().eps as f32;
        Ok(self.ops.rms_norm(x, eps, NormWeight::Scale(&g))?)
    }

    /// Per-head RMSNorm (q/k norms) of `x` (`[rows, heads · head_dim]`).
    fn head_norm(&mut self, x: DeviceTensor, name: &str) -> Result<DeviceTensor, Error> {
        let hd = self.draft.hparams().head_dim;
        let shape = x.shape().to_vec();
        let (rows, cols) = x.rows_cols("head_norm")?;
        let heads = x.reshape(&[rows * cols / hd, hd])?;
        Ok(self.rms(&heads, name)?.reshape(&shape)?)
    }

    /// NEOX RoPE of the rows of `x` at `pos0, pos0 + 1, ...`.
    fn rope(&self, x: &DeviceTensor, pos0: usize) -> Result<DeviceTensor, Error> {
        let hp = self.draft.hparams();
        let (rows, _) = x.rows_cols("rope")?;
        let positions: Vec<i32> = (pos0..pos0 + rows)
            .map(|p| i32::try_from(p).map_err(|_| Error::Mismatch(format!("position {p}"))))
            .collect::<Result<_, _>>()?;
        let positions = self.ops.upload_i32(&positions, &[rows])?;
        let rope = Rope {
            n_rot: hp.head_dim,
            freq_base: hp.rope_base as f32,
            mode: RopeMode::Neox,
        };
        Ok(self.ops.rope(x, &positions, hp.head_dim, &rope)?)
    }

    /// Layer `l`'s K and V of the rows of `h` at `pos0, pos0 + 1, ...`.
    fn kv(
        &mut self,
        l: usize,
        h: &DeviceTensor,
        pos0: usize,
    ) -> Result<(DeviceTensor, DeviceTensor), Error> {
        let wk = self.own(&format!("blk.{l}.attn_k.weight"))?;
        let wv = self.own(&format!("blk.{l}.attn_v.weight"))?;
        let k = self.mm(wk, h)?;
        let k = self.head_norm(k, &format!("blk.{l}.attn_k_norm.weight"))?;
        let k = self.rope(&k, pos0)?;
        let v = self.mm(wv, h)?;
        Ok((k, v))
    }

    /// Makes the K/V of the pending context positions.
    fn flush(&mut self) -> Result<(), Error> {
        let pending = std::mem::take(&mut self.pending);
        let first = self.n_ctx - pending.len();
        for (i, c) in pending.iter().enumerate() {
            for l in 0..self.draft.hparams().n_layer {
                let (k, v) = self.kv(l, c, first + i)?;
                self.ctx[l].reserve(&*self.ops, first + i + 1)?;
                self.ctx[l].append(&*self.ops, &k, &v)?;
            }
        }
        Ok(())
    }

    /// Adds one committed position: `taps` is the target's hidden states at
    /// the tap layers, concatenated in `target_layers` order.
    ///
    /// # Errors
    ///
    /// `taps` has the wrong width, or the device or the seam failed.
    pub fn push_context(&mut self, taps: &[f32]) -> Result<(), Error> {
        let hp = self.draft.hparams();
        let width = hp.target_layers.len() * self.draft.target_n_embd();
        if taps.len() != width {
            return Err(Error::Mismatch(format!(
                "{} tap values, fc takes {width}",
                taps.len()
            )));
        }
        let t = self.ops.upload_f32(taps, &[1, width])?;
        let h = self.mm(self.own("fc.weight")?, &t)?;
        let c = self.rms(&h, "enc.output_norm.weight")?;
        self.pending.push(c);
        self.n_ctx += 1;
        Ok(())
    }

    /// Drafts `block_size - 1` tokens after `anchor`, which sits at the
    /// position after the context.
    ///
    /// # Errors
    ///
    /// As [`DeviceDraft::block_logits`].
    pub fn propose(&mut self, anchor: u32) -> Result<Vec<u32>, Error> {
        Ok(self
            .block_logits(anchor)?
            .iter()
            .map(|l| argmax(l) as u32)
            .collect())
    }

    /// The logits of the block's positions `1..block_size` after `anchor`
    /// (back on the host).
    ///
    /// # Errors
    ///
    /// The anchor is out of the vocabulary, or the device or the seam
    /// failed.
    pub fn block_logits(&mut self, anchor: u32) -> Result<Vec<Vec<f32>>, Error> {
        let hp = self.draft.hparams().clone();
        let (hd, bs) = (hp.head_dim, hp.block_size);
        let table = self.draft.token_embd();
        let n_vocab = table.dims()[1] as usize;
        if anchor as usize >= n_vocab {
            return Err(Error::Mismatch(format!(
                "anchor {anchor} is not below the vocabulary {n_vocab}"
            )));
        }
        self.flush()?;
        let n_ctx = self.n_ctx;
        let ids: Vec<i32> = std::iter::once(anchor)
            .chain(std::iter::repeat_n(hp.mask_token, bs - 1))
            .map(|t| i32::try_from(t).map_err(|_| Error::Mismatch(format!("token {t}: past i32"))))
            .collect::<Result<_, _>>()?;
        let ids = self.ops.upload_i32(&ids, &[bs])?;
        let tr = seam::resident_weight(table, self.platform, self.queue)?;
        let mut xs = self.ops.get_rows(table, &tr, &ids)?;
        let scale = 1.0 / (hd as f32).sqrt();
        for l in 0..hp.n_layer {
            let w = |s: &str| self.own(&format!("blk.{l}.{s}.weight"));
            let (wq, wo) = (w("attn_q")?, w("attn_output")?);
            let (gate, up, down) = (w("ffn_gate")?, w("ffn_up")?, w("ffn_down")?);
            let hs = self.rms(&xs, &format!("blk.{l}.attn_norm.weight"))?;
            // The block's K/V after the context's, attended, then dropped.
            let (k, v) = self.kv(l, &hs, n_ctx)?;
            self.ctx[l].reserve(&*self.ops, n_ctx + bs)?;
            self.ctx[l].append(&*self.ops, &k, &v)?;
            let q = self.mm(wq, &hs)?;
            let q = self.head_norm(q, &format!("blk.{l}.attn_q_norm.weight"))?;
            let q = self.rope(&q, n_ctx)?;
            let attn = Attention {
                n_head: hp.n_head,
                scores: family_ops::Scores {
                    scale,
                    softcap: None,
                },
                // Non-causal: every context and block position.
                mask: AttnMask::All,
            };
            let out = self.ops.attention(&q, &self.ctx[l], &attn);
            self.ctx[l].truncate(n_ctx);
            let o = self.mm(wo, &out?)?;
            xs = self.ops.add(&xs, &o)?;
            let h = self.rms(&xs, &format!("blk.{l}.ffn_norm.weight"))?;
            let act = self.ops.swiglu(&self.mm(gate, &h)?, &self.mm(up, &h)?)?;
            let d = self.mm(down, &act)?;
            xs = self.ops.add(&xs, &d)?;
        }
        let hn = self.rms(&xs, "output_norm.weight")?;
        let logits = self.mm(self.draft.output_head(), &hn)?;
        let logits = self.ops.read_back(&logits)?;
        let n_out = logits.len() / bs;
        Ok(logits
            .chunks_exact(n_out)
            .skip(1)
            .map(<[f32]>::to_vec)
            .collect())
    }
}

impl Proposer for DeviceDraft<'_> {
    fn push_context(&mut self, taps: &[f32]) -> Result<(), Error> {
        DeviceDraft::push_context(self, taps)
    }
    fn propose(&mut self, anchor: u32) -> Result<Vec<u32>, Error> {
        DeviceDraft::propose(self, anchor)
    }
}
