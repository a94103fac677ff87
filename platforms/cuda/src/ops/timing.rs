//! Where the device's time goes, per kernel, when
//! [`KERNEL_TIMES_ENV`] is set: every launch is bracketed by two events on
//! the op layer's stream, and when the op layer is dropped the elapsed
//! times are summed per kernel and printed to stderr, largest first, with
//! the launches' count. Off by default (two event records per launch).

use std::collections::HashMap;

use cudarc::driver::{result, sys};

/// Set to `1` to print the per-kernel device times when an op layer goes.
pub const KERNEL_TIMES_ENV: &str = "SEAM_CUDA_KERNEL_TIMES";

/// The events of the launches so far.
#[derive(Default)]
pub(crate) struct KernelTimes {
    launches: Vec<(String, sys::CUevent, sys::CUevent)>,
}

// SAFETY: event handles may be used from any thread with their context
// current; the op layer binds it before every call and holds this in a
// `Mutex`.
unsafe impl Send for KernelTimes {}

impl KernelTimes {
    /// Whether the environment asks for the times.
    pub(crate) fn wanted() -> bool {
        std::env::var(KERNEL_TIMES_ENV).is_ok_and(|v| v == "1")
    }

    /// Records an event on `stream` now (before or after a launch).
    pub(crate) fn mark(stream: sys::CUstream) -> Option<sys::CUevent> {
        let e = result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT).ok()?;
        // SAFETY: `e` was just created in the current context; `stream` is
        // the op layer's live stream.
        unsafe { result::event::record(e, stream) }.ok()?;
        Some(e)
    }

    /// Keeps the events of one launch of `kernel`.
    pub(crate) fn push(&mut self, kernel: &str, start: sys::CUevent, end: sys::CUevent) {
        self.launches.push((kernel.to_owned(), start, end));
    }

    /// The table, once the stream was synchronized: per kernel its total
    /// milliseconds and launches, largest first; the events are destroyed.
    pub(crate) fn table(&mut self) -> String {
        let mut by: HashMap<String, (f64, u64)> = HashMap::new();
        for (k, s, e) in self.launches.drain(..) {
            // SAFETY: both events were recorded on the synchronized stream.
            let ms = unsafe { result::event::elapsed(s, e) }.unwrap_or(0.0);
            let slot = by.entry(k).or_default();
            slot.0 += f64::from(ms);
            slot.1 += 1;
            for ev in [s, e] {
                // SAFETY: created in `mark`, destroyed once here.
                let _ = unsafe { result::event::destroy(ev) };
            }
        }
        let mut rows: Vec<_> = by.into_iter().collect();
        rows.sort_by(|a, b| b.1.0.total_cmp(&a.1.0));
        let total: f64 = rows.iter().map(|r| r.1.0).sum();
        let mut out = format!("kernel times (device ms, launches): total {total:.3} ms\n");
        for (k, (ms, n)) in rows {
            out.push_str(&format!("  {ms:10.3} ms {n:8}  {k}\n"));
        }
        out
    }
}
