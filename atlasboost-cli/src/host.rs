//! Facts about this host: its primary IPv4 address (the default `server_id`).

use std::net::{IpAddr, Ipv4Addr, ToSocketAddrs};

use nix::ifaddrs::getifaddrs;
use nix::net::if_::InterfaceFlags;

/// This host's primary IPv4 address: what its host name resolves to (as `hccl_tools.py` does),
/// unless that is a loopback address, else the first non-loopback IPv4 address of an interface
/// that is up.
///
/// # Errors
///
/// A message saying what was tried, when neither gives a non-loopback IPv4 address.
pub fn primary_ipv4() -> Result<Ipv4Addr, String> {
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
    Err(format!(
        "cannot find this host's IPv4 address: host name {} resolves to no non-loopback IPv4 \
         address and no interface that is up has one; pass --server-id",
        hostname
            .as_deref()
            .map_or("(unknown)".to_string(), |h| format!("{h:?}"))
    ))
}
