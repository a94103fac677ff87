//! The Python package's build and tests, run by `cargo xtask test`: a
//! virtual environment under the target directory with pinned maturin,
//! NumPy and gguf-py from pip, the wheel built by maturin and installed
//! there, and `bindings/python/tests` run with `unittest` against the
//! `seam` binary (`seam inspect --hash`, `seam load`'s error lines), the
//! test data, the gemma file and a generated model.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::{models, run, workspace_root};

/// What the tests need from pip, pinned: maturin builds the wheel, NumPy
/// reads the exports, gguf-py is the reader vLLM's GGUF iterator stands on
/// (the tests compare the package's iterator with it).
const PIP_PACKAGES: &[&str] = &["maturin==1.16.0", "numpy==2.4.6", "gguf==0.19.0"];

/// The environment variables the tests read their inputs from.
pub const SEAM_BIN_ENV: &str = "SEAM_BIN";
/// The folder of the committed test data (`tests/data`).
pub const TEST_DATA_ENV: &str = "SEAM_TEST_DATA";
/// A generated model several times the ring, for the residency test.
pub const GENERATED_ENV: &str = "SEAM_GENERATED_GGUF";

/// The generated model's size: large against the ring the residency test
/// sets (4 x 4 MiB), small enough to write in a second.
const GENERATED_SIZE: u64 = 256 << 20;

/// The virtual environment's Python, created (and the pinned packages
/// installed) where missing.
fn venv_python(target_dir: &Path) -> Result<PathBuf> {
    let venv = target_dir.join("python-venv");
    let python = venv.join("bin").join("python");
    if !python.is_file() {
        eprintln!("xtask: creating {}", venv.display());
        run(Command::new(models::python())
            .args(["-m", "venv"])
            .arg(&venv))?;
    }
    let pinned_present = Command::new(&python)
        .args(["-m", "pip", "freeze", "--disable-pip-version-check"])
        .output()
        .context("running pip freeze")?;
    let frozen = String::from_utf8_lossy(&pinned_present.stdout).to_ascii_lowercase();
    let missing: Vec<&str> = PIP_PACKAGES
        .iter()
        .copied()
        .filter(|p| !frozen.lines().any(|l| l == p.to_ascii_lowercase()))
        .collect();
    if !missing.is_empty() {
        eprintln!("xtask: installing {} with pip", missing.join(" "));
        run(Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(&missing))?;
    }
    Ok(python)
}

/// The generated model of the residency test, written once (the generator
/// is deterministic).
fn generated_model(target_dir: &Path) -> Result<PathBuf> {
    let dir = target_dir.join("python-tests");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(format!("generated-{}mib.gguf", GENERATED_SIZE >> 20));
    if !path.is_file() {
        let partial = path.with_extension("partial");
        seam_tools::demo::generated_model(GENERATED_SIZE, 1)
            .write_file(&partial)
            .with_context(|| format!("writing {}", partial.display()))?;
        std::fs::rename(&partial, &path)?;
    }
    Ok(path)
}

/// Builds the wheel, installs it in the virtual environment and runs the
/// package's tests.
pub fn test(target_dir: &Path, gemma: &Path) -> Result<()> {
    let root = workspace_root();
    let python = venv_python(target_dir)?;
    let bin_dir = python.parent().context("the venv's bin folder")?;
    // The `seam` binary the tests compare with: the one nextest's build
    // made (`cargo xtask test` builds the suite first), not a build of its
    // own, whose features would differ from the test build's and rebuild
    // the workspace once more.
    let seam_bin = target_dir.join("debug").join("seam");
    if !seam_bin.is_file() {
        bail!(
            "{} is missing: build the test suite first",
            seam_bin.display()
        );
    }
    let wheels = target_dir.join("python-wheel");
    let _ = std::fs::remove_dir_all(&wheels);
    let path = std::env::join_paths(std::iter::once(bin_dir.to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))?;
    run(Command::new(bin_dir.join("maturin"))
        .current_dir(&root)
        .env("PATH", &path)
        .args([
            "build",
            "--manifest-path",
            "bindings/python/Cargo.toml",
            "--out",
        ])
        .arg(&wheels))?;
    let wheel = std::fs::read_dir(&wheels)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .with_context(|| format!("maturin wrote no wheel in {}", wheels.display()))?;
    run(Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--force-reinstall",
            "--no-deps",
        ])
        .arg(&wheel))?;
    let tests = root.join("bindings/python/tests");
    let status = Command::new(&python)
        .current_dir(&tests)
        .env(SEAM_BIN_ENV, &seam_bin)
        .env(TEST_DATA_ENV, root.join("tests/data"))
        .env(models::GEMMA_ENV, gemma)
        .env(GENERATED_ENV, generated_model(target_dir)?)
        .args(["-m", "unittest", "discover", "--start-directory"])
        .arg(&tests)
        .args(["--pattern", "test_*.py", "--verbose"])
        .status()
        .context("running the Python tests")?;
    if !status.success() {
        bail!("the Python package's tests failed ({status})");
    }
    Ok(())
}
