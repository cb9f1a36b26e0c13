#!/usr/bin/env bash
# The Python package's tests (bindings/python), on a fresh machine: a virtual environment, the
# package built from source with pip (one release build by maturin), pytest, and the import-time
# measurement of docs/PERFORMANCE.md.
#
# What it needs: python3 (its venv module is installed from Debian's python3-venv when missing)
# and the Rust toolchain. With mpicc (Open MPI) and libclang present, the package is built with
# MPI support and the mpirun tests must run; without them they check the error that says so.
#
#   ATLASBOOST_PYTHON_VENV   the virtual environment (default target/python-venv)
#   PYTEST_ARGS              more arguments for pytest (e.g. "-k launch -x")
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }
started=$SECONDS

venv=${ATLASBOOST_PYTHON_VENV:-target/python-venv}
case $venv in /*) ;; *) venv=$PWD/$venv ;; esac
py=$venv/bin/python

step "a virtual environment in $venv"
# A venv whose interpreter is gone or broken (python upgraded, directory copied) is made anew.
if [ -e "$venv" ] && ! "$py" -c 'import pip' >/dev/null 2>&1; then
    echo "scripts/test-python.sh: $venv is broken; recreating it"
    rm -rf "$venv"
fi
if [ ! -e "$venv" ] && ! python3 -m venv "$venv"; then
    # Debian's python3 has its venv module (ensurepip) in a package of its own.
    rm -rf "$venv"
    step "installing python3-venv from Debian's packages"
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-venv
    python3 -m venv "$venv"
fi
# maturin's build hook runs `maturin` from PATH; the tests' workers run `python3` from it.
export PATH="$venv/bin:$PATH"
"$py" -m pip install --quiet --disable-pip-version-check --upgrade \
    'maturin>=1.9.4,<2' 'pytest>=8' 'pytest-timeout>=2.3'

step "building and installing the package (pip install ./bindings/python)"
maturin_args=()
if command -v mpicc >/dev/null 2>&1 && ls /usr/lib/llvm-*/lib/libclang.so >/dev/null 2>&1; then
    # The mpi crate finds Open MPI through mpicc and generates its bindings with libclang.
    maturin_args+=(--features mpi)
    export ATLASBOOST_PYTHON_REQUIRE_MPI=1
elif command -v mpicc >/dev/null 2>&1; then
    echo "scripts/test-python.sh: mpicc is here but libclang is not (Debian: libclang-dev):" \
        "building without MPI support" >&2
fi
# The venv's maturin (no isolated build environment to fetch it into); the workspace's target/
# holds the build, so a second run rebuilds only what changed.
MATURIN_PEP517_ARGS="${maturin_args[*]}" "$py" -m pip install --quiet --disable-pip-version-check \
    --no-build-isolation --force-reinstall --no-deps ./bindings/python
"$py" -c 'import atlasboost; print("atlasboost", atlasboost.__version__, "mpi" if atlasboost.mpi_built() else "no mpi")'

step "pytest"
"$py" -m pytest bindings/python/tests ${PYTEST_ARGS:-}

step "import time (python3 -X importtime -c 'import atlasboost', 7 runs)"
times=()
for _ in 1 2 3 4 5 6 7; do
    # Cumulative microseconds of the top-level atlasboost import: its own modules and the
    # native library they load, not the interpreter's start.
    us=$("$py" -X importtime -c 'import atlasboost' 2>&1 >/dev/null |
        awk -F'|' '$3 ~ /^ atlasboost$/ { gsub(/ /, "", $2); print $2 }')
    [ -n "$us" ] || { echo "scripts/test-python.sh: no import time for atlasboost" >&2; exit 1; }
    times+=("$us")
done
sorted=$(printf '%s\n' "${times[@]}" | sort -n | tr '\n' ' ')
read -r -a sorted <<<"$sorted"
ms() { printf '%d.%d' $(($1 / 1000)) $(($1 % 1000 / 100)); }
echo "runs (us): ${times[*]}"
echo "import atlasboost: best $(ms "${sorted[0]}") ms, median $(ms "${sorted[3]}") ms, worst $(ms "${sorted[6]}") ms (target: under 20 ms)"

echo
echo "scripts/test-python.sh: passed in $((SECONDS - started)) s"
