//! Monitoring (SPEC §13): every `--monitor-interval`, each host samples its devices (the
//! probe's [`Telemetry`]) and its workers (CPU and memory from `/proc`); an agent sends its
//! sample up the channel, compact; the launcher keeps the latest of every host, writes it to
//! `--events`, and serves it, with each rank's state, on `--metrics` in Prometheus's text
//! format with MindX `npu-exporter`'s metric names, which existing dashboards key on.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use atlasboost_core::compact::{self, CompactError, Reader};
use atlasboost_core::{Device, DeviceSample, Health, Telemetry};

use crate::error::CliError;

mod http;

/// The shortest `--monitor-interval`.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// What a supervisor samples, and how often.
#[derive(Clone)]
pub struct MonitorPlan {
    /// `--monitor-interval`.
    pub every: Duration,
    /// The hosts this supervisor samples itself (the launcher: its local hosts; an agent: its
    /// own).
    pub hosts: Vec<HostMonitor>,
}

impl std::fmt::Debug for MonitorPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MonitorPlan")
            .field("every", &self.every)
            .field(
                "hosts",
                &self.hosts.iter().map(|h| &h.host).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// One host to sample.
#[derive(Clone)]
pub struct HostMonitor {
    /// The host, as messages name it.
    pub host: String,
    /// The devices its workers use, as its probe found them, then its unusable ones that the
    /// job left out (see [`HostMonitor::new`]).
    pub devices: Vec<Device>,
    /// How many devices its probe found (`--devices` applied): npu-exporter's
    /// `machine_npu_nums`.
    pub machine_npus: u32,
    /// How many of `devices`, at their end, are outside the job (left out as unusable).
    pub left_out: u32,
    /// Where their telemetry comes from.
    pub telemetry: Arc<dyn Telemetry>,
}

impl HostMonitor {
    /// Host `host`, whose probe found `devices`, its workers on those `used` says (by logical
    /// id). It samples those, then the ones the job left out because they are unusable, so that
    /// a dead NPU's health stays in sight (an alert on it does not end because a restart
    /// planned around it).
    pub fn new(
        host: String,
        devices: &[Device],
        used: impl Fn(u32) -> bool,
        telemetry: Arc<dyn Telemetry>,
    ) -> HostMonitor {
        let (mut sampled, outside): (Vec<Device>, Vec<Device>) = devices
            .iter()
            .filter(|d| used(d.logical_id) || !d.health.is_healthy())
            .cloned()
            .partition(|d| used(d.logical_id));
        let left_out = outside.len() as u32;
        sampled.extend(outside);
        HostMonitor {
            host,
            devices: sampled,
            machine_npus: devices.len() as u32,
            left_out,
            telemetry,
        }
    }
}

impl std::fmt::Debug for HostMonitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostMonitor")
            .field("host", &self.host)
            .field("devices", &self.devices.len())
            .finish()
    }
}

/// One worker's use of its host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerStat {
    /// Its rank.
    pub rank: u32,
    /// CPU used since the last sample, in tenths of a percent of one core.
    pub cpu_permille: u32,
    /// Resident memory, KiB.
    pub rss_kib: u64,
}

impl HostSample {
    /// Its job devices' samples.
    pub fn of_the_job(&self) -> &[DeviceSample] {
        let job = self.devices.len().saturating_sub(self.left_out as usize);
        &self.devices[..job]
    }

    /// The samples of its devices outside the job.
    pub fn outside_job(&self) -> &[DeviceSample] {
        &self.devices[self.of_the_job().len()..]
    }
}

/// One sample of one host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSample {
    /// The host.
    pub host: String,
    /// How many devices its probe found.
    pub machine_npus: u32,
    /// Its job devices, then its unusable ones that the job left out.
    pub devices: Vec<DeviceSample>,
    /// How many of `devices`, at their end, are outside the job.
    pub left_out: u32,
    /// Its workers that run.
    pub workers: Vec<WorkerStat>,
}

fn opt(w: &mut compact::Writer, v: Option<u64>) {
    // 0 is absent, n + 1 is n.
    w.varint(v.map_or(0, |v| v.saturating_add(1)));
}

fn get_opt(r: &mut Reader<'_>, what: &str) -> Result<Option<u64>, CompactError> {
    Ok(r.varint(what)?.checked_sub(1))
}

/// The compact form of a sample, as an agent sends it up (about a dozen bytes a device).
pub fn encode(sample: &HostSample) -> Vec<u8> {
    let mut w = compact::Writer::default();
    w.str(&sample.host);
    w.varint(u64::from(sample.machine_npus));
    w.varint(u64::from(sample.left_out));
    w.varint(sample.devices.len() as u64);
    for d in &sample.devices {
        w.varint(u64::from(d.physical_id));
        opt(&mut w, d.ai_core_percent.map(u64::from));
        opt(&mut w, d.hbm_used_mb);
        opt(&mut w, d.hbm_total_mb);
        // Temperatures below zero do not occur on a running NPU; they read as absent.
        opt(&mut w, d.temperature_c.and_then(|t| u64::try_from(t).ok()));
        opt(&mut w, d.power_decwatts.map(u64::from));
        opt(&mut w, d.health.map(Health::to_wire));
        match &d.error_codes {
            None => w.varint(0),
            Some(codes) => {
                w.varint(codes.len() as u64 + 1);
                for c in codes {
                    w.varint(u64::from(*c));
                }
            }
        }
        w.varint(d.failures.len() as u64);
        for f in &d.failures {
            w.str(f);
        }
    }
    w.varint(sample.workers.len() as u64);
    for s in &sample.workers {
        w.varint(u64::from(s.rank));
        w.varint(u64::from(s.cpu_permille));
        w.varint(s.rss_kib);
    }
    w.buf
}

/// Reads what [`encode`] wrote.
///
/// # Errors
///
/// What is malformed, and where.
pub fn decode(bytes: &[u8]) -> Result<HostSample, CompactError> {
    let mut r = Reader::new(bytes);
    let host = r.str("the host")?;
    let machine_npus = r.u32("the host's device count")?;
    let left_out = r.u32("the count of devices left out")?;
    let n = r.varint("the device count")?;
    let mut devices = Vec::with_capacity(n.min(r.left() as u64) as usize);
    let small = |v: Option<u64>, what: &str| -> Result<Option<u32>, CompactError> {
        v.map(|v| u32::try_from(v).map_err(|_| CompactError(format!("{what} {v} is too large"))))
            .transpose()
    };
    for _ in 0..n {
        let physical_id = r.u32("a device id")?;
        let ai = get_opt(&mut r, "the AI core")?;
        let hbm_used_mb = get_opt(&mut r, "the HBM used")?;
        let hbm_total_mb = get_opt(&mut r, "the HBM total")?;
        let temperature = get_opt(&mut r, "the temperature")?;
        let power = get_opt(&mut r, "the power")?;
        let health = get_opt(&mut r, "the health")?;
        let codes = match r.varint("the error count")? {
            0 => None,
            k => {
                let k = k - 1;
                let mut codes = Vec::with_capacity(k.min(r.left() as u64) as usize);
                for _ in 0..k {
                    codes.push(r.u32("an error code")?);
                }
                Some(codes)
            }
        };
        let k = r.varint("the failure count")?;
        let mut failures = Vec::with_capacity(k.min(r.left() as u64) as usize);
        for _ in 0..k {
            failures.push(r.str("a failed call")?);
        }
        devices.push(DeviceSample {
            physical_id,
            ai_core_percent: small(ai, "the AI core")?,
            hbm_used_mb,
            hbm_total_mb,
            temperature_c: small(temperature, "the temperature")?
                .and_then(|t| i32::try_from(t).ok()),
            power_decwatts: small(power, "the power")?,
            health: health
                .map(|h| Health::from_wire(h).ok_or(CompactError(format!("the health {h:#x}"))))
                .transpose()?,
            error_codes: codes,
            failures,
        });
    }
    let n = r.varint("the worker count")?;
    let mut workers = Vec::with_capacity(n.min(r.left() as u64) as usize);
    for _ in 0..n {
        workers.push(WorkerStat {
            rank: r.u32("a rank")?,
            cpu_permille: r.u32("a CPU use")?,
            rss_kib: r.varint("a resident size")?,
        });
    }
    r.finish("the sample")?;
    if left_out as usize > devices.len() {
        return Err(CompactError(format!(
            "{left_out} devices left out of {}",
            devices.len()
        )));
    }
    Ok(HostSample {
        host,
        machine_npus,
        devices,
        left_out,
        workers,
    })
}

/// Reads workers' CPU time and resident memory from `/proc`, remembering each one's CPU time
/// at the last read, so that a sample says what it used since. A worker is its whole process
/// group (it has one of its own): a shell that runs `python3 train.py` is counted with it.
#[derive(Debug, Default)]
pub struct CpuClock {
    last: HashMap<i32, (u64, Instant)>,
}

/// What the processes of one group use: CPU ticks (their own, and their reaped children's, so
/// that a child's end does not take its time away) and resident pages.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct GroupUse {
    ticks: u64,
    rss_pages: u64,
}

/// The use of each process group among `groups`, from one pass over `/proc`.
fn groups_use(groups: &[i32]) -> HashMap<i32, GroupUse> {
    let mut by_group: HashMap<i32, GroupUse> = HashMap::new();
    for stat in atlasboost::process::pids().filter_map(atlasboost::process::process_stat) {
        if groups.contains(&stat.pgrp) {
            let sum = by_group.entry(stat.pgrp).or_default();
            sum.ticks += stat.cpu_ticks;
            sum.rss_pages += stat.rss_pages;
        }
    }
    by_group
}

/// The children of `pid`, of every thread of it (a child started from a thread is that
/// thread's); `None` when the kernel cannot say (`/proc/<pid>/task/<tid>/children` needs
/// CONFIG_PROC_CHILDREN: the main thread's is missing too) or `pid` is gone. A thread that
/// ends while it is read is skipped: its children went to another thread.
fn children(pid: i32) -> Option<Vec<i32>> {
    let mut all = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let main = task.file_name().to_str() == Some(pid.to_string().as_str());
        match std::fs::read_to_string(task.path().join("children")) {
            Ok(list) => all.extend(
                list.split_ascii_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            ),
            Err(_) if !main => {}
            Err(_) => return None,
        }
    }
    Some(all)
}

/// Whether some of the worker groups `groups` (each named by its leader) may hold more than
/// their leader: a leader with children, or a process of such a group that its parent left to
/// this process (a subreaper adopts what a worker's child leaves behind). `true` when the
/// kernel cannot say.
fn groups_may_have_more(groups: &[i32]) -> bool {
    if groups
        .iter()
        .any(|&pid| children(pid).is_none_or(|c| !c.is_empty()))
    {
        return true;
    }
    let Some(adopted) = children(std::process::id() as i32) else {
        return true;
    };
    adopted
        .into_iter()
        .filter(|pid| !groups.contains(pid))
        .filter_map(|pid| atlasboost::process::process_stat(u32::try_from(pid).ok()?))
        .any(|stat| groups.contains(&stat.pgrp))
}

/// The use of each group leader among `groups` alone.
fn leaders_use(groups: &[i32]) -> HashMap<i32, GroupUse> {
    groups
        .iter()
        .filter_map(|&pid| {
            let stat = atlasboost::process::process_stat(u32::try_from(pid).ok()?)?;
            Some((
                pid,
                GroupUse {
                    ticks: stat.cpu_ticks,
                    rss_pages: stat.rss_pages,
                },
            ))
        })
        .collect()
}

impl CpuClock {
    /// The use of each worker `(rank, pid)` that still runs (its process group's, whose id
    /// is its pid).
    pub fn stats(&mut self, workers: &[(u32, i32)]) -> Vec<WorkerStat> {
        if workers.is_empty() {
            return Vec::new();
        }
        let groups: Vec<i32> = workers.iter().map(|&(_, pid)| pid).collect();
        // A pass over every process of the host only when some worker has children (a shell
        // running the real work, a data loader's processes): else, as on the first sample when
        // the workers start, each group is its leader alone.
        let by_group = match !self.last.is_empty() && groups_may_have_more(&groups) {
            true => groups_use(&groups),
            false => leaders_use(&groups),
        };
        let now = Instant::now();
        let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .map_or(100, |v| v.max(1) as u64);
        let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .map_or(4096, |v| v.max(1) as u64);
        workers
            .iter()
            .filter_map(|&(rank, pid)| {
                let used = by_group.get(&pid)?;
                let cpu_permille = match self.last.insert(pid, (used.ticks, now)) {
                    Some((before, at)) => {
                        let wall = now.saturating_duration_since(at).as_secs_f64();
                        let cpu = used.ticks.saturating_sub(before) as f64 / hz as f64;
                        if wall > 0.0 {
                            (cpu / wall * 1000.0).round() as u32
                        } else {
                            0
                        }
                    }
                    None => 0,
                };
                Some(WorkerStat {
                    rank,
                    cpu_permille,
                    rss_kib: used.rss_pages * page / 1024,
                })
            })
            .collect()
    }
}

/// Samples `host`: its devices' telemetry, and `workers` (rank, pid) of it that run.
pub fn sample_host(
    host: &HostMonitor,
    devices: Vec<DeviceSample>,
    workers: &[(u32, i32)],
    cpu: &mut CpuClock,
) -> HostSample {
    HostSample {
        host: host.host.clone(),
        machine_npus: host.machine_npus,
        devices,
        left_out: host.left_out,
        workers: cpu.stats(workers),
    }
}

/// How long a sample waits for the devices' telemetry before it goes without it (the last
/// values, or none): the supervisor's loop, which carries the output, reaps the workers and
/// hears signals, is held no longer than this by a slow driver.
pub const TELEMETRY_WAIT: Duration = Duration::from_millis(100);

/// The device telemetry of a supervisor's hosts (the launcher's local hosts, an agent's own),
/// read on one thread of its own: a driver call that hangs (a wedged NPU) or is slow holds up
/// only the devices' values, which are then absent (or the last ones read, while they are not
/// older than twice the interval), never the workers' output, their reaping or the signals.
/// One thread for all of them: they are all this machine, with one driver (several only with
/// simulated devices, up to thousands of them).
#[derive(Debug)]
pub struct DeviceSampler {
    /// The hosts, as messages name them.
    hosts: Vec<String>,
    ask: std::sync::mpsc::SyncSender<()>,
    answers: std::sync::mpsc::Receiver<Vec<Vec<DeviceSample>>>,
    /// When the reading under way was asked for (`None`: none is under way).
    asked: Option<Instant>,
    /// The last values read (each host's), and when they were asked for.
    last: Option<(Instant, Vec<Vec<DeviceSample>>)>,
    /// The stuck reading was said (once per stuck reading).
    said: bool,
}

impl DeviceSampler {
    /// Starts the reading thread of `hosts`' devices.
    ///
    /// # Errors
    ///
    /// The thread cannot start.
    pub fn start(hosts: &[HostMonitor]) -> std::io::Result<DeviceSampler> {
        let (ask, asked) = std::sync::mpsc::sync_channel::<()>(1);
        let (answer, answers) = std::sync::mpsc::channel();
        let sources: Vec<(Arc<dyn Telemetry>, Vec<Device>)> = hosts
            .iter()
            .map(|h| (Arc::clone(&h.telemetry), h.devices.clone()))
            .collect();
        std::thread::Builder::new()
            .name("ab-telemetry".into())
            .spawn(move || {
                // Ends when the sampler is dropped (or, stuck in a driver call, with the
                // process).
                while asked.recv().is_ok() {
                    let values = sources
                        .iter()
                        .map(|(telemetry, devices)| telemetry.sample(devices))
                        .collect();
                    if answer.send(values).is_err() {
                        return;
                    }
                }
            })?;
        Ok(DeviceSampler {
            hosts: hosts.iter().map(|h| h.host.clone()).collect(),
            ask,
            answers,
            asked: None,
            last: None,
            said: false,
        })
    }

    /// Each host's device telemetry now (`hosts` as given to [`DeviceSampler::start`]): read
    /// at most [`TELEMETRY_WAIT`]; else the last values if they are recent (within
    /// `stale_after`), else each device absent. The second value: a warning to say, once,
    /// when a reading has not come back for `stale_after`.
    pub fn sample(
        &mut self,
        hosts: &[HostMonitor],
        stale_after: Duration,
    ) -> (Vec<Vec<DeviceSample>>, Option<String>) {
        let now = Instant::now();
        if self.asked.is_none() {
            match self.ask.try_send(()) {
                Ok(()) => self.asked = Some(now),
                // The thread is gone: said below, once.
                Err(std::sync::mpsc::TrySendError::Disconnected(())) => self.asked = Some(now),
                Err(std::sync::mpsc::TrySendError::Full(())) => {}
            }
        }
        let mut warning = None;
        if let Some(asked) = self.asked {
            // A reading asked for just now is waited for a little; one asked for earlier (and
            // still not back) is only looked at.
            let wait = match asked == now {
                true => TELEMETRY_WAIT,
                false => Duration::ZERO,
            };
            match self.answers.recv_timeout(wait) {
                Ok(values) => {
                    // Stamped when it came: a reading that was late is still fresh now.
                    self.last = Some((Instant::now(), values));
                    self.asked = None;
                    self.said = false;
                    // A reading slower than the wait came back between two samples: the next
                    // one is asked for now, so that each sample has a reading of its own (else
                    // a slow driver is read every other interval), and waited for as a reading
                    // asked at a sample is: a driver fast again is read fresh again.
                    if asked != now && self.ask.try_send(()).is_ok() {
                        self.asked = Some(now);
                        if let Ok(fresh) = self.answers.recv_timeout(TELEMETRY_WAIT) {
                            self.last = Some((Instant::now(), fresh));
                            self.asked = None;
                        }
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) if !self.said => {
                    self.said = true;
                    warning = Some(
                        "atlasboost: warning: the thread reading the devices' telemetry has \
                         ended (a bug: please report it); their values are left out from now on"
                            .to_string(),
                    );
                }
                Err(_) => {
                    let late = now.saturating_duration_since(asked);
                    if late >= stale_after && !self.said {
                        self.said = true;
                        warning = Some(format!(
                            "atlasboost: warning: the device telemetry of {} has not come back \
                             for {:.0?} (a driver call hangs?); the devices' values are left \
                             out until it does",
                            match self.hosts.as_slice() {
                                [one] => format!("host {one}"),
                                many => format!("{} hosts", many.len()),
                            },
                            Duration::from_secs(late.as_secs()),
                        ));
                    }
                }
            }
        }
        let values = match &self.last {
            Some((at, values))
                if now.saturating_duration_since(*at) < stale_after
                    && values.len() == hosts.len() =>
            {
                values.clone()
            }
            _ => hosts
                .iter()
                .map(|h| DeviceSample::none_of(&h.devices))
                .collect(),
        };
        (values, warning)
    }
}

/// The warning that names the driver calls of `samples` (each host's, `hosts` in order) that
/// failed and were not said before (`said`: `(host, failure)`, kept across samples), with the
/// NPUs each failed for; `None` when there is nothing new. A call that keeps failing is said
/// once: its metrics are absent meanwhile, and a failing health shows as unreadable.
pub fn failures_to_say(
    hosts: &[HostMonitor],
    samples: &[Vec<DeviceSample>],
    said: &mut HashSet<(String, String)>,
) -> Option<String> {
    // Each new (host, failure), with the NPUs it failed for.
    let mut new: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for (host, devices) in hosts.iter().zip(samples) {
        for d in devices {
            for failure in &d.failures {
                let key = (host.host.clone(), failure.clone());
                if !said.contains(&key) {
                    new.entry(key).or_default().push(d.physical_id.to_string());
                }
            }
        }
    }
    if new.is_empty() {
        return None;
    }
    let named: Vec<String> = new
        .into_iter()
        .map(|((host, failure), npus)| {
            let which = match npus.as_slice() {
                [one] => format!("npu {one}"),
                many => format!("npus {}", many.join(",")),
            };
            let text = format!("host {host} {which}: {failure}");
            said.insert((host, failure));
            text
        })
        .collect();
    Some(format!(
        "atlasboost: warning: device telemetry: {}; what a failing call reads is left out (a \
         failing health reads as unreadable) while it fails, said once",
        named.join("; ")
    ))
}

/// The events-file form of a sample.
pub fn sample_json(sample: &HostSample) -> serde_json::Value {
    serde_json::json!({
        "host": sample.host,
        "machine_npus": sample.machine_npus,
        "devices": sample.devices,
        "left_out": sample.outside_job().iter().map(|d| d.physical_id).collect::<Vec<_>>(),
        "workers": sample.workers.iter().map(|w| serde_json::json!({
            "rank": w.rank,
            "cpu_percent": f64::from(w.cpu_permille) / 10.0,
            "rss_mib": w.rss_kib / 1024,
        })).collect::<Vec<_>>(),
    })
}

/// A rank as `--metrics` shows it.
#[derive(Debug, Clone)]
pub struct RankState {
    /// Its rank.
    pub rank: u32,
    /// Its host.
    pub host: String,
    /// Its device (logical id on its host).
    pub device: u32,
    /// Its device's physical id, when known.
    pub physical: Option<u32>,
    /// Whether it runs.
    pub up: bool,
    /// Lines it printed.
    pub lines: u64,
    /// Seconds since its last line (since its start if none).
    pub silent_seconds: f64,
}

/// The Prometheus text of the job's state: npu-exporter's metrics per device (labels `id`,
/// `model_name`, `host`, `rank`, `job`), and atlasboost's own per rank and job.
pub fn render(
    job: &str,
    attempt: u32,
    samples: &BTreeMap<String, HostSample>,
    chips: &HashMap<(String, u32), String>,
    ranks: &[RankState],
) -> String {
    let mut out = String::new();
    let rank_of: HashMap<(&str, u32), u32> = ranks
        .iter()
        .filter_map(|r| r.physical.map(|p| ((r.host.as_str(), p), r.rank)))
        .collect();
    let mut host_chip: HashMap<&str, &String> = HashMap::new();
    for ((host, _), chip) in chips {
        host_chip.entry(host.as_str()).or_insert(chip);
    }

    type Get = fn(&DeviceSample) -> Option<f64>;
    let npu: [(&str, &str, Get); 7] = [
        (
            "npu_chip_info_utilization",
            "AI core utilisation, percent.",
            |d| d.ai_core_percent.map(f64::from),
        ),
        ("npu_chip_info_hbm_used_memory", "HBM in use, MB.", |d| {
            d.hbm_used_mb.map(|v| v as f64)
        }),
        ("npu_chip_info_hbm_total_memory", "HBM in all, MB.", |d| {
            d.hbm_total_mb.map(|v| v as f64)
        }),
        (
            "npu_chip_info_temperature",
            "Chip temperature, degrees Celsius.",
            |d| d.temperature_c.map(f64::from),
        ),
        ("npu_chip_info_power", "Power draw, watts.", |d| {
            d.power_watts()
        }),
        ("npu_chip_info_health_status", "1 healthy, 0 not.", |d| {
            d.health.map(|h| if h.is_healthy() { 1.0 } else { 0.0 })
        }),
        (
            "npu_chip_info_error_code",
            "The first current error code, 0 for none.",
            |d| {
                d.error_codes
                    .as_ref()
                    .map(|c| c.first().map_or(0.0, |&c| f64::from(c)))
            },
        ),
    ];
    for (name, help, get) in npu {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (host, sample) in samples {
            for d in &sample.devices {
                let Some(v) = get(d) else { continue };
                // A device outside the job (a dead one left out) has its host's chip.
                let model = chips
                    .get(&(host.clone(), d.physical_id))
                    .or_else(|| host_chip.get(host.as_str()).copied())
                    .map_or_else(|| "Ascend".to_string(), |c| format!("Ascend{c}"));
                let rank = rank_of
                    .get(&(host.as_str(), d.physical_id))
                    .map_or_else(String::new, |r| format!(",rank=\"{r}\""));
                let _ = writeln!(
                    out,
                    "{name}{{id=\"{}\",model_name=\"{}\",host=\"{}\"{rank},job=\"{}\"}} {v}",
                    d.physical_id,
                    esc(&model),
                    esc(host),
                    esc(job)
                );
            }
        }
    }
    let _ = writeln!(
        out,
        "# HELP machine_npu_nums NPUs on the host, as its probe found them.\n# TYPE machine_npu_nums gauge"
    );
    for (host, sample) in samples {
        let _ = writeln!(
            out,
            "machine_npu_nums{{host=\"{}\",job=\"{}\"}} {}",
            esc(host),
            esc(job),
            sample.machine_npus
        );
    }
    out.push_str(&attempt_text(job, attempt));
    type PerRank = (
        &'static str,
        &'static str,
        &'static str,
        fn(&RankState) -> f64,
    );
    // A metric of each rank's worker: its name, help, and value.
    type PerWorker = (&'static str, &'static str, fn(&WorkerStat) -> f64);
    let per_rank: [PerRank; 3] = [
        (
            "atlasboost_rank_up",
            "1 while the rank's worker runs.",
            "gauge",
            |r| {
                if r.up { 1.0 } else { 0.0 }
            },
        ),
        (
            "atlasboost_rank_last_output_seconds",
            "Seconds since the rank's last output line (refreshed every second).",
            "gauge",
            |r| r.silent_seconds,
        ),
        (
            "atlasboost_rank_output_lines_total",
            "Lines the rank printed.",
            "counter",
            |r| r.lines as f64,
        ),
    ];
    for (name, help, kind, get) in per_rank {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for r in ranks {
            let _ = writeln!(
                out,
                "{name}{{rank=\"{}\",host=\"{}\",device=\"{}\",job=\"{}\"}} {}",
                r.rank,
                esc(&r.host),
                r.device,
                esc(job),
                get(r)
            );
        }
    }
    let workers: Vec<&WorkerStat> = samples.values().flat_map(|s| &s.workers).collect();
    let place_of: HashMap<u32, (&str, u32)> = ranks
        .iter()
        .map(|r| (r.rank, (r.host.as_str(), r.device)))
        .collect();
    // The workers' own use, from their hosts' samples.
    let per_worker: [PerWorker; 2] = [
        (
            "atlasboost_rank_cpu_percent",
            "CPU the rank's worker used, percent of one core.",
            |w| f64::from(w.cpu_permille) / 10.0,
        ),
        (
            "atlasboost_rank_resident_bytes",
            "Resident memory of the rank's worker.",
            |w| (w.rss_kib * 1024) as f64,
        ),
    ];
    for (name, help, get) in per_worker {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for w in &workers {
            // A sample of a rank no longer in the job (a restart shrank it) names no place.
            let Some(&(host, device)) = place_of.get(&w.rank) else {
                continue;
            };
            let _ = writeln!(
                out,
                "{name}{{rank=\"{}\",host=\"{}\",device=\"{device}\",job=\"{}\"}} {}",
                w.rank,
                esc(host),
                esc(job),
                get(w)
            );
        }
    }
    out
}

/// A label value, escaped for Prometheus's text format.
fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The `atlasboost_attempt` metric of `job`: the attempt under way.
fn attempt_text(job: &str, attempt: u32) -> String {
    format!(
        "# HELP atlasboost_attempt The attempt under way, 0 for the first start.\n\
         # TYPE atlasboost_attempt gauge\natlasboost_attempt{{job=\"{}\"}} {attempt}\n",
        esc(job)
    )
}

/// `--metrics ADDR:PORT`: a small HTTP server (module `http`, threads of its own) that answers
/// `GET /metrics` with the latest text [`Metrics::publish`] gave it (before the first sample,
/// the job's attempt alone: a target that answers nothing would look like a host without
/// NPUs), and anything else with 404 or 405.
pub struct Metrics {
    text: Arc<Mutex<String>>,
    server: http::Server,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("address", &self.server.address())
            .finish()
    }
}

impl Metrics {
    /// Listens on `address` and serves the metrics of job `job`; stops when dropped.
    ///
    /// # Errors
    ///
    /// [`CliError::Usage`] naming the address when it cannot be bound.
    pub fn serve(address: SocketAddr, job: &str) -> Result<Metrics, CliError> {
        let text = Arc::new(Mutex::new(attempt_text(job, 0)));
        let server = http::Server::serve(address, Arc::clone(&text)).map_err(|e| {
            CliError::Usage(format!("--metrics {address}: cannot listen there: {e}"))
        })?;
        Ok(Metrics { text, server })
    }

    /// Where it listens (the port the kernel chose for port 0).
    pub fn address(&self) -> SocketAddr {
        self.server.address()
    }

    /// What the next requests are answered.
    pub fn publish(&self, text: String) {
        *self.text.lock().unwrap_or_else(|p| p.into_inner()) = text;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One HTTP request to `address`: the status line and headers, and the body.
    fn ask(address: SocketAddr, request: &str) -> (String, String) {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(address).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        s.write_all(format!("{request}\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
            .unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
        (head.to_string(), body.to_string())
    }

    /// Before the first sample the job's attempt is served (not an empty page); only
    /// `GET /metrics` (and `HEAD`) is answered with the metrics.
    #[test]
    fn metrics_are_served_at_their_path_only_and_from_the_start() {
        let m = Metrics::serve("127.0.0.1:0".parse().unwrap(), "ab-7").unwrap();
        let (status, body) = ask(m.address(), "GET /metrics HTTP/1.1");
        assert!(status.contains(" 200 "), "{status}");
        assert!(
            body.contains("atlasboost_attempt{job=\"ab-7\"} 0\n"),
            "{body}"
        );
        let (status, _) = ask(m.address(), "GET /metrics?x=1 HTTP/1.1");
        assert!(status.contains(" 200 "), "{status}");
        let (status, body) = ask(m.address(), "GET / HTTP/1.1");
        assert!(status.contains(" 404 "), "{status}");
        assert!(body.contains("GET /metrics"), "{body}");
        let (status, _) = ask(m.address(), "POST /metrics HTTP/1.1\r\nContent-Length: 0");
        assert!(status.contains(" 405 "), "{status}");
        assert!(status.contains("\r\nAllow: GET, HEAD"), "{status}");
        m.publish("x 1\n".into());
        assert_eq!(ask(m.address(), "GET /metrics HTTP/1.1").1, "x 1\n");
    }

    /// A worker that is a shell running the real work: the sample counts the whole group, not
    /// the shell's own 1 MiB and 0 % (a child holding 64 MiB and spinning).
    #[test]
    fn a_workers_use_is_its_whole_process_group() {
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("sh")
            .args([
                "-c",
                "python3 -c 'import time; b = bytearray(64 << 20); t = time.time() + 30\n\
                 while time.time() < t: pass'; true",
            ])
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let mut clock = CpuClock::default();
        let mut last = Vec::new();
        // Until the child holds its memory and has run a while (at most 10 s).
        for _ in 0..50 {
            std::thread::sleep(Duration::from_millis(200));
            last = clock.stats(&[(5, pid)]);
            if last
                .first()
                .is_some_and(|w| w.rss_kib > 64 << 10 && w.cpu_permille > 0)
            {
                break;
            }
        }
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = child.wait();
        let w = last.first().expect("the worker was seen");
        assert_eq!(w.rank, 5);
        assert!(w.rss_kib > 64 << 10, "{w:?}");
        assert!(w.cpu_permille > 0, "{w:?}");
    }

    /// A child started from another thread is that thread's child (the main thread's list
    /// does not show it); a process of a worker's group that is not the leader's child (its
    /// parent gone, adopted here) makes the group more than its leader too.
    #[test]
    fn a_groups_other_processes_are_found_whoever_their_parent_is() {
        use std::os::unix::process::CommandExt;

        let spawn = |group: i32| {
            std::process::Command::new("sleep")
                .arg("30")
                .process_group(group)
                .spawn()
                .unwrap()
        };
        let mut leader = spawn(0);
        let pid = leader.id() as i32;
        // A leader alone (sleep has no child; this test's other children are in groups of
        // their own).
        assert!(!groups_may_have_more(&[pid]));
        // Started by another thread, which stays until it is looked for.
        let (started, wait) = std::sync::mpsc::channel();
        let (done, end) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let child = spawn(0);
            started.send(child.id() as i32).unwrap();
            let _ = end.recv();
            child
        });
        let from_thread = wait.recv().unwrap();
        let mine = children(std::process::id() as i32).unwrap();
        assert!(mine.contains(&from_thread), "{from_thread} in {mine:?}");
        assert!(mine.contains(&pid), "{pid} in {mine:?}");
        done.send(()).unwrap();
        let mut other = thread.join().unwrap();
        // In the leader's group, a child of this process: as a worker's child adopted here.
        let mut adopted = spawn(pid);
        assert!(groups_may_have_more(&[pid]));
        for c in [&mut leader, &mut other, &mut adopted] {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// A driver call that fails is said once per host and failure, with the NPUs it failed
    /// for; the next sample with the same failure says nothing, a new one is said.
    #[test]
    fn failing_driver_calls_are_said_once_with_their_npus() {
        let host = |name: &str| HostMonitor {
            host: name.into(),
            devices: Vec::new(),
            machine_npus: 8,
            left_out: 0,
            telemetry: Arc::new(atlasboost::probe::NoTelemetry),
        };
        let hosts = [host("10.0.0.1"), host("10.0.0.2")];
        let failing = |p: u32, f: &str| DeviceSample::failed(p, vec![f.to_string()]);
        let busy = "dsmi_get_device_health(device 2) returned 13";
        let gone = "cannot load the driver";
        let samples = vec![
            vec![failing(2, busy), DeviceSample::of(3)],
            vec![failing(0, gone), failing(1, gone)],
        ];
        let mut said = HashSet::new();
        let w = failures_to_say(&hosts, &samples, &mut said).unwrap();
        assert!(w.contains(&format!("host 10.0.0.1 npu 2: {busy}")), "{w}");
        assert!(
            w.contains(&format!("host 10.0.0.2 npus 0,1: {gone}")),
            "{w}"
        );
        assert_eq!(failures_to_say(&hosts, &samples, &mut said), None);
        let later = vec![
            vec![failing(3, "dsmi_get_hbm_info(device 3) returned 8")],
            vec![],
        ];
        let w = failures_to_say(&hosts, &later, &mut said).unwrap();
        assert!(w.contains("host 10.0.0.1 npu 3: dsmi_get_hbm_info"), "{w}");
        assert!(!w.contains(busy), "{w}");
    }

    /// Telemetry whose every reading takes `0`, and says which reading it is.
    struct Slow(Duration, std::sync::atomic::AtomicU32);

    impl Telemetry for Slow {
        fn sample(&self, devices: &[Device]) -> Vec<DeviceSample> {
            std::thread::sleep(self.0);
            let n = self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            devices
                .iter()
                .map(|d| DeviceSample {
                    ai_core_percent: Some(n),
                    ..DeviceSample::of(d.physical_id)
                })
                .collect()
        }
    }

    /// One host `h` of one device, read from `telemetry`.
    fn one_device_host(telemetry: Arc<dyn Telemetry>) -> [HostMonitor; 1] {
        [HostMonitor {
            host: "h".into(),
            devices: vec![Device {
                server_id: "h".into(),
                logical_id: 0,
                physical_id: 0,
                ip: None,
                chip: "910".into(),
                health: Health::Healthy,
                super_device_id: None,
                super_pod_id: None,
            }],
            machine_npus: 1,
            left_out: 0,
            telemetry,
        }]
    }

    /// A driver slower than the sampler's wait is still read once per interval: each sample
    /// after the first gets a reading it has not shown before (else every other one repeats).
    #[test]
    fn a_slow_driver_is_read_every_interval_not_every_other() {
        let hosts = one_device_host(Arc::new(Slow(
            TELEMETRY_WAIT * 3,
            std::sync::atomic::AtomicU32::new(0),
        )));
        let mut sampler = DeviceSampler::start(&hosts).unwrap();
        let interval = TELEMETRY_WAIT * 6;
        let mut seen = Vec::new();
        for _ in 0..6 {
            let (values, _) = sampler.sample(&hosts, interval * 10);
            seen.push(values[0][0].ai_core_percent);
            std::thread::sleep(interval);
        }
        // The first sample may come before the first reading; from the second on, each is new.
        let readings: Vec<u32> = seen[1..].iter().map(|r| r.expect("a reading")).collect();
        let mut distinct = readings.clone();
        distinct.dedup();
        assert_eq!(distinct, readings, "a reading shown twice: {seen:?}");
    }

    /// Telemetry whose first reading takes `0`, the others none; when each reading was
    /// taken, by its number (in `ai_core_percent`).
    struct SlowOnce(Duration, Mutex<Vec<Instant>>);

    impl Telemetry for SlowOnce {
        fn sample(&self, devices: &[Device]) -> Vec<DeviceSample> {
            let n = {
                let taken = self.1.lock().unwrap();
                taken.len()
            };
            if n == 0 {
                std::thread::sleep(self.0);
            }
            self.1.lock().unwrap().push(Instant::now());
            devices
                .iter()
                .map(|d| DeviceSample {
                    ai_core_percent: Some(n as u32),
                    ..DeviceSample::of(d.physical_id)
                })
                .collect()
        }
    }

    /// After one slow reading, a driver that is fast again is read fresh again: each sample
    /// shows a reading taken at it, not one an interval old.
    #[test]
    fn after_a_slow_reading_samples_are_fresh_again() {
        let telemetry = Arc::new(SlowOnce(TELEMETRY_WAIT * 3, Mutex::new(Vec::new())));
        let hosts = one_device_host(telemetry.clone());
        let mut sampler = DeviceSampler::start(&hosts).unwrap();
        let interval = TELEMETRY_WAIT * 6;
        let mut ages = Vec::new();
        for _ in 0..5 {
            let (values, _) = sampler.sample(&hosts, interval * 10);
            if let Some(n) = values[0][0].ai_core_percent {
                let taken = telemetry.1.lock().unwrap()[n as usize];
                ages.push(taken.elapsed());
            }
            std::thread::sleep(interval);
        }
        // The first sample has no reading yet; the second takes the slow one and a fresh one.
        assert!(ages.len() >= 4, "{ages:?}");
        for age in &ages {
            assert!(*age < interval / 2, "a reading an interval old: {ages:?}");
        }
    }

    #[test]
    fn a_sample_round_trips_compact_and_absent_stays_absent() {
        let sample = HostSample {
            host: "10.0.0.1".into(),
            machine_npus: 16,
            left_out: 1,
            devices: vec![
                DeviceSample {
                    physical_id: 3,
                    ai_core_percent: Some(0),
                    hbm_used_mb: Some(1024),
                    hbm_total_mb: Some(65_536),
                    temperature_c: Some(55),
                    power_decwatts: Some(2150),
                    health: Some(Health::Unhealthy { code: 3 }),
                    error_codes: Some(vec![0x80E0_1801]),
                    failures: Vec::new(),
                },
                DeviceSample::of(4),
                // A device whose health and temperature calls failed: named, and unreadable.
                DeviceSample {
                    health: Some(Health::Unreadable {
                        code: 13,
                        call: atlasboost_core::DriverCall::Health,
                    }),
                    failures: vec!["dsmi_get_device_temperature(device 6) returned 13".into()],
                    ..DeviceSample::of(6)
                },
            ],
            workers: vec![WorkerStat {
                rank: 7,
                cpu_permille: 995,
                rss_kib: 123_456,
            }],
        };
        let bytes = encode(&sample);
        assert!(bytes.len() < 120, "{} bytes", bytes.len());
        assert_eq!(decode(&bytes).unwrap(), sample);
        assert!(decode(&bytes[..bytes.len() - 1]).is_err());
    }

    #[test]
    fn the_text_has_npu_exporters_names_and_labels() {
        let mut samples = BTreeMap::new();
        samples.insert(
            "10.0.0.1".to_string(),
            HostSample {
                host: "10.0.0.1".into(),
                machine_npus: 8,
                left_out: 1,
                devices: vec![
                    DeviceSample {
                        physical_id: 5,
                        ai_core_percent: Some(77),
                        health: Some(Health::Healthy),
                        ..DeviceSample::of(5)
                    },
                    // Left out of the job, unhealthy: still shown, with no rank.
                    DeviceSample {
                        health: Some(Health::Unhealthy { code: 3 }),
                        ..DeviceSample::of(6)
                    },
                ],
                workers: vec![
                    WorkerStat {
                        rank: 1,
                        cpu_permille: 1500,
                        rss_kib: 2,
                    },
                    // A rank of an earlier, larger attempt: no longer in the job.
                    WorkerStat {
                        rank: 9,
                        cpu_permille: 10,
                        rss_kib: 2,
                    },
                ],
            },
        );
        let chips = HashMap::from([(("10.0.0.1".to_string(), 5), "910".to_string())]);
        let ranks = [RankState {
            rank: 1,
            host: "10.0.0.1".into(),
            device: 1,
            physical: Some(5),
            up: true,
            lines: 9,
            silent_seconds: 2.0,
        }];
        let text = render("ab-1", 2, &samples, &chips, &ranks);
        for want in [
            "npu_chip_info_utilization{id=\"5\",model_name=\"Ascend910\",host=\"10.0.0.1\",rank=\"1\",job=\"ab-1\"} 77",
            "npu_chip_info_health_status{id=\"5\",model_name=\"Ascend910\",host=\"10.0.0.1\",rank=\"1\",job=\"ab-1\"} 1",
            "npu_chip_info_health_status{id=\"6\",model_name=\"Ascend910\",host=\"10.0.0.1\",job=\"ab-1\"} 0",
            "machine_npu_nums{host=\"10.0.0.1\",job=\"ab-1\"} 8",
            "atlasboost_rank_cpu_percent{rank=\"1\",host=\"10.0.0.1\",device=\"1\",job=\"ab-1\"} 150",
            "atlasboost_rank_resident_bytes{rank=\"1\",host=\"10.0.0.1\",device=\"1\",job=\"ab-1\"} 2048",
            "atlasboost_attempt{job=\"ab-1\"} 2",
            "atlasboost_rank_up{rank=\"1\",host=\"10.0.0.1\",device=\"1\",job=\"ab-1\"} 1",
            "atlasboost_rank_output_lines_total{rank=\"1\",host=\"10.0.0.1\",device=\"1\",job=\"ab-1\"} 9",
        ] {
            assert!(text.contains(want), "{want}\n{text}");
        }
        // An absent metric has no line.
        assert!(!text.contains("npu_chip_info_temperature{"), "{text}");
        assert!(!text.contains("rank=\"9\""), "{text}");
    }
}
