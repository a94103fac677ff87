//! `seam bench FILE`: in one run, the ceilings (page-cache read with N
//! threads, pinned host-to-device copy, cold read where caches can be
//! dropped), the naive path (mmap, one pageable copy per tensor, no
//! release) and each of our paths (`seam load` with no knob, the buffered
//! ring, registered windows, direct reads), warm and cold, with CPU
//! seconds per GiB, host growth and what the page cache holds of the file
//! afterwards. `--repeat N` runs each path N times and reports min, median
//! and max; `--paths` picks and orders the paths. Each measurement runs in
//! its own child process (`seam bench-step`), so residency figures are not
//! mixed.

use std::path::Path;
use std::process::Command;

use serde_json::{Value as Json, json};

use seam_devices::{self as devices, DeviceSpec};

/// One measurement step, run in a child process.
pub fn step(step: &str, file: &Path, spec: DeviceSpec, threads: usize) -> Result<Json, String> {
    let cpu_before = cpu_seconds();
    let mut result = measure(step, file, spec, threads)?;
    let gib = result["bytes"].as_f64().unwrap_or(0.0) / (1u64 << 30) as f64;
    if gib > 0.0 {
        result["cpu_seconds_per_gib"] = json!((cpu_seconds() - cpu_before) / gib);
    }
    result["page_cache_share_after"] = json!(page_cache_share(file));
    Ok(result)
}

/// This process's user and system CPU seconds so far.
fn cpu_seconds() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one rusage into the zeroed value it is given.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    if rc != 0 {
        return 0.0;
    }
    // SAFETY: zero-initialized and, on success, filled by the kernel.
    let usage = unsafe { usage.assume_init() };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// The share of `file`'s pages the page cache holds (`mincore` on a fresh
/// mapping, which faults nothing in); `None` when it cannot be asked.
pub fn page_cache_share(file: &Path) -> Option<f64> {
    let map = seam::borrow::MappedFile::open(file, seam::borrow::MapOptions::default()).ok()?;
    seam::ring::direct::resident_share(map.bytes())
}

fn measure(step: &str, file: &Path, spec: DeviceSpec, threads: usize) -> Result<Json, String> {
    let _ = seam::residency::reset_peak();
    let baseline = seam::residency::current().map_err(|e| e.to_string())?;
    let mib = |b: u64| b as f64 / 1048576.0;
    match step {
        "read" => {
            let t =
                seam_tools::bench::read_file(file, threads, 64 << 20).map_err(|e| e.to_string())?;
            let after = seam::residency::current().map_err(|e| e.to_string())?;
            Ok(
                json!({"bytes": t.bytes, "seconds": t.seconds, "gbps": t.gbps(),
                "host_growth_mib": mib(after.peak.saturating_sub(baseline.rss)),
                "rss_file_after_mib": mib(after.rss_file)}),
            )
        }
        "h2d" => {
            let device = devices::open(spec, &|name| std::env::var(name).ok())?;
            let platform = device.platform();
            let t =
                seam_tools::bench::pinned_h2d(platform, 1 << 30, 8).map_err(|e| e.to_string())?;
            Ok(json!({"bytes": t.bytes, "seconds": t.seconds, "gbps": t.gbps()}))
        }
        "naive" => {
            let device = devices::open(spec, &|name| std::env::var(name).ok())?;
            let platform = device.platform();
            let (t, end) =
                seam_tools::bench::naive_load(file, platform).map_err(|e| e.to_string())?;
            Ok(
                json!({"bytes": t.bytes, "seconds": t.seconds, "gbps": t.gbps(),
                "host_growth_mib": mib(end.peak.saturating_sub(baseline.rss)),
                "rss_file_after_mib": mib(end.rss_file)}),
            )
        }
        "ours" => {
            let device = devices::open(spec, &|name| std::env::var(name).ok())?;
            let platform = device.platform();
            let r = seam_tools::load::load_model(
                file,
                platform,
                &seam_tools::load::LoadOptions::default(),
                &|_| {},
                &|_, _| {},
            )
            .map_err(|e| e.to_string())?;
            Ok(
                json!({"bytes": r.bytes, "seconds": r.seconds, "gbps": r.gbps,
                "host_growth_mib": r.rss.peak_mib - r.rss.baseline_mib,
                "rss_file_after_mib": r.rss.rss_file_after_mib,
                "ring": r.ring,
                "ring_mib": r.policy.get("pinned_h2d_mib").and_then(|k| k.value.parse::<f64>().ok()).unwrap_or(0.0)
                    * r.policy.get("pinned_h2d_buffers").and_then(|k| k.value.parse::<f64>().ok()).unwrap_or(0.0),
                "policy": r.policy_line}),
            )
        }
        other => Err(format!("unknown bench step {other:?}")),
    }
}

/// One path of the benchmark: a step, whether it runs cold, and the knobs
/// its child process gets.
///
/// A warm path of ours keeps the file's page cache (`KEEP_PAGE_CACHE`): with
/// the device default a load drops the cache of what it staged, so the next
/// warm repetition would read the disk (the first H200 run measured 2 GB/s
/// "warm", the disk's speed, that way). No ring knob is set by it.
struct Path_ {
    name: &'static str,
    step: &'static str,
    cold: bool,
    env: &'static [(&'static str, &'static str)],
}

/// The knob of every warm path of ours: the page cache stays.
const KEEP_PAGE_CACHE: &[(&str, &str)] = &[("VT_GGUF_DROP_PAGE_CACHE", "off")];

/// The read that fills the page cache before a warm path's runs.
const WARM_UP: Path_ = Path_ {
    name: "warm-up",
    step: "read",
    cold: false,
    env: &[],
};

/// Every path, in the default order (warm first, then cold).
const PATHS: &[Path_] = &[
    Path_ {
        name: "read-warm",
        step: "read",
        cold: false,
        env: &[],
    },
    Path_ {
        name: "h2d",
        step: "h2d",
        cold: false,
        env: &[],
    },
    Path_ {
        name: "default-warm",
        step: "ours",
        cold: false,
        env: KEEP_PAGE_CACHE,
    },
    // Back-to-back loads with no knob set, as an engine restarted after a
    // crash reloads: each one's GB/s shows whether the page-cache default
    // kept the file for the next (issue 26).
    Path_ {
        name: "reload-warm",
        step: "ours",
        cold: false,
        env: &[],
    },
    Path_ {
        name: "buffered-warm",
        step: "ours",
        cold: false,
        env: &[
            ("VT_GGUF_DROP_PAGE_CACHE", "off"),
            ("VT_GGUF_DIRECT_IO", "off"),
            ("VT_REGISTERED_WINDOWS", "off"),
        ],
    },
    Path_ {
        name: "registered-warm",
        step: "ours",
        cold: false,
        env: &[
            ("VT_GGUF_DROP_PAGE_CACHE", "off"),
            ("VT_REGISTERED_WINDOWS", "on"),
        ],
    },
    Path_ {
        name: "naive-warm",
        step: "naive",
        cold: false,
        env: &[],
    },
    Path_ {
        name: "read-cold",
        step: "read",
        cold: true,
        env: &[],
    },
    Path_ {
        name: "default-cold",
        step: "ours",
        cold: true,
        env: &[],
    },
    Path_ {
        name: "direct-cold",
        step: "ours",
        cold: true,
        // At most 4 reader threads (the bound), in the shape that
        // read fastest cold on the H200 machine with 4 readers: 8 x 32 MiB
        // in 2 lanes (1.96 GB/s against 1.92 for 16 x 8 MiB in 4 lanes and
        // 1.88 for 4 x 64 MiB in one lane).
        env: &[
            ("VT_GGUF_DIRECT_IO", "on"),
            ("VT_PINNED_H2D_READERS", "4"),
            ("VT_PINNED_H2D_MIB", "32"),
            ("VT_PINNED_H2D_BUFFERS", "8"),
            ("VT_PINNED_H2D_LANES", "2"),
            ("VT_REGISTERED_WINDOWS", "off"),
        ],
    },
    Path_ {
        name: "buffered-cold",
        step: "ours",
        cold: true,
        env: &[
            ("VT_GGUF_DIRECT_IO", "off"),
            ("VT_REGISTERED_WINDOWS", "off"),
        ],
    },
    Path_ {
        name: "registered-cold",
        step: "ours",
        cold: true,
        env: &[("VT_REGISTERED_WINDOWS", "auto")],
    },
    Path_ {
        name: "naive-cold",
        step: "naive",
        cold: true,
        env: &[],
    },
];

/// The paths `--paths` names (comma-separated; `all` for every one), in
/// the order given.
fn select(paths: &str) -> Result<Vec<&'static Path_>, String> {
    if paths == "all" {
        return Ok(PATHS.iter().collect());
    }
    paths
        .split(',')
        .map(|name| {
            PATHS.iter().find(|p| p.name == name.trim()).ok_or_else(|| {
                let known: Vec<_> = PATHS.iter().map(|p| p.name).collect();
                format!("unknown bench path {name:?} (known: {})", known.join(", "))
            })
        })
        .collect()
}

/// Drops `file` from the page cache: all caches where this process may
/// (root), else the file's own pages (`posix_fadvise(DONTNEED)`, which
/// drops clean pages no mapping holds). Returns the method and what the
/// page cache still holds of the file.
fn drop_caches(file: &Path) -> (&'static str, Option<f64>) {
    // SAFETY: sync(2) has no preconditions; it flushes dirty pages so the
    // cache drop below can evict them.
    unsafe { libc::sync() };
    let method = if std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok() {
        "drop_caches"
    } else {
        use std::os::fd::AsRawFd;
        match std::fs::File::open(file) {
            Ok(f) => {
                // SAFETY: advises the kernel about an open descriptor's
                // pages; touches no memory of ours.
                unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
                "fadvise_dontneed"
            }
            Err(_) => "none",
        }
    };
    (method, page_cache_share(file))
}

fn run_step(
    exe: &Path,
    path: &Path_,
    file: &Path,
    device: &str,
    threads: usize,
) -> Result<Json, String> {
    let mut command = Command::new(exe);
    command
        .args([
            "bench-step",
            path.step,
            "--device",
            device,
            "--threads",
            &threads.to_string(),
        ])
        .arg(file);
    for (k, v) in path.env {
        command.env(k, v);
    }
    let out = command
        .output()
        .map_err(|e| format!("running {}: {e}", exe.display()))?;
    if !out.status.success() {
        return Err(format!(
            "bench path {} failed: {}",
            path.name,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("bench path {}: {e}", path.name))
}

/// min, median and max of `values` (the median of an even count is the
/// mean of the middle two); `None` for no values.
pub fn spread(values: &[f64]) -> Option<(f64, f64, f64)> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Some((v[0], median, v[n - 1]))
}

/// One path's runs summarized: min/median/max of each figure.
fn summarize(runs: &[Json]) -> Json {
    let mut out = json!({"runs": runs});
    for key in [
        "gbps",
        "seconds",
        "cpu_seconds_per_gib",
        "host_growth_mib",
        "rss_file_after_mib",
        "page_cache_share_after",
    ] {
        let values: Vec<f64> = runs.iter().filter_map(|r| r[key].as_f64()).collect();
        if let Some((min, median, max)) = spread(&values) {
            out[key] = json!({"min": min, "median": median, "max": max});
        }
    }
    if let Some(first) = runs.first() {
        for key in ["policy", "ring_mib"] {
            if !first[key].is_null() {
                out[key] = first[key].clone();
            }
        }
        if !first["ring"].is_null() {
            out["ring_last"] = runs.last().map_or(Json::Null, |r| r["ring"].clone());
        }
    }
    out
}

/// The acceptance figures, from the medians of the paths that ran.
fn acceptance(paths: &serde_json::Map<String, Json>) -> Json {
    let median = |p: &str, k: &str| paths.get(p).and_then(|j| j[k]["median"].as_f64());
    let max = |p: &str, k: &str| paths.get(p).and_then(|j| j[k]["max"].as_f64());
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    let registered_ring = paths
        .get("registered-warm")
        .and_then(|j| j["ring_mib"].as_f64());
    json!({
        "default_warm_vs_read_ceiling": ratio(median("default-warm", "gbps"), median("read-warm", "gbps")),
        "default_cold_vs_read_ceiling": ratio(median("default-cold", "gbps"), median("read-cold", "gbps")),
        "registered_warm_gbps": median("registered-warm", "gbps"),
        "registered_warm_vs_h2d": ratio(median("registered-warm", "gbps"), median("h2d", "gbps")),
        "registered_host_growth_max_mib": max("registered-warm", "host_growth_mib"),
        "registered_host_growth_limit_mib": registered_ring.map(|r| r + 96.0),
        "direct_cold_vs_read_ceiling": ratio(median("direct-cold", "gbps"), median("read-cold", "gbps")),
        "direct_cold_page_cache_share_after": max("direct-cold", "page_cache_share_after"),
        "default_warm_vs_naive": ratio(median("default-warm", "gbps"), median("naive-warm", "gbps")),
        "reload_warm_gbps_each": paths.get("reload-warm").map(|j| {
            j["runs"].as_array().into_iter().flatten().map(|r| r["gbps"].clone()).collect::<Vec<_>>()
        }),
        "reload_warm_fastest_over_slowest": ratio(max("reload-warm", "gbps"), paths.get("reload-warm").and_then(|j| j["gbps"]["min"].as_f64())),
    })
}

/// Runs the chosen paths `repeat` times each and prints the table (or
/// JSON); unless `quiet`, a line on stderr as each path starts.
pub fn run(
    file: &Path,
    device: &str,
    threads: usize,
    repeat: usize,
    paths: &str,
    json_out: bool,
    quiet: bool,
) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let chosen = select(paths)?;
    // A file that is no model is one line before any path runs (each path
    // would fail on it in its own child, and the table would be dashes).
    seam::gguf::GgufModel::open(file, seam::borrow::MapOptions::default())
        .map_err(|e| e.to_string())?;
    if !quiet {
        eprintln!("seam bench: {} on {device}", file.display());
    }
    let mut results = serde_json::Map::new();
    let mut cold_methods = Vec::new();
    for path in chosen {
        let mut runs = Vec::new();
        if !path.cold && matches!(path.step, "read" | "ours") {
            // The first read fills the page cache; the next ones measure.
            run_step(&exe, &WARM_UP, file, device, threads)?;
        }
        let mut failed = None;
        for i in 0..repeat.max(1) {
            let mut cold = None;
            if path.cold {
                let (method, share) = drop_caches(file);
                cold_methods.push(method);
                cold = Some(json!({"method": method, "page_cache_share_before": share}));
            }
            if !quiet {
                eprintln!("seam bench: {} ({}/{})", path.name, i + 1, repeat.max(1));
            }
            // A path that fails is reported, and the others still run.
            let mut r = match run_step(&exe, path, file, device, threads) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("seam bench: {e}");
                    failed = Some(e);
                    break;
                }
            };
            if let Some(c) = cold {
                r["cold"] = c;
            }
            runs.push(r);
        }
        let mut summary = summarize(&runs);
        if let Some(e) = failed {
            summary["error"] = json!(e);
        }
        results.insert(path.name.to_owned(), summary);
    }
    let summary = json!({
        "file": file,
        "device": device,
        "threads": threads,
        "repeat": repeat.max(1),
        "cold_methods": cold_methods,
        "acceptance": acceptance(&results),
        "paths": results,
    });
    if json_out {
        println!(
            "{}",
            serde_json::to_string_pretty(&summary).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    println!(
        "{} on {device}, median of {}",
        file.display(),
        repeat.max(1)
    );
    println!(
        "{:<18} {:>8} {:>8} {:>8} {:>10} {:>12} {:>10}",
        "path", "GB/s", "min", "max", "CPU s/GiB", "host +MiB", "cached"
    );
    for (name, r) in summary["paths"].as_object().into_iter().flatten() {
        let f = |k: &str, s: &str| {
            r[k][s]
                .as_f64()
                .map_or("-".to_owned(), |v| format!("{v:.2}"))
        };
        println!(
            "{:<18} {:>8} {:>8} {:>8} {:>10} {:>12} {:>10}",
            name,
            f("gbps", "median"),
            f("gbps", "min"),
            f("gbps", "max"),
            f("cpu_seconds_per_gib", "median"),
            f("host_growth_mib", "max"),
            f("page_cache_share_after", "max"),
        );
    }
    println!("{}", summary["acceptance"]);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{select, spread};

    #[test]
    fn repeat_reports_min_median_and_max() {
        assert_eq!(spread(&[3.0, 1.0, 2.0]), Some((1.0, 2.0, 3.0)));
        assert_eq!(spread(&[4.0, 1.0, 2.0, 10.0]), Some((1.0, 3.0, 10.0)));
        assert_eq!(spread(&[5.0]), Some((5.0, 5.0, 5.0)));
        assert_eq!(spread(&[f64::NAN, 2.0]), Some((2.0, 2.0, 2.0)));
        assert_eq!(spread(&[]), None);
    }

    #[test]
    fn paths_are_chosen_in_the_order_given_and_unknown_ones_refused() {
        let names = |s: &str| select(s).map(|v| v.iter().map(|p| p.name).collect::<Vec<_>>());
        assert_eq!(
            names("direct-cold,read-cold").unwrap(),
            ["direct-cold", "read-cold"]
        );
        assert_eq!(names("all").unwrap().len(), super::PATHS.len());
        assert_eq!(names("reload-warm").unwrap(), ["reload-warm"]);
        let err = names("warp").unwrap_err();
        assert!(
            err.contains("warp") && err.contains("default-warm"),
            "{err}"
        );
    }
}
