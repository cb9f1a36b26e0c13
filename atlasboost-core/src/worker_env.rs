//! The environment each worker gets (SPEC §9), as a function of the table and the worker (and
//! of the symbolic links on the table's path, which the frameworks' variables leave out).

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::env_vars::EnvVars;
use crate::error::{Error, Result, parse_name};
use crate::ranktable::{RankEntry, RankTable};
use crate::world::World;

/// The training framework, which decides a few extra variables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Framework {
    /// TensorFlow with the TF adapter (the original tool's default).
    #[default]
    Tensorflow,
    /// MindSpore (adds `MINDSPORE_HCCL_CONFIG_PATH`).
    Mindspore,
    /// PyTorch with torch_npu.
    Pytorch,
}

impl Framework {
    /// Every framework, as `--framework` spells it.
    pub const ALL: [Framework; 3] = [
        Framework::Tensorflow,
        Framework::Mindspore,
        Framework::Pytorch,
    ];

    /// The spelling used by `--framework` and `init(frame=...)`.
    pub fn as_str(self) -> &'static str {
        match self {
            Framework::Tensorflow => "tensorflow",
            Framework::Mindspore => "mindspore",
            Framework::Pytorch => "pytorch",
        }
    }
}

impl fmt::Display for Framework {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Framework {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        parse_name(&Framework::ALL, Framework::as_str, "framework", s)
    }
}

/// Where one worker sits in the job: its device's entry in the table and the job's size. It is
/// all a worker's environment needs from the table, so a process that is sent only its seat
/// (library mode over ZeroMQ) needs no table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seat {
    /// The worker's host.
    pub server_id: String,
    /// The physical id of the worker's device.
    pub physical_id: u32,
    /// What `RANK_ID` must hold: the rank, or the `pod_name` in the legacy format.
    pub rank_id_env: String,
    /// Its place in the job as the table gives it.
    pub world: World,
}

impl Seat {
    /// The seat of device `physical_id` of host `server_id` in `table`.
    ///
    /// # Errors
    ///
    /// [`Error::NotInTable`] if the table has no such device, and the table's own errors.
    pub fn find(table: &RankTable, server_id: &str, physical_id: u32) -> Result<Seat> {
        let ranks = table.ranks()?;
        let entry: &RankEntry = ranks
            .iter()
            .find(|e| e.server_id == server_id && e.physical_id == physical_id)
            .ok_or_else(|| Error::NotInTable {
                server_id: server_id.to_string(),
                physical_id,
            })?;
        Ok(Seat::of(entry, ranks.len(), table.server_count()))
    }

    /// Every seat of `table`, in rank order: one pass, where [`Seat::find`] for each would be
    /// quadratic.
    ///
    /// # Errors
    ///
    /// The table's own errors.
    pub fn all(table: &RankTable) -> Result<Vec<Seat>> {
        let ranks = table.ranks()?;
        let servers = table.server_count();
        Ok(ranks
            .iter()
            .map(|e| Seat::of(e, ranks.len(), servers))
            .collect())
    }

    fn of(entry: &RankEntry, size: usize, node_count: usize) -> Seat {
        Seat {
            server_id: entry.server_id.clone(),
            physical_id: entry.physical_id,
            rank_id_env: entry.rank_id_env.clone(),
            world: World {
                rank: entry.rank,
                size: size as u32,
                local_rank: entry.local_rank,
                local_size: entry.local_size,
                node_rank: entry.node_rank,
                node_count: node_count as u32,
            },
        }
    }
}

/// Everything about one worker that the environment depends on.
#[derive(Debug, Clone)]
pub struct WorkerSpec<'a> {
    /// Where the worker sits in the job ([`Seat::find`] in the cluster table).
    pub seat: &'a Seat,
    /// Where the table is on the worker's host; must be absolute.
    pub table_path: &'a Path,
    /// The logical id of that device in the worker's runtime.
    pub logical_id: u32,
    /// The framework.
    pub framework: Framework,
    /// The job's id: letters, digits, `-` and `_`.
    pub job_id: &'a str,
    /// The first node's address.
    pub master_addr: &'a str,
    /// A free port on the first node.
    pub master_port: u16,
}

/// The variables to give a worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerEnv {
    /// The worker's place in the job, as the table says.
    pub world: World,
    /// Variables to set, overriding the inherited environment.
    pub set: Vec<(&'static str, String)>,
    /// Variables to set only if the inherited environment does not have them.
    pub set_if_unset: Vec<(&'static str, String)>,
}

/// `HCCL_CONNECT_TIMEOUT` unless the user set one: HCCL's default of 120 s is short for a large
/// job's first connection, and torch_npu warns below 300 s in rank-table mode.
pub const HCCL_CONNECT_TIMEOUT_SECS: u32 = 600;

/// The variables every worker gets unless its environment already has them (SPEC §9): one
/// OpenMP thread (else each of 8 workers starts one per core), and [`HCCL_CONNECT_TIMEOUT_SECS`].
/// The same for every worker: what a launcher that starts workers without knowing their seat
/// (`run --mpi`'s relays) sets too, before the worker starts, where OpenMP reads it.
pub fn defaults_unless_set() -> Vec<(&'static str, String)> {
    vec![
        (EnvVars::OMP_NUM_THREADS, "1".into()),
        (
            EnvVars::HCCL_CONNECT_TIMEOUT,
            HCCL_CONNECT_TIMEOUT_SECS.to_string(),
        ),
    ]
}

/// `path` without symbolic links: the real path of the file, or of its directory while the file
/// is not there yet; `path` itself when neither can be resolved.
fn real_path(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| match (path.parent(), path.file_name()) {
        (Some(dir), Some(name)) => {
            std::fs::canonicalize(dir).map_or_else(|_| path.to_path_buf(), |d| d.join(name))
        }
        _ => path.to_path_buf(),
    })
}

/// A rank table's path as the text `RANK_TABLE_FILE` gives the frameworks.
///
/// # Errors
///
/// [`Error::BadPath`] for a path that is not UTF-8: refused by name rather than passed on with
/// its bad bytes replaced (the path of a file that does not exist); and for one HCCL would not
/// load as `RANK_TABLE_FILE` gives it, without symbolic links
/// ([`crate::ranktable::hccl_name_problem`]: `/jobs/a.json.d/rank_table.json`).
pub fn table_path_text(path: &Path) -> Result<String> {
    let text = path_text(path)?;
    hccl_real_path(path)?;
    Ok(text)
}

/// `path` without symbolic links, as `RANK_TABLE_FILE` gives it, if HCCL loads it there
/// (see [`table_path_text`]).
fn hccl_real_path(path: &Path) -> Result<PathBuf> {
    let real = real_path(path);
    match crate::ranktable::hccl_name_problem(&real) {
        None => Ok(real),
        Some(reason) => Err(Error::BadPath {
            path: path.to_path_buf(),
            reason: match real == path {
                true => reason,
                false => format!("is {} without symbolic links: {reason}", real.display()),
            },
        }),
    }
}

/// `path` as text, refusing one that is not UTF-8 (see [`table_path_text`]).
fn path_text(path: &Path) -> Result<String> {
    path.to_str()
        .map(str::to_string)
        .ok_or_else(|| Error::BadPath {
            path: path.to_path_buf(),
            reason: "is not UTF-8, and RANK_TABLE_FILE is read as text: put the rank table \
                 (--rank-table, or --wdir's directory) on a path that is"
                .into(),
        })
}

/// Computes a worker's environment from its seat in the table.
///
/// # Errors
///
/// [`Error::BadPath`] if the table path is relative, [`Error::InvalidValue`] for a job id
/// TensorFlow would refuse.
pub fn worker_env(spec: &WorkerSpec<'_>) -> Result<WorkerEnv> {
    if !spec.table_path.is_absolute() {
        return Err(Error::BadPath {
            path: spec.table_path.to_path_buf(),
            reason: "RANK_TABLE_FILE must be an absolute path".into(),
        });
    }
    check_job_id(spec.job_id)?;
    let seat = spec.seat;
    let world = seat.world;
    let path = path_text(spec.table_path)?;
    // What the frameworks read has no symbolic link: torch_npu refuses a RANK_TABLE_FILE
    // that is one. atlasboost's own variable keeps the path given (its lock is beside it).
    let real = path_text(&hccl_real_path(spec.table_path)?)?;
    let logical = spec.logical_id.to_string();
    let mut set = vec![
        (EnvVars::RANK_TABLE_FILE, real.clone()),
        (EnvVars::RANK_ID, seat.rank_id_env.clone()),
        (EnvVars::RANK_SIZE, world.size.to_string()),
        (EnvVars::DEVICE_ID, logical.clone()),
        (EnvVars::ASCEND_DEVICE_ID, logical.clone()),
        (EnvVars::JOB_ID, spec.job_id.to_string()),
        (EnvVars::RANK, world.rank.to_string()),
        (EnvVars::WORLD_SIZE, world.size.to_string()),
        (EnvVars::LOCAL_RANK, world.local_rank.to_string()),
        (EnvVars::LOCAL_WORLD_SIZE, world.local_size.to_string()),
        (EnvVars::GROUP_RANK, world.node_rank.to_string()),
        (EnvVars::MASTER_ADDR, spec.master_addr.to_string()),
        (EnvVars::MASTER_PORT, spec.master_port.to_string()),
        (EnvVars::PYTHONUNBUFFERED, "1".into()),
        (EnvVars::ATLASBOOST_RANK, world.rank.to_string()),
        (EnvVars::ATLASBOOST_SIZE, world.size.to_string()),
        (EnvVars::ATLASBOOST_LOCAL_RANK, world.local_rank.to_string()),
        (EnvVars::ATLASBOOST_LOCAL_SIZE, world.local_size.to_string()),
        (EnvVars::ATLASBOOST_NODE_RANK, world.node_rank.to_string()),
        (EnvVars::ATLASBOOST_NODE_COUNT, world.node_count.to_string()),
        (EnvVars::ATLASBOOST_DEVICE_ID, logical),
        (
            EnvVars::ATLASBOOST_PHYSICAL_ID,
            seat.physical_id.to_string(),
        ),
        (EnvVars::ATLASBOOST_SERVER_ID, seat.server_id.clone()),
        (EnvVars::ATLASBOOST_RANK_TABLE_FILE, path.clone()),
        (EnvVars::ATLASBOOST_FRAMEWORK, spec.framework.to_string()),
        (EnvVars::ATLASBOOST_JOB_ID, spec.job_id.to_string()),
    ];
    match spec.framework {
        Framework::Mindspore => set.push((EnvVars::MINDSPORE_HCCL_CONFIG_PATH, real)),
        // The adapter reads POD_NAME before RANK_ID: an inherited one must not change the rank.
        Framework::Tensorflow => set.push((EnvVars::POD_NAME, seat.rank_id_env.clone())),
        Framework::Pytorch => {}
    }
    Ok(WorkerEnv {
        world,
        set,
        set_if_unset: defaults_unless_set(),
    })
}

/// Variables of [`worker_env`]'s `set` that a user may give every worker instead (`-x`): the
/// job's name and meeting point, and Python's buffering. Every other one is the worker's seat
/// in the table or the job's shape ([`set_from_the_table`]), so one value for every worker
/// would contradict the table.
pub const USER_MAY_SET: [&str; 4] = [
    EnvVars::JOB_ID,
    EnvVars::MASTER_ADDR,
    EnvVars::MASTER_PORT,
    EnvVars::PYTHONUNBUFFERED,
];

/// Whether [`worker_env`] sets `name` from the worker's seat in the table or the job's shape
/// for `framework` (`RANK_ID`, `WORLD_SIZE`, `RANK_TABLE_FILE`, `POD_NAME` for TensorFlow, ...):
/// a launcher refuses to export such a name to every worker.
pub fn set_from_the_table(name: &str, framework: Framework) -> bool {
    const PER_WORKER: [&str; 22] = [
        EnvVars::RANK_TABLE_FILE,
        EnvVars::RANK_ID,
        EnvVars::RANK_SIZE,
        EnvVars::DEVICE_ID,
        EnvVars::ASCEND_DEVICE_ID,
        EnvVars::RANK,
        EnvVars::WORLD_SIZE,
        EnvVars::LOCAL_RANK,
        EnvVars::LOCAL_WORLD_SIZE,
        EnvVars::GROUP_RANK,
        EnvVars::ATLASBOOST_RANK,
        EnvVars::ATLASBOOST_SIZE,
        EnvVars::ATLASBOOST_LOCAL_RANK,
        EnvVars::ATLASBOOST_LOCAL_SIZE,
        EnvVars::ATLASBOOST_NODE_RANK,
        EnvVars::ATLASBOOST_NODE_COUNT,
        EnvVars::ATLASBOOST_DEVICE_ID,
        EnvVars::ATLASBOOST_PHYSICAL_ID,
        EnvVars::ATLASBOOST_SERVER_ID,
        EnvVars::ATLASBOOST_RANK_TABLE_FILE,
        EnvVars::ATLASBOOST_FRAMEWORK,
        EnvVars::ATLASBOOST_JOB_ID,
    ];
    PER_WORKER.contains(&name)
        || match framework {
            Framework::Tensorflow => name == EnvVars::POD_NAME,
            Framework::Mindspore => name == EnvVars::MINDSPORE_HCCL_CONFIG_PATH,
            Framework::Pytorch => false,
        }
}

/// TensorFlow's rule for `JOB_ID`: letters, digits, `-`, `_`; not all digits with a leading 0.
fn check_job_id(id: &str) -> Result<()> {
    let bad = |reason: &str| Error::invalid_value(EnvVars::JOB_ID, id, reason);
    if id.is_empty() {
        return Err(bad("must not be empty"));
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(bad("may hold only letters, digits, '-' and '_'"));
    }
    if id.len() > 1 && id.starts_with('0') && id.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad("an all-digit job id must not start with 0"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::net::IpAddr;

    use super::*;
    use crate::device::{Device, Health};
    use crate::ranktable::{BuildOptions, Format, build_table};

    fn table(format: Format) -> RankTable {
        let devices: Vec<Device> = [("10.0.0.2", 2u8), ("10.0.0.1", 1)]
            .iter()
            .flat_map(|&(server, third)| {
                (4..8).map(move |p| Device {
                    server_id: server.into(),
                    logical_id: p - 4,
                    physical_id: p,
                    ip: Some(IpAddr::from([192, 168, third, p as u8])),
                    chip: "910".into(),
                    health: Health::Healthy,
                    super_device_id: None,
                    super_pod_id: None,
                })
            })
            .collect();
        build_table(
            &devices,
            &BuildOptions {
                format,
                ..BuildOptions::default()
            },
        )
        .unwrap()
    }

    /// Device 6 of 10.0.0.2.
    fn seat(table: &RankTable) -> Seat {
        Seat::find(table, "10.0.0.2", 6).unwrap()
    }

    fn spec(seat: &Seat, framework: Framework) -> WorkerSpec<'_> {
        WorkerSpec {
            seat,
            table_path: Path::new("/job/rank_table.json"),
            logical_id: 2,
            framework,
            job_id: "job-7",
            master_addr: "10.0.0.1",
            master_port: 29500,
        }
    }

    /// Every variable `worker_env` sets is either the user's to give (`USER_MAY_SET`) or
    /// refused by `set_from_the_table`, for each framework: a variable added to one list and
    /// not the other fails here.
    #[test]
    fn every_variable_set_is_either_the_users_or_the_tables() {
        let t = table(Format::V1_0);
        for framework in Framework::ALL {
            let env = worker_env(&spec(&seat(&t), framework)).unwrap();
            for (name, _) in &env.set {
                assert_ne!(
                    USER_MAY_SET.contains(name),
                    set_from_the_table(name, framework),
                    "{name} with {framework}"
                );
            }
            // Nothing outside what is set is refused.
            for name in [
                "OMP_NUM_THREADS",
                "HCCL_CONNECT_TIMEOUT",
                "ASCEND_GLOBAL_LOG_LEVEL",
            ] {
                assert!(!set_from_the_table(name, framework), "{name}");
            }
        }
        assert!(!set_from_the_table("POD_NAME", Framework::Pytorch));
        assert!(!set_from_the_table(
            "MINDSPORE_HCCL_CONFIG_PATH",
            Framework::Tensorflow
        ));
    }

    #[test]
    fn the_worker_finds_itself_in_the_table() {
        let t = table(Format::V1_0);
        let env = worker_env(&spec(&seat(&t), Framework::Tensorflow)).unwrap();
        let vars: HashMap<_, _> = env.set.iter().cloned().collect();
        // 10.0.0.2 sorts after 10.0.0.1: its devices 4..7 are ranks 4..7; device 6 is rank 6.
        assert_eq!(vars["RANK_ID"], "6");
        assert_eq!(vars["RANK"], "6");
        assert_eq!(vars["RANK_SIZE"], "8");
        assert_eq!(vars["WORLD_SIZE"], "8");
        assert_eq!(vars["LOCAL_RANK"], "2");
        assert_eq!(vars["LOCAL_WORLD_SIZE"], "4");
        assert_eq!(vars["GROUP_RANK"], "1");
        assert_eq!(vars["DEVICE_ID"], "2", "logical id, not physical");
        assert_eq!(vars["ASCEND_DEVICE_ID"], "2");
        assert_eq!(vars["ATLASBOOST_PHYSICAL_ID"], "6");
        assert_eq!(vars["RANK_TABLE_FILE"], "/job/rank_table.json");
        assert_eq!(vars["JOB_ID"], "job-7");
        assert_eq!(vars["MASTER_PORT"], "29500");
        assert!(!vars.contains_key("MINDSPORE_HCCL_CONFIG_PATH"));
        assert_eq!(
            vars["POD_NAME"], "6",
            "TensorFlow's adapter reads it before RANK_ID"
        );
        assert_eq!(
            env.set_if_unset,
            vec![
                ("OMP_NUM_THREADS", "1".to_string()),
                ("HCCL_CONNECT_TIMEOUT", "600".to_string())
            ]
        );
        assert_eq!(
            env.world,
            World {
                rank: 6,
                size: 8,
                local_rank: 2,
                local_size: 4,
                node_rank: 1,
                node_count: 2
            }
        );
    }

    #[test]
    fn mindspore_gets_its_config_path_and_legacy_uses_pod_names() {
        let t = table(Format::V1_0);
        let env = worker_env(&spec(&seat(&t), Framework::Mindspore)).unwrap();
        assert!(
            env.set
                .contains(&("MINDSPORE_HCCL_CONFIG_PATH", "/job/rank_table.json".into()))
        );
        assert!(!env.set.iter().any(|(k, _)| *k == "POD_NAME"));
        let t = table(Format::Legacy);
        let env = worker_env(&spec(&seat(&t), Framework::Tensorflow)).unwrap();
        assert!(
            env.set.contains(&("RANK_ID", "1".into())),
            "pod_name of the second server"
        );
        assert!(
            env.set.contains(&("POD_NAME", "1".into())),
            "the same pod_name"
        );
        assert!(env.set.contains(&("RANK", "6".into())));
    }

    /// torch_npu refuses a `RANK_TABLE_FILE` that is a symbolic link: the frameworks get the
    /// real path (of the file, or of its directory before it is written), atlasboost's own
    /// variable the path given.
    #[test]
    fn the_frameworks_get_the_tables_real_path() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::fs::write(real.join("t.json"), "{}").unwrap();
        let link = dir.path().join("rt.json");
        std::os::unix::fs::symlink("real/t.json", &link).unwrap();
        let linked_dir = dir.path().join("lnk");
        std::os::unix::fs::symlink("real", &linked_dir).unwrap();
        let t = table(Format::V1_0);
        let seat = seat(&t);
        let real_of = |given: &Path| std::fs::canonicalize(given.parent().unwrap()).unwrap();
        for (given, want) in [
            (link.clone(), real_of(&link).join("real/t.json")),
            // Not written yet: its directory's real path.
            (
                linked_dir.join("new.json"),
                real_of(&link).join("real/new.json"),
            ),
        ] {
            let env = worker_env(&WorkerSpec {
                table_path: &given,
                ..spec(&seat, Framework::Mindspore)
            })
            .unwrap();
            let get = |name: &str| env.set.iter().find(|(k, _)| *k == name).unwrap().1.clone();
            let want = want.display().to_string();
            assert_eq!(get("RANK_TABLE_FILE"), want);
            assert_eq!(get("MINDSPORE_HCCL_CONFIG_PATH"), want);
            assert_eq!(
                get("ATLASBOOST_RANK_TABLE_FILE"),
                given.display().to_string()
            );
        }
    }

    #[test]
    fn bad_inputs_are_refused_with_the_culprit() {
        let t = table(Format::V1_0);
        let err = Seat::find(&t, "10.0.0.2", 1).unwrap_err().to_string();
        assert!(err.contains("physical id 1 of server 10.0.0.2"), "{err}");
        let seat = seat(&t);
        let mut s = spec(&seat, Framework::Tensorflow);
        s.table_path = Path::new("rank_table.json");
        assert!(worker_env(&s).unwrap_err().to_string().contains("absolute"));
        for bad in ["", "a b", "007"] {
            let mut s = spec(&seat, Framework::Tensorflow);
            s.job_id = bad;
            assert!(
                worker_env(&s).unwrap_err().to_string().contains("JOB_ID"),
                "{bad:?}"
            );
        }
        assert!(
            "keras"
                .parse::<Framework>()
                .unwrap_err()
                .to_string()
                .contains("tensorflow, mindspore, pytorch")
        );
    }
}
