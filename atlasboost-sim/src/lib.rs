//! Simulated Ascend hardware for tests and for trying atlasboost without an NPU.
//!
//! - [`SimProbe`]: N devices per host with deterministic, distinct RoCE IPs and injectable
//!   faults (a device without IP, an unhealthy device, a duplicate IP, a failing probe).
//! - [`InProcessGroup`]: a [`atlasboost_core::Rendezvous`] whose participants are threads of
//!   one process, used by the core conformance suite and by tests.
//!
//! ```
//! use atlasboost_core::DeviceProbe;
//! use atlasboost_sim::{SimProbe, parse_faults};
//!
//! let probe = SimProbe::new("10.0.0.1", 8).with_faults(parse_faults("no-ip:3")?);
//! let devices = probe.probe()?;
//! assert_eq!(devices.len(), 8);
//! assert_eq!(devices[3].ip, None);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Nothing here is ever chosen implicitly: a caller asks for simulated devices by name.
#![deny(missing_docs)]

mod probe;
mod rendezvous;

use std::time::Duration;

pub use probe::{HostFault, SimFault, SimProbe, parse_faults};
pub use rendezvous::{InProcessGroup, InProcessRendezvous};

/// Errors of the simulated backends.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// A fault in a fault list is malformed.
    #[error("bad simulated fault {fault:?}: {reason}")]
    BadFault {
        /// The element as written.
        fault: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A fault names a device the simulated host does not have.
    #[error(
        "simulated fault names device {physical_id}, but there is no device {physical_id} (the host has {count})"
    )]
    NoSuchDevice {
        /// The device named.
        physical_id: u32,
        /// How many devices the host has.
        count: u32,
    },
    /// The device count is outside 1..=255.
    #[error("{0} simulated devices per host: expected 1 to 255")]
    BadCount(u32),
    /// A fault asked the probe to fail.
    #[error("{0}")]
    Injected(String),
    /// An in-process round did not complete in time.
    #[error("timed out after {after:?} waiting for participants {missing:?}")]
    Timeout {
        /// The timeout.
        after: Duration,
        /// Who had not arrived.
        missing: Vec<usize>,
    },
    /// A participant went away while others still needed it.
    #[error("participant {index} left the group")]
    Left {
        /// The participant.
        index: usize,
    },
}
