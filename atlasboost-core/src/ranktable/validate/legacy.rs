//! The legacy format (`group_list`, `instance_list`, `pod_name`).

use std::collections::HashMap;
use std::net::IpAddr;

use super::super::node::Node;
use super::{Families, Loc, Rule, SeenDevice, Validator, items};

/// The highest `device_id` HCCL's cloud-mode (legacy) parser takes.
const LEGACY_MAX_DEVICE_ID: u32 = 7;
impl Validator {
    /// The legacy `group_list` format.
    pub(super) fn legacy<'a, N: Node<'a>>(&mut self, top: N) {
        self.status(top);
        let Some(groups) = self.array(top, "group_list", &|| "$".into()) else {
            return;
        };
        let group_total = groups.len().unwrap_or(0);
        if let Some(n) = self.decimal(top, "group_count", &|| "$".into(), true)
            && n as usize != group_total
        {
            self.push(
                "$.group_count".into(),
                Rule::Count,
                format!("is {n} but group_list has {group_total} groups"),
            );
        }
        let total_instances: usize = items(groups)
            .filter_map(|(_, g)| g.get("instance_list").and_then(|l| l.len()))
            .sum();
        let mut pods: HashMap<String, String> = HashMap::new();
        let mut group_names: HashMap<String, String> = HashMap::new();
        let mut ips: Vec<(IpAddr, Loc)> = Vec::new();
        let mut families = Families::default();
        // Per server (in order of first appearance): its id, the devices list of its first
        // instance (where per-server facts are reported), and its devices.
        let mut per_server: Vec<(String, String, Vec<SeenDevice>)> = Vec::new();
        let mut slot_of: HashMap<String, usize> = HashMap::new();
        for (gi, group) in items(groups) {
            let gpath = || format!("$.group_list[{gi}]");
            let Some(gobj) = self.object(group, &gpath) else {
                continue;
            };
            // Required, and unique (HCCL's pool of group names); empty is allowed.
            if let Some(name) = self.string(gobj, "group_name", &gpath, true) {
                let at = format!("{}.group_name", gpath());
                self.name_length(name, || at.clone());
                if let Some(first) = group_names.get(name) {
                    self.push(
                        at,
                        Rule::DuplicateGroupName,
                        format!("group_name {name:?} is already used at {first}"),
                    );
                } else {
                    group_names.insert(name.to_string(), at);
                }
            }
            let Some(instances) = self.array(gobj, "instance_list", &gpath) else {
                continue;
            };
            let instance_total = instances.len().unwrap_or(0);
            if let Some(n) = self.decimal(gobj, "instance_count", &gpath, true)
                && n as usize != instance_total
            {
                self.push(
                    format!("{}.instance_count", gpath()),
                    Rule::Count,
                    format!("is {n} but instance_list has {instance_total} instances"),
                );
            }
            let mut device_total = 0usize;
            for (ii, inst) in items(instances) {
                let ipath = || format!("$.group_list[{gi}].instance_list[{ii}]");
                let Some(iobj) = self.object(inst, &ipath) else {
                    continue;
                };
                if let Some(pod) = self.string(iobj, "pod_name", &ipath, true) {
                    self.name_length(pod, || format!("{}.pod_name", ipath()));
                    if let Some(first) = pods.get(pod) {
                        self.push(
                            format!("{}.pod_name", ipath()),
                            Rule::DuplicatePodName,
                            format!("pod_name {pod:?} is already used at {first}"),
                        );
                    } else {
                        pods.insert(pod.to_string(), format!("{}.pod_name", ipath()));
                    }
                }
                let sid = self
                    .server_id(iobj, &ipath)
                    .map_or_else(|| format!("#{gi}.{ii}"), str::to_string);
                let Some(devices) = self.array(iobj, "devices", &ipath) else {
                    continue;
                };
                device_total += devices.len().unwrap_or(0);
                let slot = *slot_of.entry(sid.clone()).or_insert_with(|| {
                    per_server.push((sid.clone(), format!("{}.devices", ipath()), Vec::new()));
                    per_server.len() - 1
                });
                for (di, dev) in items(devices) {
                    let loc = Loc::Legacy {
                        group: gi,
                        instance: ii,
                        device: di,
                    };
                    let dpath = || loc.path();
                    let Some(dobj) = self.object(dev, &dpath) else {
                        continue;
                    };
                    let id = self.decimal(dobj, "device_id", &dpath, true);
                    per_server[slot].2.push(SeenDevice { id, loc });
                    match self.string(dobj, "device_ip", &dpath, false) {
                        Some(ip) => {
                            let needs_ips = total_instances > 1;
                            self.device_ip(ip, loc, &mut ips, &mut families, needs_ips, false);
                        }
                        None if dobj.get("device_ip").is_none() && total_instances > 1 => self
                            .push(
                                dpath(),
                                Rule::MissingDeviceIp,
                                "device_ip is required when the table has more than one instance"
                                    .into(),
                            ),
                        None => {}
                    }
                }
            }
            if let Some(n) = self.decimal(gobj, "device_count", &gpath, true)
                && n as usize != device_total
            {
                self.push(
                    format!("{}.device_count", gpath()),
                    Rule::Count,
                    format!("is {n} but the group's instances have {device_total} devices"),
                );
            }
        }
        let mut counts = Vec::new();
        for (sid, list_path, devices) in &per_server {
            // HCCL's cloud-mode parser takes device ids up to 7 whatever the chip (a chip that
            // allows fewer says so itself, in `server_topology`).
            if self.chip.max_device_id() > LEGACY_MAX_DEVICE_ID {
                for d in devices {
                    // (Above the chip's own highest, the chip's rule says so.)
                    if let Some(id) = d
                        .id
                        .filter(|&id| id > LEGACY_MAX_DEVICE_ID && id <= self.chip.max_device_id())
                    {
                        self.push(
                            d.loc.key("device_id"),
                            Rule::DeviceIdRange,
                            format!(
                                "device_id {id} is above {LEGACY_MAX_DEVICE_ID}, the highest \
                                 the legacy (cloud) format takes"
                            ),
                        );
                    }
                }
            }
            self.server_topology(devices, list_path, sid);
            counts.push((list_path.clone(), sid.clone(), devices.len()));
        }
        self.duplicate_ips(ips);
        self.ip_families(families, per_server.len());
        self.equal_counts(&counts);
    }
}
