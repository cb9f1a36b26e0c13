//! `/etc/hccn.conf`: `key_<physical id>=value` lines, of which `address_<id>` is the device's
//! RoCE IP (what `hccl_tools.py` falls back to).

use std::collections::BTreeMap;
use std::io::Read;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use atlasboost_core::{Device, DeviceProbe, Error, Health};

use crate::DsmiError;
use crate::visible::VisibleDevices;

/// The chip hccn.conf servers are assumed to have: the file does not say (pass `--chip` to
/// validate for another).
const CHIP: &str = "910";

/// The largest physical id accepted (Ascend servers have at most 16 NPUs; 64 leaves room).
const MAX_PHYSICAL_ID: u32 = 63;

/// The largest hccn.conf read: a real one is a few kilobytes (a dozen lines per device).
const MAX_HCCN_CONF: u64 = 1 << 20;

/// Whether a key's name (before `_<id>`) is `address` mistyped: another case, a letter
/// missing, doubled or swapped (`Address`, `adress`, `addresss`), or more after it
/// (`address_0_1`). No other key of hccn.conf (`netmask`, `gateway`, `arp`, `netdetect`,
/// `send_arp_status`, `tls_enable`, `dscp_tc`, ...) is within two edits of it.
fn looks_like_address(name: &str) -> bool {
    let lower = name.trim().to_ascii_lowercase();
    lower.starts_with("address") || strsim::levenshtein(&lower, "address") <= 2
}

/// Parses hccn.conf text into `physical id → address`. Other `key_<id>=value` lines
/// (`netmask_0`, `gateway_0`, `arp_0`, ...) are checked for shape and otherwise ignored.
///
/// # Errors
///
/// [`DsmiError::BadHccnConf`] listing every malformed line, bad address, bad id, and
/// duplicate (address or id), with line numbers.
pub fn parse_hccn_conf(text: &str, path: &Path) -> Result<BTreeMap<u32, IpAddr>, DsmiError> {
    let mut addresses: BTreeMap<u32, (IpAddr, usize)> = BTreeMap::new();
    let mut problems = Vec::new();
    // A byte-order mark (an editor's) is not part of the first key.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    for (n, raw) in text.lines().enumerate() {
        let line_no = n + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            problems.push(format!("line {line_no}: {line:?} is not key_<id>=value"));
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        let Some((name, id)) = key.rsplit_once('_') else {
            problems.push(format!("line {line_no}: key {key:?} has no _<id> suffix"));
            continue;
        };
        // Digits only: `parse` would also take `+1`.
        let digits = !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit());
        let id = match id.parse::<u32>() {
            Ok(id) if digits && id <= MAX_PHYSICAL_ID => id,
            _ => {
                problems.push(format!(
                    "line {line_no}: {key:?} does not end in a device id 0-{MAX_PHYSICAL_ID}"
                ));
                continue;
            }
        };
        if name != "address" {
            // A misspelt address line would leave its device out without a word.
            if looks_like_address(name) {
                problems.push(format!(
                    "line {line_no}: key {key:?} is not address_<id> (misspelt, the line \
                     would give no device an address)"
                ));
            }
            continue;
        }
        let ip: IpAddr = match value.parse() {
            Ok(ip) => ip,
            Err(_) => {
                problems.push(format!(
                    "line {line_no}: address_{id}={value:?} is not an IPv4 or IPv6 address"
                ));
                continue;
            }
        };
        if let Some(problem) = atlasboost_core::device_ip_problem(ip) {
            problems.push(format!(
                "line {line_no}: address_{id}={value} is {problem}, not a device's RoCE address"
            ));
            continue;
        }
        if let Some((_, first)) = addresses.get(&id) {
            problems.push(format!(
                "line {line_no}: address_{id} is given again (first on line {first})"
            ));
            continue;
        }
        if let Some((other, (_, first))) = addresses.iter().find(|(_, (a, _))| *a == ip) {
            problems.push(format!(
                "line {line_no}: address_{id}={ip} is also device {other}'s address (line {first})"
            ));
            continue;
        }
        addresses.insert(id, (ip, line_no));
    }
    if problems.is_empty() && addresses.is_empty() {
        problems.push("no address_<id>= line: no device addresses".into());
    }
    if !problems.is_empty() {
        return Err(DsmiError::BadHccnConf {
            path: path.to_path_buf(),
            problems,
        });
    }
    Ok(addresses
        .into_iter()
        .map(|(id, (ip, _))| (id, ip))
        .collect())
}

/// Devices from hccn.conf (SPEC §3, `--probe hccn`): one per `address_<id>` line, each with
/// the logical id the driver gives it on a bare-metal server, its physical id (also where the
/// file leaves devices out: a server whose file lists only 4-7 still has its NPUs 0-3, and the
/// runtime's device 4 is NPU 4); then filtered and renumbered by the visible-devices variables
/// (a container's mounted devices are 0..n-1).
#[derive(Debug, Clone)]
pub struct HccnProbe {
    server_id: String,
    path: PathBuf,
    visible: VisibleDevices,
}

/// Opens `path` for reading without waiting for a writer: a FIFO nobody writes to reads as
/// empty (a plain open would wait for ever), while a pipe with a writer (`<(ssh node cat
/// /etc/hccn.conf)`) is read to its end as usual.
fn open_without_waiting(path: &Path) -> std::io::Result<std::fs::File> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::File::options()
        .read(true)
        .custom_flags(OFlag::O_NONBLOCK.bits())
        .open(path)?;
    // Blocking again, so that a pipe's reads wait for its writer's next bytes.
    let flags = OFlag::from_bits_truncate(fcntl(&file, FcntlArg::F_GETFL)?);
    fcntl(&file, FcntlArg::F_SETFL(flags - OFlag::O_NONBLOCK))?;
    Ok(file)
}

impl HccnProbe {
    /// A probe reading `path`.
    ///
    /// # Errors
    ///
    /// [`DsmiError::BadVisible`] for a malformed visible-devices variable.
    pub fn new(server_id: &str, path: &Path) -> Result<HccnProbe, DsmiError> {
        Ok(HccnProbe {
            server_id: server_id.to_string(),
            path: path.to_path_buf(),
            visible: VisibleDevices::from_env()?,
        })
    }

    /// The file it reads.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn devices(&self) -> Result<Vec<Device>, DsmiError> {
        let read_error = |source| DsmiError::Read {
            path: self.path.clone(),
            source,
        };
        // Read with a cap: the path may name anything (`/dev/zero`, a log file).
        let mut bytes = Vec::new();
        let file = open_without_waiting(&self.path).map_err(read_error)?;
        let fifo = {
            use std::os::unix::fs::FileTypeExt;
            file.metadata().is_ok_and(|m| m.file_type().is_fifo())
        };
        file.take(MAX_HCCN_CONF + 1)
            .read_to_end(&mut bytes)
            .map_err(read_error)?;
        if fifo && bytes.is_empty() {
            return Err(DsmiError::BadHccnConf {
                path: self.path.clone(),
                problems: vec![
                    "it is a FIFO (a named pipe) that no process was writing to when it was read: \
                     nothing came"
                        .into(),
                ],
            });
        }
        if bytes.len() as u64 > MAX_HCCN_CONF {
            return Err(DsmiError::BadHccnConf {
                path: self.path.clone(),
                problems: vec![format!(
                    "it holds more than {} MiB, far more than any hccn.conf",
                    MAX_HCCN_CONF >> 20
                )],
            });
        }
        // Lines that are not UTF-8 are named, and read as empty so that every other problem is
        // named too, at its own line.
        let mut not_text = Vec::new();
        let text: Vec<&str> = bytes
            .split(|&b| b == b'\n')
            .enumerate()
            .map(|(n, line)| {
                std::str::from_utf8(line).unwrap_or_else(|_| {
                    not_text.push(format!("line {} is not UTF-8 text", n + 1));
                    ""
                })
            })
            .collect();
        let bad = |problems| DsmiError::BadHccnConf {
            path: self.path.clone(),
            problems,
        };
        let addresses = match parse_hccn_conf(&text.join("\n"), &self.path) {
            Ok(addresses) if not_text.is_empty() => addresses,
            Ok(_) => return Err(bad(not_text)),
            Err(DsmiError::BadHccnConf { problems, .. }) => {
                let mut all = not_text;
                all.extend(problems);
                // In the file's order: `line N...` by N, the rest after.
                all.sort_by_key(|p| {
                    p.strip_prefix("line ")
                        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
                        .and_then(|n| n.parse::<usize>().ok())
                        .unwrap_or(usize::MAX)
                });
                return Err(bad(all));
            }
            Err(e) => return Err(e),
        };
        let devices: Vec<Device> = addresses
            .into_iter()
            .map(|(physical, ip)| Device {
                server_id: self.server_id.clone(),
                logical_id: physical,
                physical_id: physical,
                ip: Some(ip),
                chip: CHIP.into(),
                health: Health::Healthy,
                super_device_id: None,
                super_pod_id: None,
            })
            .collect();
        let devices = self.visible.apply_physical(devices, Some(&self.path))?;
        // Renumbered by ASCEND_VISIBLE_DEVICES, the ids are no longer the file's.
        let listed = self
            .visible
            .physical
            .is_none()
            .then_some(self.path.as_path());
        self.visible.apply_runtime(devices, listed)
    }
}

impl DeviceProbe for HccnProbe {
    fn name(&self) -> &str {
        "hccn"
    }

    fn source(&self) -> Option<String> {
        Some(self.path.display().to_string())
    }

    fn probe(&self) -> atlasboost_core::Result<Vec<Device>> {
        self.devices().map_err(|e| Error::Probe {
            probe: "hccn".into(),
            server_id: self.server_id.clone(),
            source: e.into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn parse(text: &str) -> Result<BTreeMap<u32, IpAddr>, String> {
        parse_hccn_conf(text, Path::new("hccn.conf")).map_err(|e| e.to_string())
    }

    #[test]
    fn a_real_910_file_parses() {
        let text = "address_0=29.1.137.205\nnetmask_0=255.255.0.0\nnetdetect_0=29.1.0.1\n\
                    gateway_0=29.1.0.1\nsend_arp_status_0=1\n\n# comment\naddress_1=29.1.137.206\n\
                    arp_1=-i eth1 -s 29.1.137.205 aa:bb:cc:dd:ee:ff\n";
        let got = parse(text).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[&1], IpAddr::from([29, 1, 137, 206]));
    }

    #[test]
    fn a_byte_order_mark_does_not_hide_the_first_line() {
        let got = parse("\u{feff}address_0=10.1.0.1\naddress_1=10.1.0.2\n").unwrap();
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[&0], IpAddr::from([10, 1, 0, 1]));
    }

    #[test]
    fn every_problem_is_listed_with_its_line() {
        let text = "address_0=10.0.0.1\naddress_0=10.0.0.2\naddress_1=10.0.0.1\n\
                    address_2=10.0.0.300\naddress_x=1.2.3.4\nnonsense\nnetmask=1\n\
                    address_3=0.0.0.0\naddress_4=255.255.255.255\naddress_5=127.0.0.1\n\
                    address_6=224.0.0.1\naddress_7=::1\naddress_+1=10.0.0.9\n\
                    address_8=::ffff:127.0.0.1\naddress_9=::10.0.0.6\nAddress_10=10.0.0.10\n\
                    adress_11=10.0.0.11\naddress_0_12=10.0.0.12\naddress _13=10.0.0.13\n\
                    gateway_0=10.0.0.1\ndscp_tc_0=1\nip_rule_0=x\n";
        let e = parse(text).unwrap_err();
        for want in [
            "line 2: address_0 is given again (first on line 1)",
            "line 3: address_1=10.0.0.1 is also device 0's address (line 1)",
            "line 4: address_2=\"10.0.0.300\" is not an IPv4 or IPv6 address",
            "line 5: \"address_x\" does not end in a device id",
            "line 6: \"nonsense\" is not key_<id>=value",
            "line 7: key \"netmask\" has no _<id> suffix",
            "line 8: address_3=0.0.0.0 is the unspecified address (the device has none)",
            "line 9: address_4=255.255.255.255 is the broadcast address",
            "line 10: address_5=127.0.0.1 is a loopback address",
            "line 11: address_6=224.0.0.1 is a multicast address",
            "line 12: address_7=::1 is a loopback address",
            "line 13: \"address_+1\" does not end in a device id",
            "line 14: address_8=::ffff:127.0.0.1 is an IPv4-mapped IPv6 address",
            "line 15: address_9=::10.0.0.6 is an IPv4-compatible IPv6 address",
            "line 16: key \"Address_10\" is not address_<id> (misspelt",
            "line 17: key \"adress_11\" is not address_<id>",
            "line 18: key \"address_0_12\" is not address_<id>",
            "line 19: key \"address _13\" is not address_<id>",
        ] {
            assert!(e.contains(want), "{want:?} missing from:\n{e}");
        }
        // Other keys of a real file are no misspelt address.
        for other in ["line 20", "line 21", "line 22"] {
            assert!(!e.contains(other), "{other} flagged:\n{e}");
        }
        assert!(
            parse("# empty\n")
                .unwrap_err()
                .contains("no address_<id>= line")
        );
    }

    proptest! {
        /// Any text gives a map or an error, never a panic.
        #[test]
        fn never_panics(text in ".{0,400}") {
            let _ = parse(&text);
        }

        /// Lines of the right shape in any order give back every address.
        #[test]
        fn well_formed_files_round_trip(ids in proptest::collection::btree_set(0u32..16, 1..8)) {
            let text: String = ids.iter().rev().map(|i| format!("address_{i}=10.9.0.{}\nnetmask_{i}=255.255.255.0\n", i + 1)).collect();
            let got = parse(&text).unwrap();
            prop_assert_eq!(got.keys().copied().collect::<Vec<_>>(), ids.iter().copied().collect::<Vec<_>>());
        }
    }
}
