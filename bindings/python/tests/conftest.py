"""Fixtures of the atlasboost package's tests (the helpers are in helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import WORKER


@pytest.fixture
def worker(tmp_path: Path) -> Path:
    """The original usage snippet as a script that prints a report."""
    path = tmp_path / "worker.py"
    path.write_text(WORKER)
    return path
