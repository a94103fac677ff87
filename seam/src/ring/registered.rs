//! Registered windows: DMA straight from the page cache. The page-aligned
//! interior of a weight's span in the file mapping is page-locked
//! ([`Backend::register_host`](crate::backend::Backend::register_host)) one
//! window at a time and copied from asynchronously; each window is
//! unregistered and its pages dropped from this process as soon as its copy
//! completes. The partial pages at either end go through the ring: they are
//! shared with the neighbouring weights, and registering one page twice
//! fails (what sank the first attempt).
//!
//! One weight takes this path at a time over the whole ring
//! ([`REGISTERING_WEIGHTS_AT_ONCE`](super::REGISTERING_WEIGHTS_AT_ONCE)):
//! the driver serializes registration, so the other lanes carry their
//! weights through the buffers meanwhile and the two paths add up.
//!
//! Host residency stays bounded: at most
//! [`RingConfig::windows_in_flight`](super::RingConfig::windows_in_flight)
//! windows are registered at once across all lanes.

use super::direct::Mode;
use crate::backend::TransferCaps;
use std::ops::Range;

/// How one weight's span splits: the head and tail (partial pages, through
/// the ring) and the page-aligned windows between them, all offsets into
/// the span.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowPlan {
    /// Bytes before the first whole page.
    pub head: Range<u64>,
    /// Whole-page windows of at most the window size, in order.
    pub windows: Vec<Range<u64>>,
    /// Bytes after the last whole page.
    pub tail: Range<u64>,
}

/// Splits a span of `len` bytes starting at address `addr` into a head, the
/// page-aligned interior cut into windows of `window` bytes (rounded down to
/// whole pages, at least one page), and a tail. A span with no whole page is
/// all head.
pub fn plan_windows(addr: u64, len: u64, page: u64, window: u64) -> WindowPlan {
    let first = addr.div_ceil(page) * page - addr;
    let last = ((addr + len) / page * page).saturating_sub(addr);
    if last <= first || first >= len {
        return WindowPlan {
            head: 0..len,
            windows: Vec::new(),
            tail: len..len,
        };
    }
    let window = (window / page * page).max(page);
    let mut windows = Vec::new();
    let mut at = first;
    while at < last {
        let end = (at + window).min(last);
        windows.push(at..end);
        at = end;
    }
    WindowPlan {
        head: 0..first,
        windows,
        tail: last..len,
    }
}

/// Whether a weight whose span has `interior` bytes of whole pages takes
/// the registered path: the knob allows it, the backend can register, and
/// the interior is at least `min_bytes` (registering costs a fixed price
/// per call that the ring beats on small weights).
pub fn takes_registered_path(
    mode: Mode,
    caps: TransferCaps,
    interior: u64,
    min_bytes: u64,
) -> bool {
    mode != Mode::Off && caps.register_host && interior >= min_bytes.max(1)
}

/// Whether one window is registered (else copied through the ring): with
/// `auto` only when the page cache holds most of it (registering pages
/// that are not cached would read them from disk one fault at a time).
pub fn registers_window(mode: Mode, resident: Option<f64>) -> bool {
    match mode {
        Mode::Off => false,
        Mode::On => true,
        Mode::Auto => resident.is_some_and(|r| r >= super::direct::AUTO_DIRECT_BELOW_RESIDENT),
    }
}
