//! Re-planning a job around dead devices and lost hosts (SPEC §12): the largest world the chip's
//! rules allow on what is left.
//!
//! A pure function of what the hosts report, so the launcher's choice can be checked without a
//! cluster: the result is always a valid table, never smaller than another valid choice, and the
//! same for the same input.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use crate::device::{Chip, Device};

/// What one host can still offer a restart.
#[derive(Debug, Clone)]
pub struct HostDevices {
    /// Its server id.
    pub server_id: String,
    /// At most this many devices (its slots), if limited.
    pub cap: Option<usize>,
    /// Every device its probe found, healthy or not.
    pub devices: Vec<Device>,
}

/// The devices of the largest world the chip's rules allow on `hosts`, at most `max` of them.
///
/// Unhealthy devices are left out, and ids above the chip's highest. On 910 every server runs
/// the same count, 1, 2, 4 or 8, and a server of 2 or 4 uses one group (0-3 or 4-7): 16
/// servers of 8 with one dead device become 15 × 8, not 16 × 4. On 910B each server runs what
/// it has. On other chips every server runs the same count, and servers that name super pods
/// keep as many in every pod (HCCL's rule for 1.2 tables). Ties go to more devices per server
/// (fewer servers; hosts earlier in `hosts` first); within a server the lowest usable physical
/// ids are taken. Empty when nothing is usable.
///
/// A world of several servers needs every device's RoCE address, each its own (HCCL's
/// `device-ip-count`, `duplicate-device-ip`): a device without one, or sharing one with
/// another device, is left out of it, like an unhealthy one. A world of one server needs none
/// (its devices talk over HCCS), so one host may still run them all when that is larger.
pub fn largest_world(chip: Chip, hosts: &[HostDevices], max: Option<u64>) -> Vec<Device> {
    let fit = |d: &Device| usable(chip, d);
    let unaddressed = without_own_address(chip, hosts.iter().flat_map(|h| &h.devices));
    let addressed =
        |d: &Device| fit(d) && !unaddressed.contains(&(d.server_id.as_str(), d.physical_id));
    let several = plan(chip, hosts, max, &addressed);
    // The best single host on its own, when some of its devices lack an address.
    let alone = hosts
        .iter()
        .filter(|h| h.devices.iter().any(|d| fit(d) && !addressed(d)))
        .map(|h| plan(chip, std::slice::from_ref(h), max, &fit))
        .filter(|world| alone_is_valid(world))
        .fold(Vec::new(), |best, world| match world.len() > best.len() {
            true => world,
            false => best,
        });
    match alone.len() > several.len() {
        true => alone,
        false => several,
    }
}

/// `world` with as many servers in every super pod, as HCCL requires of a 1.2 table
/// (`CheckSuperPodInfo`): the `k` first servers of each pod that has `k`, for the `k` that keeps
/// the most devices (a larger `k` on a tie). Unchanged when not every device names its super
/// pod (no super pods, then: nothing to balance).
fn balanced_super_pods(world: Vec<Device>) -> Vec<Device> {
    let mut pods: Vec<(&str, Vec<(&str, usize)>)> = Vec::new();
    for d in &world {
        let Some(pod) = d.super_pod_id.as_deref() else {
            return world;
        };
        let at = match pods.iter().position(|(p, _)| *p == pod) {
            Some(at) => at,
            None => {
                pods.push((pod, Vec::new()));
                pods.len() - 1
            }
        };
        let servers = &mut pods[at].1;
        match servers.iter_mut().find(|(s, _)| *s == d.server_id) {
            Some((_, n)) => *n += 1,
            None => servers.push((&d.server_id, 1)),
        }
    }
    let most = pods.iter().map(|(_, s)| s.len()).max().unwrap_or(0);
    let kept = |k: usize| -> usize {
        pods.iter()
            .filter(|(_, s)| s.len() >= k)
            .map(|(_, s)| s[..k].iter().map(|(_, n)| n).sum::<usize>())
            .sum()
    };
    let Some(k) = (1..=most).max_by_key(|&k| (kept(k), k)) else {
        return world;
    };
    if pods.iter().all(|(_, s)| s.len() == k) {
        return world;
    }
    let servers: HashSet<String> = pods
        .iter()
        .filter(|(_, s)| s.len() >= k)
        .flat_map(|(_, s)| s[..k].iter().map(|(id, _)| (*id).to_string()))
        .collect();
    world
        .into_iter()
        .filter(|d| servers.contains(&d.server_id))
        .collect()
}

/// Whether a world may take `d`: healthy, and within the chip's ids.
fn usable(chip: Chip, d: &Device) -> bool {
    d.health.is_healthy() && d.physical_id <= chip.max_device_id()
}

/// The usable devices of `devices` (healthy, within the chip's ids) that a world of several
/// servers cannot take for their RoCE address: none, or one another usable device also has;
/// by server id and physical id.
#[must_use]
pub fn without_own_address<'a>(
    chip: Chip,
    devices: impl IntoIterator<Item = &'a Device>,
) -> HashSet<(&'a str, u32)> {
    let devices: Vec<&Device> = devices.into_iter().filter(|d| usable(chip, d)).collect();
    let mut owners: HashMap<IpAddr, usize> = HashMap::new();
    for ip in devices.iter().filter_map(|d| d.ip) {
        *owners.entry(ip).or_default() += 1;
    }
    devices
        .iter()
        .filter(|d| d.ip.is_none_or(|ip| owners.get(&ip) != Some(&1)))
        .map(|d| (d.server_id.as_str(), d.physical_id))
        .collect()
}

/// A one-server world lists no addresses if any device lacks one, else all of them, which must
/// then differ.
fn alone_is_valid(world: &[Device]) -> bool {
    let mut ips: Vec<IpAddr> = world.iter().filter_map(|d| d.ip).collect();
    if ips.len() < world.len() {
        return true;
    }
    ips.sort_unstable();
    ips.windows(2).all(|w| w[0] != w[1])
}

/// [`largest_world`] over the devices `usable` keeps.
fn plan(
    chip: Chip,
    hosts: &[HostDevices],
    max: Option<u64>,
    usable: &dyn Fn(&Device) -> bool,
) -> Vec<Device> {
    let usable: Vec<(Vec<&Device>, usize)> = hosts
        .iter()
        .map(|h| {
            let mut healthy: Vec<&Device> = h.devices.iter().filter(|d| usable(d)).collect();
            healthy.sort_by_key(|d| d.physical_id);
            healthy.dedup_by_key(|d| d.physical_id);
            (healthy, h.cap.unwrap_or(usize::MAX))
        })
        .collect();
    let max = max.map_or(usize::MAX, |m| usize::try_from(m).unwrap_or(usize::MAX));
    if chip == Chip::Ascend910B {
        // No rule ties servers together: every host gives what it has, in order, up to `max`.
        let mut left = max;
        let mut chosen = Vec::new();
        for (healthy, cap) in &usable {
            let take = healthy.len().min(*cap).min(left);
            chosen.extend(healthy[..take].iter().map(|d| (*d).clone()));
            left -= take;
        }
        return balanced_super_pods(chosen);
    }
    let counts: Vec<usize> = match chip {
        Chip::Ascend910 => vec![8, 4, 2, 1],
        _ => {
            let most = usable.iter().map(|(h, cap)| h.len().min(*cap)).max();
            (1..=most.unwrap_or(0)).rev().collect()
        }
    };
    // The best world so far; a larger count wins a tie because it comes first. Each count's
    // world is balanced across super pods before it is compared (which only shrinks it: a
    // count whose whole world is no larger than the best is not built).
    let mut best: Vec<Device> = Vec::new();
    for &per_server in &counts {
        if per_server > max {
            continue;
        }
        let servers = usable
            .iter()
            .filter(|(h, cap)| per_server <= *cap && pick(chip, h, per_server).is_some())
            .count()
            .min(max / per_server);
        if servers * per_server <= best.len() {
            continue;
        }
        let world: Vec<Device> = usable
            .iter()
            .filter(|(_, cap)| per_server <= *cap)
            .filter_map(|(h, _)| pick(chip, h, per_server))
            .take(servers)
            .flatten()
            .cloned()
            .collect();
        let world = balanced_super_pods(world);
        if world.len() > best.len() {
            best = world;
        }
    }
    best
}

/// `n` devices of one server that the chip allows together, from its healthy ones (sorted by
/// physical id), or `None`.
fn pick<'a>(chip: Chip, healthy: &[&'a Device], n: usize) -> Option<Vec<&'a Device>> {
    if healthy.len() < n {
        return None;
    }
    if chip == Chip::Ascend910 && (n == 2 || n == 4) {
        // One group: 0-3 first, then 4-7.
        for low in [true, false] {
            let group: Vec<&Device> = healthy
                .iter()
                .filter(|d| (d.physical_id < 4) == low)
                .copied()
                .collect();
            if group.len() >= n {
                return Some(group[..n].to_vec());
            }
        }
        return None;
    }
    Some(healthy[..n].to_vec())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::device::Health;
    use crate::ranktable::{BuildOptions, Format, build_table};

    fn host(index: u8, chip: &str, count: u32, dead: &[u32]) -> HostDevices {
        let server_id = format!("10.0.0.{index}");
        HostDevices {
            server_id: server_id.clone(),
            cap: None,
            devices: (0..count)
                .map(|p| Device {
                    server_id: server_id.clone(),
                    logical_id: p,
                    physical_id: p,
                    ip: Some(std::net::IpAddr::from([192, 168, index, p as u8])),
                    chip: chip.into(),
                    health: if dead.contains(&p) {
                        Health::Unhealthy { code: 3 }
                    } else {
                        Health::Healthy
                    },
                    super_device_id: None,
                    super_pod_id: None,
                })
                .collect(),
        }
    }

    fn shape(devices: &[Device]) -> Vec<(String, Vec<u32>)> {
        let mut servers: Vec<(String, Vec<u32>)> = Vec::new();
        for d in devices {
            match servers.iter_mut().find(|(s, _)| *s == d.server_id) {
                Some((_, ids)) => ids.push(d.physical_id),
                None => servers.push((d.server_id.clone(), vec![d.physical_id])),
            }
        }
        servers
    }

    #[test]
    fn one_dead_npu_of_sixteen_servers_costs_one_server_not_half_of_each() {
        let mut hosts: Vec<HostDevices> = (1..=16).map(|i| host(i, "910", 8, &[])).collect();
        hosts[2] = host(3, "910", 8, &[5]);
        let world = largest_world(Chip::Ascend910, &hosts, None);
        assert_eq!(world.len(), 120);
        assert!(world.iter().all(|d| d.server_id != "10.0.0.3"));
    }

    /// Super pods of 2, 2 and 1 servers after a loss: the lone server's pod goes (4 servers
    /// of 16 kept), not one server of each (3).
    #[test]
    fn super_pods_keep_as_many_servers_each() {
        let mut hosts: Vec<HostDevices> = (1..=5).map(|i| host(i, "910_9391", 16, &[])).collect();
        for (i, (h, pod)) in hosts
            .iter_mut()
            .zip(["p0", "p0", "p1", "p1", "p2"])
            .enumerate()
        {
            for (k, d) in h.devices.iter_mut().enumerate() {
                d.super_pod_id = Some(pod.into());
                // Unique within a pod: the server's place, then the device's.
                d.super_device_id = Some((i % 2 * 16 + k) as u32);
            }
        }
        let world = largest_world(Chip::Ascend910_93, &hosts, None);
        let servers: Vec<String> = shape(&world).into_iter().map(|(s, _)| s).collect();
        assert_eq!(servers.len(), 4, "{servers:?}");
        assert!(!servers.contains(&hosts[4].server_id), "{servers:?}");
        let table = build_table(
            &world,
            &BuildOptions {
                format: Format::V1_2,
                ..BuildOptions::default()
            },
        );
        assert!(table.is_ok(), "{table:?}");
        // Pods of 2 and 1: two of one pod and one of each keep as many devices; the tie goes
        // to more servers per pod.
        let world = largest_world(Chip::Ascend910_93, &hosts[2..], None);
        let servers: Vec<String> = shape(&world).into_iter().map(|(s, _)| s).collect();
        assert_eq!(
            servers,
            [hosts[2].server_id.clone(), hosts[3].server_id.clone()]
        );
    }

    /// Pods of A, B (16 each) and C (16), D (12): 16 per server balances to 32, 12 per server
    /// on all four is 48, and balanced already.
    #[test]
    fn super_pods_are_balanced_before_counts_are_compared() {
        let mut hosts: Vec<HostDevices> = (1..=4).map(|i| host(i, "910_9391", 16, &[])).collect();
        hosts[3].devices.truncate(12);
        for (i, (h, pod)) in hosts.iter_mut().zip(["p0", "p0", "p1", "p1"]).enumerate() {
            for (k, d) in h.devices.iter_mut().enumerate() {
                d.super_pod_id = Some(pod.into());
                d.super_device_id = Some((i % 2 * 16 + k) as u32);
            }
        }
        let world = largest_world(Chip::Ascend910_93, &hosts, None);
        assert_eq!(world.len(), 48, "{:?}", shape(&world));
        let world = largest_world(Chip::Ascend910_93, &hosts, Some(48));
        assert_eq!(world.len(), 48, "{:?}", shape(&world));
    }

    #[test]
    fn a_910_server_of_four_keeps_to_one_group() {
        // Server 1 has 0-3 dead except 3, and 4-7 whole; server 2 has 5 dead.
        let hosts = vec![host(1, "910", 8, &[0, 1, 2]), host(2, "910", 8, &[5])];
        let world = largest_world(Chip::Ascend910, &hosts, None);
        assert_eq!(
            shape(&world),
            vec![
                ("10.0.0.1".into(), vec![4, 5, 6, 7]),
                ("10.0.0.2".into(), vec![0, 1, 2, 3])
            ]
        );
        // At most 4 ranks: one server of 4 beats two of 2.
        let world = largest_world(Chip::Ascend910, &hosts, Some(4));
        assert_eq!(shape(&world), vec![("10.0.0.1".into(), vec![4, 5, 6, 7])]);
    }

    #[test]
    fn slots_cap_a_host_and_910b_servers_run_what_they_have() {
        let mut capped = host(1, "910", 8, &[]);
        capped.cap = Some(4);
        let world = largest_world(Chip::Ascend910, &[capped, host(2, "910", 8, &[])], None);
        assert_eq!(world.len(), 8, "two servers of 4 (the cap) beat one of 8");
        let hosts = vec![host(1, "910B3", 8, &[1, 6]), host(2, "910B3", 8, &[])];
        let world = largest_world(Chip::Ascend910B, &hosts, None);
        assert_eq!(world.len(), 14);
        assert_eq!(largest_world(Chip::Ascend910B, &hosts, Some(10)).len(), 10);
    }

    /// The table of `world`, which must be valid.
    fn valid_table(world: &[Device]) {
        let options = BuildOptions {
            format: Format::V1_0,
            ..BuildOptions::default()
        };
        if let Err(e) = build_table(world, &options) {
            panic!("{e}: {:?}", shape(world));
        }
    }

    #[test]
    fn a_device_without_an_address_leaves_its_host_out_of_a_world_of_several() {
        let mut hosts: Vec<HostDevices> = (1..=3).map(|i| host(i, "910", 8, &[])).collect();
        hosts[1].devices[3].ip = None;
        let world = largest_world(Chip::Ascend910, &hosts, None);
        assert_eq!(world.len(), 16, "{:?}", shape(&world));
        assert!(world.iter().all(|d| d.server_id != "10.0.0.2"));
        valid_table(&world);
        // Alone, the host needs no addresses: all 8 run.
        let alone = largest_world(Chip::Ascend910, &hosts[1..2], None);
        assert_eq!(alone.len(), 8);
        valid_table(&alone);
        // On 910B, where servers run what they have, only that device is left out.
        let b: Vec<HostDevices> = (1..=2)
            .map(|i| {
                let mut h = host(i, "910B3", 8, &[]);
                h.devices[3].ip = None;
                h
            })
            .collect();
        let world = largest_world(Chip::Ascend910B, &b, None);
        assert_eq!(world.len(), 14);
        valid_table(&world);
    }

    #[test]
    fn devices_sharing_an_address_are_left_out_of_a_world_of_several() {
        let mut hosts: Vec<HostDevices> = (1..=3).map(|i| host(i, "910", 8, &[])).collect();
        hosts[1].devices[3].ip = hosts[0].devices[3].ip;
        let world = largest_world(Chip::Ascend910, &hosts, None);
        // 3 × 4 (hosts 1 and 2 on 4-7), more than host 3's 8 alone.
        assert_eq!(world.len(), 12, "{:?}", shape(&world));
        let shared = |d: &&Device| d.physical_id == 3 && d.server_id != "10.0.0.3";
        assert!(!world.iter().any(|d| shared(&d)), "{:?}", shape(&world));
        valid_table(&world);
    }

    #[test]
    fn a_910_plan_keeps_to_its_eight_ids() {
        // Sixteen devices a host (simulated: no 910 has them), device 0 of the second dead.
        let hosts = vec![host(1, "910", 16, &[]), host(2, "910", 16, &[0])];
        let world = largest_world(Chip::Ascend910, &hosts, None);
        assert!(
            world.iter().all(|d| d.physical_id <= 7),
            "{:?}",
            shape(&world)
        );
        assert_eq!(world.len(), 8, "{:?}", shape(&world));
        valid_table(&world);
    }

    #[test]
    fn nothing_usable_is_an_empty_world() {
        let hosts = vec![host(1, "910", 2, &[0, 1])];
        assert!(largest_world(Chip::Ascend910, &hosts, None).is_empty());
        assert!(largest_world(Chip::Ascend910, &[], None).is_empty());
    }

    /// Every world the 910 rules allow, by brute force over every subset of every server: the
    /// sizes of valid server subsets, then every combination with one count for all servers.
    fn best_by_brute_force(hosts: &[HostDevices], max: usize) -> usize {
        let options: Vec<Vec<usize>> = hosts
            .iter()
            .map(|h| {
                let healthy: Vec<u32> = h
                    .devices
                    .iter()
                    .filter(|d| d.health.is_healthy())
                    .map(|d| d.physical_id)
                    .collect();
                let mut sizes = vec![0];
                for mask in 1u32..(1 << healthy.len()) {
                    let ids: Vec<u32> = (0..healthy.len())
                        .filter(|i| mask & (1 << i) != 0)
                        .map(|i| healthy[i])
                        .collect();
                    let n = ids.len();
                    let one_group = ids.iter().all(|&i| i < 4) || ids.iter().all(|&i| i >= 4);
                    let valid = n == 1 || n == 8 || ((n == 2 || n == 4) && one_group);
                    if valid && !sizes.contains(&n) {
                        sizes.push(n);
                    }
                }
                sizes
            })
            .collect();
        let mut best = 0;
        for per_server in [1, 2, 4, 8] {
            let servers = options.iter().filter(|o| o.contains(&per_server)).count();
            for used in 0..=servers {
                let world = used * per_server;
                if world <= max {
                    best = best.max(world);
                }
            }
        }
        best
    }

    proptest! {
        #[test]
        fn the_plan_is_valid_maximal_and_deterministic(
            dead in proptest::collection::vec(proptest::collection::vec(0u32..8, 0..5), 1..6),
            max in proptest::option::of(1u64..48),
        ) {
            let hosts: Vec<HostDevices> = dead
                .iter()
                .enumerate()
                .map(|(i, d)| host(i as u8 + 1, "910", 8, d))
                .collect();
            let world = largest_world(Chip::Ascend910, &hosts, max);
            let limit = max.map_or(usize::MAX, |m| m as usize);
            prop_assert_eq!(world.len(), best_by_brute_force(&hosts, limit));
            prop_assert!(world.iter().all(|d| d.health.is_healthy()));
            if !world.is_empty() {
                let table = build_table(
                    &world,
                    &BuildOptions { format: Format::V1_0, ..BuildOptions::default() },
                );
                prop_assert!(table.is_ok(), "{:?}", table.err());
            }
            prop_assert_eq!(shape(&world), shape(&largest_world(Chip::Ascend910, &hosts, max)));
        }

        #[test]
        fn devices_without_their_own_address_never_make_an_invalid_plan(
            dead in proptest::collection::vec(proptest::collection::vec(0u32..8, 0..3), 1..5),
            no_ip in proptest::collection::vec((0usize..5, 0usize..8), 0..4),
            shared in proptest::collection::vec(((0usize..5, 0usize..8), (0usize..5, 0usize..8)), 0..3),
            chip in prop_oneof![Just(("910", Chip::Ascend910)), Just(("910B3", Chip::Ascend910B))],
        ) {
            let mut hosts: Vec<HostDevices> = dead
                .iter()
                .enumerate()
                .map(|(i, d)| host(i as u8 + 1, chip.0, 8, d))
                .collect();
            let n = hosts.len();
            for (h, p) in no_ip {
                hosts[h % n].devices[p].ip = None;
            }
            for ((h, p), (g, q)) in shared {
                hosts[g % n].devices[q].ip = hosts[h % n].devices[p].ip;
            }
            let world = largest_world(chip.1, &hosts, None);
            prop_assert!(world.iter().all(|d| d.health.is_healthy()));
            if !world.is_empty() {
                let table = build_table(
                    &world,
                    &BuildOptions { format: Format::V1_0, ..BuildOptions::default() },
                );
                prop_assert!(table.is_ok(), "{:?}: {:?}", table.err(), shape(&world));
            }
        }

        #[test]
        fn equal_count_chips_get_a_valid_maximal_plan(
            healthy in proptest::collection::vec(0u32..=8, 1..6),
        ) {
            let hosts: Vec<HostDevices> = healthy
                .iter()
                .enumerate()
                .map(|(i, &n)| host(i as u8 + 1, "910_9391", 8, &(n..8).collect::<Vec<_>>()))
                .collect();
            let world = largest_world(Chip::Ascend910_93, &hosts, None);
            let best = (1..=8)
                .map(|c| c * healthy.iter().filter(|&&n| n as usize >= c).count())
                .max()
                .unwrap_or(0);
            prop_assert_eq!(world.len(), best);
            let counts: Vec<usize> = shape(&world).iter().map(|(_, ids)| ids.len()).collect();
            prop_assert!(counts.windows(2).all(|w| w[0] == w[1]), "{:?}", counts);
        }
    }
}
