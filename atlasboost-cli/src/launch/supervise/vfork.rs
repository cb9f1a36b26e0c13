//! Starting a worker the way `posix_spawn` does (a `clone` with `CLONE_VM | CLONE_VFORK`: the
//! child borrows this process's memory until it execs, so nothing is copied), with the steps
//! `posix_spawn` has no attribute for: `PR_SET_PDEATHSIG`, the workers' cgroup, the original
//! limit of open files and `--bind-cores`.
//!
//! `std::process::Command` forks whenever a `pre_exec` step is given, and a fork copies the
//! parent's page tables: every relay of `run --mpi` pays it once per rank, on the launch's
//! path (docs/PERFORMANCE.md). Everything the child needs (paths, argument and environment
//! arrays, the CPU set) is built before the clone; the child only makes system calls on it,
//! with every signal blocked until its dispositions are reset, as glibc's `posix_spawn` does.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::ffi::OsStringExt;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI32, Ordering};

use nix::libc;
use nix::sched::{CloneFlags, CpuSet};
use nix::sys::signal::{SigSet, SigmaskHow};
use nix::unistd::Pid;

/// The child's stack: it only makes system calls (glibc's `posix_spawn` uses about 32 KiB).
const STACK_BYTES: usize = 64 * 1024;

/// The children's stack, one at a time: in `.bss`, its pages are mapped when first touched and
/// kept, where a new buffer per child would cost an allocation and its zeroing every time.
static STACK: Mutex<[u8; STACK_BYTES]> = Mutex::new([0; STACK_BYTES]);

/// What the child reports instead of an errno when its parent died before `PR_SET_PDEATHSIG`
/// took effect (nobody would then kill it).
const PARENT_GONE: i32 = -1;

/// What to start and how (the caller's `RunPlan` and `WorkerPlan`, resolved).
pub(super) struct Child<'a> {
    /// The program, as given: a path, or a name looked up on the child's `PATH`.
    pub program: &'a OsStr,
    /// The arguments after it.
    pub args: &'a [OsString],
    /// Its working directory.
    pub dir: &'a Path,
    /// Its environment: this process's, as [`Environment::new`] changes it.
    pub env: Environment,
    /// The workers' cgroup's `cgroup.procs`, which the child enters first.
    pub cgroup: Option<RawFd>,
    /// `--bind-cores`.
    pub cpus: Option<CpuSet>,
    /// The limit of open files to give back (the launcher raised its own).
    pub fd_limit: Option<(u64, u64)>,
}

/// A child's environment: this process's with some variables taken out and some set, as
/// `Command::env_remove` and `Command::envs` would leave it, built without copying what is
/// kept (a launcher's environment holds a hundred variables, and a relay starts one worker
/// per rank on the launch's path).
pub(super) struct Environment {
    /// The variables set (`NAME=value`): owned here, pointed to by `envp`.
    _set: Vec<CString>,
    /// The child's `envp`: this process's own entries, then `set`'s; null-terminated.
    envp: Vec<*const libc::c_char>,
    /// The child's `PATH`, for the program's search.
    path: Option<Vec<u8>>,
}

impl Environment {
    /// This process's environment with `remove` taken out and `set` put in (the later of
    /// two settings of one name wins).
    ///
    /// The pointers into this process's environment stay valid while nothing changes it: in
    /// this crate only code that runs before any other thread does (`std::env::set_var` and
    /// `remove_var` are `unsafe` for that reason).
    ///
    /// # Errors
    ///
    /// A name or value that holds a NUL byte, or a name that holds `=`.
    pub(super) fn new(
        remove: &[OsString],
        set: impl IntoIterator<Item = (OsString, OsString)>,
    ) -> io::Result<Environment> {
        let mut pairs: Vec<(OsString, OsString)> = Vec::new();
        for (name, value) in set {
            match pairs.iter_mut().find(|(n, _)| *n == name) {
                Some(slot) => slot.1 = value,
                None => pairs.push((name, value)),
            }
        }
        let replaced = |name: &[u8]| {
            remove.iter().any(|r| r.as_bytes() == name)
                || pairs.iter().any(|(n, _)| n.as_bytes() == name)
        };
        let mut envp = Vec::new();
        let mut path = None;
        // SAFETY: `environ` is a null-terminated array of NUL-terminated strings, which
        // nothing changes meanwhile (see above).
        unsafe {
            let mut entry = libc::environ.cast_const();
            while !entry.is_null() && !(*entry).is_null() {
                let bytes = std::ffi::CStr::from_ptr(*entry).to_bytes();
                let name = bytes.split(|b| *b == b'=').next().unwrap_or_default();
                if !replaced(name) {
                    if name == b"PATH" {
                        path = bytes.get(5..).map(<[u8]>::to_vec);
                    }
                    envp.push((*entry).cast_const());
                }
                entry = entry.add(1);
            }
        }
        let mut made = Vec::with_capacity(pairs.len());
        for (name, value) in pairs {
            if name.as_bytes().contains(&b'=') || name.is_empty() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{} is not a variable's name", name.to_string_lossy()),
                ));
            }
            if name == "PATH" {
                path = Some(value.as_bytes().to_vec());
            }
            let mut pair = name.into_vec();
            pair.push(b'=');
            pair.extend_from_slice(value.as_bytes());
            made.push(CString::new(pair).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{} holds a NUL byte",
                        String::from_utf8_lossy(&e.into_vec())
                    ),
                )
            })?);
        }
        // A CString's buffer does not move when the CString itself does.
        envp.extend(made.iter().map(|c| c.as_ptr()));
        envp.push(std::ptr::null());
        Ok(Environment {
            _set: made,
            envp,
            path,
        })
    }

    /// Its variables, as `NAME=value` (for tests).
    #[cfg(test)]
    fn entries(&self) -> Vec<Vec<u8>> {
        self.envp
            .iter()
            .take_while(|p| !p.is_null())
            // SAFETY: each pointer is a NUL-terminated string kept alive by this value or
            // this process's environment.
            .map(|p| unsafe { std::ffi::CStr::from_ptr(*p) }.to_bytes().to_vec())
            .collect()
    }
}

/// Starts `child` in a process group of its own, stdin on `/dev/null`, stdout and stderr on
/// new pipes, whose read ends are returned.
///
/// # Errors
///
/// What `execve` said (`NotFound` for a program found nowhere, `PermissionDenied`, ...), or
/// what failed before it, as `std::process::Command::spawn` reports them.
pub(super) fn spawn(child: &Child<'_>) -> io::Result<(Pid, OwnedFd, OwnedFd)> {
    let c = |s: &OsStr| {
        CString::new(s.as_bytes()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} holds a NUL byte", s.to_string_lossy()),
            )
        })
    };
    let program = c(child.program)?;
    let args: Vec<CString> = child.args.iter().map(|a| c(a)).collect::<io::Result<_>>()?;
    let path = child.env.path.as_deref().map(OsStr::from_bytes);
    let candidates = candidates(child.program, path)?;
    let dir = c(child.dir.as_os_str())?;
    let argv: Vec<*const libc::c_char> = std::iter::once(program.as_ptr())
        .chain(args.iter().map(|a| a.as_ptr()))
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    // For a file the kernel cannot run (no `#!`), run by /bin/sh as execvp does: slot 1 is
    // filled with the file's path by the child.
    let mut sh_argv: Vec<*const libc::c_char> = [c"/bin/sh".as_ptr(), std::ptr::null()]
        .into_iter()
        .chain(args.iter().map(|a| a.as_ptr()))
        .chain(std::iter::once(std::ptr::null()))
        .collect();

    let null = nix::fcntl::open(
        "/dev/null",
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    let (out_read, out_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let (err_read, err_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let parent = nix::unistd::getpid();
    let failure = AtomicI32::new(0);
    // A panic elsewhere while holding it leaves the bytes as good as ever.
    let mut stack = STACK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let steps = ChildSteps {
        stdio: [
            null.as_raw_fd(),
            out_write.as_raw_fd(),
            err_write.as_raw_fd(),
        ],
        dir: &dir,
        cgroup: child.cgroup,
        cpus: child.cpus.as_ref(),
        fd_limit: child.fd_limit,
        parent,
        last_signal: libc::SIGRTMAX(),
        candidates: &candidates,
        argv: &argv,
        sh_argv: sh_argv.as_mut_ptr(),
        envp: &child.env.envp,
    };
    let cb = Box::new(|| {
        // SAFETY: see `ChildSteps::run`; the parent is suspended until this execs or returns.
        let errno = unsafe { steps.run() };
        failure.store(errno, Ordering::Relaxed);
        127
    });
    // Every signal blocked across the clone: a handler of this process must never run in the
    // child, which shares its memory (the child unblocks them after resetting dispositions).
    let mut old = SigSet::empty();
    nix::sys::signal::pthread_sigmask(
        SigmaskHow::SIG_SETMASK,
        Some(&SigSet::all()),
        Some(&mut old),
    )?;
    // SAFETY: CLONE_VM | CLONE_VFORK suspends this thread until the child execs or exits; the
    // child runs `cb` on `stack`, which outlives it, and makes only system calls (see
    // `ChildSteps::run`).
    let started = unsafe {
        nix::sched::clone(
            cb,
            &mut stack[..],
            CloneFlags::CLONE_VM | CloneFlags::CLONE_VFORK,
            Some(libc::SIGCHLD),
        )
    };
    let _ = nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
    let pid = started?;
    drop((null, out_write, err_write));
    match failure.load(Ordering::Relaxed) {
        0 => Ok((pid, out_read, err_read)),
        errno => {
            // It exited without exec: collect it.
            let _ = nix::sys::wait::waitpid(pid, None);
            Err(match errno {
                PARENT_GONE => io::Error::other("the launcher is gone"),
                errno => io::Error::from_raw_os_error(errno),
            })
        }
    }
}

/// The paths `execvp` would try for `program`: itself if it holds a `/`, else each directory
/// of `path` (glibc's default `/bin:/usr/bin` without one; an empty entry is the working
/// directory).
fn candidates(program: &OsStr, path: Option<&OsStr>) -> io::Result<Vec<CString>> {
    let bytes = program.as_bytes();
    if bytes.is_empty() {
        return Err(io::ErrorKind::NotFound.into());
    }
    let c = |b: Vec<u8>| CString::new(b).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput));
    if bytes.contains(&b'/') {
        return Ok(vec![c(bytes.to_vec())?]);
    }
    let path = path.map_or(&b"/bin:/usr/bin"[..], OsStrExt::as_bytes);
    path.split(|&b| b == b':')
        .map(|dir| match dir {
            b"" => c(bytes.to_vec()),
            dir => {
                let mut full = dir.to_vec();
                if !dir.ends_with(b"/") {
                    full.push(b'/');
                }
                full.extend_from_slice(bytes);
                c(full)
            }
        })
        .collect()
}

/// What the child does, all of it prepared by the parent.
struct ChildSteps<'a> {
    /// New stdin, stdout, stderr.
    stdio: [RawFd; 3],
    dir: &'a CString,
    cgroup: Option<RawFd>,
    cpus: Option<&'a CpuSet>,
    fd_limit: Option<(u64, u64)>,
    parent: Pid,
    /// `SIGRTMAX`, read before the clone.
    last_signal: libc::c_int,
    candidates: &'a [CString],
    argv: &'a [*const libc::c_char],
    /// `/bin/sh`'s arguments, slot 1 free for the script's path.
    sh_argv: *mut *const libc::c_char,
    envp: &'a [*const libc::c_char],
}

impl ChildSteps<'_> {
    /// Runs in the child: returns only on failure, with the errno to report (or
    /// [`PARENT_GONE`]).
    ///
    /// # Safety
    ///
    /// Only in the child of a `CLONE_VM | CLONE_VFORK` clone, with every signal blocked:
    /// nothing here allocates or takes a lock; it writes only its own stack, the parent's
    /// suspended thread's `errno` and `sh_argv[1]`.
    unsafe fn run(&self) -> i32 {
        let errno = || {
            io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO)
        };
        // SAFETY (whole block): system calls on descriptors and buffers the parent keeps
        // alive until the child has exec'd or exited.
        unsafe {
            for (target, fd) in self.stdio.iter().enumerate() {
                let target = target as RawFd;
                let moved = if *fd == target {
                    // dup2 onto itself would keep close-on-exec.
                    libc::fcntl(target, libc::F_SETFD, 0)
                } else {
                    libc::dup2(*fd, target)
                };
                if moved < 0 {
                    return errno();
                }
            }
            if libc::chdir(self.dir.as_ptr()) != 0 {
                return errno();
            }
            if libc::setpgid(0, 0) != 0 {
                return errno();
            }
            // First, so that nothing the worker starts is outside.
            if let Some(procs) = self.cgroup {
                super::super::lifeline::enter_cgroup(procs);
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return errno();
            }
            // The parent may have died before prctl: then nobody would kill this process.
            if libc::getppid() != self.parent.as_raw() {
                return PARENT_GONE;
            }
            // Workers get the limit of open files the launcher was given.
            if let Some((soft, hard)) = self.fd_limit {
                let limit = libc::rlimit {
                    rlim_cur: soft,
                    rlim_max: hard,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                    return errno();
                }
            }
            // --bind-cores: a set made before the clone.
            if let Some(set) = self.cpus
                && nix::sched::sched_setaffinity(Pid::from_raw(0), set).is_err()
            {
                return errno();
            }
            // Handlers are this process's code: the default in their place. SIGPIPE, which
            // Rust's runtime ignores, goes back to its default too (as std's Command does);
            // other ignored signals stay ignored across exec, as with any launcher.
            let mut action: libc::sigaction = std::mem::zeroed();
            for signal in 1..=self.last_signal {
                if signal == libc::SIGKILL || signal == libc::SIGSTOP {
                    continue;
                }
                if libc::sigaction(signal, std::ptr::null(), &mut action) != 0 {
                    continue;
                }
                let handled =
                    action.sa_sigaction != libc::SIG_DFL && action.sa_sigaction != libc::SIG_IGN;
                if handled || signal == libc::SIGPIPE {
                    let mut default: libc::sigaction = std::mem::zeroed();
                    default.sa_sigaction = libc::SIG_DFL;
                    libc::sigaction(signal, &default, std::ptr::null_mut());
                }
            }
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
            self.exec()
        }
    }

    /// execvp's search: each candidate in turn, past those that are missing or not
    /// permitted; a file the kernel cannot run (`ENOEXEC`) is run by `/bin/sh`.
    ///
    /// # Safety
    ///
    /// As [`ChildSteps::run`].
    unsafe fn exec(&self) -> i32 {
        let mut denied = false;
        let mut last = libc::ENOENT;
        for path in self.candidates {
            // SAFETY: null-terminated arrays of strings the parent keeps alive; sh_argv has
            // at least three slots.
            unsafe {
                libc::execve(path.as_ptr(), self.argv.as_ptr(), self.envp.as_ptr());
                let mut errno = *libc::__errno_location();
                if errno == libc::ENOEXEC {
                    *self.sh_argv.add(1) = path.as_ptr();
                    libc::execve(
                        c"/bin/sh".as_ptr(),
                        self.sh_argv.cast_const(),
                        self.envp.as_ptr(),
                    );
                    errno = *libc::__errno_location();
                }
                match errno {
                    libc::EACCES => denied = true,
                    libc::ENOENT
                    | libc::ESTALE
                    | libc::ENOTDIR
                    | libc::ENODEV
                    | libc::ETIMEDOUT => {}
                    other => return other,
                }
                last = errno;
            }
        }
        if denied { libc::EACCES } else { last }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_name_is_looked_up_on_the_path_in_order_and_a_path_is_taken_as_it_is() {
        let found =
            candidates(OsStr::new("tool"), Some(OsStr::new("/opt/bin::/usr/bin/"))).unwrap();
        let found: Vec<&[u8]> = found.iter().map(|c| c.as_bytes()).collect();
        assert_eq!(found, [&b"/opt/bin/tool"[..], b"tool", b"/usr/bin/tool"]);
        let given = candidates(OsStr::new("./tool"), Some(OsStr::new("/opt/bin"))).unwrap();
        assert_eq!(given[0].as_bytes(), b"./tool");
        let default = candidates(OsStr::new("sh"), None).unwrap();
        assert_eq!(default[0].as_bytes(), b"/bin/sh");
        assert_eq!(
            candidates(OsStr::new(""), None).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }

    #[test]
    fn the_environment_drops_what_is_removed_and_the_last_setting_wins() {
        let set = vec![
            ("ATLASBOOST_VFORK_TEST".into(), "1".into()),
            ("PATH".into(), "/nowhere".into()),
            ("ATLASBOOST_VFORK_TEST".into(), "2".into()),
        ];
        let env = Environment::new(&["HOME".into()], set).unwrap();
        let entries = env.entries();
        let named = |name: &str| {
            let prefix = format!("{name}=");
            entries
                .iter()
                .filter(|e| e.starts_with(prefix.as_bytes()))
                .map(|e| String::from_utf8_lossy(&e[prefix.len()..]).into_owned())
                .collect::<Vec<_>>()
        };
        assert!(named("HOME").is_empty(), "{entries:?}");
        assert_eq!(named("ATLASBOOST_VFORK_TEST"), ["2"]);
        assert_eq!(named("PATH"), ["/nowhere"]);
        assert_eq!(env.path.as_deref(), Some(&b"/nowhere"[..]));
        // What is neither removed nor set is this process's, as it is.
        let kept = std::env::vars_os()
            .filter(|(n, _)| n != "HOME" && n != "PATH" && n != "ATLASBOOST_VFORK_TEST")
            .count();
        assert_eq!(entries.len(), kept + 2);
        for bad in ["A=B", ""] {
            assert!(
                Environment::new(&[], [(bad.into(), "x".into())]).is_err(),
                "{bad:?}"
            );
        }
    }
}
