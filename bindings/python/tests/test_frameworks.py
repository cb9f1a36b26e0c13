"""set_device_id() and the frameworks: fake `mindspore`, `torch`/`torch_npu` and `tensorflow`
packages on PYTHONPATH record what is done to them in a log file."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from helpers import clean_env, run_python

FAKES = {
    "tensorflow/__init__.py": """
        from _fake_log import log
        log("import tensorflow")
    """,
    "mindspore/__init__.py": """
        from _fake_log import log
        log("import mindspore")

        def set_device(device_target, device_id=None):
            log(f"mindspore.set_device {device_target} {device_id!r}")

        def set_context(**kwargs):
            log(f"mindspore.set_context {sorted(kwargs.items())}")
    """,
    "torch/__init__.py": """
        from _fake_log import log
        log("import torch")
    """,
    "torch_npu/__init__.py": """
        import types
        import torch
        from _fake_log import log
        log("import torch_npu")
        # The real torch_npu adds torch.npu when imported.
        torch.npu = types.SimpleNamespace(set_device=lambda i: log(f"torch.npu.set_device {i!r}"))
    """,
    "_fake_log.py": """
        import os

        def log(line):
            with open(os.environ["FAKE_LOG"], "a") as f:
                f.write(line + "\\n")
    """,
}

# MindSpore before 2.5 has no set_device: set_context(device_id=...) instead.
OLD_MINDSPORE = """
    from _fake_log import log
    log("import mindspore")

    def set_context(**kwargs):
        log(f"mindspore.set_context {sorted(kwargs.items())}")
"""


def fakes(tmp_path: Path, only: tuple[str, ...] | None = None, old_mindspore: bool = False) -> Path:
    root = tmp_path / "fakes"
    for name, text in FAKES.items():
        top = name.split("/")[0].removesuffix(".py")
        if only is not None and top not in only and top != "_fake_log":
            continue
        if old_mindspore and top == "mindspore":
            text = OLD_MINDSPORE
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def env_with(tmp_path: Path, fake_root: Path | None) -> dict[str, str]:
    env = clean_env(
        ATLASBOOST_SIM="2",
        ATLASBOOST_RANK_TABLE_FILE=str(tmp_path / "rank_table.json"),
        FAKE_LOG=str(tmp_path / "fake.log"),
    )
    if fake_root is not None:
        env["PYTHONPATH"] = str(fake_root)
    return env


def log(tmp_path: Path) -> list[str]:
    path = tmp_path / "fake.log"
    return path.read_text().splitlines() if path.exists() else []


SELECT = """
    import json, os, sys
    import atlasboost.tensorflow.mpi_ops as atlasboost
    atlasboost.init(frame="tensorflow")
    atlasboost.set_device_id(atlasboost.local_rank())
    print(json.dumps([os.environ["DEVICE_ID"], os.environ["ASCEND_DEVICE_ID"],
                      sorted(m for m in ("mindspore", "torch", "torch_npu", "tensorflow") if m in sys.modules)]))
"""


def test_importing_atlasboost_imports_no_framework(tmp_path: Path) -> None:
    code = """
        import json, os, sys
        before = set(sys.modules)
        import atlasboost
        import atlasboost.tensorflow.mpi_ops
        import atlasboost.mindspore
        import atlasboost.torch
        new = sorted(set(sys.modules) - before)
        threads = len(os.listdir("/proc/self/task"))
        print(json.dumps([new, threads]))
    """
    r = run_python(code, env=env_with(tmp_path, fakes(tmp_path)))
    assert r.returncode == 0, r.describe()
    new, threads = json.loads(r.stdout.splitlines()[-1])
    # Only atlasboost's own modules: no framework, no socket, no json, no thread started.
    assert [m for m in new if m != "atlasboost" and not m.startswith("atlasboost.")] == [], new
    assert threads == 1, "importing atlasboost started a thread"
    assert log(tmp_path) == []


def test_set_device_id_selects_the_device_in_mindspore_and_torch_npu(tmp_path: Path) -> None:
    r = run_python(SELECT, env=env_with(tmp_path, fakes(tmp_path)))
    assert r.returncode == 0, r.describe()
    device, ascend, imported = json.loads(r.stdout.splitlines()[-1])
    assert (device, ascend) == ("0", "0")
    assert imported == ["mindspore", "torch", "torch_npu"], "tensorflow is never imported"
    calls = log(tmp_path)
    assert "mindspore.set_device Ascend 0" in calls, calls
    assert "torch.npu.set_device 0" in calls, calls
    assert not any("set_context" in c for c in calls), calls


@pytest.mark.parametrize(
    ("module", "selected", "imported"),
    [
        ("mindspore", "mindspore.set_device Ascend 0", ["mindspore"]),
        ("torch", "torch.npu.set_device 0", ["torch", "torch_npu"]),
    ],
)
def test_a_frameworks_job_selects_the_device_in_that_framework_alone(
    tmp_path: Path, module: str, selected: str, imported: list[str]
) -> None:
    """With both installed, a MindSpore job does not import torch (nor a PyTorch job
    MindSpore): the framework of init() decides."""
    code = f"""
        import json, sys
        import atlasboost.{module} as atlasboost
        atlasboost.init()
        atlasboost.set_device_id(atlasboost.local_rank())
        print(json.dumps(sorted(m for m in ("mindspore", "torch", "torch_npu") if m in sys.modules)))
    """
    r = run_python(code, env=env_with(tmp_path, fakes(tmp_path)))
    assert r.returncode == 0, r.describe()
    assert json.loads(r.stdout.splitlines()[-1]) == imported, r.describe()
    assert selected in log(tmp_path), log(tmp_path)


def test_old_mindspore_gets_set_context(tmp_path: Path) -> None:
    r = run_python(SELECT, env=env_with(tmp_path, fakes(tmp_path, ("mindspore",), old_mindspore=True)))
    assert r.returncode == 0, r.describe()
    _, _, imported = json.loads(r.stdout.splitlines()[-1])
    assert imported == ["mindspore"]
    assert log(tmp_path) == ["import mindspore", "mindspore.set_context [('device_id', 0)]"]


def test_only_torch_npu(tmp_path: Path) -> None:
    r = run_python(SELECT, env=env_with(tmp_path, fakes(tmp_path, ("torch", "torch_npu"))))
    assert r.returncode == 0, r.describe()
    _, _, imported = json.loads(r.stdout.splitlines()[-1])
    assert imported == ["torch", "torch_npu"]
    assert log(tmp_path)[-1] == "torch.npu.set_device 0"


def test_torch_without_torch_npu_is_left_alone(tmp_path: Path) -> None:
    # Plain PyTorch (no NPU support) is not imported: nothing to select there.
    r = run_python(SELECT, env=env_with(tmp_path, fakes(tmp_path, ("torch",))))
    assert r.returncode == 0, r.describe()
    _, _, imported = json.loads(r.stdout.splitlines()[-1])
    assert imported == []
    assert log(tmp_path) == []


def test_without_frameworks_nothing_is_imported(tmp_path: Path) -> None:
    r = run_python(SELECT, env=env_with(tmp_path, None))
    assert r.returncode == 0, r.describe()
    device, ascend, imported = json.loads(r.stdout.splitlines()[-1])
    assert (device, ascend) == ("0", "0")
    assert imported == []


@pytest.mark.parametrize("bad", [1, 5])
def test_a_refused_device_is_not_selected_anywhere(tmp_path: Path, bad: int) -> None:
    code = f"""
        import atlasboost
        atlasboost.init()
        try:
            atlasboost.set_device_id({bad})
        except atlasboost.DeviceError as e:
            print("refused:", e)
    """
    r = run_python(code, env=env_with(tmp_path, fakes(tmp_path)))
    assert r.returncode == 0, r.describe()
    assert f"refused: device {bad} is not rank 0's device" in r.stdout, r.describe()
    assert log(tmp_path) == []
