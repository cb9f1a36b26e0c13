//! The `atlasboost` command, as a library so tests can drive its parts.
//!
//! - [`cli`]: the command line (clap), and [`settings`]: what it resolves into, once, before
//!   any command runs;
//! - [`commands`]: `ranktable`, `merge`, `validate` and `probe`, the commands that need no
//!   launch;
//! - [`launch`]: `atlasboost run` (plan, rendezvous, workers, output, signals), on this
//!   machine's hosts and, over ssh, on others (`atlasboost agent`).
//!
//! Library mode (`init()` inside a worker) is the `atlasboost` library crate's, which this one
//! builds on; `ARCHITECTURE.md` maps the launcher's modules.
#![deny(missing_docs)]

pub mod cli;
pub mod commands;
pub mod error;
pub mod exit;
pub mod launch;
pub mod printer;
pub mod process;
pub mod rank_list;
pub mod settings;
pub mod writing;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};
use crate::error::CliError;
use crate::exit::ExitCodes;
use crate::printer::{Printer, to_stderr};

/// How atlasboost starts itself again (remote hosts' `agent`, the ranks' `relay`): set
/// once by [`main_with`]; by default this executable.
static SELF_COMMAND: std::sync::OnceLock<Vec<OsString>> = std::sync::OnceLock::new();

/// The command that runs atlasboost again: this executable, or what [`main_with`] was given.
///
/// # Errors
///
/// [`CliError::Failure`] when this executable's path cannot be read.
pub fn self_command() -> Result<Vec<OsString>, CliError> {
    if let Some(c) = SELF_COMMAND.get() {
        return Ok(c.clone());
    }
    std::env::current_exe()
        .map(|p| vec![p.into_os_string()])
        .map_err(CliError::system("find the atlasboost executable"))
}

/// The relay program beside this executable ([`launch::mpi::relay_beside`]), unless
/// [`main_with`] was given another command that starts atlasboost (the embedding program's
/// directory is not atlasboost's).
#[must_use]
pub fn relay_program() -> Option<std::path::PathBuf> {
    if SELF_COMMAND.get().is_some() {
        return None;
    }
    launch::mpi::relay_beside(std::env::current_exe().ok()?.parent()?)
}

/// The `atlasboost-relay` program's `main`, which Rust's runtime does not start (see
/// `relay_main.rs`): does what of that runtime's set-up the relay needs (standard descriptors
/// that are closed opened on `/dev/null`, so that no socket takes their place; SIGPIPE
/// ignored, so that writing to a closed connection is an error, not death; a panic is exit
/// code 101), then [`relay_entry`]. Returns the exit code.
pub fn relay_process_main() -> i32 {
    use nix::libc;
    for fd in 0..=2 {
        // SAFETY: F_GETFD only reads the descriptor's flags; open(2) of a constant path.
        unsafe {
            if libc::fcntl(fd, libc::F_GETFD) == -1
                && nix::errno::Errno::last() == nix::errno::Errno::EBADF
            {
                // The lowest free descriptor: this one.
                libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
            }
        }
    }
    // SAFETY: ignoring a signal installs no handler code.
    let _ = unsafe {
        nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGPIPE,
            nix::sys::signal::SigHandler::SigIgn,
        )
    };
    std::panic::catch_unwind(relay_entry).map_or(101, i32::from)
}

/// `atlasboost-relay -- COMMAND...`: what `atlasboost relay -- COMMAND...` does, in a program of
/// its own, which statically linked starts faster (a relay is on every rank's path:
/// docs/PERFORMANCE.md). Returns the exit code.
pub fn relay_entry() -> u8 {
    let args: Vec<OsString> = std::env::args_os().collect();
    match args.get(1..).and_then(relay_command) {
        Some(command) => launch::mpi::relay_program_main(command),
        None => {
            let name = launch::mpi::RELAY_PROGRAM;
            to_stderr(&format!(
                "{name}: error: usage: {name} -- COMMAND [ARGS]... (mpirun starts it for \
                 `atlasboost run --mpi`, not by hand)\n"
            ));
            ExitCodes::USAGE
        }
    }
}

/// A relay's worker command: what follows its `--`, when something does.
fn relay_command(args: &[OsString]) -> Option<&[OsString]> {
    match args {
        [dashes, command @ ..] if dashes == "--" && !command.is_empty() => Some(command),
        _ => None,
    }
}

/// Parses the command line, runs the command, prints any error, and returns the exit code.
pub fn main_entry() -> ExitCode {
    ExitCode::from(run_command_line(std::env::args_os().collect()))
}

/// [`main_entry`] for an embedding program (the Python package's `atlasboost` script):
/// `args` is the whole command line, `self_command` how to start atlasboost again (e.g.
/// `python3 -m atlasboost`). Returns the exit code. A usage error or `--help` prints and
/// returns too, rather than exiting the embedding process.
pub fn main_with(args: Vec<OsString>, self_command: Vec<OsString>) -> u8 {
    if !self_command.is_empty() {
        // A second call keeps the first command: both come from the same program.
        let _ = SELF_COMMAND.set(self_command);
    }
    // `run` blocks the signals it handles (it reads them from a signalfd); the embedding
    // program gets its own mask back.
    let mask = nix::sys::signal::SigSet::thread_get_mask().ok();
    let code = run_command_line(args);
    if let Some(mask) = mask {
        let _ = mask.thread_set_mask();
    }
    code
}

fn run_command_line(args: Vec<OsString>) -> u8 {
    // mpirun starts `atlasboost relay -- COMMAND...` once per rank of `run --mpi`, and a
    // launch waits for the last of them: building clap's whole command tree first cost each
    // relay about a third of its start (docs/PERFORMANCE.md). Any other form goes to clap.
    if let [_, relay, rest @ ..] = args.as_slice()
        && relay == "relay"
        && let Some(command) = relay_command(rest)
    {
        return launch::mpi::relay_main(command);
    }
    let cli = match Cli::try_parse_from(cli::normalize_args(args)) {
        Ok(cli) => cli,
        Err(e) => {
            // clap prints help, versions and usage errors itself, with its own exit codes.
            let _ = e.print();
            return if e.use_stderr() {
                ExitCodes::USAGE
            } else {
                ExitCodes::SUCCESS
            };
        }
    };
    let printer = Printer::new(cli.quiet, cli.verbose);
    let result = match &cli.command {
        // Each command's arguments are resolved into its settings here, once.
        Command::Ranktable(args) => {
            commands::ranktable::run(&args.into(), &printer).map(|()| ExitCodes::SUCCESS)
        }
        Command::Merge(args) => {
            commands::merge::run(&args.into(), &printer).map(|()| ExitCodes::SUCCESS)
        }
        Command::Validate(args) => commands::validate::run(&args.into(), &printer),
        Command::Probe(args) => {
            commands::probe::run(&args.into(), &printer).map(|()| ExitCodes::SUCCESS)
        }
        Command::Run(args) => launch::run(&args.as_ref().into(), &printer),
        Command::Agent(args) => Ok(launch::agent::agent_main(args.slurm)),
        Command::Relay(args) => Ok(launch::mpi::relay_main(&args.command)),
        Command::SshConnect(args) => Ok(launch::ssh_connect::connect_main(args)),
    };
    match result {
        Ok(code) => code,
        Err(e) if e.is_broken_pipe() => ExitCodes::SUCCESS,
        Err(e) => {
            report(&e);
            e.exit_code()
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
