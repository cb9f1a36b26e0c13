//! The run harness: [`Run`] starts a program with a clean environment and a hard time limit,
//! [`Launch`] watches it, [`Finished`] is what it did.

use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::bins::atlasboost_bin;
use crate::{unique, wait_until};

/// The variable every launch started by [`Run`] carries in its own environment (and so does
/// everything it starts: the lifeline, the workers, their children), with a value unique to
/// that launch. [`pids_with_env`](crate::pids_with_env) finds the launch's processes by it.
pub const LAUNCH_MARK: &str = "ATLASBOOST_E2E_LAUNCH";

/// How long a launch may take unless the test says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// One restart at once, which may shrink the job down to 2 ranks.
pub const ONE_RESTART_DOWN_TO_2: [&str; 6] = [
    "--max-restarts",
    "1",
    "--restart-delay",
    "0",
    "--min-np",
    "2",
];

/// How much of each stream a panic message shows (the end of it).
pub(crate) const SHOWN_BYTES: usize = 4000;

/// The one list of what a hermetic test removes from a started program's environment
/// (`tests/hermetic-env.txt`, which the Python tests read too): other launchers' variables,
/// atlasboost's own settings, and what the launcher sets for workers "unless set", so that
/// the test machine's environment cannot change what the tests see.
pub(crate) const HERMETIC_LIST: &str = include_str!("../hermetic-env.txt");

/// Whether a hermetic test removes `name` from a started program's environment.
pub fn is_hermetic(name: &str) -> bool {
    // The list, parsed once: every started program asks about every variable.
    static ENTRIES: std::sync::LazyLock<Vec<&'static str>> = std::sync::LazyLock::new(|| {
        HERMETIC_LIST
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect()
    });
    ENTRIES.iter().any(|l| match l.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == *l,
    })
}

/// The last [`SHOWN_BYTES`] of `bytes`, as text, for panic messages.
pub(crate) fn shown(bytes: &[u8]) -> String {
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
    /// Give the launcher a terminal for stdout and stderr, paused (Ctrl-S) after the first
    /// duration, for the second.
    paused_terminal: Option<(Duration, Duration)>,
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
            paused_terminal: None,
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

    /// Gives the launcher a terminal (a pseudo-terminal) for both stdout and stderr, whose
    /// output is stopped `after` the start, as Ctrl-S stops it, and resumed `pause` later, as
    /// Ctrl-Q does. Everything it shows is then the launch's stdout; its stderr is empty.
    #[must_use]
    pub fn paused_terminal(mut self, after: Duration, pause: Duration) -> Run {
        self.paused_terminal = Some((after, pause));
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
        let mut terminal = None;
        if let Some(pause) = self.paused_terminal {
            let (master, slave) = close_on_exec_pty();
            if pause.0.is_zero() {
                nix::sys::termios::tcflow(&slave, nix::sys::termios::FlowArg::TCOOFF)
                    .unwrap_or_else(|e| panic!("cannot stop the terminal's output: {e}"));
            }
            let clone = |fd: &std::os::fd::OwnedFd| {
                fd.try_clone()
                    .unwrap_or_else(|e| panic!("cannot duplicate the terminal: {e}"))
            };
            cmd.stdout(Stdio::from(clone(&slave)))
                .stderr(Stdio::from(clone(&slave)));
            terminal = Some((master, slave, pause));
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
        let (out, err) = match terminal {
            Some((master, slave, (after, pause))) => {
                // Stopped, then resumed; our end of the terminal closed then, so that reading
                // it ends with the launcher.
                std::thread::spawn(move || {
                    use nix::sys::termios::{FlowArg, tcflow};
                    if !after.is_zero() {
                        std::thread::sleep(after);
                        let _ = tcflow(&slave, FlowArg::TCOOFF);
                    }
                    std::thread::sleep(pause);
                    let _ = tcflow(&slave, FlowArg::TCOON);
                });
                (
                    Collector::start(std::fs::File::from(master)),
                    Collector::start(std::io::empty()),
                )
            }
            None => {
                let Some(stderr) = child.stderr.take() else {
                    unreachable!("stderr is piped");
                };
                let out = match (lagging_stdout, child.stdout.take()) {
                    (Some((read, lag)), _) => Collector::start_after(read, lag),
                    (None, Some(stdout)) => Collector::start(stdout),
                    (None, None) => unreachable!("stdout is piped"),
                };
                (out, Collector::start(stderr))
            }
        };
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

/// A new pseudo-terminal, both ends closed on exec from the start: tests run in parallel, and
/// a process another test starts must not hold this terminal open (`openpty` leaves both ends
/// inherited until a `fcntl` that would come too late).
fn close_on_exec_pty() -> (std::os::fd::OwnedFd, std::os::fd::OwnedFd) {
    use nix::pty::{grantpt, posix_openpt, ptsname_r, unlockpt};
    let master = posix_openpt(OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC)
        .unwrap_or_else(|e| panic!("cannot open a pseudo-terminal: {e}"));
    grantpt(&master).unwrap_or_else(|e| panic!("grantpt: {e}"));
    unlockpt(&master).unwrap_or_else(|e| panic!("unlockpt: {e}"));
    let name = ptsname_r(&master).unwrap_or_else(|e| panic!("ptsname: {e}"));
    let slave = nix::fcntl::open(
        name.as_str(),
        OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .unwrap_or_else(|e| panic!("cannot open {name}: {e}"));
    (std::os::fd::OwnedFd::from(master), slave)
}

/// A thread that reads a pipe to its end into a shared buffer.
#[derive(Debug)]
pub(crate) struct Collector {
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

    /// Kills the launcher with SIGKILL, then `then` (more SIGKILLs, say), and checks that the
    /// launcher died of it and that, 5 s after the kill at most, no process with
    /// `name=value` in its environment is left (`what` says which, in the failure). Returns
    /// how the launcher ended.
    ///
    /// # Panics
    ///
    /// If the launcher outlives the kill, or a marked process is left.
    pub fn kill_9_leaves_nothing(
        self,
        then: impl FnOnce(),
        (name, value): (&str, &str),
        what: &str,
    ) -> Finished {
        let killed = Instant::now();
        self.signal(Signal::SIGKILL);
        then();
        let r = self.wait_at_most(Duration::from_secs(5));
        assert_eq!(r.status.code(), None, "killed by SIGKILL\n{}", r.describe());
        crate::assert_no_process_with_env(
            name,
            value,
            Duration::from_secs(5).saturating_sub(killed.elapsed()),
            what,
        );
        r
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

    /// The one `error:` line on stderr; asserts that there is exactly one (`context` goes with
    /// the failure).
    pub fn the_error_line(&self, context: &str) -> String {
        let errors = self.error_lines();
        assert_eq!(errors.len(), 1, "exactly one `error:` line\n{context}");
        errors.into_iter().next().unwrap_or_default()
    }

    /// Asserts that the job failed as the launcher's own pause past the default
    /// `--host-timeout` (4 s), which its `peers` ("agents", "relays") took for its loss: one
    /// `error:` line saying so, and exit 125. `context` goes with a failure.
    ///
    /// # Panics
    ///
    /// When the error line or the code is another.
    pub fn assert_failed_as_the_launchers_pause(&self, peers: &str, context: &str) -> &Finished {
        let error = self.the_error_line(context);
        let tail = format!(
            "longer than --host-timeout (4s): its {peers} took it for lost and stopped their \
             workers"
        );
        assert!(
            error.starts_with("error: atlasboost itself failed first: it sent no heartbeat for ")
                && error.ends_with(&tail),
            "{error}\n{context}"
        );
        self.assert_code(125)
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

    /// Asserts that stderr holds every one of `has` and none of `lacks`, showing everything
    /// and naming the first text that is wrong when not.
    ///
    /// # Panics
    ///
    /// When one of `has` is missing, or one of `lacks` is there.
    pub fn assert_err(&self, has: &[&str], lacks: &[&str]) -> &Finished {
        let err = self.err();
        if let Some(missing) = has.iter().find(|t| !err.contains(*t)) {
            panic!("stderr lacks {missing:?}\n{}", self.describe());
        }
        if let Some(there) = lacks.iter().find(|t| err.contains(*t)) {
            panic!("stderr holds {there:?}\n{}", self.describe());
        }
        self
    }
}
