//! ZeroMQ rendezvous for atlasboost: how hosts (in a launch) or processes (in library mode)
//! agree on one cluster table without MPI.
//!
//! A [`Coordinator`] binds a ROUTER socket (port 0: any free port) and waits for `world`
//! participants; each [`ZmqRendezvous`] connects a DEALER socket and implements
//! [`atlasboost_core::Rendezvous`]. A round completes when every participant has contributed:
//! the coordinator answers everyone at once, or tells everyone why the round failed (a
//! participant missing at the timeout, two claiming one index, a world size that disagrees).
//! Every frame in both directions is signed with the job's [`Secret`] (HMAC-SHA256, checked in
//! constant time); frames that are not are dropped, counted and logged, and the rendezvous goes
//! on for the honest participants.
//!
//! ```
//! use std::time::Duration;
//! use atlasboost_core::Rendezvous;
//! use atlasboost_tcp::{Coordinator, CoordinatorConfig, ParticipantConfig, Secret, ZmqRendezvous};
//!
//! let secret = Secret::random()?;
//! let timeout = Duration::from_secs(10);
//! let coordinator = Coordinator::start(CoordinatorConfig::new(
//!     "tcp://127.0.0.1:0", 2, "job-1", secret.clone(), timeout,
//! ))?;
//! let endpoint = coordinator.endpoint().to_string();
//! let threads: Vec<_> = (0..2)
//!     .map(|i| {
//!         let config = ParticipantConfig::new(&endpoint, i, 2, "job-1", secret.clone(), timeout);
//!         std::thread::spawn(move || -> atlasboost_core::Result<Vec<Vec<u8>>> {
//!             let mut rdv = ZmqRendezvous::connect(config)?;
//!             rdv.all_gather(format!("host {i}").as_bytes())
//!         })
//!     })
//!     .collect();
//! for t in threads {
//!     assert_eq!(t.join().unwrap()?, vec![b"host 0".to_vec(), b"host 1".to_vec()]);
//! }
//! assert_eq!(coordinator.finish().rounds, 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! It does not start processes, pick addresses for remote hosts, or retry a failed round: a
//! failed rendezvous fails the job, with the reason.
#![deny(missing_docs)]

mod coordinator;
mod participant;
mod shared;
mod waiting;
pub mod wire;

use std::time::Duration;

pub use coordinator::{Combiner, Coordinator, CoordinatorConfig, Replies, Report};
pub use participant::{ParticipantConfig, ZmqRendezvous};
pub use waiting::{WaitHooks, set_wait_hooks};
pub use wire::Secret;
/// A ZeroMQ context, for [`ZmqRendezvous::connect_in`] (many participants in one process).
pub use zmq::Context;

/// The index a coordinator's frame carries when it is for every participant.
pub const BROADCAST: u32 = u32::MAX;

/// The default size limit of one frame: 64 MiB, a 32,768-rank table with room to spare.
pub const DEFAULT_MAX_MESSAGE: usize = 64 << 20;

/// Errors of the ZeroMQ rendezvous.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TcpError {
    /// A ZeroMQ call failed.
    #[error("cannot {op}")]
    Zmq {
        /// What was being done.
        op: String,
        /// ZeroMQ's error.
        #[source]
        source: zmq::Error,
    },
    /// The coordinator reported that the rendezvous failed; the text says why.
    #[error("{0}")]
    Failed(String),
    /// No answer from the coordinator in time.
    #[error("no answer from the coordinator at {endpoint} within {after:?} (round {round})")]
    NoAnswer {
        /// The coordinator's address.
        endpoint: String,
        /// The round waited for.
        round: u64,
        /// The timeout.
        after: Duration,
    },
    /// The coordinator's answer is not an all-gather result.
    #[error("the coordinator's answer in round {round} is not one payload per participant")]
    BadAnswer {
        /// The round.
        round: u64,
    },
    /// A configuration that cannot work.
    #[error("{0}")]
    Config(String),
}

impl TcpError {
    /// Whether the same operation could succeed later (a timeout; not a clash or a bad answer).
    pub fn is_temporary(&self) -> bool {
        match self {
            TcpError::NoAnswer { .. } => true,
            TcpError::Failed(why) => why.starts_with("timed out"),
            _ => false,
        }
    }
}

impl From<TcpError> for atlasboost_core::Error {
    fn from(e: TcpError) -> Self {
        atlasboost_core::Error::Rendezvous {
            backend: "zmq".into(),
            temporary: e.is_temporary(),
            source: Box::new(e),
        }
    }
}

/// Wraps a ZeroMQ error with what was being done.
fn zmq_err(op: &str) -> impl FnOnce(zmq::Error) -> TcpError + '_ {
    move |source| TcpError::Zmq {
        op: op.to_string(),
        source,
    }
}

/// Whether a ZeroMQ TCP endpoint names an IPv6 address (`tcp://[::1]:PORT`); only those
/// get ZeroMQ's IPv6 switch, which would otherwise map IPv4 peers to `::ffff:a.b.c.d`.
fn is_ipv6_endpoint(endpoint: &str) -> bool {
    endpoint.starts_with("tcp://[")
}

#[cfg(test)]
mod tests {
    use super::is_ipv6_endpoint;

    #[test]
    fn only_bracketed_addresses_are_ipv6_endpoints() {
        assert!(is_ipv6_endpoint("tcp://[::1]:29500"));
        assert!(is_ipv6_endpoint("tcp://[::]:0"));
        assert!(!is_ipv6_endpoint("tcp://127.0.0.1:29500"));
        assert!(!is_ipv6_endpoint("tcp://*:0"));
        assert!(!is_ipv6_endpoint("tcp://host-a:29500"));
    }
}
