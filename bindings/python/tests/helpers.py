"""Helpers of the atlasboost package's tests: real processes, each wait bounded.

The tests run against the installed package (scripts/test-python.sh installs it in a virtual
environment first). Everything that calls `init()` runs in a child process: `init()` changes
the process's environment and job for good.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PYTHON = sys.executable
# The package's console script, next to this interpreter.
ATLASBOOST = str(Path(sys.executable).parent / "atlasboost")

# A launcher's variables in the environment pytest runs in would change what init() sees: the
# one list of the repository's tests (tests/hermetic-env.txt; a trailing * is a prefix).
_HERMETIC = [
    line.strip()
    for line in (Path(__file__).resolve().parents[3] / "tests" / "hermetic-env.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]
_LAUNCHER_VARS = {n for n in _HERMETIC if not n.endswith("*")}
_LAUNCHER_PREFIXES = tuple(n[:-1] for n in _HERMETIC if n.endswith("*"))


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any launcher's variables, plus `extra`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _LAUNCHER_VARS and not k.startswith(_LAUNCHER_PREFIXES)
    }
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


@dataclass
class Finished:
    """A finished process: its command, exit code and output."""

    args: Sequence[str]
    returncode: int
    stdout: str
    stderr: str

    def describe(self) -> str:
        return (
            f"command: {' '.join(map(str, self.args))}\nexit: {self.returncode}\n"
            f"--- stdout\n{self.stdout}--- stderr\n{self.stderr}"
        )


def start(args: Sequence[str], *, env: Mapping[str, str], cwd: Path | None = None) -> subprocess.Popen[str]:
    """Starts `args` in a session of its own (so that a timeout can stop all it started)."""
    return subprocess.Popen(
        [str(a) for a in args],
        env=dict(env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        start_new_session=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float) -> Finished:
    """Waits at most `timeout` seconds for `proc`; past that, kills its session and fails."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate(timeout=10)
        done = Finished(proc.args, -9, out, err)  # type: ignore[arg-type]
        pytest.fail(f"still running after {timeout} s, killed\n{done.describe()}")
    return Finished(proc.args, proc.returncode, out, err)  # type: ignore[arg-type]


def run(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 60,
) -> Finished:
    """Runs `args` to the end (at most `timeout` seconds) in a clean environment."""
    return finish(start(args, env=clean_env() if env is None else env, cwd=cwd), timeout)


def run_python(
    code: str,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 60,
) -> Finished:
    """Runs Python `code` (dedented) in a child interpreter."""
    return run([PYTHON, "-c", textwrap.dedent(code)], env=env, cwd=cwd, timeout=timeout)


def free_port_pair() -> int:
    """A port p such that p and p + 1 are free now (MASTER_PORT, and the rendezvous at + 1).

    Picked below the kernel's ephemeral range: a port the kernel hands out on its own (bind to
    0) is one it may also give the next outgoing connection, which took p + 1 from under a
    test once (CI: "cannot bind ...: Address already in use").
    """
    low = ephemeral_range()[0]
    if low <= 20002:
        raise RuntimeError(f"the ephemeral port range starts at {low}: no room below it")
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, low - 1)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("0.0.0.0", port))
                b.bind(("0.0.0.0", port + 1))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no two free ports in a row in 20000..{low - 1}")


def need_mpirun() -> str:
    """mpirun's path; skips the test, saying why, where Open MPI is not installed, and fails it
    where it should be (scripts/test-python.sh installs it: ATLASBOOST_PYTHON_REQUIRE_MPI=1)."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        if os.environ.get("ATLASBOOST_PYTHON_REQUIRE_MPI") == "1":
            pytest.fail("mpirun is not installed, but scripts/test-python.sh installed Open MPI")
        pytest.skip("mpirun is not installed (Debian: openmpi-bin)")
    return mpirun


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel picks from for outgoing connections (ip_local_port_range)."""
    text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return int(text[0]), int(text[1])


# The original tool's usage, then a report of what the process sees: one line `REPORT {json}`.
WORKER = """\
import json
import os
import sys

import atlasboost.tensorflow.mpi_ops as atlasboost

atlasboost.init(frame="tensorflow")
atlasboost.set_device_id(atlasboost.local_rank())

env = os.environ
report = {
    "rank": atlasboost.rank(),
    "size": atlasboost.size(),
    "local_rank": atlasboost.local_rank(),
    "local_size": atlasboost.local_size(),
    "launcher_rank": atlasboost.launcher_rank(),
    "mpi_rank": atlasboost.mpi_rank(),
    "device_id": atlasboost.device_id(),
    "rank_table_file": atlasboost.rank_table_file(),
    "env": {name: env.get(name) for name in (
        "RANK_ID", "RANK_SIZE", "RANK_TABLE_FILE", "DEVICE_ID", "ASCEND_DEVICE_ID", "RANK",
        "MASTER_ADDR", "MASTER_PORT", "ATLASBOOST_SERVER_ID", "ATLASBOOST_PHYSICAL_ID",
        "ATLASBOOST_FRAMEWORK", "OMPI_COMM_WORLD_RANK", "EXPECT_LAUNCHER_RANK")},
}
print("REPORT " + json.dumps(report), flush=True)
# mpirun may cut long lines of several ranks into pieces: a file per process too.
if env.get("REPORT_DIR"):
    with open(os.path.join(env["REPORT_DIR"], f"report.{os.getpid()}.json"), "w") as f:
        json.dump(report, f)
"""



def reports(output: str) -> list[dict]:
    """Every `REPORT {json}` line of `output` (tagged by a launcher or not)."""
    found = []
    for line in output.splitlines():
        at = line.find("REPORT ")
        if at >= 0:
            found.append(json.loads(line[at + len("REPORT ") :]))
    return found


def report_files(directory: Path) -> list[dict]:
    """The reports written to REPORT_DIR `directory`."""
    return [json.loads(p.read_text()) for p in sorted(directory.glob("report.*.json"))]


def check_job(found: list[dict], size: int, table: Path, hosts: int = 1) -> None:
    """The reports of a whole job agree with each other and with the rank table on disk."""
    assert sorted(r["rank"] for r in found) == list(range(size)), found
    data = json.loads(table.read_text())
    entries = {
        d["rank_id"]: (s["server_id"], d["device_id"])
        for s in data["server_list"]
        for d in s["device"]
    }
    assert data["server_count"] == str(hosts), data
    assert len(entries) == size, data
    by_server: dict[str, list[int]] = {}
    for r in found:
        env = r["env"]
        assert r["size"] == size, r
        assert r["rank_table_file"] == str(table), r
        assert env["RANK_TABLE_FILE"] == str(table), r
        # rank() is RANK_ID, and the table's entry for this process's own device.
        assert env["RANK_ID"] == str(r["rank"]), r
        assert env["RANK_SIZE"] == str(size), r
        assert entries[str(r["rank"])] == (env["ATLASBOOST_SERVER_ID"], env["ATLASBOOST_PHYSICAL_ID"]), (r, data)
        # set_device_id(local_rank()) was accepted: simulated devices number from 0 per host.
        assert r["device_id"] == r["local_rank"], r
        assert env["DEVICE_ID"] == env["ASCEND_DEVICE_ID"] == str(r["device_id"]), r
        assert r["local_size"] == size // hosts, r
        by_server.setdefault(env["ATLASBOOST_SERVER_ID"], []).append(r["local_rank"])
    assert len(by_server) == hosts, found
    for local in by_server.values():
        assert sorted(local) == list(range(size // hosts)), found


def wait_all(procs: list[subprocess.Popen[str]], timeout: float) -> list[Finished]:
    """Waits for every process, all within one `timeout`; none is left running."""
    deadline = time.monotonic() + timeout
    try:
        return [finish(p, max(0.1, deadline - time.monotonic())) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(timeout=10)
