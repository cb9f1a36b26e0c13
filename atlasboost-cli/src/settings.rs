//! The command line, resolved once (uv's `settings.rs` pattern): each command's clap arguments
//! ([`crate::cli`]) become plain settings here, at the edge, and nothing past this module sees
//! a clap type. Device discovery resolves into the library's
//! [`Discovery`], which remote agents receive as it is.

use std::ffi::OsString;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use atlasboost::settings::{Discovery, Origin};
use atlasboost_core::worker_env::Framework;
use atlasboost_core::{Chip, ranktable::Format};

use crate::cli::{
    DeviceArgs, DiscoveryArgs, LauncherArg, MergeArgs, ProbeArgs, RankOrderArg, RanktableArgs,
    RunArgs, ValidateArgs,
};
use crate::error::CliError;
pub use crate::rank_list::RankList;

/// How the hosts' agents are started (`--launcher`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// Slurm inside an allocation without `-H`/`--hostfile`, else ssh.
    Auto,
    /// ssh, in a tree.
    Ssh,
    /// One `srun` step.
    Slurm,
}

/// `--rank-order`: how servers are ordered in the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerOrder {
    /// Sorted by server id (what MindSpore and HCCL's legacy parser expect).
    ServerId,
    /// As the hosts are listed.
    Hosts,
}

/// This host's devices: how to find them, and the server id to give them.
#[derive(Debug, Clone)]
pub struct DeviceSettings {
    /// Where the devices come from.
    pub discovery: Discovery,
    /// `--server-id`.
    pub server_id: Option<String>,
}

/// `atlasboost probe`.
#[derive(Debug, Clone)]
pub struct ProbeSettings {
    /// The devices.
    pub devices: DeviceSettings,
    /// JSON instead of a table.
    pub json: bool,
    /// `--watch`: sample the telemetry this often, until interrupted.
    pub watch: Option<std::time::Duration>,
}

/// `atlasboost ranktable`.
#[derive(Debug, Clone)]
pub struct RanktableSettings {
    /// The devices.
    pub devices: DeviceSettings,
    /// The table's format.
    pub format: Format,
    /// The chip whose rules apply (else the devices').
    pub chip: Option<Chip>,
    /// Where to write it (`-`: standard output; none: HCCL's file name).
    pub output: Option<PathBuf>,
}

/// `atlasboost merge`.
#[derive(Debug, Clone)]
pub struct MergeSettings {
    /// The tables to merge.
    pub inputs: Vec<PathBuf>,
    /// The chip whose rules apply.
    pub chip: Option<Chip>,
    /// Where to write the result.
    pub output: Option<PathBuf>,
}

/// `atlasboost validate`.
#[derive(Debug, Clone)]
pub struct ValidateSettings {
    /// The table.
    pub file: PathBuf,
    /// The chip whose rules apply.
    pub chip: Option<Chip>,
    /// JSON instead of text.
    pub json: bool,
    /// Warnings are errors.
    pub strict: bool,
}

/// How often devices and workers are sampled without `--monitor-interval` (SPEC §13).
pub const DEFAULT_MONITOR_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// The launch tree's width without `--fanout` (SPEC §14).
pub const DEFAULT_FANOUT: usize = 32;

/// `atlasboost run` (SPEC §5): the same options as the flags, resolved.
#[derive(Debug, Clone)]
pub struct RunSettings {
    /// `-n`.
    pub np: Option<u32>,
    /// `-H`, as typed.
    pub hosts: Option<String>,
    /// `--hostfile`.
    pub hostfile: Option<PathBuf>,
    /// How each host finds its devices.
    pub discovery: Discovery,
    /// `--framework`.
    pub framework: Framework,
    /// `--rank-table`, relative to the workers' directory.
    pub rank_table: PathBuf,
    /// `--format`.
    pub format: Format,
    /// `--chip`: the table's rules, over what the devices report.
    pub chip: Option<Chip>,
    /// `--rank-order`.
    pub rank_order: ServerOrder,
    /// `-x NAME[=VALUE]`.
    pub env: Vec<(String, Option<String>)>,
    /// `--wdir`.
    pub wdir: Option<PathBuf>,
    /// `--log-dir`.
    pub log_dir: Option<PathBuf>,
    /// `--no-tag`.
    pub no_tag: bool,
    /// `--timestamp`.
    pub timestamp: bool,
    /// `--ranks`.
    pub ranks: Option<RankList>,
    /// `--rendezvous-timeout`.
    pub rendezvous_timeout: Duration,
    /// `--grace`.
    pub grace: Duration,
    /// `--host-timeout`: the silence after which a host (or a relay) is lost.
    pub host_timeout: Duration,
    /// Whether `--host-timeout` was given (it is said to be unused where no host can be lost).
    pub host_timeout_given: bool,
    /// `--max-restarts`.
    pub max_restarts: u32,
    /// `--restart-delay`; `None` when not given (1 s, [`RunSettings::first_restart_delay`]).
    pub restart_delay: Option<Duration>,
    /// `--min-np`.
    pub min_np: Option<u32>,
    /// `--hang-timeout`.
    pub hang_timeout: Option<Duration>,
    /// `--hang-dump`.
    pub hang_dump: bool,
    /// `--ssh-port`.
    pub ssh_port: Option<u16>,
    /// `--ssh-identity`.
    pub ssh_identity: Option<PathBuf>,
    /// `--remote-atlasboost`.
    pub remote_atlasboost: Option<PathBuf>,
    /// `--rendezvous-addr`.
    pub rendezvous_addr: Option<IpAddr>,
    /// `--fanout`: the launch tree's width (at least 1), if given (else [`DEFAULT_FANOUT`]).
    pub fanout: Option<usize>,
    /// `--launcher`.
    pub launcher: Engine,
    /// `--events FILE`.
    pub events: Option<PathBuf>,
    /// `--monitor-interval` (`None`: off), else [`DEFAULT_MONITOR_INTERVAL`].
    pub monitor_interval: Option<std::time::Duration>,
    /// Whether `--monitor-interval` was given (`--mpi` samples nothing: refused there).
    pub monitor_interval_given: bool,
    /// `--metrics ADDR:PORT`.
    pub metrics: Option<std::net::SocketAddr>,
    /// `--nic`.
    pub nic: Option<atlasboost::host::NicChoice>,
    /// `--bind-cores`.
    pub bind_cores: bool,
    /// `--mpi`.
    pub mpi: bool,
    /// The workers' command.
    pub command: Vec<OsString>,
}

impl RunSettings {
    /// The wait before the first restart: `--restart-delay`, 1 s when not given.
    pub fn first_restart_delay(&self) -> Duration {
        self.restart_delay.unwrap_or(Duration::from_secs(1))
    }
}

impl From<&DiscoveryArgs> for Discovery {
    fn from(a: &DiscoveryArgs) -> Discovery {
        Discovery {
            probe: a.probe.into(),
            sim: a.sim,
            sim_chip: a.sim_chip.clone(),
            sim_ipv6: a.sim_ipv6,
            devices: a.devices.clone(),
            hccn_conf: a.hccn_conf.clone(),
            origin: Origin::CommandLine,
            sim_faults: None,
        }
    }
}

impl From<&DeviceArgs> for DeviceSettings {
    fn from(a: &DeviceArgs) -> DeviceSettings {
        DeviceSettings {
            discovery: (&a.discovery).into(),
            server_id: a.server_id.clone(),
        }
    }
}

impl From<&ProbeArgs> for ProbeSettings {
    fn from(a: &ProbeArgs) -> ProbeSettings {
        ProbeSettings {
            devices: (&a.devices).into(),
            json: a.json,
            watch: a.watch,
        }
    }
}

impl From<&RanktableArgs> for RanktableSettings {
    fn from(a: &RanktableArgs) -> RanktableSettings {
        RanktableSettings {
            devices: (&a.devices).into(),
            format: a.format,
            chip: a.chip,
            output: a.output.clone(),
        }
    }
}

impl From<&MergeArgs> for MergeSettings {
    fn from(a: &MergeArgs) -> MergeSettings {
        MergeSettings {
            inputs: a.inputs.clone(),
            chip: a.chip,
            output: a.output.clone(),
        }
    }
}

impl From<&ValidateArgs> for ValidateSettings {
    fn from(a: &ValidateArgs) -> ValidateSettings {
        ValidateSettings {
            file: a.file.clone(),
            chip: a.chip,
            json: a.json,
            strict: a.strict,
        }
    }
}

impl From<&RunArgs> for RunSettings {
    fn from(a: &RunArgs) -> RunSettings {
        RunSettings {
            np: a.np,
            hosts: a.hosts.clone(),
            hostfile: a.hostfile.clone(),
            discovery: (&a.discovery).into(),
            framework: a.framework,
            rank_table: a.rank_table.clone(),
            format: a.format,
            chip: a.chip,
            rank_order: match a.rank_order {
                RankOrderArg::ServerId => ServerOrder::ServerId,
                RankOrderArg::Hosts => ServerOrder::Hosts,
            },
            env: a.env.clone(),
            wdir: a.wdir.clone(),
            log_dir: a.log_dir.clone(),
            no_tag: a.no_tag,
            timestamp: a.timestamp,
            ranks: a.ranks.clone(),
            rendezvous_timeout: a.rendezvous_timeout,
            grace: a.grace,
            host_timeout: a.host_timeout.unwrap_or(crate::launch::channel::LOST_AFTER),
            host_timeout_given: a.host_timeout.is_some(),
            max_restarts: a.max_restarts,
            restart_delay: a.restart_delay,
            min_np: a.min_np,
            // `off` is zero: no watchdog.
            hang_timeout: a.hang_timeout.filter(|t| !t.is_zero()),
            hang_dump: a.hang_dump,
            ssh_port: a.ssh_port,
            ssh_identity: a.ssh_identity.as_deref().map(ssh_identity_path),
            remote_atlasboost: a.remote_atlasboost.clone(),
            rendezvous_addr: a.rendezvous_addr,
            fanout: a.fanout.map(|k| k as usize),
            launcher: match a.launcher {
                LauncherArg::Auto => Engine::Auto,
                LauncherArg::Ssh => Engine::Ssh,
                LauncherArg::Slurm => Engine::Slurm,
            },
            events: a.events.clone(),
            monitor_interval: Some(a.monitor_interval.unwrap_or(DEFAULT_MONITOR_INTERVAL))
                .filter(|every| !every.is_zero()),
            monitor_interval_given: a.monitor_interval.is_some(),
            metrics: a.metrics,
            nic: a.nic.clone(),
            bind_cores: a.bind_cores,
            mpi: a.mpi,
            command: a.command.clone(),
        }
    }
}

/// A variable that switches something on (`1`) or off (`0`): `None` when it is unset. `what`
/// says what the switch does, for the error.
///
/// # Errors
///
/// [`CliError::Failure`] for any other value, naming the variable: a malformed variable is bad
/// input (exit 125), as every other `ATLASBOOST_*` variable's; usage errors are the command
/// line's.
pub fn switch(name: &str, what: &str) -> Result<Option<bool>, CliError> {
    match std::env::var(name).as_deref() {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Ok("1") => Ok(Some(true)),
        Ok("0") => Ok(Some(false)),
        Ok(other) => Err(CliError::Failure(format!(
            "{name}={other}: expected 0 or 1 ({what})"
        ))),
        Err(std::env::VarError::NotUnicode(v)) => Err(CliError::Failure(format!(
            "{name}={}: expected 0 or 1 ({what})",
            v.to_string_lossy()
        ))),
    }
}

/// `--ssh-identity` as it goes down the launch tree: a relative path made the launcher's
/// working directory's (an agent that passes it down runs ssh elsewhere); `~...` as given, for
/// ssh to expand on each host.
fn ssh_identity_path(given: &std::path::Path) -> PathBuf {
    if given.as_os_str().as_encoded_bytes().starts_with(b"~") {
        return given.to_path_buf();
    }
    std::path::absolute(given).unwrap_or_else(|_| given.to_path_buf())
}

/// `path` with a leading `~/` as ssh expands it here: the account's home from the password
/// database (not `$HOME`, which ssh ignores), else `$HOME`. Other paths as they are.
#[must_use]
pub fn as_ssh_expands_it(path: &std::path::Path) -> PathBuf {
    let home = nix::unistd::User::from_uid(nix::unistd::getuid())
        .ok()
        .flatten()
        .map(|user| user.dir)
        .or_else(|| std::env::var_os("HOME").map(PathBuf::from));
    match (path.strip_prefix("~"), home) {
        (Ok(rest), Some(home)) => home.join(rest),
        _ => path.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ssh_identity_goes_down_the_tree_absolute_or_for_ssh_to_expand() {
        let here = std::env::current_dir().unwrap();
        assert_eq!(
            ssh_identity_path(std::path::Path::new("keys/id")),
            here.join("keys/id")
        );
        // Absolute as it is; `~` is each host's ssh's to expand (homes differ).
        for given in ["/k/id", "~/.ssh/id", "~other/id"] {
            assert_eq!(
                ssh_identity_path(std::path::Path::new(given)),
                std::path::PathBuf::from(given)
            );
        }
        // Checked here where ssh would read it: the account's home, not $HOME.
        let home = nix::unistd::User::from_uid(nix::unistd::getuid())
            .unwrap()
            .unwrap()
            .dir;
        assert_eq!(
            as_ssh_expands_it(std::path::Path::new("~/.ssh/id")),
            home.join(".ssh/id")
        );
        assert_eq!(
            as_ssh_expands_it(std::path::Path::new("/k/id")),
            std::path::PathBuf::from("/k/id")
        );
    }
}
