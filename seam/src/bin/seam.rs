//! The `seam` command: inspect GGUF files (and, as the seam grows, load
//! them onto devices). Bad input exits with status 2 and one line on stderr.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use seam::borrow::MapOptions;
use seam::gguf::GgufModel;

#[derive(Parser)]
#[command(
    name = "seam",
    version,
    about = "Stage GGUF weights onto accelerators without drowning the host"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show a GGUF file's header, metadata and tensor table. With no FILE,
    /// writes the built-in demo model to a temporary file and inspects it.
    Inspect {
        /// The GGUF file (the first shard of a split model).
        file: Option<PathBuf>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Add the sha256 of each tensor's bytes.
        #[arg(long)]
        hash: bool,
    },
}

/// A failure the user can act on: printed as one line, exit status 2.
struct Failure(String);

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure(e.to_string())
    }
}

/// A temporary file removed on drop, for the built-in demo model.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn demo_file() -> Result<TempFile, Failure> {
    let path = std::env::temp_dir().join(format!("seam-demo-{}.gguf", std::process::id()));
    let file = TempFile(path);
    seam::demo::demo_model().write_file(&file.0)?;
    Ok(file)
}

fn inspect(file: Option<PathBuf>, json: bool, hash: bool) -> Result<(), Failure> {
    let demo;
    let path = match file {
        Some(p) => p,
        None => {
            demo = demo_file()?;
            eprintln!(
                "seam: no FILE given; inspecting the built-in demo model {}",
                demo.0.display()
            );
            demo.0.clone()
        }
    };
    let model = GgufModel::open(&path, MapOptions::default())?;
    let out = if json {
        let mut s = serde_json::to_string_pretty(&seam::inspect::inspect_json(&model, hash)?)?;
        s.push('\n');
        s
    } else {
        seam::inspect::inspect_text(&model, hash)?
    };
    let mut stdout = std::io::stdout().lock();
    // A closed pipe (`seam inspect | head`) is not an error of the input.
    let _ = stdout
        .write_all(out.as_bytes())
        .and_then(|_| stdout.flush());
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect { file, json, hash } => inspect(file, json, hash),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(msg)) => {
            eprintln!("seam: error: {}", msg.replace('\n', " "));
            ExitCode::from(2)
        }
    }
}
