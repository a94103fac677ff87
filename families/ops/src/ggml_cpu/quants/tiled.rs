//! ggml's tiled K-quant `mul_mat` (`ggml-cpu/tiled/tiled.cpp`,
//! `tiled-kernel.cpp`, AVX2 microkernel), which takes a Q4_K, Q5_K, Q6_K,
//! IQ4_XS or IQ2_XXS weight that is not repacked when the ubatch has 8
//! tokens or more (an expert's, when 8 of its tokens picked it). Per 256-block `b` the integer sums are exact: `s1 = Σ_s scale_s ·
//! Σ_{e in s} w_e · x_e` over the sub-blocks (`w` the signed codes: Q6_K's
//! less 32, IQ4_XS's through its code book, IQ2_XXS's grid entries with
//! their signs, its `d` times 1/8) and, for the types with a min,
//! `s2 = Σ_s min_s · Σ_{e in s} x_e`; then `res = d_w · s1`, `res =
//! fma(-dmin_w, s2, res)`, and the output `acc = fma(res, d_x, acc)` block
//! after block. The activations are `quantize_row_q8_K`'s.

use seam::gguf::GgmlType;

use super::{
    BlockQ8K, IQ2XXS_GRID, IQ4NL_VALUES, QK_K, block_of, bsums32, f16_at, grid_byte, k4_block,
    ksigns, u16_at, u32_at,
};

/// The types the tiled path takes (of those this crate reproduces).
pub(crate) fn takes(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K | GgmlType::IQ4_XS | GgmlType::IQ2_XXS
    )
}

/// One 256-block's `(d_w, dmin_w, s1, s2)` (`dmin_w`, `s2` zero without
/// a min).
fn block_sums(ty: GgmlType, b: &[u8], x: &BlockQ8K) -> (f32, f32, i32, i32) {
    let dot = |w: &dyn Fn(usize) -> i32, lo: usize, n: usize| -> i32 {
        (lo..lo + n).map(|e| w(e) * i32::from(x.qs[e])).sum()
    };
    match ty {
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let (codes, sc, mn, d, dmin) = k4_block(ty, b);
            let w = |e: usize| i32::from(codes[e]);
            let s1 = (0..8).map(|s| i32::from(sc[s]) * dot(&w, 32 * s, 32)).sum();
            let sums = bsums32(x);
            let s2 = (0..8).map(|s| i32::from(mn[s]) * sums[s]).sum();
            (d, dmin, s1, s2)
        }
        GgmlType::Q6_K => {
            let (ql, qh, scales) = (&b[..128], &b[128..192], &b[192..208]);
            let w = |e: usize| -> i32 {
                let n = e / 128;
                let low = (ql[64 * n + e % 64] >> (4 * ((e / 64) % 2))) & 0xf;
                let high = (qh[32 * n + e % 32] >> (2 * ((e / 32) % 4))) & 3;
                i32::from(low | high << 4) - 32
            };
            let s1 = (0..16)
                .map(|s| i32::from(scales[s] as i8) * dot(&w, 16 * s, 16))
                .sum();
            (f16_at(b, 208), 0.0, s1, 0)
        }
        GgmlType::IQ4_XS => {
            let (scales_h, scales_l, qs) = (u16_at(b, 2), &b[4..8], &b[8..136]);
            let w = |e: usize| -> i32 {
                let (g, j) = (e / 32, e % 32);
                let c = qs[16 * g + j % 16] >> (4 * (j / 16)) & 0xf;
                i32::from(IQ4NL_VALUES[usize::from(c)])
            };
            let s1 = (0..8)
                .map(|g| {
                    let low = (scales_l[g / 2] >> (4 * (g % 2))) & 0xf;
                    let high = ((scales_h >> (2 * g)) & 3) as u8;
                    (i32::from(low | high << 4) - 32) * dot(&w, 32 * g, 32)
                })
                .sum();
            (f16_at(b, 0), 0.0, s1, 0)
        }
        GgmlType::IQ2_XXS => {
            // Each group of 32: 4 grid bytes of 8 codes, a sign index per 8
            // codes, and the scale `2 · (aux >> 28) + 1`.
            let s1 = (0..8)
                .map(|g| {
                    let aux = u32_at(b, 6 + 8 * g);
                    let w = |e: usize| -> i32 {
                        let (l, j) = ((e % 32) / 8, e % 8);
                        let entry = IQ2XXS_GRID[usize::from(b[2 + 8 * g + l])];
                        let x = i32::from(grid_byte(entry, j));
                        if ksigns(aux >> (7 * l)) >> j & 1 != 0 {
                            -x
                        } else {
                            x
                        }
                    };
                    (2 * (aux >> 28) as i32 + 1) * dot(&w, 32 * g, 32)
                })
                .sum();
            (f16_at(b, 0) * 0.125, 0.0, s1, 0)
        }
        other => unreachable!("the tiled path does not take {other}"),
    }
}

/// `W_row · x` for one weight row of `ty` as the tiled path sums it.
pub(crate) fn dot(ty: GgmlType, row: &[u8], x: &[BlockQ8K]) -> f32 {
    debug_assert_eq!(row.len(), x.len() * ty.type_size() as usize);
    let has_min = matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K);
    let mut acc = 0f32;
    for (i, xb) in x.iter().enumerate() {
        let (d, dmin, s1, s2) = block_sums(ty, block_of(ty, row, i), xb);
        let mut res = d * s1 as f32;
        if has_min {
            res = (-dmin).mul_add(s2 as f32, res);
        }
        acc = res.mul_add(xb.d, acc);
    }
    debug_assert!(x.iter().all(|b| b.qs.len() == QK_K));
    acc
}

#[cfg(test)]
mod tests {
    //! Hashes from `tools/oracle/ggml_kernel_refs.c`'s `tiled_mm`.

    use half::f16;

    use super::super::super::refs::{fnv, row};
    use super::super::super::{Ubatch, matvec};
    use super::*;

    /// `bytes_lcg` of the C file: the LCG's top byte.
    fn bytes(n: usize, seed: u32) -> Vec<u8> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (s >> 24) as u8
            })
            .collect()
    }

    /// 12 rows of 512 of `ty`: LCG bytes with sane scales.
    fn weight(ty: GgmlType) -> Vec<u8> {
        let bs = ty.type_size() as usize;
        let mut w = bytes(12 * 2 * bs, 61);
        let d_at = if ty == GgmlType::Q6_K { 208 } else { 0 };
        for (b, blk) in w.chunks_exact_mut(bs).enumerate() {
            let d = f16::from_f32(0.01 * (1 + b % 5) as f32).to_le_bytes();
            blk[d_at..d_at + 2].copy_from_slice(&d);
            if matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K) {
                let m = f16::from_f32(0.005 * (1 + b % 3) as f32).to_le_bytes();
                blk[2..4].copy_from_slice(&m);
            }
        }
        w
    }

    #[test]
    fn eight_tokens_or_more_take_the_tiled_sums() {
        let x = row(4096, 62, 2.0);
        for (ty, want, first) in [
            (GgmlType::Q4_K, 0x480c_5ba6_c8ce_c441u64, 0xc306_109fu32),
            (GgmlType::Q5_K, 0x5cb6_5947_6255_ea46, 0x4229_c729),
            (GgmlType::Q6_K, 0x637f_069b_6e67_772f, 0xc320_4662),
            (GgmlType::IQ4_XS, 0x9a72_222e_f46c_b539, 0xc29c_c5af),
        ] {
            let w = weight(ty);
            // Rows not a multiple of 8: never repacked.
            let mut y = vec![0f32; 96];
            let mut one = vec![0f32; 96];
            for t in 0..8 {
                let xt = &x[512 * t..512 * (t + 1)];
                let mut o = [0f32; 12];
                matvec(ty, &w, 512, 12, 12, Ubatch::of(t, 8), xt, &mut o).unwrap();
                y[12 * t..12 * (t + 1)].copy_from_slice(&o);
                matvec(ty, &w, 512, 12, 12, Ubatch::of(t, 4), xt, &mut o).unwrap();
                one[12 * t..12 * (t + 1)].copy_from_slice(&o);
            }
            assert_eq!(y[0].to_bits(), first, "{ty}");
            assert_eq!(fnv(&y), want, "{ty}");
            assert_ne!(fnv(&one), want, "{ty}: fewer than 8 tokens sum by vec_dot");
        }
    }
}
