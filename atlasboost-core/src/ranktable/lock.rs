//! One running job per rank-table path on a host.
//!
//! HCCL reads the rank table when a worker initialises its communicator, often long after the
//! worker started, so a second job that replaced the file would silently hand the first job's
//! workers a table that is not theirs. Before a host writes a table, its writer takes a
//! [`TableLock`]: an advisory `flock(2)` on `<table>.lock`, held until the job ends. The
//! kernel drops a `flock` when its holder dies, so `kill -9` never leaves a stale lock.
//!
//! Several processes of *one* job may share a table path (hosts of one job on a shared file
//! system, or simulated hosts on one machine): the lock file records its holder's job, and a
//! process of the same job shares the lock instead of being refused. The holder takes the lock
//! exclusively, writes its record, then turns it into a shared lock; a process of the same job
//! takes it shared; a process of another job finds it held and reads who holds it.
//!
//! The last holder removes the lock file. A process that opened the file just before it was
//! removed notices (its descriptor no longer names the path) and opens it again.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use crate::time::iso8601;

/// How long a process waits for a lock's holder to write its record (it does so at once after
/// taking the lock) before it reports the lock held by an unknown job.
const RECORD_WAIT: Duration = Duration::from_secs(2);

/// Who holds a table's lock: written into the lock file, and named to anyone refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockOwner {
    /// The job's id (the same in every process of the job).
    pub job: String,
    /// The host the job was launched from.
    pub launcher: String,
    /// The host of the process that holds the lock.
    pub host: String,
    /// That process's id.
    pub pid: u32,
    /// When it took the lock (ISO 8601, UTC).
    pub started: String,
}

impl LockOwner {
    /// This process, as a holder for `job`, launched from `launcher` (this host's name when
    /// `None`).
    #[must_use]
    pub fn this_process(job: &str, launcher: Option<&str>) -> LockOwner {
        let host = crate::host_name();
        LockOwner {
            job: job.to_string(),
            launcher: launcher.map_or_else(|| host.clone(), str::to_string),
            host,
            pid: std::process::id(),
            started: iso8601(SystemTime::now()),
        }
    }
}

impl fmt::Display for LockOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "job {} (launched from {}; pid {} on {} holds it since {})",
            self.job, self.launcher, self.pid, self.host, self.started
        )
    }
}

/// Why a table's lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum TableLockError {
    /// Another job holds it.
    #[error("the rank table {} is in use by {}", table.display(), match owner {
        Some(o) => o.to_string(),
        None => format!("another job (its lock file {} names no job)", lock.display()),
    })]
    Held {
        /// The table.
        table: PathBuf,
        /// The lock file.
        lock: PathBuf,
        /// Its holder, when the lock file says.
        owner: Option<Box<LockOwner>>,
    },
    /// The table's directory does not exist (it is not made: a mistyped path would otherwise
    /// leave the table where HCCL's `RANK_TABLE_FILE` users do not look).
    #[error("the rank table {}: its directory {} does not exist", table.display(), dir.display())]
    NoDirectory {
        /// The table.
        table: PathBuf,
        /// Its directory.
        dir: PathBuf,
    },
    /// The lock file cannot be opened, read, written or locked.
    #[error("cannot lock the rank table {}: {action} {}", table.display(), lock.display())]
    Io {
        /// The table.
        table: PathBuf,
        /// The lock file.
        lock: PathBuf,
        /// What failed.
        action: &'static str,
        /// The system's error.
        #[source]
        source: io::Error,
    },
}

/// A held table lock; dropping it releases the lock (and removes the lock file when this was
/// its last holder).
#[derive(Debug)]
pub struct TableLock {
    lock: Option<Flock<File>>,
    path: PathBuf,
}

impl TableLock {
    /// Takes the lock of `table` for `owner`'s job, sharing it with processes of the same job.
    ///
    /// # Errors
    ///
    /// [`TableLockError::Held`] naming the other job that holds it;
    /// [`TableLockError::NoDirectory`] when the table's directory does not exist;
    /// [`TableLockError::Io`] when the lock file cannot be used (a read-only directory, ...).
    pub fn acquire(table: &Path, owner: &LockOwner) -> Result<TableLock, TableLockError> {
        let path = lock_path(table);
        let io = |action: &'static str| {
            let (table, lock) = (table.to_path_buf(), path.clone());
            move |source: io::Error| TableLockError::Io {
                table,
                lock,
                action,
                source,
            }
        };
        let record = serde_json::to_string(owner).map_err(|e| io("cannot encode")(e.into()))?;
        let deadline = Instant::now() + RECORD_WAIT;
        loop {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o644)
                .open(&path)
                .map_err(|e| match table.parent() {
                    Some(dir) if e.kind() == io::ErrorKind::NotFound && !dir.is_dir() => {
                        TableLockError::NoDirectory {
                            table: table.to_path_buf(),
                            dir: dir.to_path_buf(),
                        }
                    }
                    _ => io("cannot open")(e),
                })?;
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(mut lock) => {
                    if !names(&lock, &path) {
                        continue;
                    }
                    // Written over a dead holder's record, then cut to length: truncating to
                    // zero first would make ext4 (auto_da_alloc) write the file's data out at
                    // its last close, about half a millisecond at the end of every job.
                    let written = lock
                        .write_all(record.as_bytes())
                        .and_then(|()| lock.flush())
                        .map_err(io("cannot write"))
                        .and_then(|()| {
                            lock.set_len(record.len() as u64)
                                .map_err(io("cannot truncate"))
                        });
                    if let Err(e) = written {
                        // Held exclusively, without a record (a full disk): removed, so that
                        // no empty lock file is left beside the table.
                        let _ = std::fs::remove_file(&path);
                        return Err(e);
                    }
                    lock.relock(FlockArg::LockSharedNonblock)
                        .map_err(|e| io("cannot share")(e.into()))?;
                    return Ok(TableLock {
                        lock: Some(lock),
                        path,
                    });
                }
                // A record of this job is shared, even when the process that wrote it has
                // ended: only the job's processes can hold the lock then (another job would
                // have written its own record first). A restart's agents meet this when the
                // first attempt's writer has exited and a lost host's agent still holds it.
                Err((mut file, Errno::EWOULDBLOCK)) => match read_record(&mut file) {
                    Some(holder) if holder.job == owner.job => {
                        match Flock::lock(file, FlockArg::LockSharedNonblock) {
                            Ok(lock) if names(&lock, &path) => {
                                return Ok(TableLock {
                                    lock: Some(lock),
                                    path,
                                });
                            }
                            Ok(_) => continue,
                            // The holder has not yet turned its lock into a shared one.
                            Err((_, Errno::EWOULDBLOCK)) => {}
                            Err((_, e)) => return Err(io("cannot lock")(e.into())),
                        }
                    }
                    Some(holder) if !is_gone(&holder) => {
                        return Err(TableLockError::Held {
                            table: table.to_path_buf(),
                            lock: path,
                            owner: Some(Box::new(holder)),
                        });
                    }
                    // The holder has not written its record yet, or the record's writer died.
                    _ => {}
                },
                Err((_, e)) => return Err(io("cannot lock")(e.into())),
            }
            if Instant::now() > deadline {
                return Err(TableLockError::Held {
                    table: table.to_path_buf(),
                    lock: path,
                    owner: None,
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The lock file.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TableLock {
    fn drop(&mut self) {
        if let Some(lock) = self.lock.take() {
            // Only the last holder can take it exclusively; it removes the file. (A failed
            // attempt drops this holder's shared lock, which closing would do anyway.)
            if lock.relock(FlockArg::LockExclusiveNonblock).is_ok() && names(&lock, &self.path) {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

/// `<table>.lock`, beside the table in its directory as the kernel resolves it (so two paths
/// through a symbolic link to one directory share one lock).
#[must_use]
pub fn lock_path(table: &Path) -> PathBuf {
    let name = table.file_name().map_or_else(
        || "rank_table.json.lock".into(),
        |n| {
            let mut n = n.to_os_string();
            n.push(".lock");
            n
        },
    );
    let dir = match table.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::canonicalize(dir)
        .unwrap_or_else(|_| dir.to_path_buf())
        .join(name)
}

/// Whether the open lock file is still the one at `path` (its last holder may have removed it
/// between our open and our lock).
fn names(file: &File, path: &Path) -> bool {
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// The holder's record, if it is complete (`None` while it is being written).
fn read_record(file: &mut File) -> Option<LockOwner> {
    let mut text = String::new();
    file.seek(SeekFrom::Start(0)).ok()?;
    file.take(64 * 1024).read_to_string(&mut text).ok()?;
    serde_json::from_str(&text).ok()
}

/// Whether the record's writer is known to have died: a process of this host that is gone.
/// (A record left by a holder that died, and not yet overwritten by the one holding the lock
/// now, names no one who could be asked to stop.)
fn is_gone(owner: &LockOwner) -> bool {
    crate::host_name() == owner.host && !Path::new(&format!("/proc/{}", owner.pid)).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(job: &str) -> LockOwner {
        LockOwner::this_process(job, Some("launcher-host"))
    }

    #[test]
    fn a_second_job_is_refused_and_told_who_holds_the_table() {
        let dir = tempfile::tempdir().unwrap();
        let table = dir.path().join("rank_table.json");
        let held = TableLock::acquire(&table, &owner("job-a")).unwrap();
        assert!(held.path().ends_with("rank_table.json.lock"));
        let err = TableLock::acquire(&table, &owner("job-b")).unwrap_err();
        let TableLockError::Held { owner: Some(o), .. } = &err else {
            panic!("{err:?}");
        };
        assert_eq!(o.job, "job-a");
        assert_eq!(o.launcher, "launcher-host");
        assert_eq!(o.pid, std::process::id());
        let text = err.to_string();
        assert!(text.contains("is in use by job job-a"), "{text}");
        assert!(text.contains(&table.display().to_string()), "{text}");
    }

    /// A restart's agents: the first attempt's process that wrote the record has ended, and
    /// another process of the job (a lost host's agent, on shared storage) still holds the lock.
    /// The job's record is enough to share it; another job is still refused.
    #[test]
    fn a_record_of_this_job_whose_writer_ended_is_shared() {
        let dir = tempfile::tempdir().unwrap();
        let table = dir.path().join("t.json");
        let ended = std::process::Command::new("true")
            .spawn()
            .and_then(|mut c| c.wait().map(|_| c.id()))
            .unwrap();
        let record = LockOwner {
            pid: ended,
            ..owner("job-a")
        };
        let path = lock_path(&table);
        std::fs::write(&path, serde_json::to_string(&record).unwrap()).unwrap();
        // The lost agent's shared hold, through a description of its own.
        let held = Flock::lock(File::open(&path).unwrap(), FlockArg::LockSharedNonblock)
            .map_err(|(_, e)| e)
            .unwrap();
        let shared = TableLock::acquire(&table, &owner("job-a")).unwrap();
        let err = TableLock::acquire(&table, &owner("job-b")).unwrap_err();
        assert!(
            matches!(&err, TableLockError::Held { owner: None, .. }),
            "{err:?}"
        );
        drop((shared, held));
    }

    #[test]
    fn processes_of_one_job_share_the_lock_and_the_last_removes_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let table = dir.path().join("t.json");
        let first = TableLock::acquire(&table, &owner("job-a")).unwrap();
        let second = TableLock::acquire(&table, &owner("job-a")).unwrap();
        let path = first.path().to_path_buf();
        drop(first);
        // Still held by the second: another job is still refused.
        assert!(TableLock::acquire(&table, &owner("job-b")).is_err());
        assert!(path.exists());
        drop(second);
        assert!(!path.exists(), "the last holder removes the lock file");
        drop(TableLock::acquire(&table, &owner("job-b")).unwrap());
    }

    #[test]
    fn a_lock_released_by_its_holder_is_free_for_the_next_job() {
        let dir = tempfile::tempdir().unwrap();
        let table = dir.path().join("t.json");
        drop(TableLock::acquire(&table, &owner("job-a")).unwrap());
        let b = TableLock::acquire(&table, &owner("job-b")).unwrap();
        let err = TableLock::acquire(&table, &owner("job-c")).unwrap_err();
        assert!(err.to_string().contains("job job-b"), "{err}");
        drop(b);
    }

    #[test]
    fn a_stale_record_of_a_dead_holder_does_not_block_and_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let table = dir.path().join("t.json");
        // What `kill -9` leaves: the file and its record, but no lock.
        let mut dead = owner("job-dead");
        dead.pid = u32::MAX;
        std::fs::write(lock_path(&table), serde_json::to_string(&dead).unwrap()).unwrap();
        let held = TableLock::acquire(&table, &owner("job-b")).unwrap();
        let err = TableLock::acquire(&table, &owner("job-c")).unwrap_err();
        assert!(err.to_string().contains("job job-b"), "{err}");
        drop(held);
    }

    #[test]
    fn a_lock_held_without_a_readable_record_is_reported_as_an_unknown_job() {
        let dir = tempfile::tempdir().unwrap();
        let table = dir.path().join("t.json");
        let path = lock_path(&table);
        std::fs::write(&path, "not a record").unwrap();
        let file = File::open(&path).unwrap();
        let _held = Flock::lock(file, FlockArg::LockExclusiveNonblock).unwrap();
        let err = TableLock::acquire(&table, &owner("job-b")).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("names no job"), "{text}");
        assert!(text.contains(&path.display().to_string()), "{text}");
    }

    #[test]
    fn a_directory_that_does_not_exist_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing");
        let table = missing.join("t.json");
        let err = TableLock::acquire(&table, &owner("job-a")).unwrap_err();
        assert!(matches!(err, TableLockError::NoDirectory { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            format!(
                "the rank table {}: its directory {} does not exist",
                table.display(),
                missing.display()
            )
        );
        // A lock file that cannot be made in a directory that exists names the lock file.
        let blocked = dir.path().join("t.json.lock");
        std::fs::create_dir(&blocked).unwrap();
        let err = TableLock::acquire(&dir.path().join("t.json"), &owner("job-a")).unwrap_err();
        assert!(matches!(err, TableLockError::Io { .. }), "{err:?}");
        assert!(err.to_string().contains("t.json.lock"), "{err}");
    }

    #[test]
    fn paths_through_a_symbolic_link_share_one_lock() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, dir.path().join("link")).unwrap();
        let _a = TableLock::acquire(&real.join("t.json"), &owner("job-a")).unwrap();
        let err = TableLock::acquire(&dir.path().join("link").join("t.json"), &owner("job-b"))
            .unwrap_err();
        assert!(err.to_string().contains("job job-a"), "{err}");
    }
}
