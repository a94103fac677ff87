//! The load session: the entry point for loading a model onto a device.
//!
//! [`Session::new`] resolves the load's knobs once (environment, then the
//! config file, then the device's default), builds the staging ring the
//! policy asks for on a staging device, makes the session's queue and,
//! when asked, samples host residency. [`Session::open`] maps a GGUF file
//! (one file or the first shard of a split set) with the resolved prefault,
//! and settles the page-cache default by the model's size
//! ([`Session::size_page_cache_for`]);
//! [`Session::weight`] makes a tensor's [`Weight`] (a borrow, or an owned
//! copy with `mmap` off), [`Session::resident`] stages it through
//! [`resident_weight`] and [`Session::stage_all`] stages every tensor of a
//! model and hands the weights back, staged and alive.
//!
//! `seam load`, every family binary and downstream engines load through a
//! session; none wires the steps itself. A load over several devices opens
//! one session per device.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::SeamError;
use crate::borrow::MapOptions;
use crate::gguf::{GgufError, GgufModel, TensorInfo};
use crate::host_memory::HostMemory;
use crate::platform::{DeviceError, Platform, Queue};
use crate::policy::{
    KNOBS, LoadPolicy, PolicyConfig, PolicyError, Source, WithPolicy, page_cache_default,
};
use crate::residency::{self, Residency};
use crate::resident::{Resident, resident_weight};
use crate::ring::{RING_KNOBS, RingCounts, RingError, RingPolicy, StagingRing};
use crate::weight::{Role, Weight};

/// Why a session could not be opened or a load failed.
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
    /// The residency sampler's thread could not be started.
    #[error("starting the residency sampler: {0}")]
    Sampler(std::io::Error),
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

/// Where a session reads its knobs' environment variables.
#[derive(Clone, Debug, Default)]
pub enum Env {
    /// The process's environment.
    #[default]
    Process,
    /// These variables only (tests, embedding engines with their own
    /// settings).
    Vars(BTreeMap<String, String>),
}

impl Env {
    /// An environment of exactly these variables.
    pub fn vars<K: Into<String>, V: Into<String>>(vars: impl IntoIterator<Item = (K, V)>) -> Env {
        Env::Vars(
            vars.into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )
    }

    /// The value of `name`, if set.
    pub fn get(&self, name: &str) -> Option<String> {
        match self {
            Env::Process => std::env::var(name).ok(),
            Env::Vars(vars) => vars.get(name).cloned(),
        }
    }
}

/// How to open a session.
#[derive(Clone, Debug, Default)]
pub struct SessionOptions {
    /// Where the knobs' environment variables are read.
    pub env: Env,
    /// The config file (`--config`), read after the environment.
    pub config: Option<PathBuf>,
    /// Sample host residency this often from [`Session::new`] until
    /// [`Session::finish_sampling`]; `None` samples nothing.
    pub sample_every: Option<Duration>,
    /// Sessions loading at once on this host, one per device of a sharded
    /// load (0 or 1: this one alone). The device default shares the host's
    /// cores among them: two 24-reader rings on a 32-core host loaded two
    /// H200s slower (0.85 s) than one ring loaded one (0.71 s), while two
    /// 16-reader rings took 0.68 s.
    pub sessions_on_host: u64,
    /// The host's memory figures the page-cache default is sized against
    /// ([`page_cache_default`]); `None` reads them when a model is opened
    /// ([`HostMemory::current`]). An engine that plans its own use of host
    /// memory, or a test standing in for a small host, gives its own.
    pub host_memory: Option<HostMemory>,
}

/// One residency sample.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Sample {
    /// Seconds since the session opened.
    pub seconds: f64,
    /// The process's figures.
    pub residency: Residency,
    /// Bytes [`Session::stage_all`] (and [`Session::stage_picked`]) had
    /// copied to the device so far.
    pub device_bytes: u64,
}

/// The residency of a session: before it opened, the samples taken while
/// it ran, and now.
#[derive(Clone, Debug, Default)]
pub struct Sampling {
    /// Before the session opened (its peak reset).
    pub baseline: Residency,
    /// The samples, in time order.
    pub samples: Vec<Sample>,
    /// When sampling stopped.
    pub after: Residency,
}

impl Sampling {
    /// The highest sampled value of one figure, the final reading included.
    pub fn peak_of(&self, figure: fn(&Residency) -> u64) -> u64 {
        self.samples
            .iter()
            .map(|s| figure(&s.residency))
            .chain([figure(&self.after)])
            .max()
            .unwrap_or(0)
    }
}

/// The name of the residency sampler's thread.
pub const SAMPLER_THREAD: &str = "seam-residency";

/// Samples residency on a thread until stopped.
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<Sample>>,
}

impl Sampler {
    fn start(
        every: Duration,
        start: Instant,
        device_bytes: Arc<AtomicU64>,
    ) -> std::io::Result<Sampler> {
        let stop = Arc::new(AtomicBool::new(false));
        let stop_flag = Arc::clone(&stop);
        // Named, so a test (or an operator's `top -H`) can see it stop.
        let thread = std::thread::Builder::new().name(SAMPLER_THREAD.into());
        let thread = thread.spawn(move || {
            let mut samples = Vec::new();
            loop {
                // Read before the sample, so the last sample is taken after
                // the stop (and sees everything staged before it).
                let stopping = stop_flag.load(Ordering::Acquire);
                if let Ok(residency) = residency::current() {
                    samples.push(Sample {
                        seconds: start.elapsed().as_secs_f64(),
                        residency,
                        device_bytes: device_bytes.load(Ordering::Relaxed),
                    });
                }
                if stopping {
                    return samples;
                }
                std::thread::sleep(every);
            }
        })?;
        Ok(Sampler { stop, thread })
    }

    fn finish(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Release);
        self.thread.join().unwrap_or_default()
    }
}

/// One tensor just staged by [`Session::stage_all`] or
/// [`Session::stage_picked`].
#[derive(Debug)]
pub struct Staged<'a> {
    /// The tensor's index in the model's table.
    pub index: usize,
    /// The tensor.
    pub tensor: &'a TensorInfo,
    /// Its weight.
    pub weight: &'a Weight,
    /// What a kernel may read for it.
    pub resident: &'a Resident<'a>,
}

/// Resolves the load's knobs and the ring's for `platform`: the
/// environment, then the config file (whose keys must all be knobs), then
/// the device's defaults.
///
/// # Errors
///
/// A knob or the config file is wrong.
fn resolve_policies(
    env: &Env,
    config: Option<&Path>,
    platform: &dyn Platform,
    sessions_on_host: u64,
) -> Result<(LoadPolicy, RingPolicy), PolicyError> {
    let config = match config {
        Some(path) => Some(PolicyConfig::from_file(
            path,
            &[KNOBS, RING_KNOBS].concat(),
        )?),
        None => None,
    };
    let env = |name: &str| env.get(name);
    Ok((
        LoadPolicy::resolve(&env, config.as_ref(), platform)?,
        RingPolicy::resolve(
            &env,
            config.as_ref(),
            cores_per_session(crate::ring::host_cores(), sessions_on_host),
            platform.backend().transfer_caps(),
        )?,
    ))
}

/// The cores one of `sessions` sessions loading at once counts for its
/// device default (at least one).
pub fn cores_per_session(cores: u64, sessions: u64) -> u64 {
    (cores / sessions.max(1)).max(1)
}

/// A load onto one device: the resolved knobs, the ring, the queue, and
/// the residency sampling. See the [module documentation](self).
pub struct Session<'p> {
    device: WithPolicy<'p>,
    policy: Mutex<LoadPolicy>,
    /// No knob set `drop_page_cache` and the device's default drops: the
    /// models opened decide ([`Session::size_page_cache_for`]).
    sizes_page_cache: bool,
    host_memory: Option<HostMemory>,
    /// Bytes of the files of every model sized so far.
    opened_bytes: AtomicU64,
    ring_policy: RingPolicy,
    queue: Box<dyn Queue>,
    start: Instant,
    baseline: Residency,
    device_bytes: Arc<AtomicU64>,
    sampler: Mutex<Option<Sampler>>,
}

impl std::fmt::Debug for Session<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("device", &self.device.backend().name())
            .field("policy", &self.policy_line())
            .finish()
    }
}

impl<'p> Session<'p> {
    /// Opens a session on `platform`: resolves the knobs once, builds the
    /// staging ring where the device stages weights and the ring is on,
    /// makes the queue, and starts sampling residency when asked.
    ///
    /// # Errors
    ///
    /// A knob or the config file is wrong, or the ring or the queue cannot
    /// be made.
    pub fn new(
        platform: &'p dyn Platform,
        options: &SessionOptions,
    ) -> Result<Session<'p>, LoadError> {
        let (policy, ring_policy) = resolve_policies(
            &options.env,
            options.config.as_deref(),
            platform,
            options.sessions_on_host,
        )?;
        let sizes_page_cache = policy.drop_page_cache.source == Source::DeviceDefault
            && policy.drop_page_cache.value.0;
        let mut device = WithPolicy::new(platform, policy.residency_policy());
        if platform.needs_weight_staging()
            && let Some(config) = ring_policy.ring_config()
        {
            device = device.with_ring(StagingRing::new(platform.backend(), config)?);
        }
        let queue = device.backend().create_queue()?;
        if options.sample_every.is_some() {
            // The peak (VmHWM) counts from here; a kernel without
            // clear_refs keeps the process's peak.
            let _ = residency::reset_peak();
        }
        let baseline = residency::current().unwrap_or_default();
        let start = Instant::now();
        let device_bytes = Arc::new(AtomicU64::new(0));
        let sampler = options
            .sample_every
            .map(|every| Sampler::start(every, start, Arc::clone(&device_bytes)))
            .transpose()
            .map_err(LoadError::Sampler)?;
        Ok(Session {
            device,
            policy: Mutex::new(policy),
            sizes_page_cache,
            host_memory: options.host_memory,
            opened_bytes: AtomicU64::new(0),
            ring_policy,
            queue,
            start,
            baseline,
            device_bytes,
            sampler: Mutex::new(sampler),
        })
    }

    /// Maps the GGUF file at `path` (the first shard of a split set opens
    /// them all) with the resolved prefault, and sizes the page-cache
    /// default by it ([`Session::size_page_cache_for`]).
    ///
    /// # Errors
    ///
    /// The file cannot be opened or is malformed.
    pub fn open(&self, path: &Path) -> Result<GgufModel, LoadError> {
        let options = MapOptions {
            prefault: self.lock_policy().prefault.value.0,
        };
        let model = GgufModel::open(path, options)?;
        self.size_page_cache_for(&model);
        Ok(model)
    }

    /// Settles the page-cache default for a load that also stages from
    /// `model` (called by [`Session::open`]; a session that stages from a
    /// model another session opened calls it itself): where no knob set
    /// `drop_page_cache` and the device's default drops, the files of every
    /// model sized so far are weighed against the host's room
    /// ([`page_cache_default`]), and the page cache is dropped only where
    /// they cannot stay cached. Call it before staging from the model.
    pub fn size_page_cache_for(&self, model: &GgufModel) {
        if !self.sizes_page_cache {
            return;
        }
        let bytes: u64 = model.shards().iter().map(|s| s.mapped().len()).sum();
        // Under the policy's lock, so two models opened at once settle on
        // the decision for both.
        let mut policy = self.lock_policy();
        let total = self.opened_bytes.fetch_add(bytes, Ordering::AcqRel) + bytes;
        let decided = page_cache_default(total, self.host_memory.or_else(HostMemory::current));
        self.device.set_drop_page_cache(decided.value.0);
        policy.drop_page_cache = decided;
    }

    fn lock_policy(&self) -> std::sync::MutexGuard<'_, LoadPolicy> {
        self.policy.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The resolved knobs of the load (the page-cache default as sized by
    /// the models opened so far).
    pub fn policy(&self) -> LoadPolicy {
        self.lock_policy().clone()
    }

    /// The resolved knobs of the ring.
    pub fn ring_policy(&self) -> &RingPolicy {
        &self.ring_policy
    }

    /// The line naming each resolved knob and where it came from.
    pub fn policy_line(&self) -> String {
        format!(
            "{}; {}",
            self.policy().summary_line(),
            self.ring_policy.summary_line()
        )
    }

    /// The device with the load's residency policy and ring applied: the
    /// platform to hand to [`resident_weight`].
    pub fn platform(&self) -> &dyn Platform {
        &self.device
    }

    /// The session's queue. Staging has completed on it when
    /// [`Session::resident`] returns; its [`native`](Queue::native) handle
    /// orders an engine's own work on the same stream.
    pub fn queue(&self) -> &dyn Queue {
        &*self.queue
    }

    /// The ring's counts (`None` where the session has no ring: the device
    /// reads host memory, or the ring is off).
    pub fn ring_counts(&self) -> Option<RingCounts> {
        self.device.staging_ring().map(StagingRing::counts)
    }

    /// The weight of `tensor` in `model`: a borrow of the mapping, or with
    /// `mmap` off an owned copy read from the file.
    ///
    /// # Errors
    ///
    /// The tensor lies outside its file, or reading it failed.
    pub fn weight(
        &self,
        model: &GgufModel,
        tensor: &TensorInfo,
        role: Role,
    ) -> Result<Weight, LoadError> {
        let (name, ty, dims) = (&tensor.name, tensor.ggml_type, tensor.dims.clone());
        Ok(if self.lock_policy().mmap.value.0 {
            Weight::borrowed(name, ty, dims, role, model.tensor_borrow(tensor)?)
        } else {
            Weight::owned(name, ty, dims, role, read_owned(model, tensor)?)
        })
    }

    /// What a kernel may read for `weight` on this session's device,
    /// staged on first use ([`resident_weight`] with the session's
    /// platform and queue).
    ///
    /// # Errors
    ///
    /// As [`resident_weight`].
    pub fn resident<'w>(&self, weight: &'w Weight) -> Result<Resident<'w>, SeamError> {
        resident_weight(weight, self.platform(), self.queue())
    }

    /// Stages every tensor of `model` (role `"tensor"`), in parallel across
    /// the ring's lanes, calling `on_staged` after each; returns the
    /// weights in table order, staged and alive. Waits for the page cache
    /// of released weights to be dropped before returning.
    ///
    /// # Errors
    ///
    /// The first error of a tensor's staging or of `on_staged`; the other
    /// workers stop at their next tensor.
    pub fn stage_all(
        &self,
        model: &GgufModel,
        on_staged: &(dyn Fn(Staged<'_>) -> Result<(), LoadError> + Sync),
    ) -> Result<Vec<Weight>, LoadError> {
        let staged = self.stage_picked(model, &|_, _| true, on_staged)?;
        Ok(staged.into_iter().map(|(_, weight)| weight).collect())
    }

    /// Stages the tensors of `model` that `pick` chooses (by index in the
    /// table and tensor) as [`Session::stage_all`] stages every one: in
    /// parallel across the ring's lanes, `on_staged` after each, the page
    /// cache of released weights dropped before returning. Returns each
    /// picked tensor's index and weight, in table order. An engine that
    /// staged some weights itself, or wants only some, stages the rest
    /// here; `on_staged`'s own error type (any that a [`LoadError`]
    /// converts into) carries an error of the engine's callback out
    /// unchanged.
    ///
    /// # Errors
    ///
    /// The first error of a tensor's staging or of `on_staged`; the other
    /// workers stop at their next tensor.
    pub fn stage_picked<E: From<LoadError> + Send>(
        &self,
        model: &GgufModel,
        pick: &(dyn Fn(usize, &TensorInfo) -> bool + Sync),
        on_staged: &(dyn Fn(Staged<'_>) -> Result<(), E> + Sync),
    ) -> Result<Vec<(usize, Weight)>, E> {
        let tensors = model.tensors();
        let picked: Vec<usize> = (0..tensors.len())
            .filter(|&i| pick(i, &tensors[i]))
            .collect();
        // One staging thread per ring lane: while one weight's pipeline
        // drains, the next one's fills.
        let workers = self
            .device
            .staging_ring()
            .map_or(1, StagingRing::lanes)
            .min(picked.len().max(1));
        let next = AtomicU64::new(0);
        let slots: Vec<Mutex<Option<Weight>>> = picked.iter().map(|_| Mutex::new(None)).collect();
        let first_error: Mutex<Option<E>> = Mutex::new(None);
        std::thread::scope(|scope| {
            for _ in 0..workers {
                let (next, slots, first_error, picked) = (&next, &slots, &first_error, &picked);
                scope.spawn(move || {
                    let staged = (|| -> Result<(), E> {
                        // A queue per worker, so copies do not wait on each
                        // other's synchronize.
                        let queue = self
                            .device
                            .backend()
                            .create_queue()
                            .map_err(LoadError::from)?;
                        let queue = &*queue;
                        loop {
                            if lock(first_error).is_some() {
                                return Ok(());
                            }
                            let slot = next.fetch_add(1, Ordering::Relaxed) as usize;
                            let Some(&index) = picked.get(slot) else {
                                return Ok(());
                            };
                            let tensor = &tensors[index];
                            let weight = self.weight(model, tensor, Role::new("tensor"))?;
                            let resident = resident_weight(&weight, self.platform(), queue)
                                .map_err(LoadError::from)?;
                            if resident.device_copy().is_some() {
                                self.device_bytes
                                    .fetch_add(tensor.n_bytes, Ordering::Relaxed);
                            }
                            on_staged(Staged {
                                index,
                                tensor,
                                weight: &weight,
                                resident: &resident,
                            })?;
                            drop(resident);
                            *lock(&slots[slot]) = Some(weight);
                        }
                    })();
                    if let Err(e) = staged {
                        lock(first_error).get_or_insert(e);
                    }
                });
            }
        });
        if let Some(e) = lock(&first_error).take() {
            return Err(e);
        }
        // The page cache of released weights is dropped in the background;
        // the load is done when that is done too.
        crate::page_cache::flush().map_err(LoadError::PageCache)?;
        Ok(picked
            .into_iter()
            .zip(slots)
            .filter_map(|(index, slot)| {
                let weight = slot.into_inner().unwrap_or_else(|e| e.into_inner());
                weight.map(|w| (index, w))
            })
            .collect())
    }

    /// Stops the residency sampler and returns what it saw (no samples
    /// where the session was opened without `sample_every`, or sampling
    /// already finished).
    pub fn finish_sampling(&self) -> Sampling {
        let samples = lock(&self.sampler)
            .take()
            .map(Sampler::finish)
            .unwrap_or_default();
        Sampling {
            baseline: self.baseline,
            samples,
            after: residency::current().unwrap_or_default(),
        }
    }

    /// Seconds since the session opened.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        if let Some(sampler) = lock(&self.sampler).take() {
            sampler.finish();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Reads a tensor's bytes into an owned buffer (`mmap` off).
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
