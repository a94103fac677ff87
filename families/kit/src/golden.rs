//! Reading llama.cpp's goldens (`tests/data/<family>/*.golden.json`: the
//! prompt, the greedy tokens, a row of logits per position) in the
//! families' golden tests, one home for what each of them parsed alike.
//!
//! Two kinds:
//!
//! - a golden of a committed model (`NAME.gguf` beside `NAME.golden.json`,
//!   read with [`read`], [`logit_rows`], [`token_ids`]);
//! - a golden of a *generated* model ([`Generated`], format
//!   `seam-generated-golden-1`): the model is not committed but made
//!   again from its [`Recipe`] (a committed model's metadata and tensor
//!   table, the types llama-quantize chose for a file type, this
//!   project's pseudo-random values of a seed and a gain), its sha256
//!   checked against the one llama.cpp ran; the logits of each of
//!   llama.cpp's runs ([`Run`]: cache types, batched or one token at a
//!   time) are little-endian f32 in a sidecar file. A quantized file costs
//!   the repository its logits only (`tools/oracle/generated_goldens.py`
//!   writes them).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use seam::borrow::MapOptions;
use seam::gguf::{GgmlType, GgufModel};
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::fixture::{BlockScales, FixtureSpec};
use crate::numerics::{CacheType, Numerics};

/// The golden at `path`, parsed. Python's `json.dump` writes `-Infinity`,
/// `Infinity` and `NaN` (in the metadata echo, for keys such as
/// `qwen4exp.kda.gate_lower_bound`), which JSON does not have: they are
/// read as `null`.
///
/// # Errors
///
/// The file cannot be read or is not JSON after that.
pub fn read(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .replace(": -Infinity", ": null")
        .replace(": Infinity", ": null")
        .replace(": NaN", ": null");
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// The rows of logits under a golden's key (`prefill_logits`,
/// `step_logits`, ...): an array of arrays of numbers.
///
/// # Errors
///
/// The value is not an array of arrays of numbers.
pub fn logit_rows(v: &Value) -> Result<Vec<Vec<f64>>, String> {
    let rows = v.as_array().ok_or("logit rows: not an array")?;
    rows.iter()
        .enumerate()
        .map(|(i, row)| {
            row.as_array()
                .ok_or(format!("logit row {i}: not an array"))?
                .iter()
                .map(|x| {
                    x.as_f64()
                        .ok_or(format!("logit row {i}: not a number: {x}"))
                })
                .collect()
        })
        .collect()
}

/// Token ids under a golden's key (`prompt`, `greedy`).
///
/// # Errors
///
/// The value is not an array of integers that fit `u32`.
pub fn token_ids(v: &Value) -> Result<Vec<u32>, String> {
    v.as_array()
        .ok_or("tokens: not an array")?
        .iter()
        .map(|t| {
            t.as_u64()
                .and_then(|t| u32::try_from(t).ok())
                .ok_or(format!("tokens: not a u32: {t}"))
        })
        .collect()
}

/// The largest absolute difference between our logits and a golden row;
/// infinite when the lengths differ (no tolerance passes it).
pub fn max_abs_diff(ours: &[f32], golden: &[f64]) -> f64 {
    if ours.len() != golden.len() {
        return f64::INFINITY;
    }
    ours.iter()
        .zip(golden)
        .map(|(&x, &y)| (f64::from(x) - y).abs())
        .fold(0.0, f64::max)
}

/// The largest difference of two rows of logits: 0 only where every bit
/// is the same (a device path held to its host path bit for bit), else at
/// least the smallest positive `f64` (so `-0.0` against `0.0` still
/// counts); infinite where a NaN meets anything of other bits or the
/// rows' lengths differ.
pub fn max_bit_diff(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    a.iter().zip(b).fold(0.0, |m, (&x, &y)| {
        if x.to_bits() == y.to_bits() {
            return m;
        }
        let d = (f64::from(x) - f64::from(y)).abs();
        m.max(if d.is_nan() {
            f64::INFINITY
        } else {
            d.max(f64::MIN_POSITIVE)
        })
    })
}

/// The largest differences of one of llama.cpp's paths over a committed
/// golden ([`check_path`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PathFigures {
    /// Over the prompt's positions.
    pub prompt: f64,
    /// Over the greedy steps (for the one-token path, from the second:
    /// llama.cpp ran its steps after its batched prompt, whose cache the
    /// one-token path does not share).
    pub steps: f64,
}

/// Checks one of llama.cpp's two paths over a committed golden (a
/// `prompt`, its `greedy` tokens, `prefill_logits` of the batched prompt,
/// `incremental.logits` of the prompt fed one token at a time,
/// `step_logits` after each greedy token): `prompt_rows` (ours, batched or
/// not as `batched` says) against the path's logits, then the greedy
/// tokens, each the argmax of the row before, fed by `step`, against
/// `step_logits` (row 0 is the prompt's last position). Every row within
/// `tol` and every greedy choice the golden's.
///
/// # Errors
///
/// A row past `tol` (named), another greedy token, a missing key, or
/// `step` failing.
pub fn check_path(
    golden: &Value,
    batched: bool,
    prompt_rows: &[Vec<f32>],
    step: &mut dyn FnMut(u32) -> Result<Vec<f32>, String>,
    tol: f64,
) -> Result<PathFigures, String> {
    let path = if batched { "batched" } else { "one-token" };
    let want = if batched {
        logit_rows(&golden["prefill_logits"])?
    } else {
        logit_rows(&golden["incremental"]["logits"])?
    };
    check_rows(
        golden,
        path,
        prompt_rows,
        &want,
        usize::from(!batched),
        step,
        tol,
    )
}

/// [`check_path`]'s batched path for a decoder that gives only the
/// prompt's last position's logits (a device's prefill): `last` against
/// the last row of `prefill_logits`, then the greedy steps as there (their
/// figure without row 0, the prompt's own).
///
/// # Errors
///
/// As [`check_path`].
pub fn check_batched_last(
    golden: &Value,
    last: &[f32],
    step: &mut dyn FnMut(u32) -> Result<Vec<f32>, String>,
    tol: f64,
) -> Result<PathFigures, String> {
    let mut want = logit_rows(&golden["prefill_logits"])?;
    let want_last = want.pop().ok_or("prefill_logits: no rows")?;
    check_rows(
        golden,
        "batched",
        &[last.to_vec()],
        &[want_last],
        1,
        step,
        tol,
    )
}

/// The prompt's rows (`ours` against `want`), then the greedy steps from
/// the last of them against `step_logits` from row `from`: what
/// [`check_path`] and [`check_batched_last`] check.
fn check_rows(
    golden: &Value,
    path: &str,
    prompt_rows: &[Vec<f32>],
    want: &[Vec<f64>],
    from: usize,
    step: &mut dyn FnMut(u32) -> Result<Vec<f32>, String>,
    tol: f64,
) -> Result<PathFigures, String> {
    let greedy = token_ids(&golden["greedy"])?;
    let steps = logit_rows(&golden["step_logits"])?;
    let worst = |what: &str, ours: &[Vec<f32>], want: &[Vec<f64>]| {
        if ours.len() != want.len() {
            return Err(format!(
                "{path} {what}: {} rows, not {}",
                ours.len(),
                want.len()
            ));
        }
        let mut worst = 0.0f64;
        for (i, (o, w)) in ours.iter().zip(want).enumerate() {
            let d = max_abs_diff(o, w);
            if d.is_nan() || d > tol {
                return Err(format!(
                    "{path} {what}: row {i}: max |diff| {d:e} > {tol:e}"
                ));
            }
            worst = worst.max(d);
        }
        Ok(worst)
    };
    let prompt = worst("prompt", prompt_rows, want)?;
    let mut ours = vec![prompt_rows.last().ok_or("an empty prompt")?.clone()];
    for i in 0..greedy.len() {
        let next = family_ops::argmax(&ours[i]) as u32;
        if next != greedy[i] {
            return Err(format!(
                "{path}: greedy token {i} is {next}, llama.cpp's {}",
                greedy[i]
            ));
        }
        if i + 1 < greedy.len() {
            ours.push(step(next)?);
        }
    }
    let from = from.min(ours.len());
    let steps = worst("steps", &ours[from..], steps.get(from..).unwrap_or(&[]))?;
    Ok(PathFigures { prompt, steps })
}

/// The format a generated golden names itself with.
pub const GENERATED_FORMAT: &str = "seam-generated-golden-1";

/// How a generated golden's model is made.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Recipe {
    /// The committed model (a file name beside the golden) whose metadata
    /// and tensor table the model has.
    pub base: String,
    /// The pseudo-random values' seed ([`FixtureSpec::seed`]).
    pub seed: u64,
    /// The quantized blocks' RMS is `gain/sqrt(ne0)` ([`BlockScales::FanIn`]).
    pub gain: u16,
    /// The file type llama-quantize was asked for (for the record; `types`
    /// is what it chose).
    pub file_type: String,
    /// Each tensor's type as llama-quantize chose it; a tensor not named
    /// keeps the base's.
    pub types: BTreeMap<String, String>,
}

impl Recipe {
    /// The model's fixture, its base read from `dir`.
    ///
    /// # Errors
    ///
    /// The base cannot be opened, or a type or tensor of the recipe is not
    /// one of the base's.
    pub fn spec(&self, dir: &Path) -> Result<FixtureSpec, String> {
        let base = dir.join(&self.base);
        let gguf = GgufModel::open(&base, MapOptions::default())
            .map_err(|e| format!("{}: {e}", base.display()))?;
        let mut spec = FixtureSpec::from_header(gguf.header());
        let types = self
            .types
            .iter()
            .map(|(name, ty)| {
                GgmlType::from_name(ty)
                    .map(|t| (name.as_str(), t))
                    .ok_or_else(|| format!("{name}: unknown ggml type {ty:?}"))
            })
            .collect::<Result<Vec<_>, String>>()?;
        spec.retype(types)?;
        spec.seed = self.seed;
        spec.block_scales = BlockScales::FanIn { gain: self.gain };
        Ok(spec)
    }
}

/// One of llama.cpp's runs over a generated golden's model.
#[derive(Clone, Debug, PartialEq)]
pub struct Run {
    /// Its cache types and attention ([`Numerics`]).
    pub numerics: Numerics,
    /// The prompt fed as one batch (llama.cpp's batched prefill, every
    /// position's logits at once), else one token per decode call.
    pub batched: bool,
    /// The greedy tokens after the prompt.
    pub greedy: Vec<u32>,
    /// The logits of every prompt position, then of each greedy token but
    /// the last fed after it.
    pub logits: Vec<Vec<f32>>,
}

impl Run {
    /// `batched` or `one-token`, and the cache types: how a report names
    /// this run.
    pub fn label(&self) -> String {
        format!(
            "{} k={} v={}{}",
            if self.batched { "batched" } else { "one-token" },
            self.numerics.cache_type_k,
            self.numerics.cache_type_v,
            if self.numerics.flash_attn { " fa" } else { "" }
        )
    }

    /// Compares `ours` (rows as [`Run::logits`] lays them out) with this
    /// run: the largest absolute difference and its row, and whether each
    /// step's greedy choice (the argmax of the row that predicts it) is
    /// llama.cpp's.
    pub fn compare(&self, ours: &[Vec<f32>], n_prompt: usize) -> Comparison {
        let mut worst = (0.0f64, 0usize);
        for (i, (o, g)) in ours.iter().zip(&self.logits).enumerate() {
            let golden: Vec<f64> = g.iter().map(|&x| f64::from(x)).collect();
            let d = max_abs_diff(o, &golden);
            if d > worst.0 || d.is_nan() {
                worst = (d, i);
            }
        }
        if ours.len() != self.logits.len() {
            worst = (f64::INFINITY, ours.len().min(self.logits.len()));
        }
        let greedy_equal = self.greedy.iter().enumerate().all(|(i, &t)| {
            ours.get(n_prompt - 1 + i)
                .is_some_and(|row| family_ops::argmax(row) == t as usize)
        });
        Comparison {
            max_abs_diff: worst.0,
            worst_row: worst.1,
            greedy_equal,
        }
    }
}

/// How a decoder's logits compare with a [`Run`]'s.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Comparison {
    /// The largest absolute difference over every row (infinite when the
    /// row counts differ).
    pub max_abs_diff: f64,
    /// The row where it is.
    pub worst_row: usize,
    /// Whether every greedy choice is llama.cpp's.
    pub greedy_equal: bool,
}

/// A golden of a generated model ([`GENERATED_FORMAT`]).
#[derive(Clone, Debug)]
pub struct Generated {
    /// The golden's path.
    pub path: PathBuf,
    /// How its model is made.
    pub recipe: Recipe,
    /// The sha256 of the model llama.cpp ran (hex).
    pub sha256: String,
    /// The prompt.
    pub prompt: Vec<u32>,
    /// llama.cpp's runs.
    pub runs: Vec<Run>,
}

#[derive(Deserialize)]
struct GeneratedJson {
    format: String,
    recipe: Recipe,
    model: ModelJson,
    prompt: Vec<u32>,
    logits_file: String,
    runs: Vec<RunJson>,
}

#[derive(Deserialize)]
struct ModelJson {
    sha256: String,
    n_vocab: usize,
}

#[derive(Deserialize)]
struct RunJson {
    cache_type_k: String,
    cache_type_v: String,
    flash_attn: bool,
    batched: bool,
    greedy: Vec<u32>,
    /// The first row's index in the logits file.
    row_offset: usize,
    rows: usize,
}

impl Generated {
    /// Reads the generated golden at `path` and its logits.
    ///
    /// # Errors
    ///
    /// The golden or its logits cannot be read, or they do not fit
    /// together (format, row counts, a cache type).
    pub fn read(path: &Path) -> Result<Generated, String> {
        let at = |e: String| format!("{}: {e}", path.display());
        let text = std::fs::read_to_string(path).map_err(|e| at(e.to_string()))?;
        let g: GeneratedJson = serde_json::from_str(&text).map_err(|e| at(e.to_string()))?;
        if g.format != GENERATED_FORMAT {
            return Err(at(format!("format {:?}, not {GENERATED_FORMAT}", g.format)));
        }
        let dir = path.parent().unwrap_or(Path::new("."));
        let raw = std::fs::read(dir.join(&g.logits_file))
            .map_err(|e| at(format!("{}: {e}", g.logits_file)))?;
        let n = g.model.n_vocab;
        if n == 0 || raw.len() % (4 * n) != 0 {
            return Err(at(format!(
                "{} holds {} bytes, not whole rows of {n} f32",
                g.logits_file,
                raw.len()
            )));
        }
        let rows: Vec<Vec<f32>> = raw
            .chunks_exact(4 * n)
            .map(|row| {
                row.chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect()
            })
            .collect();
        let runs = g
            .runs
            .into_iter()
            .map(|r| {
                let cache = |t: &str| t.parse::<CacheType>().map_err(&at);
                let logits = rows
                    .get(r.row_offset..r.row_offset.saturating_add(r.rows))
                    .ok_or_else(|| at(format!("rows {}+{} past the file", r.row_offset, r.rows)))?
                    .to_vec();
                if r.rows != g.prompt.len() + r.greedy.len().saturating_sub(1) {
                    return Err(at(format!(
                        "a run of {} rows for a prompt of {} and {} steps",
                        r.rows,
                        g.prompt.len(),
                        r.greedy.len()
                    )));
                }
                Ok(Run {
                    numerics: Numerics {
                        cache_type_k: cache(&r.cache_type_k)?,
                        cache_type_v: cache(&r.cache_type_v)?,
                        flash_attn: r.flash_attn,
                    },
                    batched: r.batched,
                    greedy: r.greedy,
                    logits,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Generated {
            path: path.to_path_buf(),
            recipe: g.recipe,
            sha256: g.model.sha256,
            prompt: g.prompt,
            runs,
        })
    }

    /// Every generated golden in `dir` (`*.golden.json` of this format),
    /// by name.
    ///
    /// # Errors
    ///
    /// The folder cannot be listed, or a golden of this format cannot be
    /// read.
    pub fn all_in(dir: &Path) -> Result<Vec<Generated>, String> {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.to_string_lossy().ends_with(".golden.json"))
            .collect();
        paths.sort();
        let mut out = Vec::new();
        for p in paths {
            let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
            if text.contains(GENERATED_FORMAT) {
                out.push(Generated::read(&p)?);
            }
        }
        Ok(out)
    }

    /// The golden's name (its file name without `.golden.json`).
    pub fn name(&self) -> String {
        let f = self
            .path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned());
        f.unwrap_or_default()
            .trim_end_matches(".golden.json")
            .to_owned()
    }

    /// Writes the model to `out` and checks it is the file llama.cpp ran.
    ///
    /// # Errors
    ///
    /// The recipe cannot be followed, the file cannot be written, or its
    /// sha256 is not the golden's.
    pub fn write_model(&self, out: &Path) -> Result<(), String> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let spec = self.recipe.spec(dir)?;
        let bytes = spec.writer().to_bytes();
        let got = sha256_hex(&bytes);
        if got != self.sha256 {
            return Err(format!(
                "{}: the model made from the recipe has sha256 {got}, llama.cpp ran {}",
                self.path.display(),
                self.sha256
            ));
        }
        std::fs::write(out, bytes).map_err(|e| format!("{}: {e}", out.display()))
    }
}

/// The outcome of one [`Run`] of one generated golden
/// ([`check_generated`]).
#[derive(Clone, Debug)]
pub struct RunOutcome {
    /// The golden's name.
    pub golden: String,
    /// The run's [`Run::label`].
    pub run: String,
    /// How the logits compare, or why the run could not be made.
    pub result: Result<Comparison, String>,
}

impl RunOutcome {
    /// Whether every row is within `tol` and every greedy choice is
    /// llama.cpp's.
    pub fn passes(&self, tol: f64) -> bool {
        matches!(&self.result, Ok(c) if c.max_abs_diff <= tol && c.greedy_equal)
    }
}

impl std::fmt::Display for RunOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.result {
            Ok(c) => write!(
                f,
                "{} {}: max |diff| {:.3e} at row {}{}",
                self.golden,
                self.run,
                c.max_abs_diff,
                c.worst_row,
                if c.greedy_equal {
                    ""
                } else {
                    ", greedy differs"
                }
            ),
            Err(e) => write!(f, "{} {}: {e}", self.golden, self.run),
        }
    }
}

/// The outcomes of [`check_generated`] as a report, one line each (with
/// `note`'s words where it has some), and the lines of those past `tol` or
/// with another greedy choice that `note` does not excuse.
pub fn report(
    outcomes: &[RunOutcome],
    tol: f64,
    note: &dyn Fn(&RunOutcome) -> Option<String>,
) -> (String, Vec<String>) {
    let mut text = String::new();
    let mut failed = Vec::new();
    for o in outcomes {
        let n = note(o);
        text.push_str(&format!(
            "{o}{}\n",
            n.as_deref().map_or(String::new(), |n| format!(" ({n})"))
        ));
        if !o.passes(tol) && n.is_none() {
            failed.push(o.to_string());
        }
    }
    (text, failed)
}

/// What decodes a [`Run`]: the model's path, the prompt and the run, to
/// the rows [`Run::logits`] lays out.
pub type RunDecoder<'a> = dyn Fn(&Path, &[u32], &Run) -> Result<Vec<Vec<f32>>, String> + 'a;

/// Every run of every generated golden in `dir`, decoded by `decode`:
/// each golden's model is written to a temporary folder (its sha256
/// checked), then `decode(model, prompt, run)` returns the rows
/// [`Run::logits`] lays out (the prompt batched or one token at a time as
/// the run says, then each greedy token but the last, with the run's
/// [`Numerics`]).
///
/// # Errors
///
/// The folder or a golden cannot be read, or a model cannot be made.
pub fn check_generated(dir: &Path, decode: &RunDecoder<'_>) -> Result<Vec<RunOutcome>, String> {
    let mut out = Vec::new();
    with_each_model(dir, &mut |g, model| {
        for run in &g.runs {
            out.push(RunOutcome {
                golden: g.name(),
                run: run.label(),
                result: decode(model, &g.prompt, run)
                    .map(|rows| run.compare(&rows, g.prompt.len())),
            });
        }
        Ok(())
    })?;
    Ok(out)
}

/// Calls `f` with every generated golden in `dir` and its model, written
/// to a temporary file from the golden's recipe (sha256 checked) and
/// removed after; returns how many goldens there were.
///
/// # Errors
///
/// The folder or a golden cannot be read, a model cannot be made, or `f`
/// failed.
pub fn with_each_model(
    dir: &Path,
    f: &mut dyn FnMut(&Generated, &Path) -> Result<(), String>,
) -> Result<usize, String> {
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let goldens = Generated::all_in(dir)?;
    for g in &goldens {
        let model = tmp.path().join(format!("{}.gguf", g.name()));
        g.write_model(&model)?;
        f(g, &model)?;
        std::fs::remove_file(&model).map_err(|e| e.to_string())?;
    }
    Ok(goldens.len())
}

/// Why a device run of [`device_runs`] is not compared: the batched runs
/// (a device prefill gives the last position only) and the flash-attention
/// runs (the device paths have none).
pub const NOT_COMPARED: &str = "not compared";

/// The one-token runs of every generated golden in `dir` decoded on a
/// device by `decode` (as [`check_generated`]'s; a device path's decoder
/// fed by [`feed_one_token_run`]), the other runs [`NOT_COMPARED`]. Prints
/// one JSON line per run
/// (the largest difference to llama.cpp's CPU logits, the worst row,
/// whether the greedy choices are llama.cpp's, or why it is not
/// compared), so a script can set it beside llama.cpp's own CUDA build;
/// returns how many runs were compared.
///
/// # Errors
///
/// A golden could not be read, or a run failed for another reason than
/// [`NOT_COMPARED`].
pub fn device_runs(dir: &Path, device: &str, decode: &RunDecoder<'_>) -> Result<usize, String> {
    let outcomes = check_generated(dir, &|path, prompt, run| {
        if run.batched {
            return Err(format!(
                "{NOT_COMPARED} (the device prefill gives its last position)"
            ));
        }
        if run.numerics.flash_attn {
            return Err(format!(
                "{NOT_COMPARED} (the device path has no flash attention)"
            ));
        }
        decode(path, prompt, run)
    })?;
    let mut compared = 0;
    let mut failed = Vec::new();
    for o in &outcomes {
        let line = match &o.result {
            Ok(c) => {
                compared += 1;
                serde_json::json!({"golden": o.golden, "run": o.run, "device": device,
                    "max_abs_diff": c.max_abs_diff, "worst_row": c.worst_row,
                    "greedy_equal": c.greedy_equal})
            }
            Err(e) => {
                if !e.starts_with(NOT_COMPARED) {
                    failed.push(format!("{} {}: {e}", o.golden, o.run));
                }
                serde_json::json!({"golden": o.golden, "run": o.run, "device": device, "error": e})
            }
        };
        println!("{line}");
    }
    if !failed.is_empty() {
        return Err(failed.join("; "));
    }
    Ok(compared)
}

/// The rows of a one-token run ([`Run::logits`]'s layout) from `decoder`:
/// the prompt a token at a time, then each greedy token but the last;
/// refused where a byte of a staged weight came back.
///
/// # Errors
///
/// A step failed, or a weight was read back.
pub fn feed_one_token_run(
    decoder: &mut dyn crate::Decoder,
    prompt: &[u32],
    run: &Run,
) -> Result<Vec<Vec<f32>>, String> {
    let steps = &run.greedy[..run.greedy.len().saturating_sub(1)];
    let rows = prompt
        .iter()
        .chain(steps)
        .map(|&t| decoder.step(t).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    if decoder.traffic().weight_read_back_bytes != 0 {
        return Err("a staged weight was read back".into());
    }
    Ok(rows)
}

/// Lowercase hex of the sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bit_difference_counts_and_a_nan_is_infinitely_far() {
        assert_eq!(max_bit_diff(&[1.0, -0.5], &[1.0, -0.5]), 0.0);
        assert_eq!(max_bit_diff(&[f32::NAN], &[f32::NAN]), 0.0);
        assert_eq!(max_bit_diff(&[1.0, 2.0], &[1.0, 2.5]), 0.5);
        assert_eq!(max_bit_diff(&[0.0], &[-0.0]), f64::MIN_POSITIVE);
        assert_eq!(max_bit_diff(&[1.0], &[f32::NAN]), f64::INFINITY);
        assert_eq!(max_bit_diff(&[f32::NAN], &[-f32::NAN]), f64::INFINITY);
        assert_eq!(max_bit_diff(&[1.0], &[1.0, 2.0]), f64::INFINITY);
    }

    #[test]
    fn rows_tokens_and_differences_are_read_and_bad_values_named() {
        let v: Value = serde_json::json!({"rows": [[1.0, -2.5], [0.5, 3.0]], "tokens": [1, 7]});
        assert_eq!(logit_rows(&v["rows"]).unwrap(), [[1.0, -2.5], [0.5, 3.0]]);
        assert_eq!(token_ids(&v["tokens"]).unwrap(), [1, 7]);
        assert!(
            logit_rows(&serde_json::json!([[1.0, "x"]]))
                .unwrap_err()
                .contains("row 0")
        );
        assert!(logit_rows(&serde_json::json!(3)).is_err());
        assert!(token_ids(&serde_json::json!([-1])).is_err());
        assert!(token_ids(&serde_json::json!([4294967296u64])).is_err());
        assert_eq!(max_abs_diff(&[1.0, 2.0], &[1.5, 1.0]), 1.0);
        assert_eq!(max_abs_diff(&[1.0], &[1.0, 2.0]), f64::INFINITY);
    }

    /// A path is held to its own rows (`incremental` or `prefill_logits`),
    /// the greedy choices and the steps, the one-token path's first step
    /// row excepted.
    #[test]
    fn check_path_holds_each_path_to_its_rows_and_steps() {
        let golden = serde_json::json!({
            "prompt": [1, 0], "greedy": [1, 0],
            "prefill_logits": [[0.0, 1.0], [0.0, 2.0]],
            "incremental": {"logits": [[0.0, 1.0], [0.0, 2.5]]},
            "step_logits": [[0.0, 2.0], [3.0, 1.0]],
        });
        let step_ok = |_: u32| Ok(vec![3.0f32, 1.0]);
        let batched = [vec![0.0f32, 1.0], vec![0.0, 2.0]];
        let f = check_path(&golden, true, &batched, &mut step_ok.clone(), 1e-3).unwrap();
        assert_eq!(
            f,
            PathFigures {
                prompt: 0.0,
                steps: 0.0
            }
        );
        // The one-token path: its own prompt rows; its first step row (the
        // prompt's last) is not llama.cpp's batched one.
        let one = [vec![0.0f32, 1.0], vec![0.0, 2.5]];
        assert!(check_path(&golden, false, &one, &mut step_ok.clone(), 1e-3).is_ok());
        let e = check_path(&golden, true, &one, &mut step_ok.clone(), 1e-3).unwrap_err();
        assert!(e.contains("batched prompt: row 1"), "{e}");
        let mut off = |_: u32| Ok(vec![3.0f32, 1.01]);
        let e = check_path(&golden, true, &batched, &mut off, 1e-3).unwrap_err();
        assert!(e.contains("steps: row 1"), "{e}");
        let mut other = |_: u32| Ok(vec![0.0f32, 1.0]);
        let e = check_path(&golden, true, &batched, &mut other, 10.0).unwrap_err();
        assert!(e.contains("greedy token 1"), "{e}");
        assert!(check_path(&golden, true, &batched[..1], &mut step_ok.clone(), 1e-3).is_err());
    }

    /// The report names every run; a failure is listed unless excused.
    #[test]
    fn report_lists_failures_unless_excused() {
        let outcome = |run: &str, d: f64, greedy_equal: bool| RunOutcome {
            golden: "g".into(),
            run: run.into(),
            result: Ok(Comparison {
                max_abs_diff: d,
                worst_row: 1,
                greedy_equal,
            }),
        };
        let outcomes = [
            outcome("a", 0.0, true),
            outcome("b", 2e-3, true),
            outcome("c", 0.0, false),
            outcome("d", 0.5, true),
        ];
        let note = |o: &RunOutcome| (o.run == "d").then(|| "known".to_owned());
        let (text, failed) = report(&outcomes, 1e-3, &note);
        assert_eq!(text.lines().count(), 4);
        assert!(
            text.contains("g d: max |diff| 5.000e-1 at row 1 (known)"),
            "{text}"
        );
        assert_eq!(failed.len(), 2);
        assert!(failed[0].starts_with("g b:") && failed[1].contains("greedy differs"));
    }

    /// A base of two tensors, written to `dir` as `base.gguf`.
    fn base(dir: &Path) {
        let mut spec = FixtureSpec::default();
        spec.set_key(
            "general.architecture",
            seam::gguf::Value::String("t".into()),
        );
        spec.add_tensor("a.weight", GgmlType::F32, &[256, 2]);
        spec.add_tensor("b_norm.weight", GgmlType::F32, &[64]);
        spec.write_file(&dir.join("base.gguf")).unwrap();
    }

    fn recipe(seed: u64) -> Recipe {
        Recipe {
            base: "base.gguf".into(),
            seed,
            gain: 2,
            file_type: "Q4_K_M".into(),
            types: [("a.weight".to_owned(), "Q4_K".to_owned())].into(),
        }
    }

    /// Writes a golden of `recipe` whose one run has `rows` rows of 2.
    fn golden(dir: &Path, recipe: &Recipe, sha256: &str, rows: &[[f32; 2]]) -> PathBuf {
        let logits: Vec<u8> = rows
            .iter()
            .flatten()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        std::fs::write(dir.join("g.logits"), logits).unwrap();
        let json = serde_json::json!({
            "format": GENERATED_FORMAT,
            "recipe": {"base": recipe.base, "seed": recipe.seed, "gain": recipe.gain,
                       "file_type": recipe.file_type, "types": recipe.types},
            "model": {"sha256": sha256, "n_vocab": 2},
            "prompt": [1, 0],
            "logits_file": "g.logits",
            "runs": [{"cache_type_k": "f16", "cache_type_v": "f32", "flash_attn": false,
                      "batched": true, "greedy": [0, 1], "row_offset": 0, "rows": rows.len()}],
        });
        let path = dir.join("g.golden.json");
        std::fs::write(&path, json.to_string()).unwrap();
        path
    }

    /// A recipe makes the same bytes every time: the base's shape with
    /// the recipe's types, its seed's values; another seed, other bytes.
    #[test]
    fn a_recipe_makes_the_base_shape_with_its_types_and_seed() {
        let dir = tempfile::tempdir().unwrap();
        base(dir.path());
        let spec = recipe(7).spec(dir.path()).unwrap();
        assert_eq!(spec.tensors[0].ggml_type, GgmlType::Q4_K);
        assert_eq!(spec.tensors[1].ggml_type, GgmlType::F32);
        assert_eq!(spec.block_scales, BlockScales::FanIn { gain: 2 });
        let bytes = spec.writer().to_bytes();
        assert_eq!(
            bytes,
            recipe(7).spec(dir.path()).unwrap().writer().to_bytes()
        );
        assert_ne!(
            bytes,
            recipe(8).spec(dir.path()).unwrap().writer().to_bytes()
        );
        let mut bad = recipe(7);
        bad.types.insert("b_norm.weight".into(), "Q4_K".into());
        assert!(
            bad.spec(dir.path())
                .unwrap_err()
                .contains("not whole blocks")
        );
        let mut bad = recipe(7);
        bad.types.insert("c.weight".into(), "Q8_0".into());
        assert!(
            bad.spec(dir.path())
                .unwrap_err()
                .contains("no tensor \"c.weight\"")
        );
        let mut bad = recipe(7);
        bad.types.insert("a.weight".into(), "Q9".into());
        assert!(
            bad.spec(dir.path())
                .unwrap_err()
                .contains("unknown ggml type")
        );
    }

    /// A golden reads back with its runs' rows; its model is written only
    /// when the recipe makes the file llama.cpp ran; rows and greedy
    /// choices compare as [`Run::compare`] says.
    #[test]
    fn a_generated_golden_reads_checks_its_model_and_compares() {
        let dir = tempfile::tempdir().unwrap();
        base(dir.path());
        let r = recipe(3);
        let sha = sha256_hex(&r.spec(dir.path()).unwrap().writer().to_bytes());
        let rows = [[0.0, 1.0], [2.0, 1.0], [0.5, 0.25]];
        let path = golden(dir.path(), &r, &sha, &rows);
        let g = Generated::read(&path).unwrap();
        assert_eq!(g.name(), "g");
        assert_eq!(g.runs.len(), 1);
        let run = &g.runs[0];
        assert_eq!(run.numerics.cache_type_k, CacheType::F16);
        assert_eq!(run.numerics.cache_type_v, CacheType::F32);
        assert_eq!(run.label(), "batched k=f16 v=f32");
        assert_eq!(run.logits, rows.map(|r| r.to_vec()).to_vec());
        let out = dir.path().join("m.gguf");
        g.write_model(&out).unwrap();
        assert_eq!(sha256_hex(&std::fs::read(&out).unwrap()), sha);
        // Row 1 (the prompt's last) predicts greedy[0] = 0; row 2 predicts 1.
        let ours: Vec<Vec<f32>> = vec![vec![0.0, 1.0], vec![2.0, 1.0005], vec![0.5, 0.25]];
        let c = run.compare(&ours, 2);
        assert!(
            (c.max_abs_diff - 5e-4).abs() < 1e-6 && c.worst_row == 1,
            "{c:?}"
        );
        assert!(!c.greedy_equal, "row 2 picks 0, llama.cpp 1");
        let c = run.compare(&ours[..2], 2);
        assert_eq!(c.max_abs_diff, f64::INFINITY);
        // Another seed's model is not the file llama.cpp ran.
        let wrong = golden(dir.path(), &recipe(4), &sha, &rows);
        let e = Generated::read(&wrong)
            .unwrap()
            .write_model(&out)
            .unwrap_err();
        assert!(e.contains("llama.cpp ran"), "{e}");
        // Rows that do not fit the prompt and the steps are refused.
        golden(dir.path(), &r, &sha, &rows[..2]);
        assert!(
            Generated::read(&path)
                .unwrap_err()
                .contains("a run of 2 rows")
        );
    }
}
