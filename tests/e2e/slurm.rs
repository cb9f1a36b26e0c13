//! Slurm as the launch engine (SPEC §14), against a real Slurm: `tests/slurm-cluster.sh`
//! brings up slurmctld and one slurmd per network namespace (munge, Debian's slurm-wlm) and
//! runs these tests inside it, with `SLURM_CONF` and `SLURM_CLUSTER_*` set:
//!
//! ```sh
//! cargo build -p atlasboost-cli
//! tests/slurm-cluster.sh cargo test -p atlasboost-e2e --test e2e slurm:: -- --test-threads=1
//! ```
//!
//! `salloc -N3 atlasboost run ...` runs from the root namespace; srun starts one agent per
//! node (each in its node's namespace), which connects back to the launcher. Outside the
//! fixture every test says that it skips and passes having tested nothing;
//! `ATLASBOOST_E2E_REQUIRE_SLURM=1` makes that a failure.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use atlasboost_e2e::{
    LAUNCH_MARK, Launch, Run, assert_no_process_with_env, atlasboost_bin, descendants, example,
    wait_until,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::{events_of, lines_by_rank};

/// The cluster the fixture started.
struct Cluster {
    conf: String,
    nodes: Vec<String>,
    netns: Vec<String>,
}

impl Drop for Cluster {
    /// Whatever a test left running (it failed half-way, say) is cancelled, so that the next
    /// test finds the nodes idle.
    fn drop(&mut self) {
        let _ = Command::new("scancel")
            .args(["--user", "root"])
            .env("SLURM_CONF", &self.conf)
            .status();
        wait_until(Duration::from_secs(20), || {
            Command::new("squeue")
                .args(["-h", "-o", "%i"])
                .env("SLURM_CONF", &self.conf)
                .output()
                .is_ok_and(|o| o.stdout.iter().all(u8::is_ascii_whitespace))
        });
    }
}

/// The fixture's cluster, or returns from the test (which then passes) outside it;
/// [`cluster_or_skip`] has said so loudly.
macro_rules! cluster_or_skip {
    () => {
        match cluster_or_skip() {
            Some(cluster) => cluster,
            None => return,
        }
    };
}

/// The fixture's cluster, or `None` (said on stderr) outside it.
fn cluster_or_skip() -> Option<Cluster> {
    let test = std::thread::current()
        .name()
        .unwrap_or("a slurm test")
        .to_string();
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let (Some(conf), Some(nodes), Some(netns)) = (
        var("SLURM_CONF"),
        var("SLURM_CLUSTER_NODES"),
        var("SLURM_CLUSTER_NETNS"),
    ) else {
        let why = "not inside tests/slurm-cluster.sh (SLURM_CONF and SLURM_CLUSTER_* unset)";
        assert!(
            std::env::var_os("ATLASBOOST_E2E_REQUIRE_SLURM").is_none_or(|v| v != "1"),
            "{test}: {why}, and ATLASBOOST_E2E_REQUIRE_SLURM=1"
        );
        let line = format!(
            "\n*** skipping: {test}: {why}; it tests nothing here (run it in the fixture, \
             or set ATLASBOOST_E2E_REQUIRE_SLURM=1 to make this a failure) ***\n"
        );
        // Straight to file descriptor 2: eprintln! would be captured by the test harness.
        let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
        return None;
    };
    Some(Cluster {
        conf,
        nodes: nodes.split_whitespace().map(str::to_string).collect(),
        netns: netns.split_whitespace().map(str::to_string).collect(),
    })
}

impl Cluster {
    /// `salloc -N<all> atlasboost ARGS...` (salloc's output joins atlasboost's).
    fn salloc(&self, args: &[&str]) -> Run {
        self.salloc_with(&[], args)
    }

    /// `salloc -N<all> SALLOC_ARGS... atlasboost ARGS...`.
    fn salloc_with(&self, salloc_args: &[&str], args: &[&str]) -> Run {
        let n = format!("-N{}", self.nodes.len());
        Run::new([n.as_str(), "--quiet"])
            .args(salloc_args)
            .program("salloc")
            .args([atlasboost_bin().as_os_str()])
            .args(args)
            .env("SLURM_CONF", &self.conf)
            .timeout(Duration::from_secs(120))
    }

    /// A Slurm client command's output.
    fn client(&self, program: &str, args: &[&str]) -> String {
        let out = Command::new(program)
            .args(args)
            .env("SLURM_CONF", &self.conf)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
        assert!(
            out.status.success(),
            "{program} {args:?}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The network namespace inode of each node, by node name.
    fn namespace_inodes(&self) -> BTreeMap<u64, String> {
        use std::os::unix::fs::MetadataExt;
        self.nodes
            .iter()
            .zip(&self.netns)
            .map(|(node, ns)| {
                let m = std::fs::metadata(format!("/run/netns/{ns}"))
                    .unwrap_or_else(|e| panic!("namespace {ns} of node {node}: {e}"));
                (m.ino(), node.clone())
            })
            .collect()
    }

    /// The processes of the nodes' namespaces other than the slurmd daemons: what a job left.
    fn leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        for ns in &self.netns {
            let out = Command::new("ip")
                .args(["netns", "pids", ns])
                .output()
                .unwrap_or_else(|e| panic!("ip netns pids {ns}: {e}"));
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
                    .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
                    .unwrap_or_default();
                if comm.trim() != "slurmd" && !cmdline.is_empty() {
                    left.push(format!("{ns}: {pid} {}", cmdline.trim()));
                }
            }
        }
        left
    }

    /// Waits (at most 20 s) until the nodes run nothing but slurmd.
    fn assert_nothing_left(&self, context: &str) {
        let clean = wait_until(Duration::from_secs(20), || self.leftovers().is_empty());
        assert!(
            clean,
            "{context}: processes are left on the nodes after 20 s:\n{}",
            self.leftovers().join("\n")
        );
    }

    /// The job's steps (`squeue -s`), other than its `extern` and `interactive` ones.
    fn steps(&self, job: &str) -> Vec<String> {
        self.client("squeue", &["-h", "-s", "-j", job, "-o", "%i %j"])
            .lines()
            .filter(|l| !l.contains("extern") && !l.contains("interactive"))
            .map(str::to_string)
            .collect()
    }
}

/// A small deterministic generator (xorshift64), so that a failing expression can be found
/// again.
struct Xorshift(u64);

impl Xorshift {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// A host list of the kinds clusters use: prefixes, brackets with numbers and ranges of
/// several widths, zero padding, several brackets in one name, several names (and, rarely, a
/// suffix after the last bracket, which Slurm 22.05 refuses and atlasboost reads).
fn hostlist(rng: &mut Xorshift) -> String {
    let prefixes = ["node", "n", "gpu-", "rack1-n", "cn", "a.b-", "x"];
    let suffix = |rng: &mut Xorshift| if rng.below(20) == 0 { "a" } else { "" };
    let mut names = Vec::new();
    for _ in 0..=rng.below(3) {
        let mut name = prefixes[rng.below(prefixes.len() as u64) as usize].to_string();
        for group in 0..=rng.below(2) {
            if group > 0 {
                name.push_str(["-", "s", "r"][rng.below(3) as usize]);
            }
            let width = 1 + rng.below(3) as usize;
            let mut ranges = Vec::new();
            let mut next = rng.below(20);
            for _ in 0..=rng.below(3) {
                let lo = next;
                let hi = lo + rng.below(6);
                ranges.push(match lo == hi {
                    true => format!("{lo:0width$}"),
                    false => format!("{lo:0width$}-{hi:0width$}"),
                });
                next = hi + 1 + rng.below(5);
            }
            name.push_str(&format!("[{}]", ranges.join(",")));
        }
        name.push_str(suffix(rng));
        names.push(name);
    }
    names.join(",")
}

#[test]
fn hostlists_expand_as_scontrol_show_hostnames_does() {
    let cluster = cluster_or_skip!();
    let mut rng = Xorshift(0x5eed_1234_abcd_0001);
    let mut fixed: Vec<String> = [
        "node[01-04,07],gpu-[1-2]",
        "n[8-11]",
        "n[098-101]",
        "a[1-2]b[3-4]",
        "rack[1-2]-n[01-02]",
        "single",
        "x[0]",
    ]
    .map(str::to_string)
    .to_vec();
    fixed.extend((0..300).map(|_| hostlist(&mut rng)));
    let (mut compared, mut suffixed) = (0, 0);
    for list in &fixed {
        let out = Command::new("scontrol")
            .args(["show", "hostnames", list])
            .env("SLURM_CONF", &cluster.conf)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        let complaint = String::from_utf8_lossy(&out.stderr);
        let ours = atlasboost_core::slurm::expand_hostlist(list);
        if said.contains("Invalid hostlist")
            || complaint.contains("Invalid hostlist")
            || !out.status.success()
        {
            // Only atlasboost's one extension may read what Slurm 22.05 refuses.
            let suffix = list
                .split(',')
                .any(|n| n.rfind(']').is_some_and(|i| i + 1 < n.len()));
            assert!(
                suffix || ours.is_err(),
                "{list}: scontrol refuses it, atlasboost reads {ours:?}"
            );
            suffixed += 1;
            continue;
        }
        let want: Vec<String> = said.lines().map(str::to_string).collect();
        let got =
            ours.unwrap_or_else(|e| panic!("{list}: scontrol expands it, atlasboost refuses: {e}"));
        assert_eq!(got, want, "{list}: atlasboost and scontrol differ");
        compared += 1;
    }
    eprintln!(
        "slurm: {compared} host lists agree with scontrol; {suffixed} refused by it (atlasboost reads those with a suffix)"
    );
    assert!(compared >= 250, "only {compared} host lists compared");
    // The launcher's own compression, for srun --nodelist, reads back the same in Slurm.
    let names: Vec<String> = ["n1", "n2", "n3", "n07", "gpu-1", "n08", "x"]
        .map(str::to_string)
        .to_vec();
    let compressed = atlasboost_core::slurm::compress_hostlist(&names);
    let back: Vec<String> = cluster
        .client("scontrol", &["show", "hostnames", &compressed])
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(back, names, "{compressed}");
}

/// What each worker leaves: a copy of the table it read, and a line naming its node and the
/// network namespace it runs in. (The nodes share the file system, and each node's agent
/// replaces the one table by a rename: `cat` reads the whole file it opened, where GNU cp
/// gives up on a file replaced while it copies.)
const WORKER: &str = r#"set -eu
cat "$RANK_TABLE_FILE" >"seen/$RANK_ID.json"
netns=$(stat -L -c %i /proc/self/ns/net)
echo "ok rank $RANK_ID node $SLURMD_NODENAME netns $netns server $ATLASBOOST_SERVER_ID device $ATLASBOOST_PHYSICAL_ID"
"#;

#[test]
fn a_job_in_an_allocation_runs_every_nodes_workers_through_one_srun_step() {
    let cluster = cluster_or_skip!();
    let n = cluster.nodes.len();
    let run = cluster.salloc(&["run", "-v", "--sim", "4", "--", "sh", "worker.sh"]);
    run.file("worker.sh", WORKER, false);
    std::fs::create_dir_all(run.dir().join("seen")).unwrap();
    let done = run.run();
    done.assert_code(0);
    let err = done.err();
    assert!(
        err.contains(&format!(
            "Slurm step of {n} hosts: srun starts their agents"
        )),
        "{}",
        done.describe()
    );
    assert!(
        err.contains(&format!("{} succeeded, 0 failed", 4 * n)),
        "{}",
        done.describe()
    );
    // Every rank once, four per node, each in its node's namespace, devices 0-3.
    let inodes = cluster.namespace_inodes();
    let by_rank = lines_by_rank(&done.out(), "stdout");
    assert_eq!(by_rank.len(), 4 * n, "{}", done.describe());
    let mut devices: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
    for (rank, lines) in &by_rank {
        assert_eq!(lines.len(), 1, "rank {rank}: {lines:?}");
        let words: Vec<&str> = lines[0].split_whitespace().collect();
        assert_eq!(words[..2], ["ok", "rank"], "rank {rank}: {lines:?}");
        assert_eq!(
            words[2],
            rank.to_string(),
            "a tag on another rank's line: {lines:?}"
        );
        let (node, netns, device) = (words[4], words[6], words[10]);
        let ran_in = inodes.get(&netns.parse::<u64>().unwrap());
        assert_eq!(
            ran_in.map(String::as_str),
            Some(node),
            "rank {rank} of node {node} ran in network namespace {netns}"
        );
        devices
            .entry(node.to_string())
            .or_default()
            .insert(device.parse().unwrap());
    }
    for node in &cluster.nodes {
        assert_eq!(
            devices
                .get(node)
                .map(|d| d.iter().copied().collect::<Vec<_>>()),
            Some(vec![0, 1, 2, 3]),
            "node {node}"
        );
    }
    // One table, byte-identical wherever a worker read it, valid, naming every node.
    let table = done.dir().join("rank_table.json");
    let bytes = std::fs::read(&table).unwrap();
    for rank in 0..4 * n {
        let copy = done.dir().join(format!("seen/{rank}.json"));
        assert_eq!(
            std::fs::read(&copy).unwrap(),
            bytes,
            "rank {rank}'s copy of the table"
        );
    }
    let validated = Command::new(atlasboost_bin())
        .arg("validate")
        .arg(&table)
        .output()
        .unwrap();
    assert!(validated.status.success(), "{validated:?}");
    let parsed: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(parsed["server_count"], n.to_string());
    cluster.assert_nothing_left("after a job that succeeded");
}

#[test]
fn the_example_trainer_runs_under_salloc_without_a_host_list() {
    let cluster = cluster_or_skip!();
    let n = cluster.nodes.len();
    let train = example("train.py");
    let done = cluster
        .salloc(&["run", "--sim", "4", "--", "python3"])
        .args([train.as_os_str()])
        .args(["--steps", "2", "--sleep", "0"])
        .run();
    done.assert_code(0);
    let by_rank = lines_by_rank(&done.out(), "stdout");
    assert_eq!(by_rank.len(), 4 * n, "{}", done.describe());
    for (rank, lines) in &by_rank {
        let first = format!("rank {rank}/{} on device ", 4 * n);
        assert!(
            lines[0].starts_with(&first) && lines[0].contains(&format!("{n} servers")),
            "rank {rank}: {lines:?}"
        );
    }
}

#[test]
fn a_failed_worker_fails_the_job_naming_it_and_its_node() {
    let cluster = cluster_or_skip!();
    let done = cluster
        .salloc(&[
            "run",
            "--sim",
            "2",
            "--grace",
            "2",
            "--",
            "sh",
            "-c",
            "echo node=$SLURMD_NODENAME; if [ $RANK_ID = 3 ]; then exit 7; fi; exec sleep 60",
        ])
        .run();
    done.assert_code(7);
    let node_of_3 = lines_by_rank(&done.out(), "stdout")
        .get(&3)
        .and_then(|l| l.first().cloned())
        .unwrap_or_default();
    let node_of_3 = node_of_3.trim_start_matches("node=");
    assert!(!node_of_3.is_empty(), "{}", done.describe());
    let err = done.err();
    assert!(
        err.lines()
            .any(|l| l.contains("rank 3") && l.contains("exit") && l.contains('7')),
        "the failure of rank 3 is not named:\n{}",
        done.describe()
    );
    // The summary's row of rank 3 names its host, whose server id is its node's address.
    let ip_of = cluster_ips(&cluster);
    assert!(
        err.contains(&ip_of[node_of_3]),
        "rank 3's host ({node_of_3}, {}) is not named:\n{}",
        ip_of[node_of_3],
        done.describe()
    );
    cluster.assert_nothing_left("after a failed job");
}

/// What a site's slurm.conf or the user's environment sets for every srun does not change the
/// agents' step: `sbatch --export=NONE`'s `SLURM_EXPORT_ENV=NONE` (the agents still probe
/// under the user's `ASCEND_RT_VISIBLE_DEVICES`, the workers get the user's variables),
/// `WaitTime` (`SLURM_WAIT`: a node whose workers finish first does not get the others killed),
/// `SLURM_EXACT` (srun refused it beside `--whole`), the job's CPUs per task (with which srun
/// ignores `--whole`; the workers get them back), and an MPI plugin (`MpiDefault`), whose PMI
/// rank, like the step's `SLURM_PROCID`, describes an agent, not a worker.
#[test]
fn the_sites_and_the_users_srun_defaults_do_not_change_the_agents_step() {
    let cluster = cluster_or_skip!();
    let n = cluster.nodes.len();
    let first = cluster.nodes[0].clone();
    let worker = format!(
        "echo vis=$ASCEND_RT_VISIBLE_DEVICES mine=${{MINE-unset}} \
         procid=${{SLURM_PROCID-unset}} ntasks=${{SLURM_NTASKS-unset}} pmi=${{PMI_RANK-unset}} \
         cpus=${{SRUN_CPUS_PER_TASK-unset}} name=${{SLURM_JOB_NAME-unset}}; \
         if [ \"$SLURMD_NODENAME\" != {first} ]; then sleep 4; fi"
    );
    // The job's name, which the agents' step (`--job-name`) would replace.
    let done = cluster
        .salloc_with(
            &["--job-name=train-llm"],
            &["run", "-v", "--sim", "4", "--", "sh", "-c", &worker],
        )
        .env("SLURM_EXPORT_ENV", "NONE")
        .env("SRUN_CPUS_PER_TASK", "1")
        .env("SLURM_WAIT", "1")
        .env("SLURM_EXACT", "1")
        .env("SLURM_MPI_TYPE", "pmi2")
        .env("ASCEND_RT_VISIBLE_DEVICES", "1,3")
        .env("MINE", "kept")
        .run();
    done.assert_code(0);
    assert!(
        done.err()
            .contains(&format!("{} succeeded, 0 failed", 2 * n)),
        "{}",
        done.describe()
    );
    // The job's CPUs per task (`sbatch -c`) would have made srun ignore `--whole`.
    assert!(
        !done.err().contains("Ignoring --whole"),
        "{}",
        done.describe()
    );
    let by_rank = lines_by_rank(&done.out(), "stdout");
    assert_eq!(by_rank.len(), 2 * n, "{}", done.describe());
    for (rank, lines) in &by_rank {
        assert_eq!(
            lines,
            &["vis=1,3 mine=kept procid=unset ntasks=unset pmi=unset cpus=1 name=train-llm"],
            "rank {rank}:\n{}",
            done.describe()
        );
    }
    cluster.assert_nothing_left("after a job under the site's srun defaults");
}

/// Addresses added to the nodes' interfaces for one test, removed when it ends.
struct NodeAddresses(Vec<(String, String, String)>);

impl Drop for NodeAddresses {
    fn drop(&mut self) {
        for (ns, address, dev) in &self.0 {
            let _ = Command::new("ip")
                .args(["-n", ns, "addr", "del", address, "dev", dev])
                .status();
        }
    }
}

/// A network no interface of this machine has (`10.x.77`), added to the interfaces of the
/// nodes `on` (by position): their addresses on it, and what removes them.
fn nodes_network(
    cluster: &Cluster,
    on: &[usize],
) -> (String, BTreeMap<usize, String>, NodeAddresses) {
    let net = (200..250)
        .map(|b| format!("10.{b}.77"))
        .find(|net| {
            let out = Command::new("ip")
                .args(["-4", "-o", "addr"])
                .output()
                .unwrap();
            !String::from_utf8_lossy(&out.stdout).contains(&format!(" {net}."))
        })
        .expect("a free 10.x.77.0/24");
    let mut added = NodeAddresses(Vec::new());
    let mut ips = BTreeMap::new();
    for &i in on {
        let ns = &cluster.netns[i];
        let links = Command::new("ip")
            .args(["-n", ns, "-o", "link"])
            .output()
            .unwrap();
        let links = String::from_utf8_lossy(&links.stdout).into_owned();
        let dev = links
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|d| d.split('@').next().unwrap_or(d).to_string())
            .find(|d| d != "lo")
            .unwrap_or_else(|| panic!("no interface in {ns}: {links}"));
        let ip = format!("{net}.{}", 11 + i);
        let address = format!("{ip}/24");
        let ok = Command::new("ip")
            .args(["-n", ns, "addr", "add", &address, "dev", &dev])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "cannot add {address} to {dev} in {ns}");
        added.0.push((ns.clone(), address, dev));
        ips.insert(i, ip);
    }
    (format!("{net}.0/24"), ips, added)
}

/// `--nic` names the nodes' network, which the launcher (a login node, here the root
/// namespace) does not have: the nodes connect back where srun was started from, and each
/// worker gets its node's address on that network.
#[test]
fn nic_is_the_nodes_network_even_where_the_launcher_has_none() {
    let cluster = cluster_or_skip!();
    let every: Vec<usize> = (0..cluster.nodes.len()).collect();
    let (net, ips, _added) = nodes_network(&cluster, &every);
    let done = cluster
        .salloc(&["run", "--sim", "1", "--nic", &net, "--"])
        .args(["sh", "-c", "echo ip=$HCCL_IF_IP"])
        .run();
    done.assert_code(0);
    let got: BTreeSet<String> = lines_by_rank(&done.out(), "stdout")
        .values()
        .filter_map(|l| l.first()?.strip_prefix("ip=").map(str::to_string))
        .collect();
    let want: BTreeSet<String> = ips.into_values().collect();
    assert_eq!(got, want, "{}", done.describe());
    cluster.assert_nothing_left("after a job on the nodes' network");
}

/// Nodes that lack `--nic`'s network fail as they join: the error names those nodes, each
/// with its reason, not the node that has it (srun ends the step once one agent failed, and
/// that node's agent is lost with it).
#[test]
fn the_nodes_that_fail_as_they_join_are_named_not_those_lost_with_them() {
    let cluster = cluster_or_skip!();
    let (net, _ips, _added) = nodes_network(&cluster, &[0]);
    let done = cluster
        .salloc(&["run", "--sim", "1", "--nic", &net, "--", "true"])
        .run();
    let ip_of = cluster_ips(&cluster);
    let err = done.err();
    let error: Vec<&str> = err
        .lines()
        .skip_while(|l| !l.starts_with("error: "))
        .collect();
    // Hosts are named `node (address)`.
    let named = |node: &str| {
        error
            .iter()
            .any(|l| l.contains(&format!("{node} ({})", ip_of[node])))
    };
    assert!(
        done.code() == Some(2)
            && error
                .iter()
                .all(|l| !l.contains("lost") && !l.contains("stopped before"))
            && cluster.nodes[1..].iter().all(|n| named(n))
            && !named(&cluster.nodes[0]),
        "{}",
        done.describe()
    );
    cluster.assert_nothing_left("after nodes failed as they joined");
}

/// Each node's address, by node name.
fn cluster_ips(cluster: &Cluster) -> BTreeMap<String, String> {
    let ips = std::env::var("SLURM_CLUSTER_IPS").unwrap_or_default();
    cluster
        .nodes
        .iter()
        .cloned()
        .zip(ips.split_whitespace().map(str::to_string))
        .collect()
}

/// The job's secret (64 hex digits) is on no agent's command line and in no agent's
/// environment, where `ps`, `/proc` and `scontrol show step` would show it to others.
fn assert_secret_out_of_sight(cluster: &Cluster) {
    let secret_like = |text: &str| {
        text.split(|c: char| !c.is_ascii_hexdigit())
            .any(|w| w.len() >= 64)
    };
    let mut agents = 0;
    for ns in &cluster.netns {
        let pids = Command::new("ip")
            .args(["netns", "pids", ns])
            .output()
            .unwrap();
        for pid in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
            let pid: i32 = pid.parse().unwrap();
            let Some(cmdline) = atlasboost_e2e::cmdline(pid) else {
                continue;
            };
            if !cmdline.iter().any(|a| a == "agent") {
                continue;
            }
            agents += 1;
            assert_eq!(
                cmdline[1..],
                ["agent", "--slurm"],
                "agent {pid}'s command line"
            );
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            for var in String::from_utf8_lossy(&environ).split('\0') {
                assert!(!secret_like(var), "agent {pid}'s environment has {var}");
            }
        }
    }
    // Each agent, and its lifeline (a fork of it, with its command line).
    assert!(
        agents >= cluster.nodes.len(),
        "{agents} agents on {} nodes",
        cluster.nodes.len()
    );
}

/// A job whose workers say `ready` with their job and step ids, then sleep; returned once
/// every worker is ready, with the job's id and the agents' step id.
fn started_sleepers(cluster: &Cluster) -> (Launch, String, String) {
    let n = cluster.nodes.len();
    let mut launch = cluster
        .salloc(&[
            "run",
            "--sim",
            "2",
            "--grace",
            "3",
            "--",
            "sh",
            "-c",
            "echo ready job=$SLURM_JOB_ID step=$SLURM_STEP_ID; exec sleep 100",
        ])
        .spawn();
    launch.wait_for_lines("ready job=", 2 * n, Duration::from_secs(60));
    let out = String::from_utf8_lossy(&launch.stdout()).into_owned();
    let line = out.lines().find(|l| l.contains("ready job=")).unwrap();
    let field = |key: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .unwrap_or_default()
            .to_string()
    };
    (launch, field("job="), field("step="))
}

/// Starts a job of sleepers, checks that its secret is out of sight, cancels `target(job,
/// step)`, and checks that atlasboost exits 143 saying `says`, leaving nothing anywhere.
fn scancel_ends_the_job(cluster: &Cluster, target: fn(&str, &str) -> String, says: &str) {
    let (launch, job, step) = started_sleepers(cluster);
    assert!(!job.is_empty() && !step.is_empty(), "no job or step id");
    let mark = launch.mark().to_string();
    assert_secret_out_of_sight(cluster);
    let target = target(&job, &step);
    cluster.client("scancel", &[&target]);
    let done = launch.wait_at_most(Duration::from_secs(30));
    done.assert_code(143);
    assert!(
        done.err().contains(says),
        "scancel {target}: the message does not say {says:?}:\n{}",
        done.describe()
    );
    // Slurm is named as the cause, not a worker that its signal killed.
    let errors = done.error_lines();
    assert!(
        errors.len() == 1 && errors[0].contains(says) && !errors[0].contains("rank "),
        "scancel {target}: the error line blames something else:\n{}",
        done.describe()
    );
    cluster.assert_nothing_left(&format!("after scancel {target}"));
    assert_no_process_with_env(LAUNCH_MARK, &mark, Duration::from_secs(10), "after scancel");
}

#[test]
fn scancel_of_the_step_ends_the_workers_and_atlasboost_exits_143() {
    let cluster = cluster_or_skip!();
    // Slurm kills the agents at once (SIGKILL): srun's lines say why.
    scancel_ends_the_job(
        &cluster,
        |job, step| format!("{job}.{step}"),
        "Slurm cancelled the agents' step (scancel)",
    );
}

#[test]
fn scancel_of_the_job_ends_the_workers_and_atlasboost_exits_143() {
    let cluster = cluster_or_skip!();
    // Slurm sends the step's processes SIGTERM (SIGKILL after KillWait): the agents say so,
    // and salloc passes on atlasboost's status.
    scancel_ends_the_job(
        &cluster,
        |job, _| job.to_string(),
        "from Slurm (scancel, or the job's time limit",
    );
}

#[test]
fn kill_9_of_atlasboost_ends_the_step_and_leaves_nothing() {
    let cluster = cluster_or_skip!();
    let (launch, job, _) = started_sleepers(&cluster);
    let mark = launch.mark().to_string();
    let atlasboost: PathBuf = atlasboost_bin();
    let launcher = descendants(launch.pid())
        .into_iter()
        .find(|p| {
            atlasboost_e2e::cmdline(p.pid).is_some_and(|c| {
                c.first()
                    .is_some_and(|a| std::path::Path::new(a) == atlasboost)
            })
        })
        .expect("the launcher below salloc");
    kill(Pid::from_raw(launcher.pid), Signal::SIGKILL).unwrap();
    cluster.assert_nothing_left("after kill -9 of the launcher");
    assert_no_process_with_env(LAUNCH_MARK, &mark, Duration::from_secs(10), "after kill -9");
    assert!(
        wait_until(Duration::from_secs(20), || cluster.steps(&job).is_empty()),
        "the agents' step of job {job} is still there: {:?}",
        cluster.steps(&job)
    );
    let _ = launch.wait_at_most(Duration::from_secs(30));
}

#[test]
fn a_restart_starts_a_new_step_and_monitoring_reaches_the_events_file() {
    let cluster = cluster_or_skip!();
    let n = cluster.nodes.len();
    let done = cluster
        .salloc(&[
            "run",
            "--sim",
            "2",
            "--max-restarts",
            "1",
            "--restart-delay",
            "0",
            "--monitor-interval",
            "1",
            "--events",
            "events.jsonl",
            "--",
            "sh",
            "-c",
            "echo attempt=$ATLASBOOST_RESTART_COUNT step=$SLURM_STEP_ID
             if [ $ATLASBOOST_RESTART_COUNT = 0 ] && [ $RANK_ID = 1 ]; then exit 5; fi
             sleep 2",
        ])
        .run();
    done.assert_code(0);
    let out = done.out();
    let steps = |attempt: u32| -> BTreeSet<String> {
        out.lines()
            .filter_map(|l| l.split_once(&format!(":attempt={attempt} step=")))
            .map(|(_, step)| step.to_string())
            .collect()
    };
    let (first, second) = (steps(0), steps(1));
    assert_eq!(
        first.len(),
        1,
        "attempt 0 ran in steps {first:?}\n{}",
        done.describe()
    );
    assert_eq!(
        second.len(),
        1,
        "attempt 1 ran in steps {second:?}\n{}",
        done.describe()
    );
    assert_ne!(first, second, "the restart reused the agents' step");
    assert_eq!(
        out.lines().filter(|l| l.contains(":attempt=1 ")).count(),
        2 * n,
        "{}",
        done.describe()
    );
    // Each node's agent sampled its devices and sent them up its connection.
    let sampled: BTreeSet<String> = events_of(&done, "telemetry")
        .iter()
        .filter(|e| e["devices"].as_array().is_some_and(|d| d.len() == 2))
        .filter_map(|e| e["host"].as_str().map(str::to_string))
        .collect();
    assert_eq!(sampled.len(), n, "hosts with telemetry: {sampled:?}");
    cluster.assert_nothing_left("after a restarted job");
}

/// Without a cluster: what the launcher makes of Slurm's variables before it starts anything.
#[test]
fn slurm_settings_are_checked_before_anything_starts() {
    let outside = Run::new(["run", "--launcher", "slurm", "--sim", "2", "--", "true"]).run();
    outside.assert_code(2);
    assert!(
        outside
            .err()
            .contains("--launcher slurm needs a Slurm allocation (SLURM_JOB_ID is not set)"),
        "{}",
        outside.describe()
    );
    let malformed = Run::new(["run", "--sim", "2", "--", "true"])
        .env("SLURM_JOB_ID", "7")
        .env("SLURM_JOB_NODELIST", "n[1-3,x]")
        .run();
    malformed.assert_code(2);
    assert!(
        malformed
            .err()
            .contains("SLURM_JOB_NODELIST=\"n[1-3,x]\": [1-3,x]: \"x\" is not a number"),
        "{}",
        malformed.describe()
    );
    let uneven = Run::new(["run", "--sim", "2", "--", "true"])
        .env("SLURM_JOB_ID", "7")
        .env("SLURM_JOB_NODELIST", "n[1-3]")
        .env("SLURM_TASKS_PER_NODE", "2(x2)")
        .run();
    uneven.assert_code(2);
    assert!(
        uneven.err().contains(
            "SLURM_TASKS_PER_NODE=\"2(x2)\" counts 2 nodes, but SLURM_JOB_NODELIST=\"n[1-3]\" has 3"
        ),
        "{}",
        uneven.describe()
    );
    // An empty entry is named inside the whole value, not as if the variable were empty.
    let empty = Run::new(["run", "--sim", "2", "--", "true"])
        .env("SLURM_JOB_ID", "7")
        .env("SLURM_JOB_NODELIST", "n[1-2]")
        .env("SLURM_TASKS_PER_NODE", "4(x2),")
        .run();
    empty.assert_code(2);
    assert!(
        empty
            .err()
            .contains("SLURM_TASKS_PER_NODE=\"4(x2),\": \"\": an empty entry; want N or N(xM)"),
        "{}",
        empty.describe()
    );
    // Inside an allocation, -H means ssh (or this machine), as the user listed the hosts.
    let listed = Run::new(["run", "--sim", "2", "-H", "127.0.0.1", "--", "true"])
        .env("SLURM_JOB_ID", "7")
        .env("SLURM_JOB_NODELIST", "n[1-3]")
        .run();
    listed.assert_code(0);
    // With --launcher slurm, -H names nodes of the allocation: another is named, not left to
    // srun's "Requested node configuration is not available".
    let stranger = Run::new([
        "run",
        "--launcher",
        "slurm",
        "--sim",
        "2",
        "-H",
        "n2,n9",
        "--",
        "true",
    ])
    .env("SLURM_JOB_ID", "7")
    .env("SLURM_JOB_NODELIST", "n[1-3]")
    .run();
    stranger.assert_code(2);
    assert!(
        stranger
            .err()
            .contains("host \"n9\" (-H) is not a node of Slurm job 7 (n[1-3])"),
        "{}",
        stranger.describe()
    );
    // Options of atlasboost's own ssh sessions, where srun starts the agents, are refused.
    for (flag, value) in [("--fanout", "2"), ("--ssh-port", "2222")] {
        let over_srun = Run::new(["run", "--sim", "2", flag, value, "--", "true"])
            .env("SLURM_JOB_ID", "7")
            .env("SLURM_JOB_NODELIST", "n[1-3]")
            .run();
        over_srun.assert_code(2);
        assert!(
            over_srun.err().contains(&format!(
                "{flag} applies to atlasboost's ssh sessions, and this launch opens none: srun \
                 starts the agents"
            )),
            "{}",
            over_srun.describe()
        );
    }
    let with_mpi = Run::new([
        "run",
        "--mpi",
        "--launcher",
        "slurm",
        "--sim",
        "2",
        "--",
        "true",
    ])
    .env("SLURM_JOB_ID", "7")
    .run();
    with_mpi.assert_code(2);
    assert!(
        with_mpi
            .err()
            .contains("--launcher slurm starts atlasboost's agents"),
        "{}",
        with_mpi.describe()
    );
}

#[test]
fn a_lost_node_is_left_out_of_the_restart() {
    let cluster = cluster_or_skip!();
    let n = cluster.nodes.len();
    let mut launch = cluster
        .salloc(&[
            "run",
            "--sim",
            "2",
            "--max-restarts",
            "1",
            "--min-np",
            "2",
            "--restart-delay",
            "0",
            "--grace",
            "2",
            "--events",
            "events.jsonl",
            "--",
            "sh",
            "-c",
            "echo attempt=$ATLASBOOST_RESTART_COUNT node=$SLURMD_NODENAME
             if [ $ATLASBOOST_RESTART_COUNT = 0 ]; then exec sleep 60; fi",
        ])
        .spawn();
    launch.wait_for_lines("attempt=0", 2 * n, Duration::from_secs(60));
    // The last node's agent dies (as in a node failure): Slurm ends the whole step
    // (--kill-on-bad-exit), and the launcher restarts on the other nodes.
    let victim = cluster.nodes.last().unwrap().clone();
    let ns = cluster.netns.last().unwrap();
    let pids = Command::new("ip")
        .args(["netns", "pids", ns])
        .output()
        .unwrap();
    let agent = String::from_utf8_lossy(&pids.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
        .find(|&p| atlasboost_e2e::cmdline(p).is_some_and(|c| c.iter().any(|a| a == "agent")))
        .expect("the agent of the last node");
    kill(Pid::from_raw(agent), Signal::SIGKILL).unwrap();
    let done = launch.wait_at_most(Duration::from_secs(60));
    done.assert_code(0);
    let again: Vec<String> = done
        .out()
        .lines()
        .filter(|l| l.contains(":attempt=1 "))
        .map(str::to_string)
        .collect();
    assert_eq!(again.len(), 2 * (n - 1), "{}", done.describe());
    assert!(
        again
            .iter()
            .all(|l| !l.ends_with(&format!("node={victim}"))),
        "node {victim} ran in the restart:\n{}",
        done.describe()
    );
    assert!(
        done.err().contains(&format!("host {victim} (")),
        "{}",
        done.describe()
    );
    // Only the node whose agent died is left out; those lost with the step are not.
    let left_out: Vec<(String, String)> = events_of(&done, "host_left_out")
        .iter()
        .map(|e| (e["host"].to_string(), e["why"].to_string()))
        .collect();
    assert!(
        matches!(&left_out[..], [(host, why)]
            if host.starts_with(&format!("\"{victim} (")) && why == "\"lost\""),
        "{left_out:?}"
    );
    cluster.assert_nothing_left("after a restart without a lost node");
}

/// Puts a node that a test drained back into service, however the test ends, so that the next
/// test's `salloc` gets every node.
struct Undrain<'a> {
    cluster: &'a Cluster,
    node: String,
}

impl Drop for Undrain<'_> {
    fn drop(&mut self) {
        let _ = Command::new("scontrol")
            .args(["update", &format!("nodename={}", self.node), "state=resume"])
            .env("SLURM_CONF", &self.cluster.conf)
            .status();
    }
}

#[test]
fn a_node_that_slurm_drained_is_left_out_of_the_restart_with_slurms_reason() {
    let cluster = cluster_or_skip!();
    let n = cluster.nodes.len();
    let victim = cluster.nodes[1].clone();
    let mut launch = cluster
        .salloc(&[
            "run",
            "--sim",
            "2",
            "--max-restarts",
            "1",
            "--min-np",
            "2",
            "--restart-delay",
            "0",
            "--events",
            "events.jsonl",
            "--",
            "sh",
            "-c",
            // Attempt 0: rank 0 fails once the test has drained a node; the others wait.
            "echo attempt=$ATLASBOOST_RESTART_COUNT node=$SLURMD_NODENAME
             if [ $ATLASBOOST_RESTART_COUNT = 0 ]; then
               if [ $RANK_ID = 0 ]; then
                 while [ ! -e fail ]; do sleep 0.1; done; exit 7
               fi
               exec sleep 60
             fi",
        ])
        .spawn();
    launch.wait_for_lines("attempt=0", 2 * n, Duration::from_secs(60));
    // As a health check does when it finds a faulty NPU: the node stays up, its agent and
    // workers keep running, and only Slurm's state says not to use it.
    let undrain = Undrain {
        cluster: &cluster,
        node: victim.clone(),
    };
    cluster.client(
        "scontrol",
        &[
            "update",
            &format!("nodename={victim}"),
            "state=drain",
            "reason=npu 3 ecc errors",
        ],
    );
    std::fs::write(launch.dir().join("fail"), "").unwrap();
    let done = launch.wait_at_most(Duration::from_secs(60));
    drop(undrain);
    done.assert_code(0);
    let out = done.out();
    let again: Vec<&str> = out
        .lines()
        .filter(|l| l.contains(":attempt=1 "))
        .map(|l| l.rsplit_once(" node=").map_or("", |(_, node)| node))
        .collect();
    assert_eq!(again.len(), 2 * (n - 1), "{}", done.describe());
    assert!(
        !again.contains(&victim.as_str()),
        "the drained node {victim} ran in the restart:\n{}",
        done.describe()
    );
    let said = done
        .err()
        .lines()
        .find(|l| l.contains("out of the restart"))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no word of the drained node:\n{}", done.describe()));
    assert!(
        said.starts_with(&format!("atlasboost: leaving {victim} ("))
            && said.contains(&format!("Slurm says {victim} is "))
            && said.contains("DRAIN")
            && said.ends_with("(npu 3 ecc errors)"),
        "{said}"
    );
    let left_out = events_of(&done, "host_left_out");
    assert_eq!(left_out.len(), 1, "{left_out:?}");
    assert!(
        left_out[0]["host"]
            .as_str()
            .is_some_and(|h| h.starts_with(&format!("{victim} ("))),
        "{left_out:?}"
    );
    assert_eq!(left_out[0]["attempt"], 0, "{left_out:?}");
    assert!(
        left_out[0]["why"]
            .as_str()
            .is_some_and(|w| w.starts_with("Slurm says")),
        "{left_out:?}"
    );
    cluster.assert_nothing_left("after a restart without a drained node");
}

#[test]
fn a_node_drained_after_the_allocation_is_named_at_the_launch_and_still_runs() {
    let cluster = cluster_or_skip!();
    let n = cluster.nodes.len();
    let victim = cluster.nodes[n - 1].clone();
    let _undrain = Undrain {
        cluster: &cluster,
        node: victim.clone(),
    };
    // Drained between salloc's allocation and the launch, as a health check does.
    let drain = format!(
        "scontrol update nodename={victim} state=drain 'reason=npu 5 offline' && exec \"$@\""
    );
    let done = cluster
        .salloc_with(
            &["sh", "-c", &drain, "sh"],
            &[
                "run",
                "--sim",
                "2",
                "--",
                "sh",
                "-c",
                "echo node=$SLURMD_NODENAME",
            ],
        )
        .run();
    done.assert_code(0);
    let err = done.err();
    let said: Vec<&str> = err.lines().filter(|l| l.contains("Slurm says")).collect();
    assert_eq!(
        said,
        [format!(
            "atlasboost: warning: Slurm says {victim} is ALLOCATED+DRAIN (npu 5 offline); the \
             launch goes on with the nodes the allocation gave"
        )],
        "{}",
        done.describe()
    );
    let on_victim = done
        .out()
        .lines()
        .filter(|l| l.ends_with(&format!("node={victim}")))
        .count();
    assert_eq!(on_victim, 2, "{}", done.describe());
}

#[test]
fn an_allocation_that_asked_for_tasks_gives_each_node_that_many_workers() {
    let cluster = cluster_or_skip!();
    let n = cluster.nodes.len();
    // SLURM_TASKS_PER_NODE=1(x3): one worker per node, though each has 4 devices.
    let done = cluster
        .salloc_with(
            &["--ntasks-per-node=1"],
            &[
                "run",
                "--sim",
                "4",
                "--",
                "sh",
                "-c",
                "echo on $SLURMD_NODENAME",
            ],
        )
        .run();
    done.assert_code(0);
    let by_rank = lines_by_rank(&done.out(), "stdout");
    assert_eq!(by_rank.len(), n, "{}", done.describe());
    let nodes: BTreeSet<&str> = by_rank
        .values()
        .filter_map(|l| l.first()?.strip_prefix("on "))
        .collect();
    assert_eq!(nodes.len(), n, "{}", done.describe());
}

#[test]
fn agents_that_cannot_start_fail_the_launch_with_what_srun_said() {
    let cluster = cluster_or_skip!();
    let done = cluster
        .salloc(&[
            "run",
            "--remote-atlasboost",
            "/no/such/atlasboost",
            "--sim",
            "2",
            "--",
            "true",
        ])
        .timeout(Duration::from_secs(60))
        .run();
    done.assert_code(125);
    let err = done.err();
    assert!(
        err.contains("srun ended")
            && err.contains("before the agents of")
            && err.contains("/no/such/atlasboost"),
        "{}",
        done.describe()
    );
    cluster.assert_nothing_left("after agents that could not start");
}

#[test]
fn metrics_show_every_nodes_devices_as_over_ssh() {
    let cluster = cluster_or_skip!();
    let port = atlasboost_e2e::free_port_pair().to_string();
    let mut launch = cluster
        .salloc(&[
            "run",
            "--sim",
            "2",
            "--monitor-interval",
            "1",
            "--metrics",
            &port,
            "--",
            "sh",
            "-c",
            "echo up; exec sleep 30",
        ])
        .spawn();
    launch.wait_for_lines(
        "<stdout>:up",
        2 * cluster.nodes.len(),
        Duration::from_secs(60),
    );
    let ips = cluster_ips(&cluster);
    // Every node's two devices, under npu-exporter's name, with the node as `host`.
    let every_node = |text: &str| {
        ips.values().all(|ip| {
            text.lines()
                .filter(|l| {
                    l.starts_with("npu_chip_info_hbm_total_memory{") && l.contains(ip.as_str())
                })
                .count()
                == 2
        })
    };
    let mut text = String::new();
    let seen = wait_until(Duration::from_secs(20), || {
        text = atlasboost_e2e::scrape_metrics(&port);
        every_node(&text)
    });
    launch.signal(Signal::SIGTERM);
    let done = launch.wait_at_most(Duration::from_secs(30));
    assert!(
        seen,
        "not every node's devices in the metrics:\n{text}\n{}",
        done.describe()
    );
    cluster.assert_nothing_left("after a job with --metrics");
}

#[test]
fn sbatch_runs_the_job_from_the_allocations_first_node() {
    let cluster = cluster_or_skip!();
    let n = cluster.nodes.len();
    let nodes = format!("-N{n}");
    let run = Run::new(["--wait", nodes.as_str(), "-o", "out.txt", "job.sh"])
        .program("sbatch")
        .env("SLURM_CONF", &cluster.conf)
        .timeout(Duration::from_secs(120));
    // The batch script runs on the first node, in its namespace: so does the launcher there.
    let script = format!(
        "#!/bin/sh\nexec {} run --sim 2 -- sh -c 'echo rank $RANK_ID on $SLURMD_NODENAME'\n",
        atlasboost_bin().display()
    );
    run.file("job.sh", script, true);
    let done = run.run();
    done.assert_code(0);
    let out = std::fs::read_to_string(done.dir().join("out.txt")).unwrap_or_default();
    let by_rank = lines_by_rank(&out, "stdout");
    assert_eq!(by_rank.len(), 2 * n, "{out}");
    let ran_on: BTreeSet<&str> = by_rank
        .values()
        .filter_map(|l| l.first()?.rsplit(' ').next())
        .collect();
    assert_eq!(ran_on.len(), n, "{out}");
    assert!(
        out.contains(&format!("{} succeeded, 0 failed", 2 * n)),
        "{out}"
    );
    cluster.assert_nothing_left("after an sbatch job");
}
