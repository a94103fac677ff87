//! What the tests of ggml's kernels feed them and how they compare: the
//! inputs `tools/oracle/ggml_kernel_refs.c` makes in C (the same `f32`
//! steps) and a hash of a whole output's bits.

/// `row(n, seed, scale)`: `n` values in about `[-scale, scale]` from an
/// LCG (the C file's `row`).
pub(crate) fn row(n: usize, seed: u32, scale: f32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            ((s >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// FNV-1a of the values' bits, little-endian: one number for a whole
/// output the C file printed (the reference hashes are of its lines).
pub(crate) fn fnv(v: &[f32]) -> u64 {
    v.iter()
        .flat_map(|x| x.to_bits().to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
}
