//! Devices (NPUs) and the probes that list them.

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result, parse_name};

/// One NPU of one host, as a probe reports it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Device {
    /// The host this device belongs to: its `server_id` in the rank table.
    pub server_id: String,
    /// The id the runtime uses in this process (`ASCEND_DEVICE_ID`), after visible-device
    /// renumbering: `0..n` from a driver, the physical id from hccn.conf (a bare-metal
    /// server's numbering, which a file that leaves devices out shows as gaps).
    pub logical_id: u32,
    /// The chip's physical id (`/dev/davinciN`): the table's `device_id`.
    pub physical_id: u32,
    /// The RoCE IP of the device; may be absent on a single-server job.
    pub ip: Option<IpAddr>,
    /// The chip name as the driver reports it (`910`, `910B3`, `910_9391`, ...).
    pub chip: String,
    /// Whether the driver considers the device usable.
    pub health: Health,
    /// The NPU id inside an Atlas A3 SuperPoD (`super_device_id`, format 1.2 only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub super_device_id: Option<u32>,
    /// The SuperPoD this host belongs to (`super_pod_id`, format 1.2 only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub super_pod_id: Option<String>,
}

/// Device health as the driver reports it (`dsmi_get_device_health`: 0 is healthy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Health {
    /// Usable.
    Healthy,
    /// Not usable; the driver's code is kept for the message.
    Unhealthy {
        /// The non-zero health code (1 warning, 2 important, 3 critical, 0xFFFFFFFF offline).
        code: u32,
    },
    /// Not usable: the driver's calls about this device fail while the others' answer (a
    /// broken NPU); the first call that failed and its code are kept for the message.
    Unreadable {
        /// The driver's return code.
        code: i32,
        /// The call that returned it.
        call: DriverCall,
    },
}

/// A driver call about one device, named in [`Health::Unreadable`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DriverCall {
    /// `dsmi_get_phyid_from_logicid`.
    #[serde(rename = "dsmi_get_phyid_from_logicid")]
    PhysicalId,
    /// `dsmi_get_device_ip_address`.
    #[serde(rename = "dsmi_get_device_ip_address")]
    IpAddress,
    /// `dsmi_get_chip_info`.
    #[serde(rename = "dsmi_get_chip_info")]
    ChipInfo,
    /// `dsmi_get_device_health`.
    #[serde(rename = "dsmi_get_device_health")]
    Health,
}

impl DriverCall {
    const ALL: [DriverCall; 4] = [
        DriverCall::PhysicalId,
        DriverCall::IpAddress,
        DriverCall::ChipInfo,
        DriverCall::Health,
    ];

    /// The C function.
    pub fn function(self) -> &'static str {
        match self {
            DriverCall::PhysicalId => "dsmi_get_phyid_from_logicid",
            DriverCall::IpAddress => "dsmi_get_device_ip_address",
            DriverCall::ChipInfo => "dsmi_get_chip_info",
            DriverCall::Health => "dsmi_get_device_health",
        }
    }

    /// The call whose C function is `function`, if it is one of them.
    pub fn of_function(function: &str) -> Option<DriverCall> {
        Self::ALL.into_iter().find(|c| c.function() == function)
    }
}

/// What a DSMI return code means (`NO_DEVICE: no device`, ...), for the codes the driver
/// documents.
pub fn dsmi_code_meaning(code: i32) -> Option<&'static str> {
    Some(match code {
        1 => "NO_DEVICE: no device",
        2 => "INVALID_DEVICE: no such device",
        3 => "INVALID_VALUE: invalid value",
        4 => "INVALID_HANDLE",
        6 => "OUT_OF_MEMORY",
        7 => "INNER_ERR: the driver's internal error",
        8 => "PARA_ERROR: bad parameter",
        9 => "UNINIT: the driver is not initialised",
        11 => "NOT_EXIST: does not exist",
        13 => "BUSY: the device is busy",
        16 => "WAIT_TIMEOUT",
        17 => "IOCRL_FAIL: an ioctl to the driver failed",
        46 => "OPER_NOT_PERMITTED: not permitted",
        51 => "TRY_AGAIN: the driver is still starting",
        0xfffe => "NOT_SUPPORT: not supported by this driver or device",
        _ => return None,
    })
}

impl Health {
    /// Maps a DSMI health code to a health.
    pub fn from_code(code: u32) -> Self {
        if code == 0 {
            Health::Healthy
        } else {
            Health::Unhealthy { code }
        }
    }

    /// True when the device can be used.
    pub fn is_healthy(self) -> bool {
        self == Health::Healthy
    }

    /// The health as one number for the compact wire forms: 0 healthy, the DSMI code when
    /// unhealthy (up to 0xFFFFFFFF), and when unreadable `1 << 32` plus the return code's 32
    /// bits, with the call's index in bits 40 and up.
    pub fn to_wire(self) -> u64 {
        match self {
            Health::Healthy => 0,
            Health::Unhealthy { code } => u64::from(code),
            Health::Unreadable { code, call } => {
                let index = DriverCall::ALL.iter().position(|c| *c == call).unwrap_or(0);
                (index as u64) << 40 | 1 << 32 | u64::from(code as u32)
            }
        }
    }

    /// Reads what [`Health::to_wire`] wrote; `None` for a number it never writes.
    pub fn from_wire(wire: u64) -> Option<Health> {
        match (wire >> 40, (wire >> 32) & 0xff) {
            (0, 0) => Some(Health::from_code(wire as u32)),
            (index, 1) => Some(Health::Unreadable {
                code: wire as u32 as i32,
                call: *DriverCall::ALL.get(usize::try_from(index).ok()?)?,
            }),
            _ => None,
        }
    }
}

impl fmt::Display for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Health::Healthy => f.write_str("ok"),
            Health::Unhealthy { code: 1 } => f.write_str("warning (1)"),
            Health::Unhealthy { code: 2 } => f.write_str("important (2)"),
            Health::Unhealthy { code: 3 } => f.write_str("critical (3)"),
            Health::Unhealthy { code: u32::MAX } => f.write_str("offline"),
            Health::Unhealthy { code } => write!(f, "unhealthy ({code})"),
            Health::Unreadable { code, call } => {
                write!(f, "unreadable: {} returned {code}", call.function())?;
                match dsmi_code_meaning(*code) {
                    Some(meaning) => write!(f, " ({meaning})"),
                    None => Ok(()),
                }
            }
        }
    }
}

/// The chip family, which decides the rank-table rules HCCL applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Chip {
    /// Atlas 910 (training series): 8 devices per server in two groups of four.
    #[serde(rename = "910")]
    Ascend910,
    /// Atlas A2 (910B): per-server device counts may differ.
    #[serde(rename = "910b")]
    Ascend910B,
    /// Atlas A3 (910_93, SuperPoD): two dies per NPU.
    #[serde(rename = "910_93")]
    Ascend910_93,
}

impl Chip {
    /// Every chip, in the spelling `--chip` accepts.
    pub const ALL: [Chip; 3] = [Chip::Ascend910, Chip::Ascend910B, Chip::Ascend910_93];

    /// The spelling used by `--chip`.
    pub fn as_str(self) -> &'static str {
        match self {
            Chip::Ascend910 => "910",
            Chip::Ascend910B => "910b",
            Chip::Ascend910_93 => "910_93",
        }
    }

    /// The chip family of a driver chip name (`910`, `Ascend910B3`, `910_9391`), if known.
    ///
    /// As HCCL maps SoC names to device types (`dev_type.h`): a bare `910B` is a first 910
    /// (with `910A`, `910ProA`, `910ProB`, `910PremiumA`); only a `910B` followed by a digit
    /// (`910B1`-`910B4`, `910B2C`, `910B4-1`) is an Atlas A2.
    pub fn from_driver_name(name: &str) -> Option<Chip> {
        let lower = name.trim().to_ascii_lowercase();
        let bare = lower.strip_prefix("ascend").unwrap_or(&lower);
        let a2_model = bare
            .strip_prefix("910b")
            .is_some_and(|model| model.starts_with(|c: char| c.is_ascii_digit()));
        if bare.starts_with("910_93") {
            Some(Chip::Ascend910_93)
        } else if a2_model {
            Some(Chip::Ascend910B)
        } else if ["910", "910a", "910b"].contains(&bare)
            || bare.starts_with("910pro")
            || bare.starts_with("910premium")
        {
            Some(Chip::Ascend910)
        } else {
            None
        }
    }

    /// Whether HCCL runs a server of `n` devices of this chip: on 910 only 1, 2, 4 or 8.
    pub fn allows_device_count(self, n: usize) -> bool {
        self != Chip::Ascend910 || [1, 2, 4, 8].contains(&n)
    }

    /// Whether HCCL needs every server of a table to have as many devices (910; on 910_93 it
    /// only recommends it, on 910B not even that).
    pub fn needs_equal_device_counts(self) -> bool {
        self == Chip::Ascend910
    }

    /// The highest `device_id` HCCL accepts on this chip.
    pub fn max_device_id(self) -> u32 {
        match self {
            Chip::Ascend910 => 7,
            Chip::Ascend910B | Chip::Ascend910_93 => 15,
        }
    }
}

impl fmt::Display for Chip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Chip {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        parse_name(&Chip::ALL, Chip::as_str, "chip", s)
    }
}

/// Lists the devices of one host.
///
/// Implementations: simulated devices (`atlasboost-sim`), the DSMI driver and `/etc/hccn.conf`
/// (`atlasboost-dsmi`). Probes are picked explicitly; none is a silent fallback for another.
pub trait DeviceProbe: Send + Sync {
    /// A short name for messages (`sim`, `dsmi`, `hccn`).
    fn name(&self) -> &str;

    /// Where the devices come from, for a reader who must know which one was used (the
    /// driver library loaded, the hccn.conf read), with what it cannot tell; `None` for a
    /// source that is not a file.
    fn source(&self) -> Option<String> {
        None
    }

    /// The devices of this host, sorted by physical id.
    ///
    /// # Errors
    ///
    /// [`Error::Probe`] when the source cannot be read; the source error says why.
    fn probe(&self) -> Result<Vec<Device>>;
}

/// Why `ip` cannot be a device's RoCE address, which other servers' devices connect to: the
/// unspecified address (the device has none), the broadcast address, a multicast address, a
/// loopback address (no other server reaches it), or an IPv6 address that holds an IPv4 one
/// (`::ffff:10.0.0.1`, `::10.0.0.1`: the device's address is the IPv4 one, and written so it
/// would escape these checks and the duplicate check). `None` for an address that can be one.
#[must_use]
pub fn device_ip_problem(ip: IpAddr) -> Option<&'static str> {
    match ip {
        _ if ip.is_unspecified() => Some("the unspecified address (the device has none)"),
        IpAddr::V4(v4) if v4.is_broadcast() => Some("the broadcast address"),
        _ if ip.is_multicast() => Some("a multicast address"),
        _ if ip.is_loopback() => Some("a loopback address, which no other server reaches"),
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() => {
            Some("an IPv4-mapped IPv6 address (write the IPv4 address itself)")
        }
        // The deprecated IPv4-compatible form (RFC 4291 §2.5.5.1); `::` and `::1` are above.
        IpAddr::V6(v6) if v6.segments()[..6].iter().all(|s| *s == 0) => {
            Some("an IPv4-compatible IPv6 address (deprecated; write the IPv4 address itself)")
        }
        _ => None,
    }
}

/// A set of physical device ids as given on the command line: `0-3`, `0,1,4`, `0-1,6-7`.
/// Serialised as that text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct DeviceList {
    ids: BTreeSet<u32>,
    /// The list as the user wrote it, for messages.
    text: String,
}

impl DeviceList {
    /// The ids, ascending.
    pub fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.ids.iter().copied()
    }

    /// Whether the list holds `id`.
    pub fn contains(&self, id: u32) -> bool {
        self.ids.contains(&id)
    }
}

impl fmt::Display for DeviceList {
    /// The list as it was typed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl TryFrom<String> for DeviceList {
    type Error = Error;

    fn try_from(s: String) -> Result<Self> {
        s.parse()
    }
}

impl From<DeviceList> for String {
    fn from(list: DeviceList) -> String {
        list.text
    }
}

impl FromStr for DeviceList {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let ids = parse_id_list(s, "device", 1024)
            .map_err(|reason| Error::invalid_value("device list", s, reason))?;
        Ok(DeviceList {
            ids: ids.into_iter().collect(),
            text: s.to_string(),
        })
    }
}

/// Parses an id list as users write them (`0-3`, `0,1,4`, `0-1,6-7`): the ids in the order
/// written. The one parser behind `--devices`, `--ranks` and the visible-devices variables.
///
/// # Errors
///
/// Why the text is not a list, naming the element: an empty element, a word that is not a
/// number, a range that runs backwards or spans more than `max_span` ids, an id given twice.
/// `what` names the ids in the messages (`device`, `rank`).
pub fn parse_id_list(
    text: &str,
    what: &str,
    max_span: u32,
) -> std::result::Result<Vec<u32>, String> {
    let mut ids = Vec::new();
    let mut seen = BTreeSet::new();
    for part in text.split(',') {
        let part = part.trim();
        if part.is_empty() {
            return Err("empty element (expected e.g. 0-3 or 0,1,4)".into());
        }
        let parse = |t: &str| {
            t.trim()
                .parse::<u32>()
                .map_err(|_| format!("{t:?} is not a {what} id"))
        };
        let (lo, hi) = match part.split_once('-') {
            // `-1`: a number with a sign, not a range without its start.
            Some(("", _)) => return Err(format!("{part:?} is not a {what} id")),
            Some((a, b)) => (parse(a)?, parse(b)?),
            None => {
                let id = parse(part)?;
                (id, id)
            }
        };
        if lo > hi {
            return Err(format!("range {part} runs backwards"));
        }
        if hi - lo > max_span {
            return Err(format!("range {part} spans more than {max_span} {what}s"));
        }
        for id in lo..=hi {
            if !seen.insert(id) {
                return Err(format!("{what} {id} is listed twice"));
            }
            ids.push(id);
        }
    }
    Ok(ids)
}

/// Keeps the devices whose physical id is in `list`.
///
/// # Errors
///
/// [`Error::InvalidValue`] naming every listed id that the host does not have.
pub fn select_devices(devices: Vec<Device>, list: &DeviceList) -> Result<Vec<Device>> {
    let missing: Vec<String> = list
        .ids()
        .filter(|id| !devices.iter().any(|d| d.physical_id == *id))
        .map(|id| id.to_string())
        .collect();
    if !missing.is_empty() {
        let server = devices
            .first()
            .map_or("this host", |d| d.server_id.as_str());
        let have: Vec<String> = devices.iter().map(|d| d.physical_id.to_string()).collect();
        return Err(Error::invalid_value(
            "--devices",
            list.text.clone(),
            format!(
                "{server} has no device {} (it has: {})",
                abbreviate(&missing),
                if have.is_empty() {
                    "none".to_string()
                } else {
                    have.join(",")
                }
            ),
        ));
    }
    Ok(devices
        .into_iter()
        .filter(|d| list.contains(d.physical_id))
        .collect())
}

/// `1, 2, 3`, or `8, 9, 10, 11, 12, 13, 14, 15, ... (1017 in all)` for long lists.
fn abbreviate(items: &[String]) -> String {
    const SHOWN: usize = 8;
    if items.len() <= SHOWN {
        items.join(", ")
    } else {
        format!(
            "{}, ... ({} in all)",
            items[..SHOWN].join(", "),
            items.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv4_address_in_ipv6_clothing_is_no_device_address() {
        for (ip, want) in [
            ("::ffff:127.0.0.1", Some("IPv4-mapped")),
            ("::ffff:10.0.0.1", Some("IPv4-mapped")),
            ("::10.0.0.1", Some("IPv4-compatible")),
            ("::1", Some("loopback")),
            ("::", Some("unspecified")),
            ("fe80::1", None),
            ("2001:db8::a00:1", None),
            ("10.0.0.1", None),
        ] {
            let got = device_ip_problem(ip.parse().unwrap_or_else(|e| panic!("{ip}: {e}")));
            match want {
                Some(w) => assert!(got.is_some_and(|g| g.contains(w)), "{ip}: {got:?}"),
                None => assert_eq!(got, None, "{ip}"),
            }
        }
    }

    #[test]
    fn health_survives_its_wire_form_and_strangers_are_refused() {
        for h in [
            Health::Healthy,
            Health::Unhealthy { code: 3 },
            Health::Unhealthy { code: u32::MAX },
            Health::Unreadable {
                code: 13,
                call: DriverCall::IpAddress,
            },
            Health::Unreadable {
                code: -8005,
                call: DriverCall::Health,
            },
        ] {
            assert_eq!(Health::from_wire(h.to_wire()), Some(h), "{h}");
        }
        assert_eq!(Health::from_wire(2 << 32), None);
        assert_eq!(Health::from_wire(9 << 40 | 1 << 32), None);
        assert_eq!(
            Health::Unreadable {
                code: -8005,
                call: DriverCall::Health
            }
            .to_string(),
            "unreadable: dsmi_get_device_health returned -8005"
        );
        assert_eq!(
            Health::Unreadable {
                code: 13,
                call: DriverCall::ChipInfo
            }
            .to_string(),
            "unreadable: dsmi_get_chip_info returned 13 (BUSY: the device is busy)"
        );
    }

    #[test]
    fn device_lists_parse_ranges_and_singles() {
        let l: DeviceList = "0-1,4, 6-7".parse().unwrap();
        assert_eq!(l.ids().collect::<Vec<_>>(), vec![0, 1, 4, 6, 7]);
    }

    #[test]
    fn device_lists_reject_bad_input_naming_it() {
        for (input, needle) in [
            ("", "empty"),
            ("1,,2", "empty"),
            ("a", "\"a\" is not a device id"),
            ("3-1", "backwards"),
            ("1,1", "listed twice"),
            ("0-99999", "spans more than 1024 devices"),
            ("-1", "\"-1\" is not a device id"),
        ] {
            let err = input.parse::<DeviceList>().unwrap_err().to_string();
            assert!(err.contains(needle), "{input:?}: {err}");
        }
    }

    #[test]
    fn chip_names_from_the_driver() {
        assert_eq!(Chip::from_driver_name("910"), Some(Chip::Ascend910));
        assert_eq!(
            Chip::from_driver_name("Ascend910B3"),
            Some(Chip::Ascend910B)
        );
        assert_eq!(Chip::from_driver_name("910_9391"), Some(Chip::Ascend910_93));
        assert_eq!(Chip::from_driver_name("310P"), None);
        // HCCL's own names: a bare 910B is a first 910; the A2 has a model number.
        for first in [
            "910B",
            "Ascend910B",
            "910A",
            "910ProA",
            "910ProB",
            "910PremiumA",
        ] {
            assert_eq!(
                Chip::from_driver_name(first),
                Some(Chip::Ascend910),
                "{first}"
            );
        }
        for a2 in ["910B1", "910B2C", "Ascend910B4", "910B4-1"] {
            assert_eq!(Chip::from_driver_name(a2), Some(Chip::Ascend910B), "{a2}");
        }
        for unknown in ["910Bx", "910C", "9101", ""] {
            assert_eq!(Chip::from_driver_name(unknown), None, "{unknown}");
        }
        assert_eq!("910B".parse::<Chip>().unwrap(), Chip::Ascend910B);
        assert!("911".parse::<Chip>().is_err());
    }
}
