//! The load's knobs, resolved once per load: environment, then the config
//! file, then the device-aware default (the brief's prefault policy; the
//! same precedence for every knob).
//!
//! Unknown config keys and unparsable values are errors naming the key (a
//! typo there once cost a machine its memory). [`LoadPolicy::summary_line`]
//! names each resolved value and where it came from.

pub use crate::knob::{
    Knob, KnobValue, PolicyConfig, PolicyError, Resolved, Source, Switch, resolve_knob, source_name,
};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::host_memory::{HostMemory, RoomSource};
use crate::platform::{Backend, DeviceId, Platform, ResidencyPolicy, StageCounters};
use crate::ring::StagingRing;

/// Map files without copying (off: read tensors into owned buffers).
pub const MMAP: Knob = Knob {
    env: "VT_GGUF_MMAP",
    key: "vllm_cpp.mmap.enabled",
};
/// Prefault the mapping (MAP_POPULATE + WILLNEED).
pub const PREFAULT: Knob = Knob {
    env: "VT_GGUF_PREFAULT",
    key: "vllm_cpp.mmap.prefault",
};
/// Give owned host copies back after upload.
pub const RELEASE_HOST_WEIGHTS: Knob = Knob {
    env: "VT_RELEASE_HOST_WEIGHTS",
    key: "vllm_cpp.release_host_weights",
};
/// Drop the page cache of released borrows (posix_fadvise DONTNEED).
pub const DROP_PAGE_CACHE: Knob = Knob {
    env: "VT_GGUF_DROP_PAGE_CACHE",
    key: "vllm_cpp.mmap.drop_page_cache",
};

/// Every knob, in the order the summary line prints them.
pub const KNOBS: &[Knob] = &[MMAP, PREFAULT, RELEASE_HOST_WEIGHTS, DROP_PAGE_CACHE];

/// The prefault default for a device: ON where kernels read host memory
/// directly (the CPU, host-addressable devices: faults move off the first
/// forward step), OFF where the device cannot read host memory (staging
/// reads every page exactly once anyway).
pub fn prefault_for_device(platform: &dyn Platform) -> bool {
    !platform.needs_weight_staging() || platform.host_memory_is_device_addressable()
}

/// A model is kept in the page cache only while its files take at most
/// this share (one over the divisor) of the room the host has
/// ([`HostMemory::room`]): the rest stays for the engine's own host memory
/// (activations, a KV cache kept on the host, a second process), and a model
/// that takes more would push out that memory or its own first pages before
/// the next load could find it cached anyway.
pub const PAGE_CACHE_ROOM_DIVISOR: u64 = 2;

/// The page-cache default of a staging device whose default drops it, for a
/// load of files of `file_bytes` in all: dropped only where the model
/// cannot stay cached (more than one [`PAGE_CACHE_ROOM_DIVISOR`]th of the
/// host's room), else kept, so the next load of the same file reads the
/// page cache instead of the disk. Dropped where the host's figures are
/// unknown. The source says why.
pub fn page_cache_default(file_bytes: u64, host: Option<HostMemory>) -> Resolved<Switch> {
    let because = |drop: bool, why: String| Resolved {
        value: Switch(drop),
        source: Source::DeviceDefaultBecause(why),
    };
    let Some(host) = host else {
        return because(true, "host memory unknown".into());
    };
    let (room, bound) = host.room();
    let whose = match bound {
        RoomSource::Host => "available",
        RoomSource::Cgroup => "available to the cgroup",
    };
    let share = format!("1/{PAGE_CACHE_ROOM_DIVISOR} of {} {whose}", size_text(room));
    if file_bytes <= room / PAGE_CACHE_ROOM_DIVISOR {
        because(false, format!("{} fits in {share}", size_text(file_bytes)))
    } else {
        because(
            true,
            format!("{} is more than {share}", size_text(file_bytes)),
        )
    }
}

/// Bytes in GiB from 1 GiB up, else in MiB, to one decimal.
fn size_text(bytes: u64) -> String {
    const GIB: u64 = 1 << 30;
    if bytes >= GIB {
        format!("{:.1} GiB", bytes as f64 / GIB as f64)
    } else {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}

/// The resolved knobs of one load.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadPolicy {
    /// Map the file (else read tensors into owned buffers).
    pub mmap: Resolved<Switch>,
    /// Prefault the mapping.
    pub prefault: Resolved<Switch>,
    /// Give owned host copies back after upload.
    pub release_host_weights: Resolved<Switch>,
    /// Drop the page cache of released borrows.
    pub drop_page_cache: Resolved<Switch>,
}

impl LoadPolicy {
    /// Resolves every knob for a load onto `platform`, reading the
    /// environment through `env` (`std::env::var(..).ok()` in binaries; a
    /// map in tests).
    ///
    /// # Errors
    ///
    /// A value does not parse.
    pub fn resolve(
        env: &dyn Fn(&str) -> Option<String>,
        config: Option<&PolicyConfig>,
        platform: &dyn Platform,
    ) -> Result<LoadPolicy, PolicyError> {
        let device = |value: bool| Resolved {
            value: Switch(value),
            source: Source::DeviceDefault,
        };
        let platform_policy = platform.residency_policy();
        Ok(LoadPolicy {
            mmap: resolve_knob(
                MMAP,
                env,
                config,
                Resolved {
                    value: Switch(true),
                    source: Source::BuiltIn,
                },
            )?,
            prefault: resolve_knob(PREFAULT, env, config, device(prefault_for_device(platform)))?,
            release_host_weights: resolve_knob(
                RELEASE_HOST_WEIGHTS,
                env,
                config,
                device(platform_policy.release_host_weights_after_upload),
            )?,
            drop_page_cache: resolve_knob(
                DROP_PAGE_CACHE,
                env,
                config,
                device(platform_policy.drop_page_cache),
            )?,
        })
    }

    /// The residency policy these knobs give.
    pub fn residency_policy(&self) -> ResidencyPolicy {
        ResidencyPolicy {
            release_host_weights_after_upload: self.release_host_weights.value.0,
            drop_page_cache: self.drop_page_cache.value.0,
        }
    }

    /// One line naming each value and where it came from.
    pub fn summary_line(&self) -> String {
        let item = |name: &str, r: &Resolved<Switch>| format!("{name}={} ({})", r.value, r.source);
        format!(
            "policy: {}, {}, {}, {}",
            item("mmap", &self.mmap),
            item("prefault", &self.prefault),
            item("release_host_weights", &self.release_host_weights),
            item("drop_page_cache", &self.drop_page_cache),
        )
    }
}

/// A platform with a load's residency policy applied: delegates everything
/// to the platform it wraps except [`Platform::residency_policy`].
pub struct WithPolicy<'p> {
    platform: &'p dyn Platform,
    release_host_weights_after_upload: bool,
    /// Settled when the model is opened ([`WithPolicy::set_drop_page_cache`]),
    /// before any weight is staged.
    drop_page_cache: AtomicBool,
    ring: Option<StagingRing>,
}

impl<'p> WithPolicy<'p> {
    /// `platform` with `policy`.
    pub fn new(platform: &'p dyn Platform, policy: ResidencyPolicy) -> WithPolicy<'p> {
        WithPolicy {
            platform,
            release_host_weights_after_upload: policy.release_host_weights_after_upload,
            drop_page_cache: AtomicBool::new(policy.drop_page_cache),
            ring: None,
        }
    }

    /// Sets whether released ranges are dropped from the page cache (the
    /// page-cache default, sized once the model's size is known).
    pub fn set_drop_page_cache(&self, drop: bool) {
        self.drop_page_cache.store(drop, Ordering::Release);
    }

    /// The same, with large copies going through `ring`.
    pub fn with_ring(mut self, ring: StagingRing) -> WithPolicy<'p> {
        self.ring = Some(ring);
        self
    }
}

impl Platform for WithPolicy<'_> {
    fn backend(&self) -> &dyn Backend {
        self.platform.backend()
    }
    fn device_id(&self) -> DeviceId {
        self.platform.device_id()
    }
    fn needs_weight_staging(&self) -> bool {
        self.platform.needs_weight_staging()
    }
    fn host_memory_is_device_addressable(&self) -> bool {
        self.platform.host_memory_is_device_addressable()
    }
    fn residency_policy(&self) -> ResidencyPolicy {
        ResidencyPolicy {
            release_host_weights_after_upload: self.release_host_weights_after_upload,
            drop_page_cache: self.drop_page_cache.load(Ordering::Acquire),
        }
    }
    fn stage_counters(&self) -> &StageCounters {
        self.platform.stage_counters()
    }
    fn staging_ring(&self) -> Option<&StagingRing> {
        self.ring.as_ref()
    }
}
