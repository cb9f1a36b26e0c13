#!/usr/bin/env bash
# Builds target/release/atlasboost-relay statically linked (with --debug first:
# target/debug/atlasboost-relay). The relay is what mpirun starts as every rank of
# `atlasboost run --mpi`; statically linked it starts without the dynamic loader, which saves
# a launch of 8 ranks about 3 ms (docs/PERFORMANCE.md). `atlasboost` runs the relay beside it
# when every rank is on its machine, else `atlasboost relay`. Other arguments go to cargo
# (--quiet). Not with --features mpi: the MPI library is a shared library only.
#
# `build-static-relay.sh --check FILE` only says whether FILE is statically linked (exit 0) or
# not (exit 1), as this build checks its own.
#
# Cargo sets target features per build, not per binary, so this is a build of its own; a later
# `cargo build -p atlasboost-cli` links the relay dynamically again (it works, without the
# saving).
set -euo pipefail
cd "$(dirname "$0")/.."

# Whether ELF file $1 is statically linked: no program interpreter (the dynamic loader) and no
# shared library it needs.
is_static() {
    command -v readelf >/dev/null ||
        { echo "build-static-relay.sh: readelf is not installed (Debian: binutils)" >&2; exit 2; }
    local headers dynamic
    headers=$(readelf --program-headers "$1") || exit 2
    dynamic=$(readelf --dynamic "$1") || exit 2
    ! grep -q INTERP <<<"$headers" && ! grep -q NEEDED <<<"$dynamic"
}

if [[ ${1:-} == --check ]]; then
    [[ $# == 2 ]] || { echo "usage: build-static-relay.sh --check FILE" >&2; exit 2; }
    if is_static "$2"; then echo "$2: statically linked"; else echo "$2: dynamically linked"; exit 1; fi
    exit 0
fi

profile=release
if [[ ${1:-} == --debug ]]; then
    profile=debug
    shift
fi
cargo_profile=$([[ $profile == debug ]] && echo dev || echo release)
cargo rustc --profile "$cargo_profile" -p atlasboost-cli --bin atlasboost-relay "$@" \
    -- -C target-feature=+crt-static
relay=target/$profile/atlasboost-relay
is_static "$relay" || { echo "build-static-relay.sh: $relay is not statically linked" >&2; exit 1; }
echo "build-static-relay.sh: $relay is statically linked" >&2
