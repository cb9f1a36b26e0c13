//! The live status block (SPEC §13), read off a real terminal: a job runs in `tmux`, and its
//! screen is captured with `capture-pane` while it runs.

use std::process::Command;
use std::time::{Duration, Instant};

use atlasboost_e2e::{atlasboost_bin, unique};

/// `ATLASBOOST_E2E_REQUIRE_TMUX=1` (set by scripts/test.sh, which installs tmux) turns a
/// missing tmux into a failure instead of a skip.
const REQUIRE_TMUX: &str = "ATLASBOOST_E2E_REQUIRE_TMUX";

fn tmux(args: &[&str]) -> String {
    let out = Command::new("tmux").args(args).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A tmux session, killed on drop.
struct Session(String);

impl Drop for Session {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.0])
            .output();
    }
}

/// The screen's non-empty lines.
fn screen(session: &str) -> Vec<String> {
    tmux(&["capture-pane", "-p", "-t", session])
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect()
}

#[test]
fn the_status_block_stays_at_the_bottom_updates_and_lines_scroll_above_it() {
    if Command::new("tmux").arg("-V").output().is_err() {
        assert!(
            std::env::var_os(REQUIRE_TMUX).is_none_or(|v| v != "1"),
            "tmux is not installed, and {REQUIRE_TMUX}=1"
        );
        eprintln!("skipped: tmux is not installed (apt-get install tmux)");
        return;
    }
    let session = Session(unique("status"));
    let dir = tempfile::tempdir().unwrap();
    let job = format!(
        "cd {} && {} run --sim 2 -H 127.0.0.1,127.0.0.2 --monitor-interval 1 -- sh -c \
         'i=0; while [ $i -lt 60 ]; do i=$((i + 1)); echo line $i; sleep 0.1; done'; \
         echo JOB-ENDED; sleep 60",
        dir.path().display(),
        atlasboost_bin().display()
    );
    let started = tmux(&[
        "new-session",
        "-d",
        "-s",
        &session.0,
        "-x",
        "132",
        "-y",
        "24",
        &job,
    ]);
    assert!(started.is_empty(), "{started}");
    // Two captures a second apart, once lines flow and both hosts have sent a sample (on a
    // busy machine the second host's first one may come later than line 15).
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut first = Vec::new();
    while Instant::now() < deadline {
        first = screen(&session.0);
        if first.iter().any(|l| l.contains("]<stdout>:line 15"))
            && first.last().is_some_and(|l| l.starts_with("  127.0.0.2: "))
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(1500));
    let second = screen(&session.0);
    for capture in [&first, &second] {
        let n = capture.len();
        assert!(n >= 4, "{capture:#?}");
        // The bottom three lines are the block: the job, then each host with its samples.
        let block = &capture[n - 3..];
        assert!(
            block[0].starts_with("atlasboost: 4/4 ranks running on 2 hosts, 0:0"),
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
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut end = Vec::new();
    while Instant::now() < deadline {
        end = screen(&session.0);
        if end.iter().any(|l| l == "JOB-ENDED") {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        end.iter().any(|l| l.contains("4 succeeded, 0 failed")),
        "{end:#?}"
    );
    assert!(
        !end.iter().any(|l| l.contains("ranks running on")),
        "the block was cleared: {end:#?}"
    );
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
