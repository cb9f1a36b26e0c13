//! The command's error type and how it maps to exit codes.

use std::io;

use nix::errno::Errno;

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
    #[error("{origin}: {} {why}", brief(text))]
    BadHost {
        /// Where it was given: `-H "LIST"`, or `FILE:LINE`.
        origin: String,
        /// The entry as written.
        text: String,
        /// What is wrong with it.
        why: String,
    },
    /// What the coordinator or an agent said in words (a refusal of the hosts' reports,
    /// which crosses the wire as text); exit 125.
    #[error("{0}")]
    Failure(String),
    /// The launcher is not the only thread of its process; exit 125.
    #[error(
        "the launcher must be the only thread of its process, which has {threads}: signals \
         meant for it would reach the others; run the atlasboost command as a process of its own"
    )]
    NotAlone {
        /// How many threads the process has.
        threads: usize,
    },
    /// The lifeline process cannot be started; exit 125.
    #[error("cannot start the lifeline process: {step}")]
    Lifeline {
        /// The step that failed.
        step: &'static str,
        /// The system's error.
        #[source]
        source: io::Error,
    },
    /// This machine has no IPv4 address to name it by; exit 125.
    #[error("{error}; pass -H with this host's address (or -H 127.0.0.1)")]
    ThisMachine {
        /// Why.
        error: HostError,
    },
    /// `run --mpi` found no device on this machine; exit 125.
    #[error("this machine has no device to start a worker on")]
    NoLocalDevices,
    /// A host is not an IP address (the route to it cannot be found); exit 125.
    #[error("host {host} has no IP address")]
    NoHostAddress {
        /// The host.
        host: String,
    },
    /// No route leads to a host; exit 125.
    #[error("no route to host {host}; pass --rendezvous-addr")]
    NoRoute {
        /// The host.
        host: String,
        /// The system's error.
        #[source]
        source: io::Error,
    },
    /// The route to a host leaves from loopback; exit 125.
    #[error(
        "the route to host {host} leaves from loopback address {from}, which that host cannot \
         reach; pass --rendezvous-addr"
    )]
    LoopbackRoute {
        /// The host.
        host: String,
        /// The loopback address.
        from: std::net::IpAddr,
    },
    /// The relays of `run --mpi` have nowhere to connect; exit 125.
    #[error(
        "cannot listen for the relays on {addr} (--rendezvous-addr chooses another: an address of \
         this machine that the ranks' hosts reach)"
    )]
    RelayDoor {
        /// The address.
        addr: std::net::IpAddr,
        /// The system's error.
        #[source]
        source: io::Error,
    },
    /// A relay could not introduce itself to the launcher; exit 125.
    #[error("rank {rank}: {why}")]
    Introduction {
        /// The relay's rank.
        rank: u32,
        /// Why (the handshake's words).
        why: String,
    },
    /// ssh cannot be started for a host; exit 125.
    #[error("cannot start ssh for host {host}")]
    Ssh {
        /// The host.
        host: String,
        /// The system's error.
        #[source]
        source: io::Error,
    },
    /// A remote host's session ended before its agent was ready; exit 125.
    #[error("host {host}: {what}; ssh said: {said}")]
    HostLost {
        /// The host.
        host: String,
        /// What ended (`ssh could not start atlasboost agent there`, ...).
        what: &'static str,
        /// ssh's (or the agent's) last lines.
        said: String,
    },
    /// No table could be decided (a restart's world is too small, say); exit 125. Carries
    /// the hosts whose probe failed, for the restart's events.
    #[error("{message}")]
    Undecided {
        /// Why, naming what is missing.
        message: String,
        /// Each host whose probe failed, and why.
        unprobed: Vec<(String, String)>,
    },
    /// Hosts lost while the hosts were joining: one whose session ended, or those that did not
    /// join in time; exit 125. A restart goes on without them.
    #[error("{message}")]
    HostsLost {
        /// The hosts, as `HostPlan::describe` names them: not those below them in the launch
        /// tree, reached through them, whom the message names too.
        hosts: Vec<String>,
        /// What happened, naming them.
        message: String,
    },
    /// A remote host's agent does not speak the protocol; exit 125.
    #[error("host {host}: its agent sent something that is not the protocol: {why}")]
    Protocol {
        /// The host.
        host: String,
        /// What was wrong.
        why: String,
    },
    /// Hosts that never said they wrote the table; exit 125.
    #[error("host{} {} did not report the table written within {limit:.0?}", if hosts.len() == 1 { "" } else { "s" }, hosts.join(", "))]
    TableNotReported {
        /// The hosts.
        hosts: Vec<String>,
        /// How long they had.
        limit: std::time::Duration,
    },
    /// The worker directory does not exist on a remote host; exit 125.
    #[error(
        "the worker directory {} does not exist here (--wdir, or the launcher's current \
         directory)", path.display()
    )]
    NoWorkerDir {
        /// The directory.
        path: std::path::PathBuf,
    },
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
    /// atlasboost's own tool (`run --mpi`'s mpirun) could not be started: exit 125, as for
    /// ssh; 126 and 127 are the worker's command's (SPEC §8).
    #[error("cannot start {} on host {host}: {}", program.to_string_lossy(), spawn_reason(program, reason))]
    ToolSpawn {
        /// The tool.
        program: std::ffi::OsString,
        /// The host, and what the tool is for.
        host: String,
        /// Why (not kept as a source: the message already says it).
        reason: io::Error,
    },
    /// A worker's command could not be started; exit 127 if it was not found, 126 if it cannot
    /// be executed.
    #[error("cannot start {} on host {host}: {}", program.to_string_lossy(), spawn_reason(program, reason))]
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
            CliError::Spawn {
                program, reason, ..
            } => match reason.kind() {
                io::ErrorKind::NotFound => ExitCodes::NOT_FOUND,
                _ if missed_on_path(program, reason) => ExitCodes::NOT_FOUND,
                io::ErrorKind::PermissionDenied | io::ErrorKind::IsADirectory => {
                    ExitCodes::CANNOT_EXECUTE
                }
                // The command cannot be run as given, as a shell says with 126: its path
                // cannot be looked up (a name with a `/`; a bare one is not found, above), or
                // exec refuses the file.
                _ if errno_in(reason, &[PATH_LOOKUP_ERRORS, EXEC_ERRORS].concat()) => {
                    ExitCodes::CANNOT_EXECUTE
                }
                // Out of descriptors or memory: atlasboost's failure, not the command's.
                _ => ExitCodes::FAILURE,
            },
            CliError::Core(_)
            | CliError::ToolSpawn { .. }
            | CliError::NotAlone { .. }
            | CliError::Lifeline { .. }
            | CliError::ThisMachine { .. }
            | CliError::NoLocalDevices
            | CliError::NoHostAddress { .. }
            | CliError::NoRoute { .. }
            | CliError::LoopbackRoute { .. }
            | CliError::RelayDoor { .. }
            | CliError::Introduction { .. }
            | CliError::Ssh { .. }
            | CliError::HostLost { .. }
            | CliError::HostsLost { .. }
            | CliError::Protocol { .. }
            | CliError::TableNotReported { .. }
            | CliError::NoWorkerDir { .. }
            | CliError::System { .. }
            | CliError::File { .. }
            | CliError::Json { .. }
            | CliError::Probe(_)
            | CliError::Host { .. }
            | CliError::Failure(_)
            | CliError::Undecided { .. }
            | CliError::TableLock(_)
            | CliError::Stdout(_) => ExitCodes::FAILURE,
        }
    }

    /// True for a closed standard output (`atlasboost probe | head`), which is not an error.
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, CliError::Stdout(e) if e.kind() == io::ErrorKind::BrokenPipe)
    }
}

/// `text` quoted, cut to its first 200 characters (a hostfile "line" may be megabytes).
pub(crate) fn brief(text: &str) -> String {
    const SHOWN: usize = 200;
    match text.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{:?}... ({} bytes in all)", &text[..cut], text.len()),
        None => format!("{text:?}"),
    }
}

/// Whether `program`, a bare name (no `/`), was not found on `PATH`: the search goes on past
/// an entry that is a file, a loop of links or a name too long (ENOTDIR, ELOOP, ENAMETOOLONG)
/// and, finding nothing, reports the last of them; a shell says "command not found" (127).
fn missed_on_path(program: &std::ffi::OsStr, e: &io::Error) -> bool {
    use std::os::unix::ffi::OsStrExt;
    !program.as_bytes().contains(&b'/') && errno_in(e, &PATH_LOOKUP_ERRORS)
}

/// How looking up a command's path fails short of ENOENT: a component that is a file, a loop
/// of links, a name too long.
const PATH_LOOKUP_ERRORS: [Errno; 3] = [Errno::ENOTDIR, Errno::ELOOP, Errno::ENAMETOOLONG];

/// How exec fails for a file that is there: not a binary and no #! line, arguments and
/// environment too large, a binary being written.
const EXEC_ERRORS: [Errno; 3] = [Errno::ENOEXEC, Errno::E2BIG, Errno::ETXTBSY];

/// Whether `e` is one of `errors`.
fn errno_in(e: &io::Error, errors: &[Errno]) -> bool {
    errors.iter().any(|&x| e.raw_os_error() == Some(x as i32))
}

/// `command not found`, `permission denied`: what a shell would say. A script whose `#!`
/// interpreter is missing fails with the same ENOENT as a missing command: it is told apart.
fn spawn_reason(program: &std::ffi::OsStr, e: &io::Error) -> String {
    if missed_on_path(program, e) {
        return "command not found".into();
    }
    match e.kind() {
        io::ErrorKind::NotFound => match missing_interpreter(program) {
            Some(interpreter) => {
                format!("its interpreter {interpreter} (its #! line) is not found")
            }
            None => "command not found".into(),
        },
        io::ErrorKind::PermissionDenied => "permission denied (not executable)".into(),
        io::ErrorKind::IsADirectory => "it is a directory".into(),
        // EMFILE: the launcher's own limit, which it raised as far as it may.
        _ if e.raw_os_error() == Some(24) => {
            let limit = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
                .map_or_else(|_| "?".to_string(), |(soft, _)| soft.to_string());
            format!(
                "{e}: the launcher may open {limit} files (`ulimit -n`), and each local worker \
                 takes two pipes (four with --log-dir)"
            )
        }
        _ => e.to_string(),
    }
}

/// The interpreter named by the `#!` line of `program` (a path, or found on `PATH`) when that
/// interpreter does not exist.
fn missing_interpreter(program: &std::ffi::OsStr) -> Option<String> {
    use std::io::Read;
    let path = std::path::Path::new(program);
    let found = if program.as_encoded_bytes().contains(&b'/') {
        Some(path.to_path_buf())
    } else {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(program))
                .find(|p| p.is_file())
        })
    }?;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(found).ok()?.read(&mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = line.split(|b| *b == b'\n').next()?;
    // As the kernel reads it: up to a space or tab, so a CRLF script's is "/bin/sh\r".
    let interpreter = String::from_utf8_lossy(line)
        .trim_start_matches([' ', '\t'])
        .split([' ', '\t'])
        .next()?
        .to_string();
    (!interpreter.is_empty() && !std::path::Path::new(&interpreter).exists())
        .then(|| format!("{interpreter:?}"))
}
