//! What `/proc` says: the processes a launch leaves (or must not leave) behind.

use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::wait_until;

/// What `/proc/<pid>/stat` says of a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcStat {
    /// Its id.
    pub pid: i32,
    /// Its command name (`comm`).
    pub comm: String,
    /// Its state: `R`, `S`, `Z` (zombie), ...
    pub state: char,
    /// Its parent's id.
    pub ppid: i32,
    /// Its process group (field 5).
    pub pgrp: i32,
}

impl ProcStat {
    /// Whether it still runs: a zombie has ended and only waits to be reaped.
    pub fn alive(&self) -> bool {
        !matches!(self.state, 'Z' | 'X')
    }
}

/// `/proc/<pid>/stat` of `pid`, if it exists.
pub fn proc_stat(pid: i32) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // comm may contain spaces and parentheses: it ends at the last ')'.
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text[open + 1..close].to_string();
    let mut rest = text[close + 1..].split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    let pgrp = rest.next()?.parse().ok()?;
    Some(ProcStat {
        pid,
        comm,
        state,
        ppid,
        pgrp,
    })
}

/// Every process id in `/proc` now.
pub fn all_pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The live (not zombie) processes whose environment has `name=value` exactly.
pub fn pids_with_env(name: &str, value: &str) -> Vec<ProcStat> {
    let wanted = format!("{name}={value}").into_bytes();
    all_pids()
        .into_iter()
        .filter(|&pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|kv| kv == wanted.as_slice()))
        })
        .filter_map(proc_stat)
        .filter(ProcStat::alive)
        .collect()
}

/// The live (not zombie) processes in any of these process groups.
pub fn pids_in_groups(pgids: &[i32]) -> Vec<ProcStat> {
    all_pids()
        .into_iter()
        .filter_map(proc_stat)
        .filter(|p| p.alive() && pgids.contains(&p.pgrp))
        .collect()
}

/// Waits up to `timeout` for no live process to have `name=value` in its environment.
///
/// # Panics
///
/// When some are left, listing them (and kills them, so that a failing test leaves nothing).
pub fn assert_no_process_with_env(name: &str, value: &str, timeout: Duration, context: &str) {
    if wait_until(timeout, || pids_with_env(name, value).is_empty()) {
        return;
    }
    let left = pids_with_env(name, value);
    for p in &left {
        let _ = kill(Pid::from_raw(p.pid), Signal::SIGKILL);
    }
    panic!(
        "{context}: {timeout:?} later, processes with {name}={value} are still alive: {left:#?}"
    );
}

/// Waits up to `timeout` for these process groups to have no live process.
///
/// # Panics
///
/// When some are left, listing them (and kills them).
pub fn assert_groups_gone(pgids: &[i32], timeout: Duration, context: &str) {
    if wait_until(timeout, || pids_in_groups(pgids).is_empty()) {
        return;
    }
    let left = pids_in_groups(pgids);
    for p in &left {
        let _ = kill(Pid::from_raw(p.pid), Signal::SIGKILL);
    }
    panic!(
        "{context}: {timeout:?} later, process groups {pgids:?} still have live processes: {left:#?}"
    );
}

/// Kills every live process with `name=value` in its environment: cleanup for a test that
/// expects them to be gone already, so that a failure leaves nothing running.
pub fn kill_marked(name: &str, value: &str) {
    for p in pids_with_env(name, value) {
        let _ = kill(Pid::from_raw(p.pid), Signal::SIGKILL);
    }
}

/// The command line of `pid` (its arguments, lossy), if it exists.
pub fn cmdline(pid: i32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let raw = raw.strip_suffix(&[0]).unwrap_or(&raw);
    Some(
        raw.split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
    )
}

/// The live (not zombie) descendants of `pid`: its children, theirs, and so on.
pub fn descendants(pid: i32) -> Vec<ProcStat> {
    let all: Vec<ProcStat> = all_pids()
        .into_iter()
        .filter_map(proc_stat)
        .filter(ProcStat::alive)
        .collect();
    let mut found: Vec<ProcStat> = Vec::new();
    let mut parents = vec![pid];
    while let Some(parent) = parents.pop() {
        for p in all.iter().filter(|p| p.ppid == parent) {
            if !found.iter().any(|f| f.pid == p.pid) {
                parents.push(p.pid);
                found.push(p.clone());
            }
        }
    }
    found
}
