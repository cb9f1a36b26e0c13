//! `atlasboost run`: plan the hosts, agree on the rank table, start and watch the workers
//! (SPEC §5–§9).
//!
//! The launcher is the rendezvous coordinator. Each host has an agent ([`agent::run_agent`])
//! that probes its devices, reports them, receives the table the launcher built from every
//! report, and writes it. Hosts that are this machine (`127.x.y.z`, its own addresses) run
//! their agent on a thread of the launcher. Then [`supervise::run_workers`] starts one worker
//! per table entry and watches them to the end.
//!
//! Hosts on other machines (over ssh) are not supported yet: the launcher refuses them.

pub mod agent;
pub mod lifeline;
pub mod output;
pub mod plan;
pub mod supervise;

use std::collections::HashSet;
use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use atlasboost_core::EnvVars;
use atlasboost_core::ranktable::{BuildOptions, RankOrder};
use atlasboost_core::worker_env::{WorkerSpec, worker_env};
use atlasboost_tcp::{Coordinator, CoordinatorConfig, Secret};
use nix::sys::signal::Signal;

use self::agent::{AgentJob, Prepared, TablePolicy, launch_combiner, run_agent};
use self::lifeline::Lifeline;
use self::output::{Output, OutputOptions};
use self::plan::{
    HostPlan, check_np, parse_host_list, parse_hostfile, resolve_hosts, this_machine,
};
use self::supervise::{JobResult, RunPlan, Signals, WorkerPlan, WorkerResult, run_workers};
use crate::cli::{RankOrderArg, RunArgs};
use crate::commands::counted;
use crate::commands::devices::make_probe;
use crate::error::CliError;
use crate::printer::Printer;

/// How much longer an agent waits for the launcher's answer than the launcher waits for the
/// agents, so that a timeout is reported by the one that knows who is missing.
const AGENT_SLACK: Duration = Duration::from_secs(2);

/// Jobs with more workers than this get a shorter summary: counts and the failures only.
const FULL_SUMMARY_MAX: usize = 64;

/// Runs `atlasboost run` and returns the exit code (the first failed worker's, 128+N after a
/// signal, 0 when every worker succeeded).
///
/// # Errors
///
/// Bad input (exit 2), atlasboost's own failures (125), a command that cannot be started
/// (126/127).
pub fn run(args: &RunArgs, printer: &Printer) -> Result<u8, CliError> {
    let started = Instant::now();
    let hosts = plan_hosts(args)?;
    // Refuse what cannot work before anything starts.
    make_probe(&args.discovery, &hosts[0].server_id)?;
    let wdir = worker_dir(args)?;
    let table_path = wdir.join(&args.rank_table);
    let exports = resolve_exports(&args.env)?;
    if args.command.first().is_none_or(|c| c.is_empty()) {
        return Err(CliError::Usage("the command to run is empty".into()));
    }

    // Every worker takes two pipes; a job of many local ranks must not hit the soft limit.
    supervise::raise_fd_limit();
    let signals = Signals::block()?;
    // Orphaned children of workers are re-parented to the launcher, which reaps them.
    let _ = nix::sys::prctl::set_child_subreaper(true);
    let mut lifeline = Lifeline::start()?;

    let job_id = format!("ab-{}", &random_hex()?[..12]);
    let prepared = match join(args, &hosts, &job_id, &table_path, &signals, printer)? {
        Joined::Ready(p) => p,
        Joined::Interrupted(s) => {
            printer.status(&format!(
                "atlasboost: stopped by {} while the hosts were joining",
                s.as_str()
            ));
            lifeline.close();
            return Ok(128u8.wrapping_add(s as u8));
        }
    };
    let table = &prepared[0].table;
    let workers = plan_workers(args, &hosts, &prepared, &table_path, &job_id, &exports)?;
    if let Some(list) = &args.ranks
        && let Some(bad) = list.ranks.iter().find(|r| **r as usize >= workers.len())
    {
        return Err(CliError::Usage(format!(
            "--ranks {}: rank {bad} is not in this job of {} (0-{})",
            list.text,
            counted(workers.len(), "rank"),
            workers.len() - 1
        )));
    }
    printer.status(&format!(
        "atlasboost: {} on {}, rank table {} (ready in {} ms)",
        counted(workers.len(), "rank"),
        counted(table.server_count(), "server"),
        table_path.display(),
        started.elapsed().as_millis()
    ));
    let mut output = Output::new(
        OutputOptions {
            tag: !args.no_tag,
            timestamp: args.timestamp,
            ranks: args.ranks.as_ref().map(|r| r.ranks.clone()),
            log_dir: args.log_dir.clone(),
        },
        &workers.iter().map(|w| w.rank).collect::<Vec<_>>(),
    )?;
    let run_plan = RunPlan {
        command: args.command.clone(),
        wdir,
        grace: args.grace,
    };
    let result = run_workers(&run_plan, &workers, &mut output, &signals, &mut lifeline);
    lifeline.close();
    let result = result?;
    report(&result, started.elapsed(), printer);
    Ok(result.exit_code)
}

fn plan_hosts(args: &RunArgs) -> Result<Vec<HostPlan>, CliError> {
    let hosts = match (&args.hosts, &args.hostfile) {
        (Some(list), _) => resolve_hosts(&parse_host_list(list)?)?,
        (None, Some(file)) => resolve_hosts(&parse_hostfile(file)?)?,
        (None, None) => vec![this_machine()?],
    };
    check_np(&hosts, args.np)?;
    if let Some(h) = hosts.iter().find(|h| !h.local) {
        return Err(CliError::Failure(format!(
            "host {} is not this machine; launching on other machines (over ssh) is not built \
             yet in this version of atlasboost",
            h.describe()
        )));
    }
    Ok(hosts)
}

fn worker_dir(args: &RunArgs) -> Result<PathBuf, CliError> {
    let cwd = std::env::current_dir()
        .map_err(|e| CliError::Failure(format!("cannot read the current directory: {e}")))?;
    let dir = match &args.wdir {
        Some(d) => cwd.join(d),
        None => cwd,
    };
    if !dir.is_dir() {
        return Err(CliError::Usage(format!(
            "--wdir {}: not a directory",
            dir.display()
        )));
    }
    Ok(dir)
}

/// `-x NAME=VALUE` as given; `-x NAME` takes this shell's value, and must have one.
fn resolve_exports(
    exports: &[(String, Option<String>)],
) -> Result<Vec<(OsString, OsString)>, CliError> {
    exports
        .iter()
        .map(|(name, value)| match value {
            Some(v) => Ok((name.into(), v.into())),
            None => std::env::var_os(name)
                .map(|v| (name.into(), v))
                .ok_or_else(|| {
                    CliError::Usage(format!(
                        "-x {name}: {name} is not set in this shell; give -x {name}=VALUE"
                    ))
                }),
        })
        .collect()
}

fn random_hex() -> Result<String, CliError> {
    Secret::random()
        .map(|s| s.to_hex())
        .map_err(|e| CliError::Failure(format!("cannot read random bytes: {e}")))
}

/// How the join ended.
enum Joined {
    /// Every host has its table.
    Ready(Vec<Prepared>),
    /// A signal came first.
    Interrupted(Signal),
}

/// Runs the coordinator and every local agent until each host has written the table.
fn join(
    args: &RunArgs,
    hosts: &[HostPlan],
    job_id: &str,
    table_path: &std::path::Path,
    signals: &Signals,
    printer: &Printer,
) -> Result<Joined, CliError> {
    let secret = Secret::random()
        .map_err(|e| CliError::Failure(format!("cannot make the job's secret: {e}")))?;
    let mut config = CoordinatorConfig::new(
        "tcp://127.0.0.1:0",
        hosts.len(),
        job_id,
        secret.clone(),
        args.rendezvous_timeout,
    );
    config.names = hosts.iter().map(HostPlan::describe).collect();
    let policy = TablePolicy {
        hosts: hosts.to_vec(),
        np: args.np,
        build: BuildOptions {
            format: args.format,
            order: match args.rank_order {
                RankOrderArg::ServerId => RankOrder::ServerId,
                RankOrderArg::Hosts => RankOrder::Hosts(Vec::new()),
            },
            chip: None,
        },
    };
    // The policy's own words, without the coordinator's framing, for the error message.
    let refusal: Arc<Mutex<Option<String>>> = Arc::default();
    let mut combiner = launch_combiner(policy);
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

    let written = Arc::new(Mutex::new(HashSet::new()));
    let (tx, rx) = mpsc::channel();
    for (index, host) in hosts.iter().enumerate() {
        let job = AgentJob {
            index,
            hosts: hosts.len(),
            server_id: host.server_id.clone(),
            discovery: args.discovery.clone(),
            endpoint: coordinator.endpoint().to_string(),
            job_id: job_id.to_string(),
            secret: secret.clone(),
            timeout: args.rendezvous_timeout + AGENT_SLACK,
            table_path: table_path.to_path_buf(),
        };
        let (tx, written) = (tx.clone(), Arc::clone(&written));
        std::thread::Builder::new()
            .name(format!("agent {}", host.server_id))
            .spawn(move || {
                let _ = tx.send((index, run_agent(&job, &written)));
            })
            .map_err(|e| CliError::Failure(format!("cannot start an agent thread: {e}")))?;
    }
    drop(tx);

    let progress = std::io::stderr().is_terminal() && !printer.is_quiet();
    let started = Instant::now();
    let mut shown = false;
    let mut results: Vec<Option<Result<Prepared, CliError>>> = hosts.iter().map(|_| None).collect();
    let mut left = hosts.len();
    while left > 0 {
        if let Some(s) = signals
            .pending()
            .into_iter()
            .find(|s| *s != Signal::SIGCHLD)
        {
            if shown {
                eprintln!();
            }
            return Ok(Joined::Interrupted(s));
        }
        match rx.recv_timeout(Duration::from_millis(20)) {
            Ok((i, r)) => {
                // An agent that fails outside the round (its table cannot be written, say)
                // ends the wait: the others would only wait for the timeout.
                let failed = r.is_err();
                results[i] = Some(r);
                left -= 1;
                if failed {
                    break;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if progress && started.elapsed() > Duration::from_secs(1) {
            eprint!(
                "\ratlasboost: hosts joined: {}/{} ({:.0?}, timeout {:.0?})",
                coordinator.joined(),
                hosts.len(),
                started.elapsed(),
                args.rendezvous_timeout
            );
            shown = true;
        }
    }
    if shown {
        eprintln!();
    }
    let failure = coordinator.failure();
    let report = coordinator.finish();
    printer.detail(&format!(
        "atlasboost: rendezvous of {} took {} ms ({} foreign frames dropped)",
        counted(hosts.len(), "host"),
        started.elapsed().as_millis(),
        report.dropped
    ));
    if let Some(why) = refusal
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .or(failure)
    {
        return Err(CliError::Failure(why));
    }
    if let Some(Some(Err(e))) = results
        .iter_mut()
        .find(|r| matches!(r, Some(Err(_))))
        .map(Option::take)
    {
        return Err(e);
    }
    let mut prepared = Vec::with_capacity(hosts.len());
    for (host, r) in hosts.iter().zip(results) {
        match r {
            Some(Ok(p)) => prepared.push(p),
            Some(Err(e)) => return Err(e),
            None => {
                return Err(CliError::Failure(format!(
                    "the agent of host {} stopped without an answer",
                    host.describe()
                )));
            }
        }
    }
    Ok(Joined::Ready(prepared))
}

/// One worker per table entry of every local host, in rank order, with its environment.
fn plan_workers(
    args: &RunArgs,
    hosts: &[HostPlan],
    prepared: &[Prepared],
    table_path: &std::path::Path,
    job_id: &str,
    exports: &[(OsString, OsString)],
) -> Result<Vec<WorkerPlan>, CliError> {
    let table = &prepared[0].table;
    let answer = &prepared[0].answer;
    let ranks = table.ranks()?;
    let mut workers = Vec::with_capacity(ranks.len());
    for (host, p) in hosts.iter().zip(prepared) {
        for entry in ranks.iter().filter(|e| e.server_id == host.server_id) {
            let logical_id = p
                .devices
                .iter()
                .find(|d| d.physical_id == entry.physical_id)
                .map_or(entry.physical_id, |d| d.logical_id);
            let env = worker_env(&WorkerSpec {
                table,
                table_path,
                server_id: &host.server_id,
                physical_id: entry.physical_id,
                logical_id,
                framework: args.framework,
                job_id,
                master_addr: &answer.master_addr,
                master_port: answer.master_port,
            })?;
            let mut vars: Vec<(OsString, OsString)> = env
                .set
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect();
            vars.extend(
                env.set_if_unset
                    .into_iter()
                    .filter(|(k, _)| std::env::var_os(k).is_none())
                    .map(|(k, v)| (k.into(), v.into())),
            );
            // What the user exports wins over what atlasboost would set.
            vars.extend(exports.iter().cloned());
            workers.push(WorkerPlan {
                rank: env.world.rank,
                host: host.describe(),
                device: logical_id,
                env: vars,
            });
        }
    }
    workers.sort_by_key(|w| w.rank);
    // The table's own variable names, so a reader of this code finds where they are set.
    debug_assert!(
        workers
            .iter()
            .all(|w| w.env.iter().any(|(k, _)| k == EnvVars::RANK_TABLE_FILE))
    );
    Ok(workers)
}

/// The end-of-job summary on stderr, and the first failure with its last stderr lines.
fn report(result: &JobResult, elapsed: Duration, printer: &Printer) {
    let count = |f: &dyn Fn(&WorkerResult) -> bool| result.workers.iter().filter(|w| f(w)).count();
    let succeeded = count(&|w| w.ending.is_some_and(|e| e.code() == 0));
    let stopped = count(&|w| w.stopped && w.ending.is_some_and(|e| e.code() != 0));
    let failed = result.workers.len() - succeeded - stopped;
    let mut text = format!(
        "atlasboost: {} finished in {:.2} s: {succeeded} succeeded, {failed} failed, {stopped} stopped\n",
        counted(result.workers.len(), "rank"),
        elapsed.as_secs_f64(),
    );
    let host_width = result
        .workers
        .iter()
        .map(|w| w.host.len())
        .max()
        .unwrap_or(4)
        .max(4);
    text.push_str(&format!(
        "  {:>5}  {:<host_width$}  {:>6}  {:<16}  {:>9}\n",
        "rank", "host", "device", "status", "time"
    ));
    let full = result.workers.len() <= FULL_SUMMARY_MAX;
    for w in &result.workers {
        let status = match w.ending {
            None => "not run".to_string(),
            Some(e) if w.stopped && e.code() != 0 => format!("stopped ({})", e.describe()),
            Some(e) => e.describe(),
        };
        if full || w.ending.is_some_and(|e| e.code() != 0) {
            text.push_str(&format!(
                "  {:>5}  {:<host_width$}  {:>6}  {:<16}  {:>7.2} s\n",
                w.rank,
                w.host,
                w.device,
                status,
                w.run_time.as_secs_f64()
            ));
        }
    }
    if !full {
        text.push_str(&format!("  (the other {succeeded} ranks succeeded)\n"));
    }
    printer.status(text.trim_end());
    if let Some(s) = result.interrupted {
        printer.error(&format!(
            "error: stopped by {}; exit code {}",
            s.as_str(),
            result.exit_code
        ));
    } else if let Some(i) = result.first_failure {
        let w = &result.workers[i];
        let mut text = format!(
            "error: rank {} (host {}, device {}) failed first: {} after {:.2} s",
            w.rank,
            w.host,
            w.device,
            w.ending.map_or("?".into(), |e| e.describe()),
            w.run_time.as_secs_f64()
        );
        if w.tail.is_empty() {
            text.push_str("; it wrote nothing on stderr");
        } else {
            text.push_str("; its last stderr lines:");
            for l in &w.tail {
                text.push_str(&format!("\n  [{}]<stderr>:{l}", w.rank));
            }
        }
        printer.error(&text);
    }
}
