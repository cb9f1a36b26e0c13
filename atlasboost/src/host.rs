//! Facts about this host: its `server_id` (one rule for the launcher and library mode), its
//! primary IPv4 address, and a port free on it.

use std::net::{IpAddr, Ipv4Addr, TcpListener, ToSocketAddrs};

use nix::ifaddrs::getifaddrs;
use nix::net::if_::InterfaceFlags;

use crate::settings::{Origin, Setting};

/// This host's primary IPv4 address: what its host name resolves to (as `hccl_tools.py` does),
/// unless that is a loopback address, else the first non-loopback IPv4 address of an interface
/// that is up.
///
/// # Errors
///
/// [`HostError::NoIpv4`] saying what was tried, when neither gives a non-loopback IPv4
/// address.
pub fn primary_ipv4() -> Result<Ipv4Addr, HostError> {
    let hostname = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok());
    if let Some(name) = &hostname
        && let Ok(addrs) = (name.as_str(), 0).to_socket_addrs()
    {
        for a in addrs {
            if let IpAddr::V4(ip) = a.ip()
                && !ip.is_loopback()
                && !ip.is_unspecified()
            {
                return Ok(ip);
            }
        }
    }
    if let Ok(ifaces) = getifaddrs() {
        for iface in ifaces {
            let up = iface.flags.contains(InterfaceFlags::IFF_UP);
            let lo = iface.flags.contains(InterfaceFlags::IFF_LOOPBACK);
            if let Some(ip) = iface
                .address
                .and_then(|a| a.as_sockaddr_in().map(|s| s.ip()))
                && up
                && !lo
                && !ip.is_loopback()
            {
                return Ok(ip);
            }
        }
    }
    Err(HostError::NoIpv4 { hostname })
}

/// Why this host has no `server_id`.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// No IPv4 address to name it by.
    #[error("cannot find this host's IPv4 address: host name {} resolves to no non-loopback IPv4 \
             address and no interface that is up has one", hostname.as_deref().map_or("(unknown)".to_string(), |h| format!("{h:?}")))]
    NoIpv4 {
        /// Its host name, if it has one.
        hostname: Option<String>,
    },
}

/// This host's `server_id`, by the one rule of the launcher and library mode: `given` (the
/// `--server-id` flag or `ATLASBOOST_SERVER_ID`), else its primary IPv4 address; none is an
/// error saying to set one (never a silent `127.0.0.1`).
///
/// # Errors
///
/// [`HostError::NoIpv4`], whose message the caller completes with how to set it
/// ([`server_id_hint`]).
pub fn server_id(given: Option<&str>) -> Result<String, HostError> {
    match given {
        Some(id) => Ok(id.to_string()),
        None => primary_ipv4().map(|ip| ip.to_string()),
    }
}

/// What to do when this host has no address: `; pass --server-id`, `; set ATLASBOOST_SERVER_ID`.
#[must_use]
pub fn server_id_hint(origin: Origin) -> String {
    format!("; {} {}", origin.verb(), origin.name(Setting::ServerId))
}

/// A port nobody listens on right now on `addr` (the kernel's pick), for `MASTER_PORT`; 0 if
/// none.
#[must_use]
pub fn free_port(addr: &str) -> u16 {
    TcpListener::bind((addr, 0))
        .or_else(|_| TcpListener::bind(("0.0.0.0", 0)))
        .and_then(|l| l.local_addr())
        .map_or(0, |a| a.port())
}
