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
