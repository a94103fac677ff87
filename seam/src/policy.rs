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
    policy: ResidencyPolicy,
    ring: Option<StagingRing>,
}

impl<'p> WithPolicy<'p> {
    /// `platform` with `policy`.
    pub fn new(platform: &'p dyn Platform, policy: ResidencyPolicy) -> WithPolicy<'p> {
        WithPolicy {
            platform,
            policy,
            ring: None,
        }
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
        self.policy
    }
    fn stage_counters(&self) -> &StageCounters {
        self.platform.stage_counters()
    }
    fn staging_ring(&self) -> Option<&StagingRing> {
        self.ring.as_ref()
    }
}
