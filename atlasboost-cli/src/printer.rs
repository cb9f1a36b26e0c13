//! All console output goes through the [`Printer`], which owns `--quiet` and `--verbose`.

use std::io::{self, Write};

/// Where results (stdout) and atlasboost's own messages (stderr) go.
#[derive(Debug, Clone, Copy, Default)]
pub struct Printer {
    quiet: bool,
    verbose: bool,
}

impl Printer {
    /// A printer for `--quiet` / `--verbose`.
    pub fn new(quiet: bool, verbose: bool) -> Self {
        Printer { quiet, verbose }
    }

    /// A status line on stderr, unless `--quiet`.
    pub fn status(&self, message: &str) {
        if !self.quiet {
            say(message);
        }
    }

    /// A detail on stderr, only with `--verbose`.
    pub fn detail(&self, message: &str) {
        if self.verbose && !self.quiet {
            say(message);
        }
    }

    /// What an error already printed needs to be understood (a restart follows the failure it
    /// told of): printed even with `--quiet`, where the status around it is not.
    pub fn sequel(&self, message: &str) {
        say(message);
    }

    /// What the user has no other way to learn (the port the kernel chose for `--metrics
    /// ADDR:0`): printed even with `--quiet`.
    pub fn needed(&self, message: &str) {
        say(message);
    }

    /// An error on stderr: printed even with `--quiet`.
    pub fn error(&self, message: &str) {
        say(message);
    }

    /// Whether details are shown (`--verbose`, not `--quiet`).
    pub fn is_verbose(&self) -> bool {
        self.verbose && !self.quiet
    }

    /// Whether `--quiet` was given (no progress displays either).
    pub fn is_quiet(&self) -> bool {
        self.quiet
    }

    /// A result on stdout (always printed: it is what the user asked for).
    ///
    /// # Errors
    ///
    /// The write error; a closed pipe (`| head`) is `BrokenPipe`, which `main` treats as success.
    /// A standard output that was closed when atlasboost started ([`note_closed_stdout`]) is an
    /// error too: the result would be lost.
    pub fn out(&self, text: &str) -> io::Result<()> {
        if STDOUT_CLOSED.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(io::Error::other(
                "it was closed when atlasboost started (>&-), and the result would be lost: \
                 redirect it to a file, or to /dev/null to discard it",
            ));
        }
        let mut out = io::stdout().lock();
        out.write_all(text.as_bytes())?;
        out.flush()
    }
}

/// Whether standard output was closed when atlasboost started.
static STDOUT_CLOSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Notes whether file descriptor 1 is closed, for [`Printer::out`]. The `atlasboost` program
/// calls it before Rust's runtime starts (which opens `/dev/null` on a closed descriptor 0-2,
/// hiding it). Calls only `fcntl` and an atomic store, as code that runs before `main` may.
pub fn note_closed_stdout() {
    // SAFETY: F_GETFD reads the descriptor's flags and touches no memory.
    if unsafe { nix::libc::fcntl(1, nix::libc::F_GETFD) } == -1 {
        STDOUT_CLOSED.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A line on stderr.
fn say(message: &str) {
    to_stderr(&format!("{message}\n"));
}

/// Text on stderr, flushed. A closed stderr loses it but does not stop atlasboost (which
/// `eprintln!` would, by panicking): a launcher must go on supervising its workers.
pub fn to_stderr(text: &str) {
    let mut err = io::stderr().lock();
    let _ = err.write_all(text.as_bytes()).and_then(|()| err.flush());
}
