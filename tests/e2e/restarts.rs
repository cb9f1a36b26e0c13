//! Keeping a job alive (SPEC §12): restarts after a failed worker, re-planning around a dead
//! NPU under the 910 rules, the hang watchdog, and nothing left behind when the launcher is
//! killed in the middle of a restart.

use std::time::{Duration, Instant};

use atlasboost_e2e::{LAUNCH_MARK, Run, assert_no_process_with_env, wait_until};
use nix::sys::signal::Signal;

use crate::{events_of, lines_by_rank};

/// A worker that says its restart count and fails once, on rank 3, while `marker` is absent
/// (once every rank has said it: a bounded wait for their `up.*` files).
const FAILS_ONCE: &str = "echo \"attempt=$ATLASBOOST_RESTART_COUNT of=$ATLASBOOST_MAX_RESTARTS \
     size=$RANK_SIZE\"; touch up.$RANK.$ATLASBOOST_RESTART_COUNT; \
     if [ \"$RANK\" = 3 ] && [ ! -e marker ]; then \
         i=0; while [ $(ls up.*.0 | wc -l) -lt $RANK_SIZE ] && [ $i -lt 200 ]; do \
             sleep 0.05; i=$((i+1)); done; \
         touch marker; echo boom >&2; exit 1; fi";

#[test]
fn a_worker_that_fails_once_is_restarted_and_the_job_succeeds() {
    let r = Run::new([
        "run",
        "--sim",
        "4",
        "--max-restarts",
        "2",
        "--restart-delay",
        "0.1",
    ])
    .args(["--", "sh", "-c", FAILS_ONCE])
    .run();
    r.assert_code(0);
    let by_rank = lines_by_rank(&r.out(), "stdout");
    assert_eq!(by_rank.len(), 4, "{}", r.describe());
    for (rank, lines) in &by_rank {
        // Two attempts, the second seeing one restart so far.
        assert_eq!(
            lines,
            &["attempt=0 of=2 size=4", "attempt=1 of=2 size=4"],
            "rank {rank}\n{}",
            r.describe()
        );
    }
    let err = r.err();
    assert!(err.contains("2 attempts in"), "{err}");
    assert!(
        err.contains("attempt 0: 4 ranks on 1 server (1 × 4)")
            && err.contains("rank 3 (host 192.0.2.2, device 3) failed: exit 1"),
        "{err}"
    );
    assert!(
        err.contains("attempt 1: 4 ranks on 1 server (1 × 4)"),
        "{err}"
    );

    // --max-restarts 0: today's fail-fast, with the count in the environment.
    let r = Run::new(["run", "--sim", "4", "--", "sh", "-c", FAILS_ONCE]).run();
    r.assert_code(1);
    let by_rank = lines_by_rank(&r.out(), "stdout");
    assert!(
        by_rank.values().all(|l| l == &["attempt=0 of=0 size=4"]),
        "{}",
        r.describe()
    );
    assert!(!r.err().contains("attempt"), "{}", r.describe());
}

/// Four local simulated servers of 8; the worker on physical device 5 of the third fails once,
/// after marking that device unhealthy for the probe (`ATLASBOOST_SIM_FAULTS_FILE`).
fn dead_npu_job(min_np: &str) -> atlasboost_e2e::Finished {
    npu_fault_job(min_np, "unhealthy:5")
}

/// [`dead_npu_job`] with another fault of device 5 of the third server (`no-ip:5`, ...).
fn npu_fault_job(min_np: &str, fault: &str) -> atlasboost_e2e::Finished {
    let worker = format!(
        "echo \"size=$RANK_SIZE server=$ATLASBOOST_SERVER_ID\"; \
         if [ \"$ATLASBOOST_SERVER_ID\" = 127.0.0.3 ] && [ \"$ATLASBOOST_PHYSICAL_ID\" = 5 ] \
            && [ ! -e marker ]; then touch marker; echo 127.0.0.3/{fault} > faults; exit 1; fi"
    );
    let run = Run::new([
        "run",
        "--sim",
        "8",
        "-H",
        "127.0.0.1,127.0.0.2,127.0.0.3,127.0.0.4",
    ])
    .args([
        "--max-restarts",
        "1",
        "--restart-delay",
        "0",
        "--grace",
        "2",
    ])
    .args(["--min-np", min_np]);
    let faults = run.dir().join("faults");
    run.env("ATLASBOOST_SIM_FAULTS_FILE", faults)
        .args(["--", "sh", "-c", &worker])
        .timeout(Duration::from_secs(120))
        .run()
}

/// A worker that says its job's size and its server.
const SAY_SIZE_AND_SERVER: [&str; 4] = [
    "--",
    "sh",
    "-c",
    "echo size=$RANK_SIZE server=$ATLASBOOST_SERVER_ID",
];

/// An NPU without a RoCE address as the job starts, with `--min-np`: the first attempt starts
/// on the largest world a table of several servers allows, saying what it left out and why.
#[test]
fn an_npu_without_a_roce_address_at_the_start_is_planned_around_with_min_np() {
    let r = Run::new(["run", "--sim", "8", "-H", "127.0.0.1,127.0.0.2,127.0.0.3"])
        .args(["--max-restarts", "1", "--min-np", "8"])
        .env("ATLASBOOST_SIM_FAULTS", "127.0.0.2/no-ip:3")
        .args(SAY_SIZE_AND_SERVER)
        .timeout(Duration::from_secs(60))
        .run();
    r.assert_code(0).assert_err(
        &[
            "the job leaves out device 3 of host 127.0.0.2 (no RoCE address, which a table of \
             several servers needs), devices 0-2,4-7 of host 127.0.0.2 (usable, but not in the \
             largest valid world)",
            "16 ranks on 2 servers (2 × 8)",
        ],
        &[],
    );
    let out = r.out();
    assert_eq!(out.matches("size=16 ").count(), 16, "{}", r.describe());
    assert!(!out.contains("server=127.0.0.2"), "{}", r.describe());
}

/// [`npu_fault_job`] succeeded, its second attempt on 3 servers × 8 without 127.0.0.3.
fn assert_the_restart_ran_without_the_third_server(r: &atlasboost_e2e::Finished) {
    r.assert_code(0);
    let out = r.out();
    let second: Vec<&str> = out.lines().filter(|l| l.contains("size=24 ")).collect();
    assert_eq!(
        second.len(),
        24,
        "attempt 2 runs 3 servers × 8\n{}",
        r.describe()
    );
    assert!(
        !second.iter().any(|l| l.contains("server=127.0.0.3")),
        "the server with the broken NPU is left out\n{}",
        r.describe()
    );
}

/// An NPU whose RoCE port lost its address (a common failure): a table of several servers
/// cannot list it, so the restart leaves its server out as for a dead NPU, saying why, instead
/// of ending the job on the table's `missing-device-ip`.
#[test]
fn an_npu_that_lost_its_roce_address_costs_its_server_too() {
    let r = npu_fault_job("16", "no-ip:5");
    assert_the_restart_ran_without_the_third_server(&r);
    assert!(
        r.err().contains(
            "the restart leaves out device 5 of host 127.0.0.3 (no RoCE address, which a table \
             of several servers needs), devices 0-4,6-7 of host 127.0.0.3 (usable, but not in \
             the largest valid world)"
        ),
        "{}",
        r.describe()
    );
}

#[test]
fn a_dead_npu_costs_its_server_not_half_of_every_server() {
    let r = dead_npu_job("16");
    assert_the_restart_ran_without_the_third_server(&r);
    // (Not every rank of attempt 0 may have printed before the stop: the summary says.)
    let err = r.err();
    // What the restart left out, and why: the dead NPU, and its server's other seven.
    assert!(
        err.contains(
            "the restart leaves out device 5 of host 127.0.0.3 (critical (3)), devices \
             0-4,6-7 of host 127.0.0.3 (usable, but not in the largest valid world)"
        ),
        "{err}"
    );
    assert!(
        err.contains("attempt 0: 32 ranks on 4 servers (4 × 8)"),
        "{err}"
    );
    assert!(
        err.contains("attempt 1: 24 ranks on 3 servers (3 × 8)"),
        "{err}"
    );
    // The table the second attempt wrote passes the validator and has 24 ranks.
    let table = r.dir().join("rank_table.json");
    let v = Run::new(["validate".as_ref(), table.as_os_str()]).run();
    v.assert_code(0);
    let text = std::fs::read_to_string(&table).unwrap();
    assert_eq!(text.matches("\"rank_id\"").count(), 24, "{text}");
    assert!(!text.contains("127.0.0.3"), "{text}");
}

/// An NPU already unhealthy as the job starts: with `--min-np` the first attempt starts on the
/// largest valid world without it, saying what it left out (on the console and in the `table`
/// event); without, the job ends naming the device and how to go on (`--devices` would take
/// the device out of every host).
#[test]
fn an_npu_dead_at_the_start_is_planned_around_with_min_np() {
    let hosts = ["-H", "127.0.0.1,127.0.0.2,127.0.0.3,127.0.0.4"];
    let run = Run::new(["run", "--sim", "8"])
        .args(hosts)
        .args([
            "--max-restarts",
            "1",
            "--min-np",
            "24",
            "--events",
            "ev.jsonl",
        ])
        .env("ATLASBOOST_SIM_FAULTS", "127.0.0.3/unhealthy:5");
    let dir = run.dir().to_path_buf();
    let r = run
        .args(SAY_SIZE_AND_SERVER)
        .timeout(Duration::from_secs(60))
        .run();
    r.assert_code(0).assert_err(
        &[
            "the job leaves out device 5 of host 127.0.0.3 (critical (3)), devices 0-4,6-7 of \
             host 127.0.0.3 (usable, but not in the largest valid world)",
            "24 ranks on 3 servers (3 × 8)",
        ],
        &[],
    );
    let out = r.out();
    assert_eq!(out.matches("size=24 ").count(), 24, "{}", r.describe());
    assert!(!out.contains("server=127.0.0.3"), "{}", r.describe());
    let events = std::fs::read_to_string(dir.join("ev.jsonl")).unwrap();
    let table: serde_json::Value = events
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|e| e["event"] == "table")
        .unwrap();
    assert_eq!(
        table["left_out"].as_array().map(Vec::len),
        Some(2),
        "{events}"
    );
    // --ranks beyond the smaller world is a warning there, as after a restart, not an error.
    let r = Run::new(["run", "--sim", "8"])
        .args(hosts)
        .args(["--max-restarts", "1", "--min-np", "24", "--ranks", "20-31"])
        .env("ATLASBOOST_SIM_FAULTS", "127.0.0.3/unhealthy:5")
        .args(["--", "true"])
        .timeout(Duration::from_secs(60))
        .run();
    r.assert_code(0).assert_err(
        &["warning: --ranks 20-31: ranks 24-31 are not in this job of 24 ranks (0-23)"],
        &[],
    );

    let r = Run::new(["run", "--sim", "8"])
        .args(hosts)
        .env("ATLASBOOST_SIM_FAULTS", "127.0.0.3/unhealthy:5")
        .args(["--", "true"])
        .timeout(Duration::from_secs(60))
        .run();
    r.assert_code(125).assert_err(
        &[
            "error: device 5 of host 127.0.0.3 is critical (3); leave its host out, or let the \
           job start on the largest valid world without it (--max-restarts with --min-np)",
        ],
        &[],
    );
}

/// `--metrics` of a job planned around a dead NPU: the NPU stays in sight, unhealthy and with
/// no rank (an alert on its health does not end because the job left it out); the host's
/// NPUs are all counted; each worker's own use names its device.
#[test]
fn metrics_keep_a_dead_npu_left_out_of_the_job_in_sight() {
    let mut launch = Run::new(["run", "--sim", "8", "-H", "127.0.0.1"])
        .args([
            "--max-restarts",
            "1",
            "--min-np",
            "4",
            "--monitor-interval",
            "1",
        ])
        .args(["--metrics", "0", "--", "sh", "-c", "echo up; exec sleep 30"])
        .env("ATLASBOOST_SIM_FAULTS", "127.0.0.1/unhealthy:5")
        .timeout(Duration::from_secs(60))
        .spawn();
    let port = atlasboost_e2e::metrics_port(&mut launch);
    launch.wait_for_lines("<stdout>:up", 4, Duration::from_secs(30));
    let want = [
        "npu_chip_info_health_status{id=\"5\",model_name=\"Ascend910\",host=\"127.0.0.1\",job=",
        "machine_npu_nums{host=\"127.0.0.1\",job=",
        "atlasboost_rank_cpu_percent{rank=\"3\",host=\"127.0.0.1\",device=\"3\",job=",
    ];
    let mut text = String::new();
    let seen = wait_until(Duration::from_secs(20), || {
        text = atlasboost_e2e::scrape_metrics(&port);
        want.iter().all(|w| text.contains(w))
    });
    launch.signal(Signal::SIGTERM);
    let done = launch.wait_at_most(Duration::from_secs(30));
    assert!(
        seen,
        "{want:?} not all served:\n{text}\n{}",
        done.describe()
    );
    let value = |prefix: &str| {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .map(str::to_string)
    };
    assert_eq!(value(want[0]).as_deref(), Some("0"), "{text}");
    assert_eq!(value(want[1]).as_deref(), Some("8"), "{text}");
    // Devices of the job and the dead one: the idle healthy ones are not sampled.
    let sampled = text
        .lines()
        .filter(|l| l.starts_with("npu_chip_info_health_status{"))
        .count();
    assert_eq!(sampled, 5, "{text}");
}

/// A restart that leaves a whole host out because of one dead NPU (the 3 others cannot match
/// the 4 of the other host): that NPU's health stays served, as it does when its host keeps
/// other ranks.
#[test]
fn metrics_keep_a_dead_npu_in_sight_when_its_whole_host_is_left_out() {
    let worker = "if [ \"$ATLASBOOST_RESTART_COUNT\" = 0 ]; then \
                      if [ \"$RANK\" = 7 ]; then echo 127.0.0.2/unhealthy:3 > faults; exit 1; fi; \
                      exec sleep 30; fi; echo up; exec sleep 30";
    let run = Run::new(["run", "--sim", "4", "-H", "127.0.0.1,127.0.0.2"])
        .args([
            "--max-restarts",
            "1",
            "--min-np",
            "4",
            "--restart-delay",
            "0",
        ])
        .args(["--monitor-interval", "1", "--metrics", "0", "--grace", "2"])
        .args(["--", "sh", "-c", worker]);
    let faults = run.dir().join("faults");
    let mut launch = run
        .env("ATLASBOOST_SIM_FAULTS_FILE", faults)
        .timeout(Duration::from_secs(60))
        .spawn();
    let port = atlasboost_e2e::metrics_port(&mut launch);
    launch.wait_for_lines("<stdout>:up", 4, Duration::from_secs(30));
    let dead =
        "npu_chip_info_health_status{id=\"3\",model_name=\"Ascend910\",host=\"127.0.0.2\",job=";
    let mut text = String::new();
    let seen = wait_until(Duration::from_secs(20), || {
        text = atlasboost_e2e::scrape_metrics(&port);
        text.contains("atlasboost_attempt{") && text.contains(dead)
    });
    launch.signal(Signal::SIGTERM);
    let done = launch.wait_at_most(Duration::from_secs(30));
    assert!(seen, "{dead} not served:\n{text}\n{}", done.describe());
    assert!(
        done.err().contains("device 3 of host 127.0.0.2"),
        "the restart left host 127.0.0.2 out: {}",
        done.describe()
    );
    let health = text
        .lines()
        .find(|l| l.starts_with(dead))
        .and_then(|l| l.rsplit(' ').next());
    assert_eq!(health, Some("0"), "{text}");
}

/// `--metrics` during a restart's delay: every rank is down (the last sample of the failed
/// attempt said they ran), and no worker's use is served.
#[test]
fn metrics_say_every_rank_is_down_during_the_restart_delay() {
    let mut launch = Run::new(["run", "--sim", "2", "--max-restarts", "1"])
        .args([
            "--restart-delay",
            "20",
            "--monitor-interval",
            "1",
            "--metrics",
            "0",
        ])
        .args(["--", "sh", "-c", "echo up; sleep 1; exit 3"])
        .timeout(Duration::from_secs(60))
        .spawn();
    let port = atlasboost_e2e::metrics_port(&mut launch);
    launch.wait_for("the restart's delay", Duration::from_secs(30), |_, err| {
        err.contains("restarting every worker")
    });
    let down = |text: &str| {
        let up: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("atlasboost_rank_up{"))
            .collect();
        up.len() == 2 && up.iter().all(|l| l.ends_with(" 0"))
    };
    let text = atlasboost_e2e::scrape_metrics(&port);
    launch.signal(Signal::SIGTERM);
    let done = launch.wait_at_most(Duration::from_secs(30));
    assert!(
        down(&text) && !text.contains("atlasboost_rank_cpu_percent{"),
        "in the delay:\n{text}\n{}",
        done.describe()
    );
}

/// The ranks' own values are the launcher's and served fresh between two samples of the
/// hosts (every 60 s here): a rank that ended is down at once, and another's lines are
/// counted as it prints.
#[test]
fn metrics_say_a_rank_that_ended_is_down_before_the_next_sample() {
    let mut launch = Run::new(["run", "--sim", "2", "--metrics", "0"])
        .args(["--monitor-interval", "60", "--", "sh", "-c"])
        .args(["[ $RANK_ID = 1 ] && exit 0; i=0; while [ $i -lt 300 ]; do echo $i; sleep 0.1; i=$((i+1)); done"])
        .timeout(Duration::from_secs(90))
        .spawn();
    let port = atlasboost_e2e::metrics_port(&mut launch);
    let value = |text: &str, name: &str, rank: u32| -> Option<f64> {
        let prefix = format!("{name}{{rank=\"{rank}\",");
        text.lines()
            .find(|l| l.starts_with(&prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    };
    // Within 20 s, well inside the first 60 s interval: rank 1 down, rank 0's lines counted.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut text = String::new();
    let fresh = |text: &str| {
        value(text, "atlasboost_rank_up", 1) == Some(0.0)
            && value(text, "atlasboost_rank_up", 0) == Some(1.0)
            && value(text, "atlasboost_rank_output_lines_total", 0).is_some_and(|n| n >= 3.0)
            && value(text, "atlasboost_rank_last_output_seconds", 0).is_some_and(|s| s < 1.5)
    };
    while Instant::now() < deadline && !fresh(&text) {
        std::thread::sleep(Duration::from_millis(200));
        text = atlasboost_e2e::scrape_metrics(&port);
    }
    launch.signal(Signal::SIGTERM);
    let done = launch.wait_at_most(Duration::from_secs(30));
    assert!(fresh(&text), "within 20 s:\n{text}\n{}", done.describe());
}

/// A broken NPU that fails its own driver calls (not one that reports itself unhealthy) at a
/// restart: the real driver path (the fake DSMI library) reports it unreadable, and the
/// restart runs on the largest valid world without it, rather than without its whole server.
/// The fake driver (atlasboost-sim/fake-dsmi) built beside the binary under test.
fn fake_driver() -> std::path::PathBuf {
    let lib = atlasboost_e2e::atlasboost_bin().with_file_name("libdrvdsmi_host.so");
    assert!(
        lib.is_file(),
        "{} is missing: run `cargo build -p atlasboost-fake-dsmi` first",
        lib.display()
    );
    lib
}

#[test]
fn an_npu_whose_driver_calls_fail_at_a_restart_is_planned_around() {
    let lib = fake_driver();
    let worker = "if [ \"$ATLASBOOST_RESTART_COUNT\" = 0 ] && [ \"$RANK_ID\" = 5 ]; then \
                      echo fail:dsmi_get_device_health@5=13 > faults; exit 1; fi; \
                  echo size=$RANK_SIZE device=$ATLASBOOST_PHYSICAL_ID";
    let run = Run::new(["run", "--probe", "dsmi", "-H", "127.0.0.1"]).args([
        "--max-restarts",
        "1",
        "--restart-delay",
        "0",
        "--min-np",
        "4",
    ]);
    let faults = run.dir().join("faults");
    let r = run
        .env("ATLASBOOST_DSMI_LIB", &lib)
        .env("ATLASBOOST_FAKE_DSMI_FAULTS_FILE", faults)
        .args(["--", "sh", "-c", worker])
        .timeout(Duration::from_secs(60))
        .run();
    r.assert_code(0).assert_err(
        &[
            "the restart leaves out device 5 of host 127.0.0.1 (unreadable: \
             dsmi_get_device_health returned 13 (BUSY: the device is busy)), devices 4,6-7 of \
             host 127.0.0.1 (usable, but not in the largest valid world)",
            "attempt 1: 4 ranks on 1 server (1 × 4)",
        ],
        &[],
    );
    // The restart's ranks, each on its device (attempt 0's ran 8).
    let restarted: Vec<String> = lines_by_rank(&r.out(), "stdout")
        .into_iter()
        .flat_map(|(rank, lines)| lines.into_iter().map(move |l| format!("{rank}:{l}")))
        .filter(|l| l.contains("size=4 "))
        .collect();
    assert_eq!(
        restarted,
        [
            "0:size=4 device=0",
            "1:size=4 device=1",
            "2:size=4 device=2",
            "3:size=4 device=3"
        ],
        "{}",
        r.describe()
    );
}

#[test]
fn a_restart_that_would_shrink_below_min_np_ends_the_job_saying_why() {
    let r = dead_npu_job("32");
    r.assert_code(125);
    let err = r.err();
    assert!(
        err.contains("the largest valid world left is 24 ranks on 3 servers")
            && err.contains("device 5 of host 127.0.0.3")
            && err.contains("--min-np 32"),
        "{}",
        r.describe()
    );
    assert!(err.contains("attempt 1: no table"), "{err}");
}

/// 4 ranks of the shell `worker` with `--hang-timeout 2`: the job, ended by the watchdog.
fn hung_job_of_four(worker: &str) -> atlasboost_e2e::Finished {
    let r = Run::new(["run", "--sim", "4", "--hang-timeout", "2", "--grace", "1"])
        .args(["--", "sh", "-c", worker])
        .run();
    r.assert_code(124);
    r
}

#[test]
fn a_silent_rank_is_reported_as_hung_naming_it_while_the_others_progress() {
    let r = hung_job_of_four(
        "if [ \"$RANK\" = 2 ]; then echo going quiet; printf 'init HCCL...'; sleep 60; fi; \
         i=0; while [ $i -lt 300 ]; do echo tick $i; i=$((i+1)); sleep 0.1; done",
    );
    let err = r.err();
    // What it printed last, with no newline, is where it hangs: in the report too.
    assert!(
        err.contains("one rank is stuck while ranks 0-1, 3 still progress")
            && err.contains("rank 2 (host 192.0.2.2, device 2): no output and no heartbeat")
            && err.contains(
                "its last line: going quiet; on stdout, with no newline yet: init HCCL..."
            ),
        "{}",
        r.describe()
    );
    // Reported soon after the timeout (the watch looks every 0.25 s), well before the 30 s
    // the other ranks would print for.
    let ticks = r.out().lines().filter(|l| l.contains("tick")).count();
    assert!(ticks < 3 * 150, "{}", r.describe());
}

/// Ranks that print less often than half the timeout, but went on after the silent rank
/// stopped, are not stuck with it (they were named so, and the hang called one of every rank).
#[test]
fn ranks_that_went_on_after_the_silent_one_stopped_are_not_stuck_with_it() {
    let r = hung_job_of_four(
        "if [ \"$RANK\" = 1 ]; then echo going quiet; exec sleep 60; fi; \
         i=0; while [ $i -lt 50 ]; do echo step $i; i=$((i+1)); sleep 1.2; done",
    );
    let err = r.err();
    assert!(
        err.contains("one rank is stuck while ranks 0, 2-3 still progress")
            && err.contains("rank 1 (host 192.0.2.2, device 1): no output and no heartbeat")
            && !err.contains("rank 0 (host"),
        "{}",
        r.describe()
    );
}

/// A rank that prints without a newline (a row of dots) is progressing: no hang.
#[test]
fn a_rank_printing_part_of_a_line_is_not_hung() {
    let worker = "echo start; i=0; while [ $i -lt 12 ]; do printf .; i=$((i+1)); sleep 0.3; \
         done; echo ' done'";
    // 3.6 s of dots against a 2 s timeout: a stall of 1.7 s on a busy machine is no hang.
    let r = Run::new(["run", "--sim", "2", "--hang-timeout", "2", "--grace", "0.5"])
        .args(["--", "sh", "-c", worker])
        .run();
    r.assert_code(0);
    assert!(
        r.out().contains("<stdout>:............ done"),
        "{}",
        r.describe()
    );
}

#[test]
fn ranks_that_all_stop_together_are_reported_as_such() {
    // Ranks stopped within a quarter of the timeout of each other are stopped together: with
    // 4 s, the two ranks' `ready` may be seen 1 s apart on a busy machine.
    let r = Run::new(["run", "--sim", "2", "--hang-timeout", "4", "--grace", "0.5"])
        .args(["--", "sh", "-c", "echo ready; sleep 60"])
        .run();
    r.assert_code(124);
    assert!(
        r.err().contains("every rank stopped progressing together"),
        "{}",
        r.describe()
    );
    // One rank alone is not "every rank ... together".
    let r = Run::new(["run", "--sim", "1", "--hang-timeout", "1", "--grace", "0.5"])
        .args(["--", "sh", "-c", "echo ready; sleep 60"])
        .run();
    r.assert_code(124);
    assert!(
        r.err()
            .contains("the only rank still running stopped progressing:"),
        "{}",
        r.describe()
    );
}

/// A worker that ignores SIGTERM, so the stop phase lasts the whole grace time.
const STUBBORN: &str = "trap '' TERM; echo up; \
     if [ \"$RANK\" = 1 ] && [ ! -e marker ]; then touch marker; exit 1; fi; \
     i=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done";

#[test]
fn kill_9_of_the_launcher_in_a_restarts_stop_phase_leaves_nothing() {
    let mut launch = Run::new(["run", "--sim", "4", "--max-restarts", "3", "--grace", "30"])
        .args(["--", "sh", "-c", STUBBORN])
        .timeout(Duration::from_secs(60))
        .spawn();
    wait_for_the_stop(&mut launch);
    kill_9_leaves_nothing(launch, "while it stopped the workers for a restart");
}

/// Until the launcher says it stops the others after rank 1's failure (at most 30 s).
fn wait_for_the_stop(launch: &mut atlasboost_e2e::Launch) {
    launch.wait_for(
        "the stop after rank 1's failure",
        Duration::from_secs(30),
        |_, err| err.contains("stopping the other"),
    );
}

/// `kill -9` of the launcher: within 10 s, no process of the launch is left.
fn kill_9_leaves_nothing(launch: atlasboost_e2e::Launch, when: &str) {
    let mark = launch.mark().to_string();
    launch.signal(Signal::SIGKILL);
    let _ = launch.wait_at_most(Duration::from_secs(10));
    assert_no_process_with_env(
        LAUNCH_MARK,
        &mark,
        Duration::from_secs(10),
        &format!("kill -9 of the launcher {when}"),
    );
}

#[test]
fn kill_9_of_the_launcher_while_it_waits_to_restart_leaves_nothing() {
    let mut launch = Run::new(["run", "--sim", "4", "--max-restarts", "3"])
        .args(["--restart-delay", "20", "--grace", "1"])
        .args(["--", "sh", "-c", FAILS_ONCE])
        .timeout(Duration::from_secs(60))
        .spawn();
    launch.wait_for("the restart's delay", Duration::from_secs(30), |_, err| {
        err.contains("restarting every worker")
    });
    let mark = launch.mark().to_string();
    assert!(
        wait_until(Duration::from_secs(5), || {
            atlasboost_e2e::pids_with_env(LAUNCH_MARK, &mark).len() == 2
        }),
        "between attempts only the launcher and its lifeline are left: {:?}",
        atlasboost_e2e::pids_with_env(LAUNCH_MARK, &mark)
    );
    kill_9_leaves_nothing(launch, "between two attempts");
}

#[test]
fn ctrl_c_during_the_restart_delay_ends_the_job_without_a_restart() {
    let mut launch = Run::new(["run", "--sim", "2", "--max-restarts", "3"])
        .args(["--restart-delay", "20", "--", "sh", "-c"])
        .args(["echo attempt=$ATLASBOOST_RESTART_COUNT; exit 3"])
        .timeout(Duration::from_secs(60))
        .spawn();
    launch.wait_for("the restart's delay", Duration::from_secs(30), |_, err| {
        err.contains("restarting every worker")
    });
    // Some of the delay passes: it is no rank's run time in the summary.
    std::thread::sleep(Duration::from_millis(1500));
    launch.signal(Signal::SIGINT);
    let r = launch.wait_at_most(Duration::from_secs(10));
    r.assert_code(130);
    assert!(!r.out().contains("attempt=1"), "{}", r.describe());
    let ran = r
        .err()
        .lines()
        .find_map(|l| l.strip_prefix("atlasboost: 2 ranks finished in "))
        .and_then(|l| l.split(' ').next().and_then(|s| s.parse::<f64>().ok()))
        .unwrap_or_else(|| panic!("no summary's time:\n{}", r.describe()));
    let before_the_delay = r.elapsed.as_secs_f64() - 1.5;
    assert!(
        ran < before_the_delay,
        "the summary counts the delay: {ran} s of {:?}\n{}",
        r.elapsed,
        r.describe()
    );
    let err = r.err();
    let stopped = err
        .find("stopped by SIGINT before the restart")
        .unwrap_or_else(|| panic!("no word of the signal:\n{}", r.describe()));
    // The summary still comes, after it: the last attempt's ranks as they ended.
    let summary = err[stopped..]
        .find("atlasboost: 2 ranks finished in ")
        .unwrap_or_else(|| panic!("no summary after the signal:\n{}", r.describe()));
    let summary = &err[stopped + summary..];
    assert!(
        summary.contains(": 0 succeeded, ")
            && summary.lines().any(|l| {
                let words: Vec<&str> = l.split_whitespace().collect();
                // Either rank may fail first and have the other stopped.
                matches!(words.first(), Some(&("0" | "1")))
                    && words.windows(2).any(|w| w == ["exit", "3"])
            }),
        "{}",
        r.describe()
    );
    // The job's error is the signal that ended it, not the attempt's failure told before.
    assert_eq!(
        r.the_error_line("Ctrl-C in the delay"),
        "error: stopped by SIGINT; exit code 130",
        "{}",
        r.describe()
    );
}

/// A restart's probe can take as long as the driver retries (`TRY_AGAIN` right after a device
/// failed, up to 10 s): Ctrl-C meanwhile ends the job at once, and no worker of the restart
/// starts.
#[test]
fn ctrl_c_while_a_restart_probes_ends_the_job_before_its_workers_start() {
    let lib = fake_driver();
    // Attempt 0's rank 0 makes the driver answer TRY_AGAIN from now on, and fails.
    let worker = "echo attempt=$ATLASBOOST_RESTART_COUNT; \
                  if [ \"$ATLASBOOST_RESTART_COUNT\" = 0 ] && [ \"$RANK_ID\" = 0 ]; then \
                      echo try-again:dsmi_get_device_count=1000000 > faults; exit 1; fi; \
                  sleep 30";
    let run = Run::new(["run", "--probe", "dsmi", "--max-restarts", "1"]).args([
        "--restart-delay",
        "0",
        "--grace",
        "1",
        "--events",
        "events.jsonl",
    ]);
    let faults = run.dir().join("faults");
    let mut launch = run
        .env("ATLASBOOST_DSMI_LIB", &lib)
        .env("ATLASBOOST_FAKE_DSMI_DEVICES", "2")
        .env("ATLASBOOST_FAKE_DSMI_FAULTS_FILE", faults)
        .env("ATLASBOOST_DSMI_RETRY_SECS", "30")
        .args(["--", "sh", "-c", worker])
        .timeout(Duration::from_secs(60))
        .spawn();
    launch.wait_for("the restart", Duration::from_secs(30), |_, err| {
        err.contains("restarting every worker")
    });
    // Well into the probe's retries.
    std::thread::sleep(Duration::from_millis(1000));
    launch.signal(Signal::SIGINT);
    let signalled = launch.elapsed();
    let r = launch.wait_at_most(Duration::from_secs(20));
    r.assert_code(130).assert_err(
        &[
            "stopped by SIGINT while the hosts were joining",
            // The attempt that began is in the summary, and its end in the events.
            "attempt 1: no table, ",
            "s: stopped by SIGINT while the hosts were joining (exit code 130)",
        ],
        &[],
    );
    assert!(!r.out().contains("attempt=1"), "{}", r.describe());
    let ends = events_of(&r, "attempt_end");
    assert_eq!(ends.len(), 2, "{ends:?}");
    // At once, not after the driver's 30 s of retries.
    assert!(
        r.elapsed < signalled + Duration::from_secs(10),
        "{:?} after the signal\n{}",
        r.elapsed - signalled,
        r.describe()
    );
}

/// A driver call of the devices' telemetry that hangs (a wedged NPU) holds up nothing but the
/// devices' values: the workers' output flows, their ends are seen, the job ends on time, and
/// the stuck reading is named once.
#[test]
fn a_hung_telemetry_call_holds_up_neither_output_nor_the_end() {
    let lib = fake_driver();
    let r = Run::new(["run", "--probe", "dsmi", "--monitor-interval", "1"])
        .env("ATLASBOOST_DSMI_LIB", &lib)
        .env("ATLASBOOST_FAKE_DSMI_DEVICES", "2")
        .env(
            "ATLASBOOST_FAKE_DSMI_FAULTS",
            "hang:dsmi_get_device_temperature@0=120000",
        )
        // Long enough for the third sample (2 intervals after the first) on a loaded machine.
        .args(["--", "sh", "-c", "echo start; sleep 6; echo done"])
        .timeout(Duration::from_secs(60))
        .run();
    r.assert_code(0).assert_err(
        &["the device telemetry of host ", " has not come back for "],
        &[],
    );
    let out = r.out();
    assert!(
        out.contains("[0]<stdout>:done") && out.contains("[1]<stdout>:done"),
        "{}",
        r.describe()
    );
    // Not the driver's 120 s.
    assert!(r.elapsed < Duration::from_secs(30), "{}", r.describe());
}

/// `--hang-dump` without py-spy says why it took no stacks: the worker never called
/// `atlasboost.init()` (no stack file), or it did in a child of a wrapper (a shell) that does
/// not catch SIGUSR1 and is not sent it.
#[test]
fn a_hang_dump_without_stacks_says_why() {
    if ["/usr/bin/py-spy", "/bin/py-spy", "/usr/local/bin/py-spy"]
        .iter()
        .any(|p| std::path::Path::new(p).exists())
    {
        eprintln!("skipped: py-spy is installed system-wide, so stacks are always taken");
        return;
    }
    for (worker, says) in [
        (
            "echo ready; sleep 60",
            "the worker has not called atlasboost.init()",
        ),
        // The file init() creates, made by the shell itself.
        (
            ": > \"$ATLASBOOST_STACK_FILE\"; echo ready; sleep 60",
            "most likely the worker is a wrapper (a shell) around Python",
        ),
    ] {
        let r = Run::new([
            "run",
            "--sim",
            "1",
            "--hang-timeout",
            "2",
            "--hang-dump",
            "--grace",
            "1",
            "--",
            "sh",
            "-c",
            worker,
        ])
        .env("PATH", "/usr/bin:/bin")
        .timeout(Duration::from_secs(60))
        .run();
        r.assert_code(124)
            .assert_err(&["no stacks: py-spy is not installed", says], &[]);
    }
}

/// `--hang-dump` with ranks that went silent together: both are named as stuck (not one of
/// them "progressing"), each one's stacks are taken (a stand-in `py-spy` on PATH, slow as a
/// real one can be) and saved, and the job ends 124.
#[test]
fn a_hang_dump_takes_every_stuck_ranks_stacks_and_ends_124() {
    let run = Run::new([
        "run",
        "--sim",
        "2",
        "--hang-timeout",
        "2",
        "--hang-dump",
        "--grace",
        "1",
    ])
    .args([
        "--log-dir",
        "logs",
        "--",
        "sh",
        "-c",
        "echo ready; sleep 60",
    ]);
    let bin = run.dir().join("bin");
    let spied = run.dir().join("py-spy.log");
    run.file(
        "bin/py-spy",
        format!(
            "#!/bin/sh\necho start >> {log}\nsleep 1\necho end >> {log}\n\
             echo \"Thread 1 (idle): MainThread of $3\"\necho \"    wait_forever (train.py:7)\"\n",
            log = spied.display()
        ),
        true,
    );
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let r = run.env("PATH", path).timeout(Duration::from_secs(60)).run();
    r.assert_code(124);
    let err = r.err();
    assert!(
        err.contains("every rank stopped progressing together"),
        "{}",
        r.describe()
    );
    let stacks: Vec<_> = std::fs::read_dir(r.dir().join("logs"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir() && e.file_name() != "latest")
        .flat_map(|job| {
            std::fs::read_dir(job.path())
                .unwrap()
                .filter_map(|e| e.ok())
        })
        .filter(|e| e.file_name().to_string_lossy().ends_with(".stacks.txt"))
        .collect();
    assert_eq!(stacks.len(), 2, "{}", r.describe());
    for s in stacks {
        let text = std::fs::read_to_string(s.path()).unwrap();
        assert!(text.contains("wait_forever (train.py:7)"), "{text}");
    }
    assert!(
        err.contains("wait_forever"),
        "summarised on the console\n{}",
        r.describe()
    );
    // Both ranks' stacks were taken at the same time, not one after the other.
    assert_eq!(
        std::fs::read_to_string(&spied).unwrap(),
        "start\nstart\nend\nend\n",
        "{}",
        r.describe()
    );
}

/// Ctrl-C while a failed attempt's workers are being stopped (rank 0 ignores SIGTERM, so the
/// stop waits out its grace time): no restart follows, as for one during the restart delay.
/// The summary still names what the failed rank recorded (the error line is the signal's).
#[test]
fn ctrl_c_while_a_failed_attempt_stops_ends_the_job_without_a_restart() {
    let mut launch = Run::new(["run", "--sim", "2", "--max-restarts", "3"])
        .args(["--restart-delay", "0", "--grace", "30", "--", "sh", "-c"])
        .args(["echo attempt=$ATLASBOOST_RESTART_COUNT; trap '' TERM; \
             if [ \"$RANK\" = 1 ]; then \
                 printf '{\"message\": {\"message\": \"OSError: disk full\", \
                 \"extraInfo\": {\"timestamp\": \"1700000000\"}}}' > \"$ATLASBOOST_ERROR_FILE\"; \
                 exit 3; fi; \
             i=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done"])
        .timeout(Duration::from_secs(60))
        .spawn();
    wait_for_the_stop(&mut launch);
    launch.signal(Signal::SIGINT);
    let r = launch.wait_at_most(Duration::from_secs(10));
    r.assert_code(130).assert_err(
        &[
            "stopped by SIGINT before the restart",
            "    root cause: rank 1 recorded OSError: disk full",
        ],
        &["restart 1 of"],
    );
    assert!(!r.out().contains("attempt=1"), "{}", r.describe());
}

/// The same while a hung attempt's workers are being stopped: the Ctrl-C kills them at once
/// (it waited out the whole grace time), and no restart follows.
#[test]
fn ctrl_c_while_a_hung_attempt_stops_kills_at_once_without_a_restart() {
    let mut launch = Run::new(["run", "--sim", "2", "--max-restarts", "3"])
        .args([
            "--hang-timeout",
            "1",
            "--restart-delay",
            "0",
            "--grace",
            "30",
        ])
        .args(["--", "sh", "-c"])
        .args(["echo attempt=$ATLASBOOST_RESTART_COUNT; trap '' TERM; \
             i=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done"])
        .timeout(Duration::from_secs(60))
        .spawn();
    launch.wait_for(
        "the stop of the hung job",
        Duration::from_secs(30),
        |_, err| err.contains("workers of the hung job"),
    );
    launch.signal(Signal::SIGINT);
    let r = launch.wait_at_most(Duration::from_secs(10));
    r.assert_code(130).assert_err(
        &["got SIGINT while stopping the workers; killing them now"],
        &["restart 1 of"],
    );
    assert!(!r.out().contains("attempt=1"), "{}", r.describe());
}

/// A rank that the stop's SIGTERM ended is not the root cause, even with an error recorded
/// (one it caught and went on): the rank that failed first is, with its own stderr.
#[test]
fn a_rank_the_stop_ended_is_not_the_root_cause_whatever_it_recorded() {
    let r = Run::new(["run", "--sim", "2", "--", "sh", "-c"])
        .args([
            "if [ \"$RANK\" = 0 ]; then \
                 printf '{\"message\": {\"message\": \"RuntimeError: caught and handled\", \
                 \"extraInfo\": {\"timestamp\": \"%s\"}}}' $(date +%s) > \"$ATLASBOOST_ERROR_FILE\"; \
                 exec sleep 30; fi; \
             sleep 0.5; echo 'rank 1: peer went away' >&2; exit 2",
        ])
        .timeout(Duration::from_secs(60))
        .run();
    r.assert_code(2).assert_err(
        &[
            "error: rank 1 (host 192.0.2.2, device 1) failed first: exit 2",
            "[1]<stderr>:rank 1: peer went away",
        ],
        &["root cause"],
    );
}

/// A rank that recorded an error and then ended on its own terms when stopped (a SIGTERM
/// handler that exits 2) is the root cause; the error line still names the rank that failed
/// first, whose code is the job's, rather than call the stopped rank the first failure.
#[test]
fn the_root_cause_and_the_first_failure_are_named_apart() {
    let r = Run::new(["run", "--sim", "2", "-H", "127.0.0.1", "--", "bash", "-c"])
        .args([
            // Rank 1 gives up once rank 0 has recorded its error and set its trap.
            "trap 'exit 2' TERM; \
             if [ \"$RANK\" = 0 ]; then \
                 printf '{\"message\": {\"message\": \"ValueError: loss is NaN\", \
                 \"extraInfo\": {\"timestamp\": \"%s\"}}}' $(date +%s) > \"$ATLASBOOST_ERROR_FILE\"; \
                 touch recorded; sleep 30 & wait; fi; \
             i=0; while [ ! -e recorded ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; \
             echo 'rank 1 gives up' >&2; exit 1",
        ])
        .timeout(Duration::from_secs(60))
        .run();
    r.assert_code(1);
    let err = r.err();
    let error = &err[err
        .find("error: ")
        .unwrap_or_else(|| panic!("{}", r.describe()))..];
    let lines: Vec<&str> = error.lines().collect();
    assert!(
        lines.len() == 3
            && lines[0].starts_with(
                "error: rank 1 (host 127.0.0.1, device 1) failed first: exit 1 after "
            )
            && lines[1] == "  [1]<stderr>:rank 1 gives up"
            && lines[2] == "  root cause: rank 0 recorded ValueError: loss is NaN",
        "{}",
        r.describe()
    );
}

/// Records of the same whole second (torch's stamps) go to the rank that failed first, not
/// to the lowest rank; and a rank whose SIGTERM handler recorded the stop itself (stamped after
/// the stop began, or in the stop's own second to the whole second, as torch stamps) and
/// exited 1 is not the root cause of a rank that died without a record.
#[test]
fn the_root_cause_is_the_first_of_equal_records_and_never_the_stops_own_error() {
    // `record MESSAGE TIME` writes torch's error file.
    let record = "record() { printf '{\"message\": {\"message\": \"%s\", \
                  \"extraInfo\": {\"timestamp\": \"%s\"}}}' \"$1\" \"$2\" > \"$ATLASBOOST_ERROR_FILE\"; }";
    // Rank 0 says when its trap is set (else the stop's SIGTERM would kill it, a case the old
    // rule already left out); rank 1 waits for that (at most 30 s).
    let ready = "if [ \"$RANK\" = 0 ]; then touch trapped; else \
                 i=0; while [ ! -e trapped ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; fi";
    // Rank 1 fails first; rank 0 records its consequence in the same second when stopped.
    let same_second = format!(
        "{record}; trap 'record \"RuntimeError: peer rank 1 gone\" 1700000000; exit 2' TERM; {ready}; \
         if [ \"$RANK\" = 1 ]; then record \"ValueError: the real cause\" 1700000000; exit 1; fi; \
         sleep 30 & wait"
    );
    let run_bash = |script: &str| {
        Run::new([
            "run", "--sim", "2", "--grace", "5", "--", "bash", "-c", script,
        ])
        .timeout(Duration::from_secs(60))
        .run()
    };
    let r = run_bash(&same_second);
    r.assert_code(1).assert_err(
        &["root cause: rank 1 recorded ValueError: the real cause"],
        &["peer rank 1 gone"],
    );
    // Rank 1 dies without a record; rank 0's handler records the stop, stamped to the
    // nanosecond, and exits 1.
    let stopped = format!(
        "{record}; trap 'record \"RuntimeError: preempted by SIGTERM\" $(date +%s.%N); exit 1' TERM; \
         {ready}; if [ \"$RANK\" = 1 ]; then kill -SEGV $$; fi; sleep 30 & wait"
    );
    let r = run_bash(&stopped);
    r.assert_code(139).assert_err(
        &["rank 1 (host 192.0.2.2, device 1) failed first: SIGSEGV"],
        &["root cause"],
    );
    // The same, stamped as torch stamps: the whole second (the stop's own, or the next).
    let stopped_whole = stopped.replace("$(date +%s.%N)", "$(date +%s)");
    let r = run_bash(&stopped_whole);
    r.assert_code(139).assert_err(
        &["rank 1 (host 192.0.2.2, device 1) failed first: SIGSEGV"],
        &["root cause"],
    );
}

/// The summary keeps each earlier attempt's recorded root cause under its line (the console's
/// report of it has long scrolled away in a job of days), and `attempt_end` carries it.
#[test]
fn every_attempts_recorded_root_cause_is_in_the_summary_and_the_events() {
    let worker = "if [ \"$ATLASBOOST_RESTART_COUNT\" = 0 ] && [ \"$RANK\" = 1 ]; then \
                      printf '{\"message\": {\"message\": \"ValueError: attempt 0 diverged\", \
                      \"extraInfo\": {\"timestamp\": \"%s\"}}}' $(date +%s) > \"$ATLASBOOST_ERROR_FILE\"; \
                      exit 1; fi";
    let run = Run::new([
        "run",
        "--sim",
        "2",
        "--max-restarts",
        "1",
        "--restart-delay",
        "0",
    ])
    .args(["--events", "events.jsonl", "--", "sh", "-c", worker]);
    let r = run.timeout(Duration::from_secs(60)).run();
    r.assert_code(0).assert_err(
        &["(exit code 1)\n    root cause: rank 1 recorded ValueError: attempt 0 diverged\n  attempt 1:"],
        &[],
    );
    let ends = events_of(&r, "attempt_end");
    let causes: Vec<&serde_json::Value> = ends.iter().map(|e| &e["root_cause"]).collect();
    assert_eq!(
        causes,
        [
            &serde_json::json!("rank 1 recorded ValueError: attempt 0 diverged"),
            &serde_json::Value::Null
        ],
        "{ends:?}"
    );
}

/// A job whose every attempt fails ends with the last one's code, saying that no restart is
/// left (the summary lists every attempt).
#[test]
fn a_job_that_used_every_restart_says_so() {
    let r = Run::new([
        "run",
        "--sim",
        "2",
        "--max-restarts",
        "2",
        "--restart-delay",
        "0",
    ])
    .args(["--", "sh", "-c", "exit 3"])
    .timeout(Duration::from_secs(60))
    .run();
    r.assert_code(3).assert_err(
        &[
            "restarting every worker (2 of 2)",
            "atlasboost: no restart left (--max-restarts 2 used): the job ends",
            "attempt 2:",
        ],
        &[],
    );
    assert_eq!(
        r.err().matches("no restart left").count(),
        1,
        "{}",
        r.describe()
    );
}

/// A host whose probe fails at a restart is left out of it by name, on the console and in the
/// events; `--ranks` then names every rank the smaller job lacks; an attempt whose workers
/// cannot start keeps its table's layout in the summary.
#[test]
fn a_host_whose_probe_fails_at_a_restart_is_left_out_by_name() {
    let worker = "if [ \"$ATLASBOOST_RESTART_COUNT\" = 0 ] && [ \"$RANK\" = 5 ]; then \
                      echo 127.0.0.3/fail:driver gone > faults; exit 1; fi";
    let run = Run::new([
        "run",
        "--sim",
        "8",
        "-H",
        "127.0.0.1:2,127.0.0.2:2,127.0.0.3:2",
    ])
    .args(atlasboost_e2e::ONE_RESTART_DOWN_TO_2)
    .args(["--ranks", "3-5", "--events", "events.jsonl"]);
    let faults = run.dir().join("faults");
    let r = run
        .env("ATLASBOOST_SIM_FAULTS_FILE", faults)
        .args(["--", "sh", "-c", worker])
        .timeout(Duration::from_secs(60))
        .run();
    r.assert_code(0).assert_err(
        &[
            "leaving 127.0.0.3 out of the restart: its probe failed:",
            "driver gone",
            "attempt 1: 4 ranks on 2 servers (2 × 2)",
            "--ranks 3-5: ranks 4-5 are not in this job of 4 ranks (0-3)",
        ],
        &[],
    );
    let left_out = events_of(&r, "host_left_out");
    assert_eq!(left_out.len(), 1, "{left_out:?}");
    assert_eq!(left_out[0]["host"], "127.0.0.3", "{left_out:?}");
    assert!(
        left_out[0]["why"]
            .as_str()
            .is_some_and(|w| w.contains("driver gone")),
        "{left_out:?}"
    );
}

/// Every host's probe fails at the restart: no world is left. The job ends 125 saying so,
/// without sending the user to --min-np (nothing is left to shrink to), and each host left out
/// is in the events, as when the restart goes on without it.
#[test]
fn a_restart_whose_every_probe_fails_ends_naming_each_host_in_the_events() {
    let worker = "if [ \"$ATLASBOOST_RESTART_COUNT\" = 0 ] && [ \"$RANK\" = 0 ]; then \
                      printf '127.0.0.2/fail:driver gone\\n127.0.0.3/fail:driver gone\\n' \
                      > faults; exit 1; fi";
    let run = Run::new(["run", "--sim", "2", "-H", "127.0.0.2,127.0.0.3"])
        .args(["--max-restarts", "1", "--restart-delay", "0"])
        .args(["--events", "events.jsonl"]);
    let faults = run.dir().join("faults");
    let r = run
        .env("ATLASBOOST_SIM_FAULTS_FILE", faults)
        .args(["--", "sh", "-c", worker])
        .timeout(Duration::from_secs(60))
        .run();
    r.assert_code(125).assert_err(
        &["cannot restart: no valid world is left without host 127.0.0.2 (its probe failed: "],
        &["--min-np"],
    );
    let left_out = events_of(&r, "host_left_out");
    let hosts: Vec<&str> = left_out.iter().filter_map(|e| e["host"].as_str()).collect();
    assert_eq!(hosts, ["127.0.0.2", "127.0.0.3"], "{left_out:?}");
    assert!(
        left_out.iter().all(|e| e["why"]
            .as_str()
            .is_some_and(|w| w.starts_with("its probe failed: ") && w.contains("driver gone"))),
        "{left_out:?}"
    );
}

/// A restart whose command is gone (the worker deleted it): the attempt ends 127 before any
/// worker runs, and the summary still shows the table it had.
#[test]
fn an_attempt_whose_workers_cannot_start_keeps_its_layout() {
    let run = Run::new(["run", "--sim", "2", "--max-restarts", "2"]).args(["--restart-delay", "0"]);
    // Rank 0 deletes the script once rank 1 runs it (rank 1 waits for that before it fails,
    // so that neither is stopped first), both at most 10 s.
    let script = run.file(
        "vanish.sh",
        "#!/bin/sh\n\
         i=0\n\
         if [ \"$RANK\" = 1 ]; then\n\
           touch started.1\n\
           while [ -e \"$0\" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done\n\
         else\n\
           while [ ! -e started.1 ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done\n\
           rm -f \"$0\"\n\
         fi\n\
         exit 1\n",
        true,
    );
    let r = run
        .args(["--".as_ref(), script.as_os_str()])
        .timeout(Duration::from_secs(60))
        .run();
    r.assert_code(127)
        .assert_err(&["attempt 1: 2 ranks on 1 server (1 × 2)"], &["no table"]);
}

/// A hang that a restart follows: the attempt's line names the rank that was stuck.
#[test]
fn a_hung_attempt_names_its_stuck_rank() {
    let worker = "if [ \"$ATLASBOOST_RESTART_COUNT\" = 1 ]; then exit 0; fi; \
         if [ \"$RANK\" = 1 ]; then echo going quiet; exec sleep 60; fi; \
         i=0; while [ $i -lt 300 ]; do echo tick $i; i=$((i+1)); sleep 0.1; done";
    // (2 s: rank 0 would have to stall 1 s between its lines to be taken for stuck too.)
    let r = Run::new(["run", "--sim", "2", "--hang-timeout", "2", "--grace", "1"])
        .args(["--max-restarts", "1", "--restart-delay", "0"])
        .args(["--", "sh", "-c", worker])
        .timeout(Duration::from_secs(60))
        .run();
    r.assert_code(0)
        .assert_err(&["hung (--hang-timeout): rank 1 stuck"], &[]);
}
