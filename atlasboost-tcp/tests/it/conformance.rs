//! The core conformance suite, run against the ZeroMQ backend.

use atlasboost_core::Rendezvous;
use atlasboost_core::conformance::run_in_threads;

use atlasboost_tcp::{Coordinator, CoordinatorConfig};

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

/// A contribution taken by a coordinator that then closed (the previous start of a job, on the
/// same endpoint) is sent again while no answer comes: the next coordinator there answers it,
/// and takes one copy without calling the others strangers.
#[test]
fn a_contribution_lost_with_a_closed_coordinator_is_sent_again() {
    let secret = secret();
    let ctx = zmq::Context::new();
    let old = ctx.socket(zmq::ROUTER).expect("a ROUTER socket");
    old.set_linger(0).expect("linger");
    old.bind("tcp://127.0.0.1:0")
        .expect("bind the old coordinator");
    let endpoint = old
        .get_last_endpoint()
        .expect("its endpoint")
        .expect("UTF-8");
    let mut first = connect(&endpoint, 0, 2, "restarted", &secret, TIMEOUT);
    first.send_contribution(b"zero").expect("send");
    old.set_rcvtimeo(10_000).expect("timeout");
    old.recv_multipart(0).expect("the old coordinator takes it");
    drop(old);
    // The new coordinator binds the same port once the old one has let it go.
    let started = std::time::Instant::now();
    let coordinator = loop {
        let config =
            CoordinatorConfig::new(endpoint.clone(), 2, "restarted", secret.clone(), TIMEOUT);
        match Coordinator::start(config) {
            Ok(c) => break c,
            Err(e) if started.elapsed() > BOUND => panic!("cannot bind {endpoint} again: {e}"),
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(50)),
        }
    };
    let second_endpoint = endpoint.clone();
    let secret_2 = secret.clone();
    let second = std::thread::spawn(move || {
        connect(&second_endpoint, 1, 2, "restarted", &secret_2, TIMEOUT).exchange(b"one")
    });
    let answer = first.receive_answer().expect("the new coordinator answers");
    let other = second
        .join()
        .expect("join")
        .expect("the second participant's answer");
    assert_eq!(answer, other, "one all-gather for both");
    let report = coordinator.finish();
    assert_eq!(report.failure, None);
    assert_eq!(report.dropped, 0, "{:?}", report.drop_log);
}

/// A participant that waits long for the others sends its contribution again: the coordinator
/// takes the copies of a contribution it holds, and of a round it answered, silently (they are
/// not strangers' frames to report).
#[test]
fn copies_of_a_waiting_participants_contribution_are_no_strangers() {
    let secret = secret();
    let coordinator = crate::common::coordinator(2, "patient", &secret, TIMEOUT);
    let endpoint = coordinator.endpoint().to_string();
    let (first_endpoint, first_secret) = (endpoint.clone(), secret.clone());
    let first = std::thread::spawn(move || {
        connect(&first_endpoint, 0, 2, "patient", &first_secret, TIMEOUT).exchange(b"zero")
    });
    // Longer than a participant waits before it sends again.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let second = connect(&endpoint, 1, 2, "patient", &secret, TIMEOUT).exchange(b"one");
    let first = first.join().expect("join");
    assert_eq!(first.expect("first"), second.expect("second"));
    let report = coordinator.finish();
    assert_eq!(report.failure, None);
    assert_eq!(report.dropped, 0, "{:?}", report.drop_log);
}
