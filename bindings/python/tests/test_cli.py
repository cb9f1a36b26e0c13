"""The `atlasboost` console script and `python -m atlasboost`: the command the package ships
(`atlasboost/_bin/atlasboost`), with its exit codes."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from helpers import ATLASBOOST, PYTHON, REPO, clean_env, need_mpirun, run, start

COMMANDS = [
    pytest.param([ATLASBOOST], id="console-script"),
    pytest.param([PYTHON, "-m", "atlasboost"], id="python-m"),
]


@pytest.mark.parametrize("command", COMMANDS)
def test_help(command: list[str]) -> None:
    r = run([*command, "--help"], timeout=30)
    assert r.returncode == 0, r.describe()
    assert "Usage: atlasboost [OPTIONS] <COMMAND>" in r.stdout, r.describe()
    for sub in ("run", "ranktable", "merge", "validate", "probe"):
        assert f"  {sub} " in r.stdout, (sub, r.stdout)
    r = run([*command, "run", "--help"], timeout=30)
    assert r.returncode == 0, r.describe()
    assert "Usage: atlasboost run [OPTIONS]" in r.stdout, r.describe()
    assert "--sim <N>" in r.stdout


def test_the_shipped_command_carries_no_debug_information() -> None:
    """The workspace's release builds keep line tables (44 MB); the wheel's command is
    stripped of them, as its native module is."""
    import shutil
    import subprocess

    import atlasboost

    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf is not installed (Debian: binutils)")
    command = Path(atlasboost.__file__).parent / "_bin" / "atlasboost"
    assert command.is_file(), command
    sections = subprocess.run([readelf, "-S", "-W", str(command)], capture_output=True, text=True,
                              timeout=30, check=True).stdout
    assert ".text" in sections, sections
    # (.debug_gdb_scripts, a loaded section for gdb's pretty-printers, is not debug information.)
    for debug in (".debug_info", ".debug_line"):
        assert debug not in sections, sections


def test_version_is_the_packages() -> None:
    import atlasboost

    r = run([ATLASBOOST, "--version"], timeout=30)
    assert r.returncode == 0, r.describe()
    mpi = "yes" if atlasboost.build_info()["mpi"] else "no"
    assert r.stdout.strip() == f"atlasboost {atlasboost.__version__} (MPI support: {mpi})", r.describe()


def test_a_usage_error_exits_2() -> None:
    r = run([ATLASBOOST, "run", "--no-such-flag", "--", "true"], timeout=30)
    assert r.returncode == 2, r.describe()
    assert "--no-such-flag" in r.stderr, r.describe()
    assert "Traceback" not in r.stderr, r.describe()


@pytest.mark.parametrize("command", COMMANDS)
def test_a_small_launch(tmp_path: Path, command: list[str]) -> None:
    code = "import os; print('hello from', os.environ['RANK_ID'], 'of', os.environ['RANK_SIZE'])"
    r = run([*command, "run", "--sim", "2", "--", PYTHON, "-c", code], cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.describe()
    lines = sorted(line for line in r.stdout.splitlines() if "hello" in line)
    assert lines == ["[0]<stdout>:hello from 0 of 2", "[1]<stdout>:hello from 1 of 2"], r.describe()
    assert "2 succeeded, 0 failed" in r.stderr, r.describe()
    assert (tmp_path / "rank_table.json").is_file()


def test_run_mpi_from_the_package_prints_whole_lines(tmp_path: Path) -> None:
    """`atlasboost run --mpi` of the package: mpirun starts each rank as the package's relay,
    which sends the worker's lines to the launcher whole, however they were written."""
    need_mpirun()
    code = "import os\nr = os.environ['OMPI_COMM_WORLD_RANK']\nfor i in range(1000):\n    print(r, i, 'end')\n"
    r = run([ATLASBOOST, "run", "--mpi", "--sim", "4", "--", PYTHON, "-c", code], cwd=tmp_path, timeout=90)
    assert r.returncode == 0, r.describe()
    lines = [line for line in r.stdout.splitlines() if line]
    assert len(lines) == 4000, r.describe()
    for rank in range(4):
        mine = [line for line in lines if line.startswith(f"[{rank}]<stdout>:")]
        assert mine == [f"[{rank}]<stdout>:{rank} {i} end" for i in range(1000)], (rank, mine[:3])
    assert "4 succeeded, 0 failed" in r.stderr, r.describe()


def test_run_mpi_from_the_package_starts_its_static_relay_as_every_rank(tmp_path: Path) -> None:
    """A wheel without MPI support carries the relay program beside the command, statically
    linked and without debug information, and `run --mpi` with every rank here starts it as
    each rank; one with MPI support (whose MPI library is shared only) relays with the command."""
    import subprocess

    import atlasboost

    need_mpirun()
    programs = Path(atlasboost.__file__).resolve().parent / "_bin"
    relay = programs / "atlasboost-relay"
    if atlasboost.build_info()["mpi"]:
        assert not relay.exists(), relay
        expected = programs / "atlasboost"
    elif not relay.exists() and os.environ.get("ATLASBOOST_PYTHON_REQUIRE_STATIC_RELAY") != "1":
        # The build backend goes without it where the static link fails (no static C library).
        pytest.skip(f"the package has no {relay.name} (its static link failed at the build, which said why)")
    else:
        assert relay.is_file(), relay
        check = subprocess.run(["bash", str(REPO / "scripts" / "build-static-relay.sh"), "--check", str(relay)],
                               capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, (check.stdout, check.stderr)
        sections = subprocess.run(["readelf", "--sections", "-W", str(relay)],
                                  capture_output=True, text=True, timeout=30, check=True).stdout
        assert ".text" in sections and ".debug_info" not in sections, sections
        expected = relay
    r = run([ATLASBOOST, "run", "-q", "--mpi", "--sim", "2", "--", "sh", "-c", "readlink /proc/$PPID/exe"],
            cwd=tmp_path, timeout=90)
    assert r.returncode == 0, r.describe()
    assert sorted(r.stdout.split()) == [f"[0]<stdout>:{expected}", f"[1]<stdout>:{expected}"], r.describe()


def test_python3_on_path_is_this_interpreter_in_a_launch(tmp_path: Path) -> None:
    """`atlasboost run ... -- python3 -c ...` as a user types it (python3 from PATH)."""
    code = "import atlasboost; atlasboost.init(); print('rank', atlasboost.rank())"
    env = clean_env(PATH=f"{Path(PYTHON).parent}:{clean_env()['PATH']}")
    r = run([ATLASBOOST, "run", "--sim", "2", "--", "python3", "-c", code], env=env, cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.describe()
    assert sorted(line for line in r.stdout.splitlines() if "rank" in line) == [
        "[0]<stdout>:rank 0",
        "[1]<stdout>:rank 1",
    ], r.describe()


def test_the_workers_exit_code_is_the_scripts(tmp_path: Path) -> None:
    code = "import os, sys; sys.exit(7 if os.environ['RANK_ID'] == '1' else 0)"
    r = run([ATLASBOOST, "run", "-q", "--sim", "2", "--", PYTHON, "-c", code], cwd=tmp_path, timeout=60)
    assert r.returncode == 7, r.describe()
    assert "rank 1" in r.stderr and "exit 7" in r.stderr, r.describe()


def test_a_command_not_found_exits_127(tmp_path: Path) -> None:
    r = run([ATLASBOOST, "run", "-q", "--sim", "1", "--", "no-such-command-atlasboost"], cwd=tmp_path, timeout=60)
    assert r.returncode == 127, r.describe()


def test_other_commands_work_too(tmp_path: Path) -> None:
    out = tmp_path / "table.json"
    r = run([ATLASBOOST, "ranktable", "--sim", "4", "--server-id", "10.1.0.1", "-o", str(out)], timeout=30)
    assert r.returncode == 0, r.describe()
    table = json.loads(out.read_text())
    assert table["server_list"][0]["server_id"] == "10.1.0.1"
    r = run([ATLASBOOST, "validate", str(out)], timeout=30)
    assert r.returncode == 0, r.describe()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**table, "status": "pending"}))
    r = run([ATLASBOOST, "validate", str(bad)], timeout=30)
    assert r.returncode == 1, r.describe()


@pytest.mark.parametrize("command", COMMANDS)
def test_a_result_for_a_closed_stdout_is_an_error_not_lost(command: list[str]) -> None:
    # `>&-`: descriptor 1 closed, which the program must see before anything reopens it.
    script = '"$@" ranktable --sim 2 --server-id 10.1.0.1 -o - >&-'
    r = run(["sh", "-c", script, "sh", *command], timeout=30)
    assert r.returncode == 125, r.describe()
    assert "it was closed when atlasboost started (>&-)" in r.stderr, r.describe()


class Lines:
    """Reads a process's stdout lines in the background."""

    def __init__(self, proc) -> None:
        self.lines: list[str] = []
        self.changed = threading.Condition()
        self.thread = threading.Thread(target=self._read, args=(proc.stdout,), daemon=True)
        self.thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            with self.changed:
                self.lines.append(line.rstrip("\n"))
                self.changed.notify_all()

    def wait_for(self, predicate, timeout: float) -> list[str]:
        with self.changed:
            if not self.changed.wait_for(lambda: predicate(self.lines), timeout):
                raise AssertionError(f"not seen within {timeout} s; lines so far: {self.lines}")
            return list(self.lines)


# Each worker starts a grandchild in its process group, prints both pids, and waits.
SLEEPER = "sleep 60 & echo worker $$ child $!; wait"


def _pids(lines: list[str]) -> list[int]:
    pids = []
    for line in lines:
        words = line.split(":", 1)[-1].split()
        if words[:1] == ["worker"]:
            pids += [int(words[1]), int(words[3])]
    return pids


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def _stop_all(proc, reader: Lines, pids: list[int]) -> None:
    """Leaves nothing running or open, whatever happened (a failed test included)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    reader.thread.join(timeout=10)
    proc.stdout.close()
    proc.stderr.close()


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_to_the_script_stops_the_job(tmp_path: Path, sig: signal.Signals, code: int) -> None:
    proc = start([ATLASBOOST, "run", "--sim", "2", "--grace", "5", "--", "sh", "-c", SLEEPER],
                 env=clean_env(), cwd=tmp_path)
    reader = Lines(proc)
    pids: list[int] = []
    try:
        pids = _pids(reader.wait_for(lambda ls: len(_pids(ls)) == 4, timeout=30))
        os.kill(proc.pid, sig)
        returncode = proc.wait(timeout=30)
        err = proc.stderr.read()
        assert returncode == code, err
        assert _wait_gone(pids, timeout=5) == [], f"still running: {pids}"
    finally:
        _stop_all(proc, reader, pids)


def test_kill_9_of_the_script_leaves_no_worker_behind(tmp_path: Path) -> None:
    """The lifeline (forked by the launcher, the command the script became) stops the workers'
    process groups when the launcher dies without a word."""
    proc = start([ATLASBOOST, "run", "--sim", "2", "--", "sh", "-c", SLEEPER], env=clean_env(), cwd=tmp_path)
    reader = Lines(proc)
    pids: list[int] = []
    try:
        pids = _pids(reader.wait_for(lambda ls: len(_pids(ls)) == 4, timeout=30))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        # The grandchildren (sleep) are beyond PR_SET_PDEATHSIG: only the guard stops them.
        assert _wait_gone(pids, timeout=10) == [], f"still running after kill -9 of the launcher: {pids}"
    finally:
        _stop_all(proc, reader, pids)


def test_a_python_program_with_threads_can_run_the_command(tmp_path: Path) -> None:
    # The command is a process of its own (the package's atlasboost/_bin/atlasboost): the
    # Python program's threads cannot take the launcher's signals.
    code = (
        "import sys, threading\n"
        "from atlasboost import _cli\n"
        "threading.Thread(target=threading.Event().wait, daemon=True).start()\n"
        "sys.exit(_cli.main(['run', '--sim', '2', '--', 'true']))\n"
    )
    r = run([PYTHON, "-c", code], cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.describe()
    assert "2 succeeded, 0 failed" in r.stderr, r.describe()


def test_the_native_module_has_no_command_line() -> None:
    # Library mode only: the command line and the launcher are the shipped command's.
    from atlasboost import _atlasboost, _cli

    assert not hasattr(_atlasboost, "main")
    assert os.access(_cli.command(), os.X_OK)


def _with_library_hidden(library: Path, script: str) -> str:
    """`script` (sh) run in a mount namespace of its own where `library` is an empty file (a
    library that cannot be loaded), through unshare(1); its stdout and stderr."""
    import shutil
    import subprocess

    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("unshare is not installed (Debian: util-linux)")
    probe = subprocess.run([unshare, "-m", "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"no mount namespace for this test (needs root): {probe.stderr.strip()}")
    r = subprocess.run(
        [unshare, "-m", "sh", "-c",
         f'empty=$(mktemp) && mount --bind "$empty" "$0" && rm "$empty" && {{ {script}; }}',
         str(library)],
        capture_output=True, text=True, timeout=60, env=clean_env(),
    )
    return r.stdout + r.stderr


def _api_and_command_without(library: Path) -> str:
    """What `from atlasboost import init`, `import atlasboost` and the `atlasboost` command
    print where `library` cannot be loaded."""
    return _with_library_hidden(
        library,
        f'"{PYTHON}" -c "from atlasboost import init"; '
        f'"{PYTHON}" -c "import atlasboost; print(\'imported\')"; '
        f'"{ATLASBOOST}" --version; echo "command: $?"',
    )


def test_a_native_module_that_cannot_load_leaves_the_command_working() -> None:
    """A native module the system cannot load (here: made unreadable) fails the import of the
    API saying so, but neither `import atlasboost` nor the `atlasboost` command, which is a
    program of its own."""
    import atlasboost

    native = next(Path(atlasboost.__file__).parent.glob("_atlasboost*.so"))
    said = _api_and_command_without(native)
    assert "ImportError: atlasboost's native module cannot be loaded: " in said, said
    assert "reinstall the package" in said, said
    assert "imported" in said.splitlines(), said
    assert f"atlasboost {atlasboost.__version__}" in said and "command: 0" in said, said


def test_an_mpi_build_whose_mpi_cannot_load_says_what_to_do() -> None:
    """A package built with MPI support, used where its MPI library cannot be loaded (an HPC
    module not loaded): the import of the API names the library and both ways out; the command
    still runs (it used to fail too, as `import atlasboost` did)."""
    import subprocess

    import atlasboost

    if not atlasboost.mpi_built():
        pytest.skip("this package was built without MPI support")
    native = next(Path(atlasboost.__file__).parent.glob("_atlasboost*.so"))
    ldd = subprocess.run(["ldd", str(native)], capture_output=True, text=True, timeout=30).stdout
    linked = [line.split("=>")[1].split()[0] for line in ldd.splitlines()
              if "libmpi" in line and "=>" in line]
    assert linked, f"an MPI build whose native module links no libmpi:\n{ldd}"
    said = _api_and_command_without(Path(linked[0]))
    assert "This package was built with MPI support" in said, said
    assert "module load" in said and "ATLASBOOST_WITH_MPI=0" in said, said
    assert "imported" in said.splitlines(), said
    assert "command: 0" in said, said
