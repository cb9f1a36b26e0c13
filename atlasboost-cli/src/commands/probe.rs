//! `atlasboost probe`: this server's devices, like a small `npu-smi info`; with `--watch`,
//! their telemetry refreshed (SPEC §13).

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use atlasboost_core::{Device, DeviceSample};
use serde::Serialize;

use atlasboost::probe::{local_devices, make_probe, make_telemetry};

use super::devices::server_id;
use crate::error::CliError;
use crate::printer::Printer;
use crate::settings::ProbeSettings;

#[derive(Debug, Serialize)]
struct Report<'a> {
    server_id: &'a str,
    probe: &'a str,
    /// The driver library or hccn.conf read (absent for simulated devices).
    #[serde(skip_serializing_if = "Option::is_none")]
    source: Option<String>,
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
    if let Some(every) = args.watch {
        return watch(args, &server_id, probe.as_ref(), &devices, every, printer);
    }
    let text = if args.json {
        let report = Report {
            server_id: &server_id,
            probe: probe.name(),
            source: probe.source(),
            devices: &devices,
        };
        serde_json::to_string_pretty(&report)
            .map(|s| s + "\n")
            .map_err(CliError::json("encode the devices"))?
    } else {
        let probe = match probe.source() {
            Some(source) => format!("{} probe, {source}", probe.name()),
            None => format!("{} probe", probe.name()),
        };
        render_table(&server_id, &probe, &devices)
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
        "server {server_id}: {} device{} ({probe})\n",
        devices.len(),
        if devices.len() == 1 { "" } else { "s" }
    );
    out.push_str(&line(header));
    for r in &rows {
        out.push_str(&line([&r[0], &r[1], &r[2], &r[3], &r[4]]));
    }
    out
}

/// One JSON line of `--watch --json`.
#[derive(Debug, Serialize)]
struct Sampled<'a> {
    /// Unix time, seconds.
    time: f64,
    server_id: &'a str,
    devices: &'a [DeviceSample],
    /// Seconds since the reading under way was asked for, when it has not come back (a driver
    /// call hangs): the devices' values are then absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    no_answer_for_s: Option<f64>,
}

/// How long `--watch` waits for a reading of the devices (at least its interval, and twice
/// the last reading's time: a slow driver of many NPUs is no hung one) before it shows them
/// without values, saying for how long the driver has not answered.
const NO_ANSWER_AFTER: Duration = Duration::from_secs(2);

/// `--watch`: samples every `every` until interrupted (the default action of SIGINT and
/// SIGTERM ends it; a closed stdout too). The devices are read on a thread of their own, so
/// that a driver call that hangs (a wedged NPU) shows as such instead of freezing the view.
fn watch(
    args: &ProbeSettings,
    server_id: &str,
    probe: &dyn atlasboost_core::DeviceProbe,
    devices: &[Device],
    every: Duration,
    printer: &Printer,
) -> Result<(), CliError> {
    let redraw = std::io::stdout().is_terminal() && !args.json;
    let (ask, asks) = std::sync::mpsc::channel::<()>();
    let (answer, answers) = std::sync::mpsc::channel();
    let reading = (
        probe.name().to_string(),
        args.devices.discovery.clone(),
        server_id.to_string(),
        devices.to_vec(),
    );
    std::thread::Builder::new()
        .name("ab-telemetry".into())
        .spawn(move || {
            let (probe, discovery, server_id, devices) = reading;
            // Ends when the watch does (or, stuck in a driver call, with the process).
            while asks.recv().is_ok() {
                // Made again each time: the simulated faults are re-read, as the driver's are.
                let samples = make_telemetry(&probe, &discovery, &server_id)
                    .map(|telemetry| telemetry.sample(&devices));
                if answer.send(samples).is_err() {
                    return;
                }
            }
        })
        .map_err(CliError::system("start the thread reading the devices"))?;
    // When the reading under way was asked for, and whether its lateness was shown.
    let mut asked: Option<(Instant, bool)> = None;
    // The clock's time of that ask: what a reading's `time` says.
    let mut asked_at = std::time::SystemTime::now();
    // How long the last reading took.
    let mut took = Duration::ZERO;
    loop {
        let (since, shown) = match asked {
            Some(a) => a,
            None => {
                ask.send(()).map_err(|_| gone())?;
                asked_at = std::time::SystemTime::now();
                (Instant::now(), false)
            }
        };
        let wait = match shown {
            false => (since + every.max(NO_ANSWER_AFTER).max(took * 2))
                .saturating_duration_since(Instant::now()),
            true => every,
        };
        let (samples, late) = match answers.recv_timeout(wait) {
            Ok(samples) => {
                asked = None;
                took = since.elapsed();
                // One shown late already (lines without values, stamped when shown) is
                // stamped now too: a line's time never goes back.
                if shown {
                    asked_at = std::time::SystemTime::now();
                }
                (samples?, None)
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                asked = Some((since, true));
                (DeviceSample::none_of(devices), Some(since.elapsed()))
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return Err(gone()),
        };
        // A reading is of when it was asked for; a late one's absent values are of now.
        let now = match late {
            None => asked_at,
            Some(_) => std::time::SystemTime::now(),
        }
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
        let text = if args.json {
            let line = Sampled {
                time: now,
                server_id,
                devices: &samples,
                no_answer_for_s: late.map(|l| (l.as_secs_f64() * 10.0).round() / 10.0),
            };
            serde_json::to_string(&line)
                .map(|s| s + "\n")
                .map_err(CliError::json("encode the samples"))?
        } else {
            let table = render_samples(server_id, devices, &samples, late);
            match redraw {
                // Home and clear, then the table: redrawn in place.
                true => format!("\x1b[H\x1b[2J{table}"),
                false => format!("{table}\n"),
            }
        };
        printer.out(&text).map_err(CliError::Stdout)?;
        // The next reading `every` after this one was asked for: a slow driver does not
        // stretch the interval by its reading's time.
        if late.is_none() {
            std::thread::sleep((since + every).saturating_duration_since(Instant::now()));
        }
    }
}

/// The reading thread ended without an answer (it panicked).
fn gone() -> CliError {
    CliError::Failure(
        "the thread reading the devices' telemetry has ended without an answer".into(),
    )
}

/// The telemetry table, as `npu-smi info` shows it; `-` for what the driver does not tell.
/// `late`: how long the driver has not answered, when the values are absent for that.
fn render_samples(
    server_id: &str,
    devices: &[Device],
    samples: &[DeviceSample],
    late: Option<Duration>,
) -> String {
    let dash = || "-".to_string();
    let header = [
        "npu", "chip", "health", "power W", "temp C", "aicore %", "hbm MB", "errors",
    ];
    let rows: Vec<[String; 8]> = devices
        .iter()
        .zip(samples)
        .map(|(d, s)| {
            [
                d.physical_id.to_string(),
                d.chip.clone(),
                s.health.map_or_else(dash, |h| h.to_string()),
                s.power_watts().map_or_else(dash, |w| format!("{w:.1}")),
                s.temperature_c.map_or_else(dash, |t| t.to_string()),
                s.ai_core_percent.map_or_else(dash, |p| p.to_string()),
                match (s.hbm_used_mb, s.hbm_total_mb) {
                    (Some(u), Some(t)) => format!("{u} / {t}"),
                    _ => dash(),
                },
                s.error_codes
                    .as_ref()
                    .map_or_else(dash, |codes| match codes.is_empty() {
                        true => "none".into(),
                        false => codes
                            .iter()
                            .map(|c| format!("{c:#x}"))
                            .collect::<Vec<_>>()
                            .join(","),
                    }),
            ]
        })
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            rows.iter()
                .map(|r| r[c].len())
                .chain([header[c].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<&str>| {
        let mut s = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect::<Vec<_>>()
            .join("  ");
        s.truncate(s.trim_end().len());
        s.push('\n');
        s
    };
    let mut out = format!(
        "server {server_id}: telemetry of {} device{}{}\n",
        devices.len(),
        if devices.len() == 1 { "" } else { "s" },
        late.map_or(String::new(), |l| format!(
            " (no answer from the driver for {}s: a call hangs?)",
            l.as_secs()
        ))
    );
    out.push_str(&line(header.to_vec()));
    for r in &rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    // Why a value the driver has is absent: its call failed (a busy NPU, the driver gone).
    for s in samples {
        for failure in &s.failures {
            out.push_str(&format!("npu {}: {failure}\n", s.physical_id));
        }
    }
    out
}
