//! The hosts' network interface (`--nic`, and the default without it), in a network namespace
//! of the test's own with a `docker0`-like bridge and two more interfaces.

use atlasboost_e2e::{Finished, Run, atlasboost_bin, init_worker_bin};

use crate::lines_by_rank;

/// Interfaces of the namespace, in the kernel's order: `docker0` (a container bridge) first.
const SETUP: &str = "set -e; ip link set lo up; \
     for spec in docker0:172.17.0.1/16 eth9:10.99.0.5/24 eth8:10.98.0.5/24; do \
         name=${spec%%:*}; ip link add $name type veth peer name p$name; \
         ip addr add ${spec#*:} dev $name; ip link set $name up; ip link set p$name up; \
     done; exec \"$@\"";

/// `atlasboost ARGS` in a new network namespace with [`SETUP`]'s interfaces; `None` (and a
/// note) where network namespaces or veth pairs are not permitted.
fn in_namespace(args: &[&str], env: &[(&str, &str)]) -> Option<Finished> {
    in_namespace_run(&atlasboost_bin(), args, env)
}

/// `program ARGS` in a new network namespace with [`SETUP`]'s interfaces.
fn in_namespace_run(
    program: &std::path::Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> Option<Finished> {
    let probe = std::process::Command::new("unshare")
        .args([
            "-n",
            "sh",
            "-c",
            "ip link add probe0 type veth peer name probe1",
        ])
        .status();
    if probe.map_or(true, |s| !s.success()) {
        let why = "a network namespace with veth pairs (`unshare -n`, `ip`) is not permitted here";
        // scripts/test.sh sets it: CI permits them, so there a skip would hide a failure.
        assert!(
            std::env::var_os("ATLASBOOST_E2E_REQUIRE_NETNS").is_none_or(|v| v != "1"),
            "{why}, but ATLASBOOST_E2E_REQUIRE_NETNS=1"
        );
        eprintln!("skipped: {why}");
        return None;
    }
    let mut run = Run::new(["-n", "sh", "-c", SETUP, "sh"])
        .program("unshare")
        .args([program.as_os_str()])
        .args(args);
    for (k, v) in env {
        run = run.env(k, v);
    }
    Some(run.run())
}

const SHOW: [&str; 4] = [
    "--",
    "sh",
    "-c",
    "echo \"$ATLASBOOST_SERVER_ID $MASTER_ADDR $HCCL_IF_IP $HCCL_SOCKET_IFNAME $GLOO_SOCKET_IFNAME\"",
];

/// What each of the 2 ranks printed: server id, MASTER_ADDR, HCCL_IF_IP and the two names.
fn shown(r: &Finished) -> Vec<String> {
    r.assert_code(0);
    let by_rank = lines_by_rank(&r.out(), "stdout");
    assert_eq!(by_rank.len(), 2, "{}", r.describe());
    by_rank.into_values().flatten().collect()
}

#[test]
fn without_nic_the_default_skips_bridges_and_the_frameworks_get_its_interface() {
    let Some(r) = in_namespace(&[&["run", "--sim", "2"][..], &SHOW].concat(), &[]) else {
        return;
    };
    for line in shown(&r) {
        assert_eq!(
            line,
            "10.99.0.5 10.99.0.5 10.99.0.5 eth9 eth9",
            "{}",
            r.describe()
        );
    }
    // The user's own value is kept.
    let Some(r) = in_namespace(
        &[&["run", "--sim", "2"][..], &SHOW].concat(),
        &[("GLOO_SOCKET_IFNAME", "mine0")],
    ) else {
        return;
    };
    for line in shown(&r) {
        assert!(line.ends_with(" eth9 mine0"), "{line}\n{}", r.describe());
    }
}

#[test]
fn nic_by_name_or_network_is_used_for_server_id_and_exports() {
    for nic in ["eth8", "10.98.0.0/16"] {
        let Some(r) = in_namespace(
            &[&["run", "-v", "--sim", "2", "--nic", nic][..], &SHOW].concat(),
            &[],
        ) else {
            return;
        };
        for line in shown(&r) {
            assert_eq!(
                line,
                "10.98.0.5 10.98.0.5 10.98.0.5 eth8 eth8",
                "{nic}\n{}",
                r.describe()
            );
        }
        // Every host is this machine: no rendezvous (tests/netns-cluster.sh step 9 checks
        // that remote hosts meet on the --nic network).
        assert!(r.err().contains("no rendezvous"), "{nic}\n{}", r.describe());
    }
}

#[test]
fn a_nic_that_is_not_there_is_named_with_the_ones_that_are() {
    let Some(r) = in_namespace(&["run", "--sim", "2", "--nic", "eth7", "--", "true"], &[]) else {
        return;
    };
    r.assert_code(2);
    let err = r.err();
    assert!(
        err.contains("--nic eth7") && err.contains("eth8 10.98.0.5/24") && err.contains("docker0"),
        "{}",
        r.describe()
    );
    let Some(r) = in_namespace(
        &["run", "--sim", "2", "--nic", "10.1.0.0/16", "--", "true"],
        &[],
    ) else {
        return;
    };
    r.assert_code(2);
    assert!(r.err().contains("\"10.1.0.0/16\""), "{}", r.describe());
}

/// Library mode: `ATLASBOOST_NIC` picks the server id and the frameworks' interface; without
/// it, the interface of the server id (never the bridge).
#[test]
fn library_mode_takes_atlasboost_nic_and_the_same_default() {
    let report = |env: &[(&str, &str)]| {
        let r = in_namespace_run(&init_worker_bin(), &[], env)?;
        r.assert_code(0);
        let line = r
            .out()
            .lines()
            .find(|l| l.starts_with("rank="))
            .map(str::to_string);
        Some(line.unwrap_or_else(|| panic!("no report\n{}", r.describe())))
    };
    let Some(nic) = report(&[("ATLASBOOST_SIM", "2"), ("ATLASBOOST_NIC", "eth8")]) else {
        return;
    };
    assert!(
        nic.contains("server=10.98.0.5 ") && nic.contains(" gloo=eth8 hccl_if_ip=10.98.0.5 "),
        "{nic}"
    );
    let Some(default) = report(&[("ATLASBOOST_SIM", "2")]) else {
        return;
    };
    assert!(
        default.contains("server=10.99.0.5 ")
            && default.contains(" gloo=eth9 hccl_if_ip=10.99.0.5 "),
        "{default}"
    );
}
