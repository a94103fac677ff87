//! A whole-model load: every tensor through
//! [`resident_weight`], with the load's policy
//! resolved once, the staging ring in place, and host residency sampled.
//!
//! This is what `seam load` runs and what its JSON report describes.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::SeamError;
use crate::borrow::MapOptions;
use crate::gguf::{GgufError, GgufModel, TensorInfo};
use crate::inspect::hex;
use crate::platform::{DeviceError, Platform, StageCounts};
use crate::policy::{KNOBS, LoadPolicy, PolicyConfig, PolicyError, Resolved, WithPolicy};
use crate::residency::{self, Residency};
use crate::resident::{Resident, resident_weight};
use crate::ring::{RING_KNOBS, RingError, RingPolicy, StagingRing};
use crate::weight::{Role, Weight};

/// Why a load failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The file is malformed or cannot be opened.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// A knob or the config file is wrong.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The staging ring could not be set up.
    #[error(transparent)]
    Ring(#[from] RingError),
    /// Staging a weight failed.
    #[error(transparent)]
    Seam(#[from] SeamError),
    /// A device operation outside staging failed.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// Dropping the page cache of released weights failed.
    #[error("dropping the page cache of released weights: {0}")]
    PageCache(std::io::Error),
    /// Reading a tensor into an owned buffer (mmap off) failed.
    #[error("{}: reading tensor {tensor:?} at byte {offset}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its offset.
        offset: u64,
        /// The error.
        source: std::io::Error,
    },
}

/// What to do besides loading.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Hash each tensor as the device received it.
    pub hash: bool,
    /// The config file (`--config`).
    pub config: Option<PathBuf>,
    /// How often the residency sampler reads `/proc`.
    pub sample_every: Duration,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            hash: false,
            config: None,
            sample_every: Duration::from_millis(20),
        }
    }
}

/// One residency sample.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Sample {
    /// Seconds since the load began.
    pub seconds: f64,
    /// The process's figures.
    pub residency: Residency,
    /// Bytes copied to the device so far.
    pub device_bytes: u64,
}

/// Host memory figures of a load, in MiB.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct RssReport {
    /// RSS before the load.
    pub baseline_mib: f64,
    /// Peak RSS during the load (VmHWM, reset at the start).
    pub peak_mib: f64,
    /// Highest sampled RssFile.
    pub rss_file_peak_mib: f64,
    /// Highest sampled RssAnon.
    pub rss_anon_peak_mib: f64,
    /// RssFile after the load.
    pub rss_file_after_mib: f64,
    /// RssAnon after the load.
    pub rss_anon_after_mib: f64,
    /// Resident bytes of the model's own mappings after the load (from
    /// smaps): RssFile without the pages of the program and its libraries
    /// (a GPU driver maps tens of MiB of its own).
    pub model_file_after_mib: f64,
}

/// One tensor's line in the report.
#[derive(Clone, Debug, Serialize)]
pub struct TensorReport {
    /// The name.
    pub name: String,
    /// Bytes.
    pub n_bytes: u64,
    /// The sha256 of the bytes as the device received them (`--hash`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// A resolved knob in the report.
#[derive(Clone, Debug, Serialize)]
pub struct KnobReport {
    /// The value as printed.
    pub value: String,
    /// Where it came from.
    pub source: String,
}

fn knob<T: std::fmt::Display>(r: &Resolved<T>) -> KnobReport {
    KnobReport {
        value: r.value.to_string(),
        source: r.source.to_string(),
    }
}

/// The report of `seam load --json`.
#[derive(Clone, Debug, Serialize)]
pub struct LoadReport {
    /// The file loaded.
    pub file: PathBuf,
    /// The device.
    pub device: String,
    /// Number of tensors.
    pub tensors: usize,
    /// Tensor bytes.
    pub bytes: u64,
    /// Wall time of staging.
    pub seconds: f64,
    /// Tensor bytes per second, in GB/s (10^9).
    pub gbps: f64,
    /// Bytes held on the device after the load.
    pub device_bytes: u64,
    /// Bytes of weights whose host copy was given back.
    pub released_bytes: u64,
    /// Bytes of whole pages dropped from this process.
    pub released_page_bytes: u64,
    /// The seam's counters for the device.
    pub counts: StageCounts,
    /// Each knob with its value and source.
    pub policy: std::collections::BTreeMap<String, KnobReport>,
    /// The resolution lines as printed.
    pub policy_line: String,
    /// Host memory figures.
    pub rss: RssReport,
    /// Per-tensor lines.
    pub per_tensor: Vec<TensorReport>,
    /// The residency samples (for `--trace` and `--plot`).
    #[serde(skip)]
    pub samples: Vec<Sample>,
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Samples residency on a thread until stopped.
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<Sample>>>,
}

impl Sampler {
    fn start(every: Duration, start: Instant, device_bytes: Arc<AtomicU64>) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let stop_flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut samples = Vec::new();
            loop {
                if let Ok(residency) = residency::current() {
                    samples.push(Sample {
                        seconds: start.elapsed().as_secs_f64(),
                        residency,
                        device_bytes: device_bytes.load(Ordering::Relaxed),
                    });
                }
                if stop_flag.load(Ordering::Relaxed) {
                    return samples;
                }
                std::thread::sleep(every);
            }
        });
        Sampler {
            stop,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

/// The sha256 of what the device holds for `weight`: the device's own
/// running hash where it keeps one, else its bytes read back in chunks.
fn device_sha256(platform: &dyn Platform, resident: &Resident<'_>) -> Result<String, DeviceError> {
    match resident {
        Resident::Host(bytes) => Ok(hex(&Sha256::digest(&bytes[..]))),
        Resident::Device(copy) => {
            if let Some(digest) = copy.buffer().sha256() {
                return Ok(hex(&digest));
            }
            let len = copy.buffer().len();
            let mut hasher = Sha256::new();
            let mut chunk = vec![0u8; (len.min(8 << 20)) as usize];
            let mut done = 0;
            while done < len {
                let n = (len - done).min(chunk.len() as u64) as usize;
                platform
                    .backend()
                    .read_back(copy.buffer(), done, &mut chunk[..n])?;
                hasher.update(&chunk[..n]);
                done += n as u64;
            }
            Ok(hex(&hasher.finalize()))
        }
    }
}

fn read_owned(model: &GgufModel, t: &TensorInfo) -> Result<Vec<u8>, LoadError> {
    use std::os::unix::fs::FileExt;
    let shard = &model.shards()[t.split];
    let read_err = |source| LoadError::Read {
        path: shard.path().to_path_buf(),
        tensor: t.name.clone(),
        offset: t.offset,
        source,
    };
    let file = shard
        .mapped()
        .file()
        .ok_or_else(|| read_err(std::io::Error::other("no open file")))?;
    let mut bytes = vec![0u8; t.n_bytes as usize];
    file.read_exact_at(&mut bytes, t.offset).map_err(read_err)?;
    Ok(bytes)
}

/// Resolves the policy for `platform` from the environment (through `env`)
/// and the config file.
///
/// # Errors
///
/// A knob or the config file is wrong.
pub fn resolve_policies(
    env: &dyn Fn(&str) -> Option<String>,
    config: Option<&Path>,
    platform: &dyn Platform,
) -> Result<(LoadPolicy, RingPolicy), PolicyError> {
    let config = match config {
        Some(path) => Some(PolicyConfig::from_file(
            path,
            &[KNOBS, RING_KNOBS].concat(),
        )?),
        None => None,
    };
    Ok((
        LoadPolicy::resolve(env, config.as_ref(), platform)?,
        RingPolicy::resolve(env, config.as_ref())?,
    ))
}

/// Loads every tensor of the model at `path` onto `platform` through the
/// seam, and reports what it cost. `env` reads the environment;
/// `on_progress(done, total)` is called after each tensor.
///
/// # Errors
///
/// The file, a knob or a device operation failed.
pub fn load_model(
    path: &Path,
    platform: &dyn Platform,
    env: &dyn Fn(&str) -> Option<String>,
    options: &LoadOptions,
    on_policy: &dyn Fn(&str),
    on_progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<LoadReport, LoadError> {
    let (policy, ring_policy) = resolve_policies(env, options.config.as_deref(), platform)?;
    let policy_line = format!("{}; {}", policy.summary_line(), ring_policy.summary_line());
    let model = GgufModel::open(
        path,
        MapOptions {
            prefault: policy.prefault.value.0,
        },
    )?;
    // Printed once the file is accepted: a bad file gets one line, its error.
    on_policy(&policy_line);

    let _ = residency::reset_peak();
    let baseline = residency::current().unwrap_or_default();
    let start = Instant::now();
    let device_bytes = Arc::new(AtomicU64::new(0));
    let sampler = Sampler::start(options.sample_every, start, Arc::clone(&device_bytes));

    let result = stage_all(
        &model,
        platform,
        &policy,
        &ring_policy,
        options,
        &device_bytes,
        on_progress,
    );
    let seconds = start.elapsed().as_secs_f64();
    let after = residency::current().unwrap_or_default();
    let samples = sampler.finish();
    // The read pass is over: a file that changed under it (truncated,
    // rewritten in place, renamed over) makes what was staged and hashed
    // neither the old file nor the new one. That is the error to report,
    // also when staging failed because of it (a short read).
    model.check_unchanged()?;
    let (per_tensor, bytes, held, model_resident) = result?;

    let peak_of =
        |f: fn(&Residency) -> u64| samples.iter().map(|s| f(&s.residency)).max().unwrap_or(0);
    let counts = platform.stage_counters().snapshot();
    let mut policy_map = std::collections::BTreeMap::new();
    for (name, r) in [
        ("mmap", &policy.mmap),
        ("prefault", &policy.prefault),
        ("release_host_weights", &policy.release_host_weights),
        ("drop_page_cache", &policy.drop_page_cache),
        ("direct_io", &ring_policy.direct_io),
    ] {
        policy_map.insert(name.to_owned(), knob(r));
    }
    for (name, r) in [
        ("pinned_h2d_mib", &ring_policy.mib),
        ("pinned_h2d_buffers", &ring_policy.buffers),
        ("pinned_h2d_readers", &ring_policy.readers),
        ("pinned_h2d_lanes", &ring_policy.lanes),
    ] {
        policy_map.insert(name.to_owned(), knob(r));
    }
    Ok(LoadReport {
        file: path.to_path_buf(),
        device: platform.backend().name(),
        tensors: per_tensor.len(),
        bytes,
        seconds,
        gbps: if seconds > 0.0 {
            bytes as f64 / seconds / 1e9
        } else {
            0.0
        },
        device_bytes: held,
        released_bytes: counts.released_span_bytes,
        released_page_bytes: counts.released_page_bytes,
        counts,
        policy: policy_map,
        policy_line,
        rss: RssReport {
            baseline_mib: mib(baseline.rss),
            peak_mib: mib(after.peak.max(peak_of(|r| r.rss))),
            rss_file_peak_mib: mib(peak_of(|r| r.rss_file).max(after.rss_file)),
            rss_anon_peak_mib: mib(peak_of(|r| r.rss_anon).max(after.rss_anon)),
            rss_file_after_mib: mib(after.rss_file),
            rss_anon_after_mib: mib(after.rss_anon),
            model_file_after_mib: mib(model_resident),
        },
        per_tensor,
        samples,
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Stages one tensor through the seam and, with hashing on, hashes what the
/// device received.
fn stage_tensor(
    model: &GgufModel,
    t: &TensorInfo,
    view: &dyn Platform,
    queue: &dyn crate::platform::Queue,
    policy: &LoadPolicy,
    options: &LoadOptions,
) -> Result<(TensorReport, Weight), LoadError> {
    let role = Role("tensor");
    let weight = if policy.mmap.value.0 {
        Weight::borrowed(
            &t.name,
            t.ggml_type,
            t.dims.clone(),
            role,
            model.tensor_borrow(t)?,
        )
    } else {
        Weight::owned(
            &t.name,
            t.ggml_type,
            t.dims.clone(),
            role,
            read_owned(model, t)?,
        )
    };
    let resident = resident_weight(&weight, view, queue)?;
    let sha256 = if options.hash {
        Some(device_sha256(view, &resident)?)
    } else {
        None
    };
    drop(resident);
    let line = TensorReport {
        name: t.name.clone(),
        n_bytes: t.n_bytes,
        sha256,
    };
    Ok((line, weight))
}

/// The staging loop: (per-tensor lines, tensor bytes, device bytes held,
/// resident bytes of the model's mappings at the end).
fn stage_all(
    model: &GgufModel,
    platform: &dyn Platform,
    policy: &LoadPolicy,
    ring_policy: &RingPolicy,
    options: &LoadOptions,
    device_bytes: &AtomicU64,
    on_progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<(Vec<TensorReport>, u64, u64, u64), LoadError> {
    let mut view = WithPolicy::new(platform, policy.residency_policy());
    if platform.needs_weight_staging()
        && let Some(config) = ring_policy.ring_config()
    {
        view = view.with_ring(StagingRing::new(platform.backend(), config)?);
    }
    let total = model.total_tensor_bytes();
    // One staging thread per ring lane: while one weight's pipeline drains,
    // the next one's fills.
    let workers = view
        .staging_ring()
        .map_or(1, |r| r.lanes())
        .min(model.tensors().len().max(1));
    let next = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    let slots: Vec<Mutex<Option<(TensorReport, Weight)>>> =
        model.tensors().iter().map(|_| Mutex::new(None)).collect();
    let first_error: Mutex<Option<LoadError>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                let staged = (|| -> Result<(), LoadError> {
                    let queue = view.backend().create_queue()?;
                    loop {
                        if lock(&first_error).is_some() {
                            return Ok(());
                        }
                        let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                        let Some(t) = model.tensors().get(i) else {
                            return Ok(());
                        };
                        let line = stage_tensor(model, t, &view, &*queue, policy, options)?;
                        device_bytes.fetch_add(
                            if line.1.device_copy().is_some() {
                                t.n_bytes
                            } else {
                                0
                            },
                            Ordering::Relaxed,
                        );
                        *lock(&slots[i]) = Some(line);
                        on_progress(
                            done.fetch_add(t.n_bytes, Ordering::Relaxed) + t.n_bytes,
                            total,
                        );
                    }
                })();
                if let Err(e) = staged {
                    lock(&first_error).get_or_insert(e);
                }
            });
        }
    });
    if let Some(e) = lock(&first_error).take() {
        return Err(e);
    }
    // The page cache of released weights is dropped in the background; the
    // load is done when that is done too.
    crate::page_cache::flush().map_err(LoadError::PageCache)?;
    // The model stays resident on the device: the weights live until here.
    let (per_tensor, _weights): (Vec<TensorReport>, Vec<Weight>) = slots
        .into_iter()
        .map(|slot| {
            slot.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .expect("every tensor staged")
        })
        .unzip();
    let held = device_bytes.load(Ordering::Relaxed);
    let model_resident = model
        .shards()
        .iter()
        .filter(|s| !s.mapped().is_empty())
        .map(|s| {
            residency::mapping_rss(s.mapped().bytes().as_ptr())
                .ok()
                .flatten()
                .unwrap_or(0)
        })
        .sum();
    Ok((per_tensor, total, held, model_resident))
}
