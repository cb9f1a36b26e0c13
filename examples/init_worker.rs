//! A native worker that calls `init()` and says where it stands.
//!
//! Start it under any launcher; on a machine without NPUs give it simulated devices:
//!
//! ```sh
//! cargo build -p atlasboost-examples --examples --features mpi
//! ATLASBOOST_SIM=8 mpirun -np 4 -x ATLASBOOST_SIM target/debug/examples/init-worker
//! atlasboost run --sim 8 -n 4 -- target/debug/examples/init-worker
//! atlasboost run --mpi --sim 8 -n 4 -- target/debug/examples/init-worker
//! ```
//!
//! It prints one line: `rank=<table rank> launcher_rank=<n> size=<n> local_rank=<n>
//! device=<logical id> physical=<id> server=<server_id> table=<path> via=<how>
//! rank_id=<RANK_ID after export> mpi=<yes|no>` (`mpi`: whether it was built with MPI support).
//!
//! `--exit-before-init RANK` makes the process of that launcher rank exit with status 3 before
//! calling `init()` (to test that the others do not hang). `--hold-until FILE` keeps the job
//! (and its table's lock) after the line until FILE exists, for at most 60 s.

use std::io::Write;
use std::process::ExitCode;

use atlasboost::init::{InitOptions, init};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (exit_rank, hold_until) = match args.as_slice() {
        [] => (None, None),
        [flag, rank] if flag == "--exit-before-init" => match rank.parse::<u32>() {
            Ok(r) => (Some(r), None),
            Err(_) => return fail(&format!("--exit-before-init {rank}: not a rank")),
        },
        [flag, file] if flag == "--hold-until" => (None, Some(std::path::PathBuf::from(file))),
        _ => return fail("usage: init-worker [--exit-before-init RANK | --hold-until FILE]"),
    };
    if let Some(r) = exit_rank
        && atlasboost::init::launcher_rank_from_env() == Some(r)
    {
        println!("launcher rank {r} exits before init()");
        return ExitCode::from(3);
    }
    let job = match init(&InitOptions::default()) {
        Ok(j) => j,
        // An InitError's text already holds its causes.
        Err(e) => return fail(&e.to_string()),
    };
    // SAFETY: this program starts no thread of its own, and init() has stopped its own.
    unsafe { job.export_env() };
    println!(
        "rank={} launcher_rank={} size={} local_rank={} device={} physical={} server={} table={} via={:?} rank_id={} mpi={} gloo={} hccl_if_ip={} cpus={} master={}:{}",
        job.world.rank,
        job.launcher_rank,
        job.world.size,
        job.world.local_rank,
        job.device_id,
        job.physical_id,
        job.server_id,
        job.table_path.display(),
        job.agreement,
        std::env::var("RANK_ID").unwrap_or_default(),
        if atlasboost::build_info::MPI {
            "yes"
        } else {
            "no"
        },
        std::env::var("GLOO_SOCKET_IFNAME").unwrap_or_default(),
        std::env::var("HCCL_IF_IP").unwrap_or_default(),
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                    .map(|l| l.trim().to_string())
            })
            .unwrap_or_default(),
        std::env::var("MASTER_ADDR").unwrap_or_default(),
        std::env::var("MASTER_PORT").unwrap_or_default(),
    );
    if let Some(file) = hold_until {
        let _ = std::io::stdout().flush();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !file.exists() {
            if std::time::Instant::now() > deadline {
                return fail(&format!("{} did not appear within 60 s", file.display()));
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    drop(job);
    ExitCode::SUCCESS
}

fn fail(message: &str) -> ExitCode {
    // A closed stderr must not turn the error into a panic.
    let _ = writeln!(std::io::stderr(), "init-worker: error: {message}");
    ExitCode::FAILURE
}
