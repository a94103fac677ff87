//! ggml's `norm` (LayerNorm without its weight and bias, which llama.cpp
//! applies as `mul` and `add` after it): `ggml_compute_forward_norm_f32`.

/// `ggml_norm` of one row in place: the mean from `ggml_vec_sum_f32` (an
/// `f64` sum rounded to `f32`, then divided by the length in `f32`), the
/// variance from `ggml_vec_cvar_f32` (AVX2: each 8 of `(x - mean)²`
/// summed as `hsum_float_8` and added in `f64`, the rest one at a time in
/// `f64`, divided by the length in `f64`), then `x - mean` times
/// `1 / sqrt(variance + eps)` in `f32`. An empty row is left as is.
pub fn norm(x: &mut [f32], eps: f32) {
    let n = x.len();
    if n == 0 {
        return;
    }
    let sum = x.iter().map(|&v| f64::from(v)).sum::<f64>() as f32;
    let mean = sum / n as f32;
    let mut acc = 0f64;
    let whole = n & !(super::LANES - 1);
    for chunk in x[..whole].chunks_exact_mut(super::LANES) {
        let mut sq = [0f32; super::LANES];
        for (s, v) in sq.iter_mut().zip(chunk.iter_mut()) {
            *v -= mean;
            *s = *v * *v;
        }
        acc += f64::from(super::reduce_movehl(sq));
    }
    for v in &mut x[whole..] {
        *v -= mean;
        acc += f64::from(*v * *v);
    }
    let variance = (acc / n as f64) as f32;
    let scale = 1.0 / (variance + eps).sqrt();
    x.iter_mut().for_each(|v| *v *= scale);
}

#[cfg(test)]
mod tests {
    use super::super::refs::{fnv, row};
    use super::norm;

    #[test]
    fn norm_is_ggmls_with_and_without_eps() {
        // row(77, 31, 4) + 1.5: nine whole 8s and 5 more.
        let x: Vec<f32> = row(77, 31, 4.0).iter().map(|v| v + 1.5).collect();
        for (eps, want, first) in [
            (0.0, 0xac02_c786_5ee1_dd4e_u64, 0xbf65_640d_u32),
            (1e-5, 0x06bd_cb2c_1c7b_33ba, 0xbf65_6400),
        ] {
            let mut y = x.clone();
            norm(&mut y, eps);
            assert_eq!(y[0].to_bits(), first, "eps {eps}");
            assert_eq!(fnv(&y), want, "eps {eps}");
        }
        let mut empty: [f32; 0] = [];
        norm(&mut empty, 0.0);
    }
}
