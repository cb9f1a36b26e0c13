//! The rank-table formats, as HCCL reads them and as Ascend's tools write them.
//!
//! Every scalar is a JSON string (HCCL rejects numbers). Struct fields are declared in the key
//! order `hccl_tools.py` and MindX write, so serialized tables look like theirs. Keys this model
//! does not know are kept (`extra`) so a merge does not drop `host_ip`, `container_ip` and friends.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{Error, Result, parse_name};

/// The `status` a table must have before HCCL uses it.
pub const STATUS_COMPLETED: &str = "completed";
/// The value `hccl_tools.py` writes for `host_nic_ip`.
pub const HOST_NIC_IP_RESERVED: &str = "reserve";
/// The group name of the legacy format (HCCL merges every group into this one).
pub const LEGACY_GROUP_NAME: &str = "hccl_world_group";

/// Which rank-table format to write (in JSON, as `--format` spells it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Format {
    /// Version `1.0`: Atlas 910 and 910B (A2).
    #[default]
    #[serde(rename = "1.0")]
    V1_0,
    /// Version `1.2`: Atlas A3 / SuperPoD (adds `super_device_id` and `super_pod_list`).
    #[serde(rename = "1.2")]
    V1_2,
    /// The `group_list` format of old TensorFlow stacks (no `version` key).
    #[serde(rename = "legacy")]
    Legacy,
}

impl Format {
    /// Every format, as `--format` spells it.
    pub const ALL: [Format; 3] = [Format::V1_0, Format::V1_2, Format::Legacy];

    /// The spelling used by `--format` (and the `version` value, for 1.0 and 1.2).
    pub fn as_str(self) -> &'static str {
        match self {
            Format::V1_0 => "1.0",
            Format::V1_2 => "1.2",
            Format::Legacy => "legacy",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Format {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        parse_name(&Format::ALL, Format::as_str, "format", s)
    }
}

/// A rank table in one of the formats HCCL reads.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum RankTable {
    /// Versions `1.0` and `1.2`.
    Cluster(ClusterTable),
    /// The `group_list` format.
    Legacy(LegacyTable),
}

/// A version `1.0` or `1.2` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterTable {
    /// `"1.0"` or `"1.2"`.
    pub version: String,
    /// The number of servers, as a string. HCCL tolerates its absence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_count: Option<String>,
    /// The servers, in rank order.
    pub server_list: Vec<ServerEntry>,
    /// SuperPoDs and their servers (version `1.2`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub super_pod_list: Option<Vec<SuperPodEntry>>,
    /// `"completed"` when the table is ready.
    pub status: String,
    /// Keys this model does not interpret, kept as they were.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One server of a `1.0`/`1.2` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerEntry {
    /// The server's id (atlasboost uses its IPv4 address), at most 64 characters.
    pub server_id: String,
    /// Its devices, in rank order.
    pub device: Vec<DeviceEntry>,
    /// `"reserve"` in tables written by `hccl_tools.py`; ignored by HCCL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_nic_ip: Option<String>,
    /// Keys this model does not interpret (`host_ip`, `container_ip`, ...).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One device (one rank) of a `1.0`/`1.2` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceEntry {
    /// The physical device id, decimal.
    pub device_id: String,
    /// The device's RoCE IP (several may be given, comma-separated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_ip: Option<String>,
    /// The NPU id inside its SuperPoD (version `1.2`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub super_device_id: Option<String>,
    /// The rank, decimal, `0..N-1` over the table.
    pub rank_id: String,
    /// Keys this model does not interpret (`device_port`, ...).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One SuperPoD of a `1.2` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SuperPodEntry {
    /// The SuperPoD's id.
    pub super_pod_id: String,
    /// Its servers, by `server_id`.
    pub server_list: Vec<SuperPodServer>,
    /// Keys this model does not interpret.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A server reference inside a SuperPoD.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SuperPodServer {
    /// A `server_id` of the table's `server_list`.
    pub server_id: String,
}

/// The legacy `group_list` table (no `version` key; HCCL's "cloud" mode).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LegacyTable {
    /// The number of groups, as a string.
    pub group_count: String,
    /// The groups; HCCL merges them all into `hccl_world_group`.
    pub group_list: Vec<GroupEntry>,
    /// `"completed"` when the table is ready.
    pub status: String,
    /// Keys this model does not interpret.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A group of the legacy format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupEntry {
    /// The group's name (HCCL merges every group into `hccl_world_group`; it may be absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_name: Option<String>,
    /// The number of devices over all instances.
    pub device_count: String,
    /// The number of instances.
    pub instance_count: String,
    /// The instances (pods); atlasboost writes one per server.
    pub instance_list: Vec<InstanceEntry>,
    /// Keys this model does not interpret.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// An instance (pod) of the legacy format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceEntry {
    /// The pod's devices.
    pub devices: Vec<LegacyDeviceEntry>,
    /// The pod's name; a worker's `RANK_ID` must equal it.
    pub pod_name: String,
    /// The server the pod runs on.
    pub server_id: String,
    /// Keys this model does not interpret.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A device of the legacy format (no `rank_id`: HCCL derives ranks).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LegacyDeviceEntry {
    /// The physical device id.
    pub device_id: String,
    /// The device's RoCE IP, required with more than one instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_ip: Option<String>,
    /// Keys this model does not interpret.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One rank of a table, with the numbers parsed: what a worker needs to find itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankEntry {
    /// The rank (`rank_id`; derived as HCCL does for the legacy format).
    pub rank: u32,
    /// The server's position in rank order (`GROUP_RANK`).
    pub node_rank: u32,
    /// The server.
    pub server_id: String,
    /// The device's physical id (`device_id`).
    pub physical_id: u32,
    /// The device's position among its server's ranks.
    pub local_rank: u32,
    /// How many ranks its server has.
    pub local_size: u32,
    /// The value a worker must put in `RANK_ID`: the rank, or the `pod_name` in the legacy format.
    pub rank_id_env: String,
}

impl RankTable {
    /// The table's format.
    pub fn format(&self) -> Format {
        match self {
            RankTable::Cluster(t) if t.version == Format::V1_2.as_str() => Format::V1_2,
            RankTable::Cluster(_) => Format::V1_0,
            RankTable::Legacy(_) => Format::Legacy,
        }
    }

    /// The table as JSON, indented by four spaces like `hccl_tools.py`, ending in a newline.
    pub fn to_json_pretty(&self) -> String {
        // About 110 bytes per rank in this layout: size the buffer once instead of regrowing
        // (and copying) it a dozen times for a large cluster.
        let mut out = Vec::with_capacity(256 + 128 * self.rank_count());
        let formatter = serde_json::ser::PrettyFormatter::with_indent(b"    ");
        let mut ser = serde_json::Serializer::with_formatter(&mut out, formatter);
        // Serializing string-only structs and maps into a Vec cannot fail.
        if self.serialize(&mut ser).is_err() {
            return String::new();
        }
        out.push(b'\n');
        String::from_utf8(out).unwrap_or_default()
    }

    /// Every rank of the table in rank order, with the numbers parsed.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] if an id is not a decimal number (the table was not validated).
    pub fn ranks(&self) -> Result<Vec<RankEntry>> {
        let bad = |path: String, what: &str, value: &str| Error::Invalid {
            origin: "the rank table".into(),
            violations: vec![super::Violation::new(
                path,
                super::Rule::NotDecimal,
                format!("{what} {value:?} is not a decimal number"),
            )],
        };
        let mut out = Vec::new();
        match self {
            RankTable::Cluster(t) => {
                for (si, server) in t.server_list.iter().enumerate() {
                    let local_size = server.device.len() as u32;
                    for (di, dev) in server.device.iter().enumerate() {
                        let path = |k: &str| format!("$.server_list[{si}].device[{di}].{k}");
                        let rank: u32 = dev
                            .rank_id
                            .parse()
                            .map_err(|_| bad(path("rank_id"), "rank_id", &dev.rank_id))?;
                        let physical_id: u32 = dev
                            .device_id
                            .parse()
                            .map_err(|_| bad(path("device_id"), "device_id", &dev.device_id))?;
                        out.push(RankEntry {
                            rank,
                            node_rank: si as u32,
                            server_id: server.server_id.clone(),
                            physical_id,
                            local_rank: di as u32,
                            local_size,
                            rank_id_env: dev.rank_id.clone(),
                        });
                    }
                }
                out.sort_by_key(|e| e.rank);
            }
            RankTable::Legacy(t) => {
                // HCCL orders servers by server_id (a std::map), then devices by physical id.
                let mut devices = Vec::new();
                for (gi, group) in t.group_list.iter().enumerate() {
                    for (ii, inst) in group.instance_list.iter().enumerate() {
                        for (di, dev) in inst.devices.iter().enumerate() {
                            let physical_id: u32 = dev.device_id.parse().map_err(|_| {
                                bad(
                                    format!(
                                        "$.group_list[{gi}].instance_list[{ii}].devices[{di}].device_id"
                                    ),
                                    "device_id",
                                    &dev.device_id,
                                )
                            })?;
                            devices.push((inst.server_id.as_str(), physical_id, &inst.pod_name));
                        }
                    }
                }
                devices.sort();
                let mut node_rank = 0u32;
                let mut start = 0usize;
                while start < devices.len() {
                    let server = devices[start].0;
                    let end = devices[start..]
                        .iter()
                        .position(|d| d.0 != server)
                        .map_or(devices.len(), |p| start + p);
                    for (local, &(server_id, physical_id, pod)) in
                        devices[start..end].iter().enumerate()
                    {
                        out.push(RankEntry {
                            rank: (start + local) as u32,
                            node_rank,
                            server_id: server_id.to_string(),
                            physical_id,
                            local_rank: local as u32,
                            local_size: (end - start) as u32,
                            rank_id_env: pod.clone(),
                        });
                    }
                    node_rank += 1;
                    start = end;
                }
            }
        }
        Ok(out)
    }

    /// The number of servers.
    pub fn server_count(&self) -> usize {
        match self {
            RankTable::Cluster(t) => t.server_list.len(),
            RankTable::Legacy(t) => {
                let mut ids: Vec<&str> = t
                    .group_list
                    .iter()
                    .flat_map(|g| g.instance_list.iter().map(|i| i.server_id.as_str()))
                    .collect();
                ids.sort_unstable();
                ids.dedup();
                ids.len()
            }
        }
    }

    /// The number of ranks (devices).
    pub fn rank_count(&self) -> usize {
        match self {
            RankTable::Cluster(t) => t.server_list.iter().map(|s| s.device.len()).sum(),
            RankTable::Legacy(t) => t
                .group_list
                .iter()
                .flat_map(|g| &g.instance_list)
                .map(|i| i.devices.len())
                .sum(),
        }
    }
}
