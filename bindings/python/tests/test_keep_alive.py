"""Keeping a job alive from inside a worker (SPEC §12): `atlasboost.heartbeat()` for the hang
watchdog, `--hang-dump`'s Python stacks, and `atlasboost.record` naming the root cause."""

from __future__ import annotations

import os
import shutil
import textwrap
import time
from pathlib import Path

import pytest
from helpers import ATLASBOOST, PYTHON, clean_env, run

# The virtual environment's programs (py-spy, installed there by scripts/test-python.sh).
VENV_BIN = str(Path(PYTHON).parent)


def launch(tmp_path: Path, code: str, *flags: str, timeout: float = 90):
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(code))
    env = clean_env(PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""))
    return run([ATLASBOOST, "run", *flags, "--", PYTHON, str(script)], env=env, cwd=tmp_path, timeout=timeout)


def test_a_rank_that_only_beats_is_never_reported_while_a_silent_one_is(tmp_path: Path) -> None:
    r = launch(
        tmp_path,
        """
        import os, time
        import atlasboost
        rank = int(os.environ["RANK"])
        assert atlasboost.heartbeat(0), "the launcher listens"
        if rank == 1:
            time.sleep(60)          # silent, no heartbeat: hung
        for step in range(1, 60):   # rank 0 prints nothing, but beats
            time.sleep(0.1)
            atlasboost.heartbeat(step)
        """,
        "--sim", "2", "--hang-timeout", "2", "--grace", "1",
    )
    assert r.returncode == 124, r.describe()
    assert "rank 1 (host" in r.stderr and "one rank is stuck while rank 0 still progress" in r.stderr, r.describe()
    assert "rank 0 (host" not in r.stderr.split("hang:")[1].split("stopping")[0], r.describe()


def test_a_hang_report_has_the_last_beat_before_the_hang(tmp_path: Path) -> None:
    # 50 beats in a burst (well within 100 ms), then the worker hangs: the report counts them
    # all and names the last step, not an older beat held back in memory.
    r = launch(
        tmp_path,
        """
        import time
        import atlasboost
        for step in range(50):
            atlasboost.heartbeat(step)
        time.sleep(60)
        """,
        "--sim", "1", "--hang-timeout", "1", "--grace", "1",
    )
    assert r.returncode == 124, r.describe()
    assert "no output and no heartbeat for" in r.stderr, r.describe()
    assert "50 heartbeats, last at step 49" in r.stderr, r.describe()


def test_heartbeat_without_a_launcher_does_nothing() -> None:
    # Outside `atlasboost run` nobody listens: the call says so, and is still safe to make.
    code = """import atlasboost
for _ in range(1000): atlasboost.heartbeat(3)
try:
    atlasboost.heartbeat(2**70)
except OverflowError as e:
    print(e)
print(atlasboost.heartbeat())"""
    r = run([PYTHON, "-c", code], timeout=60)
    assert r.returncode == 0, r.describe()
    # A step no 64-bit integer holds is named with its argument.
    assert r.stdout.split("\n")[:2] == [f"heartbeat(step={2**70}): a step is a signed 64-bit integer", "False"], r.describe()


def test_hang_dump_saves_the_stuck_ranks_python_stacks(tmp_path: Path) -> None:
    if shutil.which("py-spy", path=VENV_BIN + os.pathsep + os.environ.get("PATH", "")) is None:
        if os.environ.get("ATLASBOOST_PYTHON_REQUIRE_PY_SPY") == "1":
            pytest.fail("py-spy is not installed, but scripts/test-python.sh installs it")
        pytest.skip("py-spy is not installed (pip install py-spy)")
    started = time.monotonic()
    r = launch(
        tmp_path,
        """
        import os, time
        def wait_for_the_collective_that_never_completes():
            time.sleep(120)
        if os.environ["RANK"] == "1":
            print("entering the collective", flush=True)
            wait_for_the_collective_that_never_completes()
        for i in range(600):
            print("tick", i, flush=True)
            time.sleep(0.1)
        """,
        "--sim", "2", "--hang-timeout", "3", "--hang-dump", "--grace", "1", "--log-dir", "logs",
    )
    assert r.returncode == 124, r.describe()
    assert "rank 1 (host" in r.stderr, r.describe()
    stacks = list((tmp_path / "logs").glob("ab-*/rank.1.stacks.txt"))
    assert len(stacks) == 1, (list((tmp_path / "logs").rglob("*")), r.describe())
    text = stacks[0].read_text()
    assert "wait_for_the_collective_that_never_completes" in text, text
    assert "wait_for_the_collective_that_never_completes" in r.stderr, "summarised on the console"
    # Reported within 3 s of silence plus the dump, long before the 60 s rank 0 would print.
    assert time.monotonic() - started < 40, r.describe()


def test_faulthandler_gives_the_stacks_without_py_spy(tmp_path: Path) -> None:
    """Without py-spy on PATH, `init()`'s faulthandler answers SIGUSR1."""
    script = tmp_path / "worker.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, time
            import atlasboost
            atlasboost.init()
            def stuck_in_a_loop_of_its_own():
                time.sleep(120)
            if atlasboost.rank() == 0:
                print("stuck", flush=True)
                stuck_in_a_loop_of_its_own()
            for i in range(600):
                print("tick", i, flush=True)
                time.sleep(0.1)
            """
        )
    )
    # A PATH without the virtual environment's py-spy (the package's command is called by path).
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p != VENV_BIN)
    if shutil.which("py-spy", path=path) is not None:
        pytest.skip("py-spy is installed system-wide; the faulthandler path cannot be isolated")
    env = clean_env(PATH=path)
    r = run(
        [ATLASBOOST, "run", "--sim", "2", "--hang-timeout", "3", "--hang-dump", "--grace", "1", "--log-dir", "logs",
         "--", PYTHON, str(script)],
        env=env, cwd=tmp_path, timeout=90,
    )
    assert r.returncode == 124, r.describe()
    text = next((tmp_path / "logs").glob("ab-*/rank.0.stacks.txt")).read_text()
    assert "stuck_in_a_loop_of_its_own" in text, text


def test_record_names_the_root_cause_with_its_traceback_line(tmp_path: Path) -> None:
    r = launch(
        tmp_path,
        """
        import os, time
        import atlasboost

        @atlasboost.record
        def main():
            if os.environ["RANK"] == "2":
                raise ValueError("the loss is NaN at step 7")
            time.sleep(30)

        main()
        """,
        "--sim", "4", "--grace", "1",
    )
    assert r.returncode == 1, r.describe()
    assert "root cause: rank 2 recorded ValueError: the loss is NaN at step 7" in r.stderr, r.describe()
    assert 'line 8, in main' in r.stderr and "worker.py" in r.stderr, r.describe()


def test_an_uncaught_exception_after_init_is_recorded_too(tmp_path: Path) -> None:
    r = launch(
        tmp_path,
        """
        import os, time
        import atlasboost
        atlasboost.init()
        if atlasboost.rank() == 1:
            {}["missing key"]
        time.sleep(30)
        """,
        "--sim", "2", "--grace", "1",
    )
    assert r.returncode == 1, r.describe()
    assert "root cause: rank 1 recorded KeyError: 'missing key'" in r.stderr, r.describe()


def test_a_keyboard_interrupt_after_init_is_not_recorded_as_a_failure(tmp_path: Path) -> None:
    """Ctrl-C is not a failure to record (as `@record` says): rank 1 dies of KeyboardInterrupt
    after init(); the summary names it as it ended, with no recorded root cause."""
    r = launch(
        tmp_path,
        """
        import atlasboost
        atlasboost.init()
        if atlasboost.rank() == 1:
            raise KeyboardInterrupt
        """,
        "--sim", "2", "--grace", "1",
    )
    assert r.returncode != 0, r.describe()
    assert "KeyboardInterrupt" in r.stderr, r.describe()
    assert "recorded KeyboardInterrupt" not in r.stderr, r.describe()
