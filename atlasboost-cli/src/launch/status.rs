//! The live status block (SPEC §13): on a terminal, a few lines at the bottom of stderr — the
//! job's ranks, and per host its ranks alive and its NPUs' load, memory, temperature and health
//! — redrawn as samples come, while workers' lines scroll above it. Drawn with `indicatif`'s
//! multi-progress; every write to the console goes through its `suspend` (the output's sinks
//! hold [`StatusBlock::multi`]), which takes the block away, writes, and draws it again below.
//! Never in a pipe or a file.

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::terminal::{EchoOff, QueuedTerm};

/// The block.
#[derive(Debug)]
pub struct StatusBlock {
    multi: MultiProgress,
    rows: Vec<ProgressBar>,
    /// The terminal's echo is off while the block is drawn.
    echo_off: Option<EchoOff>,
}

impl StatusBlock {
    /// An empty block drawn on `terminal` (a terminal writer's queue), else on stderr, at
    /// most 10 times a second.
    pub fn new(terminal: Option<QueuedTerm>) -> StatusBlock {
        let echo_off = terminal.as_ref().and_then(QueuedTerm::echo_off);
        let target = match terminal {
            Some(t) => ProgressDrawTarget::term_like_with_hz(Box::new(t), 10),
            None => ProgressDrawTarget::stderr_with_hz(10),
        };
        StatusBlock {
            multi: MultiProgress::with_draw_target(target),
            rows: Vec::new(),
            echo_off,
        }
    }

    /// The handle writes go through (see the module docs).
    pub fn multi(&self) -> MultiProgress {
        self.multi.clone()
    }

    /// Shows `lines`, one row each.
    pub fn show(&mut self, lines: &[String]) {
        while self.rows.len() < lines.len() {
            let row = self.multi.add(ProgressBar::new_spinner());
            if let Ok(style) = ProgressStyle::with_template("{msg}") {
                row.set_style(style);
            }
            self.rows.push(row);
        }
        while self.rows.len() > lines.len() {
            if let Some(row) = self.rows.pop() {
                row.finish_and_clear();
                self.multi.remove(&row);
            }
        }
        for (row, line) in self.rows.iter().zip(lines) {
            row.set_message(line.clone());
        }
    }

    /// Stops drawing, where the block stands: its terminal took nothing and was given up,
    /// so a clearing now would erase lines instead (the drawing that was queued is dropped).
    pub fn hide(&mut self) {
        self.multi.set_draw_target(ProgressDrawTarget::hidden());
    }

    /// Takes the block away for good (before the summary).
    pub fn clear(&mut self) {
        self.show(&[]);
        let _ = self.multi.clear();
        self.echo_off = None;
    }
}

/// What one host shows in the block.
#[derive(Debug, Clone)]
pub struct HostLine<'a> {
    /// The host.
    pub host: &'a str,
    /// Its ranks still running.
    pub alive: usize,
    /// Its ranks.
    pub ranks: usize,
    /// Its latest sample, if any.
    pub sample: Option<&'a super::monitor::HostSample>,
}

/// The most hosts the block shows one by one.
const MAX_HOSTS: usize = 6;

/// The block's lines: the job, then each host (the first few, then a count of the rest).
/// `slowest` is the rank with the lowest heartbeat step, and that step.
pub fn lines(
    elapsed_secs: u64,
    hosts: &[HostLine<'_>],
    slowest: Option<(u32, i64)>,
) -> Vec<String> {
    let alive: usize = hosts.iter().map(|h| h.alive).sum();
    let ranks: usize = hosts.iter().map(|h| h.ranks).sum();
    let mut head = format!(
        "atlasboost: {alive}/{ranks} ranks running on {} host{}, {}:{:02}",
        hosts.len(),
        if hosts.len() == 1 { "" } else { "s" },
        elapsed_secs / 60,
        elapsed_secs % 60
    );
    if let Some((rank, step)) = slowest {
        head.push_str(&format!("; slowest: rank {rank} at step {step}"));
    }
    let mut out = vec![head];
    for h in hosts.iter().take(MAX_HOSTS) {
        let mut line = format!("  {}: {}/{} ranks", h.host, h.alive, h.ranks);
        if let Some(s) = h.sample {
            // Load, memory and heat of the job's NPUs; those it left out as unusable are
            // sampled for their health, named below.
            let job = s.of_the_job();
            let ai: Vec<u32> = job.iter().filter_map(|d| d.ai_core_percent).collect();
            if !ai.is_empty() {
                let mean = ai.iter().sum::<u32>() as f64 / ai.len() as f64;
                let max = ai.iter().max().copied().unwrap_or(0);
                line.push_str(&format!(", AI core {mean:.0}% (max {max}%)"));
            }
            let used: u64 = job.iter().filter_map(|d| d.hbm_used_mb).sum();
            let total: u64 = job.iter().filter_map(|d| d.hbm_total_mb).sum();
            if total > 0 {
                line.push_str(&format!(
                    ", HBM {:.1}/{:.1} GB",
                    used as f64 / 1024.0,
                    total as f64 / 1024.0
                ));
            }
            if let Some(t) = job.iter().filter_map(|d| d.temperature_c).max() {
                line.push_str(&format!(", {t}°C"));
            }
            let sick: Vec<String> = s
                .devices
                .iter()
                .filter(|d| d.health.is_some_and(|h| !h.is_healthy()))
                .map(|d| format!("NPU {}", d.physical_id))
                .collect();
            if !sick.is_empty() {
                line.push_str(&format!(", unhealthy: {}", sick.join(", ")));
            }
        }
        out.push(line);
    }
    if hosts.len() > MAX_HOSTS {
        out.push(format!("  ... and {} more hosts", hosts.len() - MAX_HOSTS));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch::monitor::HostSample;
    use atlasboost_core::{DeviceSample, Health};

    #[test]
    fn the_block_says_ranks_load_memory_heat_and_trouble() {
        let sample = HostSample {
            host: "10.0.0.1".into(),
            machine_npus: 8,
            devices: vec![
                DeviceSample {
                    ai_core_percent: Some(40),
                    hbm_used_mb: Some(1024),
                    hbm_total_mb: Some(32_768),
                    temperature_c: Some(50),
                    health: Some(Health::Healthy),
                    ..DeviceSample::of(0)
                },
                DeviceSample {
                    ai_core_percent: Some(80),
                    hbm_used_mb: Some(2048),
                    hbm_total_mb: Some(32_768),
                    temperature_c: Some(61),
                    health: Some(Health::Unhealthy { code: 3 }),
                    ..DeviceSample::of(1)
                },
                // Left out of the job as unusable: named, not counted in the load.
                DeviceSample {
                    ai_core_percent: Some(99),
                    hbm_used_mb: Some(30_000),
                    hbm_total_mb: Some(32_768),
                    temperature_c: Some(90),
                    health: Some(Health::Unhealthy { code: 2 }),
                    ..DeviceSample::of(5)
                },
            ],
            left_out: 1,
            workers: Vec::new(),
        };
        let hosts = [
            HostLine {
                host: "10.0.0.1",
                alive: 1,
                ranks: 2,
                sample: Some(&sample),
            },
            HostLine {
                host: "10.0.0.2",
                alive: 2,
                ranks: 2,
                sample: None,
            },
        ];
        let lines = lines(75, &hosts, Some((3, 120)));
        assert_eq!(
            lines,
            [
                "atlasboost: 3/4 ranks running on 2 hosts, 1:15; slowest: rank 3 at step 120",
                "  10.0.0.1: 1/2 ranks, AI core 60% (max 80%), HBM 3.0/64.0 GB, 61°C, unhealthy: NPU 1, NPU 5",
                "  10.0.0.2: 2/2 ranks",
            ]
        );
    }
}
