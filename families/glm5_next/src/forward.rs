//! The CPU forward pass as docs/families/glm5_next.md (sections 3-7)
//! states it, in ggml's `f32` arithmetic as llama.cpp's CPU build computes
//! it (`family_ops::ggml_cpu`: the products' kernels with the activations
//! converted to each weight's `vec_dot_type`, RMSNorm, LayerNorm, the
//! fused mHC ops, KDA's short convolutions and gated delta rule, the
//! k-pool indexer's pooling and fused score, the latent attention, the
//! experts' routing and clamped SwiGLU), so the logits are llama.cpp's own
//! on quantized files and F16 caches (docs/families/glm5_next.md,
//! "Numerics"). Every weight is asked of `seam::resident_weight` on every
//! use through the kit's [`WeightReader`] (matrices read by rows, only
//! small vectors kept dequantized); a routed expert is its sub-span weight,
//! staged when the router picks it. The caches are llama.cpp's: the MLA
//! latent (its K cache), the indexer's keys, gates and pooled keys (its
//! own cache, of the K type), the KDA conv windows and delta-rule states
//! (F32, llama.cpp's recurrent state types).

use family_kit::blocks::kpool;
use family_kit::{LoadError, Numerics, WeightReader};
use family_ops::ggml_cpu::{self, KvCells, Ubatch, dot_f32, soft_max};
use family_ops::{AttentionShape, NormWeight, rms_norm_in_place};
use seam::gguf::GgmlType;
use seam::weight::Weight;

use crate::model::{Ffn, Glm5Next, HcHandles, KdaHandles, Mixer, MlaHandles};

/// The L2-norm epsilon of KDA's q and k (a constant, `glm5-next.cpp`).
pub const L2_EPS: f32 = 1e-6;

fn ops(what: &str) -> impl Fn(family_ops::OpsError) -> LoadError + '_ {
    move |e| LoadError::Forward(format!("{what}: {e}"))
}

/// What mHC pre hands on: the layer input, the post weights (per stream)
/// and the mixing matrix (`comb[dst + hc · src]`).
type HcPre = (Vec<f32>, Vec<f32>, Vec<f32>);

/// Per-layer caches.
#[derive(Debug)]
enum Cache {
    Kda {
        /// Per q, k, v: each channel's last `d_conv - 1` projections,
        /// oldest first (`[channel][d_conv - 1]`).
        conv: [Vec<f32>; 3],
        /// Per head, the delta rule's state in ggml's transposed layout
        /// (`[value j][key i]`).
        state: Vec<Vec<f32>>,
    },
    Mla {
        /// The normed latent of every position, as stored (the K type).
        kv: Vec<f32>,
        /// Indexer keys (LayerNormed) per position, as stored.
        ik: Vec<f32>,
        /// Indexer pool gates per position, as stored.
        ig: Vec<f32>,
        /// Pooled keys of the complete pools, as stored.
        pooled: Vec<f32>,
    },
}

/// A sequence being decoded: its caches and position.
pub struct State<'m> {
    model: &'m Glm5Next,
    reader: WeightReader<'m>,
    caches: Vec<Cache>,
    pos: usize,
    /// Prompt length: llama.cpp sizes the pool-score row by the pools of the
    /// whole batch during prefill (it only matters for score ties).
    n_prefill: usize,
    /// The caches' element types: the MLA latent and the indexer's cache
    /// are llama.cpp's K cache.
    numerics: Numerics,
    /// The ubatch the token being fed belongs to ([`Ubatch::of`]).
    ubatch: Ubatch,
    /// How many tokens that ubatch holds (the attention gathers the
    /// selected latents for small ones).
    ubatch_len: usize,
}

impl std::fmt::Debug for State<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State").field("pos", &self.pos).finish()
    }
}

impl<'m> State<'m> {
    /// An empty sequence of `model` whose weights are read by `reader`;
    /// `n_prefill` is the prompt's length; its caches as `numerics` says.
    ///
    /// # Errors
    ///
    /// None today (every [`Numerics`] is computed: flash attention as
    /// llama.cpp's CPU build runs it, `family_ops::ggml_cpu::attention_flash`);
    /// the `Result` is the family contract's.
    pub fn new(
        model: &'m Glm5Next,
        reader: WeightReader<'m>,
        n_prefill: usize,
        numerics: Numerics,
    ) -> Result<State<'m>, LoadError> {
        let hp = model.hparams();
        let caches = model
            .handles()
            .layers
            .iter()
            .map(|l| match l.mixer {
                Mixer::Kda(_) => Cache::Kda {
                    conv: std::array::from_fn(|_| vec![0.0; hp.d_inner() * (hp.d_conv - 1)]),
                    state: vec![vec![0.0; hp.kda_head_dim * hp.kda_head_dim]; hp.n_head],
                },
                Mixer::Mla(_) => Cache::Mla {
                    kv: Vec::new(),
                    ik: Vec::new(),
                    ig: Vec::new(),
                    pooled: Vec::new(),
                },
            })
            .collect();
        Ok(State {
            model,
            reader,
            caches,
            pos: 0,
            n_prefill,
            numerics,
            ubatch: Ubatch::One,
            ubatch_len: 1,
        })
    }

    /// The reader.
    pub fn reader(&self) -> &WeightReader<'m> {
        &self.reader
    }

    fn w(&self, h: family_kit::Handle) -> &'m Weight {
        self.model.get(h)
    }

    fn vec(&self, h: family_kit::Handle) -> Result<std::sync::Arc<[f32]>, LoadError> {
        self.reader.vector(self.w(h))
    }

    /// Rows `first..first + n` of `w` times `x` as ggml's `mul_mat` (or,
    /// with [`Ubatch::One`], `mul_mat_id`'s per-token kernels) computes
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
    fn mm(&self, h: family_kit::Handle, x: &[f32]) -> Result<Vec<f32>, LoadError> {
        let w = self.w(h);
        let rows = w.dims().iter().skip(1).product::<u64>() as usize;
        self.mm_rows(w, 0, rows, x, self.ubatch)
    }

    /// `rms_norm(x) * w` (ggml's `rms_norm` then `mul`).
    fn rms(&self, x: &mut [f32], w: family_kit::Handle) -> Result<(), LoadError> {
        let eps = self.model.hparams().eps;
        let gamma = self.vec(w)?;
        rms_norm_in_place(x, eps, NormWeight::Scale(&gamma)).map_err(ops("rms_norm"))
    }

    /// Feeds `tokens` as llama.cpp's batched prefill does (one ubatch of
    /// them all): the same pass as [`State::step`] token after token, with
    /// ggml's several-token kernels ([`Ubatch::of`]) and, past
    /// [`GATHER_MAX_UBATCH`] tokens, the attention scattered over the
    /// cache. Returns the logits of every position.
    ///
    /// # Errors
    ///
    /// As [`State::step`].
    pub fn prefill_all(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>, LoadError> {
        if self.pos == 0 {
            self.n_prefill = tokens.len();
        }
        self.ubatch_len = tokens.len();
        let mut logits = Vec::with_capacity(tokens.len());
        for (i, &t) in tokens.iter().enumerate() {
            self.ubatch = Ubatch::of(i, tokens.len());
            match self.step(t) {
                Ok(l) => logits.push(l),
                Err(e) => {
                    (self.ubatch, self.ubatch_len) = (Ubatch::One, 1);
                    return Err(e);
                }
            }
        }
        (self.ubatch, self.ubatch_len) = (Ubatch::One, 1);
        Ok(logits)
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
        let e = self.reader.rows(self.w(h.token_embd), token as usize, 1)?;
        let mut streams: Vec<f32> = e.repeat(hp.hc);
        let mut prev_sel: Option<Vec<Option<usize>>> = None;
        for (il, layer) in h.layers.iter().enumerate() {
            let (mut x, post, comb) = self.hc_pre(&streams, &layer.hc_attn)?;
            self.rms(&mut x, layer.attn_norm)?;
            let y = match layer.mixer {
                Mixer::Kda(k) => self.kda(il, &k, &x)?,
                Mixer::Mla(m) => self.mla(il, &m, &x, &mut prev_sel)?,
            };
            streams =
                ggml_cpu::hc_post_mixed(&y, &streams, &post, &comb).map_err(ops("mHC post"))?;
            let (mut x, post, comb) = self.hc_pre(&streams, &layer.hc_ffn)?;
            self.rms(&mut x, layer.ffn_norm)?;
            let y = self.ffn(il, &layer.ffn, &x)?;
            streams =
                ggml_cpu::hc_post_mixed(&y, &streams, &post, &comb).map_err(ops("mHC post"))?;
        }
        // build_hc_mean: the streams added in order, then scaled by 1/hc.
        let n = hp.n_embd;
        let mut mean = streams[..n].to_vec();
        for s in streams.chunks_exact(n).skip(1) {
            mean.iter_mut().zip(s).for_each(|(m, v)| *m += v);
        }
        let inv = 1.0 / hp.hc as f32;
        mean.iter_mut().for_each(|m| *m *= inv);
        self.rms(&mut mean, h.output_norm)?;
        let logits = self.mm(h.output, &mean)?;
        self.pos += 1;
        Ok(logits)
    }

    /// mHC pre (`build_hc_pre`): the streams RMS-normed whole, the mixes
    /// `fn · flat`, the pre and post weights by ggml's element-wise ops,
    /// the mixing matrix by the fused `ggml_dsv4_hc_comb`, and the layer
    /// input by the fused `ggml_dsv4_hc_pre`.
    fn hc_pre(&self, streams: &[f32], hc: &HcHandles) -> Result<HcPre, LoadError> {
        let hp = self.model.hparams();
        let n = hp.hc;
        let mut flat = streams.to_vec();
        rms_norm_in_place(&mut flat, hp.eps, NormWeight::None).map_err(ops("mHC norm"))?;
        let mix = self.mm(hc.fn_, &flat)?;
        let (sc, base) = (self.vec(hc.scale)?, self.vec(hc.base)?);
        let pre: Vec<f32> = (0..n)
            .map(|c| {
                let v = mix[c] * sc[0] + base[c];
                ggml_cpu::sigmoid(v) * 1.0 + hp.hc_eps
            })
            .collect();
        let post: Vec<f32> = (0..n)
            .map(|c| {
                let v = mix[n + c] * sc[1] + base[n + c];
                ggml_cpu::sigmoid(v) * 2.0
            })
            .collect();
        let comb = ggml_cpu::hc_comb(
            &mix[2 * n..2 * n + n * n],
            sc[2],
            &base[2 * n..2 * n + n * n],
            n,
            hp.hc_eps,
            hp.sinkhorn_iters,
        )
        .map_err(ops("mHC comb"))?;
        let mut x = vec![0f32; hp.n_embd];
        ggml_cpu::hc_pre_weighted(streams, &pre, 1.0, &mut x).map_err(ops("mHC pre"))?;
        Ok((x, post, comb))
    }

    fn kda(&mut self, il: usize, k: &KdaHandles, x: &[f32]) -> Result<Vec<f32>, LoadError> {
        let hp = self.model.hparams();
        let (nh, s) = (hp.n_head, hp.kda_head_dim);
        let di = hp.d_inner();
        let mut qkv: Vec<Vec<f32>> = Vec::with_capacity(3);
        for i in 0..3 {
            let u = self.mm(k.qkv[i], x)?;
            let w = self.vec(k.conv[i])?;
            let Cache::Kda { conv, .. } = &mut self.caches[il] else {
                unreachable!("layer {il} is KDA")
            };
            let mut c = vec![0f32; di];
            ggml_cpu::ssm_conv(&mut conv[i], &u, &w, &mut c).map_err(ops("KDA conv"))?;
            ggml_cpu::silu_row(&mut c);
            qkv.push(c);
        }
        let mut g = self.mm(k.f_b, &self.mm(k.f_a, x)?)?;
        let (dt, a) = (self.vec(k.dt_bias)?, self.vec(k.a)?);
        for (ch, g) in g.iter_mut().enumerate() {
            let g1 = *g + dt[ch];
            let a = a[ch / s];
            *g = match hp.gate_lower_bound {
                // mul by A, scale by -1, sigmoid, scale by the bound.
                Some(lb) => ggml_cpu::sigmoid(-(g1 * a)) * lb,
                None => ggml_cpu::softplus(g1) * a,
            };
        }
        let beta: Vec<f32> = self
            .mm(k.beta, x)?
            .into_iter()
            .map(ggml_cpu::sigmoid)
            .collect();
        let g2 = self.mm(k.g_b, &self.mm(k.g_a, x)?)?;
        let norm = self.vec(k.norm)?;
        let Cache::Kda { state, .. } = &mut self.caches[il] else {
            unreachable!("layer {il} is KDA")
        };
        let mut out = vec![0f32; di];
        for h in 0..nh {
            let r = h * s..(h + 1) * s;
            let mut q = qkv[0][r.clone()].to_vec();
            let mut kk = qkv[1][r.clone()].to_vec();
            ggml_cpu::l2_norm(&mut q, L2_EPS).map_err(ops("KDA q norm"))?;
            ggml_cpu::l2_norm(&mut kk, L2_EPS).map_err(ops("KDA k norm"))?;
            ggml_cpu::gated_delta_net_kda(
                &mut state[h],
                &q,
                &kk,
                &qkv[2][r.clone()],
                &g[r.clone()],
                beta[h],
                &mut out[r.clone()],
            )
            .map_err(ops("KDA delta rule"))?;
            let o = &mut out[r.clone()];
            rms_norm_in_place(o, hp.eps, NormWeight::Scale(&norm)).map_err(ops("KDA norm"))?;
            o.iter_mut()
                .zip(&g2[r])
                .for_each(|(o, &g)| *o *= ggml_cpu::sigmoid(g));
        }
        self.mm(k.out, &out)
    }

    /// The cells position `self.pos` attends, from a full indexer, in the
    /// slots of llama.cpp's gather (`glm5-next.cpp`,
    /// `llama-memory-hybrid-idx.cpp`): `n_top` pools of `kpool` slots, the
    /// visible pools by descending score then dead slots, then `kpool - 1`
    /// tail slots `p, p - 1, ...` (dead past the tail). `None` is a dead
    /// slot (masked to `-inf`).
    fn select(
        &mut self,
        il: usize,
        ix: &kpool::KpoolWeights,
        x: &[f32],
        qr: &[f32],
    ) -> Result<Vec<Option<usize>>, LoadError> {
        let hp = self.model.hparams();
        let (kp, idim, ih, p) = (hp.kpool, hp.idx_dim, hp.idx_heads, self.pos);
        let ktype = self.numerics.cache_type_k;
        let mut ik = self.mm(ix.k, x)?;
        ggml_cpu::norm(&mut ik, hp.eps_ln);
        let (kn, kb) = (self.vec(ix.k_norm)?, self.vec(ix.k_norm_b)?);
        ik.iter_mut()
            .zip(kn.iter().zip(kb.iter()))
            .for_each(|(v, (g, b))| *v = *v * g + b);
        let mut ig = self.mm(ix.gate, x)?;
        let ape = self.vec(ix.ape)?;
        let iq = self.mm(ix.q_b, qr)?;
        let scale = 1.0 / ((idim * ih) as f32).sqrt();
        let wt: Vec<f32> = self.mm(ix.proj, x)?.iter().map(|v| v * scale).collect();
        // The key and the gate as the cache stores them.
        ktype.store_in_place(&mut ik);
        ktype.store_in_place(&mut ig);
        let Cache::Mla {
            ik: iks,
            ig: igs,
            pooled,
            ..
        } = &mut self.caches[il]
        else {
            unreachable!("layer {il} is MLA")
        };
        iks.extend_from_slice(&ik);
        igs.extend_from_slice(&ig);
        if (p + 1) % kp == 0 {
            // A pool completes: a softmax over its members of gate plus
            // position embedding per dimension, the keys weighed by it
            // (`ggml_mul`, then `ggml_sum_rows`).
            let b0 = p + 1 - kp;
            let mut pool = vec![0f32; idim];
            let mut logits = vec![0f32; kp];
            for (d, out) in pool.iter_mut().enumerate() {
                for (m, l) in logits.iter_mut().enumerate() {
                    *l = igs[(b0 + m) * idim + d] + ape[m * idim + d];
                }
                soft_max(&mut logits, 1.0, None).map_err(ops("pool softmax"))?;
                let terms: Vec<f32> = (0..kp)
                    .map(|m| logits[m] * iks[(b0 + m) * idim + d])
                    .collect();
                *out = ggml_cpu::sum(&terms);
            }
            ktype.store_in_place(&mut pool);
            pooled.extend_from_slice(&pool);
        }
        let nv = (p + 1) / kp;
        let scores: Vec<f32> = pooled
            .chunks_exact(idim)
            .take(nv)
            .map(|pk| ggml_cpu::lightning_score(&iq, pk, &wt, 0.0))
            .collect();
        Ok(kpool::slots(
            &scores,
            p,
            self.n_prefill,
            &self.model.kpool_shape(),
        ))
    }

    fn mla(
        &mut self,
        il: usize,
        m: &MlaHandles,
        x: &[f32],
        prev_sel: &mut Option<Vec<Option<usize>>>,
    ) -> Result<Vec<f32>, LoadError> {
        let hp = self.model.hparams();
        let (nh, dk, dv, lat) = (hp.n_head, hp.dk, hp.dv, hp.kv_lora);
        let mut qr = self.mm(m.mla.q_a, x)?;
        self.rms(&mut qr, m.mla.q_a_norm)?;
        let q = self.mm(m.mla.q_b, &qr)?;
        let mut kv = self.mm(m.mla.kv_a, x)?;
        self.rms(&mut kv, m.mla.kv_a_norm)?;
        // q permuted to [dk, n_tokens, n_head]: contiguous with one head; an
        // F32 k_b takes a strided one as is (vec_dot), any other type
        // converts it first.
        let k_b = self.w(m.mla.k_b);
        let k_b_ubatch = match k_b.ggml_type() {
            GgmlType::F32 if nh > 1 => Ubatch::One,
            _ => self.ubatch,
        };
        let mut qa = Vec::with_capacity(nh * lat);
        for h in 0..nh {
            qa.extend(self.mm_rows(k_b, h * lat, lat, &q[h * dk..(h + 1) * dk], k_b_ubatch)?);
        }
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
        self.numerics.cache_type_k.store_in_place(&mut kv);
        let ktype = self.numerics.cache_type_k;
        let Cache::Mla { kv: kvs, .. } = &mut self.caches[il] else {
            unreachable!("layer {il} is MLA")
        };
        kvs.extend_from_slice(&kv);
        let scale = 1.0 / (dk as f32).sqrt();
        let mut lats = vec![0f32; nh * lat];
        let gathered = kpool::is_gathered(self.ubatch_len, sel.len());
        if gathered {
            // The gathered attention (F32 rows read back from the cache):
            // scores by `ggml_vec_dot_f32`, `ggml_soft_max_ext` with the
            // slot mask, the latent as the dot of each latent channel
            // across the slots with the weights.
            let mask: Vec<f32> = sel
                .iter()
                .map(|c| if c.is_some() { 0.0 } else { f32::NEG_INFINITY })
                .collect();
            let cell = |j: usize| &kvs[j * lat..(j + 1) * lat];
            for (qa_h, out) in qa.chunks_exact(lat).zip(lats.chunks_exact_mut(lat)) {
                let mut s: Vec<f32> = sel
                    .iter()
                    .map(|c| c.map_or(0.0, |j| dot_f32(cell(j), qa_h)))
                    .collect();
                soft_max(&mut s, scale, Some(&mask)).map_err(ops("attention softmax"))?;
                let mut col = vec![0f32; sel.len()];
                for (i, o) in out.iter_mut().enumerate() {
                    for (v, c) in col.iter_mut().zip(&sel) {
                        *v = c.map_or(0.0, |j| kvs[j * lat + i]);
                    }
                    *o = dot_f32(&col, &s);
                }
            }
        } else {
            // Scattered over the cache: the selected cells, causal.
            let mut mask = vec![f32::NEG_INFINITY; self.pos + 1];
            for &j in sel.iter().flatten() {
                mask[j] = 0.0;
            }
            let cells = KvCells {
                k: kvs,
                k_stride: lat,
                v: kvs,
                v_stride: lat,
                first_cell: 0,
                mask: Some(&mask),
                k_type: ktype,
                v_type: ktype,
            };
            let shape = AttentionShape {
                n_head: nh,
                n_head_kv: 1,
                head_dim_k: lat,
                head_dim_v: lat,
            };
            // The absorbed q is the permuted output of a mul_mat:
            // contiguous whatever the heads.
            if self.numerics.flash_attn {
                ggml_cpu::attention_flash(&qa, &cells, &shape, scale, 0.0, &mut lats)
            } else {
                ggml_cpu::attention_cached_q(
                    &qa,
                    true,
                    &cells,
                    &shape,
                    scale,
                    self.ubatch,
                    &mut lats,
                )
            }
            .map_err(ops("attention"))?;
        }
        // Flash attention's output reaches v_b permuted, strided with
        // several heads: an F32 v_b takes it as is, by vec_dot.
        let v_b = self.w(m.mla.v_b);
        let v_b_ubatch = match v_b.ggml_type() {
            GgmlType::F32 if self.numerics.flash_attn && !gathered && nh > 1 => Ubatch::One,
            _ => self.ubatch,
        };
        let mut o = Vec::with_capacity(nh * dv);
        for (h, l) in lats.chunks_exact(lat).enumerate() {
            o.extend(self.mm_rows(v_b, h * dv, dv, l, v_b_ubatch)?);
        }
        self.mm(m.mla.out, &o)
    }

    /// `build_ffn` (SiLU, parallel gate) over `[gate, up, down]`, the
    /// clamped SwiGLU where `limit` is set; `ubatch` picks the products'
    /// kernels (`mul_mat_id`'s experts: [`Ubatch::One`]).
    fn swiglu(
        &self,
        w: [&'m Weight; 3],
        rows: usize,
        x: &[f32],
        limit: f32,
        ubatch: Ubatch,
    ) -> Result<Vec<f32>, LoadError> {
        let up = self.mm_rows(w[1], 0, rows, x, ubatch)?;
        let gate = self.mm_rows(w[0], 0, rows, x, ubatch)?;
        let mut a = vec![0f32; rows];
        if limit > 1e-6 {
            ggml_cpu::swiglu_clamp(&gate, &up, limit, &mut a).map_err(ops("swiglu"))?;
        } else {
            ggml_cpu::swiglu(&gate, &up, &mut a).map_err(ops("swiglu"))?;
        }
        let n_embd = self.model.hparams().n_embd;
        self.mm_rows(w[2], 0, n_embd, &a, ubatch)
    }

    fn ffn(&self, il: usize, ffn: &Ffn, x: &[f32]) -> Result<Vec<f32>, LoadError> {
        let hp = self.model.hparams();
        let dense = |[g, u, d]: [family_kit::Handle; 3]| {
            let rows = self.w(g).dims()[1] as usize;
            self.swiglu(
                [self.w(g), self.w(u), self.w(d)],
                rows,
                x,
                hp.clamp_shexp[il],
                self.ubatch,
            )
        };
        match *ffn {
            Ffn::Dense(w) => dense(w),
            Ffn::Moe {
                router,
                bias,
                banks,
                shared,
            } => {
                let logits = self.mm(router, x)?;
                let bias = self.vec(bias)?;
                let picked = ggml_cpu::moe::route_sigmoid(
                    &logits,
                    Some(&bias),
                    hp.n_expert_used[il],
                    hp.expert_weights_norm,
                    hp.expert_weights_scale,
                );
                let model = self.model;
                let mut outs = Vec::with_capacity(picked.len());
                for &(e, _) in &picked {
                    let [(g, gr), (u, ur), (d, dr)] = banks.each();
                    let w = [
                        model.expert(g, e, gr)?,
                        model.expert(u, e, ur)?,
                        model.expert(d, e, dr)?,
                    ];
                    outs.push(self.swiglu(w, hp.n_ff_exp[il], x, hp.clamp_exp[il], Ubatch::One)?);
                }
                let weights: Vec<f32> = picked.iter().map(|&(_, w)| w).collect();
                let mut out = vec![0f32; hp.n_embd];
                ggml_cpu::moe::mix(&outs, &weights, &mut out);
                let sh = dense(shared)?;
                out.iter_mut().zip(&sh).for_each(|(o, s)| *o += s);
                Ok(out)
            }
        }
    }
}

pub use family_kit::Decoded;

/// The family contract's decoder ([`family_kit::Decoder`]): the prompt fed
/// one token at a time as [`greedy`] feeds it; a prefill at position 0 sets
/// the prompt's length (the pool-score row of the indexer during prefill).
impl family_kit::Decoder for State<'_> {
    fn prefill(&mut self, tokens: &[u32]) -> Result<Vec<f32>, LoadError> {
        if tokens.is_empty() {
            return Err(LoadError::empty_prompt());
        }
        if self.pos == 0 {
            self.n_prefill = tokens.len();
        }
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
/// A token out of the vocabulary, or a weight the seam failed to hand out.
pub fn greedy(
    model: &Glm5Next,
    reader: WeightReader<'_>,
    numerics: Numerics,
    prompt: &[u32],
    steps: usize,
    after_step: &mut dyn FnMut(),
) -> Result<Decoded, LoadError> {
    let mut state = State::new(model, reader, prompt.len(), numerics)?;
    family_kit::greedy(prompt, steps, &mut |t| state.step(t), after_step)
}
