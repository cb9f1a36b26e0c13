//! Every environment variable atlasboost reads or sets, declared once.

/// Names of environment variables (uv's `EnvVars` pattern: no scattered string literals).
#[derive(Debug)]
pub struct EnvVars;

impl EnvVars {
    /// Absolute path of the rank table (HCCL, TensorFlow, MindSpore, torch_npu).
    pub const RANK_TABLE_FILE: &'static str = "RANK_TABLE_FILE";
    /// The worker's `rank_id` (the `pod_name` in the legacy format).
    pub const RANK_ID: &'static str = "RANK_ID";
    /// The number of ranks.
    pub const RANK_SIZE: &'static str = "RANK_SIZE";
    /// The worker's device: MindSpore's context device (`ms_context.cc`); TensorFlow's adapter
    /// reads it only when `ASCEND_DEVICE_ID` is unset (`ge_plugin.cc`). See docs/devices.md.
    pub const DEVICE_ID: &'static str = "DEVICE_ID";
    /// The worker's device for the CANN runtime and TensorFlow's adapter, which prefers it to
    /// `DEVICE_ID` (`tf_adapter/util/ge_plugin.cc`).
    pub const ASCEND_DEVICE_ID: &'static str = "ASCEND_DEVICE_ID";
    /// TensorFlow's adapter takes the rank from it before `RANK_ID` (`ge_plugin.cc`): set to
    /// the rank with `--framework tensorflow`, so an inherited one cannot change a rank.
    pub const POD_NAME: &'static str = "POD_NAME";
    /// HCCL's time to set up its links, seconds (default 120; torch_npu warns below 300 in
    /// rank-table mode): 600 unless the user set it.
    pub const HCCL_CONNECT_TIMEOUT: &'static str = "HCCL_CONNECT_TIMEOUT";
    /// The job's id (TensorFlow).
    pub const JOB_ID: &'static str = "JOB_ID";
    /// torch-style rank.
    pub const RANK: &'static str = "RANK";
    /// torch-style world size.
    pub const WORLD_SIZE: &'static str = "WORLD_SIZE";
    /// torch-style local rank.
    pub const LOCAL_RANK: &'static str = "LOCAL_RANK";
    /// torch-style local world size.
    pub const LOCAL_WORLD_SIZE: &'static str = "LOCAL_WORLD_SIZE";
    /// torch-style node rank.
    pub const GROUP_RANK: &'static str = "GROUP_RANK";
    /// Address of the first node (torch's TCPStore).
    pub const MASTER_ADDR: &'static str = "MASTER_ADDR";
    /// A free port on the first node.
    pub const MASTER_PORT: &'static str = "MASTER_PORT";
    /// Set to 1 unless the user set it.
    pub const OMP_NUM_THREADS: &'static str = "OMP_NUM_THREADS";
    /// So Python workers' output streams live.
    pub const PYTHONUNBUFFERED: &'static str = "PYTHONUNBUFFERED";
    /// The rank table path for old MindSpore runtimes.
    pub const MINDSPORE_HCCL_CONFIG_PATH: &'static str = "MINDSPORE_HCCL_CONFIG_PATH";

    /// Physical NPUs a container runtime made visible.
    pub const ASCEND_VISIBLE_DEVICES: &'static str = "ASCEND_VISIBLE_DEVICES";
    /// Logical devices the CANN runtime makes visible to a process.
    pub const ASCEND_RT_VISIBLE_DEVICES: &'static str = "ASCEND_RT_VISIBLE_DEVICES";

    /// The worker's rank, for `init()` without a second rendezvous.
    pub const ATLASBOOST_RANK: &'static str = "ATLASBOOST_RANK";
    /// The job's size.
    pub const ATLASBOOST_SIZE: &'static str = "ATLASBOOST_SIZE";
    /// The worker's local rank.
    pub const ATLASBOOST_LOCAL_RANK: &'static str = "ATLASBOOST_LOCAL_RANK";
    /// The number of workers on its host.
    pub const ATLASBOOST_LOCAL_SIZE: &'static str = "ATLASBOOST_LOCAL_SIZE";
    /// Its host's index.
    pub const ATLASBOOST_NODE_RANK: &'static str = "ATLASBOOST_NODE_RANK";
    /// The number of hosts.
    pub const ATLASBOOST_NODE_COUNT: &'static str = "ATLASBOOST_NODE_COUNT";
    /// Its logical device id.
    pub const ATLASBOOST_DEVICE_ID: &'static str = "ATLASBOOST_DEVICE_ID";
    /// Its physical device id (the table's `device_id`).
    pub const ATLASBOOST_PHYSICAL_ID: &'static str = "ATLASBOOST_PHYSICAL_ID";
    /// Its host's `server_id`.
    pub const ATLASBOOST_SERVER_ID: &'static str = "ATLASBOOST_SERVER_ID";
    /// The absolute rank-table path.
    pub const ATLASBOOST_RANK_TABLE_FILE: &'static str = "ATLASBOOST_RANK_TABLE_FILE";
    /// Library mode's table format, as `--format`: `1.0` (default), `1.2` or `legacy`.
    pub const ATLASBOOST_RANK_TABLE_FORMAT: &'static str = "ATLASBOOST_RANK_TABLE_FORMAT";
    /// Library mode's server order, as `--rank-order`: `server-id` (default), or `hosts` (as
    /// the launcher placed them: by each server's lowest rank).
    pub const ATLASBOOST_RANK_ORDER: &'static str = "ATLASBOOST_RANK_ORDER";
    /// `tensorflow`, `mindspore` or `pytorch`.
    pub const ATLASBOOST_FRAMEWORK: &'static str = "ATLASBOOST_FRAMEWORK";
    /// The job's id.
    pub const ATLASBOOST_JOB_ID: &'static str = "ATLASBOOST_JOB_ID";

    /// Library mode: how long the rendezvous may take, in seconds (default 120).
    pub const ATLASBOOST_RENDEZVOUS_TIMEOUT: &'static str = "ATLASBOOST_RENDEZVOUS_TIMEOUT";
    /// Library mode: the port of the ZeroMQ rendezvous at `MASTER_ADDR` (default
    /// `MASTER_PORT` + 1, else 29401).
    pub const ATLASBOOST_RENDEZVOUS_PORT: &'static str = "ATLASBOOST_RENDEZVOUS_PORT";
    /// Library mode: the job's secret (64 hex digits) for the ZeroMQ rendezvous.
    pub const ATLASBOOST_SECRET: &'static str = "ATLASBOOST_SECRET";

    /// `atlasboost run --mpi`: the mpirun to run (a path; default `mpirun` from `PATH`).
    pub const ATLASBOOST_MPIRUN: &'static str = "ATLASBOOST_MPIRUN";
    /// `atlasboost run --mpi`: where each rank's relay (`atlasboost relay`, started by mpirun)
    /// sends the worker's output, `address:port` of the launcher.
    pub const ATLASBOOST_RELAY_ADDR: &'static str = "ATLASBOOST_RELAY_ADDR";
    /// `atlasboost run --mpi`: the launcher's version and protocol, which the relay program
    /// beside it (`atlasboost-relay`) must share: one of another build refuses to run.
    pub const ATLASBOOST_RELAY_VERSION: &'static str = "ATLASBOOST_RELAY_VERSION";
    /// `atlasboost run --mpi`: the abstract Unix socket the relays on the launcher's host try
    /// before [`EnvVars::ATLASBOOST_RELAY_ADDR`].
    pub const ATLASBOOST_RELAY_LOCAL: &'static str = "ATLASBOOST_RELAY_LOCAL";
    /// `atlasboost run --mpi`: the launcher's `--grace`, in milliseconds, which each relay
    /// gives its worker (and what it leaves behind) between SIGTERM and SIGKILL.
    pub const ATLASBOOST_RELAY_GRACE_MS: &'static str = "ATLASBOOST_RELAY_GRACE_MS";
    /// `atlasboost run --mpi`: the launcher's `--host-timeout`, in milliseconds: a relay whose
    /// launcher sends nothing for this long stops its worker.
    pub const ATLASBOOST_RELAY_LOST_AFTER_MS: &'static str = "ATLASBOOST_RELAY_LOST_AFTER_MS";
    /// `run --mpi`'s relays: the variables of [`EnvVars::OTHER_STARTUP`] that `-x` gives the
    /// workers (comma-separated); a relay keeps the others its host has from its worker.
    pub const ATLASBOOST_RELAY_EXPORTED: &'static str = "ATLASBOOST_RELAY_EXPORTED";
    /// `atlasboost run --mpi`: the key (64 hex digits) a relay proves itself with; passed by
    /// name (`-x NAME`), so it is never on mpirun's command line, and removed from the worker's
    /// environment.
    pub const ATLASBOOST_RELAY_SECRET: &'static str = "ATLASBOOST_RELAY_SECRET";
    /// `atlasboost run --mpi`: `1` in a worker's environment, set by its relay. A failing
    /// worker (an uncaught exception after `init()`) then ends only itself, without
    /// `MPI_Finalize`, and the launcher stops the others with SIGTERM and `--grace`, instead of
    /// `MPI_Abort` killing them at once (mid-checkpoint).
    pub const ATLASBOOST_RELAYED: &'static str = "ATLASBOOST_RELAYED";

    /// Whether the process that starts workers (the launcher, an agent, a relay of `run
    /// --mpi`) makes a cgroup for them: `0` never; `1` always, failing where it cannot; unset,
    /// where it can, except in the relays (docs/launching.md, "Nothing outlives the job").
    pub const ATLASBOOST_CGROUP: &'static str = "ATLASBOOST_CGROUP";

    /// Which probe library mode uses: `auto`, `dsmi`, `hccn`, `sim`.
    pub const ATLASBOOST_PROBE: &'static str = "ATLASBOOST_PROBE";
    /// Simulated devices per host (implies the `sim` probe).
    pub const ATLASBOOST_SIM: &'static str = "ATLASBOOST_SIM";
    /// Faults to inject into simulated devices (tests): see `atlasboost-sim`.
    pub const ATLASBOOST_SIM_FAULTS: &'static str = "ATLASBOOST_SIM_FAULTS";
    /// A file of more such faults, read again at every probe: a test turns a device unhealthy
    /// between two attempts of a job by writing it.
    pub const ATLASBOOST_SIM_FAULTS_FILE: &'static str = "ATLASBOOST_SIM_FAULTS_FILE";
    /// The DSMI driver library to load (a file path).
    pub const ATLASBOOST_DSMI_LIB: &'static str = "ATLASBOOST_DSMI_LIB";
    /// Extra arguments for every `ssh` the launcher runs, split on whitespace (e.g.
    /// `-F /path/ssh_config`): for tests and unusual set-ups.
    pub const ATLASBOOST_SSH_OPTIONS: &'static str = "ATLASBOOST_SSH_OPTIONS";
    /// `0`: let ssh open its own connections. By default atlasboost opens them, with
    /// TCP_NODELAY (`atlasboost ssh-connect`), where the host's ssh configuration has no
    /// proxy of its own.
    pub const ATLASBOOST_SSH_NODELAY: &'static str = "ATLASBOOST_SSH_NODELAY";
    /// `1`: reach every host over ssh, this machine's own addresses too (tests).
    pub const ATLASBOOST_SSH_ALL_HOSTS: &'static str = "ATLASBOOST_SSH_ALL_HOSTS";
    /// The fake driver (tests): how many devices it serves (default 8).
    pub const ATLASBOOST_FAKE_DSMI_DEVICES: &'static str = "ATLASBOOST_FAKE_DSMI_DEVICES";
    /// The fake driver: the physical id of each logical device, e.g. `4,5,6,7` (default: the
    /// same as the logical id).
    pub const ATLASBOOST_FAKE_DSMI_PHYSICAL: &'static str = "ATLASBOOST_FAKE_DSMI_PHYSICAL";
    /// The fake driver: the chip name it reports (default `910`).
    pub const ATLASBOOST_FAKE_DSMI_CHIP: &'static str = "ATLASBOOST_FAKE_DSMI_CHIP";
    /// The fake driver: `v4` (default) or `v6` device addresses.
    pub const ATLASBOOST_FAKE_DSMI_IP: &'static str = "ATLASBOOST_FAKE_DSMI_IP";
    /// HCCL's host address for its own sockets (root-info mode, host NIC).
    pub const HCCL_IF_IP: &'static str = "HCCL_IF_IP";
    /// HCCL's host interface for its own sockets.
    pub const HCCL_SOCKET_IFNAME: &'static str = "HCCL_SOCKET_IFNAME";
    /// PyTorch's gloo backend: the interface it binds (else what the host name resolves to).
    pub const GLOO_SOCKET_IFNAME: &'static str = "GLOO_SOCKET_IFNAME";
    /// The DCMI library to load for `--bind-cores` (a file path).
    pub const ATLASBOOST_DCMI_LIB: &'static str = "ATLASBOOST_DCMI_LIB";
    /// The fake DCMI library: chips per card (default 1; 2 on Atlas A3).
    pub const ATLASBOOST_FAKE_DCMI_CHIPS_PER_CARD: &'static str =
        "ATLASBOOST_FAKE_DCMI_CHIPS_PER_CARD";
    /// The fake DCMI library: each card's CPU affinity, `0:0-11;1:12-23`.
    pub const ATLASBOOST_FAKE_DCMI_AFFINITY: &'static str = "ATLASBOOST_FAKE_DCMI_AFFINITY";
    /// Library mode's `--bind-cores`: `1` binds the process to its NPU's CPUs in `init()`.
    pub const ATLASBOOST_BIND_CORES: &'static str = "ATLASBOOST_BIND_CORES";
    /// Library mode's `--nic`: an interface name or an IPv4 network (CIDR).
    pub const ATLASBOOST_NIC: &'static str = "ATLASBOOST_NIC";
    /// The fake driver: `current` (the real driver's in-and-out `ip_type`) or `old`.
    pub const ATLASBOOST_FAKE_DSMI_IP_API: &'static str = "ATLASBOOST_FAKE_DSMI_IP_API";
    /// How long the DSMI probe retries a driver that answers `TRY_AGAIN` (seconds, default 10).
    pub const ATLASBOOST_DSMI_RETRY_SECS: &'static str = "ATLASBOOST_DSMI_RETRY_SECS";
    /// How long one DSMI driver call may take before the probe fails naming it (seconds,
    /// default 30): a wedged NPU's call may never return.
    pub const ATLASBOOST_DSMI_CALL_TIMEOUT_SECS: &'static str = "ATLASBOOST_DSMI_CALL_TIMEOUT_SECS";
    /// The fake driver: faults to inject (see `atlasboost-sim/fake-dsmi`).
    pub const ATLASBOOST_FAKE_DSMI_FAULTS: &'static str = "ATLASBOOST_FAKE_DSMI_FAULTS";
    /// The fake driver: a file of more faults, read at every call.
    pub const ATLASBOOST_FAKE_DSMI_FAULTS_FILE: &'static str = "ATLASBOOST_FAKE_DSMI_FAULTS_FILE";
    /// The hccn.conf to read.
    pub const ATLASBOOST_HCCN_CONF: &'static str = "ATLASBOOST_HCCN_CONF";

    // Other launchers' variables, and the system's, that atlasboost reads.
    /// Open MPI: the process's rank.
    pub const OMPI_COMM_WORLD_RANK: &'static str = "OMPI_COMM_WORLD_RANK";
    /// Open MPI: the number of processes.
    pub const OMPI_COMM_WORLD_SIZE: &'static str = "OMPI_COMM_WORLD_SIZE";
    /// Open MPI: the rank among this host's processes.
    pub const OMPI_COMM_WORLD_LOCAL_RANK: &'static str = "OMPI_COMM_WORLD_LOCAL_RANK";
    /// Open MPI: the number of this host's processes.
    pub const OMPI_COMM_WORLD_LOCAL_SIZE: &'static str = "OMPI_COMM_WORLD_LOCAL_SIZE";
    /// Open MPI 4: mpirun's address (the name is lower case: `OMPI_MCA_orte_hnp_uri`).
    pub const OMPI_MCA_ORTE_HNP_URI: &'static str = "OMPI_MCA_orte_hnp_uri";
    /// Open MPI 4: the job's id (`OMPI_MCA_ess_base_jobid`).
    pub const OMPI_MCA_ESS_BASE_JOBID: &'static str = "OMPI_MCA_ess_base_jobid";
    /// PMIx (Open MPI 5, PRRTE): the job's namespace.
    pub const PMIX_NAMESPACE: &'static str = "PMIX_NAMESPACE";
    /// PMIx: the local server's address (v4.1).
    pub const PMIX_SERVER_URI41: &'static str = "PMIX_SERVER_URI41";
    /// PMIx: the local server's address (v4).
    pub const PMIX_SERVER_URI4: &'static str = "PMIX_SERVER_URI4";
    /// PMIx: the local server's address (v3).
    pub const PMIX_SERVER_URI3: &'static str = "PMIX_SERVER_URI3";
    /// PMIx: the local server's address (v2.1).
    pub const PMIX_SERVER_URI21: &'static str = "PMIX_SERVER_URI21";
    /// PMIx: the local server's address (v2).
    pub const PMIX_SERVER_URI2: &'static str = "PMIX_SERVER_URI2";
    /// MPICH (Hydra): the process's rank.
    pub const PMI_RANK: &'static str = "PMI_RANK";
    /// MPICH: the number of processes.
    pub const PMI_SIZE: &'static str = "PMI_SIZE";
    /// MPICH: the rank among this host's processes.
    pub const MPI_LOCALRANKID: &'static str = "MPI_LOCALRANKID";
    /// MPICH: the number of this host's processes.
    pub const MPI_LOCALNRANKS: &'static str = "MPI_LOCALNRANKS";
    /// Slurm: the task's rank.
    pub const SLURM_PROCID: &'static str = "SLURM_PROCID";
    /// Slurm: the number of tasks.
    pub const SLURM_NTASKS: &'static str = "SLURM_NTASKS";
    /// Slurm: the task's rank on its node.
    pub const SLURM_LOCALID: &'static str = "SLURM_LOCALID";
    /// Slurm: the node's index in the step.
    pub const SLURM_NODEID: &'static str = "SLURM_NODEID";
    /// Slurm: the job's id.
    pub const SLURM_JOB_ID: &'static str = "SLURM_JOB_ID";
    /// Slurm: the step's id within the job.
    pub const SLURM_STEP_ID: &'static str = "SLURM_STEP_ID";
    /// Slurm: the step's nodes (hostlist syntax).
    pub const SLURM_STEP_NODELIST: &'static str = "SLURM_STEP_NODELIST";
    /// Slurm: the allocation's nodes.
    pub const SLURM_JOB_NODELIST: &'static str = "SLURM_JOB_NODELIST";
    /// Slurm: the allocation's nodes (the older name).
    pub const SLURM_NODELIST: &'static str = "SLURM_NODELIST";
    /// Slurm: the allocation's task counts per node (`2(x3),1`).
    pub const SLURM_TASKS_PER_NODE: &'static str = "SLURM_TASKS_PER_NODE";
    /// Slurm: the name of the node a task runs on.
    pub const SLURMD_NODENAME: &'static str = "SLURMD_NODENAME";
    /// Slurm: the address of the host where `srun` ran, as a task sees it.
    pub const SLURM_LAUNCH_NODE_IPADDR: &'static str = "SLURM_LAUNCH_NODE_IPADDR";
    /// Extra arguments for the `srun` that starts the agents under `--launcher slurm`, split on
    /// white space (e.g. `--partition=debug`).
    pub const ATLASBOOST_SRUN_OPTIONS: &'static str = "ATLASBOOST_SRUN_OPTIONS";
    /// Which attempt a worker belongs to: 0, then 1 after the first restart (SPEC §12).
    pub const ATLASBOOST_RESTART_COUNT: &'static str = "ATLASBOOST_RESTART_COUNT";
    /// `--max-restarts` of the job.
    pub const ATLASBOOST_MAX_RESTARTS: &'static str = "ATLASBOOST_MAX_RESTARTS";
    /// torchrun's name of `ATLASBOOST_RESTART_COUNT` (`--framework pytorch`).
    pub const TORCHELASTIC_RESTART_COUNT: &'static str = "TORCHELASTIC_RESTART_COUNT";
    /// torchrun's name of `ATLASBOOST_MAX_RESTARTS` (`--framework pytorch`).
    pub const TORCHELASTIC_MAX_RESTARTS: &'static str = "TORCHELASTIC_MAX_RESTARTS";
    /// Where a worker's `heartbeat()` leaves its count and step for the watchdog.
    pub const ATLASBOOST_HEARTBEAT_FILE: &'static str = "ATLASBOOST_HEARTBEAT_FILE";
    /// Where a worker records its uncaught exception as JSON (the root cause of a failure).
    pub const ATLASBOOST_ERROR_FILE: &'static str = "ATLASBOOST_ERROR_FILE";
    /// torch's name of `ATLASBOOST_ERROR_FILE`, read by its `@record` (`--framework pytorch`).
    pub const TORCHELASTIC_ERROR_FILE: &'static str = "TORCHELASTIC_ERROR_FILE";
    /// Where a Python worker's `faulthandler` writes its stacks on SIGUSR1 (`--hang-dump`).
    pub const ATLASBOOST_STACK_FILE: &'static str = "ATLASBOOST_STACK_FILE";
    /// torchrun: the run's id (`none` by default).
    pub const TORCHELASTIC_RUN_ID: &'static str = "TORCHELASTIC_RUN_ID";
    /// Where programs are found (forwarded to remote workers).
    pub const PATH: &'static str = "PATH";
    /// Where libraries are found (forwarded to remote workers; searched for the driver).
    pub const LD_LIBRARY_PATH: &'static str = "LD_LIBRARY_PATH";
    /// Where Python modules are found (forwarded to remote workers).
    pub const PYTHONPATH: &'static str = "PYTHONPATH";
    /// The user's private runtime directory (library mode's local sockets).
    pub const XDG_RUNTIME_DIR: &'static str = "XDG_RUNTIME_DIR";

    /// Variables of other ways of starting a job than a rank table, which must not meet
    /// `RANK_TABLE_FILE`: HCCL's cluster-info ones (`CM_*`, which it refuses beside a rank
    /// table), and MindSpore's dynamic cluster (`MS_ROLE` switches it on; msrun and MindX set
    /// them). A launcher's workers do not get them unless `-x` names them.
    pub const OTHER_STARTUP: [&'static str; 11] = [
        "CM_CHIEF_IP",
        "CM_CHIEF_PORT",
        "CM_CHIEF_DEVICE",
        "CM_WORKER_SIZE",
        "CM_WORKER_IP",
        "CM_RANK",
        "CM_LOCAL_WORKER",
        "MS_ROLE",
        "MS_SCHED_HOST",
        "MS_SCHED_PORT",
        "MS_WORKER_NUM",
    ];

    /// The launcher's variables that remote workers receive too (SPEC §9), by name...
    pub const FORWARDED: [&'static str; 3] = [Self::PATH, Self::LD_LIBRARY_PATH, Self::PYTHONPATH];
    /// ... and by prefix.
    pub const FORWARDED_PREFIXES: [&'static str; 8] = [
        "ASCEND_",
        "HCCL_",
        "GE_",
        "MS_",
        "TF_",
        "NCCL_",
        "OMP_",
        "ATLASBOOST_",
    ];
}
