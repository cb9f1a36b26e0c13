//! The `atlasboost-relay` program: `atlasboost relay -- COMMAND`, the relay mpirun starts as
//! every rank of `atlasboost run --mpi`, as a program of its own. Built statically
//! (`scripts/build-static-relay.sh`) it starts in about a third of the time the whole
//! `atlasboost` executable takes, which every rank's launch waits for (docs/PERFORMANCE.md).

fn main() -> std::process::ExitCode {
    atlasboost_cli::relay_entry()
}
