//! IMROPE (spec section 7), as `rope_imrope` in qwen4exp_ref.py: NEOX
//! pairing `(i, i + n_rot/2)` on the first `n_rot` dims of each head; each
//! pair's position is picked from `(t, h, w, e)` by its section.

/// Rotates every head of `x` (heads of `head_dim`, contiguous) in place at
/// positions `pos4 = (t, h, w, e)`.
pub(crate) fn imrope(
    x: &mut [f64],
    head_dim: usize,
    pos4: [f64; 4],
    n_rot: usize,
    base: f64,
    sections: [usize; 4],
) {
    let half = n_rot / 2;
    let [s0, s1, s2, _] = sections;
    let sect: usize = sections.iter().sum();
    let cs: Vec<(f64, f64)> = (0..half)
        .map(|i| {
            // numpy's `i % 0` is 0.
            let sector = if sect == 0 { 0 } else { i % sect };
            // Exclusive by sector % 3; "otherwise" is e.
            let which = if sector % 3 == 1 && sector < 3 * s1 {
                1
            } else if sector % 3 == 2 && sector < 3 * s2 {
                2
            } else if sector % 3 == 0 && sector < 3 * s0 {
                0
            } else {
                3
            };
            let theta = pos4[which] * base.powf(-2.0 * i as f64 / n_rot as f64);
            (theta.cos(), theta.sin())
        })
        .collect();
    for head in x.chunks_exact_mut(head_dim) {
        for (i, &(c, s)) in cs.iter().enumerate() {
            let x0 = head[i];
            let x1 = head[i + half];
            head[i] = x0 * c - x1 * s;
            head[i + half] = x0 * s + x1 * c;
        }
    }
}

/// The positions of a text token at `p`: `(p, p, p, 0)`.
pub(crate) fn text_pos(p: usize) -> [f64; 4] {
    let p = p as f64;
    [p, p, p, 0.0]
}
