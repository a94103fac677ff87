//! The backend layer: [`Backend`] (memory operations of one device), its
//! buffers and queues, and [`StagingCopy`], the copy only the seam can
//! issue. Re-exported from [`platform`](crate::platform), which adds the
//! policy over a backend; this module depends on no other of the seam's.

use std::any::Any;

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

    /// The queue's handle in its vendor's API, so an engine can order its
    /// own work (kernels, copies) on the same stream; `None` where the
    /// device has no such handle (the host, the fake device).
    fn native(&self) -> Option<NativeQueue> {
        None
    }
}

/// A queue's handle in its vendor's API: the address of a CUDA driver
/// stream (`CUstream`) or a HIP stream (`hipStream_t`). Valid while the
/// [`Queue`] that gave it is alive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NativeQueue {
    /// The API the handle belongs to (`"cuda"`, `"hip"`).
    pub api: &'static str,
    /// The handle, as an address.
    pub handle: usize,
}

/// One host-to-device copy, made by the seam for [`Backend::
/// copy_to_device_async`]: source bytes, destination buffer and offset,
/// and the queue it goes on.
///
/// Its fields are private and it has no public constructor, so no crate but
/// the seam can issue a device copy: a weight's bytes reach a device only
/// through [`resident_weight`](crate::resident_weight). Backends read it.
///
/// ```compile_fail,E0451
/// // Outside the seam a copy cannot be made, so a backend cannot be asked
/// // to copy a weight's bytes behind the seam's back.
/// fn forge<'a>(
///     src: &'a [u8],
///     dst: &'a dyn seam::platform::DeviceBuffer,
///     queue: &'a dyn seam::platform::Queue,
/// ) -> seam::platform::StagingCopy<'a> {
///     seam::platform::StagingCopy { src, dst, dst_offset: 0, queue }
/// }
/// ```
///
/// ```compile_fail,E0624
/// // Nor through a constructor: the only one is the seam's own.
/// fn forge<'a>(
///     src: &'a [u8],
///     dst: &'a dyn seam::platform::DeviceBuffer,
///     queue: &'a dyn seam::platform::Queue,
/// ) -> seam::platform::StagingCopy<'a> {
///     unsafe { seam::platform::StagingCopy::new(src, dst, 0, queue) }
/// }
/// ```
#[derive(Clone, Copy)]
pub struct StagingCopy<'a> {
    src: &'a [u8],
    dst: &'a dyn DeviceBuffer,
    dst_offset: u64,
    queue: &'a dyn Queue,
}

impl<'a> StagingCopy<'a> {
    /// A copy of `src` to `dst[dst_offset..]` on `queue`.
    ///
    /// # Safety
    ///
    /// `src` must stay valid and unchanged until [`Backend::synchronize`] on
    /// `queue` has returned: the device may read it at any time before
    /// then.
    pub(crate) unsafe fn new(
        src: &'a [u8],
        dst: &'a dyn DeviceBuffer,
        dst_offset: u64,
        queue: &'a dyn Queue,
    ) -> StagingCopy<'a> {
        StagingCopy {
            src,
            dst,
            dst_offset,
            queue,
        }
    }

    /// The bytes to copy; valid until the queue is synchronized.
    pub fn src(&self) -> &'a [u8] {
        self.src
    }

    /// The destination buffer.
    pub fn dst(&self) -> &'a dyn DeviceBuffer {
        self.dst
    }

    /// Where in the destination the bytes go.
    pub fn dst_offset(&self) -> u64 {
        self.dst_offset
    }

    /// The queue the copy goes on.
    pub fn queue(&self) -> &'a dyn Queue {
        self.queue
    }
}

impl std::fmt::Debug for StagingCopy<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StagingCopy")
            .field("len", &self.src.len())
            .field("dst_len", &self.dst.len())
            .field("dst_offset", &self.dst_offset)
            .finish()
    }
}

/// Pinned (page-locked) host memory, for the staging ring.
pub trait PinnedBuffer: Send + Sync + Any {
    /// The bytes, writable by the host.
    fn as_mut_slice(&mut self) -> &mut [u8];
    /// The bytes.
    fn as_slice(&self) -> &[u8];
}

/// What a backend offers for host-to-device copies: the facts the ring's
/// device-aware default and the registered windows are decided from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransferCaps {
    /// The device copies from page-locked host memory by DMA over a bus (a
    /// discrete GPU's copy engines), so a ring of small pinned buffers
    /// filled by many readers keeps the bus busy. `false` for devices whose
    /// copy is a host `memcpy` (the fake and sink devices, the CPU).
    pub pinned_dma: bool,
    /// [`Backend::register_host`] can page-lock existing host memory (a
    /// range of a file mapping) for DMA straight from it.
    pub register_host: bool,
}

/// Host memory page-locked for DMA by [`Backend::register_host`];
/// unregistered when dropped. The seam drops it only after every copy that
/// reads it has completed.
pub trait HostRegistration: Send + Sync {
    /// The registered range's length in bytes.
    fn len(&self) -> usize;
    /// Whether it registers no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
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
///
/// Threading: a backend is shared (`Send + Sync`) and its methods may be
/// called from several threads at once, each thread on its own queue.
/// Panics: a method that panics ends the load with that panic (it reaches
/// the caller of [`resident_weight`](crate::resident_weight)); the staging
/// ring's other threads stop waiting and its buffers are drained first, so
/// the ring stays usable.
/// Lifetimes: a [`DeviceBuffer`] or [`Queue`] it made may outlive any one
/// call, and is dropped on any thread; a buffer must stay valid until it is
/// dropped (the seam drops a weight's copy with the weight).
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

    /// Queues `copy`: its source bytes to `copy.dst()[copy.dst_offset()..]`
    /// on `copy.queue()`. Returns once the copy is queued; the bytes may
    /// land at any time until [`Backend::synchronize`] on that queue returns.
    ///
    /// Only the seam can construct a [`StagingCopy`], so only the seam calls
    /// this (from `resident_weight`, the staging ring and
    /// [`backend_check`](crate::backend_check)). The seam keeps the source
    /// valid and unchanged until it has synchronized the queue; an
    /// implementation may read it at any time before then, and must not
    /// keep it afterwards. The destination buffer and the queue outlive
    /// that synchronize too (the seam holds both; a weight's buffer lives
    /// as long as the weight).
    ///
    /// Called from the thread that stages the weight (several threads at
    /// once when the staging ring has several lanes, each with its own
    /// queue).
    ///
    /// # Errors
    ///
    /// The copy cannot be queued (a range outside `dst`, a foreign handle, a
    /// device fault).
    fn copy_to_device_async(&self, copy: StagingCopy<'_>) -> Result<(), DeviceError>;

    /// Waits until every copy queued on `queue` has completed.
    ///
    /// Called by the seam before it gives any of the copies' sources back:
    /// on the thread that queued them, or, for a staging-ring buffer, on
    /// the ring's reader about to refill it. Calls for one queue never
    /// overlap (the seam holds the queue's buffer meanwhile); an engine may
    /// call it on any thread.
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

    /// Whether this backend's weight allocation IS host memory that kernels
    /// read in place of a copy (the CPU itself, a zero-copy mapping of host
    /// pages). A `cuMemAlloc`/`hipMalloc` allocation is a separate copy on
    /// every part, integrated or discrete, so GPU backends answer `false`.
    fn device_memory_is_host_addressable(&self) -> bool;

    /// What this backend offers for host-to-device copies; the default
    /// offers nothing (plain memory, no registration).
    fn transfer_caps(&self) -> TransferCaps {
        TransferCaps::default()
    }

    /// Page-locks `bytes` (whole pages of a read-only file mapping) so
    /// copies from them go by DMA straight from the page cache. The seam
    /// keeps `bytes` mapped and unchanged until the returned registration
    /// is dropped, and drops it only after synchronizing every queue that
    /// copied from it. Only called where [`TransferCaps::register_host`]
    /// is `true`.
    ///
    /// # Errors
    ///
    /// The backend cannot register this memory (the seam then copies it
    /// through the ring).
    fn register_host(&self, bytes: &[u8]) -> Result<Box<dyn HostRegistration>, DeviceError> {
        let _ = bytes;
        Err(DeviceError::Misuse(format!(
            "{} cannot register host memory",
            self.name()
        )))
    }

    /// Told once per weight, after the seam gave the weight's host pages
    /// back; the default ignores it.
    fn host_pages_released(&self, release: &HostRelease) {
        let _ = release;
    }
}

/// One rank of a group of devices that can exchange device buffers.
///
/// Every rank calls each collective operation, in the same order; an
/// operation returns once this rank's part of it has completed on the
/// device.
pub trait Collective: Send + Sync {
    /// This rank: the plan's device index.
    fn rank(&self) -> usize;

    /// The number of ranks.
    fn n_ranks(&self) -> usize;

    /// Copies rank `root`'s `buffer` into every other rank's `buffer` (each
    /// rank passes its own buffer of the same length; the root's is read,
    /// the others' are written). Returns once this rank's buffer holds the
    /// root's bytes.
    ///
    /// # Errors
    ///
    /// A foreign buffer, lengths that differ, or a device or transport
    /// failure.
    fn broadcast(&self, buffer: &dyn DeviceBuffer, root: usize) -> Result<(), DeviceError>;
}

/// Where a [`Receiving`](crate::collective::Receiving) view's device copies come from.
#[derive(Clone, Copy)]
pub struct BroadcastSource<'c> {
    /// This rank's collective.
    pub collective: &'c dyn Collective,
    /// The rank that read the weight from the file and sends it.
    pub root: usize,
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
