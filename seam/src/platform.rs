//! The device traits: [`Backend`] (memory operations of one device) and
//! [`Platform`] (policy over a backend). Each platform crate under
//! `platforms/` implements both for one vendor; the seam knows none of them.
//!
//! The traits are object safe: a binary picks its platform at run time and
//! the seam works through `&dyn Platform`. Errors are one small closed enum,
//! [`DeviceError`].
//!
//! The backend layer (the [`Backend`] trait, buffers, queues and the
//! [`StagingCopy`] only the seam can make) lives in its own module, below
//! the staging ring, and is re-exported here: this module sits on the ring
//! (a platform may carry one), so neither imports the other in a cycle.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::ring::StagingRing;

pub use crate::backend::{
    Backend, DeviceBuffer, DeviceError, HostRegistration, HostRelease, NativeQueue, PinnedBuffer,
    Queue, StagingCopy, TransferCaps, buffer_range,
};

/// How a platform treats host copies of weights once the device has its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResidencyPolicy {
    /// Give an owned host copy back (drop it) once its device copy exists.
    /// Borrows follow the seam's release conditions instead.
    pub release_host_weights_after_upload: bool,
    /// After dropping a borrow's resident pages, also ask the kernel to drop
    /// the file's page cache for that range (`posix_fadvise(DONTNEED)`).
    pub drop_page_cache: bool,
}

impl Default for ResidencyPolicy {
    fn default() -> Self {
        ResidencyPolicy {
            release_host_weights_after_upload: true,
            drop_page_cache: true,
        }
    }
}

/// The facts a GPU reports about itself, read from its driver's attributes
/// (never guessed from its name); [`DevicePolicy::from_probe`] derives the
/// seam's policy from them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceProbe {
    /// The device's ordinal.
    pub ordinal: i32,
    /// The device's name.
    pub name: String,
    /// Total device memory in bytes.
    pub total_bytes: u64,
    /// Free device memory in bytes.
    pub free_bytes: u64,
    /// Kernels can read pageable host memory (CUDA's
    /// `PAGEABLE_MEMORY_ACCESS`, HIP's `PageableMemoryAccess`: HMM,
    /// coherent links such as GH200's NVLink-C2C).
    pub pageable_memory_access: bool,
    /// The GPU is integrated (it shares the host's DRAM). Reported by
    /// `seam doctor`; it decides nothing, because a `cuMemAlloc` or
    /// `hipMalloc` allocation is a separate copy on integrated parts too.
    pub integrated: bool,
}

/// The seam policy of a device, derived from its [`DeviceProbe`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DevicePolicy {
    /// Kernels read device copies, so weights are staged.
    pub needs_weight_staging: bool,
    /// The device reads host memory, so a weight's host pages may be read
    /// by kernels and are never released.
    pub host_memory_is_device_addressable: bool,
    /// The backend's weight allocation IS host memory read in place (a
    /// zero-copy mapping of the host pages), so the "device copy" shares
    /// the host's pages.
    pub device_memory_is_host_addressable: bool,
}

impl DevicePolicy {
    /// The policy of a GPU whose backend allocates weights with the
    /// driver's device allocator (`cuMemAlloc`, `hipMalloc`), from what the
    /// driver reports:
    ///
    /// - pageable memory access (HMM or ATS, e.g. GH200): kernels read the
    ///   host pages themselves, so nothing is staged and nothing released;
    ///   the prefault default is on;
    /// - otherwise the weights are staged, and a staged borrow's pages are
    ///   given back after its copy completes; the prefault default is off.
    ///
    /// The allocation is a separate copy on every part, integrated (Jetson
    /// Orin and Thor, Strix Halo) or discrete, so device memory is never
    /// host-addressable here and `integrated` decides nothing: an APU
    /// stages and releases like a discrete GPU (the seed's wedged host was
    /// such an APU, whose pages were never given back).
    pub fn from_probe(probe: &DeviceProbe) -> DevicePolicy {
        DevicePolicy {
            needs_weight_staging: !probe.pageable_memory_access,
            host_memory_is_device_addressable: probe.pageable_memory_access,
            device_memory_is_host_addressable: false,
        }
    }

    /// The residency policy that goes with it: a staging device gives owned
    /// host copies back after upload and drops released ranges from the
    /// page cache; a device that reads host memory keeps both (its kernels
    /// read them).
    pub fn residency_policy(&self) -> ResidencyPolicy {
        ResidencyPolicy {
            release_host_weights_after_upload: self.needs_weight_staging,
            drop_page_cache: self.needs_weight_staging,
        }
    }

    /// What the seam does on this device, in words (for `seam doctor`);
    /// the prefault part is the device default of the load's policy.
    pub fn decision(&self) -> String {
        if !self.needs_weight_staging {
            return "kernels read the mapped file: nothing staged, nothing released, prefault on"
                .into();
        }
        let prefault = if self.host_memory_is_device_addressable {
            "on"
        } else {
            "off"
        };
        let release =
            if self.host_memory_is_device_addressable || self.device_memory_is_host_addressable {
                "keeps host pages (the device may read them)"
            } else {
                "gives a staged borrow's host pages back after its copy"
            };
        format!("stages weights, prefault {prefault}, {release}")
    }
}

/// Identifies one device of one platform instance, so a weight's device
/// copy is never handed to a different device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DeviceId(pub u64);

impl DeviceId {
    /// A process-unique id for a new platform instance.
    pub fn fresh() -> DeviceId {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        DeviceId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// Counters the seam keeps per platform instance (per device): uploads and
/// releases, so a report can show each weight was staged and released once.
#[derive(Debug, Default)]
pub struct StageCounters {
    uploads: AtomicU64,
    uploaded_bytes: AtomicU64,
    releases: AtomicU64,
    released_page_bytes: AtomicU64,
    released_span_bytes: AtomicU64,
    receives: AtomicU64,
    received_bytes: AtomicU64,
}

/// A snapshot of [`StageCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct StageCounts {
    /// Weights copied to the device from host bytes.
    pub uploads: u64,
    /// Bytes copied to the device from host bytes.
    pub uploaded_bytes: u64,
    /// Weights whose host bytes were given back.
    pub releases: u64,
    /// Bytes given back (whole pages of borrows, all of owned buffers);
    /// `seam load` reports the spans' bytes as `released_bytes`, so this
    /// one is named for what it counts.
    pub released_page_bytes: u64,
    /// Bytes of the released weights' host spans.
    pub released_span_bytes: u64,
    /// Weights whose device copy was received from another device (a
    /// broadcast) rather than copied from host bytes.
    pub receives: u64,
    /// Bytes received so.
    pub received_bytes: u64,
}

impl StageCounters {
    pub(crate) fn record_upload(&self, bytes: u64) {
        self.uploads.fetch_add(1, Ordering::Relaxed);
        self.uploaded_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn record_receive(&self, bytes: u64) {
        self.receives.fetch_add(1, Ordering::Relaxed);
        self.received_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn record_release(&self, release: &HostRelease) {
        self.releases.fetch_add(1, Ordering::Relaxed);
        self.released_page_bytes
            .fetch_add(release.released, Ordering::Relaxed);
        self.released_span_bytes
            .fetch_add(release.len, Ordering::Relaxed);
    }

    /// The counts now.
    pub fn snapshot(&self) -> StageCounts {
        StageCounts {
            uploads: self.uploads.load(Ordering::Relaxed),
            uploaded_bytes: self.uploaded_bytes.load(Ordering::Relaxed),
            releases: self.releases.load(Ordering::Relaxed),
            released_page_bytes: self.released_page_bytes.load(Ordering::Relaxed),
            released_span_bytes: self.released_span_bytes.load(Ordering::Relaxed),
            receives: self.receives.load(Ordering::Relaxed),
            received_bytes: self.received_bytes.load(Ordering::Relaxed),
        }
    }
}

/// Policy over a backend: whether weights must be staged, and what may be
/// given back once they are.
///
/// Platforms probe the real device for these answers (CUDA/ROCm: the
/// pageable-memory-access attribute, through [`DevicePolicy::from_probe`]);
/// they do not guess from a name.
///
/// Threading: a platform is shared by every thread that stages onto its
/// device, and the seam asks its questions from any of them, on every
/// call of [`resident_weight`](crate::resident_weight); the answers must
/// not change while weights are staged (a weight staged under one answer
/// is released under the same). It must outlive every weight staged on it
/// (their device copies are its backend's buffers).
pub trait Platform: Send + Sync {
    /// The backend.
    fn backend(&self) -> &dyn Backend;

    /// Which device this is (unique per platform instance and device).
    fn device_id(&self) -> DeviceId;

    /// Whether kernels need a device copy of a weight (a discrete GPU);
    /// `false` where kernels read host bytes (the CPU).
    fn needs_weight_staging(&self) -> bool;

    /// Whether the device can read host memory directly (pageable memory
    /// access, the CPU). If so, the host pages of a staged weight may still
    /// be read by the device and are never released. Being integrated does
    /// not make a GPU answer yes: its kernels read the device allocation.
    fn host_memory_is_device_addressable(&self) -> bool;

    /// The residency policy (platform default with the load's knobs applied).
    fn residency_policy(&self) -> ResidencyPolicy;

    /// The seam's counters for this device.
    fn stage_counters(&self) -> &StageCounters;

    /// The load's staging ring, through which large copies go; `None`
    /// copies every weight directly from its host bytes.
    fn staging_ring(&self) -> Option<&StagingRing> {
        None
    }

    /// Where device copies come from instead of the host bytes: another
    /// device's copy, received by broadcast (a sharded load's replicated
    /// weights); `None` copies from the host bytes.
    fn broadcast_source(&self) -> Option<crate::backend::BroadcastSource<'_>> {
        None
    }
}
