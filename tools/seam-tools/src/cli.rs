//! What the `seam` command and every family binary share on the terminal
//! (feature `cli`): a refused flag as one line and exit status 2, whatever
//! kind of error clap found ([`parse_args`]); an error as one line
//! ([`fail`]); and a progress bar on stderr for work that runs longer than
//! a second ([`Progress`]), off when stderr is not a terminal or with
//! `--quiet` ([`progress_shown`]).

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

use clap::FromArgMatches;
use clap::error::ErrorKind;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use seam::text::terminal_safe;

/// The environment variable that sets how long work runs before its bar
/// is drawn, in milliseconds (default [`DEFAULT_PROGRESS_AFTER`]; `0`
/// draws at once).
pub const PROGRESS_AFTER_ENV: &str = "SEAM_PROGRESS_AFTER_MS";

/// How long work runs before its bar is drawn: a bar that flashes for a
/// moment says nothing.
pub const DEFAULT_PROGRESS_AFTER: Duration = Duration::from_secs(1);

/// Prints `msg` as the one line `NAME: error: MSG` on stderr (line breaks
/// folded, control bytes escaped); the status 2 to exit with.
pub fn fail(name: &str, msg: &str) -> ExitCode {
    eprintln!("{name}: error: {}", terminal_safe(&msg.replace('\n', " ")));
    ExitCode::from(2)
}

/// Parses the process's arguments with `command` (named as its binary is)
/// into `T`. `--help` and `--version` print and give `Err(0)`; a command
/// given nothing where it needs a subcommand prints its help as clap does
/// (status 2); every other error clap finds is one line on stderr
/// ([`usage_error_line`]) and `Err(2)`.
///
/// # Errors
///
/// The status to exit with at once.
pub fn parse_args<T: FromArgMatches>(command: clap::Command) -> Result<T, ExitCode> {
    let name = command.get_name().to_owned();
    match command
        .try_get_matches()
        .and_then(|m| T::from_arg_matches(&m))
    {
        Ok(t) => Ok(t),
        Err(e) => Err(match e.kind() {
            ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                let _ = e.print();
                ExitCode::SUCCESS
            }
            ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                let _ = e.print();
                ExitCode::from(2)
            }
            _ => fail(&name, &usage_error_line(&e)),
        }),
    }
}

/// A clap error as one line, without clap's `error: ` and its usage
/// block: the message, the items a message ending in `:` lists, and
/// clap's tip, e.g. `the following required arguments were not provided:
/// --write <PATH>` or `unrecognized subcommand 'lod'; tip: a similar
/// subcommand exists: 'load'`.
pub fn usage_error_line(e: &clap::Error) -> String {
    let text = e.to_string();
    let mut line = String::new();
    for part in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if part.starts_with("Usage:") || part.starts_with("For more information") {
            break;
        }
        let part = part.strip_prefix("error: ").unwrap_or(part);
        if !line.is_empty() {
            line.push_str(if line.ends_with(':') { " " } else { "; " });
        }
        line.push_str(part);
    }
    line
}

/// Whether progress bars are drawn: stderr is a terminal and `--quiet` was
/// not given (piped or redirected, stderr gets only its lines).
pub fn progress_shown(quiet: bool, stderr_is_terminal: bool) -> bool {
    !quiet && stderr_is_terminal
}

/// What a bar counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Bytes (a load, a hash).
    Bytes,
    /// Tokens (a decode).
    Tokens,
}

impl Unit {
    fn template(self) -> &'static str {
        match self {
            Unit::Bytes => "{prefix:>6} {bar:40} {bytes}/{total_bytes} {msg} {elapsed}",
            Unit::Tokens => "{prefix:>6} {bar:40} {pos}/{len} tokens {msg} {elapsed}",
        }
    }
}

/// The part of a run a bar shows: its label, its unit, and whether its
/// total is known yet (a spinner until then).
#[derive(Clone, Copy, Debug)]
struct Phase {
    unit: Unit,
    counting: bool,
}

/// A progress bar on stderr, drawn once the work has run a while
/// ([`DEFAULT_PROGRESS_AFTER`], or [`PROGRESS_AFTER_ENV`]) and then
/// redrawn steadily, so a long step with no progress of its own (a
/// prefill, a file mapped with prefault) still shows its elapsed time.
/// Until its phase's total is known it is a spinner. Cleared when
/// finished or dropped. Updates of a bar that is not shown cost an atomic
/// store or a lock, never a write.
pub struct Progress {
    bar: ProgressBar,
    phase: Mutex<Phase>,
    /// The phase's furthest position: work done on several threads may
    /// report out of order, and the bar never moves back.
    furthest: AtomicU64,
    reveal: Option<(mpsc::Sender<()>, JoinHandle<()>)>,
}

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar())
}

const SPINNER: &str = "{prefix:>6} {spinner} {msg} {elapsed}";

impl Progress {
    /// The bar of a command given `--quiet` or not: shown as
    /// [`progress_shown`] decides for this process's stderr, after
    /// [`PROGRESS_AFTER_ENV`] milliseconds (default one second).
    ///
    /// # Errors
    ///
    /// [`PROGRESS_AFTER_ENV`] is set to something that is not a number of
    /// milliseconds.
    pub fn start(label: &'static str, unit: Unit, quiet: bool) -> Result<Progress, String> {
        let after = match std::env::var(PROGRESS_AFTER_ENV) {
            Err(_) => DEFAULT_PROGRESS_AFTER,
            Ok(text) => text
                .trim()
                .parse()
                .map(Duration::from_millis)
                .map_err(|_| {
                    format!("{PROGRESS_AFTER_ENV}={text:?}: expected a number of milliseconds")
                })?,
        };
        let shown = progress_shown(quiet, std::io::stderr().is_terminal());
        Ok(Progress::new(label, unit, shown, after))
    }

    /// A bar labelled `label` counting `unit`, drawn to stderr if `shown`
    /// once `after` has passed.
    pub fn new(label: &'static str, unit: Unit, shown: bool, after: Duration) -> Progress {
        let mut progress = Progress {
            bar: ProgressBar::hidden(),
            phase: Mutex::new(Phase {
                unit,
                counting: false,
            }),
            furthest: AtomicU64::new(0),
            reveal: None,
        };
        progress.phase(label, unit);
        if shown && after.is_zero() {
            reveal(&progress.bar);
        } else if shown {
            let (stop, stopped) = mpsc::channel::<()>();
            let bar = progress.bar.clone();
            let thread = std::thread::spawn(move || {
                if let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(after) {
                    reveal(&bar);
                }
            });
            progress.reveal = Some((stop, thread));
        }
        progress
    }

    /// Starts the next part of the run under `label`, counting `unit`: a
    /// spinner until [`Progress::set`] gives its total.
    pub fn phase(&self, label: &'static str, unit: Unit) {
        *self.phase.lock().unwrap_or_else(|e| e.into_inner()) = Phase {
            unit,
            counting: false,
        };
        self.bar.set_style(style(SPINNER));
        self.bar.set_prefix(label);
        self.bar.set_message("");
        self.bar.set_length(0);
        self.furthest.store(0, Ordering::Relaxed);
        self.bar.set_position(0);
    }

    /// `done` of `total` (bytes or tokens, as the phase counts); a `done`
    /// behind one already given (from another thread) is passed over.
    pub fn set(&self, done: u64, total: u64) {
        let mut phase = self.phase.lock().unwrap_or_else(|e| e.into_inner());
        if !phase.counting {
            phase.counting = true;
            self.bar.set_style(style(phase.unit.template()));
        }
        drop(phase);
        self.bar.set_length(total);
        let furthest = self.furthest.fetch_max(done, Ordering::Relaxed).max(done);
        self.bar.set_position(furthest);
    }

    /// The phase's position: the furthest `done` given to [`Progress::set`].
    pub fn position(&self) -> u64 {
        self.bar.position()
    }

    /// The words after the count (a rate, what the phase is doing).
    pub fn message(&self, msg: impl Into<String>) {
        self.bar.set_message(msg.into());
    }

    /// Time since the bar was made.
    pub fn elapsed(&self) -> Duration {
        self.bar.elapsed()
    }

    /// Whether the bar is drawn now.
    pub fn is_drawn(&self) -> bool {
        !self.bar.is_hidden()
    }

    /// Runs `f` with the bar taken off the terminal (for a line printed
    /// while it may be drawn), then draws it again.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        self.bar.suspend(f)
    }

    /// Clears the bar (and stops it being drawn later).
    pub fn finish(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some((stop, thread)) = self.reveal.take() {
            drop(stop);
            let _ = thread.join();
        }
        self.bar.finish_and_clear();
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Puts `bar` on stderr and keeps it moving.
fn reveal(bar: &ProgressBar) {
    bar.set_draw_target(ProgressDrawTarget::stderr());
    bar.enable_steady_tick(Duration::from_millis(100));
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, ArgAction, Command};

    fn command() -> Command {
        Command::new("t")
            .subcommand_required(true)
            .subcommand(
                Command::new("load")
                    .arg(
                        Arg::new("steps")
                            .long("steps")
                            .value_parser(clap::value_parser!(u32)),
                    )
                    .arg(Arg::new("json").long("json").action(ArgAction::SetTrue))
                    .arg(Arg::new("a").long("a").conflicts_with("b"))
                    .arg(Arg::new("b").long("b")),
            )
            .subcommand(Command::new("demo").arg(Arg::new("write").long("write").required(true)))
    }

    #[track_caller]
    fn check(args: &[&str], kind: ErrorKind, line: &str) {
        let e = command()
            .try_get_matches_from(std::iter::once("t").chain(args.iter().copied()))
            .unwrap_err();
        assert_eq!(e.kind(), kind, "{args:?}");
        assert_eq!(usage_error_line(&e), line, "{args:?}");
    }

    #[test]
    fn every_kind_of_refused_flag_is_one_line() {
        check(
            &["load", "--steps", "-1"],
            ErrorKind::UnknownArgument,
            "unexpected argument '-1' found",
        );
        check(
            &["load", "--steps", "x"],
            ErrorKind::ValueValidation,
            "invalid value 'x' for '--steps <steps>': invalid digit found in string",
        );
        check(
            &["load", "--steps"],
            ErrorKind::InvalidValue,
            "a value is required for '--steps <steps>' but none was supplied",
        );
        check(
            &["load", "--json=1"],
            ErrorKind::TooManyValues,
            "unexpected value '1' for '--json' found; no more were expected",
        );
        check(
            &["load", "--a", "1", "--b", "2"],
            ErrorKind::ArgumentConflict,
            "the argument '--a <a>' cannot be used with '--b <b>'",
        );
        check(
            &["demo"],
            ErrorKind::MissingRequiredArgument,
            "the following required arguments were not provided: --write <write>",
        );
        check(
            &["lod"],
            ErrorKind::InvalidSubcommand,
            "unrecognized subcommand 'lod'; tip: a similar subcommand exists: 'load'",
        );
        check(
            &[],
            ErrorKind::MissingSubcommand,
            "'t' requires a subcommand but one was not provided; [subcommands: load, demo, help]",
        );
        use std::os::unix::ffi::OsStrExt;
        let e = command()
            .try_get_matches_from([
                std::ffi::OsStr::new("t"),
                std::ffi::OsStr::new("load"),
                std::ffi::OsStr::new("--a"),
                std::ffi::OsStr::from_bytes(b"\xff"),
            ])
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidUtf8);
        assert_eq!(
            usage_error_line(&e),
            "invalid UTF-8 was detected in one or more arguments"
        );
    }

    #[test]
    fn bars_are_drawn_only_on_a_terminal_and_never_when_quiet() {
        assert!(progress_shown(false, true));
        assert!(!progress_shown(true, true));
        assert!(!progress_shown(false, false));
        assert!(!progress_shown(true, false));
        // Not shown: never drawn, whatever the delay.
        let p = Progress::new("load", Unit::Bytes, false, Duration::ZERO);
        p.set(1, 2);
        assert!(!p.is_drawn());
        p.finish();
    }

    #[test]
    fn a_bar_never_moves_back_within_a_phase() {
        let p = Progress::new("load", Unit::Bytes, false, Duration::ZERO);
        p.set(200, 1000);
        p.set(100, 1000);
        assert_eq!(p.position(), 200);
        p.set(300, 1000);
        assert_eq!(p.position(), 300);
        p.phase("decode", Unit::Tokens);
        p.set(1, 4);
        assert_eq!(p.position(), 1);
    }
}
