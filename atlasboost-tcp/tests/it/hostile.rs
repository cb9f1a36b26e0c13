//! Strangers on the coordinator's port: garbage, oversized frames, forged and foreign frames
//! during a rendezvous. They are dropped and counted; the honest participants complete.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use atlasboost_core::Rendezvous;
use atlasboost_tcp::wire::{self, Frame, Kind};
use atlasboost_tcp::{Coordinator, CoordinatorConfig, Secret};

use crate::common::{
    BOUND, LOOPBACK, TIMEOUT, chain, connect, payload, payloads, secret, spawn, spawn_one,
};

const WORLD: usize = 4;
const JOB: &str = "job-honest";
/// The coordinator's size limit in this test.
const MAX_MESSAGE: usize = 64 << 10;
/// All-gathers the honest participants do (then a barrier).
const GATHERS: usize = 3;

/// A join frame signed with `secret`.
fn join(secret: &Secret, job: &str, index: u32, world: u32, payload: &[u8]) -> Vec<u8> {
    signed(secret, Kind::Join, job, index, world, payload)
}

fn signed(secret: &Secret, kind: Kind, job: &str, index: u32, world: u32, p: &[u8]) -> Vec<u8> {
    wire::encode(
        secret,
        &Frame {
            kind,
            round: 1,
            index,
            world,
            job_id: job,
            payload: p,
        },
    )
}

/// One-frame messages a stranger sends, each refused by the coordinator for a reason of its
/// own, with the words its drop log should show.
fn garbage(secret: &Secret) -> Vec<(Vec<u8>, &'static str)> {
    let stranger = Secret::from_bytes([7; 32]);
    let w = WORLD as u32;
    let mut future = join(secret, JOB, 0, w, b"from the future");
    future[4] = wire::VERSION + 1;
    let mut unsigned = join(secret, JOB, 2, w, b"no tag");
    unsigned.truncate(unsigned.len() - 32);
    vec![
        (
            b"garbage garbage garbage garbage garbage garbage garbage garbage".to_vec(),
            "not an atlasboost frame",
        ),
        (
            (0..1024).map(|i| (i * 37 % 256) as u8).collect(),
            "not an atlasboost frame",
        ),
        (Vec::new(), "too short"),
        (b"ABRZ".to_vec(), "too short"),
        (join(&stranger, JOB, 0, w, b"forged"), "authentication"),
        (join(secret, "job-other", 1, w, b"foreign"), "another job"),
        (future, "protocol version 2"),
        // A valid index, a wrong world size: a clash if it were authentic, but it is not.
        (
            join(&stranger, JOB, 1, 99, b"wrong world"),
            "authentication",
        ),
        (unsigned, "authentication"),
        (
            signed(secret, Kind::Result, JOB, 0, w, b"a result?"),
            "unexpected Result frame",
        ),
    ]
}

/// What the stranger does: sends one of everything (reporting how many frames the coordinator
/// should count), waits for `go`, then floods until `stop`. Returns how many it sent.
fn stranger(
    endpoint: &str,
    secret: &Secret,
    sent_first: mpsc::Sender<u64>,
    go: mpsc::Receiver<()>,
    stop: &AtomicBool,
) -> Result<u64, String> {
    let err = |what: &'static str| move |e: zmq::Error| format!("stranger: cannot {what}: {e}");
    let ctx = zmq::Context::new();
    let dealer = ctx.socket(zmq::DEALER).map_err(err("create a DEALER"))?;
    dealer.set_linger(0).map_err(err("set linger"))?;
    dealer.connect(endpoint).map_err(err("connect"))?;
    let frames = garbage(secret);
    let mut counted = 0;
    for (bytes, _) in &frames {
        dealer.send(bytes.as_slice(), 0).map_err(err("send"))?;
        counted += 1;
    }
    dealer
        .send_multipart([b"ABRZ".as_slice(), b"and a second part"], 0)
        .map_err(err("send a multi-part message"))?;
    counted += 1;
    // A REQ socket puts an empty delimiter before its data: two parts at the ROUTER.
    let req = ctx.socket(zmq::REQ).map_err(err("create a REQ"))?;
    req.set_linger(0).map_err(err("set linger"))?;
    req.connect(endpoint).map_err(err("connect"))?;
    req.send(join(secret, JOB, 3, WORLD as u32, b"via REQ"), 0)
        .map_err(err("send from REQ"))?;
    counted += 1;
    // Over the size limit but under twice it: the coordinator refuses and counts it.
    let big = ctx.socket(zmq::DEALER).map_err(err("create a DEALER"))?;
    big.set_linger(0).map_err(err("set linger"))?;
    big.connect(endpoint).map_err(err("connect"))?;
    big.send(vec![0xAB; MAX_MESSAGE + MAX_MESSAGE / 2], 0)
        .map_err(err("send an oversized frame"))?;
    counted += 1;
    // Authentic, but over twice the limit: ZeroMQ itself drops the connection, so the
    // coordinator never sees it (else it would clash with participant 0).
    let big_signed = join(secret, JOB, 0, WORLD as u32, &vec![1; 2 * MAX_MESSAGE]);
    big.send(big_signed, 0)
        .map_err(err("send an oversized frame"))?;
    let _ = sent_first.send(counted);

    go.recv_timeout(BOUND)
        .map_err(|e| format!("stranger: no go: {e}"))?;
    let until = Instant::now() + BOUND;
    let mut sent = counted;
    while !stop.load(Ordering::Acquire) && Instant::now() < until {
        for (bytes, _) in &frames {
            dealer.send(bytes.as_slice(), 0).map_err(err("send"))?;
            sent += 1;
        }
        dealer
            .send_multipart([b"one".as_slice(), b"two", b"three"], 0)
            .map_err(err("send a multi-part message"))?;
        sent += 1;
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(sent)
}

/// Waits until the coordinator has refused at least `n` frames.
fn wait_dropped(coordinator: &Coordinator, n: u64) {
    let deadline = Instant::now() + BOUND;
    while coordinator.dropped() < n {
        assert!(
            Instant::now() < deadline,
            "the coordinator refused {} frames, not {n}, within {BOUND:?}",
            coordinator.dropped()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Honest participants `indices`: the gathers and a barrier, checking every result.
fn honest(
    endpoint: &str,
    secret: &Secret,
    indices: std::ops::Range<usize>,
) -> crate::common::Threads<Result<u64, String>> {
    let (endpoint, secret) = (endpoint.to_string(), secret.clone());
    spawn(indices, move |i| {
        let mut rdv = connect(&endpoint, i, WORLD, JOB, &secret, TIMEOUT);
        for round in 0..GATHERS {
            let got = rdv
                .all_gather(&payload(i, round))
                .map_err(|e| format!("participant {i}, gather {round}: {}", chain(&e)))?;
            if got != payloads(WORLD, round) {
                return Err(format!("participant {i}: wrong result in gather {round}"));
            }
        }
        rdv.barrier()
            .map_err(|e| format!("participant {i}, barrier: {}", chain(&e)))?;
        Ok(rdv.ignored())
    })
}

#[test]
fn strangers_flooding_the_coordinator_are_dropped_and_the_honest_complete() {
    let secret = secret();
    let mut config = CoordinatorConfig::new(LOOPBACK, WORLD, JOB, secret.clone(), TIMEOUT);
    config.max_message = MAX_MESSAGE;
    let coordinator = Coordinator::start(config).expect("start a coordinator");
    let endpoint = coordinator.endpoint().to_string();

    // Two participants are waiting in round 1 when the stranger arrives.
    let first = honest(&endpoint, &secret, 0..2);
    let (sent_tx, sent_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel();
    let stop = Arc::new(AtomicBool::new(false));
    let flood = {
        let (endpoint, secret, stop) = (endpoint.clone(), secret.clone(), Arc::clone(&stop));
        spawn_one(move || stranger(&endpoint, &secret, sent_tx, go_rx, &stop))
    };
    let counted = sent_rx
        .recv_timeout(BOUND)
        .expect("the stranger sends its first frames");
    wait_dropped(&coordinator, counted);
    assert_eq!(coordinator.failure(), None, "strangers do not fail the job");
    go_tx.send(()).expect("the stranger waits for go");
    // The rest of the rendezvous runs during the flood.
    let second = honest(&endpoint, &secret, 2..WORLD);
    for (i, result) in first
        .wait(BOUND)
        .into_iter()
        .chain(second.wait(BOUND))
        .enumerate()
    {
        if let Err(e) = result {
            panic!("honest participant {i}: {e}");
        }
    }
    stop.store(true, Ordering::Release);
    let sent = flood.wait(BOUND).remove(0).expect("the stranger ran");
    assert!(sent >= counted);

    let dropped_now = coordinator.dropped();
    let report = coordinator.finish();
    assert_eq!(report.failure, None);
    assert_eq!(report.rounds, GATHERS as u64 + 1);
    assert!(report.dropped >= counted && report.dropped >= dropped_now);
    assert!(
        report.dropped <= sent,
        "{} frames refused, only {sent} sent by the stranger",
        report.dropped
    );
    let log = report.drop_log.join("\n");
    for (_, why) in garbage(&secret) {
        assert!(
            log.contains(why),
            "the drop log should mention {why:?}:\n{log}"
        );
    }
    assert!(log.contains("more than one frame"), "{log}");
    assert!(
        log.lines().any(|l| l.starts_with("127.0.0.1: ")),
        "the drop log names the sender:\n{log}"
    );
}

#[test]
fn a_wrong_secret_join_for_a_taken_index_does_not_disturb_the_round() {
    // A stranger claims index 0 of the same job, with the wrong secret, while the real
    // participant 0 is waiting: no clash, just a dropped frame.
    let (secret, world) = (secret(), 2);
    let coordinator = crate::common::coordinator(world, JOB, &secret, TIMEOUT);
    let endpoint = coordinator.endpoint().to_string();
    let first = {
        let (endpoint, secret) = (endpoint.clone(), secret.clone());
        spawn([0], move |i| {
            connect(&endpoint, i, world, JOB, &secret, TIMEOUT).all_gather(&payload(i, 0))
        })
    };
    let ctx = zmq::Context::new();
    let dealer = ctx.socket(zmq::DEALER).unwrap();
    dealer.set_linger(0).unwrap();
    dealer.connect(&endpoint).unwrap();
    let forged = join(&Secret::from_bytes([9; 32]), JOB, 0, world as u32, b"me!");
    dealer.send(forged, 0).unwrap();
    wait_dropped(&coordinator, 1);
    let second = {
        let (endpoint, secret) = (endpoint.clone(), secret.clone());
        spawn([1], move |i| {
            connect(&endpoint, i, world, JOB, &secret, TIMEOUT).all_gather(&payload(i, 0))
        })
    };
    for result in first.wait(BOUND).into_iter().chain(second.wait(BOUND)) {
        assert_eq!(result.expect("the honest complete"), payloads(world, 0));
    }
    // The stranger is not answered.
    assert_eq!(dealer.poll(zmq::POLLIN, 200).unwrap(), 0);
    let report = coordinator.finish();
    assert_eq!(
        (report.rounds, report.failure, report.dropped),
        (1, None, 1)
    );
    assert!(
        report.drop_log[0].contains("authentication"),
        "{:?}",
        report.drop_log
    );
}

#[test]
fn every_refused_message_is_logged_with_its_sender() {
    let (secret, world) = (secret(), 2);
    let coordinator = crate::common::coordinator(world, JOB, &secret, TIMEOUT);
    let ctx = zmq::Context::new();
    let dealer = ctx.socket(zmq::DEALER).unwrap();
    dealer.set_linger(0).unwrap();
    dealer.connect(coordinator.endpoint()).unwrap();
    dealer
        .send(
            b"garbage garbage garbage garbage garbage garbage".as_slice(),
            0,
        )
        .unwrap();
    dealer
        .send_multipart([b"ABRZ".as_slice(), b"second part"], 0)
        .unwrap();
    wait_dropped(&coordinator, 2);
    let report = coordinator.finish();
    for line in &report.drop_log {
        assert!(
            line.starts_with("127.0.0.1"),
            "every entry names the sender: {:?}",
            report.drop_log
        );
    }
}

#[test]
fn an_oversized_frame_is_counted_and_logged() {
    let secret = secret();
    let mut config = CoordinatorConfig::new(LOOPBACK, 2, JOB, secret.clone(), TIMEOUT);
    config.max_message = MAX_MESSAGE;
    let coordinator = Coordinator::start(config).expect("start a coordinator");
    let ctx = zmq::Context::new();
    let dealer = ctx.socket(zmq::DEALER).unwrap();
    dealer.set_linger(0).unwrap();
    dealer.connect(coordinator.endpoint()).unwrap();
    // Over the limit, within the twice-the-limit cut-off of ZeroMQ itself (beyond which ZeroMQ
    // closes the connection without telling the coordinator).
    dealer
        .send(vec![0xAB; MAX_MESSAGE + MAX_MESSAGE / 2], 0)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(2);
    while coordinator.dropped() == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let report = coordinator.finish();
    assert_eq!(report.dropped, 1, "the oversized frame is counted");
    assert!(
        report
            .drop_log
            .iter()
            .any(|l| l.contains("over the size limit")),
        "{:?}",
        report.drop_log
    );
}

/// A fake coordinator: a raw ROUTER that answers the first join it receives with `answers`
/// (each a complete frame), in order. Returns its endpoint and a handle to wait for it.
fn fake_coordinator(
    secret: Secret,
    answers: impl FnOnce(&Frame<'_>) -> Vec<Vec<u8>> + Send + 'static,
) -> (String, crate::common::Threads<Result<(), String>>) {
    let ctx = zmq::Context::new();
    let router = ctx.socket(zmq::ROUTER).unwrap();
    router.set_linger(1000).unwrap();
    router.bind(LOOPBACK).unwrap();
    let endpoint = router.get_last_endpoint().unwrap().unwrap();
    let thread = spawn_one(move || {
        let _ctx = ctx;
        if router
            .poll(zmq::POLLIN, TIMEOUT.as_millis() as i64)
            .map_err(|e| e.to_string())?
            == 0
        {
            return Err("no join reached the fake coordinator".into());
        }
        let parts = router.recv_multipart(0).map_err(|e| e.to_string())?;
        let [routing, data] = parts.as_slice() else {
            return Err(format!("{} parts", parts.len()));
        };
        let join = wire::decode(&secret, JOB, 1 << 20, data).map_err(|e| e.to_string())?;
        for answer in answers(&join) {
            router
                .send_multipart([routing.as_slice(), answer.as_slice()], 0)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    });
    (endpoint, thread)
}

#[test]
fn a_participant_ignores_forged_answers_and_takes_the_authentic_one() {
    let secret = secret();
    let forger = Secret::from_bytes([3; 32]);
    let answer = |s: &Secret, kind: Kind, job: &str, round: u64, index: u32, p: &[u8]| {
        wire::encode(
            s,
            &Frame {
                kind,
                round,
                index,
                world: 2,
                job_id: job,
                payload: p,
            },
        )
    };
    let table = wire::pack_list(&[b"zero".to_vec(), b"one".to_vec()]);
    let forged_table = wire::pack_list(&[b"evil".to_vec(), b"evil".to_vec()]);
    let (endpoint, fake) = {
        let (secret, forger) = (secret.clone(), forger.clone());
        fake_coordinator(secret.clone(), move |join| {
            let round = join.round;
            let mut future = answer(&secret, Kind::Result, JOB, round, u32::MAX, &forged_table);
            future[4] = wire::VERSION + 1;
            vec![
                b"garbage".to_vec(),
                answer(&forger, Kind::Failure, JOB, round, u32::MAX, b"give up"),
                answer(&forger, Kind::Result, JOB, round, u32::MAX, &forged_table),
                answer(
                    &secret,
                    Kind::Result,
                    "job-other",
                    round,
                    u32::MAX,
                    &forged_table,
                ),
                // Authentic, but for participant 0, or for another round.
                answer(&secret, Kind::Result, JOB, round, 0, &forged_table),
                answer(
                    &secret,
                    Kind::Result,
                    JOB,
                    round + 1,
                    u32::MAX,
                    &forged_table,
                ),
                future,
                answer(&secret, Kind::Result, JOB, round, u32::MAX, &table),
            ]
        })
    };
    let mut rdv = connect(&endpoint, 1, 2, JOB, &secret, TIMEOUT);
    let got = rdv.all_gather(b"one").expect("the authentic answer");
    assert_eq!(got, vec![b"zero".to_vec(), b"one".to_vec()]);
    assert_eq!(
        rdv.ignored(),
        7,
        "every forged or foreign answer is ignored"
    );
    fake.wait(BOUND)
        .remove(0)
        .expect("the fake coordinator ran");
}

#[test]
fn an_authentic_answer_that_is_not_one_payload_per_participant_is_a_bad_answer() {
    let secret = secret();
    let (endpoint, fake) = {
        let secret = secret.clone();
        fake_coordinator(secret.clone(), move |join| {
            vec![wire::encode(
                &secret,
                &Frame {
                    kind: Kind::Result,
                    round: join.round,
                    index: u32::MAX,
                    world: 2,
                    job_id: JOB,
                    payload: &wire::pack_list(&[b"only one".to_vec()]),
                },
            )]
        })
    };
    let mut rdv = connect(&endpoint, 1, 2, JOB, &secret, TIMEOUT);
    let e = rdv
        .all_gather(b"one")
        .expect_err("one payload for two participants");
    assert!(!e.is_temporary());
    assert!(
        chain(&e).contains("not one payload per participant"),
        "{}",
        chain(&e)
    );
    fake.wait(BOUND)
        .remove(0)
        .expect("the fake coordinator ran");
}
