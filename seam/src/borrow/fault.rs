//! A read of a mapped file that faults (the file was truncated under the
//! mapping: the kernel sends `SIGBUS` for pages past the new end) becomes
//! one line on stderr naming the file and exit status 2, instead of a raw
//! signal.
//!
//! Every file-backed [`super::MappedFile`] registers its address range here
//! when it is mapped and unregisters it when it is dropped. A binary opts
//! in with [`exit_on_fault_in_mapped_files`], which installs a `SIGBUS`
//! handler: a fault inside a registered range writes the line and calls
//! `_exit(2)`; any other `SIGBUS` goes to the handler that was there before
//! (the Rust runtime's, then the default: the process dies of the signal as
//! it would have). Libraries using the seam keep the platform's behaviour
//! unless their binary opts in.
//!
//! Why a handler and not the alternatives: the host device hands kernels
//! the mapping itself (zero copy is the point), and so do `inspect --hash`
//! and the families' forward pass on the CPU; copying through `pread` there
//! would double the host's memory traffic and residency, and a read lease
//! (`F_SETLEASE`) needs the file's owner and only tells of writers that open
//! the file after us. Unwinding out of a signal handler is not possible in
//! Rust, so the handler does not try to recover: the load cannot go on with
//! a file that is no longer the one it opened, and ending it with a clear
//! line is what the operator needs. Only async-signal-safe calls run in the
//! handler (`write`, `_exit`, `sigaction`); the registry is a fixed array
//! of atomics, so it takes no lock and allocates nothing.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};

/// Mapped files that can be registered at once; past this a mapping is
/// simply not covered (a fault in it is the platform's `SIGBUS`).
const SLOTS: usize = 1024;

struct Slot {
    claimed: AtomicBool,
    /// Start address; 0 while the slot is being filled or is free.
    start: AtomicUsize,
    len: AtomicUsize,
    /// The file's name as printed (escaped), owned by the [`Registration`].
    name: AtomicPtr<u8>,
    name_len: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Slot = Slot {
    claimed: AtomicBool::new(false),
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    name: AtomicPtr::new(std::ptr::null_mut()),
    name_len: AtomicUsize::new(0),
};

static REGISTRY: [Slot; SLOTS] = [FREE; SLOTS];

/// The program name the line starts with; set by the opt-in.
static PROGRAM: OnceLock<&'static str> = OnceLock::new();

/// Set by the first thread that reports a fault.
static REPORTING: AtomicBool = AtomicBool::new(false);

/// The `SIGBUS` action before ours, for faults that are not ours.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// A mapped range in the registry; unregisters itself when dropped.
pub(crate) struct Registration {
    slot: Option<usize>,
    /// Keeps the bytes the slot points at alive.
    _name: Box<[u8]>,
}

impl Registration {
    /// Registers `[start, start + len)` as the mapping of the file shown as
    /// `name`.
    pub(crate) fn new(start: *const u8, len: usize, name: &str) -> Registration {
        let mut owned: Box<[u8]> = name.as_bytes().into();
        let slot = REGISTRY.iter().position(|s| {
            s.claimed
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        });
        if let Some(i) = slot {
            let s = &REGISTRY[i];
            s.name.store(owned.as_mut_ptr(), Ordering::Relaxed);
            s.name_len.store(owned.len(), Ordering::Relaxed);
            s.len.store(len, Ordering::Relaxed);
            // Published last: a handler that sees the start sees the rest.
            s.start.store(start as usize, Ordering::Release);
        }
        Registration { slot, _name: owned }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(i) = self.slot {
            let s = &REGISTRY[i];
            s.start.store(0, Ordering::Release);
            s.name.store(std::ptr::null_mut(), Ordering::Relaxed);
            s.claimed.store(false, Ordering::Release);
        }
    }
}

/// The registered mapping holding `addr`: (its name, the byte offset of
/// `addr` in it).
fn find(addr: usize) -> Option<(&'static [u8], usize)> {
    REGISTRY.iter().find_map(|s| {
        let start = s.start.load(Ordering::Acquire);
        let len = s.len.load(Ordering::Relaxed);
        if start == 0 || addr < start || addr - start >= len {
            return None;
        }
        let name = s.name.load(Ordering::Relaxed);
        if name.is_null() {
            return None;
        }
        // SAFETY: a slot's name points at the registration's boxed bytes,
        // which live until the registration is dropped, and it is dropped
        // only with its mapping. A fault inside the mapping means the
        // mapping is in use by the faulting thread, so it is alive.
        let name = unsafe { std::slice::from_raw_parts(name, s.name_len.load(Ordering::Relaxed)) };
        Some((name, addr - start))
    })
}

/// Writes `bytes` to stderr with `write(2)` (async-signal-safe).
fn write_stderr(bytes: &[u8]) {
    let mut rest = bytes;
    while !rest.is_empty() {
        // SAFETY: the pointer and length describe a live byte slice.
        let n = unsafe { libc::write(2, rest.as_ptr().cast(), rest.len()) };
        if n <= 0 {
            return;
        }
        rest = &rest[n as usize..];
    }
}

/// `n` in decimal, into `buf`, without allocating.
fn decimal(mut n: usize, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

/// The line written for a fault at byte `offset` of `name`'s mapping.
fn fault_line(program: &[u8], name: &[u8], offset: usize, out: &mut dyn FnMut(&[u8])) {
    let mut digits = [0u8; 20];
    out(program);
    out(b": error: ");
    out(name);
    out(b": the file changed while it was being read: reading byte ");
    out(decimal(offset, &mut digits));
    out(b" of its mapping faulted (the file was truncated)\n");
}

extern "C" fn on_sigbus(
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    // SAFETY: the kernel hands a SA_SIGINFO handler a valid siginfo_t; for
    // SIGBUS `si_addr` is the faulting address.
    let addr = unsafe { (*info).si_addr() } as usize;
    if let Some((name, offset)) = find(addr) {
        // Several threads may fault at once (the load stages on lanes):
        // one writes the line and ends the process, the others wait for it.
        if REPORTING.swap(true, Ordering::AcqRel) {
            loop {
                // SAFETY: pause is async-signal-safe; `_exit` in the
                // reporting thread ends this one too.
                unsafe { libc::pause() };
            }
        }
        let program = PROGRAM.get().map_or(&b"seam"[..], |p| p.as_bytes());
        fault_line(program, name, offset, &mut |b| write_stderr(b));
        // SAFETY: `_exit` is async-signal-safe and ends the process at once;
        // nothing of the faulting thread runs again.
        unsafe { libc::_exit(2) };
    }
    // Not ours: put the previous action back and return; the instruction
    // faults again and that action handles it (the Rust runtime's guard
    // page check, then the default: death by the signal).
    if let Some(previous) = PREVIOUS.get() {
        // SAFETY: restoring an action the kernel gave us; sigaction is
        // async-signal-safe.
        unsafe { libc::sigaction(signal, previous, std::ptr::null_mut()) };
    } else {
        // SAFETY: as above, with the default action.
        unsafe { libc::signal(signal, libc::SIG_DFL) };
    }
    let _ = context;
}

/// Installs the `SIGBUS` handler: from now on, a fault in a read of a
/// mapped file (the file was truncated under the mapping) prints one line,
/// `PROGRAM: error: FILE: the file changed while it was being read: ...`,
/// and exits with status 2. Call it once, early in `main`; later calls do
/// nothing.
///
/// # Errors
///
/// `sigaction` failed.
pub fn exit_on_fault_in_mapped_files(program: &'static str) -> std::io::Result<()> {
    if PROGRAM.set(program).is_err() {
        return Ok(());
    }
    // SAFETY: a zeroed sigaction is a valid empty action; the fields are
    // filled below before it is used.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = on_sigbus as *const () as usize;
    action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
    // SAFETY: sa_mask is a valid sigset_t owned by `action`.
    unsafe { libc::sigemptyset(&mut action.sa_mask) };
    // SAFETY: as above: a zeroed sigaction receives the previous action.
    let mut previous: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are to live sigaction values; the handler only
    // makes async-signal-safe calls.
    if unsafe { libc::sigaction(libc::SIGBUS, &action, &mut previous) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let _ = PREVIOUS.set(previous);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{Registration, decimal, fault_line, find};

    /// The registry finds the mapping holding an address, and forgets it
    /// when the registration is dropped.
    #[test]
    fn registered_ranges_are_found_until_dropped() {
        let bytes = [0u8; 100];
        let start = bytes.as_ptr();
        let r = Registration::new(start, bytes.len(), "/m/model.gguf");
        let at = |i: usize| find(start as usize + i);
        assert_eq!(at(0), Some((&b"/m/model.gguf"[..], 0)));
        assert_eq!(at(99), Some((&b"/m/model.gguf"[..], 99)));
        assert_eq!(at(100), None);
        assert_eq!(find(start as usize - 1), None);
        drop(r);
        assert_eq!(at(0), None);
    }

    #[test]
    fn the_line_names_program_file_and_offset() {
        let mut line = Vec::new();
        fault_line(b"seam", b"/m/x.gguf", 4096, &mut |b| {
            line.extend_from_slice(b)
        });
        assert_eq!(
            String::from_utf8(line).unwrap(),
            "seam: error: /m/x.gguf: the file changed while it was being read: \
             reading byte 4096 of its mapping faulted (the file was truncated)\n"
        );
        let mut buf = [0u8; 20];
        assert_eq!(decimal(0, &mut buf), b"0");
        assert_eq!(
            decimal(usize::MAX, &mut buf),
            usize::MAX.to_string().as_bytes()
        );
    }
}
