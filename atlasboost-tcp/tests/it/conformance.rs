//! The core conformance suite, run against the ZeroMQ backend.

use atlasboost_core::Rendezvous;
use atlasboost_core::conformance::run_in_threads;

use crate::common::{BOUND, TIMEOUT, connect, secret};

/// Runs the suite for a group of `world` participants with a fresh coordinator.
fn group(world: usize) {
    let secret = secret();
    let job = format!("conformance-{world}");
    let coordinator = crate::common::coordinator(world, &job, &secret, TIMEOUT);
    assert!(
        coordinator.endpoint().starts_with("tcp://127.0.0.1:")
            && !coordinator.endpoint().ends_with(":0"),
        "the coordinator reports the port it bound, not {}",
        coordinator.endpoint()
    );
    let endpoint = coordinator.endpoint().to_string();
    let participants: Vec<Box<dyn Rendezvous>> = (0..world)
        .map(|i| {
            Box::new(connect(&endpoint, i, world, &job, &secret, TIMEOUT)) as Box<dyn Rendezvous>
        })
        .collect();
    let result = run_in_threads(participants, BOUND);
    let report = coordinator.finish();
    if let Err(e) = result {
        panic!("conformance with {world} participants: {e}; coordinator: {report:?}");
    }
    assert_eq!(report.failure, None);
    assert_eq!(report.dropped, 0, "{:?}", report.drop_log);
    assert!(report.rounds >= 10, "only {} rounds", report.rounds);
}

#[test]
fn conformance_with_one_participant() {
    group(1);
}

#[test]
fn conformance_with_three_participants() {
    group(3);
}

#[test]
fn conformance_with_eight_participants() {
    group(8);
}
