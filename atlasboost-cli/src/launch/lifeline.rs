//! The lifeline: a small process (`atlasboost guard`) that outlives the launcher and stops the
//! job's process groups when the launcher dies, however it dies (SPEC §6 "Lifetime").
//!
//! `PR_SET_PDEATHSIG` kills each worker with its launcher, but not the worker's own children.
//! The guard holds the read end of a pipe whose write end only the launcher has: the launcher
//! tells it `+<pgid>` for each worker's process group and `-<pgid>` once that group is gone.
//! When the pipe closes (the launcher exited, or was killed with `kill -9`), the guard sends
//! SIGKILL to every group it still knows, and exits. It runs in a process group of its own, so
//! a Ctrl-C on the terminal or a `kill` of the launcher's group does not reach it.

use std::collections::BTreeSet;
use std::io::{BufRead, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio};

use nix::sys::signal::{SigHandler, Signal, killpg, signal};
use nix::unistd::Pid;

use crate::error::CliError;

/// The launcher's end of the lifeline.
#[derive(Debug)]
pub struct Lifeline {
    guard: Child,
    pipe: Option<ChildStdin>,
}

impl Lifeline {
    /// Starts the guard process (this same executable, `atlasboost guard`).
    ///
    /// # Errors
    ///
    /// [`CliError::Failure`] if the guard cannot be started.
    pub fn start() -> Result<Lifeline, CliError> {
        let command = crate::self_command()?;
        let exe = std::path::PathBuf::from(&command[0]);
        let mut guard = Command::new(&exe)
            .args(&command[1..])
            .arg("guard")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .process_group(0)
            .spawn()
            .map_err(|e| {
                CliError::Failure(format!(
                    "cannot start the lifeline process {} guard: {e}",
                    exe.display()
                ))
            })?;
        let pipe = guard.stdin.take();
        Ok(Lifeline { guard, pipe })
    }

    /// The guard's pid (the supervisor reaps it like any child).
    pub fn pid(&self) -> u32 {
        self.guard.id()
    }

    /// The guard is to stop this process group if the launcher dies.
    pub fn watch(&mut self, pgid: i32) {
        self.say(&format!("+{pgid}\n"));
    }

    /// This process group is gone: the guard must never signal it (its id may be reused).
    pub fn forget(&mut self, pgid: i32) {
        self.say(&format!("-{pgid}\n"));
    }

    fn say(&mut self, line: &str) {
        // Lines are shorter than PIPE_BUF, so each arrives whole; a dead guard is noticed by
        // the supervisor when it reaps it.
        if let Some(p) = &mut self.pipe
            && p.write_all(line.as_bytes()).is_err()
        {
            self.pipe = None;
        }
    }

    /// Closes the lifeline after a clean end (every group forgotten); the guard exits.
    pub fn close(mut self) {
        self.pipe = None;
        // The guard exits as soon as it reads the end of the pipe; the supervisor may have
        // reaped it already, in which case this fails harmlessly.
        let _ = self.guard.wait();
    }
}

/// `atlasboost guard`: watch standard input; when it closes, SIGKILL every group still listed.
pub fn guard_main() -> u8 {
    // The guard must outlive the launcher's signals; only the pipe ends it.
    for s in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ] {
        // SAFETY: SIG_IGN installs no handler code; nothing else in this process handles signals.
        let _ = unsafe { signal(s, SigHandler::SigIgn) };
    }
    let mut groups = BTreeSet::new();
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let (op, id) = line.split_at(line.len().min(1));
        match (op, id.parse::<i32>()) {
            ("+", Ok(pgid)) if pgid > 1 => {
                groups.insert(pgid);
            }
            ("-", Ok(pgid)) => {
                groups.remove(&pgid);
            }
            // Best effort: the launcher's stderr may be gone (`eprintln!` would panic).
            _ => {
                let _ = writeln!(
                    std::io::stderr(),
                    "atlasboost guard: ignoring {line:?} on the lifeline"
                );
            }
        }
    }
    for pgid in groups {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
    0
}
