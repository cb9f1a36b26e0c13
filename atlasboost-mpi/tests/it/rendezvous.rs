//! The rendezvous working: the conformance suite, and MPI's lifetime whoever initialises it.

use std::collections::BTreeSet;
use std::time::Duration;

use atlasboost_core::Rendezvous;
use atlasboost_core::conformance::check_participant;
use atlasboost_mpi::{MpiRendezvous, Threading};
use mpi::traits::*;

use crate::harness::{RANKS, field, fnv1a, parse, report, under_mpirun};

/// Long enough never to be reached in these tests.
const TIMEOUT: Duration = Duration::from_secs(30);

#[test]
fn conformance() {
    const T: &str = "rendezvous::conformance";
    let Some(run) = under_mpirun(T, || {
        let mut rdv = MpiRendezvous::world(TIMEOUT).expect("joining the MPI rendezvous");
        let index = rdv.index();
        let table = check_participant(&mut rdv)
            .unwrap_or_else(|e| panic!("rank {index}: conformance failed: {e}"));
        let json = table.to_json_pretty();
        report(
            T,
            index,
            format_args!(
                "fields= size={} local_rank={} local_size={} owns_mpi={} ranks={} table_len={} \
                 table_fnv={:016x}",
                rdv.size(),
                rdv.local_rank(),
                rdv.local_size(),
                rdv.owns_mpi(),
                table.rank_count(),
                json.len(),
                fnv1a(json.as_bytes()),
            ),
        );
        drop(rdv);
        report(T, index, format_args!("finalized={}", mpi::is_finalized()));
    }) else {
        return;
    };

    assert!(run.status.success(), "{run}");
    let by_rank = run.by_rank();
    assert_eq!(
        by_rank.keys().copied().collect::<Vec<_>>(),
        (0..RANKS).collect::<Vec<_>>(),
        "every rank reports, with distinct indices 0..{RANKS}\n{run}"
    );
    let mut digests = BTreeSet::new();
    for rank in 0..RANKS {
        let line = run.text(rank, "fields");
        assert_eq!(field(&line, "size"), RANKS.to_string(), "{run}");
        // One host: every rank shares memory with every other, and the split's key is the
        // world rank, so the local rank is the world rank.
        assert_eq!(field(&line, "local_size"), RANKS.to_string(), "{run}");
        assert_eq!(field(&line, "local_rank"), rank.to_string(), "{run}");
        assert_eq!(field(&line, "owns_mpi"), "true", "{run}");
        // The suite's probe gives every participant 8 devices.
        assert_eq!(field(&line, "ranks"), (RANKS * 8).to_string(), "{run}");
        assert!(
            parse::<usize>(field(&line, "table_len"), "table_len") > 0,
            "{run}"
        );
        digests.insert((
            field(&line, "table_len").to_string(),
            field(&line, "table_fnv").to_string(),
        ));
        // atlasboost initialised MPI, so dropping the only rendezvous finalised it.
        assert_eq!(run.text(rank, "finalized"), "true", "{run}");
    }
    assert_eq!(digests.len(), 1, "every rank built the same table\n{run}");
}

#[test]
fn lifecycle_when_atlasboost_initialises_mpi() {
    const T: &str = "rendezvous::lifecycle_when_atlasboost_initialises_mpi";
    let Some(run) = under_mpirun(T, || {
        assert!(!mpi::is_initialized(), "MPI initialised before the test");
        let first = MpiRendezvous::world(TIMEOUT).expect("first world()");
        let index = first.index();
        // A second rendezvous while the first lives: same MPI, not initialised again (Open MPI
        // would abort the job on a second MPI_Init).
        let mut second = MpiRendezvous::world(TIMEOUT).expect("second world()");
        report(
            T,
            index,
            format_args!(
                "owns= first={} second={} same_index={} threads={:?}",
                first.owns_mpi(),
                second.owns_mpi(),
                second.index() == index,
                first.thread_support(),
            ),
        );
        // The rendezvous is Send: use it from another thread (MPI granted MULTIPLE).
        let mut first = std::thread::spawn(move || {
            let mut first = first;
            let got = first
                .all_gather(format!("first {}", first.index()).as_bytes())
                .expect("all_gather from another thread");
            let want: Vec<Vec<u8>> = (0..first.size())
                .map(|i| format!("first {i}").into_bytes())
                .collect();
            assert_eq!(got, want);
            first
        })
        .join()
        .expect("the other thread");
        let got = second
            .all_gather(&vec![index as u8; index * 1000])
            .expect("all_gather on the second rendezvous");
        let sizes: Vec<usize> = got.iter().map(Vec::len).collect();
        second.barrier().expect("barrier on the second rendezvous");
        drop(second);
        report(
            T,
            index,
            format_args!(
                "second_gathered={sizes:?} finalized_after_one_drop={}",
                mpi::is_finalized()
            ),
        );
        first
            .barrier()
            .expect("the first rendezvous after the second was dropped");
        drop(first);
        report(
            T,
            index,
            format_args!("finalized_after_last_drop={}", mpi::is_finalized()),
        );
        let err = MpiRendezvous::world(TIMEOUT).expect_err("world() after finalisation");
        report(T, index, format_args!("error_after_finalize={err}"));
    }) else {
        return;
    };

    assert!(run.status.success(), "{run}");
    assert_eq!(run.by_rank().len(), RANKS, "{run}");
    for rank in 0..RANKS {
        let owns = run.text(rank, "owns");
        assert_eq!(field(&owns, "first"), "true", "{run}");
        assert_eq!(field(&owns, "second"), "true", "{run}");
        assert_eq!(field(&owns, "same_index"), "true", "{run}");
        assert_eq!(
            field(&owns, "threads"),
            format!("{:?}", Threading::Multiple),
            "Open MPI grants MPI_THREAD_MULTIPLE\n{run}"
        );
        let second = run.text(rank, "second_gathered");
        assert!(
            second.starts_with("[0, 1000, 2000, 3000] "),
            "payloads of 0, 1000, 2000, 3000 bytes\n{run}"
        );
        assert_eq!(field(&second, "finalized_after_one_drop"), "false", "{run}");
        assert_eq!(run.text(rank, "finalized_after_last_drop"), "true", "{run}");
        let err = run.text(rank, "error_after_finalize");
        assert!(
            err.contains("MPI has already been finalised in this process"),
            "{err}\n{run}"
        );
    }
}

#[test]
fn mpi_initialised_by_the_application() {
    const T: &str = "rendezvous::mpi_initialised_by_the_application";
    let Some(run) = under_mpirun(T, || {
        // The application (a training framework) initialises MPI first.
        let (universe, _granted) =
            mpi::initialize_with_threading(Threading::Multiple).expect("the test initialises MPI");
        let world = universe.world();
        let index = world.rank() as usize;

        let mut rdv = MpiRendezvous::world(TIMEOUT).expect("world() on an initialised MPI");
        let got = rdv
            .all_gather(format!("payload of rank {index}").as_bytes())
            .expect("all_gather");
        let want: Vec<Vec<u8>> = (0..RANKS)
            .map(|i| format!("payload of rank {i}").into_bytes())
            .collect();
        report(
            T,
            index,
            format_args!(
                "rdv= owns_mpi={} gathered_ok={} index={}",
                rdv.owns_mpi(),
                got == want,
                rdv.index()
            ),
        );
        drop(rdv);
        report(
            T,
            index,
            format_args!("finalized_after_drop={}", mpi::is_finalized()),
        );

        // MPI is still the application's: a barrier and a reduction on its own world.
        world.barrier();
        let mut sum = 0i32;
        world.all_reduce_into(
            &(index as i32),
            &mut sum,
            mpi::collective::SystemOperation::sum(),
        );
        report(T, index, format_args!("app_sum_of_ranks={sum}"));

        // The application finalises; atlasboost cannot start again.
        drop(universe);
        let finalized = mpi::is_finalized();
        let err = MpiRendezvous::world(TIMEOUT).expect_err("world() after finalisation");
        report(
            T,
            index,
            format_args!("after_app_finalize= finalized={finalized} error={err}"),
        );
    }) else {
        return;
    };

    assert!(run.status.success(), "{run}");
    assert_eq!(run.by_rank().len(), RANKS, "{run}");
    let want_sum: usize = (0..RANKS).sum();
    for rank in 0..RANKS {
        let rdv = run.text(rank, "rdv");
        assert_eq!(field(&rdv, "owns_mpi"), "false", "{run}");
        assert_eq!(field(&rdv, "gathered_ok"), "true", "{run}");
        assert_eq!(field(&rdv, "index"), rank.to_string(), "{run}");
        assert_eq!(run.text(rank, "finalized_after_drop"), "false", "{run}");
        assert_eq!(
            run.text(rank, "app_sum_of_ranks"),
            want_sum.to_string(),
            "{run}"
        );
        let after = run.text(rank, "after_app_finalize");
        assert_eq!(field(&after, "finalized"), "true", "{run}");
        assert!(
            after.contains("error=MPI has already been finalised in this process"),
            "{after}\n{run}"
        );
    }
}
