//! `seam bench FILE`: in one run, the ceilings (page-cache read with N
//! threads, pinned host-to-device copy, cold read where caches can be
//! dropped), the naive path (mmap, one pageable copy per tensor, no
//! release) and ours (`seam load`'s path), warm and cold, with host
//! residency. Each measurement runs in its own child process
//! (`seam bench-step`), so residency figures are not mixed.

use std::path::Path;
use std::process::Command;

use serde_json::{Value as Json, json};

use seam_devices::{self as devices, DeviceSpec};

/// One measurement step, run in a child process.
pub fn step(step: &str, file: &Path, spec: DeviceSpec, threads: usize) -> Result<Json, String> {
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
                "policy": r.policy_line}),
            )
        }
        other => Err(format!("unknown bench step {other:?}")),
    }
}

/// Drops the page cache (root only). `Err` says why it could not.
fn drop_caches() -> Result<(), String> {
    // SAFETY: sync(2) has no preconditions; it flushes dirty pages so the
    // cache drop below can evict them.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3")
        .map_err(|e| format!("cannot drop caches ({e}); run as root for cold figures"))
}

fn run_step(
    exe: &Path,
    name: &str,
    file: &Path,
    device: &str,
    threads: usize,
) -> Result<Json, String> {
    let out = Command::new(exe)
        .args([
            "bench-step",
            name,
            "--device",
            device,
            "--threads",
            &threads.to_string(),
        ])
        .arg(file)
        .output()
        .map_err(|e| format!("running {}: {e}", exe.display()))?;
    if !out.status.success() {
        return Err(format!(
            "bench step {name} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("bench step {name}: {e}"))
}

/// Runs every step and prints the table (or JSON).
pub fn run(file: &Path, device: &str, threads: usize, json_out: bool) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    eprintln!("seam bench: {} on {device}", file.display());
    let mut rows: Vec<(String, Json)> = Vec::new();
    let mut step = |label: &str, name: &str| -> Result<Json, String> {
        eprintln!("seam bench: {label}");
        let r = run_step(&exe, name, file, device, threads)?;
        rows.push((label.to_owned(), r.clone()));
        Ok(r)
    };
    // Warm: the first read fills the page cache, the second is the ceiling.
    step("read (warm-up)", "read")?;
    let read_warm = step(&format!("read ceiling, warm, {threads} threads"), "read")?;
    let h2d = step("pinned host-to-device ceiling", "h2d")?;
    let naive_warm = step("naive (mmap + pageable copy), warm", "naive")?;
    let ours_warm = step("ours (seam load), warm", "ours")?;
    let cold = match drop_caches() {
        Ok(()) => {
            let read_cold = step(&format!("read ceiling, cold, {threads} threads"), "read")?;
            drop_caches()?;
            let naive_cold = step("naive, cold", "naive")?;
            drop_caches()?;
            let ours_cold = step("ours, cold", "ours")?;
            Some((read_cold, naive_cold, ours_cold))
        }
        Err(why) => {
            eprintln!("seam bench: cold figures not measured: {why}");
            None
        }
    };
    let g = |j: &Json| j["gbps"].as_f64().unwrap_or(0.0);
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    let mut summary = json!({
        "file": file,
        "device": device,
        "warm": {
            "read_ceiling_gbps": g(&read_warm),
            "pinned_h2d_gbps": g(&h2d),
            "naive_gbps": g(&naive_warm),
            "ours_gbps": g(&ours_warm),
            "ours_vs_read_ceiling": ratio(g(&ours_warm), g(&read_warm)),
            "ours_vs_h2d_ceiling": ratio(g(&ours_warm), g(&h2d)),
            "ours_vs_naive": ratio(g(&ours_warm), g(&naive_warm)),
        },
    });
    if let Some((read_cold, naive_cold, ours_cold)) = &cold {
        summary["cold"] = json!({
            "read_ceiling_gbps": g(read_cold),
            "naive_gbps": g(naive_cold),
            "ours_gbps": g(ours_cold),
            "ours_vs_read_ceiling": ratio(g(ours_cold), g(read_cold)),
            "ours_vs_naive": ratio(g(ours_cold), g(naive_cold)),
        });
    }
    if json_out {
        let steps: Vec<Json> = rows
            .iter()
            .map(|(l, r)| json!({"step": l, "result": r}))
            .collect();
        summary["steps"] = Json::Array(steps);
        println!(
            "{}",
            serde_json::to_string_pretty(&summary).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    println!("{} on {device}", file.display());
    println!(
        "{:<44} {:>8} {:>10} {:>10} {:>12} {:>12}",
        "path", "GB/s", "x ceiling", "x naive", "host +MiB", "RssFile MiB"
    );
    for (label, r) in &rows {
        let (ceiling, naive) = if label.contains("cold") {
            cold.as_ref()
                .map_or((0.0, 0.0), |(rc, nc, _)| (g(rc), g(nc)))
        } else {
            (g(&read_warm), g(&naive_warm))
        };
        let opt = |k: &str| r[k].as_f64().map_or("-".to_owned(), |v| format!("{v:.1}"));
        println!(
            "{:<44} {:>8.2} {:>10.2} {:>10.2} {:>12} {:>12}",
            label,
            g(r),
            ratio(g(r), ceiling),
            ratio(g(r), naive),
            opt("host_growth_mib"),
            opt("rss_file_after_mib")
        );
    }
    Ok(())
}
