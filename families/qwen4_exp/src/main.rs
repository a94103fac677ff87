//! `qwen4_exp [FILE.gguf] [--device host|fake|sink|cuda[:N]|rocm[:N]]
//! [--json] [--steps N] [--write-fixture PATH]`: load a qwen4exp file
//! (the built-in tiny fixture when no FILE is given), check it against the
//! manifest, and run N decode steps of weight access through the seam.
//!
//! `--tokens` runs the forward pass through the seam and decodes greedily;
//! `--dump-logits` writes the last position's logits.
//!
//! Bad input exits with status 2 and one line on stderr.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use qwen4_exp::engine::{SeamWeights, greedy};
use qwen4_exp::{LayerKind, Qwen4Exp, Route, fixture, simulate_decode};
use seam::session::{Session, SessionOptions};
use seam::text::{path_safe, terminal_safe};
use seam_tools::demo::TempGguf;
use seam_tools::output::check_output;
use serde_json::json;

#[derive(Parser)]
#[command(
    name = "qwen4_exp",
    version,
    about = "qwen4exp: check a file against the manifest and stage its weights through the seam"
)]
struct Cli {
    /// The GGUF file (the first shard of a split model); the built-in
    /// fixture when absent.
    file: Option<PathBuf>,
    /// host | fake | sink | cuda[:N] | rocm[:N] (default: the best device present).
    #[arg(long)]
    device: Option<String>,
    /// Print the JSON report.
    #[arg(long)]
    json: bool,
    /// Decode steps of weight access to run.
    #[arg(long, default_value_t = 4)]
    steps: u64,
    /// The seed of the simulated expert picks and PLE rows.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write the built-in fixture to PATH and exit.
    #[arg(long, value_name = "PATH")]
    write_fixture: Option<PathBuf>,
    /// Write a generated model of the public checkpoint's hidden sizes
    /// with `--layers` layers (gigabytes, streamed) to PATH and exit.
    #[arg(long, value_name = "PATH")]
    write_generated: Option<PathBuf>,
    /// Layers of `--write-generated`.
    #[arg(long, default_value_t = 2)]
    layers: u64,
    /// Prompt token ids, comma-separated: run the forward pass and decode
    /// `--steps` tokens greedily.
    #[arg(long)]
    tokens: Option<String>,
    /// Write the last position's logits as little-endian f32 (with
    /// `--tokens`).
    #[arg(long, value_name = "PATH")]
    dump_logits: Option<PathBuf>,
}

/// A failure the user can act on: one line, exit status 2.
struct Failure(String);

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure(e.to_string())
    }
}

/// The fake device's counters, for the report (`null` elsewhere).
fn fake_counters(device: &seam_devices::Device) -> serde_json::Value {
    match device.fake() {
        Some(p) => {
            let c = p.counters();
            json!({
                "allocs": c.allocs,
                "frees": c.frees,
                "copies_queued": c.copies_queued,
                "copies_completed": c.copies_completed,
                "synchronizes": c.synchronizes,
                "releases": c.releases,
                "device_bytes": c.device_bytes,
                "peak_device_bytes": c.peak_device_bytes,
            })
        }
        None => serde_json::Value::Null,
    }
}

fn print(out: &str) {
    let mut stdout = std::io::stdout().lock();
    // A closed pipe is not an error of the input.
    let _ = stdout
        .write_all(out.as_bytes())
        .and_then(|_| stdout.flush());
}

fn run(cli: Cli) -> Result<(), Failure> {
    let prompt = match &cli.tokens {
        Some(text) => Some(parse_tokens(text)?),
        None if cli.dump_logits.is_some() => {
            return Err(Failure("--dump-logits needs --tokens".into()));
        }
        None => None,
    };
    if let Some(path) = &cli.write_fixture {
        let inputs: Vec<&std::path::Path> = cli.file.iter().map(|p| p.as_path()).collect();
        check_output("--write-fixture", path, &inputs)?;
        let n = fixture::write_fixture(path)?;
        eprintln!(
            "qwen4_exp: wrote the built-in fixture to {} ({n} bytes)",
            path.display()
        );
        return Ok(());
    }
    if let Some(path) = &cli.write_generated {
        let shape = fixture::Shape::checkpoint(cli.layers);
        let n = fixture::generated(&shape)
            .streaming_writer()?
            .write_file(path)?;
        eprintln!(
            "qwen4_exp: wrote a generated model ({} layers, E {}) to {} ({n} bytes)",
            shape.n_layer,
            shape.e,
            path.display()
        );
        return Ok(());
    }
    let spec = match cli.device.as_deref() {
        Some(text) => seam_devices::parse(text).map_err(Failure)?,
        None => seam_devices::best_present(),
    };
    let env = |name: &str| std::env::var(name).ok();
    let device = seam_devices::open(spec, &env).map_err(Failure)?;
    let platform = device.platform();

    let (path, _guard) = match cli.file {
        Some(p) => (p, None),
        None => {
            let guard = TempGguf::write(&fixture::fixture(), "qwen4_exp-fixture")?;
            eprintln!(
                "qwen4_exp: no FILE given; using the built-in fixture {}",
                guard.path().display()
            );
            (guard.path().to_path_buf(), Some(guard))
        }
    };

    if let Some(dump) = &cli.dump_logits {
        check_output("--dump-logits", dump, &[&path])?;
    }

    let session = Session::new(platform, &SessionOptions::default())?;
    let policy = session.policy();
    if !policy.mmap.value.0 {
        return Err(Failure(format!(
            "mmap=off ({}) is not supported: qwen4_exp stages expert rows and gathers PLE rows as borrows of the mapped file",
            policy.mmap.source
        )));
    }
    let gguf = session.open(&path)?;
    let model = Qwen4Exp::load(&gguf).map_err(|e| Failure(format!("{}: {e}", path_safe(&path))))?;
    // Printed once the file is accepted: a bad file gets one line, its error.
    eprintln!("qwen4_exp: {}", session.policy_line());
    let (view, queue) = (session.platform(), session.queue());
    let mut decode_peaks = None;
    // With --tokens: greedy decoding through the forward pass, every weight
    // asked of the seam on every step; without: decode steps of weight
    // access only.
    let (forward, decode) = match &prompt {
        Some(prompt) => {
            let weights = SeamWeights::new(&model, &gguf, view, queue);
            // Any byte of the mapping: the sampler reads that mapping's Rss.
            let mapping = gguf
                .tensors()
                .first()
                .map(|t| gguf.tensor_borrow(t))
                .transpose()?;
            let sampler = mapping.as_ref().map(|b| {
                family_kit::residency::DecodeSampler::start(
                    b.bytes().as_ptr(),
                    std::time::Duration::from_millis(5),
                )
            });
            let decoded = greedy(weights, prompt, cli.steps as usize);
            decode_peaks = sampler.map(|s| s.stop());
            // A file changed under the pass explains a failed one too.
            gguf.check_unchanged()?;
            let (generated, logits) =
                decoded.map_err(|e| Failure(format!("{}: {e}", path_safe(&path))))?;
            if let Some(dump) = &cli.dump_logits {
                let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
                std::fs::write(dump, bytes)
                    .map_err(|e| Failure(format!("{}: {e}", dump.display())))?;
            }
            (Some((prompt.clone(), generated)), None)
        }
        None => {
            let decoded = simulate_decode(&model, view, queue, cli.steps, cli.seed);
            gguf.check_unchanged()?;
            (None, Some(decoded?))
        }
    };

    let hp = model.hparams();
    let census = model.census();
    let count_route = |r: Route| {
        model
            .manifest()
            .tensors
            .iter()
            .filter(|t| t.route == r)
            .count()
    };
    let seam_counts = platform.stage_counters().snapshot();
    if cli.json {
        let layers_of = |k: LayerKind| -> Vec<usize> {
            (0..hp.n_layer).filter(|&l| hp.layers[l] == k).collect()
        };
        let report = json!({
            "file": path,
            "device": platform.backend().name(),
            "arch": qwen4_exp::ARCH,
            "model": {
                "n_layer": hp.n_layer,
                "block_count": hp.block_count,
                "gdn_layers": layers_of(LayerKind::Gdn),
                "full_attention_layers": layers_of(LayerKind::FullAttention),
                "ple_layer": hp.ple.as_ref().map(|p| p.layer),
                "hc": hp.hc,
                "n_expert": hp.n_expert,
                "n_expert_used": hp.n_expert_used,
                "n_embd": hp.n_embd,
                "n_vocab": model.manifest().layout.n_vocab,
            },
            "census": census,
            "drop_rules": model.manifest().drop_rules(),
            "steps": cli.steps,
            "decode": decode,
            "prompt": forward.as_ref().map(|f| &f.0),
            "generated": forward.as_ref().map(|f| &f.1),
            "weights": {
                "dense": count_route(Route::Dense),
                "expert_stacks": count_route(Route::ExpertStack),
                "lazy_tables": count_route(Route::LazyTable),
                "experts_made": model.experts_made().count(),
                "staged": model.staged_weights(),
                "whole_stacks_staged": model.whole_stacks_staged(),
            },
            "file_bytes": census.file_bytes,
            "decode_residency": decode_peaks.map(|p| json!({
                "samples": p.samples,
                "rss_anon_start_mib": mib(p.rss_anon_start),
                "rss_anon_peak_mib": mib(p.rss_anon_peak),
                "rss_file_peak_mib": mib(p.rss_file_peak),
                "mapping_rss_peak_mib": mib(p.mapping_rss_peak),
                "mapping_rss_end_mib": mib(p.mapping_rss_end),
            })),
            "largest_weight_f32_mib": mib(model
                .manifest()
                .tensors
                .iter()
                .map(|t| 4 * t.dims.canonical().iter().product::<u64>())
                .max()
                .unwrap_or(0)),
            "seam": seam_counts,
            "policy": session.policy_line(),
            "ring": session.ring_counts(),
            "fake": fake_counters(&device),
        });
        let mut s = serde_json::to_string_pretty(&report)?;
        s.push('\n');
        print(&s);
    } else if let Some((prompt, generated)) = &forward {
        print(&format!(
            "{}: prompt {prompt:?} -> greedy {generated:?} on {}; seam: {} uploads ({:.1} MiB), {} releases\n",
            path.display(),
            platform.backend().name(),
            seam_counts.uploads,
            seam_counts.uploaded_bytes as f64 / 1048576.0,
            seam_counts.releases,
        ));
    } else if let Some(decode) = &decode {
        let experts_made = model.experts_made().count();
        print(&format!(
            "{}: qwen4exp, {} layers ({} GDN, {} full attention), {} experts ({} used), hc {}\n\
             manifest: {} tensors claimed ({:.1} MiB: {} dense, {} expert stacks, {} lazy tables), {} dropped by name\n\
             {} steps on {}: {} dense calls, {} expert calls ({} expert matrices made), {} PLE rows gathered\n\
             seam: {} uploads ({:.1} MiB), {} releases; {} weights staged, {} stacks staged whole\n",
            path.display(),
            hp.n_layer,
            hp.layers.iter().filter(|&&k| k == LayerKind::Gdn).count(),
            hp.full_attention_layers().len(),
            hp.n_expert,
            hp.n_expert_used.first().copied().unwrap_or(0),
            hp.hc,
            census.claimed_tensors,
            census.claimed_bytes as f64 / 1048576.0,
            count_route(Route::Dense),
            count_route(Route::ExpertStack),
            count_route(Route::LazyTable),
            census.dropped.len(),
            cli.steps,
            platform.backend().name(),
            decode.dense_calls,
            decode.expert_calls,
            experts_made,
            decode.ple_rows,
            seam_counts.uploads,
            seam_counts.uploaded_bytes as f64 / 1048576.0,
            seam_counts.releases,
            model.staged_weights(),
            model.whole_stacks_staged(),
        ));
    }
    Ok(())
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1048576.0
}

/// Parses `--tokens 1,2,3`.
fn parse_tokens(text: &str) -> Result<Vec<u32>, Failure> {
    let tokens: Result<Vec<u32>, _> = text.split(',').map(|t| t.trim().parse::<u32>()).collect();
    match tokens {
        Ok(t) if !t.is_empty() => Ok(t),
        _ => Err(Failure(format!(
            "--tokens {text:?}: expected comma-separated token ids, e.g. 1,2,3"
        ))),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // A model truncated under its mapping: one line and exit 2, not SIGBUS.
    if let Err(e) = seam::borrow::fault::exit_on_fault_in_mapped_files("qwen4_exp") {
        eprintln!("qwen4_exp: error: installing the SIGBUS handler: {e}");
        return ExitCode::from(2);
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(msg)) => {
            eprintln!(
                "qwen4_exp: error: {}",
                terminal_safe(&msg.replace('\n', " "))
            );
            ExitCode::from(2)
        }
    }
}
