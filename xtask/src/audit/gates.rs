//! Gates: each names a test binary and a selector; the audit lists every
//! test of the binary (libtest's `--list`) and counts the cases the
//! selector matches, so a selector that matches nothing cannot pass as a
//! green test run.
//!
//! Match semantics are libtest's: `selector=S` matches every test whose full
//! name (`module::test_name`) contains `S`, as `cargo test S` would run;
//! `exact=NAME` matches the one test named `NAME`, as `--exact` would.
//! Ignored tests are listed but do not count: `cargo test` and nextest skip
//! them by default.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use super::spec::{Binary, Selector};
use super::workspace::{TargetKind, Workspace};

/// The outcome of one gate.
#[derive(Clone, Debug)]
pub struct GateResult {
    /// Its line in the spec (1-based; 0 for a gate given on the command line).
    pub line: usize,
    /// The line as written.
    pub text: String,
    /// The binary and selector, when the line parsed.
    pub gate: Option<(Binary, Selector)>,
    /// The test executable.
    pub executable: Option<PathBuf>,
    /// Tests in the binary.
    pub total: usize,
    /// Tests the selector matches, ignored ones included.
    pub matched: usize,
    /// Of those, ignored.
    pub ignored: usize,
    /// Why the gate fails, if it does.
    pub error: Option<String>,
}

impl GateResult {
    /// The cases the selector makes a test run run.
    pub fn runs(&self) -> usize {
        self.matched - self.ignored
    }
}

/// The cargo target selection of a binary, checked against the workspace.
fn target_of(ws: &Workspace, b: &Binary) -> Result<(PathBuf, TargetKind, String), String> {
    let Some(p) = ws.package(&b.package) else {
        return Err(format!(
            "names no binary: no package `{}` in the workspace ({})",
            b.package,
            ws.packages
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    };
    let (kind, name) = if b.test == "lib" {
        (TargetKind::Lib, None)
    } else if let Some(bin) = b.test.strip_prefix("bin:") {
        (TargetKind::Bin, Some(bin))
    } else {
        (TargetKind::Test, Some(b.test.as_str()))
    };
    match p
        .targets
        .iter()
        .find(|t| t.kind == kind && name.is_none_or(|n| t.name == n))
    {
        Some(t) => Ok((p.dir.join("Cargo.toml"), kind, t.name.clone())),
        None => {
            let tests: Vec<&str> = p
                .targets
                .iter()
                .filter(|t| t.kind == TargetKind::Test)
                .map(|t| t.name.as_str())
                .collect();
            Err(format!(
                "names no binary: package `{}` has no test target `{}` (its test targets: {})",
                b.package,
                b.test,
                if tests.is_empty() {
                    "none".to_owned()
                } else {
                    tests.join(", ")
                }
            ))
        }
    }
}

/// Executables by (manifest, kind, target name).
type Executables = BTreeMap<(PathBuf, TargetKind, String), PathBuf>;

/// Builds the workspace's test binaries (`cargo build --tests --workspace
/// --keep-going`: the same artifacts as `cargo test --no-run` and
/// `cargo nextest run --workspace`, so after a test run this is a no-op)
/// and returns the executables that built, and why the build failed, if it
/// did.
fn build(ws: &Workspace, target_dir: Option<&Path>) -> (Executables, Option<String>) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&ws.root).args([
        "build",
        "--tests",
        "--workspace",
        "--keep-going",
        "--message-format=json",
    ]);
    if let Some(dir) = target_dir {
        cmd.env("CARGO_TARGET_DIR", dir);
    }
    let out = match cmd.output() {
        Ok(out) => out,
        Err(e) => return (BTreeMap::new(), Some(format!("running {cmd:?}: {e}"))),
    };
    let mut exes = BTreeMap::new();
    let mut errors = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if msg["reason"] == "compiler-message" && msg["message"]["level"] == "error" {
            if let Some(r) = msg["message"]["rendered"].as_str() {
                errors.push(r.trim_end().to_owned());
            }
            continue;
        }
        if msg["reason"] != "compiler-artifact" || msg["profile"]["test"] != true {
            continue;
        }
        let (Some(exe), Some(manifest), Some(name)) = (
            msg["executable"].as_str(),
            msg["manifest_path"].as_str(),
            msg["target"]["name"].as_str(),
        ) else {
            continue;
        };
        let kinds: Vec<&str> = msg["target"]["kind"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let kind = if kinds
            .iter()
            .any(|k| k.ends_with("lib") || *k == "proc-macro")
        {
            TargetKind::Lib
        } else if kinds.contains(&"bin") {
            TargetKind::Bin
        } else if kinds.contains(&"test") {
            TargetKind::Test
        } else {
            continue;
        };
        exes.insert(
            (PathBuf::from(manifest), kind, name.to_owned()),
            PathBuf::from(exe),
        );
    }
    if out.status.success() {
        return (exes, None);
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    errors.extend(
        stderr
            .lines()
            .filter(|l| l.starts_with("error"))
            .map(str::to_owned),
    );
    if errors.is_empty() {
        errors.push(stderr.trim().to_owned());
    }
    let text = errors.join("\n");
    let mut lines: Vec<&str> = text.lines().take(60).collect();
    if text.lines().count() > lines.len() {
        lines.push("...");
    }
    let why = format!(
        "building the test binaries (cargo build --tests --workspace) failed:\n{}",
        lines.join("\n")
    );
    (exes, Some(why))
}

/// The test names an executable lists (`--list --format terse`), all or
/// only the ignored ones.
fn list(exe: &Path, dir: &Path, ignored: bool) -> Result<BTreeSet<String>, String> {
    let mut cmd = Command::new(exe);
    cmd.current_dir(dir).args(["--list", "--format", "terse"]);
    if ignored {
        cmd.arg("--ignored");
    }
    let out = cmd
        .output()
        .map_err(|e| format!("running {}: {e}", exe.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} --list failed ({}): {}",
            exe.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(str::to_owned)
        .collect())
}

/// A gate to check: its line (1-based), its text, and its binary and
/// selector or why the line names none.
pub type GateInput = (usize, String, Result<(Binary, Selector), String>);

/// A binary's tests: all of them and the ignored ones.
type Listing = Result<(BTreeSet<String>, BTreeSet<String>), String>;

/// Checks `gates`.
/// The gates' outcomes, and why the test binaries did not all build.
#[derive(Debug, Default)]
pub struct Checked {
    /// One per gate, in order.
    pub results: Vec<GateResult>,
    /// The build failure, if any (gates whose binary built are still
    /// counted).
    pub build_error: Option<String>,
}

/// Checks `gates`.
pub fn check(ws: &Workspace, gates: Vec<GateInput>, target_dir: Option<&Path>) -> Checked {
    let mut results: Vec<GateResult> = gates
        .into_iter()
        .map(|(line, text, parsed)| {
            let (gate, error) = match parsed {
                Ok(g) => (Some(g), None),
                Err(e) => (None, Some(e)),
            };
            GateResult {
                line,
                text,
                gate,
                executable: None,
                total: 0,
                matched: 0,
                ignored: 0,
                error,
            }
        })
        .collect();
    let mut wanted = Vec::new();
    for r in &mut results {
        let Some((binary, _)) = &r.gate else {
            wanted.push(None);
            continue;
        };
        match target_of(ws, binary) {
            Ok(t) => wanted.push(Some(t)),
            Err(e) => {
                r.error = Some(e);
                wanted.push(None);
            }
        }
    }
    if wanted.iter().all(Option::is_none) {
        return Checked {
            results,
            build_error: None,
        };
    }
    let (exes, build_error) = build(ws, target_dir);
    let mut listed: BTreeMap<PathBuf, Listing> = BTreeMap::new();
    for (r, w) in results.iter_mut().zip(wanted) {
        let (Some(key), Some((_, selector))) = (w, &r.gate) else {
            continue;
        };
        let Some(exe) = exes.get(&key) else {
            r.error = Some(if build_error.is_some() {
                "its test binary did not build (see the build failure)".to_owned()
            } else {
                format!("cargo built no test executable for `{}`", key.2)
            });
            continue;
        };
        r.executable = Some(exe.clone());
        let dir = key.0.parent().unwrap_or(&ws.root).to_path_buf();
        let tests = listed
            .entry(exe.clone())
            .or_insert_with(|| Ok((list(exe, &dir, false)?, list(exe, &dir, true)?)));
        match tests {
            Ok((all, ignored)) => {
                r.total = all.len();
                r.matched = all.iter().filter(|t| selector.matches(t)).count();
                r.ignored = ignored.iter().filter(|t| selector.matches(t)).count();
                if r.matched == 0 {
                    r.error = Some(format!(
                        "{selector} matches 0 of the binary's {} tests",
                        r.total
                    ));
                } else if r.runs() == 0 {
                    r.error = Some(format!(
                        "{selector} matches only ignored tests ({})",
                        r.matched
                    ));
                }
            }
            Err(e) => r.error = Some(e.clone()),
        }
    }
    Checked {
        results,
        build_error,
    }
}
