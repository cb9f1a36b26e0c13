//! One in-process coordinator with 512 and 4,096 simulated hosts of 8 devices, on loopback.
//!
//! Each iteration is a whole rendezvous: bind, connect every participant, one round, close.
//! Two answers are measured: the all-gather a launch needs (every host gets every host's
//! devices: O(N²) bytes) and the per-host answer of library mode (the coordinator builds the
//! table and each host gets its own entry: O(N) bytes).
//!
//! The hosts are simulated two ways. `all_gather` and `own_entry` run one real
//! `ZmqRendezvous` per host, all in this process, so their ZeroMQ work shares the
//! coordinator's cores. The `*_wire` rows run the same coordinator against a load generator
//! that writes the same bytes from plain sockets (`run_rendezvous_wire`); `complete` is the
//! time until every host holds its checked answer, `with_teardown` adds closing everything.

use std::hint::black_box;
use std::time::Duration;

use atlasboost_benches::{
    Answer, Timing, host_payloads, run_rendezvous, run_rendezvous_wire, run_tcp_floor,
};
use criterion::{BenchmarkId, Criterion, criterion_group};

fn rendezvous(c: &mut Criterion) {
    let mut g = c.benchmark_group("rendezvous");
    g.sample_size(10);
    g.warm_up_time(Duration::from_millis(500));
    // The all-gather of 4,096 hosts moves 15 GB through loopback and queues most of it in
    // memory (about a minute and 16 GB per run): only with ATLASBOOST_BENCH_HEAVY=1.
    let heavy = std::env::var_os("ATLASBOOST_BENCH_HEAVY").is_some_and(|v| v == "1");
    for hosts in [512u32, 4096] {
        let payloads = host_payloads(hosts);
        // What the kernel alone costs for as many connections: the floor under the others.
        g.bench_with_input(BenchmarkId::new("tcp_floor", hosts), &payloads, |b, p| {
            b.iter(|| match run_tcp_floor(black_box(p)) {
                Ok(bytes) => bytes,
                Err(why) => panic!("{hosts} plain TCP connections failed: {why}"),
            })
        });
        for (name, answer) in [
            ("all_gather", Answer::Everything),
            ("own_entry", Answer::OwnEntry),
        ] {
            if hosts > 512 && answer == Answer::Everything && !heavy {
                eprintln!(
                    "skipping rendezvous/{name}/{hosts}: set ATLASBOOST_BENCH_HEAVY=1 to run it"
                );
                continue;
            }
            g.bench_with_input(BenchmarkId::new(name, hosts), &payloads, |b, p| {
                b.iter(|| match run_rendezvous(black_box(p), answer) {
                    Ok(bytes) => bytes,
                    Err(why) => panic!("rendezvous of {hosts} hosts failed: {why}"),
                })
            });
            for phase in ["complete", "with_teardown"] {
                let id = BenchmarkId::new(format!("{name}_wire/{phase}"), hosts);
                g.bench_with_input(id, &payloads, |b, p| {
                    b.iter_custom(|iterations| {
                        (0..iterations)
                            .map(|_| match run_rendezvous_wire(black_box(p), answer) {
                                Ok(Timing { complete, .. }) if phase == "complete" => complete,
                                Ok(Timing { total, .. }) => total,
                                Err(why) => panic!("rendezvous of {hosts} hosts failed: {why}"),
                            })
                            .sum()
                    })
                });
            }
        }
    }
    g.finish();
}

criterion_group!(benches, rendezvous);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    atlasboost_benches::print_peak_memory();
}
