//! The channel between the launcher and a remote agent: ssh's standard streams.
//!
//! Why ssh's streams and not a second ZeroMQ socket: they are already there, authenticated
//! and encrypted, with flow control; the launcher needs no port reachable from the hosts for
//! output; and the session's end *is* the liveness signal in both directions (plus heartbeats,
//! for a network that goes silent without closing anything).
//!
//! - **Down** (launcher → agent, the agent's stdin): text lines. The first is the
//!   [`AgentConfig`] as JSON, which carries the job's secret, so the
//!   secret is never on a command line or in a file. Then `hb` (heartbeat) once a second, and
//!   `sig <n>` to pass signal `n` to every worker's process group. End of input means the
//!   launcher is gone.
//! - **Up** (agent → launcher, the agent's stdout): [`HELLO`], then binary frames
//!   `kind (1 byte) | rank (u32, big-endian) | length (u32, big-endian) | payload`. Bytes before
//!   `HELLO` (a login script that prints) are skipped and reported.

use std::ffi::OsString;
use std::path::PathBuf;

use atlasboost::settings::Discovery;
use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};

use crate::exit::ExitCodes;

/// How every host's workers run: the same for all hosts of a job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerSettings {
    /// `tensorflow`, `mindspore` or `pytorch`.
    pub framework: String,
    /// The command and its arguments.
    pub command: Vec<OsString>,
    /// The workers' directory.
    pub wdir: PathBuf,
    /// Where the table is written (absolute).
    pub rank_table: PathBuf,
    /// Variables set on top of the host's environment and the job's: `-x` exports and, for
    /// remote hosts, the launcher's variables that SPEC §9 forwards.
    pub env: Vec<(OsString, OsString)>,
    /// SIGTERM to SIGKILL, in milliseconds.
    pub grace_ms: u64,
    /// `--host-timeout`, in milliseconds: the launcher's silence after which an agent stops
    /// its workers, and a child agent's after which it is lost.
    #[serde(default = "default_lost_after_ms")]
    pub lost_after_ms: u64,
    /// Which attempt this is: 0 for the first start, 1 after the first restart.
    #[serde(default)]
    pub restart_count: u32,
    /// `--max-restarts`.
    #[serde(default)]
    pub max_restarts: u32,
    /// The launcher watches for hangs: read the workers' heartbeats and send them up.
    #[serde(default)]
    pub watch: bool,
    /// `--nic`, as typed: each host finds that interface of its own.
    #[serde(default)]
    pub nic: Option<String>,
    /// `--bind-cores`: each host binds its workers to their NPUs' CPUs.
    #[serde(default)]
    pub bind_cores: bool,
    /// `--monitor-interval`, in milliseconds (0: no sampling).
    #[serde(default)]
    pub monitor_ms: u64,
}

/// Everything a remote agent needs, sent as one JSON line on its standard input.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AgentConfig {
    /// Its position in the launch tree (the index of its host among the remote hosts).
    pub position: usize,
    /// Its host's server id.
    pub server_id: String,
    /// Its host, as the launcher names it in messages.
    pub host: String,
    /// The launcher's host name, for the record of the table's lock.
    #[serde(default)]
    pub launcher: String,
    /// How to find devices, as the launcher resolved its flags.
    pub discovery: Discovery,
    /// The job's id.
    pub job_id: String,
    /// How long to wait for the launcher's decision, in milliseconds.
    pub timeout_ms: u64,
    /// How the workers run.
    pub workers: WorkerSettings,
    /// The launch tree below this agent: the agents it starts, and theirs (SPEC §14).
    #[serde(default)]
    pub tree: TreeBelow,
}

/// The part of the launch tree an agent is responsible for.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TreeBelow {
    /// `--fanout`.
    pub fanout: usize,
    /// The number of remote hosts (the tree's size).
    pub size: usize,
    /// Every host below this agent, at any depth.
    pub hosts: Vec<TreeHost>,
    /// How to reach them.
    pub ssh: SshSpec,
}

/// A host of the launch tree.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TreeHost {
    /// Its position in the tree.
    pub position: usize,
    /// What ssh is given to reach it.
    pub name: String,
    /// How messages name it.
    pub host: String,
    /// Its server id.
    pub server_id: String,
}

/// How an agent starts its children's agents over ssh: the launcher's settings, as resolved
/// where the launcher runs (its `ATLASBOOST_SSH_OPTIONS` included).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SshSpec {
    /// `--ssh-port`.
    pub port: Option<u16>,
    /// `--ssh-identity`.
    pub identity: Option<PathBuf>,
    /// The command that runs atlasboost on the hosts.
    pub remote_atlasboost: Vec<OsString>,
    /// Extra ssh options (`ATLASBOOST_SSH_OPTIONS` of the launcher).
    pub extra: Vec<String>,
    /// ssh's own keep-alive, `ServerAliveInterval` (two unanswered end the session): half of
    /// `--host-timeout`, so that ssh gives up about when the heartbeats' watch does.
    #[serde(default = "default_server_alive_secs")]
    pub server_alive_secs: u64,
}

impl Default for SshSpec {
    fn default() -> SshSpec {
        SshSpec {
            port: None,
            identity: None,
            remote_atlasboost: Vec::new(),
            extra: Vec::new(),
            server_alive_secs: default_server_alive_secs(),
        }
    }
}

impl SshSpec {
    /// ssh's keep-alive interval for a `--host-timeout` of `lost_after`.
    pub fn server_alive_for(lost_after: std::time::Duration) -> u64 {
        lost_after.as_secs().div_ceil(2).max(1)
    }
}

fn default_lost_after_ms() -> u64 {
    LOST_AFTER.as_millis() as u64
}

fn default_server_alive_secs() -> u64 {
    SshSpec::server_alive_for(LOST_AFTER)
}

/// The launch tree over the remote hosts (positions `0..size`): the launcher starts the
/// first `fanout` hosts, and the host at position `p` starts those at `(p + 1) * fanout ..
/// (p + 2) * fanout` (a heap's numbering), so that no process holds more than `fanout` ssh
/// sessions and the depth is about log_fanout(size).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tree {
    /// The number of remote hosts.
    pub size: usize,
    /// How many children each node has at most (at least 1).
    pub fanout: usize,
}

impl Tree {
    /// The children of `parent` (`None`: the launcher), as positions.
    pub fn children(self, parent: Option<usize>) -> std::ops::Range<usize> {
        let k = self.fanout.max(1);
        let first = parent.map_or(0, |p| (p + 1).saturating_mul(k));
        first.min(self.size)..first.saturating_add(k).min(self.size)
    }

    /// The parent of `position` (`None`: the launcher).
    pub fn parent(self, position: usize) -> Option<usize> {
        let k = self.fanout.max(1);
        (position / k).checked_sub(1)
    }

    /// Whether `position` is `ancestor` or below it.
    pub fn is_below(self, mut position: usize, ancestor: usize) -> bool {
        loop {
            if position == ancestor {
                return true;
            }
            match self.parent(position) {
                Some(p) => position = p,
                None => return false,
            }
        }
    }

    /// The child of the launcher whose subtree holds `position`.
    pub fn top(self, mut position: usize) -> usize {
        while let Some(p) = self.parent(position) {
            position = p;
        }
        position
    }
}

/// Which of a worker's two output streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

impl Stream {
    /// `stdout` or `stderr`, as in tags and log file names.
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// What an agent writes before its first frame; the number is the protocol's version (2: the
/// lines frames, `O` and `E`; 4: heartbeats, records and stacks; 5: the launch tree, with the
/// rendezvous on the channel; 6: the host's NPU count in telemetry samples; 7: exit frames
/// carry any signal number, the real-time ones too; 8: an unreadable device's health names the
/// driver call that failed; 9: a telemetry sample names the driver calls that failed; 10: a
/// relay says that mpirun's side signalled it).
pub const HELLO: &[u8] = b"\x00atlasboost-agent-10\n";

/// What every version's [`HELLO`] starts with (its version and a newline follow).
const GREETING_PREFIX: &[u8] = b"\x00atlasboost-agent-";

/// A line longer than this is passed on in pieces of this size, so that a worker printing
/// without newlines cannot make the launcher hold unbounded memory.
pub const MAX_LINE: usize = 1 << 20;

/// The largest payload of a frame: a line piece (1 MiB) with room for a message.
pub const MAX_PAYLOAD: usize = MAX_LINE + 4096;

/// How often each side sends a heartbeat.
pub const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(1);

/// Silence for this long means the other side is lost, unless `--host-timeout` says otherwise.
pub const LOST_AFTER: std::time::Duration = std::time::Duration::from_secs(4);

/// The signal that ended a worker, by number: any of the kernel's, the real-time ones
/// (`SIGRTMIN`..`SIGRTMAX`) too, which [`Signal`] cannot hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerSignal(i32);

impl WorkerSignal {
    /// Signal number `n`, if it is one (1..=64).
    pub fn from_number(n: i32) -> Option<WorkerSignal> {
        (1..=64).contains(&n).then_some(WorkerSignal(n))
    }

    /// The signal's number.
    pub fn number(self) -> i32 {
        self.0
    }

    /// Whether it is `signal`.
    pub fn is(self, signal: Signal) -> bool {
        self.0 == signal as i32
    }

    /// `SIGKILL`; a real-time signal as `SIGRTMIN+N` (or `SIGRTMAX-N` in its upper half, as
    /// `kill -l` names them); `signal N` for a number the C library does not name.
    pub fn name(self) -> String {
        if let Ok(s) = Signal::try_from(self.0) {
            return s.as_str().to_string();
        }
        let (min, max) = (nix::libc::SIGRTMIN(), nix::libc::SIGRTMAX());
        match self.0 {
            n if n == min => "SIGRTMIN".into(),
            n if n == max => "SIGRTMAX".into(),
            n if n > min && n - min <= (max - min) / 2 => format!("SIGRTMIN+{}", n - min),
            n if n > min && n < max => format!("SIGRTMAX-{}", max - n),
            n => format!("signal {n}"),
        }
    }
}

impl From<Signal> for WorkerSignal {
    fn from(signal: Signal) -> WorkerSignal {
        WorkerSignal(signal as i32)
    }
}

/// How a worker ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// It exited with this code.
    Exited(i32),
    /// A signal ended it.
    Signaled(WorkerSignal),
    /// Its host was lost; how it ended is unknown.
    Lost,
    /// Under `run --mpi`: its relay ended without saying how the worker ended (mpirun, ending
    /// the job, killed it, say).
    Unknown,
    /// It never started: the launcher it depended on (mpirun) ended first.
    NotStarted,
}

impl Ending {
    /// The exit code that reports it: the code, or 128 + the signal's number.
    pub fn code(self) -> u8 {
        match self {
            Ending::Exited(c) => (c & 0xff) as u8,
            Ending::Signaled(s) => 128u8.wrapping_add(s.number() as u8),
            Ending::Lost | Ending::Unknown | Ending::NotStarted => ExitCodes::FAILURE,
        }
    }

    /// `exit 0`, `exit 3`, `SIGKILL`, `host lost`, `status unknown`, `not started`.
    pub fn describe(self) -> String {
        match self {
            Ending::Exited(c) => format!("exit {c}"),
            Ending::Signaled(s) => s.name(),
            Ending::Lost => "host lost".into(),
            Ending::Unknown => "status unknown".into(),
            Ending::NotStarted => "not started".into(),
        }
    }

    /// Anything but `exit 0`.
    pub fn failed(self) -> bool {
        self != Ending::Exited(0)
    }
}

/// A message from an agent to the launcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Up {
    /// Still here.
    Heartbeat,
    /// The table is written; the workers are starting.
    Ready,
    /// Lines a worker printed, each followed by `\n` (a line never holds one: `\n` and `\r`
    /// end lines). One frame carries many, so a busy worker costs a frame per batch, not
    /// per line.
    Lines {
        /// The worker's rank.
        rank: u32,
        /// Which stream.
        stream: Stream,
        /// The lines, each ended by `\n`.
        lines: Vec<u8>,
    },
    /// A line a worker printed (without its terminator).
    Line {
        /// The worker's rank.
        rank: u32,
        /// Which stream.
        stream: Stream,
        /// The bytes.
        line: Vec<u8>,
    },
    /// A worker ended.
    Exited {
        /// Its rank.
        rank: u32,
        /// How.
        ending: Ending,
    },
    /// The agent failed (before or while starting workers) and exits with `code`.
    Failed {
        /// The exit code the launcher should use (125, 126, 127).
        code: u8,
        /// What happened.
        message: String,
    },
    /// Every worker has ended and been cleaned up; the agent exits.
    Done,
    /// A worker called `heartbeat()` since the last report (SPEC §12).
    Beat {
        /// Its rank.
        rank: u32,
        /// How many times it has, in all.
        beats: u64,
        /// The step it last gave, if any.
        step: Option<i64>,
    },
    /// What a failed worker recorded in its `ATLASBOOST_ERROR_FILE` (JSON), sent before its
    /// exit.
    Recorded {
        /// Its rank.
        rank: u32,
        /// The file's content.
        text: Vec<u8>,
    },
    /// The stacks of a stuck worker, answering [`Down::Dump`].
    Stacks {
        /// Its rank.
        rank: u32,
        /// The dump, or why there is none.
        text: Vec<u8>,
    },
    /// The host's report for the rendezvous (compact: see `agent::encode_report`).
    Report {
        /// The report.
        bytes: Vec<u8>,
    },
    /// A message of the host at `host` (a position in the launch tree), passed up by the
    /// agents between it and the launcher.
    Via {
        /// The position of the host that sent it.
        host: u32,
        /// What it sent.
        message: Box<Up>,
    },
    /// The session of the host at `host` (a child of the sender) ended before its agent was
    /// done: the host and everything below it are lost.
    Lost {
        /// Its position in the launch tree.
        host: u32,
        /// What ssh said last.
        said: String,
    },
    /// A line that ssh or the agent printed on the session's stderr (sent inside [`Up::Via`]:
    /// a launcher reads its own sessions' stderr), or a relay's own message (its stderr is
    /// mpirun's).
    Said {
        /// The line.
        line: Vec<u8>,
    },
    /// A sample of the host's devices and workers (compact: see `monitor::encode`).
    Telemetry {
        /// The sample.
        bytes: Vec<u8>,
    },
    /// A relay's below the launcher, which has no guard of its own: its worker started, as
    /// the leader of this process group, which the launcher's guard is to stop if the
    /// launcher and the relay die (see `lifeline::prepare_below_launcher`).
    Group {
        /// The worker's rank.
        rank: u32,
        /// Its process group (its pid).
        group: i32,
    },
    /// A relay's below the launcher: the process group it gave in [`Up::Group`] is gone (its
    /// last process reaped): the launcher's guard must forget it before its id is reused.
    GroupGone {
        /// The group.
        group: i32,
    },
    /// A relay's: mpirun's side (its parent: mpirun, or Open MPI's daemon on another host)
    /// sent it `signal`, which it passes on to its worker. mpirun stops its ranks so when it
    /// is signalled itself or ends the job on its own: what the worker does next is mpirun's
    /// doing, not a failure of the rank's.
    MpirunStops {
        /// The signal.
        signal: WorkerSignal,
    },
}

const HEARTBEAT_KIND: u8 = b'h';
const READY: u8 = b'r';
const STDOUT: u8 = b'o';
const STDERR: u8 = b'e';
const STDOUT_LINES: u8 = b'O';
const STDERR_LINES: u8 = b'E';
const EXIT_CODE: u8 = b'x';
const EXIT_SIGNAL: u8 = b'k';
const FAILED: u8 = b'f';
const DONE: u8 = b'd';
const BEAT: u8 = b'b';
const RECORDED: u8 = b'R';
const STACKS: u8 = b's';
const REPORT: u8 = b'P';
const VIA: u8 = b'V';
const LOST: u8 = b'L';
const SAID: u8 = b'S';
const TELEMETRY: u8 = b'T';
const MPIRUN_STOPS: u8 = b'm';
const GROUP: u8 = b'g';
const GROUP_GONE: u8 = b'G';
/// The step of a beat frame that gave none.
const NO_STEP: i64 = i64::MIN;

/// Appends the frame of `message` to `out`.
pub fn encode(message: &Up, out: &mut Vec<u8>) {
    let (kind, rank, payload): (u8, u32, &[u8]) = match message {
        Up::Heartbeat => (HEARTBEAT_KIND, 0, &[]),
        Up::Ready => (READY, 0, &[]),
        Up::Line { rank, stream, line } => (
            match stream {
                Stream::Stdout => STDOUT,
                Stream::Stderr => STDERR,
            },
            *rank,
            line,
        ),
        Up::Lines {
            rank,
            stream,
            lines,
        } => (
            match stream {
                Stream::Stdout => STDOUT_LINES,
                Stream::Stderr => STDERR_LINES,
            },
            *rank,
            lines,
        ),
        Up::Exited { rank, ending } => {
            let (kind, value) = match ending {
                Ending::Exited(c) => (EXIT_CODE, *c),
                Ending::Signaled(s) => (EXIT_SIGNAL, s.number()),
                // Only the launcher knows these; an agent never says them of its workers.
                Ending::Lost | Ending::Unknown | Ending::NotStarted => {
                    (EXIT_CODE, i32::from(ExitCodes::FAILURE))
                }
            };
            return frame(kind, *rank, &value.to_be_bytes(), out);
        }
        Up::Failed { code, message } => (FAILED, u32::from(*code), message.as_bytes()),
        Up::Done => (DONE, 0, &[]),
        Up::Beat { rank, beats, step } => {
            let mut payload = [0u8; 16];
            payload[..8].copy_from_slice(&beats.to_be_bytes());
            payload[8..].copy_from_slice(&step.unwrap_or(NO_STEP).to_be_bytes());
            return frame(BEAT, *rank, &payload, out);
        }
        Up::Recorded { rank, text } => (RECORDED, *rank, text),
        Up::Stacks { rank, text } => (STACKS, *rank, text),
        Up::Report { bytes } => (REPORT, 0, bytes),
        Up::Via { host, message } => {
            let at = out.len();
            frame(VIA, *host, &[], out);
            encode(message, out);
            let len = (out.len() - at - 9) as u32;
            out[at + 5..at + 9].copy_from_slice(&len.to_be_bytes());
            return;
        }
        Up::Lost { host, said } => (LOST, *host, said.as_bytes()),
        Up::Said { line } => (SAID, 0, line),
        Up::Telemetry { bytes } => (TELEMETRY, 0, bytes),
        Up::MpirunStops { signal } => {
            return frame(MPIRUN_STOPS, 0, &signal.number().to_be_bytes(), out);
        }
        Up::Group { rank, group } => return frame(GROUP, *rank, &group.to_be_bytes(), out),
        Up::GroupGone { group } => return frame(GROUP_GONE, 0, &group.to_be_bytes(), out),
    };
    frame(kind, rank, payload, out);
}

/// Starts an [`Up::Lines`] frame at the end of `out`, without building an [`Up`] (the hot path
/// of remote output): append each line and its `\n`, then [`close_lines`] with the returned
/// position. The payload must stay within [`MAX_PAYLOAD`].
pub fn open_lines(rank: u32, stream: Stream, out: &mut Vec<u8>) -> usize {
    let kind = match stream {
        Stream::Stdout => STDOUT_LINES,
        Stream::Stderr => STDERR_LINES,
    };
    let at = out.len();
    frame(kind, rank, &[], out);
    at
}

/// Ends the frame [`open_lines`] started at `at`: its length is what was appended since.
pub fn close_lines(out: &mut [u8], at: usize) {
    let len = (out.len() - at - 9) as u32;
    out[at + 5..at + 9].copy_from_slice(&len.to_be_bytes());
}

fn frame(kind: u8, rank: u32, payload: &[u8], out: &mut Vec<u8>) {
    out.push(kind);
    out.extend_from_slice(&rank.to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
}

/// What [`HELLO`]'s own prefix says of bytes that do not hold it.
enum Foreign {
    /// A whole greeting of another version (what follows `atlasboost-agent-`).
    Version(String),
    /// The start of a greeting, at this index, whose line has not ended yet.
    Partial(usize),
    /// No greeting.
    None,
}

/// Whether `bytes` (without [`HELLO`]) hold another version's greeting: `\0atlasboost-agent-`,
/// something short, a newline.
fn foreign_greeting(bytes: &[u8]) -> Foreign {
    let prefix = GREETING_PREFIX;
    let Some(at) = bytes.windows(prefix.len()).position(|w| w == prefix) else {
        return Foreign::None;
    };
    let after = &bytes[at + prefix.len()..];
    // A version is a few digits: a line longer than that is noise, not a greeting.
    match after.iter().position(|&b| b == b'\n') {
        Some(end) if end < 16 => {
            Foreign::Version(String::from_utf8_lossy(&after[..end]).into_owned())
        }
        Some(_) => Foreign::None,
        None if after.len() < 16 => Foreign::Partial(at),
        None => Foreign::None,
    }
}

/// Reads frames from an agent's stdout, in whatever pieces they arrive.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
    start: usize,
    greeted: bool,
    /// Bytes seen before [`HELLO`] (kept up to 4 KiB, for the error message).
    pub noise: Vec<u8>,
}

impl Decoder {
    /// Feeds bytes; returns the complete messages, or what is wrong with the stream.
    ///
    /// # Errors
    ///
    /// A message saying what is malformed (an unknown kind, an oversized frame).
    pub fn feed(&mut self, data: &[u8]) -> Result<Vec<Up>, String> {
        self.buf.extend_from_slice(data);
        if !self.greeted {
            match self.buf.windows(HELLO.len()).position(|w| w == HELLO) {
                Some(i) => {
                    self.keep_noise(i);
                    self.start = i + HELLO.len();
                    self.greeted = true;
                }
                None => {
                    // Another version's greeting: said at once (its frames would not parse,
                    // and without them the host would wait out the rendezvous timeout).
                    let cut = match foreign_greeting(&self.buf) {
                        Foreign::Version(version) => {
                            let ours = String::from_utf8_lossy(&HELLO[1..]);
                            let ours = ours.trim_end();
                            // This version's greeting, with a carriage return before its
                            // newline: a terminal between them, not another atlasboost.
                            if format!("atlasboost-agent-{}", version.trim_end_matches('\r'))
                                == ours
                            {
                                return Err(format!(
                                    "its greeting ({ours}) came with its line ends changed (a \
                                     carriage return added: a terminal allocated for the \
                                     session, e.g. ssh -t, or a login script)"
                                ));
                            }
                            return Err(format!(
                                "it greets as atlasboost-agent-{version}, and this launcher \
                                 speaks {ours}: the atlasboost there is another version; \
                                 install the same atlasboost on every host, or pass \
                                 --remote-atlasboost"
                            ));
                        }
                        // The rest of it is still to come: kept whole.
                        Foreign::Partial(at) => at,
                        // Keep a tail that could be the start of HELLO.
                        Foreign::None => self.buf.len() - self.buf.len().min(HELLO.len() - 1),
                    };
                    self.keep_noise(cut);
                    self.buf.drain(..cut);
                    return Ok(Vec::new());
                }
            }
        }
        let mut got = Vec::new();
        loop {
            let rest = &self.buf[self.start..];
            if rest.len() < 9 {
                break;
            }
            let kind = rest[0];
            let rank = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]);
            let len = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]) as usize;
            // A frame passed up the tree is wrapped once: its header fits beside the limit.
            if len > MAX_PAYLOAD + 9 {
                return Err(format!(
                    "a frame of {len} bytes, more than {}",
                    MAX_PAYLOAD + 9
                ));
            }
            if rest.len() < 9 + len {
                break;
            }
            let payload = &rest[9..9 + len];
            got.push(decode(kind, rank, payload)?);
            self.start += 9 + len;
        }
        // Compact once the consumed part dominates, so the buffer stays near one frame.
        if self.start > 0 && self.start * 2 >= self.buf.len() {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        Ok(got)
    }

    /// Whether [`HELLO`] has been seen.
    pub fn greeted(&self) -> bool {
        self.greeted
    }

    fn keep_noise(&mut self, upto: usize) {
        let room = 4096usize.saturating_sub(self.noise.len());
        self.noise.extend_from_slice(&self.buf[..upto.min(room)]);
    }
}

fn decode(kind: u8, rank: u32, payload: &[u8]) -> Result<Up, String> {
    let value = || {
        <[u8; 4]>::try_from(payload)
            .map(i32::from_be_bytes)
            .map_err(|_| {
                let what = match kind {
                    MPIRUN_STOPS => "mpirun's signal",
                    GROUP | GROUP_GONE => "a process group",
                    _ => "an exit",
                };
                format!("a frame of {what} with {} bytes", payload.len())
            })
    };
    Ok(match kind {
        HEARTBEAT_KIND => Up::Heartbeat,
        READY => Up::Ready,
        STDOUT_LINES | STDERR_LINES => {
            if payload.last().is_some_and(|b| *b != b'\n') {
                return Err("a lines frame that does not end a line".into());
            }
            Up::Lines {
                rank,
                stream: if kind == STDOUT_LINES {
                    Stream::Stdout
                } else {
                    Stream::Stderr
                },
                lines: payload.to_vec(),
            }
        }
        STDOUT | STDERR => Up::Line {
            rank,
            stream: if kind == STDOUT {
                Stream::Stdout
            } else {
                Stream::Stderr
            },
            line: payload.to_vec(),
        },
        EXIT_CODE => Up::Exited {
            rank,
            ending: Ending::Exited(value()?),
        },
        EXIT_SIGNAL => Up::Exited {
            rank,
            ending: Ending::Signaled(
                WorkerSignal::from_number(value()?)
                    .ok_or_else(|| "an exit frame with an unknown signal".to_string())?,
            ),
        },
        FAILED => Up::Failed {
            code: u8::try_from(rank).unwrap_or(125),
            message: String::from_utf8_lossy(payload).into_owned(),
        },
        DONE => Up::Done,
        BEAT => {
            let bytes = <[u8; 16]>::try_from(payload)
                .map_err(|_| format!("a beat frame with {} bytes", payload.len()))?;
            let (beats, step) = bytes.split_at(8);
            let beats = u64::from_be_bytes(beats.try_into().unwrap_or_default());
            let step = i64::from_be_bytes(step.try_into().unwrap_or_default());
            Up::Beat {
                rank,
                beats,
                step: (step != NO_STEP).then_some(step),
            }
        }
        RECORDED => Up::Recorded {
            rank,
            text: payload.to_vec(),
        },
        STACKS => Up::Stacks {
            rank,
            text: payload.to_vec(),
        },
        REPORT => Up::Report {
            bytes: payload.to_vec(),
        },
        VIA => {
            // Exactly one frame, itself not wrapped: agents pass a wrapped frame on as it is.
            let inner = payload
                .get(..9)
                .ok_or("a via frame too short for a frame")?;
            let len = u32::from_be_bytes([inner[5], inner[6], inner[7], inner[8]]) as usize;
            if payload.len() != 9 + len || inner[0] == VIA {
                return Err("a via frame that does not hold exactly one frame".into());
            }
            let inner_rank = u32::from_be_bytes([inner[1], inner[2], inner[3], inner[4]]);
            Up::Via {
                host: rank,
                message: Box::new(decode(inner[0], inner_rank, &payload[9..])?),
            }
        }
        LOST => Up::Lost {
            host: rank,
            said: String::from_utf8_lossy(payload).into_owned(),
        },
        SAID => Up::Said {
            line: payload.to_vec(),
        },
        TELEMETRY => Up::Telemetry {
            bytes: payload.to_vec(),
        },
        MPIRUN_STOPS => Up::MpirunStops {
            signal: WorkerSignal::from_number(value()?)
                .ok_or_else(|| "a frame of mpirun's signal with an unknown signal".to_string())?,
        },
        GROUP => match value()? {
            // A worker's group is its pid: never 0 (one's own), 1 (init's) or negative.
            group if group > 1 => Up::Group { rank, group },
            group => return Err(format!("a frame of a process group naming group {group}")),
        },
        GROUP_GONE => Up::GroupGone { group: value()? },
        other => return Err(format!("a frame of unknown kind {other:#04x}")),
    })
}

/// A line the launcher sends down (and each agent passes on to the agents it started).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Down {
    /// Still here.
    Heartbeat,
    /// Pass this signal to every worker.
    Signal(nix::sys::signal::Signal),
    /// Take the stacks of this rank's worker and send them up ([`Up::Stacks`]); an agent
    /// without that rank says nothing.
    Dump(u32),
    /// The launcher's decision (compact: see `agent::encode_decision`), once every host
    /// reported: this many raw bytes follow the line ([`decision_message`]).
    Decision(usize),
    /// The launcher is stopping (Ctrl-Z): its silence is not its loss until it speaks again.
    Pause,
}

/// The largest decision an agent accepts (a 32,768-rank table takes about 440 KB).
pub const MAX_DECISION: usize = 256 << 20;

/// The decision as it travels down: its line, then its bytes as they are (no encoding: the
/// launcher sends K copies of it).
pub fn decision_message(bytes: &[u8]) -> Vec<u8> {
    let mut out = Down::Decision(bytes.len()).line().into_bytes();
    out.extend_from_slice(bytes);
    out
}

impl Down {
    /// The line, with its newline.
    pub fn line(&self) -> String {
        match self {
            Down::Heartbeat => "hb\n".into(),
            Down::Pause => "pause\n".into(),
            Down::Signal(s) => format!("sig {}\n", *s as i32),
            Down::Dump(rank) => format!("dump {rank}\n"),
            Down::Decision(len) => format!("decision {len}\n"),
        }
    }

    /// Parses one line (without its newline).
    ///
    /// # Errors
    ///
    /// The line, when it is not a command.
    pub fn parse(line: &str) -> Result<Down, String> {
        match line.split_once(' ') {
            None if line == "hb" => Ok(Down::Heartbeat),
            None if line == "pause" => Ok(Down::Pause),
            Some(("sig", n)) => n
                .parse::<i32>()
                .ok()
                .and_then(|n| nix::sys::signal::Signal::try_from(n).ok())
                .map(Down::Signal)
                .ok_or_else(|| format!("unknown signal in {line:?}")),
            Some(("dump", rank)) => rank
                .parse::<u32>()
                .map(Down::Dump)
                .map_err(|_| format!("a bad rank in {line:?}")),
            Some(("decision", len)) => len
                .parse::<usize>()
                .ok()
                .filter(|&n| n <= MAX_DECISION)
                .map(Down::Decision)
                .ok_or_else(|| format!("a decision of a bad length in {line:?}")),
            _ => Err(format!(
                "unknown command {:?}",
                line.chars().take(80).collect::<String>()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use nix::sys::signal::Signal;
    use proptest::prelude::*;

    use super::*;

    /// Every signal a worker can die of is named as `kill -l` names it, and its code is
    /// 128+N.
    #[test]
    fn a_workers_signal_is_named_as_kill_l_names_it() {
        let named = |n| WorkerSignal::from_number(n).unwrap().name();
        assert_eq!(named(9), "SIGKILL");
        assert_eq!(named(34), "SIGRTMIN");
        assert_eq!(named(35), "SIGRTMIN+1");
        assert_eq!(named(49), "SIGRTMIN+15");
        assert_eq!(named(50), "SIGRTMAX-14");
        assert_eq!(named(63), "SIGRTMAX-1");
        assert_eq!(named(64), "SIGRTMAX");
        // glibc keeps 32 and 33 for its threads: not named by `Signal`, nor real-time here.
        assert_eq!(named(32), "signal 32");
        assert_eq!(WorkerSignal::from_number(0), None);
        assert_eq!(WorkerSignal::from_number(65), None);
        let ending = Ending::Signaled(WorkerSignal::from_number(50).unwrap());
        assert_eq!(
            (ending.code(), ending.describe()),
            (178, "SIGRTMAX-14".into())
        );
    }

    fn all() -> Vec<Up> {
        vec![
            Up::Heartbeat,
            Up::Ready,
            Up::Line {
                rank: 7,
                stream: Stream::Stderr,
                line: b"\xffno utf-8\r".to_vec(),
            },
            Up::Line {
                rank: 0,
                stream: Stream::Stdout,
                line: Vec::new(),
            },
            Up::Lines {
                rank: 5,
                stream: Stream::Stdout,
                lines: b"first\n\nthird \xff\n".to_vec(),
            },
            Up::Exited {
                rank: 3,
                ending: Ending::Exited(-1),
            },
            Up::Exited {
                rank: 4,
                ending: Ending::Signaled(Signal::SIGKILL.into()),
            },
            Up::Exited {
                rank: 5,
                ending: Ending::Signaled(WorkerSignal::from_number(34).unwrap()),
            },
            Up::Failed {
                code: 127,
                message: "cannot start x".into(),
            },
            Up::Done,
            Up::Beat {
                rank: 2,
                beats: 1 << 40,
                step: Some(-3),
            },
            Up::Beat {
                rank: 2,
                beats: 1,
                step: None,
            },
            Up::Recorded {
                rank: 6,
                text: br#"{"message": "x"}"#.to_vec(),
            },
            Up::Stacks {
                rank: 6,
                text: b"Thread 1 (idle)\n".to_vec(),
            },
            Up::Report {
                bytes: vec![0, 1, 0xff],
            },
            Up::Via {
                host: 9,
                message: Box::new(Up::Lines {
                    rank: 5,
                    stream: Stream::Stderr,
                    lines: b"from below\n".to_vec(),
                }),
            },
            Up::Via {
                host: 3,
                message: Box::new(Up::Lost {
                    host: 8,
                    said: "Connection closed".into(),
                }),
            },
            Up::Via {
                host: 0,
                message: Box::new(Up::Said {
                    line: b"ssh: warning".to_vec(),
                }),
            },
            Up::Telemetry {
                bytes: vec![9, 8, 7],
            },
            Up::MpirunStops {
                signal: Signal::SIGTERM.into(),
            },
            Up::Group {
                rank: 3,
                group: 4_194_303,
            },
            Up::GroupGone { group: 77 },
        ]
    }

    proptest! {
        /// Whatever junk comes first and however the stream is cut, the messages come out.
        #[test]
        fn frames_survive_any_cutting(
            junk in proptest::collection::vec(1u8..=255, 0..50),
            cuts in proptest::collection::vec(0usize..400, 0..12),
        ) {
            let mut bytes = junk.clone();
            bytes.extend_from_slice(HELLO);
            for m in all() {
                encode(&m, &mut bytes);
            }
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(bytes.len())).collect();
            cuts.push(bytes.len());
            cuts.sort_unstable();
            let mut d = Decoder::default();
            let mut got = Vec::new();
            let mut from = 0;
            for c in cuts {
                got.extend(d.feed(&bytes[from..c]).unwrap());
                from = c;
            }
            prop_assert_eq!(got, all());
            prop_assert_eq!(d.noise, junk);
        }
    }

    #[test]
    fn the_tree_has_fanout_children_and_one_parent() {
        for (size, fanout) in [(6, 2), (7, 1), (100, 32), (4096, 32), (3, 64)] {
            let tree = Tree { size, fanout };
            let mut seen = vec![0; size];
            for parent in std::iter::once(None).chain((0..size).map(Some)) {
                let children = tree.children(parent);
                assert!(children.len() <= fanout);
                for c in children {
                    seen[c] += 1;
                    assert_eq!(tree.parent(c), parent, "{size} {fanout}: {c}");
                    assert_eq!(tree.top(c), parent.map_or(c, |p| tree.top(p)));
                    assert!(tree.is_below(c, tree.top(c)));
                }
            }
            assert!(seen.iter().all(|&n| n == 1), "{size} {fanout}");
        }
        // Fanout 2 over 6 hosts: depth 2; fanout 1 is a chain.
        let tree = Tree { size: 6, fanout: 2 };
        assert_eq!(tree.children(None), 0..2);
        assert_eq!(tree.children(Some(0)), 2..4);
        assert_eq!(tree.children(Some(1)), 4..6);
        assert!(tree.is_below(5, 1) && !tree.is_below(5, 0));
        let chain = Tree { size: 4, fanout: 1 };
        assert_eq!(chain.children(Some(2)), 3..4);
        assert_eq!(chain.top(3), 0);
    }

    #[test]
    fn another_versions_greeting_is_named_at_once_in_any_pieces() {
        let mut stream = b"login banner\n".to_vec();
        stream.extend_from_slice(b"\x00atlasboost-agent-7\n");
        stream.extend_from_slice(&[b'h', 0, 0, 0, 0, 0, 0, 0, 0]);
        for piece in [1, 3, 7, stream.len()] {
            let mut d = Decoder::default();
            let mut said = None;
            for chunk in stream.chunks(piece) {
                if let Err(e) = d.feed(chunk) {
                    said = Some(e);
                    break;
                }
            }
            let said = said.unwrap_or_else(|| panic!("pieces of {piece}: nothing said"));
            assert!(
                said.starts_with(
                    "it greets as atlasboost-agent-7, and this launcher speaks \
                                  atlasboost-agent-"
                ) && said.contains("another version"),
                "{said}"
            );
        }
        assert!(HELLO.starts_with(GREETING_PREFIX));
        // This version's, its line end changed on the way: said as such.
        let mut d = Decoder::default();
        let mut crlf = HELLO[..HELLO.len() - 1].to_vec();
        crlf.extend_from_slice(b"\r\n");
        let said = d.feed(&crlf).unwrap_err();
        assert!(said.contains("came with its line ends changed"), "{said}");
        // This version's greeting after the same banner is no stranger.
        let mut d = Decoder::default();
        let mut ours = b"login banner\n".to_vec();
        ours.extend_from_slice(HELLO);
        for chunk in ours.chunks(3) {
            assert!(d.feed(chunk).is_ok());
        }
        assert!(d.greeted());
    }

    #[test]
    fn malformed_frames_are_refused() {
        let mut d = Decoder::default();
        let mut bytes = HELLO.to_vec();
        bytes.extend_from_slice(&[b'?', 0, 0, 0, 0, 0, 0, 0, 0]);
        assert!(d.feed(&bytes).unwrap_err().contains("unknown kind"));
        let mut d = Decoder::default();
        let mut bytes = HELLO.to_vec();
        bytes.extend_from_slice(&[b'o', 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]);
        assert!(d.feed(&bytes).unwrap_err().contains("more than"));
        // A via frame holds one frame, never a wrapped one.
        let mut d = Decoder::default();
        let mut bytes = HELLO.to_vec();
        let mut inner = Vec::new();
        encode(
            &Up::Via {
                host: 1,
                message: Box::new(Up::Done),
            },
            &mut inner,
        );
        frame(VIA, 2, &inner, &mut bytes);
        assert!(d.feed(&bytes).unwrap_err().contains("exactly one frame"));
        // A group the launcher's guard would be told to kill: never init's, one's own, or
        // every process (a killpg of 1, 0 or a negative number).
        for group in [1i32, 0, -1] {
            let mut d = Decoder::default();
            let mut bytes = HELLO.to_vec();
            frame(GROUP, 0, &group.to_be_bytes(), &mut bytes);
            let why = d.feed(&bytes).unwrap_err();
            assert!(
                why.contains(&format!("a process group naming group {group}")),
                "{why}"
            );
        }
    }

    #[test]
    fn commands_round_trip_and_strangers_are_named() {
        for c in [
            Down::Heartbeat,
            Down::Signal(Signal::SIGTERM),
            Down::Dump(17),
            Down::Decision(440_000),
            Down::Pause,
        ] {
            assert_eq!(Down::parse(c.line().trim_end()), Ok(c));
        }
        assert!(
            Down::parse("decision x")
                .unwrap_err()
                .contains("bad length")
        );
        assert!(Down::parse(&format!("decision {}", MAX_DECISION + 1)).is_err());
        assert!(Down::parse("sig 99999").unwrap_err().contains("99999"));
        assert!(Down::parse("rm -rf").unwrap_err().contains("rm -rf"));
        assert_eq!(decision_message(b"\n\x00b"), b"decision 3\n\n\x00b");
        assert!(Down::parse("dump x").unwrap_err().contains("dump x"));
    }
}
