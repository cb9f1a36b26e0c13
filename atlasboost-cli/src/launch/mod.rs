//! `atlasboost run`: plan the hosts, agree on the rank table, start and watch the workers
//! (SPEC §5–§9).
//!
//! The launcher is the rendezvous coordinator. Each host has an agent ([`agent::run_agent`])
//! that probes its devices, reports them, receives the table the launcher built from every
//! report, and writes it. Hosts that are this machine (`127.x.y.z`, its own addresses) run
//! their agent on a thread of the launcher. Then [`supervise::run_workers`] starts one worker
//! per table entry and watches them to the end.
//!
//! Hosts on other machines are reached over ssh ([`remote`]): one session per host runs
//! `atlasboost agent`, the same agent code, which reports over the [`channel`].

pub mod agent;
pub mod channel;
pub mod job;
pub mod lifeline;
pub mod mpi;
pub mod output;
pub mod plan;
pub mod rank_files;
pub mod relay;
pub mod remote;
pub mod supervise;

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::IsTerminal;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use atlasboost_core::ranktable::{BuildOptions, RankOrder, RankTable};
use atlasboost_core::{Device, EnvVars};
use atlasboost_tcp::{Coordinator, CoordinatorConfig, Secret};
use nix::sys::signal::Signal;

use self::agent::{Decision, HostPart, Shrink, TablePolicy, host_workers, launch_combiner_with};
use self::channel::{AgentConfig, Up, WorkerSettings};
use self::job::{
    AttemptRecord, check_before_start, ending_of, job_logs, lock_table, new_job_id,
    rendezvous_address, report, report_attempt, resolve_exports, worker_dir,
};
use self::output::{Output, OutputOptions};
use self::plan::{
    HostPlan, check_np, parse_host_list, parse_hostfile, resolve_hosts, this_machine,
};
use self::rank_files::RankFiles;
use self::remote::{Remote, SshOptions};
use self::supervise::{HangWatch, JobResult, Role, RunPlan, Signals, WorkerPlan, run_workers};
use crate::commands::counted;
use crate::error::CliError;
use crate::exit::ExitCodes;
use crate::printer::{Printer, to_stderr};
use crate::settings::{RunSettings, ServerOrder};

/// How much longer an agent waits for the launcher's answer than the launcher waits for the
/// agents, so that a timeout is reported by the one that knows who is missing.
const AGENT_SLACK: Duration = Duration::from_secs(2);

/// Runs `atlasboost run` and returns the exit code (the first failed worker's, 128+N after a
/// signal, 0 when every worker succeeded).
///
/// # Errors
///
/// Bad input (exit 2), atlasboost's own failures (125), a command that cannot be started
/// (126/127).
pub fn run(args: &RunSettings, printer: &Printer) -> Result<u8, CliError> {
    if args.mpi {
        return mpi::run_mpi(args, printer);
    }
    let started = Instant::now();
    // Before anything can start a thread (the driver library's initialisers, when it is
    // loaded below, may): every thread must inherit the blocked mask.
    let signals = Signals::block()?;
    let hosts = plan_hosts(args)?;
    // Refuse what cannot work before anything starts.
    atlasboost::probe::make_probe(&args.discovery, &hosts[0].server_id)?;
    let wdir = worker_dir(args, hosts.iter().any(|h| h.local))?;
    let table_path = wdir.join(&args.rank_table);
    let exports = resolve_exports(&args.env)?;
    // What can be checked before any host starts a worker is checked now.
    let known_size = args.np.map(u64::from).or_else(|| {
        hosts
            .iter()
            .map(|h| h.slots.map(u64::from))
            .sum::<Option<u64>>()
    });
    check_before_start(args, known_size)?;
    if let (Some(min), Some(size)) = (args.min_np, known_size)
        && u64::from(min) > size
    {
        return Err(CliError::Usage(format!(
            "--min-np {min} is more than the job's {} (a restart never grows the job)",
            counted(size as usize, "rank")
        )));
    }
    let job_id = new_job_id()?;
    // Held to the end of the job, across restarts: no other job replaces this table while
    // the workers run.
    let _table_lock = match hosts.iter().any(|h| h.local) {
        true => Some(lock_table(&table_path, &job_id, None)?),
        false => None,
    };
    let bind = rendezvous_address(args, &hosts)?;

    let logs = job_logs(args, &job_id, printer)?;
    let mut lifeline = lifeline::prepare()?;
    let files = RankFiles::create(&job_id)?;
    let mut job = JobState {
        args,
        hosts: &hosts,
        job_id: &job_id,
        bind: &bind,
        base: WorkerSettings {
            framework: args.framework.to_string(),
            command: args.command.clone(),
            wdir: wdir.clone(),
            rank_table: table_path.clone(),
            env: exports,
            grace_ms: args.grace.as_millis() as u64,
            restart_count: 0,
            max_restarts: args.max_restarts,
            watch: args.hang_timeout.is_some(),
            nic: args.nic.as_ref().map(ToString::to_string),
            bind_cores: args.bind_cores,
        },
        files: &files,
        logs: logs.as_deref(),
        lost: Vec::new(),
        first_size: None,
        attempts: Vec::new(),
    };
    let outcome = run_attempts(&mut job, &signals, &mut lifeline, printer);
    lifeline.close();
    files.remove();
    let (result, code) = match outcome? {
        Outcome::Ran(result) => {
            let code = result.exit_code;
            (Some(result), code)
        }
        Outcome::Ended(code) => (None, code),
    };
    report(
        result.as_ref(),
        &job.attempts,
        started.elapsed(),
        logs.as_deref(),
        printer,
    );
    Ok(code)
}

/// The job across its attempts.
struct JobState<'a> {
    args: &'a RunSettings,
    hosts: &'a [HostPlan],
    job_id: &'a str,
    bind: &'a IpAddr,
    /// The workers' settings; each attempt sets its restart count.
    base: WorkerSettings,
    files: &'a RankFiles,
    logs: Option<&'a std::path::Path>,
    /// Hosts lost or failed in an attempt, left out for the rest of the job.
    lost: Vec<String>,
    /// The first attempt's world size: no restart grows past it, nor shrinks below it without
    /// `--min-np`.
    first_size: Option<usize>,
    attempts: Vec<AttemptRecord>,
}

/// How the last attempt ended.
enum Outcome {
    /// Its workers ran: their result.
    Ran(JobResult),
    /// It ended before any worker started (a signal while the hosts joined, a restart that
    /// found no valid world): the exit code.
    Ended(u8),
}

/// Runs the first attempt and every restart the failures call for (SPEC §12).
fn run_attempts(
    job: &mut JobState<'_>,
    signals: &Signals,
    lifeline: &mut lifeline::Lifeline,
    printer: &Printer,
) -> Result<Outcome, CliError> {
    let args = job.args;
    for attempt in 0..=args.max_restarts {
        let attempt_started = Instant::now();
        let live: Vec<HostPlan> = job
            .hosts
            .iter()
            .filter(|h| !job.lost.contains(&h.describe()))
            .cloned()
            .collect();
        let mut settings = job.base.clone();
        settings.restart_count = attempt;
        let shrink = job.first_size.map(|first| Shrink {
            min: args.min_np.map_or(first as u64, u64::from),
            min_given: args.min_np.is_some(),
            max: first as u64,
            left_out: job.lost.clone(),
        });
        let launch = Launch {
            args,
            hosts: &live,
            job_id: job.job_id,
            bind: job.bind,
            settings: &settings,
            shrink,
        };
        let joined = match join(&launch, signals, printer) {
            Ok(Joined::Ready(j)) => j,
            Ok(Joined::Interrupted(s)) => {
                printer.status(&format!(
                    "atlasboost: stopped by {} while the hosts were joining",
                    s.as_str()
                ));
                return Ok(Outcome::Ended(128u8.wrapping_add(s as u8)));
            }
            // A restart that cannot go on ends the job, naming why; the first attempt's
            // errors are the launch's.
            Err(e) if attempt > 0 => {
                return Ok(end_restart(job, attempt, attempt_started, &e, printer));
            }
            Err(e) => return Err(e),
        };
        // After the join, an error of a restart ends the job with a record of the attempt
        // (and the summary of the earlier ones); the first attempt's errors are the launch's.
        let ran = (|| -> Result<(JobResult, String), CliError> {
            let workers = plan_workers(&launch, &joined)?;
            if let Some(list) = &args.ranks
                && let Some(bad) = list.ranks.iter().find(|r| **r as usize >= workers.len())
            {
                let why = format!(
                    "--ranks {}: rank {bad} is not in this job of {} (0-{})",
                    list.text,
                    counted(workers.len(), "rank"),
                    workers.len() - 1
                );
                // A restart that shrank the job shows the ranks it still has.
                if attempt == 0 {
                    return Err(CliError::Usage(why));
                }
                printer.status(&format!("atlasboost: warning: {why}"));
            }
            if let Some(min) = args
                .min_np
                .filter(|&m| attempt == 0 && m as usize > workers.len())
            {
                return Err(CliError::Usage(format!(
                    "--min-np {min} is more than the job's {} (a restart never grows the job)",
                    counted(workers.len(), "rank")
                )));
            }
            job.first_size.get_or_insert(workers.len());
            for w in workers.iter().filter(|w| w.local) {
                if let Some(cpus) = &w.cpus {
                    printer.detail(&format!(
                        "atlasboost: rank {} (host {}, device {}) runs on CPUs {}",
                        w.rank,
                        w.host,
                        w.device,
                        plan::cpu_ranges(cpus)
                    ));
                }
            }
            let layout = layout(&joined.decision.table, workers.len());
            printer.status(&format!(
                "atlasboost: {}{layout}, rank table {} (ready in {} ms)",
                match attempt {
                    0 => String::new(),
                    n => format!("restart {n} of {}: ", args.max_restarts),
                },
                settings.rank_table.display(),
                attempt_started.elapsed().as_millis()
            ));
            let attempt_logs = match (job.logs, args.max_restarts) {
                (Some(dir), 0) => Some(dir.to_path_buf()),
                (Some(dir), _) => Some(dir.join(format!("attempt_{attempt}"))),
                (None, _) => None,
            };
            let mut output = Output::new(
                OutputOptions {
                    tag: !args.no_tag,
                    timestamp: args.timestamp,
                    ranks: args.ranks.as_ref().map(|r| r.ranks.clone()),
                    log_dir: attempt_logs.clone(),
                    keep_last_line: args.hang_timeout.is_some(),
                },
                &workers.iter().map(|w| w.rank).collect::<Vec<_>>(),
            )?;
            let run_plan = RunPlan {
                command: args.command.clone(),
                wdir: settings.wdir.clone(),
                grace: args.grace,
                files: Some(job.files.clone()),
                watch: args.hang_timeout.is_some(),
                hang: args.hang_timeout.map(|timeout| HangWatch {
                    timeout,
                    dump: args.hang_dump,
                    dump_dir: attempt_logs.clone().unwrap_or_else(|| {
                        let dir = settings
                            .wdir
                            .join(format!("atlasboost-stacks-{}", job.job_id));
                        match args.max_restarts {
                            0 => dir,
                            _ => dir.join(format!("attempt_{attempt}")),
                        }
                    }),
                }),
                pytorch: args.framework == atlasboost_core::worker_env::Framework::Pytorch,
            };
            let result = run_workers(
                &run_plan,
                &workers,
                &mut output,
                signals,
                lifeline,
                Role::Launcher(joined.remotes),
            )?;
            Ok((result, layout))
        })();
        let (result, layout) = match ran {
            Ok(r) => r,
            Err(e) if attempt > 0 => {
                return Ok(end_restart(job, attempt, attempt_started, &e, printer));
            }
            Err(e) => return Err(e),
        };
        job.attempts.push(AttemptRecord {
            number: attempt,
            layout: Some(layout),
            duration: attempt_started.elapsed(),
            ended: ending_of(&result),
            exit_code: result.exit_code,
        });
        let restartable = result.exit_code != 0
            && result.interrupted.is_none()
            && (result.first_failure.is_some()
                || result.hang.is_some()
                || result
                    .host_failure
                    .as_ref()
                    .is_some_and(|h| h.code == ExitCodes::FAILURE));
        if !restartable || attempt == args.max_restarts {
            return Ok(Outcome::Ran(result));
        }
        // Left out for the rest of the job (SPEC §12): hosts lost, whether or not that ended
        // the attempt, and the host whose agent failed it.
        for host in result
            .lost_hosts
            .iter()
            .chain(result.host_failure.as_ref().map(|h| &h.host))
        {
            if !job.lost.contains(host) {
                job.lost.push(host.clone());
            }
        }
        // A storm of restarts is bounded: the delay doubles with each, up to 30 s.
        let delay = args
            .restart_delay
            .saturating_mul(1u32 << attempt.min(16))
            .min(MAX_RESTART_DELAY);
        report_attempt(&result, job.attempts.last(), printer);
        printer.status(&format!(
            "atlasboost: restarting every worker ({} of {}) in {:.1} s",
            attempt + 1,
            args.max_restarts,
            delay.as_secs_f64()
        ));
        if let Some(s) = wait_or_signal(signals, delay) {
            printer.status(&format!(
                "atlasboost: stopped by {} before the restart",
                s.as_str()
            ));
            return Ok(Outcome::Ended(128u8.wrapping_add(s as u8)));
        }
    }
    unreachable!("the last attempt returns")
}

/// A restart that cannot go on ends the job: the error is said, and recorded as the attempt's
/// end (the summary lists every attempt).
fn end_restart(
    job: &mut JobState<'_>,
    attempt: u32,
    started: Instant,
    e: &CliError,
    printer: &Printer,
) -> Outcome {
    let why = atlasboost_core::exchange::error_chain(e);
    printer.error(&format!("error: {why}"));
    job.attempts.push(AttemptRecord {
        number: attempt,
        layout: None,
        duration: started.elapsed(),
        ended: why,
        exit_code: e.exit_code(),
    });
    Outcome::Ended(e.exit_code())
}

/// The longest wait before a restart.
const MAX_RESTART_DELAY: Duration = Duration::from_secs(30);

/// Sleeps `delay` unless a signal that ends the job comes first.
fn wait_or_signal(signals: &Signals, delay: Duration) -> Option<Signal> {
    let until = Instant::now() + delay;
    loop {
        if let Some(s) = signals
            .pending()
            .into_iter()
            .find(|s| *s != Signal::SIGCHLD)
        {
            return Some(s);
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        std::thread::sleep(left.min(Duration::from_millis(20)));
    }
}

/// `N ranks on S servers (S × D)`, the table's shape (`S × D` when every server has D).
fn layout(table: &RankTable, ranks: usize) -> String {
    let servers = table.server_count();
    let mut counts: Vec<usize> = Vec::new();
    let mut last: Option<String> = None;
    for entry in table.ranks().unwrap_or_default() {
        if last.as_deref() == Some(entry.server_id.as_str()) {
            if let Some(n) = counts.last_mut() {
                *n += 1;
            }
        } else {
            counts.push(1);
            last = Some(entry.server_id);
        }
    }
    let per_server = match counts.first() {
        Some(&d) if counts.len() == servers && counts.iter().all(|&n| n == d) => {
            format!(" ({servers} × {d})")
        }
        _ => String::new(),
    };
    format!(
        "{} on {}{per_server}",
        counted(ranks, "rank"),
        counted(servers, "server")
    )
}

/// What every step of a launch needs to know.
struct Launch<'a> {
    args: &'a RunSettings,
    hosts: &'a [HostPlan],
    job_id: &'a str,
    /// The coordinator's address (no port).
    bind: &'a IpAddr,
    settings: &'a WorkerSettings,
    /// A restart's re-planning bounds; `None` for the first attempt.
    shrink: Option<Shrink>,
}

fn plan_hosts(args: &RunSettings) -> Result<Vec<HostPlan>, CliError> {
    let mut hosts = match (&args.hosts, &args.hostfile) {
        (Some(list), _) => resolve_hosts(&parse_host_list(list)?)?,
        (None, Some(file)) => resolve_hosts(&parse_hostfile(file)?)?,
        (None, None) => vec![this_machine(args.nic.as_ref())?],
    };
    check_np(&hosts, args.np)?;
    // Tests reach this machine's own addresses over ssh, as if they were other machines.
    if std::env::var_os(EnvVars::ATLASBOOST_SSH_ALL_HOSTS).is_some_and(|v| v == "1") {
        for h in &mut hosts {
            h.local = false;
        }
    }
    Ok(hosts)
}

/// The launcher's variables that remote workers receive too (SPEC §9).
fn forwarded_env() -> Vec<(OsString, OsString)> {
    std::env::vars_os()
        .filter(|(k, _)| {
            k.to_str().is_some_and(|k| {
                EnvVars::FORWARDED.contains(&k)
                    || EnvVars::FORWARDED_PREFIXES.iter().any(|p| k.starts_with(p))
            })
        })
        .collect()
}

/// How the join ended.
enum Joined {
    /// Every host has its table.
    Ready(Box<JoinedHosts>),
    /// A signal came first.
    Interrupted(Signal),
}

/// Every host after the rendezvous.
struct JoinedHosts {
    /// What the launcher decided (the cluster table included).
    decision: Decision,
    /// Local hosts' devices, by host index (`None` for a remote host).
    local: Vec<Option<Vec<Device>>>,
    /// Remote hosts' sessions.
    remotes: Vec<Remote>,
}

/// The launch's coordinator, with where its combiner leaves the decision, or its refusal in
/// its own words (without the coordinator's framing, for the error message).
struct Rendezvous {
    coordinator: Coordinator,
    secret: Secret,
    refusal: Arc<Mutex<Option<String>>>,
    decided: Arc<Mutex<Option<Decision>>>,
}

/// How the launcher turns the hosts' reports into the table.
fn table_policy(launch: &Launch<'_>) -> TablePolicy {
    let args = launch.args;
    TablePolicy {
        hosts: launch.hosts.to_vec(),
        np: args.np,
        build: BuildOptions {
            format: args.format,
            order: match args.rank_order {
                ServerOrder::ServerId => RankOrder::ServerId,
                ServerOrder::Hosts => RankOrder::Hosts(Vec::new()),
            },
            chip: None,
        },
        shrink: launch.shrink.clone(),
    }
}

/// Step 1 of the join, with remote hosts: the coordinator, whose participants are the remote
/// hosts; it decides the table once they reported, with the local hosts' reports.
fn start_coordinator(
    launch: &Launch<'_>,
    local: Vec<(usize, Vec<u8>)>,
    remote_index: &[usize],
    printer: &Printer,
) -> Result<Rendezvous, CliError> {
    let (args, hosts) = (launch.args, launch.hosts);
    let secret = Secret::random().map_err(CliError::system("make the job's secret"))?;
    let bind = match launch.bind {
        IpAddr::V4(ip) => format!("tcp://{ip}:0"),
        IpAddr::V6(ip) => format!("tcp://[{ip}]:0"),
    };
    let mut config = CoordinatorConfig::new(
        bind,
        remote_index.len(),
        launch.job_id,
        secret.clone(),
        args.rendezvous_timeout,
    );
    config.names = remote_index.iter().map(|&i| hosts[i].describe()).collect();
    printer.detail(&format!("atlasboost: rendezvous at {}", launch.bind));
    // The policy's own words, without the coordinator's framing, for the error message.
    let refusal: Arc<Mutex<Option<String>>> = Arc::default();
    let decided: Arc<Mutex<Option<Decision>>> = Arc::default();
    let mut combiner = launch_combiner_with(
        table_policy(launch),
        Arc::clone(&decided),
        local,
        Some(remote_index.to_vec()),
    );
    let seen = Arc::clone(&refusal);
    let coordinator = Coordinator::start_with(
        config,
        Box::new(move |round, payloads| {
            combiner(round, payloads).inspect_err(|why| {
                *seen.lock().unwrap_or_else(|p| p.into_inner()) = Some(why.clone());
            })
        }),
    )
    .map_err(atlasboost_core::Error::from)?;
    printer.detail(&format!(
        "atlasboost: coordinator at {}",
        coordinator.endpoint()
    ));
    Ok(Rendezvous {
        coordinator,
        secret,
        refusal,
        decided,
    })
}

/// Step 2: one ssh session per remote host, running `atlasboost agent` (first: ssh takes the
/// longest to get going). Participant `i` of the rendezvous is host `remote_index[i]`.
fn start_remote_agents(
    launch: &Launch<'_>,
    remote_index: &[usize],
    endpoint: &str,
    secret: &Secret,
) -> Result<Vec<Remote>, CliError> {
    let (args, hosts) = (launch.args, launch.hosts);
    let ssh = SshOptions {
        port: args.ssh_port,
        identity: args.ssh_identity.clone(),
        remote_atlasboost: match &args.remote_atlasboost {
            Some(p) => vec![p.clone().into_os_string()],
            None => crate::self_command()?,
        },
    };
    let mut remote_settings = launch.settings.clone();
    remote_settings.env = forwarded_env();
    remote_settings
        .env
        .extend(launch.settings.env.iter().cloned());
    let launcher_name = atlasboost_core::host_name();
    let mut remotes = Vec::new();
    for (participant, &index) in remote_index.iter().enumerate() {
        let host = &hosts[index];
        let config = AgentConfig {
            index: participant,
            hosts: remote_index.len(),
            server_id: host.server_id.clone(),
            host: host.describe(),
            launcher: launcher_name.clone(),
            discovery: args.discovery.clone(),
            endpoint: endpoint.to_string(),
            job_id: launch.job_id.to_string(),
            secret: secret.to_hex(),
            timeout_ms: (args.rendezvous_timeout + AGENT_SLACK).as_millis() as u64,
            workers: remote_settings.clone(),
        };
        remotes.push(Remote::start(&host.name, &host.describe(), &ssh, &config)?);
    }
    Ok(remotes)
}

/// The local hosts' reports (by host index, encoded as an agent sends them), and their devices
/// (by host index; `None` for a remote host).
type LocalReports = (Vec<(usize, Vec<u8>)>, Vec<Option<Vec<Device>>>);

/// Step 0: the local hosts' reports, made here: every local host is this machine, so there
/// is no rendezvous, one decision, one table in memory and one write for all of them.
fn local_reports(launch: &Launch<'_>) -> Result<LocalReports, CliError> {
    let mut reports = Vec::new();
    let mut devices: Vec<Option<Vec<Device>>> = launch.hosts.iter().map(|_| None).collect();
    for (index, host) in launch.hosts.iter().enumerate().filter(|(_, h)| h.local) {
        let (report, found) = agent::host_report(
            &launch.args.discovery,
            &host.server_id,
            launch.args.nic.as_ref(),
        )?;
        reports.push((
            index,
            serde_json::to_vec(&report).map_err(CliError::json("encode the host report"))?,
        ));
        devices[index] = Some(found.unwrap_or_default());
    }
    Ok((reports, devices))
}

/// Probes the local hosts, runs the coordinator and every remote agent's ssh session (when
/// there are remote hosts) until each remote host has written the table, and writes it once
/// for the local ones.
fn join(launch: &Launch<'_>, signals: &Signals, printer: &Printer) -> Result<Joined, CliError> {
    let (args, hosts) = (launch.args, launch.hosts);
    let started = Instant::now();
    let (local_reports, local_devices) = local_reports(launch)?;
    let remote_index: Vec<usize> = (0..hosts.len()).filter(|&i| !hosts[i].local).collect();
    if remote_index.is_empty() {
        // Every host is this machine: the launcher decides at once.
        let mut reports = vec![Vec::new(); hosts.len()];
        for (i, r) in local_reports {
            reports[i] = r;
        }
        let decision = agent::decide(&table_policy(launch), &reports).map_err(CliError::Failure)?;
        printer.detail("atlasboost: every host is this machine: no rendezvous");
        printer.detail(&format!(
            "atlasboost: {} probed and decided in {} ms",
            counted(hosts.len(), "local host"),
            started.elapsed().as_millis()
        ));
        return finish_join(launch, decision, local_devices, Vec::new(), printer);
    }
    let Rendezvous {
        coordinator,
        secret,
        refusal,
        decided,
    } = start_coordinator(launch, local_reports, &remote_index, printer)?;
    let endpoint = coordinator.endpoint().to_string();
    let mut remotes = start_remote_agents(launch, &remote_index, &endpoint, &secret)?;

    let progress = std::io::stderr().is_terminal() && !printer.is_quiet();
    let join_limit = args.rendezvous_timeout + AGENT_SLACK + AGENT_SLACK;
    let mut shown = false;
    // A remote host's own diagnosis (ssh's words) beats the coordinator's "it never joined".
    let mut remote_failure: Option<CliError> = None;
    let mut failure: Option<CliError> = None;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        if let Some(s) = signals
            .pending()
            .into_iter()
            .find(|s| *s != Signal::SIGCHLD)
        {
            if shown {
                to_stderr("\n");
            }
            return Ok(Joined::Interrupted(s));
        }
        if remotes.iter().all(|r| r.ready) || coordinator.failure().is_some() {
            break;
        }
        if let Some(e) = check_remotes(&mut remotes, &mut buf, printer) {
            remote_failure = Some(e);
            break;
        }
        // Only remote hosts to hear from: wait on their output, not on a clock.
        wait_readable(&remotes, Duration::from_millis(20));
        if started.elapsed() > join_limit {
            // The round itself is bounded by the coordinator; this bounds what comes after it
            // (a host that never says it wrote the table: a hung file system, a stalled link).
            let waiting: Vec<String> = remotes
                .iter()
                .filter(|r| !r.ready)
                .map(|r| r.host.clone())
                .collect();
            failure = Some(CliError::TableNotReported {
                hosts: waiting,
                limit: join_limit,
            });
            break;
        }
        if progress && started.elapsed() > Duration::from_secs(1) {
            to_stderr(&format!(
                "\ratlasboost: hosts joined: {}/{} ({:.0?}, timeout {:.0?})",
                coordinator.joined() + (hosts.len() - remote_index.len()) as u64,
                hosts.len(),
                started.elapsed(),
                args.rendezvous_timeout
            ));
            shown = true;
        }
    }
    if shown {
        to_stderr("\n");
    }
    let coordinator_failure = coordinator.failure();
    let report = coordinator.finish();
    printer.detail(&format!(
        "atlasboost: rendezvous of {} took {} ms ({} foreign frames dropped)",
        counted(hosts.len(), "host"),
        started.elapsed().as_millis(),
        report.dropped
    ));
    if let Some(e) = remote_failure {
        return Err(e);
    }
    if let Some(why) = refusal
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .or(coordinator_failure)
    {
        return Err(CliError::Failure(why));
    }
    if let Some(e) = failure {
        return Err(e);
    }
    let decision = decided
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .ok_or_else(|| CliError::Failure("the rendezvous ended without a table".into()))?;
    finish_join(launch, decision, local_devices, remotes, printer)
}

/// After the decision: the table parsed and checked once, written once for the local hosts
/// (they share this machine's file system; the launcher holds the path's lock).
fn finish_join(
    launch: &Launch<'_>,
    decision: Decision,
    local: Vec<Option<Vec<Device>>>,
    remotes: Vec<Remote>,
    printer: &Printer,
) -> Result<Joined, CliError> {
    for w in &decision.warnings {
        // Shown even with -q: HCCL will say the same, less clearly.
        printer.error(&format!("atlasboost: the rank table: {w}"));
    }
    if local.iter().any(Option::is_some) {
        agent::write_checked(&launch.settings.rank_table, &decision.answer)?;
    }
    printer.detail(&format!(
        "atlasboost: rank table SHA-256 {} ({} bytes; every host checks its copy)",
        decision.answer.sha256,
        decision.answer.table.len()
    ));
    Ok(Joined::Ready(Box::new(JoinedHosts {
        decision,
        local,
        remotes,
    })))
}

/// Reads what the remote sessions said while the launcher waits for them to be ready.
/// Returns the first failure: a session that ended, or an agent that reported one.
fn check_remotes(remotes: &mut [Remote], buf: &mut [u8], printer: &Printer) -> Option<CliError> {
    for r in remotes.iter_mut() {
        while let Some(lines) = r.read_err(buf) {
            if lines.is_empty() {
                break;
            }
            for l in lines {
                printer.detail(&format!("atlasboost: host {}: {l}", r.host));
            }
        }
        match r.read_out(buf) {
            Ok(Some(messages)) => {
                for m in messages {
                    match m {
                        Up::Ready => r.ready = true,
                        Up::Failed { code, message } => {
                            return Some(CliError::Remote {
                                message: about_host(&r.host, &message),
                                code,
                            });
                        }
                        other => r.backlog.push(other),
                    }
                }
            }
            // A fast job may be over on a host before the others are ready: what it said is in
            // the backlog, and the supervisor judges it.
            Ok(None) if r.ready => {}
            Ok(None) => {
                // Drain what ssh said last, for the message.
                while r.read_err(buf).is_some_and(|l| !l.is_empty()) {}
                let what = if r.greeted() {
                    "its agent stopped before the job started"
                } else {
                    "ssh could not start atlasboost agent there"
                };
                return Some(CliError::HostLost {
                    host: r.host.clone(),
                    what,
                    said: r.err_tail(),
                });
            }
            Err(why) => {
                return Some(CliError::Protocol {
                    host: r.host.clone(),
                    why: why.to_string(),
                });
            }
        }
    }
    None
}

/// `host X: message`, unless the message already names the host.
pub(crate) fn about_host(host: &str, message: &str) -> String {
    if message.contains(&format!("host {host}")) {
        message.to_string()
    } else {
        format!("host {host}: {message}")
    }
}

/// Waits until a remote session has something to read, or `timeout`.
fn wait_readable(remotes: &[Remote], timeout: Duration) {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    let mut fds: Vec<PollFd<'_>> = remotes
        .iter()
        .flat_map(|r| r.out.iter().chain(r.err.iter()))
        .map(|fd| PollFd::new(fd.as_fd(), PollFlags::POLLIN))
        .collect();
    let _ = poll(
        &mut fds,
        PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX),
    );
}

/// Every worker of the job, in rank order: local ones with their environment, remote ones
/// (started by their agents) for output and the summary. One pass over the table.
fn plan_workers(launch: &Launch<'_>, joined: &JoinedHosts) -> Result<Vec<WorkerPlan>, CliError> {
    let by_server: HashMap<&str, usize> = launch
        .hosts
        .iter()
        .enumerate()
        .map(|(i, h)| (h.server_id.as_str(), i))
        .collect();
    let remote_devices: HashMap<(&str, u32), u32> = joined
        .decision
        .devices
        .iter()
        .map(|d| ((d.server_id.as_str(), d.physical_id), d.logical_id))
        .collect();
    let mut local_seats: Vec<Vec<atlasboost_core::worker_env::Seat>> =
        launch.hosts.iter().map(|_| Vec::new()).collect();
    let mut workers = Vec::new();
    for seat in atlasboost_core::worker_env::Seat::all(&joined.decision.table)? {
        let Some(&index) = by_server.get(seat.server_id.as_str()) else {
            continue;
        };
        let host = &launch.hosts[index];
        if host.local {
            local_seats[index].push(seat);
            continue;
        }
        let device = remote_devices
            .get(&(seat.server_id.as_str(), seat.physical_id))
            .copied()
            .unwrap_or(seat.physical_id);
        workers.push(WorkerPlan {
            rank: seat.world.rank,
            host: host.describe(),
            device,
            env: Vec::new(),
            local: false,
            cpus: None,
        });
    }
    for (index, seats) in local_seats.into_iter().enumerate() {
        let (Some(devices), false) = (&joined.local[index], seats.is_empty()) else {
            continue;
        };
        let host = &launch.hosts[index];
        let name = host.describe();
        workers.extend(host_workers(
            HostPart {
                server_id: &host.server_id,
                host: &name,
                seats,
                devices,
                answer: &joined.decision.answer,
            },
            launch.settings,
            launch.job_id,
            &|k| std::env::var_os(k).is_some(),
        )?);
    }
    workers.sort_by_key(|w| w.rank);
    debug_assert!(
        workers
            .iter()
            .filter(|w| w.local)
            .all(|w| w.env.iter().any(|(k, _)| k == EnvVars::RANK_TABLE_FILE))
    );
    Ok(workers)
}
