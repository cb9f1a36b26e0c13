//! The live status block (SPEC §13), read off a real terminal: a job runs in `tmux`, and its
//! screen is captured with `capture-pane` while it runs.

use std::process::Command;
use std::time::{Duration, Instant};

use atlasboost_e2e::{atlasboost_bin, unique};

/// `ATLASBOOST_E2E_REQUIRE_TMUX=1` (set by scripts/test.sh, which installs tmux) turns a
/// missing tmux into a failure instead of a skip.
const REQUIRE_TMUX: &str = "ATLASBOOST_E2E_REQUIRE_TMUX";

/// `tmux -L session ARGS`: each session on a server of its own (the two tests run at once,
/// and one's server exiting must not take the other's command with it).
fn tmux(session: &str, args: &[&str]) -> String {
    let out = Command::new("tmux")
        .args(["-L", session])
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A tmux session on a server of its own, both killed on drop.
struct Session(String);

impl Drop for Session {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.0, "kill-server"])
            .output();
    }
}

/// The screen's non-empty lines.
fn screen(session: &str) -> Vec<String> {
    tmux(session, &["capture-pane", "-p", "-t", session])
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect()
}

/// Whether tmux is here; if not, says why the test is skipped (a failure with
/// [`REQUIRE_TMUX`]).
fn have_tmux() -> bool {
    if Command::new("tmux").arg("-V").output().is_ok() {
        return true;
    }
    assert!(
        std::env::var_os(REQUIRE_TMUX).is_none_or(|v| v != "1"),
        "tmux is not installed, and {REQUIRE_TMUX}=1"
    );
    eprintln!("skipped: tmux is not installed (apt-get install tmux)");
    false
}

/// Runs `atlasboost ARGS` in a new 132 × 24 tmux session, in `dir`; then says `JOB-ENDED`
/// and whether the terminal echoes (`echo` or `-echo`, as stty says).
fn start_in_tmux(name: &str, dir: &std::path::Path, args: &str) -> Session {
    let session = Session(unique(name));
    let job = format!(
        "cd {} && {} {args}; echo JOB-ENDED $(stty -a | tr ' ;' '\\n\\n' | grep -x -- '-\\?echo'); \
         sleep 60",
        dir.display(),
        atlasboost_bin().display()
    );
    let started = tmux(
        &session.0,
        &[
            "new-session",
            "-d",
            "-s",
            &session.0,
            "-x",
            "132",
            "-y",
            "24",
            &job,
        ],
    );
    assert!(started.is_empty(), "{started}");
    session
}

/// The screen once `done` holds of it (or after `limit`).
fn screen_when(
    session: &Session,
    limit: Duration,
    done: impl Fn(&[String]) -> bool,
) -> Vec<String> {
    let deadline = Instant::now() + limit;
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        seen = screen(&session.0);
        if done(&seen) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    seen
}

/// The screen once the job has ended: its summary (`summary` in it) is there, and no line of
/// the block (cleared before the summary, and no stale copy of it left).
fn screen_after_the_job(session: &Session, summary: &str) -> Vec<String> {
    let end = screen_when(session, Duration::from_secs(30), |s| {
        s.iter().any(|l| l.starts_with("JOB-ENDED"))
    });
    assert!(end.iter().any(|l| l.contains(summary)), "{end:#?}");
    assert!(
        !end.iter().any(|l| l.contains("ranks running on")),
        "a line of the block is left: {end:#?}"
    );
    end
}

#[test]
fn the_status_block_stays_at_the_bottom_updates_and_lines_scroll_above_it() {
    if !have_tmux() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The workers print until the test has seen what it needs (a `go` file; 30 s at most).
    let session = start_in_tmux(
        "status",
        dir.path(),
        "run --sim 2 -H 127.0.0.1,127.0.0.2 --monitor-interval 1 -- sh -c \
         'i=0; while [ ! -e go ] && [ $i -lt 300 ]; do i=$((i + 1)); echo line $i; sleep 0.1; \
         done'",
    );
    // Two captures a second apart, once lines flow and both hosts have sent a sample (on a
    // busy machine the second host's first one may come later than line 15).
    let ready = |s: &[String]| {
        s.iter().any(|l| l.contains("]<stdout>:line 15"))
            && s.last().is_some_and(|l| l.starts_with("  127.0.0.2: "))
    };
    let first = screen_when(&session, Duration::from_secs(20), ready);
    assert!(
        ready(&first),
        "no lines and samples of both hosts: {first:#?}"
    );
    std::thread::sleep(Duration::from_millis(1500));
    let second = screen(&session.0);
    std::fs::write(dir.path().join("go"), "").unwrap();
    for capture in [&first, &second] {
        let n = capture.len();
        assert!(n >= 4, "{capture:#?}");
        // The bottom three lines are the block: the job, then each host with its samples.
        let block = &capture[n - 3..];
        assert!(
            block[0].starts_with("atlasboost: 4/4 ranks running on 2 hosts, 0:"),
            "the block's first line: {capture:#?}"
        );
        for (line, host) in block[1..].iter().zip(["127.0.0.1", "127.0.0.2"]) {
            assert!(
                line.starts_with(&format!("  {host}: 2/2 ranks, AI core "))
                    && line.contains("HBM ")
                    && line.ends_with("°C"),
                "{host}'s line: {capture:#?}"
            );
        }
        // Above it, the workers' lines, whole and tagged.
        assert!(
            capture[n - 4].starts_with('[') && capture[n - 4].contains("]<stdout>:line "),
            "a worker's line just above the block: {capture:#?}"
        );
    }
    assert_ne!(
        first[first.len() - 3..],
        second[second.len() - 3..],
        "the block updates"
    );
    let last_line = |c: &[String]| {
        c.iter()
            .filter_map(|l| l.split(":line ").nth(1)?.parse::<u32>().ok())
            .max()
    };
    assert!(
        last_line(&second) > last_line(&first),
        "lines scroll: {second:#?}"
    );
    // At the end the block is gone: the summary follows the last lines.
    screen_after_the_job(&session, "4 succeeded, 0 failed");
}

#[test]
fn no_status_block_and_no_escape_codes_when_stderr_is_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(atlasboost_bin())
        .args([
            "run",
            "--sim",
            "2",
            "--monitor-interval",
            "1",
            "--",
            "sh",
            "-c",
            "echo hi; sleep 1.5",
        ])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("ranks running on"), "{err}");
    assert!(!err.contains('\x1b'), "escape codes in a file: {err:?}");
    assert!(err.contains("2 succeeded"), "{err}");
}

/// Keys typed while the block is drawn (Enter, or any key) are not echoed where the cursor
/// waits under it: the next redraw would leave a stale copy of its first line above it.
#[test]
fn keys_typed_under_the_status_block_leave_no_stale_line() {
    if !have_tmux() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let session = start_in_tmux(
        "status-keys",
        dir.path(),
        "run --sim 1 --monitor-interval 1 -- sh -c 'echo started; \
         i=0; while [ ! -e go ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done'",
    );
    let drawn = screen_when(&session, Duration::from_secs(20), |s| {
        s.last()
            .is_some_and(|l| l.starts_with("  192.0.2.2: 1/1 ranks"))
    });
    assert!(
        drawn
            .last()
            .is_some_and(|l| l.starts_with("  192.0.2.2: 1/1 ranks")),
        "{drawn:#?}"
    );
    tmux(
        &session.0,
        &["send-keys", "-t", &session.0, "Enter", "x", "Enter"],
    );
    // The job goes on until the block has been redrawn (every second) after the keys.
    std::thread::sleep(Duration::from_millis(2500));
    std::fs::write(dir.path().join("go"), "").unwrap();
    let end = screen_after_the_job(&session, "1 succeeded, 0 failed");
    assert!(
        end.iter().any(|l| l == "JOB-ENDED echo"),
        "the terminal echoes again once the job has ended: {end:#?}"
    );
}
