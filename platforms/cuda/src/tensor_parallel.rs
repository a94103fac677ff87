//! A tensor-parallel matrix product over the GPUs of an NCCL group, checked
//! against the same product on one GPU: the proof that shards staged on
//! several devices compute what the whole weight computes.
//!
//! `Y = W X` with `W` of `out` rows of `inp` f32 (GGUF dims `[inp, out]`,
//! a row contiguous) and `X` of `inp` rows of `batch` f32:
//!
//! - **row split + all-reduce** (Megatron's row-parallel linear): rank `r`
//!   holds the columns `[c0, c1)` of every row of `W` (the rows of `W` in
//!   the `[in, out]` layout of `y = x W`) and rows `[c0, c1)` of `X`; its
//!   product is a partial sum of every output, and `ncclAllReduce` adds
//!   them.
//! - **column split + all-gather** (column-parallel): rank `r` holds the
//!   output rows `[r0, r1)` of `W` (the seam's `ShardStrategy::Rows`: a
//!   contiguous byte range) and all of `X`; `ncclAllGather` concatenates the
//!   slices.
//!
//! Every operand reaches its device through `seam::resident_weight` (owned
//! weights). The kernel is CUDA C compiled at run time by NVRTC (cudarc's
//! `nvrtc` feature, loaded at run time like the driver), one thread per
//! output element, f32 accumulation.

use std::ffi::{CString, c_void};

use cudarc::driver::{result, sys};
use seam::gguf::GgmlType;
use seam::platform::{DeviceBuffer, DeviceError, Platform};
use seam::resident_weight;
use seam::shard::split_even;
use seam::weight::{Role, Weight};
use serde::Serialize;

use crate::nccl::NcclRank;
use crate::{CudaPlatform, cuda_buffer, cuda_queue, driver_error};

const KERNEL: &str = r#"
extern "C" __global__ void matmul_f32(const float* w, const float* x, float* y,
                                      int out, int inp, int batch) {
    long o = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= (long)out * batch) return;
    long row = o / batch, b = o % batch;
    const float* wr = w + row * inp;
    float acc = 0.0f;
    for (int j = 0; j < inp; ++j) acc += wr[j] * x[(long)j * batch + b];
    y[o] = acc;
}
"#;

/// The library names cudarc searches for NVRTC.
pub fn nvrtc_candidates() -> Vec<String> {
    cudarc::get_lib_name_candidates("nvrtc")
}

/// Why NVRTC cannot be used, in one line; `None` when it can be loaded.
pub fn nvrtc_unavailable_reason() -> Option<String> {
    // SAFETY: this only tries to dlopen the candidate names.
    let present = unsafe { cudarc::nvrtc::sys::is_culib_present() };
    (!present).then(|| {
        format!(
            "NVRTC unavailable: libnvrtc not found (searched {})",
            nvrtc_candidates().join(", ")
        )
    })
}

/// The shape of the check.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct MatmulShape {
    /// Output rows.
    pub out: usize,
    /// Inputs per row.
    pub inp: usize,
    /// Columns of `X`.
    pub batch: usize,
}

/// One split's result against the one-GPU product.
#[derive(Clone, Debug, Serialize)]
pub struct SplitCheck {
    /// `row_split_all_reduce` or `column_split_all_gather`.
    pub split: &'static str,
    /// `max |Y - Y1|` over every rank's result.
    pub max_abs_diff: f64,
    /// `||Y - Y1|| / ||Y1||`, the worst rank.
    pub rel_diff: f64,
}

/// The report of `seam matmul-check`.
#[derive(Clone, Debug, Serialize)]
pub struct MatmulCheck {
    /// The devices, in rank order.
    pub devices: Vec<String>,
    /// The shape.
    pub shape: MatmulShape,
    /// The one-GPU product against a float64 CPU product,
    /// `||Y1 - Yref|| / ||Yref||`.
    pub one_gpu_rel_diff_vs_f64: f64,
    /// Each split against the one-GPU product.
    pub splits: Vec<SplitCheck>,
}

/// The compiled kernel loaded on one device.
struct Kernel<'p> {
    module: sys::CUmodule,
    function: sys::CUfunction,
    platform: &'p CudaPlatform,
}

// SAFETY: module and function handles may be used from any thread with
// their context current; `run` binds it first.
unsafe impl Send for Kernel<'_> {}
// SAFETY: as above; launches on separate streams need no exclusion.
unsafe impl Sync for Kernel<'_> {}

impl<'p> Kernel<'p> {
    fn load(platform: &'p CudaPlatform, ptx: &CString) -> Result<Kernel<'p>, DeviceError> {
        platform.backend.ctx.bind()?;
        // SAFETY: `ptx` is a NUL-terminated PTX image; the context is
        // current; the module is unloaded in `Drop`.
        let module = unsafe { result::module::load_data(ptx.as_ptr().cast()) }
            .map_err(|e| driver_error("cuModuleLoadData", e))?;
        // SAFETY: `module` was just loaded; the name is NUL-terminated.
        let function = unsafe { result::module::get_function(module, c"matmul_f32".into()) }
            .map_err(|e| driver_error("cuModuleGetFunction", e))?;
        Ok(Kernel {
            module,
            function,
            platform,
        })
    }

    /// `y = w x` for `out` rows of `inp` and `batch` columns, on `queue`'s
    /// stream, synchronized.
    fn run(
        &self,
        w: &dyn DeviceBuffer,
        x: &dyn DeviceBuffer,
        y: &dyn DeviceBuffer,
        shape: MatmulShape,
    ) -> Result<(), DeviceError> {
        let platform = self.platform;
        let (w, x, y) = (cuda_buffer(w)?, cuda_buffer(x)?, cuda_buffer(y)?);
        let fits = |n: usize, buf: &crate::CudaBuffer| {
            seam::platform::buffer_range(0, n * 4, buf.len).map(|_| ())
        };
        fits(shape.out * shape.inp, w)?;
        fits(shape.inp * shape.batch, x)?;
        fits(shape.out * shape.batch, y)?;
        let dims = |n: usize| {
            i32::try_from(n).map_err(|_| DeviceError::Misuse(format!("dimension {n} > i32")))
        };
        let (mut out, mut inp, mut batch) =
            (dims(shape.out)?, dims(shape.inp)?, dims(shape.batch)?);
        let (mut wp, mut xp, mut yp) = (w.ptr, x.ptr, y.ptr);
        let mut params: [*mut c_void; 6] = [
            (&raw mut wp).cast(),
            (&raw mut xp).cast(),
            (&raw mut yp).cast(),
            (&raw mut out).cast(),
            (&raw mut inp).cast(),
            (&raw mut batch).cast(),
        ];
        let threads = 256u32;
        let blocks = u32::try_from((shape.out * shape.batch).div_ceil(threads as usize))
            .map_err(|_| DeviceError::Misuse("grid too large".into()))?;
        let queue = platform.backend().create_queue()?;
        let stream = cuda_queue(&*queue)?.stream;
        platform.backend.ctx.bind()?;
        // Poison the output (0xFF bytes are NaN): an element the kernel
        // does not write fails the comparison.
        // SAFETY: `y` holds at least `out * batch` f32 (checked above).
        unsafe { result::memset_d8_sync(y.ptr, 0xFF, shape.out * shape.batch * 4) }
            .map_err(|e| driver_error("cuMemsetD8", e))?;
        // SAFETY: the parameters match the kernel's signature (three device
        // pointers, three ints) and point to locals alive during the call;
        // every index the kernel touches was checked against the buffers.
        unsafe {
            result::launch_kernel(
                self.function,
                (blocks, 1, 1),
                (threads, 1, 1),
                0,
                stream,
                &mut params,
            )
        }
        .map_err(|e| driver_error("cuLaunchKernel", e))?;
        platform.backend().synchronize(&*queue)
    }
}

impl Drop for Kernel<'_> {
    fn drop(&mut self) {
        if self.platform.backend.ctx.bind().is_ok() {
            // SAFETY: loaded in `load`, unloaded once.
            let _ = unsafe { result::module::unload(self.module) };
        }
    }
}

/// Deterministic values in [-1, 1).
fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Stages `values` on `platform` through the seam (an owned weight) and
/// returns the weight, which holds the device copy.
fn stage(
    platform: &CudaPlatform,
    name: &str,
    dims: Vec<u64>,
    values: &[f32],
) -> Result<Weight, DeviceError> {
    let weight = Weight::owned(
        name,
        GgmlType::F32,
        dims,
        Role::new("tensor"),
        f32_bytes(values),
    );
    let queue = platform.backend().create_queue()?;
    resident_weight(&weight, platform, &*queue)
        .map_err(|e| DeviceError::CopyFailed(e.to_string()))?;
    Ok(weight)
}

fn device_buffer(weight: &Weight) -> Result<&dyn DeviceBuffer, DeviceError> {
    weight
        .device_copy()
        .map(|c| c.buffer())
        .ok_or_else(|| DeviceError::Misuse(format!("{} has no device copy", weight.name())))
}

fn read_f32(platform: &CudaPlatform, buf: &dyn DeviceBuffer) -> Result<Vec<f32>, DeviceError> {
    let mut bytes = vec![0u8; buf.len() as usize];
    platform.backend().read_back(buf, 0, &mut bytes)?;
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

fn diff(got: &[f32], want: &[f64]) -> (f64, f64) {
    let mut max_abs = 0f64;
    let (mut num, mut den) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        let d = g as f64 - w;
        max_abs = max_abs.max(d.abs());
        num += d * d;
        den += w * w;
    }
    if got.len() != want.len() || got.iter().any(|g| !g.is_finite()) {
        return (f64::INFINITY, f64::INFINITY);
    }
    (max_abs, (num / den.max(f64::MIN_POSITIVE)).sqrt())
}

/// Runs both splits over `platforms` (an NCCL group, `ranks[d]` on
/// `platforms[d]`) and compares each rank's result with the product on
/// `platforms[0]` alone.
///
/// # Errors
///
/// NVRTC is missing or fails, or a device or NCCL call failed.
pub fn check_matmul(
    platforms: &[&CudaPlatform],
    ranks: &[NcclRank],
    shape: MatmulShape,
) -> Result<MatmulCheck, DeviceError> {
    if let Some(why) = nvrtc_unavailable_reason() {
        return Err(DeviceError::Unavailable(why));
    }
    let n = platforms.len();
    if ranks.len() != n || n == 0 || !shape.out.is_multiple_of(n) {
        return Err(DeviceError::Misuse(format!(
            "{n} devices, {} ranks, {} output rows (must divide evenly)",
            ranks.len(),
            shape.out
        )));
    }
    let ptx = cudarc::nvrtc::compile_ptx(KERNEL)
        .map_err(|e| DeviceError::Unavailable(format!("NVRTC: {e:?}")))?;
    let ptx = CString::new(ptx.to_src())
        .map_err(|_| DeviceError::Misuse("PTX with a NUL byte".into()))?;
    let kernels = platforms
        .iter()
        .map(|p| Kernel::load(p, &ptx))
        .collect::<Result<Vec<_>, _>>()?;
    let MatmulShape { out, inp, batch } = shape;
    let w = values(11, out * inp);
    let x = values(12, inp * batch);

    // The reference: float64 on the CPU, and the whole product on one GPU.
    let mut reference = vec![0f64; out * batch];
    for row in 0..out {
        for j in 0..inp {
            let wv = w[row * inp + j] as f64;
            for b in 0..batch {
                reference[row * batch + b] += wv * x[j * batch + b] as f64;
            }
        }
    }
    let one = platforms[0];
    let w_all = stage(one, "w", vec![inp as u64, out as u64], &w)?;
    let x_all = stage(one, "x", vec![batch as u64, inp as u64], &x)?;
    let y_one = one.backend().allocate((out * batch * 4) as u64)?;
    kernels[0].run(
        device_buffer(&w_all)?,
        device_buffer(&x_all)?,
        &*y_one,
        shape,
    )?;
    let y1 = read_f32(one, &*y_one)?;
    let y1_f64: Vec<f64> = y1.iter().map(|&v| v as f64).collect();
    let one_gpu_rel_diff_vs_f64 = diff(&y1, &reference).1;

    let mut splits = Vec::new();

    // Row split: each rank a slice of the inputs, partial sums all-reduced.
    let cols = split_even(inp as u64, n);
    let results = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let (platform, kernel, rank, c) = (platforms[r], &kernels[r], &ranks[r], &cols[r]);
                let (w, x) = (&w, &x);
                scope.spawn(move || -> Result<Vec<f32>, DeviceError> {
                    let (c0, c1) = (c.start as usize, c.end as usize);
                    let k = c1 - c0;
                    let w_part: Vec<f32> = (0..out)
                        .flat_map(|row| w[row * inp + c0..row * inp + c1].iter().copied())
                        .collect();
                    let w_r = stage(platform, "w.cols", vec![k as u64, out as u64], &w_part)?;
                    let x_r = stage(
                        platform,
                        "x.rows",
                        vec![batch as u64, k as u64],
                        &x[c0 * batch..c1 * batch],
                    )?;
                    let y = platform.backend().allocate((out * batch * 4) as u64)?;
                    let part = MatmulShape { out, inp: k, batch };
                    kernel.run(device_buffer(&w_r)?, device_buffer(&x_r)?, &*y, part)?;
                    rank.all_reduce_sum_f32(&*y, out * batch)?;
                    read_f32(platform, &*y)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect::<Result<Vec<_>, _>>()
    })?;
    splits.push(worst("row_split_all_reduce", &results, &y1_f64));

    // Column split: each rank a slice of the output rows, gathered.
    let rows = split_even(out as u64, n);
    let results = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let (platform, kernel, rank, rr) = (platforms[r], &kernels[r], &ranks[r], &rows[r]);
                let (w, x) = (&w, &x);
                scope.spawn(move || -> Result<Vec<f32>, DeviceError> {
                    let (r0, r1) = (rr.start as usize, rr.end as usize);
                    let m = r1 - r0;
                    let w_r = stage(
                        platform,
                        "w.rows",
                        vec![inp as u64, m as u64],
                        &w[r0 * inp..r1 * inp],
                    )?;
                    let x_r = stage(platform, "x", vec![batch as u64, inp as u64], x)?;
                    let y_part = platform.backend().allocate((m * batch * 4) as u64)?;
                    let y = platform.backend().allocate((out * batch * 4) as u64)?;
                    let part = MatmulShape { out: m, inp, batch };
                    kernel.run(device_buffer(&w_r)?, device_buffer(&x_r)?, &*y_part, part)?;
                    rank.all_gather_f32(&*y_part, &*y, m * batch)?;
                    read_f32(platform, &*y)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect::<Result<Vec<_>, _>>()
    })?;
    splits.push(worst("column_split_all_gather", &results, &y1_f64));

    Ok(MatmulCheck {
        devices: platforms.iter().map(|p| p.backend().name()).collect(),
        shape,
        one_gpu_rel_diff_vs_f64,
        splits,
    })
}

fn worst(split: &'static str, results: &[Vec<f32>], want: &[f64]) -> SplitCheck {
    let (max_abs_diff, rel_diff) = results
        .iter()
        .map(|y| diff(y, want))
        .fold((0f64, 0f64), |(a, r), (a2, r2)| (a.max(a2), r.max(r2)));
    SplitCheck {
        split,
        max_abs_diff,
        rel_diff,
    }
}
