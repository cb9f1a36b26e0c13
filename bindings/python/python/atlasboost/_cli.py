"""The `atlasboost` console script and `python -m atlasboost`: the `atlasboost` command that
the package ships (`atlasboost/_bin/atlasboost`, built from `atlasboost-cli` with the package).

The command is a program of its own, not code in this interpreter: the native module holds
library mode only (no command line, no launcher), and the launcher owns its process (signals,
its lifeline, `kill -9`), whatever the Python program that starts it does with threads.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path


def command() -> str:
    """The path of the package's `atlasboost` command."""
    path = Path(__file__).resolve().parent / "_bin" / "atlasboost"
    if not os.access(path, os.X_OK):
        raise SystemExit(f"atlasboost: the package's command {path} is missing or not executable: "
                         "reinstall the package (pip install ./bindings/python)")
    return str(path)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs `atlasboost ARGS...` and returns its exit code.

    Without `argv` (the console script, `python -m atlasboost`) this process becomes the
    command, with this process's arguments: its pid, signals and exit status are the
    launcher's. With `argv`, the command runs as a child and its exit code is returned.
    """
    exe = command()
    if argv is None:
        # None where the descriptor was closed (`>&-`): the command says so itself.
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        os.execv(exe, ["atlasboost", *sys.argv[1:]])
    return subprocess.call([exe, *argv])
