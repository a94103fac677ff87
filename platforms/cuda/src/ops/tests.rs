//! The kernels compile: every kernel to an sm_90 CUBIN with NVRTC, no GPU
//! needed. Under `cargo xtask test` (which installs libnvrtc and sets
//! [`REQUIRE_NVRTC_ENV`]) an absent libnvrtc fails the test; elsewhere it
//! is skipped with the reason printed.

use std::sync::Arc;

use super::*;

/// Set to `1` by `cargo xtask test`: libnvrtc must then be found.
const REQUIRE_NVRTC_ENV: &str = "SEAM_REQUIRE_NVRTC";

/// Whether NVRTC is here; `false` (with the reason printed) only where
/// nothing requires it.
fn nvrtc_here(test: &str) -> bool {
    let required = std::env::var(REQUIRE_NVRTC_ENV).is_ok_and(|v| v == "1");
    match nvrtc_unavailable_reason() {
        None => true,
        Some(why) => {
            assert!(!required, "{REQUIRE_NVRTC_ENV}=1 but {why}");
            eprintln!(
                "SKIPPED {test}: {why}; set {REQUIRE_NVRTC_ENV}=1 to make this a failure (cargo xtask test does)"
            );
            false
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn every_kernel_compiles_to_an_sm_90_cubin() {
    if !nvrtc_here("every_kernel_compiles_to_an_sm_90_cubin") {
        return;
    }
    let image = cubin("sm_90").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(&image[..4], b"\x7fELF", "not a CUBIN");
    let names = kernel_names();
    assert_eq!(
        names.len(),
        3 * WEIGHT_KERNELS.len() + 2 * INT8_KERNELS.len() + OTHER_KERNELS.len()
    );
    for name in &names {
        // An extern "C" kernel's symbol is its name.
        let sym = format!("\0{name}\0");
        assert!(
            contains(&image, sym.as_bytes()),
            "{name} is not in the CUBIN"
        );
    }
    // And every kernel of the CUBIN is named there (a kernel the list
    // lacks fails its first launch): an extern "C" kernel's code is its
    // section `.text.NAME`; device functions' names are mangled (`_Z`).
    let marker = b"\0.text.";
    let in_cubin: Vec<String> = image
        .windows(marker.len())
        .enumerate()
        .filter(|(_, w)| *w == marker)
        .filter_map(|(i, _)| {
            let rest = &image[i + marker.len()..];
            let end = rest.iter().position(|&b| b == 0)?;
            String::from_utf8(rest[..end].to_vec()).ok()
        })
        .filter(|n| !n.starts_with("_Z"))
        .collect();
    assert!(!in_cubin.is_empty(), "no kernel section found");
    for name in &in_cubin {
        assert!(
            names.contains(name),
            "{name} is in the CUBIN, not in kernel_names()"
        );
    }
    // Compiled once per process and architecture.
    let again = cubin("sm_90").unwrap();
    assert!(Arc::ptr_eq(&image, &again));
}

#[test]
fn a_broken_kernel_is_an_error_with_nvrtcs_log() {
    if !nvrtc_here("a_broken_kernel_is_an_error_with_nvrtcs_log") {
        return;
    }
    let err = compile_source(
        "extern \"C\" __global__ void k() { undeclared(); }",
        "sm_90",
    )
    .unwrap_err();
    assert!(err.contains("undeclared"), "{err}");
}

#[test]
fn every_weight_type_of_the_check_has_kernels_and_rounds_as_family_ops() {
    use device_ops::reference::rounded_activations as family;
    let x: Vec<f32> = (0..256)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.3)
        .collect();
    for ty in device_ops::conformance::WEIGHT_TYPES {
        let (_, suffix) = WEIGHT_KERNELS
            .iter()
            .find(|(t, _)| t == ty)
            .unwrap_or_else(|| panic!("{ty} has no kernel"));
        // A gather and float products, or a gather and int8 products.
        let instantiated = match int8_suffix(*ty) {
            None => format!("WEIGHT_KERNELS({suffix}, "),
            Some(_) => format!("GATHER_KERNEL({suffix}, "),
        };
        assert!(source().contains(&instantiated), "{ty}");
        if let Some(s) = int8_suffix(*ty) {
            assert!(source().contains(&format!("INT8_KERNELS({s}, ")), "{ty}");
        }
        // The kernel that rounds this type's activations rounds them as
        // family-ops does for a type of that format.
        let format_of = |kernel| match kernel {
            None => x.clone(),
            Some(("act_f16", 1)) => family(GgmlType::F16, &x).unwrap(),
            Some(("act_bf16", 1)) => family(GgmlType::BF16, &x).unwrap(),
            Some(("act_q8_0", 32)) => family(GgmlType::Q8_0, &x).unwrap(),
            Some(("act_q8_k", 256)) => family(GgmlType::Q6_K, &x).unwrap(),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            format_of(activation_kernel(*ty)),
            family(*ty, &x).unwrap(),
            "{ty}"
        );
    }
}

#[test]
fn a_kernels_file_replaces_the_built_in_kernels_and_a_missing_one_is_named() {
    assert_eq!(kernels_from(None), Ok(None));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ops.cu");
    std::fs::write(&path, "// tuned\n").unwrap();
    assert_eq!(kernels_from(Some(&path)), Ok(Some("// tuned\n".to_owned())));
    let tuned = with_grids("// tuned\n");
    assert!(tuned.ends_with("// tuned\n") && tuned.contains("iq2xxs_grid"));
    assert_eq!(with_grids(KERNELS_CU), source());
    let missing = dir.path().join("absent.cu");
    let err = kernels_from(Some(&missing)).unwrap_err();
    assert!(
        err.starts_with(&format!("{KERNELS_SOURCE_ENV}={}: ", missing.display())),
        "{err}"
    );
}

/// The int8 products negate the IQ2 and IQ3_XXS grids' bytes one at a
/// time as complement plus one without a carry between bytes
/// (`signed_grid` in ops.cu), and multiply them as signed bytes: each must
/// be in 1..=127.
#[test]
fn the_iq_grids_bytes_are_in_1_to_127_as_the_int8_products_need() {
    use device_ops::grids;
    let wide = grids::IQ2XXS_GRID
        .iter()
        .chain(&grids::IQ2XS_GRID)
        .chain(&grids::IQ2S_GRID)
        .flat_map(|e| e.to_le_bytes());
    let narrow = grids::IQ3XXS_GRID.iter().flat_map(|e| e.to_le_bytes());
    let bytes: Vec<u8> = wide.chain(narrow).collect();
    assert_eq!(bytes.len(), 8 * (256 + 512 + 1024) + 4 * 256);
    assert!(bytes.iter().all(|b| (1..=127).contains(b)));
    // The int8 types are those whose activations are int8 blocks.
    for (ty, _) in INT8_KERNELS {
        assert!(
            matches!(activation_kernel(*ty), Some(("act_q8_0" | "act_q8_k", _))),
            "{ty}"
        );
    }
}
