//! The `atlasboost` command, as a library so tests can drive its parts.
//!
//! - [`commands`]: `ranktable`, `merge`, `validate` and `probe`, the commands that need no
//!   launch;
//! - [`launch`]: `atlasboost run` (plan, rendezvous, workers, output, signals), on this
//!   machine's hosts and, over ssh, on others (`atlasboost agent`).
#![deny(missing_docs)]

pub mod cli;
pub mod commands;
pub mod error;
pub mod exit;
pub mod host;
pub mod launch;
pub mod printer;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};
use crate::error::CliError;
use crate::exit::ExitCodes;
use crate::printer::Printer;

/// Parses the command line, runs the command, prints any error, and returns the exit code.
pub fn main_entry() -> ExitCode {
    let cli = Cli::parse_from(cli::normalize_args(std::env::args_os().collect()));
    let printer = Printer::new(cli.quiet, cli.verbose);
    let result = match &cli.command {
        Command::Ranktable(args) => {
            commands::ranktable::run(args, &printer).map(|()| ExitCodes::SUCCESS)
        }
        Command::Merge(args) => commands::merge::run(args, &printer).map(|()| ExitCodes::SUCCESS),
        Command::Validate(args) => commands::validate::run(args, &printer),
        Command::Probe(args) => commands::probe::run(args, &printer).map(|()| ExitCodes::SUCCESS),
        Command::Run(args) => launch::run(args, &printer),
        Command::Agent => Ok(launch::agent::agent_main()),
        Command::Guard => Ok(launch::lifeline::guard_main()),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) if e.is_broken_pipe() => ExitCode::from(ExitCodes::SUCCESS),
        Err(e) => {
            report(&e);
            ExitCode::from(e.exit_code())
        }
    }
}

/// Prints `error: ...` and one `caused by:` line per source (on a closed stderr: nothing, and
/// no panic; the exit code still tells).
fn report(e: &CliError) {
    let mut text = format!("error: {e}\n");
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(&format!("  caused by: {s}\n"));
        source = s.source();
    }
    printer::to_stderr(&text);
}
