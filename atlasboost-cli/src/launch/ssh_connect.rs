//! A faster ssh login: atlasboost opens ssh's TCP connection itself, with `TCP_NODELAY`.
//!
//! OpenSSH turns Nagle's algorithm off only for sessions with a terminal, and only once the
//! session is set up. During the key exchange and the authentication, a small packet that
//! ssh sends right after another waits until the server acknowledges the first, and the
//! server delays that acknowledgement by 40 ms. strace of one login on loopback showed
//! three such waits, 120 ms of a 212 ms login. The waits happen on a real network too,
//! on top of its round trips.
//!
//! So, for each host, the session's ssh is given `ProxyCommand=<atlasboost> ssh-connect %h
//! %p` with `ProxyUseFdpass=yes`. That command connects, sets `TCP_NODELAY`, hands the
//! connected socket back to ssh over its standard output, and exits. ssh then does
//! everything else as before: host keys, authentication, encryption, keep-alives.
//!
//! This is done only where it changes nothing else. [`plan`] asks `ssh -G` how ssh itself
//! resolves each host (the user's `~/.ssh/config`, `/etc/ssh/ssh_config`, their `Match`
//! and `Include` lines, `ATLASBOOST_SSH_OPTIONS`). A host with a `ProxyCommand` or
//! `ProxyJump` of its own, or a `BindAddress`/`BindInterface`, keeps ssh's own connection.
//! The connect honours ssh's `ConnectTimeout`, `ConnectionAttempts` and `AddressFamily`.
//! `ATLASBOOST_SSH_NODELAY=0` turns all this off.

use std::ffi::OsString;
use std::io::IoSlice;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};

use atlasboost_core::env_vars::EnvVars;

use crate::cli::{AddressFamilyArg, SshConnectArgs};
use crate::exit::ExitCodes;
use crate::process::output_within;

use super::channel::SshSpec as SshOptions;

/// The variable that turns the direct connection off (`0`).
const NODELAY_VAR: &str = EnvVars::ATLASBOOST_SSH_NODELAY;

/// How long `ssh -G` may take for all hosts of one batch: it reads files, and runs any
/// `Match exec` command of the user's configuration.
const RESOLVE_LIMIT: Duration = Duration::from_secs(5);

/// How ssh reaches one host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Connect {
    /// Through `atlasboost ssh-connect`: these options go on ssh's command line.
    Direct(Vec<OsString>),
    /// ssh's own connection, for this reason.
    Own(String),
}

impl Connect {
    /// The options to give ssh (none for its own connection).
    pub fn ssh_args(&self) -> &[OsString] {
        match self {
            Connect::Direct(args) => args,
            Connect::Own(_) => &[],
        }
    }

    /// What `-v` says about it.
    pub fn describe(&self, host: &str) -> String {
        match self {
            Connect::Direct(_) => format!(
                "atlasboost: ssh to {host}: atlasboost opens the connection, with TCP_NODELAY"
            ),
            Connect::Own(why) => format!("atlasboost: ssh to {host}: ssh's own connection ({why})"),
        }
    }
}

/// How ssh reaches each of `hosts` (names as given to ssh), in order. `ssh -G` runs for all
/// of them at once, bounded by 5 s in all.
pub fn plan(hosts: &[&str], ssh: &SshOptions) -> Vec<Connect> {
    let own = |why: &str| vec![Connect::Own(why.to_string()); hosts.len()];
    // (The launcher refused a malformed value before any host was planned.)
    if crate::settings::switch(NODELAY_VAR, "").ok().flatten() == Some(false) {
        return own(&format!("{NODELAY_VAR}=0"));
    }
    // The connect runs where this process runs, so it must be this very program; a launcher
    // embedded in another program (`main_with`) would start that program for each host.
    let exe = match crate::self_command() {
        Ok(command) if command.len() == 1 => std::path::PathBuf::from(&command[0]),
        _ => return own("atlasboost runs inside another program"),
    };
    let children: Vec<Result<Child, String>> = hosts
        .iter()
        .map(|host| {
            Command::new("ssh")
                .args(ssh_options(ssh))
                .args(["-G", "--", host])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| format!("ssh -G could not start: {e}"))
        })
        .collect();
    let since = Instant::now();
    children
        .into_iter()
        .map(|child| match child.and_then(|c| resolved(c, since)) {
            Ok(config) => decide(&config, &exe),
            Err(why) => Connect::Own(why),
        })
        .collect()
}

/// The options every ssh of a launch gets, before the host (`ssh -G` gets them too).
pub fn ssh_options(ssh: &SshOptions) -> Vec<OsString> {
    let mut args: Vec<OsString> = ["-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]
        .iter()
        .map(OsString::from)
        .collect();
    // ssh's own keep-alive: a silent network ends the session (the agent then stops its
    // workers), besides the launcher's heartbeats, and about as soon (`--host-timeout`).
    let alive = format!("ServerAliveInterval={}", ssh.server_alive_secs.max(1));
    for o in [alive.as_str(), "ServerAliveCountMax=2"] {
        args.extend([OsString::from("-o"), OsString::from(o)]);
    }
    if let Some(port) = ssh.port {
        args.extend([OsString::from("-p"), OsString::from(port.to_string())]);
    }
    if let Some(id) = &ssh.identity {
        args.extend([OsString::from("-i"), id.clone().into_os_string()]);
    }
    args.extend(ssh.extra.iter().map(OsString::from));
    args
}

/// The output of one `ssh -G` of a batch started at `since`.
fn resolved(child: Child, since: Instant) -> Result<String, String> {
    let out = output_within(
        child,
        since,
        RESOLVE_LIMIT,
        Duration::from_millis(1),
        "ssh -G",
    )?;
    if !out.status.success() {
        let said = out.stderr.lines().next().unwrap_or("").trim();
        return Err(format!("ssh -G failed ({}): {said}", out.status));
    }
    Ok(out.stdout)
}

/// How to reach a host whose configuration, as `ssh -G` prints it, is `config`, with
/// `exe` (this program) making the connection.
pub fn decide(config: &str, exe: &Path) -> Connect {
    let value = |key: &str| {
        config.lines().find_map(|line| {
            let (k, v) = line.split_once(' ')?;
            (k.eq_ignore_ascii_case(key) && !v.trim().eq_ignore_ascii_case("none"))
                .then(|| v.trim().to_string())
        })
    };
    for (key, name) in [
        ("proxycommand", "ProxyCommand"),
        ("proxyjump", "ProxyJump"),
        ("bindaddress", "BindAddress"),
        ("bindinterface", "BindInterface"),
    ] {
        if value(key).is_some() {
            return Connect::Own(format!("its ssh configuration sets {name}"));
        }
    }
    let timeout = value("connecttimeout")
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&t| t > 0)
        .unwrap_or(DEFAULT_TIMEOUT_SECS);
    let attempts = value("connectionattempts")
        .and_then(|v| v.parse::<u32>().ok())
        .filter(|&a| a > 0)
        .unwrap_or(1);
    let family = match value("addressfamily").as_deref() {
        Some("inet") => "inet",
        Some("inet6") => "inet6",
        _ => "any",
    };
    // ssh runs the command with `/bin/sh -c "exec ..."` after expanding its `%` tokens.
    let quoted = format!(
        "'{}'",
        exe.to_string_lossy()
            .replace('\'', r"'\''")
            .replace('%', "%%")
    );
    let command = format!(
        "ProxyCommand={quoted} ssh-connect --timeout {timeout} --attempts {attempts} \
         --family {family} %h %p"
    );
    Connect::Direct(vec![
        "-o".into(),
        command.into(),
        "-o".into(),
        "ProxyUseFdpass=yes".into(),
    ])
}

/// ssh's own bound when its configuration has none (atlasboost gives ssh 10 s).
const DEFAULT_TIMEOUT_SECS: u64 = 10;

/// `atlasboost ssh-connect`: connects to `host` `port`, sets `TCP_NODELAY`, and hands the
/// socket to ssh on standard output. Returns the exit code (255, like ssh, on failure).
pub fn connect_main(args: &SshConnectArgs) -> u8 {
    match connect(args) {
        Ok(()) => ExitCodes::SUCCESS,
        Err(message) => {
            eprintln!("atlasboost ssh-connect: {message}");
            255
        }
    }
}

fn connect(args: &SshConnectArgs) -> Result<(), String> {
    let target = format!("{} port {}", args.host, args.port);
    let addrs: Vec<SocketAddr> = (args.host.as_str(), args.port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {}: {e}", args.host))?
        .filter(|a| match args.family {
            AddressFamilyArg::Any => true,
            AddressFamilyArg::Inet => a.is_ipv4(),
            AddressFamilyArg::Inet6 => a.is_ipv6(),
        })
        .collect();
    if addrs.is_empty() {
        return Err(format!(
            "{} has no address of the family asked for ({:?})",
            args.host, args.family
        ));
    }
    let timeout = Duration::from_secs(args.timeout.max(1));
    let mut last = None;
    for attempt in 0..args.attempts.max(1) {
        if attempt > 0 {
            // ssh waits a second between its attempts too.
            std::thread::sleep(Duration::from_secs(1));
        }
        for addr in &addrs {
            match TcpStream::connect_timeout(addr, timeout) {
                Ok(stream) => return hand_over(&stream, &target),
                Err(e) => last = Some(format!("cannot connect to {target} ({addr}): {e}")),
            }
        }
    }
    Err(last.unwrap_or_else(|| format!("cannot connect to {target}")))
}

/// Sets `TCP_NODELAY` on `stream` and sends it to ssh over standard output.
fn hand_over(stream: &TcpStream, target: &str) -> Result<(), String> {
    stream
        .set_nodelay(true)
        .map_err(|e| format!("cannot set TCP_NODELAY on the connection to {target}: {e}"))?;
    let fds = [stream.as_raw_fd()];
    let message = [ControlMessage::ScmRights(&fds)];
    sendmsg::<()>(
        std::io::stdout().as_raw_fd(),
        &[IoSlice::new(&[0])],
        &message,
        MsgFlags::empty(),
        None,
    )
    .map_err(|e| {
        format!(
            "cannot hand the connection to {target} to ssh on standard output ({e}); this \
             command is started by ssh, with ProxyUseFdpass=yes"
        )
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXE: &str = "/opt/atlas boost/bin/atlasboost";

    fn direct(config: &str) -> String {
        match decide(config, Path::new(EXE)) {
            Connect::Direct(args) => args
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(" | "),
            Connect::Own(why) => panic!("expected a direct connection, got ssh's own: {why}"),
        }
    }

    #[test]
    fn a_plain_configuration_gets_the_direct_connection_with_ssh_own_bounds() {
        let config = "hostname 10.0.0.5\nport 22\nconnecttimeout 10\nconnectionattempts 3\n\
                      addressfamily inet\nproxyusefdpass no\n";
        assert_eq!(
            direct(config),
            "-o | ProxyCommand='/opt/atlas boost/bin/atlasboost' ssh-connect --timeout 10 \
             --attempts 3 --family inet %h %p | -o | ProxyUseFdpass=yes"
        );
    }

    #[test]
    fn missing_or_none_values_take_ssh_defaults() {
        let got = direct("hostname h\nconnecttimeout none\naddressfamily any\nproxycommand none\n");
        assert!(
            got.contains("--timeout 10 --attempts 1 --family any %h %p"),
            "{got}"
        );
    }

    #[test]
    fn a_proxy_or_a_bind_address_of_the_user_keeps_ssh_own_connection() {
        for (line, name) in [
            ("proxycommand nc -X 5 -x socks:1080 %h %p", "ProxyCommand"),
            ("proxyjump bastion.example.org", "ProxyJump"),
            ("bindaddress 10.1.1.1", "BindAddress"),
            ("bindinterface eth1", "BindInterface"),
        ] {
            let config = format!("hostname h\nport 22\n{line}\nconnecttimeout 10\n");
            assert_eq!(
                decide(&config, Path::new(EXE)),
                Connect::Own(format!("its ssh configuration sets {name}")),
                "{line}"
            );
        }
    }

    #[test]
    fn quotes_and_percent_signs_in_the_path_survive_the_shell_and_ssh_tokens() {
        let got = match decide("hostname h\n", Path::new("/x/it's 100%/atlasboost")) {
            Connect::Direct(args) => args[1].to_string_lossy().into_owned(),
            Connect::Own(why) => panic!("{why}"),
        };
        assert!(
            got.starts_with(r"ProxyCommand='/x/it'\''s 100%%/atlasboost' ssh-connect"),
            "{got}"
        );
    }
}
