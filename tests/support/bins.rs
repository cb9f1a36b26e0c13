//! Finding the programs under test: the `atlasboost` binary, the example workers, and mpirun.

use std::io::Write;
use std::path::{Path, PathBuf};

/// The `atlasboost` binary under test: `$ATLASBOOST_BIN`, else the one cargo built next to
/// this test executable (`target/<profile>/atlasboost`). `cargo test --workspace` builds it
/// before running any test, because `atlasboost-cli` has integration tests of its own.
///
/// # Panics
///
/// When there is no binary, with the command that builds it.
pub fn atlasboost_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("ATLASBOOST_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    // target/<profile>/deps/e2e-<hash> -> target/<profile>/atlasboost
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join("atlasboost"))
        .unwrap_or_default();
    assert!(
        bin.is_file(),
        "no atlasboost binary at {}: run `cargo build -p atlasboost-cli` first, or set ATLASBOOST_BIN",
        bin.display()
    );
    bin
}

/// The example worker that calls `init()` (`examples/init_worker.rs`), which `cargo test`
/// builds into `target/<profile>/examples/` (with MPI support: `cargo build -p
/// atlasboost-examples --examples --features mpi`).
///
/// # Panics
///
/// When it has not been built, with the command that builds it.
pub fn init_worker_bin() -> PathBuf {
    let bin = atlasboost_bin()
        .with_file_name("examples")
        .join("init-worker");
    assert!(
        bin.is_file(),
        "no init-worker at {}: run `cargo build -p atlasboost-examples --examples` first",
        bin.display()
    );
    bin
}

/// A file of the repository's `examples/` directory, e.g. `example("train.py")`.
pub fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("examples")
        .join(name)
}

/// Set to `1`, a missing `mpirun` fails the tests that run it instead of skipping them: for CI,
/// which installs Open MPI and must not silently test less.
pub const REQUIRE_MPIRUN: &str = "ATLASBOOST_E2E_REQUIRE_MPIRUN";

/// `mpirun`'s options for this machine: root, and more ranks than its cores.
pub const MPIRUN_OPTIONS: [&str; 2] = ["--allow-run-as-root", "--oversubscribe"];

/// `mpirun` from `PATH`; `None` when it is not installed, after saying so on the real stderr,
/// naming the test (which then returns, having tested nothing).
///
/// # Panics
///
/// When `mpirun` is missing and [`REQUIRE_MPIRUN`] is `1`.
pub fn mpirun_or_skip() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("mpirun"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        skip_unless_required(
            REQUIRE_MPIRUN,
            "mpirun is not on PATH (Debian: openmpi-bin)",
        );
    }
    found
}

/// Says on the real stderr (not the test harness's captured one) that the running test is
/// skipped, and `why`: it then returns, having tested nothing.
///
/// # Panics
///
/// When the variable `require` is `1`: there a skip would hide a broken set-up.
pub fn skip_unless_required(require: &str, why: &str) {
    let test = std::thread::current()
        .name()
        .unwrap_or("a test")
        .to_string();
    assert!(
        std::env::var_os(require).is_none_or(|v| v != "1"),
        "{test}: {why}, and {require}=1"
    );
    let _ = writeln!(std::io::stderr(), "{test}: skipped: {why}");
}

/// Set to `1`, a launcher that can make no cgroup for its workers fails the tests of the
/// workers' cgroup instead of skipping them: for CI, which runs as root on a machine with a
/// cgroup2 file system (`scripts/test.sh` sets it where both hold).
pub const REQUIRE_CGROUP: &str = "ATLASBOOST_E2E_REQUIRE_CGROUP";

/// Whether the launcher can make its workers' cgroup here, from what `atlasboost run -v` says
/// (`note`: its line about the cgroup). When it cannot, says so on the real stderr, naming the
/// test, which then returns having tested nothing.
///
/// # Panics
///
/// When it cannot and [`REQUIRE_CGROUP`] is `1`.
pub fn cgroup_or_skip(note: &str) -> bool {
    if note.contains("no cgroup") {
        skip_unless_required(REQUIRE_CGROUP, note);
        return false;
    }
    true
}
