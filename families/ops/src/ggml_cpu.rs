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
//! - [`matvec`]: `ggml_compute_forward_mul_mat` for one token (the
//!   activations converted to the weight's `vec_dot_type`, then one dot
//!   per row: `ggml_vec_dot_q8_0_q8_0` / `ggml_vec_dot_q4_0_q8_0`
//!   (`arch/x86/quants.c`), or for a Q4_0 weight of a multiple of 8 rows
//!   the repacked `ggml_gemv_q4_0_8x8_q8_0` (`arch/x86/repack.cpp`));
//! - [`expf`], [`silu`], [`swiglu`]: `ggml_v_expf`, `ggml_v_silu`,
//!   `ggml_vec_swiglu_f32` (`vec.h`, `vec.cpp`); [`sigmoid`]: the unary op;
//! - [`rope`]: `ggml_rope_cache_init` and `rotate_pairs` (`ops.cpp`);
//! - [`attention`]: `mul_mat(k, q)`, `soft_max_ext` and `mul_mat(v, kq)`
//!   of llama.cpp's attention without flash attention over an F32 cache.
//!
//! Each function names the ggml routine it follows; the tests hold values
//! that ggml itself computed.

use half::{bf16, f16};
use seam::gguf::GgmlType;

use crate::{OpsError, check_len};

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

/// The main loop of `ggml_vec_dot_f32` / `_f16` (`GGML_F32_STEP` 32, four
/// `__m256` accumulators, FMA) and `GGML_F32x8_REDUCE`; returns the
/// reduced sum and the index where the scalar leftovers start.
fn dot_steps(x: &[f32], y: &[f32]) -> (f32, usize) {
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
    let mut v = [0f32; LANES];
    for l in 0..LANES {
        v[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    }
    (reduce_hadd(v), np)
}

/// `ggml_vec_dot_f32`: `Σ x_i·y_i` as ggml's AVX2 path sums it (the
/// leftovers past the last whole 32 accumulate in `f32`, contracted to
/// FMAs).
pub fn dot_f32(x: &[f32], y: &[f32]) -> f32 {
    let (mut sum, np) = dot_steps(x, y);
    for i in np..x.len() {
        sum = x[i].mul_add(y[i], sum);
    }
    sum
}

/// `ggml_vec_dot_f16` on the values of two F16 rows (given widened to
/// `f32`, which is exact): [`dot_f32`]'s steps, the leftovers summed in
/// `f64` as products rounded to `f32`.
pub fn dot_f16(x: &[f32], y: &[f32]) -> f32 {
    let (sum, np) = dot_steps(x, y);
    let mut sum = f64::from(sum);
    for i in np..x.len() {
        sum += f64::from(x[i] * y[i]);
    }
    sum as f32
}

/// `ggml_vec_dot_bf16` (AVX2) on the values of two BF16 rows (widened to
/// `f32`): four accumulators of 8 lanes with FMA over whole 32s, reduced
/// as `(c1 + c3) + (c2 + c4)` then [`reduce_movehl`]; leftovers in `f64`.
pub fn dot_bf16(x: &[f32], y: &[f32]) -> f32 {
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
    let v: [f32; LANES] =
        std::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]));
    let mut sum = f64::from(reduce_movehl(v));
    for i in np..x.len() {
        sum += f64::from(x[i] * y[i]);
    }
    sum as f32
}

/// How many tokens the ubatch holds, which picks ggml's matmul path for
/// float weights: one token goes through `vec_dot` (4 accumulators of 8
/// lanes), several through llamafile's `tinyBLAS` (one 8-lane accumulator
/// per output, `llamafile/sgemm.cpp`) when the weight has a multiple of 4
/// rows of a multiple of 8 elements. Quantized weights give the same sums
/// either way (`tinyBLAS_Q0_AVX` and the repacked Q4_0 gemm sum as the
/// single-token kernels do).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ubatch {
    /// A single token.
    One,
    /// Two tokens or more in one ubatch (a batched prefill).
    Many,
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
fn tinyblas_takes(ubatch: Ubatch, m: usize, k: usize) -> bool {
    ubatch == Ubatch::Many && m.is_multiple_of(4) && k.is_multiple_of(LANES)
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

/// The weight types [`matvec`] reproduces.
pub fn is_emulated(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::Q8_0 | GgmlType::Q4_0
    )
}

/// A Q8_0 or Q4_0 weight row's blocks: `(d, 32 signed codes)` each.
fn weight_blocks(ty: GgmlType, row: &[u8]) -> impl Iterator<Item = (f32, [i8; 32])> + '_ {
    let size = if ty == GgmlType::Q8_0 { 34 } else { 18 };
    row.chunks_exact(size).map(move |b| {
        let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
        let mut q = [0i8; 32];
        if ty == GgmlType::Q8_0 {
            for (q, &c) in q.iter_mut().zip(&b[2..]) {
                *q = c as i8;
            }
        } else {
            for (j, &c) in b[2..].iter().enumerate() {
                q[j] = (c & 0x0f) as i8 - 8;
                q[j + 16] = (c >> 4) as i8 - 8;
            }
        }
        (d, q)
    })
}

/// `ggml_vec_dot_q8_0_q8_0` / `ggml_vec_dot_q4_0_q8_0` (AVX2): per block,
/// lane `l` holds the integer sum of codes `4l..4l + 4`, and
/// `acc_l = fma(d_w · d_x, sum_l, acc_l)`; then [`reduce_movehl`].
fn dot_q_lanes(ty: GgmlType, row: &[u8], xq: &[(f32, [i8; 32])]) -> f32 {
    let mut acc = [0f32; LANES];
    for ((dw, qw), (dx, qx)) in weight_blocks(ty, row).zip(xq) {
        let d = dw * dx;
        for (l, a) in acc.iter_mut().enumerate() {
            let s: i32 = (4 * l..4 * l + 4)
                .map(|i| i32::from(qw[i]) * i32::from(qx[i]))
                .sum();
            *a = d.mul_add(s as f32, *a);
        }
    }
    reduce_movehl(acc)
}

/// `ggml_gemv_q4_0_8x8_q8_0` (AVX2, the layout ggml repacks a Q4_0 weight
/// of a multiple of 8 rows into): one accumulator per row,
/// `acc = fma(sum_b, d_w · d_x, acc)` block after block, with `sum_b` the
/// block's whole integer dot.
fn dot_q4_0_repacked(row: &[u8], xq: &[(f32, [i8; 32])]) -> f32 {
    let mut acc = 0f32;
    for ((dw, qw), (dx, qx)) in weight_blocks(GgmlType::Q4_0, row).zip(xq) {
        let s: i32 = qw
            .iter()
            .zip(qx)
            .map(|(&w, &x)| i32::from(w) * i32::from(x))
            .sum();
        acc = (s as f32).mul_add(dw * dx, acc);
    }
    acc
}

/// `W · x` for one token as ggml's CPU `mul_mat` computes it: `weight`
/// holds `rows` rows of `ne0` elements of `ty` (row-major, GGUF order),
/// `tensor_rows` is the weight's whole `ne[1]` (ggml repacks a Q4_0
/// weight whose `ne[1]` is a multiple of 8, which changes the order of
/// its sums; llamafile takes a multiple of 4), `ubatch` the tokens
/// computed together (see [`Ubatch`]). `x` is converted to `ty`'s `vec_dot_type` first (F16, BF16,
/// Q8_0), as ggml does.
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
    check_len("ggml matvec weight bytes", rb * rows, weight.len())?;
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
            let xq: Vec<(f32, [i8; 32])> = x.chunks_exact(32).map(quantize_q8_0_block).collect();
            let repacked = ty == GgmlType::Q4_0 && tensor_rows.is_multiple_of(8);
            for (bytes, o) in weight.chunks_exact(rb).zip(out.iter_mut()) {
                *o = if repacked {
                    dot_q4_0_repacked(bytes, &xq)
                } else {
                    dot_q_lanes(ty, bytes, &xq)
                };
            }
        }
    }
    Ok(())
}

/// `ggml_v_expf` (AVX2 + FMA) on one lane: ggml's vectorised `exp`
/// (within 1.5 ulp of `exp`, not correctly rounded), used by its softmax
/// and SiLU.
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
pub fn rope(x: &mut [f32], head_dim: usize, position: usize, n_rot: usize, freq_base: f32) -> Result<(), OpsError> {
    if head_dim == 0 || !x.len().is_multiple_of(head_dim) || n_rot % 2 != 0 || n_rot > head_dim {
        return Err(OpsError::Invalid(format!(
            "rope: {} values in heads of {head_dim}, n_rot {n_rot}",
            x.len()
        )));
    }
    let theta_scale = freq_base.powf(-2.0 / n_rot as f32);
    let mut theta = position as f32;
    let mut cache = Vec::with_capacity(n_rot / 2);
    for _ in 0..n_rot / 2 {
        cache.push((theta.cos(), theta.sin()));
        theta *= theta_scale;
    }
    for head in x.chunks_exact_mut(head_dim) {
        for (i, &(cos, sin)) in cache.iter().enumerate() {
            let (x0, x1) = (head[2 * i], head[2 * i + 1]);
            head[2 * i] = x0.mul_add(cos, -(x1 * sin));
            head[2 * i + 1] = x0.mul_add(sin, x1 * cos);
        }
    }
    Ok(())
}

/// llama.cpp's attention for one query without flash attention over an
/// F32 K/V cache, as ggml's CPU backend computes it: `kq = mul_mat(k, q)`
/// ([`dot_f32`] per cache cell), `soft_max_ext(kq · scale)` ([`expf`] 8
/// cells at a time, each 8 summed in `f32` then added in `f64`, the
/// reciprocal rounded to `f32` and multiplied in), `kqv = mul_mat(v, kq)`
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
    if n_head == 0 || n_head_kv == 0 || dk == 0 || dv == 0 || !n_head.is_multiple_of(n_head_kv) {
        return Err(OpsError::Invalid(format!(
            "attention: {n_head} query heads over {n_head_kv} K/V heads of {dk}/{dv}"
        )));
    }
    let (k_cell, v_cell) = (n_head_kv * dk, n_head_kv * dv);
    if !k.len().is_multiple_of(k_cell) {
        return Err(OpsError::Invalid(format!(
            "attention: {} key values are not whole cells of {k_cell}",
            k.len()
        )));
    }
    let n = k.len() / k_cell;
    check_len("attention q", n_head * dk, q.len())?;
    check_len("attention v", n * v_cell, v.len())?;
    check_len("attention out", n_head * dv, out.len())?;
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
        let mut max = f32::NEG_INFINITY;
        p.fill(f32::NEG_INFINITY);
        for j in 0..n {
            let s = dot_f32(&k[j * k_cell + g * dk..][..dk], qh) * scale;
            p[at + j] = s;
            max = max.max(s);
        }
        let mut sum = 0f64;
        for chunk in p.chunks_exact_mut(LANES) {
            let mut vals = [0f32; LANES];
            for (val, x) in vals.iter_mut().zip(chunk.iter_mut()) {
                *val = expf(*x - max);
                *x = *val;
            }
            sum += f64::from(reduce_movehl(vals));
        }
        let inv = (1.0 / sum) as f32;
        p.iter_mut().for_each(|x| *x *= inv);
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
