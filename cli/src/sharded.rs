//! `seam load --devices A,B [--shard rows|experts]` (one model over several
//! devices, each reading its own shard, replicated tensors read once and
//! broadcast) and `seam matmul-check --devices cuda:0,cuda:1` (the
//! tensor-parallel product against the one-GPU product).

use std::path::PathBuf;

use seam_devices as devices;
use seam_tools::shard_load::{ShardSplit, ShardedLoadOptions, load_sharded};

use crate::{Failure, file_or_demo, print};

/// The arguments of a sharded load.
pub struct ShardedArgs {
    /// `--quiet`: no policy line.
    pub quiet: bool,
    pub file: Option<PathBuf>,
    pub devices: String,
    pub shard: Option<String>,
    pub json: bool,
    pub hash: bool,
    pub config: Option<PathBuf>,
}

/// Runs a sharded load and prints its report.
pub fn load(args: ShardedArgs) -> Result<(), Failure> {
    let split = match args.shard.as_deref() {
        Some(text) => ShardSplit::parse(text).map_err(Failure)?,
        None => ShardSplit::default(),
    };
    let specs = devices::parse_list(&args.devices).map_err(Failure)?;
    let group = devices::open_group(&specs).map_err(Failure)?;
    let (path, _demo) = file_or_demo(args.file, args.quiet)?;
    let options = ShardedLoadOptions {
        hash: args.hash,
        config: args.config,
        split,
    };
    let report = load_sharded(
        &path,
        &group.platforms(),
        Some(&group.collectives()),
        &seam::session::Env::Process,
        &options,
        &|line| {
            if !args.quiet {
                eprintln!("seam: {line}");
            }
        },
    )?;
    if args.json {
        let mut s = serde_json::to_string_pretty(&report)?;
        s.push('\n');
        print(&s);
        return Ok(());
    }
    let t = &report.totals;
    let mut out = format!(
        "loaded {} tensors, {:.1} MiB over {} in {:.2} s ({:.2} GB/s); read from the file {:.1} MiB, \
         received by broadcast {:.1} MiB; host RSS grew {:.1} MiB (rings {:.1} MiB)\n",
        t.tensors,
        t.bytes as f64 / 1048576.0,
        report.devices.join(","),
        t.seconds,
        t.gbps,
        t.read_bytes as f64 / 1048576.0,
        t.received_bytes as f64 / 1048576.0,
        report.rss.growth_mib,
        report.rss.rings_mib,
    );
    for r in &report.ranks {
        out += &format!(
            "  rank {} ({}): {} shards, {:.1} MiB held, {:.1} MiB read, {:.1} MiB received\n",
            r.rank,
            r.device,
            r.shards,
            r.device_bytes as f64 / 1048576.0,
            r.read_bytes as f64 / 1048576.0,
            r.received_bytes as f64 / 1048576.0,
        );
    }
    print(&out);
    Ok(())
}

/// Runs the tensor-parallel matmul check on a CUDA group.
pub fn matmul_check(devices_text: &str, json: bool) -> Result<(), Failure> {
    let specs = devices::parse_list(devices_text).map_err(Failure)?;
    let group = devices::open_group(&specs).map_err(Failure)?;
    let shape = devices::MatmulShape {
        out: 4096,
        inp: 4096,
        batch: 8,
    };
    let report = devices::check_matmul(&group, shape)
        .map_err(|e| Failure(format!("--devices {devices_text}: {e}")))?;
    if json {
        print(&(serde_json::to_string_pretty(&report)? + "\n"));
    } else {
        let mut out = format!(
            "one GPU vs float64: rel {:.2e}\n",
            report.one_gpu_rel_diff_vs_f64
        );
        for s in &report.splits {
            out += &format!(
                "{}: max |diff| {:.2e}, rel {:.2e} vs one GPU\n",
                s.split, s.max_abs_diff, s.rel_diff
            );
        }
        print(&out);
    }
    Ok(())
}
