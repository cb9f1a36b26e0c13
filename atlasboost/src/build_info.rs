//! What this build of atlasboost has. `atlasboost --version`, the Python package's
//! `build_info()` and the C ABI's `atlasboost_build_info()` all tell it from here, so a user
//! can see whether `pip install` found an MPI to build against.

/// Whether library mode's rendezvous over MPI is built in (the `mpi` feature).
pub const MPI: bool = cfg!(feature = "mpi");

/// The version and what is built in, as `--version` prints it after the name.
pub const VERSION: &str = if MPI {
    concat!(env!("CARGO_PKG_VERSION"), " (MPI support: yes)")
} else {
    concat!(env!("CARGO_PKG_VERSION"), " (MPI support: no)")
};

/// The MPI library this build runs against, as the library names itself (`Open MPI v4.1.4,
/// ...`); `None` without MPI support.
pub fn mpi_library() -> Option<String> {
    #[cfg(feature = "mpi")]
    {
        atlasboost_mpi::library_version()
    }
    #[cfg(not(feature = "mpi"))]
    {
        None
    }
}
