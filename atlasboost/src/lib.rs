//! atlasboost as a library: what a worker process embeds, with no command line in it.
//!
//! - [`init`]: library mode (SPEC §10) — `init()` inside a worker, whatever started it
//!   (`atlasboost run`, `mpirun`, torchrun, `srun`, or nothing), its process-wide
//!   [`init::session`] for the bindings, and [`init::InitError`].
//! - [`settings`]: resolved settings ([`settings::Discovery`], durations), each knowing
//!   whether the user gave it as a flag or a variable, so messages name what the user set.
//! - [`probe`]: the device probe those settings ask for (DSMI, hccn.conf, simulated).
//! - [`host`]: facts about this host — its `server_id` (one rule for the launcher and library
//!   mode), a free port.
//! - [`progress`]: what a worker tells its launcher beside its output: heartbeats for the hang
//!   watchdog, the record of its failure.
//! - [`process`]: what `/proc` says of this host's processes.
//! - [`cores`]: CPU binding of a host's workers (`--bind-cores`, `ATLASBOOST_BIND_CORES`).
//! - [`build_info`]: what this build has (MPI support).
//!
//! The Python package (`bindings/python`) and the C ABI (`bindings/c`) are thin layers over
//! this crate; the `atlasboost` command (`atlasboost-cli`) builds its launcher on it. The model
//! itself (devices, rank tables, worker environments) is `atlasboost-core`, re-exported here.
#![deny(missing_docs)]

pub mod build_info;
pub mod cores;
pub mod host;
pub mod init;
pub mod probe;
pub mod process;
pub mod progress;
pub mod settings;

pub use atlasboost_core::launch_context::Launcher;
pub use atlasboost_core::ranktable::RankTable;
pub use atlasboost_core::worker_env::Framework;
pub use atlasboost_core::{Chip, Device, EnvVars, Health, World};
