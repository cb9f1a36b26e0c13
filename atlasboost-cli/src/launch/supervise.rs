//! Starting the workers and watching them until the job ends (SPEC §7, §8).
//!
//! One thread does everything: it polls the workers' pipes and a signalfd (SIGCHLD, SIGINT,
//! SIGTERM, SIGHUP), so a worker's exit, a Ctrl-C and a line of output are all handled in the
//! order they happen, without locks. Workers run in process groups of their own; stopping one
//! means signalling its group (its own children included), SIGTERM first, SIGKILL after the
//! grace time. Nothing is ever signalled by name.

use std::collections::HashSet;
use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal, killpg};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::unistd::Pid;

mod keeper;
mod mpirun;
mod mpirun_state;
pub mod policy;
mod vfork;

pub use self::keeper::Keeper;
pub use self::mpirun::{MpirunPlan, run_mpirun};
use self::mpirun_state::Mpirun;
use self::policy::{SignalAction, SignalState};
pub use super::channel::Ending;
use super::channel::Stream;
use super::channel::{Down, HEARTBEAT, Tree, Up, WorkerSignal};
use super::lifeline::{Lifeline, ORIGINAL_FD_LIMIT};
use super::monitor::{self, CpuClock, HostSample, Metrics, MonitorPlan, RankState};
use super::output::{DrainFor, LineSplitter, Output, TAIL_LINE_BYTES};
use super::plan::ranks_named;
use super::rank_files::RankFiles;
use super::remote::{Remote, is_below, top_of};
use super::status::{self, HostLine};
use crate::error::CliError;
use crate::exit::ExitCodes;

/// The signals the launcher handles itself, through a signalfd. SIGTSTP (Ctrl-Z) is not
/// among those [`Signals::pending`] returns: while the workers run it asks the supervisor to
/// stop the launcher ([`Signals::take_stop`]), after telling its hosts; before and after, it
/// stops the launcher at once, as it would without the signalfd.
const HANDLED: [Signal; 5] = [
    Signal::SIGCHLD,
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGTSTP,
];

/// How long the output of stopped workers is still read after SIGKILL (a process outside
/// their groups may hold their pipes open).
const DRAIN_AFTER_KILL: Duration = Duration::from_secs(2);

/// How long what the workers left must outlast them, during a stop, before the wait for it is
/// said: what the stop's SIGTERM ends at once is not worth a line.
const LEFTOVER_NOTE_AFTER: Duration = Duration::from_millis(500);

/// Bytes waiting for the console beyond which the workers' output is no longer read until it
/// takes some.
const HOLD_BACK: usize = 1 << 20;

/// Whether the console holds the workers' output back (see [`HOLD_BACK`]).
fn holding_back(output: &Output) -> bool {
    output.backlog() >= HOLD_BACK
}

/// How often the workers' progress (lines, heartbeats) is looked at.
const WATCH_EVERY: Duration = Duration::from_millis(250);

/// How long the launcher waits for the stacks of stuck workers on other hosts: at least this,
/// and [`DUMP_PER_RANK`] for each stuck rank of the host with the most (an agent takes them one
/// after another).
const REMOTE_DUMP_LIMIT: Duration = Duration::from_secs(15);

/// The launcher's allowance for one rank's stacks on another host (py-spy's limit, 3 s, and
/// the way back).
const DUMP_PER_RANK: Duration = Duration::from_secs(5);

/// The most of a stuck worker's stacks an agent sends up.
const MAX_STACKS: usize = 256 * 1024;

/// How often the status block is redrawn (its clock, ranks that ended).
const STATUS_EVERY: Duration = Duration::from_secs(1);

/// How often `--metrics` is published between two samples of the hosts: the ranks' own values
/// (up, lines, seconds since the last line) are the launcher's, and a scrape should not read
/// them a whole `--monitor-interval` old.
const METRICS_REFRESH: Duration = Duration::from_secs(1);

/// The exit code of a job that hung (as `timeout` uses).
pub const HANG_EXIT: u8 = 124;

/// How long the launcher waits for srun's word that Slurm cancelled the step, once an agent's
/// connection has ended.
const SLURM_CANCEL_WAIT: Duration = Duration::from_secs(3);

/// How long an agent of the Slurm step that hears of a worker's end waits for a signal of its
/// own from Slurm, in milliseconds (see `Supervisor::signals_in_order`).
const SLURM_SIGNAL_WAIT_MS: u8 = 100;

/// How long a worker's SIGKILL under a Slurm step waits for srun to say the step was
/// cancelled, before it counts as the worker's own failure.
const SLURM_KILLED_WORKER_WAIT: Duration = Duration::from_secs(1);

/// How long an agent whose launcher is gone gives its workers between SIGTERM and SIGKILL, so
/// that they are gone within 5 s of the launcher.
const LAUNCHER_LOST_GRACE: Duration = Duration::from_secs(1);

/// The launcher's signals, blocked and readable from a descriptor. Create it before any
/// thread starts, so that every thread inherits the blocked mask.
#[derive(Debug)]
pub struct Signals {
    fd: SignalFd,
    /// A SIGTSTP came (Ctrl-Z) while the supervisor runs, not acted on yet.
    stop_asked: std::cell::Cell<bool>,
    /// The supervisor runs: it acts on a SIGTSTP itself.
    supervising: std::cell::Cell<bool>,
    /// Who sent each signal of the last [`Signals::pending`] (SIGCHLD aside), in its order:
    /// the process id the kernel gives (0 from the kernel itself).
    senders: std::cell::RefCell<Vec<(Signal, u32)>>,
}

impl Signals {
    /// Blocks the handled signals in this thread (and the threads it starts) and opens a
    /// signalfd for them.
    ///
    /// # Errors
    ///
    /// [`CliError::NotAlone`] beside other threads; [`CliError::System`] if the mask or the
    /// signalfd cannot be set up.
    pub fn block() -> Result<Signals, CliError> {
        // Blocking is per thread: another thread of the process (a program that embeds the
        // launcher's library) would take the process's SIGCHLD and SIGINT, and the launcher
        // would wait for ever.
        let threads = std::fs::read_dir("/proc/self/task").map_or(1, |d| d.count());
        if threads > 1 {
            return Err(CliError::NotAlone { threads });
        }
        // An ignored SIGCHLD, inherited across exec from a parent that set it (Python's
        // `signal(SIGCHLD, SIG_IGN)`), would make the kernel reap the workers unseen. The other
        // signals keep their inherited disposition: `nohup` ignoring SIGHUP is respected.
        // SAFETY: the default disposition installs no handler code.
        unsafe { nix::sys::signal::signal(Signal::SIGCHLD, nix::sys::signal::SigHandler::SigDfl) }
            .map_err(|e| CliError::system("reset SIGCHLD")(e.into()))?;
        // An ignored one (`nohup`'s SIGHUP, SIGINT in a script's background job) stays
        // ignored: blocked, it would still be queued and read from the signalfd.
        let mut set = SigSet::empty();
        for s in HANDLED
            .into_iter()
            .filter(|&s| s == Signal::SIGCHLD || !ignored(s))
        {
            set.add(s);
        }
        set.thread_block()
            .map_err(|e| CliError::system("block signals")(e.into()))?;
        let fd = SignalFd::with_flags(&set, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
            .map_err(|e| CliError::system("open a signalfd")(e.into()))?;
        Ok(Signals {
            fd,
            stop_asked: std::cell::Cell::new(false),
            supervising: std::cell::Cell::new(false),
            senders: std::cell::RefCell::new(Vec::new()),
        })
    }

    /// Runs `work`, which may block for long before anything of the job has started (a
    /// hostfile on a hung mount, the driver's retries, a slow name service), so that a SIGINT,
    /// SIGTERM or SIGHUP meanwhile still ends the launcher at once: it dies of the signal, as
    /// if atlasboost did not handle signals (an ignored one, `nohup`'s SIGHUP, stays ignored).
    /// There is nothing to stop yet. `doing` says what it was doing (`probing this machine's
    /// devices`).
    ///
    /// A thread watches a signalfd of its own for the three; the handled signals stay blocked
    /// in every thread, as [`Signals::block`] needs.
    pub fn exit_on_signal_during<T>(&self, doing: &str, work: impl FnOnce() -> T) -> T {
        let mut set = SigSet::empty();
        for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
            set.add(s);
        }
        let (Ok(watched), Ok((done_read, done_write))) = (
            SignalFd::with_flags(&set, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC),
            nix::unistd::pipe2(OFlag::O_CLOEXEC),
        ) else {
            // Without them, the signal is heard once the work is done, as before.
            return work();
        };
        let note = format!("while {doing}");
        let watcher = std::thread::Builder::new()
            .name("ab-signals".into())
            .spawn(move || {
                let mut fds = [
                    PollFd::new(watched.as_fd(), PollFlags::POLLIN),
                    PollFd::new(done_read.as_fd(), PollFlags::POLLIN),
                ];
                loop {
                    match poll(&mut fds, PollTimeout::NONE) {
                        Err(Errno::EINTR) => continue,
                        Err(_) => return,
                        Ok(_) => {}
                    }
                    if fds[1].revents().is_some_and(|r| !r.is_empty()) {
                        return;
                    }
                    if let Ok(Some(info)) = watched.read_signal()
                        && let Ok(signal) = Signal::try_from(info.ssi_signo as i32)
                    {
                        let line = format!(
                            "atlasboost: got {} {note}, before anything started; exiting\n",
                            signal.as_str()
                        );
                        // No lock of the main thread's is taken: it may hold one, blocked. A
                        // stderr that takes nothing now is not waited for: the line is short
                        // (one write of it does not block once there is room).
                        let stderr = std::io::stderr();
                        let mut room = [PollFd::new(stderr.as_fd(), PollFlags::POLLOUT)];
                        if poll(&mut room, PollTimeout::from(100u8)).is_ok_and(|n| n > 0) {
                            let _ = nix::unistd::write(stderr, line.as_bytes());
                        }
                        die_of(signal);
                    }
                }
            });
        let result = work();
        let _ = nix::unistd::write(&done_write, b"x");
        if let Ok(watcher) = watcher {
            // Until it returns, a signal it took still ends the process here.
            let _ = watcher.join();
        }
        result
    }

    /// Lets SIGINT, SIGTERM and SIGHUP act as they would without atlasboost (their inherited
    /// disposition), once nothing of the job is left to stop: what the launcher still writes
    /// (the summary, to a console that may take nothing) must not make it deaf to them.
    pub fn release(&self) {
        // One that came after the job's end is not acted on: the job has ended already.
        let _ = self.pending();
        let mut set = SigSet::empty();
        for s in [
            Signal::SIGINT,
            Signal::SIGTERM,
            Signal::SIGHUP,
            Signal::SIGTSTP,
        ] {
            set.add(s);
        }
        let _ = set.thread_unblock();
    }

    /// The signals received since the last call, in order; a SIGTSTP among them is kept for
    /// [`Signals::take_stop`] instead.
    pub fn pending(&self) -> Vec<Signal> {
        let mut got = Vec::new();
        let mut senders = self.senders.borrow_mut();
        senders.clear();
        while let Ok(Some(info)) = self.fd.read_signal() {
            match Signal::try_from(info.ssi_signo as i32) {
                Ok(Signal::SIGTSTP) if self.supervising.get() => self.stop_asked.set(true),
                // Nothing to tell anyone first: stop now, as the signal's default would.
                Ok(Signal::SIGTSTP) => {
                    let _ = nix::sys::signal::raise(Signal::SIGSTOP);
                }
                Ok(Signal::SIGCHLD) => got.push(Signal::SIGCHLD),
                Ok(s) => {
                    senders.push((s, info.ssi_pid));
                    got.push(s);
                }
                Err(_) => {}
            }
        }
        got
    }

    /// Who sent `signal`, as the last [`Signals::pending`] read it (the first such one).
    pub fn sender_of(&self, signal: Signal) -> Option<u32> {
        self.senders
            .borrow()
            .iter()
            .find(|(s, _)| *s == signal)
            .map(|(_, pid)| *pid)
    }

    /// Whether a SIGTSTP (Ctrl-Z) came since the last call.
    pub fn take_stop(&self) -> bool {
        self.stop_asked.replace(false)
    }

    fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// What a relay says when `signal` reaches it from `from` (its parent is mpirun, or Open MPI's
/// daemon on another host): mpirun is stopping the ranks. The launcher names the rank.
fn relay_signalled(signal: Signal, from: Option<u32>) -> String {
    let signal = signal.as_str();
    match from.and_then(|pid| i32::try_from(pid).ok()) {
        Some(pid) if from_parent(from) => format!(
            "atlasboost: its relay got {signal} from mpirun's side (its parent, pid {pid}), as \
             the other ranks' of this host did: mpirun is stopping its ranks, as it does when \
             it is signalled itself or ends the job on its own"
        ),
        // Not mpirun: a batch system signalling every process of the job, a user's kill.
        who => format!(
            "atlasboost: its relay got {signal} from {}, not from mpirun (nor from atlasboost, \
             which asks over its connection): stopping its worker",
            match who {
                Some(pid) if pid > 0 => format!("pid {pid}"),
                _ => "the kernel or another pid namespace".to_string(),
            }
        ),
    }
}

/// A relay's parent when it started: mpirun, or Open MPI's daemon on another host
/// ([`note_relay_parent`]).
static RELAY_PARENT: std::sync::OnceLock<i32> = std::sync::OnceLock::new();

/// Notes this process's parent as mpirun's side, first thing in a relay: a relay whose parent
/// died is re-parented (to the launcher, a subreaper, or to init), and their signals are not
/// mpirun's.
pub fn note_relay_parent() {
    let _ = RELAY_PARENT.set(nix::unistd::getppid().as_raw());
}

/// Whether a signal sent by `from` came from mpirun's side: the relay's parent when it started.
/// (A sender in another pid namespace shows as pid 0.)
fn from_parent(from: Option<u32>) -> bool {
    let sender = from.and_then(|pid| i32::try_from(pid).ok());
    sender.is_some_and(|pid| pid > 0 && Some(&pid) == RELAY_PARENT.get())
}

/// Whether `signal` is ignored in this process (`nohup`'s SIGHUP, a shell's background job's
/// SIGINT).
fn ignored(signal: Signal) -> bool {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, sigaction};
    let keep = SigAction::new(SigHandler::SigIgn, SaFlags::empty(), SigSet::empty());
    // SAFETY: reads the disposition by setting one and putting the old one back; neither
    // runs handler code.
    match unsafe { sigaction(signal, &keep) } {
        Ok(old) => {
            let _ = unsafe { sigaction(signal, &old) };
            old.handler() == SigHandler::SigIgn
        }
        Err(_) => false,
    }
}

/// Ends the process by `signal`'s default action, from this thread: no exit handler runs
/// (another thread may hold the dynamic loader's or the driver's locks, which `exit` would
/// wait for).
fn die_of(signal: Signal) -> ! {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, sigaction};
    let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    // SAFETY: the default disposition installs no handler code.
    let _ = unsafe { sigaction(signal, &default) };
    let mut set = SigSet::empty();
    set.add(signal);
    let _ = set.thread_unblock();
    let _ = nix::sys::signal::raise(signal);
    // Not reached: the signal's default action ends the process.
    std::process::abort()
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
    /// `--bind-cores`: the CPUs it may run on.
    pub cpus: Option<Vec<usize>>,
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
    /// `--host-timeout`: a peer's silence for this long is its loss (the launcher's agents and
    /// relays; an agent's launcher and child agents).
    pub lost_after: Duration,
    /// The workers' heartbeat, error and stack files (none for relays).
    pub files: Option<RankFiles>,
    /// Whether heartbeats are read and reported (the launcher watches for hangs).
    pub watch: bool,
    /// The launcher's hang watchdog.
    pub hang: Option<HangWatch>,
    /// Whether the workers run the PyTorch framework (torch's error file variable).
    pub pytorch: bool,
    /// Monitoring (SPEC §13): what this supervisor samples, and how often.
    pub monitor: Option<MonitorPlan>,
    /// The launcher's own children besides workers and sessions (the `srun` of the agents'
    /// step): never taken for the workers' orphans.
    pub helpers: Vec<u32>,
    /// The launcher's: where the samples and ranks' states are published.
    pub metrics: Option<MetricsPlan>,
    /// Variables of this process the workers do not inherit (an agent of the Slurm step: the
    /// step's per-task ones, which describe the agent).
    pub unset_env: Vec<OsString>,
}

/// What `--metrics` shows beside the samples.
#[derive(Debug, Clone)]
pub struct MetricsPlan {
    /// The server.
    pub server: std::sync::Arc<Metrics>,
    /// The job id and the attempt, for the labels.
    pub job: String,
    /// The attempt under way.
    pub attempt: u32,
    /// The chip of each (host, physical id), for `model_name`.
    pub chips: std::collections::HashMap<(String, u32), String>,
    /// The physical id of each rank's device.
    pub physical: std::collections::HashMap<u32, u32>,
}

/// `--hang-timeout` and `--hang-dump`.
#[derive(Debug, Clone)]
pub struct HangWatch {
    /// How long a rank may show no progress.
    pub timeout: Duration,
    /// Take stuck ranks' stacks first.
    pub dump: bool,
    /// Where stack dumps are saved.
    pub dump_dir: PathBuf,
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
    /// Under `--mpi`, mpirun stopped it (its relay said mpirun's side signalled it): even an
    /// exit 0 after that is no success of its own.
    pub stopped_by_mpirun: bool,
    /// Its last stderr lines.
    pub tail: Vec<String>,
    /// What it recorded about its failure (`ATLASBOOST_ERROR_FILE`), as written.
    pub recorded: Option<Vec<u8>>,
    /// Why it never ran, when its relay (`run --mpi`) could not start it.
    pub not_run: Option<String>,
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
    /// The host itself is gone (its session ended, its heartbeats stopped): a restart leaves
    /// it out.
    pub lost: bool,
    /// Under `--mpi`, the rank whose relay failed (the host is only where it ran).
    pub relay_rank: Option<u32>,
}

/// The "host" of a [`HostFailure`] that is `run --mpi`'s mpirun itself (no host's name has
/// parentheses).
pub const MPIRUN: &str = "(mpirun)";

/// The "host" of a [`HostFailure`] that is the launcher itself: it did not run for longer
/// than its peers wait (see `Supervisor::held`).
pub const LAUNCHER: &str = "(atlasboost)";

/// How an agent or relay starts the reason it gives when the launcher's heartbeats stopped
/// (the launcher recognises its own silence by it).
const LAUNCHER_SILENT: &str = "no heartbeat from the launcher";

impl HostFailure {
    /// Who failed, for messages: `host 10.0.0.2`, or `mpirun`.
    pub fn who(&self) -> String {
        who_failed(&self.host, self.relay_rank)
    }
}

fn who_failed(host: &str, relay_rank: Option<u32>) -> String {
    match (host, relay_rank) {
        (MPIRUN, _) => "mpirun".to_string(),
        (LAUNCHER, _) => "atlasboost itself".to_string(),
        (host, Some(rank)) => format!("the relay of rank {rank} (host {host})"),
        (host, None) => format!("host {host}"),
    }
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
    /// The first SIGINT, SIGTERM or SIGHUP that came, whether it stopped the job first or came
    /// while a failure already stopped it: either way the user asked for no restart.
    pub signalled: Option<Signal>,
    /// The hang watchdog's report, if it stopped the job first.
    pub hang: Option<String>,
    /// The ranks the hang watchdog found stuck.
    pub hung_ranks: Vec<u32>,
    /// Hosts lost during the job (sessions that ended, heartbeats that stopped), first or not.
    pub lost_hosts: Vec<String>,
    /// When atlasboost began stopping the workers, by the wall clock (the workers' error
    /// records are stamped by it).
    pub stop_began: Option<std::time::SystemTime>,
    /// The launcher's exit code.
    pub exit_code: u8,
    /// An agent's or relay's: it took its launcher for lost (its connection ended, or its
    /// heartbeats stopped).
    pub launcher_lost: bool,
}

/// Who supervises: the launcher (with the sessions of its remote hosts), or a remote agent
/// (which answers to the launcher over its standard streams).
#[derive(Debug)]
pub enum Role {
    /// The launcher; it decides the job's fate.
    Launcher(Vec<Remote>),
    /// A remote agent (or a relay); it reports exits and obeys the launcher's commands.
    Agent(Upstream),
}

/// An agent's line to its launcher: commands in on stdin (frames go out through [`Output`]),
/// and the sessions of the agents it started below it in the launch tree (SPEC §14), whose
/// messages it passes up and to which it passes every command on.
#[derive(Debug)]
pub struct Upstream {
    fd: Option<OwnedFd>,
    split: LineSplitter,
    last_heard: Instant,
    lost: bool,
    /// The agents this one started, with their positions in the tree.
    children: Vec<(u32, Remote)>,
    /// The tree's shape, to check what the children pass up.
    tree: Tree,
    /// Command lines read before the supervisor started.
    queued: Vec<Vec<u8>>,
    /// A relay's signals come from mpirun, its parent, stopping the job: they are passed on to
    /// the worker. An agent's come from elsewhere (sshd's SIGHUP) and mean the launcher is
    /// gone.
    obeys_signals: bool,
    /// Started by Slurm's srun (`--launcher slurm`).
    slurm: bool,
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
            .map_err(CliError::system("use standard input"))?;
        Ok(Upstream::on(fd, false))
    }

    /// A relay's: commands come on its connection to the launcher, and its signals (from
    /// mpirun) are passed on to its worker.
    pub fn relay(connection: OwnedFd) -> Upstream {
        Upstream::on(connection, true)
    }

    /// Another descriptor for the launcher's commands, to hear it after the supervisor.
    ///
    /// # Errors
    ///
    /// [`CliError::Failure`] if the descriptor cannot be duplicated.
    pub fn commands(&self) -> Result<OwnedFd, CliError> {
        self.fd
            .as_ref()
            .ok_or_else(|| CliError::Failure("the launcher's connection is closed".into()))?
            .try_clone()
            .map_err(CliError::system("duplicate the launcher's connection"))
    }

    fn on(fd: OwnedFd, obeys_signals: bool) -> Upstream {
        let _ = fcntl(&fd, FcntlArg::F_SETFL(OFlag::O_NONBLOCK));
        Upstream {
            fd: Some(fd),
            split: LineSplitter::default(),
            last_heard: Instant::now(),
            lost: false,
            children: Vec::new(),
            tree: Tree { size: 0, fanout: 1 },
            queued: Vec::new(),
            obeys_signals,
            slurm: false,
        }
    }

    /// The agent was started by Slurm's srun: a signal comes from Slurm stopping the step
    /// (`scancel`, the time limit), which the launcher is told, with the signal's exit code.
    pub fn under_slurm(mut self, slurm: bool) -> Upstream {
        self.slurm = slurm;
        self
    }

    /// The same line, with the agents this one started below it in `tree`.
    pub fn with_children(mut self, children: Vec<(u32, Remote)>, tree: Tree) -> Upstream {
        self.children = children;
        self.tree = tree;
        self
    }

    /// The descriptor to poll, until the launcher's end closes.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(AsFd::as_fd)
    }

    /// Reads what arrived (never blocks) onto the end of `into`; `false` once the launcher's
    /// end has closed. (The join reads raw: the decision's bytes follow its line.)
    pub fn read_raw(&mut self, into: &mut Vec<u8>, buf: &mut [u8]) -> bool {
        let Some(fd) = self.fd.as_ref() else {
            return false;
        };
        loop {
            match nix::unistd::read(fd, buf) {
                Ok(0) => {
                    self.fd = None;
                    return false;
                }
                Ok(n) => {
                    self.last_heard = Instant::now();
                    into.extend_from_slice(&buf[..n]);
                }
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => return true,
                Err(_) => {
                    self.fd = None;
                    return false;
                }
            }
        }
    }

    /// Bytes read past the decision, for the supervisor: its commands start with them.
    pub fn preload(&mut self, bytes: &[u8]) {
        let queued = &mut self.queued;
        self.split.feed(bytes, &mut |l| queued.push(l.to_vec()));
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

/// How much one read of a pipe or a peer's connection takes at most.
const READ_BUFFER: usize = 1 << 16;

/// A relay's first read buffer (see `Supervisor::buf`).
const FIRST_READ_BUFFER: usize = 1 << 12;

struct Pipe {
    lane: usize,
    stream: Stream,
    fd: OwnedFd,
    split: LineSplitter,
    /// Read to its end by [`Supervisor::drain_lane`]: removed at the end of the poll (which
    /// may not poll it again while the console holds the output back).
    at_end: bool,
}

/// Where a polled descriptor comes from.
#[derive(Clone, Copy)]
enum Source {
    Signals,
    Upstream,
    Pipe(usize),
    RemoteOut(usize),
    RemoteErr(usize),
    /// A listening socket of the relays' door.
    Door,
    /// A relay's connection that has not proved itself yet.
    Knock(usize),
    /// mpirun's stdout or stderr.
    MpirunPipe(usize),
    /// The console, which has bytes waiting for its reader, can take more.
    Console,
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
        if let Some(files) = &plan.files {
            files.reset(w.rank);
        }
        match spawn(plan, w, lifeline.cgroup_procs()) {
            Ok((pid, out, err)) => {
                lifeline.watch(pid.as_raw());
                if lifeline.guarded_above() {
                    // With the first heartbeat, which the supervisor sends before it first
                    // waits (or the worker's exit, if that comes first).
                    output.queue(&Up::Group {
                        rank: w.rank,
                        group: pid.as_raw(),
                    });
                }
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
                        at_end: false,
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
    if !matches!(role, Role::Agent(_)) {
        for (w, r) in workers.iter().zip(&running) {
            // A remote host's workers were started by its agent, which said it was ready; a
            // local worker that never started has no start to tell.
            if w.local && r.pid.is_none() {
                continue;
            }
            output.event(
                "worker_start",
                serde_json::json!({
                    "rank": w.rank,
                    "host": w.host,
                    "device": w.device,
                    "pid": r.pid.map(|p| p.as_raw()),
                }),
            );
        }
    }
    let mut sup = Supervisor::new(plan, workers, running, pipes, lifeline, role);
    // From here on the launcher may be held in its console (the backlog below is the first
    // output).
    sup.start_keeper();
    if let Some(e) = failed {
        sup.stop(Signal::SIGKILL);
        sup.finish_quietly(signals, output);
        return Err(e);
    }
    sup.replay_backlog(output);
    sup.run(signals, output);
    Ok(sup.result(output))
}

/// An agent's or relay's end, after its last frame: waits until the launcher has taken
/// everything, as long as it is heard on `launcher` (its commands; a launcher whose console
/// holds output back reads nothing meanwhile; `lost_after`: `--host-timeout`), or until a
/// signal stops this process.
pub fn send_the_rest(
    output: &mut Output,
    signals: &Signals,
    launcher: BorrowedFd<'_>,
    lost_after: Duration,
) {
    let wait = DrainFor::WhileHeard(launcher, lost_after);
    output.drain_console(signals.fd(), wait, &mut || {
        signals.pending().iter().any(|s| *s != Signal::SIGCHLD)
    });
}

/// A relay whose worker was stopped, once its last frame is sent: stays until the launcher
/// lets it go (it closes its side once every rank has ended, or is gone), a signal other than
/// SIGCHLD comes from anyone but mpirun's side, or `limit` has passed. (The launcher sends a
/// relay that is done no heartbeats: its silence means nothing now.)
///
/// Why: Open MPI stops its ranks with SIGCONT, SIGTERM and SIGKILL, sleeping
/// `odls_base_sigkill_timeout` between them; a child's exit cuts the sleep to its whole
/// seconds left (none of a 1 s timeout). A relay that exited as soon as its worker did would
/// bring mpirun's SIGKILL down on the ranks still saving a checkpoint. mpirun's own SIGTERM
/// (its stop after the launcher's) is part of that sequence: its SIGKILL ends this wait.
pub fn wait_for_release(signals: &Signals, launcher: BorrowedFd<'_>, limit: Duration) {
    let until = Instant::now() + limit;
    let mut buf = [0u8; 512];
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        let mut fds = [
            PollFd::new(launcher, PollFlags::POLLIN),
            PollFd::new(signals.fd(), PollFlags::POLLIN),
        ];
        match poll(
            &mut fds,
            PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX),
        ) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => return,
        }
        let readable = |fd: &PollFd<'_>| fd.revents().is_some_and(|r| !r.is_empty());
        let (said, signalled) = (readable(&fds[0]), readable(&fds[1]));
        if signalled
            && signals
                .pending()
                .iter()
                .any(|&s| s != Signal::SIGCHLD && !from_parent(signals.sender_of(s)))
        {
            return;
        }
        if said {
            // Nothing is of use now (every worker here has ended): only the end.
            match nix::unistd::read(launcher, &mut buf) {
                Ok(0) => return,
                Ok(_) | Err(Errno::EAGAIN | Errno::EINTR) => {}
                Err(_) => return,
            }
        }
    }
}

/// Starts one worker in a process group of its own (and in the workers' cgroup, whose
/// `cgroup.procs` is `cgroup`, if there is one), stdin closed, output on pipes, dying with
/// this process (`PR_SET_PDEATHSIG`).
fn spawn(
    plan: &RunPlan,
    w: &WorkerPlan,
    cgroup: Option<RawFd>,
) -> io::Result<(Pid, OwnedFd, OwnedFd)> {
    let (program, args) = plan
        .command
        .split_first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no command"))?;
    let cpus = match &w.cpus {
        Some(list) => {
            let mut set = nix::sched::CpuSet::new();
            for &c in list {
                set.set(c).map_err(io::Error::from)?;
            }
            Some(set)
        }
        None => None,
    };
    let files = plan
        .files
        .as_ref()
        .map(|f| f.env(w.rank, plan.pytorch))
        .into_iter()
        .flatten();
    let env = vfork::Environment::new(&plan.unset_env, files.chain(w.env.iter().cloned()))?;
    let started = vfork::spawn(&vfork::Child {
        program,
        args,
        dir: &plan.wdir,
        env,
        cgroup,
        cpus,
        fd_limit: ORIGINAL_FD_LIMIT.get().copied(),
    });
    let (pid, out, err) = started.map_err(|e| {
        // exec says EACCES for a directory: named as what it is. (A bare name is looked up
        // on PATH, where exec skips directories.)
        let path = std::path::Path::new(program);
        match e.kind() {
            io::ErrorKind::PermissionDenied
                if path.components().count() > 1 && plan.wdir.join(path).is_dir() =>
            {
                io::Error::from(io::ErrorKind::IsADirectory)
            }
            _ => e,
        }
    })?;
    for fd in [&out, &err] {
        // Bigger pipes mean fewer, larger reads; non-blocking reads let one poll drain them.
        let _ = fcntl(fd, FcntlArg::F_SETPIPE_SZ(1 << 20));
        let _ = fcntl(fd, FcntlArg::F_SETFL(OFlag::O_NONBLOCK));
    }
    Ok((pid, out, err))
}

/// Whether child `pid` has exited with status 0, without collecting it.
fn exited_cleanly(pid: Pid) -> bool {
    peek_ending(pid) == Some(Ending::Exited(0))
}

/// How child `pid` ended, if it has, without collecting it (`None` while it runs).
fn peek_ending(pid: Pid) -> Option<Ending> {
    use nix::libc;
    let info = peek_child(libc::P_PID, pid.as_raw() as libc::id_t, libc::WEXITED).ok()?;
    // SAFETY: si_pid and si_status are read from what waitid wrote for a child's state change
    // (si_pid stays 0 while the child has not exited, with WNOHANG).
    if unsafe { info.si_pid() } != pid.as_raw() {
        return None;
    }
    // SAFETY: as above.
    let status = unsafe { info.si_status() };
    match info.si_code {
        libc::CLD_EXITED => Some(Ending::Exited(status)),
        libc::CLD_KILLED | libc::CLD_DUMPED => {
            WorkerSignal::from_number(status).map(Ending::Signaled)
        }
        _ => None,
    }
}

/// Reaps one child that has exited (`which`, or any), if any: its pid, and how it ended (`None` for a status
/// that is not an end). By the raw status: nix's `waitpid` reaps a child killed by a
/// real-time signal and then fails to name the signal, and the worker's end would be lost.
fn reap_one(which: Option<Pid>) -> Option<(Pid, Option<Ending>)> {
    use nix::libc;
    let mut status: libc::c_int = 0;
    let which = which.map_or(-1, Pid::as_raw);
    // SAFETY: waitpid only writes the status through the valid pointer it is given.
    let pid = unsafe { libc::waitpid(which, &mut status, libc::WNOHANG) };
    if pid <= 0 {
        // None left (0), no child at all (ECHILD), or EINTR: the next pass looks again.
        return None;
    }
    let ending = if libc::WIFEXITED(status) {
        Some(Ending::Exited(libc::WEXITSTATUS(status)))
    } else if libc::WIFSIGNALED(status) {
        WorkerSignal::from_number(libc::WTERMSIG(status)).map(Ending::Signaled)
    } else {
        None
    };
    Some((Pid::from_raw(pid), ending))
}

/// Sends `signal` to process group `group`, then (but for SIGKILL) SIGCONT: a process stopped
/// by SIGSTOP or SIGTSTP acts on the signal only once continued, and would otherwise wait out
/// the grace for SIGKILL. The first signal's result.
fn signal_group(group: Pid, signal: Signal) -> nix::Result<()> {
    let sent = killpg(group, signal);
    if sent.is_ok() && signal != Signal::SIGKILL {
        let _ = killpg(group, Signal::SIGCONT);
    }
    sent
}

struct Supervisor<'a> {
    plan: &'a RunPlan,
    /// Owned: a relay names its host when it connects.
    workers: Vec<WorkerPlan>,
    running: Vec<Running>,
    pipes: Vec<Pipe>,
    lifeline: &'a mut Lifeline,
    role: Role,
    first_failure: Option<usize>,
    host_failure: Option<HostFailure>,
    interrupted: Option<Signal>,
    /// When the stop began and whether SIGKILL has followed.
    stopping: Option<(Instant, bool)>,
    /// When the stop began by the wall clock, which stamps the workers' error records.
    stop_began: Option<std::time::SystemTime>,
    /// The grace time of the stop in progress (shorter when the launcher is lost).
    grace: Duration,
    /// When the first SIGINT, SIGTERM or SIGHUP came, and which, whatever the stop did with it
    /// (one that comes while a failure already stops the job sets no `interrupted`).
    signalled: Option<(Instant, Signal)>,
    /// The last signal acted on (not SIGCHLD, not an echo) and when it came, to tell one
    /// delivered twice.
    last_signal: Option<(Instant, Signal)>,
    /// What the workers left behind has been sent SIGTERM.
    leftovers_stopped: bool,
    /// The launcher's: the workers' process groups of the relays below it ([`Up::Group`]),
    /// by remote, which its guard stops if it dies, until each is gone or its relay done.
    relay_groups: Vec<(usize, Pid)>,
    /// The wait for what the workers left, to be said if it lasts [`LEFTOVER_NOTE_AFTER`].
    leftover_note: Option<(Instant, String)>,
    /// The orphans sent SIGTERM so far (an orphan is the launcher's child, so its pid is not
    /// reused before the launcher reaps it).
    orphans_termed: HashSet<Pid>,
    drain_until: Option<Instant>,
    next_heartbeat: Instant,
    /// When the loop last looked at heartbeats: a long gap means it was held elsewhere.
    last_round: Instant,
    /// When the loop last sent its peers heartbeats.
    last_beat: Instant,
    /// The launcher's last silence (no heartbeat sent, by its loop or its keeper) longer than
    /// `--host-timeout`, and when it was noticed: the process did not run (SIGSTOP, a
    /// debugger, a starved machine), and a peer that says it lost the launcher then is right.
    held: Option<(Duration, Instant)>,
    /// The launcher's heartbeats while its loop is held (see [`keeper`]).
    keeper: Option<keeper::Keeper>,
    /// What reads go into: [`READ_BUFFER`] bytes, but a relay's, which starts at
    /// [`FIRST_READ_BUFFER`] and doubles when a read of its worker's pipe fills it.
    buf: Vec<u8>,
    /// `run --mpi`: mpirun and the relays' door.
    mpirun: Option<Mpirun>,
    /// Each worker's progress, by lane.
    progress: Vec<Progress>,
    next_watch: Instant,
    /// What each failed worker recorded, by lane.
    recorded: Vec<Option<Vec<u8>>>,
    /// Why a relay could not start its worker, by lane.
    not_run: Vec<Option<String>>,
    /// The hang watchdog's report, once it fired.
    hang: Option<String>,
    /// The ranks it found stuck.
    hung_ranks: Vec<u32>,
    /// The stacks still awaited from other hosts before a hang stops the job.
    dumping: Option<Dumping>,
    /// When the hosts are sampled next.
    next_sample: Instant,
    /// The workers' CPU time at the last sample.
    cpu: CpuClock,
    /// The monitored hosts' device telemetry, read on a thread of its own (`Some(None)`: none
    /// could be started), made at the first sample.
    sampler: Option<Option<monitor::DeviceSampler>>,
    /// The driver calls whose failure telemetry has said: `(host, failure)`.
    failures_said: HashSet<(String, String)>,
    /// The latest sample of every host (the launcher's).
    samples: std::collections::BTreeMap<String, HostSample>,
    /// Each lane's line count at the last publication, and when it last changed.
    printed: Vec<(u64, Instant)>,
    /// When `--metrics` is published next: every [`METRICS_REFRESH`], and at once when a
    /// worker ends (the ranks' own values are the launcher's, known between two samples).
    next_publish: Instant,
    /// When supervision began (the status block's clock).
    began: Instant,
    /// When the status block is redrawn next (every second, on a terminal).
    next_status: Instant,
}

/// When a worker last made progress.
#[derive(Debug, Clone)]
struct Progress {
    /// Lines seen so far.
    lines: u64,
    /// Bytes read so far (a line not ended yet is progress too).
    bytes: u64,
    /// Heartbeats seen so far.
    beats: u64,
    /// The last step a heartbeat gave.
    step: Option<i64>,
    /// The last time either count moved.
    since: Instant,
}

/// A hang being reported: the stacks of stuck workers on other hosts are on their way.
#[derive(Debug)]
struct Dumping {
    report: String,
    waiting: Vec<usize>,
    until: Instant,
}

impl<'a> Supervisor<'a> {
    fn new(
        plan: &'a RunPlan,
        workers: &[WorkerPlan],
        running: Vec<Running>,
        pipes: Vec<Pipe>,
        lifeline: &'a mut Lifeline,
        role: Role,
    ) -> Self {
        // A relay's worker may print nothing: zeroing (and faulting in) 64 KiB it never reads
        // into was a tenth of a relay's time on the launch's path.
        let buf = match &role {
            Role::Agent(up) if up.children.is_empty() && workers.len() == 1 => {
                vec![0; FIRST_READ_BUFFER]
            }
            _ => vec![0; READ_BUFFER],
        };
        Supervisor {
            plan,
            workers: workers.to_vec(),
            running,
            pipes,
            lifeline,
            role,
            first_failure: None,
            host_failure: None,
            interrupted: None,
            stopping: None,
            stop_began: None,
            grace: plan.grace,
            signalled: None,
            last_signal: None,
            leftovers_stopped: false,
            relay_groups: Vec::new(),
            leftover_note: None,
            orphans_termed: HashSet::new(),
            drain_until: None,
            next_heartbeat: Instant::now(),
            last_round: Instant::now(),
            last_beat: Instant::now(),
            held: None,
            keeper: None,
            buf,
            mpirun: None,
            progress: vec![
                Progress {
                    lines: 0,
                    bytes: 0,
                    beats: 0,
                    step: None,
                    since: Instant::now(),
                };
                workers.len()
            ],
            next_watch: Instant::now() + WATCH_EVERY,
            recorded: vec![None; workers.len()],
            not_run: vec![None; workers.len()],
            hang: None,
            hung_ranks: Vec::new(),
            dumping: None,
            next_sample: Instant::now(),
            cpu: CpuClock::default(),
            sampler: None,
            failures_said: HashSet::new(),
            samples: std::collections::BTreeMap::new(),
            printed: vec![(0, Instant::now()); workers.len()],
            next_publish: Instant::now(),
            began: Instant::now(),
            next_status: Instant::now(),
        }
    }

    /// Redraws the status block (a launcher on a terminal): ranks per host, their samples, the
    /// slowest rank's step.
    fn refresh_status(&mut self, output: &mut Output) {
        if self.is_agent() || !output.has_status() {
            return;
        }
        self.next_status = Instant::now() + STATUS_EVERY;
        let mut hosts: Vec<(&str, usize, usize)> = Vec::new();
        for (w, r) in self.workers.iter().zip(&self.running) {
            let alive = usize::from(r.ended.is_none());
            match hosts.iter_mut().find(|(h, _, _)| *h == w.host) {
                Some(h) => {
                    h.1 += alive;
                    h.2 += 1;
                }
                None => hosts.push((&w.host, alive, 1)),
            }
        }
        let lines: Vec<HostLine<'_>> = hosts
            .iter()
            .map(|&(host, alive, ranks)| HostLine {
                host,
                alive,
                ranks,
                sample: self.samples.get(host),
            })
            .collect();
        let slowest = (0..self.workers.len())
            .filter(|&l| self.running[l].ended.is_none())
            .filter_map(|l| self.progress[l].step.map(|s| (s, self.workers[l].rank)))
            .min()
            .map(|(step, rank)| (rank, step));
        let text = status::lines(self.began.elapsed().as_secs(), &lines, slowest);
        output.set_status(&text);
    }

    /// Samples the hosts this supervisor watches when it is time (SPEC §13): an agent sends
    /// its sample up, the launcher keeps it, writes it to `--events` and publishes.
    fn monitor(&mut self, output: &mut Output) {
        let Some(plan) = &self.plan.monitor else {
            return;
        };
        let now = Instant::now();
        if now < self.next_sample {
            return;
        }
        self.next_sample = now + plan.every;
        if self.sampler.is_none() {
            self.sampler = Some(monitor::DeviceSampler::start(&plan.hosts).ok());
        }
        let devices = match &mut self.sampler {
            Some(Some(sampler)) => {
                let (devices, warning) = sampler.sample(&plan.hosts, 2 * plan.every);
                if let Some(w) = warning {
                    output.message(&w);
                }
                devices
            }
            // No thread could be started: read here.
            _ => plan
                .hosts
                .iter()
                .map(|h| h.telemetry.sample(&h.devices))
                .collect(),
        };
        if let Some(w) = monitor::failures_to_say(&plan.hosts, &devices, &mut self.failures_said) {
            output.message(&w);
        }
        for (host, devices) in plan.hosts.iter().zip(devices) {
            let workers: Vec<(u32, i32)> = self
                .workers
                .iter()
                .zip(&self.running)
                .filter(|(w, r)| w.local && w.host == host.host && r.ended.is_none())
                .filter_map(|(w, r)| r.pid.map(|p| (w.rank, p.as_raw())))
                .collect();
            let sample = monitor::sample_host(host, devices, &workers, &mut self.cpu);
            if self.is_agent() {
                output.send(&Up::Telemetry {
                    bytes: monitor::encode(&sample),
                });
            } else {
                self.record_sample(sample, output);
            }
        }
        self.publish(output);
        self.refresh_status(output);
    }

    /// The launcher keeps a host's sample and writes it to `--events`.
    fn record_sample(&mut self, sample: HostSample, output: &mut Output) {
        output.event("telemetry", monitor::sample_json(&sample));
        self.samples.insert(sample.host.clone(), sample);
    }

    /// The launcher publishes the job's state on `--metrics`.
    fn publish(&mut self, output: &Output) {
        let Some(m) = &self.plan.metrics else {
            return;
        };
        let now = Instant::now();
        self.next_publish = now + METRICS_REFRESH;
        let ranks: Vec<RankState> = (0..self.workers.len())
            .map(|lane| {
                let lines = output.line_count(lane);
                let seen = &mut self.printed[lane];
                if lines != seen.0 {
                    *seen = (lines, now);
                }
                let w = &self.workers[lane];
                RankState {
                    rank: w.rank,
                    host: w.host.clone(),
                    device: w.device,
                    physical: m.physical.get(&w.rank).copied(),
                    up: self.running[lane].ended.is_none(),
                    lines,
                    silent_seconds: now.saturating_duration_since(seen.1).as_secs_f64(),
                }
            })
            .collect();
        m.server.publish(monitor::render(
            &m.job,
            m.attempt,
            &self.samples,
            &m.chips,
            &ranks,
        ));
    }

    fn is_agent(&self) -> bool {
        matches!(self.role, Role::Agent(_))
    }

    /// Processes that are the launcher's children but neither workers nor orphans.
    fn not_orphans(&self) -> Vec<u32> {
        let mut own: Vec<u32> = self.lifeline.pid().into_iter().collect();
        own.extend(&self.plan.helpers);
        match &self.role {
            Role::Launcher(remotes) => own.extend(remotes.iter().filter_map(Remote::pid)),
            Role::Agent(up) => own.extend(up.children.iter().filter_map(|(_, c)| c.pid())),
        }
        if let Some(m) = self.mpirun.as_ref().filter(|m| m.ended.is_none()) {
            own.push(m.pid.as_raw() as u32);
        }
        own
    }

    /// Whether every remote host is finished with (done, or lost), and mpirun has ended.
    fn remotes_finished(&self) -> bool {
        let mpirun_ended = self
            .mpirun
            .as_ref()
            .is_none_or(|m| m.settled && m.pipes.is_empty());
        mpirun_ended
            && match &self.role {
                Role::Launcher(remotes) => remotes.iter().all(|r| r.done || r.lost.is_some()),
                // An agent stays until the agents below it are gone (their sessions end with
                // it), unless its own launcher is: then it closes their sessions as it exits.
                Role::Agent(up) => up.lost || up.children.iter().all(|(_, c)| c.out.is_none()),
            }
    }

    fn run(&mut self, signals: &Signals, output: &mut Output) {
        signals.supervising.set(true);
        self.refresh_status(output);
        // The peers' silence counts from here: the join was bounded on its own, and nobody
        // read them since (the launcher may have been held on its console meanwhile).
        let now = Instant::now();
        match &mut self.role {
            Role::Agent(up) => up.last_heard = now,
            Role::Launcher(remotes) => remotes.iter_mut().for_each(|r| r.last_heard = now),
        }
        self.last_round = now;
        self.last_beat = now;
        // Commands that came with the decision, before the workers started.
        if matches!(&self.role, Role::Agent(up) if !up.queued.is_empty()) {
            self.read_upstream(output);
        }
        loop {
            let all_ended = self.running.iter().all(|r| r.ended.is_some());
            if all_ended {
                self.release_relays();
            }
            if all_ended && self.wrap_up(output) && self.remotes_finished() {
                break;
            }
            self.escalate();
            self.heartbeats(output);
            self.watch(output);
            self.monitor(output);
            if self.plan.metrics.is_some() && Instant::now() >= self.next_publish {
                self.publish(output);
            }
            if output.has_status() && Instant::now() >= self.next_status {
                self.refresh_status(output);
            }
            let mut wait = self
                .next_heartbeat
                .saturating_duration_since(Instant::now());
            if self.stopping.is_some() || all_ended {
                wait = wait.min(Duration::from_millis(50));
            }
            let watching = self.plan.watch || self.plan.hang.is_some();
            if watching {
                wait = wait.min(self.next_watch.saturating_duration_since(Instant::now()));
            }
            if self.plan.monitor.is_some() {
                wait = wait.min(self.next_sample.saturating_duration_since(Instant::now()));
            }
            if output.has_status() {
                wait = wait.min(self.next_status.saturating_duration_since(Instant::now()));
            }
            if self.plan.metrics.is_some() {
                wait = wait.min(self.next_publish.saturating_duration_since(Instant::now()));
            }
            let timeout = if self.has_peers()
                || watching
                || self.plan.monitor.is_some()
                || self.plan.metrics.is_some()
                || output.has_status()
            {
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
        // `--metrics` is still served until the next attempt (a restart's delay, 30 s at
        // most) or the launcher's end: it says that no worker runs, and no worker's use.
        for sample in self.samples.values_mut() {
            sample.workers.clear();
        }
        self.publish(output);
        // Every worker is gone: what the console has not taken yet is waited for, but not
        // after a signal (the one that stopped the job, for at most the grace time, or a next
        // one).
        // After a signal, the console gets what is left of the grace time since the stop.
        let wait = match self.signalled {
            Some((at, _)) => DrainFor::AfterSignal(self.grace.saturating_sub(at.elapsed()), at),
            None => DrainFor::AtMost(None),
        };
        let mut came = Vec::new();
        // An agent's or relay's last frames come after this: it waits for its launcher then.
        if !self.is_agent() {
            output.drain_console(signals.fd(), wait, &mut || {
                let got = signals.pending();
                let stops = got.iter().any(|s| *s != Signal::SIGCHLD);
                came.extend(got);
                stops
            });
        }
        // Every worker has ended, but a SIGINT now still ends the job with 130, and no
        // restart follows.
        if let Some(s) = came.into_iter().find(|s| *s != Signal::SIGCHLD)
            && self.interrupted.is_none()
        {
            self.interrupted = Some(s);
        }
        // Every peer is done with (or lost): nobody to keep.
        self.keeper = None;
        output.end_status();
        signals.supervising.set(false);
        if signals.take_stop() {
            let _ = nix::sys::signal::raise(Signal::SIGSTOP);
        }
    }

    /// The launcher's peers keep hearing it while its loop is held (see [`keeper`]).
    fn start_keeper(&mut self) {
        if let Role::Launcher(remotes) = &self.role
            && self.has_peers()
        {
            self.keeper = keeper::Keeper::start(remotes.iter().map(Remote::commands).collect());
        }
    }

    fn has_peers(&self) -> bool {
        match &self.role {
            Role::Launcher(remotes) => !remotes.is_empty() || self.mpirun.is_some(),
            Role::Agent(_) => true,
        }
    }

    /// Once every worker has ended: stops what they left running, and says whether the local
    /// side is finished (groups empty, pipes drained or given up on).
    fn wrap_up(&mut self, output: &mut Output) -> bool {
        self.check_groups();
        let own = self.not_orphans();
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
            // One worker (a relay's, or a job of one): said of it, not of "every worker"
            // (under `run --mpi` the other ranks may still run).
            let one = self.workers.len() == 1;
            let mut what = Vec::new();
            if !left.is_empty() {
                what.push(format!(
                    "the process groups of rank{} {}",
                    if left.len() == 1 { "" } else { "s" },
                    left.join(", ")
                ));
            }
            // Orphans still in a worker's group were counted with it.
            let outside = orphans
                .iter()
                .filter(|&&pid| {
                    nix::unistd::getpgid(Some(pid))
                        .is_ok_and(|group| !self.running.iter().any(|r| r.pid == Some(group)))
                })
                .count();
            if outside > 0 {
                let n = outside;
                what.push(format!(
                    "{n} process{} that left {}",
                    if n == 1 { "" } else { "es" },
                    match (left.is_empty(), one) {
                        (true, true) => "its worker's group",
                        (true, false) => "their workers' groups",
                        (false, true) => "it",
                        (false, false) => "them",
                    }
                ));
            }
            let what = match what.is_empty() {
                true => String::new(),
                false => format!(" ({})", what.join(", and ")),
            };
            let (exited, they) = match one {
                true => ("the worker has exited", "it"),
                false => ("every worker has exited", "they"),
            };
            match self.stopping {
                None => {
                    output.message(&format!(
                        "atlasboost: {exited}; stopping what {they} left running{what}"
                    ));
                    self.begin_stop();
                }
                // While the workers are being stopped anyway, what they left is part of that
                // stop; but a wait for it is said (it may last the whole grace), with when it
                // ends, unless it is being killed already. Said once it has lasted a moment:
                // what the SIGTERM ends at once (a shell's child, a relay's lifeline) is not.
                Some((_, false)) => {
                    self.leftover_note = Some((
                        Instant::now(),
                        format!("atlasboost: {exited}; waiting for what {they} left running{what}"),
                    ));
                }
                Some((_, true)) => {}
            }
            self.signal_groups(Signal::SIGTERM);
        }
        if let Some((since, note)) = &self.leftover_note {
            match self.stopping {
                _ if groups_gone => self.leftover_note = None,
                Some((began, false)) if since.elapsed() >= LEFTOVER_NOTE_AFTER => {
                    let left = self.grace.saturating_sub(began.elapsed());
                    output.message(&format!(
                        "{note} (SIGKILL in {:.0?}; Ctrl-C to kill it now)",
                        Duration::from_secs(left.as_secs_f64().ceil() as u64)
                    ));
                    self.leftover_note = None;
                }
                Some((_, false)) => {}
                _ => self.leftover_note = None,
            }
        }
        // Orphans keep coming as their parents die (a daemon's children are re-parented to the
        // launcher when it exits): each is stopped as it comes, as the first ones were.
        let killed = self.stopping.is_some_and(|(_, killed)| killed);
        if self.leftovers_stopped && !orphans.is_empty() {
            self.signal_orphans(
                &orphans,
                if killed {
                    Signal::SIGKILL
                } else {
                    Signal::SIGTERM
                },
            );
        }
        // Pipes not read while the console holds the output back are not held by anyone.
        let held = holding_back(output);
        if groups_gone && !self.pipes.is_empty() && self.drain_until.is_none() && !held {
            // Every group is empty, yet a pipe is open: a process that left its group
            // (setsid) holds it. Read what comes for a while, not forever.
            self.drain_until = Some(Instant::now() + DRAIN_AFTER_KILL);
        }
        // While the console holds the output back, the pipes are ours not to read, not a
        // stranger's to hold: their last lines (a traceback, for the logs too) are waited for,
        // and the bound on a stranger's counts from when they are read again.
        if held && let Some(until) = &mut self.drain_until {
            *until = (*until).max(Instant::now() + DRAIN_AFTER_KILL);
        }
        let drained = self.pipes.is_empty()
            || (!held && self.drain_until.is_some_and(|t| Instant::now() >= t));
        // After SIGKILL, orphans still coming are waited for up to the drain's bound.
        let orphans_coming =
            !orphans.is_empty() && self.drain_until.is_none_or(|t| Instant::now() < t);
        let finished = drained && !orphans_coming && (groups_gone || self.drain_until.is_some());
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
        self.note_silence();
        let away = now.duration_since(self.last_round) > HEARTBEAT * 2;
        self.last_round = now;
        if let Some(k) = &self.keeper {
            k.round();
        }
        if output.take_stall() || away {
            // Held on our own output (or a status line drawn on it), we could not hear the
            // peers, and the keeper spoke for us: their silence starts afresh.
            self.next_heartbeat = now;
            match &mut self.role {
                Role::Launcher(remotes) => remotes.iter_mut().for_each(|r| r.last_heard = now),
                Role::Agent(up) => up.last_heard = now,
            }
        }
        let due = now >= self.next_heartbeat;
        if due {
            self.next_heartbeat = now + HEARTBEAT;
            self.last_beat = now;
            self.probe_relay_groups(true);
        }
        let mut lost = Vec::new();
        let mut upstream_lost = None;
        let dumping = self.dumping.is_some();
        match &mut self.role {
            Role::Launcher(remotes) => {
                for (h, r) in remotes.iter_mut().enumerate() {
                    if r.done || r.lost.is_some() {
                        continue;
                    }
                    if due {
                        r.send(Down::Heartbeat);
                    }
                    // A host below another is watched first by the agent that started it, which
                    // names it better (and ends its session); the launcher is the backstop.
                    let limit = match r.parent {
                        None => self.plan.lost_after,
                        Some(_) => self.plan.lost_after + HEARTBEAT * 2,
                    };
                    if r.last_heard.elapsed() > limit && !dumping {
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
                // An agent below that went silent (a hung host, a half-open link ssh has not
                // noticed yet) is ended here and reported lost: its session would otherwise
                // keep this agent, and the launcher waiting on it, for ever.
                for (position, child) in up.children.iter_mut() {
                    if child.out.is_some()
                        && !dumping
                        && child.last_heard.elapsed() > self.plan.lost_after
                    {
                        let why = format!(
                            "its agent sent nothing for {:.0?} (heartbeats stopped)",
                            child.last_heard.elapsed()
                        );
                        child.end_session(why.clone());
                        output.send(&Up::Lost {
                            host: *position,
                            said: why,
                        });
                    }
                }
                if !up.lost && output.upstream_closed() {
                    upstream_lost = Some("writing to the launcher failed (its connection is gone)");
                } else if !up.lost
                    && !output.reader_paused()
                    && up.last_heard.elapsed() > self.plan.lost_after
                {
                    upstream_lost = Some(LAUNCHER_SILENT);
                }
            }
        }
        for (h, why) in lost {
            self.host_lost(h, why, output);
        }
        if let Some(why) = upstream_lost {
            self.upstream_lost(why, ExitCodes::FAILURE, output);
        }
        self.check_mpirun(output);
    }

    fn failed_or_interrupted(&self) -> bool {
        self.first_failure.is_some()
            || self.host_failure.is_some()
            || self.interrupted.is_some()
            || self.hang.is_some()
    }

    /// Every [`WATCH_EVERY`]: notes which workers made progress (a line, a heartbeat), sends
    /// an agent's heartbeats up, and fires the launcher's hang watchdog.
    fn watch(&mut self, output: &mut Output) {
        let now = Instant::now();
        if let Some(d) = self
            .dumping
            .take_if(|d| d.waiting.is_empty() || now >= d.until)
        {
            if !d.waiting.is_empty() {
                let ranks: Vec<u32> = d.waiting.iter().map(|&l| self.workers[l].rank).collect();
                output.message(&format!(
                    "atlasboost: no stacks came from {} in time",
                    ranks_named(&ranks)
                ));
            }
            self.stop_for_hang(d.report, output);
        }
        if now < self.next_watch || !(self.plan.watch || self.plan.hang.is_some()) {
            return;
        }
        self.next_watch = now + WATCH_EVERY;
        for lane in 0..self.workers.len() {
            if self.running[lane].ended.is_some() {
                continue;
            }
            let p = &mut self.progress[lane];
            let rank = self.workers[lane].rank;
            let (lines, bytes) = (output.line_count(lane), output.byte_count(lane));
            if lines != p.lines || bytes != p.bytes {
                // Bytes without a whole line reach the launcher from no agent: it hears of
                // them as a heartbeat that counts nothing new.
                if lines == p.lines && matches!(self.role, Role::Agent(_)) {
                    output.send(&Up::Beat {
                        rank,
                        beats: p.beats,
                        step: p.step,
                    });
                }
                p.lines = lines;
                p.bytes = bytes;
                p.since = now;
            }
            let (Some(files), Some(_)) = (&self.plan.files, self.running[lane].pid) else {
                continue;
            };
            if let Some((beats, step)) = files.beats(rank)
                && beats != p.beats
            {
                p.beats = beats;
                p.step = step;
                p.since = now;
                if matches!(self.role, Role::Agent(_)) {
                    output.send(&Up::Beat { rank, beats, step });
                }
            }
        }
        let Some(hang) = &self.plan.hang else {
            return;
        };
        if self.failed_or_interrupted() || self.dumping.is_some() || self.is_agent() {
            return;
        }
        let live = |l: &usize| self.running[*l].ended.is_none();
        // The first rank to stop progressing, once it has been silent for the timeout.
        let first_stop = (0..self.workers.len())
            .filter(live)
            .map(|l| self.progress[l].since)
            .min()
            .filter(|&since| now.saturating_duration_since(since) >= hang.timeout);
        if let Some(first_stop) = first_stop {
            // Ranks of one collective stop within moments of each other: a rank whose last
            // progress came within a quarter of the timeout after the first one stopped is
            // stuck with it; one that went on longer than that was not waiting for it.
            // (Progress is seen at most every WATCH_EVERY: never less than two looks.)
            let window = (hang.timeout / 4).max(WATCH_EVERY * 2);
            let stuck: Vec<usize> = (0..self.workers.len())
                .filter(live)
                .filter(|&l| self.progress[l].since <= first_stop + window)
                .collect();
            self.on_hang(&stuck, output);
        }
    }

    /// Reports stuck workers, takes their stacks if asked, then stops the job (exit 124).
    fn on_hang(&mut self, stuck: &[usize], output: &mut Output) {
        let now = Instant::now();
        self.hung_ranks = stuck.iter().map(|&l| self.workers[l].rank).collect();
        let live: Vec<usize> = (0..self.workers.len())
            .filter(|&l| self.running[l].ended.is_none())
            .collect();
        let progressing: Vec<u32> = live
            .iter()
            .filter(|l| !stuck.contains(l))
            .map(|&l| self.workers[l].rank)
            .collect();
        let mut report = String::new();
        for &lane in stuck {
            let (w, p) = (&self.workers[lane], &self.progress[lane]);
            report.push_str(&format!(
                "\n  rank {} (host {}, device {}): no output and no heartbeat for {:.1} s",
                w.rank,
                w.host,
                w.device,
                now.saturating_duration_since(p.since).as_secs_f64()
            ));
            if p.beats > 0 {
                report.push_str(&format!(
                    "; {} heartbeat{}",
                    p.beats,
                    if p.beats == 1 { "" } else { "s" }
                ));
                if let Some(step) = p.step {
                    report.push_str(&format!(", last at step {step}"));
                }
            }
            // What it printed last without a newline yet is often where it hangs (local
            // workers: a remote agent's lines come whole).
            let unfinished: Vec<String> = self
                .pipes
                .iter()
                .filter(|p| p.lane == lane && !p.split.unfinished().is_empty())
                .map(|p| {
                    let bytes = p.split.unfinished();
                    let cut = bytes.len() > TAIL_LINE_BYTES;
                    format!(
                        "; on {}, with no newline yet: {}{}",
                        p.stream.as_str(),
                        String::from_utf8_lossy(&bytes[..bytes.len().min(TAIL_LINE_BYTES)]),
                        if cut { "..." } else { "" }
                    )
                })
                .collect();
            match output.last_line(lane) {
                Some(line) => report.push_str(&format!("; its last line: {line}")),
                None if unfinished.is_empty() => report.push_str("; it printed nothing"),
                None => report.push_str("; no whole line"),
            }
            report.push_str(&unfinished.concat());
        }
        let summary = if progressing.is_empty() && stuck.len() == 1 {
            format!("the only rank still running stopped progressing:{report}")
        } else if progressing.is_empty() {
            format!(
                "every rank stopped progressing together (a collective that never completes, \
                 or a shared resource?):{report}"
            )
        } else {
            format!(
                "{} stuck while {} still {}:{report}",
                if stuck.len() == 1 {
                    "one rank is"
                } else {
                    "ranks are"
                },
                ranks_named(&progressing),
                if progressing.len() == 1 {
                    "progresses"
                } else {
                    "progress"
                }
            )
        };
        output.message(&format!("atlasboost: hang: {summary}"));
        let Some(hang) = self.plan.hang.clone() else {
            return;
        };
        if !hang.dump {
            self.stop_for_hang(summary, output);
            return;
        }
        let mut waiting = Vec::new();
        let mut per_host: std::collections::HashMap<String, u32> = std::collections::HashMap::new();
        let mut local = Vec::new();
        for &lane in stuck {
            let rank = self.workers[lane].rank;
            match (self.running[lane].pid, &self.plan.files) {
                (Some(pid), Some(_)) => local.push((lane, rank, pid.as_raw() as u32)),
                _ => {
                    if let Role::Launcher(remotes) = &mut self.role
                        && let Some(i) = remotes
                            .iter()
                            .position(|r| r.host == self.workers[lane].host && !r.done)
                    {
                        *per_host.entry(remotes[i].host.clone()).or_default() += 1;
                        // A host below another hears through the launcher's child above it.
                        let top = top_of(remotes, i);
                        remotes[top].send(Down::Dump(rank));
                        waiting.push(lane);
                    }
                }
            }
        }
        if let (false, Some(files)) = (local.is_empty(), &self.plan.files) {
            // All at once: this loop (and a Ctrl-C) waits for the slowest, not for the sum.
            let ranks: Vec<(u32, u32)> = local.iter().map(|&(_, rank, pid)| (rank, pid)).collect();
            let texts = files.stacks_of(&ranks);
            for (&(lane, _, _), text) in local.iter().zip(texts) {
                self.save_stacks(lane, &text, &hang.dump_dir, output);
            }
            // Taking stacks blocked this loop: nobody's silence meanwhile is theirs.
            self.forgive_silence();
        }
        // An agent takes its ranks' stacks one after another (py-spy: up to 10 s each).
        let most = per_host.values().copied().max().unwrap_or(0);
        self.dumping = Some(Dumping {
            report: summary,
            waiting,
            until: Instant::now() + REMOTE_DUMP_LIMIT.max(DUMP_PER_RANK.saturating_mul(most)),
        });
        // Finished at once when nothing is awaited (the next watch pass would do the same).
        self.next_watch = Instant::now();
    }

    /// After a long step that blocked this loop (taking stacks): peers were not heard, nor heard
    /// from, meanwhile; their silence starts afresh.
    fn forgive_silence(&mut self) {
        let now = Instant::now();
        self.next_heartbeat = now + HEARTBEAT;
        match &mut self.role {
            // And a heartbeat now, before the next long step: agents must not take this pause
            // for a lost launcher.
            Role::Launcher(remotes) => {
                for r in remotes.iter_mut().filter(|r| !r.done && r.lost.is_none()) {
                    r.last_heard = now;
                    r.send(Down::Heartbeat);
                }
            }
            Role::Agent(up) => {
                up.last_heard = now;
                // Their frames waited unread meanwhile: not their silence.
                for (_, child) in &mut up.children {
                    child.last_heard = now;
                }
            }
        }
    }

    /// Saves a stuck rank's stacks under the dump directory and shows their start.
    fn save_stacks(&mut self, lane: usize, text: &str, dir: &std::path::Path, output: &mut Output) {
        let w = &self.workers[lane];
        let file = dir.join(format!("rank.{}.stacks.txt", w.rank));
        let saved = std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&file, text));
        let mut shown: Vec<&str> = text.lines().take(12).collect();
        if text.lines().count() > shown.len() {
            shown.push("...");
        }
        output.message(&format!(
            "atlasboost: stacks of rank {} (host {}){}:\n  {}",
            w.rank,
            w.host,
            match &saved {
                Ok(()) => format!(", saved in {}", file.display()),
                Err(e) => format!(" (not saved in {}: {e})", file.display()),
            },
            shown.join("\n  ")
        ));
        if let Some(d) = &mut self.dumping {
            d.waiting.retain(|&l| l != lane);
        }
    }

    fn stop_for_hang(&mut self, report: String, output: &mut Output) {
        if self.first_failure.is_some() || self.host_failure.is_some() || self.interrupted.is_some()
        {
            return;
        }
        output.event("hang", serde_json::json!({ "report": report }));
        let live = self.running.iter().filter(|r| r.ended.is_none()).count();
        if live > 0 {
            output.message(&format!(
                "atlasboost: stopping the {live} worker{} of the hung job",
                if live == 1 { "" } else { "s" }
            ));
        }
        self.hang = Some(report);
        self.stop(Signal::SIGTERM);
    }

    /// Waits for output, exits, signals or messages once, and handles what came.
    fn poll_once(&mut self, signals: &Signals, output: &mut Output, timeout: PollTimeout) {
        // A console that takes nothing holds the output back: what brings more lines is not
        // read until it takes some (the workers then wait on their pipes, as they would for a
        // console written whole), while signals, exits and the grace time go on.
        let mut held = holding_back(output);
        let killed = self.stopping.is_some_and(|(_, killed)| killed);
        // An agent's or relay's "console" is its launcher, which is waited for as long as it
        // is heard (a frame cut short would garble the stream), and given up when it is not.
        if held
            && !self.is_agent()
            && let Some((at, _)) = self.signalled
            && (killed || at.elapsed() >= self.grace)
        {
            // Asked to stop by a signal, and the grace time is over (or the stop is a kill
            // already): the console is not waited for.
            output.give_up_console(&format!(
                "a signal asked to stop {:.1} s ago",
                at.elapsed().as_secs_f64()
            ));
            held = false;
        }
        if held && matches!(&self.role, Role::Agent(up) if up.lost) {
            // An agent's launcher is gone: what waits for it is not taken any more, and the
            // workers' pipes are read again (their lines dropped), so that nothing holds this
            // agent up. (Checked on every pass: lines may come after the loss.)
            output.give_up_console("the launcher is gone");
            held = false;
        }
        if held {
            // Lines, beats and peers' frames wait unread: no rank's silence, no peer's, is its
            // own. (Ours is not: heartbeats still go out on time.)
            let now = Instant::now();
            for p in &mut self.progress {
                p.since = now;
            }
            match &mut self.role {
                Role::Launcher(remotes) => remotes.iter_mut().for_each(|r| r.last_heard = now),
                Role::Agent(up) => up.children.iter_mut().for_each(|(_, c)| c.last_heard = now),
            }
        }
        let ready: Vec<Source> = {
            let mut fds = Vec::with_capacity(self.pipes.len() + 4);
            let mut sources = Vec::with_capacity(self.pipes.len() + 4);
            fds.push(PollFd::new(signals.fd(), PollFlags::POLLIN));
            sources.push(Source::Signals);
            for (fd, flags) in output.waiting_fds() {
                fds.push(PollFd::new(fd, flags));
                sources.push(Source::Console);
            }
            match &self.role {
                Role::Agent(up) => {
                    if let Some(fd) = &up.fd {
                        fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
                        sources.push(Source::Upstream);
                    }
                    // The agents below wait as this one does (their launcher's heartbeats
                    // still reach them through here).
                    for (h, (_, r)) in up.children.iter().enumerate().filter(|_| !held) {
                        watch_session(h, r, &mut fds, &mut sources);
                    }
                }
                Role::Launcher(remotes) if !held => {
                    for (h, r) in remotes.iter().enumerate() {
                        watch_session(h, r, &mut fds, &mut sources);
                    }
                }
                Role::Launcher(_) => {}
            }
            for (i, p) in self.pipes.iter().enumerate().filter(|_| !held) {
                fds.push(PollFd::new(p.fd.as_fd(), PollFlags::POLLIN));
                sources.push(Source::Pipe(i));
            }
            if let Some(m) = &self.mpirun {
                for (i, (fd, _)) in m.pipes.iter().enumerate().filter(|_| !held) {
                    fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
                    sources.push(Source::MpirunPipe(i));
                }
                for fd in m.door.listeners() {
                    fds.push(PollFd::new(fd, PollFlags::POLLIN));
                    sources.push(Source::Door);
                }
                for (i, fd) in m.door.knocks().enumerate() {
                    fds.push(PollFd::new(fd, PollFlags::POLLIN));
                    sources.push(Source::Knock(i));
                }
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
        // Before what the peers said is read: a peer that lost the launcher meanwhile is then
        // known to be right.
        self.note_silence();
        output.tick();
        let mut closed = Vec::new();
        let mut mpirun_closed = Vec::new();
        let (mut listening, mut knocks) = (false, Vec::new());
        let mut read_sessions = Vec::new();
        for source in ready {
            match source {
                // Written below, with everything else.
                Source::Console => {}
                Source::Door => listening = true,
                Source::Knock(i) => knocks.push(i),
                Source::MpirunPipe(i) => {
                    if !self.read_mpirun(i, output) {
                        mpirun_closed.push(i);
                    }
                }
                Source::Signals => {
                    for s in self.signals_in_order(signals) {
                        self.on_signal(s, signals.sender_of(s), output);
                    }
                }
                Source::Upstream => self.read_upstream(output),
                Source::RemoteOut(h) => {
                    self.read_remote(h, output);
                    read_sessions.push(h);
                }
                Source::RemoteErr(h) => self.read_remote_err(h, output),
                Source::Pipe(i) => {
                    if !Self::read_pipe(&mut self.buf, &mut self.pipes[i], output) {
                        closed.push(i);
                    }
                }
            }
        }
        for h in read_sessions {
            self.check_session_end(h, output);
        }
        closed.sort_unstable();
        for i in closed.into_iter().rev() {
            self.pipes.swap_remove(i);
        }
        self.pipes.retain(|p| !p.at_end);
        if let Some(m) = &mut self.mpirun {
            mpirun_closed.sort_unstable();
            for i in mpirun_closed.into_iter().rev() {
                m.pipes.swap_remove(i);
            }
        }
        // Expiry runs on every pass: a knock that never speaks must still be dropped.
        self.serve_door(listening, &knocks, output);
        // Groups this relay saw end, which the launcher's guard still lists: said now, not
        // with the relay's `Done`, which may come seconds later (see `prepare_below_launcher`).
        for group in self.lifeline.take_gone() {
            output.queue(&Up::GroupGone { group });
        }
        output.flush();
        if signals.take_stop() {
            self.suspend(output);
        }
    }

    /// Ctrl-Z (SIGTSTP): the launcher stops itself, as a program does, having told its hosts
    /// and relays, which would otherwise take its silence for its loss and stop their workers.
    /// The workers run on meanwhile (each is in a group of its own, which the terminal's
    /// Ctrl-Z does not reach, as under mpirun). Continued (`fg`, `bg`), it forgives the
    /// silence and watches again.
    fn suspend(&mut self, output: &mut Output) {
        if let Role::Launcher(remotes) = &mut self.role {
            let mut told = 0;
            for r in remotes.iter_mut().filter(|r| !r.done && r.lost.is_none()) {
                r.send(Down::Pause);
                told += 1;
            }
            output.message(&match told {
                0 => "atlasboost: stopped (SIGTSTP); the workers run on (fg or bg continues the \
                      launcher)"
                    .to_string(),
                _ => "atlasboost: stopped (SIGTSTP); the workers run on, and the hosts wait for \
                      the launcher (fg or bg continues it)"
                    .to_string(),
            });
            output.flush();
        }
        let _ = nix::sys::signal::raise(Signal::SIGSTOP);
        // Continued. Nothing was read meanwhile: no peer's silence, and no rank's (lines and
        // heartbeats wait in the pipes), is its own; the watchdog starts afresh.
        self.forgive_silence();
        let now = Instant::now();
        for p in &mut self.progress {
            p.since = now;
        }
        self.next_watch = now + WATCH_EVERY;
        if let Some(d) = &mut self.dumping {
            d.until = d.until.max(now + REMOTE_DUMP_LIMIT);
        }
        if !self.is_agent() {
            output.message("atlasboost: continued");
        }
    }

    /// Reads what a pipe has; false at its end.
    fn read_pipe(buf: &mut Vec<u8>, p: &mut Pipe, output: &mut Output) -> bool {
        Self::read_some(buf, p, output, true) != PipeState::Ended
    }

    /// Up to 16 reads: a bounded number per poll keeps one chatty worker from starving the rest.
    /// With `hold`, a console that does not keep up holds the output back, within a pass too.
    fn read_some(buf: &mut Vec<u8>, p: &mut Pipe, output: &mut Output, hold: bool) -> PipeState {
        for _ in 0..16 {
            if hold && holding_back(output) {
                return PipeState::More;
            }
            match nix::unistd::read(&p.fd, buf) {
                Ok(0) => {
                    p.split.finish(&mut |l| output.line(p.lane, p.stream, l));
                    return PipeState::Ended;
                }
                Ok(n) => {
                    output.count_bytes(p.lane, n);
                    p.split
                        .feed(&buf[..n], &mut |l| output.line(p.lane, p.stream, l));
                    if n == buf.len() && n < READ_BUFFER {
                        buf.resize(n * 2, 0);
                    }
                }
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
            // Bounded: a child of the worker may still be writing to the same pipe. Read past
            // a console that holds the output back: bounded too, and its last lines must come
            // before what is said of its exit.
            for _ in 0..64 {
                match Self::read_some(&mut self.buf, p, output, false) {
                    PipeState::More => {}
                    PipeState::Ended => {
                        p.at_end = true;
                        break;
                    }
                    PipeState::Empty => break,
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
        let mut lines = std::mem::take(&mut up.queued);
        let Some(fd) = &up.fd else { return };
        let mut ended = false;
        match nix::unistd::read(fd, &mut self.buf) {
            Ok(0) => ended = true,
            Ok(n) => {
                up.last_heard = Instant::now();
                output.set_reader_paused(false);
                up.split
                    .feed(&self.buf[..n], &mut |l| lines.push(l.to_vec()));
            }
            Err(Errno::EAGAIN | Errno::EINTR) => {}
            Err(_) => ended = true,
        }
        if ended {
            up.fd = None;
        }
        // Every command is for the whole tree below too.
        for line in &lines {
            for (_, child) in &mut up.children {
                child.send_line(line);
            }
        }
        for line in lines {
            match Down::parse(&String::from_utf8_lossy(&line)) {
                Ok(Down::Heartbeat | Down::Decision(_)) => {}
                // The launcher is stopping (Ctrl-Z): its silence is not its loss until it
                // speaks again. Its end still is (its connection closes).
                Ok(Down::Pause) => output.set_reader_paused(true),
                Ok(Down::Dump(rank)) => self.dump_for_launcher(rank, output),
                Ok(Down::Signal(s)) => {
                    if s == Signal::SIGKILL {
                        self.kill_now();
                    } else if self.stopping.is_none() {
                        self.stop(s);
                    }
                    // (Else a stop is under way: a relay's, on mpirun's signal, which the
                    // launcher's stop follows. A worker takes a second SIGTERM for "abort
                    // now".)
                }
                Err(why) => output.message(&format!("atlasboost agent: ignoring {why}")),
            }
        }
        if ended {
            self.upstream_lost(
                "the launcher's connection closed",
                ExitCodes::FAILURE,
                output,
            );
        }
    }

    /// An agent takes the stacks of its worker of `rank` and sends them up.
    fn dump_for_launcher(&mut self, rank: u32, output: &mut Output) {
        // Commands reach every agent of the tree: the one with the rank answers.
        let Some(lane) = self.workers.iter().position(|w| w.rank == rank) else {
            return;
        };
        // Taking stacks blocks this loop for up to a few seconds: the agents below hear from
        // their launcher before and after, so they do not take its silence for its loss.
        if let Role::Agent(up) = &mut self.role {
            for (_, child) in &mut up.children {
                child.send(Down::Heartbeat);
            }
        }
        let text = match (self.running[lane].pid, &self.plan.files) {
            (Some(pid), Some(files)) if self.running[lane].ended.is_none() => {
                files.stacks(rank, pid.as_raw() as u32)
            }
            _ => "no stacks: the worker has ended".to_string(),
        };
        self.forgive_silence();
        if let Role::Agent(up) = &mut self.role {
            for (_, child) in &mut up.children {
                child.send(Down::Heartbeat);
            }
        }
        // Within a frame, with room to spare: a dump of many threads can be long.
        let mut text = text.into_bytes();
        if text.len() > MAX_STACKS {
            text.truncate(MAX_STACKS);
            text.extend_from_slice(b"\n... (cut at 256 KiB)\n");
        }
        output.send(&Up::Stacks { rank, text });
    }

    /// An agent of the Slurm step got a signal: Slurm is ending the step (`scancel`, the time
    /// limit), and has signalled the workers too. The launcher is still there: it is told why
    /// (with the signal's exit code) before any worker's end reaches it, and the workers are
    /// stopped; a second signal kills them.
    fn slurm_stops(&mut self, s: Signal, output: &mut Output) {
        if self.stopping.is_some() {
            self.kill_now();
            return;
        }
        let why = format!(
            "got {} from Slurm (scancel, or the job's time limit, stops the step)",
            s.as_str()
        );
        output.send(&Up::Failed {
            code: 128u8.wrapping_add(s as u8),
            message: format!("{why}; the agent stopped its workers"),
        });
        output.message(&format!("atlasboost agent: {why}; stopping the workers"));
        self.grace = self.grace.min(LAUNCHER_LOST_GRACE);
        self.stop(Signal::SIGTERM);
    }

    /// The launcher is gone: stop every worker, quickly.
    fn upstream_lost(&mut self, why: &str, code: u8, output: &mut Output) {
        let Role::Agent(up) = &mut self.role else {
            return;
        };
        if up.lost {
            return;
        }
        up.lost = true;
        // The agents below stop their workers too when their line closes.
        for (_, child) in &mut up.children {
            child.hang_up();
        }
        if self.running.iter().all(|r| r.ended.is_some()) {
            return;
        }
        // Said as a failure too, so that a launcher that comes back knows why its workers
        // ended (rather than blaming the first one to die of the SIGTERM).
        let (who, whose) = match up.obeys_signals {
            true => ("its relay", "worker"),
            false => ("the agent", "workers"),
        };
        output.send(&Up::Failed {
            code,
            message: format!("{why}; {who} stopped its {whose}"),
        });
        output.message(&format!(
            "atlasboost agent: {why}; stopping the workers (SIGKILL in {:.0?})",
            LAUNCHER_LOST_GRACE
        ));
        self.grace = self.grace.min(LAUNCHER_LOST_GRACE);
        self.stop(Signal::SIGTERM);
    }

    /// An agent passes up what an agent it started said.
    fn read_child(&mut self, h: usize, output: &mut Output) {
        let Role::Agent(up) = &mut self.role else {
            return;
        };
        let (position, child) = &mut up.children[h];
        for m in child.forward(*position, up.tree, &mut self.buf) {
            output.send(&m);
        }
    }

    fn read_remote(&mut self, h: usize, output: &mut Output) {
        let Role::Launcher(remotes) = &mut self.role else {
            self.read_child(h, output);
            return;
        };
        match remotes[h].read_out(&mut self.buf) {
            // The read may have met the end of the session, with or without data: the caller
            // checks, once every peer's news of the pass is in (see `check_session_end`).
            Ok(messages) => {
                for m in messages.into_iter().flatten() {
                    self.on_remote(h, m, output);
                }
            }
            Err(why) => {
                let why = format!("its agent sent something that is not the protocol: {why}");
                self.host_lost(h, why, output);
            }
        }
    }

    /// A session whose output has ended before its agent said it was done: the host is lost.
    /// Checked after the other peers' news of the same pass: a peer that reported a failure
    /// comes first, ahead of one that mpirun's abort (or a stop) killed in consequence, though
    /// a console held back let both wait to be read together.
    fn check_session_end(&mut self, h: usize, output: &mut Output) {
        let Role::Launcher(remotes) = &self.role else {
            return;
        };
        let r = &remotes[h];
        if r.out.is_none() && r.parent.is_none() && !r.done && r.lost.is_none() {
            // A relay that said mpirun was stopping it, gone before it said how its worker
            // ended (mpirun kills what its SIGTERM has not ended): mpirun's doing, judged once
            // mpirun has exited.
            if r.relay_rank()
                .is_some_and(|rank| self.mpirun_casualty(rank))
            {
                self.relay_gone_with_mpirun(h, output);
                return;
            }
            // The first host lost is the job's failure, named with how its ssh ended: a
            // killed ssh's output ends a moment before its exit can be collected, a moment
            // seen past 5 ms on a loaded machine. The others are told as they come.
            let first = !self.failed_or_interrupted();
            let why = r.ended_early(if first { 100 } else { 5 });
            // `scancel` of the agents' step kills them at once (SIGKILL): only srun's lines say
            // why, and they may come a moment after the connection closed.
            if !self.step_cancelled(h, SLURM_CANCEL_WAIT, output) {
                self.host_lost(h, why, output);
            }
        }
    }

    /// Whether Slurm cancelled the step of host `h` (srun says so, within `wait`); if so the
    /// job fails for it, with 128 + SIGTERM, as for any `scancel`. Slurm kills the step's
    /// agents and workers at once, so the first news of it may be a worker's SIGKILL or the
    /// agent's connection closing.
    fn step_cancelled(&mut self, h: usize, wait: Duration, output: &mut Output) -> bool {
        let Role::Launcher(remotes) = &mut self.role else {
            return false;
        };
        let Some(line) = remotes[h].cancelled_by_slurm(wait) else {
            return false;
        };
        let why = format!("Slurm cancelled the agents' step (scancel): {line}");
        remotes[h].lost = Some(why.clone());
        remotes[h].hang_up();
        self.fail_host(h, why, 128 + Signal::SIGTERM as u8, output);
        true
    }

    fn read_remote_err(&mut self, h: usize, output: &mut Output) {
        let Role::Launcher(remotes) = &mut self.role else {
            self.read_child(h, output);
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
        if self.is_agent() {
            return;
        }
        match message {
            Up::Heartbeat | Up::Ready => {}
            Up::Line { rank, stream, line } => {
                if let Some(lane) = self.lane_of(h, rank) {
                    output.line(lane, stream, &line);
                }
            }
            Up::Lines {
                rank,
                stream,
                lines,
            } => {
                if let Some(lane) = self.lane_of(h, rank) {
                    let mut start = 0;
                    for end in memchr::memchr_iter(b'\n', &lines) {
                        output.line(lane, stream, &lines[start..end]);
                        start = end + 1;
                    }
                }
            }
            Up::MpirunStops { signal } => {
                // (Not when the launcher signalled mpirun: then mpirun passes on its stop.)
                let rank = self.relay_rank(h);
                if let (Some(m), Some(rank)) = (&mut self.mpirun, rank)
                    && !m.signalled
                {
                    m.stopped.insert(rank, signal);
                }
            }
            Up::Exited { rank, ending } => {
                // A worker of the Slurm step killed before the job failed: `scancel` of the
                // step, whose SIGKILL may reach it before its agent, or an OOM kill. srun
                // says which within moments; the wait is short, well inside the agents'
                // heartbeat bound.
                if ending == Ending::Signaled(Signal::SIGKILL.into())
                    && self.first_failure.is_none()
                    && self.interrupted.is_none()
                    && matches!(&self.role, Role::Launcher(r) if r[h].is_of_step())
                {
                    self.step_cancelled(h, SLURM_KILLED_WORKER_WAIT, output);
                }
                // Under --mpi, a rank stopped by mpirun's side as mpirun died (its daemons on
                // other hosts stop their ranks then) is no failure of its own; nor is one whose
                // relay said mpirun stopped it (see `after_worker_ended`).
                self.mpirun_died_first(ending, output);
                if let Some(lane) = self.lane_of(h, rank) {
                    self.worker_ended(lane, ending, output);
                }
            }
            Up::Failed { code, message } => {
                if message.starts_with(LAUNCHER_SILENT) && self.fail_for_being_held(output) {
                    // The launcher's own pause fails the job, not the peer: the peer goes on to
                    // report how each worker it stopped ended.
                    return;
                }
                let relay = match &mut self.role {
                    Role::Launcher(remotes) => {
                        remotes[h].done = true;
                        // The job is ending already: what an agent says is still news (Slurm
                        // stopping the step, say, after its signal ended a worker).
                        let relay = remotes[h]
                            .relay_rank()
                            .map(|r| (r, remotes[h].host.clone()));
                        if relay.is_none()
                            && (self.first_failure.is_some() || self.interrupted.is_some())
                        {
                            output.message(&format!(
                                "atlasboost: host {}: {message}",
                                remotes[h].host
                            ));
                        }
                        relay
                    }
                    Role::Agent(_) => None,
                };
                // A relay's failure is its rank's (under --mpi a relay is one rank, not a
                // host): its worker could not start, or the relay could not run it.
                if let Some((rank, host)) = relay {
                    // Every relay of a host fails alike when the command is not there: the
                    // first one says it, the summary counts the others.
                    if !self.not_run.iter().flatten().any(|said| *said == message) {
                        output
                            .message(&format!("atlasboost: rank {rank} (host {host}): {message}"));
                    }
                    if let Some(lane) = self.lane_of(h, rank) {
                        self.not_run[lane] = Some(message);
                        self.worker_ended(lane, Ending::Exited(i32::from(code)), output);
                    }
                    return;
                }
                // An agent that failed ends the sessions of the agents below it.
                let message = match self.lose_below(h, output).as_slice() {
                    [] => message,
                    names => format!(
                        "{message}; with it the {} below it in the launch tree: {}",
                        crate::commands::counted(names.len(), "host"),
                        names.join(", ")
                    ),
                };
                self.fail_host(h, message, code, output);
            }
            Up::Group { rank, group } => {
                // A relay's own worker only: its rank, on this host (its Unix socket: a
                // process group of another host means nothing here), and never the
                // launcher's own group.
                let group = Pid::from_raw(group);
                let here = match &self.role {
                    Role::Launcher(remotes) => remotes[h].is_local_relay(),
                    Role::Agent(_) => false,
                };
                if here && self.relay_rank(h) == Some(rank) && group != nix::unistd::getpgrp() {
                    self.lifeline.watch(group.as_raw());
                    self.relay_groups.push((h, group));
                }
            }
            Up::GroupGone { group } => {
                let lifeline = &mut self.lifeline;
                self.relay_groups.retain(|&(of, listed)| {
                    let gone = of == h && listed.as_raw() == group;
                    if gone {
                        lifeline.forget(group);
                    }
                    !gone
                });
            }
            Up::Done => {
                // The relay has seen its worker's group end.
                let lifeline = &mut self.lifeline;
                self.relay_groups.retain(|&(of, group)| {
                    let keep = of != h;
                    if !keep {
                        lifeline.forget(group.as_raw());
                    }
                    keep
                });
                if let Role::Launcher(remotes) = &mut self.role {
                    remotes[h].done = true;
                    // An agent of the Slurm step waits for the launcher's end of the
                    // connection before it exits (so that nothing is left unread): it is done.
                    if remotes[h].is_of_step() {
                        remotes[h].hang_up();
                    }
                }
            }
            Up::Beat { rank, beats, step } => {
                if let Some(lane) = self.lane_of(h, rank) {
                    let p = &mut self.progress[lane];
                    p.beats = beats;
                    p.step = step;
                    p.since = Instant::now();
                }
            }
            Up::Recorded { rank, text } => {
                if let Some(lane) = self.lane_of(h, rank) {
                    self.recorded[lane] = Some(text);
                }
            }
            Up::Stacks { rank, text } => {
                if let (Some(lane), Some(hang)) = (self.lane_of(h, rank), self.plan.hang.clone()) {
                    let text = String::from_utf8_lossy(&text).into_owned();
                    self.save_stacks(lane, &text, &hang.dump_dir, output);
                }
            }
            Up::Via { host, message } => {
                let Role::Launcher(remotes) = &mut self.role else {
                    return;
                };
                let v = host as usize;
                if v == h || v >= remotes.len() || !is_below(remotes, v, h) {
                    let why = format!(
                        "its agent passed up a message of host position {host}, which is not \
                         below it in the launch tree"
                    );
                    self.host_lost(h, why, output);
                    return;
                }
                remotes[v].last_heard = Instant::now();
                self.on_remote(v, *message, output);
            }
            Up::Lost { host, said } => {
                let Role::Launcher(remotes) = &self.role else {
                    return;
                };
                let v = host as usize;
                if v == h || v >= remotes.len() || !is_below(remotes, v, h) {
                    let why = format!(
                        "its agent reported host position {host} lost, which is not below it \
                         in the launch tree"
                    );
                    self.host_lost(h, why, output);
                    return;
                }
                let parent = remotes[v]
                    .parent
                    .map_or_else(String::new, |p| remotes[p].host.clone());
                let why = format!("{said} (said host {parent}, which started it)");
                self.host_lost(v, why, output);
            }
            Up::Said { line } => {
                if let Role::Launcher(remotes) = &mut self.role {
                    let line = String::from_utf8_lossy(&line).into_owned();
                    output.message(&match remotes[h].relay_rank() {
                        Some(rank) => {
                            format!("atlasboost: rank {rank} (host {}): {line}", remotes[h].host)
                        }
                        None => format!("atlasboost: host {}: {line}", remotes[h].host),
                    });
                    remotes[h].heard_err(line);
                }
            }
            // Reports belong to the join, which is over.
            Up::Report { .. } => {}
            Up::Telemetry { bytes } => match monitor::decode(&bytes) {
                Ok(sample) => self.record_sample(sample, output),
                Err(e) => {
                    if let Role::Launcher(remotes) = &self.role {
                        output.message(&format!(
                            "atlasboost: host {}: a telemetry sample atlasboost cannot read ({e}); \
                             ignored",
                            remotes[h].host
                        ));
                    }
                }
            },
        }
    }

    /// The rank of remote `h` when it is a relay of `run --mpi`.
    fn relay_rank(&self, h: usize) -> Option<u32> {
        match &self.role {
            Role::Launcher(remotes) => remotes.get(h)?.relay_rank(),
            Role::Agent(_) => None,
        }
    }

    /// The lane of a rank that remote `h` reports on: a rank of its host (a relay: its own
    /// rank), never another's.
    fn lane_of(&self, h: usize, rank: u32) -> Option<usize> {
        let lane = self.workers.binary_search_by_key(&rank, |w| w.rank).ok()?;
        self.reports_on(h, lane).then_some(lane)
    }

    /// The lanes remote `h` reports on.
    fn lanes_of(&self, h: usize) -> Vec<usize> {
        (0..self.workers.len())
            .filter(|&lane| self.reports_on(h, lane))
            .collect()
    }

    /// Whether remote `h` reports on the worker of `lane`.
    fn reports_on(&self, h: usize, lane: usize) -> bool {
        let (Role::Launcher(remotes), Some(w)) = (&self.role, self.workers.get(lane)) else {
            return false;
        };
        let r = &remotes[h];
        !w.local
            && match r.relay_rank() {
                Some(rank) => w.rank == rank,
                None => w.host == r.host,
            }
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
        let why = match self.lose_below(h, output).as_slice() {
            [] => why,
            names => format!(
                "{why}; with it the {} below it in the launch tree: {}",
                crate::commands::counted(names.len(), "host"),
                names.join(", ")
            ),
        };
        // srun ends the whole step once one agent died (--kill-on-bad-exit): the hosts lost
        // after the first were lost with the step, and are not left out of a restart.
        if let (Some(f), Role::Launcher(remotes)) = (&self.host_failure, &mut self.role)
            && f.lost
            && remotes[h].is_of_step()
        {
            remotes[h].orphaned = true;
        }
        self.fail_host(h, why, ExitCodes::FAILURE, output);
        // (A relay is one rank, not its host: its host is not lost.)
        if let Some(f) = &mut self.host_failure
            && let Role::Launcher(remotes) = &self.role
            && f.host == remotes[h].host
            && f.relay_rank.is_none()
        {
            f.lost = true;
        }
    }

    /// Every host below host `h` in the launch tree was reached through it: once it is gone
    /// (lost, or its agent failed), they are lost with it, and their workers' fate is unknown.
    /// Returns their names. They are not left out of a restart: nothing says they failed.
    fn lose_below(&mut self, h: usize, output: &mut Output) -> Vec<String> {
        let Role::Launcher(remotes) = &mut self.role else {
            return Vec::new();
        };
        let below: Vec<usize> = (0..remotes.len())
            .filter(|&v| v != h && is_below(remotes, v, h))
            .filter(|&v| remotes[v].lost.is_none() && !remotes[v].done)
            .collect();
        let mut names = Vec::with_capacity(below.len());
        for &v in &below {
            remotes[v].lost = Some(format!(
                "lost with host {}, above it in the launch tree",
                remotes[h].host
            ));
            remotes[v].orphaned = true;
            names.push(remotes[v].host.clone());
        }
        for v in below {
            self.end_workers_of(v, Ending::Lost, output);
        }
        names
    }

    /// The workers of remote `h` still running as far as the launcher knows have ended so
    /// (their host lost, their relay gone): recorded now, with their events.
    pub(super) fn end_workers_of(&mut self, h: usize, ending: Ending, output: &mut Output) {
        let now = Instant::now();
        for lane in self.lanes_of(h) {
            if self.running[lane].ended.is_none() {
                self.running[lane].ended = Some((now, ending));
                self.exit_event(lane, ending, output);
            }
        }
    }

    fn fail_host(&mut self, h: usize, why: String, code: u8, output: &mut Output) {
        let Role::Launcher(remotes) = &self.role else {
            return;
        };
        let host = remotes[h].host.clone();
        // A relay is one rank, not a host: its connection ended before it said how its worker
        // did.
        let ending = match remotes[h].relay_rank() {
            Some(_) => Ending::Unknown,
            // After the launcher's own pause its agents stopped their workers: the session's
            // end (an agent that gave its frames up, one below it) loses no host.
            None if self.paused_first() => Ending::Unknown,
            None => Ending::Lost,
        };
        let relay_rank = remotes[h].relay_rank();
        self.end_workers_of(h, ending, output);
        self.fail_job_of(&host, relay_rank, why, code, output);
    }

    /// The job fails because of `host` (a host, or mpirun), unless something failed first.
    fn fail_job(&mut self, host: &str, why: String, code: u8, output: &mut Output) {
        self.fail_job_of(host, None, why, code, output);
    }

    /// The launcher's: notes a silence of its loop longer than its peers wait. (Theirs, timed
    /// from when they heard its last heartbeat, is never longer than this one.)
    fn note_silence(&mut self) {
        let spoke = self.keeper.as_ref().and_then(keeper::Keeper::last_spoke);
        let silent = spoke
            .map_or(self.last_beat, |k| k.max(self.last_beat))
            .elapsed();
        if !self.is_agent() && silent > self.plan.lost_after {
            self.held = Some((silent, Instant::now()));
        }
    }

    /// A peer stopped its workers because the launcher's heartbeats stopped: if the launcher
    /// did not run for that long, the job fails as the launcher's doing, not the peer's
    /// (`true`: it does).
    fn fail_for_being_held(&mut self, output: &mut Output) -> bool {
        // The peer said so as the silence went on: its word comes with the first reads after
        // it, not long after (an old pause does not explain a later loss).
        let Some((held, _)) = self
            .held
            .filter(|(_, noticed)| noticed.elapsed() <= self.plan.lost_after)
        else {
            return false;
        };
        if self.paused_first() {
            // Said already, on another peer's word.
            return true;
        }
        if self.is_agent() || self.failed_or_interrupted() {
            return false;
        }
        let peers = match self.mpirun.is_some() {
            true => "its relays",
            false => "its agents",
        };
        let why = format!(
            "it sent no heartbeat for {:.1} s (stopped with SIGSTOP or by a debugger, or \
             starved of CPU), longer than --host-timeout ({:.0?}): {peers} took it for lost and \
             stopped their workers",
            held.as_secs_f64(),
            self.plan.lost_after
        );
        // The peers stopped their workers already: said without fail_job's "stopping ...".
        output.message(&format!("atlasboost: atlasboost itself failed: {why}"));
        self.host_failure = Some(HostFailure {
            host: LAUNCHER.into(),
            message: why,
            code: ExitCodes::FAILURE,
            lost: false,
            relay_rank: None,
        });
        self.stop(Signal::SIGTERM);
        true
    }

    /// The job failed first as the launcher's own pause (see [`Self::fail_for_being_held`]).
    fn paused_first(&self) -> bool {
        self.host_failure
            .as_ref()
            .is_some_and(|f| f.host == LAUNCHER)
    }

    /// [`Self::fail_job`], for the relay of `relay_rank` on `host` when it is `Some`.
    fn fail_job_of(
        &mut self,
        host: &str,
        relay_rank: Option<u32>,
        why: String,
        code: u8,
        output: &mut Output,
    ) {
        if self.failed_or_interrupted() {
            return;
        }
        let host = host.to_string();
        // Under --mpi, a rank whose relay has not called in has no worker yet to stop.
        let live = (0..self.workers.len())
            .filter(|&l| {
                self.running[l].ended.is_none()
                    && self
                        .mpirun
                        .as_ref()
                        .is_none_or(|m| m.door.is_admitted(self.workers[l].rank))
            })
            .count();
        if live > 0 {
            // mpirun has no workers of its own: the ones still running are all there are.
            let which = if host == MPIRUN { "the" } else { "the other" };
            output.message(&format!(
                "atlasboost: {} failed: {why}; stopping {which} {live} worker{}",
                who_failed(&host, relay_rank),
                if live == 1 { "" } else { "s" }
            ));
        }
        self.host_failure = Some(HostFailure {
            host,
            message: why,
            code,
            lost: false,
            relay_rank,
        });
        self.stop(Signal::SIGTERM);
    }

    /// The signals received, SIGCHLD last. An agent of the Slurm step that hears of a
    /// worker's end alone waits a moment for a signal of its own: Slurm signals the workers
    /// and the agent together (`scancel`, the time limit), and the launcher must hear why
    /// (`slurm_stops`) before it hears of a worker killed, or it blames the worker.
    fn signals_in_order(&self, signals: &Signals) -> Vec<Signal> {
        let mut got = signals.pending();
        if !got.is_empty()
            && got.iter().all(|&s| s == Signal::SIGCHLD)
            && self.stopping.is_none()
            && matches!(&self.role, Role::Agent(up) if up.slurm)
        {
            // Other workers' ends (SIGCHLD again) do not end the wait: only Slurm's signal, or
            // its time.
            let until = Instant::now() + Duration::from_millis(SLURM_SIGNAL_WAIT_MS.into());
            while got.iter().all(|&s| s == Signal::SIGCHLD) {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                let mut fds = [PollFd::new(signals.fd(), PollFlags::POLLIN)];
                let timeout = PollTimeout::try_from(left).unwrap_or(PollTimeout::ZERO);
                if poll(&mut fds, timeout).is_ok_and(|n| n > 0) {
                    got.extend(signals.pending());
                }
            }
            got.sort_by_key(|&s| s == Signal::SIGCHLD);
        }
        got
    }

    /// `from`: who sent it, if the kernel said.
    fn on_signal(&mut self, s: Signal, from: Option<u32>, output: &mut Output) {
        if s == Signal::SIGCHLD {
            self.reap(output);
            return;
        }
        self.reap_clean_exits(output);
        self.signalled.get_or_insert_with(|| (Instant::now(), s));
        // Against the last signal acted on: a stream of one signal (a held Ctrl-C) does not
        // stretch the window for ever.
        let now = Instant::now();
        let echo = self
            .last_signal
            .is_some_and(|(at, last)| last == s && now.duration_since(at) < policy::ECHO);
        if !echo {
            self.last_signal = Some((now, s));
        }
        let live = self.running.iter().filter(|r| r.ended.is_none()).count();
        // What the workers of a job that has ended left running, being stopped: the signal
        // cuts that stop short (it does not wait out the grace again).
        let leftovers = live == 0 && self.stopping.is_some();
        let state = SignalState {
            agent: self.is_agent(),
            obeys_signals: matches!(&self.role, Role::Agent(up) if up.obeys_signals),
            // A hang's stop is an ending as a failure's is: a signal then kills at once.
            ending: self.failed_or_interrupted() || leftovers,
            stopping: self.stopping.map(|(_, killed)| killed),
            echo,
            from_mpirun: from_parent(from),
        };
        match policy::on_signal(state) {
            // A relay's parent is mpirun, which stops the job with signals: pass them on, as
            // the launcher's `sig` commands.
            SignalAction::PassOn => {
                // The launcher stops a relay's worker with `sig` over the channel, not with a
                // signal (it signals only relays re-parented to it, whose mpirun is gone): a
                // signal from mpirun's side means mpirun (or its daemon) is stopping the job,
                // because it was itself signalled or ended on its own. Said, so that what ends
                // the job is not taken for the worker's; by the relay of each host's first rank
                // (mpirun signals them all).
                let first_here = self.workers.iter().any(|w| w.device == 0);
                if !self.failed_or_interrupted() && self.stopping.is_none() {
                    if first_here {
                        output.message(&relay_signalled(s, from));
                    }
                    // The launcher then takes its worker's end for mpirun's doing.
                    if from_parent(from) {
                        output.send(&Up::MpirunStops { signal: s.into() });
                    }
                }
                self.stop(s);
            }
            SignalAction::KillNow if !state.agent => {
                // Ending what the workers of an ended job left is an interruption too (SPEC
                // §8: 128+N), as a signal in the wait for the console after them is.
                if leftovers && self.interrupted.is_none() {
                    self.interrupted = Some(s);
                }
                let (what, it) = match leftovers {
                    true => ("what the workers left running", "it"),
                    false => ("the workers", "them"),
                };
                output.message(&format!(
                    "atlasboost: got {} while stopping {}; killing {} now",
                    s.as_str(),
                    what,
                    it
                ));
                self.kill_now();
            }
            SignalAction::KillNow => self.kill_now(),
            // An agent takes orders from its launcher; a signal from elsewhere (sshd's SIGHUP
            // when the session ends) means the launcher is gone.
            SignalAction::UpstreamLost if matches!(&self.role, Role::Agent(up) if up.slurm) => {
                self.slurm_stops(s, output);
            }
            SignalAction::UpstreamLost => {
                self.upstream_lost(&format!("got {}", s.as_str()), ExitCodes::FAILURE, output);
            }
            SignalAction::Interrupt => {
                output.message(&match live {
                    0 => format!("atlasboost: got {}; every worker has ended", s.as_str()),
                    _ => format!(
                        "atlasboost: got {}; passing it on to {live} worker{} \
                         (SIGKILL in {:.0?}; {} again to kill now)",
                        s.as_str(),
                        if live == 1 { "" } else { "s" },
                        self.plan.grace,
                        s.as_str()
                    ),
                });
                self.interrupted = Some(s);
                self.stop(s);
                // What the workers leave behind is stopped as soon as they have all exited.
                self.leftovers_stopped = false;
            }
            SignalAction::Nothing => {}
        }
    }

    /// Collects every child that has exited (workers, and their orphans: the launcher is a
    /// subreaper).
    ///
    /// Every exit already there is collected before any is acted on: workers that ended in
    /// the same moment as the first failure ended on their own, and the stop that failure
    /// starts must neither count them as stopped nor signal their groups.
    fn reap(&mut self, output: &mut Output) {
        let mut ended = Vec::new();
        while let Some((pid, ending)) = reap_one(None) {
            if let Some(ending) = ending {
                ended.push((pid, ending));
            }
        }
        self.act_on_reaped(ended, output);
    }

    /// Before a signal is acted on: collects the workers that have already exited with status
    /// 0. Their SIGCHLD is read after the signal (the lowest number comes first), but they
    /// finished before it came, so they succeeded rather than were stopped. Any other end
    /// waits for its SIGCHLD: a worker killed by the very signal the launcher got (a kill of
    /// the whole group or cgroup) belongs to that interruption, and is no failure.
    fn reap_clean_exits(&mut self, output: &mut Output) {
        let clean: Vec<Pid> = self
            .running
            .iter()
            .filter(|r| r.ended.is_none())
            .filter_map(|r| r.pid)
            .filter(|&pid| exited_cleanly(pid))
            .collect();
        let ended = clean
            .into_iter()
            .filter_map(|pid| reap_one(Some(pid)))
            .filter_map(|(pid, ending)| ending.map(|e| (pid, e)))
            .collect();
        self.act_on_reaped(ended, output);
    }

    /// Acts on the children [`Self::reap`] or [`Self::reap_clean_exits`] collected.
    fn act_on_reaped(&mut self, ended: Vec<(Pid, Ending)>, output: &mut Output) {
        // A group whose last process was just reaped may have its id reused from now on: mark
        // it gone (and tell the lifeline) before anything signals it.
        self.check_groups();
        // Every worker of the batch has ended before any of them is acted on.
        let now = Instant::now();
        let mut workers = Vec::new();
        for (pid, ending) in ended {
            if let Some(i) = self.reaped(pid, ending, output)
                && self.running[i].ended.is_none()
            {
                self.running[i].ended = Some((now, ending));
                workers.push((i, ending));
            }
        }
        for (i, ending) in workers {
            self.after_worker_ended(i, ending, output);
        }
    }

    /// One child collected by [`Self::reap`]: the lane of the worker it was, if it was one.
    fn reaped(&mut self, pid: Pid, ending: Ending, output: &mut Output) -> Option<usize> {
        if Some(pid.as_raw() as u32) == self.lifeline.pid() {
            self.lifeline.reaped();
            output.message(
                "atlasboost: warning: the lifeline process exited early; if the launcher \
                 is killed now, workers' children may survive it",
            );
            return None;
        }
        let session = match &mut self.role {
            Role::Launcher(remotes) => remotes
                .iter_mut()
                .find(|r| r.pid() == Some(pid.as_raw() as u32)),
            Role::Agent(up) => up
                .children
                .iter_mut()
                .map(|(_, c)| c)
                .find(|c| c.pid() == Some(pid.as_raw() as u32)),
        };
        if let Some(r) = session {
            r.reaped = true;
            r.ssh_ended = Some(ending);
            return None;
        }
        if self.mpirun.as_ref().is_some_and(|m| m.pid == pid) {
            self.mpirun_exited(ending, output);
            self.check_groups();
            return None;
        }
        let i = self.running.iter().position(|r| r.pid == Some(pid))?;
        // Its group may be empty now, its id free for reuse: find out before anything
        // (the stop a failure starts) signals it.
        if killpg(pid, None) == Err(Errno::ESRCH) {
            self.running[i].group_gone = true;
            self.lifeline.forget(pid.as_raw());
        }
        Some(i)
    }

    /// A worker ended: an agent reports it; the launcher fails the job if it failed first.
    fn worker_ended(&mut self, i: usize, ending: Ending, output: &mut Output) {
        if self.running[i].ended.is_some() {
            return;
        }
        self.running[i].ended = Some((Instant::now(), ending));
        self.after_worker_ended(i, ending, output);
    }

    /// What follows a worker's end, once it is recorded.
    fn after_worker_ended(&mut self, i: usize, ending: Ending, output: &mut Output) {
        if self.running[i].pid.is_some() {
            self.drain_lane(i, output);
            if ending.failed()
                && let Some(files) = &self.plan.files
            {
                self.recorded[i] = files.recorded(self.workers[i].rank);
            }
        }
        if self.is_agent() {
            if let Some(text) = self.recorded[i].take() {
                output.send(&Up::Recorded {
                    rank: self.workers[i].rank,
                    text,
                });
            }
            // The worker's group, if it went with it, in the same write.
            for group in self.lifeline.take_gone() {
                output.queue(&Up::GroupGone { group });
            }
            output.send(&Up::Exited {
                rank: self.workers[i].rank,
                ending,
            });
            return;
        }
        self.exit_event(i, ending, output);
        // A rank that ended is not up: said at the next scrape, not the next sample's.
        self.next_publish = Instant::now();
        // A rank that mpirun stopped (its relay said so) is not the failure: mpirun's stop is,
        // judged once mpirun has exited (`settle`), when what it said is all in.
        if ending.failed()
            && !self.failed_or_interrupted()
            && !self.mpirun_casualty(self.workers[i].rank)
        {
            self.first_failure = Some(i);
            let w = &self.workers[i];
            let live = self.running.iter().filter(|r| r.ended.is_none()).count();
            // The wait for them is said, and how to end it: a worker that ignores SIGTERM
            // keeps the launcher silent for the whole grace.
            let stopping = match live {
                0 => String::new(),
                1 => format!(
                    "; stopping the other 1 worker (SIGKILL in {:.0?} if it has not exited; \
                     Ctrl-C to kill it now)",
                    self.plan.grace
                ),
                n => format!(
                    "; stopping the other {n} workers (SIGKILL in {:.0?} to those that have \
                     not exited; Ctrl-C to kill them now)",
                    self.plan.grace
                ),
            };
            output.message(&format!(
                "atlasboost: rank {} (host {}, device {}) failed ({}){stopping}",
                w.rank,
                w.host,
                w.device,
                ending.describe(),
            ));
            self.stop(Signal::SIGTERM);
        }
    }

    /// Sends `signal` to every worker (local groups, remote agents), and starts the grace time.
    /// The `worker_exit` event of the worker of `lane`.
    fn exit_event(&self, lane: usize, ending: Ending, output: &mut Output) {
        let w = &self.workers[lane];
        output.event(
            "worker_exit",
            serde_json::json!({
                "rank": w.rank,
                "host": w.host,
                "device": w.device,
                "status": ending.describe(),
                "exit_code": ending.code(),
            }),
        );
    }

    /// Notes when the stop began, once.
    fn begin_stop(&mut self) {
        if self.stopping.is_none() {
            self.stopping = Some((Instant::now(), false));
            self.stop_began = Some(std::time::SystemTime::now());
        }
    }

    fn stop(&mut self, signal: Signal) {
        self.begin_stop();
        self.signal_groups(signal);
        self.signal_remotes(signal);
        if signal == Signal::SIGKILL {
            self.kill_now();
        }
    }

    fn kill_now(&mut self) {
        self.signal_groups(Signal::SIGKILL);
        self.signal_remotes(Signal::SIGKILL);
        self.signal_mpirun(Signal::SIGKILL);
        self.signal_orphans(&orphans(&self.not_orphans()), Signal::SIGKILL);
        self.begin_stop();
        self.stopping = self.stopping.map(|(since, _)| (since, true));
        self.drain_until = Some(Instant::now() + DRAIN_AFTER_KILL);
    }

    /// Signals orphans (not the workers: they are signalled through their groups), each with
    /// the process group it leads or that lives in a session it made (`setsid`): an orphan,
    /// and every process of such a group, descends from the job (its workers, or a helper the
    /// launcher started, such as ssh's `ControlPersist` daemon). SIGTERM goes once to each.
    fn signal_orphans(&mut self, orphans: &[Pid], signal: Signal) {
        let our_session = nix::unistd::getsid(None).ok();
        for &pid in orphans {
            if signal == Signal::SIGTERM && !self.orphans_termed.insert(pid) {
                continue;
            }
            let _ = nix::sys::signal::kill(pid, signal);
            let own_session = |session: Pid| our_session.is_some_and(|ours| ours != session);
            let group = nix::unistd::getpgid(Some(pid)).ok().filter(|&group| {
                group == pid || nix::unistd::getsid(Some(pid)).is_ok_and(own_session)
            });
            if signal != Signal::SIGKILL {
                let _ = nix::sys::signal::kill(pid, Signal::SIGCONT);
            }
            if let Some(group) = group {
                let _ = signal_group(group, signal);
            }
        }
    }

    /// SIGKILL once the grace time is over.
    fn escalate(&mut self) {
        if let Some((since, killed)) = self.stopping
            && policy::must_kill(since.elapsed(), self.grace, killed)
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
                && signal_group(pid, signal) == Err(Errno::ESRCH)
            {
                r.group_gone = true;
                self.lifeline.forget(pid.as_raw());
            }
        }
    }

    /// Marks the groups with no process left (mpirun's too, once it has ended).
    fn check_groups(&mut self) {
        if let Some(m) = &mut self.mpirun
            && let Some(pid) = m.group_just_gone()
        {
            self.lifeline.forget(pid.as_raw());
        }
        // A relay's worker's group outlives its relay only as orphans re-parented here: gone
        // once this process has reaped the last of them. (A relay still connected says when
        // its group is gone: its `Done`.)
        self.probe_relay_groups(false);
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

    /// Forgets the relays' groups that are gone (`killpg(0)` says so): those of lost relays
    /// (which say nothing more), or `all` (a relay's `GroupGone` is the first word, this the
    /// backstop, once a heartbeat). A group never gains members once empty, so this never
    /// forgets one that is not.
    fn probe_relay_groups(&mut self, all: bool) {
        if let Role::Launcher(remotes) = &self.role {
            let lifeline = &mut self.lifeline;
            self.relay_groups.retain(|&(h, group)| {
                let connected = remotes[h].lost.is_none() && remotes[h].out.is_some();
                let gone = (all || !connected) && killpg(group, None) == Err(Errno::ESRCH);
                if gone {
                    lifeline.forget(group.as_raw());
                }
                !gone
            });
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
        // What the console has not taken yet: waited for as long as the rest, no longer. (An
        // agent's or relay's last frame comes after this: it waits for its launcher then.)
        if !self.is_agent() {
            output.drain_console(
                signals.fd(),
                DrainFor::AtMost(Some(DRAIN_AFTER_KILL)),
                &mut || signals.pending().iter().any(|s| *s != Signal::SIGCHLD),
            );
        }
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
                // A worker that could not start failed by itself, whenever that was said.
                stopped: Some(lane) != self.first_failure
                    && self.not_run[lane].is_none()
                    && (matches!((r.ended, self.stopping), (Some((t, _)), Some((since, _))) if t >= since)
                        || self.mpirun_casualty(w.rank)),
                stopped_by_mpirun: self.mpirun_casualty(w.rank),
                tail: output.tail(lane),
                recorded: self.recorded[lane].clone(),
                not_run: self.not_run[lane].clone(),
            })
            .collect();
        let exit_code = match (self.interrupted, &self.host_failure, self.first_failure) {
            (Some(s), _, _) => 128u8.wrapping_add(s as u8),
            _ if self.hang.is_some() || self.dumping.is_some() => HANG_EXIT,
            (None, Some(h), _) => h.code,
            (None, None, Some(i)) => workers[i].ending.map_or(ExitCodes::FAILURE, Ending::code),
            (None, None, None) => ExitCodes::SUCCESS,
        };
        JobResult {
            workers,
            first_failure: self.first_failure,
            host_failure: self.host_failure.clone(),
            interrupted: self.interrupted,
            signalled: self.interrupted.or(self.signalled.map(|(_, s)| s)),
            hang: self
                .hang
                .clone()
                .or_else(|| self.dumping.as_ref().map(|d| d.report.clone())),
            hung_ranks: self.hung_ranks.clone(),
            lost_hosts: match &self.role {
                // Hosts lost only because a host above them was are not left out of a restart.
                // After the launcher's own pause, no host is known to be gone.
                Role::Launcher(_) if self.paused_first() => Vec::new(),
                Role::Launcher(remotes) => remotes
                    .iter()
                    .filter(|r| r.lost.is_some() && r.relay_rank().is_none() && !r.orphaned)
                    .map(|r| r.host.clone())
                    .collect(),
                Role::Agent(_) => Vec::new(),
            },
            stop_began: self.stop_began,
            exit_code,
            launcher_lost: matches!(&self.role, Role::Agent(up) if up.lost),
        }
    }
}

/// Polls session `h`'s output and stderr, while they are open.
fn watch_session<'a>(
    h: usize,
    r: &'a Remote,
    fds: &mut Vec<PollFd<'a>>,
    sources: &mut Vec<Source>,
) {
    if let Some(fd) = &r.out {
        fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
        sources.push(Source::RemoteOut(h));
    }
    if let Some(fd) = &r.err {
        fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
        sources.push(Source::RemoteErr(h));
    }
}

/// Processes whose parent is the launcher, other than `own` (the lifeline, ssh sessions):
/// orphans of the workers' children, since the launcher is their subreaper. Called once every
/// worker has been reaped.
fn orphans(own: &[u32]) -> Vec<Pid> {
    if !has_children() {
        return Vec::new();
    }
    let children = children_of_this_process().unwrap_or_else(|| {
        // Without /proc/<pid>/task/<tid>/children (a kernel without CONFIG_PROC_CHILDREN):
        // every process's parent.
        let me = std::process::id();
        atlasboost::process::pids()
            .filter(|&pid| atlasboost::process::process_stat(pid).is_some_and(|p| p.ppid == me))
            .collect()
    });
    children
        .into_iter()
        .filter(|pid| !own.contains(pid))
        .map(|pid| Pid::from_raw(pid as i32))
        .collect()
}

/// Whether this process has any child, ended or not (one system call, where listing them
/// reads `/proc`: a relay whose worker left nothing behind asks at every pass of its end).
fn has_children() -> bool {
    use nix::libc;
    let any_change = libc::WEXITED | libc::WSTOPPED | libc::WCONTINUED;
    !matches!(peek_child(libc::P_ALL, 0, any_change), Err(Errno::ECHILD))
}

/// `waitid` of the children `idtype`/`id` name for the state changes in `changes`, without
/// waiting and without collecting one (`WNOHANG | WNOWAIT`): what it wrote (`si_pid` 0 when
/// no change is there yet), or its error (`ECHILD`: no such child).
fn peek_child(
    idtype: nix::libc::idtype_t,
    id: nix::libc::id_t,
    changes: nix::libc::c_int,
) -> Result<nix::libc::siginfo_t, Errno> {
    use nix::libc;
    // SAFETY: an all-zero siginfo_t is a valid value; waitid only writes the one it is given.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above. WNOWAIT leaves any child's state to be collected as before.
    let asked = unsafe {
        libc::waitid(
            idtype,
            id,
            &mut info,
            changes | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    Errno::result(asked).map(|_| info)
}

/// This process's children, from the kernel's list of each thread's children (a few reads,
/// where scanning every process's parent costs a read per process on the machine).
fn children_of_this_process() -> Option<Vec<u32>> {
    let mut children = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let path = task.ok()?.path().join("children");
        let list = std::fs::read_to_string(path).ok()?;
        children.extend(
            list.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
    }
    Some(children)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_launcher_refuses_to_run_beside_other_threads() {
        // The test harness runs this on a thread of its own, beside its main thread: exactly
        // what a program embedding the launcher would do. Nothing is blocked before the check.
        match Signals::block() {
            Err(CliError::NotAlone { threads }) => assert!(threads > 1),
            other => panic!("expected NotAlone, got {other:?}"),
        }
    }
}
