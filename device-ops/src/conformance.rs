//! The op-by-op conformance check (llama.cpp's `test-backend-ops` shape):
//! every op of a device's [`Ops`] on random inputs, compared with the CPU
//! reference ([`crate::reference`], family-ops) by the normalized mean
//! squared error `Σ(got - want)² / Σ want²` against a tolerance per op
//! ([`Tolerance`]), plus the refusals (a foreign tensor, shapes that do
//! not fit, an id outside a table) and the counters (no weight read back).
//!
//! Written once; each device runs it in its own tests: the CPU and the
//! fake device everywhere, CUDA where a GPU exists. The weights are
//! staged through `seam::resident_weight` on the platform given, so a
//! device reads them where the seam put them.

use std::cell::Cell;

use seam::gguf::GgmlType;
use seam::platform::{Platform, Queue};
use seam::weight::{Role, Weight};
use seam::{Resident, resident_weight};

use crate::reference::{self, HostAttnMask, HostNorm};
use crate::{
    Attention, AttnMask, DType, DeltaNetDims, DeviceRouting, DeviceTensor, Gating, KvCache, KvSpec,
    NormWeight, OpError, Ops, OuterFactor, Rope, RopeMode, Scores,
};

/// The weight types [`check`] multiplies and gathers by default.
pub const WEIGHT_TYPES: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
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
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::TQ2_0,
    GgmlType::MXFP4,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
    GgmlType::TQ1_0,
    GgmlType::NVFP4,
];

/// The largest normalized mean squared error each op may show against the
/// reference, and why.
#[derive(Clone, Copy, Debug)]
pub struct Tolerance;

impl Tolerance {
    /// Products: the same rounded activations and dequantized weights, the
    /// sum in another order and precision (the reference sums in `f64`, a
    /// device in `f32`): about `1e-14` for rows of 512. 1e-9 still fails a
    /// device that skips the activations' rounding (Q8_0 blocks move an
    /// output by about `1e-3` of its size, an NMSE near `1e-6`: the
    /// `tolerance_tells_rounded_activations_apart` test).
    pub const MATMUL: f64 = 1e-9;
    /// Products of a type whose blocks carry a minimum (Q4_1): the
    /// minimum offsets a whole block, so a row's `f32` sum cancels large
    /// terms and keeps fewer of the result's bits (2.9e-9 on the H200).
    /// A skipped activation rounding still moves an output by about 1e-6.
    pub const MATMUL_BLOCK_MIN: f64 = 1e-8;
    /// Gathers and dequantization: the same decode in `f32`; exact on a
    /// device that does not contract multiply-adds.
    pub const GET_ROWS: f64 = 1e-12;
    /// RMSNorm: one sum in another order, the rest the same `f32` steps.
    pub const RMS_NORM: f64 = 1e-12;
    /// RoPE: the angles' sine and cosine of another library (ggml's `f32`
    /// angles, their cosine and sine correctly rounded on a device against
    /// glibc's `cosf`/`sinf`, within 0.56 ulp; the plain rope's `f64`
    /// angles; 4.0e-11 for imrope's sections on the H200 when its angles
    /// were `f64`).
    pub const ROPE: f64 = 1e-10;
    /// Softmax, SiLU, SwiGLU, GELU: another `expf`/`tanhf` (ggml's
    /// vectorised one against a device's, within a few ulp).
    pub const TRANSCENDENTAL: f64 = 1e-10;
    /// `add`, `mul`, `scale`: one correctly rounded `f32` operation.
    pub const ELEMENTWISE: f64 = 0.0;
    /// Copies: a KV cache's rows after appends, a conv state (its inputs),
    /// ids (`argmax`, the experts `route` picks, in order): exact.
    pub const EXACT: f64 = 0.0;
    /// Attention: scores, softmax and the weighted sum in `f64` on both
    /// sides, rounded once to `f32`; the sums in another order and another
    /// library's `exp`/`tanh`: an output moves by an ulp or so (an ulp
    /// of `f32` is an NMSE near `1e-14`). A device that drops a mask moves
    /// outputs by their own size and fails (the `Wrong` device in
    /// `tests.rs`). The same for an F16 cache: the reference attends over
    /// the values rounded to f16 as the cache stores them, a device widens
    /// the stored halves exactly, so both read the same numbers; the
    /// rounding itself moves outputs by an NMSE of about `5e-8`, far past
    /// this (each F16 case checks that it is past `100x` this).
    pub const ATTENTION: f64 = 1e-12;
    /// Attention without a softcap, softmax over whole 8s, LayerNorm, the
    /// lightning indexer's scores, the mix of experts' outputs and the Q8_0,
    /// IQ4_XS, IQ4_NL and float products: ggml's `f32` steps in ggml's order
    /// (its dots' lanes, its vectorised `exp`, its sums), which a device
    /// follows step for step: exact. A device
    /// that sums in `f64` and rounds once is an ulp off here and there,
    /// and an F16 cache's rounding of the probabilities turns that into
    /// an f16 ulp now and then (issue 28's F16 goldens).
    pub const GGML_STEPS: f64 = 0.0;
    /// [`Tolerance::GGML_STEPS`] where a row's elements past its last
    /// whole 8 take libm's `expf` (the k-pool's pooled keys and slot
    /// attention, SiLU and SwiGLU), or every element does (ggml's sigmoid
    /// and softplus, and the gates, mixes and weights built on them):
    /// glibc's is within 0.502 ulp of the exact value, and a device that
    /// rounds it correctly moves an output by an ulp now and then (an
    /// NMSE near `1e-15`). One that rounds it as glibc does
    /// ([`crate::libm_rounding`], as CUDA's kernels do) gives the
    /// reference's bits, which the libm case holds exact.
    pub const GGML_STEPS_LIBM_TAIL: f64 = 1e-13;
    /// Routing weights: ggml's softmax or sigmoid in its `f32` steps, the
    /// norm and the scale the same `f32` steps: [`Tolerance::GGML_STEPS_LIBM_TAIL`]
    /// (libm's `expf` past the last whole 8 and in the sigmoid).
    pub const ROUTE: f64 = 1e-13;
    /// The conv (with its SiLU) and the delta rule: ggml's `f32` steps
    /// (its dots' lanes, its fused state update), the decay's `expf` and
    /// the SiLU's past the last whole 8 libm's: as
    /// [`Tolerance::GGML_STEPS_LIBM_TAIL`].
    pub const GDN: f64 = 1e-13;
}

/// How the check stages its weights: through the seam, on this platform
/// and queue.
#[derive(Clone, Copy)]
pub struct Staging<'a> {
    /// The platform the device's weights are staged on.
    pub platform: &'a dyn Platform,
    /// The queue staging goes through (the one the device's ops run on).
    pub queue: &'a dyn Queue,
}

/// One case's outcome.
#[derive(Clone, Debug)]
pub struct Case {
    /// The op.
    pub op: &'static str,
    /// The inputs (type, shapes, options).
    pub case: String,
    /// The NMSE found (`NaN` when the op failed or a refusal was checked).
    pub nmse: f64,
    /// The tolerance.
    pub tolerance: f64,
    /// `None` when it passed, else why not.
    pub failure: Option<String>,
}

/// Every case's outcome.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// The cases, in order.
    pub cases: Vec<Case>,
}

impl Report {
    /// The cases that failed.
    pub fn failures(&self) -> Vec<&Case> {
        self.cases.iter().filter(|c| c.failure.is_some()).collect()
    }

    /// The report as lines: `op case nmse tolerance ok|FAIL: why`.
    pub fn table(&self) -> String {
        self.cases
            .iter()
            .map(|c| {
                format!(
                    "{:<10} {:<44} nmse {:>10.3e} (max {:.0e}) {}",
                    c.op,
                    c.case,
                    c.nmse,
                    c.tolerance,
                    c.failure
                        .as_deref()
                        .map_or("ok".into(), |f| format!("FAIL: {f}"))
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Panics with the table when a case failed or nothing was checked.
    #[track_caller]
    pub fn assert_passed(&self) {
        assert!(!self.cases.is_empty(), "no case was checked");
        assert!(
            self.failures().is_empty(),
            "conformance failures:\n{}",
            self.table()
        );
    }

    fn push(&mut self, op: &'static str, case: String, tolerance: f64, got: Result<f64, String>) {
        let (nmse, failure) = match got {
            Ok(e) if e <= tolerance => (e, None),
            Ok(e) => (e, Some(format!("nmse {e:.3e} > {tolerance:.0e}"))),
            Err(why) => (f64::NAN, Some(why)),
        };
        self.cases.push(Case {
            op,
            case,
            nmse,
            tolerance,
            failure,
        });
    }
}

/// `Σ(got - want)² / Σ want²` (`0` when both are zero); infinite when the
/// lengths differ or a value is not finite where the reference's is (NaN
/// where the reference has NaN counts as equal).
pub fn nmse(got: &[f32], want: &[f32]) -> f64 {
    if got.len() != want.len() {
        return f64::INFINITY;
    }
    let (mut num, mut den) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        if w.is_nan() && g.is_nan() {
            continue;
        }
        if g.is_finite() != w.is_finite() || (!w.is_finite() && g != w) {
            return f64::INFINITY;
        }
        if !w.is_finite() {
            continue;
        }
        let d = f64::from(g) - f64::from(w);
        num += d * d;
        den += f64::from(w) * f64::from(w);
    }
    if num == 0.0 {
        0.0
    } else {
        num / den.max(f64::MIN_POSITIVE)
    }
}

/// A deterministic generator (xorshift64*).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// Seeded.
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * u
    }
    /// `n` values uniform in `[lo, hi)`.
    pub fn values(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
}

/// Byte offsets of the F16 scale fields in one block of `ty` (they are
/// set to small finite values; every other byte is random).
fn scale_fields(ty: GgmlType) -> &'static [usize] {
    use GgmlType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 | IQ4_NL | IQ4_XS | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S
        | IQ1_S => &[0],
        Q4_1 | Q5_1 | Q4_K | Q5_K => &[0, 2],
        Q2_K => &[80, 82],
        Q3_K => &[108],
        Q6_K => &[208],
        TQ2_0 => &[64],
        TQ1_0 => &[52],
        _ => &[],
    }
}

/// Random bytes of `rows` rows of `ne0` elements of `ty`: floats in
/// `[-1, 1)` for F32/F16/BF16, random codes with small finite scales for
/// the block types.
///
/// # Panics
///
/// `ne0` is not whole blocks of `ty` (a bug of the caller: the check's own
/// shapes).
pub fn random_weight(rng: &mut Rng, ty: GgmlType, ne0: usize, rows: usize) -> Vec<u8> {
    let n = ne0 * rows;
    match ty {
        GgmlType::F32 => crate::le_bytes(&rng.values(n, -1.0, 1.0)),
        GgmlType::F16 => rng
            .values(n, -1.0, 1.0)
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect(),
        GgmlType::BF16 => rng
            .values(n, -1.0, 1.0)
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect(),
        _ => {
            let rb = ty.row_bytes(ne0 as u64).expect("whole blocks") as usize;
            let mut bytes: Vec<u8> = (0..rb * rows).map(|_| rng.next_u64() as u8).collect();
            let size = ty.type_size() as usize;
            for block in bytes.chunks_exact_mut(size) {
                for &off in scale_fields(ty) {
                    let d = half::f16::from_f32(rng.uniform(0.002, 0.03));
                    block[off..off + 2].copy_from_slice(&d.to_le_bytes());
                }
                if ty == GgmlType::IQ1_M {
                    // The f16 d spread over the top nibbles of the four
                    // scale words at 48..56.
                    let d = half::f16::from_f32(rng.uniform(0.002, 0.03)).to_bits();
                    for k in 0..4 {
                        let at = 48 + 2 * k;
                        let w = u16::from_le_bytes([block[at], block[at + 1]]);
                        let w = (w & 0x0fff) | (((d >> (4 * k)) & 0xf) << 12);
                        block[at..at + 2].copy_from_slice(&w.to_le_bytes());
                    }
                }
                if ty == GgmlType::MXFP4 {
                    // The E8M0 exponent: 2^(e - 128), kept near 2^-5.
                    block[0] = 120 + (rng.next_u64() % 6) as u8;
                }
                if ty == GgmlType::NVFP4 {
                    // The four unsigned E4M3 scales: exponents 3..=7
                    // (2^-4..2^0 before the halving), any mantissa, the
                    // ignored top bit random.
                    for s in &mut block[..4] {
                        let r = rng.next_u64();
                        *s = (r as u8 & 0x87) | (((3 + (r >> 8) % 5) as u8) << 3);
                    }
                }
            }
            bytes
        }
    }
}

/// Runs `f` and scores its output against `want`.
fn score(got: Result<Vec<f32>, OpError>, want: Result<Vec<f32>, OpError>) -> Result<f64, String> {
    let want = want.map_err(|e| format!("the reference failed: {e}"))?;
    let got = got.map_err(|e| e.to_string())?;
    Ok(nmse(&got, &want))
}

/// Whether `r` is the refusal `matches` accepts.
fn refused(
    r: Result<crate::DeviceTensor, OpError>,
    matches: impl Fn(&OpError) -> bool,
) -> Result<f64, String> {
    match r {
        Err(e) if matches(&e) => Ok(0.0),
        Err(e) => Err(format!("refused with the wrong error: {e}")),
        Ok(t) => Err(format!("accepted (gave {:?})", t.shape())),
    }
}

/// Every op of `ops` against the reference, weights of `types` staged on
/// `staging`'s platform. Never panics on a device's misbehaviour: each
/// case's outcome is in the report.
pub fn check(ops: &dyn Ops, staging: Staging<'_>, types: &[GgmlType]) -> Report {
    let mut report = Report::default();
    let mut rng = Rng::new(0x5EA4);
    // The few-long-rows cases and the per-stream norm weights draw from
    // their own stream, so the others' inputs stay what they were.
    let mut long_rng = Rng::new(0x5EA5);
    let before = ops.counters();
    let read_back = Cell::new(0u64);
    // Reads a tensor back, counting what the check read.
    let back = |t: Result<crate::DeviceTensor, OpError>| -> Result<Vec<f32>, OpError> {
        let t = t?;
        let v = ops.read_back(&t)?;
        read_back.set(read_back.get() + 4 * v.len() as u64);
        Ok(v)
    };
    let back_ref = |t: &DeviceTensor| -> Result<Vec<f32>, OpError> {
        let v = ops.read_back(t)?;
        read_back.set(read_back.get() + 4 * v.len() as u64);
        Ok(v)
    };
    let back_i32 = |t: &DeviceTensor| -> Result<Vec<i32>, OpError> {
        let v = ops.read_back_i32(t)?;
        read_back.set(read_back.get() + 4 * v.len() as u64);
        Ok(v)
    };

    // Products and gathers, per weight type.
    for &ty in types {
        long_row_products(ops, &mut report, &mut long_rng, staging, ty, &back);
        let (ne0, rows) = (512, 37);
        let (weight, bytes) = random_owned_weight(&mut rng, ty, "w", &[ne0, rows]);
        let Some(resident) = staged_or_reported(&mut report, "matmul", &weight, staging) else {
            continue;
        };
        let staged = StagedWeight {
            weight: &weight,
            resident: &resident,
            bytes: &bytes,
        };
        products_of(ops, &mut report, &mut rng, &staged, &[1, 3], &back);
        let ids = [4, 0, 36, 4, 17];
        let got = ops
            .upload_i32(&ids, &[ids.len()])
            .and_then(|it| back(ops.get_rows(&weight, &resident, &it)));
        let want = reference::get_rows(ty, &bytes, ne0, rows, &ids, weight.name());
        report.push(
            "get_rows",
            format!("{ty} [{ne0}, {rows}] ids {ids:?}"),
            Tolerance::GET_ROWS,
            score(got, want),
        );
        let got = back(ops.dequantize(&weight, &resident));
        let mut want = vec![0f32; ne0 * rows];
        let want = family_ops::dequantize(ty, &bytes, &mut want)
            .map(|()| want)
            .map_err(OpError::reference("dequantize"));
        report.push(
            "dequantize",
            format!("{ty} [{ne0}, {rows}]"),
            Tolerance::GET_ROWS,
            score(got, want),
        );
        // Refusals: an id past the table, x of the wrong width.
        let r = ops
            .upload_i32(&[1, rows as i32], &[2])
            .and_then(|it| ops.get_rows(&weight, &resident, &it));
        report.push(
            "get_rows",
            format!("{ty}: id {rows} of {rows} rows refused"),
            0.0,
            refused(
                r,
                |e| matches!(e, OpError::RowOutOfRange { row, .. } if *row == rows as i64),
            ),
        );
        let r = ops
            .upload_f32(&vec![0.0; ne0 - 1], &[1, ne0 - 1])
            .and_then(|xt| ops.matmul(&weight, &resident, &xt));
        report.push(
            "matmul",
            format!("{ty}: x of {} refused", ne0 - 1),
            0.0,
            refused(r, |e| matches!(e, OpError::Shape { op: "matmul", .. })),
        );
        // Few long rows too: CUDA runs them a block a row, not a warp a
        // row, where blocks of 8 rows would leave multiprocessors idle.
        expert_products(ops, &mut report, &mut rng, staging, ty, (256, 16, 4), &back);
        expert_products(
            ops,
            &mut report,
            &mut long_rng,
            staging,
            ty,
            (2048, 9, 4),
            &back,
        );
    }

    // RMSNorm: a weight of one row; a weight row per stream, repeated
    // over the tokens (3 tokens of 2 streams, from the second stream).
    let cols = 96;
    let one = (
        3,
        rng.values(3 * cols, -3.0, 3.0),
        1,
        rng.values(cols, -0.5, 0.5),
    );
    let (streams, rows) = (2, 6);
    let x = long_rng.values(rows * cols, -3.0, 3.0);
    let w = long_rng.values(streams * cols, -0.5, 0.5);
    for (rows, x, wrows, w) in [one, (rows, x.clone(), streams, w.clone())] {
        let by = if wrows == 1 {
            String::new()
        } else {
            format!(" by [{wrows}, {cols}]")
        };
        let kinds: &[(&str, HostNorm<'_>)] = &[
            ("none", HostNorm::None),
            ("scale", HostNorm::Scale(&w)),
            ("1 + w", HostNorm::OnePlus(&w)),
        ];
        // Without a weight, the rows per stream are no other case.
        for &(kind, hn) in &kinds[usize::from(wrows > 1)..] {
            let got = ops.upload_f32(&x, &[rows, cols]).and_then(|xt| {
                let wshape: &[usize] = if wrows == 1 { &[cols] } else { &[wrows, cols] };
                let wt = ops.upload_f32(&w, wshape)?;
                let nw = match hn {
                    HostNorm::None => NormWeight::None,
                    HostNorm::Scale(_) => NormWeight::Scale(&wt),
                    HostNorm::OnePlus(_) => NormWeight::OnePlus(&wt),
                };
                back(ops.rms_norm(&xt, 1e-6, nw))
            });
            let want = reference::rms_norm(&x, cols, 1e-6, hn);
            report.push(
                "rms_norm",
                format!("[{rows}, {cols}] {kind}{by}"),
                Tolerance::RMS_NORM,
                score(got, want),
            );
        }
    }
    let r = ops.upload_f32(&x[..5 * cols], &[5, cols]).and_then(|xt| {
        let wt = ops.upload_f32(&w, &[streams, cols])?;
        ops.rms_norm(&xt, 1e-6, NormWeight::Scale(&wt))
    });
    report.push(
        "rms_norm",
        format!("[5, {cols}] by [{streams}, {cols}] refused"),
        0.0,
        refused(r, |e| matches!(e, OpError::Shape { what: "weight", .. })),
    );

    // RoPE.
    let (head_dim, heads) = (16, 4);
    let positions = [0, 7, 4095];
    let x = rng.values(positions.len() * heads * head_dim, -2.0, 2.0);
    for mode in [RopeMode::Normal, RopeMode::Neox] {
        for n_rot in [16, 8] {
            let rope = Rope {
                n_rot,
                freq_base: 10000.0,
                mode,
            };
            let shape = [positions.len(), heads * head_dim];
            let got = ops.upload_f32(&x, &shape).and_then(|xt| {
                let pt = ops.upload_i32(&positions, &[positions.len()])?;
                back(ops.rope(&xt, &pt, head_dim, &rope))
            });
            let want = reference::rope(&x, heads * head_dim, &positions, head_dim, &rope);
            report.push(
                "rope",
                format!("{mode:?} n_rot {n_rot} {shape:?} pos {positions:?}"),
                Tolerance::ROPE,
                score(got, want),
            );
        }
    }

    // IMROPE: text tokens and a token of four distinct positions, two
    // section layouts, a partial rotation.
    let pos4 = [0, 0, 0, 0, 7, 7, 7, 0, 4095, 4095, 4095, 0, 30, 12, 5, 2];
    let x = rng.values(4 * heads * head_dim, -2.0, 2.0);
    for (sections, n_rot) in [([3, 3, 2, 0], 16), ([2, 1, 1, 2], 12)] {
        let rope = crate::MultiRope {
            n_rot,
            freq_base: 1e6,
            sections,
        };
        let shape = [4, heads * head_dim];
        let got = ops.upload_f32(&x, &shape).and_then(|xt| {
            let pt = ops.upload_i32(&pos4, &[4, 4])?;
            back(ops.imrope(&xt, &pt, head_dim, &rope))
        });
        let want = reference::imrope(&x, heads * head_dim, &pos4, head_dim, &rope);
        report.push(
            "imrope",
            format!("sections {sections:?} n_rot {n_rot} {shape:?} pos {pos4:?}"),
            Tolerance::ROPE,
            score(got, want),
        );
    }
    let r = ops.upload_f32(&x, &[4, heads * head_dim]).and_then(|xt| {
        let pt = ops.upload_i32(&pos4[..12], &[4, 3])?;
        let rope = crate::MultiRope {
            n_rot: 16,
            freq_base: 1e6,
            sections: [3, 3, 2, 0],
        };
        ops.imrope(&xt, &pt, head_dim, &rope)
    });
    report.push(
        "imrope",
        "positions of 3 a row refused".into(),
        0.0,
        refused(r, |e| {
            matches!(
                e,
                OpError::Shape {
                    what: "positions",
                    ..
                }
            )
        }),
    );

    // Softmax, with and without masks.
    let (rows, cols) = (4, 40);
    let x = rng.values(rows * cols, -6.0, 6.0);
    let mut mask1: Vec<f32> = vec![0.0; cols];
    mask1[3] = f32::NEG_INFINITY;
    mask1[39] = f32::NEG_INFINITY;
    let mask2: Vec<f32> = (0..2 * cols)
        .map(|i| {
            if i % cols > 20 + i / cols {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    for (kind, mask, mrows) in [
        ("no mask", None, 0),
        ("mask [1, 40]", Some(&mask1), 1),
        ("mask [2, 40]", Some(&mask2), 2),
    ] {
        let got = ops.upload_f32(&x, &[rows, cols]).and_then(|xt| {
            let mt = mask
                .map(|m| ops.upload_f32(m, &[mrows, cols]))
                .transpose()?;
            back(ops.softmax(&xt, 0.125, mt.as_ref()))
        });
        let want = reference::softmax(&x, cols, 0.125, mask.map(|m| m.as_slice()));
        report.push(
            "softmax",
            format!("[{rows}, {cols}] scale 0.125 {kind}"),
            Tolerance::GGML_STEPS,
            score(got, want),
        );
    }

    // Activations and element-wise ops.
    let (rows, cols) = (5, 35);
    let a = rng.values(rows * cols, -8.0, 8.0);
    let b = rng.values(rows * cols, -2.0, 2.0);
    let row = rng.values(cols, -2.0, 2.0);
    let shape = [rows, cols];
    type Unary<'a> = (
        &'static str,
        f64,
        &'a dyn Fn(&crate::DeviceTensor) -> Result<crate::DeviceTensor, OpError>,
        Vec<f32>,
    );
    let unaries: [Unary<'_>; 4] = [
        (
            "silu",
            Tolerance::GGML_STEPS_LIBM_TAIL,
            &|t| ops.silu(t),
            reference::silu(&a, cols),
        ),
        (
            "silu_scaled",
            Tolerance::GGML_STEPS_LIBM_TAIL,
            &|t| ops.silu_scaled(t, 0.25),
            reference::silu(&a.iter().map(|&v| v * 0.25).collect::<Vec<_>>(), cols),
        ),
        (
            "gelu",
            Tolerance::TRANSCENDENTAL,
            &|t| ops.gelu(t),
            reference::gelu(&a),
        ),
        (
            "scale",
            Tolerance::ELEMENTWISE,
            &|t| ops.scale(t, -0.37),
            a.iter().map(|&v| v * -0.37).collect(),
        ),
    ];
    for (op, tol, f, want) in unaries {
        let got = ops.upload_f32(&a, &shape).and_then(|t| back(f(&t)));
        report.push(op, format!("{shape:?}"), tol, score(got, Ok(want)));
    }
    let got = ops.upload_f32(&a, &shape).and_then(|g| {
        let u = ops.upload_f32(&b, &shape)?;
        back(ops.swiglu(&g, &u))
    });
    report.push(
        "swiglu",
        format!("{shape:?}"),
        Tolerance::GGML_STEPS_LIBM_TAIL,
        score(got, reference::swiglu(&a, &b, cols)),
    );
    for (op, same) in [
        ("add", true),
        ("add", false),
        ("mul", true),
        ("mul", false),
        ("mul_sigmoid", true),
        ("mul_sigmoid", false),
    ] {
        let (bv, bshape): (&[f32], Vec<usize>) = if same {
            (&b, shape.to_vec())
        } else {
            (&row, vec![cols])
        };
        let got = ops.upload_f32(&a, &shape).and_then(|at| {
            let bt = ops.upload_f32(bv, &bshape)?;
            back(match op {
                "add" => ops.add(&at, &bt),
                "mul" => ops.mul(&at, &bt),
                _ => ops.mul_sigmoid(&at, &bt),
            })
        });
        let (want, tol) = match op {
            "add" => (
                reference::binary(&a, bv, |x, y| x + y),
                Tolerance::ELEMENTWISE,
            ),
            "mul" => (
                reference::binary(&a, bv, |x, y| x * y),
                Tolerance::ELEMENTWISE,
            ),
            _ => (
                reference::binary(&a, bv, |x, y| x * family_ops::ggml_cpu::sigmoid(y)),
                Tolerance::GGML_STEPS_LIBM_TAIL,
            ),
        };
        report.push(
            op,
            format!("{shape:?} by {bshape:?}"),
            tol,
            score(got, Ok(want)),
        );
    }

    // Refusals every device makes alike.
    let r = ops.upload_f32(&a, &shape).and_then(|at| {
        let bt = ops.upload_f32(&a[..cols - 1], &[cols - 1])?;
        ops.add(&at, &bt)
    });
    report.push(
        "add",
        "b of another width refused".into(),
        0.0,
        refused(r, |e| matches!(e, OpError::Shape { op: "add", .. })),
    );
    let foreign = crate::CpuOps::cpu();
    let r = foreign.upload_f32(&a, &shape).and_then(|t| ops.silu(&t));
    report.push(
        "silu",
        "another device's tensor refused".into(),
        0.0,
        refused(r, |e| matches!(e, OpError::ForeignTensor { .. })),
    );
    let r = ops.upload_i32(&[1, 2], &[2]).and_then(|t| ops.silu(&t));
    report.push(
        "silu",
        "an I32 tensor refused".into(),
        0.0,
        refused(r, |e| matches!(e, OpError::DType { .. })),
    );
    let r = ops.upload_f32(&a, &[rows, cols + 1]);
    report.push(
        "upload",
        "a shape that is not the data refused".into(),
        0.0,
        refused(r, |e| matches!(e, OpError::Shape { .. })),
    );

    let io = Io {
        back: &back,
        back_ref: &back_ref,
        back_i32: &back_i32,
    };
    for dtype in [DType::F32, DType::F16] {
        kv_attention(ops, &mut report, &mut rng, &io, dtype);
        attention_dot_leftovers(ops, &mut report, &io, dtype);
    }
    routing(ops, &mut report, &mut rng, &io);
    gated_delta_net(ops, &mut report, &mut rng, &io);
    wide_shapes(ops, &mut report, &mut rng, &io);
    gates_and_slices(ops, &mut report, &mut rng, &io);
    libm_rounding_points_case(ops, &mut report, &io);
    glm_moe_dsa_ops(ops, &mut report, &mut rng, &io);
    muse_glimmer_ops(ops, &mut report, &mut rng, &io, staging);
    glm5_next_ops(ops, &mut report, &mut rng, &io);
    let read_back = read_back.get();

    // Counters: work was counted, no weight came back, and every byte the
    // check read back was counted.
    let after = ops.counters();
    let counted = after.read_back_bytes - before.read_back_bytes;
    let counts = if after.weight_read_back_bytes != before.weight_read_back_bytes {
        Err(format!(
            "{} bytes of weights read back",
            after.weight_read_back_bytes - before.weight_read_back_bytes
        ))
    } else if after.kernel_launches <= before.kernel_launches {
        Err("no kernel launch counted".into())
    } else if counted < read_back {
        Err(format!(
            "{counted} bytes read back counted, the check read {read_back}"
        ))
    } else if after.host_transfers <= before.host_transfers {
        Err("no host transfer counted".into())
    } else {
        Ok(0.0)
    };
    report.push("counters", format!("{after:?}"), 0.0, counts);
    report
}

/// `matmul_id` of an expert stack of `ty` (`[256, 16, 4]`, staged through
/// the seam), by one input per token and by one per pick; the refusal of
/// inputs of another count.
/// Products of a weight of 5 rows of 2048 by 1 and 5 activation rows; of
/// 3 rows of 16384 by 1 and 2 (inputs from a stream of their own, so that
/// the checks after these see the inputs they always saw): rows of 512
/// blocks of 32, which CUDA runs a block a row, each round of its int8
/// products in ggml's lanes over the block's 8 warps; and, for a type of
/// 32-element blocks, of 5 rows of 9 blocks by 1 and 3 (a stream of its
/// own too); of 8 rows of 256 by 1 and 4 (a stream of its own): a ubatch
/// of a weight of a multiple of 4 (and 8) rows, which ggml sums with
/// llamafile's tinyBLAS (floats) or repacked (Q4_0, Q4_K, IQ4_NL; Q4_K's
/// `gemm` for 4 tokens).
fn long_row_products(
    ops: &dyn Ops,
    report: &mut Report,
    rng: &mut Rng,
    staging: Staging<'_>,
    ty: GgmlType,
    back: &dyn Fn(Result<DeviceTensor, OpError>) -> Result<Vec<f32>, OpError>,
) {
    let mut block_row_rng = Rng::new(0xB10C_0512 ^ ty as u64);
    let mut odd_rng = Rng::new(0x0DD_B10C ^ ty as u64);
    let mut ubatch_rng = Rng::new(0x0B_A7C4 ^ ty as u64);
    let mut shapes = vec![
        ([2048, 5], [1, 5], &mut *rng),
        ([16384, 3], [1, 2], &mut block_row_rng),
        ([256, 8], [1, 4], &mut ubatch_rng),
    ];
    // Rows of an odd count of blocks (ggml's IQ4_NL dot adds the last
    // one apart), for the types of 32-element blocks.
    if ty.block_size() == 32 {
        shapes.push(([288, 5], [1, 3], &mut odd_rng));
    }
    for (dims, ns, rng) in shapes {
        let (weight, bytes) = random_owned_weight(rng, ty, "long", &dims);
        let Some(resident) = staged_or_reported(report, "matmul", &weight, staging) else {
            return;
        };
        let staged = StagedWeight {
            weight: &weight,
            resident: &resident,
            bytes: &bytes,
        };
        products_of(ops, report, rng, &staged, &ns, back);
    }
}

/// A weight of `ty` and GGUF `dims` named `{stem}.{ty}`, owning random
/// bytes ([`random_weight`] over the rows of every dim past the first),
/// and those bytes.
fn random_owned_weight(
    rng: &mut Rng,
    ty: GgmlType,
    stem: &str,
    dims: &[usize],
) -> (Weight, Vec<u8>) {
    let rows = dims[1..].iter().product();
    let bytes = random_weight(rng, ty, dims[0], rows);
    let weight = Weight::owned(
        format!("{stem}.{}", ty.name()),
        ty,
        dims.iter().map(|&d| d as u64).collect(),
        Role::new("tensor"),
        bytes.clone(),
    );
    (weight, bytes)
}

/// `weight` staged through the seam, or `None` with the failure reported
/// under `op`.
fn staged_or_reported<'w>(
    report: &mut Report,
    op: &'static str,
    weight: &'w Weight,
    staging: Staging<'_>,
) -> Option<Resident<'w>> {
    match resident_weight(weight, staging.platform, staging.queue) {
        Ok(r) => Some(r),
        Err(e) => {
            let what = format!("{}: staging", weight.ggml_type());
            report.push(op, what, 0.0, Err(e.to_string()));
            None
        }
    }
}

/// A staged matrix and the bytes it was staged from.
struct StagedWeight<'a> {
    weight: &'a Weight,
    resident: &'a Resident<'a>,
    bytes: &'a [u8],
}

/// The products of `w` by `n` random activation rows for each of `ns`,
/// against the reference.
fn products_of(
    ops: &dyn Ops,
    report: &mut Report,
    rng: &mut Rng,
    w: &StagedWeight<'_>,
    ns: &[usize],
    back: &dyn Fn(Result<DeviceTensor, OpError>) -> Result<Vec<f32>, OpError>,
) {
    let ty = w.weight.ggml_type();
    let (ne0, rows) = (w.weight.dims()[0] as usize, w.weight.dims()[1] as usize);
    for &n in ns {
        let x = rng.values(n * ne0, -2.0, 2.0);
        let got = ops
            .upload_f32(&x, &[n, ne0])
            .and_then(|xt| back(ops.matmul(w.weight, w.resident, &xt)));
        let want = reference::matmul(ty, w.bytes, ne0, rows, &x);
        report.push(
            "matmul",
            format!("{ty} [{ne0}, {rows}] x [{n}, {ne0}]"),
            matmul_tolerance(ty, n, rows),
            score(got, want),
        );
    }
}

/// The tolerance of a product of `n` activation rows by a weight (an
/// expert) of `rows` rows: [`Tolerance::MATMUL`],
/// [`Tolerance::MATMUL_BLOCK_MIN`] for a type whose blocks carry a
/// minimum, [`Tolerance::GGML_STEPS`] for Q8_0, IQ4_NL, F32, F16 and BF16,
/// for IQ4_XS and Q6_K below 8 rows (past them ggml's tiled K-quant kernel
/// sums them, which no device follows) and for one row of a Q4_K weight of a
/// multiple of 8 rows (ggml's repacked gemv; its gemm, for a ubatch's
/// whole 4s, rounds the activations its own way): a device sums
/// their products in ggml's lanes and order (the reference's
/// `ggml_cpu::matvec` at `Ubatch::of`: one token's `vec_dot`, which
/// llamafile's Q8_0 kernel shares; several rows of a float weight of a
/// multiple of 4 rows, and of an IQ4_NL weight not repacked, tinyBLAS's),
/// since products summed in another order move an F16 cache's values
/// across their rounding (issue 28's F16 goldens) and a router's near tie
/// to the other expert (issue 25's greedy tokens).
fn matmul_tolerance(ty: GgmlType, n: usize, rows: usize) -> f64 {
    match ty {
        GgmlType::Q4_1 => Tolerance::MATMUL_BLOCK_MIN,
        GgmlType::IQ4_XS | GgmlType::Q6_K if n >= 8 => Tolerance::MATMUL,
        GgmlType::Q6_K => Tolerance::GGML_STEPS,
        GgmlType::Q4_K if n == 1 && rows.is_multiple_of(8) => Tolerance::GGML_STEPS,
        GgmlType::Q8_0
        | GgmlType::IQ4_XS
        | GgmlType::IQ4_NL
        | GgmlType::F32
        | GgmlType::F16
        | GgmlType::BF16 => Tolerance::GGML_STEPS,
        _ => Tolerance::MATMUL,
    }
}

fn expert_products(
    ops: &dyn Ops,
    report: &mut Report,
    rng: &mut Rng,
    staging: Staging<'_>,
    ty: GgmlType,
    (ne0, rows, n_expert): (usize, usize, usize),
    back: &dyn Fn(Result<DeviceTensor, OpError>) -> Result<Vec<f32>, OpError>,
) {
    let (weight, bytes) = random_owned_weight(rng, ty, "exps", &[ne0, rows, n_expert]);
    let Some(resident) = staged_or_reported(report, "matmul_id", &weight, staging) else {
        return;
    };
    let k = 3;
    let all_ids = [3, 0, 2, 1, 3, 3];
    let row_bytes = ty.row_bytes(ne0 as u64).unwrap_or(0) as usize;
    // Two tokens (a prefill's products, a repeated expert among them),
    // then one (a decode step's, which a device may run apart). The one
    // token's inputs come from a stream of their own, so that the checks
    // after these see the inputs they always saw.
    let mut one_token_rng = Rng::new(0xDEC0DE ^ ne0 as u64);
    for (n, per_pick) in [(2, false), (2, true), (1, false), (1, true)] {
        let ids = &all_ids[..n * k];
        let xrows = if per_pick { n * k } else { n };
        let source = if n == 1 {
            &mut one_token_rng
        } else {
            &mut *rng
        };
        let x = source.values(xrows * ne0, -2.0, 2.0);
        let dims = crate::ExpertDims {
            n,
            k,
            rows,
            n_expert,
            per_pick,
        };
        let want = reference::matmul_id(ty, &bytes, ne0, row_bytes, &dims, &x, ids, weight.name());
        let got = ops.upload_f32(&x, &[xrows, ne0]).and_then(|xt| {
            let it = ops.upload_i32(ids, &[n, k])?;
            back(ops.matmul_id(&weight, &resident, &xt, &it))
        });
        report.push(
            "matmul_id",
            format!("{ty} [{ne0}, {rows}, {n_expert}] x [{xrows}, {ne0}] ids {ids:?}"),
            // Fewer than 8 tokens pick an expert: one token's sums.
            matmul_tolerance(ty, 1, rows),
            score(got, want),
        );
    }
    let r = ops
        .upload_f32(&vec![0.0; 4 * ne0], &[4, ne0])
        .and_then(|xt| {
            let it = ops.upload_i32(&all_ids, &[2, k])?;
            ops.matmul_id(&weight, &resident, &xt, &it)
        });
    report.push(
        "matmul_id",
        format!("{ty}: 4 input rows for 2 tokens of 3 picks refused"),
        0.0,
        refused(r, |e| matches!(e, OpError::Shape { what: "x", .. })),
    );
}

/// The check's read-backs, counted.
struct Io<'a> {
    back: &'a dyn Fn(Result<DeviceTensor, OpError>) -> Result<Vec<f32>, OpError>,
    back_ref: &'a dyn Fn(&DeviceTensor) -> Result<Vec<f32>, OpError>,
    back_i32: &'a dyn Fn(&DeviceTensor) -> Result<Vec<i32>, OpError>,
}

/// Attention over heads of 45 (a whole 32 and 13 more: ggml's dots add
/// the leftovers apart, `dot_f32` a run of 8, one of 4 and one by fma,
/// `dot_f16` in f64) and 37 slots (padded to 64), 4 query heads over 2
/// K/V heads, causal rows at 35 and 36; from a stream of its own, so the
/// later cases' inputs stay as they were.
fn attention_dot_leftovers(ops: &dyn Ops, report: &mut Report, io: &Io<'_>, dtype: DType) {
    let mut rng = Rng::new(0x1EF7 ^ dtype as u64);
    let (dk, n_head, n_head_kv, n_kv, n_q) = (45, 4, 2, 37, 2);
    let spec = KvSpec {
        n_ctx: 40,
        n_head_kv,
        head_dim_k: dk,
        head_dim_v: dk,
        dtype,
    };
    let w = n_head_kv * dk;
    let k = rng.values(n_kv * w, -1.5, 1.5);
    let v = rng.values(n_kv * w, -2.0, 2.0);
    let q = rng.values(n_q * n_head * dk, -1.0, 1.0);
    let shape = family_ops::AttentionShape {
        n_head,
        n_head_kv,
        head_dim_k: dk,
        head_dim_v: dk,
    };
    let scores = Scores::scale(0.15);
    let hmask = HostAttnMask::Causal { pos0: n_kv - n_q };
    let (host_k, host_v) = (
        reference::kv_stored(dtype, &k),
        reference::kv_stored(dtype, &v),
    );
    let want = reference::attention(&q, &host_k, &host_v, n_kv, &shape, &scores, hmask, dtype);
    let got = KvCache::new(ops, spec).and_then(|mut cache| {
        let kt = ops.upload_f32(&k, &[n_kv, w])?;
        let vt = ops.upload_f32(&v, &[n_kv, w])?;
        cache.append(ops, &kt, &vt)?;
        let qt = ops.upload_f32(&q, &[n_q, n_head * dk])?;
        let attn = Attention {
            n_head,
            scores,
            mask: AttnMask::Causal { pos0: n_kv - n_q },
        };
        (io.back)(ops.attention(&qt, &cache, &attn))
    });
    report.push(
        "attention",
        format!("q [{n_q}, {n_head}x{dk}] over {n_kv} {dtype:?} slots, gqa 2, causal"),
        Tolerance::GGML_STEPS,
        score(got, want),
    );
}

/// `x` as f32 values, to score ids exactly with [`nmse`].
fn as_f32(ids: &[i32]) -> Vec<f32> {
    ids.iter().map(|&i| i as f32).collect()
}

/// A KV cache of `dtype` filled by appends of 5, 1 and 3 positions, its
/// rows checked (F32; an F16 cache's length), then attention of query rows
/// over it with every mask, GQA and a softcap; the refusals (F32).
///
/// An F16 cache's reference attends over the values rounded as the cache
/// stores them ([`reference::kv_stored`]); each F16 case also checks that
/// the rounding moves the reference's output by more than the tolerance
/// (so a device that kept the f32 values fails it).
fn kv_attention(ops: &dyn Ops, report: &mut Report, rng: &mut Rng, io: &Io<'_>, dtype: DType) {
    let spec = KvSpec {
        n_ctx: 16,
        n_head_kv: 2,
        head_dim_k: 32,
        head_dim_v: 24,
        dtype,
    };
    let (kw, vw) = (2 * 32, 2 * 24);
    let n_head = 6;
    let mut cache = match KvCache::new(ops, spec) {
        Ok(c) => c,
        Err(e) => {
            report.push("kv_cache", "new".into(), 0.0, Err(e.to_string()));
            return;
        }
    };
    let mut host_k = vec![0f32; spec.n_ctx * kw];
    let mut host_v = vec![0f32; spec.n_ctx * vw];
    // The values appended, unrounded.
    let (mut raw_k, mut raw_v) = (host_k.clone(), host_v.clone());
    let mut at = 0;
    for n in [5usize, 1, 3] {
        let k = rng.values(n * kw, -1.5, 1.5);
        let v = rng.values(n * vw, -2.0, 2.0);
        let r = ops.upload_f32(&k, &[n, kw]).and_then(|kt| {
            let vt = ops.upload_f32(&v, &[n, vw])?;
            cache.append(ops, &kt, &vt)
        });
        host_k[at * kw..(at + n) * kw].copy_from_slice(&reference::kv_stored(dtype, &k));
        host_v[at * vw..(at + n) * vw].copy_from_slice(&reference::kv_stored(dtype, &v));
        raw_k[at * kw..(at + n) * kw].copy_from_slice(&k);
        raw_v[at * vw..(at + n) * vw].copy_from_slice(&v);
        at += n;
        if dtype != DType::F32 {
            // The rows are F16 (no f32 read-back): attention checks them.
            let len_ok = match r {
                Err(e) => Err(e.to_string()),
                Ok(()) if cache.len() == at => Ok(0.0),
                Ok(()) => Err(format!("len {} after appending {at}", cache.len())),
            };
            report.push(
                "kv_append",
                format!("{n} rows at {} of {spec:?} (its length)", at - n),
                Tolerance::EXACT,
                len_ok,
            );
            continue;
        }
        let got = r.and_then(|()| {
            let mut both = (io.back_ref)(cache.k())?;
            both.extend((io.back_ref)(cache.v())?);
            Ok(both)
        });
        let mut want = host_k.clone();
        want.extend(&host_v);
        let len_ok = if cache.len() == at {
            score(got, Ok(want))
        } else {
            Err(format!("len {} after appending {at}", cache.len()))
        };
        report.push(
            "kv_append",
            format!("{n} rows at {} of {spec:?}", at - n),
            Tolerance::EXACT,
            len_ok,
        );
    }
    // Room for more slots: the cache doubles, every row copied as stored
    // (an F16 cache's halves as they are); the attention below reads the
    // grown cache.
    let grown = cache
        .reserve(ops, spec.n_ctx + 1)
        .map_err(|e| e.to_string());
    report.push(
        "kv_reserve",
        format!("{spec:?} to {} slots", 2 * spec.n_ctx),
        Tolerance::EXACT,
        grown.and_then(|()| {
            if cache.len() == at && cache.spec().n_ctx == 2 * spec.n_ctx {
                Ok(0.0)
            } else {
                Err(format!(
                    "len {} of {} slots",
                    cache.len(),
                    cache.spec().n_ctx
                ))
            }
        }),
    );
    let n_kv = at;
    let scale = 1.0 / (spec.head_dim_k as f32).sqrt();
    let shape = cache.shape(n_head);
    let n_q = 3;
    let q = rng.values(n_q * n_head * spec.head_dim_k, -2.0, 2.0);
    let mut add1: Vec<f32> = rng.values(n_kv, -1.0, 1.0);
    add1[2] = f32::NEG_INFINITY;
    add1[7] = f32::NEG_INFINITY;
    // Row 1 sees nothing: zeros.
    let add3: Vec<f32> = (0..n_q * n_kv)
        .map(|i| match (i / n_kv, i % n_kv) {
            (1, _) => f32::NEG_INFINITY,
            (r, j) if j > 4 + 2 * r => f32::NEG_INFINITY,
            (_, j) => (j as f32) * -0.25,
        })
        .collect();
    let plain = Scores::scale(scale);
    let capped = Scores {
        scale,
        softcap: Some(0.75),
    };
    let cases: [(&str, Scores, HostAttnMask<'_>); 7] = [
        ("all", plain, HostAttnMask::All),
        ("causal pos0 6", plain, HostAttnMask::Causal { pos0: 6 }),
        ("causal pos0 2", plain, HostAttnMask::Causal { pos0: 2 }),
        (
            "window 3 pos0 6",
            plain,
            HostAttnMask::SlidingWindow { pos0: 6, window: 3 },
        ),
        (
            "additive [1, 9]",
            plain,
            HostAttnMask::Additive {
                mask: &add1,
                rows: 1,
            },
        ),
        (
            "additive [3, 9], a row all -inf",
            plain,
            HostAttnMask::Additive {
                mask: &add3,
                rows: 3,
            },
        ),
        (
            "softcap 0.75 causal pos0 6",
            capped,
            HostAttnMask::Causal { pos0: 6 },
        ),
    ];
    // Whether the cache's rounding shows in the reference's output.
    let tells_rounding = |want: &Result<Vec<f32>, OpError>,
                          scores: &Scores,
                          q: &[f32],
                          hmask: HostAttnMask<'_>|
     -> Result<(), String> {
        if dtype == DType::F32 {
            return Ok(());
        }
        let raw = reference::attention(q, &raw_k, &raw_v, n_kv, &shape, scores, hmask, DType::F32);
        match (want, raw) {
            (Ok(w), Ok(r)) if nmse(&r, w) > 100.0 * Tolerance::ATTENTION => Ok(()),
            (Ok(w), Ok(r)) => Err(format!(
                "the {dtype:?} rounding moves the reference by an NMSE of only {:e}",
                nmse(&r, w)
            )),
            _ => Ok(()),
        }
    };
    for (name, scores, hmask) in cases {
        let want = reference::attention(&q, &host_k, &host_v, n_kv, &shape, &scores, hmask, dtype);
        let visible = tells_rounding(&want, &scores, &q, hmask);
        let got = ops
            .upload_f32(&q, &[n_q, n_head * spec.head_dim_k])
            .and_then(|qt| {
                let mt = match hmask {
                    HostAttnMask::Additive { mask, rows } => {
                        Some(ops.upload_f32(mask, &[rows, n_kv])?)
                    }
                    _ => None,
                };
                let mask = match (hmask, &mt) {
                    (HostAttnMask::Causal { pos0 }, _) => AttnMask::Causal { pos0 },
                    (HostAttnMask::SlidingWindow { pos0, window }, _) => {
                        AttnMask::SlidingWindow { pos0, window }
                    }
                    (_, Some(m)) => AttnMask::Additive(m),
                    _ => AttnMask::All,
                };
                let attn = Attention {
                    n_head,
                    scores,
                    mask,
                };
                (io.back)(ops.attention(&qt, &cache, &attn))
            });
        report.push(
            "attention",
            format!("q [{n_q}, {n_head}x32] over {n_kv} {dtype:?} slots, gqa 3, {name}"),
            if scores.softcap.is_some() {
                Tolerance::ATTENTION
            } else {
                Tolerance::GGML_STEPS
            },
            visible.and_then(|()| score(got, want)),
        );
    }
    // One decode row, the last position.
    let q1 = &q[..n_head * spec.head_dim_k];
    let want = reference::attention(
        q1,
        &host_k,
        &host_v,
        n_kv,
        &shape,
        &plain,
        HostAttnMask::Causal { pos0: n_kv - 1 },
        dtype,
    );
    let visible = tells_rounding(&want, &plain, q1, HostAttnMask::Causal { pos0: n_kv - 1 });
    let got = ops.upload_f32(q1, &[1, q1.len()]).and_then(|qt| {
        let attn = Attention {
            n_head,
            scores: plain,
            mask: AttnMask::Causal { pos0: n_kv - 1 },
        };
        (io.back)(ops.attention(&qt, &cache, &attn))
    });
    report.push(
        "attention",
        format!(
            "one decode row at position {} of a {dtype:?} cache",
            n_kv - 1
        ),
        Tolerance::GGML_STEPS,
        visible.and_then(|()| score(got, want)),
    );
    if dtype != DType::F32 {
        return;
    }

    // Refusals.
    let r = KvCache::new(
        ops,
        KvSpec {
            dtype: DType::I32,
            ..spec
        },
    )
    // A cache made is no refusal: any tensor stands for it.
    .and_then(|_| ops.upload_f32(&[0.0], &[1]));
    report.push(
        "kv_cache",
        "an I32 cache refused".into(),
        0.0,
        refused(r, |e| matches!(e, OpError::DType { what: "cache", .. })),
    );
    // One row more than the (grown) cache has room for.
    let past = cache.spec().n_ctx - n_kv + 1;
    let r = ops
        .upload_f32(&vec![0.0; past * kw], &[past, kw])
        .and_then(|kt| {
            let vt = ops.upload_f32(&vec![0.0; past * vw], &[past, vw])?;
            cache.append(ops, &kt, &vt)?;
            Ok(kt)
        });
    let kept = cache.len() == n_kv;
    report.push(
        "kv_append",
        format!(
            "{past} rows past {} of {} refused, the cache kept",
            n_kv,
            cache.spec().n_ctx
        ),
        0.0,
        refused(r, |e| matches!(e, OpError::Shape { .. })).and_then(|v| {
            if kept {
                Ok(v)
            } else {
                Err(format!("len {} after a refused append", cache.len()))
            }
        }),
    );
    let attn = |n_head, mask| Attention {
        n_head,
        scores: plain,
        mask,
    };
    let r = ops
        .upload_f32(&q[..4 * 32], &[1, 4 * 32])
        .and_then(|qt| ops.attention(&qt, &cache, &attn(4, AttnMask::All)))
        .and_then(|_| {
            let qt = ops.upload_f32(&q[..5 * 32], &[1, 5 * 32])?;
            ops.attention(&qt, &cache, &attn(5, AttnMask::All))
        });
    report.push(
        "attention",
        "5 query heads over 2 K/V heads refused".into(),
        0.0,
        refused(r, |e| matches!(e, OpError::Invalid { .. })),
    );
    let r = ops
        .upload_f32(&q[..n_head * 31], &[1, n_head * 31])
        .and_then(|qt| ops.attention(&qt, &cache, &attn(n_head, AttnMask::All)));
    report.push(
        "attention",
        "q rows of another head size refused".into(),
        0.0,
        refused(r, |e| matches!(e, OpError::Shape { what: "q", .. })),
    );
    let r = ops.upload_f32(&q, &[n_q, n_head * 32]).and_then(|qt| {
        let m = ops.upload_f32(&add1[..n_kv - 1], &[1, n_kv - 1])?;
        let a = Attention {
            n_head,
            scores: plain,
            mask: AttnMask::Additive(&m),
        };
        ops.attention(&qt, &cache, &a)
    });
    report.push(
        "attention",
        "a mask of another width than the filled slots refused".into(),
        0.0,
        refused(r, |e| matches!(e, OpError::Shape { what: "mask", .. })),
    );
}

/// Routing where equal selection scores straddle the `k`-th place: the
/// device must pick llama.cpp's experts (libstdc++'s heap-select members,
/// `TieOrder::Libstdcxx`), which are not the lower indices. Each case first
/// checks that the two rules do pick differently there (so a device on
/// the lower-index rule fails it); the tied experts have equal weights, so
/// only the ids tell the rules apart.
fn route_ties(ops: &dyn Ops, report: &mut Report, io: &Io<'_>) {
    let ninf = f32::NEG_INFINITY;
    let mut tied_after = vec![0.2f32; 10];
    tied_after.extend([0.5; 3]);
    tied_after.extend([0.1; 3]);
    let mut lift = vec![0f32; 12];
    lift.extend([0.5; 4]);
    /// One row's routing.
    struct TieCase {
        name: &'static str,
        logits: Vec<f32>,
        bias: Option<Vec<f32>>,
        gating: Gating,
        k: usize,
        normalize: bool,
        scale: f32,
    }
    // The first is a row of qwen4_exp's `top_k_tie_order` oracle test.
    let cases = [
        TieCase {
            name: "8 tied, 2 higher, k 7, softmax norm",
            logits: [[1.0f32; 8].as_slice(), &[5.0, 5.0, ninf]].concat(),
            bias: None,
            gating: Gating::Softmax,
            k: 7,
            normalize: true,
            scale: 1.0,
        },
        TieCase {
            name: "10 tied before 3 higher, k 6, sigmoid",
            logits: tied_after,
            bias: None,
            gating: Gating::Sigmoid,
            k: 6,
            normalize: false,
            scale: 1.0,
        },
        TieCase {
            name: "equal logits, a bias lifting the last 4, k 6, sigmoid norm x2.5",
            logits: vec![0.0; 16],
            bias: Some(lift),
            gating: Gating::Sigmoid,
            k: 6,
            normalize: true,
            scale: 2.5,
        },
    ];
    for c in cases {
        let TieCase {
            name,
            logits,
            bias,
            gating,
            k,
            normalize,
            scale,
        } = c;
        let n_expert = logits.len();
        let host = family_ops::Routing {
            gating,
            k,
            bias: bias.as_deref(),
            normalize,
            scale,
        };
        let want = reference::route(&logits, n_expert, &host);
        let lower =
            reference::route_with(&logits, n_expert, &host, family_ops::TieOrder::LowerIndex);
        let got = ops.upload_f32(&logits, &[1, n_expert]).and_then(|lt| {
            let bt = bias
                .as_deref()
                .map(|b| ops.upload_f32(b, &[n_expert]))
                .transpose()?;
            let routing = DeviceRouting {
                gating,
                k,
                bias: bt.as_ref(),
                normalize,
                scale,
            };
            let (ids, w) = ops.route(&lt, &routing)?;
            Ok(((io.back_i32)(&ids)?, (io.back)(Ok(w))?))
        });
        let case = match (got, want, lower) {
            (_, Err(e), _) | (_, _, Err(e)) => Err(format!("the reference failed: {e}")),
            (_, Ok((wi, _)), Ok((li, _))) if wi == li => {
                Err(format!("not a tie case: both rules pick {wi:?}"))
            }
            (Err(e), _, _) => Err(e.to_string()),
            (Ok((gi, gw)), Ok((wi, ww)), _) => {
                if gi == wi {
                    Ok(nmse(&gw, &ww))
                } else {
                    Err(format!("ids {gi:?}, llama.cpp's {wi:?}"))
                }
            }
        };
        report.push(
            "route",
            format!("ties across the k-th place [1, {n_expert}] {name}"),
            Tolerance::ROUTE,
            case,
        );
    }
}

/// Top-k routing with every gating, a bias, ties; argmax with ties and NaN.
fn routing(ops: &dyn Ops, report: &mut Report, rng: &mut Rng, io: &Io<'_>) {
    let (rows, n_expert) = (4, 64);
    let mut logits = rng.values(rows * n_expert, -4.0, 4.0);
    for r in 0..rows {
        // Ties at the top (experts 10 and 20, and 41 = 3 in row 3), and in
        // the middle.
        let row = &mut logits[r * n_expert..(r + 1) * n_expert];
        row[10] = 4.5;
        row[20] = 4.5;
        row[33] = row[5];
        if r == 3 {
            row[3] = 4.5;
        }
    }
    let mut bias = rng.values(n_expert, -0.1, 0.1);
    // The bias keeps the top tie a tie.
    bias[20] = bias[10];
    bias[3] = bias[10];
    let cases: [(&str, Gating, usize, bool, bool, f32); 5] = [
        ("softmax k 8 norm", Gating::Softmax, 8, false, true, 1.0),
        ("softmax k 4", Gating::Softmax, 4, false, false, 1.0),
        (
            "sigmoid k 8 bias norm x2.5",
            Gating::Sigmoid,
            8,
            true,
            true,
            2.5,
        ),
        ("sigmoid k 6", Gating::Sigmoid, 6, false, false, 1.0),
        ("softmax k 64 bias", Gating::Softmax, 64, true, false, 0.5),
    ];
    for (name, gating, k, with_bias, normalize, scale) in cases {
        let host = family_ops::Routing {
            gating,
            k,
            bias: with_bias.then_some(bias.as_slice()),
            normalize,
            scale,
        };
        let want = reference::route(&logits, n_expert, &host);
        let got = ops.upload_f32(&logits, &[rows, n_expert]).and_then(|lt| {
            let bt = ops.upload_f32(&bias, &[n_expert])?;
            let routing = DeviceRouting {
                gating,
                k,
                bias: with_bias.then_some(&bt),
                normalize,
                scale,
            };
            let (ids, w) = ops.route(&lt, &routing)?;
            Ok(((io.back_i32)(&ids)?, (io.back)(Ok(w))?))
        });
        let (got_ids, got_w) = match got {
            Ok((i, w)) => (Ok(as_f32(&i)), Ok(w)),
            Err(e) => (Err(e.to_string()), Err(e)),
        };
        let want_ids = want
            .as_ref()
            .map(|(i, _)| as_f32(i))
            .map_err(|e| e.to_string());
        let ids_case = match (got_ids, want_ids) {
            (Ok(g), Ok(w)) => Ok(nmse(&g, &w)),
            (Err(e), _) => Err(e),
            (_, Err(e)) => Err(format!("the reference failed: {e}")),
        };
        report.push(
            "route",
            format!("ids [{rows}, {n_expert}] {name}"),
            Tolerance::EXACT,
            ids_case,
        );
        report.push(
            "route",
            format!("weights [{rows}, {n_expert}] {name}"),
            Tolerance::ROUTE,
            score(got_w, want.map(|(_, w)| w)),
        );
    }
    route_ties(ops, report, io);
    let r = ops.upload_f32(&logits, &[rows, n_expert]).and_then(|lt| {
        let routing = DeviceRouting {
            gating: Gating::Softmax,
            k: n_expert + 1,
            bias: None,
            normalize: false,
            scale: 1.0,
        };
        ops.route(&lt, &routing).map(|(i, _)| i)
    });
    report.push(
        "route",
        "k past the experts refused".into(),
        0.0,
        refused(r, |e| matches!(e, OpError::Invalid { .. })),
    );
    let r = ops.upload_f32(&logits, &[rows, n_expert]).and_then(|lt| {
        let bt = ops.upload_f32(&bias[1..], &[n_expert - 1])?;
        let routing = DeviceRouting {
            gating: Gating::Sigmoid,
            k: 2,
            bias: Some(&bt),
            normalize: false,
            scale: 1.0,
        };
        ops.route(&lt, &routing).map(|(i, _)| i)
    });
    report.push(
        "route",
        "a bias of another width refused".into(),
        0.0,
        refused(r, |e| matches!(e, OpError::Shape { what: "bias", .. })),
    );

    // The mix of expert outputs (the picks' weights of a route), and a
    // shared expert's gate (k = 1).
    for (n, k, cols) in [(3, 8, 300), (2, 1, 40)] {
        let y = rng.values(n * k * cols, -3.0, 3.0);
        let w = rng.values(n * k, 0.0, 1.0);
        let got = ops.upload_f32(&y, &[n, k, cols]).and_then(|yt| {
            let wt = ops.upload_f32(&w, &[n, k])?;
            (io.back)(ops.mix_experts(&yt, &wt))
        });
        report.push(
            "mix_experts",
            format!("y [{n}, {k}, {cols}] by w [{n}, {k}]"),
            Tolerance::GGML_STEPS,
            score(got, reference::mix_experts(&y, &w, n, k, cols)),
        );
    }
    let r = ops.upload_f32(&[0.0; 24], &[2, 3, 4]).and_then(|yt| {
        let wt = ops.upload_f32(&[0.0; 3], &[1, 3])?;
        ops.mix_experts(&yt, &wt)
    });
    report.push(
        "mix_experts",
        "weights of another token count refused".into(),
        0.0,
        refused(r, |e| matches!(e, OpError::Shape { what: "w", .. })),
    );

    // A hyper-connection's combine (r plus the outer product of the
    // streams' weights and a layer's output) and its gated mean of the
    // streams.
    for (m, n) in [(4usize, 300usize), (1, 7)] {
        let r = rng.values(m * n, -3.0, 3.0);
        let s = rng.values(m, -2.0, 2.0);
        let y = rng.values(n, -3.0, 3.0);
        for factor in [
            OuterFactor::Plain,
            OuterFactor::Sigmoid {
                pre: 0.25,
                post: 2.0,
            },
        ] {
            let got = ops.upload_f32(&r, &[m, n]).and_then(|rt| {
                let st = ops.upload_f32(&s, &[1, m])?;
                let yt = ops.upload_f32(&y, &[1, n])?;
                (io.back)(ops.add_outer(&rt, &st, &yt, factor))
            });
            report.push(
                "add_outer",
                format!("r [{m}, {n}] + {factor:?}(s [1, {m}]) x y [1, {n}]"),
                Tolerance::GGML_STEPS_LIBM_TAIL,
                score(got, Ok(reference::add_outer(&r, &s, &y, factor))),
            );
        }
        let g = rng.values(m * n, -6.0, 6.0);
        let got = ops.upload_f32(&r, &[m, n]).and_then(|xt| {
            let gt = ops.upload_f32(&g, &[1, m * n])?;
            (io.back)(ops.gated_mean_rows(&xt, &gt))
        });
        report.push(
            "gated_mean_rows",
            format!("x [{m}, {n}] gated by [1, {}]", m * n),
            Tolerance::GGML_STEPS_LIBM_TAIL,
            score(got, reference::gated_mean_rows(&r, &g, m, n)),
        );
    }
    let r = ops.upload_f32(&[0.0; 12], &[3, 4]).and_then(|rt| {
        let st = ops.upload_f32(&[0.0; 4], &[4])?;
        let yt = ops.upload_f32(&[0.0; 4], &[4])?;
        ops.add_outer(&rt, &st, &yt, OuterFactor::Plain)
    });
    report.push(
        "add_outer",
        "4 weights for 3 rows refused".into(),
        0.0,
        refused(r, |e| matches!(e, OpError::Shape { what: "s", .. })),
    );
    let r = ops.upload_f32(&[0.0; 12], &[3, 4]).and_then(|xt| {
        let gt = ops.upload_f32(&[0.0; 11], &[11])?;
        ops.gated_mean_rows(&xt, &gt)
    });
    report.push(
        "gated_mean_rows",
        "11 gates for 12 values refused".into(),
        0.0,
        refused(r, |e| matches!(e, OpError::Shape { what: "g", .. })),
    );

    // Rows of a device table by device-side ids (a per-expert scale by a
    // route's picks), and a table of rows of one value.
    for (rows, cols, ids) in [
        (9usize, 5usize, vec![3i32, 0, 8, 3, 1, 7]),
        (512, 1, vec![511, 0, 77, 300, 2]),
    ] {
        let table = rng.values(rows * cols, -2.0, 2.0);
        let shape = [rows, cols];
        let id_shape = [2, ids.len() / 2];
        let got = ops.upload_f32(&table, &shape).and_then(|tt| {
            let it = ops.upload_i32(&ids[..2 * id_shape[1]], &id_shape)?;
            (io.back)(ops.gather_rows(&tt, &it))
        });
        report.push(
            "gather_rows",
            format!("{id_shape:?} ids of a table {shape:?}"),
            Tolerance::EXACT,
            score(
                got,
                reference::gather_rows(&table, rows, cols, &ids[..2 * id_shape[1]]),
            ),
        );
    }
    let r = ops.upload_f32(&[0.0; 6], &[2, 3]).and_then(|tt| {
        let it = ops.upload_f32(&[0.0; 2], &[2])?;
        ops.gather_rows(&tt, &it)
    });
    report.push(
        "gather_rows",
        "F32 ids refused".into(),
        0.0,
        refused(r, |e| matches!(e, OpError::DType { .. })),
    );

    // Argmax: ties, a NaN first (it wins), a NaN later (it never does),
    // +0 and -0.
    let (rows, cols) = (6, 1000);
    let mut x = rng.values(rows * cols, -10.0, 10.0);
    x[cols + 300] = 11.0;
    x[cols + 700] = 11.0;
    x[2 * cols..3 * cols].fill(1.5);
    x[3 * cols] = f32::NAN;
    x[4 * cols + 17] = f32::NAN;
    x[5 * cols..6 * cols].fill(-1.0);
    x[5 * cols + 40] = -0.0;
    x[5 * cols + 41] = 0.0;
    let want = reference::argmax(&x, rows, cols);
    let got = ops
        .upload_f32(&x, &[rows, cols])
        .and_then(|t| (io.back_i32)(&ops.argmax(&t)?));
    report.push(
        "argmax",
        format!("[{rows}, {cols}] ties, NaN, signed zeros"),
        Tolerance::EXACT,
        got.map(|g| nmse(&as_f32(&g), &as_f32(&want)))
            .map_err(|e| e.to_string()),
    );
    let r = ops.upload_i32(&[1, 2], &[2]).and_then(|t| ops.argmax(&t));
    report.push(
        "argmax",
        "an I32 tensor refused".into(),
        0.0,
        refused(r, |e| matches!(e, OpError::DType { .. })),
    );
}

/// qwen4exp's conv and delta rule over two calls (the state carried), the
/// outputs and the states checked; the refusals.
fn gated_delta_net(ops: &dyn Ops, report: &mut Report, rng: &mut Rng, io: &Io<'_>) {
    // The conv: 40 channels, d_conv 4, a random state, 5 tokens then 1.
    let (channels, d_conv) = (40, 4);
    let w = rng.values(channels * d_conv, -1.0, 1.0);
    let mut host_state = rng.values((d_conv - 1) * channels, -2.0, 2.0);
    let state = ops.upload_f32(&host_state, &[d_conv - 1, channels]);
    let wt = ops.upload_f32(&w, &[channels, d_conv]);
    match (state, wt) {
        (Ok(mut st), Ok(wt)) => {
            for n in [5usize, 1] {
                let x = rng.values(n * channels, -3.0, 3.0);
                let want = reference::ssm_conv(&mut host_state, &x, channels, &w);
                let got = ops
                    .upload_f32(&x, &[n, channels])
                    .and_then(|xt| (io.back)(ops.ssm_conv(&mut st, &xt, &wt)));
                report.push(
                    "ssm_conv",
                    format!("[{n}, {channels}] d_conv {d_conv}"),
                    Tolerance::GDN,
                    score(got, want),
                );
                let got = (io.back_ref)(&st);
                report.push(
                    "ssm_conv",
                    format!("state after [{n}, {channels}]"),
                    Tolerance::EXACT,
                    score(got, Ok(host_state.clone())),
                );
            }
            let r = ops
                .upload_f32(&vec![0.0; channels], &[1, channels])
                .and_then(|xt| {
                    let mut bad = ops.zeros(DType::F32, &[d_conv, channels])?;
                    ops.ssm_conv(&mut bad, &xt, &wt)
                });
            report.push(
                "ssm_conv",
                "a state of d_conv rows refused".into(),
                0.0,
                refused(r, |e| matches!(e, OpError::Shape { what: "state", .. })),
            );
        }
        (Err(e), _) | (_, Err(e)) => {
            report.push("ssm_conv", "upload".into(), 0.0, Err(e.to_string()));
        }
    }

    // The delta rule: 2 Q/K heads, 4 V heads of 16, 3 tokens then 1.
    let (hk, hv, s) = (2, 4, 16);
    let mut host_state = rng.values(hv * s * s, -0.5, 0.5);
    let mut st = match ops.upload_f32(&host_state, &[hv, s, s]) {
        Ok(t) => t,
        Err(e) => {
            report.push("delta_net", "upload".into(), 0.0, Err(e.to_string()));
            return;
        }
    };
    let l2 = |x: Vec<f32>| -> Vec<f32> {
        x.chunks_exact(s)
            .flat_map(|h| {
                let n = h.iter().map(|v| v * v).sum::<f32>().sqrt() + 1e-6;
                h.iter().map(move |v| v / n).collect::<Vec<_>>()
            })
            .collect()
    };
    for n in [3usize, 1] {
        let q = l2(rng.values(n * hk * s, -1.0, 1.0));
        let k = l2(rng.values(n * hk * s, -1.0, 1.0));
        let v = rng.values(n * hv * s, -2.0, 2.0);
        let g = rng.values(n * hv, -1.5, 0.0);
        let beta = rng.values(n * hv, 0.05, 0.95);
        let dims = DeltaNetDims {
            n,
            s,
            n_k_heads: hk,
            n_v_heads: hv,
            gate: crate::DeltaGate::PerHead,
        };
        let want = reference::delta_net(&mut host_state, [&q, &k, &v], &g, &beta, &dims);
        let got = (|| {
            let qt = ops.upload_f32(&q, &[n, hk * s])?;
            let kt = ops.upload_f32(&k, &[n, hk * s])?;
            let vt = ops.upload_f32(&v, &[n, hv * s])?;
            let gt = ops.upload_f32(&g, &[n, hv])?;
            let bt = ops.upload_f32(&beta, &[n, hv])?;
            (io.back)(ops.delta_net(&mut st, [&qt, &kt, &vt], &gt, &bt))
        })();
        report.push(
            "delta_net",
            format!("{n} tokens, {hk} q/k heads, {hv} v heads of {s}"),
            Tolerance::GDN,
            score(got, want),
        );
        report.push(
            "delta_net",
            format!("state after {n} tokens"),
            Tolerance::GDN,
            score((io.back_ref)(&st), Ok(host_state.clone())),
        );
    }
    let r = (|| {
        let qt = ops.upload_f32(&vec![0.0; 3 * s], &[1, 3 * s])?;
        let vt = ops.upload_f32(&vec![0.0; hv * s], &[1, hv * s])?;
        let gt = ops.upload_f32(&vec![0.0; hv], &[1, hv])?;
        ops.delta_net(&mut st, [&qt, &qt, &vt], &gt, &gt)
    })();
    report.push(
        "delta_net",
        "3 q/k heads for 4 v heads refused".into(),
        0.0,
        refused(r, |e| matches!(e, OpError::Shape { what: "q", .. })),
    );
    let r = (|| {
        let qt = ops.upload_f32(&vec![0.0; hk * s], &[1, hk * s])?;
        let vt = ops.upload_f32(&vec![0.0; hv * s], &[1, hv * s])?;
        let gt = ops.upload_f32(&vec![0.0; hv], &[1, hv])?;
        let mut bad = ops.zeros(DType::F32, &[hv, s, s + 1])?;
        ops.delta_net(&mut bad, [&qt, &qt, &vt], &gt, &gt)
    })();
    report.push(
        "delta_net",
        "a state that is not square refused".into(),
        0.0,
        refused(r, |e| matches!(e, OpError::Shape { what: "state", .. })),
    );
}

/// The sequence ops at shapes wider than a block of threads (a device's
/// strided loops and block reductions over several warps and blocks): a
/// cache of 520 filled slots, 512 experts, 600 channels, heads of 128.
fn wide_shapes(ops: &dyn Ops, report: &mut Report, rng: &mut Rng, io: &Io<'_>) {
    // Attention: 16 query heads over 4 K/V heads of 64, 520 slots.
    let spec = KvSpec {
        n_ctx: 600,
        n_head_kv: 4,
        head_dim_k: 64,
        head_dim_v: 64,
        dtype: DType::F32,
    };
    let (w, n_head, n_q) = (4 * 64, 16, 2);
    let k = rng.values(520 * w, -1.0, 1.0);
    let v = rng.values(520 * w, -1.0, 1.0);
    let q = rng.values(n_q * n_head * 64, -1.0, 1.0);
    let shape = family_ops::AttentionShape {
        n_head,
        n_head_kv: 4,
        head_dim_k: 64,
        head_dim_v: 64,
    };
    let scores = Scores::scale(0.125);
    let cache = KvCache::new(ops, spec).and_then(|mut c| {
        for (a, b) in [(0, 512), (512, 520)] {
            let kt = ops.upload_f32(&k[a * w..b * w], &[b - a, w])?;
            let vt = ops.upload_f32(&v[a * w..b * w], &[b - a, w])?;
            c.append(ops, &kt, &vt)?;
        }
        Ok(c)
    });
    for (name, hmask, mask) in [
        (
            "causal pos0 518",
            HostAttnMask::Causal { pos0: 518 },
            AttnMask::Causal { pos0: 518 },
        ),
        (
            "window 128 pos0 400",
            HostAttnMask::SlidingWindow {
                pos0: 400,
                window: 128,
            },
            AttnMask::SlidingWindow {
                pos0: 400,
                window: 128,
            },
        ),
    ] {
        let want = reference::attention(&q, &k, &v, 520, &shape, &scores, hmask, DType::F32);
        let got = match &cache {
            Ok(c) => ops.upload_f32(&q, &[n_q, n_head * 64]).and_then(|qt| {
                let attn = Attention {
                    n_head,
                    scores,
                    mask,
                };
                (io.back)(ops.attention(&qt, c, &attn))
            }),
            Err(e) => Err(OpError::Invalid {
                op: "kv_cache",
                why: e.to_string(),
            }),
        };
        report.push(
            "attention",
            format!("q [{n_q}, 16x64] over 520 slots, gqa 4, {name}"),
            if scores.softcap.is_some() {
                Tolerance::ATTENTION
            } else {
                Tolerance::GGML_STEPS
            },
            score(got, want),
        );
    }

    // Routing over 512 experts.
    let (rows, n_expert) = (3, 512);
    let mut logits = rng.values(rows * n_expert, -3.0, 3.0);
    logits[300] = 3.5;
    logits[301] = 3.5;
    let bias = rng.values(n_expert, -0.05, 0.05);
    for (gating, with_bias) in [(Gating::Softmax, false), (Gating::Sigmoid, true)] {
        let host = family_ops::Routing {
            gating,
            k: 10,
            bias: with_bias.then_some(bias.as_slice()),
            normalize: true,
            scale: 1.0,
        };
        let want = reference::route(&logits, n_expert, &host);
        let got = ops.upload_f32(&logits, &[rows, n_expert]).and_then(|lt| {
            let bt = ops.upload_f32(&bias, &[n_expert])?;
            let routing = DeviceRouting {
                gating,
                k: 10,
                bias: with_bias.then_some(&bt),
                normalize: true,
                scale: 1.0,
            };
            let (ids, w) = ops.route(&lt, &routing)?;
            Ok(((io.back_i32)(&ids)?, (io.back)(Ok(w))?))
        });
        let case = match (got, want) {
            (Ok((gi, gw)), Ok((wi, ww))) => {
                let e = nmse(&as_f32(&gi), &as_f32(&wi));
                if e == 0.0 {
                    Ok(nmse(&gw, &ww))
                } else {
                    Err(format!("ids {gi:?}, the reference's {wi:?}"))
                }
            }
            (Err(e), _) => Err(e.to_string()),
            (_, Err(e)) => Err(format!("the reference failed: {e}")),
        };
        report.push(
            "route",
            format!("ids and weights [{rows}, {n_expert}] {gating:?} k 10 bias {with_bias}"),
            Tolerance::ROUTE,
            case,
        );
    }

    // The conv over 600 channels, the delta rule on heads of 128.
    let (channels, d_conv, n) = (600, 4, 3);
    let wv = rng.values(channels * d_conv, -1.0, 1.0);
    let mut st = rng.values((d_conv - 1) * channels, -1.0, 1.0);
    let x = rng.values(n * channels, -2.0, 2.0);
    let st0 = st.clone();
    let want = reference::ssm_conv(&mut st, &x, channels, &wv);
    let got = (|| {
        let mut stt = ops.upload_f32(&st0, &[d_conv - 1, channels])?;
        let wt = ops.upload_f32(&wv, &[channels, d_conv])?;
        let xt = ops.upload_f32(&x, &[n, channels])?;
        let mut y = (io.back)(ops.ssm_conv(&mut stt, &xt, &wt))?;
        y.extend((io.back_ref)(&stt)?);
        Ok(y)
    })();
    report.push(
        "ssm_conv",
        format!("[{n}, {channels}] d_conv {d_conv}, output and state"),
        Tolerance::GDN,
        score(
            got,
            want.map(|mut y| {
                y.extend(&st);
                y
            }),
        ),
    );
    let (hk, hv, s, n) = (2, 6, 128, 2);
    let mut state = rng.values(hv * s * s, -0.1, 0.1);
    let st0 = state.clone();
    let unit = |x: Vec<f32>| -> Vec<f32> {
        x.chunks_exact(s)
            .flat_map(|h| {
                let norm = h.iter().map(|v| v * v).sum::<f32>().sqrt() + 1e-6;
                h.iter().map(move |v| v / norm).collect::<Vec<_>>()
            })
            .collect()
    };
    let q = unit(rng.values(n * hk * s, -1.0, 1.0));
    let k = unit(rng.values(n * hk * s, -1.0, 1.0));
    let v = rng.values(n * hv * s, -1.0, 1.0);
    let g = rng.values(n * hv, -0.5, 0.0);
    let beta = rng.values(n * hv, 0.1, 0.9);
    let dims = DeltaNetDims {
        n,
        s,
        n_k_heads: hk,
        n_v_heads: hv,
        gate: crate::DeltaGate::PerHead,
    };
    let want = reference::delta_net(&mut state, [&q, &k, &v], &g, &beta, &dims);
    let got = (|| {
        let mut stt = ops.upload_f32(&st0, &[hv, s, s])?;
        let qt = ops.upload_f32(&q, &[n, hk * s])?;
        let kt = ops.upload_f32(&k, &[n, hk * s])?;
        let vt = ops.upload_f32(&v, &[n, hv * s])?;
        let gt = ops.upload_f32(&g, &[n, hv])?;
        let bt = ops.upload_f32(&beta, &[n, hv])?;
        let mut y = (io.back)(ops.delta_net(&mut stt, [&qt, &kt, &vt], &gt, &bt))?;
        y.extend((io.back_ref)(&stt)?);
        Ok(y)
    })();
    report.push(
        "delta_net",
        format!("{n} tokens, {hk} q/k heads, {hv} v heads of {s}, output and state"),
        Tolerance::GDN,
        score(
            got,
            want.map(|mut y| {
                y.extend(&state);
                y
            }),
        ),
    );
}

/// An element-wise op of the check: its name, the device's op and the
/// reference's function.
type Unary<'a> = (
    &'static str,
    Box<dyn Fn(&DeviceTensor) -> Result<DeviceTensor, OpError> + 'a>,
    fn(f32) -> f32,
);

/// ggml's sigmoid and softplus, on `ops` and in the reference.
fn sigmoid_and_softplus(ops: &dyn Ops) -> [Unary<'_>; 2] {
    [
        (
            "sigmoid",
            Box::new(|t| ops.sigmoid(t)),
            family_ops::ggml_cpu::sigmoid,
        ),
        (
            "softplus",
            Box::new(|t| ops.softplus(t)),
            family_ops::ggml_cpu::softplus,
        ),
    ]
}

/// Inputs at which the host libm's rounding shows
/// ([`crate::libm_rounding`]): for the sigmoid, `-a` for every argument `a`
/// at which glibc's `expf` is misrounded (`expf(a)` is the sigmoid's
/// exponential); for softplus, those `a` up to 20 and, for every
/// misrounded `logf` argument `l` that `1 + expf(x)` reaches, that `x`.
pub fn libm_rounding_points() -> (Vec<f32>, Vec<f32>) {
    use crate::libm_rounding::{LibmFn, misrounded};
    let exps = misrounded(LibmFn::Expf);
    let sigmoid = exps.iter().map(|&a| -f32::from_bits(a)).collect();
    let mut softplus: Vec<f32> = exps
        .iter()
        .map(|&a| f32::from_bits(a))
        .filter(|&a| a <= 20.0)
        .collect();
    for &l in misrounded(LibmFn::Logf) {
        let l = f32::from_bits(l);
        if !(l > 1.0 && l < 4.8e8) {
            continue;
        }
        let guess = (l - 1.0).ln();
        let near = (-4i32..=4).map(|k| f32::from_bits(guess.to_bits().wrapping_add_signed(k)));
        if let Some(x) = near.into_iter().find(|&x| x <= 20.0 && 1.0 + x.exp() == l) {
            softplus.push(x);
        }
    }
    (sigmoid, softplus)
}

/// The sigmoid and softplus at [`libm_rounding_points`]: a device that
/// rounds `expf` and `logf` as the host's libm does gives the reference's
/// bits; one that rounds them correctly is off at thousands of them.
fn libm_rounding_points_case(ops: &dyn Ops, report: &mut Report, io: &Io<'_>) {
    let (sigmoid, softplus) = libm_rounding_points();
    for ((op, f, want), x) in sigmoid_and_softplus(ops)
        .into_iter()
        .zip([sigmoid, softplus])
    {
        let shape = [x.len()];
        let case = format!("{shape:?} at glibc's misrounded exp and log arguments");
        unary_case(
            ops,
            report,
            io,
            (op, f, want),
            &x,
            &shape,
            case,
            Tolerance::GGML_STEPS,
        );
    }
}

/// `unary` on `x` against the reference's function, pushed as `case`.
#[allow(clippy::too_many_arguments)]
fn unary_case(
    ops: &dyn Ops,
    report: &mut Report,
    io: &Io<'_>,
    (op, f, want): Unary<'_>,
    x: &[f32],
    shape: &[usize],
    case: String,
    tolerance: f64,
) {
    let got = ops.upload_f32(x, shape).and_then(|t| (io.back)(f(&t)));
    let want = x.iter().map(|&v| want(v)).collect();
    report.push(op, case, tolerance, score(got, Ok(want)));
}

/// The gates and norms of a delta-net layer (sigmoid, softplus on both
/// sides of its cut at 20, L2 norm of heads) and the column slice that
/// splits a fused projection.
fn gates_and_slices(ops: &dyn Ops, report: &mut Report, rng: &mut Rng, io: &Io<'_>) {
    let shape = [5, 35];
    let x = rng.values(5 * 35, -30.0, 30.0);
    for unary in sigmoid_and_softplus(ops) {
        let case = format!("{shape:?} in [-30, 30)");
        let tolerance = Tolerance::GGML_STEPS_LIBM_TAIL;
        unary_case(ops, report, io, unary, &x, &shape, case, tolerance);
    }
    // The gates from their projections: 5 tokens of 7 heads (the
    // softplus cut at 20 crossed: alpha + dt spans [-30, 32)).
    {
        let (n, hv) = (5, 7);
        let dt = [2.0f32, -1.0, 0.5, 0.0, 1.5, -2.0, 0.25];
        let a = [-0.5f32, -1.0, -0.75, -2.0, -0.1, -1.5, -0.9];
        let beta: Vec<f32> = x[..n * hv].iter().rev().copied().collect();
        let alpha = &x[..n * hv];
        let got = ops.upload_f32(alpha, &[n, hv]).and_then(|at| {
            let bt = ops.upload_f32(&beta, &[n, hv])?;
            let dtt = ops.upload_f32(&dt, &[hv])?;
            let st = ops.upload_f32(&a, &[hv])?;
            let (g, b) = ops.delta_gates(&at, &bt, &dtt, &st)?;
            let mut both = (io.back)(Ok(g))?;
            both.extend((io.back)(Ok(b))?);
            Ok(both)
        });
        let (g, b) = reference::delta_gates(alpha, &beta, &dt, &a);
        report.push(
            "delta_gates",
            format!("[{n}, {hv}]: g and beta"),
            Tolerance::GGML_STEPS_LIBM_TAIL,
            score(got, Ok(g.into_iter().chain(b).collect())),
        );
        let r = ops.upload_f32(alpha, &[n, hv]).and_then(|at| {
            let dtt = ops.upload_f32(&dt[..6], &[6])?;
            ops.delta_gates(&at, &at, &dtt, &dtt).map(|(g, _)| g)
        });
        report.push(
            "delta_gates",
            "a bias of another width refused".into(),
            0.0,
            refused(r, |e| {
                matches!(
                    e,
                    OpError::Shape {
                        what: "dt_bias",
                        ..
                    }
                )
            }),
        );
    }
    let (rows, cols) = (6, 128);
    let h = rng.values(rows * cols, -2.0, 2.0);
    let got = ops
        .upload_f32(&h, &[rows, cols])
        .and_then(|t| (io.back)(ops.l2_norm(&t, 1e-6)));
    report.push(
        "l2_norm",
        format!("[{rows}, {cols}] eps 1e-6"),
        Tolerance::RMS_NORM,
        score(got, Ok(reference::l2_norm(&h, cols, 1e-6))),
    );
    let got = ops
        .upload_f32(&h, &[rows, cols])
        .and_then(|t| (io.back)(ops.slice_cols(&t, 40, 70)));
    report.push(
        "slice_cols",
        format!("[{rows}, {cols}] columns 40..110"),
        Tolerance::EXACT,
        score(got, Ok(reference::slice_cols(&h, cols, 40, 70))),
    );
    let r = ops
        .upload_f32(&h, &[rows, cols])
        .and_then(|t| ops.slice_cols(&t, 100, 29));
    report.push(
        "slice_cols",
        "columns past the row refused".into(),
        0.0,
        refused(r, |e| {
            matches!(
                e,
                OpError::Shape {
                    op: "slice_cols",
                    ..
                }
            )
        }),
    );
}

// glm_moe_dsa's ops

/// ggml's `rope_ext` (normal and NEOX pairs, a partial rotation, YaRN's
/// ramp and magnitude) over 4 tokens of 3 heads of 24 at positions far
/// apart; the refusal of a zero `freq_scale`.
fn glm_moe_dsa_ops(ops: &dyn Ops, report: &mut Report, rng: &mut Rng, io: &Io<'_>) {
    use crate::GgmlRope;
    let (heads, head_dim) = (3, 24);
    let shape = [4, heads * head_dim];
    let x = rng.values(4 * heads * head_dim, -2.0, 2.0);
    let pos = [0, 9, 700, 4095];
    let mut yarn = GgmlRope::plain(16, crate::RopeMode::Normal, 1e4);
    yarn.freq_scale = 0.25;
    yarn.ext_factor = 1.0;
    yarn.attn_factor = 1.25;
    yarn.n_ctx_orig = 4096;
    let cases = [
        (
            "normal n_rot 8",
            GgmlRope::plain(8, crate::RopeMode::Normal, 1e4),
        ),
        (
            "neox n_rot 24",
            GgmlRope::plain(24, crate::RopeMode::Neox, 1e6),
        ),
        (
            "neox n_rot 12",
            GgmlRope::plain(12, crate::RopeMode::Neox, 5e5),
        ),
        ("normal n_rot 16 yarn", yarn),
    ];
    for (what, rope) in cases {
        let got = ops.upload_f32(&x, &shape).and_then(|xt| {
            let pt = ops.upload_i32(&pos, &[4])?;
            (io.back)(ops.rope_ggml(&xt, &pt, head_dim, &rope))
        });
        let want = reference::rope_ggml(&x, heads * head_dim, &pos, head_dim, &rope);
        report.push(
            "rope_ggml",
            format!("{what} {shape:?} pos {pos:?}"),
            Tolerance::ROPE,
            score(got, want),
        );
    }
    let r = ops.upload_f32(&x, &shape).and_then(|xt| {
        let pt = ops.upload_i32(&pos, &[4])?;
        let mut rope = GgmlRope::plain(8, crate::RopeMode::Normal, 1e4);
        rope.freq_scale = 0.0;
        ops.rope_ggml(&xt, &pt, head_dim, &rope)
    });
    report.push(
        "rope_ggml",
        "freq_scale 0 refused".into(),
        0.0,
        refused(r, |e| matches!(e, OpError::Invalid { .. })),
    );

    // MLA's `[latent | rope part]`: 3 rows of 40 and 8 columns (a row of
    // each head's query), a single column first.
    for (ca, cb) in [(40, 8), (1, 5), (7, 3)] {
        let a = rng.values(3 * ca, -4.0, 4.0);
        let b = rng.values(3 * cb, -4.0, 4.0);
        let got = ops.upload_f32(&a, &[3, ca]).and_then(|at| {
            let bt = ops.upload_f32(&b, &[3, cb])?;
            (io.back)(ops.concat_cols(&at, &bt))
        });
        report.push(
            "concat_cols",
            format!("[3, {ca}] [3, {cb}]"),
            Tolerance::EXACT,
            score(got, Ok(reference::concat_cols(&a, ca, &b, cb))),
        );
    }
    let r = ops.upload_f32(&x[..12], &[3, 4]).and_then(|at| {
        let bt = ops.upload_f32(&x[..8], &[2, 4])?;
        ops.concat_cols(&at, &bt)
    });
    report.push(
        "concat_cols",
        "rows of 3 and 2 refused".into(),
        0.0,
        refused(r, |e| matches!(e, OpError::Shape { what: "b", .. })),
    );
    lightning_indexer(ops, report, rng, io);
}

/// The lightning indexer's ops: the key's LayerNorm (eps 0 and 1e-6, a
/// row of 37 values and rows of 128), the Hadamard rotation of runs of
/// 64 and 8, the scores of 11 keys (F32 and F16, as a cache stores them)
/// of 4 heads of 64, the first 9 of them; the refusals of a run that is not
/// a power of two and of more keys than rows.
fn lightning_indexer(ops: &dyn Ops, report: &mut Report, rng: &mut Rng, io: &Io<'_>) {
    for (shape, eps) in [([3, 128], 0.0), ([1, 37], 1e-6)] {
        let x = rng.values(shape[0] * shape[1], -3.0, 5.0);
        let got = ops
            .upload_f32(&x, &shape)
            .and_then(|t| (io.back)(ops.layer_norm(&t, eps)));
        report.push(
            "layer_norm",
            format!("{shape:?} eps {eps}"),
            Tolerance::GGML_STEPS,
            score(got, Ok(reference::layer_norm(&x, shape[1], eps))),
        );
    }
    let x = rng.values(2 * 128, -2.0, 2.0);
    for n in [64, 8] {
        let got = ops
            .upload_f32(&x, &[2, 128])
            .and_then(|t| (io.back)(ops.hadamard(&t, n)));
        report.push(
            "hadamard",
            format!("[2, 128] runs of {n}"),
            Tolerance::RMS_NORM,
            score(got, reference::hadamard(&x, n)),
        );
    }
    let r = ops
        .upload_f32(&x, &[2, 128])
        .and_then(|t| ops.hadamard(&t, 48));
    report.push(
        "hadamard",
        "runs of 48 refused".into(),
        0.0,
        refused(r, |e| matches!(e, OpError::Invalid { .. })),
    );
    let (heads, d, rows, n_keys) = (4, 64, 11, 9);
    let q = rng.values(heads * d, -1.0, 1.0);
    let w = rng.values(heads, -0.5, 1.0);
    let keys = rng.values(rows * d, -1.0, 1.0);
    for dtype in [DType::F32, DType::F16] {
        let stored: Vec<f32> = match dtype {
            DType::F16 => keys
                .iter()
                .map(|&v| half::f16::from_f32(v).to_f32())
                .collect(),
            _ => keys.clone(),
        };
        let got = ops.upload_f32(&keys, &[rows, d]).and_then(|kt| {
            let mut cache = ops.zeros(dtype, &[rows, d])?;
            ops.write_rows(&mut cache, 0, &kt)?;
            let qt = ops.upload_f32(&q, &[1, heads * d])?;
            let wt = ops.upload_f32(&w, &[1, heads])?;
            (io.back)(ops.lightning_scores(&qt, &cache, n_keys, &wt))
        });
        let want = reference::lightning_scores(&q, &stored[..n_keys * d], d, &w);
        report.push(
            "lightning_scores",
            format!("{dtype:?} keys [{rows}, {d}], {n_keys} of them, {heads} heads"),
            Tolerance::GGML_STEPS,
            score(got, Ok(want)),
        );
    }
    let r = ops.upload_f32(&keys, &[rows, d]).and_then(|kt| {
        let qt = ops.upload_f32(&q, &[1, heads * d])?;
        let wt = ops.upload_f32(&w, &[1, heads])?;
        ops.lightning_scores(&qt, &kt, rows + 1, &wt)
    });
    report.push(
        "lightning_scores",
        "more keys than rows refused".into(),
        0.0,
        refused(r, |e| matches!(e, OpError::Shape { what: "keys", .. })),
    );
}

// muse_glimmer's ops

/// The ops muse_glimmer's text model and projector add: the logit softcap
/// (values well inside the cap, near it and far past it on both sides;
/// a cap that is not positive refused), and the projector's float64
/// arithmetic (products by weights and by activations, LayerNorm, the
/// exact GELU, a transpose, f16 rounding).
fn muse_glimmer_ops(
    ops: &dyn Ops,
    report: &mut Report,
    rng: &mut Rng,
    io: &Io<'_>,
    staging: Staging<'_>,
) {
    let shape = [4, 67];
    let x = rng.values(4 * 67, -90.0, 90.0);
    for c in [30.0f32, 10.0, 0.75] {
        let got = ops
            .upload_f32(&x, &shape)
            .and_then(|t| (io.back)(ops.softcap(&t, c)));
        let want = x
            .iter()
            .map(|&v| family_ops::ggml_cpu::softcap(v, c))
            .collect();
        report.push(
            "softcap",
            format!("{shape:?} in [-90, 90) cap {c}"),
            Tolerance::TRANSCENDENTAL,
            score(got, Ok(want)),
        );
    }
    for c in [0.0f32, -1.0, f32::NAN] {
        let r = ops.upload_f32(&x, &shape).and_then(|t| ops.softcap(&t, c));
        report.push(
            "softcap",
            format!("a cap of {c} refused"),
            0.0,
            refused(r, |e| matches!(e, OpError::Invalid { op: "softcap", .. })),
        );
    }
    projector_ops(ops, report, rng, io, staging);
}

/// The projector's ops of [`muse_glimmer_ops`].
fn projector_ops(
    ops: &dyn Ops,
    report: &mut Report,
    rng: &mut Rng,
    io: &Io<'_>,
    staging: Staging<'_>,
) {
    // Products by weights: F32 (activations as they are), F16 and Q8_0
    // (activations rounded first), 3 rows of 64 by 9 outputs.
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0] {
        let (ne0, rows, n) = (64, 9, 3);
        let (weight, bytes) = random_owned_weight(rng, ty, "proj", &[ne0, rows]);
        let Some(resident) = staged_or_reported(report, "matmul_f64", &weight, staging) else {
            continue;
        };
        let x = rng.values(n * ne0, -2.0, 2.0);
        let got = ops
            .upload_f32(&x, &[n, ne0])
            .and_then(|t| (io.back)(ops.matmul_f64(&weight, &resident, &t)));
        let want = reference::matmul_f64(ty, &bytes, ne0, rows, &x);
        report.push(
            "matmul_f64",
            format!("{ty} [{ne0}, {rows}] by [{n}, {ne0}]"),
            Tolerance::MATMUL,
            score(got, want),
        );
    }
    // Products by activations: every row of a by every row of b, values
    // far apart in size (the f64 sum keeps the small ones).
    let (n, m, k) = (5, 7, 48);
    let mut a = rng.values(n * k, -1.0, 1.0);
    a[3] = 3e7;
    let b = rng.values(m * k, -1.0, 1.0);
    let got = ops.upload_f32(&a, &[n, k]).and_then(|at| {
        let bt = ops.upload_f32(&b, &[m, k])?;
        (io.back)(ops.dot_rows_f64(&at, &bt))
    });
    report.push(
        "dot_rows_f64",
        format!("[{n}, {k}] by [{m}, {k}]"),
        Tolerance::EXACT,
        score(got, Ok(family_ops::projector::dot_rows_f64(&a, &b, k))),
    );
    let r = ops.upload_f32(&a, &[n, k]).and_then(|at| {
        let bt = ops.upload_f32(&b[..m * (k - 1)], &[m, k - 1])?;
        ops.dot_rows_f64(&at, &bt)
    });
    report.push(
        "dot_rows_f64",
        "rows of another width refused".into(),
        0.0,
        refused(r, |e| matches!(e, OpError::Shape { what: "b", .. })),
    );
    // A transpose of 2 matrices of 3 x 5; rank 1 refused.
    let x = rng.values(30, -5.0, 5.0);
    let got = ops
        .upload_f32(&x, &[2, 3, 5])
        .and_then(|t| (io.back)(ops.transpose(&t)));
    report.push(
        "transpose",
        "[2, 3, 5]".into(),
        Tolerance::EXACT,
        score(got, Ok(reference::transpose(&x, 3, 5))),
    );
    let r = ops.upload_f32(&x, &[30]).and_then(|t| ops.transpose(&t));
    report.push(
        "transpose",
        "rank 1 refused".into(),
        0.0,
        refused(r, |e| {
            matches!(
                e,
                OpError::Shape {
                    op: "transpose",
                    ..
                }
            )
        }),
    );
    // LayerNorm of 6 rows of 40 (an offset mean), with and without its
    // gains and bias; a bias of another width refused.
    let (rows, cols) = (6, 40);
    let x = rng.values(rows * cols, 3.0, 9.0);
    let w = rng.values(cols, -2.0, 2.0);
    let bias = rng.values(cols, -1.0, 1.0);
    for (what, with) in [("gains and bias", true), ("plain", false)] {
        let got = ops.upload_f32(&x, &[rows, cols]).and_then(|xt| {
            let wt = ops.upload_f32(&w, &[cols])?;
            let bt = ops.upload_f32(&bias, &[cols])?;
            let (wo, bo) = if with {
                (Some(&wt), Some(&bt))
            } else {
                (None, None)
            };
            (io.back)(ops.layer_norm_f64(&xt, 1e-6, wo, bo))
        });
        let want = if with {
            reference::layer_norm_f64(&x, cols, 1e-6, Some(&w), Some(&bias))
        } else {
            reference::layer_norm_f64(&x, cols, 1e-6, None, None)
        };
        report.push(
            "layer_norm_f64",
            format!("[{rows}, {cols}] eps 1e-6, {what}"),
            Tolerance::RMS_NORM,
            score(got, Ok(want)),
        );
    }
    let r = ops.upload_f32(&x, &[rows, cols]).and_then(|xt| {
        let bt = ops.upload_f32(&bias[..cols - 1], &[cols - 1])?;
        ops.layer_norm_f64(&xt, 1e-6, None, Some(&bt))
    });
    report.push(
        "layer_norm_f64",
        "a bias of another width refused".into(),
        0.0,
        refused(r, |e| matches!(e, OpError::Shape { what: "b", .. })),
    );
    // The exact GELU across its bend and tails; f16 rounding past the
    // half's range, into its subnormals and at ties.
    let x = rng.values(5 * 35, -6.0, 6.0);
    let got = ops
        .upload_f32(&x, &[5, 35])
        .and_then(|t| (io.back)(ops.gelu_erf(&t)));
    let want = x
        .iter()
        .map(|&v| family_ops::projector::gelu_erf(v))
        .collect();
    report.push(
        "gelu_erf",
        "[5, 35] in [-6, 6)".into(),
        Tolerance::TRANSCENDENTAL,
        score(got, Ok(want)),
    );
    let mut x = rng.values(64, -3.0, 3.0);
    x.extend([70000.0, -1e-6, 3e-8, 1.0 + 1.0 / 2048.0, 2049.0, 65519.0]);
    let got = ops
        .upload_f32(&x, &[x.len()])
        .and_then(|t| (io.back)(ops.round_f16(&t)));
    report.push(
        "round_f16",
        format!("{} values, past the range and subnormal", x.len()),
        Tolerance::EXACT,
        score(got, Ok(reference::round_f16(&x))),
    );
}

// glm5_next's ops

/// glm5_next's ops: KDA's delta rule with a gate a key channel (state
/// carried over 3 tokens then 1) and its gate (both forms), mHC's weights
/// (Sinkhorn of 1 and 3 iterations), its pre and post mixes of 4 streams,
/// the k-pool's pooled key and the gathered slot attention over F32 and F16
/// caches; the refusals.
fn glm5_next_ops(ops: &dyn Ops, report: &mut Report, rng: &mut Rng, io: &Io<'_>) {
    kda(ops, report, rng, io);
    hyper_mix(ops, report, rng, io);
    kpool(ops, report, rng, io);
    // The clamped SwiGLU: values on both sides of the limit.
    let (rows, cols) = (2, 40);
    let gate = rng.values(rows * cols, -4.0, 4.0);
    let up = rng.values(rows * cols, -4.0, 4.0);
    let got = (|| {
        let gt = ops.upload_f32(&gate, &[rows, cols])?;
        let ut = ops.upload_f32(&up, &[rows, cols])?;
        (io.back)(ops.swiglu_clamp(&gt, &ut, 1.5))
    })();
    report.push(
        "swiglu_clamp",
        format!("[{rows}, {cols}] limit 1.5"),
        Tolerance::GGML_STEPS_LIBM_TAIL,
        score(got, reference::swiglu_clamp(&gate, &up, 1.5)),
    );
}

/// KDA's delta rule (2 Q/K heads, 4 V heads of 16) and gate.
fn kda(ops: &dyn Ops, report: &mut Report, rng: &mut Rng, io: &Io<'_>) {
    let (hk, hv, s) = (2, 4, 16);
    let mut host_state = rng.values(hv * s * s, -0.5, 0.5);
    let mut st = match ops.upload_f32(&host_state, &[hv, s, s]) {
        Ok(t) => t,
        Err(e) => {
            report.push("delta_net", "upload".into(), 0.0, Err(e.to_string()));
            return;
        }
    };
    let unit = |x: Vec<f32>| -> Vec<f32> {
        x.chunks_exact(s)
            .flat_map(|h| {
                let n = h.iter().map(|v| v * v).sum::<f32>().sqrt() + 1e-6;
                h.iter().map(move |v| v / n).collect::<Vec<_>>()
            })
            .collect()
    };
    for n in [3usize, 1] {
        let q = unit(rng.values(n * hk * s, -1.0, 1.0));
        let k = unit(rng.values(n * hk * s, -1.0, 1.0));
        let v = rng.values(n * hv * s, -2.0, 2.0);
        // Gates far apart within a head, so one channel's stands for none.
        let g = rng.values(n * hv * s, -3.0, 0.0);
        let beta = rng.values(n * hv, 0.05, 0.95);
        let dims = DeltaNetDims {
            n,
            s,
            n_k_heads: hk,
            n_v_heads: hv,
            gate: crate::DeltaGate::PerKey,
        };
        let want = reference::delta_net(&mut host_state, [&q, &k, &v], &g, &beta, &dims);
        let got = (|| {
            let qt = ops.upload_f32(&q, &[n, hk * s])?;
            let kt = ops.upload_f32(&k, &[n, hk * s])?;
            let vt = ops.upload_f32(&v, &[n, hv * s])?;
            let gt = ops.upload_f32(&g, &[n, hv * s])?;
            let bt = ops.upload_f32(&beta, &[n, hv])?;
            let mut y = (io.back)(ops.delta_net(&mut st, [&qt, &kt, &vt], &gt, &bt))?;
            y.extend((io.back_ref)(&st)?);
            Ok(y)
        })();
        report.push(
            "delta_net",
            format!("a gate a key channel, {n} tokens, {hk} q/k heads, {hv} v heads of {s}: output and state"),
            Tolerance::GDN,
            score(
                got,
                want.map(|mut y| {
                    y.extend(&host_state);
                    y
                }),
            ),
        );
    }
    let r = (|| {
        let qt = ops.upload_f32(&vec![0.0; hk * s], &[1, hk * s])?;
        let vt = ops.upload_f32(&vec![0.0; hv * s], &[1, hv * s])?;
        let gt = ops.upload_f32(&vec![0.0; hv * s - 1], &[1, hv * s - 1])?;
        let bt = ops.upload_f32(&vec![0.0; hv], &[1, hv])?;
        ops.delta_net(&mut st, [&qt, &qt, &vt], &gt, &bt)
    })();
    report.push(
        "delta_net",
        "a gate neither a head's nor a key channel's refused".into(),
        0.0,
        refused(r, |e| matches!(e, OpError::Shape { what: "g", .. })),
    );

    // The gate: 3 tokens of 4 heads of 16 channels.
    let (n, c) = (3, hv * s);
    let alpha = rng.values(n * c, -4.0, 4.0);
    let dt = rng.values(c, -1.0, 1.0);
    let a = rng.values(hv, 0.2, 3.0);
    for bound in [None, Some(-5.0)] {
        let got = (|| {
            let at = ops.upload_f32(&alpha, &[n, c])?;
            let dtt = ops.upload_f32(&dt, &[c])?;
            let st = ops.upload_f32(&a, &[hv])?;
            (io.back)(ops.kda_gate(&at, &dtt, &st, bound))
        })();
        report.push(
            "kda_gate",
            format!("[{n}, {c}], {hv} heads, lower bound {bound:?}"),
            Tolerance::GGML_STEPS_LIBM_TAIL,
            score(got, Ok(reference::kda_gate(&alpha, &dt, &a, s, bound))),
        );
    }
    let r = (|| {
        let at = ops.upload_f32(&alpha, &[n, c])?;
        let dtt = ops.upload_f32(&dt, &[c])?;
        let st = ops.upload_f32(&a[..3], &[3])?;
        ops.kda_gate(&at, &dtt, &st, None)
    })();
    report.push(
        "kda_gate",
        "3 heads of 64 channels refused".into(),
        0.0,
        refused(r, |e| matches!(e, OpError::Shape { what: "a", .. })),
    );
}

/// mHC of 4 streams of 40: the weights, the pre and post mixes.
fn hyper_mix(ops: &dyn Ops, report: &mut Report, rng: &mut Rng, io: &Io<'_>) {
    let (hc, n) = (4, 40);
    let m = 2 * hc + hc * hc;
    let mix = rng.values(m, -3.0, 3.0);
    let scale = rng.values(3, 0.2, 1.5);
    let base = rng.values(m, -1.0, 1.0);
    for iters in [1, 3] {
        let sinkhorn = crate::HcSinkhorn {
            hc,
            eps: 1e-6,
            iters,
        };
        let got = (|| {
            let mt = ops.upload_f32(&mix, &[1, m])?;
            let st = ops.upload_f32(&scale, &[3])?;
            let bt = ops.upload_f32(&base, &[m])?;
            let (pre, post, comb) = ops.hc_weights(&mt, &st, &bt, &sinkhorn)?;
            let mut y = (io.back_ref)(&pre)?;
            y.extend((io.back_ref)(&post)?);
            y.extend((io.back_ref)(&comb)?);
            Ok(y)
        })();
        let want = reference::hc_weights(&mix, &scale, &base, &sinkhorn).map(|(a, b, c)| {
            let mut y = a;
            y.extend(b);
            y.extend(c);
            y
        });
        report.push(
            "hc_weights",
            format!("{hc} streams, {iters} Sinkhorn iterations"),
            Tolerance::GGML_STEPS_LIBM_TAIL,
            score(got, want),
        );
    }
    let r = (|| {
        let mt = ops.upload_f32(&mix[..m - 1], &[1, m - 1])?;
        let st = ops.upload_f32(&scale, &[3])?;
        let bt = ops.upload_f32(&base, &[m])?;
        ops.hc_weights(
            &mt,
            &st,
            &bt,
            &crate::HcSinkhorn {
                hc,
                eps: 1e-6,
                iters: 2,
            },
        )
        .map(|(p, _, _)| p)
    })();
    report.push(
        "hc_weights",
        "a mix one short refused".into(),
        0.0,
        refused(r, |e| matches!(e, OpError::Shape { what: "mix", .. })),
    );

    let x = rng.values(hc * n, -2.0, 2.0);
    let w = rng.values(hc, 0.0, 1.0);
    for sc in [1.0, 0.25] {
        let got = (|| {
            let xt = ops.upload_f32(&x, &[hc, n])?;
            let wt = ops.upload_f32(&w, &[1, hc])?;
            (io.back)(ops.hc_pre_weighted(&xt, &wt, sc))
        })();
        report.push(
            "hc_pre_weighted",
            format!("[{hc}, {n}] scale {sc}"),
            Tolerance::EXACT,
            score(got, reference::hc_pre_weighted(&x, &w, sc)),
        );
    }
    let y = rng.values(n, -2.0, 2.0);
    let post = rng.values(hc, 0.0, 2.0);
    // A combination that is not symmetric.
    let comb = rng.values(hc * hc, 0.0, 1.0);
    let got = (|| {
        let yt = ops.upload_f32(&y, &[1, n])?;
        let xt = ops.upload_f32(&x, &[hc, n])?;
        let pt = ops.upload_f32(&post, &[1, hc])?;
        let ct = ops.upload_f32(&comb, &[1, hc * hc])?;
        (io.back)(ops.hc_post_mixed(&yt, &xt, &pt, &ct))
    })();
    report.push(
        "hc_post_mixed",
        format!("[{hc}, {n}]"),
        Tolerance::EXACT,
        score(got, reference::hc_post_mixed(&y, &x, &post, &comb)),
    );
    let r = (|| {
        let xt = ops.upload_f32(&x, &[hc, n])?;
        let wt = ops.upload_f32(&w[..3], &[3])?;
        ops.hc_pre_weighted(&xt, &wt, 1.0)
    })();
    report.push(
        "hc_pre_weighted",
        "3 weights for 4 rows refused".into(),
        0.0,
        refused(r, |e| matches!(e, OpError::Shape { what: "w", .. })),
    );
}

/// The k-pool: pools of 4 over a cache of 12 rows of 32 (the pool at row
/// 4), and 2 heads attending 11 slots (3 dead) of it.
fn kpool(ops: &dyn Ops, report: &mut Report, rng: &mut Rng, io: &Io<'_>) {
    let (rows, d, kp) = (12, 32, 4);
    let keys = rng.values(rows * d, -1.0, 1.0);
    let gates = rng.values(rows * d, -3.0, 3.0);
    let ape = rng.values(kp * d, -1.0, 1.0);
    let heads = 2;
    let q = rng.values(heads * d, -1.0, 1.0);
    let slots: Vec<i32> = vec![4, 5, 6, 7, -1, -1, -1, -1, 11, 10, 9];
    for dtype in [DType::F32, DType::F16] {
        let stored = |v: &[f32]| -> Vec<f32> {
            match dtype {
                DType::F16 => v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect(),
                _ => v.to_vec(),
            }
        };
        let (sk, sg) = (stored(&keys), stored(&gates));
        let cache = |v: &[f32]| -> Result<DeviceTensor, OpError> {
            let t = ops.upload_f32(v, &[rows, d])?;
            let mut c = ops.zeros(dtype, &[rows, d])?;
            ops.write_rows(&mut c, 0, &t)?;
            Ok(c)
        };
        let got = (|| {
            let (kt, gt) = (cache(&keys)?, cache(&gates)?);
            let at = ops.upload_f32(&ape, &[kp, d])?;
            (io.back)(ops.pool_keys(&kt, &gt, 4, &at))
        })();
        let want = reference::pool_keys(&sk[4 * d..8 * d], &sg[4 * d..8 * d], &ape, d);
        report.push(
            "pool_keys",
            format!("{dtype:?} rows 4..8 of [{rows}, {d}]"),
            Tolerance::GGML_STEPS_LIBM_TAIL,
            score(got, want),
        );
        let got = (|| {
            let kt = cache(&keys)?;
            let qt = ops.upload_f32(&q, &[heads, d])?;
            let st = ops.upload_i32(&slots, &[slots.len()])?;
            (io.back)(ops.attention_slots(&qt, &kt, &st, 0.3))
        })();
        report.push(
            "attention_slots",
            format!(
                "{dtype:?} {heads} heads over {} slots of [{rows}, {d}]",
                slots.len()
            ),
            Tolerance::GGML_STEPS_LIBM_TAIL,
            score(got, reference::attention_slots(&q, &sk, d, &slots, 0.3)),
        );
    }
    let r = (|| {
        let kt = ops.upload_f32(&keys, &[rows, d])?;
        let at = ops.upload_f32(&ape, &[kp, d])?;
        ops.pool_keys(&kt, &kt, rows - 3, &at)
    })();
    report.push(
        "pool_keys",
        "a pool past the rows refused".into(),
        0.0,
        refused(r, |e| matches!(e, OpError::Shape { what: "ape", .. })),
    );
    let r = (|| {
        let kt = ops.upload_f32(&keys, &[rows, d])?;
        let qt = ops.upload_f32(&q[..d + 1], &[1, d + 1])?;
        let st = ops.upload_i32(&slots, &[slots.len()])?;
        ops.attention_slots(&qt, &kt, &st, 0.3)
    })();
    report.push(
        "attention_slots",
        "a query of part of a head refused".into(),
        0.0,
        refused(r, |e| matches!(e, OpError::Shape { what: "q", .. })),
    );
}
