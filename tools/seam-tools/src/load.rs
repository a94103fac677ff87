//! The whole-model load report of `seam load`: a [`Session`] stages every
//! tensor ([`Session::stage_all`]) and samples residency; this module turns
//! what it saw into the report (time, throughput, device and released
//! bytes, each knob with its source, host residency, per-tensor hashes).

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;
use sha2::{Digest, Sha256};

use seam::Resident;
use seam::platform::{DeviceError, Platform, StageCounts};
use seam::policy::Resolved;
use seam::residency;
use seam::ring::RingCounts;
use seam::session::{Env, Session, SessionOptions, Staged};

pub use seam::session::{LoadError, Sample};

use crate::inspect::hex;

/// What to do besides loading.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Hash each tensor as the device received it.
    pub hash: bool,
    /// The config file (`--config`).
    pub config: Option<PathBuf>,
    /// How often the residency sampler reads `/proc`.
    pub sample_every: Duration,
    /// Where the knobs' environment variables are read.
    pub env: Env,
    /// The host memory figures the page-cache default is sized against
    /// (`None`: this host's, read at open).
    pub host_memory: Option<seam::host_memory::HostMemory>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            hash: false,
            config: None,
            sample_every: Duration::from_millis(20),
            env: Env::Process,
            host_memory: None,
        }
    }
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
    /// Wall time of staging (of handing out the host bytes, where the
    /// device reads them in place).
    pub seconds: f64,
    /// Tensor bytes staged per second, in GB/s (10^9); `None` (JSON `null`)
    /// where the device reads the host in place: nothing is staged, so
    /// there is no rate (the time went to the open: `open_seconds`).
    pub gbps: Option<f64>,
    /// Whether the device reads the mapped file in place (the host): then
    /// nothing is staged, nothing copied and nothing released.
    pub reads_in_place: bool,
    /// Wall time from the start of the load to the file opened: the
    /// mapping, with its prefault where the policy asks for one (on the
    /// host, where the file is read).
    pub open_seconds: f64,
    /// Bytes held on the device after the load.
    pub device_bytes: u64,
    /// Bytes of weights whose host copy was given back.
    pub released_bytes: u64,
    /// Bytes of whole pages dropped from this process.
    pub released_page_bytes: u64,
    /// The seam's counters for the device.
    pub counts: StageCounts,
    /// What the staging ring carried (`null` without a ring).
    pub ring: Option<RingCounts>,
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

impl LoadReport {
    /// What the load did with the bytes, in words: `1.9 MiB onto fake in
    /// 0.01 s (0.19 GB/s)`, or where the device reads the file in place
    /// `1.9 MiB on host: staged nothing (the device reads the mapped file
    /// in place; opened in 1.73 s)`.
    pub fn staged_text(&self) -> String {
        let size = mib(self.bytes);
        match self.gbps {
            Some(gbps) if !self.reads_in_place => format!(
                "{size:.1} MiB onto {} in {:.2} s ({gbps:.2} GB/s)",
                self.device, self.seconds
            ),
            _ => format!(
                "{size:.1} MiB on {}: staged nothing (the device reads the mapped file in \
                 place; opened in {:.2} s)",
                self.device, self.open_seconds
            ),
        }
    }
}

/// The sha256 of what the device holds for a staged weight, as hex: the
/// host bytes where the device reads them, the device's own running hash
/// where it keeps one (the sink), else the device copy read back in
/// chunks of 8 MiB. What `seam load --hash` prints.
///
/// # Errors
///
/// A read-back failed.
pub fn device_sha256(
    platform: &dyn Platform,
    resident: &Resident<'_>,
) -> Result<String, DeviceError> {
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

/// Loads every tensor of the model at `path` onto `platform` through a
/// [`Session`], and reports what it cost. `on_policy` gets the resolution
/// line before staging starts; `on_progress(done, total)` is called after
/// each tensor.
///
/// # Errors
///
/// The file, a knob or a device operation failed.
pub fn load_model(
    path: &Path,
    platform: &dyn Platform,
    options: &LoadOptions,
    on_policy: &dyn Fn(&str),
    on_progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<LoadReport, LoadError> {
    let session = Session::new(
        platform,
        &SessionOptions {
            env: options.env.clone(),
            config: options.config.clone(),
            sample_every: Some(options.sample_every),
            sessions_on_host: 1,
            host_memory: options.host_memory,
        },
    )?;
    let model = session.open(path)?;
    let open_seconds = session.elapsed().as_secs_f64();
    // After the open: it settles the page-cache default by the model's size.
    let policy_line = session.policy_line();
    // Printed once the file is accepted: a bad file gets one line, its error.
    on_policy(&policy_line);
    let start = session.elapsed();
    let total = model.total_tensor_bytes();
    let done = std::sync::atomic::AtomicU64::new(0);
    let hashes: Vec<Mutex<Option<String>>> =
        model.tensors().iter().map(|_| Mutex::new(None)).collect();
    let staged = session.stage_all(&model, &|staged: Staged<'_>| {
        if options.hash {
            let digest = device_sha256(session.platform(), staged.resident)?;
            *hashes[staged.index]
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(digest);
        }
        let n = staged.tensor.n_bytes;
        on_progress(
            done.fetch_add(n, std::sync::atomic::Ordering::Relaxed) + n,
            total,
        );
        Ok(())
    });
    let seconds = (session.elapsed() - start).as_secs_f64();
    let sampling = session.finish_sampling();
    // The read pass is over: a file that changed under it (truncated,
    // rewritten in place, renamed over) makes what was staged and hashed
    // neither the old file nor the new one. That is the error to report,
    // also when staging failed because of it (a short read).
    model.check_unchanged()?;
    // The model stays resident on the device: the weights live until here.
    let weights = staged?;
    let held: u64 = weights
        .iter()
        .filter(|w| w.device_copy().is_some())
        .map(|w| w.host().len())
        .sum();
    let model_resident: u64 = model
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
    let per_tensor = model
        .tensors()
        .iter()
        .zip(hashes)
        .map(|(t, hash)| TensorReport {
            name: t.name.clone(),
            n_bytes: t.n_bytes,
            sha256: hash.into_inner().unwrap_or_else(|e| e.into_inner()),
        })
        .collect::<Vec<_>>();
    drop(weights);

    let counts = platform.stage_counters().snapshot();
    let (policy, ring_policy) = (session.policy(), session.ring_policy());
    let mut policy_map = std::collections::BTreeMap::new();
    for (name, r) in [
        ("mmap", &policy.mmap),
        ("prefault", &policy.prefault),
        ("release_host_weights", &policy.release_host_weights),
        ("drop_page_cache", &policy.drop_page_cache),
    ] {
        policy_map.insert(name.to_owned(), knob(r));
    }
    for (name, r) in [
        ("direct_io", &ring_policy.direct_io),
        ("registered", &ring_policy.registered),
    ] {
        policy_map.insert(name.to_owned(), knob(r));
    }
    for (name, r) in [
        ("pinned_h2d_mib", &ring_policy.mib),
        ("pinned_h2d_buffers", &ring_policy.buffers),
        ("pinned_h2d_readers", &ring_policy.readers),
        ("pinned_h2d_lanes", &ring_policy.lanes),
        ("pinned_h2d_direct_below", &ring_policy.direct_below),
        ("registered_window_mib", &ring_policy.window_mib),
        ("registered_min_mib", &ring_policy.registered_min_mib),
        ("registered_in_flight", &ring_policy.registered_in_flight),
    ] {
        policy_map.insert(name.to_owned(), knob(r));
    }
    let after = sampling.after;
    let reads_in_place = !platform.needs_weight_staging();
    Ok(LoadReport {
        file: path.to_path_buf(),
        device: platform.backend().name(),
        tensors: per_tensor.len(),
        bytes: total,
        seconds,
        gbps: match (reads_in_place, seconds > 0.0) {
            (true, _) => None,
            (false, true) => Some(total as f64 / seconds / 1e9),
            (false, false) => Some(0.0),
        },
        reads_in_place,
        open_seconds,
        device_bytes: held,
        released_bytes: counts.released_span_bytes,
        released_page_bytes: counts.released_page_bytes,
        counts,
        ring: session.ring_counts(),
        policy: policy_map,
        policy_line,
        rss: RssReport {
            baseline_mib: mib(sampling.baseline.rss),
            peak_mib: mib(after.peak.max(sampling.peak_of(|r| r.rss))),
            rss_file_peak_mib: mib(sampling.peak_of(|r| r.rss_file)),
            rss_anon_peak_mib: mib(sampling.peak_of(|r| r.rss_anon)),
            rss_file_after_mib: mib(after.rss_file),
            rss_anon_after_mib: mib(after.rss_anon),
            model_file_after_mib: mib(model_resident),
        },
        per_tensor,
        samples: sampling.samples,
    })
}
