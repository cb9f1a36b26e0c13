//! `atlasboost ranktable`: this server's rank table, like Ascend's `hccl_tools.py`.

use std::path::PathBuf;

use atlasboost_core::ranktable::{BuildOptions, Format, RankTable, build_table, chip_or_reported};
use atlasboost_core::{Chip, DeviceList, DeviceProbe};

use atlasboost::probe::{local_devices, make_probe};

use super::devices::server_id;
use super::write_output;
use crate::error::CliError;
use crate::printer::Printer;
use crate::settings::RanktableSettings;

/// Runs `atlasboost ranktable`.
///
/// # Errors
///
/// Probe, selection, validation and write errors; nothing is written unless the table is valid.
pub fn run(args: &RanktableSettings, printer: &Printer) -> Result<(), CliError> {
    let server_id = server_id(&args.devices)?;
    printer.detail(&format!("server_id: {server_id}"));
    let probe = make_probe(&args.devices.discovery, &server_id)?;
    write_local_table(args, probe.as_ref(), &server_id, printer)
}

/// Probes with `probe`, builds this server's table and writes it where `args` say.
///
/// # Errors
///
/// As [`run`]; on any error nothing is written and an existing file is left as it was.
pub fn write_local_table(
    args: &RanktableSettings,
    probe: &dyn DeviceProbe,
    server_id: &str,
    printer: &Printer,
) -> Result<(), CliError> {
    let (table, chip, without_ip) = local_table(
        probe,
        args.devices.discovery.devices.as_ref(),
        args.format,
        args.chip,
    )?;
    if let Some(note) = without_ip {
        // Said even with -q: every device's address is left out of the table for it.
        printer.error(&format!("atlasboost: warning: {note}"));
    }
    let path = args
        .output
        .clone()
        .unwrap_or_else(|| default_file_name(&table, server_id));
    write_output(&path, &table, chip, printer)
}

/// Probes, restricts to `devices` and builds this server's table; returns it with the chip
/// whose rules it was checked against, and what to say of devices without an address.
///
/// # Errors
///
/// The probe's error, a `--devices` id the host lacks, or the table's violations (e.g. a 910
/// device set crossing the 0-3 / 4-7 groups).
pub fn local_table(
    probe: &dyn DeviceProbe,
    devices: Option<&DeviceList>,
    format: Format,
    chip: Option<Chip>,
) -> Result<(RankTable, Chip, Option<String>), CliError> {
    let devices = local_devices(probe, devices)?;
    let chip_flag = chip;
    let chip = chip_or_reported(chip_flag, &devices)?;
    let table = build_table(
        &devices,
        &BuildOptions {
            format,
            // The user's --chip, or none: the builder finds the same chip, and its messages
            // say which of the two it was.
            chip: chip_flag,
            ..BuildOptions::default()
        },
    )?;
    let without_ip = atlasboost_core::ranktable::devices_without_ip(&devices, format);
    Ok((table, chip, without_ip))
}

/// `hccl_<n>p_<ids>_<server_id>.json`, the name `hccl_tools.py` gives (ids: physical, joined).
pub fn default_file_name(table: &RankTable, server_id: &str) -> PathBuf {
    let ids: String = table
        .ranks()
        .map(|r| r.iter().map(|e| e.physical_id.to_string()).collect())
        .unwrap_or_default();
    // A server id is a name or an address; keep it from turning into a directory.
    let server = server_id.replace(['/', '\\'], "_");
    PathBuf::from(format!("hccl_{}p_{ids}_{server}.json", table.rank_count()))
}

#[cfg(test)]
mod tests {
    use atlasboost_core::{Device, Error, Health};
    use clap::Parser;
    use mockall::mock;

    use super::*;
    use crate::cli::{Cli, Command};

    mock! {
        Probe {}
        impl DeviceProbe for Probe {
            fn name(&self) -> &str;
            fn probe(&self) -> atlasboost_core::Result<Vec<Device>>;
        }
    }

    fn device(p: u32) -> Device {
        Device {
            server_id: "10.0.0.1".into(),
            logical_id: p,
            physical_id: p,
            ip: Some(format!("192.168.1.{}", p + 1).parse().unwrap()),
            chip: "910".into(),
            health: Health::Healthy,
            super_device_id: None,
            super_pod_id: None,
        }
    }

    #[test]
    fn a_probe_failing_halfway_leaves_the_existing_table_untouched() {
        // First run: the driver answers for every device and the table is written. Second
        // run: the driver answers for devices 0-3, then fails on device 4. Only a mock can
        // make one probe behave both ways; the second run must not touch the first table.
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("rank_table.json");
        let cli = Cli::try_parse_from([
            "atlasboost",
            "ranktable",
            "--server-id",
            "10.0.0.1",
            "-o",
            out.to_str().unwrap(),
        ])
        .unwrap();
        let Command::Ranktable(args) = cli.command else {
            panic!("ranktable expected")
        };
        let mut seq = mockall::Sequence::new();
        let mut probe = MockProbe::new();
        probe.expect_name().return_const("dsmi".to_string());
        probe
            .expect_probe()
            .times(1)
            .in_sequence(&mut seq)
            .returning(|| Ok((0..8).map(device).collect()));
        probe
            .expect_probe()
            .times(1)
            .in_sequence(&mut seq)
            .returning(|| {
                Err(Error::Probe {
                    probe: "dsmi".into(),
                    server_id: "10.0.0.1".into(),
                    source: "dsmi_get_device_ip_address(device 4) returned 8".into(),
                })
            });
        let quiet = Printer::new(true, false);
        write_local_table(&(&args).into(), &probe, "10.0.0.1", &quiet).unwrap();
        let first = std::fs::read(&out).unwrap();
        let err = write_local_table(&(&args).into(), &probe, "10.0.0.1", &quiet).unwrap_err();
        let text = atlasboost_core::exchange::error_chain(&err);
        assert!(
            text.contains("10.0.0.1") && text.contains("device 4"),
            "{text}"
        );
        assert_eq!(
            std::fs::read(&out).unwrap(),
            first,
            "the old table is intact"
        );
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["rank_table.json"], "no temporary file is left");
    }

    #[test]
    fn a_probe_returning_nothing_is_an_error_not_an_empty_table() {
        let mut probe = MockProbe::new();
        probe.expect_name().return_const("dsmi".to_string());
        probe.expect_probe().returning(|| Ok(Vec::new()));
        let err = local_table(&probe, None, Format::V1_0, None).unwrap_err();
        assert!(err.to_string().contains("found no devices"), "{err}");
    }

    #[test]
    fn default_name_matches_hccl_tools() {
        let mut probe = MockProbe::new();
        probe.expect_name().return_const("sim".to_string());
        probe
            .expect_probe()
            .returning(|| Ok((0..8).map(device).collect()));
        let list: DeviceList = "4-7".parse().unwrap();
        let (table, _, _) = local_table(&probe, Some(&list), Format::V1_0, None).unwrap();
        assert_eq!(
            default_file_name(&table, "10.0.0.1"),
            PathBuf::from("hccl_4p_4567_10.0.0.1.json")
        );
    }
}
