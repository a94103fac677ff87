//! The activations ggml's CPU matmul multiplies a weight by.
//!
//! Before a dot product with a weight of type `ty`, ggml converts the `f32`
//! activations to the weight's `vec_dot_type` (`ggml-cpu.c`
//! `type_traits_cpu`): F16 for F16, BF16 for BF16, Q8_0 (or Q8_1, the same
//! quants) for the 32-element quants, Q8_K for the K-, IQ- and TQ-quants.
//! A reimplementation that must match llama.cpp closely on non-F32 weights
//! multiplies the activations [`as_ggml_multiplies`] returns instead of the
//! exact ones; on F32 weights they are the same.

use seam::gguf::GgmlType;

use crate::OpsError;

/// Q8_0 of one block ([`crate::ggml_cpu::quantize_q8_0_block`]),
/// dequantized.
fn q8_0_block(x: &mut [f32]) {
    let (d, q) = crate::ggml_cpu::quantize_q8_0_block(x);
    for (v, q) in x.iter_mut().zip(q) {
        *v = f32::from(q) * d;
    }
}

/// Q8_K of one block (`quantize_row_q8_K_ref`: `iscale = -127/max` of the
/// largest magnitude with its sign, `q = min(127, nearest(iscale · x))`,
/// `d = 1/iscale` in f32), dequantized.
fn q8_k_block(x: &mut [f32]) {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x.iter() {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        x.fill(0.0);
        return;
    }
    let iscale = -127.0 / max;
    let d = 1.0 / iscale;
    for v in x {
        *v = (iscale * *v).round_ties_even().min(127.0) * d;
    }
}

/// The activations ggml's CPU matmul multiplies a weight of type `ty` by,
/// for the activations `x` (one row of `ty`'s `ne0`).
///
/// # Errors
///
/// `x` is not a whole number of the activation format's blocks, or `ty` is
/// not a weight type.
pub fn as_ggml_multiplies(ty: GgmlType, x: &[f32]) -> Result<Vec<f32>, OpsError> {
    use GgmlType::*;
    let mut out = x.to_vec();
    let block = match ty {
        F32 => return Ok(out),
        F16 => {
            out.iter_mut()
                .for_each(|v| *v = half::f16::from_f32(*v).to_f32());
            return Ok(out);
        }
        BF16 => {
            out.iter_mut()
                .for_each(|v| *v = half::bf16::from_f32(*v).to_f32());
            return Ok(out);
        }
        Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | IQ4_NL | MXFP4 | NVFP4 | Q1_0 | Q2_0 => 32,
        Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | IQ2_XXS | IQ2_XS | IQ3_XXS | IQ1_S | IQ3_S | IQ2_S
        | IQ4_XS | IQ1_M | TQ1_0 | TQ2_0 => 256,
        other => return Err(OpsError::Unsupported(other)),
    };
    if !x.len().is_multiple_of(block) {
        return Err(OpsError::Invalid(format!(
            "{} activations are not whole {block}-element blocks of {ty}'s activation format",
            x.len()
        )));
    }
    for b in out.chunks_exact_mut(block) {
        if block == 32 {
            q8_0_block(b)
        } else {
            q8_k_block(b)
        }
    }
    Ok(out)
}

/// [`as_ggml_multiplies`] for a forward pass that keeps its activations in
/// `f64`: rounded to `f32` (ggml's activations are `f32`), then to `ty`'s
/// activation format; a length that is not whole blocks of that format
/// (or a type without one) stays `f32`.
pub fn as_ggml_multiplies_f64(ty: GgmlType, x: &[f64]) -> Vec<f64> {
    let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
    as_ggml_multiplies(ty, &x32)
        .unwrap_or(x32)
        .into_iter()
        .map(f64::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f64_activations_round_to_f32_then_to_the_format_or_stay_f32() {
        let third = 1.0 / 3.0;
        let f16 = f64::from(half::f16::from_f32(third as f32).to_f32());
        assert_eq!(as_ggml_multiplies_f64(GgmlType::F16, &[third]), [f16]);
        // One value is not a whole Q8_0 block: f32, not quantized.
        let one = as_ggml_multiplies_f64(GgmlType::Q8_0, &[third]);
        assert_eq!(one, [f64::from(third as f32)]);
        let mut block = vec![0.0; 32];
        block[0] = 1.0;
        block[1] = third;
        let q = as_ggml_multiplies_f64(GgmlType::Q8_0, &block);
        assert_ne!(q[1], f64::from(third as f32));
    }

    #[test]
    fn each_weight_type_rounds_as_its_activation_format() {
        let x: Vec<f32> = (0..256)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        assert_eq!(as_ggml_multiplies(GgmlType::F32, &x).unwrap(), x);
        let h = as_ggml_multiplies(GgmlType::F16, &x).unwrap();
        assert!(
            h.iter()
                .zip(&x)
                .all(|(a, b)| (a - b).abs() <= b.abs() * 1e-3)
        );
        assert!(h.iter().zip(&x).any(|(a, b)| a != b));
        // Q8_0: 32-element blocks, the block's largest magnitude exact up
        // to the f16 scale, every value a multiple of the scale.
        let q = as_ggml_multiplies(GgmlType::Q4_0, &x).unwrap();
        let amax = x[..32].iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = half::f16::from_f32(amax / 127.0).to_f32();
        assert!(
            q[..32]
                .iter()
                .all(|v| (v / d - (v / d).round()).abs() < 1e-3)
        );
        assert!(q[..32].iter().zip(&x).all(|(a, b)| (a - b).abs() <= d));
        // Q8_K: one 256-element block, the largest magnitude maps to -127.
        let k = as_ggml_multiplies(GgmlType::Q4_K, &x).unwrap();
        let (i, _) =
            x.iter().enumerate().fold(
                (0, 0f32),
                |m, (i, v)| if v.abs() > m.1 { (i, v.abs()) } else { m },
            );
        assert!((k[i] - x[i]).abs() <= x[i].abs() * 1e-6);
        assert!(matches!(
            as_ggml_multiplies(GgmlType::Q8_0, &x[..31]),
            Err(OpsError::Invalid(_))
        ));
        assert!(matches!(
            as_ggml_multiplies(GgmlType::I32, &x),
            Err(OpsError::Unsupported(_))
        ));
    }
}
