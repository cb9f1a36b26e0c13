//! Slurm as the launch engine (SPEC §14, `--launcher slurm`): the hosts of the allocation,
//! and one `srun` step that starts every host's agent, in place of ssh.
//!
//! Inside an allocation the hosts come from `SLURM_JOB_NODELIST` (and their slots from
//! `SLURM_TASKS_PER_NODE` when the allocation asked for tasks); their server ids from the
//! addresses Slurm reaches them at (`scontrol show node`'s `NodeAddr`).
//!
//! The step is `srun --ntasks-per-node=1 --kill-on-bad-exit=1 --cpu-bind=none ... atlasboost
//! agent --slurm`, as Open MPI starts its daemons under Slurm: Slurm's own tree starts the
//! agents, its accounting and `scancel` apply, and no ssh is needed. srun multiplexes one
//! stdin and one stdout for all its tasks, so the channel of each agent is not srun's stdio:
//! the launcher writes one invitation line on srun's stdin (broadcast to every task with
//! `--input=all`), which holds the job's secret and the port of a door like the relays' of
//! `run --mpi` ([`relay`](super::relay)); each agent connects back to the launcher (at the
//! address Slurm gives its tasks, `SLURM_LAUNCH_NODE_IPADDR`, or `--nic`'s), proves it holds the
//! secret, and then speaks the [`channel`](super::channel) protocol on that connection exactly
//! as over ssh. The secret is never on a command line or in the step's environment (which
//! `scontrol show step` and `/proc` show).

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, ToSocketAddrs};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use atlasboost_core::EnvVars;
use atlasboost_core::slurm::{
    NotationError, compress_hostlist, expand_hostlist, expand_tasks_per_node,
};
use atlasboost_tcp::Secret;
use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};

use super::plan::HostSpec;
use super::relay::{DoorEvent, Introduction, RelayDoor, introduce};
use super::remote::{Remote, SrunSaid};
use crate::error::CliError;
use crate::printer::to_stderr;
use crate::process::output_within;

/// How many of srun's last lines are kept for error messages.
const SRUN_TAIL: usize = 12;

/// How long an agent waits for each step of connecting back to the launcher.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

/// How long srun gets to end by itself once its agents are told to stop, before it is
/// signalled; then as long again before SIGKILL.
const SRUN_END_GRACE: Duration = Duration::from_secs(5);

/// How long `scontrol show node` may take (slurmctld busy or gone).
const SCONTROL_LIMIT: Duration = Duration::from_secs(20);

/// The same before a restart, which waits for it (a Ctrl-C meanwhile is acted on after it).
const RESTART_SCONTROL_LIMIT: Duration = Duration::from_secs(5);

/// The longest invitation line an agent reads.
const MAX_INVITATION: usize = 64 * 1024;

/// `ATLASBOOST_SRUN_OPTIONS` (its `value`), split at blanks. No shell reads it: a quote or a
/// backslash would reach srun as part of a word (`--comment='a b'` made `b'` the program srun
/// ran), and is refused by name.
fn srun_options(value: Option<&std::ffi::OsStr>) -> Result<Vec<String>, CliError> {
    let Some(value) = value else {
        return Ok(Vec::new());
    };
    let value = value.to_string_lossy();
    if value.contains(['\'', '"', '\\']) {
        return Err(CliError::Failure(format!(
            "{}={value}: it is split at blanks, with no shell's quoting; give each option as \
             one word without quotes (--comment=a_b), or set srun's own variable for it \
             (SLURM_*, SRUN_*)",
            EnvVars::ATLASBOOST_SRUN_OPTIONS
        )));
    }
    Ok(value.split_whitespace().map(str::to_string).collect())
}

/// Variables srun reads as options that would contradict the agents' step (`SLURM_EXACT` is
/// `--exact`, which srun refuses beside `--whole`); not given to srun.
const SRUN_OPTIONS_REMOVED: [&str; 2] = ["SLURM_EXACT", "SLURM_EXCLUSIVE"];

/// The job's variables that srun would read as the step's options or replace with the step's:
/// the job's CPUs per task (`sbatch -c 16`), with which srun ignores `--whole` and gives each
/// agent, and so all its node's workers, 16 CPUs (and memory per CPU); and the job's name,
/// which the step's `--job-name` replaces (PyTorch Lightning reads `SLURM_JOB_NAME`, e.g.
/// `bash` for an interactive job). Not given to srun as such; the workers get them back
/// ([`HELD_PREFIX`]).
const SRUN_HELD: [&str; 4] = [
    "SRUN_CPUS_PER_TASK",
    "SLURM_CPUS_PER_TASK",
    "SLURM_TRES_PER_TASK",
    "SLURM_JOB_NAME",
];

/// How [`SRUN_HELD`] travel through srun to the agents, which give them to the workers
/// under their own names.
const HELD_PREFIX: &str = "ATLASBOOST_SRUN_HELD_";

/// What srun sets for each task of the agents' step, which would describe an agent, not a
/// worker: a worker would read `SLURM_PROCID` 0 and `SLURM_NTASKS` 2 for the two agents
/// (PyTorch Lightning takes its rank and world size from them when `SLURM_NTASKS` is set).
/// An agent removes them before it starts any worker. The job's own variables
/// (`SLURM_JOB_ID`, `SLURM_JOB_NODELIST`, ...) stay, and so do the step's id and nodes
/// (`SLURM_STEP_ID`, `SLURM_STEP_NODELIST`): the workers do run in that step, which
/// `scancel JOB.STEP` ends.
const AGENT_TASK_VARS: [&str; 19] = [
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURM_GTIDS",
    "SLURM_TASK_PID",
    "SLURM_NTASKS",
    "SLURM_NPROCS",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_STEP_LAUNCHER_PORT",
    "SLURM_NNODES",
    "SLURM_LAUNCH_NODE_IPADDR",
    "SLURM_DISTRIBUTION",
    "SLURM_LABELIO",
    "SLURM_UNBUFFEREDIO",
    "SLURM_PRIO_PROCESS",
    "SLURM_MPI_TYPE",
];

/// Prefixes of the same: srun's own address (`SLURM_SRUN_COMM_HOST`), its CPU binding
/// (`SLURM_CPU_BIND_*`) and topology.
const AGENT_TASK_PREFIXES: [&str; 3] =
    ["SLURM_SRUN_COMM_", "SLURM_CPU_BIND", "SLURM_TOPOLOGY_ADDR"];

/// Whether `name` is one of the agents' step's per-task variables (`AGENT_TASK_VARS`).
fn is_agent_task_var(name: &str) -> bool {
    AGENT_TASK_VARS.contains(&name) || AGENT_TASK_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Reads a variable of the environment (a function, so that tests give their own).
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process's own environment, for [`Env`].
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Whether this process runs inside a Slurm allocation (`SLURM_JOB_ID` is set).
pub fn in_allocation(env: Env<'_>) -> bool {
    env(EnvVars::SLURM_JOB_ID).is_some()
}

/// The variable that lists the allocation's nodes, and its list.
fn node_list(env: Env<'_>) -> Option<(&'static str, String)> {
    [EnvVars::SLURM_JOB_NODELIST, EnvVars::SLURM_NODELIST]
        .into_iter()
        .find_map(|v| env(v).map(|l| (v, l)))
}

/// The names of the allocation's nodes alone (`SLURM_JOB_NODELIST`, or the older
/// `SLURM_NODELIST`); `None` when neither is set.
///
/// # Errors
///
/// [`CliError::Usage`] naming the variable, when its list is malformed.
pub fn allocation_node_names(env: Env<'_>) -> Result<Option<Vec<String>>, CliError> {
    let Some((var, list)) = node_list(env) else {
        return Ok(None);
    };
    expand_hostlist(&list)
        .map(Some)
        .map_err(|e| CliError::Usage(format!("{var}={e}")))
}

/// The allocation's hosts, from `SLURM_JOB_NODELIST` (or the older `SLURM_NODELIST`), with
/// slots from `SLURM_TASKS_PER_NODE` when the allocation asked for tasks (`--ntasks` or
/// `--ntasks-per-node`, which set `SLURM_NTASKS`/`SLURM_NTASKS_PER_NODE`); without, Slurm's
/// one task per node is its default, not the user's wish, and each host runs one worker per
/// device.
///
/// # Errors
///
/// [`CliError::Usage`] naming the variable and the part of it that is malformed, a missing
/// node list, or task counts that do not match the nodes.
pub fn allocation_hosts(env: Env<'_>) -> Result<Vec<HostSpec>, CliError> {
    let job = env(EnvVars::SLURM_JOB_ID).unwrap_or_default();
    let (var, list) = node_list(env).ok_or_else(|| {
        // A heterogeneous job (`salloc -N1 : -N1`) lists each component's nodes on its own.
        match env("SLURM_JOB_NODELIST_HET_GROUP_0") {
            Some(first) => CliError::Usage(format!(
                "Slurm job {job} is heterogeneous (SLURM_JOB_NODELIST_HET_GROUP_0={first}, ...), \
                 which --launcher slurm does not take apart; pass the hosts with -H/--hostfile"
            )),
            None => CliError::Usage(format!(
                "Slurm job {job}: SLURM_JOB_ID is set but SLURM_JOB_NODELIST is not; run inside \
                 salloc or sbatch, or pass -H/--hostfile"
            )),
        }
    })?;
    let named = |var: &str, e: NotationError| CliError::Usage(format!("{var}={e}"));
    let names = expand_hostlist(&list).map_err(|e| named(var, e))?;
    let asked_for_tasks = env("SLURM_NTASKS_PER_NODE").is_some() || env("SLURM_NTASKS").is_some();
    // Inside a step (`srun ... atlasboost run`), srun replaced the task counts with the
    // step's, while the node list stays the job's: the counts say nothing of the allocation.
    let task_counts = match in_step(env) {
        true => None,
        false => env(EnvVars::SLURM_TASKS_PER_NODE),
    };
    let slots: Vec<Option<u32>> = match task_counts {
        Some(tasks) => {
            // The whole value, then the entry: an empty entry alone would read as if the
            // variable were empty.
            let counts = expand_tasks_per_node(&tasks).map_err(|e| {
                CliError::Usage(format!("{}={tasks:?}: {e}", EnvVars::SLURM_TASKS_PER_NODE))
            })?;
            if counts.len() != names.len() {
                return Err(CliError::Usage(format!(
                    "{}={tasks:?} counts {} nodes, but {var}={list:?} has {}",
                    EnvVars::SLURM_TASKS_PER_NODE,
                    counts.len(),
                    names.len()
                )));
            }
            counts
                .into_iter()
                .map(|c| asked_for_tasks.then_some(c))
                .collect()
        }
        None => vec![None; names.len()],
    };
    Ok(names
        .into_iter()
        .zip(slots)
        .map(|(name, slots)| HostSpec {
            name,
            slots,
            origin: var.to_string(),
        })
        .collect())
}

/// Whether this runs as a task of a job step (srun's), not in the job's batch script or
/// salloc's shell: `SLURM_STEP_ID` is a step's number (the batch and extern steps' ids,
/// 0xFFFFFFF0 and above, are not steps srun made), and srun set the step's task counts as the
/// job's (`SLURM_STEP_TASKS_PER_NODE` = `SLURM_TASKS_PER_NODE`). Both, since an allocation
/// made from inside a step (`sbatch` from an `srun --pty` shell) inherits the step's
/// variables, but gets task counts of its own.
fn in_step(env: Env<'_>) -> bool {
    let numbered = env(EnvVars::SLURM_STEP_ID)
        .and_then(|id| id.trim().parse::<u32>().ok())
        .is_some_and(|id| id < 0xFFFF_FFF0);
    numbered
        && env("SLURM_STEP_TASKS_PER_NODE")
            .is_some_and(|step| env(EnvVars::SLURM_TASKS_PER_NODE).is_some_and(|job| job == step))
}

/// What Slurm says of the job's nodes when it starts, from one `scontrol show node
/// --oneliner`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodesAtStart {
    /// Each node's address as Slurm reaches it, resolved to IPv4, in the order of the names:
    /// the hosts' server ids.
    pub addresses: Vec<Ipv4Addr>,
    /// The nodes Slurm says not to use now (drained after the allocation gave them, down, ...);
    /// empty when scontrol could not answer.
    pub unusable: Vec<UnusableNode>,
}

/// Each node's address as Slurm reaches it (`NodeAddr`, which is the node's name unless the
/// cluster says otherwise), resolved to IPv4, and the nodes Slurm says not to use, from one
/// `scontrol show node --oneliner` (bounded to 20 s). A node `scontrol` does not list, or
/// every node when scontrol cannot answer, is resolved by its name.
///
/// # Errors
///
/// [`CliError::Usage`] naming a node whose address does not resolve to IPv4.
pub fn nodes_at_start(names: &[String]) -> Result<NodesAtStart, CliError> {
    let listed = parse_nodes(&scontrol_show_nodes(names, SCONTROL_LIMIT).unwrap_or_default());
    Ok(NodesAtStart {
        addresses: addresses_of(names, &listed)?,
        unusable: unusable_among(names, &listed).unwrap_or_default(),
    })
}

/// Each of `names` resolved to IPv4, through its `NodeAddr` where scontrol listed it.
fn addresses_of(
    names: &[String],
    listed: &HashMap<String, NodeRecord>,
) -> Result<Vec<Ipv4Addr>, CliError> {
    names
        .iter()
        .map(|name| {
            let addr = listed
                .get(name)
                .and_then(|node| node.addr.as_deref())
                .unwrap_or(name);
            resolve_ipv4(addr).ok_or_else(|| {
                CliError::Usage(format!(
                    "Slurm node {name:?}: its address {addr:?} does not resolve to an IPv4 address \
                     (server ids are IPv4 addresses); pass -H with addresses"
                ))
            })
        })
        .collect()
}

/// The output of `scontrol show node --oneliner NODES`, or why there is none (scontrol
/// missing, failing without a line, or taking longer than `limit`). scontrol exits 1 when one
/// of the nodes is not known ("Node abn9 not found") and still lists the others: that output
/// is kept.
fn scontrol_show_nodes(names: &[String], limit: Duration) -> Result<String, String> {
    show_nodes_with("scontrol".as_ref(), names, limit)
}

/// [`scontrol_show_nodes`] with `program` as scontrol.
fn show_nodes_with(
    program: &std::ffi::OsStr,
    names: &[String],
    limit: Duration,
) -> Result<String, String> {
    let child = Command::new(program)
        .args(["show", "node", "--oneliner"])
        .arg(compress_hostlist(names))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run scontrol: {e}"))?;
    let out = output_within(
        child,
        Instant::now(),
        limit,
        Duration::from_millis(10),
        "scontrol show node",
    )?;
    if !out.status.success() && out.stdout.trim().is_empty() {
        let said = out.stderr.trim();
        return Err(match said.is_empty() {
            true => format!("scontrol show node ended with {}", out.status),
            false => format!("scontrol show node ended with {}: {said}", out.status),
        });
    }
    Ok(out.stdout)
}

/// What `scontrol show node` says of one node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct NodeRecord {
    /// `NodeAddr=`.
    addr: Option<String>,
    /// `State=`: a base state and flags, `IDLE+DRAIN`, `DOWN+NOT_RESPONDING`.
    state: String,
    /// `Reason=`, without the `[user@time]` Slurm appends.
    reason: Option<String>,
}

/// Each line of `scontrol show node --oneliner`, by `NodeName=`. `Reason=` is the last field
/// of a line and holds spaces (`Reason=npu 3 ecc errors [root@2026-12-02T02:41:41]`).
fn parse_nodes(text: &str) -> HashMap<String, NodeRecord> {
    text.lines()
        .filter_map(|line| {
            let (fields, reason) = match line.split_once(" Reason=") {
                Some((fields, reason)) => (fields, Some(reason)),
                None => (line, None),
            };
            let field = |key: &str| {
                fields
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix(key))
                    .map(str::to_string)
            };
            let reason = reason.map(|r| {
                let r = r.trim_end();
                match r.rfind(" [") {
                    Some(at) if r.ends_with(']') => r[..at].to_string(),
                    _ => r.to_string(),
                }
            });
            let node = NodeRecord {
                addr: field("NodeAddr="),
                state: field("State=").unwrap_or_default(),
                reason: reason.filter(|r| !r.is_empty() && r != "(null)"),
            };
            Some((field("NodeName=")?, node))
        })
        .collect()
}

/// Whether a node in this `State=` must not be given work: down, drained or draining (a
/// health check, or an administrator, took it out), failing, not responding, or powered down.
fn unusable_state(state: &str) -> bool {
    state.split('+').any(|flag| {
        // sinfo's mark `*` (also in older scontrol) means not responding.
        if flag.ends_with('*') {
            return true;
        }
        // Other marks (`IDLE~`, `MIXED#`) say nothing against the node.
        let flag = flag.trim_end_matches(|c: char| !c.is_ascii_alphanumeric() && c != '_');
        matches!(
            flag,
            "DOWN"
                | "DRAIN"
                | "DRAINED"
                | "DRAINING"
                | "FAIL"
                | "FAILING"
                | "NOT_RESPONDING"
                | "INVALID_REG"
                | "FUTURE"
                | "REBOOT_ISSUED"
                | "POWER_DOWN"
                | "POWER_DRAIN"
                | "POWERED_DOWN"
                | "POWERING_DOWN"
                | "POWERING_UP"
        )
    })
}

/// A node that Slurm says not to use, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnusableNode {
    /// Its `NodeName`.
    pub name: String,
    /// Its `State=`, or `not one of its nodes` when scontrol does not list it.
    pub state: String,
    /// Its `Reason=`, when one is set.
    pub reason: Option<String>,
}

impl std::fmt::Display for UnusableNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} is {}", self.name, self.state)?;
        match &self.reason {
            Some(reason) => write!(f, " ({reason})"),
            None => Ok(()),
        }
    }
}

/// The nodes among `names` that Slurm says not to use now (drained or draining, down, failing,
/// not responding, powered down, or no longer Slurm's), as `scontrol show node` reports them.
///
/// # Errors
///
/// Why Slurm could not be asked: scontrol missing, failing (with what it said), taking
/// longer than 5 s, or listing none of the nodes.
pub fn unusable_nodes(names: &[String]) -> Result<Vec<UnusableNode>, String> {
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let nodes = parse_nodes(&scontrol_show_nodes(names, RESTART_SCONTROL_LIMIT)?);
    unusable_among(names, &nodes)
}

/// [`unusable_nodes`] from scontrol's lines, parsed. A node scontrol does not list is no
/// longer Slurm's (srun would refuse it); when it lists none of them, its output was not what
/// this reads, and nothing is said against any node.
fn unusable_among(
    names: &[String],
    nodes: &HashMap<String, NodeRecord>,
) -> Result<Vec<UnusableNode>, String> {
    if !names.iter().any(|n| nodes.contains_key(n)) {
        return Err(format!(
            "scontrol show node listed none of {}",
            compress_hostlist(names)
        ));
    }
    Ok(names
        .iter()
        .filter_map(|name| match nodes.get(name) {
            None => Some(UnusableNode {
                name: name.clone(),
                state: "not one of its nodes".into(),
                reason: None,
            }),
            Some(node) => unusable_state(&node.state).then(|| UnusableNode {
                name: name.clone(),
                state: node.state.clone(),
                reason: node.reason.clone(),
            }),
        })
        .collect())
}

fn resolve_ipv4(name: &str) -> Option<Ipv4Addr> {
    if let Ok(ip) = name.parse::<Ipv4Addr>() {
        return Some(ip);
    }
    (name, 0)
        .to_socket_addrs()
        .ok()?
        .find_map(|a| match a.ip() {
            IpAddr::V4(ip) => Some(ip),
            IpAddr::V6(_) => None,
        })
}

/// What the launcher tells every agent of the step on srun's stdin: where to connect, and the
/// secret to prove it belongs to the job.
#[derive(Debug, Serialize, Deserialize)]
pub struct Invitation {
    /// The job's id.
    pub job_id: String,
    /// The job's secret, in hex.
    pub secret: String,
    /// The address to connect to; `None`: `SLURM_LAUNCH_NODE_IPADDR`.
    pub address: Option<IpAddr>,
    /// The door's port.
    pub port: u16,
    /// How many hosts the step has.
    pub size: u32,
}

/// The `srun` step that runs the agents, and the door they connect back to.
pub struct Step {
    srun: Child,
    door: RelayDoor,
    /// The launcher's remote for each node name, by position.
    positions: HashMap<String, usize>,
    /// srun's (and the agents' stderr's) last lines.
    said: Arc<Mutex<SrunSaid>>,
}

impl std::fmt::Debug for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Step")
            .field("srun", &self.srun.id())
            .field("hosts", &self.positions.len())
            .finish_non_exhaustive()
    }
}

/// How the step is started.
#[derive(Debug)]
pub struct StepPlan<'a> {
    /// The hosts' Slurm node names, by position.
    pub nodes: &'a [String],
    /// The command that runs atlasboost on the nodes (`agent --slurm` is appended).
    pub atlasboost: &'a [OsString],
    /// Where the door listens and agents connect (`--nic`'s address), if not everywhere.
    pub address: Option<IpAddr>,
    /// The job's id.
    pub job_id: &'a str,
    /// Whether srun's lines are shown as they come (`-v`).
    pub verbose: bool,
}

impl Step {
    /// Opens the door and starts `srun ... atlasboost agent --slurm` on `plan.nodes`, with the
    /// invitation on its stdin.
    ///
    /// # Errors
    ///
    /// [`CliError::Failure`] when the door cannot be opened or srun cannot be started.
    pub fn start(plan: &StepPlan<'_>) -> Result<Step, CliError> {
        let size = plan.nodes.len() as u32;
        let secret = Secret::random().map_err(CliError::system("make the job's secret"))?;
        let door = RelayDoor::open(
            plan.address.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
            size,
            plan.job_id,
            secret.clone(),
        )
        .map_err(CliError::system("listen for the agents of the Slurm step"))?;
        let mut cmd = Command::new("srun");
        cmd.args(srun_args(plan.nodes));
        // srun reads these as options; `--exact` contradicts the step's `--whole`.
        for var in SRUN_OPTIONS_REMOVED {
            cmd.env_remove(var);
        }
        for var in SRUN_HELD {
            if let Some(value) = std::env::var_os(var) {
                cmd.env_remove(var)
                    .env(format!("{HELD_PREFIX}{var}"), value);
            }
        }
        cmd.args(srun_options(
            std::env::var_os(EnvVars::ATLASBOOST_SRUN_OPTIONS).as_deref(),
        )?);
        cmd.args(plan.atlasboost).args(["agent", "--slurm"]);
        let (reader, writer) = nix::unistd::pipe().map_err(|e| {
            CliError::system("make a pipe for srun's output")(std::io::Error::from(e))
        })?;
        let writer2 = writer
            .try_clone()
            .map_err(CliError::system("make a pipe for srun's output"))?;
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::from(writer))
            .stderr(Stdio::from(writer2))
            // Not in the launcher's group: a Ctrl-C reaches the agents through their channel,
            // after the launcher decided what to do with it.
            .process_group(0);
        // SAFETY: only prctl between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
                Ok(())
            });
        }
        let mut srun = cmd.spawn().map_err(|source| {
            CliError::Failure(format!(
                "cannot start srun (the Slurm launcher; is Slurm installed here?): {source}"
            ))
        })?;
        // The pipe's writing ends are srun's now; ours closed with `cmd`.
        drop(cmd);
        let said = Arc::new(Mutex::new(SrunSaid::new(SRUN_TAIL)));
        drain(File::from(reader), Arc::clone(&said), plan.verbose);
        let invitation = Invitation {
            job_id: plan.job_id.to_string(),
            secret: secret.to_hex(),
            address: plan.address,
            port: door.address().port(),
            size,
        };
        if let Some(mut stdin) = srun.stdin.take() {
            let mut line = serde_json::to_vec(&invitation)
                .map_err(CliError::json("encode the agents' invitation"))?;
            line.push(b'\n');
            // One short line into an empty pipe; srun's stdin is closed after it.
            let _ = stdin.write_all(&line);
        }
        Ok(Step {
            srun,
            door,
            positions: plan
                .nodes
                .iter()
                .enumerate()
                .map(|(i, n)| (n.clone(), i))
                .collect(),
            said,
        })
    }

    /// The descriptors to wait on for agents knocking at the door.
    pub fn fds(&self) -> Vec<BorrowedFd<'_>> {
        let mut fds = self.door.listeners();
        fds.extend(self.door.knocks());
        fds
    }

    /// Takes the agents that connected and proved themselves: each becomes the session of its
    /// host in `remotes` (by node name), which is sent `config_of(position)` at once. Returns
    /// what went wrong at the door, for messages (strangers are refused and named, never
    /// admitted).
    pub fn serve(
        &mut self,
        remotes: &mut [Remote],
        config_of: &dyn Fn(usize) -> Result<Vec<u8>, CliError>,
    ) -> Result<Vec<String>, CliError> {
        let knocks: Vec<usize> = (0..self.door.knocking()).collect();
        let mut refused = Vec::new();
        for event in self.door.serve(true, &knocks) {
            match event {
                DoorEvent::Admitted { host, remote, .. } => {
                    let Some(&position) = self.positions.get(&host) else {
                        refused.push(format!(
                            "an agent of the job on node {host:?}, which is not one of the step's \
                             nodes"
                        ));
                        continue;
                    };
                    if !remotes[position].is_awaited() {
                        refused.push(format!(
                            "a second agent for node {host:?}, whose agent is already in"
                        ));
                        continue;
                    }
                    let config = config_of(position)?;
                    let r = &mut remotes[position];
                    r.attach_step(*remote, Arc::clone(&self.said));
                    r.send_lines(&config);
                }
                DoorEvent::Refused(why) => refused.push(why.replace("relays'", "agents'")),
            }
        }
        Ok(refused)
    }

    /// srun's exit status once it has ended (`None` while it runs, or when the supervisor
    /// has reaped it).
    pub fn ended(&mut self) -> Option<String> {
        match self.srun.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            Ok(None) => None,
            Err(_) => Some("ended".into()),
        }
    }

    /// srun's last lines, joined for a message.
    pub fn said(&self) -> String {
        self.said
            .lock()
            .ok()
            .and_then(|s| s.tail.joined())
            .unwrap_or_else(|| "(nothing)".into())
    }

    /// srun's process id.
    pub fn pid(&self) -> u32 {
        self.srun.id()
    }
}

impl Drop for Step {
    /// srun ends once every agent has (their channels are closed before the step is dropped);
    /// one that does not is signalled: srun passes SIGTERM on to the step's tasks, and SIGKILL
    /// ends it.
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.srun.id() as i32);
        for (signal, wait) in [
            (None, SRUN_END_GRACE),
            (Some(Signal::SIGTERM), SRUN_END_GRACE),
            (Some(Signal::SIGKILL), SRUN_END_GRACE),
        ] {
            // `try_wait` fails once the supervisor has reaped srun: it has ended then, and
            // its pid may be someone else's.
            if !matches!(self.srun.try_wait(), Ok(None)) {
                return;
            }
            if let Some(s) = signal {
                let _ = nix::sys::signal::kill(pid, s);
            }
            let until = Instant::now() + wait;
            while Instant::now() < until {
                if !matches!(self.srun.try_wait(), Ok(None)) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// srun's arguments before the agent's command: one task per node, on exactly these nodes;
/// the whole job killed when an agent dies; no CPU binding (the agents' workers bind
/// themselves, `--bind-cores`); every resource of the node for the step, since the workers run
/// in it; the invitation to every task; each line labelled with its task.
///
/// And what a site's or the user's defaults must not change: the launcher's environment goes
/// to the agents (`sbatch --export=NONE` leaves `SLURM_EXPORT_ENV=NONE`, which the step would
/// inherit, and the agents would probe without the user's variables); an agent that ends
/// first does not get the others killed after slurm.conf's `WaitTime` (`--wait=0`); the step
/// starts beside steps that hold the allocation's CPUs (an `srun --pty bash`) instead of
/// pending without a word (`--overlap`); and no MPI plugin gives the agents, and through them
/// the workers, a PMI rank of the agents' step (`--mpi=none`, as Open MPI's PRRTE starts its
/// daemons).
fn srun_args(nodes: &[String]) -> Vec<String> {
    let n = nodes.len();
    vec![
        format!("--nodes={n}"),
        format!("--ntasks={n}"),
        "--ntasks-per-node=1".into(),
        format!("--nodelist={}", compress_hostlist(nodes)),
        "--kill-on-bad-exit=1".into(),
        "--cpu-bind=none".into(),
        "--whole".into(),
        "--overlap".into(),
        "--export=ALL".into(),
        "--wait=0".into(),
        "--mpi=none".into(),
        "--input=all".into(),
        "--label".into(),
        "--unbuffered".into(),
        "--job-name=atlasboost-agents".into(),
    ]
}

/// Reads srun's output to its end on a thread of its own (so that srun never blocks on a full
/// pipe, whatever the launcher is busy with): keeps the last lines, and shows them with `-v`.
fn drain(reader: File, said: Arc<Mutex<SrunSaid>>, verbose: bool) {
    std::thread::spawn(move || {
        for line in BufReader::new(reader).split(b'\n') {
            let Ok(line) = line else { return };
            let line = String::from_utf8_lossy(&line).trim_end().to_string();
            if verbose {
                to_stderr(&format!("atlasboost: srun: {line}\n"));
            }
            if let Ok(mut said) = said.lock() {
                said.push(line);
            }
        }
    });
}

/// The agent's side, before it reads its configuration: reads the invitation from stdin,
/// connects back to the launcher, proves it belongs to the job, and puts the connection in
/// place of its stdin and stdout, where the agent's channel is.
///
/// # Errors
///
/// What failed, naming the address or the variable.
pub fn agent_connect(env: Env<'_>) -> Result<(), String> {
    let line = read_invitation()?;
    let invitation: Invitation = serde_json::from_slice(&line)
        .map_err(|e| format!("the invitation on standard input is not valid: {e}"))?;
    let secret = Secret::from_hex(&invitation.secret)
        .ok_or("the invitation's secret is not 64 hex digits")?;
    let number = |var: &str| -> Result<u32, String> {
        let v = env(var).ok_or_else(|| format!("{var} is not set; is this a task of srun?"))?;
        v.parse()
            .map_err(|_| format!("{var}={v:?} is not a number"))
    };
    let node_id = number(EnvVars::SLURM_NODEID)?;
    let node = env(EnvVars::SLURMD_NODENAME).ok_or_else(|| {
        format!(
            "{} is not set; is this a task of srun?",
            EnvVars::SLURMD_NODENAME
        )
    })?;
    let address = match invitation.address {
        Some(a) => a.to_string(),
        None => env(EnvVars::SLURM_LAUNCH_NODE_IPADDR).ok_or_else(|| {
            format!(
                "{} is not set, and the launcher named no address (--nic)",
                EnvVars::SLURM_LAUNCH_NODE_IPADDR
            )
        })?,
    };
    let target = match address.parse::<std::net::Ipv6Addr>() {
        Ok(_) => format!("[{address}]:{}", invitation.port),
        Err(_) => format!("{address}:{}", invitation.port),
    };
    let connection = introduce(
        &target,
        None,
        &Introduction {
            job_id: &invitation.job_id,
            secret: &secret,
            rank: node_id,
            size: invitation.size,
            local_rank: 0,
            host: &node,
        },
        CONNECT_TIMEOUT,
        &[],
    )?
    .connection;
    nix::unistd::dup2_stdin(&connection)
        .and_then(|()| nix::unistd::dup2_stdout(&connection))
        .map_err(|e| format!("cannot put the connection in place of stdin and stdout: {e}"))?;
    Ok(())
}

/// What the workers of an agent of the Slurm step must not inherit from it, and what they get
/// instead: the step's per-task variables (`AGENT_TASK_VARS`) unset, the job's CPUs per task and name
/// (`SRUN_HELD`) back under their own names.
pub fn workers_env_under_slurm() -> (Vec<OsString>, Vec<(OsString, OsString)>) {
    workers_env_of(std::env::vars_os())
}

/// [`workers_env_under_slurm`] of an agent whose environment is `vars`.
fn workers_env_of(
    vars: impl Iterator<Item = (OsString, OsString)>,
) -> (Vec<OsString>, Vec<(OsString, OsString)>) {
    let mut unset = Vec::new();
    let mut set = Vec::new();
    for (name, value) in vars {
        let Some(text) = name.to_str() else { continue };
        if is_agent_task_var(text) || SRUN_HELD.contains(&text) {
            unset.push(name.clone());
        }
        if let Some(held) = text.strip_prefix(HELD_PREFIX) {
            unset.push(name.clone());
            set.push((OsString::from(held), value));
        }
    }
    (unset, set)
}

/// The agent's side, once it is done: closes its half of the connection and waits (at most
/// 20 s) for the launcher to close the other, so that nothing the launcher sent
/// is left unread: closing a socket with unread data resets the connection, and the launcher
/// could lose the agent's last frames.
pub fn agent_disconnect() {
    let _ = nix::sys::socket::shutdown(1, nix::sys::socket::Shutdown::Write);
    let until = Instant::now() + CONNECT_TIMEOUT;
    let mut buf = [0u8; 4096];
    let stdin = std::io::stdin();
    let fd = stdin.as_fd();
    while Instant::now() < until {
        let mut poll = [nix::poll::PollFd::new(fd, nix::poll::PollFlags::POLLIN)];
        match nix::poll::poll(&mut poll, nix::poll::PollTimeout::from(100u16)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => {}
            Err(_) => return,
        }
        match nix::unistd::read(fd, &mut buf) {
            Ok(0) => return,
            Ok(_) | Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => {}
            Err(_) => return,
        }
    }
}

/// The first line of stdin, read byte by byte (nothing after it is taken from the descriptor,
/// and the standard library's buffer of stdin stays empty).
fn read_invitation() -> Result<Vec<u8>, String> {
    let stdin = std::io::stdin();
    let fd: OwnedFd = stdin
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| format!("cannot use standard input: {e}"))?;
    let mut file = File::from(fd);
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match file.read(&mut byte) {
            Ok(0) => return Err("no invitation on standard input (srun's stdin ended)".into()),
            Ok(_) if byte[0] == b'\n' => return Ok(line),
            Ok(_) => line.push(byte[0]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("cannot read standard input: {e}")),
        }
        if line.len() > MAX_INVITATION {
            return Err(format!("an invitation longer than {MAX_INVITATION} bytes"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `salloc -N1 : -N1`: the node lists are the components'; said so, not that the job
    /// runs outside an allocation.
    #[test]
    fn a_heterogeneous_job_is_named() {
        let env = env_of(&[
            ("SLURM_JOB_ID", "32"),
            ("SLURM_JOB_NODELIST_HET_GROUP_0", "abn1"),
            ("SLURM_JOB_NODELIST_HET_GROUP_1", "abn2"),
        ]);
        let e = allocation_hosts(&env).unwrap_err().to_string();
        assert!(
            e.contains("Slurm job 32 is heterogeneous (SLURM_JOB_NODELIST_HET_GROUP_0=abn1, ...)")
                && e.contains("-H/--hostfile"),
            "{e}"
        );
    }

    #[test]
    fn srun_options_are_words_without_quotes() {
        let words = |v: &str| srun_options(Some(std::ffi::OsStr::new(v)));
        assert_eq!(srun_options(None).unwrap(), Vec::<String>::new());
        assert_eq!(
            words(" --qos=high\t--comment=a_b ").unwrap(),
            ["--qos=high", "--comment=a_b"]
        );
        for quoted in ["--comment='a b'", "--comment=\"a\"", "--x=a\\ b"] {
            let e = words(quoted).unwrap_err().to_string();
            assert!(
                e.contains(&format!(
                    "ATLASBOOST_SRUN_OPTIONS={quoted}: it is split at blanks"
                )),
                "{e}"
            );
        }
    }

    fn env_of(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| vars.get(k).cloned()
    }

    #[test]
    fn the_allocation_gives_hosts_and_slots_only_when_tasks_were_asked_for() {
        let env = env_of(&[
            ("SLURM_JOB_ID", "7"),
            ("SLURM_JOB_NODELIST", "n[1-3],gpu1"),
            ("SLURM_TASKS_PER_NODE", "2(x3),1"),
            ("SLURM_NTASKS_PER_NODE", "2"),
        ]);
        let hosts = allocation_hosts(&env).unwrap();
        let got: Vec<(&str, Option<u32>)> =
            hosts.iter().map(|h| (h.name.as_str(), h.slots)).collect();
        assert_eq!(
            got,
            [
                ("n1", Some(2)),
                ("n2", Some(2)),
                ("n3", Some(2)),
                ("gpu1", Some(1))
            ]
        );
        assert_eq!(hosts[0].origin, "SLURM_JOB_NODELIST");
        // `salloc -N3` alone: Slurm's one task per node is no wish of the user's.
        let env = env_of(&[
            ("SLURM_JOB_ID", "7"),
            ("SLURM_NODELIST", "n[1-3]"),
            ("SLURM_TASKS_PER_NODE", "1(x3)"),
        ]);
        let hosts = allocation_hosts(&env).unwrap();
        assert!(hosts.iter().all(|h| h.slots.is_none()));
        assert_eq!(hosts[2].origin, "SLURM_NODELIST");
    }

    /// `salloc -N2` then `srun -N1 -n1 atlasboost run`: srun replaced the task counts with
    /// its step's (1 task), the node list is still the job's two nodes.
    #[test]
    fn inside_a_step_the_steps_task_counts_are_not_the_allocations() {
        let step = [
            ("SLURM_JOB_ID", "7"),
            ("SLURM_JOB_NODELIST", "abn[1-2]"),
            ("SLURM_TASKS_PER_NODE", "1"),
            ("SLURM_NTASKS", "1"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_STEP_TASKS_PER_NODE", "1"),
        ];
        let hosts = allocation_hosts(&env_of(&step)).unwrap();
        let got: Vec<(&str, Option<u32>)> =
            hosts.iter().map(|h| (h.name.as_str(), h.slots)).collect();
        assert_eq!(got, [("abn1", None), ("abn2", None)]);
        // The same counts in the job's own shell are the allocation's, and do not match.
        let e = allocation_hosts(&env_of(&step[..4]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("counts 1 nodes"), "{e}");
        // The batch step's id is not a step of srun's.
        let mut batch = step;
        batch[4].1 = "4294967291";
        assert!(allocation_hosts(&env_of(&batch)).is_err());
        // An allocation made from inside a step: the step's variables, its own task counts.
        let mut inherited = step;
        inherited[5].1 = "2(x2)";
        assert!(allocation_hosts(&env_of(&inherited)).is_err());
    }

    /// An agent's environment under srun: the step's per-task variables go, the job's CPUs
    /// per task and name come back under their own names, the job's variables stay.
    #[test]
    fn workers_get_the_jobs_slurm_variables_not_the_agents_steps() {
        let agent = [
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_CPUS_PER_TASK", "1"),
            ("ATLASBOOST_SRUN_HELD_SLURM_CPUS_PER_TASK", "16"),
            ("SLURM_JOB_NAME", "atlasboost-agents"),
            ("ATLASBOOST_SRUN_HELD_SLURM_JOB_NAME", "train"),
            ("SLURM_JOB_ID", "7"),
            ("SLURM_STEP_ID", "0"),
        ]
        .map(|(k, v)| (OsString::from(k), OsString::from(v)));
        let (mut unset, set) = workers_env_of(agent.into_iter());
        unset.sort();
        assert_eq!(
            unset,
            [
                "ATLASBOOST_SRUN_HELD_SLURM_CPUS_PER_TASK",
                "ATLASBOOST_SRUN_HELD_SLURM_JOB_NAME",
                "SLURM_CPUS_PER_TASK",
                "SLURM_JOB_NAME",
                "SLURM_NTASKS",
                "SLURM_PROCID"
            ]
        );
        assert_eq!(
            set,
            [
                ("SLURM_CPUS_PER_TASK".into(), "16".into()),
                ("SLURM_JOB_NAME".into(), "train".into())
            ]
        );
    }

    #[test]
    fn the_agents_step_task_variables_are_told_from_the_jobs() {
        for task in [
            "SLURM_PROCID",
            "SLURM_LOCALID",
            "SLURM_NTASKS",
            "SLURM_STEP_NUM_TASKS",
            "SLURM_SRUN_COMM_HOST",
            "SLURM_CPU_BIND_TYPE",
        ] {
            assert!(is_agent_task_var(task), "{task}");
        }
        for job in [
            "SLURM_JOB_ID",
            "SLURM_JOB_NODELIST",
            "SLURM_JOB_NUM_NODES",
            "SLURM_STEP_ID",
            "SLURM_STEP_NODELIST",
            "SLURM_CLUSTER_NAME",
            "SLURMD_NODENAME",
        ] {
            assert!(!is_agent_task_var(job), "{job}");
        }
    }

    #[test]
    fn a_malformed_allocation_names_the_variable_and_the_part() {
        for (vars, want) in [
            (
                vec![("SLURM_JOB_ID", "7"), ("SLURM_JOB_NODELIST", "n[1-3,x]")],
                "SLURM_JOB_NODELIST=\"n[1-3,x]\": [1-3,x]: \"x\" is not a number",
            ),
            (
                vec![
                    ("SLURM_JOB_ID", "7"),
                    ("SLURM_JOB_NODELIST", "n[1-3]"),
                    ("SLURM_TASKS_PER_NODE", "2(x3"),
                ],
                "SLURM_TASKS_PER_NODE=\"2(x3\"",
            ),
            (
                vec![
                    ("SLURM_JOB_ID", "7"),
                    ("SLURM_JOB_NODELIST", "n[1-3]"),
                    ("SLURM_TASKS_PER_NODE", "2(x2)"),
                ],
                "counts 2 nodes, but SLURM_JOB_NODELIST=\"n[1-3]\" has 3",
            ),
            (vec![("SLURM_JOB_ID", "7")], "SLURM_JOB_NODELIST is not"),
        ] {
            let env = env_of(&vars);
            let e = allocation_hosts(&env).unwrap_err().to_string();
            assert!(e.contains(want), "{vars:?}: {e}");
        }
    }

    #[test]
    fn node_addresses_are_read_off_scontrols_lines() {
        let text = "NodeName=abn1 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.215.0.11 \
                    NodeHostName=abn1 Version=22.05.8\n\
                    NodeName=abn2 NodeAddr=abn2.cluster NodeHostName=abn2\n\
                    garbage line\n";
        let nodes = parse_nodes(text);
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes["abn1"].addr.as_deref(), Some("10.215.0.11"));
        assert_eq!(nodes["abn2"].addr.as_deref(), Some("abn2.cluster"));
    }

    #[test]
    fn node_states_and_reasons_are_read_off_scontrols_lines() {
        // As Slurm 22.05 prints them (the fixture's scontrol, shortened): `OS=` holds spaces,
        // and `Reason=` is last, with spaces and Slurm's `[user@time]`.
        let text = "NodeName=abn1 NodeAddr=10.215.0.11 OS=Linux 6.1 #1 SMP State=IDLE \
                    ThreadsPerCore=1\n\
                    NodeName=abn2 NodeAddr=10.215.0.12 State=IDLE+DRAIN ThreadsPerCore=1 \
                    ExtSensorsTemp=n/s Reason=npu 3 ecc errors [root@2026-12-02T02:41:41]\n\
                    NodeName=abn3 State=DOWN+NOT_RESPONDING Reason=Not responding [slurm@x]\n\
                    NodeName=abn4 State=MIXED+DRAIN Reason=hc\n";
        let nodes = parse_nodes(text);
        assert_eq!(nodes["abn1"].state, "IDLE");
        assert_eq!(nodes["abn1"].reason, None);
        assert_eq!(nodes["abn2"].state, "IDLE+DRAIN");
        assert_eq!(nodes["abn2"].reason.as_deref(), Some("npu 3 ecc errors"));
        assert_eq!(nodes["abn2"].addr.as_deref(), Some("10.215.0.12"));
        assert_eq!(nodes["abn3"].reason.as_deref(), Some("Not responding"));
        assert_eq!(nodes["abn4"].reason.as_deref(), Some("hc"));
        for (state, unusable) in [
            ("IDLE", false),
            ("ALLOCATED", false),
            ("MIXED+COMPLETING", false),
            ("IDLE+DRAIN", true),
            ("ALLOCATED+DRAIN", true),
            ("DOWN", true),
            ("DOWN*", true),
            ("IDLE+NOT_RESPONDING", true),
            ("ALLOCATED+FAIL", true),
            ("IDLE+POWERED_DOWN", true),
            ("IDLE*", true),
            ("ALLOCATED*", true),
            ("IDLE~", false),
            ("MIXED#", false),
            ("RESERVED", false),
            ("IDLE+REBOOT_ISSUED", true),
        ] {
            assert_eq!(unusable_state(state), unusable, "{state}");
        }
        let node = UnusableNode {
            name: "abn2".into(),
            state: "IDLE+DRAIN".into(),
            reason: Some("npu 3 ecc errors".into()),
        };
        assert_eq!(node.to_string(), "abn2 is IDLE+DRAIN (npu 3 ecc errors)");
    }

    /// [`show_nodes_with`] a fake scontrol, the shell script `script`, asked for `names`.
    fn fake_scontrol(script: &str, names: &[String]) -> Result<String, String> {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("scontrol");
        std::fs::write(&fake, format!("#!/bin/sh\n{script}")).unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        // Another test's fork may briefly hold the script open for writing (ETXTBSY).
        for _ in 0..50 {
            let said = show_nodes_with(fake.as_os_str(), names, SCONTROL_LIMIT);
            if !said.as_ref().is_err_and(|e| e.contains("Text file busy")) {
                return said;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("{} stayed busy", fake.display())
    }

    #[test]
    fn a_scontrol_that_cannot_answer_says_why() {
        let names = ["abn1".to_string()];
        let e = fake_scontrol(
            "echo 'slurm_load_node error: Unable to contact slurm controller' >&2\nexit 1\n",
            &names,
        )
        .unwrap_err();
        assert!(
            e.starts_with("scontrol show node ended with exit status: 1: slurm_load_node error"),
            "{e}"
        );
        let e =
            show_nodes_with("/nonexistent/scontrol".as_ref(), &names, SCONTROL_LIMIT).unwrap_err();
        assert!(e.starts_with("cannot run scontrol: "), "{e}");
    }

    #[test]
    fn a_node_scontrol_does_not_list_is_unusable_unless_it_lists_none() {
        // `scontrol show node abn1,abn9` prints abn1, says "Node abn9 not found" and exits 1.
        let names = ["abn1".to_string(), "abn9".to_string()];
        let text = fake_scontrol(
            "echo 'NodeName=abn1 NodeAddr=10.0.0.1 State=IDLE'\n\
             echo 'Node abn9 not found' >&2\nexit 1\n",
            &names,
        )
        .unwrap();
        let unusable = unusable_among(&names, &parse_nodes(&text)).unwrap();
        assert_eq!(
            unusable,
            [UnusableNode {
                name: "abn9".into(),
                state: "not one of its nodes".into(),
                reason: None,
            }]
        );
        assert_eq!(unusable[0].to_string(), "abn9 is not one of its nodes");
        let e = unusable_among(&names, &parse_nodes("garbage\n")).unwrap_err();
        assert_eq!(e, "scontrol show node listed none of abn[1,9]");
    }

    #[test]
    fn a_node_that_resolves_nowhere_is_named() {
        let none = HashMap::new();
        let e = addresses_of(&["no-such-node.invalid".into()], &none)
            .unwrap_err()
            .to_string();
        assert!(e.contains("Slurm node \"no-such-node.invalid\""), "{e}");
        assert_eq!(
            addresses_of(&["127.0.0.7".into()], &none).unwrap(),
            [Ipv4Addr::new(127, 0, 0, 7)]
        );
        // A listed node is reached at its NodeAddr, not its name.
        let listed = parse_nodes("NodeName=abn1 NodeAddr=127.0.0.9 State=IDLE\n");
        assert_eq!(
            addresses_of(&["abn1".into()], &listed).unwrap(),
            [Ipv4Addr::new(127, 0, 0, 9)]
        );
    }

    #[test]
    fn srun_runs_one_agent_per_listed_node_and_kills_the_step_when_one_dies() {
        let args = srun_args(&["n1".into(), "n2".into(), "n3".into(), "gpu7".into()]);
        for want in [
            "--nodes=4",
            "--ntasks=4",
            "--ntasks-per-node=1",
            "--nodelist=n[1-3],gpu7",
            "--kill-on-bad-exit=1",
            "--cpu-bind=none",
            "--input=all",
            "--export=ALL",
            "--wait=0",
            "--overlap",
            "--mpi=none",
        ] {
            assert!(
                args.iter().any(|a| a == want),
                "{want} missing from {args:?}"
            );
        }
    }
}
