//! Picking the device probe from [`Discovery`] (SPEC §3), and the devices a job may use.

use std::path::{Path, PathBuf};

use atlasboost_core::{
    Device, DeviceList, DeviceProbe, DeviceSample, EnvVars, Telemetry, select_devices,
};
use atlasboost_dsmi::{DsmiError, DsmiProbe, HCCN_CONF, HccnProbe, VisibleDevices};
use atlasboost_sim::SimProbe;

use crate::settings::{Discovery, Origin, ProbeKind, Setting};

/// Why no probe can be made, or it found nothing. Messages name the flags or the variables the
/// user set ([`Origin`]).
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// Simulated devices asked for without a number of them.
    #[error("{} needs {} (the number of simulated devices)", origin.assignment(Setting::Probe, "sim"), origin.name(Setting::Sim))]
    SimWithoutCount {
        /// How the user asked.
        origin: Origin,
    },
    /// Simulated and real devices both asked for.
    #[error("{} asks for simulated devices but {} asks for real ones; {} one of them",
        origin.name(Setting::Sim).split(' ').next().unwrap_or_default(),
        origin.assignment(Setting::Probe, kind.as_str()), origin.verb())]
    SimAndReal {
        /// How the user asked.
        origin: Origin,
        /// The real probe asked for.
        kind: ProbeKind,
    },
    /// `--hccn-conf` given with a probe that never reads it.
    #[error("{other} does not read hccn.conf: --hccn-conf {} would be ignored; drop one of them", path.display())]
    HccnConfUnused {
        /// The flag that picks another source (`--sim`, `--probe dsmi`).
        other: &'static str,
        /// The hccn.conf given.
        path: PathBuf,
    },
    /// `--hccn-conf` given with `--probe auto` on a machine whose driver loaded: auto reads
    /// hccn.conf only where there is no driver.
    #[error("--probe auto takes the driver before hccn.conf, and its DSMI library loaded: --hccn-conf {} would be ignored; give --probe hccn to read the file, or drop --hccn-conf", path.display())]
    HccnConfBehindDriver {
        /// The hccn.conf given.
        path: PathBuf,
    },
    /// The simulated devices' settings (`ATLASBOOST_SIM_FAULTS`) are malformed.
    #[error(transparent)]
    Sim(atlasboost_core::Error),
    /// The driver asked for cannot be used.
    #[error("{}", origin.assignment(Setting::Probe, "dsmi"))]
    Dsmi {
        /// How the user asked.
        origin: Origin,
        /// Why.
        #[source]
        source: DsmiError,
    },
    /// The driver, tried first by `--probe auto` (the default), is there but cannot be used
    /// (a malformed variable of its own).
    #[error("the Ascend driver (tried first, as --probe auto does)")]
    AutoDsmi {
        /// Why.
        #[source]
        source: DsmiError,
    },
    /// The hccn.conf asked for does not exist.
    #[error("{}: {} does not exist ({}{} reads another file)", origin.assignment(Setting::Probe, "hccn"), path.display(),
        from.map_or(String::new(), |v| format!("it is {v}'s; ")), origin.name(Setting::HccnConf))]
    HccnMissing {
        /// How the user asked.
        origin: Origin,
        /// The file.
        path: PathBuf,
        /// The variable that named it, when one did (not the flag, not the default).
        from: Option<&'static str>,
    },
    /// The hccn.conf cannot be used.
    #[error("{}", origin.assignment(Setting::Probe, "hccn"))]
    Hccn {
        /// How the user asked.
        origin: Origin,
        /// Why.
        #[source]
        source: DsmiError,
    },
    /// `auto` found neither a driver nor an hccn.conf.
    #[error("found no device source: {dsmi}; and {} does not exist. On a machine without NPUs, {} {} to use N simulated devices{}",
        hccn.display(), origin.verb(), sim_example(*origin),
        unread_sim.as_ref().map_or(String::new(), |v| format!(
            " ({}={v} is set, but only init() in a worker reads it; the command takes --sim {})",
            EnvVars::ATLASBOOST_SIM,
            if v.parse::<u32>().is_ok() { v.as_ref() } else { "N" })))]
    NoSource {
        /// How the user asked.
        origin: Origin,
        /// Why the driver did not load.
        dsmi: DsmiError,
        /// The hccn.conf looked for.
        hccn: PathBuf,
        /// `ATLASBOOST_SIM`'s value, when it is set where only the command line chooses (a
        /// command of `atlasboost`, not library mode): a user may expect it to apply.
        unread_sim: Option<Box<str>>,
    },
    /// `auto` found the driver's library (or was told where it is) but it does not work: not
    /// a reason to fall back to hccn.conf, whose devices would have no health or chip.
    #[error("the Ascend driver cannot be used: {dsmi}. Mend it, or {} {} to read {}{}",
        origin.verb(), origin.assignment(Setting::Probe, "hccn"), hccn.display(),
        match hccn_exists {
            true => " instead",
            false => " (not there now: name the hccn.conf to read as well)",
        })]
    DriverBroken {
        /// How the user asked.
        origin: Origin,
        /// Why the driver did not load.
        dsmi: DsmiError,
        /// The hccn.conf that `--probe hccn` would read.
        hccn: PathBuf,
        /// Whether that file is there.
        hccn_exists: bool,
    },
    /// `ASCEND_RT_VISIBLE_DEVICES` (applied to simulated devices too) is malformed.
    #[error(transparent)]
    Visible(DsmiError),
    /// The probe ran and failed.
    #[error(transparent)]
    Probe(#[from] atlasboost_core::Error),
    /// The probe found no device.
    #[error("the {probe} probe found no devices on this host")]
    NoDevices {
        /// The probe's name.
        probe: String,
    },
}

impl ProbeError {
    /// Whether the settings contradict each other (the command line's usage errors, exit 2),
    /// rather than a source that cannot be used.
    #[must_use]
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            ProbeError::SimWithoutCount { .. }
                | ProbeError::SimAndReal { .. }
                | ProbeError::HccnConfUnused { .. }
                | ProbeError::HccnConfBehindDriver { .. }
        )
    }
}

fn sim_example(origin: Origin) -> &'static str {
    match origin {
        Origin::CommandLine => "--sim N",
        Origin::Environment => "ATLASBOOST_SIM=N",
    }
}

/// Whether `discovery`'s settings go together, before anything is probed or loaded.
///
/// # Errors
///
/// The [`ProbeError`]s of [`ProbeError::is_usage`]: settings that contradict each other.
pub fn check_choice(discovery: &Discovery) -> Result<(), ProbeError> {
    let origin = discovery.origin;
    // A flag the chosen probe never reads is an error, not a silent no-op. (A variable may be
    // set machine-wide, for other jobs: only the flag is refused.)
    if let (Some(path), Origin::CommandLine) = (&discovery.hccn_conf, origin) {
        let other = match (discovery.probe, discovery.sim) {
            (_, Some(_)) => Some("--sim"),
            (ProbeKind::Dsmi, None) => Some("--probe dsmi"),
            _ => None,
        };
        if let Some(other) = other {
            return Err(ProbeError::HccnConfUnused {
                other,
                path: path.clone(),
            });
        }
    }
    match (discovery.probe, discovery.sim) {
        (ProbeKind::Sim, None) => Err(ProbeError::SimWithoutCount { origin }),
        (kind @ (ProbeKind::Dsmi | ProbeKind::Hccn), Some(_)) => {
            Err(ProbeError::SimAndReal { origin, kind })
        }
        _ => Ok(()),
    }
}

/// The probe `discovery` asks for. Simulated devices only with a number of them; `auto` takes
/// the driver if it loads, else hccn.conf if it exists, and never simulated devices.
///
/// # Errors
///
/// [`ProbeError`] naming the settings that contradict each other, or saying what was tried.
pub fn make_probe(
    discovery: &Discovery,
    server_id: &str,
) -> Result<Box<dyn DeviceProbe>, ProbeError> {
    check_choice(discovery)?;
    let origin = discovery.origin;
    match (discovery.probe, discovery.sim) {
        (ProbeKind::Sim | ProbeKind::Auto, Some(n)) => Ok(Box::new(SimVisible {
            sim: sim_probe(discovery, server_id, n)?,
            visible: VisibleDevices::runtime_from_env().map_err(ProbeError::Visible)?,
        })),
        // (Refused by check_choice.)
        (ProbeKind::Sim, None) => Err(ProbeError::SimWithoutCount { origin }),
        (kind @ (ProbeKind::Dsmi | ProbeKind::Hccn), Some(_)) => {
            Err(ProbeError::SimAndReal { origin, kind })
        }
        (ProbeKind::Dsmi, None) => DsmiProbe::load(server_id)
            .map(|p| Box::new(p.only(job_devices(discovery))) as Box<dyn DeviceProbe>)
            .map_err(|source| ProbeError::Dsmi { origin, source }),
        (ProbeKind::Hccn, None) => {
            let path = hccn_conf(discovery);
            if !path.exists() {
                let from = (discovery.hccn_conf.is_none()
                    && origin == Origin::CommandLine
                    && crate::settings::env_path(EnvVars::ATLASBOOST_HCCN_CONF).is_some())
                .then_some(EnvVars::ATLASBOOST_HCCN_CONF);
                return Err(ProbeError::HccnMissing { origin, path, from });
            }
            hccn_probe(server_id, &path, origin)
        }
        (ProbeKind::Auto, None) => {
            let dsmi = match DsmiProbe::load(server_id) {
                // A flag naming the file that would not be read is refused (a variable may be
                // set machine-wide, for machines without the driver).
                Ok(_) if origin == Origin::CommandLine && discovery.hccn_conf.is_some() => {
                    return Err(ProbeError::HccnConfBehindDriver {
                        path: discovery.hccn_conf.clone().unwrap_or_default(),
                    });
                }
                Ok(p) => return Ok(Box::new(p.only(job_devices(discovery)))),
                Err(e) => e,
            };
            let path = hccn_conf(discovery);
            // hccn.conf stands in only where there is no driver at all: a library that is
            // there (or named by ATLASBOOST_DSMI_LIB) and fails is said.
            let named = crate::settings::env_path(EnvVars::ATLASBOOST_DSMI_LIB).is_some();
            let library_trouble = matches!(
                dsmi,
                DsmiError::NotFound { .. } | DsmiError::MissingSymbol { .. }
            );
            if !library_trouble {
                // A malformed variable of the probe's, not the library: said as it is.
                return Err(ProbeError::AutoDsmi { source: dsmi });
            }
            if named
                || atlasboost_dsmi::library_candidates()
                    .iter()
                    .any(|p| p.exists())
            {
                return Err(ProbeError::DriverBroken {
                    origin,
                    dsmi,
                    hccn_exists: path.exists(),
                    hccn: path,
                });
            }
            if path.exists() {
                return hccn_probe(server_id, &path, origin);
            }
            let unread_sim = match origin {
                // Empty counts as unset, as everywhere.
                Origin::CommandLine => std::env::var_os(EnvVars::ATLASBOOST_SIM)
                    .map(|v| v.to_string_lossy().trim().to_string())
                    .filter(|v| !v.is_empty())
                    .map(String::into_boxed_str),
                Origin::Environment => None,
            };
            Err(ProbeError::NoSource {
                origin,
                dsmi,
                hccn: path,
                unread_sim,
            })
        }
    }
}

/// The simulated devices `discovery` asks for (`n` of them).
fn sim_probe(discovery: &Discovery, server_id: &str, n: u32) -> Result<SimProbe, ProbeError> {
    let probe = SimProbe::new(server_id, n)
        .with_chip(discovery.sim_chip.clone())
        .with_ipv6(discovery.sim_ipv6);
    match &discovery.sim_faults {
        None => probe.with_faults_from_env(),
        Some(f) => probe.with_faults_of(f.spec.as_deref(), f.file.clone()),
    }
    .map_err(ProbeError::Sim)
}

/// Simulated devices as a process under `ASCEND_RT_VISIBLE_DEVICES` sees them: only the
/// listed logical ids, renumbered from 0, as the driver's probes apply it. (The workers
/// inherit the variable; without this, two ranks would be given one device.)
struct SimVisible {
    sim: SimProbe,
    visible: VisibleDevices,
}

impl DeviceProbe for SimVisible {
    fn name(&self) -> &str {
        self.sim.name()
    }

    fn probe(&self) -> atlasboost_core::Result<Vec<Device>> {
        let devices = self.sim.probe()?;
        let server_id = devices.first().map(|d| d.server_id.clone());
        self.visible
            .apply_runtime(devices, None)
            .map_err(|e| atlasboost_core::Error::Probe {
                probe: "sim".into(),
                server_id: server_id.unwrap_or_default(),
                source: Box::new(e),
            })
    }
}

/// No telemetry: every metric absent (hccn.conf describes addresses, not load).
#[derive(Debug, Clone, Copy)]
pub struct NoTelemetry;

impl Telemetry for NoTelemetry {
    fn sample(&self, devices: &[Device]) -> Vec<DeviceSample> {
        DeviceSample::none_of(devices)
    }
}

/// The telemetry of a driver that cannot be loaded: every device without values, each naming
/// why (the library is gone, or cannot be opened).
#[derive(Debug, Clone)]
pub struct FailedTelemetry(pub String);

impl Telemetry for FailedTelemetry {
    fn sample(&self, devices: &[Device]) -> Vec<DeviceSample> {
        DeviceSample::all_failed(devices, &self.0)
    }
}

/// The telemetry of the devices the probe named `probe` (`sim`, `dsmi`, ...: a
/// [`DeviceProbe::name`], of the probe [`make_probe`] made from `discovery`) finds: the same
/// backend's (the driver's, or the simulated devices'), re-read at every sample (the simulated
/// faults too); none for hccn.conf. By name, so that a thread of its own can make it.
///
/// # Errors
///
/// The simulated faults, when malformed (a driver that cannot be loaded is no error: its
/// samples name why, [`FailedTelemetry`]).
pub fn make_telemetry(
    probe: &str,
    discovery: &Discovery,
    server_id: &str,
) -> Result<Box<dyn Telemetry>, ProbeError> {
    Ok(match (probe, discovery.sim) {
        ("sim", Some(n)) => Box::new(sim_probe(discovery, server_id, n)?),
        ("dsmi", _) => match DsmiProbe::load(server_id) {
            Ok(p) => Box::new(p),
            Err(e) => Box::new(FailedTelemetry(format!("the driver cannot be loaded: {e}"))),
        },
        _ => Box::new(NoTelemetry),
    })
}

/// The telemetry of host `server_id`'s devices as `discovery` finds them ([`make_probe`],
/// then [`make_telemetry`]); none when they cannot be probed (the launch reports that itself).
pub fn telemetry_of(discovery: &Discovery, server_id: &str) -> Box<dyn Telemetry> {
    make_probe(discovery, server_id)
        .and_then(|p| make_telemetry(p.name(), discovery, server_id))
        .unwrap_or_else(|_| Box::new(NoTelemetry))
}

/// The physical ids `--devices` keeps, if it is given.
fn job_devices(discovery: &Discovery) -> Option<std::collections::BTreeSet<u32>> {
    discovery.devices.as_ref().map(|list| list.ids().collect())
}

/// The hccn.conf setting, else `$ATLASBOOST_HCCN_CONF`, else `/etc/hccn.conf`: the file a probe
/// that reads one reads.
#[must_use]
pub fn hccn_conf(discovery: &Discovery) -> PathBuf {
    discovery
        .hccn_conf
        .clone()
        .or_else(|| crate::settings::env_path(EnvVars::ATLASBOOST_HCCN_CONF))
        .unwrap_or_else(|| PathBuf::from(HCCN_CONF))
}

fn hccn_probe(
    server_id: &str,
    path: &Path,
    origin: Origin,
) -> Result<Box<dyn DeviceProbe>, ProbeError> {
    HccnProbe::new(server_id, path)
        .map(|p| Box::new(p) as Box<dyn DeviceProbe>)
        .map_err(|source| ProbeError::Hccn { origin, source })
}

/// The devices of this host the job may use: the probe's, restricted to `list`.
///
/// # Errors
///
/// The probe's error, none found, or one naming the listed ids the host does not have.
pub fn local_devices(
    probe: &dyn DeviceProbe,
    list: Option<&DeviceList>,
) -> Result<Vec<Device>, ProbeError> {
    let devices = probe.probe()?;
    if devices.is_empty() {
        return Err(ProbeError::NoDevices {
            probe: probe.name().to_string(),
        });
    }
    Ok(match list {
        Some(list) => select_devices(devices, list)?,
        None => devices,
    })
}

#[cfg(test)]
mod tests {
    use atlasboost_core::exchange::error_chain;

    use super::*;

    fn discovery(origin: Origin, probe: ProbeKind, sim: Option<u32>) -> Discovery {
        Discovery {
            probe,
            sim,
            ..Discovery::defaults(origin)
        }
    }

    fn refusal(origin: Origin, probe: ProbeKind, sim: Option<u32>) -> ProbeError {
        match make_probe(&discovery(origin, probe, sim), "10.0.0.1") {
            Ok(p) => panic!("{} probe made", p.name()),
            Err(e) => e,
        }
    }

    #[test]
    fn contradictions_name_what_the_user_set() {
        let e = refusal(Origin::CommandLine, ProbeKind::Sim, None);
        assert!(e.is_usage());
        assert_eq!(
            e.to_string(),
            "--probe sim needs --sim N (the number of simulated devices)"
        );
        let e = refusal(Origin::Environment, ProbeKind::Sim, None);
        assert_eq!(
            e.to_string(),
            "ATLASBOOST_PROBE=sim needs ATLASBOOST_SIM (the number of simulated devices)"
        );
        let e = refusal(Origin::CommandLine, ProbeKind::Dsmi, Some(2));
        assert_eq!(
            e.to_string(),
            "--sim asks for simulated devices but --probe dsmi asks for real ones; pass one of them"
        );
        let e = refusal(Origin::Environment, ProbeKind::Hccn, Some(2));
        assert_eq!(
            e.to_string(),
            "ATLASBOOST_SIM asks for simulated devices but ATLASBOOST_PROBE=hccn asks for real \
             ones; set one of them"
        );
    }

    #[test]
    fn a_missing_hccn_conf_is_named_with_the_way_to_read_another() {
        let mut d = discovery(Origin::Environment, ProbeKind::Hccn, None);
        d.hccn_conf = Some("/nonexistent/hccn.conf".into());
        let e = make_probe(&d, "10.0.0.1").err().map(|e| error_chain(&e));
        assert_eq!(
            e.as_deref(),
            Some(
                "ATLASBOOST_PROBE=hccn: /nonexistent/hccn.conf does not exist \
                 (ATLASBOOST_HCCN_CONF reads another file)"
            )
        );
    }

    #[test]
    fn simulated_devices_are_listed_and_restricted() {
        let probe = make_probe(
            &discovery(Origin::CommandLine, ProbeKind::Auto, Some(4)),
            "10.0.0.1",
        )
        .unwrap();
        let list: DeviceList = "1-2".parse().unwrap();
        let ids: Vec<u32> = local_devices(probe.as_ref(), Some(&list))
            .unwrap()
            .iter()
            .map(|d| d.physical_id)
            .collect();
        assert_eq!(ids, [1, 2]);
    }
}
