//! Helpers for atlasboost's end-to-end tests: find the real `atlasboost` binary and run it.
#![deny(missing_docs)]

use std::path::PathBuf;

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
