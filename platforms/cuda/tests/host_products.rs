//! The CUDA products on the host, no GPU needed: `tools/cuda_dot_harness`
//! compiles `src/ops.cu`'s products with g++ (the warp's lanes run one
//! after another) and checks every weight type's row dot products, the
//! per-unit decoders included, against its per-element `deq` in double, and
//! the matmul and matmul_id bodies over emulated grids. A unit decoder
//! that reads a wrong byte, scale or sign fails here before a GPU runs it.

use std::path::Path;
use std::process::Command;

#[test]
fn every_weight_types_products_match_its_dequantization_on_the_host() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/cuda_dot_harness/run.sh");
    let out = Command::new("bash")
        .arg(&script)
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
    for ty in ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "Q4_K", "Q6_K"] {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(ty) && l.contains("dots:")),
            "{ty} not checked:\n{stdout}"
        );
    }
}
