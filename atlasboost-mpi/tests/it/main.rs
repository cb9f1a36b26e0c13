//! Integration tests of the MPI rendezvous under a real `mpirun -np 4` (Open MPI), one host.
//!
//! Each test starts `mpirun` on this binary, filtered to itself (see `harness`); the ranks
//! print what they saw, and the outer test checks it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod failures;
mod harness;
mod rendezvous;
