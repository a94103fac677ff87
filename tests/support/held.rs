//! A child process held at a known point, for fault injection without a
//! test hook in the binary: its stderr is a pipe this process has filled,
//! so the child's first write to stderr (the policy line, printed once the
//! model is accepted and before any tensor is read) blocks until the test
//! drains the pipe. The test waits until the child is blocked in that
//! write (`/proc/PID/syscall`), changes the file, then lets it go.

use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long a child may take to reach its first stderr write or to end
/// once released; only a hang (a bug) comes near it.
const PATIENCE: Duration = Duration::from_secs(120);

/// A child blocked (or about to block) on its first stderr write.
pub struct Held {
    child: Child,
    stderr: std::fs::File,
    filler: usize,
}

/// What a released child did.
pub struct Outcome {
    /// Its exit status.
    pub status: ExitStatus,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr, without the filler.
    pub stderr: String,
}

fn check(rc: libc::c_int, what: &str) {
    assert!(rc >= 0, "{what}: {}", std::io::Error::last_os_error());
}

/// Spawns `cmd` with a full pipe as its stderr and waits until it blocks
/// writing to it.
pub fn spawn_held(cmd: &mut Command) -> Held {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a live array of two descriptors for pipe to fill.
    check(unsafe { libc::pipe(fds.as_mut_ptr()) }, "pipe");
    // SAFETY: pipe returned two fresh descriptors that nothing else owns.
    let (read, write) = unsafe {
        use std::os::fd::FromRawFd;
        (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]))
    };
    // Fill the pipe one byte at a time until it would block (a write of a
    // few bytes may still fit after a large one fails).
    // SAFETY: fcntl on a descriptor this function owns.
    check(
        unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) },
        "fcntl",
    );
    let mut filler = 0;
    loop {
        // SAFETY: writes one byte from a live buffer to an owned descriptor.
        let n = unsafe { libc::write(write.as_raw_fd(), b"#".as_ptr().cast(), 1) };
        if n != 1 {
            let e = std::io::Error::last_os_error();
            assert_eq!(
                e.kind(),
                std::io::ErrorKind::WouldBlock,
                "filling the pipe: {e}"
            );
            break;
        }
        filler += 1;
    }
    // The child must block: its copy of the descriptor shares this flag.
    // SAFETY: as above.
    check(
        unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETFL, 0) },
        "fcntl",
    );
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(write))
        .spawn()
        .expect("spawn the child");
    // Close this process's copy of the write end (the command holds it), so
    // the pipe ends when the child does.
    cmd.stderr(Stdio::null());
    let held = Held {
        child,
        stderr: std::fs::File::from(read),
        filler,
    };
    held.wait_blocked();
    held
}

impl Held {
    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until the child's main thread is in `write(2, ...)`.
    fn wait_blocked(&self) {
        let path = format!("/proc/{}/syscall", self.child.id());
        let want = format!("{} 0x2 ", libc::SYS_write);
        let start = Instant::now();
        loop {
            let now = std::fs::read_to_string(&path).unwrap_or_default();
            if now.starts_with(&want) {
                return;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "the child never blocked writing to stderr (last: {now:?})"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Sends `signal` to the held child and returns how it ended.
    pub fn signal(self, signal: libc::c_int) -> ExitStatus {
        // SAFETY: kill on the pid of a child this process has not reaped.
        check(
            unsafe { libc::kill(self.child.id() as libc::pid_t, signal) },
            "kill",
        );
        self.release().status
    }

    /// Drains the pipe (the child goes on) and waits for the child's end.
    pub fn release(mut self) -> Outcome {
        let mut stdout_pipe = self.child.stdout.take().expect("piped stdout");
        let stdout_thread = std::thread::spawn(move || {
            let mut s = Vec::new();
            let _ = stdout_pipe.read_to_end(&mut s);
            s
        });
        let mut err = Vec::new();
        self.stderr.read_to_end(&mut err).expect("read stderr");
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                break status;
            }
            if start.elapsed() > PATIENCE {
                let _ = self.child.kill();
                panic!("the child did not end once released");
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let stdout = stdout_thread.join().expect("stdout reader");
        assert!(err.len() >= self.filler && err[..self.filler].iter().all(|&b| b == b'#'));
        Outcome {
            status,
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: String::from_utf8_lossy(&err[self.filler..]).into_owned(),
        }
    }
}

/// Asserts that `out` ended with status 2 (not a signal) and `stderr`'s
/// last line is `prefix` ... containing every one of `needles`; the
/// lines before it may only be the policy line the test held the child at.
#[track_caller]
pub fn assert_exit_2(out: &Outcome, prefix: &str, needles: &[&str]) {
    assert_eq!(
        out.status.code(),
        Some(2),
        "exit {:?} (a signal is None), stderr:\n{}",
        out.status,
        out.stderr
    );
    let last = out.stderr.lines().last().unwrap_or("");
    assert!(
        last.starts_with(prefix),
        "expected {prefix:?}..., stderr:\n{}",
        out.stderr
    );
    for n in needles {
        assert!(last.contains(n), "expected {n:?} in {last:?}");
    }
    assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
    let before: Vec<&str> = out.stderr.lines().rev().skip(1).collect();
    assert!(
        before.iter().all(|l| l.contains("policy: ")),
        "more than the policy line and the error:\n{}",
        out.stderr
    );
}
