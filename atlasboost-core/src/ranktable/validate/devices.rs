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
        let parts = s.split(',').count();
        let mut comma_said = false;
        for (i, part) in s.split(',').enumerate() {
            // A comma with nothing after it (or before it, or another comma) is an empty
            // address: said as the comma it is, once per value.
            if part.is_empty() && parts > 1 {
                if std::mem::replace(&mut comma_said, true) {
                    continue;
                }
                let place = match i {
                    0 => "a leading comma".to_string(),
                    _ if i + 1 == parts => "a trailing comma".to_string(),
                    _ => "two commas in a row".to_string(),
                };
                self.push(
                    loc.key("device_ip"),
                    Rule::InvalidIp,
                    format!("{s:?} has {place}: an empty address between commas"),
                );
                continue;
            }
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::validate_value;
    use crate::Chip;

    /// The messages about `device_ip` values of one device.
    fn said_of(device_ip: &str) -> Vec<String> {
        let table = json!({"version": "1.0", "server_count": "1", "status": "completed",
            "server_list": [{"server_id": "10.0.0.1", "device": [
                {"device_id": "0", "device_ip": device_ip, "rank_id": "0"}]}]});
        validate_value(&table, Chip::Ascend910)
            .into_iter()
            .filter(|v| v.path.ends_with(".device_ip"))
            .map(|v| v.message)
            .collect()
    }

    #[test]
    fn an_empty_address_between_commas_is_named_as_the_comma() {
        for (value, place) in [
            ("192.168.100.101,", "a trailing comma"),
            (",192.168.100.101", "a leading comma"),
            ("192.168.100.101,,192.168.100.102", "two commas in a row"),
        ] {
            assert_eq!(
                said_of(value),
                [format!(
                    "{value:?} has {place}: an empty address between commas"
                )],
                "{value}"
            );
        }
        assert_eq!(
            said_of(""),
            ["\"\" is not a valid IPv4 or IPv6 address"],
            "no comma: the empty value as it is"
        );
        for value in [",", ",,"] {
            assert_eq!(
                said_of(value),
                [format!(
                    "{value:?} has a leading comma: an empty address between commas"
                )],
                "once per value"
            );
        }
    }
}
