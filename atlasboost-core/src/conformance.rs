//! The conformance suite every [`Rendezvous`] backend runs (feature `conformance`).
//!
//! [`check_participant`] is what one participant does; it works in threads of one process and
//! in separate processes (MPI). [`run_in_threads`] drives a whole in-process group and adds the
//! checks that need every participant's view.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::mpsc;
use std::time::Duration;

use crate::device::{Device, DeviceProbe, Health};
use crate::error::Result;
use crate::exchange::gather_cluster_table;
use crate::ranktable::{BuildOptions, RankTable, validate_table};
use crate::rendezvous::Rendezvous;

/// Devices per simulated host in the gather check.
const DEVICES_PER_HOST: u32 = 8;
/// Size of the large payload round.
const BIG: usize = 96 * 1024;

/// A probe for the suite itself: participant `i` is host `10.<i/250>.<i%250>.1` with 8 devices.
struct SuiteProbe {
    index: usize,
}

impl SuiteProbe {
    fn server_id(index: usize) -> String {
        format!("10.{}.{}.1", index / 250, index % 250)
    }
}

impl DeviceProbe for SuiteProbe {
    fn name(&self) -> &str {
        "conformance"
    }

    fn probe(&self) -> Result<Vec<Device>> {
        let host = (self.index + 1) as u32;
        Ok((0..DEVICES_PER_HOST)
            .map(|p| Device {
                server_id: Self::server_id(self.index),
                logical_id: p,
                physical_id: p,
                ip: Some(IpAddr::V4(Ipv4Addr::from((host << 8) | p | (29 << 24)))),
                chip: "910".into(),
                health: Health::Healthy,
                super_device_id: None,
                super_pod_id: None,
            })
            .collect())
    }
}

fn payload(round: usize, index: usize) -> Vec<u8> {
    // Lengths differ between participants and rounds; some payloads are empty.
    let len = (index * 7 + round * 13) % 97;
    let mut p = format!("round {round} from {index};").into_bytes();
    p.extend((0..len).map(|i| (i ^ index ^ round) as u8));
    if (round + index).is_multiple_of(5) {
        p.clear();
    }
    p
}

fn expect(cond: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if cond { Ok(()) } else { Err(what()) }
}

/// Runs every per-participant check. Each participant of a group must call it at the same time.
///
/// Returns the cluster table the participant built from the gathered devices, so a driver can
/// compare the tables of all participants.
///
/// # Errors
///
/// A description of the first check that failed.
pub fn check_participant(rdv: &mut dyn Rendezvous) -> Result<RankTable, String> {
    let (index, size) = (rdv.index(), rdv.size());
    expect(size > 0, || "size() is 0".into())?;
    expect(index < size, || {
        format!("index() {index} is not below size() {size}")
    })?;

    for round in 0..8 {
        let got = rdv.all_gather(&payload(round, index)).map_err(|e| {
            format!(
                "participant {index}: all_gather round {round} failed: {}",
                crate::exchange::error_chain(&e)
            )
        })?;
        expect(got.len() == size, || {
            format!(
                "round {round}: got {} payloads for {size} participants",
                got.len()
            )
        })?;
        for (i, p) in got.iter().enumerate() {
            expect(*p == payload(round, i), || {
                format!(
                    "participant {index}, round {round}: payload of {i} is wrong ({} bytes)",
                    p.len()
                )
            })?;
        }
        if round % 3 == 0 {
            rdv.barrier().map_err(|e| {
                format!(
                    "participant {index}: barrier after round {round} failed: {}",
                    crate::exchange::error_chain(&e)
                )
            })?;
        }
    }

    // A payload larger than socket buffers, different per participant.
    let big = |i: usize| -> Vec<u8> { (0..BIG).map(|k| (k % 251) as u8 ^ i as u8).collect() };
    let got = rdv.all_gather(&big(index)).map_err(|e| {
        format!(
            "participant {index}: {BIG}-byte all_gather failed: {}",
            crate::exchange::error_chain(&e)
        )
    })?;
    expect(got.len() == size, || {
        format!("participant {index}: {} large payloads", got.len())
    })?;
    for (i, p) in got.iter().enumerate() {
        let ok = p.len() == BIG
            && p.iter()
                .enumerate()
                .all(|(k, b)| *b == (k % 251) as u8 ^ i as u8);
        expect(ok, || {
            format!("participant {index}: {BIG}-byte payload of {i} is wrong")
        })?;
    }

    let probe = SuiteProbe { index };
    let table = gather_cluster_table(
        rdv,
        &probe,
        &SuiteProbe::server_id(index),
        &|d| Ok(d),
        &BuildOptions::default(),
    )
    .map_err(|e| {
        format!(
            "participant {index}: gathering devices failed: {}",
            crate::exchange::error_chain(&e)
        )
    })?;
    expect(
        table.rank_count() == size * DEVICES_PER_HOST as usize,
        || {
            format!(
                "participant {index}: table has {} ranks",
                table.rank_count()
            )
        },
    )?;
    let violations = validate_table(&table, crate::Chip::Ascend910);
    expect(violations.is_empty(), || {
        format!("participant {index}: built table invalid: {violations:?}")
    })?;

    // Everyone built the same bytes.
    let json = table.to_json_pretty();
    let all = rdv.all_gather(json.as_bytes()).map_err(|e| {
        format!(
            "participant {index}: comparing tables failed: {}",
            crate::exchange::error_chain(&e)
        )
    })?;
    expect(all.iter().all(|t| *t == all[0]), || {
        format!("participant {index}: participants built different tables")
    })?;
    rdv.barrier().map_err(|e| {
        format!(
            "participant {index}: final barrier failed: {}",
            crate::exchange::error_chain(&e)
        )
    })?;
    Ok(table)
}

/// Runs [`check_participant`] for every participant of an in-process group, one thread each,
/// and checks that the indices are `0..size` and that every participant built the same table.
///
/// # Errors
///
/// The first failure, or a timeout naming the participants that did not finish.
pub fn run_in_threads(
    participants: Vec<Box<dyn Rendezvous>>,
    timeout: Duration,
) -> Result<(), String> {
    let n = participants.len();
    let mut indices: Vec<usize> = participants.iter().map(|p| p.index()).collect();
    indices.sort_unstable();
    expect(indices == (0..n).collect::<Vec<_>>(), || {
        format!("indices of {n} participants are {indices:?}, not 0..{n}")
    })?;
    let (tx, rx) = mpsc::channel();
    for mut p in participants {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let index = p.index();
            // The receiver may be gone after a timeout; nothing to report to then.
            let _ = tx.send((index, check_participant(p.as_mut())));
        });
    }
    drop(tx);
    let deadline = std::time::Instant::now() + timeout;
    let mut done = vec![false; n];
    let mut first: Option<String> = None;
    for _ in 0..n {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok((i, Ok(table))) => {
                done[i] = true;
                let json = table.to_json_pretty();
                match &first {
                    None => first = Some(json),
                    Some(f) => expect(*f == json, || {
                        format!("participant {i} built another table")
                    })?,
                }
            }
            Ok((_, Err(e))) => return Err(e),
            Err(_) => {
                let missing: Vec<String> = (0..n)
                    .filter(|i| !done[*i])
                    .map(|i| i.to_string())
                    .collect();
                return Err(format!(
                    "timed out after {timeout:?} waiting for participants {}",
                    missing.join(", ")
                ));
            }
        }
    }
    Ok(())
}

/// The checks every [`DeviceProbe`] backend passes (sim, dsmi against the fake driver, hccn):
/// a non-empty name; the same devices on a second call; every device on `server_id`; logical
/// ids unique (`0..n` where the driver numbers devices; hccn.conf's follow the physical ids,
/// which may leave gaps); physical ids, and device IPs where present, unique; a chip name the
/// validator knows; and a table built from the healthy devices that validates.
///
/// Returns the devices, for the backend's own checks.
///
/// # Errors
///
/// A description of the first check that failed.
pub fn check_probe(probe: &dyn DeviceProbe, server_id: &str) -> Result<Vec<Device>, String> {
    expect(!probe.name().is_empty(), || "the probe has no name".into())?;
    let devices = probe
        .probe()
        .map_err(|e| format!("{} probe failed: {e}", probe.name()))?;
    let again = probe
        .probe()
        .map_err(|e| format!("{} probe failed the second time: {e}", probe.name()))?;
    expect(devices == again, || {
        format!("two probes disagree:\n{devices:?}\n{again:?}")
    })?;
    let mut logical: Vec<u32> = devices.iter().map(|d| d.logical_id).collect();
    logical.sort_unstable();
    logical.dedup();
    expect(logical.len() == devices.len(), || {
        format!("two devices share a logical id: {devices:?}")
    })?;
    let mut physical: Vec<u32> = devices.iter().map(|d| d.physical_id).collect();
    physical.sort_unstable();
    physical.dedup();
    expect(physical.len() == devices.len(), || {
        "two devices share a physical id".into()
    })?;
    let mut ips: Vec<IpAddr> = devices.iter().filter_map(|d| d.ip).collect();
    let with_ip = ips.len();
    ips.sort_unstable();
    ips.dedup();
    expect(ips.len() == with_ip, || "two devices share an IP".into())?;
    for d in &devices {
        expect(d.server_id == server_id, || {
            format!(
                "device {} is on {:?}, not {server_id:?}",
                d.physical_id, d.server_id
            )
        })?;
        expect(crate::Chip::from_driver_name(&d.chip).is_some(), || {
            format!("device {} reports unknown chip {:?}", d.physical_id, d.chip)
        })?;
    }
    let usable: Vec<Device> = devices
        .iter()
        .filter(|d| d.health.is_healthy() && d.ip.is_some())
        .cloned()
        .collect();
    if !usable.is_empty() {
        crate::ranktable::build_table(&usable, &BuildOptions::default())
            .map_err(|e| format!("the devices do not make a valid table: {e}"))?;
    }
    Ok(devices)
}
