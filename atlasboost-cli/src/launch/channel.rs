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
}

/// Everything a remote agent needs, sent as one JSON line on its standard input.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AgentConfig {
    /// Its index in the rendezvous.
    pub index: usize,
    /// The number of hosts.
    pub hosts: usize,
    /// Its host's server id.
    pub server_id: String,
    /// Its host, as the launcher names it in messages.
    pub host: String,
    /// The launcher's host name, for the record of the table's lock.
    #[serde(default)]
    pub launcher: String,
    /// How to find devices, as the launcher resolved its flags.
    pub discovery: Discovery,
    /// The coordinator.
    pub endpoint: String,
    /// The job's id.
    pub job_id: String,
    /// The job's secret, in hex.
    pub secret: String,
    /// How long to wait for the launcher's answer, in milliseconds.
    pub timeout_ms: u64,
    /// How the workers run.
    pub workers: WorkerSettings,
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
/// lines frames, `O` and `E`).
pub const HELLO: &[u8] = b"\x00atlasboost-agent-4\n";

/// A line longer than this is passed on in pieces of this size, so that a worker printing
/// without newlines cannot make the launcher hold unbounded memory.
pub const MAX_LINE: usize = 1 << 20;

/// The largest payload of a frame: a line piece (1 MiB) with room for a message.
pub const MAX_PAYLOAD: usize = MAX_LINE + 4096;

/// How often each side sends a heartbeat.
pub const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(1);

/// Silence for this long means the other side is lost.
pub const LOST_AFTER: std::time::Duration = std::time::Duration::from_secs(4);

/// How a worker ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// It exited with this code.
    Exited(i32),
    /// A signal ended it.
    Signaled(Signal),
    /// Its host was lost; how it ended is unknown.
    Lost,
    /// It never started: the launcher it depended on (mpirun) ended first.
    NotStarted,
}

impl Ending {
    /// The exit code that reports it: the code, or 128 + the signal's number.
    pub fn code(self) -> u8 {
        match self {
            Ending::Exited(c) => (c & 0xff) as u8,
            Ending::Signaled(s) => 128u8.wrapping_add(s as u8),
            Ending::Lost | Ending::NotStarted => ExitCodes::FAILURE,
        }
    }

    /// `exit 0`, `exit 3`, `SIGKILL`, `host lost`, `not started`.
    pub fn describe(self) -> String {
        match self {
            Ending::Exited(c) => format!("exit {c}"),
            Ending::Signaled(s) => s.as_str().to_string(),
            Ending::Lost => "host lost".into(),
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
                Ending::Signaled(s) => (EXIT_SIGNAL, *s as i32),
                // Only the launcher knows these; an agent never says them of its workers.
                Ending::Lost | Ending::NotStarted => (EXIT_CODE, i32::from(ExitCodes::FAILURE)),
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
                    // Keep a tail that could be the start of HELLO.
                    let keep = self.buf.len().min(HELLO.len() - 1);
                    let cut = self.buf.len() - keep;
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
            if len > MAX_PAYLOAD {
                return Err(format!("a frame of {len} bytes, more than {MAX_PAYLOAD}"));
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
            .map_err(|_| format!("an exit frame with {} bytes", payload.len()))
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
                Signal::try_from(value()?)
                    .map_err(|_| "an exit frame with an unknown signal".to_string())?,
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
        other => return Err(format!("a frame of unknown kind {other:#04x}")),
    })
}

/// A line the launcher sends down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Down {
    /// Still here.
    Heartbeat,
    /// Pass this signal to every worker.
    Signal(nix::sys::signal::Signal),
    /// Take the stacks of this rank's worker and send them up ([`Up::Stacks`]).
    Dump(u32),
}

impl Down {
    /// The line, with its newline.
    pub fn line(self) -> String {
        match self {
            Down::Heartbeat => "hb\n".into(),
            Down::Signal(s) => format!("sig {}\n", s as i32),
            Down::Dump(rank) => format!("dump {rank}\n"),
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
            _ => Err(format!("unknown command {line:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use nix::sys::signal::Signal;
    use proptest::prelude::*;

    use super::*;

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
                ending: Ending::Signaled(Signal::SIGKILL),
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
    fn malformed_frames_are_refused() {
        let mut d = Decoder::default();
        let mut bytes = HELLO.to_vec();
        bytes.extend_from_slice(&[b'?', 0, 0, 0, 0, 0, 0, 0, 0]);
        assert!(d.feed(&bytes).unwrap_err().contains("unknown kind"));
        let mut d = Decoder::default();
        let mut bytes = HELLO.to_vec();
        bytes.extend_from_slice(&[b'o', 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]);
        assert!(d.feed(&bytes).unwrap_err().contains("more than"));
    }

    #[test]
    fn commands_round_trip_and_strangers_are_named() {
        for c in [
            Down::Heartbeat,
            Down::Signal(Signal::SIGTERM),
            Down::Dump(17),
        ] {
            assert_eq!(Down::parse(c.line().trim_end()), Ok(c));
        }
        assert!(Down::parse("sig 99999").unwrap_err().contains("99999"));
        assert!(Down::parse("rm -rf").unwrap_err().contains("rm -rf"));
        assert!(Down::parse("dump x").unwrap_err().contains("dump x"));
    }
}
