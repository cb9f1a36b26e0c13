//! What every launch shares, with or without `--mpi`: the checks before anything starts, the
//! job's id, its table lock and log directory, the workers' directory and exports, the
//! rendezvous address, and the summary at the end.

use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use atlasboost::progress::RecordedError;
use atlasboost_core::EnvVars;
use atlasboost_core::ranktable::{Format, LockOwner, TableLock};
use atlasboost_core::worker_env::{Framework, set_from_the_table};
use atlasboost_tcp::Secret;
use nix::sys::signal::Signal;

use super::channel::Ending;
use super::events::{self, EventLog, Events};
use super::output::JobLogDir;
use super::plan::{HostPlan, ranks_named};
use super::supervise::{JobResult, Signals, WorkerResult};
use crate::commands::counted;
use crate::error::CliError;
use crate::printer::Printer;
use crate::settings::{DEFAULT_FANOUT, RunSettings, ServerOrder};

/// Jobs with more workers than this get a shorter summary: counts and the failures only.
pub(crate) const FULL_SUMMARY_MAX: usize = 64;

/// Whether two paths name one file, which may not exist yet: the same name in the same
/// directory, each path's symbolic links followed (also one to a file not written yet), or
/// the same inode (a hard link).
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let resolved = |p: &Path| {
        let mut p = std::path::absolute(p).ok()?;
        // A chain of links, each followed (as open would, up to its limit of 40).
        for _ in 0..40 {
            if !std::fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_symlink()) {
                break;
            }
            let target = std::fs::read_link(&p).ok()?;
            p = p.parent()?.join(target);
        }
        Some(p.parent()?.canonicalize().ok()?.join(p.file_name()?))
    };
    if resolved(a).is_some_and(|x| Some(x) == resolved(b)) {
        return true;
    }
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// What of the job's own files `events` is, if any: creating the events file empties it, so
/// no input of the job may be it (the hostfile, the hccn.conf the probe reads, a file the
/// command names), and the table and its lock are replaced under it.
fn taken_by_the_job(args: &RunSettings, events: &Path) -> Result<Option<String>, CliError> {
    let wdir = worker_dir(args, false)?;
    let table = wdir.join(&args.rank_table);
    let mut taken = vec![
        (table.clone(), "the rank table's path".to_string()),
        (
            atlasboost_core::ranktable::lock_path(&table),
            "the rank table's lock file".into(),
        ),
    ];
    if args.discovery.sim.is_none() {
        taken.push((
            atlasboost::probe::hccn_conf(&args.discovery),
            "the hccn.conf the probe reads".into(),
        ));
    }
    if let Some(hostfile) = &args.hostfile {
        taken.push((hostfile.clone(), "the --hostfile".into()));
    }
    if let Some((_, what)) = taken.into_iter().find(|(path, _)| same_file(events, path)) {
        return Ok(Some(what));
    }
    // The command's own inputs (its program, a script it runs): files there now, with
    // something in them that is not a job's events. (`/dev/stdout` and `/proc/self/...` are
    // the worker's own, not what the launcher resolves them to.)
    Ok(args.command.iter().find_map(|arg| {
        let path = wdir.join(arg);
        let per_process = path.starts_with("/dev") || path.starts_with("/proc");
        (!per_process && path.is_file() && same_file(events, &path) && !is_empty_or_events(&path))
            .then(|| format!("a file the command names ({})", Path::new(arg).display()))
    }))
}

/// Whether `path` holds nothing, or a job's events (its first line an object with `event` and
/// `job`): emptying it loses no input of the command.
fn is_empty_or_events(path: &Path) -> bool {
    use std::io::Read;
    let mut head = Vec::new();
    let Ok(file) = std::fs::File::open(path) else {
        return false;
    };
    if file.take(64 << 10).read_to_end(&mut head).is_err() {
        return false;
    }
    let first = head.split(|b| *b == b'\n').next().unwrap_or_default();
    head.is_empty()
        || serde_json::from_slice::<serde_json::Value>(first)
            .is_ok_and(|v| v.get("event").is_some() && v.get("job").is_some())
}

/// What can be refused before any worker starts, with or without `--mpi`: an empty command,
/// `--ranks` beyond the job's size (when it is known), a `-x` of a variable the table decides,
/// `--events` on a file of the job's own, a log directory that cannot be made or written.
pub(crate) fn check_before_start(args: &RunSettings, size: Option<u64>) -> Result<(), CliError> {
    if args.command.first().is_none_or(|c| c.is_empty()) {
        return Err(CliError::Usage("the command to run is empty".into()));
    }
    if args.hang_dump && args.hang_timeout.is_none() {
        return Err(CliError::Usage(
            "--hang-dump takes the stacks of ranks the hang watchdog finds stuck, and \
             --hang-timeout off runs no watchdog"
                .into(),
        ));
    }
    if args.min_np.is_some() && args.max_restarts == 0 {
        return Err(CliError::Usage(
            "--min-np bounds how far a restart may shrink the job, and --max-restarts 0 allows \
             none"
                .into(),
        ));
    }
    if let Some((name, _)) = args
        .env
        .iter()
        .find(|(name, _)| set_from_the_table(name, args.framework))
    {
        return Err(CliError::Usage(format!(
            "-x {name}: atlasboost sets {name} for each worker from the rank table (SPEC §9), \
             so one value for every worker would contradict it"
        )));
    }
    if !args.mpi
        && let Some((name, _)) = args
            .env
            .iter()
            .find(|(name, _)| set_by_the_launcher(name, args.framework))
    {
        return Err(CliError::Usage(format!(
            "-x {name}: atlasboost sets {name} for each worker (its devices, restarts, the hang \
             watchdog, error records), so a value of yours would mislead it or the worker"
        )));
    }
    if let Some(events) = &args.events
        && let Some(what) = taken_by_the_job(args, events)?
    {
        return Err(CliError::Usage(format!(
            "--events {} is {what} too; give the events a file of their own",
            events.display()
        )));
    }
    if args.restart_delay.is_some() && args.max_restarts == 0 {
        return Err(CliError::Usage(
            "--restart-delay is the wait before a restart, and --max-restarts 0 allows none".into(),
        ));
    }
    if args.rank_order == ServerOrder::Hosts && args.format == Format::Legacy {
        return Err(CliError::Usage(
            "--rank-order hosts cannot apply to --format legacy, which ranks servers by \
             server_id"
                .into(),
        ));
    }
    if let (Some(list), Some(size)) = (&args.ranks, size)
        && let Some(bad) = list.ranks.iter().find(|r| u64::from(**r) >= size)
    {
        return Err(CliError::Usage(format!(
            "--ranks {}: rank {bad} is not in this job of {size} ranks (0-{})",
            list.text,
            size.saturating_sub(1)
        )));
    }
    if let Some(dir) = &args.log_dir {
        // mkdir's own word for a file in the way is "File exists". What is on the disk is
        // bad input (125), as for a path below a file, not a usage error.
        if dir.exists() && !dir.is_dir() {
            return Err(CliError::Failure(format!(
                "--log-dir {} is not a directory",
                dir.display()
            )));
        }
        std::fs::create_dir_all(dir).map_err(CliError::file("create log directory", dir))?;
        // A directory there but not writable (a read-only mount) fails now, before the events
        // file of a job before is emptied.
        nix::unistd::access(
            dir,
            nix::unistd::AccessFlags::W_OK | nix::unistd::AccessFlags::X_OK,
        )
        .map_err(|e| CliError::file("write in log directory", dir)(e.into()))?;
    }
    Ok(())
}

/// Where `--mpi`'s relays reach the launcher: `--rendezvous-addr`; else, with remote hosts, this
/// machine's address on the route to the first of them; else loopback.
pub(crate) fn rendezvous_address(
    args: &RunSettings,
    hosts: &[HostPlan],
) -> Result<IpAddr, CliError> {
    let remote = hosts.iter().find(|h| !h.local);
    // A loopback address, given or from --nic, reaches no relay on another host.
    let unreachable = |address: IpAddr, from: String| match remote {
        Some(r) if address.is_loopback() => Err(CliError::Usage(format!(
            "{from} is a loopback address, which the relays on host {} cannot reach: give \
             this machine's address on the job's network",
            r.describe()
        ))),
        _ => Ok(address),
    };
    if let Some(a) = args.rendezvous_addr {
        return unreachable(a, format!("--rendezvous-addr {a}"));
    }
    // The job's network, when this machine is on it (a login node may not be).
    if let Some(choice) = &args.nic
        && let Ok(nic) = atlasboost::host::find_nic(choice)
    {
        return unreachable(
            IpAddr::V4(nic.ipv4),
            format!("--nic {choice}'s address {}", nic.ipv4),
        );
    }
    let Some(remote) = remote else {
        return Ok(IpAddr::V4(Ipv4Addr::LOCALHOST));
    };
    let target: IpAddr = remote
        .server_id
        .parse()
        .map_err(|_| CliError::NoHostAddress {
            host: remote.describe(),
        })?;
    let ours = atlasboost::host::address_toward(target).map_err(|source| CliError::NoRoute {
        host: remote.describe(),
        source,
    })?;
    if ours.is_loopback() && !target.is_loopback() {
        return Err(CliError::LoopbackRoute {
            host: remote.describe(),
            from: ours,
        });
    }
    Ok(ours)
}

/// The workers' directory, absolute. It must exist here when a host is this machine; remote
/// agents check it on their hosts.
pub(crate) fn worker_dir(args: &RunSettings, check_here: bool) -> Result<PathBuf, CliError> {
    let cwd = std::env::current_dir().map_err(CliError::system("read the current directory"))?;
    let dir = match &args.wdir {
        Some(d) => cwd.join(d),
        None => cwd,
    };
    // What is on the disk is bad input (125), here as on a remote host.
    if check_here && !dir.is_dir() {
        // `exists` would call a directory that cannot be reached (EACCES) missing.
        let what = match dir.try_exists() {
            Ok(true) => "not a directory".to_string(),
            Ok(false) => "does not exist".to_string(),
            Err(e) => format!("cannot be reached ({e})"),
        };
        return Err(CliError::Failure(format!(
            "--wdir {}: {what}",
            dir.display()
        )));
    }
    Ok(dir)
}

/// `-x NAME=VALUE` as given; `-x NAME` takes this shell's value, and must have one.
pub(crate) fn resolve_exports(
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

/// The variables of another way of starting ([`EnvVars::OTHER_STARTUP`]) that this process
/// has and `exports` (`-x`) does not give: the workers do not get them.
pub(crate) fn other_startup_vars(exports: &[(OsString, OsString)]) -> Vec<OsString> {
    EnvVars::OTHER_STARTUP
        .iter()
        .filter(|name| std::env::var_os(name).is_some())
        .filter(|name| !exports.iter().any(|(k, _)| k == **name))
        .map(OsString::from)
        .collect()
}

/// What is said of the variables [`other_startup_vars`] found, if any.
pub(crate) fn other_startup_warning(names: &[OsString]) -> Option<String> {
    let first = names.first()?;
    let listed: Vec<String> = names
        .iter()
        .map(|n| n.to_string_lossy().into_owned())
        .collect();
    let one = names.len() == 1;
    Some(format!(
        "atlasboost: warning: {} {} set, for another way of starting a job (HCCL's CM_* cluster \
         information, MindSpore's dynamic cluster) that must not meet a rank table: the \
         workers do not get {} (-x {} gives {} anyway)",
        listed.join(", "),
        if one { "is" } else { "are" },
        if one { "it" } else { "them" },
        first.to_string_lossy(),
        if one { "it" } else { "one" },
    ))
}

/// This host's lock of the table at `path` for job `job_id` (launched from `launcher`, this
/// host when `None`), held until the job ends: a path another running job holds is refused,
/// naming that job.
pub(crate) fn lock_table(
    path: &Path,
    job_id: &str,
    launcher: Option<&str>,
) -> Result<TableLock, CliError> {
    TableLock::acquire(path, &LockOwner::this_process(job_id, launcher))
        .map_err(CliError::TableLock)
}

/// `--events PATH` for job `job`, if given. A FIFO waits for its reader: that is said first,
/// and a signal meanwhile ends the launcher (before anything of the job is made).
///
/// # Errors
///
/// As [`EventLog::create`].
pub(crate) fn open_events(
    path: Option<&Path>,
    job: &str,
    signals: &Signals,
    printer: &Printer,
) -> Result<Option<Events>, CliError> {
    use std::os::unix::fs::FileTypeExt;
    let Some(path) = path else {
        return Ok(None);
    };
    if std::fs::metadata(path).is_ok_and(|m| m.file_type().is_fifo()) {
        printer.status(&format!(
            "atlasboost: --events {} is a FIFO: waiting for its reader",
            path.display()
        ));
    }
    signals
        .exit_on_signal_during("opening the events file", || EventLog::create(path, job))
        .map(Some)
}

/// `--log-dir DIR`'s directory for this job, `DIR/<job id>` (see [`JobLogDir`]).
pub(crate) fn job_logs(
    args: &RunSettings,
    job_id: &str,
    printer: &Printer,
) -> Result<Option<JobLogDir>, CliError> {
    let Some(dir) = &args.log_dir else {
        return Ok(None);
    };
    let (logs, warning) = JobLogDir::create(dir, job_id)?;
    if let Some(w) = warning {
        printer.status(&w);
    }
    Ok(Some(logs))
}

/// A new job's id: `ab-` and 12 random hex digits.
pub(crate) fn new_job_id() -> Result<String, CliError> {
    let hex = Secret::random()
        .map(|s| s.to_hex())
        .map_err(CliError::system("read random bytes"))?;
    Ok(format!("ab-{}", &hex[..12]))
}

/// One attempt of a job, for the summary (SPEC §12).
#[derive(Debug, Clone)]
pub(crate) struct AttemptRecord {
    /// 0 for the first start, then the restart's number.
    pub number: u32,
    /// Its table's shape (`None`: it never got one).
    pub layout: Option<String>,
    /// How long it lasted, from its join to its end.
    pub duration: Duration,
    /// Why it ended.
    pub ended: String,
    /// What its root cause recorded (`rank 2 recorded ValueError: ...`), when a worker did.
    pub root_cause: Option<String>,
    /// The exit code it called for.
    pub exit_code: u8,
}

/// The `attempt_end` event of attempt `a` (docs/events.md).
pub(crate) fn attempt_end_event(events: Option<&Events>, a: &AttemptRecord) {
    events::emit(
        events,
        "attempt_end",
        serde_json::json!({
            "attempt": a.number,
            "ended": a.ended,
            "root_cause": a.root_cause,
            "exit_code": a.exit_code,
            "seconds": a.duration.as_secs_f64(),
        }),
    );
}

/// The `summary` event, the job's last: its exit code, how many attempts, how long.
pub(crate) fn summary_event(
    events: Option<&Events>,
    exit_code: u8,
    attempts: usize,
    took: Duration,
) {
    events::emit(
        events,
        "summary",
        serde_json::json!({
            "exit_code": exit_code,
            "attempts": attempts,
            "seconds": took.as_secs_f64(),
        }),
    );
}

/// The `job_start` event: `np` when it is known before anything starts, `hosts` as the engine
/// knows them (objects of `host`, `server_id`, `slots`, `local`), where `--metrics` listens, the
/// rest from the settings.
pub(crate) fn job_start_event(
    events: Option<&Events>,
    args: &RunSettings,
    np: Option<u32>,
    hosts: Vec<serde_json::Value>,
    rank_table: &Path,
    metrics: Option<std::net::SocketAddr>,
) {
    events::emit(
        events,
        "job_start",
        serde_json::json!({
            "hosts": hosts,
            "np": np,
            "command": args.command.iter().map(|c| c.to_string_lossy()).collect::<Vec<_>>(),
            "framework": args.framework.to_string(),
            // Lossy: `json!` would panic on a path that is not UTF-8.
            "rank_table": rank_table.to_string_lossy(),
            "max_restarts": args.max_restarts,
            "fanout": args.fanout.unwrap_or(DEFAULT_FANOUT),
            "metrics": metrics.map(|a| format!("http://{a}/metrics")),
        }),
    );
}

/// A host as the `job_start` event lists it (docs/events.md).
pub(crate) fn host_json(h: &HostPlan) -> serde_json::Value {
    serde_json::json!({
        "host": h.describe(),
        "server_id": h.server_id,
        "slots": h.slots,
        "local": h.local,
    })
}

/// Why an attempt ended, in a few words.
pub(crate) fn ending_of(result: &JobResult) -> String {
    if let Some(s) = result.interrupted {
        return format!("stopped by {}", s.as_str());
    }
    if result.hang.is_some() {
        return match result.hung_ranks.as_slice() {
            [] => "hung (--hang-timeout)".into(),
            ranks => format!("hung (--hang-timeout): {} stuck", ranks_named(ranks)),
        };
    }
    if let Some(h) = &result.host_failure {
        let what = if h.lost { "lost" } else { "failed" };
        return format!("{} {what}", h.who());
    }
    // The first failure, whose code the attempt's is; the root cause, if another rank, comes
    // on a line of its own (report_attempt).
    match result.first_failure {
        Some(i) => {
            let w = &result.workers[i];
            format!(
                "rank {} (host {}, device {}) failed: {}",
                w.rank,
                w.host,
                w.device,
                w.ending.map_or("?".into(), |e| e.describe())
            )
        }
        None => "succeeded".into(),
    }
}

/// The variables the launcher of its own launches (not `--mpi`) sets for each worker beside
/// the table's (`set_from_the_table`): the devices it sees, which attempt it is, and the
/// files of the watchdog and of recorded errors. `agent::host_workers` and
/// `RankFiles::env` set them; a test there keeps the three in step.
pub(crate) const SET_BY_THE_LAUNCHER: [&str; 6] = [
    // Each host's job devices, mapped to the table (choose them with --devices).
    EnvVars::ASCEND_RT_VISIBLE_DEVICES,
    EnvVars::ATLASBOOST_RESTART_COUNT,
    EnvVars::ATLASBOOST_MAX_RESTARTS,
    EnvVars::ATLASBOOST_HEARTBEAT_FILE,
    EnvVars::ATLASBOOST_ERROR_FILE,
    EnvVars::ATLASBOOST_STACK_FILE,
];

/// Torch's names of the same, set with `--framework pytorch` only.
pub(crate) const SET_BY_THE_LAUNCHER_FOR_TORCH: [&str; 3] = [
    EnvVars::TORCHELASTIC_RESTART_COUNT,
    EnvVars::TORCHELASTIC_MAX_RESTARTS,
    EnvVars::TORCHELASTIC_ERROR_FILE,
];

/// Whether the launcher of its own launches sets `name` for each worker of `framework`.
pub(crate) fn set_by_the_launcher(name: &str, framework: Framework) -> bool {
    SET_BY_THE_LAUNCHER.contains(&name)
        || framework == Framework::Pytorch && SET_BY_THE_LAUNCHER_FOR_TORCH.contains(&name)
}

/// How a worker's run ended, as the summary counts and shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// It exited 0.
    Succeeded,
    /// It failed of its own accord, its host was lost, or it never ran.
    Failed,
    /// It ended once the attempt's end had begun: SIGTERM, SIGKILL, or its own handler of
    /// them; one that exits 0 only when a signal to the launcher, or mpirun's own stop, stopped
    /// the job (after a failure, a remote worker that finished by itself may be heard of after
    /// the stop began).
    Stopped,
    /// Under `--mpi`: mpirun never started it.
    NotStarted,
}

fn fate(w: &WorkerResult, interrupted: bool) -> Fate {
    match w.ending {
        Some(Ending::NotStarted) => Fate::NotStarted,
        Some(e) if e.code() == 0 && !(w.stopped && (interrupted || w.stopped_by_mpirun)) => {
            Fate::Succeeded
        }
        Some(_) if w.stopped => Fate::Stopped,
        _ => Fate::Failed,
    }
}

/// The worker whose failure started the attempt's end: among the workers that failed of
/// their own accord and recorded an error with a time, the earliest (their clocks, across
/// hosts); else the first failure the launcher heard of. A worker that the stop's SIGTERM or
/// SIGKILL ended did not fail of its own accord, whatever it recorded (an error it caught);
/// nor did one that ended after the stop began with a record stamped later than the stop (a
/// SIGTERM handler that raised, recorded and exited 1). A whole-second stamp (torch's) is
/// made precise by the error file's time when it was read ([`RankFiles::recorded`]); one
/// that could not be, of the second the stop began in, may be either, and counts. Equal times
/// go to the first failure, then to the worker that ended first.
///
/// [`RankFiles::recorded`]: super::rank_files::RankFiles::recorded
pub(crate) fn root_cause(result: &JobResult) -> Option<usize> {
    let first = result.first_failure?;
    let ended_by_the_stop = |w: &WorkerResult| {
        w.stopped
            && matches!(
                w.ending,
                Some(Ending::Signaled(s)) if s.is(Signal::SIGTERM) || s.is(Signal::SIGKILL)
            )
    };
    let stop_began = result
        .stop_began
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_secs_f64());
    let recorded_first = result
        .workers
        .iter()
        .enumerate()
        .filter(|(_, w)| w.ending.is_some_and(|e| e.code() != 0) && !ended_by_the_stop(w))
        .filter_map(|(i, w)| {
            let r = RecordedError::parse(w.recorded.as_deref()?).ok()?;
            let t = r.timestamp?;
            let before_the_stop = stop_began.is_none_or(|stop| t <= stop);
            (!w.stopped || before_the_stop).then_some((i, t))
        })
        .min_by(|a, b| {
            let w = |i: usize| &result.workers[i];
            a.1.total_cmp(&b.1)
                .then((a.0 != first).cmp(&(b.0 != first)))
                .then(w(a.0).run_time.cmp(&w(b.0).run_time))
        })
        .map(|(i, _)| i);
    Some(recorded_first.unwrap_or(first))
}

/// A restart is coming: what ended the attempt, briefly, with its root cause.
pub(crate) fn report_attempt(
    result: &JobResult,
    attempt: Option<&AttemptRecord>,
    printer: &Printer,
) {
    if let Some(a) = attempt {
        printer.status(&format!(
            "atlasboost: attempt {} ended after {:.2} s: {}",
            a.number,
            a.duration.as_secs_f64(),
            a.ended
        ));
    }
    if let Some(h) = &result.host_failure {
        // Why, in the host's (or ssh's) words, and the hosts lost with it in the launch tree.
        printer.status(&format!("atlasboost: {}: {}", h.who(), h.message));
    } else if let Some(text) = recorded_root_cause(result) {
        printer.status(&format!("atlasboost: root cause: {text}"));
    }
}

/// What the root cause of an attempt that a worker's failure ended recorded, if it did (a
/// hang's or a host's end has none).
pub(crate) fn recorded_root_cause(result: &JobResult) -> Option<String> {
    if result.hang.is_some() || result.host_failure.is_some() {
        return None;
    }
    root_cause(result).and_then(|i| recorded_text(&result.workers[i]))
}

/// What a worker recorded, as one or two lines: the error and its innermost frame.
fn recorded_text(w: &WorkerResult) -> Option<String> {
    let bytes = w.recorded.as_deref()?;
    Some(match RecordedError::parse(bytes) {
        Ok(e) => match e.innermost_frame() {
            Some(frame) => format!("rank {} recorded {}\n  at {frame}", w.rank, e.message),
            None => format!("rank {} recorded {}", w.rank, e.message),
        },
        Err(why) => format!(
            "rank {}'s error file is not a record atlasboost reads ({why})",
            w.rank
        ),
    })
}

/// A summary's table of ranks: (rank, host, device, status, time) per row, under a header;
/// the status column as wide as its longest ("stopped (status unknown)"), so that the times
/// line up.
fn rank_rows(host_width: usize, rows: &[(u32, &String, String, String, String)]) -> String {
    let status_width = rows.iter().map(|r| r.3.len()).max().unwrap_or(0).max(20);
    let mut text = format!(
        "  {:>5}  {:<host_width$}  {:>6}  {:<status_width$}  {:>9}\n",
        "rank", "host", "device", "status", "time"
    );
    for (rank, host, device, status, time) in rows {
        text.push_str(&format!(
            "  {rank:>5}  {host:<host_width$}  {device:>6}  {status:<status_width$}  {time:>9}\n"
        ));
    }
    text
}

/// The end-of-job summary on stderr: every attempt when there were restarts, the last
/// attempt's ranks, and its root cause with its last stderr lines or recorded error.
pub(crate) fn report(
    result: Option<&JobResult>,
    attempts: &[AttemptRecord],
    elapsed: Duration,
    logs: Option<&Path>,
    printer: &Printer,
) {
    let mut text = String::new();
    // The error below names the last attempt's root cause only when a worker's failure ended
    // the job (not a signal during its stop or the restart's delay, a hang, a host).
    let cause_below = result.is_some_and(|r| {
        r.interrupted.is_none()
            && r.hang.is_none()
            && r.host_failure.is_none()
            && r.first_failure.is_some()
    });
    let lone_cause = matches!(attempts, [a] if a.root_cause.is_some() && !cause_below);
    if attempts.len() > 1 || lone_cause {
        text.push_str(&format!(
            "atlasboost: {} in {:.2} s:\n",
            counted(attempts.len(), "attempt"),
            elapsed.as_secs_f64()
        ));
        for (i, a) in attempts.iter().enumerate() {
            text.push_str(&format!(
                "  attempt {}: {}, {:.2} s: {} (exit code {})\n",
                a.number,
                a.layout.as_deref().unwrap_or("no table"),
                a.duration.as_secs_f64(),
                a.ended,
                a.exit_code
            ));
            let last = i + 1 == attempts.len();
            if let Some(cause) = a.root_cause.as_ref().filter(|_| !(last && cause_below)) {
                text.push_str(&format!(
                    "    root cause: {}\n",
                    cause.replace('\n', "\n  ")
                ));
            }
        }
    }
    let Some(result) = result else {
        if let Some(dir) = logs {
            text.push_str(&format!("  logs: {}\n", dir.display()));
        }
        if !text.is_empty() {
            printer.status(text.trim_end());
        }
        return;
    };
    let interrupted = result.interrupted.is_some();
    let fates: Vec<Fate> = result
        .workers
        .iter()
        .map(|w| fate(w, interrupted))
        .collect();
    let count = |f: Fate| fates.iter().filter(|&&x| x == f).count();
    let (succeeded, failed, stopped, never) = (
        count(Fate::Succeeded),
        count(Fate::Failed),
        count(Fate::Stopped),
        count(Fate::NotStarted),
    );
    text.push_str(&format!(
        "atlasboost: {} finished in {:.2} s: {succeeded} succeeded, {failed} failed, {stopped} \
         stopped{}\n",
        counted(result.workers.len(), "rank"),
        // The last attempt's run, not the job's: a restart's delay that a signal cut short
        // is no rank's time.
        attempts
            .last()
            .map_or(elapsed, |a| a.duration)
            .as_secs_f64(),
        match never {
            0 => String::new(),
            n => format!(", {n} not started"),
        },
    ));
    let host_width = result
        .workers
        .iter()
        .map(|w| w.host.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let full = result.workers.len() <= FULL_SUMMARY_MAX;
    // (rank, host, device, status, time) of each rank shown.
    let mut rows = Vec::new();
    for (w, fate) in result.workers.iter().zip(fates) {
        // Above the limit, only the failures: not the ranks that succeeded or were stopped.
        if !full && matches!(fate, Fate::Succeeded | Fate::Stopped) {
            continue;
        }
        let status = match (fate, w.ending) {
            (_, None) => "not run".to_string(),
            (Fate::Stopped, Some(e)) => format!("stopped ({})", e.describe()),
            (_, Some(e)) => e.describe(),
        };
        // A rank that never started (under --mpi) has no device or time to show.
        let (device, time) = match fate {
            Fate::NotStarted => ("-".to_string(), "-".to_string()),
            _ => (
                w.device.to_string(),
                format!("{:.2} s", w.run_time.as_secs_f64()),
            ),
        };
        rows.push((w.rank, &w.host, device, status, time));
    }
    text.push_str(&rank_rows(host_width, &rows));
    if !full {
        text.push_str(&match stopped {
            0 => format!("  (the other {} succeeded)\n", counted(succeeded, "rank")),
            _ => format!("  (the other ranks: {succeeded} succeeded, {stopped} stopped)\n"),
        });
    }
    if let Some(dir) = logs {
        text.push_str(&format!("  logs: {}\n", dir.display()));
    }
    printer.status(text.trim_end());
    if let Some(s) = result.interrupted {
        printer.error(&format!(
            "error: stopped by {}; exit code {}",
            s.as_str(),
            result.exit_code
        ));
    } else if let Some(hang) = &result.hang {
        printer.error(&format!(
            "error: the job hung (exit code {}): {hang}",
            result.exit_code
        ));
    } else if let Some(h) = &result.host_failure {
        printer.error(&format!("error: {} failed first: {}", h.who(), h.message));
    } else if let Some(i) = result.first_failure {
        // The first failure (the job's code is its), and the root cause, which may be another
        // rank's recorded error.
        let w = &result.workers[i];
        let mut text = format!(
            "error: rank {} (host {}, device {}) failed first: {} after {:.2} s",
            w.rank,
            w.host,
            w.device,
            w.ending.map_or("?".into(), |e| e.describe()),
            w.run_time.as_secs_f64()
        );
        if let Some(why) = &w.not_run {
            text.push_str(&format!(": {why}"));
        } else if w.tail.is_empty() {
            text.push_str("; it wrote nothing on stderr");
        } else {
            text.push_str("; its last stderr lines:");
            for l in &w.tail {
                text.push_str(&format!("\n  [{}]<stderr>:{l}", w.rank));
            }
        }
        if let Some(recorded) = root_cause(result).and_then(|i| recorded_text(&result.workers[i])) {
            text.push_str(&format!("\n  root cause: {recorded}"));
        }
        printer.error(&text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ranks_table_lines_up_the_times_under_a_long_status() {
        let host = "vm".to_string();
        let rows = [
            (0, &host, "0".into(), "exit 0".into(), "1.00 s".into()),
            (
                1,
                &host,
                "1".into(),
                "stopped (status unknown)".into(),
                "2.00 s".into(),
            ),
        ];
        let text = rank_rows(4, &rows);
        let at: Vec<usize> = text
            .lines()
            .map(|l| l.rfind(" s").unwrap_or(l.len()))
            .collect();
        assert_eq!(at[1], at[2], "{text}");
        assert!(
            text.lines()
                .next()
                .is_some_and(|l| l.ends_with("     time")),
            "{text}"
        );
    }
}
