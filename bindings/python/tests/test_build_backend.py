"""The build backend's choice of MPI support (build_backend/atlasboost_build.py), against a
made-up machine: what is on PATH, what pkg-config knows, where libclang is. The real builds,
with and without MPI, are scripts/test-python.sh's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "build_backend"))
import atlasboost_build as backend  # noqa: E402


def machine(tmp_path: Path, *, mpicc: bool, libclang: bool, pkg: tuple = ()):
    """which(), pkg_config() and the libclang search of a machine with what is asked for."""
    lib = tmp_path / "llvm" / "lib"
    lib.mkdir(parents=True)
    if libclang:
        (lib / "libclang-14.so.1").write_bytes(b"")

    def which(name: str):
        return "/opt/mpi/bin/mpicc" if mpicc and name == "mpicc" else None

    return {"which": which, "pkg_config": lambda p: p in pkg, "libclang_search": (str(lib),)}


def command_builds(monkeypatch) -> list:
    """Records the backend's builds of the `atlasboost` command (features) and removals,
    instead of running cargo."""
    placed: list = []
    monkeypatch.setattr(backend, "place_command", lambda features: placed.append(list(features)))
    monkeypatch.setattr(backend, "remove_command", lambda: placed.append("removed"))
    return placed


@pytest.mark.parametrize("value", ["0", "no", "off", "FALSE"])
def test_zero_builds_without_mpi_whatever_the_machine_has(tmp_path: Path, value: str) -> None:
    choice = backend.choose({backend.VARIABLE: value}, **machine(tmp_path, mpicc=True, libclang=True))
    assert choice == backend.Choice(False, f"{backend.VARIABLE}={value}")


def test_auto_builds_mpi_support_where_mpicc_and_libclang_are(tmp_path: Path) -> None:
    m = machine(tmp_path, mpicc=True, libclang=True)
    for env in ({}, {backend.VARIABLE: "auto"}, {backend.VARIABLE: "1"}):
        choice = backend.choose(env, **m)
        assert choice.mpi, choice
        assert "mpicc at /opt/mpi/bin/mpicc" in choice.why and "libclang in" in choice.why


def test_pkg_config_finds_mpi_without_mpicc(tmp_path: Path) -> None:
    choice = backend.choose({}, **machine(tmp_path, mpicc=False, libclang=True, pkg=("mpich",)))
    assert choice.mpi and "MPICH in pkg-config" in choice.why, choice


def test_no_mpi_builds_without_it_unless_required(tmp_path: Path) -> None:
    m = machine(tmp_path, mpicc=False, libclang=True)
    choice = backend.choose({}, **m)
    assert not choice.mpi and "no MPI found" in choice.why, choice
    with pytest.raises(backend.BuildError, match="ATLASBOOST_WITH_MPI=1 requires MPI support, but no MPI found"):
        backend.choose({backend.VARIABLE: "1"}, **m)


def test_mpi_without_libclang_says_what_is_missing(tmp_path: Path) -> None:
    m = machine(tmp_path, mpicc=True, libclang=False)
    choice = backend.choose({}, **m)
    assert not choice.mpi and "no libclang" in choice.why and "libclang-dev" in choice.why, choice
    with pytest.raises(backend.BuildError, match="requires MPI support: mpicc at .* no libclang"):
        backend.choose({backend.VARIABLE: "yes"}, **m)
    # LIBCLANG_PATH points at one.
    lib = tmp_path / "elsewhere"
    lib.mkdir()
    (lib / "libclang.so").write_bytes(b"")
    assert backend.choose({"LIBCLANG_PATH": str(lib)}, **m).mpi


def test_a_malformed_value_is_named(tmp_path: Path) -> None:
    with pytest.raises(backend.BuildError, match=r"ATLASBOOST_WITH_MPI='maybe': expected 1 .*, 0 .* or auto"):
        backend.choose({backend.VARIABLE: "maybe"}, **machine(tmp_path, mpicc=True, libclang=True))


@pytest.mark.parametrize(
    ("args", "asks"),
    [
        (["--features", "mpi"], True),
        (["-F", "foo,mpi"], True),
        (["--features=mpi"], True),
        (["--release", "--features", "other"], False),
        (["--features", "mpi4py"], False),
        (["--release", "--", "--cfg", "mpi"], False),
        (["--", "--features", "mpi"], False),
        ([], False),
    ],
)
def test_mpi_asked_for_in_maturins_own_arguments_is_seen(args: list, asks: bool) -> None:
    assert backend.asks_for_mpi(args) is asks


def test_found_mpi_that_fails_to_build_is_built_without_unless_required(tmp_path: Path, monkeypatch) -> None:
    """A broken MPI installation: the build with `--features mpi` fails (maturin exits)."""
    calls = []

    def hook(directory, settings, metadata):
        calls.append(settings["maturin.build-args"])
        if "mpi" in settings["maturin.build-args"]:
            raise SystemExit(1)
        return "atlasboost-0.1.0.whl"

    placed = command_builds(monkeypatch)
    monkeypatch.setattr(backend, "choose", lambda: backend.Choice(True, "mpicc at /x"))
    monkeypatch.delenv(backend.VARIABLE, raising=False)
    monkeypatch.delenv("MATURIN_PEP517_ARGS", raising=False)
    assert backend.build(hook, str(tmp_path), None, None) == "atlasboost-0.1.0.whl"
    assert calls == ["--features mpi", ""]
    # The command is built with the features of each attempt, and removed after each.
    assert placed == [["--features", "mpi"], "removed", [], "removed"]
    monkeypatch.setenv(backend.VARIABLE, "1")
    calls.clear()
    with pytest.raises(SystemExit):
        backend.build(hook, str(tmp_path), None, None)
    assert calls == ["--features mpi"]


def test_the_feature_goes_before_rustcs_arguments(tmp_path: Path, monkeypatch) -> None:
    calls = []
    placed = command_builds(monkeypatch)
    monkeypatch.setattr(backend, "choose", lambda: backend.Choice(True, "mpicc at /x"))
    monkeypatch.setenv("MATURIN_PEP517_ARGS", "--release -- -C opt-level=2")
    backend.build(lambda d, settings, m: calls.append(settings["maturin.build-args"]), str(tmp_path), None, None)
    assert calls == ["--release --features mpi -- -C opt-level=2"]
    assert placed == [["--features", "mpi"], "removed"]


def test_an_editable_install_keeps_the_command_in_place(tmp_path: Path, monkeypatch) -> None:
    placed = command_builds(monkeypatch)
    monkeypatch.setattr(backend, "choose", lambda: backend.Choice(False, "no MPI found"))
    monkeypatch.delenv("MATURIN_PEP517_ARGS", raising=False)
    backend.build(lambda d, settings, m: "w.whl", str(tmp_path), None, None, editable=True)
    assert placed == [[]]
