//! A real sshd on loopback for the ssh tests, and free ports.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::procs::{ProcStat, cmdline, descendants};
use crate::run::shown;
use crate::wait_until;

/// The OpenSSH server that [`Sshd::start`] runs.
pub const SSHD: &str = "/usr/sbin/sshd";

/// Set to `1`, a missing OpenSSH (see [`Sshd::start`]) fails the ssh tests instead of skipping
/// them: for CI, which installs `openssh-server` and must not silently test less.
pub const REQUIRE_SSHD: &str = "ATLASBOOST_E2E_REQUIRE_SSHD";

/// The addresses the test sshd listens on: "hosts" that are all this machine.
pub const SSHD_ADDRESSES: [&str; 4] = ["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"];

/// A real OpenSSH server for one test, so that `atlasboost run` reaches "remote" hosts
/// (127.0.0.2, 127.0.0.3, ... all this machine) with the system `ssh`, as it reaches real ones.
///
/// [`Sshd::start`] makes a temporary directory with a host key, a client key (the only entry
/// of `authorized_keys`), an `sshd_config` and an `ssh_config` for clients, and runs
/// `/usr/sbin/sshd -D` on a free port of 127.0.0.1-4, as the user the tests run as (root
/// logs in with its key: `PermitRootLogin prohibit-password`). Each test has its own server:
/// starting one takes a few milliseconds, its log is the test's alone, and everything below it
/// ([`Sshd::sessions`]: sessions, agents, workers) belongs to that test.
///
/// Clients use [`Sshd::ssh_config`] with `ssh -F` (ssh reads `~/.ssh/config` from the passwd
/// entry's home, not `$HOME`, so the tests cannot use that). Dropping it kills the server
/// (it also dies with the thread that started it, `PR_SET_PDEATHSIG`, should the test process
/// be killed) and removes the directory.
#[derive(Debug)]
pub struct Sshd {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Sshd {
    /// Starts a server; `None` when OpenSSH (`/usr/sbin/sshd`, `ssh`, `ssh-keygen`) is not
    /// installed, after saying so on the real stderr (not the test harness's captured one),
    /// naming the test: the caller returns, and the test passes having tested nothing. With
    /// [`REQUIRE_SSHD`]`=1` it panics instead.
    ///
    /// # Panics
    ///
    /// When OpenSSH is installed but the server does not start (with its log), or when it is
    /// missing and [`REQUIRE_SSHD`] is `1`.
    pub fn start() -> Option<Sshd> {
        if let Some(why) = Sshd::missing() {
            crate::skip_unless_required(
                REQUIRE_SSHD,
                &format!(
                    "{why}; it tests nothing here (install OpenSSH, or set {REQUIRE_SSHD}=1 \
                     to make this a failure)"
                ),
            );
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("atlasboost-e2e-sshd-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot make a temporary directory: {e}"));
        for key in ["host_key", "client_key"] {
            keygen(&dir.path().join(key));
        }
        let d = dir.path();
        std::fs::copy(d.join("client_key.pub"), d.join("authorized_keys"))
            .unwrap_or_else(|e| panic!("cannot write authorized_keys: {e}"));
        // sshd's privilege separation directory (as root it refuses to start without it).
        let _ = std::fs::create_dir_all("/run/sshd");
        // The port is free when picked, not necessarily when sshd binds it: try again then.
        let mut attempts = Vec::new();
        for _ in 0..5 {
            let port = free_port();
            match Sshd::spawn(d, port) {
                Ok(child) => {
                    let sshd = Sshd { child, port, dir };
                    sshd.write_client_config("ssh_config", Some(&sshd.client_key()), true);
                    return Some(sshd);
                }
                Err(why) => attempts.push(format!("port {port}: {why}")),
            }
        }
        panic!(
            "{SSHD} did not start in 5 attempts:\n{}",
            attempts.join("\n")
        );
    }

    /// Why the ssh tests cannot run here, if they cannot.
    fn missing() -> Option<String> {
        if !Path::new(SSHD).is_file() {
            return Some(format!("{SSHD} is not installed (Debian: openssh-server)"));
        }
        for (tool, arg) in [("ssh", "-V"), ("ssh-keygen", "-?")] {
            let found = Command::new(tool)
                .arg(arg)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok();
            if !found {
                return Some(format!("`{tool}` is not on PATH (Debian: openssh-client)"));
            }
        }
        None
    }

    /// Writes the configuration for `port`, starts `sshd -D` and waits (at most 10 s) until
    /// it answers on every address. On failure the server is killed and its log returned.
    fn spawn(dir: &Path, port: u16) -> Result<Child, String> {
        use std::os::unix::process::CommandExt;
        let d = dir.display();
        let listen: String = SSHD_ADDRESSES
            .iter()
            .map(|a| format!("ListenAddress {a}\n"))
            .collect();
        // MaxStartups: tests run in parallel and each opens a session per host at once; the
        // default (10:30:100) would drop some connections at random.
        let config = format!(
            "Port {port}\n{listen}HostKey {d}/host_key\nAuthorizedKeysFile {d}/authorized_keys\n\
             PermitRootLogin prohibit-password\nPasswordAuthentication no\n\
             KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n\
             PidFile {d}/sshd.pid\nMaxStartups 100\nPrintMotd no\n"
        );
        let config_path = dir.join("sshd_config");
        std::fs::write(&config_path, config)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", config_path.display()));
        let log = dir.join("sshd.log");
        let _ = std::fs::remove_file(&log);
        let mut cmd = Command::new(SSHD);
        cmd.arg("-D")
            .arg("-f")
            .arg(&config_path)
            .arg("-E")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: only prctl between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {SSHD}: {e}"));
        let mut exited = None;
        let up = wait_until(Duration::from_secs(10), || {
            exited = child.try_wait().ok().flatten();
            exited.is_none() && SSHD_ADDRESSES.iter().all(|a| answers_ssh(a, port))
        });
        if up {
            return Ok(child);
        }
        let _ = child.kill();
        let _ = child.wait();
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        Err(match exited {
            Some(status) => format!("sshd exited ({status}); its log:\n{log}"),
            None => format!("sshd did not answer within 10 s; its log:\n{log}"),
        })
    }

    /// Writes an `ssh_config` for clients named `name` in the server's directory and returns
    /// its path: every host is this server (`Port`, unless `with_port` is false), its host key
    /// is not checked, and the only key offered is `identity` (none if `None`:
    /// `IdentitiesOnly yes` keeps ssh from trying the user's own keys).
    ///
    /// # Panics
    ///
    /// If it cannot be written.
    pub fn write_client_config(
        &self,
        name: &str,
        identity: Option<&Path>,
        with_port: bool,
    ) -> PathBuf {
        let mut text = String::from("Host *\n");
        if with_port {
            text.push_str(&format!("  Port {}\n", self.port));
        }
        if let Some(key) = identity {
            text.push_str(&format!("  IdentityFile {}\n", key.display()));
        }
        text.push_str(
            "  IdentitiesOnly yes\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  \
             LogLevel ERROR\n",
        );
        let path = self.dir.path().join(name);
        std::fs::write(&path, text)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        path
    }

    /// Makes a new key pair `name`, `name.pub` in the server's directory (not authorized);
    /// returns the private key's path.
    pub fn new_key(&self, name: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        keygen(&path);
        path
    }

    /// The client configuration: this server, its authorized key. For `ssh -F`.
    pub fn ssh_config(&self) -> PathBuf {
        self.dir.path().join("ssh_config")
    }

    /// The private key that `authorized_keys` lists.
    pub fn client_key(&self) -> PathBuf {
        self.dir.path().join("client_key")
    }

    /// The port it listens on (on every address of [`SSHD_ADDRESSES`]).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The listening server's process id.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Its log (`sshd -E`), for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sshd.log")).unwrap_or_default()
    }

    /// Everything running below the server: its per-connection processes and what they run
    /// (shells, `atlasboost agent`, its lifeline, workers).
    pub fn sessions(&self) -> Vec<ProcStat> {
        descendants(self.pid())
    }

    /// Waits up to `timeout` until nothing runs below the server any more.
    ///
    /// # Panics
    ///
    /// When something does, listing it with its command line and the server's log (and killing
    /// it, so that a failing test leaves nothing).
    pub fn assert_no_sessions(&self, timeout: Duration, context: &str) {
        if wait_until(timeout, || self.sessions().is_empty()) {
            return;
        }
        let left: Vec<String> = self
            .sessions()
            .iter()
            .map(|p| format!("{} {:?}", p.pid, cmdline(p.pid).unwrap_or_default()))
            .collect();
        for p in self.sessions() {
            let _ = kill(Pid::from_raw(p.pid), Signal::SIGKILL);
        }
        panic!(
            "{context}: {timeout:?} later, processes of ssh sessions still run:\n{}\n\
             --- sshd log ---\n{}",
            left.join("\n"),
            shown(self.log().as_bytes())
        );
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `ssh-keygen -q -t ed25519 -N '' -f path`.
pub(crate) fn keygen(path: &Path) {
    let out = Command::new("ssh-keygen")
        .args([
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            "atlasboost-e2e",
            "-f",
        ])
        .arg(path)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run ssh-keygen: {e}"));
    assert!(
        out.status.success(),
        "ssh-keygen -f {} failed ({}): {}",
        path.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A port `P` free right now with `P + 1` free too: a job's `MASTER_PORT`, whose `+ 1` library
/// mode's rendezvous takes (on every address). The launcher's own pick, below the kernel's
/// ephemeral range (scripts/test.sh refuses a range that leaves no room there): a port the
/// kernel hands out on its own (a bind to 0) is one it may give the next outgoing connection
/// too, which took `P + 1` from under a Python test once ("cannot bind ...: Address already in
/// use").
pub fn free_port_pair() -> u16 {
    let port = atlasboost::host::free_master_port();
    assert!(port != 0, "no two free ports in a row here");
    port
}

/// A port free on every address of [`SSHD_ADDRESSES`] right now (the kernel's pick, which is
/// in the ephemeral range, away from the ports other tests of this machine reserve).
pub(crate) fn free_port() -> u16 {
    for _ in 0..100 {
        let Ok(first) = std::net::TcpListener::bind("127.0.0.1:0") else {
            continue;
        };
        let Ok(port) = first.local_addr().map(|a| a.port()) else {
            continue;
        };
        if (2200..2300).contains(&port) {
            continue;
        }
        let others_free = SSHD_ADDRESSES[1..]
            .iter()
            .all(|a| std::net::TcpListener::bind((*a, port)).is_ok());
        if others_free {
            return port;
        }
    }
    panic!("no free port on {SSHD_ADDRESSES:?}");
}

/// Whether an SSH server answers on `addr:port` (its banner starts with `SSH-`).
pub(crate) fn answers_ssh(addr: &str, port: u16) -> bool {
    let Ok(ip) = addr.parse::<std::net::IpAddr>() else {
        return false;
    };
    let Ok(mut s) =
        std::net::TcpStream::connect_timeout(&(ip, port).into(), Duration::from_millis(500))
    else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let mut banner = [0u8; 4];
    s.read_exact(&mut banner).is_ok() && &banner == b"SSH-"
}
