//! The fake driver serves devices chosen through environment variables, read at each call.

use std::net::IpAddr;
use std::path::PathBuf;

use atlasboost_core::conformance::check_probe;
use atlasboost_core::{Device, DeviceProbe, DriverCall, EnvVars, Health};
use atlasboost_dsmi::DsmiProbe;

use crate::Env;

/// `target/<profile>/<name>`, built by `cargo build` (the workspace's default members).
fn built(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let lib = exe.parent().unwrap().parent().unwrap().join(name);
    assert!(
        lib.is_file(),
        "{} is missing: run `cargo build -p atlasboost-fake-dsmi -p atlasboost-fake-dsmi-old` first",
        lib.display()
    );
    lib
}

fn fake() -> PathBuf {
    built("libdrvdsmi_host.so")
}

fn probe_with(vars: &[(&str, &str)]) -> atlasboost_core::Result<Vec<Device>> {
    let _env = Env::set(vars);
    DsmiProbe::load_from("10.0.0.1", &fake()).unwrap().probe()
}

fn error_with(vars: &[(&str, &str)]) -> String {
    let e = probe_with(vars).expect_err("the probe should fail");
    atlasboost_core::exchange::error_chain(&e)
}

#[test]
fn eight_910_devices_pass_the_conformance_suite() {
    let _env = Env::set(&[]);
    let probe = DsmiProbe::load_from("10.0.0.1", &fake()).unwrap();
    assert_eq!(probe.name(), "dsmi");
    assert_eq!(probe.has_chip_and_health(), (true, true));
    let devices = check_probe(&probe, "10.0.0.1").unwrap();
    assert_eq!(devices.len(), 8);
    for d in &devices {
        assert_eq!(d.logical_id, d.physical_id);
        assert_eq!(
            d.ip,
            Some(IpAddr::from([192, 168, 100, 101 + d.physical_id as u8]))
        );
        assert_eq!(d.chip, "910");
        assert_eq!(d.health, Health::Healthy);
    }
}

/// An older `libdrvdsmi.so` in a directory earlier on `LD_LIBRARY_PATH` does not shadow the
/// host library of a later one (it lacks the health function: a critical NPU would read ok);
/// a FIFO under the library's name is passed by, not opened (that would wait for ever).
#[test]
fn the_host_library_anywhere_on_the_path_comes_before_the_older_one() {
    let dir = tempfile::tempdir().unwrap();
    let (early, late) = (dir.path().join("early"), dir.path().join("late"));
    for d in [&early, &late] {
        std::fs::create_dir(d).unwrap();
    }
    std::os::unix::fs::symlink(built("libdrvdsmi.so"), early.join("libdrvdsmi.so")).unwrap();
    let fifo = std::process::Command::new("mkfifo")
        .arg(early.join("libdrvdsmi_host.so"))
        .status()
        .unwrap();
    assert!(fifo.success());
    std::os::unix::fs::symlink(fake(), late.join("libdrvdsmi_host.so")).unwrap();
    let path = format!("{}:{}", early.display(), late.display());
    let _env = Env::set(&[(EnvVars::LD_LIBRARY_PATH, path.as_str())]);
    let probe = DsmiProbe::load("10.0.0.1").unwrap();
    assert_eq!(probe.library(), late.join("libdrvdsmi_host.so"));
    assert_eq!(probe.has_chip_and_health(), (true, true));
}

#[test]
fn ipv6_addresses_come_through_the_union() {
    let devices = probe_with(&[(EnvVars::ATLASBOOST_FAKE_DSMI_IP, "v6")]).unwrap();
    assert_eq!(devices.len(), 8);
    for d in &devices {
        assert!(
            matches!(d.ip, Some(IpAddr::V6(v6)) if v6.segments()[0] == 0xfd00),
            "{d:?}"
        );
    }
    let mut ips: Vec<_> = devices.iter().map(|d| d.ip).collect();
    ips.dedup();
    assert_eq!(ips.len(), 8, "distinct addresses");
}

#[test]
fn a_container_sees_physical_4_to_7_as_logical_0_to_3() {
    let _env = Env::set(&[(EnvVars::ATLASBOOST_FAKE_DSMI_PHYSICAL, "4,5,6,7")]);
    let probe = DsmiProbe::load_from("10.0.0.1", &fake()).unwrap();
    let devices = check_probe(&probe, "10.0.0.1").unwrap();
    let ids: Vec<(u32, u32)> = devices
        .iter()
        .map(|d| (d.logical_id, d.physical_id))
        .collect();
    assert_eq!(ids, vec![(0, 4), (1, 5), (2, 6), (3, 7)]);
    assert_eq!(devices[0].ip, Some(IpAddr::from([192, 168, 100, 105])));
}

#[test]
fn the_runtime_visible_devices_filter_and_renumber() {
    let devices = probe_with(&[(EnvVars::ASCEND_RT_VISIBLE_DEVICES, "1,3")]).unwrap();
    let ids: Vec<(u32, u32)> = devices
        .iter()
        .map(|d| (d.logical_id, d.physical_id))
        .collect();
    assert_eq!(ids, vec![(0, 1), (1, 3)]);
    let _env = Env::set(&[(EnvVars::ASCEND_RT_VISIBLE_DEVICES, "3,1")]);
    let e = DsmiProbe::load_from("10.0.0.1", &fake())
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("ASCEND_RT_VISIBLE_DEVICES=\"3,1\": "), "{e}");
    drop(_env);
    let e = error_with(&[(EnvVars::ASCEND_RT_VISIBLE_DEVICES, "1,9")]);
    assert!(
        e.contains("names device 9, which this host does not have"),
        "{e}"
    );
}

#[test]
fn the_chip_name_decides_the_rules() {
    let devices = probe_with(&[
        (EnvVars::ATLASBOOST_FAKE_DSMI_CHIP, "910B3"),
        (EnvVars::ATLASBOOST_FAKE_DSMI_DEVICES, "16"),
    ])
    .unwrap();
    assert_eq!(devices.len(), 16);
    assert!(devices.iter().all(|d| d.chip == "910B3"));
}

/// A broken NPU fails its own calls while the others answer: the probe reports it, unusable
/// (so that a table names it and a restart plans around it), with the host's chip.
#[test]
fn a_device_whose_own_calls_fail_is_reported_unreadable() {
    for (fault, broken, code, call, says) in [
        (
            "fail:dsmi_get_device_ip_address@1=65534",
            1,
            65534,
            DriverCall::IpAddress,
            "dsmi_get_device_ip_address returned 65534 (NOT_SUPPORT: not supported by this \
             driver or device)",
        ),
        (
            "fail:dsmi_get_chip_info@2=8",
            2,
            8,
            DriverCall::ChipInfo,
            "dsmi_get_chip_info returned 8 (PARA_ERROR: bad parameter)",
        ),
        (
            "fail:dsmi_get_device_health@5=13",
            5,
            13,
            DriverCall::Health,
            "dsmi_get_device_health returned 13 (BUSY: the device is busy)",
        ),
        (
            "fail:dsmi_get_device_health@3=51",
            3,
            51,
            DriverCall::Health,
            "dsmi_get_device_health returned 51 (TRY_AGAIN: the driver is still starting)",
        ),
    ] {
        let devices = probe_with(&[
            (EnvVars::ATLASBOOST_FAKE_DSMI_FAULTS, fault),
            (EnvVars::ATLASBOOST_DSMI_RETRY_SECS, "0"),
        ])
        .unwrap_or_else(|e| panic!("{fault}: {e}"));
        assert_eq!(devices.len(), 8, "{fault}");
        for d in &devices {
            let want = match d.physical_id == broken {
                true => Health::Unreadable { code, call },
                false => Health::Healthy,
            };
            assert_eq!(d.health, want, "{fault}: {d:?}");
            assert_eq!(d.chip, "910", "{fault}: {d:?}");
        }
        let unreadable = devices.iter().find(|d| d.physical_id == broken).unwrap();
        // The address read before the failing call is kept (it is not "no RoCE address").
        let read = match call {
            DriverCall::IpAddress => None,
            _ => Some(IpAddr::from([192, 168, 100, 101 + broken as u8])),
        };
        assert_eq!(unreadable.ip, read, "{fault}");
        assert_eq!(unreadable.health.to_string(), format!("unreadable: {says}"));
    }
}

/// Ids no driver can mean (a list that repeats an id, two devices on one physical id, a
/// physical id past any host's NPUs) are refused naming the function, not passed on to fail
/// later as a table's duplicate device.
#[test]
fn impossible_ids_are_refused_naming_the_function() {
    for (fault, want) in [
        // "Success" without writing the list: every id 0.
        (
            "fail:dsmi_list_device=0",
            "dsmi_list_device answered device id 0 again at place 1 of its 8 ids (0,0,0,0,0,0,0,0)",
        ),
        // "Success" without writing the physical id: 0 for each.
        (
            "fail:dsmi_get_phyid_from_logicid=0",
            "dsmi_get_phyid_from_logicid answered physical id 0 for both logical ids 0 and 1",
        ),
    ] {
        let e = error_with(&[(EnvVars::ATLASBOOST_FAKE_DSMI_FAULTS, fault)]);
        assert!(e.contains(want), "{fault}: {e}");
    }
}

/// A driver call that does not return (a wedged NPU) fails the probe once it has taken the
/// call limit, naming the call and its device, instead of hanging the command.
#[test]
fn a_call_that_hangs_fails_the_probe_naming_it() {
    let env = Env::set(&[
        (
            EnvVars::ATLASBOOST_FAKE_DSMI_FAULTS,
            "hang:dsmi_get_device_health@1=1500",
        ),
        (EnvVars::ATLASBOOST_DSMI_CALL_TIMEOUT_SECS, "0.3"),
    ]);
    let probe = DsmiProbe::load_from("10.0.0.1", &fake()).unwrap();
    let e = atlasboost_core::exchange::error_chain(&probe.probe().unwrap_err());
    assert!(
        e.contains("dsmi_get_device_health(device 1) has not returned after 0.")
            && e.contains("ATLASBOOST_DSMI_CALL_TIMEOUT_SECS"),
        "{e}"
    );
    // A second probe while that call still hangs makes no call of its own and names the
    // same call, with how long it has not returned (not a fresh 0 s).
    std::thread::sleep(std::time::Duration::from_millis(300));
    let again = atlasboost_core::exchange::error_chain(&probe.probe().unwrap_err());
    let waited: f64 = again
        .split("has not returned after ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|secs| secs.parse().ok())
        .unwrap_or_else(|| panic!("no time in {again}"));
    assert!(
        again.contains("dsmi_get_device_health(device 1) has not returned") && waited >= 0.5,
        "{again}"
    );
    // The probe's thread, left to its call, reads the environment until it ends: the lock
    // is held until then (1.5 s from the call's start, about 0.6 s ago; with room for a busy
    // machine).
    std::thread::sleep(std::time::Duration::from_millis(2500));
    drop(env);
    // Once the call has returned, the same probe reads the driver again.
    {
        let _env = Env::set(&[]);
        assert_eq!(probe.probe().unwrap().len(), 8);
    }
    // A limit that is not a number of seconds is named.
    let _env = Env::set(&[(EnvVars::ATLASBOOST_DSMI_CALL_TIMEOUT_SECS, "soon")]);
    let e = DsmiProbe::load_from("10.0.0.1", &fake())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("ATLASBOOST_DSMI_CALL_TIMEOUT_SECS=\"soon\": expected a number of seconds"),
        "{e}"
    );
}

#[test]
fn every_failing_function_is_named_with_its_device_and_code() {
    for (fault, want) in [
        (
            "fail:dsmi_get_device_count=9",
            "dsmi_get_device_count() returned 9 (UNINIT",
        ),
        (
            "fail:dsmi_list_device=1",
            "dsmi_list_device() returned 1 (NO_DEVICE",
        ),
        (
            "fail:dsmi_get_phyid_from_logicid@2=2",
            "dsmi_get_phyid_from_logicid(device 2) returned 2 (INVALID_DEVICE",
        ),
        // Every device's call fails: the driver's trouble, not a broken NPU's.
        (
            "fail:dsmi_get_device_ip_address=65534",
            "dsmi_get_device_ip_address(device 0) returned 65534 (NOT_SUPPORT",
        ),
        (
            "fail:dsmi_get_chip_info=8",
            "dsmi_get_chip_info(device 0) returned 8 (PARA_ERROR",
        ),
        (
            "fail:dsmi_get_device_health=13",
            "dsmi_get_device_health(device 0) returned 13 (BUSY",
        ),
        (
            "fail:dsmi_get_device_count=-8005",
            "dsmi_get_device_count() returned -8005",
        ),
    ] {
        let e = error_with(&[(EnvVars::ATLASBOOST_FAKE_DSMI_FAULTS, fault)]);
        assert!(e.contains(want), "{fault}: {e}");
        assert!(
            e.contains("dsmi probe failed on host 10.0.0.1"),
            "{fault}: {e}"
        );
    }
}

#[test]
fn a_device_without_an_address_or_health_is_reported_not_hidden() {
    let devices = probe_with(&[(
        EnvVars::ATLASBOOST_FAKE_DSMI_FAULTS,
        "no-ip:3;unhealthy:5=2",
    )])
    .unwrap();
    assert_eq!(devices.len(), 8, "no device is dropped");
    assert_eq!(devices[3].ip, None);
    assert_eq!(devices[5].health, Health::Unhealthy { code: 2 });
    assert_eq!(devices[4].health, Health::Healthy);
}

#[test]
fn an_old_driver_without_the_optional_functions_still_works() {
    let _env = Env::set(&[(EnvVars::ATLASBOOST_FAKE_DSMI_DEVICES, "4")]);
    let probe = DsmiProbe::load_from("10.0.0.1", &built("libdrvdsmi.so")).unwrap();
    assert_eq!(probe.has_chip_and_health(), (false, false));
    let devices = check_probe(&probe, "10.0.0.1").unwrap();
    assert_eq!(devices.len(), 4);
    assert!(
        devices
            .iter()
            .all(|d| d.chip == "910" && d.health == Health::Healthy)
    );
}

#[test]
fn a_library_without_the_required_functions_is_named() {
    let _env = Env::set(&[]);
    // The C library is on every Linux machine and has no DSMI function.
    let e = DsmiProbe::load_from("h", std::path::Path::new("libc.so.6")).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the driver library libc.so.6 has no function dsmi_get_device_count"
    );
}

#[test]
fn the_search_lists_every_path_it_tried() {
    let _env = Env::set(&[(
        EnvVars::ATLASBOOST_DSMI_LIB,
        "/nonexistent/libdrvdsmi_host.so",
    )]);
    let e = DsmiProbe::load("h").unwrap_err().to_string();
    assert!(
        e.contains("tried: /nonexistent/libdrvdsmi_host.so (not there)"),
        "{e}"
    );
    assert!(e.contains("ATLASBOOST_DSMI_LIB"), "{e}");
    drop(_env);

    let _env = Env::set(&[(EnvVars::ATLASBOOST_DSMI_LIB, fake().to_str().unwrap())]);
    let probe = DsmiProbe::load("h").unwrap();
    assert_eq!(probe.library(), fake());
}

#[test]
fn an_ipv6_only_host_is_found_through_the_v6_question() {
    // The real driver answers IPv4 with NO_DEVICE here, and IPv6 only when asked for it.
    let devices = probe_with(&[(EnvVars::ATLASBOOST_FAKE_DSMI_IP, "v6")]).unwrap();
    assert!(
        devices.iter().all(|d| d.ip.is_some_and(|ip| ip.is_ipv6())),
        "{devices:?}"
    );
    // An older driver that writes its own type back is read as well.
    let devices = probe_with(&[
        (EnvVars::ATLASBOOST_FAKE_DSMI_IP, "v6"),
        (EnvVars::ATLASBOOST_FAKE_DSMI_IP_API, "old"),
        (EnvVars::ATLASBOOST_FAKE_DSMI_FAULTS, "no-ip:2"),
    ])
    .unwrap();
    assert!(devices[0].ip.is_some_and(|ip| ip.is_ipv6()));
    assert_eq!(
        devices[2].ip, None,
        "0.0.0.0 from an old driver is no address"
    );
}

#[test]
fn an_unconfigured_device_is_listed_and_the_builder_names_it() {
    let devices = probe_with(&[(EnvVars::ATLASBOOST_FAKE_DSMI_FAULTS, "no-ip:6")]).unwrap();
    assert_eq!(
        devices.len(),
        8,
        "NO_DEVICE from the address call is not a probe failure"
    );
    assert_eq!(devices[6].ip, None);
    // Two servers (a second one like this host): device_ip is required, and the device named.
    let mut both = devices.clone();
    both.extend(devices.iter().map(|d| Device {
        server_id: "10.0.0.2".into(),
        ip:
            d.ip.map(|_| IpAddr::from([192, 168, 101, d.physical_id as u8])),
        ..d.clone()
    }));
    let e = atlasboost_core::ranktable::build_table(&both, &Default::default()).unwrap_err();
    let e = atlasboost_core::exchange::error_chain(&e);
    assert!(
        e.contains("$.server_list[0].device[6]") && e.contains("device_ip is required"),
        "{e}"
    );
}

#[test]
fn a_driver_still_starting_is_retried_within_the_bound() {
    // (First: the fake counts TRY_AGAIN answers per function and thread for the whole test.)
    // The bound spent on device 0's chip (20 + 30 ms of 50), its health's one TRY_AGAIN right
    // after is still retried: the device is not taken for broken at its first answer.
    let devices = probe_with(&[
        (
            EnvVars::ATLASBOOST_FAKE_DSMI_FAULTS,
            "try-again:dsmi_get_chip_info=2; try-again:dsmi_get_device_health=1",
        ),
        (EnvVars::ATLASBOOST_DSMI_RETRY_SECS, "0.05"),
    ])
    .unwrap();
    assert!(
        devices.iter().all(|d| d.health == Health::Healthy),
        "{devices:?}"
    );
    // TRY_AGAIN twice, then an answer: probed, after two short pauses.
    let devices = probe_with(&[(
        EnvVars::ATLASBOOST_FAKE_DSMI_FAULTS,
        "try-again:dsmi_get_device_count=2",
    )])
    .unwrap();
    assert_eq!(devices.len(), 8);
    // TRY_AGAIN for ever, from every one of 16 devices: an error after the bound, saying how
    // often it called. The bound is the probe's, not each call's: 16 devices do not wait it
    // 16 times (8 s here; the slack below is for a busy machine).
    let started = std::time::Instant::now();
    let e = error_with(&[
        (
            EnvVars::ATLASBOOST_FAKE_DSMI_FAULTS,
            "try-again:dsmi_get_device_health",
        ),
        (EnvVars::ATLASBOOST_FAKE_DSMI_DEVICES, "16"),
        (EnvVars::ATLASBOOST_FAKE_DSMI_CHIP, "910B3"),
        (EnvVars::ATLASBOOST_DSMI_RETRY_SECS, "0.5"),
    ]);
    let waited = started.elapsed();
    assert!(
        waited >= std::time::Duration::from_millis(500),
        "{waited:?}"
    );
    assert!(
        waited < std::time::Duration::from_secs(4),
        "{waited:?}: {e}"
    );
    assert!(
        e.contains("dsmi_get_device_health(device 0) kept returning 51 (TRY_AGAIN")
            && e.contains(" times, the probe having waited 0.5 s"),
        "{e}"
    );
    let _env = Env::set(&[(EnvVars::ATLASBOOST_DSMI_RETRY_SECS, "soon")]);
    let e = DsmiProbe::load_from("10.0.0.1", &fake())
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("ATLASBOOST_DSMI_RETRY_SECS=\"soon\": expected"),
        "{e}"
    );
}

#[test]
fn a_host_without_a_device_says_so() {
    let e = error_with(&[(EnvVars::ATLASBOOST_FAKE_DSMI_DEVICES, "0")]);
    assert!(
        e.contains("the driver reports no device on this host")
            && e.contains("returned 7 (INNER_ERR"),
        "{e}"
    );
}

#[test]
fn a_device_that_is_not_alive_is_offline() {
    let devices = probe_with(&[(
        EnvVars::ATLASBOOST_FAKE_DSMI_FAULTS,
        "unhealthy:1=0xffffffff",
    )])
    .unwrap();
    assert_eq!(devices[1].health, Health::Unhealthy { code: u32::MAX });
    assert_eq!(devices[1].health.to_string(), "offline");
}

/// Telemetry through `dlopen`: every call of the driver with its struct, values as the fake
/// serves them for a container seeing physical 4-7 as logical 0-3 (so a mix-up of logical and
/// physical ids shows).
#[test]
fn every_telemetry_call_comes_through_the_real_loading_path() {
    use atlasboost_core::Telemetry;

    let _env = Env::set(&[(EnvVars::ATLASBOOST_FAKE_DSMI_PHYSICAL, "4,5,6,7")]);
    let probe = DsmiProbe::load_from("10.0.0.1", &fake()).unwrap();
    let devices = probe.probe().unwrap();
    let samples = probe.sample(&devices);
    assert_eq!(samples.len(), 4);
    for s in &samples {
        let p = s.physical_id;
        assert!((4..=7).contains(&p));
        assert_eq!(s.ai_core_percent, Some((10 + 7 * p) % 100), "{s:?}");
        assert_eq!(s.temperature_c, Some(40 + p as i32));
        assert_eq!(s.power_decwatts, Some(2000 + 50 * p));
        assert_eq!(s.power_watts(), Some(f64::from(2000 + 50 * p) / 10.0));
        assert_eq!(s.hbm_total_mb, Some(65_536));
        assert_eq!(s.hbm_used_mb, Some(u64::from(1024 + 512 * p)));
        assert_eq!(s.health, Some(Health::Healthy));
        assert_eq!(s.error_codes, Some(Vec::new()));
    }
}

/// The fake driver probed with an empty faults file, which the test may then fill: the
/// file's directory (kept while it lives), its path, the environment, the probe, the devices.
fn probed_with_a_faults_file() -> (
    tempfile::TempDir,
    std::path::PathBuf,
    Env,
    DsmiProbe,
    Vec<Device>,
) {
    let dir = tempfile::tempdir().unwrap();
    let faults = dir.path().join("faults");
    std::fs::write(&faults, "").unwrap();
    let env = Env::set(&[(
        EnvVars::ATLASBOOST_FAKE_DSMI_FAULTS_FILE,
        faults.to_str().unwrap(),
    )]);
    let probe = DsmiProbe::load_from("10.0.0.1", &fake()).unwrap();
    let devices = probe.probe().unwrap();
    (dir, faults, env, probe, devices)
}

/// An unhealthy device and an error code injected while sampling show in the next sample; a
/// failing call leaves only its metric absent.
#[test]
fn an_injected_fault_shows_in_the_next_sample() {
    use atlasboost_core::Telemetry;

    let (_dir, faults, _env, probe, devices) = probed_with_a_faults_file();
    assert!(
        probe
            .sample(&devices)
            .iter()
            .all(|s| s.health == Some(Health::Healthy))
    );
    std::fs::write(
        &faults,
        "unhealthy:3\nerrorcode:3=0x80E01801\nerrorcode:3=0x80CB8009\n\
         fail:dsmi_get_device_temperature@5=8\n",
    )
    .unwrap();
    let next = probe.sample(&devices);
    assert_eq!(next[3].health, Some(Health::Unhealthy { code: 3 }));
    assert_eq!(next[3].error_codes, Some(vec![0x80E0_1801, 0x80CB_8009]));
    assert_eq!(next[2].health, Some(Health::Healthy));
    assert_eq!(
        next[5].temperature_c, None,
        "the failing call's metric only"
    );
    assert_eq!(next[5].ai_core_percent, Some(45));
    assert_eq!(next[4].temperature_c, Some(44));
}

/// `ASCEND_RT_VISIBLE_DEVICES` renumbers the devices the runtime sees (physical 5 and 7 become
/// logical 0 and 1); the driver still numbers them as it lists them, and each device's values
/// are read from that device, not from the driver's devices 0 and 1 (one of them broken).
#[test]
fn telemetry_asks_the_driver_by_its_own_ids_under_ascend_rt_visible_devices() {
    use atlasboost_core::Telemetry;

    let _env = Env::set(&[
        (EnvVars::ASCEND_RT_VISIBLE_DEVICES, "5,7"),
        (EnvVars::ATLASBOOST_FAKE_DSMI_FAULTS, "unhealthy:0"),
    ]);
    let probe = DsmiProbe::load_from("10.0.0.1", &fake()).unwrap();
    let devices = probe.probe().unwrap();
    let ids: Vec<(u32, u32)> = devices
        .iter()
        .map(|d| (d.logical_id, d.physical_id))
        .collect();
    assert_eq!(ids, [(0, 5), (1, 7)]);
    let samples = probe.sample(&devices);
    for (s, p) in samples.iter().zip([5, 7]) {
        assert_eq!(s.physical_id, p);
        assert_eq!(s.temperature_c, Some(40 + p as i32), "{s:?}");
        assert_eq!(s.ai_core_percent, Some((10 + 7 * p) % 100), "{s:?}");
        assert_eq!(s.health, Some(Health::Healthy), "{s:?}");
        assert!(s.failures.is_empty(), "{s:?}");
    }
}

/// A call that fails is named in the sample, with the driver's id and code; a failing health
/// call reads as the device unreadable (an alert on health sees it), not as no health at all.
#[test]
fn a_failing_telemetry_call_is_named_and_a_failing_health_reads_unreadable() {
    use atlasboost_core::{DriverCall, Telemetry};

    let _env = Env::set(&[(
        EnvVars::ATLASBOOST_FAKE_DSMI_FAULTS,
        "fail:dsmi_get_device_health@2=13;fail:dsmi_get_device_temperature@2=13",
    )]);
    let probe = DsmiProbe::load_from("10.0.0.1", &fake()).unwrap();
    // The probe reports device 2 unreadable and the others as they are.
    let devices = probe.probe().unwrap();
    let samples = probe.sample(&devices);
    let broken = &samples[2];
    assert_eq!(
        broken.health,
        Some(Health::Unreadable {
            code: 13,
            call: DriverCall::Health
        })
    );
    assert_eq!(broken.temperature_c, None);
    assert_eq!(broken.ai_core_percent, Some(24), "the other calls answer");
    assert_eq!(broken.failures.len(), 2, "{:?}", broken.failures);
    assert!(
        broken.failures[0].starts_with("dsmi_get_device_temperature(device 2) returned 13"),
        "{:?}",
        broken.failures
    );
    assert!(
        broken.failures[1].starts_with("dsmi_get_device_health(device 2) returned 13"),
        "{:?}",
        broken.failures
    );
    assert!(samples[1].failures.is_empty() && samples[1].health == Some(Health::Healthy));
}

/// A device whose physical id the driver stops telling (it broke after the probe) reads as
/// unreadable, named; the others are sampled as before (they were all left empty).
#[test]
fn one_device_the_driver_cannot_map_does_not_blank_the_others() {
    use atlasboost_core::{DriverCall, Telemetry};

    let (_dir, faults, _env, probe, devices) = probed_with_a_faults_file();
    std::fs::write(&faults, "fail:dsmi_get_phyid_from_logicid@2=8\n").unwrap();
    let samples = probe.sample(&devices);
    assert_eq!(
        samples[2].health,
        Some(Health::Unreadable {
            code: 8,
            call: DriverCall::PhysicalId
        })
    );
    assert!(
        samples[2].failures[0].starts_with("dsmi_get_phyid_from_logicid(device 2) returned 8"),
        "{:?}",
        samples[2]
    );
    for (p, s) in samples.iter().enumerate().filter(|(p, _)| *p != 2) {
        assert_eq!(s.temperature_c, Some(40 + p as i32), "{s:?}");
        assert_eq!(s.health, Some(Health::Healthy), "{s:?}");
    }
}

/// The old driver has none of the telemetry calls (nor health): every metric is absent, and
/// sampling does not fail.
#[test]
fn a_driver_without_the_telemetry_calls_leaves_the_metrics_absent() {
    use atlasboost_core::{DeviceSample, Telemetry};

    let _env = Env::set(&[]);
    let probe = DsmiProbe::load_from("10.0.0.1", &built("libdrvdsmi.so")).unwrap();
    let devices = probe.probe().unwrap();
    let samples = probe.sample(&devices);
    assert_eq!(samples.len(), 8);
    for (s, d) in samples.iter().zip(&devices) {
        assert_eq!(*s, DeviceSample::of(d.physical_id));
    }
}
