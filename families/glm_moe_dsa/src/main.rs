//! `glm_moe_dsa [FILE.gguf] [--device host|fake|sink|cuda[:N]|rocm[:N]]
//! [--tokens 1,2,3] [--steps N] [--json] [--dump-logits PATH]
//! [--write-fixture PATH]`: load a glm-dsa file (the built-in tiny fixture
//! when no FILE is given), check it against the manifest, run the prompt
//! (default `1`) through the forward pass on a seam session and decode N
//! tokens greedily, every weight asked of the seam on every step.
//!
//! Bad input exits with status 2 and one line on stderr.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use family_kit::WeightReader;
use family_kit::residency::DecodeSampler;
use glm_moe_dsa::forward::greedy;
use glm_moe_dsa::model::Ffn;
use glm_moe_dsa::{ARCH, GlmMoeDsa, fixture};
use seam::session::{Session, SessionOptions};
use seam::text::{path_safe, terminal_safe};
use seam_tools::demo::TempGguf;
use seam_tools::output::check_output;
use serde_json::json;

#[derive(Parser)]
#[command(
    name = "glm_moe_dsa",
    version,
    about = "glm-dsa: check a file against the manifest and decode greedily through the seam"
)]
struct Cli {
    /// The GGUF file; the built-in fixture when absent.
    file: Option<PathBuf>,
    /// host | fake | sink | cuda[:N] | rocm[:N] (default: the best device present).
    #[arg(long)]
    device: Option<String>,
    /// Prompt token ids, comma-separated (default: 1).
    #[arg(long)]
    tokens: Option<String>,
    /// Tokens to decode greedily.
    #[arg(long, default_value_t = 4)]
    steps: usize,
    /// Print the JSON report.
    #[arg(long)]
    json: bool,
    /// Write the last position's logits as little-endian f32.
    #[arg(long, value_name = "PATH")]
    dump_logits: Option<PathBuf>,
    /// Write the built-in fixture to PATH and exit.
    #[arg(long, value_name = "PATH")]
    write_fixture: Option<PathBuf>,
}

/// A failure the user can act on: one line, exit status 2.
struct Failure(String);

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure(e.to_string())
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1048576.0
}

fn parse_tokens(text: &str) -> Result<Vec<u32>, Failure> {
    text.split(',')
        .map(|t| t.trim().parse::<u32>())
        .collect::<Result<Vec<u32>, _>>()
        .ok()
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            Failure(format!(
                "--tokens {text:?}: expected comma-separated token ids, e.g. 1,2,3"
            ))
        })
}

fn run(cli: Cli) -> Result<(), Failure> {
    let prompt = match &cli.tokens {
        Some(text) => parse_tokens(text)?,
        None => vec![1],
    };
    if let Some(path) = &cli.write_fixture {
        let inputs: Vec<&std::path::Path> = cli.file.iter().map(|p| p.as_path()).collect();
        check_output("--write-fixture", path, &inputs)?;
        let n = fixture::write_fixture(path)?;
        eprintln!(
            "glm_moe_dsa: wrote the built-in fixture to {} ({n} bytes)",
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
    let (path, guard) = match cli.file {
        Some(p) => (p, None),
        None => {
            let guard = TempGguf::write(&fixture::fixture().writer(), "glm_moe_dsa-fixture")?;
            (guard.path().to_path_buf(), Some(guard))
        }
    };
    if let Some(dump) = &cli.dump_logits {
        check_output("--dump-logits", dump, &[&path])?;
    }
    let session = Session::new(platform, &SessionOptions::default())?;
    if !session.policy().mmap.value.0 {
        return Err(Failure(format!(
            "mmap=off ({}) is not supported: glm_moe_dsa stages each routed expert as a borrow of the mapped file",
            session.policy().mmap.source
        )));
    }
    let gguf = session.open(&path)?;
    let model =
        GlmMoeDsa::load(&gguf).map_err(|e| Failure(format!("{}: {e}", path_safe(&path))))?;
    if let Some(&t) = prompt.iter().find(|&&t| t as usize >= model.n_vocab()) {
        return Err(Failure(format!(
            "--tokens: token {t} is outside the vocabulary of {}",
            model.n_vocab()
        )));
    }
    // Printed once the file and prompt are accepted: bad input gets one line.
    if guard.is_some() {
        eprintln!(
            "glm_moe_dsa: no FILE given; using the built-in fixture {}",
            path.display()
        );
    }
    eprintln!("glm_moe_dsa: {}", session.policy_line());
    let mapping = gguf
        .tensors()
        .first()
        .map(|t| gguf.tensor_borrow(t))
        .transpose()?;
    let sampler = mapping
        .as_ref()
        .map(|b| DecodeSampler::start(b.bytes().as_ptr(), std::time::Duration::from_millis(5)));
    let reader = WeightReader::new(session.platform(), session.queue());
    let decoded = greedy(&model, reader, &prompt, cli.steps, &mut || {});
    let peaks = sampler.map(|s| s.stop());
    // A file changed under the pass explains a failed one too.
    gguf.check_unchanged()?;
    let decoded = decoded.map_err(|e| Failure(format!("{}: {e}", path_safe(&path))))?;
    if let Some(dump) = &cli.dump_logits {
        let last = decoded.logits.last().map(Vec::as_slice).unwrap_or(&[]);
        let bytes: Vec<u8> = last.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(dump, bytes).map_err(|e| Failure(format!("{}: {e}", dump.display())))?;
    }

    let hp = model.hparams();
    let census = model.census();
    let weights = model.weights();
    let seam_counts = platform.stage_counters().snapshot();
    // Per route: claimed tensors, and those with a device copy now.
    let mut routes: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for (spec, w) in model.manifest().tensors.iter().zip(weights.all()) {
        let e = routes.entry(spec.route.name()).or_default();
        e.0 += 1;
        e.1 += usize::from(w.device_copy().is_some());
    }
    // Per expert stack, its experts with a device copy (each staged once).
    let mut per_stack: BTreeMap<&str, usize> = BTreeMap::new();
    for layer in &model.handles().layers {
        if let Ffn::Moe { stacks, .. } = layer.ffn {
            for h in stacks {
                let name = model.get(h).name();
                let staged = weights
                    .experts_made()
                    .filter(|w| w.device_copy().is_some())
                    .filter(|w| {
                        w.name()
                            .strip_prefix(name)
                            .is_some_and(|r| r.starts_with('['))
                    })
                    .count();
                per_stack.insert(name, staged);
            }
        }
    }
    let out = if cli.json {
        let fake = device.fake().map(|p| {
            let c = p.counters();
            json!({
                "allocs": c.allocs,
                "frees": c.frees,
                "copies_queued": c.copies_queued,
                "copies_completed": c.copies_completed,
                "releases": c.releases,
                "device_bytes": c.device_bytes,
                "peak_device_bytes": c.peak_device_bytes,
            })
        });
        let routes: BTreeMap<&str, serde_json::Value> = routes
            .into_iter()
            .map(|(r, (n, staged))| (r, json!({"tensors": n, "staged_now": staged})))
            .collect();
        let report = json!({
            "file": path,
            "device": platform.backend().name(),
            "arch": ARCH,
            "file_bytes": census.file_bytes,
            "model": hp,
            "n_vocab": model.n_vocab(),
            "census": census,
            "drop_rules": model.manifest().drop_rules(),
            "prompt": prompt,
            "steps": cli.steps,
            "generated": decoded.generated,
            "routes": routes,
            "weights": {
                "experts_made": weights.experts_made().count(),
                "staged": weights.staged(),
                "whole_stacks_staged": weights.whole_stacks_staged(),
            },
            "experts_staged_per_stack": per_stack,
            "decode_residency": peaks.map(|p| json!({
                "samples": p.samples,
                "rss_anon_start_mib": mib(p.rss_anon_start),
                "rss_anon_peak_mib": mib(p.rss_anon_peak),
                "rss_file_peak_mib": mib(p.rss_file_peak),
                "mapping_rss_peak_mib": mib(p.mapping_rss_peak),
                "mapping_rss_end_mib": mib(p.mapping_rss_end),
            })),
            "seam": seam_counts,
            "policy": session.policy_line(),
            "ring": session.ring_counts(),
            "fake": fake,
        });
        let mut s = serde_json::to_string_pretty(&report)?;
        s.push('\n');
        s
    } else {
        format!(
            "{}: prompt {prompt:?} -> greedy {:?} on {}; {} layers; \
             seam: {} uploads ({:.1} MiB), {} releases; {} experts made, {} stacks staged whole\n",
            path.display(),
            decoded.generated,
            platform.backend().name(),
            hp.n_layer,
            seam_counts.uploads,
            mib(seam_counts.uploaded_bytes),
            seam_counts.releases,
            weights.experts_made().count(),
            weights.whole_stacks_staged(),
        )
    };
    let mut stdout = std::io::stdout().lock();
    // A closed pipe is not an error of the input.
    let _ = stdout
        .write_all(out.as_bytes())
        .and_then(|_| stdout.flush());
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // A model truncated under its mapping: one line and exit 2, not SIGBUS.
    if let Err(e) = seam::borrow::fault::exit_on_fault_in_mapped_files("glm_moe_dsa") {
        eprintln!("glm_moe_dsa: error: installing the SIGBUS handler: {e}");
        return ExitCode::from(2);
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(msg)) => {
            eprintln!(
                "glm_moe_dsa: error: {}",
                terminal_safe(&msg.replace('\n', " "))
            );
            ExitCode::from(2)
        }
    }
}
