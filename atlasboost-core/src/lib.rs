//! The core of atlasboost: the model of an Ascend training job and the seams its backends plug into.
//!
//! - [`Device`] and the [`DeviceProbe`] trait: what NPUs a host has (backends: `atlasboost-sim`
//!   for simulated devices, `atlasboost-dsmi` for the DSMI driver and `/etc/hccn.conf`).
//! - The [`Rendezvous`] trait: how hosts or processes exchange bytes (backends: in-process
//!   threads in `atlasboost-sim`, ZeroMQ, MPI), and [`exchange::gather_cluster_table`], the
//!   round in which every host learns the whole cluster.
//! - [`ranktable`]: the HCCL rank-table formats (`1.0`, `1.2`, legacy), the builder, the
//!   validator that reports every violation with its JSON path, merge, and the atomic writer.
//! - [`worker_env`]: the variables each worker gets, as a pure function.
//! - [`launch_context`]: how a worker was started (atlasboost, Open MPI, MPICH, Slurm,
//!   torchrun), read from its environment.
//! - [`ranktable::TableLock`]: one running job per rank-table path and host.
//! - [`slurm`]: Slurm's host lists and task counts per node, as its job environment writes them.
//!
//! ```
//! use std::net::IpAddr;
//! use atlasboost_core::{Device, Health, ranktable::{build_table, BuildOptions}};
//!
//! let devices: Vec<Device> = (0..8)
//!     .map(|p| Device {
//!         server_id: "10.0.0.1".into(),
//!         logical_id: p,
//!         physical_id: p,
//!         ip: Some(IpAddr::from([192, 168, 100, 101 + p as u8])),
//!         chip: "910".into(),
//!         health: Health::Healthy,
//!         super_device_id: None,
//!         super_pod_id: None,
//!     })
//!     .collect();
//! let table = build_table(&devices, &BuildOptions::default())?;
//! assert_eq!(table.rank_count(), 8);
//! assert!(table.to_json_pretty().contains("\"rank_id\": \"7\""));
//! # Ok::<(), atlasboost_core::Error>(())
//! ```
//!
//! This crate knows no backend: it never loads a driver, opens a socket or starts a process
//! (it does read and write files: tables, and the lock beside a table).
#![deny(missing_docs)]

pub mod compact;
#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
mod device;
pub mod env_vars;
mod error;
pub mod exchange;
pub mod launch_context;
pub mod ranktable;
mod rendezvous;
pub mod slurm;
pub mod telemetry;
pub mod time;
pub mod worker_env;
mod world;

pub use device::{
    Chip, Device, DeviceList, DeviceProbe, DriverCall, Health, device_ip_problem,
    dsmi_code_meaning, parse_id_list, select_devices,
};
pub use env_vars::EnvVars;
pub use error::{BoxError, Error, Result};
pub use rendezvous::Rendezvous;
pub use telemetry::{DeviceSample, Telemetry};
pub use world::World;

/// This host's name, as `hostname` prints it (`?` when it cannot be read as UTF-8).
#[must_use]
pub fn host_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "?".into())
}
