//! ggml's element-wise ops and row sums as its CPU backend computes them
//! (`ggml-cpu/unary-ops.cpp`, `vec.cpp`, `vec.h`).

use super::{LANES, silu};

/// `ggml_vec_silu_f32` over one row: whole 8s through `ggml_v_silu`
/// ([`silu`]), the rest with libm's `expf` (`x / (1 + expf(-x))`). ggml's
/// unary `silu` runs it on each row of `ne0`, so where a row ends decides
/// which elements are leftovers.
pub fn silu_row(x: &mut [f32]) {
    let whole = x.len() & !(LANES - 1);
    for (i, v) in x.iter_mut().enumerate() {
        *v = if i < whole {
            silu(*v)
        } else {
            *v / (1.0 + (-*v).exp())
        };
    }
}

/// ggml's unary `softplus`: `x` above 20, else `logf(1 + expf(x))`.
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { (1.0 + x.exp()).ln() }
}

/// A final logit softcap `c` as llama.cpp's graph builds it (Gemma 2's
/// `ggml_scale(1/c)`, `ggml_tanh`, `ggml_scale(c)`): `tanhf(x · (1/c)) · c`,
/// each step rounded to `f32`.
pub fn softcap(x: f32, c: f32) -> f32 {
    (x * (1.0 / c)).tanh() * c
}

/// `ggml_vec_sum_f32` (the `sum_rows` of one row): the values added in
/// `f64`, rounded once.
pub fn sum(x: &[f32]) -> f32 {
    x.iter().map(|&v| f64::from(v)).sum::<f64>() as f32
}

#[cfg(test)]
mod tests {
    //! Bits from `tools/oracle/ggml_hybrid_refs.c`.

    use super::super::refs::{fnv, row};
    use super::*;

    #[test]
    fn silu_rows_take_libm_past_the_last_whole_8() {
        let mut x = row(40, 6, 9.0);
        for r in x.chunks_exact_mut(20) {
            silu_row(r);
        }
        assert_eq!(fnv(&x), 0x0c7e_b2ac_0c40_9eba);
        // One row of 40 would run elements 16..20 through ggml_v_silu.
        let mut one = row(40, 6, 9.0);
        silu_row(&mut one);
        assert_ne!(fnv(&one), fnv(&x));
    }

    #[test]
    fn softplus_is_ggmls_across_its_cut() {
        let want: [u32; 16] = [
            0x33ff_ffff,
            0x41c6_7a0c,
            0x40d8_0577,
            0x41cc_f37b,
            0,
            0x41aa_c6ae,
            0x397a_185d,
            0,
            0,
            0x41e8_4a2d,
            0x41e2_f248,
            0x4001_2240,
            0x3d5d_da63,
            0x403b_3b3f,
            0x40c9_ba45,
            0x4185_290a,
        ];
        let got: Vec<u32> = row(16, 7, 30.0)
            .into_iter()
            .map(|v| softplus(v).to_bits())
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn row_sums_add_in_f64() {
        let x = row(600, 8, 5.0);
        let got: Vec<u32> = x.chunks_exact(300).map(|r| sum(r).to_bits()).collect();
        assert_eq!(got, [0xc046_a1be, 0x414b_adae]);
        let f32_sum = x[..300].iter().sum::<f32>();
        assert_ne!(f32_sum.to_bits(), 0xc046_a1be);
    }

    #[test]
    fn rms_norm_times_a_weight_is_ggmls() {
        // ggml's rms_norm fused with its mul (crate::rms_norm).
        let mut x = row(512, 1, 3.0);
        let w = row(256, 2, 1.5);
        for r in x.chunks_exact_mut(256) {
            crate::rms_norm_in_place(r, 1e-6, crate::NormWeight::Scale(&w)).unwrap();
        }
        assert_eq!(fnv(&x), 0xdd7f_663d_058b_5404);
    }
}

/// `ggml_swiglu_clamp` (DeepSeek-V4's clamped SwiGLU) element-wise:
/// `gate = min(g, limit)`, `up = clamp(u, -limit, limit)`, then `gate / (1
/// + expf(-gate)) · up` (libm `expf`).
///
/// # Errors
///
/// The three lengths differ.
pub fn swiglu_clamp(
    gate: &[f32],
    up: &[f32],
    limit: f32,
    out: &mut [f32],
) -> Result<(), crate::OpsError> {
    crate::check_len("swiglu_clamp up", gate.len(), up.len())?;
    crate::check_len("swiglu_clamp out", gate.len(), out.len())?;
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        let g = g.min(limit);
        let u = u.clamp(-limit, limit);
        *o = g / (1.0 + (-g).exp()) * u;
    }
    Ok(())
}

#[cfg(test)]
mod clamp_tests {
    //! Hashes from `tools/oracle/ggml_kernel_refs.c`'s `hyper_mix_ops`.

    use super::super::refs::{fnv, row};
    use super::*;

    #[test]
    fn swiglu_clamp_is_ggmls() {
        let (g, u) = (row(40, 54, 4.0), row(40, 55, 4.0));
        let mut out = vec![0f32; 40];
        swiglu_clamp(&g, &u, 1.5, &mut out).unwrap();
        assert_eq!(out[0].to_bits(), 0x3eba_ef13);
        assert_eq!(fnv(&out), 0xd8c7_2329_0b6e_f8bc);
        assert!(out.iter().all(|v| v.abs() <= 1.5 * 1.5));
        assert!(swiglu_clamp(&g, &u[1..], 1.5, &mut out).is_err());
    }
}
