//! Helpers shared by the test modules: coordinators and participants on loopback, threads
//! joined with a bound, error chains as text.

use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use atlasboost_tcp::{Coordinator, CoordinatorConfig, ParticipantConfig, Secret, ZmqRendezvous};

/// Where coordinators bind: loopback, any free port.
pub const LOOPBACK: &str = "tcp://127.0.0.1:0";

/// The coordinator's timeout in tests that are expected to succeed: only a bound for bugs.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// How much longer than the coordinator a participant waits, so the coordinator's reason
/// (who was missing) arrives before the participant's own timeout.
pub const GRACE: Duration = Duration::from_secs(2);

/// How long a test waits for its threads and processes: longer than any timeout above.
pub const BOUND: Duration = Duration::from_secs(30);

/// Slack for "failed within the timeout": a bound against hangs, not a performance check.
pub const MARGIN: Duration = Duration::from_secs(5);

/// A fresh random secret.
pub fn secret() -> Secret {
    Secret::random().expect("read /dev/urandom")
}

/// `node-0`, `node-1`, ...: host names for `CoordinatorConfig::names`.
pub fn names(world: usize) -> Vec<String> {
    (0..world).map(|i| format!("node-{i}")).collect()
}

/// Starts an all-gather coordinator on loopback.
pub fn coordinator(world: usize, job: &str, secret: &Secret, timeout: Duration) -> Coordinator {
    Coordinator::start(CoordinatorConfig::new(
        LOOPBACK,
        world,
        job,
        secret.clone(),
        timeout,
    ))
    .expect("start a coordinator")
}

/// Starts a coordinator on loopback whose answers `combiner` computes (timeout `TIMEOUT`).
pub fn coordinator_with(
    world: usize,
    job: &str,
    secret: &Secret,
    combiner: atlasboost_tcp::Combiner,
) -> Coordinator {
    Coordinator::start_with(
        CoordinatorConfig::new(LOOPBACK, world, job, secret.clone(), TIMEOUT),
        combiner,
    )
    .expect("start a coordinator")
}

/// A participant's configuration; it waits `GRACE` longer than `timeout`.
pub fn config(
    endpoint: &str,
    index: usize,
    world: usize,
    job: &str,
    secret: &Secret,
    timeout: Duration,
) -> ParticipantConfig {
    ParticipantConfig::new(endpoint, index, world, job, secret.clone(), timeout + GRACE)
}

/// Connects a participant (see [`config`]).
pub fn connect(
    endpoint: &str,
    index: usize,
    world: usize,
    job: &str,
    secret: &Secret,
    timeout: Duration,
) -> ZmqRendezvous {
    ZmqRendezvous::connect(config(endpoint, index, world, job, secret, timeout))
        .expect("connect a participant")
}

/// The payload participant `index` contributes to round `round`: lengths differ, and so do
/// the bytes, so a payload in the wrong place is seen.
pub fn payload(index: usize, round: usize) -> Vec<u8> {
    let mut p = format!("participant {index}, round {round}:").into_bytes();
    p.extend((0..(index * 13 + round * 7) % 61).map(|k| (k ^ index ^ (round << 4)) as u8));
    p
}

/// Every participant's payload of round `round`, in index order.
pub fn payloads(world: usize, round: usize) -> Vec<Vec<u8>> {
    (0..world).map(|i| payload(i, round)).collect()
}

/// An error and all its sources, joined with ": " (what a user would see in a log).
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    atlasboost_core::exchange::error_chain(e)
}

/// A port that was free a moment ago (bound on loopback, read, released).
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener.local_addr().expect("read the bound port").port()
}

/// Threads started by [`spawn`], each tagged with a key.
pub struct Threads<T> {
    keys: Vec<usize>,
    rx: mpsc::Receiver<(usize, T)>,
}

/// Runs `f(key)` on its own thread for every key.
pub fn spawn<T, F>(keys: impl IntoIterator<Item = usize>, f: F) -> Threads<T>
where
    T: Send + 'static,
    F: Fn(usize) -> T + Send + Sync + 'static,
{
    let f = Arc::new(f);
    let (tx, rx) = mpsc::channel();
    let keys: Vec<usize> = keys.into_iter().collect();
    for &key in &keys {
        let (f, tx) = (Arc::clone(&f), tx.clone());
        std::thread::Builder::new()
            .name(format!("test-{key}"))
            .spawn(move || {
                // The test may have given up waiting; nobody to tell then.
                let _ = tx.send((key, f(key)));
            })
            .expect("spawn a thread");
    }
    Threads { keys, rx }
}

/// Runs `f` on a thread of its own (key 0).
pub fn spawn_one<T, F>(f: F) -> Threads<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("test-one".into())
        .spawn(move || {
            let _ = tx.send((0, f()));
        })
        .expect("spawn a thread");
    Threads { keys: vec![0], rx }
}

impl<T> Threads<T> {
    /// The results by key, in the order the keys were given. Panics, naming the threads that
    /// did not finish, when `bound` passes first (or when a thread panicked).
    pub fn wait(self, bound: Duration) -> Vec<T> {
        let deadline = Instant::now() + bound;
        let mut results: Vec<Option<T>> = self.keys.iter().map(|_| None).collect();
        for _ in 0..self.keys.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok((key, value)) => {
                    let at = self
                        .keys
                        .iter()
                        .position(|k| *k == key)
                        .expect("a known key");
                    results[at] = Some(value);
                }
                Err(e) => {
                    let missing: Vec<usize> = self
                        .keys
                        .iter()
                        .zip(&results)
                        .filter(|(_, r)| r.is_none())
                        .map(|(k, _)| *k)
                        .collect();
                    panic!("threads {missing:?} did not finish within {bound:?} ({e})");
                }
            }
        }
        results
            .into_iter()
            .map(|r| r.expect("every result"))
            .collect()
    }
}

/// Asserts that `elapsed` is under `timeout` plus [`MARGIN`].
pub fn assert_within(what: &str, elapsed: Duration, timeout: Duration) {
    assert!(
        elapsed < timeout + MARGIN,
        "{what} took {elapsed:?}, more than the timeout {timeout:?} + {MARGIN:?}"
    );
}
