//! Which devices a server may list together (the chip's groups) and equal counts across servers.

use super::{Loc, Rule, SeenDevice, Validator};
use crate::device::Chip;

impl Validator {
    /// Device ids of one server against the chip's topology.
    pub(super) fn server_topology(
        &mut self,
        devices: &[SeenDevice],
        list_path: &str,
        server_id: &str,
    ) {
        for d in devices {
            if let Some(id) = d.id
                && id > self.chip.max_device_id()
            {
                self.push(
                    d.loc.key("device_id"),
                    Rule::DeviceIdRange,
                    format!(
                        "device_id {id} is above {} (the highest on {})",
                        self.chip.max_device_id(),
                        self.chip
                    ),
                );
            }
        }
        // Sorting (stable: document order within an id) finds repeats without a map per server.
        let mut by_id: Vec<(u32, Loc)> = devices
            .iter()
            .filter_map(|d| d.id.map(|id| (id, d.loc)))
            .collect();
        by_id.sort_by_key(|&(id, _)| id);
        let mut first: Option<(u32, Loc)> = None;
        for &(id, loc) in &by_id {
            match first {
                Some((fid, floc)) if fid == id => self.push(
                    loc.key("device_id"),
                    Rule::DuplicateDevice,
                    format!(
                        "device {id} of server {server_id:?} is already listed at {}",
                        floc.path()
                    ),
                ),
                _ => first = Some((id, loc)),
            }
        }
        if self.chip == Chip::Ascend910 {
            let n = devices.len();
            if !self.chip.allows_device_count(n) {
                self.push(
                    list_path.to_string(),
                    Rule::DeviceCount,
                    format!("server {server_id:?} has {n} devices; a 910 server runs 1, 2, 4 or 8"),
                );
            } else if n == 2 || n == 4 {
                let ids: Vec<u32> = devices.iter().filter_map(|d| d.id).collect();
                let low = ids.iter().filter(|&&i| i < 4).count();
                if low != 0 && low != ids.len() {
                    let list = ids
                        .iter()
                        .map(|i| i.to_string())
                        .collect::<Vec<_>>()
                        .join(",");
                    self.push(
                        list_path.to_string(),
                        Rule::CrossesGroups,
                        format!(
                            "devices {list} of server {server_id:?} cross the 0-3 / 4-7 groups; \
                             a {n}-device 910 server must use devices from one group"
                        ),
                    );
                }
            }
        }
    }

    /// Unequal device counts per server (not a rule on 910B).
    pub(super) fn equal_counts(&mut self, counts: &[(String, String, usize)]) {
        if self.chip == Chip::Ascend910B {
            return;
        }
        let Some((first_path, first_id, first_n)) = counts.first() else {
            return;
        };
        for (path, id, n) in &counts[1..] {
            if n == first_n {
                continue;
            }
            if self.chip == Chip::Ascend910_93 {
                // Atlas A3: recommended, not required.
                self.warn(
                    path.clone(),
                    Rule::UnequalDeviceCounts,
                    format!(
                        "server {id:?} has {n} devices but server {first_id:?} ({first_path}) has \
                         {first_n}; HCCL recommends the same count on every 910_93 server"
                    ),
                );
            } else if self.chip.needs_equal_device_counts() {
                self.push(
                    path.clone(),
                    Rule::UnequalDeviceCounts,
                    format!(
                        "server {id:?} has {n} devices but server {first_id:?} ({first_path}) has {first_n}; \
                         HCCL needs the same count on every server (except on 910B)"
                    ),
                );
            }
        }
    }
}
