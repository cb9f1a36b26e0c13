//! The launcher–agent channel through a fake `ssh`: a script first on `PATH` that runs the
//! remote command here, through a relay that can cut the stream or stop reading it. These are
//! the failures a real network makes (a session that ends with its last data; a launcher
//! machine that vanishes without closing anything), without a network.

use std::time::Duration;

use atlasboost_e2e::{LAUNCH_MARK, Run, assert_no_process_with_env, kill_marked, unique};

/// Runs the remote command (its last argument) here. `E2E_CUT_AFTER=N`: pass N bytes of the
/// agent's output, then end it. `E2E_STALL_AFTER=N`: pass N bytes, then stop reading without
/// closing (a partitioned network). Passed on unbuffered, as ssh does: the rendezvous travels
/// on the same stream.
const FAKE_SSH: &str = r#"#!/bin/sh
for a; do last="$a"; done
if [ -n "$E2E_CUT_AFTER" ]; then
  sh -c "$last" | stdbuf -o0 head -c "$E2E_CUT_AFTER"
elif [ -n "$E2E_STALL_AFTER" ]; then
  sh -c "$last" | { stdbuf -o0 head -c "$E2E_STALL_AFTER"; exec sleep 60; }
else
  exec sh -c "$last"
fi
"#;

/// Workers that print without pause, marked so that they can be found.
const CHATTY: [&str; 4] = ["--", "sh", "-c", "while :; do echo a line of output; done"];

/// `run` with every host reached through the fake ssh.
fn with_fake_ssh(run: Run) -> Run {
    let ssh = run.file("fakebin/ssh", FAKE_SSH, true);
    let path = format!(
        "{}:{}",
        ssh.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    run.env("PATH", path).env("ATLASBOOST_SSH_ALL_HOSTS", "1")
}

/// A launch of 2 "remote" hosts through the fake ssh, `--grace 1`; `worker` marks the workers.
fn two_fake_hosts(worker: &str) -> Run {
    let run = Run::new([
        "run",
        "--sim",
        "1",
        "-H",
        "127.0.0.2:1,127.0.0.3:1",
        "--grace",
        "1",
        "-x",
    ])
    .args([format!("E2E_WORKER={worker}")]);
    // The agents' rank files in the launch's own directory: a test that kills an agent and its
    // guard leaves none in /tmp.
    let tmp = run.dir().to_path_buf();
    with_fake_ssh(run.env("TMPDIR", tmp))
}

/// [`two_fake_hosts`] of chatty workers, with the fake ssh told `relay`.
fn through_relay(relay: (&str, &str), worker: &str) -> Run {
    two_fake_hosts(worker)
        .env(relay.0, relay.1)
        .args(CHATTY)
        .timeout(Duration::from_secs(40))
}

#[test]
fn a_session_that_ends_with_its_last_data_is_seen_as_ended() {
    let worker = unique("relay-cut");
    let run = through_relay(("E2E_CUT_AFTER", "300000"), &worker);
    let mark = run.mark().to_string();
    let r = run.run();
    kill_marked(LAUNCH_MARK, &mark);
    r.assert_code(125);
    let error = r.the_error_line(&r.describe());
    assert!(
        error.contains("its ssh session ended (ssh exited ")
            && error.contains(") before its workers did"),
        "the end of the session is named, not a heartbeat timeout: {}",
        r.describe()
    );
    assert_no_process_with_env(
        "E2E_WORKER",
        &worker,
        Duration::from_secs(7),
        "after a cut session",
    );
}

#[test]
fn an_agent_whose_launcher_stops_reading_stops_its_workers() {
    let worker = unique("relay-stall");
    let run = through_relay(("E2E_STALL_AFTER", "300000"), &worker);
    let mark = run.mark().to_string();
    let r = run.run();
    // The launcher hears nothing more from the stalled hosts: lost, named.
    r.assert_code(125);
    assert!(
        r.err().contains("failed first"),
        "a host is named as lost: {}",
        r.describe()
    );
    // The agents cannot write, and the launcher gives them up: their sessions end (their
    // input closes), and they stop their workers, though the relay still holds their output
    // open.
    assert_no_process_with_env(
        "E2E_WORKER",
        &worker,
        Duration::from_secs(10),
        "workers of agents whose launcher stopped reading",
    );
    kill_marked(LAUNCH_MARK, &mark);
}

/// A console read only after longer than an agent may go unheard (`--host-timeout`, 4 s): the
/// launcher stops reading its agents while the console holds 1 MiB back, and each agent then
/// holds its workers' output back in turn. The launcher's heartbeats still reach the agents,
/// so none gives up: the job finishes, every line whole. Flat, and through a chain whose
/// interior agent holds back its child's output too.
#[test]
fn agents_wait_for_a_console_read_late() {
    for fanout in ["32", "1"] {
        let run = Run::new([
            "run",
            "--sim",
            "1",
            "-H",
            "127.0.0.2:1,127.0.0.3:1",
            "--fanout",
            fanout,
            "--",
            "seq",
            "1",
            "300000",
        ]);
        let r = with_fake_ssh(run)
            .nonblocking_stdout(Duration::from_secs(7))
            .timeout(Duration::from_secs(60))
            .run();
        r.assert_code(0);
        crate::assert_seq_by_rank(
            &r.out(),
            2,
            300_000,
            &format!("--fanout {fanout}\n{}", r.err()),
        );
    }
}

/// A terminal paused with Ctrl-S for longer than an agent may go unheard: the launcher is held
/// in a write to it (a message, a worker's line, the status line), and its loop sends no
/// heartbeats, but its heartbeat keeper does. The agents wait, the job finishes once Ctrl-Q
/// resumes the terminal, and every line is shown. Paused from the start (the launcher is held
/// before its workers start) and while the workers print (between their two bursts).
#[test]
fn a_terminal_paused_with_ctrl_s_does_not_end_a_multi_host_job() {
    const LINES: usize = 50_000;
    for after in [Duration::ZERO, Duration::from_millis(1500)] {
        let run = Run::new([
            "run",
            "--sim",
            "1",
            "-H",
            "127.0.0.2:1,127.0.0.3:1",
            "--",
            "sh",
            "-c",
            &format!(
                "seq 1 {}; sleep 3; seq {} {LINES}",
                LINES / 2,
                LINES / 2 + 1
            ),
        ]);
        let r = with_fake_ssh(run)
            .paused_terminal(after, Duration::from_secs(7))
            .timeout(Duration::from_secs(60))
            .run();
        let shown = r.out();
        assert_eq!(
            r.code(),
            Some(0),
            "paused after {after:?}: {}",
            r.describe()
        );
        for rank in 0..2 {
            assert_eq!(
                shown.matches(&format!("[{rank}]<stdout>:")).count(),
                LINES,
                "paused after {after:?}: rank {rank}'s lines on the terminal\n{}",
                r.describe()
            );
        }
        assert!(
            shown.contains("2 succeeded"),
            "paused after {after:?}: the summary: {}",
            r.describe()
        );
    }
}

/// A launcher stopped (SIGSTOP: alive, its connections open, silent) while its agents' output
/// waits for it: they hear no heartbeat, give it up and its output with it, stop their
/// workers and exit, rather than hold the output back for a launcher that is gone. Each worker
/// left a child in a session of its own holding its stdout, which only the agent's orphan
/// hunt ends: an agent that still held the output back would never read that pipe again.
#[test]
fn agents_of_a_stopped_launcher_give_it_up_though_their_output_waits() {
    let worker = unique("relay-sigstop");
    let run = two_fake_hosts(&worker)
        .args([
            "--",
            "sh",
            "-c",
            "setsid sleep 300 & while :; do echo a line of output; done",
        ])
        .timeout(Duration::from_secs(60));
    let launch = run.spawn();
    let mark = launch.mark().to_string();
    let agents = || {
        atlasboost_e2e::pids_with_env(LAUNCH_MARK, &mark)
            .into_iter()
            .filter(|p| {
                atlasboost_e2e::cmdline(p.pid).is_some_and(|c| c.iter().any(|a| a == "agent"))
            })
            .count()
    };
    assert!(
        atlasboost_e2e::wait_until(Duration::from_secs(20), || {
            atlasboost_e2e::pids_with_env("E2E_WORKER", &worker).len() >= 4
        }),
        "the workers did not start"
    );
    // Output piles up behind the stopped launcher.
    std::thread::sleep(Duration::from_secs(1));
    launch.signal(nix::sys::signal::Signal::SIGSTOP);
    let gone = atlasboost_e2e::wait_until(Duration::from_secs(15), || agents() == 0);
    let left = agents();
    launch.signal(nix::sys::signal::Signal::SIGKILL);
    launch.signal(nix::sys::signal::Signal::SIGCONT);
    assert!(
        gone,
        "{left} agents still run 15 s after their launcher stopped"
    );
    assert_no_process_with_env(
        "E2E_WORKER",
        &worker,
        Duration::from_secs(5),
        "the workers of a stopped launcher's agents",
    );
}
