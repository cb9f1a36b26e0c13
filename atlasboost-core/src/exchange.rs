//! One host's part in agreeing on the cluster table: probe, gather over a rendezvous, build.

use serde::{Deserialize, Serialize};

use crate::device::{Device, DeviceProbe};
use crate::error::{Error, Result};
use crate::ranktable::{BuildOptions, RankTable, build_table};
use crate::rendezvous::Rendezvous;

/// What one host tells the others: its devices, or why it has none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HostReport {
    /// The host's devices (already restricted to the ones the job uses).
    Devices(Vec<Device>),
    /// The host's probe failed; the message says why.
    ProbeFailed {
        /// The host.
        server_id: String,
        /// The probe's error, with its causes.
        message: String,
    },
}

/// Probes this host, gathers every host's report and builds the cluster table.
///
/// A host whose probe fails still takes part in the gather, so every participant fails with
/// the same error naming that host instead of waiting for it. `select` restricts the probed
/// devices (e.g. `--devices`); its error is reported like a probe failure.
///
/// # Errors
///
/// [`Error::RemoteProbe`] naming the first host whose probe failed (this one included),
/// [`Error::BadPayload`] if a participant sent something that is not a report, the
/// rendezvous's own errors, and the builder's.
pub fn gather_cluster_table(
    rdv: &mut dyn Rendezvous,
    probe: &dyn DeviceProbe,
    host: &str,
    select: &dyn Fn(Vec<Device>) -> Result<Vec<Device>>,
    opts: &BuildOptions,
) -> Result<RankTable> {
    let report = match probe.probe().and_then(select) {
        Ok(devices) => HostReport::Devices(devices),
        Err(e) => HostReport::ProbeFailed {
            server_id: host.to_string(),
            message: error_chain(&e),
        },
    };
    let payload = serde_json::to_vec(&report).map_err(|source| Error::BadPayload {
        participant: rdv.index(),
        source,
    })?;
    let gathered = rdv.all_gather(&payload)?;
    let mut devices = Vec::new();
    for (participant, bytes) in gathered.iter().enumerate() {
        let report: HostReport =
            serde_json::from_slice(bytes).map_err(|source| Error::BadPayload {
                participant,
                source,
            })?;
        match report {
            HostReport::Devices(d) => devices.extend(d),
            HostReport::ProbeFailed { server_id, message } => {
                return Err(Error::RemoteProbe { server_id, message });
            }
        }
    }
    build_table(&devices, opts)
}

/// An error and its causes on one line, for sending to other hosts.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
