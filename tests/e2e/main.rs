#![allow(clippy::unwrap_used, clippy::expect_used)]
//! End-to-end tests: the real `atlasboost` binary launching real workers.
//!
//! Each module is one part of the contract of `atlasboost run`: what workers see
//! ([`cluster`]), how a failure ends the job ([`failure`]), signals to the launcher
//! ([`signals`]), that nothing of a job outlives it ([`lifetime`]), the workers' output
//! ([`output`]), bad input ([`errors`]), remote hosts reached over ssh ([`ssh`]), and Slurm
//! as the launch engine ([`slurm`]).

mod cluster;
mod concurrent;
mod errors;
mod failure;
mod library;
mod lifetime;
#[cfg(feature = "mpi")]
mod mpi;
mod mpirun;
mod nic;
mod output;
mod relay;
mod restarts;
mod signals;
mod slurm;
mod ssh;
mod status;

use std::collections::BTreeMap;

/// The events of kind `event` in the `events.jsonl` (`--events events.jsonl`) of a finished run.
pub fn events_of(done: &atlasboost_e2e::Finished, event: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(done.dir().join("events.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["event"] == event)
        .collect()
}

/// The stdout lines of rank `rank` (`[rank]<stdout>:` removed).
pub fn rank_lines(out: &str, rank: u32, stream: &str) -> Vec<String> {
    let tag = format!("[{rank}]<{stream}>:");
    out.lines()
        .filter_map(|l| l.strip_prefix(&tag))
        .map(str::to_string)
        .collect()
}

/// The tagged lines of a stream, by rank (lines without a `[rank]<stream>:` tag are left out).
pub fn lines_by_rank(text: &str, stream: &str) -> BTreeMap<u32, Vec<String>> {
    let mut by_rank: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for l in text.lines() {
        if let Some((rank, rest)) = split_tag(l, stream) {
            by_rank.entry(rank).or_default().push(rest.to_string());
        }
    }
    by_rank
}

/// Asserts that each of `ranks` printed `1` to `count` on stdout (`seq 1 COUNT`), every line
/// whole and in order; `context` goes with the failure.
pub fn assert_seq_by_rank(out: &str, ranks: u32, count: u32, context: &str) {
    let by_rank = lines_by_rank(out, "stdout");
    let want: Vec<String> = (1..=count).map(|i| i.to_string()).collect();
    for rank in 0..ranks {
        assert!(
            by_rank.get(&rank) == Some(&want),
            "rank {rank}: {} of {count} lines, whole and in order\n{context}",
            by_rank.get(&rank).map_or(0, Vec::len),
        );
    }
}

/// `[3]<stdout>:text` -> (3, "text").
pub fn split_tag<'a>(line: &'a str, stream: &str) -> Option<(u32, &'a str)> {
    let rest = line.strip_prefix('[')?;
    let (rank, rest) = rest.split_once(']')?;
    let rest = rest.strip_prefix(&format!("<{stream}>:"))?;
    Some((rank.parse().ok()?, rest))
}
