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
    Backend, DeviceBuffer, DeviceError, HostRelease, NativeQueue, PinnedBuffer, Queue, StagingCopy,
    buffer_range,
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
/// (never guessed from its name); each platform derives its
/// [`DevicePolicy`] from them by its vendor's rule.
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
    /// coherent links).
    pub pageable_memory_access: bool,
    /// The GPU is integrated: it shares the host's memory.
    pub integrated: bool,
}

/// The seam policy of a device, derived from its [`DeviceProbe`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DevicePolicy {
    /// Kernels read device copies.
    pub needs_weight_staging: bool,
    /// The device reads host memory, so a staged weight's host pages may
    /// still be read and are never released.
    pub host_memory_is_device_addressable: bool,
    /// The host addresses the device's memory (an integrated GPU).
    pub device_memory_is_host_addressable: bool,
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
    released_bytes: AtomicU64,
    released_span_bytes: AtomicU64,
}

/// A snapshot of [`StageCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct StageCounts {
    /// Weights copied to the device.
    pub uploads: u64,
    /// Bytes copied to the device.
    pub uploaded_bytes: u64,
    /// Weights whose host bytes were given back.
    pub releases: u64,
    /// Bytes given back (whole pages of borrows, all of owned buffers).
    pub released_bytes: u64,
    /// Bytes of the released weights' host spans.
    pub released_span_bytes: u64,
}

impl StageCounters {
    pub(crate) fn record_upload(&self, bytes: u64) {
        self.uploads.fetch_add(1, Ordering::Relaxed);
        self.uploaded_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn record_release(&self, release: &HostRelease) {
        self.releases.fetch_add(1, Ordering::Relaxed);
        self.released_bytes
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
            released_bytes: self.released_bytes.load(Ordering::Relaxed),
            released_span_bytes: self.released_span_bytes.load(Ordering::Relaxed),
        }
    }
}

/// Policy over a backend: whether weights must be staged, and what may be
/// given back once they are.
///
/// Platforms probe the real device for these answers (CUDA/ROCm: the
/// pageable-memory-access attribute, integrated or discrete); they do not
/// guess from a name.
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
    /// access, an integrated GPU, the CPU). If so, the host pages of a
    /// staged weight may still be read by the device and are never released.
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
}
