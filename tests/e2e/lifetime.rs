//! Nothing of a job outlives it (SPEC: lifetime): not after `kill -9` of the launcher, not a
//! worker's own children.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use atlasboost_e2e::{
    LAUNCH_MARK, Run, assert_groups_gone, assert_no_process_with_env, cgroup_or_skip, kill_marked,
    pids_with_env, proc_stat, unique, wait_until,
};
use nix::sys::signal::Signal;

const MARK: &str = "ATLASBOOST_E2E_MARK";

/// Kills whatever is left with the marker when a test ends, passing or not.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        kill_marked(MARK, &self.0);
    }
}

#[test]
fn kill_9_of_the_launcher_leaves_nothing_of_the_job() {
    let mark = unique("kill9");
    let _cleanup = Cleanup(mark.clone());
    let ranks = 4;
    // The launcher's directory of rank files goes here, to be seen removed.
    let tmp = tempfile::tempdir().unwrap();
    // Each worker writes a heartbeat (a file in that directory), forks a grandchild, says so,
    // and waits.
    let mut launch = Run::new(["run", "--sim", "4", "-H", "127.0.0.1", "--grace", "30"])
        .args(["-x", &format!("{MARK}={mark}"), "--", "sh", "-c"])
        .args([
            "echo 1 >\"$ATLASBOOST_HEARTBEAT_FILE\"; sleep 300 & echo \"forked $!\"; \
             sleep 300; echo 'still here'",
        ])
        .env("TMPDIR", tmp.path())
        .timeout(Duration::from_secs(60))
        .spawn();
    launch.wait_for_lines("]<stdout>:forked ", ranks, Duration::from_secs(20));
    // Every worker and grandchild is up: 2 processes per rank, in one group per rank.
    let mut procs = Vec::new();
    let all_up = wait_until(Duration::from_secs(10), || {
        procs = pids_with_env(MARK, &mark);
        procs.len() >= 2 * ranks
    });
    assert!(
        all_up,
        "expected {} worker processes, found {procs:#?}",
        2 * ranks
    );
    let groups: BTreeSet<i32> = procs.iter().map(|p| p.pgrp).collect();
    let launcher_group = proc_stat(launch.pid()).unwrap().pgrp;
    assert_eq!(
        groups.len(),
        ranks,
        "one process group per worker: {procs:#?}"
    );
    assert!(
        !groups.contains(&launcher_group),
        "workers are not in the launcher's group {launcher_group}: {procs:#?}"
    );
    let groups: Vec<i32> = groups.into_iter().collect();
    let launch_mark = launch.mark().to_string();

    let killed = Instant::now();
    launch.signal(Signal::SIGKILL);
    // The launcher dies at once; its lifeline (which holds its stderr) must end too.
    let r = launch.wait_at_most(Duration::from_secs(5));
    assert_eq!(r.status.code(), None, "killed by SIGKILL\n{}", r.describe());
    let left = Duration::from_secs(5).saturating_sub(killed.elapsed());
    assert_no_process_with_env(MARK, &mark, left, "after kill -9 of the launcher");
    assert_groups_gone(&groups, Duration::ZERO, "after kill -9 of the launcher");
    assert_no_process_with_env(
        LAUNCH_MARK,
        &launch_mark,
        Duration::from_secs(5).saturating_sub(killed.elapsed()),
        "the lifeline after kill -9 of the launcher",
    );
    assert!(!r.out().contains("still here"), "{}", r.describe());
    // The rank files too: the lifeline's guard removed their directory.
    let scratch = || {
        std::fs::read_dir(tmp.path())
            .unwrap()
            .filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
            .filter(|name| name.starts_with("atlasboost-"))
            .collect::<Vec<_>>()
    };
    assert!(
        wait_until(Duration::from_secs(5), || scratch().is_empty()),
        "the launcher's rank files are left in {}: {:?}",
        tmp.path().display(),
        scratch()
    );
}

/// `kill -9` of the launcher while each worker has a child in a session of its own (`setsid`:
/// out of the worker's process group, which is all the lifeline kills without a cgroup).
/// Returns the launcher's stderr and whether the setsid children outlived it by 3 s.
fn kill_9_with_setsid_children(cgroup: &str) -> (String, bool) {
    let mark = unique("kill9-setsid");
    let _cleanup = Cleanup(mark.clone());
    let mut launch = Run::new([
        "run",
        "-v",
        "--sim",
        "2",
        "-H",
        "127.0.0.1",
        "--grace",
        "30",
    ])
    .env("ATLASBOOST_CGROUP", cgroup)
    .args(["-x", &format!("{MARK}={mark}"), "--", "sh", "-c"])
    .args(["setsid sleep 300 & echo \"forked $!\"; sleep 300"])
    .timeout(Duration::from_secs(60))
    .spawn();
    launch.wait_for_lines("]<stdout>:forked ", 2, Duration::from_secs(20));
    // 2 workers and 2 children in groups of their own (`setsid` runs a moment after the
    // worker says it forked).
    let mut procs = Vec::new();
    let all_up = wait_until(Duration::from_secs(10), || {
        procs = pids_with_env(MARK, &mark);
        procs
            .iter()
            .map(|p| p.pgrp)
            .collect::<BTreeSet<i32>>()
            .len()
            == 4
    });
    assert!(
        all_up,
        "the children left their workers' groups: {procs:#?}"
    );
    launch.signal(Signal::SIGKILL);
    let r = launch.wait_at_most(Duration::from_secs(5));
    assert_eq!(r.status.code(), None, "killed by SIGKILL\n{}", r.describe());
    let outlived = !wait_until(Duration::from_secs(3), || {
        pids_with_env(MARK, &mark).is_empty()
    });
    (r.err(), outlived)
}

/// With the workers' cgroup (made where this machine allows one), the guard's `cgroup.kill`
/// ends the setsid children too, and removes the cgroup.
#[test]
fn kill_9_of_the_launcher_ends_what_left_the_workers_groups() {
    let (err, outlived) = kill_9_with_setsid_children("1");
    let Some(line) = err.lines().find(|l| l.contains("cgroup")) else {
        panic!("-v names the workers' cgroup, or why there is none:\n{err}");
    };
    if !cgroup_or_skip(line) {
        return;
    }
    assert!(!outlived, "the setsid children outlived kill -9:\n{err}");
    let dir = line.rsplit(' ').next().unwrap_or_default();
    assert!(
        wait_until(Duration::from_secs(2), || !std::path::Path::new(dir)
            .exists()),
        "the guard removed {dir}"
    );
}

/// Without it (`ATLASBOOST_CGROUP=0`), a setsid child outlives `kill -9` of the launcher, as
/// docs/launching.md says: the case the cgroup is for.
#[test]
fn without_the_cgroup_a_setsid_child_outlives_kill_9() {
    let (err, outlived) = kill_9_with_setsid_children("0");
    assert!(
        err.contains("no cgroup for the workers (ATLASBOOST_CGROUP=0)"),
        "{err}"
    );
    assert!(
        outlived,
        "nothing else stops a process in a session of its own:\n{err}"
    );
}

/// Runs workers that leave a grandchild behind and exit 0: the launcher must stop it and end,
/// saying what it stops (`said`).
fn grandchild_is_stopped(script: &str, what: &str, said: &str) {
    let mark = unique("orphan");
    let _cleanup = Cleanup(mark.clone());
    let r = Run::new(["run", "--sim", "2", "-H", "127.0.0.1", "--grace", "1"])
        .args(["-x", &format!("{MARK}={mark}"), "--", "sh", "-c", script])
        .timeout(Duration::from_secs(60))
        .run();
    r.assert_code(0);
    assert!(
        r.elapsed < Duration::from_secs(15),
        "{what}: the grandchild sleeps 300 s, --grace 1; the launcher must stop it and end, \
         yet it took {:?}\n{}",
        r.elapsed,
        r.describe()
    );
    let message =
        format!("atlasboost: every worker has exited; stopping what they left running {said}");
    assert!(
        r.err().lines().any(|l| l == message),
        "{what}: expected the line {message:?}\n{}",
        r.describe()
    );
    assert_eq!(
        r.out()
            .lines()
            .filter(|l| l.contains("]<stdout>:forked "))
            .count(),
        2,
        "{}",
        r.describe()
    );
    assert_no_process_with_env(
        MARK,
        &mark,
        Duration::from_secs(2),
        &format!("{what}: after the launcher ended"),
    );
}

/// A signal while what the workers of a successful job left running is being stopped cuts
/// that stop short (a grandchild ignoring SIGTERM, a long grace) instead of waiting out the
/// grace; the job ends as interrupted (130), as a signal in the wait for the console does.
#[test]
fn a_signal_while_the_leftovers_are_stopped_kills_them_at_once() {
    let mark = unique("leftover-signal");
    let _cleanup = Cleanup(mark.clone());
    let mut launch = Run::new(["run", "--sim", "1", "-H", "127.0.0.1", "--grace", "60"])
        .args(["-x", &format!("{MARK}={mark}"), "--", "sh", "-c"])
        .args(["trap '' TERM; sleep 300 >/dev/null 2>&1 & echo \"forked $!\"; exit 0"])
        .timeout(Duration::from_secs(60))
        .spawn();
    launch.wait_for("the leftovers' stop", Duration::from_secs(20), |_, err| {
        err.contains("stopping what it left running")
    });
    launch.signal(Signal::SIGINT);
    let r = launch.wait();
    r.assert_code(130).assert_err(
        &["got SIGINT while stopping what the workers left running; killing it now"],
        &["passing it on"],
    );
    assert!(r.elapsed < Duration::from_secs(30), "{}", r.describe());
    assert_no_process_with_env(
        MARK,
        &mark,
        Duration::from_secs(2),
        "after the launcher ended",
    );
}

#[test]
fn a_grandchild_holding_the_output_is_stopped_when_the_workers_exit() {
    grandchild_is_stopped(
        "sleep 300 & echo \"forked $!\"; exit 0",
        "grandchild with the worker's stdout",
        "(the process groups of ranks 0, 1)",
    );
}

#[test]
fn a_grandchild_with_its_own_output_is_stopped_when_the_workers_exit() {
    grandchild_is_stopped(
        "sleep 300 >/dev/null 2>&1 </dev/null & echo \"forked $!\"; exit 0",
        "grandchild with its output on /dev/null",
        "(the process groups of ranks 0, 1)",
    );
}

#[test]
fn a_grandchild_ignoring_sigterm_is_killed_after_the_grace_time() {
    grandchild_is_stopped(
        "trap '' TERM; sleep 300 >/dev/null 2>&1 & echo \"forked $!\"; exit 0",
        "grandchild ignoring SIGTERM",
        "(the process groups of ranks 0, 1)",
    );
}

/// A daemon (setsid) whose child made a session of its own and ignores SIGTERM, as does its
/// sleep: each is re-parented to the launcher only once the one above it has died, and each
/// must be stopped as it comes.
#[test]
fn a_daemons_children_are_stopped_as_they_are_orphaned() {
    grandchild_is_stopped(
        // The worker exits once the sleep has started (its pid in $f), not before.
        r#"f=$(mktemp -u)
           setsid sh -c 'setsid sh -c "trap \"\" TERM; sleep 300 & echo \$! > $0; wait" & wait' \
             "$f" </dev/null >/dev/null 2>&1 &
           i=0
           while [ ! -s "$f" ]; do
             i=$((i + 1)); [ $i -gt 250 ] && { echo "no sleep" >&2; exit 99; }
             sleep 0.02
           done
           echo "forked $(cat "$f")"; rm -f "$f"; exit 0"#,
        "a daemon's children",
        // Each worker's daemon made a session of its own, and its group went with the worker.
        "(2 processes that left their workers' groups)",
    );
}

/// A grandchild that left the worker's session (setsid) but holds its stdout: the launcher
/// cannot stop what it does not know, but it must not wait for it forever either.
#[test]
fn a_setsid_grandchild_holding_the_output_does_not_keep_the_launcher_waiting() {
    let mark = unique("setsid");
    let _cleanup = Cleanup(mark.clone());
    // The worker waits (bounded) until its grandchild has its own session, then exits 0.
    let script = r#"
        setsid sleep 300 &
        child=$!
        i=0
        while [ "$(cut -d' ' -f6 /proc/$child/stat 2>/dev/null)" != "$child" ]; do
            i=$((i + 1)); [ $i -gt 200 ] && { echo "no setsid" >&2; exit 99; }
            sleep 0.02
        done
        echo "forked $child"
    "#;
    let r = Run::new(["run", "--sim", "1", "-H", "127.0.0.1", "--grace", "1"])
        .args(["-x", &format!("{MARK}={mark}"), "--", "sh", "-c", script])
        .timeout(Duration::from_secs(60))
        .run();
    r.assert_code(0);
    assert!(
        r.out().contains("]<stdout>:forked "),
        "the worker forked its grandchild\n{}",
        r.describe()
    );
    assert!(
        r.elapsed < Duration::from_secs(15),
        "the launcher waited {:?} for a process outside the job's groups\n{}",
        r.elapsed,
        r.describe()
    );
}

/// Without the lifeline (killed first), `kill -9` of the launcher still ends the workers
/// themselves: they die with their parent (PR_SET_PDEATHSIG).
#[test]
fn workers_die_with_the_launcher_even_without_the_lifeline() {
    let mark = unique("pdeath");
    let _cleanup = Cleanup(mark.clone());
    // No cgroup either: the guard that would remove it is killed here (and the rank files it
    // would remove are in a directory of the test's).
    let tmp = tempfile::tempdir().unwrap();
    let mut launch = Run::new(["run", "--sim", "2", "-H", "127.0.0.1", "--grace", "30"])
        .env("ATLASBOOST_CGROUP", "0")
        .env("TMPDIR", tmp.path())
        .args(["-x", &format!("{MARK}={mark}"), "--", "sh", "-c"])
        .args(["echo ready; exec sleep 300"])
        .timeout(Duration::from_secs(60))
        .spawn();
    launch.wait_for_lines("]<stdout>:ready", 2, Duration::from_secs(20));
    let launcher = launch.pid();
    // The lifeline: the launcher's child named by the guard, not a worker.
    let mut guards = Vec::new();
    let found = wait_until(Duration::from_secs(5), || {
        guards = pids_with_env(LAUNCH_MARK, launch.mark())
            .into_iter()
            .filter(|p| p.ppid == launcher && p.comm == "ab-guard")
            .collect();
        guards.len() == 1
    });
    assert!(found, "one lifeline process: {guards:#?}");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(guards[0].pid), Signal::SIGKILL).unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || proc_stat(guards[0].pid)
            .is_none_or(|p| !p.alive())),
        "the lifeline dies"
    );
    launch.kill_9_leaves_nothing(
        || {},
        (MARK, &mark),
        "workers after kill -9 of the launcher, without its lifeline",
    );
}

/// A process of someone else's whose pid (and process group id) is the recycled pid of a
/// worker that exited: the launcher must never signal it. Killed when dropped.
struct Victim(std::process::Child);

impl Drop for Victim {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `sleep 60` as the leader of a new process group whose id is `pid`, by setting the
/// kernel's last allocated pid (`/proc/sys/kernel/ns_last_pid`, root only) just before it,
/// and putting it back afterwards (so that other processes do not go on reusing recent pids).
/// `None` when that is not allowed here, or other processes keep taking `pid`.
fn victim_with_pid(pid: i32) -> Option<Victim> {
    use std::os::unix::process::CommandExt;
    const LAST_PID: &str = "/proc/sys/kernel/ns_last_pid";
    let last = || -> Option<i32> { std::fs::read_to_string(LAST_PID).ok()?.trim().parse().ok() };
    let before = last()?;
    let mut found = None;
    for _ in 0..50 {
        if std::fs::write(LAST_PID, (pid - 1).to_string()).is_err() {
            break;
        }
        let Ok(child) = std::process::Command::new("sleep")
            .arg("60")
            .process_group(0)
            .spawn()
        else {
            break;
        };
        let victim = Victim(child);
        if victim.0.id() as i32 == pid {
            found = Some(victim);
            break;
        }
        if proc_stat(pid).is_some() {
            break; // another process has it now
        }
    }
    if last().is_some_and(|now| now < before) {
        let _ = std::fs::write(LAST_PID, before.to_string());
    }
    found
}

/// Rank 1 exits 0 at once and its process group is empty; its pid is then given to an
/// unrelated process group leader. Ending the job with `signal` must not touch that process.
fn recycled_group_is_left_alone(signal: Signal, what: &str) {
    let mark = unique("recycle");
    let _cleanup = Cleanup(mark.clone());
    let mut launch = Run::new(["run", "--sim", "2", "-H", "127.0.0.1", "--grace", "30"])
        .args(["-x", &format!("{MARK}={mark}"), "--", "sh", "-c"])
        .args([r#"echo "pid $$"; [ "$RANK_ID" = 1 ] && exit 0; echo ready; exec sleep 300"#])
        .timeout(Duration::from_secs(60))
        .spawn();
    launch.wait_for_lines("[0]<stdout>:ready", 1, Duration::from_secs(20));
    launch.wait_for_lines("[1]<stdout>:pid ", 1, Duration::from_secs(20));
    let out = String::from_utf8_lossy(&launch.stdout()).into_owned();
    let pid: i32 = out
        .lines()
        .find_map(|l| l.strip_prefix("[1]<stdout>:pid "))
        .and_then(|p| p.trim().parse().ok())
        .unwrap();
    // Rank 1 has exited and the launcher has reaped it: its pid is free.
    assert!(
        wait_until(Duration::from_secs(10), || proc_stat(pid).is_none()),
        "rank 1 (pid {pid}) is reaped"
    );
    let Some(mut victim) = victim_with_pid(pid) else {
        eprintln!(
            "{what}: skipped: cannot give pid {pid} to a new process here (needs root to \
             write /proc/sys/kernel/ns_last_pid)"
        );
        return;
    };
    launch.signal(signal);
    // Until the launcher has ended (and a little longer, for a stray signal to land), the
    // victim must live.
    let mut ended_at = None;
    let mut victim_status = None;
    wait_until(Duration::from_secs(20), || {
        victim_status = victim.0.try_wait().unwrap();
        if ended_at.is_none() && !launch.is_running() {
            ended_at = Some(Instant::now());
        }
        victim_status.is_some()
            || ended_at.is_some_and(|t| t.elapsed() > Duration::from_millis(300))
    });
    assert!(
        victim_status.is_none(),
        "{what}: an unrelated process whose process group id is the recycled pid {pid} of \
         rank 1 (which had exited 0, its group empty) was killed: {victim_status:?}\n\
         --- launcher's stderr ---\n{}",
        String::from_utf8_lossy(&launch.stderr())
    );
    assert!(
        ended_at.is_some(),
        "{what}: the launcher did not end within 20 s"
    );
    drop(launch);
    assert_no_process_with_env(MARK, &mark, Duration::from_secs(5), what);
}

#[test]
fn kill_9_never_signals_the_recycled_group_of_an_exited_worker() {
    recycled_group_is_left_alone(Signal::SIGKILL, "kill -9 of the launcher");
}

#[test]
fn sigint_never_signals_the_recycled_group_of_an_exited_worker() {
    recycled_group_is_left_alone(Signal::SIGINT, "SIGINT to the launcher");
}
