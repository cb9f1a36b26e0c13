//! `atlasboost run --mpi`: the original tool's way of working. `mpirun` starts the workers
//! and each worker's `init()` does the rendezvous over MPI and writes the table (SPEC §8, §10).
//!
//! atlasboost builds the `mpirun` command, prints it with `-v`, and runs it as its one child,
//! with the same lifetime rules as its own workers: its own process group, stopped with the
//! launcher, Ctrl-C passed on. `mpirun --tag-output` tags the lines (`[1,3]<stdout>:`), so
//! atlasboost passes them through untagged. The exit code is mpirun's (it reports the first
//! failed rank's), 127 when `mpirun` is not found.

use std::ffi::OsString;
use std::path::Path;
use std::time::Instant;

use atlasboost_core::EnvVars;

use super::lifeline::Lifeline;
use super::output::{Output, OutputOptions};
use super::plan::{HostSpec, parse_host_list, parse_hostfile};
use super::supervise::{self, Role, RunPlan, Signals, WorkerPlan, run_workers};
use super::{new_job_id, resolve_exports, worker_dir};
use crate::cli::{RankOrderArg, RunArgs};
use crate::commands::devices::make_probe;
use crate::error::CliError;
use crate::printer::Printer;

/// The program `--mpi` runs: `ATLASBOOST_MPIRUN` (a path) if set, else `mpirun` from `PATH`.
fn mpirun_program() -> OsString {
    std::env::var_os(EnvVars::ATLASBOOST_MPIRUN)
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "mpirun".into())
}

/// Runs the job under `mpirun` and returns the exit code.
///
/// # Errors
///
/// Options `--mpi` cannot honour (exit 2), a number of workers that cannot be known, and the
/// failures of starting `mpirun` (126/127).
pub fn run_mpi(args: &RunArgs, printer: &Printer) -> Result<u8, CliError> {
    let started = Instant::now();
    refuse_unsupported(args)?;
    let signals = Signals::block()?;
    let hosts = match (&args.hosts, &args.hostfile) {
        (Some(list), _) => parse_host_list(list)?,
        (None, Some(file)) => parse_hostfile(file)?,
        (None, None) => Vec::new(),
    };
    let np = match args.np {
        Some(n) => n,
        None => default_np(args, &hosts)?,
    };
    let wdir = worker_dir(args, true)?;
    let table_path = wdir.join(&args.rank_table);
    let exports = resolve_exports(&args.env)?;
    let job_id = new_job_id()?;
    let command = mpirun_command(&MpirunJob {
        program: mpirun_program(),
        np,
        hosts: &hosts,
        args,
        wdir: &wdir,
        table_path: &table_path,
        job_id: &job_id,
        exports: &exports,
        as_root: nix::unistd::geteuid().is_root(),
        master_port: Some(super::agent::free_port("0.0.0.0")).filter(|p| *p != 0),
    });
    printer.detail(&format!(
        "atlasboost: {}",
        command
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    ));
    supervise::raise_fd_limit();
    let _ = nix::sys::prctl::set_child_subreaper(true);
    let mut lifeline = Lifeline::start()?;
    let mut output = Output::new(
        OutputOptions {
            // mpirun's --tag-output has tagged every line already.
            tag: false,
            timestamp: false,
            ranks: None,
            log_dir: None,
        },
        &[0],
    )?;
    let plan = RunPlan {
        command,
        wdir,
        grace: args.grace,
    };
    let mpirun = WorkerPlan {
        rank: 0,
        host: "mpirun".into(),
        device: 0,
        env: Vec::new(),
        local: true,
    };
    let result = run_workers(
        &plan,
        &[mpirun],
        &mut output,
        &signals,
        &mut lifeline,
        Role::Launcher(Vec::new()),
    );
    lifeline.close();
    let result = result?;
    let ending = result
        .workers
        .first()
        .and_then(|w| w.ending)
        .map_or_else(|| "did not run".to_string(), |e| e.describe());
    printer.status(&format!(
        "atlasboost: mpirun ({np} ranks) ended with {ending} after {:.2} s",
        started.elapsed().as_secs_f64()
    ));
    Ok(result.exit_code)
}

/// What [`mpirun_command`] needs.
#[derive(Debug)]
pub struct MpirunJob<'a> {
    /// `mpirun`, or its path.
    pub program: OsString,
    /// How many ranks.
    pub np: u32,
    /// `-H`/`--hostfile` hosts, as given (empty: this machine).
    pub hosts: &'a [HostSpec],
    /// The rest of the options.
    pub args: &'a RunArgs,
    /// The workers' directory (absolute).
    pub wdir: &'a Path,
    /// Where the workers' `init()` writes the table (absolute).
    pub table_path: &'a Path,
    /// The job's id.
    pub job_id: &'a str,
    /// `-x` variables, resolved.
    pub exports: &'a [(OsString, OsString)],
    /// Whether we run as root (mpirun refuses root without `--allow-run-as-root`).
    pub as_root: bool,
    /// A port free on this machine, for `MASTER_PORT` when the job runs here.
    pub master_port: Option<u16>,
}

/// The `mpirun` command of SPEC §8: `-np`, `-H`, `-bind-to none -map-by slot`, `--tag-output`,
/// `-x` for every variable the workers' `init()` needs and every `-x` export, `--mca
/// btl_tcp_if_exclude lo,docker0`; then the worker's command.
pub fn mpirun_command(job: &MpirunJob<'_>) -> Vec<OsString> {
    let args = job.args;
    let mut cmd: Vec<OsString> = vec![job.program.clone()];
    let mut push = |a: &str| cmd.push(a.into());
    push("-np");
    push(&job.np.to_string());
    let hosts: Vec<String> = if job.hosts.is_empty() {
        // One process per NPU, not per core: the slots are the ranks asked for.
        vec![format!("localhost:{}", job.np)]
    } else {
        job.hosts
            .iter()
            .map(|h| match h.slots {
                Some(s) => format!("{}:{s}", h.name),
                None => h.name.clone(),
            })
            .collect()
    };
    push("-H");
    push(&hosts.join(","));
    for a in ["-bind-to", "none", "-map-by", "slot", "--tag-output"] {
        push(a);
    }
    push("--mca");
    push("btl_tcp_if_exclude");
    push("lo,docker0");
    if job.as_root {
        push("--allow-run-as-root");
    }
    let mut vars: Vec<(String, String)> = vec![
        (
            EnvVars::ATLASBOOST_FRAMEWORK.into(),
            args.framework.to_string(),
        ),
        (
            EnvVars::ATLASBOOST_RANK_TABLE_FILE.into(),
            job.table_path.display().to_string(),
        ),
        (EnvVars::ATLASBOOST_JOB_ID.into(), job.job_id.into()),
        (
            EnvVars::ATLASBOOST_RENDEZVOUS_TIMEOUT.into(),
            args.rendezvous_timeout.as_secs_f64().to_string(),
        ),
        (
            EnvVars::ATLASBOOST_PROBE.into(),
            args.discovery.probe.as_str().into(),
        ),
        (EnvVars::PYTHONUNBUFFERED.into(), "1".into()),
    ];
    if let Some(n) = args.discovery.sim {
        vars.push((EnvVars::ATLASBOOST_SIM.into(), n.to_string()));
    }
    // Workers built without MPI meet over ZeroMQ at rank 0's host instead: the first host
    // (mpirun maps by slot), on a port free here when that host is this machine.
    let exported = |name: &str| job.exports.iter().any(|(n, _)| n == name);
    if !exported(EnvVars::MASTER_ADDR) {
        let first = job.hosts.first().map_or("127.0.0.1", |h| h.name.as_str());
        vars.push((EnvVars::MASTER_ADDR.into(), first.into()));
        if job.hosts.is_empty()
            && !exported(EnvVars::MASTER_PORT)
            && let Some(port) = job.master_port
        {
            vars.push((EnvVars::MASTER_PORT.into(), port.to_string()));
        }
    }
    if let Some(path) = &args.discovery.hccn_conf {
        vars.push((
            EnvVars::ATLASBOOST_HCCN_CONF.into(),
            path.display().to_string(),
        ));
    }
    for (name, value) in vars {
        push("-x");
        push(&format!("{name}={value}"));
    }
    for (name, value) in job.exports {
        let mut a = name.clone();
        a.push("=");
        a.push(value);
        cmd.push("-x".into());
        cmd.push(a);
    }
    cmd.push("-wdir".into());
    cmd.push(job.wdir.as_os_str().to_owned());
    cmd.extend(args.command.iter().cloned());
    cmd
}

/// Options that `--mpi` cannot honour are refused, never ignored.
fn refuse_unsupported(args: &RunArgs) -> Result<(), CliError> {
    let refused = [
        (args.log_dir.is_some(), "--log-dir"),
        (args.ranks.is_some(), "--ranks"),
        (args.timestamp, "--timestamp"),
        (args.no_tag, "--no-tag"),
        (args.discovery.devices.is_some(), "--devices"),
        (args.discovery.sim_ipv6, "--sim-ipv6"),
        (args.discovery.sim_chip != "910", "--sim-chip"),
        (args.format.as_str() != "1.0", "--format"),
        (args.rank_order != RankOrderArg::ServerId, "--rank-order"),
        (args.ssh_port.is_some(), "--ssh-port"),
        (args.ssh_identity.is_some(), "--ssh-identity"),
        (args.remote_atlasboost.is_some(), "--remote-atlasboost"),
        (args.rendezvous_addr.is_some(), "--rendezvous-addr"),
    ];
    match refused.iter().find(|(given, _)| *given) {
        Some((_, flag)) => Err(CliError::Usage(format!(
            "{flag} cannot be used with --mpi: mpirun starts the workers and their init() \
             writes the table"
        ))),
        None => Ok(()),
    }
}

/// Without `-n`: the sum of the hosts' slots, or every device of this machine.
fn default_np(args: &RunArgs, hosts: &[HostSpec]) -> Result<u32, CliError> {
    if hosts.is_empty() {
        let server = crate::host::primary_ipv4()
            .map(|ip| ip.to_string())
            .unwrap_or_else(|_| "127.0.0.1".into());
        let devices = make_probe(&args.discovery, &server)?.probe()?;
        return match u32::try_from(devices.len()) {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(CliError::Failure(
                "this machine has no device to start a worker on".into(),
            )),
        };
    }
    hosts
        .iter()
        .map(|h| h.slots)
        .sum::<Option<u32>>()
        .ok_or_else(|| {
            CliError::Usage(
                "--mpi with hosts without slots needs -n N: mpirun places the ranks, and \
                 atlasboost cannot probe other hosts before it starts"
                    .into(),
            )
        })
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    fn run_args(argv: &[&str]) -> RunArgs {
        let mut full = vec!["atlasboost", "run", "--mpi"];
        full.extend_from_slice(argv);
        match Cli::try_parse_from(full) {
            Ok(Cli {
                command: Command::Run(args),
                ..
            }) => *args,
            Ok(_) => panic!("run expected"),
            Err(e) => panic!("{argv:?} does not parse: {e}"),
        }
    }

    fn command(args: &RunArgs, hosts: &[HostSpec], np: u32, as_root: bool) -> Vec<String> {
        mpirun_command(&MpirunJob {
            program: "mpirun".into(),
            np,
            hosts,
            args,
            wdir: Path::new("/work"),
            table_path: Path::new("/work/rank_table.json"),
            job_id: "ab-1",
            exports: &[("FOO".into(), "a b".into())],
            as_root,
            master_port: Some(29555),
        })
        .into_iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
    }

    #[test]
    fn the_command_of_spec_8() {
        let args = run_args(&[
            "--sim",
            "8",
            "--framework",
            "mindspore",
            "--",
            "python3",
            "t.py",
        ]);
        let hosts = parse_host_list("node1:8,node2:4").unwrap_or_else(|e| panic!("{e}"));
        let cmd = command(&args, &hosts, 12, false);
        let text = cmd.join(" ");
        assert!(
            text.starts_with(
                "mpirun -np 12 -H node1:8,node2:4 -bind-to none -map-by slot --tag-output \
                 --mca btl_tcp_if_exclude lo,docker0 -x "
            ),
            "{text}"
        );
        assert!(!text.contains("--allow-run-as-root"), "{text}");
        for var in [
            "ATLASBOOST_FRAMEWORK=mindspore",
            "ATLASBOOST_RANK_TABLE_FILE=/work/rank_table.json",
            "ATLASBOOST_JOB_ID=ab-1",
            "ATLASBOOST_SIM=8",
            "ATLASBOOST_PROBE=auto",
            "MASTER_ADDR=node1",
        ] {
            let at = cmd.iter().position(|a| a == var);
            assert!(at.is_some_and(|i| cmd[i - 1] == "-x"), "-x {var} in {text}");
        }
        // A user's export is one argument, spaces and all.
        assert!(cmd.iter().any(|a| a == "FOO=a b"), "{cmd:?}");
        assert!(text.ends_with("-wdir /work python3 t.py"), "{text}");
    }

    #[test]
    fn this_machine_alone_gets_as_many_slots_as_ranks_and_root_is_allowed() {
        let args = run_args(&["--sim", "8", "-n", "4", "--", "w"]);
        let text = command(&args, &[], 4, true).join(" ");
        assert!(text.contains("-np 4 -H localhost:4 "), "{text}");
        assert!(text.contains(" --allow-run-as-root "), "{text}");
        assert!(
            text.contains(" -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29555 "),
            "{text}"
        );
    }

    #[test]
    fn options_mpirun_cannot_honour_are_refused_by_name() {
        for (flag, argv) in [
            ("--log-dir", vec!["--log-dir", "logs"]),
            ("--ranks", vec!["--ranks", "0"]),
            ("--format", vec!["--format", "1.2"]),
            ("--ssh-port", vec!["--ssh-port", "2222"]),
        ] {
            let mut full = argv.clone();
            full.extend(["--", "w"]);
            match refuse_unsupported(&run_args(&full)) {
                Err(CliError::Usage(m)) => {
                    assert!(
                        m.starts_with(&format!("{flag} cannot be used with --mpi")),
                        "{m}"
                    )
                }
                other => panic!("{flag}: expected a usage error, got {other:?}"),
            }
        }
        assert!(refuse_unsupported(&run_args(&["--sim", "8", "--", "w"])).is_ok());
    }

    #[test]
    fn hosts_without_slots_need_n() {
        let args = run_args(&["-H", "a,b", "--", "w"]);
        let hosts = parse_host_list("a,b").unwrap_or_else(|e| panic!("{e}"));
        match default_np(&args, &hosts) {
            Err(CliError::Usage(m)) => assert!(m.contains("needs -n N"), "{m}"),
            other => panic!("expected a usage error, got {other:?}"),
        }
        let hosts = parse_host_list("a:2,b:3").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(default_np(&args, &hosts).ok(), Some(5));
    }
}
