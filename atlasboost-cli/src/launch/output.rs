//! Workers' output (SPEC §7): bytes from pipes cut into lines, tagged, and written whole to the
//! console and to per-rank log files.
//!
//! Everything here runs on the supervisor's one thread, so lines from different workers can
//! never interleave: a line is appended to a buffer whole, and buffers are written with
//! `write_all` on a descriptor of our own (not `std::io::Stdout`, whose line buffering would
//! cost one system call per line).

use std::collections::{BTreeSet, VecDeque};
use std::fs::File;
use std::io::{self, BufWriter, IsTerminal, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use atlasboost_core::time::iso8601;

use nix::poll::PollFlags;

use super::channel::{MAX_LINE, Stream};
use super::terminal::TerminalWriter;
use crate::error::CliError;
use crate::writing::{write_fully, write_now};

/// A write that takes this long means the reader is not keeping up.
const STALL: Duration = Duration::from_millis(250);

/// How many of a worker's last stderr lines are kept for the failure report.
pub const TAIL_LINES: usize = 10;

/// A tail line longer than this is shortened in the failure report.
pub const TAIL_LINE_BYTES: usize = 512;

/// Cuts a byte stream into lines ending in `\n`, `\r` or `\r\n`, across reads. A line longer
/// than [`MAX_LINE`] comes out in pieces of at most that size, wherever the reads end. A lone
/// `\r` that ends nothing (tqdm's before each bar: `\rbar 1\rbar 2`) is no line: a progress
/// update is one only with something in it; an empty `\n` or `\r\n` line is one.
#[derive(Debug)]
pub struct LineSplitter {
    partial: Vec<u8>,
    /// The largest piece: [`MAX_LINE`] (smaller in tests, to reach its edges).
    max: usize,
    /// The last read ended in `\r`: a `\n` starting the next one belongs to it.
    after_cr: bool,
    /// The last read ended where a piece was cut off a long line: a terminator starting the
    /// next one ends that piece, and is not an empty line of its own.
    after_cut: bool,
    /// The last read ended in a `\r` with nothing before it: an empty line if a `\n` follows,
    /// else nothing.
    empty_before_cr: bool,
}

impl Default for LineSplitter {
    fn default() -> LineSplitter {
        LineSplitter::with_max(MAX_LINE)
    }
}

impl LineSplitter {
    /// Pieces of at most `max` bytes.
    fn with_max(max: usize) -> LineSplitter {
        LineSplitter {
            partial: Vec::new(),
            max,
            after_cr: false,
            after_cut: false,
            empty_before_cr: false,
        }
    }

    /// Feeds bytes; `emit` gets every line they complete, without its terminator.
    pub fn feed(&mut self, mut data: &[u8], emit: &mut impl FnMut(&[u8])) {
        if data.is_empty() {
            // Nothing to learn about a `\r` the last read ended in.
            return;
        }
        let empty_before_cr = std::mem::take(&mut self.empty_before_cr);
        if std::mem::take(&mut self.after_cr) && data.first() == Some(&b'\n') {
            if empty_before_cr {
                emit(b"");
            }
            data = &data[1..];
        }
        if std::mem::take(&mut self.after_cut) && matches!(data.first(), Some(b'\n' | b'\r')) {
            data = self.past_terminator(data, 0);
        }
        let max = self.max;
        while let Some(i) = memchr::memchr2(b'\n', b'\r', data) {
            if i == 0 && self.partial.is_empty() && data[0] == b'\r' {
                match data.get(1) {
                    Some(b'\n') => emit(b""),
                    Some(_) => {}
                    None => self.empty_before_cr = true,
                }
                data = self.past_terminator(data, 0);
                continue;
            }
            if self.partial.is_empty() {
                for piece in pieces(&data[..i], max) {
                    emit(piece);
                }
            } else {
                self.partial.extend_from_slice(&data[..i]);
                for piece in pieces(&self.partial, max) {
                    emit(piece);
                }
                self.partial.clear();
            }
            data = self.past_terminator(data, i);
        }
        self.partial.extend_from_slice(data);
        while self.partial.len() >= max {
            let rest = self.partial.split_off(max);
            emit(&self.partial);
            self.partial = rest;
            self.after_cut = self.partial.is_empty();
        }
    }

    /// What follows the terminator at `data[i]` (`\r\n` is one); a `\r` that ends the read
    /// may be the first half of one.
    fn past_terminator<'a>(&mut self, data: &'a [u8], i: usize) -> &'a [u8] {
        let mut next = i + 1;
        if data[i] == b'\r' {
            match data.get(next) {
                Some(b'\n') => next += 1,
                Some(_) => {}
                None => self.after_cr = true,
            }
        }
        &data[next..]
    }

    /// What has come since the last line's end, not ended yet (`initializing HCCL...` of a
    /// worker that hangs before its newline).
    pub fn unfinished(&self) -> &[u8] {
        &self.partial
    }

    /// The stream ended: a last line without terminator is still a line.
    pub fn finish(&mut self, emit: &mut impl FnMut(&[u8])) {
        if !self.partial.is_empty() {
            emit(&self.partial);
            self.partial = Vec::new();
        }
    }
}

/// The last lines of a process's own messages (ssh's stderr, mpirun's), kept for the error
/// message that names it when it fails.
#[derive(Debug)]
pub struct Tail {
    lines: VecDeque<String>,
    keep: usize,
}

impl Tail {
    /// Keeps the last `keep` lines.
    pub fn new(keep: usize) -> Tail {
        Tail {
            lines: VecDeque::with_capacity(keep),
            keep,
        }
    }

    /// One more line.
    pub fn push(&mut self, line: String) {
        if self.lines.len() == self.keep {
            self.lines.pop_front();
        }
        self.lines.push_back(line);
    }

    /// The lines kept, oldest first, joined with ` | `; `None` if there are none.
    pub fn joined(&self) -> Option<String> {
        (!self.lines.is_empty()).then(|| self.lines.iter().cloned().collect::<Vec<_>>().join(" | "))
    }
}

/// A line in pieces of at most `max` bytes (one piece for an empty line).
fn pieces(line: &[u8], max: usize) -> impl Iterator<Item = &[u8]> {
    let empty: &[u8] = &[];
    line.chunks(max).chain(line.is_empty().then_some(empty))
}

/// How a [`Sink`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Every flush writes everything, waiting for the reader as long as it takes: a terminal,
    /// a regular file, a socket.
    Whole,
    /// A pipe, on a non-blocking description of its own: a flush writes what the reader
    /// takes now, and the rest waits in the buffer, so that the supervisor's loop goes on
    /// (signals, the grace time) while nobody reads (`| less` left alone, `| sleep`).
    Pending,
    /// A terminal, written by a thread of its own ([`TerminalWriter`]): a flush queues the
    /// bytes, and the loop goes on while the terminal is paused (Ctrl-S, a stalled ssh link).
    Thread,
}

/// A descriptor written with whole buffers; once its reader is gone (`| head`), output to it
/// is dropped and the job goes on.
#[derive(Debug)]
struct Sink {
    file: File,
    /// Bytes to write: `buf[start..]` (what a partial write left; compacted lazily, so that a
    /// slow reader does not cost a copy of the backlog per write).
    buf: Vec<u8>,
    start: usize,
    mode: Mode,
    closed: bool,
    /// A write had to wait for the reader (see [`Output::take_stall`]).
    stalled: bool,
    /// The last flush left bytes the reader did not take: the next is tried at the end of
    /// the supervisor's pass, not at every line.
    behind: bool,
    /// Why writing failed, other than a reader that went away (`| head`): said once.
    failure: Option<String>,
    /// The status block every write goes around (on a terminal).
    around: Option<indicatif::MultiProgress>,
    /// [`Mode::Thread`]'s writer.
    terminal: Option<TerminalWriter>,
}

impl Sink {
    /// A sink that writes whole buffers to `file`.
    fn new(file: File) -> Sink {
        Sink {
            file,
            buf: Vec::with_capacity(1 << 16),
            start: 0,
            mode: Mode::Whole,
            closed: false,
            stalled: false,
            behind: false,
            failure: None,
            around: None,
            terminal: None,
        }
    }

    /// This sink, written by a thread of its own if it is a terminal ([`Mode::Thread`]); as
    /// it was if the thread cannot be started.
    fn threaded_if_terminal(mut self) -> Sink {
        if self.mode == Mode::Whole
            && self.file.is_terminal()
            && let Ok(file) = self.file.try_clone()
            && let Ok(writer) = TerminalWriter::start(file)
        {
            self.terminal = Some(writer);
            self.mode = Mode::Thread;
        }
        self
    }

    /// A sink for the console `fd` (standard output or error). A pipe is opened again
    /// (`/proc/self/fd/N`), on a description of its own that can be non-blocking without
    /// changing the one the shell and the pipe's other writers share, and written in
    /// [`Mode::Pending`]. Anything else is written whole: a terminal (the status block draws on
    /// it, and a line must not be cut by stderr's), a file, a socket, or a pipe that cannot be
    /// opened again (its reader is gone, or there is no /proc).
    fn console(fd: BorrowedFd<'_>) -> io::Result<Sink> {
        use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
        let mut sink = Sink::new(File::from(fd.try_clone_to_owned()?));
        let meta = sink.file.metadata()?;
        if meta.file_type().is_fifo() {
            let own = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
                .open(format!("/proc/self/fd/{}", fd.as_raw_fd()));
            // The same pipe, not another object under that name.
            if let Ok(own) = own
                && same_object(&own, &sink.file)
            {
                sink.file = own;
                sink.mode = Mode::Pending;
            }
        }
        Ok(sink)
    }

    /// Bytes that wait for the reader (also in a terminal's queue).
    fn pending(&self) -> usize {
        self.buf.len() - self.start + self.terminal.as_ref().map_or(0, TerminalWriter::pending)
    }

    /// Whether bytes wait for a reader that has not taken them yet.
    fn waiting(&self) -> bool {
        !self.closed && self.pending() > 0
    }

    /// Drops every byte waiting.
    fn clear(&mut self) {
        self.buf.clear();
        self.start = 0;
    }

    fn flush(&mut self) {
        if let Some(terminal) = self.terminal.take() {
            self.queue_for(&terminal);
            self.terminal = Some(terminal);
            return;
        }
        if self.closed || self.pending() == 0 {
            self.clear();
            return;
        }
        let started = Instant::now();
        let (file, bytes, mode) = (&self.file, &self.buf[self.start..], self.mode);
        let write = || match mode {
            // (A terminal's thread writes its queue: see `queue_for`.)
            Mode::Whole | Mode::Thread => write_fully(file, bytes, None).map(|()| bytes.len()),
            Mode::Pending => write_now(file, bytes),
        };
        let written = match &self.around {
            // The block is taken away, the lines written, and the block drawn below them.
            Some(block) => block.suspend(write),
            None => write(),
        };
        self.behind = false;
        match written {
            Ok(n) if n == self.pending() => self.clear(),
            Ok(n) => {
                self.start += n;
                self.behind = true;
                if self.start > self.buf.len() / 2 {
                    self.buf.drain(..self.start);
                    self.start = 0;
                }
            }
            Err(e) => {
                if e.kind() != io::ErrorKind::BrokenPipe {
                    self.failure = Some(e.to_string());
                }
                self.closed = true;
                self.clear();
            }
        }
        if started.elapsed() >= STALL {
            self.stalled = true;
        }
    }
}

impl Sink {
    /// [`Mode::Thread`]'s flush: queues the buffer (around the status block), and takes note
    /// of a terminal that failed. Never waits.
    fn queue_for(&mut self, terminal: &TerminalWriter) {
        terminal.woken();
        if let Some(e) = terminal.take_failure() {
            if e.kind() != io::ErrorKind::BrokenPipe {
                self.failure = Some(e.to_string());
            }
            self.closed = true;
        }
        if !self.closed && self.buf.len() > self.start {
            let bytes = &self.buf[self.start..];
            match &self.around {
                Some(block) => block.suspend(|| terminal.push(bytes)),
                None => terminal.push(bytes),
            }
        }
        self.clear();
    }
}

/// Whether `a` and `b` are the same file (device and inode).
fn same_object(a: &File, b: &File) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (a.metadata(), b.metadata()) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

/// How the console shows workers' lines.
#[derive(Debug, Clone, Default)]
pub struct OutputOptions {
    /// Prefix `[rank]<stream>:`.
    pub tag: bool,
    /// Prefix the time.
    pub timestamp: bool,
    /// Show only these ranks on the console.
    pub ranks: Option<BTreeSet<u32>>,
    /// Also write `DIR/rank.<rank>/{stdout,stderr}.log`.
    pub log_dir: Option<PathBuf>,
    /// Keep each rank's last line, for the hang watchdog's report (a copy per line: only when
    /// `--hang-timeout` asks for it).
    pub keep_last_line: bool,
    /// `--events`: where the job's events go (the launcher's only).
    pub events: Option<super::events::Events>,
    /// Keep a live status block at the bottom of the console (stderr is a terminal).
    pub status: bool,
}

/// How long [`Output::drain_console`] waits for the console to take what is left.
#[derive(Debug, Clone, Copy)]
pub enum DrainFor<'a> {
    /// At most this long (`None`: as long as it takes).
    AtMost(Option<Duration>),
    /// At most this long: what is left of the grace time since a signal, at this instant,
    /// asked the job to stop.
    AfterSignal(Duration, Instant),
    /// An agent's or a relay's: for as long as the launcher is heard on this descriptor (its
    /// commands), at least once in this long (`--host-timeout`). A launcher whose console
    /// holds output back reads nothing for a while but still sends its heartbeats.
    WhileHeard(BorrowedFd<'a>, Duration),
}

/// One worker's part of the output.
#[derive(Debug)]
struct Lane {
    rank: u32,
    tags: [Vec<u8>; 2],
    shown: bool,
    logs: Option<[BufWriter<File>; 2]>,
    tail: VecDeque<Vec<u8>>,
    /// Lines so far, for the hang watchdog.
    lines: u64,
    /// Bytes read from the worker's pipes so far, for the hang watchdog: a worker that prints
    /// without a newline (a row of dots) shows progress too.
    bytes: u64,
    /// The last line of either stream (its start), for the hang watchdog's report.
    last: Vec<u8>,
}

/// The console and log files of a launch.
#[derive(Debug)]
pub struct Output {
    out: Sink,
    err: Sink,
    options: OutputOptions,
    stamp: Vec<u8>,
    lanes: Vec<Lane>,
    /// A remote agent's output: every line goes to the launcher as a frame on stdout.
    upstream: bool,
    /// Standard error is the same pipe as standard output (`2>&1 | ...`): its lines go into
    /// stdout's buffer, in order, so that a partial write of one is never cut by the other's.
    err_is_out: bool,
    /// Upstream: the lines frame being filled at the end of `out.buf` (rank, stream, where).
    batch: Option<(u32, Stream, usize)>,
    /// The live status block, on a terminal.
    status: Option<super::status::StatusBlock>,
    /// A log file could not be written (said once): the logs are given up.
    logs_failed: bool,
    /// A relay's: its own messages go to the launcher as frames (its stderr is mpirun's, which
    /// would tag them as the rank's output).
    messages_upstream: bool,
    /// An agent's or relay's launcher said it is stopping (Ctrl-Z): its silence is no loss.
    reader_paused: bool,
}

impl Output {
    /// Output for workers of these ranks (by worker index); creates the log directories.
    ///
    /// # Errors
    ///
    /// [`CliError::Failure`] for a console that cannot be duplicated. (A log that cannot be
    /// created is said on stderr, and the job's logs are given up: the job goes on.)
    pub fn new(options: OutputOptions, ranks: &[u32]) -> Result<Output, CliError> {
        let console = |e| CliError::system("use the console")(e);
        let out = Sink::console(io::stdout().as_fd()).map_err(console)?;
        let err = Sink::console(io::stderr().as_fd()).map_err(console)?;
        let (mut out, mut err) = (out.threaded_if_terminal(), err.threaded_if_terminal());
        // One terminal is written by one thread, or by none (if a thread could not start):
        // never by a thread and the loop at once.
        if out.mode != err.mode && same_object(&out.file, &err.file) {
            for sink in [&mut out, &mut err] {
                if sink.terminal.take().is_some() {
                    sink.mode = Mode::Whole;
                }
            }
        }
        Output::with_sinks(options, ranks, out, err)
    }

    /// [`Output::new`] writing to `out` and `err`.
    fn with_sinks(
        options: OutputOptions,
        ranks: &[u32],
        out: Sink,
        err: Sink,
    ) -> Result<Output, CliError> {
        let mut lanes = Vec::with_capacity(ranks.len());
        // A log that cannot be created (a full disk at a restart) gives the logs up, as one
        // that cannot be written does: the job goes on.
        let mut log_failure: Option<CliError> = None;
        for &rank in ranks {
            let logs = match (&options.log_dir, &log_failure) {
                (Some(dir), None) => open_logs(dir, rank).map_err(|e| log_failure = Some(e)).ok(),
                _ => None,
            };
            lanes.push(Lane {
                rank,
                tags: [
                    format!("[{rank}]<stdout>:").into_bytes(),
                    format!("[{rank}]<stderr>:").into_bytes(),
                ],
                shown: options.ranks.as_ref().is_none_or(|r| r.contains(&rank)),
                logs,
                tail: VecDeque::new(),
                lines: 0,
                bytes: 0,
                last: Vec::new(),
            });
        }
        // One terminal, one writer: two would cut each other's lines.
        let err_is_out = matches!(out.mode, Mode::Pending | Mode::Thread)
            && out.mode == err.mode
            && same_object(&out.file, &err.file);
        let mut err = err;
        if err_is_out {
            err.terminal = None;
            err.mode = Mode::Whole;
        }
        let mut output = Output {
            out,
            err,
            options,
            stamp: Vec::new(),
            lanes,
            upstream: false,
            err_is_out,
            batch: None,
            status: None,
            logs_failed: false,
            messages_upstream: false,
            reader_paused: false,
        };
        if let Some(e) = log_failure {
            output.logs_failed = true;
            output.message(&format!(
                "atlasboost: warning: {}; the logs of this job are incomplete from here on",
                atlasboost_core::exchange::error_chain(&e)
            ));
        }
        if output.options.status {
            // Drawn through the terminal's writer, in order with the lines.
            let writer = match output.err_is_out {
                true => output.out.terminal.as_ref(),
                false => output.err.terminal.as_ref(),
            };
            let block = super::status::StatusBlock::new(writer.map(TerminalWriter::term));
            // Lines written to a file or a pipe need not move the block.
            if io::stdout().is_terminal() {
                output.out.around = Some(block.multi());
            }
            output.err.around = Some(block.multi());
            output.status = Some(block);
        }
        output.tick();
        Ok(output)
    }

    /// A remote agent's output: lines become [`channel`](super::channel) frames on stdout.
    ///
    /// # Errors
    ///
    /// As [`Output::new`].
    pub fn upstream(ranks: &[u32]) -> Result<Output, CliError> {
        let stdout = io::stdout()
            .as_fd()
            .try_clone_to_owned()
            .map_err(CliError::system("use standard output"))?;
        Output::upstream_to(stdout, ranks)
    }

    /// Output whose lines become [`channel`](super::channel) frames on `connection` (a remote
    /// agent's stdout, a relay's connection to the launcher); messages still go to stderr.
    ///
    /// # Errors
    ///
    /// As [`Output::new`].
    pub fn upstream_to(connection: OwnedFd, ranks: &[u32]) -> Result<Output, CliError> {
        // The launcher stops reading while its own console holds output back (`| less`), for
        // as long as that takes: frames wait here, and the workers' pipes are not read, as on
        // the launcher's host. Whether the launcher is still there is told by its heartbeats,
        // not by whether it reads (see `drain_console`). Messages go the same way when stderr
        // is a pipe.
        let _ = nix::fcntl::fcntl(
            &connection,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        );
        let mut out = Sink::new(File::from(connection));
        out.mode = Mode::Pending;
        let err =
            Sink::console(io::stderr().as_fd()).map_err(CliError::system("use the console"))?;
        let mut output = Output::with_sinks(OutputOptions::default(), ranks, out, err)?;
        output.upstream = true;
        Ok(output)
    }

    /// A relay's output: its own messages go to the launcher as frames too, not to stderr.
    pub fn send_messages_upstream(&mut self) {
        self.messages_upstream = true;
    }

    /// Writing to an agent's launcher failed (its connection is gone): nothing more can be
    /// sent.
    pub fn upstream_closed(&self) -> bool {
        self.upstream && self.out.closed
    }

    /// Shows `lines` in the status block, when there is one.
    pub fn set_status(&mut self, lines: &[String]) {
        if let Some(block) = &mut self.status {
            // Lines waiting to be written go first, above the block.
            self.out.flush();
            self.err.flush();
            block.show(lines);
        }
    }

    /// Takes the status block away for good: the summary follows.
    pub fn end_status(&mut self) {
        if let Some(mut block) = self.status.take() {
            self.out.flush();
            self.err.flush();
            block.clear();
            self.out.around = None;
            self.err.around = None;
        }
    }

    /// Whether a status block is shown.
    pub fn has_status(&self) -> bool {
        self.status.is_some()
    }

    /// Records an event in the `--events` file, if there is one (SPEC §13).
    pub fn event(&mut self, event: &str, fields: serde_json::Value) {
        super::events::emit(self.options.events.as_ref(), event, fields);
    }

    /// Sends a message to the launcher now (an agent's output only).
    pub fn send(&mut self, message: &super::channel::Up) {
        if self.upstream {
            self.close_batch();
            super::channel::encode(message, &mut self.out.buf);
            self.out.flush();
        }
    }

    /// Tells the launcher that this agent or relay failed with `error` (its last frame);
    /// returns the error's exit code.
    pub fn send_failure(&mut self, error: &CliError) -> u8 {
        let code = error.exit_code();
        self.send(&super::channel::Up::Failed {
            code,
            message: atlasboost_core::exchange::error_chain(error),
        });
        code
    }

    /// Puts `message` before what is sent next, without sending it now (an agent's or relay's
    /// output only): a frame that may wait for the next, so that both wake the launcher once.
    pub fn queue(&mut self, message: &super::channel::Up) {
        if self.upstream {
            self.close_batch();
            super::channel::encode(message, &mut self.out.buf);
        }
    }

    /// Takes the time for the lines that follow (once per batch of reads, not per line).
    pub fn tick(&mut self) {
        if self.options.timestamp {
            self.stamp.clear();
            self.stamp
                .extend_from_slice(iso8601(SystemTime::now()).as_bytes());
            self.stamp.push(b' ');
        }
    }

    /// One complete line of worker `lane`.
    pub fn line(&mut self, lane: usize, stream: Stream, line: &[u8]) {
        let Some(l) = self.lanes.get_mut(lane) else {
            return;
        };
        let i = stream as usize;
        l.lines += 1;
        if self.upstream {
            let rank = l.rank;
            // Consecutive lines of one worker's stream share a frame, up to the payload limit
            // (a line is at most MAX_LINE, so it always fits a frame of its own).
            let fits = self.batch.is_some_and(|(r, s, at)| {
                r == rank
                    && s == stream
                    && self.out.buf.len() - at - 9 + line.len() < super::channel::MAX_PAYLOAD
            });
            if !fits {
                self.close_batch();
                let at = super::channel::open_lines(rank, stream, &mut self.out.buf);
                self.batch = Some((rank, stream, at));
            }
            self.out.buf.extend_from_slice(line);
            self.out.buf.push(b'\n');
            // Not while the launcher is behind: the pass's end tries again, and a frame per
            // line would follow.
            if self.out.buf.len() >= 1 << 16 && !self.out.behind {
                self.close_batch();
                self.out.flush();
            }
            return;
        }
        if let Some(logs) = &mut l.logs
            && !self.logs_failed
            && let Err(e) = logs[i]
                .write_all(line)
                .and_then(|()| logs[i].write_all(b"\n"))
        {
            // A full disk must not stop the job; the console still has the line.
            let rank = l.rank;
            self.log_failed(rank, stream, &e);
            return self.line_on_console(lane, stream, line);
        }
        self.line_on_console(lane, stream, line);
    }

    /// The rest of [`Output::line`]: the watchdog's last line, the stderr tail, the console.
    fn line_on_console(&mut self, lane: usize, stream: Stream, line: &[u8]) {
        let Some(l) = self.lanes.get_mut(lane) else {
            return;
        };
        let i = stream as usize;
        if self.options.keep_last_line {
            l.last.clear();
            l.last
                .extend_from_slice(&line[..line.len().min(TAIL_LINE_BYTES)]);
        }
        if stream == Stream::Stderr {
            // Once the tail is full, the oldest line's buffer is reused: no allocation per line.
            let mut kept = if l.tail.len() == TAIL_LINES {
                l.tail.pop_front().unwrap_or_default()
            } else {
                Vec::with_capacity(TAIL_LINE_BYTES)
            };
            kept.clear();
            kept.extend_from_slice(&line[..line.len().min(TAIL_LINE_BYTES)]);
            l.tail.push_back(kept);
        }
        if !l.shown {
            return;
        }
        let sink = match stream {
            Stream::Stderr if !self.err_is_out => &mut self.err,
            _ => &mut self.out,
        };
        sink.buf.extend_from_slice(&self.stamp);
        if self.options.tag {
            sink.buf.extend_from_slice(&l.tags[i]);
        }
        sink.buf.extend_from_slice(line);
        sink.buf.push(b'\n');
        if sink.buf.len() >= 1 << 16 && !sink.behind {
            sink.flush();
        }
    }

    /// A message of atlasboost's own on stderr, after the workers' lines so far.
    pub fn message(&mut self, text: &str) {
        if self.upstream {
            // The launcher's console prefixes it with `atlasboost: host <host>:` (or the rank)
            // already.
            let text = text
                .strip_prefix("atlasboost agent: ")
                .or_else(|| text.strip_prefix("atlasboost: "))
                .unwrap_or(text);
            // A relay's goes as a frame while its launcher is there; else (and an agent's
            // always) on stderr.
            if self.messages_upstream && !self.upstream_closed() {
                self.send(&super::channel::Up::Said {
                    line: text.as_bytes().to_vec(),
                });
                return;
            }
            self.err.buf.extend_from_slice(text.as_bytes());
            self.err.buf.push(b'\n');
            self.err.flush();
            return;
        }
        let sink = match self.err_is_out {
            true => &mut self.out,
            false => {
                self.out.flush();
                &mut self.err
            }
        };
        sink.buf.extend_from_slice(text.as_bytes());
        sink.buf.push(b'\n');
        sink.flush();
    }

    /// Ends the lines frame being filled, if any.
    fn close_batch(&mut self) {
        if let Some((_, _, at)) = self.batch.take() {
            super::channel::close_lines(&mut self.out.buf, at);
        }
    }

    /// Writes what is buffered (at the end of each batch of reads, so output is live).
    pub fn flush(&mut self) {
        self.close_batch();
        self.out.flush();
        self.err.flush();
        // A console that fails (a full disk), unlike one whose reader left, is said once.
        if let Some(why) = self.out.failure.take().filter(|_| !self.upstream) {
            let text = format!(
                "atlasboost: warning: cannot write the workers' output to standard output \
                 ({why}); it is dropped from now on{}",
                self.logs_have_them()
            );
            self.err.buf.extend_from_slice(text.as_bytes());
            self.err.buf.push(b'\n');
            self.err.flush();
        }
        let mut failed = None;
        for l in &mut self.lanes {
            if let Some(logs) = &mut l.logs {
                for (stream, log) in [Stream::Stdout, Stream::Stderr].into_iter().zip(logs) {
                    if let Err(e) = log.flush() {
                        failed.get_or_insert((l.rank, stream, e));
                    }
                }
            }
        }
        if let Some((rank, stream, e)) = failed {
            self.log_failed(rank, stream, &e);
        }
    }

    /// A log file that cannot be written (a full disk): said once, with the file, and the
    /// logs are written no more (the console still has the lines).
    fn log_failed(&mut self, rank: u32, stream: Stream, e: &io::Error) {
        if self.logs_failed {
            return;
        }
        self.logs_failed = true;
        let file = self
            .options
            .log_dir
            .as_ref()
            .map_or_else(String::new, |dir| {
                dir.join(format!("rank.{rank}"))
                    .join(format!("{}.log", stream.as_str()))
                    .display()
                    .to_string()
            });
        self.message(&format!(
            "atlasboost: warning: cannot write the log {file}: {e}; the logs of this job are \
             incomplete from here on"
        ));
    }

    /// Whether writing had to wait for a slow reader (a console nobody reads, a paused
    /// terminal) since the last call. Peers could not be heard meanwhile, so their silence
    /// must not count against them.
    pub fn take_stall(&mut self) -> bool {
        std::mem::take(&mut self.out.stalled) | std::mem::take(&mut self.err.stalled)
    }

    /// Bytes of the console's that its reader has not taken yet.
    pub fn backlog(&self) -> usize {
        [&self.out, &self.err]
            .iter()
            .filter(|s| s.waiting())
            .map(|s| s.pending())
            .sum()
    }

    /// The console's descriptors that have bytes waiting for their reader, and what to wait
    /// for until it takes some: `POLLOUT` on a pipe, `POLLIN` on a terminal writer's wake
    /// (then [`Output::flush`]).
    pub fn waiting_fds(&self) -> Vec<(BorrowedFd<'_>, PollFlags)> {
        [&self.out, &self.err]
            .into_iter()
            .filter(|s| s.waiting())
            .filter_map(|s| match (&s.terminal, s.mode) {
                (Some(t), _) => Some((t.wake_fd(), PollFlags::POLLIN)),
                (None, Mode::Pending) => Some((s.file.as_fd(), PollFlags::POLLOUT)),
                (None, _) => None,
            })
            .collect()
    }

    /// At the end: waits until the console has taken every byte, for as long as `wait` says,
    /// or until a signal that stops the job arrives. When `interrupt` (a signalfd) is
    /// readable, `stops` reads it and says whether one of its signals stops the job (a SIGCHLD
    /// does not). What is left then is dropped, and said on stderr if stderr can take it. The
    /// log files (`--log-dir`) have everything.
    pub fn drain_console(
        &mut self,
        interrupt: BorrowedFd<'_>,
        wait: DrainFor<'_>,
        stops: &mut dyn FnMut() -> bool,
    ) {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        self.flush();
        let started = Instant::now();
        let mut heard = started;
        loop {
            let left = match wait {
                DrainFor::AtMost(limit) => limit.map(|l| l.saturating_sub(started.elapsed())),
                DrainFor::AfterSignal(limit, _) => Some(limit.saturating_sub(started.elapsed())),
                // A launcher stopped by Ctrl-Z is waited for until it speaks or its connection
                // closes.
                DrainFor::WhileHeard(..) if self.reader_paused => None,
                DrainFor::WhileHeard(_, lost_after) => {
                    Some(lost_after.saturating_sub(heard.elapsed()))
                }
            };
            let waiting = self.waiting_fds();
            if waiting.is_empty() {
                return;
            }
            let mut fds: Vec<PollFd<'_>> = waiting
                .into_iter()
                .map(|(fd, flags)| PollFd::new(fd, flags))
                .collect();
            let at_interrupt = fds.len();
            fds.push(PollFd::new(interrupt, PollFlags::POLLIN));
            if let DrainFor::WhileHeard(launcher, _) = wait {
                fds.push(PollFd::new(launcher, PollFlags::POLLIN));
            }
            let timeout = left.map_or(PollTimeout::NONE, |l| {
                PollTimeout::try_from(l).unwrap_or(PollTimeout::MAX)
            });
            let ready = match poll(&mut fds, timeout) {
                Ok(n) => n,
                Err(nix::errno::Errno::EINTR) => continue,
                // Cannot wait: what the console has not taken is not waited for.
                Err(_) => 0,
            };
            let readable = |i: usize| {
                fds.get(i)
                    .and_then(PollFd::revents)
                    .is_some_and(|r| !r.is_empty())
            };
            let (interrupted, launcher_said) = (readable(at_interrupt), readable(at_interrupt + 1));
            drop(fds);
            let signalled = interrupted && stops();
            let mut gone = false;
            if let (DrainFor::WhileHeard(launcher, _), true) = (wait, launcher_said) {
                // Its commands are of no use now (every worker has ended): only that it speaks.
                let mut buf = [0u8; 4096];
                match nix::unistd::read(launcher, &mut buf) {
                    Ok(0) => gone = true,
                    Ok(n) => {
                        heard = Instant::now();
                        let pause = super::channel::Down::Pause.line();
                        self.reader_paused = buf[..n].ends_with(pause.as_bytes());
                    }
                    Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => {}
                    Err(_) => gone = true,
                }
            }
            if ready == 0 || signalled || gone {
                self.give_up_console(&match (signalled, gone, wait) {
                    (true, _, _) => "a signal came".to_string(),
                    (_, true, _) => "the launcher's connection closed".to_string(),
                    (_, _, DrainFor::AtMost(limit)) => format!(
                        "the job's end waited {:.0?} for it",
                        limit.unwrap_or_default()
                    ),
                    (_, _, DrainFor::AfterSignal(_, at)) => format!(
                        "a signal asked to stop {:.1} s ago",
                        at.elapsed().as_secs_f64()
                    ),
                    (_, _, DrainFor::WhileHeard(_, lost_after)) => {
                        format!("the launcher sent nothing for {lost_after:.0?}")
                    }
                });
                return;
            }
            self.flush();
        }
    }

    /// An agent's or relay's launcher (the reader of this output) said it is stopping
    /// (`pause`), or spoke again: while it is stopped, [`DrainFor::WhileHeard`] takes its
    /// silence for no loss.
    pub fn set_reader_paused(&mut self, paused: bool) {
        self.reader_paused = paused;
    }

    /// Whether the reader of this output said it is stopping, and has not spoken since.
    pub fn reader_paused(&self) -> bool {
        self.reader_paused
    }

    /// Drops what the console has not taken, and every line after it (the log files still
    /// get them), saying so on stderr if stderr can take it: the console took nothing, and
    /// `why` it is not waited for.
    pub fn give_up_console(&mut self, why: &str) {
        // An open lines frame lives in the buffer dropped below.
        self.batch = None;
        let mut dropped = 0;
        // Only a stream that holds bytes back is given up; the other one still works.
        for sink in [&mut self.out, &mut self.err] {
            if sink.waiting() {
                dropped += sink.buf.len() - sink.start;
                sink.clear();
                if let Some(terminal) = &sink.terminal {
                    // (The chunk being written, at most 64 KiB, still shows when the
                    // terminal takes it.)
                    dropped += terminal.drop_queued();
                    // Half a redraw may have been dropped: the block no longer knows what
                    // the screen shows.
                    if let Some(block) = &mut self.status {
                        block.hide();
                    }
                }
                sink.closed = true;
            }
        }
        // An agent's stderr reaches the launcher's console, which names the host.
        let (prefix, reader) = match self.upstream {
            true => ("", "the launcher"),
            false => ("atlasboost: ", "the console"),
        };
        let note = format!(
            "{prefix}{reader} took nothing more, and {why}: {dropped} bytes of output, and the \
             lines after them, are not shown{}\n",
            self.logs_have_them()
        );
        // Said only where it can be: stderr may be the console that took nothing.
        if !self.err.closed && !self.err_is_out {
            self.err.buf.extend_from_slice(note.as_bytes());
            self.err.flush();
        }
    }

    /// ` (the logs in DIR have them)` with `--log-dir`, for messages about lines not shown.
    fn logs_have_them(&self) -> String {
        match &self.options.log_dir {
            Some(dir) => format!(" (the logs in {} have them)", dir.display()),
            None => String::new(),
        }
    }

    /// How many lines worker `lane` has printed.
    pub fn line_count(&self, lane: usize) -> u64 {
        self.lanes.get(lane).map_or(0, |l| l.lines)
    }

    /// Counts `n` bytes read from worker `lane`'s pipes (whole lines or not).
    pub fn count_bytes(&mut self, lane: usize, n: usize) {
        if let Some(l) = self.lanes.get_mut(lane) {
            l.bytes += n as u64;
        }
    }

    /// How many bytes have been read from worker `lane`'s pipes (0 for a worker of another
    /// host, whose lines come whole).
    pub fn byte_count(&self, lane: usize) -> u64 {
        self.lanes.get(lane).map_or(0, |l| l.bytes)
    }

    /// The last line worker `lane` printed (its first bytes), if any.
    pub fn last_line(&self, lane: usize) -> Option<String> {
        self.lanes
            .get(lane)
            .filter(|l| l.lines > 0)
            .map(|l| String::from_utf8_lossy(&l.last).into_owned())
    }

    /// The last stderr lines of worker `lane`, oldest first.
    pub fn tail(&self, lane: usize) -> Vec<String> {
        self.lanes.get(lane).map_or_else(Vec::new, |l| {
            l.tail
                .iter()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .collect()
        })
    }
}

/// The log directory of one job under `--log-dir DIR`: `DIR/<job id>`, with `DIR/latest`
/// pointing at it. A job that ends before any worker wrote a log leaves nothing behind: on
/// drop, or [`JobLogDir::forget_if_unused`], an empty directory is removed and `latest` points
/// back where it did before.
#[derive(Debug)]
pub struct JobLogDir {
    path: PathBuf,
    /// `DIR/latest` and what it named before this job (`None`: no link), once pointed here.
    latest: Option<(PathBuf, Option<PathBuf>)>,
}

impl JobLogDir {
    /// Makes `DIR/<job id>` new (a job's logs never replace another's) and points
    /// `DIR/latest` at it. Returns the directory, and a warning when `DIR/latest` cannot be
    /// pointed there (the logs are written all the same).
    ///
    /// # Errors
    ///
    /// [`CliError::File`] naming a directory that cannot be made (or exists already).
    pub fn create(dir: &Path, job_id: &str) -> Result<(JobLogDir, Option<String>), CliError> {
        let path = dir.join(job_id);
        std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::create_dir(&path))
            .map_err(CliError::file("create log directory", &path))?;
        // A new link renamed over the old one: `latest` always names a whole job's directory.
        let latest = dir.join("latest");
        let previous = std::fs::read_link(&latest).ok();
        let fresh = dir.join(format!(".latest-{job_id}"));
        // Only a link is replaced: a file or directory of that name is the user's, not ours.
        let pointed = match std::fs::symlink_metadata(&latest) {
            Ok(m) if !m.file_type().is_symlink() => Err(std::io::Error::other(format!(
                "it is a {} atlasboost did not make; left as it is",
                if m.is_dir() { "directory" } else { "file" }
            ))),
            _ => std::os::unix::fs::symlink(job_id, &fresh)
                .and_then(|()| std::fs::rename(&fresh, &latest))
                .inspect_err(|_| {
                    let _ = std::fs::remove_file(&fresh);
                }),
        };
        let warning = pointed.as_ref().err().map(|e| {
            format!(
                "atlasboost: warning: cannot point {} at this job's logs ({e}); they are in {}",
                latest.display(),
                path.display()
            )
        });
        let latest = pointed.ok().map(|()| (latest, previous));
        Ok((JobLogDir { path, latest }, warning))
    }

    /// `DIR/<job id>`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the directory if no worker wrote a log into it, pointing `latest` back (unless
    /// another job has pointed it elsewhere since). Returns whether it was removed.
    pub fn forget_if_unused(&self) -> bool {
        // remove_dir removes only an empty directory: a worker's rank.N keeps it.
        if std::fs::remove_dir(&self.path).is_err() {
            return false;
        }
        self.point_latest_back();
        true
    }

    /// For a launch that failed as its workers started (a command not found, an mpirun that
    /// placed no rank): removes the directory if its logs are all empty, as
    /// [`JobLogDir::forget_if_unused`] does. Returns whether it was removed.
    pub fn forget_if_nothing_written(&self) -> bool {
        fn all_empty(dir: &Path) -> bool {
            std::fs::read_dir(dir).is_ok_and(|entries| {
                entries.into_iter().all(|e| {
                    e.is_ok_and(|e| match e.file_type() {
                        Ok(t) if t.is_dir() => all_empty(&e.path()),
                        Ok(t) if t.is_file() => e.metadata().is_ok_and(|m| m.len() == 0),
                        _ => false,
                    })
                })
            })
        }
        if !all_empty(&self.path) || std::fs::remove_dir_all(&self.path).is_err() {
            return false;
        }
        self.point_latest_back();
        true
    }

    /// `latest` names the job before this one again (unless another job has pointed it
    /// elsewhere since), once this job's directory is gone.
    fn point_latest_back(&self) {
        if let Some((latest, previous)) = &self.latest
            && std::fs::read_link(latest).ok().as_deref() == self.path.file_name().map(Path::new)
        {
            // (A job before that has gone since is not pointed at.)
            let _ = match previous
                .as_ref()
                .filter(|p| latest.with_file_name(p).exists())
            {
                Some(target) => {
                    let fresh = latest.with_extension(format!("restore-{}", std::process::id()));
                    std::os::unix::fs::symlink(target, &fresh)
                        .and_then(|()| std::fs::rename(&fresh, latest))
                        .inspect_err(|_| {
                            let _ = std::fs::remove_file(&fresh);
                        })
                }
                None => std::fs::remove_file(latest),
            };
        }
    }
}

impl Drop for JobLogDir {
    fn drop(&mut self) {
        self.forget_if_unused();
    }
}

fn open_logs(dir: &Path, rank: u32) -> Result<[BufWriter<File>; 2], CliError> {
    let dir = dir.join(format!("rank.{rank}"));
    std::fs::create_dir_all(&dir).map_err(CliError::file("create log directory", &dir))?;
    let open = |stream: Stream| {
        let path = dir.join(format!("{}.log", stream.as_str()));
        // A job's directory is new, so this never meets a file; if it did, it stays whole.
        File::options()
            .write(true)
            .create_new(true)
            .open(&path)
            .map(|f| BufWriter::with_capacity(1 << 15, f))
            .map_err(CliError::file("create", &path))
    };
    Ok([open(Stream::Stdout)?, open(Stream::Stderr)?])
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn split(chunks: &[&[u8]]) -> Vec<Vec<u8>> {
        split_max(chunks, MAX_LINE)
    }

    fn split_max(chunks: &[&[u8]], max: usize) -> Vec<Vec<u8>> {
        let mut s = LineSplitter::with_max(max);
        let mut lines = Vec::new();
        for c in chunks {
            s.feed(c, &mut |l| lines.push(l.to_vec()));
        }
        s.finish(&mut |l| lines.push(l.to_vec()));
        lines
    }

    fn owned(lines: &[&[u8]]) -> Vec<Vec<u8>> {
        lines.iter().map(|l| l.to_vec()).collect()
    }

    #[test]
    fn lines_end_in_newline_carriage_return_or_both() {
        assert_eq!(split(&[b"a\nb\rc\r\nd"]), owned(&[b"a", b"b", b"c", b"d"]));
        assert_eq!(split(&[b"a\r", b"\nb\n"]), owned(&[b"a", b"b"]));
        assert_eq!(split(&[b"a\r", b"b\n"]), owned(&[b"a", b"b"]));
        assert_eq!(split(&[b"\n\n"]), owned(&[b"", b""]));
        // A `\r` before each update (tqdm's) makes no empty line; `\r\n` alone is one, also
        // when a read ends between its halves.
        assert_eq!(split(&[b"\rp0\rp1\r\rp2\n"]), owned(&[b"p0", b"p1", b"p2"]));
        assert_eq!(split(&[b"a\n\rp"]), owned(&[b"a", b"p"]));
        assert_eq!(split(&[b"\r\n\r\n"]), owned(&[b"", b""]));
        assert_eq!(split(&[b"a\n\r", b"\nb\n"]), owned(&[b"a", b"", b"b"]));
        assert_eq!(split(&[b"a\n\r", b"b\n"]), owned(&[b"a", b"b"]));
        assert_eq!(split(&[b"\r"]), Vec::<Vec<u8>>::new());
        assert_eq!(
            split(&[b"ab", b"c", b"\xff\xfe\n"]),
            owned(&[b"abc\xff\xfe"])
        );
    }

    #[test]
    fn endless_lines_come_out_in_bounded_pieces() {
        let big = vec![b'x'; MAX_LINE * 2 + 5];
        let lines = split(&[&big]);
        assert_eq!(
            lines.iter().map(Vec::len).collect::<Vec<_>>(),
            vec![MAX_LINE, MAX_LINE, 5]
        );
    }

    #[test]
    fn a_terminator_right_after_a_cut_piece_ends_it() {
        // The piece is cut when the read ends; the newline comes in the next one.
        let full = vec![b'x'; MAX_LINE];
        for (after, want) in [
            (&b"\nnext\n"[..], 2),
            (b"\r\nnext\n", 2),
            (b"\rnext\n", 2),
            (b"\n\nnext\n", 3),
        ] {
            let lines = split(&[&full, after]);
            assert_eq!(lines.len(), want, "{after:?}");
            assert_eq!(lines[0], full);
            assert_eq!(lines[want - 1], b"next");
        }
        assert_eq!(split(&[&full, b"\r", b"\nnext"]).len(), 2);
    }

    proptest! {
        /// However the bytes are cut into reads, the lines are the same, and long lines come
        /// out in the same pieces.
        #[test]
        fn reads_do_not_change_the_lines(
            text in proptest::collection::vec(prop_oneof![Just(b'\n'), Just(b'\r'), Just(b'a'), any::<u8>()], 0..200),
            cuts in proptest::collection::vec(0usize..200, 0..10),
            max in prop_oneof![1usize..8, Just(MAX_LINE)],
        ) {
            let whole = split_max(&[&text], max);
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(text.len())).collect();
            cuts.sort_unstable();
            let mut pieces = Vec::new();
            let mut start = 0;
            for c in cuts {
                pieces.push(&text[start..c]);
                start = c;
            }
            pieces.push(&text[start..]);
            prop_assert_eq!(split_max(&pieces, max), whole);
        }
    }

    /// An agent's output to a launcher that reads nothing yet: a pipe of 4 KiB, 64 KiB of
    /// lines waiting. Returns the output, the pipe's reading end, the launcher's command pipe
    /// (read end for the agent, write end for the test) and a signalfd stand-in that never
    /// becomes readable.
    fn upstream_behind() -> (Output, OwnedFd, (OwnedFd, OwnedFd), (OwnedFd, OwnedFd)) {
        use nix::fcntl::{FcntlArg, OFlag, fcntl};
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).unwrap();
        let _ = fcntl(&write, FcntlArg::F_SETPIPE_SZ(4096));
        let mut output = Output::upstream_to(write, &[0]).unwrap();
        for i in 0..8192 {
            output.line(0, Stream::Stdout, format!("line {i:03}").as_bytes());
        }
        output.flush();
        assert!(output.backlog() > 0, "the pipe cannot hold it all");
        let commands = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).unwrap();
        let quiet = nix::unistd::pipe2(OFlag::O_CLOEXEC).unwrap();
        (output, read, commands, quiet)
    }

    #[test]
    fn an_agent_waits_for_a_launcher_that_reads_late_while_it_hears_it() {
        let (mut output, read, (commands, launcher), (quiet, _q)) = upstream_behind();
        let backlog = output.backlog();
        // The launcher: heartbeats for longer than it may be silent, reading nothing; then it
        // reads everything.
        let reader = std::thread::spawn(move || {
            let mut launcher = File::from(launcher);
            let until = Instant::now() + super::super::channel::LOST_AFTER + Duration::from_secs(1);
            while Instant::now() < until {
                launcher.write_all(b"hb\n").unwrap();
                std::thread::sleep(Duration::from_millis(250));
            }
            let mut got = Vec::new();
            io::Read::read_to_end(&mut File::from(read), &mut got).unwrap();
            got.len()
        });
        output.drain_console(
            quiet.as_fd(),
            DrainFor::WhileHeard(commands.as_fd(), super::super::channel::LOST_AFTER),
            &mut || false,
        );
        assert_eq!(output.backlog(), 0, "everything was taken");
        assert!(!output.upstream_closed());
        drop(output);
        assert!(
            reader.join().unwrap() >= backlog,
            "the launcher got every byte"
        );
    }

    #[test]
    fn an_agent_stops_waiting_once_its_launcher_connection_closes() {
        let (mut output, _read, (commands, launcher), (quiet, _q)) = upstream_behind();
        drop(launcher);
        let started = Instant::now();
        output.drain_console(
            quiet.as_fd(),
            DrainFor::WhileHeard(commands.as_fd(), super::super::channel::LOST_AFTER),
            &mut || false,
        );
        assert!(
            started.elapsed() < super::super::channel::LOST_AFTER,
            "at once, not after the silence limit: {:?}",
            started.elapsed()
        );
        assert_eq!(output.backlog(), 0, "what was left is dropped");
        assert!(output.upstream_closed(), "and nothing more is sent");
    }

    /// A terminal is written by a thread of its own: paused (Ctrl-S), it holds the lines back
    /// as the console's backlog, and `waiting_fds` asks to wait for the writer's wake instead
    /// of a write; nothing waits meanwhile. Resumed, it shows every line in order, and
    /// `drain_console` ends once it has.
    #[test]
    fn a_paused_terminal_holds_lines_back_and_nothing_waits() {
        use std::io::Read;
        use std::os::fd::AsFd;
        const LINES: usize = 20_000;
        let pty = nix::pty::openpty(None, None).unwrap();
        let (master, slave) = (pty.master, pty.slave);
        nix::sys::termios::tcflow(&slave, nix::sys::termios::FlowArg::TCOOFF).unwrap();
        let sink = || Sink::new(File::from(slave.try_clone().unwrap())).threaded_if_terminal();
        let (out, err) = (sink(), sink());
        assert_eq!((out.mode, err.mode), (Mode::Thread, Mode::Thread));
        let mut output = Output::with_sinks(OutputOptions::default(), &[0], out, err).unwrap();
        assert!(output.err_is_out, "one terminal, one writer");
        let started = Instant::now();
        for i in 0..LINES {
            output.line(0, Stream::Stdout, format!("line {i:05}").as_bytes());
        }
        output.flush();
        assert!(started.elapsed() < Duration::from_secs(5), "a write waited");
        // What a terminal holds is a few KiB; the rest is held back.
        assert!(output.backlog() > LINES * 11 / 2, "{}", output.backlog());
        let waiting = output.waiting_fds();
        assert_eq!(waiting.len(), 1);
        assert_eq!(waiting[0].1, PollFlags::POLLIN);
        drop(waiting);
        let reader = std::thread::spawn(move || {
            let mut shown = Vec::new();
            let mut master = File::from(master);
            let mut buf = [0u8; 1 << 14];
            // The terminal turns each \n into \r\n.
            while shown.len() < LINES * 12 {
                match master.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => shown.extend_from_slice(&buf[..n]),
                }
            }
            shown
        });
        nix::sys::termios::tcflow(&slave, nix::sys::termios::FlowArg::TCOON).unwrap();
        let (never, _held) = nix::unistd::pipe().unwrap();
        output.drain_console(
            never.as_fd(),
            DrainFor::AtMost(Some(Duration::from_secs(30))),
            &mut || false,
        );
        assert_eq!(output.backlog(), 0, "drained");
        let shown = String::from_utf8(reader.join().unwrap()).unwrap();
        let expected: String = (0..LINES).map(|i| format!("line {i:05}\r\n")).collect();
        assert!(
            shown == expected,
            "{} bytes shown of {}",
            shown.len(),
            expected.len()
        );
    }

    /// A rank's log that cannot be created (a full disk, here a file in the way of its
    /// directory) is said once, naming it, and the logs are given up; the output is made.
    #[test]
    fn a_log_that_cannot_be_created_gives_the_logs_up_and_the_job_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("rank.1"), "in the way").unwrap();
        let console = tempfile::tempdir().unwrap();
        let file = |name: &str| File::create(console.path().join(name)).unwrap();
        let options = OutputOptions {
            log_dir: Some(dir.path().to_path_buf()),
            ..OutputOptions::default()
        };
        let mut output = Output::with_sinks(
            options,
            &[0, 1, 2],
            Sink::new(file("out")),
            Sink::new(file("err")),
        )
        .unwrap();
        output.line(0, Stream::Stdout, b"still shown");
        output.flush();
        drop(output);
        let read = |name: &str| std::fs::read_to_string(console.path().join(name)).unwrap();
        assert_eq!(
            read("out"),
            "still shown\n",
            "the console still has the line"
        );
        let err = read("err");
        assert_eq!(err.matches("warning").count(), 1, "{err}");
        assert!(
            err.contains(&format!(
                "atlasboost: warning: cannot create log directory {}",
                dir.path().join("rank.1").display()
            )) && err.contains("the logs of this job are incomplete from here on"),
            "{err}"
        );
        // Given up: no log after the failure, nothing more written to those before it.
        assert!(!dir.path().join("rank.2").exists());
        let log = std::fs::read_to_string(dir.path().join("rank.0/stdout.log")).unwrap();
        assert_eq!(log, "");
    }

    /// A job's log directory that no worker wrote to goes away, and `latest` points back at
    /// the job before; one with a worker's logs stays; a `latest` another job has pointed
    /// elsewhere meanwhile is left alone.
    #[test]
    fn an_unused_job_log_directory_is_removed_and_latest_restored() {
        let dir = tempfile::tempdir().unwrap();
        let latest = || std::fs::read_link(dir.path().join("latest")).ok();
        // No job before: the link goes with the directory.
        let (first, warning) = JobLogDir::create(dir.path(), "ab-1").unwrap();
        assert!(warning.is_none());
        assert_eq!(latest(), Some(PathBuf::from("ab-1")));
        drop(first);
        assert!(!dir.path().join("ab-1").exists());
        assert_eq!(latest(), None);
        // A job that wrote logs keeps them, and is `latest`.
        let (used, _) = JobLogDir::create(dir.path(), "ab-2").unwrap();
        std::fs::create_dir(used.path().join("rank.0")).unwrap();
        assert!(!used.forget_if_unused());
        drop(used);
        assert!(dir.path().join("ab-2/rank.0").is_dir());
        // An unused one points `latest` back at it.
        let (unused, _) = JobLogDir::create(dir.path(), "ab-3").unwrap();
        assert_eq!(latest(), Some(PathBuf::from("ab-3")));
        assert!(unused.forget_if_unused());
        assert_eq!(latest(), Some(PathBuf::from("ab-2")));
        drop(unused);
        assert_eq!(latest(), Some(PathBuf::from("ab-2")));
        // Another job took `latest` in between: it stays that job's.
        let (unused, _) = JobLogDir::create(dir.path(), "ab-4").unwrap();
        let (other, _) = JobLogDir::create(dir.path(), "ab-5").unwrap();
        std::fs::create_dir(other.path().join("rank.0")).unwrap();
        drop(unused);
        assert_eq!(latest(), Some(PathBuf::from("ab-5")));
        drop(other);
        // The job before has gone meanwhile: `latest` is not pointed at nothing.
        let (unused, _) = JobLogDir::create(dir.path(), "ab-6").unwrap();
        std::fs::remove_dir_all(dir.path().join("ab-5")).unwrap();
        drop(unused);
        assert_eq!(latest(), None);
        let mut left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["ab-2"]);
    }

    /// A `latest` that is not a link (the user's file or directory) is never replaced: the job
    /// says so and writes its logs all the same.
    #[test]
    fn a_latest_that_is_not_a_link_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let latest = dir.path().join("latest");
        std::fs::write(&latest, "precious").unwrap();
        let (job, warning) = JobLogDir::create(dir.path(), "ab-1").unwrap();
        let warning = warning.expect("a warning");
        assert!(
            warning.contains("it is a file atlasboost did not make; left as it is")
                && warning.contains("ab-1"),
            "{warning}"
        );
        assert!(job.path().is_dir());
        drop(job);
        assert_eq!(std::fs::read_to_string(&latest).unwrap(), "precious");
        std::fs::remove_file(&latest).unwrap();
        std::fs::create_dir(&latest).unwrap();
        let (_job, warning) = JobLogDir::create(dir.path(), "ab-2").unwrap();
        assert!(warning.unwrap().contains("it is a directory"));
        assert!(latest.is_dir());
    }
}
