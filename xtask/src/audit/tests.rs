//! The audit on temporary copies of a small workspace: a fake `seam` with
//! the real one's names, a family that reaches it through aliases,
//! re-exports, globs and macros, a binary, and a platform crate.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::reach::How;
use super::{CopyVerdict, Options, Report, copy_verdict, run, run_with};

const FIXTURE: &[(&str, &str)] = &[
    (
        "Cargo.toml",
        r#"[workspace]
resolver = "3"
members = ["seam", "fam", "app", "platforms/dev"]

[workspace.package]
edition = "2024"
"#,
    ),
    (
        "seam/Cargo.toml",
        r#"[package]
name = "seam"
version = "0.1.0"
edition.workspace = true
"#,
    ),
    (
        "seam/src/lib.rs",
        r#"pub mod borrow;
pub mod gguf;
pub mod platform;
pub mod resident;

pub use resident::resident_weight;
"#,
    ),
    (
        "seam/src/borrow.rs",
        r#"pub struct MappedFile {
    pub len: u64,
}

impl MappedFile {
    pub fn open(path: &str) -> MappedFile {
        MappedFile { len: path.len() as u64 }
    }
}

pub struct Borrow {
    pub len: u64,
}

impl Borrow {
    pub fn new(file: &MappedFile, len: u64) -> Borrow {
        Borrow { len: len.min(file.len) }
    }

    pub fn sub_span(&self, len: u64) -> Borrow {
        Self::new(&MappedFile { len: self.len }, len)
    }
}
"#,
    ),
    (
        "seam/src/gguf/mod.rs",
        r#"mod file;

pub use file::GgufModel;
"#,
    ),
    (
        "seam/src/gguf/file.rs",
        r#"use crate::borrow::{Borrow, MappedFile};

pub struct GgufModel {
    pub file: MappedFile,
}

impl GgufModel {
    pub fn tensor_borrow(&self, len: u64) -> Borrow {
        Borrow::new(&self.file, len)
    }
}
"#,
    ),
    (
        "seam/src/platform.rs",
        r#"pub struct Policy {
    pub release_host_weights_after_upload: bool,
}

pub trait Backend {
    fn copy_to_device_async(&self, src: &[u8]);
    fn policy(&self) -> Policy;
}
"#,
    ),
    (
        "seam/src/resident.rs",
        r#"use crate::borrow::Borrow;
use crate::platform::Backend;

pub fn resident_weight(w: &Borrow, b: &dyn Backend) -> u64 {
    b.copy_to_device_async(&[0; 4]);
    if b.policy().release_host_weights_after_upload { 0 } else { w.len }
}
"#,
    ),
    (
        "seam/tests/gate.rs",
        r#"#[test]
fn alpha_one() {}

#[test]
fn alpha_two() {}

#[test]
#[ignore]
fn gamma_ignored() {}
"#,
    ),
    (
        "fam/Cargo.toml",
        r#"[package]
name = "fam"
version = "0.1.0"
edition.workspace = true

[dependencies]
seam = { path = "../seam" }
"#,
    ),
    (
        "fam/src/lib.rs",
        r#"use seam::borrow::{Borrow, MappedFile};
use seam::platform::Backend;
use seam::resident_weight as rw;

pub mod again {
    pub use seam::resident_weight as stage;
}

mod globbed;

macro_rules! stage_it {
    ($w:expr, $b:expr) => {
        seam::resident_weight($w, $b)
    };
}

pub fn load(b: &dyn Backend) -> u64 {
    let m = MappedFile::open("x");
    let w = Borrow::new(&m, 4);
    rw(&w, b)
}

pub fn checked(b: &dyn Backend) {
    let w = seam::borrow::Borrow::new(&seam::borrow::MappedFile::open("y"), 1);
    assert!(seam::resident_weight(&w, b) < 10, "staged {}", 1);
}

pub fn through_the_module(b: &dyn Backend) -> u64 {
    use seam::resident::resident_weight;
    let w = Borrow::new(&MappedFile::open("z"), 2).sub_span(1);
    resident_weight(&w, b) + stage_it!(&w, b)
}

pub fn as_a_value(b: &dyn Backend) -> u64 {
    let f = seam::resident_weight;
    f(&<Borrow>::new(&MappedFile { len: 1 }, 1), b)
}

pub fn reads(b: &dyn Backend) -> bool {
    let seam::platform::Policy { release_host_weights_after_upload } = b.policy();
    release_host_weights_after_upload || b.policy().release_host_weights_after_upload
}

mod local {
    /// Not the seam's: a local function of another name.
    pub fn resident(n: u64) -> u64 {
        n
    }
}

pub fn not_the_seam() -> u64 {
    local::resident(1)
}
"#,
    ),
    (
        "fam/src/globbed.rs",
        r#"use seam::*;

pub fn g(b: &dyn platform::Backend) -> u64 {
    let w = borrow::Borrow::new(&borrow::MappedFile { len: 8 }, 8);
    resident_weight(&w, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit() {
        let _ = vec![resident_weight; 1];
    }
}
"#,
    ),
    (
        "app/Cargo.toml",
        r#"[package]
name = "app"
version = "0.1.0"
edition.workspace = true

[dependencies]
fam = { path = "../fam" }
core_seam = { path = "../seam", package = "seam" }
"#,
    ),
    (
        "app/src/main.rs",
        r#"use core_seam::platform::{Backend, Policy};

struct Cpu;

impl Backend for Cpu {
    fn copy_to_device_async(&self, _src: &[u8]) {}
    fn policy(&self) -> Policy {
        Policy { release_host_weights_after_upload: false }
    }
}

fn main() {
    let m = core_seam::gguf::GgufModel { file: core_seam::borrow::MappedFile::open("m") };
    let w = m.tensor_borrow(3);
    let n = fam::again::stage(&w, &Cpu);
    println!("{}", vec![n; 2].len());
}
"#,
    ),
    (
        "platforms/dev/Cargo.toml",
        r#"[package]
name = "platform-dev"
version = "0.1.0"
edition.workspace = true

[dependencies]
seam = { path = "../../seam" }
"#,
    ),
    (
        "platforms/dev/src/lib.rs",
        r#"use seam::platform::{Backend, Policy};

pub struct Dev;

impl Backend for Dev {
    fn copy_to_device_async(&self, src: &[u8]) {
        let _ = src;
    }
    fn policy(&self) -> Policy {
        Policy { release_host_weights_after_upload: true }
    }
}

pub struct Forward(pub Dev);

impl Backend for Forward {
    fn copy_to_device_async(&self, src: &[u8]) {
        self.0.copy_to_device_async(src)
    }
    fn policy(&self) -> Policy {
        self.0.policy()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies() {
        Dev.copy_to_device_async(&[1, 2]);
    }
}
"#,
    ),
    (
        "specs/residency.md",
        r#"# Residency spec

## Reach

The table.

## Gates

- gate: package=seam test=gate selector=alpha
"#,
    ),
];

/// A temporary copy of the fixture workspace.
struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in FIXTURE {
            let p = dir.path().join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        Fixture { dir }
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root().join(rel)
    }

    fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.path(rel)).unwrap()
    }

    fn write(&self, rel: &str, text: &str) {
        std::fs::write(self.path(rel), text).unwrap();
    }

    fn append(&self, rel: &str, text: &str) {
        let old = self.read(rel);
        self.write(rel, &format!("{old}{text}"));
    }

    fn replace(&self, rel: &str, from: &str, to: &str) {
        let old = self.read(rel);
        assert!(old.contains(from), "{rel} has no {from:?}");
        self.write(rel, &old.replacen(from, to, 1));
    }

    /// The source checks only (no cargo build).
    fn reach(&self, write: bool) -> Report {
        run_with(
            self.root(),
            &Options {
                write,
                reach: true,
                gates: false,
                target_dir: None,
            },
        )
        .unwrap()
    }

    /// The gates only, building into the fixture's own target dir.
    fn gates(&self) -> Report {
        run_with(
            self.root(),
            &Options {
                write: false,
                reach: false,
                gates: true,
                target_dir: Some(self.path("target")),
            },
        )
        .unwrap()
    }
}

/// (file, function, what) of the report's calls in `package`, sorted.
fn calls(report: &Report, package: &str) -> Vec<(String, String, String)> {
    let mut v: Vec<_> = report
        .found
        .calls
        .iter()
        .filter(|s| report.ws.packages[s.package].name == package)
        .map(|s| (s.file.clone(), s.function.clone(), s.what.clone()))
        .collect();
    v.sort();
    v
}

fn triples(list: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
    let mut v: Vec<_> = list
        .iter()
        .map(|(a, b, c)| ((*a).to_owned(), (*b).to_owned(), (*c).to_owned()))
        .collect();
    v.sort();
    v
}

fn failures_mention(report: &Report, needle: &str) -> bool {
    report.failures.iter().any(|f| f.contains(needle))
}

#[test]
fn calls_are_found_through_aliases_reexports_globs_and_macros() {
    let fx = Fixture::new();
    let report = fx.reach(true);
    assert!(report.passed(), "{}", super::render(&report));
    const LIB: &str = "fam/src/lib.rs";
    const GLOB: &str = "fam/src/globbed.rs";
    assert_eq!(
        calls(&report, "fam"),
        triples(&[
            (GLOB, "globbed::g", "Borrow::new"),
            (GLOB, "globbed::g", "resident_weight"),
            (GLOB, "globbed::tests::unit", "resident_weight"),
            (LIB, "as_a_value", "Borrow::new"),
            (LIB, "as_a_value", "resident_weight"),
            (LIB, "checked", "Borrow::new"),
            (LIB, "checked", "MappedFile::open"),
            (LIB, "checked", "resident_weight"),
            (LIB, "load", "Borrow::new"),
            (LIB, "load", "MappedFile::open"),
            (LIB, "load", "resident_weight"),
            (LIB, "macro_rules! stage_it", "resident_weight"),
            (LIB, "through_the_module", "Borrow::new"),
            (LIB, "through_the_module", "Borrow::sub_span"),
            (LIB, "through_the_module", "MappedFile::open"),
            (LIB, "through_the_module", "resident_weight"),
        ])
    );
    // Through a re-export in another crate, and a renamed dependency.
    assert_eq!(
        calls(&report, "app"),
        triples(&[
            ("app/src/main.rs", "main", "GgufModel::tensor_borrow"),
            ("app/src/main.rs", "main", "MappedFile::open"),
            ("app/src/main.rs", "main", "resident_weight"),
        ])
    );
    // Inside the seam: `Self::new` and the re-exported model.
    assert_eq!(
        calls(&report, "seam"),
        triples(&[
            (
                "seam/src/borrow.rs",
                "borrow::Borrow::sub_span",
                "Borrow::new"
            ),
            (
                "seam/src/gguf/file.rs",
                "gguf::file::GgufModel::tensor_borrow",
                "Borrow::new"
            ),
        ])
    );
    let value = report
        .found
        .calls
        .iter()
        .find(|s| s.function == "as_a_value" && s.what == "resident_weight");
    assert_eq!(value.map(|s| s.how), Some(How::Value));
    let unit = report
        .found
        .calls
        .iter()
        .find(|s| s.function == "globbed::tests::unit")
        .unwrap();
    assert!(unit.test_code);
    // Readers: a pattern and a field read in the family, the seam's own.
    let readers: Vec<(String, String)> = report
        .found
        .readers
        .iter()
        .map(|s| (s.file.clone(), s.function.clone()))
        .collect();
    assert_eq!(
        readers,
        [
            ("fam/src/lib.rs".to_owned(), "reads".to_owned()),
            ("fam/src/lib.rs".to_owned(), "reads".to_owned()),
            (
                "seam/src/resident.rs".to_owned(),
                "resident::resident_weight".to_owned()
            ),
        ]
    );
    // The table was written and now matches.
    let spec = fx.read("specs/residency.md");
    assert!(
        spec.contains("| lib | fam/src/lib.rs | `checked` | `resident_weight` | 1 |"),
        "{spec}"
    );
    assert!(
        spec.contains("| fam | lib | fam/src/lib.rs | `reads` | 2 |"),
        "{spec}"
    );
    assert!(
        spec.contains("- gate: package=seam test=gate selector=alpha"),
        "{spec}"
    );
    let again = fx.reach(false);
    assert!(again.passed(), "{}", super::render(&again));
    assert!(!again.wrote);
}

#[test]
fn a_call_hidden_inside_assert_is_counted() {
    let fx = Fixture::new();
    let before = fx.reach(true);
    assert!(before.passed(), "{}", super::render(&before));
    let src = fx.read("fam/src/lib.rs");
    let line = src
        .lines()
        .position(|l| l.contains("assert!(seam::resident_weight"))
        .unwrap()
        + 1;
    assert!(
        before
            .found
            .calls
            .iter()
            .any(|s| s.file == "fam/src/lib.rs" && s.line == line && s.what == "resident_weight"),
        "no site at fam/src/lib.rs:{line}"
    );
    // More, nested in other macros.
    fx.append(
        "fam/src/lib.rs",
        "\npub fn asserted(b: &dyn Backend) {\n    let w = Borrow::new(&MappedFile::open(\"q\"), 1);\n    \
         assert_eq!(rw(&w, b), 1, \"{}\", format!(\"{}\", rw(&w, b)));\n    \
         debug_assert!(matches!(seam::resident_weight(&w, b), 0 | 1));\n}\n",
    );
    let after = fx.reach(false);
    let n = after
        .found
        .calls
        .iter()
        .filter(|s| s.function == "asserted" && s.what == "resident_weight")
        .count();
    assert_eq!(n, 3, "{}", super::render(&after));
    assert!(!after.passed());
    let diff = after.table_diff.as_deref().unwrap();
    assert!(
        diff.contains("+ | lib | fam/src/lib.rs | `asserted` | `resident_weight` | 3 |"),
        "{diff}"
    );
}

#[test]
fn a_new_call_site_the_spec_does_not_list_fails_with_a_diff_and_write_then_passes() {
    let fx = Fixture::new();
    let first = fx.reach(false);
    assert!(
        failures_mention(&first, "no generated table"),
        "{:?}",
        first.failures
    );
    assert!(fx.reach(true).passed());
    // Moving code does not change the table.
    fx.replace("fam/src/lib.rs", "pub fn load(", "\n\n\npub fn load(");
    assert!(fx.reach(false).passed());

    fx.append(
        "fam/src/lib.rs",
        "\npub fn extra(b: &dyn Backend) -> u64 {\n    seam::resident_weight(&Borrow::new(&MappedFile::open(\"e\"), 1), b)\n}\n",
    );
    let report = fx.reach(false);
    assert!(!report.passed());
    assert!(
        failures_mention(&report, "the Reach table and the code disagree"),
        "{:?}",
        report.failures
    );
    let diff = report.table_diff.as_deref().unwrap();
    assert!(
        diff.contains("+ | lib | fam/src/lib.rs | `extra` | `resident_weight` | 1 |"),
        "{diff}"
    );
    assert!(
        diff.contains("- 16 sites, 7 of them `resident_weight`."),
        "{diff}"
    );
    assert!(
        diff.contains("+ 19 sites, 8 of them `resident_weight`."),
        "{diff}"
    );
    let text = super::render(&report);
    assert!(
        text.contains(diff) && text.contains("audit: FAILED"),
        "{text}"
    );

    // One more call in a function already listed changes its count.
    let written = fx.reach(true);
    assert!(
        written.wrote && written.passed(),
        "{}",
        super::render(&written)
    );
    assert!(fx.reach(false).passed());
    fx.replace(
        "fam/src/lib.rs",
        "    rw(&w, b)\n",
        "    rw(&w, b) + rw(&w, b)\n",
    );
    let report = fx.reach(false);
    let diff = report.table_diff.as_deref().unwrap();
    assert!(
        diff.contains("- | lib | fam/src/lib.rs | `load` | `resident_weight` | 1 |"),
        "{diff}"
    );
    assert!(
        diff.contains("+ | lib | fam/src/lib.rs | `load` | `resident_weight` | 2 |"),
        "{diff}"
    );
    assert!(fx.reach(true).passed());
    assert!(fx.reach(false).passed());
}

#[test]
fn a_device_copy_of_weight_bytes_outside_the_seam_fails() {
    let fx = Fixture::new();
    let clean = fx.reach(true);
    assert!(clean.passed(), "{}", super::render(&clean));
    let verdicts: Vec<(String, CopyVerdict)> = clean
        .found
        .copies
        .iter()
        .map(|s| (s.function.clone(), copy_verdict(&clean.ws, s)))
        .collect();
    assert_eq!(
        verdicts,
        [
            (
                "Forward::copy_to_device_async".to_owned(),
                CopyVerdict::Forwarding
            ),
            ("tests::copies".to_owned(), CopyVerdict::PlatformTest),
            ("resident::resident_weight".to_owned(), CopyVerdict::InSeam),
        ]
    );

    // A family copying a weight's bytes itself.
    fx.append(
        "fam/src/lib.rs",
        "\npub fn sneaky(b: &dyn Backend, w: &[u8]) {\n    b.copy_to_device_async(w);\n}\n",
    );
    let line = fx.read("fam/src/lib.rs").lines().count() - 1;
    let report = fx.reach(false);
    assert!(
        failures_mention(
            &report,
            &format!("fam/src/lib.rs:{line}: `copy_to_device_async` in `sneaky`")
        ),
        "{:?}",
        report.failures
    );

    // Also through the trait's path, in a family's tests: only platform
    // crates' tests are exempt.
    let fx = Fixture::new();
    fx.append(
        "fam/src/lib.rs",
        "\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn t() {\n        \
         let _ = seam::platform::Backend::copy_to_device_async;\n    }\n}\n",
    );
    let report = fx.reach(true);
    assert!(
        failures_mention(&report, "`copy_to_device_async` in `tests::t`"),
        "{:?}",
        report.failures
    );

    // And in a platform crate's own code outside its tests.
    let fx = Fixture::new();
    fx.append(
        "platforms/dev/src/lib.rs",
        "\npub fn upload(w: &[u8]) {\n    Dev.copy_to_device_async(w);\n}\n",
    );
    let report = fx.reach(true);
    assert!(
        failures_mention(&report, "`copy_to_device_async` in `upload`"),
        "{:?}",
        report.failures
    );
}

#[test]
fn a_resident_weight_outside_the_seam_fails_and_is_not_the_seams() {
    let fx = Fixture::new();
    fx.append(
        "fam/src/lib.rs",
        "\npub fn resident_weight(n: u64) -> u64 {\n    n\n}\n\npub fn shadowed() -> u64 {\n    resident_weight(1)\n}\n",
    );
    let report = fx.reach(true);
    assert!(
        failures_mention(&report, "`resident_weight` is defined outside the seam"),
        "{:?}",
        report.failures
    );
    assert!(!report.found.calls.iter().any(|s| s.function == "shadowed"));
}

#[test]
fn the_seam_without_its_function_fails() {
    let fx = Fixture::new();
    fx.replace(
        "seam/src/gguf/file.rs",
        "fn tensor_borrow",
        "fn tensor_view",
    );
    fx.replace("app/src/main.rs", "m.tensor_borrow(3)", "m.tensor_view(3)");
    let report = fx.reach(true);
    assert!(
        failures_mention(&report, "the seam defines no `GgufModel::tensor_borrow`"),
        "{:?}",
        report.failures
    );

    // Nothing calls it at all: the audit sees nothing, which is no pass.
    let fx = Fixture::new();
    for (file, _) in FIXTURE
        .iter()
        .filter(|(f, _)| f.ends_with(".rs") && !f.starts_with("seam/src"))
    {
        let stub = if file.ends_with("main.rs") {
            "fn main() {}\n"
        } else {
            "\n"
        };
        fx.write(file, stub);
    }
    std::fs::remove_file(fx.path("fam/src/globbed.rs")).unwrap();
    let report = fx.reach(true);
    assert!(
        failures_mention(&report, "found no call of `resident_weight`"),
        "{:?}",
        report.failures
    );
}

#[test]
fn a_gate_line_without_a_binary_fails() {
    let fx = Fixture::new();
    fx.replace(
        "specs/residency.md",
        "- gate: package=seam test=gate selector=alpha\n",
        "- gate: selector=alpha\n- gate: package=seam selector=alpha\n- gate: package=seam test=nope selector=alpha\n\
         - gate: package=nope test=gate selector=alpha\n- the cases run\n",
    );
    let report = fx.gates();
    assert!(!report.passed());
    let errors: Vec<&str> = report
        .gates
        .iter()
        .map(|g| g.error.as_deref().unwrap_or(""))
        .collect();
    assert_eq!(errors.len(), 5, "{errors:?}");
    for e in &errors[..4] {
        assert!(e.starts_with("names no binary"), "{errors:?}");
    }
    assert!(
        errors[2].contains("no test target `nope` (its test targets: gate)"),
        "{errors:?}"
    );
    assert!(errors[4].contains("must be a gate line"), "{errors:?}");
    assert!(report.gates.iter().all(|g| g.executable.is_none()));

    // No gate at all is no pass either.
    fx.write(
        "specs/residency.md",
        "# Residency spec\n\n## Gates\n\nNone yet.\n",
    );
    let report = fx.gates();
    assert!(
        failures_mention(&report, "holds no gate line"),
        "{:?}",
        report.failures
    );
    fx.write("specs/residency.md", "# Residency spec\n");
    assert!(failures_mention(&fx.gates(), "has no section \"Gates\""));
}

#[test]
fn a_planted_selector_that_matches_nothing_fails_the_audit() {
    let fx = Fixture::new();
    fx.replace(
        "specs/residency.md",
        "- gate: package=seam test=gate selector=alpha\n",
        "- gate: package=seam test=gate selector=alpha\n\
         - gate: package=seam test=gate exact=alpha_one\n\
         - gate: package=seam test=gate selector=alpha_one_and_only\n\
         - gate: package=seam test=gate selector=gamma\n\
         - gate: package=seam test=broken selector=b\n",
    );
    // A test target that does not compile: its gate fails, the others are
    // still counted.
    fx.write(
        "seam/tests/broken.rs",
        "#[test]\nfn b() {\n    let _x: u8 = \"no\";\n}\n",
    );
    let report = fx.gates();
    let counts: Vec<(usize, usize, usize, bool)> = report
        .gates
        .iter()
        .map(|g| (g.total, g.matched, g.ignored, g.error.is_some()))
        .collect();
    assert_eq!(
        counts,
        [
            (3, 2, 0, false),
            (3, 1, 0, false),
            (3, 0, 0, true),
            (3, 1, 1, true),
            (0, 0, 0, true),
        ],
        "{}",
        super::render(&report)
    );
    assert!(
        failures_mention(&report, "seam/tests/broken.rs"),
        "{:?}",
        report.failures
    );
    assert!(failures_mention(&report, "its test binary did not build"));
    assert!(!report.passed());
    assert!(failures_mention(
        &report,
        "selector=alpha_one_and_only matches 0 of the binary's 3 tests"
    ));
    assert!(failures_mention(
        &report,
        "selector=gamma matches only ignored tests"
    ));
    let text = super::render(&report);
    assert!(
        text.contains("package=seam test=gate selector=alpha: 2 cases (of 3 tests)"),
        "{text}"
    );

    // Without the planted gates it passes, and the whole audit with it.
    fx.replace(
        "specs/residency.md",
        "- gate: package=seam test=gate selector=alpha_one_and_only\n",
        "",
    );
    fx.replace(
        "specs/residency.md",
        "- gate: package=seam test=gate selector=gamma\n",
        "",
    );
    fx.replace(
        "specs/residency.md",
        "- gate: package=seam test=broken selector=b\n",
        "",
    );
    std::fs::remove_file(fx.path("seam/tests/broken.rs")).unwrap();
    assert!(fx.gates().passed());
    assert!(fx.reach(true).passed());
    let all = run_with(
        fx.root(),
        &Options {
            target_dir: Some(fx.path("target")),
            ..Options::default()
        },
    )
    .unwrap();
    assert!(all.passed(), "{}", super::render(&all));
}

#[test]
fn checker_subcommands_refuse_empty_or_bad_arguments_with_status_2() {
    let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    for bad in [
        &["gate"][..],
        &["gate", "package=seam"],
        &["gate", "selector=x"],
        &["--root"],
        &["--frobnicate"],
        &["reaches"],
        &["reach", "extra"],
        &["gates", "--write"],
    ] {
        assert_eq!(super::main(&args(bad)), ExitCode::from(2), "{bad:?}");
    }
}

#[test]
fn the_real_workspace_reach_is_found() {
    let root = crate::workspace_root();
    let report = run_with(
        &root,
        &Options {
            write: false,
            reach: true,
            gates: false,
            target_dir: None,
        },
    )
    .unwrap();
    let load = report
        .found
        .calls
        .iter()
        .find(|s| s.file == "seam/src/session.rs" && s.what == "resident_weight");
    // The session stages through the seam (its function's name is the
    // session module's business).
    assert!(
        load.is_some_and(|s| s.function.starts_with("session::Session::") && !s.test_code),
        "{load:?}"
    );
    assert!(
        report
            .found
            .readers
            .iter()
            .any(|s| s.file == "seam/src/release.rs")
    );
    let spec = std::fs::read_to_string(root.join(super::spec::SPEC_PATH)).unwrap();
    let gates = super::spec::gates(&spec).unwrap();
    assert!(!gates.is_empty());
    for g in gates {
        assert!(g.parsed.is_ok(), "line {}: {:?}", g.line, g.parsed);
    }
    // `run` is the whole audit; its Reach part fails on what it must.
    let _: fn(&Path, bool) -> anyhow::Result<Report> = run;
}
