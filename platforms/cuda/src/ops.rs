//! The device op layer on CUDA ([`CudaOps`]): `device-ops`' [`Ops`] with
//! kernels in CUDA C (`ops.cu`, embedded), compiled at run time by NVRTC
//! (cudarc's `nvrtc`, libnvrtc loaded at run time as libcuda is) to a CUBIN
//! for the device's architecture, once per process and architecture
//! ([`cubin`], kept on disk between processes by [`kernel_cache`]), and
//! launched on the session's queue, so they order after the seam's staging
//! copies on that stream.
//!
//! A weight is read where the seam put it: the staged copy
//! (`Resident::Device`, the [`CudaBuffer`]'s device pointer) or, on a part
//! whose kernels read pageable host memory, the host bytes themselves. No
//! op reads a weight back. Products first round the activations as ggml's
//! CPU does for the weight's type (`act_*` kernels; the rounded tensor is
//! kept for the next product of the same input), then one warp per output
//! row sums the row's blocks, each block's scales decoded once. Against a
//! type of [`INT8_KERNELS`] the activations are rounded to int8 codes
//! instead and summed in integers (`dp4a`), as ggml's CPU multiplies them.
//!
//! A decode step launches about a hundred kernels a layer, so nothing in
//! the op layer waits for the device unless the host needs a value: op
//! outputs come from a pool of device buffers reused in stream order
//! (`pool`), small uploads are queued from a pinned arena (`upload`), and
//! only a read-back synchronizes. `SEAM_CUDA_KERNEL_TIMES=1` prints each
//! kernel's device time when the op layer is dropped (`timing`).

use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{result, sys};
use cudarc::nvrtc::result as nvrtc;
use cudarc::nvrtc::sys as nvrtc_sys;
use device_ops::{
    Attention, AttnMask, CounterCell, DType, DeviceRouting, DeviceTensor, Gating, KvCache,
    MultiRope, NormWeight, OpCounters, OpError, Ops, OpsId, OuterFactor, Rope, RopeMode,
    WeightShape, byte_len, check_add_outer, check_attention, check_delta_gates, check_delta_net,
    check_gated_mean_rows, check_gather_rows, check_imrope, check_mask, check_matmul_id,
    check_mix_experts, check_norm_weight, check_repeat, check_rope, check_route, check_same,
    check_slice_cols, check_ssm_conv, check_tensor, check_upload, check_write_rows, le_bytes,
    matmul_shape,
};
use seam::Resident;
use seam::gguf::GgmlType;
use seam::platform::{DeviceBuffer, DeviceError, Platform, Queue};
use seam::weight::Weight;

use crate::tensor_parallel::nvrtc_unavailable_reason;
use crate::{CudaBuffer, CudaPlatform, cuda_buffer, cuda_queue, driver_error};

pub mod kernel_cache;
mod pool;
mod timing;
mod upload;

pub use timing::KERNEL_TIMES_ENV;

use pool::{BufferPool, PooledBuffer};
use upload::UploadArena;

/// The kernels' CUDA C source, less the IQ types' grids ([`source`]
/// prepends them).
pub const KERNELS_CU: &str = include_str!("ops.cu");

/// The kernels' CUDA C source: the IQ types' grids as `__device__ const`
/// arrays, generated from family-ops' tables (`device_ops::grids`, the one
/// home of those numbers), then [`KERNELS_CU`].
pub fn source() -> &'static str {
    static SOURCE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SOURCE.get_or_init(|| with_grids(KERNELS_CU))
}

/// A file compiled in place of the built-in kernels ([`KERNELS_CU`]), the
/// IQ grids still prepended: for tuning the kernels on a GPU machine that
/// has no Rust toolchain (edit a copy of `ops.cu`, point this at it, run a
/// binary; `SEAM_CUDA_KERNEL_TIMES=1` prints the times). It must define
/// every kernel the built-in source does. Unset: the built-in source.
pub const KERNELS_SOURCE_ENV: &str = "SEAM_CUDA_KERNELS_SOURCE";

/// The source this process compiles: [`source`], or the grids and the file
/// [`KERNELS_SOURCE_ENV`] names (read once).
///
/// # Errors
///
/// The file cannot be read (its path and the reason).
fn build_source() -> Result<&'static str, String> {
    static BUILD: OnceLock<Result<String, String>> = OnceLock::new();
    match BUILD.get_or_init(|| {
        kernels_from(
            std::env::var_os(KERNELS_SOURCE_ENV)
                .as_deref()
                .map(Path::new),
        )
        .map(|k| k.map_or_else(|| source().to_owned(), |k| with_grids(&k)))
    }) {
        Ok(s) => Ok(s.as_str()),
        Err(e) => Err(e.clone()),
    }
}

/// The kernels of the file at `path` (`None`: the built-in ones).
fn kernels_from(path: Option<&Path>) -> Result<Option<String>, String> {
    path.map(|p| {
        std::fs::read_to_string(p).map_err(|e| format!("{KERNELS_SOURCE_ENV}={}: {e}", p.display()))
    })
    .transpose()
}

/// The IQ types' grids, then `kernels`.
fn with_grids(kernels: &str) -> String {
    {
        use device_ops::grids;
        let mut s = String::from("// Generated from family-ops' grids.rs; see ops.rs.\n");
        grid_table(
            &mut s,
            "unsigned long long",
            "iq2xxs_grid",
            &grids::IQ2XXS_GRID,
        );
        grid_table(
            &mut s,
            "unsigned long long",
            "iq2xs_grid",
            &grids::IQ2XS_GRID,
        );
        grid_table(&mut s, "unsigned long long", "iq2s_grid", &grids::IQ2S_GRID);
        grid_table(&mut s, "unsigned int", "iq3xxs_grid", &grids::IQ3XXS_GRID);
        grid_table(&mut s, "unsigned int", "iq3s_grid", &grids::IQ3S_GRID);
        grid_table(&mut s, "unsigned long long", "iq1s_grid", &grids::IQ1S_GRID);
        s.push_str(kernels);
        s
    }
}

/// Appends `__device__ const ty name[n] = {...};` holding `values` in hex:
/// global memory read through the L1 cache. (`__constant__` serializes a
/// warp's loads of different entries, and a warp's lanes index a grid at
/// random.)
fn grid_table<T: std::fmt::LowerHex>(s: &mut String, ty: &str, name: &str, values: &[T]) {
    use std::fmt::Write as _;
    let _ = write!(s, "__device__ const {ty} {name}[{}] = {{", values.len());
    for (k, v) in values.iter().enumerate() {
        if k % 8 == 0 {
            s.push_str("\n   ");
        }
        let _ = write!(s, " {v:#x},");
    }
    s.push_str("\n};\n");
}

/// The options every compilation uses: no contracted multiply-adds, so
/// each product and sum rounds as the CPU reference's does.
pub const NVRTC_OPTIONS: &[&str] = &["--fmad=false", "--std=c++17"];

/// NVRTC options added to [`NVRTC_OPTIONS`], space-separated, for tuning
/// the kernels on a device (`--maxrregcount=80`); part of the kernel
/// cache's key. Unset: none.
pub const NVRTC_EXTRA_ENV: &str = "SEAM_NVRTC_EXTRA";

/// [`NVRTC_OPTIONS`] and the extra ones [`NVRTC_EXTRA_ENV`] names.
fn nvrtc_options() -> Vec<String> {
    let extra = std::env::var(NVRTC_EXTRA_ENV).unwrap_or_default();
    NVRTC_OPTIONS
        .iter()
        .map(|s| (*s).to_owned())
        .chain(extra.split_whitespace().map(str::to_owned))
        .collect()
}

/// The weight types with product and gather kernels, and their kernels'
/// suffix (`matmul_q4_k`, `get_rows_q4_k`).
pub const WEIGHT_KERNELS: &[(GgmlType, &str)] = &[
    (GgmlType::F32, "f32"),
    (GgmlType::F16, "f16"),
    (GgmlType::BF16, "bf16"),
    (GgmlType::Q4_0, "q4_0"),
    (GgmlType::Q4_1, "q4_1"),
    (GgmlType::Q5_0, "q5_0"),
    (GgmlType::Q5_1, "q5_1"),
    (GgmlType::Q8_0, "q8_0"),
    (GgmlType::Q2_K, "q2_k"),
    (GgmlType::Q3_K, "q3_k"),
    (GgmlType::Q4_K, "q4_k"),
    (GgmlType::Q5_K, "q5_k"),
    (GgmlType::Q6_K, "q6_k"),
    (GgmlType::IQ4_NL, "iq4_nl"),
    (GgmlType::IQ4_XS, "iq4_xs"),
    (GgmlType::TQ2_0, "tq2_0"),
    (GgmlType::MXFP4, "mxfp4"),
    (GgmlType::TQ1_0, "tq1_0"),
    (GgmlType::NVFP4, "nvfp4"),
    (GgmlType::IQ2_XXS, "iq2_xxs"),
    (GgmlType::IQ2_XS, "iq2_xs"),
    (GgmlType::IQ2_S, "iq2_s"),
    (GgmlType::IQ3_XXS, "iq3_xxs"),
    (GgmlType::IQ3_S, "iq3_s"),
    (GgmlType::IQ1_S, "iq1_s"),
    (GgmlType::IQ1_M, "iq1_m"),
];

/// The weight types with int8 products (`matvec_i8_*`, a decode step's
/// one activation row; `matmul_i8_*`, several; `matvec_id_i8_*` and
/// `matmul_id_i8_*`, the expert products of one token and of several):
/// those whose activations ggml's CPU rounds to int8 blocks, among the
/// types the public checkpoints hold.
pub const INT8_KERNELS: &[(GgmlType, &str)] = &[
    (GgmlType::Q8_0, "q8_0"),
    (GgmlType::Q4_K, "q4_k"),
    (GgmlType::Q5_K, "q5_k"),
    (GgmlType::Q6_K, "q6_k"),
    (GgmlType::IQ2_XXS, "iq2_xxs"),
    (GgmlType::IQ2_XS, "iq2_xs"),
    (GgmlType::IQ2_S, "iq2_s"),
    (GgmlType::IQ3_XXS, "iq3_xxs"),
    (GgmlType::IQ4_XS, "iq4_xs"),
    (GgmlType::IQ4_NL, "iq4_nl"),
];

/// The kernels besides the per-type ones.
pub const OTHER_KERNELS: &[&str] = &[
    "matmul_tinyblas_f32",
    "matmul_tinyblas_f16",
    "matmul_tinyblas_bf16",
    "act_f16",
    "act_bf16",
    "act_q8_0",
    "act_q8_k",
    "act_q8_0_i8",
    "act_q8_k_i8",
    "rms_norm_f32",
    "rope_f32",
    "softmax_f32",
    "silu_f32",
    "silu_scaled_f32",
    "gelu_f32",
    "swiglu_f32",
    "add_f32",
    "mul_f32",
    "mul_sigmoid_f32",
    "scale_f32",
    "copy_f32",
    "copy_f32_f16",
    "copy_f16",
    "attention_f32",
    "attention_f16",
    "route_f32",
    "argmax_f32",
    "ssm_conv_f32",
    "delta_net_f32",
    "sigmoid_f32",
    "softplus_f32",
    "delta_gates_f32",
    "l2_norm_f32",
    "slice_cols_f32",
    "imrope_f32",
    "mix_experts_f32",
    "gather_rows_f32",
    "add_outer_f32",
    "gated_mean_rows_f32",
    // glm_moe_dsa's ops
    "rope_ggml_f32",
    "concat_cols_f32",
    "layer_norm_f32",
    "hadamard_f32",
    "lightning_scores_f32",
    // muse_glimmer's ops
    "softcap_f32",
    "dot_rows_f64_f32",
    "transpose_f32",
    "layer_norm_f64_f32",
    "gelu_erf_f32",
    // glm5_next's ops
    "kda_gate_f32",
    "hc_weights_f32",
    "hc_pre_weighted_f32",
    "hc_post_mixed_f32",
    "pool_keys_f32",
    "attention_slots_f32",
    "swiglu_clamp_f32",
];

/// Every kernel's name.
pub fn kernel_names() -> Vec<String> {
    WEIGHT_KERNELS
        .iter()
        .flat_map(|(ty, s)| {
            let float_products = int8_suffix(*ty).is_none();
            [
                Some(format!("get_rows_{s}")),
                float_products.then(|| format!("matmul_{s}")),
                float_products.then(|| format!("matmul_id_{s}")),
            ]
        })
        .flatten()
        .chain(INT8_KERNELS.iter().flat_map(|(_, s)| {
            [
                format!("matvec_i8_{s}"),
                format!("matmul_i8_{s}"),
                format!("matvec_id_i8_{s}"),
                format!("matmul_id_i8_{s}"),
            ]
        }))
        .chain(OTHER_KERNELS.iter().map(|s| (*s).to_owned()))
        .collect()
}

/// The int8 products' kernel suffix for a weight type, if it has them.
fn int8_suffix(ty: GgmlType) -> Option<&'static str> {
    INT8_KERNELS.iter().find(|(t, _)| *t == ty).map(|(_, s)| *s)
}

/// How ggml's CPU rounds the activations a weight of `ty` is multiplied
/// by (`family_ops::as_ggml_multiplies`): the kernel, and its block.
fn activation_kernel(ty: GgmlType) -> Option<(&'static str, usize)> {
    use GgmlType::*;
    match ty {
        F32 => None,
        F16 => Some(("act_f16", 1)),
        BF16 => Some(("act_bf16", 1)),
        Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ1_S
        | IQ1_M | IQ4_XS | TQ1_0 | TQ2_0 => Some(("act_q8_k", 256)),
        _ => Some(("act_q8_0", 32)),
    }
}

/// The NVRTC log of a failed compilation, or the error's name.
fn program_log(prog: nvrtc_sys::nvrtcProgram) -> String {
    // SAFETY: `prog` is a live program (destroyed by the caller after this).
    match unsafe { nvrtc::get_program_log(prog) } {
        Ok(log) => {
            let bytes: Vec<u8> = log
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c as u8)
                .collect();
            String::from_utf8_lossy(&bytes).into_owned()
        }
        Err(e) => format!("(no log: {e:?})"),
    }
}

/// Compiles [`source`] for `arch` (`sm_90`) with NVRTC and returns the
/// CUBIN. Not cached: see [`cubin`].
///
/// # Errors
///
/// libnvrtc is absent (the names searched), or the compilation failed (the
/// log).
pub fn compile_cubin(arch: &str) -> Result<Vec<u8>, String> {
    compile_source(build_source()?, arch)
}

/// Compiles CUDA C `source` for `arch` with [`NVRTC_OPTIONS`] and returns
/// the CUBIN.
///
/// # Errors
///
/// As [`compile_cubin`].
pub fn compile_source(source: &str, arch: &str) -> Result<Vec<u8>, String> {
    if let Some(why) = nvrtc_unavailable_reason() {
        return Err(why);
    }
    let src = CString::new(source).map_err(|_| "the source holds a NUL byte".to_owned())?;
    let prog = nvrtc::create_program(&src, Some(c"seam_ops.cu"))
        .map_err(|e| format!("nvrtcCreateProgram: {e:?}"))?;
    let mut options = nvrtc_options();
    options.push(format!("--gpu-architecture={arch}"));
    // SAFETY: `prog` was just created and is destroyed below, once.
    let compiled = unsafe { nvrtc::compile_program(prog, &options) }
        .map_err(|e| format!("NVRTC {e:?} for {arch}:\n{}", program_log(prog)))
        .and_then(|()| {
            let mut size = 0usize;
            // SAFETY: `prog` compiled; `size` is a valid out-pointer.
            unsafe { nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size) }
                .result()
                .map_err(|e| format!("nvrtcGetCUBINSize: {e:?}"))?;
            let mut cubin = vec![0u8; size];
            // SAFETY: `cubin` holds the `size` bytes NVRTC reported.
            unsafe { nvrtc_sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast()) }
                .result()
                .map_err(|e| format!("nvrtcGetCUBIN: {e:?}"))?;
            Ok(cubin)
        });
    // SAFETY: created above, destroyed once.
    let _ = unsafe { nvrtc::destroy_program(prog) };
    compiled
}

/// The CUBIN for `arch`, made once per process (the first caller makes
/// it; a failure is kept too, so it is not retried per op set): read from
/// the kernel cache folder ([`kernel_cache`], `SEAM_KERNEL_CACHE`) where
/// an earlier process compiled the same source for `arch`, else compiled
/// and kept there.
///
/// # Errors
///
/// As [`compile_cubin`].
pub fn cubin(arch: &str) -> Result<Arc<[u8]>, String> {
    type Cache = Mutex<HashMap<String, Result<Arc<[u8]>, String>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    cache
        .entry(arch.to_owned())
        .or_insert_with(|| {
            let dir = kernel_cache::cache_dir();
            let options = nvrtc_options();
            let options: Vec<&str> = options.iter().map(String::as_str).collect();
            let source = build_source()?;
            kernel_cache::cached(dir.as_deref(), source, &options, arch, || {
                compile_cubin(arch)
            })
            .map(|(image, _)| Arc::from(image))
        })
        .clone()
}

/// A loaded module and its functions, unloaded when dropped.
struct Module<'p> {
    module: sys::CUmodule,
    functions: HashMap<String, sys::CUfunction>,
    platform: &'p CudaPlatform,
}

impl Drop for Module<'_> {
    fn drop(&mut self) {
        if self.platform.backend.ctx.bind().is_ok() {
            // SAFETY: loaded in `CudaOps::new` in this context, unloaded once.
            let _ = unsafe { result::module::unload(self.module) };
        }
    }
}

/// Uploads the host libm's rounding of `expf` and `logf`
/// ([`device_ops::libm_rounding`]) and points `ops.cu`'s
/// `libm_misrounded`, `libm_misrounded_len` and `libm_tie_window` at it,
/// so the kernels round those functions as the CPU reference does. The
/// buffers must live as long as the module's launches.
fn upload_libm_rounding(
    module: sys::CUmodule,
    pool: &Arc<BufferPool>,
) -> Result<Vec<PooledBuffer>, DeviceError> {
    use device_ops::libm_rounding::{LibmFn, misrounded};
    let mut buffers = Vec::with_capacity(LibmFn::ALL.len());
    let mut ptrs = [0u64; LibmFn::ALL.len()];
    let mut lens = [0i32; LibmFn::ALL.len()];
    let mut windows = [0f64; LibmFn::ALL.len()];
    for (i, f) in LibmFn::ALL.into_iter().enumerate() {
        let list = misrounded(f);
        let buffer = pool.take(std::mem::size_of_val(list) as u64)?;
        // SAFETY: the buffer holds the list's bytes; a synchronous copy
        // from a live slice, the context current (`CudaOps::new` bound it).
        unsafe { result::memcpy_htod_sync(buffer.ptr(), list) }
            .map_err(|e| driver_error("cuMemcpyHtoD (libm rounding)", e))?;
        ptrs[i] = buffer.ptr();
        lens[i] = i32::try_from(list.len()).map_err(|_| {
            DeviceError::Unavailable(format!("{} list of {}", f.name(), list.len()))
        })?;
        windows[i] = f.tie_window();
        buffers.push(buffer);
    }
    set_module_global(module, c"libm_misrounded", &ptrs)?;
    set_module_global(module, c"libm_misrounded_len", &lens)?;
    set_module_global(module, c"libm_tie_window", &windows)?;
    Ok(buffers)
}

/// Writes `values` into the module's `__device__` variable `name`, which
/// must be exactly their size.
fn set_module_global<T: Copy>(
    module: sys::CUmodule,
    name: &std::ffi::CStr,
    values: &[T],
) -> Result<(), DeviceError> {
    // SAFETY: `module` is loaded in the current context; the name is
    // NUL-terminated.
    let (ptr, bytes) = unsafe { result::module::get_global(module, name.to_owned()) }
        .map_err(|e| driver_error("cuModuleGetGlobal", e))?;
    if bytes != std::mem::size_of_val(values) {
        return Err(DeviceError::Unavailable(format!(
            "{}: the module's variable has {bytes} bytes, not {}",
            name.to_string_lossy(),
            std::mem::size_of_val(values)
        )));
    }
    // SAFETY: the variable holds `bytes` bytes, the size of `values`.
    unsafe { result::memcpy_htod_sync(ptr, values) }
        .map_err(|e| driver_error("cuMemcpyHtoD (module variable)", e))
}

/// One kernel argument, passed by address: a pointer, an `int`, a `long
/// long` or a `float`, each in the low bytes of a 64-bit slot
/// (little-endian), which is what `cuLaunchKernel` reads.
#[derive(Clone, Copy)]
enum Arg {
    Ptr(u64),
    I32(i32),
    I64(i64),
    F32(f32),
}

impl Arg {
    fn slot(self) -> u64 {
        match self {
            Arg::Ptr(p) => p,
            Arg::I32(v) => u64::from(v as u32),
            Arg::I64(v) => v as u64,
            Arg::F32(v) => u64::from(v.to_bits()),
        }
    }
}

/// Threads per block of every kernel (`act_q8_k` needs exactly 256).
const THREADS: u32 = 256;
/// Most blocks of a grid-stride launch.
const MAX_BLOCKS: u64 = 1 << 16;

/// CUDA ops on one device, launched on one queue.
pub struct CudaOps<'p> {
    platform: &'p CudaPlatform,
    stream: sys::CUstream,
    module: Module<'p>,
    id: OpsId,
    counters: CounterCell,
    /// Outputs and scratch, reused (a `cuMemFree` per op waited for the
    /// whole device).
    pool: Arc<BufferPool>,
    /// Small uploads, queued from pinned memory without a synchronize.
    uploads: Mutex<UploadArena>,
    /// Per-launch events, where [`KERNEL_TIMES_ENV`] asks for them.
    times: Option<Mutex<timing::KernelTimes>>,
    /// The last activations rounded for a weight type ([`RoundedCache`]).
    rounded: Mutex<RoundedCache>,
    /// The device's multiprocessors (a product's launch shape).
    sms: u32,
    /// The host libm's rounding lists the kernels' `libm_expf`/`libm_logf`
    /// read ([`upload_libm_rounding`]).
    _libm_rounding: Vec<PooledBuffer>,
}

/// Activations rounded as ggml rounds them for a weight type, kept for the
/// next products of the same tensor (a layer's input meets four or five
/// matrices of one type): by the input buffer's hand-out serial, the
/// rounding kernel and the element count. A buffer handed out again has a
/// new serial; the ops that write a tensor in place (`write_rows`, the
/// conv and delta-rule states) empty the cache.
#[derive(Default)]
struct RoundedCache {
    entries: Vec<(u64, &'static str, usize, DeviceTensor)>,
}

/// Rounded tensors kept at most.
const ROUNDED_KEPT: usize = 4;

impl Drop for CudaOps<'_> {
    fn drop(&mut self) {
        // Copies queued from the upload arena must complete before it is
        // freed (it drops after this).
        let _ = self.sync("drop");
        if let Some(times) = &self.times {
            let mut times = times.lock().unwrap_or_else(|e| e.into_inner());
            eprint!("{}", times.table());
        }
    }
}

// SAFETY: the stream, module and function handles may be used from any
// thread with their context current; every call binds it first, and the
// driver orders work on the stream.
unsafe impl Send for CudaOps<'_> {}
// SAFETY: as above.
unsafe impl Sync for CudaOps<'_> {}

fn kernels_error(platform: &CudaPlatform, why: String) -> OpError {
    OpError::Kernels {
        device: platform.backend().name(),
        why,
    }
}

impl<'p> CudaOps<'p> {
    /// The ops of `platform`, launched on `queue` (the session's: its
    /// staging copies come first on that stream). Compiles the kernels for
    /// the device's architecture on the process's first call.
    ///
    /// # Errors
    ///
    /// `queue` is not a CUDA stream, libnvrtc is absent, the compilation
    /// or the module load failed.
    pub fn new(platform: &'p CudaPlatform, queue: &'p dyn Queue) -> Result<CudaOps<'p>, OpError> {
        let stream = cuda_queue(queue).map_err(OpError::device("ops"))?.stream;
        let ctx = &platform.backend.ctx;
        ctx.bind().map_err(OpError::device("ops"))?;
        let attr = |a| {
            // SAFETY: the device came from `device::get` in `open`.
            unsafe { result::device::get_attribute(ctx.device, a) }
                .map_err(|e| kernels_error(platform, format!("cuDeviceGetAttribute: {e:?}")))
        };
        let major = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let sms = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let image = cubin(&format!("sm_{major}{minor}")).map_err(|w| kernels_error(platform, w))?;
        // SAFETY: `image` is a CUBIN NVRTC produced for this device's
        // architecture; the context is current; unloaded in `Module::drop`.
        let module = unsafe { result::module::load_data(image.as_ptr().cast()) }
            .map_err(|e| driver_error("cuModuleLoadData", e))
            .map_err(OpError::device("ops"))?;
        let mut module = Module {
            module,
            functions: HashMap::new(),
            platform,
        };
        for name in kernel_names() {
            let c =
                CString::new(name.clone()).map_err(|_| kernels_error(platform, name.clone()))?;
            // SAFETY: `module` is loaded; the name is NUL-terminated.
            let f = unsafe { result::module::get_function(module.module, c) }
                .map_err(|e| kernels_error(platform, format!("{name}: {e:?}")))?;
            module.functions.insert(name, f);
        }
        let uploads = UploadArena::new(Arc::clone(ctx)).map_err(OpError::device("ops"))?;
        let pool = BufferPool::new(Arc::clone(ctx));
        let libm_rounding =
            upload_libm_rounding(module.module, &pool).map_err(OpError::device("ops"))?;
        Ok(CudaOps {
            platform,
            stream,
            module,
            id: OpsId::fresh(),
            counters: CounterCell::default(),
            pool,
            uploads: Mutex::new(uploads),
            times: timing::KernelTimes::wanted().then(Mutex::default),
            rounded: Mutex::default(),
            sms: u32::try_from(sms).unwrap_or(1).max(1),
            _libm_rounding: libm_rounding,
        })
    }

    fn launch(
        &self,
        op: &'static str,
        kernel: &str,
        grid: (u32, u32),
        args: &[Arg],
    ) -> Result<(), OpError> {
        let f = *self
            .module
            .functions
            .get(kernel)
            .ok_or_else(|| kernels_error(self.platform, format!("no kernel {kernel}")))?;
        let mut slots: Vec<u64> = args.iter().map(|a| a.slot()).collect();
        let mut params: Vec<*mut c_void> = slots
            .iter_mut()
            .map(|s| (s as *mut u64).cast::<c_void>())
            .collect();
        self.platform
            .backend
            .ctx
            .bind()
            .map_err(OpError::device(op))?;
        let start = self
            .times
            .as_ref()
            .and_then(|_| timing::KernelTimes::mark(self.stream));
        // SAFETY: `args` match the kernel's parameters in `ops.cu` (each
        // caller passes them in order, pointers to buffers holding what the
        // shape checks asked for); the slots outlive the call, which copies
        // them; the stream is the session's, alive for 'p.
        unsafe {
            result::launch_kernel(
                f,
                (grid.0.max(1), grid.1.max(1), 1),
                (THREADS, 1, 1),
                0,
                self.stream,
                &mut params,
            )
        }
        .map_err(|e| driver_error(kernel, e))
        .map_err(OpError::device(op))?;
        if let (Some(times), Some(start)) = (&self.times, start)
            && let Some(end) = timing::KernelTimes::mark(self.stream)
        {
            let mut times = times.lock().unwrap_or_else(|e| e.into_inner());
            times.push(kernel, start, end);
        }
        self.counters.launch();
        Ok(())
    }

    /// Blocks of a product over `rows` rows of `ne0` elements of `ty`: a
    /// warp a row, 8 rows a block; or, where that leaves multiprocessors
    /// idle and a row has a unit for every thread of a block, a block a row
    /// (its 8 warps share the row; `ops.cu`'s `row_part` tells the two
    /// apart by the grid). A unit is what one lane takes at a time: half a
    /// block of the float products' 32-element types, 32 elements of the
    /// rest (the int8 products' too, and F32/F16/BF16's, whose rows are
    /// ggml's 32 accumulators, one warp's lanes: a block a row stages the
    /// weight for them, `float_lanes_block_row`).
    fn product_blocks(&self, ty: GgmlType, rows: usize, ne0: usize) -> u32 {
        use GgmlType::*;
        let warp_blocks = rows.div_ceil(8);
        let unit = match ty {
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | MXFP4 | NVFP4 => 16,
            _ => 32,
        };
        if warp_blocks < self.sms as usize && ne0 / unit >= THREADS as usize {
            rows as u32
        } else {
            warp_blocks as u32
        }
    }

    /// A grid-stride grid over `n` items of `per_block` each.
    fn blocks(n: u64, per_block: u64) -> u32 {
        n.div_ceil(per_block.max(1)).clamp(1, MAX_BLOCKS) as u32
    }

    fn alloc(&self, op: &'static str, bytes: usize) -> Result<Box<dyn DeviceBuffer>, OpError> {
        let buf = self.pool.take(bytes as u64).map_err(OpError::device(op))?;
        Ok(Box::new(buf))
    }

    /// Bytes of device memory the op layer keeps for reuse now.
    pub fn kept_bytes(&self) -> u64 {
        self.pool.kept_bytes()
    }

    fn output(&self, op: &'static str, shape: &[usize]) -> Result<DeviceTensor, OpError> {
        self.output_of(op, DType::F32, shape)
    }

    fn output_of(
        &self,
        op: &'static str,
        dtype: DType,
        shape: &[usize],
    ) -> Result<DeviceTensor, OpError> {
        let bytes = byte_len(op, dtype, shape)?;
        DeviceTensor::from_buffer(self.id, self.alloc(op, bytes)?, dtype, shape)
    }

    /// A scratch buffer of `bytes` (at least 8), handed back to the pool
    /// when it drops (the next user is queued after the kernels that use
    /// it, on the same stream).
    fn scratch(&self, op: &'static str, bytes: usize) -> Result<Box<dyn DeviceBuffer>, OpError> {
        self.alloc(op, bytes.max(8))
    }

    /// The device address of an op output (a pooled buffer) or of a
    /// backend allocation.
    fn buf_ptr(op: &'static str, buf: &dyn DeviceBuffer) -> Result<u64, OpError> {
        if let Some(p) = buf.as_any().downcast_ref::<PooledBuffer>() {
            return Ok(p.ptr());
        }
        Ok(cuda_buffer(buf).map_err(OpError::device(op))?.ptr)
    }

    fn ptr(
        &self,
        op: &'static str,
        what: &'static str,
        t: &DeviceTensor,
        dtype: DType,
    ) -> Result<u64, OpError> {
        check_tensor(self, op, what, t, dtype)?;
        Self::buf_ptr(op, t.buffer())
    }

    fn weight_ptr(
        &self,
        op: &'static str,
        weight: &Weight,
        resident: &Resident<'_>,
    ) -> Result<u64, OpError> {
        let foreign = |why: String| OpError::ForeignWeight {
            op,
            weight: weight.name().to_owned(),
            device: self.device_name(),
            why,
        };
        match resident {
            Resident::Device(copy) => {
                if copy.device() != self.platform.device_id() {
                    return Err(foreign(format!(
                        "it is staged on device {:?}",
                        copy.device()
                    )));
                }
                let buf: &CudaBuffer =
                    cuda_buffer(copy.buffer()).map_err(|e| foreign(e.to_string()))?;
                Ok(buf.ptr)
            }
            // Kernels read pageable host memory on this part (the seam
            // hands out host bytes only where the platform says so).
            Resident::Host(view) if self.platform.host_memory_is_device_addressable() => {
                Ok(view.as_ptr() as u64)
            }
            Resident::Host(_) => Err(foreign("host bytes this device cannot address".into())),
        }
    }

    fn weight_suffix(&self, op: &'static str, weight: &Weight) -> Result<&'static str, OpError> {
        WEIGHT_KERNELS
            .iter()
            .find(|(t, _)| *t == weight.ggml_type())
            .map(|(_, s)| *s)
            .ok_or_else(|| OpError::UnsupportedType {
                op,
                device: self.device_name(),
                ty: weight.ggml_type(),
                weight: weight.name().to_owned(),
            })
    }

    fn dim(op: &'static str, what: &str, v: usize) -> Result<i32, OpError> {
        i32::try_from(v).map_err(|_| OpError::Invalid {
            op,
            why: format!("{what} {v} is past the kernels' 32-bit index"),
        })
    }

    /// Waits for the session's stream (the upload arena is not told).
    fn synchronize_stream(&self) -> Result<(), DeviceError> {
        self.platform.backend.ctx.bind()?;
        // SAFETY: the session's stream, alive for 'p.
        unsafe { result::stream::synchronize(self.stream) }
            .map_err(|e| driver_error("cuStreamSynchronize", e))
    }

    fn sync(&self, op: &'static str) -> Result<(), OpError> {
        self.synchronize_stream().map_err(OpError::device(op))?;
        self.uploads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .synchronized();
        Ok(())
    }

    fn upload_bytes(
        &self,
        op: &'static str,
        bytes: &[u8],
        dtype: DType,
        shape: &[usize],
    ) -> Result<DeviceTensor, OpError> {
        let buf = self.alloc(op, bytes.len())?;
        if !bytes.is_empty() && UploadArena::fits(bytes.len()) {
            let ptr = Self::buf_ptr(op, &*buf)?;
            let mut arena = self.uploads.lock().unwrap_or_else(|e| e.into_inner());
            // SAFETY: `buf` holds `bytes.len()` bytes; the stream is the
            // session's, of this context.
            unsafe { arena.queue_copy(ptr, bytes, self.stream, || self.synchronize_stream()) }
                .map_err(OpError::device(op))?;
        } else if !bytes.is_empty() {
            let ptr = Self::buf_ptr(op, &*buf)?;
            self.platform
                .backend
                .ctx
                .bind()
                .map_err(OpError::device(op))?;
            // SAFETY: `buf` holds `bytes.len()` bytes; the copy completes
            // at the synchronize below, before `bytes` can go.
            unsafe { result::memcpy_htod_async(ptr, bytes, self.stream) }
                .map_err(|e| driver_error("cuMemcpyHtoDAsync", e))
                .map_err(OpError::device(op))?;
            self.sync(op)?;
        }
        self.counters.upload(bytes.len());
        DeviceTensor::from_buffer(self.id, buf, dtype, shape)
    }

    fn read_bytes(&self, op: &'static str, ptr: u64, out: &mut [u8]) -> Result<(), OpError> {
        if !out.is_empty() {
            self.platform
                .backend
                .ctx
                .bind()
                .map_err(OpError::device(op))?;
            // SAFETY: `ptr` holds at least `out.len()` bytes (its tensor's
            // shape); the copy completes at the synchronize below.
            unsafe { result::memcpy_dtoh_async(out, ptr, self.stream) }
                .map_err(|e| driver_error("cuMemcpyDtoHAsync", e))
                .map_err(OpError::device(op))?;
            self.sync(op)?;
        }
        self.counters.read_back(out.len());
        Ok(())
    }

    /// The device address of `x` rounded as ggml's CPU multiplies it by a
    /// weight of `w.ty` (kept in the [`RoundedCache`] for the next product
    /// of the same tensor), or `xp` itself for F32 weights.
    fn rounded_activations(
        &self,
        op: &'static str,
        w: &WeightShape,
        x: &DeviceTensor,
        xp: u64,
    ) -> Result<u64, OpError> {
        let Some((kernel, block)) = activation_kernel(w.ty) else {
            return Ok(xp);
        };
        self.rounded(op, w, x, xp, kernel, block, None)
    }

    /// `x` rounded to ggml's int8 blocks for a weight of `w.ty` (a type of
    /// [`INT8_KERNELS`]), as the int8 products read it: the codes' address
    /// (one byte an element) and the blocks' f32 scales' address.
    fn rounded_int8(
        &self,
        op: &'static str,
        w: &WeightShape,
        x: &DeviceTensor,
        xp: u64,
    ) -> Result<(u64, u64), OpError> {
        let (kernel, block) = match activation_kernel(w.ty) {
            Some(("act_q8_0", b)) => ("act_q8_0_i8", b),
            Some(("act_q8_k", b)) => ("act_q8_k_i8", b),
            _ => {
                return Err(OpError::Invalid {
                    op,
                    why: format!("{} has no int8 activation blocks", w.ty),
                });
            }
        };
        // The codes padded to whole 16-byte words (the scales start
        // aligned), then a scale a block, in f32s.
        let code_floats = x.len().div_ceil(16) * 4;
        let q = self.rounded(op, w, x, xp, kernel, block, Some(code_floats))?;
        Ok((q, q + 4 * code_floats as u64))
    }

    /// `x` rounded by `kernel` (blocks of `block` elements), or the tensor
    /// the cache kept: f32s, or (`code_floats` given) int8 codes in that
    /// many f32s' room followed by a scale a block.
    #[allow(clippy::too_many_arguments)]
    fn rounded(
        &self,
        op: &'static str,
        w: &WeightShape,
        x: &DeviceTensor,
        xp: u64,
        kernel: &'static str,
        block: usize,
        code_floats: Option<usize>,
    ) -> Result<u64, OpError> {
        if !w.ne0.is_multiple_of(block) {
            return Err(OpError::Shape {
                op,
                what: "x",
                got: x.shape().to_vec(),
                expected: format!("rows of whole {block}-element blocks for {}", w.ty),
            });
        }
        let serial = x
            .buffer()
            .as_any()
            .downcast_ref::<PooledBuffer>()
            .map(PooledBuffer::serial);
        let mut cache = self.rounded.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(serial) = serial
            && let Some((.., t)) = cache
                .entries
                .iter()
                .find(|(s, k, n, _)| *s == serial && *k == kernel && *n == x.len())
        {
            return Self::buf_ptr(op, t.buffer());
        }
        let floats = code_floats.map_or(x.len(), |c| c + x.len() / block);
        let t = self.output(op, &[floats])?;
        let tp = Self::buf_ptr(op, t.buffer())?;
        let items = (x.len() / block) as u64;
        let per_block = match block {
            1 => u64::from(THREADS),
            32 => u64::from(THREADS / 32),
            _ => 1,
        };
        let mut args = vec![Arg::Ptr(xp), Arg::Ptr(tp)];
        if let Some(c) = code_floats {
            args.push(Arg::Ptr(tp + 4 * c as u64));
        }
        args.push(Arg::I64(items as i64));
        self.launch(op, kernel, (Self::blocks(items, per_block), 1), &args)?;
        // Kept while the products queued after it read it: a tensor evicted
        // here goes back to the pool, and its next user is queued after
        // them on the same stream.
        // (A tensor of no pool is kept under serial 0, which no lookup
        // matches, so it too outlives this call.)
        if cache.entries.len() == ROUNDED_KEPT {
            cache.entries.remove(0);
        }
        cache
            .entries
            .push((serial.unwrap_or(0), kernel, x.len(), t));
        Ok(tp)
    }

    /// Forgets every rounded tensor: an op wrote a tensor in place.
    fn forget_rounded(&self) {
        self.rounded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entries
            .clear();
    }

    /// Rows `ids` (or every row when `ids` is `None`) of a staged weight.
    fn gather(
        &self,
        op: &'static str,
        weight: &Weight,
        resident: &Resident<'_>,
        ids: Option<&DeviceTensor>,
    ) -> Result<DeviceTensor, OpError> {
        let w = WeightShape::of(op, weight, resident)?;
        let suffix = self.weight_suffix(op, weight)?;
        let (ids_ptr, n, mut shape) = match ids {
            Some(t) => (
                self.ptr(op, "ids", t, DType::I32)?,
                t.len(),
                t.shape().to_vec(),
            ),
            None => (0, w.rows, vec![w.rows]),
        };
        shape.push(w.ne0);
        let out = self.output(op, &shape)?;
        if out.is_empty() {
            return Ok(out);
        }
        let wp = self.weight_ptr(op, weight, resident)?;
        // The ids are on the device: the kernel flags one outside the table
        // in `bad`, and 8 bytes come back to say so. Without ids every row
        // is in range and nothing comes back.
        let bad = match ids {
            Some(_) => Some(self.upload_bytes(op, &[0u8; 8], DType::I32, &[2])?),
            None => None,
        };
        let bad_ptr = match &bad {
            Some(b) => Self::buf_ptr(op, b.buffer())?,
            None => 0,
        };
        let optr = Self::buf_ptr(op, out.buffer())?;
        self.launch(
            op,
            &format!("get_rows_{suffix}"),
            (Self::blocks(n as u64, 1), 1),
            &[
                Arg::Ptr(wp),
                Arg::Ptr(ids_ptr),
                Arg::Ptr(optr),
                Arg::I32(Self::dim(op, "ne0", w.ne0)?),
                Arg::I32(Self::dim(op, "rows", w.rows)?),
                Arg::I64(n as i64),
                Arg::I64(w.row_bytes as i64),
                Arg::Ptr(bad_ptr),
            ],
        )?;
        if bad.is_some() {
            let mut flag = [0u8; 8];
            self.read_bytes(op, bad_ptr, &mut flag)?;
            if flag[..4] != [0; 4] {
                let row = i32::from_le_bytes([flag[4], flag[5], flag[6], flag[7]]);
                return Err(OpError::RowOutOfRange {
                    op,
                    weight: weight.name().to_owned(),
                    row: i64::from(row),
                    rows: w.rows as u64,
                });
            }
        }
        Ok(out)
    }

    /// An element-wise kernel over `x`: `(x, out, n[, extra][, cols])`,
    /// `cols` (the row length, the last dimension) where `rows` says so:
    /// ggml's SiLU takes its vectorised `exp` on each row's whole 8s only.
    fn unary(
        &self,
        op: &'static str,
        kernel: &str,
        x: &DeviceTensor,
        extra: Option<f32>,
        rows: bool,
    ) -> Result<DeviceTensor, OpError> {
        let xp = self.ptr(op, "x", x, DType::F32)?;
        let out = self.output(op, x.shape())?;
        if out.is_empty() {
            return Ok(out);
        }
        let op_ptr = Self::buf_ptr(op, out.buffer())?;
        let n = x.len() as u64;
        let mut args = vec![Arg::Ptr(xp), Arg::Ptr(op_ptr), Arg::I64(n as i64)];
        args.extend(extra.map(Arg::F32));
        if rows {
            let cols = x.shape().last().copied().unwrap_or(1);
            args.push(Arg::I32(Self::dim(op, "cols", cols)?));
        }
        self.launch(op, kernel, (Self::blocks(n, u64::from(THREADS)), 1), &args)?;
        Ok(out)
    }

    fn binary(
        &self,
        op: &'static str,
        kernel: &str,
        a: &DeviceTensor,
        b: &DeviceTensor,
    ) -> Result<DeviceTensor, OpError> {
        let ap = self.ptr(op, "a", a, DType::F32)?;
        let bp = self.ptr(op, "b", b, DType::F32)?;
        check_repeat(op, a, b)?;
        let out = self.output(op, a.shape())?;
        if out.is_empty() {
            return Ok(out);
        }
        let optr = Self::buf_ptr(op, out.buffer())?;
        let n = a.len() as u64;
        self.launch(
            op,
            kernel,
            (Self::blocks(n, u64::from(THREADS)), 1),
            &[
                Arg::Ptr(ap),
                Arg::Ptr(bp),
                Arg::Ptr(optr),
                Arg::I64(n as i64),
                Arg::I64(b.len() as i64),
            ],
        )?;
        Ok(out)
    }
}

impl Ops for CudaOps<'_> {
    fn id(&self) -> OpsId {
        self.id
    }

    fn device_name(&self) -> String {
        self.platform.backend().name()
    }

    fn upload_f32(&self, data: &[f32], shape: &[usize]) -> Result<DeviceTensor, OpError> {
        check_upload("upload", data.len(), shape)?;
        self.upload_bytes("upload", &le_bytes(data), DType::F32, shape)
    }

    fn upload_i32(&self, data: &[i32], shape: &[usize]) -> Result<DeviceTensor, OpError> {
        check_upload("upload", data.len(), shape)?;
        self.upload_bytes("upload", &le_bytes(data), DType::I32, shape)
    }

    fn read_back(&self, t: &DeviceTensor) -> Result<Vec<f32>, OpError> {
        const OP: &str = "read_back";
        let p = self.ptr(OP, "t", t, DType::F32)?;
        let mut bytes = vec![0u8; t.len() * 4];
        self.read_bytes(OP, p, &mut bytes)?;
        Ok(device_ops::f32s_from_le(&bytes))
    }

    fn matmul(
        &self,
        weight: &Weight,
        resident: &Resident<'_>,
        x: &DeviceTensor,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "matmul";
        let w = WeightShape::of(OP, weight, resident)?;
        let shape = matmul_shape(OP, &w, x)?;
        let xp = self.ptr(OP, "x", x, DType::F32)?;
        let suffix = self.weight_suffix(OP, weight)?;
        let out = self.output(OP, &shape)?;
        let n = x.len() / w.ne0.max(1);
        if out.is_empty() || n == 0 {
            return Ok(out);
        }
        let wp = self.weight_ptr(OP, weight, resident)?;
        let ne0 = Self::dim(OP, "ne0", w.ne0)?;
        let rows = Self::dim(OP, "rows", w.rows)?;
        let n32 = Self::dim(OP, "activation rows", n)?;
        let optr = Self::buf_ptr(OP, out.buffer())?;
        // The activations as ggml's CPU multiplies them: int8 codes and
        // their scales (a decode step's one row by a kernel of its own), or
        // rounded floats.
        let (kernel, x_args, blocks) = match int8_suffix(w.ty) {
            Some(s) => {
                let (xq, xd) = self.rounded_int8(OP, &w, x, xp)?;
                let kernel = match n {
                    1 => format!("matvec_i8_{s}"),
                    _ => format!("matmul_i8_{s}"),
                };
                let blocks = self.product_blocks(w.ty, w.rows, w.ne0);
                (kernel, vec![Arg::Ptr(xq), Arg::Ptr(xd)], blocks)
            }
            // Several rows of a float weight that llamafile takes: its
            // tinyBLAS sums, a warp a weight row.
            None if matches!(w.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
                && device_ops::reference::float_products_tiled(n, w.rows, w.ne0) =>
            {
                (
                    format!("matmul_tinyblas_{suffix}"),
                    vec![Arg::Ptr(self.rounded_activations(OP, &w, x, xp)?)],
                    Self::blocks(w.rows as u64, u64::from(THREADS / 32)),
                )
            }
            None => (
                format!("matmul_{suffix}"),
                vec![Arg::Ptr(self.rounded_activations(OP, &w, x, xp)?)],
                self.product_blocks(w.ty, w.rows, w.ne0),
            ),
        };
        let mut args = vec![Arg::Ptr(wp)];
        args.extend(x_args);
        args.extend([
            Arg::Ptr(optr),
            Arg::I32(ne0),
            Arg::I32(rows),
            Arg::I32(n32),
            Arg::I64(w.row_bytes as i64),
        ]);
        self.launch(
            OP,
            &kernel,
            (blocks, n.div_ceil(4).min(65_535) as u32),
            &args,
        )?;
        Ok(out)
    }

    fn matmul_id(
        &self,
        weight: &Weight,
        resident: &Resident<'_>,
        x: &DeviceTensor,
        ids: &DeviceTensor,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "matmul_id";
        let w = WeightShape::of(OP, weight, resident)?;
        let xp = self.ptr(OP, "x", x, DType::F32)?;
        let ip = self.ptr(OP, "ids", ids, DType::I32)?;
        let dims = check_matmul_id(OP, weight, &w, x, ids)?;
        let suffix = self.weight_suffix(OP, weight)?;
        let out = self.output(OP, &[dims.n, dims.k, dims.rows])?;
        let picks = dims.n * dims.k;
        if out.is_empty() || w.ne0 == 0 {
            return Ok(out);
        }
        let wp = self.weight_ptr(OP, weight, resident)?;
        let ne0 = Self::dim(OP, "ne0", w.ne0)?;
        let rows = Self::dim(OP, "rows", dims.rows)?;
        let n_expert = Self::dim(OP, "n_expert", dims.n_expert)?;
        let picks32 = Self::dim(OP, "picks", picks)?;
        let k = Self::dim(OP, "k", dims.k)?;
        let optr = Self::buf_ptr(OP, out.buffer())?;
        let blocks = self.product_blocks(w.ty, dims.rows, w.ne0);
        // int8 codes and their scales: a decode step's picks (one token's:
        // distinct experts, nothing to share) each on its own grid row, at
        // once; several tokens' in groups of 4 sharing an expert's pass. Or
        // rounded floats, in groups of 4.
        let groups4 = picks.div_ceil(4).min(65_535) as u32;
        let (kernel, groups, x_args) = match int8_suffix(w.ty) {
            Some(s) => {
                let (xq, xd) = self.rounded_int8(OP, &w, x, xp)?;
                let (kernel, groups) = match dims.n {
                    1 => (format!("matvec_id_i8_{s}"), picks.min(65_535) as u32),
                    _ => (format!("matmul_id_i8_{s}"), groups4),
                };
                (kernel, groups, vec![Arg::Ptr(xq), Arg::Ptr(xd)])
            }
            None => (
                format!("matmul_id_{suffix}"),
                groups4,
                vec![Arg::Ptr(self.rounded_activations(OP, &w, x, xp)?)],
            ),
        };
        let mut args = vec![Arg::Ptr(wp)];
        args.extend(x_args);
        args.extend([
            Arg::Ptr(ip),
            Arg::Ptr(optr),
            Arg::I32(ne0),
            Arg::I32(rows),
            Arg::I32(n_expert),
            Arg::I32(picks32),
            Arg::I32(k),
            Arg::I32(i32::from(dims.per_pick)),
            Arg::I64(w.row_bytes as i64),
        ]);
        self.launch(OP, &kernel, (blocks, groups), &args)?;
        Ok(out)
    }

    fn get_rows(
        &self,
        weight: &Weight,
        resident: &Resident<'_>,
        ids: &DeviceTensor,
    ) -> Result<DeviceTensor, OpError> {
        self.gather("get_rows", weight, resident, Some(ids))
    }

    fn dequantize(
        &self,
        weight: &Weight,
        resident: &Resident<'_>,
    ) -> Result<DeviceTensor, OpError> {
        self.gather("dequantize", weight, resident, None)
    }

    fn rms_norm(
        &self,
        x: &DeviceTensor,
        eps: f32,
        weight: NormWeight<'_>,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "rms_norm";
        let xp = self.ptr(OP, "x", x, DType::F32)?;
        let (rows, cols) = x.rows_cols(OP)?;
        let (wp, mode, wrows) = match weight {
            NormWeight::None => (0, 0, 1),
            NormWeight::Scale(w) | NormWeight::OnePlus(w) => {
                let p = self.ptr(OP, "weight", w, DType::F32)?;
                let m = check_norm_weight(OP, x, w)?;
                (
                    p,
                    if matches!(weight, NormWeight::Scale(_)) {
                        1
                    } else {
                        2
                    },
                    m,
                )
            }
        };
        let out = self.output(OP, x.shape())?;
        if out.is_empty() {
            return Ok(out);
        }
        let optr = Self::buf_ptr(OP, out.buffer())?;
        self.launch(
            OP,
            "rms_norm_f32",
            (Self::blocks(rows as u64, 1), 1),
            &[
                Arg::Ptr(xp),
                Arg::Ptr(wp),
                Arg::Ptr(optr),
                Arg::I32(Self::dim(OP, "cols", cols)?),
                Arg::I64(rows as i64),
                Arg::F32(eps),
                Arg::I32(mode),
                Arg::I32(Self::dim(OP, "weight rows", wrows)?),
            ],
        )?;
        Ok(out)
    }

    fn rope(
        &self,
        x: &DeviceTensor,
        positions: &DeviceTensor,
        head_dim: usize,
        rope: &Rope,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "rope";
        let xp = self.ptr(OP, "x", x, DType::F32)?;
        let pp = self.ptr(OP, "positions", positions, DType::I32)?;
        check_rope(OP, x, positions, head_dim, rope)?;
        let (rows, cols) = x.rows_cols(OP)?;
        let out = self.output(OP, x.shape())?;
        if out.is_empty() {
            return Ok(out);
        }
        // The positions are on the device and taken as given: a negative
        // one turns backwards here, where the CPU reference refuses it.
        let optr = Self::buf_ptr(OP, out.buffer())?;
        self.launch(
            OP,
            "rope_f32",
            (Self::blocks(x.len() as u64, u64::from(THREADS)), 1),
            &[
                Arg::Ptr(xp),
                Arg::Ptr(pp),
                Arg::Ptr(optr),
                Arg::I64(rows as i64),
                Arg::I32(Self::dim(OP, "cols", cols)?),
                Arg::I32(Self::dim(OP, "head_dim", head_dim)?),
                Arg::I32(Self::dim(OP, "n_rot", rope.n_rot)?),
                Arg::F32(rope.freq_base),
                Arg::I32(i32::from(rope.mode == RopeMode::Neox)),
            ],
        )?;
        Ok(out)
    }

    fn imrope(
        &self,
        x: &DeviceTensor,
        positions: &DeviceTensor,
        head_dim: usize,
        rope: &MultiRope,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "imrope";
        let xp = self.ptr(OP, "x", x, DType::F32)?;
        let pp = self.ptr(OP, "positions", positions, DType::I32)?;
        check_imrope(OP, x, positions, head_dim, rope)?;
        let (rows, cols) = x.rows_cols(OP)?;
        let out = self.output(OP, x.shape())?;
        if out.is_empty() {
            return Ok(out);
        }
        let [s0, s1, s2, s3] = rope.sections;
        self.launch(
            OP,
            "imrope_f32",
            (Self::blocks(x.len() as u64, u64::from(THREADS)), 1),
            &[
                Arg::Ptr(xp),
                Arg::Ptr(pp),
                Arg::Ptr(Self::buf_ptr(OP, out.buffer())?),
                Arg::I64(rows as i64),
                Arg::I32(Self::dim(OP, "cols", cols)?),
                Arg::I32(Self::dim(OP, "head_dim", head_dim)?),
                Arg::I32(Self::dim(OP, "n_rot", rope.n_rot)?),
                Arg::F32(rope.freq_base),
                Arg::I32(Self::dim(OP, "section t", s0)?),
                Arg::I32(Self::dim(OP, "section h", s1)?),
                Arg::I32(Self::dim(OP, "section w", s2)?),
                Arg::I32(Self::dim(OP, "section e", s3)?),
            ],
        )?;
        Ok(out)
    }

    fn softmax(
        &self,
        x: &DeviceTensor,
        scale: f32,
        mask: Option<&DeviceTensor>,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "softmax";
        let xp = self.ptr(OP, "x", x, DType::F32)?;
        let (rows, cols) = x.rows_cols(OP)?;
        let (mp, mrows) = match mask {
            Some(m) => {
                let p = self.ptr(OP, "mask", m, DType::F32)?;
                check_mask(OP, x, m)?;
                (p, m.rows_cols(OP)?.0)
            }
            None => (0, 1),
        };
        let out = self.output(OP, x.shape())?;
        if out.is_empty() {
            return Ok(out);
        }
        let optr = Self::buf_ptr(OP, out.buffer())?;
        self.launch(
            OP,
            "softmax_f32",
            (Self::blocks(rows as u64, 1), 1),
            &[
                Arg::Ptr(xp),
                Arg::Ptr(mp),
                Arg::Ptr(optr),
                Arg::I32(Self::dim(OP, "cols", cols)?),
                Arg::I64(rows as i64),
                Arg::I32(Self::dim(OP, "mask rows", mrows)?),
                Arg::F32(scale),
            ],
        )?;
        Ok(out)
    }

    fn silu(&self, x: &DeviceTensor) -> Result<DeviceTensor, OpError> {
        self.unary("silu", "silu_f32", x, None, true)
    }

    fn silu_scaled(&self, x: &DeviceTensor, s: f32) -> Result<DeviceTensor, OpError> {
        self.unary("silu_scaled", "silu_scaled_f32", x, Some(s), true)
    }

    fn gelu(&self, x: &DeviceTensor) -> Result<DeviceTensor, OpError> {
        self.unary("gelu", "gelu_f32", x, None, false)
    }

    fn swiglu(&self, gate: &DeviceTensor, up: &DeviceTensor) -> Result<DeviceTensor, OpError> {
        const OP: &str = "swiglu";
        let gp = self.ptr(OP, "gate", gate, DType::F32)?;
        let up_ptr = self.ptr(OP, "up", up, DType::F32)?;
        check_same(OP, "up", gate, up)?;
        let out = self.output(OP, gate.shape())?;
        if out.is_empty() {
            return Ok(out);
        }
        let optr = Self::buf_ptr(OP, out.buffer())?;
        let n = gate.len() as u64;
        self.launch(
            OP,
            "swiglu_f32",
            (Self::blocks(n, u64::from(THREADS)), 1),
            &[
                Arg::Ptr(gp),
                Arg::Ptr(up_ptr),
                Arg::Ptr(optr),
                Arg::I64(n as i64),
                Arg::I32(Self::dim(
                    OP,
                    "cols",
                    gate.shape().last().copied().unwrap_or(1),
                )?),
            ],
        )?;
        Ok(out)
    }

    fn add(&self, a: &DeviceTensor, b: &DeviceTensor) -> Result<DeviceTensor, OpError> {
        self.binary("add", "add_f32", a, b)
    }

    fn mul(&self, a: &DeviceTensor, b: &DeviceTensor) -> Result<DeviceTensor, OpError> {
        self.binary("mul", "mul_f32", a, b)
    }

    fn mul_sigmoid(&self, a: &DeviceTensor, b: &DeviceTensor) -> Result<DeviceTensor, OpError> {
        self.binary("mul_sigmoid", "mul_sigmoid_f32", a, b)
    }

    fn scale(&self, a: &DeviceTensor, s: f32) -> Result<DeviceTensor, OpError> {
        self.unary("scale", "scale_f32", a, Some(s), false)
    }

    fn sigmoid(&self, x: &DeviceTensor) -> Result<DeviceTensor, OpError> {
        self.unary("sigmoid", "sigmoid_f32", x, None, false)
    }

    fn softplus(&self, x: &DeviceTensor) -> Result<DeviceTensor, OpError> {
        self.unary("softplus", "softplus_f32", x, None, false)
    }

    fn delta_gates(
        &self,
        alpha: &DeviceTensor,
        beta: &DeviceTensor,
        dt_bias: &DeviceTensor,
        a: &DeviceTensor,
    ) -> Result<(DeviceTensor, DeviceTensor), OpError> {
        const OP: &str = "delta_gates";
        let ap = self.ptr(OP, "alpha", alpha, DType::F32)?;
        let bp = self.ptr(OP, "beta", beta, DType::F32)?;
        let dp = self.ptr(OP, "dt_bias", dt_bias, DType::F32)?;
        let sp = self.ptr(OP, "a", a, DType::F32)?;
        let (_, hv) = check_delta_gates(OP, alpha, beta, dt_bias, a)?;
        let g = self.output(OP, alpha.shape())?;
        let b = self.output(OP, beta.shape())?;
        if g.is_empty() {
            return Ok((g, b));
        }
        let total = g.len() as u64;
        self.launch(
            OP,
            "delta_gates_f32",
            (Self::blocks(total, u64::from(THREADS)), 1),
            &[
                Arg::Ptr(ap),
                Arg::Ptr(bp),
                Arg::Ptr(dp),
                Arg::Ptr(sp),
                Arg::Ptr(Self::buf_ptr(OP, g.buffer())?),
                Arg::Ptr(Self::buf_ptr(OP, b.buffer())?),
                Arg::I32(Self::dim(OP, "n_v_heads", hv)?),
                Arg::I64(total as i64),
            ],
        )?;
        Ok((g, b))
    }

    fn l2_norm(&self, x: &DeviceTensor, eps: f32) -> Result<DeviceTensor, OpError> {
        const OP: &str = "l2_norm";
        let xp = self.ptr(OP, "x", x, DType::F32)?;
        let (rows, cols) = x.rows_cols(OP)?;
        let out = self.output(OP, x.shape())?;
        if out.is_empty() {
            return Ok(out);
        }
        self.launch(
            OP,
            "l2_norm_f32",
            (Self::blocks(rows as u64, 1), 1),
            &[
                Arg::Ptr(xp),
                Arg::Ptr(Self::buf_ptr(OP, out.buffer())?),
                Arg::I32(Self::dim(OP, "cols", cols)?),
                Arg::I64(rows as i64),
                Arg::F32(eps),
            ],
        )?;
        Ok(out)
    }

    fn slice_cols(
        &self,
        x: &DeviceTensor,
        start: usize,
        len: usize,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "slice_cols";
        let xp = self.ptr(OP, "x", x, DType::F32)?;
        let shape = check_slice_cols(OP, x, start, len)?;
        let (_, cols) = x.rows_cols(OP)?;
        let out = self.output(OP, &shape)?;
        if out.is_empty() {
            return Ok(out);
        }
        let n = out.len() as u64;
        self.launch(
            OP,
            "slice_cols_f32",
            (Self::blocks(n, u64::from(THREADS)), 1),
            &[
                Arg::Ptr(xp),
                Arg::Ptr(Self::buf_ptr(OP, out.buffer())?),
                Arg::I32(Self::dim(OP, "cols", cols)?),
                Arg::I32(Self::dim(OP, "start", start)?),
                Arg::I32(Self::dim(OP, "len", len)?),
                Arg::I64(n as i64),
            ],
        )?;
        Ok(out)
    }

    fn zeros(&self, dtype: DType, shape: &[usize]) -> Result<DeviceTensor, OpError> {
        const OP: &str = "zeros";
        let t = self.output_of(OP, dtype, shape)?;
        let bytes = t.len() * dtype.size();
        if bytes > 0 {
            let ptr = Self::buf_ptr(OP, t.buffer())?;
            self.platform
                .backend
                .ctx
                .bind()
                .map_err(OpError::device(OP))?;
            // SAFETY: `ptr` holds `bytes` bytes (just allocated for the
            // shape); the memset is ordered on the session's stream.
            unsafe { result::memset_d8_async(ptr, 0, bytes, self.stream) }
                .map_err(|e| driver_error("cuMemsetD8Async", e))
                .map_err(OpError::device(OP))?;
            self.counters.launch();
        }
        Ok(t)
    }

    fn read_back_i32(&self, t: &DeviceTensor) -> Result<Vec<i32>, OpError> {
        const OP: &str = "read_back";
        let p = self.ptr(OP, "t", t, DType::I32)?;
        let mut bytes = vec![0u8; t.len() * 4];
        self.read_bytes(OP, p, &mut bytes)?;
        Ok(device_ops::i32s_from_le(&bytes))
    }

    fn write_rows(
        &self,
        dst: &mut DeviceTensor,
        row0: usize,
        src: &DeviceTensor,
    ) -> Result<(), OpError> {
        const OP: &str = "write_rows";
        self.forget_rounded();
        // F32 rows, or F16 (an F16 KV cache: rounded as they are copied,
        // or copied as they are from F16 rows when the cache grows).
        let (kernel, dtype, src_dtype) = match (dst.dtype(), src.dtype()) {
            (DType::F16, DType::F16) => ("copy_f16", DType::F16, DType::F16),
            (DType::F16, _) => ("copy_f32_f16", DType::F16, DType::F32),
            _ => ("copy_f32", DType::F32, DType::F32),
        };
        let dp = self.ptr(OP, "dst", dst, dtype)?;
        let sp = self.ptr(OP, "src", src, src_dtype)?;
        check_write_rows(OP, dst, row0, src)?;
        let (_, cols) = dst.rows_cols(OP)?;
        let n = src.len() as u64;
        if n == 0 {
            return Ok(());
        }
        // In bounds: row0 + rows <= dst's rows (checked).
        let at = dp + (row0 * cols * dtype.size()) as u64;
        self.launch(
            OP,
            kernel,
            (Self::blocks(n, u64::from(THREADS)), 1),
            &[Arg::Ptr(sp), Arg::Ptr(at), Arg::I64(n as i64)],
        )
    }

    fn attention(
        &self,
        q: &DeviceTensor,
        cache: &KvCache,
        attn: &Attention<'_>,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "attention";
        let qp = self.ptr(OP, "q", q, DType::F32)?;
        // The cache's element type: F32, or F16 (attention_f16 widens the
        // halves as it reads them).
        let (kernel, kv_type) = match cache.spec().dtype {
            DType::F16 => ("attention_f16", DType::F16),
            _ => ("attention_f32", DType::F32),
        };
        let kp = self.ptr(OP, "k cache", cache.k(), kv_type)?;
        let vp = self.ptr(OP, "v cache", cache.v(), kv_type)?;
        let dims = check_attention(OP, q, cache, attn)?;
        let (mp, mode, pos0, window) = match attn.mask {
            AttnMask::All => (0, 0, 0, 0),
            AttnMask::Causal { pos0 } => (0, 1, pos0, 0),
            AttnMask::SlidingWindow { pos0, window } => (0, 2, pos0, window),
            AttnMask::Additive(m) => (self.ptr(OP, "mask", m, DType::F32)?, 3, 0, 0),
        };
        let sh = dims.shape;
        let mut shape = q.shape().to_vec();
        if let Some(last) = shape.last_mut() {
            *last = sh.n_head * sh.head_dim_v;
        }
        let out = self.output(OP, &shape)?;
        let pairs = (dims.n_q as u64) * (sh.n_head as u64);
        if out.is_empty() || pairs == 0 {
            return Ok(out);
        }
        let blocks = Self::blocks(pairs, 1);
        // `span` doubles a block: the slots padded to whole 32s (ops.cu's
        // `attention`).
        let scratch_bytes = dims
            .n_kv
            .checked_next_multiple_of(32)
            .and_then(|span| span.max(32).checked_mul(blocks as usize))
            .and_then(|v| v.checked_mul(8))
            .ok_or_else(|| OpError::Invalid {
                op: OP,
                why: format!("{} slots overflow the scratch", dims.n_kv),
            })?;
        let scratch = self.scratch(OP, scratch_bytes)?;
        let optr = Self::buf_ptr(OP, out.buffer())?;
        let i64_of = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
        // A ubatch's queries take tinyBLAS's sums where ggml's do.
        let (kq_tiled, kqv_tiled) =
            device_ops::reference::attention_tiled(dims.n_q, dims.n_kv, &sh, kv_type);
        self.launch(
            OP,
            kernel,
            (blocks, 1),
            &[
                Arg::Ptr(qp),
                Arg::Ptr(kp),
                Arg::Ptr(vp),
                Arg::Ptr(mp),
                Arg::Ptr(optr),
                Arg::Ptr(Self::buf_ptr(OP, &*scratch)?),
                Arg::I32(Self::dim(OP, "n_head", sh.n_head)?),
                Arg::I32(Self::dim(OP, "n_head_kv", sh.n_head_kv)?),
                Arg::I32(Self::dim(OP, "head_dim_k", sh.head_dim_k)?),
                Arg::I32(Self::dim(OP, "head_dim_v", sh.head_dim_v)?),
                Arg::I32(Self::dim(OP, "cache slots", dims.n_kv)?),
                Arg::I64(i64_of(dims.n_q)),
                Arg::I32(Self::dim(OP, "mask rows", dims.mask_rows)?),
                Arg::I32(mode),
                Arg::I64(i64_of(pos0)),
                Arg::I64(i64_of(window)),
                Arg::F32(attn.scores.scale),
                Arg::F32(attn.scores.softcap.unwrap_or(0.0)),
                Arg::I32(i32::from(kq_tiled)),
                Arg::I32(i32::from(kqv_tiled)),
            ],
        )?;
        drop(scratch);
        Ok(out)
    }

    fn route(
        &self,
        logits: &DeviceTensor,
        routing: &DeviceRouting<'_>,
    ) -> Result<(DeviceTensor, DeviceTensor), OpError> {
        const OP: &str = "route";
        let lp = self.ptr(OP, "logits", logits, DType::F32)?;
        let bp = match routing.bias {
            Some(b) => self.ptr(OP, "bias", b, DType::F32)?,
            None => 0,
        };
        let (rows, n_expert) = check_route(OP, logits, routing)?;
        let mut shape = logits.shape().to_vec();
        if let Some(last) = shape.last_mut() {
            *last = routing.k;
        }
        let ids = self.output_of(OP, DType::I32, &shape)?;
        let weights = self.output(OP, &shape)?;
        if ids.is_empty() {
            return Ok((ids, weights));
        }
        let scratch_bytes = byte_len(OP, DType::F32, &[2, rows, n_expert])?;
        let scratch = self.scratch(OP, scratch_bytes)?;
        let sp = Self::buf_ptr(OP, &*scratch)?;
        self.launch(
            OP,
            "route_f32",
            (Self::blocks(rows as u64, 1), 1),
            &[
                Arg::Ptr(lp),
                Arg::Ptr(bp),
                Arg::Ptr(Self::buf_ptr(OP, ids.buffer())?),
                Arg::Ptr(Self::buf_ptr(OP, weights.buffer())?),
                Arg::Ptr(sp),
                Arg::Ptr(sp + (scratch_bytes / 2) as u64),
                Arg::I32(Self::dim(OP, "n_expert", n_expert)?),
                Arg::I64(rows as i64),
                Arg::I32(Self::dim(OP, "k", routing.k)?),
                Arg::I32(i32::from(routing.gating == Gating::Sigmoid)),
                Arg::I32(i32::from(routing.normalize)),
                Arg::F32(routing.scale),
            ],
        )?;
        drop(scratch);
        Ok((ids, weights))
    }

    fn mix_experts(&self, y: &DeviceTensor, w: &DeviceTensor) -> Result<DeviceTensor, OpError> {
        const OP: &str = "mix_experts";
        let yp = self.ptr(OP, "y", y, DType::F32)?;
        let wp = self.ptr(OP, "w", w, DType::F32)?;
        let (n, k, cols) = check_mix_experts(OP, y, w)?;
        let out = self.output(OP, &[n, cols])?;
        if out.is_empty() {
            return Ok(out);
        }
        self.launch(
            OP,
            "mix_experts_f32",
            (Self::blocks(out.len() as u64, u64::from(THREADS)), 1),
            &[
                Arg::Ptr(yp),
                Arg::Ptr(wp),
                Arg::Ptr(Self::buf_ptr(OP, out.buffer())?),
                Arg::I32(Self::dim(OP, "k", k)?),
                Arg::I32(Self::dim(OP, "cols", cols)?),
                Arg::I64(n as i64),
            ],
        )?;
        Ok(out)
    }

    fn add_outer(
        &self,
        r: &DeviceTensor,
        s: &DeviceTensor,
        y: &DeviceTensor,
        factor: OuterFactor,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "add_outer";
        let rp = self.ptr(OP, "r", r, DType::F32)?;
        let sp = self.ptr(OP, "s", s, DType::F32)?;
        let yp = self.ptr(OP, "y", y, DType::F32)?;
        let (_, n) = check_add_outer(OP, r, s, y)?;
        let out = self.output(OP, r.shape())?;
        if out.is_empty() {
            return Ok(out);
        }
        let total = out.len() as u64;
        let (gated, pre, post) = match factor {
            OuterFactor::Plain => (0, 1.0, 1.0),
            OuterFactor::Sigmoid { pre, post } => (1, pre, post),
        };
        self.launch(
            OP,
            "add_outer_f32",
            (Self::blocks(total, u64::from(THREADS)), 1),
            &[
                Arg::Ptr(rp),
                Arg::Ptr(sp),
                Arg::Ptr(yp),
                Arg::Ptr(Self::buf_ptr(OP, out.buffer())?),
                Arg::I32(Self::dim(OP, "n", n)?),
                Arg::I64(total as i64),
                Arg::I32(gated),
                Arg::F32(pre),
                Arg::F32(post),
            ],
        )?;
        Ok(out)
    }

    fn gated_mean_rows(&self, x: &DeviceTensor, g: &DeviceTensor) -> Result<DeviceTensor, OpError> {
        const OP: &str = "gated_mean_rows";
        let xp = self.ptr(OP, "x", x, DType::F32)?;
        let gp = self.ptr(OP, "g", g, DType::F32)?;
        let (m, n) = check_gated_mean_rows(OP, x, g)?;
        let out = self.output(OP, &[1, n])?;
        if out.is_empty() {
            return Ok(out);
        }
        self.launch(
            OP,
            "gated_mean_rows_f32",
            (Self::blocks(n as u64, u64::from(THREADS)), 1),
            &[
                Arg::Ptr(xp),
                Arg::Ptr(gp),
                Arg::Ptr(Self::buf_ptr(OP, out.buffer())?),
                Arg::I32(Self::dim(OP, "rows", m)?),
                Arg::I64(n as i64),
                Arg::F32(1.0 / m as f32),
            ],
        )?;
        Ok(out)
    }

    fn gather_rows(
        &self,
        table: &DeviceTensor,
        ids: &DeviceTensor,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "gather_rows";
        let tp = self.ptr(OP, "table", table, DType::F32)?;
        let ip = self.ptr(OP, "ids", ids, DType::I32)?;
        let (rows, cols, shape) = check_gather_rows(OP, table, ids)?;
        let out = self.output(OP, &shape)?;
        if out.is_empty() {
            return Ok(out);
        }
        let n = out.len() as u64;
        self.launch(
            OP,
            "gather_rows_f32",
            (Self::blocks(n, u64::from(THREADS)), 1),
            &[
                Arg::Ptr(tp),
                Arg::Ptr(ip),
                Arg::Ptr(Self::buf_ptr(OP, out.buffer())?),
                Arg::I32(Self::dim(OP, "cols", cols)?),
                Arg::I32(Self::dim(OP, "rows", rows)?),
                Arg::I64(ids.len() as i64),
            ],
        )?;
        Ok(out)
    }

    fn argmax(&self, x: &DeviceTensor) -> Result<DeviceTensor, OpError> {
        const OP: &str = "argmax";
        let xp = self.ptr(OP, "x", x, DType::F32)?;
        let (rows, cols) = x.rows_cols(OP)?;
        let shape = match &x.shape()[..x.shape().len() - 1] {
            [] => vec![1],
            lead => lead.to_vec(),
        };
        let out = self.output_of(OP, DType::I32, &shape)?;
        if out.is_empty() {
            return Ok(out);
        }
        self.launch(
            OP,
            "argmax_f32",
            (Self::blocks(rows as u64, 1), 1),
            &[
                Arg::Ptr(xp),
                Arg::Ptr(Self::buf_ptr(OP, out.buffer())?),
                Arg::I32(Self::dim(OP, "cols", cols)?),
                Arg::I64(rows as i64),
            ],
        )?;
        Ok(out)
    }

    fn ssm_conv(
        &self,
        state: &mut DeviceTensor,
        x: &DeviceTensor,
        w: &DeviceTensor,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "ssm_conv";
        self.forget_rounded();
        let sp = self.ptr(OP, "state", state, DType::F32)?;
        let xp = self.ptr(OP, "x", x, DType::F32)?;
        let wp = self.ptr(OP, "w", w, DType::F32)?;
        let (n, channels, d_conv) = check_ssm_conv(OP, state, x, w)?;
        let out = self.output(OP, x.shape())?;
        if n == 0 {
            return Ok(out);
        }
        self.launch(
            OP,
            "ssm_conv_f32",
            (Self::blocks(channels as u64, u64::from(THREADS)), 1),
            &[
                Arg::Ptr(sp),
                Arg::Ptr(xp),
                Arg::Ptr(wp),
                Arg::Ptr(Self::buf_ptr(OP, out.buffer())?),
                Arg::I32(Self::dim(OP, "channels", channels)?),
                Arg::I32(Self::dim(OP, "d_conv", d_conv)?),
                Arg::I64(n as i64),
            ],
        )?;
        Ok(out)
    }

    fn delta_net(
        &self,
        state: &mut DeviceTensor,
        qkv: [&DeviceTensor; 3],
        g: &DeviceTensor,
        beta: &DeviceTensor,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "delta_net";
        self.forget_rounded();
        let sp = self.ptr(OP, "state", state, DType::F32)?;
        let qp = self.ptr(OP, "q", qkv[0], DType::F32)?;
        let kp = self.ptr(OP, "k", qkv[1], DType::F32)?;
        let vp = self.ptr(OP, "v", qkv[2], DType::F32)?;
        let gp = self.ptr(OP, "g", g, DType::F32)?;
        let bp = self.ptr(OP, "beta", beta, DType::F32)?;
        let dims = check_delta_net(OP, state, qkv, g, beta)?;
        let out = self.output(OP, qkv[2].shape())?;
        if dims.n == 0 {
            return Ok(out);
        }
        let items = (dims.n_v_heads as u64) * (dims.s as u64);
        self.launch(
            OP,
            "delta_net_f32",
            (Self::blocks(items, u64::from(THREADS)), 1),
            &[
                Arg::Ptr(sp),
                Arg::Ptr(qp),
                Arg::Ptr(kp),
                Arg::Ptr(vp),
                Arg::Ptr(gp),
                Arg::Ptr(bp),
                Arg::Ptr(Self::buf_ptr(OP, out.buffer())?),
                Arg::I32(Self::dim(OP, "S", dims.s)?),
                Arg::I32(Self::dim(OP, "n_k_heads", dims.n_k_heads)?),
                Arg::I32(Self::dim(OP, "n_v_heads", dims.n_v_heads)?),
                Arg::I64(dims.n as i64),
                Arg::I32(i32::from(dims.gate == device_ops::DeltaGate::PerKey)),
            ],
        )?;
        Ok(out)
    }

    fn counters(&self) -> OpCounters {
        self.counters.snapshot()
    }

    // glm_moe_dsa's ops

    fn rope_ggml(
        &self,
        x: &DeviceTensor,
        positions: &DeviceTensor,
        head_dim: usize,
        rope: &device_ops::GgmlRope,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "rope_ggml";
        let xp = self.ptr(OP, "x", x, DType::F32)?;
        let pp = self.ptr(OP, "positions", positions, DType::I32)?;
        device_ops::check_rope_ggml(OP, x, positions, head_dim, rope)?;
        let (rows, cols) = x.rows_cols(OP)?;
        let out = self.output(OP, x.shape())?;
        if out.is_empty() {
            return Ok(out);
        }
        // A negative position turns backwards, here as in the reference.
        let [corr0, corr1] = rope.corr_dims();
        self.launch(
            OP,
            "rope_ggml_f32",
            (Self::blocks(x.len() as u64, u64::from(THREADS)), 1),
            &[
                Arg::Ptr(xp),
                Arg::Ptr(pp),
                Arg::Ptr(Self::buf_ptr(OP, out.buffer())?),
                Arg::I64(rows as i64),
                Arg::I32(Self::dim(OP, "cols", cols)?),
                Arg::I32(Self::dim(OP, "head_dim", head_dim)?),
                Arg::I32(Self::dim(OP, "n_rot", rope.n_rot)?),
                Arg::F32(rope.theta_scale()),
                Arg::F32(rope.freq_scale),
                Arg::F32(rope.ext_factor),
                Arg::F32(rope.mscale()),
                Arg::F32(corr0),
                Arg::F32(corr1),
                Arg::I32(i32::from(rope.mode == RopeMode::Neox)),
            ],
        )?;
        Ok(out)
    }

    fn concat_cols(&self, a: &DeviceTensor, b: &DeviceTensor) -> Result<DeviceTensor, OpError> {
        const OP: &str = "concat_cols";
        let ap = self.ptr(OP, "a", a, DType::F32)?;
        let bp = self.ptr(OP, "b", b, DType::F32)?;
        let shape = device_ops::check_concat_cols(OP, a, b)?;
        let (_, ca) = a.rows_cols(OP)?;
        let (_, cb) = b.rows_cols(OP)?;
        let out = self.output(OP, &shape)?;
        if out.is_empty() {
            return Ok(out);
        }
        let n = out.len() as u64;
        self.launch(
            OP,
            "concat_cols_f32",
            (Self::blocks(n, u64::from(THREADS)), 1),
            &[
                Arg::Ptr(ap),
                Arg::Ptr(bp),
                Arg::Ptr(Self::buf_ptr(OP, out.buffer())?),
                Arg::I32(Self::dim(OP, "cols of a", ca)?),
                Arg::I32(Self::dim(OP, "cols of b", cb)?),
                Arg::I64(n as i64),
            ],
        )?;
        Ok(out)
    }

    fn layer_norm(&self, x: &DeviceTensor, eps: f32) -> Result<DeviceTensor, OpError> {
        const OP: &str = "layer_norm";
        let xp = self.ptr(OP, "x", x, DType::F32)?;
        let (rows, cols) = x.rows_cols(OP)?;
        let out = self.output(OP, x.shape())?;
        if out.is_empty() {
            return Ok(out);
        }
        self.launch(
            OP,
            "layer_norm_f32",
            (Self::blocks(rows as u64, 1), 1),
            &[
                Arg::Ptr(xp),
                Arg::Ptr(Self::buf_ptr(OP, out.buffer())?),
                Arg::I32(Self::dim(OP, "cols", cols)?),
                Arg::I64(rows as i64),
                Arg::F32(eps),
            ],
        )?;
        Ok(out)
    }

    fn hadamard(&self, x: &DeviceTensor, n: usize) -> Result<DeviceTensor, OpError> {
        const OP: &str = "hadamard";
        let xp = self.ptr(OP, "x", x, DType::F32)?;
        device_ops::check_hadamard(OP, x, n)?;
        let out = self.output(OP, x.shape())?;
        if out.is_empty() {
            return Ok(out);
        }
        let runs = (x.len() / n) as u64;
        self.launch(
            OP,
            "hadamard_f32",
            (Self::blocks(runs, u64::from(THREADS)), 1),
            &[
                Arg::Ptr(xp),
                Arg::Ptr(Self::buf_ptr(OP, out.buffer())?),
                Arg::I32(Self::dim(OP, "n", n)?),
                Arg::F32(1.0 / (n as f32).sqrt()),
                Arg::I64(runs as i64),
            ],
        )?;
        Ok(out)
    }

    fn lightning_scores(
        &self,
        q: &DeviceTensor,
        keys: &DeviceTensor,
        n_keys: usize,
        w: &DeviceTensor,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "lightning_scores";
        let qp = self.ptr(OP, "q", q, DType::F32)?;
        let wp = self.ptr(OP, "w", w, DType::F32)?;
        let kp = self.ptr(OP, "keys", keys, keys.dtype())?;
        let (n_head, d) = device_ops::check_lightning_scores(OP, q, keys, n_keys, w)?;
        let out = self.output(OP, &[1, n_keys])?;
        if out.is_empty() {
            return Ok(out);
        }
        self.launch(
            OP,
            "lightning_scores_f32",
            (Self::blocks(n_keys as u64, u64::from(THREADS)), 1),
            &[
                Arg::Ptr(qp),
                Arg::Ptr(kp),
                Arg::Ptr(wp),
                Arg::Ptr(Self::buf_ptr(OP, out.buffer())?),
                Arg::I32(Self::dim(OP, "d", d)?),
                Arg::I32(Self::dim(OP, "heads", n_head)?),
                Arg::I32(i32::from(keys.dtype() == DType::F16)),
                Arg::I64(n_keys as i64),
            ],
        )?;
        Ok(out)
    }

    // muse_glimmer's ops

    fn softcap(&self, x: &DeviceTensor, c: f32) -> Result<DeviceTensor, OpError> {
        device_ops::check_softcap("softcap", c)?;
        self.unary("softcap", "softcap_f32", x, Some(c), false)
    }

    /// The products of [`Ops::matmul`]'s kernels: the same rounded
    /// activations, each dot summed in the kernel's order in `f32` (within
    /// `Tolerance::MATMUL` of the reference's `f64` sums).
    fn matmul_f64(
        &self,
        weight: &Weight,
        resident: &Resident<'_>,
        x: &DeviceTensor,
    ) -> Result<DeviceTensor, OpError> {
        self.matmul(weight, resident, x)
    }

    fn dot_rows_f64(&self, a: &DeviceTensor, b: &DeviceTensor) -> Result<DeviceTensor, OpError> {
        const OP: &str = "dot_rows_f64";
        let ap = self.ptr(OP, "a", a, DType::F32)?;
        let bp = self.ptr(OP, "b", b, DType::F32)?;
        let (n, m, k) = device_ops::check_dot_rows(OP, a, b)?;
        let out = self.output(OP, &[n, m])?;
        if out.is_empty() {
            return Ok(out);
        }
        let total = (n as u64) * (m as u64);
        self.launch(
            OP,
            "dot_rows_f64_f32",
            (Self::blocks(total, u64::from(THREADS)), 1),
            &[
                Arg::Ptr(ap),
                Arg::Ptr(bp),
                Arg::Ptr(Self::buf_ptr(OP, out.buffer())?),
                Arg::I32(Self::dim(OP, "m", m)?),
                Arg::I32(Self::dim(OP, "k", k)?),
                Arg::I64(total as i64),
            ],
        )?;
        Ok(out)
    }

    fn transpose(&self, x: &DeviceTensor) -> Result<DeviceTensor, OpError> {
        const OP: &str = "transpose";
        let xp = self.ptr(OP, "x", x, DType::F32)?;
        let (shape, r, c) = device_ops::transposed_shape(OP, x)?;
        let out = self.output(OP, &shape)?;
        if out.is_empty() {
            return Ok(out);
        }
        let n = x.len() as u64;
        self.launch(
            OP,
            "transpose_f32",
            (Self::blocks(n, u64::from(THREADS)), 1),
            &[
                Arg::Ptr(xp),
                Arg::Ptr(Self::buf_ptr(OP, out.buffer())?),
                Arg::I32(Self::dim(OP, "rows", r)?),
                Arg::I32(Self::dim(OP, "cols", c)?),
                Arg::I64(n as i64),
            ],
        )?;
        Ok(out)
    }

    fn layer_norm_f64(
        &self,
        x: &DeviceTensor,
        eps: f32,
        w: Option<&DeviceTensor>,
        b: Option<&DeviceTensor>,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "layer_norm_f64";
        let xp = self.ptr(OP, "x", x, DType::F32)?;
        let (rows, cols) = x.rows_cols(OP)?;
        let wp = w.map(|w| self.ptr(OP, "w", w, DType::F32)).transpose()?;
        let bp = b.map(|b| self.ptr(OP, "b", b, DType::F32)).transpose()?;
        if let Some(w) = w {
            device_ops::check_row_vector(OP, "w", w, cols)?;
        }
        if let Some(b) = b {
            device_ops::check_row_vector(OP, "b", b, cols)?;
        }
        let out = self.output(OP, x.shape())?;
        if out.is_empty() {
            return Ok(out);
        }
        self.launch(
            OP,
            "layer_norm_f64_f32",
            (Self::blocks(rows as u64, u64::from(THREADS)), 1),
            &[
                Arg::Ptr(xp),
                Arg::Ptr(wp.unwrap_or(xp)),
                Arg::Ptr(bp.unwrap_or(xp)),
                Arg::Ptr(Self::buf_ptr(OP, out.buffer())?),
                Arg::I32(Self::dim(OP, "cols", cols)?),
                Arg::I64(rows as i64),
                Arg::F32(eps),
                Arg::I32(i32::from(w.is_some())),
                Arg::I32(i32::from(b.is_some())),
            ],
        )?;
        Ok(out)
    }

    fn gelu_erf(&self, x: &DeviceTensor) -> Result<DeviceTensor, OpError> {
        self.unary("gelu_erf", "gelu_erf_f32", x, None, false)
    }

    /// ggml's F16 activation rounding (`act_f16`), as the products round
    /// an F16 weight's activations.
    fn round_f16(&self, x: &DeviceTensor) -> Result<DeviceTensor, OpError> {
        self.unary("round_f16", "act_f16", x, None, false)
    }

    // glm5_next's ops

    fn kda_gate(
        &self,
        alpha: &DeviceTensor,
        dt_bias: &DeviceTensor,
        a: &DeviceTensor,
        lower_bound: Option<f32>,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "kda_gate";
        let ap = self.ptr(OP, "alpha", alpha, DType::F32)?;
        let dp = self.ptr(OP, "dt_bias", dt_bias, DType::F32)?;
        let sp = self.ptr(OP, "a", a, DType::F32)?;
        let (_, c, per_head) = device_ops::check_kda_gate(OP, alpha, dt_bias, a)?;
        let out = self.output(OP, alpha.shape())?;
        if out.is_empty() {
            return Ok(out);
        }
        let total = out.len() as u64;
        self.launch(
            OP,
            "kda_gate_f32",
            (Self::blocks(total, u64::from(THREADS)), 1),
            &[
                Arg::Ptr(ap),
                Arg::Ptr(dp),
                Arg::Ptr(sp),
                Arg::Ptr(Self::buf_ptr(OP, out.buffer())?),
                Arg::I32(Self::dim(OP, "channels", c)?),
                Arg::I32(Self::dim(OP, "channels a head", per_head)?),
                Arg::I32(i32::from(lower_bound.is_some())),
                Arg::F32(lower_bound.unwrap_or(0.0)),
                Arg::I64(total as i64),
            ],
        )?;
        Ok(out)
    }

    fn hc_weights(
        &self,
        mix: &DeviceTensor,
        scale: &DeviceTensor,
        base: &DeviceTensor,
        sinkhorn: &device_ops::HcSinkhorn,
    ) -> Result<(DeviceTensor, DeviceTensor, DeviceTensor), OpError> {
        const OP: &str = "hc_weights";
        let mp = self.ptr(OP, "mix", mix, DType::F32)?;
        let sp = self.ptr(OP, "scale", scale, DType::F32)?;
        let bp = self.ptr(OP, "base", base, DType::F32)?;
        device_ops::check_hc_weights(OP, mix, scale, base, sinkhorn)?;
        let hc = sinkhorn.hc;
        let pre = self.output(OP, &[1, hc])?;
        let post = self.output(OP, &[1, hc])?;
        let comb = self.output(OP, &[1, hc * hc])?;
        self.launch(
            OP,
            "hc_weights_f32",
            (1, 1),
            &[
                Arg::Ptr(mp),
                Arg::Ptr(sp),
                Arg::Ptr(bp),
                Arg::Ptr(Self::buf_ptr(OP, pre.buffer())?),
                Arg::Ptr(Self::buf_ptr(OP, post.buffer())?),
                Arg::Ptr(Self::buf_ptr(OP, comb.buffer())?),
                Arg::I32(Self::dim(OP, "streams", hc)?),
                Arg::F32(sinkhorn.eps),
                Arg::I32(Self::dim(OP, "iterations", sinkhorn.iters)?),
            ],
        )?;
        Ok((pre, post, comb))
    }

    fn hc_pre_weighted(
        &self,
        x: &DeviceTensor,
        w: &DeviceTensor,
        scale: f32,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "hc_pre_weighted";
        let xp = self.ptr(OP, "x", x, DType::F32)?;
        let wp = self.ptr(OP, "w", w, DType::F32)?;
        let (hc, n) = device_ops::check_hc_pre_weighted(OP, x, w)?;
        let out = self.output(OP, &[1, n])?;
        if n == 0 {
            return Ok(out);
        }
        self.launch(
            OP,
            "hc_pre_weighted_f32",
            (Self::blocks(n as u64, u64::from(THREADS)), 1),
            &[
                Arg::Ptr(xp),
                Arg::Ptr(wp),
                Arg::Ptr(Self::buf_ptr(OP, out.buffer())?),
                Arg::I32(Self::dim(OP, "streams", hc)?),
                Arg::F32(scale),
                Arg::I64(n as i64),
            ],
        )?;
        Ok(out)
    }

    fn hc_post_mixed(
        &self,
        y: &DeviceTensor,
        residual: &DeviceTensor,
        post: &DeviceTensor,
        comb: &DeviceTensor,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "hc_post_mixed";
        let yp = self.ptr(OP, "y", y, DType::F32)?;
        let rp = self.ptr(OP, "residual", residual, DType::F32)?;
        let pp = self.ptr(OP, "post", post, DType::F32)?;
        let cp = self.ptr(OP, "comb", comb, DType::F32)?;
        let (hc, n) = device_ops::check_hc_post_mixed(OP, y, residual, post, comb)?;
        let out = self.output(OP, &[hc, n])?;
        if out.is_empty() {
            return Ok(out);
        }
        self.launch(
            OP,
            "hc_post_mixed_f32",
            (Self::blocks(out.len() as u64, u64::from(THREADS)), 1),
            &[
                Arg::Ptr(yp),
                Arg::Ptr(rp),
                Arg::Ptr(pp),
                Arg::Ptr(cp),
                Arg::Ptr(Self::buf_ptr(OP, out.buffer())?),
                Arg::I32(Self::dim(OP, "streams", hc)?),
                Arg::I64(n as i64),
            ],
        )?;
        Ok(out)
    }

    fn pool_keys(
        &self,
        keys: &DeviceTensor,
        gates: &DeviceTensor,
        first: usize,
        ape: &DeviceTensor,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "pool_keys";
        let kp_ = self.ptr(OP, "keys", keys, keys.dtype())?;
        let gp = self.ptr(OP, "gates", gates, gates.dtype())?;
        let ap = self.ptr(OP, "ape", ape, DType::F32)?;
        let (kp, d) = device_ops::check_pool_keys(OP, keys, gates, first, ape)?;
        let out = self.output(OP, &[1, d])?;
        self.launch(
            OP,
            "pool_keys_f32",
            (Self::blocks(d as u64, u64::from(THREADS)), 1),
            &[
                Arg::Ptr(kp_),
                Arg::Ptr(gp),
                Arg::Ptr(ap),
                Arg::Ptr(Self::buf_ptr(OP, out.buffer())?),
                Arg::I64(first as i64),
                Arg::I32(Self::dim(OP, "pool", kp)?),
                Arg::I32(i32::from(keys.dtype() == DType::F16)),
                Arg::I64(d as i64),
            ],
        )?;
        Ok(out)
    }

    fn attention_slots(
        &self,
        q: &DeviceTensor,
        kv: &DeviceTensor,
        slots: &DeviceTensor,
        scale: f32,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "attention_slots";
        let qp = self.ptr(OP, "q", q, DType::F32)?;
        let cp = self.ptr(OP, "kv", kv, kv.dtype())?;
        let sp = self.ptr(OP, "slots", slots, DType::I32)?;
        let (n_head, d, rows) = device_ops::check_attention_slots(OP, q, kv, slots)?;
        let n_slots = slots.len();
        let out = self.output(OP, &[1, n_head * d])?;
        let f16 = i32::from(kv.dtype() == DType::F16);
        let blocks = Self::blocks(n_head as u64, 1);
        // Each block's probabilities: n_slots floats.
        let probs = self.scratch(
            OP,
            (blocks as usize).saturating_mul(n_slots).saturating_mul(4),
        )?;
        self.launch(
            OP,
            "attention_slots_f32",
            (blocks, 1),
            &[
                Arg::Ptr(qp),
                Arg::Ptr(cp),
                Arg::Ptr(sp),
                Arg::Ptr(Self::buf_ptr(OP, out.buffer())?),
                Arg::Ptr(Self::buf_ptr(OP, &*probs)?),
                Arg::I32(Self::dim(OP, "slots", n_slots)?),
                Arg::I32(Self::dim(OP, "d", d)?),
                Arg::I64(rows as i64),
                Arg::I32(f16),
                Arg::F32(scale),
                Arg::I64(n_head as i64),
            ],
        )?;
        drop(probs);
        Ok(out)
    }

    fn swiglu_clamp(
        &self,
        gate: &DeviceTensor,
        up: &DeviceTensor,
        limit: f32,
    ) -> Result<DeviceTensor, OpError> {
        const OP: &str = "swiglu_clamp";
        let gp = self.ptr(OP, "gate", gate, DType::F32)?;
        let up_ptr = self.ptr(OP, "up", up, DType::F32)?;
        check_same(OP, "up", gate, up)?;
        let out = self.output(OP, gate.shape())?;
        if out.is_empty() {
            return Ok(out);
        }
        let n = gate.len() as u64;
        self.launch(
            OP,
            "swiglu_clamp_f32",
            (Self::blocks(n, u64::from(THREADS)), 1),
            &[
                Arg::Ptr(gp),
                Arg::Ptr(up_ptr),
                Arg::Ptr(Self::buf_ptr(OP, out.buffer())?),
                Arg::F32(limit),
                Arg::I64(n as i64),
            ],
        )?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
