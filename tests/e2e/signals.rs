//! Signals to the launcher (SPEC: exit codes): SIGINT and SIGTERM are passed on to every
//! worker's group, SIGKILL follows after `--grace`, a second SIGINT kills at once.

use std::time::{Duration, Instant};

use atlasboost_e2e::{LAUNCH_MARK, Launch, Run, assert_no_process_with_env};
use nix::sys::signal::Signal;

/// A Python worker that says `ready` and sleeps a minute: SIGINT ends it with
/// KeyboardInterrupt, SIGTERM kills it.
const SLEEPER: &str = "import time\nprint('ready', flush=True)\ntime.sleep(60)\n";

/// A Python worker that survives SIGINT: it prints `got SIGINT` each time and goes on.
const STUBBORN: &str = r#"
import signal, sys, time
def on_int(signum, frame):
    print("got SIGINT", flush=True)
signal.signal(signal.SIGINT, on_int)
print("ready", flush=True)
deadline = time.time() + 60
while time.time() < deadline:
    time.sleep(0.05)
"#;

fn start(ranks: &str, grace: &str, worker: &[&str]) -> Launch {
    Run::new([
        "run",
        "--sim",
        ranks,
        "-H",
        "127.0.0.1",
        "--grace",
        grace,
        "--",
    ])
    .args(worker)
    .timeout(Duration::from_secs(60))
    .spawn()
}

/// Everything the launch started (lifeline, workers) is gone soon after it exited.
fn assert_all_gone(mark: &str, context: &str) {
    assert_no_process_with_env(LAUNCH_MARK, mark, Duration::from_secs(3), context);
}

#[test]
fn sigint_is_passed_to_the_workers_and_exits_130() {
    let mut launch = start("4", "30", &["python3", "-c", SLEEPER]);
    launch.wait_for_lines("]<stdout>:ready", 4, Duration::from_secs(20));
    let mark = launch.mark().to_string();
    let sent = Instant::now();
    launch.signal(Signal::SIGINT);
    let r = launch.wait_at_most(Duration::from_secs(20));
    let took = sent.elapsed();
    r.assert_code(130);
    assert!(
        took < Duration::from_secs(10),
        "workers end on SIGINT at once (--grace 30, sleep 60), yet the launcher took {took:?}\n{}",
        r.describe()
    );
    for rank in 0..4 {
        assert!(
            r.err()
                .contains(&format!("[{rank}]<stderr>:KeyboardInterrupt")),
            "rank {rank} got SIGINT (KeyboardInterrupt)\n{}",
            r.describe()
        );
    }
    let error = r.the_error_line(&r.describe());
    assert!(error.contains("SIGINT"), "{error}");
    assert_all_gone(&mark, "after SIGINT");
}

/// A worker that finished (exit 0) before a SIGINT, but whose end the launcher reads together
/// with the signal (a loaded machine, or here a launcher held with SIGSTOP, reads both in one
/// batch, SIGINT first), succeeded: it is not counted as stopped.
#[test]
fn a_worker_that_finished_before_ctrl_c_succeeded() {
    // Rank 0 ends a second after it said `up`, in processes named by this launch's mark from
    // before it says so (so that none of them is gone yet when the test sees the line).
    let worker = "if [ \"$RANK_ID\" = 0 ]; then \
                  exec env FINISHED_FIRST=\"$ATLASBOOST_E2E_LAUNCH\" sh -c 'echo up; sleep 1'; fi; \
                  echo up; exec sleep 30";
    let mut launch = start("2", "30", &["sh", "-c", worker]);
    launch.wait_for_lines("]<stdout>:up", 2, Duration::from_secs(20));
    let mark = launch.mark().to_string();
    launch.signal(Signal::SIGSTOP);
    // Gone from /proc (a zombie has no environment to read): it has exited.
    let finished = atlasboost_e2e::wait_until(Duration::from_secs(20), || {
        atlasboost_e2e::pids_with_env("FINISHED_FIRST", &mark).is_empty()
    });
    launch.signal(Signal::SIGINT);
    launch.signal(Signal::SIGCONT);
    let r = launch.wait_at_most(Duration::from_secs(20));
    assert!(finished, "rank 0 did not finish\n{}", r.describe());
    r.assert_code(130);
    assert!(
        r.err().contains("2 ranks finished in")
            && r.err().contains(": 1 succeeded, 0 failed, 1 stopped"),
        "{}",
        r.describe()
    );
    assert_all_gone(&mark, "after SIGINT");
}

/// The workers are shells with a background child each: SIGTERM reaches the whole group.
#[test]
fn sigterm_is_passed_to_the_workers_and_their_children_and_exits_143() {
    let mut launch = start(
        "2",
        "30",
        &[
            "sh",
            "-c",
            "sleep 300 & echo ready; sleep 300; echo 'not stopped'",
        ],
    );
    launch.wait_for_lines("]<stdout>:ready", 2, Duration::from_secs(20));
    let mark = launch.mark().to_string();
    let sent = Instant::now();
    launch.signal(Signal::SIGTERM);
    let r = launch.wait_at_most(Duration::from_secs(20));
    let took = sent.elapsed();
    r.assert_code(143);
    assert!(
        took < Duration::from_secs(10),
        "took {took:?}\n{}",
        r.describe()
    );
    assert_all_gone(&mark, "after SIGTERM");
}

/// Workers whose SIGTERM handler exits 0 were stopped, not successful: the summary says so.
#[test]
fn workers_that_exit_0_when_stopped_are_counted_stopped() {
    let mut launch = start(
        "2",
        "30",
        &[
            "sh",
            "-c",
            "trap 'exit 0' TERM; echo ready; sleep 300 & wait",
        ],
    );
    launch.wait_for_lines("]<stdout>:ready", 2, Duration::from_secs(20));
    launch.signal(Signal::SIGTERM);
    let r = launch.wait_at_most(Duration::from_secs(20));
    r.assert_code(143).assert_err(
        &[": 0 succeeded, 0 failed, 2 stopped"],
        &["succeeded, 0 failed, 0 stopped"],
    );
    let stopped = r
        .err()
        .lines()
        .filter(|l| l.contains(" stopped (exit 0) "))
        .count();
    assert_eq!(stopped, 2, "{}", r.describe());
}

#[test]
fn a_second_sigint_kills_at_once() {
    let mut launch = start("2", "60", &["python3", "-c", STUBBORN]);
    launch.wait_for_lines("]<stdout>:ready", 2, Duration::from_secs(20));
    let mark = launch.mark().to_string();
    launch.signal(Signal::SIGINT);
    // Both workers got the first SIGINT and go on.
    launch.wait_for_lines("]<stdout>:got SIGINT", 2, Duration::from_secs(10));
    assert!(
        launch.is_running(),
        "the launcher waits --grace 60 for workers that survive SIGINT"
    );
    // A second press, not the first delivered twice (within 100 ms of it: a_signal_delivered_
    // twice_at_once_is_one).
    std::thread::sleep(Duration::from_millis(200));
    let sent = Instant::now();
    launch.signal(Signal::SIGINT);
    let r = launch.wait_at_most(Duration::from_secs(20));
    let took = sent.elapsed();
    r.assert_code(130);
    assert!(
        took < Duration::from_secs(5),
        "a second SIGINT kills at once (not after --grace 60), yet it took {took:?}\n{}",
        r.describe()
    );
    assert_all_gone(&mark, "after a second SIGINT");
}

/// One SIGTERM delivered twice at once (`timeout` sends it to its child, then to its whole
/// process group): the workers still get their grace time, as for one.
#[test]
fn a_signal_delivered_twice_at_once_is_one() {
    let mut launch = start(
        "2",
        "2",
        &[
            "sh",
            "-c",
            "trap 'echo got SIGTERM' TERM; echo ready; i=0; \
             while [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done",
        ],
    );
    launch.wait_for_lines("]<stdout>:ready", 2, Duration::from_secs(20));
    let sent = Instant::now();
    launch.signal(Signal::SIGTERM);
    // The second after the launcher has read the first (two pending deliveries of one signal
    // merge into one): as soon as it says so, which must be within the 100 ms of an echo.
    launch.wait_for("the first SIGTERM", Duration::from_secs(10), |_, err| {
        err.contains("got SIGTERM; passing it on")
    });
    // Within half the window: the launcher then has the other half to read the second.
    let echo = sent.elapsed() < Duration::from_millis(50);
    if echo {
        launch.signal(Signal::SIGTERM);
    } else {
        eprintln!(
            "a_signal_delivered_twice_at_once_is_one: no second SIGTERM sent: the launcher took \
             {:?} to say it got the first (a busy machine), too late for an echo",
            sent.elapsed()
        );
    }
    let r = launch.wait_at_most(Duration::from_secs(20));
    let took = sent.elapsed();
    r.assert_code(143)
        .assert_err(&["got SIGTERM; passing it on"], &["killing them now"]);
    assert!(
        took >= Duration::from_millis(1900),
        "the workers had --grace 2 before SIGKILL, not {took:?}\n{}",
        r.describe()
    );
}

#[test]
fn workers_ignoring_sigint_are_killed_after_the_grace_time() {
    let mut launch = start(
        "2",
        "1",
        &[
            "sh",
            "-c",
            "trap '' INT; echo ready; sleep 60; echo 'not killed'",
        ],
    );
    launch.wait_for_lines("]<stdout>:ready", 2, Duration::from_secs(20));
    let mark = launch.mark().to_string();
    let sent = Instant::now();
    launch.signal(Signal::SIGINT);
    let r = launch.wait_at_most(Duration::from_secs(30));
    let took = sent.elapsed();
    r.assert_code(130);
    assert!(
        took < Duration::from_secs(10),
        "--grace 1: SIGKILL a second after SIGINT, yet it took {took:?}\n{}",
        r.describe()
    );
    assert!(!r.out().contains("not killed"), "{}", r.describe());
    assert_all_gone(&mark, "after SIGINT and the grace time");
}

/// A background child of a shell worker ignores SIGINT (POSIX: asynchronous lists of a
/// non-interactive shell do). After SIGINT every worker exits, and the child still runs: the
/// launcher must stop it as it stops any leftover (SIGTERM, which it does not ignore) rather
/// than wait out `--grace` for SIGKILL.
#[test]
fn after_sigint_a_leftover_grandchild_is_stopped_without_waiting_the_grace_time() {
    let mut launch = start(
        "2",
        "10",
        &[
            "sh",
            "-c",
            "sleep 300 & exec python3 -c \"import time; print('ready', flush=True); time.sleep(100)\"",
        ],
    );
    launch.wait_for_lines("]<stdout>:ready", 2, Duration::from_secs(20));
    let mark = launch.mark().to_string();
    let sent = Instant::now();
    launch.signal(Signal::SIGINT);
    let r = launch.wait_at_most(Duration::from_secs(30));
    let took = sent.elapsed();
    r.assert_code(130);
    assert!(
        took < Duration::from_secs(5),
        "every worker exited on SIGINT at once; their background children (which ignore \
         SIGINT, not SIGTERM) should then be stopped with SIGTERM, yet the launcher took \
         {took:?} (--grace 10)\n{}",
        r.describe()
    );
    assert_all_gone(&mark, "after SIGINT");
}

/// After SIGINT the workers exit at once, but one left a process outside their groups that
/// ignores SIGTERM: the launcher waits the grace time for it, and says so (what it waits for,
/// when SIGKILL comes, how to cut it short), instead of waiting silently.
#[test]
fn a_stop_that_waits_for_a_leftover_says_so() {
    let mut launch = start(
        "2",
        "3",
        &[
            "sh",
            "-c",
            "(trap '' TERM INT HUP; exec setsid sleep 300) & echo ready; exec sleep 300",
        ],
    );
    launch.wait_for_lines("]<stdout>:ready", 2, Duration::from_secs(20));
    let mark = launch.mark().to_string();
    // The setsid children are running (they start a moment after "ready"): 4 `sleep`s that
    // lead their own group, the workers' and theirs (each after its trap).
    let all_up = atlasboost_e2e::wait_until(Duration::from_secs(10), || {
        atlasboost_e2e::pids_with_env(LAUNCH_MARK, &mark)
            .iter()
            .filter(|p| p.comm == "sleep" && p.pgrp == p.pid)
            .count()
            == 4
    });
    assert!(all_up, "the workers' setsid children did not start");
    launch.signal(Signal::SIGINT);
    let r = launch.wait_at_most(Duration::from_secs(30));
    r.assert_code(130).assert_err(
        &[
            "atlasboost: every worker has exited; waiting for what they left running (",
            "left their workers' groups) (SIGKILL in ",
            "; Ctrl-C to kill it now)",
        ],
        &[],
    );
    assert_all_gone(&mark, "after SIGINT and the grace time");
}

/// Runs `worker` on 2 ranks with the launcher's stdout a pipe nobody reads; once `ready`
/// (given the job's mark and the workers' directory) says so, sends `signal`; returns the exit
/// status (`None`: still running 20 s later, then killed) and stderr.
fn with_a_console_nobody_reads(
    worker: &str,
    ready: impl FnOnce(&str, &std::path::Path),
    signal: Signal,
) -> (Option<std::process::ExitStatus>, String) {
    let mark = atlasboost_e2e::unique("stuck-console");
    // stdout is a pipe that this test holds open and never reads (close-on-exec: a job that
    // the other test thread starts meanwhile must not hold it too).
    let (unread, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    // A directory of its own: its rank table is this job's alone.
    let wdir = tempfile::tempdir().unwrap();
    let mut launcher = std::process::Command::new(atlasboost_e2e::atlasboost_bin())
        .args(["run", "--sim", "2", "-H", "127.0.0.1", "--grace", "1"])
        .args(["-x", &format!("ATLASBOOST_E2E_MARK={mark}")])
        .args(["--", "sh", "-c", worker])
        .current_dir(wdir.path())
        .env(LAUNCH_MARK, &mark)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::from(write))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = launcher.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
        text
    });
    ready(&mark, wdir.path());
    let pid = nix::unistd::Pid::from_raw(launcher.id() as i32);
    nix::sys::signal::kill(pid, signal).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = launcher.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = launcher.kill();
            let _ = launcher.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    drop(unread);
    let err = reader.join().unwrap();
    assert_no_process_with_env(
        "ATLASBOOST_E2E_MARK",
        &mark,
        Duration::from_secs(3),
        "after the launcher whose console nobody read",
    );
    (status, err)
}

/// A console nobody reads (`| less` left alone, a paused terminal) must not keep the launcher
/// from hearing a signal: SIGTERM is passed on, the grace time runs, and the launcher ends
/// 143, saying that it left output unshown, with nothing of the job left behind.
#[test]
fn sigterm_is_heard_while_nobody_reads_the_console() {
    // Both workers run, and the pipe (64 KiB) is long full.
    let (status, err) = with_a_console_nobody_reads(
        "exec yes stuck-console-line",
        |_, _| std::thread::sleep(Duration::from_secs(2)),
        Signal::SIGTERM,
    );
    let status =
        status.unwrap_or_else(|| panic!("still running 20 s after SIGTERM (--grace 1)\n{err}"));
    assert_eq!(status.code(), Some(143), "{err}");
    // Given up within the grace time, during the stop or in the final wait, and said to be
    // for the signal, not for an end that waited.
    assert!(
        err.contains("the console took nothing more, and a signal asked to stop ")
            || err.contains("the console took nothing more, and a signal came"),
        "{err}"
    );
}

/// Workers that have all ended leave lines the console has not taken; the launcher waits for
/// it, but a Ctrl-C then ends the wait: 130, and the lines left are counted.
#[test]
fn ctrl_c_ends_the_wait_for_a_console_nobody_reads() {
    let (status, err) = with_a_console_nobody_reads(
        // About 350 KB per rank, tagged: all read (under the 1 MiB held back), more than the
        // pipe takes. Each says it is done in a file (a worker not yet started is not one
        // that has ended).
        "seq 1 20000; touch done.$RANK_ID",
        |mark, wdir| {
            let ended = atlasboost_e2e::wait_until(Duration::from_secs(20), || {
                wdir.join("done.0").exists()
                    && wdir.join("done.1").exists()
                    && atlasboost_e2e::pids_with_env("ATLASBOOST_E2E_MARK", mark).is_empty()
            });
            assert!(ended, "the workers did not end");
            std::thread::sleep(Duration::from_millis(300));
        },
        Signal::SIGINT,
    );
    let status = status.unwrap_or_else(|| panic!("still running 20 s after SIGINT\n{err}"));
    assert_eq!(status.code(), Some(130), "{err}");
    // Heard in the final wait ("a signal came") or, on a slow machine, just before it.
    assert!(err.contains("the console took nothing more, and "), "{err}");
    assert!(err.contains("2 succeeded"), "{err}");
}

/// A worker fails while nobody reads the console: the stop the failure starts cannot finish
/// writing, and a signal then still ends the wait (it sets no "interrupted" of its own, since
/// the failure already stops the job).
#[test]
fn a_signal_ends_a_failed_jobs_wait_for_a_console_nobody_reads() {
    let (status, err) = with_a_console_nobody_reads(
        "if [ $RANK_ID = 0 ]; then exec yes stuck-console-line; fi; sleep 1; touch failing; \
         exit 3",
        |mark, wdir| {
            // Rank 1 has failed: at most rank 0's `yes` is left (the stop may have ended it).
            let failed = atlasboost_e2e::wait_until(Duration::from_secs(20), || {
                wdir.join("failing").exists()
                    && atlasboost_e2e::pids_with_env("ATLASBOOST_E2E_MARK", mark).len() <= 1
            });
            assert!(failed, "rank 1 did not fail");
            std::thread::sleep(Duration::from_millis(500));
        },
        Signal::SIGTERM,
    );
    assert!(status.is_some(), "still running 20 s after SIGTERM\n{err}");
    assert!(err.contains("the console took nothing more, and "), "{err}");
    assert!(
        err.contains("rank 1 (host 127.0.0.1, device 1) failed"),
        "{err}"
    );
}

/// Under `nohup` (SIGHUP ignored), a SIGHUP, as a closed terminal sends, does not stop the
/// job: an ignored signal stays ignored.
#[test]
fn an_ignored_sighup_does_not_stop_the_job() {
    use std::os::unix::process::CommandExt;
    let wdir = tempfile::tempdir().unwrap();
    let mut cmd = std::process::Command::new(atlasboost_e2e::atlasboost_bin());
    cmd.args(["run", "--sim", "2", "-H", "127.0.0.1", "--", "sh", "-c"])
        .arg("echo ready; sleep 2; echo done")
        .current_dir(wdir.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    // SAFETY: sets a disposition between fork and exec; no allocation, no lock.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::signal::signal(Signal::SIGHUP, nix::sys::signal::SigHandler::SigIgn)
                .map(|_| ())
                .map_err(std::io::Error::from)
        });
    }
    let mut child = cmd.spawn().unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut first = [0u8; 64];
    // The first bytes come once a worker runs.
    let n = std::io::Read::read(&mut out, &mut first).unwrap();
    assert!(n > 0);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        Signal::SIGHUP,
    )
    .unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(0), "{err}");
    assert_eq!(rest.matches(":done").count(), 2, "{rest}\n{err}");
}

/// A terminal paused with Ctrl-S (or an ssh link to the user's laptop that stalls) takes no
/// bytes while the workers print. The launcher writes it from a thread of its own, so a
/// SIGTERM meanwhile reaches the workers at once, not when the terminal resumes; the job then
/// ends 143.
#[test]
fn sigterm_is_heard_while_the_terminal_is_paused() {
    const PAUSED_FROM: Duration = Duration::from_secs(1);
    const PAUSE: Duration = Duration::from_secs(15);
    let launch = Run::new([
        "run",
        "--sim",
        "2",
        "-H",
        "127.0.0.1",
        "--grace",
        "5",
        "--",
        "sh",
        "-c",
        // Each worker notes that it runs, and then the SIGTERM, in files of its own.
        "trap 'touch stopped.$RANK_ID; exit 0' TERM; touch started.$RANK_ID; \
         yes paused-terminal-line & wait",
    ])
    .paused_terminal(PAUSED_FROM, PAUSE)
    .timeout(Duration::from_secs(60))
    .spawn();
    let resumes = PAUSED_FROM + PAUSE;
    let noted = |what: &str, rank: u32| launch.dir().join(format!("{what}.{rank}")).exists();
    let started = atlasboost_e2e::wait_until(Duration::from_secs(30), || {
        noted("started", 0) && noted("started", 1)
    });
    assert!(started, "the workers never started");
    // The terminal has been paused a while by then: `yes` has filled what it holds.
    while launch.elapsed() < PAUSED_FROM + Duration::from_secs(1) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let signalled = launch.elapsed();
    assert!(
        signalled + Duration::from_secs(5) < resumes,
        "the workers started too late ({signalled:?}) to tell a SIGTERM heard at once from one \
         heard when the terminal resumes ({resumes:?})"
    );
    launch.signal(Signal::SIGTERM);
    atlasboost_e2e::wait_until(Duration::from_secs(60), || {
        (noted("stopped", 0) && noted("stopped", 1)) || launch.elapsed() >= resumes
    });
    let at = launch.elapsed();
    assert!(
        noted("stopped", 0) && noted("stopped", 1) && at < resumes,
        "SIGTERM sent {signalled:?} after the start, and the workers noted it only at {at:?}, \
         when the terminal resumed ({resumes:?})"
    );
    let done = launch.wait();
    assert_eq!(done.code(), Some(143), "{}", done.describe());
}
