//! A worker's place in the job.

use serde::{Deserialize, Serialize};

/// Where one worker stands: its rank among all workers and among the workers of its host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct World {
    /// The worker's rank (the rank table's `rank_id`), `0..size`.
    pub rank: u32,
    /// How many workers the job has (`RANK_SIZE`).
    pub size: u32,
    /// The worker's index among the workers of its host, `0..local_size`.
    pub local_rank: u32,
    /// How many workers run on its host.
    pub local_size: u32,
    /// The index of its host among the job's hosts (`GROUP_RANK`), `0..node_count`.
    pub node_rank: u32,
    /// How many hosts the job has.
    pub node_count: u32,
}
