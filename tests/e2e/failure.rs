//! A failing worker ends the job: its exit code is the launcher's, it is named with its last
//! stderr lines, and the other workers are stopped (SPEC: exit codes).

use std::time::Duration;

use atlasboost_e2e::{
    Finished, Run, assert_no_process_with_env, example, proc_stat, unique, wait_until,
};
use nix::sys::signal::Signal;

const MARK: &str = "ATLASBOOST_E2E_MARK";

/// The summary row of `rank` on stderr (`rank host device status time`): what follows the
/// host, words joined by one space.
fn summary_row(r: &Finished, rank: u32) -> String {
    let err = r.err();
    let rows: Vec<String> = err
        .lines()
        .filter(|l| l.starts_with(' '))
        .filter_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            (words.len() >= 5 && words[0] == rank.to_string() && words[1].starts_with("127."))
                .then(|| words[2..].join(" "))
        })
        .collect();
    assert_eq!(
        rows.len(),
        1,
        "one summary row for rank {rank}\n{}",
        r.describe()
    );
    rows.into_iter().next().unwrap_or_default()
}

/// The one `error:` line and everything after it on stderr.
fn error_report(r: &Finished) -> (String, String) {
    let line = r.the_error_line(&r.describe());
    let err = r.err();
    let at = err.find(&line).unwrap();
    let rest = err[at..].to_string();
    (line, rest)
}

#[test]
fn a_failing_rank_gives_its_exit_code_and_stops_the_others() {
    let mark = unique("fail");
    let train = example("train.py");
    let r = Run::new(["run", "--sim", "4", "-H", "127.0.0.1", "--grace", "5"])
        .args(["-x", &format!("{MARK}={mark}"), "--", "python3"])
        .args([train.as_os_str()])
        .args(["--steps", "3", "--sleep", "60", "--fail-rank", "2"])
        .args(["--fail-step", "1", "--exit-code", "7"])
        .timeout(Duration::from_secs(40))
        .run();
    r.assert_code(7);
    assert!(
        r.elapsed < Duration::from_secs(20),
        "the other ranks (sleeping 60 s) were not stopped: the run took {:?}\n{}",
        r.elapsed,
        r.describe()
    );
    let (line, report) = error_report(&r);
    assert!(
        line.starts_with("error: rank 2 (host 127.0.0.1, device 2) failed first: exit 7"),
        "the error names rank 2, its host, device and exit code: {line}"
    );
    assert!(
        report.contains("rank 2: failing on purpose (--fail-rank) at step 1"),
        "the error shows rank 2's last stderr line\n{}",
        r.describe()
    );
    for rank in [0, 1, 3] {
        let row = summary_row(&r, rank);
        assert!(
            !row.contains("exit 0"),
            "rank {rank} was stopped, not finished: {row}"
        );
    }
    let row = summary_row(&r, 2);
    assert!(row.contains("exit 7"), "rank 2's summary row: {row}");
    assert_no_process_with_env(MARK, &mark, Duration::from_secs(3), "after the failed job");
}

#[test]
fn a_rank_killed_by_a_signal_gives_128_plus_the_signal() {
    let mark = unique("sig");
    let r = Run::new(["run", "--sim", "2", "-H", "127.0.0.1", "--grace", "5"])
        .args(["-x", &format!("{MARK}={mark}"), "--", "sh", "-c"])
        .args([r#"echo up; if [ "$RANK_ID" = 1 ]; then kill -KILL $$; fi; sleep 60"#])
        .timeout(Duration::from_secs(40))
        .run();
    r.assert_code(128 + 9);
    assert!(r.elapsed < Duration::from_secs(20), "{}", r.describe());
    let (line, _) = error_report(&r);
    assert!(
        line.starts_with("error: rank 1 (host 127.0.0.1, device 1) failed first"),
        "{line}"
    );
    assert_no_process_with_env(MARK, &mark, Duration::from_secs(3), "after the failed job");
}

/// A real-time signal (which nix's `Signal` cannot name) ends a worker as any other: the job
/// fails at once with 128+N, and the rank is named with the signal as `kill -l` says it. It
/// once went unnoticed, and the launcher waited for ever. On two hosts: one local, one behind
/// its own agent, whose report crosses the channel.
#[test]
fn a_rank_killed_by_a_real_time_signal_fails_the_job() {
    let mark = unique("rtsig");
    for (signal, name) in [(34, "SIGRTMIN"), (50, "SIGRTMAX-14")] {
        for failing in [0, 1] {
            let script = format!(
                r#"echo up; if [ "$RANK_ID" = {failing} ]; then kill -{signal} $$; fi; sleep 60"#
            );
            let r = Run::new([
                "run",
                "--sim",
                "1",
                "-H",
                "127.0.0.1,127.0.0.2",
                "--grace",
                "5",
            ])
            .args(["-x", &format!("{MARK}={mark}"), "--", "sh", "-c", &script])
            .timeout(Duration::from_secs(40))
            .run();
            r.assert_code(128 + signal);
            assert!(r.elapsed < Duration::from_secs(20), "{}", r.describe());
            let (line, _) = error_report(&r);
            assert!(
                line.starts_with(&format!(
                    "error: rank {failing} (host 127.0.0.{}, device 0) failed first: {name} after",
                    failing + 1
                )),
                "{line}\n{}",
                r.describe()
            );
            let row = summary_row(&r, failing);
            assert!(
                row.starts_with(&format!("0 {name} ")),
                "{row}\n{}",
                r.describe()
            );
        }
    }
    assert_no_process_with_env(MARK, &mark, Duration::from_secs(3), "after the failed jobs");
}

/// The other ranks ignore SIGTERM (or exit with another code on it): the first failure's
/// code still wins, and they are killed when the grace time is over.
#[test]
fn workers_that_resist_sigterm_are_killed_after_the_grace_time() {
    let mark = unique("resist");
    // Ranks 1-3 get ready (rank 1 exits 5 on SIGTERM, 2 and 3 ignore it), then rank 0 fails.
    let script = r#"
        case "$RANK_ID" in
        0)  i=0
            while [ ! -e up.1 ] || [ ! -e up.2 ] || [ ! -e up.3 ]; do
                i=$((i + 1)); [ $i -gt 200 ] && { echo "others never got ready" >&2; exit 99; }
                sleep 0.05
            done
            echo "rank 0 gives up" >&2; exit 3 ;;
        1)  trap 'exit 5' TERM ;;
        *)  trap '' TERM ;;
        esac
        touch "up.$RANK_ID"
        i=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
    "#;
    let r = Run::new(["run", "--sim", "4", "-H", "127.0.0.1", "--grace", "1"])
        .args(["-x", &format!("{MARK}={mark}"), "--", "sh", "-c", script])
        .timeout(Duration::from_secs(40))
        .run();
    r.assert_code(3);
    assert!(
        r.elapsed < Duration::from_secs(15),
        "--grace 1: workers ignoring SIGTERM are killed a second after it, yet the run took \
         {:?}\n{}",
        r.elapsed,
        r.describe()
    );
    let (line, report) = error_report(&r);
    assert!(
        line.starts_with("error: rank 0 (host 127.0.0.1, device 0) failed first: exit 3"),
        "{line}"
    );
    assert!(report.contains("rank 0 gives up"), "{}", r.describe());
    // The wait for them is said as it begins, and how to cut it short.
    assert!(
        r.err().contains(
            "failed (exit 3); stopping the other 3 workers (SIGKILL in 1s to those that have \
             not exited; Ctrl-C to kill them now)"
        ),
        "{}",
        r.describe()
    );
    let row = summary_row(&r, 1);
    assert!(row.contains("exit 5"), "rank 1 exits 5 on SIGTERM: {row}");
    for rank in [2, 3] {
        let row = summary_row(&r, rank);
        assert!(
            row.contains("SIGKILL"),
            "rank {rank} ignored SIGTERM: {row}"
        );
    }
    assert_no_process_with_env(MARK, &mark, Duration::from_secs(3), "after the failed job");
}

/// A worker stopped by SIGSTOP (a debugger's, or its own) is continued after the SIGTERM of
/// a stop, so that it acts on it, instead of waiting out the grace for SIGKILL.
#[test]
fn a_stopped_worker_is_continued_to_act_on_sigterm() {
    let script = r#"
        case "$RANK_ID" in
        0)  i=0
            while [ ! -e up.1 ]; do
                i=$((i + 1)); [ $i -gt 200 ] && { echo "rank 1 never got ready" >&2; exit 99; }
                sleep 0.05
            done
            sleep 0.3; echo "rank 0 gives up" >&2; exit 3 ;;
        1)  trap 'echo "rank 1 got SIGTERM" >&2; exit 5' TERM
            touch up.1; kill -STOP $$
            sleep 60 ;;
        esac
    "#;
    let r = Run::new(["run", "--sim", "2", "-H", "127.0.0.1", "--grace", "30"])
        .args(["--", "sh", "-c", script])
        .timeout(Duration::from_secs(60))
        .run();
    r.assert_code(3);
    assert!(
        r.elapsed < Duration::from_secs(15),
        "the stopped rank waited out the grace: {:?}\n{}",
        r.elapsed,
        r.describe()
    );
    let row = summary_row(&r, 1);
    assert!(
        row.contains("stopped (exit 5)"),
        "rank 1 acted on SIGTERM: {row}"
    );
    assert!(
        r.err().contains("[1]<stderr>:rank 1 got SIGTERM"),
        "{}",
        r.describe()
    );
}

/// Ranks that fail in the same moment each failed on their own: none is counted as stopped by
/// the other's failure. The launcher is paused (SIGSTOP) while both exit, so that it finds
/// both exits at once, whatever the machine's timing.
#[test]
fn ranks_that_fail_together_are_failed_not_stopped() {
    let mut launch = Run::new(["run", "--sim", "2", "-H", "127.0.0.1", "--", "sh", "-c"])
        .args(["echo ready; while [ ! -e go ]; do sleep 0.01; done; exit $((RANK_ID + 3))"])
        .timeout(Duration::from_secs(40))
        .spawn();
    launch.wait_for_lines("]<stdout>:ready", 2, Duration::from_secs(20));
    let launcher = launch.pid();
    let workers: Vec<i32> = atlasboost_e2e::descendants(launcher)
        .into_iter()
        .filter(|p| p.ppid == launcher && p.comm == "sh")
        .map(|p| p.pid)
        .collect();
    assert_eq!(workers.len(), 2, "two workers, the launcher's children");
    launch.signal(Signal::SIGSTOP);
    std::fs::write(launch.dir().join("go"), "").unwrap();
    let both_exited = wait_until(Duration::from_secs(10), || {
        workers
            .iter()
            .all(|&pid| proc_stat(pid).is_none_or(|p| !p.alive()))
    });
    launch.signal(Signal::SIGCONT);
    assert!(
        both_exited,
        "the workers did not exit while the launcher was paused"
    );
    let r = launch.wait_at_most(Duration::from_secs(20));
    assert!(matches!(r.code(), Some(3 | 4)), "{}", r.describe());
    assert!(
        r.err().contains(": 0 succeeded, 2 failed, 0 stopped"),
        "{}",
        r.describe()
    );
    // The row after the host: device, status, time.
    assert!(
        summary_row(&r, 0).starts_with("0 exit 3 "),
        "{}",
        r.describe()
    );
    assert!(
        summary_row(&r, 1).starts_with("1 exit 4 "),
        "{}",
        r.describe()
    );
    assert!(!r.err().contains("stopping the other"), "{}", r.describe());
}
