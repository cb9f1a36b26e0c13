//! Library mode (SPEC §10): `init()` inside a worker, whatever started it.
//!
//! [`init`] finds out how the process was started ([`launch_context`]) and then:
//! - under `atlasboost run`, reads the `ATLASBOOST_*` variables and checks the table the launcher
//!   wrote: no network;
//! - under `mpirun` (Open MPI or MPICH), with the `mpi` feature: a rendezvous over MPI;
//! - under any other launcher (torchrun, `srun`, `mpirun` without the `mpi` feature): a ZeroMQ
//!   rendezvous whose coordinator runs in the process of launcher rank 0, at `MASTER_ADDR` and
//!   port `ATLASBOOST_RENDEZVOUS_PORT` (default: `MASTER_PORT` + 1, else 29401);
//! - under `mpirun` without the `mpi` feature and without `MASTER_ADDR`, with every rank on
//!   this host: the same ZeroMQ rendezvous over a Unix socket in a directory only this user
//!   can enter, named after the MPI job (`local_endpoint`), so plain `mpirun -np 4` needs
//!   nothing set;
//! - started by hand: a world of one, with a note on stderr.
//!
//! In a rendezvous every process probes its host and takes the device of its local rank and
//! claims it. Over MPI the processes all-gather the claims and each builds the same table. Over
//! ZeroMQ the coordinator builds it and sends all the claims only to the first process of each
//! host, which builds the table too; the others get only their seat in it, so a job of N
//! processes on H hosts moves O(H·N) bytes, not O(N²). When the claims are not a job (a
//! missing device, two processes on one device) everyone gets them all and fails alike. The
//! first process of each host writes the table, and a second round tells everyone it was
//! written (or which host could not write it).
//!
//! [`launch_context`]: atlasboost_core::launch_context

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use atlasboost_core::exchange::error_chain;
use atlasboost_core::launch_context::{self, LaunchContext, Launcher};
use atlasboost_core::ranktable::{
    BuildOptions, Format, LockOwner, RankOrder, RankTable, TableLock, TableLockError, build_table,
    write_table,
};
use atlasboost_core::worker_env::{Framework, Seat, WorkerSpec, worker_env};
use atlasboost_core::{Device, EnvVars, Rendezvous, World};
use atlasboost_tcp::{
    Combiner, Coordinator, CoordinatorConfig, ParticipantConfig, Replies, Secret, ZmqRendezvous,
};
use serde::{Deserialize, Serialize};

use crate::host::free_master_port;
use crate::probe::make_probe;
use crate::settings::{Discovery, env, parse_seconds};

/// Text on stderr, flushed; a closed stderr loses it but does not panic (as `eprint!` would).
pub(crate) fn to_stderr(text: &str) {
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(text.as_bytes()).and_then(|()| err.flush());
}

/// The rendezvous port when neither `ATLASBOOST_RENDEZVOUS_PORT` nor `MASTER_PORT` is set
/// (torchrun's own rendezvous uses 29400, its `MASTER_PORT` 29500).
pub const DEFAULT_RENDEZVOUS_PORT: u16 = 29401;

/// The rendezvous timeout when `ATLASBOOST_RENDEZVOUS_TIMEOUT` is not set (as `atlasboost run`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// How participants' waits exceed the coordinator's, so its message naming who is missing
/// arrives first.
const PARTICIPANT_SLACK: Duration = Duration::from_secs(2);

/// Why [`init`] failed. Each kind is a different exception in the Python package and a
/// different code in the C ABI; both match every kind (a new kind must get its own there).
///
/// The message is whole: the bindings show only it, so a cause is part of the text (and kept
/// as a field), not a separate `source`.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// A launcher's variables are partly set, malformed or not enough to meet (e.g. no
    /// `MASTER_ADDR`).
    #[error("{0}")]
    LaunchContext(String),
    /// A variable has a value that cannot be used.
    #[error("{variable}={value}: {reason}")]
    BadVariable {
        /// The variable.
        variable: &'static str,
        /// Its value.
        value: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// An `ATLASBOOST_*` setting cannot be used for another reason.
    #[error("{0}")]
    Config(String),
    /// This host has no address to be its `server_id`.
    #[error("{error}; set {}", EnvVars::ATLASBOOST_SERVER_ID)]
    NoServerId {
        /// Why.
        error: crate::host::HostError,
    },
    /// A file or directory library mode needs cannot be made or read.
    #[error("cannot {action} {}: {error}", path.display())]
    File {
        /// What was tried, as in "cannot {action} PATH".
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The system's error.
        error: std::io::Error,
    },
    /// A process has no device (the probe failed, or too few devices for its local rank).
    #[error("rank {rank} on host {host} (local rank {local_rank}) has no device: {why}")]
    NoDevice {
        /// The launcher's rank of the process.
        rank: u32,
        /// Its host (`server_id`).
        host: String,
        /// Its local rank.
        local_rank: u32,
        /// Why.
        why: String,
    },
    /// Two processes of a host claim one device.
    #[error(
        "ranks {first} and {second} both claim device {device} (physical id {physical}) of \
         host {host}: each process of a host needs its own local rank"
    )]
    SameDevice {
        /// The first process's rank.
        first: u32,
        /// The second's.
        second: u32,
        /// The device's logical id.
        device: u32,
        /// Its physical id.
        physical: u32,
        /// The host.
        host: String,
    },
    /// Another device problem: `set_device_id` with another rank's device, a malformed
    /// probe setting.
    #[error("{0}")]
    Device(String),
    /// The rendezvous failed.
    #[error("{message}")]
    Rendezvous {
        /// What happened, with who was missing when the backend knows.
        message: String,
        /// Whether it ran out of time (a process never arrived).
        timed_out: bool,
    },
    /// A host's table could not be written (another job holds its path, a directory that
    /// does not exist).
    #[error("rank {rank} on host {host} could not write the rank table {}: {why}", path.display())]
    TableNotWritten {
        /// The writer's rank.
        rank: u32,
        /// Its host.
        host: String,
        /// The table's path.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// The table cannot be built, validated or read.
    #[error("{0}")]
    RankTable(String),
    /// A call that needs [`init`] came first (the bindings' process-wide job, [`session`]).
    #[error("atlasboost is not initialised: call init() first")]
    NotInitialized,
}

impl From<atlasboost_core::Error> for InitError {
    fn from(e: atlasboost_core::Error) -> Self {
        use atlasboost_core::Error as E;
        let message = error_chain(&e);
        match e {
            E::Rendezvous {
                temporary, source, ..
            } => InitError::Rendezvous {
                message,
                // ZeroMQ's timeouts are retryable, MPI's are not, but both are timeouts.
                timed_out: temporary || is_mpi_timeout(source.as_ref()),
            },
            E::BadPayload { .. } => InitError::Rendezvous {
                message,
                timed_out: false,
            },
            E::LaunchEnv(_) => InitError::LaunchContext(message),
            E::InvalidValue { .. } => InitError::Config(message),
            E::Probe { .. } | E::RemoteProbe { .. } | E::Unusable(_) => InitError::Device(message),
            _ => InitError::RankTable(message),
        }
    }
}

#[cfg(feature = "mpi")]
fn is_mpi_timeout(e: &(dyn std::error::Error + 'static)) -> bool {
    matches!(
        e.downcast_ref::<atlasboost_mpi::MpiError>(),
        Some(atlasboost_mpi::MpiError::Timeout { .. })
    )
}

#[cfg(not(feature = "mpi"))]
fn is_mpi_timeout(_: &(dyn std::error::Error + 'static)) -> bool {
    false
}

/// What [`init`] may be told; everything else comes from the environment.
#[derive(Debug, Clone, Default)]
pub struct InitOptions {
    /// The framework; `None` reads `ATLASBOOST_FRAMEWORK` (default `tensorflow`).
    pub framework: Option<Framework>,
}

/// How the process's place in the job was agreed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agreement {
    /// `atlasboost run` had done it: the variables and the table were read.
    Launch,
    /// A rendezvous over MPI.
    Mpi,
    /// A ZeroMQ rendezvous with launcher rank 0 as coordinator.
    Zmq,
    /// No launcher: a world of one.
    Alone,
}

/// This process's place in an initialised job.
pub struct Job {
    /// Its place as the rank table says (`rank` is the table's `rank_id`).
    pub world: World,
    /// Its rank as its launcher numbered it (may differ from `world.rank`).
    pub launcher_rank: u32,
    /// Who started it (`None`: nobody, a world of one).
    pub launcher: Option<Launcher>,
    /// How the job was agreed on.
    pub agreement: Agreement,
    /// Its host's `server_id`.
    pub server_id: String,
    /// Its device's logical id (`DEVICE_ID`).
    pub device_id: u32,
    /// Its device's physical id (the table's `device_id`).
    pub physical_id: u32,
    /// The rank table (absolute path, without symbolic links: `RANK_TABLE_FILE`).
    pub table_path: PathBuf,
    /// The variables of SPEC §9 for this process: set by [`Job::export_env`].
    pub env: Vec<(&'static str, String)>,
    /// Set only where the environment does not have them yet.
    pub env_if_unset: Vec<(&'static str, String)>,
    /// Removed: the variables of another way of starting a job ([`EnvVars::OTHER_STARTUP`]:
    /// HCCL's `CM_*`, which it refuses beside a rank table, MindSpore's `MS_ROLE`, ...) that
    /// this process has, unless `atlasboost run` started it (its launcher passes them only
    /// where `-x` asks for them).
    pub env_remove: Vec<&'static str>,
    /// Keeps MPI initialised while the job lives (finalised when dropped, if atlasboost
    /// initialised it).
    _mpi: Option<Box<dyn Rendezvous>>,
    /// The writer's lock of its host's table, held while the job lives.
    _table_lock: Option<TableLock>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("world", &self.world)
            .field("launcher_rank", &self.launcher_rank)
            .field("launcher", &self.launcher)
            .field("agreement", &self.agreement)
            .field("server_id", &self.server_id)
            .field("device_id", &self.device_id)
            .field("physical_id", &self.physical_id)
            .field("table_path", &self.table_path)
            .finish_non_exhaustive()
    }
}

impl Job {
    /// Sets [`Job::env`] (and [`Job::env_if_unset`] where unset) in this process's environment.
    ///
    /// # Safety
    ///
    /// No other thread may read or write the environment meanwhile (see
    /// [`std::env::set_var`]). `init` has stopped its own threads by the time it returns; call
    /// this before starting threads of your own, as the original tool's `init()` did.
    pub unsafe fn export_env(&self) {
        let mut replaced = REPLACED.lock().unwrap_or_else(|p| p.into_inner());
        // The launcher's value is the one before the first export of each variable (a later
        // start's comes after `restore_launchers_env`); what was set is the latest.
        let mut record = |name: &'static str, value: &String| match replaced
            .iter_mut()
            .find(|(n, _, _)| *n == name)
        {
            Some((_, _, set)) => set.clone_from(value),
            None => replaced.push((name, std::env::var_os(name), value.clone())),
        };
        for (name, value) in &self.env {
            record(name, value);
            // SAFETY: the caller guarantees no other thread touches the environment.
            unsafe { std::env::set_var(name, value) };
        }
        for (name, value) in &self.env_if_unset {
            if std::env::var_os(name).is_none() {
                record(name, value);
                // SAFETY: as above.
                unsafe { std::env::set_var(name, value) };
            }
        }
        for name in &self.env_remove {
            // SAFETY: as above.
            unsafe { std::env::remove_var(name) };
        }
    }

    /// Before a start after [`session::shutdown`]: puts back the launcher's values that
    /// [`Job::export_env`] replaced (`RANK` is the table's rank after it, `MASTER_ADDR` the
    /// table's rank 0's host), where they still hold what it set last, so that the new start
    /// finds this process's place as the first did.
    ///
    /// # Safety
    ///
    /// As [`Job::export_env`]'s.
    pub unsafe fn restore_launchers_env() {
        let replaced = REPLACED.lock().unwrap_or_else(|p| p.into_inner());
        for (name, before, set) in replaced.iter() {
            if std::env::var_os(name).is_none_or(|now| now != set.as_str()) {
                continue;
            }
            match before {
                // SAFETY: the caller guarantees no other thread touches the environment.
                Some(value) => unsafe { std::env::set_var(name, value) },
                // SAFETY: as above.
                None => unsafe { std::env::remove_var(name) },
            }
        }
    }
}

/// What [`Job::export_env`] replaced in this process: each variable's name, the launcher's
/// value (`None`: unset) and the value set last.
type Replaced = Vec<(&'static str, Option<std::ffi::OsString>, String)>;
static REPLACED: std::sync::Mutex<Replaced> = std::sync::Mutex::new(Vec::new());

impl Job {
    /// Checks that `device_id` (a logical id, as `DEVICE_ID`) is this process's device.
    ///
    /// # Errors
    ///
    /// [`InitError::Device`] naming both devices and the rank.
    pub fn check_device(&self, device_id: u32) -> Result<(), InitError> {
        if device_id == self.device_id {
            return Ok(());
        }
        Err(InitError::Device(format!(
            "device {device_id} is not rank {}'s device: its entry in {} is device {} \
             (physical id {}) of server {}",
            self.world.rank,
            self.table_path.display(),
            self.device_id,
            self.physical_id,
            self.server_id
        )))
    }
}

/// The process-wide job of the bindings (Python, C), whose API has no handle: `init()` once,
/// then `rank()` and friends, then `shutdown()`.
pub mod session {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::{Mutex, MutexGuard};

    use super::{InitError, InitOptions, Job, init};

    static JOB: Mutex<Option<Job>> = Mutex::new(None);

    /// The process that started the job: only it ends it.
    static OWNER: AtomicU32 = AtomicU32::new(0);

    /// How many jobs this process has started (one, and more after [`shutdown`]s).
    static STARTED: AtomicU32 = AtomicU32::new(0);

    /// How many jobs this process has started before the one starting now.
    pub(super) fn started_before() -> u32 {
        STARTED.load(Ordering::Relaxed)
    }

    fn job() -> MutexGuard<'static, Option<Job>> {
        // A panic while holding the lock leaves a consistent Option behind.
        JOB.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Held by [`start`] and [`shutdown`] for their whole length.
    static STARTING: Mutex<()> = Mutex::new(());

    fn starting() -> MutexGuard<'static, ()> {
        STARTING.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Initialises the process's job, once: a second call returns the first one's result
    /// without a second rendezvous (as the original tool's `init()`).
    ///
    /// # Errors
    ///
    /// As [`init`].
    pub fn start(opts: &InitOptions) -> Result<(), InitError> {
        // One start at a time; the job itself is not held while the rendezvous waits, so that
        // other threads' queries answer (NotInitialized) at once instead of waiting with it.
        let _starting = starting();
        if job().is_none() {
            let mut started = init(opts)?;
            started.env_remove = super::other_startup_present(started.launcher);
            if !started.env_remove.is_empty() {
                super::to_stderr(&format!(
                    "atlasboost: warning: {} {} set, for another way of starting a job (HCCL's \
                     cluster information, MindSpore's dynamic cluster), which HCCL refuses beside \
                     the rank table init() gives: removed from this process's environment\n",
                    started.env_remove.join(", "),
                    if started.env_remove.len() == 1 {
                        "is"
                    } else {
                        "are"
                    }
                ));
            }
            *job() = Some(started);
            OWNER.store(std::process::id(), Ordering::Relaxed);
            STARTED.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Runs `f` on the job.
    ///
    /// # Errors
    ///
    /// [`InitError::NotInitialized`] before [`start`] (or after [`shutdown`]).
    pub fn with<T>(f: impl FnOnce(&Job) -> T) -> Result<T, InitError> {
        job().as_ref().map(f).ok_or(InitError::NotInitialized)
    }

    /// Ends the whole job now if this process runs under MPI (`MPI_Abort` with `code`): what a
    /// failing process does instead of [`shutdown`], whose `MPI_Finalize` would wait for the
    /// other ranks. Returns without MPI (a build without it, or a process MPI did not start).
    ///
    /// Under `atlasboost run --mpi` (`ATLASBOOST_RELAYED=1`) it ends only this process, with
    /// `code` and without `MPI_Finalize`: its relay tells the launcher, which stops the other
    /// ranks with SIGTERM and `--grace` (a checkpoint being saved is not cut short, as
    /// `MPI_Abort`'s kill would), and mpirun (`orte_abort_on_non_zero_status 0`) lets it.
    ///
    /// Not in a child forked after [`start`]: MPI there is the parent's, and an abort would end
    /// the parent's job. Returns `false` there, `true` when it returns for lack of MPI: a
    /// program that initialised MPI itself (mpi4py, in a build without MPI support) may then
    /// end the job through its own.
    #[must_use]
    pub fn abort_mpi(code: i32) -> bool {
        let owner = OWNER.load(Ordering::Relaxed);
        if owner != 0 && owner != std::process::id() {
            return false;
        }
        #[cfg(feature = "mpi")]
        {
            let relayed = std::env::var_os(atlasboost_core::EnvVars::ATLASBOOST_RELAYED)
                .is_some_and(|v| v == "1");
            if relayed && atlasboost_mpi::is_initialized() {
                use std::io::Write;
                let _ = std::io::stdout().flush();
                let _ = std::io::stderr().flush();
                // SAFETY: _exit ends the process at once; nothing after it runs. Not `exit`:
                // its handlers (the atexit shutdown) would call MPI_Finalize and wait.
                unsafe { nix::libc::_exit(code) };
            }
            atlasboost_mpi::abort_if_initialized(code);
        }
        let _ = code;
        true
    }

    /// Ends the job: MPI is finalised if atlasboost initialised it. Later calls need
    /// [`start`] again. Does nothing before [`start`].
    ///
    /// In a child forked after [`start`] (whose `atexit` handlers, Python's or C's, run this
    /// too) it only forgets the job: ending it there would release the parent's table lock
    /// (the child shares its open lock file) and call `MPI_Finalize` in a process MPI does
    /// not know, which waits for ever.
    pub fn shutdown() {
        // A start under way ends first: its job is then the one ended.
        let starting = starting();
        end_job(starting);
    }

    /// [`shutdown`], unless a start under way in another thread keeps it waiting longer than
    /// `wait`: then `false`, and nothing is done (an embedding program that must hear a Ctrl-C
    /// meanwhile calls it again).
    pub fn shutdown_within(wait: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + wait;
        loop {
            match STARTING.try_lock() {
                Ok(starting) => {
                    end_job(starting);
                    return true;
                }
                Err(std::sync::TryLockError::Poisoned(p)) => {
                    end_job(p.into_inner());
                    return true;
                }
                Err(std::sync::TryLockError::WouldBlock)
                    if std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                Err(std::sync::TryLockError::WouldBlock) => return false,
            }
        }
    }

    /// Ends the job, with the start lock held.
    fn end_job(_starting: MutexGuard<'static, ()>) {
        let ended = job().take();
        if OWNER.load(Ordering::Relaxed) == std::process::id() {
            drop(ended);
        } else {
            std::mem::forget(ended);
        }
    }
}

/// Initialises library mode: finds this process's place in the job, makes sure the rank table
/// is written on its host, and returns what to set (see the module's documentation).
///
/// # Errors
///
/// [`InitError`] naming the culprit: a launcher's variables partly set, a device another
/// process of the host also claims (both ranks named), a probe that failed (host and rank
/// named), a rendezvous that timed out (who was missing), a table that cannot be written.
pub fn init(opts: &InitOptions) -> Result<Job, InitError> {
    let framework = match opts.framework {
        Some(f) => f,
        None => match env(EnvVars::ATLASBOOST_FRAMEWORK) {
            Some(name) => name.parse().map_err(|e| InitError::BadVariable {
                variable: EnvVars::ATLASBOOST_FRAMEWORK,
                value: name.clone(),
                reason: error_chain(&e),
            })?,
            None => Framework::default(),
        },
    };
    let context = launch_context::detect_from_env()?;
    let job = match context {
        Some(c) if c.launcher == Launcher::Atlasboost => from_launch(&c, framework)?,
        Some(c) => rendezvous(&c, framework)?,
        None => alone(framework)?,
    };
    match env(EnvVars::ATLASBOOST_BIND_CORES).as_deref() {
        None | Some("0") => {}
        Some("1") => bind_cores(&job)?,
        Some(other) => {
            return Err(InitError::BadVariable {
                variable: EnvVars::ATLASBOOST_BIND_CORES,
                value: other.to_string(),
                reason: "expected 1 (bind this rank to its CPUs) or 0".into(),
            });
        }
    }
    Ok(job)
}

/// `ATLASBOOST_BIND_CORES=1`: binds the calling thread (and what it starts) to this rank's CPUs,
/// the same plan `atlasboost run --bind-cores` makes for the host's ranks (from the table).
fn bind_cores(job: &Job) -> Result<(), InitError> {
    let bad = |reason: String| InitError::BadVariable {
        variable: EnvVars::ATLASBOOST_BIND_CORES,
        value: "1".into(),
        reason,
    };
    let value = atlasboost_core::ranktable::read_json(&job.table_path)
        .map_err(|e| bad(atlasboost_core::exchange::error_chain(&e)))?;
    let chip = atlasboost_core::ranktable::default_chip(&value);
    let table = RankTable::from_value(value, &job.table_path.display().to_string(), chip)
        .map_err(|e| bad(atlasboost_core::exchange::error_chain(&e)))?;
    let mut seats: Vec<Seat> = Seat::all(&table)
        .map_err(|e| bad(atlasboost_core::exchange::error_chain(&e)))?
        .into_iter()
        .filter(|s| s.server_id == job.server_id)
        .collect();
    seats.sort_by_key(|s| s.world.local_rank);
    let physical: Vec<u32> = seats.iter().map(|s| s.physical_id).collect();
    // Every rank of the host plans from the same CPUs (the host's, not its own affinity: a
    // launcher may have bound each rank to a socket already).
    let cpus = crate::cores::host_cpus().ok_or_else(|| {
        bad("cannot read this host's CPUs (/sys/devices/system/cpu/online)".into())
    })?;
    let plan = crate::cores::host_plan_within(&cpus, &physical).map_err(bad)?;
    let mine = plan.get(job.world.local_rank as usize).ok_or_else(|| {
        bad(format!(
            "local rank {} is not in the table",
            job.world.local_rank
        ))
    })?;
    crate::cores::bind_current_thread(mine).map_err(|e| bad(format!("cannot bind: {e}")))
}

/// This process's rank as its launcher numbered it, if a launcher's variables say (and are
/// consistent).
pub fn launcher_rank_from_env() -> Option<u32> {
    launch_context::detect_from_env()
        .ok()
        .flatten()
        .map(|c| c.rank)
}

/// `atlasboost run` wrote the table and set every variable: read them, check the table.
fn from_launch(c: &LaunchContext, framework: Framework) -> Result<Job, InitError> {
    let need = |name: &'static str| {
        env(name).ok_or_else(|| {
            InitError::LaunchContext(format!(
                "{} is set, so atlasboost run started this process, but {name} is not",
                EnvVars::ATLASBOOST_RANK
            ))
        })
    };
    let number = |name: &'static str| -> Result<u32, InitError> {
        let v = need(name)?;
        v.trim().parse().map_err(|_| {
            let why = launch_context::not_a_count(&v);
            InitError::LaunchContext(format!("{name}={v} {why}"))
        })
    };
    // Made absolute as the rendezvous's path is: what the frameworks read must be.
    let table_path =
        std::path::absolute(need(EnvVars::ATLASBOOST_RANK_TABLE_FILE)?).map_err(|e| {
            InitError::RankTable(format!(
                "{}: cannot make it an absolute path: {e}",
                EnvVars::ATLASBOOST_RANK_TABLE_FILE
            ))
        })?;
    let server_id = need(EnvVars::ATLASBOOST_SERVER_ID)?;
    let physical_id = number(EnvVars::ATLASBOOST_PHYSICAL_ID)?;
    let device_id = number(EnvVars::ATLASBOOST_DEVICE_ID)?;
    let table = read_table_any_chip(&table_path)?;
    let job_id = need(EnvVars::ATLASBOOST_JOB_ID)?;
    let master_addr = env(EnvVars::MASTER_ADDR).unwrap_or_else(|| server_id.clone());
    let master_port = env(EnvVars::MASTER_PORT)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    // The table is the launcher's, of this job: one that lacks this device, or holds another
    // number of ranks, is another job's (a stale file at the same path), named with its path.
    let of_another_job = |what: String| {
        InitError::RankTable(format!(
            "{what} ({}={}): a rank table of another job?",
            EnvVars::ATLASBOOST_RANK_TABLE_FILE,
            table_path.display()
        ))
    };
    let seat = Seat::find(&table, &server_id, physical_id).map_err(|e| match e {
        atlasboost_core::Error::NotInTable { .. } => of_another_job(e.to_string()),
        other => other.into(),
    })?;
    if seat.world.size != c.size {
        return Err(of_another_job(format!(
            "{}={} but the rank table holds {} rank{}",
            EnvVars::ATLASBOOST_SIZE,
            c.size,
            seat.world.size,
            if seat.world.size == 1 { "" } else { "s" }
        )));
    }
    let mut job = job_at(
        &seat,
        &table_path,
        device_id,
        c.rank,
        &JobSettings {
            framework,
            job_id: &job_id,
            master_addr: &master_addr,
            master_port,
        },
    )?;
    if job.world.rank != c.rank {
        return Err(InitError::RankTable(format!(
            "{}={} but the rank table {} gives device {physical_id} of server {server_id} rank {}",
            EnvVars::ATLASBOOST_RANK,
            c.rank,
            table_path.display(),
            job.world.rank
        )));
    }
    job.launcher = Some(Launcher::Atlasboost);
    job.agreement = Agreement::Launch;
    Ok(job)
}

/// Reads a table whatever chip its devices are (the validator's rules depend on the chip).
fn read_table_any_chip(path: &Path) -> Result<RankTable, InitError> {
    // The launcher's table is a file: anything else (a FIFO would hold the read for ever) is
    // named before it is opened.
    if let Ok(meta) = std::fs::metadata(path)
        && !meta.is_file()
    {
        return Err(InitError::RankTable(format!(
            "the rank table {} is not a regular file",
            path.display()
        )));
    }
    // The file is read once, for its chip and its table.
    let value = atlasboost_core::ranktable::read_json(path)?;
    let chip = atlasboost_core::ranktable::default_chip(&value);
    Ok(RankTable::from_value(
        value,
        &path.display().to_string(),
        chip,
    )?)
}

/// What one process tells the others in the first round.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Claim {
    /// Its launcher rank.
    rank: u32,
    /// Its host.
    server_id: String,
    /// Its local rank.
    local_rank: u32,
    /// Its device, or why it has none.
    device: Result<Device, String>,
    /// The job's `MASTER_ADDR` and `MASTER_PORT` if this process becomes its `RANK` 0 (each
    /// process's host and a free port there), or the launcher's (launcher rank 0 only), so
    /// that every process gets the same ([`master_of`]).
    master: Option<(String, u16)>,
    /// The table it asks for; every process must ask for the same.
    #[serde(default)]
    table: TableChoice,
}

/// The table a process asks for: `ATLASBOOST_RANK_TABLE_FORMAT` and `ATLASBOOST_RANK_ORDER`
/// (by default format 1.0, servers by id).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct TableChoice {
    format: Format,
    /// Servers by the lowest rank of each (`hosts`), else by server id.
    by_rank: bool,
}

impl TableChoice {
    /// From the environment; a value that is not one of the choices is named.
    fn from_env() -> Result<TableChoice, InitError> {
        let format = match env(EnvVars::ATLASBOOST_RANK_TABLE_FORMAT) {
            None => Format::default(),
            Some(v) => v.parse::<Format>().map_err(|_| InitError::BadVariable {
                variable: EnvVars::ATLASBOOST_RANK_TABLE_FORMAT,
                value: v,
                reason: "expected 1.0, 1.2 or legacy (as `atlasboost run --format`)".into(),
            })?,
        };
        let by_rank = match env(EnvVars::ATLASBOOST_RANK_ORDER).as_deref() {
            None | Some("server-id") => false,
            Some("hosts") => true,
            Some(other) => {
                return Err(InitError::BadVariable {
                    variable: EnvVars::ATLASBOOST_RANK_ORDER,
                    value: other.to_string(),
                    reason: "expected server-id or hosts (as `atlasboost run --rank-order`)".into(),
                });
            }
        };
        if by_rank && format == Format::Legacy {
            return Err(InitError::BadVariable {
                variable: EnvVars::ATLASBOOST_RANK_ORDER,
                value: "hosts".into(),
                reason: format!(
                    "{}=legacy ranks servers by server_id; use server-id",
                    EnvVars::ATLASBOOST_RANK_TABLE_FORMAT
                ),
            });
        }
        Ok(TableChoice { format, by_rank })
    }
}

impl std::fmt::Display for TableChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let order = if self.by_rank { "hosts" } else { "server-id" };
        write!(f, "format {}, order {order}", self.format)
    }
}

/// What to build from `claims` (in rank order): the table every process asked for, with the
/// servers in order of their lowest rank when it asked for `hosts`.
///
/// # Errors
///
/// [`InitError::Config`] naming the first process that asked for another table than rank 0.
fn build_options(claims: &[Claim]) -> Result<BuildOptions, InitError> {
    let Some(first) = claims.first() else {
        return Ok(BuildOptions::default());
    };
    if let Some(other) = claims.iter().find(|c| c.table != first.table) {
        return Err(InitError::Config(format!(
            "rank {} asks for a rank table of {} but rank {} for {}: give every process the same \
             {} and {}",
            other.rank,
            other.table,
            first.rank,
            first.table,
            EnvVars::ATLASBOOST_RANK_TABLE_FORMAT,
            EnvVars::ATLASBOOST_RANK_ORDER
        )));
    }
    let order = match first.table.by_rank {
        false => RankOrder::ServerId,
        true => {
            // Each server once, where its lowest rank is (claims are in rank order).
            let mut seen = std::collections::HashSet::new();
            RankOrder::Hosts(
                claims
                    .iter()
                    .filter(|c| seen.insert(c.server_id.as_str()))
                    .map(|c| c.server_id.clone())
                    .collect(),
            )
        }
    };
    Ok(BuildOptions {
        format: first.table.format,
        order,
        chip: None,
    })
}

/// What a process tells the others in the second round: whether it wrote the table.
#[derive(Debug, Clone, Serialize, Deserialize)]
enum Written {
    /// Another process of its host writes it.
    NotMine,
    /// Written, at this path.
    Done(PathBuf),
    /// Could not be written.
    Failed(String),
}

/// What round 2 tells the processes of a host.
#[derive(Debug, Clone, Serialize, Deserialize)]
enum Outcome {
    /// The host's table was written by `writer`, at `path`.
    Written { writer: u32, path: PathBuf },
    /// Process `rank` on `host`, the first in rank order that failed, could not write its
    /// host's table.
    Failed {
        rank: u32,
        host: String,
        why: String,
    },
}

/// What the ZeroMQ coordinator sends a process that does not write its host's table.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Assignment {
    seat: Seat,
    /// The job's `MASTER_ADDR` and `MASTER_PORT` ([`master_of`]).
    master: Option<(String, u16)>,
}

/// Round 1's answer over ZeroMQ starts with one of these bytes.
mod answer_tag {
    /// Then every claim, as `wire::pack_list` packs them.
    pub(super) const CLAIMS: u8 = b'C';
    /// Then an [`Assignment`](super::Assignment) in JSON.
    pub(super) const SEAT: u8 = b'S';
}

/// The settings every process of a rendezvous shares.
struct Shared {
    framework: Framework,
    job_id: String,
    /// Who holds the table's lock: the job id, unless no launcher named the job (then each
    /// process is a job of its own).
    lock_job: String,
    table_path: PathBuf,
    server_id: String,
    timeout: Duration,
    table: TableChoice,
    /// `ATLASBOOST_PROBE`, `ATLASBOOST_SIM`: checked as the other settings are.
    discovery: Discovery,
    /// The rendezvous's key (`ATLASBOOST_SECRET` checked also where nobody is met).
    secret: Secret,
}

impl Shared {
    /// The settings, from the environment.
    fn from_env(framework: Framework) -> Result<Shared, InitError> {
        let job_id = job_id();
        let secret = job_secret(&job_id)?;
        Ok(Shared {
            framework,
            lock_job: match launcher_job_id() {
                Some(_) => job_id.clone(),
                None => format!("{job_id}-pid{}", std::process::id()),
            },
            job_id,
            table_path: table_path()?,
            server_id: server_id()?,
            timeout: timeout()?,
            table: TableChoice::from_env()?,
            discovery: discovery()?,
            secret,
        })
    }
}

/// How this process finds its device: malformed or contradicting variables are the
/// settings' errors, not a device's.
fn discovery() -> Result<Discovery, InitError> {
    let discovery = Discovery::from_env().map_err(InitError::Config)?;
    crate::probe::check_choice(&discovery).map_err(|e| InitError::Config(error_chain(&e)))?;
    if discovery.sim.is_none()
        && matches!(
            discovery.probe,
            crate::settings::ProbeKind::Dsmi | crate::settings::ProbeKind::Auto
        )
    {
        atlasboost_dsmi::check_settings().map_err(|e| InitError::Config(error_chain(&e)))?;
    }
    Ok(discovery)
}

fn rendezvous(c: &LaunchContext, framework: Framework) -> Result<Job, InitError> {
    let shared = Shared::from_env(framework)?;
    if c.launcher.is_mpi() && cfg!(feature = "mpi") {
        return mpi_rendezvous(c, &shared);
    }
    if c.size == 1 {
        // Nobody to meet: no coordinator, no MASTER_ADDR needed.
        let mut job = agree(&mut Single, 0, 0, &shared)?;
        job.launcher = Some(c.launcher);
        job.agreement = Agreement::Alone;
        return Ok(job);
    }
    // Where rank 0's coordinator listens, and where everyone connects.
    let local = match c.master_addr {
        Some(_) => None,
        None => local_endpoint(c)?,
    };
    let (bind, endpoint) = match (&c.master_addr, local) {
        (Some(master), _) => {
            let port = rendezvous_port(c)?;
            let endpoint = master_endpoint(master, port)?;
            // An IPv6 master: every address of both families (the sockets allow IPv6).
            let any = match endpoint.starts_with('[') {
                true => "[::]",
                false => "0.0.0.0",
            };
            (format!("tcp://{any}:{port}"), format!("tcp://{endpoint}"))
        }
        (None, Some(local)) => (local.clone(), local),
        (None, None) => {
            let hint = if c.launcher.is_mpi() && c.local_size == Some(c.size) {
                // Every rank here would meet over a socket named after the MPI job, but
                // nothing names it: variables set by hand, or a launcher not recognised.
                format!(
                    " (every rank is on this host, but nothing names the MPI job, which the \
                     ranks of one host meet under: Open MPI's {} or {}, or MPICH's \
                     hydra_pmi_proxy above this process; started by hand?)",
                    EnvVars::OMPI_MCA_ORTE_HNP_URI,
                    EnvVars::PMIX_NAMESPACE
                )
            } else if c.launcher.is_mpi() {
                format!(
                    " (mpirun does not say which host runs rank 0: `mpirun -x {}=<that host>`; \
                     or use a build with MPI support, which meets over MPI: \
                     atlasboost.build_info() in Python, atlasboost_build_info() in C tell, and \
                     `pip install` builds it where it finds mpicc)",
                    EnvVars::MASTER_ADDR
                )
            } else {
                String::new()
            };
            return Err(InitError::LaunchContext(format!(
                "started by {} as rank {} of {}, but {} is not set: the processes meet at \
                 launcher rank 0's host, so set {} to its address{hint}",
                c.launcher,
                c.rank,
                c.size,
                EnvVars::MASTER_ADDR,
                EnvVars::MASTER_ADDR
            )));
        }
    };
    let secret = shared.secret.clone();
    // A later start of the job in the same processes meets under a name of its own: a copy of
    // a contribution that reached the previous start's coordinator, on the same endpoint,
    // is then refused there, not taken for a second participant with its index.
    let meeting = match session::started_before() {
        0 => shared.job_id.clone(),
        n => format!("{}-start{}", shared.job_id, n + 1),
    };
    let coordinator = if c.rank == 0 {
        let config = CoordinatorConfig {
            // A timeout then names whom it waited for: "participant 3 (launcher rank 3)".
            names: (0..c.size).map(|r| format!("launcher rank {r}")).collect(),
            ..CoordinatorConfig::new(
                bind.clone(),
                c.size as usize,
                &meeting,
                secret.clone(),
                shared.timeout,
            )
        };
        Some(
            Coordinator::start_with(config, library_combiner()).map_err(|e| {
                InitError::Rendezvous {
                    timed_out: false,
                    message: format!(
                        "rank 0 cannot be the rendezvous coordinator at {bind} (with {}, set {} to \
                 another port): {}",
                        EnvVars::MASTER_ADDR,
                        EnvVars::ATLASBOOST_RENDEZVOUS_PORT,
                        error_chain(&e)
                    ),
                }
            })?,
        )
    } else {
        None
    };
    // Said at once, and again with the timeout it leads to (a refused address may still be
    // one that is not ready yet, a cluster's service address: not fatal by itself).
    let elsewhere = match (c.rank, &c.master_addr) {
        (0, Some(master)) => coordinator_elsewhere(master, &endpoint),
        _ => None,
    };
    if let Some(why) = &elsewhere {
        to_stderr(&format!("atlasboost: warning: {why}\n"));
    }
    let mut rdv = ZmqRendezvous::connect(ParticipantConfig::new(
        &endpoint,
        c.rank as usize,
        c.size as usize,
        &meeting,
        secret,
        shared.timeout + PARTICIPANT_SLACK,
    ))
    .map_err(|e| InitError::Rendezvous {
        timed_out: false,
        message: format!("cannot join the rendezvous at {endpoint}: {e}"),
    })?;
    let result = agree_zmq(&mut rdv, c.rank, c.local_rank, &shared);
    drop(rdv);
    if let Some(coordinator) = coordinator {
        // Delivers the last answers before it stops. What it refused (a stranger at the
        // port, another job's process, garbage) is said, as the launcher's coordinator does.
        let report = coordinator.finish();
        if report.dropped > 0 {
            to_stderr(&format!(
                "atlasboost: the rendezvous at {bind} refused {} frame{}:\n  {}\n",
                report.dropped,
                if report.dropped == 1 { "" } else { "s" },
                report.drop_log.join("\n  ")
            ));
        }
        // libzmq may leave a Unix socket's file behind when the process goes on (or exits)
        // before its I/O thread closes it; every process has connected or given up by now.
        if let Some(path) = bind.strip_prefix("ipc://") {
            let _ = std::fs::remove_file(path);
        }
    }
    let mut job = result.map_err(|e| match (e, elsewhere) {
        (
            InitError::Rendezvous {
                message,
                timed_out: true,
            },
            Some(why),
        ) => InitError::Rendezvous {
            message: format!("{message}; {why}"),
            timed_out: true,
        },
        (e, _) => e,
    })?;
    job.launcher = Some(c.launcher);
    job.agreement = Agreement::Zmq;
    Ok(job)
}

#[cfg(feature = "mpi")]
fn mpi_rendezvous(c: &LaunchContext, shared: &Shared) -> Result<Job, InitError> {
    let rdv = atlasboost_mpi::MpiRendezvous::world(shared.timeout).map_err(|e| {
        InitError::Rendezvous {
            timed_out: matches!(e, atlasboost_mpi::MpiError::Timeout { .. }),
            message: format!("cannot join MPI's world: {}", error_chain(&e)),
        }
    })?;
    if rdv.size() != c.size as usize {
        // E.g. OMPI_COMM_WORLD_* set by hand: MPI_Init then makes a world of one.
        return Err(InitError::LaunchContext(format!(
            "{} says this job has {} processes, but MPI's world has {}: was this process \
             started by {}'s launcher (mpirun)?",
            c.launcher,
            c.size,
            rdv.size(),
            c.launcher
        )));
    }
    // MPI's own numbering is the truth; the variables only told us MPI started us.
    let rank = rdv.index() as u32;
    let local_rank = rdv.local_rank() as u32;
    let mut rdv: Box<dyn Rendezvous> = Box::new(rdv);
    let mut job = agree(rdv.as_mut(), rank, local_rank, shared)?;
    job.launcher = Some(c.launcher);
    job.agreement = Agreement::Mpi;
    job._mpi = Some(rdv);
    Ok(job)
}

#[cfg(not(feature = "mpi"))]
fn mpi_rendezvous(_: &LaunchContext, _: &Shared) -> Result<Job, InitError> {
    unreachable!("only called with the mpi feature")
}

/// Rank 0 runs the coordinator, listening on every address of this host, and meets the
/// others at `endpoint` (`tcp://MASTER_ADDR:port`) as they do: a connection there that is
/// refused means `master` is most likely another host, where the others wait for a
/// coordinator that is not there (Slurm's task 0 placed off the step's first node; a
/// MASTER_ADDR copied from another job). What to say of it, if so; `None` when the connection
/// is taken, or does not come back within a second (a firewall proves nothing).
fn coordinator_elsewhere(master: &str, endpoint: &str) -> Option<String> {
    let address = endpoint
        .strip_prefix("tcp://")
        .and_then(|a| a.parse::<SocketAddr>().ok())?;
    match std::net::TcpStream::connect_timeout(&address, Duration::from_secs(1)) {
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Some(format!(
            "this process is rank 0, whose rendezvous coordinator listens on port {} of this \
             host, but {master} ({address}) refused a connection to it: {} (or, under Slurm, \
             the first node of the step's node list, where Slurm puts task 0 unless told \
             otherwise) must be rank 0's host",
            address.port(),
            EnvVars::MASTER_ADDR
        )),
        _ => None,
    }
}

/// No launcher: this process alone, on its host's first device.
fn alone(framework: Framework) -> Result<Job, InitError> {
    to_stderr(
        "atlasboost: no launcher's variables are set (RANK, OMPI_COMM_WORLD_RANK, SLURM_PROCID, \
         ...): running as a world of one\n",
    );
    let shared = Shared::from_env(framework)?;
    let mut rdv = Single;
    let mut job = agree(&mut rdv, 0, 0, &shared)?;
    job.agreement = Agreement::Alone;
    Ok(job)
}

/// The rendezvous of a world of one.
struct Single;

impl Rendezvous for Single {
    fn index(&self) -> usize {
        0
    }

    fn size(&self) -> usize {
        1
    }

    fn all_gather(&mut self, payload: &[u8]) -> atlasboost_core::Result<Vec<Vec<u8>>> {
        Ok(vec![payload.to_vec()])
    }

    fn barrier(&mut self) -> atlasboost_core::Result<()> {
        Ok(())
    }
}

/// The two rounds of a rendezvous where every process gets every claim (MPI, a world of one):
/// claims, then "written".
fn agree(
    rdv: &mut dyn Rendezvous,
    rank: u32,
    local_rank: u32,
    shared: &Shared,
) -> Result<Job, InitError> {
    let (claim, device) = make_claim(rank, local_rank, shared);
    let gathered = rdv.all_gather(&encode("this process's claim", &claim)?)?;
    // By index, which is the rank: the MPI rank, or 0 alone.
    let claims = parse_claims(&gathered)?;
    let (table, written, lock) = settle(&claims, rank, shared)?;
    let statuses = rdv.all_gather(&encode("the write status", &written)?)?;
    let statuses = parse_statuses(&statuses).map_err(rendezvous_error)?;
    let hosts: Vec<String> = claims.iter().map(|c| c.server_id.clone()).collect();
    let outcome = outcome_for(&shared.server_id, &statuses, &hosts).map_err(rendezvous_error)?;
    check_outcome(outcome, rank, shared)?;
    let device = device.map_err(InitError::Device)?;
    let seat = Seat::find(&table, &shared.server_id, device.physical_id)?;
    let mut job = job_from_seat(&seat, shared, &device, rank, master_of(&claims, &table))?;
    job._table_lock = lock;
    Ok(job)
}

/// The two rounds over ZeroMQ, whose coordinator runs [`library_combiner`]: the host's writer
/// gets every claim and proceeds as [`agree`]; the others get only their seat.
fn agree_zmq(
    rdv: &mut ZmqRendezvous,
    rank: u32,
    local_rank: u32,
    shared: &Shared,
) -> Result<Job, InitError> {
    let exchange = |rdv: &mut ZmqRendezvous, bytes: &[u8]| {
        rdv.exchange(bytes)
            .map_err(|e| InitError::from(atlasboost_core::Error::from(e)))
    };
    let (claim, device) = make_claim(rank, local_rank, shared);
    let answer = exchange(rdv, &encode("this process's claim", &claim)?)?;
    let (seat, written, master, lock) = match answer.split_first() {
        Some((&answer_tag::CLAIMS, list)) => {
            let settled = atlasboost_tcp::wire::unpack_list(list)
                .filter(|l| l.len() == rdv.size())
                .ok_or_else(|| rendezvous_error("the coordinator's claims are malformed".into()))
                .and_then(|gathered| parse_claims(&gathered))
                .and_then(|claims| {
                    let (table, written, lock) = settle(&claims, rank, shared)?;
                    let device = device.clone().map_err(InitError::Device)?;
                    let seat = Seat::find(&table, &shared.server_id, device.physical_id)?;
                    Ok((seat, written, master_of(&claims, &table), lock))
                });
            match settled {
                Ok(settled) => settled,
                Err(e) => {
                    // The processes given only their seat are waiting in round 2: tell them,
                    // rather than leave them to time out.
                    let failed = Written::Failed(e.to_string());
                    let _ = exchange(rdv, &encode("the write status", &failed)?);
                    return Err(e);
                }
            }
        }
        Some((&answer_tag::SEAT, json)) => {
            let a: Assignment = serde_json::from_slice(json).map_err(|e| {
                rendezvous_error(format!("the coordinator's assignment is malformed: {e}"))
            })?;
            (a.seat, Written::NotMine, a.master, None)
        }
        _ => {
            return Err(rendezvous_error(
                "the coordinator's answer to the claims is neither claims nor a seat".into(),
            ));
        }
    };
    let answer = exchange(rdv, &encode("the write status", &written)?)?;
    let outcome: Outcome = serde_json::from_slice(&answer).map_err(|e| {
        rendezvous_error(format!("the coordinator's write outcome is malformed: {e}"))
    })?;
    check_outcome(outcome, rank, shared)?;
    let device = device.map_err(InitError::Device)?;
    let mut job = job_from_seat(&seat, shared, &device, rank, master)?;
    job._table_lock = lock;
    Ok(job)
}

/// The ZeroMQ coordinator's answers in library mode.
/// - Round 1: it checks the claims and builds the table as every process would. The lowest rank
///   of each host gets every claim, to write the table. Every other process gets its
///   [`Assignment`]. If the claims are not a job, everyone gets every claim and fails alike.
/// - Round 2: each process gets its host's [`Outcome`].
fn library_combiner() -> Combiner {
    let mut hosts: Vec<String> = Vec::new();
    Box::new(move |round, payloads| match round {
        1 => {
            let (replies, by_rank) = answer_claims(payloads)?;
            hosts = by_rank;
            Ok(replies)
        }
        2 => answer_statuses(payloads, &hosts),
        _ => Err(format!("library mode has two rounds, not {round}")),
    })
}

/// Round 1 at the coordinator: the answers, and each process's host by rank.
fn answer_claims(payloads: &[Vec<u8>]) -> Result<(Replies, Vec<String>), String> {
    let claims = parse_claims(payloads).map_err(|e| e.to_string())?;
    if let Some((i, c)) = claims
        .iter()
        .enumerate()
        .find(|(i, c)| c.rank as usize != *i)
    {
        return Err(format!("participant {i} claims to be rank {}", c.rank));
    }
    let hosts: Vec<String> = claims.iter().map(|c| c.server_id.clone()).collect();
    let mut common = vec![answer_tag::CLAIMS];
    common.extend(atlasboost_tcp::wire::pack_list(payloads));
    let everyone = |common| (Replies::Same(common), hosts.clone());
    // Claims that are not a job: everyone finds out as `agree` would, from every claim.
    let Ok(devices) = check_claims(&claims) else {
        return Ok(everyone(common));
    };
    let Ok(options) = build_options(&claims) else {
        return Ok(everyone(common));
    };
    let Ok(table) = build_table(&devices, &options) else {
        return Ok(everyone(common));
    };
    if atlasboost_core::ranktable::chip_of_devices(&devices).is_err() {
        return Ok(everyone(common));
    }
    let master = master_of(&claims, &table);
    let Ok(seats) = Seat::all(&table) else {
        return Ok(everyone(common));
    };
    let mut seats: std::collections::HashMap<(String, u32), Seat> = seats
        .into_iter()
        .map(|s| ((s.server_id.clone(), s.physical_id), s))
        .collect();
    let mut writers = std::collections::HashSet::new();
    let mut own = Vec::with_capacity(claims.len());
    for c in &claims {
        let seat = c
            .device
            .as_ref()
            .ok()
            .and_then(|d| seats.remove(&(c.server_id.clone(), d.physical_id)));
        // Not reached for claims that passed the checks above; everyone would then fail alike.
        let Some(seat) = seat else {
            return Ok(everyone(common));
        };
        // Ranks are in order, so the first of each host is its lowest.
        if writers.insert(c.server_id.as_str()) {
            own.push(None);
            continue;
        }
        let assignment = Assignment {
            seat,
            master: master.clone(),
        };
        let mut bytes = vec![answer_tag::SEAT];
        serde_json::to_writer(&mut bytes, &assignment).map_err(|e| e.to_string())?;
        own.push(Some(bytes));
    }
    Ok((Replies::Mixed { common, own }, hosts))
}

/// Round 2 at the coordinator: each process's host's outcome.
fn answer_statuses(payloads: &[Vec<u8>], hosts: &[String]) -> Result<Replies, String> {
    let statuses = parse_statuses(payloads)?;
    let mut by_host: std::collections::HashMap<&str, Vec<u8>> = Default::default();
    let mut each = Vec::with_capacity(hosts.len());
    for host in hosts {
        if !by_host.contains_key(host.as_str()) {
            let outcome = outcome_for(host, &statuses, hosts)?;
            let bytes = serde_json::to_vec(&outcome).map_err(|e| e.to_string())?;
            by_host.insert(host, bytes);
        }
        each.push(by_host[host.as_str()].clone());
    }
    Ok(Replies::Each(each))
}

/// This process's claim, and its device (or why it has none).
fn make_claim(rank: u32, local_rank: u32, shared: &Shared) -> (Claim, Result<Device, String>) {
    let device = my_device(&shared.discovery, &shared.server_id, local_rank);
    // Launcher rank 0 offers the launcher's MASTER_ADDR and MASTER_PORT (or its host and a
    // free port there). The others offer their host and a free port, for the case where one
    // of them becomes the table's rank 0: RANK is the table's, and torch's env:// store
    // listens in the process whose RANK is 0 (see `master_of`). Under torchrun the store is
    // its agent's, at the launcher's address: only launcher rank 0 offers.
    let master = if rank == 0 {
        let addr = env(EnvVars::MASTER_ADDR).unwrap_or_else(|| shared.server_id.clone());
        let port = env(EnvVars::MASTER_PORT)
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(free_master_port);
        Some((addr, port))
    } else if env(EnvVars::TORCHELASTIC_RUN_ID).is_none() {
        // A MASTER_PORT the launcher gave (one port open in a firewall) is kept.
        let port = env(EnvVars::MASTER_PORT)
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(free_master_port);
        Some((shared.server_id.clone(), port))
    } else {
        None
    };
    let claim = Claim {
        rank,
        server_id: shared.server_id.clone(),
        local_rank,
        device: device.clone(),
        master,
        table: shared.table.clone(),
    };
    (claim, device)
}

/// `value` in JSON, for the rendezvous.
fn encode(what: &str, value: &impl Serialize) -> Result<Vec<u8>, InitError> {
    serde_json::to_vec(value).map_err(|e| rendezvous_error(format!("cannot encode {what}: {e}")))
}

/// A rendezvous error that is not a timeout.
fn rendezvous_error(message: String) -> InitError {
    InitError::Rendezvous {
        timed_out: false,
        message,
    }
}

/// Every participant's claim, by index.
fn parse_claims(gathered: &[Vec<u8>]) -> Result<Vec<Claim>, InitError> {
    parse_each(gathered, "a claim").map_err(rendezvous_error)
}

/// Every participant's write status, by index.
fn parse_statuses(gathered: &[Vec<u8>]) -> Result<Vec<Written>, String> {
    parse_each(gathered, "a write status")
}

/// Every participant's payload as JSON of a `T`, or which participant sent something else.
fn parse_each<T: serde::de::DeserializeOwned>(
    gathered: &[Vec<u8>],
    what: &str,
) -> Result<Vec<T>, String> {
    gathered
        .iter()
        .enumerate()
        .map(|(i, b)| {
            serde_json::from_slice(b).map_err(|e| {
                format!("rendezvous participant {i} sent something that is not {what}: {e}")
            })
        })
        .collect()
}

/// Round 1 for a process that holds every claim (in rank order): the table, after writing it
/// if this process is the lowest rank of its host (with the table's lock, which it holds for
/// the job).
fn settle(
    claims: &[Claim],
    rank: u32,
    shared: &Shared,
) -> Result<(RankTable, Written, Option<TableLock>), InitError> {
    let devices = check_claims(claims)?;
    let options = build_options(claims)?;
    let table = build_table(&devices, &options)?;
    let chip = atlasboost_core::ranktable::chip_of_devices(&devices)?;
    let writer = claims
        .iter()
        .filter(|c| c.server_id == shared.server_id)
        .map(|c| c.rank)
        .min();
    if writer != Some(rank) {
        return Ok((table, Written::NotMine, None));
    }
    let owner = LockOwner::this_process(&shared.lock_job, None);
    let lock = match TableLock::acquire(&shared.table_path, &owner) {
        Ok(lock) => lock,
        Err(e @ TableLockError::Held { .. }) => {
            let why = format!(
                "{e}; set {} to a path of this job's own",
                EnvVars::ATLASBOOST_RANK_TABLE_FILE
            );
            return Ok((table, Written::Failed(why), None));
        }
        Err(e) => return Ok((table, Written::Failed(error_chain(&e)), None)),
    };
    Ok(match write_table(&shared.table_path, &table, chip) {
        Ok(warnings) => {
            // What HCCL only recommends, and the devices whose addresses the table leaves
            // out, said as the launcher says them.
            let without_ip =
                atlasboost_core::ranktable::devices_without_ip(&devices, options.format);
            for w in warnings.iter().map(ToString::to_string).chain(without_ip) {
                to_stderr(&format!("atlasboost: the rank table: {w}\n"));
            }
            (table, Written::Done(shared.table_path.clone()), Some(lock))
        }
        Err(e) => (table, Written::Failed(error_chain(&e)), None),
    })
}

/// What round 2 means for the processes of `host`: the first failure of any host, else where
/// `host`'s writer wrote its table. `statuses` and `hosts` are by rank.
fn outcome_for(host: &str, statuses: &[Written], hosts: &[String]) -> Result<Outcome, String> {
    let unknown = "?".to_string();
    for (i, status) in statuses.iter().enumerate() {
        if let Written::Failed(why) = status {
            return Ok(Outcome::Failed {
                rank: i as u32,
                host: hosts.get(i).unwrap_or(&unknown).clone(),
                why: why.clone(),
            });
        }
    }
    statuses
        .iter()
        .zip(hosts)
        .enumerate()
        .find_map(|(i, (status, h))| match status {
            Written::Done(path) if h == host => Some(Outcome::Written {
                writer: i as u32,
                path: path.clone(),
            }),
            _ => None,
        })
        .ok_or_else(|| format!("no process of host {host} wrote its rank table"))
}

/// Fails this process if round 2's outcome says a table was not written, or was written
/// somewhere this process does not look.
fn check_outcome(outcome: Outcome, rank: u32, shared: &Shared) -> Result<(), InitError> {
    match outcome {
        Outcome::Failed { rank, host, why } => Err(InitError::TableNotWritten {
            rank,
            host,
            path: shared.table_path.clone(),
            why,
        }),
        // The writer of this host wrote where it was told; this process must look there.
        Outcome::Written { writer, path } if path != shared.table_path => {
            Err(InitError::RankTable(format!(
                "rank {writer} wrote host {}'s rank table to {}, but this process (rank \
                 {rank}) expects it at {}: give every process of a host the same absolute \
                 {} (a relative path depends on each process's directory)",
                shared.server_id,
                path.display(),
                shared.table_path.display(),
                EnvVars::ATLASBOOST_RANK_TABLE_FILE
            )))
        }
        Outcome::Written { .. } => Ok(()),
    }
}

/// The job's `MASTER_ADDR` and `MASTER_PORT`: those offered by the process that is the table's
/// rank 0 (`RANK=0`); launcher rank 0's (the launcher's own) when that is the same process,
/// as it mostly is, or under torchrun.
fn master_of(claims: &[Claim], table: &RankTable) -> Option<(String, u16)> {
    let first = Seat::all(table)
        .ok()
        .and_then(|seats| seats.into_iter().find(|s| s.world.rank == 0));
    let table_rank_0 = first.and_then(|seat| {
        claims.iter().find(|c| {
            c.server_id == seat.server_id
                && c.device
                    .as_ref()
                    .is_ok_and(|d| d.physical_id == seat.physical_id)
        })
    });
    table_rank_0
        .and_then(|c| c.master.clone())
        .or_else(|| claims.iter().find_map(|c| c.master.clone()))
}

/// Every claim's device, or an error naming the first rank without one and any two ranks
/// that claim one device.
fn check_claims(claims: &[Claim]) -> Result<Vec<Device>, InitError> {
    let mut devices: Vec<Device> = Vec::with_capacity(claims.len());
    let mut owner: std::collections::HashMap<(&str, u32), u32> = Default::default();
    for c in claims {
        let d = match &c.device {
            Ok(d) => d,
            Err(why) => {
                return Err(InitError::NoDevice {
                    rank: c.rank,
                    host: c.server_id.clone(),
                    local_rank: c.local_rank,
                    why: why.clone(),
                });
            }
        };
        if let Some(other) = owner.insert((c.server_id.as_str(), d.physical_id), c.rank) {
            return Err(InitError::SameDevice {
                first: other,
                second: c.rank,
                device: d.logical_id,
                physical: d.physical_id,
                host: c.server_id.clone(),
            });
        }
        devices.push(d.clone());
    }
    Ok(devices)
}

/// This process's device: its host's device number `local_rank` (in logical order), or why
/// there is none.
fn my_device(discovery: &Discovery, server_id: &str, local_rank: u32) -> Result<Device, String> {
    let probe = make_probe(discovery, server_id).map_err(|e| error_chain(&e))?;
    let mut devices = probe.probe().map_err(|e| error_chain(&e))?;
    devices.sort_by_key(|d| d.logical_id);
    let count = devices.len();
    devices.into_iter().nth(local_rank as usize).ok_or_else(|| {
        format!(
            "local rank {local_rank}, but the {} probe found {count} device{} on this host",
            probe.name(),
            if count == 1 { "" } else { "s" }
        )
    })
}

/// What a [`Job`]'s variables depend on besides the table.
struct JobSettings<'a> {
    framework: Framework,
    job_id: &'a str,
    master_addr: &'a str,
    master_port: u16,
}

/// The job of a process of a rendezvous, on `device`, at `seat`.
fn job_from_seat(
    seat: &Seat,
    shared: &Shared,
    device: &Device,
    launcher_rank: u32,
    master: Option<(String, u16)>,
) -> Result<Job, InitError> {
    let (master_addr, master_port) = master.unwrap_or_else(|| (shared.server_id.clone(), 0));
    job_at(
        seat,
        &shared.table_path,
        device.logical_id,
        launcher_rank,
        &JobSettings {
            framework: shared.framework,
            job_id: &shared.job_id,
            master_addr: &master_addr,
            master_port,
        },
    )
}

/// The job of the process with launcher rank `launcher_rank`, on logical device `device_id`
/// at `seat`.
fn job_at(
    seat: &Seat,
    table_path: &Path,
    device_id: u32,
    launcher_rank: u32,
    settings: &JobSettings<'_>,
) -> Result<Job, InitError> {
    let env = worker_env(&WorkerSpec {
        seat,
        table_path,
        logical_id: device_id,
        framework: settings.framework,
        job_id: settings.job_id,
        master_addr: settings.master_addr,
        master_port: settings.master_port,
    })?;
    let env_world = env.world;
    let (mut env, mut env_if_unset) = (env.set, env.set_if_unset);
    // What the frameworks read (without symbolic links: torch_npu refuses one), which
    // rank_table_file() gives too.
    let real_table = env
        .iter()
        .find(|(k, _)| *k == EnvVars::RANK_TABLE_FILE)
        .map_or_else(|| table_path.to_path_buf(), |(_, v)| PathBuf::from(v));
    // The frameworks' own sockets (gloo, HCCL's root-info mode) on the job's interface:
    // `ATLASBOOST_NIC` sets them, else the interface of this host's server_id, unless set.
    let nic_choice = crate::settings::env(EnvVars::ATLASBOOST_NIC);
    let nic =
        crate::host::JobNic::find(nic_choice.as_deref(), &seat.server_id).map_err(|reason| {
            InitError::BadVariable {
                variable: EnvVars::ATLASBOOST_NIC,
                value: nic_choice.clone().unwrap_or_default(),
                reason,
            }
        })?;
    if let Some(nic) = nic {
        match nic.explicit {
            true => env.extend(nic.vars(&seat.server_id)),
            false => env_if_unset.extend(nic.vars(&seat.server_id)),
        }
    }
    Ok(Job {
        world: env_world,
        launcher_rank,
        launcher: None,
        agreement: Agreement::Alone,
        server_id: seat.server_id.clone(),
        device_id,
        physical_id: seat.physical_id,
        table_path: real_table,
        env,
        env_if_unset,
        env_remove: Vec::new(),
        _mpi: None,
        _table_lock: None,
    })
}

/// The variables of [`EnvVars::OTHER_STARTUP`] this process has, to be removed ([`Job::env_remove`]):
/// none when `atlasboost run` (or `run --mpi`'s relay) started it, which passed on only those
/// the user exported with `-x`.
fn other_startup_present(launcher: Option<Launcher>) -> Vec<&'static str> {
    let relayed = env(EnvVars::ATLASBOOST_RELAYED).is_some_and(|v| v == "1");
    if launcher == Some(Launcher::Atlasboost) || relayed {
        return Vec::new();
    }
    EnvVars::OTHER_STARTUP
        .into_iter()
        .filter(|name| std::env::var_os(name).is_some())
        .collect()
}

/// A variable's value; empty counts as unset.
/// `ATLASBOOST_SERVER_ID` (an IPv4 address), else its address on `ATLASBOOST_NIC`, else this
/// host's primary IPv4 address (the rule of [`crate::host::server_id`]).
fn server_id() -> Result<String, InitError> {
    if let Some(id) = env(EnvVars::ATLASBOOST_SERVER_ID) {
        return match id.parse::<Ipv4Addr>() {
            Ok(_) => Ok(id),
            Err(_) => Err(InitError::BadVariable {
                variable: EnvVars::ATLASBOOST_SERVER_ID,
                value: id,
                reason: "not an IPv4 address (a server_id is its host's IPv4 address)".into(),
            }),
        };
    }
    // `--nic`'s variable: this host's address on that interface.
    if let Some(text) = env(EnvVars::ATLASBOOST_NIC) {
        let bad = |reason: String| InitError::BadVariable {
            variable: EnvVars::ATLASBOOST_NIC,
            value: text.clone(),
            reason,
        };
        let choice: crate::host::NicChoice = text.parse().map_err(bad)?;
        return crate::host::find_nic(&choice)
            .map(|nic| nic.ipv4.to_string())
            .map_err(|e| bad(e.to_string()));
    }
    // The launcher's rule: no address is an error, never a silent 127.0.0.1.
    crate::host::server_id(None).map_err(|error| InitError::NoServerId { error })
}

/// `ATLASBOOST_RANK_TABLE_FILE`, else `rank_table.json` in the current directory.
fn table_path() -> Result<PathBuf, InitError> {
    let path = crate::settings::env_path(EnvVars::ATLASBOOST_RANK_TABLE_FILE)
        .unwrap_or_else(|| "rank_table.json".into());
    if path.is_absolute() {
        return Ok(path);
    }
    std::env::current_dir()
        .map(|d| d.join(path))
        .map_err(|error| InitError::File {
            action: "read the current directory",
            path: ".".into(),
            error,
        })
}

/// `ATLASBOOST_RENDEZVOUS_TIMEOUT` in seconds, else [`DEFAULT_TIMEOUT`].
fn timeout() -> Result<Duration, InitError> {
    match env(EnvVars::ATLASBOOST_RENDEZVOUS_TIMEOUT) {
        None => Ok(DEFAULT_TIMEOUT),
        // The rule of `--rendezvous-timeout`; 1e300 would overflow a Duration.
        Some(v) => parse_seconds(&v).map_err(|reason| InitError::BadVariable {
            variable: EnvVars::ATLASBOOST_RENDEZVOUS_TIMEOUT,
            value: v,
            reason,
        }),
    }
}

/// `ATLASBOOST_RENDEZVOUS_PORT`, else `MASTER_PORT` + 1, else [`DEFAULT_RENDEZVOUS_PORT`].
fn rendezvous_port(c: &LaunchContext) -> Result<u16, InitError> {
    if let Some(v) = env(EnvVars::ATLASBOOST_RENDEZVOUS_PORT) {
        return match v.parse::<u16>() {
            Ok(p) if p > 0 => Ok(p),
            _ => Err(InitError::BadVariable {
                variable: EnvVars::ATLASBOOST_RENDEZVOUS_PORT,
                value: v,
                reason: "not a TCP port (1-65535)".into(),
            }),
        };
    }
    match c.master_port {
        Some(p) if p < u16::MAX => Ok(p + 1),
        // Falling back to the default would not be "MASTER_PORT + 1" as documented.
        Some(p) => Err(InitError::BadVariable {
            variable: EnvVars::MASTER_PORT,
            value: p.to_string(),
            reason: format!(
                "the rendezvous listens at MASTER_PORT + 1, and {p} is the last port: choose a \
                 lower MASTER_PORT, or set {}",
                EnvVars::ATLASBOOST_RENDEZVOUS_PORT
            ),
        }),
        None => Ok(DEFAULT_RENDEZVOUS_PORT),
    }
}

/// The job's id, the same in every process: `ATLASBOOST_JOB_ID`, else the launcher's job id,
/// else one made of `MASTER_ADDR` and the port, made a `JOB_ID` TensorFlow takes
/// ([`tensorflow_job_id`]).
fn job_id() -> String {
    tensorflow_job_id(&launcher_job_id().unwrap_or_else(|| "atlasboost".into()))
}

/// `raw` as a `JOB_ID` TensorFlow takes: anything but letters, digits, `-` and `_` becomes `-`,
/// and an all-digit id with a leading 0 (torchrun's `--rdzv-id 00042`, which TensorFlow
/// refuses) gets a `job-` prefix.
fn tensorflow_job_id(raw: &str) -> String {
    let id: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .take(64)
        .collect();
    let id = id.trim_matches('-');
    if id.is_empty() {
        "atlasboost".into()
    } else if id.len() > 1 && id.starts_with('0') && id.bytes().all(|b| b.is_ascii_digit()) {
        format!("job-{id}")
    } else {
        id.to_string()
    }
}

/// The job's id as its launcher names it (see [`job_id`]), if one does.
fn launcher_job_id() -> Option<String> {
    env(EnvVars::ATLASBOOST_JOB_ID)
        // torchrun's default run id is `none`: every job would share it.
        .or_else(|| env(EnvVars::TORCHELASTIC_RUN_ID).filter(|id| id != "none"))
        // Two srun steps of one allocation are two jobs.
        .or_else(|| {
            env(EnvVars::SLURM_JOB_ID).map(|id| match env(EnvVars::SLURM_STEP_ID) {
                Some(step) => format!("slurm-{id}-{step}"),
                None => format!("slurm-{id}"),
            })
        })
        // Open MPI 4 names its job in these (`OMPI_MCA_orte_ess_jobid` was Open MPI 3's).
        .or_else(|| env(EnvVars::OMPI_MCA_ESS_BASE_JOBID).map(|id| format!("ompi-{id}")))
        .or_else(|| env(EnvVars::PMIX_NAMESPACE).map(|ns| format!("pmix-{ns}")))
        .or_else(|| {
            env(EnvVars::MASTER_ADDR)
                .map(|a| format!("job-{a}-{}", env(EnvVars::MASTER_PORT).unwrap_or_default()))
        })
}

/// The key every message of the rendezvous is signed with: `ATLASBOOST_SECRET` (64 hex digits)
/// when the job script exports one; else derived from the job id. A derived key keeps jobs
/// apart but is no secret: export `ATLASBOOST_SECRET` on an untrusted network.
fn job_secret(job_id: &str) -> Result<Secret, InitError> {
    if let Some(hex) = env(EnvVars::ATLASBOOST_SECRET) {
        return Secret::from_hex(&hex).ok_or_else(|| {
            InitError::Config(format!(
                "{} is not 64 hexadecimal digits",
                EnvVars::ATLASBOOST_SECRET
            ))
        });
    }
    Ok(Secret::derive(&format!("atlasboost job {job_id}")))
}

/// Where the processes of an MPI job whose ranks all run on this host meet without MPI: an
/// `ipc://` endpoint (a Unix socket) named after the job, in a directory only this user can
/// enter (so the secret derived from the job id is enough). `None` when the job is not all
/// here, is not MPI's, or its launcher leaves no name for it.
///
/// The name must be the same in every rank and differ between jobs that run at once: Open
/// MPI's variables name the job and its daemon's address (the port keeps two jobs apart even
/// when their job ids collide); MPICH's Hydra sets none, so its proxy, the parent all local
/// ranks share, names the job by its process id and start time.
///
/// # Errors
///
/// [`InitError::Config`] when the directory cannot be made private.
fn local_endpoint(c: &LaunchContext) -> Result<Option<String>, InitError> {
    if !c.launcher.is_mpi() || c.local_size != Some(c.size) {
        return Ok(None);
    }
    let Some(job) = mpi_job_name(c.launcher, &env) else {
        return Ok(None);
    };
    let dir = private_dir()?;
    if c.rank == 0 {
        sweep_stale_sockets(&dir, STALE_SOCKET_AGE);
    }
    let name = atlasboost_tcp::Secret::derive(&job).to_hex();
    Ok(Some(format!(
        "ipc://{}/{}.sock",
        dir.display(),
        &name[..24]
    )))
}

/// How old a socket file of the private directory must be for a rank 0 to take it for one that
/// a killed rank 0 left (nothing listens on it): a live one listens from the moment it is made.
const STALE_SOCKET_AGE: std::time::Duration = std::time::Duration::from_secs(60);

/// Removes the rendezvous sockets in `dir` that nothing listens on and that are older than
/// `age`: a rank 0 killed during its rendezvous (mpirun's SIGTERM after another rank failed)
/// removes nothing, and the files would pile up.
fn sweep_stale_sockets(dir: &Path, age: std::time::Duration) {
    use std::os::unix::fs::FileTypeExt;

    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "sock") {
            continue;
        }
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let old = meta
            .modified()
            .ok()
            .and_then(|m| m.elapsed().ok())
            .is_some_and(|a| a >= age);
        if !(meta.file_type().is_socket() && old) {
            continue;
        }
        if let Err(e) = std::os::unix::net::UnixStream::connect(&path)
            && e.kind() == std::io::ErrorKind::ConnectionRefused
        {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// What names this MPI job on this host (see [`local_endpoint`]), from the variables `get`
/// reads.
fn mpi_job_name(launcher: Launcher, get: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    match launcher {
        Launcher::OpenMpi => {
            // Open MPI 4 (ORTE): the job id and mpirun's address; Open MPI 5 (PRRTE): the
            // namespace (`prterun-<host>-<pid>@1`) and the local PMIx server's address.
            let parts: Vec<String> = [
                EnvVars::OMPI_MCA_ORTE_HNP_URI,
                EnvVars::OMPI_MCA_ESS_BASE_JOBID,
                EnvVars::PMIX_NAMESPACE,
                EnvVars::PMIX_SERVER_URI41,
                EnvVars::PMIX_SERVER_URI4,
                EnvVars::PMIX_SERVER_URI3,
                EnvVars::PMIX_SERVER_URI21,
                EnvVars::PMIX_SERVER_URI2,
            ]
            .iter()
            .filter_map(|name| get(name).map(|v| format!("{name}={v}")))
            .collect();
            let named = get(EnvVars::OMPI_MCA_ORTE_HNP_URI).is_some()
                || get(EnvVars::PMIX_NAMESPACE).is_some();
            named.then(|| parts.join(";"))
        }
        Launcher::Mpich => hydra_proxy().map(|(pid, start)| format!("hydra {pid} {start}")),
        _ => None,
    }
}

/// The nearest ancestor that is MPICH's (or Intel MPI's) per-host proxy: its pid and start
/// time (which tells it apart from a later process with the same pid).
fn hydra_proxy() -> Option<(u32, u64)> {
    let mut pid = std::os::unix::process::parent_id();
    // Bounded: a worker started through a few shells is still found, a loop never runs.
    for _ in 0..16 {
        let stat = crate::process::process_stat(pid)?;
        if stat.comm == "hydra_pmi_proxy" || stat.comm == "pmi_proxy" {
            return Some((pid, stat.start_time));
        }
        pid = stat.ppid;
        if pid <= 1 {
            return None;
        }
    }
    None
}

/// A directory only this user can enter, for the job's socket: `$XDG_RUNTIME_DIR/atlasboost`,
/// else `/tmp/atlasboost-<uid>`. One that exists must be this user's, a directory (not a
/// link), and closed to others.
fn private_dir() -> Result<PathBuf, InitError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};

    let uid = nix::unistd::geteuid().as_raw();
    let dir = match crate::settings::env_path(EnvVars::XDG_RUNTIME_DIR) {
        Some(runtime) => runtime.join("atlasboost"),
        None => std::env::temp_dir().join(format!("atlasboost-{uid}")),
    };
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(error) => {
            return Err(InitError::File {
                action: "create the rendezvous socket's directory",
                path: dir,
                error,
            });
        }
    }
    let meta = std::fs::symlink_metadata(&dir).map_err(|error| InitError::File {
        action: "read",
        path: dir.clone(),
        error,
    })?;
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(InitError::Config(format!(
            "{} is not a directory that only this user (uid {uid}) can enter (mode {:o}, \
             owner {}): remove it, or set XDG_RUNTIME_DIR",
            dir.display(),
            meta.mode() & 0o7777,
            meta.uid()
        )));
    }
    Ok(dir)
}

/// `address:port` of the master, with IPv6 addresses in brackets and a name resolved now:
/// ZeroMQ would retry an unresolvable name until the timeout without saying why.
fn master_endpoint(host: &str, port: u16) -> Result<String, InitError> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::from((ip, port)).to_string());
    }
    let unresolved = |why: String| {
        InitError::LaunchContext(format!(
            "the master {host:?} ({} or the Slurm node list) does not resolve: {why}",
            EnvVars::MASTER_ADDR
        ))
    };
    let mut addrs = (host, port)
        .to_socket_addrs()
        .map_err(|e| unresolved(e.to_string()))?
        .collect::<Vec<_>>();
    // IPv4 first, as the server ids are.
    addrs.sort_by_key(|a| !a.is_ipv4());
    addrs
        .first()
        .map(|a| a.to_string())
        .ok_or_else(|| unresolved("no address".into()))
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use atlasboost_core::Health;

    use super::*;

    /// Every rank on this host under Open MPI's variables, but nothing naming the MPI job (set
    /// by hand): the error says that, not only that MASTER_ADDR is missing.
    #[cfg(not(feature = "mpi"))]
    #[test]
    fn ranks_of_one_host_with_no_mpi_job_name_are_told_why() {
        let c = LaunchContext {
            launcher: Launcher::OpenMpi,
            rank: 0,
            size: 2,
            local_rank: 0,
            local_size: Some(2),
            node_rank: None,
            master_addr: None,
            master_port: None,
        };
        let e = rendezvous(&c, Framework::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("MASTER_ADDR is not set"), "{e}");
        assert!(
            e.contains("every rank is on this host, but nothing names the MPI job"),
            "{e}"
        );
    }

    /// A socket file nothing listens on, older than the age given, is removed (a rank 0 killed
    /// during its rendezvous left it); a live one, a young one, and what is no socket stay.
    #[test]
    fn stale_rendezvous_sockets_are_swept_and_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let live_path = dir.path().join("live.sock");
        let _live = std::os::unix::net::UnixListener::bind(&live_path).unwrap();
        let dead = dir.path().join("dead.sock");
        drop(std::os::unix::net::UnixListener::bind(&dead).unwrap());
        let other = dir.path().join("other");
        drop(std::os::unix::net::UnixListener::bind(&other).unwrap());
        let file = dir.path().join("file.sock");
        std::fs::write(&file, "").unwrap();
        sweep_stale_sockets(dir.path(), std::time::Duration::from_secs(3600));
        assert!(dead.exists(), "a young one stays");
        sweep_stale_sockets(dir.path(), std::time::Duration::ZERO);
        assert!(!dead.exists(), "nothing listens on it");
        assert!(live_path.exists() && other.exists() && file.exists());
    }

    /// Rank 0 whose MASTER_ADDR port refuses a connection (another host, where nobody runs
    /// the coordinator) is told why; one where the coordinator listens is not.
    #[test]
    fn rank_0_finds_its_own_coordinator_or_says_where_it_is_not() {
        let listening = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let open = format!("tcp://{}", listening.local_addr().unwrap());
        assert_eq!(coordinator_elsewhere("127.0.0.1", &open), None);
        // A port just freed, that nothing else has taken since (a test beside this one may).
        let said = (0..5).find_map(|_| {
            let closed = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap();
            coordinator_elsewhere("node1", &format!("tcp://{closed}")).map(|why| (closed, why))
        });
        let (closed, why) = said.expect("a refused port within 5 tries");
        assert!(
            why.contains(&format!(
                "this process is rank 0, whose rendezvous coordinator listens on port {} of this \
                 host, but node1 ({closed}) refused a connection to it: MASTER_ADDR",
                closed.port()
            )),
            "{why}"
        );
        // A Unix socket's endpoint is this host's by its nature.
        assert_eq!(coordinator_elsewhere("x", "ipc:///tmp/x"), None);
    }

    #[test]
    fn a_launchers_job_id_becomes_one_tensorflow_takes() {
        for (raw, want) in [
            ("a b/c;ü", "a-b-c"),
            ("00042", "job-00042"),
            ("0", "0"),
            ("42", "42"),
            ("0a1", "0a1"),
            ("///", "atlasboost"),
        ] {
            assert_eq!(tensorflow_job_id(raw), want, "{raw:?}");
        }
    }

    fn context(launcher: Launcher, size: u32, local_size: Option<u32>) -> LaunchContext {
        LaunchContext {
            launcher,
            rank: 0,
            size,
            local_rank: 0,
            local_size,
            node_rank: None,
            master_addr: None,
            master_port: None,
        }
    }

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
        let map: std::collections::HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn an_open_mpi_job_is_named_by_its_job_and_its_daemons_address() {
        let job = [
            ("OMPI_MCA_ess_base_jobid", "1737687041"),
            (
                "OMPI_MCA_orte_hnp_uri",
                "1737687040.0;tcp://192.0.2.2:45107;tcp6://[fd00::2]:36249",
            ),
            ("PMIX_NAMESPACE", "1737687041"),
            ("PMIX_SERVER_URI2", "1737687040.0;tcp4://127.0.0.1:33951"),
        ];
        let name = mpi_job_name(Launcher::OpenMpi, &vars(&job));
        assert!(name.is_some());
        // Every rank of the job reads the same variables: the same name.
        assert_eq!(name, mpi_job_name(Launcher::OpenMpi, &vars(&job)));
        // Another mpirun at the same time, whose job id collides: its daemon's port differs.
        let mut other = job;
        other[1].1 = "1737687040.0;tcp://192.0.2.2:45999";
        other[3].1 = "1737687040.0;tcp4://127.0.0.1:34001";
        assert_ne!(name, mpi_job_name(Launcher::OpenMpi, &vars(&other)));
        // Open MPI 5 (PRRTE): the namespace alone names it.
        let prrte = [("PMIX_NAMESPACE", "prterun-node1-4242@1")];
        assert!(mpi_job_name(Launcher::OpenMpi, &vars(&prrte)).is_some());
        // OMPI_COMM_WORLD_* set by hand, no job: nothing to name it by.
        assert_eq!(mpi_job_name(Launcher::OpenMpi, &vars(&[])), None);
        assert_eq!(mpi_job_name(Launcher::Torchrun, &vars(&job)), None);
    }

    #[test]
    fn only_an_mpi_job_wholly_on_this_host_meets_on_a_local_socket() {
        // Across hosts (or with no local size known) there is no local socket to meet at.
        for c in [
            context(Launcher::OpenMpi, 8, Some(4)),
            context(Launcher::OpenMpi, 8, None),
            context(Launcher::Slurm, 4, Some(4)),
        ] {
            assert_eq!(local_endpoint(&c).ok(), Some(None), "{c:?}");
        }
    }

    /// The claims of `hosts` hosts with `per_host` processes each, in rank order, each on the
    /// device of its local rank; rank 0 names the master. The hosts' ids run backwards
    /// (`10.0.{hosts-1}.1` first), so the table's ranks are not the launcher's.
    fn claims(hosts: u32, per_host: u32) -> Vec<Vec<u8>> {
        claims_asking(hosts, per_host, &TableChoice::default())
    }

    /// [`claims`], each asking for `table`.
    fn claims_asking(hosts: u32, per_host: u32, table: &TableChoice) -> Vec<Vec<u8>> {
        (0..hosts * per_host)
            .map(|rank| {
                let (host, local) = (rank / per_host, rank % per_host);
                let server_id = format!("10.0.{}.1", hosts - 1 - host);
                let claim = Claim {
                    rank,
                    server_id: server_id.clone(),
                    local_rank: local,
                    device: Ok(Device {
                        server_id,
                        logical_id: local,
                        physical_id: local,
                        ip: Some(IpAddr::V4(Ipv4Addr::new(29, 0, host as u8, local as u8))),
                        chip: "910".into(),
                        health: Health::Healthy,
                        super_device_id: None,
                        super_pod_id: None,
                    }),
                    master: None,
                    table: table.clone(),
                };
                let claim = Claim {
                    master: (rank == 0).then(|| (claim.server_id.clone(), 29500)),
                    ..claim
                };
                serde_json::to_vec(&claim).unwrap()
            })
            .collect()
    }

    /// Rank `rank`'s answer to round 1: its seat, or `None` if it got every claim.
    fn seat_of(replies: &Replies, rank: usize) -> Option<Assignment> {
        let Replies::Mixed { own, .. } = replies else {
            panic!("expected a mixed answer, got {replies:?}");
        };
        let bytes = own[rank].as_ref()?;
        assert_eq!(bytes[0], answer_tag::SEAT);
        Some(serde_json::from_slice(&bytes[1..]).unwrap())
    }

    #[test]
    fn only_the_first_process_of_each_host_is_sent_every_claim() {
        let payloads = claims(3, 4);
        let (replies, hosts) = answer_claims(&payloads).unwrap();
        assert_eq!(hosts[5], "10.0.1.1");
        // What every process computed before: the table from every claim.
        let all = parse_claims(&payloads).unwrap();
        let table = build_table(&check_claims(&all).unwrap(), &BuildOptions::default()).unwrap();
        let Replies::Mixed { common, .. } = &replies else {
            panic!("expected a mixed answer, got {replies:?}");
        };
        assert_eq!(common[0], answer_tag::CLAIMS);
        assert_eq!(
            atlasboost_tcp::wire::unpack_list(&common[1..]),
            Some(payloads.clone())
        );
        for rank in 0..12 {
            match seat_of(&replies, rank) {
                None => assert_eq!(rank % 4, 0, "rank {rank} is not its host's first"),
                Some(a) => {
                    assert_ne!(rank % 4, 0, "rank {rank} writes its host's table");
                    let (server, physical) = (format!("10.0.{}.1", 2 - rank / 4), rank as u32 % 4);
                    assert_eq!(a.seat, Seat::find(&table, &server, physical).unwrap());
                    // Servers sort by id, so the launcher's last host is the table's first.
                    assert_eq!(a.seat.world.rank, (2 - rank as u32 / 4) * 4 + physical);
                    assert_eq!((a.seat.world.size, a.seat.world.node_count), (12, 3));
                    assert_eq!(a.master, Some(("10.0.2.1".into(), 29500)));
                }
            }
        }
    }

    #[test]
    fn the_table_every_process_asks_for_is_built_in_its_format_and_order() {
        // `hosts`: servers in the order the launcher placed them, so table ranks are the
        // launcher's even though the server ids run backwards.
        let by_rank = TableChoice {
            format: Format::V1_0,
            by_rank: true,
        };
        let payloads = claims_asking(3, 4, &by_rank);
        let (replies, _) = answer_claims(&payloads).unwrap();
        for rank in (0..12).filter(|r| r % 4 != 0) {
            let a = seat_of(&replies, rank).unwrap();
            assert_eq!(a.seat.world.rank, rank as u32, "{a:?}");
        }
        let all = parse_claims(&payloads).unwrap();
        let table =
            build_table(&check_claims(&all).unwrap(), &build_options(&all).unwrap()).unwrap();
        assert_eq!(table.format(), Format::V1_0);
        // legacy: the format of old TensorFlow stacks, whose RANK_ID is the pod_name.
        let legacy = TableChoice {
            format: Format::Legacy,
            by_rank: false,
        };
        let all = parse_claims(&claims_asking(2, 2, &legacy)).unwrap();
        let table =
            build_table(&check_claims(&all).unwrap(), &build_options(&all).unwrap()).unwrap();
        assert_eq!(table.format(), Format::Legacy);
        // A claim of an older atlasboost, without the field, asks for the defaults.
        let old: Claim = serde_json::from_str(
            r#"{"rank":0,"server_id":"10.0.0.1","local_rank":0,"device":{"Err":"none"},"master":null}"#,
        )
        .unwrap();
        assert_eq!(old.table, TableChoice::default());
    }

    #[test]
    fn processes_that_ask_for_different_tables_are_named() {
        let mut all = parse_claims(&claims(2, 2)).unwrap();
        all[3].table = TableChoice {
            format: Format::Legacy,
            by_rank: true,
        };
        let e = build_options(&all).unwrap_err().to_string();
        assert!(
            e.contains(
                "rank 3 asks for a rank table of format legacy, order hosts but rank 0 for \
                 format 1.0, order server-id"
            ) && e.contains("ATLASBOOST_RANK_TABLE_FORMAT"),
            "{e}"
        );
        // The coordinator sends every claim to everyone, who then fail alike.
        let payloads: Vec<Vec<u8>> = all.iter().map(|c| serde_json::to_vec(c).unwrap()).collect();
        let (replies, _) = answer_claims(&payloads).unwrap();
        assert!(matches!(replies, Replies::Same(_)), "{replies:?}");
    }

    #[test]
    fn a_process_that_is_not_a_writer_gets_an_answer_whose_size_does_not_grow_with_the_job() {
        let answer_len = |hosts| {
            let (replies, _) = answer_claims(&claims(hosts, 8)).unwrap();
            let Replies::Mixed { own, .. } = replies else {
                panic!("expected a mixed answer");
            };
            own[1].as_ref().map(Vec::len).unwrap()
        };
        let (small, large) = (answer_len(2), answer_len(64));
        // Only digits differ: of the ranks, the sizes and the host ids (10.0.1.1, 10.0.63.1).
        assert!(
            large <= small + 16,
            "{small} bytes for 16 ranks, {large} for 512"
        );
    }

    #[test]
    fn claims_that_are_not_a_job_go_to_everyone() {
        let mut payloads = claims(2, 2);
        // Rank 1 claims rank 0's device.
        let mut c: Claim = serde_json::from_slice(&payloads[1]).unwrap();
        c.device = serde_json::from_slice::<Claim>(&payloads[0])
            .unwrap()
            .device;
        payloads[1] = serde_json::to_vec(&c).unwrap();
        let (replies, _) = answer_claims(&payloads).unwrap();
        let Replies::Same(common) = replies else {
            panic!("expected every claim for everyone, got {replies:?}");
        };
        assert_eq!(common[0], answer_tag::CLAIMS);
        let parsed = parse_claims(&atlasboost_tcp::wire::unpack_list(&common[1..]).unwrap());
        let err = check_claims(&parsed.unwrap()).unwrap_err().to_string();
        assert!(err.contains("ranks 0 and 1 both claim device 0"), "{err}");
    }

    #[test]
    fn round_two_tells_each_host_where_its_table_is_or_who_failed() {
        let hosts: Vec<String> = ["a", "a", "b", "b"].map(String::from).to_vec();
        let status = |w: &Written| serde_json::to_vec(w).unwrap();
        let done = |p: &str| Written::Done(PathBuf::from(p));
        let payloads = [
            done("/a.json"),
            Written::NotMine,
            done("/b.json"),
            Written::NotMine,
        ]
        .iter()
        .map(status)
        .collect::<Vec<_>>();
        let Replies::Each(each) = answer_statuses(&payloads, &hosts).unwrap() else {
            panic!("expected one answer per process");
        };
        let outcomes: Vec<Outcome> = each
            .iter()
            .map(|b| serde_json::from_slice(b).unwrap())
            .collect();
        for (rank, (writer, path)) in [
            (0, "/a.json"),
            (0, "/a.json"),
            (2, "/b.json"),
            (2, "/b.json"),
        ]
        .into_iter()
        .enumerate()
        {
            match &outcomes[rank] {
                Outcome::Written { writer: w, path: p } => {
                    assert_eq!((*w, p.to_str().unwrap()), (writer, path), "rank {rank}");
                }
                other => panic!("rank {rank}: {other:?}"),
            }
        }
        let mut payloads = payloads;
        payloads[2] = status(&Written::Failed("disk full".into()));
        let Replies::Each(each) = answer_statuses(&payloads, &hosts).unwrap() else {
            panic!("expected one answer per process");
        };
        for (rank, bytes) in each.iter().enumerate() {
            match serde_json::from_slice(bytes).unwrap() {
                Outcome::Failed { rank: 2, host, why } => {
                    assert_eq!((host.as_str(), why.as_str()), ("b", "disk full"));
                }
                other => panic!("rank {rank}: {other:?}"),
            }
        }
    }
}
