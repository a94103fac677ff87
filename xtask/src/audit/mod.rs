//! `cargo xtask audit`: where the seam's reach ends, and whether the test
//! gates that guard it run anything.
//!
//! It parses the workspace's Rust source with syn (every file every target
//! compiles, found through the module tree; macro bodies parsed where they
//! hold Rust) and checks:
//!
//! 1. **Reach**: every call of `seam::resident_weight` and of the borrow
//!    producers ([`reach::BORROW_PRODUCERS`]), through aliases and
//!    re-exports, grouped by crate with file:line and enclosing function.
//!    The table of them in `specs/residency.md` (section "Reach", between
//!    the markers) must equal what the code holds; `--write` rewrites it.
//!    The table lists (file, function, callee, count) without line
//!    numbers, so an edit that only moves code does not fail the audit; a
//!    new call, even in a function already listed, does.
//! 2. **Flag readers**: every reader of `release_host_weights_after_upload`
//!    (in the same generated block).
//! 3. **Device copies**: a call of a backend copy method
//!    ([`reach::COPY_METHODS`]) outside the seam fails, except
//!    - in a crate under `platforms/`, in its test code (a `#[cfg(test)]`
//!      module, a `#[test]` function, or its test/bench targets): a backend
//!      testing itself copies no weight;
//!    - inside an implementation of the copy method itself (a backend that
//!      forwards to another): it is only reached from a caller the audit
//!      checks.
//! 4. **Gates**: each gate line of section "Gates" names a test binary and
//!    a selector ([`gates`]); the audit builds the test binaries, lists
//!    their tests and fails on a selector that runs no case or a line that
//!    names no binary.
//!
//! Also failures: the seam defining one of the listed functions no or
//! several times, a function named `resident_weight` (or a method named
//! like a method-matched producer) outside the seam, no call of
//! `resident_weight` found at all, no gate lines.
//!
//! Exit status: 0 when everything holds, 1 on a failure, 2 on a usage error.

pub mod gates;
pub mod reach;
pub mod resolve;
pub mod spec;
pub mod workspace;

#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};

use reach::{Found, SEAM_FN, SEAM_PACKAGE, Site};
use spec::SPEC_PATH;
use workspace::{TargetKind, Workspace};

/// What to check.
#[derive(Clone, Debug)]
pub struct Options {
    /// Rewrite the Reach table instead of failing on a difference.
    pub write: bool,
    /// Check the source (reach, readers, copies, table).
    pub reach: bool,
    /// Check the gates.
    pub gates: bool,
    /// Build test binaries here instead of the workspace's target dir.
    pub target_dir: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            write: false,
            reach: true,
            gates: true,
            target_dir: None,
        }
    }
}

/// Why a device copy is allowed, or that it is not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyVerdict {
    /// Inside the seam.
    InSeam,
    /// A platform crate's test code.
    PlatformTest,
    /// Inside an implementation of the copy method (forwarding).
    Forwarding,
    /// Outside the seam: a failure.
    Outside,
}

/// The rule for a call of a backend copy method.
pub fn copy_verdict(ws: &Workspace, site: &Site) -> CopyVerdict {
    let package = &ws.packages[site.package];
    if package.name == SEAM_PACKAGE {
        CopyVerdict::InSeam
    } else if package.dir.starts_with(ws.root.join("platforms")) && site.test_code {
        CopyVerdict::PlatformTest
    } else if site.in_copy_impl {
        CopyVerdict::Forwarding
    } else {
        CopyVerdict::Outside
    }
}

/// What the audit found.
#[derive(Debug)]
pub struct Report {
    /// The workspace.
    pub ws: Workspace,
    /// The sites (empty when the source was not checked).
    pub found: Found,
    /// The Reach table as the code has it.
    pub table: String,
    /// The difference between the spec's table and the code's.
    pub table_diff: Option<String>,
    /// Whether `--write` rewrote the table.
    pub wrote: bool,
    /// The gates.
    pub gates: Vec<gates::GateResult>,
    /// Modules without a file, and similar remarks.
    pub notes: Vec<String>,
    /// Why the audit fails; empty when it passes.
    pub failures: Vec<String>,
}

impl Report {
    /// Whether the audit passed.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Audits the workspace at `root`: everything, rewriting the Reach table
/// when `write`.
///
/// # Errors
///
/// The audit cannot run (cargo metadata fails, a file does not parse).
pub fn run(root: &Path, write: bool) -> Result<Report> {
    run_with(
        root,
        &Options {
            write,
            ..Options::default()
        },
    )
}

/// Audits the workspace at `root` as `options` say.
///
/// # Errors
///
/// The audit cannot run (cargo metadata fails, a file does not parse).
pub fn run_with(root: &Path, options: &Options) -> Result<Report> {
    let ws = Workspace::load(root)?;
    let mut report = Report {
        found: Found::default(),
        table: String::new(),
        table_diff: None,
        wrote: false,
        gates: Vec::new(),
        notes: Vec::new(),
        failures: Vec::new(),
        ws,
    };
    let spec_path = report.ws.root.join(SPEC_PATH);
    if options.reach {
        check_source(&mut report, &spec_path, options.write)?;
    }
    if options.gates {
        check_gates(&mut report, &spec_path, options.target_dir.as_deref());
    }
    Ok(report)
}

fn check_source(report: &mut Report, spec_path: &Path, write: bool) -> Result<()> {
    let ws = &report.ws;
    let (files, notes) = workspace::source_files(ws)?;
    report.notes = notes;
    let names = resolve::Names::collect(ws, &files);
    let (wanted, problems) = reach::locate(ws, &names);
    report.failures.extend(problems);
    report.found = reach::find(ws, &names, &wanted, &files);
    if !report.found.calls.iter().any(|s| s.what == SEAM_FN) {
        report.failures.push(format!(
            "found no call of `{SEAM_FN}` in {} files: the audit sees nothing (no seam, or nothing uses it)",
            files.len()
        ));
    }
    for site in &report.found.copies {
        if copy_verdict(ws, site) == CopyVerdict::Outside {
            report.failures.push(format!(
                "{}:{}: `{}` in `{}` copies bytes to a device outside the seam; weights reach a \
                 device only through `seam::{SEAM_FN}`",
                site.file, site.line, site.what, site.function
            ));
        }
    }
    report.table = spec::render_table(ws, &report.found);
    let text = match std::fs::read_to_string(spec_path) {
        Ok(t) => Some(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("reading {}", spec_path.display())),
    };
    let current = text.as_deref().and_then(spec::current_table);
    if current.as_deref() == Some(report.table.as_str()) {
        return Ok(());
    }
    if write {
        let base = text.unwrap_or_else(|| "# Residency spec\n".to_owned());
        match spec::with_table(&base, &report.table) {
            Ok(new) => {
                if let Some(dir) = spec_path.parent() {
                    std::fs::create_dir_all(dir)
                        .with_context(|| format!("creating {}", dir.display()))?;
                }
                std::fs::write(spec_path, new)
                    .with_context(|| format!("writing {}", spec_path.display()))?;
                report.wrote = true;
            }
            Err(why) => report
                .failures
                .push(format!("{SPEC_PATH}: cannot write the Reach table: {why}")),
        }
        return Ok(());
    }
    match (&text, &current) {
        (None, _) => report.failures.push(format!(
            "{SPEC_PATH} does not exist; `cargo xtask audit --write` creates it"
        )),
        (Some(t), None) => {
            let lines: Vec<&str> = t.lines().collect();
            let why = match spec::table_place(&lines) {
                spec::TablePlace::NoSection => "has no section \"Reach\"".to_owned(),
                spec::TablePlace::NoMarkers(_) => {
                    "has no generated table in section \"Reach\"".to_owned()
                }
                spec::TablePlace::Broken(why) => why,
                spec::TablePlace::Markers { .. } => unreachable!("markers in place yield a table"),
            };
            report.failures.push(format!(
                "{SPEC_PATH} {why}; run `cargo xtask audit --write`"
            ));
        }
        (Some(_), Some(old)) => {
            report.table_diff = Some(spec::diff(old, &report.table));
            report.failures.push(format!(
                "{SPEC_PATH}: the Reach table and the code disagree (diff above); review the change, \
                 then run `cargo xtask audit --write`"
            ));
        }
    }
    Ok(())
}

fn check_gates(report: &mut Report, spec_path: &Path, target_dir: Option<&Path>) {
    let text = match std::fs::read_to_string(spec_path) {
        Ok(t) => t,
        Err(e) => {
            report.failures.push(format!("{SPEC_PATH}: {e}"));
            return;
        }
    };
    let Some(lines) = spec::gates(&text) else {
        report
            .failures
            .push(format!("{SPEC_PATH} has no section \"Gates\""));
        return;
    };
    if lines.is_empty() {
        report.failures.push(format!(
            "{SPEC_PATH}: section \"Gates\" holds no gate line; an empty gate list passes nothing"
        ));
        return;
    }
    let gates = lines
        .into_iter()
        .map(|g| (g.line, g.text, g.parsed))
        .collect();
    let checked = gates::check(&report.ws, gates, target_dir);
    report.gates = checked.results;
    report.failures.extend(checked.build_error);
    for g in &report.gates {
        if let Some(e) = &g.error {
            report
                .failures
                .push(format!("{SPEC_PATH}:{}: gate `{}`: {e}", g.line, g.text));
        }
    }
}

/// The report as printed.
pub fn render(report: &Report) -> String {
    use std::fmt::Write as _;
    let ws = &report.ws;
    let mut out = String::new();
    if !report.table.is_empty() {
        let producers: Vec<String> = reach::BORROW_PRODUCERS
            .iter()
            .map(|p| format!("{}::{}", p.ty, p.name))
            .collect();
        let _ = writeln!(
            out,
            "Reach: calls of seam::{SEAM_FN} and of {}",
            producers.join(", ")
        );
        let mut package = usize::MAX;
        for s in &report.found.calls {
            if s.package != package {
                package = s.package;
                let n = report
                    .found
                    .calls
                    .iter()
                    .filter(|c| c.package == package)
                    .count();
                let _ = writeln!(
                    out,
                    "  {} ({n} site{})",
                    ws.packages[package].name,
                    if n == 1 { "" } else { "s" }
                );
            }
            let how = match s.how {
                reach::How::Value => " (as a value)",
                reach::How::MacroTokens => " (in macro tokens)",
                _ => "",
            };
            let _ = writeln!(
                out,
                "    {}:{}  {}  {}{how}  [{}]",
                s.file,
                s.line,
                s.function,
                s.what,
                spec::target_label(ws, s)
            );
        }
        let _ = writeln!(out, "Readers of {}", reach::FLAG);
        for s in &report.found.readers {
            let _ = writeln!(
                out,
                "    {}:{}  {}  ({})  [{}]",
                s.file,
                s.line,
                s.function,
                ws.packages[s.package].name,
                spec::target_label(ws, s)
            );
        }
        let _ = writeln!(out, "Device copies ({})", reach::COPY_METHODS.join(", "));
        for s in &report.found.copies {
            let verdict = match copy_verdict(ws, s) {
                CopyVerdict::InSeam => "the seam",
                CopyVerdict::PlatformTest => "allowed: a platform testing its own backend",
                CopyVerdict::Forwarding => "allowed: a backend forwarding the copy",
                CopyVerdict::Outside => "FAIL: outside the seam",
            };
            let _ = writeln!(out, "    {}:{}  {}  {verdict}", s.file, s.line, s.function);
        }
        for n in &report.notes {
            let _ = writeln!(out, "note: {n}");
        }
        if let Some(d) = &report.table_diff {
            out.push_str(d);
        } else if report.wrote {
            let _ = writeln!(out, "{SPEC_PATH}: wrote the Reach table");
        } else if !report.failures.iter().any(|f| f.starts_with(SPEC_PATH)) {
            let _ = writeln!(out, "{SPEC_PATH}: the Reach table matches the code");
        }
    }
    if !report.gates.is_empty() {
        let _ = writeln!(out, "Gates");
        for g in &report.gates {
            match &g.gate {
                Some((binary, selector)) => match &g.executable {
                    Some(exe) => {
                        let ignored = if g.ignored > 0 {
                            format!(", {} ignored", g.ignored)
                        } else {
                            String::new()
                        };
                        let _ = writeln!(
                            out,
                            "    {binary} {selector}: {} case{} (of {} tests{ignored})  [{}]{}",
                            g.runs(),
                            if g.runs() == 1 { "" } else { "s" },
                            g.total,
                            ws.rel(exe),
                            if g.error.is_some() { "  FAIL" } else { "" }
                        );
                    }
                    None => {
                        let why = g.error.as_deref().unwrap_or("no executable");
                        let _ = writeln!(out, "    {binary} {selector}: FAIL: {why}");
                    }
                },
                None => {
                    let _ = writeln!(out, "    line {}: `{}`  FAIL", g.line, g.text);
                }
            }
        }
    }
    if report.passed() {
        let _ = writeln!(out, "audit: passed");
    } else {
        let _ = writeln!(out, "audit: FAILED");
        for f in &report.failures {
            let _ = writeln!(out, "  - {f}");
        }
    }
    out
}

const USAGE: &str = "usage: cargo xtask audit [reach | gates] [--write] [--root DIR]
       cargo xtask audit gate package=PACKAGE test=(lib | bin:NAME | TARGET) (selector=SUBSTRING | exact=NAME) [--root DIR]";

fn usage(why: &str) -> ExitCode {
    eprintln!("xtask audit: {why}\n{USAGE}");
    ExitCode::from(2)
}

/// `cargo xtask audit ...`.
pub fn main(args: &[String]) -> ExitCode {
    let mut options = Options::default();
    let mut root = crate::workspace_root();
    let mut words = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--write" => options.write = true,
            "--root" => match it.next() {
                Some(dir) => root = PathBuf::from(dir),
                None => return usage("--root needs a directory"),
            },
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            a if a.starts_with('-') => return usage(&format!("unknown option {a:?}")),
            _ => words.push(arg.as_str()),
        }
    }
    match words.split_first() {
        None => {}
        Some((&"reach", [])) => options.gates = false,
        Some((&"gates", [])) => {
            if options.write {
                return usage("--write goes with the reach check");
            }
            options.reach = false;
        }
        Some((&"gate", rest)) => {
            if rest.is_empty() {
                return usage("`gate` needs package=, test= and selector= (or exact=)");
            }
            if options.write {
                return usage("--write goes with the reach check");
            }
            return gate_command(&root, &rest.join(" "));
        }
        Some((word, _)) => return usage(&format!("unexpected argument {word:?}")),
    }
    let report = if options.reach && options.gates {
        run(&root, options.write)
    } else {
        run_with(&root, &options)
    };
    match report {
        Ok(report) => {
            print!("{}", render(&report));
            if report.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("xtask audit: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `cargo xtask audit gate ...`: one gate given on the command line.
fn gate_command(root: &Path, text: &str) -> ExitCode {
    let parsed = spec::parse_gate(text);
    if let Err(e) = &parsed {
        return usage(&format!("gate `{text}`: {e}"));
    }
    let ws = match Workspace::load(root) {
        Ok(ws) => ws,
        Err(e) => {
            eprintln!("xtask audit: error: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let checked = gates::check(&ws, vec![(0, text.to_owned(), parsed)], None);
    let gate_errors = checked
        .results
        .iter()
        .filter_map(|g| g.error.as_ref().map(|e| format!("gate `{}`: {e}", g.text)));
    let failures = checked
        .build_error
        .clone()
        .into_iter()
        .chain(gate_errors)
        .collect();
    let report = Report {
        found: Found::default(),
        table: String::new(),
        table_diff: None,
        wrote: false,
        failures,
        gates: checked.results,
        notes: Vec::new(),
        ws,
    };
    print!("{}", render(&report));
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Whether a target kind is test code by itself.
pub fn is_test_target(kind: TargetKind) -> bool {
    matches!(
        kind,
        TargetKind::Test | TargetKind::Bench | TargetKind::Example
    )
}
