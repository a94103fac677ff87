//! A bound on how many of something are in flight at once, over all of a
//! ring's lanes and readers, with the peak it reached.

use std::sync::{Condvar, Mutex};

/// A count of things in flight shared by threads, bounded by its limit:
/// registered windows (host memory pinned beyond the ring) and `O_DIRECT`
/// reads (requests at the disk).
pub(crate) struct InFlightBudget {
    limit: u64,
    in_flight: Mutex<u64>,
    freed: Condvar,
    /// The most windows ever in flight at once (for tests and the report).
    peak: Mutex<u64>,
}

impl InFlightBudget {
    /// A budget of `limit` at once (at least one).
    pub(crate) fn new(limit: u64) -> InFlightBudget {
        InFlightBudget {
            limit: limit.max(1),
            in_flight: Mutex::new(0),
            freed: Condvar::new(),
            peak: Mutex::new(0),
        }
    }

    /// Takes a place if one is free; `false` when all are taken.
    pub(crate) fn try_take(&self) -> bool {
        let mut n = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        if *n >= self.limit {
            return false;
        }
        *n += 1;
        let mut peak = self.peak.lock().unwrap_or_else(|e| e.into_inner());
        *peak = (*peak).max(*n);
        true
    }

    /// Waits for a free place and takes it (called only by a thread that
    /// holds none, so the holders, never waiting, free theirs).
    pub(crate) fn take(&self) {
        let mut n = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        while *n >= self.limit {
            n = self.freed.wait(n).unwrap_or_else(|e| e.into_inner());
        }
        *n += 1;
        let mut peak = self.peak.lock().unwrap_or_else(|e| e.into_inner());
        *peak = (*peak).max(*n);
    }

    /// Gives a place back.
    pub(crate) fn give(&self) {
        let mut n = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        *n = n.saturating_sub(1);
        self.freed.notify_all();
    }

    /// The most in flight at once so far.
    pub(crate) fn peak(&self) -> u64 {
        *self.peak.lock().unwrap_or_else(|e| e.into_inner())
    }
}
