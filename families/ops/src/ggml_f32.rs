//! ggml's CPU `f32` kernels, bit for bit, as an x86-64 AVX2+FMA build of
//! llama.cpp (llama-cpp-python 0.3.36's vendored ggml) runs them.
//!
//! Where a computation is ill-conditioned (a softmax over attention scores
//! of several hundred, a dot product whose terms cancel), the rounding
//! order of `f32` arithmetic decides the last bits, and a value that later
//! rounds to F16 or Q8_0 can round the other way. A family that must match
//! llama.cpp there computes those steps with these functions instead of in
//! `f64`:
//!
//! - [`vec_dot_f32`]: `ggml_vec_dot_f32` (`ggml-cpu/vec.cpp`), the kernel of
//!   every one-token `mul_mat` of F32 by F32 (`llamafile_sgemm` takes only
//!   two or more columns);
//! - [`vec_dot_bf16`]: `ggml_vec_dot_bf16`, the kernel of a one-token
//!   `mul_mat` of a BF16 weight (the activations rounded to BF16 first);
//! - [`expf_avx2`]: `ggml_v_expf` (`ggml-cpu/vec.h`), one lane;
//! - [`soft_max_f32`]: one row of `ggml_compute_forward_soft_max_f32`
//!   (`ggml-cpu/ops.cpp`) with a scale and an additive mask, no ALiBi, no
//!   sinks.

/// `ggml_vec_dot_f32` with AVX2 and FMA: four accumulators of eight lanes
/// take 32 elements per step by fused multiply-add; they are added pairwise
/// (0+2, 1+3, then 0+1), the eight lanes folded as
/// `(l0+l4 + l1+l5) + (l2+l6 + l3+l7)`; the elements after the last whole
/// step are then added one at a time (`sum += x*y`), as the compiler
/// vectorized that loop: products rounded first, except the last 0-3 (after
/// runs of 8 and one of 4), which are fused.
///
/// Only `min(x.len(), y.len())` elements are used.
pub fn vec_dot_f32(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    let whole = n & !31;
    let mut acc = [[0f32; 8]; 4];
    for i in (0..whole).step_by(32) {
        for (j, lanes) in acc.iter_mut().enumerate() {
            for (l, a) in lanes.iter_mut().enumerate() {
                let k = i + 8 * j + l;
                *a = x[k].mul_add(y[k], *a);
            }
        }
    }
    let [a0, a1, a2, a3] = acc;
    let add = |a: [f32; 8], b: [f32; 8]| -> [f32; 8] { std::array::from_fn(|l| a[l] + b[l]) };
    let s = add(add(a0, a2), add(a1, a3));
    let t: [f32; 4] = std::array::from_fn(|l| s[l] + s[l + 4]);
    let mut sum = (t[0] + t[1]) + (t[2] + t[3]);
    // The scalar tail as GCC compiled it in the oracle's libggml-cpu.so: in
    // runs of 8, then one of 4, products rounded then added in order; the
    // last 0-3 by fused multiply-add (`vfmadd231ss`).
    let left = n - whole;
    let unfused = (left & !7) + if left & 7 >= 4 { 4 } else { 0 };
    for k in whole..whole + unfused {
        let p = x[k] * y[k];
        sum += p;
    }
    for k in whole + unfused..n {
        sum = x[k].mul_add(y[k], sum);
    }
    sum
}

/// `ggml_vec_dot_bf16` with AVX2 (as compiled in the oracle's
/// libggml-cpu.so, where `add(mul(x, y), c)` became a fused multiply-add):
/// the BF16 values widened to `f32`, four accumulators of eight lanes take
/// 32 elements per step by fused multiply-add, are added as `(c1+c3) +
/// (c2+c4)`, the lanes folded as `((l0+l4) + (l2+l6)) + ((l1+l5) +
/// (l3+l7))` into an `f64` sum, the elements after the last whole step
/// added to it one at a time (`f32` products), the result rounded to `f32`.
///
/// `x` and `y` are the BF16 values already widened to `f32` (exact); only
/// `min(x.len(), y.len())` elements are used.
pub fn vec_dot_bf16(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    let whole = n & !31;
    let mut acc = [[0f32; 8]; 4];
    for i in (0..whole).step_by(32) {
        for (j, lanes) in acc.iter_mut().enumerate() {
            for (l, a) in lanes.iter_mut().enumerate() {
                let k = i + 8 * j + l;
                *a = x[k].mul_add(y[k], *a);
            }
        }
    }
    let [c1, c2, c3, c4] = acc;
    let add = |a: [f32; 8], b: [f32; 8]| -> [f32; 8] { std::array::from_fn(|l| a[l] + b[l]) };
    let c = add(add(c1, c3), add(c2, c4));
    let g: [f32; 4] = std::array::from_fn(|l| c[l + 4] + c[l]);
    let mut sum = f64::from((g[0] + g[2]) + (g[1] + g[3]));
    for k in whole..n {
        sum += f64::from(x[k] * y[k]);
    }
    sum as f32
}

/// `ggml_v_expf` (AVX2+FMA) for one lane: ggml's vectorized `exp`, within
/// 1.5 ulp of `e^x` but not always the correctly rounded value (glibc's
/// `expf`, which ggml uses for the elements after the last whole vector).
pub fn expf_avx2(x: f32) -> f32 {
    let bits = f32::to_bits;
    let from = f32::from_bits;
    let r = from(0x4B40_0000); // 0x1.8p23
    let z = x.mul_add(from(0x3FB8_AA3B), r); // 0x1.715476p+0
    let n = z - r;
    let b = (-n).mul_add(from(0x35BF_BE8E), (-n).mul_add(from(0x3F31_7200), x));
    let e = bits(z) << 23;
    let k = from(e.wrapping_add(bits(1.0)));
    let u = b * b;
    let j = from(0x3C07_2010)
        .mul_add(b, from(0x3D2B_9F17))
        .mul_add(u, from(0x3E2A_AF33).mul_add(b, from(0x3EFF_FEDB)))
        .mul_add(u, from(0x3F7F_FFF6) * b);
    // `_CMP_GT_OQ`: a NaN is not greater, so it takes this branch too.
    if n.is_nan() || n.abs() <= 126.0 {
        return j.mul_add(k, k);
    }
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = from(g.wrapping_add(0x7F00_0000));
    if n.abs() > 192.0 {
        return s1 * s1;
    }
    let s2 = from(e.wrapping_sub(g));
    s2.mul_add(j, s2) * s1
}

/// One row of `ggml_compute_forward_soft_max_f32` with AVX2+FMA: `w =
/// x·scale + mask` in `f32`, `m = max(w)`, `e = exp(w − m)` by
/// [`expf_avx2`] eight at a time (each eight summed in `f32` as
/// `((e0+e4) + (e2+e6)) + ((e1+e5) + (e3+e7))`) and by `f32::exp` (glibc's
/// `expf`) for the rest, the sums gathered in `f64`, then every `e`
/// multiplied by `(1/Σ)` rounded to `f32`.
///
/// `mask` is added element by element (`0` keeps, `-inf` drops); it must be
/// as long as `x`. A row that is all `-inf` yields NaN, as ggml's does.
pub fn soft_max_f32(x: &[f32], scale: f32, mask: &[f32]) -> Vec<f32> {
    let w: Vec<f32> = x.iter().zip(mask).map(|(&v, &m)| v * scale + m).collect();
    let max = w.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut y = vec![0f32; w.len()];
    let mut sum = 0f64;
    let whole = w.len() & !7;
    for (ys, ws) in y[..whole].chunks_exact_mut(8).zip(w.chunks_exact(8)) {
        for (y, &w) in ys.iter_mut().zip(ws) {
            *y = expf_avx2(w - max);
        }
        let h: [f32; 4] = std::array::from_fn(|l| ys[l + 4] + ys[l]);
        sum += f64::from((h[0] + h[2]) + (h[1] + h[3]));
    }
    for (y, &w) in y[whole..].iter_mut().zip(&w[whole..]) {
        *y = (w - max).exp();
        sum += f64::from(*y);
    }
    let inv = (1.0 / sum) as f32;
    y.iter_mut().for_each(|v| *v *= inv);
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic row of `n` values in about [-scale, scale].
    fn row(n: usize, seed: u32, scale: f32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                ((s >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    }

    fn naive_f32(x: &[f32], y: &[f32]) -> f32 {
        x.iter().zip(y).fold(0f32, |s, (a, b)| s + a * b)
    }

    fn f64_dot(x: &[f32], y: &[f32]) -> f32 {
        x.iter()
            .zip(y)
            .map(|(&a, &b)| f64::from(a) * f64::from(b))
            .sum::<f64>() as f32
    }

    // Expected bits: ggml_vec_dot_f32 / ggml_vec_dot_bf16 /
    // ggml_vec_soft_max_f32 of libggml-cpu.so (llama-cpp-python 0.3.36,
    // GGML_NATIVE on an AVX2+FMA machine) called on these same rows by
    // tools/oracle/ggml_f32_vectors.c.
    #[test]
    fn vec_dot_f32_is_ggml_avx2_bit_for_bit() {
        for (n, seed, want) in [
            (512usize, 1u32, 0xC35E_8D44u32),
            (192, 2, 0x43F5_FDB7),
            (11, 3, 0xBFFF_2711),
            (77, 4, 0xC2FA_8EE5),
        ] {
            let x = row(n, seed, 30.0);
            let y = row(n, seed + 100, 3.0);
            let got = vec_dot_f32(&x, &y);
            assert_eq!(got.to_bits(), want, "n {n}: {got:e}");
        }
    }

    #[test]
    fn vec_dot_bf16_is_ggml_avx2_bit_for_bit() {
        let bf = |v: Vec<f32>| -> Vec<f32> {
            v.into_iter()
                .map(|v| half::bf16::from_f32(v).to_f32())
                .collect()
        };
        let mut differs = false;
        for (n, seed, want) in [
            (512usize, 5u32, 0xC381_E54Cu32),
            (77, 6, 0xC2E1_7E34),
            (512, 14, 0xC3E3_92CC),
        ] {
            let x = bf(row(n, seed, 30.0));
            let y = bf(row(n, seed + 100, 3.0));
            let got = vec_dot_bf16(&x, &y);
            assert_eq!(got.to_bits(), want, "n {n}: {got:e}");
            differs |= got != naive_f32(&x, &y) && got != f64_dot(&x, &y);
        }
        assert!(
            differs,
            "the rows do not tell ggml's order from a plain sum"
        );
    }

    #[test]
    fn the_emulation_is_not_the_naive_or_f64_sum() {
        let x = row(512, 1, 30.0);
        let y = row(512, 101, 3.0);
        let got = vec_dot_f32(&x, &y);
        assert_ne!(got, naive_f32(&x, &y));
        assert_ne!(got, f64_dot(&x, &y));
    }

    #[test]
    fn expf_avx2_is_ggml_v_expf_bit_for_bit() {
        // (x, ggml_v_expf(x)) through ggml_vec_soft_max_f32 with max 0;
        // where glibc's expf rounds differently, the last flag says so.
        for (x, want, glibc_differs) in [
            (0f32, 0x3F80_0000u32, false),
            (-1.0, 0x3EBC_5AB2, false),
            (-0.5, 0x3F1B_4597, true),
            (-10.3, 0x380D_1140, true),
            (-87.0, 0x00B3_3686, true),
            (-90.5, 0x0005_6969, false),
            (-100.25, 0x0000_0015, false),
            (1.7, 0x40AF_2A95, true),
        ] {
            assert_eq!(expf_avx2(x).to_bits(), want, "{x}");
            assert_eq!(x.exp().to_bits() != want, glibc_differs, "{x}");
        }
        assert_eq!(expf_avx2(f32::NEG_INFINITY), 0.0);
        assert_eq!(expf_avx2(-200.0), 0.0);
    }

    #[test]
    fn soft_max_f32_is_ggml_bit_for_bit() {
        let x = row(11, 9, 900.0);
        let mut mask = vec![0f32; 11];
        mask[5] = f32::NEG_INFINITY;
        let got = soft_max_f32(&x, 1.0 / 192f32.sqrt(), &mask);
        let want: [u32; 11] = [
            0x0000_03AB,
            0,
            0x3F7F_FFA5,
            0,
            0x0744_EE2E,
            0,
            0x0000_006E,
            0x3671_7101,
            0,
            0,
            0x35F7_2682,
        ];
        let bits: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
        assert_eq!(bits, want);
        assert_eq!(got[5], 0.0);
        // The f64 softmax rounds differently.
        let mut f64_row: Vec<f32> = x
            .iter()
            .zip(&mask)
            .map(|(&v, &m)| v * (1.0 / 192f32.sqrt()) + m)
            .collect();
        crate::softmax(&mut f64_row);
        assert_ne!(f64_row, got);
    }
}
