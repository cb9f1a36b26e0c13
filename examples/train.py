#!/usr/bin/env python3
"""A fake training worker for trying out `atlasboost run`.

It reads what the launcher sets (RANK_ID, RANK_SIZE, DEVICE_ID, RANK_TABLE_FILE, and
LOCAL_RANK, WORLD_SIZE, JOB_ID when present), loads the rank table, and prints a few
steps of a decreasing fake loss. No NPU, no framework: Python 3's standard library only.

    atlasboost run --sim 8 -H 127.0.0.1:4,127.0.0.2:4 -- python3 examples/train.py

Where the atlasboost package is installed (`pip install ./bindings/python`), it starts as the
original tool's workers did, and prints one more line saying where init() put it:

    import atlasboost.tensorflow.mpi_ops as atlasboost
    atlasboost.init(frame="tensorflow")
    atlasboost.set_device_id(atlasboost.local_rank())

init() sets the same variables, so the rest is the same; and then any launcher will do:

    ATLASBOOST_SIM=4 mpirun -np 4 python3 examples/train.py     (a package built with MPI)

Make one rank fail, to see how the launcher reports it and stops the others:

    atlasboost run --sim 8 -- python3 examples/train.py --steps 10 --fail-rank 3 --exit-code 7
"""

import argparse
import json
import math
import os
import sys
import time

try:
    import atlasboost.tensorflow.mpi_ops as atlasboost
except ImportError:  # not installed: the standard library only
    atlasboost = None

REQUIRED = ("RANK_ID", "RANK_SIZE", "DEVICE_ID", "RANK_TABLE_FILE")


def parse_args():
    p = argparse.ArgumentParser(description="Fake training worker for atlasboost run.")
    p.add_argument("--steps", type=int, default=5, help="number of steps (default 5)")
    p.add_argument("--sleep", type=float, default=0.2, help="seconds per step (default 0.2)")
    p.add_argument("--fail-rank", type=int, metavar="R", help="this rank fails on purpose")
    p.add_argument("--fail-step", type=int, default=2, metavar="K", help="step it fails at (default 2)")
    p.add_argument("--exit-code", type=int, default=1, metavar="C", help="its exit code (default 1)")
    return p.parse_args()


def server_count(table):
    """Servers in a rank table: format 1.0/1.2 (server_list), or legacy (group_list)."""
    if "server_list" in table:
        return int(table.get("server_count") or len(table["server_list"]))
    return sum(len(g.get("instance_list", [])) for g in table.get("group_list", []))


def main():
    args = parse_args()
    if atlasboost is not None:
        try:
            atlasboost.init(frame="tensorflow")
            # The original tool's scripts pass local_rank(); device_id() is also right in library
            # mode on devices that do not start at 0 (an hccn.conf of devices 4-7).
            atlasboost.set_device_id(atlasboost.device_id())
        except atlasboost.AtlasBoostError as e:
            print(f"train.py: atlasboost.init() failed: {e}", file=sys.stderr)
            return 2
        print(
            f"atlasboost.init(): rank {atlasboost.rank()}/{atlasboost.size()}, local rank "
            f"{atlasboost.local_rank()}/{atlasboost.local_size()}, device {atlasboost.device_id()}, "
            f"launcher rank {atlasboost.launcher_rank()}",
            flush=True,
        )
    for name in REQUIRED:
        if not os.environ.get(name):
            print(f"train.py: {name} is not set or empty; start me with `atlasboost run`", file=sys.stderr)
            return 2
    rank, size = os.environ["RANK_ID"], os.environ["RANK_SIZE"]
    device, table_path = os.environ["DEVICE_ID"], os.environ["RANK_TABLE_FILE"]
    try:
        with open(table_path) as f:
            servers = server_count(json.load(f))
    except (OSError, ValueError, TypeError, AttributeError) as e:  # unreadable, not JSON, wrong shape
        print(f"train.py: rank {rank}: cannot read rank table {table_path}: {e}", file=sys.stderr)
        return 2

    plural = "" if servers == 1 else "s"
    print(f"rank {rank}/{size} on device {device} (table {table_path}, {servers} server{plural})", flush=True)
    local, world, job = (os.environ.get(v, "?") for v in ("LOCAL_RANK", "WORLD_SIZE", "JOB_ID"))
    print(f"local rank {local}, world size {world}, job {job}", flush=True)

    for step in range(1, args.steps + 1):
        if args.fail_rank is not None and str(args.fail_rank) == rank and step == args.fail_step:
            print(f"rank {rank}: failing on purpose (--fail-rank) at step {step}", file=sys.stderr)
            return args.exit_code
        loss = 2.5 * math.exp(-0.3 * step) + 0.001 * (int(rank) if rank.isdigit() else 0)
        print(f"step {step}/{args.steps} loss {loss:.4f}", flush=True)
        if step < args.steps:
            time.sleep(args.sleep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
