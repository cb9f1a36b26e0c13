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
    /// Its last lines, for a message.
    pub(super) fn said(&self) -> String {
        self.tail.joined().unwrap_or_else(|| "(nothing)".into())
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
