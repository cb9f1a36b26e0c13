//! Helpers for atlasboost's end-to-end tests: find the real `atlasboost` binary, run it with a
//! hard time limit, and look at the processes it leaves (or must not leave) behind.
//!
//! Every wait here is bounded: a launcher that does not finish in time is killed (SIGKILL, so
//! its lifeline stops its workers) and the test panics with what it printed so far.
#![deny(missing_docs)]

use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The variable every launch started by [`Run`] carries in its own environment (and so does
/// everything it starts: the lifeline, the workers, their children), with a value unique to
/// that launch. [`pids_with_env`] finds the launch's processes by it.
pub const LAUNCH_MARK: &str = "ATLASBOOST_E2E_LAUNCH";

/// How long a launch may take unless the test says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// How much of each stream a panic message shows (the end of it).
const SHOWN_BYTES: usize = 4000;

/// The one list of what a hermetic test removes from a started program's environment
/// (`tests/hermetic-env.txt`, which the Python tests read too): other launchers' variables,
/// atlasboost's own settings, and what the launcher sets for workers "unless set", so that
/// the test machine's environment cannot change what the tests see.
const HERMETIC_LIST: &str = include_str!("hermetic-env.txt");

/// Whether a hermetic test removes `name` from a started program's environment.
pub fn is_hermetic(name: &str) -> bool {
    HERMETIC_LIST
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .any(|l| match l.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => name == l,
        })
}

/// The `atlasboost` binary under test: `$ATLASBOOST_BIN`, else the one cargo built next to
/// this test executable (`target/<profile>/atlasboost`). `cargo test --workspace` builds it
/// before running any test, because `atlasboost-cli` has integration tests of its own.
///
/// # Panics
///
/// When there is no binary, with the command that builds it.
pub fn atlasboost_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("ATLASBOOST_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    // target/<profile>/deps/e2e-<hash> -> target/<profile>/atlasboost
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join("atlasboost"))
        .unwrap_or_default();
    assert!(
        bin.is_file(),
        "no atlasboost binary at {}: run `cargo build -p atlasboost-cli` first, or set ATLASBOOST_BIN",
        bin.display()
    );
    bin
}

/// The example worker that calls `init()` (`examples/init_worker.rs`), which `cargo test`
/// builds into `target/<profile>/examples/` (with MPI support: `cargo build -p
/// atlasboost-examples --examples --features mpi`).
///
/// # Panics
///
/// When it has not been built, with the command that builds it.
pub fn init_worker_bin() -> PathBuf {
    let bin = atlasboost_bin()
        .with_file_name("examples")
        .join("init-worker");
    assert!(
        bin.is_file(),
        "no init-worker at {}: run `cargo build -p atlasboost-examples --examples` first",
        bin.display()
    );
    bin
}

/// A file of the repository's `examples/` directory, e.g. `example("train.py")`.
pub fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("examples")
        .join(name)
}

/// A string no other test (thread or process) of this machine uses: for markers and names.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    format!(
        "{prefix}-{}-{}-{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Polls `done` every 10 ms until it is true or `timeout` has passed; true if it became true.
pub fn wait_until(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The last [`SHOWN_BYTES`] of `bytes`, as text, for panic messages.
fn shown(bytes: &[u8]) -> String {
    let start = bytes.len().saturating_sub(SHOWN_BYTES);
    let text = String::from_utf8_lossy(&bytes[start..]);
    if start > 0 {
        format!("[... {start} bytes before ...]{text}")
    } else {
        text.into_owned()
    }
}

/// One launch of `atlasboost` to be started: its arguments, environment, working directory (a
/// fresh temporary directory) and time limit.
#[derive(Debug)]
pub struct Run {
    /// The program: `None` is atlasboost.
    program: Option<PathBuf>,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    dir: tempfile::TempDir,
    timeout: Duration,
    mark: String,
    /// Give the launcher a non-blocking stdout pipe, read only after this long.
    nonblocking_stdout: Option<Duration>,
}

impl Run {
    /// `atlasboost ARGS...` (give `run` yourself), in a new temporary directory.
    ///
    /// # Panics
    ///
    /// If the temporary directory cannot be made.
    pub fn new<I, S>(args: I) -> Run
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        Run {
            program: None,
            args: args.into_iter().map(|a| a.as_ref().to_owned()).collect(),
            env: Vec::new(),
            dir: tempfile::Builder::new()
                .prefix("atlasboost-e2e-")
                .tempdir()
                .unwrap_or_else(|e| panic!("cannot make a temporary directory: {e}")),
            timeout: DEFAULT_TIMEOUT,
            mark: unique("launch"),
            nonblocking_stdout: None,
        }
    }

    /// Runs `program` (with the arguments given to [`Run::new`]) instead of atlasboost, with
    /// the same limits, environment clean-up and collection of output.
    #[must_use]
    pub fn program(mut self, program: impl Into<PathBuf>) -> Run {
        self.program = Some(program.into());
        self
    }

    /// Adds arguments.
    #[must_use]
    pub fn args<I, S>(mut self, args: I) -> Run
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Sets a variable in the launcher's environment.
    #[must_use]
    pub fn env(mut self, name: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Run {
        self.env
            .push((name.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    /// The time limit of the whole launch (default [`DEFAULT_TIMEOUT`]).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Run {
        self.timeout = timeout;
        self
    }

    /// Makes the launcher's stdout a small pipe in non-blocking mode (`O_NONBLOCK`, as a
    /// parent process may leave it), which the test starts reading only after `lag`: the
    /// launcher meets a full pipe (`EAGAIN`) and must still deliver every byte.
    #[must_use]
    pub fn nonblocking_stdout(mut self, lag: Duration) -> Run {
        self.nonblocking_stdout = Some(lag);
        self
    }

    /// The launch's working directory (a temporary directory, removed with the result).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The value of [`LAUNCH_MARK`] in this launch's environment.
    pub fn mark(&self) -> &str {
        &self.mark
    }

    /// Writes `name` (relative to [`Run::dir`]) with `contents`, executable if asked; returns
    /// its absolute path.
    ///
    /// # Panics
    ///
    /// If the file cannot be written.
    pub fn file(&self, name: &str, contents: impl AsRef<[u8]>, executable: bool) -> PathBuf {
        let path = self.dir.path().join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .unwrap_or_else(|e| panic!("cannot create {}: {e}", parent.display()));
        }
        std::fs::write(&path, contents)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        let mode = if executable { 0o755 } else { 0o644 };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
            .unwrap_or_else(|e| panic!("cannot chmod {}: {e}", path.display()));
        path
    }

    /// Starts the launcher: stdin closed, stdout and stderr collected by threads.
    ///
    /// # Panics
    ///
    /// If it cannot be started.
    pub fn spawn(self) -> Launch {
        let program = self.program.clone().unwrap_or_else(atlasboost_bin);
        let mut cmd = Command::new(&program);
        cmd.args(&self.args)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut lagging_stdout = None;
        if let Some(lag) = self.nonblocking_stdout {
            let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC)
                .unwrap_or_else(|e| panic!("cannot make a pipe: {e}"));
            let _ = fcntl(&write, FcntlArg::F_SETPIPE_SZ(4096));
            fcntl(&write, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))
                .unwrap_or_else(|e| panic!("cannot make the pipe non-blocking: {e}"));
            cmd.stdout(Stdio::from(write));
            lagging_stdout = Some((std::fs::File::from(read), lag));
        }
        for (name, _) in std::env::vars_os() {
            if name.to_str().is_some_and(is_hermetic) {
                cmd.env_remove(name);
            }
        }
        cmd.env(LAUNCH_MARK, &self.mark);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let described = format!(
            "{} {}",
            program
                .file_name()
                .map_or_else(|| program.to_string_lossy(), |n| n.to_string_lossy()),
            self.args
                .iter()
                .map(|a| a.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" ")
        );
        let started = Instant::now();
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {described}: {e}"));
        // The child has its ends of the pipes: close ours, so that their ends are the child's.
        drop(cmd);
        let Some(stderr) = child.stderr.take() else {
            unreachable!("stderr is piped");
        };
        let out = match (lagging_stdout, child.stdout.take()) {
            (Some((read, lag)), _) => Collector::start_after(read, lag),
            (None, Some(stdout)) => Collector::start(stdout),
            (None, None) => unreachable!("stdout is piped"),
        };
        let err = Collector::start(stderr);
        Launch {
            child: Some(child),
            status: None,
            out,
            err,
            dir: Some(self.dir),
            started,
            timeout: self.timeout,
            described,
            mark: self.mark,
        }
    }

    /// Starts the launcher and waits (bounded by its time limit) until it has finished.
    pub fn run(self) -> Finished {
        self.spawn().wait()
    }
}

/// A thread that reads a pipe to its end into a shared buffer.
#[derive(Debug)]
struct Collector {
    buf: Arc<Mutex<Vec<u8>>>,
    done: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Collector {
    fn start(pipe: impl Read + Send + 'static) -> Collector {
        Collector::start_after(pipe, Duration::ZERO)
    }

    /// Starts reading only after `lag` (to make the writer meet a full pipe).
    fn start_after(mut pipe: impl Read + Send + 'static, lag: Duration) -> Collector {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let done = Arc::new(AtomicBool::new(false));
        let (b, d) = (Arc::clone(&buf), Arc::clone(&done));
        let thread = std::thread::spawn(move || {
            std::thread::sleep(lag);
            let mut chunk = vec![0u8; 1 << 16];
            loop {
                match pipe.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => b
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .extend_from_slice(&chunk[..n]),
                }
            }
            d.store(true, Ordering::SeqCst);
        });
        Collector {
            buf,
            done,
            thread: Some(thread),
        }
    }

    fn snapshot(&self) -> Vec<u8> {
        self.buf.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn is_done(&self) -> bool {
        self.done.load(Ordering::SeqCst)
    }

    fn take(&mut self) -> Vec<u8> {
        if self.is_done()
            && let Some(t) = self.thread.take()
        {
            let _ = t.join();
        }
        std::mem::take(&mut *self.buf.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// A running launcher. Dropping it (a test that panics) kills it with SIGKILL, so that its
/// lifeline stops the workers.
#[derive(Debug)]
pub struct Launch {
    child: Option<Child>,
    status: Option<ExitStatus>,
    out: Collector,
    err: Collector,
    dir: Option<tempfile::TempDir>,
    started: Instant,
    timeout: Duration,
    described: String,
    mark: String,
}

impl Launch {
    /// The launcher's process id.
    pub fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }

    /// The value of [`LAUNCH_MARK`] in this launch's environment.
    pub fn mark(&self) -> &str {
        &self.mark
    }

    /// The launch's working directory.
    pub fn dir(&self) -> &Path {
        self.dir
            .as_ref()
            .map_or(Path::new("/nonexistent"), |d| d.path())
    }

    /// Sends `signal` to the launcher (only to it, not to its group).
    ///
    /// # Panics
    ///
    /// If the launcher has already been reaped.
    pub fn signal(&self, signal: Signal) {
        assert!(self.status.is_none(), "the launcher has already exited");
        kill(Pid::from_raw(self.pid()), signal)
            .unwrap_or_else(|e| panic!("cannot send {signal} to the launcher: {e}"));
    }

    /// Its stdout so far.
    pub fn stdout(&self) -> Vec<u8> {
        self.out.snapshot()
    }

    /// Its stderr so far.
    pub fn stderr(&self) -> Vec<u8> {
        self.err.snapshot()
    }

    /// Whether the launcher still runs (reaps it if it has exited).
    pub fn is_running(&mut self) -> bool {
        if self.status.is_none()
            && let Some(c) = &mut self.child
            && let Ok(Some(s)) = c.try_wait()
        {
            self.status = Some(s);
        }
        self.status.is_none()
    }

    /// Time since the launcher started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Waits (at most `timeout`) until `ready(stdout, stderr)` holds for what the launcher has
    /// printed so far.
    ///
    /// # Panics
    ///
    /// When the time is up, or when the launcher has exited and its output is complete without
    /// `ready` holding; the message says what it printed.
    pub fn wait_for(&mut self, what: &str, timeout: Duration, ready: impl Fn(&str, &str) -> bool) {
        let deadline = Instant::now() + timeout;
        loop {
            let ended = !self.is_running() && self.out.is_done() && self.err.is_done();
            let (out, err) = (self.stdout(), self.stderr());
            if ready(
                &String::from_utf8_lossy(&out),
                &String::from_utf8_lossy(&err),
            ) {
                return;
            }
            if ended || Instant::now() >= deadline {
                let why = if ended {
                    format!("the launcher exited ({:?}) first", self.status)
                } else {
                    format!("not within {timeout:?}")
                };
                self.kill_now();
                panic!(
                    "waiting for {what}: {why}\n{}\n--- stdout ---\n{}\n--- stderr ---\n{}",
                    self.described,
                    shown(&out),
                    shown(&err)
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until `n` lines of stdout contain `needle`, at most `timeout`.
    ///
    /// # Panics
    ///
    /// As [`Launch::wait_for`].
    pub fn wait_for_lines(&mut self, needle: &str, n: usize, timeout: Duration) {
        self.wait_for(
            &format!("{n} stdout lines with {needle:?}"),
            timeout,
            |out, _| out.lines().filter(|l| l.contains(needle)).count() >= n,
        );
    }

    fn kill_now(&mut self) {
        if self.is_running() {
            let _ = kill(Pid::from_raw(self.pid()), Signal::SIGKILL);
            if let Some(c) = &mut self.child {
                self.status = c.wait().ok();
            }
        }
    }

    /// Waits for the launcher to exit within the launch's time limit (counted from its start),
    /// then for the end of its stdout and stderr (5 s more at most).
    ///
    /// # Panics
    ///
    /// When it does not exit in time (it is killed first), or its output stays open.
    pub fn wait(self) -> Finished {
        let left = self.timeout.saturating_sub(self.started.elapsed());
        self.wait_at_most(left)
    }

    /// As [`Launch::wait`], with at most `timeout` from now.
    ///
    /// # Panics
    ///
    /// When it does not exit in time (it is killed first), or its output stays open.
    pub fn wait_at_most(mut self, timeout: Duration) -> Finished {
        let exited = wait_until(timeout, || !self.is_running());
        if !exited {
            self.kill_now();
            panic!(
                "{} did not finish within {timeout:?} ({:?} after it started); killed it\n\
                 --- stdout ---\n{}\n--- stderr ---\n{}",
                self.described,
                self.started.elapsed(),
                shown(&self.stdout()),
                shown(&self.stderr())
            );
        }
        let elapsed = self.started.elapsed();
        let closed = wait_until(Duration::from_secs(5), || {
            self.out.is_done() && self.err.is_done()
        });
        assert!(
            closed,
            "{} exited ({:?}) but its stdout or stderr stayed open 5 s later: some process it \
             started still holds them\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.described,
            self.status,
            shown(&self.stdout()),
            shown(&self.stderr())
        );
        Finished {
            status: self.status.unwrap_or_else(|| unreachable!("reaped above")),
            stdout: self.out.take(),
            stderr: self.err.take(),
            elapsed,
            described: self.described.clone(),
            dir: self
                .dir
                .take()
                .unwrap_or_else(|| unreachable!("taken only here")),
        }
    }
}

impl Drop for Launch {
    fn drop(&mut self) {
        self.kill_now();
    }
}

/// A launcher that has exited, with everything it printed.
#[derive(Debug)]
pub struct Finished {
    /// How it exited.
    pub status: ExitStatus,
    /// Its whole stdout.
    pub stdout: Vec<u8>,
    /// Its whole stderr.
    pub stderr: Vec<u8>,
    /// From its start to its exit.
    pub elapsed: Duration,
    described: String,
    dir: tempfile::TempDir,
}

impl Finished {
    /// Its exit code (`None` if a signal killed it).
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// Its stdout as text (lossy).
    pub fn out(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// Its stderr as text (lossy).
    pub fn err(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }

    /// The launch's working directory (removed when this is dropped).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The lines of stderr that start with `error:`.
    pub fn error_lines(&self) -> Vec<String> {
        self.err()
            .lines()
            .filter(|l| l.starts_with("error:"))
            .map(str::to_string)
            .collect()
    }

    /// The command line, exit status, time and (the end of) both streams, for messages.
    pub fn describe(&self) -> String {
        format!(
            "{}\nexited {:?} after {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.described,
            self.status,
            self.elapsed,
            shown(&self.stdout),
            shown(&self.stderr)
        )
    }

    /// Asserts the exit code, showing everything when it differs.
    ///
    /// # Panics
    ///
    /// When the code is not `code`.
    pub fn assert_code(&self, code: i32) -> &Finished {
        assert_eq!(
            self.code(),
            Some(code),
            "expected exit code {code}\n{}",
            self.describe()
        );
        self
    }
}

/// What `/proc/<pid>/stat` says of a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcStat {
    /// Its id.
    pub pid: i32,
    /// Its command name (`comm`).
    pub comm: String,
    /// Its state: `R`, `S`, `Z` (zombie), ...
    pub state: char,
    /// Its parent's id.
    pub ppid: i32,
    /// Its process group (field 5).
    pub pgrp: i32,
}

impl ProcStat {
    /// Whether it still runs: a zombie has ended and only waits to be reaped.
    pub fn alive(&self) -> bool {
        !matches!(self.state, 'Z' | 'X')
    }
}

/// `/proc/<pid>/stat` of `pid`, if it exists.
pub fn proc_stat(pid: i32) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // comm may contain spaces and parentheses: it ends at the last ')'.
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text[open + 1..close].to_string();
    let mut rest = text[close + 1..].split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    let pgrp = rest.next()?.parse().ok()?;
    Some(ProcStat {
        pid,
        comm,
        state,
        ppid,
        pgrp,
    })
}

/// Every process id in `/proc` now.
pub fn all_pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The live (not zombie) processes whose environment has `name=value` exactly.
pub fn pids_with_env(name: &str, value: &str) -> Vec<ProcStat> {
    let wanted = format!("{name}={value}").into_bytes();
    all_pids()
        .into_iter()
        .filter(|&pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|kv| kv == wanted.as_slice()))
        })
        .filter_map(proc_stat)
        .filter(ProcStat::alive)
        .collect()
}

/// The live (not zombie) processes in any of these process groups.
pub fn pids_in_groups(pgids: &[i32]) -> Vec<ProcStat> {
    all_pids()
        .into_iter()
        .filter_map(proc_stat)
        .filter(|p| p.alive() && pgids.contains(&p.pgrp))
        .collect()
}

/// Waits up to `timeout` for no live process to have `name=value` in its environment.
///
/// # Panics
///
/// When some are left, listing them (and kills them, so that a failing test leaves nothing).
pub fn assert_no_process_with_env(name: &str, value: &str, timeout: Duration, context: &str) {
    if wait_until(timeout, || pids_with_env(name, value).is_empty()) {
        return;
    }
    let left = pids_with_env(name, value);
    for p in &left {
        let _ = kill(Pid::from_raw(p.pid), Signal::SIGKILL);
    }
    panic!(
        "{context}: {timeout:?} later, processes with {name}={value} are still alive: {left:#?}"
    );
}

/// Waits up to `timeout` for these process groups to have no live process.
///
/// # Panics
///
/// When some are left, listing them (and kills them).
pub fn assert_groups_gone(pgids: &[i32], timeout: Duration, context: &str) {
    if wait_until(timeout, || pids_in_groups(pgids).is_empty()) {
        return;
    }
    let left = pids_in_groups(pgids);
    for p in &left {
        let _ = kill(Pid::from_raw(p.pid), Signal::SIGKILL);
    }
    panic!(
        "{context}: {timeout:?} later, process groups {pgids:?} still have live processes: {left:#?}"
    );
}

/// Kills every live process with `name=value` in its environment: cleanup for a test that
/// expects them to be gone already, so that a failure leaves nothing running.
pub fn kill_marked(name: &str, value: &str) {
    for p in pids_with_env(name, value) {
        let _ = kill(Pid::from_raw(p.pid), Signal::SIGKILL);
    }
}

/// The command line of `pid` (its arguments, lossy), if it exists.
pub fn cmdline(pid: i32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let raw = raw.strip_suffix(&[0]).unwrap_or(&raw);
    Some(
        raw.split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
    )
}

/// The live (not zombie) descendants of `pid`: its children, theirs, and so on.
pub fn descendants(pid: i32) -> Vec<ProcStat> {
    let all: Vec<ProcStat> = all_pids()
        .into_iter()
        .filter_map(proc_stat)
        .filter(ProcStat::alive)
        .collect();
    let mut found: Vec<ProcStat> = Vec::new();
    let mut parents = vec![pid];
    while let Some(parent) = parents.pop() {
        for p in all.iter().filter(|p| p.ppid == parent) {
            if !found.iter().any(|f| f.pid == p.pid) {
                parents.push(p.pid);
                found.push(p.clone());
            }
        }
    }
    found
}

/// Set to `1`, a missing `mpirun` fails the tests that run it instead of skipping them: for CI,
/// which installs Open MPI and must not silently test less.
pub const REQUIRE_MPIRUN: &str = "ATLASBOOST_E2E_REQUIRE_MPIRUN";

/// `mpirun`'s options for this machine: root, and more ranks than its cores.
pub const MPIRUN_OPTIONS: [&str; 2] = ["--allow-run-as-root", "--oversubscribe"];

/// `mpirun` from `PATH`; `None` when it is not installed, after saying so on the real stderr,
/// naming the test (which then returns, having tested nothing).
///
/// # Panics
///
/// When `mpirun` is missing and [`REQUIRE_MPIRUN`] is `1`.
pub fn mpirun_or_skip() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("mpirun"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        let test = std::thread::current()
            .name()
            .unwrap_or("an mpirun test")
            .to_string();
        assert!(
            std::env::var_os(REQUIRE_MPIRUN).is_none_or(|v| v != "1"),
            "{test}: mpirun is not on PATH, and {REQUIRE_MPIRUN}=1"
        );
        let _ = writeln!(
            std::io::stderr(),
            "{test}: skipped: mpirun is not on PATH (Debian: openmpi-bin)"
        );
    }
    found
}

/// The OpenSSH server that [`Sshd::start`] runs.
pub const SSHD: &str = "/usr/sbin/sshd";

/// Set to `1`, a missing OpenSSH (see [`Sshd::start`]) fails the ssh tests instead of skipping
/// them: for CI, which installs `openssh-server` and must not silently test less.
pub const REQUIRE_SSHD: &str = "ATLASBOOST_E2E_REQUIRE_SSHD";

/// The addresses the test sshd listens on: "hosts" that are all this machine.
pub const SSHD_ADDRESSES: [&str; 3] = ["127.0.0.1", "127.0.0.2", "127.0.0.3"];

/// A real OpenSSH server for one test, so that `atlasboost run` reaches "remote" hosts
/// (127.0.0.2, 127.0.0.3, ... all this machine) with the system `ssh`, as it reaches real ones.
///
/// [`Sshd::start`] makes a temporary directory with a host key, a client key (the only entry
/// of `authorized_keys`), an `sshd_config` and an `ssh_config` for clients, and runs
/// `/usr/sbin/sshd -D` on a free port of 127.0.0.1-3, as the user the tests run as (root
/// logs in with its key: `PermitRootLogin prohibit-password`). Each test has its own server:
/// starting one takes a few milliseconds, its log is the test's alone, and everything below it
/// ([`Sshd::sessions`]: sessions, agents, workers) belongs to that test.
///
/// Clients use [`Sshd::ssh_config`] with `ssh -F` (ssh reads `~/.ssh/config` from the passwd
/// entry's home, not `$HOME`, so the tests cannot use that). Dropping it kills the server
/// (it also dies with the thread that started it, `PR_SET_PDEATHSIG`, should the test process
/// be killed) and removes the directory.
#[derive(Debug)]
pub struct Sshd {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Sshd {
    /// Starts a server; `None` when OpenSSH (`/usr/sbin/sshd`, `ssh`, `ssh-keygen`) is not
    /// installed, after saying so on the real stderr (not the test harness's captured one),
    /// naming the test: the caller returns, and the test passes having tested nothing. With
    /// [`REQUIRE_SSHD`]`=1` it panics instead.
    ///
    /// # Panics
    ///
    /// When OpenSSH is installed but the server does not start (with its log), or when it is
    /// missing and [`REQUIRE_SSHD`] is `1`.
    pub fn start() -> Option<Sshd> {
        if let Some(why) = Sshd::missing() {
            let test = std::thread::current()
                .name()
                .unwrap_or("an ssh test")
                .to_string();
            assert!(
                std::env::var_os(REQUIRE_SSHD).is_none_or(|v| v != "1"),
                "{test}: {why}, and {REQUIRE_SSHD}=1"
            );
            let line = format!(
                "\n*** skipping: {test}: {why}; it tests nothing here (install OpenSSH, \
                 or set {REQUIRE_SSHD}=1 to make this a failure) ***\n"
            );
            // Straight to file descriptor 2: eprintln! would be captured by the test harness,
            // and shown only if the test failed.
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("atlasboost-e2e-sshd-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot make a temporary directory: {e}"));
        for key in ["host_key", "client_key"] {
            keygen(&dir.path().join(key));
        }
        let d = dir.path();
        std::fs::copy(d.join("client_key.pub"), d.join("authorized_keys"))
            .unwrap_or_else(|e| panic!("cannot write authorized_keys: {e}"));
        // sshd's privilege separation directory (as root it refuses to start without it).
        let _ = std::fs::create_dir_all("/run/sshd");
        // The port is free when picked, not necessarily when sshd binds it: try again then.
        let mut attempts = Vec::new();
        for _ in 0..5 {
            let port = free_port();
            match Sshd::spawn(d, port) {
                Ok(child) => {
                    let sshd = Sshd { child, port, dir };
                    sshd.write_client_config("ssh_config", Some(&sshd.client_key()), true);
                    return Some(sshd);
                }
                Err(why) => attempts.push(format!("port {port}: {why}")),
            }
        }
        panic!(
            "{SSHD} did not start in 5 attempts:\n{}",
            attempts.join("\n")
        );
    }

    /// Why the ssh tests cannot run here, if they cannot.
    fn missing() -> Option<String> {
        if !Path::new(SSHD).is_file() {
            return Some(format!("{SSHD} is not installed (Debian: openssh-server)"));
        }
        for (tool, arg) in [("ssh", "-V"), ("ssh-keygen", "-?")] {
            let found = Command::new(tool)
                .arg(arg)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok();
            if !found {
                return Some(format!("`{tool}` is not on PATH (Debian: openssh-client)"));
            }
        }
        None
    }

    /// Writes the configuration for `port`, starts `sshd -D` and waits (at most 10 s) until
    /// it answers on every address. On failure the server is killed and its log returned.
    fn spawn(dir: &Path, port: u16) -> Result<Child, String> {
        use std::os::unix::process::CommandExt;
        let d = dir.display();
        let listen: String = SSHD_ADDRESSES
            .iter()
            .map(|a| format!("ListenAddress {a}\n"))
            .collect();
        // MaxStartups: tests run in parallel and each opens a session per host at once; the
        // default (10:30:100) would drop some connections at random.
        let config = format!(
            "Port {port}\n{listen}HostKey {d}/host_key\nAuthorizedKeysFile {d}/authorized_keys\n\
             PermitRootLogin prohibit-password\nPasswordAuthentication no\n\
             KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n\
             PidFile {d}/sshd.pid\nMaxStartups 100\nPrintMotd no\n"
        );
        let config_path = dir.join("sshd_config");
        std::fs::write(&config_path, config)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", config_path.display()));
        let log = dir.join("sshd.log");
        let _ = std::fs::remove_file(&log);
        let mut cmd = Command::new(SSHD);
        cmd.arg("-D")
            .arg("-f")
            .arg(&config_path)
            .arg("-E")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: only prctl between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {SSHD}: {e}"));
        let mut exited = None;
        let up = wait_until(Duration::from_secs(10), || {
            exited = child.try_wait().ok().flatten();
            exited.is_none() && SSHD_ADDRESSES.iter().all(|a| answers_ssh(a, port))
        });
        if up {
            return Ok(child);
        }
        let _ = child.kill();
        let _ = child.wait();
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        Err(match exited {
            Some(status) => format!("sshd exited ({status}); its log:\n{log}"),
            None => format!("sshd did not answer within 10 s; its log:\n{log}"),
        })
    }

    /// Writes an `ssh_config` for clients named `name` in the server's directory and returns
    /// its path: every host is this server (`Port`, unless `with_port` is false), its host key
    /// is not checked, and the only key offered is `identity` (none if `None`:
    /// `IdentitiesOnly yes` keeps ssh from trying the user's own keys).
    ///
    /// # Panics
    ///
    /// If it cannot be written.
    pub fn write_client_config(
        &self,
        name: &str,
        identity: Option<&Path>,
        with_port: bool,
    ) -> PathBuf {
        let mut text = String::from("Host *\n");
        if with_port {
            text.push_str(&format!("  Port {}\n", self.port));
        }
        if let Some(key) = identity {
            text.push_str(&format!("  IdentityFile {}\n", key.display()));
        }
        text.push_str(
            "  IdentitiesOnly yes\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  \
             LogLevel ERROR\n",
        );
        let path = self.dir.path().join(name);
        std::fs::write(&path, text)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        path
    }

    /// Makes a new key pair `name`, `name.pub` in the server's directory (not authorized);
    /// returns the private key's path.
    pub fn new_key(&self, name: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        keygen(&path);
        path
    }

    /// The client configuration: this server, its authorized key. For `ssh -F`.
    pub fn ssh_config(&self) -> PathBuf {
        self.dir.path().join("ssh_config")
    }

    /// The private key that `authorized_keys` lists.
    pub fn client_key(&self) -> PathBuf {
        self.dir.path().join("client_key")
    }

    /// The port it listens on (on every address of [`SSHD_ADDRESSES`]).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The listening server's process id.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Its log (`sshd -E`), for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sshd.log")).unwrap_or_default()
    }

    /// Everything running below the server: its per-connection processes and what they run
    /// (shells, `atlasboost agent`, its lifeline, workers).
    pub fn sessions(&self) -> Vec<ProcStat> {
        descendants(self.pid())
    }

    /// Waits up to `timeout` until nothing runs below the server any more.
    ///
    /// # Panics
    ///
    /// When something does, listing it with its command line and the server's log (and killing
    /// it, so that a failing test leaves nothing).
    pub fn assert_no_sessions(&self, timeout: Duration, context: &str) {
        if wait_until(timeout, || self.sessions().is_empty()) {
            return;
        }
        let left: Vec<String> = self
            .sessions()
            .iter()
            .map(|p| format!("{} {:?}", p.pid, cmdline(p.pid).unwrap_or_default()))
            .collect();
        for p in self.sessions() {
            let _ = kill(Pid::from_raw(p.pid), Signal::SIGKILL);
        }
        panic!(
            "{context}: {timeout:?} later, processes of ssh sessions still run:\n{}\n\
             --- sshd log ---\n{}",
            left.join("\n"),
            shown(self.log().as_bytes())
        );
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `ssh-keygen -q -t ed25519 -N '' -f path`.
fn keygen(path: &Path) {
    let out = Command::new("ssh-keygen")
        .args([
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            "atlasboost-e2e",
            "-f",
        ])
        .arg(path)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run ssh-keygen: {e}"));
    assert!(
        out.status.success(),
        "ssh-keygen -f {} failed ({}): {}",
        path.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A port `P` free on loopback right now with `P + 1` free too: a job's `MASTER_PORT`, whose
/// `+ 1` library mode's rendezvous takes.
pub fn free_port_pair() -> u16 {
    for _ in 0..100 {
        let Ok(first) = std::net::TcpListener::bind("127.0.0.1:0") else {
            continue;
        };
        let Ok(port) = first.local_addr().map(|a| a.port()) else {
            continue;
        };
        if port < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            return port;
        }
    }
    panic!("no two free ports in a row on 127.0.0.1");
}

/// A port free on every address of [`SSHD_ADDRESSES`] right now (the kernel's pick, which is
/// in the ephemeral range, away from the ports other tests of this machine reserve).
fn free_port() -> u16 {
    for _ in 0..100 {
        let Ok(first) = std::net::TcpListener::bind("127.0.0.1:0") else {
            continue;
        };
        let Ok(port) = first.local_addr().map(|a| a.port()) else {
            continue;
        };
        if (2200..2300).contains(&port) {
            continue;
        }
        let others_free = SSHD_ADDRESSES[1..]
            .iter()
            .all(|a| std::net::TcpListener::bind((*a, port)).is_ok());
        if others_free {
            return port;
        }
    }
    panic!("no free port on {SSHD_ADDRESSES:?}");
}

/// Whether an SSH server answers on `addr:port` (its banner starts with `SSH-`).
fn answers_ssh(addr: &str, port: u16) -> bool {
    let Ok(ip) = addr.parse::<std::net::IpAddr>() else {
        return false;
    };
    let Ok(mut s) =
        std::net::TcpStream::connect_timeout(&(ip, port).into(), Duration::from_millis(500))
    else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let mut banner = [0u8; 4];
    s.read_exact(&mut banner).is_ok() && &banner == b"SSH-"
}
