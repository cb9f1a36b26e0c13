//! Facts about this host: its `server_id` (one rule for the launcher and library mode), its
//! primary IPv4 address, its network interfaces (`--nic`), and a `MASTER_PORT` free on it.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, TcpListener, ToSocketAddrs};
use std::str::FromStr;

use atlasboost_core::EnvVars;
use nix::ifaddrs::getifaddrs;
use nix::net::if_::InterfaceFlags;

use crate::settings::{Origin, Setting};

/// This host's primary IPv4 address: what its host name resolves to (as `hccl_tools.py` does)
/// when that is the address of an interface that is up and not loopback; else the first IPv4
/// address of an interface that is up, not loopback, and not a container or VM bridge
/// (`docker*`, `virbr*`, `veth*`, `br-*`); else the first of those bridges.
///
/// # Errors
///
/// [`HostError::NoIpv4`] saying what was tried, when neither gives a non-loopback IPv4
/// address.
pub fn primary_ipv4() -> Result<Ipv4Addr, HostError> {
    let hostname = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok());
    let nics = interfaces();
    if let Some(name) = &hostname
        && let Ok(addrs) = (name.as_str(), 0).to_socket_addrs()
    {
        for a in addrs {
            if let IpAddr::V4(ip) = a.ip()
                && !ip.is_loopback()
                && nics.iter().any(|n| n.ipv4 == ip && !n.is_virtual())
            {
                return Ok(ip);
            }
        }
    }
    let usable = |virtual_too: bool| {
        nics.iter()
            .find(|n| !n.ipv4.is_loopback() && (virtual_too || !n.is_virtual()))
            .map(|n| n.ipv4)
    };
    usable(false)
        .or_else(|| usable(true))
        .ok_or(HostError::NoIpv4 { hostname })
}

/// An interface of this host that is up, with an IPv4 address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nic {
    /// Its name (`eth0`).
    pub name: String,
    /// Its address.
    pub ipv4: Ipv4Addr,
    /// The length of its network prefix (24 for a /24).
    pub prefix: u8,
}

impl Nic {
    /// A container or VM bridge (`docker*`, `virbr*`, `veth*`, `br-*`): never a default.
    pub fn is_virtual(&self) -> bool {
        ["docker", "virbr", "veth", "br-"]
            .iter()
            .any(|p| self.name.starts_with(p))
    }

    /// Whether `ip` is on this interface's network.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        in_network(ip, self.ipv4, self.prefix)
    }
}

impl fmt::Display for Nic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}/{}", self.name, self.ipv4, self.prefix)
    }
}

fn in_network(ip: Ipv4Addr, net: Ipv4Addr, prefix: u8) -> bool {
    let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
    u32::from(ip) & mask == u32::from(net) & mask
}

/// Every interface of this host that is up, with an IPv4 address, in the kernel's order.
pub fn interfaces() -> Vec<Nic> {
    let Ok(ifaces) = getifaddrs() else {
        return Vec::new();
    };
    ifaces
        .filter(|i| i.flags.contains(InterfaceFlags::IFF_UP))
        .filter_map(|i| {
            let ipv4 = i.address.and_then(|a| a.as_sockaddr_in().map(|s| s.ip()))?;
            let prefix = i
                .netmask
                .and_then(|m| m.as_sockaddr_in().map(|s| u32::from(s.ip()).count_ones()))
                .unwrap_or(32);
            Some(Nic {
                name: i.interface_name,
                ipv4,
                prefix: prefix as u8,
            })
        })
        .collect()
}

/// `--nic` (`ATLASBOOST_NIC`): an interface by name, or the interface whose address is in an
/// IPv4 network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NicChoice {
    /// `eth0`.
    Name(String),
    /// `10.0.0.0/24`.
    Network {
        /// The network's address.
        net: Ipv4Addr,
        /// Its prefix length.
        prefix: u8,
    },
}

impl FromStr for NicChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<NicChoice, String> {
        let s = s.trim();
        match s.split_once('/') {
            Some((net, prefix)) => {
                let net: Ipv4Addr = net
                    .parse()
                    .map_err(|_| format!("{s:?}: {net:?} is not an IPv4 address"))?;
                let prefix: u8 = prefix
                    .parse()
                    .ok()
                    .filter(|p| *p <= 32)
                    .ok_or_else(|| format!("{s:?}: the prefix length must be 0 to 32"))?;
                Ok(NicChoice::Network { net, prefix })
            }
            None if s.is_empty() => {
                Err("an interface name (eth0) or a network (10.0.0.0/24)".into())
            }
            None => match s.parse::<Ipv4Addr>() {
                // One host's address names no network the other hosts are on.
                Ok(ip) => Err(format!(
                    "{s:?} is one host's address: give the network every host is on \
                     ({}/24, say) or the interface's name",
                    Ipv4Addr::from(u32::from(ip) & 0xffff_ff00)
                )),
                Err(_) if s.contains(char::is_whitespace) => {
                    Err(format!("{s:?}: an interface name has no blanks"))
                }
                Err(_) => Ok(NicChoice::Name(s.to_string())),
            },
        }
    }
}

impl fmt::Display for NicChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NicChoice::Name(n) => f.write_str(n),
            NicChoice::Network { net, prefix } => write!(f, "{net}/{prefix}"),
        }
    }
}

/// The interface `choice` names on this host.
///
/// # Errors
///
/// [`HostError::NoSuchNic`], listing the interfaces there are.
pub fn find_nic(choice: &NicChoice) -> Result<Nic, HostError> {
    let nics = interfaces();
    let found = nics.iter().find(|n| match choice {
        NicChoice::Name(name) => n.name == *name,
        // A network wide enough to hold loopback too (0.0.0.0/0) means a real interface.
        NicChoice::Network { net, prefix } => {
            in_network(n.ipv4, *net, *prefix) && (!n.ipv4.is_loopback() || net.is_loopback())
        }
    });
    found.cloned().ok_or_else(|| HostError::NoSuchNic {
        choice: choice.to_string(),
        have: nics.iter().map(ToString::to_string).collect(),
    })
}

/// The interface a job's frameworks use on this host (gloo, HCCL's own sockets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobNic {
    /// The interface.
    pub nic: Nic,
    /// Named by `--nic` / `ATLASBOOST_NIC` (its variables are set), rather than found by the
    /// server id (set only where the user has none).
    pub explicit: bool,
}

impl JobNic {
    /// The interface `choice` names (`--nic`, `ATLASBOOST_NIC`, as typed), else the one that
    /// holds `server_id`, if any.
    ///
    /// # Errors
    ///
    /// Why `choice` names no interface here: malformed, or not on this host (listing what is).
    pub fn find(choice: Option<&str>, server_id: &str) -> Result<Option<JobNic>, String> {
        match choice {
            Some(text) => {
                let choice: NicChoice = text.parse()?;
                let nic = find_nic(&choice).map_err(|e| e.to_string())?;
                Ok(Some(JobNic {
                    nic,
                    explicit: true,
                }))
            }
            None => Ok(server_id
                .parse()
                .ok()
                .and_then(nic_holding)
                .map(|nic| JobNic {
                    nic,
                    explicit: false,
                })),
        }
    }

    /// `HCCL_IF_IP` (the host's address on it: the server id unless `--nic` named it),
    /// `HCCL_SOCKET_IFNAME` and `GLOO_SOCKET_IFNAME`.
    pub fn vars(&self, server_id: &str) -> [(&'static str, String); 3] {
        let address = match self.explicit {
            true => self.nic.ipv4.to_string(),
            false => server_id.to_string(),
        };
        [
            (EnvVars::HCCL_IF_IP, address),
            (EnvVars::HCCL_SOCKET_IFNAME, self.nic.name.clone()),
            (EnvVars::GLOO_SOCKET_IFNAME, self.nic.name.clone()),
        ]
    }
}

/// The interface that holds `ip` (its address, else the first whose network contains it).
pub fn nic_holding(ip: Ipv4Addr) -> Option<Nic> {
    let nics = interfaces();
    nics.iter()
        .find(|n| n.ipv4 == ip)
        .or_else(|| nics.iter().find(|n| n.contains(ip)))
        .cloned()
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
    /// No interface is what `--nic` names.
    #[error("no interface that is up with an IPv4 address is {choice:?}; this host has: {}", if have.is_empty() { "none".to_string() } else { have.join(", ") })]
    NoSuchNic {
        /// What was asked for.
        choice: String,
        /// The interfaces there are (`eth0 10.0.0.5/24`).
        have: Vec<String>,
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

/// The address this machine sends from toward `target`: the source of its route there (no
/// packet is sent).
///
/// # Errors
///
/// The system's, when no route leads there.
pub fn address_toward(target: IpAddr) -> std::io::Result<IpAddr> {
    let any: IpAddr = match target {
        IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
    };
    let socket = std::net::UdpSocket::bind((any, 0))?;
    socket.connect((target, 9))?;
    Ok(socket.local_addr()?.ip())
}

/// A port for `MASTER_PORT`: one nobody listens on right now on any address, with the next one
/// free too (`init()`'s rendezvous listens at `MASTER_PORT` + 1, on every address); 0 if none
/// is found.
///
/// It is chosen at random below the kernel's ephemeral range
/// (`/proc/sys/net/ipv4/ip_local_port_range`) and below Kubernetes' node ports (30000 and up):
/// the port the kernel picks for a listener on port 0 comes from the ephemeral range, where
/// any connection this host opens before the job binds it may take it (the job's rank 0 then
/// fails with "Address already in use"). Only when no pair is free there is the kernel's pick
/// taken.
#[must_use]
pub fn free_master_port() -> u16 {
    let (first, end) = quiet_ports();
    let mut seed = std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), first) | 1;
    let candidates = (0..64).filter(|_| end > first).map(|_| {
        // xorshift: a different pick each try, from a seed different in every call.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        first + u16::try_from(seed % u64::from(end - first)).unwrap_or(0)
    });
    first_free_pair(candidates)
        .or_else(|| {
            let kernels = (0..16).filter_map(|_| {
                TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0))
                    .and_then(|l| l.local_addr())
                    .ok()
                    .map(|a| a.port())
            });
            first_free_pair(kernels)
        })
        .unwrap_or(0)
}

/// The first ports of the pairs [`free_master_port`] picks from, `first..end`: from 20000, so
/// that both ports of a pair are below the lower of the ephemeral range's start and 30000
/// (empty when the range starts lower).
fn quiet_ports() -> (u16, u16) {
    let ephemeral_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    (20000, ephemeral_start.min(30000).saturating_sub(1))
}

/// The first of `candidates` that is free on every address with the port after it.
fn first_free_pair(candidates: impl IntoIterator<Item = u16>) -> Option<u16> {
    candidates.into_iter().find(|&port| {
        port > 0
            && port < u16::MAX
            && TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).is_ok()
            && TcpListener::bind((Ipv4Addr::UNSPECIFIED, port + 1)).is_ok()
    })
}

#[cfg(test)]
mod nic_tests {
    use super::*;

    #[test]
    fn nic_choices_parse_names_and_networks() {
        assert_eq!("eth0".parse(), Ok(NicChoice::Name("eth0".into())));
        // An address alone names no network: the error says what to give.
        let e = "192.0.2.2".parse::<NicChoice>().unwrap_err();
        assert!(
            e.contains("one host's address") && e.contains("192.0.2.0/24"),
            "{e}"
        );
        assert_eq!(
            "10.0.0.0/24".parse(),
            Ok(NicChoice::Network {
                net: Ipv4Addr::new(10, 0, 0, 0),
                prefix: 24
            })
        );
        assert!(
            "10.0.0/24"
                .parse::<NicChoice>()
                .unwrap_err()
                .contains("10.0.0")
        );
        assert!(
            "10.0.0.0/33"
                .parse::<NicChoice>()
                .unwrap_err()
                .contains("prefix")
        );
        assert!("".parse::<NicChoice>().is_err());
        assert!("eth 0".parse::<NicChoice>().is_err());
    }

    #[test]
    fn bridges_are_virtual_and_networks_contain_their_hosts() {
        let nic = |name: &str| Nic {
            name: name.into(),
            ipv4: Ipv4Addr::new(10, 1, 2, 3),
            prefix: 16,
        };
        for v in ["docker0", "virbr0", "veth12ab", "br-0f3a"] {
            assert!(nic(v).is_virtual(), "{v}");
        }
        assert!(!nic("eth0").is_virtual() && !nic("enp3s0").is_virtual());
        assert!(nic("eth0").contains(Ipv4Addr::new(10, 1, 200, 9)));
        assert!(!nic("eth0").contains(Ipv4Addr::new(10, 2, 0, 1)));
        assert!(in_network(
            Ipv4Addr::new(1, 2, 3, 4),
            Ipv4Addr::UNSPECIFIED,
            0
        ));
    }

    #[test]
    fn loopback_holds_every_127_address() {
        // Every Linux host has lo 127.0.0.1/8.
        let lo = nic_holding(Ipv4Addr::new(127, 0, 0, 2)).unwrap();
        assert_eq!(lo.ipv4, Ipv4Addr::LOCALHOST);
        let e = find_nic(&NicChoice::Name("no-such-nic0".into()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"no-such-nic0\"") && e.contains("127.0.0.1/8"),
            "{e}"
        );
    }

    /// CI failed when rank 0's rendezvous found `MASTER_PORT` + 1 taken: a port is chosen only
    /// with the next one free, and away from the ports connections are given.
    #[test]
    fn a_master_port_has_the_next_port_free_and_is_not_an_ephemeral_one() {
        // A port whose successor is held (on loopback: the rendezvous binds every address),
        // and the one before a held port, are passed over.
        let held = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let held_port = held.local_addr().unwrap().port();
        let before_held = held_port - 1;
        let free_pair = (20000..30000)
            .find(|&p| first_free_pair([p]).is_some())
            .unwrap();
        assert_eq!(
            first_free_pair([held_port, before_held, free_pair]),
            Some(free_pair)
        );
        assert_eq!(first_free_pair([0, u16::MAX]), None);
        let (first, end) = quiet_ports();
        if end <= first {
            eprintln!(
                "skipped the range check: this machine's ephemeral ports start at {}, which \
                 leaves no room below them (the kernel's pick is taken)",
                end + 1
            );
            return;
        }
        for _ in 0..20 {
            let port = free_master_port();
            // Both ports of the pair below the ephemeral range and 30000 (`end` is the last
            // second port).
            assert!((first..end).contains(&port), "{port} not in {first}..{end}");
        }
    }
}
