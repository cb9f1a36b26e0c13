//! Shared inputs for atlasboost's benchmarks (`cargo bench -p atlasboost-benches`).
#![deny(missing_docs)]

use std::net::{IpAddr, Ipv4Addr};

use atlasboost_core::{Device, Health};

/// `hosts` hosts with `per_host` healthy 910 devices each, distinct IPs, in a scrambled order
/// (as a gather could deliver them).
pub fn cluster(hosts: u32, per_host: u32) -> Vec<Device> {
    let mut devices = Vec::with_capacity((hosts * per_host) as usize);
    for i in 0..hosts {
        // A multiplicative scramble so input order is not sorted order.
        let h = (i.wrapping_mul(2_654_435_761)) % hosts;
        for p in 0..per_host {
            devices.push(Device {
                server_id: format!("10.{}.{}.1", h / 256, h % 256),
                logical_id: p,
                physical_id: p,
                ip: Some(IpAddr::V4(Ipv4Addr::from((29 << 24) | (h << 8) | p))),
                chip: "910".into(),
                health: Health::Healthy,
                super_device_id: None,
                super_pod_id: None,
            });
        }
    }
    devices
}

/// What each participant of a benchmarked rendezvous gets back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Every host's devices (an all-gather): what a launch's host agents need to write the
    /// whole table. O(N²) bytes in all.
    Everything,
    /// Only its own entry of the table the coordinator builds (library mode, where one process
    /// per host writes the table and the others need only their assignment). O(N) bytes.
    OwnEntry,
}

/// The payload each of `hosts` hosts sends: its 8 devices as a [`HostReport`] in JSON, exactly
/// what `gather_cluster_table` sends.
///
/// [`HostReport`]: atlasboost_core::exchange::HostReport
pub fn host_payloads(hosts: u32) -> Vec<Vec<u8>> {
    let devices = cluster(hosts, 8);
    devices
        .chunks(8)
        .map(|d| {
            serde_json::to_vec(&atlasboost_core::exchange::HostReport::Devices(d.to_vec()))
                .unwrap_or_default()
        })
        .collect()
}

/// The benchmarks' job id, shared by the coordinator and its participants.
const JOB: &str = "bench";
/// How long a benchmarked rendezvous may take: only a bound for bugs.
const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// The benchmarks' job secret.
fn secret() -> atlasboost_tcp::Secret {
    atlasboost_tcp::Secret::from_bytes([7; 32])
}

/// A coordinator on loopback (any free port) for `world` hosts, answering as `answer` says.
fn start_coordinator(world: usize, answer: Answer) -> Result<atlasboost_tcp::Coordinator, String> {
    use atlasboost_core::exchange::HostReport;
    use atlasboost_core::ranktable::{BuildOptions, RankTable, build_table};
    use atlasboost_tcp::{Coordinator, CoordinatorConfig, Replies};

    let config = CoordinatorConfig::new("tcp://127.0.0.1:0", world, JOB, secret(), TIMEOUT);
    match answer {
        Answer::Everything => Coordinator::start(config),
        Answer::OwnEntry => Coordinator::start_with(
            config,
            Box::new(|_, payloads| {
                // Parse every host's report once, build the table, answer each host with its
                // own server entry.
                let mut hosts = Vec::with_capacity(payloads.len());
                let mut devices = Vec::new();
                for p in payloads {
                    match serde_json::from_slice(p) {
                        Ok(HostReport::Devices(d)) => {
                            hosts.push(d.first().map(|d| d.server_id.clone()).unwrap_or_default());
                            devices.extend(d);
                        }
                        _ => return Err("a payload is not a host report".into()),
                    }
                }
                let table =
                    build_table(&devices, &BuildOptions::default()).map_err(|e| e.to_string())?;
                let RankTable::Cluster(t) = table else {
                    return Err("format 1.0 expected".into());
                };
                let mut entries: std::collections::HashMap<&str, Vec<u8>> = t
                    .server_list
                    .iter()
                    .map(|s| {
                        (
                            s.server_id.as_str(),
                            serde_json::to_vec(s).unwrap_or_default(),
                        )
                    })
                    .collect();
                let each = hosts
                    .iter()
                    .map(|h| entries.remove(h.as_str()).unwrap_or_default())
                    .collect();
                Ok(Replies::Each(each))
            }),
        ),
    }
    .map_err(|e| e.to_string())
}

/// One complete rendezvous on loopback: a coordinator, one participant per payload (driven
/// from this thread), one round. Returns the bytes the participants received in all.
///
/// # Errors
///
/// Any failure of the rendezvous, as text.
pub fn run_rendezvous(payloads: &[Vec<u8>], answer: Answer) -> Result<usize, String> {
    use atlasboost_tcp::{ParticipantConfig, ZmqRendezvous};

    let world = payloads.len();
    let (secret, timeout) = (secret(), TIMEOUT);
    let coordinator = start_coordinator(world, answer)?;
    let endpoint = coordinator.endpoint().to_string();
    // A ZeroMQ context holds at most 1,023 sockets.
    let contexts: Vec<atlasboost_tcp::Context> = (0..world.div_ceil(1000))
        .map(|_| atlasboost_tcp::Context::new())
        .collect();
    let mut participants = Vec::with_capacity(world);
    for i in 0..world {
        let config = ParticipantConfig::new(&endpoint, i, world, JOB, secret.clone(), timeout);
        participants.push(
            ZmqRendezvous::connect_in(&contexts[i / 1000], config).map_err(|e| e.to_string())?,
        );
    }
    for (p, payload) in participants.iter_mut().zip(payloads) {
        p.send_contribution(payload).map_err(|e| e.to_string())?;
    }
    let mut received = 0;
    for p in &mut participants {
        received += p.receive_answer().map_err(|e| e.to_string())?.len();
    }
    drop(participants);
    let report = coordinator.finish();
    match report.failure {
        Some(why) => Err(why),
        None => Ok(received),
    }
}

/// The same rendezvous as [`run_rendezvous`] with the same real coordinator, but each
/// participant is a plain blocking TCP socket that speaks the bytes a [`ZmqRendezvous`]
/// puts on the wire: ZMTP 3.1's greeting and `READY` command as a DEALER with its routing id,
/// then the signed contribution; it reads the coordinator's greeting, `READY` and answer, and
/// checks the answer's signature, job, round and index as a participant does.
///
/// This is a load generator, as `wrk` is to a web server. On a cluster every participant runs
/// on its own host; here thousands of ZeroMQ participants would share the coordinator's two
/// cores and be measured with it ([`run_rendezvous`] does that). Their bytes on the wire are
/// the same, so the coordinator's work is too.
///
/// # Errors
///
/// Any socket error, a malformed or unauthentic answer, or a failed rendezvous, as text.
///
/// [`ZmqRendezvous`]: atlasboost_tcp::ZmqRendezvous
pub fn run_rendezvous_wire(payloads: &[Vec<u8>], answer: Answer) -> Result<Timing, String> {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::{Duration, Instant};

    use atlasboost_tcp::wire::{self, Frame, Kind};
    use atlasboost_tcp::{BROADCAST, DEFAULT_MAX_MESSAGE};

    let world = payloads.len();
    let secret = secret();
    // Each host's join is encoded and signed before the clock starts (a few microseconds
    // each, which on a cluster every host spends in parallel).
    let contributions: Vec<Vec<u8>> = payloads
        .iter()
        .enumerate()
        .map(|(i, payload)| {
            let join = wire::encode(
                &secret,
                &Frame {
                    kind: Kind::Join,
                    round: 1,
                    index: i as u32,
                    world: world as u32,
                    job_id: JOB,
                    payload,
                },
            );
            let mut bytes = zmtp::ready_dealer(format!("bench #{i}").as_bytes());
            bytes.extend(zmtp::message(&join));
            bytes
        })
        .collect();
    // What each host's answer must hold: its own server entry, or every host's report.
    let server_ids: Vec<String> = payloads
        .iter()
        .map(|p| match serde_json::from_slice(p) {
            Ok(atlasboost_core::exchange::HostReport::Devices(d)) => {
                d.first().map(|d| d.server_id.clone()).unwrap_or_default()
            }
            _ => String::new(),
        })
        .collect();
    let started = Instant::now();
    let coordinator = start_coordinator(world, answer)?;
    let addr = coordinator
        .endpoint()
        .strip_prefix("tcp://")
        .unwrap_or(coordinator.endpoint())
        .to_string();
    let mut hosts = Vec::with_capacity(world);
    for (i, rest) in contributions.into_iter().enumerate() {
        let mut s = TcpStream::connect(&addr).map_err(|e| format!("host {i}: connect: {e}"))?;
        s.set_nodelay(true)
            .map_err(|e| format!("host {i}: nodelay: {e}"))?;
        s.set_read_timeout(Some(Duration::from_secs(60)))
            .map_err(|e| format!("host {i}: read timeout: {e}"))?;
        s.write_all(&zmtp::greeting())
            .map_err(|e| format!("host {i}: send the greeting: {e}"))?;
        hosts.push((s, rest));
    }
    // libzmq drops a peer that sends its READY and message together with its greeting (tried):
    // like a DEALER, each host sends them once it has the coordinator's greeting.
    for (i, (s, rest)) in hosts.iter_mut().enumerate() {
        let mut greeting = [0u8; 64];
        s.read_exact(&mut greeting)
            .map_err(|e| format!("host {i}: read the greeting: {e}"))?;
        if greeting[0] != 0xff
            || greeting[9] != 0x7f
            || greeting[10] != 3
            || &greeting[12..17] != b"NULL\0"
        {
            return Err(format!(
                "host {i}: not a ZMTP 3 greeting with the NULL mechanism"
            ));
        }
        s.write_all(rest)
            .map_err(|e| format!("host {i}: send the contribution: {e}"))?;
    }
    let mut received = 0;
    for (i, (s, _)) in hosts.iter_mut().enumerate() {
        let reply = loop {
            let (command, body) = zmtp::read_frame(s, DEFAULT_MAX_MESSAGE)
                .map_err(|e| format!("host {i}: read a frame: {e}"))?;
            if !command {
                break body;
            }
            if !body.starts_with(b"\x05READY") {
                return Err(format!(
                    "host {i}: the coordinator sent the command {:?}",
                    String::from_utf8_lossy(&body)
                ));
            }
        };
        let frame = wire::decode(&secret, JOB, DEFAULT_MAX_MESSAGE, &reply)
            .map_err(|e| format!("host {i}: the answer is refused: {e}"))?;
        let addressee = match answer {
            Answer::Everything => BROADCAST,
            Answer::OwnEntry => i as u32,
        };
        if frame.kind != Kind::Result || frame.round != 1 || frame.index != addressee {
            return Err(format!(
                "host {i}: expected the result of round 1, got {:?} of round {} for index {}: {}",
                frame.kind,
                frame.round,
                frame.index,
                String::from_utf8_lossy(frame.payload)
            ));
        }
        let holds = match answer {
            Answer::Everything => {
                wire::unpack_list(frame.payload).is_some_and(|list| list.len() == world)
            }
            Answer::OwnEntry => serde_json::from_slice::<serde_json::Value>(frame.payload)
                .is_ok_and(|entry| entry["server_id"] == server_ids[i].as_str()),
        };
        if !holds {
            return Err(format!(
                "host {i}: the answer is not {}",
                match answer {
                    Answer::Everything => format!("the {world} hosts' reports"),
                    Answer::OwnEntry => format!("the entry of server {}", server_ids[i]),
                }
            ));
        }
        received += frame.payload.len();
    }
    let complete = started.elapsed();
    drop(hosts);
    let report = coordinator.finish();
    match report.failure {
        Some(why) => Err(why),
        None => Ok(Timing {
            complete,
            total: started.elapsed(),
            received,
        }),
    }
}

/// How long a [`run_rendezvous_wire`] took.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// From starting the coordinator until every participant held its checked answer.
    pub complete: std::time::Duration,
    /// The same and then closing every connection and stopping the coordinator.
    pub total: std::time::Duration,
    /// The answer bytes the participants received in all.
    pub received: usize,
}

/// Just enough of ZMTP 3.1 (rfc.zeromq.org/spec/23) for [`run_rendezvous_wire`]'s participants:
/// the NULL mechanism, a DEALER's `READY`, single-frame messages.
mod zmtp {
    use std::io::Read;

    /// The 64-byte greeting: signature, version 3.1, mechanism NULL, as-server 0. The
    /// signature's padding holds a length of 1 (an empty ZMTP 1.0 routing id), as a libzmq
    /// ROUTER's does.
    pub(crate) fn greeting() -> Vec<u8> {
        let mut g = vec![0u8; 64];
        g[0] = 0xff;
        g[8] = 1;
        g[9] = 0x7f;
        g[10] = 3;
        g[11] = 1;
        g[12..16].copy_from_slice(b"NULL");
        g
    }

    /// The `READY` command of a DEALER whose routing id is `id`.
    pub(crate) fn ready_dealer(id: &[u8]) -> Vec<u8> {
        let mut body = b"\x05READY".to_vec();
        for (name, value) in [(&b"Socket-Type"[..], &b"DEALER"[..]), (b"Identity", id)] {
            body.push(name.len() as u8);
            body.extend(name);
            body.extend((value.len() as u32).to_be_bytes());
            body.extend(value);
        }
        frame(0x04, &body)
    }

    /// A message of one frame.
    pub(crate) fn message(body: &[u8]) -> Vec<u8> {
        frame(0x00, body)
    }

    fn frame(flags: u8, body: &[u8]) -> Vec<u8> {
        let mut f = Vec::with_capacity(body.len() + 9);
        if body.len() < 256 {
            f.push(flags);
            f.push(body.len() as u8);
        } else {
            f.push(flags | 0x02);
            f.extend((body.len() as u64).to_be_bytes());
        }
        f.extend(body);
        f
    }

    /// The next frame: whether it is a command, and its body. Multi-frame messages are
    /// refused: the coordinator sends a participant single frames.
    pub(crate) fn read_frame(s: &mut impl Read, max: usize) -> std::io::Result<(bool, Vec<u8>)> {
        let bad = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidData, why);
        let mut flags = [0u8; 1];
        s.read_exact(&mut flags)?;
        let flags = flags[0];
        if flags & 0x01 != 0 {
            return Err(bad("a frame of a multi-frame message".into()));
        }
        let len = if flags & 0x02 != 0 {
            let mut n = [0u8; 8];
            s.read_exact(&mut n)?;
            u64::from_be_bytes(n)
        } else {
            let mut n = [0u8; 1];
            s.read_exact(&mut n)?;
            u64::from(n[0])
        };
        if len > max as u64 {
            return Err(bad(format!("a frame of {len} bytes")));
        }
        let mut body = vec![0u8; len as usize];
        s.read_exact(&mut body)?;
        Ok((flags & 0x04 != 0, body))
    }
}

/// The floor under [`run_rendezvous`]: the same number of TCP connections on loopback, each
/// sending a payload and reading a 1 KiB answer, with plain blocking sockets (one thread
/// accepting, one connecting) and no ZeroMQ, framing or authentication. Returns the bytes
/// answered.
///
/// # Errors
///
/// Any socket error, as text.
pub fn run_tcp_floor(payloads: &[Vec<u8>]) -> Result<usize, String> {
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpListener, TcpStream};

    use nix::sys::socket::{
        AddressFamily, Backlog, SockFlag, SockType, SockaddrIn, bind, listen, socket,
    };

    const ANSWER: usize = 1024;
    fn err(what: &'static str) -> impl Fn(std::io::Error) -> String {
        move |e| format!("{what}: {e}")
    }
    // The standard listener's backlog (128) would drop connections and retry after 1 s; the
    // coordinator asks for 4,096 too.
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| format!("socket: {e}"))?;
    bind(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &SockaddrIn::new(127, 0, 0, 1, 0),
    )
    .map_err(|e| format!("bind: {e}"))?;
    let backlog = Backlog::new(4096).map_err(|e| format!("backlog: {e}"))?;
    listen(&fd, backlog).map_err(|e| format!("listen: {e}"))?;
    let listener = TcpListener::from(fd);
    let addr: SocketAddr = listener.local_addr().map_err(err("local address"))?;
    let sizes: Vec<usize> = payloads.iter().map(Vec::len).collect();
    let server = std::thread::spawn(move || -> Result<(), String> {
        let mut peers = Vec::with_capacity(sizes.len());
        let mut buf = vec![0u8; sizes.iter().copied().max().unwrap_or(0)];
        for _ in &sizes {
            let (s, _) = listener.accept().map_err(err("accept"))?;
            s.set_nodelay(true).map_err(err("nodelay"))?;
            peers.push(s);
        }
        // Connections are accepted in the order they were made, so sizes line up.
        for (s, n) in peers.iter_mut().zip(&sizes) {
            s.read_exact(&mut buf[..*n])
                .map_err(err("read a request"))?;
        }
        for s in &mut peers {
            s.write_all(&[1u8; ANSWER]).map_err(err("answer"))?;
        }
        Ok(())
    });
    let mut clients = Vec::with_capacity(payloads.len());
    for p in payloads {
        let mut s = TcpStream::connect(addr).map_err(err("connect"))?;
        s.set_nodelay(true).map_err(err("nodelay"))?;
        s.write_all(p).map_err(err("send a request"))?;
        clients.push(s);
    }
    let mut answer = [0u8; ANSWER];
    let mut received = 0;
    for s in &mut clients {
        s.read_exact(&mut answer).map_err(err("read the answer"))?;
        received += ANSWER;
    }
    server
        .join()
        .map_err(|_| "the accepting thread panicked".to_string())??;
    Ok(received)
}

/// Prints this process's peak resident memory (`VmHWM`) on stderr, for docs/PERFORMANCE.md.
pub fn print_peak_memory() {
    if let Ok(status) = std::fs::read_to_string("/proc/self/status")
        && let Some(line) = status.lines().find(|l| l.starts_with("VmHWM"))
    {
        eprintln!(
            "peak memory of the benchmark process: {}",
            line.trim_start_matches("VmHWM:").trim()
        );
    }
}
