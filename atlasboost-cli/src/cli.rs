//! The command line (SPEC §5), as clap types.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use atlasboost::host::NicChoice;
use atlasboost::settings::{ProbeKind, parse_seconds, parse_seconds_or_zero};

use crate::rank_list::RankList;
use atlasboost_core::ranktable::Format;
use atlasboost_core::worker_env::Framework;
use atlasboost_core::{Chip, DeviceList};
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand, ValueEnum};

/// Launch distributed training on Huawei Ascend NPU servers, and make the HCCL rank tables it needs.
#[derive(Debug, Parser)]
#[command(name = "atlasboost", version = atlasboost::build_info::VERSION, propagate_version = true)]
pub struct Cli {
    /// Print only results and errors.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,

    /// Print more of atlasboost's own messages.
    #[arg(short, long, global = true)]
    pub verbose: bool,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Write the rank table of this server (like Ascend's hccl_tools.py).
    Ranktable(RanktableArgs),
    /// Merge single-server rank tables into one cluster table (like merge_hccl.py, but checked).
    Merge(MergeArgs),
    /// Check a rank table against every rule HCCL applies; list every problem.
    Validate(ValidateArgs),
    /// List this server's devices.
    Probe(ProbeArgs),
    /// Launch a job: one worker per NPU on every host, with a rank table and live output.
    Run(Box<RunArgs>),
    /// Internal: the remote side of a launch, started by `atlasboost run` over ssh; reads its
    /// configuration on standard input.
    #[command(hide = true)]
    Agent(AgentArgs),
    /// Internal: one rank of `atlasboost run --mpi`, started by mpirun: runs the worker and
    /// sends its output and exit to the launcher.
    #[command(hide = true)]
    Relay(RelayArgs),
    /// Internal: ssh's `ProxyCommand` for a session of `atlasboost run`: connects with
    /// TCP_NODELAY and hands the connection to ssh (`ProxyUseFdpass`).
    #[command(name = "ssh-connect", hide = true)]
    SshConnect(SshConnectArgs),
}

/// `atlasboost ssh-connect HOST PORT`.
#[derive(Debug, Args)]
pub struct SshConnectArgs {
    /// The host to connect to (ssh's `%h`).
    pub host: String,
    /// Its port (ssh's `%p`).
    pub port: u16,
    /// Seconds to wait for each connection (ssh's `ConnectTimeout`).
    #[arg(long, default_value_t = 10)]
    pub timeout: u64,
    /// How many rounds of tries over the host's addresses (ssh's `ConnectionAttempts`).
    #[arg(long, default_value_t = 1)]
    pub attempts: u32,
    /// Which addresses to try (ssh's `AddressFamily`).
    #[arg(long, value_enum, default_value_t = AddressFamilyArg::Any)]
    pub family: AddressFamilyArg,
}

/// ssh's `AddressFamily`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AddressFamilyArg {
    /// IPv4 and IPv6.
    Any,
    /// IPv4 only.
    Inet,
    /// IPv6 only.
    Inet6,
}

/// `atlasboost agent`.
#[derive(Debug, Args)]
pub struct AgentArgs {
    /// Started by the srun step of `--launcher slurm`: connect back to the launcher with the
    /// invitation read on standard input, and speak the channel on that connection.
    #[arg(long)]
    pub slurm: bool,
}

/// `atlasboost relay -- COMMAND`.
#[derive(Debug, Args)]
pub struct RelayArgs {
    /// The worker's command, and its arguments.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// Where devices come from (`--probe`); resolved into [`ProbeKind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProbeArg {
    /// The driver if it loads, else /etc/hccn.conf; never simulated devices.
    Auto,
    /// The driver's DSMI library.
    Dsmi,
    /// /etc/hccn.conf.
    Hccn,
    /// Simulated devices (needs --sim N).
    Sim,
}

impl From<ProbeArg> for ProbeKind {
    fn from(p: ProbeArg) -> ProbeKind {
        match p {
            ProbeArg::Auto => ProbeKind::Auto,
            ProbeArg::Dsmi => ProbeKind::Dsmi,
            ProbeArg::Hccn => ProbeKind::Hccn,
            ProbeArg::Sim => ProbeKind::Sim,
        }
    }
}

/// Device discovery options shared by `run`, `ranktable` and `probe` (SPEC §3).
#[derive(Debug, Clone, Args)]
pub struct DiscoveryArgs {
    /// Where to find devices.
    #[arg(long, value_enum, default_value_t = ProbeArg::Auto)]
    pub probe: ProbeArg,

    /// Use N simulated devices (implies --probe sim).
    #[arg(allow_negative_numbers = true, long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=255))]
    pub sim: Option<u32>,

    /// Chip name the simulated devices report (910, 910B3, 910_9391).
    #[arg(long, value_name = "NAME", default_value = "910", requires = "sim",
          value_parser = parse_sim_chip)]
    pub sim_chip: String,

    /// Give simulated devices IPv6 addresses.
    #[arg(long, requires = "sim")]
    pub sim_ipv6: bool,

    /// Only these physical devices, e.g. 0-3 or 0,1,4.
    #[arg(long, value_name = "LIST", value_parser = parse_device_list)]
    pub devices: Option<DeviceList>,

    /// The hccn.conf to read, with --probe hccn or auto [default: $ATLASBOOST_HCCN_CONF, else
    /// /etc/hccn.conf].
    #[arg(long, value_name = "PATH")]
    pub hccn_conf: Option<PathBuf>,
}

/// Device discovery on this host only (`ranktable`, `probe`): discovery and the server id.
#[derive(Debug, Args)]
pub struct DeviceArgs {
    /// Device discovery.
    #[command(flatten)]
    pub discovery: DiscoveryArgs,

    /// This server's id, as a rank table names it (`probe` shows it) [default: this host's
    /// primary IPv4 address].
    #[arg(long, value_name = "ID", value_parser = parse_server_id)]
    pub server_id: Option<String>,
}

/// `atlasboost ranktable`.
#[derive(Debug, Args)]
pub struct RanktableArgs {
    /// Device discovery.
    #[command(flatten)]
    pub devices: DeviceArgs,

    /// Rank table format.
    #[arg(long, value_name = "FORMAT", default_value = "1.0", value_parser = format_parser())]
    pub format: Format,

    /// Validation rules [default: the chip the devices report].
    #[arg(long, value_name = "CHIP", value_parser = chip_parser())]
    pub chip: Option<Chip>,

    /// Output file (`-` for standard output); default `hccl_<n>p_<ids>_<server_id>.json`.
    #[arg(
        short,
        long,
        value_name = "PATH",
        value_parser = parse_output_path,
        help = "Output file; `-` for standard output [default: hccl_<n>p_<ids>_<server_id>.json]"
    )]
    pub output: Option<PathBuf>,
}

/// `atlasboost merge`.
#[derive(Debug, Args)]
pub struct MergeArgs {
    /// The tables to merge, in server order (one of them may be `-`, standard input).
    #[arg(required = true, num_args = 2.., value_name = "TABLE.json")]
    pub inputs: Vec<PathBuf>,

    /// Validation rules for the inputs and the result [default: 910_93 for version 1.2, else 910].
    #[arg(long, value_name = "CHIP", value_parser = chip_parser())]
    pub chip: Option<Chip>,

    /// Output file (`-` for standard output); default `hccl_<S>s_<N>p.json`.
    #[arg(
        short,
        long,
        value_name = "PATH",
        value_parser = parse_output_path,
        help = "Output file; `-` for standard output [default: hccl_<S>s_<N>p.json]"
    )]
    pub output: Option<PathBuf>,
}

/// `atlasboost validate`.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// The rank table to check (`-`: standard input).
    #[arg(value_name = "FILE.json")]
    pub file: PathBuf,

    /// Which chip's rules to apply [default: 910_93 for version 1.2, else 910].
    #[arg(long, value_name = "CHIP", value_parser = chip_parser())]
    pub chip: Option<Chip>,

    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,

    /// Count warnings (what HCCL only recommends) as errors: exit 1.
    #[arg(long)]
    pub strict: bool,
}

/// `atlasboost probe`.
#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// Device discovery.
    #[command(flatten)]
    pub devices: DeviceArgs,

    /// Print the devices as JSON.
    #[arg(long)]
    pub json: bool,

    /// Sample the devices' telemetry every SECS (default 2) until interrupted, like `npu-smi
    /// info` refreshed: a table redrawn in place on a terminal, one block per sample otherwise,
    /// one JSON object per line with --json.
    #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "2",
          value_parser = parse_watch_interval)]
    pub watch: Option<std::time::Duration>,
}

/// `atlasboost run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Total workers [default: every slot, or every device]; `-np N` works too.
    #[arg(allow_negative_numbers = true, short = 'n', long = "np", value_name = "N",
          value_parser = at_least_1)]
    pub np: Option<u32>,

    /// Hosts: a comma-separated list of HOST or HOST:SLOTS (a host without slots uses all its devices).
    #[arg(short = 'H', long, value_name = "LIST", conflicts_with = "hostfile")]
    pub hosts: Option<String>,

    /// A file of hosts: lines `host slots=N`, `host:N` or `host`; `#` starts a comment.
    #[arg(long, value_name = "FILE")]
    pub hostfile: Option<PathBuf>,

    /// Device discovery on every host.
    #[command(flatten)]
    pub discovery: DiscoveryArgs,

    /// Which framework's variables to set.
    #[arg(long, value_name = "NAME", default_value = "tensorflow", value_parser = framework_parser())]
    pub framework: Framework,

    /// Where every host writes the cluster rank table (relative to --wdir; a name ending in
    /// .json); one running job per path on each host.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "rank_table.json",
        value_parser = text_parser(parse_table_path, "RANK_TABLE_FILE gives it as text")
    )]
    pub rank_table: PathBuf,

    /// Rank table format.
    #[arg(long, value_name = "FORMAT", default_value = "1.0", value_parser = format_parser())]
    pub format: Format,

    /// Validation rules of the table [default: the chip the devices report; 910 for
    /// hccn.conf's, which report none].
    #[arg(long, value_name = "CHIP", value_parser = chip_parser())]
    pub chip: Option<Chip>,

    /// Server order in the table: by server id, or as the hosts are listed.
    #[arg(long, value_enum, value_name = "ORDER", default_value_t = RankOrderArg::ServerId)]
    pub rank_order: RankOrderArg,

    /// Export a variable to every worker: NAME=VALUE, or NAME for this shell's value.
    #[arg(
        short = 'x',
        long = "env",
        value_name = "NAME[=VALUE]",
        value_parser = text_parser(
            parse_export,
            "export it in this shell and give -x NAME: that passes its bytes on as they are"
        )
    )]
    pub env: Vec<(String, Option<String>)>,

    /// The workers' directory on every host [default: the current directory].
    #[arg(long, value_name = "DIR")]
    pub wdir: Option<PathBuf>,

    /// Also write each rank's stdout.log and stderr.log in DIR/ID/rank.N/, ID being the job's id
    /// (DIR/latest: the newest job's); never over another job's logs.
    #[arg(long, value_name = "DIR")]
    pub log_dir: Option<PathBuf>,

    /// Print workers' lines without the rank and stream prefix.
    #[arg(long)]
    pub no_tag: bool,

    /// Start every line with its time (ISO 8601, UTC).
    #[arg(long)]
    pub timestamp: bool,

    /// Show only these ranks on the console, e.g. 0 or 0-3,8 (log files keep all).
    #[arg(long, value_name = "LIST", value_parser = parse_rank_list)]
    pub ranks: Option<RankList>,

    /// Seconds to wait for every host to join.
    #[arg(allow_negative_numbers = true, long, value_name = "SECS", default_value = "120", value_parser = parse_seconds)]
    pub rendezvous_timeout: Duration,

    /// Seconds between SIGTERM and SIGKILL when stopping workers.
    #[arg(allow_negative_numbers = true, long, value_name = "SECS", default_value = "10", value_parser = parse_seconds_or_zero)]
    pub grace: Duration,

    /// Seconds a host's agent (with --mpi: a rank's relay) may send nothing before the host
    /// is lost, and the launcher before the agents stop their workers; raise it where the
    /// network has blips (TCP's retransmission backoff makes a 2 s blip about 4 s of silence)
    /// [default: 4].
    #[arg(allow_negative_numbers = true, long, value_name = "SECS", value_parser = parse_host_timeout)]
    pub host_timeout: Option<Duration>,

    /// Restart every worker up to N times after a failed worker, a lost host or a hang.
    #[arg(
        allow_negative_numbers = true,
        long,
        value_name = "N",
        default_value_t = 0,
        value_parser = at_least_0
    )]
    pub max_restarts: u32,

    /// With --max-restarts: seconds before the first restart, doubling for each one after it up
    /// to 30 (a longer delay stays as given) [default: 1].
    #[arg(allow_negative_numbers = true, long, value_name = "SECS", value_parser = parse_seconds_or_zero,
          requires = "max_restarts")]
    pub restart_delay: Option<Duration>,

    /// With --max-restarts: the smallest world a restart may shrink to, leaving out unhealthy
    /// devices and lost hosts (the first attempt too, when a device is unhealthy or a host's
    /// probe fails as it starts)
    /// [default: the first attempt's size: no shrinking].
    #[arg(allow_negative_numbers = true, long, value_name = "M", value_parser = at_least_1,
          requires = "max_restarts")]
    pub min_np: Option<u32>,

    /// Fail the attempt (exit 124) when a rank shows no progress, no output (a line or a part
    /// of one) and no heartbeat, for SECS; `off` for never [default: off].
    #[arg(allow_negative_numbers = true, long, value_name = "SECS", value_parser = parse_hang_timeout)]
    pub hang_timeout: Option<Duration>,

    /// With --hang-timeout: take each stuck rank's Python stacks first (py-spy, or faulthandler).
    #[arg(long, requires = "hang_timeout")]
    pub hang_dump: bool,

    /// ssh port of the remote hosts [default: ssh's own, e.g. from ~/.ssh/config].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub ssh_port: Option<u16>,

    /// ssh identity file for the remote hosts.
    #[arg(long, value_name = "FILE")]
    pub ssh_identity: Option<PathBuf>,

    /// Path of atlasboost on the remote hosts [default: this executable's path].
    #[arg(long, value_name = "PATH")]
    pub remote_atlasboost: Option<PathBuf>,

    /// Sample every host's devices (AI core, HBM, temperature, power, health) and workers (CPU,
    /// memory) this often, for --metrics and --events; `off` for never [default: 5].
    #[arg(allow_negative_numbers = true, long, value_name = "SECS", value_parser = parse_monitor_interval)]
    pub monitor_interval: Option<std::time::Duration>,

    /// Serve the job's metrics for Prometheus at ADDR:PORT (a host name too; a PORT alone: on
    /// loopback), with MindX npu-exporter's names (npu_chip_info_utilization, ...) and
    /// atlasboost's own.
    #[arg(long, value_name = "ADDR:PORT", value_parser = parse_metrics_address)]
    pub metrics: Option<std::net::SocketAddr>,

    /// Write the job's events to FILE, one JSON object per line as they happen (job start, table,
    /// attempts, worker starts and exits, hangs, summary; docs/events.md).
    #[arg(long, value_name = "FILE")]
    pub events: Option<PathBuf>,

    /// How the hosts' agents are started: over ssh, or by one srun step inside a Slurm
    /// allocation, on its nodes (or on those -H/--hostfile name).
    #[arg(long, value_enum, value_name = "ENGINE", default_value = "auto")]
    pub launcher: LauncherArg,

    /// Start the remote hosts' agents in a tree: the launcher, and each agent, opens at most K
    /// ssh sessions (K at least the number of hosts: every session from the launcher)
    /// [default: 32].
    #[arg(allow_negative_numbers = true, long, value_name = "K", value_parser = at_least_1)]
    pub fanout: Option<u32>,

    /// With --mpi: the address the ranks' relays reach the launcher at [default: this machine's
    /// address on the route to the first remote host].
    #[arg(long, value_name = "ADDR", requires = "mpi")]
    pub rendezvous_addr: Option<std::net::IpAddr>,

    /// The network interface of the hosts (a name, or an IPv4 network such as 10.0.0.0/24): this
    /// machine's server_id, MASTER_ADDR and --mpi's relays use it, and the workers get
    /// HCCL_IF_IP, HCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME for it [default: on each host, the
    /// interface of its server_id].
    #[arg(long, value_name = "NAME|CIDR", value_parser = parse_nic)]
    pub nic: Option<NicChoice>,

    /// Bind each worker to its NPU's CPUs (the driver's DCMI affinity; else an even split of the
    /// allowed CPUs); never two workers of a host on one CPU.
    #[arg(long)]
    pub bind_cores: bool,

    /// Start the workers with mpirun; their init() does the rendezvous over MPI.
    #[arg(long)]
    pub mpi: bool,

    /// The command each worker runs, and its arguments.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// `--launcher`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LauncherArg {
    /// slurm inside an allocation (SLURM_JOB_ID set) without -H/--hostfile, else ssh.
    Auto,
    /// ssh, in a tree (--fanout).
    Ssh,
    /// One srun step inside the Slurm allocation; its nodes are the hosts.
    Slurm,
}

/// `--rank-order`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RankOrderArg {
    /// Servers sorted by server id (what MindSpore and HCCL's legacy parser expect).
    ServerId,
    /// Servers in the order the hosts are listed.
    Hosts,
}

/// The mpirun/horovodrun spelling `-np N` (one dash, two letters) is not something clap parses:
/// turn it into `--np` before `--`, only for `run`.
pub fn normalize_args(args: Vec<OsString>) -> Vec<OsString> {
    let Some(run) = args.iter().position(|a| a == "run") else {
        return args;
    };
    let mut seen_dashes = false;
    args.into_iter()
        .enumerate()
        .map(|(i, a)| {
            if a == "--" {
                seen_dashes = true;
            }
            if i > run && !seen_dashes && a == "-np" {
                OsString::from("--np")
            } else {
                a
            }
        })
        .collect()
}

/// `parse` for a value that must be text: one that is not UTF-8 is named, with `why` (clap's
/// own error names neither the flag nor the value).
fn text_parser<T: Clone + Send + Sync + 'static>(
    parse: fn(&str) -> Result<T, String>,
    why: &'static str,
) -> impl TypedValueParser<Value = T> {
    clap::builder::OsStringValueParser::new().try_map(move |value| match value.to_str() {
        Some(text) => parse(text),
        None => Err(format!("{} is not UTF-8 ({why})", value.to_string_lossy())),
    })
}

/// A rank table's path: one HCCL loads (a name that ends in `.json`, see
/// [`atlasboost_core::ranktable::hccl_name_problem`]).
fn parse_table_path(s: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(s);
    match atlasboost_core::ranktable::hccl_name_problem(&path) {
        None => Ok(path),
        Some(why) => Err(why),
    }
}

/// `-o`: a rank table's path as [`parse_table_path`] takes it, or `-` for standard output.
fn parse_output_path(s: &str) -> Result<PathBuf, String> {
    match s {
        "-" => Ok(PathBuf::from(s)),
        _ => parse_table_path(s),
    }
}

fn parse_nic(s: &str) -> Result<NicChoice, String> {
    s.parse()
}

/// `--watch`: seconds, at least 0.1 (the driver is asked for every device at each sample).
fn parse_watch_interval(s: &str) -> Result<Duration, String> {
    at_least(s, Duration::from_millis(100))
}

/// `--sim-chip`: a name the driver could report for a chip atlasboost has rules for.
fn parse_sim_chip(s: &str) -> Result<String, String> {
    match Chip::from_driver_name(s) {
        Some(_) => Ok(s.to_string()),
        None => Err(format!(
            "atlasboost has no rules for chip {s:?}: a 910 (910, 910A, 910B, 910ProB, \
             910PremiumA), 910B (910B1-910B4) or 910_93 (910_9391, ...) name"
        )),
    }
}

/// `--hang-timeout`: seconds, at least 0.5 (progress is looked at every 0.25 s); `off` (zero,
/// which the settings read as no watchdog) for none, as the default.
fn parse_hang_timeout(s: &str) -> Result<Duration, String> {
    if s == "off" {
        return Ok(Duration::ZERO);
    }
    at_least(s, Duration::from_millis(500)).map_err(|e| format!("{e}, or off"))
}

/// `--host-timeout`: seconds, at least the default (4): it is there to be raised; below it, an
/// agent taking a stuck rank's stacks (`--hang-dump`, up to 3 s) would be taken for lost.
fn parse_host_timeout(s: &str) -> Result<Duration, String> {
    at_least(s, crate::launch::channel::LOST_AFTER)
}

/// Seconds, at least `min`.
fn at_least(s: &str, min: Duration) -> Result<Duration, String> {
    let below = || format!("{s}: at least {} s", min.as_secs_f64());
    match parse_seconds_or_zero(s) {
        Ok(d) if d < min => Err(below()),
        Ok(d) => Ok(d),
        // Below the least too: said so, not "less than 0".
        Err(_) if s.trim().parse::<f64>().is_ok_and(|v| v < 0.0) => Err(below()),
        Err(e) => Err(e),
    }
}

/// A count of 1 or more (`-n`, `--min-np`, `--fanout`).
fn at_least_1(s: &str) -> Result<u32, String> {
    count(s, 1)
}

/// A count of 0 or more (`--max-restarts`).
fn at_least_0(s: &str) -> Result<u32, String> {
    count(s, 0)
}

/// A whole number from `min` that fits 32 bits, with what is wrong said in words (Rust's
/// parser says "invalid digit found in string").
fn count(s: &str, min: u32) -> Result<u32, String> {
    use std::num::IntErrorKind;
    let digits = |d: &str| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit());
    let negative = s.strip_prefix('-').filter(|d| digits(d));
    // `-0` is 0, whatever Rust's parser says.
    if negative.is_some_and(|d| d.bytes().all(|b| b == b'0')) {
        return count("0", min);
    }
    match s.parse::<u32>() {
        Ok(n) if n >= min => Ok(n),
        Err(e) if *e.kind() == IntErrorKind::PosOverflow => {
            Err(format!("{s} is more than {}", u32::MAX))
        }
        Ok(_) => Err(format!("{s} is less than {min}")),
        Err(_) if negative.is_some() => Err(format!("{s} is less than {min}")),
        Err(_) => Err(format!("{s:?} is not a whole number")),
    }
}

/// `--monitor-interval`: seconds, at least 1; `off` (zero) for no sampling.
fn parse_monitor_interval(s: &str) -> Result<std::time::Duration, String> {
    if s == "off" {
        return Ok(std::time::Duration::ZERO);
    }
    at_least(s, crate::launch::monitor::MIN_INTERVAL).map_err(|e| format!("{e}, or off"))
}

/// `--metrics`: `ADDR:PORT` (`HOST:PORT`, resolved now: its first address), or a port alone (on
/// loopback: nothing is exposed unless asked).
fn parse_metrics_address(s: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(port) = s.parse::<u16>() {
        return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    }
    if let Ok(address) = s.parse() {
        return Ok(address);
    }
    let bad = |why: String| {
        format!(
            "{s:?} is not ADDR:PORT (e.g. 127.0.0.1:9400, [::1]:9400, localhost:9400) or a \
             port{why}"
        )
    };
    match s.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => s
            .to_socket_addrs()
            .map_err(|e| bad(format!(": {host} does not resolve ({e})")))?
            .next()
            .ok_or_else(|| bad(format!(": {host} has no address"))),
        _ => Err(bad(String::new())),
    }
}

fn parse_export(s: &str) -> Result<(String, Option<String>), String> {
    let (name, value) = match s.split_once('=') {
        Some((n, v)) => (n, Some(v.to_string())),
        None => (s, None),
    };
    let valid = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !valid {
        return Err(format!(
            "{name:?} is not a variable name (letters, digits and _, not starting with a digit)"
        ));
    }
    if value.as_deref().is_some_and(|v| v.contains('\0')) {
        return Err("a value cannot contain a NUL byte".into());
    }
    Ok((name.to_string(), value))
}

fn parse_rank_list(s: &str) -> Result<RankList, String> {
    Ok(RankList {
        ranks: atlasboost_core::parse_id_list(s, "rank", 1 << 20)?
            .into_iter()
            .collect(),
        text: s.to_string(),
    })
}

fn framework_parser() -> impl TypedValueParser<Value = Framework> {
    PossibleValuesParser::new(Framework::ALL.map(Framework::as_str))
        .try_map(|s| s.parse::<Framework>().map_err(|e| e.to_string()))
}

fn parse_device_list(s: &str) -> Result<DeviceList, String> {
    s.parse().map_err(|e: atlasboost_core::Error| e.to_string())
}

/// A server id ends up in file names and in every worker's table: no blanks, no control
/// characters, and the 64-byte limit HCCL applies.
fn parse_server_id(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    if let Some(c) = s.chars().find(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("must not contain {c:?}"));
    }
    if s.len() > atlasboost_core::ranktable::MAX_SERVER_ID_LEN {
        return Err(format!(
            "has {} bytes; HCCL accepts at most {}",
            s.len(),
            atlasboost_core::ranktable::MAX_SERVER_ID_LEN
        ));
    }
    Ok(s.to_string())
}

fn chip_parser() -> impl TypedValueParser<Value = Chip> {
    // `910B`, as Huawei writes it, is the 910b (clap's suggestion for it would be the 910).
    PossibleValuesParser::new(Chip::ALL.map(|c| match c {
        Chip::Ascend910B => clap::builder::PossibleValue::new(c.as_str()).alias("910B"),
        _ => clap::builder::PossibleValue::new(c.as_str()),
    }))
    .try_map(|s| s.parse::<Chip>().map_err(|e| e.to_string()))
}

fn format_parser() -> impl TypedValueParser<Value = Format> {
    PossibleValuesParser::new(Format::ALL.map(Format::as_str))
        .try_map(|s| s.parse::<Format>().map_err(|e| e.to_string()))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn chip_910b_is_also_spelled_as_huawei_writes_it() {
        for spelling in ["910b", "910B"] {
            let cli = Cli::try_parse_from(["atlasboost", "validate", "t.json", "--chip", spelling])
                .unwrap();
            let Command::Validate(args) = cli.command else {
                panic!("{spelling}: not validate")
            };
            assert_eq!(args.chip, Some(Chip::Ascend910B), "{spelling}");
        }
        assert!(
            Cli::try_parse_from(["atlasboost", "validate", "t.json", "--chip", "911"]).is_err()
        );
    }

    #[test]
    fn dash_np_is_the_np_option_before_the_command_only() {
        assert_eq!(
            normalize_args(os(&["atlasboost", "run", "-np", "4", "--", "x", "-np"])),
            os(&["atlasboost", "run", "--np", "4", "--", "x", "-np"])
        );
        assert_eq!(
            normalize_args(os(&["atlasboost", "validate", "-np"])),
            os(&["atlasboost", "validate", "-np"])
        );
    }

    #[test]
    fn a_metrics_address_is_an_address_a_host_name_or_a_port() {
        assert_eq!(
            parse_metrics_address("9400").unwrap(),
            "127.0.0.1:9400".parse().unwrap()
        );
        assert_eq!(
            parse_metrics_address("[::1]:9400").unwrap(),
            "[::1]:9400".parse().unwrap()
        );
        let by_name = parse_metrics_address("localhost:9400").unwrap();
        assert!(
            by_name.ip().is_loopback() && by_name.port() == 9400,
            "{by_name}"
        );
        for bad in [
            "localhost",
            "localhost:99999",
            ":9400",
            "no-such-host.invalid:9400",
        ] {
            let e = parse_metrics_address(bad).unwrap_err();
            assert!(e.starts_with(&format!("{bad:?} is not ADDR:PORT")), "{e}");
        }
        assert!(
            parse_metrics_address("no-such-host.invalid:9400")
                .unwrap_err()
                .contains("no-such-host.invalid does not resolve")
        );
    }

    #[test]
    fn rank_lists_and_seconds_parse_or_say_why() {
        let list = parse_rank_list("0-2,7").unwrap();
        assert_eq!(list.ranks.into_iter().collect::<Vec<_>>(), vec![0, 1, 2, 7]);
        assert!(parse_rank_list("3-1").unwrap_err().contains("backwards"));
        assert!(parse_rank_list("a").unwrap_err().contains("\"a\""));
        assert_eq!(parse_seconds_or_zero("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_seconds("0.5").unwrap(), Duration::from_millis(500));
        assert!(parse_seconds("0").is_err());
        assert!(parse_seconds_or_zero("-1").is_err());
        assert!(parse_seconds_or_zero("inf").is_err());
        assert_eq!(
            parse_watch_interval("1e-9").unwrap_err(),
            "1e-9: at least 0.1 s"
        );
        assert_eq!(
            parse_watch_interval("0.1").unwrap(),
            Duration::from_millis(100)
        );
        assert_eq!(
            parse_hang_timeout("0.1").unwrap_err(),
            "0.1: at least 0.5 s, or off"
        );
        assert_eq!(parse_hang_timeout("off").unwrap(), Duration::ZERO);
        assert_eq!(
            parse_monitor_interval("0").unwrap_err(),
            "0: at least 1 s, or off"
        );
        assert_eq!(
            parse_hang_timeout("0.5").unwrap(),
            Duration::from_millis(500)
        );
        // The default at least: an agent taking stacks is silent for up to 3 s.
        assert_eq!(parse_host_timeout("3.5").unwrap_err(), "3.5: at least 4 s");
        assert_eq!(parse_host_timeout("30").unwrap(), Duration::from_secs(30));
        // A negative number is below the least as well: the least is said, not 0.
        assert_eq!(
            parse_monitor_interval("-1").unwrap_err(),
            "-1: at least 1 s, or off"
        );
        assert_eq!(
            parse_hang_timeout("-1").unwrap_err(),
            "-1: at least 0.5 s, or off"
        );
    }

    #[test]
    fn exported_variables_are_checked() {
        assert_eq!(
            parse_export("A_1=x=y").unwrap(),
            ("A_1".into(), Some("x=y".into()))
        );
        assert_eq!(parse_export("HOME").unwrap(), ("HOME".into(), None));
        assert!(parse_export("1A=x").is_err());
        assert!(parse_export("=x").is_err());
        assert!(parse_export("A-B").is_err());
    }
}
