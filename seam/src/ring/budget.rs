//! A bound on how many of something are in flight at once, over all of a
//! ring's lanes and readers, with the peak it reached.

use std::sync::{Condvar, Mutex};

/// A count of things in flight shared by threads, bounded by its limit:
/// registered windows (host memory pinned beyond the ring) and `O_DIRECT`
/// reads (requests at the disk).
pub(crate) struct InFlightBudget {
    limit: u64,
    count: Mutex<Count>,
    freed: Condvar,
}

/// In flight now, and the most ever at once (for tests and the report).
#[derive(Default)]
struct Count {
    now: u64,
    peak: u64,
}

impl InFlightBudget {
    /// A budget of `limit` at once (at least one).
    pub(crate) fn new(limit: u64) -> InFlightBudget {
        InFlightBudget {
            limit: limit.max(1),
            count: Mutex::default(),
            freed: Condvar::new(),
        }
    }

    fn count(&self) -> std::sync::MutexGuard<'_, Count> {
        super::lock(&self.count)
    }

    /// Takes a place if one is free; `false` when all are taken.
    pub(crate) fn try_take(&self) -> bool {
        let mut c = self.count();
        if c.now >= self.limit {
            return false;
        }
        c.now += 1;
        c.peak = c.peak.max(c.now);
        true
    }

    /// Waits for a free place and takes it (called only by a thread that
    /// holds none, so the holders, never waiting, free theirs).
    pub(crate) fn take(&self) {
        let mut c = self.count();
        while c.now >= self.limit {
            c = self.freed.wait(c).unwrap_or_else(|e| e.into_inner());
        }
        c.now += 1;
        c.peak = c.peak.max(c.now);
    }

    /// Gives a place back.
    pub(crate) fn give(&self) {
        let mut c = self.count();
        c.now = c.now.saturating_sub(1);
        self.freed.notify_all();
    }

    /// The most in flight at once so far.
    pub(crate) fn peak(&self) -> u64 {
        self.count().peak
    }
}
