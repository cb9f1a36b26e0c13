//! Picking the device probe (SPEC §3) and listing this host's devices.

use std::path::{Path, PathBuf};

use atlasboost_core::{Device, DeviceList, DeviceProbe, EnvVars, select_devices};
use atlasboost_dsmi::{DsmiProbe, HCCN_CONF, HccnProbe};
use atlasboost_sim::SimProbe;

use crate::cli::{DeviceArgs, DiscoveryArgs, ProbeKind};
use crate::error::CliError;
use crate::host::primary_ipv4;

/// This host's `server_id`: `--server-id`, else its primary IPv4 address.
///
/// # Errors
///
/// [`CliError::Failure`] when no address can be found (the message says to pass `--server-id`).
pub fn server_id(args: &DeviceArgs) -> Result<String, CliError> {
    match &args.server_id {
        Some(id) => Ok(id.clone()),
        None => primary_ipv4()
            .map(|ip| ip.to_string())
            .map_err(CliError::Failure),
    }
}

/// The probe the options ask for (SPEC §3). Simulated devices only with `--sim N`; `auto`
/// takes the driver if it loads, else hccn.conf if it exists, and never simulated devices.
///
/// # Errors
///
/// [`CliError::Usage`] for options that contradict each other; [`CliError::Failure`] when the
/// asked-for source cannot be used, saying what was tried.
pub fn make_probe(args: &DiscoveryArgs, server_id: &str) -> Result<Box<dyn DeviceProbe>, CliError> {
    match (args.probe, args.sim) {
        (ProbeKind::Sim | ProbeKind::Auto, Some(n)) => Ok(Box::new(
            SimProbe::new(server_id, n)
                .with_chip(args.sim_chip.clone())
                .with_ipv6(args.sim_ipv6)
                .with_faults_from_env()?,
        )),
        (ProbeKind::Sim, None) => Err(CliError::Usage(
            "--probe sim needs --sim N (the number of simulated devices)".into(),
        )),
        (kind @ (ProbeKind::Dsmi | ProbeKind::Hccn), Some(_)) => Err(CliError::Usage(format!(
            "--sim asks for simulated devices but --probe {} asks for real ones; pass one of them",
            kind.as_str()
        ))),
        (ProbeKind::Dsmi, None) => DsmiProbe::load(server_id)
            .map(|p| Box::new(p) as Box<dyn DeviceProbe>)
            .map_err(|e| CliError::Failure(format!("--probe dsmi: {e}"))),
        (ProbeKind::Hccn, None) => {
            let path = hccn_conf(args);
            if !path.exists() {
                return Err(CliError::Failure(format!(
                    "--probe hccn: {} does not exist (--hccn-conf PATH reads another file)",
                    path.display()
                )));
            }
            hccn_probe(server_id, &path)
        }
        (ProbeKind::Auto, None) => {
            let dsmi = match DsmiProbe::load(server_id) {
                Ok(p) => return Ok(Box::new(p)),
                Err(e) => e,
            };
            let path = hccn_conf(args);
            if path.exists() {
                return hccn_probe(server_id, &path);
            }
            Err(CliError::Failure(format!(
                "found no device source: {dsmi}; and {} does not exist. On a machine without \
                 NPUs, pass --sim N to use N simulated devices",
                path.display()
            )))
        }
    }
}

/// `--hccn-conf`, else `$ATLASBOOST_HCCN_CONF`, else `/etc/hccn.conf`.
fn hccn_conf(args: &DiscoveryArgs) -> PathBuf {
    args.hccn_conf
        .clone()
        .or_else(|| std::env::var_os(EnvVars::ATLASBOOST_HCCN_CONF).map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(HCCN_CONF))
}

fn hccn_probe(server_id: &str, path: &Path) -> Result<Box<dyn DeviceProbe>, CliError> {
    HccnProbe::new(server_id, path)
        .map(|p| Box::new(p) as Box<dyn DeviceProbe>)
        .map_err(|e| CliError::Failure(format!("--probe hccn: {e}")))
}

/// The devices of this host the job may use: the probe's, restricted to `--devices`.
///
/// # Errors
///
/// The probe's error, or one naming the `--devices` ids the host does not have.
pub fn local_devices(
    probe: &dyn DeviceProbe,
    list: Option<&DeviceList>,
) -> Result<Vec<Device>, CliError> {
    let devices = probe.probe()?;
    if devices.is_empty() {
        return Err(CliError::Failure(format!(
            "the {} probe found no devices on this host",
            probe.name()
        )));
    }
    Ok(match list {
        Some(list) => select_devices(devices, list)?,
        None => devices,
    })
}
