//! Two jobs on one host never corrupt each other: a running job's rank table is its own (the
//! second job on the same path fails before any worker starts, naming the first), and
//! `--log-dir` gives each job a directory of its own.

use std::path::Path;
use std::time::Duration;

use atlasboost_e2e::{Finished, Launch, Run, free_port_pair, init_worker_bin, wait_until};
use nix::sys::signal::Signal;

use crate::library::{parse_report, torchrun_vars};

/// A worker that says its job, waits (bounded) for `release` in its directory, then counts the
/// ranks of the table it reads at that moment, as HCCL would read it late.
const WAIT_THEN_COUNT: &str = "echo job=$ATLASBOOST_JOB_ID; i=0; \
     while [ ! -e release ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; \
     echo ranks=$(grep -c '\"rank_id\"' \"$RANK_TABLE_FILE\")";

/// Job A: 4 ranks that hold on until `release` appears; returns it once every rank has said
/// its job, with the job's id.
fn start_job_a() -> (Launch, String) {
    let mut a = Run::new(["run", "-q", "--sim", "4", "--", "sh", "-c", WAIT_THEN_COUNT])
        .timeout(Duration::from_secs(90))
        .spawn();
    a.wait_for_lines("job=ab-", 4, Duration::from_secs(30));
    let out = String::from_utf8_lossy(&a.stdout()).into_owned();
    let job = out
        .lines()
        .find_map(|l| l.split_once("job=").map(|(_, j)| j.trim().to_string()))
        .unwrap_or_else(|| panic!("no job id in {out}"));
    (a, job)
}

/// Job B: 2 ranks in `dir` (with `extra` options) that count the ranks of the table they
/// read; asserts it ran and every rank read a 2-rank table.
fn job_b(dir: &str, extra: &[&str]) -> Finished {
    let b = Run::new(["run", "-q", "--sim", "2", "--wdir", dir])
        .args(extra)
        .args([
            "--",
            "sh",
            "-c",
            "echo ranks=$(grep -c '\"rank_id\"' \"$RANK_TABLE_FILE\")",
        ])
        .run();
    b.assert_code(0);
    assert_eq!(
        b.out().lines().filter(|l| l.ends_with("ranks=2")).count(),
        2,
        "{}",
        b.describe()
    );
    b
}

fn release(a: &Launch) {
    std::fs::write(a.dir().join("release"), "").unwrap();
}

/// Every rank of a finished job A read a table of its own 4 ranks.
fn assert_read_own_table(a: &Finished) {
    a.assert_code(0);
    let out = a.out();
    let counts: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split_once("ranks=").map(|(_, n)| n.trim()))
        .collect();
    assert_eq!(
        counts,
        ["4"; 4],
        "every rank of job A reads its own 4-rank table\n{}",
        a.describe()
    );
}

#[test]
fn a_second_job_on_a_running_jobs_table_fails_at_once_naming_it() {
    let (a, job_a) = start_job_a();
    let dir = a.dir().display().to_string();
    // Job B from the same directory: refused before any worker starts.
    let b = Run::new([
        "run",
        "-q",
        "--sim",
        "2",
        "--wdir",
        &dir,
        "--",
        "touch",
        "b-started",
    ])
    .run();
    b.assert_code(125);
    let err = b.err();
    assert!(err.contains(&format!("in use by job {job_a}")), "{err}");
    assert!(
        err.contains(&format!("pid {} ", a.pid())),
        "names A's pid: {err}"
    );
    assert!(err.contains("launched from "), "{err}");
    assert!(err.contains("--rank-table"), "says what to do: {err}");
    assert!(
        !a.dir().join("b-started").exists(),
        "no worker of job B started"
    );
    // With a table of its own, job B runs beside job A.
    let b = job_b(&dir, &["--rank-table", "b.json"]);
    assert!(!b.err().contains(&job_a), "{}", b.describe());
    assert!(
        !a.dir().join("b.json.lock").exists(),
        "a finished job's lock file is gone"
    );
    release(&a);
    let a = a.wait();
    assert_read_own_table(&a);
    assert!(
        !a.dir().join("rank_table.json.lock").exists(),
        "a finished job's lock file is gone"
    );
}

#[test]
fn kill_9_of_the_holder_leaves_no_stale_lock() {
    let (a, job_a) = start_job_a();
    let dir = a.dir().to_path_buf();
    a.signal(Signal::SIGKILL);
    let a = a.wait();
    assert_eq!(a.code(), None, "killed by SIGKILL: {}", a.describe());
    // The lock file may stay, with its dead holder's record; the lock does not.
    let b = job_b(&dir.display().to_string(), &[]);
    assert!(!b.err().contains(&job_a), "{}", b.describe());
}

#[test]
fn two_jobs_with_one_log_dir_keep_their_logs_apart() {
    let logs = tempfile::tempdir().unwrap();
    let logs_arg = logs.path().display().to_string();
    let script = "echo out-$ATLASBOOST_JOB_ID-$RANK_ID; echo err-$RANK_ID >&2; sleep 0.3";
    let start = || {
        Run::new([
            "run",
            "--sim",
            "2",
            "--log-dir",
            &logs_arg,
            "--",
            "sh",
            "-c",
            script,
        ])
        .spawn()
    };
    let (a, b) = (start(), start());
    let (a, b) = (a.wait(), b.wait());
    let mut jobs = Vec::new();
    for f in [&a, &b] {
        f.assert_code(0);
        let job = f
            .out()
            .lines()
            .find_map(|l| {
                l.split_once("out-")
                    .and_then(|(_, rest)| rest.rsplit_once('-'))
                    .map(|(j, _)| j.to_string())
            })
            .unwrap_or_else(|| panic!("no job id: {}", f.describe()));
        let dir = logs.path().join(&job);
        assert!(
            f.err().contains(&format!("logs: {}", dir.display())),
            "the summary prints the job's log directory: {}",
            f.describe()
        );
        for rank in 0..2 {
            let read = |name: &str| {
                std::fs::read_to_string(dir.join(format!("rank.{rank}")).join(name))
                    .unwrap_or_else(|e| panic!("rank {rank}'s {name} of {job}: {e}"))
            };
            assert_eq!(read("stdout.log"), format!("out-{job}-{rank}\n"));
            assert_eq!(read("stderr.log"), format!("err-{rank}\n"));
        }
        jobs.push(job);
    }
    assert_ne!(jobs[0], jobs[1]);
    let latest = std::fs::read_link(logs.path().join("latest")).unwrap();
    assert!(
        jobs.iter().any(|j| Path::new(j) == latest),
        "latest ({}) points at one of the jobs {jobs:?}",
        latest.display()
    );
}

#[test]
fn two_library_mode_jobs_on_one_table_the_second_is_refused_naming_the_first() {
    let hold = tempfile::tempdir().unwrap();
    let release_file = hold.path().join("release");
    let release_arg = release_file.display().to_string();
    let table = hold.path().join("rank_table.json");
    // A job of two processes (torchrun's variables), each starting `init()` and holding on.
    let job = |port: u16, hold: bool| -> Vec<Launch> {
        (0..2)
            .map(|rank| {
                let mut run = Run::new(if hold {
                    vec!["--hold-until", release_arg.as_str()]
                } else {
                    vec![]
                })
                .program(init_worker_bin())
                .timeout(Duration::from_secs(60))
                .env("ATLASBOOST_SIM", "8")
                .env("ATLASBOOST_RANK_TABLE_FILE", &table);
                for (k, v) in torchrun_vars(rank, 2, 2, port) {
                    run = run.env(k, v);
                }
                run.spawn()
            })
            .collect()
    };
    let port_a = free_port_pair();
    let mut a = job(port_a, true);
    for p in &mut a {
        p.wait_for_lines("rank=", 1, Duration::from_secs(30));
    }
    let before = std::fs::read(&table).unwrap();
    let port_b = free_port_pair();
    let b: Vec<Finished> = job(port_b, false).into_iter().map(Launch::wait).collect();
    let job_a = format!("job-127-0-0-1-{port_a}");
    for f in &b {
        assert_eq!(f.code(), Some(1), "{}", f.describe());
        let err = f.err();
        assert!(err.contains(&format!("in use by job {job_a}")), "{err}");
        assert!(err.contains("ATLASBOOST_RANK_TABLE_FILE"), "{err}");
        assert!(err.contains("on host 127.0.0.1"), "names the host: {err}");
    }
    assert_eq!(
        std::fs::read(&table).unwrap(),
        before,
        "job A's table is untouched"
    );
    std::fs::write(&release_file, "").unwrap();
    for p in a {
        let f = p.wait();
        f.assert_code(0);
        assert!(f.out().lines().any(|l| parse_report(l).is_some()));
    }
    // Once job A is over, the path is free.
    assert!(wait_until(Duration::from_secs(5), || !table
        .with_extension("json.lock")
        .exists()));
    let b: Vec<Finished> = job(free_port_pair(), false)
        .into_iter()
        .map(Launch::wait)
        .collect();
    for f in &b {
        f.assert_code(0);
    }
}
