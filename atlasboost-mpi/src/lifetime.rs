//! The process's MPI universe: initialised at most once, finalised at most once.
//!
//! One lock guards it, and every rendezvous holds the lock while it joins (so two threads of a
//! process never start the joining collectives at the same time) and while it is dropped.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use mpi::Threading;
use mpi::environment::Universe;

use crate::MpiError;

/// What the process knows about MPI's lifetime.
pub(crate) struct Lifetime {
    /// The universe, when atlasboost initialised MPI; dropping it finalises MPI.
    universe: Option<Universe>,
    /// How many rendezvous are alive.
    live: usize,
    /// The first operation of the process that timed out (its name and round), if any.
    poisoned: Option<(&'static str, u64)>,
}

static LIFETIME: Mutex<Lifetime> = Mutex::new(Lifetime {
    universe: None,
    live: 0,
    poisoned: None,
});

/// Takes the lock. A panic while it was held leaves the counts as they were, so a poisoned lock
/// is used as is.
pub(crate) fn lock() -> MutexGuard<'static, Lifetime> {
    LIFETIME.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Lifetime {
    /// Makes sure MPI is initialised, and returns whether atlasboost initialised it (and so
    /// finalises it when the last rendezvous is dropped). An `MPI_Init` of its own that is not
    /// over within `timeout` ends the process (see [`initialize_within`]).
    ///
    /// # Errors
    ///
    /// [`MpiError::Poisoned`] after a timeout in this process, [`MpiError::Finalized`] after
    /// finalisation.
    pub(crate) fn acquire(&mut self, timeout: Duration) -> Result<bool, MpiError> {
        if let Some((op, round)) = self.poisoned {
            return Err(MpiError::Poisoned { op, round });
        }
        if mpi::is_finalized() {
            return Err(MpiError::Finalized);
        }
        if self.universe.is_some() {
            return Ok(true);
        }
        if mpi::is_initialized() {
            return Ok(false);
        }
        // `None` when someone else initialised MPI since the check above (another thread,
        // outside this lock): then it is theirs.
        match initialize_within(timeout) {
            Some((universe, _granted)) => {
                self.universe = Some(universe);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Counts a new rendezvous.
    pub(crate) fn register(&mut self) {
        self.live += 1;
    }

    /// Records a timeout: from now on no rendezvous can be started, and MPI is not finalised
    /// (`MPI_Finalize` would wait for the missing rank, possibly forever).
    pub(crate) fn poison(&mut self, op: &'static str, round: u64) {
        self.poisoned.get_or_insert((op, round));
    }

    /// Forgets a dropped rendezvous; finalises MPI after the last one if atlasboost initialised
    /// it, no operation timed out, and `may_call_mpi` (MPI may be called from this thread).
    pub(crate) fn release(&mut self, may_call_mpi: bool) {
        self.live = self.live.saturating_sub(1);
        if self.live > 0 || self.poisoned.is_some() || !may_call_mpi {
            return;
        }
        if let Some(universe) = self.universe.take() {
            if mpi::is_finalized() {
                // The application finalised MPI behind atlasboost's back; a second
                // MPI_Finalize would be an error.
                std::mem::forget(universe);
            } else {
                // Dropping the universe calls MPI_Finalize.
                drop(universe);
            }
        }
    }
}

/// The least time `MPI_Init` is given, whatever the rendezvous's timeout: starting MPI (its
/// runtime's own exchange) takes seconds on a loaded machine, and the collectives after it
/// have the timeout of their own.
pub(crate) const MPI_INIT_LEAST: Duration = Duration::from_secs(10);

/// `MPI_Init_thread`, bounded by `timeout` (at least [`MPI_INIT_LEAST`]; zero: unbounded):
/// Open MPI's waits until every rank of the job has called it, so a rank that never calls
/// `init()` (or ended before the others started MPI) would keep this one there for good. A
/// call cannot be cancelled, and this thread is inside it; so a watchdog thread names the
/// wait on stderr and ends the process with [`crate::MPI_INIT_TIMEOUT_EXIT`] (`_exit`: an
/// exit's handlers could wait for MPI). Under mpirun, a rank's non-zero exit ends the job.
fn initialize_within(timeout: Duration) -> Option<(Universe, Threading)> {
    if timeout.is_zero() {
        return mpi::initialize_with_threading(Threading::Multiple);
    }
    let limit = timeout.max(MPI_INIT_LEAST);
    let (over, wait) = mpsc::channel::<()>();
    let watchdog = std::thread::Builder::new()
        .name("atlasboost-mpi-init".into())
        .spawn(move || {
            if wait.recv_timeout(limit) == Err(RecvTimeoutError::Timeout) {
                let text = format!(
                    "atlasboost: error: rendezvous failed (mpi): timed out after {limit:?} in \
                     MPI_Init, waiting for every rank of the job to start MPI: a rank that has \
                     not called init() (or MPI_Init) or that ended without it keeps the others \
                     there, and MPI cannot say which (the timeout is \
                     ATLASBOOST_RENDEZVOUS_TIMEOUT, at least {}s here); exiting with status {}\n",
                    MPI_INIT_LEAST.as_secs(),
                    crate::MPI_INIT_TIMEOUT_EXIT
                );
                // One write, and no lock: a full stderr that nobody reads must not keep the
                // process from ending.
                // SAFETY: the buffer is valid for its length; `_exit` ends the process without
                // running anything of it.
                unsafe {
                    let _ = nix::libc::write(2, text.as_ptr().cast(), text.len());
                    nix::libc::_exit(crate::MPI_INIT_TIMEOUT_EXIT);
                }
            }
        });
    let result = mpi::initialize_with_threading(Threading::Multiple);
    // Disconnects the channel: the watchdog returns at once.
    drop(over);
    // Without a watchdog (no thread could be started) the wait is MPI's, as it always was.
    if let Ok(watchdog) = watchdog {
        let _ = watchdog.join();
    }
    result
}
