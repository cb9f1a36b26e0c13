//! mpirun as the supervisor of `run --mpi` holds it (its state; what the supervisor does with
//! it is [`super::mpirun`]'s).

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::time::Instant;

use nix::errno::Errno;
use nix::sys::signal::killpg;
use nix::unistd::Pid;

use super::super::channel::{Ending, WorkerSignal};
use super::super::output::LineSplitter;
use super::super::relay::RelayDoor;

/// mpirun, while the launcher of `run --mpi` watches it.
#[derive(Debug)]
pub(super) struct Mpirun {
    pub(super) pid: Pid,
    pub(super) door: RelayDoor,
    /// Its stdout and stderr (its own messages: the ranks' output goes through the relays).
    pub(super) pipes: Vec<(OwnedFd, LineSplitter)>,
    /// What it said in brief, for the message when it fails on its own: the lines outside
    /// its help blocks, and each block's first paragraph.
    pub(super) headlines: Headlines,
    pub(super) started: Instant,
    /// When every relay must have connected.
    pub(super) deadline: Instant,
    /// How it ended, and when.
    pub(super) ended: Option<(Instant, Ending)>,
    /// Its process group has no process left.
    pub(super) group_gone: bool,
    /// When every rank had ended while mpirun went on.
    pub(super) ranks_over: Option<Instant>,
    /// The launcher signalled it (it lingered after its ranks, or the job was being stopped):
    /// how it then ended is not a failure of its own.
    pub(super) signalled: bool,
    /// The end is settled: ranks that never came are named, mpirun's own failure judged.
    pub(super) settled: bool,
    /// The ranks whose relay said that mpirun's side signalled it, and with what
    /// ([`Up::MpirunStops`](super::super::channel::Up::MpirunStops)): mpirun is stopping its
    /// ranks, and how their workers end from then on is its doing.
    pub(super) stopped: BTreeMap<u32, WorkerSignal>,
    /// How far the launcher has gone in ending mpirun after its ranks (`mpirun_lingers`).
    pub(super) linger: Linger,
}

/// The launcher's signals to an mpirun that goes on after its ranks: SIGTERM, SIGTERM again
/// a moment later, SIGKILL `--grace` after the first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Linger {
    /// None sent.
    NotYet,
    /// SIGTERM, at that time.
    Termed(Instant),
    /// SIGTERM twice, the first at that time.
    TermedTwice(Instant),
    /// SIGKILL.
    Killed,
}

impl Mpirun {
    /// What it said, in brief, for a message: `it said: ...`, or `it said nothing`.
    pub(super) fn said(&self) -> String {
        self.headlines
            .joined()
            .map_or_else(|| "it said nothing".into(), |s| format!("it said: {s}"))
    }

    /// One more line of mpirun's own.
    pub(super) fn heard(&mut self, line: &str) {
        self.headlines.push(line);
    }

    /// Its group's id, once, when its last process (mpirun, or a child of its such as an ssh
    /// session) is gone: the lifeline must forget it, since the id may be reused.
    pub(super) fn group_just_gone(&mut self) -> Option<Pid> {
        let gone =
            !self.group_gone && self.ended.is_some() && killpg(self.pid, None) == Err(Errno::ESRCH);
        self.group_gone |= gone;
        gone.then_some(self.pid)
    }
}

/// The gist of what mpirun says, for a message: Open MPI frames each message as a help block
/// between two lines of dashes, whose first paragraph is its headline (`ORTE was unable to
/// reliably start one or more daemons.`), or its first paragraph with text in it; a line
/// outside the blocks (ssh's `Connection refused`) is one entry of its own. The last [`Headlines::KEEP`] entries are kept, each at
/// most [`Headlines::MAX_ENTRY`] bytes, so that the failure at the end is not pushed out by
/// warnings at the start.
#[derive(Debug, Default)]
pub(super) struct Headlines {
    entries: std::collections::VecDeque<String>,
    in_block: bool,
    /// Inside a block: its first paragraph with text is still being read.
    in_first_paragraph: bool,
}

impl Headlines {
    const KEEP: usize = 3;
    const MAX_ENTRY: usize = 300;

    fn push(&mut self, line: &str) {
        let text = line.trim();
        if text.len() >= 10 && text.bytes().all(|b| b == b'-') {
            self.in_block = !self.in_block;
            self.in_first_paragraph = false;
            if self.in_block {
                self.in_first_paragraph = true;
                self.start_entry();
            }
            return;
        }
        if self.in_block {
            if text.is_empty() {
                // A paragraph ends at a blank line, once the block's entry has text.
                self.in_first_paragraph &= self.entries.back().is_none_or(String::is_empty);
            } else if self.in_first_paragraph {
                self.extend_entry(text);
            }
            return;
        }
        if !text.is_empty() {
            self.start_entry();
            self.extend_entry(text);
        }
    }

    fn start_entry(&mut self) {
        if self.entries.back().is_some_and(String::is_empty) {
            return;
        }
        if self.entries.len() == Headlines::KEEP {
            self.entries.pop_front();
        }
        self.entries.push_back(String::new());
    }

    fn extend_entry(&mut self, text: &str) {
        let Some(entry) = self.entries.back_mut() else {
            return;
        };
        if !entry.is_empty() {
            entry.push(' ');
        }
        entry.push_str(text);
        if entry.len() > Headlines::MAX_ENTRY {
            let mut cut = Headlines::MAX_ENTRY;
            while !entry.is_char_boundary(cut) {
                cut -= 1;
            }
            entry.truncate(cut);
            entry.push('…');
            self.in_first_paragraph = false;
        }
    }

    /// The entries, oldest first, joined with ` | `; `None` if mpirun said nothing.
    fn joined(&self) -> Option<String> {
        let kept: Vec<&str> = self
            .entries
            .iter()
            .map(String::as_str)
            .filter(|e| !e.is_empty())
            .collect();
        (!kept.is_empty()).then(|| kept.join(" | "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_headlines_are_the_last_lines_outside_blocks_and_blocks_first_paragraphs() {
        let said = "Warning: Permanently added '10.0.0.2' (ED25519) to the list of known hosts.
Warning: Permanently added '10.0.0.3' (ED25519) to the list of known hosts.
ssh: connect to host 127.0.0.2 port 22: Connection refused
--------------------------------------------------------------------------
ORTE was unable to reliably start one or more daemons.
This usually is caused by:

* not finding the required libraries and/or binaries on
--------------------------------------------------------------------------
--------------------------------------------------------------------------
There are not enough slots available in the system to satisfy the 4
slots that were requested by the application:

  true
--------------------------------------------------------------------------";
        let mut h = Headlines::default();
        for l in said.lines() {
            h.push(l);
        }
        assert_eq!(
            h.joined().unwrap(),
            "ssh: connect to host 127.0.0.2 port 22: Connection refused | ORTE was unable to \
             reliably start one or more daemons. This usually is caused by: | There are not \
             enough slots available in the system to satisfy the 4 slots that were requested \
             by the application:"
        );
        assert_eq!(Headlines::default().joined(), None);
        // A block that opens with a blank line gives its first paragraph with text.
        let mut h = Headlines::default();
        for l in [
            "-".repeat(20).as_str(),
            "",
            "mpirun was unable to launch.",
            "",
            "more",
            "-",
        ] {
            h.push(l);
        }
        assert_eq!(h.joined().unwrap(), "mpirun was unable to launch.");
    }
}
