"""examples/train.py: with the package installed it calls init() as the original tool's
workers did; without it (python -S: no site-packages) it stays standard-library only, with the
same lines and exit codes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import ATLASBOOST, PYTHON, REPO, clean_env, run

TRAIN = REPO / "examples" / "train.py"
INIT_LINE = re.compile(
    r"^atlasboost\.init\(\): rank (\d+)/(\d+), local rank (\d+)/(\d+), device (\d+), launcher rank (\d+)$"
)


def by_rank(stdout: str) -> dict[int, list[str]]:
    lines: dict[int, list[str]] = {}
    for line in stdout.splitlines():
        m = re.match(r"^\[(\d+)\]<stdout>:(.*)$", line)
        if m:
            lines.setdefault(int(m.group(1)), []).append(m.group(2))
    return lines


def launch(tmp_path: Path, python: list[str], *extra: str, hosts: list[str] | None = None):
    return run(
        [ATLASBOOST, "run", "--sim", "4", *(hosts or []), "--", *python, TRAIN, "--sleep", "0", *extra],
        cwd=tmp_path,
        timeout=90,
    )


def test_train_py_in_atlasboost_mode_prints_the_same_lines_and_one_more(tmp_path: Path) -> None:
    with_package = launch(tmp_path, [PYTHON], hosts=["-H", "127.0.0.1:2,127.0.0.2:2"])
    stdlib = launch(tmp_path, [PYTHON, "-S"], hosts=["-H", "127.0.0.1:2,127.0.0.2:2"])
    assert with_package.returncode == 0, with_package.describe()
    assert stdlib.returncode == 0, stdlib.describe()
    ours, theirs = by_rank(with_package.stdout), by_rank(stdlib.stdout)
    assert sorted(ours) == sorted(theirs) == [0, 1, 2, 3]
    for rank in range(4):
        first, *rest = ours[rank]
        m = INIT_LINE.match(first)
        assert m, (rank, ours[rank])
        assert [int(g) for g in m.groups()] == [rank, 4, rank % 2, 2, rank % 2, rank]
        # The job id differs between the two runs; every other line is the same.
        assert [re.sub(r"job \S+", "job J", x) for x in rest] == [
            re.sub(r"job \S+", "job J", x) for x in theirs[rank]
        ]
        assert rest[-1] == "step 5/5 loss " + rest[-1].split()[-1]
    assert not any(INIT_LINE.match(x) for lines in theirs.values() for x in lines)


@pytest.mark.parametrize("python", [[PYTHON], [PYTHON, "-S"]], ids=["atlasboost", "stdlib"])
def test_train_py_fail_rank_keeps_its_exit_code(tmp_path: Path, python: list[str]) -> None:
    r = launch(tmp_path, python, "--fail-rank", "2", "--exit-code", "7", "--steps", "3")
    assert r.returncode == 7, r.describe()
    assert "rank 2: failing on purpose (--fail-rank) at step 2" in r.stderr, r.describe()


def test_train_py_by_hand_in_stdlib_mode_says_to_use_atlasboost_run(tmp_path: Path) -> None:
    r = run([PYTHON, "-S", TRAIN], cwd=tmp_path, timeout=30)
    assert r.returncode == 2, r.describe()
    assert "RANK_ID is not set or empty; start me with `atlasboost run`" in r.stderr


def test_train_py_by_hand_with_the_package_is_a_world_of_one(tmp_path: Path) -> None:
    env = clean_env(ATLASBOOST_SIM="1")
    r = run([PYTHON, TRAIN, "--steps", "1", "--sleep", "0"], env=env, cwd=tmp_path, timeout=30)
    assert r.returncode == 0, r.describe()
    assert r.stdout.splitlines()[0] == (
        "atlasboost.init(): rank 0/1, local rank 0/1, device 0, launcher rank 0"
    ), r.describe()
    assert (tmp_path / "rank_table.json").is_file()


def test_train_py_with_the_package_reports_a_failed_init(tmp_path: Path) -> None:
    # No device anywhere: the probe finds nothing on a machine without NPUs.
    env = clean_env(ATLASBOOST_PROBE="hccn", ATLASBOOST_HCCN_CONF=str(tmp_path / "none.conf"))
    r = run([PYTHON, TRAIN], env=env, cwd=tmp_path, timeout=30)
    assert r.returncode == 2, r.describe()
    assert "train.py: atlasboost.init() failed:" in r.stderr, r.describe()
    assert "Traceback" not in r.stderr, r.describe()
