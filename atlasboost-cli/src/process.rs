//! Helper programs (`scontrol`, `ssh -G`, `py-spy`): waiting for one with a deadline, and
//! reading what it printed. What `/proc` says of a process is `atlasboost::process`.

use std::io::Read;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// Waits for `child` (a short-lived helper: `scontrol`, `ssh -G`, `py-spy`) until `deadline`,
/// looking every `every`. `Ok(None)`: it had not exited by then, and was killed and reaped.
///
/// # Errors
///
/// The error of `try_wait` (the child is then killed and reaped too).
pub fn wait_until(
    child: &mut Child,
    deadline: Instant,
    every: Duration,
) -> std::io::Result<Option<ExitStatus>> {
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(Some(status)),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(every),
            other => {
                let _ = child.kill();
                let _ = child.wait();
                return other.map(|_| None);
            }
        }
    }
}

/// What a helper program printed, once it exited.
#[derive(Debug)]
pub struct HelperOutput {
    /// How it exited.
    pub status: ExitStatus,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

/// Runs `child` (started with piped stdout and stderr) to its end, at most `limit` after
/// `since`, as [`wait_until`] does, and returns what it printed. Both pipes are read on
/// threads of their own meanwhile, so a helper that prints more than a pipe holds (`scontrol`
/// of thousands of nodes) never waits on its reader. The pipes are read up to the same limit:
/// a process the helper left behind may hold them open (a killed helper's children do), and
/// its readers are then left to end with it.
///
/// # Errors
///
/// What went wrong, naming `what`: the limit passed (the child was killed), or waiting
/// failed.
pub fn output_within(
    mut child: Child,
    since: Instant,
    limit: Duration,
    every: Duration,
    what: &str,
) -> Result<HelperOutput, String> {
    let read = |pipe: Option<Box<dyn Read + Send>>| {
        let (tx, rx) = std::sync::mpsc::channel();
        if let Some(mut p) = pipe {
            std::thread::spawn(move || {
                let mut text = String::new();
                let _ = p.read_to_string(&mut text);
                let _ = tx.send(text);
            });
        }
        rx
    };
    let out = read(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err = read(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = since + limit;
    let too_long = || format!("{what} took longer than {limit:?}; stopped it");
    let status = match wait_until(&mut child, deadline, every) {
        Ok(Some(status)) => status,
        Ok(None) => return Err(too_long()),
        Err(e) => return Err(format!("cannot wait for {what}: {e}")),
    };
    let text = |rx: std::sync::mpsc::Receiver<String>| {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(text) => Ok(text),
            // No pipe to read.
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Ok(String::new()),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(too_long()),
        }
    };
    Ok(HelperOutput {
        status,
        stdout: text(out)?,
        stderr: text(err)?,
    })
}

#[cfg(test)]
mod wait_tests {
    use std::process::Command;

    use super::*;

    #[test]
    fn a_helpers_output_is_read_whole_even_beyond_a_pipe() {
        let piped = |script: &str| {
            Command::new("sh")
                .args(["-c", script])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        };
        // 1 MiB on stdout, more than a pipe holds: read while it runs, so it ends.
        let out = output_within(
            piped("head -c 1048576 /dev/zero | tr '\\0' x; echo said >&2; exit 3"),
            Instant::now(),
            Duration::from_secs(30),
            Duration::from_millis(5),
            "the helper",
        )
        .unwrap();
        assert_eq!(out.stdout.len(), 1 << 20);
        assert_eq!(out.stderr, "said\n");
        assert_eq!(out.status.code(), Some(3));
        // It exits, but what it started holds its output open: given up at the limit.
        let e = output_within(
            piped("sleep 3 & echo started"),
            Instant::now(),
            Duration::from_millis(300),
            Duration::from_millis(5),
            "the helper",
        )
        .unwrap_err();
        assert_eq!(e, "the helper took longer than 300ms; stopped it");
        let e = output_within(
            piped("exec sleep 30"),
            Instant::now(),
            Duration::from_millis(100),
            Duration::from_millis(5),
            "the helper",
        )
        .unwrap_err();
        assert_eq!(e, "the helper took longer than 100ms; stopped it");
    }

    #[test]
    fn a_helper_is_waited_for_until_the_deadline_then_killed_and_reaped() {
        let mut quick = Command::new("true").spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = wait_until(&mut quick, deadline, Duration::from_millis(1)).unwrap();
        assert!(status.is_some_and(|s| s.success()), "{status:?}");
        let mut slow = Command::new("sleep").arg("30").spawn().unwrap();
        let started = Instant::now();
        let deadline = started + Duration::from_millis(100);
        let status = wait_until(&mut slow, deadline, Duration::from_millis(5)).unwrap();
        assert_eq!(status, None);
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "it waited for sleep 30"
        );
        // Killed and reaped: its status is known, and it was SIGKILL.
        let reaped = slow.try_wait().unwrap();
        assert!(
            reaped.is_some_and(|s| std::os::unix::process::ExitStatusExt::signal(&s) == Some(9)),
            "{reaped:?}"
        );
    }
}
