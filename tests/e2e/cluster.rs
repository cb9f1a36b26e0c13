//! What workers see: the rank table on disk and their environment (SPEC: hosts, rank table,
//! worker environment).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use atlasboost_e2e::{Finished, Run, unique};
use serde_json::Value;

use crate::split_tag;

/// A worker that reports everything it was given as one JSON line: its environment, its cwd,
/// the rank table it read from RANK_TABLE_FILE, and the table entry with its RANK_ID.
/// (`ssh` runs it on remote hosts too, with the variables the launcher forwards.)
pub(crate) const REPORTER: &str = r#"
import json, os, sys
names = ["RANK_TABLE_FILE", "RANK_ID", "RANK_SIZE", "DEVICE_ID", "ASCEND_DEVICE_ID", "RANK",
         "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
         "MASTER_PORT", "JOB_ID", "OMP_NUM_THREADS", "PYTHONUNBUFFERED", "ATLASBOOST_JOB_ID",
         "ATLASBOOST_SERVER_ID", "ATLASBOOST_PHYSICAL_ID", "ATLASBOOST_E2E_X",
         "ATLASBOOST_E2E_EQ", "PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "ATLASBOOST_E2E_FWD",
         "HCCL_E2E_X", "HCCL_E2E_OVERRIDE", "E2E_UNRELATED", "E2E_BY_NAME", "POD_NAME",
         "HCCL_CONNECT_TIMEOUT"]
env = {n: os.environ.get(n) for n in names}
with open(os.environ["RANK_TABLE_FILE"]) as f:
    table = json.load(f)
entries = [{"server_id": s["server_id"], "device_id": d["device_id"], "device_ip": d["device_ip"]}
           for s in table["server_list"] for d in s["device"]
           if d["rank_id"] == os.environ.get("RANK_ID")]
print("E2E " + json.dumps({"env": env, "cwd": os.getcwd(), "table": table, "entries": entries}))
"#;

/// The `E2E {json}` lines of a run's stdout, by the rank of their tag.
fn reports(out: &str) -> BTreeMap<u32, Value> {
    let mut got = BTreeMap::new();
    for line in out.lines() {
        let Some((rank, rest)) = split_tag(line, "stdout") else {
            continue;
        };
        let Some(json) = rest.strip_prefix("E2E ") else {
            continue;
        };
        let v: Value = serde_json::from_str(json)
            .unwrap_or_else(|e| panic!("rank {rank} printed bad JSON ({e}): {json}"));
        assert!(
            got.insert(rank, v).is_none(),
            "rank {rank} reported twice:\n{out}"
        );
    }
    got
}

pub(crate) fn s<'a>(v: &'a Value, key: &str) -> &'a str {
    v["env"][key]
        .as_str()
        .unwrap_or_else(|| panic!("{key} is not set in {v}"))
}

/// `atlasboost validate FILE` exits 0.
fn assert_valid(table: &str) {
    let r = Run::new(["validate", table]).run();
    assert_eq!(
        r.code(),
        Some(0),
        "atlasboost validate {table} must accept the table the launch wrote\n{}",
        r.describe()
    );
}

#[test]
fn two_hosts_of_four_devices_get_a_consistent_table_and_environment() {
    let x = unique("x");
    let run = Run::new([
        "run",
        "--sim",
        "4",
        "-H",
        "127.0.0.1:4,127.0.0.2:4",
        "--grace",
        "1",
    ]);
    let script = run.file("report.py", REPORTER, false);
    let r = run
        .args([
            "-x",
            &format!("ATLASBOOST_E2E_X={x}"),
            "-x",
            "ATLASBOOST_E2E_EQ=a=b",
        ])
        .args(["--", "python3"])
        .args([&script])
        .run();
    check_two_hosts(&r, ["127.0.0.1", "127.0.0.2"], &x);
}

/// Checks a run of [`REPORTER`] on two hosts of four devices, `-x ATLASBOOST_E2E_X=x -x
/// ATLASBOOST_E2E_EQ=a=b`: it exits 0, every rank reports once, and the table on disk, the
/// workers' environment and the summary agree. Returns the reports, by rank.
pub(crate) fn check_two_hosts(r: &Finished, hosts: [&str; 2], x: &str) -> BTreeMap<u32, Value> {
    r.assert_code(0);
    let got = reports(&r.out());
    let ctx = r.describe();

    // One report from each of ranks 0-7, and each from the rank its tag names.
    assert_eq!(
        got.keys().copied().collect::<Vec<_>>(),
        (0..8).collect::<Vec<_>>(),
        "every rank reports once\n{ctx}"
    );
    let rank_ids: Vec<&str> = got.values().map(|v| s(v, "RANK_ID")).collect();
    let distinct: BTreeSet<&str> = rank_ids.iter().copied().collect();
    assert_eq!(
        rank_ids.len(),
        distinct.len(),
        "RANK_ID twice: {rank_ids:?}"
    );
    for (rank, v) in &got {
        assert_eq!(
            s(v, "RANK_ID"),
            rank.to_string(),
            "tag and RANK_ID differ: {v}"
        );
        assert_eq!(s(v, "RANK"), rank.to_string(), "{v}");
        assert_eq!(s(v, "RANK_SIZE"), "8", "{v}");
        assert_eq!(s(v, "WORLD_SIZE"), "8", "{v}");
        assert_eq!(s(v, "LOCAL_WORLD_SIZE"), "4", "{v}");
        assert_eq!(s(v, "OMP_NUM_THREADS"), "1", "{v}");
        assert_eq!(s(v, "PYTHONUNBUFFERED"), "1", "{v}");
        // TensorFlow (the default framework) reads POD_NAME before RANK_ID.
        assert_eq!(s(v, "POD_NAME"), rank.to_string(), "{v}");
        assert_eq!(s(v, "HCCL_CONNECT_TIMEOUT"), "600", "{v}");
        assert_eq!(
            s(v, "ATLASBOOST_E2E_X"),
            x,
            "-x NAME=VALUE is exported: {v}"
        );
        assert_eq!(
            s(v, "ATLASBOOST_E2E_EQ"),
            "a=b",
            "-x splits at the first '=': {v}"
        );
        assert_eq!(s(v, "JOB_ID"), s(v, "ATLASBOOST_JOB_ID"), "{v}");

        // Its table entry: on its own server, on its own device.
        let entries = v["entries"].as_array().unwrap();
        assert_eq!(entries.len(), 1, "RANK_ID {rank} is in the table once: {v}");
        let e = &entries[0];
        assert_eq!(e["server_id"], s(v, "ATLASBOOST_SERVER_ID"), "{v}");
        assert_eq!(e["device_id"], s(v, "DEVICE_ID"), "{v}");
        assert_eq!(e["device_id"], s(v, "ASCEND_DEVICE_ID"), "{v}");
        assert_eq!(e["device_id"], s(v, "ATLASBOOST_PHYSICAL_ID"), "{v}");

        // The table file: absolute, in the working directory, the one on disk.
        let path = s(v, "RANK_TABLE_FILE");
        assert!(
            Path::new(path).is_absolute(),
            "RANK_TABLE_FILE {path} is relative"
        );
        assert_eq!(
            Path::new(path).canonicalize().unwrap(),
            r.dir().join("rank_table.json").canonicalize().unwrap(),
            "the table is ./rank_table.json of the working directory"
        );
        assert_eq!(
            Path::new(v["cwd"].as_str().unwrap())
                .canonicalize()
                .unwrap(),
            r.dir().canonicalize().unwrap(),
            "workers run in the launcher's directory"
        );
    }

    // Every worker saw the same table, which is the one left on disk, and it is valid.
    let on_disk: Value =
        serde_json::from_slice(&std::fs::read(r.dir().join("rank_table.json")).unwrap()).unwrap();
    for (rank, v) in &got {
        assert_eq!(v["table"], on_disk, "rank {rank} read another table");
    }
    assert_valid(s(&got[&0], "RANK_TABLE_FILE"));
    assert_eq!(on_disk["version"], "1.0");
    assert_eq!(on_disk["server_count"], "2");
    assert_eq!(on_disk["status"], "completed");
    let servers = on_disk["server_list"].as_array().unwrap();
    assert_eq!(servers.len(), 2, "{on_disk}");
    let ids: BTreeSet<&str> = servers
        .iter()
        .map(|s| s["server_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        BTreeSet::from(hosts),
        "two distinct servers: {on_disk}"
    );
    let ips: Vec<&str> = servers
        .iter()
        .flat_map(|s| s["device"].as_array().unwrap())
        .map(|d| d["device_ip"].as_str().unwrap())
        .collect();
    let distinct_ips: BTreeSet<&str> = ips.iter().copied().collect();
    assert_eq!(ips.len(), 8, "8 devices: {on_disk}");
    assert_eq!(distinct_ips.len(), 8, "device_ips are distinct: {ips:?}");

    // Per server: local ranks 0-3, one group rank; one job, one master for all.
    let mut by_server: BTreeMap<&str, Vec<&Value>> = BTreeMap::new();
    for v in got.values() {
        by_server
            .entry(s(v, "ATLASBOOST_SERVER_ID"))
            .or_default()
            .push(v);
    }
    assert_eq!(by_server.len(), 2, "workers on both servers\n{ctx}");
    let mut group_ranks = BTreeSet::new();
    for (server, workers) in &by_server {
        let locals: BTreeSet<&str> = workers.iter().map(|v| s(v, "LOCAL_RANK")).collect();
        assert_eq!(locals, BTreeSet::from(["0", "1", "2", "3"]), "on {server}");
        let devices: BTreeSet<&str> = workers.iter().map(|v| s(v, "DEVICE_ID")).collect();
        assert_eq!(
            devices.len(),
            4,
            "distinct devices on {server}: {devices:?}"
        );
        let groups: BTreeSet<&str> = workers.iter().map(|v| s(v, "GROUP_RANK")).collect();
        assert_eq!(groups.len(), 1, "one GROUP_RANK on {server}: {groups:?}");
        group_ranks.extend(groups);
    }
    assert_eq!(group_ranks, BTreeSet::from(["0", "1"]));
    for key in ["MASTER_ADDR", "MASTER_PORT", "ATLASBOOST_JOB_ID"] {
        let values: BTreeSet<&str> = got.values().map(|v| s(v, key)).collect();
        assert_eq!(
            values.len(),
            1,
            "{key} is the same for every worker: {values:?}"
        );
    }
    assert!(
        ids.contains(s(&got[&0], "MASTER_ADDR")),
        "MASTER_ADDR is a server"
    );
    assert!(
        s(&got[&0], "MASTER_PORT")
            .parse::<u16>()
            .is_ok_and(|p| p > 0),
        "MASTER_PORT is a port"
    );

    // The summary table at the end, on stderr.
    let err = r.err();
    let header = err.lines().find(|l| {
        let words: Vec<&str> = l.split_whitespace().collect();
        words == ["rank", "host", "device", "status", "time"]
    });
    assert!(header.is_some(), "no summary table on stderr\n{ctx}");
    assert!(
        !r.out().lines().any(|l| l.starts_with("atlasboost:")),
        "atlasboost's own messages go to stderr\n{ctx}"
    );
    got
}

#[test]
fn job_ids_are_unique_and_set_variables_win() {
    let job_id = |omp: Option<&str>| {
        let mut run = Run::new(["run", "--sim", "1", "-H", "127.0.0.1"]);
        if let Some(v) = omp {
            run = run.env("OMP_NUM_THREADS", v);
        }
        let r = run
            .args(["-x", "PYTHONUNBUFFERED=0", "--", "sh", "-c"])
            .args(["echo \"$ATLASBOOST_JOB_ID $OMP_NUM_THREADS $PYTHONUNBUFFERED\""])
            .run();
        r.assert_code(0);
        let line = crate::rank_lines(&r.out(), 0, "stdout");
        assert_eq!(line.len(), 1, "{}", r.describe());
        line[0].clone()
    };
    let a = job_id(None);
    let b = job_id(Some("3"));
    let (a, b): (Vec<&str>, Vec<&str>) = (a.split(' ').collect(), b.split(' ').collect());
    assert!(!a[0].is_empty(), "ATLASBOOST_JOB_ID is set");
    assert_ne!(a[0], b[0], "two launches have two job ids");
    assert_eq!(a[1], "1", "OMP_NUM_THREADS=1 by default");
    assert_eq!(
        b[1], "3",
        "OMP_NUM_THREADS set in the launcher's environment is kept"
    );
    assert_eq!(a[2], "0", "-x wins over what atlasboost sets");
}

#[test]
fn hostfile_gives_hosts_and_slots_and_np_fills_them_in_order() {
    let placement = |np: Option<&str>| {
        let mut run = Run::new(["run", "--sim", "2", "--hostfile", "hosts.txt"]);
        run.file(
            "hosts.txt",
            "# three servers\n\n127.0.0.1 slots=2   # first\n  127.0.0.2:2\n127.0.0.3\n",
            false,
        );
        if let Some(n) = np {
            run = run.args(["-np", n]);
        }
        let r = run
            .args([
                "--",
                "sh",
                "-c",
                "echo \"$ATLASBOOST_SERVER_ID $DEVICE_ID $RANK_SIZE\"",
            ])
            .run();
        r.assert_code(0);
        let by_rank = crate::lines_by_rank(&r.out(), "stdout");
        assert!(
            by_rank.values().all(|l| l.len() == 1),
            "one line per rank\n{}",
            r.describe()
        );
        by_rank
            .into_values()
            .map(|l| l.join(""))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        placement(None),
        [
            "127.0.0.1 0 6",
            "127.0.0.1 1 6",
            "127.0.0.2 0 6",
            "127.0.0.2 1 6",
            "127.0.0.3 0 6",
            "127.0.0.3 1 6"
        ],
        "every slot of every host of the hostfile"
    );
    assert_eq!(
        placement(Some("4")),
        [
            "127.0.0.1 0 4",
            "127.0.0.1 1 4",
            "127.0.0.2 0 4",
            "127.0.0.2 1 4"
        ],
        "-np 4 fills the hosts in order"
    );
}

#[test]
fn wdir_is_the_workers_directory_and_holds_the_table() {
    let run = Run::new(["run", "--sim", "2", "-H", "127.0.0.1", "--wdir", "job"]);
    std::fs::create_dir(run.dir().join("job")).unwrap();
    let r = run
        .args(["--", "sh", "-c", "echo \"$(pwd -P) $RANK_TABLE_FILE\""])
        .run();
    r.assert_code(0);
    let wdir = r.dir().join("job").canonicalize().unwrap();
    for rank in 0..2 {
        let lines = crate::rank_lines(&r.out(), rank, "stdout");
        assert_eq!(lines.len(), 1, "{}", r.describe());
        let (cwd, table) = lines[0].split_once(' ').unwrap();
        assert_eq!(Path::new(cwd), wdir, "rank {rank} runs in --wdir");
        assert!(Path::new(table).is_absolute(), "{table}");
        assert_eq!(
            Path::new(table).canonicalize().unwrap(),
            wdir.join("rank_table.json"),
            "the table is in --wdir"
        );
    }
    assert_valid(wdir.join("rank_table.json").to_str().unwrap());
}

/// An inherited `POD_NAME` cannot change a TensorFlow worker's rank, and a user's
/// `HCCL_CONNECT_TIMEOUT` is kept (SPEC §9).
#[test]
fn pod_name_is_the_rank_and_hccl_connect_timeout_is_the_users() {
    let r = Run::new(["run", "--sim", "2", "--", "sh", "-c"])
        .args(["echo \"$RANK_ID $POD_NAME $HCCL_CONNECT_TIMEOUT\""])
        .env("POD_NAME", "intruder-9")
        .env("HCCL_CONNECT_TIMEOUT", "1200")
        .run();
    r.assert_code(0);
    let mut lines: Vec<String> = r
        .out()
        .lines()
        .filter_map(|l| split_tag(l, "stdout").map(|(_, t)| t.to_string()))
        .collect();
    lines.sort();
    assert_eq!(lines, ["0 0 1200", "1 1 1200"], "{}", r.describe());
}

/// The launcher never writes a table HCCL would refuse, and says so when it writes one HCCL
/// only warns about (here: unequal device counts on 910_93), even with `-q`.
#[test]
fn a_table_with_a_warning_is_written_and_the_warning_shown() {
    let r = Run::new([
        "run",
        "-q",
        "--sim",
        "16",
        "--sim-chip",
        "910_9391",
        "--format",
        "1.2",
    ])
    .args(["-H", "127.0.0.1:16,127.0.0.2:8", "--", "true"])
    .run();
    r.assert_code(0);
    assert!(
        r.err().contains(
            "atlasboost: the rank table: $.server_list[1].device: warning: server \"127.0.0.2\" \
             has 8 devices"
        ),
        "{}",
        r.describe()
    );
    let table = std::fs::read_to_string(r.dir().join("rank_table.json")).unwrap();
    assert_eq!(table.matches("\"rank_id\"").count(), 24, "{table}");
}

/// The CPUs this process may run on (`Cpus_allowed_list`), and each rank's from the workers'
/// own `/proc/self/status`.
fn cpus_of(list: &str) -> Vec<usize> {
    list.split(',')
        .flat_map(|part| match part.trim().split_once('-') {
            Some((a, b)) => (a.parse::<usize>().unwrap()..=b.parse().unwrap()).collect::<Vec<_>>(),
            None => vec![part.trim().parse().unwrap()],
        })
        .collect()
}

fn allowed_cpus() -> Vec<usize> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap();
    cpus_of(line.trim())
}

fn bound_cpus(r: &Finished) -> BTreeMap<u32, Vec<usize>> {
    r.assert_code(0);
    r.out()
        .lines()
        .filter_map(|l| split_tag(l, "stdout"))
        .filter_map(|(rank, text)| {
            text.strip_prefix("Cpus_allowed_list:")
                .map(|list| (rank, cpus_of(list.trim())))
        })
        .collect()
}

/// `--bind-cores`: every worker's `Cpus_allowed_list` is its own, from the fake DCMI library's
/// affinity when it loads, else an even split of the allowed CPUs.
#[test]
fn bind_cores_gives_each_worker_cpus_of_its_own() {
    let allowed = allowed_cpus();
    if allowed.len() < 2 {
        eprintln!(
            "skipped: this process may run on one CPU only; two workers cannot be bound apart"
        );
        return;
    }
    let show = ["--", "sh", "-c", "grep Cpus_allowed_list /proc/self/status"];
    // ATLASBOOST_DCMI_LIB=none: no DCMI (cargo's LD_LIBRARY_PATH would find the fake's).
    let r = Run::new(["run", "--sim", "2", "--bind-cores"])
        .args(show)
        .env("ATLASBOOST_DCMI_LIB", "none")
        .run();
    let got = bound_cpus(&r);
    let half = allowed.len() / 2;
    assert_eq!(got[&0], allowed[..half], "{}", r.describe());
    assert_eq!(got[&1], allowed[half..], "{}", r.describe());
    // The fake DCMI puts NPU 0 near the last allowed CPU and NPU 1 near the first.
    let (first, last) = (allowed[0], allowed[allowed.len() - 1]);
    let dcmi = atlasboost_e2e::atlasboost_bin()
        .parent()
        .unwrap()
        .join("libdcmi.so");
    assert!(
        dcmi.is_file(),
        "{} is missing: cargo build -p atlasboost-fake-dcmi",
        dcmi.display()
    );
    let r = Run::new(["run", "--sim", "2", "--bind-cores"])
        .args(show)
        .env("ATLASBOOST_DCMI_LIB", &dcmi)
        .env(
            "ATLASBOOST_FAKE_DCMI_AFFINITY",
            format!("0:{last}-{last};1:{first}-{first}"),
        )
        .run();
    let got = bound_cpus(&r);
    assert_eq!(got[&0], [last], "{}", r.describe());
    assert_eq!(got[&1], [first], "{}", r.describe());
    // More workers than CPUs (910B: any count per server): refused, never shared.
    let too_many = allowed.len() + 1;
    let r = Run::new([
        "run",
        "--sim",
        &too_many.to_string(),
        "--sim-chip",
        "910B3",
        "--bind-cores",
        "--",
        "true",
    ])
    .env("ATLASBOOST_DCMI_LIB", "none")
    .run();
    r.assert_code(125);
    assert!(r.err().contains("CPUs allowed"), "{}", r.describe());
}
