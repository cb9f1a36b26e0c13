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

/// One complete rendezvous on loopback: a coordinator, one participant per payload (driven
/// from this thread), one round. Returns the bytes the participants received in all.
///
/// # Errors
///
/// Any failure of the rendezvous, as text.
pub fn run_rendezvous(payloads: &[Vec<u8>], answer: Answer) -> Result<usize, String> {
    use std::time::Duration;

    use atlasboost_core::exchange::HostReport;
    use atlasboost_core::ranktable::{BuildOptions, RankTable, build_table};
    use atlasboost_tcp::{
        Coordinator, CoordinatorConfig, ParticipantConfig, Replies, Secret, ZmqRendezvous,
    };

    let world = payloads.len();
    let secret = Secret::from_bytes([7; 32]);
    let timeout = Duration::from_secs(120);
    let config =
        CoordinatorConfig::new("tcp://127.0.0.1:0", world, "bench", secret.clone(), timeout);
    let coordinator = match answer {
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
    .map_err(|e| e.to_string())?;
    let endpoint = coordinator.endpoint().to_string();
    // A ZeroMQ context holds at most 1,023 sockets.
    let contexts: Vec<atlasboost_tcp::Context> = (0..world.div_ceil(1000))
        .map(|_| atlasboost_tcp::Context::new())
        .collect();
    let mut participants = Vec::with_capacity(world);
    for i in 0..world {
        let config = ParticipantConfig::new(&endpoint, i, world, "bench", secret.clone(), timeout);
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
