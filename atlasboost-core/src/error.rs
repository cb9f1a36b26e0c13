//! The one error type of `atlasboost-core`.

use std::path::PathBuf;

use crate::ranktable::Violation;

/// A boxed error from a backend (a probe or a rendezvous implementation), kept as the `source`.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong in the core model, with the context needed to act on it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A device probe could not list the devices of a host.
    #[error("{probe} probe failed on host {server_id}")]
    Probe {
        /// Which probe (`sim`, `dsmi`, `hccn`).
        probe: String,
        /// The host being probed.
        server_id: String,
        /// What the backend reported.
        #[source]
        source: BoxError,
    },

    /// Another host reported that its probe failed, so no cluster table can be built.
    #[error("host {server_id} could not list its devices: {message}")]
    RemoteProbe {
        /// The host whose probe failed.
        server_id: String,
        /// The error text that host reported.
        message: String,
    },

    /// The rendezvous backend failed (timeout, lost peer, protocol error).
    #[error("rendezvous failed ({backend})")]
    Rendezvous {
        /// Which backend (`in-process`, `zmq`, `mpi`).
        backend: String,
        /// Whether retrying the same operation could succeed.
        temporary: bool,
        /// What the backend reported.
        #[source]
        source: BoxError,
    },

    /// A rendezvous participant sent a payload that could not be understood.
    #[error("rendezvous participant {participant} sent an unreadable payload")]
    BadPayload {
        /// The index of the participant in the rendezvous.
        participant: usize,
        /// Why it could not be decoded.
        #[source]
        source: serde_json::Error,
    },

    /// The devices gathered from the hosts cannot form a rank table.
    #[error("cannot build a rank table: {0}")]
    Build(String),

    /// Devices that report themselves unusable (unhealthy, unreadable) were to be in the
    /// table: a device's trouble, not the table's. Each is named, with its health.
    #[error(
        "cannot build a rank table: {0}; leave it out with --devices (in library mode, hide it \
         with ASCEND_RT_VISIBLE_DEVICES)"
    )]
    Unusable(String),

    /// A rank table breaks one or more rules; every violation is listed.
    #[error("{} is not a valid rank table ({} problem{}):{}", origin, violations.len(), plural(violations.len()), list(violations))]
    Invalid {
        /// Where the table came from (a file name, or "the built table").
        origin: String,
        /// Every rule the table breaks, with JSON paths.
        violations: Vec<Violation>,
    },

    /// A file is not JSON at all.
    #[error("{} is not valid JSON", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// The parser's error, which carries line and column.
        #[source]
        source: serde_json::Error,
    },

    /// A file starts with a UTF-8 byte-order mark (an editor's), which JSON does not allow.
    #[error("{} starts with a UTF-8 byte-order mark (EF BB BF), which is not JSON; save it without one", path.display())]
    ByteOrderMark {
        /// The file.
        path: PathBuf,
    },

    /// Merging rank tables found the same server or device IP in two inputs.
    #[error("cannot merge: {what} {value:?} appears in both {first} and {second}")]
    MergeConflict {
        /// `server_id` or `device_ip`.
        what: &'static str,
        /// The duplicated value.
        value: String,
        /// The first input that has it.
        first: String,
        /// The second input that has it.
        second: String,
    },

    /// Merge inputs of formats that cannot be merged.
    #[error("cannot merge: {0}")]
    Merge(String),

    /// Reading or writing a file failed.
    #[error("{action} {}", path.display())]
    Io {
        /// What was being done (`cannot read`, `cannot write`, ...).
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// A rank-table path HCCL would refuse.
    #[error("rank table path {}: {reason}", path.display())]
    BadPath {
        /// The path.
        path: PathBuf,
        /// Why it is refused.
        reason: String,
    },

    /// A value given by a user (a flag, a variable) is malformed.
    #[error("invalid {what} {value:?}: {reason}")]
    InvalidValue {
        /// What the value is (`device list`, `format`, a variable name, ...).
        what: String,
        /// The value as given.
        value: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A launcher's variables are partly set, malformed or contradict each other.
    #[error("{0}")]
    LaunchEnv(String),

    /// A worker's device is not in the rank table it is given.
    #[error("device with physical id {physical_id} of server {server_id} is not in the rank table")]
    NotInTable {
        /// The worker's server.
        server_id: String,
        /// The worker's device.
        physical_id: u32,
    },
}

impl Error {
    /// Whether trying the same operation again could succeed (a timeout, a transient driver error).
    pub fn is_temporary(&self) -> bool {
        match self {
            Error::Rendezvous { temporary, .. } => *temporary,
            Error::Io { source, .. } => matches!(
                source.kind(),
                std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock
            ),
            _ => false,
        }
    }

    /// Builds [`Error::InvalidValue`].
    pub fn invalid_value(
        what: impl Into<String>,
        value: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        Error::InvalidValue {
            what: what.into(),
            value: value.into(),
            reason: reason.into(),
        }
    }
}

/// Parses one of a fixed set of names (`--chip`, `--format`, `--framework`), ignoring case; the
/// error lists every accepted name.
pub(crate) fn parse_name<T: Copy>(
    all: &[T],
    name: impl Fn(T) -> &'static str,
    what: &str,
    s: &str,
) -> Result<T> {
    all.iter()
        .copied()
        .find(|v| name(*v).eq_ignore_ascii_case(s))
        .ok_or_else(|| {
            let names: Vec<&str> = all.iter().map(|v| name(*v)).collect();
            Error::invalid_value(what, s, format!("expected one of {}", names.join(", ")))
        })
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn list(violations: &[Violation]) -> String {
    violations
        .iter()
        .map(|v| format!("\n  {v}"))
        .collect::<String>()
}

/// Result with the core [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
