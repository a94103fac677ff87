//! What an operator of the `seam` binary sees, each as a child process:
//! progress bars on a terminal only and never with `--quiet`, `--quiet`
//! dropping the policy line (the JSON keeps it), a load on a device that
//! reads the file in place saying it staged nothing, every flag clap
//! refuses as one line and exit 2, and `seam demo --write` keeping the
//! demo model.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

#[path = "support/pty.rs"]
mod pty;

use pty::run_on_terminal;

const SEAM: &str = env!("CARGO_BIN_EXE_seam");

/// The demo model written to `dir`.
fn model(dir: &Path) -> PathBuf {
    let path = dir.join("m.gguf");
    seam_tools::demo::demo_model().write_file(&path).unwrap();
    path
}

/// `seam ARGS`, with bars drawn after `after_ms` (none: the default).
fn seam(args: &[&str], after_ms: Option<&str>) -> Command {
    let mut cmd = Command::new(SEAM);
    cmd.args(args);
    match after_ms {
        Some(ms) => cmd.env(seam_tools::cli::PROGRESS_AFTER_ENV, ms),
        None => cmd.env_remove(seam_tools::cli::PROGRESS_AFTER_ENV),
    };
    cmd
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("run seam")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Exit 2, nothing on stdout, and exactly the one stderr line
/// `seam: error: ...` starting with `says` after the prefix.
#[track_caller]
fn one_line(o: &Output, says: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "not one line:\n{err}");
    assert!(
        o.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let line = err
        .trim_end()
        .strip_prefix("seam: error: ")
        .unwrap_or_else(|| panic!("{err}"));
    assert!(line.starts_with(says), "expected {says:?}..., got {line:?}");
}

/// A bar for a load and for a hash on a terminal (drawn at once here:
/// `SEAM_PROGRESS_AFTER_MS=0`); none with `--quiet`, which leaves the
/// terminal empty; none where stderr is a pipe, which gets only lines;
/// none by default for work shorter than a second.
#[test]
fn bars_are_drawn_on_a_terminal_only_never_with_quiet_nor_for_quick_work() {
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path());
    let p = path.to_str().unwrap();
    for (args, label) in [
        (&["load", "--device", "fake", p][..], "load"),
        (&["load", "--device", "host", "--hash", p][..], "load"),
        (&["inspect", "--hash", p][..], "hash"),
    ] {
        let shown = run_on_terminal(&mut seam(args, Some("0")));
        assert!(shown.status.success(), "{args:?}: {}", shown.terminal);
        assert!(
            shown.terminal.contains(label) && shown.terminal.contains("\x1b["),
            "{args:?}: no bar drawn: {:?}",
            shown.terminal
        );

        let quiet = [&["--quiet"][..], args].concat();
        let quiet = run_on_terminal(&mut seam(&quiet, Some("0")));
        assert!(quiet.status.success(), "{args:?}: {}", quiet.terminal);
        assert_eq!(quiet.terminal, "", "{args:?} --quiet");
        assert!(!quiet.stdout.is_empty(), "{args:?}: no report");

        let piped = run(&mut seam(args, Some("0")));
        assert!(piped.status.success(), "{args:?}");
        let err = stderr(&piped);
        assert!(
            !err.contains('\x1b') && err.lines().all(|l| l.starts_with("seam: ")),
            "{args:?}: a bar on a pipe: {err:?}"
        );

        let quick = run_on_terminal(&mut seam(args, None));
        assert!(quick.status.success(), "{args:?}");
        assert!(
            !quick.terminal.contains('\x1b'),
            "{args:?}: a bar for work of milliseconds: {:?}",
            quick.terminal
        );
    }
    let bad = run(&mut seam(&["load", "--device", "fake", p], Some("soon")));
    one_line(
        &bad,
        "SEAM_PROGRESS_AFTER_MS=\"soon\": expected a number of milliseconds",
    );
}

/// `--quiet` (before or after the command) drops the policy line and the
/// demo notice; the JSON report still has every knob with its source.
#[test]
fn quiet_drops_the_policy_line_and_the_json_keeps_the_policy() {
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path());
    let p = path.to_str().unwrap();
    let loud = run(&mut seam(&["load", "--device", "fake", "--json", p], None));
    assert!(loud.status.success());
    assert!(
        stderr(&loud).starts_with("seam: policy: "),
        "{}",
        stderr(&loud)
    );
    for args in [
        &["load", "--quiet", "--device", "fake", "--json", p][..],
        &["-q", "load", "--device", "fake", "--json", p][..],
        &["load", "--device", "fake", "--json", "-q"][..],
    ] {
        let o = run(&mut seam(args, None));
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        assert_eq!(stderr(&o), "", "{args:?}");
        let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert!(
            report["policy_line"]
                .as_str()
                .unwrap()
                .starts_with("policy: "),
            "{args:?}"
        );
        assert_eq!(report["policy"]["mmap"]["source"], "built-in default");
    }
}

/// On the host nothing is staged: the text says so and gives the open's
/// time, not a rate; the JSON's `gbps` is null and `reads_in_place` true.
/// A staging device gets its rate.
#[test]
fn a_load_that_stages_nothing_says_so_instead_of_a_rate() {
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path());
    let p = path.to_str().unwrap();
    let text = run(&mut seam(&["load", "-q", "--device", "host", p], None));
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.starts_with("loaded 13 tensors, 1.9 MiB on host: staged nothing (the device reads the mapped file in place; opened in "),
        "{text}"
    );
    assert!(
        !text.contains("GB/s") && !text.contains("released"),
        "{text}"
    );

    let json = |device: &str| {
        let o = run(&mut seam(
            &["load", "-q", "--device", device, "--json", p],
            None,
        ));
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let host = json("host");
    assert_eq!(host["gbps"], serde_json::Value::Null, "{host}");
    assert_eq!(host["reads_in_place"], true);
    assert!(host["seconds"].as_f64().is_some() && host["open_seconds"].as_f64().is_some());
    let fake = json("fake");
    assert!(fake["gbps"].as_f64() > Some(0.0), "{fake}");
    assert_eq!(fake["reads_in_place"], false);
    let text = run(&mut seam(&["load", "-q", "--device", "fake", p], None));
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.starts_with("loaded 13 tensors, 1.9 MiB onto fake in ")
            && text.contains(" GB/s); released 1.9 MiB; "),
        "{text}"
    );
}

/// Whatever clap refuses (a value that looks like a flag, a missing or
/// bad value, a value for a switch, a conflict, a missing required flag,
/// an unknown command) is one line and exit 2; help and version are not
/// errors.
#[test]
fn every_flag_clap_refuses_is_one_line_and_exit_2() {
    let cases: [(&[&str], &str); 10] = [
        (
            &["load", "--steps", "-1"],
            "unexpected argument '--steps' found",
        ),
        (
            &["load", "--device"],
            "a value is required for '--device <DEVICE>' but none was supplied",
        ),
        (
            &["bench", "m.gguf", "--threads", "-1"],
            "unexpected argument '-1' found",
        ),
        (
            &["bench", "m.gguf", "--threads", "x"],
            "invalid value 'x' for '--threads <THREADS>': invalid digit found in string",
        ),
        (
            &["inspect", "--json=yes"],
            "unexpected value 'yes' for '--json' found; no more were expected",
        ),
        (
            &["load", "--device", "fake", "--devices", "fake,fake"],
            "the argument '--device <DEVICE>' cannot be used with '--devices <DEVICES>'",
        ),
        (
            &["load", "--shard", "rows"],
            "the following required arguments were not provided: --devices <DEVICES>",
        ),
        (
            &["demo"],
            "the following required arguments were not provided: --write <PATH>",
        ),
        (
            &["lod"],
            "unrecognized subcommand 'lod'; tip: a similar subcommand exists: 'load'",
        ),
        (&["--bogus", "load"], "unexpected argument '--bogus' found"),
    ];
    for (args, says) in cases {
        one_line(&run(&mut seam(args, None)), says);
    }
    for args in [&["--help"][..], &["load", "--help"], &["--version"]] {
        let o = run(&mut seam(args, None));
        assert!(o.status.success() && !o.stdout.is_empty(), "{args:?}");
    }
}

/// `seam demo --write PATH` keeps the demo model that `load` and
/// `inspect` use when given no FILE (their own copy is removed on exit);
/// a path that cannot be written is one line.
#[test]
fn demo_write_keeps_the_demo_model() {
    let dir = tempfile::tempdir().unwrap();
    let kept = dir.path().join("demo.gguf");
    let k = kept.to_str().unwrap();
    let o = run(&mut seam(&["demo", "--write", k], None));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).starts_with(&format!("seam: wrote the built-in demo model to {k} (")));
    let tensors = |args: &[&str]| {
        let o = run(&mut seam(args, None));
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        r["tensors"].clone()
    };
    let kept_tensors = tensors(&["inspect", "--json", "--hash", k]);
    assert_eq!(kept_tensors.as_array().map(Vec::len), Some(13));
    assert_eq!(
        kept_tensors,
        tensors(&["inspect", "-q", "--json", "--hash"])
    );
    // The temporary copy's notice says how to keep one.
    let o = run(&mut seam(&["inspect"], None));
    assert!(
        stderr(&o).contains("`seam demo --write PATH` keeps a copy"),
        "{}",
        stderr(&o)
    );

    let missing = dir.path().join("no/such/folder/demo.gguf");
    one_line(
        &run(&mut seam(
            &["demo", "--write", missing.to_str().unwrap()],
            None,
        )),
        &format!("--write {}: folder ", missing.display()),
    );
    one_line(
        &run(&mut seam(
            &["demo", "--write", dir.path().to_str().unwrap()],
            None,
        )),
        &format!("--write {}: is a directory", dir.path().display()),
    );
}
