#!/usr/bin/env bash
# A real Slurm cluster on this one machine, for tests: runs COMMAND against it, then tears it down.
#
#     tests/slurm-cluster.sh COMMAND [ARGS...]
#
# Topology (as tests/netns-cluster.sh, with names and a subnet of its own so that both can run at
# once): a bridge sbr<pid> in the root namespace with 10.215.S.1/24, and one network namespace
# per node, slns<i>-<pid>, joined to the bridge by a veth pair slv<i>r<pid>/slv<i>n<pid>, with
# 10.215.S.1<i>. S is the first 10.215.S.0/24 not in use, claimed under a lock.
#
# Slurm (Debian's slurm-wlm 22.05; nothing under /etc/slurm, /etc/munge or /run/munge is read or
# touched, no service is used): a munged of its own (key, socket, pid, log and seed in the
# fixture's temp dir); slurmctld in the root namespace on a free port, reached at the bridge
# address; one slurmd per namespace, node abn<i> with NodeAddr its namespace's address, whose
# host name (a UTS namespace) is its node name. In the nodes and for COMMAND, /etc/hosts is the
# machine's plus the nodes' names, so that `abn1` resolves as on a cluster. No cgroups:
# proctrack/linuxproc (scancel kills a task's descendants even in process groups of their own,
# but not those whose parent exited before), task/none, select/linear (whole nodes).
# Before COMMAND runs, a smoke check passed (`srun -N<n>` runs one task per node, each in its
# node's namespace with its node's host name; `salloc -N<n>` gets every node) and every node is
# idle again.
#
# COMMAND runs in the root network namespace, in the current directory, with this script's
# stdin, in a mount namespace of its own (for /etc/hosts), with:
#     SLURM_CONF                the cluster's slurm.conf (srun, salloc, scontrol, ... use it)
#     SLURM_CLUSTER_NODES       node names, space-separated ("abn1 abn2 abn3")
#     SLURM_CLUSTER_IPS         their addresses, same order
#     SLURM_CLUSTER_NETNS       their network namespaces (/run/netns/<name>), same order
#     SLURM_CLUSTER_BRIDGE_IP   the root namespace's address on the bridge (srun's, to the nodes)
#     SLURM_CLUSTER_TMP         a temp dir of the fixture (removed at exit)
#     SLURM_CLUSTER_LOGS        the directory of slurmctld.log, slurmd-<node>.log, munged.log
# and no other SLURM_*, SRUN_*, SALLOC_* or SBATCH_* variable from outside (a job this script
# runs in must not leak into srun). The exit status is COMMAND's. On every exit path, jobs are
# cancelled and everything the fixture started or created is removed: daemons, whatever still
# runs in the namespaces or with this cluster's SLURM_CONF in its environment (COMMAND's
# leftover srun, salloc, tasks), namespaces, links, the temp dir.
#
# Settings: SLURM_CLUSTER_NODES_COUNT (1..8, default 3) nodes; SLURM_CLUSTER_CPUS (1..64,
# default 8) CPUs per node (slurmd takes the configuration's word for it, whatever the machine
# has); SLURM_CLUSTER_REQUIRE=1 turns a skip into a failure; SLURM_CLUSTER_VERBOSE=1 prints the
# smoke check's output and the teardown's time.
#
# Exit 0 with "slurm-cluster: skipped: <why>" without running COMMAND when the machine cannot do
# it (not root, no netns/veth/bridge, no slurm or munge binaries); "slurm-cluster: FAILED: <why>"
# and the daemons' log tails on stderr, exit 1, when setting up fails.
set -euo pipefail
# shellcheck source=tests/netns-lib.sh
. "$(cd "$(dirname "$0")" && pwd)/netns-lib.sh"

id=$$
count=${SLURM_CLUSTER_NODES_COUNT:-3}
cpus=${SLURM_CLUSTER_CPUS:-8}
br=sbr$id
lock=${TMPDIR:-/tmp}/atlasboost-slurm-cluster.lock
now() { echo "${EPOCHREALTIME/,/.}"; }
started=$(now)
tmp=
net=
conf=
ctld_pid=
munged_pid=
run_pid=
slurmd_pids=()
namespaces=()
nodes=()
ips=()

say() { printf 'slurm-cluster: %s\n' "$*"; }
# Seconds since $1 (a `now`), to a tenth.
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
verbose() { [[ ${SLURM_CLUSTER_VERBOSE:-} == 1 ]]; }
skip() {
    if [[ ${SLURM_CLUSTER_REQUIRE:-} == 1 ]]; then
        say "FAILED: cannot run here, and SLURM_CLUSTER_REQUIRE=1: $*" >&2
        exit 1
    fi
    say "skipped: $*"
    exit 0
}
# Prints the tails of log files, indented, to stderr.
show() {
    local f
    for f in "$@"; do
        [[ -s $f ]] || continue
        printf -- '--- %s (last 30 lines)\n' "${f#"$tmp"/}" >&2
        tail -n 30 -- "$f" | sed 's/^/  /' >&2
    done
}
die() {
    say "FAILED: $*" >&2
    exit 1
}
# A failure of the cluster: the daemons' logs tell why.
fail() {
    say "FAILED: $*" >&2
    [[ -n $tmp ]] && show "$tmp/logs/slurmctld.log" "$tmp"/logs/slurmd-*.log "$tmp"/logs/*.out \
        "$tmp/logs/munged.log"
    exit 1
}

if [[ $# == 0 ]]; then
    echo "usage: $0 COMMAND [ARGS...]   (--help for more)" >&2
    exit 2
fi
if [[ $1 == -h || $1 == --help ]]; then
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
    exit 0
fi
[[ $count =~ ^[1-8]$ ]] || die "SLURM_CLUSTER_NODES_COUNT must be 1..8, not '$count'"
[[ $cpus =~ ^[1-9][0-9]?$ && $cpus -le 64 ]] || die "SLURM_CLUSTER_CPUS must be 1..64, not '$cpus'"
for i in $(seq "$count"); do
    namespaces+=("slns$i-$id")
    nodes+=("abn$i")
done
# Slurm's input variables from outside (say, a CI job under Slurm) would steer srun and salloc.
while read -r v; do
    [[ $v == SLURM_CLUSTER_* ]] || unset "$v"
done < <(compgen -e | grep -E '^(SLURM|SRUN|SALLOC|SBATCH)_' || true)

# Processes whose environment names this cluster's slurm.conf: COMMAND's srun, salloc and what
# they started, here or in the namespaces. (The path is unique to this run.)
ours() {
    local e p
    [[ -n $conf ]] || return 0
    for e in /proc/[0-9]*/environ; do
        p=${e#/proc/}
        p=${p%/environ}
        [[ $p == "$$" || $p == "$BASHPID" ]] && continue
        grep -qzx -- "SLURM_CONF=$conf" "$e" 2>/dev/null && echo "$p"
    done
    return 0
}
# `reap SECONDS PID...`: waits until the PIDs are gone, at most SECONDS; 1 if some are left.
reap() {
    local secs=$1 p left
    shift
    for _ in $(seq $((secs * 10))); do
        left=
        for p in "$@"; do kill -0 "$p" 2>/dev/null && left=1; done
        [[ -z $left ]] && return 0
        sleep 0.1
    done
    return 1
}

# ---------------------------------------------------------------------------------------------
# Teardown: every exit path, and safe to run when set-up stopped half-way. Bounded: ~2 s when
# all goes well, at most ~30 s when nothing answers.
# ---------------------------------------------------------------------------------------------
cleanup() {
    local rc=$? n p pids daemons=() down
    down=$(now)
    set +e
    trap - EXIT INT TERM
    # COMMAND, if this script is stopped while it runs.
    if [[ -n $run_pid ]] && kill -0 "$run_pid" 2>/dev/null; then
        kill "$run_pid" 2>/dev/null
        reap 5 "$run_pid" || kill -KILL "$run_pid" 2>/dev/null
    fi
    # Jobs, while the controller is there to end them the Slurm way.
    if [[ -n $ctld_pid ]] && kill -0 "$ctld_pid" 2>/dev/null; then
        if [[ -n $(SLURM_CONF=$conf timeout 5 squeue -h -o %i 2>/dev/null) ]]; then
            SLURM_CONF=$conf timeout 5 scancel -u root 2>/dev/null
            for _ in $(seq 30); do
                [[ -z $(SLURM_CONF=$conf timeout 5 squeue -h -o %i 2>/dev/null) ]] && break
                sleep 0.1
            done
        fi
    fi
    # What COMMAND left behind (srun, salloc, tasks).
    pids=$(ours)
    # shellcheck disable=SC2086 # a list of pids
    [[ -n $pids ]] && kill $pids 2>/dev/null
    # The daemons, by the pids we have; munged last, as the others talk to it.
    for p in "${slurmd_pids[@]}" "$ctld_pid"; do [[ -n $p ]] && daemons+=("$p"); done
    if [[ ${#daemons[@]} -gt 0 ]]; then
        kill "${daemons[@]}" 2>/dev/null
        if ! reap 5 "${daemons[@]}"; then
            # Each leads a process group of its own (setsid), slurmctld's with slurmscriptd.
            for p in "${daemons[@]}"; do kill -KILL -- "-$p" 2>/dev/null; done
        fi
    fi
    if [[ -n $munged_pid ]]; then
        kill "$munged_pid" 2>/dev/null
        reap 3 "$munged_pid" || kill -KILL "$munged_pid" 2>/dev/null
    fi
    # Whatever else still runs inside our namespaces (slurmstepd, tasks) was started by this run.
    netns_remove "${namespaces[@]}"
    pids=$(ours)
    if [[ -n $pids ]]; then
        # shellcheck disable=SC2086 # a list of pids
        reap 2 $pids || kill -KILL $pids 2>/dev/null
    fi
    for i in $(seq "$count"); do ip link del "slv${i}r$id" 2>/dev/null; done
    ip link del "$br" 2>/dev/null
    [[ -n $tmp && -d $tmp ]] && rm -rf -- "$tmp"
    verbose && say "down in $(since "$down") s" >&2
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------------------------------------
# 1. Preconditions: what is missing or not permitted is a skip.
# ---------------------------------------------------------------------------------------------
[[ $(id -u) == 0 ]] || skip "needs root (network namespaces, slurmd)"
for tool in ip ss timeout flock setsid unshare mount hostname stat awk sed grep dd; do
    command -v "$tool" >/dev/null 2>&1 || skip "$tool is not installed"
done
for tool in slurmctld slurmd slurmstepd srun salloc scontrol scancel squeue munged; do
    p=$(PATH=$PATH:/usr/sbin:/sbin command -v "$tool" 2>/dev/null) ||
        skip "$tool is not installed (Debian: slurmctld, slurmd, slurm-client, munge)"
    declare "bin_$tool=$p"
done
[[ -f /etc/hosts ]] || skip "there is no /etc/hosts to show the nodes' names in"
netns_check_allowed "slns0-$id" "slv0r$id" "slv0n$id" "$br"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/slurm-cluster.XXXXXX")
[[ $tmp =~ ^[A-Za-z0-9/._-]+$ ]] || die "the temporary directory '$tmp' has odd characters in its path"
# Tasks and munge clients need to get through every directory on the way to the socket.
chmod 755 "$tmp"
mkdir -p "$tmp/munge" "$tmp/state" "$tmp/spool" "$tmp/logs" "$tmp/run" "$tmp/home"
chmod 755 "$tmp/munge" # munged wants it not writable by others, and clients through it
conf=$tmp/slurm.conf

# ---------------------------------------------------------------------------------------------
# 2. Topology: bridge + one namespace per node; the root namespace is 10.215.S.1 on the bridge.
# ---------------------------------------------------------------------------------------------
# A free 10.215.S.0/24, claimed under a lock so that parallel runs get different subnets.
netns_bridge "$br" 10.215 "$lock"
net=$NETNS_NET
bridge_ip=$net.1
for i in $(seq "$count"); do
    n=${namespaces[i - 1]}
    ip_i=$net.1$i
    ips+=("$ip_i")
    netns_add_host "$n" "slv${i}r$id" "slv${i}n$id" "$br" "$ip_i"
done

# ---------------------------------------------------------------------------------------------
# 3. A munged of our own. As root, with its files in a temp dir, it starts only with --force.
# ---------------------------------------------------------------------------------------------
sock=$tmp/munge/munge.socket
dd if=/dev/urandom of="$tmp/munge/munge.key" bs=1024 count=1 status=none
chmod 600 "$tmp/munge/munge.key"
"$bin_munged" --force --socket="$sock" --key-file="$tmp/munge/munge.key" \
    --pid-file="$tmp/munge/munged.pid" --seed-file="$tmp/munge/munged.seed" \
    --log-file="$tmp/logs/munged.log" --num-threads=4 >"$tmp/logs/munged.out" 2>&1 ||
    { show "$tmp/logs/munged.out" "$tmp/logs/munged.log"; die "munged did not start"; }
for _ in $(seq 50); do
    [[ -s $tmp/munge/munged.pid && -S $sock ]] && break
    sleep 0.1
done
[[ -s $tmp/munge/munged.pid && -S $sock ]] ||
    { show "$tmp/logs/munged.log"; die "munged wrote no pid file or socket in 5 s"; }
munged_pid=$(<"$tmp/munge/munged.pid")

# ---------------------------------------------------------------------------------------------
# 4. slurm.conf, cgroup.conf, hosts.
# ---------------------------------------------------------------------------------------------
host=$(hostname -s 2>/dev/null || hostname)
: >"$tmp/plugstack.conf" # not /etc/slurm/plugstack.conf
node_list=$(IFS=,; echo "${nodes[*]}")
write_conf() { # CTLD_PORT
    {
        cat <<EOF
# Written by tests/slurm-cluster.sh for one run.
ClusterName=sc$id
# slurmctld insists on being the machine named here; clients use the address in parentheses.
SlurmctldHost=$host($bridge_ip)
# slurmctld listens on every address of the root namespace: 22.05's NoCtldInAddrAny would bind
# it to the address of the machine's host name (127.0.0.1 here), not SlurmctldHost's. Each
# slurmd has a namespace of its own, so all share the standard port.
SlurmctldPort=$1
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sock
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool/%n
SlurmctldPidFile=$tmp/run/slurmctld.pid
SlurmdPidFile=$tmp/run/slurmd-%n.pid
SlurmctldLogFile=$tmp/logs/slurmctld.log
SlurmdLogFile=$tmp/logs/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$tmp/plugstack.conf
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/linear
SchedulerType=sched/backfill
# The CPUs below, whatever the machine has.
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=2
MessageTimeout=5
SlurmdTimeout=60
SlurmctldTimeout=60
InactiveLimit=0
MinJobAge=2
Waittime=0
EOF
        for i in $(seq "$count"); do
            echo "NodeName=${nodes[i - 1]} NodeAddr=${ips[i - 1]} CPUs=$cpus RealMemory=1000 State=UNKNOWN"
        done
        echo "PartitionName=main Nodes=$node_list Default=YES MaxTime=INFINITE State=UP"
    } >"$conf"
}
# Read by slurmd and slurmstepd from next to slurm.conf: see step 5.
echo "CgroupPlugin=cgroup/v1" >"$tmp/cgroup.conf"
for n in "${nodes[@]}"; do mkdir -p "$tmp/spool/$n"; done
# The machine's hosts file and the nodes: /etc/hosts of the nodes and of COMMAND.
{
    cat /etc/hosts
    echo "# slurm-cluster $id"
    for i in $(seq "$count"); do echo "${ips[i - 1]} ${nodes[i - 1]}"; done
} >"$tmp/hosts"

# ---------------------------------------------------------------------------------------------
# 5. The daemons, in the foreground, each in a process group of its own (so their pids are
#    known at once, and slurmctld's helper slurmscriptd goes with it).
# ---------------------------------------------------------------------------------------------
# slurmctld on a port that no socket of the root namespace uses; picked and bound under the
# lock, so that parallel runs cannot pick the same one.
exec 9>"$lock"
flock -w 30 9 || die "cannot take the lock $lock"
ctld_port=
listening=$(ss -Htan | awk '{print $4}' | sed 's/.*://' | sort -u)
for _ in $(seq 200); do
    p=$((20000 + RANDOM % 12000))
    grep -qx -- "$p" <<<"$listening" || { ctld_port=$p; break; }
done
[[ -n $ctld_port ]] || die "no free port for slurmctld"
write_conf "$ctld_port"
SLURM_CONF=$conf setsid "$bin_slurmctld" -D -c -f "$conf" >"$tmp/logs/slurmctld.out" 2>&1 &
ctld_pid=$!
deadline=$((SECONDS + 15))
until [[ -n $(ss -Htln "sport = :$ctld_port") ]]; do
    kill -0 "$ctld_pid" 2>/dev/null || fail "slurmctld exited at start"
    [[ $SECONDS -lt $deadline ]] || fail "slurmctld does not listen on port $ctld_port after 15 s"
    sleep 0.05
done
flock -u 9
exec 9>&-

# slurmd under `ip netns exec`, which gives it a mount namespace of its own with the sysfs of
# its network namespace (/sys/class/net shows the node's interfaces), and in a UTS namespace
# whose host name is the node name. slurmd 22.05 does not start without a cgroup plugin, and
# cgroup/v2 would make cgroups of its own in the machine's /sys/fs/cgroup: so /sys/fs/cgroup is
# an empty tmpfs there, where cgroup.conf's cgroup/v1 loads and does nothing (proctrack/linuxproc
# and task/none use no cgroup). /etc/hosts names the nodes.
for i in $(seq "$count"); do
    # shellcheck disable=SC2016 # for the inner sh
    SLURM_CONF=$conf setsid ip netns exec "${namespaces[i - 1]}" unshare --uts sh -c \
        'hostname "$1" &&
         mount -t tmpfs -o mode=755,size=64k slurm-cluster-cgroup /sys/fs/cgroup &&
         mount --bind "$2" /etc/hosts && shift 2 && exec "$@"' \
        sh "${nodes[i - 1]}" "$tmp/hosts" "$bin_slurmd" -D -f "$conf" -N "${nodes[i - 1]}" \
        >"$tmp/logs/slurmd-${nodes[i - 1]}.out" 2>&1 &
    slurmd_pids+=($!)
done

# Waits, at most 30 s, until every node is idle.
wait_idle() {
    local what=$1 states= deadline=$((SECONDS + 30)) p
    while [[ $SECONDS -lt $deadline ]]; do
        kill -0 "$ctld_pid" 2>/dev/null || fail "slurmctld exited while waiting for $what"
        for p in $(seq "$count"); do
            kill -0 "${slurmd_pids[p - 1]}" 2>/dev/null ||
                fail "the slurmd of ${nodes[p - 1]} exited while waiting for $what"
        done
        states=$(SLURM_CONF=$conf timeout 5 scontrol -o show nodes 2>/dev/null |
            sed -n 's/^NodeName=\([^ ]*\) .* State=\([^ ]*\) .*/\1=\2/p' | sort | tr '\n' ' ') || true
        [[ $(grep -o '=IDLE ' <<<"$states" | wc -l) == "$count" ]] && return 0
        sleep 0.1
    done
    fail "not every node is idle after 30 s, waiting for $what: ${states:-scontrol answers nothing}"
}
wait_idle "the nodes to register"

# ---------------------------------------------------------------------------------------------
# 6. Smoke check: srun puts one task on each node, in its node's namespace with its node's host
#    name; salloc gets every node, whole.
# ---------------------------------------------------------------------------------------------
smoke() { # NAME COMMAND...: runs it (bounded) in $tmp/home; its stdout in $out
    local name=$1 rc=0
    shift
    # (Not on our stdin, which is COMMAND's: srun would forward it to a task.)
    (cd "$tmp/home" && SLURM_CONF=$conf exec timeout -k 5 30 "$@") </dev/null >"$tmp/smoke.out" \
        2>"$tmp/smoke.err" || rc=$?
    out=$(<"$tmp/smoke.out")
    [[ $rc == 0 ]] || fail "the smoke check '$name' exited $rc$([[ $rc == 124 ]] && echo ' (timed out after 30 s)'):" \
        "$out $(<"$tmp/smoke.err")"
}
# shellcheck disable=SC2016 # for the tasks' shells
smoke "srun -N$count" "$bin_srun" -N"$count" --ntasks-per-node=1 \
    sh -c 'echo "$SLURMD_NODENAME $(hostname) $(stat -L -c %i /proc/self/ns/net)"'
for i in $(seq "$count"); do
    want="${nodes[i - 1]} ${nodes[i - 1]} $(stat -L -c %i "/run/netns/${namespaces[i - 1]}")"
    grep -qx -- "$want" <<<"$out" ||
        fail "the smoke check 'srun -N$count' did not print '$want' (node, host name, netns inode" \
            "of ${namespaces[i - 1]}); it printed: $out"
done
[[ $(wc -l <<<"$out") == "$count" ]] || fail "the smoke check 'srun -N$count' printed other lines: $out"
smoke_srun=$out
# shellcheck disable=SC2016
smoke "salloc -N$count" "$bin_salloc" -N"$count" \
    sh -c 'echo "$SLURM_JOB_NODELIST $SLURM_JOB_NUM_NODES $SLURM_TASKS_PER_NODE"'
grep -q "^[^ ]* $count " <<<"$out" || fail "the smoke check 'salloc -N$count' printed: $out"
smoke_salloc=$out
wait_idle "the smoke check's jobs to end"

if verbose; then
    say "smoke: srun -N$count (node, hostname, netns inode): $(tr '\n' ';' <<<"$smoke_srun")" >&2
    say "smoke: salloc -N$count (nodelist, nodes, tasks per node): $smoke_salloc" >&2
fi
say "up: nodes ${nodes[*]} at ${ips[*]} (netns ${namespaces[*]}, slurmctld $bridge_ip:$ctld_port) in $(since "$started") s"

# ---------------------------------------------------------------------------------------------
# 7. COMMAND. In the background and waited for, so that a signal to this script is acted on at
#    once; with this script's stdin (a background job's would be /dev/null).
# ---------------------------------------------------------------------------------------------
if { true <&0; } 2>/dev/null; then exec 8<&0; else exec 8</dev/null; fi
(
    export SLURM_CONF=$conf SLURM_CLUSTER_TMP=$tmp SLURM_CLUSTER_LOGS=$tmp/logs
    export SLURM_CLUSTER_NODES="${nodes[*]}" SLURM_CLUSTER_IPS="${ips[*]}"
    export SLURM_CLUSTER_NETNS="${namespaces[*]}" SLURM_CLUSTER_BRIDGE_IP=$bridge_ip
    # A mount namespace of its own, where /etc/hosts names the nodes.
    exec unshare --mount --propagation slave sh -c 'mount --bind "$1" /etc/hosts && shift && exec "$@"' \
        sh "$tmp/hosts" "$@" <&8 8<&-
) &
run_pid=$!
exec 8<&-
rc=0
wait "$run_pid" || rc=$?
run_pid=
exit "$rc"
