#!/usr/bin/env bash
# The Python package's tests (bindings/python), on a fresh machine: a virtual environment, the
# package built from source by a plain `pip install ./bindings/python` (maturin, fetched by pip),
# pytest, then a second build with ATLASBOOST_WITH_MPI=0 and the tests of what it can do
# without MPI, and the import-time measurement of docs/PERFORMANCE.md.
#
# What it needs: python3 (its venv module is installed from Debian's python3-venv when missing)
# and the Rust toolchain. With mpicc (Open MPI) and libclang present, the first build must have
# found MPI and the mpirun and mpi4py tests must run.
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
# The second build, without MPI support, gets a venv of its own.
venv_nompi=$venv-nompi

# A virtual environment with pip and the test tools (maturin for the build backend's tests;
# the package's own build fetches its maturin itself); one that is broken (python upgraded,
# directory copied) is made anew.
make_venv() {
    local dir=$1
    if [ -e "$dir" ] && ! "$dir/bin/python" -c 'import pip' >/dev/null 2>&1; then
        echo "scripts/test-python.sh: $dir is broken; recreating it"
        rm -rf "$dir"
    fi
    if [ ! -e "$dir" ] && ! python3 -m venv "$dir"; then
        # Debian's python3 has its venv module (ensurepip) in a package of its own.
        rm -rf "$dir"
        step "installing python3-venv from Debian's packages"
        apt-get update
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-venv
        python3 -m venv "$dir"
    fi
    "$dir/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade \
        'pytest>=8' 'pytest-timeout>=2.3' 'mpi4py>=4' 'maturin>=1.9.4,<2' 'py-spy>=0.4' \
        'prometheus_client>=0.20'
}

# `pip install ./bindings/python` exactly as a user types it (an isolated build: pip fetches
# maturin itself), with more variables if given; says how long it took.
pip_install() {
    local py=$1
    shift
    local started_at=$SECONDS
    env "$@" "$py" -m pip install --quiet --disable-pip-version-check --force-reinstall \
        ./bindings/python
    "$py" -c 'import atlasboost; i = atlasboost.build_info(); print("installed atlasboost", i["version"], "MPI support:", "yes (" + i["mpi_library"] + ")" if i["mpi"] else "no")'
    echo "pip install took $((SECONDS - started_at)) s"
}

# What the build backend must find here: MPI (mpicc) and libclang for the mpi crate's bindings.
expect_mpi=0
if command -v mpicc >/dev/null 2>&1 && ls /usr/lib/llvm-*/lib/libclang.so >/dev/null 2>&1; then
    expect_mpi=1
elif command -v mpicc >/dev/null 2>&1; then
    echo "scripts/test-python.sh: mpicc is here but libclang is not (Debian: libclang-dev):" \
        "the package builds without MPI support" >&2
fi

step "a virtual environment in $venv"
make_venv "$venv"
# The tests' workers run `python3` from PATH: this venv's.
export PATH="$venv/bin:$PATH"

step "pip install ./bindings/python (MPI support found by the build: expected $expect_mpi)"
pip_install "$py"
export ATLASBOOST_PYTHON_EXPECT_MPI=$expect_mpi
if [ "$expect_mpi" = 1 ]; then
    # mpirun is here: its tests must run, and so must the mpi4py one.
    export ATLASBOOST_PYTHON_REQUIRE_MPI=1 ATLASBOOST_PYTHON_REQUIRE_MPI4PY=1
fi

step "pytest"
# py-spy is installed above: --hang-dump's test must run.
ATLASBOOST_PYTHON_REQUIRE_PY_SPY=1 "$py" -m pytest bindings/python/tests ${PYTEST_ARGS:-}

step "ATLASBOOST_WITH_MPI=0 pip install ./bindings/python, in $venv_nompi"
make_venv "$venv_nompi"
pip_install "$venv_nompi/bin/python" ATLASBOOST_WITH_MPI=0
step "pytest of the build without MPI: the original snippet under plain mpirun and atlasboost run"
# Debian's libc6-dev has the static C library: this build's relay must be statically linked.
PATH="$venv_nompi/bin:$PATH" ATLASBOOST_PYTHON_EXPECT_MPI=0 ATLASBOOST_PYTHON_REQUIRE_STATIC_RELAY=1 \
    "$venv_nompi/bin/python" -m pytest \
    bindings/python/tests -k 'build_info or version or under_mpirun or under_atlasboost_run or mpi4py or run_mpi' \
    ${PYTEST_ARGS:-}

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
