#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls this), on a fresh machine.
#
# What it needs: the Rust toolchain (cargo, rustfmt, clippy) and a C/C++ compiler, which every
# machine of this project has (libzmq is built from source by the zmq crate). The Debian
# packages the tests need are installed below when missing, never by hand.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

for tool in cargo rustfmt cargo-clippy cc c++; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "scripts/test.sh: $tool is missing; install the Rust toolchain (rustup) and gcc" >&2
        exit 1
    fi
done

# Debian packages the tests use: python3 (the example workers), openssh-server and
# openssh-client (remote hosts are reached through a real sshd), iproute2 (the network
# namespaces of tests/netns-cluster.sh). Installed only when missing.
missing=()
command -v python3 >/dev/null 2>&1 || missing+=(python3)
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
command -v ssh >/dev/null 2>&1 || missing+=(openssh-client)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
if [ ${#missing[@]} -gt 0 ]; then
    step "installing ${missing[*]} from Debian's packages"
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
fi

step "format"
cargo fmt --all -- --check

step "clippy (default build, all features, every target)"
cargo clippy --workspace --all-targets -- -D warnings
cargo clippy --workspace --all-targets --all-features -- -D warnings
for crate in atlasboost-core atlasboost-sim atlasboost-dsmi atlasboost-tcp; do
    cargo clippy -p "$crate" --all-targets -- -D warnings
done

step "docs (no broken links, every public item documented)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

step "tests"
# The binaries and the fake driver libraries the tests load (cdylibs) are built first: cargo
# test builds only what test targets link to.
cargo build --workspace --quiet
log=$(mktemp)
trap 'rm -f "$log" "$log.total"' EXIT
# The ssh tests skip, saying why, where sshd is missing; here it was installed, so a skip would
# hide a broken test set-up.
ATLASBOOST_E2E_REQUIRE_SSHD=1 cargo test --workspace 2>&1 | tee "$log"
# One closing line over every test binary, so the total is plain to see.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed/) p += $(i-1); if ($i ~ /^failed/) f += $(i-1); if ($i ~ /^ignored/) s += $(i-1) } }
     END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, s; if (p == 0) exit 1 }' "$log" > "$log.total" ||
    { echo "scripts/test.sh: cargo test ran no test" >&2; exit 1; }
totals=$(cat "$log.total")

step "a 3-server job across network namespaces, over ssh (skips, saying why, where not allowed)"
cargo build --quiet -p atlasboost-cli
bash tests/netns-cluster.sh

step "benchmarks run once each (criterion --test mode), so they cannot rot"
cargo build --release --quiet -p atlasboost-fake-dsmi
cargo bench -p atlasboost-benches -- --test

step "the side-by-side comparison script runs (tiny sizes; no mpirun needed)"
python3 benches/compare.py output --only atlasboost,raw --runs 1 --lines 2000 \
    --atlasboost target/debug/atlasboost >/dev/null
python3 benches/compare.py memory --ranks 16 --seconds 1 --atlasboost target/debug/atlasboost >/dev/null

step "the README's main-job command"
out=$(mktemp)
cargo run --quiet -p atlasboost-cli -- run --sim 8 -H 127.0.0.1:4,127.0.0.2:4 -- \
    python3 examples/train.py >"$out" 2>&1 ||
    { cat "$out"; echo "scripts/test.sh: the main-job command failed" >&2; exit 1; }
grep -q '^\[7\]<stdout>:step 5/5' "$out" && grep -q 'succeeded, 0 failed' "$out" ||
    { cat "$out"; echo "scripts/test.sh: the main job did not finish as it should" >&2; exit 1; }
rm -f "$out" rank_table.json

echo
echo "scripts/test.sh: all checks passed"
echo "$totals"
