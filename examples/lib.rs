//! Runnable examples of atlasboost. The Rust one is an example target:
//!
//! - `init-worker` (`init_worker.rs`): a native worker that calls `init()` and prints its rank,
//!   device and rank table. `cargo build -p atlasboost-examples --examples` builds it into
//!   `target/debug/examples/init-worker` (`--features mpi` for the rendezvous over MPI).
//!
//! The others are scripts: `train.py` (a Python worker that logs a fake loss) and `worker.sh`.
#![deny(missing_docs)]
