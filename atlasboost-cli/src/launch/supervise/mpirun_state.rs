//! mpirun as the supervisor of `run --mpi` holds it (its state; what the supervisor does with
//! it is [`super::mpirun`]'s).

use std::os::fd::OwnedFd;
use std::time::Instant;

use nix::errno::Errno;
use nix::sys::signal::killpg;
use nix::unistd::Pid;

use super::super::channel::Ending;
use super::super::output::{LineSplitter, Tail};
use super::super::relay::RelayDoor;

/// mpirun, while the launcher of `run --mpi` watches it.
#[derive(Debug)]
pub(super) struct Mpirun {
    pub(super) pid: Pid,
    pub(super) door: RelayDoor,
    /// Its stdout and stderr (its own messages: the ranks' output goes through the relays).
    pub(super) pipes: Vec<(OwnedFd, LineSplitter)>,
    /// Its last lines, for the message when it fails on its own.
    pub(super) tail: Tail,
    /// What it said in brief: the lines outside its help blocks, and each block's first.
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
}

impl Mpirun {
    /// What it said, for a message: its headlines, else its last lines.
    pub(super) fn said(&self) -> String {
        match self.headlines.lines.is_empty() {
            false => self.headlines.lines.join(" | "),
            true => self.tail.joined().unwrap_or_else(|| "(nothing)".into()),
        }
    }

    /// One more line of mpirun's own.
    pub(super) fn heard(&mut self, line: String) {
        self.headlines.push(&line);
        self.tail.push(line);
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

/// The gist of what mpirun says: Open MPI frames each message as a help block between two
/// lines of dashes, whose first line is its headline (`ORTE was unable to reliably start one
/// or more daemons.`); lines outside the blocks (ssh's `Connection refused`) are kept whole.
/// At most [`Headlines::KEEP`] of them.
#[derive(Debug, Default)]
pub(super) struct Headlines {
    lines: Vec<String>,
    in_block: bool,
    /// Inside a block whose first line has not come yet.
    awaiting_first: bool,
}

impl Headlines {
    const KEEP: usize = 4;

    fn push(&mut self, line: &str) {
        let text = line.trim();
        if text.len() >= 10 && text.bytes().all(|b| b == b'-') {
            self.in_block = !self.in_block;
            self.awaiting_first = self.in_block;
            return;
        }
        if text.is_empty() || self.lines.len() == Headlines::KEEP {
            return;
        }
        if !self.in_block || self.awaiting_first {
            self.awaiting_first = false;
            self.lines.push(text.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_headlines_are_the_lines_outside_blocks_and_each_blocks_first() {
        let said = "ssh: connect to host 127.0.0.2 port 22: Connection refused
--------------------------------------------------------------------------
ORTE was unable to reliably start one or more daemons.
This usually is caused by:

* not finding the required libraries and/or binaries on
--------------------------------------------------------------------------
--------------------------------------------------------------------------
There are not enough slots available in the system to satisfy the 4
slots that were requested by the application:
--------------------------------------------------------------------------";
        let mut h = Headlines::default();
        for l in said.lines() {
            h.push(l);
        }
        assert_eq!(
            h.lines,
            [
                "ssh: connect to host 127.0.0.2 port 22: Connection refused",
                "ORTE was unable to reliably start one or more daemons.",
                "There are not enough slots available in the system to satisfy the 4",
            ]
        );
    }
}
