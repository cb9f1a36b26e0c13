//! What every driver version has: the five mandatory functions, the simulated topology and the
//! fault list, read from the environment at each call.
//!
//! Both fake libraries compile this file (the old one includes it by path), so it names
//! nothing from the rest of its crate.

use std::ffi::{c_int, c_uint};
use std::io::Write;
use std::net::Ipv6Addr;
use std::sync::{Mutex, PoisonError};

use atlasboost_core::EnvVars;

/// `DRV_ERROR_NONE`.
pub(crate) const SUCCESS: c_int = 0;
/// `DRV_ERROR_NO_DEVICE`: what the real driver answers for a port with no address of the
/// family asked for (its own hccn tool reads it as "IP not configured").
pub(crate) const NO_DEVICE: c_int = 1;
/// `DRV_ERROR_INNER_ERR`: what `dsmi_get_device_count` answers on a host with no device.
pub(crate) const INNER_ERR: c_int = 7;
/// `DRV_ERROR_TRY_AGAIN`: the driver is still starting.
pub(crate) const TRY_AGAIN: c_int = 51;
/// `DRV_ERROR_INVALID_DEVICE`: no such logical or physical id.
pub(crate) const INVALID_DEVICE: c_int = 2;
/// `DRV_ERROR_INVALID_VALUE`: what every call returns while the environment is malformed.
pub(crate) const INVALID_VALUE: c_int = 3;
/// `DRV_ERROR_PARA_ERROR`: a null pointer or an argument out of range.
pub(crate) const PARA_ERROR: c_int = 8;
/// `DRV_ERROR_NOT_SUPPORT`: a port type other than VNIC and RoCE.
pub(crate) const NOT_SUPPORT: c_int = 0xfffe;

/// The most devices the fake serves.
const MAX_DEVICES: usize = 64;
/// The largest physical id: `192.168.100.(101 + 153)` is the last host address of the /24.
const MAX_PHYSICAL_ID: u32 = 153;
/// The health an `unhealthy:<physical>` fault reports without `=<code>` (critical).
const DEFAULT_UNHEALTHY: c_uint = 3;
/// `port_type` of the VNIC port.
const PORT_VNIC: c_int = 0;
/// `port_type` of the RoCE port (the one atlasboost asks for).
const PORT_ROCE: c_int = 1;

/// The functions a `fail:` fault may name (the old library lacks the last two, but accepts
/// faults naming them, so one fault list serves both).
const FUNCTIONS: [&str; 12] = [
    "dsmi_get_device_count",
    "dsmi_list_device",
    "dsmi_get_phyid_from_logicid",
    "dsmi_get_logicid_from_phyid",
    "dsmi_get_device_ip_address",
    "dsmi_get_chip_info",
    "dsmi_get_device_health",
    "dsmi_get_device_utilization_rate",
    "dsmi_get_device_temperature",
    "dsmi_get_device_power_info",
    "dsmi_get_hbm_info",
    "dsmi_get_device_errorcode",
];
/// The functions that take no device, so a `fail:<function>@<logical>` cannot name them.
const DEVICELESS: [&str; 2] = ["dsmi_get_device_count", "dsmi_list_device"];

/// `ip_type` of an IPv4 address (`IPADDR_TYPE_V4`).
pub const IPADDR_TYPE_V4: c_uint = 0;
/// `ip_type` of an IPv6 address (`IPADDR_TYPE_V6`).
pub const IPADDR_TYPE_V6: c_uint = 1;

/// The driver's `ip_addr_t`: a 16-byte union of `ip6[16]`/`ip4[4]`, then `enum ip_addr_type`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpAddrT {
    /// The address: IPv4 in bytes `0..4` in dotted order, IPv6 in network order.
    pub u_addr: [u8; 16],
    /// [`IPADDR_TYPE_V4`] or [`IPADDR_TYPE_V6`].
    pub ip_type: c_uint,
}
const _: () = assert!(size_of::<IpAddrT>() == 20);
const _: () = assert!(align_of::<IpAddrT>() == 4);

/// One injected fault (see the crate docs for the syntax).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Fault {
    /// `fail:<function>[@<logical>]=<code>`.
    Fail {
        function: &'static str,
        logical: Option<u32>,
        code: c_int,
    },
    /// `no-ip:<physical>`.
    NoIp { physical: u32 },
    /// `unhealthy:<physical>[=<code>]`.
    Unhealthy { physical: u32, code: c_uint },
    /// `try-again:<function>[=<times>]`: `TRY_AGAIN` for the first `times` calls (for ever
    /// without `=`), as a driver that is still starting.
    TryAgain {
        function: &'static str,
        times: Option<u32>,
    },
    /// `errorcode:<physical>=<code>`: `dsmi_get_device_errorcode` reports `code` for it.
    ErrorCode { physical: u32, code: c_uint },
    /// `hang:<function>[@<logical>]=<milliseconds>`: the call takes that long before it
    /// answers, as a driver whose NPU is wedged.
    Hang {
        function: &'static str,
        logical: Option<u32>,
        millis: u64,
    },
}

/// How `dsmi_get_device_ip_address` treats `ip_addr_t::ip_type` (`ATLASBOOST_FAKE_DSMI_IP_API`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IpApi {
    /// `current`, as the real driver (`dsmi_common_interface.c`): the caller's `ip_type` picks
    /// the family (anything but V4 and V6 is `PARA_ERROR`), only the address bytes are written,
    /// and a port with no address of that family answers `NO_DEVICE`.
    Current,
    /// `old`, as this fake behaved before: the type asked for is ignored, the device's own
    /// type is written back, and a port with no address answers success with `0.0.0.0`.
    Old,
}

/// The simulated host, as the environment describes it at the moment of a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Config {
    /// The physical id of each logical id (the index).
    physical: Vec<u32>,
    /// `chip_name` of every device.
    chip_name: String,
    /// IPv6 device addresses instead of IPv4.
    ipv6: bool,
    /// How the address call treats `ip_type`.
    ip_api: IpApi,
    /// The faults, in the order written (the first that matches applies).
    faults: Vec<Fault>,
}

/// A malformed environment variable.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Malformed {
    /// The variable.
    var: &'static str,
    /// The bad part of its value.
    part: String,
    /// What is wrong with it.
    reason: String,
}

impl Malformed {
    fn new(var: &'static str, part: &str, reason: impl Into<String>) -> Self {
        Self {
            var,
            part: part.to_owned(),
            reason: reason.into(),
        }
    }

    /// Writes one line to stderr, unless the last report was the same line (a driver can't
    /// return a message; this is the best it can do).
    fn report(&self) {
        static LAST: Mutex<String> = Mutex::new(String::new());
        let line = format!(
            "atlasboost-fake-dsmi: malformed {}: {:?}: {}; every driver call returns {INVALID_VALUE} (INVALID_VALUE)",
            self.var, self.part, self.reason
        );
        let mut last = LAST.lock().unwrap_or_else(PoisonError::into_inner);
        if *last != line {
            // No eprintln!: a panic must not unwind out of an `extern "C"` function.
            let _ = writeln!(std::io::stderr(), "{line}");
            *last = line;
        }
    }
}

/// A variable's value; unset, empty and unset are the same.
fn var(name: &'static str) -> Result<Option<String>, Malformed> {
    #[cfg(test)]
    let value = test_env::get(name);
    #[cfg(not(test))]
    let value = match std::env::var(name) {
        Ok(value) => Some(value),
        Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(raw)) => {
            return Err(Malformed::new(name, &raw.to_string_lossy(), "not UTF-8"));
        }
    };
    Ok(value.filter(|value| !value.is_empty()))
}

/// The `0x` digits of a hex number.
fn hex_digits(text: &str) -> Option<&str> {
    text.strip_prefix("0x").or_else(|| text.strip_prefix("0X"))
}

/// An `int` return code: decimal (`-1`, `65534`) or the 32 bits in hex (`0xfffe`, `0xffffffff`).
fn parse_int(text: &str) -> Option<c_int> {
    match hex_digits(text) {
        Some(digits) => u32::from_str_radix(digits, 16).ok().map(u32::cast_signed),
        None => text.parse().ok(),
    }
}

/// An `unsigned int`: decimal or `0x` hex.
fn parse_uint(text: &str) -> Option<c_uint> {
    match hex_digits(text) {
        Some(digits) => u32::from_str_radix(digits, 16).ok(),
        None => text.parse().ok(),
    }
}

impl Config {
    /// Reads the five `ATLASBOOST_FAKE_DSMI_*` variables.
    fn from_env() -> Result<Self, Malformed> {
        let count = match var(EnvVars::ATLASBOOST_FAKE_DSMI_DEVICES)? {
            None => None,
            Some(text) => Some(
                text.trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|count| *count <= MAX_DEVICES)
                    .ok_or_else(|| {
                        let reason = format!("expected a device count from 0 to {MAX_DEVICES}");
                        Malformed::new(EnvVars::ATLASBOOST_FAKE_DSMI_DEVICES, &text, reason)
                    })?,
            ),
        };
        let physical = match var(EnvVars::ATLASBOOST_FAKE_DSMI_PHYSICAL)? {
            None => (0..).take(count.unwrap_or(8)).collect(),
            Some(text) => parse_physical(&text, count)?,
        };
        let chip_name = var(EnvVars::ATLASBOOST_FAKE_DSMI_CHIP)?.unwrap_or_else(|| "910".into());
        if chip_name.len() > 31 {
            let reason = "longer than 31 bytes (chip_name is char[32], NUL-terminated)";
            return Err(Malformed::new(
                EnvVars::ATLASBOOST_FAKE_DSMI_CHIP,
                &chip_name,
                reason,
            ));
        }
        let ipv6 = match var(EnvVars::ATLASBOOST_FAKE_DSMI_IP)?
            .as_deref()
            .map(str::trim)
        {
            None | Some("v4") => false,
            Some("v6") => true,
            Some(other) => {
                let var = EnvVars::ATLASBOOST_FAKE_DSMI_IP;
                return Err(Malformed::new(var, other, "expected v4 or v6"));
            }
        };
        let parse = |text: &str| -> Result<Vec<Fault>, Malformed> {
            text.split(';')
                .map(str::trim)
                .filter(|fault| !fault.is_empty())
                .map(|fault| parse_fault(fault, &physical))
                .collect()
        };
        let mut faults = parse(&var(EnvVars::ATLASBOOST_FAKE_DSMI_FAULTS)?.unwrap_or_default())?;
        if let Some(path) = var(EnvVars::ATLASBOOST_FAKE_DSMI_FAULTS_FILE)? {
            // Read at every call, so a test can fail a device between two probes; a file not
            // there (yet) injects nothing.
            let file = EnvVars::ATLASBOOST_FAKE_DSMI_FAULTS_FILE;
            let text = match std::fs::read_to_string(&path) {
                Ok(text) => text.lines().collect::<Vec<_>>().join(";"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
                Err(e) => return Err(Malformed::new(file, &path, format!("cannot be read: {e}"))),
            };
            let more = parse(&text).map_err(|e| Malformed {
                var: file,
                part: format!("{path}: {}", e.part),
                reason: e.reason,
            })?;
            faults.extend(more);
        }
        let ip_api = match var(EnvVars::ATLASBOOST_FAKE_DSMI_IP_API)?
            .as_deref()
            .map(str::trim)
        {
            None | Some("current") => IpApi::Current,
            Some("old") => IpApi::Old,
            Some(other) => {
                let var = EnvVars::ATLASBOOST_FAKE_DSMI_IP_API;
                return Err(Malformed::new(var, other, "expected current or old"));
            }
        };
        Ok(Self {
            physical,
            chip_name,
            ipv6,
            ip_api,
            faults,
        })
    }

    /// The physical id of a logical one, or `INVALID_DEVICE`.
    pub(crate) fn physical_id(&self, logical: i64) -> Result<u32, c_int> {
        usize::try_from(logical)
            .ok()
            .and_then(|index| self.physical.get(index).copied())
            .ok_or(INVALID_DEVICE)
    }

    /// The logical id of a physical one.
    fn logical_id(&self, physical: u32) -> Option<u32> {
        let index = self.physical.iter().position(|p| *p == physical)?;
        u32::try_from(index).ok()
    }

    /// The `chip_name` every device reports.
    pub(crate) fn chip_name(&self) -> &str {
        &self.chip_name
    }

    /// The error codes of a device: every `errorcode:` fault naming it, in order.
    #[allow(dead_code)] // The old library has no dsmi_get_device_errorcode.
    pub(crate) fn error_codes(&self, physical: u32) -> Vec<c_uint> {
        self.faults
            .iter()
            .filter_map(|fault| match *fault {
                Fault::ErrorCode { physical: p, code } if p == physical => Some(code),
                _ => None,
            })
            .collect()
    }

    /// The health code of a device: the first `unhealthy:` fault naming it, else 0 (OK).
    pub(crate) fn health(&self, physical: u32) -> c_uint {
        self.faults
            .iter()
            .find_map(|fault| match *fault {
                Fault::Unhealthy { physical: p, code } if p == physical => Some(code),
                _ => None,
            })
            .unwrap_or(0)
    }

    /// The RoCE (and VNIC) address and mask of a device: `192.168.100.(101 + physical)`/24 or
    /// `fd00::ab:(physical + 1)`/64.
    fn address(&self, physical: u32) -> (IpAddrT, IpAddrT) {
        let mut ip = IpAddrT {
            u_addr: [0; 16],
            ip_type: IPADDR_TYPE_V4,
        };
        let mut mask = ip;
        if self.faults.contains(&Fault::NoIp { physical }) {
            // 0.0.0.0, mask 0.0.0.0: the port has no address configured.
        } else if self.ipv6 {
            let last = u16::try_from(physical + 1).unwrap_or(u16::MAX);
            ip.u_addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0xab, last).octets();
            ip.ip_type = IPADDR_TYPE_V6;
            mask.u_addr[..8].fill(0xff);
            mask.ip_type = IPADDR_TYPE_V6;
        } else {
            // Physical ids are at most 153, so 101 + physical fits.
            let last = u8::try_from(101 + physical).unwrap_or(u8::MAX);
            ip.u_addr[..4].copy_from_slice(&[192, 168, 100, last]);
            mask.u_addr[..4].copy_from_slice(&[255, 255, 255, 0]);
        }
        (ip, mask)
    }
}

/// `ATLASBOOST_FAKE_DSMI_PHYSICAL`: distinct physical ids, as many as `count` if that is set.
fn parse_physical(text: &str, count: Option<usize>) -> Result<Vec<u32>, Malformed> {
    let var = EnvVars::ATLASBOOST_FAKE_DSMI_PHYSICAL;
    let mut physical = Vec::new();
    for part in text.split(',').map(str::trim) {
        let id = part
            .parse::<u32>()
            .ok()
            .filter(|id| *id <= MAX_PHYSICAL_ID)
            .ok_or_else(|| {
                let reason = format!("expected a physical id from 0 to {MAX_PHYSICAL_ID}");
                Malformed::new(var, part, reason)
            })?;
        if physical.contains(&id) {
            return Err(Malformed::new(var, part, "physical id listed twice"));
        }
        physical.push(id);
    }
    if physical.len() > MAX_DEVICES {
        let reason = format!("{} ids; at most {MAX_DEVICES}", physical.len());
        return Err(Malformed::new(var, text, reason));
    }
    match count {
        Some(count) if count != physical.len() => {
            let reason = format!(
                "{} ids, but {} is {count}",
                physical.len(),
                EnvVars::ATLASBOOST_FAKE_DSMI_DEVICES
            );
            Err(Malformed::new(var, text, reason))
        }
        _ => Ok(physical),
    }
}

/// The C name of a function a fault may name.
fn known_function(name: &str) -> Option<&'static str> {
    FUNCTIONS.iter().find(|known| **known == name).copied()
}

/// One element of `ATLASBOOST_FAKE_DSMI_FAULTS`; the ids it names must exist.
fn parse_fault(fault: &str, physical: &[u32]) -> Result<Fault, Malformed> {
    let bad = |reason: String| Malformed::new(EnvVars::ATLASBOOST_FAKE_DSMI_FAULTS, fault, reason);
    let existing_physical = |text: &str| {
        text.trim()
            .parse::<u32>()
            .ok()
            .filter(|id| physical.contains(id))
            .ok_or_else(|| {
                bad(format!(
                    "no device with physical id {text:?} (the physical ids are {physical:?})"
                ))
            })
    };
    let hang = fault.strip_prefix("hang:");
    if let Some(rest) = fault.strip_prefix("fail:").or(hang) {
        let (target, value) = rest.split_once('=').ok_or_else(|| {
            bad(match hang {
                Some(_) => "expected hang:<function>[@<logical>]=<milliseconds>".into(),
                None => "expected fail:<function>[@<logical>]=<code>".into(),
            })
        })?;
        let code = match hang {
            Some(_) => 0,
            None => {
                parse_int(value.trim()).ok_or_else(|| bad(format!("bad return code {value:?}")))?
            }
        };
        let millis = match hang {
            Some(_) => value
                .trim()
                .parse::<u64>()
                .map_err(|_| bad(format!("bad number of milliseconds {value:?}")))?,
            None => 0,
        };
        let (function, logical) = match target.split_once('@') {
            Some((function, logical)) => (function.trim(), Some(logical.trim())),
            None => (target.trim(), None),
        };
        let function = known_function(function).ok_or_else(|| {
            bad(format!(
                "unknown function {function:?} (expected one of {FUNCTIONS:?})"
            ))
        })?;
        let logical = match logical {
            None => None,
            Some(_) if DEVICELESS.contains(&function) => {
                return Err(bad(format!(
                    "{function} takes no device, so it cannot fail @<logical>"
                )));
            }
            Some(text) => Some(
                text.parse::<u32>()
                    .ok()
                    .filter(|id| usize::try_from(*id).is_ok_and(|id| id < physical.len()))
                    .ok_or_else(|| {
                        bad(format!(
                            "no logical device {text:?} (there are {})",
                            physical.len()
                        ))
                    })?,
            ),
        };
        Ok(match hang {
            Some(_) => Fault::Hang {
                function,
                logical,
                millis,
            },
            None => Fault::Fail {
                function,
                logical,
                code,
            },
        })
    } else if let Some(id) = fault.strip_prefix("no-ip:") {
        Ok(Fault::NoIp {
            physical: existing_physical(id)?,
        })
    } else if let Some(rest) = fault.strip_prefix("unhealthy:") {
        let (id, code) = match rest.split_once('=') {
            None => (rest, DEFAULT_UNHEALTHY),
            Some((id, code)) => {
                let code = parse_uint(code.trim())
                    .ok_or_else(|| bad(format!("bad health code {code:?}")))?;
                (id, code)
            }
        };
        Ok(Fault::Unhealthy {
            physical: existing_physical(id)?,
            code,
        })
    } else if let Some(rest) = fault.strip_prefix("errorcode:") {
        let (id, code) = rest
            .split_once('=')
            .ok_or_else(|| bad("expected errorcode:<physical>=<code>".into()))?;
        let code =
            parse_uint(code.trim()).ok_or_else(|| bad(format!("bad error code {code:?}")))?;
        Ok(Fault::ErrorCode {
            physical: existing_physical(id)?,
            code,
        })
    } else if let Some(rest) = fault.strip_prefix("try-again:") {
        let (function, times) = match rest.split_once('=') {
            None => (rest.trim(), None),
            Some((function, times)) => {
                let times = times
                    .trim()
                    .parse::<u32>()
                    .map_err(|_| bad(format!("bad count {times:?} (a number of calls)")))?;
                (function.trim(), Some(times))
            }
        };
        let function = known_function(function).ok_or_else(|| {
            bad(format!(
                "unknown function {function:?} (expected one of {FUNCTIONS:?})"
            ))
        })?;
        Ok(Fault::TryAgain { function, times })
    } else {
        Err(bad(
            "expected fail:, no-ip:, unhealthy:, errorcode: or try-again:".into(),
        ))
    }
}

thread_local! {
    /// How many calls of each function a `try-again:` fault has answered, on this thread (a
    /// probe makes its calls from one thread; tests run on many).
    static TRY_AGAIN_ANSWERED: std::cell::RefCell<std::collections::HashMap<&'static str, u32>> =
        std::cell::RefCell::default();
}

/// Forgets the `try-again:` counts of this thread (tests).
#[cfg(test)]
pub(crate) fn reset_try_again() {
    TRY_AGAIN_ANSWERED.with(|a| a.borrow_mut().clear());
}

/// Runs one driver function: reads the environment (malformed: report it, return
/// `INVALID_VALUE`), returns the code of the first `fail:` fault that names `function` (and the
/// logical device `device` picks, if the fault has `@`), else runs `body`.
pub(crate) fn call(
    function: &'static str,
    device: impl FnOnce(&Config) -> Option<u32>,
    body: impl FnOnce(&Config) -> Result<(), c_int>,
) -> c_int {
    let config = match Config::from_env() {
        Ok(config) => config,
        Err(malformed) => {
            malformed.report();
            return INVALID_VALUE;
        }
    };
    let device = device(&config);
    for fault in &config.faults {
        if let Fault::Hang {
            function: f,
            logical,
            millis,
        } = *fault
            && f == function
            && (logical.is_none() || logical == device)
        {
            std::thread::sleep(std::time::Duration::from_millis(millis));
        }
    }
    let still_starting = config.faults.iter().any(|fault| match *fault {
        Fault::TryAgain { function: f, times } if f == function => {
            TRY_AGAIN_ANSWERED.with(|answered| {
                let mut answered = answered.borrow_mut();
                let count = answered.entry(function).or_insert(0);
                let again = times.is_none_or(|t| *count < t);
                if again {
                    *count += 1;
                }
                again
            })
        }
        _ => false,
    });
    if still_starting {
        return TRY_AGAIN;
    }
    let injected = config.faults.iter().find_map(|fault| match *fault {
        Fault::Fail {
            function: f,
            logical,
            code,
        } if f == function && (logical.is_none() || logical == device) => Some(code),
        _ => None,
    });
    match injected.map_or_else(|| body(&config), Err) {
        Ok(()) => SUCCESS,
        Err(code) => code,
    }
}

/// `int dsmi_get_device_count(int *device_count)`: the number of devices.
///
/// # Safety
///
/// `device_count` is null or points to a writable `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dsmi_get_device_count(device_count: *mut c_int) -> c_int {
    call(
        "dsmi_get_device_count",
        |_| None,
        |config| {
            if device_count.is_null() {
                return Err(PARA_ERROR);
            }
            // The real driver answers a host with no device with INNER_ERR, not 0.
            if config.physical.is_empty() {
                return Err(INNER_ERR);
            }
            let count = c_int::try_from(config.physical.len()).map_err(|_| INVALID_VALUE)?;
            // SAFETY: non-null, and the caller passes a writable `int` (the C contract).
            unsafe { device_count.write(count) };
            Ok(())
        },
    )
}

/// `int dsmi_list_device(int device_id_list[], int count)`: the logical ids `0..n`.
///
/// # Safety
///
/// `device_id_list` is null or points to `count` writable `int`s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dsmi_list_device(device_id_list: *mut c_int, count: c_int) -> c_int {
    call(
        "dsmi_list_device",
        |_| None,
        |config| {
            let devices = config.physical.len();
            // The real driver refuses a count of 0 or less, or above 64, as well as one too
            // small for the devices.
            if device_id_list.is_null()
                || !usize::try_from(count)
                    .is_ok_and(|count| count >= devices && (1..=MAX_DEVICES).contains(&count))
            {
                return Err(PARA_ERROR);
            }
            // SAFETY: non-null, and the caller's array holds `count >= devices` writable `int`s.
            let list = unsafe { std::slice::from_raw_parts_mut(device_id_list, devices) };
            for (slot, logical) in list.iter_mut().zip(0..) {
                *slot = logical;
            }
            Ok(())
        },
    )
}

/// `int dsmi_get_phyid_from_logicid(unsigned int logicid, unsigned int *phyid)`.
///
/// # Safety
///
/// `phyid` is null or points to a writable `unsigned int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dsmi_get_phyid_from_logicid(logicid: c_uint, phyid: *mut c_uint) -> c_int {
    call(
        "dsmi_get_phyid_from_logicid",
        |_| Some(logicid),
        |config| {
            if phyid.is_null() {
                return Err(PARA_ERROR);
            }
            let physical = config.physical_id(i64::from(logicid))?;
            // SAFETY: non-null, and the caller passes a writable `unsigned int` (the C contract).
            unsafe { phyid.write(physical) };
            Ok(())
        },
    )
}

/// `int dsmi_get_logicid_from_phyid(unsigned int phyid, unsigned int *logicid)`.
///
/// # Safety
///
/// `logicid` is null or points to a writable `unsigned int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dsmi_get_logicid_from_phyid(phyid: c_uint, logicid: *mut c_uint) -> c_int {
    let function = "dsmi_get_logicid_from_phyid";
    call(
        function,
        |config| config.logical_id(phyid),
        |config| {
            if logicid.is_null() {
                return Err(PARA_ERROR);
            }
            let logical = config.logical_id(phyid).ok_or(INVALID_DEVICE)?;
            // SAFETY: non-null, and the caller passes a writable `unsigned int` (the C contract).
            unsafe { logicid.write(logical) };
            Ok(())
        },
    )
}

/// `int dsmi_get_device_ip_address(int device_id, int port_type, int port_id, ip_addr_t
/// *ip_address, ip_addr_t *mask_address)`: the address of a logical device's VNIC (port type
/// 0) or RoCE (1) port; both are the same here.
///
/// # Safety
///
/// `ip_address` and `mask_address` are null or point to writable `ip_addr_t`s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dsmi_get_device_ip_address(
    device_id: c_int,
    port_type: c_int,
    port_id: c_int,
    ip_address: *mut IpAddrT,
    mask_address: *mut IpAddrT,
) -> c_int {
    let function = "dsmi_get_device_ip_address";
    call(
        function,
        |_| u32::try_from(device_id).ok(),
        |config| {
            if ip_address.is_null() || mask_address.is_null() {
                return Err(PARA_ERROR);
            }
            let physical = config.physical_id(i64::from(device_id))?;
            if !(0..=255).contains(&port_type) || !(0..=255).contains(&port_id) {
                return Err(PARA_ERROR);
            }
            if port_type != PORT_VNIC && port_type != PORT_ROCE {
                return Err(NOT_SUPPORT);
            }
            let (ip, mask) = config.address(physical);
            match config.ip_api {
                IpApi::Old => {
                    // SAFETY: both non-null, and the caller passes writable `ip_addr_t`s.
                    unsafe {
                        ip_address.write(ip);
                        mask_address.write(mask);
                    }
                }
                IpApi::Current => {
                    // SAFETY: non-null, and the caller passes a readable `ip_addr_t`.
                    let asked = unsafe { (*ip_address).ip_type };
                    if asked != IPADDR_TYPE_V4 && asked != IPADDR_TYPE_V6 {
                        return Err(PARA_ERROR);
                    }
                    let none = ip.u_addr == [0; 16];
                    if none || ip.ip_type != asked {
                        return Err(NO_DEVICE);
                    }
                    // Only the bytes: the type stays the caller's.
                    // SAFETY: both non-null, and the caller passes writable `ip_addr_t`s.
                    unsafe {
                        (*ip_address).u_addr = ip.u_addr;
                        (*mask_address).u_addr = mask.u_addr;
                    }
                }
            }
            Ok(())
        },
    )
}

/// Tests' stand-in for the process environment: a per-thread map, so tests running in parallel
/// can each set their own topology and call the exported functions directly.
#[cfg(test)]
pub(crate) mod test_env {
    use std::cell::RefCell;
    use std::collections::HashMap;

    thread_local! {
        static VARS: RefCell<HashMap<&'static str, String>> = RefCell::default();
    }

    /// Replaces this thread's whole environment.
    pub(crate) fn set(vars: &[(&'static str, &str)]) {
        let vars = vars
            .iter()
            .map(|(name, value)| (*name, (*value).to_owned()))
            .collect();
        VARS.with(|map| *map.borrow_mut() = vars);
    }

    pub(super) fn get(name: &str) -> Option<String> {
        VARS.with(|map| map.borrow().get(name).cloned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEVICES: &str = EnvVars::ATLASBOOST_FAKE_DSMI_DEVICES;
    const PHYSICAL: &str = EnvVars::ATLASBOOST_FAKE_DSMI_PHYSICAL;
    const CHIP: &str = EnvVars::ATLASBOOST_FAKE_DSMI_CHIP;
    const IP: &str = EnvVars::ATLASBOOST_FAKE_DSMI_IP;
    const FAULTS: &str = EnvVars::ATLASBOOST_FAKE_DSMI_FAULTS;
    const IP_API: &str = EnvVars::ATLASBOOST_FAKE_DSMI_IP_API;

    fn count() -> (c_int, c_int) {
        let mut count = -1;
        // SAFETY: a valid pointer to a local.
        let rc = unsafe { dsmi_get_device_count(&mut count) };
        (rc, count)
    }

    fn list(capacity: usize) -> (c_int, Vec<c_int>) {
        let mut ids = vec![-1; capacity];
        let len = c_int::try_from(capacity).unwrap_or(c_int::MAX);
        // SAFETY: the vector holds `len` ints.
        let rc = unsafe { dsmi_list_device(ids.as_mut_ptr(), len) };
        (rc, ids)
    }

    fn phy(logical: c_uint) -> (c_int, c_uint) {
        let mut out = 999;
        // SAFETY: a valid pointer to a local.
        let rc = unsafe { dsmi_get_phyid_from_logicid(logical, &mut out) };
        (rc, out)
    }

    fn logic(physical: c_uint) -> (c_int, c_uint) {
        let mut out = 999;
        // SAFETY: a valid pointer to a local.
        let rc = unsafe { dsmi_get_logicid_from_phyid(physical, &mut out) };
        (rc, out)
    }

    fn ip(logical: c_int, port_type: c_int) -> (c_int, IpAddrT, IpAddrT) {
        ip_as(logical, port_type, IPADDR_TYPE_V4)
    }

    /// The address of the family `asked` (the in-and-out `ip_type`); the bytes start as 0xee,
    /// so a test sees what the call wrote.
    fn ip_as(logical: c_int, port_type: c_int, asked: c_uint) -> (c_int, IpAddrT, IpAddrT) {
        let mut ip = IpAddrT {
            u_addr: [0xee; 16],
            ip_type: asked,
        };
        let mut mask = ip;
        // SAFETY: valid pointers to locals.
        let rc = unsafe { dsmi_get_device_ip_address(logical, port_type, 0, &mut ip, &mut mask) };
        (rc, ip, mask)
    }

    fn v4(bytes: [u8; 4]) -> IpAddrT {
        let mut u_addr = [0; 16];
        u_addr[..4].copy_from_slice(&bytes);
        IpAddrT {
            u_addr,
            ip_type: IPADDR_TYPE_V4,
        }
    }

    #[test]
    fn defaults_are_eight_devices_with_physical_equal_to_logical() {
        test_env::set(&[]);
        assert_eq!(count(), (0, 8));
        assert_eq!(list(8), (0, (0..8).collect()));
        assert_eq!(list(10), (0, vec![0, 1, 2, 3, 4, 5, 6, 7, -1, -1]));
        assert_eq!(phy(5), (0, 5));
        assert_eq!(logic(5), (0, 5));
        assert_eq!(phy(8), (INVALID_DEVICE, 999));
        assert_eq!(logic(8), (INVALID_DEVICE, 999));
    }

    #[test]
    fn a_faults_file_is_read_at_every_call() {
        let dir = std::env::temp_dir().join(format!("fake-dsmi-faults-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("faults");
        let path = file.to_str().unwrap().to_string();
        test_env::set(&[(EnvVars::ATLASBOOST_FAKE_DSMI_FAULTS_FILE, path.as_str())]);
        // Not there yet: no fault.
        assert_eq!(Config::from_env().map(|c| c.health(5)), Ok(0));
        std::fs::write(&file, "unhealthy:5\n").unwrap();
        assert_eq!(
            Config::from_env().map(|c| c.health(5)),
            Ok(DEFAULT_UNHEALTHY)
        );
        std::fs::write(&file, "unhealthy:9").unwrap();
        let e = Config::from_env().unwrap_err();
        assert_eq!(e.var, EnvVars::ATLASBOOST_FAKE_DSMI_FAULTS_FILE);
        assert_eq!(e.part, format!("{path}: unhealthy:9"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_container_sees_physical_4_to_7_as_logical_0_to_3() {
        test_env::set(&[(PHYSICAL, "4, 5,6,7")]);
        assert_eq!(count(), (0, 4));
        assert_eq!(phy(0), (0, 4));
        assert_eq!(phy(3), (0, 7));
        assert_eq!(phy(4), (INVALID_DEVICE, 999));
        assert_eq!(logic(6), (0, 2));
        assert_eq!(logic(0), (INVALID_DEVICE, 999));
        assert_eq!(
            ip(0, PORT_ROCE),
            (0, v4([192, 168, 100, 105]), v4([255, 255, 255, 0]))
        );
        test_env::set(&[(PHYSICAL, "4,5,6,7"), (DEVICES, "4")]);
        assert_eq!(count(), (0, 4));
    }

    #[test]
    fn ipv4_and_ipv6_addresses_of_both_ports() {
        test_env::set(&[(DEVICES, "2")]);
        let roce = ip(1, PORT_ROCE);
        assert_eq!(roce, (0, v4([192, 168, 100, 102]), v4([255, 255, 255, 0])));
        assert_eq!(ip(1, PORT_VNIC), roce);
        assert_eq!(ip(1, 2).0, NOT_SUPPORT);
        assert_eq!(ip(1, 256).0, PARA_ERROR);
        assert_eq!(ip(1, -1).0, PARA_ERROR);
        assert_eq!(ip(2, PORT_ROCE).0, INVALID_DEVICE);
        assert_eq!(ip(-1, PORT_ROCE).0, INVALID_DEVICE);

        // The real driver's rules: the caller's type picks the family; only V4 and V6 exist.
        assert_eq!(
            ip_as(1, PORT_ROCE, IPADDR_TYPE_V6).0,
            NO_DEVICE,
            "no IPv6 here"
        );
        assert_eq!(ip_as(1, PORT_ROCE, 2).0, PARA_ERROR);

        test_env::set(&[(PHYSICAL, "9,15"), (IP, "v6")]);
        assert_eq!(
            ip(1, PORT_ROCE).0,
            NO_DEVICE,
            "an IPv6-only host has no IPv4"
        );
        let (rc, address, mask) = ip_as(1, PORT_ROCE, IPADDR_TYPE_V6);
        assert_eq!(rc, 0);
        assert_eq!(address.ip_type, IPADDR_TYPE_V6);
        assert_eq!(
            std::net::Ipv6Addr::from(address.u_addr),
            std::net::Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0xab, 16)
        );
        assert_eq!(
            std::net::Ipv6Addr::from(mask.u_addr).to_string(),
            "ffff:ffff:ffff:ffff::"
        );
        assert_eq!(mask.ip_type, IPADDR_TYPE_V6);
    }

    #[test]
    fn null_pointers_and_short_lists_are_parameter_errors() {
        test_env::set(&[]);
        let mut ip = v4([0; 4]);
        // SAFETY: the functions check for null; the other pointers are valid.
        unsafe {
            assert_eq!(dsmi_get_device_count(std::ptr::null_mut()), PARA_ERROR);
            assert_eq!(dsmi_list_device(std::ptr::null_mut(), 8), PARA_ERROR);
            assert_eq!(
                dsmi_get_phyid_from_logicid(0, std::ptr::null_mut()),
                PARA_ERROR
            );
            assert_eq!(
                dsmi_get_logicid_from_phyid(0, std::ptr::null_mut()),
                PARA_ERROR
            );
            assert_eq!(
                dsmi_get_device_ip_address(0, 1, 0, &mut ip, std::ptr::null_mut()),
                PARA_ERROR
            );
            assert_eq!(
                dsmi_get_device_ip_address(0, 1, 0, std::ptr::null_mut(), &mut ip),
                PARA_ERROR
            );
        }
        assert_eq!(list(7), (PARA_ERROR, vec![-1; 7]));
        assert_eq!(list(65), (PARA_ERROR, vec![-1; 65]), "more than 64");
        // A host with no device: the count is INNER_ERR, as on a real driver.
        test_env::set(&[(DEVICES, "0")]);
        assert_eq!(count(), (INNER_ERR, -1));
        assert_eq!(list(0), (PARA_ERROR, vec![]));
    }

    #[test]
    fn injected_failures_apply_to_every_device_or_one() {
        test_env::set(&[(
            FAULTS,
            "fail:dsmi_get_device_count=-1; fail:dsmi_get_device_ip_address@2=0xfffe ;;\
             fail:dsmi_get_logicid_from_phyid@1=13",
        )]);
        assert_eq!(count(), (-1, -1));
        assert_eq!(ip(2, PORT_ROCE).0, NOT_SUPPORT);
        assert_eq!(ip(1, PORT_ROCE).0, 0);
        assert_eq!(logic(1), (13, 999));
        assert_eq!(logic(2), (0, 2));
        test_env::set(&[(FAULTS, "fail:dsmi_list_device=0")]);
        assert_eq!(list(8), (0, vec![-1; 8]), "=0 succeeds without writing");
        test_env::set(&[
            (PHYSICAL, "4,5"),
            (FAULTS, "fail:dsmi_get_phyid_from_logicid@1=2"),
        ]);
        assert_eq!(phy(0), (0, 4));
        assert_eq!(phy(1), (INVALID_DEVICE, 999));
    }

    #[test]
    fn no_ip_is_no_device_and_the_old_api_answers_zero() {
        test_env::set(&[(IP, "v6"), (FAULTS, "no-ip:3")]);
        assert_eq!(ip_as(3, PORT_ROCE, IPADDR_TYPE_V6).0, NO_DEVICE);
        assert_eq!(ip_as(3, PORT_ROCE, IPADDR_TYPE_V4).0, NO_DEVICE);
        assert_eq!(
            ip_as(2, PORT_ROCE, IPADDR_TYPE_V6).1.ip_type,
            IPADDR_TYPE_V6
        );
        // The old behaviour: the type asked is ignored, and no address is success with zeros.
        test_env::set(&[(IP, "v6"), (FAULTS, "no-ip:3"), (IP_API, "old")]);
        assert_eq!(ip(3, PORT_ROCE), (0, v4([0; 4]), v4([0; 4])));
        assert_eq!(
            ip(2, PORT_ROCE).1.ip_type,
            IPADDR_TYPE_V6,
            "its own type, written back"
        );
    }

    #[test]
    fn try_again_answers_as_a_starting_driver_then_works() {
        reset_try_again();
        test_env::set(&[(FAULTS, "try-again:dsmi_get_device_count=2")]);
        assert_eq!(count(), (TRY_AGAIN, -1));
        assert_eq!(count(), (TRY_AGAIN, -1));
        assert_eq!(count(), (0, 8), "the third call succeeds");
        assert_eq!(phy(1), (0, 1), "other functions are not affected");
        reset_try_again();
        test_env::set(&[(FAULTS, "try-again:dsmi_get_phyid_from_logicid")]);
        for _ in 0..20 {
            assert_eq!(phy(0), (TRY_AGAIN, 999), "for ever without a count");
        }
        reset_try_again();
    }

    #[test]
    fn malformed_environment_fails_every_call_with_invalid_value() {
        let bad: &[&[(&str, &str)]] = &[
            &[(DEVICES, "65")],
            &[(DEVICES, "eight")],
            &[(PHYSICAL, "4,5,x")],
            &[(PHYSICAL, "4,4")],
            &[(PHYSICAL, "154")],
            &[(PHYSICAL, "4,5"), (DEVICES, "3")],
            &[(CHIP, &"x".repeat(32))],
            &[(IP, "v5")],
            &[(FAULTS, "explode:1")],
            &[(FAULTS, "fail:dsmi_get_device_count")],
            &[(FAULTS, "fail:dsmi_open=1")],
            &[(FAULTS, "fail:dsmi_get_device_count@0=1")],
            &[(FAULTS, "fail:dsmi_get_device_health@8=1")],
            &[(FAULTS, "fail:dsmi_get_device_health=x")],
            &[(FAULTS, "no-ip:8")],
            &[(PHYSICAL, "4"), (FAULTS, "unhealthy:0")],
            &[(FAULTS, "unhealthy:1=-1")],
            &[(FAULTS, "try-again:dsmi_open")],
            &[(FAULTS, "try-again:dsmi_list_device=-2")],
            &[(IP_API, "new")],
        ];
        for vars in bad {
            test_env::set(vars);
            assert_eq!(count(), (INVALID_VALUE, -1), "{vars:?}");
            assert_eq!(phy(0), (INVALID_VALUE, 999), "{vars:?}");
        }
        test_env::set(&[(CHIP, &"x".repeat(31)), (DEVICES, "")]);
        assert_eq!(count(), (0, 8), "31 bytes fit; empty is unset");
    }

    #[test]
    fn codes_parse_as_decimal_or_hex_bits() {
        assert_eq!(parse_int("-1"), Some(-1));
        assert_eq!(parse_int("0xffffffff"), Some(-1));
        assert_eq!(parse_int("0XFFFE"), Some(0xfffe));
        assert_eq!(parse_int("4294967295"), None);
        assert_eq!(parse_uint("0xffffffff"), Some(u32::MAX));
        assert_eq!(parse_uint("4294967295"), Some(u32::MAX));
        assert_eq!(parse_uint("-1"), None);
    }
}
