//! `SimProbe`: N simulated devices per host, deterministic IPs, injectable faults.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use atlasboost_core::{
    Device, DeviceProbe, DeviceSample, EnvVars, Error, Health, Result, Telemetry,
};

use crate::SimError;

/// A fault to inject into simulated devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SimFault {
    /// The device has no IP (`no-ip:<phy>`).
    NoIp {
        /// The device.
        physical_id: u32,
    },
    /// The device is unhealthy (`unhealthy:<phy>` or `unhealthy:<phy>=<code>`, default code 3).
    Unhealthy {
        /// The device.
        physical_id: u32,
        /// The DSMI health code.
        code: u32,
    },
    /// The device gets the IP that the same device of another host has (`dup-ip:<phy>=<host>`).
    DuplicateIp {
        /// The device.
        physical_id: u32,
        /// The host whose IP it copies.
        of_server: String,
    },
    /// The whole probe fails (`fail` or `fail:<message>`).
    ProbeFails {
        /// The error text.
        message: String,
    },
}

/// A fault, optionally only for one host (`<host>/<fault>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFault {
    /// The host it applies to; `None` for every host.
    pub server_id: Option<String>,
    /// The fault.
    pub fault: SimFault,
}

/// Parses a fault list: faults separated by `;`, each `[<host>/]<fault>`, e.g.
/// `no-ip:3;127.0.0.2/unhealthy:1;fail:driver gone`.
///
/// # Errors
///
/// [`SimError::BadFault`] naming the element that is malformed.
pub fn parse_faults(spec: &str) -> Result<Vec<HostFault>, SimError> {
    spec.split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|item| item.parse())
        .collect()
}

impl FromStr for HostFault {
    type Err = SimError;

    fn from_str(item: &str) -> Result<Self, SimError> {
        let bad = |reason: &str| SimError::BadFault {
            fault: item.to_string(),
            reason: reason.to_string(),
        };
        let (server_id, rest) = match item.split_once('/') {
            Some((host, rest)) if !host.is_empty() => (Some(host.to_string()), rest),
            Some(_) => return Err(bad("empty host before '/'")),
            None => (None, item),
        };
        let (kind, arg) = rest.split_once(':').unwrap_or((rest, ""));
        let phy = |s: &str| {
            s.parse::<u32>()
                .map_err(|_| bad("expected a physical device id after ':'"))
        };
        let fault = match kind {
            "no-ip" => SimFault::NoIp {
                physical_id: phy(arg)?,
            },
            "unhealthy" => {
                let (id, code) = match arg.split_once('=') {
                    Some((id, code)) => (
                        phy(id)?,
                        code.parse()
                            .map_err(|_| bad("expected a health code after '='"))?,
                    ),
                    None => (phy(arg)?, 3),
                };
                if code == 0 {
                    return Err(bad("health code 0 means healthy"));
                }
                SimFault::Unhealthy {
                    physical_id: id,
                    code,
                }
            }
            "dup-ip" => match arg.split_once('=') {
                Some((id, host)) if !host.is_empty() => SimFault::DuplicateIp {
                    physical_id: phy(id)?,
                    of_server: host.to_string(),
                },
                _ => return Err(bad("expected dup-ip:<phy>=<host>")),
            },
            "fail" => SimFault::ProbeFails {
                message: if arg.is_empty() {
                    "simulated probe failure".into()
                } else {
                    arg.to_string()
                },
            },
            _ => {
                return Err(bad(
                    "unknown fault; expected no-ip, unhealthy, dup-ip or fail",
                ));
            }
        };
        Ok(HostFault { server_id, fault })
    }
}

/// Simulated devices of one host.
///
/// Device `p` of host `a.b.c.d` has IP `10.c.d.(p+1)` (IPv4) or `fd00::a.b:c.d:0:p` (IPv6);
/// a host named otherwise is hashed (FNV-1a, 32 bits) into the host part. IPv4 addresses
/// therefore differ between hosts whose last two octets differ (every `127.0.x.y` host of a
/// test, every host of one /16); IPv6 ones between any two IPv4 hosts. No IPv4 scheme can do
/// better: 2^32 hosts times 255 devices do not fit in 2^32 addresses. A clash is never silent:
/// the validator reports duplicate device IPs.
///
/// Simulated devices are never picked by accident: only `--sim N`, `ATLASBOOST_SIM=N` or this
/// constructor select them.
#[derive(Debug, Clone)]
pub struct SimProbe {
    server_id: String,
    count: u32,
    chip: String,
    ipv6: bool,
    faults: Vec<HostFault>,
    /// `ATLASBOOST_SIM_FAULTS_FILE`, read again at every telemetry sample (a device can fail
    /// while a job runs, as a real one does); its faults are `faults[file_faults_at..]`.
    faults_file: Option<std::path::PathBuf>,
    file_faults_at: usize,
    /// The file's faults as last read whole: what a sample keeps while the file does not parse
    /// (being rewritten), rather than the state at the start.
    file_faults_read: std::sync::Arc<std::sync::Mutex<Option<Vec<HostFault>>>>,
}

impl SimProbe {
    /// `count` healthy 910 devices on host `server_id`, physical ids `0..count`.
    pub fn new(server_id: impl Into<String>, count: u32) -> Self {
        SimProbe {
            server_id: server_id.into(),
            count,
            chip: "910".into(),
            ipv6: false,
            faults: Vec::new(),
            faults_file: None,
            file_faults_at: 0,
            file_faults_read: Default::default(),
        }
    }

    /// The chip name the devices report (`910`, `910B3`, `910_9391`); 910_93 devices also get
    /// SuperPoD ids (`super_device_id` = physical id, one super pod per host).
    pub fn with_chip(mut self, chip: impl Into<String>) -> Self {
        self.chip = chip.into();
        self
    }

    /// IPv6 device addresses instead of IPv4.
    pub fn with_ipv6(mut self, ipv6: bool) -> Self {
        self.ipv6 = ipv6;
        self
    }

    /// Faults to inject; those for other hosts are ignored.
    pub fn with_faults(mut self, faults: Vec<HostFault>) -> Self {
        self.faults = faults;
        self
    }

    /// Adds the faults of `ATLASBOOST_SIM_FAULTS` and of the file `ATLASBOOST_SIM_FAULTS_FILE`
    /// names (one or more per line), if set (see [`parse_faults`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidValue`] naming the variable when its value is malformed.
    pub fn with_faults_from_env(self) -> Result<Self> {
        let name = EnvVars::ATLASBOOST_SIM_FAULTS;
        let spec = match std::env::var(name) {
            Ok(spec) => Some(spec),
            Err(std::env::VarError::NotPresent) => None,
            Err(std::env::VarError::NotUnicode(raw)) => {
                return Err(Error::invalid_value(
                    name,
                    raw.to_string_lossy(),
                    "is not valid UTF-8",
                ));
            }
        };
        let file = std::env::var_os(EnvVars::ATLASBOOST_SIM_FAULTS_FILE).map(Into::into);
        self.with_faults_of(spec.as_deref(), file)
    }

    /// Adds the faults of `spec` and of the file `file` names, as
    /// [`SimProbe::with_faults_from_env`] does with the variables' values (another process's:
    /// a launcher's, for its agents on other hosts).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidValue`] naming `ATLASBOOST_SIM_FAULTS` when `spec` is malformed.
    pub fn with_faults_of(
        mut self,
        spec: Option<&str>,
        file: Option<std::path::PathBuf>,
    ) -> Result<Self> {
        if let Some(spec) = spec {
            let name = EnvVars::ATLASBOOST_SIM_FAULTS;
            let faults =
                parse_faults(spec).map_err(|e| Error::invalid_value(name, spec, e.to_string()))?;
            self.faults.extend(faults);
        }
        match file.filter(|p| !p.as_os_str().is_empty()) {
            Some(path) => self.with_faults_file(path),
            None => Ok(self),
        }
    }

    /// Adds the faults of the file `path` (`ATLASBOOST_SIM_FAULTS_FILE`'s), which telemetry
    /// samples read again; a file that is not there (yet) injects nothing.
    fn with_faults_file(mut self, path: std::path::PathBuf) -> Result<Self> {
        let name = EnvVars::ATLASBOOST_SIM_FAULTS_FILE;
        let spec = match std::fs::read_to_string(&path) {
            Ok(spec) => spec,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => {
                let why = format!("cannot be read: {e}");
                return Err(Error::invalid_value(name, path.display().to_string(), why));
            }
        };
        let spec = spec.lines().collect::<Vec<_>>().join(";");
        let faults = parse_faults(&spec)
            .map_err(|e| Error::invalid_value(name, path.display().to_string(), e.to_string()))?;
        self.file_faults_at = self.faults.len();
        self.faults.extend(faults);
        self.faults_file = Some(path);
        Ok(self)
    }

    /// This probe with the faults file read again, if it has one. One that does not read or
    /// parse now (being rewritten, say) counts as it was last read whole: a sample has nobody
    /// to tell, and a fault must not vanish for a moment.
    fn with_faults_file_now(&self) -> Option<SimProbe> {
        let path = self.faults_file.as_ref()?;
        let read = match std::fs::read_to_string(path) {
            Ok(spec) => Some(spec),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(String::new()),
            Err(_) => None,
        };
        let parsed =
            read.and_then(|spec| parse_faults(&spec.lines().collect::<Vec<_>>().join(";")).ok());
        let mut last = self
            .file_faults_read
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let faults = match parsed {
            Some(faults) => {
                *last = Some(faults.clone());
                faults
            }
            None => last.clone()?,
        };
        drop(last);
        let mut now = self.clone();
        now.faults.truncate(self.file_faults_at);
        now.faults.extend(faults);
        Some(now)
    }

    /// The IP simulated device `physical_id` of `server_id` has (ids go up to 254, since a host
    /// has at most 255 devices).
    pub fn device_ip(server_id: &str, physical_id: u8, ipv6: bool) -> IpAddr {
        let host = match server_id.parse::<Ipv4Addr>() {
            Ok(ip) => u32::from(ip),
            Err(_) => fnv1a(server_id.as_bytes()),
        };
        if ipv6 {
            let [a, b, c, d] = host.to_be_bytes();
            IpAddr::V6(Ipv6Addr::new(
                0xfd00,
                0,
                0,
                0,
                u16::from_be_bytes([a, b]),
                u16::from_be_bytes([c, d]),
                0,
                u16::from(physical_id),
            ))
        } else {
            let [_, _, c, d] = host.to_be_bytes();
            IpAddr::V4(Ipv4Addr::new(10, c, d, physical_id.saturating_add(1)))
        }
    }

    fn faults(&self) -> impl Iterator<Item = &SimFault> {
        self.faults
            .iter()
            .filter(|f| f.server_id.as_deref().is_none_or(|s| s == self.server_id))
            .map(|f| &f.fault)
    }
}

impl DeviceProbe for SimProbe {
    fn name(&self) -> &str {
        "sim"
    }

    fn probe(&self) -> Result<Vec<Device>> {
        let fail = |e: SimError| Error::Probe {
            probe: "sim".into(),
            server_id: self.server_id.clone(),
            source: Box::new(e),
        };
        if self.count == 0 || self.count > 255 {
            return Err(fail(SimError::BadCount(self.count)));
        }
        let a3 = self.chip.to_ascii_lowercase().contains("910_93");
        // 1..=255 devices: every id fits in a u8, and so does id + 1.
        let mut devices: Vec<Device> = (0..self.count as u8)
            .map(|p| Device {
                server_id: self.server_id.clone(),
                logical_id: u32::from(p),
                physical_id: u32::from(p),
                ip: Some(Self::device_ip(&self.server_id, p, self.ipv6)),
                chip: self.chip.clone(),
                health: Health::Healthy,
                super_device_id: a3.then_some(u32::from(p)),
                super_pod_id: a3.then(|| self.server_id.clone()),
            })
            .collect();
        for fault in self.faults() {
            let target = |id: u32| -> Result<u8> {
                if id < self.count {
                    Ok(id as u8)
                } else {
                    Err(fail(SimError::NoSuchDevice {
                        physical_id: id,
                        count: self.count,
                    }))
                }
            };
            match fault {
                SimFault::ProbeFails { message } => {
                    return Err(fail(SimError::Injected(message.clone())));
                }
                SimFault::NoIp { physical_id } => {
                    devices[usize::from(target(*physical_id)?)].ip = None;
                }
                SimFault::Unhealthy { physical_id, code } => {
                    devices[usize::from(target(*physical_id)?)].health = Health::from_code(*code);
                }
                SimFault::DuplicateIp {
                    physical_id,
                    of_server,
                } => {
                    let id = target(*physical_id)?;
                    if *of_server == self.server_id {
                        return Err(fail(SimError::BadFault {
                            fault: format!("dup-ip:{physical_id}={of_server}"),
                            reason: "copies the IP of its own host, which changes nothing".into(),
                        }));
                    }
                    devices[usize::from(id)].ip = Some(Self::device_ip(of_server, id, self.ipv6));
                }
            }
        }
        Ok(devices)
    }
}

impl SimProbe {
    /// The telemetry of simulated `device` at `second` (Unix time): plausible, deterministic
    /// and varying with time, each device on its own phase: AI core 35-99 %, HBM 40-88 % of
    /// 65,536 MB (910B-sized), 42-74 °C, 180-345 W; health as the probe's faults say.
    pub fn sample_at(&self, device: &Device, second: u64) -> DeviceSample {
        let phase = u64::from(fnv1a(
            format!("{}/{}", device.server_id, device.physical_id).as_bytes(),
        ));
        // A slow triangle wave (period 120 s) per device: load rises and falls.
        let wave = |offset: u64, span: u64| -> u64 {
            let t = (second + phase + offset) % 120;
            let up = if t < 60 { t } else { 120 - t };
            up * span / 60
        };
        let total = 65_536u64;
        let health = self
            .faults()
            .find_map(|f| match f {
                SimFault::Unhealthy { physical_id, code } if *physical_id == device.physical_id => {
                    Some(Health::from_code(*code))
                }
                _ => None,
            })
            .unwrap_or(Health::Healthy);
        DeviceSample {
            physical_id: device.physical_id,
            ai_core_percent: Some(35 + wave(0, 64) as u32),
            hbm_used_mb: Some(total * (40 + wave(17, 48)) / 100),
            hbm_total_mb: Some(total),
            temperature_c: Some(42 + wave(29, 32) as i32),
            power_decwatts: Some(1800 + wave(41, 1650) as u32),
            health: Some(health),
            error_codes: Some(Vec::new()),
            failures: Vec::new(),
        }
    }
}

impl Telemetry for SimProbe {
    fn sample(&self, devices: &[Device]) -> Vec<DeviceSample> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let fresh = self.with_faults_file_now();
        let probe = fresh.as_ref().unwrap_or(self);
        devices.iter().map(|d| probe.sample_at(d, now)).collect()
    }
}

/// FNV-1a: a stable hash, so a named host gets the same IPs in every run and on every machine.
fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device that fails while a job runs: the faults file is read again at each sample;
    /// a file that does not parse (being rewritten) counts as it was last read whole.
    #[test]
    fn telemetry_reads_the_faults_file_again() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("faults");
        let probe = SimProbe::new("10.0.0.1", 2)
            .with_faults(parse_faults("unhealthy:0=2").unwrap())
            .with_faults_file(file.clone())
            .unwrap();
        let devices = probe.probe().unwrap();
        let health =
            || -> Vec<Option<Health>> { probe.sample(&devices).iter().map(|s| s.health).collect() };
        assert_eq!(
            health(),
            [Some(Health::from_code(2)), Some(Health::Healthy)]
        );
        std::fs::write(&file, "10.0.0.1/unhealthy:1=3\n").unwrap();
        assert_eq!(
            health(),
            [Some(Health::from_code(2)), Some(Health::from_code(3))],
            "the file's fault joins the fixed one"
        );
        std::fs::write(&file, "unhealthy:").unwrap();
        assert_eq!(
            health(),
            [Some(Health::from_code(2)), Some(Health::from_code(3))],
            "a file being rewritten keeps what it said last"
        );
        std::fs::remove_file(&file).unwrap();
        assert_eq!(
            health(),
            [Some(Health::from_code(2)), Some(Health::Healthy)]
        );
    }

    #[test]
    fn simulated_telemetry_is_plausible_deterministic_and_varies() {
        let probe =
            SimProbe::new("10.0.0.1", 2).with_faults(parse_faults("unhealthy:1=2").unwrap());
        let devices = probe.probe().unwrap();
        let a = probe.sample_at(&devices[0], 1_000);
        assert_eq!(a, probe.sample_at(&devices[0], 1_000), "deterministic");
        let over_a_minute: Vec<DeviceSample> = (0..60)
            .map(|s| probe.sample_at(&devices[0], 1_000 + s))
            .collect();
        assert!(
            over_a_minute
                .iter()
                .any(|s| s.ai_core_percent != a.ai_core_percent)
        );
        for s in &over_a_minute {
            assert!((35..=99).contains(&s.ai_core_percent.unwrap()), "{s:?}");
            assert!(s.hbm_used_mb.unwrap() <= s.hbm_total_mb.unwrap());
            assert!((42..=74).contains(&s.temperature_c.unwrap()));
            assert!((180.0..=345.0).contains(&s.power_watts().unwrap()));
            assert_eq!(s.health, Some(Health::Healthy));
        }
        // Devices differ in phase; a fault shows in the sample's health.
        let b = probe.sample_at(&devices[1], 1_000);
        assert_eq!(b.health, Some(Health::Unhealthy { code: 2 }));
        assert_eq!(Telemetry::sample(&probe, &devices).len(), 2);
    }

    #[test]
    fn the_probe_conformance_suite_passes() {
        for probe in [
            SimProbe::new("127.0.0.1", 8),
            SimProbe::new("127.0.0.1", 16).with_chip("910B3"),
            SimProbe::new("127.0.0.1", 8).with_ipv6(true),
        ] {
            let devices = atlasboost_core::conformance::check_probe(&probe, "127.0.0.1").unwrap();
            assert!(!devices.is_empty());
        }
    }

    #[test]
    fn ips_are_deterministic_and_distinct_across_hosts() {
        let a = SimProbe::new("127.0.0.1", 8).probe().unwrap();
        let b = SimProbe::new("127.0.0.2", 8).probe().unwrap();
        assert_eq!(a, SimProbe::new("127.0.0.1", 8).probe().unwrap());
        let mut ips: Vec<IpAddr> = a.iter().chain(&b).filter_map(|d| d.ip).collect();
        ips.sort();
        ips.dedup();
        assert_eq!(ips.len(), 16);
        assert_eq!(a[3].ip, Some("10.0.1.4".parse().unwrap()));
    }

    #[test]
    fn faults_apply_to_their_host_only() {
        let faults = parse_faults("127.0.0.2/no-ip:3; unhealthy:1=2").unwrap();
        let a = SimProbe::new("127.0.0.1", 4)
            .with_faults(faults.clone())
            .probe()
            .unwrap();
        let b = SimProbe::new("127.0.0.2", 4)
            .with_faults(faults)
            .probe()
            .unwrap();
        assert!(a[3].ip.is_some());
        assert_eq!(b[3].ip, None);
        assert_eq!(a[1].health, Health::Unhealthy { code: 2 });
        assert_eq!(b[1].health, Health::Unhealthy { code: 2 });
    }

    #[test]
    fn duplicate_ip_copies_the_other_host() {
        let faults = parse_faults("dup-ip:2=10.0.0.9").unwrap();
        let a = SimProbe::new("10.0.0.1", 4)
            .with_faults(faults)
            .probe()
            .unwrap();
        let other = SimProbe::new("10.0.0.9", 4).probe().unwrap();
        assert_eq!(a[2].ip, other[2].ip);
    }

    #[test]
    fn a_failing_probe_names_host_and_message() {
        let faults = parse_faults("fail:driver gone").unwrap();
        let err = SimProbe::new("10.0.0.1", 4)
            .with_faults(faults)
            .probe()
            .unwrap_err();
        let text = atlasboost_core::exchange::error_chain(&err);
        assert!(
            text.contains("10.0.0.1") && text.contains("driver gone"),
            "{text}"
        );
    }

    #[test]
    fn bad_faults_are_named() {
        for (spec, needle) in [
            ("no-ip:x", "no-ip:x"),
            ("explode:1", "unknown fault"),
            ("unhealthy:1=0", "code 0"),
            ("dup-ip:1", "dup-ip:<phy>=<host>"),
            ("/fail", "empty host"),
        ] {
            let err = parse_faults(spec).unwrap_err().to_string();
            assert!(err.contains(needle), "{spec}: {err}");
        }
        let err = SimProbe::new("h", 4)
            .with_faults(parse_faults("no-ip:9").unwrap())
            .probe()
            .unwrap_err();
        assert!(
            atlasboost_core::exchange::error_chain(&err).contains("no device 9"),
            "{err}"
        );
    }

    #[test]
    fn ipv6_and_a3_devices() {
        let d = SimProbe::new("10.1.2.3", 2)
            .with_ipv6(true)
            .with_chip("910_9391")
            .probe()
            .unwrap();
        assert_eq!(d[1].ip, Some("fd00::a01:203:0:1".parse().unwrap()));
        assert_eq!(d[1].super_device_id, Some(1));
        assert_eq!(d[1].super_pod_id.as_deref(), Some("10.1.2.3"));
    }
}
