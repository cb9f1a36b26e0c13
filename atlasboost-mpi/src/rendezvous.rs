//! [`MpiRendezvous`]: the rendezvous over the processes of `MPI_COMM_WORLD`.

use std::io::Write;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use atlasboost_core::{Error, Rendezvous};
use mpi::datatype::PartitionMut;
use mpi::request::{Request, Scope};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use mpi::{Count, Threading};

use crate::{MpiError, lifetime};

/// The operations named in timeout errors.
const JOIN: &str = "join";
const LENGTHS: &str = "all_gather: payload lengths";
const PAYLOADS: &str = "all_gather: payloads";
const BARRIER: &str = "barrier";

/// The largest payload, and the largest sum of payloads, one all-gather carries: MPI counts are
/// C `int`s.
const MAX_BYTES: u64 = i32::MAX as u64;

/// Polls of a request before the first sleep: most rounds finish within microseconds.
const SPINS: u32 = 100;
/// The longest sleep between two polls.
const MAX_PAUSE: Duration = Duration::from_millis(1);

/// One participant of a rendezvous over the processes of `MPI_COMM_WORLD`.
///
/// Its index and size are the world rank and size. It talks over a duplicate of the world
/// communicator, so its collectives never match the application's own.
///
/// Every rank must create it and call the same operations in the same order, as for any MPI
/// collective. Each wait is bounded by the timeout given to [`MpiRendezvous::world`]; after a
/// timeout the rendezvous is unusable (see [`MpiError::Timeout`]).
pub struct MpiRendezvous {
    /// The duplicate of `MPI_COMM_WORLD`.
    comm: SimpleCommunicator,
    index: usize,
    size: usize,
    local_rank: usize,
    local_size: usize,
    timeout: Duration,
    /// The round of the last operation started (0 before the first).
    round: u64,
    /// The operation that timed out, and its round.
    broken: Option<(&'static str, u64)>,
    owns_mpi: bool,
    thread_support: Threading,
    /// The thread that created the rendezvous: the only one allowed to use it when MPI's
    /// thread support is below `Serialized`.
    creator: ThreadId,
}

// SAFETY: an MPI communicator handle is a process-wide value, valid in any thread; rsmpi's
// `SimpleCommunicator` is not `Send` only because Open MPI's handle is a raw pointer. Every
// operation takes `&mut self`, so one thread at a time uses the rendezvous, which is what
// MPI_THREAD_SERIALIZED and MPI_THREAD_MULTIPLE ask. Under MPI_THREAD_SINGLE or FUNNELED (MPI
// initialised by an application that asked for no more), calls are allowed only from the
// initialising thread: then every operation, and the drop, checks that it runs on the thread
// that created the rendezvous, and makes no MPI call otherwise (except `abort`, the last resort,
// documented as such).
unsafe impl Send for MpiRendezvous {}

impl std::fmt::Debug for MpiRendezvous {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiRendezvous")
            .field("index", &self.index)
            .field("size", &self.size)
            .field("local_rank", &self.local_rank)
            .field("local_size", &self.local_size)
            .field("timeout", &self.timeout)
            .field("round", &self.round)
            .field("broken", &self.broken)
            .field("owns_mpi", &self.owns_mpi)
            .field("thread_support", &self.thread_support)
            .finish_non_exhaustive()
    }
}

impl MpiRendezvous {
    /// Joins the rendezvous of every process of `MPI_COMM_WORLD`. Every rank must call it.
    ///
    /// If MPI is not initialised yet, initialises it (asking for [`Threading::Multiple`] and
    /// accepting what the library grants); it is then finalised when the last rendezvous of the
    /// process is dropped. If the application initialised MPI, it is used as it is and never
    /// finalised here. A second call while a rendezvous is alive shares the same MPI.
    ///
    /// Joining is a nonblocking barrier on the world, bounded by `timeout`; then the world is
    /// duplicated and split by shared memory (key: the world rank) for the local rank and size.
    /// Those two calls block, but only once every rank has joined. The lock that serialises
    /// `world()` and drops within the process is held meanwhile.
    ///
    /// `MPI_Init` cannot return an error after a timeout: under Open MPI it waits until every
    /// rank has called it. If a rank ends without calling it, `mpirun` ends the job when other
    /// ranks are in MPI already; but if that rank ended before any other started `MPI_Init`,
    /// Open MPI took it for a process that does not use MPI, and the others would wait in
    /// `MPI_Init` for good. So when `world()` starts MPI itself and `MPI_Init` is not over
    /// within `timeout` (at least 10 s; a zero `timeout` leaves it unbounded), the process says
    /// so on stderr and exits with [`MPI_INIT_TIMEOUT_EXIT`](crate::MPI_INIT_TIMEOUT_EXIT)
    /// (mpirun then ends the job). An application that calls `MPI_Init` itself keeps MPI's own
    /// wait.
    ///
    /// After a join timeout MPI stays initialised (it is never finalised in this process).
    /// Under `MPI_THREAD_SINGLE` or `FUNNELED` (an application that asked for no more), call it
    /// from the thread that initialised MPI.
    ///
    /// # Errors
    ///
    /// [`MpiError::Finalized`] if MPI was finalised in this process already,
    /// [`MpiError::Poisoned`] if a rendezvous of this process timed out before,
    /// [`MpiError::Timeout`] if not every rank joined within `timeout`.
    pub fn world(timeout: Duration) -> Result<MpiRendezvous, MpiError> {
        let mut life = lifetime::lock();
        let owns_mpi = life.acquire(timeout)?;
        let thread_support = mpi::environment::threading_support();
        let world = SimpleCommunicator::world();
        let index = rank_to_usize(world.rank());
        let size = rank_to_usize(world.size());

        // A barrier that can time out, so a rank that never comes is an error, not a hang.
        if let Err(pending) = wait_until(world.immediate_barrier(), Instant::now() + timeout) {
            // A barrier has no buffers; the request is left to MPI.
            std::mem::forget(pending);
            life.poison(JOIN, 0);
            return Err(MpiError::Timeout {
                op: JOIN,
                round: 0,
                size,
                timeout,
            });
        }
        let comm = world.duplicate();
        let local = comm.split_shared(world.rank());
        let (local_rank, local_size) = (rank_to_usize(local.rank()), rank_to_usize(local.size()));
        drop(local);
        life.register();
        Ok(MpiRendezvous {
            comm,
            index,
            size,
            local_rank,
            local_size,
            timeout,
            round: 0,
            broken: None,
            owns_mpi,
            thread_support,
            creator: std::thread::current().id(),
        })
    }

    /// This process's rank among the processes of its host (of its shared-memory domain),
    /// ordered by world rank.
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// How many processes of the world run on this host (share memory with this one).
    pub fn local_size(&self) -> usize {
        self.local_size
    }

    /// The timeout of each wait.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether atlasboost initialised MPI in this process (and so finalises it when the last
    /// rendezvous is dropped); `false` when the application had initialised it.
    pub fn owns_mpi(&self) -> bool {
        self.owns_mpi
    }

    /// The thread support MPI granted.
    pub fn thread_support(&self) -> Threading {
        self.thread_support
    }

    /// Whether an operation timed out, which leaves the rendezvous unusable.
    pub fn is_broken(&self) -> bool {
        self.broken.is_some()
    }

    /// Ends the whole MPI job now: flushes this process's standard output and error, then calls
    /// `MPI_Abort` on `MPI_COMM_WORLD` with `code`. Open MPI's `mpirun` kills every rank and
    /// exits with `code`. The way out after a timeout, when the job cannot go on.
    ///
    /// Unlike the other operations it does not check the thread: under `MPI_THREAD_SINGLE` or
    /// `FUNNELED`, call it from the thread that created the rendezvous.
    pub fn abort(&self, code: i32) -> ! {
        // Best effort: the process ends either way.
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().flush();
        SimpleCommunicator::world().abort(code)
    }

    /// [`Rendezvous::all_gather`] with this crate's error.
    ///
    /// Two collectives: an all-gather of the payload lengths, then one of the payloads. Each
    /// has the whole timeout.
    ///
    /// # Errors
    ///
    /// [`MpiError::Timeout`] if a rank is missing; [`MpiError::TooLarge`] (on every rank, and
    /// the rendezvous stays usable) if a payload, or their sum, is 2 GiB or more;
    /// [`MpiError::Broken`], [`MpiError::Finalized`], [`MpiError::WrongThread`] without any
    /// MPI call.
    pub fn mpi_all_gather(&mut self, payload: &[u8]) -> Result<Vec<Vec<u8>>, MpiError> {
        self.ready()?;
        self.round += 1;

        // Every rank's length. The buffers are owned here, so that they can be leaked if the
        // collective never completes (MPI may write into them at any later time).
        let mut lengths = Buffers {
            send: vec![payload.len() as u64],
            recv: vec![0u64; self.size],
            counts: Vec::new(),
            displs: Vec::new(),
        };
        let deadline = Instant::now() + self.timeout;
        let done = mpi::request::scope(|scope| {
            let request = self.comm.immediate_all_gather_into(
                scope,
                &lengths.send[..],
                &mut lengths.recv[..],
            );
            finish(request, deadline)
        });
        if !done {
            std::mem::forget(lengths);
            return Err(self.timed_out(LENGTHS));
        }
        let lens = lengths.recv;
        // Every rank has the same lengths, so every rank fails alike, and no collective is left
        // pending.
        if let Some((rank, &len)) = lens.iter().enumerate().find(|(_, l)| **l > MAX_BYTES) {
            return Err(MpiError::TooLarge {
                what: format!("from rank {rank}"),
                len,
                max: MAX_BYTES,
            });
        }
        let total: u64 = lens.iter().sum();
        if total > MAX_BYTES {
            return Err(MpiError::TooLarge {
                what: "in total".into(),
                len: total,
                max: MAX_BYTES,
            });
        }

        // The payloads. Both checks above keep every count and displacement within `Count`.
        let counts: Vec<Count> = lens.iter().map(|&l| l as Count).collect();
        let displs: Vec<Count> = counts
            .iter()
            .scan(0, |next, &c| {
                let at = *next;
                *next += c;
                Some(at)
            })
            .collect();
        let mut payloads = Buffers {
            send: payload.to_vec(),
            recv: vec![0u8; total as usize],
            counts,
            displs,
        };
        let deadline = Instant::now() + self.timeout;
        let done = {
            let Buffers {
                send,
                recv,
                counts,
                displs,
            } = &mut payloads;
            let mut partition = PartitionMut::new(&mut recv[..], &counts[..], &displs[..]);
            mpi::request::scope(|scope| {
                let request =
                    self.comm
                        .immediate_all_gather_varcount_into(scope, &send[..], &mut partition);
                finish(request, deadline)
            })
        };
        if !done {
            std::mem::forget(payloads);
            return Err(self.timed_out(PAYLOADS));
        }
        let mut rest = &payloads.recv[..];
        Ok(lens
            .iter()
            .map(|&len| {
                let (one, after) = rest.split_at(len as usize);
                rest = after;
                one.to_vec()
            })
            .collect())
    }

    /// [`Rendezvous::barrier`] with this crate's error.
    ///
    /// # Errors
    ///
    /// As [`MpiRendezvous::mpi_all_gather`], but never [`MpiError::TooLarge`].
    pub fn mpi_barrier(&mut self) -> Result<(), MpiError> {
        self.ready()?;
        self.round += 1;
        let deadline = Instant::now() + self.timeout;
        match wait_until(self.comm.immediate_barrier(), deadline) {
            Ok(()) => Ok(()),
            Err(pending) => {
                // A barrier has no buffers; the request is left to MPI.
                std::mem::forget(pending);
                Err(self.timed_out(BARRIER))
            }
        }
    }

    /// Fails, without any MPI call, if the rendezvous cannot be used now.
    fn ready(&self) -> Result<(), MpiError> {
        if let Some((op, round)) = self.broken {
            return Err(MpiError::Broken { op, round });
        }
        if mpi::is_finalized() {
            return Err(MpiError::Finalized);
        }
        if !self.on_allowed_thread() {
            return Err(MpiError::WrongThread {
                level: self.thread_support,
            });
        }
        Ok(())
    }

    /// Whether MPI may be called from the current thread.
    fn on_allowed_thread(&self) -> bool {
        self.thread_support >= Threading::Serialized || std::thread::current().id() == self.creator
    }

    /// Marks the rendezvous (and the process) as broken by a timeout in `op`.
    fn timed_out(&mut self, op: &'static str) -> MpiError {
        self.broken = Some((op, self.round));
        lifetime::lock().poison(op, self.round);
        MpiError::Timeout {
            op,
            round: self.round,
            size: self.size,
            timeout: self.timeout,
        }
    }
}

impl Drop for MpiRendezvous {
    /// Frees the communicator, and finalises MPI if this is the last rendezvous and atlasboost
    /// initialised it. Under Open MPI, `MPI_Finalize` waits until every rank finalises.
    ///
    /// After a timeout nothing is freed or finalised (`MPI_Finalize` would wait for the missing
    /// rank, maybe forever): the process should end the job ([`MpiRendezvous::abort`], or exit;
    /// `mpirun` then reports that this rank exited without finalising, and ends the job).
    fn drop(&mut self) {
        let mut life = lifetime::lock();
        let comm = std::mem::replace(&mut self.comm, SimpleCommunicator::world());
        let allowed = self.on_allowed_thread();
        if self.broken.is_none() && allowed && !mpi::is_finalized() {
            drop(comm);
        } else {
            // A collective may be pending on it, MPI may be gone, or MPI may not be called from
            // this thread: the handle is left alone.
            std::mem::forget(comm);
        }
        life.release(allowed);
    }
}

impl Rendezvous for MpiRendezvous {
    fn index(&self) -> usize {
        self.index
    }

    fn size(&self) -> usize {
        self.size
    }

    fn all_gather(&mut self, payload: &[u8]) -> atlasboost_core::Result<Vec<Vec<u8>>> {
        self.mpi_all_gather(payload).map_err(Error::from)
    }

    fn barrier(&mut self) -> atlasboost_core::Result<()> {
        self.mpi_barrier().map_err(Error::from)
    }
}

/// The buffers of one nonblocking collective, owned so that they can be leaked as a whole.
struct Buffers<S, R> {
    send: Vec<S>,
    recv: Vec<R>,
    counts: Vec<Count>,
    displs: Vec<Count>,
}

/// Tests `request` until it completes (`Ok`) or `deadline` passes (`Err` with the request,
/// still pending): polls at once at first, then sleeps between polls, up to [`MAX_PAUSE`].
fn wait_until<'a, D: ?Sized, S: Scope<'a>>(
    mut request: Request<'a, D, S>,
    deadline: Instant,
) -> Result<(), Request<'a, D, S>> {
    let mut polls = 0u32;
    let mut pause = Duration::from_micros(10);
    loop {
        match request.test() {
            Ok(_status) => return Ok(()),
            Err(pending) => request = pending,
        }
        if Instant::now() >= deadline {
            return Err(request);
        }
        if polls < SPINS {
            polls += 1;
            std::thread::yield_now();
        } else {
            std::thread::sleep(pause);
            pause = (pause * 2).min(MAX_PAUSE);
        }
    }
}

/// [`wait_until`] for a request registered with a local scope: on timeout the request is taken
/// out of the scope (which would otherwise abort the process when it ends) and `false` is
/// returned; the caller must then leak every buffer of the collective.
fn finish<'a, D: ?Sized, S: Scope<'a>>(request: Request<'a, D, S>, deadline: Instant) -> bool {
    match wait_until(request, deadline) {
        Ok(()) => true,
        Err(pending) => {
            // SAFETY: `into_raw` asks that the request complete while its buffers live. MPI
            // cannot cancel a collective, so instead every caller leaks the buffers (send,
            // receive, counts, displacements) with `mem::forget` right after a `false`, and
            // never touches them again: whatever MPI writes later lands in memory nobody else
            // owns. The raw request is dropped (freeing a pending collective request is
            // erroneous); the rendezvous is marked broken, so its communicator is never used or
            // freed again.
            let _ = unsafe { pending.into_raw() };
            false
        }
    }
}

/// A rank or size from MPI (never negative) as a `usize`.
fn rank_to_usize(r: mpi::Rank) -> usize {
    usize::try_from(r).unwrap_or(0)
}
