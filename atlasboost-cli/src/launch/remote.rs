//! The launcher's side of a peer that speaks the [`channel`](super::channel) protocol: a
//! remote host's `ssh` session running `atlasboost agent`, or (under `run --mpi`) one rank's
//! relay connected over TCP.

use std::ffi::OsString;
use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::sys::signal::Signal;

use super::channel::{AgentConfig, Tree};
use super::channel::{Decoder, Down, Up};
use super::output::{LineSplitter, Tail};
use super::ssh_connect::{Connect, ssh_options};
use crate::error::CliError;
use crate::writing::write_fully;

/// How many of ssh's (and the agent's) last stderr lines are kept for error messages.
const ERR_TAIL: usize = 10;

/// How long a write to an ssh session may wait for it to take a byte (a session whose login
/// hangs, a stalled link): then the session counts as gone, and the launcher (or agent) goes on.
const SSH_WRITE_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The most of a child's last stderr lines an agent passes up when the child is lost.
const LOST_SAID: usize = 4096;

/// How to reach the remote hosts (the command that runs atlasboost there gets `agent`
/// appended).
pub use super::channel::SshSpec as SshOptions;

/// How the launcher reaches a peer.
#[derive(Debug)]
pub enum Link {
    /// An `ssh` process of the launcher's, running `atlasboost agent` on a host.
    Ssh(Child),
    /// A TCP connection from the relay of one rank (`run --mpi`): it reports on that rank only.
    Relay {
        /// The rank whose worker the relay runs.
        rank: u32,
        /// It came through the door's Unix socket: a relay of the launcher's own host.
        local: bool,
    },
    /// A host deeper in the launch tree: an agent above it started it, and its messages come
    /// through the session of the launcher's child above it.
    Below,
    /// An agent of the launcher's `srun` step (`--launcher slurm`), on the TCP connection it
    /// made back to the launcher; `joined` once it has (until then the host is awaited).
    Step {
        /// Whether its agent has connected.
        joined: bool,
    },
}

/// Where a peer's commands go (ssh's stdin, or the relay's connection), shared with the
/// thread that sends heartbeats while the launcher's loop is held elsewhere. Closed for
/// everyone at once: the peer sees its end when the launcher hangs up.
#[derive(Debug, Clone)]
pub struct Commands(Arc<Mutex<Option<File>>>);

impl Commands {
    fn new(file: Option<File>) -> Commands {
        Commands(Arc::new(Mutex::new(non_blocking(file))))
    }

    /// Commands going to `file`, for tests.
    #[cfg(test)]
    pub fn for_test(file: File) -> Commands {
        Commands::new(Some(file))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<File>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn take(&self) -> Option<File> {
        self.lock().take()
    }

    fn replace(&self, file: Option<File>) {
        *self.lock() = non_blocking(file);
    }

    /// A heartbeat, if the connection is free and takes one now: never waits for a command
    /// being written, nor for room.
    pub fn try_heartbeat(&self) {
        let Ok(mut input) = self.0.try_lock() else {
            return;
        };
        let Some(file) = input.as_mut() else { return };
        let line = Down::Heartbeat.line();
        // Three bytes: a pipe takes them whole or not at all; a socket that took some gets
        // the rest (briefly), or a command would be garbled.
        if let Ok(n) = file.write(line.as_bytes())
            && n > 0
            && n < line.len()
            && write_fully(file, &line.as_bytes()[n..], Some(Duration::from_secs(1))).is_err()
        {
            // Half a line: the peer must see its end rather than a garbled command.
            end_for_them(input.take());
        }
    }
}

/// `file`, made non-blocking: a heartbeat must never hold the lock a command waits for.
fn non_blocking(file: Option<File>) -> Option<File> {
    if let Some(f) = &file {
        let _ = fcntl(f, FcntlArg::F_SETFL(OFlag::O_NONBLOCK));
    }
    file
}

/// Closes a peer's command connection so that the peer sees its end. A relay's or a Slurm
/// agent's is one socket with two descriptors (the other reads its frames): closing this one
/// alone would not end it, so its writing side is shut. (ssh's stdin is a pipe: shutting
/// fails, and closing it is the end.)
fn end_for_them(input: Option<File>) {
    if let Some(input) = input {
        let _ = nix::sys::socket::shutdown(
            std::os::fd::AsRawFd::as_raw_fd(&input),
            nix::sys::socket::Shutdown::Write,
        );
    }
}

/// One peer's session, as the launcher sees it.
#[derive(Debug)]
pub struct Remote {
    /// The host, as messages name it.
    pub host: String,
    /// How it is reached.
    pub link: Link,
    /// Where commands go: ssh's stdin, or the relay's connection.
    input: Commands,
    /// The agent's stdout or the relay's connection (frames), until it ends.
    pub out: Option<OwnedFd>,
    /// ssh's and the agent's stderr, until it ends (a relay has none).
    pub err: Option<OwnedFd>,
    decoder: Decoder,
    err_split: LineSplitter,
    err_tail: Tail,
    /// Messages read before the supervisor started.
    pub backlog: Vec<Up>,
    /// The agent has written the table and is starting its workers.
    pub ready: bool,
    /// The agent reported that all its workers are done.
    pub done: bool,
    /// Why the host is lost, once it is.
    pub lost: Option<String>,
    /// When the agent was last heard from.
    pub last_heard: Instant,
    /// The supervisor has reaped the ssh process (its pid may belong to someone else now).
    pub reaped: bool,
    /// How the ssh process ended, once reaped.
    pub ssh_ended: Option<super::channel::Ending>,
    /// The launcher's remote through which this host is heard (a host below another in the
    /// launch tree); `None` for the launcher's own sessions.
    pub parent: Option<usize>,
    /// Lost only because the host above it in the launch tree was.
    pub orphaned: bool,
    /// srun's last lines, for a host of the Slurm step.
    step_said: Option<Arc<Mutex<SrunSaid>>>,
}

/// What the srun of a Slurm step said (its own lines and the agents' stderr), as its reader
/// thread collects it.
#[derive(Debug)]
pub struct SrunSaid {
    /// The last lines.
    pub tail: Tail,
    /// The line saying that Slurm cancelled the step (`*** STEP 7.0 ON n1 CANCELLED AT ...
    /// ***`, or srun's `Job step aborted`), when it came before srun ended the step itself.
    pub cancelled: Option<String>,
    /// srun itself ended the step (`--kill-on-bad-exit`, after an agent died): a cancellation
    /// that follows is its doing, not `scancel`'s.
    pub terminating: bool,
}

impl SrunSaid {
    /// Nothing said yet; the last `keep` lines will be kept.
    pub fn new(keep: usize) -> SrunSaid {
        SrunSaid {
            tail: Tail::new(keep),
            cancelled: None,
            terminating: false,
        }
    }

    /// One more line of srun's.
    pub fn push(&mut self, line: String) {
        if line.contains("Terminating StepId") || line.contains("Terminating job step") {
            self.terminating = true;
        } else if !self.terminating
            && (line.contains("CANCELLED AT") || line.contains("Job step aborted"))
            // slurmstepd's line is kept when there is one: it names the step and the time.
            && self.cancelled.as_ref().is_none_or(|c| !c.contains("CANCELLED AT"))
        {
            // `scancel`: slurmctld tells srun, and slurmstepd says so, before the tasks die;
            // when srun ends the step itself (an agent died), it says so first.
            self.cancelled = Some(line.clone());
        }
        self.tail.push(line);
    }
}

/// What a new peer starts with.
fn session(host: &str, link: Link, input: Option<File>, out: Option<OwnedFd>) -> Remote {
    Remote {
        host: host.to_string(),
        link,
        input: Commands::new(input),
        out,
        err: None,
        decoder: Decoder::default(),
        err_split: LineSplitter::default(),
        err_tail: Tail::new(ERR_TAIL),
        backlog: Vec::new(),
        ready: false,
        done: false,
        lost: None,
        last_heard: Instant::now(),
        reaped: false,
        ssh_ended: None,
        parent: None,
        orphaned: false,
        step_said: None,
    }
}

impl Remote {
    /// Starts `ssh host <remote atlasboost> agent` and sends the agent its configuration on
    /// standard input (never on a command line).
    ///
    /// # Errors
    ///
    /// [`CliError::Failure`] if `ssh` cannot be started.
    pub fn start(
        host_name: &str,
        host: &str,
        ssh: &SshOptions,
        connect: &Connect,
        config: &AgentConfig,
    ) -> Result<Remote, CliError> {
        let mut cmd = Command::new("ssh");
        cmd.args(ssh_args(host_name, ssh, connect));
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Not in the launcher's group: a Ctrl-C reaches the agents through the channel,
            // after the launcher decided what to do with it.
            .process_group(0);
        // SAFETY: only prctl between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|source| CliError::Ssh {
            host: host.to_string(),
            source,
        })?;
        let (stdin, out, err) = (
            child.stdin.take().map(|s| File::from(OwnedFd::from(s))),
            child.stdout.take().map(OwnedFd::from),
            child.stderr.take().map(OwnedFd::from),
        );
        for fd in out.iter().chain(err.iter()) {
            let _ = fcntl(fd, FcntlArg::F_SETFL(OFlag::O_NONBLOCK));
        }
        // Writes wait for room up to SSH_WRITE_LIMIT, never for ever.
        if let Some(input) = &stdin {
            let _ = fcntl(input, FcntlArg::F_SETFL(OFlag::O_NONBLOCK));
        }
        let mut remote = session(host, Link::Ssh(child), stdin, out);
        remote.err = err;
        let mut line =
            serde_json::to_vec(config).map_err(CliError::json("encode the agent's settings"))?;
        line.push(b'\n');
        remote.write(&line);
        Ok(remote)
    }

    /// The session of rank `rank`'s relay on `host`, on its connection. `already` holds what
    /// the relay sent after its introduction, read with it.
    ///
    /// # Errors
    ///
    /// The connection cannot be duplicated, or `already` is not the protocol.
    pub fn relay(
        connection: OwnedFd,
        host: &str,
        rank: u32,
        local: bool,
        already: &[u8],
    ) -> Result<Remote, String> {
        let input = connection
            .try_clone()
            .map_err(|e| format!("cannot duplicate the connection: {e}"))?;
        // Reads and writes share the descriptor's flags: neither may block the supervisor.
        fcntl(&connection, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))
            .map_err(|e| format!("cannot make the connection non-blocking: {e}"))?;
        let mut remote = session(
            host,
            Link::Relay { rank, local },
            Some(File::from(input)),
            Some(connection),
        );
        remote.backlog = remote.decoder.feed(already)?;
        Ok(remote)
    }

    /// A host deeper in the launch tree, heard through the launcher's remote `parent` (the
    /// one of the agent that started it).
    pub fn below(host: &str, parent: usize) -> Remote {
        let mut r = session(host, Link::Below, None, None);
        r.parent = Some(parent);
        r
    }

    /// A host of the Slurm step, whose agent has not connected yet.
    pub fn awaited(host: &str) -> Remote {
        session(host, Link::Step { joined: false }, None, None)
    }

    /// The awaited host's agent has connected, on the session `door` (the door's): this
    /// host's channel is that connection from now on.
    pub fn attach_step(&mut self, mut door: Remote, srun_said: Arc<Mutex<SrunSaid>>) {
        self.step_said = Some(srun_said);
        self.input.replace(door.input.take());
        self.out = door.out.take();
        self.decoder = std::mem::take(&mut door.decoder);
        self.backlog = std::mem::take(&mut door.backlog);
        self.last_heard = Instant::now();
        self.link = Link::Step { joined: true };
    }

    /// A host of the Slurm step whose agent has not connected yet: nothing to read or lose.
    pub fn is_awaited(&self) -> bool {
        matches!(self.link, Link::Step { joined: false })
    }

    /// srun's line saying that Slurm cancelled the step (`*** STEP 7.0 ON n1 CANCELLED AT
    /// ... ***`, `scancel`), waiting at most `wait` for it; `None` for a host not of a Slurm
    /// step, a step that was not cancelled, or one that srun ended itself because an agent
    /// died (`--kill-on-bad-exit`).
    pub fn cancelled_by_slurm(&self, wait: Duration) -> Option<String> {
        let said = self.step_said.as_ref()?;
        let until = Instant::now() + wait;
        loop {
            if let Ok(s) = said.lock() {
                if let Some(line) = &s.cancelled {
                    return Some(line.clone());
                }
                if s.terminating {
                    return None;
                }
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A host of the Slurm step (lost with it when srun ends the step after another agent
    /// died: it is not left out of a restart).
    pub fn is_of_step(&self) -> bool {
        matches!(self.link, Link::Step { .. })
    }

    /// Why the host is lost when its channel ends before its agent said it was done, waiting up
    /// to `ssh_wait_ms` for how its ssh ended.
    pub fn ended_early(&self, ssh_wait_ms: u32) -> String {
        match &self.link {
            Link::Relay { .. } => {
                "it closed its connection before its worker ended (killed?)".to_string()
            }
            Link::Step { .. } => format!(
                "its agent's connection ended before its workers did (the node, or Slurm's step, \
                 ended){}",
                match self.err_tail.joined() {
                    Some(said) => format!("; it said: {said}"),
                    None => String::new(),
                }
            ),
            Link::Ssh(_) | Link::Below => format!(
                "its ssh session ended{} before its workers did; ssh said: {}",
                self.ssh_ending_within(ssh_wait_ms)
                    .map_or_else(String::new, |e| format!(" ({e})")),
                self.err_tail()
            ),
        }
    }

    /// How this launcher's ssh process ended, once it has (`ssh was killed by SIGKILL`,
    /// `ssh exited 255`), without reaping it. Its output closes as it exits, a moment before
    /// it can be waited for: 5 ms at most (the supervisor may have many hosts to hear of).
    pub fn ssh_ending(&self) -> Option<String> {
        self.ssh_ending_within(5)
    }

    /// [`Remote::ssh_ending`], waiting up to `millis` ms for it (a launch that fails on this
    /// host anyway can wait longer for the words that say why).
    pub fn ssh_ending_within(&self, millis: u32) -> Option<String> {
        use super::channel::{Ending, WorkerSignal};
        use nix::libc;
        let Link::Ssh(child) = &self.link else {
            return None;
        };
        let say = |e: Ending| match e {
            Ending::Signaled(s) => format!("ssh was killed by {}", s.name()),
            other => format!("ssh {}", other.describe().replace("exit ", "exited ")),
        };
        if let Some(e) = self.ssh_ended {
            return Some(say(e));
        }
        // The raw status: nix's waitid cannot name a real-time signal (SIGRTMIN...), and would
        // lose the ending.
        let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
        for _ in 0..millis.max(1) {
            // SAFETY: an all-zero siginfo_t is valid; waitid only writes it.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: waitid writes only through the valid pointer it is given.
            let r = unsafe { libc::waitid(libc::P_PID, child.id(), &mut info, flags) };
            // SAFETY: si_pid and si_status are the fields waitid fills for a child's end.
            let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
            match (r, pid, info.si_code) {
                // Reaped already, or not ours: nothing to tell.
                (-1, _, _) => return None,
                (_, 0, _) => std::thread::sleep(Duration::from_millis(1)),
                (_, _, libc::CLD_EXITED) => return Some(say(Ending::Exited(status))),
                (_, _, libc::CLD_KILLED | libc::CLD_DUMPED) => {
                    return WorkerSignal::from_number(status).map(|s| say(Ending::Signaled(s)));
                }
                _ => return None,
            }
        }
        None
    }

    /// The ssh process's id (a relay, or a host below another, has no process of ours).
    pub fn pid(&self) -> Option<u32> {
        match &self.link {
            Link::Ssh(child) => Some(child.id()),
            Link::Relay { .. } | Link::Below | Link::Step { .. } => None,
        }
    }

    /// The rank a relay reports on (`None`: an agent, which reports on its host's ranks).
    pub fn relay_rank(&self) -> Option<u32> {
        match self.link {
            Link::Relay { rank, .. } => Some(rank),
            Link::Ssh(_) | Link::Below | Link::Step { .. } => None,
        }
    }

    /// A relay that came through the door's Unix socket, so of the launcher's own host (its
    /// process ids mean something here).
    pub fn is_local_relay(&self) -> bool {
        matches!(self.link, Link::Relay { local: true, .. })
    }

    /// Keeps a line of the host's stderr for error messages (one passed up the tree).
    pub fn heard_err(&mut self, line: String) {
        self.err_tail.push(line);
    }

    /// Sends command lines as they are (the decision's).
    pub fn send_lines(&mut self, lines: &[u8]) {
        self.write(lines);
    }

    /// Passes a command line on as it came (an agent to the agents it started).
    pub fn send_line(&mut self, line: &[u8]) {
        let mut bytes = Vec::with_capacity(line.len() + 1);
        bytes.extend_from_slice(line);
        bytes.push(b'\n');
        self.write(&bytes);
    }

    /// An agent's child: what it said, ready to pass up as this agent's messages. Its frames
    /// are wrapped in [`Up::Via`] naming `position` (frames already wrapped, from further
    /// down, pass as they are); its stderr lines become [`Up::Said`]; a session that ends
    /// before its agent is done becomes [`Up::Lost`]. Never blocks.
    pub fn forward(&mut self, position: u32, tree: Tree, buf: &mut [u8]) -> Vec<Up> {
        let mut up = Vec::new();
        let below = |host: u32| {
            host != position
                && (host as usize) < tree.size
                && tree.is_below(host as usize, position as usize)
        };
        let wrap = |m: Up| match m {
            // From further down, passed on as it is, when it is from below this child.
            Up::Via { host, .. } | Up::Lost { host, .. } if !below(host) => Up::Lost {
                host: position,
                said: format!(
                    "its agent passed up a message of host position {host}, which is not below it"
                ),
            },
            m @ (Up::Via { .. } | Up::Lost { .. }) => m,
            m => Up::Via {
                host: position,
                message: Box::new(m),
            },
        };
        while let Some(lines) = self.read_err(buf) {
            if lines.is_empty() {
                break;
            }
            up.extend(lines.into_iter().map(|l| {
                wrap(Up::Said {
                    line: l.into_bytes(),
                })
            }));
        }
        match self.read_out(buf) {
            Ok(Some(messages)) => {
                for m in messages {
                    if matches!(m, Up::Done) {
                        self.done = true;
                    }
                    up.push(wrap(m));
                }
                if self.out.is_some() {
                    return up;
                }
            }
            Ok(None) => {}
            Err(why) => {
                self.out = None;
                self.lost = Some(why.clone());
                up.push(Up::Lost {
                    host: position,
                    said: format!("its agent sent something that is not the protocol: {why}"),
                });
                return up;
            }
        }
        if !self.done && self.lost.is_none() {
            while self.read_err(buf).is_some_and(|l| !l.is_empty()) {}
            let what = match self.greeted() {
                true => "its ssh session ended before its agent was done",
                false => "ssh could not start atlasboost agent there",
            };
            let mut said = format!("{what}; ssh said: {}", self.err_tail());
            if said.len() > LOST_SAID {
                let mut cut = LOST_SAID;
                while !said.is_char_boundary(cut) {
                    cut -= 1;
                }
                said.truncate(cut);
                said.push_str(" ...");
            }
            self.lost = Some(said.clone());
            up.push(Up::Lost {
                host: position,
                said,
            });
        }
        up
    }

    /// Sends a command; a session that is gone is noticed when its output ends.
    pub fn send(&mut self, command: Down) {
        self.write(command.line().as_bytes());
    }

    /// Writes a command whole. A relay's connection does not block: one so full that a
    /// command line does not fit belongs to a relay that stopped reading, which its silence
    /// will show; a half-written command would garble the stream, so it counts as gone. An ssh
    /// session gets [`SSH_WRITE_LIMIT`] to take each byte (the configuration and the decision
    /// may be larger than a pipe holds).
    fn write(&mut self, bytes: &[u8]) {
        let mut input = self.input.lock();
        let written = match (input.as_mut(), &self.link) {
            (None, _) => return,
            (Some(s), Link::Ssh(_) | Link::Step { .. }) => {
                write_fully(s, bytes, Some(SSH_WRITE_LIMIT))
            }
            (Some(s), _) => s.write_all(bytes).and_then(|()| s.flush()),
        };
        if written.is_err() {
            // Ended for the other side too: it must not wait on half a command. Taken under the
            // same lock, so that no heartbeat follows the half.
            let half = input.take();
            drop(input);
            end_for_them(half);
        }
    }

    /// Ends a session whose agent went silent: ssh is killed (its output then ends, so the
    /// session counts as finished), and the host is lost for `why`.
    pub fn end_session(&mut self, why: String) {
        self.hang_up();
        self.kill_ssh();
        self.out = None;
        self.err = None;
        self.lost = Some(why);
    }

    /// Closes the agent's standard input (or the relay's side of the connection): it stops
    /// its workers and exits.
    pub fn hang_up(&mut self) {
        end_for_them(self.input.take());
    }

    /// Where its commands go, for the launcher's heartbeats while its loop is held.
    pub fn commands(&self) -> Commands {
        self.input.clone()
    }

    /// Reads what the agent sent. `Ok(None)` at the end of its output.
    ///
    /// # Errors
    ///
    /// What is wrong with a stream that is not the agent protocol.
    pub fn read_out(&mut self, buf: &mut [u8]) -> Result<Option<Vec<Up>>, String> {
        let Some(fd) = &self.out else {
            return Ok(None);
        };
        let mut got = Vec::new();
        for _ in 0..16 {
            match nix::unistd::read(fd, buf) {
                // A peer that closes with bytes of ours unread (a relay that said it is done
                // while a heartbeat was on its way) resets the connection: its end, as EOF,
                // after everything it sent (which `got` holds).
                Ok(0) | Err(Errno::ECONNRESET) => {
                    self.out = None;
                    return if got.is_empty() {
                        Ok(None)
                    } else {
                        Ok(Some(got))
                    };
                }
                Ok(n) => {
                    self.last_heard = Instant::now();
                    got.extend(self.decoder.feed(&buf[..n])?);
                }
                Err(Errno::EAGAIN) => break,
                Err(Errno::EINTR) => {}
                Err(e) => return Err(format!("cannot read its output: {e}")),
            }
        }
        Ok(Some(got))
    }

    /// Reads ssh's stderr: the complete lines, which are also kept for error messages.
    /// `None` at its end.
    pub fn read_err(&mut self, buf: &mut [u8]) -> Option<Vec<String>> {
        let fd = self.err.as_ref()?;
        let mut lines = Vec::new();
        let mut ended = false;
        match nix::unistd::read(fd, buf) {
            Ok(0) => ended = true,
            Ok(n) => self.err_split.feed(&buf[..n], &mut |l| {
                lines.push(String::from_utf8_lossy(l).into_owned());
            }),
            Err(Errno::EAGAIN | Errno::EINTR) => {}
            Err(_) => ended = true,
        }
        if ended {
            self.err_split
                .finish(&mut |l| lines.push(String::from_utf8_lossy(l).into_owned()));
            self.err = None;
        }
        for l in lines.iter().filter(|l| !ssh_on_our_proxys_failure(l)) {
            self.err_tail.push(l.clone());
        }
        if ended && lines.is_empty() {
            None
        } else {
            Some(lines)
        }
    }

    /// ssh's last stderr lines, joined for a message (`(nothing on stderr)` if none).
    pub fn err_tail(&self) -> String {
        self.err_said()
            .unwrap_or_else(|| "(nothing on stderr)".into())
    }

    /// ssh's (and the agent's) last stderr lines, joined; `None` when it said nothing.
    pub fn err_said(&self) -> Option<String> {
        let noise = String::from_utf8_lossy(&self.decoder.noise);
        let mut parts: Vec<String> = self.err_tail.joined().into_iter().collect();
        if let Some(version) = noise
            .trim_start_matches('\0')
            .strip_prefix("atlasboost-agent-")
        {
            parts.push(format!(
                "(the atlasboost there is another version: it speaks atlasboost-agent-{}, this \
                 launcher {}; install the same atlasboost on every host, or pass \
                 --remote-atlasboost)",
                version.lines().next().unwrap_or("?"),
                String::from_utf8_lossy(&super::channel::HELLO[1..]).trim_end()
            ));
        } else if !noise.trim().is_empty() {
            parts.push(format!(
                "(before the agent spoke, stdout had: {})",
                noise.trim()
            ));
        }
        (!parts.is_empty()).then(|| parts.join(" | "))
    }

    /// Whether the agent has greeted the launcher (so ssh and the remote atlasboost work).
    pub fn greeted(&self) -> bool {
        self.decoder.greeted()
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        // The agent stops its workers when its input closes; ssh itself is ours to end.
        self.hang_up();
        self.kill_ssh();
        if let Link::Ssh(child) = &mut self.link
            && !self.reaped
        {
            let _ = child.wait();
        }
    }
}

impl Remote {
    /// Kills ssh and what it started in its process group (its `ProxyCommand`, `atlasboost
    /// ssh-connect`, which ssh killed with SIGKILL cannot end): the group is ssh's own, made at
    /// its start, and its id cannot be another's while ssh is not reaped.
    fn kill_ssh(&mut self) {
        if let Link::Ssh(child) = &mut self.link
            && !self.reaped
        {
            let group = nix::unistd::Pid::from_raw(child.id() as i32);
            if nix::sys::signal::killpg(group, Signal::SIGKILL).is_err() {
                let _ = child.kill();
            }
        }
    }
}

/// What ssh adds when `atlasboost ssh-connect` (its `ProxyCommand`, with `ProxyUseFdpass`)
/// could not connect and passed back no connection: its own words for that, which say nothing
/// the proxy's message (`atlasboost ssh-connect: cannot connect to ...`) did not.
fn ssh_on_our_proxys_failure(line: &str) -> bool {
    line.starts_with("mm_receive_fd: ") || line == "proxy dialer did not pass back a connection"
}

/// The launcher's child above remote `v` in the launch tree (`v` itself for a child).
pub fn top_of(remotes: &[Remote], mut v: usize) -> usize {
    // A chain longer than the list would be a loop: bounded.
    for _ in 0..remotes.len() {
        match remotes[v].parent {
            Some(p) => v = p,
            None => break,
        }
    }
    v
}

/// Whether remote `v` is below remote `h` in the launch tree.
pub fn is_below(remotes: &[Remote], v: usize, h: usize) -> bool {
    let mut at = remotes[v].parent;
    for _ in 0..remotes.len() {
        match at {
            Some(p) if p == h => return true,
            Some(p) => at = remotes[p].parent,
            None => return false,
        }
    }
    false
}

/// `ssh -T -o BatchMode=yes ... host exec '<atlasboost>' agent`.
fn ssh_args(host: &str, ssh: &SshOptions, connect: &Connect) -> Vec<OsString> {
    let mut args = ssh_options(ssh);
    args.extend(connect.ssh_args().iter().cloned());
    args.push("--".into());
    args.push(host.into());
    let command: Vec<String> = ssh
        .remote_atlasboost
        .iter()
        .map(|a| shell_quote(Path::new(a)))
        .collect();
    args.push(format!("exec {} agent", command.join(" ")).into());
    args
}

/// `'path'`, with any `'` escaped, for the remote shell.
fn shell_quote(path: &Path) -> String {
    single_quoted(&path.to_string_lossy())
}

/// `'text'`, with any `'` escaped: one word for a POSIX shell, whatever it holds.
fn single_quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// A command line as a POSIX shell reads it back, word for word (for `-v`: copied and pasted,
/// it runs): words of plain characters as they are, the others single-quoted.
pub(crate) fn shell_line<S: AsRef<std::ffi::OsStr>>(words: &[S]) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c);
    words
        .iter()
        .map(|w| {
            let w = w.as_ref().to_string_lossy();
            match !w.is_empty() && w.chars().all(plain) {
                true => w.into_owned(),
                false => single_quoted(&w),
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shell_line_reads_back_word_for_word() {
        let line = shell_line(&["sh", "-c", "echo \"a  b\"", "it's", "", "-x", "A=1,2"]);
        assert_eq!(line, r#"sh -c 'echo "a  b"' 'it'\''s' '' -x A=1,2"#);
        let back = std::process::Command::new("sh")
            .args([
                "-c",
                &format!("for w in {line}; do printf '[%s]' \"$w\"; done"),
            ])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&back.stdout),
            "[sh][-c][echo \"a  b\"][it's][][-x][A=1,2]"
        );
    }

    /// A relay that closes its connection with a heartbeat of ours unread resets it: what it
    /// sent before (its `done`) still counts, and the reset is its end, not a protocol error.
    #[test]
    fn a_peer_that_resets_after_its_last_frames_has_ended() {
        use std::io::Write;
        use std::os::unix::net::UnixStream;
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let mut frames = super::super::channel::HELLO.to_vec();
        super::super::channel::encode(&Up::Done, &mut frames);
        theirs.write_all(&frames).unwrap();
        // Ours to them, never read: their close then resets the connection.
        (&ours).write_all(b"unread").unwrap();
        drop(theirs);
        ours.set_nonblocking(true).unwrap();
        let mut remote = session(
            "h",
            Link::Relay {
                rank: 0,
                local: false,
            },
            None,
            Some(OwnedFd::from(ours)),
        );
        let mut buf = vec![0u8; 1024];
        let got = remote.read_out(&mut buf).unwrap();
        assert!(matches!(got.as_deref(), Some([Up::Done])), "{got:?}");
        assert!(remote.out.is_none(), "the session has ended");
    }

    #[test]
    fn srun_tells_scancel_from_its_own_ending_of_the_step() {
        let said = |lines: &[&str]| {
            let mut s = SrunSaid::new(4);
            for l in lines {
                s.push((*l).to_string());
            }
            s
        };
        // scancel: slurmstepd's word first, then srun's reaction to the killed tasks.
        let scancel = said(&[
            "0: slurmstepd-n1: error: *** STEP 3.0 ON n1 CANCELLED AT 2026-12-01T23:08:12 ***",
            "srun: Job step aborted: Waiting up to 4 seconds for job step to finish.",
            "srun: error: n2: task 1: Killed",
            "srun: launch/slurm: _step_signal: Terminating StepId=3.0",
        ]);
        assert!(
            scancel
                .cancelled
                .unwrap()
                .contains("STEP 3.0 ON n1 CANCELLED AT")
        );
        let aborted = said(&["srun: Job step aborted: Waiting up to 4 seconds"]);
        assert!(aborted.cancelled.unwrap().contains("Job step aborted"));
        // --kill-on-bad-exit: an agent died, srun ended the step, which slurmstepd then reports.
        let bad_exit = said(&[
            "srun: error: n3: task 2: Killed",
            "srun: launch/slurm: _step_signal: Terminating StepId=3.0",
            "0: slurmstepd-n1: error: *** STEP 3.0 ON n1 CANCELLED AT 2026-12-01T23:07:04 ***",
        ]);
        assert!(bad_exit.terminating && bad_exit.cancelled.is_none());
    }

    #[test]
    fn an_agent_of_another_version_is_named_as_such() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let stream =
            OwnedFd::from(std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap());
        // What an agent of protocol 1 says: not this launcher's greeting, then its frames.
        let mut said = b"\0atlasboost-agent-1\n".to_vec();
        said.extend_from_slice(&[b'h', 0, 0, 0, 0, 0, 0, 0, 0].repeat(8));
        // Refused at once, as the greeting comes (not at the rendezvous timeout).
        let said = Remote::relay(stream, "node1", 0, false, &said).unwrap_err();
        let ours = String::from_utf8_lossy(&super::super::channel::HELLO[1..]);
        assert!(
            said.contains(&format!(
                "it greets as atlasboost-agent-1, and this launcher speaks {}: the atlasboost \
                 there is another version",
                ours.trim_end()
            )),
            "{said}"
        );
    }

    #[test]
    fn an_agent_passes_up_what_its_child_says_and_refuses_what_is_not_below_it() {
        use super::super::channel::{Stream, encode};
        use std::io::Write as _;

        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut theirs = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let ours = OwnedFd::from(listener.accept().unwrap().0);
        // Child at position 0 of a tree of 6 with fanout 2: positions 2 and 3 are below it.
        let tree = Tree { size: 6, fanout: 2 };
        let mut said = super::super::channel::HELLO.to_vec();
        let line = Up::Lines {
            rank: 4,
            stream: Stream::Stdout,
            lines: b"hello\n".to_vec(),
        };
        encode(&line, &mut said);
        let from_below = Up::Via {
            host: 3,
            message: Box::new(Up::Heartbeat),
        };
        encode(&from_below, &mut said);
        encode(
            &Up::Via {
                host: 1,
                message: Box::new(Up::Done),
            },
            &mut said,
        );
        theirs.write_all(&said).unwrap();
        let mut child = Remote::relay(ours, "node1", 0, false, &[]).unwrap();
        let mut buf = vec![0u8; 4096];
        let mut got = Vec::new();
        for _ in 0..100 {
            got.extend(child.forward(0, tree, &mut buf));
            if got.len() >= 3 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(
            got[0],
            Up::Via {
                host: 0,
                message: Box::new(line)
            }
        );
        assert_eq!(got[1], from_below);
        assert!(
            matches!(&got[2], Up::Lost { host: 0, said } if said.contains("position 1, which is not below it")),
            "{:?}",
            got[2]
        );
        // The child's session ends before it said it was done: lost, once.
        drop(theirs);
        let mut end = Vec::new();
        for _ in 0..100 {
            end.extend(child.forward(0, tree, &mut buf));
            if !end.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(
            matches!(end.as_slice(), [Up::Lost { host: 0, .. }]),
            "{end:?}"
        );
        assert!(child.forward(0, tree, &mut buf).is_empty());
    }

    #[test]
    fn the_remote_command_is_quoted_for_the_shell() {
        assert_eq!(
            shell_quote(Path::new("/opt/a b/it's")),
            r"'/opt/a b/it'\''s'"
        );
        let args = ssh_args(
            "node1",
            &SshOptions {
                port: Some(2222),
                identity: Some("/k".into()),
                remote_atlasboost: vec!["/usr/bin/atlasboost".into()],
                extra: Vec::new(),
                server_alive_secs: SshOptions::server_alive_for(Duration::from_secs(9)),
            },
            &Connect::Direct(vec!["-o".into(), "ProxyUseFdpass=yes".into()]),
        );
        let args: Vec<String> = args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let tail = &args[args.len() - 5..];
        assert_eq!(
            tail,
            [
                "-o",
                "ProxyUseFdpass=yes",
                "--",
                "node1",
                "exec '/usr/bin/atlasboost' agent"
            ]
        );
        assert!(args.windows(2).any(|w| w == ["-p", "2222"]));
        assert!(args.windows(2).any(|w| w == ["-o", "BatchMode=yes"]));
        // A --host-timeout of 9 s: ssh's keep-alive ends a silent session after 10-15 s.
        assert!(
            args.windows(2)
                .any(|w| w == ["-o", "ServerAliveInterval=5"])
        );
    }
}
