//! A terminal written from a thread of its own, so that the launcher's loop never waits for
//! it. A terminal paused with Ctrl-S, or an ssh link to the user's laptop that stalls, takes no
//! bytes, and a write to it blocks until it does: written from the loop, that made the
//! launcher deaf to signals and blind to exits and the grace time for as long as the pause
//! lasted. Bytes queue here instead, and [`Output`](super::output::Output) counts them as held
//! back, as it does for a pipe nobody reads: past `HOLD_BACK` the workers' pipes wait unread,
//! and everything else goes on.
//!
//! The status block draws through the same queue ([`TerminalWriter::term`]), so that its
//! escape sequences and the lines written around it keep their order.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::writing::write_fully;

/// The most the thread writes at once: what is given up (the console dropped, the writer
/// abandoned) takes effect after at most this much more.
const CHUNK: usize = 64 * 1024;

/// How long dropping a writer waits for the terminal to take what is queued (the status
/// block's last clearing, after the console was drained): what is left then is dropped.
const LAST_WRITE: Duration = Duration::from_secs(1);

/// The queue between the loop and the writing thread.
#[derive(Debug, Default)]
struct State {
    /// Bytes not handed to the thread yet.
    queue: Vec<u8>,
    /// Bytes the thread is writing now.
    in_flight: usize,
    /// The terminal could not be written (it hung up): nothing more is.
    failed: bool,
    /// Why, until it is said.
    failure: Option<io::Error>,
    /// The writer was dropped: write what is queued, then end.
    ending: bool,
    /// The writer stopped waiting: what is still queued is dropped.
    abandoned: bool,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    more: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere cannot leave the queue half-changed: use it as it is.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn push(&self, bytes: &[u8]) {
        let mut state = self.lock();
        if !state.failed && !state.abandoned {
            state.queue.extend_from_slice(bytes);
            self.more.notify_one();
        }
    }
}

/// A terminal written by a thread of its own (see the module docs).
#[derive(Debug)]
pub struct TerminalWriter {
    shared: Arc<Shared>,
    /// Readable when the thread has written a chunk (or given up): the loop then looks again.
    wake: OwnedFd,
    /// The terminal, for its size.
    terminal: Arc<File>,
}

impl TerminalWriter {
    /// Starts the thread that writes `terminal`.
    ///
    /// # Errors
    ///
    /// A pipe or a thread that cannot be made.
    pub fn start(terminal: File) -> io::Result<TerminalWriter> {
        use nix::fcntl::OFlag;
        let (wake, woken) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            more: Condvar::new(),
        });
        let terminal = Arc::new(terminal);
        let (s, t) = (shared.clone(), terminal.clone());
        std::thread::Builder::new()
            .name("console".into())
            .spawn(move || write_queue(&s, &t, &woken))?;
        Ok(TerminalWriter {
            shared,
            wake,
            terminal,
        })
    }

    /// Queues `bytes` (dropped once the terminal has failed).
    pub fn push(&self, bytes: &[u8]) {
        self.shared.push(bytes);
    }

    /// Bytes queued or being written.
    pub fn pending(&self) -> usize {
        let state = self.shared.lock();
        state.queue.len() + state.in_flight
    }

    /// Drops what is queued (the console is given up), and says how many bytes; a chunk
    /// being written still is written.
    pub fn drop_queued(&self) -> usize {
        let mut state = self.shared.lock();
        let dropped = state.queue.len();
        state.queue.clear();
        dropped
    }

    /// Why writing the terminal failed, once.
    pub fn take_failure(&self) -> Option<io::Error> {
        self.shared.lock().failure.take()
    }

    /// Readable when the thread has written a chunk: wait on it with `POLLIN`, then call
    /// [`TerminalWriter::woken`].
    pub fn wake_fd(&self) -> BorrowedFd<'_> {
        self.wake.as_fd()
    }

    /// Empties the wake pipe.
    pub fn woken(&self) {
        let mut buf = [0u8; 64];
        while matches!(nix::unistd::read(&self.wake, &mut buf), Ok(n) if n > 0) {}
    }

    /// The status block's draw target: its drawing queues here too.
    pub fn term(&self) -> QueuedTerm {
        QueuedTerm {
            shared: self.shared.clone(),
            terminal: self.terminal.clone(),
        }
    }
}

impl Drop for TerminalWriter {
    /// Lets the thread write what is queued, for at most a second; then drops the rest,
    /// so that nothing it writes later cuts into what the launcher prints next.
    fn drop(&mut self) {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        {
            let mut state = self.shared.lock();
            state.ending = true;
            self.shared.more.notify_one();
        }
        let until = Instant::now() + LAST_WRITE;
        while self.pending() > 0 && !self.shared.lock().failed {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let mut fds = [PollFd::new(self.wake.as_fd(), PollFlags::POLLIN)];
            let timeout = PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX);
            if matches!(poll(&mut fds, timeout), Ok(0)) {
                break;
            }
            self.woken();
        }
        let mut state = self.shared.lock();
        state.abandoned = true;
        state.queue.clear();
    }
}

/// The thread: writes what is queued, chunk by chunk, waiting for the terminal as long as it
/// takes; says on `woken` after each chunk.
fn write_queue(shared: &Shared, terminal: &File, woken: &OwnedFd) {
    loop {
        let chunk = {
            let mut state = shared.lock();
            loop {
                if state.abandoned {
                    return;
                }
                if !state.queue.is_empty() {
                    break;
                }
                if state.ending {
                    return;
                }
                state = shared
                    .more
                    .wait(state)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            // Whole lines where it can: a chunk ends at its last newline.
            let cut = match state.queue.len() {
                n if n <= CHUNK => n,
                _ => state.queue[..CHUNK]
                    .iter()
                    .rposition(|&b| b == b'\n')
                    .map_or(CHUNK, |i| i + 1),
            };
            let chunk: Vec<u8> = state.queue.drain(..cut).collect();
            state.in_flight = chunk.len();
            chunk
        };
        let written = write_fully(terminal, &chunk, None);
        let mut state = shared.lock();
        state.in_flight = 0;
        if let Err(e) = written {
            state.failed = true;
            state.failure = Some(e);
            state.queue.clear();
        }
        // Under the lock: whoever sees the bytes written sees the wake too. (A full pipe
        // means a wake is pending already.)
        let _ = nix::unistd::write(woken, b"w");
        if state.failed {
            return;
        }
    }
}

nix::ioctl_read_bad!(
    /// `TIOCGWINSZ`: a terminal's rows and columns.
    window_size,
    nix::libc::TIOCGWINSZ,
    nix::libc::winsize
);

/// The status block's draw target (`indicatif`'s [`TermLike`](indicatif::TermLike)): the
/// escape sequences `console` would write, queued for the terminal.
#[derive(Debug)]
pub struct QueuedTerm {
    shared: Arc<Shared>,
    terminal: Arc<File>,
}

impl QueuedTerm {
    /// The terminal's rows and columns (80 × 24 when it does not say).
    fn size(&self) -> (u16, u16) {
        let mut size = nix::libc::winsize {
            ws_row: 0,
            ws_col: 0,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCGWINSZ writes one `winsize` to the pointer given, which is valid and
        // ours for the call; the descriptor is open (held by `terminal`).
        let asked = unsafe { window_size(self.terminal.as_raw_fd(), &raw mut size) };
        match asked {
            Ok(_) if size.ws_row > 0 && size.ws_col > 0 => (size.ws_row, size.ws_col),
            _ => (24, 80),
        }
    }

    fn queue(&self, text: &str) -> io::Result<()> {
        self.shared.push(text.as_bytes());
        Ok(())
    }

    fn escape(&self, n: usize, code: char) -> io::Result<()> {
        match n {
            0 => Ok(()),
            n => self.queue(&format!("\x1b[{n}{code}")),
        }
    }
}

impl QueuedTerm {
    /// Turns the terminal's echo off while the status block is drawn, if this process is the
    /// terminal's foreground job (a background one would be stopped by SIGTTOU): a key typed
    /// meanwhile, an Enter or a Ctrl-C's `^C`, would be echoed where the cursor waits under
    /// the block, and the next redraw, which moves up as many lines as it drew, would leave a
    /// stale copy of the block's top line above it. `None` when the echo is off already or
    /// cannot be changed.
    pub fn echo_off(&self) -> Option<EchoOff> {
        use nix::sys::termios::{LocalFlags, SetArg, tcgetattr, tcsetattr};
        if !is_foreground(&self.terminal) {
            return None;
        }
        let mut quiet = tcgetattr(self.terminal.as_fd()).ok()?;
        if !quiet.local_flags.contains(LocalFlags::ECHO) {
            return None;
        }
        quiet.local_flags.remove(LocalFlags::ECHO);
        tcsetattr(self.terminal.as_fd(), SetArg::TCSANOW, &quiet).ok()?;
        Some(EchoOff {
            terminal: Arc::clone(&self.terminal),
        })
    }
}

/// Whether this process's group is the foreground job of `terminal`.
fn is_foreground(terminal: &File) -> bool {
    nix::unistd::tcgetpgrp(terminal.as_fd()).is_ok_and(|g| g == nix::unistd::getpgrp())
}

/// The terminal's echo, off until this is dropped ([`QueuedTerm::echo_off`]). After `kill -9`
/// of the launcher, an interactive shell restores its terminal settings itself (as after any
/// program killed by a signal).
pub struct EchoOff {
    terminal: Arc<File>,
}

impl std::fmt::Debug for EchoOff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EchoOff")
    }
}

impl Drop for EchoOff {
    /// Turns the echo back on (only it: other settings changed meanwhile stay), from the
    /// foreground only: a job moved to the background (Ctrl-Z, `bg`) would be stopped by
    /// SIGTTOU, and its shell restored its own settings when it took the terminal back.
    fn drop(&mut self) {
        use nix::sys::termios::{LocalFlags, SetArg, tcgetattr, tcsetattr};
        if !is_foreground(&self.terminal) {
            return;
        }
        if let Ok(mut now) = tcgetattr(self.terminal.as_fd()) {
            now.local_flags.insert(LocalFlags::ECHO);
            let _ = tcsetattr(self.terminal.as_fd(), SetArg::TCSANOW, &now);
        }
    }
}

impl indicatif::TermLike for QueuedTerm {
    fn width(&self) -> u16 {
        self.size().1
    }

    fn height(&self) -> u16 {
        self.size().0
    }

    fn move_cursor_up(&self, n: usize) -> io::Result<()> {
        self.escape(n, 'A')
    }

    fn move_cursor_down(&self, n: usize) -> io::Result<()> {
        self.escape(n, 'B')
    }

    fn move_cursor_right(&self, n: usize) -> io::Result<()> {
        self.escape(n, 'C')
    }

    fn move_cursor_left(&self, n: usize) -> io::Result<()> {
        self.escape(n, 'D')
    }

    fn write_line(&self, s: &str) -> io::Result<()> {
        self.queue(&format!("{s}\n"))
    }

    fn write_str(&self, s: &str) -> io::Result<()> {
        self.queue(s)
    }

    fn clear_line(&self) -> io::Result<()> {
        self.queue("\r\x1b[2K")
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pipe stands in for a terminal nobody reads: pushes never wait, the bytes count as
    /// pending, and once read they arrive whole and in order, with a wake after the chunk.
    #[test]
    fn pushes_never_wait_for_a_terminal_that_takes_nothing() {
        use std::io::Read;
        let (reader, writer) = nix::unistd::pipe().unwrap();
        let console = TerminalWriter::start(File::from(writer)).unwrap();
        // Far more than a pipe holds (64 KiB): a blocking write would wait here.
        let line = [b'x'; 1023];
        let started = Instant::now();
        for _ in 0..1024 {
            console.push(&line);
            console.push(b"\n");
        }
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(console.pending() > 512 * 1024, "{}", console.pending());
        let mut got = Vec::new();
        let mut reader = File::from(reader);
        let mut buf = vec![0u8; 1 << 16];
        while got.len() < 1024 * 1024 {
            let n = reader.read(&mut buf).unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        assert!(
            got.chunks(1024)
                .all(|l| l[..1023] == line && l[1023] == b'\n')
        );
        let waited = Instant::now();
        while console.pending() > 0 {
            assert!(waited.elapsed() < Duration::from_secs(10), "never emptied");
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut fds = [nix::poll::PollFd::new(
            console.wake_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        assert_eq!(
            nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO).unwrap(),
            1
        );
        console.woken();
        assert_eq!(
            nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO).unwrap(),
            0
        );
    }

    /// A terminal that hangs up (here: the pipe's reader is gone) fails once, and what is
    /// pushed after is dropped.
    #[test]
    fn a_terminal_that_fails_is_said_once_and_written_no_more() {
        let (reader, writer) = nix::unistd::pipe().unwrap();
        drop(reader);
        let console = TerminalWriter::start(File::from(writer)).unwrap();
        console.push(b"lost\n");
        let waited = Instant::now();
        let failure = loop {
            if let Some(e) = console.take_failure() {
                break e;
            }
            assert!(waited.elapsed() < Duration::from_secs(10), "never failed");
            std::thread::sleep(Duration::from_millis(5));
        };
        assert_eq!(failure.kind(), io::ErrorKind::BrokenPipe);
        assert!(console.take_failure().is_none());
        console.push(b"after\n");
        assert_eq!(console.pending(), 0);
    }
}
