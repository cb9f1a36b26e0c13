//! The builder: from the devices gathered from every host to one rank table.

use std::collections::HashMap;
use std::net::IpAddr;

use serde_json::Map;

use super::model::{
    ClusterTable, DeviceEntry, Format, GroupEntry, HOST_NIC_IP_RESERVED, InstanceEntry,
    LEGACY_GROUP_NAME, LegacyDeviceEntry, LegacyTable, RankTable, STATUS_COMPLETED, ServerEntry,
    SuperPodEntry, SuperPodServer,
};
use super::validate::{errors_fail, validate_table};
use crate::device::{Chip, Device};
use crate::error::{Error, Result};

/// How servers are ordered when ranks are numbered.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum RankOrder {
    /// Servers sorted by `server_id` as strings (what MindSpore and HCCL's legacy parser expect).
    #[default]
    ServerId,
    /// Servers in the order of this host list (`--rank-order hosts`); every host must be in it.
    Hosts(Vec<String>),
}

/// What to build.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BuildOptions {
    /// The table format.
    pub format: Format,
    /// The server order.
    pub order: RankOrder,
    /// The validation rules; `None` takes the chip the devices report.
    pub chip: Option<Chip>,
}

/// Builds a validated rank table from the devices of every host.
///
/// Servers are ordered as `opts.order` says, devices by physical id, and `rank_id`s count up
/// from 0 in that order. The result does not depend on the order of `devices`.
///
/// # Errors
///
/// [`Error::Build`] for unhealthy or duplicate devices, an unknown or mixed chip, or an order
/// that does not fit the format; [`Error::Invalid`] if the table breaks a rule of the chip
/// (e.g. a 910 server with devices 2-5).
pub fn build_table(devices: &[Device], opts: &BuildOptions) -> Result<RankTable> {
    build_table_checked(devices, opts).map(|(table, _)| table)
}

/// [`build_table`], also returning the table's warnings (what HCCL only recommends), from the
/// same validation.
///
/// # Errors
///
/// As [`build_table`].
pub fn build_table_checked(
    devices: &[Device],
    opts: &BuildOptions,
) -> Result<(RankTable, Vec<super::Violation>)> {
    let chip = chip_or_reported(opts.chip, devices)?;
    // Version 1.2 is the A3's (SuperPoD) format; HCCL reads other chips' tables as 1.0.
    if opts.format == Format::V1_2 && chip != Chip::Ascend910_93 {
        return Err(Error::Build(match opts.chip {
            // The user's word, not the devices': said as such.
            Some(_) => format!(
                "format 1.2 is the Atlas A3's (910_93), and --chip says the devices are \
                 {chip}: use format 1.0, or --chip 910_93"
            ),
            None => format!(
                "format 1.2 is the Atlas A3's (910_93), and the devices are {chip}: use format \
                 1.0 (--chip 910_93 if they are A3s the driver does not name so)"
            ),
        }));
    }
    let servers = group_servers(devices, opts)?;
    let table = match opts.format {
        Format::V1_0 | Format::V1_2 => cluster_table(&servers, opts.format)?,
        Format::Legacy => legacy_table(&servers),
    };
    let mut violations = validate_table(&table, chip);
    name_hosts_and_devices(&table, &mut violations);
    let warnings = errors_fail(violations, || {
        "the rank table built from the probed devices".into()
    })?;
    Ok((table, warnings))
}

/// A table built from probes is written nowhere yet, so a JSON path alone names nothing the
/// user can look up: each violation at a server (`$.server_list[i]`, or a legacy table's
/// `$.group_list[g].instance_list[i]`) or one of its devices also names its host and physical
/// device.
fn name_hosts_and_devices(table: &RankTable, violations: &mut [super::Violation]) {
    for v in violations.iter_mut() {
        let steps = path_indexes(&v.path);
        let index = |key: &str| steps.iter().find(|(k, _)| k == key).map(|&(_, i)| i);
        let found =
            match table {
                RankTable::Cluster(t) => index("server_list")
                    .and_then(|i| t.server_list.get(i))
                    .map(|server| {
                        let device = index("device").and_then(|j| server.device.get(j));
                        (&server.server_id, device.map(|d| &d.device_id))
                    }),
                RankTable::Legacy(t) => index("group_list")
                    .and_then(|g| t.group_list.get(g))
                    .and_then(|group| group.instance_list.get(index("instance_list")?))
                    .map(|instance| {
                        let device = index("devices").and_then(|j| instance.devices.get(j));
                        (&instance.server_id, device.map(|d| &d.device_id))
                    }),
            };
        match found {
            Some((server, Some(device))) => {
                v.message
                    .push_str(&format!(" (host {server}, device {device})"));
            }
            Some((server, None)) => v.message.push_str(&format!(" (host {server})")),
            None => {}
        }
    }
}

/// The indexed steps of a JSON path: `$.group_list[0].instance_list[2].devices[1].device_id`
/// gives `group_list` 0, `instance_list` 2, `devices` 1.
fn path_indexes(path: &str) -> Vec<(String, usize)> {
    path.split('.')
        .filter_map(|step| {
            let (key, rest) = step.split_once('[')?;
            Some((key.to_string(), rest.strip_suffix(']')?.parse().ok()?))
        })
        .collect()
}

/// The rules to apply: `chip` when the user chose one (`--chip`), else the chip the devices
/// report ([`chip_of_devices`]).
///
/// # Errors
///
/// As [`chip_of_devices`].
pub fn chip_or_reported(chip: Option<Chip>, devices: &[Device]) -> Result<Chip> {
    match chip {
        Some(chip) => Ok(chip),
        None => chip_of_devices(devices),
    }
}

/// The chip family all devices agree on (910 when there are none).
///
/// # Errors
///
/// [`Error::Build`] when a device reports a chip atlasboost has no rules for, or two differ.
pub fn chip_of_devices(devices: &[Device]) -> Result<Chip> {
    let mut chip: Option<(Chip, &Device)> = None;
    for d in devices {
        // Every device of a host reports the same name: skip the parse for repeats.
        if chip.is_some_and(|(_, first)| first.chip == d.chip) {
            continue;
        }
        let c = Chip::from_driver_name(&d.chip).ok_or_else(|| {
            Error::Build(format!(
                "device {} of host {} reports chip {:?}, which atlasboost has no rules for \
                 (it knows the 910, 910B and 910_93 families; --chip overrides what the devices \
                 report)",
                d.physical_id, d.server_id, d.chip
            ))
        })?;
        match chip {
            None => chip = Some((c, d)),
            Some((first, fd)) if first != c => {
                return Err(Error::Build(format!(
                    "hosts report different chips: {} on {} (device {}) and {} on {} (device {})",
                    fd.chip, fd.server_id, fd.physical_id, d.chip, d.server_id, d.physical_id
                )));
            }
            Some(_) => {}
        }
    }
    Ok(chip.map_or(Chip::Ascend910, |(c, _)| c))
}

/// Devices grouped by server, servers in rank order, devices by physical id.
/// Each unusable device of `devices`, named with its host and health: `device 5 of host
/// 10.0.0.3 is critical (3)`.
pub fn unhealthy_named(devices: &[Device]) -> Vec<String> {
    devices
        .iter()
        .filter(|d| !d.health.is_healthy())
        .map(|d| {
            format!(
                "device {} of host {} is {}",
                d.physical_id, d.server_id, d.health
            )
        })
        .collect()
}

fn group_servers<'a>(
    devices: &'a [Device],
    opts: &BuildOptions,
) -> Result<Vec<(&'a str, Vec<&'a Device>)>> {
    if devices.is_empty() {
        return Err(Error::Build("no devices were found on any host".into()));
    }
    let unhealthy = unhealthy_named(devices);
    if !unhealthy.is_empty() {
        return Err(Error::Unusable(unhealthy.join(", ")));
    }
    let mut by_server: HashMap<&str, Vec<&Device>> = HashMap::new();
    for d in devices {
        by_server.entry(d.server_id.as_str()).or_default().push(d);
    }
    for (server, devs) in &mut by_server {
        devs.sort_by_key(|d| d.physical_id);
        if let Some(w) = devs
            .windows(2)
            .find(|w| w[0].physical_id == w[1].physical_id)
        {
            return Err(Error::Build(format!(
                "host {server} reported device {} twice",
                w[0].physical_id
            )));
        }
    }
    let mut servers: Vec<(&str, Vec<&Device>)> = match &opts.order {
        RankOrder::ServerId => {
            let mut servers: Vec<_> = by_server.into_iter().collect();
            servers.sort_unstable_by_key(|(server, _)| *server);
            servers
        }
        RankOrder::Hosts(hosts) => {
            if opts.format == Format::Legacy {
                return Err(Error::Build(
                    "the legacy format ranks servers by server_id; --rank-order hosts cannot apply"
                        .into(),
                ));
            }
            let mut out = Vec::with_capacity(hosts.len());
            for h in hosts {
                match by_server.remove(h.as_str()) {
                    Some(devs) => out.push((devs[0].server_id.as_str(), devs)),
                    None if out.iter().any(|(s, _)| *s == h.as_str()) => {
                        return Err(Error::Build(format!("host {h} is listed twice")));
                    }
                    None => return Err(Error::Build(format!("host {h} reported no devices"))),
                }
            }
            if let Some(extra) = by_server.keys().min() {
                return Err(Error::Build(format!(
                    "devices of host {extra} were gathered, but it is not in the host list"
                )));
            }
            out
        }
    };
    if opts.format == Format::V1_2 {
        // Servers of one SuperPoD must be listed one after another.
        let pod = |devs: &[&Device]| devs[0].super_pod_id.clone().unwrap_or_default();
        match opts.order {
            RankOrder::ServerId => servers.sort_by_key(|(_, devs)| pod(devs)),
            RankOrder::Hosts(_) => {
                let mut seen: Vec<String> = Vec::new();
                for (host, devs) in &servers {
                    let p = pod(devs);
                    if seen.last() != Some(&p) {
                        if seen.contains(&p) {
                            return Err(Error::Build(format!(
                                "host {host} is in super pod {p:?}, whose other hosts are not \
                                 next to it in the host list; format 1.2 lists each super pod's \
                                 servers together"
                            )));
                        }
                        seen.push(p);
                    }
                }
            }
        }
    }
    Ok(servers)
}

fn cluster_table(servers: &[(&str, Vec<&Device>)], format: Format) -> Result<RankTable> {
    // Format 1.2 of devices that know nothing of super pods (a driver without the SuperPoD
    // calls, hccn.conf) is HCCL's "AI server mode": no super_device_id, no super_pod_list
    // (HCCL warns). Where any device knows its pod, every device must.
    let with_pods = format == Format::V1_2
        && servers
            .iter()
            .flat_map(|(_, devs)| devs)
            .any(|d| d.super_device_id.is_some() || d.super_pod_id.is_some());
    let ip_of = device_ip_of(servers, format);
    let mut rank = 0usize;
    let mut server_list = Vec::with_capacity(servers.len());
    let mut pods: Vec<SuperPodEntry> = Vec::new();
    let mut pod_index: HashMap<String, usize> = HashMap::new();
    for (server_id, devs) in servers {
        let mut device = Vec::with_capacity(devs.len());
        for d in devs {
            let super_device_id = if with_pods {
                let sdid = d.super_device_id.ok_or_else(|| {
                    Error::Build(format!(
                        "format 1.2 with super pods needs a super_device_id on every device, \
                         and device {} of host {} has none",
                        d.physical_id, d.server_id
                    ))
                })?;
                Some(sdid.to_string())
            } else {
                None
            };
            device.push(DeviceEntry {
                device_id: decimal(d.physical_id as usize),
                device_ip: ip_of(d),
                super_device_id,
                rank_id: decimal(rank),
                extra: Map::new(),
            });
            rank += 1;
        }
        if with_pods {
            let pod_id = devs[0].super_pod_id.clone().ok_or_else(|| {
                Error::Build(format!(
                    "format 1.2 with super pods needs every host's super pod id, and host \
                     {server_id} has none"
                ))
            })?;
            let i = *pod_index.entry(pod_id.clone()).or_insert_with(|| {
                pods.push(SuperPodEntry {
                    super_pod_id: pod_id,
                    server_list: Vec::new(),
                    extra: Map::new(),
                });
                pods.len() - 1
            });
            pods[i].server_list.push(SuperPodServer {
                server_id: server_id.to_string(),
            });
        }
        server_list.push(ServerEntry {
            server_id: server_id.to_string(),
            device,
            host_nic_ip: Some(HOST_NIC_IP_RESERVED.into()),
            extra: Map::new(),
        });
    }
    Ok(RankTable::Cluster(ClusterTable {
        version: format.as_str().into(),
        server_count: Some(servers.len().to_string()),
        server_list,
        super_pod_list: with_pods.then_some(pods),
        status: STATUS_COMPLETED.into(),
        extra: Map::new(),
    }))
}

/// Whether a table of `devices` in `format` needs no `device_ip`: they are on one server, or
/// (format 1.2) in one super pod, where HCCS connects them.
fn needs_no_device_ip<'a>(devices: impl Iterator<Item = &'a Device>, format: Format) -> bool {
    let mut places = devices.map(|d| (d.server_id.as_str(), d.super_pod_id.as_deref()));
    let Some((server, pod)) = places.next() else {
        return true;
    };
    let (mut one_server, mut one_pod) = (true, format == Format::V1_2 && pod.is_some());
    for (s, p) in places {
        one_server &= s == server;
        one_pod &= p == pod;
    }
    one_server || one_pod
}

/// How each device's `device_ip` is written. HCCL counts the addresses of every device alike,
/// so a device without one beside devices that have one is a table it refuses; where the
/// table needs none ([`needs_no_device_ip`]), a device without an address leaves every device
/// without one. Between servers every device needs one, which the validator says.
fn device_ip_of(
    servers: &[(&str, Vec<&Device>)],
    format: Format,
) -> impl Fn(&Device) -> Option<String> {
    let devices = || servers.iter().flat_map(|(_, devs)| devs.iter().copied());
    let none = devices().any(|d| d.ip.is_none()) && needs_no_device_ip(devices(), format);
    move |d: &Device| if none { None } else { d.ip.map(ip_text) }
}

/// The devices whose probe found no RoCE address, when a table of one server (or, in `format`
/// 1.2, one super pod) is built from them and so lists `device_ip` on no device: what to tell
/// the user (`device 3 of host 10.0.0.1 has no RoCE address, ...`), or `None` when every
/// device has an address or the table needs them (several servers: the validator names the
/// devices).
#[must_use]
pub fn devices_without_ip(devices: &[Device], format: Format) -> Option<String> {
    let without: Vec<String> = devices
        .iter()
        .filter(|d| d.ip.is_none())
        .map(|d| format!("device {} of host {}", d.physical_id, d.server_id))
        .collect();
    let some = !without.is_empty() && without.len() < devices.len();
    (some && needs_no_device_ip(devices.iter(), format)).then(|| {
        format!(
            "{} {} no RoCE address, so the table lists device_ip on no device (HCCL needs the \
             same count on every device, and none inside one server or super pod)",
            without.join(", "),
            if without.len() == 1 { "has" } else { "have" }
        )
    })
}

fn legacy_table(servers: &[(&str, Vec<&Device>)]) -> RankTable {
    let ip_of = device_ip_of(servers, Format::Legacy);
    let instance_list: Vec<InstanceEntry> = servers
        .iter()
        .enumerate()
        .map(|(i, (server_id, devs))| InstanceEntry {
            devices: devs
                .iter()
                .map(|d| LegacyDeviceEntry {
                    device_id: decimal(d.physical_id as usize),
                    device_ip: ip_of(d),
                    extra: Map::new(),
                })
                .collect(),
            pod_name: i.to_string(),
            server_id: server_id.to_string(),
            extra: Map::new(),
        })
        .collect();
    let device_count: usize = servers.iter().map(|(_, d)| d.len()).sum();
    RankTable::Legacy(LegacyTable {
        group_count: "1".into(),
        group_list: vec![GroupEntry {
            group_name: Some(LEGACY_GROUP_NAME.into()),
            device_count: device_count.to_string(),
            instance_count: instance_list.len().to_string(),
            instance_list,
            extra: Map::new(),
        }],
        status: STATUS_COMPLETED.into(),
        extra: Map::new(),
    })
}

/// `n` in decimal. The builder writes two of these per rank; going around `fmt` makes building
/// a 32,768-rank table measurably faster.
fn decimal(n: usize) -> String {
    let mut s = String::with_capacity(8);
    push_decimal(&mut s, n);
    s
}

fn push_decimal(s: &mut String, mut n: usize) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    s.extend(digits[i..].iter().map(|&b| char::from(b)));
}

/// An address as text: IPv4 without `fmt` (one per rank, see [`decimal`]), IPv6 as usual.
fn ip_text(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => {
            let mut s = String::with_capacity(15);
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    s.push('.');
                }
                push_decimal(&mut s, usize::from(octet));
            }
            s
        }
        IpAddr::V6(_) => ip.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Health;

    /// A table built from probed devices is written nowhere: its errors name the host and the
    /// physical device, not only a JSON path (whose server order is by server id).
    #[test]
    fn a_built_tables_errors_name_the_host_and_device() {
        let device = |server: &str, physical: u32, ip: Option<[u8; 4]>| Device {
            server_id: server.into(),
            logical_id: physical,
            physical_id: physical,
            ip: ip.map(IpAddr::from),
            chip: "910".into(),
            health: Health::Healthy,
            super_device_id: None,
            super_pod_id: None,
        };
        let devices = [
            device("127.0.0.2", 2, Some([10, 0, 2, 2])),
            device("127.0.0.2", 3, Some([10, 0, 2, 3])),
            device("127.0.0.10", 2, Some([10, 0, 10, 2])),
            device("127.0.0.10", 3, None),
        ];
        for (format, path) in [
            (Format::V1_0, "$.server_list[0].device[1]"),
            (
                Format::Legacy,
                "$.group_list[0].instance_list[0].devices[1]",
            ),
        ] {
            let opts = BuildOptions {
                format,
                order: RankOrder::ServerId,
                chip: None,
            };
            let Err(Error::Invalid { violations, .. }) = build_table_checked(&devices, &opts)
            else {
                panic!("{format:?}: a device without an address between servers is refused");
            };
            let v: Vec<String> = violations.iter().map(ToString::to_string).collect();
            assert!(
                v.iter()
                    .any(|v| v.starts_with(path) && v.contains("(host 127.0.0.10, device 3)")),
                "{format:?}: {v:?}"
            );
        }
    }

    #[test]
    fn fast_formatting_matches_display() {
        for n in [0usize, 7, 10, 99, 100, 4095, 32_767, 1 << 40, usize::MAX] {
            assert_eq!(decimal(n), n.to_string());
        }
        for ip in [
            "0.0.0.0",
            "10.0.1.1",
            "192.168.100.255",
            "255.255.255.255",
            "fd00::a01:203:0:1",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(ip_text(ip), ip.to_string());
        }
    }
}
