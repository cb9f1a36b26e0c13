//! Merging single-server tables into one cluster table, like Ascend's `merge_hccl.py`, but checked.

use std::collections::HashMap;
use std::net::IpAddr;

use super::model::{ClusterTable, RankTable, STATUS_COMPLETED, SuperPodEntry};
use super::validate::{errors_fail, validate_table};
use crate::device::Chip;
use crate::error::{Error, Result};

/// One table to merge, with the name errors should use for it (usually its file name).
#[derive(Debug, Clone)]
pub struct MergeInput {
    /// How errors name this input.
    pub name: String,
    /// The table, already parsed and validated.
    pub table: RankTable,
}

/// Merges tables: servers in input order, each input's ranks in their own order after the
/// inputs before it (`rank_id`s renumbered from 0), `server_count` summed, super pods combined.
///
/// # Errors
///
/// [`Error::MergeConflict`] when a `server_id` or `device_ip` appears in two inputs (naming both),
/// [`Error::Merge`] for no input, legacy tables or mixed versions, [`Error::Invalid`] if the
/// merged table breaks a rule of `chip` (e.g. servers with different device counts on 910).
pub fn merge_tables(inputs: &[MergeInput], chip: Chip) -> Result<RankTable> {
    let mut tables: Vec<(&str, &ClusterTable)> = Vec::with_capacity(inputs.len());
    for input in inputs {
        match &input.table {
            RankTable::Cluster(t) => tables.push((&input.name, t)),
            RankTable::Legacy(_) => {
                return Err(Error::Merge(format!(
                    "{} is in the legacy group_list format; only versions 1.0 and 1.2 can be merged",
                    input.name
                )));
            }
        }
    }
    let Some((first_name, first)) = tables.first().copied() else {
        return Err(Error::Merge("no table to merge".into()));
    };
    if let Some((name, t)) = tables.iter().find(|(_, t)| t.version != first.version) {
        return Err(Error::Merge(format!(
            "{first_name} has version {:?} but {name} has version {:?}",
            first.version, t.version
        )));
    }

    let mut server_owner: HashMap<&str, &str> = HashMap::new();
    let mut ip_owner: HashMap<IpAddr, &str> = HashMap::new();
    for (name, t) in &tables {
        for s in &t.server_list {
            if let Some(prev) = server_owner.insert(&s.server_id, name) {
                return Err(conflict("server_id", s.server_id.clone(), prev, name));
            }
        }
    }
    for (name, t) in &tables {
        for s in &t.server_list {
            for d in &s.device {
                let addrs = d.device_ip.as_deref().unwrap_or_default().split(',');
                for ip in addrs.filter_map(|a| a.trim().parse::<IpAddr>().ok()) {
                    match ip_owner.get(&ip) {
                        Some(prev) if prev != name => {
                            return Err(conflict("device_ip", ip.to_string(), prev, name));
                        }
                        _ => {
                            ip_owner.insert(ip, name);
                        }
                    }
                }
            }
        }
    }

    // Top-level keys this model does not interpret are kept; two inputs may not disagree on one.
    let mut extra = serde_json::Map::new();
    let mut extra_owner: HashMap<&str, &str> = HashMap::new();
    for (name, t) in &tables {
        for (key, value) in &t.extra {
            match extra.get(key) {
                Some(existing) if existing != value => {
                    return Err(Error::Merge(format!(
                        "key {key:?} is {existing} in {} but {value} in {name}",
                        extra_owner.get(key.as_str()).copied().unwrap_or_default()
                    )));
                }
                Some(_) => {}
                None => {
                    extra.insert(key.clone(), value.clone());
                    extra_owner.insert(key, name);
                }
            }
        }
    }

    let mut server_list = Vec::new();
    let mut pods: Vec<SuperPodEntry> = Vec::new();
    // Each input keeps its own rank order (its devices need not be listed in it): its ranks
    // follow the inputs before it.
    let mut offset = 0usize;
    for (name, t) in &tables {
        let mut ranks = 0usize;
        for s in &t.server_list {
            let mut s = s.clone();
            for d in &mut s.device {
                let own: usize = d.rank_id.parse().map_err(|_| {
                    Error::Merge(format!(
                        "{name}: rank_id {:?} of device {} of server {} is not a number",
                        d.rank_id, d.device_id, s.server_id
                    ))
                })?;
                d.rank_id = (offset + own).to_string();
                ranks += 1;
            }
            server_list.push(s);
        }
        offset += ranks;
        for pod in t.super_pod_list.iter().flatten() {
            match pods.iter_mut().find(|p| p.super_pod_id == pod.super_pod_id) {
                Some(p) => p.server_list.extend(pod.server_list.iter().cloned()),
                None => pods.push(pod.clone()),
            }
        }
    }
    let merged = RankTable::Cluster(ClusterTable {
        version: first.version.clone(),
        server_count: Some(server_list.len().to_string()),
        server_list,
        // A table with super pods stays one, whichever input has them.
        super_pod_list: tables
            .iter()
            .any(|(_, t)| t.super_pod_list.is_some())
            .then_some(pods),
        status: STATUS_COMPLETED.into(),
        extra,
    });
    errors_fail(validate_table(&merged, chip), || {
        format!(
            "the merge of {}",
            tables.iter().map(|t| t.0).collect::<Vec<_>>().join(", ")
        )
    })
    .map(|_| merged)
}

fn conflict(what: &'static str, value: String, first: &str, second: &str) -> Error {
    Error::MergeConflict {
        what,
        value,
        first: first.to_string(),
        second: second.to_string(),
    }
}
