//! Library mode: the example worker's `init()` under `atlasboost run`, with the variables
//! torchrun and `srun` set (ZeroMQ rendezvous), and under `mpirun` (module `mpi`, with the
//! e2e crate's `mpi` feature and an MPI-enabled worker).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use atlasboost_e2e::{Finished, Launch, Run, atlasboost_bin, free_port_pair, init_worker_bin};
use serde_json::Value;

/// One `init-worker` line, as `key=value` pairs.
pub(crate) type Report = BTreeMap<String, String>;

/// Parses the `rank=... launcher_rank=...` line of an init-worker (after any tag).
pub(crate) fn parse_report(line: &str) -> Option<Report> {
    let start = line.find("rank=")?;
    let fields: Report = line[start..]
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    fields.contains_key("launcher_rank").then_some(fields)
}

/// The field `key` of a report, as a number.
pub(crate) fn num(r: &Report, key: &str) -> u32 {
    r.get(key)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no number {key} in {r:?}"))
}

/// Checks what every process of a job reported against the table on disk: it is valid (by
/// `atlasboost validate`), everyone names the same file, the table has one entry per process,
/// and each process's `RANK_ID` is the `rank_id` of its own device on its own server.
pub(crate) fn check_job(reports: &[Report], size: usize, via: &str) {
    assert_eq!(reports.len(), size, "one report per process: {reports:?}");
    let path = &reports[0]["table"];
    assert!(
        reports.iter().all(|r| &r["table"] == path),
        "every process names the same table: {reports:?}"
    );
    Run::new(["validate", path.as_str()]).run().assert_code(0);
    let table: Value = serde_json::from_str(
        &std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {path}: {e}")),
    )
    .unwrap_or_else(|e| panic!("{path} is not JSON: {e}"));
    let entries: Vec<(String, String, String)> = table["server_list"]
        .as_array()
        .unwrap_or_else(|| panic!("no server_list in {table}"))
        .iter()
        .flat_map(|s| {
            let server = s["server_id"].as_str().unwrap_or_default().to_string();
            s["device"].as_array().into_iter().flatten().map(move |d| {
                (
                    server.clone(),
                    d["device_id"].as_str().unwrap_or_default().to_string(),
                    d["rank_id"].as_str().unwrap_or_default().to_string(),
                )
            })
        })
        .collect();
    assert_eq!(entries.len(), size, "one table entry per process: {table}");
    let mut launcher_ranks: Vec<u32> = reports.iter().map(|r| num(r, "launcher_rank")).collect();
    launcher_ranks.sort_unstable();
    assert_eq!(launcher_ranks, (0..size as u32).collect::<Vec<_>>());
    for r in reports {
        assert_eq!(r["via"], via, "{r:?}");
        assert_eq!(num(r, "size") as usize, size, "{r:?}");
        let mine: Vec<&(String, String, String)> = entries
            .iter()
            .filter(|(server, device, _)| *server == r["server"] && *device == r["physical"])
            .collect();
        assert_eq!(
            mine.len(),
            1,
            "its device is in the table once: {r:?} in {table}"
        );
        assert_eq!(
            mine[0].2, r["rank_id"],
            "RANK_ID is its device's rank_id: {r:?}"
        );
        assert_eq!(
            mine[0].2, r["rank"],
            "rank() is its device's rank_id: {r:?}"
        );
    }
}

/// Starts `size` init-workers with the variables `vars(rank)`, all writing one table in the
/// first one's directory; returns them in rank order.
fn start_workers(
    size: u32,
    args: &[&str],
    timeout: Duration,
    vars: impl Fn(u32) -> Vec<(String, String)>,
) -> (Vec<Launch>, std::path::PathBuf) {
    let mut launches = Vec::new();
    let mut table = None;
    for rank in 0..size {
        let mut run = Run::new(args)
            .program(init_worker_bin())
            .timeout(timeout)
            .env("ATLASBOOST_SIM", "8");
        let path = table
            .get_or_insert_with(|| run.dir().join("rank_table.json"))
            .clone();
        run = run.env("ATLASBOOST_RANK_TABLE_FILE", &path);
        for (k, v) in vars(rank) {
            run = run.env(k, v);
        }
        launches.push(run.spawn());
    }
    (launches, table.unwrap_or_default())
}

pub(crate) fn torchrun_vars(
    rank: u32,
    size: u32,
    per_host: u32,
    port: u16,
) -> Vec<(String, String)> {
    [
        ("RANK", rank.to_string()),
        ("WORLD_SIZE", size.to_string()),
        ("LOCAL_RANK", (rank % per_host).to_string()),
        ("LOCAL_WORLD_SIZE", per_host.to_string()),
        ("GROUP_RANK", (rank / per_host).to_string()),
        ("MASTER_ADDR", "127.0.0.1".to_string()),
        ("MASTER_PORT", port.to_string()),
        // Two processes per simulated host: 127.0.0.1, 127.0.0.2, ...
        (
            "ATLASBOOST_SERVER_ID",
            format!("127.0.0.{}", rank / per_host + 1),
        ),
        ("ATLASBOOST_RENDEZVOUS_TIMEOUT", "20".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// Every report line of `out`.
pub(crate) fn reports(out: &str) -> Vec<Report> {
    out.lines().filter_map(parse_report).collect()
}

fn reports_of(finished: &[Finished]) -> Vec<Report> {
    finished
        .iter()
        .map(|f| {
            f.assert_code(0);
            f.out()
                .lines()
                .find_map(parse_report)
                .unwrap_or_else(|| panic!("no report line: {}", f.describe()))
        })
        .collect()
}

#[test]
fn init_with_torchrun_variables_meets_over_zeromq() {
    let port = free_port_pair();
    let (launches, _) = start_workers(4, &[], Duration::from_secs(60), |r| {
        torchrun_vars(r, 4, 2, port)
    });
    let finished: Vec<Finished> = launches.into_iter().map(Launch::wait).collect();
    let reports = reports_of(&finished);
    check_job(&reports, 4, "Zmq");
    let servers: std::collections::BTreeSet<&str> =
        reports.iter().map(|r| r["server"].as_str()).collect();
    assert_eq!(servers.len(), 2, "two simulated hosts: {reports:?}");
}

/// torchrun with an IPv6 `MASTER_ADDR` (`::1`): rank 0's coordinator listens on both families
/// and the others reach it. Skipped, saying so, where this machine has no IPv6 loopback.
#[test]
fn init_with_an_ipv6_master_meets_over_zeromq() {
    if let Err(why) = std::net::TcpListener::bind("[::1]:0") {
        eprintln!("skipped: this machine has no IPv6 loopback ([::1]: {why})");
        return;
    }
    let port = free_port_pair();
    let (launches, _) = start_workers(2, &[], Duration::from_secs(60), |r| {
        let mut vars = torchrun_vars(r, 2, 2, port);
        for (k, v) in &mut vars {
            if k == "MASTER_ADDR" {
                *v = "::1".to_string();
            }
        }
        vars
    });
    let finished: Vec<Finished> = launches.into_iter().map(Launch::wait).collect();
    check_job(&reports_of(&finished), 2, "Zmq");
}

/// A stranger that writes garbage to rank 0's rendezvous port while the job meets is refused,
/// the job goes on, and rank 0 says on stderr what it refused.
#[test]
fn init_says_what_its_rendezvous_refused() {
    let port = free_port_pair();
    let table = tempfile::tempdir().expect("a directory for the table");
    let start = |rank: u32| {
        let mut run = Run::new(Vec::<&str>::new())
            .program(init_worker_bin())
            .timeout(Duration::from_secs(60))
            .env("ATLASBOOST_SIM", "8")
            .env(
                "ATLASBOOST_RANK_TABLE_FILE",
                table.path().join("rank_table.json"),
            );
        for (k, v) in torchrun_vars(rank, 2, 2, port) {
            run = run.env(k, v);
        }
        run.spawn()
    };
    let first = start(0);
    // Rank 0's coordinator listens at MASTER_PORT + 1 once it has started.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while let Err(e) = std::net::TcpStream::connect(("127.0.0.1", port + 1)) {
        assert!(
            std::time::Instant::now() < deadline,
            "rank 0's rendezvous at port {} never listened: {e}",
            port + 1
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // A ZeroMQ peer that speaks the transport but not the job's protocol: its frame reaches
    // the coordinator, which must refuse it. Rank 1 comes half a second later, so that the
    // job is still meeting when the frame arrives (rank 0 says what it refused at the end).
    let ctx = zmq::Context::new();
    let stranger = ctx.socket(zmq::DEALER).expect("a DEALER socket");
    stranger
        .connect(&format!("tcp://127.0.0.1:{}", port + 1))
        .expect("the stranger connects");
    stranger
        .send("not a rendezvous frame", 0)
        .expect("the stranger sends");
    std::thread::sleep(Duration::from_millis(500));
    let second = start(1);
    let finished = [first.wait(), second.wait()];
    check_job(&reports_of(&finished), 2, "Zmq");
    let said = finished[0].err();
    assert!(
        said.contains("atlasboost: the rendezvous at tcp://0.0.0.0:") && said.contains("refused"),
        "{said}"
    );
}

/// `ATLASBOOST_BIND_CORES=1`: two ranks of one host, each bound by its own `init()` to its
/// half of the allowed CPUs (no DCMI: an even split), as `run --bind-cores` would.
#[test]
fn init_binds_each_rank_to_cpus_of_its_own_when_asked() {
    let allowed = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| {
            l.strip_prefix("Cpus_allowed_list:")
                .map(|l| l.trim().to_string())
        })
        .unwrap();
    if allowed.split([',', '-']).count() < 2 {
        eprintln!("skipped: this process may run on one CPU only ({allowed})");
        return;
    }
    let port = free_port_pair();
    let (launches, _) = start_workers(2, &[], Duration::from_secs(60), |r| {
        let mut vars = torchrun_vars(r, 2, 2, port);
        vars.push(("ATLASBOOST_BIND_CORES".into(), "1".into()));
        vars.push(("ATLASBOOST_DCMI_LIB".into(), "none".into()));
        vars
    });
    let finished: Vec<Finished> = launches.into_iter().map(Launch::wait).collect();
    let reports = reports_of(&finished);
    check_job(&reports, 2, "Zmq");
    let cpus: std::collections::BTreeSet<&str> =
        reports.iter().map(|r| r["cpus"].as_str()).collect();
    assert_eq!(cpus.len(), 2, "each rank its own CPUs: {reports:?}");
    assert!(
        !cpus.contains(allowed.as_str()),
        "bound, not all of {allowed}: {reports:?}"
    );
}

#[test]
fn init_with_srun_variables_takes_the_master_from_the_node_list() {
    let port = free_port_pair();
    let (launches, _) = start_workers(2, &[], Duration::from_secs(60), |r| {
        [
            ("SLURM_PROCID", r.to_string()),
            ("SLURM_NTASKS", "2".to_string()),
            ("SLURM_LOCALID", r.to_string()),
            ("SLURM_NODEID", "0".to_string()),
            ("SLURM_STEP_NODELIST", "localhost".to_string()),
            ("SLURM_JOB_ID", format!("{port}")),
            ("ATLASBOOST_RENDEZVOUS_PORT", port.to_string()),
            ("ATLASBOOST_RENDEZVOUS_TIMEOUT", "20".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    });
    let finished: Vec<Finished> = launches.into_iter().map(Launch::wait).collect();
    check_job(&reports_of(&finished), 2, "Zmq");
}

#[test]
fn init_under_atlasboost_run_reads_the_launch() {
    let r = Run::new(["run", "--sim", "8", "-H", "127.0.0.1:2,127.0.0.2:2", "--"])
        .args([init_worker_bin()])
        .run();
    r.assert_code(0);
    let reports = reports(&r.out());
    check_job(&reports, 4, "Launch");
}

/// `atlasboost run --mpi` with a worker built without MPI: the workers meet over ZeroMQ at the
/// MASTER_ADDR atlasboost exports. (With the e2e `mpi` feature the worker has MPI: see
/// `mpi.rs`.)
#[cfg(not(feature = "mpi"))]
#[test]
fn atlasboost_run_mpi_with_a_worker_without_mpi_meets_over_zeromq() {
    let r = Run::new(["run", "--mpi", "--sim", "8", "-n", "4", "--"])
        .args([init_worker_bin()])
        .timeout(Duration::from_secs(60))
        .run();
    r.assert_code(0);
    let reports = reports(&r.out());
    check_job(&reports, 4, "Zmq");
}

/// `--format` and `--rank-order` under `--mpi` reach each worker's `init()`
/// (`ATLASBOOST_RANK_TABLE_FORMAT`, `ATLASBOOST_RANK_ORDER`): with `--format legacy` it writes,
/// byte for byte, the table that `atlasboost run` writes, with the same `RANK_ID`s; with
/// `--rank-order hosts` the servers come in the order mpirun filled them.
#[test]
fn run_mpi_passes_format_and_rank_order_to_init_which_writes_the_launchers_table() {
    if atlasboost_e2e::mpirun_or_skip().is_none() {
        return;
    }
    let rank_ids = |f: &Finished| -> BTreeMap<u32, String> {
        reports(&f.out())
            .iter()
            .map(|r| (num(r, "launcher_rank"), r["rank_id"].clone()))
            .collect()
    };
    let job = |mpi: bool| {
        let mut args = vec!["run", "--sim", "8", "-n", "4", "--format", "legacy", "--"];
        if mpi {
            args.insert(1, "--mpi");
        }
        Run::new(args)
            .args([init_worker_bin()])
            .timeout(Duration::from_secs(60))
            .run()
    };
    let (library, launcher) = (job(true), job(false));
    library.assert_code(0);
    launcher.assert_code(0);
    let table = |f: &Finished| std::fs::read(f.dir().join("rank_table.json")).unwrap();
    assert!(
        table(&library) == table(&launcher),
        "init()'s legacy table differs from the launcher's:\n{}\n{}",
        String::from_utf8_lossy(&table(&library)),
        String::from_utf8_lossy(&table(&launcher))
    );
    assert_eq!(rank_ids(&library), rank_ids(&launcher));
    assert_eq!(rank_ids(&library).len(), 4, "{}", library.describe());
    // `--rank-order hosts`: two servers that mpirun fills in the order opposite to their ids
    // (ranks 0-1 say they are on 10.9.0.2, ranks 2-3 on 10.9.0.1; each pair writes a table of
    // its own, as on two machines).
    for (order, servers) in [
        ("hosts", ["10.9.0.2", "10.9.0.1"]),
        ("server-id", ["10.9.0.1", "10.9.0.2"]),
    ] {
        let f = Run::new([
            "run",
            "--mpi",
            "--sim",
            "8",
            "-n",
            "4",
            "--rank-order",
            order,
        ])
        .args(["--", "sh", "-c"])
        .args([format!(
            "r=$OMPI_COMM_WORLD_RANK; ATLASBOOST_SERVER_ID=10.9.0.$((2 - r / 2)) \
                 ATLASBOOST_RANK_TABLE_FILE=$PWD/table-$((r / 2)).json exec {}",
            init_worker_bin().display()
        )])
        .timeout(Duration::from_secs(60))
        .run();
        f.assert_code(0);
        let first = std::fs::read(f.dir().join("table-0.json")).unwrap();
        let second = std::fs::read(f.dir().join("table-1.json")).unwrap();
        assert!(first == second, "{order}: the two servers' tables differ");
        let table: Value = serde_json::from_slice(&first).unwrap();
        let listed: Vec<&str> = table["server_list"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["server_id"].as_str().unwrap())
            .collect();
        assert_eq!(listed, servers, "{order}: {table}");
        // Each rank's RANK_ID is its device's place in that order.
        let ids = rank_ids(&f);
        let want: Vec<(u32, String)> = (0..4u32)
            .map(|r| {
                let first_listed = servers[0] == format!("10.9.0.{}", 2 - r / 2);
                let place = if first_listed { r % 2 } else { 2 + r % 2 };
                (r, place.to_string())
            })
            .collect();
        assert_eq!(ids.into_iter().collect::<Vec<_>>(), want, "{order}");
        // Every rank's MASTER_ADDR is where RANK 0 (the table's rank 0) is, with one port:
        // torch's env:// store listens there. In host order that is launcher rank 0, which
        // passes on the launcher's address; in server-id order launcher rank 2, on 10.9.0.1.
        let masters: std::collections::BTreeSet<String> = reports(&f.out())
            .iter()
            .map(|r| r["master"].clone())
            .collect();
        let master = masters.iter().next().cloned().unwrap_or_default();
        let want = match order {
            "hosts" => "127.0.0.1:",
            _ => "10.9.0.1:",
        };
        assert!(
            masters.len() == 1 && master.starts_with(want),
            "{order}: {masters:?}\n{}",
            f.describe()
        );
    }
    // The legacy format orders servers by id: refused before mpirun starts.
    let f = Run::new(["run", "--mpi", "--sim", "8", "--format", "legacy"])
        .args(["--rank-order", "hosts", "--", "true"])
        .run();
    f.assert_code(2);
    assert!(
        f.err()
            .contains("--rank-order hosts cannot apply to --format legacy"),
        "{}",
        f.describe()
    );
    // Library mode names its variables.
    let f = Run::new::<[&str; 0], &str>([])
        .program(init_worker_bin())
        .env("ATLASBOOST_SIM", "2")
        .env("ATLASBOOST_RANK_TABLE_FORMAT", "2.0")
        .run();
    f.assert_code(1);
    assert!(
        f.err()
            .contains("ATLASBOOST_RANK_TABLE_FORMAT=2.0: expected 1.0, 1.2 or legacy"),
        "{}",
        f.describe()
    );
}

#[test]
fn every_process_of_a_host_must_name_the_same_table() {
    let port = free_port_pair();
    let (launches, _) = start_workers(2, &[], Duration::from_secs(60), |r| {
        let mut v = torchrun_vars(r, 2, 2, port);
        // Rank 1 is told another file.
        if r == 1 {
            v.push((
                "ATLASBOOST_RANK_TABLE_FILE".into(),
                std::env::temp_dir()
                    .join(format!("elsewhere-{port}.json"))
                    .display()
                    .to_string(),
            ));
        }
        v
    });
    let finished: Vec<Finished> = launches.into_iter().map(Launch::wait).collect();
    finished[0].assert_code(0);
    finished[1].assert_code(1);
    let err = finished[1].err();
    assert!(
        err.contains("rank 0 wrote host 127.0.0.1's rank table to")
            && err.contains("but this process (rank 1) expects it at"),
        "{}",
        finished[1].describe()
    );
}

#[test]
fn a_rank_that_exits_before_init_fails_the_others_in_time() {
    let port = free_port_pair();
    let (launches, _) = start_workers(
        3,
        &["--exit-before-init", "2"],
        Duration::from_secs(30),
        |r| {
            let mut v = torchrun_vars(r, 3, 3, port);
            v.retain(|(k, _)| k != "ATLASBOOST_RENDEZVOUS_TIMEOUT");
            v.push(("ATLASBOOST_RENDEZVOUS_TIMEOUT".into(), "3".into()));
            v
        },
    );
    let finished: Vec<Finished> = launches.into_iter().map(Launch::wait).collect();
    finished[2].assert_code(3);
    for f in &finished[..2] {
        f.assert_code(1);
        let err = f.err();
        assert!(
            err.contains(
                "timed out after 3s in round 1 waiting for participant 2 (launcher rank 2) (2 of 3 arrived)"
            ),
            "{}",
            f.describe()
        );
    }
}

#[test]
fn two_processes_on_one_device_are_both_named() {
    let port = free_port_pair();
    // LOCAL_RANK 0 for both: the mistake a wrong variable makes.
    let (launches, _) = start_workers(2, &[], Duration::from_secs(60), |r| {
        let mut v = torchrun_vars(r, 2, 2, port);
        v.retain(|(k, _)| k != "LOCAL_RANK");
        v.push(("LOCAL_RANK".into(), "0".into()));
        v
    });
    for f in launches.into_iter().map(Launch::wait) {
        f.assert_code(1);
        assert!(
            f.err()
                .contains("ranks 0 and 1 both claim device 0 (physical id 0) of host 127.0.0.1"),
            "{}",
            f.describe()
        );
    }
}

/// A one-server table whose device 1 has no RoCE address lists `device_ip` on no device (as
/// `run` and `ranktable` write it), and its writer names the devices without one, as they do.
#[test]
fn init_names_the_devices_whose_addresses_the_table_leaves_out() {
    let port = free_port_pair();
    let (launches, table) = start_workers(2, &[], Duration::from_secs(60), |r| {
        let mut v = torchrun_vars(r, 2, 2, port);
        v.push(("ATLASBOOST_SIM_FAULTS".into(), "no-ip:1".into()));
        v
    });
    let finished: Vec<Finished> = launches.into_iter().map(Launch::wait).collect();
    check_job(&reports_of(&finished), 2, "Zmq");
    let note = "atlasboost: the rank table: device 1 of host 127.0.0.1 has no RoCE address, so \
                the table lists device_ip on no device";
    let said: Vec<&Finished> = finished.iter().filter(|f| f.err().contains(note)).collect();
    assert_eq!(
        said.len(),
        1,
        "the table's writer says it: {:#?}",
        finished.iter().map(Finished::describe).collect::<Vec<_>>()
    );
    let written: Value = serde_json::from_slice(&std::fs::read(&table).unwrap()).unwrap();
    let devices = written["server_list"][0]["device"].as_array().unwrap();
    assert_eq!(devices.len(), 2, "{written}");
    assert!(
        devices.iter().all(|d| d.get("device_ip").is_none()),
        "{written}"
    );
}

#[test]
fn a_half_set_slurm_environment_names_the_missing_variable() {
    let f = Run::new::<[&str; 0], &str>([])
        .program(init_worker_bin())
        .env("SLURM_PROCID", "1")
        .env("SLURM_NTASKS", "4")
        .env("ATLASBOOST_SIM", "8")
        .run();
    f.assert_code(1);
    assert!(f.err().contains("SLURM_LOCALID is not"), "{}", f.describe());
    assert!(
        !Path::new(&f.dir().join("rank_table.json")).exists(),
        "no table written"
    );
}

/// `MASTER_PORT=65535` leaves no `MASTER_PORT + 1` for the rendezvous: named, not replaced by
/// another port that the other hosts' processes would not know.
#[test]
fn the_last_port_as_master_port_is_named() {
    let mut run = Run::new::<[&str; 0], &str>([])
        .program(init_worker_bin())
        .env("ATLASBOOST_SIM", "8");
    for (k, v) in torchrun_vars(0, 2, 2, u16::MAX) {
        run = run.env(k, v);
    }
    let f = run.run();
    f.assert_code(1);
    assert!(
        f.err().contains("MASTER_PORT") && f.err().contains("65535 is the last port"),
        "{}",
        f.describe()
    );
}

#[test]
fn started_by_hand_it_is_a_world_of_one() {
    let f = Run::new::<[&str; 0], &str>([])
        .program(init_worker_bin())
        .env("ATLASBOOST_SIM", "8")
        .run();
    f.assert_code(0);
    assert!(
        f.err().contains("running as a world of one"),
        "{}",
        f.describe()
    );
    let r = f
        .out()
        .lines()
        .find_map(parse_report)
        .unwrap_or_else(|| panic!("no report: {}", f.describe()));
    check_job(&[r], 1, "Alone");
}

/// Library mode reading an hccn.conf that lists only devices 4-7: local rank 0 is NPU 4, and
/// `DEVICE_ID` says 4 (the driver's logical id on bare metal), not 0 (NPU 0, which the table
/// does not name).
#[test]
fn init_with_an_hccn_conf_of_devices_4_to_7_is_on_device_4() {
    let run = Run::new::<[&str; 0], &str>([]).program(init_worker_bin());
    let conf = run.file(
        "hccn.conf",
        (4..8)
            .map(|p| format!("address_{p}=192.168.100.{}\n", 101 + p))
            .collect::<String>(),
        false,
    );
    let f = run
        .env("ATLASBOOST_PROBE", "hccn")
        .env("ATLASBOOST_HCCN_CONF", &conf)
        .env("ASCEND_RT_VISIBLE_DEVICES", "")
        .env("ASCEND_VISIBLE_DEVICES", "")
        .run();
    f.assert_code(0);
    let r = f
        .out()
        .lines()
        .find_map(parse_report)
        .unwrap_or_else(|| panic!("no report: {}", f.describe()));
    assert_eq!((num(&r, "device"), num(&r, "physical")), (4, 4), "{r:?}");
    check_job(&[r], 1, "Alone");
}

#[test]
fn library_mode_names_the_variables_the_user_set_not_flags() {
    let f = Run::new::<[&str; 0], &str>([])
        .program(init_worker_bin())
        .env("ATLASBOOST_PROBE", "sim")
        .run();
    f.assert_code(1);
    let err = f.err();
    assert!(
        err.contains("ATLASBOOST_PROBE=sim needs ATLASBOOST_SIM"),
        "{}",
        f.describe()
    );
    assert!(!err.contains("--sim"), "no flag in library mode: {err}");
}

/// A value that is not UTF-8 is that variable's error, not taken for unset (which would pick
/// the defaults: the driver, this host's address).
#[test]
fn a_variable_that_is_not_utf8_is_named() {
    use std::os::unix::ffi::OsStrExt;
    let bad = std::ffi::OsStr::from_bytes(b"sim\xff");
    for (name, says) in [
        (
            "ATLASBOOST_PROBE",
            "ATLASBOOST_PROBE=sim\u{fffd}: expected auto",
        ),
        (
            "ATLASBOOST_SIM",
            "ATLASBOOST_SIM=sim\u{fffd}: expected a number",
        ),
        ("ATLASBOOST_SERVER_ID", "ATLASBOOST_SERVER_ID"),
    ] {
        let f = Run::new::<[&str; 0], &str>([])
            .program(init_worker_bin())
            .env("ATLASBOOST_SIM", "2")
            .env(name, bad)
            .run();
        f.assert_code(1);
        assert!(f.err().contains(says), "{name}: {}", f.describe());
    }
}

/// A host with no IPv4 address (a network namespace with only loopback) has no `server_id`:
/// library mode fails as the launcher does, each saying how to give one.
#[test]
fn a_host_without_an_ipv4_address_fails_library_mode_as_it_fails_the_launcher() {
    if std::process::Command::new("unshare")
        .args(["-n", "true"])
        .status()
        .map_or(true, |s| !s.success())
    {
        eprintln!("skipped: `unshare -n` (a new network namespace) is not permitted here");
        return;
    }
    let no_ipv4 = |program: &Path, args: &[&str]| {
        Run::new([std::ffi::OsStr::new("-n"), program.as_os_str()])
            .args(args)
            .program("unshare")
            .env("ATLASBOOST_SIM", "2")
            .run()
    };
    let library = no_ipv4(&init_worker_bin(), &[]);
    library.assert_code(1);
    let launcher = no_ipv4(&atlasboost_bin(), &["run", "--sim", "2", "--", "true"]);
    launcher.assert_code(125);
    let rule = "cannot find this host's IPv4 address";
    assert!(library.err().contains(rule), "{}", library.describe());
    assert!(launcher.err().contains(rule), "{}", launcher.describe());
    assert!(
        library.err().contains("set ATLASBOOST_SERVER_ID"),
        "{}",
        library.describe()
    );
    assert!(
        launcher.err().contains("pass -H"),
        "{}",
        launcher.describe()
    );
}

/// Plain `mpirun -np 4` on one host, nothing set: with MPI support the ranks meet over MPI;
/// without it over a Unix socket named after the mpirun job. Two jobs at once never meet each
/// other's ranks.
#[test]
fn plain_mpirun_on_one_host_needs_no_master_addr() {
    let Some(mpirun) = atlasboost_e2e::mpirun_or_skip() else {
        return;
    };
    let jobs: Vec<Launch> = (0..2)
        .map(|_| {
            let run = Run::new(["-np", "4"])
                .program(&mpirun)
                .args(atlasboost_e2e::MPIRUN_OPTIONS)
                .timeout(Duration::from_secs(90));
            let table = run.dir().join("rank_table.json");
            run.args(["-x", "ATLASBOOST_SIM=4", "-x"])
                .args([format!("ATLASBOOST_RANK_TABLE_FILE={}", table.display())])
                .args([init_worker_bin()])
                .spawn()
        })
        .collect();
    for job in jobs {
        check_mpi_job(&job.wait(), 4);
    }
}

/// An MPI launcher's job of `size` init-workers succeeded and agrees on one table; how they met
/// follows from how the worker was built (over MPI with MPI support, else over ZeroMQ).
fn check_mpi_job(f: &Finished, size: usize) {
    f.assert_code(0);
    let reports = reports(&f.out());
    assert!(!reports.is_empty(), "{}", f.describe());
    let via = if reports[0]["mpi"] == "yes" {
        "Mpi"
    } else {
        "Zmq"
    };
    check_job(&reports, size, via);
}

/// MPICH's `mpiexec` (Hydra) on one host, nothing set: Hydra names no job in its variables, so
/// the ranks find each other through their per-host proxy, also when a shell stands between.
/// Runs where `ATLASBOOST_E2E_MPICH` names an MPICH tree (`usr/bin/mpiexec.hydra` in it), as
/// scripts/test.sh extracts it from Debian's packages.
#[test]
fn plain_mpich_mpiexec_on_one_host_needs_no_master_addr() {
    let Some(root) = std::env::var_os("ATLASBOOST_E2E_MPICH").map(std::path::PathBuf::from) else {
        eprintln!(
            "plain_mpich_mpiexec_on_one_host_needs_no_master_addr: skipped: \
             ATLASBOOST_E2E_MPICH is not set (scripts/test.sh sets it)"
        );
        return;
    };
    let bin = root.join("usr/bin");
    // Debian's multiarch directory: usr/lib/x86_64-linux-gnu, usr/lib/aarch64-linux-gnu.
    let lib = std::fs::read_dir(root.join("usr/lib"))
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().ends_with("-linux-gnu"))
        .unwrap_or_else(|| panic!("no usr/lib/*-linux-gnu in {}", root.display()));
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for through_a_shell in [false, true] {
        let run = Run::new(["-np", "4"])
            .program(bin.join("mpiexec.hydra"))
            .env("PATH", &path)
            .env("LD_LIBRARY_PATH", &lib)
            .timeout(Duration::from_secs(90));
        let table = run.dir().join("rank_table.json");
        let run = run
            .args([
                "-env",
                "ATLASBOOST_SIM",
                "4",
                "-env",
                "ATLASBOOST_RANK_TABLE_FILE",
            ])
            .args([&table]);
        let f = if through_a_shell {
            // The shell stays between the proxy and the worker (no `exec`).
            run.args([
                "sh",
                "-c",
                &format!("{}; exit $?", init_worker_bin().display()),
            ])
            .run()
        } else {
            run.args([init_worker_bin()]).run()
        };
        check_mpi_job(&f, 4);
    }
}
