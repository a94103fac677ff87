//! The CPU forward pass, one token at a time, as docs/families/glm5_next.md
//! (sections 3-7) states it and tools/oracle/glm5_next_ref.py computes it
//! (activations in `f64`), except the mHC layer input and the MLA latent
//! path, which are ggml's `f32` arithmetic bit for bit
//! (`family_ops::ggml_cpu`; docs section 10: the attention scores are
//! ill-conditioned, and llama.cpp's last bits decide later F16/Q8_0
//! roundings). Every weight is asked of `seam::resident_weight`
//! on every use through the kit's [`WeightReader`] (matrices read by rows,
//! only small vectors kept dequantized); a routed expert is its sub-span
//! weight, staged when the router picks it. The caches are the MLA latent,
//! the indexer keys and pools, the KDA conv windows and delta-rule states.

use std::collections::VecDeque;

use family_kit::{LoadError, Numerics, WeightReader};
use family_ops::ggml_cpu::{dot_f32, soft_max};
use family_ops::libstdcxx_top_k;
use family_ops::{Gating, Routing};
use family_ops::{NormWeight, rms_norm_in_place};
use seam::gguf::GgmlType;
use seam::weight::Weight;

use crate::hparams::Hparams;
use crate::model::{Ffn, Glm5Next, HcHandles, IndexerHandles, KdaHandles, Mixer, MlaHandles};

/// The L2-norm epsilon of KDA's q and k (a constant, `glm5-next.cpp:738`).
const L2_EPS: f64 = 1e-6;

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn silu(x: f64) -> f64 {
    x * sigmoid(x)
}

fn softplus(x: f64) -> f64 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
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

/// `rms(x) * w` as ggml computes it in `f32` (`family_ops::rms_norm`).
fn rms_w_f32(x: &[f32], eps: f32, w: &[f32]) -> Result<Vec<f32>, LoadError> {
    let mut y = x.to_vec();
    rms_norm_in_place(&mut y, eps, NormWeight::Scale(w))
        .map_err(|e| LoadError::Forward(format!("rms_norm: {e}")))?;
    Ok(y)
}

fn widen(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| f64::from(v)).collect()
}

fn narrow(x: &[f64]) -> Vec<f32> {
    x.iter().map(|&v| v as f32).collect()
}

/// `x / sqrt(mean(x²) + eps)`.
fn rms(x: &[f64], eps: f32) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let s = 1.0 / (ms + f64::from(eps)).sqrt();
    x.iter().map(|v| v * s).collect()
}

fn rms_w(x: &[f64], eps: f32, w: &[f32]) -> Vec<f64> {
    rms(x, eps)
        .into_iter()
        .zip(w)
        .map(|(v, &w)| v * f64::from(w))
        .collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// SwiGLU with llama.cpp's DeepSeek-V4 clamp (`ops.cpp:3571-3628`): the
/// gate input clamped from above, up clamped both ways; off at <= 1e-6.
fn swiglu(g: &[f64], u: &[f64], limit: f32) -> Vec<f64> {
    let l = f64::from(limit);
    g.iter()
        .zip(u)
        .map(|(&g, &u)| {
            if limit > 1e-6 {
                silu(g.min(l)) * u.clamp(-l, l)
            } else {
                silu(g) * u
            }
        })
        .collect()
}

// `x` as ggml's CPU matrix product sees it for a weight of type `ty`
// (docs/families/glm5_next.md, section 8).
use family_ops::as_ggml_multiplies_f64 as ggml_activation;

/// What mHC pre hands on: the layer input, the post weights (per
/// stream) and comb (`[dst][src]`).
type HcPre = (Vec<f64>, Vec<f64>, Vec<Vec<f64>>);

/// Per-layer caches.
#[derive(Debug)]
enum Cache {
    Kda {
        /// Per q, k, v: the previous `d_conv - 1` projections, oldest first.
        conv: [VecDeque<Vec<f64>>; 3],
        /// Per head `[key i][value j]`, row-major.
        state: Vec<Vec<f64>>,
    },
    Mla {
        /// The normed latent of every position (an F32 cache, as llama.cpp's
        /// with `type_k` F32).
        kv: Vec<Vec<f32>>,
        /// Indexer keys (LayerNormed) per position.
        ik: Vec<Vec<f64>>,
        /// Indexer pool gates per position.
        ig: Vec<Vec<f64>>,
        /// Pooled keys of the complete pools.
        pooled: Vec<Vec<f64>>,
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
    /// The caches' element types: the MLA latent is llama.cpp's K cache.
    numerics: Numerics,
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
    /// `numerics` asks for flash attention, which this pass does not do.
    pub fn new(
        model: &'m Glm5Next,
        reader: WeightReader<'m>,
        n_prefill: usize,
        numerics: Numerics,
    ) -> Result<State<'m>, LoadError> {
        family_kit::numerics::refuse_flash_attn("glm5_next", numerics)?;
        let hp = model.hparams();
        let caches = model
            .handles()
            .layers
            .iter()
            .map(|l| match l.mixer {
                Mixer::Kda(_) => Cache::Kda {
                    conv: std::array::from_fn(|_| {
                        (0..hp.d_conv - 1)
                            .map(|_| vec![0.0; hp.d_inner()])
                            .collect()
                    }),
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
        })
    }

    /// The reader.
    pub fn reader(&self) -> &WeightReader<'m> {
        &self.reader
    }

    fn w(&self, h: family_kit::Handle) -> &'m Weight {
        self.model.get(h)
    }

    /// All rows of `h` times `x` as [`State::mv_rows_f32`].
    fn mv_f32(&self, h: family_kit::Handle, x: &[f64]) -> Result<Vec<f32>, LoadError> {
        let w = self.w(h);
        let rows = w.dims().iter().skip(1).product::<u64>() as usize;
        self.mv_rows_f32(w, 0, rows, x)
    }

    fn mv(&self, h: family_kit::Handle, x: &[f64]) -> Result<Vec<f64>, LoadError> {
        let w = self.w(h);
        self.reader
            .matvec_all(w, &ggml_activation(w.ggml_type(), x))
    }

    /// Rows `first..first + n` of `w` times `x`, `x` rounded as ggml does.
    fn mv_rows(
        &self,
        w: &Weight,
        first: usize,
        n: usize,
        x: &[f64],
    ) -> Result<Vec<f64>, LoadError> {
        self.reader
            .matvec(w, first, n, &ggml_activation(w.ggml_type(), x))
    }

    /// Rows `first..first + n` of `w` times `x` as ggml's one-token
    /// `mul_mat` computes them in `f32`: F32 and BF16 weights bit for bit
    /// ([`family_kit::WeightReader::matvec_ggml_rows`], `x` rounded to
    /// `f32` first); any other type as [`State::mv_rows`], rounded to `f32`.
    fn mv_rows_f32(
        &self,
        w: &Weight,
        first: usize,
        n: usize,
        x: &[f64],
    ) -> Result<Vec<f32>, LoadError> {
        if !matches!(w.ggml_type(), GgmlType::F32 | GgmlType::BF16) {
            return Ok(self
                .mv_rows(w, first, n, x)?
                .into_iter()
                .map(|v| v as f32)
                .collect());
        }
        let x: Vec<f32> = x.iter().map(|&v| v as f32).collect();
        self.reader
            .matvec_ggml_rows(w, first, n, &x, family_ops::ggml_cpu::Ubatch::One)
    }

    fn vec(&self, h: family_kit::Handle) -> Result<std::sync::Arc<[f32]>, LoadError> {
        self.reader.vector(self.w(h))
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
        let e: Vec<f64> = self
            .reader
            .rows(self.w(h.token_embd), token as usize, 1)?
            .into_iter()
            .map(f64::from)
            .collect();
        let mut streams = vec![e; hp.hc];
        let mut prev_sel: Option<Vec<Option<usize>>> = None;
        for (il, layer) in h.layers.iter().enumerate() {
            let (x, post, comb) = self.hc_pre(&streams, &layer.hc_attn)?;
            let x = widen(&rms_w_f32(
                &narrow(&x),
                hp.eps,
                &self.vec(layer.attn_norm)?,
            )?);
            let y = match layer.mixer {
                Mixer::Kda(k) => self.kda(il, &k, &x)?,
                Mixer::Mla(m) => self.mla(il, &m, &x, &mut prev_sel)?,
            };
            streams = hc_post(&y, &streams, &post, &comb);
            let (x, post, comb) = self.hc_pre(&streams, &layer.hc_ffn)?;
            let x = rms_w(&x, hp.eps, &self.vec(layer.ffn_norm)?);
            let y = self.ffn(il, &layer.ffn, &x)?;
            streams = hc_post(&y, &streams, &post, &comb);
        }
        let n = streams.len() as f64;
        let mean: Vec<f64> = (0..hp.n_embd)
            .map(|i| streams.iter().map(|s| s[i]).sum::<f64>() / n)
            .collect();
        let out = rms_w(&mean, hp.eps, &self.vec(h.output_norm)?);
        let logits = self.mv(h.output, &out)?;
        self.pos += 1;
        Ok(logits.into_iter().map(|v| v as f32).collect())
    }

    /// mHC pre: the layer input and the post and comb weights.
    fn hc_pre(&self, streams: &[Vec<f64>], hc: &HcHandles) -> Result<HcPre, LoadError> {
        let hp = self.model.hparams();
        let n = hp.hc;
        let eps = f64::from(hp.hc_eps);
        let mut flat: Vec<f32> = streams.iter().flat_map(|s| narrow(s)).collect();
        rms_norm_in_place(&mut flat, hp.eps, NormWeight::None)
            .map_err(|e| LoadError::Forward(format!("mHC norm: {e}")))?;
        let mix32 = self.mv_f32(hc.fn_, &widen(&flat))?;
        let mix = widen(&mix32);
        let sc: Vec<f64> = self.vec(hc.scale)?.iter().map(|&v| f64::from(v)).collect();
        let base: Vec<f64> = self.vec(hc.base)?.iter().map(|&v| f64::from(v)).collect();
        let post: Vec<f64> = (0..n)
            .map(|c| 2.0 * sigmoid(mix[n + c] * sc[1] + base[n + c]))
            .collect();
        // a[src][dst] = mix[2n + n*src + dst]: softmax over dst per src.
        let mut a: Vec<Vec<f64>> = (0..n)
            .map(|s| {
                let mut row: Vec<f64> = (0..n)
                    .map(|d| mix[2 * n + n * s + d] * sc[2] + base[2 * n + n * s + d])
                    .collect();
                softmax(&mut row);
                row.iter_mut().for_each(|v| *v += eps);
                row
            })
            .collect();
        // Per dst: divide by the sum over src (+ eps).
        let norm_cols = |a: &mut [Vec<f64>]| {
            let sums: Vec<f64> = (0..n)
                .map(|d| a.iter().map(|row| row[d]).sum::<f64>() + eps)
                .collect();
            for row in a.iter_mut() {
                row.iter_mut().zip(&sums).for_each(|(v, s)| *v /= s);
            }
        };
        norm_cols(&mut a);
        for _ in 1..hp.sinkhorn_iters {
            // Per src: divide by the sum over dst (+ eps).
            for row in a.iter_mut() {
                let sum: f64 = row.iter().sum::<f64>() + eps;
                row.iter_mut().for_each(|v| *v /= sum);
            }
            norm_cols(&mut a);
        }
        let comb: Vec<Vec<f64>> = (0..n).map(|d| (0..n).map(|s| a[s][d]).collect()).collect();
        // The pre weights and their sum as ggml's `f32` ops form them:
        // `sigmoid(mix·scale + base) + eps` (`1/(1 + expf(-v))`), then the
        // fused `dsv4_hc_pre` (`ops.cpp:11477-11536`): `sum += x·w` in
        // stream order, each product rounded (not fused, as compiled).
        let (sc32, base32) = (self.vec(hc.scale)?, self.vec(hc.base)?);
        let pre32: Vec<f32> = (0..n)
            .map(|c| {
                let v = mix32[c] * sc32[0] + base32[c];
                1.0 / (1.0 + (-v).exp()) + hp.hc_eps
            })
            .collect();
        let x: Vec<f64> = (0..hp.n_embd)
            .map(|i| {
                let sum = (0..n).fold(0f32, |s, c| s + (streams[c][i] as f32) * pre32[c]);
                f64::from(sum)
            })
            .collect();
        Ok((x, post, comb))
    }

    fn kda(&mut self, il: usize, k: &KdaHandles, x: &[f64]) -> Result<Vec<f64>, LoadError> {
        let hp = self.model.hparams();
        let (nh, s, dc) = (hp.n_head, hp.kda_head_dim, hp.d_conv);
        let di = hp.d_inner();
        let mut qkv: Vec<Vec<f64>> = Vec::with_capacity(3);
        for i in 0..3 {
            let u = self.mv(k.qkv[i], x)?;
            let w = self.vec(k.conv[i])?;
            let Cache::Kda { conv, .. } = &mut self.caches[il] else {
                unreachable!("layer {il} is KDA")
            };
            let hist = &mut conv[i];
            let c: Vec<f64> = (0..di)
                .map(|ch| {
                    let mut acc = f64::from(w[ch * dc + dc - 1]) * u[ch];
                    for (j, past) in hist.iter().enumerate() {
                        acc += f64::from(w[ch * dc + j]) * past[ch];
                    }
                    silu(acc)
                })
                .collect();
            hist.push_back(u);
            if hist.len() > dc - 1 {
                hist.pop_front();
            }
            qkv.push(c);
        }
        let g1 = self.mv(k.f_b, &self.mv(k.f_a, x)?)?;
        let dt = self.vec(k.dt_bias)?;
        let a = self.vec(k.a)?;
        let g: Vec<f64> = (0..di)
            .map(|ch| {
                let g1 = g1[ch] + f64::from(dt[ch]);
                let a = f64::from(a[ch / s]);
                match hp.gate_lower_bound {
                    Some(lb) => f64::from(lb) * sigmoid(-(g1 * a)),
                    None => softplus(g1) * a,
                }
            })
            .collect();
        let beta: Vec<f64> = self.mv(k.beta, x)?.into_iter().map(sigmoid).collect();
        let g2 = self.mv(k.g_b, &self.mv(k.g_a, x)?)?;
        let norm = self.vec(k.norm)?;
        let Cache::Kda { state, .. } = &mut self.caches[il] else {
            unreachable!("layer {il} is KDA")
        };
        let l2 = |v: &[f64]| {
            let n = (v.iter().map(|x| x * x).sum::<f64>() + L2_EPS).sqrt();
            v.iter().map(|x| x / n).collect::<Vec<f64>>()
        };
        let mut out = Vec::with_capacity(di);
        for h in 0..nh {
            let r = h * s..(h + 1) * s;
            let (q, kk, v) = (
                l2(&qkv[0][r.clone()]),
                l2(&qkv[1][r.clone()]),
                &qkv[2][r.clone()],
            );
            let st = &mut state[h];
            for i in 0..s {
                let d = g[h * s + i].exp();
                st[i * s..(i + 1) * s].iter_mut().for_each(|x| *x *= d);
            }
            let delta: Vec<f64> = (0..s)
                .map(|j| (v[j] - (0..s).map(|i| st[i * s + j] * kk[i]).sum::<f64>()) * beta[h])
                .collect();
            for i in 0..s {
                for j in 0..s {
                    st[i * s + j] += kk[i] * delta[j];
                }
            }
            let o: Vec<f64> = (0..s)
                .map(|j| (0..s).map(|i| st[i * s + j] * q[i]).sum::<f64>() / (s as f64).sqrt())
                .collect();
            let o = rms_w(&o, hp.eps, &norm);
            out.extend(o.iter().zip(&g2[r]).map(|(o, g)| o * sigmoid(*g)));
        }
        self.mv(k.out, &out)
    }

    /// The cells position `self.pos` attends, from a full indexer, in the
    /// slots of llama.cpp's gather (`glm5-next.cpp:857-881`,
    /// `llama-memory-hybrid-idx.cpp:1228-1285`): `n_top` pools of `kpool`
    /// slots, the visible pools by descending score then dead slots, then
    /// `kpool - 1` tail slots `p, p - 1, ...` (dead past the tail). `None`
    /// is a dead slot (masked to `-inf`).
    fn select(
        &mut self,
        il: usize,
        ix: &IndexerHandles,
        x: &[f64],
        qr: &[f64],
    ) -> Result<Vec<Option<usize>>, LoadError> {
        let hp = self.model.hparams();
        let (kp, idim, ih, p) = (hp.kpool, hp.idx_dim, hp.idx_heads, self.pos);
        let ik = self.mv(ix.k, x)?;
        let mean = ik.iter().sum::<f64>() / idim as f64;
        let var = ik.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / idim as f64;
        let inv = 1.0 / (var + f64::from(hp.eps_ln)).sqrt();
        let (kn, kb) = (self.vec(ix.k_norm)?, self.vec(ix.k_norm_b)?);
        let ik: Vec<f64> = (0..idim)
            .map(|d| (ik[d] - mean) * inv * f64::from(kn[d]) + f64::from(kb[d]))
            .collect();
        let ig = self.mv(ix.gate, x)?;
        let ape = self.vec(ix.ape)?;
        let iq = self.mv(ix.q_b, qr)?;
        let wt = self.mv(ix.proj, x)?;
        let Cache::Mla {
            ik: iks,
            ig: igs,
            pooled,
            ..
        } = &mut self.caches[il]
        else {
            unreachable!("layer {il} is MLA")
        };
        iks.push(ik);
        igs.push(ig);
        if (p + 1) % kp == 0 {
            let b0 = p + 1 - kp;
            let pool: Vec<f64> = (0..idim)
                .map(|d| {
                    let mut w: Vec<f64> = (0..kp)
                        .map(|m| igs[b0 + m][d] + f64::from(ape[m * idim + d]))
                        .collect();
                    softmax(&mut w);
                    (0..kp).map(|m| w[m] * iks[b0 + m][d]).sum()
                })
                .collect();
            pooled.push(pool);
        }
        let nv = (p + 1) / kp;
        let n_real = if p < self.n_prefill {
            self.n_prefill / kp
        } else {
            nv
        };
        let n_pool = 64usize.max((n_real + 1).div_ceil(64) * 64);
        let n_top = n_pool.min(hp.top_k / kp);
        // Every visible pool is scored: the gather orders them by score.
        let scale = ((idim * ih) as f64).sqrt();
        let mut row = vec![f64::NEG_INFINITY; n_pool];
        for (b, pool) in pooled.iter().enumerate().take(nv) {
            row[b] = (0..ih)
                .map(|h| dot(&iq[h * idim..(h + 1) * idim], pool).max(0.0) * wt[h] / scale)
                .sum();
        }
        let mut live: Vec<usize> = libstdcxx_top_k(&row, n_top)
            .into_iter()
            .filter(|&b| row[b].is_finite())
            .collect();
        // ggml_argsort (descending) of the picked scores: std::sort, an
        // insertion sort at these lengths, so ties keep top_k's order.
        live.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
        let mut slots: Vec<Option<usize>> = Vec::with_capacity(kp * n_top + kp - 1);
        for r in 0..n_top {
            match live.get(r) {
                Some(&b) => slots.extend((b * kp..(b + 1) * kp).map(Some)),
                None => slots.extend(std::iter::repeat_n(None, kp)),
            }
        }
        let n_tail = (p + 1) % kp;
        slots.extend((0..kp - 1).map(|k| (k < n_tail).then(|| p - k)));
        Ok(slots)
    }

    fn mla(
        &mut self,
        il: usize,
        m: &MlaHandles,
        x: &[f64],
        prev_sel: &mut Option<Vec<Option<usize>>>,
    ) -> Result<Vec<f64>, LoadError> {
        let hp = self.model.hparams();
        let (nh, dk, dv, lat) = (hp.n_head, hp.dk, hp.dv, hp.kv_lora);
        // The latent path in ggml's f32 arithmetic: the attention scores
        // are ill-conditioned (hundreds, from terms that cancel), so q and
        // the latent must carry ggml's exact bits into them.
        let qr = widen(&rms_w_f32(
            &self.mv_f32(m.q_a, x)?,
            hp.eps,
            &self.vec(m.q_a_norm)?,
        )?);
        let q = widen(&self.mv_f32(m.q_b, &qr)?);
        let kv = widen(&rms_w_f32(
            &self.mv_f32(m.kv_a, x)?,
            hp.eps,
            &self.vec(m.kv_a_norm)?,
        )?);
        let k_b = self.w(m.k_b);
        let qa: Vec<Vec<f32>> = (0..nh)
            .map(|h| self.mv_rows_f32(k_b, h * lat, lat, &q[h * dk..(h + 1) * dk]))
            .collect::<Result<_, _>>()?;
        let Cache::Mla { kv: kvs, .. } = &mut self.caches[il] else {
            unreachable!("layer {il} is MLA")
        };
        kvs.push(
            kv.iter()
                .map(|&v| self.numerics.cache_type_k.stored(v as f32))
                .collect(),
        );
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
        let Cache::Mla { kv: kvs, .. } = &self.caches[il] else {
            unreachable!("layer {il} is MLA")
        };
        // The gathered attention in ggml's f32 arithmetic (`glm5-next.cpp:
        // 971-996`): scores by `ggml_vec_dot_f32`, `ggml_soft_max_ext` with
        // the slot mask, the latent as the dot of each latent channel
        // across the slots with the weights.
        let scale = 1.0 / (dk as f32).sqrt();
        let mask: Vec<f32> = sel
            .iter()
            .map(|c| if c.is_some() { 0.0 } else { f32::NEG_INFINITY })
            .collect();
        let mut lats = Vec::with_capacity(nh);
        for qa_h in &qa {
            // The scores, then their softmax in place.
            let mut s: Vec<f32> = sel
                .iter()
                .map(|c| c.map_or(0.0, |j| dot_f32(&kvs[j], qa_h)))
                .collect();
            soft_max(&mut s, scale, Some(&mask))
                .map_err(|e| LoadError::Forward(format!("layer {il} attention softmax: {e}")))?;
            let mut col = vec![0f32; sel.len()];
            let l: Vec<f64> = (0..lat)
                .map(|i| {
                    for (v, c) in col.iter_mut().zip(&sel) {
                        *v = c.map_or(0.0, |j| kvs[j][i]);
                    }
                    f64::from(dot_f32(&col, &s))
                })
                .collect();
            lats.push(l);
        }
        let v_b = self.w(m.v_b);
        let mut o = Vec::with_capacity(nh * dv);
        for (h, l) in lats.iter().enumerate() {
            o.extend(self.mv_rows(v_b, h * dv, dv, l)?);
        }
        self.mv(m.out, &o)
    }

    fn ffn(&self, il: usize, ffn: &Ffn, x: &[f64]) -> Result<Vec<f64>, LoadError> {
        let hp: &Hparams = self.model.hparams();
        let dense = |[g, u, d]: [family_kit::Handle; 3], limit: f32| {
            self.mv(d, &swiglu(&self.mv(g, x)?, &self.mv(u, x)?, limit))
        };
        match *ffn {
            Ffn::Dense(w) => dense(w, hp.clamp_shexp[il]),
            Ffn::Moe {
                router,
                bias,
                banks,
                shared,
            } => {
                let logits: Vec<f32> = self.mv(router, x)?.iter().map(|&v| v as f32).collect();
                let bias = self.vec(bias)?;
                let choices = family_ops::route(
                    &logits,
                    &Routing {
                        gating: Gating::Sigmoid,
                        k: hp.n_expert_used[il],
                        bias: Some(&bias),
                        normalize: hp.expert_weights_norm,
                        scale: hp.expert_weights_scale,
                    },
                )
                .map_err(|e| LoadError::Forward(format!("layer {il} router: {e}")))?;
                let mut out = dense(shared, hp.clamp_shexp[il])?;
                let model = self.model;
                for c in choices {
                    let [(g, gr), (u, ur), (d, dr)] = banks.each();
                    let (gw, uw) = (
                        model.expert(g, c.expert, gr)?,
                        model.expert(u, c.expert, ur)?,
                    );
                    let gate = self.mv_rows(gw, 0, hp.n_ff_exp[il], x)?;
                    let up = self.mv_rows(uw, 0, hp.n_ff_exp[il], x)?;
                    let a = swiglu(&gate, &up, hp.clamp_exp[il]);
                    let y = self.mv_rows(model.expert(d, c.expert, dr)?, 0, hp.n_embd, &a)?;
                    let w = f64::from(c.weight);
                    out.iter_mut().zip(&y).for_each(|(o, y)| *o += w * y);
                }
                Ok(out)
            }
        }
    }
}

/// mHC post: `R'[d] = y · post[d] + Σ_s comb[d][s] · R[s]`.
fn hc_post(y: &[f64], streams: &[Vec<f64>], post: &[f64], comb: &[Vec<f64>]) -> Vec<Vec<f64>> {
    (0..streams.len())
        .map(|d| {
            (0..y.len())
                .map(|i| {
                    y[i] * post[d]
                        + comb[d]
                            .iter()
                            .zip(streams)
                            .map(|(c, s)| c * s[i])
                            .sum::<f64>()
                })
                .collect()
        })
        .collect()
}

pub use family_kit::Decoded;

/// The family contract's decoder ([`family_kit::Decoder`]): the prompt fed
/// one token at a time as [`greedy`] feeds it; a prefill at position 0 sets
/// the prompt's length (the pool-score row of the indexer during prefill).
impl family_kit::Decoder for State<'_> {
    fn prefill(&mut self, tokens: &[u32]) -> Result<Vec<f32>, LoadError> {
        if tokens.is_empty() {
            return Err(LoadError::Forward("the prompt is empty".into()));
        }
        if self.pos == 0 {
            self.n_prefill = tokens.len();
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

#[cfg(test)]
mod tests {
    use super::*;
    use seam::gguf::GgmlType;

    #[test]
    fn activations_are_rounded_as_ggml_rounds_them_per_weight_type() {
        let third = 1.0 / 3.0;
        assert_eq!(
            ggml_activation(GgmlType::F32, &[third]),
            [f64::from(third as f32)]
        );
        let f16 = f64::from(half::f16::from_f32(third as f32).to_f32());
        assert_eq!(ggml_activation(GgmlType::F16, &[third]), [f16]);
        assert_ne!(f16, f64::from(third as f32));
        let bf16 = f64::from(half::bf16::from_f32(third as f32).to_f32());
        assert_eq!(ggml_activation(GgmlType::BF16, &[third]), [bf16]);
        assert_ne!(bf16, f16);
        // Q8_0: d = amax / 127 (stored f16), q = round(x / d).
        let mut x = vec![0.0; 32];
        x[0] = 1.0;
        x[1] = 0.3;
        x[2] = -0.5;
        let d = f64::from(half::f16::from_f32(1.0 / 127.0).to_f32());
        for ty in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q5_1] {
            let y = ggml_activation(ty, &x);
            assert_eq!(y[0], 127.0 * d, "{ty}");
            assert_eq!(y[1], 38.0 * d, "{ty}");
            assert_eq!(y[2], -64.0 * d, "{ty}: half away from zero");
            assert_eq!(y[3], 0.0);
        }
        // Q8_K: d = max / -127 in f32 with the signed max, q clamped to 127.
        let mut x = vec![0.0; 256];
        x[0] = -2.0;
        x[1] = 1.0;
        let y = ggml_activation(GgmlType::Q6_K, &x);
        let iscale = -127.0f32 / -2.0;
        assert_eq!(y[0], f64::from(-127.0 / iscale));
        assert_eq!(y[1], f64::from(64.0 / iscale));
        assert_eq!(ggml_activation(GgmlType::Q6_K, &[0.0; 256]), [0.0; 256]);
    }
}
