//! The launch tree's round (SPEC §14) at 4,096 hosts x 8 devices (32,768 ranks).
//!
//! - `launcher_round_wire/4096`: the launcher's part of a launch, on the wire: its K = 32
//!   children (threads on Unix sockets, standing in for ssh sessions) send the compact reports
//!   of their subtrees, wrapped as the agents pass them up (`Up::Via`); the launcher decodes
//!   the frames and the reports, decides the table once (build, validate, JSON, SHA-256),
//!   encodes the compact decision and writes it to its K children. `complete`: until every
//!   child holds the whole decision. The bytes the launcher sent and the compact sizes are
//!   printed once, for docs/PERFORMANCE.md.
//! - `decision_encode`, `decision_render`: one host's share: encoding the decision, and what
//!   every agent does with it (decode, build the table, its JSON and SHA-256 check).
//!
//! The JSON all-gather of the launch before the tree is the `rendezvous/all_gather_wire` row
//! of the `rendezvous` benchmark.

use std::hint::black_box;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use atlasboost_benches::cluster;
use atlasboost_cli::launch::agent::{
    AgentReport, TablePolicy, decide, decode_report, encode_decision, encode_report,
    render_decision,
};
use atlasboost_cli::launch::channel::{self, Decoder, Tree, Up};
use atlasboost_cli::launch::plan::HostPlan;
use atlasboost_core::exchange::HostReport;
use atlasboost_core::ranktable::BuildOptions;
use criterion::{BenchmarkId, Criterion, criterion_group};

const HOSTS: usize = 4096;
const FANOUT: usize = 32;

/// Every host's plan and report, in host order.
fn hosts_and_reports() -> (Vec<HostPlan>, Vec<AgentReport>) {
    let devices = cluster(HOSTS as u32, 8);
    let mut plans = Vec::with_capacity(HOSTS);
    let mut reports = Vec::with_capacity(HOSTS);
    for host in devices.chunks(8) {
        let server_id = host[0].server_id.clone();
        plans.push(HostPlan {
            name: server_id.clone(),
            server_id,
            slots: None,
            local: false,
        });
        reports.push(AgentReport {
            host: HostReport::Devices(host.to_vec()),
            free_port: 29500,
            nic_addr: None,
        });
    }
    (plans, reports)
}

fn policy(plans: &[HostPlan]) -> TablePolicy {
    TablePolicy {
        hosts: plans.to_vec(),
        np: None,
        build: BuildOptions::default(),
        shrink: None,
    }
}

/// What each of the launcher's children sends up: the greeting, then every report of its
/// subtree as the agents pass it up.
fn child_streams(reports: &[AgentReport]) -> Vec<Vec<u8>> {
    let tree = Tree {
        size: HOSTS,
        fanout: FANOUT,
    };
    let mut streams: Vec<Vec<u8>> = tree
        .children(None)
        .map(|_| channel::HELLO.to_vec())
        .collect();
    for (position, report) in reports.iter().enumerate() {
        let message = Up::Report {
            bytes: encode_report(report),
        };
        let up = match tree.parent(position) {
            None => message,
            Some(_) => Up::Via {
                host: position as u32,
                message: Box::new(message),
            },
        };
        channel::encode(&up, &mut streams[tree.top(position)]);
    }
    streams
}

/// What one round measured.
struct Round {
    complete: Duration,
    sent: usize,
    compact: usize,
    table: usize,
}

/// One launch round over Unix sockets: children send, the launcher decides and answers.
fn round(plans: &[HostPlan], streams: &[Vec<u8>]) -> Result<Round, String> {
    let started = Instant::now();
    let mut ends = Vec::new();
    let children: Vec<std::thread::JoinHandle<Result<Instant, String>>> = streams
        .iter()
        .map(|bytes| {
            let (ours, theirs) = UnixStream::pair().map_err(|e| e.to_string())?;
            ends.push(ours);
            let bytes = bytes.clone();
            Ok(std::thread::spawn(move || {
                let mut s = theirs;
                s.write_all(&bytes).map_err(|e| e.to_string())?;
                // Its line, then as many bytes as it says.
                let mut got = Vec::new();
                let mut buf = vec![0u8; 1 << 16];
                loop {
                    let n = s.read(&mut buf).map_err(|e| e.to_string())?;
                    if n == 0 {
                        return Err("the launcher closed before the decision".into());
                    }
                    got.extend_from_slice(&buf[..n]);
                    if let Some(end) = got.iter().position(|&b| b == b'\n') {
                        let line = String::from_utf8_lossy(&got[..end]);
                        let len: usize = line
                            .strip_prefix("decision ")
                            .and_then(|n| n.parse().ok())
                            .ok_or_else(|| format!("not a decision: {line}"))?;
                        if got.len() >= end + 1 + len {
                            return Ok(Instant::now());
                        }
                    }
                }
            }))
        })
        .collect::<Result<_, String>>()?;
    // The launcher: read every child until every host reported (frames, then reports).
    let mut reports: Vec<Option<AgentReport>> = (0..HOSTS).map(|_| None).collect();
    let mut left = HOSTS;
    let mut decoders: Vec<Decoder> = ends.iter().map(|_| Decoder::default()).collect();
    let mut buf = vec![0u8; 1 << 16];
    for e in &ends {
        e.set_nonblocking(true).map_err(|e| e.to_string())?;
    }
    while left > 0 {
        let mut progress = false;
        for (i, e) in ends.iter_mut().enumerate() {
            match e.read(&mut buf) {
                Ok(0) => return Err(format!("child {i} closed")),
                Ok(n) => {
                    progress = true;
                    for m in decoders[i].feed(&buf[..n])? {
                        let (position, bytes) = match m {
                            Up::Report { bytes } => (i, bytes),
                            Up::Via { host, message } => match *message {
                                Up::Report { bytes } => (host as usize, bytes),
                                other => return Err(format!("unexpected {other:?}")),
                            },
                            other => return Err(format!("unexpected {other:?}")),
                        };
                        let report = decode_report(&bytes, &plans[position].describe())?;
                        if reports[position].replace(report).is_none() {
                            left -= 1;
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        if !progress {
            std::thread::yield_now();
        }
    }
    let decision =
        decide(&policy(plans), reports.into_iter().flatten().collect()).map_err(|e| e.message)?;
    let compact = encode_decision(&decision);
    let lines = channel::decision_message(&compact);
    let mut sent = 0;
    for e in &mut ends {
        e.set_nonblocking(false).map_err(|e| e.to_string())?;
        e.write_all(&lines).map_err(|e| e.to_string())?;
        sent += lines.len();
    }
    let mut last = started;
    for c in children {
        let at = c.join().map_err(|_| "a child panicked".to_string())??;
        last = last.max(at);
    }
    Ok(Round {
        complete: last - started,
        sent,
        compact: compact.len(),
        table: decision.answer.table.len(),
    })
}

fn tree(c: &mut Criterion) {
    let (plans, reports) = hosts_and_reports();
    let streams = child_streams(&reports);
    let up: usize = streams.iter().map(Vec::len).sum();
    match round(&plans, &streams) {
        Ok(r) => eprintln!(
            "tree: {HOSTS} hosts, fanout {FANOUT}: reports in {up} bytes ({:.0} per host); \
             decision {} bytes compact ({:.1} per rank) for a {}-byte JSON table; the launcher \
             sent {} bytes ({FANOUT} x {}); one round {:.0?}",
            up as f64 / HOSTS as f64,
            r.compact,
            r.compact as f64 / (HOSTS * 8) as f64,
            r.table,
            r.sent,
            r.sent / FANOUT,
            r.complete
        ),
        Err(why) => panic!("the launch round failed: {why}"),
    }
    let mut g = c.benchmark_group("tree");
    g.sample_size(10);
    g.warm_up_time(Duration::from_millis(500));
    g.bench_with_input(
        BenchmarkId::new("launcher_round_wire/complete", HOSTS),
        &streams,
        |b, s| {
            b.iter_custom(|iterations| {
                (0..iterations)
                    .map(|_| match round(&plans, black_box(s)) {
                        Ok(r) => r.complete,
                        Err(why) => panic!("the launch round failed: {why}"),
                    })
                    .sum()
            })
        },
    );
    let decision = match decide(&policy(&plans), reports.clone()) {
        Ok(d) => d,
        Err(why) => panic!("the benchmark cluster must decide: {why}"),
    };
    let compact = encode_decision(&decision);
    g.bench_function(BenchmarkId::new("decision_encode", HOSTS * 8), |b| {
        b.iter(|| black_box(encode_decision(black_box(&decision)).len()))
    });
    g.bench_function(BenchmarkId::new("decision_render", HOSTS * 8), |b| {
        b.iter(|| match render_decision(black_box(&compact)) {
            Ok((answer, _)) => black_box(answer.table.len()),
            Err(e) => panic!("the decision must render: {e}"),
        })
    });
    g.finish();
}

criterion_group!(benches, tree);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    atlasboost_benches::print_peak_memory();
}
