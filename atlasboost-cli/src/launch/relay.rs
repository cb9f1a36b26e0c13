//! The connection between the launcher of `atlasboost run --mpi` and the relay of each rank.
//!
//! mpirun starts `atlasboost relay -- COMMAND` as every rank; the relay runs the worker and
//! connects back to the launcher, where it speaks the [`channel`](super::channel) protocol of a
//! remote agent that has one worker: the worker's lines, its exit, heartbeats up; heartbeats
//! and signals down. Why not mpirun's own output forwarding: `--tag-output` tags each chunk it
//! reads, not each line, so a line written in pieces (Python's `print(a, b)` unbuffered) comes
//! out torn, and one thread in mpirun carries every byte; it does not say how each rank ended
//! either. The relays keep mpirun's job (placement, and killing the job when a rank dies) and
//! give `--mpi` the output, the summary and the speed of atlasboost's own launches.
//!
//! The launcher listens on TCP, for relays on other hosts, and on an abstract Unix socket
//! (named after the job, seen only in this host's network namespace), which the relays of this
//! host try first: the same bytes cost about half the CPU there. A relay that cannot reach the
//! Unix socket (another host, a container) uses TCP.
//!
//! A relay proves it belongs to the job before the launcher believes a byte of it: the
//! launcher sends each new TCP connection a random challenge, and the relay answers with one
//! frame of the rendezvous wire protocol ([`atlasboost_tcp::wire`]), signed with the job's
//! secret: index = its rank, world = the job's size, payload = the 32 bytes, its local rank (4
//! bytes, big-endian) and its host's name. The secret reaches the relays through mpirun's
//! environment (`-x NAME`), never on a command line. A connection that does not prove itself
//! within [`KNOCK_TIMEOUT`] is dropped and named.
//!
//! On the Unix socket the relay answers `LOCAL_CHALLENGE` at once, without waiting for one:
//! the challenge stops the replay of an introduction seen on the network, and the bytes of a
//! Unix socket cannot be seen but by a process that could read the secret itself (root, or a
//! debugger of the relay's user, which also reads its environment); a replay is refused
//! anyway once its rank is in. Waiting for the launcher to be scheduled to send a challenge
//! cost every rank's start a round trip (docs/PERFORMANCE.md).

use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};

use atlasboost_tcp::Secret;
use atlasboost_tcp::wire::{self, Frame, Kind};

use super::remote::Remote;

/// How long a new connection has to prove itself.
pub const KNOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// The challenge's length.
const CHALLENGE_LEN: usize = 32;

/// What a relay on the abstract Unix socket answers instead of a challenge (see the module's
/// docs).
const LOCAL_CHALLENGE: [u8; CHALLENGE_LEN] = *b"atlasboost-relay-on-unix-socket.";

/// The longest introduction: a frame with a host name.
const MAX_INTRODUCTION: usize = 4096;

/// How many connections may wait for their introduction beyond one per rank: a stranger
/// flooding the port fills these, not the launcher's descriptors.
const EXTRA_KNOCKS: usize = 32;

/// How many refusals are named one by one; after them only their number.
const NAMED_REFUSALS: u32 = 20;

/// How long the door stays shut after a failed `accept` (out of descriptors): the waiting
/// connection would keep the listener readable, and the supervisor spinning.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// The launcher's door: relays connect here.
#[derive(Debug)]
pub struct RelayDoor {
    /// `None` once closed: every rank's relay is in, or mpirun has ended.
    listener: Option<TcpListener>,
    address: SocketAddr,
    /// The abstract Unix socket for this host's relays (`None` once closed, or if it could
    /// not be made: they use TCP then).
    local: Option<UnixListener>,
    local_name: String,
    secret: Secret,
    job_id: String,
    size: u32,
    knocks: Vec<Knock>,
    admitted: Vec<bool>,
    refused: u32,
    paused_until: Option<Instant>,
}

/// A connection that has not proved itself yet.
#[derive(Debug)]
struct Knock {
    /// A TCP or Unix socket, read and written as a file (non-blocking).
    stream: File,
    /// Who it is, for messages.
    peer: String,
    challenge: [u8; CHALLENGE_LEN],
    got: Vec<u8>,
    since: Instant,
    /// It came through the Unix socket (a relay of this host).
    local: bool,
}

/// What happened at the door.
#[derive(Debug)]
pub enum DoorEvent {
    /// Rank `rank`'s relay, on `host`, proved itself: its session.
    Admitted {
        /// Its rank.
        rank: u32,
        /// Its index among the ranks of its host (the device `init()` takes).
        local_rank: u32,
        /// Its host, as it names itself.
        host: String,
        /// Its session.
        remote: Box<Remote>,
    },
    /// A connection was refused (a stranger, a second relay for one rank, a timeout): why.
    Refused(String),
}

impl RelayDoor {
    /// Listens on `ip` (a free port) for the relays of a job of `size` ranks.
    ///
    /// # Errors
    ///
    /// The address cannot be listened on.
    pub fn open(ip: IpAddr, size: u32, job_id: &str, secret: Secret) -> io::Result<RelayDoor> {
        let listener = TcpListener::bind((ip, 0))?;
        listener.set_nonblocking(true)?;
        // Unique to the job and this launcher: the job id, and the TCP port it holds.
        let address = listener.local_addr()?;
        let local_name = format!("atlasboost-relays-{job_id}-{}", address.port());
        let local = std::os::unix::net::SocketAddr::from_abstract_name(&local_name)
            .and_then(|a| UnixListener::bind_addr(&a))
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .ok();
        Ok(RelayDoor {
            address,
            local,
            local_name,
            listener: Some(listener),
            secret,
            job_id: job_id.to_string(),
            size,
            knocks: Vec::new(),
            admitted: vec![false; size as usize],
            refused: 0,
            paused_until: None,
        })
    }

    /// Where the relays connect over TCP.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The name of the abstract Unix socket this host's relays try first (`None` if there is
    /// none).
    pub fn local_name(&self) -> Option<&str> {
        self.local.as_ref().map(|_| self.local_name.as_str())
    }

    /// The listening sockets, while new connections are welcome: the door is open, has room
    /// for another waiting connection, and is not pausing after a failed `accept`.
    pub fn listeners(&self) -> Vec<BorrowedFd<'_>> {
        let paused = self.paused_until.is_some_and(|t| Instant::now() < t);
        let room = self.knocks.len() < self.size as usize + EXTRA_KNOCKS;
        if paused || !room {
            return Vec::new();
        }
        let tcp = self.listener.as_ref().map(AsFd::as_fd);
        tcp.into_iter()
            .chain(self.local.as_ref().map(AsFd::as_fd))
            .collect()
    }

    /// Each connection that has not proved itself, in the order [`RelayDoor::serve`] takes
    /// them.
    pub fn knocks(&self) -> impl Iterator<Item = BorrowedFd<'_>> {
        self.knocks.iter().map(|k| k.stream.as_fd())
    }

    /// How many connections wait for their introduction.
    pub fn knocking(&self) -> usize {
        self.knocks.len()
    }

    /// Takes no more connections (mpirun has ended: no relay is still to come).
    pub fn close(&mut self) {
        self.listener = None;
        self.local = None;
    }

    /// How many ranks' relays have been admitted.
    pub fn admitted(&self) -> usize {
        self.admitted.iter().filter(|a| **a).count()
    }

    /// Whether rank `rank`'s relay has been admitted.
    pub fn is_admitted(&self, rank: u32) -> bool {
        self.admitted.get(rank as usize).copied().unwrap_or(false)
    }

    /// Takes new connections (when the listener is `listening`), reads the connections at
    /// `readable` (indices into [`RelayDoor::knocks`]), drops those that took too long;
    /// returns what came of it. Once every rank's relay is in, the door closes.
    pub fn serve(&mut self, listening: bool, readable: &[usize]) -> Vec<DoorEvent> {
        let mut events = Vec::new();
        let mut finished: Vec<usize> = Vec::new();
        for &i in readable {
            if let Some(outcome) = self.knocks.get_mut(i).and_then(Knock::read) {
                finished.push(i);
                events.push(self.judge(i, outcome));
            }
        }
        for (i, k) in self.knocks.iter().enumerate() {
            if !finished.contains(&i) && k.since.elapsed() > KNOCK_TIMEOUT {
                finished.push(i);
                events.push(DoorEvent::Refused(format!(
                    "dropped a connection from {} to the relays' port: no introduction within \
                     {KNOCK_TIMEOUT:.0?}",
                    k.peer
                )));
            }
        }
        finished.sort_unstable();
        for i in finished.into_iter().rev() {
            self.knocks.swap_remove(i);
        }
        if listening {
            self.accept(&mut events);
        }
        if self.admitted() == self.size as usize {
            self.close();
        }
        self.name_refusals(events)
    }

    /// The refusals among `events`, named up to [`NAMED_REFUSALS`] in all, then counted once.
    fn name_refusals(&mut self, events: Vec<DoorEvent>) -> Vec<DoorEvent> {
        let mut kept = Vec::with_capacity(events.len());
        for e in events {
            if let DoorEvent::Refused(_) = e {
                self.refused += 1;
                if self.refused > NAMED_REFUSALS {
                    if self.refused == NAMED_REFUSALS + 1 {
                        kept.push(DoorEvent::Refused(
                            "further connections dropped at the relays' port are not named".into(),
                        ));
                    }
                    continue;
                }
            }
            kept.push(e);
        }
        kept
    }

    /// The next waiting connection, from this host's relays first: the socket, who it is, and
    /// whether it came through the Unix socket.
    fn next_connection(&self) -> io::Result<(OwnedFd, String, bool)> {
        if let Some(local) = &self.local {
            match local.accept() {
                Ok((s, _)) => return Ok((s.into(), "a process of this host".into(), true)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        match &self.listener {
            Some(tcp) => tcp.accept().map(|(s, peer)| {
                let _ = s.set_nodelay(true);
                (s.into(), peer.to_string(), false)
            }),
            None => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    fn accept(&mut self, events: &mut Vec<DoorEvent>) {
        while self.knocks.len() < self.size as usize + EXTRA_KNOCKS {
            let (socket, peer, local) = match self.next_connection() {
                Ok(c) => c,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // Nobody else is waiting.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    // Out of descriptors, say: the waiting connection stays, and so would the
                    // listener's readiness. Try again a little later.
                    self.paused_until = Some(Instant::now() + ACCEPT_PAUSE);
                    events.push(DoorEvent::Refused(format!(
                        "cannot accept a connection to the relays' port: {e}"
                    )));
                    return;
                }
            };
            // 128 random bits, as text (none on the Unix socket: see the module's docs).
            let random = match local {
                true => None,
                false => Some(Secret::random()),
            };
            let challenge = match random {
                None => LOCAL_CHALLENGE,
                Some(Ok(s)) => {
                    let mut c = [0u8; CHALLENGE_LEN];
                    c.copy_from_slice(&s.to_hex().as_bytes()[..CHALLENGE_LEN]);
                    c
                }
                Some(Err(e)) => {
                    events.push(DoorEvent::Refused(format!(
                        "cannot read random bytes for {peer}'s challenge: {e}"
                    )));
                    continue;
                }
            };
            // A fresh connection's buffer takes 32 bytes at once; one that does not is refused.
            let mut stream = File::from(socket);
            let sent = nix::fcntl::fcntl(
                &stream,
                nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
            )
            .map_err(io::Error::from)
            .and_then(|_| match local {
                true => Ok(CHALLENGE_LEN),
                false => stream.write(&challenge),
            });
            if !matches!(sent, Ok(CHALLENGE_LEN)) {
                events.push(DoorEvent::Refused(format!(
                    "cannot send {peer} its challenge"
                )));
                continue;
            }
            self.knocks.push(Knock {
                stream,
                peer,
                challenge,
                got: Vec::new(),
                since: Instant::now(),
                local,
            });
        }
    }

    /// Admits or refuses the knock at `i`, which has read its introduction (or failed to).
    fn judge(&mut self, i: usize, outcome: Result<Vec<u8>, String>) -> DoorEvent {
        let k = &self.knocks[i];
        let refused = |why: String| {
            DoorEvent::Refused(format!(
                "dropped a connection from {} to the relays' port: {why}",
                k.peer
            ))
        };
        let bytes = match outcome {
            Ok(b) => b,
            Err(why) => return refused(why),
        };
        let Some(frame_len) = bytes
            .get(..4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
        else {
            return refused("introduction cut short".into());
        };
        let frame = match wire::decode(
            &self.secret,
            &self.job_id,
            MAX_INTRODUCTION,
            &bytes[4..4 + frame_len],
        ) {
            Ok(f) => f,
            Err(why) => return refused(format!("refused: {why}")),
        };
        let (local_rank, host) = match check_introduction(&frame, &k.challenge, self.size) {
            Ok(who) => who,
            Err(why) => return refused(why),
        };
        let rank = frame.index;
        if self.admitted[rank as usize] {
            return refused(format!("rank {rank} already has a relay"));
        }
        let already = &bytes[4 + frame_len..];
        let stream = match k.stream.try_clone() {
            Ok(s) => OwnedFd::from(s),
            Err(e) => return refused(format!("cannot keep the connection: {e}")),
        };
        match Remote::relay(stream, &host, rank, k.local, already) {
            Ok(remote) => {
                self.admitted[rank as usize] = true;
                DoorEvent::Admitted {
                    rank,
                    local_rank,
                    host,
                    remote: Box::new(remote),
                }
            }
            Err(why) => refused(format!("rank {rank}: {why}")),
        }
    }
}

impl Knock {
    /// Reads what came; the introduction and anything after it once it is whole, an error for
    /// a connection that ended or sent too much, `None` while it is incomplete.
    fn read(&mut self) -> Option<Result<Vec<u8>, String>> {
        let mut buf = [0u8; 4096];
        let mut ended = false;
        loop {
            match self.stream.read(&mut buf) {
                // A relay whose worker was quick may have said everything and gone: what it
                // sent still counts.
                Ok(0) => {
                    ended = true;
                    break;
                }
                Ok(n) => self.got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Some(Err(format!("cannot read it: {e}"))),
            }
            if self.got.len() > 4 * MAX_INTRODUCTION {
                break;
            }
        }
        let len = self
            .got
            .get(..4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize);
        match len {
            Some(len) if len > MAX_INTRODUCTION => Some(Err(format!(
                "an introduction of {len} bytes, more than {MAX_INTRODUCTION}"
            ))),
            Some(len) if self.got.len() >= 4 + len => Some(Ok(std::mem::take(&mut self.got))),
            _ if ended => Some(Err("closed before it introduced itself".into())),
            _ => None,
        }
    }
}

/// The local rank and host an authentic introduction names, or what is wrong with it.
fn check_introduction(
    frame: &Frame<'_>,
    challenge: &[u8; CHALLENGE_LEN],
    size: u32,
) -> Result<(u32, String), String> {
    if frame.kind != Kind::Join || frame.round != 1 {
        return Err(format!(
            "an introduction of kind {:?}, round {}",
            frame.kind, frame.round
        ));
    }
    if frame.world != size || frame.index >= size {
        return Err(format!(
            "rank {} of {} ranks, but this job has {size}",
            frame.index, frame.world
        ));
    }
    let Some(rest) = frame.payload.strip_prefix(challenge.as_slice()) else {
        return Err("it answers another challenge (a replay?)".into());
    };
    let Some((local, host)) = rest.split_first_chunk::<4>() else {
        return Err("its introduction has no local rank".into());
    };
    let local_rank = u32::from_be_bytes(*local);
    if local_rank >= size {
        return Err(format!("local rank {local_rank} of a job of {size} ranks"));
    }
    match std::str::from_utf8(host) {
        Ok(h) if !h.is_empty() && h.len() <= 255 => Ok((local_rank, h.to_string())),
        _ => Err("its host name is empty, too long or not UTF-8".into()),
    }
}

/// Who a relay is.
#[derive(Debug, Clone)]
pub struct Introduction<'a> {
    /// The job's id.
    pub job_id: &'a str,
    /// The job's secret.
    pub secret: &'a Secret,
    /// The relay's rank.
    pub rank: u32,
    /// The job's size.
    pub size: u32,
    /// Its index among its host's ranks.
    pub local_rank: u32,
    /// Its host's name.
    pub host: &'a str,
}

/// The relay's side: connects to the launcher, on the abstract Unix socket `local` when it is
/// given and this host has it, else at `address` (`host:port`) over TCP, and proves it belongs
/// to the job, waiting at most `timeout` for each step; `then` (the channel's greeting) goes in
/// the same write, which wakes the launcher once.
///
/// # Errors
///
/// What failed, naming the address.
pub fn introduce(
    address: &str,
    local: Option<&str>,
    who: &Introduction<'_>,
    timeout: Duration,
    then: &[u8],
) -> Result<Introduced, String> {
    let fail = |what: &str, e: io::Error| format!("{what} the launcher at {address}: {e}");
    let near = local.and_then(|name| {
        let a = std::os::unix::net::SocketAddr::from_abstract_name(name).ok()?;
        UnixStream::connect_addr(&a).ok()
    });
    let local = near.is_some();
    let connection: OwnedFd = match near {
        Some(s) => s.into(),
        None => {
            let target = address
                .to_socket_addrs()
                .map_err(|e| fail("cannot resolve", e))?
                .next()
                .ok_or_else(|| format!("{address} resolves to no address"))?;
            let s = TcpStream::connect_timeout(&target, timeout)
                .map_err(|e| fail("cannot connect to", e))?;
            let _ = s.set_nodelay(true);
            s.into()
        }
    };
    let mut stream = File::from(connection);
    set_timeouts(&stream, timeout).map_err(|e| fail("cannot set timeouts for", e))?;
    let mut challenge = LOCAL_CHALLENGE;
    if !local {
        stream
            .read_exact(&mut challenge)
            .map_err(|e| fail("no challenge from", e))?;
    }
    let mut bytes = introduction(&challenge, who);
    bytes.extend_from_slice(then);
    stream
        .write_all(&bytes)
        .map_err(|e| fail("cannot introduce itself to", e))?;
    // Zero: no timeout, from now on.
    set_timeouts(&stream, Duration::ZERO).map_err(|e| fail("cannot clear the timeouts of", e))?;
    Ok(Introduced {
        connection: stream.into(),
        local,
    })
}

/// A relay's connection to its launcher, as [`introduce`] made it.
#[derive(Debug)]
pub struct Introduced {
    /// The connection.
    pub connection: OwnedFd,
    /// It goes through the launcher's Unix socket (on this host), not over TCP.
    pub local: bool,
}

/// A socket's receive and send timeouts (of either kind: TCP or Unix); zero is none.
fn set_timeouts(socket: &impl AsFd, timeout: Duration) -> io::Result<()> {
    use nix::sys::socket::{setsockopt, sockopt};
    let t = nix::sys::time::TimeVal::new(
        timeout.as_secs().try_into().unwrap_or(i64::MAX),
        timeout.subsec_micros().into(),
    );
    setsockopt(socket, sockopt::ReceiveTimeout, &t)?;
    setsockopt(socket, sockopt::SendTimeout, &t)?;
    Ok(())
}

/// The answer to `challenge`: the signed frame, after its length.
fn introduction(challenge: &[u8; CHALLENGE_LEN], who: &Introduction<'_>) -> Vec<u8> {
    let mut payload = challenge.to_vec();
    payload.extend_from_slice(&who.local_rank.to_be_bytes());
    payload.extend_from_slice(who.host.as_bytes());
    let frame = wire::encode(
        who.secret,
        &Frame {
            kind: Kind::Join,
            round: 1,
            index: who.rank,
            world: who.size,
            job_id: who.job_id,
            payload: &payload,
        },
    );
    let mut message = (frame.len() as u32).to_be_bytes().to_vec();
    message.extend_from_slice(&frame);
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    fn door(size: u32) -> (RelayDoor, Secret) {
        let secret = Secret::from_bytes([7; 32]);
        let door = RelayDoor::open(
            IpAddr::from([127, 0, 0, 1]),
            size,
            "ab-test",
            secret.clone(),
        )
        .unwrap();
        (door, secret)
    }

    /// Serves the door until `n` events came (bounded).
    fn events(door: &mut RelayDoor, n: usize) -> Vec<DoorEvent> {
        let mut got = Vec::new();
        let until = Instant::now() + Duration::from_secs(10);
        while got.len() < n && Instant::now() < until {
            let readable: Vec<usize> = (0..door.knocks.len()).collect();
            got.extend(door.serve(true, &readable));
            std::thread::sleep(Duration::from_millis(5));
        }
        got
    }

    /// Rank `rank` of `size` on host node7.
    fn rank_of<'a>(secret: &'a Secret, rank: u32, size: u32, job_id: &'a str) -> Introduction<'a> {
        Introduction {
            job_id,
            secret,
            rank,
            size,
            local_rank: 0,
            host: "node7",
        }
    }

    fn introduce_in_thread(
        address: String,
        secret: Secret,
        rank: u32,
        size: u32,
        job_id: &'static str,
    ) -> std::thread::JoinHandle<Result<OwnedFd, String>> {
        std::thread::spawn(move || {
            introduce(
                &address,
                None,
                &rank_of(&secret, rank, size, job_id),
                Duration::from_secs(5),
                &[],
            )
            .map(|i| i.connection)
        })
    }

    #[test]
    fn a_relay_with_the_secret_is_admitted_once_per_rank() {
        let (mut door, secret) = door(4);
        let address = door.address().to_string();
        let first = introduce_in_thread(address.clone(), secret.clone(), 2, 4, "ab-test");
        let got = events(&mut door, 1);
        assert!(first.join().unwrap().is_ok());
        match &got[..] {
            [
                DoorEvent::Admitted {
                    rank: 2,
                    host,
                    remote,
                    ..
                },
            ] => {
                assert_eq!(host, "node7");
                assert!(!remote.is_local_relay(), "it came over TCP");
            }
            other => panic!("expected rank 2 admitted, got {other:?}"),
        }
        assert!(door.is_admitted(2) && !door.is_admitted(1));
        let second = introduce_in_thread(address, secret, 2, 4, "ab-test");
        let got = events(&mut door, 1);
        let _ = second.join();
        match &got[..] {
            [DoorEvent::Refused(why)] => {
                assert!(why.contains("rank 2 already has a relay"), "{why}")
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert_eq!(door.admitted(), 1);
    }

    #[test]
    fn strangers_are_refused_with_the_reason() {
        let (mut door, _) = door(4);
        let address = door.address().to_string();
        for (secret, rank, size, job, expect) in [
            (
                Secret::from_bytes([8; 32]),
                0,
                4,
                "ab-test",
                "authentication",
            ),
            (Secret::from_bytes([7; 32]), 0, 4, "ab-other", "another job"),
            (
                Secret::from_bytes([7; 32]),
                4,
                8,
                "ab-test",
                "rank 4 of 8 ranks, but this job has 4",
            ),
        ] {
            let relay = introduce_in_thread(address.clone(), secret, rank, size, job);
            let got = events(&mut door, 1);
            let _ = relay.join();
            match &got[..] {
                [DoorEvent::Refused(why)] => assert!(why.contains(expect), "{why} lacks {expect}"),
                other => panic!("expected a refusal ({expect}), got {other:?}"),
            }
        }
        // Not even the protocol: a length far over the limit.
        let mut garbage = TcpStream::connect(&address).unwrap();
        garbage.write_all(&[0xff; 64]).unwrap();
        let got = events(&mut door, 1);
        match &got[..] {
            [DoorEvent::Refused(why)] => assert!(why.contains("more than 4096"), "{why}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert_eq!(door.admitted(), 0);
    }

    #[test]
    fn a_relay_of_this_host_comes_through_the_unix_socket() {
        let (mut door, secret) = door(1);
        let local = door.local_name().map(str::to_string);
        assert!(local.is_some(), "this host has abstract Unix sockets");
        // The TCP address is unusable: only the Unix socket can have carried it.
        let relay = std::thread::spawn(move || {
            let who = rank_of(&secret, 0, 1, "ab-test");
            introduce(
                "127.0.0.1:1",
                local.as_deref(),
                &who,
                Duration::from_secs(5),
                &[],
            )
        });
        let got = events(&mut door, 1);
        assert!(
            relay.join().unwrap().is_ok_and(|i| i.local),
            "both ends know"
        );
        assert!(
            matches!(&got[..], [DoorEvent::Admitted { rank: 0, remote, .. }] if remote.is_local_relay()),
            "{got:?}"
        );
    }

    /// On the Unix socket the relay does not wait for a challenge (none is sent), and an
    /// introduction answering a TCP connection's challenge is refused there.
    #[test]
    fn the_unix_socket_sends_no_challenge_and_takes_only_the_local_answer() {
        use std::os::unix::net::SocketAddr as UnixAddr;

        let (mut door, secret) = door(2);
        let name = door.local_name().unwrap().to_string();
        let connect =
            || UnixStream::connect_addr(&UnixAddr::from_abstract_name(&name).unwrap()).unwrap();
        let mut quiet = connect();
        door.serve(true, &[]);
        assert_eq!(door.knocking(), 1);
        quiet
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut byte = [0u8; 1];
        let heard = quiet.read(&mut byte);
        assert!(
            heard.as_ref().is_err_and(|e| matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            )),
            "the launcher sent something on the Unix socket: {heard:?}"
        );
        // A TCP challenge's answer, sent on the Unix socket: refused as a replay.
        let mut replayed = connect();
        let who = rank_of(&secret, 1, 2, "ab-test");
        replayed
            .write_all(&introduction(&[b'0'; CHALLENGE_LEN], &who))
            .unwrap();
        let got = events(&mut door, 1);
        match &got[..] {
            [DoorEvent::Refused(why)] => assert!(why.contains("another challenge"), "{why}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert_eq!(door.admitted(), 0);
        drop(quiet);
    }

    #[test]
    fn the_door_closes_once_every_rank_is_in() {
        let (mut door, secret) = door(1);
        let address = door.address().to_string();
        let relay = introduce_in_thread(address.clone(), secret, 0, 1, "ab-test");
        let got = events(&mut door, 1);
        assert!(relay.join().unwrap().is_ok());
        assert!(
            matches!(&got[..], [DoorEvent::Admitted { rank: 0, .. }]),
            "{got:?}"
        );
        assert!(door.listeners().is_empty(), "nobody else is to come");
        // The port itself is closed: the kernel refuses a late connection.
        assert!(TcpStream::connect(&address).is_err());
    }

    #[test]
    fn a_flood_of_silent_connections_fills_the_waiting_room_not_the_launcher() {
        let (mut door, _) = door(2);
        let address = door.address().to_string();
        let flood: Vec<TcpStream> = (0..60)
            .map(|_| TcpStream::connect(&address).unwrap())
            .collect();
        let until = Instant::now() + Duration::from_secs(5);
        while door.knocking() < 2 + EXTRA_KNOCKS && Instant::now() < until {
            door.serve(!door.listeners().is_empty(), &[]);
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(door.knocking(), 2 + EXTRA_KNOCKS);
        // Full: the listeners are not polled (the rest wait in the kernel's queue).
        assert!(door.listeners().is_empty());
        door.serve(true, &[]);
        assert_eq!(door.knocking(), 2 + EXTRA_KNOCKS);
        drop(flood);
    }

    #[test]
    fn refusals_are_named_up_to_a_limit_then_counted_once() {
        let (mut door, _) = door(1);
        let refusal = || DoorEvent::Refused("dropped a connection".into());
        let named = door.name_refusals((0..25).map(|_| refusal()).collect());
        assert_eq!(named.len(), NAMED_REFUSALS as usize + 1);
        assert!(matches!(named.last(), Some(DoorEvent::Refused(m)) if m.contains("not named")));
        assert!(door.name_refusals(vec![refusal()]).is_empty());
    }

    #[test]
    fn what_the_relay_sends_with_its_introduction_is_kept() {
        use super::super::channel::{self, Up};

        let (mut door, secret) = door(1);
        let address = door.address().to_string();
        // The introduction and the first frames in one write: one read takes them all.
        let relay = std::thread::spawn(move || {
            let mut stream = TcpStream::connect(&address).unwrap();
            let mut challenge = [0u8; CHALLENGE_LEN];
            stream.read_exact(&mut challenge).unwrap();
            let who = rank_of(&secret, 0, 1, "ab-test");
            let mut bytes = introduction(&challenge, &who);
            bytes.extend_from_slice(channel::HELLO);
            channel::encode(&Up::Done, &mut bytes);
            stream.write_all(&bytes).unwrap();
            stream
        });
        let got = events(&mut door, 1);
        let _stream = relay.join().unwrap();
        match &got[..] {
            [DoorEvent::Admitted { remote, .. }] => {
                assert_eq!(remote.backlog, vec![Up::Done]);
                assert_eq!(remote.relay_rank(), Some(0));
            }
            other => panic!("expected an admission, got {other:?}"),
        }
    }
}
