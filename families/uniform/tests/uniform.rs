//! The five family binaries run through the one driver: given the same
//! arguments, their reports have the same top-level keys
//! (`family_kit::driver::REPORT_KEYS`) and the same `decode` keys; the same
//! bad input gets the same one line (after the binary's name) and exit
//! status 2; and `--dump-logits` writes what each family's own library
//! greedy loop computes for the last position fed (what the binaries wrote
//! before the driver). What an operator sees is the same for the five: a
//! progress bar on a terminal only and never with `--quiet`, which also
//! drops the policy line (the JSON keeps it), the prefill's and the
//! decode's tokens/s, and the sink refused up front.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output};

use seam::gguf::GgufModel;
use seam::platform::Platform;

#[path = "../../../tests/support/pty.rs"]
mod pty;

/// (family name, binary) of the five.
const BINARIES: [(&str, &str); 5] = [
    ("qwen4_exp", env!("CARGO_BIN_EXE_uniform-qwen4_exp")),
    ("glm5_next", env!("CARGO_BIN_EXE_uniform-glm5_next")),
    ("glm_moe_dsa", env!("CARGO_BIN_EXE_uniform-glm_moe_dsa")),
    ("muse_glimmer", env!("CARGO_BIN_EXE_uniform-muse_glimmer")),
    ("dflash", env!("CARGO_BIN_EXE_uniform-dflash")),
];

/// The families whose host pass computes llama.cpp's flash attention
/// (`--flash-attn on`); the others refuse it in one line.
const FLASH_ATTENTION: [&str; 3] = ["glm5_next", "glm_moe_dsa", "muse_glimmer"];

/// The keys of the report's `decode`.
const DECODE_KEYS: [&str; 12] = [
    "steps",
    "prompt_tokens",
    "generated_tokens",
    "prefill_seconds",
    "prefill_tokens_per_second",
    "seconds",
    "tokens_per_second",
    "read_back_bytes",
    "weight_read_back_bytes",
    "host_transfers",
    "kernel_launches",
    "stage",
];

fn run(bin: &str, args: &[&str]) -> Output {
    Command::new(bin)
        .args(args)
        .output()
        .expect("the binary runs")
}

fn keys(v: &serde_json::Value) -> BTreeSet<String> {
    v.as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .cloned()
        .collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| (*s).to_owned()).collect()
}

/// The families that decode through a device's op layer where it has one
/// (the others run the host path on every device).
const DEVICE_PATH: &[&str] = &[
    "qwen4_exp",
    "dflash",
    "muse_glimmer",
    "glm_moe_dsa",
    "glm5_next",
];

/// The families whose device path can stage every expert stack whole
/// (`--stage all`).
const STAGES_ALL: &[&str] = &["qwen4_exp", "dflash", "glm_moe_dsa", "glm5_next"];

#[test]
fn the_same_arguments_give_reports_with_the_same_keys() {
    for (name, bin) in BINARIES {
        let out = run(bin, &["--device", "fake", "--steps", "2", "--json"]);
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
        assert_eq!(keys(&r), set(&family_kit::driver::REPORT_KEYS), "{name}");
        assert_eq!(keys(&r["decode"]), set(&DECODE_KEYS), "{name}");
        assert_eq!(r["family"]["name"], name);
        assert_eq!(r["device"], "fake", "{name}");
        assert_eq!(r["prompt"], serde_json::json!([1, 2, 3]), "{name}");
        assert_eq!(r["steps"], 2, "{name}");
        assert_eq!(r["generated"].as_array().map(Vec::len), Some(2), "{name}");
        let d = &r["decode"];
        assert_eq!(d["steps"], 2, "{name}");
        assert_eq!(d["prompt_tokens"], 3, "{name}");
        let back = d["weight_read_back_bytes"].as_array().expect("per call");
        assert_eq!(back.len(), 2, "{name}: {d}");
        if DEVICE_PATH.contains(&name) {
            // One prefill and one step through the fake device's op layer:
            // kernels launched, activations read back, no staged weight.
            assert!(back.iter().all(|b| b.as_u64() == Some(0)), "{name}: {d}");
            let launches = d["kernel_launches"].as_array().expect("per call");
            assert!(launches.iter().all(|k| k.as_u64() > Some(0)), "{name}: {d}");
            let read = d["read_back_bytes"].as_array().expect("per call");
            assert!(read.iter().all(|b| b.as_u64() > Some(0)), "{name}: {d}");
        } else {
            // One prefill and one step, each reading staged weights back
            // on the fake staging device (the host path), launching no
            // kernel.
            assert!(back.iter().all(|b| b.as_u64() > Some(0)), "{name}: {d}");
            assert_eq!(d["read_back_bytes"], d["weight_read_back_bytes"], "{name}");
            assert_eq!(d["kernel_launches"], serde_json::json!([0, 0]), "{name}");
        }
        assert!(d["tokens_per_second"].as_f64() > Some(0.0), "{name}: {d}");
        let mut uploads = r["seam"]["uploads"].as_u64().expect("uploads");
        if name == "dflash" {
            // The draft's own weights are staged after the decode, by the
            // speculation.
            let own = r["family"]["census"]["own_tensors"]
                .as_u64()
                .expect("own tensors");
            assert!(uploads > own, "{name}: {}", r["seam"]);
            uploads -= own;
        }
        let transfers: u64 = d["host_transfers"]
            .as_array()
            .expect("per call")
            .iter()
            .map(|t| t.as_u64().expect("a count"))
            .sum();
        assert!(transfers > uploads && uploads > 0, "{name}: {d}");

        // The text report prints the prefill's and the decode's tokens/s.
        let out = run(bin, &["--device", "fake", "--steps", "3"]);
        let text = String::from_utf8_lossy(&out.stdout);
        let speeds = text
            .split_once("; prefill 3 tokens in ")
            .map(|(_, rest)| rest.split(" tokens/s").count() - 1);
        assert!(
            out.status.success()
                && speeds >= Some(2)
                && text.contains(" tokens/s), decode ")
                && text.contains(" tokens/s (2 steps in "),
            "{name}: {text}"
        );
    }
}

/// Each bad input, and what the one line says after `NAME: error: `.
#[test]
fn the_same_bad_input_gets_the_same_line_and_exit_2() {
    let cases: [(&[&str], &str); 13] = [
        (
            &["--steps", "-1"],
            "invalid value '-1' for '--steps <STEPS>': invalid digit found in string",
        ),
        (
            &["--steps"],
            "a value is required for '--steps <STEPS>' but none was supplied",
        ),
        (
            &["--json=yes"],
            "unexpected value 'yes' for '--json' found; no more were expected",
        ),
        (&["a.gguf", "b.gguf"], "unexpected argument 'b.gguf' found"),
        (&["--bogus"], "unexpected argument '--bogus'"),
        (
            &["--device", "sink"],
            "--device sink: the sink keeps no weight to read back, and a decode reads them \
             (`seam load --device sink` measures what a load costs the host)",
        ),
        (
            &["--tokens", "1,x"],
            "--tokens \"1,x\": expected comma-separated token ids, e.g. 1,2,3",
        ),
        (&["--device", "warp"], "--device \"warp\": unknown device"),
        (
            &["--layers", "3"],
            "the following required arguments were not provided:",
        ),
        (
            &["--write-generated", "never-written.gguf", "--layers", "0"],
            "--layers: a generated model needs a layer",
        ),
        (
            &[
                "--write-generated",
                "never-written.gguf",
                "--layers",
                "4000000000",
            ],
            "--layers 4000000000: a generated model has at most 1024 layers",
        ),
        (
            &["/nonexistent/m.gguf", "--device", "host"],
            "/nonexistent/m.gguf: ",
        ),
        (
            &["--device", "host", "--tokens", "1,999999"],
            "--tokens: token 999999 is not below the vocabulary size ",
        ),
    ];
    for (args, says) in cases {
        let mut lines = BTreeSet::new();
        for (name, bin) in BINARIES {
            let out = run(bin, args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{name} {args:?}: {err}");
            assert_eq!(
                err.lines().count(),
                1,
                "{name} {args:?}: not one line: {err}"
            );
            assert!(out.stdout.is_empty(), "{name} {args:?}");
            let line = err
                .trim_end()
                .strip_prefix(&format!("{name}: error: "))
                .unwrap_or_else(|| panic!("{name} {args:?}: {err}"));
            assert!(line.starts_with(says), "{name} {args:?}: {line}");
            // The vocabularies differ; every other line is the same.
            lines.insert(line.split(" vocabulary size ").next().map(str::to_owned));
        }
        assert_eq!(lines.len(), 1, "{args:?}: {lines:?}");
    }
}

/// `--write-generated` writes the benchmark's model of the public
/// checkpoint's sizes for the four families that have one (each family's
/// tests check its tensor table); dflash, a draft head with no checkpoint
/// of its own, refuses it in one line and writes nothing.
#[test]
fn write_generated_is_refused_in_one_line_where_a_family_has_no_generated_model() {
    let dir = tempfile::tempdir().unwrap();
    let out_path = dir.path().join("g.gguf");
    let out = run(
        env!("CARGO_BIN_EXE_uniform-dflash"),
        &["--write-generated", out_path.to_str().unwrap()],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(
        err.trim_end(),
        "dflash: error: --write-generated: dflash has no generated model of its public checkpoint"
    );
    assert!(!out_path.exists());
}

/// `--quiet` drops every stderr line of a run that succeeds (the policy
/// line among them); the JSON report keeps the policy.
#[test]
fn quiet_drops_the_policy_line_and_the_json_keeps_it() {
    for (name, bin) in BINARIES {
        let loud = run(bin, &["--device", "fake", "--steps", "1"]);
        let err = String::from_utf8_lossy(&loud.stderr);
        assert!(
            err.lines()
                .any(|l| l.starts_with(&format!("{name}: policy: "))),
            "{name}: {err}"
        );
        let out = run(bin, &["-q", "--device", "fake", "--steps", "1", "--json"]);
        assert!(out.status.success(), "{name}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), "", "{name}");
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert!(
            r["policy"]
                .as_str()
                .is_some_and(|p| p.starts_with("policy: mmap=")),
            "{name}: {}",
            r["policy"]
        );
    }
}

/// A bar on a terminal for the load and the decode (drawn at once here:
/// `SEAM_PROGRESS_AFTER_MS=0`), none with `--quiet` (the terminal stays
/// empty), none on a pipe; `--help` does not offer the sink.
#[test]
fn a_bar_on_a_terminal_only_and_never_with_quiet() {
    for (name, bin) in BINARIES {
        let on_terminal = |args: &[&str]| {
            let out = pty::run_on_terminal(
                Command::new(bin)
                    .args(args)
                    .env(seam_tools::cli::PROGRESS_AFTER_ENV, "0"),
            );
            assert!(out.status.success(), "{name} {args:?}: {}", out.terminal);
            assert!(!out.stdout.is_empty(), "{name} {args:?}: no report");
            out.terminal
        };
        let shown = on_terminal(&["--device", "fake", "--steps", "3"]);
        assert!(
            shown.contains("\x1b[") && shown.contains("decode") && shown.contains("/3 tokens"),
            "{name}: no decode bar: {shown:?}"
        );
        assert_eq!(
            on_terminal(&["--device", "fake", "--steps", "3", "-q"]),
            "",
            "{name}"
        );
        let piped = Command::new(bin)
            .args(["--device", "fake", "--steps", "3"])
            .env(seam_tools::cli::PROGRESS_AFTER_ENV, "0")
            .output()
            .expect("the binary runs");
        let err = String::from_utf8_lossy(&piped.stderr);
        assert!(
            piped.status.success() && !err.contains('\x1b'),
            "{name}: {err:?}"
        );
        let help = run(bin, &["--help"]);
        let help = String::from_utf8_lossy(&help.stdout);
        assert!(
            help.contains("--device") && !help.contains("sink"),
            "{name}: {help}"
        );
    }
}

/// `--stage all` stages every stack before the first token where the
/// family's device path can (qwen4_exp, glm_moe_dsa, glm5_next, and dflash's qwen4exp target: the
/// report says so, nothing of a weight comes back); elsewhere it is one
/// line and exit 2, and so is asking it of a device without an op layer.
#[test]
fn stage_all_is_taken_where_the_device_path_has_it_and_refused_in_one_line_elsewhere() {
    let one_line = |name: &str, args: &[&str], says: &str| {
        let bin = BINARIES.iter().find(|(n, _)| *n == name).unwrap().1;
        let out = run(bin, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name} {args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{name} {args:?}: {err}");
        assert!(out.stdout.is_empty(), "{name} {args:?}");
        assert_eq!(
            err.trim_end(),
            format!("{name}: error: {says}"),
            "{name} {args:?}"
        );
    };
    for (name, _) in BINARIES.iter().filter(|(n, _)| !STAGES_ALL.contains(n)) {
        one_line(
            name,
            &["--device", "fake", "--stage", "all"],
            &format!("--stage all: {name} stages experts on their first pick only"),
        );
    }
    one_line(
        "qwen4_exp",
        &["--device", "host", "--stage", "all"],
        "--stage all needs a device op layer, and host has none (the host path stages experts on their first pick)",
    );
    one_line(
        "qwen4_exp",
        &["--device", "fake", "--stage", "some"],
        "invalid value 'some' for '--stage <picked|all>': \"some\" is not picked or all",
    );
    for (name, bin) in BINARIES.iter().filter(|(n, _)| STAGES_ALL.contains(n)) {
        let out = run(
            bin,
            &[
                "--device", "fake", "--stage", "all", "--json", "--steps", "3",
            ],
        );
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(report["decode"]["stage"], "all", "{name}");
        assert_eq!(report["decode"]["weight_read_back_bytes"][2], 0, "{name}");
        let default = run(bin, &["--device", "fake", "--json", "--steps", "1"]);
        let default: serde_json::Value = serde_json::from_slice(&default.stdout).expect("json");
        assert_eq!(default["decode"]["stage"], "picked", "{name}");
    }
}

/// The logits a family's library greedy loop computes on the host for the
/// last position fed, `prompt` then `steps` greedy tokens, over `path`.
fn library_logits(name: &str, path: &Path, prompt: &[u32], steps: usize) -> Vec<f32> {
    let gguf = GgufModel::open(path, Default::default()).expect("open the fixture");
    let host = platform_host::HostPlatform::new();
    let queue = host.backend().create_queue().expect("queue");
    let reader = || family_kit::WeightReader::new(&host, &*queue);
    let last = |all: Vec<Vec<f32>>| all.last().cloned().expect("logits");
    // The binaries' default numerics (llama.cpp's: F16 caches).
    let numerics = family_kit::Numerics::default();
    match name {
        "qwen4_exp" => {
            let model = qwen4_exp::Qwen4Exp::load(&gguf).expect("load");
            let weights = qwen4_exp::engine::SeamWeights::new(&model, &gguf, &host, &*queue);
            qwen4_exp::engine::greedy(weights, numerics, prompt, steps)
                .expect("greedy")
                .1
        }
        "glm5_next" => {
            let model = glm5_next::Glm5Next::load(&gguf).expect("load");
            let out =
                glm5_next::forward::greedy(&model, reader(), numerics, prompt, steps, &mut || {});
            last(out.expect("greedy").logits)
        }
        "glm_moe_dsa" => {
            let model = glm_moe_dsa::GlmMoeDsa::load(&gguf).expect("load");
            let out =
                glm_moe_dsa::forward::greedy(&model, reader(), numerics, prompt, steps, &mut || {});
            last(out.expect("greedy").logits)
        }
        "muse_glimmer" => {
            let model = muse_glimmer::MuseGlimmer::load(&gguf).expect("load");
            let mut decoder = muse_glimmer::forward::Decoder::new(&model, &host, &*queue, numerics)
                .expect("decoder");
            let out = muse_glimmer::forward::greedy(&mut decoder, prompt, steps, &mut || {});
            last(out.expect("greedy").1)
        }
        other => panic!("no library loop for {other}"),
    }
}

fn written(dir: &Path, stem: &str, writer: &seam::gguf::GgufWriter) -> std::path::PathBuf {
    let path = dir.join(format!("{stem}.gguf"));
    writer.write_file(&path).expect("write the fixture");
    path
}

#[test]
fn dump_logits_are_what_each_family_library_computes_for_the_last_position_fed() {
    use family_kit::Family;
    let dir = tempfile::tempdir().expect("tempdir");
    let qwen = written(
        dir.path(),
        "qwen4_exp",
        &qwen4_exp::Qwen4ExpFamily::fixture(),
    );
    let files = [
        ("qwen4_exp", qwen.clone()),
        (
            "glm5_next",
            written(dir.path(), "glm5", &glm5_next::Glm5NextFamily::fixture()),
        ),
        (
            "glm_moe_dsa",
            written(dir.path(), "dsa", &glm_moe_dsa::GlmMoeDsaFamily::fixture()),
        ),
        (
            "muse_glimmer",
            written(
                dir.path(),
                "muse",
                &muse_glimmer::MuseGlimmerFamily::fixture(),
            ),
        ),
        (
            "dflash",
            written(dir.path(), "draft", &dflash::DflashFamily::fixture()),
        ),
    ];
    let dump = dir.path().join("logits.f32");
    let d = dump.to_str().expect("utf-8 path");
    for ((name, bin), (fam, file)) in BINARIES.into_iter().zip(&files) {
        assert_eq!(name, *fam);
        let f = file.to_str().expect("utf-8 path");
        // dflash decodes with its target's greedy pass.
        let (model_file, extra): (&Path, Vec<&str>) = match name {
            "dflash" => (&qwen, vec!["--target", qwen.to_str().expect("utf-8")]),
            _ => (file, vec![]),
        };
        for steps in [1, 3] {
            let s = steps.to_string();
            let mut args = vec![f, "--device", "host", "--tokens", "5,1,2", "--steps", &s];
            args.extend(&extra);
            args.extend(["--dump-logits", d]);
            let out = run(bin, &args);
            assert!(
                out.status.success(),
                "{name}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let bytes = std::fs::read(&dump).expect("the dump");
            let got: Vec<f32> = bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
                .collect();
            let library = if name == "dflash" { "qwen4_exp" } else { name };
            let want = library_logits(library, model_file, &[5, 1, 2], steps);
            assert!(!want.is_empty(), "{name}");
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{name}, {steps} steps: the dump is not the library's last logits"
            );
        }
    }
}

/// The numerics knobs (issue 27): every binary takes `--cache-type-k/-v`
/// and `--flash-attn`, else `VT_CACHE_TYPE_K/V` and `VT_FLASH_ATTN`, else
/// llama.cpp's defaults (f16 caches, no flash attention); the policy line
/// (on stderr and in the report) names each value and its source; a bad
/// value, and flash attention where a pass has none, is one line and exit
/// 2; where a pass has it, `--flash-attn on` decodes and says so.
#[test]
fn cache_types_and_flash_attention_are_knobs_named_in_the_policy_line() {
    for (name, bin) in BINARIES {
        let one_line = |out: &Output, says: &str| {
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{name}: {err}");
            assert_eq!(err.lines().count(), 1, "{name}: {err}");
            assert!(out.stdout.is_empty(), "{name}");
            assert!(err.contains(says), "{name}: {err}");
        };
        one_line(
            &run(bin, &["--device", "host", "--cache-type-k", "q8"]),
            "invalid value 'q8' for '--cache-type-k <f16|bf16|f32>'",
        );
        let bad_env = Command::new(bin)
            .args(["--device", "host"])
            .env("VT_CACHE_TYPE_V", "q4")
            .output()
            .unwrap();
        one_line(
            &bad_env,
            "VT_CACHE_TYPE_V: cannot read \"q4\" as a cache type (f16, bf16, f32)",
        );
        let flash = run(
            bin,
            &["--device", "host", "--steps", "1", "--flash-attn", "on"],
        );
        if FLASH_ATTENTION.contains(&name) {
            let err = String::from_utf8_lossy(&flash.stderr);
            assert!(flash.status.success(), "{name}: {err}");
            assert!(
                err.contains("flash_attn=on (flag --flash-attn)"),
                "{name}: {err}"
            );
        } else {
            one_line(&flash, "has no flash attention");
        }
        let out = Command::new(bin)
            .args(["--device", "host", "--json", "--steps", "1"])
            .args(["--cache-type-k", "f32"])
            .env("VT_CACHE_TYPE_V", "bf16")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}: {err}");
        let said = "cache_type_k=f32 (flag --cache-type-k) cache_type_v=bf16 (env VT_CACHE_TYPE_V) flash_attn=off (built-in default)";
        assert!(err.contains(said), "{name}: {err}");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let policy = report["policy"].as_str().unwrap();
        assert!(policy.ends_with(said), "{name}: {policy}");
        let default = run(bin, &["--device", "host", "--steps", "1"]);
        let err = String::from_utf8_lossy(&default.stderr);
        assert!(
            err.contains("cache_type_k=f16 (built-in default) cache_type_v=f16 (built-in default)"),
            "{name}: {err}"
        );
    }
}
