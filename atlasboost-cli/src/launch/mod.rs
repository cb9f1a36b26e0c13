//! `atlasboost run`: plan the hosts, agree on the rank table, start and watch the workers
//! (SPEC §5–§9).
//!
//! The launcher decides the table. Hosts that are this machine (`127.x.y.z`, its own
//! addresses) are probed in-process; hosts on other machines are reached over ssh
//! ([`remote`]) in a tree (`--fanout`): the launcher starts `atlasboost agent` on its
//! children, and each agent on its own ([`agent`]). Every agent probes its devices and reports
//! them up the [`channel`]; the launcher decides once and sends the decision down, compact;
//! every host builds the same JSON from it and checks its SHA-256. Then
//! [`supervise::run_workers`] starts one worker per table entry and watches them to the end.

pub mod agent;
pub mod channel;
pub mod events;
pub mod job;
pub mod lifeline;
pub mod monitor;
pub mod mpi;
pub mod output;
pub mod plan;
pub mod rank_files;
pub mod relay;
pub mod remote;
pub mod slurm;
pub mod ssh_connect;
pub mod status;
pub mod supervise;
pub mod terminal;

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant};

use atlasboost_core::ranktable::{BuildOptions, RankOrder, RankTable};
use atlasboost_core::{Device, EnvVars};
use nix::sys::signal::Signal;

use self::agent::{AgentReport, Decision, HostPart, Shrink, TablePolicy, host_workers};
use self::channel::{AgentConfig, Tree, TreeBelow, TreeHost, Up, WorkerSettings};
use self::events::Events;
use self::job::{
    AttemptRecord, check_before_start, ending_of, host_json, job_logs, job_start_event, lock_table,
    new_job_id, other_startup_vars, other_startup_warning, report, report_attempt, resolve_exports,
    summary_event, worker_dir,
};
use self::lifeline::CgroupWanted;
use self::monitor::{HostMonitor, Metrics, MonitorPlan};
use self::output::{JobLogDir, Output, OutputOptions};
use self::plan::{
    HostPlan, check_np, parse_host_list, parse_hostfile, resolve_hosts, this_machine,
};
use self::rank_files::RankFiles;
use self::remote::{Remote, SshOptions, is_below, top_of};
use self::supervise::{
    HangWatch, JobResult, Keeper, MetricsPlan, Role, RunPlan, Signals, WorkerPlan, run_workers,
};
use crate::commands::counted;
use crate::error::CliError;
use crate::exit::ExitCodes;
use crate::printer::{Printer, to_stderr};
use crate::settings::{DEFAULT_FANOUT, Engine, RunSettings, ServerOrder};

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
        // The relays do not sample devices: nothing to show or serve.
        for (given, flag) in [
            (args.metrics.is_some(), "--metrics"),
            // (`--monitor-interval off` asks for nothing.)
            (
                args.monitor_interval_given && args.monitor_interval.is_some(),
                "--monitor-interval",
            ),
        ] {
            if given {
                return Err(CliError::Usage(format!(
                    "{flag} is not built for --mpi yet; run without --mpi"
                )));
            }
        }
        uses_slurm(args)?;
        return mpi::run_mpi(args, printer);
    }
    let started = Instant::now();
    // Read where ssh starts (the launch tree's agents inherit them): refused now if malformed.
    crate::settings::switch(
        EnvVars::ATLASBOOST_SSH_NODELAY,
        "0: ssh opens its own connections, without TCP_NODELAY",
    )?;
    // Before anything can start a thread (the driver library's initialisers, when it is
    // loaded below, may): every thread must inherit the blocked mask.
    let signals = Signals::block()?;
    let slurm = uses_slurm(args)?;
    // Until the first process starts, a signal ends the launcher at once: reading a hostfile,
    // resolving names or loading the driver may block for long.
    let hosts =
        signals.exit_on_signal_during("reading the hosts", || plan_hosts(args, slurm, printer))?;
    if !slurm {
        check_ssh_identity(args, &hosts)?;
        unused_ssh_options(args, &hosts, printer);
    }
    plan::refuse_this_machine_twice(args, &hosts)?;
    // Refuse what cannot work before anything starts: this machine's probe, if it is one of
    // the hosts (a login node without NPUs launches remote hosts, whose agents probe theirs).
    if let Some(local) = hosts.iter().find(|h| h.local) {
        signals.exit_on_signal_during("loading the device probe", || {
            atlasboost::probe::make_probe(&args.discovery, &local.server_id)
        })?;
    }
    let wdir = worker_dir(args, hosts.iter().any(|h| h.local))?;
    let table_path = wdir.join(&args.rank_table);
    atlasboost_core::worker_env::table_path_text(&table_path)?;
    // What can be checked before any host starts a worker is checked now.
    let known_size = args.np.map(u64::from).or_else(|| {
        hosts
            .iter()
            .map(|h| h.slots.map(u64::from))
            .sum::<Option<u64>>()
    });
    check_before_start(args, known_size)?;
    let exports = resolve_exports(&args.env)?;
    let other_startup = other_startup_vars(&exports);
    if let Some(warning) = other_startup_warning(&other_startup) {
        printer.status(&warning);
    }
    if let (Some(min), Some(size)) = (args.min_np, known_size)
        && u64::from(min) > size
    {
        return Err(CliError::Usage(format!(
            "--min-np {min} is more than the job's {} (a restart never grows the job)",
            counted(size as usize, "rank")
        )));
    }
    if args.metrics.is_some() && args.monitor_interval.is_none() {
        return Err(CliError::Usage(
            "--metrics needs the samples that --monitor-interval off turns off".into(),
        ));
    }
    // The first attempt's local probe, after the usage checks and before any state of the job
    // exists (the driver may retry for seconds).
    let first_local = signals.exit_on_signal_during("probing this machine's devices", || {
        probe_local_hosts(args, &hosts)
    })?;
    let job_id = new_job_id()?;
    // Held to the end of the job, across restarts: no other job replaces this table while
    // the workers run.
    let _table_lock = match hosts.iter().any(|h| h.local) {
        true => Some(lock_table(&table_path, &job_id, None)?),
        false => None,
    };

    // Bound before the events file is opened (or truncated): a port in use ends the launch
    // with nothing of the job written.
    let metrics = match args.metrics {
        Some(address) => {
            let m = Metrics::serve(address, &job_id)?;
            let said = format!("atlasboost: metrics at http://{}/metrics", m.address());
            match address.port() {
                0 => printer.needed(&said),
                _ => printer.status(&said),
            }
            Some(Arc::new(m))
        }
        None => None,
    };
    let events = job::open_events(args.events.as_deref(), &job_id, &signals, printer)?;
    // After the events file, whose FIFO may wait for long: a signal meanwhile ends the
    // launcher, and must leave no empty log directory behind.
    let logs = job_logs(args, &job_id, printer)?;
    job_start_event(
        events.as_ref(),
        args,
        args.np,
        hosts.iter().map(host_json).collect(),
        &table_path,
        metrics.as_ref().map(|m| m.address()),
    );
    let files = RankFiles::create(&job_id)?;
    // Until the guard runs, removing the directory is this process's job.
    let mut lifeline = lifeline::prepare(CgroupWanted::ByDefault(true), None, Some(files.dir()))
        .inspect_err(|_| files.remove())?;
    printer.detail(&format!("atlasboost: {}", lifeline.cgroup_note()));
    let mut job = JobState {
        args,
        slurm,
        hosts: &hosts,
        job_id: &job_id,
        base: WorkerSettings {
            framework: args.framework.to_string(),
            command: args.command.clone(),
            wdir: wdir.clone(),
            rank_table: table_path.clone(),
            env: exports,
            grace_ms: args.grace.as_millis() as u64,
            lost_after_ms: args.host_timeout.as_millis() as u64,
            restart_count: 0,
            max_restarts: args.max_restarts,
            // Heartbeats are read for the watchdog, and for the status block's slowest step
            // (SPEC §13: on a terminal, without -q).
            watch: args.hang_timeout.is_some()
                || std::io::stderr().is_terminal() && !printer.is_quiet(),
            nic: args.nic.as_ref().map(ToString::to_string),
            bind_cores: args.bind_cores,
            monitor_ms: args.monitor_interval.map_or(0, |d| d.as_millis() as u64),
        },
        files: &files,
        logs: logs.as_ref().map(JobLogDir::path),
        events: events.clone(),
        metrics,
        lost: Vec::new(),
        first_size: None,
        first_local: Some(first_local),
        attempts: Vec::new(),
        attempts_started: 0,
        previous_servers: Vec::new(),
    };
    let outcome = run_attempts(&mut job, &signals, &mut lifeline, printer);
    lifeline.close();
    files.remove();
    // Nothing of the job is left: a signal now acts as it would without atlasboost, so that a
    // summary written to a console that takes nothing cannot make the launcher deaf.
    signals.release();
    let outcome = match outcome {
        Ok(o) => o,
        // The first attempt could not go on (a table HCCL would refuse, a command not found):
        // the events still end the attempt and the job, and empty logs go.
        Err(e) => {
            summary_event(
                events.as_ref(),
                e.exit_code(),
                job.attempts_started,
                started.elapsed(),
            );
            if let Some(l) = &logs {
                l.forget_if_nothing_written();
            }
            return Err(e);
        }
    };
    let (result, code) = match outcome {
        Outcome::Ran(result) => {
            let code = result.exit_code;
            (Some(result), code)
        }
        // The signal ends the job, and is its error: the attempt's failure was told already.
        Outcome::Stopped(mut result, s) => {
            result.interrupted = Some(s);
            result.exit_code = 128u8.wrapping_add(s as u8);
            let code = result.exit_code;
            (Some(result), code)
        }
        Outcome::Ended(code) => (None, code),
    };
    // A job that ended before any worker wrote a log leaves no directory behind.
    let written = match &logs {
        Some(l) if !l.forget_if_unused() => Some(l.path()),
        _ => None,
    };
    report(
        result.as_ref(),
        &job.attempts,
        started.elapsed(),
        written,
        printer,
    );
    summary_event(
        events.as_ref(),
        code,
        job.attempts_started,
        started.elapsed(),
    );
    Ok(code)
}

/// The job across its attempts.
struct JobState<'a> {
    args: &'a RunSettings,
    /// The agents are started by srun.
    slurm: bool,
    hosts: &'a [HostPlan],
    job_id: &'a str,
    /// The workers' settings; each attempt sets its restart count.
    base: WorkerSettings,
    files: &'a RankFiles,
    logs: Option<&'a std::path::Path>,
    /// `--events`.
    events: Option<Events>,
    /// `--metrics`.
    metrics: Option<Arc<Metrics>>,
    /// Hosts lost or failed in an attempt, left out for the rest of the job.
    lost: Vec<String>,
    /// The first attempt's world size: no restart grows past it, nor shrinks below it without
    /// `--min-np`.
    first_size: Option<usize>,
    /// The local hosts' reports for the first attempt, probed before the job's state existed.
    first_local: Option<LocalReports>,
    attempts: Vec<AttemptRecord>,
    /// Attempts whose `attempt_start` was written: one stopped while its hosts joined has no
    /// record, but counts in the summary.
    attempts_started: usize,
    /// The server ids of the last attempt's table, which a restart keeps where it can.
    previous_servers: Vec<String>,
}

impl<'a> JobState<'a> {
    /// The hosts not left out.
    fn live_hosts(&self) -> Vec<HostPlan> {
        self.hosts
            .iter()
            .filter(|h| !self.lost.contains(&h.describe()))
            .cloned()
            .collect()
    }

    /// An attempt's launch over `live` hosts, with the restart's bounds after the first.
    fn launch<'b>(&self, live: &'b [HostPlan], settings: &'b WorkerSettings) -> Launch<'b>
    where
        'a: 'b,
    {
        Launch {
            args: self.args,
            slurm: self.slurm,
            hosts: live,
            job_id: self.job_id,
            settings,
            shrink: match self.first_size {
                Some(first) => Some(Shrink {
                    min: self.args.min_np.map_or(first as u64, u64::from),
                    min_given: self.args.min_np.is_some(),
                    max: first as u64,
                    left_out: self.lost.clone(),
                    restart: true,
                    previous: self.previous_servers.clone(),
                }),
                // With --min-np, a first attempt that finds an unhealthy device or a host whose
                // probe fails starts on the largest valid world without them.
                None => self.args.min_np.map(|min| Shrink {
                    min: u64::from(min),
                    min_given: true,
                    max: self.args.np.map_or(u64::MAX, u64::from),
                    left_out: Vec::new(),
                    restart: false,
                    previous: Vec::new(),
                }),
            },
        }
    }
}

/// How the last attempt ended.
enum Outcome {
    /// Its workers ran: their result.
    Ran(JobResult),
    /// Its workers ran (their result), and this signal came before the restart.
    Stopped(JobResult, Signal),
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
        if let Some(e) = &job.events {
            e.borrow_mut().set_attempt(attempt);
        }
        events::emit(job.events.as_ref(), "attempt_start", serde_json::json!({}));
        job.attempts_started += 1;
        let mut settings = job.base.clone();
        settings.restart_count = attempt;
        let mut probed = job.first_local.take();
        // A restart goes on without the hosts lost while joining (unreachable now, an agent
        // that died): each such host is left out and the others join again, as a host whose
        // probe fails is. Bounded: every round leaves one host out at least.
        let (live, joined) = loop {
            let live = job.live_hosts();
            let launch = job.launch(&live, &settings);
            match join(&launch, probed.take(), signals, printer) {
                Err(CliError::HostsLost { hosts, message }) if attempt > 0 => {
                    printer.error(&format!(
                        "atlasboost: leaving {} out of the restart: {message}",
                        hosts.join(", ")
                    ));
                    for host in &hosts {
                        leave_out(job, host, &message);
                    }
                }
                other => break (live, other),
            }
        };
        let launch = job.launch(&live, &settings);
        // The hosts whose probe failed are left out of this attempt, in the events too, when
        // it then cannot go on (its error names them); an attempt that goes on says so below.
        if let Err(CliError::Undecided { unprobed, .. }) = &joined {
            for (host, why) in unprobed {
                host_left_out_event(job, host, why);
            }
        }
        let joined = match joined {
            Ok(Joined::Ready(j)) => j,
            Ok(Joined::Interrupted(s)) => {
                let why = format!("stopped by {} while the hosts were joining", s.as_str());
                printer.status(&format!("atlasboost: {why}"));
                // The attempt began (its events say so): it ends, and is in the summary.
                let code = 128u8.wrapping_add(s as u8);
                record_attempt(job, (attempt, attempt_started, None), why, code);
                return Ok(Outcome::Ended(code));
            }
            // A restart that cannot go on ends the job, naming why; the first attempt's
            // errors are the launch's.
            Err(e) if attempt > 0 => {
                let record = (attempt, attempt_started, None);
                return Ok(end_restart(job, record, &e, printer));
            }
            Err(e) => {
                record_end(job, (attempt, attempt_started, None), &e);
                return Err(e);
            }
        };
        // A host whose probe fails now is left out of this attempt (the next one probes it
        // again), saying so.
        let this_attempt = match attempt {
            0 => "the job",
            _ => "the restart",
        };
        for (host, why) in &joined.decision.unprobed {
            printer.error(&format!(
                "atlasboost: leaving {host} out of {this_attempt}: {why}"
            ));
            host_left_out_event(job, host, why);
        }
        if !joined.decision.left_out.is_empty() {
            printer.error(&format!(
                "atlasboost: {this_attempt} leaves out {}",
                joined.decision.left_out.join(", ")
            ));
        }
        // The hosts have the decision and wait for their workers to start: they hear from
        // the launcher even while it is held writing to its console (the layout below, on a
        // terminal paused with Ctrl-S), until the supervisor keeps them itself.
        let mut keeper = Keeper::start(joined.remotes.iter().map(Remote::commands).collect());
        // After the join, an error of a restart ends the job with a record of the attempt
        // (and the summary of the earlier ones); the first attempt's errors are the launch's.
        // The attempt's layout once its table is decided, for its record if its workers then
        // cannot start.
        let mut decided_layout = None;
        let ran = (|| -> Result<(JobResult, String), CliError> {
            let workers = plan_workers(&launch, &joined)?;
            let beyond: Vec<u32> = args
                .ranks
                .iter()
                .flat_map(|list| {
                    list.ranks
                        .iter()
                        .copied()
                        .filter(|&r| u64::from(r) >= workers.len() as u64)
                })
                .collect();
            if let Some(list) = &args.ranks
                && !beyond.is_empty()
            {
                let why = format!(
                    "--ranks {}: {} {} not in this job of {} (0-{})",
                    list.text,
                    plan::ranks_named(&beyond),
                    match beyond.len() {
                        1 => "is",
                        _ => "are",
                    },
                    counted(workers.len(), "rank"),
                    workers.len() - 1
                );
                // A job that shrank (a restart, or a first attempt planned around a dead NPU
                // with --min-np) shows the ranks it still has.
                let shrunk = attempt > 0
                    || !joined.decision.left_out.is_empty()
                    || !joined.decision.unprobed.is_empty();
                if !shrunk {
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
            decided_layout = Some(layout.clone());
            job.previous_servers = joined
                .decision
                .table
                .ranks()
                .unwrap_or_default()
                .into_iter()
                .map(|r| r.server_id)
                .collect();
            job.previous_servers.dedup();
            events::emit(
                job.events.as_ref(),
                "table",
                serde_json::json!({
                    "path": settings.rank_table.to_string_lossy(),
                    "sha256": joined.decision.answer.sha256,
                    "ranks": workers.len(),
                    "servers": joined.decision.table.server_count(),
                    "layout": layout.trim(),
                    "left_out": joined.decision.left_out,
                    "warnings": joined.decision.warnings,
                }),
            );
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
                    events: job.events.clone(),
                    // SPEC §13: on a terminal only, never in a pipe or a file, never with -q.
                    status: std::io::stderr().is_terminal() && !printer.is_quiet(),
                },
                &workers.iter().map(|w| w.rank).collect::<Vec<_>>(),
            )?;
            let run_plan = RunPlan {
                command: args.command.clone(),
                wdir: settings.wdir.clone(),
                grace: args.grace,
                lost_after: args.host_timeout,
                files: Some(job.files.clone()),
                watch: job.base.watch,
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
                helpers: joined.step.iter().map(slurm::Step::pid).collect(),
                monitor: args.monitor_interval.map(|every| MonitorPlan {
                    every,
                    hosts: local_monitors(&launch, &joined, &workers),
                }),
                metrics: job.metrics.as_ref().map(|server| MetricsPlan {
                    server: Arc::clone(server),
                    job: job.job_id.to_string(),
                    attempt,
                    chips: job_chips(&launch, &joined),
                    physical: joined
                        .decision
                        .table
                        .ranks()
                        .unwrap_or_default()
                        .into_iter()
                        .map(|r| (r.rank, r.physical_id))
                        .collect(),
                }),
                unset_env: other_startup_vars(&settings.env),
            };
            drop(keeper.take());
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
                let record = (attempt, attempt_started, decided_layout);
                return Ok(end_restart(job, record, &e, printer));
            }
            Err(e) => {
                record_end(job, (attempt, attempt_started, decided_layout), &e);
                return Err(e);
            }
        };
        job.attempts.push(AttemptRecord {
            number: attempt,
            layout: Some(layout),
            duration: attempt_started.elapsed(),
            ended: ending_of(&result),
            root_cause: job::recorded_root_cause(&result),
            exit_code: result.exit_code,
        });
        attempt_end_event(job);
        let restartable = result.exit_code != 0
            && result.interrupted.is_none()
            && (result.first_failure.is_some()
                || result.hang.is_some()
                || result
                    .host_failure
                    .as_ref()
                    .is_some_and(|h| h.code == ExitCodes::FAILURE));
        if !restartable || attempt == args.max_restarts {
            // An attempt that would have been restarted: why this one is not.
            if restartable && args.max_restarts > 0 && result.signalled.is_none() {
                printer.status(&format!(
                    "atlasboost: no restart left (--max-restarts {} used): the job ends",
                    args.max_restarts
                ));
            }
            return Ok(Outcome::Ran(result));
        }
        // Ctrl-C (or SIGTERM, SIGHUP) while the failed attempt's workers were being stopped:
        // the job ends there, as it would for one during the restart delay.
        if let Some(s) = result.signalled {
            report_attempt(&result, job.attempts.last(), printer);
            printer.status(&format!(
                "atlasboost: stopped by {} before the restart",
                s.as_str()
            ));
            return Ok(Outcome::Stopped(result, s));
        }
        // Left out for the rest of the job (SPEC §12): hosts lost, whether or not that ended
        // the attempt, and the host whose agent failed it.
        let named = result.host_failure.as_ref().map(|f| f.host.as_str());
        let mut unnamed = Vec::new();
        for host in &result.lost_hosts {
            if leave_out(job, host, "lost") && named != Some(host.as_str()) {
                unnamed.push(host.as_str());
            }
        }
        if let Some(failed) = &result.host_failure {
            leave_out(job, &failed.host, "its agent failed");
        }
        let delay = restart_delay(args.first_restart_delay(), attempt);
        report_attempt(&result, job.attempts.last(), printer);
        // The attempt's end names one host; the others lost with it are named here.
        if !unnamed.is_empty() {
            printer.error(&format!(
                "atlasboost: leaving {} out of the restart: lost during attempt {attempt}",
                unnamed.join(", ")
            ));
        }
        if job.slurm {
            leave_out_unusable_nodes(job, printer);
        }
        // Under -q too: the failure was said, and the job may yet succeed.
        printer.sequel(&format!(
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
            return Ok(Outcome::Stopped(result, s));
        }
    }
    unreachable!("the last attempt returns")
}

/// Leaves `host` (as [`HostPlan::describe`] names it) out of the rest of the job, saying why in
/// the events; whether it was not left out already.
fn leave_out(job: &mut JobState<'_>, host: &str, why: &str) -> bool {
    if job.lost.iter().any(|h| h == host) {
        return false;
    }
    job.lost.push(host.to_string());
    host_left_out_event(job, host, why);
    true
}

/// The `host_left_out` event: `host` takes no part in the attempt (docs/events.md).
fn host_left_out_event(job: &JobState<'_>, host: &str, why: &str) {
    events::emit(
        job.events.as_ref(),
        "host_left_out",
        serde_json::json!({ "host": host, "why": why }),
    );
}

/// Under Slurm, a restart also leaves out the nodes Slurm says not to use now: drained (by a
/// health check that found a faulty NPU, or by an administrator), down, failing or not
/// responding. srun would refuse a node that is gone, and a drained one would meet its fault
/// again. When Slurm cannot be asked, the restart goes on without the answer, saying so.
fn leave_out_unusable_nodes(job: &mut JobState<'_>, printer: &Printer) {
    let live = job.live_hosts();
    let names: Vec<String> = live.iter().map(|h| h.name.clone()).collect();
    match slurm::unusable_nodes(&names) {
        Ok(nodes) => {
            for node in nodes {
                let Some(host) = live.iter().find(|h| h.name == node.name) else {
                    continue;
                };
                let why = format!("Slurm says {node}");
                printer.error(&format!(
                    "atlasboost: leaving {} out of the restart: {why}",
                    host.describe()
                ));
                leave_out(job, &host.describe(), &why);
            }
        }
        Err(why) => printer.error(&format!(
            "atlasboost: warning: cannot ask Slurm which nodes are drained or down ({why}); \
             the restart leaves out only the hosts that were lost"
        )),
    }
}

/// A restart that cannot go on ends the job: the error is said, and recorded as the end of
/// attempt `number`, begun at `started`, with its layout if its table was decided (the summary
/// lists every attempt).
fn end_restart(
    job: &mut JobState<'_>,
    (number, started, layout): (u32, Instant, Option<String>),
    e: &CliError,
    printer: &Printer,
) -> Outcome {
    printer.error(&format!(
        "error: {}",
        atlasboost_core::exchange::error_chain(e)
    ));
    record_end(job, (number, started, layout), e);
    Outcome::Ended(e.exit_code())
}

/// Records attempt `number`, begun at `started`, as ended by `e` (with its layout if its table
/// was decided), and says so in the events.
fn record_end(job: &mut JobState<'_>, attempt: (u32, Instant, Option<String>), e: &CliError) {
    let ended = atlasboost_core::exchange::error_chain(e);
    record_attempt(job, attempt, ended, e.exit_code());
}

/// Records attempt `number`, begun at `started`, as `ended` with exit code `code` (with its
/// layout if its table was decided), and says so in the events.
fn record_attempt(
    job: &mut JobState<'_>,
    (number, started, layout): (u32, Instant, Option<String>),
    ended: String,
    exit_code: u8,
) {
    job.attempts.push(AttemptRecord {
        number,
        layout,
        duration: started.elapsed(),
        ended,
        root_cause: None,
        exit_code,
    });
    attempt_end_event(job);
}

/// The `attempt_end` event of the job's last attempt.
fn attempt_end_event(job: &JobState<'_>) {
    if let Some(a) = job.attempts.last() {
        job::attempt_end_event(job.events.as_ref(), a);
    }
}

/// The longest wait the doubling reaches before a restart (unless the first is longer).
const MAX_RESTART_DELAY: Duration = Duration::from_secs(30);

/// The wait before restart `attempt + 1`: a storm of restarts is bounded, so the delay doubles
/// with each, up to 30 s; a longer `--restart-delay` is the user's, kept as given.
fn restart_delay(first: Duration, attempt: u32) -> Duration {
    first
        .saturating_mul(1u32 << attempt.min(16))
        .min(MAX_RESTART_DELAY.max(first))
}

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

/// The local hosts the launcher samples itself: their job devices, and their telemetry; and
/// a host the job left out whole because of its unusable devices, for their health (an alert
/// on a dead NPU does not end because a restart planned around its host).
fn local_monitors(
    launch: &Launch<'_>,
    joined: &JoinedHosts,
    workers: &[WorkerPlan],
) -> Vec<HostMonitor> {
    launch
        .hosts
        .iter()
        .zip(&joined.local)
        .filter_map(|(host, devices)| {
            let devices = devices.as_ref()?;
            let name = host.describe();
            let mine: Vec<WorkerPlan> =
                workers.iter().filter(|w| w.host == name).cloned().collect();
            let monitor = HostMonitor::new(
                name,
                devices,
                |d| mine.iter().any(|w| w.device == d),
                Arc::from(atlasboost::probe::telemetry_of(
                    &launch.args.discovery,
                    &host.server_id,
                )),
            );
            (!monitor.devices.is_empty()).then_some(monitor)
        })
        .collect()
}

/// The chip of every job device, by (host, physical id), for `--metrics`' `model_name`.
fn job_chips(launch: &Launch<'_>, joined: &JoinedHosts) -> HashMap<(String, u32), String> {
    let names: HashMap<&str, String> = launch
        .hosts
        .iter()
        .map(|h| (h.server_id.as_str(), h.describe()))
        .collect();
    let mut chips: HashMap<(String, u32), String> = joined
        .decision
        .devices
        .iter()
        .filter_map(|d| {
            let host = names.get(d.server_id.as_str())?;
            Some(((host.clone(), d.physical_id), d.chip.clone()))
        })
        .collect();
    // A local host's devices outside the job (a host left out whole) as its probe found them.
    for (host, devices) in launch.hosts.iter().zip(&joined.local) {
        for d in devices.iter().flatten() {
            chips
                .entry((host.describe(), d.physical_id))
                .or_insert_with(|| d.chip.clone());
        }
    }
    chips
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
    /// The agents are started by srun.
    slurm: bool,
    hosts: &'a [HostPlan],
    job_id: &'a str,
    settings: &'a WorkerSettings,
    /// A restart's re-planning bounds; `None` for the first attempt.
    shrink: Option<Shrink>,
}

/// Whether the agents are started by srun (SPEC §14): `--launcher slurm`, or `auto` inside an
/// allocation without `-H`/`--hostfile`.
///
/// # Errors
///
/// [`CliError::Usage`] for `--launcher slurm` outside an allocation, or with `--mpi`.
fn uses_slurm(args: &RunSettings) -> Result<bool, CliError> {
    let inside = slurm::in_allocation(&slurm::process_env);
    let listed = args.hosts.is_some() || args.hostfile.is_some();
    match args.launcher {
        Engine::Ssh => Ok(false),
        Engine::Auto => Ok(inside && !listed && !args.mpi),
        Engine::Slurm if args.mpi => Err(CliError::Usage(
            "--launcher slurm starts atlasboost's agents; --mpi starts mpirun, which finds the \
             allocation itself: drop one of them"
                .into(),
        )),
        Engine::Slurm if !inside => Err(CliError::Usage(
            "--launcher slurm needs a Slurm allocation (SLURM_JOB_ID is not set): run inside \
             salloc or sbatch"
                .into(),
        )),
        Engine::Slurm => Ok(true),
    }
    .and_then(|slurm| refuse_ssh_options(args, slurm).map(|()| slurm))
}

/// Options of atlasboost's own ssh sessions are refused, never ignored, when atlasboost opens
/// none: under `--mpi` (mpirun reaches the hosts itself) and when srun starts the agents.
fn refuse_ssh_options(args: &RunSettings, slurm: bool) -> Result<(), CliError> {
    let given = [
        (args.fanout.is_some(), "--fanout"),
        (args.ssh_port.is_some(), "--ssh-port"),
        (args.ssh_identity.is_some(), "--ssh-identity"),
    ];
    let Some((_, flag)) = given.iter().find(|(given, _)| *given) else {
        return Ok(());
    };
    match (args.mpi, slurm) {
        (true, _) => Err(CliError::Usage(format!(
            "{flag} cannot be used with --mpi: mpirun starts the workers, reaching the hosts \
             itself"
        ))),
        (false, true) => Err(CliError::Usage(format!(
            "{flag} applies to atlasboost's ssh sessions, and this launch opens none: srun \
             starts the agents (inside a Slurm allocation; --launcher ssh uses ssh instead)"
        ))),
        (false, false) => Ok(()),
    }
}

/// Options of the ssh sessions, given to a launch that opens none (every host is this
/// machine): said, not silently ignored (a script may pass them to every launch).
fn unused_ssh_options(args: &RunSettings, hosts: &[HostPlan], printer: &Printer) {
    if args.mpi || hosts.iter().any(|h| !h.local) {
        return;
    }
    let given: Vec<&str> = [
        (args.fanout.is_some(), "--fanout"),
        (args.ssh_port.is_some(), "--ssh-port"),
        (args.ssh_identity.is_some(), "--ssh-identity"),
        (args.remote_atlasboost.is_some(), "--remote-atlasboost"),
        (args.host_timeout_given, "--host-timeout"),
    ]
    .into_iter()
    .filter_map(|(given, flag)| given.then_some(flag))
    .collect();
    if !given.is_empty() {
        printer.status(&format!(
            "atlasboost: {} unused: every host is this machine, reached without ssh",
            given.join(", ")
        ));
    }
}

/// `--ssh-identity` is a file this launcher can read, when it opens ssh sessions: ssh only
/// warns of one it cannot (not at all with `LogLevel ERROR`) and goes on with other keys. A
/// leading `~/` is the home directory, as ssh reads it.
fn check_ssh_identity(args: &RunSettings, hosts: &[HostPlan]) -> Result<(), CliError> {
    let Some(key) = &args.ssh_identity else {
        return Ok(());
    };
    if hosts.iter().all(|h| h.local) {
        return Ok(());
    }
    // Where ssh reads it here (`~` is the account's home); looked at before it is opened:
    // opening a FIFO would wait for a writer.
    let path = crate::settings::as_ssh_expands_it(key);
    let problem = match std::fs::metadata(&path).map(|m| m.is_file()) {
        Ok(true) => match std::fs::File::open(&path) {
            Ok(_) => return Ok(()),
            Err(e) => e.to_string(),
        },
        Ok(false) => "not a file".to_string(),
        Err(e) => e.to_string(),
    };
    // A file that cannot be used is bad input (125), as every file a flag names.
    Err(CliError::Failure(format!(
        "--ssh-identity {}: {problem}",
        key.display()
    )))
}

/// The hosts of a launch under Slurm: the allocation's (or those of -H/--hostfile, as Slurm
/// names its nodes), with the addresses Slurm reaches them at as server ids. Every host is
/// reached through the step, this machine too (its workers then run in the step, under
/// Slurm's accounting, like the others').
///
/// A node Slurm says not to use (drained since the allocation gave it, by a health check or an
/// administrator; down; no longer Slurm's) is named with Slurm's state and reason. Its workers
/// start all the same, as srun would start them: the job keeps the size it was given, and a
/// restart leaves the node out.
fn slurm_hosts(args: &RunSettings, printer: &Printer) -> Result<Vec<HostPlan>, CliError> {
    let specs = match (&args.hosts, &args.hostfile) {
        (Some(list), _) => parse_host_list(list)?,
        (None, Some(file)) => parse_hostfile(file)?,
        (None, None) => slurm::allocation_hosts(&slurm::process_env)?,
    };
    // srun starts agents only on the allocation's nodes: a host it does not hold is named
    // here, not by srun's "Requested node configuration is not available".
    if (args.hosts.is_some() || args.hostfile.is_some())
        && let Some(nodes) = slurm::allocation_node_names(&slurm::process_env)?
        && let Some(stranger) = specs.iter().find(|s| !nodes.contains(&s.name))
    {
        let job = slurm::process_env(EnvVars::SLURM_JOB_ID).unwrap_or_default();
        return Err(CliError::Usage(format!(
            "host {:?} ({}) is not a node of Slurm job {job} ({}): srun starts the agents, on \
             the allocation's nodes only (name them as Slurm does, or pass --launcher ssh)",
            stranger.name,
            stranger.origin,
            atlasboost_core::slurm::compress_hostlist(&nodes)
        )));
    }
    let names: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
    let nodes = slurm::nodes_at_start(&names)?;
    for node in &nodes.unusable {
        printer.error(&format!(
            "atlasboost: warning: Slurm says {node}; the launch goes on with the nodes the \
             allocation gave{}",
            match args.max_restarts {
                0 => "",
                _ => " (a restart leaves it out)",
            }
        ));
    }
    let mut seen: HashMap<std::net::Ipv4Addr, &str> = HashMap::new();
    let mut hosts = Vec::with_capacity(specs.len());
    for (spec, ip) in specs.iter().zip(nodes.addresses) {
        if let Some(first) = seen.insert(ip, &spec.name) {
            return Err(CliError::Usage(format!(
                "Slurm nodes {first:?} and {:?} ({}) have the same address, {ip}; list each \
                 server once",
                spec.name, spec.origin
            )));
        }
        hosts.push(HostPlan {
            name: spec.name.clone(),
            server_id: ip.to_string(),
            slots: spec.slots,
            local: false,
        });
    }
    Ok(hosts)
}

fn plan_hosts(
    args: &RunSettings,
    slurm: bool,
    printer: &Printer,
) -> Result<Vec<HostPlan>, CliError> {
    let mut hosts = match (&args.hosts, &args.hostfile) {
        _ if slurm => slurm_hosts(args, printer)?,
        (Some(list), _) => resolve_hosts(&parse_host_list(list)?)?,
        (None, Some(file)) => resolve_hosts(&parse_hostfile(file)?)?,
        (None, None) => vec![this_machine(args.nic.as_ref())?],
    };
    check_np(&hosts, args.np)?;
    // Tests reach this machine's own addresses over ssh, as if they were other machines.
    let all_over_ssh = crate::settings::switch(
        EnvVars::ATLASBOOST_SSH_ALL_HOSTS,
        "1: this machine's own addresses are reached over ssh too",
    )?;
    if all_over_ssh == Some(true) {
        for h in &mut hosts {
            h.local = false;
        }
    }
    reachable_by_the_others(&mut hosts, args.nic.as_ref(), printer)?;
    Ok(hosts)
}

/// This machine named by a loopback address (`-H $(hostname):8,node2:8` where the name
/// resolves to 127.0.1.1, as Debian's /etc/hosts has it) beside hosts of other machines: they
/// could reach neither its `server_id` nor a `MASTER_ADDR` there. It takes this machine's
/// address toward them instead (`--nic`'s, else the one on the route to the first of them),
/// and the launcher says so.
///
/// # Errors
///
/// [`CliError::Usage`] when no such address is found, or when it is another host's.
fn reachable_by_the_others(
    hosts: &mut [HostPlan],
    nic: Option<&atlasboost::host::NicChoice>,
    printer: &Printer,
) -> Result<(), CliError> {
    let loopback = |h: &HostPlan| {
        h.server_id
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
    };
    let Some(other) = hosts.iter().find(|h| !h.local && !loopback(h)).cloned() else {
        return Ok(());
    };
    // Looked up once: every host's HCCL_IF_IP and this machine's address come from --nic, and
    // a loopback one reaches no other host.
    let from_nic = nic.map(|choice| (choice, atlasboost::host::find_nic(choice)));
    if let Some((choice, Ok(n))) = &from_nic
        && n.ipv4.is_loopback()
    {
        return Err(CliError::Usage(format!(
            "--nic {choice} is a loopback interface ({}), which host {} cannot reach: choose \
             the interface of the job's network",
            n.ipv4,
            other.describe()
        )));
    }
    let mut by_loopback = hosts
        .iter()
        .enumerate()
        .filter(|(_, h)| h.local && loopback(h))
        .map(|(i, _)| i);
    let Some(at) = by_loopback.next() else {
        return Ok(());
    };
    let here = hosts[at].describe();
    if let Some(again) = by_loopback.next() {
        return Err(CliError::Usage(format!(
            "hosts {here} and {} are both this machine by loopback addresses, which host {} \
             cannot reach, and this machine has one address toward it: list it once, by that \
             address or name",
            hosts[again].describe(),
            other.describe()
        )));
    }
    let toward = match &from_nic {
        Some((choice, found)) => found
            .as_ref()
            .map(|n| n.ipv4)
            .map_err(|error| format!("--nic {choice}: {error}")),
        None => route_toward(&other.server_id)
            .map_err(|why| format!("no address toward host {}: {why}", other.describe())),
    }
    .map_err(|why| {
        CliError::Usage(format!(
            "host {here} is this machine by a loopback address, which host {} cannot reach, \
             and {why}; name this machine by an address the other hosts reach",
            other.describe()
        ))
    })?;
    let address = toward.to_string();
    if let Some(twice) = hosts.iter().find(|h| h.server_id == address) {
        return Err(CliError::Usage(format!(
            "host {here} is this machine by a loopback address, and host {} names it too, by \
             its address toward the other hosts: list each server once",
            twice.describe()
        )));
    }
    let chosen = match nic {
        Some(choice) => format!("its address on --nic {choice}"),
        None => format!("this machine's address toward host {}", other.describe()),
    };
    printer.status(&format!(
        "atlasboost: host {here} is this machine by a loopback address, which the other hosts \
         cannot reach; it is {address} in the table ({chosen})"
    ));
    hosts[at].server_id = address;
    Ok(())
}

/// This machine's address on the route to `host` (an IPv4 address), not loopback.
fn route_toward(host: &str) -> Result<std::net::Ipv4Addr, String> {
    let target: std::net::IpAddr = host
        .parse()
        .map_err(|_| format!("{host:?} is not an address"))?;
    match atlasboost::host::address_toward(target).map_err(|e| e.to_string())? {
        std::net::IpAddr::V4(ip) if !ip.is_loopback() => Ok(ip),
        ip => Err(format!("the route leaves from {ip}")),
    }
}

/// The launcher's variables that remote workers receive too (SPEC §9), but for those of
/// another way of starting (`-x` still sends them).
fn forwarded_env() -> Vec<(OsString, OsString)> {
    std::env::vars_os()
        .filter(|(k, _)| {
            k.to_str().is_some_and(|k| {
                (EnvVars::FORWARDED.contains(&k)
                    || EnvVars::FORWARDED_PREFIXES.iter().any(|p| k.starts_with(p)))
                    && !EnvVars::OTHER_STARTUP.contains(&k)
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
    /// The srun step of the agents (`--launcher slurm`): ended after the sessions are.
    step: Option<slurm::Step>,
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
            chip: args.chip,
        },
        shrink: launch.shrink.clone(),
    }
}

/// Step 1: the launch tree's sessions: the launcher starts the agents of its `--fanout`
/// children over ssh, and each agent those of its own (SPEC §14). Returns one [`Remote`] per
/// remote host, by position in the tree (remote host `i` is host `remote_index[i]`): a session
/// for the launcher's children, a host heard through its ancestors for the others.
fn start_remote_agents(
    launch: &Launch<'_>,
    remote_index: &[usize],
    tree: Tree,
    printer: &Printer,
) -> Result<Vec<Remote>, CliError> {
    let root = root_config(launch, remote_index, tree)?;
    // How ssh reaches each of the launcher's children (positions 0..fanout).
    let names: Vec<&str> = tree
        .children(None)
        .map(|position| root.tree.hosts[position].name.as_str())
        .collect();
    let connects = ssh_connect::plan(&names, &root.tree.ssh);
    let mut remotes = Vec::with_capacity(remote_index.len());
    for (position, host) in root.tree.hosts.iter().enumerate() {
        match tree.parent(position) {
            Some(parent) => remotes.push(Remote::below(&host.host, parent)),
            None => {
                let connect = &connects[position];
                printer.detail(&connect.describe(&host.host));
                remotes.push(Remote::start(
                    &host.name,
                    &host.host,
                    &root.tree.ssh,
                    connect,
                    &agent::child_config(&root, host),
                )?);
            }
        }
    }
    Ok(remotes)
}

/// The remote hosts under Slurm (SPEC §14): one srun step starts every agent (Slurm's own
/// tree fans out), and each connects back to the launcher, which then sends it its
/// configuration. Returns the hosts, awaited until their agents connect, and the step.
fn start_slurm_step(
    launch: &Launch<'_>,
    remote_index: &[usize],
    printer: &Printer,
) -> Result<(Vec<Remote>, AgentConfig, slurm::Step), CliError> {
    // Flat: every agent is the launcher's child, none starts another.
    let tree = Tree {
        size: remote_index.len(),
        fanout: remote_index.len().max(1),
    };
    let root = root_config(launch, remote_index, tree)?;
    let nodes: Vec<String> = root.tree.hosts.iter().map(|h| h.name.clone()).collect();
    // The agents connect back at this machine's --nic address, or else where srun was started
    // from (srun gives its tasks SLURM_LAUNCH_NODE_IPADDR). A launcher outside the nodes'
    // network (a login node without the RoCE or InfiniBand network they share) is reached
    // there: --nic is the nodes' interface, and each node's agent checks its own.
    let address = match &launch.args.nic {
        Some(choice) => match atlasboost::host::find_nic(choice) {
            Ok(nic) => Some(std::net::IpAddr::V4(nic.ipv4)),
            Err(error) => {
                printer.detail(&format!(
                    "atlasboost: this machine has no --nic {choice} ({error}); the nodes \
                     connect back to it where srun runs ({})",
                    EnvVars::SLURM_LAUNCH_NODE_IPADDR
                ));
                None
            }
        },
        None => None,
    };
    let step = slurm::Step::start(&slurm::StepPlan {
        nodes: &nodes,
        atlasboost: &root.tree.ssh.remote_atlasboost,
        address,
        job_id: launch.job_id,
        verbose: printer.is_verbose(),
    })?;
    let remotes = root
        .tree
        .hosts
        .iter()
        .map(|h| Remote::awaited(&h.host))
        .collect();
    Ok((remotes, root, step))
}

/// The launcher as the root of the launch tree: its children's configurations are built from
/// it as any agent builds its children's.
fn root_config(
    launch: &Launch<'_>,
    remote_index: &[usize],
    tree: Tree,
) -> Result<AgentConfig, CliError> {
    let (args, hosts) = (launch.args, launch.hosts);
    let ssh = SshOptions {
        port: args.ssh_port,
        identity: args.ssh_identity.clone(),
        remote_atlasboost: match &args.remote_atlasboost {
            Some(p) => vec![p.clone().into_os_string()],
            None => crate::self_command()?,
        },
        extra: std::env::var_os(EnvVars::ATLASBOOST_SSH_OPTIONS)
            .map(|o| {
                o.to_string_lossy()
                    .split_whitespace()
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default(),
        server_alive_secs: SshOptions::server_alive_for(args.host_timeout),
    };
    let mut remote_settings = launch.settings.clone();
    remote_settings.env = forwarded_env();
    remote_settings
        .env
        .extend(launch.settings.env.iter().cloned());
    let tree_hosts: Vec<TreeHost> = remote_index
        .iter()
        .enumerate()
        .map(|(position, &i)| TreeHost {
            position,
            name: hosts[i].name.clone(),
            host: hosts[i].describe(),
            server_id: hosts[i].server_id.clone(),
        })
        .collect();
    Ok(AgentConfig {
        position: usize::MAX,
        server_id: String::new(),
        host: String::new(),
        launcher: atlasboost_core::host_name(),
        // Remote agents inject this launcher's simulated faults (tests' hosts over ssh).
        discovery: args.discovery.clone().with_sim_faults_of_env(),
        job_id: launch.job_id.to_string(),
        timeout_ms: (args.rendezvous_timeout + AGENT_SLACK).as_millis() as u64,
        workers: remote_settings,
        tree: TreeBelow {
            fanout: tree.fanout,
            size: tree.size,
            hosts: tree_hosts,
            ssh,
        },
    })
}

/// The local hosts' reports and their devices, by host index (`None` for a remote host).
type LocalReports = (Vec<Option<AgentReport>>, Vec<Option<Vec<Device>>>);

/// Step 0: the local hosts' reports, made here: every local host is this machine, so there
/// is no rendezvous, one decision, one table in memory and one write for all of them.
fn probe_local_hosts(args: &RunSettings, hosts: &[HostPlan]) -> Result<LocalReports, CliError> {
    let mut reports: Vec<Option<AgentReport>> = hosts.iter().map(|_| None).collect();
    let mut devices: Vec<Option<Vec<Device>>> = hosts.iter().map(|_| None).collect();
    for (index, host) in hosts.iter().enumerate().filter(|(_, h)| h.local) {
        let (report, found) =
            agent::host_report(&args.discovery, &host.server_id, args.nic.as_ref())?;
        reports[index] = Some(report);
        devices[index] = Some(found.unwrap_or_default());
    }
    Ok((reports, devices))
}

/// A restart's probe of the local hosts, which may take as long as the driver retries (seconds,
/// right after a device failed): run on a thread of its own, so that Ctrl-C (SIGTERM, SIGHUP)
/// meanwhile ends the job at once, before any worker starts. A probe that was left behind
/// ends with the launcher.
fn probe_local_hosts_or_signal(
    args: &RunSettings,
    hosts: &[HostPlan],
    signals: &Signals,
) -> Result<Result<LocalReports, CliError>, Signal> {
    if !hosts.iter().any(|h| h.local) {
        return Ok(probe_local_hosts(args, hosts));
    }
    let (args, hosts) = (args.clone(), hosts.to_vec());
    let (done, result) = std::sync::mpsc::channel();
    let probing = std::thread::Builder::new()
        .name("ab-probe".into())
        .spawn(move || {
            let _ = done.send(probe_local_hosts(&args, &hosts));
        });
    if let Err(e) = probing {
        return Ok(Err(CliError::system("start the probe's thread")(e)));
    }
    loop {
        if let Some(s) = signals
            .pending()
            .into_iter()
            .find(|s| *s != Signal::SIGCHLD)
        {
            return Err(s);
        }
        match result.recv_timeout(Duration::from_millis(20)) {
            Ok(probed) => return Ok(probed),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Ok(Err(CliError::Failure(
                    "the probe of this machine's devices ended without an answer".into(),
                )));
            }
        }
    }
}

/// Probes the local hosts, starts the launch tree over ssh (when there are remote hosts),
/// gathers every host's report up the tree, decides the table once, sends the decision down
/// in its compact form, and waits until every remote host has built and written the table;
/// then writes it once for the local hosts.
///
/// `probed`: the local hosts' reports when they were probed already (the first attempt's).
fn join(
    launch: &Launch<'_>,
    probed: Option<LocalReports>,
    signals: &Signals,
    printer: &Printer,
) -> Result<Joined, CliError> {
    let (args, hosts) = (launch.args, launch.hosts);
    let started = Instant::now();
    let (mut reports, local_devices) = match probed {
        Some(reports) => reports,
        None => match probe_local_hosts_or_signal(args, hosts, signals) {
            Ok(reports) => reports?,
            Err(s) => return Ok(Joined::Interrupted(s)),
        },
    };
    let remote_index: Vec<usize> = (0..hosts.len()).filter(|&i| !hosts[i].local).collect();
    if remote_index.is_empty() {
        // Every host is this machine: the launcher decides at once.
        let decision = agent::decide(
            &table_policy(launch),
            reports.into_iter().flatten().collect(),
        )?;
        printer.detail("atlasboost: every host is this machine: no rendezvous");
        printer.detail(&format!(
            "atlasboost: {} probed and decided in {} ms",
            counted(hosts.len(), "local host"),
            started.elapsed().as_millis()
        ));
        return finish_join(launch, decision, local_devices, Vec::new(), printer);
    }
    let tree = Tree {
        size: remote_index.len(),
        fanout: args.fanout.unwrap_or(DEFAULT_FANOUT),
    };
    let (mut remotes, mut step) = match launch.slurm {
        true => {
            let (remotes, root, step) = start_slurm_step(launch, &remote_index, printer)?;
            printer.detail(&format!(
                "atlasboost: Slurm step of {}: srun starts their agents, which connect back",
                counted(remotes.len(), "host")
            ));
            (remotes, Some((step, root)))
        }
        false => {
            printer.detail(&format!(
                "atlasboost: launch tree of {} (fanout {}): the launcher opens {}",
                counted(tree.size, "remote host"),
                tree.fanout,
                counted(tree.children(None).len(), "ssh session")
            ));
            (
                start_remote_agents(launch, &remote_index, tree, printer)?,
                None,
            )
        }
    };

    let progress = std::io::stderr().is_terminal() && !printer.is_quiet();
    let join_limit = args.rendezvous_timeout + AGENT_SLACK + AGENT_SLACK;
    let mut shown = false;
    let mut decision: Option<Decision> = None;
    let mut last_beat = Instant::now();
    let mut buf = vec![0u8; 1 << 16];
    // Hosts lost so far, gathered for a moment after the first, so that the error names every
    // host that is out of reach now (and a restart leaves them all out at once).
    let mut lost: Option<(LostHosts, Instant)> = None;
    // Hosts whose agent failed (a missing --wdir, a --nic they lack), gathered likewise: the
    // same mistake is often every host's, and the error names them all.
    let mut failed: Option<(FailedHosts, Instant)> = None;
    let result = loop {
        if let Some(s) = signals
            .pending()
            .into_iter()
            .find(|s| *s != Signal::SIGCHLD)
        {
            break Ok(Some(s));
        }
        if lost
            .as_ref()
            .is_some_and(|(_, until)| Instant::now() >= *until)
            && let Some((l, _)) = lost.take()
        {
            break Err(l.error());
        }
        // Every remote host has reported (or, once the decision is out, is ready), failed or
        // been lost: nothing more is coming.
        let all_heard = remotes.iter().enumerate().all(|(position, r)| {
            r.lost.is_some()
                || match decision {
                    Some(_) => r.ready,
                    None => reports[remote_index[position]].is_some(),
                }
        });
        // The failures are the error, not a loss after them (its consequence, as when srun
        // ends the step once one agent failed).
        if failed
            .as_ref()
            .is_some_and(|(_, until)| Instant::now() >= *until || all_heard)
            && let Some((f, _)) = failed.take()
        {
            break Err(f.error());
        }
        if decision.is_some() && remotes.iter().all(|r| r.ready) {
            break Ok(None);
        }
        if let Some((step, root)) = &mut step
            && let Err(e) = admit_agents(step, root, &mut remotes, printer)
        {
            break Err(e);
        }
        let heard = check_remotes(&mut remotes, &mut buf, printer);
        let mut garbled = None;
        for (position, bytes) in heard.reports {
            let index = remote_index[position];
            match agent::decode_report(&bytes, &hosts[index].describe()) {
                Ok(report) => reports[index] = Some(report),
                Err(why) => garbled = Some(CliError::Failure(why)),
            }
        }
        let mut other = None;
        for failure in heard.failures.into_iter().chain(garbled) {
            match failure {
                CliError::HostsLost { hosts, message } => {
                    let (all, _) = lost.get_or_insert_with(|| {
                        (LostHosts::default(), Instant::now() + MORE_LOST_WAIT)
                    });
                    all.hosts.extend(hosts);
                    all.messages.push(message);
                }
                CliError::Remote { message, code } => {
                    let (all, _) = failed.get_or_insert_with(|| {
                        (
                            FailedHosts {
                                messages: Vec::new(),
                                code,
                            },
                            Instant::now() + MORE_LOST_WAIT,
                        )
                    });
                    all.messages.push(message);
                }
                e => {
                    other.get_or_insert(e);
                }
            }
        }
        if let Some(e) = other {
            break Err(lost.take().map_or(e, |(l, _)| l.error()));
        }
        // With a host lost or failed, the join cannot succeed: it only listens for more such
        // news.
        if lost.is_none()
            && failed.is_none()
            && decision.is_none()
            && reports.iter().all(Option::is_some)
        {
            let decided = match agent::decide(
                &table_policy(launch),
                reports.iter_mut().filter_map(Option::take).collect(),
            ) {
                Ok(d) => d,
                Err(why) => break Err(why.into()),
            };
            let compact = agent::encode_decision(&decided);
            let message = channel::decision_message(&compact);
            for r in remotes.iter_mut().filter(|r| r.parent.is_none()) {
                r.send_lines(&message);
            }
            printer.detail(&format!(
                "atlasboost: every host reported in {} ms; the decision ({} bytes, for a \
                 {}-byte table) went down to {}",
                started.elapsed().as_millis(),
                compact.len(),
                decided.answer.table.len(),
                counted(tree.children(None).len(), "host")
            ));
            decision = Some(decided);
        }
        // Once the decision is out, hosts that are ready wait for the others: they hear from the
        // launcher meanwhile, as they will once their workers run.
        if decision.is_some() && last_beat.elapsed() >= channel::HEARTBEAT {
            last_beat = Instant::now();
            for r in remotes.iter_mut().filter(|r| r.parent.is_none()) {
                r.send(channel::Down::Heartbeat);
            }
        }
        // Only remote hosts to hear from: wait on their output, not on a clock.
        let door = step.as_ref().map(|(s, _)| s.fds()).unwrap_or_default();
        wait_readable(&remotes, &door, Duration::from_millis(20));
        if decision.is_none() && started.elapsed() > args.rendezvous_timeout {
            let missing: Vec<String> = remote_index
                .iter()
                .filter(|&&i| reports[i].is_none())
                .map(|&i| hosts[i].describe())
                .collect();
            // What the hosts that never reported said on stderr (ssh's words, the remote
            // shell's, the agent's): often why.
            let said: Vec<String> = remote_index
                .iter()
                .zip(&remotes)
                .filter(|&(&i, _)| reports[i].is_none())
                .filter_map(|(&i, r)| {
                    Some(format!("{} said: {}", hosts[i].describe(), r.err_said()?))
                })
                .collect();
            // Hosts whose own ssh never started the agent (connecting, logging in): "no
            // report from its agent" would suggest an agent that started and went quiet.
            let not_started: Vec<String> = remote_index
                .iter()
                .zip(&remotes)
                .filter(|&(&i, r)| reports[i].is_none() && r.pid().is_some() && !r.greeted())
                .map(|(&i, _)| {
                    format!(
                        "{}: atlasboost's agent there never greeted (ssh still connecting or \
                         logging in, or the remote command stuck before starting it)",
                        hosts[i].describe()
                    )
                })
                .collect();
            let unconnected = remotes.iter().filter(|r| r.is_awaited()).count();
            // The silent hosts whose parent in the launch tree reported (indices into
            // `remotes`): the others were reached through one of them.
            let silent = |k: usize| reports[remote_index[k]].is_none();
            let tops: Vec<usize> = (0..remotes.len())
                .filter(|&k| silent(k) && remotes[k].parent.is_none_or(|p| !silent(p)))
                .collect();
            let silent_tops: Vec<String> = tops
                .iter()
                .map(|&t| hosts[remote_index[t]].describe())
                .collect();
            // The silent hosts reached through a silent host of the launch tree: that one is
            // the place to look.
            let through: Vec<String> = tops
                .iter()
                .filter_map(|&t| {
                    let below: Vec<String> = (0..remotes.len())
                        .filter(|&k| silent(k) && is_below(&remotes, k, t))
                        .map(|k| hosts[remote_index[k]].describe())
                        .collect();
                    let top = hosts[remote_index[t]].describe();
                    (!below.is_empty()).then(|| {
                        format!(
                            "{} {} reached through {top} in the launch tree (--fanout): look at \
                             {top} first",
                            below.join(", "),
                            if below.len() == 1 { "is" } else { "are" },
                        )
                    })
                })
                .collect();
            // Hosts lost meanwhile are why, first: the others may wait on them.
            if let Some((l, _)) = lost.take() {
                break Err(l.error());
            }
            break Err(CliError::HostsLost {
                hosts: silent_tops,
                message: format!(
                    "host{} {} did not join within --rendezvous-timeout {:.0?} (no report from {}{})",
                    if missing.len() == 1 { "" } else { "s" },
                    missing.join(", "),
                    args.rendezvous_timeout,
                    if missing.len() == 1 {
                        "its agent"
                    } else {
                        "their agents"
                    },
                    match &step {
                        Some((s, _)) if unconnected > 0 => format!(
                            "; {} never connected back; srun said: {}",
                            counted(unconnected, "agent"),
                            s.said()
                        ),
                        _ => String::new(),
                    }
                ) + &through
                    .iter()
                    .chain(&not_started)
                    .chain(&said)
                    .map(|s| format!("\n  {s}"))
                    .collect::<String>(),
            });
        }
        if started.elapsed() > join_limit {
            // A host that never says it wrote the table: a hung file system, a stalled link.
            let waiting: Vec<String> = remotes
                .iter()
                .filter(|r| !r.ready)
                .map(|r| r.host.clone())
                .collect();
            break Err(CliError::TableNotReported {
                hosts: waiting,
                limit: join_limit,
            });
        }
        if progress && started.elapsed() > Duration::from_secs(1) {
            let joined = reports.iter().filter(|r| r.is_some()).count();
            to_stderr(&format!(
                "\ratlasboost: hosts joined: {}/{} ({:.0?}, timeout {:.0?})",
                if decision.is_some() {
                    hosts.len()
                } else {
                    joined
                },
                hosts.len(),
                started.elapsed(),
                args.rendezvous_timeout
            ));
            shown = true;
        }
    };
    if shown {
        to_stderr("\n");
    }
    // Hosts whose agents failed are the join's error, whatever ended it after them (a host
    // lost, srun's end, the timeout); a signal still ends it as a signal.
    let result = match (failed.take(), result) {
        (Some((f, _)), Err(_)) => Err(f.error()),
        (_, result) => result,
    };
    // On the way out, the agents are told to stop (their channels close) before srun is
    // waited for.
    let interrupted = match result {
        Ok(i) => i,
        Err(e) => {
            drop(remotes);
            drop(step);
            return Err(e);
        }
    };
    if let Some(s) = interrupted {
        drop(remotes);
        drop(step);
        return Ok(Joined::Interrupted(s));
    }
    printer.detail(&format!(
        "atlasboost: rendezvous of {} took {} ms",
        counted(hosts.len(), "host"),
        started.elapsed().as_millis(),
    ));
    let decision =
        decision.ok_or_else(|| CliError::Failure("the join ended without a table".into()))?;
    let mut joined = finish_join(launch, decision, local_devices, remotes, printer)?;
    if let (Joined::Ready(j), Some((s, _))) = (&mut joined, step) {
        j.step = Some(s);
    }
    Ok(joined)
}

/// The Slurm step's agents that connected since the last look: each gets its configuration.
/// srun ending before every agent is in fails the join, with what srun said.
fn admit_agents(
    step: &mut slurm::Step,
    root: &AgentConfig,
    remotes: &mut [Remote],
    printer: &Printer,
) -> Result<(), CliError> {
    let config_of = |position: usize| -> Result<Vec<u8>, CliError> {
        let mut line = serde_json::to_vec(&agent::child_config(root, &root.tree.hosts[position]))
            .map_err(CliError::json("encode the agent's settings"))?;
        line.push(b'\n');
        Ok(line)
    };
    for why in step.serve(remotes, &config_of)? {
        printer.status(&format!("atlasboost: {why}"));
    }
    let waiting: Vec<&str> = remotes
        .iter()
        .filter(|r| r.is_awaited())
        .map(|r| r.host.as_str())
        .collect();
    if waiting.is_empty() {
        return Ok(());
    }
    if let Some(status) = step.ended() {
        // What srun said last may still be on its way through the pipe.
        std::thread::sleep(Duration::from_millis(100));
        return Err(CliError::Failure(format!(
            "srun ended ({status}) before the agents of {} connected back; srun said: {}",
            waiting.join(", "),
            step.said()
        )));
    }
    Ok(())
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
        step: None,
    })))
}

/// What the launcher heard from the tree during the join.
#[derive(Default)]
struct Heard {
    /// Reports, by position in the tree.
    reports: Vec<(usize, Vec<u8>)>,
    /// The failures, in the order heard: sessions that ended, agents that reported one.
    failures: Vec<CliError>,
}

/// How long the join goes on gathering lost hosts after the first (see [`LostHosts`]).
const MORE_LOST_WAIT: Duration = Duration::from_millis(500);

/// The hosts lost while joining, and what was said of each.
#[derive(Debug, Default)]
struct LostHosts {
    hosts: Vec<String>,
    messages: Vec<String>,
}

impl LostHosts {
    /// One error naming them all.
    fn error(self) -> CliError {
        CliError::HostsLost {
            message: several_hosts(&self.messages, "were lost while the hosts joined"),
            hosts: self.hosts,
        }
    }
}

/// The hosts whose agent failed while joining, each with its message (naming it), and the
/// first one's exit code.
#[derive(Debug)]
struct FailedHosts {
    messages: Vec<String>,
    code: u8,
}

impl FailedHosts {
    /// One error naming them all, with the first one's code.
    fn error(self) -> CliError {
        CliError::Remote {
            message: several_hosts(&self.messages, "failed as the hosts joined"),
            code: self.code,
        }
    }
}

/// One host's message as it is, or several under a line that counts them (`3 hosts {what}:`).
fn several_hosts(messages: &[String], what: &str) -> String {
    match messages {
        [one] => one.clone(),
        many => format!(
            "{} {what}:\n  {}",
            counted(many.len(), "host"),
            many.join("\n  ")
        ),
    }
}

/// Reads what the launch tree said while the launcher waits for its hosts: reports, readiness,
/// failures, and messages a fast job already sent (kept for the supervisor).
fn check_remotes(remotes: &mut [Remote], buf: &mut [u8], printer: &Printer) -> Heard {
    let mut heard = Heard::default();
    for h in 0..remotes.len() {
        if remotes[h].parent.is_some() || remotes[h].is_awaited() || remotes[h].lost.is_some() {
            continue;
        }
        while let Some(lines) = remotes[h].read_err(buf) {
            if lines.is_empty() {
                break;
            }
            for l in lines {
                printer.detail(&format!("atlasboost: host {}: {l}", remotes[h].host));
            }
        }
        match remotes[h].read_out(buf) {
            Ok(Some(messages)) => {
                for m in messages {
                    if let Err(e) = on_joining(remotes, h, m, &mut heard, printer) {
                        heard.failures.push(e);
                    }
                }
            }
            // A fast job may be over on a host before the others are ready: what it said is in
            // the backlog, and the supervisor judges it.
            Ok(None) if remotes[h].ready => {}
            Ok(None) => {
                let r = &mut remotes[h];
                // Drain what ssh said last, for the message.
                while r.read_err(buf).is_some_and(|l| !l.is_empty()) {}
                // The launch fails on this host: worth a moment more for ssh's ending.
                let ending = r.ssh_ending_within(200);
                let what = if r.greeted() {
                    "its agent stopped before the job started"
                } else if ending.as_deref() == Some("ssh exited 0") {
                    // ssh ran the remote command, which ended well without a word of the
                    // protocol: something other than atlasboost (--remote-atlasboost /bin/true).
                    "the remote command ended (exit 0) without starting atlasboost's agent: is \
                     --remote-atlasboost (or the atlasboost on the remote PATH) atlasboost?"
                } else {
                    "ssh could not start atlasboost agent there"
                };
                let said = match ending {
                    Some(e) => format!("{} ({e})", r.err_tail()),
                    None => r.err_tail(),
                };
                let e = CliError::HostLost {
                    host: r.host.clone(),
                    what,
                    said,
                };
                r.lost = Some(what.to_string());
                heard.failures.push(with_subtree(remotes, h, e));
            }
            Err(why) => {
                heard.failures.push(CliError::Protocol {
                    host: remotes[h].host.clone(),
                    why: why.to_string(),
                });
            }
        }
        if !heard.failures.is_empty() {
            break;
        }
    }
    heard
}

/// One message of the launcher's child `h` during the join (a host below it speaks through
/// it, in [`Up::Via`]).
fn on_joining(
    remotes: &mut [Remote],
    h: usize,
    message: Up,
    heard: &mut Heard,
    printer: &Printer,
) -> Result<(), CliError> {
    // A host below `h` in the tree, or the protocol error that names `h`.
    let below = |host: u32| {
        let v = host as usize;
        match v < remotes.len() && v != h && top_of(remotes, v) == h {
            true => Ok(v),
            false => Err(CliError::Protocol {
                host: remotes[h].host.clone(),
                why: format!("it passed up host position {host}, which is not below it"),
            }),
        }
    };
    let (v, message) = match message {
        Up::Via { host, message } => (below(host)?, *message),
        Up::Lost { host, said } => {
            let v = below(host)?;
            let parent = remotes[v].parent.unwrap_or(h);
            let e = CliError::Failure(format!(
                "host {}: {said} (said host {}, which started it)",
                remotes[v].host, remotes[parent].host
            ));
            remotes[v].lost = Some(said);
            return Err(with_subtree(remotes, v, e));
        }
        m => (h, m),
    };
    let r = &mut remotes[v];
    r.last_heard = Instant::now();
    match message {
        Up::Report { bytes } => heard.reports.push((v, bytes)),
        Up::Ready => r.ready = true,
        Up::Said { line } => {
            let line = String::from_utf8_lossy(&line).into_owned();
            printer.detail(&format!("atlasboost: host {}: {line}", r.host));
            r.heard_err(line);
        }
        Up::Failed { code, message } => {
            let message = about_host(&r.host, &message);
            // Heard no more: its session's end that follows is not news.
            r.lost = Some(message.clone());
            return Err(CliError::Remote { message, code });
        }
        // Kept for the supervisor, as it came.
        other => remotes[h].backlog.push(match v == h {
            true => other,
            false => Up::Via {
                host: v as u32,
                message: Box::new(other),
            },
        }),
    }
    Ok(())
}

/// A lost host's error, naming the hosts below it in the launch tree, reached through it (a
/// restart leaves out the host, and reaches those below it through another).
fn with_subtree(remotes: &[Remote], h: usize, e: CliError) -> CliError {
    let below: Vec<&str> = (0..remotes.len())
        .filter(|&v| is_below(remotes, v, h))
        .map(|v| remotes[v].host.as_str())
        .collect();
    let mut message = atlasboost_core::exchange::error_chain(&e);
    if !below.is_empty() {
        message.push_str(&format!(
            "; with it the {} below it in the launch tree: {}",
            counted(below.len(), "host"),
            below.join(", ")
        ));
    }
    CliError::HostsLost {
        hosts: vec![remotes[h].host.clone()],
        message,
    }
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
fn wait_readable(remotes: &[Remote], also: &[std::os::fd::BorrowedFd<'_>], timeout: Duration) {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    let mut fds: Vec<PollFd<'_>> = remotes
        .iter()
        .flat_map(|r| r.out.iter().chain(r.err.iter()))
        .map(|fd| fd.as_fd())
        .chain(also.iter().copied())
        .map(|fd| PollFd::new(fd, PollFlags::POLLIN))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_restart_delay_doubles_up_to_30_s_unless_the_first_is_longer() {
        let s = Duration::from_secs_f64;
        let delays =
            |first: f64| -> Vec<Duration> { (0..6).map(|a| restart_delay(s(first), a)).collect() };
        assert_eq!(delays(1.0), [1.0, 2.0, 4.0, 8.0, 16.0, 30.0].map(s));
        assert_eq!(delays(0.0), [s(0.0); 6]);
        assert_eq!(delays(100.0), [s(100.0); 6]);
        assert_eq!(delays(20.0), [20.0, 30.0, 30.0, 30.0, 30.0, 30.0].map(s));
    }
}
