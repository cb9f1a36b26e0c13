//! The supervisor's part in `run --mpi`: mpirun, a child of the launcher, starts each rank as a
//! relay that connects to the launcher's [`RelayDoor`]; every admitted relay becomes a remote
//! of one rank, and the rest of the supervisor treats it like an ssh agent's session.
//!
//! What only mpirun brings is here: its own output (passed on to stderr, its last lines kept
//! for the message when it fails on its own), relays that must all connect in time, and the
//! end of the job, which mpirun's exit marks. That end is settled only when what the relays
//! sent has been read, or 2 s after mpirun's exit at most: a relay's last frames (a quick
//! worker's whole life) may still be on their way when the kernel reports mpirun gone.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};

use super::super::channel::Down;
use super::super::output::{LineSplitter, Output};
use super::super::plan::ranks_named;
use super::super::relay::{DoorEvent, RelayDoor};
use super::mpirun_state::{Headlines, Linger, Mpirun};
use super::{
    DRAIN_AFTER_KILL, Ending, JobResult, Lifeline, MPIRUN, Role, RunPlan, Running, Signals,
    Supervisor, WorkerPlan, peek_ending, spawn,
};
use crate::error::CliError;
use crate::exit::ExitCodes;

/// How long mpirun may go on once every rank has ended and every relay is done, before the
/// launcher sends it SIGTERM (`--grace` later, SIGKILL).
const MPIRUN_LINGER: Duration = Duration::from_secs(1);

/// How long after that SIGTERM the launcher sends another (Open MPI's mpirun exits at once on
/// a second).
const MPIRUN_SECOND_TERM: Duration = Duration::from_millis(100);

/// How long a rank's end by SIGTERM (SIGINT, SIGHUP) waits for mpirun's, to tell a rank that
/// mpirun's daemons stopped as mpirun died from one that failed ([`Supervisor::mpirun_died_first`]).
const MPIRUN_END_WAIT: Duration = Duration::from_millis(100);

/// What the launcher of `run --mpi` starts and watches ([`run_mpirun`]).
#[derive(Debug)]
pub struct MpirunPlan {
    /// The mpirun command, whose ranks are relays.
    pub command: Vec<OsString>,
    /// Variables for mpirun (the relays' secret, passed on by name).
    pub env: Vec<(OsString, OsString)>,
    /// Where the relays connect.
    pub door: RelayDoor,
    /// How long the relays may take to connect, once mpirun has started.
    pub timeout: Duration,
}

/// The launcher of `run --mpi`: starts mpirun, whose ranks are relays that connect to the
/// launcher and report like remote agents of one worker each, and supervises the job to the
/// end. `ranks` are the workers the relays will run (`local: false`; their hosts are filled
/// in when the relays connect).
///
/// # Errors
///
/// [`CliError::ToolSpawn`] when mpirun cannot be started.
pub fn run_mpirun(
    plan: &RunPlan,
    ranks: &[WorkerPlan],
    output: &mut Output,
    signals: &Signals,
    lifeline: &mut Lifeline,
    mpirun: MpirunPlan,
) -> Result<JobResult, CliError> {
    let mpirun = start(plan, mpirun, lifeline)?;
    let running = ranks.iter().map(|_| Running::elsewhere()).collect();
    let mut sup = Supervisor::new(
        plan,
        ranks,
        running,
        Vec::new(),
        lifeline,
        Role::Launcher(Vec::new()),
    );
    sup.mpirun = Some(mpirun);
    // Relays join it as they are admitted.
    sup.start_keeper();
    sup.run(signals, output);
    Ok(sup.result(output))
}

/// Starts mpirun like a worker (its own group, dying with the launcher), then the lifeline's
/// guard, which watches it.
fn start(plan: &RunPlan, m: MpirunPlan, lifeline: &mut Lifeline) -> Result<Mpirun, CliError> {
    let mpirun_plan = RunPlan {
        helpers: Vec::new(),
        command: m.command,
        wdir: plan.wdir.clone(),
        grace: plan.grace,
        lost_after: plan.lost_after,
        files: None,
        watch: false,
        hang: None,
        pytorch: false,
        monitor: None,
        metrics: None,
        unset_env: plan.unset_env.clone(),
    };
    let spec = WorkerPlan {
        rank: 0,
        host: "mpirun".into(),
        device: 0,
        env: m.env,
        local: true,
        cpus: None,
    };
    // Not in a cgroup of the launcher's: mpirun's ranks are relays, each with a lifeline (and,
    // when asked, a cgroup) of its own for its worker.
    let (pid, out, err) = spawn(&mpirun_plan, &spec, None).map_err(|e| CliError::ToolSpawn {
        program: mpirun_plan.command.first().cloned().unwrap_or_default(),
        host: match e.kind() {
            std::io::ErrorKind::NotFound => "this machine (--mpi runs Open MPI's mpirun: \
                                             Debian's openmpi-bin, or ATLASBOOST_MPIRUN=PATH)"
                .into(),
            _ => "this machine".into(),
        },
        reason: e,
    })?;
    if let Err(e) = lifeline.start_guard() {
        // Nothing would stop mpirun's ranks if the launcher died: no job.
        let _ = killpg(pid, Signal::SIGKILL);
        let _ = nix::sys::wait::waitpid(pid, None);
        return Err(e);
    }
    lifeline.watch(pid.as_raw());
    let now = Instant::now();
    Ok(Mpirun {
        pid,
        door: m.door,
        pipes: vec![
            (out, LineSplitter::default()),
            (err, LineSplitter::default()),
        ],
        headlines: Headlines::default(),
        started: now,
        deadline: now + m.timeout,
        ended: None,
        group_gone: false,
        ranks_over: None,
        signalled: false,
        settled: false,
        stopped: BTreeMap::new(),
        linger: Linger::NotYet,
    })
}

impl Supervisor<'_> {
    /// Takes relays' connections, admits those that prove themselves (each becomes a remote
    /// of its rank), and names those refused.
    pub(super) fn serve_door(&mut self, listening: bool, knocks: &[usize], output: &mut Output) {
        let Some(m) = &mut self.mpirun else { return };
        for event in m.door.serve(listening, knocks) {
            match event {
                DoorEvent::Refused(why) => output.message(&format!("atlasboost: {why}")),
                DoorEvent::Admitted {
                    rank,
                    local_rank,
                    host,
                    remote,
                } => {
                    let Ok(lane) = self.workers.binary_search_by_key(&rank, |w| w.rank) else {
                        continue;
                    };
                    self.workers[lane].host = host;
                    // init() takes the device of its local rank: this is its logical id.
                    self.workers[lane].device = local_rank;
                    self.running[lane].started = Instant::now();
                    // The relay starts its worker now; its pid is the relay's to know.
                    output.event(
                        "worker_start",
                        serde_json::json!({
                            "rank": rank,
                            "host": self.workers[lane].host,
                            "device": local_rank,
                            "pid": null,
                        }),
                    );
                    let Role::Launcher(remotes) = &mut self.role else {
                        continue;
                    };
                    if let Some(k) = &self.keeper {
                        k.watch(remote.commands());
                    }
                    remotes.push(*remote);
                    let h = remotes.len() - 1;
                    let backlog = std::mem::take(&mut remotes[h].backlog);
                    // A stop already under way reaches the late ones too.
                    if let Some((_, killed)) = self.stopping {
                        let signal = if killed {
                            Signal::SIGKILL
                        } else {
                            self.interrupted.unwrap_or(Signal::SIGTERM)
                        };
                        remotes[h].send(Down::Signal(signal));
                    }
                    for message in backlog {
                        self.on_remote(h, message, output);
                    }
                    self.check_session_end(h, output);
                }
            }
        }
    }

    /// Reads mpirun's own output (pipe `i`): its lines go to stderr as they are. False at the
    /// pipe's end.
    pub(super) fn read_mpirun(&mut self, i: usize, output: &mut Output) -> bool {
        let Some((fd, split)) = self.mpirun.as_mut().and_then(|m| m.pipes.get_mut(i)) else {
            return false;
        };
        let mut lines = Vec::new();
        let mut open = true;
        for _ in 0..16 {
            match nix::unistd::read(&*fd, &mut self.buf) {
                Ok(0) => {
                    split.finish(&mut |l| lines.push(String::from_utf8_lossy(l).into_owned()));
                    open = false;
                    break;
                }
                Ok(n) => split.feed(&self.buf[..n], &mut |l| {
                    lines.push(String::from_utf8_lossy(l).into_owned());
                }),
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => break,
                Err(_) => {
                    open = false;
                    break;
                }
            }
        }
        let Some(m) = &mut self.mpirun else {
            return false;
        };
        for l in lines {
            output.message(&l);
            m.heard(&l);
        }
        open
    }

    /// mpirun has exited (the supervisor reaped it): its last words are read, and what its
    /// relays sent, as far as it has arrived; [`Supervisor::check_mpirun`] settles the rest.
    pub(super) fn mpirun_exited(&mut self, ending: Ending, output: &mut Output) {
        let Some(m) = &mut self.mpirun else { return };
        m.ended = Some((Instant::now(), ending));
        // The pipes stay in the list (the poll in progress holds their indices); one at its
        // end reads as ended again on the next poll, and goes then.
        for i in 0..m.pipes.len() {
            // Bounded: a child of mpirun (its ssh sessions) may hold its pipes a while longer.
            for _ in 0..64 {
                if !self.read_mpirun(i, output) {
                    break;
                }
            }
        }
        // Its relays have all exited (mpirun waits for its ranks): what they sent is here, or
        // on its way from other hosts.
        let knocks: Vec<usize> =
            (0..self.mpirun.as_ref().map_or(0, |m| m.door.knocking())).collect();
        self.serve_door(true, &knocks, output);
        // No relay is still to come.
        if let Some(m) = &mut self.mpirun {
            m.door.close();
        }
        let remotes = match &self.role {
            Role::Launcher(r) => r.len(),
            Role::Agent(_) => 0,
        };
        for h in 0..remotes {
            self.read_remote(h, output);
        }
        for h in 0..remotes {
            self.check_session_end(h, output);
        }
        self.check_mpirun(output);
    }

    /// Called on every pass of the supervisor: the relays' deadline, the end of the job once
    /// mpirun has exited, and an mpirun that goes on after its ranks.
    pub(super) fn check_mpirun(&mut self, output: &mut Output) {
        let Some(m) = &self.mpirun else { return };
        let now = Instant::now();
        match m.ended {
            None => {
                if now >= m.deadline {
                    self.relays_late(output);
                }
                self.mpirun_lingers(output);
            }
            Some((at, ending)) if !m.settled => {
                // Settled once every admitted relay is done (or lost), or after the drain: 2 s
                // of silence since mpirun's exit, or since the last relay that is not done
                // spoke (a launcher slow to write its output reads slowly too).
                let unfinished: Vec<Instant> = match &self.role {
                    Role::Launcher(remotes) => remotes
                        .iter()
                        .filter(|r| !r.done && r.lost.is_none())
                        .map(|r| r.last_heard)
                        .collect(),
                    Role::Agent(_) => Vec::new(),
                };
                let all_came = self.workers.iter().all(|w| m.door.is_admitted(w.rank));
                // mpirun failed (killed, say) while ranks still run: without it their MPI job
                // is broken, and nothing else would end them. What their relays have to say
                // has had the drain's time to come first.
                if ending.failed()
                    && !m.signalled
                    && now >= at + DRAIN_AFTER_KILL
                    && !self.failed_or_interrupted()
                    && let Some(why) = self.mpirun_died_while_ranks_ran(ending)
                {
                    self.fail_job(MPIRUN, why, ending.code(), output);
                    return;
                }
                let quiet_since = unfinished.into_iter().fold(at, Instant::max);
                let heard = quiet_since == at && self.remotes_done();
                if (heard && all_came) || now >= quiet_since + DRAIN_AFTER_KILL {
                    self.settle(ending, output);
                }
            }
            Some(_) => {
                if let Some(m) = &mut self.mpirun
                    && !m.pipes.is_empty()
                    && now >= m.ended.map_or(now, |(at, _)| at) + DRAIN_AFTER_KILL
                {
                    // A child of mpirun that left its group holds its output: given up on.
                    m.pipes.clear();
                }
            }
        }
    }

    /// The end after mpirun's exit: relays still silent are lost, ranks whose relay never came
    /// never started, and mpirun failing on its own (a host it cannot reach, too few slots)
    /// fails the job with its own words.
    fn settle(&mut self, ending: Ending, output: &mut Output) {
        // Its relays said it stopped its ranks: that, ahead of its exit code (1 when it was
        // signalled itself), whatever its workers made of the signal; but mpirun killed
        // outright, not by the launcher, is named as such (below).
        let killed = matches!(ending, Ending::Signaled(_))
            && self.mpirun.as_ref().is_some_and(|m| !m.signalled);
        if !killed {
            self.mpirun_stopped_the_ranks(output);
        }
        let Some(m) = &mut self.mpirun else { return };
        m.settled = true;
        let said = m.said();
        // mpirun's own failure first: its words say more than a relay's silence. (Signalled
        // by the launcher, it did not fail the job by itself.)
        if ending.failed() && !m.signalled {
            let why = format!("mpirun ended with {}; {said}", ending.describe());
            self.fail_job(MPIRUN, why, ending.code(), output);
        }
        let remotes = match &self.role {
            Role::Launcher(r) => r.len(),
            Role::Agent(_) => 0,
        };
        for h in 0..remotes {
            let why = "it had said nothing of its worker's end 2 s after mpirun exited";
            self.host_lost(h, why.into(), output);
        }
        let now = Instant::now();
        let mut never = Vec::new();
        for (lane, w) in self.workers.iter().enumerate() {
            let admitted = self
                .mpirun
                .as_ref()
                .is_some_and(|m| m.door.is_admitted(w.rank));
            if !admitted && self.running[lane].ended.is_none() {
                self.running[lane].ended = Some((now, Ending::NotStarted));
                never.push(w.rank);
            }
        }
        if !never.is_empty() {
            let why = format!(
                "mpirun ended with {}, but {} never started ({said})",
                ending.describe(),
                ranks_named(&never)
            );
            self.fail_job(MPIRUN, why, ExitCodes::FAILURE, output);
        }
    }

    /// Once every rank has ended: lets the relays that are done go. A relay whose worker was
    /// stopped waits for this (`wait_for_release`), so that no relay's exit cuts short
    /// mpirun's wait between its SIGTERM and its SIGKILL while another rank still ends.
    pub(super) fn release_relays(&mut self) {
        if self.mpirun.is_none() {
            return;
        }
        if let Role::Launcher(remotes) = &mut self.role {
            for relay in remotes
                .iter_mut()
                .filter(|r| r.done && r.relay_rank().is_some())
            {
                relay.hang_up();
            }
        }
    }

    /// Whether `rank`'s relay said that mpirun's side signalled it ([`Up::MpirunStops`]):
    /// mpirun stops its ranks so when it is signalled itself, or ends the job on its own. How
    /// its worker ends from then on, or its relay's connection, is mpirun's doing, not a
    /// failure of the rank's.
    ///
    /// [`Up::MpirunStops`]: super::super::channel::Up::MpirunStops
    pub(super) fn mpirun_casualty(&self, rank: u32) -> bool {
        self.mpirun
            .as_ref()
            .is_some_and(|m| m.stopped.contains_key(&rank))
    }

    /// The connection of relay `h`, a casualty of mpirun's stop, closed before it said how its
    /// worker ended: its rank ended, how is unknown; no failure of its own.
    pub(super) fn relay_gone_with_mpirun(&mut self, h: usize, output: &mut Output) {
        if let Role::Launcher(remotes) = &mut self.role {
            remotes[h].lost = Some("mpirun stopped its relay".into());
            remotes[h].hang_up();
        }
        self.end_workers_of(h, Ending::Unknown, output);
    }

    /// mpirun has exited after its relays said it stopped them ([`Self::mpirun_casualty`]):
    /// unless something failed first, the job fails as mpirun's stop, with 128 + the signal
    /// (it was blamed on the first rank to end, or on a relay that mpirun killed, with
    /// nothing said of mpirun but the relays' own message). Judged at mpirun's exit, so that
    /// a rank that really failed, whatever order its news came in, is named instead.
    fn mpirun_stopped_the_ranks(&mut self, output: &mut Output) {
        let Some(m) = &self.mpirun else { return };
        let Some(&signal) = m.stopped.values().next() else {
            return;
        };
        if self.failed_or_interrupted() {
            return;
        }
        let why = format!(
            "mpirun stopped its ranks: their relays got {} from mpirun's side, as mpirun does \
             when it is signalled itself or ends the job on its own; {}",
            signal.name(),
            m.said()
        );
        self.fail_job(MPIRUN, why, Ending::Signaled(signal).code(), output);
    }

    /// A relay reports its worker ended by a signal that mpirun's side sends when mpirun goes
    /// (its daemons on other hosts stop their ranks, SIGTERM, as they lose it). If mpirun has
    /// died of a signal the launcher did not send, that is the job's failure, named as when
    /// no relay spoke first: the rank was only its casualty. mpirun's exit is looked at
    /// without collecting it, and waited for a moment ([`MPIRUN_END_WAIT`]): the daemons see
    /// it die a moment before the kernel reports it.
    pub(super) fn mpirun_died_first(&mut self, ending: Ending, output: &mut Output) {
        let Some(m) = &self.mpirun else { return };
        if !stopping_signal(ending) || m.signalled || self.failed_or_interrupted() {
            return;
        }
        let until = Instant::now() + MPIRUN_END_WAIT;
        let mpirun_end = loop {
            let end = m.ended.map(|(_, e)| e).or_else(|| peek_ending(m.pid));
            if end.is_some() || Instant::now() >= until {
                break end;
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        let Some(mpirun_end) = mpirun_end.filter(|e| matches!(e, Ending::Signaled(_))) else {
            return;
        };
        // The reporting rank still counts as running: its end is taken after this.
        if let Some(why) = self.mpirun_died_while_ranks_ran(mpirun_end) {
            self.fail_job(MPIRUN, why, mpirun_end.code(), output);
        }
    }

    /// Why the job fails when mpirun ended (`ending`) while admitted ranks still ran, naming
    /// them; `None` when none did.
    fn mpirun_died_while_ranks_ran(&self, ending: Ending) -> Option<String> {
        let m = self.mpirun.as_ref()?;
        let running: Vec<u32> = self
            .workers
            .iter()
            .zip(&self.running)
            .filter(|(w, r)| r.ended.is_none() && m.door.is_admitted(w.rank))
            .map(|(w, _)| w.rank)
            .collect();
        (!running.is_empty()).then(|| {
            format!(
                "mpirun ended with {} while {} still ran; {}",
                ending.describe(),
                ranks_named(&running),
                m.said()
            )
        })
    }

    /// Every rank's relay must connect within the rendezvous timeout of mpirun's start; those
    /// that did not are named, and the job stops.
    fn relays_late(&mut self, output: &mut Output) {
        let Some(m) = &self.mpirun else { return };
        let missing: Vec<u32> = self
            .workers
            .iter()
            .map(|w| w.rank)
            .filter(|&r| !m.door.is_admitted(r))
            .collect();
        if missing.is_empty() || self.failed_or_interrupted() {
            return;
        }
        let why = format!(
            "the relay of {} did not connect within {:.0?} of mpirun's start ({})",
            ranks_named(&missing),
            m.deadline.saturating_duration_since(m.started),
            m.said()
        );
        let now = Instant::now();
        for lane in 0..self.workers.len() {
            if missing.contains(&self.workers[lane].rank) && self.running[lane].ended.is_none() {
                self.running[lane].ended = Some((now, Ending::NotStarted));
            }
        }
        self.fail_job(MPIRUN, why, ExitCodes::FAILURE, output);
        // mpirun aborts the ranks it did start (and those still starting).
        self.signal_mpirun(Signal::SIGTERM);
    }

    /// Every rank has ended and every relay is done, yet mpirun goes on: after a wait it gets
    /// SIGTERM, a moment later SIGTERM again (which ends mpirun's own stop at once: it sleeps
    /// out its SIGKILL timeout though no rank is left), and `--grace` later SIGKILL, said. The
    /// wait is [`MPIRUN_LINGER`] when mpirun is known to be stopping (its relays said so, the
    /// job failed: mpirun lost a rank, or was signalled, or a rank called `MPI_Abort`), or when
    /// the launcher sent it SIGTERM already; else `--grace` (a clean end whose daemons on
    /// other hosts take a while to go).
    fn mpirun_lingers(&mut self, output: &mut Output) {
        let ranks_over = self.running.iter().all(|r| r.ended.is_some()) && self.remotes_done();
        let grace = self.plan.grace;
        let job_failed = self.failed_or_interrupted();
        let Some(m) = &mut self.mpirun else { return };
        if !ranks_over {
            return;
        }
        let since = *m.ranks_over.get_or_insert_with(Instant::now);
        let wait = match job_failed || !m.stopped.is_empty() {
            true => MPIRUN_LINGER.min(grace),
            false => grace,
        };
        match m.linger {
            // Killed by the launcher (SIGKILL): nothing more to send.
            Linger::NotYet if m.signalled => {}
            Linger::NotYet if since.elapsed() >= wait => {
                self.signal_mpirun(Signal::SIGTERM);
            }
            Linger::Termed(at) if at.elapsed() >= MPIRUN_SECOND_TERM => {
                m.linger = Linger::TermedTwice(at);
                let _ = killpg(m.pid, Signal::SIGTERM);
            }
            Linger::TermedTwice(at) if at.elapsed() >= grace => {
                m.linger = Linger::Killed;
                output.message(&format!(
                    "atlasboost: mpirun had not exited {grace:.0?} after its SIGTERM, every rank \
                     having ended; killing it"
                ));
                self.signal_mpirun(Signal::SIGKILL);
            }
            _ => {}
        }
    }

    /// Sends `signal` to mpirun's process group, while it runs.
    pub(super) fn signal_mpirun(&mut self, signal: Signal) {
        if let Some(m) = self.mpirun.as_mut().filter(|m| m.ended.is_none()) {
            m.signalled = true;
            // A SIGTERM is followed, once every rank has ended, by another (`mpirun_lingers`).
            if signal == Signal::SIGTERM && m.linger == Linger::NotYet {
                m.linger = Linger::Termed(Instant::now());
            }
            let _ = killpg(m.pid, signal);
        }
    }

    /// Whether every relay admitted so far is done, or lost.
    fn remotes_done(&self) -> bool {
        match &self.role {
            Role::Launcher(remotes) => remotes.iter().all(|r| r.done || r.lost.is_some()),
            Role::Agent(_) => true,
        }
    }
}

/// Whether a worker ended of a signal mpirun's side stops ranks with (SIGTERM; SIGINT and
/// SIGHUP, which mpirun passes on when it gets them).
fn stopping_signal(ending: Ending) -> bool {
    [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP]
        .map(|s| Ending::Signaled(s.into()))
        .contains(&ending)
}
