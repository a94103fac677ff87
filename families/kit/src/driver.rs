//! The one command line every family binary runs: a family's `main.rs` is
//! `family_kit::driver::run_family::<Family>()`.
//!
//! ```text
//! FAMILY [FILE.gguf] [--device host|fake|cuda[:N]|rocm[:N]]
//!        [--tokens 1,2,3 | --prompt TEXT] [--steps N] [--json]
//!        [--dump-logits PATH] [--write-fixture PATH] [--stage picked|all]
//!        [--quiet] [the family's own flags]
//! ```
//!
//! The same flags and defaults for every family: the built-in fixture when
//! no FILE is given (written to a temporary file), the best device present
//! as `seam load` picks it (the first CUDA GPU, else the first ROCm GPU,
//! else the host), the prompt [`DEFAULT_PROMPT`], [`DEFAULT_STEPS`] greedy
//! tokens. What the driver does, in order:
//!
//! 1. parse the flags (a bad flag is one line and exit 2, as every error,
//!    whatever clap refused: `seam_tools::cli::parse_args`), install the
//!    `SIGBUS` handler, parse `--tokens` and `--device` (the sink is
//!    refused here: it keeps no weight to read back, and a decode reads
//!    them);
//! 2. `--write-fixture`: check the path, write the fixture, exit;
//! 3. check `--dump-logits` against the inputs, before any load
//!    (`seam_tools::output::check_output`), and `--stage all` against the
//!    family ([`Family::STAGES_ALL_EXPERTS`]);
//! 4. open the device and a load session; open the family's companion
//!    files and FILE through it; build the model; with `--prompt`, build
//!    the file's tokenizer ([`seam_tokenizer::Tokenizer`]) and tokenize the
//!    text as llama.cpp's generation does (BOS/EOS as the file says,
//!    special tokens written in the text read as tokens); check the prompt
//!    against the vocabulary;
//! 5. print the policy line (only once everything is accepted, so bad input
//!    gets one line; not with `--quiet`), decode greedily
//!    ([`crate::family::decode_with`]) with the residency sampler running,
//!    then `check_unchanged` on every file; with `--prompt` the text streams
//!    to stdout as it decodes (each token flushed; bytes a later token could
//!    change wait for it, [`seam_tokenizer::TextStream`]) and the decode
//!    stops at a token that ends a generation (EOS, EOT...);
//! 6. write `--dump-logits` (the logits of the last position fed, as
//!    little-endian `f32`), run the family's report hook, print the report
//!    (to stderr after a streamed text, which has stdout to itself).
//!
//! The `--json` report has the same top-level keys for every family
//! ([`REPORT_KEYS`]); what only one family reports is under `family`
//! (with the family's `name`). `decode` is a [`DecodeReport`]; the text
//! report gives the tokens/s of the prefill and of the decode.
//!
//! From step 4 on, a bar on stderr (`seam_tools::cli::Progress`) shows the
//! load, then the decode token by token, once the run has taken a second;
//! not where stderr is no terminal, nor with `--quiet`, which also drops
//! every stderr line but errors and warnings.

use std::fmt::Display;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, CommandFactory, Parser};
use seam::gguf::{GgufModel, GgufWriter, Value};
use seam::session::{Session, SessionOptions};
use seam::text::path_safe;
use seam_tools::cli::{Progress, Unit, fail, parse_args};

use crate::FixtureSpec;
use seam_tools::demo::TempGguf;
use seam_tools::output::{check_output, write_whole};
use serde_json::json;

use seam_tokenizer::{TextStream, Tokenizer};

use crate::error::LoadError;
use crate::family::{DecodeReport, Decoder, ExpertStaging, Family, Traffic, decode_with};
use crate::numerics::{CacheType, NumericsFlags, ResolvedNumerics};
use crate::residency::DecodeSampler;

/// The prompt when `--tokens` is not given.
pub const DEFAULT_PROMPT: &str = "1,2,3";

/// Greedy tokens when `--steps` is not given.
pub const DEFAULT_STEPS: usize = 4;

/// The top-level keys of every family binary's `--json` report.
pub const REPORT_KEYS: [&str; 17] = [
    "family",
    "file",
    "device",
    "arch",
    "file_bytes",
    "n_vocab",
    "prompt",
    "prompt_text",
    "text",
    "steps",
    "generated",
    "decode",
    "decode_residency",
    "seam",
    "policy",
    "ring",
    "fake",
];

/// The most layers `--write-generated` writes: past every public
/// checkpoint's (78 at most), and a tensor table the flag cannot blow up.
pub const GENERATED_MAX_LAYERS: u64 = 1024;

/// A failure the user can act on: one line on stderr, exit status 2.
#[derive(Debug)]
pub struct Failure(pub String);

impl<E: Display> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure(e.to_string())
    }
}

/// The flags every family binary takes, then the family's own (`A`).
#[derive(Debug, Parser)]
pub struct Flags<A: Args> {
    /// The GGUF file (the first shard of a split model); the built-in
    /// fixture when absent.
    pub file: Option<PathBuf>,
    /// The device, `host | fake | cuda[:N] | rocm[:N]`; when absent, the
    /// best device present, as `seam load` picks it. Not the sink: it
    /// keeps no weight to read back, and a decode reads them.
    #[arg(
        long,
        help = "host | fake | cuda[:N] | rocm[:N] (default: the best device present, as `seam load` picks it)"
    )]
    pub device: Option<String>,
    /// Prompt token ids, comma-separated.
    #[arg(long, default_value = DEFAULT_PROMPT)]
    pub tokens: String,
    /// Prompt text, tokenized with the file's own tokenizer (BOS as the
    /// file says); the generated text streams to stdout, and the decode
    /// stops at an end-of-generation token.
    #[arg(long, conflicts_with = "tokens")]
    pub prompt: Option<String>,
    /// Tokens to decode greedily.
    #[arg(long, default_value_t = DEFAULT_STEPS, allow_negative_numbers = true)]
    pub steps: usize,
    /// Print the JSON report.
    #[arg(long)]
    pub json: bool,
    /// Write the logits of the last position fed to the model as
    /// little-endian f32 (with `--steps 1`: the prompt's last position).
    #[arg(long, value_name = "PATH")]
    pub dump_logits: Option<PathBuf>,
    /// Write the built-in fixture to PATH and exit.
    #[arg(long, value_name = "PATH")]
    pub write_fixture: Option<PathBuf>,
    /// Write a generated model of the public checkpoint's sizes with
    /// `--layers` layers (gigabytes, streamed) to PATH and exit: the
    /// benchmark's model, for this binary and llama.cpp alike.
    #[arg(long, value_name = "PATH", conflicts_with = "write_fixture")]
    pub write_generated: Option<PathBuf>,
    /// Layers of `--write-generated`.
    #[arg(long, default_value_t = 2, requires = "write_generated")]
    pub layers: u64,
    /// When a mixture-of-experts model's experts are staged: `picked`,
    /// each on its first pick; `all`, every stack whole before the first
    /// token (the picks then stay on the device).
    #[arg(long, default_value = "picked", value_name = "picked|all")]
    pub stage: ExpertStaging,
    /// The K cache's element type (llama.cpp's `--cache-type-k`; else
    /// `VT_CACHE_TYPE_K`, else f16, llama.cpp's default).
    #[arg(long, value_name = "f16|bf16|f32")]
    pub cache_type_k: Option<CacheType>,
    /// The V cache's element type (else `VT_CACHE_TYPE_V`, else f16).
    #[arg(long, value_name = "f16|bf16|f32")]
    pub cache_type_v: Option<CacheType>,
    /// Flash attention (else `VT_FLASH_ATTN`, else off, llama.cpp's
    /// non-flash path).
    #[arg(long, value_name = "on|off", value_parser = parse_on_off)]
    pub flash_attn: Option<bool>,
    /// No progress bar and no line on stderr but errors and warnings (the
    /// policy line too: `--json` still reports the policy).
    #[arg(long, short)]
    pub quiet: bool,
    /// The family's own flags.
    #[command(flatten)]
    pub family: A,
}

/// `on` or `off`.
fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("{s:?} is not on or off")),
    }
}

/// No flags of a family's own.
#[derive(Clone, Copy, Debug, Default, Args)]
pub struct NoFlags {}

/// What a family's binary adds to the driver: its own flags and what they
/// open, check and report. Implemented in the family's library behind its
/// `cli` feature.
pub trait FamilyBinary: Family {
    /// The family's own flags ([`NoFlags`] for none).
    type Flags: Args;

    /// One line for `--help`.
    const ABOUT: &'static str;

    /// Files the family's flags name that the run reads: no output may be
    /// one of them.
    fn inputs(flags: &Self::Flags) -> Vec<&Path> {
        let _ = flags;
        Vec::new()
    }

    /// The model `--write-generated` writes: the public checkpoint's
    /// sizes with `layers` layers, every weight of a type llama.cpp runs
    /// on its GPU path; `None` for a family without one (the flag is then
    /// refused in one line).
    fn generated(layers: u64) -> Option<FixtureSpec> {
        let _ = layers;
        None
    }

    /// Opens and loads the companion through the run's session
    /// ([`Family::Companion`]).
    ///
    /// # Errors
    ///
    /// A companion file is bad (one line naming it).
    fn companion(
        flags: &Self::Flags,
        files: &mut Files<'_, '_>,
    ) -> Result<Self::Companion, Failure>;

    /// Checks the model and its companion together, before the policy
    /// line (muse_glimmer: the projector's width against the model's).
    ///
    /// # Errors
    ///
    /// They do not fit (one line naming the file and the key).
    fn accept(
        flags: &Self::Flags,
        model: &Self::Model<'_>,
        companion: &Self::Companion,
    ) -> Result<(), Failure> {
        let _ = (flags, model, companion);
        Ok(())
    }

    /// The family's part of the report, after the decode: it may run more
    /// passes over its files (each followed by `check_unchanged`).
    ///
    /// # Errors
    ///
    /// A pass failed.
    fn report(
        flags: &Self::Flags,
        run: &Run<'_, '_>,
        model: &Self::Model<'_>,
        companion: &Self::Companion,
        decoder: &Self::Decoder<'_>,
    ) -> Result<FamilyReport, Failure>;
}

/// The files of a run: opened through its session, or built in and
/// written to temporary files that live as long as the run.
pub struct Files<'a, 'p> {
    session: &'a Session<'p>,
    temporary: Vec<TempGguf>,
}

impl<'p> Files<'_, 'p> {
    /// The run's load session.
    pub fn session(&self) -> &Session<'p> {
        self.session
    }

    /// Writes `writer` to a temporary file named after `stem`, removed
    /// when the run ends; returns its path.
    ///
    /// # Errors
    ///
    /// The file could not be written.
    pub fn built_in(&mut self, writer: &GgufWriter, stem: &str) -> Result<PathBuf, Failure> {
        let file = TempGguf::write(writer, stem)?;
        let path = file.path().to_path_buf();
        self.temporary.push(file);
        Ok(path)
    }
}

/// What the decode did, for the family's report hook.
pub struct Run<'a, 'p> {
    /// FILE, or the built-in fixture's temporary file.
    pub path: &'a Path,
    /// FILE opened.
    pub gguf: &'a GgufModel,
    /// The run's load session (its platform and queue).
    pub session: &'a Session<'p>,
    /// The prompt's ids.
    pub prompt: &'a [u32],
    /// The greedy tokens.
    pub generated: &'a [u32],
    /// `--steps`.
    pub steps: usize,
    /// The numerics the greedy pass ran with (its caches' types).
    pub numerics: crate::numerics::Numerics,
}

/// A family's part of the report.
#[derive(Debug, Default)]
pub struct FamilyReport {
    /// Its keys, under `family` in the `--json` report (an object).
    pub json: serde_json::Map<String, serde_json::Value>,
    /// Lines added to the text report (each ending in a newline).
    pub text: String,
    /// A result the run must fail with after printing its report (dflash:
    /// speculation that differs from the target's greedy tokens).
    pub problem: Option<String>,
}

impl FamilyReport {
    /// A part with the keys of `json` (an object, as `json!({...})` makes;
    /// another value is kept under `value`) and the text lines `text`.
    pub fn new(json: serde_json::Value, text: String) -> FamilyReport {
        let json = match json {
            serde_json::Value::Object(map) => map,
            other => serde_json::Map::from_iter([("value".to_owned(), other)]),
        };
        FamilyReport {
            json,
            text,
            problem: None,
        }
    }
}

/// Runs family `F`'s binary: parses the command line, runs, prints; the
/// status to exit with (2 and one stderr line on any failure).
pub fn run_family<F: FamilyBinary>() -> ExitCode {
    let command = Flags::<F::Flags>::command()
        .name(F::NAME)
        .bin_name(F::NAME)
        .about(F::ABOUT);
    let flags: Flags<F::Flags> = match parse_args(command) {
        Ok(flags) => flags,
        Err(status) => return status,
    };
    // A model truncated under its mapping: one line and exit 2, not SIGBUS.
    if let Err(e) = seam::borrow::fault::exit_on_fault_in_mapped_files(F::NAME) {
        return fail(F::NAME, &format!("installing the SIGBUS handler: {e}"));
    }
    match run::<F>(&flags) {
        Ok(None) => ExitCode::SUCCESS,
        Ok(Some(problem)) => fail(F::NAME, &problem),
        Err(Failure(msg)) => fail(F::NAME, &msg),
    }
}

/// Why `--device sink` is refused, up front.
const SINK_REFUSED: &str = "--device sink: the sink keeps no weight to read back, and a decode \
     reads them (`seam load --device sink` measures what a load costs the host)";

/// A decoder that moves the decode's bar, a token per forward call (the
/// prefill gives the first).
struct Ticking<'a> {
    inner: &'a mut dyn Decoder,
    progress: &'a Progress,
    steps: u64,
    tokens: u64,
}

impl Ticking<'_> {
    fn tick(&mut self) {
        self.tokens += 1;
        self.progress.set(self.tokens.min(self.steps), self.steps);
        self.progress.message("");
    }
}

impl Decoder for Ticking<'_> {
    fn prefill(&mut self, tokens: &[u32]) -> Result<Vec<f32>, LoadError> {
        self.progress
            .message(format!("(prefill of {} tokens)", tokens.len()));
        let logits = self.inner.prefill(tokens)?;
        self.tick();
        Ok(logits)
    }
    fn step(&mut self, token: u32) -> Result<Vec<f32>, LoadError> {
        let logits = self.inner.step(token)?;
        self.tick();
        Ok(logits)
    }
    fn traffic(&self) -> Traffic {
        self.inner.traffic()
    }
}

/// The prefill's and the decode's speed in words, `timed_steps` the
/// forward calls after the prefill: `prefill 3 tokens in 0.935 s (3.21
/// tokens/s), decode 3.98 tokens/s (3 steps in 0.754 s)`.
fn speed_text(report: &DecodeReport, timed_steps: usize) -> String {
    let rate = |tokens: f64, seconds: f64| {
        if seconds > 0.0 {
            format!("{:.2} tokens/s", tokens / seconds)
        } else {
            "too fast to time".to_owned()
        }
    };
    let prefill = format!(
        "prefill {} tokens in {:.3} s ({})",
        report.prompt_tokens,
        report.prefill_seconds,
        rate(report.prompt_tokens as f64, report.prefill_seconds)
    );
    let decode = match report.tokens_per_second {
        Some(v) => format!(
            "decode {v:.2} tokens/s ({timed_steps} steps in {:.3} s)",
            report.seconds
        ),
        None => "no step after the prefill to time".to_owned(),
    };
    format!("{prefill}, {decode}")
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

fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1048576.0
}

/// The fake device's counters (`null` on another device).
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

/// Writes generated text as it comes (its bytes need not be UTF-8 on
/// their own) and flushes it.
fn print_bytes(out: &[u8]) {
    if out.is_empty() {
        return;
    }
    let mut stdout = std::io::stdout().lock();
    // A closed pipe is not an error of the input.
    let _ = stdout.write_all(out).and_then(|_| stdout.flush());
}

fn print(out: &str) {
    let mut stdout = std::io::stdout().lock();
    // A closed pipe is not an error of the input.
    let _ = stdout
        .write_all(out.as_bytes())
        .and_then(|_| stdout.flush());
}

/// Runs the binary; `Some(problem)` when the report is printed but the run
/// fails all the same.
fn run<F: FamilyBinary>(flags: &Flags<F::Flags>) -> Result<Option<String>, Failure> {
    let ids = match flags.prompt {
        Some(_) => None,
        None => Some(parse_tokens(&flags.tokens)?),
    };
    let spec = match flags.device.as_deref() {
        Some(text) => seam_devices::parse(text).map_err(Failure)?,
        None => seam_devices::best_present(),
    };
    if spec == seam_devices::DeviceSpec::Sink {
        return Err(Failure(SINK_REFUSED.into()));
    }
    let quiet = flags.quiet;
    let inputs: Vec<&Path> = flags
        .file
        .iter()
        .map(PathBuf::as_path)
        .chain(F::inputs(&flags.family))
        .collect();
    if let Some(path) = &flags.write_fixture {
        check_output("--write-fixture", path, &inputs)?;
        let n = write_whole("--write-fixture", path, |p| F::fixture().write_file(p))?;
        if !quiet {
            eprintln!(
                "{}: wrote the built-in fixture to {} ({n} bytes)",
                F::NAME,
                path.display()
            );
        }
        return Ok(None);
    }
    if let Some(path) = &flags.write_generated {
        check_output("--write-generated", path, &inputs)?;
        if flags.layers == 0 {
            return Err(Failure("--layers: a generated model needs a layer".into()));
        }
        if flags.layers > GENERATED_MAX_LAYERS {
            return Err(Failure(format!(
                "--layers {}: a generated model has at most {GENERATED_MAX_LAYERS} layers",
                flags.layers
            )));
        }
        let spec = F::generated(flags.layers).ok_or_else(|| {
            Failure(format!(
                "--write-generated: {} has no generated model of its public checkpoint",
                F::NAME
            ))
        })?;
        let writer = spec.without_vocabulary().streaming_writer()?;
        let n = write_whole("--write-generated", path, |p| writer.write_file(p))?;
        if !quiet {
            eprintln!(
                "{}: wrote a generated model ({} layers) to {} ({n} bytes)",
                F::NAME,
                flags.layers,
                path.display()
            );
        }
        return Ok(None);
    }
    if let Some(dump) = &flags.dump_logits {
        check_output("--dump-logits", dump, &inputs)?;
    }
    if flags.stage == ExpertStaging::All && !F::STAGES_ALL_EXPERTS {
        return Err(Failure(format!(
            "--stage all: {} stages experts on their first pick only",
            F::NAME
        )));
    }
    // A spinner while the device opens, the files are mapped and checked
    // and the decoder is built (with `--stage all`, every weight staged).
    let progress = Progress::start("load", Unit::Tokens, quiet)?;
    let env = |name: &str| std::env::var(name).ok();
    let numerics = ResolvedNumerics::resolve(
        NumericsFlags {
            cache_type_k: flags.cache_type_k,
            cache_type_v: flags.cache_type_v,
            flash_attn: flags.flash_attn,
        },
        &env,
    )?;
    let device = seam_devices::open(spec, &env).map_err(Failure)?;
    let session = Session::new(device.platform(), &SessionOptions::default())?;
    let mmap = session.policy().mmap;
    if let Some(why) = F::MMAP_REQUIRED
        && !mmap.value.0
    {
        return Err(Failure(format!(
            "mmap=off ({}) is not supported: {} {why}",
            mmap.source,
            F::NAME
        )));
    }
    let mut files = Files {
        session: &session,
        temporary: Vec::new(),
    };
    let companion = F::companion(&flags.family, &mut files)?;
    let (path, built_in) = match &flags.file {
        Some(p) => (p.clone(), false),
        None => (
            files.built_in(&F::fixture(), &format!("{}-fixture", F::NAME))?,
            true,
        ),
    };
    let gguf = session.open(&path)?;
    let named = |e: &dyn Display| Failure(format!("{}: {e}", path_safe(&path)));
    let model = F::load(&gguf, &companion).map_err(|e| named(&e))?;
    let n_vocab = F::n_vocab(&model);
    let (tokenizer, prompt, flag) = match (&flags.prompt, ids) {
        (Some(text), _) => {
            let tokenizer = Tokenizer::from_gguf(&gguf)?;
            let ids = tokenizer
                .encode(text, true, true)
                .map_err(|e| Failure(format!("--prompt: {e}")))?;
            if ids.is_empty() {
                return Err(Failure("--prompt: the text gives no tokens".into()));
            }
            (Some(tokenizer), ids, "--prompt")
        }
        (None, ids) => (None, ids.unwrap_or_default(), "--tokens"),
    };
    if let Some(&t) = prompt.iter().find(|&&t| t as usize >= n_vocab) {
        return Err(Failure(format!(
            "{flag}: token {t} is not below the vocabulary size {n_vocab}"
        )));
    }
    F::accept(&flags.family, &model, &companion)?;
    let (platform, queue) = (session.platform(), session.queue());
    // The device's op layer where it has one (the family's device path);
    // a device whose kernels cannot be built decodes on the host path and
    // says so.
    let stage_all = flags.stage == ExpertStaging::All;
    let mut decoder = match device.ops(queue) {
        Some(Ok(ops)) => F::device_decoder(
            &model,
            &gguf,
            platform,
            queue,
            ops,
            flags.stage,
            numerics.numerics(),
        ),
        Some(Err(why)) if stage_all => {
            return Err(Failure(format!(
                "--stage all needs the device op layer, and {} has none ({why})",
                platform.backend().name()
            )));
        }
        Some(Err(why)) => {
            progress.suspend(|| {
                eprintln!(
                    "{}: no device op layer ({why}); decoding on the host path",
                    F::NAME
                );
            });
            F::decoder(&model, &gguf, platform, queue, numerics.numerics())
        }
        None if stage_all => {
            return Err(Failure(format!(
                "--stage all needs a device op layer, and {} has none (the host path stages experts on their first pick)",
                platform.backend().name()
            )));
        }
        None => F::decoder(&model, &gguf, platform, queue, numerics.numerics()),
    }
    .map_err(|e| named(&e))?;
    // Printed once everything is accepted: bad input gets one line.
    let policy_line = format!("{}; {}", session.policy_line(), numerics.summary_line());
    if !quiet {
        progress.suspend(|| {
            if built_in {
                eprintln!(
                    "{}: no FILE given; using the built-in fixture {}",
                    F::NAME,
                    path.display()
                );
            }
            eprintln!("{}: {policy_line}", F::NAME);
        });
    }

    // Any byte of the mapping: the sampler reads that mapping's Rss.
    let mapping = gguf
        .tensors()
        .first()
        .map(|t| gguf.tensor_borrow(t))
        .transpose()?;
    let sampler = mapping
        .as_ref()
        .map(|b| DecodeSampler::start(b.bytes().as_ptr(), Duration::from_millis(5)));
    progress.phase("decode", Unit::Tokens);
    progress.set(0, flags.steps as u64);
    let mut ticking = Ticking {
        inner: &mut decoder,
        progress: &progress,
        steps: flags.steps as u64,
        tokens: 0,
    };
    // With --prompt: each token's text as it becomes final, on stdout
    // unless the report is JSON (through the bar, which shares a
    // terminal); the decode stops at an end of generation.
    let streams = tokenizer.is_some() && !flags.json;
    let mut stream = tokenizer.as_ref().map(TextStream::new);
    let mut stream_error = None;
    let decoded = decode_with(&mut ticking, platform, &prompt, flags.steps, &mut |id| {
        let (Some(tok), Some(stream)) = (&tokenizer, stream.as_mut()) else {
            return true;
        };
        match stream.push(id) {
            Ok(bytes) if streams => progress.suspend(|| print_bytes(&bytes)),
            Ok(_) => {}
            Err(e) => {
                stream_error = Some(Failure(format!("the generated text: {e}")));
                return false;
            }
        }
        !tok.is_eog(id)
    });
    // Cleared before anything reaches a terminal it may share.
    progress.finish();
    let peaks = sampler.map(DecodeSampler::stop);
    // A file changed under the pass explains a failed one too.
    gguf.check_unchanged()?;
    for file in F::companion_files(&companion) {
        file.check_unchanged()?;
    }
    let decoded = decoded.map_err(|e| named(&e))?;
    if let Some(e) = stream_error {
        return Err(e);
    }
    if let Some(stream) = stream.as_mut()
        && streams
    {
        let mut rest = stream.finish()?;
        rest.push(b'\n');
        print_bytes(&rest);
    }
    let text = match &tokenizer {
        Some(tok) => Some(
            String::from_utf8_lossy(&tok.decode(&decoded.generated, false, false)?).into_owned(),
        ),
        None => None,
    };
    if let Some(dump) = &flags.dump_logits {
        let bytes: Vec<u8> = decoded
            .logits
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        std::fs::write(dump, bytes).map_err(|e| Failure(format!("{}: {e}", dump.display())))?;
    }

    let run = Run {
        path: &path,
        gguf: &gguf,
        session: &session,
        prompt: &prompt,
        generated: &decoded.generated,
        steps: flags.steps,
        numerics: numerics.numerics(),
    };
    let family = F::report(&flags.family, &run, &model, &companion, &decoder)?;
    let seam_counts = platform.stage_counters().snapshot();
    let mut report = DecodeReport::new(&decoded, prompt.len(), flags.steps);
    report.stage = flags.stage;
    let device_name = device.platform().backend().name();
    let out = if flags.json {
        let mut family_json = serde_json::Map::new();
        family_json.insert("name".into(), F::NAME.into());
        family_json.extend(family.json);
        let arch = match gguf.metadata("general.architecture") {
            Some(Value::String(a)) => Some(a.clone()),
            _ => None,
        };
        let report = json!({
            "family": family_json,
            "file": path,
            "device": device_name,
            "arch": arch,
            "file_bytes": gguf.total_tensor_bytes(),
            "n_vocab": n_vocab,
            "prompt": prompt,
            "prompt_text": flags.prompt,
            "text": text,
            "steps": flags.steps,
            "generated": decoded.generated,
            "decode": report,
            "decode_residency": peaks.map(|p| json!({
                "samples": p.samples,
                "rss_anon_start_mib": mib(p.rss_anon_start),
                "rss_anon_peak_mib": mib(p.rss_anon_peak),
                "rss_file_peak_mib": mib(p.rss_file_peak),
                "mapping_rss_peak_mib": mib(p.mapping_rss_peak),
                "mapping_rss_end_mib": mib(p.mapping_rss_end),
            })),
            "seam": seam_counts,
            "policy": policy_line,
            "ring": session.ring_counts(),
            "fake": fake_counters(&device),
        });
        let mut s = serde_json::to_string_pretty(&report)?;
        s.push('\n');
        s
    } else {
        format!(
            "{}: {}: prompt {prompt:?} -> greedy {:?} ({} tokens generated) on {device_name}; \
             {}; seam: {} uploads ({:.1} MiB), {} releases\n{}",
            path.display(),
            F::NAME,
            decoded.generated,
            report.generated_tokens,
            speed_text(&report, decoded.calls.len().saturating_sub(1)),
            seam_counts.uploads,
            mib(seam_counts.uploaded_bytes),
            seam_counts.releases,
            family.text,
        )
    };
    if streams {
        // stdout holds the generated text.
        eprint!("{out}");
    } else {
        print(&out);
    }
    Ok(family.problem)
}

#[cfg(test)]
mod tests {
    use clap::FromArgMatches;

    use super::*;

    #[test]
    fn a_family_part_keeps_its_keys_and_never_drops_a_value() {
        let part = FamilyReport::new(json!({"a": 1, "b": [2]}), "t\n".into());
        assert_eq!(part.json.get("a"), Some(&json!(1)));
        assert_eq!(part.json.len(), 2);
        assert_eq!((part.text.as_str(), part.problem), ("t\n", None));
        let part = FamilyReport::new(json!([1]), String::new());
        assert_eq!(part.json.get("value"), Some(&json!([1])));
    }

    #[test]
    fn tokens_parse_or_name_the_flag_and_the_form() {
        assert_eq!(parse_tokens(" 1, 2,3").unwrap(), [1, 2, 3]);
        for bad in ["", "1,x", "1,,2", "-1", "4294967296"] {
            let Failure(e) = parse_tokens(bad).unwrap_err();
            assert!(
                e.starts_with(&format!("--tokens {bad:?}: expected comma-separated")),
                "{e}"
            );
        }
    }

    #[test]
    fn the_speed_text_gives_the_prefill_and_the_decode_rates() {
        let run = crate::family::GreedyRun {
            generated: vec![1, 2, 3],
            logits: vec![],
            calls: [0.5, 0.25, 0.25]
                .map(|seconds| crate::family::Call {
                    seconds,
                    traffic: Traffic::default(),
                    uploads: 0,
                })
                .to_vec(),
        };
        assert_eq!(
            speed_text(&DecodeReport::new(&run, 4, 3), 2),
            "prefill 4 tokens in 0.500 s (8.00 tokens/s), decode 4.00 tokens/s (2 steps in 0.500 s)"
        );
        let run = crate::family::GreedyRun {
            calls: run.calls[..1].to_vec(),
            ..run
        };
        assert_eq!(
            speed_text(&DecodeReport::new(&run, 4, 1), 0),
            "prefill 4 tokens in 0.500 s (8.00 tokens/s), no step after the prefill to time"
        );
    }

    #[test]
    fn a_bad_flag_is_one_line_without_clap_prefix() {
        let parse = |args: &[&str]| {
            Flags::<NoFlags>::command()
                .name("fam")
                .try_get_matches_from(std::iter::once("fam").chain(args.iter().copied()))
                .and_then(|m| Flags::<NoFlags>::from_arg_matches(&m))
        };
        let f = parse(&[]).unwrap();
        assert_eq!(
            (f.tokens.as_str(), f.steps),
            (DEFAULT_PROMPT, DEFAULT_STEPS)
        );
        assert!(f.device.is_none() && f.file.is_none() && !f.json);
        for (args, says) in [
            (
                &["--steps", "-1"][..],
                "invalid value '-1' for '--steps <STEPS>'",
            ),
            (&["--bogus"][..], "unexpected argument '--bogus'"),
        ] {
            let line = seam_tools::cli::usage_error_line(&parse(args).unwrap_err());
            assert!(line.starts_with(says), "{line}");
            assert!(!line.contains('\n') && !line.contains('\x1b'), "{line:?}");
        }
    }
}
