//! Helpers for atlasboost's end-to-end tests: find the real `atlasboost` binary, run it with a
//! hard time limit, and look at the processes it leaves (or must not leave) behind.
//!
//! Every wait here is bounded: a launcher that does not finish in time is killed (SIGKILL, so
//! its lifeline stops its workers) and the test panics with what it printed so far.
#![deny(missing_docs)]
//!
//! The support modules: [`bins`] (the programs under test), [`run`] (the run harness), [`procs`]
//! (`/proc` inspection), [`sshd`] (a real sshd, free ports); network namespaces are
//! `tests/netns-cluster.sh`'s.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

#[path = "support/bins.rs"]
pub mod bins;
#[path = "support/procs.rs"]
pub mod procs;
#[path = "support/run.rs"]
pub mod run;
#[path = "support/sshd.rs"]
pub mod sshd;

pub use bins::*;
pub use procs::*;
pub use run::*;
pub use sshd::*;

/// A string no other test (thread or process) of this machine uses: for markers and names.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    format!(
        "{prefix}-{}-{}-{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Polls `done` every 10 ms until it is true or `timeout` has passed; true if it became true.
pub fn wait_until(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The port `--metrics 0` got from the kernel, as the launcher says it (waiting at most 30 s):
/// a port picked free beforehand may be taken by another test before the launcher binds it.
pub fn metrics_port(launch: &mut Launch) -> String {
    launch.wait_for("the metrics address", Duration::from_secs(30), |_, err| {
        err.contains("/metrics\n")
    });
    let err = String::from_utf8_lossy(&launch.stderr()).into_owned();
    err.split("metrics at http://127.0.0.1:")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no metrics address in:\n{err}"))
}

/// What `--metrics` serves on loopback port `port` (`GET /metrics`, 5 s at most), or "" when
/// nothing answers yet.
pub fn scrape_metrics(port: &str) -> String {
    let url = format!("http://127.0.0.1:{port}/metrics");
    std::process::Command::new("python3")
        .args([
            "-c",
            "import sys, urllib.request; \
             print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())",
            &url,
        ])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}
