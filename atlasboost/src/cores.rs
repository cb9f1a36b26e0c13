//! CPU binding (`--bind-cores`, and library mode's `ATLASBOOST_BIND_CORES=1`): which CPUs each
//! worker of a host runs on. From the NPUs' affinity (the driver's DCMI library) when it loads,
//! else an even split of the CPUs this process may use (its affinity, which a cgroup cpuset
//! restricts); never one CPU for two workers of a host.

use atlasboost_dsmi::Dcmi;
use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::unistd::Pid;

/// The CPUs this process may run on.
///
/// # Errors
///
/// The system's, when the affinity cannot be read.
pub fn allowed_cpus() -> nix::Result<Vec<usize>> {
    let set = sched_getaffinity(Pid::from_raw(0))?;
    Ok((0..CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect())
}

/// The CPUs of the whole host as this process's cgroup allows them (`cpuset.cpus.effective`
/// of a cgroup v2 hierarchy), else every online CPU: the same set for every rank of a host,
/// whatever a launcher already bound each to (mpirun's `--bind-to socket`).
pub fn host_cpus() -> Option<Vec<usize>> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|text| {
            text.lines().find_map(|l| l.strip_prefix("0::")).map(|p| {
                format!(
                    "/sys/fs/cgroup{}/cpuset.cpus.effective",
                    p.trim().trim_end_matches('/')
                )
            })
        });
    cgroup
        .into_iter()
        .chain(["/sys/devices/system/cpu/online".to_string()])
        .find_map(|path| std::fs::read_to_string(path).ok())
        .and_then(|text| atlasboost_dsmi::parse_cpu_list(&text))
}

/// The CPUs of each worker of a host, whose NPUs have these physical ids, in local-rank order,
/// within this process's allowed CPUs (the launcher's: it starts all its host's workers).
///
/// # Errors
///
/// Why a worker would get no CPU, or a DCMI library that fails (its message).
pub fn host_plan(physical_ids: &[u32]) -> Result<Vec<Vec<usize>>, String> {
    let allowed =
        allowed_cpus().map_err(|e| format!("cannot read this process's CPU affinity: {e}"))?;
    host_plan_within(&allowed, physical_ids)
}

/// [`host_plan`] within `allowed` CPUs.
///
/// # Errors
///
/// As [`host_plan`].
pub fn host_plan_within(
    allowed: &[usize],
    physical_ids: &[u32],
) -> Result<Vec<Vec<usize>>, String> {
    let chain = |e: &dyn std::error::Error| atlasboost_core::exchange::error_chain(e);
    let affinity = match Dcmi::load().map_err(|e| chain(&e))? {
        Some(dcmi) => Some(
            physical_ids
                .iter()
                .map(|&p| dcmi.affinity(p))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("{} ({})", chain(&e), dcmi.library().display()))?,
        ),
        None => None,
    };
    assign_cores(allowed, affinity.as_deref(), physical_ids.len())
}

/// Binds the calling thread (and the threads and processes it starts after) to `cpus`.
///
/// # Errors
///
/// The system's.
pub fn bind_current_thread(cpus: &[usize]) -> nix::Result<()> {
    let mut set = CpuSet::new();
    for &c in cpus {
        set.set(c)?;
    }
    sched_setaffinity(Pid::from_raw(0), &set)
}

/// The CPUs of each of `workers` workers, in local-rank order: never one CPU for two workers.
/// With the NPUs' affinities, workers whose NPUs share an affine range split it evenly
/// (contiguous pieces, in local-rank order); without, the allowed CPUs are split evenly. Only
/// `allowed` CPUs are ever given.
///
/// # Errors
///
/// Why a worker would get no CPU: more workers than allowed CPUs, or an NPU whose affine CPUs
/// are not allowed or already given.
pub fn assign_cores(
    allowed: &[usize],
    affinity: Option<&[Vec<usize>]>,
    workers: usize,
) -> Result<Vec<Vec<usize>>, String> {
    let split = |cpus: &[usize], n: usize| -> Vec<Vec<usize>> {
        (0..n)
            .map(|i| cpus[i * cpus.len() / n..(i + 1) * cpus.len() / n].to_vec())
            .collect()
    };
    let Some(affinity) = affinity else {
        if workers > allowed.len() {
            return Err(format!(
                "{workers} workers on this host but only {} CPUs allowed ({})",
                allowed.len(),
                cpu_ranges(allowed)
            ));
        }
        return Ok(split(allowed, workers));
    };
    let mut assigned: Vec<Vec<usize>> = vec![Vec::new(); affinity.len()];
    let mut taken: Vec<usize> = Vec::new();
    let mut done = vec![false; affinity.len()];
    for first in 0..affinity.len() {
        if done[first] {
            continue;
        }
        // The workers whose NPUs have this same range share it.
        let group: Vec<usize> = (first..affinity.len())
            .filter(|&i| affinity[i] == affinity[first])
            .collect();
        let free: Vec<usize> = affinity[first]
            .iter()
            .copied()
            .filter(|c| allowed.contains(c) && !taken.contains(c))
            .collect();
        if free.len() < group.len() {
            return Err(format!(
                "the NPU of local rank {first} is affine to CPUs {}, of which {} {} allowed and \
                 free, for {} worker{}",
                cpu_ranges(&affinity[first]),
                free.len(),
                if free.len() == 1 { "is" } else { "are" },
                group.len(),
                if group.len() == 1 { "" } else { "s" }
            ));
        }
        for (i, cpus) in group.iter().zip(split(&free, group.len())) {
            taken.extend(&cpus);
            assigned[*i] = cpus;
            done[*i] = true;
        }
    }
    Ok(assigned)
}

/// `0-3,8`: CPUs as Linux lists them.
pub fn cpu_ranges(cpus: &[usize]) -> String {
    id_ranges(cpus.iter().map(|&c| c as u64), ",")
}

/// Ids as a short list of ranges, ascending, joined by `sep`: `0-3, 5, 7-8`.
pub fn id_ranges(ids: impl IntoIterator<Item = u64>, sep: &str) -> String {
    let mut sorted: Vec<u64> = ids.into_iter().collect();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i;
        while j + 1 < sorted.len() && sorted[j + 1] == sorted[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            sorted[i].to_string()
        } else {
            format!("{}-{}", sorted[i], sorted[j])
        });
        i = j + 1;
    }
    parts.join(sep)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cores_are_split_evenly_or_by_affinity_and_never_shared() {
        let allowed: Vec<usize> = (0..8).collect();
        assert_eq!(
            assign_cores(&allowed, None, 3).unwrap(),
            vec![vec![0, 1], vec![2, 3, 4], vec![5, 6, 7]]
        );
        assert!(
            assign_cores(&[0, 1], None, 3)
                .unwrap_err()
                .contains("only 2 CPUs")
        );
        // NPUs 0-1 near CPUs 0-3, NPUs 2-3 near CPUs 4-7 (two NUMA nodes).
        let near = [
            vec![0, 1, 2, 3],
            vec![0, 1, 2, 3],
            vec![4, 5, 6, 7],
            vec![4, 5, 6, 7],
        ];
        assert_eq!(
            assign_cores(&allowed, Some(&near), 4).unwrap(),
            vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7]]
        );
        // A cpuset that allows only some of them: what is left is split, never shared.
        let got = assign_cores(&[0, 1, 4, 5], Some(&near), 4).unwrap();
        assert_eq!(got, vec![vec![0], vec![1], vec![4], vec![5]]);
        let e = assign_cores(&[0, 4, 5], Some(&near), 4).unwrap_err();
        assert!(e.contains("local rank 0") && e.contains("0-3"), "{e}");
        assert_eq!(cpu_ranges(&[5, 0, 1, 2, 8]), "0-2,5,8");
        assert_eq!(id_ranges([7, 0, 1, 2, 3, 5, 8], ", "), "0-3, 5, 7-8");
    }
}
