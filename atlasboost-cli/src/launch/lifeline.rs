//! The lifeline: a small process (the guard) that outlives the launcher and stops the job's
//! process groups when the launcher dies, however it dies (SPEC §6 "Lifetime").
//!
//! `PR_SET_PDEATHSIG` kills each worker with its launcher, but not the worker's own children.
//! The guard holds the read end of a pipe whose write end only the launcher has: the launcher
//! tells it `+<pgid>` for each worker's process group and `-<pgid>` once that group is gone.
//! When the pipe closes (the launcher exited, or was killed with `kill -9`), the guard sends
//! SIGKILL to every group it still knows, and exits. It runs in a process group of its own, so
//! a Ctrl-C on the terminal or a `kill` of the launcher's group does not reach it.
//!
//! A remote agent's guard also watches the agent's channel to its launcher (its stdout, to
//! sshd): when the other end closes (the launcher gave the host up, or died: its ssh session
//! ended), the agent stops its workers itself (SIGTERM, SIGKILL a second later) and exits,
//! closing the lifeline. If the lifeline is still open `UPSTREAM_GONE_WAIT_MS` (6 s) later,
//! the agent hangs (stopped, deadlocked), and the guard stops the groups as if it had died:
//! its workers would otherwise run on after the job.
//!
//! Where this process can make one, the workers also run in a cgroup of their own
//! ([`WorkerCgroup`]): the guard then also writes `cgroup.kill`, which ends what left the
//! workers' groups (`setsid`, a daemon) too, and removes the cgroup. Last, it removes the
//! supervisor's directory of rank files (heartbeats, failure records), which a launcher or
//! agent that was killed could not.
//!
//! The guard is a fork of the launcher that never execs: starting it costs a fork, not the
//! start of a program (under the Python package a program is an interpreter). The relays of
//! `run --mpi` on the launcher's host have none: the launcher's guard is theirs
//! ([`prepare_below_launcher`]); relays elsewhere have their own. A fork of a process that may have
//! threads (a driver library's) may only do what is async-signal-safe, so the guard does no
//! allocation and takes no lock: raw `read(2)` into a buffer on its stack, a table of groups
//! allocated before the fork, `killpg(2)` and `_exit(2)`.

mod cgroup;

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::libc;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::resource::{Resource, getrlimit, setrlimit};
use nix::sys::signal::{Signal, killpg};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork};

pub use self::cgroup::{WorkerCgroup, enter as enter_cgroup};
use crate::error::CliError;

/// The most process groups one guard keeps at once (far more than the workers of one host);
/// the table is allocated before the fork, since the guard may not allocate.
const MAX_GROUPS: usize = 1 << 16;

/// The launcher's limit of open files before [`raise_fd_limit`].
pub(crate) static ORIGINAL_FD_LIMIT: OnceLock<(u64, u64)> = OnceLock::new();

/// Raises the launcher's soft limit of open files to the hard limit (every worker takes two
/// pipes, so many local ranks would hit a soft limit of 1,024); workers get the original back.
fn raise_fd_limit() {
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
        && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok()
    {
        let _ = ORIGINAL_FD_LIMIT.set((soft, hard));
    }
}

/// What every process that starts workers does first (the launcher, a remote agent, a relay):
/// raise the soft limit of open files (every worker takes two pipes), become the subreaper of
/// the workers' orphans (re-parented here, to be reaped or stopped), make the workers' cgroup
/// where it can and is wanted, and start the lifeline, whose guard removes `scratch` (the rank
/// files' directory) when this process is gone.
///
/// # Errors
///
/// The lifeline's, when its guard cannot be started; a malformed `ATLASBOOST_CGROUP`.
pub fn prepare(
    cgroup: CgroupWanted,
    upstream: Option<BorrowedFd<'_>>,
    scratch: Option<&Path>,
) -> Result<Lifeline, CliError> {
    let cgroup = prepare_process(cgroup)?;
    Lifeline::start(cgroup, upstream, scratch)
}

/// [`prepare`] for a relay of `run --mpi` below the launcher (mpirun, the launcher's child,
/// started it on the launcher's own host): no guard of its own, unless `ATLASBOOST_CGROUP=1`
/// made it a cgroup, which only a guard can end. Its worker dies with it (`PR_SET_PDEATHSIG`);
/// what the worker started in its group is re-parented to the launcher, a subreaper, which
/// stops it; and if the launcher dies too, the launcher's guard stops that group, which the
/// relay reports ([`Lifeline::guarded_above`]). A guard is a fork per rank on the launch's
/// path, which this spares.
///
/// # Errors
///
/// As [`prepare`].
pub fn prepare_below_launcher() -> Result<Lifeline, CliError> {
    match prepare_process(CgroupWanted::ByDefault(false))? {
        Ok(cgroup) => Lifeline::start(Ok(cgroup), None, None),
        Err(why) => Ok(Lifeline {
            guard: None,
            pipe: None,
            reaped: false,
            cgroup: Err(why),
            above: true,
            gone: Vec::new(),
        }),
    }
}

/// [`prepare`] for the launcher of `run --mpi`, whose guard [`Lifeline::start_guard`] starts
/// once mpirun has been: the fork then runs beside mpirun's start instead of before it. Until
/// then mpirun is watched by its `PR_SET_PDEATHSIG` alone, which suffices: it has started
/// nothing yet.
///
/// # Errors
///
/// As [`prepare`].
pub fn prepare_guard_later() -> Result<Lifeline, CliError> {
    Ok(Lifeline {
        guard: None,
        pipe: None,
        reaped: false,
        cgroup: prepare_process(CgroupWanted::NoWorkers)?,
        above: false,
        gone: Vec::new(),
    })
}

/// [`prepare`]'s steps before the guard: the limit of open files, the subreaper, the cgroup
/// (or why there is none).
fn prepare_process(cgroup: CgroupWanted) -> Result<Result<WorkerCgroup, String>, CliError> {
    raise_fd_limit();
    let _ = nix::sys::prctl::set_child_subreaper(true);
    Ok(match cgroup {
        CgroupWanted::NoWorkers => {
            // Still read: the relays get it, and a bad value is named once, here.
            WorkerCgroup::asked()?;
            Err("mpirun starts the workers".into())
        }
        CgroupWanted::ByDefault(default) => WorkerCgroup::for_workers(default)?,
    })
}

/// Whether [`prepare`] makes the workers' cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupWanted {
    /// This process starts no workers (the launcher of `run --mpi`).
    NoWorkers,
    /// As `ATLASBOOST_CGROUP` says (`1` or `0`), else this: on for the launcher, the agents
    /// and the relays of `run --mpi` on other hosts; off for the relays below the launcher,
    /// where every launch would wait once more for the kernel's migration lock and the
    /// launcher adopts what their workers leave (docs/launching.md, "Nothing outlives the
    /// job").
    ByDefault(bool),
}

/// How long a remote agent's guard gives the agent, once its channel up has closed, to stop
/// its workers and exit (it takes about a second) before taking it for hung.
const UPSTREAM_GONE_WAIT_MS: i64 = 6_000;

/// How long [`Lifeline::close`] waits for the guard to exit before it kills it.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// The launcher's end of the lifeline.
#[derive(Debug)]
pub struct Lifeline {
    /// `None` below the launcher ([`prepare_below_launcher`]), or not yet started
    /// ([`prepare_guard_later`]).
    guard: Option<Pid>,
    pipe: Option<File>,
    reaped: bool,
    /// The workers' cgroup, or why there is none.
    cgroup: Result<WorkerCgroup, String>,
    /// A relay's below the launcher, whose guard is the launcher's ([`prepare_below_launcher`]).
    above: bool,
    /// Such a relay's groups gone since [`Lifeline::take_gone`], to be told to the launcher.
    gone: Vec<i32>,
}

impl Lifeline {
    /// Starts the guard process (a fork of this one), which ends `cgroup` too, if there is one,
    /// removes `scratch` (a directory of files only), and also acts when `upstream` (a remote
    /// agent's channel to its launcher, written to) reports its reader gone.
    ///
    /// # Errors
    ///
    /// [`CliError::Failure`] if the pipe or the fork fails.
    pub fn start(
        cgroup: Result<WorkerCgroup, String>,
        upstream: Option<BorrowedFd<'_>>,
        scratch: Option<&Path>,
    ) -> Result<Lifeline, CliError> {
        let (guard, pipe) = fork_guard(&cgroup, upstream, scratch)?;
        Ok(Lifeline {
            guard: Some(guard),
            pipe: Some(pipe),
            reaped: false,
            cgroup,
            above: false,
            gone: Vec::new(),
        })
    }

    /// Starts the guard of a lifeline made by [`prepare_guard_later`] (once; later calls do
    /// nothing).
    ///
    /// # Errors
    ///
    /// As [`Lifeline::start`].
    pub fn start_guard(&mut self) -> Result<(), CliError> {
        if self.guard.is_none() && !self.above {
            let (guard, pipe) = fork_guard(&self.cgroup, None, None)?;
            self.guard = Some(guard);
            self.pipe = Some(pipe);
        }
        Ok(())
    }

    /// The guard's pid (the supervisor reaps it like any child), if there is one.
    pub fn pid(&self) -> Option<u32> {
        self.guard.map(|g| g.as_raw() as u32)
    }

    /// Whether the launcher's guard, not one of this process's, is to stop the workers' groups
    /// if this process dies: they are to be told to it ([`prepare_below_launcher`]).
    pub fn guarded_above(&self) -> bool {
        self.above
    }

    /// The workers' cgroup's `cgroup.procs`, which each worker writes between its fork and its
    /// exec ([`enter_cgroup`]); `None` without a cgroup.
    pub fn cgroup_procs(&self) -> Option<RawFd> {
        self.cgroup.as_ref().ok().map(WorkerCgroup::procs)
    }

    /// Where the workers' cgroup is, or why there is none (for `-v`).
    pub fn cgroup_note(&self) -> String {
        match &self.cgroup {
            Ok(c) => format!("the workers' cgroup is {}", c.path().display()),
            Err(why) => format!(
                "no cgroup for the workers ({why}): a process that leaves its worker's process \
                 group (setsid, a daemon) is not stopped if atlasboost is killed with kill -9"
            ),
        }
    }

    /// The guard is to stop this process group if the launcher dies.
    pub fn watch(&mut self, pgid: i32) {
        self.say(&format!("+{pgid}\n"));
    }

    /// This process group is gone: the guard must never signal it (its id may be reused).
    /// Below the launcher, the launcher is to be told ([`Lifeline::take_gone`]).
    pub fn forget(&mut self, pgid: i32) {
        if self.above {
            self.gone.push(pgid);
        }
        self.say(&format!("-{pgid}\n"));
    }

    /// The groups gone since the last call, which a relay below the launcher tells the
    /// launcher at once (its guard still lists them).
    pub fn take_gone(&mut self) -> Vec<i32> {
        std::mem::take(&mut self.gone)
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

    /// The supervisor reaped the guard (it died early): nothing to wait for.
    pub fn reaped(&mut self) {
        self.reaped = true;
    }

    /// Closes the lifeline after a clean end (every group forgotten); the guard exits.
    pub fn close(mut self) {
        self.pipe = None;
        let Some(guard) = self.guard.filter(|_| !self.reaped) else {
            return;
        };
        // The guard exits as soon as it reads the end of the pipe. Bounded all the same: a
        // guard that somehow still holds the pipe's other end would never see it.
        let until = Instant::now() + CLOSE_WAIT;
        loop {
            match waitpid(guard, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => break,
                Err(Errno::EINTR) => {}
                // Exited, or already reaped by the supervisor (ECHILD).
                _ => return,
            }
        }
        // It is alive, and only this thread reaps it: its pid cannot be taken by another
        // process while its pidfd is opened.
        if let Some(exited) = exit_within(guard, CLOSE_WAIT) {
            if !exited {
                let _ = nix::sys::signal::kill(guard, Signal::SIGKILL);
            }
            let _ = waitpid(guard, None);
            return;
        }
        // No pidfd (a kernel before 5.3): look again and again, briefly.
        loop {
            match waitpid(guard, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) if Instant::now() < until => {
                    std::thread::sleep(Duration::from_micros(200));
                }
                Ok(WaitStatus::StillAlive) => {
                    let _ = nix::sys::signal::kill(guard, Signal::SIGKILL);
                    let _ = waitpid(guard, None);
                    return;
                }
                Err(Errno::EINTR) => {}
                // Exited, or already reaped by the supervisor (ECHILD).
                _ => return,
            }
        }
    }
}

/// Forks the guard (see [`Lifeline::start`]): its pid and the lifeline's write end.
fn fork_guard(
    cgroup: &Result<WorkerCgroup, String>,
    upstream: Option<BorrowedFd<'_>>,
    scratch: Option<&Path>,
) -> Result<(Pid, File), CliError> {
    let failed = |step: &'static str, e: Errno| CliError::Lifeline {
        step,
        source: e.into(),
    };
    let (read, write) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| failed("no pipe", e))?;
    let null = nix::fcntl::open(
        "/dev/null",
        nix::fcntl::OFlag::O_WRONLY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| failed("cannot open /dev/null", e))?;
    let mut groups: Vec<i32> = Vec::with_capacity(MAX_GROUPS);
    // Made before the fork, since the guard may not allocate. A path from the environment
    // holds no NUL byte, so `None` here only ever means no directory was given.
    let scratch = scratch.and_then(|p| CString::new(p.as_os_str().as_bytes()).ok());
    // The descriptors open now, listed before the fork, since the guard may not read a
    // directory: it closes them all but its pipe (see `guard`).
    let open: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")
        .map(|dir| {
            dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    // SAFETY: the child runs only `guard`, which calls async-signal-safe functions and
    // never returns (it ends in `_exit`), so it is sound in a process with other threads.
    match unsafe { fork() }.map_err(|e| failed("fork", e))? {
        ForkResult::Child => {
            let cgroup = cgroup
                .as_ref()
                .ok()
                .map(|c| (c.kill_file(), c.dir(), c.own_procs()));
            let scratch = scratch.as_deref();
            guard(&read, &null, &open, &mut groups, cgroup, upstream, scratch)
        }
        ForkResult::Parent { child } => Ok((child, File::from(write))),
    }
}

/// The monotonic clock, in milliseconds (`clock_gettime` is async-signal-safe).
fn monotonic_ms() -> i64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime(2) writes the time into `t`, which this function owns.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec * 1000 + t.tv_nsec / 1_000_000
}

/// Waits up to `limit` for the child `pid` to exit, without reaping it, on a pidfd: whether it
/// did; `None` where the kernel has no pidfd. Sleeping between looks would cost every launch
/// (and every relay of `--mpi`) the length of a sleep at its end.
fn exit_within(pid: Pid, limit: Duration) -> Option<bool> {
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new descriptor, or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: the descriptor was just opened, and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    let until = Instant::now() + limit;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        let timeout = PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX);
        match poll(&mut [PollFd::new(fd.as_fd(), PollFlags::POLLIN)], timeout) {
            Ok(0) => return Some(false),
            Ok(_) => return Some(true),
            Err(Errno::EINTR) => {}
            Err(_) => return None,
        }
    }
}

/// The guard: reads `+pgid`/`-pgid` lines from `pipe` until it closes, then SIGKILLs every
/// group still listed, and the workers' cgroup (its `cgroup.kill` and directory), which it then
/// removes, then removes `scratch`, and exits. `open` lists the launcher's descriptors at the
/// fork, all of which it closes (the pipe's other end among them). Only async-signal-safe calls
/// (see the module's docs).
fn guard(
    pipe: &OwnedFd,
    null: &OwnedFd,
    open: &[RawFd],
    groups: &mut Vec<i32>,
    cgroup: Option<(BorrowedFd<'_>, &CStr, BorrowedFd<'_>)>,
    upstream: Option<BorrowedFd<'_>>,
    scratch: Option<&CStr>,
) -> ! {
    // SAFETY (whole function): raw system calls on descriptors this process owns; no
    // allocation (`groups` never grows beyond the capacity it was given), no locks.
    unsafe {
        // Only the pipe ends it: not the terminal's Ctrl-C, not a signal to the launcher's
        // group, not the launcher's blocked mask.
        libc::setpgid(0, 0);
        let mut ignore: libc::sigaction = std::mem::zeroed();
        ignore.sa_sigaction = libc::SIG_IGN;
        for s in [
            libc::SIGINT,
            libc::SIGTERM,
            libc::SIGHUP,
            libc::SIGQUIT,
            libc::SIGPIPE,
        ] {
            libc::sigaction(s, &ignore, std::ptr::null_mut());
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        // A copy of the upstream channel, on a number no descriptor listed at the fork has
        // (it is kept below when the others are closed); -1 without one.
        let watched = upstream.map_or(-1, |u| libc::fcntl(u.as_raw_fd(), libc::F_DUPFD, 3));
        // Nothing of the launcher's stays open here: its sockets and pipes must close when it
        // dies (a reader waiting for their end would wait for the guard), and stdout must not
        // keep a `| head` open. stderr stays, for nothing (the guard says nothing). With a
        // cgroup, stdout is its own cgroup's `cgroup.procs` instead (written once, below) and
        // stderr the workers' cgroup's `cgroup.kill`.
        libc::dup2(pipe.as_raw_fd(), 0);
        libc::dup2(null.as_raw_fd(), 1);
        if let Some((kill, _, own)) = cgroup {
            libc::dup2(own.as_raw_fd(), 1);
            libc::dup2(kill.as_raw_fd(), 2);
        }
        // Every descriptor listed at the fork (the pipe's write end among them: left open, it
        // would keep the guard from ever seeing the launcher go), then anything a thread
        // opened since, where the kernel has close_range (5.9 on).
        for &fd in open.iter().filter(|fd| **fd > 2 && **fd != watched) {
            libc::close(fd);
        }
        match watched {
            -1 => {
                libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
            }
            w => {
                let w = w as u32;
                if w > 3 {
                    libc::syscall(libc::SYS_close_range, 3u32, w - 1, 0u32);
                }
                libc::syscall(libc::SYS_close_range, w + 1, u32::MAX, 0u32);
            }
        }
        if cgroup.is_some() {
            // Into the cgroup it is in already: no move, only the migration lock taken (see
            // `WorkerCgroup::own_procs`), after which the workers enter theirs quickly.
            libc::write(1, b"0".as_ptr().cast(), 1);
        }
        libc::prctl(
            libc::PR_SET_NAME,
            c"ab-guard".as_ptr() as libc::c_ulong,
            0,
            0,
            0,
        );
        let mut buf = [0u8; 4096];
        // The line being read: its sign and number so far.
        let (mut sign, mut number, mut valid) = (0u8, 0i64, true);
        // Once the upstream's reader is gone (POLLERR on a pipe, POLLHUP on a socket; nothing
        // is ever read from it): when the agent must have closed the lifeline by (ms, on the
        // monotonic clock).
        let mut upstream_gone_by: Option<i64> = None;
        loop {
            if watched >= 0 {
                let now = monotonic_ms();
                let timeout = match upstream_gone_by {
                    Some(by) if now >= by => break,
                    Some(by) => (by - now).min(i64::from(i32::MAX)) as i32,
                    None => -1,
                };
                let mut fds = [
                    libc::pollfd {
                        fd: 0,
                        events: libc::POLLIN,
                        revents: 0,
                    },
                    libc::pollfd {
                        // Ignored (a negative fd) once gone: it would report so again and again.
                        fd: if upstream_gone_by.is_some() {
                            -1
                        } else {
                            watched
                        },
                        events: 0,
                        revents: 0,
                    },
                ];
                if libc::poll(fds.as_mut_ptr(), 2, timeout) < 0 {
                    if Errno::last() == Errno::EINTR {
                        continue;
                    }
                    break;
                }
                if upstream_gone_by.is_none()
                    && fds[1].revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0
                {
                    upstream_gone_by = Some(now + UPSTREAM_GONE_WAIT_MS);
                }
                if fds[0].revents == 0 {
                    continue;
                }
            }
            let n = libc::read(0, buf.as_mut_ptr().cast(), buf.len());
            if n < 0 && Errno::last() == Errno::EINTR {
                continue;
            }
            if n <= 0 {
                break;
            }
            for &b in &buf[..n as usize] {
                match b {
                    b'\n' => {
                        if valid && number > 1 && number <= i64::from(i32::MAX) {
                            let pgid = number as i32;
                            if sign == b'+' {
                                if groups.len() < groups.capacity() {
                                    groups.push(pgid);
                                }
                            } else if sign == b'-'
                                && let Some(i) = groups.iter().position(|g| *g == pgid)
                            {
                                groups.swap_remove(i);
                            }
                        }
                        (sign, number, valid) = (0, 0, true);
                    }
                    b'+' | b'-' if sign == 0 => sign = b,
                    b'0'..=b'9' if sign != 0 => {
                        number = number
                            .saturating_mul(10)
                            .saturating_add(i64::from(b - b'0'));
                    }
                    _ => valid = false,
                }
            }
        }
        for &pgid in groups.iter() {
            let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
        }
        if let Some((_, dir, _)) = cgroup {
            // Everything in it, in one step (after a clean end it is empty). Its processes
            // take a moment to go; until then rmdir says EBUSY. Bounded: 1 s.
            libc::write(2, b"1".as_ptr().cast(), 1);
            for _ in 0..200 {
                if libc::rmdir(dir.as_ptr()) == 0 || Errno::last() != Errno::EBUSY {
                    break;
                }
                let pause = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 5_000_000,
                };
                libc::nanosleep(&pause, std::ptr::null_mut());
            }
        }
        if let Some(dir) = scratch {
            remove_files_and_dir(dir);
        }
        libc::_exit(0)
    }
}

/// Removes the files in `dir`, then `dir`, with async-signal-safe calls only (the guard's):
/// `getdents64` into a buffer on the stack, `unlinkat`, `rmdir`. A worker that was still dying
/// may create a file meanwhile (a last heartbeat): then once more, at most three times.
///
/// # Safety
///
/// Raw system calls on a descriptor this function opens and closes; nothing else.
unsafe fn remove_files_and_dir(dir: &CStr) {
    // Where a `linux_dirent64`'s record length and name start.
    const RECLEN_AT: usize = 16;
    const NAME_AT: usize = 19;
    for _ in 0..3 {
        // SAFETY: see the function's docs.
        unsafe {
            let fd = libc::open(
                dir.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            );
            if fd < 0 {
                return;
            }
            let mut buf = [0u8; 4096];
            loop {
                let n = libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len());
                if n <= 0 {
                    break;
                }
                let n = n as usize;
                let mut at = 0;
                // A record is at least 24 bytes (8-aligned), so its first three name bytes
                // are inside it.
                while at + NAME_AT + 3 <= n {
                    let reclen = usize::from(u16::from_ne_bytes([
                        buf[at + RECLEN_AT],
                        buf[at + RECLEN_AT + 1],
                    ]));
                    let name = &buf[at + NAME_AT..at + NAME_AT + 3];
                    let dots = name[0] == b'.' && (name[1] == 0 || name[1] == b'.' && name[2] == 0);
                    if !dots {
                        libc::unlinkat(fd, buf.as_ptr().add(at + NAME_AT).cast(), 0);
                    }
                    if reclen == 0 {
                        break;
                    }
                    at += reclen;
                }
            }
            libc::close(fd);
            if libc::rmdir(dir.as_ptr()) == 0 || Errno::last() != Errno::ENOTEMPTY {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closing_the_lifeline_reaps_its_guard() {
        let lifeline = Lifeline::start(Err("not wanted here".into()), None, None).unwrap();
        let guard = lifeline.guard;
        lifeline.close();
        // Reaped by close: no longer a child of this process, not even a zombie.
        assert_eq!(
            waitpid(guard, Some(WaitPidFlag::WNOHANG)),
            Err(Errno::ECHILD)
        );
    }

    #[test]
    fn the_guard_removes_the_scratch_directory_and_every_file_in_it() {
        let parent = tempfile::tempdir().unwrap();
        let scratch = parent.path().join("atlasboost-job-1");
        std::fs::create_dir(&scratch).unwrap();
        // More names than one `getdents64` buffer (4 KiB) holds, and names that begin with dots.
        for i in 0..300 {
            std::fs::write(scratch.join(format!("rank.{i}.beat")), b"1 2\n").unwrap();
        }
        for name in [".hidden", "..x", ".a"] {
            std::fs::write(scratch.join(name), b"").unwrap();
        }
        let lifeline =
            Lifeline::start(Err("not wanted here".into()), None, Some(&scratch)).unwrap();
        // As when the launcher is killed: the pipe closes, and the guard cleans up.
        lifeline.close();
        assert!(
            !scratch.exists(),
            "{:?}",
            std::fs::read_dir(&scratch).map(|d| d.count())
        );
        assert!(
            parent.path().exists(),
            "only the scratch directory is removed"
        );
    }

    #[test]
    fn exit_within_tells_a_living_child_from_one_that_exited() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = Pid::from_raw(child.id() as i32);
        assert_eq!(
            exit_within(pid, Duration::from_millis(50)),
            Some(false),
            "sleep 30 is still running"
        );
        child.kill().unwrap();
        assert_eq!(exit_within(pid, Duration::from_secs(10)), Some(true));
        // Not reaped by exit_within: the exit status is still there.
        assert!(child.wait().is_ok());
    }
}
