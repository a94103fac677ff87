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

// The trait and the source live with the backend layer, which the
// platform trait sits on: `platform` names them without importing this
// module, so the two do not import each other.
pub use crate::backend::{BroadcastSource, Collective};
use crate::platform::{Backend, DeviceId, Platform, ResidencyPolicy, StageCounters};
use crate::ring::StagingRing;

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
