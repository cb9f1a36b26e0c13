//! Devices and their addresses: each `device_ip`, addresses used twice, one address family per table, the keys a device may carry.

use std::net::IpAddr;

use serde_json::{Map, Value};

use super::{Families, Loc, Rule, Validator, parse_decimal};

impl Validator {
    /// Checks one `device_ip` value (possibly several comma-separated addresses).
    pub(super) fn device_ip(
        &mut self,
        s: &str,
        loc: Loc,
        ips: &mut Vec<(IpAddr, Loc)>,
        families: &mut Families,
    ) {
        for part in s.split(',') {
            // HCCL parses each address as it is (inet_pton): white space makes it invalid.
            if part.trim() != part {
                self.push(
                    loc.key("device_ip"),
                    Rule::InvalidIp,
                    format!("{part:?} has white space around the address: HCCL reads it as it is"),
                );
                continue;
            }
            match part.parse::<IpAddr>() {
                Ok(ip) => match crate::device::device_ip_problem(ip) {
                    Some(problem) => self.push(
                        loc.key("device_ip"),
                        Rule::InvalidIp,
                        format!("{ip} is {problem}: HCCL connects to a device at its RoCE address"),
                    ),
                    None => {
                        ips.push((ip, loc));
                        families.note(ip.is_ipv6(), || loc.key("device_ip"));
                    }
                },
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
    pub(super) fn duplicate_ips(&mut self, mut ips: Vec<(IpAddr, Loc)>) {
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

    /// Addresses of one kind (device IPs, host IPs) must be one family with several servers.
    pub(super) fn ip_families(&mut self, families: Families, servers: usize) {
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

    /// The optional per-device keys HCCL reads: ports and backup IPs. Only the members the
    /// typed model does not interpret can hold them, so a table without extras costs nothing.
    pub(super) fn optional_device_keys(&mut self, others: &Map<String, Value>, loc: Loc) {
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
            } else if s.split(',').any(|p| p.parse::<IpAddr>().is_err()) {
                self.push(
                    loc.key(key),
                    Rule::InvalidIp,
                    format!("{s:?} is not a valid IPv4 or IPv6 address"),
                );
            }
        }
    }
}
