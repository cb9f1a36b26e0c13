//! Runs a test under `mpirun`: the test binary starts `mpirun -np 4` on itself, filtered to the
//! one test, with a marker variable; inside `mpirun` the same test sees the marker and does the
//! per-rank work, printing lines `@<test> rank=<i> ...` for the outer test to check.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The variable that tells a test it runs inside `mpirun`; its value is the test's name.
pub const MARKER: &str = "ATLASBOOST_MPI_TEST";
/// Ranks per run.
pub const RANKS: usize = 4;
/// The longest an `mpirun` may take before it is killed and the test fails.
pub const WALL: Duration = Duration::from_secs(60);

/// One `mpirun` at a time: the tests of this binary run in parallel threads, and four ranks
/// already oversubscribe the two cores the tests are meant for.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// What one `mpirun` did.
#[derive(Debug)]
pub struct Run {
    pub test: String,
    pub status: ExitStatus,
    /// Whether it was killed at its wall time.
    pub killed: bool,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Run {
    /// The lines the ranks printed, by rank (the text after `@<test> rank=<i> `).
    pub fn by_rank(&self) -> BTreeMap<usize, Vec<String>> {
        let prefix = format!("@{} rank=", self.test);
        let mut out: BTreeMap<usize, Vec<String>> = BTreeMap::new();
        for line in self.stdout.lines() {
            // Not necessarily at the start: libtest's `test <name> ... ` has no newline, and
            // another rank's line may follow it.
            let Some(at) = line.find(&prefix) else {
                continue;
            };
            let rest = &line[at + prefix.len()..];
            let (rank, text) = rest.split_once(' ').unwrap_or((rest, ""));
            let rank: usize = rank
                .parse()
                .unwrap_or_else(|_| panic!("bad rank in {line:?}\n{self}"));
            out.entry(rank).or_default().push(text.to_string());
        }
        out
    }

    /// The one line of `rank` that starts with `key=`, without the key.
    pub fn text(&self, rank: usize, key: &str) -> String {
        let prefix = format!("{key}=");
        let found: Vec<String> = self
            .by_rank()
            .remove(&rank)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|l| l.strip_prefix(&prefix).map(str::to_string))
            .collect();
        assert_eq!(
            found.len(),
            1,
            "rank {rank} printed {} lines {key}=...\n{self}",
            found.len()
        );
        found.into_iter().next().unwrap_or_default()
    }

    /// Whether `rank` printed a line starting with `key=`.
    pub fn has(&self, rank: usize, key: &str) -> bool {
        let prefix = format!("{key}=");
        self.by_rank()
            .get(&rank)
            .is_some_and(|lines| lines.iter().any(|l| l.starts_with(&prefix)))
    }

    /// Both outputs, for messages.
    pub fn output(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr)
    }
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "mpirun for test {} {} with {} after {:?}\n--- stdout\n{}--- stderr\n{}---",
            self.test,
            if self.killed { "was killed" } else { "ended" },
            self.status,
            self.elapsed,
            self.stdout,
            self.stderr
        )
    }
}

/// Prints one line for the outer test: `@<test> rank=<rank> <text>`.
pub fn report(test: &str, rank: usize, text: impl std::fmt::Display) {
    println!("@{test} rank={rank} {text}");
}

/// Inside `mpirun` (the marker names `test`): runs `body` and returns `None`. Outside: runs
/// `mpirun -np 4` on this test and returns what it did; fails the test if `mpirun` does not
/// end within [`WALL`].
pub fn under_mpirun(test: &str, body: impl FnOnce()) -> Option<Run> {
    let run = under_mpirun_for(test, WALL, body)?;
    assert!(
        !run.killed,
        "test {test}: mpirun did not end within {WALL:?}, killed it\n{run}"
    );
    Some(run)
}

/// As [`under_mpirun`], but `mpirun` is killed after `wall`, and the test checks
/// [`Run::killed`] itself: for a run that is expected to hang.
pub fn under_mpirun_for(test: &str, wall: Duration, body: impl FnOnce()) -> Option<Run> {
    match std::env::var(MARKER) {
        Ok(t) if t == test => {
            body();
            return None;
        }
        Ok(t) => {
            panic!("{MARKER}={t}, but this is test {test}: the filter passed to mpirun is wrong")
        }
        Err(_) => {}
    }
    assert!(
        std::env::var_os("OMPI_COMM_WORLD_SIZE").is_none(),
        "test {test} runs under someone else's mpirun: run `cargo test -p atlasboost-mpi` \
         directly, the tests start mpirun themselves"
    );
    Some(launch(test, wall))
}

/// Runs `mpirun -np 4 <this test binary> --exact <test>`, killing it after `wall`.
fn launch(test: &str, wall: Duration) -> Run {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
    let exe = std::env::current_exe().expect("the test binary's path");
    let started = Instant::now();
    let mut child = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np"])
        .arg(RANKS.to_string())
        .arg("-x")
        .arg(format!("{MARKER}={test}"))
        .arg(&exe)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(MARKER, test)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so that a run that ignores SIGTERM can be killed whole.
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                panic!(
                    "test {test}: mpirun not found on PATH. The atlasboost-mpi tests need Open \
                     MPI (mpirun, and libopenmpi-dev to build); the crate is only built where \
                     MPI is installed, so a missing mpirun is an error, not a skip"
                )
            }
            panic!("test {test}: cannot start mpirun: {e}")
        });
    let stdout = drain(child.stdout.take().expect("piped stdout"));
    let stderr = drain(child.stderr.take().expect("piped stderr"));

    let pid = Pid::from_raw(child.id() as i32);
    let mut killed = false;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for mpirun") {
            break status;
        }
        let elapsed = started.elapsed();
        if elapsed > wall && !killed {
            // mpirun ends the ranks on SIGTERM.
            killed = true;
            let _ = kill(pid, Signal::SIGTERM);
        } else if elapsed > wall + Duration::from_secs(5) {
            // It did not: kill its whole process group.
            let _ = kill(Pid::from_raw(-pid.as_raw()), Signal::SIGKILL);
            break child.wait().expect("waiting for the killed mpirun");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let elapsed = started.elapsed();
    let take = |rx: mpsc::Receiver<String>, which: &str| {
        rx.recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| {
                panic!("test {test}: mpirun ended ({status}) but its {which} stayed open")
            })
    };
    let stdout = take(stdout, "stdout");
    let stderr = take(stderr, "stderr");
    Run {
        test: test.to_string(),
        status,
        killed,
        stdout,
        stderr,
        elapsed,
    }
}

/// Reads a pipe to its end in a thread; the text arrives on the channel.
fn drain(mut pipe: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        let _ = tx.send(String::from_utf8_lossy(&bytes).into_owned());
    });
    rx
}

/// FNV-1a, 64 bits: a digest of a table to compare between ranks in one short line.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Parses a reported value, naming it if it cannot.
pub fn parse<T: std::str::FromStr>(s: &str, what: &str) -> T {
    s.parse()
        .unwrap_or_else(|_| panic!("{what}: cannot parse {s:?}"))
}

/// `value` of `key=value` in a line of `key=value key=value ...` fields.
pub fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
}
