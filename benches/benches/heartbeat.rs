//! The cost of `heartbeat()` (SPEC §12), which a worker may call every training step: with a
//! launcher listening (`ATLASBOOST_HEARTBEAT_FILE` set, its record mapped into memory)
//! and without one. Python's `atlasboost.heartbeat()` and C's `atlasboost_heartbeat()` are this
//! call behind their bindings (`benches/compare.py restart` times the Python one).

use atlasboost::progress::heartbeat;
use atlasboost_core::EnvVars;
use criterion::{Criterion, criterion_group};

fn beats(c: &mut Criterion) {
    let dir = std::env::temp_dir().join(format!("atlasboost-bench-beat-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    // SAFETY: set before the first heartbeat, while criterion runs nothing else.
    unsafe { std::env::set_var(EnvVars::ATLASBOOST_HEARTBEAT_FILE, dir.join("beat")) };
    assert!(heartbeat(Some(0)), "the heartbeat file cannot be opened");
    let mut step = 0;
    c.bench_function("heartbeat/listening", |b| {
        b.iter(|| {
            step += 1;
            heartbeat(Some(step))
        });
    });
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, beats);

fn main() {
    benches();
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
}
