//! Collectives between the devices of a sharded load: how a replicated
//! weight is read from the file once and reaches the other devices.
//!
//! A [`Collective`] is one rank of a group of devices (NCCL on CUDA GPUs,
//! an in-process exchange on fake devices). [`Receiving`] is a platform
//! view whose device copies come from a broadcast instead of the host
//! bytes: [`resident_weight`](crate::resident_weight) on it allocates the
//! copy, receives the root's bytes into it and memoizes it, inside the same
//! once-block as any other staging, so the memo is still filled only by the
//! seam and only once.

use crate::platform::{
    Backend, DeviceBuffer, DeviceError, DeviceId, Platform, ResidencyPolicy, StageCounters,
};
use crate::ring::StagingRing;

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

/// Where a [`Receiving`] view's device copies come from.
#[derive(Clone, Copy)]
pub struct BroadcastSource<'c> {
    /// This rank's collective.
    pub collective: &'c dyn Collective,
    /// The rank that read the weight from the file and sends it.
    pub root: usize,
}

/// A platform whose device copies are received from `root` by broadcast
/// instead of being copied from the host bytes; everything else is the
/// wrapped platform's.
pub struct Receiving<'p> {
    platform: &'p dyn Platform,
    source: BroadcastSource<'p>,
}

impl<'p> Receiving<'p> {
    /// `platform`, receiving from `root` over `collective`.
    pub fn new(
        platform: &'p dyn Platform,
        collective: &'p dyn Collective,
        root: usize,
    ) -> Receiving<'p> {
        Receiving {
            platform,
            source: BroadcastSource { collective, root },
        }
    }
}

impl Platform for Receiving<'_> {
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
        self.platform.residency_policy()
    }
    fn stage_counters(&self) -> &StageCounters {
        self.platform.stage_counters()
    }
    fn staging_ring(&self) -> Option<&StagingRing> {
        self.platform.staging_ring()
    }
    fn broadcast_source(&self) -> Option<BroadcastSource<'_>> {
        Some(self.source)
    }
}
