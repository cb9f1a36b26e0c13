//! The safe layer over the driver's DSMI functions.

use std::ffi::{c_int, c_uint};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use atlasboost_core::{
    Device, DeviceProbe, DeviceSample, DriverCall, EnvVars, Error, Health, Telemetry,
};
use libloading::Library;

use crate::DsmiError;
use crate::raw::{self, ChipInfo, IpAddrT};
use crate::visible::VisibleDevices;

/// The library names, in the order tried in each directory.
const NAMES: [&str; 2] = ["libdrvdsmi_host.so", "libdrvdsmi.so"];

/// Where the driver's libraries live on an Ascend server.
const DRIVER_DIRS: [&str; 2] = [
    "/usr/local/Ascend/driver/lib64/driver",
    "/usr/local/Ascend/driver/lib64",
];

/// The most devices a driver may report (what Ascend's device plugin accepts).
const MAX_DEVICES: c_int = 64;

/// The chip assumed when the driver has no `dsmi_get_chip_info` (a 910-era driver).
const CHIP_WITHOUT_CHIP_INFO: &str = "910";

/// The library paths to try, in order (SPEC §3): `$ATLASBOOST_DSMI_LIB` alone when set;
/// else `libdrvdsmi_host.so` in each directory of `$LD_LIBRARY_PATH`, then in the driver's own
/// directories, and only then `libdrvdsmi.so` in each (an older library earlier on the path
/// must not shadow the host library, which reads health).
pub fn library_candidates() -> Vec<PathBuf> {
    // Empty counts as unset, as for every variable.
    if let Some(file) = std::env::var_os(EnvVars::ATLASBOOST_DSMI_LIB).filter(|f| !f.is_empty()) {
        return vec![PathBuf::from(file)];
    }
    let mut dirs: Vec<PathBuf> = std::env::var_os(EnvVars::LD_LIBRARY_PATH)
        .map(|v| {
            std::env::split_paths(&v)
                .filter(|p| !p.as_os_str().is_empty())
                .collect()
        })
        .unwrap_or_default();
    dirs.extend(DRIVER_DIRS.iter().map(PathBuf::from));
    NAMES
        .iter()
        .flat_map(|n| dirs.iter().map(move |d| d.join(n)))
        .collect()
}

/// The driver's functions, resolved one by one.
#[derive(Debug, Clone, Copy)]
struct Functions {
    count: raw::GetDeviceCount,
    list: raw::ListDevice,
    phyid: raw::GetPhyidFromLogicid,
    ip: raw::GetDeviceIpAddress,
    chip: Option<raw::GetChipInfo>,
    health: Option<raw::GetDeviceHealth>,
    // Telemetry (SPEC §13): each optional; a missing one leaves its metric absent.
    utilization: Option<raw::GetUtilizationRate>,
    temperature: Option<raw::GetTemperature>,
    power: Option<raw::GetPowerInfo>,
    hbm: Option<raw::GetHbmInfo>,
    errors: Option<raw::GetErrorCode>,
}

/// Devices from the Ascend driver (SPEC §3, `--probe dsmi`). The probe's calls run on a
/// thread of their own, watched: a call that does not return within
/// `ATLASBOOST_DSMI_CALL_TIMEOUT_SECS` (a wedged NPU) fails the probe naming it, instead of
/// hanging the command.
#[derive(Debug)]
pub struct DsmiProbe {
    driver: Arc<Driver>,
    /// The thread a probe gave up on, left in a call that hangs: until it ends, a later probe
    /// makes no call of its own (two calls into a wedged driver at once) and names that call.
    stuck: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// The driver call under way: its function, device and start.
type InCall = (&'static str, Option<u32>, Instant);

/// The loaded driver and the probe's settings.
#[derive(Debug)]
struct Driver {
    /// The call under way, for a probe that times out to name it.
    in_call: Mutex<Option<InCall>>,
    /// A probe gave up on this driver's thread (a call hung): it makes no further call once
    /// that one returns.
    abandoned: std::sync::atomic::AtomicBool,
    /// How long one call may take.
    call_limit: Duration,
    server_id: String,
    path: PathBuf,
    functions: Functions,
    visible: VisibleDevices,
    /// How long a call answered `TRY_AGAIN` is retried.
    retry: Duration,
    /// The physical ids the job may use (`--devices`): a device outside them whose driver
    /// calls fail is left out instead of failing the probe.
    only: Option<std::collections::BTreeSet<u32>>,
    // Last: the functions above point into it.
    _library: Library,
}

impl DsmiProbe {
    /// Loads the driver library from the first of [`library_candidates`] that loads.
    ///
    /// # Errors
    ///
    /// [`DsmiError::NotFound`] listing every path tried and why it failed;
    /// [`DsmiError::MissingSymbol`] for a library without a required function;
    /// [`DsmiError::BadVisible`] for a malformed `ASCEND_RT_VISIBLE_DEVICES`.
    pub fn load(server_id: &str) -> Result<DsmiProbe, DsmiError> {
        let mut tried = Vec::new();
        for path in library_candidates() {
            if !path.exists() {
                tried.push(format!("{} (not there)", path.display()));
                continue;
            }
            // Opening a FIFO or a device would wait for a writer (for ever).
            if !path.is_file() {
                tried.push(format!("{} (not a regular file)", path.display()));
                continue;
            }
            // A library that does not load or lacks a function is noted, and the search goes
            // on: a later candidate may be the real driver.
            match DsmiProbe::load_from(server_id, &path) {
                Ok(p) => return Ok(p),
                Err(DsmiError::NotFound { tried: why, .. }) => tried.extend(why),
                Err(DsmiError::MissingSymbol { symbol, .. }) => {
                    tried.push(format!("{} (has no function {symbol})", path.display()));
                }
                Err(e) => return Err(e),
            }
        }
        let named = std::env::var_os(EnvVars::ATLASBOOST_DSMI_LIB).is_some_and(|f| !f.is_empty());
        Err(DsmiError::NotFound { tried, named })
    }

    /// Loads the driver library at `path`.
    ///
    /// # Errors
    ///
    /// As [`DsmiProbe::load`].
    pub fn load_from(server_id: &str, path: &Path) -> Result<DsmiProbe, DsmiError> {
        // SAFETY: loading a library runs its initialisers. The driver's (and the fake
        // driver's) have no preconditions; this is the documented way to use DSMI.
        let library = unsafe { Library::new(path) }.map_err(|e| DsmiError::NotFound {
            tried: vec![format!("{} ({e})", path.display())],
            named: false,
        })?;
        let functions = Functions {
            count: required(&library, path, "dsmi_get_device_count")?,
            list: required(&library, path, "dsmi_list_device")?,
            phyid: required(&library, path, "dsmi_get_phyid_from_logicid")?,
            ip: required(&library, path, "dsmi_get_device_ip_address")?,
            chip: optional(&library, "dsmi_get_chip_info"),
            health: optional(&library, "dsmi_get_device_health"),
            utilization: optional(&library, "dsmi_get_device_utilization_rate"),
            temperature: optional(&library, "dsmi_get_device_temperature"),
            power: optional(&library, "dsmi_get_device_power_info"),
            hbm: optional(&library, "dsmi_get_hbm_info"),
            errors: optional(&library, "dsmi_get_device_errorcode"),
        };
        let driver = Driver {
            in_call: Mutex::new(None),
            abandoned: std::sync::atomic::AtomicBool::new(false),
            call_limit: seconds_of(
                EnvVars::ATLASBOOST_DSMI_CALL_TIMEOUT_SECS,
                DEFAULT_CALL_LIMIT,
                0.1,
            )?,
            server_id: server_id.to_string(),
            path: path.to_path_buf(),
            functions,
            visible: VisibleDevices::from_env()?,
            retry: seconds_of(EnvVars::ATLASBOOST_DSMI_RETRY_SECS, DEFAULT_RETRY, 0.0)?,
            only: None,
            _library: library,
        };
        Ok(DsmiProbe {
            driver: Arc::new(driver),
            stuck: Mutex::new(None),
        })
    }

    /// The driver, changed by `change` (the builders below, before any probe: the driver is
    /// not shared yet).
    fn changed(self, change: impl FnOnce(&mut Driver)) -> DsmiProbe {
        let mut driver = self.driver;
        if let Some(d) = Arc::get_mut(&mut driver) {
            change(d);
        }
        DsmiProbe {
            driver,
            stuck: self.stuck,
        }
    }

    /// Only these physical ids are the job's (`--devices`): another device whose driver calls
    /// fail (a broken NPU the user left out) is dropped instead of failing the probe.
    pub fn only(self, physical: Option<std::collections::BTreeSet<u32>>) -> DsmiProbe {
        self.changed(|d| d.only = physical)
    }

    /// The library in use.
    pub fn library(&self) -> &Path {
        &self.driver.path
    }

    /// Whether the driver has the optional functions (chip name, health).
    pub fn has_chip_and_health(&self) -> (bool, bool) {
        (
            self.driver.functions.chip.is_some(),
            self.driver.functions.health.is_some(),
        )
    }

    /// How long a call that answers `TRY_AGAIN` (a driver still starting) is retried.
    pub fn with_retry(self, bound: Duration) -> DsmiProbe {
        self.changed(|d| d.retry = bound)
    }
}

impl Driver {
    /// Calls a driver function, again with backoff while it answers `TRY_AGAIN`, until the
    /// probe's retry bound (`since` + the bound: one bound for the whole probe, not per call,
    /// so that 16 devices of a driver still starting wait the bound once, not 16 times). Each
    /// call still gets 100 ms of its own (three tries; at most the bound): a device that
    /// answers `TRY_AGAIN` once late in a slow probe is not taken for broken at its first
    /// answer, and 16 devices add 1.6 s at most.
    fn call(
        &self,
        since: Instant,
        function: &'static str,
        device: Option<u32>,
        mut f: impl FnMut() -> c_int,
    ) -> Result<(), DsmiError> {
        let mut pause = Duration::from_millis(20);
        let mut tries = 1;
        let own = Instant::now() + self.retry.min(Duration::from_millis(100));
        let until = (since + self.retry).max(own);
        loop {
            if self.abandoned.load(std::sync::atomic::Ordering::Acquire) {
                // The probe has failed already; its answer is not waited for.
                return Err(DsmiError::Hung {
                    function,
                    device,
                    waited: Duration::ZERO,
                });
            }
            *self.in_call.lock().unwrap_or_else(PoisonError::into_inner) =
                Some((function, device, Instant::now()));
            let code = f();
            *self.in_call.lock().unwrap_or_else(PoisonError::into_inner) = None;
            if code != TRY_AGAIN {
                return check(function, device, code);
            }
            // A probe that gave up on this thread meanwhile gets no retry (nor its pause).
            if self.abandoned.load(std::sync::atomic::Ordering::Acquire) {
                continue;
            }
            let now = Instant::now();
            if now >= until {
                let waited = since.elapsed();
                return Err(DsmiError::StillStarting {
                    function,
                    device,
                    tries,
                    waited,
                });
            }
            std::thread::sleep(pause.min(until - now));
            pause = (pause * 2).min(Duration::from_secs(1));
            tries += 1;
        }
    }

    fn devices(&self) -> Result<Vec<Device>, DsmiError> {
        let f = self.functions;
        let since = Instant::now();
        let mut count: c_int = 0;
        // SAFETY: the function writes one int through a valid pointer (the header's contract).
        match self.call(since, "dsmi_get_device_count", None, || unsafe {
            (f.count)(&mut count)
        }) {
            // How the real driver answers on a host without a device.
            Err(DsmiError::Call {
                code: INNER_ERR, ..
            }) => {
                return Err(DsmiError::NoDevice { code: INNER_ERR });
            }
            other => other?,
        }
        if count == 0 {
            return Err(DsmiError::NoDevice { code: 0 });
        }
        if !(0..=MAX_DEVICES).contains(&count) {
            return Err(DsmiError::Nonsense {
                function: "dsmi_get_device_count",
                what: format!("{count} devices (expected 0 to {MAX_DEVICES})"),
            });
        }
        let mut ids: Vec<c_int> = vec![0; count as usize];
        // SAFETY: the buffer holds `count` ints, as the function is told.
        self.call(since, "dsmi_list_device", None, || unsafe {
            (f.list)(ids.as_mut_ptr(), count)
        })?;
        let listed = || {
            ids.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        if let Some((at, twice)) = ids
            .iter()
            .enumerate()
            .find(|(at, id)| ids[..*at].contains(id))
        {
            return Err(DsmiError::Nonsense {
                function: "dsmi_list_device",
                what: format!(
                    "device id {twice} again at place {at} of its {} ids ({})",
                    ids.len(),
                    listed()
                ),
            });
        }
        // Each logical id's physical id, for the duplicates check below.
        let mut physical_ids: Vec<(u32, u32)> = Vec::with_capacity(ids.len());
        let mut devices = Vec::with_capacity(ids.len());
        // The first error of a job's device whose own calls fail: the probe's error when no
        // device of the host can be read (a driver that fails everything is not a broken NPU).
        let mut first_unreadable = None;
        for (at, &logical) in ids.iter().enumerate() {
            let Ok(logical) = u32::try_from(logical) else {
                return Err(DsmiError::Nonsense {
                    function: "dsmi_list_device",
                    what: format!(
                        "device id {logical} at place {at} of its {} ids ({})",
                        ids.len(),
                        listed()
                    ),
                });
            };
            let physical = self.physical_of(since, logical)?;
            // A host has at most MAX_DEVICES NPUs, each its own physical id.
            if physical >= MAX_DEVICES as u32 {
                return Err(DsmiError::Nonsense {
                    function: "dsmi_get_phyid_from_logicid",
                    what: format!(
                        "physical id {physical} for logical id {logical} (expected below \
                         {MAX_DEVICES})"
                    ),
                });
            }
            if let Some((other, _)) = physical_ids.iter().find(|(_, p)| *p == physical) {
                return Err(DsmiError::Nonsense {
                    function: "dsmi_get_phyid_from_logicid",
                    what: format!(
                        "physical id {physical} for both logical ids {other} and {logical}"
                    ),
                });
            }
            physical_ids.push((logical, physical));
            match self.device(since, logical, physical) {
                Ok(d) => devices.push(d),
                // Not the job's device: its failing calls are not the job's failure (unless
                // the runtime's visible list names it, which needs it to map the others).
                Err(_)
                    if self.only.as_ref().is_some_and(|o| !o.contains(&physical))
                        && self
                            .visible
                            .runtime
                            .as_ref()
                            .is_none_or(|ids| !ids.contains(&logical)) => {}
                // A broken NPU fails its own calls while the others answer: it is reported,
                // unusable, so that the table names it and a restart plans around it.
                Err((e, ip)) if let Some(health) = own_failure(&e) => {
                    first_unreadable.get_or_insert(e);
                    devices.push(Device {
                        server_id: self.server_id.clone(),
                        logical_id: logical,
                        physical_id: physical,
                        ip,
                        // The host's chip, from a device that answered (below).
                        chip: String::new(),
                        health,
                        super_device_id: None,
                        super_pod_id: None,
                    });
                }
                Err((e, _)) => return Err(e),
            }
        }
        let readable = devices
            .iter()
            .find(|d| !matches!(d.health, Health::Unreadable { .. }))
            .map(|d| d.chip.clone());
        match (readable, first_unreadable) {
            (Some(chip), _) => {
                for d in devices.iter_mut().filter(|d| d.chip.is_empty()) {
                    d.chip.clone_from(&chip);
                }
                Ok(devices)
            }
            (None, Some(e)) => Err(e),
            (None, None) => Ok(devices),
        }
    }

    /// The RoCE address of a device: IPv4 asked first, then IPv6 (the caller's `ip_type`
    /// chooses the family on a real driver); `None` when the port has neither.
    fn roce_address(&self, since: Instant, logical: u32) -> Result<Option<IpAddr>, DsmiError> {
        let f = self.functions;
        for family in [raw::IPADDR_TYPE_V4, raw::IPADDR_TYPE_V6] {
            let mut ip = IpAddrT {
                ip_type: family,
                ..IpAddrT::default()
            };
            let mut mask = ip;
            // SAFETY: two valid ip_addr_t (20 bytes, checked at compile time) to read and
            // write.
            let answer = self.call(
                since,
                "dsmi_get_device_ip_address",
                Some(logical),
                || unsafe { (f.ip)(logical as c_int, raw::DSMI_ROCE_PORT, 0, &mut ip, &mut mask) },
            );
            match answer {
                // An older driver writes its own type back: what it wrote is decoded.
                Ok(()) => {
                    if let Some(address) = address(&ip, logical)? {
                        return Ok(Some(address));
                    }
                }
                // "No address of this family" (the hccn tool's reading of NO_DEVICE); a driver
                // without IPv6 support may say NOT_SUPPORT for the second question.
                Err(DsmiError::Call { code, .. })
                    if code == NO_DEVICE
                        || (family == raw::IPADDR_TYPE_V6 && code == NOT_SUPPORT) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    /// The physical id of the device with this logical id.
    fn physical_of(&self, since: Instant, logical: u32) -> Result<u32, DsmiError> {
        let f = self.functions;
        let mut physical: c_uint = 0;
        // SAFETY: one unsigned int written through a valid pointer.
        self.call(
            since,
            "dsmi_get_phyid_from_logicid",
            Some(logical),
            || unsafe { (f.phyid)(logical, &mut physical) },
        )?;
        Ok(physical)
    }

    /// A device read whole, or the error of its first failing call with its RoCE address when
    /// that was read before (an NPU whose health cannot be read still has its address).
    fn device(
        &self,
        since: Instant,
        logical: u32,
        physical: u32,
    ) -> Result<Device, (DsmiError, Option<IpAddr>)> {
        let ip = self.roce_address(since, logical).map_err(|e| (e, None))?;
        self.read_device(since, logical, physical, ip)
            .map_err(|e| (e, ip))
    }

    fn read_device(
        &self,
        since: Instant,
        logical: u32,
        physical: u32,
        ip: Option<IpAddr>,
    ) -> Result<Device, DsmiError> {
        let f = self.functions;
        let id = logical as c_int;
        let chip = match f.chip {
            Some(get) => {
                let mut info = ChipInfo::default();
                // SAFETY: a valid 96-byte struct to write into.
                self.call(since, "dsmi_get_chip_info", Some(logical), || unsafe {
                    get(id, &mut info)
                })?;
                raw::c_field(&info.chip_name)
            }
            None => CHIP_WITHOUT_CHIP_INFO.to_string(),
        };
        let health = match f.health {
            Some(get) => {
                let mut code: c_uint = 0;
                // SAFETY: one unsigned int written through a valid pointer.
                self.call(since, "dsmi_get_device_health", Some(logical), || unsafe {
                    get(id, &mut code)
                })?;
                // 0xFFFFFFFF, a device that is not alive, reads as offline.
                Health::from_code(code)
            }
            // A driver without the function cannot report trouble; HCCL will, if there is any.
            None => Health::Healthy,
        };
        Ok(Device {
            server_id: self.server_id.clone(),
            logical_id: logical,
            physical_id: physical,
            ip,
            chip,
            health,
            super_device_id: None,
            super_pod_id: None,
        })
    }
}

impl Telemetry for DsmiProbe {
    fn sample(&self, devices: &[Device]) -> Vec<DeviceSample> {
        self.driver.sample(devices)
    }
}

impl Driver {
    /// One call per metric and device, each once (no retry: the next sample comes soon); a
    /// function the driver lacks leaves that metric absent, and a call that fails leaves it
    /// absent too, named in the sample's `failures` (a failing health call reads as the device
    /// unreadable, as the probe reads it). The driver is asked for each device by its own
    /// logical id: the devices' `logical_id` is the runtime's, which `ASCEND_RT_VISIBLE_DEVICES`
    /// renumbers.
    fn sample(&self, devices: &[Device]) -> Vec<DeviceSample> {
        let (ids, unmapped) = match self.driver_ids() {
            Ok(ids) => ids,
            Err(e) => return DeviceSample::all_failed(devices, &e.to_string()),
        };
        devices
            .iter()
            .map(|d| match ids.get(&d.physical_id) {
                Some(&logical) => self.sample_device(d.physical_id, logical),
                // Not found: one of the devices whose physical id the driver would not tell
                // (which one cannot be known), unreadable as a probe says, so that an alert on
                // its health fires; else the driver no longer lists it.
                None => match unmapped.first() {
                    Some(&(code, _)) => DeviceSample {
                        health: Some(Health::Unreadable {
                            code,
                            call: DriverCall::PhysicalId,
                        }),
                        ..DeviceSample::failed(
                            d.physical_id,
                            unmapped.iter().map(|(_, e)| e.clone()).collect(),
                        )
                    },
                    None => DeviceSample::failed(
                        d.physical_id,
                        vec![format!(
                            "the driver does not list physical id {} (dsmi_list_device)",
                            d.physical_id
                        )],
                    ),
                },
            })
            .collect()
    }

    /// The driver's logical id of each physical id (its calls take the former), as it lists
    /// its devices now, and the failures of the calls that would not tell a logical id's
    /// physical id (their code and error): one broken NPU does not hide the others.
    fn driver_ids(&self) -> Result<(PhysicalToLogical, Vec<(c_int, String)>), DsmiError> {
        let f = self.functions;
        let mut count: c_int = 0;
        // SAFETY: one int written through a valid pointer.
        check("dsmi_get_device_count", None, unsafe {
            (f.count)(&mut count)
        })?;
        let count = count.clamp(0, MAX_DEVICES);
        let mut ids: Vec<c_int> = vec![0; count as usize];
        if count > 0 {
            // SAFETY: the buffer holds `count` ints, as the function is told.
            check("dsmi_list_device", None, unsafe {
                (f.list)(ids.as_mut_ptr(), count)
            })?;
        }
        let mut physical_of = std::collections::HashMap::with_capacity(ids.len());
        let mut unmapped = Vec::new();
        for logical in ids.into_iter().filter_map(|id| u32::try_from(id).ok()) {
            let mut physical: c_uint = 0;
            // SAFETY: one unsigned int written through a valid pointer.
            let code = unsafe { (f.phyid)(logical, &mut physical) };
            match check("dsmi_get_phyid_from_logicid", Some(logical), code) {
                Ok(()) => {
                    physical_of.insert(physical, logical);
                }
                Err(e) => unmapped.push((code, e.to_string())),
            }
        }
        Ok((physical_of, unmapped))
    }

    /// One sample of the device with physical id `physical`, the driver's `logical`.
    fn sample_device(&self, physical: u32, logical: u32) -> DeviceSample {
        let f = self.functions;
        let id = logical as c_int;
        let mut s = DeviceSample::of(physical);
        let mut failures = Vec::new();
        // The call's answer when it succeeded; its failure named otherwise.
        let mut answered =
            |function: &'static str, code: c_int| match check(function, Some(logical), code) {
                Ok(()) => true,
                Err(e) => {
                    failures.push(e.to_string());
                    false
                }
            };
        if let Some(get) = f.utilization {
            let mut rate: c_uint = 0;
            // SAFETY: one unsigned int written through a valid pointer.
            let code = unsafe { get(id, raw::UTILIZATION_AI_CORE, &mut rate) };
            s.ai_core_percent = answered("dsmi_get_device_utilization_rate", code).then_some(rate);
        }
        if let Some(get) = f.temperature {
            let mut celsius: c_int = 0;
            // SAFETY: one int written through a valid pointer.
            let code = unsafe { get(id, &mut celsius) };
            s.temperature_c = answered("dsmi_get_device_temperature", code).then_some(celsius);
        }
        if let Some(get) = f.power {
            let mut info = raw::PowerInfo::default();
            // SAFETY: a valid struct to write into.
            let code = unsafe { get(id, &mut info) };
            s.power_decwatts =
                answered("dsmi_get_device_power_info", code).then_some(u32::from(info.power));
        }
        if let Some(get) = f.hbm {
            let mut info = raw::HbmInfo::default();
            // SAFETY: a valid struct to write into.
            let code = unsafe { get(id, &mut info) };
            if answered("dsmi_get_hbm_info", code) {
                s.hbm_total_mb = Some(info.memory_size / 1024);
                s.hbm_used_mb = Some(info.memory_usage / 1024);
            }
        }
        if let Some(get) = f.health {
            let mut health: c_uint = 0;
            // SAFETY: one unsigned int written through a valid pointer.
            let code = unsafe { get(id, &mut health) };
            // A health that cannot be read is no healthy device: unreadable, as a probe says.
            s.health = Some(match answered("dsmi_get_device_health", code) {
                true => Health::from_code(health),
                false => Health::Unreadable {
                    code,
                    call: DriverCall::Health,
                },
            });
        }
        if let Some(get) = f.errors {
            let mut count: c_int = 0;
            let mut codes = [0 as c_uint; raw::MAX_ERROR_CODES];
            // SAFETY: an int and an array of MAX_ERROR_CODES unsigned ints, as the header
            // requires.
            let code = unsafe { get(id, &mut count, codes.as_mut_ptr()) };
            if answered("dsmi_get_device_errorcode", code) {
                // A count beyond the array would be the driver's bug: clamped.
                let n = usize::try_from(count)
                    .unwrap_or(0)
                    .min(raw::MAX_ERROR_CODES);
                s.error_codes = Some(codes[..n].to_vec());
            }
        }
        s.failures = failures;
        s
    }
}

/// Each device's logical id in the driver's own numbering, by its physical id.
type PhysicalToLogical = std::collections::HashMap<u32, u32>;

/// `DRV_ERROR_NO_DEVICE`: from the address call, no address of the family asked for.
const NO_DEVICE: c_int = 1;
/// `DRV_ERROR_INNER_ERR`: from the count, a host with no device.
const INNER_ERR: c_int = 7;
/// `DRV_ERROR_TRY_AGAIN`: the driver is still starting.
const TRY_AGAIN: c_int = 51;
/// `DRV_ERROR_NOT_SUPPORT`.
const NOT_SUPPORT: c_int = 0xfffe;
/// How long `TRY_AGAIN` is retried unless `ATLASBOOST_DSMI_RETRY_SECS` says otherwise.
pub const DEFAULT_RETRY: Duration = Duration::from_secs(10);

/// How long one driver call may take unless `ATLASBOOST_DSMI_CALL_TIMEOUT_SECS` says otherwise:
/// far longer than any healthy call (milliseconds), short enough that a job does not wait for
/// ever on a wedged NPU.
pub const DEFAULT_CALL_LIMIT: Duration = Duration::from_secs(30);

/// Whether the probe's own variables (`ATLASBOOST_DSMI_RETRY_SECS`,
/// `ATLASBOOST_DSMI_CALL_TIMEOUT_SECS`) are well formed, before any library is loaded: a
/// malformed one is a setting's error, not a device's.
///
/// # Errors
///
/// [`DsmiError::BadVariable`] naming it.
pub fn check_settings() -> Result<(), DsmiError> {
    seconds_of(EnvVars::ATLASBOOST_DSMI_RETRY_SECS, DEFAULT_RETRY, 0.0)?;
    seconds_of(
        EnvVars::ATLASBOOST_DSMI_CALL_TIMEOUT_SECS,
        DEFAULT_CALL_LIMIT,
        0.1,
    )?;
    Ok(())
}

/// A number of seconds from `least` to 3600 in `variable`, or `default` when it is unset.
fn seconds_of(
    variable: &'static str,
    default: Duration,
    least: f64,
) -> Result<Duration, DsmiError> {
    let Some(value) = std::env::var_os(variable).filter(|v| !v.is_empty()) else {
        return Ok(default);
    };
    let value = value.to_string_lossy().into_owned();
    match value.trim().parse::<f64>() {
        Ok(secs) if secs.is_finite() && (least..=3600.0).contains(&secs) => {
            Ok(Duration::from_secs_f64(secs))
        }
        _ => Err(DsmiError::BadVariable {
            variable,
            value,
            reason: format!("expected a number of seconds from {least} to 3600"),
        }),
    }
}

impl DsmiProbe {
    /// The driver's devices, read on a thread of their own; a call that has not returned
    /// within the call limit fails the probe naming it (the thread is left to its call).
    fn devices(&self) -> Result<Vec<Device>, DsmiError> {
        self.after_a_stuck_call()?;
        let driver = Arc::clone(&self.driver);
        let (done, result) = std::sync::mpsc::channel();
        let reading = std::thread::Builder::new()
            .name("ab-dsmi".into())
            .spawn(move || {
                let _ = done.send(driver.devices());
            });
        let Ok(reading) = reading else {
            // No thread to be had: read here, unwatched.
            return self.driver.devices();
        };
        loop {
            match result.recv_timeout(Duration::from_millis(50)) {
                Ok(devices) => {
                    // It has answered: it ends now (and with it, perhaps, the last hold on
                    // the library), before the caller goes on.
                    let _ = reading.join();
                    return devices;
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(DsmiError::Nonsense {
                        function: "the probe",
                        what: "nothing: its thread ended without an answer".into(),
                    });
                }
            }
            let in_call = *self
                .driver
                .in_call
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some((function, device, since)) = in_call
                && since.elapsed() >= self.driver.call_limit
            {
                self.driver
                    .abandoned
                    .store(true, std::sync::atomic::Ordering::Release);
                *self.stuck.lock().unwrap_or_else(PoisonError::into_inner) = Some(reading);
                return Err(DsmiError::Hung {
                    function,
                    device,
                    waited: since.elapsed(),
                });
            }
        }
    }
}

impl DsmiProbe {
    /// Before a probe: if an earlier one gave up on a call that hangs, either that call has
    /// returned since (its thread has ended; the driver is used again) or it is named, with
    /// how long it has not returned, as the probe's failure.
    fn after_a_stuck_call(&self) -> Result<(), DsmiError> {
        let mut stuck = self.stuck.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(thread) = stuck.take() else {
            return Ok(());
        };
        // Once its call returns, the thread sees `abandoned` and ends without another call;
        // a moment is given to a thread that is on its way out.
        let until = Instant::now() + Duration::from_millis(100);
        while !thread.is_finished() && Instant::now() < until {
            let in_call = *self
                .driver
                .in_call
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some((function, device, since)) = in_call {
                *stuck = Some(thread);
                return Err(DsmiError::Hung {
                    function,
                    device,
                    waited: since.elapsed(),
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if !thread.is_finished() {
            *stuck = Some(thread);
            return Err(DsmiError::Nonsense {
                function: "the probe",
                what: "nothing: the thread it left in a call that hung earlier has not ended"
                    .into(),
            });
        }
        let _ = thread.join();
        self.driver
            .abandoned
            .store(false, std::sync::atomic::Ordering::Release);
        Ok(())
    }
}

impl DeviceProbe for DsmiProbe {
    fn name(&self) -> &str {
        "dsmi"
    }

    /// The library, and what an older one lacks: without `dsmi_get_device_health` every
    /// device reads healthy, which a reader must know.
    fn source(&self) -> Option<String> {
        let lacks: Vec<&str> = [
            (
                self.driver.functions.health.is_none(),
                "dsmi_get_device_health: health not read",
            ),
            (
                self.driver.functions.chip.is_none(),
                "dsmi_get_chip_info: chip taken for 910",
            ),
        ]
        .into_iter()
        .filter_map(|(missing, what)| missing.then_some(what))
        .collect();
        let library = self.driver.path.display();
        Some(match lacks.is_empty() {
            true => library.to_string(),
            false => format!("{library}, without {}", lacks.join(", without ")),
        })
    }

    fn probe(&self) -> atlasboost_core::Result<Vec<Device>> {
        let wrap = |e: DsmiError| Error::Probe {
            probe: "dsmi".into(),
            server_id: self.driver.server_id.clone(),
            source: e.into(),
        };
        let devices = self.devices().map_err(wrap)?;
        // The driver already shows only what a container runtime mounted; the CANN runtime's
        // own filter still applies to the workers.
        self.driver
            .visible
            .apply_runtime(devices, None)
            .map_err(wrap)
    }
}

fn required<T: Copy>(library: &Library, path: &Path, symbol: &'static str) -> Result<T, DsmiError> {
    optional(library, symbol).ok_or_else(|| DsmiError::MissingSymbol {
        library: path.to_path_buf(),
        symbol,
    })
}

fn optional<T: Copy>(library: &Library, symbol: &str) -> Option<T> {
    // SAFETY: `T` is the function's pointer type from the header (see `raw`); the pointer is
    // used only while `library` is loaded (both live in the same `DsmiProbe`).
    unsafe { library.get::<T>(symbol.as_bytes()) }
        .ok()
        .map(|s| *s)
}

/// The code of a call that failed for one device (which the driver answers for the others):
/// `None` for any other error.
fn own_failure(e: &DsmiError) -> Option<Health> {
    match e {
        DsmiError::Call {
            device: Some(_),
            code,
            function,
        } => Some(Health::Unreadable {
            code: *code,
            call: DriverCall::of_function(function)?,
        }),
        DsmiError::StillStarting {
            device: Some(_),
            function,
            ..
        } => Some(Health::Unreadable {
            code: TRY_AGAIN,
            call: DriverCall::of_function(function)?,
        }),
        _ => None,
    }
}

fn check(function: &'static str, device: Option<u32>, code: c_int) -> Result<(), DsmiError> {
    if code == 0 {
        Ok(())
    } else {
        Err(DsmiError::Call {
            function,
            device,
            code,
        })
    }
}

/// The RoCE address of device `logical`; `None` for a port with no address (all zeros).
fn address(ip: &IpAddrT, logical: u32) -> Result<Option<IpAddr>, DsmiError> {
    let addr = match ip.ip_type {
        raw::IPADDR_TYPE_V4 => IpAddr::V4(Ipv4Addr::new(
            ip.u_addr[0],
            ip.u_addr[1],
            ip.u_addr[2],
            ip.u_addr[3],
        )),
        raw::IPADDR_TYPE_V6 => IpAddr::V6(Ipv6Addr::from(ip.u_addr)),
        other => {
            return Err(DsmiError::Nonsense {
                function: "dsmi_get_device_ip_address",
                what: format!(
                    "address type {other} for device {logical} (expected 0 for IPv4 or 1 for \
                     IPv6)"
                ),
            });
        }
    };
    Ok((!addr.is_unspecified()).then_some(addr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_decode_in_dotted_order_and_zero_is_none() {
        let mut ip = IpAddrT::default();
        ip.u_addr[..4].copy_from_slice(&[192, 168, 100, 101]);
        assert_eq!(
            address(&ip, 3).unwrap(),
            Some(IpAddr::from([192, 168, 100, 101]))
        );
        assert_eq!(address(&IpAddrT::default(), 3).unwrap(), None);
        ip.ip_type = raw::IPADDR_TYPE_V6;
        ip.u_addr = "fd00::1".parse::<Ipv6Addr>().unwrap().octets();
        assert_eq!(address(&ip, 3).unwrap(), Some("fd00::1".parse().unwrap()));
        ip.ip_type = 2;
        assert!(
            address(&ip, 3)
                .unwrap_err()
                .to_string()
                .contains("address type 2 for device 3")
        );
    }

    #[test]
    fn error_codes_name_the_function_device_and_meaning() {
        let e = check("dsmi_get_device_health", Some(3), 2).unwrap_err();
        assert_eq!(
            e.to_string(),
            "dsmi_get_device_health(device 3) returned 2 (INVALID_DEVICE: no such device)"
        );
        let e = check("dsmi_get_device_count", None, -8005).unwrap_err();
        assert_eq!(e.to_string(), "dsmi_get_device_count() returned -8005");
    }
}
