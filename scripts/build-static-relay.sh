#!/usr/bin/env bash
# Builds target/release/atlasboost-relay statically linked (with --debug first:
# target/debug/atlasboost-relay). The relay is what mpirun starts as every rank of
# `atlasboost run --mpi`; statically linked it starts without the dynamic loader, which saves
# every launch about 3 ms of 8 ranks (docs/PERFORMANCE.md). `atlasboost` runs the relay beside
# it when every rank is on its machine, else `atlasboost relay`. Other arguments go to cargo
# (--quiet, --features mpi).
#
# Cargo sets target features per build, not per binary, so this is a build of its own; a later
# `cargo build -p atlasboost-cli` links the relay dynamically again (it works, without the
# saving).
set -euo pipefail
cd "$(dirname "$0")/.."
profile=release
if [[ ${1:-} == --debug ]]; then
    profile=debug
    shift
fi
cargo_profile=$([[ $profile == debug ]] && echo dev || echo release)
cargo rustc --profile "$cargo_profile" -p atlasboost-cli --bin atlasboost-relay "$@" \
    -- -C target-feature=+crt-static
relay=target/$profile/atlasboost-relay
# A dynamically linked executable names its program interpreter (the dynamic loader).
if readelf --program-headers "$relay" | grep -q INTERP; then
    echo "build-static-relay.sh: $relay is not statically linked" >&2
    exit 1
fi
echo "build-static-relay.sh: $relay is statically linked" >&2
