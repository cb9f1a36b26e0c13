//! Format `1.2`'s super pods (Atlas A3): pods, their servers, super device ids.

use std::collections::HashMap;

use super::super::node::Node;
use super::{Loc, Rule, Validator, items};

impl Validator {
    /// The SuperPoD rules of version 1.2. `server_ids` maps each `server_id` to its index in
    /// `server_list`; `devices` holds (server index, super_device_id, where) of every device.
    pub(super) fn super_pods<'a, N: Node<'a>>(
        &mut self,
        pods: N,
        server_ids: &HashMap<&str, usize>,
        devices: &[(usize, Option<u32>, Loc)],
    ) {
        if pods.len().is_none() {
            self.push(
                "$.super_pod_list".into(),
                Rule::Structure,
                format!("must be an array, found {}", pods.describe().0),
            );
            return;
        }
        let mut pod_ids: HashMap<&str, String> = HashMap::new();
        // server index -> (super pod index, where the server is listed in it)
        let mut pod_of_server: HashMap<usize, (usize, String)> = HashMap::new();
        for (pi, pod) in items(pods) {
            let ppath = || format!("$.super_pod_list[{pi}]");
            let Some(pobj) = self.object(pod, &ppath) else {
                continue;
            };
            if let Some(id) = self.string(pobj, "super_pod_id", &ppath, true) {
                // HCCL: "super_pod_id is invalid or empty".
                if id.is_empty() {
                    self.push(
                        format!("{}.super_pod_id", ppath()),
                        Rule::SuperPod,
                        "super_pod_id is empty".into(),
                    );
                }
                self.name_length(id, || format!("{}.super_pod_id", ppath()));
                if let Some(first) = pod_ids.get(id) {
                    self.push(
                        format!("{}.super_pod_id", ppath()),
                        Rule::SuperPod,
                        format!("super_pod_id {id:?} is already used at {first}"),
                    );
                } else {
                    pod_ids.insert(id, format!("{}.super_pod_id", ppath()));
                }
            }
            let Some(list) = self.array(pobj, "server_list", &ppath) else {
                continue;
            };
            for (k, entry) in items(list) {
                let epath = || format!("$.super_pod_list[{pi}].server_list[{k}]");
                let Some(eobj) = self.object(entry, &epath) else {
                    continue;
                };
                let Some(sid) = self.string(eobj, "server_id", &epath, true) else {
                    continue;
                };
                match server_ids.get(sid) {
                    None => self.push(
                        format!("{}.server_id", epath()),
                        Rule::SuperPod,
                        format!("server {sid:?} is not in server_list"),
                    ),
                    Some(si) => {
                        if let Some((_, first)) = pod_of_server.get(si) {
                            self.push(
                                format!("{}.server_id", epath()),
                                Rule::SuperPod,
                                format!("server {sid:?} is already in a super pod at {first}"),
                            );
                        } else {
                            pod_of_server.insert(*si, (pi, format!("{}.server_id", epath())));
                        }
                    }
                }
            }
        }
        // Every super pod has as many servers (HCCL's `CheckSuperPodInfo`).
        let mut per_pod: std::collections::BTreeMap<usize, usize> = Default::default();
        for (pod, _) in pod_of_server.values() {
            *per_pod.entry(*pod).or_default() += 1;
        }
        let mut pods_counted = per_pod.iter();
        if let Some((&first_pod, &first_n)) = pods_counted.next() {
            for (&pod, &n) in pods_counted.filter(|&(_, &n)| n != first_n) {
                self.push(
                    format!("$.super_pod_list[{pod}].server_list"),
                    Rule::SuperPod,
                    format!(
                        "has {n} server{} but $.super_pod_list[{first_pod}] has {first_n}: HCCL \
                         requires as many servers in every super pod",
                        if n == 1 { "" } else { "s" }
                    ),
                );
            }
        }
        let mut unlisted: Vec<(usize, &str)> = server_ids
            .iter()
            .filter(|(_, si)| !pod_of_server.contains_key(si))
            .map(|(id, si)| (*si, *id))
            .collect();
        unlisted.sort_unstable();
        if !unlisted.is_empty() {
            let names: Vec<String> = unlisted.iter().map(|(_, id)| format!("{id:?}")).collect();
            self.push(
                "$.super_pod_list".into(),
                Rule::SuperPod,
                format!(
                    "servers {} of server_list are in no super pod",
                    names.join(", ")
                ),
            );
        }
        // Servers of one super pod are listed one after another in server_list.
        let mut order: Vec<usize> = Vec::new();
        let mut listed: Vec<usize> = server_ids.values().copied().collect();
        listed.sort_unstable();
        for si in listed {
            let Some(&(pod, _)) = pod_of_server.get(&si) else {
                continue;
            };
            if order.last() != Some(&pod) {
                if order.contains(&pod) {
                    // HCCL does not require it; rank order across pods is just less regular.
                    self.warn(
                        format!("$.server_list[{si}]"),
                        Rule::SuperPod,
                        format!(
                            "the servers of super pod $.super_pod_list[{pod}] are not listed \
                             one after another (HCCL accepts it)"
                        ),
                    );
                    break;
                }
                order.push(pod);
            }
        }
        // super_device_id is unique within a super pod.
        let mut seen: HashMap<(usize, u32), Loc> = HashMap::new();
        for &(si, sdid, loc) in devices {
            let (Some(sdid), Some(&(pod, _))) = (sdid, pod_of_server.get(&si)) else {
                continue;
            };
            if let Some(first) = seen.get(&(pod, sdid)) {
                self.push(
                    loc.key("super_device_id"),
                    Rule::SuperPod,
                    format!(
                        "super_device_id {sdid} is already used in the same super pod at {}",
                        first.key("super_device_id")
                    ),
                );
            } else {
                seen.insert((pod, sdid), loc);
            }
        }
    }
}
