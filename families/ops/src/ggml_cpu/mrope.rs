//! `ggml_rope_multi` as ggml's CPU backend computes it
//! (`ggml_mrope_cache_init`, `rotate_pairs`, `ops.cpp`): the pair `(i, i +
//! n_rot/2)` of each head (NEOX pairing) rotated by an angle whose position
//! is one of four (time, height, width, extra) by the pair's section.

use crate::OpsError;

/// How the pairs pick their position's section.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MultiRope {
    /// `GGML_ROPE_TYPE_MROPE`: contiguous sections.
    Sections,
    /// `GGML_ROPE_TYPE_IMROPE`: interleaved (time, height, width, ...)
    /// within the first `3 · sections[k]` sectors.
    Interleaved,
}

/// Rotates every head of `x` (heads of `head_dim`, contiguous) in place
/// at the positions `pos` (time, height, width, extra), no frequency
/// scaling: per section an `f32` running angle `θ = pos`, `θ ·=
/// base^(-2/n_rot)` (`powf`) per pair, `cosf`/`sinf`, and the rotation
/// `fma(x0, cos, -(x1·sin))`, `fma(x0, sin, x1·cos)`. Dimensions past
/// `n_rot` are left as they are.
///
/// # Errors
///
/// `x` is not whole heads, `n_rot` is odd or past the head, or the
/// sections are empty or wider than the pairs.
pub fn rope_multi(
    x: &mut [f32],
    head_dim: usize,
    n_rot: usize,
    pos: [i32; 4],
    freq_base: f32,
    sections: [usize; 4],
    mode: MultiRope,
) -> Result<(), OpsError> {
    let sect_dims: usize = sections.iter().sum();
    if head_dim == 0
        || !x.len().is_multiple_of(head_dim)
        || !n_rot.is_multiple_of(2)
        || n_rot > head_dim
        || sect_dims == 0
        || sect_dims > head_dim
    {
        return Err(OpsError::Invalid(format!(
            "rope_multi: {} values in heads of {head_dim}, n_rot {n_rot}, sections {sections:?}",
            x.len()
        )));
    }
    let theta_scale = freq_base.powf(-2.0 / n_rot as f32);
    let mut theta = pos.map(|p| p as f32);
    let sec_w = sections[0] + sections[1];
    let sec_e = sec_w + sections[2];
    let mut cache = Vec::with_capacity(n_rot / 2);
    for i in 0..n_rot / 2 {
        let sector = i % sect_dims;
        let pick = match mode {
            MultiRope::Interleaved => {
                if sector % 3 == 1 && sector < 3 * sections[1] {
                    1
                } else if sector % 3 == 2 && sector < 3 * sections[2] {
                    2
                } else if sector.is_multiple_of(3) && sector < 3 * sections[0] {
                    0
                } else {
                    3
                }
            }
            MultiRope::Sections => {
                if sector >= sections[0] && sector < sec_w {
                    1
                } else if sector >= sec_w && sector < sec_e {
                    2
                } else if sector >= sec_e {
                    3
                } else {
                    0
                }
            }
        };
        let t = theta[pick];
        cache.push((t.cos(), t.sin()));
        theta.iter_mut().for_each(|t| *t *= theta_scale);
    }
    let half = n_rot / 2;
    for head in x.chunks_exact_mut(head_dim) {
        for (i, &(cos, sin)) in cache.iter().enumerate() {
            let (x0, x1) = (head[i], head[i + half]);
            head[i] = x0.mul_add(cos, -(x1 * sin));
            head[i + half] = x0.mul_add(sin, x1 * cos);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Hashes from `tools/oracle/ggml_hybrid_refs.c`.

    use super::super::refs::{fnv, row};
    use super::*;

    #[test]
    fn imrope_is_ggmls() {
        let mut x = row(32 * 2 * 2, 19, 1.0);
        for (tok, pos) in [[29, 29, 29, 0], [5, 7, 11, 3]].into_iter().enumerate() {
            let t = &mut x[tok * 64..(tok + 1) * 64];
            rope_multi(t, 32, 32, pos, 10000.0, [8; 4], MultiRope::Interleaved).unwrap();
        }
        assert_eq!(fnv(&x), 0xf010_6b19_a7b1_634f);
        // The sections' picks matter: contiguous sections land elsewhere.
        let mut y = row(32 * 2 * 2, 19, 1.0);
        rope_multi(
            &mut y[64..],
            32,
            32,
            [5, 7, 11, 3],
            10000.0,
            [8; 4],
            MultiRope::Sections,
        )
        .unwrap();
        assert_ne!(y[64..], x[64..]);
        assert!(rope_multi(&mut y, 32, 31, [0; 4], 1e4, [8; 4], MultiRope::Sections).is_err());
    }
}
