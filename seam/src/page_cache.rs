//! Dropping a file's page cache off the staging path.
//!
//! `posix_fadvise(DONTNEED)` is slow per call (the kernel drains every
//! CPU's LRU lists when a range is still busy), and on the GPU machine
//! calling it once per weight, inline, cost a warm 32 GiB load a quarter of
//! its speed and a cold one a fifth. The seam's release therefore hands the
//! range to one background thread, which merges adjacent ranges of a file
//! and advises the kernel in large batches. [`flush`] waits until every
//! range handed over so far has been advised: a load calls it before it
//! reports, so the page cache is gone when the load says it is done.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

/// The dropper advises once this many bytes are pending...
const BATCH_BYTES: u64 = 1 << 30;
/// ...or once the oldest pending range has waited this long (or on flush).
const BATCH_WAIT: Duration = Duration::from_millis(500);

#[derive(Default)]
struct State {
    pending: Vec<(Arc<File>, u64, u64)>,
    pending_bytes: u64,
    /// A flush is waiting: advise now.
    flushing: bool,
    /// Ranges handed over, and ranges advised, so far.
    queued: u64,
    done: u64,
    first_error: Option<std::io::Error>,
}

struct Dropper {
    state: Mutex<State>,
    /// Signals the thread (work queued) and the flushers (work done).
    changed: Condvar,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn dropper() -> &'static Dropper {
    static DROPPER: OnceLock<&'static Dropper> = OnceLock::new();
    DROPPER.get_or_init(|| {
        let d: &'static Dropper = Box::leak(Box::new(Dropper {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        }));
        std::thread::Builder::new()
            .name("seam-page-cache".into())
            .spawn(move || run(d))
            .expect("spawning the page-cache thread");
        d
    })
}

fn run(d: &'static Dropper) {
    loop {
        let mut state = lock(&d.state);
        while state.pending.is_empty() {
            state = d.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        // Gather a large batch: each call is expensive, few large ones are
        // cheap. A flush cuts the wait short.
        let deadline = std::time::Instant::now() + BATCH_WAIT;
        while state.pending_bytes < BATCH_BYTES && !state.flushing {
            let now = std::time::Instant::now();
            if now >= deadline {
                break;
            }
            state = d
                .changed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        let mut batch = std::mem::take(&mut state.pending);
        state.pending_bytes = 0;
        drop(state);
        let n = batch.len() as u64;
        let error = advise_merged(&mut batch);
        let mut state = lock(&d.state);
        state.done += n;
        if let Some(e) = error {
            state.first_error.get_or_insert(e);
        }
        d.changed.notify_all();
    }
}

/// Sorts ranges by file and start, merges touching ones, advises each.
fn advise_merged(batch: &mut [(Arc<File>, u64, u64)]) -> Option<std::io::Error> {
    batch.sort_by_key(|(f, start, _)| (f.as_raw_fd(), *start));
    let mut first_error = None;
    let mut i = 0;
    while i < batch.len() {
        let (file, start, mut end) = (Arc::clone(&batch[i].0), batch[i].1, batch[i].2);
        let mut j = i + 1;
        while j < batch.len() && batch[j].0.as_raw_fd() == file.as_raw_fd() && batch[j].1 <= end {
            end = end.max(batch[j].2);
            j += 1;
        }
        // SAFETY: posix_fadvise only advises the kernel about a range of an
        // open descriptor (kept open by the Arc); it touches no memory.
        let rc = unsafe {
            libc::posix_fadvise(
                file.as_raw_fd(),
                start as libc::off_t,
                (end - start) as libc::off_t,
                libc::POSIX_FADV_DONTNEED,
            )
        };
        if rc != 0 && first_error.is_none() {
            first_error = Some(std::io::Error::from_raw_os_error(rc));
        }
        i = j;
    }
    first_error
}

/// Hands `[start, end)` of `file` to the background thread to be dropped
/// from the page cache.
pub fn drop_later(file: Arc<File>, start: u64, end: u64) {
    if end <= start {
        return;
    }
    let d = dropper();
    let mut state = lock(&d.state);
    state.pending.push((file, start, end));
    state.pending_bytes += end - start;
    state.queued += 1;
    d.changed.notify_all();
}

/// Waits until every range handed over so far has been advised; returns the
/// first error since the last flush.
///
/// # Errors
///
/// `posix_fadvise` failed for a range.
pub fn flush() -> std::io::Result<()> {
    let d = dropper();
    let mut state = lock(&d.state);
    let target = state.queued;
    while state.done < target {
        state.flushing = true;
        d.changed.notify_all();
        state = d.changed.wait(state).unwrap_or_else(|e| e.into_inner());
    }
    state.flushing = false;
    match state.first_error.take() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
