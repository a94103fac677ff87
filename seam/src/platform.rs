//! The device traits: [`Backend`] (memory operations of one device) and
//! [`Platform`] (policy over a backend). Each platform crate under
//! `platforms/` implements both for one vendor; the seam knows none of them.
//!
//! The traits are object safe: a binary picks its platform at run time and
//! the seam works through `&dyn Platform`. Errors are one small closed enum,
//! [`DeviceError`].

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};

/// An error from a device operation.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeviceError {
    /// The device could not allocate the bytes asked for.
    #[error("out of device memory allocating {bytes} bytes")]
    OutOfMemory {
        /// Bytes asked for.
        bytes: u64,
    },
    /// A copy failed.
    #[error("copy failed: {0}")]
    CopyFailed(String),
    /// The device or its driver is not usable.
    #[error("device unavailable: {0}")]
    Unavailable(String),
    /// A handle from another backend, or a range outside a buffer.
    #[error("misuse: {0}")]
    Misuse(String),
}

/// The byte range `[offset, offset + len)` of a buffer of `limit` bytes,
/// or `Misuse` when it does not fit: the one range check every backend's
/// copy and read-back makes.
///
/// # Errors
///
/// The range overflows or reaches past `limit`.
pub fn buffer_range(
    offset: u64,
    len: usize,
    limit: u64,
) -> Result<std::ops::Range<usize>, DeviceError> {
    let outside = || {
        DeviceError::Misuse(format!(
            "range [{offset}, +{len}) outside a buffer of {limit} bytes"
        ))
    };
    let start = usize::try_from(offset).map_err(|_| outside())?;
    match start.checked_add(len) {
        Some(end) if end as u64 <= limit => Ok(start..end),
        _ => Err(outside()),
    }
}

/// A device allocation. Freed when dropped.
pub trait DeviceBuffer: Send + Sync + Any {
    /// Its size in bytes.
    fn len(&self) -> u64;
    /// Whether it has no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// For the backend that made it, to reach its own type.
    fn as_any(&self) -> &dyn Any;
    /// The sha256 of the bytes received, for devices that hash what they
    /// receive instead of keeping it (the sink); `None` elsewhere.
    fn sha256(&self) -> Option<[u8; 32]> {
        None
    }
}

/// An ordered stream of device work (a CUDA stream, a HIP stream).
pub trait Queue: Send + Sync + Any {
    /// For the backend that made it, to reach its own type.
    fn as_any(&self) -> &dyn Any;
}

/// Pinned (page-locked) host memory, for the staging ring.
pub trait PinnedBuffer: Send + Sync + Any {
    /// The bytes, writable by the host.
    fn as_mut_slice(&mut self) -> &mut [u8];
    /// The bytes.
    fn as_slice(&self) -> &[u8];
}

/// What the seam tells a backend after it gave a weight's host pages back,
/// so backends that account for residency (fake, sink) can record it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostRelease {
    /// The weight's name.
    pub weight: String,
    /// Whether the bytes were a borrow of a file (else an owned buffer).
    pub borrowed: bool,
    /// Absolute offset in the file (0 for owned bytes).
    pub offset: u64,
    /// Bytes of the weight's host span.
    pub len: u64,
    /// Bytes actually given back (whole pages of a borrow; all of an owned
    /// buffer).
    pub released: u64,
}

/// Memory operations of one device.
///
/// Implementations are one per vendor (or simulated). Copies are
/// asynchronous: they are ordered on a [`Queue`] and complete at the latest
/// when [`Backend::synchronize`] returns.
pub trait Backend: Send + Sync {
    /// A short name (`"cuda:0"`, `"fake"`).
    fn name(&self) -> String;

    /// Allocates `len` bytes of device memory.
    ///
    /// # Errors
    ///
    /// Out of memory, or the device is unusable.
    fn allocate(&self, len: u64) -> Result<Box<dyn DeviceBuffer>, DeviceError>;

    /// Creates a queue for copies.
    ///
    /// # Errors
    ///
    /// The device is unusable.
    fn create_queue(&self) -> Result<Box<dyn Queue>, DeviceError>;

    /// Queues a copy of `src` to `dst[dst_offset..]`.
    ///
    /// # Safety
    ///
    /// `src` must stay valid and unchanged until [`Backend::synchronize`] on
    /// the same queue has returned: the device may read it at any time
    /// before then.
    ///
    /// # Errors
    ///
    /// The copy cannot be queued (a range outside `dst`, a foreign handle, a
    /// device fault).
    unsafe fn copy_to_device_async(
        &self,
        src: &[u8],
        dst: &dyn DeviceBuffer,
        dst_offset: u64,
        queue: &dyn Queue,
    ) -> Result<(), DeviceError>;

    /// Waits until every copy queued on `queue` has completed.
    ///
    /// # Errors
    ///
    /// A queued copy failed.
    fn synchronize(&self, queue: &dyn Queue) -> Result<(), DeviceError>;

    /// Copies device bytes back to the host (synchronously), to verify what
    /// the device holds.
    ///
    /// # Errors
    ///
    /// A range outside `src`, a foreign handle or a device fault.
    fn read_back(
        &self,
        src: &dyn DeviceBuffer,
        src_offset: u64,
        dst: &mut [u8],
    ) -> Result<(), DeviceError>;

    /// Page-locked host memory for the staging ring, where the device has
    /// it (`None` where it does not; the ring then uses plain memory).
    ///
    /// # Errors
    ///
    /// The allocation failed.
    fn allocate_pinned(&self, len: usize) -> Result<Option<Box<dyn PinnedBuffer>>, DeviceError> {
        let _ = len;
        Ok(None)
    }

    /// Whether the host can read and write this device's memory directly
    /// (integrated GPUs, the CPU itself).
    fn device_memory_is_host_addressable(&self) -> bool;

    /// Told once per weight, after the seam gave the weight's host pages
    /// back; the default ignores it.
    fn host_pages_released(&self, release: &HostRelease) {
        let _ = release;
    }
}

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
    released_page_bytes: AtomicU64,
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
    /// Bytes given back (whole pages of borrows, all of owned buffers);
    /// `seam load` reports the spans' bytes as `released_bytes`, so this
    /// one is named for what it counts.
    pub released_page_bytes: u64,
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
        }
    }
}

/// Policy over a backend: whether weights must be staged, and what may be
/// given back once they are.
///
/// Platforms probe the real device for these answers (CUDA/ROCm: the
/// pageable-memory-access attribute, integrated or discrete); they do not
/// guess from a name.
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
    fn staging_ring(&self) -> Option<&crate::ring::StagingRing> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::{DeviceError, buffer_range};

    #[test]
    fn buffer_ranges_fit_or_are_misuse() {
        assert_eq!(buffer_range(2, 3, 8), Ok(2..5));
        assert_eq!(buffer_range(5, 3, 8), Ok(5..8));
        assert_eq!(buffer_range(0, 0, 0), Ok(0..0));
        for (offset, len, limit) in [(6, 3, 8), (u64::MAX, 1, 8), (1, usize::MAX, u64::MAX)] {
            assert!(
                matches!(
                    buffer_range(offset, len, limit),
                    Err(DeviceError::Misuse(_))
                ),
                "{offset} +{len} in {limit}"
            );
        }
    }
}
