//! Starting the workers and watching them until the job ends (SPEC §7, §8).
//!
//! One thread does everything: it polls the workers' pipes and a signalfd (SIGCHLD, SIGINT,
//! SIGTERM, SIGHUP), so a worker's exit, a Ctrl-C and a line of output are all handled in the
//! order they happen, without locks. Workers run in process groups of their own; stopping one
//! means signalling its group (its own children included), SIGTERM first, SIGKILL after the
//! grace time. Nothing is ever signalled by name.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::resource::{Resource, getrlimit, setrlimit};
use nix::sys::signal::{SigSet, Signal, killpg};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use super::channel::{Down, HEARTBEAT, LOST_AFTER, Up};
use super::lifeline::Lifeline;
use super::output::{LineSplitter, Output, Stream};
use super::remote::Remote;
use crate::error::CliError;
use crate::exit::ExitCodes;

/// The signals the launcher handles itself, through a signalfd.
const HANDLED: [Signal; 4] = [
    Signal::SIGCHLD,
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
];

/// How long the output of stopped workers is still read after SIGKILL (a process outside
/// their groups may hold their pipes open).
const DRAIN_AFTER_KILL: Duration = Duration::from_secs(2);

/// How long an agent whose launcher is gone gives its workers between SIGTERM and SIGKILL, so
/// that they are gone within 5 s of the launcher.
const LAUNCHER_LOST_GRACE: Duration = Duration::from_secs(1);

/// The launcher's signals, blocked and readable from a descriptor. Create it before any
/// thread starts, so that every thread inherits the blocked mask.
#[derive(Debug)]
pub struct Signals {
    fd: SignalFd,
}

impl Signals {
    /// Blocks the handled signals in this thread (and the threads it starts) and opens a
    /// signalfd for them.
    ///
    /// # Errors
    ///
    /// [`CliError::Failure`] if the mask or the signalfd cannot be set up.
    pub fn block() -> Result<Signals, CliError> {
        // Blocking is per thread: another thread of the process (a program that embeds the
        // launcher, e.g. the Python package's `_cli.main` called from a threaded program)
        // would take the process's SIGCHLD and SIGINT, and the launcher would wait for ever.
        let threads = std::fs::read_dir("/proc/self/task").map_or(1, |d| d.count());
        if threads > 1 {
            return Err(CliError::Failure(format!(
                "the launcher must be the only thread of its process, which has {threads}: \
                 signals meant for it would reach the others; run the atlasboost command as a \
                 process of its own"
            )));
        }
        // An ignored SIGCHLD, inherited across exec from a parent that set it (Python's
        // `signal(SIGCHLD, SIG_IGN)`), would make the kernel reap the workers unseen. The other
        // signals keep their inherited disposition: `nohup` ignoring SIGHUP is respected.
        // SAFETY: the default disposition installs no handler code.
        unsafe { nix::sys::signal::signal(Signal::SIGCHLD, nix::sys::signal::SigHandler::SigDfl) }
            .map_err(|e| CliError::Failure(format!("cannot reset SIGCHLD: {e}")))?;
        let mut set = SigSet::empty();
        for s in HANDLED {
            set.add(s);
        }
        set.thread_block()
            .map_err(|e| CliError::Failure(format!("cannot block signals: {e}")))?;
        let fd = SignalFd::with_flags(&set, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
            .map_err(|e| CliError::Failure(format!("cannot open a signalfd: {e}")))?;
        Ok(Signals { fd })
    }

    /// The signals received since the last call, in order.
    pub fn pending(&self) -> Vec<Signal> {
        let mut got = Vec::new();
        while let Ok(Some(info)) = self.fd.read_signal() {
            if let Ok(s) = Signal::try_from(info.ssi_signo as i32) {
                got.push(s);
            }
        }
        got
    }

    fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// The launcher's limit of open files before [`raise_fd_limit`].
static ORIGINAL_FD_LIMIT: OnceLock<(u64, u64)> = OnceLock::new();

/// Raises the launcher's soft limit of open files to the hard limit (every worker takes two
/// pipes, so many local ranks would hit a soft limit of 1,024); workers get the original back.
pub fn raise_fd_limit() {
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
        && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok()
    {
        let _ = ORIGINAL_FD_LIMIT.set((soft, hard));
    }
}

/// One worker to start (or, in the launcher, one worker a remote agent starts).
#[derive(Debug, Clone)]
pub struct WorkerPlan {
    /// Its rank.
    pub rank: u32,
    /// Its host, for messages.
    pub host: String,
    /// Its (logical) device id.
    pub device: u32,
    /// Variables to set.
    pub env: Vec<(OsString, OsString)>,
    /// Started here; `false`: started by the agent of `host`, over ssh.
    pub local: bool,
}

/// How the workers run.
#[derive(Debug, Clone)]
pub struct RunPlan {
    /// The command and its arguments.
    pub command: Vec<OsString>,
    /// The workers' directory.
    pub wdir: PathBuf,
    /// SIGTERM to SIGKILL.
    pub grace: Duration,
}

/// How a worker ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// It exited with this code.
    Exited(i32),
    /// A signal ended it.
    Signaled(Signal),
    /// Its host was lost; how it ended is unknown.
    Lost,
}

impl Ending {
    /// The exit code that reports it: the code, or 128 + the signal's number.
    pub fn code(self) -> u8 {
        match self {
            Ending::Exited(c) => (c & 0xff) as u8,
            Ending::Signaled(s) => 128u8.wrapping_add(s as u8),
            Ending::Lost => ExitCodes::FAILURE,
        }
    }

    /// `exit 0`, `exit 3`, `SIGKILL`, `host lost`.
    pub fn describe(self) -> String {
        match self {
            Ending::Exited(c) => format!("exit {c}"),
            Ending::Signaled(s) => s.as_str().to_string(),
            Ending::Lost => "host lost".into(),
        }
    }

    fn failed(self) -> bool {
        self != Ending::Exited(0)
    }
}

/// What became of one worker.
#[derive(Debug, Clone)]
pub struct WorkerResult {
    /// Its rank.
    pub rank: u32,
    /// Its host.
    pub host: String,
    /// Its device.
    pub device: u32,
    /// How it ended (`None`: it never started).
    pub ending: Option<Ending>,
    /// How long it ran.
    pub run_time: Duration,
    /// It ended after atlasboost began stopping the job (a failure elsewhere, or a signal).
    pub stopped: bool,
    /// Its last stderr lines.
    pub tail: Vec<String>,
}

/// A host that failed the job: its agent could not start its workers, or it was lost.
#[derive(Debug, Clone)]
pub struct HostFailure {
    /// The host.
    pub host: String,
    /// What happened.
    pub message: String,
    /// The exit code it calls for (125; 126 or 127 for a command that cannot be started).
    pub code: u8,
}

/// How the job ended.
#[derive(Debug)]
pub struct JobResult {
    /// Every worker, in rank order.
    pub workers: Vec<WorkerResult>,
    /// The index (in `workers`) of the first worker to fail.
    pub first_failure: Option<usize>,
    /// The host that failed the job first, if a host did rather than a worker.
    pub host_failure: Option<HostFailure>,
    /// The signal that stopped the launcher, if one did first.
    pub interrupted: Option<Signal>,
    /// The launcher's exit code.
    pub exit_code: u8,
}

/// Who supervises: the launcher (with the sessions of its remote hosts), or a remote agent
/// (which answers to the launcher over its standard streams).
#[derive(Debug)]
pub enum Role {
    /// The launcher; it decides the job's fate.
    Launcher(Vec<Remote>),
    /// A remote agent; it reports exits and obeys the launcher's commands.
    Agent(Upstream),
}

/// An agent's line to its launcher: commands in on stdin (frames go out through [`Output`]).
#[derive(Debug)]
pub struct Upstream {
    fd: Option<OwnedFd>,
    split: LineSplitter,
    last_heard: Instant,
    lost: bool,
}

impl Upstream {
    /// Reads commands from this process's standard input.
    ///
    /// # Errors
    ///
    /// [`CliError::Failure`] if standard input cannot be duplicated.
    pub fn stdin() -> Result<Upstream, CliError> {
        let fd = io::stdin()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| CliError::Failure(format!("cannot use standard input: {e}")))?;
        let _ = fcntl(&fd, FcntlArg::F_SETFL(OFlag::O_NONBLOCK));
        Ok(Upstream {
            fd: Some(fd),
            split: LineSplitter::default(),
            last_heard: Instant::now(),
            lost: false,
        })
    }
}

struct Running {
    /// `None` for a worker of a remote host.
    pid: Option<Pid>,
    started: Instant,
    ended: Option<(Instant, Ending)>,
    /// Its process group has no process left (so its id must never be signalled again).
    group_gone: bool,
}

/// What a read of a pipe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PipeState {
    /// Nothing more for now.
    Empty,
    /// Maybe more: the read limit was reached.
    More,
    /// The pipe is closed.
    Ended,
}

impl Running {
    /// A worker with no process of this launcher's: a remote host's, or one never started.
    fn elsewhere() -> Running {
        Running {
            pid: None,
            started: Instant::now(),
            ended: None,
            group_gone: true,
        }
    }
}

struct Pipe {
    lane: usize,
    stream: Stream,
    fd: OwnedFd,
    split: LineSplitter,
}

/// Where a polled descriptor comes from.
#[derive(Clone, Copy)]
enum Source {
    Signals,
    Upstream,
    Pipe(usize),
    RemoteOut(usize),
    RemoteErr(usize),
}

/// Starts every local worker and supervises the job to the end.
///
/// # Errors
///
/// [`CliError::Spawn`] when the command cannot be started (the workers started before it are
/// stopped first).
pub fn run_workers(
    plan: &RunPlan,
    workers: &[WorkerPlan],
    output: &mut Output,
    signals: &Signals,
    lifeline: &mut Lifeline,
    role: Role,
) -> Result<JobResult, CliError> {
    let mut running: Vec<Running> = Vec::with_capacity(workers.len());
    let mut pipes: Vec<Pipe> = Vec::with_capacity(workers.len() * 2);
    let mut failed = None;
    for (lane, w) in workers.iter().enumerate() {
        // A remote host's worker, or one after a failed start: no process here.
        if !w.local || failed.is_some() {
            running.push(Running::elsewhere());
            continue;
        }
        match spawn(plan, w) {
            Ok((pid, out, err)) => {
                lifeline.watch(pid.as_raw());
                running.push(Running {
                    pid: Some(pid),
                    started: Instant::now(),
                    ended: None,
                    group_gone: false,
                });
                for (stream, fd) in [(Stream::Stdout, out), (Stream::Stderr, err)] {
                    pipes.push(Pipe {
                        lane,
                        stream,
                        fd,
                        split: LineSplitter::default(),
                    });
                }
            }
            Err(e) => {
                failed = Some(CliError::Spawn {
                    program: plan.command.first().cloned().unwrap_or_default(),
                    host: w.host.clone(),
                    reason: e,
                });
                running.push(Running::elsewhere());
            }
        }
    }
    let mut sup = Supervisor::new(plan, workers, running, pipes, lifeline, role);
    if let Some(e) = failed {
        sup.stop(Signal::SIGKILL);
        sup.finish_quietly(signals, output);
        return Err(e);
    }
    sup.replay_backlog(output);
    sup.run(signals, output);
    Ok(sup.result(output))
}

/// Starts one worker in a process group of its own, stdin closed, output on pipes.
fn spawn(plan: &RunPlan, w: &WorkerPlan) -> io::Result<(Pid, OwnedFd, OwnedFd)> {
    let (program, args) = plan
        .command
        .split_first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no command"))?;
    let launcher = nix::unistd::getpid();
    let mut cmd = Command::new(program);
    cmd.args(args)
        .current_dir(&plan.wdir)
        .envs(w.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    // SAFETY: between fork and exec only async-signal-safe calls: prctl, getppid,
    // sigprocmask, setrlimit. No allocation, no locks.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            // The launcher may have died between fork and prctl: then nobody would kill us.
            if nix::unistd::getppid() != launcher {
                return Err(io::Error::other("the launcher is gone"));
            }
            SigSet::empty().thread_set_mask()?;
            // Workers get the limit of open files the launcher was given.
            if let Some(&(soft, hard)) = ORIGINAL_FD_LIMIT.get() {
                setrlimit(Resource::RLIMIT_NOFILE, soft, hard)?;
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    let pid = Pid::from_raw(child.id() as i32);
    let (Some(out), Some(err)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(io::Error::other("no pipes"));
    };
    let (out, err) = (OwnedFd::from(out), OwnedFd::from(err));
    for fd in [&out, &err] {
        // Bigger pipes mean fewer, larger reads; non-blocking reads let one poll drain them.
        let _ = fcntl(fd, FcntlArg::F_SETPIPE_SZ(1 << 20));
        let _ = fcntl(fd, FcntlArg::F_SETFL(OFlag::O_NONBLOCK));
    }
    Ok((pid, out, err))
}

struct Supervisor<'a> {
    plan: &'a RunPlan,
    workers: &'a [WorkerPlan],
    running: Vec<Running>,
    pipes: Vec<Pipe>,
    lifeline: &'a mut Lifeline,
    role: Role,
    first_failure: Option<usize>,
    host_failure: Option<HostFailure>,
    interrupted: Option<Signal>,
    /// When the stop began and whether SIGKILL has followed.
    stopping: Option<(Instant, bool)>,
    /// The grace time of the stop in progress (shorter when the launcher is lost).
    grace: Duration,
    /// What the workers left behind has been sent SIGTERM.
    leftovers_stopped: bool,
    drain_until: Option<Instant>,
    next_heartbeat: Instant,
    buf: Vec<u8>,
}

impl<'a> Supervisor<'a> {
    fn new(
        plan: &'a RunPlan,
        workers: &'a [WorkerPlan],
        running: Vec<Running>,
        pipes: Vec<Pipe>,
        lifeline: &'a mut Lifeline,
        role: Role,
    ) -> Self {
        Supervisor {
            plan,
            workers,
            running,
            pipes,
            lifeline,
            role,
            first_failure: None,
            host_failure: None,
            interrupted: None,
            stopping: None,
            grace: plan.grace,
            leftovers_stopped: false,
            drain_until: None,
            next_heartbeat: Instant::now(),
            buf: vec![0; 1 << 16],
        }
    }

    fn is_agent(&self) -> bool {
        matches!(self.role, Role::Agent(_))
    }

    /// Processes that are the launcher's children but neither workers nor orphans.
    fn own_children(&self) -> Vec<u32> {
        let mut own = vec![self.lifeline.pid()];
        if let Role::Launcher(remotes) = &self.role {
            own.extend(remotes.iter().map(Remote::pid));
        }
        own
    }

    /// Whether every remote host is finished with (done, or lost).
    fn remotes_finished(&self) -> bool {
        match &self.role {
            Role::Launcher(remotes) => remotes.iter().all(|r| r.done || r.lost.is_some()),
            Role::Agent(_) => true,
        }
    }

    fn run(&mut self, signals: &Signals, output: &mut Output) {
        loop {
            let all_ended = self.running.iter().all(|r| r.ended.is_some());
            if all_ended && self.wrap_up(output) && self.remotes_finished() {
                break;
            }
            self.escalate();
            self.heartbeats(output);
            let mut wait = self
                .next_heartbeat
                .saturating_duration_since(Instant::now());
            if self.stopping.is_some() || all_ended {
                wait = wait.min(Duration::from_millis(50));
            }
            let timeout = if self.has_peers() {
                PollTimeout::try_from(wait).unwrap_or(PollTimeout::MAX)
            } else if self.stopping.is_some() || all_ended {
                PollTimeout::from(50u8)
            } else {
                PollTimeout::NONE
            };
            self.poll_once(signals, output, timeout);
        }
        // Lines still in the splitters of pipes we gave up on.
        for p in &mut self.pipes {
            p.split.finish(&mut |l| output.line(p.lane, p.stream, l));
        }
        self.pipes.clear();
        output.flush();
    }

    fn has_peers(&self) -> bool {
        match &self.role {
            Role::Launcher(remotes) => !remotes.is_empty(),
            Role::Agent(_) => true,
        }
    }

    /// Once every worker has ended: stops what they left running, and says whether the local
    /// side is finished (groups empty, pipes drained or given up on).
    fn wrap_up(&mut self, output: &mut Output) -> bool {
        self.check_groups();
        let own = self.own_children();
        let orphans = orphans(&own);
        let groups_gone = self.running.iter().all(|r| r.group_gone) && orphans.is_empty();
        if !self.leftovers_stopped && !groups_gone {
            // Whatever the workers left: processes in their groups, and orphans of theirs that
            // left the groups (setsid) and were re-parented to the launcher.
            self.leftovers_stopped = true;
            let left: Vec<String> = self
                .running
                .iter()
                .enumerate()
                .filter(|(_, r)| !r.group_gone)
                .map(|(i, _)| self.workers[i].rank.to_string())
                .collect();
            let mut what = Vec::new();
            if !left.is_empty() {
                what.push(format!(
                    "the process groups of rank{} {}",
                    if left.len() == 1 { "" } else { "s" },
                    left.join(", ")
                ));
            }
            if !orphans.is_empty() {
                let n = orphans.len();
                what.push(format!(
                    "{n} process{} outside them",
                    if n == 1 { "" } else { "es" }
                ));
            }
            output.message(&format!(
                "atlasboost: every worker has exited; stopping what they left running ({})",
                what.join(", and ")
            ));
            if self.stopping.is_none() {
                self.stopping = Some((Instant::now(), false));
            }
            self.signal_groups(Signal::SIGTERM);
            signal_orphans(&own, Signal::SIGTERM);
        }
        if groups_gone && !self.pipes.is_empty() && self.drain_until.is_none() {
            // Every group is empty, yet a pipe is open: a process that left its group
            // (setsid) holds it. Read what comes for a while, not forever.
            self.drain_until = Some(Instant::now() + DRAIN_AFTER_KILL);
        }
        let drained =
            self.pipes.is_empty() || self.drain_until.is_some_and(|t| Instant::now() >= t);
        let finished = drained && (groups_gone || self.drain_until.is_some());
        if finished && !self.pipes.is_empty() {
            let mut ranks: Vec<u32> = self
                .pipes
                .iter()
                .map(|p| self.workers[p.lane].rank)
                .collect();
            ranks.dedup();
            output.message(&format!(
                "atlasboost: warning: a process outside the workers' process groups \
                 (started with setsid?) still holds the output of rank {}; no longer \
                 reading it",
                ranks
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            for p in &mut self.pipes {
                p.split.finish(&mut |l| output.line(p.lane, p.stream, l));
            }
            self.pipes.clear();
        }
        finished
    }

    /// Sends heartbeats when due, and notices peers that stopped sending theirs.
    fn heartbeats(&mut self, output: &mut Output) {
        let now = Instant::now();
        if output.take_stall() {
            // Blocked on our own output, we could neither hear nor be heard: start afresh.
            self.next_heartbeat = now;
            match &mut self.role {
                Role::Launcher(remotes) => remotes.iter_mut().for_each(|r| r.last_heard = now),
                Role::Agent(up) => up.last_heard = now,
            }
        }
        let due = now >= self.next_heartbeat;
        if due {
            self.next_heartbeat = now + HEARTBEAT;
        }
        let mut lost = Vec::new();
        let mut upstream_lost = None;
        match &mut self.role {
            Role::Launcher(remotes) => {
                for (h, r) in remotes.iter_mut().enumerate() {
                    if r.done || r.lost.is_some() {
                        continue;
                    }
                    if due {
                        r.send(Down::Heartbeat);
                    }
                    if r.last_heard.elapsed() > LOST_AFTER {
                        lost.push((
                            h,
                            format!(
                                "its agent sent nothing for {:.0?} (heartbeats stopped)",
                                r.last_heard.elapsed()
                            ),
                        ));
                    }
                }
            }
            Role::Agent(up) => {
                if due {
                    output.send(&Up::Heartbeat);
                }
                if !up.lost && output.upstream_closed() {
                    upstream_lost = Some("the launcher stopped reading what this host sends");
                } else if !up.lost && up.last_heard.elapsed() > LOST_AFTER {
                    upstream_lost = Some("no heartbeat from the launcher");
                }
            }
        }
        for (h, why) in lost {
            self.host_lost(h, why, output);
        }
        if let Some(why) = upstream_lost {
            self.upstream_lost(why, output);
        }
    }

    /// Waits for output, exits, signals or messages once, and handles what came.
    fn poll_once(&mut self, signals: &Signals, output: &mut Output, timeout: PollTimeout) {
        let ready: Vec<Source> = {
            let mut fds = Vec::with_capacity(self.pipes.len() + 4);
            let mut sources = Vec::with_capacity(self.pipes.len() + 4);
            fds.push(PollFd::new(signals.fd(), PollFlags::POLLIN));
            sources.push(Source::Signals);
            match &self.role {
                Role::Agent(up) => {
                    if let Some(fd) = &up.fd {
                        fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
                        sources.push(Source::Upstream);
                    }
                }
                Role::Launcher(remotes) => {
                    for (h, r) in remotes.iter().enumerate() {
                        if let Some(fd) = &r.out {
                            fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
                            sources.push(Source::RemoteOut(h));
                        }
                        if let Some(fd) = &r.err {
                            fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
                            sources.push(Source::RemoteErr(h));
                        }
                    }
                }
            }
            for (i, p) in self.pipes.iter().enumerate() {
                fds.push(PollFd::new(p.fd.as_fd(), PollFlags::POLLIN));
                sources.push(Source::Pipe(i));
            }
            match poll(&mut fds, timeout) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(_) => return,
            }
            fds.iter()
                .zip(&sources)
                .filter(|(f, _)| f.revents().is_some_and(|r| !r.is_empty()))
                .map(|(_, s)| *s)
                .collect()
        };
        output.tick();
        let mut closed = Vec::new();
        for source in ready {
            match source {
                Source::Signals => {
                    for s in signals.pending() {
                        self.on_signal(s, output);
                    }
                }
                Source::Upstream => self.read_upstream(output),
                Source::RemoteOut(h) => self.read_remote(h, output),
                Source::RemoteErr(h) => self.read_remote_err(h, output),
                Source::Pipe(i) => {
                    if !Self::read_pipe(&mut self.buf, &mut self.pipes[i], output) {
                        closed.push(i);
                    }
                }
            }
        }
        closed.sort_unstable();
        for i in closed.into_iter().rev() {
            self.pipes.swap_remove(i);
        }
        output.flush();
    }

    /// Reads what a pipe has; false at its end.
    fn read_pipe(buf: &mut [u8], p: &mut Pipe, output: &mut Output) -> bool {
        Self::read_some(buf, p, output) != PipeState::Ended
    }

    /// Up to 16 reads: a bounded number per poll keeps one chatty worker from starving the rest.
    fn read_some(buf: &mut [u8], p: &mut Pipe, output: &mut Output) -> PipeState {
        for _ in 0..16 {
            match nix::unistd::read(&p.fd, buf) {
                Ok(0) => {
                    p.split.finish(&mut |l| output.line(p.lane, p.stream, l));
                    return PipeState::Ended;
                }
                Ok(n) => p
                    .split
                    .feed(&buf[..n], &mut |l| output.line(p.lane, p.stream, l)),
                Err(Errno::EAGAIN) => return PipeState::Empty,
                Err(Errno::EINTR) => {}
                Err(_) => return PipeState::Ended,
            }
        }
        PipeState::More
    }

    /// Reads everything a worker that just exited left in its pipes, so that its last lines
    /// come before anything said about its exit.
    ///
    /// The pipes stay in the list (the poll in progress holds their indices); one at its end
    /// reads as ended again on the next poll, and is removed then.
    fn drain_lane(&mut self, lane: usize, output: &mut Output) {
        for p in self.pipes.iter_mut().filter(|p| p.lane == lane) {
            // Bounded: a child of the worker may still be writing to the same pipe.
            for _ in 0..64 {
                if Self::read_some(&mut self.buf, p, output) != PipeState::More {
                    break;
                }
            }
        }
    }

    /// Messages read while the launcher waited for the rendezvous.
    fn replay_backlog(&mut self, output: &mut Output) {
        let Role::Launcher(remotes) = &mut self.role else {
            return;
        };
        let backlogs: Vec<(usize, Vec<Up>)> = remotes
            .iter_mut()
            .enumerate()
            .map(|(h, r)| (h, std::mem::take(&mut r.backlog)))
            .collect();
        for (h, messages) in backlogs {
            for m in messages {
                self.on_remote(h, m, output);
            }
            self.check_session_end(h, output);
        }
    }

    /// The launcher's commands, in an agent.
    fn read_upstream(&mut self, output: &mut Output) {
        let Role::Agent(up) = &mut self.role else {
            return;
        };
        let Some(fd) = &up.fd else { return };
        let mut lines = Vec::new();
        let mut ended = false;
        match nix::unistd::read(fd, &mut self.buf) {
            Ok(0) => ended = true,
            Ok(n) => {
                up.last_heard = Instant::now();
                up.split
                    .feed(&self.buf[..n], &mut |l| lines.push(l.to_vec()));
            }
            Err(Errno::EAGAIN | Errno::EINTR) => {}
            Err(_) => ended = true,
        }
        if ended {
            up.fd = None;
        }
        for line in lines {
            match Down::parse(&String::from_utf8_lossy(&line)) {
                Ok(Down::Heartbeat) => {}
                Ok(Down::Signal(s)) => {
                    if s == Signal::SIGKILL {
                        self.kill_now();
                    } else {
                        self.stop(s);
                    }
                }
                Err(why) => output.message(&format!("atlasboost agent: ignoring {why}")),
            }
        }
        if ended {
            self.upstream_lost("the launcher's connection closed", output);
        }
    }

    /// The launcher is gone: stop every worker, quickly.
    fn upstream_lost(&mut self, why: &str, output: &mut Output) {
        let Role::Agent(up) = &mut self.role else {
            return;
        };
        if up.lost {
            return;
        }
        up.lost = true;
        if self.running.iter().all(|r| r.ended.is_some()) {
            return;
        }
        // Said as a failure too, so that a launcher that comes back knows why its workers
        // ended (rather than blaming the first one to die of the SIGTERM).
        output.send(&Up::Failed {
            code: ExitCodes::FAILURE,
            message: format!("{why}; the agent stopped its workers"),
        });
        output.message(&format!(
            "atlasboost agent: {why}; stopping the workers (SIGKILL in {:.0?})",
            LAUNCHER_LOST_GRACE
        ));
        self.grace = self.grace.min(LAUNCHER_LOST_GRACE);
        self.stop(Signal::SIGTERM);
    }

    fn read_remote(&mut self, h: usize, output: &mut Output) {
        let Role::Launcher(remotes) = &mut self.role else {
            return;
        };
        match remotes[h].read_out(&mut self.buf) {
            Ok(messages) => {
                for m in messages.into_iter().flatten() {
                    self.on_remote(h, m, output);
                }
                // The read may have met the end of the session, with or without data.
                self.check_session_end(h, output);
            }
            Err(why) => {
                let why = format!("its agent sent something that is not the protocol: {why}");
                self.host_lost(h, why, output);
            }
        }
    }

    /// A session whose output has ended before its agent said it was done: the host is lost.
    fn check_session_end(&mut self, h: usize, output: &mut Output) {
        let Role::Launcher(remotes) = &self.role else {
            return;
        };
        let r = &remotes[h];
        if r.out.is_none() && !r.done && r.lost.is_none() {
            let why = format!(
                "its ssh session ended before its workers did; ssh said: {}",
                r.err_tail()
            );
            self.host_lost(h, why, output);
        }
    }

    fn read_remote_err(&mut self, h: usize, output: &mut Output) {
        let Role::Launcher(remotes) = &mut self.role else {
            return;
        };
        if let Some(lines) = remotes[h].read_err(&mut self.buf) {
            let host = remotes[h].host.clone();
            for l in lines {
                output.message(&format!("atlasboost: host {host}: {l}"));
            }
        }
    }

    fn on_remote(&mut self, h: usize, message: Up, output: &mut Output) {
        let host = match &self.role {
            Role::Launcher(remotes) => remotes[h].host.clone(),
            Role::Agent(_) => return,
        };
        match message {
            Up::Heartbeat | Up::Ready => {}
            Up::Line { rank, stream, line } => {
                if let Some(lane) = self.lane_of(rank, &host) {
                    output.line(lane, stream, &line);
                }
            }
            Up::Exited { rank, ending } => {
                if let Some(lane) = self.lane_of(rank, &host) {
                    self.worker_ended(lane, ending, output);
                }
            }
            Up::Failed { code, message } => {
                if let Role::Launcher(remotes) = &mut self.role {
                    remotes[h].done = true;
                }
                self.fail_host(h, message, code, output);
            }
            Up::Done => {
                if let Role::Launcher(remotes) = &mut self.role {
                    remotes[h].done = true;
                }
            }
        }
    }

    /// The lane of a rank that `host` reports on (never another host's rank).
    fn lane_of(&self, rank: u32, host: &str) -> Option<usize> {
        self.workers
            .binary_search_by_key(&rank, |w| w.rank)
            .ok()
            .filter(|&i| !self.workers[i].local && self.workers[i].host == host)
    }

    /// A host is lost: its workers' fate is unknown, and the job fails.
    fn host_lost(&mut self, h: usize, why: String, output: &mut Output) {
        if let Role::Launcher(remotes) = &mut self.role {
            if remotes[h].lost.is_some() || remotes[h].done {
                return;
            }
            remotes[h].lost = Some(why.clone());
            remotes[h].hang_up();
        }
        self.fail_host(h, why, ExitCodes::FAILURE, output);
    }

    fn fail_host(&mut self, h: usize, why: String, code: u8, output: &mut Output) {
        let Role::Launcher(remotes) = &self.role else {
            return;
        };
        let host = remotes[h].host.clone();
        let now = Instant::now();
        for (w, r) in self.workers.iter().zip(&mut self.running) {
            if !w.local && w.host == host && r.ended.is_none() {
                r.ended = Some((now, Ending::Lost));
            }
        }
        if self.first_failure.is_some() || self.host_failure.is_some() || self.interrupted.is_some()
        {
            return;
        }
        let live = self.running.iter().filter(|r| r.ended.is_none()).count();
        if live > 0 {
            output.message(&format!(
                "atlasboost: host {host} failed: {why}; stopping the other {live} worker{}",
                if live == 1 { "" } else { "s" }
            ));
        }
        self.host_failure = Some(HostFailure {
            host,
            message: why,
            code,
        });
        self.stop(Signal::SIGTERM);
    }

    fn on_signal(&mut self, s: Signal, output: &mut Output) {
        match s {
            Signal::SIGCHLD => self.reap(output),
            // An agent takes orders from its launcher; a signal from elsewhere (sshd's SIGHUP
            // when the session ends) means the launcher is gone.
            _ if self.is_agent() => {
                self.upstream_lost(&format!("got {}", s.as_str()), output);
            }
            _ if self.interrupted.is_some()
                || self.first_failure.is_some()
                || self.host_failure.is_some() =>
            {
                if self.stopping.is_some_and(|(_, killed)| !killed) {
                    output.message(&format!(
                        "atlasboost: got {} while stopping the workers; killing them now",
                        s.as_str()
                    ));
                    self.kill_now();
                }
            }
            _ => {
                let live = self.running.iter().filter(|r| r.ended.is_none()).count();
                output.message(&format!(
                    "atlasboost: got {}; passing it on to {live} worker{} \
                     (SIGKILL in {:.0?}; {} again to kill now)",
                    s.as_str(),
                    if live == 1 { "" } else { "s" },
                    self.plan.grace,
                    s.as_str()
                ));
                self.interrupted = Some(s);
                self.stop(s);
                // What the workers leave behind is stopped as soon as they have all exited.
                self.leftovers_stopped = false;
            }
        }
    }

    /// Collects every child that has exited (workers, and their orphans: the launcher is a
    /// subreaper).
    fn reap(&mut self, output: &mut Output) {
        loop {
            let status = match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(_) => {
                    // A group whose last process was just reaped may have its id reused from
                    // now on: mark it gone (and tell the lifeline) before anything signals it.
                    self.check_groups();
                    return;
                }
                Ok(s) => s,
            };
            let (pid, ending) = match status {
                WaitStatus::Exited(pid, code) => (pid, Ending::Exited(code)),
                WaitStatus::Signaled(pid, sig, _) => (pid, Ending::Signaled(sig)),
                _ => continue,
            };
            if pid.as_raw() as u32 == self.lifeline.pid() {
                output.message(
                    "atlasboost: warning: the lifeline process exited early; if the launcher \
                     is killed now, workers' children may survive it",
                );
                continue;
            }
            if let Role::Launcher(remotes) = &mut self.role
                && let Some(r) = remotes.iter_mut().find(|r| r.pid() == pid.as_raw() as u32)
            {
                r.reaped = true;
                continue;
            }
            let Some(i) = self.running.iter().position(|r| r.pid == Some(pid)) else {
                continue;
            };
            // Its group may be empty now, its id free for reuse: find out before anything
            // (the stop a failure starts) signals it.
            if killpg(pid, None) == Err(Errno::ESRCH) {
                self.running[i].group_gone = true;
                self.lifeline.forget(pid.as_raw());
            }
            self.worker_ended(i, ending, output);
        }
    }

    /// A worker ended: an agent reports it; the launcher fails the job if it failed first.
    fn worker_ended(&mut self, i: usize, ending: Ending, output: &mut Output) {
        if self.running[i].ended.is_some() {
            return;
        }
        self.running[i].ended = Some((Instant::now(), ending));
        if self.running[i].pid.is_some() {
            self.drain_lane(i, output);
        }
        if self.is_agent() {
            output.send(&Up::Exited {
                rank: self.workers[i].rank,
                ending,
            });
            return;
        }
        if ending.failed()
            && self.first_failure.is_none()
            && self.host_failure.is_none()
            && self.interrupted.is_none()
        {
            self.first_failure = Some(i);
            let w = &self.workers[i];
            let live = self.running.iter().filter(|r| r.ended.is_none()).count();
            output.message(&format!(
                "atlasboost: rank {} (host {}, device {}) failed ({}); stopping the other \
                 {live} worker{}",
                w.rank,
                w.host,
                w.device,
                ending.describe(),
                if live == 1 { "" } else { "s" }
            ));
            self.stop(Signal::SIGTERM);
        }
    }

    /// Sends `signal` to every worker (local groups, remote agents), and starts the grace time.
    fn stop(&mut self, signal: Signal) {
        if self.stopping.is_none() {
            self.stopping = Some((Instant::now(), false));
        }
        self.signal_groups(signal);
        self.signal_remotes(signal);
        if signal == Signal::SIGKILL {
            self.kill_now();
        }
    }

    fn kill_now(&mut self) {
        self.signal_groups(Signal::SIGKILL);
        self.signal_remotes(Signal::SIGKILL);
        signal_orphans(&self.own_children(), Signal::SIGKILL);
        self.stopping = Some((self.stopping.map_or(Instant::now(), |s| s.0), true));
        self.drain_until = Some(Instant::now() + DRAIN_AFTER_KILL);
    }

    /// SIGKILL once the grace time is over.
    fn escalate(&mut self) {
        if let Some((since, false)) = self.stopping
            && since.elapsed() >= self.grace
        {
            self.kill_now();
        }
    }

    fn signal_remotes(&mut self, signal: Signal) {
        if let Role::Launcher(remotes) = &mut self.role {
            for r in remotes.iter_mut().filter(|r| !r.done && r.lost.is_none()) {
                r.send(Down::Signal(signal));
            }
        }
    }

    fn signal_groups(&mut self, signal: Signal) {
        for r in &mut self.running {
            if let Some(pid) = r.pid
                && !r.group_gone
                && killpg(pid, signal) == Err(Errno::ESRCH)
            {
                r.group_gone = true;
                self.lifeline.forget(pid.as_raw());
            }
        }
    }

    /// Marks the groups with no process left.
    fn check_groups(&mut self) {
        for r in &mut self.running {
            if let Some(pid) = r.pid
                && !r.group_gone
                && r.ended.is_some()
                && killpg(pid, None) == Err(Errno::ESRCH)
            {
                r.group_gone = true;
                self.lifeline.forget(pid.as_raw());
            }
        }
    }

    /// After a failed start: wait (bounded) for the workers already started to die.
    fn finish_quietly(&mut self, signals: &Signals, output: &mut Output) {
        let until = Instant::now() + DRAIN_AFTER_KILL;
        while Instant::now() < until
            && self
                .running
                .iter()
                .any(|r| r.pid.is_some() && r.ended.is_none())
        {
            self.poll_once(signals, output, PollTimeout::from(50u8));
        }
        self.check_groups();
    }

    fn result(&self, output: &Output) -> JobResult {
        let workers: Vec<WorkerResult> = self
            .workers
            .iter()
            .zip(&self.running)
            .enumerate()
            .map(|(lane, (w, r))| WorkerResult {
                rank: w.rank,
                host: w.host.clone(),
                device: w.device,
                ending: r.ended.map(|(_, e)| e),
                run_time: r
                    .ended
                    .map_or_else(|| r.started.elapsed(), |(t, _)| t - r.started),
                stopped: Some(lane) != self.first_failure
                    && matches!((r.ended, self.stopping), (Some((t, _)), Some((since, _))) if t >= since),
                tail: output.tail(lane),
            })
            .collect();
        let exit_code = match (self.interrupted, &self.host_failure, self.first_failure) {
            (Some(s), _, _) => 128u8.wrapping_add(s as u8),
            (None, Some(h), _) => h.code,
            (None, None, Some(i)) => workers[i].ending.map_or(ExitCodes::FAILURE, Ending::code),
            (None, None, None) => ExitCodes::SUCCESS,
        };
        JobResult {
            workers,
            first_failure: self.first_failure,
            host_failure: self.host_failure.clone(),
            interrupted: self.interrupted,
            exit_code,
        }
    }
}

/// Processes whose parent is the launcher, other than `own` (the lifeline, ssh sessions):
/// orphans of the workers' children, since the launcher is their subreaper. Called once every
/// worker has been reaped.
fn orphans(own: &[u32]) -> Vec<Pid> {
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| !own.contains(&pid) && parent_of(pid) == Some(me))
        .map(|pid| Pid::from_raw(pid as i32))
        .collect()
}

/// The parent of `pid`, from `/proc/<pid>/stat` (the field after the parenthesised name).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

/// Signals the orphans (not the workers: they are signalled through their groups).
fn signal_orphans(own: &[u32], signal: Signal) {
    for pid in orphans(own) {
        let _ = nix::sys::signal::kill(pid, signal);
    }
}
