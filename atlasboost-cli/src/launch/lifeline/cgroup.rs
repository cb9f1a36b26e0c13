//! The workers' cgroup: a cgroup v2 made below this process's own, which each worker enters
//! between its fork and its exec. What a worker starts stays in it, even a process that leaves
//! the worker's process group on purpose (`setsid`, a daemon), so that the guard's one write to
//! `cgroup.kill` ends all of it when the supervisor dies, even by `kill -9`, when nothing is
//! left to re-parent such processes to.
//!
//! It is made only where it can be: a cgroup2 file system mounted (alone, or beside cgroup v1
//! as on hybrid systems, at `/sys/fs/cgroup/unified`), this process's cgroup writable (root, or
//! a delegated subtree), and a kernel with `cgroup.kill` (Linux 5.14). Elsewhere the process
//! groups and the lifeline do what they did without it, and the launcher says why with `-v`.
//! `ATLASBOOST_CGROUP=0` turns it off; `=1` asks for it, and fails the start where none can be
//! made.

use std::ffi::{CStr, CString};
use std::fs;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use atlasboost_core::env_vars::EnvVars;
use nix::fcntl::{OFlag, open};
use nix::libc;
use nix::sys::stat::Mode;

use crate::error::CliError;

/// The workers' cgroup of one supervisor (the launcher, an agent or a relay).
#[derive(Debug)]
pub struct WorkerCgroup {
    /// Its directory, for `rmdir` by the guard (which may not allocate).
    dir: CString,
    /// `cgroup.procs`, written `0` by each worker to enter.
    procs: OwnedFd,
    /// `cgroup.kill`, written `1` by the guard.
    kill: OwnedFd,
    /// This process's own cgroup's `cgroup.procs`, where the guard warms up the kernel's
    /// migration lock (see [`WorkerCgroup::own_procs`]). Moving a worker out of this cgroup
    /// needs write access to it, so a cgroup is only made where it opens.
    own_procs: OwnedFd,
}

impl WorkerCgroup {
    /// The workers' cgroup if `ATLASBOOST_CGROUP=1`, or if it is unset and `default`:
    /// `Ok(Err(why))` where none is wanted, or none can be made here and none was asked for.
    ///
    /// # Errors
    ///
    /// [`CliError::Failure`] when `ATLASBOOST_CGROUP` is neither `0` nor `1`, or
    /// when it is `1` and no cgroup can be made here.
    pub fn for_workers(default: bool) -> Result<Result<WorkerCgroup, String>, CliError> {
        match WorkerCgroup::asked()? {
            Some(true) => WorkerCgroup::create().map(Ok).map_err(|why| {
                CliError::Failure(format!(
                    "{}=1, but no cgroup can be made for the workers here: {why}",
                    EnvVars::ATLASBOOST_CGROUP
                ))
            }),
            None if default => Ok(WorkerCgroup::create()),
            None => Ok(Err(format!(
                "not by default here; {}=1 asks for one",
                EnvVars::ATLASBOOST_CGROUP
            ))),
            Some(false) => Ok(Err(format!("{}=0", EnvVars::ATLASBOOST_CGROUP))),
        }
    }

    /// What `ATLASBOOST_CGROUP` asks for: `Some(true)` for `1`, `Some(false)` for `0`, `None`
    /// when it is unset.
    ///
    /// # Errors
    ///
    /// [`CliError::Failure`] for any other value.
    pub fn asked() -> Result<Option<bool>, CliError> {
        crate::settings::switch(
            EnvVars::ATLASBOOST_CGROUP,
            "0: no cgroup for the workers; 1: one, or the start fails",
        )
    }

    /// Makes a new cgroup below this process's own: `Err(why)` where it cannot.
    pub fn create() -> Result<WorkerCgroup, String> {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
        let mount = cgroup2_mount(&mountinfo).ok_or("no cgroup2 file system is mounted")?;
        let own = fs::read_to_string("/proc/self/cgroup")
            .map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
        let path = own_cgroup(&own).ok_or("/proc/self/cgroup has no cgroup v2 line (0::)")?;
        let parent = mount.join(path.trim_start_matches('/'));
        // Named by the pid namespace and pid of this process: an abandoned one is told by a
        // pid that no longer exists in the same namespace (another container's processes are
        // not seen here).
        let namespace = pid_namespace().unwrap_or_default();
        remove_abandoned(&parent, &namespace);
        // The pid alone could meet the directory of an earlier process with the same pid
        // that died with its guard.
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = parent.join(format!(
            "atlasboost-{namespace}-{}-{nanos}",
            std::process::id()
        ));
        let c_dir = CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| format!("{} has a NUL byte", dir.display()))?;
        let open_for_writing = |path: &Path| {
            open(path, OFlag::O_WRONLY | OFlag::O_CLOEXEC, Mode::empty())
                .map_err(|e| format!("cannot open {}: {e}", path.display()))
        };
        // Before the directory is made, so that nothing needs undoing if it fails.
        let own_procs = open_for_writing(&parent.join("cgroup.procs"))
            .map_err(|why| format!("{why} (moving a worker out of it needs write access)"))?;
        fs::create_dir(&dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
        let files = open_for_writing(&dir.join("cgroup.procs")).and_then(|procs| {
            let kill = open_for_writing(&dir.join("cgroup.kill")).map_err(|why| {
                format!("{why} (the kernel has no cgroup.kill before Linux 5.14)")
            })?;
            Ok((procs, kill))
        });
        match files {
            Ok((procs, kill)) => Ok(WorkerCgroup {
                dir: c_dir,
                procs,
                kill,
                own_procs,
            }),
            Err(why) => {
                let _ = fs::remove_dir(&dir);
                Err(why)
            }
        }
    }

    /// Its directory.
    pub fn path(&self) -> &Path {
        Path::new(std::ffi::OsStr::from_bytes(self.dir.as_bytes()))
    }

    /// The directory, as the guard's `rmdir` takes it.
    pub(super) fn dir(&self) -> &CStr {
        &self.dir
    }

    /// `cgroup.kill`, for the guard.
    pub(super) fn kill_file(&self) -> BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.kill.as_fd()
    }

    /// The cgroup this process is in: its `cgroup.procs`, which the guard (in that cgroup too)
    /// writes once as it starts, moving itself nowhere. Any write there takes the kernel's
    /// lock for migrations, whose first taking after a quiet while waits for an RCU grace
    /// period (5-12 ms on the development machine); for a while after, moves are quick
    /// (0.1 ms). The guard pays that wait while the launcher prepares, rather than the first
    /// worker as it starts (docs/PERFORMANCE.md).
    pub(super) fn own_procs(&self) -> BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.own_procs.as_fd()
    }

    /// `cgroup.procs`, which a worker writes between fork and exec (see [`enter`]).
    pub fn procs(&self) -> RawFd {
        self.procs.as_raw_fd()
    }
}

impl Drop for WorkerCgroup {
    /// Does what the guard does where it has not (it failed to start, or died early): ends
    /// what is left in the cgroup, and removes the directory. After the guard, the cgroup is
    /// gone already and both calls fail, harmlessly. (This process is never in it.)
    fn drop(&mut self) {
        // SAFETY: write(2) to a descriptor this value owns; rmdir(2) of a NUL-terminated
        // path it owns.
        unsafe {
            libc::write(self.kill.as_raw_fd(), b"1".as_ptr().cast(), 1);
            libc::rmdir(self.dir.as_ptr());
        }
    }
}

/// This process's pid namespace, the number `/proc/self/ns/pid` links to (`pid:[4026531836]`).
fn pid_namespace() -> Option<String> {
    let link = fs::read_link("/proc/self/ns/pid").ok()?;
    let link = link.to_str()?;
    let number = link.strip_prefix("pid:[")?.strip_suffix(']')?;
    Some(number.to_string()).filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
}

/// Removes the empty workers' cgroups in `parent` of supervisors of the pid namespace
/// `namespace` that are gone, whose guard did not remove them (it was killed too: a `kill -9`
/// of both, a test's cleanup), with the empty cgroups of nested jobs inside them. One that
/// still holds a process is left alone: `rmdir` refuses it. Nothing is removed where `/proc`
/// is not this pid namespace's (`unshare -p` without a new `/proc`): a live supervisor would
/// look gone.
fn remove_abandoned(parent: &Path, namespace: &str) {
    let own_proc = fs::read_link("/proc/self")
        .ok()
        .and_then(|p| p.to_str()?.parse::<u32>().ok());
    if own_proc != Some(std::process::id()) {
        return;
    }
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let pid = name
            .to_str()
            .and_then(|n| n.strip_prefix("atlasboost-"))
            .and_then(|rest| rest.strip_prefix(namespace)?.strip_prefix('-'))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok());
        if let Some(pid) = pid
            && !Path::new(&format!("/proc/{pid}")).exists()
        {
            remove_empty_tree(&entry.path());
        }
    }
}

/// `rmdir` of `dir` after its subdirectories (a cgroup's only directories are its children),
/// depth first; whatever holds a process stays.
fn remove_empty_tree(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_empty_tree(&entry.path());
            }
        }
    }
    let _ = fs::remove_dir(dir);
}

/// Moves the calling process into the cgroup whose `cgroup.procs` is `procs`: for a worker
/// between fork and exec, so one `write(2)`, which is async-signal-safe. A worker that cannot
/// enter runs outside, as it would without a cgroup (its process group is still watched).
pub fn enter(procs: RawFd) {
    // SAFETY: write(2) of a static buffer to a descriptor the parent keeps open.
    unsafe { libc::write(procs, b"0".as_ptr().cast(), 1) };
}

/// Where the cgroup2 file system is mounted, from `/proc/self/mountinfo`: the mount point
/// (field 5) of the first line whose file-system type (after ` - `) is `cgroup2`.
fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (fields, rest) = line.split_once(" - ")?;
        if rest.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let point = fields.split_whitespace().nth(4)?;
        Some(PathBuf::from(unescape_octal(point)))
    })
}

/// Mount points in mountinfo write a space, tab, newline or backslash as `\040`, `\011`,
/// `\012`, `\134`.
fn unescape_octal(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest
            .get(i + 1..i + 4)
            .and_then(|d| u8::from_str_radix(d, 8).ok());
        match code {
            Some(c) => {
                out.push(char::from(c));
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// This process's cgroup v2 path, from `/proc/self/cgroup` (the `0::/path` line).
fn own_cgroup(proc_cgroup: &str) -> Option<&str> {
    proc_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .filter(|p| p.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
24 1 0:22 / /sys rw,nosuid - sysfs sysfs rw
30 24 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
38 30 0:34 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
39 30 0:35 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn the_cgroup2_mount_is_found_beside_v1_and_alone() {
        assert_eq!(
            cgroup2_mount(HYBRID),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let pure = "29 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(cgroup2_mount(pure), Some(PathBuf::from("/sys/fs/cgroup")));
        let escaped = "29 23 0:26 / /mnt/my\\040cgroups rw - cgroup2 none rw\n";
        assert_eq!(
            cgroup2_mount(escaped),
            Some(PathBuf::from("/mnt/my cgroups"))
        );
        assert_eq!(cgroup2_mount(&HYBRID.replace("cgroup2", "tmpfs")), None);
    }

    #[test]
    fn the_own_cgroup_is_the_v2_line() {
        let hybrid = "9:name=systemd:/\n4:memory:/process_api/8bf2\n0::/\n";
        assert_eq!(own_cgroup(hybrid), Some("/"));
        let pure = "0::/user.slice/user-0.slice/session-3.scope\n";
        assert_eq!(
            own_cgroup(pure),
            Some("/user.slice/user-0.slice/session-3.scope")
        );
        assert_eq!(own_cgroup("4:memory:/x\n"), None);
    }

    #[test]
    fn only_the_empty_cgroups_of_dead_supervisors_are_removed_with_their_nested_ones() {
        let parent = std::env::temp_dir().join(format!("ab-cgroups-{}", std::process::id()));
        let dead = "atlasboost-7-999999999-1"; // beyond any pid_max
        let alive = format!("atlasboost-7-{}-1", std::process::id());
        let busy = "atlasboost-7-999999999-2";
        // Another pid namespace's: its pids are not seen from here.
        let elsewhere = "atlasboost-8-999999999-1";
        for d in [
            dead,
            &alive,
            busy,
            elsewhere,
            "atlasboost-x",
            "other-7-999999999-1",
        ] {
            fs::create_dir_all(parent.join(d)).unwrap();
        }
        // A nested job's, inside the dead one: removed with it.
        fs::create_dir_all(parent.join(dead).join("atlasboost-7-999999998-1")).unwrap();
        // Not empty: as a cgroup that still holds processes, which rmdir refuses.
        fs::write(parent.join(busy).join("cgroup.procs"), "1\n").unwrap();
        remove_abandoned(&parent, "7");
        let mut left: Vec<String> = fs::read_dir(&parent)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        fs::remove_dir_all(&parent).unwrap();
        let mut want = vec![
            alive,
            busy.into(),
            elsewhere.into(),
            "atlasboost-x".into(),
            "other-7-999999999-1".into(),
        ];
        want.sort();
        assert_eq!(left, want);
    }

    /// The real thing, where this machine lets a test make a cgroup: a process that entered
    /// it, and its child in a session of its own, both end with one write to `cgroup.kill`.
    #[test]
    fn what_entered_the_cgroup_ends_with_one_kill_even_in_a_session_of_its_own() {
        let cgroup = match WorkerCgroup::create() {
            Ok(c) => c,
            Err(why) => {
                // scripts/test.sh sets it where this runs as root beside a cgroup2 mount.
                assert!(
                    std::env::var_os("ATLASBOOST_E2E_REQUIRE_CGROUP").is_none_or(|v| v != "1"),
                    "no cgroup can be made here ({why}), and ATLASBOOST_E2E_REQUIRE_CGROUP=1"
                );
                eprintln!("skipped: no cgroup can be made here: {why}");
                return;
            }
        };
        let procs = cgroup.procs();
        let mut cmd = std::process::Command::new("sh");
        cmd.args(["-c", "setsid sleep 300 & echo $!; exec sleep 300"])
            .stdout(std::process::Stdio::piped());
        // SAFETY: one write(2) between fork and exec.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                enter(procs);
                Ok(())
            });
        }
        let mut child = cmd.spawn().unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let daemon: i32 = line.trim().parse().unwrap();
        let members = fs::read_to_string(cgroup.path().join("cgroup.procs")).unwrap();
        let members: Vec<i32> = members.lines().map(|l| l.parse().unwrap()).collect();
        assert!(
            members.contains(&(child.id() as i32)) && members.contains(&daemon),
            "both in {}: {members:?}",
            cgroup.path().display()
        );
        // SAFETY: write(2) to a descriptor `cgroup` owns.
        let wrote = unsafe { libc::write(cgroup.kill_file().as_raw_fd(), b"1".as_ptr().cast(), 1) };
        assert_eq!(wrote, 1);
        assert!(!child.wait().unwrap().success(), "killed");
        let daemon_gone = (0..500).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            fs::read_to_string(format!("/proc/{daemon}/stat"))
                .map_or(true, |s| s.split_whitespace().nth(2) == Some("Z"))
        });
        assert!(daemon_gone, "the setsid child {daemon} was killed too");
        let path = cgroup.path().to_path_buf();
        let removed = (0..500).any(|_| {
            drop(fs::remove_dir(&path));
            std::thread::sleep(std::time::Duration::from_millis(10));
            !path.exists()
        });
        assert!(removed, "{} is removed once empty", path.display());
    }
}
