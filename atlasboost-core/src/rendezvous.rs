//! The rendezvous seam: how participants (hosts in a launch, processes in library mode) agree.

use crate::error::Result;

/// A group of `size()` participants that exchange bytes in rounds.
///
/// Every participant calls the same operations in the same order. An operation either completes
/// for every participant with the same result, or fails for every participant; it never blocks
/// forever (each backend has a timeout, and its error names who was missing).
///
/// Implementations: in-process threads (`atlasboost-sim`), ZeroMQ over TCP (`atlasboost-tcp`),
/// MPI (`atlasboost-mpi`). The conformance suite (feature `conformance`) checks any of them.
pub trait Rendezvous: Send {
    /// This participant's index, `0..size()`.
    fn index(&self) -> usize;

    /// How many participants take part.
    fn size(&self) -> usize;

    /// Sends `payload` and returns every participant's payload, indexed by participant.
    ///
    /// # Errors
    ///
    /// [`crate::Error::Rendezvous`] when a participant is missing, died, or the backend failed.
    fn all_gather(&mut self, payload: &[u8]) -> Result<Vec<Vec<u8>>>;

    /// Returns once every participant has called it.
    ///
    /// # Errors
    ///
    /// [`crate::Error::Rendezvous`] as for [`Rendezvous::all_gather`].
    fn barrier(&mut self) -> Result<()>;
}
