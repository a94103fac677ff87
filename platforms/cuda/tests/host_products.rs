//! The CUDA products on the host, no GPU needed: `tools/cuda_dot_harness`
//! compiles `src/ops.cu`'s products with g++ (the warp's lanes run one
//! after another) and checks every weight type's row dot products (float
//! ones, or int8 ones for the types of `INT8_KERNELS`), the per-unit
//! decoders included, against its per-element `deq` in double, and the
//! product kernels' bodies over emulated grids. A unit decoder
//! that reads a wrong byte, scale or sign fails here before a GPU runs it.
//! It also runs the arithmetic of the kernels that follow ggml's f32 steps
//! (`ggml_steps.cpp`: the vectorised exp, the f32/f16 dots, the block
//! softmax, F16 attention, `imrope_f32` with glibc's cosine, sine and power
//! in place of the device's) against llama.cpp's CPU bits, and the
//! device's `libm_expf`/`libm_logf` with the lists and windows `CudaOps`
//! uploads (`device_ops::libm_rounding`) against glibc's.

use std::path::Path;
use std::process::Command;

#[test]
fn every_weight_types_products_match_its_dequantization_on_the_host() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/cuda_dot_harness/run.sh");
    let windows = device_ops::libm_rounding::LibmFn::ALL.map(|f| f.tie_window().to_string());
    let out = Command::new("bash")
        .arg(&script)
        .env("LIBM_TIE_WINDOWS", windows.join(" "))
        .output()
        .expect("bash runs the harness");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.lines().last() == Some("all passed"),
        "{}: {:?}\n{stdout}\n{stderr}",
        script.display(),
        out.status
    );
    // Each type by the products it has: int8 ones, or float ones.
    let checked = |ty: &str, what: &str| {
        stdout
            .lines()
            .any(|l| l.split_whitespace().next() == Some(ty) && l.contains(what))
    };
    for (ty, _) in platform_cuda::ops::INT8_KERNELS {
        let ty = ty.to_string();
        assert!(checked(&ty, "int8:"), "{ty} not checked:\n{stdout}");
    }
    for ty in ["Q4_0", "Q2_K", "Q5_0", "IQ3_S", "IQ1_M", "F16"] {
        assert!(checked(ty, "dots:"), "{ty} not checked:\n{stdout}");
    }
    assert!(
        checked("ggml_steps:", "llama.cpp's bits")
            && checked("imrope_f32:", "the oracle's bits")
            && checked("libm_expf,", "glibc's bits"),
        "ggml's steps not checked:\n{stdout}"
    );
}
