//! Property tests: builder and merge invariants, round trips, and no panic on any input.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use proptest::prelude::*;
use serde_json::Value;

use super::*;
use crate::device::{Chip, Device, Health};
use crate::error::Error;

/// Device sets HCCL accepts on 910: 1, 2, 4 or 8 devices, never crossing the 0-3/4-7 groups.
fn device_set() -> impl Strategy<Value = Vec<u32>> {
    prop_oneof![
        (0u32..8).prop_map(|d| vec![d]),
        (0u32..2, 0u32..2).prop_map(|(g, p)| vec![g * 4 + p * 2, g * 4 + p * 2 + 1]),
        (0u32..2).prop_map(|g| (g * 4..g * 4 + 4).collect()),
        Just((0..8).collect()),
    ]
}

/// A cluster: distinct host addresses, the same device set size on every host.
fn cluster() -> impl Strategy<Value = Vec<Device>> {
    (
        proptest::collection::btree_set((1u8..=254, 0u8..=255), 1..12),
        device_set(),
    )
        .prop_map(|(hosts, set)| {
            hosts
                .into_iter()
                .enumerate()
                .flat_map(|(h, (a, b))| {
                    let set = set.clone();
                    set.into_iter().map(move |p| Device {
                        server_id: format!("10.{a}.{b}.1"),
                        logical_id: p,
                        physical_id: p,
                        ip: Some(IpAddr::V4(Ipv4Addr::new(29, h as u8, a, p as u8 + 1))),
                        chip: "910".into(),
                        health: Health::Healthy,
                        super_device_id: None,
                        super_pod_id: None,
                    })
                })
                .collect()
        })
}

fn cluster_and_shuffle() -> impl Strategy<Value = (Vec<Device>, Vec<Device>)> {
    cluster().prop_flat_map(|d| {
        let shuffled = Just(d.clone()).prop_shuffle();
        (Just(d), shuffled)
    })
}

fn ranks(table: &RankTable) -> Vec<u32> {
    table.ranks().unwrap().iter().map(|e| e.rank).collect()
}

/// Any JSON value, nested a few levels, biased toward rank-table keys.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        "[0-9]{0,3}".prop_map(Value::String),
        "[ -~]{0,12}".prop_map(Value::String),
        Just(Value::String("completed".into())),
        Just(Value::String("1.0".into())),
        Just(Value::String("1.2".into())),
    ];
    let key = prop_oneof![
        Just("version"),
        Just("status"),
        Just("server_count"),
        Just("server_list"),
        Just("server_id"),
        Just("device"),
        Just("device_id"),
        Just("device_ip"),
        Just("rank_id"),
        Just("super_pod_list"),
        Just("super_pod_id"),
        Just("super_device_id"),
        Just("group_list"),
        Just("group_count"),
        Just("instance_list"),
        Just("devices"),
        Just("pod_name"),
        Just("instance_count"),
        Just("device_count"),
        Just("host_ip"),
        Just("device_port"),
        Just("x"),
    ];
    leaf.prop_recursive(8, 256, 8, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::vec((key.clone(), inner), 0..6).prop_map(|kv| {
                Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
            }),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, .. ProptestConfig::default() })]

    #[test]
    fn ranks_are_exactly_0_to_n_and_independent_of_gather_order((devices, shuffled) in cluster_and_shuffle()) {
        let a = build_table(&devices, &BuildOptions::default()).unwrap();
        let b = build_table(&shuffled, &BuildOptions::default()).unwrap();
        prop_assert_eq!(&a, &b);
        let r = ranks(&a);
        prop_assert_eq!(r, (0..devices.len() as u32).collect::<Vec<_>>());
        // Servers ascend by server_id as strings, devices by physical id.
        let entries = a.ranks().unwrap();
        for w in entries.windows(2) {
            prop_assert!((w[0].server_id.as_str(), w[0].physical_id) < (w[1].server_id.as_str(), w[1].physical_id));
        }
    }

    #[test]
    fn host_order_is_kept_whatever_the_gather_order((devices, shuffled) in cluster_and_shuffle(), seed in any::<u64>()) {
        let mut hosts: Vec<String> = devices.iter().map(|d| d.server_id.clone()).collect();
        hosts.dedup();
        // A deterministic permutation of the host list.
        let n = hosts.len();
        hosts.rotate_left((seed as usize) % n);
        let opts = BuildOptions { order: RankOrder::Hosts(hosts.clone()), ..BuildOptions::default() };
        let a = build_table(&shuffled, &opts).unwrap();
        let b = build_table(&devices, &opts).unwrap();
        prop_assert_eq!(&a, &b);
        let RankTable::Cluster(t) = &a else { panic!("1.0 expected") };
        let order: Vec<&str> = t.server_list.iter().map(|s| s.server_id.as_str()).collect();
        prop_assert_eq!(order, hosts.iter().map(String::as_str).collect::<Vec<_>>());
        prop_assert_eq!(ranks(&a), (0..devices.len() as u32).collect::<Vec<_>>());
    }

    #[test]
    fn serialize_then_parse_is_identity(devices in cluster(), format in prop_oneof![Just(Format::V1_0), Just(Format::Legacy)]) {
        let table = build_table(&devices, &BuildOptions { format, ..BuildOptions::default() }).unwrap();
        let text = table.to_json_pretty();
        let parsed = RankTable::parse(&text, Path::new("t.json"), Chip::Ascend910).unwrap();
        prop_assert_eq!(&parsed, &table);
        prop_assert_eq!(parsed.to_json_pretty(), text);
        prop_assert_eq!(parsed.ranks().unwrap(), table.ranks().unwrap());
    }

    #[test]
    fn merge_keeps_every_device_once(devices in cluster()) {
        let mut hosts: Vec<String> = devices.iter().map(|d| d.server_id.clone()).collect();
        hosts.sort();
        hosts.dedup();
        let inputs: Vec<MergeInput> = hosts
            .iter()
            .map(|h| {
                let mine: Vec<Device> = devices.iter().filter(|d| &d.server_id == h).cloned().collect();
                MergeInput { name: format!("{h}.json"), table: build_table(&mine, &BuildOptions::default()).unwrap() }
            })
            .collect();
        let merged = merge_tables(&inputs, Chip::Ascend910).unwrap();
        // The merge of per-host tables is the table built from all devices at once.
        let direct = build_table(&devices, &BuildOptions::default()).unwrap();
        prop_assert_eq!(&merged, &direct);
        let mut seen: Vec<(String, u32)> = merged.ranks().unwrap().into_iter().map(|e| (e.server_id, e.physical_id)).collect();
        let n = seen.len();
        seen.sort();
        seen.dedup();
        prop_assert_eq!(seen.len(), n);
        prop_assert_eq!(n, devices.len());
    }

    #[test]
    fn parse_never_panics_on_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let text = String::from_utf8_lossy(&bytes);
        let _ = RankTable::parse(&text, Path::new("fuzz.json"), Chip::Ascend910);
    }

    #[test]
    fn validator_never_panics_on_json(value in any_json(), chip in prop_oneof![Just(Chip::Ascend910), Just(Chip::Ascend910B), Just(Chip::Ascend910_93)]) {
        let violations = validate_value(&value, chip);
        match RankTable::from_value(value, "fuzz", chip) {
            Ok(table) => {
                prop_assert!(violations.is_empty());
                // A table that validates can be used: ranks() and serialization work.
                let _ = table.ranks();
                let _ = table.to_json_pretty();
            }
            Err(Error::Invalid { violations: v, .. }) => {
                // Refused only for what the validator reports: the typed model accepts every
                // table the validator passes.
                prop_assert!(!violations.is_empty(), "validator passed but the model refused: {v:?}");
                prop_assert!(v.iter().all(|x| x.path.starts_with('$') && !x.message.is_empty()));
            }
            Err(e) => prop_assert!(false, "unexpected error {e}"),
        }
    }

    #[test]
    fn near_valid_tables_never_panic_and_model_agrees(
        devices in cluster(),
        format in prop_oneof![Just(Format::V1_0), Just(Format::Legacy)],
        edits in proptest::collection::vec(
            (any::<prop::sample::Index>(), any::<prop::sample::Index>(), 0u8..4, any_json()),
            1..4,
        ),
        chip in prop_oneof![Just(Chip::Ascend910), Just(Chip::Ascend910B), Just(Chip::Ascend910_93)],
    ) {
        let table = build_table(&devices, &BuildOptions { format, ..BuildOptions::default() }).unwrap();
        let mut value = serde_json::to_value(&table).unwrap();
        for (pick, key_pick, op, replacement) in edits {
            // Every node of the document, by JSON pointer; edit one of them.
            let mut pointers = Vec::new();
            collect_pointers(&value, "", &mut pointers);
            let target = pick.get(&pointers).clone();
            let Some(node) = value.pointer_mut(&target) else { continue };
            match op {
                0 => *node = replacement,
                1 => {
                    if let Some(obj) = node.as_object_mut() && !obj.is_empty() {
                        let keys: Vec<String> = obj.keys().cloned().collect();
                        obj.remove(key_pick.get(&keys));
                    }
                }
                2 => {
                    if let Some(arr) = node.as_array_mut() && let Some(first) = arr.first().cloned() {
                        arr.push(first);
                    }
                }
                _ => {
                    if let Some(obj) = node.as_object_mut() {
                        obj.insert("super_pod_list".into(), replacement);
                    }
                }
            }
        }
        // Warnings (a missing server_count, ...) are no refusal: only errors are compared.
        let errors = |v: Vec<Violation>| -> Vec<Violation> { v.into_iter().filter(Violation::is_error).collect() };
        let violations = errors(validate_value(&value, chip));
        match RankTable::from_value(value, "fuzz", chip) {
            Ok(t) => {
                prop_assert!(violations.is_empty(), "{violations:?}");
                let _ = t.ranks();
                prop_assert_eq!(errors(validate_table(&t, chip)), Vec::new());
            }
            Err(Error::Invalid { violations: v, .. }) => {
                prop_assert!(!violations.is_empty(), "validator passed but the model refused: {v:?}");
            }
            Err(e) => prop_assert!(false, "unexpected error {e}"),
        }
    }

    #[test]
    fn a_valid_table_with_one_scalar_made_a_number_is_invalid_at_that_path(devices in cluster(), pick in any::<prop::sample::Index>()) {
        let table = build_table(&devices, &BuildOptions::default()).unwrap();
        let mut value = serde_json::to_value(&table).unwrap();
        let mut paths = Vec::new();
        collect_string_paths(&value, "$", &mut paths);
        let (path, pointer) = pick.get(&paths).clone();
        let target = value.pointer_mut(&pointer).unwrap();
        *target = Value::from(7);
        let violations = validate_value(&value, Chip::Ascend910);
        prop_assert!(
            violations.iter().any(|v| v.rule == Rule::NotString && v.path == path),
            "no not-string violation at {}: {:?}", path, violations
        );
    }
}

/// The JSON pointer of every node of `v`, the root included.
fn collect_pointers(v: &Value, pointer: &str, out: &mut Vec<String>) {
    out.push(pointer.to_string());
    match v {
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                collect_pointers(x, &format!("{pointer}/{i}"), out);
            }
        }
        Value::Object(o) => {
            for (k, x) in o {
                collect_pointers(x, &format!("{pointer}/{k}"), out);
            }
        }
        _ => {}
    }
}

/// (JSONPath, JSON pointer) of every string in `v`.
fn collect_string_paths(v: &Value, path: &str, out: &mut Vec<(String, String)>) {
    fn walk(v: &Value, path: &str, pointer: &str, out: &mut Vec<(String, String)>) {
        match v {
            Value::String(_) => out.push((path.to_string(), pointer.to_string())),
            Value::Array(a) => {
                for (i, x) in a.iter().enumerate() {
                    walk(x, &format!("{path}[{i}]"), &format!("{pointer}/{i}"), out);
                }
            }
            Value::Object(o) => {
                for (k, x) in o {
                    walk(x, &format!("{path}.{k}"), &format!("{pointer}/{k}"), out);
                }
            }
            _ => {}
        }
    }
    walk(v, path, "", out);
}

/// A change that may break a rule, applied to a typed table.
#[derive(Debug, Clone)]
enum Damage {
    Ip(usize, String),
    RankId(usize, String),
    DeviceId(usize, String),
    ServerId(usize, String),
    DropIp(usize),
    Status(String),
    Extra(usize, &'static str, Value),
}

fn damage() -> impl Strategy<Value = Damage> {
    let text = prop_oneof![
        "[0-9]{1,2}",
        "[0-9a-f.:,]{0,9}",
        Just(String::new()),
        Just("29.0.0.1".to_string())
    ];
    prop_oneof![
        (any::<usize>(), text.clone()).prop_map(|(i, t)| Damage::Ip(i, t)),
        (any::<usize>(), text.clone()).prop_map(|(i, t)| Damage::RankId(i, t)),
        (any::<usize>(), text.clone()).prop_map(|(i, t)| Damage::DeviceId(i, t)),
        (any::<usize>(), prop_oneof!["[a-z]{0,3}", "[a-z]{65,70}"])
            .prop_map(|(i, t)| Damage::ServerId(i, t)),
        any::<usize>().prop_map(Damage::DropIp),
        text.prop_map(Damage::Status),
        (
            any::<usize>(),
            prop_oneof![
                Just("device_port"),
                Just("host_port"),
                Just("backup_device_ip"),
                Just("other")
            ],
            prop_oneof![
                Just(Value::from(5)),
                Just(Value::from("0")),
                Just(Value::from("16666")),
                Just(Value::from("x"))
            ],
        )
            .prop_map(|(i, k, v)| Damage::Extra(i, k, v)),
    ]
}

/// The `i`-th device of the table, counting over all servers (modulo the device count).
fn nth_device(table: &mut ClusterTable, i: usize) -> &mut DeviceEntry {
    let n = table
        .server_list
        .iter()
        .map(|s| s.device.len())
        .sum::<usize>();
    let mut i = i % n;
    for s in &mut table.server_list {
        if i < s.device.len() {
            return &mut s.device[i];
        }
        i -= s.device.len();
    }
    unreachable!("index is below the device count")
}

fn apply(table: &mut ClusterTable, d: &Damage) {
    match d {
        Damage::Ip(i, t) => nth_device(table, *i).device_ip = Some(t.clone()),
        Damage::RankId(i, t) => nth_device(table, *i).rank_id = t.clone(),
        Damage::DeviceId(i, t) => nth_device(table, *i).device_id = t.clone(),
        Damage::DropIp(i) => nth_device(table, *i).device_ip = None,
        Damage::Extra(i, k, v) => {
            nth_device(table, *i)
                .extra
                .insert((*k).to_string(), v.clone());
        }
        Damage::ServerId(i, t) => {
            let len = table.server_list.len();
            table.server_list[i % len].server_id = t.clone();
        }
        Damage::Status(t) => table.status = t.clone(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    /// The validator walks typed tables in place and parsed files as JSON values: both walks
    /// must report the same violations for the same table, valid or not.
    #[test]
    fn typed_and_json_validation_agree(devices in cluster(), damages in proptest::collection::vec(damage(), 0..4), chip in prop_oneof![Just(Chip::Ascend910), Just(Chip::Ascend910B)]) {
        let RankTable::Cluster(mut t) = build_table(&devices, &BuildOptions::default()).unwrap() else {
            panic!("1.0 expected")
        };
        for d in &damages {
            apply(&mut t, d);
        }
        let table = RankTable::Cluster(t);
        let typed = validate_table(&table, chip);
        let json = validate_value(&serde_json::to_value(&table).unwrap(), chip);
        prop_assert_eq!(typed, json);
    }
}
