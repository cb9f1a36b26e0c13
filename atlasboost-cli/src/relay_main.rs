//! The `atlasboost-relay` program: `atlasboost relay -- COMMAND`, the relay mpirun starts as
//! every rank of `atlasboost run --mpi`, as a program of its own. Linked statically
//! (`scripts/build-static-relay.sh`) it starts without the dynamic loader, which every rank's
//! launch waits for: about a third less time than the whole `atlasboost` executable takes
//! (docs/PERFORMANCE.md).
//!
//! Its `main` is the C library's entry point, not Rust's: Rust's runtime set-up (the main
//! thread's stack guard, read from `/proc/self/maps`, and its overflow handler) was a twentieth
//! of a relay's time, on every rank's path. What of it the relay needs,
//! [`atlasboost_cli::relay_process_main`] does.
#![no_main]

use std::ffi::{c_char, c_int};

/// The program's entry point, called by the C library's start-up code.
#[unsafe(no_mangle)]
extern "C" fn main(_argc: c_int, _argv: *const *const c_char) -> c_int {
    atlasboost_cli::relay_process_main()
}
