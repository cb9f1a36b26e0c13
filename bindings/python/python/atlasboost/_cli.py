"""The `atlasboost` console script: the Rust launcher's command line, run in this process."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Runs `atlasboost ARGS...` (default: this process's arguments) and returns its exit code.

    The console script passes the code to `sys.exit`. atlasboost starts itself again for its
    lifeline process and on remote hosts (`atlasboost agent`) as `python -m atlasboost`, with
    this interpreter: remote hosts need the package installed at the same interpreter path
    (or `--remote-atlasboost`).
    """
    from atlasboost import _atlasboost

    args = sys.argv[1:] if argv is None else list(argv)
    self_command = [sys.executable, "-m", "atlasboost"] if sys.executable else []
    # The program name is "atlasboost" whatever started it (the script, `python -m`), as clap's
    # help and usage messages show it.
    return _atlasboost.main(["atlasboost", *args], self_command)
