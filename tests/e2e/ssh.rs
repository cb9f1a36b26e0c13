//! Remote hosts (SPEC: remote hosts): `atlasboost run` reaches every host that is not this
//! machine with the system `ssh` and runs `atlasboost agent` there.
//!
//! A real OpenSSH server ([`Sshd`], one per test) listens on 127.0.0.1-3, and
//! `ATLASBOOST_SSH_ALL_HOSTS=1` makes the launcher reach even this machine's own addresses over
//! ssh, as if 127.0.0.2 and 127.0.0.3 were two other machines; `ATLASBOOST_SSH_OPTIONS=-F
//! <ssh_config>` points ssh at the server and its key. "Remote" workers are then processes of
//! this machine, below the server, which the tests can see in `/proc`.
//!
//! Without OpenSSH (`/usr/sbin/sshd`, `ssh`, `ssh-keygen`) each test says that it skips, on
//! the real stderr, and passes having tested nothing; `ATLASBOOST_E2E_REQUIRE_SSHD=1` makes
//! that a failure.
//!
//! Not tested here: a job of local *and* remote hosts. With `ATLASBOOST_SSH_ALL_HOSTS=1` every
//! host is remote, and without it every 127.0.0.x is local; a second machine (or network
//! namespace) would be needed.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use atlasboost_e2e::{
    Finished, LAUNCH_MARK, Launch, ProcStat, Run, Sshd, assert_no_process_with_env, atlasboost_bin,
    cmdline, descendants, example, kill_marked, pids_with_env, proc_stat, unique, wait_until,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::cluster::{REPORTER, check_two_hosts, s};
use crate::output::check_bulk_lines;

/// The variable (`-x`) that marks every worker of a test, and so everything they start.
const MARK: &str = "ATLASBOOST_E2E_MARK";

/// Two "remote" hosts of four devices each (with `--sim 4`).
const TWO_BY_FOUR: &str = "127.0.0.2:4,127.0.0.3:4";

/// Two "remote" hosts of two devices each (with `--sim 2`).
const TWO_BY_TWO: &str = "127.0.0.2:2,127.0.0.3:2";

/// The worker of the tests where none may run.
const RAN: [&str; 4] = ["--", "sh", "-c", "echo WORKER-RAN"];

/// A Python worker that says `ready` and sleeps a minute: SIGINT ends it with
/// KeyboardInterrupt.
const SLEEPER: &str = "import time\nprint('ready', flush=True)\ntime.sleep(60)\n";

/// Starts this test's sshd, or returns from the test (which then passes) when OpenSSH is not
/// installed; [`Sshd::start`] has said so loudly.
macro_rules! sshd_or_skip {
    () => {
        match Sshd::start() {
            Some(sshd) => sshd,
            None => return,
        }
    };
}

/// How most tests here start: this test's sshd (or the skip of [`sshd_or_skip`]), a marker
/// unique to the test (`prefix`) for its job's processes, and their [`Cleanup`] when it ends.
macro_rules! ssh_test {
    ($prefix:literal) => {{
        let sshd = sshd_or_skip!();
        let mark = unique($prefix);
        let cleanup = Cleanup(mark.clone());
        (sshd, mark, cleanup)
    }};
}

/// Kills whatever is left with the marker when a test ends, passing or not.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        kill_marked(MARK, &self.0);
    }
}

/// `atlasboost run ARGS -x MARK=mark`, reaching every host with ssh through `sshd`.
fn over_ssh(sshd: &Sshd, mark: &str, args: &[&str]) -> Run {
    over_ssh_with(&sshd.ssh_config(), mark, args)
}

/// [`over_ssh`] with another client configuration.
fn over_ssh_with(ssh_config: &Path, mark: &str, args: &[&str]) -> Run {
    let config = ssh_config.display().to_string();
    assert!(
        !config.contains(char::is_whitespace),
        "ATLASBOOST_SSH_OPTIONS is split at whitespace: {config}"
    );
    // `scripts/test.sh` runs these tests a second time with the launch tree a chain
    // (`--fanout 1`): every host is started by the one before it.
    let fanout = std::env::var("ATLASBOOST_E2E_FANOUT")
        .ok()
        .filter(|_| !args.contains(&"--fanout"));
    Run::new(["run"])
        .args(fanout.iter().flat_map(|k| ["--fanout", k.as_str()]))
        .args(args)
        .args(["-x", &format!("{MARK}={mark}")])
        .env("ATLASBOOST_SSH_ALL_HOSTS", "1")
        .env("ATLASBOOST_SSH_OPTIONS", format!("-F {config}"))
}

/// The end of the server's log, for messages.
fn sshd_log(sshd: &Sshd) -> String {
    let log = sshd.log();
    let start = log.len().saturating_sub(3000);
    let start = (start..=log.len())
        .find(|&i| log.is_char_boundary(i))
        .unwrap_or(log.len());
    format!("--- sshd log ---\n{}", &log[start..])
}

/// Everything about a finished run, and the server's log.
fn ctx(r: &Finished, sshd: &Sshd) -> String {
    format!("{}\n{}", r.describe(), sshd_log(sshd))
}

/// The job succeeded, and each of its four workers printed a line ending with `ending`.
fn assert_all_four_said(r: &Finished, ctx: &str, ending: &str) {
    assert_eq!(r.code(), Some(0), "the job succeeded\n{ctx}");
    assert_eq!(
        r.out().lines().filter(|l| l.ends_with(ending)).count(),
        4,
        "every worker said {ending:?}\n{ctx}"
    );
}

/// The launcher binary's path as the launcher sees itself (`/proc/self/exe`): the default
/// remote path.
fn bin() -> String {
    let b = atlasboost_bin();
    b.canonicalize().unwrap_or(b).display().to_string()
}

/// The `atlasboost agent` processes that run the workers marked `mark`: the workers'
/// parents whose command line is `<bin> agent`.
fn agents_of(mark: &str) -> BTreeSet<i32> {
    let bin = bin();
    pids_with_env(MARK, mark)
        .iter()
        .map(|p| p.ppid)
        .filter(|&pid| cmdline(pid).is_some_and(|c| c == [bin.as_str(), "agent"]))
        .collect()
}

/// Waits (at most 10 s) until `n` processes have the marker: every worker and grandchild.
fn wait_for_processes(mark: &str, n: usize) -> Vec<ProcStat> {
    let mut procs = Vec::new();
    let all_up = wait_until(Duration::from_secs(10), || {
        procs = pids_with_env(MARK, mark);
        procs.len() >= n
    });
    assert!(all_up, "expected {n} marked processes, found {procs:#?}");
    procs
}

/// Waits up to `timeout` until none of `agents` is still an `atlasboost agent`.
///
/// # Panics
///
/// When one is, listing them (and killing them).
fn assert_agents_gone(agents: &BTreeSet<i32>, timeout: Duration, context: &str) {
    let bin = bin();
    let live = || -> Vec<i32> {
        agents
            .iter()
            .copied()
            .filter(|&pid| {
                proc_stat(pid).is_some_and(|p| p.alive())
                    && cmdline(pid).is_some_and(|c| c == [bin.as_str(), "agent"])
            })
            .collect()
    };
    if wait_until(timeout, || live().is_empty()) {
        return;
    }
    let left = live();
    for &pid in &left {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
    panic!("{context}: {timeout:?} later, agents {left:?} still run");
}

/// Everything of the job is gone within `timeout`: the marked workers and their children, the
/// agents, every ssh session's processes.
fn assert_job_gone(
    sshd: &Sshd,
    mark: &str,
    agents: &BTreeSet<i32>,
    timeout: Duration,
    context: &str,
) {
    let start = Instant::now();
    assert_no_process_with_env(MARK, mark, timeout, context);
    let left = || timeout.saturating_sub(start.elapsed());
    assert_agents_gone(agents, left(), context);
    sshd.assert_no_sessions(left(), context);
}

/// The one error of a run that failed with 125 because of host `127.0.0.2` or `127.0.0.3`
/// (or both: then one line each, below a first that counts them), before any worker ran; it
/// must contain every one of `culprits`. Returns the error, its lines joined.
fn assert_host_error(r: &Finished, sshd: &Sshd, culprits: &[&str]) -> String {
    let ctx = ctx(r, sshd);
    assert_eq!(r.code(), Some(125), "expected exit code 125\n{ctx}");
    assert_eq!(r.error_lines().len(), 1, "exactly one `error:` line\n{ctx}");
    let err = r.err();
    let error: Vec<&str> = err
        .lines()
        .skip_while(|l| !l.starts_with("error: "))
        .take_while(|l| l.starts_with("error: ") || l.starts_with("  "))
        .collect();
    let hosts: Vec<&str> = error
        .iter()
        .map(|l| l.trim_start_matches("error: ").trim_start())
        .filter(|l| l.starts_with("host 127.0.0.2: ") || l.starts_with("host 127.0.0.3: "))
        .collect();
    let first_counts = error[0] == "error: 2 hosts were lost while the hosts joined:"
        || error[0] == "error: 2 hosts failed as the hosts joined:";
    assert!(
        hosts.len() == 1 && error.len() == 1 || hosts.len() == 2 && first_counts,
        "the error names the host, or both: {error:?}\n{ctx}"
    );
    for line in &hosts {
        for c in culprits {
            assert!(line.contains(c), "the error says {c:?}: {line}\n{ctx}");
        }
    }
    assert!(!r.out().contains("WORKER-RAN"), "no worker may run\n{ctx}");
    error.join("\n")
}

/// The Python interpreter itself, not a wrapper that changes PATH before it runs it (pyenv's
/// shims prepend their directories): for the test that compares PATH.
fn python() -> String {
    let out = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .unwrap();
    assert!(out.status.success(), "python3 -c: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Every `len`-digit (or longer) run of hex digits in `bytes`.
fn hex_runs(bytes: &[u8], len: usize) -> Vec<String> {
    bytes
        .split(|b| !b.is_ascii_hexdigit())
        .filter(|run| run.len() >= len)
        .map(|run| String::from_utf8_lossy(run).into_owned())
        .collect()
}

#[test]
fn two_remote_hosts_get_the_table_the_environment_and_the_forwarded_variables() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-cluster");
    let (x, fwd) = (unique("x"), unique("fwd"));
    let path = format!(
        "/nonexistent-{}:{}",
        unique("path"),
        std::env::var("PATH").unwrap_or_default()
    );
    let (ld, py) = (
        format!("/nonexistent-{}", unique("ld")),
        format!("/nonexistent-{}", unique("py")),
    );
    let run = over_ssh(
        &sshd,
        &mark,
        &["--sim", "4", "-H", TWO_BY_FOUR, "--grace", "1"],
    );
    let script = run.file("report.py", REPORTER, false);
    let r = run
        .args(["-x", &format!("ATLASBOOST_E2E_X={x}")])
        .args([
            "-x",
            "ATLASBOOST_E2E_EQ=a=b",
            "-x",
            "HCCL_E2E_OVERRIDE=from-x",
        ])
        .args(["-x", "E2E_BY_NAME"])
        .env("ATLASBOOST_E2E_FWD", &fwd)
        .env("HCCL_E2E_X", "y")
        .env("HCCL_E2E_OVERRIDE", "from-env")
        .env("E2E_UNRELATED", "z")
        .env("E2E_BY_NAME", "by-name")
        .env("PATH", &path)
        .env("LD_LIBRARY_PATH", &ld)
        .env("PYTHONPATH", &py)
        .args(["--", &python()])
        .args([&script])
        .run();
    let ctx = ctx(&r, &sshd);
    assert_eq!(r.code(), Some(0), "{ctx}");
    // The same checks as for two local hosts: the table on disk (written by both agents, in
    // the launcher's directory, which is the same file system here), RANK_ID, DEVICE_ID, ...
    let got = check_two_hosts(&r, ["127.0.0.2", "127.0.0.3"], &x);
    for (rank, v) in &got {
        let var = |name: &str| v["env"][name].as_str().map(str::to_string);
        assert_eq!(
            s(v, "ATLASBOOST_E2E_FWD"),
            fwd,
            "rank {rank}: ATLASBOOST_* of the launcher's environment is forwarded: {v}"
        );
        assert_eq!(
            s(v, "HCCL_E2E_X"),
            "y",
            "rank {rank}: HCCL_* is forwarded: {v}"
        );
        assert_eq!(
            s(v, "HCCL_E2E_OVERRIDE"),
            "from-x",
            "rank {rank}: -x wins over a forwarded variable: {v}"
        );
        assert_eq!(
            s(v, "E2E_BY_NAME"),
            "by-name",
            "rank {rank}: -x NAME takes the launcher's value: {v}"
        );
        assert_eq!(s(v, "PATH"), path, "rank {rank}: PATH is forwarded: {v}");
        assert_eq!(s(v, "LD_LIBRARY_PATH"), ld, "rank {rank}: {v}");
        assert_eq!(s(v, "PYTHONPATH"), py, "rank {rank}: {v}");
        assert_eq!(
            var("E2E_UNRELATED"),
            None,
            "rank {rank}: a variable outside the forwarded names and prefixes stays behind: {v}"
        );
    }
    assert_job_gone(
        &sshd,
        &mark,
        &BTreeSet::new(),
        Duration::from_secs(3),
        "after the job",
    );
}

/// While a remote job runs, neither `ps` nor `/proc/*/cmdline` shows the job's secret (64 hex
/// digits): the agent's command line is `<bin> agent`, the rest comes on its stdin.
#[test]
fn the_secret_is_on_no_command_line_and_the_agent_is_just_bin_agent() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-secret");
    let mut launch = over_ssh(
        &sshd,
        &mark,
        &["--sim", "2", "-H", TWO_BY_TWO, "--grace", "1"],
    )
    .args(["--", "sh", "-c", "echo ready; exec sleep 60"])
    .timeout(Duration::from_secs(60))
    .spawn();
    launch.wait_for_lines("]<stdout>:ready", 4, Duration::from_secs(20));
    wait_for_processes(&mark, 4);
    let bin = bin();
    let agents = agents_of(&mark);
    assert_eq!(
        agents.len(),
        2,
        "every worker's parent is one of two `{bin} agent` processes: {:#?}",
        pids_with_env(MARK, &mark)
            .iter()
            .map(|p| (p.pid, p.ppid, cmdline(p.ppid)))
            .collect::<Vec<_>>()
    );

    // The job's processes: the launcher and what it started (ssh, the lifeline), everything
    // the server runs (sessions, agents, their lifelines, workers).
    let launcher = launch.pid();
    let mut job: Vec<ProcStat> = descendants(launcher);
    job.extend(proc_stat(launcher));
    job.extend(sshd.sessions());
    let clients: Vec<Vec<String>> = job
        .iter()
        .filter(|p| p.comm == "ssh")
        .filter_map(|p| cmdline(p.pid))
        .collect();
    assert_eq!(clients.len(), 2, "one ssh per host: {clients:#?}");
    // The launch tree: the launcher opens at most --fanout sessions, an agent the rest.
    let fanout: usize = std::env::var("ATLASBOOST_E2E_FANOUT").map_or(32, |k| k.parse().unwrap());
    let from_launcher = job
        .iter()
        .filter(|p| p.ppid == launcher && p.comm == "ssh")
        .count();
    assert_eq!(from_launcher, fanout.min(2), "{job:#?}");
    let remote_command = format!("exec '{bin}' agent");
    let mut hosts = BTreeSet::new();
    for c in &clients {
        let tail = &c[c.len().saturating_sub(3)..];
        assert!(
            tail.len() == 3 && tail[0] == "--" && tail[2] == remote_command,
            "ssh's command line ends with `-- HOST {remote_command}`: {c:?}"
        );
        hosts.insert(tail[1].clone());
    }
    assert_eq!(
        hosts,
        BTreeSet::from(["127.0.0.2".to_string(), "127.0.0.3".to_string()])
    );

    let mut on_command_lines = Vec::new();
    let mut in_environments = Vec::new();
    let own_env: String = std::env::vars_os()
        .map(|(k, v)| format!("{}={}\n", k.to_string_lossy(), v.to_string_lossy()))
        .collect();
    for p in &job {
        let args = cmdline(p.pid).unwrap_or_default();
        for run in hex_runs(args.join(" ").as_bytes(), 64) {
            on_command_lines.push(format!("pid {} {args:?}: {run}", p.pid));
        }
        let environ = std::fs::read(format!("/proc/{}/environ", p.pid)).unwrap_or_default();
        for run in hex_runs(&environ, 64) {
            if !own_env.contains(&run) {
                in_environments.push(format!("pid {} {args:?}: {run}", p.pid));
            }
        }
    }
    assert!(
        job.len() >= 2 + 2 + 4,
        "the job's processes were found: {job:#?}"
    );
    assert!(
        on_command_lines.is_empty(),
        "64 hex digits (the job's secret?) on command lines: {on_command_lines:#?}"
    );
    assert!(
        in_environments.is_empty(),
        "64 hex digits (the job's secret?) in environments: {in_environments:#?}"
    );

    launch.signal(Signal::SIGTERM);
    let r = launch.wait_at_most(Duration::from_secs(20));
    assert_eq!(r.code(), Some(143), "{}", ctx(&r, &sshd));
    assert_job_gone(
        &sshd,
        &mark,
        &agents,
        Duration::from_secs(3),
        "after SIGTERM",
    );
}

/// The workers' output crosses ssh framed: every line once, whole, in order, tagged with its
/// rank, on its stream.
#[test]
fn remote_output_arrives_whole_once_in_order_and_tagged() {
    const LINES: u64 = 20_000;
    let (sshd, mark, _cleanup) = ssh_test!("ssh-output");
    let script = format!(
        r#"
import os, sys
r = os.environ["RANK_ID"]
for i in range({LINES}):
    sys.stdout.write(f"rank {{r}} line {{i}}\n")
    sys.stderr.write(f"rank {{r}} err {{i}}\n")
"#
    );
    let r = over_ssh(&sshd, &mark, &["--sim", "2", "-H", TWO_BY_TWO])
        .args(["--", "python3", "-c", &script])
        .timeout(Duration::from_secs(60))
        .run();
    let ctx = ctx(&r, &sshd);
    assert_eq!(r.code(), Some(0), "{ctx}");
    check_bulk_lines(&r, &r.out(), "stdout", "line", 4, false, LINES);
    check_bulk_lines(&r, &r.err(), "stderr", "err", 4, true, LINES);
    sshd.assert_no_sessions(Duration::from_secs(3), "after the job");
}

/// A console read only after longer than an agent may go unheard (4 s), over real ssh: the
/// launcher stops reading its sessions, ssh's flow control stops the agents' writes, and the
/// agents hold their workers' output back, hearing the launcher's heartbeats on the other
/// direction of the same sessions. The job finishes and every line arrives, in order.
#[test]
fn remote_hosts_wait_for_a_console_read_late() {
    // More than ssh's channel window (2 MiB), its buffers and the pipes hold: 7 MB a host.
    const LINES: u32 = 1_000_000;
    let (sshd, mark, _cleanup) = ssh_test!("ssh-late-console");
    let r = over_ssh(
        &sshd,
        &mark,
        &["--sim", "1", "-H", "127.0.0.2:1,127.0.0.3:1"],
    )
    .args(["--", "seq", "1", &LINES.to_string()])
    .nonblocking_stdout(Duration::from_secs(7))
    .timeout(Duration::from_secs(60))
    .run();
    let ctx = ctx(&r, &sshd);
    assert_eq!(r.code(), Some(0), "{ctx}");
    crate::assert_seq_by_rank(&r.out(), 2, LINES, &ctx);
}

/// A line longer than 1 MiB is passed on in pieces of 1 MiB (SPEC: output), from a remote
/// worker as from a local one. Written so that the agent has read 1 MiB - 1 bytes of it when
/// the rest comes, with the newline, in one read: the piece must still be cut at 1 MiB (and
/// fit in the channel's frames, whose payload is at most 1 MiB + 4 KiB).
#[test]
fn a_remote_line_longer_than_1_mib_comes_in_1_mib_pieces() {
    const PIECE: usize = 1 << 20;
    let (sshd, mark, _cleanup) = ssh_test!("ssh-long-line");
    let script = format!(
        r#"
import sys, time
sys.stdout.write("y" * ({PIECE} - 1)); sys.stdout.flush()
time.sleep(0.5)
sys.stdout.write("y" * 60000 + "\n"); sys.stdout.flush()
sys.stdout.write("y" * (2 * {PIECE} + 5) + "\n"); sys.stdout.flush()
print("after", flush=True)
"#
    );
    let r = over_ssh(&sshd, &mark, &["--sim", "1", "-H", "127.0.0.2:1"])
        .args(["--", "python3", "-c", &script])
        .timeout(Duration::from_secs(60))
        .run();
    let lines = crate::rank_lines(&r.out(), 0, "stdout");
    let shape: Vec<String> = lines
        .iter()
        .map(|l| {
            if !l.is_empty() && l.bytes().all(|b| b == b'y') {
                format!("{} y", l.len())
            } else {
                l.clone()
            }
        })
        .collect();
    let lost = r.error_lines();
    assert_eq!(
        r.code(),
        Some(0),
        "the job failed: {lost:?}
rank 0's lines: {shape:?}"
    );
    assert_eq!(
        shape,
        [
            format!("{PIECE} y"),
            "59999 y".to_string(),
            format!("{PIECE} y"),
            format!("{PIECE} y"),
            "5 y".to_string(),
            "after".to_string()
        ],
        "{}",
        ctx(&r, &sshd)
    );
}

#[test]
fn a_failing_remote_rank_gives_its_exit_code_and_stops_every_host() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-fail");
    let train = example("train.py");
    // 300 steps of 0.1 s: the other ranks would run 30 s if they were not stopped.
    let r = over_ssh(
        &sshd,
        &mark,
        &["--sim", "4", "-H", TWO_BY_FOUR, "--grace", "5"],
    )
    .args(["--", "python3"])
    .args([train.as_os_str()])
    .args(["--fail-rank", "5", "--exit-code", "7"])
    .args(["--steps", "300", "--sleep", "0.1"])
    .timeout(Duration::from_secs(60))
    .run();
    let ctx = ctx(&r, &sshd);
    assert_eq!(r.code(), Some(7), "rank 5's exit code\n{ctx}");
    assert!(
        r.elapsed < Duration::from_secs(15),
        "the other ranks (30 s of steps) were not stopped: the run took {:?}\n{ctx}",
        r.elapsed
    );
    let error = r.the_error_line(&ctx);
    assert!(
        error.starts_with("error: rank 5 (host 127.0.0.3, device 1) failed first: exit 7"),
        "the error names rank 5, its host and device: {}\n{ctx}",
        error
    );
    let err = r.err();
    let report = &err[err.find(&error).unwrap_or(0)..];
    assert!(
        report.contains("rank 5: failing on purpose (--fail-rank) at step 2"),
        "the error shows rank 5's last stderr line\n{ctx}"
    );
    // None but rank 5 got to the end on its own (some may not have printed anything yet when
    // they were stopped: rank 5 fails 0.1 s after it starts).
    for (rank, lines) in &crate::lines_by_rank(&r.out(), "stdout") {
        assert!(
            !lines.iter().any(|l| l.starts_with("step 300/300")),
            "rank {rank} was stopped, not finished\n{ctx}"
        );
    }
    let rows: Vec<&str> = err
        .lines()
        .filter(|l| l.trim_start().starts_with(char::is_numeric) && l.contains("127.0.0."))
        .collect();
    assert_eq!(rows.len(), 8, "a summary row per rank\n{ctx}");
    for row in rows {
        let words: Vec<&str> = row.split_whitespace().collect();
        if words[0] == "5" {
            assert!(row.contains("exit 7"), "{row}");
        } else {
            assert!(
                !row.contains("exit 0"),
                "rank {} was stopped: {row}",
                words[0]
            );
        }
    }
    assert_job_gone(
        &sshd,
        &mark,
        &BTreeSet::new(),
        Duration::from_secs(3),
        "after the failed job",
    );
}

#[test]
fn a_command_missing_on_the_remote_hosts_exits_127() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-127");
    let r = over_ssh(
        &sshd,
        &mark,
        &["--sim", "1", "-H", "127.0.0.2:1,127.0.0.3:1"],
    )
    .args(["--", "atlasboost-e2e-no-such-command"])
    .run();
    let ctx = ctx(&r, &sshd);
    assert_eq!(r.code(), Some(127), "{ctx}");
    // One host's failure heard first is the error line; both heard as they joined, a list
    // under it ("error: 2 hosts failed as the hosts joined:").
    let error = r.the_error_line(&ctx);
    let named = "cannot start atlasboost-e2e-no-such-command on host 127.0.0.";
    assert!(
        error.contains(named)
            || (error.starts_with("error: 2 hosts failed as the hosts joined")
                && r.err().matches(named).count() == 2),
        "the error names the command and a host: {error}\n{ctx}"
    );
    sshd.assert_no_sessions(Duration::from_secs(3), "after the job");
}

/// Starts 2 hosts × 2 workers that each fork a `sleep` and print `ready`; returns once all 8
/// `kill -9` of the launcher of `launch`: it dies, and within 7 s nothing of the job is left on
/// any host (workers marked `mark`, the `agents`, sshd's sessions) nor of the launcher's own
/// processes. SPEC: within 5 s (an agent stops its workers with 1 s of grace once its stdin
/// closes, or once the launcher's heartbeats have been missing for 4 s); 2 s more for the ssh
/// client's death to reach sshd and the agent over TCP, on a busy 2-core machine.
fn kill_9_and_assert_nothing_left(
    launch: Launch,
    sshd: &Sshd,
    mark: &str,
    agents: &BTreeSet<i32>,
    context: &str,
) -> Finished {
    let launch_mark = launch.mark().to_string();
    let scratch = rank_file_dirs_of(agents);
    let killed = Instant::now();
    launch.signal(Signal::SIGKILL);
    let r = launch.wait_at_most(Duration::from_secs(5));
    assert_eq!(r.status.code(), None, "killed by SIGKILL\n{}", r.describe());
    let budget = Duration::from_secs(7);
    assert_job_gone(
        sshd,
        mark,
        agents,
        budget.saturating_sub(killed.elapsed()),
        &format!("after kill -9 of the launcher {context}"),
    );
    assert_no_process_with_env(
        LAUNCH_MARK,
        &launch_mark,
        budget.saturating_sub(killed.elapsed()),
        "the launcher's own processes after its kill -9",
    );
    // The agents are gone: so are their rank files (removed by them, or by their guards).
    let left: Vec<&PathBuf> = scratch.iter().filter(|d| d.exists()).collect();
    assert!(
        left.is_empty(),
        "the agents' rank files are left after kill -9 of the launcher {context}: {left:?}"
    );
    r
}

/// Each agent's directory of rank files (`$TMPDIR/atlasboost-<job>-<pid>`, with the agent's
/// own `TMPDIR`, as sshd gave it); asserts that each agent has one. A directory of another job
/// whose agent had the same pid (one killed with its guard, in an earlier run) is older: the
/// newest is this agent's.
fn rank_file_dirs_of(agents: &BTreeSet<i32>) -> Vec<PathBuf> {
    agents
        .iter()
        .map(|&pid| {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let tmp = environ
                .split(|b| *b == 0)
                .find_map(|v| v.strip_prefix(b"TMPDIR="))
                .map_or_else(
                    || "/tmp".into(),
                    |t| String::from_utf8_lossy(t).into_owned(),
                );
            let suffix = format!("-{pid}");
            let found: Vec<PathBuf> = std::fs::read_dir(&tmp)
                .into_iter()
                .flatten()
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("atlasboost-") && n.ends_with(&suffix))
                })
                .collect();
            let modified = |p: &PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
            found
                .iter()
                .max_by_key(|p| modified(p))
                .cloned()
                .unwrap_or_else(|| panic!("agent {pid} has no rank files in {tmp}"))
        })
        .collect()
}

/// processes run, with the agents.
fn start_forking_job(sshd: &Sshd, mark: &str, grace: &str) -> (Launch, BTreeSet<i32>) {
    let mut launch = over_ssh(
        sshd,
        mark,
        &["--sim", "2", "-H", TWO_BY_TWO, "--grace", grace],
    )
    .args(["--", "sh", "-c"])
    .args(["sleep 300 & echo ready; sleep 300; echo 'not stopped'"])
    .timeout(Duration::from_secs(60))
    .spawn();
    launch.wait_for_lines("]<stdout>:ready", 4, Duration::from_secs(20));
    let procs = wait_for_processes(mark, 8);
    let agents = agents_of(mark);
    assert_eq!(agents.len(), 2, "two agents run the workers: {procs:#?}");
    (launch, agents)
}

/// The ssh process the launcher started for `host`.
fn launchers_session(launch: &Launch, host: &str) -> Pid {
    let launcher = launch.pid();
    let session: Vec<i32> = descendants(launcher)
        .into_iter()
        .filter(|p| p.ppid == launcher && p.comm == "ssh")
        .filter(|p| cmdline(p.pid).is_some_and(|c| c.iter().any(|a| a == host)))
        .map(|p| p.pid)
        .collect();
    assert_eq!(session.len(), 1, "one ssh process for {host}");
    Pid::from_raw(session[0])
}

/// A network blip longer than the default `--host-timeout` (4 s): the launcher's ssh session
/// to one host is stopped for 6 s, so nothing goes either way, as when a link is down (with
/// `--fanout 1` the host below it is cut off too). With `--host-timeout 12` the launcher and
/// the agents ride it out: the job finishes and every worker's last line arrives. (With the
/// default, each side gives the other up after 4 s and the job fails.)
#[test]
fn a_blip_shorter_than_the_host_timeout_is_ridden_out() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-blip");
    let mut launch = over_ssh(
        &sshd,
        &mark,
        &["--sim", "2", "-H", TWO_BY_TWO, "--host-timeout", "12"],
    )
    .args(["--", "sh", "-c", "echo ready; sleep 10; echo finished"])
    .timeout(Duration::from_secs(60))
    .spawn();
    launch.wait_for_lines("]<stdout>:ready", 4, Duration::from_secs(20));
    let session = launchers_session(&launch, "127.0.0.2");
    kill(session, Signal::SIGSTOP).unwrap();
    std::thread::sleep(Duration::from_secs(6));
    kill(session, Signal::SIGCONT).unwrap();
    let r = launch.wait_at_most(Duration::from_secs(30));
    assert_all_four_said(&r, &ctx(&r, &sshd), "]<stdout>:finished");
}

/// The ssh process of one host is killed by a real-time signal (one nix cannot name): its
/// ending is still told.
#[test]
fn an_ssh_killed_by_a_real_time_signal_is_named() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-rt-killed");
    let (launch, _agents) = start_forking_job(&sshd, &mark, "1");
    let session = launchers_session(&launch, "127.0.0.2");
    // SIGRTMIN+3 (37 on Linux): no handler in ssh, so it ends it.
    // SAFETY: kill(2) on a child of the launcher this test started.
    assert_eq!(unsafe { nix::libc::kill(session.as_raw(), 37) }, 0);
    let r = launch.wait_at_most(Duration::from_secs(20));
    let ctx = ctx(&r, &sshd);
    assert_eq!(r.code(), Some(125), "a lost host fails the job\n{ctx}");
    let error = r.the_error_line(&ctx);
    assert!(
        error.contains("its ssh session ended (ssh was killed by SIGRTMIN+3)"),
        "the error says how ssh ended: {error}\n{ctx}"
    );
}

/// The ssh process of one host dies mid-job: the job fails (125) naming that host, the other
/// host's workers are stopped, and that host's agent stops its own when its stdin closes.
#[test]
fn a_killed_ssh_session_fails_the_job_and_stops_the_workers_of_both_hosts() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-lost");
    // --grace 30: nothing may wait for SIGKILL.
    let (launch, agents) = start_forking_job(&sshd, &mark, "30");
    let session = launchers_session(&launch, "127.0.0.2");
    let killed = Instant::now();
    kill(session, Signal::SIGKILL).unwrap();
    let r = launch.wait_at_most(Duration::from_secs(20));
    let ctx = ctx(&r, &sshd);
    assert_eq!(r.code(), Some(125), "a lost host fails the job\n{ctx}");
    assert!(
        r.elapsed < Duration::from_secs(30),
        "the launcher did not wait for --grace 30\n{ctx}"
    );
    let error = r.the_error_line(&ctx);
    assert!(
        error.starts_with(
            "error: host 127.0.0.2 failed first: its ssh session ended (ssh was killed by \
             SIGKILL) before its workers did"
        ),
        "the error names the host, and how ssh ended: {}\n{ctx}",
        error
    );
    assert!(!r.out().contains("not stopped"), "{ctx}");
    assert_job_gone(
        &sshd,
        &mark,
        &agents,
        // As in `kill_9_and_assert_nothing_left`: 2 s more than SPEC's 5 for the news to
        // cross ssh on a busy 2-core machine.
        Duration::from_secs(7).saturating_sub(killed.elapsed()),
        "after ssh to 127.0.0.2 was killed",
    );
}

/// `kill -9` of the launcher: its ssh processes die with it (PR_SET_PDEATHSIG), each agent's
/// stdin closes, and the agents stop their workers and the workers' children.
#[test]
fn kill_9_of_the_launcher_leaves_nothing_on_any_host() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-kill9");
    let (launch, agents) = start_forking_job(&sshd, &mark, "30");
    let r = kill_9_and_assert_nothing_left(launch, &sshd, &mark, &agents, "mid-job");
    assert!(!r.out().contains("not stopped"), "{}", r.describe());
}

/// `kill -9` of the launcher: each agent gives its workers SIGTERM first, so that a worker's
/// handler (a checkpoint, flushed logs) runs; the lifelines, which also see the sessions end,
/// leave that to the agents while they work.
#[test]
fn kill_9_of_the_launcher_gives_remote_workers_sigterm_first() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-kill9-term");
    let run = over_ssh(&sshd, &mark, &["--sim", "2", "-H", TWO_BY_TWO]);
    let seen = run.dir().join("term");
    std::fs::create_dir_all(&seen).unwrap();
    let worker = format!(
        "trap 'echo term > {}/$RANK; exit 0' TERM; echo ready; sleep 60 & wait",
        seen.display()
    );
    let mut launch = run
        .args(["--", "sh", "-c", &worker])
        .timeout(Duration::from_secs(60))
        .spawn();
    launch.wait_for_lines("]<stdout>:ready", 4, Duration::from_secs(20));
    launch.signal(Signal::SIGKILL);
    let r = launch.wait_at_most(Duration::from_secs(5));
    assert_no_process_with_env(MARK, &mark, Duration::from_secs(10), "after kill -9");
    let mut got: Vec<String> = std::fs::read_dir(&seen)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    got.sort();
    assert_eq!(
        got,
        ["0", "1", "2", "3"],
        "every rank ran its SIGTERM handler\n{}",
        ctx(&r, &sshd)
    );
}

#[test]
fn sigint_reaches_the_remote_workers_and_exits_130() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-sigint");
    let mut launch = over_ssh(
        &sshd,
        &mark,
        &["--sim", "2", "-H", TWO_BY_TWO, "--grace", "30"],
    )
    .args(["--", "python3", "-c", SLEEPER])
    .timeout(Duration::from_secs(60))
    .spawn();
    launch.wait_for_lines("]<stdout>:ready", 4, Duration::from_secs(20));
    wait_for_processes(&mark, 4);
    let agents = agents_of(&mark);
    assert_eq!(agents.len(), 2);
    let sent = Instant::now();
    launch.signal(Signal::SIGINT);
    let r = launch.wait_at_most(Duration::from_secs(20));
    let took = sent.elapsed();
    let ctx = ctx(&r, &sshd);
    assert_eq!(r.code(), Some(130), "{ctx}");
    assert!(
        took < Duration::from_secs(10),
        "workers end on SIGINT at once (--grace 30, sleep 60), yet the launcher took \
         {took:?}\n{ctx}"
    );
    for rank in 0..4 {
        assert!(
            r.err()
                .contains(&format!("[{rank}]<stderr>:KeyboardInterrupt")),
            "rank {rank} got SIGINT (KeyboardInterrupt)\n{ctx}"
        );
    }
    let error = r.the_error_line(&ctx);
    assert!(error.contains("SIGINT"), "{error}");
    assert_job_gone(
        &sshd,
        &mark,
        &agents,
        Duration::from_secs(3),
        "after SIGINT",
    );
}

/// atlasboost missing at the remote path: ssh's (the remote shell's) words, at once, not after
/// the rendezvous timeout.
#[test]
fn atlasboost_missing_on_the_remote_host_is_reported_at_once() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-nobin");
    let r = over_ssh(&sshd, &mark, &["--sim", "2", "-H", TWO_BY_TWO])
        .args(["--remote-atlasboost", "/nonexistent/atlasboost"])
        .args(["--rendezvous-timeout", "60"])
        .args(RAN)
        .timeout(Duration::from_secs(60))
        .run();
    assert_host_error(
        &r,
        &sshd,
        &[
            "ssh could not start atlasboost agent there; ssh said:",
            "/nonexistent/atlasboost",
            "No such file or directory",
        ],
    );
    assert!(
        r.elapsed < Duration::from_secs(20),
        "reported after {:?}: the launcher waited for the rendezvous (--rendezvous-timeout 60)",
        r.elapsed
    );
    sshd.assert_no_sessions(Duration::from_secs(3), "after the failed start");
}

/// A host that refuses the key (not in `authorized_keys`).
#[test]
fn a_host_refusing_the_key_is_reported_at_once() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-refused");
    let stranger = sshd.new_key("stranger_key");
    let config = sshd.write_client_config("ssh_config_stranger", Some(&stranger), true);
    let r = over_ssh_with(&config, &mark, &["--sim", "2", "-H", TWO_BY_TWO])
        .args(["--rendezvous-timeout", "60"])
        .args(RAN)
        .timeout(Duration::from_secs(60))
        .run();
    assert_host_error(
        &r,
        &sshd,
        &[
            "ssh could not start atlasboost agent there; ssh said:",
            "Permission denied",
        ],
    );
    assert!(r.elapsed < Duration::from_secs(20), "{}", ctx(&r, &sshd));
}

/// The worker directory is checked where the workers run: with only remote hosts, by their
/// agents.
#[test]
fn a_worker_directory_missing_on_the_remote_hosts_fails_before_any_worker() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-wdir");
    let wdir = format!("/nonexistent-{}", unique("wdir"));
    let r = over_ssh(&sshd, &mark, &["--sim", "2", "-H", TWO_BY_TWO])
        .args(["--wdir", &wdir, "--rendezvous-timeout", "60"])
        .args(RAN)
        .timeout(Duration::from_secs(60))
        .run();
    let error = assert_host_error(
        &r,
        &sshd,
        &[
            &format!("the worker directory {wdir} does not exist"),
            "--wdir",
        ],
    );
    // Every host lacks it: every host is named, not the first to say so. (In a chain,
    // `--fanout 1`, the first host's agent fails before it starts the second's.)
    let chain = std::env::var("ATLASBOOST_E2E_FANOUT").is_ok_and(|k| k == "1");
    assert!(
        error.contains("host 127.0.0.2: ") && (chain || error.contains("host 127.0.0.3: ")),
        "{}",
        ctx(&r, &sshd)
    );
    assert!(r.elapsed < Duration::from_secs(20), "{}", ctx(&r, &sshd));
    sshd.assert_no_sessions(Duration::from_secs(3), "after the failed start");
}

/// `--ssh-port`, `--ssh-identity` and `--remote-atlasboost` reach ssh and the remote shell:
/// the client configuration has neither port nor key, and the remote path has a space and a
/// quote.
#[test]
fn ssh_port_identity_and_a_remote_path_that_needs_quoting() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-options");
    let config = sshd.write_client_config("ssh_config_bare", None, false);
    let port = sshd.port().to_string();
    let key = sshd.client_key();
    let run = over_ssh_with(
        &config,
        &mark,
        &["--sim", "1", "-H", "127.0.0.2:1,127.0.0.3:1"],
    );
    let odd: PathBuf = run.dir().join("odd dir").join("it's atlasboost");
    std::fs::create_dir_all(odd.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(atlasboost_bin(), &odd).unwrap();
    let r = run
        .args(["--ssh-port", &port, "--ssh-identity"])
        .args([key.as_os_str()])
        .args(["--remote-atlasboost"])
        .args([odd.as_os_str()])
        .args(["--", "sh", "-c"])
        .args([r#"echo "agent: $(tr '\0' '|' < /proc/$PPID/cmdline)""#])
        .run();
    let ctx = ctx(&r, &sshd);
    assert_eq!(r.code(), Some(0), "{ctx}");
    for rank in 0..2 {
        let lines = crate::rank_lines(&r.out(), rank, "stdout");
        assert_eq!(
            lines,
            [format!("agent: {}|agent|", odd.display())],
            "rank {rank}'s parent is `{} agent`\n{ctx}",
            odd.display()
        );
    }
}

/// A host whose ssh port is closed is named with the connector's reason alone: not with what
/// ssh adds when its proxy passed back no connection (`mm_receive_fd: ...`, `proxy dialer did
/// not pass back a connection`), which says nothing more.
#[test]
fn a_closed_ssh_port_is_named_without_ssh_proxy_noise() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-closed-port");
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port().to_string()
    };
    let r = over_ssh(&sshd, &mark, &["--sim", "1", "-H", "127.0.0.2:1"])
        .args(["--ssh-port", &closed])
        .args(RAN)
        .timeout(Duration::from_secs(60))
        .run();
    let ctx = ctx(&r, &sshd);
    assert_eq!(r.code(), Some(125), "{ctx}");
    let err = r.err();
    assert!(
        err.contains(&format!("cannot connect to 127.0.0.2 port {closed}")),
        "{ctx}"
    );
    assert!(
        !err.contains("mm_receive_fd") && !err.contains("proxy dialer"),
        "{ctx}"
    );
}

/// A launcher that stops (SIGSTOP) sends no heartbeats: after 4 s each agent takes it for
/// gone and stops its workers, though the ssh sessions are still open.
#[test]
fn agents_stop_their_workers_when_the_launchers_heartbeats_stop() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-stopped");
    let (launch, agents) = start_forking_job(&sshd, &mark, "30");
    let stopped = Instant::now();
    launch.signal(Signal::SIGSTOP);
    // 4 s without heartbeats, 1 s of grace, 2 s of slack for a busy machine.
    let gone = wait_until(Duration::from_secs(7), || {
        pids_with_env(MARK, &mark).is_empty()
    });
    let took = stopped.elapsed();
    launch.signal(Signal::SIGCONT);
    assert!(
        gone,
        "the launcher has been stopped for {took:?}; its agents still run the workers: {:#?}",
        pids_with_env(MARK, &mark)
    );
    assert!(
        took > Duration::from_secs(3),
        "the workers ended after {took:?}, before any heartbeat was missed"
    );
    let r = launch.wait_at_most(Duration::from_secs(15));
    let ctx = ctx(&r, &sshd);
    assert!(
        r.code().is_some_and(|c| c != 0),
        "the job failed, with an exit code\n{ctx}"
    );
    assert_eq!(r.error_lines().len(), 1, "one `error:` line\n{ctx}");
    // The launcher's own pause is the failure, not a host or a rank.
    r.assert_failed_as_the_launchers_pause("agents", &ctx);
    assert!(!r.out().contains("not stopped"), "{ctx}");
    assert_job_gone(
        &sshd,
        &mark,
        &agents,
        Duration::from_secs(3),
        "after the launcher resumed",
    );
}

/// The launcher's stdout is a pipe nobody reads for 6 s (a terminal paused with Ctrl-S,
/// `| less` before scrolling, a slow log shipper): writing to it blocks, as it does with local
/// workers, and every line must still arrive once it is read. Being slow to print is not
/// losing a host: neither side may take the other for gone because the launcher was blocked
/// on its own console.
#[test]
fn a_console_blocked_for_a_while_loses_neither_hosts_nor_lines() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-slow-console");
    let r = over_ssh(
        &sshd,
        &mark,
        &["--sim", "1", "-H", "127.0.0.2:1,127.0.0.3:1"],
    )
    .args(["--", "seq", "1", "100000"])
    .nonblocking_stdout(Duration::from_secs(6))
    .timeout(Duration::from_secs(60))
    .run();
    let ctx = ctx(&r, &sshd);
    let by_rank = crate::lines_by_rank(&r.out(), "stdout");
    let counts: Vec<usize> = (0..2)
        .map(|rank| by_rank.get(&rank).map_or(0, Vec::len))
        .collect();
    assert_eq!(
        r.code(),
        Some(0),
        "stdout not read for 6 s; lines per rank that arrived: {counts:?} of 100000\n\
         --- stderr ---\n{}",
        r.err()
    );
    let want: Vec<String> = (1..=100_000).map(|i| i.to_string()).collect();
    for rank in 0..2 {
        assert!(
            by_rank.get(&rank) == Some(&want),
            "rank {rank}: {} of 100000 lines arrived\n{ctx}",
            counts[rank as usize]
        );
    }
    sshd.assert_no_sessions(Duration::from_secs(3), "after the job");
}

/// A script that stands in for atlasboost on the "remote" hosts (`--remote-atlasboost`):
/// `prelude` first (shell commands), then `exec <bin> "$@"`. On 127.0.0.3 (the server address
/// of its ssh session) it never starts the agent but reads its stdin to the end: a host that
/// is slow to join, and goes away with its session.
fn wrapper(run: &Run, prelude: &str, slow_3: bool) -> PathBuf {
    let slow = if slow_3 {
        "case \"$SSH_CONNECTION\" in *' 127.0.0.3 '*) cat >/dev/null; exit 0 ;; esac\n"
    } else {
        ""
    };
    run.file(
        "remote-atlasboost.sh",
        format!("#!/bin/sh\n{slow}{prelude}\nexec '{}' \"$@\"\n", bin()),
        true,
    )
}

/// The `atlasboost agent` processes below the server now.
fn agents_below(sshd: &Sshd) -> BTreeSet<i32> {
    let bin = bin();
    sshd.sessions()
        .iter()
        .map(|p| p.pid)
        .filter(|&pid| cmdline(pid).is_some_and(|c| c == [bin.as_str(), "agent"]))
        .collect()
}

/// Simulated faults (`ATLASBOOST_SIM_FAULTS`, the tests' way to break an NPU) reach the agents
/// on other hosts, whose own environment has no such variable: an unhealthy device of
/// 127.0.0.3 ends the job naming it, as on a local host, instead of running on it.
#[test]
fn simulated_faults_reach_the_agents_over_ssh() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-sim-faults");
    // The job with the fault given as `name=value`, refused naming the `critical` device.
    let refused = |run: Run, name: &str, value: &str, critical: &str| {
        let r = run
            .env(name, value)
            .args(RAN)
            .timeout(Duration::from_secs(60))
            .run();
        let ctx = r.describe();
        assert_eq!(r.code(), Some(125), "{ctx}");
        assert!(r.err().contains(critical), "{ctx}");
        assert!(!r.out().contains("WORKER-RAN"), "{ctx}");
    };
    let run = || over_ssh(&sshd, &mark, &["--sim", "2", "-H", TWO_BY_TWO]);
    refused(
        run(),
        "ATLASBOOST_SIM_FAULTS",
        "127.0.0.3/unhealthy:1",
        "device 1 of host 127.0.0.3 is critical",
    );
    // A faults file named relative to the launcher's directory, not the agents' (their login
    // directory).
    let in_file = run();
    in_file.file("faults", "127.0.0.2/unhealthy:0\n", false);
    refused(
        in_file,
        "ATLASBOOST_SIM_FAULTS_FILE",
        "faults",
        "device 0 of host 127.0.0.2 is critical",
    );
}

/// A launcher with no devices of its own (a login node: no driver, no hccn.conf) launches
/// remote hosts whose agents find theirs: it probes only the hosts it is one of.
#[test]
fn a_launcher_without_devices_launches_remote_hosts_that_have_them() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-login-node");
    let run = over_ssh(
        &sshd,
        &mark,
        &["--probe", "hccn", "-H", "127.0.0.2,127.0.0.3"],
    );
    let conf = |host: u8| {
        run.file(
            &format!("hccn-{host}.conf"),
            format!("address_0=192.168.{host}.101\naddress_1=192.168.{host}.102\n"),
            false,
        )
    };
    let (conf_2, conf_3) = (conf(2), conf(3));
    // Only the hosts' agents see their files (by the address their session reached): the
    // launcher's own probe would fail.
    let remote = wrapper(
        &run,
        &format!(
            "case \"$SSH_CONNECTION\" in *' 127.0.0.2 '*) f='{}' ;; *) f='{}' ;; esac\n\
             export ATLASBOOST_HCCN_CONF=\"$f\"",
            conf_2.display(),
            conf_3.display()
        ),
        false,
    );
    let r = run
        .env("ATLASBOOST_HCCN_CONF", "/nonexistent/hccn.conf")
        .args(["--remote-atlasboost"])
        .args([&remote])
        .args(RAN)
        .timeout(Duration::from_secs(60))
        .run();
    r.assert_code(0);
    assert_eq!(
        r.out().matches("]<stdout>:WORKER-RAN").count(),
        4,
        "{}",
        ctx(&r, &sshd)
    );
}

/// A host that never joins: the rendezvous times out, naming it.
#[test]
fn a_remote_host_that_never_joins_times_out_naming_it() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-nojoin");
    let run = over_ssh(
        &sshd,
        &mark,
        &["--sim", "1", "-H", "127.0.0.2:1,127.0.0.3:1"],
    );
    let slow = wrapper(&run, "", true);
    let r = run
        .args(["--rendezvous-timeout", "2", "--remote-atlasboost"])
        .args([&slow])
        .args(RAN)
        .timeout(Duration::from_secs(60))
        .run();
    let ctx = ctx(&r, &sshd);
    assert_eq!(r.code(), Some(125), "{ctx}");
    let error = r.the_error_line(&ctx);
    assert!(
        error.contains("127.0.0.3") && !error.contains("127.0.0.2"),
        "the error names the host that did not join, and only it: {}\n{ctx}",
        error
    );
    assert!(
        r.elapsed < Duration::from_secs(10),
        "--rendezvous-timeout 2, yet {:?}\n{ctx}",
        r.elapsed
    );
    assert!(!r.out().contains("WORKER-RAN"), "{ctx}");
    // 127.0.0.2's agent waits for the rendezvous 2 s more than the launcher at most.
    sshd.assert_no_sessions(Duration::from_secs(5), "after the rendezvous timed out");
}

/// Two hosts out of reach at the start: the error names both, not the first alone (in a chain,
/// `--fanout 1`, the second is below the first and named as such).
#[test]
fn every_host_out_of_reach_at_the_start_is_named() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-two-lost");
    let run = over_ssh(
        &sshd,
        &mark,
        &["--sim", "1", "-H", "127.0.0.1:1,127.0.0.2:1,127.0.0.3:1"],
    );
    // Both fail together (each waits, at most 3 s, until the other has started): the test is of
    // naming both, not of how far apart a loaded machine lets them fail.
    let both = run.dir().display().to_string();
    let unreachable = wrapper(
        &run,
        &format!(
            "case \"$SSH_CONNECTION\" in *' 127.0.0.2 '*|*' 127.0.0.3 '*) \
             touch '{both}'/started.\"$$\"; i=0; \
             while [ \"$(ls '{both}' | grep -c '^started')\" -lt 2 ] && [ $i -lt 60 ]; do \
             sleep 0.05; i=$((i+1)); done; \
             echo 'no agent here' >&2; exit 255 ;; esac"
        ),
        false,
    );
    let r = run
        .args(["--remote-atlasboost"])
        .args([&unreachable])
        .args(RAN)
        .timeout(Duration::from_secs(60))
        .run();
    let ctx = ctx(&r, &sshd);
    assert_eq!(r.code(), Some(125), "{ctx}");
    let err = r.err();
    assert_eq!(r.error_lines().len(), 1, "one error\n{ctx}");
    for host in ["127.0.0.2", "127.0.0.3"] {
        assert!(err.contains(host), "{host} is named\n{ctx}");
    }
    assert!(!r.out().contains("WORKER-RAN"), "{ctx}");
    sshd.assert_no_sessions(Duration::from_secs(5), "after the launch failed");
}

/// `kill -9` of the launcher while a host is still joining: the agents already waiting in the
/// rendezvous must go too (their stdin has closed), not wait for their own rendezvous timeout
/// (`--rendezvous-timeout`, 120 s by default).
#[test]
fn kill_9_of_the_launcher_while_a_host_joins_leaves_no_agent() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-kill9-join");
    let run = over_ssh(
        &sshd,
        &mark,
        &["--sim", "1", "-H", "127.0.0.2:1,127.0.0.3:1"],
    );
    let slow = wrapper(&run, "", true);
    let launch = run
        .args(["--rendezvous-timeout", "60", "--remote-atlasboost"])
        .args([&slow])
        .args(RAN)
        .timeout(Duration::from_secs(60))
        .spawn();
    let mut agents = BTreeSet::new();
    let found = wait_until(Duration::from_secs(20), || {
        agents = agents_below(&sshd);
        !agents.is_empty()
    });
    assert!(found, "127.0.0.2's agent starts\n{}", sshd_log(&sshd));
    // Let it get into the rendezvous (it has nothing else to do than probe and connect).
    std::thread::sleep(Duration::from_millis(500));
    let killed = Instant::now();
    launch.signal(Signal::SIGKILL);
    let r = launch.wait_at_most(Duration::from_secs(5));
    assert_eq!(r.status.code(), None, "{}", r.describe());
    // As for kill -9 mid-job: 5 s, and 2 s for the news to cross ssh on a busy machine.
    assert_agents_gone(
        &agents,
        Duration::from_secs(7).saturating_sub(killed.elapsed()),
        "127.0.0.2's agent, waiting in the rendezvous (--rendezvous-timeout 60), after kill -9 \
         of the launcher",
    );
    sshd.assert_no_sessions(
        Duration::from_secs(7).saturating_sub(killed.elapsed()),
        "after kill -9 of the launcher during the rendezvous",
    );
}

/// A login script that prints on stdout before the agent starts (a banner, a `.bashrc` that
/// echoes) must not break the channel, nor reach the workers' output.
#[test]
fn a_login_banner_on_stdout_does_not_break_the_channel() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-banner");
    let run = over_ssh(
        &sshd,
        &mark,
        &["--sim", "1", "-H", "127.0.0.2:1,127.0.0.3:1"],
    );
    // Noise, including a start of the agent's greeting that is not one.
    let noisy = wrapper(
        &run,
        "echo 'Welcome to a remote host'; printf '\\000atlasboost-agent'; echo ' (not yet)'",
        false,
    );
    let r = run
        .args(["--remote-atlasboost"])
        .args([&noisy])
        .args(["--", "sh", "-c", "echo \"rank $RANK_ID here\""])
        .run();
    let ctx = ctx(&r, &sshd);
    assert_eq!(r.code(), Some(0), "{ctx}");
    for rank in 0..2 {
        assert_eq!(
            crate::rank_lines(&r.out(), rank, "stdout"),
            [format!("rank {rank} here")],
            "{ctx}"
        );
    }
    assert!(
        !r.out().contains("Welcome") && !r.out().contains("not yet"),
        "the banner is not workers' output\n{ctx}"
    );
    sshd.assert_no_sessions(Duration::from_secs(3), "after the job");
}

/// The value of `name` in the environment of `pid`.
fn env_of(pid: i32, name: &str) -> Option<String> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let prefix = format!("{name}=");
    environ
        .split(|b| *b == 0)
        .find_map(|kv| kv.strip_prefix(prefix.as_bytes()))
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// The one agent among `agents` that runs the workers of `host`.
fn agent_of(mark: &str, agents: &BTreeSet<i32>, host: &str) -> Pid {
    let of_host: BTreeSet<i32> = pids_with_env(MARK, mark)
        .iter()
        .filter(|p| agents.contains(&p.ppid))
        .filter(|p| env_of(p.pid, "ATLASBOOST_SERVER_ID").as_deref() == Some(host))
        .map(|p| p.ppid)
        .collect();
    assert_eq!(of_host.len(), 1, "one agent runs {host}'s workers");
    Pid::from_raw(*of_host.iter().next().unwrap())
}

/// The agent of one host is killed (SIGKILL, say the OOM killer): its lifeline stops that
/// host's workers, the launcher names the host and stops the other host's.
#[test]
fn a_killed_agent_fails_the_job_and_its_lifeline_stops_its_workers() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-agent-killed");
    let (launch, agents) = start_forking_job(&sshd, &mark, "30");
    let agent = agent_of(&mark, &agents, "127.0.0.3");
    let killed = Instant::now();
    kill(agent, Signal::SIGKILL).unwrap();
    let r = launch.wait_at_most(Duration::from_secs(20));
    let ctx = ctx(&r, &sshd);
    assert_eq!(r.code(), Some(125), "a lost host fails the job\n{ctx}");
    let error = r.the_error_line(&ctx);
    assert!(
        error.starts_with("error: host 127.0.0.3 failed first"),
        "the error names the host: {}\n{ctx}",
        error
    );
    assert!(!r.out().contains("not stopped"), "{ctx}");
    assert_job_gone(
        &sshd,
        &mark,
        &agents,
        // As in `kill_9_and_assert_nothing_left`: 2 s more than SPEC's 5 for the news to
        // cross ssh on a busy 2-core machine.
        Duration::from_secs(7).saturating_sub(killed.elapsed()),
        "after 127.0.0.3's agent was killed",
    );
}

/// A rank on a remote host that prints a row of dots (no newline) is progressing: its agent
/// tells the launcher, which holds no line of it until the row ends, and no hang is called.
#[test]
fn a_remote_rank_printing_part_of_a_line_is_not_hung() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-dots");
    let r = over_ssh(&sshd, &mark, &["--sim", "2", "-H", TWO_BY_TWO])
        // 3.6 s of dots against a 2 s timeout: a stall of 1.7 s (ssh, a busy machine) is no
        // hang.
        .args(["--hang-timeout", "2", "--grace", "0.5", "--", "sh", "-c"])
        .args([
            "echo start; i=0; while [ $i -lt 12 ]; do printf .; i=$((i+1)); sleep 0.3; done; \
             echo ' done'",
        ])
        .timeout(Duration::from_secs(60))
        .run();
    assert_all_four_said(&r, &ctx(&r, &sshd), ":............ done");
}

/// Ctrl-Z (SIGTSTP) stops the launcher for longer than the hosts' bound on its silence and
/// than `--hang-timeout`: the hosts were told, so they wait, the workers run on, and once
/// continued the job ends as it would have (it used to lose every remote host 4 s into the
/// stop, blaming the first), its ranks not taken for hung for what was not read meanwhile.
#[test]
fn ctrl_z_of_the_launcher_keeps_a_multi_host_job() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-ctrl-z");
    let mut launch = over_ssh(&sshd, &mark, &["--sim", "2", "-H", TWO_BY_TWO])
        .args(["--hang-timeout", "3", "--", "sh", "-c"])
        .args([
            "echo ready; for i in 1 2 3 4 5 6 7 8 9; do sleep 1; echo tick; done; echo finished",
        ])
        .timeout(Duration::from_secs(60))
        .spawn();
    launch.wait_for_lines("]<stdout>:ready", 4, Duration::from_secs(20));
    launch.signal(Signal::SIGTSTP);
    // Stopped, past the 4 s the hosts give a silent launcher.
    let stopped = wait_until(Duration::from_secs(5), || {
        proc_stat(launch.pid()).is_some_and(|p| p.state == 'T')
    });
    std::thread::sleep(Duration::from_secs(6));
    launch.signal(Signal::SIGCONT);
    let r = launch.wait_at_most(Duration::from_secs(30));
    let ctx = ctx(&r, &sshd);
    assert!(stopped, "the launcher stopped on SIGTSTP\n{ctx}");
    assert_all_four_said(&r, &ctx, ":finished");
    assert!(
        r.err().contains("atlasboost: stopped (SIGTSTP)") && r.err().contains("continued"),
        "{ctx}"
    );
}

/// The agent of one host hangs (stopped: a deadlock would do the same) with its workers
/// running: the launcher names the host lost, and once its ssh session has ended (and the 6 s
/// a working agent would take at most to stop its workers itself), the agent's lifeline stops
/// that host's workers though the agent itself still hangs.
#[test]
fn a_hung_agents_workers_stop_when_its_session_ends() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-agent-hung");
    let (launch, agents) = start_forking_job(&sshd, &mark, "30");
    let agent = agent_of(&mark, &agents, "127.0.0.3");
    kill(agent, Signal::SIGSTOP).unwrap();
    let r = launch.wait_at_most(Duration::from_secs(20));
    let ended = Instant::now();
    let ctx = ctx(&r, &sshd);
    let left = std::panic::catch_unwind(|| {
        assert_no_process_with_env(
            MARK,
            &mark,
            Duration::from_secs(12),
            "the hung agent's workers, after the job",
        )
    });
    // The agent is still there, stopped: the lifeline acted without it.
    let still_there = proc_stat(agent.as_raw()).is_some_and(|p| p.alive());
    let _ = kill(agent, Signal::SIGKILL);
    let _ = kill(agent, Signal::SIGCONT);
    assert_eq!(r.code(), Some(125), "a lost host fails the job\n{ctx}");
    assert!(
        r.err().contains("host 127.0.0.3 failed first"),
        "the error names the host\n{ctx}"
    );
    assert!(
        still_there,
        "the agent was still stopped when its workers were gone\n{ctx}"
    );
    if let Err(e) = left {
        std::panic::resume_unwind(e);
    }
    assert!(ended.elapsed() < Duration::from_secs(15), "{ctx}");
}

/// The agent of a host below another in the launch tree goes silent (stopped, as a hung host
/// would be, its ssh session still open): the agent above it notices within the lost-host
/// bound, ends that session and reports the host lost, and the job fails naming it, instead of
/// waiting for ever on a session that never ends.
#[test]
fn a_silent_agent_below_another_is_named_lost_by_the_agent_above_it() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-tree-silent");
    // A chain: 127.0.0.3's agent is started, and heard, by 127.0.0.2's.
    let mut launch = over_ssh(
        &sshd,
        &mark,
        &[
            "--fanout", "1", "--sim", "2", "-H", TWO_BY_TWO, "--grace", "1",
        ],
    )
    .args(["--", "sh", "-c", "echo ready; exec sleep 60"])
    .timeout(Duration::from_secs(60))
    .spawn();
    launch.wait_for_lines("]<stdout>:ready", 4, Duration::from_secs(20));
    wait_for_processes(&mark, 4);
    let agents = agents_of(&mark);
    let agent = agent_of(&mark, &agents, "127.0.0.3");
    let stopped = Instant::now();
    kill(agent, Signal::SIGSTOP).unwrap();
    let r = launch.wait_at_most(Duration::from_secs(30));
    let took = stopped.elapsed();
    // Let it go: its session is closed, so it stops its workers and exits.
    let _ = kill(agent, Signal::SIGCONT);
    let ctx = ctx(&r, &sshd);
    assert_eq!(r.code(), Some(125), "a lost host fails the job\n{ctx}");
    let error = r.the_error_line(&ctx);
    assert!(
        error.starts_with("error: host 127.0.0.3 failed first")
            && error.contains("heartbeats stopped")
            && error.contains("said host 127.0.0.2, which started it"),
        "the error names the silent host and who noticed: {}\n{ctx}",
        error
    );
    assert!(
        took < Duration::from_secs(12),
        "the job ended {took:?} after the agent stopped\n{ctx}"
    );
    assert_job_gone(
        &sshd,
        &mark,
        &agents,
        Duration::from_secs(10),
        "after the silent agent was let go",
    );
}

/// Monitoring over ssh (SPEC §13): each agent samples its host and sends the sample up the
/// channel (through the tree: a chain here); the launcher writes them to `--events`.
#[test]
fn remote_hosts_send_their_samples_up_to_the_events_file() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-telemetry");
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.jsonl");
    let r = over_ssh(
        &sshd,
        &mark,
        &["--fanout", "1", "--sim", "2", "-H", TWO_BY_TWO],
    )
    .args(["--monitor-interval", "1", "--events"])
    .args([events.to_str().unwrap()])
    .args(["--", "sleep", "1.5"])
    .timeout(Duration::from_secs(60))
    .run();
    let ctx = ctx(&r, &sshd);
    assert_eq!(r.code(), Some(0), "{ctx}");
    let samples: Vec<serde_json::Value> = std::fs::read_to_string(&events)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["event"] == "telemetry")
        .collect();
    for host in ["127.0.0.2", "127.0.0.3"] {
        let of_host: Vec<&serde_json::Value> =
            samples.iter().filter(|s| s["host"] == host).collect();
        assert!(
            !of_host.is_empty(),
            "no sample of {host}: {samples:#?}\n{ctx}"
        );
        let s = of_host[0];
        assert_eq!(s["devices"].as_array().unwrap().len(), 2, "{s}");
        assert!(s["devices"][0]["ai_core_percent"].is_u64(), "{s}");
        assert_eq!(s["devices"][1]["health"], "healthy", "{s}");
        // Its workers, with their CPU and memory, in some sample.
        let want: Vec<u64> = if host == "127.0.0.2" {
            vec![0, 1]
        } else {
            vec![2, 3]
        };
        let ranks_of = |s: &serde_json::Value| -> Vec<u64> {
            let mut r: Vec<u64> = s["workers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|w| w["rank"].as_u64().unwrap())
                .collect();
            r.sort_unstable();
            r
        };
        assert!(
            of_host.iter().any(|s| ranks_of(s) == want),
            "no sample of {host} with ranks {want:?}: {of_host:#?}"
        );
    }
}

/// A worker that waits (bounded) on its first attempt and succeeds at once on a restart.
const FIRST_ATTEMPT_WAITS: &str = "echo \"ready attempt=$ATLASBOOST_RESTART_COUNT size=$RANK_SIZE \
     server=$ATLASBOOST_SERVER_ID\"; \
     if [ \"$ATLASBOOST_RESTART_COUNT\" = 0 ]; then sleep 60; fi";

/// A restarted job's second attempt ran two ranks, both on `server` (the host left), and
/// succeeded.
fn assert_second_attempt_on(r: &Finished, server: &str, ctx: &str) {
    assert_eq!(r.code(), Some(0), "the second attempt succeeds\n{ctx}");
    let out = r.out();
    let second: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("ready attempt=1"))
        .collect();
    assert_eq!(second.len(), 2, "two ranks on the host left\n{ctx}");
    assert!(
        second
            .iter()
            .all(|l| l.ends_with(&format!("size=2 server={server}"))),
        "the second attempt runs on {server}\n{ctx}"
    );
}

/// Starts a two-host job of `FIRST_ATTEMPT_WAITS` with `extra` options, kills 127.0.0.3's agent
/// once every worker runs, and returns the finished run.
fn lose_a_host_under_restarts(sshd: &Sshd, mark: &str, extra: &[&str]) -> Finished {
    lose_this_host_under_restarts(sshd, mark, "127.0.0.3", &[], extra)
}

/// [`lose_a_host_under_restarts`] killing the agent of `host`, with `launch` options first
/// (`--fanout`).
fn lose_this_host_under_restarts(
    sshd: &Sshd,
    mark: &str,
    host: &str,
    launch: &[&str],
    extra: &[&str],
) -> Finished {
    let mut args = launch.to_vec();
    args.extend(["--sim", "2", "-H", TWO_BY_TWO, "--grace", "2"]);
    let mut launch = over_ssh(sshd, mark, &args)
        .args(["--max-restarts", "1", "--restart-delay", "0"])
        .args(extra)
        .args(["--", "sh", "-c", FIRST_ATTEMPT_WAITS])
        .timeout(Duration::from_secs(90))
        .spawn();
    launch.wait_for_lines("ready attempt=0", 4, Duration::from_secs(30));
    let agents = agents_of(mark);
    kill(agent_of(mark, &agents, host), Signal::SIGKILL).unwrap();
    launch.wait_at_most(Duration::from_secs(60))
}

/// In a chain (`--fanout 1`), the agent of 127.0.0.2, which started 127.0.0.3's, is killed:
/// 127.0.0.3 is lost with it, named, and the restart leaves out only 127.0.0.2, the host that
/// was really lost, and runs on 127.0.0.3.
#[test]
fn a_lost_interior_host_is_the_only_one_a_restart_leaves_out() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-restart-interior");
    let r = lose_this_host_under_restarts(
        &sshd,
        &mark,
        "127.0.0.2",
        &["--fanout", "1"],
        &["--min-np", "2"],
    );
    let ctx = ctx(&r, &sshd);
    assert_second_attempt_on(&r, "127.0.0.3", &ctx);
    let err = r.err();
    assert!(
        err.contains("with it the 1 host below it in the launch tree: 127.0.0.3")
            && err.contains("attempt 1: 2 ranks on 1 server (1 × 2)"),
        "{ctx}"
    );
    sshd.assert_no_sessions(Duration::from_secs(10), "after the job");
}

/// Two of three hosts lost at once: the attempt's end names one, and every other host the
/// restart leaves out is named on the console too (not only in `--events`).
#[test]
fn every_host_a_restart_leaves_out_is_named() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-restart-two-lost");
    let mut launch = over_ssh(
        &sshd,
        &mark,
        // Every host the launcher's own child, also in the chained run of these tests: in a
        // chain 127.0.0.4 would be below 127.0.0.3, lost with it, and not left out.
        &[
            "--fanout",
            "32",
            "--sim",
            "2",
            "-H",
            "127.0.0.2:2,127.0.0.3:2,127.0.0.4:2",
            "--grace",
            "2",
        ],
    )
    .args(atlasboost_e2e::ONE_RESTART_DOWN_TO_2)
    .args(["--", "sh", "-c", FIRST_ATTEMPT_WAITS])
    .timeout(Duration::from_secs(90))
    .spawn();
    launch.wait_for_lines("ready attempt=0", 6, Duration::from_secs(30));
    let agents = agents_of(&mark);
    let lost = ["127.0.0.3", "127.0.0.4"].map(|h| agent_of(&mark, &agents, h));
    for agent in lost {
        kill(agent, Signal::SIGKILL).unwrap();
    }
    let r = launch.wait_at_most(Duration::from_secs(60));
    let ctx = ctx(&r, &sshd);
    assert_second_attempt_on(&r, "127.0.0.2", &ctx);
    let err = r.err();
    // One is the attempt's end ("host H lost"), the other is left out by name.
    for (named, other) in [("127.0.0.3", "127.0.0.4"), ("127.0.0.4", "127.0.0.3")] {
        if err.contains(&format!("host {named} lost")) {
            assert!(
                err.contains(&format!(
                    "leaving {other} out of the restart: lost during attempt 0"
                )),
                "{ctx}"
            );
            return;
        }
    }
    panic!("neither lost host ended the attempt\n{ctx}");
}

/// A lost host under `--max-restarts 1 --min-np 2`: the job goes on without it, naming it.
#[test]
fn a_lost_host_is_left_out_and_the_job_continues_on_the_others() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-restart-lost");
    let r = lose_a_host_under_restarts(&sshd, &mark, &["--min-np", "2"]);
    let ctx = ctx(&r, &sshd);
    assert_second_attempt_on(&r, "127.0.0.2", &ctx);
    let err = r.err();
    assert!(
        err.contains("attempt 0: 4 ranks on 2 servers (2 × 2)")
            && err.contains("host 127.0.0.3 lost")
            && err.contains("attempt 1: 2 ranks on 1 server (1 × 2)"),
        "{ctx}"
    );
    sshd.assert_no_sessions(Duration::from_secs(10), "after the job");
}

/// A host that cannot be reached when a restart starts (its agent cannot start there now) is
/// left out of the restart by name, and the others run it, as for a host whose probe fails.
#[test]
fn a_host_unreachable_at_a_restart_is_left_out_and_the_others_run_it() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-restart-unreachable");
    let run = over_ssh(
        &sshd,
        &mark,
        &["--sim", "2", "-H", TWO_BY_TWO, "--grace", "2"],
    );
    let gone = run.dir().join("127.0.0.3-gone");
    let unreachable = wrapper(
        &run,
        &format!(
            "case \"$SSH_CONNECTION\" in *' 127.0.0.3 '*) [ -e '{}' ] && \
             {{ echo 'no route to this host now' >&2; exit 255; }} ;; esac",
            gone.display()
        ),
        false,
    );
    let worker = format!(
        "echo \"ready attempt=$ATLASBOOST_RESTART_COUNT size=$RANK_SIZE \
         server=$ATLASBOOST_SERVER_ID\"; \
         if [ \"$ATLASBOOST_RESTART_COUNT\" = 0 ]; then \
             if [ \"$RANK\" = 0 ]; then sleep 1; touch '{}'; exit 1; fi; sleep 60; fi",
        gone.display()
    );
    let r = run
        .args(atlasboost_e2e::ONE_RESTART_DOWN_TO_2)
        .args(["--events", "events.jsonl", "--remote-atlasboost"])
        .args([&unreachable])
        .args(["--", "sh", "-c", &worker])
        .timeout(Duration::from_secs(90))
        .run();
    let ctx = ctx(&r, &sshd);
    assert_second_attempt_on(&r, "127.0.0.2", &ctx);
    let err = r.err();
    assert!(
        err.contains("host 127.0.0.3: ssh could not start atlasboost agent there")
            && err.contains("no route to this host now")
            && err.contains("leaving 127.0.0.3 out of the restart")
            && err.contains("attempt 1: 2 ranks on 1 server (1 × 2)"),
        "{ctx}"
    );
    let events = std::fs::read_to_string(r.dir().join("events.jsonl")).unwrap();
    assert!(
        events.lines().any(|l| {
            let e: serde_json::Value = serde_json::from_str(l).unwrap();
            e["event"] == "host_left_out"
                && e["host"] == "127.0.0.3"
                && e["why"]
                    .as_str()
                    .is_some_and(|w| w.contains("no route to this host now"))
        }),
        "{events}"
    );
    sshd.assert_no_sessions(Duration::from_secs(10), "after the job");
}

/// Without `--min-np`, a restart may not shrink: the job ends saying it would need to.
#[test]
fn a_lost_host_without_min_np_ends_the_job_saying_it_would_shrink() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-restart-noshrink");
    let r = lose_a_host_under_restarts(&sshd, &mark, &[]);
    let ctx = ctx(&r, &sshd);
    assert_eq!(r.code(), Some(125), "{ctx}");
    assert!(
        r.err()
            .contains("the job would need to shrink from 4 to 2 ranks")
            && r.err()
                .contains("without host 127.0.0.3 (lost or failed earlier)")
            && r.err().contains("pass --min-np"),
        "{ctx}"
    );
    assert!(!r.out().contains("attempt=1"), "{ctx}");
    assert_no_process_with_env(MARK, &mark, Duration::from_secs(10), "after the job");
}

/// `kill -9` of the launcher while it stops every host's workers for a restart (they ignore
/// SIGTERM, so the stop lasts): nothing is left on any host.
#[test]
fn kill_9_of_the_launcher_during_a_restarts_stop_leaves_nothing_on_any_host() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-restart-kill9");
    let mut launch = over_ssh(
        &sshd,
        &mark,
        &["--sim", "2", "-H", TWO_BY_TWO, "--grace", "30"],
    )
    .args(["--max-restarts", "2", "--", "sh", "-c"])
    .args([
        "trap '' TERM; echo ready; if [ \"$RANK\" = 3 ]; then exit 1; fi; \
             i=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done",
    ])
    .timeout(Duration::from_secs(60))
    .spawn();
    launch.wait_for(
        "the stop after rank 3's failure",
        Duration::from_secs(30),
        |_, err| err.contains("stopping the other"),
    );
    let agents = agents_of(&mark);
    kill_9_and_assert_nothing_left(launch, &sshd, &mark, &agents, "during a restart's stop");
}

/// `kill -9` of the launcher while it waits to restart (between two attempts, when it is about
/// to re-plan): no session, agent or worker is left on any host.
#[test]
fn kill_9_of_the_launcher_between_attempts_leaves_nothing_on_any_host() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-restart-delay-kill9");
    let mut launch = over_ssh(
        &sshd,
        &mark,
        &["--sim", "2", "-H", TWO_BY_TWO, "--grace", "1"],
    )
    .args([
        "--max-restarts",
        "2",
        "--restart-delay",
        "20",
        "--",
        "sh",
        "-c",
    ])
    .args(["echo ready; if [ \"$RANK\" = 2 ]; then exit 1; fi; sleep 60"])
    .timeout(Duration::from_secs(60))
    .spawn();
    launch.wait_for("the restart's delay", Duration::from_secs(30), |_, err| {
        err.contains("restarting every worker")
    });
    kill_9_and_assert_nothing_left(launch, &sshd, &mark, &BTreeSet::new(), "between attempts");
}

/// ssh's connection is opened by `atlasboost ssh-connect`, with TCP_NODELAY, where the user's
/// ssh configuration has no proxy of its own; a `ProxyCommand` of the user's is kept and used;
/// `ATLASBOOST_SSH_NODELAY=0` turns it off. Every way, the job runs.
#[test]
fn ssh_connections_come_from_atlasboost_unless_the_user_has_a_proxy_or_says_no() {
    let (sshd, mark, _cleanup) = ssh_test!("ssh-connect");
    let args = [
        "-v",
        "--sim",
        "1",
        "-H",
        "127.0.0.2:1,127.0.0.3:1",
        "--",
        "true",
    ];

    let r = over_ssh(&sshd, &mark, &args).run();
    let ctx2 = ctx(&r, &sshd);
    assert_eq!(r.code(), Some(0), "{ctx2}");
    assert!(
        r.err()
            .contains("ssh to 127.0.0.2: atlasboost opens the connection, with TCP_NODELAY"),
        "{ctx2}"
    );

    // The user's own proxy: it records each use, then connects (handing ssh the socket).
    let dir = sshd.ssh_config().parent().unwrap().to_path_buf();
    let used = dir.join("proxy-used");
    let config = dir.join("ssh_config_with_proxy");
    let text = format!(
        "{}  ProxyCommand sh -c 'echo %h >> {}; exec {} ssh-connect %h %p'\n  ProxyUseFdpass yes\n",
        std::fs::read_to_string(sshd.ssh_config()).unwrap(),
        used.display(),
        bin()
    );
    std::fs::write(&config, text).unwrap();
    let r = over_ssh_with(&config, &mark, &args).run();
    let ctx2 = ctx(&r, &sshd);
    assert_eq!(r.code(), Some(0), "{ctx2}");
    assert!(
        r.err().contains(
            "ssh to 127.0.0.2: ssh's own connection (its ssh configuration sets ProxyCommand)"
        ),
        "{ctx2}"
    );
    let mut hosts: Vec<String> = std::fs::read_to_string(&used)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect();
    hosts.sort();
    assert_eq!(
        hosts,
        ["127.0.0.2", "127.0.0.3"],
        "the user's ProxyCommand made both connections\n{ctx2}"
    );

    let r = over_ssh(&sshd, &mark, &args)
        .env("ATLASBOOST_SSH_NODELAY", "0")
        .run();
    let ctx2 = ctx(&r, &sshd);
    assert_eq!(r.code(), Some(0), "{ctx2}");
    assert!(
        r.err()
            .contains("ssh to 127.0.0.2: ssh's own connection (ATLASBOOST_SSH_NODELAY=0)"),
        "{ctx2}"
    );
}

/// `atlasboost ssh-connect HOST PORT` connects, sets TCP_NODELAY and sends the connected
/// socket on its standard output, as ssh's `ProxyUseFdpass` expects; a refused connection
/// and a standard output that is no socket are named.
#[test]
fn ssh_connect_hands_over_a_connected_socket_with_nodelay() {
    use std::io::IoSliceMut;
    use std::net::{SocketAddr, TcpListener};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::net::UnixStream;
    use std::process::{Command, Stdio};

    use nix::cmsg_space;
    use nix::sys::socket::{
        ControlMessageOwned, MsgFlags, SockaddrStorage, getpeername, getsockopt, recvmsg, sockopt,
    };

    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let (ours, theirs) = UnixStream::pair().unwrap();
    let out = Command::new(atlasboost_bin())
        .args(["ssh-connect", "127.0.0.1", &port])
        .stdout(Stdio::from(OwnedFd::from(theirs)))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ssh-connect: {:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let mut byte = [0u8; 1];
    let mut iov = [IoSliceMut::new(&mut byte)];
    let mut space = cmsg_space!([std::os::fd::RawFd; 1]);
    let msg = recvmsg::<()>(
        ours.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::empty(),
    )
    .unwrap();
    let fds: Vec<_> = msg
        .cmsgs()
        .unwrap()
        .filter_map(|c| match c {
            ControlMessageOwned::ScmRights(fds) => Some(fds),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(fds.len(), 1, "one descriptor came over stdout: {fds:?}");
    // SAFETY: the descriptor was just received, and nothing else owns it.
    let socket = unsafe { OwnedFd::from_raw_fd(fds[0]) };
    assert!(
        getsockopt(&socket, sockopt::TcpNoDelay).unwrap(),
        "TCP_NODELAY is on"
    );
    let peer: SockaddrStorage = getpeername(socket.as_raw_fd()).unwrap();
    assert_eq!(
        peer.as_sockaddr_in()
            .map(|a| SocketAddr::from(std::net::SocketAddrV4::from(*a))),
        Some(listener.local_addr().unwrap()),
        "connected to the listener"
    );
    let (_, from) = listener.accept().unwrap();
    let local: SockaddrStorage = nix::sys::socket::getsockname(socket.as_raw_fd()).unwrap();
    assert_eq!(
        local
            .as_sockaddr_in()
            .map(|a| SocketAddr::from(std::net::SocketAddrV4::from(*a))),
        Some(from),
        "the listener accepted this very connection"
    );

    // Nothing listens on a port just freed.
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port().to_string()
    };
    let (_keep, theirs) = UnixStream::pair().unwrap();
    let out = Command::new(atlasboost_bin())
        .args(["ssh-connect", "127.0.0.1", &closed, "--timeout", "5"])
        .stdout(Stdio::from(OwnedFd::from(theirs)))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(255), "{err}");
    assert!(
        err.contains(&format!("cannot connect to 127.0.0.1 port {closed}")),
        "{err}"
    );

    let out = Command::new(atlasboost_bin())
        .args(["ssh-connect", "127.0.0.1", &port])
        .stdout(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(255), "{err}");
    assert!(
        err.contains("cannot hand the connection to 127.0.0.1 port")
            && err.contains("started by ssh, with ProxyUseFdpass=yes"),
        "{err}"
    );
}
