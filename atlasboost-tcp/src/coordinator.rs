//! The coordinator: binds a ROUTER socket, collects one contribution per participant and round,
//! and answers everyone when the round is complete, or tells everyone why it failed.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::shared::SharedMessage;
use crate::wire::{self, Frame, Kind, Secret};
use crate::{BROADCAST, DEFAULT_MAX_MESSAGE, TcpError, is_ipv6_endpoint, zmq_err};

/// The longest the coordinator sleeps with no deadline ahead: a safety net, since stopping
/// wakes it at once.
const IDLE: Duration = Duration::from_secs(1);
/// The longest closing the socket may take to deliver answers still queued (no longer than
/// the round timeout either).
const LINGER_MS: i32 = 30_000;
/// How long stopping waits for failure notices to go out, when closing is not waited for.
const NOTICE_GRACE: Duration = Duration::from_secs(2);
/// How many frames the coordinator handles before it looks at its clock and stop flag again.
const BATCH: usize = 256;
/// How many refused frames the coordinator remembers (it counts all of them).
const DROP_LOG_LEN: usize = 100;

/// What the coordinator answers when a round is complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replies {
    /// The same bytes for everyone (encoded and signed once, whatever the world size).
    Same(Vec<u8>),
    /// One answer per participant, by index: e.g. only its own assignment.
    Each(Vec<Vec<u8>>),
    /// `common` for the participants whose entry in `own` is `None` (encoded and signed once),
    /// and their own answer for the others: e.g. the whole table for one process per host and
    /// only its assignment for each of the others.
    Mixed {
        /// The answer shared by everyone without an answer of their own.
        common: Vec<u8>,
        /// By index: `Some` answer of a participant's own, or `None` for `common`.
        own: Vec<Option<Vec<u8>>>,
    },
}

/// Computes a round's answers from the payloads of all participants (by index).
pub type Combiner = Box<dyn FnMut(u64, &[Vec<u8>]) -> Result<Replies, String> + Send>;

/// How to run a coordinator.
#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    /// Where to bind, e.g. `tcp://127.0.0.1:0` (port 0: any free port; see
    /// [`Coordinator::endpoint`]).
    pub bind: String,
    /// How many participants take part (indices `0..world`).
    pub world: usize,
    /// The job's id; frames of other jobs are refused.
    pub job_id: String,
    /// The job's secret; frames not signed with it are refused.
    pub secret: Secret,
    /// How long a round may take, counted from its first contribution (the first round: from
    /// the start).
    pub timeout: Duration,
    /// The largest frame accepted, in bytes.
    pub max_message: usize,
    /// Names of the participants by index (e.g. host names), used in error messages.
    pub names: Vec<String>,
}

impl CoordinatorConfig {
    /// A configuration with the default size limit and no participant names.
    pub fn new(
        bind: impl Into<String>,
        world: usize,
        job_id: impl Into<String>,
        secret: Secret,
        timeout: Duration,
    ) -> Self {
        CoordinatorConfig {
            bind: bind.into(),
            world,
            job_id: job_id.into(),
            secret,
            timeout,
            max_message: DEFAULT_MAX_MESSAGE,
            names: Vec::new(),
        }
    }
}

/// What a coordinator did, returned by [`Coordinator::finish`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Rounds completed.
    pub rounds: u64,
    /// Why the rendezvous failed, if it did (the text every participant was sent).
    pub failure: Option<String>,
    /// Frames refused (wrong secret, garbage, another job, too large, ...).
    pub dropped: u64,
    /// The first refused frames: who sent them and why.
    pub drop_log: Vec<String>,
}

/// Shared between the coordinator thread and its handle.
#[derive(Debug, Default)]
struct Shared {
    stop: AtomicBool,
    rounds: AtomicU64,
    /// Participants arrived in the current round.
    joined: AtomicU64,
    dropped: AtomicU64,
    drop_log: Mutex<Vec<String>>,
    failure: Mutex<Option<String>>,
}

/// A running coordinator; stops when [`finish`](Coordinator::finish)ed or dropped.
pub struct Coordinator {
    endpoint: String,
    shared: Arc<Shared>,
    /// Written to when the coordinator should stop, so its thread does not sleep on.
    waker: UnixStream,
    thread: Option<JoinHandle<()>>,
    /// Told by the thread once its loop has ended (whether answers may still be queued), then
    /// once its socket is closed.
    done: std::sync::mpsc::Receiver<bool>,
}

impl std::fmt::Debug for Coordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coordinator")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl Coordinator {
    /// Binds and starts a coordinator whose rounds are all-gathers: everyone receives every
    /// payload, in index order.
    ///
    /// # Errors
    ///
    /// [`TcpError::Config`] for a world of 0, [`TcpError::Zmq`] if the address cannot be bound.
    pub fn start(config: CoordinatorConfig) -> Result<Coordinator, TcpError> {
        Coordinator::start_with(
            config,
            Box::new(|_, payloads| Ok(Replies::Same(wire::pack_list(payloads)))),
        )
    }

    /// Binds and starts a coordinator whose answers `combiner` computes.
    ///
    /// # Errors
    ///
    /// As [`Coordinator::start`].
    pub fn start_with(
        config: CoordinatorConfig,
        combiner: Combiner,
    ) -> Result<Coordinator, TcpError> {
        if config.world == 0 || config.world > u32::MAX as usize {
            return Err(TcpError::Config(format!(
                "a rendezvous needs 1 to {} participants, not {}",
                u32::MAX,
                config.world
            )));
        }
        check_limits(&config.job_id, config.max_message)?;
        let ctx = zmq::Context::new();
        // Accepting and handshaking thousands of connections is the I/O threads' work.
        ctx.set_io_threads(2)
            .map_err(zmq_err("set the number of I/O threads"))?;
        let socket = ctx
            .socket(zmq::ROUTER)
            .map_err(zmq_err("create a ROUTER socket"))?;
        // ZeroMQ itself cuts off a sender whose frame exceeds twice the limit (without telling
        // us, so those are not counted); frames between the limit and that are refused and
        // logged like any other bad frame.
        socket
            .set_maxmsgsize(config.max_message.saturating_mul(2).min(i64::MAX as usize) as i64)
            .map_err(zmq_err("set the message size limit"))?;
        socket
            .set_linger(config.timeout.as_millis().min(LINGER_MS as u128) as i32)
            .map_err(zmq_err("set the linger time"))?;
        // Many participants connect at once: let the kernel queue them.
        socket
            .set_backlog(4096)
            .map_err(zmq_err("set the listen backlog"))?;
        // An IPv6 bind (`tcp://[::]:PORT`) needs ZeroMQ's IPv6 switch; it stays off for an
        // IPv4 one, whose endpoint and peers would otherwise read `::ffff:127.0.0.1`.
        if is_ipv6_endpoint(&config.bind) {
            socket.set_ipv6(true).map_err(zmq_err("allow IPv6"))?;
        }
        socket
            .bind(&config.bind)
            .map_err(zmq_err(&format!("bind {}", config.bind)))?;
        let endpoint = match socket.get_last_endpoint() {
            Ok(Ok(e)) => e,
            _ => config.bind.clone(),
        };
        let shared = Arc::new(Shared::default());
        let (waker, wakeup) = UnixStream::pair().map_err(|e| {
            TcpError::Config(format!(
                "cannot create the coordinator's wake-up socket: {e}"
            ))
        })?;
        let (done_tx, done) = std::sync::mpsc::channel();
        let thread = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("atlasboost-coordinator".into())
                .spawn(move || {
                    // Signals sent to the process are the application's (libzmq's threads block
                    // them too): if this thread took a Ctrl-C, its poll would swallow the EINTR
                    // and the application's own wait would never see it.
                    use nix::sys::signal::{SigSet, SigmaskHow, pthread_sigmask};
                    let _ = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&SigSet::all()), None);
                    let mut state = State::new(config, combiner, socket, wakeup, shared);
                    state.run();
                    let _ = done_tx.send(state.failed.is_none() && state.round > 1);
                    // Closing lingers to deliver what is queued (see `Coordinator::stop`).
                    drop(state);
                    drop(ctx);
                    let _ = done_tx.send(true);
                })
                .map_err(|e| {
                    TcpError::Config(format!("cannot start the coordinator thread: {e}"))
                })?
        };
        Ok(Coordinator {
            endpoint,
            shared,
            waker,
            thread: Some(thread),
            done,
        })
    }

    /// The address participants connect to, with the port actually bound.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Rounds completed so far.
    pub fn rounds(&self) -> u64 {
        self.shared.rounds.load(Ordering::Acquire)
    }

    /// Participants that have contributed to the round in progress (for progress displays).
    pub fn joined(&self) -> u64 {
        self.shared.joined.load(Ordering::Acquire)
    }

    /// Frames refused so far.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Acquire)
    }

    /// Why the rendezvous failed, once it has.
    pub fn failure(&self) -> Option<String> {
        lock(&self.shared.failure).clone()
    }

    /// Stops the coordinator (after delivering answers still queued) and reports what it did.
    pub fn finish(mut self) -> Report {
        self.stop();
        Report {
            rounds: self.rounds(),
            failure: self.failure(),
            dropped: self.dropped(),
            drop_log: lock(&self.shared.drop_log).clone(),
        }
    }

    fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            // MSG_NOSIGNAL: should the thread be gone (it panicked), a program that has not
            // ignored SIGPIPE (a C program using the C ABI) must not die of it. If the byte
            // cannot be written, the thread still sees the flag within IDLE.
            use nix::sys::socket::{MsgFlags, send};
            let _ = send(self.waker.as_raw_fd(), &[1], MsgFlags::MSG_NOSIGNAL);
            // Answers still queued must reach their participants: wait while the socket
            // lingers. After a failure, or before any answer, wait only NOTICE_GRACE for the
            // failure notices and leave the rest of the closing to the thread: libzmq can hold
            // it for the whole linger time over a participant that has gone (Ctrl-C in one
            // process of a library-mode job waited 30 s here).
            if self.done.recv() == Ok(false) {
                let _ = self.done.recv_timeout(NOTICE_GRACE);
            } else {
                // A panic in the coordinator thread has already been reported by the runtime;
                // there is nothing more to recover here.
                let _ = t.join();
            }
        }
    }
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `127.0.0.1 (pid 4242 #0)`: the sender's address (ZeroMQ gives the IP only) and the routing
/// id an atlasboost participant chooses, which tells processes of one host apart.
fn describe_peer(data: &mut zmq::Message, routing: &[u8]) -> String {
    let ip = data
        .gets("Peer-Address")
        .unwrap_or("unknown address")
        .to_string();
    match std::str::from_utf8(routing) {
        Ok(id) if id.starts_with("pid ") => format!("{ip} ({id})"),
        _ => ip,
    }
}

/// Refuses a job id the wire format cannot carry and a size limit over 4 GiB.
pub(crate) fn check_limits(job_id: &str, max_message: usize) -> Result<(), TcpError> {
    if job_id.len() > wire::MAX_JOB_ID {
        return Err(TcpError::Config(format!(
            "job id of {} bytes; at most {} fit in a frame",
            job_id.len(),
            wire::MAX_JOB_ID
        )));
    }
    if max_message > u32::MAX as usize {
        return Err(TcpError::Config(format!(
            "a size limit of {max_message} bytes; frames are limited to 4 GiB"
        )));
    }
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One participant's contribution to the current round.
struct Slot {
    routing: Vec<u8>,
    payload: Vec<u8>,
}

/// The coordinator thread's state.
struct State {
    config: CoordinatorConfig,
    combiner: Combiner,
    socket: zmq::Socket,
    /// Readable once the coordinator should stop.
    wakeup: UnixStream,
    shared: Arc<Shared>,
    round: u64,
    slots: Vec<Option<Slot>>,
    /// Who first used each index (routing id, description), for the whole job.
    owners: Vec<Option<(Vec<u8>, String)>>,
    arrived: usize,
    deadline: Option<Instant>,
    failed: Option<String>,
}

impl State {
    fn new(
        config: CoordinatorConfig,
        combiner: Combiner,
        socket: zmq::Socket,
        wakeup: UnixStream,
        shared: Arc<Shared>,
    ) -> Self {
        let world = config.world;
        let deadline = Some(Instant::now() + config.timeout);
        State {
            config,
            combiner,
            socket,
            wakeup,
            shared,
            round: 1,
            slots: (0..world).map(|_| None).collect(),
            owners: vec![None; world],
            arrived: 0,
            deadline,
            failed: None,
        }
    }

    fn run(&mut self) {
        while !self.shared.stop.load(Ordering::Acquire) {
            let wait = self.deadline.map_or(IDLE, |d| {
                d.saturating_duration_since(Instant::now()).min(IDLE)
            });
            let mut ready = [
                self.socket.as_poll_item(zmq::POLLIN),
                zmq::PollItem::from_fd(self.wakeup.as_raw_fd(), zmq::POLLIN),
            ];
            // Rounded up, so a deadline less than a millisecond away is not a busy loop. A
            // poll error (interrupted) just means: look again.
            let _ = zmq::poll(&mut ready, wait.as_nanos().div_ceil(1_000_000) as i64);
            // A bounded batch, so a flood of frames cannot starve the deadline and stop checks.
            for _ in 0..BATCH {
                let Some((routing, data)) = self.receive() else {
                    break;
                };
                self.handle(routing, data);
            }
            if self.failed.is_none() && self.deadline.is_some_and(|d| Instant::now() >= d) {
                self.time_out();
            }
        }
        if self.failed.is_none() && self.arrived > 0 {
            // Those waiting in this round would otherwise wait out their own timeouts.
            let why = format!(
                "the coordinator was stopped in round {} with {} of {} participants arrived",
                self.round, self.arrived, self.config.world
            );
            self.fail(why);
        }
    }

    /// The next `[routing id, data]` envelope, if one is waiting. Envelopes of another shape
    /// are consumed and logged.
    fn receive(&mut self) -> Option<(Vec<u8>, zmq::Message)> {
        loop {
            let routing = self.socket.recv_msg(zmq::DONTWAIT).ok()?;
            if !routing.get_more() {
                self.refuse("unknown", "envelope without data".into());
                continue;
            }
            let mut data = self.socket.recv_msg(zmq::DONTWAIT).ok()?;
            if data.get_more() {
                // A DEALER sends one frame per message; drain and refuse the rest.
                let peer = describe_peer(&mut data, &routing);
                while self
                    .socket
                    .recv_msg(zmq::DONTWAIT)
                    .is_ok_and(|m| m.get_more())
                {}
                self.refuse(&peer, "message of more than one frame".into());
                continue;
            }
            return Some((routing.to_vec(), data));
        }
    }

    fn refuse(&self, peer: &str, why: String) {
        self.shared.dropped.fetch_add(1, Ordering::AcqRel);
        let mut log = lock(&self.shared.drop_log);
        if log.len() < DROP_LOG_LEN {
            log.push(format!("{peer}: {why}"));
        }
    }

    fn handle(&mut self, routing: Vec<u8>, mut data: zmq::Message) {
        let peer = describe_peer(&mut data, &routing);
        let frame = match wire::decode(
            &self.config.secret,
            &self.config.job_id,
            self.config.max_message,
            &data,
        ) {
            Ok(f) => f,
            Err(why) => return self.refuse(&peer, why.to_string()),
        };
        if frame.kind == Kind::Abort
            && (frame.index as usize) < self.config.world
            && self.failed.is_none()
        {
            let why = format!(
                "participant {} at {peer} gave up in round {}: {}",
                self.name(frame.index as usize),
                frame.round,
                String::from_utf8_lossy(frame.payload)
            );
            return self.fail(why);
        }
        if frame.kind != Kind::Join {
            return self.refuse(&peer, format!("unexpected {:?} frame", frame.kind));
        }
        let (index, round) = (frame.index as usize, frame.round);
        let world = self.config.world;
        if let Some(why) = self.failed.clone() {
            return self.send_failure(&routing, frame.index, &why);
        }
        let clash = if index >= world {
            Some(format!(
                "participant at {peer} claims index {index}, outside this job's {world} participants (0..{})",
                world - 1
            ))
        } else if frame.world as usize != world {
            Some(format!(
                "participant {} at {peer} expects {} participants, the coordinator {world}",
                self.name(index),
                frame.world
            ))
        } else {
            match &self.owners[index] {
                // An index belongs to the first participant that used it, for the whole job.
                Some((owner, owner_peer)) if *owner != routing => Some(format!(
                    "two participants claim index {index}: {owner_peer} and {peer}"
                )),
                _ if round > self.round => Some(format!(
                    "participant {} at {peer} is in round {round}, the others in round {}",
                    self.name(index),
                    self.round
                )),
                _ => None,
            }
        };
        if let Some(why) = clash {
            // Record the failure before anyone hears of it, so `failure()` never lags.
            self.fail(why.clone());
            return self.send_failure(&routing, frame.index, &why);
        }
        // A participant sends its contribution again while it waits for the answer: a copy
        // of one taken already, or of a round answered since, is no stranger's.
        let own = |routing_of: &[u8]| *routing_of == routing[..];
        let repeat = match &self.slots[index] {
            Some(slot) => own(&slot.routing),
            None => round < self.round && self.owners[index].as_ref().is_some_and(|(o, _)| own(o)),
        };
        if repeat {
            return;
        }
        if round < self.round {
            return self.refuse(
                &peer,
                format!("stale frame of round {round} (now {})", self.round),
            );
        }
        if self.slots[index].is_some() {
            return self.refuse(&peer, format!("repeated frame of round {round}"));
        }
        if self.owners[index].is_none() {
            self.owners[index] = Some((routing.clone(), peer.clone()));
        }
        let payload = frame.payload.to_vec();
        self.slots[index] = Some(Slot { routing, payload });
        self.arrived += 1;
        self.shared
            .joined
            .store(self.arrived as u64, Ordering::Release);
        if self.arrived == 1 && self.round > 1 {
            self.deadline = Some(Instant::now() + self.config.timeout);
        }
        if self.arrived == world {
            self.complete();
        }
    }

    fn complete(&mut self) {
        let mut slots: Vec<Slot> = self.slots.iter_mut().filter_map(Option::take).collect();
        let payloads: Vec<Vec<u8>> = slots
            .iter_mut()
            .map(|s| std::mem::take(&mut s.payload))
            .collect();
        let replies = (self.combiner)(self.round, &payloads);
        // Every answer is one mixed answer: `Same` is all common, `Each` all own.
        let (common, own) = match replies {
            Ok(Replies::Same(bytes)) => (bytes, vec![None; slots.len()]),
            Ok(Replies::Each(each)) => (Vec::new(), each.into_iter().map(Some).collect()),
            Ok(Replies::Mixed { common, own }) => (common, own),
            Err(why) => {
                let why = format!("round {} cannot be answered: {why}", self.round);
                return self.fail_slots(&slots, why);
            }
        };
        if own.len() != slots.len() {
            let why = format!(
                "the coordinator computed {} answers for {} participants",
                own.len(),
                slots.len()
            );
            return self.fail_slots(&slots, why);
        }
        let needs_common = own.iter().any(Option::is_none);
        // An answer a participant would refuse as too large must fail the round for everyone,
        // before anyone is answered.
        let largest = own
            .iter()
            .flatten()
            .map(Vec::len)
            .chain(needs_common.then_some(common.len()))
            .max()
            .unwrap_or(0);
        if largest + 1024 > self.config.max_message {
            let why = format!(
                "round {} needs an answer of {largest} bytes, over the {}-byte limit",
                self.round, self.config.max_message
            );
            return self.fail_slots(&slots, why);
        }
        let shared = needs_common
            .then(|| SharedMessage::new(&self.encode(Kind::Result, BROADCAST, &common)))
            .transpose();
        let mut shared = match shared {
            Ok(shared) => shared,
            Err(e) => return self.fail_slots(&slots, format!("round {}: {e}", self.round)),
        };
        for (i, (s, answer)) in slots.iter().zip(&own).enumerate() {
            match answer {
                Some(bytes) => {
                    let frame = self.encode(Kind::Result, i as u32, bytes);
                    self.send(&s.routing, &frame);
                }
                // `shared` exists whenever an answer is `None`.
                None => {
                    if let Some(message) = shared.as_mut() {
                        message.send_to(&mut self.socket, &s.routing);
                    }
                }
            }
        }
        self.shared.rounds.store(self.round, Ordering::Release);
        self.round += 1;
        self.arrived = 0;
        self.shared.joined.store(0, Ordering::Release);
        self.deadline = None;
    }

    fn time_out(&mut self) {
        let missing: Vec<usize> = (0..self.config.world)
            .filter(|i| self.slots[*i].is_none())
            .collect();
        let shown: Vec<String> = missing.iter().take(16).map(|i| self.name(*i)).collect();
        let more = if missing.len() > shown.len() {
            format!(" and {} more", missing.len() - shown.len())
        } else {
            String::new()
        };
        let why = format!(
            "timed out after {:?} in round {} waiting for participant{} {}{more} ({} of {} arrived)",
            self.config.timeout,
            self.round,
            if missing.len() == 1 { "" } else { "s" },
            shown.join(", "),
            self.arrived,
            self.config.world
        );
        self.fail(why);
    }

    /// Fails the rendezvous: everyone in the current round is told why, and so is everyone who
    /// comes later.
    fn fail(&mut self, why: String) {
        let slots: Vec<Slot> = self.slots.iter_mut().filter_map(Option::take).collect();
        self.fail_slots(&slots, why);
    }

    fn fail_slots(&mut self, slots: &[Slot], why: String) {
        *lock(&self.shared.failure) = Some(why.clone());
        for s in slots {
            self.send_failure(&s.routing, BROADCAST, &why);
        }
        self.failed = Some(why);
        self.arrived = 0;
        self.shared.joined.store(0, Ordering::Release);
        self.deadline = None;
    }

    fn send_failure(&self, routing: &[u8], index: u32, why: &str) {
        let frame = self.encode(Kind::Failure, index, why.as_bytes());
        self.send(routing, &frame);
    }

    fn encode(&self, kind: Kind, index: u32, payload: &[u8]) -> Vec<u8> {
        wire::encode(
            &self.config.secret,
            &Frame {
                kind,
                round: self.round,
                index,
                world: self.config.world as u32,
                job_id: &self.config.job_id,
                payload,
            },
        )
    }

    fn send(&self, routing: &[u8], frame: &[u8]) {
        // A participant that went away cannot be answered; the others still are.
        if self.socket.send(routing, zmq::SNDMORE).is_ok() {
            let _ = self.socket.send(frame, 0);
        }
    }

    /// `3 (node-3)` when names were given, else `3`.
    fn name(&self, index: usize) -> String {
        match self.config.names.get(index) {
            Some(n) if !n.is_empty() => format!("{index} ({n})"),
            _ => index.to_string(),
        }
    }
}
