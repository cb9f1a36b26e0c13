//! MPI rendezvous for atlasboost: when workers are started by `mpirun` (library mode), they agree
//! on one cluster table through MPI rather than through a ZeroMQ coordinator.
//!
//! [`MpiRendezvous`] implements [`atlasboost_core::Rendezvous`] over the processes of
//! `MPI_COMM_WORLD`: its index and size are the world rank and size, an all-gather exchanges
//! byte payloads of any length, and [`MpiRendezvous::local_rank`] and
//! [`MpiRendezvous::local_size`] come from a shared-memory split of the world (the processes of
//! one host).
//!
//! ```no_run
//! use std::time::Duration;
//! use atlasboost_core::Rendezvous;
//! use atlasboost_mpi::MpiRendezvous;
//!
//! // Every rank of the job calls this; MPI is initialised here unless the application (or a
//! // training framework) did it already.
//! let mut rdv = MpiRendezvous::world(Duration::from_secs(60))?;
//! let all = rdv.all_gather(format!("rank {}", rdv.index()).as_bytes())?;
//! assert_eq!(all.len(), rdv.size());
//! // Dropping the last rendezvous finalises MPI, if atlasboost initialised it.
//! drop(rdv);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # MPI's lifetime
//!
//! One process has one MPI universe, initialised once and finalised once. If MPI is already
//! initialised when [`MpiRendezvous::world`] is called, atlasboost uses it and never finalises
//! it. Otherwise atlasboost initialises it (asking for `MPI_THREAD_MULTIPLE`, accepting what the
//! library grants) and finalises it when the last [`MpiRendezvous`] of the process is dropped;
//! after that MPI cannot be used again in the process, and `world()` says so. Drop every
//! rendezvous before the process exits: Open MPI's `mpirun` ends the job with an error when a
//! rank exits without finalising. Under Open MPI, `MPI_Finalize` waits until every rank
//! finalises.
//!
//! # Timeouts
//!
//! Every wait is bounded: the collectives are MPI's nonblocking ones, tested in a loop until a
//! deadline. `MPI_Init` cannot be: when [`MpiRendezvous::world`] starts MPI and it is not over
//! within the timeout (a rank never started MPI), the process names the wait on stderr and
//! exits with [`MPI_INIT_TIMEOUT_EXIT`]. MPI cannot cancel a collective once started, and cannot say which rank is missing,
//! so a timeout leaves the operation pending for good: that rendezvous is unusable afterwards,
//! and no new one can be started in the process. The application should then end the job
//! ([`MpiRendezvous::abort`], or exit with an error: `mpirun` tears the job down when a rank
//! exits without finalising MPI).
//!
//! A collective that completes just as the deadline passes can succeed on some ranks and time
//! out on others. The ranks that succeeded then time out in their next operation, or, if it
//! happened while joining, wait in `world()`'s duplicate and split of the world (which MPI
//! cannot bound) until the process that timed out ends.
//!
//! # Building
//!
//! This crate links the system MPI (Open MPI, found through `mpicc`, and libclang for the
//! bindings), so it is opt-in: it is not one of the workspace's default members. Build it with
//! `cargo build -p atlasboost-mpi`, or through the `mpi` feature of `atlasboost-cli`.
#![deny(missing_docs)]

mod lifetime;
mod rendezvous;

use std::time::Duration;

pub use mpi::Threading;
pub use rendezvous::MpiRendezvous;

/// The exit status of a process whose `MPI_Init`, started by [`MpiRendezvous::world`], was not
/// over within the rendezvous's timeout (at least 10 s): atlasboost's own failure (a
/// rendezvous), as the launcher's exit codes have it.
pub const MPI_INIT_TIMEOUT_EXIT: i32 = 125;

/// The first line of the MPI library's own version (`MPI_Get_library_version`, which MPI
/// allows before `MPI_Init`), e.g. `Open MPI v4.1.4, package: Debian OpenMPI, ...`.
pub fn library_version() -> Option<String> {
    let text = mpi::environment::library_version().ok()?;
    let first = text.lines().next()?.trim().trim_end_matches('\0').trim();
    (!first.is_empty()).then(|| first.to_string())
}

/// Whether MPI is initialised and not finalised in this process, whoever initialised it.
pub fn is_initialized() -> bool {
    mpi::environment::is_initialized() && !mpi::environment::is_finalized()
}

/// Ends the whole MPI job (`MPI_Abort` on `MPI_COMM_WORLD` with `code`, after flushing this
/// process's standard output and error) if MPI is initialised and not finalised in this
/// process, whoever initialised it; returns otherwise. For a process that is failing: under
/// Open MPI its `MPI_Finalize` at exit would wait for every other rank, which may wait in a
/// collective for it, so the job would hang instead of ending.
pub fn abort_if_initialized(code: i32) {
    if is_initialized() {
        use mpi::topology::Communicator;
        use std::io::Write;
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().flush();
        mpi::topology::SimpleCommunicator::world().abort(code);
    }
}

/// Errors of the MPI rendezvous.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MpiError {
    /// A collective did not complete in time.
    #[error(
        "timed out after {timeout:?} waiting for the {size} ranks of MPI_COMM_WORLD in round \
         {round} ({op}): at least one rank has not reached this point (MPI cannot say which); \
         the collective cannot be cancelled, so this MPI rendezvous is unusable from now on"
    )]
    Timeout {
        /// What was waited for (`join`, `all_gather: payload lengths`, `all_gather: payloads`,
        /// `barrier`).
        op: &'static str,
        /// The round: 0 for joining in [`MpiRendezvous::world`], then 1, 2, ... for each
        /// all-gather or barrier.
        round: u64,
        /// The number of ranks in the world.
        size: usize,
        /// The timeout.
        timeout: Duration,
    },

    /// An earlier operation of this rendezvous timed out, so it cannot be used any more.
    #[error(
        "this MPI rendezvous is unusable: round {round} ({op}) timed out, and MPI cannot cancel \
         a collective once started"
    )]
    Broken {
        /// The operation that timed out.
        op: &'static str,
        /// Its round.
        round: u64,
    },

    /// A rendezvous of this process timed out earlier, so no new one can be started.
    #[error(
        "an earlier MPI rendezvous of this process timed out in round {round} ({op}); its \
         collective is still pending and cannot be cancelled, so no new MPI rendezvous can be \
         started in this process"
    )]
    Poisoned {
        /// The operation that timed out.
        op: &'static str,
        /// Its round.
        round: u64,
    },

    /// MPI was finalised in this process already.
    #[error(
        "MPI has already been finalised in this process (when the last MpiRendezvous was \
         dropped, or by the application), and MPI cannot be initialised twice"
    )]
    Finalized,

    /// A payload (or all payloads together) exceeds what one MPI collective can carry.
    #[error("cannot all-gather {len} bytes {what}: one MPI collective carries at most {max} bytes")]
    TooLarge {
        /// Whose payload: `from rank N`, or `in total`.
        what: String,
        /// Its length in bytes.
        len: u64,
        /// The limit (`i32::MAX`, MPI's count type).
        max: u64,
    },

    /// MPI's thread support does not allow a call from this thread.
    #[error(
        "MPI was initialised with thread support {level:?}, which allows MPI calls only from the \
         thread that initialised it, but this rendezvous is used from another thread than the \
         one that created it"
    )]
    WrongThread {
        /// The thread support MPI granted.
        level: Threading,
    },
}

impl From<MpiError> for atlasboost_core::Error {
    /// Every MPI error is a [`atlasboost_core::Error::Rendezvous`] of backend `mpi`; none is
    /// temporary (a timed-out MPI rendezvous cannot be retried).
    fn from(e: MpiError) -> Self {
        atlasboost_core::Error::Rendezvous {
            backend: "mpi".into(),
            temporary: false,
            source: Box::new(e),
        }
    }
}
