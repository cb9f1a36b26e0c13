//! The command line (SPEC §5), as clap types.

use std::path::PathBuf;

use atlasboost_core::ranktable::Format;
use atlasboost_core::{Chip, DeviceList};
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand, ValueEnum};

/// Launch distributed training on Huawei Ascend NPU servers, and make the HCCL rank tables it needs.
#[derive(Debug, Parser)]
#[command(name = "atlasboost", version, propagate_version = true)]
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
}

/// Where devices come from (`--probe`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProbeKind {
    /// The driver if it loads, else /etc/hccn.conf; never simulated devices.
    Auto,
    /// The driver's DSMI library.
    Dsmi,
    /// /etc/hccn.conf.
    Hccn,
    /// Simulated devices (needs --sim N).
    Sim,
}

/// Device discovery options shared by `ranktable` and `probe` (SPEC §3).
#[derive(Debug, Args)]
pub struct DeviceArgs {
    /// Where to find devices.
    #[arg(long, value_enum, default_value_t = ProbeKind::Auto)]
    pub probe: ProbeKind,

    /// Use N simulated devices (implies --probe sim).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=255))]
    pub sim: Option<u32>,

    /// Chip name the simulated devices report (910, 910B3, 910_9391).
    #[arg(long, value_name = "NAME", default_value = "910", requires = "sim")]
    pub sim_chip: String,

    /// Give simulated devices IPv6 addresses.
    #[arg(long, requires = "sim")]
    pub sim_ipv6: bool,

    /// Only these physical devices, e.g. 0-3 or 0,1,4.
    #[arg(long, value_name = "LIST", value_parser = parse_device_list)]
    pub devices: Option<DeviceList>,

    /// This server's id in the table [default: this host's primary IPv4 address].
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
        help = "Output file; `-` for standard output [default: hccl_<n>p_<ids>_<server_id>.json]"
    )]
    pub output: Option<PathBuf>,
}

/// `atlasboost merge`.
#[derive(Debug, Args)]
pub struct MergeArgs {
    /// The tables to merge, in server order.
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
        help = "Output file; `-` for standard output [default: hccl_<S>s_<N>p.json]"
    )]
    pub output: Option<PathBuf>,
}

/// `atlasboost validate`.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// The rank table to check.
    #[arg(value_name = "FILE.json")]
    pub file: PathBuf,

    /// Which chip's rules to apply [default: 910_93 for version 1.2, else 910].
    #[arg(long, value_name = "CHIP", value_parser = chip_parser())]
    pub chip: Option<Chip>,

    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
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
    PossibleValuesParser::new(Chip::ALL.map(Chip::as_str))
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
}
