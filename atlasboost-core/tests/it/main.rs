//! Integration tests of `atlasboost-core`, in one binary to keep link time down.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fixtures;
