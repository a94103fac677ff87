//! ggml's x86 CPU kernels (AVX2 + FMA + F16C, no AVX512), bit for bit.
//!
//! A forward pass that must agree with llama.cpp's CPU backend to better
//! than f32 noise cannot sum in `f64`: where ggml rounds an activation to
//! F16/BF16 or quantizes it to Q8_0 before a matmul, one ulp upstream can
//! move a value across a rounding boundary and change the logits by 1e-2.
//! These functions repeat ggml's arithmetic step for step (the same lanes,
//! the same fused multiply-adds, the same order of the horizontal sums),
//! as compiled by GCC with `-march=native -O3` (GNU mode, so `a * b + c`
//! in the C is contracted to an FMA) for a machine with AVX2, FMA and
//! F16C and without AVX512, the oracle's build (`tools/oracle/`):
//!
//! - [`dot_f32`], [`dot_f16`], [`dot_bf16`]: `ggml_vec_dot_f32`,
//!   `ggml_vec_dot_f16`, `ggml_vec_dot_bf16` (`ggml-cpu/vec.cpp`);
//! - [`matvec`]: `ggml_compute_forward_mul_mat` for one token of a
//!   ubatch (the activations converted to the weight's `vec_dot_type`,
//!   then one dot per row: the float dots below or llamafile's tinyBLAS,
//!   and for the quantized types the kernels of `quants`: `ggml_vec_dot_*`
//!   (`arch/x86/quants.c`), the repacked Q4_0/Q4_K/IQ4_NL `gemv`/`gemm`
//!   (`arch/x86/repack.cpp`), `tinyBLAS_Q0_AVX`, the tiled K-quant kernel
//!   from 8 tokens; which one takes a token is [`Ubatch`]'s to say);
//! - [`expf`], [`silu`], [`swiglu`], [`soft_max`]: `ggml_v_expf`,
//!   `ggml_v_silu`, `ggml_vec_swiglu_f32`, `soft_max_ext` (`vec.h`,
//!   `vec.cpp`, `ops.cpp`); [`sigmoid`]: the unary op;
//! - [`rope`]: `ggml_rope_cache_init` and `rotate_pairs` (`ops.cpp`);
//! - [`attention`]: `mul_mat(k, q)`, `soft_max_ext` and `mul_mat(v, kq)`
//!   of llama.cpp's attention without flash attention over an F32 cache;
//!   [`attention_cached`] over a cache of any type (F16, BF16: `q` and
//!   the probabilities converted to it), MLA's V a view of K ([`cached`]);
//!   [`attention_flash`]: the CPU flash attention (`q` rounded to F16,
//!   the online softmax: [`flash`]);
//! - [`norm`]: `ggml_norm` (LayerNorm); [`fwht`] and [`lightning_score`]:
//!   the DSA indexer's Hadamard rotation and fused score ([`indexer`]);
//!   [`moe::route_sigmoid`], [`moe::route_softmax`], [`moe::mix`]:
//!   `build_moe_ffn`'s routing and aggregate;
//! - [`ssm_conv`], [`l2_norm`], [`gated_delta_net`]: the Gated DeltaNet's
//!   causal conv, L2 norm and delta rule ([`gdn`]); [`hc_pre_gated`],
//!   [`hc_post`]: the hyper-connections' gated stream mean and combine as
//!   llama.cpp's graph spells them in plain ops ([`hyper`]); mHC's
//!   Sinkhorn mix and its weighted pre and mixed post ([`hyper_mix`]);
//!   [`gated_delta_net_kda`]: KDA's per-channel gate; [`swiglu_clamp`];
//!   [`rope_multi`]: `ggml_rope_multi` (MROPE, IMROPE: [`mrope`]);
//!   [`unary`]: `silu` over a row in ggml's 8-lane blocks and libm tail,
//!   `softplus`, `ggml_vec_sum_f32`.
//!
//! Each function names the ggml routine it follows; the tests hold values
//! that ggml itself computed (the oracle's libggml: `vec_dot` through
//! `ggml_get_type_traits_cpu`, the ops through a one-thread CPU graph).

use half::{bf16, f16};
use seam::gguf::GgmlType;

use crate::{OpsError, check_len};

pub mod cached;
pub mod flash;
pub mod indexer;
pub mod layer_norm;
pub mod moe;
#[cfg(test)]
mod refs;
pub use cached::{KvCells, attention_cached, attention_cached_q, attention_tiles};
pub use flash::{attention_flash, attention_llama};
pub use indexer::{fwht, lightning_score};
pub use layer_norm::norm;

pub mod gdn;
pub mod hyper;
pub mod hyper_mix;
pub mod mrope;
mod quants;
pub mod rope_ext;
pub mod unary;
pub use gdn::{gated_delta_net, gated_delta_net_kda, l2_norm, ssm_conv};
pub use hyper::{hc_post, hc_pre_gated};
pub use hyper_mix::{hc_comb, hc_post_mixed, hc_pre_weighted};
pub use mrope::{MultiRope, rope_multi};
pub use quants::{BlockQ8_1, BlockQ8K, quantize_q8_1_block, quantize_q8_k_block};
pub use rope_ext::{GgmlRope, rope_ext};
pub use unary::{silu_row, softcap, softplus, sum, swiglu_clamp};

/// `_mm256` lanes.
const LANES: usize = 8;
/// Elements per step of the F32/F16 dot products (4 accumulators of 8).
const STEP: usize = 32;

/// `GGML_F32x8_REDUCE`'s last stage: low half plus high half, then two
/// `hadd`s: `(t0 + t1) + (t2 + t3)`.
fn reduce_hadd(v: [f32; LANES]) -> f32 {
    let t: [f32; 4] = std::array::from_fn(|i| v[i] + v[i + 4]);
    (t[0] + t[1]) + (t[2] + t[3])
}

/// `hsum_float_8` (and the same `movehl` / `movehdup` pattern elsewhere):
/// high half plus low half, then `(t0 + t2) + (t1 + t3)`.
fn reduce_movehl(v: [f32; LANES]) -> f32 {
    let t: [f32; 4] = std::array::from_fn(|i| v[i + 4] + v[i]);
    (t[0] + t[2]) + (t[1] + t[3])
}

/// The main loop of `ggml_vec_dot_f32` / `_f16` / `_bf16` (`GGML_F32_STEP`
/// 32, four `__m256` accumulators, FMA), the accumulators added as
/// `(c1 + c3) + (c2 + c4)`; returns those 8 lanes and the index where the
/// scalar leftovers start.
fn fma_steps(x: &[f32], y: &[f32]) -> ([f32; LANES], usize) {
    let np = x.len() & !(STEP - 1);
    let mut acc = [[0f32; LANES]; 4];
    for i in (0..np).step_by(STEP) {
        for (j, a) in acc.iter_mut().enumerate() {
            for (l, a) in a.iter_mut().enumerate() {
                let k = i + j * LANES + l;
                *a = x[k].mul_add(y[k], *a);
            }
        }
    }
    let v = std::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]));
    (v, np)
}

/// [`fma_steps`] reduced by `GGML_F32x8_REDUCE` (the F32 and F16 dots).
fn dot_steps(x: &[f32], y: &[f32]) -> (f32, usize) {
    let (v, np) = fma_steps(x, y);
    (reduce_hadd(v), np)
}

/// `ggml_vec_dot_f32`: `Σ x_i·y_i` as ggml's AVX2 path sums it. The
/// elements after the last whole 32 are added one at a time (`sum += x*y`)
/// as GCC vectorized that loop in the oracle's `libggml-cpu.so`: in runs of
/// 8, then one of 4, products rounded then added in order; the last 0-3 by
/// fused multiply-add (`vfmadd231ss`). Only `min(x.len(), y.len())`
/// elements are used.
pub fn dot_f32(x: &[f32], y: &[f32]) -> f32 {
    let (x, y) = common_len(x, y);
    let (mut sum, np) = dot_steps(x, y);
    let left = x.len() - np;
    let unfused = (left & !(LANES - 1)) + if left & (LANES - 1) >= 4 { 4 } else { 0 };
    for i in np..np + unfused {
        let p = x[i] * y[i];
        sum += p;
    }
    for i in np + unfused..x.len() {
        sum = x[i].mul_add(y[i], sum);
    }
    sum
}

/// `x` and `y` cut to the shorter one's length.
fn common_len<'a>(x: &'a [f32], y: &'a [f32]) -> (&'a [f32], &'a [f32]) {
    let n = x.len().min(y.len());
    (&x[..n], &y[..n])
}

/// `ggml_vec_dot_f16` on the values of two F16 rows (given widened to
/// `f32`, which is exact): [`dot_f32`]'s steps, the leftovers summed in
/// `f64` as products rounded to `f32`. Only `min(x.len(), y.len())`
/// elements are used.
pub fn dot_f16(x: &[f32], y: &[f32]) -> f32 {
    let (x, y) = common_len(x, y);
    let (sum, np) = dot_steps(x, y);
    let mut sum = f64::from(sum);
    for i in np..x.len() {
        sum += f64::from(x[i] * y[i]);
    }
    sum as f32
}

/// `ggml_vec_dot_bf16` (AVX2) on the values of two BF16 rows (widened to
/// `f32`, which is exact): [`fma_steps`] (the C's `add(mul(x, y), c)`,
/// which GCC contracted to a fused multiply-add), then
/// [`reduce_movehl`]; the leftovers added in `f64` as `f32` products. Only
/// `min(x.len(), y.len())` elements are used.
pub fn dot_bf16(x: &[f32], y: &[f32]) -> f32 {
    let (x, y) = common_len(x, y);
    let (v, np) = fma_steps(x, y);
    let mut sum = f64::from(reduce_movehl(v));
    for i in np..x.len() {
        sum += f64::from(x[i] * y[i]);
    }
    sum as f32
}

/// Where a product's token sits, which picks ggml's matmul path: one
/// token goes through `vec_dot` (4 accumulators of 8 lanes for floats);
/// several tokens of a ubatch through llamafile's `tinyBLAS` (one 8-lane
/// accumulator per output, `llamafile/sgemm.cpp`) for a float weight of a
/// multiple of 4 rows of a multiple of 8 elements and for Q8_0, Q4_0, Q5_0
/// and IQ4_NL; through the repacked `gemm` for the tokens in whole 4s of a
/// repacked weight; through the tiled K-quant kernel (`tiled/tiled.cpp`)
/// from 8 tokens for the K- and IQ types it takes. An expert's product
/// (`mul_mat_id`) runs one token's arithmetic, except the tiled kernel when
/// 8 tokens or more of the ubatch picked that expert ([`Ubatch::expert`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ubatch {
    /// Tokens of the ubatch (for an expert: the tokens that picked it).
    tokens: usize,
    /// This token's index among them.
    index: usize,
    /// An expert's product (`mul_mat_id`).
    expert: bool,
}

#[allow(non_upper_case_globals)]
impl Ubatch {
    /// A single token.
    pub const One: Ubatch = Ubatch {
        tokens: 1,
        index: 0,
        expert: false,
    };
    /// A token of a long ubatch (a batched prefill): within its whole 4s
    /// and past the tiled kernel's 8 tokens.
    pub const Many: Ubatch = Ubatch {
        tokens: 8,
        index: 0,
        expert: false,
    };

    /// Token `index` of a ubatch of `count` tokens.
    pub fn of(index: usize, count: usize) -> Ubatch {
        Ubatch {
            tokens: count.max(1),
            index,
            expert: false,
        }
    }

    /// An expert's product when `rows` tokens of the ubatch picked it.
    pub fn expert(rows: usize) -> Ubatch {
        Ubatch {
            tokens: rows.max(1),
            index: 0,
            expert: true,
        }
    }

    /// Whether `mul_mat` takes several tokens at once (llamafile's
    /// kernels).
    pub fn is_many(self) -> bool {
        self.tokens > 1 && !self.expert
    }

    /// Whether a repacked weight's `gemm` (4 tokens at a time) takes it.
    fn gemm(self) -> bool {
        !self.expert && self.index < self.tokens - self.tokens % 4
    }

    /// Whether the tiled K-quant kernel takes it (8 tokens or more).
    fn tiled(self) -> bool {
        self.tokens >= 8
    }
}

/// `tinyBLAS::gemm_bloc` for one output (AVX2): `acc_{k mod 8} = fma(x_k,
/// y_k, acc)` in order, then `hsum` ([`reduce_movehl`]).
pub fn dot_tinyblas(x: &[f32], y: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    for (xs, ys) in x.chunks(LANES).zip(y.chunks(LANES)) {
        for (l, (&a, &b)) in xs.iter().zip(ys).enumerate() {
            acc[l] = a.mul_add(b, acc[l]);
        }
    }
    reduce_movehl(acc)
}

/// Whether llamafile's `tinyBLAS` takes an F32/F16/BF16 product of `m`
/// weight rows of `k` elements over a ubatch (`tinyBLAS::matmul`).
pub fn tinyblas_takes(ubatch: Ubatch, m: usize, k: usize) -> bool {
    ubatch.is_many() && m.is_multiple_of(4) && k.is_multiple_of(LANES)
}

/// One block of 32 activations quantized to Q8_0 as `quantize_row_q8_0`
/// (AVX path) does: `d = max|x| / 127` stored as F16, `q = round(x · 127 /
/// max|x|)` (ties to even). Returns `(d as f32, q)`.
pub fn quantize_q8_0_block(x: &[f32]) -> (f32, [i8; 32]) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = f16::from_f32(amax / 127.0).to_f32();
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut q = [0i8; 32];
    for (q, &v) in q.iter_mut().zip(x) {
        *q = (v * id).round_ties_even() as i8;
    }
    (d, q)
}

/// The weight types [`matvec`] reproduces: the float types and the
/// quantized types of `quants` (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL,
/// Q4_K, Q5_K, Q6_K, IQ4_XS, IQ2_XXS).
pub fn is_emulated(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
        || quants::is_quantized_emulated(ty)
}

/// `W · x` for one token as ggml's CPU `mul_mat` computes it: `weight`
/// holds `rows` rows of `ne0` elements of `ty` (row-major, GGUF order),
/// `tensor_rows` is the weight's whole `ne[1]` (ggml repacks a Q4_0, Q4_K
/// or IQ4_NL weight whose `ne[1]` is a multiple of 8, which changes the
/// order of its sums; llamafile takes a float weight of a multiple of 4),
/// `ubatch` where the token sits (see [`Ubatch`]). `x` is converted to
/// `ty`'s `vec_dot_type` first (F16, BF16, Q8_0, Q8_1, Q8_K), as ggml does.
///
/// # Errors
///
/// A type [`is_emulated`] does not cover, or a length that does not fit.
#[allow(clippy::too_many_arguments)]
pub fn matvec(
    ty: GgmlType,
    weight: &[u8],
    ne0: usize,
    rows: usize,
    tensor_rows: usize,
    ubatch: Ubatch,
    x: &[f32],
    out: &mut [f32],
) -> Result<(), OpsError> {
    if !is_emulated(ty) {
        return Err(OpsError::Unsupported(ty));
    }
    let rb = crate::row_bytes(ty, ne0)?;
    let total = rb
        .checked_mul(rows)
        .ok_or_else(|| OpsError::Invalid(format!("{rows} rows of {rb} bytes overflow")))?;
    check_len("ggml matvec weight bytes", total, weight.len())?;
    check_len("ggml matvec x", ne0, x.len())?;
    check_len("ggml matvec out", rows, out.len())?;
    if rb == 0 {
        out.fill(0.0);
        return Ok(());
    }
    match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {
            let xc: Vec<f32> = match ty {
                GgmlType::F16 => x.iter().map(|&v| f16::from_f32(v).to_f32()).collect(),
                GgmlType::BF16 => x.iter().map(|&v| bf16::from_f32(v).to_f32()).collect(),
                _ => x.to_vec(),
            };
            let mut w = vec![0f32; ne0];
            let tiled = tinyblas_takes(ubatch, tensor_rows, ne0);
            for (bytes, o) in weight.chunks_exact(rb).zip(out.iter_mut()) {
                crate::dequantize(ty, bytes, &mut w)?;
                *o = match ty {
                    _ if tiled => dot_tinyblas(&w, &xc),
                    GgmlType::F16 => dot_f16(&w, &xc),
                    GgmlType::BF16 => dot_bf16(&w, &xc),
                    _ => dot_f32(&w, &xc),
                };
            }
        }
        _ => {
            let path = if quants::is_repacked(ty, tensor_rows) {
                quants::Path::Repacked {
                    gemm: ubatch.gemm(),
                }
            } else if ubatch.tiled() && quants::tiled_takes(ty) {
                quants::Path::Tiled
            } else if ubatch.is_many() && quants::tinyblas_q0_takes(ty) {
                quants::Path::TinyBlas
            } else {
                quants::Path::VecDot
            };
            let act = quants::activations(ty, path, x);
            for (bytes, o) in weight.chunks_exact(rb).zip(out.iter_mut()) {
                *o = quants::dot(ty, bytes, &act, path);
            }
        }
    }
    Ok(())
}

/// `ggml_v_expf` (AVX2 + FMA) on one lane: ggml's vectorised `exp`
/// (within 1.5 ulp of `exp`, not always the correctly rounded value that
/// glibc's `expf` gives), used by its softmax and SiLU on whole 8s.
pub fn expf(x: f32) -> f32 {
    let c = |bits: u32| f32::from_bits(bits);
    let r = c(0x4b40_0000); // 0x1.8p23
    let z = x.mul_add(c(0x3fb8_aa3b), r);
    let n = z - r;
    let b = (-n).mul_add(c(0x35bf_be8e), (-n).mul_add(c(0x3f31_7200), x));
    let e = z.to_bits() << 23;
    let k = c(e.wrapping_add(1f32.to_bits()));
    let u = b * b;
    let j = c(0x3c07_2010)
        .mul_add(b, c(0x3d2b_9f17))
        .mul_add(u, c(0x3e2a_af33).mul_add(b, c(0x3eff_fedb)))
        .mul_add(u, c(0x3f7f_fff6) * b);
    if n.abs() <= 126.0 || n.is_nan() {
        return j.mul_add(k, k);
    }
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = c(g.wrapping_add(0x7f00_0000));
    if n.abs() > 192.0 {
        return s1 * s1;
    }
    let s2 = c(e.wrapping_sub(g));
    s2.mul_add(j, s2) * s1
}

/// `ggml_v_silu` on one lane: `x / (1 + expf(-x))` with [`expf`].
pub fn silu(x: f32) -> f32 {
    x / (1.0 + expf(0.0 - x))
}

/// `ggml_vec_swiglu_f32`: `out_i = silu(gate_i) · up_i`, whole 8s through
/// [`silu`], the rest with libm's `expf`.
///
/// # Errors
///
/// The three lengths differ.
pub fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<(), OpsError> {
    check_len("swiglu up", gate.len(), up.len())?;
    check_len("swiglu out", gate.len(), out.len())?;
    let whole = gate.len() & !(LANES - 1);
    for i in 0..gate.len() {
        let g = gate[i];
        let s = if i < whole {
            silu(g)
        } else {
            g / (1.0 + (-g).exp())
        };
        out[i] = s * up[i];
    }
    Ok(())
}

/// ggml's unary `sigmoid`: `1 / (1 + expf(-x))` in `f32` (libm `expf`).
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `ggml_rope_ext` in normal mode (pairs `(2i, 2i + 1)`), no scaling, for
/// every head of `x` at `position`: the angle is ggml's `f32` running
/// product `θ_0 = position`, `θ_{i+1} = θ_i · base^(-2/n_rot)` (`powf`),
/// its `cosf`/`sinf`, and the rotation `fma(x0, cos, -(x1·sin))`,
/// `fma(x0, sin, x1·cos)` as GCC contracts `rotate_pairs`.
///
/// # Errors
///
/// `x` is not whole heads, or `n_rot` is odd or past the head.
pub fn rope(
    x: &mut [f32],
    head_dim: usize,
    position: usize,
    n_rot: usize,
    freq_base: f32,
) -> Result<(), OpsError> {
    let position = i32::try_from(position)
        .map_err(|_| OpsError::Invalid(format!("rope: position {position} past i32")))?;
    rope_ext(
        x,
        head_dim,
        position,
        &GgmlRope::plain(n_rot, crate::RopeMode::Normal, freq_base),
    )
}

/// `soft_max_ext` of one row without ALiBi or sinks
/// (`ggml_compute_forward_soft_max_f32`): `w = x · scale`, plus the mask
/// if any (`0` keeps, `-inf` drops), its maximum, then
/// `ggml_vec_soft_max_f32` ([`expf`] 8 at a time, each 8 summed in `f32`
/// and added in `f64`; the rest with libm's `expf`), and the reciprocal of
/// the sum rounded to `f32` and multiplied in. A `-inf` entry (masked)
/// gets 0; a row that is all `-inf` yields NaN, as ggml's does.
///
/// # Errors
///
/// The mask is not as long as `x` (nothing is written then).
pub fn soft_max(x: &mut [f32], scale: f32, mask: Option<&[f32]>) -> Result<(), OpsError> {
    if let Some(mask) = mask {
        check_len("soft_max mask", x.len(), mask.len())?;
    }
    let mut max = f32::NEG_INFINITY;
    for (i, v) in x.iter_mut().enumerate() {
        *v *= scale;
        if let Some(mask) = mask {
            *v += mask[i];
        }
        max = max.max(*v);
    }
    let whole = x.len() & !(LANES - 1);
    let mut sum = 0f64;
    for chunk in x[..whole].chunks_exact_mut(LANES) {
        let mut vals = [0f32; LANES];
        for (val, v) in vals.iter_mut().zip(chunk.iter_mut()) {
            *v = expf(*v - max);
            *val = *v;
        }
        sum += f64::from(reduce_movehl(vals));
    }
    for v in &mut x[whole..] {
        *v = (*v - max).exp();
        sum += f64::from(*v);
    }
    let inv = (1.0 / sum) as f32;
    x.iter_mut().for_each(|v| *v *= inv);
    Ok(())
}

/// llama.cpp's attention for one query without flash attention over an
/// F32 K/V cache, as ggml's CPU backend computes it: `kq = mul_mat(k, q)`
/// ([`dot_f32`] per cache cell), `soft_max_ext(kq · scale)` ([`soft_max`]
/// over the cells, the masked ones `-inf`), `kqv = mul_mat(v, kq)`
/// ([`dot_f32`] over the cells, or [`dot_tinyblas`] when the ubatch has
/// several tokens: the query's row of `kq` is then one of several).
///
/// `k` and `v` hold consecutive cache cells (every one visible), the
/// first at cell `first_cell`: ggml's SIMD lanes follow the cell index, so
/// the cells' place in the cache matters (llama.cpp puts position `p` in
/// cell `p` while the cache has not wrapped). Layouts as
/// [`crate::attention`]: `q` `[n_head][dk]`, `k` `[n][n_head_kv][dk]`, `v`
/// `[n][n_head_kv][dv]`, `out` `[n_head][dv]`.
///
/// # Errors
///
/// The shape does not divide or a length does not fit.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    shape: &crate::AttentionShape,
    scale: f32,
    first_cell: usize,
    ubatch: Ubatch,
    out: &mut [f32],
) -> Result<(), OpsError> {
    let crate::AttentionShape {
        n_head,
        n_head_kv,
        head_dim_k: dk,
        head_dim_v: dv,
    } = *shape;
    let n = crate::attention::checked_cache_len(shape, q, k, v, out)?;
    let (k_cell, v_cell) = (n_head_kv * dk, n_head_kv * dv);
    if n == 0 {
        out.fill(0.0);
        return Ok(());
    }
    // The cells from the last whole 32 before the first one to the next
    // whole 32 after the last: the cells around them are masked (weight
    // 0), which adds nothing to ggml's sums but fixes their lanes.
    let base = first_cell - first_cell % STEP;
    let span = (first_cell + n - base).next_multiple_of(STEP);
    let at = first_cell - base;
    let group = n_head / n_head_kv;
    // `kqv`'s cells are padded to whole 256s in llama.cpp's cache, so
    // llamafile takes it when `dv` rows are a multiple of 4.
    let tiled = tinyblas_takes(ubatch, dv, STEP);
    let mut p = vec![0f32; span];
    let mut vcol = vec![0f32; span];
    for (h, (qh, oh)) in q.chunks_exact(dk).zip(out.chunks_exact_mut(dv)).enumerate() {
        let g = h / group;
        p.fill(f32::NEG_INFINITY);
        for j in 0..n {
            p[at + j] = dot_f32(&k[j * k_cell + g * dk..][..dk], qh);
        }
        soft_max(&mut p, scale, None)?;
        for (d, o) in oh.iter_mut().enumerate() {
            vcol.fill(0.0);
            for j in 0..n {
                vcol[at + j] = v[j * v_cell + g * dv + d];
            }
            *o = if tiled {
                dot_tinyblas(&vcol, &p)
            } else {
                dot_f32(&vcol, &p)
            };
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The expected bits come from the oracle's libggml (llama-cpp-python
    //! 0.3.36, built with `-march=native` on AVX2 + FMA + F16C), printed by
    //! `tools/oracle/ggml_kernel_refs.c`: `vec_dot` through
    //! `ggml_get_type_traits_cpu`, the ops as a one-thread CPU graph, on the
    //! inputs [`input`] and [`row`] make (the same `f32` steps in C).

    use super::*;

    /// `sinf(0.37·i + s) · (1 + 0.05·(i mod 7))`, each step rounded to `f32`.
    fn input(i: usize, s: f32) -> f32 {
        let a = 0.37f32 * i as f32 + s;
        let m = 1.0 + 0.05f32 * (i % 7) as f32;
        a.sin() * m
    }

    use super::refs::row;

    fn naive_f32(x: &[f32], y: &[f32]) -> f32 {
        x.iter().zip(y).fold(0f32, |s, (a, b)| s + a * b)
    }

    fn f64_dot(x: &[f32], y: &[f32]) -> f32 {
        crate::dot_f64(x, y) as f32
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|v| v.to_bits()).collect()
    }

    /// `W · y` of the one row `x` stored as `ty` (`bytes`), one token.
    fn one_row(ty: GgmlType, bytes: &[u8], y: &[f32]) -> u32 {
        let mut out = [0f32];
        matvec(ty, bytes, y.len(), 1, 1, Ubatch::One, y, &mut out).unwrap();
        out[0].to_bits()
    }

    #[test]
    fn float_dots_are_ggmls_vec_dot() {
        // 80 elements: two whole steps of 32 and 16 leftovers.
        let (sx, sy) = (0.1f32 * 3.0, 0.1f32 * 29.0);
        let x: Vec<f32> = (0..80).map(|i| input(i, sx)).collect();
        let y: Vec<f32> = (0..80).map(|i| input(i, sy) * 2.5).collect();
        let rows: [(GgmlType, Vec<u8>, u32); 3] = [
            (
                GgmlType::F32,
                x.iter().flat_map(|v| v.to_le_bytes()).collect(),
                0xc2de_e6b1,
            ),
            (
                GgmlType::F16,
                x.iter()
                    .flat_map(|&v| f16::from_f32(v).to_le_bytes())
                    .collect(),
                0xc2de_e420,
            ),
            (
                GgmlType::BF16,
                x.iter()
                    .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
                    .collect(),
                0xc2de_d896,
            ),
        ];
        for (ty, bytes, want) in rows {
            assert_eq!(one_row(ty, &bytes, &y), want, "{ty}");
            // A dot in f64 rounded once (crate::matvec) lands elsewhere.
            let xq = crate::as_ggml_multiplies(ty, &y).unwrap();
            let mut f64_dot = [0f32];
            crate::matvec(ty, &bytes, 80, 1, &xq, &mut f64_dot).unwrap();
            assert_ne!(f64_dot[0].to_bits(), want, "{ty}");
        }
    }

    #[test]
    fn dot_f32_is_ggmls_on_long_rows_and_every_leftover_count() {
        for (n, seed, want) in [
            (512usize, 1u32, 0xc35e_8d44u32),
            (192, 2, 0x43f5_fdb7),
            (11, 3, 0xbfff_2711),
            (77, 4, 0xc2fa_8ee5),
        ] {
            let got = dot_f32(&row(n, seed, 30.0), &row(n, seed + 100, 3.0));
            assert_eq!(got.to_bits(), want, "n {n}: {got:e}");
        }
        // n = 32..64: one whole step and 0..31 leftovers, which GCC's
        // vectorized tail rounds in runs of 8 and 4, fusing the last 0-3.
        let want: [u32; 32] = [
            0x420b_2bbc,
            0xc0be_2393,
            0x434a_42f7,
            0x42f5_b6e0,
            0xc38d_108d,
            0xc3c4_0207,
            0xc2b5_f767,
            0xc268_97bb,
            0x4169_ba24,
            0xc3aa_f4a7,
            0x4219_730e,
            0x424c_0d8f,
            0x42eb_5f97,
            0xc21e_a6a0,
            0x412c_6ce1,
            0xc3a1_850d,
            0xc337_3f2c,
            0x411b_0787,
            0xc0b6_9c33,
            0x43f5_5c25,
            0xc397_1639,
            0x4358_e521,
            0xc210_7c9f,
            0x4313_1b37,
            0xc336_2848,
            0x42e4_6ab2,
            0xc354_9d22,
            0x426c_c5f8,
            0xc36b_2ce8,
            0x43bc_324d,
            0xc235_d630,
            0xc213_060e,
        ];
        let mut all_fused_differs = false;
        for (left, &want) in want.iter().enumerate() {
            let n = 32 + left;
            let (x, y) = (row(n, 1000 + n as u32, 30.0), row(n, 1100 + n as u32, 3.0));
            assert_eq!(dot_f32(&x, &y).to_bits(), want, "n {n}");
            let (mut fused, _) = dot_steps(&x, &y);
            for i in 32..n {
                fused = x[i].mul_add(y[i], fused);
            }
            all_fused_differs |= fused.to_bits() != want;
        }
        assert!(all_fused_differs, "no row tells the tail's rounding apart");
        // Only the common length counts.
        let (x, y) = (row(77, 4, 30.0), row(77, 104, 3.0));
        assert_eq!(dot_f32(&x, &y[..40]), dot_f32(&x[..40], &y[..40]));
        let (x, y) = (row(512, 1, 30.0), row(512, 101, 3.0));
        let got = dot_f32(&x, &y);
        assert_ne!(got, naive_f32(&x, &y));
        assert_ne!(got, f64_dot(&x, &y));
    }

    #[test]
    fn dot_bf16_is_ggmls_on_long_rows() {
        let bf = |v: Vec<f32>| -> Vec<f32> {
            v.into_iter().map(|v| bf16::from_f32(v).to_f32()).collect()
        };
        let mut differs = false;
        for (n, seed, want) in [
            (512usize, 5u32, 0xc381_e54cu32),
            (77, 6, 0xc2e1_7e34),
            (512, 14, 0xc3e3_92cc),
        ] {
            let x = bf(row(n, seed, 30.0));
            let y = bf(row(n, seed + 100, 3.0));
            let got = dot_bf16(&x, &y);
            assert_eq!(got.to_bits(), want, "n {n}: {got:e}");
            differs |= got != naive_f32(&x, &y) && got != f64_dot(&x, &y);
        }
        assert!(
            differs,
            "the rows do not tell ggml's order from a plain sum"
        );
    }

    #[test]
    fn expf_is_ggml_v_expf() {
        // (x, ggml_v_expf(x)) through ggml_vec_soft_max_f32 with max 0;
        // where glibc's expf rounds differently, the last flag says so.
        for (x, want, glibc_differs) in [
            (0f32, 0x3f80_0000u32, false),
            (-1.0, 0x3ebc_5ab2, false),
            (-0.5, 0x3f1b_4597, true),
            (-10.3, 0x380d_1140, true),
            (-87.0, 0x00b3_3686, true),
            (-90.5, 0x0005_6969, false),
            (-100.25, 0x0000_0015, false),
            (1.7, 0x40af_2a95, true),
        ] {
            assert_eq!(expf(x).to_bits(), want, "{x}");
            assert_eq!(x.exp().to_bits() != want, glibc_differs, "{x}");
        }
        assert_eq!(expf(-200.0), 0.0);
    }

    /// `quantize_row_q8_0` / `quantize_row_q4_0` of 64 [`input`]s at 0.3,
    /// as ggml wrote them.
    const Q8_0_ROW: [u8; 68] = [
        46, 33, 29, 64, 94, 112, 116, 103, 75, 25, 244, 205, 170, 144, 132, 138, 185, 212, 249, 34,
        74, 107, 127, 97, 86, 63, 28, 241, 197, 158, 163, 152, 156, 175, 26, 33, 206, 249, 40, 63,
        92, 109, 113, 100, 72, 31, 243, 205, 172, 147, 136, 141, 163, 215, 251, 35, 73, 105, 124,
        127, 83, 60, 25, 240, 197, 159, 132, 156,
    ];
    const Q4_0_ROW: [u8; 36] = [
        35, 177, 134, 100, 50, 17, 1, 33, 51, 70, 105, 155, 205, 239, 239, 255, 236, 219, 16, 177,
        235, 184, 133, 100, 50, 17, 1, 2, 51, 70, 105, 155, 205, 239, 255, 239,
    ];

    #[test]
    fn quantized_dots_are_ggmls_vec_dot() {
        let y: Vec<f32> = (0..64).map(|i| input(i, 1.1) * 2.5).collect();
        assert_eq!(one_row(GgmlType::Q8_0, &Q8_0_ROW, &y), 0x429f_857a);
        assert_eq!(one_row(GgmlType::Q4_0, &Q4_0_ROW, &y), 0x429e_ed3a);
        let y: Vec<f32> = (0..64).map(|i| input(i, 0.1f32 * 7.0) * 2.5).collect();
        for (ty, row, want) in [
            (GgmlType::Q8_0, &Q8_0_ROW[..], 0x42cd_f7b6),
            (GgmlType::Q4_0, &Q4_0_ROW[..], 0x42cc_a3d1),
        ] {
            assert_eq!(one_row(ty, row, &y), want, "{ty}");
            // The same quantized activations dotted in f64 land elsewhere.
            let xq = crate::as_ggml_multiplies(ty, &y).unwrap();
            let mut f64_dot = [0f32];
            crate::matvec(ty, row, 64, 1, &xq, &mut f64_dot).unwrap();
            assert_ne!(f64_dot[0].to_bits(), want, "{ty}");
        }
    }

    #[test]
    fn several_tokens_take_tinyblas_sums() {
        // mul_mat of a 4 x 48 F32 weight by 2 tokens: llamafile's tinyBLAS.
        let a: Vec<f32> = (0..4 * 48).map(|i| input(i, 0.3)).collect();
        let b: Vec<f32> = (0..2 * 48).map(|i| input(i, 1.1) * 2.5).collect();
        let bytes: Vec<u8> = a.iter().flat_map(|v| v.to_le_bytes()).collect();
        let want: [u32; 8] = [
            0x426c_af83,
            0xc1b5_3d4d,
            0xc29f_94d3,
            0xc24c_7828,
            0x429b_f23b,
            0x4256_ebf6,
            0xc1de_cc04,
            0xc29c_f711,
        ];
        for (j, col) in b.chunks_exact(48).enumerate() {
            let mut out = [0f32; 4];
            matvec(GgmlType::F32, &bytes, 48, 4, 4, Ubatch::Many, col, &mut out).unwrap();
            assert_eq!(bits(&out), want[4 * j..4 * j + 4]);
            let mut one = [0f32; 4];
            matvec(GgmlType::F32, &bytes, 48, 4, 4, Ubatch::One, col, &mut one).unwrap();
            assert_ne!(one, out, "one token sums in vec_dot's order");
        }
        // Rows not a multiple of 4: llamafile declines, vec_dot runs.
        let (mut many, mut one) = ([0f32; 3], [0f32; 3]);
        let three = &bytes[..3 * 48 * 4];
        matvec(
            GgmlType::F32,
            three,
            48,
            3,
            3,
            Ubatch::Many,
            &b[..48],
            &mut many,
        )
        .unwrap();
        matvec(
            GgmlType::F32,
            three,
            48,
            3,
            3,
            Ubatch::One,
            &b[..48],
            &mut one,
        )
        .unwrap();
        assert_eq!(bits(&many), bits(&one));
    }

    #[test]
    fn lengths_and_types_are_checked() {
        let x = [0f32; 64];
        let mut out = [0f32; 2];
        let row = Q8_0_ROW.repeat(2);
        let go = |ty, bytes: &[u8], x: &[f32], out: &mut [f32]| {
            matvec(ty, bytes, 64, 2, 2, Ubatch::One, x, out)
        };
        assert!(go(GgmlType::Q8_0, &row, &x, &mut out).is_ok());
        assert!(matches!(
            go(GgmlType::Q8_0, &row[1..], &x, &mut out),
            Err(OpsError::Length { .. })
        ));
        assert!(matches!(
            go(GgmlType::Q8_0, &row, &x[1..], &mut out),
            Err(OpsError::Length { .. })
        ));
        assert!(matches!(
            go(GgmlType::Q8_0, &row, &x, &mut out[1..]),
            Err(OpsError::Length { .. })
        ));
        assert_eq!(
            go(GgmlType::Q3_K, &row, &x, &mut out),
            Err(OpsError::Unsupported(GgmlType::Q3_K))
        );
        assert!(!is_emulated(GgmlType::Q3_K) && is_emulated(GgmlType::BF16));
        assert!(is_emulated(GgmlType::Q4_K) && is_emulated(GgmlType::IQ2_XXS));
        assert!(swiglu(&x, &x[1..], &mut [0f32; 64]).is_err());
    }

    /// 20 values over [-12, 12]: two whole 8s and 4 leftovers.
    fn ramp() -> Vec<f32> {
        (0..20).map(|i| -12.0 + 1.25 * i as f32 + 0.0625).collect()
    }

    #[test]
    fn silu_swiglu_and_sigmoid_are_ggmls() {
        let x = ramp();
        let silu_want: [u32; 16] = [
            0xb8a3_bcfe,
            0xb97f_d354,
            0xba45_1c18,
            0xbb15_2f4c,
            0xbbdc_73a7,
            0xbc9d_52b9,
            0xbd54_6d76,
            0xbe01_6194,
            0xbe79_d4ae,
            0xbe6b_8d0c,
            0x3eb7_7702,
            0x3fc7_7126,
            0x403b_3e18,
            0x4088_2cde,
            0x40b1_51ba,
            0x40d9_c2af,
        ];
        let silu_got: Vec<f32> = x[..16].iter().map(|&v| silu(v)).collect();
        assert_eq!(bits(&silu_got), silu_want);
        let g: Vec<f32> = (0..20).map(|i| input(i, 0.7)).collect();
        let mut out = vec![0f32; 20];
        swiglu(&x, &g, &mut out).unwrap();
        let swiglu_want: [u32; 20] = [
            0xb852_f756,
            0xb96b_a179,
            0xba56_f7fd,
            0xbb26_ad75,
            0xbbd8_f3b8,
            0xbc5b_5765,
            0xbc72_c72d,
            0x3c99_0bbf,
            0x3e01_fae3,
            0x3e49_157f,
            0xbec8_c5fc,
            0xbfee_eef0,
            0xc054_fa94,
            0xc077_4771,
            0xc00b_2478,
            0xbe72_c39b,
            0x403b_85ce,
            0x40de_88c9,
            0x4132_8d10,
            0x416a_6f50,
        ];
        assert_eq!(bits(&out), swiglu_want);
        let sigmoid_want: [u32; 20] = [
            0x36db_75ed,
            0x37bf_7ec0,
            0x38a7_161f,
            0x3991_c4af,
            0x3a7e_36f4,
            0x3b5d_4a27,
            0x3c3f_7be9,
            0x3d22_5c56,
            0x3e00_f1e6,
            0x3eab_4f4e,
            0x3f23_1473,
            0x3f5c_12ec,
            0x3f74_8fcc,
            0x3f7c_9d6f,
            0x3f7f_055c,
            0x3f7f_b7fe,
            0x3f7f_eb5a,
            0x3f7f_fa16,
            0x3f7f_fe4e,
            0x3f7f_ff84,
        ];
        let sig: Vec<f32> = x.iter().map(|&v| sigmoid(v)).collect();
        assert_eq!(bits(&sig), sigmoid_want);
        // libm's expf where ggml_v_expf runs would miss some of these.
        let libm: Vec<f32> = x[..16].iter().map(|&v| v / (1.0 + (-v).exp())).collect();
        assert_ne!(bits(&libm), silu_want);
    }

    #[test]
    fn soft_max_is_ggmls_soft_max_ext() {
        let mut x: Vec<f32> = (0..16).map(|i| input(i, 0.2) * 20.0).collect();
        soft_max(&mut x, 0.125, None).unwrap();
        let want: [u32; 16] = [
            0x3ca8_d7ea,
            0x3d53_cf1d,
            0x3dec_b2eb,
            0x3e4e_91df,
            0x3e7d_6786,
            0x3e4d_9600,
            0x3ddb_d6a0,
            0x3cf3_0db0,
            0x3c43_ce8e,
            0x3b91_0e96,
            0x3ae3_97cf,
            0x3a5a_82fd,
            0x3a11_a6d8,
            0x3a13_11c6,
            0x3ae6_d16f,
            0x3b58_7b61,
        ];
        assert_eq!(bits(&x), want);
        // exp past -87 (ggml_v_expf's scaled branch, subnormal results) and
        // past -133 (flushed to 0); 4 leftovers through libm.
        let mut wide: Vec<f32> = (0..20).map(|i| -150.0 + 8.5 * i as f32).collect();
        soft_max(&mut wide, 1.0, None).unwrap();
        let want: [u32; 20] = [
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0x0000_0004,
            0x0000_44f6,
            0x0225_7e42,
            0x0846_930b,
            0x0e6e_44b4,
            0x148e_f2ce,
            0x1aab_85ec,
            0x20cd_cf48,
            0x26f6_f332,
            0x2d14_2831,
            0x3331_c5d6,
            0x3955_4f03,
            0x3f7f_f2aa,
        ];
        assert_eq!(bits(&wide), want);
        assert_eq!(expf(f32::NEG_INFINITY), 0.0);
    }

    #[test]
    fn soft_max_adds_the_mask_after_the_scale() {
        let x = row(11, 9, 900.0);
        let mut mask = vec![0f32; 11];
        mask[5] = f32::NEG_INFINITY;
        let scale = 1.0 / 192f32.sqrt();
        let mut got = x.clone();
        soft_max(&mut got, scale, Some(&mask)).unwrap();
        let want: [u32; 11] = [
            0x0000_03ab,
            0,
            0x3f7f_ffa5,
            0,
            0x0744_ee2e,
            0,
            0x0000_006e,
            0x3671_7101,
            0,
            0,
            0x35f7_2682,
        ];
        assert_eq!(bits(&got), want);
        // The f64 softmax rounds differently.
        let mut f64_row: Vec<f32> = x.iter().zip(&mask).map(|(&v, &m)| v * scale + m).collect();
        crate::softmax(&mut f64_row);
        assert_ne!(f64_row, got);
        // A mask of the wrong length is refused before anything is written.
        let mut short = x.clone();
        assert!(matches!(
            soft_max(&mut short, scale, Some(&mask[1..])),
            Err(OpsError::Length { .. })
        ));
        assert_eq!(short, x);
    }

    #[test]
    fn rope_is_ggmls_running_product_and_fmas() {
        let mut x: Vec<f32> = (0..16).map(|i| input(i, 0.9)).collect();
        rope(&mut x, 8, 29, 8, 10000.0).unwrap();
        let want: [u32; 16] = [
            0x3da2_edf9,
            0xbfa2_908b,
            0xbfa8_423a,
            0xbf3f_8247,
            0x3f28_371f,
            0x3f31_a6ae,
            0x3d1b_779e,
            0xbeae_4eb1,
            0xbe04_d49c,
            0x3f98_034a,
            0x3fb1_8f31,
            0x3f5a_71e8,
            0xbf44_9806,
            0xbf77_0305,
            0xbe53_b8f1,
            0x3e2c_7652,
        ];
        assert_eq!(bits(&x), want);
        assert!(rope(&mut x, 8, 1, 7, 10000.0).is_err());
    }

    #[test]
    fn attention_lanes_follow_the_cell_index() {
        // One head of 32 over 3 cells: the result depends on where the
        // cells sit (ggml's lanes), and equals the ops composed by hand.
        let shape = crate::AttentionShape {
            n_head: 1,
            n_head_kv: 1,
            head_dim_k: 32,
            head_dim_v: 32,
        };
        let q: Vec<f32> = (0..32).map(|i| input(i, 0.1) * 3.0).collect();
        let k: Vec<f32> = (0..96).map(|i| input(i, 0.5) * 2.0).collect();
        let v: Vec<f32> = (0..96).map(|i| input(i, 1.3) * 5.0).collect();
        let run = |first: usize, ubatch: Ubatch| {
            let mut out = vec![0f32; 32];
            attention(&q, &k, &v, &shape, 0.125, first, ubatch, &mut out).unwrap();
            out
        };
        let at30 = run(30, Ubatch::One);
        let mut p = vec![f32::NEG_INFINITY; 64];
        for j in 0..3 {
            p[30 + j] = dot_f32(&k[32 * j..32 * j + 32], &q);
        }
        soft_max(&mut p, 0.125, None).unwrap();
        for d in 0..32 {
            let mut col = vec![0f32; 64];
            for j in 0..3 {
                col[30 + j] = v[32 * j + d];
            }
            assert_eq!(at30[d].to_bits(), dot_f32(&col, &p).to_bits(), "dim {d}");
        }
        assert_ne!(run(0, Ubatch::One), at30);
        assert!(
            attention(
                &q,
                &k[1..],
                &v,
                &shape,
                0.125,
                0,
                Ubatch::One,
                &mut [0.0; 32]
            )
            .is_err()
        );
    }
}
