//! A child process whose stderr is a terminal: the other end of a
//! pseudo-terminal this process reads, for what a binary draws only on a
//! terminal (progress bars). Its stdout stays a pipe, so the report and
//! what was drawn are apart.

use std::ffi::CStr;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Command, ExitStatus, Stdio};

/// What a child run on a terminal did.
pub struct OnTerminal {
    /// Its exit status.
    pub status: ExitStatus,
    /// Its stdout (a pipe).
    pub stdout: String,
    /// Everything it wrote to its stderr, the terminal, as the terminal
    /// received it (escape sequences and all; line ends as `\r\n`).
    pub terminal: String,
}

#[track_caller]
fn check(rc: libc::c_int, what: &str) -> libc::c_int {
    assert!(rc >= 0, "{what}: {}", std::io::Error::last_os_error());
    rc
}

/// A new pseudo-terminal of 120 columns: (its master, its slave).
fn open_pty() -> (OwnedFd, OwnedFd) {
    // SAFETY: posix_openpt takes flags and returns a new descriptor or -1.
    let master = check(
        unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) },
        "posix_openpt",
    );
    // SAFETY: a fresh descriptor that nothing else owns.
    let master = unsafe { OwnedFd::from_raw_fd(master) };
    // SAFETY: grantpt and unlockpt act on the master descriptor only.
    check(unsafe { libc::grantpt(master.as_raw_fd()) }, "grantpt");
    // SAFETY: as above.
    check(unsafe { libc::unlockpt(master.as_raw_fd()) }, "unlockpt");
    let mut name = [0 as libc::c_char; 128];
    // SAFETY: ptsname_r writes at most `name.len()` bytes, NUL included,
    // into the live buffer.
    let rc = unsafe { libc::ptsname_r(master.as_raw_fd(), name.as_mut_ptr(), name.len()) };
    assert_eq!(
        rc,
        0,
        "ptsname_r: {}",
        std::io::Error::from_raw_os_error(rc)
    );
    // SAFETY: ptsname_r succeeded, so `name` holds a NUL-terminated path.
    let path = unsafe { CStr::from_ptr(name.as_ptr()) };
    // SAFETY: open takes a NUL-terminated path and flags.
    let slave = check(
        unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
            )
        },
        "open the pty's slave",
    );
    // SAFETY: a fresh descriptor that nothing else owns.
    let slave = unsafe { OwnedFd::from_raw_fd(slave) };
    let size = libc::winsize {
        ws_row: 40,
        ws_col: 120,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize from the live value given.
    check(
        unsafe { libc::ioctl(slave.as_raw_fd(), libc::TIOCSWINSZ, &size) },
        "TIOCSWINSZ",
    );
    (master, slave)
}

/// Runs `cmd` to its end with its stderr on a terminal (`TERM=xterm`),
/// its stdout a pipe and its stdin empty.
pub fn run_on_terminal(cmd: &mut Command) -> OnTerminal {
    let (master, slave) = open_pty();
    let child = cmd
        .env("TERM", "xterm")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(slave))
        .spawn()
        .expect("the binary runs");
    // The command holds the slave until its stderr is replaced: once the
    // child has it alone, its exit ends the terminal's reads.
    cmd.stderr(Stdio::null());
    let reader = std::thread::spawn(move || {
        let mut master = std::fs::File::from(master);
        let mut bytes = Vec::new();
        let mut chunk = [0u8; 4096];
        // Linux answers EIO once no process holds the slave.
        while let Ok(n) = master.read(&mut chunk) {
            if n == 0 {
                break;
            }
            bytes.extend_from_slice(&chunk[..n]);
        }
        bytes
    });
    let out = child.wait_with_output().expect("the binary ends");
    let terminal = reader.join().expect("the terminal's reader");
    OnTerminal {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        terminal: String::from_utf8_lossy(&terminal).into_owned(),
    }
}
