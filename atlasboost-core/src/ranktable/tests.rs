//! Unit tests of the builder, merge and the atomic writer.

use std::fs;
use std::io::Read;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::*;
use crate::device::{Chip, Device, Health};
use crate::error::Error;

fn host(server_id: &str, third: u8, ids: &[u32]) -> Vec<Device> {
    ids.iter()
        .map(|&p| Device {
            server_id: server_id.into(),
            logical_id: p,
            physical_id: p,
            ip: Some(IpAddr::from([192, 168, third, p as u8 + 1])),
            chip: "910".into(),
            health: Health::Healthy,
            super_device_id: None,
            super_pod_id: None,
        })
        .collect()
}

#[test]
fn built_tables_look_like_hccl_tools_output() {
    let table = build_table(&host("10.0.0.1", 1, &[0, 1]), &BuildOptions::default()).unwrap();
    let expected = r#"{
    "version": "1.0",
    "server_count": "1",
    "server_list": [
        {
            "server_id": "10.0.0.1",
            "device": [
                {
                    "device_id": "0",
                    "device_ip": "192.168.1.1",
                    "rank_id": "0"
                },
                {
                    "device_id": "1",
                    "device_ip": "192.168.1.2",
                    "rank_id": "1"
                }
            ],
            "host_nic_ip": "reserve"
        }
    ],
    "status": "completed"
}
"#;
    assert_eq!(table.to_json_pretty(), expected);
}

#[test]
fn servers_sort_as_strings_not_as_numbers() {
    let mut devices = host("10.0.0.10", 1, &[0, 1, 2, 3]);
    devices.extend(host("10.0.0.9", 2, &[0, 1, 2, 3]));
    let t = build_table(&devices, &BuildOptions::default()).unwrap();
    let first = &t.ranks().unwrap()[0];
    assert_eq!((first.server_id.as_str(), first.rank), ("10.0.0.10", 0));
}

#[test]
fn builder_refuses_unhealthy_and_duplicate_devices_naming_them() {
    let mut devices = host("h1", 1, &[0, 1]);
    devices[1].health = Health::Unhealthy { code: 3 };
    let err = build_table(&devices, &BuildOptions::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("device 1 of host h1 is critical (3)"), "{err}");

    let mut devices = host("h1", 1, &[0, 1]);
    devices.push(devices[0].clone());
    let err = build_table(&devices, &BuildOptions::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("host h1 reported device 0 twice"), "{err}");

    let err = build_table(&[], &BuildOptions::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("no devices"), "{err}");
}

#[test]
fn builder_refuses_mixed_or_unknown_chips() {
    let mut devices = host("h1", 1, &[0]);
    devices.extend(host("h2", 2, &[0]));
    devices[1].chip = "910B3".into();
    let err = build_table(&devices, &BuildOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("different chips") && err.contains("h2"),
        "{err}"
    );
    devices[1].chip = "310P".into();
    let err = build_table(&devices, &BuildOptions::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("310P") && err.contains("--chip"), "{err}");
}

#[test]
fn host_order_must_cover_exactly_the_gathered_hosts() {
    let mut devices = host("h1", 1, &[0]);
    devices.extend(host("h2", 2, &[0]));
    let opts = |hosts: &[&str]| BuildOptions {
        order: RankOrder::Hosts(hosts.iter().map(|s| s.to_string()).collect()),
        ..BuildOptions::default()
    };
    let err = build_table(&devices, &opts(&["h1"]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("h2") && err.contains("not in the host list"),
        "{err}"
    );
    let err = build_table(&devices, &opts(&["h2", "h1", "h3"]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("host h3 reported no devices"), "{err}");
    let err = build_table(&devices, &opts(&["h2", "h2", "h1"]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("host h2 is listed twice"), "{err}");
    let t = build_table(&devices, &opts(&["h2", "h1"])).unwrap();
    assert_eq!(t.ranks().unwrap()[0].server_id, "h2");
}

#[test]
fn multi_server_tables_need_device_ips() {
    let mut devices = host("h1", 1, &[0]);
    devices.extend(host("h2", 2, &[0]));
    devices[1].ip = None;
    let err = build_table(&devices, &BuildOptions::default()).unwrap_err();
    let Error::Invalid { violations, .. } = err else {
        panic!("{err}")
    };
    assert_eq!(violations.len(), 1);
    assert_eq!(violations[0].rule, Rule::MissingDeviceIp);
    assert_eq!(violations[0].path, "$.server_list[1].device[0]");
    // One server without IPs is fine.
    assert!(build_table(&devices[1..], &BuildOptions::default()).is_ok());
}

/// One server needs no device addresses, but HCCL counts them alike on every device: a device
/// without one beside a device that has one is refused by `validate`, and a table built for
/// one server where a device has none lists none at all.
#[test]
fn one_server_lists_device_ips_on_every_device_or_none() {
    let mut devices = host("h1", 1, &[0, 1]);
    let mut table = build_table(&devices, &BuildOptions::default()).unwrap();
    let RankTable::Cluster(c) = &mut table else {
        panic!()
    };
    c.server_list[0].device[1].device_ip = None;
    let violations = validate_table(&table, Chip::Ascend910);
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert_eq!(violations[0].rule, Rule::DeviceIpCount);
    assert_eq!(violations[0].path, "$.server_list[0].device[1]");
    assert!(
        violations[0]
            .message
            .contains("lists no device_ip but $.server_list[0].device[0].device_ip lists 1"),
        "{violations:?}"
    );
    devices[1].ip = None;
    let table = build_table(&devices, &BuildOptions::default()).unwrap();
    let RankTable::Cluster(c) = &table else {
        panic!()
    };
    let ips: Vec<Option<&String>> = c.server_list[0]
        .device
        .iter()
        .map(|d| d.device_ip.as_ref())
        .collect();
    assert_eq!(ips, [None, None]);
    assert_eq!(
        devices_without_ip(&devices, Format::V1_0).as_deref(),
        Some(
            "device 1 of host h1 has no RoCE address, so the table lists device_ip on no \
             device (HCCL needs the same count on every device, and none inside one server or \
             super pod)"
        )
    );
    // Two servers need every address: the validator names the device instead.
    let mut two = host("h1", 1, &[0, 1]);
    two.extend(host("h2", 2, &[0, 1]));
    two[1].ip = None;
    assert_eq!(devices_without_ip(&two, Format::V1_0), None);
    // ... unless format 1.2 puts them in one super pod, where HCCS connects them.
    for (i, d) in two.iter_mut().enumerate() {
        d.chip = "910_9391".into();
        d.super_device_id = Some(i as u32);
        d.super_pod_id = Some("pod-0".into());
    }
    let opts = BuildOptions {
        format: Format::V1_2,
        ..BuildOptions::default()
    };
    let table = build_table(&two, &opts).unwrap();
    let RankTable::Cluster(c) = &table else {
        panic!()
    };
    assert!(
        c.server_list
            .iter()
            .flat_map(|s| &s.device)
            .all(|d| d.device_ip.is_none()),
        "{c:?}"
    );
    assert!(devices_without_ip(&two, Format::V1_2).is_some());
}

#[test]
fn format_1_2_groups_super_pods_and_needs_their_ids() {
    let mut devices = Vec::new();
    for (server, pod, third) in [
        ("a", "p2", 1),
        ("b", "p1", 2),
        ("c", "p2", 3),
        ("d", "p1", 4),
    ] {
        for mut d in host(server, third, &[0, 1]) {
            d.chip = "910_9391".into();
            d.super_device_id = Some(d.physical_id + 10 * u32::from(third));
            d.super_pod_id = Some(pod.into());
            devices.push(d);
        }
    }
    let opts = BuildOptions {
        format: Format::V1_2,
        ..BuildOptions::default()
    };
    let t = build_table(&devices, &opts).unwrap();
    let RankTable::Cluster(c) = &t else { panic!() };
    let order: Vec<&str> = c.server_list.iter().map(|s| s.server_id.as_str()).collect();
    assert_eq!(
        order,
        ["b", "d", "a", "c"],
        "pods contiguous, then server_id"
    );
    let pods = c.super_pod_list.as_ref().unwrap();
    assert_eq!(pods.len(), 2);
    assert_eq!(pods[1].server_list.len(), 2);
    // Super pods of unequal sizes: HCCL refuses the table, and so does the build.
    let unequal: Vec<_> = devices
        .iter()
        .filter(|d| d.server_id != "d")
        .cloned()
        .collect();
    let err = build_table(&unequal, &opts).unwrap_err().to_string();
    assert!(
        err.contains("HCCL requires as many servers in every super pod"),
        "{err}"
    );

    devices[0].super_device_id = None;
    let err = build_table(&devices, &opts).unwrap_err().to_string();
    assert!(
        err.contains("super_device_id") && err.contains("host a"),
        "{err}"
    );

    // Devices that know nothing of super pods (hccn.conf, a driver without the SuperPoD
    // calls): HCCL's AI server mode, no super_device_id and no super_pod_list.
    for d in &mut devices {
        d.super_device_id = None;
        d.super_pod_id = None;
    }
    let t = build_table(&devices, &opts).unwrap();
    let RankTable::Cluster(c) = &t else { panic!() };
    assert_eq!(c.version, "1.2");
    assert!(c.super_pod_list.is_none());
    assert!(
        c.server_list
            .iter()
            .flat_map(|s| &s.device)
            .all(|d| d.super_device_id.is_none())
    );
}

#[test]
fn legacy_tables_name_pods_by_server_and_refuse_host_order() {
    let mut devices = host("h1", 1, &[0, 1]);
    devices.extend(host("h2", 2, &[0, 1]));
    let opts = BuildOptions {
        format: Format::Legacy,
        ..BuildOptions::default()
    };
    let t = build_table(&devices, &opts).unwrap();
    let ranks = t.ranks().unwrap();
    assert_eq!(ranks[2].rank_id_env, "1");
    assert_eq!((ranks[2].rank, ranks[2].local_rank), (2, 0));
    let opts = BuildOptions {
        format: Format::Legacy,
        order: RankOrder::Hosts(vec!["h2".into(), "h1".into()]),
        ..BuildOptions::default()
    };
    assert!(
        build_table(&devices, &opts)
            .unwrap_err()
            .to_string()
            .contains("legacy")
    );
}

#[test]
fn merge_names_both_inputs_of_a_duplicate() {
    let a = build_table(&host("h1", 1, &[0, 1]), &BuildOptions::default()).unwrap();
    let b = build_table(&host("h2", 1, &[0, 1]), &BuildOptions::default()).unwrap();
    let inputs = [
        MergeInput {
            name: "a.json".into(),
            table: a.clone(),
        },
        MergeInput {
            name: "b.json".into(),
            table: b,
        },
    ];
    let err = merge_tables(&inputs, Chip::Ascend910)
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "cannot merge: device_ip \"192.168.1.1\" appears in both a.json and b.json"
    );
    let same = [
        MergeInput {
            name: "a.json".into(),
            table: a.clone(),
        },
        MergeInput {
            name: "again.json".into(),
            table: a.clone(),
        },
    ];
    let err = merge_tables(&same, Chip::Ascend910)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("server_id \"h1\" appears in both a.json and again.json"),
        "{err}"
    );
    let legacy = build_table(
        &host("h3", 3, &[0]),
        &BuildOptions {
            format: Format::Legacy,
            ..BuildOptions::default()
        },
    )
    .unwrap();
    let mixed = [
        MergeInput {
            name: "a.json".into(),
            table: a,
        },
        MergeInput {
            name: "l.json".into(),
            table: legacy,
        },
    ];
    assert!(
        merge_tables(&mixed, Chip::Ascend910)
            .unwrap_err()
            .to_string()
            .contains("l.json is in the legacy")
    );
}

#[test]
fn merge_keeps_keys_it_does_not_know() {
    let text = r#"{"version":"1.0","server_count":"1","server_list":[{"server_id":"h1","host_ip":"10.1.1.1","device":[{"device_id":"0","device_ip":"192.168.1.1","device_port":"16666","rank_id":"0"}]}],"status":"completed"}"#;
    let a = RankTable::parse(text, Path::new("a.json"), Chip::Ascend910).unwrap();
    let b = build_table(&host("h2", 2, &[0]), &BuildOptions::default()).unwrap();
    let merged = merge_tables(
        &[
            MergeInput {
                name: "a".into(),
                table: a,
            },
            MergeInput {
                name: "b".into(),
                table: b,
            },
        ],
        Chip::Ascend910,
    )
    .unwrap();
    let json = merged.to_json_pretty();
    assert!(
        json.contains("\"host_ip\": \"10.1.1.1\"") && json.contains("\"device_port\": \"16666\""),
        "{json}"
    );
    assert!(json.contains("\"rank_id\": \"1\""));
}

fn merge_input(name: &str, table: RankTable) -> MergeInput {
    MergeInput {
        name: name.into(),
        table,
    }
}

#[test]
fn merge_keeps_each_inputs_rank_order() {
    // A valid table whose devices are not listed in rank order: device 1 (rank 1) first.
    let mut a = build_table(&host("h1", 1, &[0, 1]), &BuildOptions::default()).unwrap();
    let RankTable::Cluster(c) = &mut a else {
        panic!()
    };
    c.server_list[0].device.reverse();
    assert!(validate_table(&a, Chip::Ascend910).is_empty());
    let b = build_table(&host("h2", 2, &[0, 1]), &BuildOptions::default()).unwrap();
    let merged =
        merge_tables(&[merge_input("a", a), merge_input("b", b)], Chip::Ascend910).unwrap();
    let RankTable::Cluster(m) = &merged else {
        panic!()
    };
    let ranks: Vec<(&str, &str, &str)> = m
        .server_list
        .iter()
        .flat_map(|s| {
            s.device.iter().map(|d| {
                (
                    s.server_id.as_str(),
                    d.device_id.as_str(),
                    d.rank_id.as_str(),
                )
            })
        })
        .collect();
    assert_eq!(
        ranks,
        [
            ("h1", "1", "1"),
            ("h1", "0", "0"),
            ("h2", "0", "2"),
            ("h2", "1", "3")
        ]
    );
}

#[test]
fn merge_keeps_the_super_pods_whichever_input_has_them() {
    let pod_table = |server: &str, third: u8, pod: bool| {
        let devices: Vec<Device> = host(server, third, &[0, 1])
            .into_iter()
            .map(|mut d| {
                d.chip = "910_9391".into();
                if pod {
                    d.super_device_id = Some(d.physical_id + 10 * u32::from(third));
                    d.super_pod_id = Some("p1".into());
                }
                d
            })
            .collect();
        let opts = BuildOptions {
            format: Format::V1_2,
            ..BuildOptions::default()
        };
        build_table(&devices, &opts).unwrap()
    };
    let (with, without) = (pod_table("a", 1, true), pod_table("b", 2, false));
    // Either order: a server in no pod beside a table of pods is refused, never dropped.
    for inputs in [
        [
            merge_input("without", without.clone()),
            merge_input("with", with.clone()),
        ],
        [
            merge_input("with", with.clone()),
            merge_input("without", without.clone()),
        ],
    ] {
        let err = merge_tables(&inputs, Chip::Ascend910_93)
            .unwrap_err()
            .to_string();
        assert!(err.contains("in no super pod"), "{err}");
    }
}

#[test]
fn writer_replaces_atomically_with_mode_0644() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rank_table.json");
    let t1 = build_table(&host("h1", 1, &[0, 1]), &BuildOptions::default()).unwrap();
    let t2 = build_table(&host("h1", 1, &[0, 1, 2, 3]), &BuildOptions::default()).unwrap();
    write_table(&path, &t1, Chip::Ascend910).unwrap();
    write_table(&path, &t2, Chip::Ascend910).unwrap();
    assert_eq!(fs::read_to_string(&path).unwrap(), t2.to_json_pretty());
    assert_eq!(
        fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o644
    );
    let names: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["rank_table.json"], "no temporary file left behind");
    assert_eq!(read_table(&path, Chip::Ascend910).unwrap(), t2);
}

/// A symbolic link at the table's path (to a shared directory, say) stays a link: the file it
/// leads to is replaced, also through a chain of links and when it does not exist yet.
#[test]
fn writer_follows_a_symbolic_link_to_the_table() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    fs::create_dir(&shared).unwrap();
    let link = dir.path().join("rank_table.json");
    let middle = dir.path().join("middle.json");
    std::os::unix::fs::symlink("shared/table.json", &middle).unwrap();
    std::os::unix::fs::symlink("middle.json", &link).unwrap();
    for text in ["first", "second"] {
        write_atomically(&link, text.as_bytes()).unwrap();
        assert!(
            fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert!(
            fs::symlink_metadata(&middle)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(fs::read_to_string(shared.join("table.json")).unwrap(), text);
    }
    // Another user's link (one planted in a shared directory) is replaced, not followed.
    let victim = dir.path().join("victim.txt");
    fs::write(&victim, "mine").unwrap();
    let planted = dir.path().join("planted.json");
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    nix::unistd::fchownat(
        nix::fcntl::AT_FDCWD,
        &planted,
        Some(nix::unistd::Uid::from_raw(65534)),
        None,
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .unwrap();
    write_atomically(&planted, b"table").unwrap();
    assert_eq!(fs::read_to_string(&victim).unwrap(), "mine");
    assert!(
        !fs::symlink_metadata(&planted)
            .unwrap()
            .file_type()
            .is_symlink()
    );
}

#[test]
fn writer_refuses_bad_names_and_invalid_tables_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let t = build_table(&host("h1", 1, &[0, 1]), &BuildOptions::default()).unwrap();
    let err = write_table(&dir.path().join("table.txt"), &t, Chip::Ascend910).unwrap_err();
    assert!(
        matches!(&err, Error::BadPath { reason, .. } if reason.contains("ends in .json")),
        "{err}"
    );

    let RankTable::Cluster(mut bad) = t.clone() else {
        panic!()
    };
    bad.status = "initializing".into();
    let err = write_table(
        &dir.path().join("t.json"),
        &RankTable::Cluster(bad),
        Chip::Ascend910,
    )
    .unwrap_err();
    assert!(matches!(err, Error::Invalid { .. }), "{err}");

    let err = write_table(&dir.path().join("missing/t.json"), &t, Chip::Ascend910).unwrap_err();
    assert!(err.to_string().contains("missing"), "{err}");
    assert_eq!(
        fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nothing written"
    );
}

#[test]
fn a_concurrent_reader_never_sees_a_partial_table() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.json");
    let small = build_table(&host("h1", 1, &[0]), &BuildOptions::default()).unwrap();
    let mut big_devices = Vec::new();
    for h in 0..64u8 {
        big_devices.extend(host(&format!("10.0.{h}.1"), h, &[0, 1, 2, 3, 4, 5, 6, 7]));
    }
    let big = build_table(&big_devices, &BuildOptions::default()).unwrap();
    write_table(&path, &small, Chip::Ascend910).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (path, stop) = (path.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut reads = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || reads == 0 {
                let text = fs::read_to_string(&path).unwrap();
                RankTable::parse(&text, &path, Chip::Ascend910).unwrap();
                reads += 1;
            }
            reads
        })
    };
    for i in 0..50 {
        let t = if i % 2 == 0 { &big } else { &small };
        write_table(&path, t, Chip::Ascend910).unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(reader.join().unwrap() > 0);
}

/// The validator's words for values it quotes: `null` once, an id too large said so, and a
/// value of any size cut to a bounded message (a table is input from anyone).
#[test]
fn violations_quote_values_briefly_and_say_what_is_wrong() {
    let mut v: serde_json::Value = serde_json::from_str(
        r#"{"version": "1.0", "server_count": "1", "status": null, "server_list": [
            {"server_id": "", "device": [
                {"device_id": "99999999999999", "device_ip": "10.0.0.1", "rank_id": "0"}]}]}"#,
    )
    .unwrap();
    v["server_list"][0]["server_id"] = serde_json::Value::String("x".repeat(100_000));
    let violations = validate_value(&v, Chip::Ascend910);
    let said = |path: &str| {
        violations
            .iter()
            .find(|x| x.path == path)
            .map(|x| x.message.clone())
            .unwrap_or_else(|| panic!("no violation at {path}: {violations:#?}"))
    };
    assert_eq!(said("$.status"), "must be a JSON string, found null");
    assert_eq!(
        said("$.server_list[0].device[0].device_id"),
        "\"99999999999999\" is too large (at most 4294967295)"
    );
    let server = said("$.server_list[0].server_id");
    assert!(server.len() < 1100, "{} bytes", server.len());
    assert!(server.ends_with(" bytes in all)"), "{server}");
}

/// A server the validator cannot read (not an object, no device list) is named, and hides its
/// ranks: the others' are not called out of range or missing because of it.
#[test]
fn an_unreadable_server_does_not_make_the_other_ranks_wrong() {
    let second = r#"{"server_id": "10.0.0.2", "device": [
        {"device_id": "0", "device_ip": "10.1.0.1", "rank_id": "2"},
        {"device_id": "1", "device_ip": "10.1.0.2", "rank_id": "3"}]}"#;
    for first in [
        r#""10.0.0.1""#,
        r#"{"server_id": "10.0.0.1"}"#,
        r#"{"server_id": "10.0.0.1", "device": {}}"#,
    ] {
        let text = format!(
            r#"{{"version": "1.0", "server_count": "2", "status": "completed",
                "server_list": [{first}, {second}]}}"#
        );
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let violations = validate_value(&v, Chip::Ascend910);
        assert!(
            violations
                .iter()
                .any(|x| x.path.starts_with("$.server_list[0]")),
            "{first}: {violations:#?}"
        );
        assert!(
            violations.iter().all(|x| x.rule != Rule::RankIds),
            "{first}: {violations:#?}"
        );
    }
}

/// Every violation is reported (SPEC §4): a rank_id that cannot be read hides no other's being
/// out of range (the devices are still counted), and a table without "version" but with a
/// server_list is a 1.x table missing it, whose other problems are reported with it.
#[test]
fn an_unreadable_rank_id_or_a_missing_version_hides_no_other_problem() {
    let rules = |text: &str| -> Vec<(String, Rule)> {
        let v: serde_json::Value = serde_json::from_str(text).unwrap();
        validate_value(&v, Chip::Ascend910)
            .into_iter()
            .map(|x| (x.path, x.rule))
            .collect()
    };
    let got = rules(
        r#"{"version": "1.0", "server_count": "1", "status": "completed", "server_list": [
            {"server_id": "s", "device": [
                {"device_id": "0", "device_ip": "10.0.0.1", "rank_id": "0"},
                {"device_id": "1", "device_ip": "10.0.0.2", "rank_id": "x"},
                {"device_id": "2", "device_ip": "10.0.0.3", "rank_id": "7"},
                {"device_id": "3", "device_ip": "10.0.0.4", "rank_id": "3"}]}]}"#,
    );
    assert!(
        got.contains(&(
            "$.server_list[0].device[1].rank_id".into(),
            Rule::NotDecimal
        )) && got.contains(&("$.server_list[0].device[2].rank_id".into(), Rule::RankIds)),
        "{got:#?}"
    );
    let got = rules(
        r#"{"server_count": "1", "server_list": [{"server_id": "10.0.0.1", "device": [
            {"device_id": 3, "device_ip": "10.0.1.1", "rank_id": "0"},
            {"device_id": "1", "device_ip": "10.0.1.2", "rank_id": "1"}]}]}"#,
    );
    for want in [
        ("$".to_string(), Rule::Missing),
        (
            "$.server_list[0].device[0].device_id".to_string(),
            Rule::NotString,
        ),
    ] {
        assert!(got.contains(&want), "{want:?}: {got:#?}");
    }
    assert_eq!(
        got.iter().filter(|(_, r)| *r == Rule::Missing).count(),
        2,
        "{got:#?}"
    );
}

/// More than any rank table is refused before it is parsed (`/dev/zero` would fill memory).
#[test]
fn a_file_larger_than_any_rank_table_is_refused() {
    let zeros = std::io::repeat(b' ').take(TABLE_SIZE_LIMIT + 1);
    match read_json_from(zeros, Path::new("/dev/zero")) {
        Err(Error::BadPath { path, reason }) => {
            assert_eq!(path, Path::new("/dev/zero"));
            assert!(reason.contains("more than 256 MiB"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    let (value, bytes) = read_json_from(&b"{\"a\": 1}"[..], Path::new("<stdin>")).unwrap();
    assert_eq!(value["a"], 1);
    assert_eq!(bytes.len(), 8);
}

/// A table's path is one HCCL loads: its first `.json` ends it (`CheckFilePath`), and the
/// name before it is not empty (`GetFileName`).
#[test]
fn a_table_path_is_one_hccl_loads() {
    use std::path::Path;
    for (name, ok) in [
        ("t.json", true),
        ("/jobs/run-3/rank_table.json", true),
        ("a.b.json", true),
        ("dir.d/t.json", true),
        ("dir/.json", false),
        (".json", false),
        ("a.json.json", false),
        ("/jobs/a.json.d/t.json", false),
        ("t.txt", false),
        ("json", false),
        ("t.json/", false),
        ("t.JSON", false),
        ("", false),
    ] {
        let problem = super::hccl_name_problem(Path::new(name));
        assert_eq!(problem.is_none(), ok, "{name:?}: {problem:?}");
    }
    let why = super::hccl_name_problem(Path::new("/jobs/a.json.d/t.json")).unwrap();
    assert!(
        why.contains("(/jobs/a.json)") && why.contains("choose a directory"),
        "{why}"
    );
    let why = super::hccl_name_problem(Path::new("/jobs/a.json.json")).unwrap();
    assert!(
        why.contains("(/jobs/a.json)") && why.contains("name the file"),
        "{why}"
    );
}
