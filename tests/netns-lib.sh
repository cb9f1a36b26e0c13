# Network-namespace hosts on a bridge, for the multi-host tests: sourced by
# tests/netns-cluster.sh (hosts reached over ssh) and tests/slurm-cluster.sh (Slurm nodes).
# The caller defines say, skip and die; every function here is bounded in time.

# netns_check_allowed PROBE_NS VETH_ROOT VETH_PEER BRIDGE: skips (the caller's skip, exit 0)
# when this machine does not let us make a namespace, a veth pair or a bridge; leaves nothing.
netns_check_allowed() {
    local ns=$1 veth=$2 peer=$3 br=$4 err
    if ! err=$(ip netns add "$ns" 2>&1); then
        skip "ip netns add is not permitted here: $err"
    fi
    ip netns del "$ns"
    if ! err=$(ip link add "$veth" type veth peer name "$peer" 2>&1); then
        skip "cannot create a veth pair here: $err"
    fi
    ip link del "$veth"
    if ! err=$(ip link add "$br" type bridge 2>&1); then
        skip "cannot create a bridge here: $err"
    fi
    ip link del "$br"
}

# netns_bridge BRIDGE PREFIX LOCK: makes BRIDGE, up, with PREFIX.S.1/24 on the first
# PREFIX.S.0/24 no interface uses, claimed under the lock file LOCK (so that parallel runs get
# different subnets); sets NETNS_NET=PREFIX.S.
netns_bridge() {
    local br=$1 prefix=$2 lock=$3 used s
    NETNS_NET=
    exec 9>"$lock"
    flock -w 30 9 || die "cannot take the subnet lock $lock"
    used=$(ip -4 -o addr show | awk '{print $4}')
    for s in $(seq 0 255); do
        grep -q "^${prefix//./\\.}\.$s\." <<<"$used" || { NETNS_NET=$prefix.$s; break; }
    done
    if [[ -z $NETNS_NET ]]; then
        flock -u 9
        exec 9>&-
        die "every $prefix.S.0/24 subnet is in use"
    fi
    ip link add "$br" type bridge
    ip addr add "$NETNS_NET.1/24" dev "$br"
    ip link set "$br" up
    flock -u 9
    exec 9>&-
}

# netns_add_host NS VETH_ROOT VETH_PEER BRIDGE IP: a namespace NS joined to BRIDGE by a veth
# pair (VETH_PEER inside NS, with IP/24), loopback up.
netns_add_host() {
    local ns=$1 veth=$2 peer=$3 br=$4 ip=$5
    ip netns add "$ns"
    ip link add "$veth" type veth peer name "$peer" netns "$ns"
    ip link set "$veth" master "$br" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$ip/24" dev "$peer"
    ip -n "$ns" link set "$peer" up
}

# netns_remove NS...: ends whatever still runs in each namespace that exists (SIGTERM, up to 5 s,
# then SIGKILL: it was all started by this run) and deletes it.
netns_remove() {
    local ns pids
    for ns in "$@"; do
        if [[ -e /run/netns/$ns ]]; then
            pids=$(ip netns pids "$ns" 2>/dev/null)
            # shellcheck disable=SC2086 # a list of pids
            [[ -n $pids ]] && kill $pids 2>/dev/null
        fi
    done
    for ns in "$@"; do
        [[ -e /run/netns/$ns ]] || continue
        for _ in $(seq 50); do
            [[ -z $(ip netns pids "$ns" 2>/dev/null) ]] && break
            sleep 0.1
        done
        pids=$(ip netns pids "$ns" 2>/dev/null)
        # shellcheck disable=SC2086 # a list of pids
        [[ -n $pids ]] && kill -KILL $pids 2>/dev/null
        ip netns del "$ns" || say "warning: cannot delete namespace $ns" >&2
    done
}
