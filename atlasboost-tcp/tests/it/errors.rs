//! Errors that say what happened: clashes, disagreeing world sizes, indices outside the world,
//! late arrivals, timeouts, and how `TcpError` maps onto `atlasboost_core::Error`.

use std::time::{Duration, Instant};

use atlasboost_core::Rendezvous;
use atlasboost_tcp::wire::{self, Frame, Kind};
use atlasboost_tcp::{Coordinator, CoordinatorConfig, Secret, TcpError, ZmqRendezvous};

use crate::common::{
    BOUND, LOOPBACK, chain, config, connect, free_port, names, payload, payloads, secret, spawn,
};

/// A timeout for rounds that are expected to fail before it.
const SHORT: Duration = Duration::from_secs(3);

/// The two endpoints named in "two participants claim index N: A and B".
fn clash_endpoints(message: &str, index: usize) -> (String, String) {
    let head = format!("two participants claim index {index}: ");
    let at = message
        .find(&head)
        .unwrap_or_else(|| panic!("not a clash of index {index}: {message}"));
    let rest = &message[at + head.len()..];
    let (a, b) = rest
        .split_once(" and ")
        .unwrap_or_else(|| panic!("two endpoints expected: {message}"));
    (a.to_string(), b.to_string())
}

/// Runs participants with the given indices (one thread each, all of world `world`) against
/// `endpoint`; returns each one's all-gather error as text and whether it is temporary, in
/// the order given.
fn failing(
    endpoint: &str,
    secret: &Secret,
    job: &'static str,
    world: usize,
    indices: Vec<usize>,
) -> Vec<(String, bool)> {
    let (endpoint, secret) = (endpoint.to_string(), secret.clone());
    spawn(0..indices.len(), move |k| {
        let i = indices[k];
        let mut rdv = connect(&endpoint, i, world, job, &secret, SHORT);
        let e = rdv.all_gather(&payload(i, 0)).expect_err("the round fails");
        (chain(&e), e.is_temporary())
    })
    .wait(BOUND)
}

#[test]
fn two_participants_claiming_one_index_are_both_named_to_everyone() {
    // Participant 2 never comes, so the round cannot complete before the clash is seen.
    let (secret, world, job) = (secret(), 3, "job-clash");
    let coordinator = crate::common::coordinator(world, job, &secret, SHORT);
    let endpoint = coordinator.endpoint().to_string();
    let errors = failing(&endpoint, &secret, job, world, vec![0, 1, 1]);
    let report = coordinator.finish();
    let failure = report.failure.expect("the coordinator reports the clash");
    let (a, b) = clash_endpoints(&failure, 1);
    for (who, endpoint) in [("first", &a), ("second", &b)] {
        assert!(
            endpoint.starts_with("127.0.0.1"),
            "the {who} claimant's endpoint is named: {failure}"
        );
    }
    for (k, (message, temporary)) in errors.iter().enumerate() {
        assert!(
            message.contains(&failure),
            "participant thread {k} gets the coordinator's reason ({failure}): {message}"
        );
        assert!(!temporary, "a clash is not temporary: {message}");
    }
    assert_eq!(report.rounds, 0);
}

#[test]
fn two_participants_claiming_one_index_are_told_apart() {
    let (secret, world, job) = (secret(), 3, "job-clash-apart");
    let coordinator = crate::common::coordinator(world, job, &secret, SHORT);
    let endpoint = coordinator.endpoint().to_string();
    let _ = failing(&endpoint, &secret, job, world, vec![1, 1]);
    let failure = coordinator.finish().failure.expect("a clash");
    let (a, b) = clash_endpoints(&failure, 1);
    assert_ne!(
        a, b,
        "the two claimants of index 1 should be named apart (e.g. address and port): {failure}"
    );
}

#[test]
fn a_second_claimant_arriving_after_its_round_completed_is_told_of_the_clash() {
    let (secret, world, job) = (secret(), 2, "job-clash-late");
    let coordinator = crate::common::coordinator(world, job, &secret, SHORT);
    let endpoint = coordinator.endpoint().to_string();
    let gathered = {
        let (endpoint, secret) = (endpoint.clone(), secret.clone());
        spawn(0..world, move |i| {
            connect(&endpoint, i, world, job, &secret, SHORT).all_gather(&payload(i, 0))
        })
        .wait(BOUND)
    };
    for result in gathered {
        assert_eq!(result.expect("round 1 completes"), payloads(world, 0));
    }
    let mut late = connect(&endpoint, 1, world, job, &secret, SHORT);
    let start = Instant::now();
    let e = late
        .all_gather(&payload(1, 0))
        .expect_err("index 1 is taken");
    let (message, elapsed) = (chain(&e), start.elapsed());
    let report = coordinator.finish();
    assert!(
        message.contains("two participants claim index 1"),
        "the late claimant should learn of the clash, after {elapsed:?}: {message}; coordinator: {report:?}"
    );
    assert!(!e.is_temporary(), "{message}");
}

#[test]
fn a_participant_whose_world_size_disagrees_is_named_with_both_sizes() {
    let (secret, job) = (secret(), "job-worlds");
    let mut config = CoordinatorConfig::new(LOOPBACK, 3, job, secret.clone(), SHORT);
    config.names = names(3);
    let coordinator = Coordinator::start(config).expect("start a coordinator");
    let endpoint = coordinator.endpoint().to_string();
    let results = {
        let (endpoint, secret) = (endpoint.clone(), secret.clone());
        // Participant 0 believes in 3 participants, participant 1 in 4.
        spawn(0..2, move |i| {
            let world = 3 + i;
            let e = connect(&endpoint, i, world, job, &secret, SHORT)
                .all_gather(&payload(i, 0))
                .expect_err("the world sizes disagree");
            (chain(&e), e.is_temporary())
        })
        .wait(BOUND)
    };
    let failure = coordinator.finish().failure.expect("a failure");
    assert!(
        failure.contains("participant 1 (node-1) at 127.0.0.1")
            && failure.contains("expects 4 participants")
            && failure.contains("the coordinator 3"),
        "the failure names participant 1, its host and both sizes: {failure}"
    );
    for (i, (message, temporary)) in results.iter().enumerate() {
        assert!(message.contains(&failure), "participant {i}: {message}");
        assert!(!temporary, "{message}");
    }
}

#[test]
fn an_index_outside_the_world_is_refused_at_connect() {
    let endpoint = "tcp://127.0.0.1:1";
    for (index, world) in [(3, 3), (7, 3), (0, 0)] {
        let config = config(endpoint, index, world, "job", &secret(), SHORT);
        match ZmqRendezvous::connect(config) {
            Err(TcpError::Config(message)) => {
                assert!(
                    message.contains(&format!("index {index}"))
                        && message.contains(&format!("world of {world}")),
                    "{message}"
                );
                let core = atlasboost_core::Error::from(TcpError::Config(message.clone()));
                assert!(!core.is_temporary());
                assert!(chain(&core).contains(&message));
            }
            other => panic!("index {index} of {world}: expected a config error, got {other:?}"),
        }
    }
    let e = Coordinator::start(CoordinatorConfig::new(LOOPBACK, 0, "job", secret(), SHORT))
        .expect_err("a world of 0");
    assert!(matches!(e, TcpError::Config(_)), "{e:?}");
}

/// A raw DEALER that sends `frame` to `endpoint` and returns the answer it gets (bounded).
fn raw_exchange(endpoint: &str, frame: Vec<u8>) -> Option<Vec<u8>> {
    let ctx = zmq::Context::new();
    let dealer = ctx.socket(zmq::DEALER).expect("a DEALER");
    dealer.set_linger(0).expect("linger");
    dealer.connect(endpoint).expect("connect");
    dealer.send(frame, 0).expect("send");
    let ready = dealer
        .poll(zmq::POLLIN, SHORT.as_millis() as i64)
        .expect("poll");
    (ready > 0).then(|| dealer.recv_bytes(0).expect("receive"))
}

/// A join for `job`, signed with `secret`, as a participant would send it.
fn raw_join(secret: &Secret, job: &str, round: u64, index: u32, world: u32) -> Vec<u8> {
    wire::encode(
        secret,
        &Frame {
            kind: Kind::Join,
            round,
            index,
            world,
            job_id: job,
            payload: b"raw",
        },
    )
}

/// Sends a raw authentic frame while participant 0 waits, and checks that both it and the
/// raw sender are told `expected`, and the coordinator reports it.
fn raw_frame_fails_the_job(frame: impl FnOnce(&Secret, &str) -> Vec<u8>, expected: &[&str]) {
    let (secret, world, job) = (secret(), 3, "job-raw");
    let coordinator = crate::common::coordinator(world, job, &secret, SHORT);
    let endpoint = coordinator.endpoint().to_string();
    let honest = {
        let (endpoint, secret) = (endpoint.clone(), secret.clone());
        spawn([0], move |i| {
            let e = connect(&endpoint, i, world, job, &secret, SHORT)
                .all_gather(&payload(i, 0))
                .expect_err("the job fails");
            chain(&e)
        })
    };
    let answer = raw_exchange(&endpoint, frame(&secret, job)).expect("the raw sender is answered");
    let answer = wire::decode(&secret, job, 1 << 20, &answer).expect("an authentic answer");
    assert_eq!(answer.kind, Kind::Failure);
    let told = String::from_utf8_lossy(answer.payload).into_owned();
    let message = honest.wait(BOUND).remove(0);
    let failure = coordinator.finish().failure.expect("a failure");
    for part in expected {
        assert!(failure.contains(part), "{part:?} in the failure: {failure}");
    }
    assert_eq!(told, failure, "the raw sender is told the reason");
    assert!(
        message.contains(&failure),
        "participant 0 is told: {message}"
    );
}

#[test]
fn an_authentic_frame_with_an_index_outside_the_world_fails_the_job_naming_the_peer() {
    raw_frame_fails_the_job(
        |secret, job| raw_join(secret, job, 1, 7, 3),
        &[
            "participant at 127.0.0.1 claims index 7",
            "outside this job's 3 participants (0..2)",
        ],
    );
}

#[test]
fn an_authentic_frame_from_a_later_round_fails_the_job_naming_the_peer() {
    raw_frame_fails_the_job(
        |secret, job| raw_join(secret, job, 5, 2, 3),
        &["participant 2 at 127.0.0.1 is in round 5, the others in round 1"],
    );
}

#[test]
fn a_participant_arriving_after_the_job_failed_is_told_at_once() {
    let (secret, job) = (secret(), "job-late");
    let coordinator = crate::common::coordinator(3, job, &secret, SHORT);
    let endpoint = coordinator.endpoint().to_string();
    // Participant 1 believes in 4 participants: the job fails.
    let e = connect(&endpoint, 1, 4, job, &secret, SHORT)
        .all_gather(b"wrong world")
        .expect_err("the world sizes disagree");
    // The coordinator records the failure just after telling the participant (see the test
    // below): wait for it.
    let failure = wait_failure(&coordinator);
    assert!(chain(&e).contains(&failure));

    // A participant with a long timeout arrives: it gets the failure, not a timeout.
    let long = Duration::from_secs(20);
    let mut late = connect(&endpoint, 2, 3, job, &secret, long);
    let start = Instant::now();
    let e = late.all_gather(&payload(2, 0)).expect_err("the job failed");
    let elapsed = start.elapsed();
    assert!(
        elapsed < Duration::from_secs(2),
        "the failure should come at once, not after {elapsed:?}"
    );
    assert!(chain(&e).contains(&failure), "{}", chain(&e));
    assert!(!e.is_temporary());
    // The same for a barrier.
    let start = Instant::now();
    let e = connect(&endpoint, 0, 3, job, &secret, long)
        .barrier()
        .expect_err("the job failed");
    assert!(start.elapsed() < Duration::from_secs(2));
    assert!(chain(&e).contains(&failure), "{}", chain(&e));
    assert_eq!(coordinator.finish().failure, Some(failure));
}

/// The coordinator's failure, once it has one (at most 2 s).
fn wait_failure(coordinator: &Coordinator) -> String {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        if let Some(failure) = coordinator.failure() {
            return failure;
        }
        assert!(
            Instant::now() < deadline,
            "the coordinator records no failure"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Sets the flag when dropped (also when a test panics).
struct StopOnDrop(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

#[test]
fn the_coordinator_reports_a_failure_once_a_participant_has_been_told() {
    // Busy threads get the coordinator thread preempted between sending and storing.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let _busy = spawn(0..4, {
        let stop = std::sync::Arc::clone(&stop);
        move |_| {
            let deadline = Instant::now() + BOUND;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < deadline {
                std::hint::spin_loop();
            }
        }
    });
    let _stop = StopOnDrop(stop);
    let job = "job-race";
    for attempt in 0..500 {
        let secret = secret();
        let coordinator = crate::common::coordinator(2, job, &secret, SHORT);
        let e = connect(coordinator.endpoint(), 1, 3, job, &secret, SHORT)
            .all_gather(b"wrong world")
            .expect_err("the world sizes disagree");
        let failure = coordinator.failure();
        assert!(
            failure.as_deref().is_some_and(|f| chain(&e).contains(f)),
            "attempt {attempt}: the participant was told ({}) but the coordinator reports {failure:?}",
            chain(&e)
        );
    }
}

#[test]
fn a_timeout_without_a_coordinator_is_temporary_and_names_the_endpoint() {
    let endpoint = format!("tcp://127.0.0.1:{}", free_port());
    let timeout = Duration::from_millis(300);
    let make = || {
        ZmqRendezvous::connect(atlasboost_tcp::ParticipantConfig::new(
            &endpoint,
            0,
            2,
            "job-alone",
            secret(),
            timeout,
        ))
        .expect("connecting does not wait for the coordinator")
    };

    let start = Instant::now();
    let e = make().exchange(b"anyone?").expect_err("nobody answers");
    assert!(start.elapsed() >= timeout);
    assert!(start.elapsed() < timeout + Duration::from_secs(2));
    assert!(
        matches!(&e, TcpError::NoAnswer { endpoint: at, round: 1, after } if *at == endpoint && *after == timeout),
        "{e:?}"
    );
    assert!(e.is_temporary());
    assert!(e.to_string().contains(&endpoint), "{e}");

    let core = atlasboost_core::Error::from(e);
    assert!(core.is_temporary());
    assert!(
        matches!(&core, atlasboost_core::Error::Rendezvous { backend, temporary: true, .. } if backend == "zmq"),
        "{core:?}"
    );

    for (what, result) in [
        ("all_gather", make().all_gather(b"anyone?").map(drop)),
        ("barrier", make().barrier()),
    ] {
        let e = result.expect_err("nobody answers");
        assert!(e.is_temporary(), "{what}: {e:?}");
        let text = chain(&e);
        assert!(
            text.contains(&endpoint) && text.contains("no answer"),
            "{what}: {text}"
        );
    }
}

#[test]
fn a_timeout_lists_exactly_the_participants_that_never_arrived() {
    let timeout = Duration::from_secs(2);
    // (world, names?, who arrives, what the failure must say)
    let cases: [(usize, bool, Vec<usize>, String); 2] = [
        (
            5,
            true,
            vec![0, 2, 4],
            "in round 1 waiting for participants 1 (node-1), 3 (node-3) (3 of 5 arrived)".into(),
        ),
        (
            20,
            false,
            vec![0],
            format!(
                "in round 1 waiting for participants {} and 3 more (1 of 20 arrived)",
                (1..=16)
                    .map(|i| i.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
    ];
    let outcomes = spawn(0..cases.len(), move |c| {
        let (world, named, arriving, expected) = cases[c].clone();
        let secret = secret();
        let mut config =
            CoordinatorConfig::new(LOOPBACK, world, "job-missing", secret.clone(), timeout);
        if named {
            config.names = names(world);
        }
        let coordinator = Coordinator::start(config).expect("start a coordinator");
        let endpoint = coordinator.endpoint().to_string();
        let errors = spawn(arriving, move |i| {
            let e = connect(&endpoint, i, world, "job-missing", &secret, timeout)
                .all_gather(&payload(i, 0))
                .expect_err("participants are missing");
            (chain(&e), e.is_temporary())
        })
        .wait(BOUND);
        (expected, errors, coordinator.finish().failure)
    })
    .wait(BOUND);
    for (expected, errors, failure) in outcomes {
        let failure = failure.expect("a timeout");
        assert!(
            failure.starts_with("timed out after 2s") && failure.ends_with(&expected),
            "expected \"timed out after 2s {expected}\", got: {failure}"
        );
        for (message, temporary) in errors {
            assert!(message.contains(&failure), "{message}");
            assert!(temporary, "a timeout is temporary: {message}");
        }
    }
}

/// A participant that gives up (here: its timeout is shorter than the coordinator's) makes the
/// round fail for everyone, instead of failing alone while the others succeed.
#[test]
fn a_participant_that_gives_up_fails_the_round_for_everyone() {
    use atlasboost_tcp::ParticipantConfig;
    let secret = Secret::from_bytes([9; 32]);
    let coordinator = Coordinator::start(CoordinatorConfig::new(
        "tcp://127.0.0.1:0",
        3,
        "abort",
        secret.clone(),
        Duration::from_secs(20),
    ))
    .unwrap();
    let endpoint = coordinator.endpoint().to_string();
    // Participant 0 waits 300 ms only; participant 1 waits long; participant 2 never comes.
    let mut impatient = ZmqRendezvous::connect(ParticipantConfig::new(
        &endpoint,
        0,
        3,
        "abort",
        secret.clone(),
        Duration::from_millis(300),
    ))
    .unwrap();
    let patient_config =
        ParticipantConfig::new(&endpoint, 1, 3, "abort", secret, Duration::from_secs(20));
    let started = std::time::Instant::now();
    let patient = std::thread::spawn(move || {
        let mut p = ZmqRendezvous::connect(patient_config).unwrap();
        p.exchange(b"patient")
    });
    let e = impatient.exchange(b"impatient").unwrap_err();
    assert!(matches!(e, TcpError::NoAnswer { .. }), "{e:?}");
    let e = patient.join().unwrap().unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("participant 0") && text.contains("gave up"),
        "{text}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "told long before its own timeout"
    );
    let report = coordinator.finish();
    assert!(report.failure.unwrap_or_default().contains("gave up"));
}

/// The signal masks (`SigBlk`) of this process's coordinator threads.
fn coordinator_signal_masks() -> Vec<u64> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.trim() == "atlasboost-coor")
        })
        .filter_map(|t| {
            let status = std::fs::read_to_string(t.path().join("status")).ok()?;
            let mask = status.lines().find_map(|l| l.strip_prefix("SigBlk:"))?;
            u64::from_str_radix(mask.trim(), 16).ok()
        })
        .collect()
}

#[test]
fn the_coordinator_thread_leaves_the_processs_signals_to_the_application() {
    // A Ctrl-C taken by the coordinator's thread would interrupt its wait, not the
    // application's, which then never learns of it (Python's `init()` would not raise
    // KeyboardInterrupt).
    use nix::sys::signal::Signal::{SIGINT, SIGTERM};
    let coordinator =
        crate::common::coordinator(2, "job-signals", &secret(), crate::common::TIMEOUT);
    let blocked =
        |mask: u64, signal: nix::sys::signal::Signal| mask & (1 << (signal as i32 - 1)) != 0;
    let deadline = Instant::now() + BOUND;
    loop {
        let masks = coordinator_signal_masks();
        // Other tests' coordinators may be starting too: wait until every one has blocked.
        if !masks.is_empty()
            && masks
                .iter()
                .all(|m| blocked(*m, SIGINT) && blocked(*m, SIGTERM))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "coordinator threads still take SIGINT or SIGTERM: masks {masks:x?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(coordinator);
}
