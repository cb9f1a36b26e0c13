//! The agent of one host (SPEC §6): probe, join the rendezvous, receive the cluster table,
//! write it. The launcher is the coordinator and decides the table for everyone, so every host
//! writes the same bytes.
//!
//! Local hosts run [`run_agent`] on a thread of the launcher; a remote host runs the same
//! function inside `atlasboost agent` ([`agent_main`]).

use std::collections::HashSet;
use std::ffi::OsString;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use atlasboost::host::free_port;
use atlasboost::probe::{ProbeError, local_devices, make_probe};
use atlasboost::settings::Discovery;
use atlasboost_core::exchange::{HostReport, error_chain};
use atlasboost_core::ranktable::{
    BuildOptions, HostDevices, RankOrder, RankTable, build_table_checked, chip_of_devices,
    largest_world,
};
use atlasboost_core::worker_env::{Framework, Seat, WorkerSpec, worker_env};
use atlasboost_core::{Chip, Device, EnvVars};
use atlasboost_tcp::{Combiner, ParticipantConfig, Replies, Secret, ZmqRendezvous};
use serde::{Deserialize, Serialize};

use super::channel::{self, AgentConfig, Up, WorkerSettings};
use super::lifeline;
use super::output::Output;
use super::plan::{HostPlan, Offer, assign_workers};
use super::rank_files::RankFiles;
use super::supervise::{self, RunPlan, Signals, WorkerPlan};
use crate::error::CliError;
use crate::exit::ExitCodes;

/// What an agent sends the launcher.
#[derive(Debug, Serialize, Deserialize)]
pub struct AgentReport {
    /// Its devices, or why it has none.
    pub host: HostReport,
    /// A port that was free on the host (used as `MASTER_PORT` if the host is the first node).
    pub free_port: u16,
    /// Its address on `--nic` (used as `MASTER_ADDR` if the host is the first node).
    #[serde(default)]
    pub nic_addr: Option<String>,
}

/// What the launcher answers every agent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LaunchAnswer {
    /// The cluster table, as every host writes it.
    pub table: String,
    /// The chip whose rules the table was checked against.
    pub chip: String,
    /// The first node's address.
    pub master_addr: String,
    /// A free port on the first node.
    pub master_port: u16,
    /// The SHA-256 of `table`, in hex: every host checks the bytes it writes against it.
    #[serde(default)]
    pub sha256: String,
}

/// How the launcher turns the agents' reports into the table.
#[derive(Debug, Clone)]
pub struct TablePolicy {
    /// The hosts, by rendezvous index.
    pub hosts: Vec<HostPlan>,
    /// `-n`.
    pub np: Option<u32>,
    /// Format and order (`RankOrder::Hosts` is filled in from `hosts`).
    pub build: BuildOptions,
    /// A restart's re-planning: what the hosts still have decides the world, within bounds.
    pub shrink: Option<Shrink>,
}

/// How far a restart may shrink the job (SPEC §12).
#[derive(Debug, Clone)]
pub struct Shrink {
    /// The smallest world allowed (`--min-np`, or the first attempt's size).
    pub min: u64,
    /// Whether the user gave `--min-np`.
    pub min_given: bool,
    /// The largest: the first attempt's size.
    pub max: u64,
    /// Hosts left out already (lost earlier), for the message.
    pub left_out: Vec<String>,
}

/// The coordinator's combiner of a launch: one round, in which every agent reports and all
/// receive the same [`LaunchAnswer`].
///
/// What it decided (the answer, and the devices that run a worker) is also left in `decided`,
/// for the launcher, which may have no local host of its own.
pub fn launch_combiner(policy: TablePolicy, decided: Arc<Mutex<Option<Decision>>>) -> Combiner {
    launch_combiner_with(policy, decided, Vec::new(), None)
}

/// [`launch_combiner`] for a launch whose local hosts reported in-process: the coordinator's
/// participants are the remote hosts only (participant `i` is host `remote_index[i]`), and
/// `local` holds the other hosts' reports, by host index.
pub fn launch_combiner_with(
    policy: TablePolicy,
    decided: Arc<Mutex<Option<Decision>>>,
    local: Vec<(usize, Vec<u8>)>,
    remote_index: Option<Vec<usize>>,
) -> Combiner {
    Box::new(move |_, payloads| {
        let merged;
        let payloads = match &remote_index {
            None => payloads,
            Some(index) => {
                merged = merge_reports(policy.hosts.len(), &local, index, payloads);
                &merged
            }
        };
        let decision = decide(&policy, payloads)?;
        let reply = serde_json::to_vec(&decision.answer)
            .map_err(|e| format!("cannot encode the answer: {e}"))?;
        *decided.lock().unwrap_or_else(|p| p.into_inner()) = Some(decision);
        Ok(Replies::Same(reply))
    })
}

/// The SHA-256 of `bytes`, in lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Writes the decided table to `path` atomically, then reads it back and checks its SHA-256
/// against the launcher's: every host's copy is byte-identical, or the launch fails naming
/// the path.
///
/// # Errors
///
/// The writer's; [`CliError::Failure`] when the bytes on disk are not the launcher's.
pub fn write_checked(path: &Path, answer: &LaunchAnswer) -> Result<(), CliError> {
    if sha256_hex(answer.table.as_bytes()) != answer.sha256 {
        return Err(CliError::Failure(format!(
            "the rank table received does not match the launcher's SHA-256 {}",
            answer.sha256
        )));
    }
    atlasboost_core::ranktable::write_atomically(path, answer.table.as_bytes())?;
    let on_disk = std::fs::read(path).map_err(CliError::file("read back the rank table", path))?;
    let got = sha256_hex(&on_disk);
    if got != answer.sha256 {
        return Err(CliError::Failure(format!(
            "{} holds a table whose SHA-256 is {got}, not the launcher's {}: another writer, \
             or a file system that lost the write",
            path.display(),
            answer.sha256
        )));
    }
    Ok(())
}

/// Every host's report in host order: the local ones and the remote participants'.
fn merge_reports(
    hosts: usize,
    local: &[(usize, Vec<u8>)],
    remote_index: &[usize],
    remote: &[Vec<u8>],
) -> Vec<Vec<u8>> {
    let mut all = vec![Vec::new(); hosts];
    for (i, bytes) in local {
        all[*i].clone_from(bytes);
    }
    for (i, bytes) in remote_index.iter().zip(remote) {
        all[*i].clone_from(bytes);
    }
    all
}

/// What the launcher decided in the rendezvous.
#[derive(Debug, Clone)]
pub struct Decision {
    /// What every host received.
    pub answer: LaunchAnswer,
    /// The devices that run a worker, on every host.
    pub devices: Vec<Device>,
    /// What HCCL only recommends and the table does not do (errors are refused).
    pub warnings: Vec<String>,
    /// The table itself, as built and checked (`answer.table` is its JSON).
    pub table: RankTable,
}

/// Builds the table from every host's report, in host order: the first failed probe fails the
/// launch, naming its host. (The combiner's work, and the launcher's own when every host is
/// local and no coordinator runs.)
pub fn decide(policy: &TablePolicy, payloads: &[Vec<u8>]) -> Result<Decision, String> {
    let mut offers = Vec::with_capacity(payloads.len());
    let mut ports = Vec::with_capacity(payloads.len());
    // A restart leaves out a host whose probe fails now, as it does a lost one.
    let mut unprobed = Vec::new();
    for (host, bytes) in policy.hosts.iter().zip(payloads) {
        let report: AgentReport = serde_json::from_slice(bytes).map_err(|e| {
            format!(
                "host {} sent a report atlasboost cannot read: {e}",
                host.describe()
            )
        })?;
        match report.host {
            HostReport::Devices(devices) => offers.push(Offer {
                host: host.describe(),
                slots: host.slots,
                devices,
            }),
            HostReport::ProbeFailed { message, .. } if policy.shrink.is_some() => {
                unprobed.push(format!(
                    "host {} (its probe failed: {message})",
                    host.describe()
                ));
            }
            HostReport::ProbeFailed { message, .. } => {
                return Err(format!("host {}: {message}", host.describe()));
            }
        }
        ports.push((host.server_id.clone(), report.free_port, report.nic_addr));
    }
    let devices = match &policy.shrink {
        None => assign_workers(offers, policy.np)?,
        Some(shrink) => replan(offers, shrink, unprobed)?,
    };
    let mut build = policy.build.clone();
    if let RankOrder::Hosts(order) = &mut build.order {
        *order = policy
            .hosts
            .iter()
            .filter(|h| devices.iter().any(|d| d.server_id == h.server_id))
            .map(|h| h.server_id.clone())
            .collect();
    }
    let chip = chip_of_devices(&devices).map_err(|e| error_chain(&e))?;
    let (table, warnings) = build_table_checked(&devices, &build).map_err(|e| error_chain(&e))?;
    let warnings = warnings.iter().map(ToString::to_string).collect();
    let first = table
        .ranks()
        .map_err(|e| error_chain(&e))?
        .into_iter()
        .find(|r| r.node_rank == 0)
        .map(|r| r.server_id)
        .ok_or("the table has no ranks")?;
    let (master_port, nic_addr) = ports
        .iter()
        .find(|(s, _, _)| *s == first)
        .map_or((0, None), |(_, p, a)| (*p, a.clone()));
    let json = table.to_json_pretty();
    Ok(Decision {
        answer: LaunchAnswer {
            sha256: sha256_hex(json.as_bytes()),
            table: json,
            chip: chip.as_str().to_string(),
            master_addr: nic_addr.unwrap_or(first),
            master_port,
        },
        devices,
        warnings,
        table,
    })
}

/// A restart's world: the largest the chip's rules allow on what the hosts still have, or why
/// there is none of at least `shrink.min`.
fn replan(
    offers: Vec<Offer>,
    shrink: &Shrink,
    unprobed: Vec<String>,
) -> Result<Vec<Device>, String> {
    let all: Vec<Device> = offers.iter().flat_map(|o| o.devices.clone()).collect();
    let chip = chip_of_devices(&all).map_err(|e| error_chain(&e))?;
    let hosts: Vec<HostDevices> = offers
        .into_iter()
        .map(|o| HostDevices {
            server_id: o
                .devices
                .first()
                .map(|d| d.server_id.clone())
                .unwrap_or(o.host),
            cap: o.slots.map(|s| s as usize),
            devices: o.devices,
        })
        .collect();
    let world = largest_world(chip, &hosts, Some(shrink.max));
    if world.len() as u64 >= shrink.min {
        return Ok(world);
    }
    let mut left_out: Vec<String> = shrink
        .left_out
        .iter()
        .map(|h| format!("host {h} (lost or failed earlier)"))
        .collect();
    left_out.extend(unprobed);
    left_out.extend(all.iter().filter(|d| !d.health.is_healthy()).map(|d| {
        format!(
            "device {} of host {} ({})",
            d.physical_id, d.server_id, d.health
        )
    }));
    let servers = {
        let mut ids: Vec<&str> = world.iter().map(|d| d.server_id.as_str()).collect();
        ids.dedup();
        ids.len()
    };
    let largest = match world.len() {
        0 => "no valid world is left".to_string(),
        n => format!(
            "the largest valid world left is {} on {} under the {chip} rules",
            crate::commands::counted(n, "rank"),
            crate::commands::counted(servers, "server")
        ),
    };
    let without = match left_out.is_empty() {
        true => String::new(),
        false => format!(" without {}", left_out.join(", ")),
    };
    Err(if shrink.min_given {
        format!(
            "cannot restart: {largest}{without}, fewer than --min-np {}",
            shrink.min
        )
    } else {
        format!(
            "cannot restart: the job would need to shrink from {} to {} ranks ({largest}{without}); \
             pass --min-np to let a restart shrink it",
            shrink.max,
            world.len()
        )
    })
}

/// Everything one agent needs.
#[derive(Debug, Clone)]
pub struct AgentJob {
    /// Its index in the rendezvous (the host's position in the host list).
    pub index: usize,
    /// The number of hosts.
    pub hosts: usize,
    /// Its host's server id.
    pub server_id: String,
    /// How to find devices.
    pub discovery: Discovery,
    /// The coordinator.
    pub endpoint: String,
    /// The job's id.
    pub job_id: String,
    /// The job's secret.
    pub secret: Secret,
    /// How long to wait for the launcher's answer.
    pub timeout: Duration,
    /// Where to write the table (absolute).
    pub table_path: PathBuf,
    /// `--nic`: the host's address on it is reported (for `MASTER_ADDR`).
    pub nic: Option<atlasboost::host::NicChoice>,
}

/// What an agent has once the table is written.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The cluster table.
    pub table: RankTable,
    /// The launcher's answer (first node, port).
    pub answer: LaunchAnswer,
    /// This host's devices (for their logical ids).
    pub devices: Vec<Device>,
}

/// Runs one host's agent up to the point where its workers can start.
///
/// `written` lists tables already written by agents of this process: several local hosts
/// share one file system and write the table once.
///
/// # Errors
///
/// The rendezvous's error (which names the failing host when another host failed), a table
/// that does not parse, or one that cannot be written.
pub fn run_agent(job: &AgentJob, written: &Mutex<HashSet<PathBuf>>) -> Result<Prepared, CliError> {
    let (report, devices) = host_report(&job.discovery, &job.server_id, job.nic.as_ref())?;
    let payload = serde_json::to_vec(&report).map_err(CliError::json("encode the host report"))?;
    let mut rdv = ZmqRendezvous::connect(ParticipantConfig::new(
        &job.endpoint,
        job.index,
        job.hosts,
        &job.job_id,
        job.secret.clone(),
        job.timeout,
    ))
    .map_err(atlasboost_core::Error::from)?;
    let bytes = rdv
        .exchange(&payload)
        .map_err(atlasboost_core::Error::from)?;
    let answer: LaunchAnswer =
        serde_json::from_slice(&bytes).map_err(CliError::json("read the launcher's answer"))?;
    let chip: Chip = answer.chip.parse()?;
    let table = RankTable::parse(&answer.table, Path::new("<the launcher's answer>"), chip)?;
    let mut done = written.lock().unwrap_or_else(|p| p.into_inner());
    if done.insert(job.table_path.clone()) {
        write_checked(&job.table_path, &answer)?;
    }
    drop(done);
    Ok(Prepared {
        table,
        answer,
        devices: devices.unwrap_or_default(),
    })
}

/// One host's report: its probe's devices (or why there are none), a free port, its `--nic`
/// address; and the devices, for the host's workers.
///
/// # Errors
///
/// A `--nic` this host has no interface for (exit 2).
pub fn host_report(
    discovery: &Discovery,
    server_id: &str,
    nic: Option<&atlasboost::host::NicChoice>,
) -> Result<(AgentReport, Result<Vec<Device>, ProbeError>), CliError> {
    let devices = probe(discovery, server_id);
    let host = match &devices {
        Ok(d) => HostReport::Devices(d.clone()),
        Err(e) => HostReport::ProbeFailed {
            server_id: server_id.to_string(),
            message: error_chain(e),
        },
    };
    let nic_addr = match nic {
        Some(choice) => Some(
            atlasboost::host::find_nic(choice)
                .map_err(|e| CliError::Usage(format!("--nic {choice}: {e}")))?
                .ipv4
                .to_string(),
        ),
        None => None,
    };
    let report = AgentReport {
        host,
        free_port: free_port(server_id),
        nic_addr,
    };
    Ok((report, devices))
}

fn probe(discovery: &Discovery, server_id: &str) -> Result<Vec<Device>, ProbeError> {
    let probe = make_probe(discovery, server_id)?;
    local_devices(probe.as_ref(), discovery.devices.as_ref())
}

/// One host's part of the decided job.
#[derive(Debug)]
pub struct HostPart<'a> {
    /// Its server id.
    pub server_id: &'a str,
    /// Its name, for messages.
    pub host: &'a str,
    /// Its seats in the table.
    pub seats: Vec<Seat>,
    /// Its devices, as its probe found them (for their logical ids).
    pub devices: &'a [Device],
    /// The launcher's answer (first node, port).
    pub answer: &'a LaunchAnswer,
}

impl<'a> HostPart<'a> {
    /// The part of host `server_id` of a whole table (for one host: the whole table is walked).
    ///
    /// # Errors
    ///
    /// The table's, when an id is not a number.
    pub fn of(
        prepared: &'a Prepared,
        server_id: &'a str,
        host: &'a str,
    ) -> Result<HostPart<'a>, CliError> {
        Ok(HostPart {
            server_id,
            host,
            seats: Seat::all(&prepared.table)?
                .into_iter()
                .filter(|s| s.server_id == server_id)
                .collect(),
            devices: &prepared.devices,
            answer: &prepared.answer,
        })
    }
}

/// The workers of one host: one per table entry of the host, in rank order, with their
/// environment (SPEC §9; `inherited` says which variables the worker inherits, for the ones
/// set only when unset). Nothing here walks the whole table: a launcher with thousands of
/// local hosts calls it once per host.
///
/// # Errors
///
/// The table's or the environment's errors (a table that does not name this host's devices).
pub fn host_workers(
    part: HostPart<'_>,
    settings: &WorkerSettings,
    job_id: &str,
    inherited: &dyn Fn(&str) -> bool,
) -> Result<Vec<WorkerPlan>, CliError> {
    let framework: Framework = settings.framework.parse()?;
    let (server_id, host) = (part.server_id, part.host);
    let mut seats = part.seats;
    seats.sort_by_key(|s| s.world.local_rank);
    let logical_of = |physical: u32| {
        part.devices
            .iter()
            .find(|d| d.physical_id == physical)
            .map_or(physical, |d| d.logical_id)
    };
    let visible = runtime_visible(
        &seats
            .iter()
            .map(|s| logical_of(s.physical_id))
            .collect::<Vec<_>>(),
        inherited_runtime_visible()?.as_deref(),
    );
    let nic =
        atlasboost::host::JobNic::find(settings.nic.as_deref(), server_id).map_err(|why| {
            CliError::Usage(format!(
                "--nic {}: {why}",
                settings.nic.as_deref().unwrap_or("")
            ))
        })?;
    let mut cores = match settings.bind_cores {
        true => bind_cores(&seats, host)?.into_iter().map(Some).collect(),
        false => vec![None; seats.len()],
    }
    .into_iter();
    let mut workers = Vec::new();
    for seat in seats {
        let logical_id = logical_of(seat.physical_id);
        // With ASCEND_RT_VISIBLE_DEVICES listing this host's job devices in local-rank order,
        // the runtime numbers them 0..n-1: device LOCAL_RANK is the table's device, whatever
        // a script selects it by (set_device(LOCAL_RANK), DEVICE_ID, ASCEND_DEVICE_ID).
        let env = worker_env(&WorkerSpec {
            seat: &seat,
            table_path: &settings.rank_table,
            logical_id: seat.world.local_rank,
            framework,
            job_id,
            master_addr: &part.answer.master_addr,
            master_port: part.answer.master_port,
        })?;
        let mut vars: Vec<(OsString, OsString)> = env
            .set
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        let (count, max) = (
            settings.restart_count.to_string(),
            settings.max_restarts.to_string(),
        );
        vars.push((
            EnvVars::ATLASBOOST_RESTART_COUNT.into(),
            count.clone().into(),
        ));
        vars.push((EnvVars::ATLASBOOST_MAX_RESTARTS.into(), max.clone().into()));
        if framework == Framework::Pytorch {
            vars.push((EnvVars::TORCHELASTIC_RESTART_COUNT.into(), count.into()));
            vars.push((EnvVars::TORCHELASTIC_MAX_RESTARTS.into(), max.into()));
        }
        vars.extend(
            env.set_if_unset
                .into_iter()
                .filter(|(k, _)| !inherited(k) && !settings.env.iter().any(|(n, _)| n == k))
                .map(|(k, v)| (k.into(), v.into())),
        );
        if let Some(nic) = &nic {
            for (k, v) in nic.vars(server_id) {
                // `--nic` sets them; without it they are a default the user's own win over.
                if nic.explicit || (!inherited(k) && !settings.env.iter().any(|(n, _)| n == k)) {
                    vars.push((k.into(), v.into()));
                }
            }
        }
        // What the user exports wins over what atlasboost would set, except the devices'
        // view, which must match the table (the launcher's own was composed into it above).
        vars.extend(
            settings
                .env
                .iter()
                .filter(|(k, _)| k != EnvVars::ASCEND_RT_VISIBLE_DEVICES)
                .cloned(),
        );
        vars.push((
            EnvVars::ASCEND_RT_VISIBLE_DEVICES.into(),
            visible.clone().into(),
        ));
        workers.push(WorkerPlan {
            rank: env.world.rank,
            host: host.to_string(),
            device: logical_id,
            env: vars,
            local: true,
            cpus: cores.next().flatten(),
        });
    }
    workers.sort_by_key(|w| w.rank);
    Ok(workers)
}

/// `--bind-cores`: each worker's CPUs, in local-rank order, from its NPU's affinity (the
/// driver's DCMI library) when it loads, else an even split of this process's allowed CPUs.
///
/// # Errors
///
/// Too few CPUs, or a DCMI call that fails, naming the host.
fn bind_cores(seats: &[Seat], host: &str) -> Result<Vec<Vec<usize>>, CliError> {
    let physical: Vec<u32> = seats.iter().map(|s| s.physical_id).collect();
    atlasboost::cores::host_plan(&physical)
        .map_err(|why| CliError::Failure(format!("--bind-cores: host {host}: {why}")))
}

/// `ASCEND_RT_VISIBLE_DEVICES` for a host's workers: the driver's logical ids of its job
/// devices, in local-rank order. `logical` are the ids the probe reported; when the launcher
/// (or agent) itself ran under an `ASCEND_RT_VISIBLE_DEVICES`, the probe renumbered the listed
/// devices 0..n-1 in ascending order, so each id is mapped back through that list.
pub fn runtime_visible(logical: &[u32], inherited: Option<&[u32]>) -> String {
    let mut sorted: Vec<u32> = inherited.map(<[u32]>::to_vec).unwrap_or_default();
    sorted.sort_unstable();
    logical
        .iter()
        .map(|&l| {
            sorted
                .get(l as usize)
                .copied()
                .filter(|_| inherited.is_some())
                .unwrap_or(l)
                .to_string()
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The `ASCEND_RT_VISIBLE_DEVICES` the probe of this host ran under: this process's own (the
/// launcher's for its local hosts, the agent's on a remote one). One the launcher forwards to
/// remote workers is not what their agent's probe saw, and is replaced.
fn inherited_runtime_visible() -> Result<Option<Vec<u32>>, CliError> {
    let name = EnvVars::ASCEND_RT_VISIBLE_DEVICES;
    let value = std::env::var_os(name).filter(|v| !v.is_empty());
    let Some(value) = value else {
        return Ok(None);
    };
    let text = value.to_string_lossy();
    atlasboost_core::parse_id_list(&text, "logical device", 64)
        .map(Some)
        .map_err(|why| CliError::Usage(format!("{name}={text:?}: {why}")))
}

/// `atlasboost agent`: the remote side of a launch. Reads its [`AgentConfig`] from the first
/// line of standard input, then speaks the [`channel`] protocol on standard
/// output until its workers are done. Returns its exit code.
pub fn agent_main() -> u8 {
    let mut up = std::io::stdout().lock();
    let mut say = |m: &Up| {
        let mut frame = Vec::new();
        channel::encode(m, &mut frame);
        let _ = up.write_all(&frame).and_then(|()| up.flush());
    };
    let mut line = String::new();
    let config: AgentConfig = match std::io::stdin().lock().read_line(&mut line) {
        Ok(n) if n > 0 => match serde_json::from_str(&line) {
            Ok(c) => c,
            Err(e) => {
                let _ = writeln!(
                    std::io::stderr(),
                    "atlasboost agent: the configuration on standard input is not valid: {e}"
                );
                return ExitCodes::USAGE;
            }
        },
        _ => {
            let _ = writeln!(
                std::io::stderr(),
                "atlasboost agent: no configuration on standard input; this command is started \
                 by `atlasboost run`, not by hand"
            );
            return ExitCodes::USAGE;
        }
    };
    drop(line);
    let hello = {
        let mut out = std::io::stdout().lock();
        out.write_all(channel::HELLO).and_then(|()| out.flush())
    };
    if hello.is_err() {
        return ExitCodes::FAILURE;
    }
    match run_remote(&config) {
        Ok(code) => code,
        Err(e) => {
            let code = e.exit_code();
            say(&Up::Failed {
                code,
                message: error_chain(&e),
            });
            code
        }
    }
}

/// Until the returned flag is set, a thread watches standard input: if the launcher's end
/// closes (the launcher was killed while the hosts were joining), the agent exits at once
/// instead of waiting out the rendezvous timeout. It only polls; it reads nothing.
fn watch_for_hang_up() -> Arc<AtomicBool> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;

    let joined = Arc::new(AtomicBool::new(false));
    let done = Arc::clone(&joined);
    let spawned = std::thread::Builder::new()
        .name("hang-up watch".into())
        .spawn(move || {
            let stdin = std::io::stdin();
            while !done.load(Ordering::Acquire) {
                // No event is asked for: poll still reports the hang-up (POLLHUP: the pipe's
                // writer, or the socket's peer, is gone). Input is never read here, it is the
                // supervisor's, so data waiting does not wake this loop.
                let mut fds = [PollFd::new(stdin.as_fd(), PollFlags::empty())];
                let events = match poll(&mut fds, PollTimeout::from(100u8)) {
                    Ok(n) if n > 0 => fds[0].revents().unwrap_or(PollFlags::empty()),
                    _ => continue,
                };
                if events.contains(PollFlags::POLLHUP) {
                    // Best effort: stderr went with the launcher (`eprintln!` would panic).
                    let _ = writeln!(
                        std::io::stderr(),
                        "atlasboost agent: the launcher's connection closed while the hosts \
                         were joining; exiting"
                    );
                    std::process::exit(i32::from(ExitCodes::FAILURE));
                }
                // POLLERR or POLLNVAL: nothing to watch; the rendezvous timeout still applies.
                break;
            }
        });
    if spawned.is_err() {
        // Without the watch, the rendezvous timeout still ends the wait.
        joined.store(true, Ordering::Release);
    }
    joined
}

/// The agent's work once it has its configuration.
fn run_remote(config: &AgentConfig) -> Result<u8, CliError> {
    let settings = &config.workers;
    if !settings.wdir.is_dir() {
        return Err(CliError::NoWorkerDir {
            path: settings.wdir.clone(),
        });
    }
    // Before the rendezvous: a host whose table path another job holds fails the job before
    // any worker starts anywhere.
    let launcher = Some(config.launcher.as_str()).filter(|l| !l.is_empty());
    let _table_lock = super::job::lock_table(&settings.rank_table, &config.job_id, launcher)?;
    let secret = Secret::from_hex(&config.secret)
        .ok_or_else(|| CliError::Usage("the job's secret is not hex".into()))?;
    let signals = Signals::block()?;
    let mut lifeline = lifeline::prepare()?;
    let job = AgentJob {
        index: config.index,
        hosts: config.hosts,
        server_id: config.server_id.clone(),
        discovery: config.discovery.clone(),
        endpoint: config.endpoint.clone(),
        job_id: config.job_id.clone(),
        secret,
        timeout: Duration::from_millis(config.timeout_ms),
        table_path: settings.rank_table.clone(),
        nic: settings
            .nic
            .as_deref()
            .map(str::parse)
            .transpose()
            .map_err(|why: String| CliError::Usage(format!("--nic: {why}")))?,
    };
    let joined = watch_for_hang_up();
    let prepared = run_agent(&job, &Mutex::new(HashSet::new()));
    joined.store(true, Ordering::Release);
    let prepared = prepared?;
    let workers = host_workers(
        HostPart::of(&prepared, &config.server_id, &config.host)?,
        settings,
        &config.job_id,
        &|k| std::env::var_os(k).is_some(),
    )?;
    let mut output = Output::upstream(&workers.iter().map(|w| w.rank).collect::<Vec<_>>())?;
    let files = RankFiles::create(&config.job_id)?;
    output.send(&Up::Ready);
    let plan = RunPlan {
        command: settings.command.clone(),
        wdir: settings.wdir.clone(),
        grace: Duration::from_millis(settings.grace_ms),
        files: Some(files.clone()),
        watch: settings.watch,
        hang: None,
        pytorch: settings.framework.parse::<Framework>()? == Framework::Pytorch,
    };
    let upstream = supervise::Upstream::stdin()?;
    let result = supervise::run_workers(
        &plan,
        &workers,
        &mut output,
        &signals,
        &mut lifeline,
        supervise::Role::Agent(upstream),
    );
    lifeline.close();
    files.remove();
    result?;
    output.send(&Up::Done);
    Ok(ExitCodes::SUCCESS)
}

#[cfg(test)]
mod tests {
    use atlasboost_core::DeviceProbe;
    use atlasboost_sim::SimProbe;

    use super::*;

    fn host(ip: &str, slots: Option<u32>) -> HostPlan {
        HostPlan {
            name: ip.into(),
            server_id: ip.into(),
            slots,
            local: true,
        }
    }

    fn report(ip: &str, devices: u32, port: u16) -> Vec<u8> {
        let devices = SimProbe::new(ip, devices).probe().unwrap();
        serde_json::to_vec(&AgentReport {
            host: HostReport::Devices(devices),
            free_port: port,
            nic_addr: None,
        })
        .unwrap()
    }

    fn policy(hosts: Vec<HostPlan>, np: Option<u32>, order: RankOrder) -> TablePolicy {
        TablePolicy {
            hosts,
            np,
            build: BuildOptions {
                order,
                ..BuildOptions::default()
            },
            shrink: None,
        }
    }

    fn decide_answer(policy: &TablePolicy, payloads: &[Vec<u8>]) -> Result<LaunchAnswer, String> {
        decide(policy, payloads).map(|d| d.answer)
    }

    fn servers(answer: &LaunchAnswer) -> Vec<(String, usize)> {
        let table: serde_json::Value = serde_json::from_str(&answer.table).unwrap();
        table["server_list"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["server_id"].as_str().unwrap().to_string(),
                    s["device"].as_array().unwrap().len(),
                )
            })
            .collect()
    }

    #[test]
    fn the_table_follows_slots_and_the_host_order() {
        let hosts = vec![host("127.0.0.2", Some(4)), host("127.0.0.1", None)];
        let payloads = [report("127.0.0.2", 8, 2002), report("127.0.0.1", 4, 2001)];

        let by_id = decide(&policy(hosts.clone(), None, RankOrder::ServerId), &payloads)
            .unwrap()
            .answer;
        assert_eq!(
            servers(&by_id),
            vec![("127.0.0.1".into(), 4), ("127.0.0.2".into(), 4)]
        );
        // The first node of the table gives MASTER_ADDR, and its own free port.
        assert_eq!(
            (by_id.master_addr.as_str(), by_id.master_port),
            ("127.0.0.1", 2001)
        );

        let listed = decide_answer(
            &policy(hosts, None, RankOrder::Hosts(Vec::new())),
            &payloads,
        )
        .unwrap();
        assert_eq!(
            servers(&listed),
            vec![("127.0.0.2".into(), 4), ("127.0.0.1".into(), 4)]
        );
        assert_eq!(
            (listed.master_addr.as_str(), listed.master_port),
            ("127.0.0.2", 2002)
        );
    }

    #[test]
    fn a_table_is_written_only_with_the_launchers_sha256() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.json");
        let mut answer = LaunchAnswer {
            table: "{\"version\": \"1.0\"}".into(),
            chip: "910".into(),
            master_addr: "10.0.0.1".into(),
            master_port: 1,
            sha256: String::new(),
        };
        answer.sha256 = sha256_hex(answer.table.as_bytes());
        write_checked(&path, &answer).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), answer.table);
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        answer.table.push(' ');
        let e = write_checked(&path, &answer).unwrap_err().to_string();
        assert!(e.contains("does not match the launcher's SHA-256"), "{e}");
    }

    #[test]
    fn the_runtime_view_lists_the_drivers_ids_in_local_rank_order() {
        assert_eq!(runtime_visible(&[4, 5, 6, 7], None), "4,5,6,7");
        // The probe ran under ASCEND_RT_VISIBLE_DEVICES=6,2,7: it saw 2, 6, 7 as 0, 1, 2.
        assert_eq!(runtime_visible(&[1, 2], Some(&[6, 2, 7])), "6,7");
        assert_eq!(runtime_visible(&[], None), "");
    }

    #[test]
    fn a_host_left_without_workers_is_not_in_the_table() {
        let hosts = vec![host("127.0.0.1", Some(2)), host("127.0.0.2", Some(2))];
        let payloads = [report("127.0.0.1", 8, 1), report("127.0.0.2", 8, 2)];
        let answer = decide_answer(
            &policy(hosts, Some(2), RankOrder::Hosts(Vec::new())),
            &payloads,
        )
        .unwrap();
        assert_eq!(servers(&answer), vec![("127.0.0.1".into(), 2)]);
    }

    #[test]
    fn a_failed_probe_or_a_garbled_report_names_its_host() {
        let hosts = vec![host("127.0.0.1", None), host("127.0.0.2", None)];
        let failed = serde_json::to_vec(&AgentReport {
            host: HostReport::ProbeFailed {
                server_id: "127.0.0.2".into(),
                message: "the driver said no".into(),
            },
            free_port: 0,
            nic_addr: None,
        })
        .unwrap();
        let why = decide_answer(
            &policy(hosts.clone(), None, RankOrder::ServerId),
            &[report("127.0.0.1", 2, 1), failed],
        )
        .unwrap_err();
        assert_eq!(why, "host 127.0.0.2: the driver said no");

        let why = decide_answer(
            &policy(hosts, None, RankOrder::ServerId),
            &[report("127.0.0.1", 2, 1), b"{not json".to_vec()],
        )
        .unwrap_err();
        assert!(
            why.starts_with("host 127.0.0.2 sent a report atlasboost cannot read"),
            "{why}"
        );
    }

    #[test]
    fn an_agent_writes_the_table_the_launcher_decided() {
        use atlasboost_tcp::{Coordinator, CoordinatorConfig};

        let dir = tempfile::tempdir().unwrap();
        let secret = Secret::random().unwrap();
        let timeout = Duration::from_secs(20);
        let hosts = vec![host("127.0.0.1", Some(2)), host("127.0.0.2", Some(2))];
        let coordinator = Coordinator::start_with(
            CoordinatorConfig::new("tcp://127.0.0.1:0", 2, "t", secret.clone(), timeout),
            launch_combiner(
                policy(hosts.clone(), None, RankOrder::ServerId),
                Arc::default(),
            ),
        )
        .unwrap();
        let written = Mutex::new(HashSet::new());
        let path = dir.path().join("table.json");
        let results: Vec<Result<Prepared, CliError>> = std::thread::scope(|s| {
            let handles: Vec<_> = hosts
                .iter()
                .enumerate()
                .map(|(index, h)| {
                    let job = AgentJob {
                        index,
                        hosts: 2,
                        server_id: h.server_id.clone(),
                        discovery: Discovery {
                            probe: atlasboost::settings::ProbeKind::Sim,
                            sim: Some(4),
                            ..Discovery::defaults(atlasboost::settings::Origin::CommandLine)
                        },
                        endpoint: coordinator.endpoint().to_string(),
                        job_id: "t".into(),
                        secret: secret.clone(),
                        timeout,
                        table_path: path.clone(),
                        nic: None,
                    };
                    let written = &written;
                    s.spawn(move || run_agent(&job, written))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let prepared: Vec<Prepared> = results.into_iter().map(Result::unwrap).collect();
        let on_disk = std::fs::read_to_string(&path).unwrap();
        assert_eq!(on_disk, prepared[0].answer.table);
        assert_eq!(prepared[0].table.rank_count(), 4);
        assert_eq!(
            prepared[1].devices.len(),
            4,
            "the probe's devices, before slots"
        );
        assert_eq!(
            written.lock().unwrap().len(),
            1,
            "one file system, one write"
        );
    }
}
