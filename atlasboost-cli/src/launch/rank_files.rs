//! The files through which a host's workers tell their supervisor what their output does not
//! (SPEC §12): heartbeats, the record of a failure, and stack dumps of a stuck worker.
//!
//! One private directory per supervising process (`$TMPDIR/atlasboost-<job>-<pid>`), one set of
//! files per rank, cleared before each attempt starts the rank. The supervisor removes it at
//! the end; if it is killed, its lifeline's guard does.

use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use atlasboost::progress::read_beats;
use atlasboost_core::EnvVars;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::error::CliError;
use crate::process::wait_until;

/// The most of an error file that is read (a record is a message and a traceback).
const RECORD_LIMIT: u64 = 256 * 1024;

/// How long `py-spy dump` may take on one worker: less than the silence after which a peer
/// counts as lost (`--host-timeout`, at least 4 s), since taking stacks blocks the
/// supervisor's loop.
const PY_SPY_LIMIT: Duration = Duration::from_secs(3);

/// How long a worker's `faulthandler` has to write its stacks after SIGUSR1.
const FAULTHANDLER_LIMIT: Duration = Duration::from_secs(2);

/// A supervisor's directory of per-rank files.
#[derive(Debug, Clone)]
pub struct RankFiles {
    dir: PathBuf,
}

impl RankFiles {
    /// Makes the directory of this process for job `job_id` (readable by its user only).
    ///
    /// # Errors
    ///
    /// [`CliError::File`] when it cannot be made.
    pub fn create(job_id: &str) -> Result<RankFiles, CliError> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = std::env::temp_dir().join(format!("atlasboost-{job_id}-{}", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .recursive(true)
            .create(&dir)
            .map_err(CliError::file("make the workers' progress directory", &dir))?;
        Ok(RankFiles { dir })
    }

    fn path(&self, rank: u32, what: &str) -> PathBuf {
        self.dir.join(format!("rank.{rank}.{what}"))
    }

    /// The variables that point worker `rank` at its files (torch's name of the error file too,
    /// for `--framework pytorch`, so that torch's own `@record` writes there).
    pub fn env(&self, rank: u32, pytorch: bool) -> Vec<(OsString, OsString)> {
        let error = self.path(rank, "error.json").into_os_string();
        let mut vars = vec![
            (
                EnvVars::ATLASBOOST_HEARTBEAT_FILE.into(),
                self.path(rank, "beat").into_os_string(),
            ),
            (EnvVars::ATLASBOOST_ERROR_FILE.into(), error.clone()),
            (
                EnvVars::ATLASBOOST_STACK_FILE.into(),
                self.path(rank, "stacks").into_os_string(),
            ),
        ];
        if pytorch {
            vars.push((EnvVars::TORCHELASTIC_ERROR_FILE.into(), error));
        }
        vars
    }

    /// Removes what an earlier attempt's worker of `rank` left.
    pub fn reset(&self, rank: u32) {
        for what in ["beat", "error.json", "stacks", "py-spy"] {
            let _ = std::fs::remove_file(self.path(rank, what));
        }
    }

    /// The heartbeats of `rank` so far: their count and the last step.
    pub fn beats(&self, rank: u32) -> Option<(u64, Option<i64>)> {
        read_beats(&self.path(rank, "beat"))
    }

    /// What worker `rank` recorded about its failure, if it did.
    pub fn recorded(&self, rank: u32) -> Option<Vec<u8>> {
        let file = std::fs::File::open(self.path(rank, "error.json")).ok()?;
        let written = file.metadata().and_then(|m| m.modified()).ok();
        let mut text = Vec::new();
        file.take(RECORD_LIMIT).read_to_end(&mut text).ok()?;
        if text.is_empty() {
            return None;
        }
        // torch's whole-second stamp, made precise by when the file was written.
        Some(match written {
            Some(at) => atlasboost::progress::RecordedError::with_precise_time(text, at),
            None => text,
        })
    }

    /// [`Self::stacks`] of several workers (`(rank, pid)`), taken at the same time, in their
    /// order.
    pub fn stacks_of(&self, workers: &[(u32, u32)]) -> Vec<String> {
        std::thread::scope(|scope| {
            let taking: Vec<_> = workers
                .iter()
                .map(|&(rank, pid)| {
                    std::thread::Builder::new()
                        .spawn_scoped(scope, move || self.stacks(rank, pid))
                        .map_err(|_| (rank, pid))
                })
                .collect();
            taking
                .into_iter()
                .map(|t| match t {
                    Ok(t) => t
                        .join()
                        .unwrap_or_else(|_| "no stacks: taking them failed".to_string()),
                    // No thread to spare: this one takes them.
                    Err((rank, pid)) => self.stacks(rank, pid),
                })
                .collect()
        })
    }

    /// The Python stacks of worker `rank` (process `pid`): `py-spy dump` when it is installed,
    /// else SIGUSR1 to a worker whose `init()` registered `faulthandler`; else why there are
    /// none.
    pub fn stacks(&self, rank: u32, pid: u32) -> String {
        if let Some(py_spy) = find_program("py-spy") {
            return self.py_spy(rank, pid, &py_spy);
        }
        let file = self.path(rank, "stacks");
        // `init()` creates the file when it registers the handler; and the worker's own
        // process must catch SIGUSR1 (a shell that runs Python would die of it).
        if std::fs::metadata(&file).is_err() {
            return "no stacks: py-spy is not installed on this host, and the worker has not \
                    called atlasboost.init() (which registers faulthandler for SIGUSR1)"
                .into();
        }
        if !catches(pid, Signal::SIGUSR1) {
            return "no stacks: py-spy is not installed on this host, and the worker's own \
                    process does not catch SIGUSR1, although a process of it called \
                    atlasboost.init(): most likely the worker is a wrapper (a shell) around \
                    Python, which SIGUSR1 would kill; exec the Python program, or install py-spy"
                .into();
        }
        let before = std::fs::metadata(&file).map_or(0, |m| m.len());
        if kill(Pid::from_raw(pid as i32), Signal::SIGUSR1).is_err() {
            return "no stacks: the worker is gone".into();
        }
        let until = Instant::now() + FAULTHANDLER_LIMIT;
        let mut last = before;
        while Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50));
            let len = std::fs::metadata(&file).map_or(0, |m| m.len());
            // Written and settled.
            if len > before && len == last {
                break;
            }
            last = len;
        }
        match std::fs::read(&file) {
            Ok(all) if all.len() as u64 > before => {
                String::from_utf8_lossy(&all[before as usize..]).into_owned()
            }
            _ => format!(
                "no stacks: the worker wrote none within {FAULTHANDLER_LIMIT:.0?} of SIGUSR1 \
                 (stuck outside Python?)"
            ),
        }
    }

    fn py_spy(&self, rank: u32, pid: u32, py_spy: &Path) -> String {
        let out = self.path(rank, "py-spy");
        let Ok(file) = std::fs::File::create(&out) else {
            return format!("no stacks: cannot write {}", out.display());
        };
        let (Ok(stdout), Ok(stderr)) = (file.try_clone(), file.try_clone()) else {
            return "no stacks: cannot duplicate a file descriptor".into();
        };
        let child = Command::new(py_spy)
            .args(["dump", "--pid", &pid.to_string()])
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn();
        let mut child = match child {
            Ok(c) => c,
            Err(e) => return format!("no stacks: cannot run {}: {e}", py_spy.display()),
        };
        let deadline = Instant::now() + PY_SPY_LIMIT;
        let status = wait_until(&mut child, deadline, Duration::from_millis(20))
            .ok()
            .flatten();
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        match status {
            Some(s) if s.success() => text,
            Some(s) => format!("py-spy dump failed ({s}): {}", text.trim()),
            None => format!("py-spy dump took more than {PY_SPY_LIMIT:.0?}; stopped it"),
        }
    }

    /// The directory (which the lifeline's guard removes if this process is killed).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Removes the directory (at the end of the job).
    pub fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether process `pid` catches `signal` (its `SigCgt` mask in `/proc/<pid>/status`).
fn catches(pid: u32, signal: Signal) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (signal as u32 - 1)) != 0)
}

/// `name` on `PATH`, if it is there.
fn find_program(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os(EnvVars::PATH).and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|p| {
                std::fs::metadata(p)
                    .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_per_rank_and_cleared_for_the_next_attempt() {
        let files = RankFiles::create("test-rank-files").unwrap();
        let env = files.env(3, true);
        let path = |name: &str| PathBuf::from(&env.iter().find(|(k, _)| k == name).unwrap().1);
        assert_eq!(
            path(EnvVars::ATLASBOOST_ERROR_FILE),
            path(EnvVars::TORCHELASTIC_ERROR_FILE)
        );
        assert!(
            !files
                .env(3, false)
                .iter()
                .any(|(k, _)| k == EnvVars::TORCHELASTIC_ERROR_FILE)
        );
        assert_eq!(files.recorded(3), None);
        std::fs::write(
            path(EnvVars::ATLASBOOST_ERROR_FILE),
            b"{\"message\": \"x\"}",
        )
        .unwrap();
        assert_eq!(
            files.recorded(3).as_deref(),
            Some(&b"{\"message\": \"x\"}"[..])
        );
        assert_eq!(files.recorded(4), None, "another rank's file");
        files.reset(3);
        assert_eq!(files.recorded(3), None);
        // No faulthandler registered (no stack file): SIGUSR1 would kill, so none is sent.
        if find_program("py-spy").is_none() {
            assert!(
                files
                    .stacks(3, std::process::id())
                    .contains("the worker has not called atlasboost.init()")
            );
        }
        // The default disposition is not a handler.
        assert!(!catches(std::process::id(), Signal::SIGUSR1));
        files.remove();
        assert!(!files.dir.exists());
    }
}
