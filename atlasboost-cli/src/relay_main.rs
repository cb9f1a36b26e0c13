//! The `atlasboost-relay` program: `atlasboost relay -- COMMAND`, the relay mpirun starts as
//! every rank of `atlasboost run --mpi`, as a program of its own. Linked statically
//! (`scripts/build-static-relay.sh`) it starts without the dynamic loader, which every rank's
//! launch waits for: about a third less time than the whole `atlasboost` executable takes
//! (docs/PERFORMANCE.md).

fn main() -> std::process::ExitCode {
    atlasboost_cli::relay_entry()
}
