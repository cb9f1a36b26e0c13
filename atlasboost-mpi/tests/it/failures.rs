//! A missing rank: timeouts, and what Open MPI's mpirun then does.

use std::time::{Duration, Instant};

use atlasboost_core::Rendezvous;
use atlasboost_core::exchange::error_chain;
use atlasboost_mpi::MpiRendezvous;

use crate::harness::{self, RANKS, parse, report, under_mpirun};

/// The timeout of these tests.
const SHORT: Duration = Duration::from_secs(2);
/// How long the missing rank sleeps: far beyond the others' timeout, and beyond what the whole
/// run may take when the job is torn down as expected.
const MISSING_SLEEP: Duration = Duration::from_secs(20);

/// Every rank joins with a 2 s timeout; ranks 0, 1 and 2 then all-gather, rank 3 sleeps
/// instead. Ranks 0..2 report the all-gather's error and how long it took, and the error of a
/// barrier after it, and return their broken rendezvous; rank 3 returns `None` if it wakes.
fn all_gather_without_rank_3(test: &str) -> Option<MpiRendezvous> {
    let mut rdv = MpiRendezvous::world(SHORT).expect("joining the MPI rendezvous");
    let index = rdv.index();
    report(test, index, "joined=yes");
    if index == 3 {
        report(test, index, format_args!("skips_for={MISSING_SLEEP:?}"));
        std::thread::sleep(MISSING_SLEEP);
        // Not reached when the job is torn down as expected.
        report(test, index, "woke=yes");
        return None;
    }
    let started = Instant::now();
    let err = rdv
        .all_gather(b"three of four")
        .expect_err("all_gather without rank 3");
    let ms = started.elapsed().as_millis();
    report(test, index, format_args!("waited_ms={ms}"));
    report(
        test,
        index,
        format_args!("temporary={}", err.is_temporary()),
    );
    report(test, index, format_args!("error={}", error_chain(&err)));
    let started = Instant::now();
    let again = rdv.barrier().expect_err("a broken rendezvous");
    report(
        test,
        index,
        format_args!(
            "again_ms={} again={}",
            started.elapsed().as_millis(),
            error_chain(&again)
        ),
    );
    Some(rdv)
}

/// Checks what ranks 0, 1 and 2 reported after timing out without rank 3.
fn check_timed_out(run: &harness::Run) {
    assert_eq!(run.by_rank().len(), RANKS, "{run}");
    assert!(run.has(3, "skips_for"), "{run}");
    assert!(!run.has(3, "woke"), "rank 3 was killed in its sleep\n{run}");
    assert!(
        run.elapsed < MISSING_SLEEP,
        "the job ended before rank 3 woke up\n{run}"
    );
    for rank in 0..3 {
        let ms: u128 = parse(&run.text(rank, "waited_ms"), "waited_ms");
        // Not early; and ended by the timeout, not by rank 3 waking (a bound, not a speed
        // check: a loaded machine may be slow).
        assert!(
            ms >= 2000 && ms < MISSING_SLEEP.as_millis(),
            "rank {rank} waited {ms} ms for a 2 s timeout\n{run}"
        );
        assert_eq!(run.text(rank, "temporary"), "false", "{run}");
        let err = run.text(rank, "error");
        for part in [
            "rendezvous failed (mpi): ",
            "timed out after 2s waiting for the 4 ranks of MPI_COMM_WORLD in round 1 \
             (all_gather: payload lengths)",
            "at least one rank has not reached this point (MPI cannot say which)",
            "this MPI rendezvous is unusable from now on",
        ] {
            assert!(
                err.contains(part),
                "rank {rank}: {part:?} not in {err:?}\n{run}"
            );
        }
        let again = run.text(rank, "again_ms");
        let (ms, text) = again.split_once(" again=").expect("again_ms ... again=...");
        assert!(
            parse::<u128>(ms, "again_ms") < 100,
            "a broken rendezvous fails at once\n{run}"
        );
        assert!(
            text.contains(
                "this MPI rendezvous is unusable: round 1 (all_gather: payload lengths) timed out"
            ),
            "{text}\n{run}"
        );
    }
}

/// After the timeout, ranks 0..2 call `MpiRendezvous::abort(3)`: `mpirun` kills every rank
/// (rank 3 in its sleep) and exits with 3.
#[test]
fn timeout_then_abort() {
    const T: &str = "failures::timeout_then_abort";
    let Some(run) = under_mpirun(T, || {
        if let Some(rdv) = all_gather_without_rank_3(T) {
            // Let the other timed-out ranks print before the job is torn down.
            std::thread::sleep(Duration::from_secs(1));
            rdv.abort(3);
        }
    }) else {
        return;
    };

    assert_eq!(
        run.status.code(),
        Some(3),
        "mpirun exits with the abort code\n{run}"
    );
    check_timed_out(&run);
    // Open MPI's text on the abort comes from the aborting rank, and mpirun sometimes loses it
    // when the job is torn down at once: Open MPI 4.1.4 then logs an error of its help-text
    // code instead (seen: "Out of resource", "Data unpack would read past end of buffer");
    // the exit status is always there.
    let out = run.output();
    match out.split("MPI_ABORT was invoked on rank ").nth(1) {
        Some(aborted) => {
            let rank: usize = parse(
                aborted.split_whitespace().next().unwrap_or(""),
                "aborting rank",
            );
            assert!(rank < 3, "a rank that timed out aborted\n{run}");
            assert!(
                aborted.contains("in communicator MPI_COMM_WORLD\nwith errorcode 3."),
                "{run}"
            );
        }
        None => assert!(
            run.stderr.lines().any(|l| l.contains("ORTE_ERROR_LOG: ")
                && l.ends_with("in file ../../../orte/util/show_help.c at line 501")),
            "neither Open MPI's text on the abort nor its error on losing it\n{run}"
        ),
    }
}

/// After the timeout, ranks 0..2 drop the broken rendezvous (at once: no MPI_Finalize, which
/// would wait for rank 3), cannot start a new one, and end their process normally. `mpirun`
/// sees a rank end without finalising MPI, ends the job (rank 3 in its sleep) and exits with 1.
#[test]
fn timeout_then_drop() {
    const T: &str = "failures::timeout_then_drop";
    let Some(run) = under_mpirun(T, || {
        if let Some(rdv) = all_gather_without_rank_3(T) {
            let index = rdv.index();
            let started = Instant::now();
            drop(rdv);
            let dropped_ms = started.elapsed().as_millis();
            let err = MpiRendezvous::world(SHORT).expect_err("a new rendezvous after a timeout");
            report(
                T,
                index,
                format_args!(
                    "dropped_ms={dropped_ms} finalized={} new={err}",
                    mpi::is_finalized()
                ),
            );
            // Let the other timed-out ranks print before the job is torn down.
            std::thread::sleep(Duration::from_secs(1));
        }
    }) else {
        return;
    };

    assert_eq!(run.status.code(), Some(1), "{run}");
    check_timed_out(&run);
    for rank in 0..3 {
        let line = run.text(rank, "dropped_ms");
        let (ms, rest) = line.split_once(' ').expect("dropped_ms=... finalized=...");
        assert!(
            parse::<u128>(ms, "dropped_ms") < 100,
            "drop is immediate\n{run}"
        );
        assert!(rest.starts_with("finalized=false new="), "{run}");
        assert!(
            rest.contains(
                "an earlier MPI rendezvous of this process timed out in round 1 (all_gather: \
                 payload lengths)"
            ),
            "{rest}\n{run}"
        );
    }
    let out = run.output();
    let improper = out
        .split("mpirun has exited due to process rank ")
        .nth(1)
        .unwrap_or_else(|| panic!("no message from mpirun on the improper exit\n{run}"));
    let rank: usize = parse(
        improper.split_whitespace().next().unwrap_or(""),
        "exited rank",
    );
    assert!(rank < 3, "a rank that timed out is the one named\n{run}");
    assert!(improper.contains("exiting improperly"), "{run}");
}

/// What a rank that never initialises MPI does to the others, who call
/// `MpiRendezvous::world(timeout)`: Open MPI's `MPI_Init` waits until every rank has called it,
/// so they never return from it; either mpirun ends the job (depending on when the rank
/// leaves), or the timeout ends each of them. Each rank reports `calls=` before `world()`, and
/// `returned=` if it ever returns.
fn without_rank_3_in_mpi(
    test: &str,
    rank_3_leaves_after: Duration,
    others_wait: Duration,
    timeout: Duration,
) {
    // Without MPI, the rank comes from Open MPI's environment.
    let rank: usize = parse(
        &std::env::var("OMPI_COMM_WORLD_RANK").expect("OMPI_COMM_WORLD_RANK under mpirun"),
        "OMPI_COMM_WORLD_RANK",
    );
    if rank == 3 {
        std::thread::sleep(rank_3_leaves_after);
        report(test, rank, "leaves=without MPI");
        return;
    }
    std::thread::sleep(others_wait);
    report(test, rank, "calls=world()");
    let result = MpiRendezvous::world(timeout);
    report(
        test,
        rank,
        format_args!("returned={:?}", result.map(|r| r.index())),
    );
}

/// Checks that ranks 0..2 called `world()` and never returned, and rank 3 left.
fn check_stuck_in_mpi_init(run: &harness::Run) {
    assert!(run.has(3, "leaves"), "{run}");
    for rank in 0..3 {
        assert!(run.has(rank, "calls"), "{run}");
        assert!(
            !run.has(rank, "returned"),
            "rank {rank} got out of MPI_Init\n{run}"
        );
    }
}

/// Rank 3 leaves (exit status 0, no MPI) 2 s after the others called `world()` (with a
/// timeout far beyond that). `mpirun` sees a rank end without MPI while others are in MPI,
/// kills them (inside `MPI_Init`) and exits with 1.
#[test]
fn a_rank_that_leaves_while_the_others_are_in_mpi_init() {
    const T: &str = "failures::a_rank_that_leaves_while_the_others_are_in_mpi_init";
    let Some(run) = under_mpirun(T, || {
        without_rank_3_in_mpi(T, Duration::from_secs(2), Duration::ZERO, MISSING_SLEEP);
    }) else {
        return;
    };

    assert_eq!(run.status.code(), Some(1), "{run}");
    check_stuck_in_mpi_init(&run);
    let out = run.output();
    let improper = out
        .split("mpirun has exited due to process rank ")
        .nth(1)
        .unwrap_or_else(|| panic!("no message from mpirun on the improper exit\n{run}"));
    assert!(
        improper.starts_with("3 ") && improper.contains("exiting improperly"),
        "mpirun names rank 3\n{run}"
    );
}

/// Rank 3 leaves (exit status 0, no MPI) at once, and the others call `world()` 2 s later.
/// `mpirun` took rank 3 for a process that does not use MPI, so nothing of MPI's ends the job:
/// ranks 0..2 would wait in `MPI_Init` for good. The timeout ends each of them instead, with
/// `MPI_INIT_TIMEOUT_EXIT` and a message naming the wait, and mpirun then ends.
#[test]
fn a_rank_that_leaves_before_the_others_start_mpi_times_them_out_in_mpi_init() {
    const T: &str =
        "failures::a_rank_that_leaves_before_the_others_start_mpi_times_them_out_in_mpi_init";
    let Some(run) = under_mpirun(T, || {
        without_rank_3_in_mpi(T, Duration::ZERO, Duration::from_secs(2), SHORT);
    }) else {
        return;
    };

    assert!(
        !run.killed,
        "mpirun was still running at its wall time\n{run}"
    );
    check_stuck_in_mpi_init(&run);
    assert_ne!(run.status.code(), Some(0), "{run}");
    // The timeout is 2 s, but MPI_Init is given at least 10 s.
    let named = run
        .output()
        .matches("timed out after 10s in MPI_Init, waiting for every rank of the job to start MPI")
        .count();
    assert!(named >= 1, "no rank named its wait in MPI_Init\n{run}");
    assert!(
        run.output().contains(&format!(
            "exiting with status {}",
            atlasboost_mpi::MPI_INIT_TIMEOUT_EXIT
        )),
        "{run}"
    );
}
