//! `dflash [DRAFT.gguf] [--target TARGET.gguf] [--steps N] [--json]
//! [--device NAME] [--tokens 1,2,3] [--dump-logits PATH]
//! [--write-fixture PATH]`: speculative decoding with a draft over a
//! qwen4exp target, both loaded through the seam (the fake staging device
//! by default); with no files, the built-in tiny draft over the qwen4_exp
//! built-in tiny target, written to temporary files. Reports the
//! tokens, whether they equal the target's own greedy tokens, the
//! acceptance rate and the census.
//!
//! Bad input exits with status 2 and one line on stderr.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use dflash::forward::DraftRunner;
use dflash::spec::{QwenTarget, speculate};
use dflash::{Dflash, TargetTables};
use qwen4_exp::Qwen4Exp;
use qwen4_exp::engine::{SeamWeights, greedy};
use seam::session::{Session, SessionOptions};
use seam::text::terminal_safe;
use seam_tools::demo::TempGguf;
use seam_tools::output::check_output;
use serde_json::json;

#[derive(Parser)]
#[command(
    name = "dflash",
    version,
    about = "dflash: speculative decoding with the built-in draft over the built-in qwen4exp target"
)]
struct Cli {
    /// The draft GGUF (default: the built-in tiny draft).
    file: Option<PathBuf>,
    /// The target GGUF, a qwen4exp model (default: the qwen4_exp built-in
    /// tiny fixture).
    #[arg(long)]
    target: Option<PathBuf>,
    /// Write the last position's logits (the target's, which verifies every
    /// token) as little-endian f32.
    #[arg(long, value_name = "PATH")]
    dump_logits: Option<PathBuf>,
    /// Write the built-in draft fixture to PATH and exit.
    #[arg(long, value_name = "PATH")]
    write_fixture: Option<PathBuf>,
    /// Tokens to generate.
    #[arg(long, default_value_t = 16)]
    steps: usize,
    /// host | fake | sink | cuda[:N] | rocm[:N].
    #[arg(long, default_value = "fake")]
    device: String,
    /// Prompt token ids, comma-separated.
    #[arg(long, default_value = "1,2,3")]
    tokens: String,
    /// Print the JSON report.
    #[arg(long)]
    json: bool,
}

struct Failure(String);

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure(e.to_string())
    }
}

fn run(cli: Cli) -> Result<(), Failure> {
    let given: Vec<&std::path::Path> = cli
        .file
        .iter()
        .chain(&cli.target)
        .map(|p| p.as_path())
        .collect();
    if let Some(path) = &cli.write_fixture {
        check_output("--write-fixture", path, &given)?;
        let n = dflash::fixture::write_fixture(path)?;
        eprintln!(
            "dflash: wrote the built-in draft fixture to {} ({n} bytes)",
            path.display()
        );
        return Ok(());
    }
    let prompt: Vec<u32> = cli
        .tokens
        .split(',')
        .map(|t| t.trim().parse::<u32>())
        .collect::<Result<_, _>>()
        .map_err(|_| {
            Failure(format!(
                "--tokens {:?}: expected ids like 1,2,3",
                cli.tokens
            ))
        })?;
    let spec = seam_devices::parse(&cli.device).map_err(Failure)?;
    let device = seam_devices::open(spec, &|name| std::env::var(name).ok()).map_err(Failure)?;
    let mut temporary = Vec::new();
    let mut built_in = |writer: seam::gguf::GgufWriter, stem: &str| -> Result<PathBuf, Failure> {
        let file = TempGguf::write(&writer, stem)?;
        let path = file.path().to_path_buf();
        temporary.push(file);
        Ok(path)
    };
    let target_path = match cli.target {
        Some(p) => p,
        None => built_in(qwen4_exp::fixture::fixture(), "dflash-target")?,
    };
    let draft_path = match cli.file {
        Some(p) => p,
        None => built_in(dflash::fixture::fixture(), "dflash-draft")?,
    };
    if let Some(dump) = &cli.dump_logits {
        check_output("--dump-logits", dump, &[&target_path, &draft_path])?;
    }
    // One session for the device: the knobs resolved once, both files
    // mapped with the resolved prefault, the ring on a staging device.
    let session = Session::new(device.platform(), &SessionOptions::default())?;
    let target_gguf = session.open(&target_path)?;
    let draft_gguf = session.open(&draft_path)?;
    let target = Qwen4Exp::load(&target_gguf)?;
    let draft = Dflash::load(&draft_gguf, &target)?;
    // Printed once both files are accepted: a bad file gets one line.
    eprintln!("dflash: {}", session.policy_line());
    let (platform, queue) = (session.platform(), session.queue());

    let taps = draft.hparams().target_layers.clone();
    let verifier = QwenTarget::new(
        SeamWeights::new(&target, &target_gguf, platform, queue),
        &taps,
    )?;
    let mut runner = DraftRunner::new(&draft, platform, queue);
    let report = speculate(&verifier, &mut runner, &prompt, cli.steps);
    let greedy_run = greedy(
        SeamWeights::new(&target, &target_gguf, platform, queue),
        &prompt,
        cli.steps,
    );
    // Files changed under the passes explain a failed one too.
    target_gguf.check_unchanged()?;
    draft_gguf.check_unchanged()?;
    let (report, (reference, logits)) = (report?, greedy_run?);
    let matches = reference == report.tokens;
    if let Some(dump) = &cli.dump_logits {
        let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(dump, bytes).map_err(|e| Failure(format!("{}: {e}", dump.display())))?;
    }
    let seam_counts = platform.stage_counters().snapshot();
    let fake = match device.fake() {
        Some(p) => {
            let c = p.counters();
            json!({"allocs": c.allocs, "frees": c.frees, "releases": c.releases,
                   "device_bytes": c.device_bytes, "peak_device_bytes": c.peak_device_bytes})
        }
        None => serde_json::Value::Null,
    };
    let tables_shared = std::ptr::eq(draft.token_embd(), target.token_embd().expect("checked"))
        && std::ptr::eq(draft.output_head(), target.output_head().expect("checked"));
    if cli.json {
        let out = json!({
            "device": platform.backend().name(),
            "prompt": prompt,
            "draft": draft.hparams(),
            "speculation": report,
            "target_greedy": reference,
            "matches_target_greedy": matches,
            "census": draft.census(),
            "tables_shared_with_target": tables_shared,
            "seam": seam_counts,
            "policy": session.policy_line(),
            "ring": session.ring_counts(),
            "fake": fake,
        });
        let mut s = serde_json::to_string_pretty(&out)?;
        s.push('\n');
        let _ = std::io::stdout().lock().write_all(s.as_bytes());
    } else {
        let c = draft.census();
        let s = format!(
            "dflash on {}: prompt {prompt:?} -> {:?} ({} target greedy)\n\
             {} rounds, {}/{} drafts accepted ({:.1}%), {} target steps\n\
             census: draft {} tensors ({:.1} KiB own); borrowed from the target {:?} (+{} host bytes, shared: {tables_shared})\n\
             seam: {} uploads ({:.1} KiB), {} releases\n",
            platform.backend().name(),
            report.tokens,
            if matches { "==" } else { "!=" },
            report.rounds,
            report.accepted,
            report.proposed,
            100.0 * report.acceptance_rate,
            report.target_steps,
            c.own_tensors,
            c.own_bytes as f64 / 1024.0,
            c.borrowed,
            c.borrowed_host_bytes_added,
            seam_counts.uploads,
            seam_counts.uploaded_bytes as f64 / 1024.0,
            seam_counts.releases,
        );
        let _ = std::io::stdout().lock().write_all(s.as_bytes());
    }
    if !matches {
        return Err(Failure(format!(
            "speculation {:?} differs from the target's greedy {reference:?}",
            report.tokens
        )));
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // A model truncated under its mapping: one line and exit 2, not SIGBUS.
    if let Err(e) = seam::borrow::fault::exit_on_fault_in_mapped_files("dflash") {
        eprintln!("dflash: error: installing the SIGBUS handler: {e}");
        return ExitCode::from(2);
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(msg)) => {
            eprintln!("dflash: error: {}", terminal_safe(&msg.replace('\n', " ")));
            ExitCode::from(2)
        }
    }
}
