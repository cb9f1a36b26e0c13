//! Writing whole buffers to descriptors someone may have left non-blocking (a console, an ssh
//! session's stdin, a terminal's writer thread), with or without waiting.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsFd;
use std::time::Duration;

/// Writes what the reader takes now: the bytes written. On a non-blocking `file` it never
/// waits; on a blocking one it writes everything.
pub fn write_now(file: &File, buf: &[u8]) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match (&*file).write(&buf[done..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Writes all of `buf`, also to a descriptor someone left non-blocking: on `EAGAIN` it waits
/// until the reader makes room, as a blocking write would.
///
/// With a `deadline`, a reader that takes no byte for that long is given up on (`TimedOut`):
/// that is how the launcher notices an ssh session that takes no more commands.
pub fn write_fully(file: &File, mut buf: &[u8], deadline: Option<Duration>) -> io::Result<()> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    loop {
        buf = &buf[write_now(file, buf)?..];
        if buf.is_empty() {
            return Ok(());
        }
        let mut fds = [PollFd::new(file.as_fd(), PollFlags::POLLOUT)];
        let timeout = deadline.map_or(PollTimeout::NONE, |d| {
            PollTimeout::try_from(d).unwrap_or(PollTimeout::MAX)
        });
        match poll(&mut fds, timeout) {
            Ok(0) => return Err(io::ErrorKind::TimedOut.into()),
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}
