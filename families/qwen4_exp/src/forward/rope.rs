//! IMROPE (spec section 7), as `rope_imrope` in qwen4exp_ref.py: NEOX
//! pairing `(i, i + n_rot/2)` on the first `n_rot` dims of each head; each
//! pair's position is picked from `(t, h, w, e)` by its section.

/// Rotates every head of `x` (heads of `head_dim`, contiguous) in place at
/// positions `pos4 = (t, h, w, e)` (`family_ops::imrope`).
pub(crate) fn imrope(
    x: &mut [f64],
    head_dim: usize,
    pos4: [f64; 4],
    n_rot: usize,
    base: f64,
    sections: [usize; 4],
) {
    family_ops::imrope(x, head_dim, pos4, n_rot, base, sections)
        .expect("n_rot even and within the head and the indexer's head: checked in hparams");
}

/// The positions of a text token at `p`: `(p, p, p, 0)`.
pub(crate) fn text_pos(p: usize) -> [f64; 4] {
    let p = p as f64;
    [p, p, p, 0.0]
}
