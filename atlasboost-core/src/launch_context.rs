//! How a worker process was started, read from its environment (SPEC §10).
//!
//! Each launcher leaves its own variables: `atlasboost run` its `ATLASBOOST_*` ones, Open MPI
//! `OMPI_COMM_WORLD_*`, MPICH's Hydra `PMI_*`, Slurm's `srun` `SLURM_*`, torchrun `RANK` and
//! friends. [`detect`] reads them through a lookup function (so tests need no process
//! environment) and checks them: a family of variables that is only partly set, a value that
//! is not a number, or a rank outside the world is an error naming the variables, never a
//! silent rank 0 (a typo like `SLURM_LOCAL_ID` once put every rank of a job on device 0).
//!
//! When several families are set, the most specific launcher wins: `atlasboost run`, then
//! torchrun (it usually runs inside another launcher's task, e.g. `srun torchrun ...`), then
//! Open MPI and MPICH (under Slurm, their processes inherit `SLURM_*` from the daemon's task),
//! then Slurm. Refinements:
//! - `atlasboost run`'s variables are inherited by anything its workers start; a torchrun or
//!   mpirun inside a worker wins when its rank or size differs from atlasboost's (once
//!   atlasboost's own are numbers: a malformed one is an error).
//! - torch's `RANK`/`WORLD_SIZE` that disagree with mpirun's (or MPICH's) own, without
//!   torchrun's `TORCHELASTIC_RUN_ID`, are an error naming both: more likely left over in the
//!   shell than set by a torchrun that mpirun started. (An mpirun started inside a torchrun
//!   worker inherits the run id, and torch's variables win there as before.)
//! - A family only partly set gives way to a complete one after it (`srun --mpi=pmi2` sets
//!   `PMI_RANK` and `PMI_SIZE` beside srun's variables); alone, it is an error. Slurm counts as
//!   set only with srun's per-task `SLURM_PROCID` or `SLURM_LOCALID`: `SLURM_NTASKS` alone is
//!   any shell of an allocation.

use std::fmt;

use crate::env_vars::EnvVars;
use crate::error::{Error, Result};

/// Which launcher started this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Launcher {
    /// `atlasboost run`: the table is written and every value is in `ATLASBOOST_*`.
    Atlasboost,
    /// torchrun (or anything setting `RANK`, `WORLD_SIZE`, `LOCAL_RANK`).
    Torchrun,
    /// Open MPI's `mpirun`.
    OpenMpi,
    /// MPICH's Hydra (`mpiexec`), Intel MPI.
    Mpich,
    /// Slurm's `srun`.
    Slurm,
}

impl Launcher {
    /// The launcher's name in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Launcher::Atlasboost => "atlasboost run",
            Launcher::Torchrun => "torchrun",
            Launcher::OpenMpi => "Open MPI",
            Launcher::Mpich => "MPICH",
            Launcher::Slurm => "Slurm",
        }
    }

    /// Whether its processes can rendezvous over MPI (when MPI support is built in).
    pub fn is_mpi(self) -> bool {
        matches!(self, Launcher::OpenMpi | Launcher::Mpich)
    }
}

impl fmt::Display for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A process's place in its job, as its launcher described it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchContext {
    /// Who started the process.
    pub launcher: Launcher,
    /// Its rank among all processes, as the launcher numbers them.
    pub rank: u32,
    /// How many processes the job has.
    pub size: u32,
    /// Its index among the processes of its host.
    pub local_rank: u32,
    /// How many processes run on its host, when the launcher says.
    pub local_size: Option<u32>,
    /// Its host's index, when the launcher says.
    pub node_rank: Option<u32>,
    /// The first host's address: `MASTER_ADDR`, or under Slurm the first host of the node
    /// list.
    pub master_addr: Option<String>,
    /// `MASTER_PORT`, when set.
    pub master_port: Option<u16>,
}

/// The most processes a job may have: far beyond any Ascend cluster, and few enough that a
/// table of every process fits in memory (a typo like `WORLD_SIZE=4000000000` must not
/// allocate one).
pub const MAX_PROCESSES: u32 = 1 << 20;

/// One launcher's variables: those that must all be set, and optional ones.
struct Family {
    launcher: Launcher,
    rank: &'static str,
    size: &'static str,
    local_rank: &'static str,
    local_size: Option<&'static str>,
    node_rank: Option<&'static str>,
}

/// In order of precedence (see the module's documentation).
const FAMILIES: [Family; 5] = [
    Family {
        launcher: Launcher::Atlasboost,
        rank: EnvVars::ATLASBOOST_RANK,
        size: EnvVars::ATLASBOOST_SIZE,
        local_rank: EnvVars::ATLASBOOST_LOCAL_RANK,
        local_size: Some(EnvVars::ATLASBOOST_LOCAL_SIZE),
        node_rank: Some(EnvVars::ATLASBOOST_NODE_RANK),
    },
    Family {
        launcher: Launcher::Torchrun,
        rank: EnvVars::RANK,
        size: EnvVars::WORLD_SIZE,
        local_rank: EnvVars::LOCAL_RANK,
        local_size: Some(EnvVars::LOCAL_WORLD_SIZE),
        node_rank: Some(EnvVars::GROUP_RANK),
    },
    Family {
        launcher: Launcher::OpenMpi,
        rank: EnvVars::OMPI_COMM_WORLD_RANK,
        size: EnvVars::OMPI_COMM_WORLD_SIZE,
        local_rank: EnvVars::OMPI_COMM_WORLD_LOCAL_RANK,
        local_size: Some(EnvVars::OMPI_COMM_WORLD_LOCAL_SIZE),
        // OMPI_COMM_WORLD_NODE_RANK counts across every job on the node: not a host index.
        node_rank: None,
    },
    Family {
        launcher: Launcher::Mpich,
        rank: EnvVars::PMI_RANK,
        size: EnvVars::PMI_SIZE,
        local_rank: EnvVars::MPI_LOCALRANKID,
        local_size: Some(EnvVars::MPI_LOCALNRANKS),
        node_rank: None,
    },
    Family {
        launcher: Launcher::Slurm,
        rank: EnvVars::SLURM_PROCID,
        size: EnvVars::SLURM_NTASKS,
        local_rank: EnvVars::SLURM_LOCALID,
        local_size: None,
        node_rank: Some(EnvVars::SLURM_NODEID),
    },
];

/// Reads how this process was started from its environment.
///
/// Returns `None` when no launcher's variables are set (a process started by hand: a world
/// of one).
///
/// # Errors
///
/// [`Error::LaunchEnv`] naming the variables, when a launcher's variables are only partly set,
/// are not numbers, or disagree (a rank outside the world, a local rank outside the host's
/// processes).
pub fn detect(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<LaunchContext>> {
    // An empty variable counts as unset: `RANK=` is how scripts often clear one.
    let get = |name: &str| get(name).filter(|v| !v.trim().is_empty());
    let required = |f: &Family| [f.rank, f.size, f.local_rank];
    let complete = |f: &Family| required(f).iter().all(|n| get(n).is_some());
    let present: Vec<&Family> = FAMILIES
        .iter()
        .filter(|f| {
            // `SLURM_NTASKS` alone is any shell of an allocation (`salloc`): only srun's
            // per-task variables say that srun started this process.
            let markers: &[&str] = if f.launcher == Launcher::Slurm {
                &[f.rank, f.local_rank]
            } else {
                &[f.rank, f.size, f.local_rank]
            };
            markers.iter().any(|n| get(n).is_some())
        })
        .collect();
    let Some(first) = present.first() else {
        return Ok(None);
    };
    // A partly set family gives way to a complete one after it (`srun --mpi=pmi2` sets
    // `PMI_RANK` and `PMI_SIZE` beside srun's own); alone, it is an error naming what is
    // missing.
    let Some(mut family) = present.iter().copied().find(|f| complete(f)) else {
        let names = required(first);
        let missing: Vec<&str> = names.iter().copied().filter(|n| get(n).is_none()).collect();
        let set: Vec<String> = names
            .iter()
            .filter_map(|n| get(n).map(|v| format!("{n}={v}")))
            .collect();
        return Err(Error::LaunchEnv(format!(
            "{} is set but {} {} not: {} needs all of {} to tell this process's place in the job",
            set.join(", "),
            missing.join(" and "),
            if missing.len() == 1 { "is" } else { "are" },
            first.launcher,
            names.join(", ")
        )));
    };
    // RANK/WORLD_SIZE that disagree with the MPI launcher's own, without torchrun's run id: a
    // torchrun started under mpirun sets `TORCHELASTIC_RUN_ID`; plain ones are more likely
    // left over in the shell from another launch, and would make every rank the same one.
    if family.launcher == Launcher::Torchrun
        && get(EnvVars::TORCHELASTIC_RUN_ID).is_none()
        && let Some(mpi) = present.iter().copied().find(|f| {
            matches!(f.launcher, Launcher::OpenMpi | Launcher::Mpich)
                && complete(f)
                && (get(f.rank) != get(family.rank) || get(f.size) != get(family.size))
        })
    {
        let show = |f: &Family| {
            [f.rank, f.size]
                .iter()
                .map(|n| format!("{n}={}", get(n).unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(Error::LaunchEnv(format!(
            "{} disagree with {}'s {}: left over from another launch? Unset {}, {} and {} \
             (or, for a torchrun started by {}, let torchrun set them)",
            show(family),
            mpi.launcher,
            show(mpi),
            family.rank,
            family.size,
            family.local_rank,
            mpi.launcher
        )));
    }
    // `atlasboost run`'s variables are inherited by whatever its worker starts. A torchrun or
    // mpirun started inside a worker numbers its own processes: when its rank or size
    // disagrees with atlasboost's, it is the inner launcher and wins.
    // (atlasboost's own must be numbers first: a malformed one is named below, not passed by.)
    let is_number = |name: &str| get(name).is_some_and(|v| v.trim().parse::<u32>().is_ok());
    if family.launcher == Launcher::Atlasboost
        && [family.rank, family.size, family.local_rank]
            .iter()
            .all(|n| is_number(n))
        && let Some(inner) = present.iter().copied().find(|f| {
            matches!(
                f.launcher,
                Launcher::Torchrun | Launcher::OpenMpi | Launcher::Mpich
            ) && complete(f)
                && (get(f.rank) != get(family.rank) || get(f.size) != get(family.size))
        })
    {
        family = inner;
    }
    let number = |name: &str| -> Result<Option<u32>> {
        get(name)
            .map(|v| {
                v.trim().parse::<u32>().map_err(|_| {
                    Error::LaunchEnv(format!(
                        "{name}={v} {} ({} sets it to a count or an index)",
                        not_a_count(&v),
                        family.launcher
                    ))
                })
            })
            .transpose()
    };
    let need = |name: &str| -> Result<u32> {
        number(name)?.ok_or_else(|| Error::LaunchEnv(format!("{name} is not set")))
    };
    let rank = need(family.rank)?;
    let size = need(family.size)?;
    let local_rank = need(family.local_rank)?;
    let local_size = family.local_size.map(number).transpose()?.flatten();
    let node_rank = family.node_rank.map(number).transpose()?.flatten();
    if size > MAX_PROCESSES {
        return Err(Error::LaunchEnv(format!(
            "{}={size}: more processes than atlasboost supports ({MAX_PROCESSES})",
            family.size
        )));
    }
    if size == 0 || rank >= size {
        return Err(Error::LaunchEnv(format!(
            "{}={rank} is not a rank of a job of {}={size}",
            family.rank, family.size
        )));
    }
    if let (Some(n), Some(name)) = (local_size, family.local_size)
        && (local_rank >= n || n > size)
    {
        return Err(Error::LaunchEnv(format!(
            "{}={local_rank} and {name}={n} disagree (a local rank must be below the host's \
             process count, which must not exceed {}={size})",
            family.local_rank, family.size
        )));
    }
    if local_rank >= size {
        return Err(Error::LaunchEnv(format!(
            "{}={local_rank} is not below {}={size}",
            family.local_rank, family.size
        )));
    }
    let master_port = get(EnvVars::MASTER_PORT)
        .map(|v| {
            v.trim()
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| {
                    Error::LaunchEnv(format!(
                        "{}={v} is not a TCP port (1-65535)",
                        EnvVars::MASTER_PORT
                    ))
                })
        })
        .transpose()?;
    let master_addr = match get(EnvVars::MASTER_ADDR) {
        Some(v) => Some(v.trim().to_string()),
        // Slurm places task 0 on the first node of the step: the first list that is set says
        // where, and one that does not parse is named (not taken for unset).
        None if family.launcher == Launcher::Slurm => [
            EnvVars::SLURM_STEP_NODELIST,
            EnvVars::SLURM_JOB_NODELIST,
            EnvVars::SLURM_NODELIST,
        ]
        .into_iter()
        .find_map(|name| get(name).map(|list| (name, list)))
        .map(|(name, list)| {
            crate::slurm::expand_hostlist(&list)
                .map(|hosts| hosts.into_iter().next())
                .map_err(|e| Error::LaunchEnv(format!("{name}={list:?}: {e}")))
        })
        .transpose()?
        .flatten(),
        None => None,
    };
    Ok(Some(LaunchContext {
        launcher: family.launcher,
        rank,
        size,
        local_rank,
        local_size,
        node_rank,
        master_addr,
        master_port,
    }))
}

/// What is wrong with `value`, which does not parse as a count or an index (a `u32`): said
/// as it is, so that `RANK=-1` is not called "not a number".
pub fn not_a_count(value: &str) -> &'static str {
    let value = value.trim();
    match value.parse::<i128>() {
        // `-0` parses as 0, which a count may be; the sign still makes it one no launcher sets.
        Ok(n) if n < 0 || value.starts_with('-') => "is negative",
        Ok(_) => "is too large",
        Err(_) => "is not a number",
    }
}

/// [`detect`] on this process's environment.
///
/// # Errors
///
/// As [`detect`].
pub fn detect_from_env() -> Result<Option<LaunchContext>> {
    // Read lossily: a value that is not UTF-8 is refused by name where it is parsed, not
    // taken for unset (`RANK=1\xff` is not "RANK is not set").
    detect(&|name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn detect_in(vars: &[(&str, &str)]) -> Result<Option<LaunchContext>> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        detect(&move |n| map.get(n).cloned())
    }

    fn message(vars: &[(&str, &str)]) -> String {
        match detect_in(vars) {
            Err(e) => e.to_string(),
            Ok(c) => panic!("expected an error for {vars:?}, got {c:?}"),
        }
    }

    #[test]
    fn nothing_set_is_a_world_of_one() {
        assert_eq!(detect_in(&[("HOME", "/root")]).ok(), Some(None));
        // Empty values count as unset.
        assert_eq!(
            detect_in(&[("RANK", ""), ("SLURM_PROCID", " ")]).ok(),
            Some(None)
        );
    }

    #[test]
    fn torchrun() {
        let c = detect_in(&[
            ("RANK", "5"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "4"),
            ("GROUP_RANK", "1"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
        ])
        .ok()
        .flatten();
        assert_eq!(
            c,
            Some(LaunchContext {
                launcher: Launcher::Torchrun,
                rank: 5,
                size: 8,
                local_rank: 1,
                local_size: Some(4),
                node_rank: Some(1),
                master_addr: Some("10.0.0.1".into()),
                master_port: Some(29500),
            })
        );
    }

    #[test]
    fn open_mpi_and_mpich() {
        let ompi = detect_in(&[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "3"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
            ("OMPI_COMM_WORLD_NODE_RANK", "7"),
        ])
        .ok()
        .flatten()
        .map(|c| (c.launcher, c.rank, c.local_rank, c.local_size, c.node_rank));
        assert_eq!(ompi, Some((Launcher::OpenMpi, 3, 3, Some(4), None)));
        let mpich = detect_in(&[
            ("PMI_RANK", "2"),
            ("PMI_SIZE", "16"),
            ("MPI_LOCALRANKID", "2"),
        ])
        .ok()
        .flatten()
        .map(|c| (c.launcher, c.rank, c.size, c.local_size));
        assert_eq!(mpich, Some((Launcher::Mpich, 2, 16, None)));
    }

    #[test]
    fn slurm_takes_the_first_node_of_the_step_as_master() {
        let c = detect_in(&[
            ("SLURM_PROCID", "9"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NODEID", "4"),
            ("SLURM_STEP_NODELIST", "npu[07-10,12],gpu1"),
        ])
        .ok()
        .flatten()
        .map(|c| (c.launcher, c.rank, c.node_rank, c.master_addr));
        assert_eq!(
            c,
            Some((Launcher::Slurm, 9, Some(4), Some("npu07".to_string())))
        );
        let first = |list: &str| {
            detect_in(&[
                ("SLURM_PROCID", "0"),
                ("SLURM_NTASKS", "2"),
                ("SLURM_LOCALID", "0"),
                ("SLURM_JOB_NODELIST", list),
            ])
            .map(|c| c.and_then(|c| c.master_addr))
        };
        assert_eq!(first("a1").unwrap(), Some("a1".into()));
        assert_eq!(first("x[3]").unwrap(), Some("x3".into()));
        // A list that does not parse is named, not taken for unset (which would blame
        // MASTER_ADDR).
        let e = first("node[1-").unwrap_err().to_string();
        assert!(e.starts_with("SLURM_JOB_NODELIST=\"node[1-\": "), "{e}");
    }

    #[test]
    fn a_malformed_atlasboost_rank_is_named_even_beside_torchs_variables() {
        let e = detect_in(&[
            ("ATLASBOOST_RANK", "abc"),
            ("ATLASBOOST_SIZE", "2"),
            ("ATLASBOOST_LOCAL_RANK", "0"),
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "0"),
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("ATLASBOOST_RANK=abc is not a number"), "{e}");
    }

    #[test]
    fn torchs_variables_left_over_under_mpirun_are_refused_naming_both() {
        let under_mpirun = [
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("LOCAL_RANK", "0"),
        ];
        let e = detect_in(&under_mpirun).unwrap_err().to_string();
        assert!(
            e.contains("RANK=0, WORLD_SIZE=1 disagree with")
                && e.contains("OMPI_COMM_WORLD_RANK=1, OMPI_COMM_WORLD_SIZE=2"),
            "{e}"
        );
        // A torchrun that mpirun started numbers its own workers: it wins.
        let mut torchrun = under_mpirun.to_vec();
        torchrun.push(("TORCHELASTIC_RUN_ID", "none"));
        let c = detect_in(&torchrun);
        assert_eq!(
            c.ok().flatten().map(|c| (c.launcher, c.rank)),
            Some((Launcher::Torchrun, 0))
        );
    }

    #[test]
    fn the_innermost_launcher_wins() {
        // srun torchrun ...: torchrun's worker also inherits the srun task's variables.
        let c = detect_in(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "0"),
            ("RANK", "9"),
            ("WORLD_SIZE", "16"),
            ("LOCAL_RANK", "1"),
        ]);
        assert_eq!(
            c.ok().flatten().map(|c| (c.launcher, c.rank)),
            Some((Launcher::Torchrun, 9))
        );
        // mpirun under Slurm: the ranks inherit the daemon task's SLURM_* variables.
        let c = detect_in(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
            ("SLURM_LOCALID", "0"),
            ("OMPI_COMM_WORLD_RANK", "6"),
            ("OMPI_COMM_WORLD_SIZE", "8"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "2"),
        ]);
        assert_eq!(
            c.ok().flatten().map(|c| (c.launcher, c.rank)),
            Some((Launcher::OpenMpi, 6))
        );
    }

    #[test]
    fn atlasboost_run_wins_unless_a_launcher_inside_a_worker_numbers_differently() {
        let launch = [
            ("ATLASBOOST_RANK", "3"),
            ("ATLASBOOST_SIZE", "8"),
            ("ATLASBOOST_LOCAL_RANK", "3"),
            ("ATLASBOOST_LOCAL_SIZE", "4"),
            ("ATLASBOOST_NODE_RANK", "0"),
            // atlasboost run sets the torch-style variables too, with the same values.
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "3"),
        ];
        let c = detect_in(&launch).ok().flatten();
        assert_eq!(
            c.map(|c| (c.launcher, c.rank, c.local_size, c.node_rank)),
            Some((Launcher::Atlasboost, 3, Some(4), Some(0)))
        );
        // torchrun started by that worker: its own numbering.
        let mut inner = launch.to_vec();
        inner.retain(|(k, _)| !["RANK", "WORLD_SIZE", "LOCAL_RANK"].contains(k));
        inner.extend([("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1")]);
        let c = detect_in(&inner).ok().flatten();
        assert_eq!(
            c.map(|c| (c.launcher, c.rank, c.size)),
            Some((Launcher::Torchrun, 1, 2))
        );
        // mpirun started by that worker.
        let mut inner = launch.to_vec();
        inner.extend([
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
        ]);
        let c = detect_in(&inner).ok().flatten();
        assert_eq!(c.map(|c| c.launcher), Some(Launcher::OpenMpi));
        // atlasboost run inside a Slurm batch script: the batch step's SLURM_* do not win.
        let mut batch = launch.to_vec();
        batch.extend([
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
            ("SLURM_LOCALID", "0"),
        ]);
        let c = detect_in(&batch).ok().flatten();
        assert_eq!(c.map(|c| c.launcher), Some(Launcher::Atlasboost));
    }

    #[test]
    fn an_allocation_shell_is_not_an_srun_task() {
        // salloc: SLURM_NTASKS without srun's per-task variables.
        assert_eq!(
            detect_in(&[("SLURM_NTASKS", "4"), ("SLURM_JOB_ID", "77")]).ok(),
            Some(None)
        );
    }

    #[test]
    fn a_partly_set_family_gives_way_to_a_complete_one() {
        // srun --mpi=pmi2: PMI_RANK and PMI_SIZE, no MPI_LOCALRANKID, and srun's own.
        let c = detect_in(&[
            ("PMI_RANK", "5"),
            ("PMI_SIZE", "8"),
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "1"),
        ]);
        assert_eq!(
            c.ok().flatten().map(|c| (c.launcher, c.rank, c.local_rank)),
            Some((Launcher::Slurm, 5, 1))
        );
    }

    #[test]
    fn absurd_sizes_and_port_0_are_refused() {
        let m = message(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "4000000000"),
            ("LOCAL_RANK", "0"),
        ]);
        assert!(
            m.contains("WORLD_SIZE=4000000000: more processes than atlasboost supports"),
            "{m}"
        );
        let m = message(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "0"),
            ("MASTER_PORT", "0"),
        ]);
        assert!(m.contains("MASTER_PORT=0 is not a TCP port"), "{m}");
    }

    #[test]
    fn a_half_set_family_names_what_is_missing() {
        let m = message(&[("SLURM_PROCID", "3"), ("SLURM_NTASKS", "8")]);
        assert!(m.contains("SLURM_PROCID=3, SLURM_NTASKS=8 is set"), "{m}");
        assert!(m.contains("SLURM_LOCALID is not"), "{m}");
        let m = message(&[("RANK", "0")]);
        assert!(m.contains("WORLD_SIZE and LOCAL_RANK are not"), "{m}");
        assert!(
            m.contains("torchrun needs all of RANK, WORLD_SIZE, LOCAL_RANK"),
            "{m}"
        );
    }

    #[test]
    fn bad_values_are_named() {
        let m = message(&[
            ("PMI_RANK", "two"),
            ("PMI_SIZE", "4"),
            ("MPI_LOCALRANKID", "0"),
        ]);
        assert!(m.contains("PMI_RANK=two is not a number"), "{m}");
        // A negative or oversized number is said as what it is.
        let m = message(&[("RANK", "-1"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "0")]);
        assert!(m.contains("RANK=-1 is negative"), "{m}");
        let m = message(&[("RANK", "-0"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "0")]);
        assert!(m.contains("RANK=-0 is negative"), "{m}");
        let m = message(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "4294967296"),
            ("LOCAL_RANK", "0"),
        ]);
        assert!(m.contains("WORLD_SIZE=4294967296 is too large"), "{m}");
        let m = message(&[("RANK", "4"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "0")]);
        assert!(
            m.contains("RANK=4 is not a rank of a job of WORLD_SIZE=4"),
            "{m}"
        );
        let m = message(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "2"),
            ("LOCAL_WORLD_SIZE", "2"),
        ]);
        assert!(
            m.contains("LOCAL_RANK=2 and LOCAL_WORLD_SIZE=2 disagree"),
            "{m}"
        );
        let m = message(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "0"),
            ("MASTER_PORT", "70000"),
        ]);
        assert!(m.contains("MASTER_PORT=70000 is not a TCP port"), "{m}");
    }
}
