//! A sharded whole-model load: one model over several devices, each device
//! reading only its own shard from the file.
//!
//! Every matrix is split by rows and every expert stack by experts (or by
//! rows, with [`ShardSplit::Rows`]); the other tensors are replicated. Each
//! device stages its shards through [`resident_weight`](seam::resident_weight)
//! on its own platform, with the load's policy and its own staging ring.
//! With collectives, each replicated tensor is read by one device and
//! broadcast to the others ([`stage_shards_once`]); without, every device
//! reads it. This is what `seam load --devices A,B` runs.
//!
//! The report gives, per rank, the seam's counters (bytes read from the
//! file, bytes received by broadcast) and, with hashing, the sha256 of each
//! shard as the device holds it, with the shard's absolute byte range in
//! the file, so the hashes can be checked against the file itself.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::inspect::hex;
use seam::collective::Collective;
use seam::gguf::GgufError;
use seam::platform::{DeviceError, Platform, StageCounts};
use seam::residency;
use seam::session::{Env, LoadError, Session, SessionOptions};
use seam::shard::{
    DeviceStaging, ShardError, ShardPart, ShardPlan, ShardStrategy, ShardWeight, ShardedWeights,
    stage_shards, stage_shards_once,
};
use seam::weight::Role;

/// How stacks of experts are split (`--shard`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ShardSplit {
    /// Expert stacks by experts, matrices by rows (expert parallel).
    #[default]
    Experts,
    /// Every tensor of two or more dims by rows (tensor parallel).
    Rows,
}

impl ShardSplit {
    /// Parses `rows` or `experts`.
    ///
    /// # Errors
    ///
    /// Anything else, as one line.
    pub fn parse(text: &str) -> Result<ShardSplit, String> {
        match text {
            "rows" => Ok(ShardSplit::Rows),
            "experts" => Ok(ShardSplit::Experts),
            _ => Err(format!("--shard {text:?}: expected rows or experts")),
        }
    }

    /// The strategy for a tensor of `dims`.
    pub fn strategy(self, dims: &[u64]) -> ShardStrategy {
        match (self, dims.len()) {
            (ShardSplit::Rows, 2..) => ShardStrategy::Rows,
            (ShardSplit::Rows, _) => ShardStrategy::Replicate,
            (ShardSplit::Experts, _) => ShardStrategy::by_shape(dims),
        }
    }
}

/// What to do besides loading.
#[derive(Clone, Debug, Default)]
pub struct ShardedLoadOptions {
    /// Hash each shard as its device holds it.
    pub hash: bool,
    /// The config file (`--config`).
    pub config: Option<PathBuf>,
    /// How expert stacks are split.
    pub split: ShardSplit,
}

/// Why a sharded load failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShardedLoadError {
    /// The file is malformed or cannot be opened.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// A knob, the config file, the ring or the queue of a device's
    /// session, or the file itself.
    #[error(transparent)]
    Session(#[from] LoadError),
    /// Planning or staging the shards failed.
    #[error(transparent)]
    Shard(#[from] ShardError),
    /// Reading a shard back to hash it failed.
    #[error("device {device}: hashing {weight:?}: {source}")]
    Hash {
        /// The plan's device index.
        device: usize,
        /// The weight.
        weight: String,
        /// The device's error.
        source: DeviceError,
    },
    /// Dropping the page cache of released weights failed.
    #[error("dropping the page cache of released weights: {0}")]
    PageCache(std::io::Error),
    /// A sharded load maps the file; `VT_GGUF_MMAP=0` asked otherwise.
    #[error(
        "a sharded load borrows from the mapped file: mmap=0 ({0}) is not supported with --devices"
    )]
    NoMmap(String),
}

/// One shard in a rank's report.
#[derive(Clone, Debug, Serialize)]
pub struct ShardLine {
    /// The tensor's name.
    pub name: String,
    /// `rows`, `experts` or `whole`.
    pub part: &'static str,
    /// The rows or experts `[start, end)` (the whole tensor's rows when
    /// replicated).
    pub range: [u64; 2],
    /// The shard's bytes in its file, absolute: `[start, end)`.
    pub file_bytes: [u64; 2],
    /// The shard index of the file (a split model).
    pub split: usize,
    /// Where the device got it: `file` or `broadcast`.
    pub source: &'static str,
    /// The sha256 of the shard as the device holds it (`--hash`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// One device's part of the report.
#[derive(Clone, Debug, Serialize)]
pub struct RankReport {
    /// The plan's device index.
    pub rank: usize,
    /// The device's name.
    pub device: String,
    /// Shards the plan gives it.
    pub shards: usize,
    /// Bytes the plan gives it (what it holds after the load).
    pub device_bytes: u64,
    /// Bytes it read from the file (copied from host bytes).
    pub read_bytes: u64,
    /// Bytes it received from another device.
    pub received_bytes: u64,
    /// What the load added to the device's counters.
    pub counts: StageCounts,
    /// Every shard it holds, in plan order.
    pub per_shard: Vec<ShardLine>,
}

/// Totals over the ranks.
#[derive(Clone, Debug, Serialize)]
pub struct ShardTotals {
    /// Tensors in the model.
    pub tensors: usize,
    /// Tensor bytes in the model.
    pub bytes: u64,
    /// Bytes read from the file, all ranks together (equal to `bytes`
    /// when each byte is read once).
    pub read_bytes: u64,
    /// Bytes received by broadcast, all ranks together.
    pub received_bytes: u64,
    /// Bytes of the replicated tensors (once).
    pub replicated_bytes: u64,
    /// Bytes held on the devices, all ranks together.
    pub device_bytes: u64,
    /// Whether the plan gives every byte of every split tensor to exactly
    /// one device and every replicated tensor to every device.
    pub covers_each_tensor_once: bool,
    /// Wall time of staging.
    pub seconds: f64,
    /// Tensor bytes per second, in GB/s (10^9).
    pub gbps: f64,
}

/// Host memory of the process, in MiB.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct ShardRss {
    /// RSS before the rings were allocated.
    pub baseline_mib: f64,
    /// Peak RSS during the load (VmHWM, reset at the start).
    pub peak_mib: f64,
    /// `peak_mib - baseline_mib`.
    pub growth_mib: f64,
    /// The staging rings of all devices together: the bound of the growth,
    /// less a small allowance (threads, small tensors copied directly).
    pub rings_mib: f64,
    /// RssFile after the load.
    pub rss_file_after_mib: f64,
}

/// The report of `seam load --devices ... --json`.
#[derive(Clone, Debug, Serialize)]
pub struct ShardedLoadReport {
    /// The file loaded.
    pub file: PathBuf,
    /// The devices, in rank order.
    pub devices: Vec<String>,
    /// How expert stacks were split.
    pub split: ShardSplit,
    /// Whether replicated tensors were broadcast (read by one rank).
    pub broadcast: bool,
    /// The resolution lines as printed.
    pub policy_line: String,
    /// Per rank.
    pub ranks: Vec<RankReport>,
    /// Over all ranks.
    pub totals: ShardTotals,
    /// Host memory.
    pub rss: ShardRss,
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Whether every split tensor's shards partition its bytes and every
/// replicated tensor is on every device.
pub fn covers_each_tensor_once(plan: &ShardPlan) -> bool {
    plan.weights().iter().all(|w| {
        if w.shards.iter().all(|s| s.part == ShardPart::Whole) {
            return w.shards.len() == plan.n_devices()
                && w.shards.iter().all(|s| s.byte_range == (0..w.n_bytes));
        }
        let mut ranges: Vec<_> = w.shards.iter().map(|s| s.byte_range.clone()).collect();
        ranges.sort_by_key(|r| r.start);
        let mut at = 0;
        for r in ranges {
            if r.start != at {
                return false;
            }
            at = r.end;
        }
        at == w.n_bytes
    })
}

/// The sha256 of a shard's device copy: the device's own running hash where
/// it keeps one, else its bytes read back in chunks.
fn shard_sha256(
    platform: &dyn Platform,
    device: usize,
    shard: &ShardWeight,
) -> Result<Option<String>, ShardedLoadError> {
    let Some(copy) = shard.weight.device_copy() else {
        return Ok(shard
            .weight
            .host_view()
            .map(|h| hex(&Sha256::digest(&h[..]))));
    };
    if let Some(digest) = copy.buffer().sha256() {
        return Ok(Some(hex(&digest)));
    }
    let len = copy.buffer().len();
    let mut hasher = Sha256::new();
    let mut chunk = vec![0u8; len.min(8 << 20) as usize];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(chunk.len() as u64) as usize;
        platform
            .backend()
            .read_back(copy.buffer(), done, &mut chunk[..n])
            .map_err(|source| ShardedLoadError::Hash {
                device,
                weight: shard.weight.name().to_owned(),
                source,
            })?;
        hasher.update(&chunk[..n]);
        done += n as u64;
    }
    Ok(Some(hex(&hasher.finalize())))
}

/// Hashes every shard of every device, a few threads per device.
fn hash_all(
    weights: &ShardedWeights,
    platforms: &[&dyn Platform],
) -> Result<Vec<Vec<Option<String>>>, ShardedLoadError> {
    const THREADS_PER_DEVICE: usize = 4;
    std::thread::scope(|scope| {
        let handles: Vec<Vec<_>> = weights
            .devices()
            .iter()
            .zip(platforms)
            .enumerate()
            .map(|(d, (shards, &platform))| {
                (0..THREADS_PER_DEVICE)
                    .map(|t| {
                        scope.spawn(move || {
                            shards
                                .iter()
                                .enumerate()
                                .filter(|(i, _)| i % THREADS_PER_DEVICE == t)
                                .map(|(i, s)| Ok((i, shard_sha256(platform, d, s)?)))
                                .collect::<Result<Vec<_>, ShardedLoadError>>()
                        })
                    })
                    .collect()
            })
            .collect();
        handles
            .into_iter()
            .zip(weights.devices())
            .map(|(threads, shards)| {
                let mut hashes = vec![None; shards.len()];
                for h in threads {
                    let got = h
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
                    for (i, sha) in got {
                        hashes[i] = sha;
                    }
                }
                Ok(hashes)
            })
            .collect()
    })
}

/// Loads every tensor of the model at `path` over `platforms` (rank `d` on
/// `platforms[d]`), each device taking its shards; with `collectives` (rank
/// `d` for device `d`) each replicated tensor is read once and broadcast.
/// `env` reads the environment; `on_policy` gets the resolution line.
///
/// # Errors
///
/// The file, a knob, the plan or a device failed.
pub fn load_sharded(
    path: &Path,
    platforms: &[&dyn Platform],
    collectives: Option<&[&dyn Collective]>,
    env: &Env,
    options: &ShardedLoadOptions,
    on_policy: &dyn Fn(&str),
) -> Result<ShardedLoadReport, ShardedLoadError> {
    if platforms.is_empty() {
        return Err(ShardError::NoDevices.into());
    }
    // One session per device: the knobs resolved once per device (the
    // same environment and config file), each with its own ring.
    let session_options = SessionOptions {
        env: env.clone(),
        config: options.config.clone(),
        sample_every: None,
        sessions_on_host: platforms.len() as u64,
        host_memory: None,
    };
    let sessions = platforms
        .iter()
        .map(|&p| Session::new(p, &session_options))
        .collect::<Result<Vec<_>, LoadError>>()?;
    let lead = &sessions[0];
    if !lead.policy().mmap.value.0 {
        return Err(ShardedLoadError::NoMmap(
            lead.policy().mmap.source.to_string(),
        ));
    }
    let model = lead.open(path)?;
    // Every device stages from the lead's model: each sizes its page-cache
    // default by it (the same file, so the same decision).
    for session in &sessions[1..] {
        session.size_page_cache_for(&model);
    }
    let policy_line = lead.policy_line();
    on_policy(&policy_line);
    let n = platforms.len();
    let plan = ShardPlan::for_model(&model, n, |t| {
        (Role::new("tensor"), options.split.strategy(&t.dims))
    })?;
    let weights = plan.model_weights(&model)?;

    let _ = residency::reset_peak();
    let baseline = residency::current().unwrap_or_default();
    let rings_bytes: u64 = sessions
        .iter()
        .filter(|s| s.platform().staging_ring().is_some())
        .filter_map(|s| s.ring_policy().ring_config())
        .map(|config| config.total_bytes())
        .sum();
    let view_refs: Vec<&dyn Platform> = sessions.iter().map(|s| s.platform()).collect();

    let start = Instant::now();
    let staged: Vec<DeviceStaging> = match collectives {
        Some(c) => stage_shards_once(&weights, &view_refs, c)?,
        None => stage_shards(&weights, &view_refs)?,
    };
    seam::page_cache::flush().map_err(ShardedLoadError::PageCache)?;
    let seconds = start.elapsed().as_secs_f64();
    let after = residency::current().unwrap_or_default();

    let hashes = if options.hash {
        Some(hash_all(&weights, &view_refs)?)
    } else {
        None
    };
    let readers = collectives.map(|_| seam::shard::replicated_readers(&weights));
    let ranks: Vec<RankReport> = staged
        .iter()
        .zip(weights.devices())
        .zip(platforms)
        .map(|((s, shards), p)| RankReport {
            rank: s.device,
            device: p.backend().name(),
            shards: s.shards,
            device_bytes: s.planned_bytes,
            read_bytes: s.counts.uploaded_bytes,
            received_bytes: s.counts.received_bytes,
            counts: s.counts,
            per_shard: shards
                .iter()
                .enumerate()
                .map(|(i, sw)| {
                    let info = &model.tensors()[sw.tensor];
                    let (part, range) = match &sw.shard.part {
                        ShardPart::Whole => ("whole", [0, info.dims.iter().skip(1).product()]),
                        ShardPart::Rows(r) => ("rows", [r.start, r.end]),
                        ShardPart::Experts(e) => ("experts", [e.start, e.end]),
                    };
                    let received = readers
                        .as_ref()
                        .and_then(|r| r.get(&sw.tensor))
                        .is_some_and(|&root| root != s.device);
                    ShardLine {
                        name: info.name.clone(),
                        part,
                        range,
                        file_bytes: [
                            info.offset + sw.shard.byte_range.start,
                            info.offset + sw.shard.byte_range.end,
                        ],
                        split: info.split,
                        source: if received { "broadcast" } else { "file" },
                        sha256: hashes.as_ref().and_then(|h| h[s.device][i].clone()),
                    }
                })
                .collect(),
        })
        .collect();
    let bytes = model.total_tensor_bytes();
    let replicated_bytes = plan
        .weights()
        .iter()
        .filter(|w| w.shards.iter().all(|s| s.part == ShardPart::Whole))
        .map(|w| w.n_bytes)
        .sum();
    let totals = ShardTotals {
        tensors: model.tensors().len(),
        bytes,
        read_bytes: ranks.iter().map(|r| r.read_bytes).sum(),
        received_bytes: ranks.iter().map(|r| r.received_bytes).sum(),
        replicated_bytes,
        device_bytes: ranks.iter().map(|r| r.device_bytes).sum(),
        covers_each_tensor_once: covers_each_tensor_once(&plan),
        seconds,
        gbps: if seconds > 0.0 {
            bytes as f64 / seconds / 1e9
        } else {
            0.0
        },
    };
    let peak = after.peak.max(after.rss);
    Ok(ShardedLoadReport {
        file: path.to_path_buf(),
        devices: platforms.iter().map(|p| p.backend().name()).collect(),
        split: options.split,
        broadcast: collectives.is_some(),
        policy_line,
        ranks,
        totals,
        rss: ShardRss {
            baseline_mib: mib(baseline.rss),
            peak_mib: mib(peak),
            growth_mib: mib(peak.saturating_sub(baseline.rss)),
            rings_mib: mib(rings_bytes),
            rss_file_after_mib: mib(after.rss_file),
        },
    })
}
