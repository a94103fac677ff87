//! `muse_glimmer [FILE.gguf] [--device host|fake|sink|cuda[:N]|rocm[:N]]
//! [--tokens 1,2,3] [--steps N] [--json] [--dump-logits PATH]
//! [--write-fixture PATH] [--mmproj PROJECTOR.gguf]`: load a muse-glimmer
//! file (the built-in tiny fixture when no FILE is given) through the seam,
//! check it against the manifest and decode greedily with the CPU forward
//! pass, every weight asked of the seam on every step. With `--mmproj`, the
//! projector is checked against its own manifest, staged through the seam
//! and encodes a synthetic image; its census and stage counts are its own.
//!
//! Bad input exits with status 2 and one line on stderr.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use family_kit::{LoadedWeights, Manifest, WeightReader};
use muse_glimmer::forward::{Decoder, greedy};
use muse_glimmer::mmproj::{Image, Projector, explain_open_error};
use muse_glimmer::{MuseGlimmer, fixture};
use seam::session::{LoadError as SessionError, Session, SessionOptions};
use seam::text::{path_safe, terminal_safe};
use seam_tools::demo::TempGguf;
use seam_tools::output::check_output;
use serde_json::json;

#[derive(Parser)]
#[command(
    name = "muse_glimmer",
    version,
    about = "muse-glimmer: check a file (and its projector) against the manifest and decode through the seam"
)]
struct Cli {
    /// The GGUF file; the built-in fixture when absent.
    file: Option<PathBuf>,
    /// host | fake | sink | cuda[:N] | rocm[:N] (default: the best device present).
    #[arg(long)]
    device: Option<String>,
    /// Prompt token ids, comma-separated.
    #[arg(long, default_value = "1,2,3")]
    tokens: String,
    /// Tokens to generate greedily.
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
    /// The multimodal projector GGUF (clip.projector_type muse-glimmer).
    #[arg(long, value_name = "FILE")]
    mmproj: Option<PathBuf>,
}

/// A failure the user can act on: one line, exit status 2.
struct Failure(String);

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure(e.to_string())
    }
}

fn print(out: &str) {
    let mut stdout = std::io::stdout().lock();
    // A closed pipe is not an error of the input.
    let _ = stdout
        .write_all(out.as_bytes())
        .and_then(|_| stdout.flush());
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

/// Per route: tensors, file bytes, and how many have a device copy.
fn routes(manifest: &Manifest, weights: &LoadedWeights) -> serde_json::Value {
    let mut out: BTreeMap<&str, (u64, u64, u64)> = BTreeMap::new();
    for (spec, w) in manifest.tensors.iter().zip(weights.all()) {
        let e = out.entry(spec.route.name()).or_default();
        e.0 += 1;
        e.1 += w.host().len();
        e.2 += u64::from(w.device_copy().is_some());
    }
    out.into_iter()
        .map(|(r, (tensors, bytes, staged))| {
            (
                r.to_owned(),
                json!({"tensors": tensors, "bytes": bytes, "staged": staged}),
            )
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// Opens and checks the projector at `path` (one line naming the tensor or
/// key on refusal).
fn open_projector(
    session: &Session,
    path: &Path,
) -> Result<(seam::gguf::GgufModel, Projector), Failure> {
    let gguf = session.open(path).map_err(|e| match &e {
        SessionError::Gguf(g) => Failure(explain_open_error(g).unwrap_or_else(|| e.to_string())),
        _ => Failure(e.to_string()),
    })?;
    let projector =
        Projector::load(&gguf).map_err(|e| Failure(format!("{}: {e}", path_safe(path))))?;
    Ok((gguf, projector))
}

fn run(cli: Cli) -> Result<(), Failure> {
    let inputs: Vec<&Path> = cli
        .file
        .iter()
        .chain(&cli.mmproj)
        .map(|p| p.as_path())
        .collect();
    if let Some(path) = &cli.write_fixture {
        check_output("--write-fixture", path, &inputs)?;
        let n = fixture::write_fixture(path)?;
        eprintln!(
            "muse_glimmer: wrote the built-in fixture to {} ({n} bytes)",
            path.display()
        );
        return Ok(());
    }
    let prompt = parse_tokens(&cli.tokens)?;
    if let Some(dump) = &cli.dump_logits {
        check_output("--dump-logits", dump, &inputs)?;
    }
    let spec = match cli.device.as_deref() {
        Some(text) => seam_devices::parse(text).map_err(Failure)?,
        None => seam_devices::best_present(),
    };
    let env = |name: &str| std::env::var(name).ok();
    let device = seam_devices::open(spec, &env).map_err(Failure)?;
    let (path, _guard) = match cli.file {
        Some(p) => (p, None),
        None => {
            let guard = TempGguf::write(&fixture::fixture(), "muse_glimmer-fixture")?;
            (guard.path().to_path_buf(), Some(guard))
        }
    };
    let session = Session::new(device.platform(), &SessionOptions::default())?;
    let gguf = session.open(&path)?;
    let model =
        MuseGlimmer::load(&gguf).map_err(|e| Failure(format!("{}: {e}", path_safe(&path))))?;
    if let Some(&t) = prompt
        .iter()
        .find(|&&t| t as usize >= model.hparams().n_vocab)
    {
        return Err(Failure(format!(
            "--tokens: token {t} is not below the vocabulary size {}",
            model.hparams().n_vocab
        )));
    }
    let projector = match &cli.mmproj {
        Some(p) => {
            let (g, proj) = open_projector(&session, p)?;
            proj.check_text_width(model.hparams().n_embd)
                .map_err(|e| Failure(format!("{}: {e}", path_safe(p))))?;
            Some((p.clone(), g, proj))
        }
        None => None,
    };
    // Printed once the files are accepted: a bad file gets one line.
    eprintln!("muse_glimmer: {}", session.policy_line());
    let (platform, queue) = (session.platform(), session.queue());

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
    let mut decoder = Decoder::new(&model, platform, queue);
    let decoded = greedy(&mut decoder, &prompt, cli.steps, &mut || {});
    let peaks = sampler.map(|s| s.stop());
    // A file changed under the pass explains a failed one too.
    gguf.check_unchanged()?;
    let (generated, logits) = decoded.map_err(|e| Failure(format!("{}: {e}", path_safe(&path))))?;
    let text_seam = platform.stage_counters().snapshot();
    if let Some(dump) = &cli.dump_logits {
        let last = logits.last().map(Vec::as_slice).unwrap_or_default();
        let bytes: Vec<u8> = last.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(dump, bytes).map_err(|e| Failure(format!("{}: {e}", dump.display())))?;
    }

    let mm_report = match &projector {
        None => serde_json::Value::Null,
        Some((p, g, proj)) => {
            let hp = proj.hparams();
            let side = hp.pos_grid * hp.patch_size * hp.merge;
            let image = Image::synthetic(side, side);
            let staged = proj.stage(platform, queue);
            g.check_unchanged()?;
            let staged = staged.map_err(|e| Failure(format!("{}: {e}", path_safe(p))))?;
            let reader = WeightReader::new(platform, queue);
            let embd = proj.encode(&reader, &image);
            g.check_unchanged()?;
            let embd = embd.map_err(|e| Failure(format!("{}: {e}", path_safe(p))))?;
            let after = platform.stage_counters().snapshot();
            json!({
                "file": p,
                "projector_type": muse_glimmer::mmproj::PROJECTOR_TYPE,
                "hparams": hp,
                "census": proj.census(),
                "routes": routes(proj.manifest(), proj.weights()),
                "staged_at_load": staged,
                "image": [side, side],
                "tokens": embd.len(),
                "token_width": embd.first().map_or(0, Vec::len),
                "seam": {
                    "uploads": after.uploads - text_seam.uploads,
                    "uploaded_bytes": after.uploaded_bytes - text_seam.uploaded_bytes,
                    "releases": after.releases - text_seam.releases,
                    "released_page_bytes": after.released_page_bytes - text_seam.released_page_bytes,
                },
            })
        }
    };
    let seam_counts = platform.stage_counters().snapshot();
    let hp = model.hparams();
    let census = model.census();
    if cli.json {
        let fake = device.fake().map(|p| {
            let c = p.counters();
            json!({"allocs": c.allocs, "frees": c.frees, "copies_completed": c.copies_completed,
                   "releases": c.releases, "device_bytes": c.device_bytes,
                   "peak_device_bytes": c.peak_device_bytes})
        });
        let report = json!({
            "file": path,
            "device": platform.backend().name(),
            "arch": muse_glimmer::ARCH,
            "model": hp,
            "census": census,
            "drop_rules": model.manifest().drop_rules(),
            "routes": routes(model.manifest(), model.weights()),
            "prompt": prompt,
            "steps": cli.steps,
            "generated": generated,
            "weights": {
                "claimed": model.manifest().tensors.len(),
                "staged": model.weights().staged(),
                "kept_dequantized": decoder.reader().kept().0,
            },
            "text_seam": text_seam,
            "mmproj": mm_report,
            "seam": seam_counts,
            "decode_residency": peaks.map(|p| json!({
                "samples": p.samples,
                "rss_anon_start_mib": mib(p.rss_anon_start),
                "rss_anon_peak_mib": mib(p.rss_anon_peak),
                "rss_file_peak_mib": mib(p.rss_file_peak),
                "mapping_rss_peak_mib": mib(p.mapping_rss_peak),
                "mapping_rss_end_mib": mib(p.mapping_rss_end),
            })),
            "policy": session.policy_line(),
            "ring": session.ring_counts(),
            "fake": fake,
        });
        let mut s = serde_json::to_string_pretty(&report)?;
        s.push('\n');
        print(&s);
    } else {
        let mut s = format!(
            "{}: muse-glimmer, {} layers ({} sliding-window), E {}, vocab {}; {} tensors claimed ({:.2} MiB), {} dropped by name\n\
             prompt {prompt:?} -> greedy {generated:?} on {}; seam: {} uploads ({:.2} MiB), {} releases\n",
            path.display(),
            hp.n_layer,
            hp.is_swa.iter().filter(|&&s| s).count(),
            hp.n_embd,
            hp.n_vocab,
            census.claimed_tensors,
            mib(census.claimed_bytes),
            census.dropped.len(),
            platform.backend().name(),
            text_seam.uploads,
            mib(text_seam.uploaded_bytes),
            text_seam.releases,
        );
        if !mm_report.is_null() {
            s.push_str(&format!(
                "projector {}: {} tensors, {} image tokens of {}; seam: {} uploads, {} releases\n",
                mm_report["file"].as_str().unwrap_or(""),
                mm_report["census"]["claimed_tensors"],
                mm_report["tokens"],
                mm_report["token_width"],
                mm_report["seam"]["uploads"],
                mm_report["seam"]["releases"],
            ));
        }
        print(&s);
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // A model truncated under its mapping: one line and exit 2, not SIGBUS.
    if let Err(e) = seam::borrow::fault::exit_on_fault_in_mapped_files("muse_glimmer") {
        eprintln!("muse_glimmer: error: installing the SIGBUS handler: {e}");
        return ExitCode::from(2);
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(msg)) => {
            eprintln!(
                "muse_glimmer: error: {}",
                terminal_safe(&msg.replace('\n', " "))
            );
            ExitCode::from(2)
        }
    }
}
