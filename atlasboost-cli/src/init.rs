//! Library mode (SPEC §10): `init()` inside a worker, whatever started it.
//!
//! [`init`] finds out how the process was started ([`launch_context`]) and then:
//! - under `atlasboost run`, reads the `ATLASBOOST_*` variables and checks the table the launcher
//!   wrote: no network;
//! - under `mpirun` (Open MPI or MPICH), with the `mpi` feature: a rendezvous over MPI;
//! - under any other launcher (torchrun, `srun`, `mpirun` without the `mpi` feature): a ZeroMQ
//!   rendezvous whose coordinator runs in the process of launcher rank 0, at `MASTER_ADDR` and
//!   port `ATLASBOOST_RENDEZVOUS_PORT` (default: `MASTER_PORT` + 1, else 29401);
//! - started by hand: a world of one, with a note on stderr.
//!
//! In a rendezvous every process probes its host and takes the device of its local rank; the
//! processes all-gather those claims, each builds the same table, the first process of each
//! host writes it, and a second round tells everyone it was written (or which host could not
//! write it).
//!
//! [`launch_context`]: atlasboost_core::launch_context

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use atlasboost_core::exchange::error_chain;
use atlasboost_core::launch_context::{self, LaunchContext, Launcher};
use atlasboost_core::ranktable::{BuildOptions, RankTable, build_table, read_table, write_table};
use atlasboost_core::worker_env::{Framework, WorkerSpec, worker_env};
use atlasboost_core::{Device, EnvVars, Rendezvous, World};
use atlasboost_tcp::{Coordinator, CoordinatorConfig, ParticipantConfig, Secret, ZmqRendezvous};
use serde::{Deserialize, Serialize};

use crate::cli::{DiscoveryArgs, ProbeKind};
use crate::commands::devices::make_probe;

/// The rendezvous port when neither `ATLASBOOST_RENDEZVOUS_PORT` nor `MASTER_PORT` is set
/// (torchrun's own rendezvous uses 29400, its `MASTER_PORT` 29500).
pub const DEFAULT_RENDEZVOUS_PORT: u16 = 29401;

/// The rendezvous timeout when `ATLASBOOST_RENDEZVOUS_TIMEOUT` is not set (as `atlasboost run`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// How participants' waits exceed the coordinator's, so its message naming who is missing
/// arrives first.
const PARTICIPANT_SLACK: Duration = Duration::from_secs(2);

/// Why [`init`] failed. Each kind is a different exception in the Python package.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InitError {
    /// A launcher's variables are partly set, malformed or not enough to meet (e.g. no
    /// `MASTER_ADDR`).
    #[error("{0}")]
    LaunchContext(String),
    /// An `ATLASBOOST_*` setting is malformed.
    #[error("{0}")]
    Config(String),
    /// A process has no device: the probe failed, too few devices for its local rank, or two
    /// processes claim one device.
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
    /// The table cannot be built, validated, read or written.
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
            E::Probe { .. } | E::RemoteProbe { .. } => InitError::Device(message),
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
    /// The rank table (absolute path).
    pub table_path: PathBuf,
    /// The variables of SPEC §9 for this process: set by [`Job::export_env`].
    pub env: Vec<(&'static str, String)>,
    /// Set only where the environment does not have them yet.
    pub env_if_unset: Vec<(&'static str, String)>,
    /// Keeps MPI initialised while the job lives (finalised when dropped, if atlasboost
    /// initialised it).
    _mpi: Option<Box<dyn Rendezvous>>,
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
        for (name, value) in &self.env {
            // SAFETY: the caller guarantees no other thread touches the environment.
            unsafe { std::env::set_var(name, value) };
        }
        for (name, value) in &self.env_if_unset {
            if std::env::var_os(name).is_none() {
                // SAFETY: as above.
                unsafe { std::env::set_var(name, value) };
            }
        }
    }
}

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
    use std::sync::{Mutex, MutexGuard};

    use super::{InitError, InitOptions, Job, init};

    static JOB: Mutex<Option<Job>> = Mutex::new(None);

    fn job() -> MutexGuard<'static, Option<Job>> {
        // A panic while holding the lock leaves a consistent Option behind.
        JOB.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Initialises the process's job, once: a second call returns the first one's result
    /// without a second rendezvous (as the original tool's `init()`).
    ///
    /// # Errors
    ///
    /// As [`init`].
    pub fn start(opts: &InitOptions) -> Result<(), InitError> {
        let mut slot = job();
        if slot.is_none() {
            *slot = Some(init(opts)?);
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

    /// Ends the job: MPI is finalised if atlasboost initialised it. Later calls need
    /// [`start`] again. Does nothing before [`start`].
    pub fn shutdown() {
        let ended = job().take();
        drop(ended);
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
            Some(name) => name.parse()?,
            None => Framework::default(),
        },
    };
    let context = launch_context::detect_from_env()?;
    match context {
        Some(c) if c.launcher == Launcher::Atlasboost => from_launch(&c, framework),
        Some(c) => rendezvous(&c, framework),
        None => alone(framework),
    }
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
        v.parse()
            .map_err(|_| InitError::LaunchContext(format!("{name}={v} is not a number")))
    };
    let table_path = PathBuf::from(need(EnvVars::ATLASBOOST_RANK_TABLE_FILE)?);
    let server_id = need(EnvVars::ATLASBOOST_SERVER_ID)?;
    let physical_id = number(EnvVars::ATLASBOOST_PHYSICAL_ID)?;
    let device_id = number(EnvVars::ATLASBOOST_DEVICE_ID)?;
    let table = read_table_any_chip(&table_path)?;
    let job_id = need(EnvVars::ATLASBOOST_JOB_ID)?;
    let master_addr = env(EnvVars::MASTER_ADDR).unwrap_or_else(|| server_id.clone());
    let master_port = env(EnvVars::MASTER_PORT)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    let mut job = job_from_table(
        &table,
        &table_path,
        Placement {
            server_id: &server_id,
            physical_id,
            device_id,
            launcher_rank: c.rank,
        },
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
    let value = atlasboost_core::ranktable::read_json(path)?;
    let chip = atlasboost_core::ranktable::default_chip(&value);
    Ok(read_table(path, chip)?)
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
    /// Launcher rank 0 only: the job's `MASTER_ADDR` and `MASTER_PORT`, so every process gets
    /// the same.
    master: Option<(String, u16)>,
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

/// The settings every process of a rendezvous shares.
struct Shared {
    framework: Framework,
    job_id: String,
    table_path: PathBuf,
    server_id: String,
    timeout: Duration,
}

impl Shared {
    /// The settings, from the environment.
    fn from_env(framework: Framework) -> Result<Shared, InitError> {
        Ok(Shared {
            framework,
            job_id: job_id(),
            table_path: table_path()?,
            server_id: server_id()?,
            timeout: timeout()?,
        })
    }
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
    let Some(master) = c.master_addr.clone() else {
        let hint = if c.launcher.is_mpi() {
            " (this build has no MPI support: build with the `mpi` feature to rendezvous over MPI)"
        } else {
            ""
        };
        return Err(InitError::LaunchContext(format!(
            "started by {} as rank {} of {}, but {} is not set: the processes meet at launcher \
             rank 0's host, so set {} to its address{hint}",
            c.launcher,
            c.rank,
            c.size,
            EnvVars::MASTER_ADDR,
            EnvVars::MASTER_ADDR
        )));
    };
    let port = rendezvous_port(c)?;
    let endpoint = format!("tcp://{}", master_endpoint(&master, port)?);
    let secret = job_secret(&shared.job_id)?;
    let coordinator =
        if c.rank == 0 {
            let config = CoordinatorConfig {
                names: Vec::new(),
                ..CoordinatorConfig::new(
                    format!("tcp://0.0.0.0:{port}"),
                    c.size as usize,
                    &shared.job_id,
                    secret.clone(),
                    shared.timeout,
                )
            };
            Some(Coordinator::start(config).map_err(|e| InitError::Rendezvous {
            timed_out: false,
            message: format!(
                "rank 0 cannot be the rendezvous coordinator on port {port} (set {} to another \
                 port): {}",
                EnvVars::ATLASBOOST_RENDEZVOUS_PORT,
                error_chain(&e)
            ),
        })?)
        } else {
            None
        };
    let mut rdv = ZmqRendezvous::connect(ParticipantConfig::new(
        &endpoint,
        c.rank as usize,
        c.size as usize,
        &shared.job_id,
        secret,
        shared.timeout + PARTICIPANT_SLACK,
    ))
    .map_err(|e| InitError::Rendezvous {
        timed_out: false,
        message: format!("cannot join the rendezvous at {endpoint}: {e}"),
    })?;
    let result = agree(&mut rdv, c.rank, c.local_rank, &shared);
    drop(rdv);
    if let Some(coordinator) = coordinator {
        // Delivers the last answers before it stops.
        coordinator.finish();
    }
    let mut job = result?;
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

/// No launcher: this process alone, on its host's first device.
fn alone(framework: Framework) -> Result<Job, InitError> {
    crate::printer::to_stderr(
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

/// The two rounds of every rendezvous: claims, then "written".
fn agree(
    rdv: &mut dyn Rendezvous,
    rank: u32,
    local_rank: u32,
    shared: &Shared,
) -> Result<Job, InitError> {
    let device = my_device(&shared.server_id, local_rank);
    let master = (rank == 0).then(|| {
        let addr = env(EnvVars::MASTER_ADDR).unwrap_or_else(|| shared.server_id.clone());
        let port = env(EnvVars::MASTER_PORT)
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| crate::launch::agent::free_port("0.0.0.0"));
        (addr, port)
    });
    let claim = Claim {
        rank,
        server_id: shared.server_id.clone(),
        local_rank,
        device: device.clone(),
        master,
    };
    let bytes = serde_json::to_vec(&claim).map_err(|e| InitError::Rendezvous {
        timed_out: false,
        message: format!("cannot encode this process's claim: {e}"),
    })?;
    let gathered = rdv.all_gather(&bytes)?;
    let mut claims = Vec::with_capacity(gathered.len());
    for (i, b) in gathered.iter().enumerate() {
        let c: Claim = serde_json::from_slice(b).map_err(|e| InitError::Rendezvous {
            timed_out: false,
            message: format!("rendezvous participant {i} sent something that is not a claim: {e}"),
        })?;
        claims.push(c);
    }
    claims.sort_by_key(|c| c.rank);
    let devices = check_claims(&claims)?;
    let table = build_table(&devices, &BuildOptions::default())?;
    let chip = atlasboost_core::ranktable::chip_of_devices(&devices)?;
    // The first process of each host writes; the others wait for the second round.
    let writer = claims
        .iter()
        .filter(|c| c.server_id == shared.server_id)
        .map(|c| c.rank)
        .min();
    let written = if writer == Some(rank) {
        match write_table(&shared.table_path, &table, chip) {
            Ok(()) => Written::Done(shared.table_path.clone()),
            Err(e) => Written::Failed(error_chain(&e)),
        }
    } else {
        Written::NotMine
    };
    let bytes = serde_json::to_vec(&written).map_err(|e| InitError::Rendezvous {
        timed_out: false,
        message: format!("cannot encode the write status: {e}"),
    })?;
    let statuses = rdv.all_gather(&bytes)?;
    for (i, b) in statuses.iter().enumerate() {
        let host = claims.get(i).map_or("?", |c| c.server_id.as_str());
        match serde_json::from_slice::<Written>(b) {
            Ok(Written::Failed(why)) => {
                return Err(InitError::RankTable(format!(
                    "rank {i} on host {host} could not write the rank table {}: {why}",
                    shared.table_path.display()
                )));
            }
            // The writer of this host wrote where it was told; this process must look there.
            Ok(Written::Done(path)) if host == shared.server_id && path != shared.table_path => {
                return Err(InitError::RankTable(format!(
                    "rank {i} wrote host {host}'s rank table to {}, but this process (rank \
                     {rank}) expects it at {}: give every process of a host the same absolute \
                     {} (a relative path depends on each process's directory)",
                    path.display(),
                    shared.table_path.display(),
                    EnvVars::ATLASBOOST_RANK_TABLE_FILE
                )));
            }
            _ => {}
        }
    }
    let device = device.map_err(InitError::Device)?;
    let (master_addr, master_port) = claims
        .iter()
        .find_map(|c| c.master.clone())
        .unwrap_or_else(|| (shared.server_id.clone(), 0));
    job_from_table(
        &table,
        &shared.table_path,
        Placement {
            server_id: &shared.server_id,
            physical_id: device.physical_id,
            device_id: device.logical_id,
            launcher_rank: rank,
        },
        &JobSettings {
            framework: shared.framework,
            job_id: &shared.job_id,
            master_addr: &master_addr,
            master_port,
        },
    )
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
                return Err(InitError::Device(format!(
                    "rank {} on host {} (local rank {}) has no device: {why}",
                    c.rank, c.server_id, c.local_rank
                )));
            }
        };
        if let Some(other) = owner.insert((c.server_id.as_str(), d.physical_id), c.rank) {
            return Err(InitError::Device(format!(
                "ranks {other} and {} both claim device {} (physical id {}) of host {}: each \
                 process of a host needs its own local rank",
                c.rank, d.logical_id, d.physical_id, c.server_id
            )));
        }
        devices.push(d.clone());
    }
    Ok(devices)
}

/// This process's device: its host's device number `local_rank` (in logical order), or why
/// there is none.
fn my_device(server_id: &str, local_rank: u32) -> Result<Device, String> {
    let probe = make_probe(&discovery_from_env()?, server_id).map_err(|e| e.to_string())?;
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

/// Device discovery from `ATLASBOOST_PROBE`, `ATLASBOOST_SIM` and `ATLASBOOST_HCCN_CONF`.
fn discovery_from_env() -> Result<DiscoveryArgs, String> {
    let probe = match env(EnvVars::ATLASBOOST_PROBE) {
        None => ProbeKind::Auto,
        Some(name) => ProbeKind::from_name(&name).ok_or_else(|| {
            format!(
                "{}={name}: expected auto, dsmi, hccn or sim",
                EnvVars::ATLASBOOST_PROBE
            )
        })?,
    };
    let sim = match env(EnvVars::ATLASBOOST_SIM) {
        None => None,
        Some(v) => match v.parse::<u32>() {
            Ok(n) if (1..=255).contains(&n) => Some(n),
            _ => {
                return Err(format!(
                    "{}={v}: expected a number of simulated devices, 1 to 255",
                    EnvVars::ATLASBOOST_SIM
                ));
            }
        },
    };
    Ok(DiscoveryArgs {
        probe,
        sim,
        sim_chip: "910".into(),
        sim_ipv6: false,
        devices: None,
        hccn_conf: None,
    })
}

/// Which process and device a [`Job`] is for.
struct Placement<'a> {
    server_id: &'a str,
    physical_id: u32,
    device_id: u32,
    launcher_rank: u32,
}

/// What a [`Job`]'s variables depend on besides the table.
struct JobSettings<'a> {
    framework: Framework,
    job_id: &'a str,
    master_addr: &'a str,
    master_port: u16,
}

fn job_from_table(
    table: &RankTable,
    table_path: &Path,
    at: Placement<'_>,
    settings: &JobSettings<'_>,
) -> Result<Job, InitError> {
    let env = worker_env(&WorkerSpec {
        table,
        table_path,
        server_id: at.server_id,
        physical_id: at.physical_id,
        logical_id: at.device_id,
        framework: settings.framework,
        job_id: settings.job_id,
        master_addr: settings.master_addr,
        master_port: settings.master_port,
    })?;
    Ok(Job {
        world: env.world,
        launcher_rank: at.launcher_rank,
        launcher: None,
        agreement: Agreement::Alone,
        server_id: at.server_id.to_string(),
        device_id: at.device_id,
        physical_id: at.physical_id,
        table_path: table_path.to_path_buf(),
        env: env.set,
        env_if_unset: env.set_if_unset,
        _mpi: None,
    })
}

/// A variable's value; empty counts as unset.
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// `ATLASBOOST_SERVER_ID`, else this host's primary IPv4 address, else loopback.
fn server_id() -> Result<String, InitError> {
    if let Some(id) = env(EnvVars::ATLASBOOST_SERVER_ID) {
        return match id.parse::<Ipv4Addr>() {
            Ok(_) => Ok(id),
            Err(_) => Err(InitError::Config(format!(
                "{}={id} is not an IPv4 address (a server_id is its host's IPv4 address)",
                EnvVars::ATLASBOOST_SERVER_ID
            ))),
        };
    }
    Ok(crate::host::primary_ipv4()
        .unwrap_or(Ipv4Addr::LOCALHOST)
        .to_string())
}

/// `ATLASBOOST_RANK_TABLE_FILE`, else `rank_table.json` in the current directory.
fn table_path() -> Result<PathBuf, InitError> {
    let path = PathBuf::from(
        env(EnvVars::ATLASBOOST_RANK_TABLE_FILE).unwrap_or_else(|| "rank_table.json".into()),
    );
    if path.is_absolute() {
        return Ok(path);
    }
    std::env::current_dir()
        .map(|d| d.join(path))
        .map_err(|e| InitError::Config(format!("cannot read the current directory: {e}")))
}

/// `ATLASBOOST_RENDEZVOUS_TIMEOUT` in seconds, else [`DEFAULT_TIMEOUT`].
fn timeout() -> Result<Duration, InitError> {
    match env(EnvVars::ATLASBOOST_RENDEZVOUS_TIMEOUT) {
        None => Ok(DEFAULT_TIMEOUT),
        Some(v) => match v.parse::<f64>() {
            Ok(s) if s > 0.0 && s.is_finite() => Ok(Duration::from_secs_f64(s)),
            _ => Err(InitError::Config(format!(
                "{}={v} is not a number of seconds above 0",
                EnvVars::ATLASBOOST_RENDEZVOUS_TIMEOUT
            ))),
        },
    }
}

/// `ATLASBOOST_RENDEZVOUS_PORT`, else `MASTER_PORT` + 1, else [`DEFAULT_RENDEZVOUS_PORT`].
fn rendezvous_port(c: &LaunchContext) -> Result<u16, InitError> {
    if let Some(v) = env(EnvVars::ATLASBOOST_RENDEZVOUS_PORT) {
        return v.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| {
            InitError::Config(format!(
                "{}={v} is not a TCP port (1-65535)",
                EnvVars::ATLASBOOST_RENDEZVOUS_PORT
            ))
        });
    }
    Ok(match c.master_port {
        Some(p) if p < u16::MAX => p + 1,
        _ => DEFAULT_RENDEZVOUS_PORT,
    })
}

/// The job's id, the same in every process: `ATLASBOOST_JOB_ID`, else the launcher's job id,
/// else one made of `MASTER_ADDR` and the port. Anything but letters, digits, `-` and `_`
/// becomes `-` (TensorFlow refuses other `JOB_ID`s).
fn job_id() -> String {
    let raw = env(EnvVars::ATLASBOOST_JOB_ID)
        // torchrun's default run id is `none`: every job would share it.
        .or_else(|| env("TORCHELASTIC_RUN_ID").filter(|id| id != "none"))
        // Two srun steps of one allocation are two jobs.
        .or_else(|| {
            env("SLURM_JOB_ID").map(|id| match env("SLURM_STEP_ID") {
                Some(step) => format!("slurm-{id}-{step}"),
                None => format!("slurm-{id}"),
            })
        })
        // Open MPI 4 names its job in these (`OMPI_MCA_orte_ess_jobid` was Open MPI 3's).
        .or_else(|| env("OMPI_MCA_ess_base_jobid").map(|id| format!("ompi-{id}")))
        .or_else(|| env("PMIX_NAMESPACE").map(|ns| format!("pmix-{ns}")))
        .or_else(|| {
            env(EnvVars::MASTER_ADDR)
                .map(|a| format!("job-{a}-{}", env(EnvVars::MASTER_PORT).unwrap_or_default()))
        })
        .unwrap_or_else(|| "atlasboost".into());
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
    } else {
        id.to_string()
    }
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
