"""The original usage snippet under each launcher: `atlasboost run`, `mpirun`, torchrun's
variables. Every job is 4 real processes on simulated devices; the table is read back."""

from __future__ import annotations

import json
import os
import signal
import textwrap
import time
from pathlib import Path

import atlasboost
import pytest
from helpers import (
    ATLASBOOST,
    PYTHON,
    check_job,
    clean_env,
    finish,
    free_port_pair,
    need_mpirun,
    report_files,
    reports,
    run,
    run_python,
    start,
    wait_all,
)

# mpirun's options for this machine: root (CI), and more ranks than its 2 cores.
MPIRUN_OPTIONS = ["--allow-run-as-root", "--oversubscribe"]


@pytest.mark.parametrize(
    ("hosts", "host_count"),
    [
        pytest.param([], 1, id="one-host"),
        pytest.param(["-H", "127.0.0.1:2,127.0.0.2:2"], 2, id="two-hosts"),
    ],
)
def test_under_atlasboost_run(tmp_path: Path, worker: Path, hosts: list[str], host_count: int) -> None:
    table = tmp_path / "rank_table.json"
    r = run(
        [ATLASBOOST, "run", "--sim", "4", *hosts, "--rank-table", str(table), "--", PYTHON, worker],
        cwd=tmp_path,
        timeout=60,
    )
    assert r.returncode == 0, r.describe()
    found = reports(r.stdout)
    assert len(found) == 4, r.describe()
    check_job(found, 4, table, hosts=host_count)
    for rep in found:
        # atlasboost run numbers ranks as the table does.
        assert rep["launcher_rank"] == rep["rank"], rep
        assert rep["env"]["ATLASBOOST_FRAMEWORK"] == "tensorflow", rep
    assert "4 succeeded, 0 failed" in r.stderr, r.describe()


def test_under_mpirun(tmp_path: Path, worker: Path) -> None:
    """The original workflow, word for word: plain mpirun, nothing else set. With MPI support
    the processes meet over MPI; without it, over a Unix socket of this host."""
    mpirun = need_mpirun()
    report_dir = tmp_path / "reports"
    report_dir.mkdir()
    r = run(
        [mpirun, *MPIRUN_OPTIONS, "-np", "4", "-x", "ATLASBOOST_SIM=4", "-x", f"REPORT_DIR={report_dir}",
         PYTHON, worker],
        cwd=tmp_path,
        timeout=90,
    )
    assert r.returncode == 0, r.describe()
    found = report_files(report_dir)
    assert len(found) == 4, r.describe()
    # The table in the working directory, where the original tool wrote it.
    check_job(found, 4, tmp_path / "rank_table.json")
    assert sorted(int(rep["env"]["OMPI_COMM_WORLD_RANK"]) for rep in found) == [0, 1, 2, 3]
    for rep in found:
        assert rep["launcher_rank"] == int(rep["env"]["OMPI_COMM_WORLD_RANK"]), rep
        assert rep["mpi_rank"] == rep["launcher_rank"], rep
    # Every process finalised MPI at exit (atexit shutdown): mpirun would complain otherwise.
    assert "exiting improperly" not in r.stderr, r.describe()


def test_a_rank_that_fails_after_init_ends_the_mpirun_job(tmp_path: Path) -> None:
    """A rank's uncaught exception after init() ends the whole job at once (MPI_Abort, as
    `python -m mpi4py` does), rather than waiting in MPI_Finalize at exit for ranks that, in
    training, wait in a collective for it: the others here sleep for 120 s."""
    mpirun = need_mpirun()
    if not atlasboost.mpi_built():
        pytest.skip("this build has no MPI support: nothing initialises MPI, so nothing waits in "
                    "MPI_Finalize (mpirun ends such a job by itself)")
    script = tmp_path / "fails.py"
    # Its last print, block-buffered in a pipe, must come out before the abort.
    script.write_text(textwrap.dedent("""
        import os, time
        import atlasboost
        atlasboost.init()
        if os.environ["OMPI_COMM_WORLD_RANK"] == "1":
            print("last words of rank 1")
            raise RuntimeError("boom after init")
        time.sleep(120)
        """))
    # Bounded below the others' sleep: a job waited out fails here.
    buffered = clean_env()
    del buffered["PYTHONUNBUFFERED"]
    r = run(
        [mpirun, *MPIRUN_OPTIONS, "-np", "4", "-x", "ATLASBOOST_SIM=4", PYTHON, str(script)],
        env=buffered,
        cwd=tmp_path,
        timeout=100,
    )
    assert r.returncode != 0, r.describe()
    assert "RuntimeError: boom after init" in r.stderr, r.describe()
    assert "last words of rank 1" in r.stdout, r.describe()


def test_a_rank_that_fails_under_run_mpi_lets_the_others_save(tmp_path: Path) -> None:
    """Under `atlasboost run --mpi`, a rank's uncaught exception after init() ends that rank
    only: the launcher stops the others with SIGTERM and --grace, so a rank saving a checkpoint
    on SIGTERM finishes it (MPI_Abort would kill them at once). Either build: with MPI support
    the hook must not abort; without, nothing does."""
    need_mpirun()
    script = tmp_path / "saves.py"
    script.write_text(textwrap.dedent("""
        import os, signal, sys, time
        import atlasboost
        atlasboost.init()
        rank = os.environ["OMPI_COMM_WORLD_RANK"]
        def save(*_):
            print(f"rank {rank} saving", flush=True)
            time.sleep(1)
            print(f"rank {rank} saved", flush=True)
            os._exit(0)
        signal.signal(signal.SIGTERM, save)
        print(f"rank {rank} ready", flush=True)
        if rank == "1":
            time.sleep(1)
            raise RuntimeError("boom under run --mpi")
        time.sleep(60)
        """))
    r = run(
        [ATLASBOOST, "run", "--mpi", "--sim", "4", "--grace", "20", "--", PYTHON, str(script)],
        cwd=tmp_path,
        timeout=50,
    )
    assert r.returncode == 1, r.describe()
    assert "RuntimeError: boom under run --mpi" in r.stderr, r.describe()
    assert "rank 1 (host" in r.stderr and "failed first: exit 1" in r.stderr, r.describe()
    for rank in (0, 2, 3):
        assert f"[{rank}]<stdout>:rank {rank} saved" in r.stdout, r.describe()


MPI4PY_WORKER = """\
import json, os, sys
from mpi4py import MPI                      # initialises MPI before atlasboost does anything

import atlasboost

comm = MPI.COMM_WORLD
atlasboost.init()
atlasboost.set_device_id(atlasboost.local_rank())
# MPI traffic after init(): every rank learns every other's table rank.
ranks = comm.allgather(atlasboost.rank())
total = comm.allreduce(atlasboost.rank(), op=MPI.SUM)
report = {"mpi_rank": comm.Get_rank(), "rank": atlasboost.rank(), "size": atlasboost.size(),
          "ranks": ranks, "total": total, "rank_id": os.environ["RANK_ID"],
          "launcher_rank": atlasboost.launcher_rank()}
with open(os.path.join(os.environ["REPORT_DIR"], f"mpi4py.{comm.Get_rank()}.json"), "w") as f:
    json.dump(report, f)
"""


def test_an_mpi4py_program_that_initialised_mpi_first(tmp_path: Path) -> None:
    mpirun = need_mpirun()
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        if os.environ.get("ATLASBOOST_PYTHON_REQUIRE_MPI4PY") == "1":
            pytest.fail("mpi4py is not importable, but scripts/test-python.sh installed it")
        pytest.skip("mpi4py is not installed (pip install mpi4py)")
    script = tmp_path / "with_mpi4py.py"
    script.write_text(MPI4PY_WORKER)
    r = run(
        [mpirun, *MPIRUN_OPTIONS, "-np", "4", "-x", "ATLASBOOST_SIM=4", "-x", f"REPORT_DIR={tmp_path}",
         PYTHON, str(script)],
        cwd=tmp_path,
        timeout=90,
    )
    assert r.returncode == 0, r.describe()
    found = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("mpi4py.*.json"))]
    assert len(found) == 4, r.describe()
    for rep in found:
        assert rep["size"] == 4 and rep["launcher_rank"] == rep["mpi_rank"], rep
        assert rep["rank_id"] == str(rep["rank"]), rep
        assert sorted(rep["ranks"]) == [0, 1, 2, 3] and rep["total"] == 6, rep
    assert "exiting improperly" not in r.stderr, r.describe()


MPI4PY_FAILING_WORKER = """\
from mpi4py import MPI                      # the program initialises MPI itself
import atlasboost

atlasboost.init()
if atlasboost.rank() == 1:
    raise RuntimeError("boom on rank 1")
print("rank", atlasboost.rank(), MPI.COMM_WORLD.allreduce(1), flush=True)
"""


def need_mpi4py() -> None:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        if os.environ.get("ATLASBOOST_PYTHON_REQUIRE_MPI4PY") == "1":
            pytest.fail("mpi4py is not importable, but scripts/test-python.sh installed it")
        pytest.skip("mpi4py is not installed (pip install mpi4py)")


def test_an_mpi4py_program_that_fails_after_init_ends_the_job(tmp_path: Path) -> None:
    """An mpi4py program whose rank raises after init() ends the whole mpirun job at once, in
    either build: with MPI support through atlasboost's own MPI_Abort, without it through
    mpi4py's (the build has no MPI to call). It hung before: the failing rank waited in
    mpi4py's MPI_Finalize at exit, the others in the allreduce. Under `atlasboost run --mpi`
    the rank ends only itself, named as the first to fail."""
    mpirun = need_mpirun()
    need_mpi4py()
    script = tmp_path / "mpi4py_fails.py"
    script.write_text(MPI4PY_FAILING_WORKER)
    r = run(
        [mpirun, *MPIRUN_OPTIONS, "-np", "4", "-x", "ATLASBOOST_SIM=4", PYTHON, str(script)],
        cwd=tmp_path,
        timeout=60,
    )
    assert r.returncode != 0, r.describe()
    assert "RuntimeError: boom on rank 1" in r.stderr, r.describe()
    r = run(
        [ATLASBOOST, "run", "--mpi", "--sim", "4", "--", PYTHON, str(script)],
        cwd=tmp_path,
        timeout=60,
    )
    assert r.returncode == 1, r.describe()
    assert "rank 1 (host" in r.stderr and "failed first: exit 1" in r.stderr, r.describe()


def torchrun_env(rank: int, world: int, port: int, table: Path, **extra: str) -> dict[str, str]:
    """The variables torchrun gives process `rank` of `world` on one host."""
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "ATLASBOOST_SIM": "4",
        "ATLASBOOST_RANK_TABLE_FILE": str(table),
        "ATLASBOOST_RENDEZVOUS_TIMEOUT": "30",
        "EXPECT_LAUNCHER_RANK": str(rank),
    }
    return clean_env(**{**env, **extra})


def test_under_torchrun_variables(tmp_path: Path, worker: Path) -> None:
    table = tmp_path / "rank_table.json"
    port = free_port_pair()
    # Started in reverse order: rank 0, the coordinator, comes last.
    procs = [
        start([PYTHON, worker], env=torchrun_env(rank, 4, port, table), cwd=tmp_path)
        for rank in (3, 2, 1, 0)
    ]
    results = wait_all(procs, timeout=60)
    for r in results:
        assert r.returncode == 0, r.describe()
    found = [rep for r in results for rep in reports(r.stdout)]
    assert len(found) == 4, "\n".join(r.describe() for r in results)
    check_job(found, 4, table)
    for rep in found:
        assert rep["launcher_rank"] == int(rep["env"]["EXPECT_LAUNCHER_RANK"]), rep
        # torchrun's own MASTER_ADDR and MASTER_PORT are kept (its store uses them).
        assert rep["env"]["MASTER_ADDR"] == "127.0.0.1", rep
        assert rep["env"]["MASTER_PORT"] == str(port), rep
        # RANK is the table's rank after init().
        assert rep["env"]["RANK"] == str(rep["rank"]), rep


def test_a_second_init_after_shutdown_finds_the_launchers_place_again(tmp_path: Path) -> None:
    # Two simulated hosts whose names sort against their launcher ranks: the table's rank 0 is
    # launcher rank 1, and the first init() sets RANK (and MASTER_ADDR) to the table's.
    port = free_port_pair()
    code = """
        import json, os, atlasboost
        atlasboost.init()
        first = (atlasboost.launcher_rank(), atlasboost.rank())
        atlasboost.shutdown()
        atlasboost.init()
        again = (atlasboost.launcher_rank(), atlasboost.rank())
        atlasboost.shutdown()
        atlasboost.init()
        third = (atlasboost.launcher_rank(), atlasboost.rank())
        assert third == again, (third, again)
        print(json.dumps([first, again, os.environ["RANK"]]))
    """
    hosts = ["127.0.0.9", "127.0.0.10"]
    procs = []
    for rank, host in enumerate(hosts):
        directory = tmp_path / host
        directory.mkdir()
        env = torchrun_env(
            rank, 2, port, directory / "rank_table.json",
            LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", ATLASBOOST_SERVER_ID=host,
        )
        procs.append(start([PYTHON, "-c", textwrap.dedent(code)], env=env, cwd=directory))
    results = wait_all(procs, timeout=60)
    for rank, r in enumerate(results):
        assert r.returncode == 0, r.describe()
        first, again, rank_env = json.loads(r.stdout.strip().splitlines()[-1])
        assert first == again and first[0] == rank, r.describe()
        assert first[1] == 1 - rank and rank_env == str(first[1]), r.describe()


def test_a_rank_that_never_comes_is_a_rendezvous_timeout(tmp_path: Path) -> None:
    table = tmp_path / "rank_table.json"
    port = free_port_pair()
    code = """
        import json, atlasboost
        try:
            atlasboost.init()
        except atlasboost.RendezvousError as e:
            print(json.dumps([type(e).__name__, isinstance(e, atlasboost.RendezvousTimeout), str(e)]))
    """
    # Rank 0 of 2 alone: rank 1 never arrives.
    env = torchrun_env(0, 2, port, table, ATLASBOOST_RENDEZVOUS_TIMEOUT="1")
    r = run_python(code, env=env, cwd=tmp_path, timeout=30)
    assert r.returncode == 0, r.describe()
    kind, timed_out, message = json.loads(r.stdout.strip().splitlines()[-1])
    assert kind == "RendezvousTimeout" and timed_out, r.describe()
    assert "waiting for participant 1" in message, message


def test_init_lets_other_threads_run_while_it_waits(tmp_path: Path) -> None:
    table = tmp_path / "rank_table.json"
    port = free_port_pair()
    code = """
        import threading, time, atlasboost
        ticks = 0
        done = threading.Event()
        def tick():
            global ticks
            while not done.is_set():
                ticks += 1
                time.sleep(0.01)
        t = threading.Thread(target=tick)
        t.start()
        time.sleep(0.1)
        before = ticks
        try:
            atlasboost.init()          # waits 1.5 s for a rank that never comes
        except atlasboost.RendezvousTimeout:
            pass
        done.set()
        t.join()
        print(ticks - before)
    """
    env = torchrun_env(0, 2, port, table, ATLASBOOST_RENDEZVOUS_TIMEOUT="1.5")
    r = run_python(code, env=env, cwd=tmp_path, timeout=30)
    assert r.returncode == 0, r.describe()
    # 1.5 s of 10 ms ticks: far more than none (the GIL held throughout would give 0 or 1).
    assert int(r.stdout.split()[-1]) > 30, r.describe()


def test_a_signal_handler_that_returns_lets_a_waiting_init_go_on(tmp_path: Path) -> None:
    """A profiler's SIGALRM every 50 ms and a no-op SIGUSR1 handler while rank 0 waits 1 s
    for rank 1: the wait resumes after each (PEP 475), and both ranks meet."""
    table = tmp_path / "rank_table.json"
    port = free_port_pair()
    code = """
        import os, signal, threading, atlasboost
        signal.signal(signal.SIGALRM, lambda s, f: None)
        signal.signal(signal.SIGUSR1, lambda s, f: None)
        signal.setitimer(signal.ITIMER_REAL, 0.05, 0.05)
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        atlasboost.init()
        signal.setitimer(signal.ITIMER_REAL, 0)
        print("rank", atlasboost.rank())
    """
    procs = [start([PYTHON, "-c", textwrap.dedent(code)], env=torchrun_env(0, 2, port, table), cwd=tmp_path)]
    time.sleep(1)
    procs.append(start([PYTHON, "-c", textwrap.dedent(code)], env=torchrun_env(1, 2, port, table), cwd=tmp_path))
    for rank, r in enumerate(wait_all(procs, timeout=60)):
        assert r.returncode == 0 and r.stdout.split() == ["rank", str(rank)], r.describe()


def test_init_from_a_signal_handler_during_init_is_an_atlasboost_error(tmp_path: Path) -> None:
    """A signal handler that calls init() while this thread's init() waits gets an
    AtlasBoostError saying why (every error atlasboost raises is one), and the wait goes on."""
    table = tmp_path / "rank_table.json"
    code = """
        import signal, atlasboost
        def handler(*_):
            try:
                atlasboost.init()
            except atlasboost.AtlasBoostError as e:
                print("handler:", type(e).__name__, "|", e)
        signal.signal(signal.SIGALRM, handler)
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        try:
            atlasboost.init()
        except atlasboost.RendezvousTimeout:
            print("main: RendezvousTimeout")
    """
    env = torchrun_env(0, 2, free_port_pair(), table)
    env["ATLASBOOST_RENDEZVOUS_TIMEOUT"] = "1"
    r = wait_all([start([PYTHON, "-c", textwrap.dedent(code)], env=env, cwd=tmp_path)], timeout=60)[0]
    assert "handler: AtlasBoostError | init() was called while this thread's init() waits" in r.stdout, r.describe()
    assert "main: RendezvousTimeout" in r.stdout, r.describe()


def test_a_thread_writing_os_environ_during_init_is_safe(tmp_path: Path) -> None:
    """init() reads the environment with the GIL held: a thread writing os.environ meanwhile
    (putenv) cannot pull it from under the read (it crashed the interpreter)."""
    code = """
        import os, threading, time, atlasboost
        def churn():
            # New names (each grows the C environment: setenv moves it) in bursts, then
            # removed, for as long as the test runs.
            while True:
                for i in range(2000):
                    os.environ["CHURN_%d" % i] = "1"
                for i in range(2000):
                    del os.environ["CHURN_%d" % i]
        threading.Thread(target=churn, daemon=True).start()
        deadline, starts = time.monotonic() + 3, 0
        while time.monotonic() < deadline:
            atlasboost.init()
            atlasboost.shutdown()
            starts += 1
        print("starts", starts)
    """
    r = run_python(code, env=clean_env(ATLASBOOST_SIM="2"), cwd=tmp_path, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("starts "), r.describe()


def test_two_threads_calling_init_meet_once_and_a_handlers_shutdown_ends_the_wait(tmp_path: Path) -> None:
    """Two threads of rank 0 call init() while it waits for rank 1: both return its job (one
    rendezvous). Then a SIGTERM handler that calls shutdown() and exits, while a second
    start waits: the process ends at once with its code."""
    table = tmp_path / "rank_table.json"
    port = free_port_pair()
    code = """
        import os, signal, sys, threading, atlasboost
        results = []
        def start():
            atlasboost.init()
            results.append(atlasboost.rank())
        threads = [threading.Thread(target=start) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        print("ranks", *results, flush=True)
        if atlasboost.launcher_rank() == 0:
            atlasboost.shutdown()
            def stop(s, f):
                atlasboost.shutdown()      # from the handler, during the wait: does nothing
                sys.exit(143)
            signal.signal(signal.SIGTERM, stop)
            threading.Timer(1, os.kill, (os.getpid(), signal.SIGTERM)).start()
            os.environ["MASTER_PORT"] = os.environ["SECOND_MASTER_PORT"]
            atlasboost.init()              # alone now: waits for a rank 1 that never comes
            print("not reached", flush=True)
    """
    second = free_port_pair()
    while abs(second - port) < 2:
        second = free_port_pair()
    env = {rank: torchrun_env(rank, 2, port, table, SECOND_MASTER_PORT=str(second)) for rank in (0, 1)}
    procs = [start([PYTHON, "-c", textwrap.dedent(code)], env=env[0], cwd=tmp_path)]
    time.sleep(1)
    procs.append(start([PYTHON, "-c", textwrap.dedent(code)], env=env[1], cwd=tmp_path))
    zero, one = wait_all(procs, timeout=60)
    assert one.returncode == 0 and one.stdout.split() == ["ranks", "1", "1"], one.describe()
    assert zero.returncode == 143 and zero.stdout.split() == ["ranks", "0", "0"], zero.describe()


def test_a_rank_stopped_by_ctrl_c_in_the_wait_fails_the_others_at_once(tmp_path: Path) -> None:
    """Rank 1 of 3 gets Ctrl-C while the rendezvous waits for rank 2: rank 0 (the coordinator)
    hears that it gave up, rather than wait for it until the timeout."""
    table = tmp_path / "rank_table.json"
    port = free_port_pair()
    code = """
        import time, atlasboost
        print("waiting", flush=True)
        start = time.monotonic()
        try:
            atlasboost.init()
        except atlasboost.RendezvousError as e:
            print(round(time.monotonic() - start), e, flush=True)
    """
    env = lambda rank: torchrun_env(rank, 3, port, table, ATLASBOOST_RENDEZVOUS_TIMEOUT="60")  # noqa: E731
    zero = start([PYTHON, "-c", textwrap.dedent(code)], env=env(0), cwd=tmp_path)
    one = start([PYTHON, "-c", textwrap.dedent(code)], env=env(1), cwd=tmp_path)
    try:
        for p in (zero, one):
            assert p.stdout is not None and p.stdout.readline().strip() == "waiting"
        time.sleep(1)
        one.send_signal(signal.SIGINT)
        first, stopped = wait_all([zero, one], timeout=50)
    finally:
        for p in (zero, one):
            if p.poll() is None:
                p.kill()
    assert stopped.returncode != 0 and "KeyboardInterrupt" in stopped.stderr, stopped.describe()
    seconds, _, message = first.stdout.strip().partition(" ")
    assert "gave up" in message and int(seconds) < 30, first.describe()


def test_shutdown_hears_ctrl_c_while_another_threads_init_waits(tmp_path: Path) -> None:
    """A `finally: shutdown()` while a thread's init() waits for a rank that never comes: a
    Ctrl-C there ends it, not the rendezvous timeout."""
    table = tmp_path / "rank_table.json"
    port = free_port_pair()
    code = """
        import threading, time, atlasboost
        threading.Thread(target=atlasboost.init, daemon=True).start()
        time.sleep(0.3)
        print("shutting down", flush=True)
        start = time.monotonic()
        try:
            atlasboost.shutdown()
        except KeyboardInterrupt:
            print("interrupted after", round(time.monotonic() - start), flush=True)
    """
    env = torchrun_env(1, 2, port, table, ATLASBOOST_RENDEZVOUS_TIMEOUT="60")
    proc = start([PYTHON, "-c", textwrap.dedent(code)], env=env, cwd=tmp_path)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "shutting down"
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        r = finish(proc, timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    words = r.stdout.split()
    assert words[:2] == ["interrupted", "after"] and int(words[2]) < 10, r.describe()


def test_threads_waiting_for_a_failed_init_get_its_failure(tmp_path: Path) -> None:
    """Three threads call init() at once, and the start times out (rank 0 never comes): the two
    that waited for it raise its failure, not a rendezvous of their own each."""
    table = tmp_path / "rank_table.json"
    port = free_port_pair()
    code = """
        import threading, atlasboost
        failures = []
        def start():
            try:
                atlasboost.init()
            except atlasboost.RendezvousError as e:
                failures.append(e)
        threads = [threading.Thread(target=start) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        print(len(failures), len({id(e) for e in failures}), flush=True)
    """
    env = torchrun_env(1, 2, port, table, ATLASBOOST_RENDEZVOUS_TIMEOUT="2")
    r = run_python(code, env=env, cwd=tmp_path, timeout=60)
    assert r.returncode == 0 and r.stdout.split() == ["3", "1"], r.describe()


def test_ctrl_c_stops_a_waiting_init_with_keyboard_interrupt(tmp_path: Path) -> None:
    table = tmp_path / "rank_table.json"
    port = free_port_pair()
    code = """
        import sys, time, atlasboost
        print("waiting", flush=True)
        start = time.monotonic()
        try:
            atlasboost.init()          # rank 1 never comes: would wait 30 s
        except BaseException as e:
            print(type(e).__name__, type(e.__context__).__name__, round(time.monotonic() - start), flush=True)
    """
    env = torchrun_env(0, 2, port, table, ATLASBOOST_RENDEZVOUS_TIMEOUT="30")
    proc = start([PYTHON, "-c", textwrap.dedent(code)], env=env, cwd=tmp_path)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "waiting"
        time.sleep(0.5)  # inside init() by now (if not, the interrupt comes all the same)
        proc.send_signal(signal.SIGINT)
        r = finish(proc, timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    kind, context, seconds = r.stdout.split()
    assert (kind, context) == ("KeyboardInterrupt", "NoneType"), r.describe()
    assert int(seconds) < 10, r.describe()
