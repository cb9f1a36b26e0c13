//! The command's error type and how it maps to exit codes.

use std::io;

use atlasboost::host::{HostError, server_id_hint};
use atlasboost::probe::ProbeError;
use atlasboost::settings::Origin;
use atlasboost_core::exchange::error_chain;
use atlasboost_core::ranktable::TableLockError;

use crate::exit::ExitCodes;

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CliError {
    /// A failure of the core model (probe, table, file); exit 125.
    #[error(transparent)]
    Core(#[from] atlasboost_core::Error),
    /// Options that do not fit together; exit 2.
    #[error("{0}")]
    Usage(String),
    /// A host of `-H` or a hostfile line that cannot be used; exit 2.
    #[error("{origin}: {text:?} {why}")]
    BadHost {
        /// Where it was given: `-H "LIST"`, or `FILE:LINE`.
        origin: String,
        /// The entry as written.
        text: String,
        /// What is wrong with it.
        why: String,
    },
    /// Anything else atlasboost could not do; exit 125.
    #[error("{0}")]
    Failure(String),
    /// Something of the system's atlasboost needs cannot be had (a pipe, a thread, random
    /// bytes, the console, its signals); exit 125.
    #[error("cannot {action}")]
    System {
        /// What atlasboost tried, as in "cannot {action}".
        action: &'static str,
        /// The system's error.
        #[source]
        source: io::Error,
    },
    /// A file or directory cannot be made, opened or read; exit 125.
    #[error("cannot {action} {}", path.display())]
    File {
        /// What atlasboost tried, as in "cannot {action} PATH".
        action: &'static str,
        /// The file or directory.
        path: std::path::PathBuf,
        /// The system's error.
        #[source]
        source: io::Error,
    },
    /// JSON cannot be written (atlasboost's own reports) or read (a peer's message); exit 125.
    #[error("cannot {action}")]
    Json {
        /// What atlasboost tried, as in "cannot {action}".
        action: &'static str,
        /// serde's error.
        #[source]
        source: serde_json::Error,
    },
    /// A worker's command could not be started; exit 127 if it was not found, 126 if it cannot
    /// be executed.
    #[error("cannot start {} on host {host}: {}", program.to_string_lossy(), spawn_reason(reason))]
    Spawn {
        /// The command.
        program: std::ffi::OsString,
        /// The host.
        host: String,
        /// Why (not kept as a source: the message already says it).
        reason: io::Error,
    },
    /// A remote host's agent failed; its message names the host, and `code` is the exit code
    /// it calls for (126/127 for a command that cannot be started there).
    #[error("{message}")]
    Remote {
        /// What the agent said.
        message: String,
        /// The exit code.
        code: u8,
    },
    /// This host's lock of the rank table: another running job's table (its holder named), or a
    /// lock file that cannot be used; exit 125.
    #[error("{}{}", error_chain(.0), if matches!(.0, TableLockError::Held { .. }) {
        "; pass --rank-table PATH (or --wdir DIR) to give this job a table of its own"
    } else {
        ""
    })]
    TableLock(TableLockError),
    /// The device probe the settings ask for cannot be made or found nothing; exit 2 for
    /// settings that contradict each other, else 125.
    #[error(transparent)]
    Probe(#[from] ProbeError),
    /// This host has no address to be its `server_id`; exit 125.
    #[error("{error}{hint}", hint = server_id_hint(Origin::CommandLine))]
    Host {
        /// Why.
        error: HostError,
    },
    /// Standard output could not be written (a closed pipe is not reported).
    #[error("cannot write to standard output")]
    Stdout(#[source] io::Error),
}

impl CliError {
    /// [`CliError::System`]: "cannot {action}", caused by `source` (an `io::Error` or a
    /// `nix` errno).
    pub fn system(action: &'static str) -> impl FnOnce(io::Error) -> CliError {
        move |source| CliError::System { action, source }
    }

    /// [`CliError::File`]: "cannot {action} PATH", caused by `source`.
    pub fn file(
        action: &'static str,
        path: impl Into<std::path::PathBuf>,
    ) -> impl FnOnce(io::Error) -> CliError {
        let path = path.into();
        move |source| CliError::File {
            action,
            path,
            source,
        }
    }

    /// [`CliError::Json`]: "cannot {action}", caused by `source`.
    pub fn json(action: &'static str) -> impl FnOnce(serde_json::Error) -> CliError {
        move |source| CliError::Json { action, source }
    }

    /// The exit code for this error (SPEC §8).
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) | CliError::BadHost { .. } => ExitCodes::USAGE,
            CliError::Probe(e) if e.is_usage() => ExitCodes::USAGE,
            CliError::Remote { code, .. } => *code,
            CliError::Spawn { reason, .. } => match reason.kind() {
                io::ErrorKind::NotFound => ExitCodes::NOT_FOUND,
                io::ErrorKind::PermissionDenied | io::ErrorKind::IsADirectory => {
                    ExitCodes::CANNOT_EXECUTE
                }
                // ENOEXEC: not a binary and no #! line.
                _ if reason.raw_os_error() == Some(8) => ExitCodes::CANNOT_EXECUTE,
                // Out of descriptors or memory: atlasboost's failure, not the command's.
                _ => ExitCodes::FAILURE,
            },
            CliError::Core(_)
            | CliError::System { .. }
            | CliError::File { .. }
            | CliError::Json { .. }
            | CliError::Probe(_)
            | CliError::Host { .. }
            | CliError::Failure(_)
            | CliError::TableLock(_)
            | CliError::Stdout(_) => ExitCodes::FAILURE,
        }
    }

    /// True for a closed standard output (`atlasboost probe | head`), which is not an error.
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, CliError::Stdout(e) if e.kind() == io::ErrorKind::BrokenPipe)
    }
}

/// `command not found`, `permission denied`: what a shell would say.
fn spawn_reason(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::NotFound => "command not found".into(),
        io::ErrorKind::PermissionDenied => "permission denied (not executable)".into(),
        _ => e.to_string(),
    }
}
