//! `atlasboost run --mpi` with the real Open MPI `mpirun`: it prints what atlasboost's own
//! launches print (each rank's relay sends its lines to the launcher), while mpirun keeps its
//! duties. These workers do not call `init()`, so no MPI build is needed; each test skips,
//! saying why, without `mpirun` (and fails with `ATLASBOOST_E2E_REQUIRE_MPIRUN=1`, as in CI).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use atlasboost_e2e::{
    Run, assert_no_process_with_env, descendants, kill_marked, mpirun_or_skip, unique, wait_until,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::{lines_by_rank, split_tag};

const MARK: &str = "ATLASBOOST_E2E_MARK";

/// A Python worker that prints `n` lines, each in pieces (`print` of several values writes
/// each separately when unbuffered): `<rank> <i> of <n> end`.
const PIECES: &str = "import os, sys
r = os.environ['OMPI_COMM_WORLD_RANK']
n = int(sys.argv[1])
for i in range(n):
    print(r, i, 'of', n, 'end')
";

/// Kills whatever is left with the marker when a test ends, passing or not.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        kill_marked(MARK, &self.0);
    }
}

/// `atlasboost run --mpi --sim 8 -n <ranks>` and the given arguments.
fn run_mpi(ranks: u32) -> Run {
    Run::new(["run", "--mpi", "--sim", "8", "-n"])
        .args([ranks.to_string()])
        .timeout(Duration::from_secs(90))
}

/// Whether process `pid` is a rank's relay: `atlasboost relay -- ...` or `atlasboost-relay --
/// ...`.
fn is_relay(pid: i32) -> bool {
    atlasboost_e2e::cmdline(pid).is_some_and(|c| {
        c.get(1).is_some_and(|a| a == "relay")
            || c.first().is_some_and(|p| p.ends_with("/atlasboost-relay"))
    })
}

/// `run --mpi` of 2 ranks with `--grace 1`, each running the shell `script`.
fn two_ranks_sh(script: &str) -> Run {
    run_mpi(2).args(["--grace", "1", "--", "sh", "-c", script])
}

#[test]
fn lines_written_in_pieces_arrive_whole_and_in_order() {
    if mpirun_or_skip().is_none() {
        return;
    }
    const LINES: u32 = 100_000;
    let f = run_mpi(8)
        .args(["-q", "--", "python3", "-c", PIECES])
        .args([LINES.to_string()])
        .run();
    f.assert_code(0);
    let out = f.out();
    let mut next: BTreeMap<u32, u32> = BTreeMap::new();
    let mut torn = Vec::new();
    for line in out.lines() {
        // `[3]<stdout>:3 17 of 100000 end`: the tag's rank is the line's own.
        let whole = split_tag(line, "stdout").and_then(|(rank, text)| {
            let f: Vec<&str> = text.split(' ').collect();
            (f.len() == 5 && f[0] == rank.to_string() && f[2] == "of" && f[4] == "end")
                .then(|| (rank, f[1].parse::<u32>().ok()))
        });
        match whole {
            Some((rank, Some(i))) => {
                let expected = next.entry(rank).or_insert(0);
                assert_eq!(i, *expected, "rank {rank}'s lines out of order at {line:?}");
                *expected += 1;
            }
            _ => torn.push(line.to_string()),
        }
    }
    assert!(
        torn.is_empty(),
        "{} torn lines, e.g. {:?}",
        torn.len(),
        &torn[..torn.len().min(5)]
    );
    assert_eq!(
        next,
        (0..8).map(|r| (r, LINES)).collect(),
        "every line of every rank"
    );
}

#[test]
fn ranks_timestamp_log_dir_and_no_tag_work_as_without_mpi() {
    if mpirun_or_skip().is_none() {
        return;
    }
    let worker = [
        "--",
        "sh",
        "-c",
        "echo out $OMPI_COMM_WORLD_RANK; echo err >&2",
    ];
    let run = run_mpi(4);
    let logs = run.dir().join("logs");
    let f = run
        .args(["--ranks", "1,2", "--timestamp", "--log-dir"])
        .args([&logs])
        .args(worker)
        .run();
    f.assert_code(0);
    let (out, err) = (f.out(), f.err());
    // Only ranks 1 and 2 on the console, each line stamped then tagged.
    let shown: Vec<&str> = out.lines().collect();
    assert_eq!(shown.len(), 2, "{}", f.describe());
    for line in &shown {
        let (stamp, rest) = line.split_once(' ').unwrap_or(("", ""));
        assert!(
            stamp.len() == 24 && stamp.ends_with('Z') && stamp.as_bytes()[10] == b'T',
            "an ISO-8601 time first: {line:?}"
        );
        let (rank, text) = split_tag(rest, "stdout").unwrap_or((99, ""));
        assert!(rank == 1 || rank == 2, "{line:?}");
        assert_eq!(text, format!("out {rank}"));
    }
    assert_eq!(
        lines_by_rank(
            &err.lines()
                .filter_map(|l| l.split_once(' ').map(|x| x.1))
                .collect::<Vec<_>>()
                .join("\n"),
            "stderr"
        )
        .keys()
        .copied()
        .collect::<Vec<_>>(),
        vec![1, 2]
    );
    // The log files keep every rank.
    for rank in 0..4 {
        let dir = logs.join("latest").join(format!("rank.{rank}"));
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
        assert_eq!(
            read("stdout.log"),
            format!("out {rank}\n"),
            "{}",
            dir.display()
        );
        assert_eq!(read("stderr.log"), "err\n", "{}", dir.display());
    }
    // --no-tag: the lines alone.
    let f = run_mpi(2).args(["-q", "--no-tag"]).args(worker).run();
    f.assert_code(0);
    let mut lines: Vec<String> = f.out().lines().map(str::to_string).collect();
    lines.sort();
    assert_eq!(lines, ["out 0", "out 1"], "{}", f.describe());
}

#[test]
fn the_first_rank_to_fail_sets_the_code_and_the_summary_names_each_rank() {
    if mpirun_or_skip().is_none() {
        return;
    }
    let f = run_mpi(4)
        .args(["--events", "events.jsonl", "--", "sh", "-c"])
        .args([
            // Rank 2 fails once every rank runs (so every relay has called in), at most 30 s.
            "touch ready.$OMPI_COMM_WORLD_RANK; \
             if [ $OMPI_COMM_WORLD_RANK = 2 ]; then i=0; \
               while [ $(ls ready.* | wc -l) -lt 4 ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; \
               echo 'rank 2 gives up' >&2; exit 7; fi; \
             sleep 30",
        ])
        .run();
    f.assert_code(7);
    let err = f.err();
    assert!(
        err.contains("error: rank 2 (host ") && err.contains("failed first: exit 7"),
        "{}",
        f.describe()
    );
    assert!(err.contains("[2]<stderr>:rank 2 gives up"), "{err}");
    let host = nix::unistd::gethostname().unwrap().into_string().unwrap();
    // One summary row per rank: rank, host, device (the local rank), status.
    let rows: Vec<Vec<&str>> = err
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|w| w.len() >= 5 && w[0].parse::<u32>().is_ok() && w[1] == host)
        .collect();
    assert_eq!(rows.len(), 4, "{err}");
    for (rank, row) in rows.iter().enumerate() {
        assert_eq!(row[0], rank.to_string(), "{err}");
        assert_eq!(row[2], rank.to_string(), "device = local rank: {err}");
        let status = if rank == 2 { "exit" } else { "stopped" };
        assert_eq!(row[3], status, "{err}");
    }
    // --events (docs/events.md) as without --mpi: each rank's start when its relay calls in,
    // its end, the attempt's root cause and the job's code.
    let events: Vec<serde_json::Value> = std::fs::read_to_string(f.dir().join("events.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["event"].as_str()).collect();
    assert_eq!(kinds.first(), Some(&"job_start"), "{kinds:?}");
    assert_eq!(events[0]["np"], 4, "{:?}", events[0]);
    assert_eq!(kinds.last(), Some(&"summary"), "{kinds:?}");
    let of = |kind: &str| -> Vec<&serde_json::Value> {
        events.iter().filter(|e| e["event"] == kind).collect()
    };
    let mut started: Vec<(u64, String, u64)> = of("worker_start")
        .iter()
        .map(|e| {
            (
                e["rank"].as_u64().unwrap(),
                e["host"].as_str().unwrap().to_string(),
                e["device"].as_u64().unwrap(),
            )
        })
        .collect();
    started.sort();
    let want: Vec<(u64, String, u64)> = (0..4).map(|r| (r, host.clone(), r)).collect();
    assert_eq!(started, want, "{events:?}");
    let mut ended: Vec<(u64, u64)> = of("worker_exit")
        .iter()
        .map(|e| {
            (
                e["rank"].as_u64().unwrap(),
                e["exit_code"].as_u64().unwrap(),
            )
        })
        .collect();
    ended.sort();
    assert_eq!(ended, [(0, 143), (1, 143), (2, 7), (3, 143)], "{events:?}");
    let end = of("attempt_end");
    assert!(
        end.len() == 1
            && end[0]["exit_code"] == 7
            && end[0]["ended"]
                .as_str()
                .is_some_and(|w| w.starts_with("rank 2 (host ") && w.ends_with("failed: exit 7")),
        "{end:?}"
    );
    assert_eq!(of("summary")[0]["exit_code"], 7, "{events:?}");
    assert!(
        events.iter().all(|e| e["job"] == events[0]["job"]),
        "one job id: {events:?}"
    );
}

/// A rank that fails: the others get SIGTERM and their whole `--grace` (a worker saving a
/// checkpoint on SIGTERM), as without `--mpi`; mpirun's own abort SIGKILLed them 1 s later.
#[test]
fn the_others_of_a_failed_rank_get_their_grace() {
    if mpirun_or_skip().is_none() {
        return;
    }
    let f = run_mpi(2)
        .args(["--grace", "10", "--", "sh", "-c"])
        .args([
            // Rank 1 fails once rank 0's trap is set (the ranks start unsynchronised).
            "if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then i=0; \
             while [ ! -e trapped ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; exit 3; fi; \
             trap 'echo saving; sleep 2; echo saved; exit 0' TERM; touch trapped; echo working; \
             sleep 30 & wait",
        ])
        .run();
    f.assert_code(3);
    assert!(
        f.out().contains("[0]<stdout>:saved"),
        "rank 0 finished saving within its grace\n{}",
        f.describe()
    );
}

#[test]
fn kill_9_of_the_launcher_leaves_no_worker_and_ctrl_c_reaches_every_one() {
    if mpirun_or_skip().is_none() {
        return;
    }
    let mark = unique("mpi-kill9");
    let _cleanup = Cleanup(mark.clone());
    let launch = workers_that_fork(4, &mark);
    launch.kill_9_leaves_nothing(
        || {},
        (MARK, &mark),
        "workers and their children after kill -9 of `atlasboost run --mpi`",
    );

    // Ctrl-C: every worker gets SIGINT (Python's KeyboardInterrupt), the launcher exits 130.
    let mark = unique("mpi-int");
    let _cleanup = Cleanup(mark.clone());
    // `ready` inside the try: a SIGINT right after it still lands in the handler.
    let worker = "import time
try:
    print('ready', flush=True)
    time.sleep(60)
except KeyboardInterrupt:
    print('interrupted', flush=True)
";
    let mut launch = run_mpi(4)
        .args([
            "-x",
            &format!("{MARK}={mark}"),
            "--",
            "python3",
            "-c",
            worker,
        ])
        .spawn();
    launch.wait_for_lines("]<stdout>:ready", 4, Duration::from_secs(30));
    launch.signal(Signal::SIGINT);
    let r = launch.wait_at_most(Duration::from_secs(20));
    r.assert_code(130);
    let interrupted = lines_by_rank(&r.out(), "stdout")
        .values()
        .filter(|lines| lines.iter().any(|l| l == "interrupted"))
        .count();
    assert_eq!(interrupted, 4, "{}", r.describe());
    assert_no_process_with_env(MARK, &mark, Duration::from_secs(5), "after Ctrl-C");
}

/// The relays below the launcher have no guard of their own (a fork per rank on the launch's
/// path): each tells the launcher its worker's process group, which the launcher's guard
/// stops. A `kill -9` of the launcher and every relay at once (`pkill -9 atlasboost`) ends
/// the workers (PR_SET_PDEATHSIG) and, through the launcher's guard, what they started.
#[test]
fn kill_9_of_the_launcher_and_its_relays_at_once_leaves_no_workers_child() {
    if mpirun_or_skip().is_none() {
        return;
    }
    let mark = unique("mpi-kill9-all");
    let _cleanup = Cleanup(mark.clone());
    let launch = workers_that_fork(2, &mark);
    let below = descendants(launch.pid());
    let relays: Vec<i32> = below
        .iter()
        .filter(|p| is_relay(p.pid))
        .map(|p| p.pid)
        .collect();
    assert_eq!(relays.len(), 2, "two relays below the launcher: {below:#?}");
    let guards_of_relays: Vec<_> = below
        .iter()
        .filter(|p| relays.contains(&p.ppid) && p.comm == "ab-guard")
        .collect();
    assert!(
        guards_of_relays.is_empty(),
        "relays below the launcher start no guard: {guards_of_relays:#?}"
    );
    // Stopped first, so that no relay stops its worker itself on losing the launcher: the
    // launcher's guard alone is to stop what the workers started.
    for &relay in &relays {
        kill(Pid::from_raw(relay), Signal::SIGSTOP).unwrap();
    }
    let kill_relays = || {
        for relay in relays {
            let _ = kill(Pid::from_raw(relay), Signal::SIGKILL);
        }
    };
    launch.kill_9_leaves_nothing(
        kill_relays,
        (MARK, &mark),
        "workers and the sleeps they started after kill -9 of the launcher and its relays",
    );
}

/// `run --mpi` of `ranks` workers marked `mark`, each of which forks a grandchild, says
/// `forked <pid>` and waits, once every one has said it.
fn workers_that_fork(ranks: u32, mark: &str) -> atlasboost_e2e::Launch {
    let script = "sleep 300 & echo \"forked $!\"; sleep 300; echo 'still here'";
    let mut launch = run_mpi(ranks)
        .args(["-x", &format!("{MARK}={mark}"), "--", "sh", "-c", script])
        .spawn();
    launch.wait_for_lines("]<stdout>:forked ", ranks as usize, Duration::from_secs(30));
    launch
}

/// `run --mpi` of two ranks, marked `mark`, that print `ready` and sleep 60 s (`--grace 1`),
/// once both are ready, and the mpirun below it.
fn two_ranks_sleeping_and_their_mpirun(mark: &str) -> (atlasboost_e2e::Launch, i32) {
    two_ranks_and_their_mpirun(mark, "1", "echo ready; sleep 60")
}

/// [`two_ranks_sleeping_and_their_mpirun`] with `--grace` of `grace` and each rank running
/// `script` (which says `ready`).
fn two_ranks_and_their_mpirun(
    mark: &str,
    grace: &str,
    script: &str,
) -> (atlasboost_e2e::Launch, i32) {
    let mut launch = run_mpi(2)
        .args(["--grace", grace, "-x", &format!("{MARK}={mark}"), "--"])
        .args(["sh", "-c", script])
        .spawn();
    launch.wait_for_lines("]<stdout>:ready", 2, Duration::from_secs(30));
    let mpirun = descendants(launch.pid())
        .into_iter()
        .find(|p| p.comm == "mpirun")
        .unwrap_or_else(|| panic!("no mpirun below the launcher {}", launch.pid()));
    (launch, mpirun.pid)
}

/// mpirun signalled from outside stops its ranks with SIGTERM, then SIGKILL after its timeout
/// (half of `--grace`, here 1 s). A rank that ends soon must not cut that short for one
/// still saving its checkpoint: Open MPI's mpirun sleeps out its timeout in whole seconds,
/// and a relay's exit would wake it to SIGKILL at once (it did, before relays in a stop
/// waited to be let go).
#[test]
fn a_rank_ending_soon_leaves_the_others_mpiruns_whole_timeout() {
    a_checkpoint_outlives_a_quick_rank("3", 300);
}

/// The same with a timeout (6 s) longer than `--host-timeout` (4 s): a relay that waits to be
/// let go must not take the launcher's silence (it sends a relay that is done no heartbeats)
/// for its end, or its exit wakes mpirun 4 s in.
#[test]
fn a_rank_ending_soon_leaves_the_others_a_timeout_longer_than_the_host_timeout() {
    // Rank 1's exit cost rank 0 about 0.95 s of the 6 (SIGKILL at 5.05 s), and so did a relay
    // that took the launcher's silence for its end (it exited 4 s in, and mpirun slept out 1 s
    // more): 5.5 s to save tells both apart from the whole 6.
    a_checkpoint_outlives_a_quick_rank("12", 5500);
}

/// Two ranks under `--grace grace`; mpirun gets SIGTERM; rank 0 saves for `save_ms`
/// (less than mpirun's timeout, half the grace), printing a line every 0.1 s (so that the
/// launcher's loop goes round, and its heartbeat keeper stays quiet), rank 1 ends 50 ms after
/// the signal (mpirun is asleep by then). Rank 0 must finish saving.
fn a_checkpoint_outlives_a_quick_rank(grace: &str, save_ms: u32) {
    if mpirun_or_skip().is_none() {
        return;
    }
    let mark = unique("mpirun-checkpoint");
    let _cleanup = Cleanup(mark.clone());
    let (launch, mpirun) = two_ranks_and_their_mpirun(
        &mark,
        grace,
        &format!(
            "save() {{ \
               end=$(( $(date +%s%N) / 1000000 + {save_ms} )); \
               while [ $(( $(date +%s%N) / 1000000 )) -lt $end ]; do echo saving; sleep 0.1; done; \
               echo saved; exit 0; \
             }}; \
             case $OMPI_COMM_WORLD_RANK in \
               0) trap save TERM ;; \
               *) trap 'sleep 0.05; exit 0' TERM ;; \
             esac; echo ready; sleep 60 & wait"
        ),
    );
    kill(Pid::from_raw(mpirun), Signal::SIGTERM).unwrap();
    let r = launch.wait_at_most(Duration::from_secs(40));
    r.assert_code(128 + 15);
    assert!(
        r.out().contains("[0]<stdout>:saving"),
        "rank 0 got mpirun's SIGTERM\n{}",
        r.describe()
    );
    assert!(
        r.out().contains("[0]<stdout>:saved"),
        "rank 0 had its {save_ms} ms to save (--grace {grace}), though rank 1 ended after 50 ms\n{}",
        r.describe()
    );
    assert!(
        r.err().contains(": 0 succeeded, 0 failed, 2 stopped"),
        "{}",
        r.describe()
    );
    assert_no_process_with_env(MARK, &mark, Duration::from_secs(5), "after mpirun's stop");
}

/// The launcher stopped (SIGSTOP) for longer than `--host-timeout`: its relays take it for
/// lost and stop their workers. Once it runs again, the job fails as its own pause, not as the
/// first rank whose relay said so, and the ranks count as stopped.
#[test]
fn a_launcher_stopped_past_the_host_timeout_names_itself() {
    if mpirun_or_skip().is_none() {
        return;
    }
    let mark = unique("mpirun-sigstop");
    let _cleanup = Cleanup(mark.clone());
    let mut launch = run_mpi(2)
        .args(["-x", &format!("{MARK}={mark}"), "--"])
        .args(["sh", "-c", "echo ready; sleep 60"])
        .spawn();
    launch.wait_for_lines("]<stdout>:ready", 2, Duration::from_secs(30));
    let sleeps = || {
        atlasboost_e2e::pids_with_env(MARK, &mark)
            .iter()
            .filter(|p| p.comm == "sleep")
            .count()
    };
    assert!(
        wait_until(Duration::from_secs(10), || sleeps() == 2),
        "the workers' sleeps did not start"
    );
    let stopped = Instant::now();
    launch.signal(Signal::SIGSTOP);
    // 4 s without heartbeats (the least --host-timeout), 1 s of grace, slack for a busy
    // machine.
    let gone = wait_until(Duration::from_secs(12), || sleeps() == 0);
    let took = stopped.elapsed();
    launch.signal(Signal::SIGCONT);
    assert!(
        gone,
        "the relays of a stopped launcher still run their workers"
    );
    assert!(
        took > Duration::from_secs(3),
        "the workers ended after {took:?}, before any heartbeat was missed"
    );
    let r = launch.wait_at_most(Duration::from_secs(20));
    r.assert_failed_as_the_launchers_pause("relays", &r.describe());
    assert!(
        r.err().contains(": 0 succeeded, 0 failed, 2 stopped"),
        "{}",
        r.describe()
    );
}

/// mpirun killed from outside while its ranks run: nothing would end them (their relays are
/// re-parented to the launcher), so the launcher fails the job naming mpirun, and stops them.
#[test]
fn kill_9_of_mpirun_ends_the_job_naming_it() {
    if mpirun_or_skip().is_none() {
        return;
    }
    let mark = unique("mpirun-kill9");
    let _cleanup = Cleanup(mark.clone());
    let (launch, mpirun) = two_ranks_sleeping_and_their_mpirun(&mark);
    kill(Pid::from_raw(mpirun), Signal::SIGKILL).unwrap();
    let r = launch.wait_at_most(Duration::from_secs(20));
    r.assert_code(128 + 9);
    assert_eq!(
        r.the_error_line("mpirun killed"),
        "error: mpirun failed first: mpirun ended with SIGKILL while ranks 0-1 still ran; it said \
         nothing",
        "{}",
        r.describe()
    );
    assert!(
        r.elapsed < Duration::from_secs(30),
        "the workers sleep 60 s; the job must end with mpirun, not with them\n{}",
        r.describe()
    );
    assert_no_process_with_env(
        MARK,
        &mark,
        Duration::from_secs(5),
        "after mpirun's kill -9",
    );
}

/// SIGTERM to mpirun itself (an admin, a batch system): mpirun stops its ranks with SIGTERM
/// and exits 1 a moment later. The relay of each host's first rank says that mpirun's side
/// signalled it, and the job fails as mpirun's stop, 128 + SIGTERM, whatever the workers make
/// of the signal (rank 0 exits 0, rank 1 dies of it): it was blamed on a rank that ended of the
/// SIGTERM, or on a relay's closed connection, with nothing said of mpirun.
#[test]
fn sigterm_to_mpirun_is_said_by_the_relays_it_reaches() {
    if mpirun_or_skip().is_none() {
        return;
    }
    let mark = unique("mpirun-term");
    let _cleanup = Cleanup(mark.clone());
    let (launch, mpirun) = two_ranks_and_their_mpirun(
        &mark,
        "1",
        "[ \"$OMPI_COMM_WORLD_RANK\" = 0 ] && trap 'echo got SIGTERM; exit 0' TERM; \
         echo ready; sleep 60 & wait",
    );
    kill(Pid::from_raw(mpirun), Signal::SIGTERM).unwrap();
    let r = launch.wait_at_most(Duration::from_secs(20));
    r.assert_code(128 + 15);
    // Rank 0 exited 0 of mpirun's SIGTERM, which it got once: stopped, not a success.
    assert_eq!(
        r.out().matches("[0]<stdout>:got SIGTERM").count(),
        1,
        "{}",
        r.describe()
    );
    assert!(
        r.err().contains(": 0 succeeded, 0 failed, 2 stopped"),
        "{}",
        r.describe()
    );
    let error = r.the_error_line("mpirun's stop");
    assert!(
        error.starts_with(
            "error: mpirun failed first: mpirun stopped its ranks: their relays got SIGTERM \
             from mpirun's side"
        ),
        "{error}\n{}",
        r.describe()
    );
    let said = format!("its relay got SIGTERM from mpirun's side (its parent, pid {mpirun})");
    let lines: Vec<String> = r
        .err()
        .lines()
        .filter(|l| l.contains(&said))
        .map(String::from)
        .collect();
    assert_eq!(lines.len(), 1, "once, by rank 0's relay\n{}", r.describe());
    assert!(
        lines[0].starts_with("atlasboost: rank 0 (host "),
        "the launcher names the relay's rank\n{}",
        r.describe()
    );
    assert_no_process_with_env(
        MARK,
        &mark,
        Duration::from_secs(5),
        "after mpirun's SIGTERM",
    );
}

/// A relay killed outright (`kill -9`): its rank's end is unknown, the relay is named (not its
/// host, which is fine), the others are stopped, and mpirun, which Open MPI leaves waiting for
/// nothing then, is ended at once: not `--grace` later.
#[test]
fn a_relay_killed_outright_is_named_and_the_job_ends_without_waiting_the_grace() {
    if mpirun_or_skip().is_none() {
        return;
    }
    let mark = unique("relay-kill9");
    let _cleanup = Cleanup(mark.clone());
    let (launch, _) = two_ranks_and_their_mpirun(&mark, "30", "echo ready; exec sleep 60");
    let relay_of_1 = descendants(launch.pid())
        .into_iter()
        .find(|p| {
            is_relay(p.pid)
                && std::fs::read(format!("/proc/{}/environ", p.pid))
                    .is_ok_and(|e| e.split(|b| *b == 0).any(|v| v == b"OMPI_COMM_WORLD_RANK=1"))
        })
        .unwrap_or_else(|| panic!("no relay of rank 1 below {}", launch.pid()));
    let killed = Instant::now();
    kill(Pid::from_raw(relay_of_1.pid), Signal::SIGKILL).unwrap();
    let r = launch.wait_at_most(Duration::from_secs(40));
    r.assert_code(125);
    assert!(
        killed.elapsed() < Duration::from_secs(15),
        "ended {:?} after the kill (--grace 30)\n{}",
        killed.elapsed(),
        r.describe()
    );
    let error = r.the_error_line("a relay killed");
    assert!(
        error.starts_with("error: the relay of rank 1 (host ")
            && error.ends_with(
                "failed first: it closed its connection before its worker ended (killed?)"
            ),
        "{error}\n{}",
        r.describe()
    );
    assert_no_process_with_env(
        MARK,
        &mark,
        Duration::from_secs(5),
        "after the relay's kill",
    );
}

/// A rank fails while mpirun, as Open MPI does when it ends a job, also sends SIGTERM to the
/// other relay (which the launcher's own stop reaches too): that worker gets one SIGTERM, not
/// two (a second is "abort now" to many programs), and keeps its grace; whichever comes first.
#[test]
fn a_worker_stopped_by_both_the_launcher_and_mpirun_gets_one_sigterm() {
    // The launcher's stop first (the stand-in signals rank 0 once rank 1 has exited).
    let f = rank_0_stopped_twice(&[("E2E_ABORT", "term")], "");
    assert!(f.err().contains("error: rank 1 (host"), "{}", f.describe());
    // mpirun's first: it signals rank 0 once rank 1 asks, and rank 1 fails once rank 0 has
    // its SIGTERM.
    let f = rank_0_stopped_twice(
        &[("E2E_TERM_ON", "stop-now")],
        "touch stop-now; i=0; while [ ! -e got ] && [ $i -lt 300 ]; do sleep 0.1; \
         i=$((i+1)); done;",
    );
    assert!(f.err().contains("error: rank 1 (host"), "{}", f.describe());
}

/// Rank 1 runs `then` once rank 0 has set its trap and exits 3; rank 0 saves on SIGTERM for a
/// second and exits 0; under the stand-in mpirun with `env`. Checks that rank 0 got one SIGTERM
/// and saved.
fn rank_0_stopped_twice(env: &[(&str, &str)], then: &str) -> atlasboost_e2e::Finished {
    let mut run = run_mpi(2)
        .args(["--grace", "5", "--", "sh", "-c"])
        .args([format!(
            "if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then i=0; \
         while [ ! -e trapped ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; {then} \
         exit 3; fi; \
         trap 'echo got SIGTERM; touch got; sleep 1; echo saved; exit 0' TERM; touch trapped; \
         sleep 30 & wait"
        )]);
    let fake = run.file("fake-mpirun", FAKE_MPIRUN, true);
    run = run.env("ATLASBOOST_MPIRUN", &fake);
    for (k, v) in env {
        run = run.env(k, v);
    }
    let f = run.run();
    f.assert_code(3);
    assert_eq!(
        f.out().matches("[0]<stdout>:got SIGTERM").count(),
        1,
        "{}",
        f.describe()
    );
    assert!(f.out().contains("[0]<stdout>:saved"), "{}", f.describe());
    f
}

/// The same with ranks on hosts mpirun reaches over ssh: its daemons there stop their relays
/// (SIGTERM) as mpirun dies, and those relays' reports can come before mpirun's end is seen;
/// mpirun is still the one named, not a rank that its daemon stopped.
#[test]
fn kill_9_of_mpirun_with_ranks_over_ssh_names_mpirun_not_a_rank() {
    if mpirun_or_skip().is_none() {
        return;
    }
    let Some(sshd) = atlasboost_e2e::Sshd::start() else {
        return;
    };
    let mark = unique("mpirun-kill9-ssh");
    let _cleanup = Cleanup(mark.clone());
    let mut launch = run_mpi(2)
        .env(
            "OMPI_MCA_plm_rsh_agent",
            format!("ssh -F {}", sshd.ssh_config().display()),
        )
        .args(["--grace", "1", "-x", &format!("{MARK}={mark}")])
        .args(["-H", "127.0.0.2:1,127.0.0.3:1", "--"])
        .args(["sh", "-c", "echo ready; sleep 60"])
        .spawn();
    launch.wait_for_lines("]<stdout>:ready", 2, Duration::from_secs(60));
    let mpirun = descendants(launch.pid())
        .into_iter()
        .find(|p| p.comm == "mpirun")
        .unwrap_or_else(|| panic!("no mpirun below the launcher {}", launch.pid()));
    kill(Pid::from_raw(mpirun.pid), Signal::SIGKILL).unwrap();
    let r = launch.wait_at_most(Duration::from_secs(30));
    r.assert_code(128 + 9);
    let line = r.the_error_line("mpirun killed");
    assert!(
        line.starts_with("error: mpirun failed first: mpirun ended with SIGKILL"),
        "{line}\n{}",
        r.describe()
    );
    assert_no_process_with_env(
        MARK,
        &mark,
        Duration::from_secs(10),
        "after mpirun's kill -9",
    );
}

#[test]
fn mpirun_failing_on_its_own_is_named_with_its_words() {
    if mpirun_or_skip().is_none() {
        return;
    }
    // A host mpirun reaches through an ssh that is not there: it refuses before starting any
    // rank. (Too few slots, which it refuses as well, atlasboost refuses first.)
    let f = Run::new(["run", "--mpi", "--sim", "8", "-H", "127.0.0.2:2", "-n", "2"])
        .env("OMPI_MCA_plm_rsh_agent", "/nonexistent/ssh")
        .args(["--", "true"])
        .timeout(Duration::from_secs(60))
        .run();
    let code = f.code().unwrap_or(0);
    assert!(
        code != 0 && code != 125,
        "mpirun's own code: {}",
        f.describe()
    );
    let err = f.err();
    // The error gives the headline of mpirun's message, not the tail of its banner.
    let error = err
        .lines()
        .find(|l| l.starts_with("error: mpirun failed first: mpirun ended with exit"))
        .unwrap_or_else(|| panic!("{}", f.describe()));
    assert!(
        error.contains("The value of the MCA parameter \"plm_rsh_agent\" was set to a path"),
        "mpirun's own words: {error}"
    );
    assert!(err.contains("not started"), "the summary: {err}");
}

/// A host's own HCCL `CM_*` and MindSpore `MS_ROLE` (a remote host's login environment; here
/// mpirun's, through a wrapper that sets them as a login shell would) are kept from the
/// workers by their relays; one that `-x` gives still reaches them.
#[test]
fn each_relay_keeps_its_hosts_other_startup_variables_from_its_worker_and_sets_the_defaults() {
    let Some(mpirun) = mpirun_or_skip() else {
        return;
    };
    let run = run_mpi(2).args([
        "-x",
        "CM_WORKER_SIZE=16",
        "--grace",
        "1",
        "--",
        "sh",
        "-c",
        "echo role=$MS_ROLE chief=$CM_CHIEF_IP size=$CM_WORKER_SIZE \
         omp=$OMP_NUM_THREADS hccl=$HCCL_CONNECT_TIMEOUT",
    ]);
    // Also SPEC §9's defaults, each unless the environment has it: set by the relay before
    // the worker starts (OpenMP reads its variable as it loads, before any init()).
    let wrapper = run.file(
        "mpirun-with-a-login-environment",
        format!(
            "#!/bin/sh\nexport MS_ROLE=MS_WORKER CM_CHIEF_IP=10.9.9.9 HCCL_CONNECT_TIMEOUT=900\n\
             unset OMP_NUM_THREADS\nexec {} \"$@\"\n",
            mpirun.display()
        ),
        true,
    );
    let f = run.env("ATLASBOOST_MPIRUN", wrapper).run();
    f.assert_code(0);
    let out = f.out();
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort_unstable();
    assert_eq!(
        lines,
        [
            "[0]<stdout>:role= chief= size=16 omp=1 hccl=900",
            "[1]<stdout>:role= chief= size=16 omp=1 hccl=900"
        ],
        "{}",
        f.describe()
    );
}

#[test]
fn a_relay_started_by_hand_says_what_it_is_for() {
    // `atlasboost relay`, and the relay program beside it, which needs the same.
    let program = atlasboost_e2e::atlasboost_bin().with_file_name("atlasboost-relay");
    for by_hand in [
        Run::new(["relay", "--", "true"]),
        Run::new(["--", "true"]).program(&program),
    ] {
        let f = by_hand.run();
        f.assert_code(2);
        assert!(
            f.err()
                .contains("is started by mpirun for `atlasboost run --mpi`"),
            "{}",
            f.describe()
        );
    }
}

/// Each rank's relay's command line, as its worker sees it (`/proc/$PPID/cmdline`), by rank.
fn relay_command_lines(run: Run) -> BTreeMap<u32, String> {
    let f = run
        .args([
            "-q",
            "--",
            "sh",
            "-c",
            r#"tr '\0' ' ' < /proc/$PPID/cmdline; echo"#,
        ])
        .run();
    f.assert_code(0);
    let lines = lines_by_rank(&f.out(), "stdout");
    lines
        .into_iter()
        .map(|(rank, mut l)| (rank, l.pop().unwrap_or_default()))
        .collect()
}

#[test]
fn ranks_here_run_the_relay_program_beside_atlasboost_and_others_atlasboost_relay() {
    if mpirun_or_skip().is_none() {
        return;
    }
    // As the launcher finds itself (`/proc/self/exe`) and mpirun names the relay.
    let bin = std::fs::canonicalize(atlasboost_e2e::atlasboost_bin()).unwrap();
    let relay = bin.with_file_name("atlasboost-relay");
    assert!(relay.is_file(), "{} is not built", relay.display());
    // Every rank here: the relay program (as scripts/build-static-relay.sh links it, or not).
    let here = relay_command_lines(run_mpi(2));
    assert_eq!(here.len(), 2, "{here:?}");
    for line in here.values() {
        assert!(
            line.starts_with(&format!("{} -- sh -c ", relay.display())),
            "{line}"
        );
    }
    // Hosts given (mpirun may start ranks elsewhere, where only atlasboost is sure to be):
    // `atlasboost relay`.
    let listed = relay_command_lines(run_mpi(2).args(["-H", "localhost:2"]));
    assert_eq!(listed.len(), 2, "{listed:?}");
    for line in listed.values() {
        assert!(
            line.starts_with(&format!("{} relay -- sh -c ", bin.display())),
            "{line}"
        );
    }
    // An atlasboost without the relay program beside it relays with itself.
    let alone = run_mpi(2);
    let copy = alone.dir().join("alone").join("atlasboost");
    std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
    if std::fs::hard_link(&bin, &copy).is_err() {
        std::fs::copy(&bin, &copy).unwrap_or_else(|e| panic!("cannot copy {}: {e}", bin.display()));
    }
    let copy = std::fs::canonicalize(&copy).unwrap();
    let by_itself = relay_command_lines(alone.program(&copy));
    assert_eq!(by_itself.len(), 2, "{by_itself:?}");
    for line in by_itself.values() {
        assert!(
            line.starts_with(&format!("{} relay -- sh -c ", copy.display())),
            "{line}"
        );
    }
    // --remote-atlasboost is for other hosts: with every rank here it is unused and said (it
    // made mpirun start a path that is not there, and the job fail).
    // Also with -H naming only this machine.
    for hosts in [&[][..], &["-H", "localhost:2"][..]] {
        let f = run_mpi(2)
            .args(hosts)
            .args([
                "--remote-atlasboost",
                "/nonexistent/atlasboost",
                "--",
                "true",
            ])
            .run();
        f.assert_code(0);
        let said = "--remote-atlasboost unused: every rank is on this machine";
        f.assert_err(&[said], &[]);
    }
}

#[test]
fn the_relay_program_started_by_hand_says_what_it_is_for() {
    let relay = atlasboost_e2e::atlasboost_bin().with_file_name("atlasboost-relay");
    for args in [&[][..], &["true"][..], &["--"][..]] {
        let f = Run::new(args).program(&relay).run();
        f.assert_code(2);
        assert!(
            f.err().contains(
                "usage: atlasboost-relay -- COMMAND [ARGS]... (mpirun starts it for \
                 `atlasboost run --mpi`, not by hand)"
            ),
            "{}",
            f.describe()
        );
    }
    // (With a command and nothing else, it asks for what mpirun and the launcher give it: the
    // test above.) Started by a launcher of another build (a relay program left beside a newer
    // atlasboost): refused before it connects or starts anything, naming itself and both
    // versions.
    let f = Run::new(["--", "true"])
        .program(&relay)
        .env("ATLASBOOST_RELAY_ADDR", "127.0.0.1:9")
        .env("ATLASBOOST_RELAY_SECRET", "ab".repeat(32))
        .env("ATLASBOOST_JOB_ID", "ab-1")
        .env("ATLASBOOST_RELAY_VERSION", "0.0.9+atlasboost-agent-7")
        .run();
    f.assert_code(2);
    let relay = std::fs::canonicalize(&relay).unwrap();
    assert!(
        f.err().contains(&format!(
            "atlasboost-relay: error: this relay ({}) is atlasboost ",
            relay.display()
        )) && f
            .err()
            .contains("and the launcher that started it is atlasboost 0.0.9+atlasboost-agent-7"),
        "{}",
        f.describe()
    );
}

#[test]
fn relays_on_hosts_that_mpirun_reaches_over_ssh_report_to_the_launcher() {
    if mpirun_or_skip().is_none() {
        return;
    }
    let Some(sshd) = atlasboost_e2e::Sshd::start() else {
        return;
    };
    // mpirun reaches 127.0.0.2 and 127.0.0.3 over ssh (to this test's sshd) and starts its
    // daemons there, which start the relays; the relays connect back to the launcher.
    let f = run_mpi(4)
        .env(
            "OMPI_MCA_plm_rsh_agent",
            format!("ssh -F {}", sshd.ssh_config().display()),
        )
        .args(["-H", "127.0.0.2:2,127.0.0.3:2", "--", "sh", "-c"])
        .args(["echo rank $OMPI_COMM_WORLD_RANK local $OMPI_COMM_WORLD_LOCAL_RANK"])
        .run();
    f.assert_code(0);
    let out = lines_by_rank(&f.out(), "stdout");
    let expected: BTreeMap<u32, Vec<String>> = (0..4)
        .map(|r| (r, vec![format!("rank {r} local {}", r % 2)]))
        .collect();
    assert_eq!(out, expected, "{}", f.describe());
    assert!(
        f.err().contains("4 succeeded, 0 failed"),
        "{}",
        f.describe()
    );
    assert!(
        sshd.log().contains("Accepted publickey"),
        "mpirun went through ssh: {}",
        sshd.log()
    );
}

/// Whether relays can make their workers' cgroups here: where the launcher can, a relay can
/// (the same user, the same machine). Skips (saying why) when not.
fn relays_can_make_cgroups() -> bool {
    let probe = Run::new(["run", "-v", "--sim", "1", "--", "true"]).run();
    let note = probe.err();
    let note = note
        .lines()
        .find(|l| l.contains("cgroup"))
        .unwrap_or_default();
    atlasboost_e2e::cgroup_or_skip(note)
}

/// A relay that mpirun's daemon started on a host the launcher is not above (reached over
/// ssh) and that dies of SIGKILL leaves nothing of its worker running, not even a process in a
/// session of its own (setsid): there the workers' cgroup is the relays' default.
#[test]
fn a_relay_killed_on_a_host_reached_over_ssh_leaves_no_setsid_child() {
    if mpirun_or_skip().is_none() {
        return;
    }
    if !relays_can_make_cgroups() {
        return;
    }
    let Some(sshd) = atlasboost_e2e::Sshd::start() else {
        return;
    };
    let mark = unique("mpi-remote-setsid");
    let script = format!(
        "setsid sh -c 'sleep 300; : {mark}-daemon' & echo ready; exec sh -c 'sleep 300; : {mark}-worker'"
    );
    let mut launch = run_mpi(2)
        .env(
            "OMPI_MCA_plm_rsh_agent",
            format!("ssh -F {}", sshd.ssh_config().display()),
        )
        .args([
            "--grace",
            "1",
            "-H",
            "127.0.0.2:1,127.0.0.3:1",
            "--",
            "sh",
            "-c",
        ])
        .args([&script])
        .spawn();
    launch.wait_for_lines("]<stdout>:ready", 2, Duration::from_secs(60));
    let marked = |what: &str| -> Vec<atlasboost_e2e::ProcStat> {
        atlasboost_e2e::all_pids()
            .into_iter()
            .filter(|&pid| {
                // The daemon's or worker's own shell (the launcher's and relays' command
                // lines hold the whole script).
                atlasboost_e2e::cmdline(pid)
                    .is_some_and(|c| c.last() == Some(&format!("sleep 300; : {mark}-{what}")))
            })
            .filter_map(atlasboost_e2e::proc_stat)
            .filter(atlasboost_e2e::ProcStat::alive)
            .collect()
    };
    // Both daemons are up (they start a moment after "ready"); a worker's parent is its relay.
    assert!(
        wait_until(Duration::from_secs(10), || marked("daemon").len() == 2),
        "{:?}",
        marked("daemon")
    );
    let relay = marked("worker")
        .first()
        .map(|w| w.ppid)
        .expect("a worker runs");
    assert!(
        is_relay(relay),
        "the worker's parent is a relay: {:?}",
        atlasboost_e2e::cmdline(relay)
    );
    let _ = kill(Pid::from_raw(relay), Signal::SIGKILL);
    let r = launch.wait_at_most(Duration::from_secs(60));
    assert_ne!(r.code(), Some(0), "{}", r.describe());
    let gone = wait_until(Duration::from_secs(10), || marked("daemon").is_empty());
    let left: Vec<i32> = marked("daemon").iter().map(|p| p.pid).collect();
    for &pid in &left {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
    assert!(
        gone,
        "setsid children left running: {left:?}\n{}",
        r.describe()
    );
}

#[test]
fn what_can_be_refused_before_mpirun_starts_is() {
    // No mpirun needed: these are refused before it would start.
    let f = run_mpi(2).args(["--ranks", "5", "--", "true"]).run();
    f.assert_code(2);
    assert!(
        f.err()
            .contains("--ranks 5: rank 5 is not in this job of 2 ranks (0-1)"),
        "{}",
        f.describe()
    );
    let f = run_mpi(2)
        .args(["--metrics", "127.0.0.1:0", "--", "true"])
        .run();
    f.assert_code(2);
    assert!(
        f.err().contains("--metrics is not built for --mpi yet"),
        "{}",
        f.describe()
    );
    let f = run_mpi(2)
        .args(["--monitor-interval", "2", "--", "true"])
        .run();
    f.assert_code(2);
    assert!(
        f.err()
            .contains("--monitor-interval is not built for --mpi yet"),
        "{}",
        f.describe()
    );
    // `off` asks for no sampling: nothing to refuse (mpirun is past that check, and missing).
    let f = run_mpi(2)
        .env("ATLASBOOST_MPIRUN", "/nonexistent/mpirun")
        .args(["--monitor-interval", "off", "--", "true"])
        .run();
    f.assert_code(125);
    assert!(!f.err().contains("--monitor-interval"), "{}", f.describe());
    // An mpirun that cannot start: the events still end with the attempt and the summary.
    let f = run_mpi(2)
        .env("ATLASBOOST_MPIRUN", "/nonexistent/mpirun")
        .args(["--events", "events.jsonl", "--", "true"])
        .run();
    // atlasboost's tool, not the worker's command: 125, as for ssh (SPEC §8).
    f.assert_code(125);
    assert!(
        f.err().contains(
            "cannot start /nonexistent/mpirun on host this machine (--mpi runs Open MPI's \
             mpirun: Debian's openmpi-bin, or ATLASBOOST_MPIRUN=PATH): command not found"
        ),
        "{}",
        f.describe()
    );
    let events = std::fs::read_to_string(f.dir().join("events.jsonl")).unwrap();
    let last: Vec<serde_json::Value> = events
        .lines()
        .rev()
        .take(2)
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        last[0]["event"] == "summary"
            && last[0]["exit_code"] == 125
            && last[1]["event"] == "attempt_end"
            && last[1]["ended"]
                .as_str()
                .is_some_and(|e| e.contains("/nonexistent/mpirun")),
        "{events}"
    );
    let f = run_mpi(2).args(["--", ""]).run();
    f.assert_code(2);
    assert!(
        f.err().contains("the command to run is empty"),
        "{}",
        f.describe()
    );
    // Hosts without slots, of which mpirun would give each one; more ranks than slots.
    for (args, says) in [
        (
            &["-H", "127.0.0.1,127.0.0.2", "-n", "2"][..],
            "--mpi: host 127.0.0.1 (-H) has no slots, and mpirun would give it one",
        ),
        (
            &["-H", "127.0.0.1:2", "-n", "4"],
            "-n 4 is more than the 2 slots of 1 host",
        ),
    ] {
        let f = Run::new(["run", "--mpi"])
            .args(args)
            .args(["--", "true"])
            .run();
        f.assert_code(2);
        assert!(f.err().contains(says), "{}", f.describe());
    }
}

/// One host without slots takes every rank asked for (mpirun alone would give it one).
#[test]
fn one_host_without_slots_takes_the_ranks_asked_for() {
    if mpirun_or_skip().is_none() {
        return;
    }
    let f = Run::new([
        "run",
        "--mpi",
        "--sim",
        "4",
        "-H",
        "127.0.0.1",
        "-n",
        "2",
        "--",
    ])
    .args(["sh", "-c", "echo rank $OMPI_COMM_WORLD_RANK"])
    .timeout(Duration::from_secs(60))
    .run();
    f.assert_code(0);
    assert_eq!(
        f.out().matches("<stdout>:rank ").count(),
        2,
        "{}",
        f.describe()
    );
}

/// A stand-in for mpirun (`ATLASBOOST_MPIRUN`): it starts the ranks itself, as Open MPI's
/// variables say, from the command `run --mpi` builds; then it lingers `E2E_LINGER` seconds,
/// and exits `E2E_EXIT`. `E2E_SKIP_RANK` is a rank it does not start; `E2E_STAGGER` seconds
/// pass between two ranks' starts (so that they reach the launcher in rank order).
/// `E2E_ABORT=1`: mpirun's abort at its harshest, without its SIGTERM first: when the last
/// rank fails, every other rank is killed with SIGKILL and mpirun exits with that rank's code.
/// `E2E_ABORT=term`: Open MPI's way, SIGTERM to the others (their relays), then that code.
/// `E2E_IGNORE_TERM=1`: it ignores SIGTERM (and so do the ranks it starts). `E2E_TERM_ON=FILE`:
/// once FILE exists (30 s at most), SIGTERM to every rank but the last, as when mpirun is
/// signalled.
const FAKE_MPIRUN: &str = r#"#!/bin/sh
[ -n "$E2E_IGNORE_TERM" ] && trap '' TERM
np=; wdir=.
while [ $# -gt 0 ]; do
  case "$1" in
    -np|-H|-bind-to|-map-by) [ "$1" = -np ] && np=$2; shift 2 ;;
    --mca) shift 3 ;;
    -x) case "$2" in *=*) export "$2" ;; esac; shift 2 ;;
    -wdir) wdir=$2; shift 2; break ;;
    *) shift ;;
  esac
done
cd "$wdir" || exit 1
i=0; pids=; last=
while [ "$i" -lt "$np" ]; do
  if [ "$i" != "$E2E_SKIP_RANK" ]; then
    [ "$i" -gt 0 ] && [ -n "$E2E_STAGGER" ] && sleep "$E2E_STAGGER"
    OMPI_COMM_WORLD_RANK=$i OMPI_COMM_WORLD_SIZE=$np OMPI_COMM_WORLD_LOCAL_RANK=$i \
      OMPI_COMM_WORLD_LOCAL_SIZE=$np "$@" &
    pids="$pids $last"; last=$!
  fi
  i=$((i + 1))
done
if [ -n "$E2E_TERM_ON" ]; then
  i=0; while [ ! -e "$E2E_TERM_ON" ] && [ "$i" -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
  kill -TERM $pids
fi
if [ -n "$E2E_ABORT" ]; then
  wait "$last"; code=$?
  if [ "$code" != 0 ]; then
    if [ "$E2E_ABORT" = term ]; then kill -TERM $pids; else kill -KILL $pids; fi
    wait
    echo "fake mpirun: rank $((np - 1)) failed; killed the others"
    exit "$code"
  fi
fi
wait
[ -n "$E2E_LINGER" ] && sleep "$E2E_LINGER"
echo "fake mpirun: done"
exit "${E2E_EXIT:-0}"
"#;

/// mpirun that goes on after its ranks have all ended well and their relays are done (its
/// daemons on other hosts slow to go, a lost one): SIGTERM `--grace` later, quietly, and the
/// job ends then (it was SIGKILL, said).
#[test]
fn an_mpirun_that_lingers_after_its_ranks_gets_sigterm() {
    let run = run_mpi(2)
        .args(["--grace", "3", "--", "sh", "-c"])
        .args(["echo hello"]);
    let fake = run.file("fake-mpirun", FAKE_MPIRUN, true);
    let f = run
        .env("ATLASBOOST_MPIRUN", &fake)
        .env("E2E_LINGER", "60")
        .run();
    f.assert_code(0);
    assert!(f.elapsed < Duration::from_secs(20), "{}", f.describe());
    assert!(!f.err().contains("killing it"), "{}", f.describe());
    assert_eq!(
        lines_by_rank(&f.out(), "stdout").len(),
        2,
        "{}",
        f.describe()
    );
}

/// One that ignores SIGTERM too gets SIGKILL `--grace` later, said.
#[test]
fn an_mpirun_that_lingers_and_ignores_sigterm_is_killed_after_the_grace_time() {
    let run = two_ranks_sh("echo hello $OMPI_COMM_WORLD_RANK");
    let fake = run.file("fake-mpirun", FAKE_MPIRUN, true);
    let started = Instant::now();
    let f = run
        .env("ATLASBOOST_MPIRUN", &fake)
        .env("E2E_LINGER", "60")
        .env("E2E_IGNORE_TERM", "1")
        .run();
    // The ranks succeeded: the job did, although mpirun had to be killed.
    f.assert_code(0);
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{}",
        f.describe()
    );
    assert!(
        f.err().contains(
            "mpirun had not exited 1s after its SIGTERM, every rank having ended; killing it"
        ),
        "{}",
        f.describe()
    );
    assert_eq!(
        lines_by_rank(&f.out(), "stdout").len(),
        2,
        "{}",
        f.describe()
    );
}

#[test]
fn a_rank_mpirun_never_started_fails_the_job_by_name() {
    let run = run_mpi(4);
    let fake = run.file("fake-mpirun", FAKE_MPIRUN, true);
    let f = run
        .env("ATLASBOOST_MPIRUN", &fake)
        .env("E2E_SKIP_RANK", "1")
        .args(["--", "true"])
        .run();
    f.assert_code(125);
    assert!(
        f.err().contains(
            "error: mpirun failed first: mpirun ended with exit 0, but rank 1 never \
             started (it said: fake mpirun: done)"
        ),
        "{}",
        f.describe()
    );
    // The others ran and succeeded; the summary says which one never started, with no device
    // or run time it never had.
    assert!(
        f.err()
            .contains("3 succeeded, 0 failed, 0 stopped, 1 not started"),
        "{}",
        f.describe()
    );
    let row: Vec<String> = f
        .err()
        .lines()
        .find(|l| l.trim_start().starts_with("1 "))
        .unwrap_or_else(|| panic!("{}", f.describe()))
        .split_whitespace()
        .map(str::to_string)
        .collect();
    assert_eq!(
        row,
        ["1", "-", "-", "not", "started", "-"],
        "{}",
        f.describe()
    );
}

#[test]
fn what_a_worker_leaves_behind_is_killed_after_the_grace_time() {
    if mpirun_or_skip().is_none() {
        return;
    }
    let mark = unique("mpi-leftover");
    let _cleanup = Cleanup(mark.clone());
    // Each worker leaves a process in its group that ignores SIGTERM, and exits 0.
    let started = Instant::now();
    let f = run_mpi(2)
        .args([
            "--grace",
            "1",
            "-x",
            &format!("{MARK}={mark}"),
            "--",
            "sh",
            "-c",
        ])
        .args(["sh -c 'trap \"\" TERM; sleep 300' & echo left one"])
        .run();
    f.assert_code(0);
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the relays kill what is left after --grace 1: {}",
        f.describe()
    );
    assert!(
        f.err().contains("2 succeeded, 0 failed"),
        "{}",
        f.describe()
    );
    assert_no_process_with_env(MARK, &mark, Duration::from_secs(5), "after the job");
}

/// A console read only after longer than a relay may go unheard (4 s): the launcher stops
/// reading its relays while the console holds 1 MiB back; the relays hold their workers'
/// output back in turn and wait, hearing the launcher's heartbeats. Nothing is lost. (More
/// lines than the pipes and socket buffers between a worker and the launcher hold: 7 MB a
/// rank.)
#[test]
fn relays_wait_for_a_console_read_late() {
    if mpirun_or_skip().is_none() {
        return;
    }
    let f = run_mpi(2)
        .args(["-q", "--", "seq", "1", "1000000"])
        .nonblocking_stdout(Duration::from_secs(7))
        .run();
    f.assert_code(0);
    crate::assert_seq_by_rank(&f.out(), 2, 1_000_000, &f.err());
}

/// A rank fails while the console holds the output back: mpirun aborts the job and kills the
/// other relay, and the launcher reads both only when the console takes output again, in one
/// pass. The rank that reported its failure is the job's first failure (and its code the
/// job's), ahead of the relay whose connection closed because mpirun killed it. Through the
/// stand-in mpirun, so that it happens the same way every time: rank 0 reaches the launcher
/// first (and is read first in a pass), prints enough to hold the console, and is killed with
/// SIGKILL (its connection ends with its last data) when rank 1 fails.
#[test]
fn a_rank_failing_while_the_console_is_held_is_still_named_first() {
    let f = rank_1_fails_while_the_console_is_held("1");
    let err = f.err();
    assert!(!err.contains("protocol"), "no stream was cut:\n{err}");
    // Rank 0's relay was killed before it could say how its worker ended: not a lost host.
    let row = err
        .lines()
        .find(|l| l.split_whitespace().next() == Some("0"))
        .unwrap_or_else(|| panic!("no summary row of rank 0:\n{err}"));
    assert!(
        row.contains("stopped (status unknown)") && !err.contains("host lost"),
        "rank 0's row: {row}\n{err}"
    );
    // Rank 0's lines, up to what its relay had sent when it was killed: whole, in order.
    let by_rank = lines_by_rank(&f.out(), "stdout");
    let rank_0 = by_rank.get(&0).map_or(&[][..], Vec::as_slice);
    let want: Vec<String> = (1..=rank_0.len()).map(|i| i.to_string()).collect();
    assert!(
        rank_0.len() > 50_000 && rank_0 == want,
        "rank 0: {} lines, whole and in order from 1\n{}",
        rank_0.len(),
        f.describe()
    );
}

/// The same with mpirun's SIGTERM to the other rank, as Open MPI does: its relay says that
/// mpirun's side stopped it, and that news (read first: its relay was admitted first) does not
/// take the job's failure from the rank that failed.
#[test]
fn a_rank_failing_first_is_named_though_mpiruns_stop_is_read_before_it() {
    let f = rank_1_fails_while_the_console_is_held("term");
    assert!(
        !f.err().contains("mpirun stopped its ranks"),
        "{}",
        f.describe()
    );
}

/// Rank 1 fails 2 s in while rank 0 prints enough to hold a console that takes nothing for 7 s,
/// under the stand-in mpirun whose abort (`E2E_ABORT`) then ends rank 0; rank 0 reaches the
/// launcher first (and is read first in a pass). Checks that rank 1's failure is the job's.
fn rank_1_fails_while_the_console_is_held(abort: &str) -> atlasboost_e2e::Finished {
    let run = two_ranks_sh(
        "if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then sleep 2; exit 3; fi; seq 1 80000; sleep 30",
    );
    let fake = run.file("fake-mpirun", FAKE_MPIRUN, true);
    let f = run
        .env("ATLASBOOST_MPIRUN", &fake)
        .env("E2E_STAGGER", "0.5")
        .env("E2E_ABORT", abort)
        .nonblocking_stdout(Duration::from_secs(7))
        .run();
    f.assert_code(3);
    let err = f.err();
    assert!(
        err.contains("error: rank 1 (host") && err.contains("failed first: exit 3"),
        "rank 1's failure is the job's:\n{err}"
    );
    f
}

/// A relay stopped by a signal of its own (mpirun's stop reaches each relay) while the console
/// holds the output back for longer than the grace time: its worker, which ignores SIGTERM, is
/// killed after the grace time, and the relay keeps its last frames whole for the launcher,
/// which is still heard, rather than give it up then (a relay that did closed its connection
/// with its worker's end unsaid). The launcher names that rank's end.
#[test]
fn a_relay_stopped_while_the_console_is_held_keeps_its_frames_whole() {
    if mpirun_or_skip().is_none() {
        return;
    }
    // The workers ignore SIGTERM, so that the relay's grace time runs out while it waits.
    let mut launch = two_ranks_sh("trap '' TERM; seq 1 1000000; exec sleep 30")
        .nonblocking_stdout(Duration::from_secs(8))
        .spawn();
    let mark = launch.mark().to_string();
    // Rank 0's worker (it exists once its relay has taken its signals in hand), then a moment
    // for the relay to fill what the held launcher does not take.
    let rank_0 = |p: &atlasboost_e2e::ProcStat| {
        std::fs::read(format!("/proc/{}/environ", p.pid))
            .is_ok_and(|e| e.split(|b| *b == 0).any(|v| v == b"OMPI_COMM_WORLD_RANK=0"))
    };
    let mut worker = None;
    atlasboost_e2e::wait_until(Duration::from_secs(30), || {
        worker = atlasboost_e2e::pids_with_env(atlasboost_e2e::LAUNCH_MARK, &mark)
            .into_iter()
            .find(|p| rank_0(p) && (p.comm == "seq" || p.comm == "sleep"));
        worker.is_some()
    });
    let worker = worker.unwrap_or_else(|| panic!("rank 0's worker did not start within 30 s"));
    std::thread::sleep(Duration::from_secs(1));
    // Its relay: the nearest ancestor that is a relay (seq's parent is the sh).
    let relay = std::iter::successors(Some(worker.ppid), |&pid| {
        atlasboost_e2e::proc_stat(pid).map(|p| p.ppid)
    })
    .take(3)
    .find(|&pid| is_relay(pid))
    .unwrap_or_else(|| panic!("no relay above rank 0's worker {}", worker.pid));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(relay), Signal::SIGTERM).unwrap();
    assert!(launch.is_running(), "the console is still held");
    let f = launch.wait();
    let err = f.err();
    assert!(
        err.contains("error: rank 0 (host") && err.contains("failed first"),
        "rank 0's end is the job's first failure:\n{err}"
    );
    assert!(
        !err.contains("protocol") && !err.contains("closed its connection"),
        "no stream was cut:\n{err}"
    );
}

/// A relay below the launcher makes its worker's cgroup only when asked (`ATLASBOOST_CGROUP=1`
/// in the launcher's environment, which the relays of this host inherit through mpirun; `run
/// --mpi` adds `-x` for other hosts): by default its worker stays in the relay's own cgroup.
#[test]
fn a_relay_makes_its_workers_cgroup_only_when_asked() {
    if mpirun_or_skip().is_none() {
        return;
    }
    if !relays_can_make_cgroups() {
        return;
    }
    for (asked, want) in [(None, false), (Some("1"), true)] {
        let mut run = run_mpi(2).args(["-q", "--", "sh", "-c", "grep ^0:: /proc/self/cgroup"]);
        if let Some(v) = asked {
            run = run.env("ATLASBOOST_CGROUP", v);
        }
        let f = run.run();
        f.assert_code(0);
        let lines = lines_by_rank(&f.out(), "stdout");
        assert_eq!(lines.len(), 2, "{}", f.describe());
        for (rank, l) in &lines {
            assert_eq!(
                l.iter().any(|l| l.contains("/atlasboost-")),
                want,
                "ATLASBOOST_CGROUP={asked:?}: rank {rank}'s cgroup: {l:?}"
            );
        }
    }
}

/// A command that cannot be started under `--mpi` is its rank's failure, 127, named with the
/// command, not a lost host; said once, though every rank's relay fails alike.
#[test]
fn a_command_not_found_under_mpi_is_the_ranks_failure() {
    let run = run_mpi(4);
    let fake = run.file("fake-mpirun", FAKE_MPIRUN, true);
    let logs = run.dir().join("logs");
    let f = run
        .env("ATLASBOOST_MPIRUN", &fake)
        .args(["--log-dir", "logs", "--", "/nonexistent/cmd"])
        .run();
    // Each rank failed by itself, none was stopped: however soon after the first it said so.
    f.assert_code(127).assert_err(
        &[
            "/nonexistent/cmd",
            "command not found",
            "exit 127",
            "0 succeeded, 4 failed, 0 stopped",
        ],
        &[
            "lost",
            "error: host",
            "wrote nothing on stderr",
            "stopped (exit",
        ],
    );
    // No worker ran: no empty logs are kept, as without --mpi.
    let kept: Vec<_> = std::fs::read_dir(&logs)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(kept.is_empty(), "{kept:?} in {}", logs.display());
    let said = f
        .err()
        .lines()
        .filter(|l| l.contains("cannot start /nonexistent/cmd"))
        .count();
    // Once as it happens, once in the error line.
    assert_eq!(said, 2, "{}", f.describe());
    // The error line gives the relay's reason, on the rank's host.
    let error = f.the_error_line("command not found");
    let host = error
        .split_once("(host ")
        .and_then(|(_, rest)| rest.split_once(','))
        .map_or("", |(host, _)| host);
    assert!(
        error.contains(") failed first: exit 127 after ")
            && error.ends_with(&format!(
                " s: cannot start /nonexistent/cmd on host {host}: command not found"
            )),
        "{}",
        f.describe()
    );
}

/// A relay's own message (here: what its worker left running is stopped) reaches the launcher
/// as atlasboost's, naming the rank, not as a line of the rank's stderr through mpirun.
#[test]
fn a_relays_own_message_is_the_launchers_naming_the_rank() {
    let run = run_mpi(2);
    let fake = run.file("fake-mpirun", FAKE_MPIRUN, true);
    let f = run
        .env("ATLASBOOST_MPIRUN", &fake)
        .args(["--grace", "1", "--", "sh", "-c", "sleep 30 & echo hi"])
        .run();
    f.assert_code(0);
    let err = f.err();
    for rank in 0..2 {
        assert!(
            err.lines().any(
                |l| l.starts_with(&format!("atlasboost: rank {rank} (host "))
                    && l.contains("): the worker has exited; stopping what it left running")
            ),
            "{}",
            f.describe()
        );
    }
}
