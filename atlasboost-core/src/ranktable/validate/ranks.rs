//! Rank ids: unique, in 0..N, and in server order where HCCL needs it.

use super::{Loc, Rule, Validator};

impl Validator {
    /// `rank_id`s must be exactly `0..total`, and each server's ranks one block (HCCL's docs: no
    /// interleaving across servers). `complete` is false when some could not be read, in which
    /// case the gap they leave is not reported again; `total_known` is false when a server's
    /// devices could not be counted, and then no rank is out of range. (An unreadable
    /// `rank_id` hides no other: the devices are still counted.)
    pub(super) fn rank_ids(
        &mut self,
        ranks: &[(u32, usize, Loc)],
        total: usize,
        total_known: bool,
        complete: bool,
        list_path: &str,
    ) {
        let before = self.out.len();
        let mut owner: Vec<Option<Loc>> = vec![None; total];
        for &(rank, _, loc) in ranks {
            let r = rank as usize;
            // With a server unreadable, the total is not known: no rank is out of range.
            if r >= total && !total_known {
                continue;
            } else if r >= total {
                self.push(
                    loc.key("rank_id"),
                    Rule::RankIds,
                    format!(
                        "rank_id {rank} is outside 0..{} ({total} devices)",
                        total.saturating_sub(1)
                    ),
                );
            } else if let Some(first) = owner[r] {
                self.push(
                    loc.key("rank_id"),
                    Rule::RankIds,
                    format!("rank_id {rank} is already used at {}", first.key("rank_id")),
                );
            } else {
                owner[r] = Some(loc);
            }
        }
        let missing: Vec<String> = owner
            .iter()
            .enumerate()
            .filter(|(_, o)| o.is_none())
            .map(|(i, _)| i.to_string())
            .collect();
        if complete && !missing.is_empty() {
            self.push(
                list_path.to_string(),
                Rule::RankIds,
                format!(
                    "rank_id{} {} missing; rank_ids must be exactly 0..{}",
                    if missing.len() == 1 { "" } else { "s" },
                    missing.join(", "),
                    total.saturating_sub(1)
                ),
            );
        }
        if !complete || self.out.len() > before {
            return;
        }
        // Every rank is there exactly once: now each server's ranks must be consecutive.
        let mut span: Vec<(u32, u32, u32)> = Vec::new(); // per server: min, max, count
        for &(rank, server, _) in ranks {
            if span.len() <= server {
                span.resize(server + 1, (u32::MAX, 0, 0));
            }
            let s = &mut span[server];
            *s = (s.0.min(rank), s.1.max(rank), s.2 + 1);
        }
        for (server, &(min, max, count)) in span.iter().enumerate() {
            if count > 0 && max - min + 1 != count {
                self.push(
                    format!("$.server_list[{server}].device"),
                    Rule::RankIds,
                    format!(
                        "the server's {count} rank_ids span {min}..{max}; each server's ranks \
                         must be consecutive (HCCL does not interleave servers)"
                    ),
                );
            }
        }
    }
}
