"""The library-mode API: errors before init(), frames, exceptions, environment, shutdown.

Calls that initialise run in child processes, alone (a world of one on simulated devices):
what is tested here does not depend on the launcher (test_launchers.py covers those).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import atlasboost
import pytest
from helpers import clean_env, free_port_pair, run, run_python

MODULES = [
    "atlasboost",
    "atlasboost.tensorflow",
    "atlasboost.tensorflow.mpi_ops",
    "atlasboost.mindspore",
    "atlasboost.torch",
]
QUERIES = [
    "rank",
    "size",
    "local_rank",
    "local_size",
    "launcher_rank",
    "mpi_rank",
    "device_id",
    "rank_table_file",
]
EXCEPTIONS = [
    "AtlasBoostError",
    "ConfigError",
    "DeviceError",
    "LaunchContextError",
    "NotInitializedError",
    "RankTableError",
    "RendezvousError",
    "RendezvousTimeout",
]


def alone_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A process started by hand on 2 simulated devices, its table in tmp_path."""
    return clean_env(
        ATLASBOOST_SIM="2",
        ATLASBOOST_RANK_TABLE_FILE=str(tmp_path / "rank_table.json"),
        **extra,
    )


def last_json(output: str) -> dict:
    return json.loads(output.strip().splitlines()[-1])


# What each call raises: the class name and the message, as a JSON object.
CALL_ALL = """
import json
import {module} as ab

def outcome(f, *args):
    try:
        f(*args)
    except Exception as e:
        return [type(e).__name__, str(e), isinstance(e, ab.AtlasBoostError)]
    return None

result = {{name: outcome(getattr(ab, name)) for name in {queries!r}}}
result["set_device_id"] = outcome(ab.set_device_id, 0)
{before}
print(json.dumps(result))
"""


@pytest.mark.parametrize("module", MODULES)
def test_every_call_before_init_says_to_call_init_first(module: str) -> None:
    r = run_python(CALL_ALL.format(module=module, queries=QUERIES, before=""))
    assert r.returncode == 0, r.describe()
    result = last_json(r.stdout)
    assert set(result) == {*QUERIES, "set_device_id"}
    for name, got in result.items():
        assert got is not None, f"{module}.{name}() did not raise before init()"
        kind, message, is_ours = got
        assert kind == "NotInitializedError", (name, got)
        assert is_ours, (name, got)
        assert "call init() first" in message, (name, got)


def test_shutdown_before_init_does_nothing_and_after_it_init_is_needed_again(
    tmp_path: Path,
) -> None:
    code = """
        import json
        import atlasboost as ab

        ab.shutdown()                       # before init(): nothing, no error
        ab.init()
        first = ab.rank_table_file()
        ab.shutdown()
        try:
            ab.rank()
        except ab.NotInitializedError as e:
            after = str(e)
        else:
            after = None
        ab.shutdown()                       # twice: still nothing
        ab.init()                           # a new job
        print(json.dumps([first, after, ab.rank(), ab.size()]))
    """
    r = run_python(code, env=alone_env(tmp_path))
    assert r.returncode == 0, r.describe()
    first, after, rank, size = last_json(r.stdout)
    assert first == str(tmp_path / "rank_table.json")
    assert after is not None and "call init() first" in after, r.describe()
    assert (rank, size) == (0, 1)


@pytest.mark.parametrize("module", MODULES)
def test_every_module_has_the_same_functions_and_exceptions(module: str) -> None:
    import importlib

    m = importlib.import_module(module)
    for name in [*QUERIES, "init", "set_device_id", "shutdown", "mpi_built", "build_info"]:
        assert callable(getattr(m, name)), name
    for name in EXCEPTIONS:
        assert getattr(m, name) is getattr(atlasboost, name), name
    for name in m.__all__:
        assert hasattr(m, name), name


def test_the_exception_hierarchy() -> None:
    for name in EXCEPTIONS:
        cls = getattr(atlasboost, name)
        assert issubclass(cls, atlasboost.AtlasBoostError), name
        assert cls.__module__ == "atlasboost", name
    assert issubclass(atlasboost.AtlasBoostError, Exception)
    assert issubclass(atlasboost.RendezvousTimeout, atlasboost.RendezvousError)
    assert issubclass(atlasboost.ConfigError, ValueError)
    # Only a bad value is a ValueError.
    for name in EXCEPTIONS:
        if name != "ConfigError":
            assert not issubclass(getattr(atlasboost, name), ValueError), name


@pytest.mark.parametrize("frame", ["caffe", "", "tensorflow2", "torch"])
def test_a_bad_frame_is_a_value_error_listing_the_valid_ones(frame: str) -> None:
    # Refused before anything starts: safe in this process.
    with pytest.raises(atlasboost.ConfigError) as e:
        atlasboost.init(frame=frame)
    assert isinstance(e.value, ValueError)
    assert isinstance(e.value, atlasboost.AtlasBoostError)
    message = str(e.value)
    assert f'"{frame}"' in message, message
    assert "tensorflow, mindspore, pytorch" in message, message
    with pytest.raises(atlasboost.NotInitializedError):
        atlasboost.rank()


def test_a_bad_frame_in_a_framework_module_too() -> None:
    import atlasboost.mindspore

    with pytest.raises(ValueError, match="expected one of tensorflow, mindspore, pytorch"):
        atlasboost.mindspore.init(frame="paddle")


def test_a_frame_that_is_not_a_string_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        atlasboost.init(frame=3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        ('import atlasboost as ab; ab.init(frame="tensorflow")', "tensorflow"),
        ('import atlasboost as ab; ab.init(frame="mindspore")', "mindspore"),
        ('import atlasboost as ab; ab.init(frame="pytorch")', "pytorch"),
        ('import atlasboost as ab; ab.init(frame="MindSpore")', "mindspore"),
        ("import atlasboost as ab; ab.init()", "tensorflow"),
        ("import atlasboost.tensorflow.mpi_ops as ab; ab.init()", "tensorflow"),
        ("import atlasboost.mindspore as ab; ab.init()", "mindspore"),
        ("import atlasboost.torch as ab; ab.init()", "pytorch"),
    ],
)
def test_frames_set_their_variables(tmp_path: Path, call: str, expected: str) -> None:
    code = f"""
        import json, os
        {call}
        print(json.dumps([os.environ.get("ATLASBOOST_FRAMEWORK"),
                          os.environ.get("MINDSPORE_HCCL_CONFIG_PATH")]))
    """
    r = run_python(code, env=alone_env(tmp_path))
    assert r.returncode == 0, r.describe()
    framework, ms_path = last_json(r.stdout)
    assert framework == expected
    if expected == "mindspore":
        assert ms_path == str(tmp_path / "rank_table.json")
    else:
        assert ms_path is None


def test_init_without_frame_takes_the_launchers_framework(tmp_path: Path) -> None:
    code = """
        import os, atlasboost
        atlasboost.init()
        print(os.environ["ATLASBOOST_FRAMEWORK"], os.environ.get("MINDSPORE_HCCL_CONFIG_PATH"))
    """
    r = run_python(code, env=alone_env(tmp_path, ATLASBOOST_FRAMEWORK="mindspore"))
    assert r.returncode == 0, r.describe()
    assert r.stdout.split() == ["mindspore", str(tmp_path / "rank_table.json")]
    r = run_python(code, env=alone_env(tmp_path, ATLASBOOST_FRAMEWORK="keras"))
    assert r.returncode != 0
    assert "ConfigError" in r.stderr and "keras" in r.stderr, r.describe()


def test_init_sets_the_variables_in_os_environ_and_for_child_processes(tmp_path: Path) -> None:
    code = """
        import json, os, subprocess, atlasboost
        before = "RANK_ID" in os.environ
        atlasboost.init()
        atlasboost.init()                  # a second call keeps the job
        # The C environment too (putenv): a shell started by os.system sees them.
        shell = subprocess.run(["sh", "-c", "echo $RANK_ID $RANK_SIZE $DEVICE_ID $RANK_TABLE_FILE $OMP_NUM_THREADS"],
                               env=None, capture_output=True, text=True, timeout=30).stdout.split()
        print(json.dumps([before, shell, os.environ["RANK_TABLE_FILE"], os.environ["JOB_ID"]]))
    """
    r = run_python(code, env=alone_env(tmp_path, OMP_NUM_THREADS="7"))
    assert r.returncode == 0, r.describe()
    before, shell, table, job_id = last_json(r.stdout)
    assert before is False
    # OMP_NUM_THREADS is set only where it was not: 7 is kept.
    assert shell == ["0", "1", "0", str(tmp_path / "rank_table.json"), "7"]
    assert table == str(tmp_path / "rank_table.json")
    assert job_id
    assert "running as a world of one" in r.stderr, r.describe()


def test_a_forked_child_that_exits_leaves_the_parents_job(tmp_path: Path) -> None:
    # The child's exit runs the shutdown() that init() registered with atexit: it must not end
    # the parent's job (release its table lock; under mpirun, finalise MPI and hang).
    code = """
        import os, sys, atlasboost
        atlasboost.init()
        lock = os.environ["RANK_TABLE_FILE"] + ".lock"
        before = os.path.exists(lock)
        child = os.fork()
        if child == 0:
            sys.exit(0)                    # a normal exit: atexit handlers run
        os.waitpid(child, 0)
        after_child = os.path.exists(lock)
        print(atlasboost.rank(), atlasboost.size())
        atlasboost.shutdown()
        print(before, after_child, os.path.exists(lock))
    """
    r = run_python(code, env=alone_env(tmp_path))
    assert r.returncode == 0, r.describe()
    assert r.stdout.split() == ["0", "1", "True", "True", "False"], r.describe()


def test_queries_answer_at_once_while_init_waits(tmp_path: Path) -> None:
    # Rank 0 of 2 whose partner never comes: init() waits 2 s. Another thread's query meanwhile
    # answers NotInitializedError at once (it waited with init() before).
    code = """
        import json, threading, time, atlasboost
        took = []
        def ask():
            time.sleep(0.3)
            t = time.monotonic()
            try:
                atlasboost.rank()
            except atlasboost.NotInitializedError:
                took.append(time.monotonic() - t)
        thread = threading.Thread(target=ask)
        thread.start()
        t0 = time.monotonic()
        try:
            atlasboost.init()
        except atlasboost.RendezvousTimeout:
            pass
        waited = time.monotonic() - t0
        thread.join()
        print(json.dumps([took, waited]))
    """
    env = alone_env(
        tmp_path,
        RANK="0",
        WORLD_SIZE="2",
        LOCAL_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port_pair()),
        ATLASBOOST_RENDEZVOUS_TIMEOUT="2",
    )
    r = run_python(code, env=env)
    assert r.returncode == 0, r.describe()
    took, waited = last_json(r.stdout)
    assert waited >= 2, r.describe()
    # Less than half of init()'s wait: a query held behind it would take about 1.7 s.
    assert len(took) == 1 and took[0] < waited / 2, r.describe()


def test_omp_num_threads_defaults_to_1(tmp_path: Path) -> None:
    code = "import os, atlasboost; atlasboost.init(); print(os.environ['OMP_NUM_THREADS'])"
    env = alone_env(tmp_path)
    env.pop("OMP_NUM_THREADS", None)
    r = run_python(code, env=env)
    assert r.returncode == 0, r.describe()
    assert r.stdout.split() == ["1"]


def test_init_removes_another_way_of_starting_a_job_and_says_so(tmp_path: Path) -> None:
    """HCCL refuses its CM_* variables beside RANK_TABLE_FILE: init() takes them out."""
    code = """
        import json, os, atlasboost
        atlasboost.init()
        print(json.dumps(sorted(k for k in os.environ if k.startswith(("CM_", "MS_ROLE")))))
    """
    env = alone_env(tmp_path)
    env.update(CM_CHIEF_IP="10.0.0.1", CM_WORKER_SIZE="8", MS_ROLE="MS_WORKER")
    r = run_python(code, env=env)
    assert r.returncode == 0, r.describe()
    assert last_json(r.stdout) == [], r.describe()
    assert "CM_CHIEF_IP, CM_WORKER_SIZE, MS_ROLE are set, for another way of starting a job" in r.stderr, r.describe()


def test_set_device_id_refuses_another_ranks_device(tmp_path: Path) -> None:
    code = """
        import json, os
        import atlasboost.tensorflow.mpi_ops as atlasboost
        atlasboost.init(frame="tensorflow")
        out = []
        for bad in (1, 7, -1):
            try:
                atlasboost.set_device_id(bad)
            except atlasboost.DeviceError as e:
                out.append(str(e))
            else:
                out.append(None)
        out.append([os.environ["DEVICE_ID"], os.environ["ASCEND_DEVICE_ID"]])
        atlasboost.set_device_id(atlasboost.local_rank())
        out.append(atlasboost.device_id())
        print(json.dumps(out))
    """
    table = tmp_path / "rank_table.json"
    r = run_python(code, env=alone_env(tmp_path))
    assert r.returncode == 0, r.describe()
    one, seven, negative, env, device = last_json(r.stdout)
    # Both devices named: the one asked for, and this rank's entry in the table.
    assert one is not None and one.startswith("device 1 is not rank 0's device"), one
    assert f"its entry in {table} is device 0 (physical id 0)" in one, one
    assert seven is not None and seven.startswith("device 7 is not rank 0's device"), seven
    assert negative is not None and "-1 is not a device id" in negative, negative
    assert "rank 0's device is 0" in negative, negative
    # A refused device changes nothing.
    assert env == ["0", "0"]
    assert device == 0


def test_set_device_id_wants_an_integer(tmp_path: Path) -> None:
    code = """
        import atlasboost
        atlasboost.init()
        for bad in ("0", 0.0, None, True, False):
            try:
                atlasboost.set_device_id(bad)
            except TypeError:
                pass
            else:
                raise SystemExit(f"set_device_id({bad!r}) was accepted")
        # An integer beyond any device (and any C integer) is named, not an OverflowError.
        try:
            atlasboost.set_device_id(2**70)
        except atlasboost.DeviceError as e:
            assert str(e).startswith(f"{2**70} is not a device id"), e
        print("ok")
    """
    r = run_python(code, env=alone_env(tmp_path))
    assert r.returncode == 0, r.describe()
    assert r.stdout.split() == ["ok"]


# Each kind of failure of init(), from a real cause, and the class it raises.
FAILURES = [
    pytest.param(
        {"RANK": "0", "WORLD_SIZE": "2"},
        "LaunchContextError",
        "LOCAL_RANK is not",
        id="launcher-variables-partly-set",
    ),
    pytest.param(
        {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "ATLASBOOST_SIM": "2"},
        "LaunchContextError",
        "MASTER_ADDR is not set",
        id="no-master-addr",
    ),
    pytest.param(
        # A value that is not UTF-8 (b"1\xff") is named, not taken for unset.
        {"RANK": "1\udcff", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "ATLASBOOST_SIM": "2"},
        "LaunchContextError",
        "RANK=1\ufffd is not a number",
        id="launcher-variable-not-utf8",
    ),
    pytest.param(
        {"ATLASBOOST_SIM": "2", "ATLASBOOST_RENDEZVOUS_TIMEOUT": "soon"},
        "ConfigError",
        "ATLASBOOST_RENDEZVOUS_TIMEOUT=soon",
        id="malformed-setting",
    ),
    pytest.param(
        {"ATLASBOOST_SIM": "2", "ATLASBOOST_RENDEZVOUS_TIMEOUT": "1e300"},
        "ConfigError",
        "ATLASBOOST_RENDEZVOUS_TIMEOUT=1e300: 1e300 seconds is more than the most allowed, 1e9",
        id="setting-out-of-range",
    ),
    pytest.param(
        {"ATLASBOOST_PROBE": "hccn", "ATLASBOOST_HCCN_CONF": "/nonexistent/hccn.conf"},
        "DeviceError",
        "/nonexistent/hccn.conf",
        id="probe-fails",
    ),
    pytest.param(
        {"ATLASBOOST_SIM": "2", "ATLASBOOST_RANK_TABLE_FILE": "/nonexistent/dir/rank_table.json"},
        "RankTableError",
        "could not write the rank table /nonexistent/dir/rank_table.json",
        id="table-not-writable",
    ),
    pytest.param(
        {"ATLASBOOST_SIM": "2", "ATLASBOOST_RANK_TABLE_FILE": "/tmp/rank_table.txt"},
        "RankTableError",
        "ends in .json",
        id="table-not-json",
    ),
    pytest.param(
        {"ATLASBOOST_RANK": "0", "ATLASBOOST_SIZE": "1", "ATLASBOOST_LOCAL_RANK": "0"},
        "LaunchContextError",
        "so atlasboost run started this process, but ATLASBOOST_SERVER_ID is not",
        id="atlasboost-run-variables-partly-set",
    ),
]


@pytest.mark.parametrize(("env", "kind", "text"), FAILURES)
def test_each_failure_of_init_has_its_exception(
    tmp_path: Path, env: dict[str, str], kind: str, text: str
) -> None:
    code = """
        import json, atlasboost
        try:
            atlasboost.init()
        except atlasboost.AtlasBoostError as e:
            print(json.dumps([type(e).__name__, str(e)]))
        else:
            print(json.dumps(None))
    """
    base = {"ATLASBOOST_RANK_TABLE_FILE": str(tmp_path / "rank_table.json")}
    r = run_python(code, env=clean_env(**{**base, **env}), cwd=tmp_path)
    assert r.returncode == 0, r.describe()
    got = last_json(r.stdout)
    assert got is not None, f"init() succeeded\n{r.describe()}"
    assert got[0] == kind, got
    assert text in got[1], got


def test_build_info_says_how_the_package_was_built() -> None:
    import os

    info = atlasboost.build_info()
    assert info["version"] == atlasboost.__version__
    assert info["mpi"] is atlasboost.mpi_built()
    # scripts/test-python.sh says what it expects of the build it made.
    expected = os.environ.get("ATLASBOOST_PYTHON_EXPECT_MPI")
    if expected is not None:
        assert info["mpi"] is (expected == "1"), info
    if info["mpi"]:
        # Asked of the MPI library itself.
        assert info["mpi_library"] and ("Open MPI" in info["mpi_library"] or "MPICH" in info["mpi_library"]), info
    else:
        assert info["mpi_library"] is None, info
    # The command says the same.
    r = run([sys.executable, "-m", "atlasboost", "--version"])
    assert r.returncode == 0, r.describe()
    assert f"MPI support: {'yes' if info['mpi'] else 'no'}" in r.stdout, r.describe()


def test_the_version_is_the_workspaces() -> None:
    cargo = (Path(__file__).resolve().parents[3] / "Cargo.toml").read_text()
    assert f'version = "{atlasboost.__version__}"' in cargo


def test_the_stubs_name_everything_the_native_module_has() -> None:
    import ast

    from atlasboost import _atlasboost

    stub = Path(_atlasboost.__file__).with_name("_atlasboost.pyi")
    tree = ast.parse(stub.read_text())
    in_stub = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    in_stub |= {n.target.id for n in tree.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    native = {n for n in dir(_atlasboost) if not n.startswith("__") or n == "__version__"}
    assert in_stub == native
    assert (stub.parent / "py.typed").is_file()
