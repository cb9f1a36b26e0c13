//! Devices and their addresses: each `device_ip`, addresses used twice, one address family per table, the keys a device may carry.

use std::net::IpAddr;

use serde_json::{Map, Value};

use super::{Families, Loc, Rule, Validator, parse_decimal};

impl Validator {
    /// Checks one `device_ip` value (in formats 1.0 and 1.2, possibly several comma-separated
    /// addresses; `list`). `needs_ips`: whether the device needs its address (a table of
    /// several servers, outside one super pod, on a server without a host NIC): where it does
    /// not, HCCL only warns of an empty value.
    pub(super) fn device_ip(
        &mut self,
        s: &str,
        loc: Loc,
        ips: &mut Vec<(IpAddr, Loc)>,
        families: &mut Families,
        needs_ips: bool,
        list: bool,
    ) {
        if s.is_empty() && !needs_ips {
            self.warn(
                loc.key("device_ip"),
                Rule::InvalidIp,
                "is empty: HCCL warns and reads no address (this device needs none here)".into(),
            );
            return;
        }
        // The legacy parser hands the whole value to its address parser: no list.
        if !list && s.contains(',') {
            self.push(
                loc.key("device_ip"),
                Rule::InvalidIp,
                format!(
                    "{s:?} is not one address: HCCL reads a legacy table's device_ip whole (a \
                     comma-separated list is for formats 1.0 and 1.2)"
                ),
            );
            return;
        }
        let parts = hccl_addresses(s);
        if s.len() > 1 && s.ends_with(',') && !s.ends_with(",,") {
            self.warn(
                loc.key("device_ip"),
                Rule::InvalidIp,
                format!("{s:?} has a trailing comma: HCCL drops the empty address after it"),
            );
        }
        let mut comma_said = false;
        for (i, &part) in parts.iter().enumerate() {
            // A comma with nothing after it (or before it, or another comma) is an empty
            // address: said as the comma it is, once per value.
            if part.is_empty() && s.contains(',') {
                if std::mem::replace(&mut comma_said, true) {
                    continue;
                }
                let place = match i {
                    0 => "a leading comma".to_string(),
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
                        families.note(ip, || loc.key("device_ip"));
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
        if let (Some((first, first_ip)), Some((other, other_ip))) = (families.first, families.other)
        {
            let fam = |ip: IpAddr| if ip.is_ipv6() { "IPv6" } else { "IPv4" };
            // Named by address too: both may be in one value (`"10.0.0.1,fd00::1"`).
            self.push(
                other,
                Rule::MixedIpFamilies,
                format!(
                    "{other_ip} is {} but {first_ip} (at {first}) is {}; with more than one \
                     server all such addresses must be one family",
                    fam(other_ip),
                    fam(first_ip)
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

/// The addresses of a `device_ip` value as HCCL splits it (`SplitString`): at each comma, an
/// empty piece after a last comma dropped (`"a,"` is one address, `"a,,"` two, the second
/// empty).
pub(super) fn hccl_addresses(s: &str) -> Vec<&str> {
    let mut parts: Vec<&str> = s.split(',').collect();
    if parts.len() > 1 && parts.last() == Some(&"") {
        parts.pop();
    }
    parts
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

    /// Two families in one value: named by address, not by one path against itself.
    #[test]
    fn mixed_families_in_one_value_are_named_by_address() {
        let table = json!({"version": "1.0", "server_count": "2", "status": "completed",
            "server_list": [
                {"server_id": "10.0.0.1", "device": [
                    {"device_id": "0", "device_ip": "192.168.0.1,fd00::1", "rank_id": "0"}]},
                {"server_id": "10.0.0.2", "device": [
                    {"device_id": "0", "device_ip": "192.168.0.2,fd00::2", "rank_id": "1"}]}]});
        let mixed: Vec<String> = validate_value(&table, Chip::Ascend910)
            .into_iter()
            .filter(|v| v.rule == super::Rule::MixedIpFamilies)
            .map(|v| format!("{}: {}", v.path, v.message))
            .collect();
        assert_eq!(
            mixed,
            [
                "$.server_list[0].device[0].device_ip: fd00::1 is IPv6 but 192.168.0.1 (at \
              $.server_list[0].device[0].device_ip) is IPv4; with more than one server all such \
              addresses must be one family"
            ]
        );
    }

    #[test]
    fn an_empty_address_between_commas_is_named_as_the_comma() {
        for (value, place) in [
            (",192.168.100.101", "a leading comma"),
            ("192.168.100.101,,192.168.100.102", "two commas in a row"),
            ("192.168.100.101,,", "two commas in a row"),
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
            ["is empty: HCCL warns and reads no address (this device needs none here)"],
            "no comma, one server: a warning, as HCCL's"
        );
        assert_eq!(
            said_of("192.168.100.101,"),
            ["\"192.168.100.101,\" has a trailing comma: HCCL drops the empty address after it"],
            "one trailing comma: HCCL reads one address"
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
