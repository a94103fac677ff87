//! llama.cpp's CPU flash attention (`ggml_compute_forward_flash_attn_ext_f16`
//! one query row at a time: `ggml_compute_forward_flash_attn_ext_f16_one_chunk`),
//! what `--flash-attn on` runs for a ubatch of fewer than 64 tokens over a
//! cache of fewer than 512 cells (past those ggml tiles the queries or
//! splits the cells across threads and sums in another order):
//!
//! - K and V as F16 (an F32 cache is cast to F16 first, `build_attn_mha`),
//!   `q` converted to K's `vec_dot_type`, each visible cell's score
//!   `ggml_vec_dot_f16` (or `_bf16`) times the scale (over the softcap,
//!   then `softcap · tanhf`), plus the mask;
//! - the online softmax over the cells in order, skipping masked ones: a
//!   new maximum `M` rescales the accumulator by `expf(M_old - M)`, else
//!   the cell weighs `expf(s - M)`; the accumulator is F16 for an F16 V
//!   (`ggml_vec_scale_f16`, `ggml_vec_mad_f16`: each update rounded to
//!   F16), F32 otherwise; `S = S · ms + vs` (fused);
//! - the accumulator times `1 / S`.

use half::{bf16, f16};

use super::cached::KvCells;
use super::{dot_bf16, dot_f16};
use crate::{AttentionShape, CacheType, OpsError};

/// The type flash attention reads a cache of type `ty` as (F32 is cast to
/// F16).
fn read_as(ty: CacheType) -> CacheType {
    match ty {
        CacheType::F32 => CacheType::F16,
        other => other,
    }
}

/// `x` rounded to `ty` and widened back.
fn as_type(ty: CacheType, x: f32) -> f32 {
    match ty {
        CacheType::F16 => f16::from_f32(x).to_f32(),
        CacheType::Bf16 => bf16::from_f32(x).to_f32(),
        CacheType::F32 => x,
    }
}

/// The accumulator of one query head.
enum Acc {
    /// F16 values (an F16 V).
    F16(Vec<f32>),
    /// F32 values (any other V).
    F32(Vec<f32>),
}

impl Acc {
    /// `acc *= ms` (`ggml_vec_scale_f16` / `_f32`).
    fn scale(&mut self, ms: f32) {
        match self {
            Acc::F16(a) => a
                .iter_mut()
                .for_each(|y| *y = as_type(CacheType::F16, *y * ms)),
            Acc::F32(a) => a.iter_mut().for_each(|y| *y *= ms),
        }
    }

    /// `acc += v · vs` (`ggml_vec_mad_f16` / `_f32`: fused multiply-adds).
    fn mad(&mut self, v: &[f32], vs: f32) {
        match self {
            Acc::F16(a) => a
                .iter_mut()
                .zip(v)
                .for_each(|(y, &x)| *y = as_type(CacheType::F16, x.mul_add(vs, *y))),
            Acc::F32(a) => a
                .iter_mut()
                .zip(v)
                .for_each(|(y, &x)| *y = x.mul_add(vs, *y)),
        }
    }

    fn into_values(self) -> Vec<f32> {
        match self {
            Acc::F16(a) | Acc::F32(a) => a,
        }
    }
}

/// llama.cpp's flash attention of one query (`q`: `[n_head][dk]`) over
/// `cells` (see the module documentation), `softcap` 0 for none; `out`
/// is `[n_head][dv]`. A head with no visible cell gets zeros.
///
/// # Errors
///
/// The shape does not divide or a length does not fit.
pub fn attention_flash(
    q: &[f32],
    cells: &KvCells<'_>,
    shape: &AttentionShape,
    scale: f32,
    softcap: f32,
    out: &mut [f32],
) -> Result<(), OpsError> {
    let n = cells.checked(shape, q, out)?;
    let AttentionShape {
        n_head,
        n_head_kv,
        head_dim_k: dk,
        head_dim_v: dv,
    } = *shape;
    let (kt, vt) = (read_as(cells.k_type), read_as(cells.v_type));
    let scale = if softcap != 0.0 {
        scale / softcap
    } else {
        scale
    };
    let group = n_head / n_head_kv;
    let mut kj = vec![0f32; dk];
    let mut vj = vec![0f32; dv];
    for (h, (qh, oh)) in q.chunks_exact(dk).zip(out.chunks_exact_mut(dv)).enumerate() {
        let g = h / group;
        let qc: Vec<f32> = qh.iter().map(|&x| as_type(kt, x)).collect();
        let (mut s_sum, mut m) = (0f32, f32::NEG_INFINITY);
        let mut acc = if vt == CacheType::F16 {
            Acc::F16(vec![0.0; dv])
        } else {
            Acc::F32(vec![0.0; dv])
        };
        for j in 0..n {
            let mv = cells.mask.map_or(0.0, |mk| as_type(CacheType::F16, mk[j]));
            if mv == f32::NEG_INFINITY {
                continue;
            }
            for (d, x) in kj.iter_mut().enumerate() {
                *x = as_type(kt, cells.k[j * cells.k_stride + g * dk + d]);
            }
            let mut s = match kt {
                CacheType::Bf16 => dot_bf16(&kj, &qc),
                _ => dot_f16(&kj, &qc),
            } * scale;
            if softcap != 0.0 {
                s = softcap * s.tanh();
            }
            s += mv;
            let (mut ms, mut vs) = (1f32, 1f32);
            if s > m {
                let old = m;
                m = s;
                ms = (old - m).exp();
                acc.scale(ms);
            } else {
                vs = (s - m).exp();
            }
            for (d, x) in vj.iter_mut().enumerate() {
                *x = as_type(vt, cells.v[j * cells.v_stride + g * dv + d]);
            }
            acc.mad(&vj, vs);
            s_sum = s_sum.mul_add(ms, vs);
        }
        let inv = if s_sum == 0.0 { 0.0 } else { 1.0 / s_sum };
        for (o, a) in oh.iter_mut().zip(acc.into_values()) {
            *o = a * inv;
        }
    }
    Ok(())
}

/// llama.cpp's attention of one query over `cells` as `build_attn_mha`
/// runs it: [`attention_flash`] (no softcap) with `flash_attn`, else
/// [`super::attention_cached`] for a ubatch of `ubatch`.
///
/// # Errors
///
/// As either.
pub fn attention_llama(
    q: &[f32],
    cells: &KvCells<'_>,
    shape: &AttentionShape,
    scale: f32,
    ubatch: super::Ubatch,
    flash_attn: bool,
    out: &mut [f32],
) -> Result<(), OpsError> {
    if flash_attn {
        attention_flash(q, cells, shape, scale, 0.0, out)
    } else {
        super::attention_cached(q, cells, shape, scale, ubatch, out)
    }
}

#[cfg(test)]
mod tests {
    use super::super::refs::{fnv, row};
    use super::*;

    /// `tools/oracle/ggml_kernel_refs.c`'s `flash`, laid out as ggml's
    /// output (`[n_tokens][n_head][dv]`).
    fn flash(
        ty: CacheType,
        dk: usize,
        dv: usize,
        n_head: usize,
        n_tokens: usize,
        cap: f32,
    ) -> Vec<f32> {
        let n_kv = 64;
        let q = row(dk * n_head * n_tokens, 71, 2.0);
        let mut k = row(dk * n_kv, 72, 1.5);
        ty.store_in_place(&mut k);
        let mut v = row(n_kv * dv, 73, 3.0);
        ty.store_in_place(&mut v);
        let shape = AttentionShape {
            n_head,
            n_head_kv: 1,
            head_dim_k: dk,
            head_dim_v: dv,
        };
        let mut out = vec![0f32; dv * n_head * n_tokens];
        for t in 0..n_tokens {
            let visible = 35 + t;
            let mask: Vec<f32> = (0..visible)
                .map(|j| if j == 3 { f32::NEG_INFINITY } else { 0.0 })
                .collect();
            let cells = KvCells {
                k: &k[..visible * dk],
                k_stride: dk,
                v: &v[..visible * dv],
                v_stride: dv,
                first_cell: 0,
                mask: Some(&mask),
                k_type: ty,
                v_type: ty,
            };
            // q is [dk, n_tokens, n_head]: head h of token t at (h·n_tokens + t)·dk.
            let qt: Vec<f32> = (0..n_head)
                .flat_map(|h| q[(h * n_tokens + t) * dk..][..dk].to_vec())
                .collect();
            let scale = 1.0 / (dk as f32).sqrt();
            let o = &mut out[t * n_head * dv..(t + 1) * n_head * dv];
            attention_flash(&qt, &cells, &shape, scale, cap, o).unwrap();
        }
        out
    }

    #[test]
    fn flash_attention_is_ggmls_one_chunk() {
        for (ty, dk, dv, heads, tokens, cap, want, first) in [
            (
                CacheType::F16,
                40,
                40,
                2,
                1,
                0.0,
                0x791d_e87e_9491_0d92u64,
                0xbe80_dfb3u32,
            ),
            (
                CacheType::F16,
                64,
                48,
                2,
                3,
                0.0,
                0x3395_badc_ee76_5b76,
                0xbe20_9985,
            ),
            (
                CacheType::F16,
                40,
                40,
                1,
                2,
                30.0,
                0x889c_8e0e_6953_e744,
                0xbe80_f16f,
            ),
            (
                CacheType::Bf16,
                40,
                40,
                2,
                1,
                0.0,
                0xca87_803f_a373_45f9,
                0xbe81_2ac2,
            ),
        ] {
            let got = flash(ty, dk, dv, heads, tokens, cap);
            let what = format!("{ty} dk {dk} dv {dv} heads {heads} tokens {tokens} cap {cap}");
            assert_eq!(got[0].to_bits(), first, "{what}");
            assert_eq!(fnv(&got), want, "{what}");
        }
    }
}
