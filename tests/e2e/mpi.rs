//! Library mode under Open MPI: `init()` does its rendezvous over MPI, started by `mpirun`
//! directly and by `atlasboost run --mpi`. Needs Open MPI and an init-worker built with MPI
//! support (`cargo build -p atlasboost-examples --features mpi`); compiled with this crate's
//! `mpi` feature only.

use std::time::Duration;

use atlasboost_e2e::{MPIRUN_OPTIONS, Run, init_worker_bin};

use crate::library::{check_job, parse_report, reports};

#[test]
fn mpirun_np_4_agrees_on_one_table() {
    let run = Run::new(["-np", "4"])
        .program("mpirun")
        .args(MPIRUN_OPTIONS)
        .timeout(Duration::from_secs(60));
    let table = run.dir().join("rank_table.json");
    let f = run
        .args(["-x", "ATLASBOOST_SIM=8", "-x"])
        .args([format!("ATLASBOOST_RANK_TABLE_FILE={}", table.display())])
        .args([init_worker_bin()])
        .run();
    f.assert_code(0);
    let reports = reports(&f.out());
    check_job(&reports, 4, "Mpi");
    for r in &reports {
        assert_eq!(r["local_rank"], r["physical"], "one host: {r:?}");
    }
}

#[test]
fn atlasboost_run_mpi_runs_mpirun_and_tags_lines_as_its_own_launches() {
    let f = Run::new(["-v", "run", "--mpi", "--sim", "8", "-n", "4", "--"])
        .args([init_worker_bin()])
        .timeout(Duration::from_secs(60))
        .run();
    f.assert_code(0);
    let err = f.err();
    assert!(
        err.contains(
            "mpirun -np 4 -H localhost:4 -bind-to none -map-by slot --tag-output \
             --mca orte_abort_on_non_zero_status 0 --mca odls_base_sigkill_timeout 5 \
             --mca btl_tcp_if_exclude lo,docker0"
        ),
        "-v prints the mpirun command: {}",
        f.describe()
    );
    assert!(err.contains("-x ATLASBOOST_SIM=8"), "{err}");
    let out = f.out();
    let tagged = out.lines().filter(|l| l.contains("rank=")).all(|line| {
        crate::split_tag(line, "stdout").is_some_and(|(rank, text)| {
            parse_report(text).is_some_and(|r| r["launcher_rank"] == rank.to_string())
        })
    });
    assert!(
        tagged,
        "every report tagged [<its launcher rank>]<stdout>: {out}"
    );
    check_job(&reports(&out), 4, "Mpi");
}

#[test]
fn under_mpirun_a_rank_exiting_before_init_ends_the_job() {
    let f = Run::new([
        "run",
        "--mpi",
        "--sim",
        "8",
        "-n",
        "4",
        "--rendezvous-timeout",
        "10",
        "--",
    ])
    .args([init_worker_bin()])
    .args(["--exit-before-init", "2"])
    .timeout(Duration::from_secs(60))
    .run();
    // mpirun stops the others and reports the status of the first rank to fail (a hang would
    // end in the run's time limit, which fails the test).
    f.assert_code(3);
    assert!(
        f.out().contains("launcher rank 2 exits before init()"),
        "{}",
        f.describe()
    );
}

#[test]
fn open_mpi_variables_without_mpirun_are_named() {
    let f = Run::new::<[&str; 0], &str>([])
        .program(init_worker_bin())
        .env("OMPI_COMM_WORLD_RANK", "0")
        .env("OMPI_COMM_WORLD_SIZE", "2")
        .env("OMPI_COMM_WORLD_LOCAL_RANK", "0")
        .env("ATLASBOOST_SIM", "8")
        .timeout(Duration::from_secs(60))
        .run();
    f.assert_code(1);
    assert!(
        f.err()
            .contains("Open MPI says this job has 2 processes, but MPI's world has 1"),
        "{}",
        f.describe()
    );
}
