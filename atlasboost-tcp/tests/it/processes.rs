//! Participants in separate processes: the test binary runs itself again as one participant
//! (the test `participant_process`, configured through environment variables), next to 64
//! participants on threads; and the same with one participant process killed.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use atlasboost_core::Rendezvous;
use atlasboost_tcp::{Coordinator, CoordinatorConfig, ParticipantConfig, Secret, ZmqRendezvous};

use crate::common::{
    BOUND, GRACE, LOOPBACK, TIMEOUT, assert_within, chain, connect, names, payload, payloads,
    secret, spawn,
};

/// Marks the lines a child participant prints for its parent.
const MARK: &str = "ATLASBOOST-IT";
const VAR_ENDPOINT: &str = "ATLASBOOST_IT_ENDPOINT";
const VAR_INDEX: &str = "ATLASBOOST_IT_INDEX";
const VAR_WORLD: &str = "ATLASBOOST_IT_WORLD";
const VAR_JOB: &str = "ATLASBOOST_IT_JOB";
const VAR_SECRET: &str = "ATLASBOOST_IT_SECRET";
const VAR_TIMEOUT_MS: &str = "ATLASBOOST_IT_TIMEOUT_MS";
/// `join`: connect, then stall before the all-gather; `barrier`: stall before the barrier.
const VAR_STALL: &str = "ATLASBOOST_IT_STALL";
/// How long a stalled child waits to be killed before it gives up (and exits, never joining).
const STALL: Duration = Duration::from_secs(20);

const THREADS: usize = 64;
const PROCESSES: usize = 4;
const WORLD: usize = THREADS + PROCESSES;
/// The participant killed in the failure tests: the last process.
const KILLED: usize = WORLD - 1;
/// The coordinator's timeout in the failure tests.
const SHORT: Duration = Duration::from_secs(4);

/// Not a test of its own: one participant, when a process test starts this binary with the
/// variables above set. Prints `ATLASBOOST-IT ready|gathered|ok|error ...` lines and exits
/// non-zero on error.
#[test]
fn participant_process() {
    let Ok(endpoint) = std::env::var(VAR_ENDPOINT) else {
        println!("helper of the process tests: it runs a participant only when they start it");
        return;
    };
    if let Err(e) = child_main(endpoint) {
        println!("{MARK} error {e}");
        std::process::exit(1);
    }
}

fn child_main(endpoint: String) -> Result<(), String> {
    let var = |name: &str| std::env::var(name).map_err(|_| format!("{name} is not set"));
    let number = |name: &str| -> Result<usize, String> {
        var(name)?
            .parse()
            .map_err(|e| format!("{name} is not a number: {e}"))
    };
    let index = number(VAR_INDEX)?;
    let world = number(VAR_WORLD)?;
    let timeout = Duration::from_millis(number(VAR_TIMEOUT_MS)? as u64);
    let secret = Secret::from_hex(&var(VAR_SECRET)?).ok_or("the secret is not 64 hex digits")?;
    let stall = std::env::var(VAR_STALL).unwrap_or_default();
    let config = ParticipantConfig::new(endpoint, index, world, var(VAR_JOB)?, secret, timeout);
    let mut rdv = ZmqRendezvous::connect(config).map_err(|e| chain(&e))?;
    println!("{MARK} ready {index}");
    if stall == "join" {
        stall_until_killed();
    }
    let got = rdv.all_gather(&payload(index, 0)).map_err(|e| chain(&e))?;
    if got != payloads(world, 0) {
        return Err(format!(
            "participant {index}: wrong all-gather result ({} payloads)",
            got.len()
        ));
    }
    println!("{MARK} gathered {index}");
    if stall == "barrier" {
        stall_until_killed();
    }
    rdv.barrier().map_err(|e| chain(&e))?;
    println!("{MARK} ok {index}: {world} payloads in index order, barrier passed");
    Ok(())
}

fn stall_until_killed() -> ! {
    std::thread::sleep(STALL);
    println!("{MARK} error nobody killed this participant within {STALL:?}");
    std::process::exit(3);
}

/// A participant process; killed when dropped, so a failing test leaves no process behind.
struct Process {
    index: usize,
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: Arc<Mutex<String>>,
}

impl Process {
    fn spawn(
        endpoint: &str,
        index: usize,
        job: &str,
        secret: &Secret,
        timeout: Duration,
        stall: &str,
    ) -> Process {
        let exe = std::env::current_exe().expect("the test binary's path");
        let mut child = Command::new(exe)
            .args([
                "--exact",
                "processes::participant_process",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(VAR_ENDPOINT, endpoint)
            .env(VAR_INDEX, index.to_string())
            .env(VAR_WORLD, WORLD.to_string())
            .env(VAR_JOB, job)
            .env(VAR_SECRET, secret.to_hex())
            .env(VAR_TIMEOUT_MS, (timeout + GRACE).as_millis().to_string())
            .env(VAR_STALL, stall)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start a participant process");
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().expect("piped stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // The harness may have printed `test ... ` on the same line first.
                if let Some(at) = line.find(MARK)
                    && tx.send(line[at + MARK.len()..].trim().to_string()).is_err()
                {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut pipe = child.stderr.take().expect("piped stderr");
        let sink = Arc::clone(&stderr);
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            sink.lock().unwrap().push_str(&text);
        });
        Process {
            index,
            child,
            lines,
            stderr,
        }
    }

    /// The next line starting with `word`, or the child's `error` line, whichever comes first.
    fn line(&self, word: &str, bound: Duration) -> String {
        let deadline = Instant::now() + bound;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(word) || line.starts_with("error") => return line,
                Ok(_) => {}
                Err(e) => panic!(
                    "participant process {} printed no {word:?} line within {bound:?} ({e}); stderr: {}",
                    self.index,
                    self.stderr.lock().unwrap()
                ),
            }
        }
    }

    /// Waits for the process to exit, at most `bound`.
    fn wait(&mut self, bound: Duration) -> ExitStatus {
        let deadline = Instant::now() + bound;
        loop {
            if let Some(status) = self.child.try_wait().expect("poll a child") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "participant process {} did not exit within {bound:?}",
                self.index
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A coordinator for `WORLD` participants named `node-<i>`.
fn named_coordinator(job: &str, secret: &Secret, timeout: Duration) -> Coordinator {
    let mut config = CoordinatorConfig::new(LOOPBACK, WORLD, job, secret.clone(), timeout);
    config.names = names(WORLD);
    Coordinator::start(config).expect("start a coordinator")
}

#[test]
fn sixty_four_threads_and_four_processes_gather_and_meet_at_a_barrier() {
    let (secret, job) = (secret(), "job-68");
    let coordinator = named_coordinator(job, &secret, TIMEOUT);
    let endpoint = coordinator.endpoint().to_string();
    let mut processes: Vec<Process> = (THREADS..WORLD)
        .map(|i| Process::spawn(&endpoint, i, job, &secret, TIMEOUT, ""))
        .collect();
    let threads = {
        let (endpoint, secret) = (endpoint.clone(), secret.clone());
        spawn(0..THREADS, move |i| -> Result<(), String> {
            let mut rdv = connect(&endpoint, i, WORLD, job, &secret, TIMEOUT);
            let got = rdv.all_gather(&payload(i, 0)).map_err(|e| chain(&e))?;
            if got != payloads(WORLD, 0) {
                return Err(format!("participant {i}: wrong all-gather result"));
            }
            rdv.barrier().map_err(|e| chain(&e))
        })
    };
    for (i, result) in threads.wait(BOUND).into_iter().enumerate() {
        if let Err(e) = result {
            panic!("participant thread {i}: {e}");
        }
    }
    for p in &mut processes {
        let line = p.line("ok", BOUND);
        assert!(
            line.starts_with(&format!("ok {}:", p.index)),
            "participant process {}: {line}",
            p.index
        );
        let status = p.wait(BOUND);
        assert!(
            status.success(),
            "participant process {}: {status}",
            p.index
        );
    }
    let report = coordinator.finish();
    assert_eq!(report.failure, None);
    assert_eq!(report.rounds, 2, "an all-gather and a barrier");
    assert_eq!(report.dropped, 0, "{:?}", report.drop_log);
}

/// Checks what a surviving participant (thread or process) reported about the killed one.
fn assert_names_the_killed(who: &str, message: &str, round: u64) {
    let name = format!("participant {KILLED} (node-{KILLED})");
    assert!(
        message.contains(&name) && message.contains(&format!("in round {round}")),
        "{who} should fail naming {name} in round {round}: {message}"
    );
    assert!(message.contains("timed out"), "{who}: {message}");
}

/// Checks that the coordinator reports the killed participant as the one missing.
fn assert_report_names_the_killed(coordinator: Coordinator, round: u64) {
    let report = coordinator.finish();
    let failure = report.failure.expect("the coordinator reports a failure");
    assert!(
        failure.contains(&format!(
            "waiting for participant {KILLED} (node-{KILLED}) ({KILLED} of {WORLD} arrived)"
        )),
        "the coordinator should name participant {KILLED} alone: {failure}"
    );
    assert_names_the_killed("the coordinator", &failure, round);
    assert_eq!(report.rounds, round - 1);
}

/// Kills `p` (SIGKILL) and checks it died of it.
fn kill(p: &mut Process) {
    p.child.kill().expect("kill the participant process");
    let status = p.wait(BOUND);
    assert_eq!(status.signal(), Some(9), "killed by SIGKILL: {status}");
}

/// Waits for each surviving process to report the failure and exit non-zero.
fn assert_processes_fail(processes: &mut [Process], round: u64) {
    for p in processes.iter_mut().filter(|p| p.index != KILLED) {
        let line = p.line("error", BOUND);
        assert_names_the_killed(&format!("participant process {}", p.index), &line, round);
        let status = p.wait(BOUND);
        assert!(
            !status.success(),
            "participant process {} exits non-zero on error",
            p.index
        );
    }
}

#[test]
fn a_participant_process_killed_before_joining_is_named_by_every_other() {
    let (secret, job) = (secret(), "job-68-killed");
    let coordinator = named_coordinator(job, &secret, SHORT);
    let endpoint = coordinator.endpoint().to_string();
    let mut processes: Vec<Process> = (THREADS..WORLD)
        .map(|i| {
            let stall = if i == KILLED { "join" } else { "" };
            Process::spawn(&endpoint, i, job, &secret, SHORT, stall)
        })
        .collect();
    // It has connected to the coordinator, and dies before it sends anything.
    let killed = &mut processes[PROCESSES - 1];
    let ready = killed.line("ready", BOUND);
    assert_eq!(ready, format!("ready {KILLED}"));
    kill(killed);

    let threads = {
        let (endpoint, secret) = (endpoint.clone(), secret.clone());
        spawn(0..THREADS, move |i| {
            let mut rdv = connect(&endpoint, i, WORLD, job, &secret, SHORT);
            let start = Instant::now();
            let result = rdv.all_gather(&payload(i, 0));
            (result, start.elapsed())
        })
    };
    for (i, (result, elapsed)) in threads.wait(BOUND).into_iter().enumerate() {
        let e = result.expect_err("the all-gather fails without participant 67");
        assert_names_the_killed(&format!("participant thread {i}"), &chain(&e), 1);
        assert!(e.is_temporary(), "a timeout is temporary: {e:?}");
        assert_within(&format!("participant thread {i}"), elapsed, SHORT);
    }
    assert_processes_fail(&mut processes, 1);
    assert_report_names_the_killed(coordinator, 1);
}

#[test]
fn a_participant_process_killed_between_gather_and_barrier_is_named_by_every_other() {
    let (secret, job) = (secret(), "job-68-killed-mid");
    let coordinator = named_coordinator(job, &secret, SHORT);
    let endpoint = coordinator.endpoint().to_string();
    let mut processes: Vec<Process> = (THREADS..WORLD)
        .map(|i| {
            let stall = if i == KILLED { "barrier" } else { "" };
            Process::spawn(&endpoint, i, job, &secret, SHORT, stall)
        })
        .collect();
    let threads = {
        let (endpoint, secret) = (endpoint.clone(), secret.clone());
        spawn(0..THREADS, move |i| -> Result<_, String> {
            let mut rdv = connect(&endpoint, i, WORLD, job, &secret, SHORT);
            let got = rdv.all_gather(&payload(i, 0)).map_err(|e| chain(&e))?;
            if got != payloads(WORLD, 0) {
                return Err(format!("participant {i}: wrong all-gather result"));
            }
            let start = Instant::now();
            let result = rdv.barrier();
            Ok((result, start.elapsed()))
        })
    };
    // Round 1 is complete for it: it dies in the middle of the rendezvous.
    let killed = &mut processes[PROCESSES - 1];
    let gathered = killed.line("gathered", BOUND);
    assert_eq!(gathered, format!("gathered {KILLED}"));
    kill(killed);

    for (i, outcome) in threads.wait(BOUND).into_iter().enumerate() {
        let (result, elapsed) = outcome.unwrap_or_else(|e| panic!("participant thread {i}: {e}"));
        let e = result.expect_err("the barrier fails without participant 67");
        assert_names_the_killed(&format!("participant thread {i}"), &chain(&e), 2);
        assert_within(&format!("participant thread {i}"), elapsed, SHORT);
    }
    assert_processes_fail(&mut processes, 2);
    assert_report_names_the_killed(coordinator, 2);
}
