#!/usr/bin/env bash
# The C ABI's tests (bindings/c): the checked-in header is cbindgen's, and a C program built
# with the system C compiler against libatlasboost.so passes its checks under `atlasboost run`,
# alone, and where init() must fail. scripts/test.sh calls this; it can also run alone.
#
# Needs: cargo, and cc and c++ (gcc and g++; $CC and $CXX name others).
set -euo pipefail
cd "$(dirname "$0")/.."

for tool in cargo "${CC:-cc}" "${CXX:-c++}"; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "scripts/test-c.sh: $tool is missing: the C tests need the Rust toolchain and a C and C++ compiler (apt-get install gcc g++)" >&2
        exit 1
    fi
done

printf '\n==> %s\n' "building the atlasboost launcher and the C library"
# The tests run the launcher (target/debug/atlasboost), which `cargo test -p atlasboost-c`
# does not build, and link the library (libatlasboost.so).
cargo build --quiet -p atlasboost-cli -p atlasboost-c

printf '\n==> %s\n' "cargo test -p atlasboost-c"
cargo test -p atlasboost-c
