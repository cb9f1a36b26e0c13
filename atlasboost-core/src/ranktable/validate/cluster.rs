//! Formats `1.0` and `1.2`: the top level, `status`, each server and its `server_id`.

use std::collections::HashMap;
use std::net::IpAddr;

use super::super::model::{Format, STATUS_COMPLETED};
use super::super::node::Node;
use super::{Families, Loc, MAX_SERVER_ID_LEN, Rule, SeenDevice, Validator, items};

impl Validator {
    pub(super) fn status<'a, N: Node<'a>>(&mut self, top: N) {
        if let Some(status) = self.string(top, "status", &|| "$".into(), true)
            && status != STATUS_COMPLETED
        {
            self.push(
                "$.status".into(),
                Rule::Status,
                format!("is {status:?}; HCCL only uses a table whose status is \"completed\""),
            );
        }
    }

    pub(super) fn server_id<'a, N: Node<'a>>(
        &mut self,
        obj: N,
        path: &dyn Fn() -> String,
    ) -> Option<&'a str> {
        let id = self.string(obj, "server_id", path, true)?;
        // HCCL limits the length of the C++ string: bytes, not characters.
        if id.is_empty() || id.len() > MAX_SERVER_ID_LEN {
            self.push(
                format!("{}.server_id", path()),
                Rule::ServerId,
                format!(
                    "server_id {id:?} has {} bytes; it must have 1 to {MAX_SERVER_ID_LEN}",
                    id.len()
                ),
            );
        }
        Some(id)
    }

    /// Formats 1.0 and 1.2.
    pub(super) fn cluster<'a, N: Node<'a>>(&mut self, top: N) {
        let version = self.string(top, "version", &|| "$".into(), true);
        let format = match version {
            Some(v) if v == Format::V1_0.as_str() => Format::V1_0,
            Some(v) if v == Format::V1_2.as_str() => Format::V1_2,
            Some(v) => {
                self.push(
                    "$.version".into(),
                    Rule::Version,
                    format!("version {v:?} is not supported; expected \"1.0\" or \"1.2\""),
                );
                Format::V1_0
            }
            None => Format::V1_0,
        };
        self.status(top);
        let Some(servers) = self.array(top, "server_list", &|| "$".into()) else {
            return;
        };
        let server_total = servers.len().unwrap_or(0);
        if top.get("server_count").is_none() {
            self.warn(
                "$".into(),
                Rule::Missing,
                "no \"server_count\": HCCL's documentation requires it; its parser warns and \
                 counts server_list"
                    .into(),
            );
        }
        if let Some(count) = self.decimal(top, "server_count", &|| "$".into(), false)
            && count as usize != server_total
        {
            self.push(
                "$.server_count".into(),
                Rule::Count,
                format!("is {count} but server_list has {server_total} servers"),
            );
        }

        let expected_devices: usize = items(servers)
            .filter_map(|(_, s)| s.get("device").and_then(|d| d.len()))
            .sum();
        let mut server_ids: HashMap<&str, usize> = HashMap::with_capacity(server_total);
        let mut ips: Vec<(IpAddr, Loc)> = Vec::with_capacity(expected_devices);
        let mut device_families = Families::default();
        let mut host_families = Families::default();
        // (rank_id, server index, where) of every readable rank_id.
        let mut ranks: Vec<(u32, usize, Loc)> = Vec::with_capacity(expected_devices);
        let mut total = 0usize;
        // Every rank_id was read (`complete`); every server's device list was, so that the
        // number of devices is known (`total_known`) even when some rank_id is unreadable.
        let mut complete = true;
        let mut total_known = true;
        let mut counts = Vec::new();
        let mut missing_ip = Vec::new();
        // Devices of host_ip servers without device_ip.
        let mut host_nic_only = Vec::new();
        // How many addresses the first device lists in device_ip, and where.
        let mut ip_counts: Option<(usize, Loc)> = None;
        let has_pods = top.get("super_pod_list").is_some();
        // Version 1.2 needs device IPs only across super pods: inside one, HCCS connects them.
        let single_pod = format == Format::V1_2
            && top
                .get("super_pod_list")
                .and_then(|p| p.len())
                .is_some_and(|n| n == 1);
        let needs_ips = server_total > 1 && !single_pod;
        // (server index, super_device_id, where) of every device, for the 1.2 rules.
        let mut super_devices: Vec<(usize, Option<u32>, Loc)> = Vec::new();

        for (si, server) in items(servers) {
            let spath = || format!("$.server_list[{si}]");
            // A server that cannot be read hides its ranks: none is missing or out of range
            // because of it (`complete`).
            let Some(sobj) = self.object(server, &spath) else {
                complete = false;
                total_known = false;
                continue;
            };
            let sid = self.server_id(sobj, &spath);
            if let Some(id) = sid {
                if let Some(first) = server_ids.get(id) {
                    self.push(
                        format!("{}.server_id", spath()),
                        Rule::DuplicateServerId,
                        format!(
                            "server_id {id:?} is already used at $.server_list[{first}].server_id"
                        ),
                    );
                } else {
                    server_ids.insert(id, si);
                }
            }
            let sid = sid.map_or_else(|| format!("#{si}"), str::to_string);
            let host_ip = self.string(sobj, "host_ip", &spath, false);
            if let Some(h) = host_ip {
                match h.parse::<IpAddr>() {
                    Ok(ip) if ip.is_ipv6() => self.push(
                        format!("{}.host_ip", spath()),
                        Rule::HostIp,
                        format!("{h} is IPv6; HCCL's host NIC (host_ip) is IPv4 only"),
                    ),
                    Ok(ip) => host_families.note(ip, || format!("{}.host_ip", spath())),
                    Err(_) => self.push(
                        format!("{}.host_ip", spath()),
                        Rule::InvalidIp,
                        format!("{h:?} is not a valid IPv4 or IPv6 address"),
                    ),
                }
            }
            self.string(sobj, "host_nic_ip", &spath, false);
            let Some(devices) = self.array(sobj, "device", &spath) else {
                complete = false;
                total_known = false;
                continue;
            };
            let device_total = devices.len().unwrap_or(0);
            total += device_total;
            let list_path = format!("{}.device", spath());
            let mut seen_devices = Vec::with_capacity(device_total);
            for (di, dev) in items(devices) {
                let loc = Loc::Cluster {
                    server: si,
                    device: di,
                };
                let dpath = || loc.path();
                let Some(dobj) = self.object(dev, &dpath) else {
                    complete = false;
                    continue;
                };
                let id = self.decimal(dobj, "device_id", &dpath, true);
                seen_devices.push(SeenDevice { id, loc });
                match self.string(dobj, "device_ip", &dpath, false) {
                    Some(ip) => {
                        // A server with a host NIC (host_ip) does without device addresses.
                        let needs = needs_ips && host_ip.is_none();
                        self.device_ip(ip, loc, &mut ips, &mut device_families, needs, true);
                        let n = super::devices::hccl_addresses(ip).len();
                        match ip_counts {
                            None => ip_counts = Some((n, loc)),
                            Some((first, floc)) if first != n => self.push(
                                loc.key("device_ip"),
                                Rule::DeviceIpCount,
                                format!(
                                    "lists {n} address{} but {} lists {first}; HCCL needs the \
                                     same number on every device",
                                    if n == 1 { "" } else { "es" },
                                    floc.key("device_ip")
                                ),
                            ),
                            Some(_) => {}
                        }
                    }
                    // With host_ip (a host-NIC deployment) HCCL needs no device address,
                    // unless other devices list some (below).
                    None if dobj.get("device_ip").is_none() && host_ip.is_none() => {
                        missing_ip.push(loc);
                    }
                    None if dobj.get("device_ip").is_none() => host_nic_only.push(loc),
                    None => {}
                }
                if let Some(others) = dobj.others() {
                    self.optional_device_keys(others, loc);
                }
                match self.decimal(dobj, "rank_id", &dpath, true) {
                    Some(r) => ranks.push((r, si, loc)),
                    None => complete = false,
                }
                let sdid = self.decimal(dobj, "super_device_id", &dpath, false);
                if format == Format::V1_2 {
                    // Needed only with super pods (without, HCCL does not read it).
                    if has_pods && dobj.get("super_device_id").is_none() {
                        self.push(
                            dpath(),
                            Rule::SuperPod,
                            "version 1.2 with super pods needs \"super_device_id\" on every device"
                                .into(),
                        );
                    }
                    super_devices.push((si, sdid, loc));
                }
            }
            counts.push((list_path.clone(), sid.clone(), device_total));
            self.server_topology(&seen_devices, &list_path, &sid);
        }

        if needs_ips {
            for loc in missing_ip.iter() {
                self.push(
                    loc.path(),
                    Rule::MissingDeviceIp,
                    "device_ip is required when the table has more than one server".into(),
                );
            }
        }
        // HCCL counts the device addresses of every device alike: devices without any (on a
        // host-NIC server, or in a table that needs none) beside devices that list some is a
        // mixed table it refuses.
        if let Some((first, floc)) = ip_counts {
            let without_any = missing_ip.into_iter().filter(|_| !needs_ips);
            for loc in host_nic_only.into_iter().chain(without_any) {
                self.push(
                    loc.path(),
                    Rule::DeviceIpCount,
                    format!(
                        "lists no device_ip but {} lists {first}; HCCL needs the same number \
                         on every device",
                        floc.key("device_ip")
                    ),
                );
            }
        }
        self.duplicate_ips(ips);
        self.ip_families(device_families, server_total);
        self.ip_families(host_families, server_total);
        self.equal_counts(&counts);
        self.rank_ids(&ranks, total, total_known, complete, "$.server_list");

        match (format, top.get("super_pod_list")) {
            (Format::V1_2, Some(pods)) => self.super_pods(pods, &server_ids, &super_devices),
            (Format::V1_2, None) => self.warn(
                "$".into(),
                Rule::SuperPod,
                "version 1.2 without \"super_pod_list\": HCCL warns, and reads the servers as \
                 outside any super pod"
                    .into(),
            ),
            // HCCL reads super_pod_list only in version 1.2 and ignores it otherwise.
            (_, _) => {}
        }
    }
}
