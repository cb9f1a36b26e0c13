//! The rank-table validator: every rule HCCL applies (SPEC §4), all violations at once.
//!
//! It works on the parsed JSON value rather than on the typed model, so a table with a number
//! where a string belongs is reported like any other problem, together with the rest.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;

use serde::Serialize;
use serde_json::{Map, Value};

use super::model::{Format, RankTable, STATUS_COMPLETED};
use super::node::{Node, Typed};
use crate::device::Chip;

/// The longest `server_id` HCCL accepts.
pub const MAX_SERVER_ID_LEN: usize = 64;

/// One broken rule, where it is broken, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// A JSON path to the offending value, e.g. `$.server_list[1].device[3].rank_id`.
    pub path: String,
    /// Which rule is broken.
    pub rule: Rule,
    /// What is wrong, naming the values involved.
    pub message: String,
}

impl Violation {
    /// Builds a violation.
    pub fn new(path: String, rule: Rule, message: String) -> Self {
        Violation {
            path,
            rule,
            message,
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} [{}]",
            self.path,
            self.message,
            self.rule.as_str()
        )
    }
}

/// The rules a rank table must follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Rule {
    /// The document's shape: an object, an array or a key where the format wants one.
    Structure,
    /// A required key is missing.
    Missing,
    /// A scalar is not a JSON string (HCCL rejects numbers, booleans and null).
    NotString,
    /// A numeric string is not a decimal number.
    NotDecimal,
    /// `version` is not one HCCL's concise parser reads.
    Version,
    /// `status` is not `completed`.
    Status,
    /// A count (`server_count`, `group_count`, `instance_count`, `device_count`) disagrees with its list.
    Count,
    /// `rank_id`s are not exactly `0..N-1`.
    RankIds,
    /// A `server_id` appears twice.
    DuplicateServerId,
    /// A device appears twice on one server.
    DuplicateDevice,
    /// A `device_ip` appears twice in the cluster.
    DuplicateDeviceIp,
    /// A value is not a valid IPv4 or IPv6 address.
    InvalidIp,
    /// Servers use different IP families.
    MixedIpFamilies,
    /// `device_ip` is missing although the table has more than one server.
    MissingDeviceIp,
    /// `server_id` is empty or longer than 64 characters.
    ServerId,
    /// Servers have different device counts.
    UnequalDeviceCounts,
    /// `device_id` is above what the chip has.
    DeviceIdRange,
    /// On 910, a server has a device count other than 1, 2, 4 or 8.
    DeviceCount,
    /// On 910, a 2- or 4-device server crosses the 0-3 / 4-7 groups.
    CrossesGroups,
    /// A port is not a number in 1..65535.
    Port,
    /// SuperPoD rules of version 1.2.
    SuperPod,
    /// A `pod_name` appears twice (legacy format).
    DuplicatePodName,
}

impl Rule {
    /// The rule's kebab-case name, as shown in messages and in `validate --json`.
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::Structure => "structure",
            Rule::Missing => "missing",
            Rule::NotString => "not-string",
            Rule::NotDecimal => "not-decimal",
            Rule::Version => "version",
            Rule::Status => "status",
            Rule::Count => "count",
            Rule::RankIds => "rank-ids",
            Rule::DuplicateServerId => "duplicate-server-id",
            Rule::DuplicateDevice => "duplicate-device",
            Rule::DuplicateDeviceIp => "duplicate-device-ip",
            Rule::InvalidIp => "invalid-ip",
            Rule::MixedIpFamilies => "mixed-ip-families",
            Rule::MissingDeviceIp => "missing-device-ip",
            Rule::ServerId => "server-id",
            Rule::UnequalDeviceCounts => "unequal-device-counts",
            Rule::DeviceIdRange => "device-id-range",
            Rule::DeviceCount => "device-count",
            Rule::CrossesGroups => "crosses-groups",
            Rule::Port => "port",
            Rule::SuperPod => "super-pod",
            Rule::DuplicatePodName => "duplicate-pod-name",
        }
    }
}

/// The chip whose rules apply to a table when the user names none: 910_93 for version 1.2
/// (only Atlas A3 reads it), 910 otherwise.
pub fn default_chip(value: &Value) -> Chip {
    match value.get("version").and_then(Value::as_str) {
        Some(v) if v == Format::V1_2.as_str() => Chip::Ascend910_93,
        _ => Chip::Ascend910,
    }
}

/// Validates a typed table (e.g. one the builder made) for `chip`.
pub fn validate_table(table: &RankTable, chip: Chip) -> Vec<Violation> {
    match table {
        RankTable::Cluster(t) => validate_node(Typed::Cluster(t), chip),
        RankTable::Legacy(t) => validate_node(Typed::Legacy(t), chip),
    }
}

/// Validates any JSON value as a rank table for `chip`; returns every violation (empty = valid).
pub fn validate_value(value: &Value, chip: Chip) -> Vec<Violation> {
    validate_node(value, chip)
}

fn validate_node<'a, N: Node<'a>>(top: N, chip: Chip) -> Vec<Violation> {
    let mut v = Validator {
        chip,
        out: Vec::new(),
    };
    if !top.is_object() {
        v.push(
            "$".into(),
            Rule::Structure,
            format!("a rank table is a JSON object, found {}", top.describe().0),
        );
    } else if top.get("version").is_some() {
        v.cluster(top);
    } else if top.get("group_list").is_some() {
        v.legacy(top);
    } else {
        v.push(
            "$".into(),
            Rule::Missing,
            "neither \"version\" (formats 1.0, 1.2) nor \"group_list\" (legacy format) is present"
                .into(),
        );
    }
    v.out
}

/// The elements of an array node, with their indices.
fn items<'a, N: Node<'a>>(list: N) -> impl Iterator<Item = (usize, N)> {
    (0..list.len().unwrap_or(0)).filter_map(move |i| list.at(i).map(|n| (i, n)))
}

/// Where a device is in the document. Paths are only formatted for violations, which keeps
/// validating a 32,768-rank table fast.
#[derive(Debug, Clone, Copy)]
enum Loc {
    Cluster {
        server: usize,
        device: usize,
    },
    Legacy {
        group: usize,
        instance: usize,
        device: usize,
    },
}

impl Loc {
    fn path(self) -> String {
        match self {
            Loc::Cluster { server, device } => format!("$.server_list[{server}].device[{device}]"),
            Loc::Legacy {
                group,
                instance,
                device,
            } => format!("$.group_list[{group}].instance_list[{instance}].devices[{device}]"),
        }
    }

    fn key(self, key: &str) -> String {
        format!("{}.{key}", self.path())
    }
}

/// The IP family of the first address seen, and the first address of the other family.
#[derive(Default)]
struct Families {
    first: Option<(String, bool)>,
    other: Option<(String, bool)>,
}

impl Families {
    fn note(&mut self, v6: bool, path: impl FnOnce() -> String) {
        match &self.first {
            None => self.first = Some((path(), v6)),
            Some((_, f)) if *f != v6 && self.other.is_none() => self.other = Some((path(), v6)),
            Some(_) => {}
        }
    }
}

/// A device as seen on one server: its physical id and where it is.
struct SeenDevice {
    id: Option<u32>,
    loc: Loc,
}

struct Validator {
    chip: Chip,
    out: Vec<Violation>,
}

impl Validator {
    fn push(&mut self, path: String, rule: Rule, message: String) {
        self.out.push(Violation::new(path, rule, message));
    }

    /// A string field: reports a missing key (if required) or a non-string value.
    fn string<'a, N: Node<'a>>(
        &mut self,
        obj: N,
        key: &str,
        path: &dyn Fn() -> String,
        required: bool,
    ) -> Option<&'a str> {
        match obj.get(key) {
            Some(node) => self.scalar(node, || format!("{}.{key}", path())),
            None if required => {
                self.push(
                    path(),
                    Rule::Missing,
                    format!("required key \"{key}\" is missing"),
                );
                None
            }
            None => None,
        }
    }

    /// A value that must be a string; reports it at `path` if it is not.
    fn scalar<'a, N: Node<'a>>(
        &mut self,
        node: N,
        path: impl FnOnce() -> String,
    ) -> Option<&'a str> {
        let s = node.as_str();
        if s.is_none() {
            let (kind, text) = node.describe();
            let hint = if kind == "number" {
                format!(" (write \"{text}\")")
            } else {
                String::new()
            };
            self.push(
                path(),
                Rule::NotString,
                format!("must be a JSON string, found {kind} {text}{hint}"),
            );
        }
        s
    }

    /// A decimal-number string field.
    fn decimal<'a, N: Node<'a>>(
        &mut self,
        obj: N,
        key: &str,
        path: &dyn Fn() -> String,
        required: bool,
    ) -> Option<u32> {
        let s = self.string(obj, key, path, required)?;
        let n = parse_decimal(s);
        if n.is_none() {
            self.push(
                format!("{}.{key}", path()),
                Rule::NotDecimal,
                format!("{s:?} is not a decimal number"),
            );
        }
        n
    }

    /// A required, non-empty array.
    fn array<'a, N: Node<'a>>(
        &mut self,
        obj: N,
        key: &str,
        path: &dyn Fn() -> String,
    ) -> Option<N> {
        let Some(node) = obj.get(key) else {
            self.push(
                path(),
                Rule::Missing,
                format!("required key \"{key}\" is missing"),
            );
            return None;
        };
        match node.len() {
            Some(0) => {
                self.push(
                    format!("{}.{key}", path()),
                    Rule::Structure,
                    "must not be empty".into(),
                );
                None
            }
            Some(_) => Some(node),
            None => {
                self.push(
                    format!("{}.{key}", path()),
                    Rule::Structure,
                    format!("must be an array, found {}", node.describe().0),
                );
                None
            }
        }
    }

    fn object<'a, N: Node<'a>>(&mut self, node: N, path: &dyn Fn() -> String) -> Option<N> {
        if node.is_object() {
            Some(node)
        } else {
            self.push(
                path(),
                Rule::Structure,
                format!("must be an object, found {}", node.describe().0),
            );
            None
        }
    }

    fn status<'a, N: Node<'a>>(&mut self, top: N) {
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

    /// Checks one `device_ip` value (possibly several comma-separated addresses).
    fn device_ip(
        &mut self,
        s: &str,
        loc: Loc,
        ips: &mut Vec<(IpAddr, Loc)>,
        families: &mut Families,
    ) {
        for part in s.split(',') {
            let part = part.trim();
            match part.parse::<IpAddr>() {
                Ok(ip) => {
                    ips.push((ip, loc));
                    families.note(ip.is_ipv6(), || loc.key("device_ip"));
                }
                Err(_) => self.push(
                    loc.key("device_ip"),
                    Rule::InvalidIp,
                    format!("{part:?} is not a valid IPv4 or IPv6 address"),
                ),
            }
        }
    }

    /// Every device IP appears once in the cluster. `ips` is in document order; a stable sort
    /// keeps it within each address, so the first use is the one named. (Sorting costs less
    /// than hashing 32,768 addresses.)
    fn duplicate_ips(&mut self, mut ips: Vec<(IpAddr, Loc)>) {
        ips.sort_by_key(|&(ip, _)| ip);
        let mut first: Option<(IpAddr, Loc)> = None;
        for (ip, loc) in ips {
            match first {
                Some((fip, floc)) if fip == ip => self.push(
                    loc.key("device_ip"),
                    Rule::DuplicateDeviceIp,
                    format!(
                        "device_ip {ip} is already used at {}",
                        floc.key("device_ip")
                    ),
                ),
                _ => first = Some((ip, loc)),
            }
        }
    }

    /// Device ids of one server against the chip's topology.
    fn server_topology(&mut self, devices: &[SeenDevice], list_path: &str, server_id: &str) {
        for d in devices {
            if let Some(id) = d.id
                && id > self.chip.max_device_id()
            {
                self.push(
                    d.loc.key("device_id"),
                    Rule::DeviceIdRange,
                    format!(
                        "device_id {id} is above {} (the highest on {})",
                        self.chip.max_device_id(),
                        self.chip
                    ),
                );
            }
        }
        // Sorting (stable: document order within an id) finds repeats without a map per server.
        let mut by_id: Vec<(u32, Loc)> = devices
            .iter()
            .filter_map(|d| d.id.map(|id| (id, d.loc)))
            .collect();
        by_id.sort_by_key(|&(id, _)| id);
        let mut first: Option<(u32, Loc)> = None;
        for &(id, loc) in &by_id {
            match first {
                Some((fid, floc)) if fid == id => self.push(
                    loc.key("device_id"),
                    Rule::DuplicateDevice,
                    format!(
                        "device {id} of server {server_id:?} is already listed at {}",
                        floc.path()
                    ),
                ),
                _ => first = Some((id, loc)),
            }
        }
        if self.chip == Chip::Ascend910 {
            let n = devices.len();
            if ![1, 2, 4, 8].contains(&n) {
                self.push(
                    list_path.to_string(),
                    Rule::DeviceCount,
                    format!("server {server_id:?} has {n} devices; a 910 server runs 1, 2, 4 or 8"),
                );
            } else if n == 2 || n == 4 {
                let ids: Vec<u32> = devices.iter().filter_map(|d| d.id).collect();
                let low = ids.iter().filter(|&&i| i < 4).count();
                if low != 0 && low != ids.len() {
                    let list = ids
                        .iter()
                        .map(|i| i.to_string())
                        .collect::<Vec<_>>()
                        .join(",");
                    self.push(
                        list_path.to_string(),
                        Rule::CrossesGroups,
                        format!(
                            "devices {list} of server {server_id:?} cross the 0-3 / 4-7 groups; \
                             a {n}-device 910 server must use devices from one group"
                        ),
                    );
                }
            }
        }
    }

    /// Unequal device counts per server (not a rule on 910B).
    fn equal_counts(&mut self, counts: &[(String, String, usize)]) {
        if self.chip == Chip::Ascend910B {
            return;
        }
        let Some((first_path, first_id, first_n)) = counts.first() else {
            return;
        };
        for (path, id, n) in &counts[1..] {
            if n != first_n {
                self.push(
                    path.clone(),
                    Rule::UnequalDeviceCounts,
                    format!(
                        "server {id:?} has {n} devices but server {first_id:?} ({first_path}) has {first_n}; \
                         HCCL needs the same count on every server (except on 910B)"
                    ),
                );
            }
        }
    }

    /// Addresses of one kind (device IPs, host IPs) must be one family with several servers.
    fn ip_families(&mut self, families: Families, servers: usize) {
        if servers < 2 {
            return;
        }
        if let (Some((first, first_v6)), Some((other, other_v6))) = (families.first, families.other)
        {
            let fam = |v6: bool| if v6 { "IPv6" } else { "IPv4" };
            self.push(
                other,
                Rule::MixedIpFamilies,
                format!(
                    "is {} but {first} is {}; with more than one server all such addresses \
                     must be one family",
                    fam(other_v6),
                    fam(first_v6)
                ),
            );
        }
    }

    /// `rank_id`s must be exactly `0..total`, and each server's ranks one block (HCCL's docs: no
    /// interleaving across servers). `complete` is false when some could not be read, in which
    /// case the gap they leave is not reported again.
    fn rank_ids(
        &mut self,
        ranks: &[(u32, usize, Loc)],
        total: usize,
        complete: bool,
        list_path: &str,
    ) {
        let before = self.out.len();
        let mut owner: Vec<Option<Loc>> = vec![None; total];
        for &(rank, _, loc) in ranks {
            let r = rank as usize;
            if r >= total {
                self.push(
                    loc.key("rank_id"),
                    Rule::RankIds,
                    format!(
                        "rank_id {rank} is outside 0..{} ({total} devices)",
                        total.saturating_sub(1)
                    ),
                );
            } else if let Some(first) = owner[r] {
                self.push(
                    loc.key("rank_id"),
                    Rule::RankIds,
                    format!("rank_id {rank} is already used at {}", first.key("rank_id")),
                );
            } else {
                owner[r] = Some(loc);
            }
        }
        let missing: Vec<String> = owner
            .iter()
            .enumerate()
            .filter(|(_, o)| o.is_none())
            .map(|(i, _)| i.to_string())
            .collect();
        if complete && !missing.is_empty() {
            self.push(
                list_path.to_string(),
                Rule::RankIds,
                format!(
                    "rank_id{} {} missing; rank_ids must be exactly 0..{}",
                    if missing.len() == 1 { "" } else { "s" },
                    missing.join(", "),
                    total.saturating_sub(1)
                ),
            );
        }
        if !complete || self.out.len() > before {
            return;
        }
        // Every rank is there exactly once: now each server's ranks must be consecutive.
        let mut span: Vec<(u32, u32, u32)> = Vec::new(); // per server: min, max, count
        for &(rank, server, _) in ranks {
            if span.len() <= server {
                span.resize(server + 1, (u32::MAX, 0, 0));
            }
            let s = &mut span[server];
            *s = (s.0.min(rank), s.1.max(rank), s.2 + 1);
        }
        for (server, &(min, max, count)) in span.iter().enumerate() {
            if count > 0 && max - min + 1 != count {
                self.push(
                    format!("$.server_list[{server}].device"),
                    Rule::RankIds,
                    format!(
                        "the server's {count} rank_ids span {min}..{max}; each server's ranks \
                         must be consecutive (HCCL does not interleave servers)"
                    ),
                );
            }
        }
    }

    /// The optional per-device keys HCCL reads: ports and backup IPs. Only the members the
    /// typed model does not interpret can hold them, so a table without extras costs nothing.
    fn optional_device_keys(&mut self, others: &Map<String, Value>, loc: Loc) {
        for (key, value) in others {
            let port = matches!(
                key.as_str(),
                "device_port" | "device_vnic_port" | "host_port" | "backup_device_port"
            );
            if !port && key != "backup_device_ip" {
                continue;
            }
            let Some(s) = self.scalar(value, || loc.key(key)) else {
                continue;
            };
            if port {
                if !parse_decimal(s).is_some_and(|p| (1..=65535).contains(&p)) {
                    self.push(
                        loc.key(key),
                        Rule::Port,
                        format!("{s:?} is not a port in 1..65535"),
                    );
                }
            } else if s.split(',').any(|p| p.trim().parse::<IpAddr>().is_err()) {
                self.push(
                    loc.key(key),
                    Rule::InvalidIp,
                    format!("{s:?} is not a valid IPv4 or IPv6 address"),
                );
            }
        }
    }

    fn server_id<'a, N: Node<'a>>(&mut self, obj: N, path: &dyn Fn() -> String) -> Option<&'a str> {
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
    fn cluster<'a, N: Node<'a>>(&mut self, top: N) {
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
        let mut complete = true;
        let mut counts = Vec::new();
        let mut missing_ip = Vec::new();
        // (server index, super_device_id, where) of every device, for the 1.2 rules.
        let mut super_devices: Vec<(usize, Option<u32>, Loc)> = Vec::new();

        for (si, server) in items(servers) {
            let spath = || format!("$.server_list[{si}]");
            let Some(sobj) = self.object(server, &spath) else {
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
            if let Some(h) = self.string(sobj, "host_ip", &spath, false) {
                match h.parse::<IpAddr>() {
                    Ok(ip) => host_families.note(ip.is_ipv6(), || format!("{}.host_ip", spath())),
                    Err(_) => self.push(
                        format!("{}.host_ip", spath()),
                        Rule::InvalidIp,
                        format!("{h:?} is not a valid IPv4 or IPv6 address"),
                    ),
                }
            }
            self.string(sobj, "host_nic_ip", &spath, false);
            let Some(devices) = self.array(sobj, "device", &spath) else {
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
                    Some(ip) => self.device_ip(ip, loc, &mut ips, &mut device_families),
                    None if dobj.get("device_ip").is_none() => missing_ip.push(loc),
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
                    if dobj.get("super_device_id").is_none() {
                        self.push(
                            dpath(),
                            Rule::SuperPod,
                            "version 1.2 needs \"super_device_id\" on every device".into(),
                        );
                    }
                    super_devices.push((si, sdid, loc));
                }
            }
            counts.push((list_path.clone(), sid.clone(), device_total));
            self.server_topology(&seen_devices, &list_path, &sid);
        }

        // Version 1.2 needs device IPs only across super pods: inside one, HCCS connects them.
        let single_pod = format == Format::V1_2
            && top
                .get("super_pod_list")
                .and_then(|p| p.len())
                .is_some_and(|n| n == 1);
        if server_total > 1 && !single_pod {
            for loc in missing_ip {
                self.push(
                    loc.path(),
                    Rule::MissingDeviceIp,
                    "device_ip is required when the table has more than one server".into(),
                );
            }
        }
        self.duplicate_ips(ips);
        self.ip_families(device_families, server_total);
        self.ip_families(host_families, server_total);
        self.equal_counts(&counts);
        self.rank_ids(&ranks, total, complete, "$.server_list");

        match (format, top.get("super_pod_list")) {
            (Format::V1_2, Some(pods)) => self.super_pods(pods, &server_ids, &super_devices),
            (Format::V1_2, None) => self.push(
                "$".into(),
                Rule::SuperPod,
                "version 1.2 needs \"super_pod_list\"".into(),
            ),
            // HCCL reads super_pod_list only in version 1.2 and ignores it otherwise.
            (_, _) => {}
        }
    }

    /// The SuperPoD rules of version 1.2. `server_ids` maps each `server_id` to its index in
    /// `server_list`; `devices` holds (server index, super_device_id, where) of every device.
    fn super_pods<'a, N: Node<'a>>(
        &mut self,
        pods: N,
        server_ids: &HashMap<&str, usize>,
        devices: &[(usize, Option<u32>, Loc)],
    ) {
        if pods.len().is_none() {
            self.push(
                "$.super_pod_list".into(),
                Rule::Structure,
                format!("must be an array, found {}", pods.describe().0),
            );
            return;
        }
        let mut pod_ids: HashMap<&str, String> = HashMap::new();
        // server index -> (super pod index, where the server is listed in it)
        let mut pod_of_server: HashMap<usize, (usize, String)> = HashMap::new();
        for (pi, pod) in items(pods) {
            let ppath = || format!("$.super_pod_list[{pi}]");
            let Some(pobj) = self.object(pod, &ppath) else {
                continue;
            };
            if let Some(id) = self.string(pobj, "super_pod_id", &ppath, true) {
                if let Some(first) = pod_ids.get(id) {
                    self.push(
                        format!("{}.super_pod_id", ppath()),
                        Rule::SuperPod,
                        format!("super_pod_id {id:?} is already used at {first}"),
                    );
                } else {
                    pod_ids.insert(id, format!("{}.super_pod_id", ppath()));
                }
            }
            let Some(list) = self.array(pobj, "server_list", &ppath) else {
                continue;
            };
            for (k, entry) in items(list) {
                let epath = || format!("$.super_pod_list[{pi}].server_list[{k}]");
                let Some(eobj) = self.object(entry, &epath) else {
                    continue;
                };
                let Some(sid) = self.string(eobj, "server_id", &epath, true) else {
                    continue;
                };
                match server_ids.get(sid) {
                    None => self.push(
                        format!("{}.server_id", epath()),
                        Rule::SuperPod,
                        format!("server {sid:?} is not in server_list"),
                    ),
                    Some(si) => {
                        if let Some((_, first)) = pod_of_server.get(si) {
                            self.push(
                                format!("{}.server_id", epath()),
                                Rule::SuperPod,
                                format!("server {sid:?} is already in a super pod at {first}"),
                            );
                        } else {
                            pod_of_server.insert(*si, (pi, format!("{}.server_id", epath())));
                        }
                    }
                }
            }
        }
        let mut unlisted: Vec<(usize, &str)> = server_ids
            .iter()
            .filter(|(_, si)| !pod_of_server.contains_key(si))
            .map(|(id, si)| (*si, *id))
            .collect();
        unlisted.sort_unstable();
        if !unlisted.is_empty() {
            let names: Vec<String> = unlisted.iter().map(|(_, id)| format!("{id:?}")).collect();
            self.push(
                "$.super_pod_list".into(),
                Rule::SuperPod,
                format!(
                    "servers {} of server_list are in no super pod",
                    names.join(", ")
                ),
            );
        }
        // Servers of one super pod are listed one after another in server_list.
        let mut order: Vec<usize> = Vec::new();
        let mut listed: Vec<usize> = server_ids.values().copied().collect();
        listed.sort_unstable();
        for si in listed {
            let Some(&(pod, _)) = pod_of_server.get(&si) else {
                continue;
            };
            if order.last() != Some(&pod) {
                if order.contains(&pod) {
                    self.push(
                        format!("$.server_list[{si}]"),
                        Rule::SuperPod,
                        format!(
                            "the servers of super pod $.super_pod_list[{pod}] are not listed \
                             one after another"
                        ),
                    );
                    break;
                }
                order.push(pod);
            }
        }
        // super_device_id is unique within a super pod.
        let mut seen: HashMap<(usize, u32), Loc> = HashMap::new();
        for &(si, sdid, loc) in devices {
            let (Some(sdid), Some(&(pod, _))) = (sdid, pod_of_server.get(&si)) else {
                continue;
            };
            if let Some(first) = seen.get(&(pod, sdid)) {
                self.push(
                    loc.key("super_device_id"),
                    Rule::SuperPod,
                    format!(
                        "super_device_id {sdid} is already used in the same super pod at {}",
                        first.key("super_device_id")
                    ),
                );
            } else {
                seen.insert((pod, sdid), loc);
            }
        }
    }

    /// The legacy `group_list` format.
    fn legacy<'a, N: Node<'a>>(&mut self, top: N) {
        self.status(top);
        let Some(groups) = self.array(top, "group_list", &|| "$".into()) else {
            return;
        };
        let group_total = groups.len().unwrap_or(0);
        if let Some(n) = self.decimal(top, "group_count", &|| "$".into(), true)
            && n as usize != group_total
        {
            self.push(
                "$.group_count".into(),
                Rule::Count,
                format!("is {n} but group_list has {group_total} groups"),
            );
        }
        let total_instances: usize = items(groups)
            .filter_map(|(_, g)| g.get("instance_list").and_then(|l| l.len()))
            .sum();
        let mut pods: HashMap<String, String> = HashMap::new();
        let mut ips: Vec<(IpAddr, Loc)> = Vec::new();
        let mut families = Families::default();
        // Per server (in order of first appearance): its id, the devices list of its first
        // instance (where per-server facts are reported), and its devices.
        let mut per_server: Vec<(String, String, Vec<SeenDevice>)> = Vec::new();
        let mut slot_of: HashMap<String, usize> = HashMap::new();
        for (gi, group) in items(groups) {
            let gpath = || format!("$.group_list[{gi}]");
            let Some(gobj) = self.object(group, &gpath) else {
                continue;
            };
            self.string(gobj, "group_name", &gpath, false);
            let Some(instances) = self.array(gobj, "instance_list", &gpath) else {
                continue;
            };
            let instance_total = instances.len().unwrap_or(0);
            if let Some(n) = self.decimal(gobj, "instance_count", &gpath, true)
                && n as usize != instance_total
            {
                self.push(
                    format!("{}.instance_count", gpath()),
                    Rule::Count,
                    format!("is {n} but instance_list has {instance_total} instances"),
                );
            }
            let mut device_total = 0usize;
            for (ii, inst) in items(instances) {
                let ipath = || format!("$.group_list[{gi}].instance_list[{ii}]");
                let Some(iobj) = self.object(inst, &ipath) else {
                    continue;
                };
                if let Some(pod) = self.string(iobj, "pod_name", &ipath, true) {
                    if let Some(first) = pods.get(pod) {
                        self.push(
                            format!("{}.pod_name", ipath()),
                            Rule::DuplicatePodName,
                            format!("pod_name {pod:?} is already used at {first}"),
                        );
                    } else {
                        pods.insert(pod.to_string(), format!("{}.pod_name", ipath()));
                    }
                }
                let sid = self
                    .server_id(iobj, &ipath)
                    .map_or_else(|| format!("#{gi}.{ii}"), str::to_string);
                let Some(devices) = self.array(iobj, "devices", &ipath) else {
                    continue;
                };
                device_total += devices.len().unwrap_or(0);
                let slot = *slot_of.entry(sid.clone()).or_insert_with(|| {
                    per_server.push((sid.clone(), format!("{}.devices", ipath()), Vec::new()));
                    per_server.len() - 1
                });
                for (di, dev) in items(devices) {
                    let loc = Loc::Legacy {
                        group: gi,
                        instance: ii,
                        device: di,
                    };
                    let dpath = || loc.path();
                    let Some(dobj) = self.object(dev, &dpath) else {
                        continue;
                    };
                    let id = self.decimal(dobj, "device_id", &dpath, true);
                    per_server[slot].2.push(SeenDevice { id, loc });
                    match self.string(dobj, "device_ip", &dpath, false) {
                        Some(ip) => self.device_ip(ip, loc, &mut ips, &mut families),
                        None if dobj.get("device_ip").is_none() && total_instances > 1 => self
                            .push(
                                dpath(),
                                Rule::MissingDeviceIp,
                                "device_ip is required when the table has more than one instance"
                                    .into(),
                            ),
                        None => {}
                    }
                }
            }
            if let Some(n) = self.decimal(gobj, "device_count", &gpath, true)
                && n as usize != device_total
            {
                self.push(
                    format!("{}.device_count", gpath()),
                    Rule::Count,
                    format!("is {n} but the group's instances have {device_total} devices"),
                );
            }
        }
        let mut counts = Vec::new();
        for (sid, list_path, devices) in &per_server {
            self.server_topology(devices, list_path, sid);
            counts.push((list_path.clone(), sid.clone(), devices.len()));
        }
        self.duplicate_ips(ips);
        self.ip_families(families, per_server.len());
        self.equal_counts(&counts);
    }
}

/// Parses a plain decimal number (digits only, as HCCL's `SalStrToULong` wants).
fn parse_decimal(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}
