//! What `/proc` says of this host's processes: a process's parent, group, CPU time, memory
//! and start time (with the pid, the start time names a process for good), and which
//! processes there are. The launcher's monitoring and orphan checks, and library mode's search
//! for MPICH's proxy, read them here.

/// What `/proc/<pid>/stat` says of a process that atlasboost needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessStat {
    /// Its name (`comm`, at most 15 bytes).
    pub comm: String,
    /// Its parent.
    pub ppid: u32,
    /// Its process group.
    pub pgrp: i32,
    /// The CPU it used, in clock ticks: its own user and system time, and its reaped
    /// children's (so that a child's end does not take its time away).
    pub cpu_ticks: u64,
    /// When it started, in clock ticks after boot (with the pid, it names the process for
    /// good: a pid is reused, a pid and a start time are not).
    pub start_time: u64,
    /// Its resident memory, in pages.
    pub rss_pages: u64,
}

/// `/proc/<pid>/stat` of process `pid`, if it is there and readable.
pub fn process_stat(pid: u32) -> Option<ProcessStat> {
    use std::io::Read;
    // Room for the whole line up front: /proc says its files are empty, so reading to the
    // end from an empty buffer takes one small read after another.
    let mut stat = String::with_capacity(1024);
    std::fs::File::open(format!("/proc/{pid}/stat"))
        .ok()?
        .read_to_string(&mut stat)
        .ok()?;
    parse_stat(&stat)
}

/// The ids of the processes `/proc` lists now (none when it cannot be read).
pub fn pids() -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
}

/// The name is in parentheses and may hold spaces and parentheses itself: the fields follow
/// the last `)`. After it come the state (field 3), the parent (4), the group (5), ..., the
/// user, system and children's times (14-17), ..., the start time (22), ..., the resident
/// pages (24).
fn parse_stat(stat: &str) -> Option<ProcessStat> {
    let (open, close) = (stat.find('(')?, stat.rfind(')')?);
    let fields: Vec<&str> = stat.get(close + 1..)?.split_whitespace().collect();
    let field = |i: usize| fields.get(i)?.parse::<i64>().ok();
    let cpu_ticks = (11..=14).map(field).sum::<Option<i64>>()?;
    Some(ProcessStat {
        comm: stat.get(open + 1..close)?.to_string(),
        ppid: fields.get(1)?.parse().ok()?,
        pgrp: i32::try_from(field(2)?).ok()?,
        cpu_ticks: u64::try_from(cpu_ticks).unwrap_or(0),
        start_time: fields.get(19)?.parse().ok()?,
        rss_pages: u64::try_from(field(21)?).unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fields_follow_the_last_parenthesis() {
        // comm may hold spaces and parentheses; fields 14-17 are the four CPU times.
        let line = "4242 (a (b) c) S 17 4200 4200 0 -1 4194560 100 0 0 0 7 3 2 1 20 0 1 0 \
                    987654 104857600 2560 18446744073709551615";
        assert_eq!(
            parse_stat(line),
            Some(ProcessStat {
                comm: "a (b) c".into(),
                ppid: 17,
                pgrp: 4200,
                cpu_ticks: 13,
                start_time: 987_654,
                rss_pages: 2560,
            })
        );
        assert_eq!(parse_stat("4242 (x) S"), None);
        let me = process_stat(std::process::id()).unwrap();
        assert_eq!(me.ppid, std::os::unix::process::parent_id());
        assert_eq!(me.pgrp, nix::unistd::getpgrp().as_raw());
        assert!(me.rss_pages > 0, "{me:?}");
        assert!(pids().any(|pid| pid == std::process::id()));
    }
}
