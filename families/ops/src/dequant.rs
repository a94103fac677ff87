//! Dequantization of ggml block formats to `f32`.
//!
//! Layouts are ggml's (`ggml-common.h` block structs, `ggml-quants.c`
//! `dequantize_row_*`); the oracle is gguf-py's `gguf.quants.dequantize`
//! (PyPI gguf 0.19.0), which they match bit for bit: every value is the
//! same chain of `f32` operations in the same order (no fused multiply-add,
//! which Rust never introduces on its own), so `tests/dequant.rs` compares
//! bit patterns. f16 and bf16 fields widen to `f32` exactly.
//!
//! Covered ([`SUPPORTED`]): F32, F16, BF16; Q4_0, Q4_1, Q5_0, Q5_1, Q8_0;
//! Q2_K, Q3_K, Q4_K, Q5_K, Q6_K; IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S,
//! IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS; TQ1_0, TQ2_0; MXFP4 and the fork type
//! NVFP4. Not covered (an [`OpsError::Unsupported`]): Q8_1 and Q8_K
//! (activation formats that gguf-py cannot dequantize either), the integer
//! types and F64 (not weights to dequantize), and the fork types Q1_0 and
//! Q2_0 (no oracle).

use half::{bf16, f16};
use seam::gguf::GgmlType;

use crate::grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};
use crate::{OpsError, check_len};

/// Every type [`dequantize`] accepts, in id order.
pub const SUPPORTED: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ3_XXS,
    GgmlType::IQ1_S,
    GgmlType::IQ4_NL,
    GgmlType::IQ3_S,
    GgmlType::IQ2_S,
    GgmlType::IQ4_XS,
    GgmlType::IQ1_M,
    GgmlType::BF16,
    GgmlType::TQ1_0,
    GgmlType::TQ2_0,
    GgmlType::MXFP4,
    GgmlType::NVFP4,
];

/// Whether [`dequantize`] accepts `ty`.
pub fn is_supported(ty: GgmlType) -> bool {
    SUPPORTED.contains(&ty)
}

/// Bytes of one row of `ne0` elements of `ty`, or an error when `ne0` is not
/// a whole number of blocks.
pub fn row_bytes(ty: GgmlType, ne0: usize) -> Result<usize, OpsError> {
    let not_blocks = || OpsError::RowNotWholeBlocks {
        ty,
        ne0,
        block_size: usize_of(ty.block_size()),
    };
    let bytes = ty.row_bytes(ne0 as u64).ok_or_else(not_blocks)?;
    usize::try_from(bytes).map_err(|_| not_blocks())
}

/// Dequantizes `bytes`, a whole number of `ty`'s blocks, into `out`, which
/// must hold exactly the elements those blocks encode.
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), OpsError> {
    use GgmlType as T;
    match ty {
        T::F32 => blocks(ty, bytes, out, |b: &[u8; 4], o: &mut [f32; 1]| {
            o[0] = f32::from_le_bytes(*b)
        }),
        T::F16 => blocks(ty, bytes, out, |b: &[u8; 2], o: &mut [f32; 1]| {
            o[0] = f16::from_le_bytes(*b).to_f32()
        }),
        T::BF16 => blocks(ty, bytes, out, |b: &[u8; 2], o: &mut [f32; 1]| {
            o[0] = bf16::from_le_bytes(*b).to_f32()
        }),
        T::Q4_0 => blocks(ty, bytes, out, q4_0),
        T::Q4_1 => blocks(ty, bytes, out, q4_1),
        T::Q5_0 => blocks(ty, bytes, out, q5_0),
        T::Q5_1 => blocks(ty, bytes, out, q5_1),
        T::Q8_0 => blocks(ty, bytes, out, q8_0),
        T::Q2_K => blocks(ty, bytes, out, q2_k),
        T::Q3_K => blocks(ty, bytes, out, q3_k),
        T::Q4_K => blocks(ty, bytes, out, q4_k),
        T::Q5_K => blocks(ty, bytes, out, q5_k),
        T::Q6_K => blocks(ty, bytes, out, q6_k),
        T::IQ2_XXS => blocks(ty, bytes, out, iq2_xxs),
        T::IQ2_XS => blocks(ty, bytes, out, iq2_xs),
        T::IQ2_S => blocks(ty, bytes, out, iq2_s),
        T::IQ3_XXS => blocks(ty, bytes, out, iq3_xxs),
        T::IQ3_S => blocks(ty, bytes, out, iq3_s),
        T::IQ1_S => blocks(ty, bytes, out, iq1_s),
        T::IQ1_M => blocks(ty, bytes, out, iq1_m),
        T::IQ4_NL => blocks(ty, bytes, out, iq4_nl),
        T::IQ4_XS => blocks(ty, bytes, out, iq4_xs),
        T::TQ1_0 => blocks(ty, bytes, out, tq1_0),
        T::TQ2_0 => blocks(ty, bytes, out, tq2_0),
        T::MXFP4 => blocks(ty, bytes, out, mxfp4),
        T::NVFP4 => blocks(ty, bytes, out, nvfp4),
        _ => Err(OpsError::Unsupported(ty)),
    }
}

/// Dequantizes row `row` of a row-major matrix of rows of `ne0` elements
/// (GGUF dims `[ne0, ...]`) held in `data` into `out` (`ne0` elements).
/// Only that row's bytes are read: a row gather from an embedding table.
pub fn dequantize_row(
    ty: GgmlType,
    data: &[u8],
    ne0: usize,
    row: usize,
    out: &mut [f32],
) -> Result<(), OpsError> {
    if !is_supported(ty) {
        return Err(OpsError::Unsupported(ty));
    }
    let rb = row_bytes(ty, ne0)?;
    check_len("dequantize_row output", ne0, out.len())?;
    let rows = data.len().checked_div(rb).unwrap_or(0);
    let start = row.checked_mul(rb);
    match start.and_then(|s| Some(s..s.checked_add(rb)?)) {
        Some(range) if range.end <= data.len() => dequantize(ty, &data[range], out),
        _ => Err(OpsError::RowOutOfRange { row, rows }),
    }
}

fn usize_of(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

/// Runs a block decoder over whole blocks of `B` bytes and `N` elements,
/// after checking both lengths.
fn blocks<const B: usize, const N: usize>(
    ty: GgmlType,
    bytes: &[u8],
    out: &mut [f32],
    decode: impl Fn(&[u8; B], &mut [f32; N]),
) -> Result<(), OpsError> {
    debug_assert_eq!((B as u64, N as u64), (ty.type_size(), ty.block_size()));
    let (ins, rest) = bytes.as_chunks::<B>();
    if !rest.is_empty() {
        return Err(OpsError::PartialBlock {
            ty,
            len: bytes.len(),
            type_size: B,
        });
    }
    check_len("dequantize output", ins.len() * N, out.len())?;
    let (outs, _) = out.as_chunks_mut::<N>();
    for (b, o) in ins.iter().zip(outs) {
        decode(b, o);
    }
    Ok(())
}

// --- field readers ---------------------------------------------------------

pub(crate) fn f16_at(b: &[u8], off: usize) -> f32 {
    f16::from_le_bytes([b[off], b[off + 1]]).to_f32()
}

pub(crate) fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

pub(crate) fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Byte `j` of a grid entry (its `j`-th value).
pub(crate) fn grid_byte(entry: u64, j: usize) -> u8 {
    (entry >> (8 * j)) as u8
}

/// `ksigns_iq2xs`: 7 stored sign bits plus an eighth that makes the count
/// of minus signs even.
pub(crate) fn ksigns(i: u32) -> u8 {
    let i = (i & 0x7f) as u8;
    i | (((i.count_ones() & 1) as u8) << 7)
}

/// `v`, negated when bit `j` of `signs` is set (an exact `* -1.0`).
fn signed(v: f32, signs: u8, j: usize) -> f32 {
    if signs >> j & 1 != 0 { -v } else { v }
}

/// IQ4_NL's non-linear 4-bit code book (`kvalues_iq4nl`).
pub(crate) const IQ4NL_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// E2M1 code points, doubled (`kvalues_mxfp4`); the scale carries the half.
const FP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// IQ1_S / IQ1_M grid offset.
const IQ1_DELTA: f32 = 0.125;

// --- legacy 32-element blocks ---------------------------------------------

/// `{ f16 d; u8 qs[16] }`: `d * (q - 8)`, low nibbles first.
fn q4_0(b: &[u8; 18], o: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    for (j, &q) in b[2..].iter().enumerate() {
        o[j] = d * f32::from(i16::from(q & 0xf) - 8);
        o[j + 16] = d * f32::from(i16::from(q >> 4) - 8);
    }
}

/// `{ f16 d, m; u8 qs[16] }`: `d * q + m`.
fn q4_1(b: &[u8; 20], o: &mut [f32; 32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for (j, &q) in b[4..].iter().enumerate() {
        o[j] = d * f32::from(q & 0xf) + m;
        o[j + 16] = d * f32::from(q >> 4) + m;
    }
}

/// The 5-bit codes of Q5_0/Q5_1: low nibbles plus bit `j` of `qh`.
pub(crate) fn q5_codes(qh: u32, qs: &[u8]) -> [u8; 32] {
    let mut q = [0u8; 32];
    for (j, &byte) in qs.iter().enumerate() {
        q[j] = (byte & 0xf) | (((qh >> j) & 1) as u8) << 4;
        q[j + 16] = (byte >> 4) | (((qh >> (j + 16)) & 1) as u8) << 4;
    }
    q
}

/// `{ f16 d; u32 qh; u8 qs[16] }`: `d * (q - 16)`.
fn q5_0(b: &[u8; 22], o: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    for (o, q) in o.iter_mut().zip(q5_codes(u32_at(b, 2), &b[6..])) {
        *o = d * f32::from(i16::from(q) - 16);
    }
}

/// `{ f16 d, m; u32 qh; u8 qs[16] }`: `d * q + m`.
fn q5_1(b: &[u8; 24], o: &mut [f32; 32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for (o, q) in o.iter_mut().zip(q5_codes(u32_at(b, 4), &b[8..])) {
        *o = d * f32::from(q) + m;
    }
}

/// `{ f16 d; i8 qs[32] }`: `q * d`.
fn q8_0(b: &[u8; 34], o: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    for (o, &q) in o.iter_mut().zip(&b[2..]) {
        *o = f32::from(q as i8) * d;
    }
}

// --- K-quants (256-element super-blocks) ----------------------------------

/// `{ u8 scales[16]; u8 qs[64]; f16 d, dmin }`: 16 groups of 16, each
/// `(d * sc) * q - dmin * m` with a 4-bit scale and min per group. The 2-bit
/// codes: element `128n + 32j + l` is bits `2j..2j+2` of `qs[32n + l]`.
fn q2_k(b: &[u8; 84], o: &mut [f32; 256]) {
    let (scales, qs) = (&b[..16], &b[16..80]);
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    for (i, o) in o.iter_mut().enumerate() {
        let sc = scales[i / 16];
        let (n, j, l) = (i / 128, (i / 32) % 4, i % 32);
        let q = (qs[32 * n + l] >> (2 * j)) & 3;
        let dl = d * f32::from(sc & 0xf);
        let ml = dmin * f32::from(sc >> 4);
        *o = dl * f32::from(q) - ml;
    }
}

/// `{ u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d }`: 16 groups of 16,
/// `(d * (s - 32)) * q` with 6-bit scales; the code is the 2-bit low part
/// minus 4 where the high-mask bit is clear.
fn q3_k(b: &[u8; 110], o: &mut [f32; 256]) {
    let (hmask, qs, sc) = (&b[..32], &b[32..96], &b[96..108]);
    let d = f16_at(b, 108);
    // Scale k: low nibble from byte k (k < 8) or the high nibble of byte
    // k - 8; high two bits from byte 8 + k % 4, bits 2 * (k / 4).
    let scale = |k: usize| -> f32 {
        let low = if k < 8 { sc[k] & 0xf } else { sc[k - 8] >> 4 };
        let high = (sc[8 + k % 4] >> (2 * (k / 4))) & 3;
        f32::from(((low | high << 4) as i8) - 32)
    };
    let dl: [f32; 16] = std::array::from_fn(|k| d * scale(k));
    for (i, o) in o.iter_mut().enumerate() {
        let (n, j, l) = (i / 128, (i / 32) % 4, i % 32);
        let low = ((qs[32 * n + l] >> (2 * j)) & 3) as i8;
        let high_clear = (hmask[l] >> (i / 32)) & 1 == 0;
        let q = low - if high_clear { 4 } else { 0 };
        *o = dl[i / 16] * f32::from(q);
    }
}

/// The 6-bit scales and mins of Q4_K/Q5_K, 8 of each packed in 12 bytes
/// (ggml's `get_scale_min_k4`).
pub(crate) fn k4_scales_mins(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for j in 0..4 {
        sc[j] = s[j] & 0x3f;
        mn[j] = s[j + 4] & 0x3f;
        sc[j + 4] = (s[j + 8] & 0xf) | ((s[j] >> 2) & 0x30);
        mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 2) & 0x30);
    }
    (sc, mn)
}

/// Per-group `(d * sc, dmin * m)` of Q4_K/Q5_K.
fn k4_group_scales(b: &[u8]) -> [(f32, f32); 8] {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (sc, mn) = k4_scales_mins(&b[4..16]);
    std::array::from_fn(|g| (d * f32::from(sc[g]), dmin * f32::from(mn[g])))
}

/// `{ f16 d, dmin; u8 scales[12]; u8 qs[128] }`: 8 groups of 32,
/// `(d * sc) * q - dmin * m`; element `64c + 32h + l` is nibble `h` of
/// `qs[32c + l]`.
fn q4_k(b: &[u8; 144], o: &mut [f32; 256]) {
    let groups = k4_group_scales(b);
    let qs = &b[16..];
    for (i, o) in o.iter_mut().enumerate() {
        let (c, h, l) = (i / 64, (i / 32) % 2, i % 32);
        let q = (qs[32 * c + l] >> (4 * h)) & 0xf;
        let (dl, ml) = groups[i / 32];
        *o = dl * f32::from(q) - ml;
    }
}

/// `{ f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128] }`: Q4_K plus a
/// fifth bit, bit `i / 32` of `qh[i % 32]`.
fn q5_k(b: &[u8; 176], o: &mut [f32; 256]) {
    let groups = k4_group_scales(b);
    let (qh, qs) = (&b[16..48], &b[48..]);
    for (i, o) in o.iter_mut().enumerate() {
        let (c, h, l) = (i / 64, (i / 32) % 2, i % 32);
        let low = (qs[32 * c + l] >> (4 * h)) & 0xf;
        let high = (qh[l] >> (i / 32)) & 1;
        let (dl, ml) = groups[i / 32];
        *o = dl * f32::from(low | high << 4) - ml;
    }
}

/// `{ u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d }`: 16 groups of 16,
/// `(d * s) * (q - 32)` with a 6-bit code: nibble `(i / 64) % 2` of
/// `ql[64 * (i / 128) + i % 64]` plus two bits from `qh`.
fn q6_k(b: &[u8; 210], o: &mut [f32; 256]) {
    let (ql, qh, scales) = (&b[..128], &b[128..192], &b[192..208]);
    let d = f16_at(b, 208);
    for (i, o) in o.iter_mut().enumerate() {
        let n = i / 128;
        let low = (ql[64 * n + i % 64] >> (4 * ((i / 64) % 2))) & 0xf;
        let high = (qh[32 * n + i % 32] >> (2 * ((i / 32) % 4))) & 3;
        let q = ((low | high << 4) as i8) - 32;
        let dl = d * f32::from(scales[i / 16] as i8);
        *o = dl * f32::from(q);
    }
}

// --- IQ types: lattice grids, sign codes, non-linear code books ----------

/// `{ f16 d; u32 qs[16] }`: 8 groups of 32, each a pair of u32: four 8-bit
/// grid indices, then four 7-bit sign codes and a 4-bit scale.
fn iq2_xxs(b: &[u8; 66], o: &mut [f32; 256]) {
    let d = f16_at(b, 0);
    for (g, o) in o.chunks_exact_mut(32).enumerate() {
        let (idx, aux) = (&b[2 + 8 * g..6 + 8 * g], u32_at(b, 6 + 8 * g));
        let db = d * (0.5 + (aux >> 28) as f32) * 0.25;
        for (l, o) in o.chunks_exact_mut(8).enumerate() {
            let entry = IQ2XXS_GRID[usize::from(idx[l])];
            let signs = ksigns(aux >> (7 * l));
            for (j, o) in o.iter_mut().enumerate() {
                *o = signed(db * f32::from(grid_byte(entry, j)), signs, j);
            }
        }
    }
}

/// The 16 scales of IQ2_XS/IQ2_S, one per 16 elements:
/// `d * (0.5 + s) * 0.25` with 4-bit `s`.
fn iq2_scales(d: f32, scales: &[u8]) -> [f32; 16] {
    std::array::from_fn(|k| {
        let s = (scales[k / 2] >> (4 * (k % 2))) & 0xf;
        d * (0.5 + f32::from(s)) * 0.25
    })
}

/// `{ f16 d; u16 qs[32]; u8 scales[8] }`: each u16 is a 9-bit grid index
/// and a 7-bit sign code for 8 elements.
fn iq2_xs(b: &[u8; 74], o: &mut [f32; 256]) {
    let db = iq2_scales(f16_at(b, 0), &b[66..74]);
    for (k, o) in o.chunks_exact_mut(8).enumerate() {
        let q = u16_at(b, 2 + 2 * k);
        let entry = IQ2XS_GRID[usize::from(q & 511)];
        let signs = ksigns(u32::from(q >> 9));
        for (j, o) in o.iter_mut().enumerate() {
            *o = signed(db[k / 2] * f32::from(grid_byte(entry, j)), signs, j);
        }
    }
}

/// `{ f16 d; u8 qs[32]; u8 signs[32]; u8 qh[8]; u8 scales[8] }`: 10-bit
/// grid indices (2 high bits in `qh`), one explicit sign byte per 8 values.
fn iq2_s(b: &[u8; 82], o: &mut [f32; 256]) {
    let (qs, signs, qh) = (&b[2..34], &b[34..66], &b[66..74]);
    let db = iq2_scales(f16_at(b, 0), &b[74..82]);
    for (k, o) in o.chunks_exact_mut(8).enumerate() {
        let high = usize::from((qh[k / 4] >> (2 * (k % 4))) & 3);
        let entry = IQ2S_GRID[usize::from(qs[k]) | high << 8];
        for (j, o) in o.iter_mut().enumerate() {
            *o = signed(db[k / 2] * f32::from(grid_byte(entry, j)), signs[k], j);
        }
    }
}

/// `{ f16 d; u8 qs[64]; u32 scales_and_signs[8] }`: 8-bit indices into a
/// grid of 4 values; per 32 elements a u32 of four 7-bit sign codes and a
/// 4-bit scale `d * (0.5 + s) * 0.5`.
fn iq3_xxs(b: &[u8; 98], o: &mut [f32; 256]) {
    let (d, qs) = (f16_at(b, 0), &b[2..66]);
    for (g, o) in o.chunks_exact_mut(32).enumerate() {
        let aux = u32_at(b, 66 + 4 * g);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
        for (l, o) in o.chunks_exact_mut(8).enumerate() {
            let signs = ksigns(aux >> (7 * l));
            for (j, o) in o.iter_mut().enumerate() {
                let entry = IQ3XXS_GRID[usize::from(qs[8 * g + 2 * l + j / 4])];
                let v = grid_byte(u64::from(entry), j % 4);
                *o = signed(db * f32::from(v), signs, j);
            }
        }
    }
}

/// `{ f16 d; u8 qs[64]; u8 qh[8]; u8 signs[32]; u8 scales[4] }`: 9-bit
/// indices into a grid of 4 values, explicit signs, per 32 elements a
/// scale `d * (1 + 2s)`.
fn iq3_s(b: &[u8; 110], o: &mut [f32; 256]) {
    let (d, qs, qh, signs, scales) = (f16_at(b, 0), &b[2..66], &b[66..74], &b[74..106], &b[106..]);
    for (i, o) in o.iter_mut().enumerate() {
        let g = i / 32;
        let s = (scales[g / 2] >> (4 * (g % 2))) & 0xf;
        let db = d * f32::from(1 + 2 * s);
        let k = i / 4;
        let index = usize::from(qs[k]) | usize::from((qh[k / 8] >> (k % 8)) & 1) << 8;
        let v = grid_byte(u64::from(IQ3S_GRID[index]), i % 4);
        *o = signed(db * f32::from(v), signs[i / 8], i % 8);
    }
}

/// `{ f16 d; u8 qs[32]; u16 qh[8] }`: 11-bit indices into a grid of
/// -1/0/1 octets; per 32 elements `dl = d * (2s + 1)` and `±delta`, each
/// value `dl * (grid + delta)`.
fn iq1_s(b: &[u8; 50], o: &mut [f32; 256]) {
    let (d, qs) = (f16_at(b, 0), &b[2..34]);
    for (g, o) in o.chunks_exact_mut(32).enumerate() {
        let h = u16_at(b, 34 + 2 * g);
        let dl = d * f32::from(2 * ((h >> 12) & 7) + 1);
        let delta = if h & 0x8000 != 0 {
            -IQ1_DELTA
        } else {
            IQ1_DELTA
        };
        for (l, o) in o.chunks_exact_mut(8).enumerate() {
            let index = usize::from(qs[4 * g + l]) | usize::from((h >> (3 * l)) & 7) << 8;
            let entry = IQ1S_GRID[index];
            for (j, o) in o.iter_mut().enumerate() {
                *o = dl * (f32::from(grid_byte(entry, j) as i8) + delta);
            }
        }
    }
}

/// `{ u8 qs[32]; u8 qh[16]; u16 scales[4] }`: IQ1_S's grid with a nibble per
/// index (3 high bits and the delta's sign), 3-bit scales per 16 elements
/// and the f16 `d` spread over the top nibbles of the four scale words.
fn iq1_m(b: &[u8; 56], o: &mut [f32; 256]) {
    let (qs, qh) = (&b[..32], &b[32..48]);
    let sc: [u16; 4] = std::array::from_fn(|k| u16_at(b, 48 + 2 * k));
    let d_bits = (sc[0] >> 12) | ((sc[1] >> 8) & 0xf0) | ((sc[2] >> 4) & 0xf00) | (sc[3] & 0xf000);
    let d = f16::from_bits(d_bits).to_f32();
    for (k, o) in o.chunks_exact_mut(8).enumerate() {
        let s = k / 2; // the 16-element half this index falls in
        let dl = d * f32::from(2 * ((sc[s / 4] >> (3 * (s % 4))) & 7) + 1);
        let nib = (qh[k / 2] >> (4 * (k % 2))) & 0xf;
        let entry = IQ1S_GRID[usize::from(qs[k]) | usize::from(nib & 7) << 8];
        let delta = if nib & 8 != 0 { -IQ1_DELTA } else { IQ1_DELTA };
        for (j, o) in o.iter_mut().enumerate() {
            *o = dl * (f32::from(grid_byte(entry, j) as i8) + delta);
        }
    }
}

/// `{ f16 d; u8 qs[16] }`: Q4_0's layout with a non-linear code book.
fn iq4_nl(b: &[u8; 18], o: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    for (j, &q) in b[2..].iter().enumerate() {
        o[j] = d * f32::from(IQ4NL_VALUES[usize::from(q & 0xf)]);
        o[j + 16] = d * f32::from(IQ4NL_VALUES[usize::from(q >> 4)]);
    }
}

/// `{ f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128] }`: 8 groups of 32 in
/// IQ4_NL's code book, each with a 6-bit scale `d * (s - 32)`.
fn iq4_xs(b: &[u8; 136], o: &mut [f32; 256]) {
    let (d, scales_h, scales_l, qs) = (f16_at(b, 0), u16_at(b, 2), &b[4..8], &b[8..]);
    for (g, o) in o.chunks_exact_mut(32).enumerate() {
        let low = (scales_l[g / 2] >> (4 * (g % 2))) & 0xf;
        let high = ((scales_h >> (2 * g)) & 3) as u8;
        let dl = d * f32::from(i16::from(low | high << 4) - 32);
        for (j, &q) in qs[16 * g..16 * g + 16].iter().enumerate() {
            o[j] = dl * f32::from(IQ4NL_VALUES[usize::from(q & 0xf)]);
            o[j + 16] = dl * f32::from(IQ4NL_VALUES[usize::from(q >> 4)]);
        }
    }
}

// --- ternary and FP4 ----------------------------------------------------

/// `{ u8 qs[48]; u8 qh[4]; f16 d }`: five (four in `qh`) base-3 digits per
/// byte, stored as a fixed-point fraction: digit `p` of byte `q` is
/// `((q * 3^p mod 256) * 3) >> 8`, and the value `d * (digit - 1)`.
fn tq1_0(b: &[u8; 54], o: &mut [f32; 256]) {
    const POW3: [u8; 5] = [1, 3, 9, 27, 81];
    let d = f16_at(b, 52);
    let digit = |q: u8, p: usize| -> f32 {
        let t = u16::from(q.wrapping_mul(POW3[p]));
        f32::from(((t * 3) >> 8) as i8 - 1)
    };
    // (bytes, digits per byte): the 32 first bytes, 16 next, then qh.
    let parts: [(&[u8], usize); 3] = [(&b[..32], 5), (&b[32..48], 5), (&b[48..52], 4)];
    let mut i = 0;
    for (bytes, digits) in parts {
        for p in 0..digits {
            for &q in bytes {
                o[i] = d * digit(q, p);
                i += 1;
            }
        }
    }
}

/// `{ u8 qs[64]; f16 d }`: 2-bit codes, `d * (q - 1)`; element
/// `128n + 32j + l` is bits `2j..2j+2` of `qs[32n + l]`.
fn tq2_0(b: &[u8; 66], o: &mut [f32; 256]) {
    let d = f16_at(b, 64);
    for (i, o) in o.iter_mut().enumerate() {
        let q = (b[32 * (i / 128) + i % 32] >> (2 * ((i / 32) % 4))) & 3;
        *o = d * f32::from(q as i8 - 1);
    }
}

/// `{ u8 e; u8 qs[16] }`: E2M1 values with a shared E8M0 exponent (halved,
/// since the code book is doubled).
fn mxfp4(b: &[u8; 17], o: &mut [f32; 32]) {
    let e = u32::from(b[0]);
    // ggml_e8m0_to_fp32_half: 2^(e - 128), subnormal for e < 2.
    let d = f32::from_bits(if e < 2 {
        0x0020_0000 << e
    } else {
        (e - 1) << 23
    });
    for (j, &q) in b[1..].iter().enumerate() {
        o[j] = d * f32::from(FP4_VALUES[usize::from(q & 0xf)]);
        o[j + 16] = d * f32::from(FP4_VALUES[usize::from(q >> 4)]);
    }
}

/// Unsigned E4M3 (bias 7) scale of NVFP4, halved for the doubled code
/// book; 0 and 0x7f (NaN) read as 0, the top bit is ignored (gguf-py's
/// `ue4m3_to_fp32`).
fn ue4m3_half(x: u8) -> f32 {
    if x == 0 || x == 0x7f {
        return 0.0;
    }
    let exp = i32::from((x >> 3) & 0xf);
    let man = f32::from(x & 7);
    let v = if exp == 0 {
        man * (1.0 / 512.0)
    } else {
        // 2^(exp - 7), exactly: a normal f32 for exp in 1..=15.
        (1.0 + man / 8.0) * f32::from_bits(((exp - 7 + 127) as u32) << 23)
    };
    v * 0.5
}

/// `{ u8 d[4]; u8 qs[32] }`: 4 sub-blocks of 16 E2M1 values, each with an
/// unsigned E4M3 scale; a sub-block's 8 bytes give its low nibbles, then
/// its high nibbles.
fn nvfp4(b: &[u8; 36], o: &mut [f32; 64]) {
    for (s, o) in o.chunks_exact_mut(16).enumerate() {
        let d = ue4m3_half(b[s]);
        for (j, &q) in b[4 + 8 * s..12 + 8 * s].iter().enumerate() {
            o[j] = d * f32::from(FP4_VALUES[usize::from(q & 0xf)]);
            o[j + 8] = d * f32::from(FP4_VALUES[usize::from(q >> 4)]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ksigns_have_even_parity() {
        assert_eq!(ksigns(0), 0x00);
        assert_eq!(ksigns(1), 0x81);
        assert_eq!(ksigns(3), 0x03);
        assert_eq!(ksigns(127), 0xff);
        for i in 0..128 {
            assert_eq!(ksigns(i).count_ones() % 2, 0);
            assert_eq!(u32::from(ksigns(i) & 0x7f), i);
        }
    }

    #[test]
    fn every_supported_type_decodes_its_table_sizes() {
        for &ty in SUPPORTED {
            let (bs, ts) = (usize_of(ty.block_size()), usize_of(ty.type_size()));
            let bytes = vec![0u8; 3 * ts];
            let mut out = vec![f32::NAN; 3 * bs];
            dequantize(ty, &bytes, &mut out).unwrap();
            assert!(out.iter().all(|v| v.is_finite()), "{ty}");
            // One element short, one byte long: typed errors, nothing written.
            let mut short = vec![0f32; 3 * bs - 1];
            assert!(matches!(
                dequantize(ty, &bytes, &mut short),
                Err(OpsError::Length { .. })
            ));
            let long = vec![0u8; 3 * ts + 1];
            assert!(matches!(
                dequantize(ty, &long, &mut out),
                Err(OpsError::PartialBlock { .. })
            ));
        }
        for &ty in GgmlType::ALL {
            if !is_supported(ty) {
                let ts = usize_of(ty.type_size());
                let bs = usize_of(ty.block_size());
                let r = dequantize(ty, &vec![0u8; ts], &mut vec![0.0; bs]);
                assert_eq!(r, Err(OpsError::Unsupported(ty)));
            }
        }
    }

    #[test]
    fn hand_checked_q4_0_and_q8_0() {
        // d = 0.5 (f16 0x3800); qs[0] = 0x f3: low 3 -> (3 - 8) * 0.5,
        // high 15 -> (15 - 8) * 0.5.
        let mut b = vec![0x00, 0x38];
        b.extend([0xf3; 16]);
        let mut out = [0.0; 32];
        dequantize(GgmlType::Q4_0, &b, &mut out).unwrap();
        assert_eq!(out[0], -2.5);
        assert_eq!(out[16], 3.5);

        let mut b = vec![0x00, 0x40]; // d = 2
        b.extend((0..32).map(|i| (i as i8 - 16) as u8));
        dequantize(GgmlType::Q8_0, &b, &mut out).unwrap();
        for (i, &v) in out.iter().enumerate() {
            assert_eq!(v, 2.0 * (i as f32 - 16.0));
        }
    }

    #[test]
    fn dequantize_row_reads_one_row() {
        // Three rows of 32 Q8_0 elements with scales 1, 2, 3.
        let mut data = Vec::new();
        for r in 0..3u16 {
            data.extend(f16::from_f32(f32::from(r + 1)).to_le_bytes());
            data.extend([1u8; 32]);
        }
        let mut out = [0.0; 32];
        dequantize_row(GgmlType::Q8_0, &data, 32, 2, &mut out).unwrap();
        assert!(out.iter().all(|&v| v == 3.0));
        assert_eq!(
            dequantize_row(GgmlType::Q8_0, &data, 32, 3, &mut out),
            Err(OpsError::RowOutOfRange { row: 3, rows: 3 })
        );
        assert!(matches!(
            dequantize_row(GgmlType::Q8_0, &data, 31, 0, &mut out),
            Err(OpsError::RowNotWholeBlocks { .. })
        ));
        assert_eq!(
            dequantize_row(GgmlType::Q8_1, &data, 32, 0, &mut out),
            Err(OpsError::Unsupported(GgmlType::Q8_1))
        );
    }
}
