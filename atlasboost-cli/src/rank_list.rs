//! `--ranks 0,4-7`: a set of ranks, as the command line gives it and the output filters by it.

use std::collections::BTreeSet;

/// A set of ranks (`--ranks`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankList {
    /// The ranks, in order.
    pub ranks: BTreeSet<u32>,
    /// As typed, for messages.
    pub text: String,
}
