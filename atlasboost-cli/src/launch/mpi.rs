//! `atlasboost run --mpi`: the original tool's way of working. `mpirun` starts the workers
//! and each worker's `init()` does the rendezvous over MPI and writes the table (SPEC §8, §10).
//!
//! atlasboost builds the `mpirun` command, prints it with `-v`, and runs it with the same
//! lifetime rules as its own workers: its own process group, killed with the launcher. mpirun
//! starts each rank as `atlasboost relay -- COMMAND` ([`relay_main`]; `atlasboost-relay --
//! COMMAND` where that program is beside atlasboost and every rank is here): the relay runs the
//! worker and sends its lines and its exit to the launcher over a connection of its own
//! ([`relay`](super::relay) says why), so `--mpi` prints what atlasboost's own launches print
//! (whole lines tagged `[rank]<stdout>:`, `--timestamp`, `--ranks`, `--log-dir`, the summary)
//! while mpirun keeps its own duties: placing the ranks, and ending the job when one fails.
//! The exit code is the first failed rank's (as mpirun's), mpirun's own when it fails by
//! itself, 125 when `mpirun` cannot be started (atlasboost's tool, as ssh is: 126 and 127 are
//! the worker's command's).

use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsFd;
use std::path::Path;
use std::time::{Duration, Instant};

use atlasboost_core::EnvVars;
use atlasboost_core::exchange::error_chain;
use atlasboost_core::launch_context;
use atlasboost_tcp::Secret;

use super::channel::{self, Ending, Up};
use super::events;
use super::job::{
    AttemptRecord, attempt_end_event, check_before_start, ending_of, host_json, job_logs,
    job_start_event, lock_table, new_job_id, other_startup_vars, other_startup_warning,
    recorded_root_cause, rendezvous_address, report, resolve_exports, summary_event, worker_dir,
};
use super::lifeline::{self, CgroupWanted};
use super::output::{JobLogDir, Output, OutputOptions};
use super::plan::{HostPlan, HostSpec, parse_host_list, parse_hostfile, resolve_hosts};
use super::relay::{Introduction, RelayDoor, introduce};
use super::supervise::{
    MpirunPlan, Role, RunPlan, Signals, Upstream, WorkerPlan, run_mpirun, run_workers,
    send_the_rest, wait_for_release,
};
use crate::error::CliError;
use crate::exit::ExitCodes;
use crate::printer::{Printer, to_stderr};
use crate::settings::{RunSettings, ServerOrder};

/// How long a relay tries to reach the launcher.
const RELAY_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// A relay's grace between SIGTERM and SIGKILL when the launcher does not say (`--grace`'s
/// default).
const DEFAULT_RELAY_GRACE: Duration = Duration::from_secs(10);

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
pub fn run_mpi(args: &RunSettings, printer: &Printer) -> Result<u8, CliError> {
    let started = Instant::now();
    refuse_unsupported(args)?;
    if let Some(a) = args.rendezvous_addr
        && (a.is_unspecified() || a.is_multicast() || a == IpAddr::V4(Ipv4Addr::BROADCAST))
    {
        return Err(CliError::Usage(format!(
            "--rendezvous-addr {a} is not one machine's address: the ranks' relays connect to it"
        )));
    }
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
    check_mpi_size(args, &hosts, np)?;
    check_before_start(args, Some(u64::from(np)))?;
    let wdir = worker_dir(args, true)?;
    let table_path = wdir.join(&args.rank_table);
    // Passed on as text (ATLASBOOST_RANK_TABLE_FILE), as without --mpi: a path that is not
    // UTF-8 is refused here, not given with its bad bytes replaced.
    atlasboost_core::worker_env::table_path_text(&table_path)?;
    let exports = resolve_exports(&args.env)?;
    // Kept from mpirun's environment, and so from every rank this host starts.
    let other_startup = other_startup_vars(&exports);
    if let Some(warning) = other_startup_warning(&other_startup) {
        printer.status(&warning);
    }
    let job_id = new_job_id()?;
    // With every rank here, the table's lock is taken before mpirun starts, so a clash fails
    // at once; the workers' init() shares it (same job id). On other hosts init() takes it.
    let _table_lock = match hosts.is_empty() {
        true => Some(lock_table(&table_path, &job_id, None)?),
        false => None,
    };
    // The relays connect here: loopback when every rank is on this machine, else this
    // machine's address on the route to the first other host (or --rendezvous-addr).
    let resolved = match hosts.is_empty() {
        true => Vec::new(),
        false => resolve_hosts(&hosts)?,
    };
    super::plan::refuse_this_machine_twice(args, &resolved)?;
    let relay_ip = if hosts.is_empty() {
        args.rendezvous_addr
            .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
    } else {
        rendezvous_address(args, &resolved)?
    };
    let secret = Secret::random().map_err(CliError::system("make the job's secret"))?;
    let door = RelayDoor::open(relay_ip, np, &job_id, secret.clone()).map_err(|source| {
        CliError::RelayDoor {
            addr: relay_ip,
            source,
        }
    })?;
    let relay_address = door.address();
    let master_addr = master_address(&resolved, relay_ip);
    // --remote-atlasboost is the other hosts' path: unused (and said) when every host is this
    // machine, as in atlasboost's own launch.
    let other_machines = resolved.iter().any(|h| !h.local);
    if !other_machines && args.remote_atlasboost.is_some() {
        printer.status(
            "atlasboost: --remote-atlasboost unused: every rank is on this machine, relayed by \
             this atlasboost",
        );
    }
    let relay = relay_prefix(
        args.remote_atlasboost.as_deref().filter(|_| other_machines),
        hosts.is_empty(),
        crate::relay_program(),
    )?;
    check_argv_fits_open_mpi(&relay, &args.command)?;
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
        master_port: Some(atlasboost::host::free_master_port()).filter(|p| *p != 0),
        relay: &relay,
        relay_address: &relay_address.to_string(),
        relay_local: door.local_name(),
        master_addr: &master_addr,
    });
    printer.detail(&format!(
        "atlasboost: {}",
        super::remote::shell_line(&command)
    ));
    let events = super::job::open_events(args.events.as_deref(), &job_id, &signals, printer)?;
    // mpirun places the ranks on the hosts given, or on this machine (whose address is not
    // needed, so not looked up).
    let given: Vec<serde_json::Value> = match resolved.is_empty() {
        true => vec![serde_json::json!({
            "host": atlasboost_core::host_name(),
            "server_id": null,
            "slots": np,
            "local": true,
        })],
        false => resolved.iter().map(host_json).collect(),
    };
    job_start_event(events.as_ref(), args, Some(np), given, &table_path, None);
    let mut lifeline = lifeline::prepare_guard_later()?;
    let ranks: Vec<u32> = (0..np).collect();
    let logs = job_logs(args, &job_id, printer)?;
    let mut output = Output::new(
        OutputOptions {
            tag: !args.no_tag,
            timestamp: args.timestamp,
            ranks: args.ranks.as_ref().map(|r| r.ranks.clone()),
            log_dir: logs.as_ref().map(|l| l.path().to_path_buf()),
            // --hang-timeout is refused with --mpi.
            keep_last_line: false,
            events: events.clone(),
            status: false,
        },
        &ranks,
    )?;
    // Where mpirun puts each rank is known once its relay calls.
    let workers: Vec<WorkerPlan> = ranks
        .iter()
        .map(|&rank| WorkerPlan {
            rank,
            host: "-".into(),
            device: 0,
            env: Vec::new(),
            local: false,
            cpus: None,
        })
        .collect();
    let plan = RunPlan {
        helpers: Vec::new(),
        command: args.command.clone(),
        wdir,
        grace: args.grace,
        lost_after: args.host_timeout,
        files: None,
        watch: false,
        hang: None,
        pytorch: false,
        monitor: None,
        metrics: None,
        unset_env: other_startup,
    };
    let mpirun = MpirunPlan {
        command,
        // Values that stay off mpirun's command line: the relays' secret, the user's exports.
        env: std::iter::once((
            EnvVars::ATLASBOOST_RELAY_SECRET.into(),
            secret.to_hex().into(),
        ))
        .chain(exports.iter().cloned())
        .collect(),
        door,
        timeout: args.rendezvous_timeout,
    };
    if let Some(e) = &events {
        e.borrow_mut().set_attempt(0);
    }
    events::emit(events.as_ref(), "attempt_start", serde_json::json!({}));
    let result = run_mpirun(
        &plan,
        &workers,
        &mut output,
        &signals,
        &mut lifeline,
        mpirun,
    );
    lifeline.close();
    // Nothing of the job is left: as in `run`, signals act as without atlasboost from here.
    signals.release();
    // The attempt's end is recorded however it ended (mpirun that cannot start included).
    let (ended, root_cause, code) = match &result {
        Ok(r) => (ending_of(r), recorded_root_cause(r), r.exit_code),
        Err(e) => (error_chain(e), None, e.exit_code()),
    };
    let attempt = AttemptRecord {
        number: 0,
        layout: None,
        duration: started.elapsed(),
        ended,
        root_cause,
        exit_code: code,
    };
    attempt_end_event(events.as_ref(), &attempt);
    summary_event(events.as_ref(), code, 1, attempt.duration);
    // No rank started (mpirun could not, or placed none, or no relay could start its
    // worker): empty logs go, as without --mpi.
    let none_started = result.as_ref().map_or(true, |r| {
        r.workers
            .iter()
            .all(|w| matches!(w.ending, Some(Ending::NotStarted)) || w.not_run.is_some())
    });
    let logs_gone = none_started
        && logs
            .as_ref()
            .is_some_and(JobLogDir::forget_if_nothing_written);
    let result = result?;
    report(
        Some(&result),
        &[],
        started.elapsed(),
        logs.as_ref().filter(|_| !logs_gone).map(JobLogDir::path),
        printer,
    );
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
    pub args: &'a RunSettings,
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
    /// What each rank runs before the command: the relay and its `--` (`atlasboost relay --`).
    pub relay: &'a [OsString],
    /// Where the relays connect (`address:port`).
    pub relay_address: &'a str,
    /// The abstract Unix socket this host's relays try first.
    pub relay_local: Option<&'a str>,
    /// `MASTER_ADDR` for workers built without MPI: the first host's address, reachable from
    /// the others.
    pub master_addr: &'a str,
}

/// Where workers built without MPI find rank 0 (`MASTER_ADDR`): the first host (mpirun maps
/// by slot), by its address, not its name as given (`-H localhost:8,node2:8` must not send
/// node2's ranks to their own loopback). When the first host is this machine and others are
/// not, this machine's address toward them: the relays' (`relay_ip`).
fn master_address(hosts: &[HostPlan], relay_ip: IpAddr) -> String {
    match hosts.first() {
        None => Ipv4Addr::LOCALHOST.to_string(),
        Some(first) if first.local && hosts.iter().any(|h| !h.local) => relay_ip.to_string(),
        Some(first) => first.server_id.clone(),
    }
}

/// The `mpirun` command of SPEC §8: `-np`, `-H`, `-bind-to none -map-by slot`, `--tag-output`,
/// `-x` for every variable the workers' `init()` needs and every `-x` export, `--mca
/// btl_tcp_if_exclude lo,docker0`; then each rank's relay and the worker's command. The
/// relays' secret is exported by name only: mpirun takes its value from its own environment,
/// so it is never on a command line.
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
                // The only host (check_mpi_size): it takes every rank asked for.
                None => format!("{}:{}", h.name, job.np),
            })
            .collect()
    };
    push("-H");
    push(&hosts.join(","));
    for a in ["-bind-to", "none", "-map-by", "slot", "--tag-output"] {
        push(a);
    }
    // A rank that fails does not make mpirun end the others itself (SIGTERM, then SIGKILL
    // odls_base_sigkill_timeout later, whatever --grace says). The launcher, told of the
    // failure by the rank's relay, stops them as it does without --mpi (SIGTERM, then SIGKILL
    // after --grace). MPI_Abort still ends the job by mpirun's own means.
    push("--mca");
    push("orte_abort_on_non_zero_status");
    push("0");
    // When mpirun stops the ranks itself (it was signalled, MPI_Abort), it sends SIGCONT, then
    // this many seconds later SIGTERM, and as long again later SIGKILL (1 by default): half of
    // --grace (whole seconds, at least 1), so that its stop ends within about --grace, as the
    // launcher's does, and a worker
    // saving a checkpoint on SIGTERM has half of it (after MPI_Abort, which the launcher hears
    // of from the rank's relay and stops the others at once, all of it).
    push("--mca");
    push("odls_base_sigkill_timeout");
    push(
        &(args.grace.as_secs_f64() / 2.0)
            .floor()
            .max(1.0)
            .to_string(),
    );
    match &args.nic {
        // Open MPI takes a name or a CIDR network for both its byte and its control traffic.
        Some(nic) => {
            let nic = nic.to_string();
            for param in ["btl_tcp_if_include", "oob_tcp_if_include"] {
                push("--mca");
                push(param);
                push(&nic);
            }
        }
        None => {
            push("--mca");
            push("btl_tcp_if_exclude");
            push("lo,docker0");
        }
    }
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
        // Always, so that a value in mpirun's own environment cannot differ from the options.
        (
            EnvVars::ATLASBOOST_RANK_TABLE_FORMAT.into(),
            args.format.as_str().into(),
        ),
        (
            EnvVars::ATLASBOOST_RANK_ORDER.into(),
            match args.rank_order {
                ServerOrder::ServerId => "server-id",
                ServerOrder::Hosts => "hosts",
            }
            .into(),
        ),
        (
            EnvVars::ATLASBOOST_RENDEZVOUS_TIMEOUT.into(),
            args.rendezvous_timeout.as_secs_f64().to_string(),
        ),
        (
            EnvVars::ATLASBOOST_PROBE.into(),
            args.discovery.probe.as_str().into(),
        ),
        (EnvVars::PYTHONUNBUFFERED.into(), "1".into()),
        (EnvVars::ATLASBOOST_RELAY_VERSION.into(), relay_version()),
        (
            EnvVars::ATLASBOOST_RELAY_ADDR.into(),
            job.relay_address.to_string(),
        ),
        (
            EnvVars::ATLASBOOST_RELAY_GRACE_MS.into(),
            args.grace.as_millis().to_string(),
        ),
        (
            EnvVars::ATLASBOOST_RELAY_LOST_AFTER_MS.into(),
            args.host_timeout.as_millis().to_string(),
        ),
    ];
    if let Some(name) = job.relay_local {
        vars.push((EnvVars::ATLASBOOST_RELAY_LOCAL.into(), name.into()));
    }
    // A relay keeps its host's own CM_*, MS_ROLE, ... from its worker, but those -x gives.
    let given: Vec<&str> = EnvVars::OTHER_STARTUP
        .into_iter()
        .filter(|name| job.exports.iter().any(|(n, _)| n == name))
        .collect();
    if !given.is_empty() {
        vars.push((EnvVars::ATLASBOOST_RELAY_EXPORTED.into(), given.join(",")));
    }
    if let Some(n) = args.discovery.sim {
        vars.push((EnvVars::ATLASBOOST_SIM.into(), n.to_string()));
    }
    // Each relay makes its worker's cgroup, as the launcher would (mpirun passes on only what
    // it is told to).
    if let Ok(cgroup) = std::env::var(EnvVars::ATLASBOOST_CGROUP) {
        vars.push((EnvVars::ATLASBOOST_CGROUP.into(), cgroup));
    }
    // Workers built without MPI meet over ZeroMQ at rank 0's host instead: the first host
    // (mpirun maps by slot), on a port free here when that host is this machine.
    let exported = |name: &str| job.exports.iter().any(|(n, _)| n == name);
    if !exported(EnvVars::MASTER_ADDR) {
        vars.push((EnvVars::MASTER_ADDR.into(), job.master_addr.into()));
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
    push("-x");
    push(EnvVars::ATLASBOOST_RELAY_SECRET);
    // The user's exports by name too, their values in mpirun's environment (see run_mpi): a
    // token on the command line would be anyone's to read in `ps`.
    for (name, _) in job.exports {
        cmd.push("-x".into());
        cmd.push(name.clone());
    }
    cmd.push("-wdir".into());
    cmd.push(job.wdir.as_os_str().to_owned());
    cmd.extend(rank_command(job.relay, &args.command));
    cmd
}

/// What mpirun starts as each rank: the relay (`relay`, [`relay_prefix`]) and the command.
fn rank_command(relay: &[OsString], command: &[OsString]) -> Vec<OsString> {
    let mut rank = relay.to_vec();
    rank.extend(command.iter().cloned());
    rank
}

/// The relay's part of each rank's command: `atlasboost-relay --` (`beside`: the relay program
/// beside this executable, [`crate::relay_program`]) when every rank is on this machine
/// (statically linked, it saves a launch of 8 ranks about 3 ms: docs/PERFORMANCE.md), else
/// `atlasboost relay --` (`remote_atlasboost`, or this executable), which every host that has
/// atlasboost has. The caller passes `remote_atlasboost` only when some host is another
/// machine: it is for other hosts.
fn relay_prefix(
    remote_atlasboost: Option<&Path>,
    every_rank_here: bool,
    beside: Option<std::path::PathBuf>,
) -> Result<Vec<OsString>, CliError> {
    if let Some(program) = beside.filter(|_| every_rank_here && remote_atlasboost.is_none()) {
        return Ok(vec![program.into_os_string(), "--".into()]);
    }
    let mut prefix = match remote_atlasboost {
        Some(p) => vec![p.as_os_str().to_owned()],
        None => crate::self_command()?,
    };
    prefix.extend(["relay".into(), "--".into()]);
    Ok(prefix)
}

/// Options that `--mpi` cannot honour are refused, never ignored.
fn refuse_unsupported(args: &RunSettings) -> Result<(), CliError> {
    let refused = [
        (args.discovery.devices.is_some(), "--devices"),
        (args.discovery.sim_ipv6, "--sim-ipv6"),
        (args.discovery.sim_chip != "910", "--sim-chip"),
        (args.chip.is_some(), "--chip"),
        (args.bind_cores, "--bind-cores"),
    ];
    if let Some((_, flag)) = refused.iter().find(|(given, _)| *given) {
        return Err(CliError::Usage(format!(
            "{flag} cannot be used with --mpi: mpirun starts the workers and their init() \
             writes the table"
        )));
    }
    // The relays' own variables come from the launcher; a user's value would break them after
    // mpirun had started (or leak the secret's name onto a command line).
    if let Some((name, _)) = args
        .env
        .iter()
        .find(|(name, _)| name.starts_with("ATLASBOOST_RELAY_"))
    {
        return Err(CliError::Usage(format!(
            "-x {name}: atlasboost sets the relays' variables itself under --mpi"
        )));
    }
    // One mpirun job ends at the first failure, and the relays have no heartbeat files.
    let keep_alive = [
        (args.max_restarts > 0, "--max-restarts"),
        (args.min_np.is_some(), "--min-np"),
        (args.hang_timeout.is_some(), "--hang-timeout"),
    ];
    match keep_alive.iter().find(|(given, _)| *given) {
        Some((_, flag)) => Err(CliError::Usage(format!(
            "{flag} cannot be used with --mpi: one mpirun job ends at the first failure; \
             restarts and the hang watchdog need atlasboost's own launch (drop --mpi)"
        ))),
        None => Ok(()),
    }
}

/// Without `-n`: the sum of the hosts' slots, or every device of this machine.
fn default_np(args: &RunSettings, hosts: &[HostSpec]) -> Result<u32, CliError> {
    if hosts.is_empty() {
        // Only to count this machine's devices: any name will do. A real probe's messages
        // name the server, so it gets this machine's address; simulated devices need none
        // (looking it up reads the interfaces and resolves the host name: a cost on every
        // launch).
        let server = match args.discovery.sim {
            Some(_) => "127.0.0.1".to_string(),
            None => atlasboost::host::primary_ipv4()
                .map(|ip| ip.to_string())
                .unwrap_or_else(|_| "127.0.0.1".into()),
        };
        let devices = atlasboost::probe::make_probe(&args.discovery, &server)?.probe()?;
        return match u32::try_from(devices.len()) {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(CliError::NoLocalDevices),
        };
    }
    let Some(slots) = hosts.iter().map(|h| h.slots).collect::<Option<Vec<u32>>>() else {
        return Err(CliError::Usage(
            "--mpi with hosts without slots needs -n N: mpirun places the ranks, and \
             atlasboost cannot probe other hosts before it starts"
                .into(),
        ));
    };
    slots
        .iter()
        .try_fold(0u32, |sum, &s| sum.checked_add(s))
        .filter(|&n| n <= MAX_MPI_RANKS)
        .ok_or_else(|| {
            CliError::Usage(format!(
                "the hosts' slots add up to more than {MAX_MPI_RANKS} ranks, more than \
                 atlasboost runs under --mpi"
            ))
        })
}

/// The longest environment string Linux passes to a program (`MAX_ARG_STRLEN`, 32 pages).
const MAX_ENV_STRING: usize = 128 << 10;

/// Open MPI gives each rank its arguments (all after the program) joined by spaces in one
/// variable, `OMPI_ARGV`, and the exec of a rank fails when that string is longer than Linux
/// passes (a plain `mpirun` fails alike): refused before mpirun starts, naming the limit,
/// rather than as mpirun's "execve error" for every rank.
fn check_argv_fits_open_mpi(relay: &[OsString], command: &[OsString]) -> Result<(), CliError> {
    let rank = rank_command(relay, command);
    let after_program = rank.get(1..).unwrap_or_default();
    let joined = after_program.iter().map(|a| a.len()).sum::<usize>()
        + after_program.len().saturating_sub(1);
    let variable = "OMPI_ARGV=".len() + joined + 1;
    if variable <= MAX_ENV_STRING {
        return Ok(());
    }
    Err(CliError::Usage(format!(
        "--mpi: the command's arguments take {joined} bytes, and Open MPI gives them to each \
         rank in one environment variable (OMPI_ARGV), which Linux limits to {} KiB: run a \
         script, or pass the long arguments in a file (without --mpi the limit is Linux's own, \
         about 2 MiB)",
        MAX_ENV_STRING >> 10
    )))
}

/// The most ranks `run --mpi` starts: far beyond any Ascend cluster (4,096 servers of 16
/// NPUs), and what the launcher's state for every rank is sized for.
const MAX_MPI_RANKS: u32 = 65_536;

/// What can be known of the job's size before mpirun places it: at most [`MAX_MPI_RANKS`]
/// (a usage error), and, with `--sim N` (every host simulates N devices), no host with more
/// slots than N and no more ranks than the hosts' devices: exit 125, as without `--mpi`, where
/// the same is found once the devices are probed.
fn check_mpi_size(args: &RunSettings, hosts: &[HostSpec], np: u32) -> Result<(), CliError> {
    if np > MAX_MPI_RANKS {
        return Err(CliError::Usage(format!(
            "-n {np} is more than the {MAX_MPI_RANKS} ranks atlasboost runs under --mpi"
        )));
    }
    // mpirun gives a host without slots one slot: one such host alone gets the job's ranks
    // (mpirun_command), several cannot be told apart.
    if hosts.len() > 1
        && let Some(h) = hosts.iter().find(|h| h.slots.is_none())
    {
        return Err(CliError::Usage(format!(
            "--mpi: host {} ({}) has no slots, and mpirun would give it one: give every host \
             its slots (HOST:N, or slots=N in a hostfile), as mpirun places the ranks by them",
            h.name, h.origin
        )));
    }
    let slots: Option<u64> = hosts.iter().map(|h| h.slots.map(u64::from)).sum();
    if let Some(slots) = slots.filter(|_| !hosts.is_empty())
        && u64::from(np) > slots
    {
        return Err(CliError::Usage(format!(
            "-n {np} is more than the {} of {} (one worker per NPU)",
            crate::commands::counted(slots as usize, "slot"),
            crate::commands::counted(hosts.len(), "host")
        )));
    }
    let Some(sim) = args.discovery.sim else {
        return Ok(());
    };
    if let Some(h) = hosts.iter().find(|h| h.slots.is_some_and(|s| s > sim)) {
        return Err(CliError::Failure(format!(
            "host {} ({}) has {}, more than its {} (--sim {sim}; one worker per NPU)",
            h.name,
            h.origin,
            crate::commands::counted(h.slots.unwrap_or_default() as usize, "slot"),
            crate::commands::counted(sim as usize, "simulated device"),
        )));
    }
    let devices = u64::from(sim) * hosts.len().max(1) as u64;
    if u64::from(np) > devices {
        return Err(CliError::Failure(format!(
            "-n {np} is more than the {} of {} (--sim {sim}; one worker per NPU)",
            crate::commands::counted(devices as usize, "simulated device"),
            match hosts.len() {
                0 => "this machine".to_string(),
                n => crate::commands::counted(n, "host"),
            }
        )));
    }
    check_simulated_shape(hosts, np, sim)
}

/// The table the workers' `init()` would write, known before mpirun starts when the devices
/// are simulated (910s, the only chip `--mpi` simulates): mpirun fills each host's slots in
/// turn (`-map-by slot`), and a 910 server runs 1, 2, 4 or 8 devices, as many on every
/// server. A shape no table can have is refused here, as without `--mpi` (exit 125), rather
/// than by every worker's `init()`.
fn check_simulated_shape(hosts: &[HostSpec], np: u32, sim: u32) -> Result<(), CliError> {
    let mut left = np;
    let counts: Vec<(&str, u32)> = match hosts {
        [] => vec![("this machine", np)],
        _ => hosts
            .iter()
            .map(|h| {
                // A host without slots is alone (checked above): it takes every rank.
                let take = h.slots.unwrap_or(left).min(left);
                left -= take;
                (h.name.as_str(), take)
            })
            .filter(|(_, n)| *n > 0)
            .collect(),
    };
    let placed = counts
        .iter()
        .map(|(host, n)| {
            format!(
                "{} on {host}",
                crate::commands::counted(*n as usize, "rank")
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    // The validator's rules for the chip (atlasboost_core::Chip), before any table exists.
    let chip = atlasboost_core::Chip::Ascend910;
    let why = if counts
        .iter()
        .any(|(_, n)| !chip.allows_device_count(*n as usize))
    {
        "a 910 server runs 1, 2, 4 or 8 workers"
    } else if chip.needs_equal_device_counts() && counts.iter().any(|(_, n)| *n != counts[0].1) {
        "the servers of a 910 table run as many workers each"
    } else {
        return Ok(());
    };
    let how = match hosts.len() {
        0 | 1 => "",
        _ => " (mpirun fills each host's slots in turn)",
    };
    Err(CliError::Failure(format!(
        "-n {np} puts {placed}{how}, and {why} (--sim {sim}): the workers' init() would \
         refuse the table"
    )))
}

/// `atlasboost relay -- COMMAND`: one rank of `run --mpi`, started by mpirun. Connects to the
/// launcher, runs the worker with the rank's environment (minus the relay's own variables),
/// sends its lines and its exit, and exits with the worker's code (mpirun, told not to abort on
/// it, leaves stopping the others to the launcher, which got the exit first). Returns the
/// exit code.
pub fn relay_main(command: &[OsString]) -> u8 {
    relay_as(Relay::Subcommand, command)
}

/// `atlasboost-relay -- COMMAND` ([`RELAY_PROGRAM`]): [`relay_main`] in a program of its own,
/// which first checks that the launcher is of its build ([`relay_version`]): a relay program
/// left beside a newer atlasboost would otherwise speak to it in another version.
pub fn relay_program_main(command: &[OsString]) -> u8 {
    relay_as(Relay::Program, command)
}

/// Which relay this process is: the two run the same code, and the program checks its
/// launcher's version first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Relay {
    /// `atlasboost relay`, the launcher's own executable (or `--remote-atlasboost`).
    Subcommand,
    /// [`RELAY_PROGRAM`], from beside the launcher's executable.
    Program,
}

impl Relay {
    /// How its messages name it.
    fn name(self) -> &'static str {
        match self {
            Relay::Subcommand => "atlasboost relay",
            Relay::Program => RELAY_PROGRAM,
        }
    }
}

/// The name of the relay program that `run --mpi` uses from beside `atlasboost`.
pub const RELAY_PROGRAM: &str = "atlasboost-relay";

/// The relay program in `dir`, when it is a file this process may execute (a directory, a
/// dangling link, a file without the permission, one on a `noexec` mount: none).
#[must_use]
pub fn relay_beside(dir: &Path) -> Option<std::path::PathBuf> {
    let path = dir.join(RELAY_PROGRAM);
    let executable = nix::unistd::access(&path, nix::unistd::AccessFlags::X_OK).is_ok();
    (path.is_file() && executable).then_some(path)
}

/// What a launcher and the relay program beside it must share: atlasboost's version and its
/// channel's protocol (`0.1.0+atlasboost-agent-10`: one word, as mpirun's `-x` passes it on).
#[must_use]
pub fn relay_version() -> String {
    let protocol = String::from_utf8_lossy(channel::HELLO);
    format!(
        "{}+{}",
        env!("CARGO_PKG_VERSION"),
        protocol.trim_matches(['\0', '\n'])
    )
}

fn relay_as(kind: Relay, command: &[OsString]) -> u8 {
    let name = kind.name();
    match relay(kind, command) {
        Ok(code) => code,
        Err(e) => {
            to_stderr(&format!("{name}: error: {}\n", error_chain(&e)));
            e.exit_code()
        }
    }
}

fn relay(kind: Relay, command: &[OsString]) -> Result<u8, CliError> {
    super::supervise::note_relay_parent();
    let name = kind.name();
    let not_by_hand = |variable: &str| {
        CliError::Usage(format!(
            "{variable} is not set: `{name}` is started by mpirun for `atlasboost run --mpi`, \
             not by hand"
        ))
    };
    let address = std::env::var(EnvVars::ATLASBOOST_RELAY_ADDR)
        .map_err(|_| not_by_hand(EnvVars::ATLASBOOST_RELAY_ADDR))?;
    let secret = std::env::var(EnvVars::ATLASBOOST_RELAY_SECRET)
        .map_err(|_| not_by_hand(EnvVars::ATLASBOOST_RELAY_SECRET))
        .and_then(|hex| {
            Secret::from_hex(&hex).ok_or_else(|| {
                CliError::Usage(format!(
                    "{} is not 64 hexadecimal digits",
                    EnvVars::ATLASBOOST_RELAY_SECRET
                ))
            })
        })?;
    let job_id = std::env::var(EnvVars::ATLASBOOST_JOB_ID)
        .map_err(|_| not_by_hand(EnvVars::ATLASBOOST_JOB_ID))?;
    if kind == Relay::Program {
        check_relay_version(std::env::var(EnvVars::ATLASBOOST_RELAY_VERSION).ok())?;
    }
    // It refuses to run beside another thread: the relay is alone in its process.
    let signals = Signals::block()?;
    // SAFETY: no other thread exists (Signals::block checked), so nothing reads the
    // environment meanwhile. The worker must not inherit the relay's key.
    let local = std::env::var(EnvVars::ATLASBOOST_RELAY_LOCAL).ok();
    let millis = |name: &str, default: Duration| match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(ms) => ms
            .parse()
            .map(Duration::from_millis)
            .map_err(|_| CliError::Usage(format!("{name}={ms} is not a number of milliseconds"))),
    };
    let grace = millis(EnvVars::ATLASBOOST_RELAY_GRACE_MS, DEFAULT_RELAY_GRACE)?;
    let lost_after = millis(EnvVars::ATLASBOOST_RELAY_LOST_AFTER_MS, channel::LOST_AFTER)?;
    if lost_after < channel::LOST_AFTER {
        return Err(CliError::Usage(format!(
            "{}={} is below --host-timeout's least, {} ms",
            EnvVars::ATLASBOOST_RELAY_LOST_AFTER_MS,
            lost_after.as_millis(),
            channel::LOST_AFTER.as_millis()
        )));
    }
    let exported: Vec<(OsString, OsString)> = std::env::var(EnvVars::ATLASBOOST_RELAY_EXPORTED)
        .unwrap_or_default()
        .split(',')
        .filter(|n| !n.is_empty())
        .map(|n| (n.into(), OsString::new()))
        .collect();
    unsafe {
        std::env::remove_var(EnvVars::ATLASBOOST_RELAY_EXPORTED);
        std::env::remove_var(EnvVars::ATLASBOOST_RELAY_SECRET);
        std::env::remove_var(EnvVars::ATLASBOOST_RELAY_ADDR);
        std::env::remove_var(EnvVars::ATLASBOOST_RELAY_LOCAL);
        std::env::remove_var(EnvVars::ATLASBOOST_RELAY_VERSION);
        std::env::remove_var(EnvVars::ATLASBOOST_RELAY_GRACE_MS);
        std::env::remove_var(EnvVars::ATLASBOOST_RELAY_LOST_AFTER_MS);
    }
    let context = launch_context::detect_from_env()?
        .filter(|c| c.launcher.is_mpi())
        .ok_or_else(|| {
            CliError::Usage(
                "no MPI launcher's variables (OMPI_COMM_WORLD_RANK, PMI_RANK) are set: `atlasboost \
                 relay` is started by mpirun"
                    .into(),
            )
        })?;
    let host = atlasboost_core::host_name();
    let who = Introduction {
        job_id: &job_id,
        secret: &secret,
        rank: context.rank,
        size: context.size,
        local_rank: context.local_rank,
        host: &host,
    };
    let introduced = introduce(
        &address,
        local.as_deref(),
        &who,
        RELAY_CONNECT_TIMEOUT,
        channel::HELLO,
    )
    .map_err(|why| CliError::Introduction {
        rank: context.rank,
        why,
    })?;
    let connection = introduced.connection;
    // Below the launcher (its mpirun started this relay), what a worker leaves behind in a
    // session of its own is re-parented to the launcher, a subreaper, which stops it. Anywhere
    // else (another host, or this one through ssh) nothing above the relay would: there the
    // workers' cgroup is the default, so that even a relay killed with SIGKILL leaves nothing
    // running (it costs those relays the kernel's migration lock once, a few milliseconds).
    // (On the Unix socket only: the launcher takes a process group only from a relay of its
    // own host, which it knows by that socket.)
    let below_launcher = launcher_pid(&connection).is_some_and(is_ancestor);
    let guarded_above = below_launcher && introduced.local;
    // Below the launcher, the launcher's guard is this relay's too (a guard of its own would
    // cost every rank a fork on the launch's path).
    let mut lifeline = match (guarded_above, below_launcher) {
        (true, _) => lifeline::prepare_below_launcher()?,
        (false, below) => lifeline::prepare(CgroupWanted::ByDefault(!below), None, None)?,
    };
    // Commands go to the supervisor; the launcher is heard on `launcher` after it.
    let [commands, launcher] = [connection.try_clone(), connection.try_clone()]
        .map(|c| c.map_err(CliError::system("duplicate the connection")));
    let (commands, launcher) = (commands?, launcher?);
    let mut output = Output::upstream_to(connection, &[context.rank])?;
    output.send_messages_upstream();
    let worker = WorkerPlan {
        rank: context.rank,
        host: host.clone(),
        device: context.local_rank,
        // A worker that fails ends itself, and the launcher stops the others (see the name).
        // The defaults of every worker (SPEC §9) are set here, before it starts: init() sets
        // them too, but after the interpreter has loaded OpenMP.
        env: std::iter::once((EnvVars::ATLASBOOST_RELAYED, "1".to_string()))
            .chain(
                atlasboost_core::worker_env::defaults_unless_set()
                    .into_iter()
                    .filter(|(name, _)| std::env::var_os(name).is_none()),
            )
            .map(|(name, value)| (name.into(), value.into()))
            .collect(),
        local: true,
        cpus: None,
    };
    let plan = RunPlan {
        helpers: Vec::new(),
        command: command.to_vec(),
        wdir: std::env::current_dir().map_err(CliError::system("read the current directory"))?,
        // The launcher's --grace: for a stop of its own (mpirun's SIGTERM, what the worker left
        // behind); the launcher's `sig 9` may come first.
        grace,
        lost_after,
        files: None,
        watch: false,
        hang: None,
        pytorch: false,
        monitor: None,
        metrics: None,
        // This host's own (a remote host's login environment; the launcher's host's were
        // kept from mpirun already, and named there).
        unset_env: other_startup_vars(&exported),
    };
    let result = run_workers(
        &plan,
        &[worker],
        &mut output,
        &signals,
        &mut lifeline,
        Role::Agent(Upstream::relay(commands)),
    );
    lifeline.close();
    // (Not when the launcher is lost: nobody would let it go.)
    let stopped = result
        .as_ref()
        .is_ok_and(|r| !r.launcher_lost && r.workers.first().is_some_and(|w| w.stopped));
    let code = match result {
        Ok(r) => {
            output.send(&Up::Done);
            match r.workers.first() {
                // Stopped on the launcher's word (or mpirun's): the launcher knows how it ended
                // and decides the job's code; 0 keeps mpirun's report of the job quiet.
                Some(w) if w.stopped => ExitCodes::SUCCESS,
                Some(w) => w.ending.map_or(ExitCodes::FAILURE, |e| e.code()),
                None => ExitCodes::FAILURE,
            }
        }
        Err(e) => output.send_failure(&e),
    };
    send_the_rest(&mut output, &signals, launcher.as_fd(), lost_after);
    // In a stop, this relay's exit would cut mpirun's wait before its SIGKILL short for the
    // other ranks (see `wait_for_release`): it stays until every rank has ended, at most as
    // long as the grace (mpirun's SIGKILL comes before that).
    if stopped {
        wait_for_release(&signals, launcher.as_fd(), grace);
    }
    Ok(code)
}

/// The relay program's refusal of a launcher of another build (`launcher`: its
/// [`relay_version`], `None` from one too old to give it), naming this program.
fn check_relay_version(launcher: Option<String>) -> Result<(), CliError> {
    let ours = relay_version();
    if launcher.as_deref() == Some(ours.as_str()) {
        return Ok(());
    }
    let this =
        std::env::current_exe().map_or_else(|_| RELAY_PROGRAM.into(), |p| p.display().to_string());
    let theirs = launcher.map_or_else(
        || "an atlasboost too old to say its version".into(),
        |v| format!("atlasboost {v}"),
    );
    Err(CliError::Usage(format!(
        "this relay ({this}) is atlasboost {ours}, and the launcher that started it is \
         {theirs}: install atlasboost and {RELAY_PROGRAM} from one build \
         (scripts/build-static-relay.sh after cargo build), or remove {this}: atlasboost then \
         relays with itself"
    )))
}

/// The launcher's process id as this process's pid namespace sees it, from the Unix socket
/// `connection` (its peer's credentials); `None` over TCP.
fn launcher_pid(connection: &std::os::fd::OwnedFd) -> Option<i32> {
    nix::sys::socket::getsockopt(connection, nix::sys::socket::sockopt::PeerCredentials)
        .ok()
        .map(|c| c.pid())
        .filter(|&pid| pid > 0)
}

/// Whether process `pid` is an ancestor of this one (its parent's parent's ..., from
/// `/proc`; a few steps up, at most 64).
fn is_ancestor(pid: i32) -> bool {
    let mut at = nix::unistd::getppid().as_raw();
    for _ in 0..64 {
        if at == pid {
            return true;
        }
        if at <= 1 {
            return false;
        }
        let Some(parent) = atlasboost::process::process_stat(at as u32) else {
            return false;
        };
        at = parent.ppid as i32;
    }
    false
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    #[test]
    fn the_relay_program_beside_is_a_file_this_process_may_execute() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(RELAY_PROGRAM);
        assert_eq!(relay_beside(dir.path()), None, "none there");
        std::os::unix::fs::symlink(dir.path().join("gone"), &path).unwrap();
        assert_eq!(relay_beside(dir.path()), None, "a dangling link");
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        assert_eq!(relay_beside(dir.path()), None, "a directory");
        std::fs::remove_dir(&path).unwrap();
        std::fs::write(&path, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(relay_beside(dir.path()), None, "not executable");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(relay_beside(dir.path()), Some(path));
    }

    #[test]
    fn ranks_here_run_the_relay_program_and_others_atlasboost_relay() {
        let program = std::path::PathBuf::from("/opt/ab/atlasboost-relay");
        let words = |p: Vec<OsString>| -> Vec<String> {
            p.iter().map(|w| w.to_string_lossy().into_owned()).collect()
        };
        let here = relay_prefix(None, true, Some(program.clone())).unwrap();
        assert_eq!(words(here), ["/opt/ab/atlasboost-relay", "--"]);
        // Hosts given: `atlasboost relay` (this executable's path).
        let hosts = words(relay_prefix(None, false, Some(program.clone())).unwrap());
        assert_eq!(hosts[1..], ["relay", "--"], "{hosts:?}");
        assert_ne!(hosts[0], "/opt/ab/atlasboost-relay");
        // --remote-atlasboost (passed when some host is another machine): that atlasboost.
        let remote = Path::new("/srv/atlasboost");
        for every_rank_here in [true, false] {
            let prefix = relay_prefix(Some(remote), every_rank_here, Some(program.clone()));
            assert_eq!(words(prefix.unwrap()), ["/srv/atlasboost", "relay", "--"]);
        }
        // No relay program beside: `atlasboost relay`.
        let alone = words(relay_prefix(None, true, None).unwrap());
        assert_eq!(alone[1..], ["relay", "--"], "{alone:?}");
    }

    #[test]
    fn the_relay_program_refuses_a_launcher_of_another_build_naming_both() {
        assert!(check_relay_version(Some(relay_version())).is_ok());
        let version = relay_version();
        // One word (mpirun's -x passes it on), with the protocol of channel::HELLO.
        assert_eq!(
            version,
            format!("{}+atlasboost-agent-10", env!("CARGO_PKG_VERSION"))
        );
        let e = check_relay_version(Some("0.0.9+atlasboost-agent-7".into()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!(
                "is atlasboost {version}, and the launcher that started it is atlasboost \
                 0.0.9+atlasboost-agent-7"
            )) && e.contains("install atlasboost and atlasboost-relay from one build"),
            "{e}"
        );
        let e = check_relay_version(None).unwrap_err().to_string();
        assert!(
            e.contains("an atlasboost too old to say its version"),
            "{e}"
        );
    }

    fn run_args(argv: &[&str]) -> RunSettings {
        let mut full = vec!["atlasboost", "run", "--mpi"];
        full.extend_from_slice(argv);
        match Cli::try_parse_from(full) {
            Ok(Cli {
                command: Command::Run(args),
                ..
            }) => RunSettings::from(args.as_ref()),
            Ok(_) => panic!("run expected"),
            Err(e) => panic!("{argv:?} does not parse: {e}"),
        }
    }

    fn command(args: &RunSettings, hosts: &[HostSpec], np: u32, as_root: bool) -> Vec<String> {
        mpirun_command(&MpirunJob {
            program: "mpirun".into(),
            np,
            hosts,
            args,
            wdir: Path::new("/work"),
            table_path: Path::new("/work/rank_table.json"),
            job_id: "ab-1",
            exports: &[("FOO".into(), "s3cr3t v".into())],
            as_root,
            master_port: Some(29555),
            relay: &["/opt/atlasboost".into(), "relay".into(), "--".into()],
            relay_address: "10.0.0.9:4000",
            relay_local: Some("atlasboost-relays-ab-1-4000"),
            master_addr: if hosts.is_empty() {
                "127.0.0.1"
            } else {
                "10.0.0.1"
            },
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
                 --mca orte_abort_on_non_zero_status 0 --mca odls_base_sigkill_timeout 5 \
                 --mca btl_tcp_if_exclude lo,docker0 -x "
            ),
            "{text}"
        );
        assert!(!text.contains("--allow-run-as-root"), "{text}");
        let with_nic = run_args(&["--sim", "8", "--nic", "10.9.0.0/16", "--", "true"]);
        let nic_text = command(&with_nic, &hosts, 12, false).join(" ");
        assert!(
            nic_text.contains(
                "--mca btl_tcp_if_include 10.9.0.0/16 --mca oob_tcp_if_include 10.9.0.0/16 "
            ) && !nic_text.contains("btl_tcp_if_exclude"),
            "{nic_text}"
        );
        for var in [
            "ATLASBOOST_FRAMEWORK=mindspore",
            "ATLASBOOST_RANK_TABLE_FILE=/work/rank_table.json",
            "ATLASBOOST_JOB_ID=ab-1",
            "ATLASBOOST_SIM=8",
            "ATLASBOOST_PROBE=auto",
            "MASTER_ADDR=10.0.0.1",
            "ATLASBOOST_RELAY_ADDR=10.0.0.9:4000",
            "ATLASBOOST_RELAY_GRACE_MS=10000",
            "ATLASBOOST_RELAY_LOST_AFTER_MS=4000",
            // The table init() writes: --format and --rank-order, here their defaults.
            "ATLASBOOST_RANK_TABLE_FORMAT=1.0",
            "ATLASBOOST_RANK_ORDER=server-id",
            // By name only: mpirun passes its own value on.
            "ATLASBOOST_RELAY_SECRET",
        ] {
            let at = cmd.iter().position(|a| a == var);
            assert!(at.is_some_and(|i| cmd[i - 1] == "-x"), "-x {var} in {text}");
        }
        // A user's export by name only: its value is on no command line.
        let at = cmd.iter().position(|a| a == "FOO");
        assert!(at.is_some_and(|i| cmd[i - 1] == "-x"), "-x FOO in {text}");
        assert!(!text.contains("s3cr3t"), "{text}");
        assert!(
            text.ends_with("-wdir /work /opt/atlasboost relay -- python3 t.py"),
            "{text}"
        );
    }

    #[test]
    fn master_addr_is_the_first_hosts_address_reachable_from_the_others() {
        let host = |name: &str, server_id: &str, local: bool| HostPlan {
            name: name.into(),
            server_id: server_id.into(),
            slots: Some(8),
            local,
        };
        let relay: IpAddr = "10.0.0.9".parse().unwrap();
        // `-H localhost:8,node2:8`: node2's ranks must reach this machine, not their loopback.
        let hosts = [
            host("localhost", "127.0.0.1", true),
            host("node2", "10.0.0.2", false),
        ];
        assert_eq!(master_address(&hosts, relay), "10.0.0.9");
        // A remote first host, by its address.
        let hosts = [
            host("node1", "10.0.0.1", false),
            host("localhost", "127.0.0.1", true),
        ];
        assert_eq!(master_address(&hosts, relay), "10.0.0.1");
        // Every host this machine, or none given.
        assert_eq!(
            master_address(&[host("localhost", "127.0.0.1", true)], relay),
            "127.0.0.1"
        );
        assert_eq!(master_address(&[], relay), "127.0.0.1");
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
            ("--devices", vec!["--devices", "0-3"]),
            ("--sim-chip", vec!["--sim", "8", "--sim-chip", "910b"]),
            ("--ssh-port", vec!["--ssh-port", "2222"]),
            ("--fanout", vec!["--fanout", "2"]),
            ("--chip", vec!["--chip", "910b"]),
        ] {
            let mut full = argv.clone();
            full.extend(["--", "w"]);
            let args = run_args(&full);
            match refuse_unsupported(&args)
                .and_then(|()| super::super::refuse_ssh_options(&args, false))
            {
                Err(CliError::Usage(m)) => {
                    assert!(
                        m.starts_with(&format!("{flag} cannot be used with --mpi")),
                        "{m}"
                    )
                }
                other => panic!("{flag}: expected a usage error, got {other:?}"),
            }
        }
        // The relays' own variables are the launcher's.
        for var in [
            "ATLASBOOST_RELAY_SECRET=00",
            "ATLASBOOST_RELAY_GRACE_MS=abc",
        ] {
            match refuse_unsupported(&run_args(&["-x", var, "--", "w"])) {
                Err(CliError::Usage(m)) => assert!(
                    m.contains("atlasboost sets the relays' variables itself under --mpi"),
                    "{m}"
                ),
                other => panic!("-x {var}: expected a usage error, got {other:?}"),
            }
        }
        // The table's format and order reach init() in the workers.
        let table = run_args(&["--format", "1.2", "--rank-order", "hosts", "--", "w"]);
        assert!(refuse_unsupported(&table).is_ok());
        let hosts = parse_host_list("node1:8").unwrap_or_else(|e| panic!("{e}"));
        let cmd = command(&table, &hosts, 8, false);
        for var in [
            "ATLASBOOST_RANK_TABLE_FORMAT=1.2",
            "ATLASBOOST_RANK_ORDER=hosts",
        ] {
            let at = cmd.iter().position(|a| a == var);
            assert!(
                at.is_some_and(|i| cmd[i - 1] == "-x"),
                "-x {var} in {cmd:?}"
            );
        }
        // The legacy format orders servers by id.
        let legacy = run_args(&["--format", "legacy", "--rank-order", "hosts", "--", "w"]);
        assert!(
            matches!(check_before_start(&legacy, None), Err(CliError::Usage(m))
                if m.starts_with("--rank-order hosts cannot apply to --format legacy")),
            "{:?}",
            check_before_start(&legacy, None)
        );
        // What atlasboost's own output does, --mpi does too.
        let own = [
            "--sim",
            "8",
            "--log-dir",
            "logs",
            "--ranks",
            "0",
            "--timestamp",
            "--no-tag",
            "--rendezvous-addr",
            "10.0.0.1",
            "--remote-atlasboost",
            "/x",
            "--",
            "w",
        ];
        assert!(refuse_unsupported(&run_args(&own)).is_ok());
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
