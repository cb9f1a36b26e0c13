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
