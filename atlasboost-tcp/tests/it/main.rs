//! Integration tests of the ZeroMQ rendezvous, on loopback with real sockets, in one binary.
//!
//! Every wait is bounded: coordinators and participants have timeouts of a few seconds, and
//! threads and child processes are joined with a bound, so a bug fails a test instead of
//! hanging CI.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod conformance;
mod errors;
mod hostile;
mod processes;
mod rendezvous;
