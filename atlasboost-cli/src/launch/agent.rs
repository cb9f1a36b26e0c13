//! The agent of one host (SPEC §6, §14): probe, report up the launch tree, receive the
//! launcher's decision, build the table from it and write it, start and watch the host's
//! workers. The launcher decides the table for everyone, so every host writes the same bytes
//! (checked by SHA-256).
//!
//! Local hosts are probed by the launcher itself ([`host_report`]) and their workers planned
//! with [`host_workers`]; a remote host runs `atlasboost agent` ([`agent_main`]), which also
//! starts the agents of the hosts below it in the launch tree and passes their messages up.

use std::ffi::OsString;
use std::io::{BufRead, Write};
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use atlasboost::host::free_master_port;
use atlasboost::probe::{ProbeError, local_devices, make_probe};
use atlasboost::settings::Discovery;
use atlasboost_core::compact;
use atlasboost_core::exchange::{HostReport, error_chain};
use atlasboost_core::ranktable::{
    BuildOptions, HostDevices, RankOrder, RankTable, Rule, build_table_checked, chip_or_reported,
    largest_world, without_own_address,
};
use atlasboost_core::worker_env::{Framework, Seat, WorkerSpec, worker_env};
use atlasboost_core::{Chip, Device, EnvVars};
use serde::{Deserialize, Serialize};

use super::channel::{self, AgentConfig, Down, Tree, TreeBelow, TreeHost, Up, WorkerSettings};
use super::lifeline::{self, CgroupWanted};
use super::monitor::{HostMonitor, MonitorPlan};
use super::output::Output;
use super::plan::{HostPlan, Offer, assign_workers};
use super::rank_files::RankFiles;
use super::remote::Remote;
use super::ssh_connect;
use super::supervise::{self, RunPlan, Signals, Upstream, WorkerPlan};
use crate::error::CliError;
use crate::exit::ExitCodes;

/// What an agent sends the launcher.
#[derive(Debug, Clone, Serialize, Deserialize)]
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

/// How far a restart may shrink the job (SPEC §12), or, with `--min-np`, the first attempt
/// when it must (an unhealthy device, a host whose probe fails).
#[derive(Debug, Clone)]
pub struct Shrink {
    /// The smallest world allowed (`--min-np`, or the first attempt's size).
    pub min: u64,
    /// Whether the user gave `--min-np`.
    pub min_given: bool,
    /// The largest: the first attempt's size (`-n`, or no bound, for the first attempt).
    pub max: u64,
    /// Hosts left out already (lost earlier), for the message.
    pub left_out: Vec<String>,
    /// A restart (re-planned always), not the first attempt (planned only when it must be).
    pub restart: bool,
    /// The server ids of the last attempt's table: between worlds of one size, a restart keeps
    /// its ranks there (their files, caches and checkpoints) rather than move them to a host
    /// that has healed meanwhile.
    pub previous: Vec<String>,
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
    /// How it was built (with the host order filled in): what the hosts build it from too.
    pub build: BuildOptions,
    /// The hosts a restart leaves out because their probe fails now, and why (as
    /// [`HostPlan::describe`] names them).
    pub unprobed: Vec<(String, String)>,
    /// What a re-planned world leaves out of what the probed hosts offer (unhealthy devices,
    /// usable ones the chip's rules leave idle), one entry each, for the console.
    pub left_out: Vec<String>,
}

/// Why no table was decided, with the hosts whose probe failed: a restart leaves them out,
/// and says so in its events, even when it then cannot go on.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Undecided {
    /// Why, naming what is missing.
    pub message: String,
    /// Each host whose probe failed, and why (as [`Decision::unprobed`]).
    pub unprobed: Vec<(String, String)>,
}

/// Builds the table from every host's report, in host order: the first failed probe fails the
/// launch, naming its host. The launcher's work, once every host reported.
pub fn decide(policy: &TablePolicy, reports: Vec<AgentReport>) -> Result<Decision, Undecided> {
    let unprobed = match policy.shrink {
        Some(_) => policy
            .hosts
            .iter()
            .zip(&reports)
            .filter_map(|(host, report)| match &report.host {
                HostReport::ProbeFailed { message, .. } => Some(probe_failure(host, message)),
                HostReport::Devices(_) => None,
            })
            .collect(),
        None => Vec::new(),
    };
    decide_table(policy, reports).map_err(|message| Undecided { message, unprobed })
}

impl From<Undecided> for CliError {
    fn from(u: Undecided) -> CliError {
        CliError::Undecided {
            message: u.message,
            unprobed: u.unprobed,
        }
    }
}

/// A host whose probe failed, as [`Decision::unprobed`] lists it.
fn probe_failure(host: &HostPlan, message: &str) -> (String, String) {
    (host.describe(), format!("its probe failed: {message}"))
}

/// [`decide`], failing with why alone.
fn decide_table(policy: &TablePolicy, reports: Vec<AgentReport>) -> Result<Decision, String> {
    let mut offers = Vec::with_capacity(reports.len());
    let mut ports = Vec::with_capacity(reports.len());
    // A restart leaves out a host whose probe fails now, as it does a lost one.
    let mut unprobed = Vec::new();
    for (host, report) in policy.hosts.iter().zip(reports) {
        match report.host {
            HostReport::Devices(devices) => offers.push(Offer {
                host: host.describe(),
                slots: host.slots,
                devices,
            }),
            HostReport::ProbeFailed { message, .. } if policy.shrink.is_some() => {
                unprobed.push(probe_failure(host, &message));
            }
            HostReport::ProbeFailed { message, .. } => {
                return Err(format!("host {}: {message}", host.describe()));
            }
        }
        ports.push((host.server_id.clone(), report.free_port, report.nic_addr));
    }
    let any_unhealthy = offers
        .iter()
        .flat_map(|o| &o.devices)
        .any(|d| !d.health.is_healthy());
    // Devices that several servers' table cannot list (no RoCE address of their own): looked
    // for only when a first attempt may be planned around them. (A chip that cannot be told
    // fails the launch below, with its reason.)
    let any_unaddressed = || {
        let all = || offers.iter().flat_map(|o| &o.devices);
        offers.len() > 1 && {
            let all_devices: Vec<Device> = all().cloned().collect();
            chip_or_reported(policy.build.chip, &all_devices)
                .is_ok_and(|chip| !without_own_address(chip, all()).is_empty())
        }
    };
    let (devices, left_out) = match &policy.shrink {
        Some(shrink)
            if shrink.restart || any_unhealthy || !unprobed.is_empty() || any_unaddressed() =>
        {
            replan(offers, shrink, &unprobed, policy.build.chip)?
        }
        _ => {
            let hosts = offers.len();
            let devices = assign_workers(offers, policy.np)?;
            refuse_unhealthy(&devices, hosts)?;
            (devices, Vec::new())
        }
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
    let chip = chip_or_reported(build.chip, &devices).map_err(|e| error_chain(&e))?;
    let (table, warnings) = build_table_checked(&devices, &build).map_err(|e| {
        // A server's device count may be the user's choice, not the probe's: say which.
        let by_count = matches!(&e, atlasboost_core::Error::Invalid { violations, .. }
            if violations.iter().any(|v| matches!(v.rule,
                Rule::DeviceCount | Rule::UnequalDeviceCounts | Rule::CrossesGroups)));
        let chosen: Vec<String> = policy
            .np
            .map(|n| format!("-n {n}"))
            .into_iter()
            .chain(
                policy
                    .hosts
                    .iter()
                    .any(|h| h.slots.is_some())
                    .then(|| "the hosts' slots".to_string()),
            )
            .collect();
        match chosen.is_empty() || !by_count {
            true => error_chain(&e),
            false => format!(
                "{}\n(each server's devices are those {} chose: ask for a count the rules allow)",
                error_chain(&e),
                chosen.join(" and ")
            ),
        }
    })?;
    let warnings = warnings
        .iter()
        .map(ToString::to_string)
        .chain(atlasboost_core::ranktable::devices_without_ip(
            &devices,
            build.format,
        ))
        .collect();
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
        build,
        unprobed,
        left_out,
    })
}

/// Refuses a first attempt's unhealthy devices, saying how to go on without them (the table
/// builder would refuse them too, with a hint for one host).
fn refuse_unhealthy(devices: &[Device], hosts: usize) -> Result<(), String> {
    let unhealthy = atlasboost_core::ranktable::unhealthy_named(devices);
    if unhealthy.is_empty() {
        return Ok(());
    }
    let hint = match hosts {
        1 => "leave it out with --devices",
        // --devices names the same devices on every host.
        _ => {
            "leave its host out, or let the job start on the largest valid world without it \
              (--max-restarts with --min-np)"
        }
    };
    Err(format!("{}; {hint}", unhealthy.join(", ")))
}

/// A host's report in the compact form that travels up the launch tree (SPEC §14): a dozen
/// bytes or so per device, where JSON takes about a hundred.
pub fn encode_report(report: &AgentReport) -> Vec<u8> {
    let mut w = compact::Writer::default();
    match &report.host {
        HostReport::Devices(devices) => {
            w.varint(0);
            compact::put_devices(&mut w, devices);
        }
        HostReport::ProbeFailed { server_id, message } => {
            w.varint(1);
            w.str(server_id);
            w.str(message);
        }
    }
    w.varint(u64::from(report.free_port));
    w.str(report.nic_addr.as_deref().unwrap_or(""));
    w.buf
}

/// Reads what [`encode_report`] wrote, naming the host whose report it is.
///
/// # Errors
///
/// `host X sent a report atlasboost cannot read: ...`.
pub fn decode_report(bytes: &[u8], host: &str) -> Result<AgentReport, String> {
    let read = || -> Result<AgentReport, compact::CompactError> {
        let mut r = compact::Reader::new(bytes);
        let report = match r.varint("the report's kind")? {
            0 => HostReport::Devices(compact::get_devices(&mut r)?),
            1 => HostReport::ProbeFailed {
                server_id: r.str("the server id")?,
                message: r.str("the probe's error")?,
            },
            other => {
                return Err(compact::CompactError(format!("a report of kind {other}")));
            }
        };
        let free_port = u16::try_from(r.varint("the free port")?)
            .map_err(|_| compact::CompactError("a port above 65535".into()))?;
        let nic_addr = Some(r.str("the --nic address")?).filter(|a| !a.is_empty());
        r.finish("the report")?;
        Ok(AgentReport {
            host: report,
            free_port,
            nic_addr,
        })
    };
    read().map_err(|e| format!("host {host} sent a report atlasboost cannot read: {e}"))
}

/// The launcher's decision in the compact form that travels down the launch tree: what the
/// table is built from (its devices and options), the first node, and the SHA-256 of the JSON
/// every host must build from it.
pub fn encode_decision(decision: &Decision) -> Vec<u8> {
    let mut w = compact::Writer::default();
    w.str(&decision.answer.sha256);
    w.str(&decision.answer.chip);
    w.str(&decision.answer.master_addr);
    w.varint(u64::from(decision.answer.master_port));
    compact::put_table_inputs(&mut w, &decision.devices, &decision.build);
    w.buf
}

/// What a host makes of the launcher's decision: the table built here, byte for byte the
/// launcher's (its SHA-256 is checked), and the answer it is part of.
///
/// # Errors
///
/// A malformed decision, a table that does not build, or one whose SHA-256 is not the
/// launcher's.
pub fn render_decision(bytes: &[u8]) -> Result<(LaunchAnswer, RankTable), CliError> {
    let bad = |e: compact::CompactError| {
        CliError::Failure(format!("the launcher's decision cannot be read: {e}"))
    };
    let mut r = compact::Reader::new(bytes);
    let sha256 = r.str("the SHA-256").map_err(bad)?;
    let chip = r.str("the chip").map_err(bad)?;
    let master_addr = r.str("the first node").map_err(bad)?;
    let master_port = r.varint("the port").map_err(bad)?;
    let (devices, build) = compact::get_table_inputs(&mut r).map_err(bad)?;
    r.finish("the decision").map_err(bad)?;
    let (table, _) = build_table_checked(&devices, &build)?;
    let json = table.to_json_pretty();
    let got = sha256_hex(json.as_bytes());
    if got != sha256 {
        return Err(CliError::Failure(format!(
            "the rank table built here has SHA-256 {got}, not the launcher's {sha256}: this \
             host's atlasboost builds tables differently (install the same version everywhere)"
        )));
    }
    let answer = LaunchAnswer {
        table: json,
        chip,
        master_addr,
        master_port: u16::try_from(master_port).unwrap_or(0),
        sha256,
    };
    Ok((answer, table))
}

/// A restart's world: the largest the chip's rules allow on what the hosts still have, with
/// what it leaves out of that ([`left_out_of`]), or why there is none of at least `shrink.min`.
fn replan(
    offers: Vec<Offer>,
    shrink: &Shrink,
    unprobed: &[(String, String)],
    chip: Option<Chip>,
) -> Result<(Vec<Device>, Vec<String>), String> {
    let all: Vec<Device> = offers.iter().flat_map(|o| o.devices.clone()).collect();
    let chip = chip_or_reported(chip, &all).map_err(|e| error_chain(&e))?;
    let mut hosts: Vec<HostDevices> = offers
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
    // Ties go to hosts earlier in the list: the last attempt's first (a stable sort).
    hosts.sort_by_key(|h| !shrink.previous.contains(&h.server_id));
    let world = largest_world(chip, &hosts, Some(shrink.max));
    if world.len() as u64 >= shrink.min {
        // What the hosts would run, unhealthy devices and all, within their slots and the
        // job's size: less than that is a shrink.
        let wanted = hosts
            .iter()
            .map(|h| h.devices.len().min(h.cap.unwrap_or(usize::MAX)) as u64)
            .sum::<u64>()
            .min(shrink.max);
        let shrank = (world.len() as u64) < wanted;
        let left_out = left_out_of(chip, &hosts, &world, shrank, &shrink.previous);
        return Ok((world, left_out));
    }
    let mut left_out: Vec<String> = shrink
        .left_out
        .iter()
        .map(|h| format!("host {h} (lost or failed earlier)"))
        .collect();
    left_out.extend(
        unprobed
            .iter()
            .map(|(host, why)| format!("host {host} ({why})")),
    );
    left_out.extend(all.iter().filter(|d| !d.health.is_healthy()).map(|d| {
        format!(
            "device {} of host {} ({})",
            d.physical_id, d.server_id, d.health
        )
    }));
    // Devices a world of several servers cannot take (one server alone could).
    if hosts.len() > 1 {
        let unaddressed = without_own_address(chip, &all);
        left_out.extend(
            all.iter()
                .filter(|d| unaddressed.contains(&(d.server_id.as_str(), d.physical_id)))
                .map(address_problem),
        );
    }
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
    let verb = if shrink.restart { "restart" } else { "start" };
    Err(if world.is_empty() {
        // Nothing is left to shrink to: --min-np would not help.
        format!("cannot {verb}: {largest}{without}")
    } else if shrink.min_given {
        format!(
            "cannot {verb}: {largest}{without}, fewer than --min-np {}",
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

/// What `world` leaves out of what `hosts` offer: each unusable device with its health, and,
/// when the world `shrank` (below the job's size), per host the usable devices it does not take
/// (the chip's rules, the slots). Without a shrink those are only the job's size at work,
/// except on a host of the `previous` attempt that the world no longer uses: its ranks moved.
fn left_out_of(
    chip: Chip,
    hosts: &[HostDevices],
    world: &[Device],
    shrank: bool,
    previous: &[String],
) -> Vec<String> {
    let taken: std::collections::HashSet<(&str, u32)> = world
        .iter()
        .map(|w| (w.server_id.as_str(), w.physical_id))
        .collect();
    let several = world
        .iter()
        .any(|d| world.first().is_some_and(|f| f.server_id != d.server_id));
    // A world of several servers needs each device's own RoCE address.
    let unaddressed = match several {
        true => without_own_address(chip, hosts.iter().flat_map(|h| &h.devices)),
        false => Default::default(),
    };
    let mut said = Vec::new();
    for h in hosts {
        for d in h.devices.iter().filter(|d| !d.health.is_healthy()) {
            // Physical ids, as in the table; a failed rank's line names its device by the
            // driver's logical id, so a device whose logical id differs says both.
            let logical = match d.logical_id == d.physical_id {
                true => String::new(),
                false => format!(" (logical {})", d.logical_id),
            };
            said.push(format!(
                "device {}{logical} of host {} ({})",
                d.physical_id, h.server_id, d.health
            ));
        }
        let not_taken = |d: &&Device| !taken.contains(&(d.server_id.as_str(), d.physical_id));
        let addressed = |d: &&Device| !unaddressed.contains(&(d.server_id.as_str(), d.physical_id));
        said.extend(
            h.devices
                .iter()
                .filter(not_taken)
                .filter(|d| !addressed(d))
                .map(address_problem),
        );
        let moved_off =
            previous.contains(&h.server_id) && !world.iter().any(|w| w.server_id == h.server_id);
        let idle: Vec<u64> = h
            .devices
            .iter()
            .filter(|d| (shrank || moved_off) && d.health.is_healthy())
            .filter(not_taken)
            .filter(addressed)
            .map(|d| u64::from(d.physical_id))
            .collect();
        let ids = super::plan::id_ranges(idle.iter().copied(), ",");
        match idle.len() {
            0 => {}
            1 => said.push(format!(
                "device {ids} of host {} (usable, but not in the largest valid world)",
                h.server_id
            )),
            _ => said.push(format!(
                "devices {ids} of host {} (usable, but not in the largest valid world)",
                h.server_id
            )),
        }
    }
    said
}

/// Why a world of several servers cannot take `d` (one of [`without_own_address`]'s).
fn address_problem(d: &Device) -> String {
    match d.ip {
        None => format!(
            "device {} of host {} (no RoCE address, which a table of several servers needs)",
            d.physical_id, d.server_id
        ),
        Some(ip) => format!(
            "device {} of host {} (its RoCE address {ip} is another device's too)",
            d.physical_id, d.server_id
        ),
    }
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
        free_port: free_master_port(),
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
    let (visible, runtime_index) = runtime_visible(
        &seats
            .iter()
            .map(|s| logical_of(s.physical_id))
            .collect::<Vec<_>>(),
        inherited_runtime_visible()?.as_deref(),
    );
    let mut runtime_index = runtime_index.into_iter();
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
        // With ASCEND_RT_VISIBLE_DEVICES listing this host's job devices, the runtime numbers
        // them 0..n-1: DEVICE_ID (and ASCEND_DEVICE_ID) is the table's device, and so is
        // device LOCAL_RANK (set_device(LOCAL_RANK)) wherever the driver numbers devices in
        // physical order, as it does outside unusual containers (see runtime_visible).
        let index = runtime_index.next().unwrap_or(seat.world.local_rank);
        let env = worker_env(&WorkerSpec {
            seat: &seat,
            table_path: &settings.rank_table,
            logical_id: index,
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
        // What the user exports wins over what atlasboost would set (the launcher refuses a
        // `-x` of what it sets per worker), and the devices' view, which must match the table
        // (the launcher's own was composed into it above), comes last, so that it wins.
        vars.extend(settings.env.iter().cloned());
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

/// `ASCEND_RT_VISIBLE_DEVICES` for a host's workers, and each worker's device in it (the
/// index its runtime gives it: its `DEVICE_ID`). `logical` are the driver's logical ids of the
/// job's devices, in local-rank order, as the probe reported them; when the launcher (or
/// agent) itself ran under an `ASCEND_RT_VISIBLE_DEVICES`, the probe renumbered the listed
/// devices 0..n-1 in ascending order, so each id is mapped back through that list.
///
/// The runtime takes ascending ids only (it stops reading at the first that is not), so the
/// list is sorted. Where the driver numbers devices in physical order (local ranks follow
/// physical ids) each worker's index is its local rank; where it does not (a driver or
/// container that numbers them otherwise), `DEVICE_ID` still selects the rank's device.
pub fn runtime_visible(logical: &[u32], inherited: Option<&[u32]>) -> (String, Vec<u32>) {
    let mut through: Vec<u32> = inherited.map(<[u32]>::to_vec).unwrap_or_default();
    through.sort_unstable();
    let ids: Vec<u32> = logical
        .iter()
        .map(|&l| {
            through
                .get(l as usize)
                .copied()
                .filter(|_| inherited.is_some())
                .unwrap_or(l)
        })
        .collect();
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    let index = ids
        .iter()
        .map(|id| sorted.partition_point(|s| s < id) as u32)
        .collect();
    let list = sorted
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    (list, index)
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
///
/// With `slurm` (started by the srun step of `--launcher slurm`), it first connects back to
/// the launcher with the invitation on standard input, and its standard input and output are
/// that connection from then on ([`super::slurm::agent_connect`]).
pub fn agent_main(slurm: bool) -> u8 {
    if slurm && let Err(why) = super::slurm::agent_connect(&super::slurm::process_env) {
        let _ = writeln!(
            std::io::stderr(),
            "atlasboost agent: cannot join the launcher: {why}"
        );
        return ExitCodes::FAILURE;
    }
    let mut up = std::io::stdout().lock();
    let mut say = |m: &Up| {
        let mut frame = Vec::new();
        channel::encode(m, &mut frame);
        let _ = up.write_all(&frame).and_then(|()| up.flush());
    };
    let mut line = Vec::new();
    let config: AgentConfig = match std::io::stdin().lock().read_until(b'\n', &mut line) {
        Ok(n) if n > 0 => match serde_json::from_slice(&line) {
            Ok(c) => c,
            Err(e) => {
                let _ = writeln!(
                    std::io::stderr(),
                    "atlasboost agent: the configuration on standard input is not valid: {e}"
                );
                return ExitCodes::USAGE;
            }
        },
        read => {
            let _ = writeln!(
                std::io::stderr(),
                "atlasboost agent: no configuration on standard input{}; this command is \
                 started by `atlasboost run`, not by hand",
                match read {
                    Err(e) => format!(" ({e})"),
                    Ok(_) => String::new(),
                }
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
    let code = match run_remote(&config, slurm) {
        Ok(code) => code,
        Err(e) => {
            let code = e.exit_code();
            say(&Up::Failed {
                code,
                message: error_chain(&e),
            });
            code
        }
    };
    if slurm {
        super::slurm::agent_disconnect();
    }
    code
}

/// Starts the agents of this agent's children in the launch tree (each told about its own
/// subtree), in position order.
fn start_children(config: &AgentConfig) -> Result<Vec<(u32, Remote)>, CliError> {
    let below = &config.tree;
    let tree = Tree {
        size: below.size,
        fanout: below.fanout,
    };
    let mut hosts = Vec::new();
    for child in tree.children(Some(config.position)) {
        let Some(host) = below.hosts.iter().find(|h| h.position == child) else {
            return Err(CliError::Failure(format!(
                "the launch tree names position {child} below this host, but not its host"
            )));
        };
        hosts.push(host);
    }
    let names: Vec<&str> = hosts.iter().map(|h| h.name.as_str()).collect();
    let connects = ssh_connect::plan(&names, &below.ssh);
    let mut children = Vec::new();
    for (host, connect) in hosts.into_iter().zip(&connects) {
        children.push((
            host.position as u32,
            Remote::start(
                &host.name,
                &host.host,
                &below.ssh,
                connect,
                &child_config(config, host),
            )?,
        ));
    }
    Ok(children)
}

/// The configuration of the child `host` of this agent: the same job, its own subtree.
pub fn child_config(config: &AgentConfig, host: &TreeHost) -> AgentConfig {
    let tree = Tree {
        size: config.tree.size,
        fanout: config.tree.fanout,
    };
    AgentConfig {
        position: host.position,
        server_id: host.server_id.clone(),
        host: host.host.clone(),
        launcher: config.launcher.clone(),
        discovery: config.discovery.clone(),
        job_id: config.job_id.clone(),
        timeout_ms: config.timeout_ms,
        workers: config.workers.clone(),
        tree: TreeBelow {
            fanout: config.tree.fanout,
            size: config.tree.size,
            hosts: config
                .tree
                .hosts
                .iter()
                .filter(|h| h.position != host.position && tree.is_below(h.position, host.position))
                .cloned()
                .collect(),
            ssh: config.tree.ssh.clone(),
        },
    }
}

/// Writes one frame to standard output at once (before the workers' [`Output`] exists).
fn say(message: &Up) -> Result<(), CliError> {
    let mut frame = Vec::new();
    channel::encode(message, &mut frame);
    let mut out = std::io::stdout().lock();
    out.write_all(&frame)
        .and_then(|()| out.flush())
        .map_err(CliError::system("write to the launcher"))
}

/// The join, on a remote host: its report goes up, the agents below pass theirs (and
/// whatever else they say) up through it, and every command from above is passed down, until
/// the launcher's decision arrives. Returns the decision.
fn join_upward(
    config: &AgentConfig,
    report: &AgentReport,
    up: &mut Upstream,
    children: &mut [(u32, Remote)],
) -> Result<Vec<u8>, CliError> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;

    say(&Up::Report {
        bytes: encode_report(report),
    })?;
    let tree = Tree {
        size: config.tree.size,
        fanout: config.tree.fanout,
    };
    let timeout = Duration::from_millis(config.timeout_ms);
    let deadline = Instant::now() + timeout;
    let mut buf = vec![0u8; 1 << 16];
    let mut pending: Vec<u8> = Vec::new();
    // The decision's length, once its line came: its bytes follow.
    let mut expecting: Option<usize> = None;
    loop {
        let ready = {
            let mut fds: Vec<PollFd<'_>> = Vec::new();
            if let Some(fd) = up.fd() {
                fds.push(PollFd::new(fd, PollFlags::POLLIN));
            }
            for (_, c) in children.iter() {
                for fd in c.out.iter().chain(c.err.iter()) {
                    fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let _ = poll(
                &mut fds,
                PollTimeout::try_from(left.min(Duration::from_millis(500)))
                    .unwrap_or(PollTimeout::MAX),
            );
            fds.iter()
                .any(|f| f.revents().is_some_and(|r| !r.is_empty()))
        };
        for (position, child) in children.iter_mut() {
            for m in child.forward(*position, tree, &mut buf) {
                say(&m)?;
            }
        }
        if ready && !up.read_raw(&mut pending, &mut buf) {
            return Err(CliError::Failure(
                "the launcher's connection closed while the hosts were joining".into(),
            ));
        }
        loop {
            if let Some(n) = expecting {
                if pending.len() < n {
                    break;
                }
                let decision: Vec<u8> = pending.drain(..n).collect();
                // The agents below get it as it came, before this host builds its table.
                let message = channel::decision_message(&decision);
                for (_, child) in children.iter_mut() {
                    child.send_lines(&message);
                }
                up.preload(&pending);
                return Ok(decision);
            }
            let Some(end) = pending.iter().position(|&b| b == b'\n') else {
                if pending.len() > 4096 {
                    return Err(CliError::Failure(
                        "the launcher sent a command line longer than 4 KiB".into(),
                    ));
                }
                break;
            };
            let line: Vec<u8> = pending.drain(..=end).collect();
            let line = &line[..end];
            match Down::parse(&String::from_utf8_lossy(line)) {
                Ok(Down::Decision(n)) => expecting = Some(n),
                // Commands for the workers mean nothing before they start (a launcher that
                // gives up closes the connection); the agents below get them all the same.
                Ok(_) => {
                    for (_, child) in children.iter_mut() {
                        child.send_line(line);
                    }
                }
                Err(why) => {
                    let _ = writeln!(std::io::stderr(), "atlasboost agent: ignoring {why}");
                }
            }
        }
        if Instant::now() >= deadline {
            return Err(CliError::Failure(format!(
                "no decision from the launcher within {timeout:.0?} of reporting"
            )));
        }
    }
}

/// The agent's work once it has its configuration.
fn run_remote(config: &AgentConfig, slurm: bool) -> Result<u8, CliError> {
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
    let signals = Signals::block()?;
    // Over ssh the channel up is stdout: its reader gone, the guard stops the workers even if
    // this agent hangs (under Slurm, the step's end does).
    let stdout = std::io::stdout();
    let upstream = (!slurm).then(|| stdout.as_fd());
    let files = RankFiles::create(&config.job_id)?;
    // Until the guard runs, removing the directory is this process's job.
    let mut lifeline =
        lifeline::prepare(CgroupWanted::ByDefault(true), upstream, Some(files.dir()))
            .inspect_err(|_| files.remove())?;
    let nic: Option<atlasboost::host::NicChoice> = settings
        .nic
        .as_deref()
        .map(str::parse)
        .transpose()
        .map_err(|why: String| CliError::Usage(format!("--nic: {why}")))?;
    // The agents below start first: ssh takes the longest to get going.
    let mut children = start_children(config)?;
    let (report, devices) = host_report(&config.discovery, &config.server_id, nic.as_ref())?;
    let mut upstream = supervise::Upstream::stdin()?.under_slurm(slurm);
    // Heard after the supervisor is done with the commands: while the last frames wait.
    let launcher = upstream.commands()?;
    let decision = join_upward(config, &report, &mut upstream, &mut children)?;
    let (answer, table) = render_decision(&decision)?;
    write_checked(&settings.rank_table, &answer)?;
    let prepared = Prepared {
        table,
        answer,
        devices: devices.unwrap_or_default(),
    };
    let mut workers = host_workers(
        HostPart::of(&prepared, &config.server_id, &config.host)?,
        settings,
        &config.job_id,
        &|k| std::env::var_os(k).is_some(),
    )?;
    // Under srun, the workers see the job's Slurm variables, not the agents' step's.
    let slurm_env = match slurm {
        true => super::slurm::workers_env_under_slurm(),
        false => Default::default(),
    };
    for w in &mut workers {
        w.env.extend(slurm_env.1.iter().cloned());
    }
    let pytorch = settings.framework.parse::<Framework>()? == Framework::Pytorch;
    // From here on every frame goes through `output` (standard output is non-blocking now),
    // the last ones too.
    let mut output = Output::upstream(&workers.iter().map(|w| w.rank).collect::<Vec<_>>())?;
    // This host's own (its login environment's); under srun the agents have the launcher's,
    // which it named already.
    let other_startup = super::job::other_startup_vars(&settings.env);
    if !slurm && let Some(warning) = super::job::other_startup_warning(&other_startup) {
        output.message(&warning);
    }
    output.send(&Up::Ready);
    let plan = RunPlan {
        helpers: Vec::new(),
        command: settings.command.clone(),
        wdir: settings.wdir.clone(),
        grace: Duration::from_millis(settings.grace_ms),
        lost_after: Duration::from_millis(settings.lost_after_ms),
        files: Some(files.clone()),
        watch: settings.watch,
        hang: None,
        pytorch,
        monitor: (settings.monitor_ms > 0).then(|| MonitorPlan {
            every: Duration::from_millis(settings.monitor_ms),
            hosts: vec![HostMonitor::new(
                config.host.clone(),
                &prepared.devices,
                |d| workers.iter().any(|w| w.device == d),
                Arc::from(atlasboost::probe::telemetry_of(
                    &config.discovery,
                    &config.server_id,
                )),
            )],
        }),
        metrics: None,
        unset_env: slurm_env.0.into_iter().chain(other_startup).collect(),
    };
    let result = supervise::run_workers(
        &plan,
        &workers,
        &mut output,
        &signals,
        &mut lifeline,
        supervise::Role::Agent(upstream.with_children(
            children,
            Tree {
                size: config.tree.size,
                fanout: config.tree.fanout,
            },
        )),
    );
    lifeline.close();
    files.remove();
    let code = match result {
        Ok(_) => {
            output.send(&Up::Done);
            ExitCodes::SUCCESS
        }
        Err(e) => output.send_failure(&e),
    };
    let lost_after = Duration::from_millis(settings.lost_after_ms);
    supervise::send_the_rest(&mut output, &signals, launcher.as_fd(), lost_after);
    Ok(code)
}

#[cfg(test)]
mod tests {
    use atlasboost_core::{DeviceProbe, Health};
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

    fn report(ip: &str, devices: u32, port: u16) -> AgentReport {
        AgentReport {
            host: HostReport::Devices(SimProbe::new(ip, devices).probe().unwrap()),
            free_port: port,
            nic_addr: None,
        }
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

    fn decide_answer(
        policy: &TablePolicy,
        reports: Vec<AgentReport>,
    ) -> Result<LaunchAnswer, String> {
        decide(policy, reports)
            .map(|d| d.answer)
            .map_err(|e| e.message)
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

    /// What a re-planned world says it left out: unusable devices always; usable ones only
    /// when the job shrank (a restart of `-n 4` on 8 devices leaves 4 idle by design).
    #[test]
    fn a_replan_names_what_it_leaves_out_only_when_it_matters() {
        let shrink = |min: u64, max: u64| Shrink {
            min,
            min_given: true,
            max,
            left_out: Vec::new(),
            restart: true,
            previous: Vec::new(),
        };
        let two = || vec![host("127.0.0.1", None), host("127.0.0.2", None)];
        let mut p = policy(two(), Some(8), RankOrder::ServerId);
        // A restart of a job of 8 on 2 × 8 healthy devices: nothing to say.
        p.shrink = Some(shrink(8, 8));
        let healthy = || vec![report("127.0.0.1", 8, 1), report("127.0.0.2", 8, 2)];
        let d = decide(&p, healthy()).unwrap();
        assert_eq!(d.devices.len(), 8);
        assert_eq!(d.left_out, Vec::<String>::new());
        // Device 3 of the first host dies, and the job of 16 shrinks to the other host's 8.
        p.shrink = Some(shrink(8, 16));
        let mut reports = healthy();
        if let HostReport::Devices(devices) = &mut reports[0].host {
            devices[3].health = Health::Unreadable {
                code: 13,
                call: atlasboost_core::DriverCall::ChipInfo,
            };
        }
        let d = decide(&p, reports).unwrap();
        assert_eq!(d.devices.len(), 8);
        assert_eq!(
            d.left_out,
            [
                "device 3 of host 127.0.0.1 (unreadable: dsmi_get_chip_info returned 13 (BUSY: \
                 the device is busy))",
                "devices 0-2,4-7 of host 127.0.0.1 (usable, but not in the largest valid world)",
            ]
        );
        // A first attempt on hosts of 4 slots, device 6 of one dead: nothing shrank (the slots
        // set the size), so only the dead device is named.
        let mut p = policy(
            vec![host("127.0.0.1", Some(4)), host("127.0.0.2", Some(4))],
            None,
            RankOrder::ServerId,
        );
        p.shrink = Some(Shrink {
            restart: false,
            ..shrink(4, u64::MAX)
        });
        let mut reports = healthy();
        if let HostReport::Devices(devices) = &mut reports[1].host {
            devices[6].health = Health::Unhealthy { code: 3 };
        }
        let d = decide(&p, reports).unwrap();
        assert_eq!(d.devices.len(), 8);
        assert_eq!(d.left_out, ["device 6 of host 127.0.0.2 (critical (3))"]);
        // In a container that sees NPUs 4-7 as 0-3, the dead one is named by both ids (a
        // failed rank's line names its logical one).
        let mut reports = healthy();
        if let HostReport::Devices(devices) = &mut reports[1].host {
            devices.retain(|d| d.physical_id >= 4);
            for (logical, d) in devices.iter_mut().enumerate() {
                d.logical_id = logical as u32;
            }
            devices[1].health = Health::Unhealthy { code: 3 };
        }
        let d = decide(&p, reports).unwrap();
        let named = "device 5 (logical 1) of host 127.0.0.2 (critical (3))";
        assert!(d.left_out.iter().any(|l| l == named), "{:?}", d.left_out);
        // No world at all is left: --min-np, given or not, could not help, and is not named.
        for min_given in [false, true] {
            let mut p = policy(vec![host("127.0.0.1", None)], Some(8), RankOrder::ServerId);
            p.shrink = Some(Shrink {
                min_given,
                ..shrink(if min_given { 1 } else { 8 }, 8)
            });
            let mut reports = vec![report("127.0.0.1", 8, 1)];
            if let HostReport::Devices(devices) = &mut reports[0].host {
                for d in devices {
                    d.health = Health::Unhealthy { code: 3 };
                }
            }
            let e = decide(&p, reports).map(|_| ()).unwrap_err();
            let e = e.to_string();
            assert!(
                e.starts_with("cannot restart: no valid world is left without "),
                "{e}"
            );
            assert!(!e.contains("--min-np"), "{e}");
        }
    }

    /// A restart of the same size keeps its ranks on the last attempt's hosts, though a host
    /// earlier in the list (healed meanwhile) could take them as well.
    #[test]
    fn a_restart_keeps_the_last_attempts_hosts_between_equal_worlds() {
        let hosts = ["127.0.0.1", "127.0.0.2", "127.0.0.3"];
        let mut p = policy(
            hosts.iter().map(|h| host(h, None)).collect(),
            Some(16),
            RankOrder::ServerId,
        );
        p.shrink = Some(Shrink {
            min: 16,
            min_given: true,
            max: 16,
            left_out: Vec::new(),
            restart: true,
            previous: vec!["127.0.0.1".into(), "127.0.0.3".into()],
        });
        let reports = hosts
            .iter()
            .zip(1u16..)
            .map(|(h, port)| report(h, 8, port))
            .collect();
        let d = decide(&p, reports).unwrap();
        let mut servers: Vec<&str> = d.devices.iter().map(|d| d.server_id.as_str()).collect();
        servers.dedup();
        assert_eq!(servers, ["127.0.0.1", "127.0.0.3"]);
        assert_eq!(d.left_out, Vec::<String>::new());
        // Device 2 of 127.0.0.1 dies: the same size runs on .2 and .3. Nothing shrank, but
        // the ranks moved off a host of the last attempt: its idle devices are named too.
        let mut reports: Vec<AgentReport> = hosts
            .iter()
            .zip(1u16..)
            .map(|(h, port)| report(h, 8, port))
            .collect();
        if let HostReport::Devices(devices) = &mut reports[0].host {
            devices[2].health = Health::Unhealthy { code: 3 };
        }
        let d = decide(&p, reports).unwrap();
        assert_eq!(d.devices.len(), 16);
        assert_eq!(
            d.left_out,
            [
                "device 2 of host 127.0.0.1 (critical (3))",
                "devices 0-1,3-7 of host 127.0.0.1 (usable, but not in the largest valid world)",
            ]
        );
    }

    #[test]
    fn the_table_follows_slots_and_the_host_order() {
        let hosts = vec![host("127.0.0.2", Some(4)), host("127.0.0.1", None)];
        let payloads = || vec![report("127.0.0.2", 8, 2002), report("127.0.0.1", 4, 2001)];

        let by_id = decide(
            &policy(hosts.clone(), None, RankOrder::ServerId),
            payloads(),
        )
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
            payloads(),
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
    fn the_runtime_view_lists_the_drivers_ids_ascending_and_each_workers_index() {
        let view = runtime_visible;
        assert_eq!(
            view(&[4, 5, 6, 7], None),
            ("4,5,6,7".into(), vec![0, 1, 2, 3])
        );
        // The probe ran under ASCEND_RT_VISIBLE_DEVICES=6,2,7: it saw 2, 6, 7 as 0, 1, 2.
        assert_eq!(view(&[1, 2], Some(&[6, 2, 7])), ("6,7".into(), vec![0, 1]));
        assert_eq!(view(&[], None), (String::new(), vec![]));
        // A driver numbering physical 7, 6, 5, 4 as logical 0..3: local ranks 0..3 (physical
        // order) are logical 3, 2, 1, 0. The runtime reads ascending ids only.
        assert_eq!(
            view(&[3, 2, 1, 0], None),
            ("0,1,2,3".into(), vec![3, 2, 1, 0])
        );
        assert_eq!(
            view(&[1, 0, 3, 2], None),
            ("0,1,2,3".into(), vec![1, 0, 3, 2])
        );
    }

    #[test]
    fn a_host_left_without_workers_is_not_in_the_table() {
        let hosts = vec![host("127.0.0.1", Some(2)), host("127.0.0.2", Some(2))];
        let payloads = vec![report("127.0.0.1", 8, 1), report("127.0.0.2", 8, 2)];
        let answer = decide_answer(
            &policy(hosts, Some(2), RankOrder::Hosts(Vec::new())),
            payloads,
        )
        .unwrap();
        assert_eq!(servers(&answer), vec![("127.0.0.1".into(), 2)]);
    }

    #[test]
    fn a_failed_probe_or_a_garbled_report_names_its_host() {
        let hosts = vec![host("127.0.0.1", None), host("127.0.0.2", None)];
        let failed = AgentReport {
            host: HostReport::ProbeFailed {
                server_id: "127.0.0.2".into(),
                message: "the driver said no".into(),
            },
            free_port: 0,
            nic_addr: None,
        };
        // The report travels compact, and reads back as it was.
        let failed = decode_report(&encode_report(&failed), "127.0.0.2").unwrap();
        let why = decide_answer(
            &policy(hosts, None, RankOrder::ServerId),
            vec![report("127.0.0.1", 2, 1), failed],
        )
        .unwrap_err();
        assert_eq!(why, "host 127.0.0.2: the driver said no");

        let mut garbled = encode_report(&report("127.0.0.2", 2, 7));
        garbled.truncate(garbled.len() - 3);
        let why = decode_report(&garbled, "127.0.0.2").unwrap_err();
        assert!(
            why.starts_with("host 127.0.0.2 sent a report atlasboost cannot read"),
            "{why}"
        );
    }

    /// The variables `host_workers` and `RankFiles::env` set for a worker, beside the table's
    /// and those the user may give instead (`USER_MAY_SET`), are exactly those the launcher
    /// refuses in `-x` (`job::SET_BY_THE_LAUNCHER`): a variable added to one and not the other
    /// would be either overridable by `-x` or refused for nothing.
    #[test]
    fn the_variables_set_per_worker_are_the_ones_x_refuses() {
        use crate::launch::job::{
            SET_BY_THE_LAUNCHER, SET_BY_THE_LAUNCHER_FOR_TORCH, set_by_the_launcher,
        };
        use atlasboost_core::worker_env::{USER_MAY_SET, set_from_the_table};
        let ip = "10.0.0.1";
        let decision = decide(
            &policy(vec![host(ip, None)], None, RankOrder::ServerId),
            vec![report(ip, 8, 4000)],
        )
        .unwrap();
        let (answer, table) = render_decision(&encode_decision(&decision)).unwrap();
        let devices = SimProbe::new(ip, 8).probe().unwrap();
        let files = RankFiles::create("variables-test").unwrap();
        for framework in Framework::ALL {
            let settings = WorkerSettings {
                framework: framework.to_string(),
                command: vec!["true".into()],
                wdir: "/".into(),
                rank_table: "/t.json".into(),
                env: Vec::new(),
                grace_ms: 1000,
                lost_after_ms: 4000,
                restart_count: 1,
                max_restarts: 3,
                watch: true,
                nic: None,
                bind_cores: false,
                monitor_ms: 0,
            };
            let part = HostPart {
                server_id: ip,
                host: ip,
                seats: Seat::all(&table).unwrap(),
                devices: &devices,
                answer: &answer,
            };
            // Every default counts as inherited, so that only what is always set is left.
            let workers = host_workers(part, &settings, "job", &|_| true).unwrap();
            assert_eq!(workers.len(), 8);
            for w in &workers {
                let pytorch = framework == Framework::Pytorch;
                let mut names: Vec<String> = w
                    .env
                    .iter()
                    .chain(&files.env(w.rank, pytorch))
                    .map(|(k, _)| k.to_string_lossy().into_owned())
                    .filter(|k| {
                        !set_from_the_table(k, framework) && !USER_MAY_SET.contains(&k.as_str())
                    })
                    .collect();
                names.sort();
                let mut expected: Vec<&str> = SET_BY_THE_LAUNCHER.to_vec();
                if pytorch {
                    expected.extend(SET_BY_THE_LAUNCHER_FOR_TORCH);
                }
                expected.sort_unstable();
                assert_eq!(names, expected, "{framework}, rank {}", w.rank);
                assert!(names.iter().all(|k| set_by_the_launcher(k, framework)));
            }
        }
        files.remove();
    }

    #[test]
    fn every_host_builds_the_launchers_table_from_the_compact_decision() {
        let hosts: Vec<HostPlan> = (1..=5)
            .map(|i| host(&format!("10.0.{i}.1"), None))
            .collect();
        let reports: Vec<AgentReport> = (1..=5)
            .map(|i| {
                let r = report(&format!("10.0.{i}.1"), 8, 4000 + i);
                decode_report(&encode_report(&r), "h").unwrap()
            })
            .collect();
        for order in [RankOrder::ServerId, RankOrder::Hosts(Vec::new())] {
            let decision = decide(&policy(hosts.clone(), None, order), reports.clone()).unwrap();
            let compact = encode_decision(&decision);
            assert!(
                compact.len() * 5 < decision.answer.table.len(),
                "{} bytes compact against a {}-byte table",
                compact.len(),
                decision.answer.table.len()
            );
            let (answer, table) = render_decision(&compact).unwrap();
            assert_eq!(answer.table, decision.answer.table);
            assert_eq!(answer.sha256, decision.answer.sha256);
            assert_eq!(
                (answer.master_addr.as_str(), answer.master_port),
                (
                    decision.answer.master_addr.as_str(),
                    decision.answer.master_port
                )
            );
            assert_eq!(table.rank_count(), 40);
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("t.json");
            write_checked(&path, &answer).unwrap();
            assert_eq!(
                sha256_hex(&std::fs::read(&path).unwrap()),
                decision.answer.sha256
            );
        }
        // A decision whose SHA-256 is not the table's is refused, naming both.
        let mut decision = decide(&policy(hosts, None, RankOrder::ServerId), reports).unwrap();
        decision.answer.sha256 = "0".repeat(64);
        let e = render_decision(&encode_decision(&decision))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not the launcher's 0000"), "{e}");
        let e = render_decision(&[1, 2, 3]).unwrap_err().to_string();
        assert!(e.contains("cannot be read"), "{e}");
    }
}
