//! `atlasboost probe`: this server's devices, like a small `npu-smi info`.

use atlasboost_core::Device;
use serde::Serialize;

use atlasboost::probe::{local_devices, make_probe};

use super::devices::server_id;
use crate::error::CliError;
use crate::printer::Printer;
use crate::settings::ProbeSettings;

#[derive(Debug, Serialize)]
struct Report<'a> {
    server_id: &'a str,
    probe: &'a str,
    devices: &'a [Device],
}

/// Runs `atlasboost probe`.
///
/// # Errors
///
/// The probe's errors, or a `--devices` id the host does not have.
pub fn run(args: &ProbeSettings, printer: &Printer) -> Result<(), CliError> {
    let server_id = server_id(&args.devices)?;
    let probe = make_probe(&args.devices.discovery, &server_id)?;
    let devices = local_devices(probe.as_ref(), args.devices.discovery.devices.as_ref())?;
    let text = if args.json {
        let report = Report {
            server_id: &server_id,
            probe: probe.name(),
            devices: &devices,
        };
        serde_json::to_string_pretty(&report)
            .map(|s| s + "\n")
            .map_err(CliError::json("encode the devices"))?
    } else {
        render_table(&server_id, probe.name(), &devices)
    };
    printer.out(&text).map_err(CliError::Stdout)
}

fn render_table(server_id: &str, probe: &str, devices: &[Device]) -> String {
    let rows: Vec<[String; 5]> = devices
        .iter()
        .map(|d| {
            [
                d.logical_id.to_string(),
                d.physical_id.to_string(),
                d.ip.map_or_else(|| "-".to_string(), |ip| ip.to_string()),
                d.chip.clone(),
                d.health.to_string(),
            ]
        })
        .collect();
    let header = ["logical", "physical", "device ip", "chip", "health"];
    let width = |col: usize| {
        rows.iter()
            .map(|r| r[col].len())
            .chain([header[col].len()])
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = (0..5).map(width).collect();
    let line = |cells: [&str; 5]| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i == 4 {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  ", w = widths[i]));
            }
        }
        s.push('\n');
        s
    };
    let mut out = format!(
        "server {server_id}: {} device{} ({probe} probe)\n",
        devices.len(),
        if devices.len() == 1 { "" } else { "s" }
    );
    out.push_str(&line(header));
    for r in &rows {
        out.push_str(&line([&r[0], &r[1], &r[2], &r[3], &r[4]]));
    }
    out
}
