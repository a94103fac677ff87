//! The `seam` command: inspect GGUF files and load them onto a device
//! through the seam. It lives in its own package because it picks a
//! platform at run time, and the seam itself imports no platform.
//!
//! Bad input exits with status 2 and one line on stderr, a flag clap
//! refuses included. Progress bars go to stderr where it is a terminal;
//! `--quiet` drops them and every line but errors and warnings.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};
use seam::borrow::MapOptions;
use seam::gguf::GgufModel;
use seam::text::{path_safe, terminal_safe};
use seam_devices as devices;
use seam_tools::cli::{Progress, Unit, fail, parse_args};
use seam_tools::demo::TempGguf;
use seam_tools::load::{LoadOptions, load_model};
use seam_tools::output::check_output;

mod bench;
mod sharded;
mod trace;

#[derive(Parser)]
#[command(
    name = "seam",
    version,
    about = "Stage GGUF weights onto accelerators without drowning the host"
)]
struct Cli {
    /// No progress bar and no line on stderr but errors and warnings (the
    /// policy line too: `--json` still reports the policy).
    #[arg(long, short, global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show a GGUF file's header, metadata and tensor table. With no FILE,
    /// writes the built-in demo model to a temporary file and inspects it.
    Inspect {
        /// The GGUF file (the first shard of a split model).
        file: Option<PathBuf>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Add the sha256 of each tensor's bytes.
        #[arg(long)]
        hash: bool,
    },
    /// Stage every tensor onto a device through `seam::resident_weight` and
    /// report time, throughput and host residency. With no FILE, writes the
    /// built-in demo model to a temporary file and loads it.
    Load {
        /// The GGUF file (the first shard of a split model).
        file: Option<PathBuf>,
        /// host | fake | sink | cuda[:N] | rocm[:N] (default: the best device present).
        #[arg(long, conflicts_with = "devices")]
        device: Option<String>,
        /// Several devices (`cuda:0,cuda:1`, `fake,fake`): a sharded load,
        /// each device reading its own shard, replicated tensors read once
        /// and broadcast.
        #[arg(long)]
        devices: Option<String>,
        /// With --devices: how expert stacks are split, `experts` (default)
        /// or `rows`.
        #[arg(long, requires = "devices")]
        shard: Option<String>,
        /// Print the JSON report.
        #[arg(long)]
        json: bool,
        /// Hash each tensor as the device received it.
        #[arg(long)]
        hash: bool,
        /// A JSON config file of `vllm_cpp.*` knobs.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Write the residency timeline as CSV.
        #[arg(long)]
        trace: Option<PathBuf>,
        /// Draw the residency timeline as SVG.
        #[arg(long)]
        plot: Option<PathBuf>,
    },
    /// Write the built-in demo model (what `load` and `inspect` use when
    /// given no FILE) to a file that is kept.
    Demo {
        /// Where to write it.
        #[arg(long, value_name = "PATH")]
        write: PathBuf,
    },
    /// The tensor-parallel matrix product (row split + all-reduce, column
    /// split + all-gather) on CUDA GPUs against the one-GPU product.
    MatmulCheck {
        /// The GPUs, e.g. `cuda:0,cuda:1`.
        #[arg(long)]
        devices: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// What this machine offers: driver libraries, devices, memory,
    /// pageable-memory access, page size, and why a device is unusable.
    Doctor {
        /// Print JSON: one `{subject, detail}` object per line of the text.
        #[arg(long)]
        json: bool,
    },
    /// Measure ceilings, the naive path and ours on FILE, warm and cold.
    Bench {
        /// The GGUF file.
        file: PathBuf,
        /// The device (default: the best device present).
        #[arg(long)]
        device: Option<String>,
        /// Reader threads for the read ceiling.
        #[arg(long, default_value_t = 8)]
        threads: usize,
        /// Run each path this many times; report min, median and max.
        #[arg(long, default_value_t = 1)]
        repeat: usize,
        /// The paths to run, in order, comma-separated (read-warm, h2d,
        /// default-warm, buffered-warm, registered-warm, naive-warm,
        /// read-cold, default-cold, direct-cold, buffered-cold,
        /// registered-cold, naive-cold), or `all`.
        #[arg(long, default_value = "all")]
        paths: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// One benchmark measurement (run by `seam bench` in a child process).
    #[command(hide = true)]
    BenchStep {
        /// read | h2d | naive | ours.
        step: String,
        /// The GGUF file.
        file: PathBuf,
        /// The device.
        #[arg(long)]
        device: String,
        /// Reader threads.
        #[arg(long, default_value_t = 8)]
        threads: usize,
    },
}

/// A failure the user can act on: printed as one line, exit status 2.
pub(crate) struct Failure(String);

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure(e.to_string())
    }
}

/// The file to work on: `file`, or the demo model written to a temporary
/// file (kept alive by the returned guard; said on stderr unless `quiet`).
fn file_or_demo(
    file: Option<PathBuf>,
    quiet: bool,
) -> Result<(PathBuf, Option<TempGguf>), Failure> {
    if let Some(p) = file {
        return Ok((p, None));
    }
    let demo = TempGguf::write(&seam_tools::demo::demo_model(), "seam-demo")?;
    if !quiet {
        eprintln!(
            "seam: no FILE given; using the built-in demo model {} (removed on exit; \
             `seam demo --write PATH` keeps a copy)",
            demo.path().display()
        );
    }
    Ok((demo.path().to_path_buf(), Some(demo)))
}

/// `seam demo --write PATH`: the demo model, kept.
fn demo(path: &std::path::Path, quiet: bool) -> Result<(), Failure> {
    check_output("--write", path, &[])?;
    let n = seam_tools::demo::demo_model().write_file(path)?;
    if !quiet {
        eprintln!(
            "seam: wrote the built-in demo model to {} ({n} bytes)",
            path_safe(path)
        );
    }
    Ok(())
}

fn print(out: &str) {
    let mut stdout = std::io::stdout().lock();
    // A closed pipe (`seam inspect | head`) is not an error of the input.
    let _ = stdout
        .write_all(out.as_bytes())
        .and_then(|_| stdout.flush());
}

fn inspect(file: Option<PathBuf>, json: bool, hash: bool, quiet: bool) -> Result<(), Failure> {
    let (path, _demo) = file_or_demo(file, quiet)?;
    let model = GgufModel::open(&path, MapOptions::default())?;
    let hashes = if hash {
        let progress = Progress::start("hash", Unit::Bytes, quiet)?;
        let hashes = seam_tools::inspect::tensor_hashes(&model, &|done, total| {
            progress.set(done, total);
        });
        // Cleared before the report reaches a terminal it may share.
        progress.finish();
        Some(hashes?)
    } else {
        None
    };
    if json {
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        return match seam_tools::inspect::write_inspect_json(&model, hashes.as_deref(), &mut out)
            .and_then(|()| out.flush().map_err(Into::into))
        {
            // A closed pipe (`seam inspect --json | head`) is not an error of the input.
            Err(e)
                if e.downcast_ref::<std::io::Error>()
                    .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
            {
                Ok(())
            }
            Err(e)
                if e.downcast_ref::<serde_json::Error>()
                    .is_some_and(|e| e.is_io()) =>
            {
                Ok(())
            }
            other => other.map_err(|e| Failure(e.to_string())),
        };
    }
    print(&seam_tools::inspect::inspect_text(
        &model,
        hashes.as_deref(),
    ));
    Ok(())
}

/// The device named by `--device`, or the best one present.
fn device_spec(device: Option<&str>) -> Result<devices::DeviceSpec, Failure> {
    match device {
        Some(text) => devices::parse(text).map_err(Failure),
        None => Ok(devices::best_present()),
    }
}

/// The device named by `--device`, or the best one present.
fn device_for(device: Option<&str>) -> Result<devices::Device, Failure> {
    let env = |name: &str| std::env::var(name).ok();
    devices::open(device_spec(device)?, &env).map_err(Failure)
}

struct LoadArgs {
    quiet: bool,
    file: Option<PathBuf>,
    device: Option<String>,
    json: bool,
    hash: bool,
    config: Option<PathBuf>,
    trace: Option<PathBuf>,
    plot: Option<PathBuf>,
}

fn load(args: LoadArgs) -> Result<(), Failure> {
    let device = device_for(args.device.as_deref())?;
    let platform = device.platform();
    let (path, _demo) = file_or_demo(args.file, args.quiet)?;
    // Before the load: a bad output path costs a line, not the load, and
    // the model is never overwritten.
    for (flag, output) in [("--trace", &args.trace), ("--plot", &args.plot)] {
        if let Some(output) = output {
            check_output(flag, output, &[&path])?;
        }
    }
    let options = LoadOptions {
        hash: args.hash,
        config: args.config,
        ..LoadOptions::default()
    };
    let progress = Progress::start("load", Unit::Bytes, args.quiet)?;
    let stages = platform.needs_weight_staging();
    let report = load_model(
        &path,
        platform,
        &options,
        &|line| {
            if !args.quiet {
                progress.suspend(|| eprintln!("seam: {line}"));
            }
        },
        &|done, total| {
            progress.set(done, total);
            let seconds = progress.elapsed().as_secs_f64();
            if stages && seconds > 0.0 {
                // GB/s (10^9), the unit of the summary and the report.
                progress.message(format!("{:.2} GB/s", done as f64 / seconds / 1e9));
            }
        },
    );
    progress.finish();
    let report = report?;
    // A failed output is reported after the report: the load's figures are
    // not lost to a full disk.
    let mut output_error = None;
    if let Some(csv) = &args.trace
        && let Err(e) = trace::write_csv(csv, &report.samples)
    {
        output_error.get_or_insert(Failure(format!("--trace {}: {e}", path_safe(csv))));
    }
    if let Some(svg) = &args.plot
        && let Err(e) = trace::write_svg(svg, &report)
    {
        output_error.get_or_insert(Failure(format!("--plot {}: {e}", path_safe(svg))));
    }
    if args.json {
        let mut s = serde_json::to_string_pretty(&report)?;
        s.push('\n');
        print(&s);
    } else {
        let released = if report.reads_in_place {
            String::new()
        } else {
            format!(
                "; released {:.1} MiB",
                report.released_bytes as f64 / 1048576.0
            )
        };
        print(&format!(
            "loaded {} tensors, {}{released}; \
             host RSS baseline {:.1} MiB, peak {:.1} MiB, RssFile after {:.1} MiB\n",
            report.tensors,
            report.staged_text(),
            report.rss.baseline_mib,
            report.rss.peak_mib,
            report.rss.rss_file_after_mib,
        ));
        if args.hash {
            let mut lines = String::new();
            for t in &report.per_tensor {
                if let Some(h) = &t.sha256 {
                    lines.push_str(&format!("{h}  {}\n", terminal_safe(&t.name)));
                }
            }
            print(&lines);
        }
    }
    output_error.map_or(Ok(()), Err)
}

/// `seam doctor`: its lines, or as JSON one `{subject, detail}` per line.
fn doctor(json: bool) -> Result<(), Failure> {
    let lines = devices::doctor();
    if !json {
        print(&(lines.join("\n") + "\n"));
        return Ok(());
    }
    let items: Vec<serde_json::Value> = lines
        .iter()
        .map(|line| {
            let (subject, detail) = line.split_once(": ").unwrap_or(("", line));
            serde_json::json!({"subject": subject, "detail": detail})
        })
        .collect();
    let mut s = serde_json::to_string_pretty(&items)?;
    s.push('\n');
    print(&s);
    Ok(())
}

fn main() -> ExitCode {
    let cli: Cli = match parse_args(Cli::command()) {
        Ok(cli) => cli,
        Err(status) => return status,
    };
    // A model truncated under its mapping: one line and exit 2, not SIGBUS.
    if let Err(e) = seam::borrow::fault::exit_on_fault_in_mapped_files("seam") {
        return fail("seam", &format!("installing the SIGBUS handler: {e}"));
    }
    let quiet = cli.quiet;
    let result = match cli.command {
        Command::Inspect { file, json, hash } => inspect(file, json, hash, quiet),
        Command::Load {
            file,
            devices: Some(devices),
            shard,
            json,
            hash,
            config,
            trace,
            plot,
            ..
        } => {
            if trace.is_some() || plot.is_some() {
                Err(Failure(
                    "--trace and --plot are not supported with --devices".into(),
                ))
            } else {
                sharded::load(sharded::ShardedArgs {
                    quiet,
                    file,
                    devices,
                    shard,
                    json,
                    hash,
                    config,
                })
            }
        }
        Command::Load {
            file,
            device,
            json,
            hash,
            config,
            trace,
            plot,
            ..
        } => load(LoadArgs {
            quiet,
            file,
            device,
            json,
            hash,
            config,
            trace,
            plot,
        }),
        Command::Demo { write } => demo(&write, quiet),
        Command::MatmulCheck { devices, json } => sharded::matmul_check(&devices, json),
        Command::Doctor { json } => doctor(json),
        Command::Bench {
            file,
            device,
            threads,
            repeat,
            paths,
            json,
        } => device_spec(device.as_deref()).and_then(|spec| {
            bench::run(&file, &spec.name(), threads, repeat, &paths, json, quiet).map_err(Failure)
        }),
        Command::BenchStep {
            step,
            file,
            device,
            threads,
        } => devices::parse(&device)
            .map_err(Failure)
            .and_then(|spec| bench::step(&step, &file, spec, threads).map_err(Failure))
            .map(|j| print(&(j.to_string() + "\n"))),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(msg)) => fail("seam", &msg),
    }
}
