//! A participant: a DEALER socket connected to the coordinator, implementing `Rendezvous`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use atlasboost_core::{Error, Rendezvous};

use crate::wire::{self, Frame, Kind, Secret};
use crate::{BROADCAST, DEFAULT_MAX_MESSAGE, TcpError, is_ipv6_endpoint, zmq_err};

/// How long a participant waits for an answer before it sends its contribution again.
const RESEND_AFTER: Duration = Duration::from_secs(2);

/// How to join a rendezvous.
#[derive(Debug, Clone)]
pub struct ParticipantConfig {
    /// The coordinator's address, e.g. `tcp://10.0.0.1:29400`.
    pub endpoint: String,
    /// This participant's index, `0..world`.
    pub index: usize,
    /// How many participants take part.
    pub world: usize,
    /// The job's id.
    pub job_id: String,
    /// The job's secret.
    pub secret: Secret,
    /// How long to wait for the coordinator's answer in each round. Give participants a little
    /// longer than the coordinator, so its message naming who is missing arrives first.
    pub timeout: Duration,
    /// The largest answer accepted, in bytes.
    pub max_message: usize,
}

impl ParticipantConfig {
    /// A configuration with the default size limit.
    pub fn new(
        endpoint: impl Into<String>,
        index: usize,
        world: usize,
        job_id: impl Into<String>,
        secret: Secret,
        timeout: Duration,
    ) -> Self {
        ParticipantConfig {
            endpoint: endpoint.into(),
            index,
            world,
            job_id: job_id.into(),
            secret,
            timeout,
            max_message: DEFAULT_MAX_MESSAGE,
        }
    }
}

/// One participant of a ZeroMQ rendezvous.
pub struct ZmqRendezvous {
    config: ParticipantConfig,
    // The socket must close before its context: fields drop in declaration order.
    socket: zmq::Socket,
    _ctx: zmq::Context,
    /// The round of the last contribution sent (0 before the first).
    round: u64,
    /// That contribution's frame and when it was last sent: sent again while no answer comes,
    /// since a coordinator that ended on the same endpoint (the previous start of the job) may
    /// have taken it and closed.
    join: Option<(Vec<u8>, Instant)>,
    /// Frames ignored because they did not authenticate or did not belong here.
    ignored: u64,
}

impl std::fmt::Debug for ZmqRendezvous {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZmqRendezvous")
            .field("endpoint", &self.config.endpoint)
            .field("index", &self.config.index)
            .field("world", &self.config.world)
            .field("round", &self.round)
            .finish_non_exhaustive()
    }
}

impl ZmqRendezvous {
    /// Connects to the coordinator (in a context of its own). Connecting does not wait: the
    /// coordinator may start later, within the first round's timeout.
    ///
    /// # Errors
    ///
    /// [`TcpError::Config`] for an index outside the world, [`TcpError::Zmq`] for a malformed
    /// endpoint.
    pub fn connect(config: ParticipantConfig) -> Result<ZmqRendezvous, TcpError> {
        ZmqRendezvous::connect_in(&zmq::Context::new(), config)
    }

    /// Connects within an existing context (many participants in one process share one; a
    /// context holds at most 1,023 sockets).
    ///
    /// # Errors
    ///
    /// As [`ZmqRendezvous::connect`].
    pub fn connect_in(
        ctx: &zmq::Context,
        config: ParticipantConfig,
    ) -> Result<ZmqRendezvous, TcpError> {
        crate::coordinator::check_limits(&config.job_id, config.max_message)?;
        if config.world == 0 || config.index >= config.world || config.world > u32::MAX as usize {
            return Err(TcpError::Config(format!(
                "participant index {} is outside a world of {}",
                config.index, config.world
            )));
        }
        let socket = ctx
            .socket(zmq::DEALER)
            .map_err(zmq_err("create a DEALER socket"))?;
        socket
            .set_linger(0)
            .map_err(zmq_err("set the linger time"))?;
        // A routing id that names this process lets the coordinator tell apart two
        // participants of one host (it sees only their IP address); the random part keeps two
        // hosts with the same pid (pid 1 in every container) apart, and a stranger from
        // taking a participant's id first.
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let id = format!(
            "pid {} #{} {:016x}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed),
            random_u64()
        );
        socket
            .set_identity(id.as_bytes())
            .map_err(zmq_err("set the routing id"))?;
        socket
            .set_maxmsgsize(config.max_message as i64)
            .map_err(zmq_err("set the message size limit"))?;
        // An IPv6 coordinator (`tcp://[::1]:PORT`) is reachable only with IPv6 on.
        if is_ipv6_endpoint(&config.endpoint) {
            socket.set_ipv6(true).map_err(zmq_err("allow IPv6"))?;
        }
        socket
            .connect(&config.endpoint)
            .map_err(zmq_err(&format!("connect to {}", config.endpoint)))?;
        Ok(ZmqRendezvous {
            config,
            socket,
            _ctx: ctx.clone(),
            round: 0,
            ignored: 0,
            join: None,
        })
    }

    /// Frames ignored so far (not authentic, or not for this participant and round).
    pub fn ignored(&self) -> u64 {
        self.ignored
    }

    /// Sends this participant's contribution to the next round. With
    /// [`receive_answer`](Self::receive_answer), this lets one thread drive many participants.
    ///
    /// # Errors
    ///
    /// [`TcpError::Zmq`] if the frame cannot be queued.
    pub fn send_contribution(&mut self, payload: &[u8]) -> Result<(), TcpError> {
        self.round += 1;
        let frame = self.frame(Kind::Join, payload);
        self.socket
            .send(&frame, 0)
            .map_err(zmq_err("send a contribution"))?;
        self.join = Some((frame, Instant::now()));
        Ok(())
    }

    /// Waits for the coordinator's answer to the round last contributed to.
    ///
    /// # Errors
    ///
    /// [`TcpError::Failed`] with the coordinator's reason (who was missing, who clashed),
    /// [`TcpError::NoAnswer`] when nothing came within the timeout.
    pub fn receive_answer(&mut self) -> Result<Vec<u8>, TcpError> {
        let deadline = Instant::now() + self.config.timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.abort(&format!("no answer within {:?}", self.config.timeout));
                return Err(TcpError::NoAnswer {
                    endpoint: self.config.endpoint.clone(),
                    round: self.round,
                    after: self.config.timeout,
                });
            }
            let resend_in = self.join.as_ref().map_or(left, |(_, at)| {
                RESEND_AFTER.saturating_sub(at.elapsed()).min(left)
            });
            let mut polled = Ok(0);
            crate::waiting::blocking(&mut || {
                polled = self
                    .socket
                    .poll(zmq::POLLIN, resend_in.as_millis().max(1) as i64);
            });
            let ready = match polled {
                Ok(n) => n,
                // A signal's handler ran: the wait goes on unless the program asks to stop.
                Err(zmq::Error::EINTR) if !crate::waiting::stop_after_interrupt() => continue,
                Err(e) => {
                    // Given up (a signal, most likely): the others are told at once, rather
                    // than wait for this participant until their timeout.
                    self.abort(&format!("it stopped waiting: {e}"));
                    return Err(zmq_err("wait for the coordinator")(e));
                }
            };
            if ready == 0 && crate::waiting::stop_after_timeout() {
                // A signal that came between two waits, which no EINTR told of.
                self.abort("it stopped waiting: interrupted by a signal");
                return Err(zmq_err("wait for the coordinator")(zmq::Error::EINTR));
            }
            if ready == 0 {
                // No answer yet: the contribution again (the coordinator takes one copy).
                if let Some((frame, at)) = &mut self.join
                    && at.elapsed() >= RESEND_AFTER
                {
                    let _ = self.socket.send(&*frame, zmq::DONTWAIT);
                    *at = Instant::now();
                }
                continue;
            }
            let msg = self
                .socket
                .recv_msg(0)
                .map_err(zmq_err("receive the coordinator's answer"))?;
            let frame = match wire::decode(
                &self.config.secret,
                &self.config.job_id,
                self.config.max_message,
                &msg,
            ) {
                Ok(f) => f,
                Err(_) => {
                    self.ignored += 1;
                    continue;
                }
            };
            let mine = frame.index == BROADCAST || frame.index as usize == self.config.index;
            match frame.kind {
                Kind::Failure if mine => {
                    return Err(TcpError::Failed(
                        String::from_utf8_lossy(frame.payload).into_owned(),
                    ));
                }
                Kind::Result if mine && frame.round == self.round => {
                    return Ok(frame.payload.to_vec());
                }
                _ => self.ignored += 1,
            }
        }
    }

    /// Tells the coordinator this participant gives up on the round, so that it fails the
    /// round for everyone rather than let the others succeed without it. Best effort: the
    /// coordinator may be the one that is gone.
    fn abort(&self, why: &str) {
        let _ = self
            .socket
            .send(self.frame(Kind::Abort, why.as_bytes()), zmq::DONTWAIT);
    }

    /// This participant's signed frame of `kind` for the current round.
    fn frame(&self, kind: Kind, payload: &[u8]) -> Vec<u8> {
        wire::encode(
            &self.config.secret,
            &Frame {
                kind,
                round: self.round,
                index: self.config.index as u32,
                world: self.config.world as u32,
                job_id: &self.config.job_id,
                payload,
            },
        )
    }

    /// Sends `payload` and returns the coordinator's answer for this participant.
    ///
    /// # Errors
    ///
    /// As [`send_contribution`](Self::send_contribution) and
    /// [`receive_answer`](Self::receive_answer).
    pub fn exchange(&mut self, payload: &[u8]) -> Result<Vec<u8>, TcpError> {
        self.send_contribution(payload)?;
        self.receive_answer()
    }
}

impl Rendezvous for ZmqRendezvous {
    fn index(&self) -> usize {
        self.config.index
    }

    fn size(&self) -> usize {
        self.config.world
    }

    fn all_gather(&mut self, payload: &[u8]) -> atlasboost_core::Result<Vec<Vec<u8>>> {
        let answer = self.exchange(payload).map_err(Error::from)?;
        let list = wire::unpack_list(&answer)
            .filter(|l| l.len() == self.config.world)
            .ok_or(TcpError::BadAnswer { round: self.round })?;
        Ok(list)
    }

    fn barrier(&mut self) -> atlasboost_core::Result<()> {
        self.exchange(&[]).map(drop).map_err(Error::from)
    }
}

/// 64 random bits for the routing id: read once per process (from the random source, or the
/// clock if it cannot be read), then stepped by a large odd constant, so thousands of
/// participants in one process cost one read.
fn random_u64() -> u64 {
    use std::io::Read;
    use std::sync::OnceLock;
    static SEED: OnceLock<u64> = OnceLock::new();
    static STEP: AtomicU64 = AtomicU64::new(0);
    let seed = *SEED.get_or_init(|| {
        let mut bytes = [0u8; 8];
        match std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes)) {
            Ok(()) => u64::from_le_bytes(bytes),
            Err(_) => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
        }
    });
    seed.wrapping_add(
        STEP.fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15),
    )
}
