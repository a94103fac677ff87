//! Hostile conditions around the header, each as a child process of the
//! `seam` binary: a model file truncated or rewritten while a load reads
//! it, special files given as the model, outputs over inputs or into
//! missing folders, one stderr line whatever fails, values the format
//! forbids, config errors, and text with control bytes.
//!
//! Faults are injected at a known point without a hook in the binary: the
//! child is held at its first stderr write (the policy line, printed once
//! the model is accepted and before any tensor is read; see
//! `support/held.rs`), the test changes the file, then lets the child go.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, SystemTime};

use seam::gguf::{GgmlType, GgufWriter, Value};

#[path = "support/held.rs"]
mod held;

use held::{assert_exit_2, spawn_held};

const SEAM: &str = env!("CARGO_BIN_EXE_seam");

/// A model of five F32 tensors, 3 MiB in all: four of 256 KiB (they take
/// the sink's direct path) and one of 2 MiB (it goes through the ring).
fn model(dir: &Path, name: &str) -> PathBuf {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", Value::String("hostile".into()));
    for i in 0..4u8 {
        let bytes = (0..256 << 10).map(|j: u32| (j as u8) ^ i).collect();
        w.add_tensor(format!("small.{i}"), GgmlType::F32, &[64 << 10], bytes)
            .unwrap();
    }
    let big = (0..2u32 << 20).map(|j| (j % 251) as u8).collect();
    w.add_tensor("big", GgmlType::F32, &[512 << 10], big)
        .unwrap();
    let path = dir.join(name);
    w.write_file(&path).unwrap();
    // An hour ago, so that any write now moves the modification time even
    // within the file system's timestamp granularity.
    let old = SystemTime::now() - Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(old)
        .unwrap();
    path
}

fn seam(args: &[&str]) -> Command {
    let mut cmd = Command::new(SEAM);
    cmd.args(args);
    cmd
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("run seam")
}

/// Exit 2 and exactly one stderr line starting with `prefix` and holding
/// every needle; nothing on stdout unless `stdout_ok`.
#[track_caller]
fn one_line(out: &Output, prefix: &str, needles: &[&str]) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(2),
        "status {:?}, stderr:\n{stderr}",
        out.status
    );
    assert!(
        stderr.ends_with('\n') && stderr.matches('\n').count() == 1,
        "not one line:\n{stderr}"
    );
    assert!(
        stderr.starts_with(prefix),
        "expected {prefix:?}..., got {stderr}"
    );
    for n in needles {
        assert!(stderr.contains(n), "expected {n:?} in {stderr}");
    }
    stderr
}

fn truncate(path: &Path, len: u64) {
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

// --- A file that changes under the load -------------------------------

/// Truncated while `seam load --device host --hash` reads the mapping: the
/// read faults (SIGBUS) and the handler turns it into one line, exit 2.
#[test]
fn truncated_under_a_host_load_with_hash_is_one_line_not_sigbus() {
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path(), "m.gguf");
    let p = path.to_str().unwrap();
    let held = spawn_held(&mut seam(&["load", "--device", "host", "--hash", p]));
    truncate(&path, 0);
    let out = held.release();
    assert_exit_2(
        &out,
        &format!("seam: error: {p}: the file changed while it was being read"),
        &["faulted", "truncated"],
    );
    assert!(
        out.stdout.is_empty(),
        "a report for a torn file: {}",
        out.stdout
    );
}

/// Truncated during a cold host load without `--hash`: nothing reads the
/// bytes, and the identity check after the pass refuses the load.
#[test]
fn truncated_under_a_host_load_without_hash_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path(), "m.gguf");
    let len = std::fs::metadata(&path).unwrap().len();
    let p = path.to_str().unwrap();
    let held = spawn_held(&mut seam(&["load", "--device", "host", "--json", p]));
    truncate(&path, 4096);
    let out = held.release();
    assert_exit_2(
        &out,
        &format!("seam: error: {p}: byte 0: file: the file changed while it was being read"),
        &[&format!("size {len} -> 4096 bytes")],
    );
    assert!(out.stdout.is_empty(), "{}", out.stdout);
}

/// Truncated under a sink load: small tensors fault in the direct path, the
/// large one reads short through the ring; either way one line, exit 2.
#[test]
fn truncated_under_a_sink_load_is_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path(), "m.gguf");
    let p = path.to_str().unwrap();
    for cut in [0, 2 << 20] {
        let path = model(dir.path(), "m.gguf");
        let held = spawn_held(&mut seam(&["load", "--device", "sink", "--hash", p]));
        truncate(&path, cut);
        let out = held.release();
        assert_exit_2(
            &out,
            &format!("seam: error: {p}"),
            &["the file changed while it was being read"],
        );
    }
}

/// A tensor rewritten in place during `load --hash`: the hashes would match
/// neither version, so the load fails naming the change (host and sink).
#[test]
fn rewritten_in_place_under_load_hash_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for device in ["host", "sink"] {
        let path = model(dir.path(), "m.gguf");
        let p = path.to_str().unwrap();
        let big = seam::gguf::GgufModel::open(&path, Default::default())
            .unwrap()
            .tensor("big")
            .unwrap()
            .offset;
        let held = spawn_held(&mut seam(&["load", "--device", device, "--hash", p]));
        let f = std::fs::File::options().write(true).open(&path).unwrap();
        f.write_all_at(&[0xAB; 4096], big + (1 << 20)).unwrap();
        drop(f);
        let out = held.release();
        assert_exit_2(
            &out,
            &format!("seam: error: {p}: byte 0: file: the file changed while it was being read"),
            &["modification time moved"],
        );
    }
}

/// `seam inspect --hash` reading a file truncated under its mapping: one
/// line and exit 2. Run in a child process (this test binary again, with
/// the binaries' handler installed), which opens the model, truncates it
/// and hashes it as `seam inspect --hash` does: the fault lands at a known
/// point.
#[test]
fn truncated_under_inspect_hash_is_one_line_not_sigbus() {
    const CHILD: &str = "SEAM_HOSTILE_INSPECT_CHILD";
    if let Some(path) = std::env::var_os(CHILD) {
        seam::borrow::fault::exit_on_fault_in_mapped_files("seam").unwrap();
        let model = seam::gguf::GgufModel::open(Path::new(&path), Default::default()).unwrap();
        truncate(Path::new(&path), 0);
        let text = seam_tools::inspect::tensor_hashes(&model, &|_, _| {});
        // Reached only if hashing did not fault: the parent sees status 0.
        println!("hashed a truncated file: {}", text.is_ok());
        std::process::exit(0);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path(), "m.gguf");
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "truncated_under_inspect_hash_is_one_line_not_sigbus",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, &path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{:?}: {stderr}", out.status);
    let line = format!(
        "seam: error: {}: the file changed while it was being read: reading byte ",
        path.display()
    );
    assert!(stderr.contains(&line), "{stderr}");
}

// --- Special files --------------------------------------------------------

/// A FIFO, a character device, a procfs file and a directory are refused
/// up front, naming what they are; the FIFO does not hang.
#[test]
fn special_files_are_refused_naming_why() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo.gguf");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path that lives for the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let cases = [
        (
            fifo.to_str().unwrap().to_owned(),
            "a FIFO (named pipe), not a regular file",
        ),
        (
            "/dev/zero".to_owned(),
            "a character device, not a regular file",
        ),
        ("/proc/self/status".to_owned(), "a file of procfs"),
        (
            dir.path().to_str().unwrap().to_owned(),
            "a directory, not a regular file",
        ),
    ];
    for (path, why) in &cases {
        for args in [
            vec!["inspect", path],
            vec!["load", "--device", "host", path],
        ] {
            let mut child = seam(&args)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let start = std::time::Instant::now();
            while child.try_wait().unwrap().is_none() {
                if start.elapsed() > Duration::from_secs(60) {
                    let _ = child.kill();
                    panic!("seam {args:?} hangs");
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let out = child.wait_with_output().unwrap();
            one_line(
                &out,
                &format!("seam: error: {path}: byte 0: file: "),
                &[why],
            );
        }
    }
}

// --- Outputs and inputs --------------------------------------------------------

/// `--plot`/`--trace` naming the model (itself, a hard link, a symbolic
/// link) are refused before the load; the model is untouched.
#[test]
fn outputs_over_the_model_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path(), "m.gguf");
    let before = std::fs::read(&path).unwrap();
    let hard = dir.path().join("hard.svg");
    std::fs::hard_link(&path, &hard).unwrap();
    let soft = dir.path().join("soft.csv");
    std::os::unix::fs::symlink(&path, &soft).unwrap();
    let p = path.to_str().unwrap();
    for (flag, out) in [
        ("--plot", p),
        ("--plot", hard.to_str().unwrap()),
        ("--trace", soft.to_str().unwrap()),
    ] {
        let o = run(&mut seam(&["load", "--device", "host", p, flag, out]));
        one_line(
            &o,
            &format!("seam: error: {flag} {out}: is the input {p}"),
            &["refusing to overwrite it"],
        );
        assert!(o.stdout.is_empty());
    }
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "the model was overwritten"
    );
}

/// An output into a missing folder fails before the load (no policy line,
/// no report), naming the path.
#[test]
fn outputs_into_missing_folders_fail_before_the_load() {
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path(), "m.gguf");
    let missing = dir.path().join("no/such/dir/t.csv");
    let m = missing.to_str().unwrap();
    for flag in ["--trace", "--plot"] {
        let o = run(&mut seam(&[
            "load",
            "--device",
            "host",
            path.to_str().unwrap(),
            flag,
            m,
        ]));
        one_line(
            &o,
            &format!("seam: error: {flag} {m}: folder "),
            &["no/such/dir"],
        );
    }
}

/// An output that fails while written (a full disk: `/dev/full`) still
/// leaves the report on stdout, then one line and exit 2.
#[test]
fn a_failed_output_still_prints_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path(), "m.gguf");
    let o = run(&mut seam(&[
        "load",
        "--device",
        "host",
        "--json",
        path.to_str().unwrap(),
        "--trace",
        "/dev/full",
    ]));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(
        stderr
            .lines()
            .last()
            .unwrap()
            .starts_with("seam: error: --trace /dev/full: "),
        "{stderr}"
    );
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).expect("the report");
    assert_eq!(report["tensors"], 5);
}

// --- One stderr line ----------------------------------------------------------

/// A bad file through `seam load`: one line, its error; the policy line
/// comes only with an accepted file.
#[test]
fn a_bad_file_through_load_is_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.gguf");
    std::fs::write(&bad, b"GGML\x03\0\0\0").unwrap();
    let b = bad.to_str().unwrap();
    for device in ["host", "sink", "fake"] {
        let o = run(&mut seam(&["load", "--device", device, b]));
        one_line(&o, &format!("seam: error: {b}: byte 0: magic: "), &[]);
    }
    let good = model(dir.path(), "m.gguf");
    let o = run(&mut seam(&[
        "load",
        "--device",
        "host",
        good.to_str().unwrap(),
    ]));
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("policy: "));
}

// --- Values checked to the format -----------------------------------------

/// A bool of value 2 is refused, naming the field.
#[test]
fn a_bool_of_value_2_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = GgufWriter::new();
    w.add_metadata("test.flag", Value::Bool(true));
    let mut bytes = w.to_bytes();
    let tag = b"test.flag\x07\0\0\0\x01";
    let at = bytes.windows(tag.len()).position(|x| x == tag).unwrap() + tag.len() - 1;
    bytes[at] = 2;
    let path = dir.path().join("bool.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let p = path.to_str().unwrap();
    let o = run(&mut seam(&["inspect", p]));
    one_line(
        &o,
        &format!("seam: error: {p}: byte {at}: metadata[0] \"test.flag\" value: "),
        &["bool of value 2 (0 or 1 only)"],
    );
}

/// The second shard's split metadata: `split.no`, `split.count`,
/// `split.tensors.count` and the architecture it names, if any.
struct Second(u16, u16, i32, Option<&'static str>);

/// Writes a two-shard model of architecture "llama" whose second shard
/// says `second`.
fn split_pair(dir: &Path, second: &Second) -> PathBuf {
    let shard = |no: u16, count: u16, tensors: i32, arch: Option<&str>, tensor: &str| {
        let mut w = GgufWriter::new();
        if let Some(arch) = arch {
            w.add_metadata("general.architecture", Value::String(arch.into()));
        }
        w.add_metadata("split.no", Value::U16(no))
            .add_metadata("split.count", Value::U16(count))
            .add_metadata("split.tensors.count", Value::I32(tensors));
        w.add_tensor(tensor, GgmlType::F32, &[8], vec![0; 32])
            .unwrap();
        w
    };
    let first = dir.join("s-00001-of-00002.gguf");
    shard(0, 2, 2, Some("llama"), "a")
        .write_file(&first)
        .unwrap();
    let Second(no, count, tensors, arch) = *second;
    shard(no, count, tensors, arch, "b")
        .write_file(&dir.join("s-00002-of-00002.gguf"))
        .unwrap();
    first
}

/// Split shards must agree on the count, the tensor count and (where a
/// shard names one) the architecture; a wrong `split.no` names the value.
#[test]
fn split_shards_that_disagree_are_refused() {
    let cases = [
        (
            Second(1, 3, 2, None),
            "split.count",
            "3 here, 2 in the first shard",
        ),
        (
            Second(1, 2, 2, Some("gemma3")),
            "general.architecture",
            "\"gemma3\" here, \"llama\" in the first shard",
        ),
        (
            Second(1, 2, 7, None),
            "split.tensors.count",
            "7 here, 2 in the first shard",
        ),
        (Second(0, 2, 2, None), "split.no", "expected 1, found 0"),
    ];
    for (second, key, why) in &cases {
        let dir = tempfile::tempdir().unwrap();
        let first = split_pair(dir.path(), second);
        let o = run(&mut seam(&["inspect", first.to_str().unwrap()]));
        let line = one_line(
            &o,
            "seam: error: ",
            &[&format!("metadata \"{key}\": {why}")],
        );
        assert!(!line.contains("Some("), "{line}");
    }
    // Shards that agree open (the first shard alone names the architecture,
    // as llama.cpp's gguf-split writes them, or both name the same).
    for second in [Second(1, 2, 2, None), Second(1, 2, 2, Some("llama"))] {
        let dir = tempfile::tempdir().unwrap();
        let first = split_pair(dir.path(), &second);
        let o = run(&mut seam(&["inspect", first.to_str().unwrap()]));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
}

/// Config value errors name the config file and key, not an environment
/// variable; duplicate keys and quoted numbers are refused.
#[test]
fn config_errors_name_the_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path(), "m.gguf");
    let config = dir.path().join("c.json");
    let c = config.to_str().unwrap();
    for (text, needles) in [
        (
            r#"{"vllm_cpp.pinned_h2d.mib": 5000}"#,
            vec![format!(
                "{c}: config key vllm_cpp.pinned_h2d.mib: cannot read \"5000\""
            )],
        ),
        (
            r#"{"vllm_cpp.pinned_h2d.buffers": "4"}"#,
            vec![format!(
                "{c}: config key vllm_cpp.pinned_h2d.buffers: cannot read"
            )],
        ),
        (
            r#"{"vllm_cpp.mmap.prefault": true, "vllm_cpp.mmap.prefault": false}"#,
            vec![format!("{c}: duplicate key \"vllm_cpp.mmap.prefault\"")],
        ),
        (
            r#"{"vllm_cpp.mmap.prefault": true, "vllm_cpp": {"mmap": {"prefault": false}}}"#,
            vec![format!(
                "{c}: key \"vllm_cpp.mmap.prefault\" is given twice"
            )],
        ),
    ] {
        std::fs::write(&config, text).unwrap();
        let o = run(seam(&[
            "load",
            "--device",
            "host",
            path.to_str().unwrap(),
            "--config",
            c,
        ])
        .env_remove("VT_PINNED_H2D_MIB")
        .env_remove("VT_PINNED_H2D_BUFFERS")
        .env_remove("VT_GGUF_PREFAULT"));
        let needles: Vec<&str> = needles.iter().map(String::as_str).collect();
        let line = one_line(&o, "seam: error: ", &needles);
        assert!(!line.contains("VT_"), "{line}");
    }
}

// --- Text for people ------------------------------------------------------------

/// Key and tensor names with ESC, CR and NUL are shown escaped.
#[test]
fn inspect_text_escapes_control_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = GgufWriter::new();
    w.add_metadata("evil\u{1b}[2J\rkey\0", Value::U32(1));
    w.add_tensor("t\u{1b}]0;title\u{7}\r", GgmlType::F32, &[8], vec![0; 32])
        .unwrap();
    let path = dir.path().join("evil.gguf");
    w.write_file(&path).unwrap();
    let o = run(&mut seam(&["inspect", path.to_str().unwrap()]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(
        !text.chars().any(|c| c.is_control() && c != '\n'),
        "raw control bytes reach the terminal: {text:?}"
    );
    assert!(text.contains("evil\\u{1b}[2J\\rkey\\0"), "{text}");
    assert!(text.contains("t\\u{1b}]0;title\\u{7}\\r"), "{text}");
}

/// Messages for people: the magic as text and hex, a directory called a
/// directory.
#[test]
fn messages_show_magic_as_text_and_hex() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ggml.gguf");
    std::fs::write(&path, b"GGML\x03\0\0\0\0\0\0\0").unwrap();
    let o = run(&mut seam(&["inspect", path.to_str().unwrap()]));
    let line = one_line(&o, "seam: error: ", &["magic \"GGML\" (47 47 4d 4c)"]);
    assert!(!line.contains("[71,"), "{line}");
}

// --- Small friction ---------------------------------------------------------------

/// `seam load --hash` without `--json` prints each tensor's hash.
#[test]
fn load_hash_without_json_prints_the_hashes() {
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path(), "m.gguf");
    let o = run(&mut seam(&[
        "load",
        "--device",
        "host",
        "--hash",
        path.to_str().unwrap(),
    ]));
    assert!(o.status.success());
    let text = String::from_utf8(o.stdout).unwrap();
    let gguf = seam::gguf::GgufModel::open(&path, Default::default()).unwrap();
    for t in gguf.tensors() {
        let h = seam_tools::inspect::sha256_hex_releasing(&gguf.tensor_borrow(t).unwrap());
        assert!(
            text.contains(&format!("{h}  {}\n", t.name)),
            "{}: {text}",
            t.name
        );
    }
}

/// `seam bench` on a file that is no GGUF: one line naming the file, the
/// offset and the field, exit 2, no table (it printed nine error lines, a
/// table of dashes and exited 0).
#[test]
fn bench_of_a_file_that_is_no_model_is_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.gguf");
    std::fs::write(&path, "these are notes, not a model\n").unwrap();
    let o = run(&mut seam(&[
        "bench",
        path.to_str().unwrap(),
        "--device",
        "host",
        "--repeat",
        "1",
    ]));
    one_line(&o, "seam: error: ", &["notes.gguf", "byte 0", "magic"]);
    assert!(
        o.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
}

/// `seam doctor --json` is JSON naming the machine.
#[test]
fn doctor_json_is_json() {
    let o = run(&mut seam(&["doctor", "--json"]));
    assert!(o.status.success());
    let items: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
    assert!(items.iter().any(|i| i["subject"] == "machine"), "{items:?}");
}

/// The demo model's temporary file is removed when the load is ended by
/// SIGTERM or SIGINT (held at its first stderr line, the demo notice).
#[test]
fn the_demo_file_is_removed_on_sigterm_and_sigint() {
    for signal in [libc::SIGTERM, libc::SIGINT] {
        let held = spawn_held(&mut seam(&["load", "--device", "host"]));
        let file = std::env::temp_dir().join(format!("seam-demo-{}.gguf", held.pid()));
        assert!(file.exists(), "{} was not written", file.display());
        let status = held.signal(signal);
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(signal), "{status:?}");
        assert!(!file.exists(), "{} left behind", file.display());
    }
}

/// The report's two released figures have two names: `released_bytes`
/// (the weights' spans) and `counts.released_page_bytes` (whole pages).
#[test]
fn released_figures_do_not_share_a_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path(), "m.gguf");
    let o = run(&mut seam(&[
        "load",
        "--device",
        "fake",
        "--json",
        path.to_str().unwrap(),
    ]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["released_bytes"], 3 << 20);
    assert!(report["counts"]["released_page_bytes"].is_u64(), "{report}");
    assert!(report["counts"].get("released_bytes").is_none(), "{report}");
}
