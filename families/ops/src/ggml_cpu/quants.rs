//! ggml's x86 products of quantized weights (AVX2 + FMA), bit for bit.
//!
//! Every kernel forms exact integer sums of weight codes times activation
//! codes; what decides the `f32` result is which elements share an integer
//! sum before it is converted to `f32`, and the order of the fused
//! multiply-adds that follow. The AVX2 kernels keep 8 lanes of 32-bit sums:
//! lane `l` holds the products of the elements `e` with `(e mod 32) / 4 ==
//! l` (`maddubs` then `madd` over 4 consecutive bytes), each scaled by its
//! sub-block's integer scale where the type has one. So a kernel here is
//! the lanes' integer sums, then the kernel's float steps in ggml's order:
//!
//! - `vec_dot` ([`Path::VecDot`], `arch/x86/quants.c`): one token, a
//!   weight that is not repacked. Q8_0, Q4_0, Q5_0: `acc_l = fma(d_w·d_x,
//!   lane_l, acc_l)` per 32-block; Q4_1, Q5_1: the same over unsigned
//!   codes, plus `m·s` of the Q8_1 block; IQ4_NL: two accumulators
//!   (even and odd blocks), an odd last block added after; Q4_K, Q5_K,
//!   Q6_K, IQ4_XS, IQ2_XXS: `acc_l = fma(d, lane_l, acc_l)` per
//!   256-block, with their mins or offsets as ggml subtracts them;
//! - repacked ([`Path::Repacked`], `arch/x86/repack.cpp`): ggml repacks
//!   Q4_0, Q4_K and IQ4_NL weights of a multiple of 8 rows (8 rows
//!   interleaved); each output has one accumulator, `fma(sum, d_w·d_x,
//!   acc)` per block, and for Q4_K its mins in a second one, subtracted
//!   at the end; Q4_K's `gemm` (4 columns of a ubatch at a time) adds
//!   every 64 elements instead of every 256;
//! - the tiled K-quant kernel ([`Path::Tiled`], 8 tokens or more of a
//!   Q4_K, Q5_K, Q6_K, IQ4_XS or IQ2_XXS weight that is not repacked, or
//!   of an expert that 8 tokens picked; `tiled/tiled-kernel.cpp`): per
//!   256-block the exact integer sum `s1`, `res = d_w · s1`, the mins as
//!   `fma(-dmin_w, Σ m·s, res)`, then `acc = fma(res, d_x, acc)`;
//! - llamafile's `tinyBLAS_Q0_AVX` ([`Path::TinyBlas`], several tokens, a
//!   weight of Q8_0, Q4_0, Q5_0 or IQ4_NL that is not repacked): one
//!   accumulator of 8 lanes per output, so IQ4_NL sums unlike its
//!   `vec_dot`.
//!
//! The activations are what each path's `from_float` writes:
//! [`quantize_q8_k_block`] (`quantize_row_q8_K_ref`), the Q8_0 of
//! [`super::quantize_q8_0_block`], [`quantize_q8_1_block`]
//! (`quantize_row_q8_1`, AVX2), and for Q4_K's `gemm` the 4-row
//! `ggml_quantize_mat_q8_K_4x8`, which takes the sign of the scale from a
//! positive element where one reaches the block's largest magnitude.

use half::f16;
use seam::gguf::GgmlType;

use super::{LANES, quantize_q8_0_block, reduce_movehl};
use crate::dequant::{
    IQ4NL_VALUES, f16_at, grid_byte, k4_scales_mins, ksigns, q5_codes, u16_at, u32_at,
};
use crate::grids::IQ2XXS_GRID;

mod tiled;
pub(crate) use tiled::takes as tiled_takes;

/// Elements of a K-quant super-block.
const QK_K: usize = 256;

/// One block of 256 activations as `quantize_row_q8_K_ref` writes it.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockQ8K {
    /// `1 / iscale`.
    pub d: f32,
    /// `min(127, nearest(iscale · x))`, `iscale = -127 / max` of the
    /// element of largest magnitude (with its sign).
    pub qs: [i8; QK_K],
    /// The sums of each 16 codes.
    pub bsums: [i16; 16],
}

/// How the scale's sign is chosen when `+m` and `-m` both reach the
/// block's largest magnitude `m`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SignTie {
    /// `quantize_row_q8_K_ref`: the first such element.
    First,
    /// `ggml_quantize_mat_q8_K_4x8` (AVX2): the positive one.
    Positive,
}

fn q8_k_block(x: &[f32], tie: SignTie) -> BlockQ8K {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if tie == SignTie::Positive && x.contains(&amax) {
        max = amax;
    }
    let mut b = BlockQ8K {
        d: 0.0,
        qs: [0; QK_K],
        bsums: [0; 16],
    };
    if amax == 0.0 {
        return b;
    }
    let iscale = -127.0 / max;
    for (q, &v) in b.qs.iter_mut().zip(x) {
        *q = (iscale * v).round_ties_even().min(127.0) as i8;
    }
    for (s, q) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
        *s = q.iter().map(|&q| i16::from(q)).sum();
    }
    b.d = 1.0 / iscale;
    b
}

/// `quantize_row_q8_K_ref` of one block of 256 activations.
pub fn quantize_q8_k_block(x: &[f32]) -> BlockQ8K {
    q8_k_block(x, SignTie::First)
}

/// One block of 32 activations as `quantize_row_q8_1` (AVX2) writes it.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockQ8_1 {
    /// `f16(max|x| / 127)`, widened.
    pub d: f32,
    /// `f16(d · Σ q)` with the unrounded `d`, widened.
    pub s: f32,
    /// `nearest(x · 127 / max|x|)`.
    pub qs: [i8; 32],
}

/// `quantize_row_q8_1` (AVX2) of one block of 32 activations.
pub fn quantize_q8_1_block(x: &[f32]) -> BlockQ8_1 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let (_, qs) = quantize_q8_0_block(x);
    let sum: i32 = qs.iter().map(|&q| i32::from(q)).sum();
    BlockQ8_1 {
        d: f16::from_f32(d).to_f32(),
        s: f16::from_f32(d * sum as f32).to_f32(),
        qs,
    }
}

/// The activations of one token in a weight type's `vec_dot_type`.
#[derive(Clone, Debug)]
pub(crate) enum Activations {
    /// Q8_0 blocks `(d, codes)`.
    Q8_0(Vec<(f32, [i8; 32])>),
    /// Q8_1 blocks.
    Q8_1(Vec<BlockQ8_1>),
    /// Q8_K blocks.
    Q8K(Vec<BlockQ8K>),
}

/// How ggml forms a product of a quantized weight (see the module
/// documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Path {
    /// `ggml_vec_dot_*`.
    VecDot,
    /// The repacked 8-row layout; `gemm` when the column is one of 4 that
    /// the ubatch's `gemm` takes together.
    Repacked {
        /// `ggml_gemm_*` rather than `ggml_gemv_*`.
        gemm: bool,
    },
    /// llamafile's `tinyBLAS_Q0_AVX`.
    TinyBlas,
    /// ggml's tiled K-quant `mul_mat` (8 tokens or more).
    Tiled,
}

/// The quantized weight types whose products this module reproduces.
pub(crate) fn is_quantized_emulated(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        Q8_0 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | IQ4_NL | Q4_K | Q5_K | Q6_K | IQ4_XS | IQ2_XXS
    )
}

/// Whether ggml's CPU backend repacks a weight of `ty` with `tensor_rows`
/// rows on an AVX2 machine (`ggml_repack_get_optimal_repack_type`).
pub(crate) fn is_repacked(ty: GgmlType, tensor_rows: usize) -> bool {
    matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_K | GgmlType::IQ4_NL)
        && tensor_rows.is_multiple_of(8)
}

/// Whether llamafile's `tinyBLAS_Q0_AVX` takes a product of `ty` (with
/// several tokens, a weight that is not repacked).
pub(crate) fn tinyblas_q0_takes(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::IQ4_NL
    )
}

/// The activations `x` (whole blocks) as `path` converts them for `ty`.
pub(crate) fn activations(ty: GgmlType, path: Path, x: &[f32]) -> Activations {
    use GgmlType::*;
    match ty {
        Q4_1 | Q5_1 => Activations::Q8_1(x.chunks_exact(32).map(quantize_q8_1_block).collect()),
        Q4_K | Q5_K | Q6_K | IQ4_XS | IQ2_XXS => {
            let tie = if path == (Path::Repacked { gemm: true }) {
                SignTie::Positive
            } else {
                SignTie::First
            };
            Activations::Q8K(x.chunks_exact(QK_K).map(|b| q8_k_block(b, tie)).collect())
        }
        _ => Activations::Q8_0(x.chunks_exact(32).map(quantize_q8_0_block).collect()),
    }
}

/// A 32-element block's scale, min and codes as `i8` (unsigned codes for
/// the types with a min).
fn block32(ty: GgmlType, b: &[u8]) -> (f32, f32, [i8; 32]) {
    let mut q = [0i8; 32];
    let d = f16_at(b, 0);
    match ty {
        GgmlType::Q8_0 => {
            for (q, &c) in q.iter_mut().zip(&b[2..34]) {
                *q = c as i8;
            }
            (d, 0.0, q)
        }
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::IQ4_NL => {
            let qs = if ty == GgmlType::Q4_1 {
                &b[4..20]
            } else {
                &b[2..18]
            };
            for (j, &c) in qs.iter().enumerate() {
                let (lo, hi) = (c & 0xf, c >> 4);
                (q[j], q[j + 16]) = match ty {
                    GgmlType::Q4_0 => (lo as i8 - 8, hi as i8 - 8),
                    GgmlType::Q4_1 => (lo as i8, hi as i8),
                    _ => (IQ4NL_VALUES[usize::from(lo)], IQ4NL_VALUES[usize::from(hi)]),
                };
            }
            let m = if ty == GgmlType::Q4_1 {
                f16_at(b, 2)
            } else {
                0.0
            };
            (d, m, q)
        }
        GgmlType::Q5_0 => {
            for (q, c) in q.iter_mut().zip(q5_codes(u32_at(b, 2), &b[6..22])) {
                *q = c as i8 - 16;
            }
            (d, 0.0, q)
        }
        GgmlType::Q5_1 => {
            for (q, c) in q.iter_mut().zip(q5_codes(u32_at(b, 4), &b[8..24])) {
                *q = c as i8;
            }
            (d, f16_at(b, 2), q)
        }
        other => unreachable!("{other} is not a 32-element block type"),
    }
}

/// The 8 lanes of `Σ w·x` over a block of 32, lane `l` over elements
/// `4l..4l + 4`.
fn lanes32(w: &[i8; 32], x: &[i8; 32]) -> [i32; LANES] {
    std::array::from_fn(|l| {
        (4 * l..4 * l + 4)
            .map(|i| i32::from(w[i]) * i32::from(x[i]))
            .sum()
    })
}

/// `acc_l = fma(d, lane_l, acc_l)` for each lane.
fn fma_lanes(acc: &mut [f32; LANES], d: f32, lanes: &[i32; LANES]) {
    for (a, &s) in acc.iter_mut().zip(lanes) {
        *a = d.mul_add(s as f32, *a);
    }
}

/// The bytes of block `i` of a row of `ty`.
fn block_of(ty: GgmlType, row: &[u8], i: usize) -> &[u8] {
    let size = ty.type_size() as usize;
    &row[i * size..(i + 1) * size]
}

/// `W_row · x` for one weight row of `ty` (whole blocks) and the
/// activations `act` made by [`activations`] for `path`, as ggml computes
/// it.
pub(crate) fn dot(ty: GgmlType, row: &[u8], act: &Activations, path: Path) -> f32 {
    match (act, ty) {
        (Activations::Q8K(x), _) if path == Path::Tiled => tiled::dot(ty, row, x),
        (Activations::Q8_0(x), _) => match path {
            Path::Repacked { .. } => dot_q8_0_repacked(ty, row, x),
            Path::TinyBlas => dot_q8_0_lanes(ty, row, x),
            Path::VecDot if ty == GgmlType::IQ4_NL => dot_iq4_nl(row, x),
            Path::VecDot | Path::Tiled => dot_q8_0_lanes(ty, row, x),
        },
        (Activations::Q8_1(x), _) => dot_q8_1(ty, row, x),
        (Activations::Q8K(x), GgmlType::Q4_K) => match path {
            Path::Repacked { gemm } => dot_q4_k_repacked(row, x, gemm),
            _ => dot_q4_k(row, x),
        },
        (Activations::Q8K(x), GgmlType::Q5_K) => dot_q5_k(row, x),
        (Activations::Q8K(x), GgmlType::Q6_K) => dot_q6_k(row, x),
        (Activations::Q8K(x), GgmlType::IQ4_XS) => dot_iq4_xs(row, x),
        (Activations::Q8K(x), GgmlType::IQ2_XXS) => dot_iq2_xxs(row, x),
        (_, other) => unreachable!("no Q8_K kernel for {other}"),
    }
}

/// `ggml_vec_dot_q8_0_q8_0`, `_q4_0_q8_0`, `_q5_0_q8_0` and
/// `tinyBLAS_Q0_AVX`: one accumulator of 8 lanes.
fn dot_q8_0_lanes(ty: GgmlType, row: &[u8], x: &[(f32, [i8; 32])]) -> f32 {
    let mut acc = [0f32; LANES];
    for (i, (dx, qx)) in x.iter().enumerate() {
        let (dw, _, qw) = block32(ty, block_of(ty, row, i));
        fma_lanes(&mut acc, dw * dx, &lanes32(&qw, qx));
    }
    reduce_movehl(acc)
}

/// `ggml_vec_dot_iq4_nl_q8_0`: blocks in pairs, the first of each pair in
/// one accumulator and the second in another, reduced as their sum; an
/// odd last block added after as `fma(d, Σ, sum)`.
fn dot_iq4_nl(row: &[u8], x: &[(f32, [i8; 32])]) -> f32 {
    let ty = GgmlType::IQ4_NL;
    let (mut acc1, mut acc2) = ([0f32; LANES], [0f32; LANES]);
    let pairs = x.len() / 2;
    for p in 0..pairs {
        for (acc, i) in [(&mut acc1, 2 * p), (&mut acc2, 2 * p + 1)] {
            let (dw, _, qw) = block32(ty, block_of(ty, row, i));
            let (dx, qx) = &x[i];
            fma_lanes(acc, dx * dw, &lanes32(&qw, qx));
        }
    }
    let mut sum = reduce_movehl(std::array::from_fn(|l| acc1[l] + acc2[l]));
    for (i, (dx, qx)) in x.iter().enumerate().skip(2 * pairs) {
        let (dw, _, qw) = block32(ty, block_of(ty, row, i));
        let s: i32 = lanes32(&qw, qx).iter().sum();
        sum = (dx * dw).mul_add(s as f32, sum);
    }
    sum
}

/// `ggml_vec_dot_q4_1_q8_1`, `_q5_1_q8_1`: the unsigned codes' lanes,
/// `fma(d_w·d_x, lane, acc)`; the mins as `summs = fma(m, s, summs)`,
/// added after the lanes' sum.
fn dot_q8_1(ty: GgmlType, row: &[u8], x: &[BlockQ8_1]) -> f32 {
    let mut acc = [0f32; LANES];
    let mut summs = 0f32;
    for (i, xb) in x.iter().enumerate() {
        let (dw, m, qw) = block32(ty, block_of(ty, row, i));
        summs = m.mul_add(xb.s, summs);
        fma_lanes(&mut acc, dw * xb.d, &lanes32(&qw, &xb.qs));
    }
    reduce_movehl(acc) + summs
}

/// The repacked Q4_0 and IQ4_NL `gemv`/`gemm` (`gemv_q4_b32_8x8_q8_0_lut_avx`
/// and its `gemm`): one accumulator, `fma(Σ, d_w·d_x, acc)` per block.
fn dot_q8_0_repacked(ty: GgmlType, row: &[u8], x: &[(f32, [i8; 32])]) -> f32 {
    let mut acc = 0f32;
    for (i, (dx, qx)) in x.iter().enumerate() {
        let (dw, _, qw) = block32(ty, block_of(ty, row, i));
        let s: i32 = lanes32(&qw, qx).iter().sum();
        acc = (s as f32).mul_add(dw * dx, acc);
    }
    acc
}

/// The lane of element `e` of a K-quant block.
fn lane_of(e: usize) -> usize {
    (e % 32) / 4
}

/// A Q4_K/Q5_K block's codes (unsigned, 4 or 5 bits), 6-bit scales and
/// mins, and `d`, `dmin`.
fn k4_block(ty: GgmlType, b: &[u8]) -> ([u8; QK_K], [u8; 8], [u8; 8], f32, f32) {
    let (sc, mn) = k4_scales_mins(&b[4..16]);
    let (qh, qs) = if ty == GgmlType::Q5_K {
        (Some(&b[16..48]), &b[48..176])
    } else {
        (None, &b[16..144])
    };
    let codes = std::array::from_fn(|e| {
        let (c, h, l) = (e / 64, (e / 32) % 2, e % 32);
        let low = (qs[32 * c + l] >> (4 * h)) & 0xf;
        low | qh.map_or(0, |qh| ((qh[l] >> (e / 32)) & 1) << 4)
    });
    (codes, sc, mn, f16_at(b, 0), f16_at(b, 2))
}

/// Per lane, `Σ scale(e) · w(e) · x(e)` over a 256-block.
fn k_lanes(w: impl Fn(usize) -> i32, x: &[i8; QK_K]) -> [i32; LANES] {
    let mut lanes = [0i32; LANES];
    for (e, &q) in x.iter().enumerate() {
        lanes[lane_of(e)] += w(e) * i32::from(q);
    }
    lanes
}

/// The sums of each 32 activation codes (pairs of `bsums`).
fn bsums32(x: &BlockQ8K) -> [i32; 8] {
    std::array::from_fn(|k| i32::from(x.bsums[2 * k]) + i32::from(x.bsums[2 * k + 1]))
}

/// `ggml_vec_dot_q4_K_q8_K`: the scaled codes' lanes, `fma(d, lane,
/// acc)` per block with `d = d_x · d_w`; the mins in 4 lanes of
/// `fma(-d_x · dmin_w, m_{2k}·s_{2k} + m_{2k+1}·s_{2k+1}, acc_m)` (`s` the
/// sums of 32 activations), reduced and added after.
fn dot_q4_k(row: &[u8], x: &[BlockQ8K]) -> f32 {
    let ty = GgmlType::Q4_K;
    let mut acc = [0f32; LANES];
    let mut acc_m = [0f32; 4];
    for (i, xb) in x.iter().enumerate() {
        let (codes, sc, mn, d, dmin) = k4_block(ty, block_of(ty, row, i));
        let d = xb.d * d;
        let dmin = -xb.d * dmin;
        let s = bsums32(xb);
        for (k, a) in acc_m.iter_mut().enumerate() {
            let prod = i32::from(mn[2 * k]) * s[2 * k] + i32::from(mn[2 * k + 1]) * s[2 * k + 1];
            *a = dmin.mul_add(prod as f32, *a);
        }
        let lanes = k_lanes(|e| i32::from(sc[e / 32]) * i32::from(codes[e]), &xb.qs);
        fma_lanes(&mut acc, d, &lanes);
    }
    let m = (acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]);
    reduce_movehl(acc) + m
}

/// `ggml_vec_dot_q5_K_q8_K`: Q4_K's lanes over 5-bit codes; the mins
/// summed as one integer per block and added as `summs = fma(-d_x·dmin_w,
/// Σ, summs)`, after the lanes' sum.
fn dot_q5_k(row: &[u8], x: &[BlockQ8K]) -> f32 {
    let ty = GgmlType::Q5_K;
    let mut acc = [0f32; LANES];
    let mut summs = 0f32;
    for (i, xb) in x.iter().enumerate() {
        let (codes, sc, mn, d, dmin) = k4_block(ty, block_of(ty, row, i));
        let d = xb.d * d;
        let dmin = -xb.d * dmin;
        let s = bsums32(xb);
        let mins: i32 = (0..8).map(|k| i32::from(mn[k]) * s[k]).sum();
        summs = dmin.mul_add(mins as f32, summs);
        let lanes = k_lanes(|e| i32::from(sc[e / 32]) * i32::from(codes[e]), &xb.qs);
        fma_lanes(&mut acc, d, &lanes);
    }
    reduce_movehl(acc) + summs
}

/// `ggml_vec_dot_q6_K_q8_K`: the unsigned 6-bit codes' scaled lanes less
/// `32 · (s_{2l}·sc_{2l} + s_{2l+1}·sc_{2l+1})` (the `-32` offset through
/// the sums of 16 activations), `fma(d, lane, acc)` per block.
fn dot_q6_k(row: &[u8], x: &[BlockQ8K]) -> f32 {
    let ty = GgmlType::Q6_K;
    let mut acc = [0f32; LANES];
    for (i, xb) in x.iter().enumerate() {
        let b = block_of(ty, row, i);
        let (ql, qh, scales) = (&b[..128], &b[128..192], &b[192..208]);
        let d = xb.d * f16_at(b, 208);
        let code = |e: usize| -> i32 {
            let n = e / 128;
            let low = (ql[64 * n + e % 64] >> (4 * ((e / 64) % 2))) & 0xf;
            let high = (qh[32 * n + e % 32] >> (2 * ((e / 32) % 4))) & 3;
            i32::from(low | high << 4)
        };
        let sc = |k: usize| i32::from(scales[k] as i8);
        let mut lanes = k_lanes(|e| sc(e / 16) * code(e), &xb.qs);
        for (l, v) in lanes.iter_mut().enumerate() {
            let sub = i32::from(xb.bsums[2 * l]) * sc(2 * l)
                + i32::from(xb.bsums[2 * l + 1]) * sc(2 * l + 1);
            *v -= 32 * sub;
        }
        fma_lanes(&mut acc, d, &lanes);
    }
    reduce_movehl(acc)
}

/// `ggml_vec_dot_iq4_xs_q8_K`: IQ4_NL's code book scaled by each 32's
/// 6-bit scale less 32, `fma(d_w·d_x, lane, acc)` per block.
fn dot_iq4_xs(row: &[u8], x: &[BlockQ8K]) -> f32 {
    let ty = GgmlType::IQ4_XS;
    let mut acc = [0f32; LANES];
    for (i, xb) in x.iter().enumerate() {
        let b = block_of(ty, row, i);
        let (scales_h, scales_l, qs) = (u16_at(b, 2), &b[4..8], &b[8..136]);
        let ls: [i32; 8] = std::array::from_fn(|g| {
            let low = (scales_l[g / 2] >> (4 * (g % 2))) & 0xf;
            let high = ((scales_h >> (2 * g)) & 3) as u8;
            i32::from(low | high << 4) - 32
        });
        let code = |e: usize| -> i32 {
            let (g, j) = (e / 32, e % 32);
            let c = qs[16 * g + j % 16] >> (4 * (j / 16)) & 0xf;
            i32::from(IQ4NL_VALUES[usize::from(c)])
        };
        let lanes = k_lanes(|e| ls[e / 32] * code(e), &xb.qs);
        fma_lanes(&mut acc, f16_at(b, 0) * xb.d, &lanes);
    }
    reduce_movehl(acc)
}

/// `ggml_vec_dot_iq2_xxs_q8_K`: the grid values times `2s + 1` of each
/// 32, signs on the activations, `fma(d_w·d_x, lane, acc)` per block,
/// then `0.125 ·` the lanes' sum.
fn dot_iq2_xxs(row: &[u8], x: &[BlockQ8K]) -> f32 {
    let ty = GgmlType::IQ2_XXS;
    let mut acc = [0f32; LANES];
    for (i, xb) in x.iter().enumerate() {
        let b = block_of(ty, row, i);
        let value = |e: usize| -> i32 {
            let (g, l, j) = (e / 32, (e % 32) / 8, e % 8);
            let aux = u32_at(b, 6 + 8 * g);
            let entry = IQ2XXS_GRID[usize::from(b[2 + 8 * g + l])];
            let v = i32::from(grid_byte(entry, j)) * (2 * (aux >> 28) as i32 + 1);
            if ksigns(aux >> (7 * l)) >> j & 1 != 0 {
                -v
            } else {
                v
            }
        };
        let lanes = k_lanes(value, &xb.qs);
        fma_lanes(&mut acc, f16_at(b, 0) * xb.d, &lanes);
    }
    0.125 * reduce_movehl(acc)
}

/// The repacked Q4_K (`ggml_gemv_q4_K_8x8_q8_K`, `ggml_gemm_…`): one
/// accumulator for the scaled codes, `fma(Σ, d_w·d_x, acc)`, one for the
/// mins, `fma(Σ m·s, dmin_w·d_x, acc_m)`, each per block (`gemv`) or per
/// 64 elements (`gemm`); the result `acc - acc_m`.
fn dot_q4_k_repacked(row: &[u8], x: &[BlockQ8K], gemm: bool) -> f32 {
    let ty = GgmlType::Q4_K;
    let (mut acc, mut acc_m) = (0f32, 0f32);
    for (i, xb) in x.iter().enumerate() {
        let (codes, sc, mn, d, dmin) = k4_block(ty, block_of(ty, row, i));
        let s = bsums32(xb);
        let sub: [i32; 8] = std::array::from_fn(|k| {
            (32 * k..32 * k + 32)
                .map(|e| i32::from(codes[e]) * i32::from(xb.qs[e]))
                .sum::<i32>()
                * i32::from(sc[k])
        });
        let mins: [i32; 8] = std::array::from_fn(|k| i32::from(mn[k]) * s[k]);
        let (scale, scale_m) = (d * xb.d, dmin * xb.d);
        let step = if gemm { 2 } else { 8 };
        for k in (0..8).step_by(step) {
            let dot: i32 = sub[k..k + step].iter().sum();
            let min: i32 = mins[k..k + step].iter().sum();
            acc = (dot as f32).mul_add(scale, acc);
            acc_m = (min as f32).mul_add(scale_m, acc_m);
        }
    }
    acc - acc_m
}

#[cfg(test)]
mod tests {
    //! The expected bits are what the oracle's libggml computes
    //! (`tools/oracle/ggml_quant_refs.c`: `vec_dot` through the CPU type
    //! traits, `mul_mat` on the CPU backend with the weight in the repack
    //! buffer or a plain one), for weights of pseudo-random bytes with sane
    //! scales ([`weight_bytes`]) and activations [`row`].

    use super::super::refs::row;
    use super::super::{Ubatch, matvec};
    use super::*;

    /// The offsets of a block's f16 scale and (where it has one) min.
    fn scale_fields(ty: GgmlType) -> (usize, Option<usize>) {
        use GgmlType::*;
        match ty {
            Q4_1 | Q5_1 | Q4_K | Q5_K => (0, Some(2)),
            Q6_K => (208, None),
            _ => (0, None),
        }
    }

    /// The C file's `weight_bytes`: LCG bytes, block `b`'s scale
    /// `f16(0.011 + 0.0007 b)` and min `f16(0.0043 + 0.0003 b)`.
    fn weight_bytes(ty: GgmlType, n: usize, rows: usize, seed: u32) -> Vec<u8> {
        let total = crate::row_bytes(ty, n).unwrap() * rows;
        let mut s = seed;
        let mut out: Vec<u8> = (0..total)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (s >> 24) as u8
            })
            .collect();
        let (d, m) = scale_fields(ty);
        let size = ty.type_size() as usize;
        for (b, block) in out.chunks_exact_mut(size).enumerate() {
            let put = |block: &mut [u8], at: usize, v: f32| {
                block[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
            };
            put(block, d, 0.011 + 0.0007 * b as f32);
            if let Some(m) = m {
                put(block, m, 0.0043 + 0.0003 * b as f32);
            }
        }
        out
    }

    /// `W · x` of `rows` rows for column `c` of `cols` (`row(n, xseed + c,
    /// 2.5)`), through [`matvec`].
    fn product(ty: GgmlType, n: usize, rows: usize, cols: usize, seeds: (u32, u32)) -> Vec<u32> {
        let w = weight_bytes(ty, n, rows, seeds.0);
        let mut all = Vec::new();
        for c in 0..cols {
            let x = row(n, seeds.1 + c as u32, 2.5);
            let mut out = vec![0f32; rows];
            matvec(ty, &w, n, rows, rows, Ubatch::of(c, cols), &x, &mut out).unwrap();
            all.extend(out.iter().map(|v| v.to_bits()));
        }
        all
    }

    /// The same product with the activations rounded as ggml rounds them
    /// but dotted in `f64` (`crate::matvec`): what the kernels' order is
    /// tested against.
    fn f64_product(ty: GgmlType, n: usize, seeds: (u32, u32)) -> u32 {
        let w = weight_bytes(ty, n, 1, seeds.0);
        let x = crate::as_ggml_multiplies(ty, &row(n, seeds.1, 2.5)).unwrap();
        let mut out = [0f32];
        crate::matvec(ty, &w, n, 1, &x, &mut out).unwrap();
        out[0].to_bits()
    }

    #[test]
    fn vec_dots_are_ggmls() {
        use GgmlType::*;
        // (type, [n = 512 with seeds (7 + i, 100 + i), n = 768 with (17 + i,
        // 200 + i)]) for the C file's i-th type.
        let cases: [(GgmlType, [u32; 2]); 11] = [
            (Q8_0, [0xc233_eb04, 0x40fc_d4be]),
            (Q4_0, [0xbf53_e51f, 0x3f46_8430]),
            (Q4_1, [0xc13a_3ceb, 0xc039_8d1a]),
            (Q5_0, [0x4023_ac98, 0xbfc5_d833]),
            (Q5_1, [0xc025_21c6, 0xc06f_b2d7]),
            (IQ4_NL, [0x41da_f709, 0xc279_8190]),
            (Q4_K, [0x4273_e27f, 0xc322_c1d1]),
            (Q5_K, [0xc297_9660, 0xc37c_466c]),
            (Q6_K, [0xc326_441c, 0x4419_b9d0]),
            (IQ4_XS, [0x4185_38fc, 0x4483_41c1]),
            (IQ2_XXS, [0x4189_72a0, 0x404c_ffb0]),
        ];
        // The C file's order of types (Q2_K and Q3_K are not emulated).
        let order = [
            Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, IQ2_XXS,
        ];
        let mut f64_differs = 0;
        for (ty, want) in cases {
            let i = order.iter().position(|&t| t == ty).unwrap() as u32;
            for (n, seeds, want) in [
                (512, (7 + i, 100 + i), want[0]),
                (768, (17 + i, 200 + i), want[1]),
            ] {
                // One row of a weight of one row: vec_dot (nothing repacks).
                let got = product(ty, n, 1, 1, seeds)[0];
                assert_eq!(got, want, "{ty} n {n}: {:e}", f32::from_bits(got));
                f64_differs += usize::from(f64_product(ty, n, seeds) != want);
            }
        }
        assert!(
            f64_differs >= 11,
            "only {f64_differs} of 22 tell ggml's order from an f64 dot"
        );
        // IQ4_NL's odd last block, added after the two accumulators.
        assert_eq!(product(IQ4_NL, 96, 1, 1, (41, 42))[0], 0xc19c_59e2);
    }

    #[test]
    fn repacked_weights_sum_as_ggmls_gemv_and_gemm() {
        use GgmlType::*;
        // 8 rows by 6 columns: gemm for the first 4, gemv for the last 2;
        // column 0 alone is gemv.
        let q4_0: [u32; 48] = [
            0xbf06_8bbc,
            0x3f88_968c,
            0xbf96_cd10,
            0x3ec7_ce31,
            0x3fe5_3f8d,
            0x3ff2_5821,
            0xbf8f_6cc1,
            0xc086_fa78,
            0x3f1d_6923,
            0xbe53_c224,
            0x3dbb_4a9a,
            0x3f11_7ac9,
            0xbe95_418f,
            0xc01b_0631,
            0x3fd0_a9fe,
            0xbfb3_9b9c,
            0xbed9_0e81,
            0xbe39_a07f,
            0x3e80_b523,
            0xbf2f_233e,
            0xbe9b_3ba5,
            0xbff5_5040,
            0xbbbc_f800,
            0xc037_e341,
            0xbe69_3557,
            0x3f69_267a,
            0x3dde_a8b6,
            0x3ead_1bab,
            0x3fba_ee80,
            0xbfa6_1ab7,
            0xbec3_3dbf,
            0x3ea9_1d66,
            0x3ee0_6fde,
            0x3e8f_4e60,
            0xbeec_65bf,
            0x3ec6_5550,
            0x3e9a_6f67,
            0x3f9f_93ab,
            0xbfb5_9569,
            0xc013_6821,
            0x3eb4_415b,
            0x3f85_7d8a,
            0xbf3d_1abe,
            0x4013_54c0,
            0x3ff8_e1a4,
            0x3de9_853f,
            0x4041_d709,
            0x3fb9_9a3a,
        ];
        let q4_k: [u32; 48] = [
            0xc220_89de,
            0x41d0_6928,
            0xc276_5f93,
            0xc310_3617,
            0xc309_40cb,
            0x4300_bbb1,
            0x42b8_306a,
            0xc381_efea,
            0x4199_9c92,
            0x41e3_8488,
            0x4358_70fb,
            0x41d3_ac49,
            0x40d2_b81f,
            0x3fe1_fa30,
            0xc25f_562c,
            0x4104_ec84,
            0x4223_79a3,
            0x432a_010e,
            0xc227_1203,
            0xc169_3358,
            0xc21d_996d,
            0x4282_0df9,
            0x437a_4fe4,
            0x421d_777e,
            0xc2e1_b49f,
            0xc28b_d187,
            0xc248_4460,
            0xc2d2_f186,
            0xc2b4_4981,
            0x422f_3127,
            0xc384_f6e6,
            0xbf2c_50e9,
            0x42d4_eef0,
            0x4189_ee4a,
            0xc18b_9c4f,
            0xc1e8_1d2a,
            0xc312_9f10,
            0xc1a6_b8e2,
            0x4235_2b1d,
            0xc1b4_dac6,
            0xc238_da54,
            0x429f_0f01,
            0x435b_6561,
            0x4327_cdaf,
            0xc200_8d42,
            0x4406_f290,
            0x43d6_b1f7,
            0x43ba_e374,
        ];
        let iq4_nl: [u32; 48] = [
            0xc13d_9a5a,
            0xc0f7_762a,
            0x4100_6816,
            0xc1b0_da14,
            0xc195_2961,
            0x4214_80dc,
            0xc215_455b,
            0x4050_f845,
            0xc091_bcf2,
            0x415e_a3c9,
            0xbff4_89bb,
            0x4190_5b5f,
            0xc1cf_216e,
            0xc24d_f538,
            0xc0a7_b080,
            0x423e_5c37,
            0x40ea_4972,
            0xc0f6_b4fe,
            0xc1a5_d169,
            0x4103_bceb,
            0xc106_5150,
            0xc1de_22d2,
            0xc1c0_4cc0,
            0x41e1_7150,
            0xc07b_7e78,
            0x3edb_ed04,
            0x40d5_f24a,
            0xc0c3_c2db,
            0x4188_a57a,
            0xc189_4258,
            0x41fc_eefa,
            0x412c_6c02,
            0x4050_adb1,
            0xc019_d3f7,
            0xc182_5d5a,
            0x412a_d104,
            0x4121_669b,
            0xc12d_e832,
            0x41c0_0d48,
            0x4193_7ce4,
            0x4181_a210,
            0xc195_db84,
            0x3f95_f518,
            0x4114_06ce,
            0xc174_bb6b,
            0x4233_f4b3,
            0xc16a_760b,
            0xc1c5_6d80,
        ];
        for (i, (ty, n, want)) in [(Q4_0, 96, q4_0), (Q4_K, 512, q4_k), (IQ4_NL, 96, iq4_nl)]
            .into_iter()
            .enumerate()
        {
            let seeds = (300 + i as u32, 400);
            assert_eq!(product(ty, n, 8, 6, seeds), want, "{ty} 6 columns");
            let one = product(ty, n, 8, 1, seeds);
            let gemv_col0: &[u32] = if ty == Q4_K {
                // libggml's gemv of column 0 alone: row 1 differs from gemm's.
                &[
                    0xc220_89de,
                    0x41d0_6926,
                    0xc276_5f93,
                    0xc310_3617,
                    0xc309_40cb,
                    0x4300_bbb1,
                    0x42b8_306a,
                    0xc381_efea,
                ]
            } else {
                &want[..8]
            };
            assert_eq!(one, gemv_col0, "{ty} one column");
        }
    }

    #[test]
    fn several_columns_of_a_plain_weight_take_tinyblas_or_vec_dot() {
        use GgmlType::*;
        // 4 rows by 3 columns, not repacked: tinyBLAS_Q0_AVX for Q8_0, Q5_0
        // and IQ4_NL, vec_dot per column for Q5_1 and Q6_K.
        let cases: [(GgmlType, usize, [u32; 12]); 5] = [
            (
                Q8_0,
                96,
                [
                    0xc1c0_d1d5,
                    0xbe9f_77e0,
                    0x3f36_49d0,
                    0x41a2_aeae,
                    0x40f2_3341,
                    0x4122_3643,
                    0x411a_e661,
                    0xc115_ca8b,
                    0x3dca_7000,
                    0x40d9_c92e,
                    0xbf3f_7bc8,
                    0x414e_55b2,
                ],
            ),
            (
                Q5_0,
                96,
                [
                    0x3fbf_d510,
                    0x3f17_3dde,
                    0x3f1d_383e,
                    0x3fc6_8f3b,
                    0x3f8f_422c,
                    0xbf80_6c06,
                    0xbc61_5080,
                    0xbf9a_13f4,
                    0x400e_0346,
                    0xc00c_a02a,
                    0x3f88_a41a,
                    0x3fa6_b96e,
                ],
            ),
            (
                IQ4_NL,
                96,
                [
                    0xc130_90a0,
                    0x4093_6db4,
                    0x408c_35d4,
                    0x4146_20a9,
                    0x40f1_25ce,
                    0xc1c4_400c,
                    0xc1f3_7111,
                    0x41c6_d439,
                    0xc122_56f6,
                    0x405c_a248,
                    0x419a_6087,
                    0x40a3_b5fb,
                ],
            ),
            (
                Q5_1,
                96,
                [
                    0xc021_7ee3,
                    0xc060_5476,
                    0xc032_19d2,
                    0xc0ce_54ff,
                    0x3fb2_c20b,
                    0xbfca_5830,
                    0xbf58_a28f,
                    0x3ecf_335e,
                    0x4068_9112,
                    0x4097_a710,
                    0x4069_bf4a,
                    0x4023_8fd3,
                ],
            ),
            (
                Q6_K,
                512,
                [
                    0x43d0_c532,
                    0xc3af_87e9,
                    0xc480_014e,
                    0xc407_6e98,
                    0x4302_6d18,
                    0x4406_b17a,
                    0x4326_23d2,
                    0xc39a_2f2e,
                    0x441b_aaae,
                    0xc475_ab9f,
                    0xc346_102d,
                    0x44a2_d074,
                ],
            ),
        ];
        for (i, (ty, n, want)) in cases.into_iter().enumerate() {
            let seeds = (500 + i as u32, 600);
            assert_eq!(product(ty, n, 4, 3, seeds), want, "{ty}");
        }
        // IQ4_NL's one accumulator (tinyBLAS) and two (vec_dot) differ.
        let w = weight_bytes(IQ4_NL, 96, 4, 502);
        let x = row(96, 600, 2.5);
        let (mut one, mut many) = ([0f32; 4], [0f32; 4]);
        matvec(IQ4_NL, &w, 96, 4, 4, Ubatch::One, &x, &mut one).unwrap();
        matvec(IQ4_NL, &w, 96, 4, 4, Ubatch::of(2, 3), &x, &mut many).unwrap();
        assert_ne!(one, many);
    }

    #[test]
    fn eight_columns_or_more_of_a_k_quant_take_the_tiled_kernel() {
        use GgmlType::*;
        // 4 rows by 9 columns of a plain weight, the C file's FNV-1a of the
        // 36 outputs (column after column).
        let cases = [
            (Q4_K, 0xc230_e2f2_72d4_c353u64),
            (Q5_K, 0xdca8_955e_b107_547a),
            (Q6_K, 0xf6ab_a91b_2c47_eac3),
            (IQ4_XS, 0xbdb1_880b_5804_356d),
            (IQ2_XXS, 0x544d_f515_4882_75aa),
        ];
        for (i, (ty, want)) in cases.into_iter().enumerate() {
            let seeds = (700 + i as u32, 800);
            let got: Vec<f32> = product(ty, 512, 4, 9, seeds)
                .into_iter()
                .map(f32::from_bits)
                .collect();
            assert_eq!(super::super::refs::fnv(&got), want, "{ty}");
            // Under 8 columns, vec_dot: the same token sums elsewhere.
            let few: Vec<u32> = product(ty, 512, 4, 3, seeds);
            assert_ne!(
                few[..12],
                got[..12].iter().map(|v| v.to_bits()).collect::<Vec<_>>()[..],
                "{ty}"
            );
        }
        // An expert's rows take it from 8 picks too.
        let w = weight_bytes(Q6_K, 512, 4, 702);
        let x = row(512, 800, 2.5);
        let (mut one, mut eight) = ([0f32; 4], [0f32; 4]);
        matvec(Q6_K, &w, 512, 4, 4, Ubatch::expert(7), &x, &mut one).unwrap();
        matvec(Q6_K, &w, 512, 4, 4, Ubatch::expert(8), &x, &mut eight).unwrap();
        assert_ne!(one, eight);
    }

    #[test]
    fn q8_k_takes_the_first_extreme_and_gemm_the_positive_one() {
        let mut x = vec![0.5f32; 256];
        x[3] = -2.0;
        x[9] = 2.0;
        let first = quantize_q8_k_block(&x);
        assert_eq!((first.qs[3], first.qs[9], first.d), (-127, 127, 1.0 / 63.5));
        let positive = q8_k_block(&x, SignTie::Positive);
        assert_eq!((positive.qs[3], positive.qs[9]), (127, -127));
        assert_eq!(
            first.bsums[0],
            first.qs[..16].iter().map(|&q| i16::from(q)).sum::<i16>()
        );
        let zero = quantize_q8_k_block(&[0.0; 256]);
        assert_eq!((zero.d, zero.qs[0]), (0.0, 0));
    }
}
