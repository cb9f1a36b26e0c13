//! Picking the device probe (SPEC §3) and listing this host's devices.

use atlasboost_core::{Device, DeviceList, DeviceProbe, select_devices};
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

/// The probe the options ask for. Simulated devices only with `--sim N`.
///
/// # Errors
///
/// [`CliError::Usage`] for options that contradict each other; [`CliError::Failure`] for a
/// probe that this build does not have yet.
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
            probe_name(kind)
        ))),
        (kind @ (ProbeKind::Dsmi | ProbeKind::Hccn), None) => Err(CliError::Failure(format!(
            "the {} probe is not built yet in this version of atlasboost; \
             pass --sim N to use N simulated devices",
            probe_name(kind)
        ))),
        (ProbeKind::Auto, None) => Err(CliError::Failure(
            "found no devices: the dsmi probe (driver library) and the hccn probe \
             (/etc/hccn.conf) are not built yet in this version of atlasboost; \
             pass --sim N to use N simulated devices"
                .into(),
        )),
    }
}

fn probe_name(kind: ProbeKind) -> &'static str {
    match kind {
        ProbeKind::Auto => "auto",
        ProbeKind::Dsmi => "dsmi",
        ProbeKind::Hccn => "hccn",
        ProbeKind::Sim => "sim",
    }
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
