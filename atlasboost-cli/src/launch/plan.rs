//! The plan of a launch: which hosts, how many workers each may run, which of them are this
//! machine (SPEC §5, §6).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, ToSocketAddrs};
use std::path::Path;

use atlasboost_core::Device;

use crate::error::CliError;
use crate::settings::RunSettings;
use atlasboost::host::{NicChoice, find_nic, primary_ipv4};

/// A host as the user wrote it, before it is resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSpec {
    /// The name or address as written.
    pub name: String,
    /// Its slot count, if given.
    pub slots: Option<u32>,
    /// Where it was written, for messages: `-H` or `hosts.txt:3`.
    pub origin: String,
}

/// A host of the launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPlan {
    /// The name as the user wrote it.
    pub name: String,
    /// Its `server_id` in the table: its IPv4 address.
    pub server_id: String,
    /// How many workers it may run; `None`: one per device it has.
    pub slots: Option<u32>,
    /// Whether it is this machine (its agent runs inside the launcher).
    pub local: bool,
}

impl HostPlan {
    /// `127.0.0.2`, or `node1 (10.0.0.1)` when the name is not the address.
    pub fn describe(&self) -> String {
        if self.name == self.server_id {
            self.name.clone()
        } else {
            format!("{} ({})", self.name, self.server_id)
        }
    }
}

/// Parses `-H host[:slots],...`.
///
/// # Errors
///
/// [`CliError::Usage`] naming the element that is not a host or has a bad slot count.
pub fn parse_host_list(list: &str) -> Result<Vec<HostSpec>, CliError> {
    list.split(',')
        .map(|item| {
            let item = item.trim();
            let (name, slots) = match split_slots(item) {
                Some((name, slots)) => (name, Some(slots)),
                None => (item, None),
            };
            host_spec(name, slots, "-H").map_err(|why| CliError::BadHost {
                origin: format!("-H {}", crate::error::brief(list)),
                text: item.to_string(),
                why,
            })
        })
        .collect()
}

/// The most of a file read as a hostfile: a line per host of 100,000 hosts is about 3 MB;
/// the bound is what `/dev/zero` or a stray log costs.
const HOSTFILE_SIZE_LIMIT: u64 = 64 << 20;

/// Reads a hostfile: `host slots=N`, `host:N` or `host` per line; `#` starts a comment.
///
/// # Errors
///
/// [`CliError::BadHost`] naming the file and line of a malformed entry, and
/// [`CliError::Usage`] naming a file that is larger than any hostfile or lists no host (the
/// host list is malformed, as a bad `-H` is: exit 2); [`CliError::Failure`] naming a file
/// that cannot be read (exit 125, as any file's).
pub fn parse_hostfile(path: &Path) -> Result<Vec<HostSpec>, CliError> {
    use std::io::Read;
    let cannot = |e: std::io::Error| {
        CliError::Failure(format!("cannot read hostfile {}: {e}", path.display()))
    };
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .map_err(cannot)?
        .take(HOSTFILE_SIZE_LIMIT + 1)
        .read_to_end(&mut bytes)
        .map_err(cannot)?;
    if bytes.len() as u64 > HOSTFILE_SIZE_LIMIT {
        return Err(CliError::Usage(format!(
            "hostfile {} has more than {} MiB: no list of hosts is so long (is it the right file?)",
            path.display(),
            HOSTFILE_SIZE_LIMIT >> 20
        )));
    }
    let mut hosts = Vec::new();
    // An editor's byte-order mark is not part of the first host's name.
    let bytes = bytes.strip_prefix("\u{feff}".as_bytes()).unwrap_or(&bytes);
    for (n, raw) in bytes.split(|&b| b == b'\n').enumerate() {
        let origin = format!("{}:{}", path.display(), n + 1);
        // A comment may be in any encoding: only what comes before it must be text.
        let raw = raw.split(|&b| b == b'#').next().unwrap_or(raw);
        let Ok(raw) = std::str::from_utf8(raw) else {
            return Err(CliError::BadHost {
                origin,
                text: String::from_utf8_lossy(raw).trim().to_string(),
                why: "is not UTF-8 text".into(),
            });
        };
        let raw = raw.strip_suffix('\r').unwrap_or(raw);
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let bad = |why: String| CliError::BadHost {
            origin: origin.clone(),
            text: line.to_string(),
            why,
        };
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or("");
        let (name, mut slots) = match split_slots(first) {
            Some((name, slots)) => (name, Some(slots)),
            None => (first, None),
        };
        for word in words {
            match word.split_once('=') {
                Some(("slots", n)) if slots.is_none() => slots = Some(n),
                Some(("slots", _)) => return Err(bad("gives the slot count twice".into())),
                // mpirun's hostfiles may cap oversubscription; one worker per NPU has no use
                // for it, and ignoring it silently would be worse.
                _ => {
                    return Err(bad(format!(
                        "has {word:?}; expected `host slots=N`, `host:N` or `host`"
                    )));
                }
            }
        }
        hosts.push(host_spec(name, slots, &origin).map_err(bad)?);
    }
    if hosts.is_empty() {
        return Err(CliError::Usage(format!(
            "hostfile {} lists no host",
            path.display()
        )));
    }
    Ok(hosts)
}

/// `host:slots` split at its colon; an IPv6 address (two colons or more, or in brackets) is
/// left whole, for [`host_spec`] to name.
fn split_slots(entry: &str) -> Option<(&str, &str)> {
    let ipv6 = entry.starts_with('[') || entry.matches(':').count() > 1;
    entry.split_once(':').filter(|_| !ipv6)
}

fn host_spec(name: &str, slots: Option<&str>, origin: &str) -> Result<HostSpec, String> {
    if name.is_empty() {
        return Err("has no host name".into());
    }
    if name.contains(':') {
        // `[fe80::1%eth0]`: brackets and a zone are IPv6's too.
        let bare = name
            .trim_start_matches('[')
            .split([']', '%'])
            .next()
            .unwrap_or(name);
        return Err(match bare.parse::<std::net::Ipv6Addr>() {
            Ok(_) => "is an IPv6 address; a host's server id is its IPv4 address: give the \
                      host's IPv4 address or name"
                .into(),
            Err(_) => "is not HOST or HOST:SLOTS (one colon at most)".into(),
        });
    }
    if let Ok(ip) = name.parse::<Ipv4Addr>()
        && (ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast())
    {
        return Err(format!("is {ip}, which no host can be reached at"));
    }
    // Numbers that are not a dotted quad as Rust reads it (`127.0.0.010`, `10.1`, `0x7f.1`,
    // `0`): the resolver reads them by inet_aton's rules (leading zeros in octal, missing
    // parts filled in), so the job would go to another address than the one written.
    let numeric = |label: &str| {
        let hex = label
            .strip_prefix("0x")
            .or_else(|| label.strip_prefix("0X"));
        match hex {
            Some(digits) => digits.chars().all(|c| c.is_ascii_hexdigit()),
            None => !label.is_empty() && label.chars().all(|c| c.is_ascii_digit()),
        }
    };
    if name.len() > 253 {
        return Err(format!(
            "is {} bytes long, more than a host name can be (253)",
            name.len()
        ));
    }
    if name.parse::<Ipv4Addr>().is_err() && name.split('.').all(numeric) {
        return Err(
            "is not an IPv4 address as written: four numbers 0-255 without leading zeros \
             (the resolver would read it otherwise, e.g. 127.0.0.010 as 127.0.0.8, in octal)"
                .into(),
        );
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')))
    {
        return Err(format!(
            "is not a host name or IPv4 address (it contains {c:?})"
        ));
    }
    let slots = match slots {
        None => None,
        Some(s) => match s.parse::<u32>() {
            Ok(0) => return Err("has 0 slots; a host needs at least 1".into()),
            Ok(n) => Some(n),
            Err(e) if *e.kind() == std::num::IntErrorKind::PosOverflow => {
                return Err(format!(
                    "has slot count {s:?}, more than any host has (at most {})",
                    u32::MAX
                ));
            }
            Err(_) => return Err(format!("has slot count {s:?}, not a positive number")),
        },
    };
    Ok(HostSpec {
        name: name.to_string(),
        slots,
        origin: origin.to_string(),
    })
}

/// Resolves every host to its IPv4 address and finds out which are this machine.
///
/// # Errors
///
/// [`CliError::Usage`] for a host that does not resolve to an IPv4 address, or two entries
/// that are the same server.
pub fn resolve_hosts(specs: &[HostSpec]) -> Result<Vec<HostPlan>, CliError> {
    let local = local_addresses();
    let mut seen: HashMap<Ipv4Addr, &HostSpec> = HashMap::new();
    let mut plans = Vec::with_capacity(specs.len());
    for spec in specs {
        let ip = resolve_ipv4(&spec.name).map_err(|why| {
            CliError::Usage(format!("host {:?} ({}): {why}", spec.name, spec.origin))
        })?;
        if let Some(first) = seen.insert(ip, spec) {
            return Err(CliError::Usage(format!(
                "host {:?} ({}) and host {:?} ({}) are the same server, {ip}; list each server once",
                first.name, first.origin, spec.name, spec.origin
            )));
        }
        plans.push(HostPlan {
            name: spec.name.clone(),
            server_id: ip.to_string(),
            slots: spec.slots,
            local: ip.is_loopback() || local.contains(&IpAddr::V4(ip)),
        });
    }
    Ok(plans)
}

/// Two hosts that are both this machine (`-H 127.0.0.1,<its own address>`) are two servers of
/// the table only with simulated devices: real ones would be the same NPUs twice.
pub(crate) fn refuse_this_machine_twice(
    args: &RunSettings,
    hosts: &[HostPlan],
) -> Result<(), CliError> {
    let mut local = hosts.iter().filter(|h| h.local);
    match (args.discovery.simulated(), local.next(), local.next()) {
        (false, Some(first), Some(second)) => Err(CliError::Usage(format!(
            "hosts {} and {} are both this machine: with --probe {}, its NPUs would be two \
             servers' in the table (only simulated devices, --sim N, make one machine several \
             servers); list it once",
            first.name,
            second.name,
            args.discovery.probe.as_str()
        ))),
        _ => Ok(()),
    }
}

/// The single host of a launch without `-H` or `--hostfile`: this machine, named by its
/// primary IPv4 address as `ranktable` does, or by its address on `--nic`.
///
/// # Errors
///
/// [`CliError::Failure`] when this machine has no usable IPv4 address.
pub fn this_machine(nic: Option<&NicChoice>) -> Result<HostPlan, CliError> {
    let ip = match nic {
        Some(choice) => {
            find_nic(choice)
                .map_err(|error| CliError::Usage(format!("--nic {choice}: {error}")))?
                .ipv4
        }
        None => primary_ipv4().map_err(|error| CliError::ThisMachine { error })?,
    };
    Ok(HostPlan {
        name: ip.to_string(),
        server_id: ip.to_string(),
        slots: None,
        local: true,
    })
}

fn resolve_ipv4(name: &str) -> Result<Ipv4Addr, String> {
    if let Ok(ip) = name.parse::<Ipv4Addr>() {
        return Ok(ip);
    }
    let addrs = (name, 0)
        .to_socket_addrs()
        .map_err(|e| format!("cannot be resolved: {e}"))?;
    addrs
        .filter_map(|a| match a.ip() {
            IpAddr::V4(ip) => Some(ip),
            IpAddr::V6(_) => None,
        })
        .next()
        .ok_or_else(|| "resolves to no IPv4 address; server ids are IPv4 addresses".into())
}

fn local_addresses() -> Vec<IpAddr> {
    let Ok(ifaces) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    ifaces
        .filter_map(|i| i.address)
        .filter_map(|a| a.as_sockaddr_in().map(|s| IpAddr::V4(s.ip())))
        .collect()
}

/// Checks `-n` against slot counts known before any probe: more workers than slots is a
/// command line that contradicts itself.
///
/// # Errors
///
/// [`CliError::Usage`] when `-n` exceeds the slots of hosts that all have slot counts.
pub fn check_np(hosts: &[HostPlan], np: Option<u32>) -> Result<(), CliError> {
    let Some(np) = np else { return Ok(()) };
    let slots: Option<u64> = hosts.iter().map(|h| h.slots.map(u64::from)).sum();
    match slots {
        Some(total) if u64::from(np) > total => Err(CliError::Usage(format!(
            "-n {np} is more than the {total} slots of {} (one worker per NPU)",
            crate::commands::counted(hosts.len(), "host")
        ))),
        _ => Ok(()),
    }
}

/// What one host offers, for [`assign_workers`].
#[derive(Debug, Clone)]
pub struct Offer {
    /// The host, for messages.
    pub host: String,
    /// Its slot count, if given.
    pub slots: Option<u32>,
    /// Its usable devices, by physical id.
    pub devices: Vec<Device>,
}

pub use atlasboost::cores::{assign_cores, cpu_ranges, id_ranges};

/// Ranks named in a sentence: `rank 3`, `ranks 0-3, 5`.
pub fn ranks_named(ranks: &[u32]) -> String {
    let mut distinct = ranks.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    let list = id_ranges(distinct.iter().map(|&r| u64::from(r)), ", ");
    match distinct.len() {
        1 => format!("rank {list}"),
        _ => format!("ranks {list}"),
    }
}

/// Decides which devices run a worker: each host's first `slots` devices (all without slots),
/// then, with `-n`, hosts are filled in order until `n` workers are placed (as mpirun maps by
/// slot).
///
/// # Errors
///
/// A message naming a host with fewer devices than slots, or `-n` beyond every device.
pub fn assign_workers(offers: Vec<Offer>, np: Option<u32>) -> Result<Vec<Device>, String> {
    let mut left = np.map(u64::from);
    let mut capacity = 0u64;
    let mut chosen = Vec::new();
    for mut offer in offers {
        offer.devices.sort_by_key(|d| d.physical_id);
        let have = offer.devices.len();
        let take = match offer.slots {
            Some(s) if s as usize > have => {
                return Err(format!(
                    "host {} has {} usable device{}, fewer than its {s} slots",
                    offer.host,
                    have,
                    if have == 1 { "" } else { "s" }
                ));
            }
            Some(s) => s as usize,
            None => have,
        };
        capacity += take as u64;
        let take = match &mut left {
            Some(n) => {
                let t = (*n).min(take as u64);
                *n -= t;
                t as usize
            }
            None => take,
        };
        chosen.extend(offer.devices.into_iter().take(take));
    }
    match (np, left) {
        (Some(np), Some(n)) if n > 0 => Err(format!(
            "-n {np} is more than the {capacity} devices the hosts offer (one worker per NPU)"
        )),
        _ => Ok(chosen),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use atlasboost_core::Health;

    use super::*;

    #[test]
    fn ranks_are_named_with_their_number_once_each() {
        assert_eq!(ranks_named(&[3]), "rank 3");
        assert_eq!(ranks_named(&[2, 2]), "rank 2");
        assert_eq!(ranks_named(&[5, 0, 1, 2, 3]), "ranks 0-3, 5");
    }

    fn usage(e: CliError) -> String {
        match e {
            CliError::Usage(m) => m,
            e @ CliError::BadHost { .. } => e.to_string(),
            other => panic!("expected a usage error, got {other:?}"),
        }
    }

    #[test]
    fn host_lists_take_slots_or_not() {
        let hosts = parse_host_list("127.0.0.1:4, node-1").unwrap();
        assert_eq!(hosts[0].name, "127.0.0.1");
        assert_eq!(hosts[0].slots, Some(4));
        assert_eq!(hosts[1].name, "node-1");
        assert_eq!(hosts[1].slots, None);
    }

    #[test]
    fn bad_host_list_elements_are_named() {
        let m = usage(parse_host_list("a:4,b:x").unwrap_err());
        assert!(m.contains("\"b:x\"") && m.contains("\"x\""), "{m}");
        let m = usage(parse_host_list("a:0").unwrap_err());
        assert!(m.contains("0 slots"), "{m}");
        let m = usage(parse_host_list("a:99999999999").unwrap_err());
        assert!(
            m.contains("more than any host has (at most 4294967295)"),
            "{m}"
        );
        let m = usage(parse_host_list("a,,b").unwrap_err());
        assert!(m.contains("no host name"), "{m}");
        let m = usage(parse_host_list("a b").unwrap_err());
        assert!(m.contains("' '"), "{m}");
        // IPv6 (bare or in brackets) is named as such, not misread at its first colon.
        for list in ["::1", "[::1]:2", "fe80::1,a", "fe80::1%eth0"] {
            let m = usage(parse_host_list(list).unwrap_err());
            assert!(m.contains("is an IPv6 address"), "{list}: {m}");
        }
        // Two colons that make no IPv6 address are a malformed entry.
        for list in ["127.0.0.1:2:3", "node1::2"] {
            let m = usage(parse_host_list(list).unwrap_err());
            assert!(m.contains("is not HOST or HOST:SLOTS"), "{list}: {m}");
        }
        for list in ["0.0.0.0:2", "255.255.255.255", "224.0.0.1"] {
            let m = usage(parse_host_list(list).unwrap_err());
            assert!(m.contains("which no host can be reached at"), "{list}: {m}");
        }
        // Numbers the resolver would read as another address than the one written.
        for list in [
            "127.0.0.010",
            "192.168.001.010:2",
            "0",
            "1",
            "10.1",
            "0x7f.0.0.1",
        ] {
            let m = usage(parse_host_list(list).unwrap_err());
            assert!(
                m.contains("is not an IPv4 address as written"),
                "{list}: {m}"
            );
        }
        // Names with digits are names.
        assert!(parse_host_list("node01,10-0-0-1,a1.b2").is_ok());
        // A name longer than DNS allows, quoted in part only.
        let m = usage(parse_host_list(&"a".repeat(100_000)).unwrap_err());
        assert!(
            m.contains("is 100000 bytes long, more than a host name can be")
                && m.contains("... (100000 bytes in all)")
                && m.len() < 1000,
            "{}",
            &m[..m.len().min(2000)]
        );
    }

    #[test]
    fn hostfiles_accept_three_forms_and_name_bad_lines() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        writeln!(
            f,
            "# cluster\n\n127.0.0.1 slots=2  # first\n127.0.0.2:3\n127.0.0.3"
        )
        .unwrap();
        let hosts = parse_hostfile(f.path()).unwrap();
        let got: Vec<_> = hosts.iter().map(|h| (h.name.as_str(), h.slots)).collect();
        assert_eq!(
            got,
            vec![
                ("127.0.0.1", Some(2)),
                ("127.0.0.2", Some(3)),
                ("127.0.0.3", None)
            ]
        );
        assert!(hosts[1].origin.ends_with(":4"), "{}", hosts[1].origin);

        let mut f = tempfile::NamedTempFile::new().unwrap();
        writeln!(f, "127.0.0.1 slots=2\n127.0.0.2 max_slots=4").unwrap();
        let m = usage(parse_hostfile(f.path()).unwrap_err());
        assert!(m.contains(":2:") && m.contains("max_slots=4"), "{m}");

        let mut f = tempfile::NamedTempFile::new().unwrap();
        writeln!(f, "127.0.0.1 slots=two").unwrap();
        let m = usage(parse_hostfile(f.path()).unwrap_err());
        assert!(m.contains(":1:") && m.contains("\"two\""), "{m}");

        let mut f = tempfile::NamedTempFile::new().unwrap();
        writeln!(f, "127.0.0.1\n::1 slots=2").unwrap();
        let m = usage(parse_hostfile(f.path()).unwrap_err());
        assert!(m.contains(":2:") && m.contains("is an IPv6 address"), "{m}");

        // A byte that is not UTF-8 is named with its line.
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(b"127.0.0.1\r\n127.0.0.2\n127.0.0.\xff slots=2\n")
            .unwrap();
        let m = usage(parse_hostfile(f.path()).unwrap_err());
        assert!(m.contains(":3:") && m.contains("is not UTF-8"), "{m}");
        // In a comment, or a byte-order mark, it is no matter.
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(b"\xef\xbb\xbf127.0.0.1 # n\xf6de 1\n127.0.0.2\n")
            .unwrap();
        let names: Vec<String> = parse_hostfile(f.path())
            .unwrap()
            .into_iter()
            .map(|h| h.name)
            .collect();
        assert_eq!(names, ["127.0.0.1", "127.0.0.2"]);

        let mut f = tempfile::NamedTempFile::new().unwrap();
        writeln!(f, "# nothing").unwrap();
        assert!(usage(parse_hostfile(f.path()).unwrap_err()).contains("no host"));
    }

    #[test]
    fn loopback_hosts_are_local_and_distinct_servers() {
        let plans = resolve_hosts(&parse_host_list("127.0.0.1:2,127.0.0.2").unwrap()).unwrap();
        assert!(plans.iter().all(|p| p.local));
        assert_eq!(plans[1].server_id, "127.0.0.2");
        let m = usage(resolve_hosts(&parse_host_list("127.0.0.1,localhost").unwrap()).unwrap_err());
        assert!(m.contains("same server"), "{m}");
    }

    #[test]
    fn np_beyond_known_slots_is_refused_up_front() {
        let plans = resolve_hosts(&parse_host_list("127.0.0.1:2,127.0.0.2:2").unwrap()).unwrap();
        assert!(check_np(&plans, Some(4)).is_ok());
        assert!(usage(check_np(&plans, Some(5)).unwrap_err()).contains("-n 5"));
        let open = resolve_hosts(&parse_host_list("127.0.0.1:2,127.0.0.2").unwrap()).unwrap();
        assert!(check_np(&open, Some(50)).is_ok(), "unknown until probed");
    }

    fn offer(host: &str, slots: Option<u32>, n: u32) -> Offer {
        Offer {
            host: host.into(),
            slots,
            devices: (0..n)
                .rev()
                .map(|p| Device {
                    server_id: host.into(),
                    logical_id: p,
                    physical_id: p,
                    ip: None,
                    chip: "910".into(),
                    health: Health::Healthy,
                    super_device_id: None,
                    super_pod_id: None,
                })
                .collect(),
        }
    }

    fn placed(devices: &[Device]) -> Vec<(String, u32)> {
        devices
            .iter()
            .map(|d| (d.server_id.clone(), d.physical_id))
            .collect()
    }

    #[test]
    fn workers_fill_hosts_in_order() {
        let got = assign_workers(vec![offer("a", Some(2), 8), offer("b", None, 3)], None).unwrap();
        let want: Vec<(String, u32)> = [("a", 0), ("a", 1), ("b", 0), ("b", 1), ("b", 2)]
            .iter()
            .map(|&(h, p)| (h.to_string(), p))
            .collect();
        assert_eq!(placed(&got), want);
        let got =
            assign_workers(vec![offer("a", Some(2), 8), offer("b", None, 3)], Some(3)).unwrap();
        assert_eq!(placed(&got), want[..3].to_vec());
    }

    #[test]
    fn too_few_devices_is_named() {
        let e = assign_workers(vec![offer("a", Some(9), 8)], None).unwrap_err();
        assert!(
            e.contains("host a has 8 usable devices, fewer than its 9 slots"),
            "{e}"
        );
        let e =
            assign_workers(vec![offer("a", None, 8), offer("b", None, 8)], Some(17)).unwrap_err();
        assert!(e.contains("-n 17") && e.contains("16 devices"), "{e}");
    }
}
