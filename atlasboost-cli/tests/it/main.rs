//! End-to-end tests of the `atlasboost` binary: each test runs the real executable in its own
//! temporary directory and checks exit codes, files and messages.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cli;
mod snapshots;
