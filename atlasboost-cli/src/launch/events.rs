//! `--events FILE` (SPEC §13): what happens to a job, one JSON object per line, written as it
//! happens — for dashboards, schedulers and post-mortems that should not parse the console. The
//! schema is in docs/events.md; every object has `time` (Unix seconds, fractional), `event` and
//! `job`, then the event's own fields.

use std::cell::RefCell;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::error::CliError;

/// The event file of a job; shared by the launcher and each attempt's output.
pub type Events = Rc<RefCell<EventLog>>;

/// The most bytes of events waiting for a slow reader (a FIFO): beyond, `telemetry` events
/// (the periodic bulk) are dropped, counted and said at the end, rather than held in memory
/// without end; the job's own events (starts, ends, the summary) always wait their turn.
const MAX_QUEUED: usize = 16 << 20;

/// How long the launcher's end waits for the events still queued to be written.
const LAST_WRITES: Duration = Duration::from_secs(5);

/// An open event file. Lines are written by a thread of their own, so that a reader that
/// takes nothing (a FIFO's, a stalled dashboard's) never holds up the launcher: its signals,
/// the grace time and the workers go on, and events queue (telemetry up to `MAX_QUEUED`
/// bytes).
#[derive(Debug)]
pub struct EventLog {
    lines: Option<Sender<Vec<u8>>>,
    /// Bytes queued and not yet written.
    queued: Arc<AtomicUsize>,
    /// Telemetry events dropped because too much was queued.
    dropped: u64,
    /// Said when the writer has written (or given up on) everything.
    done: Option<Receiver<()>>,
    path: PathBuf,
    job: String,
    /// The attempt under way: every event of it carries its number.
    attempt: Option<u32>,
}

impl EventLog {
    /// Creates (or empties) `path` for job `job`. A regular file is locked for the job where
    /// its file system can lock (another job's `--events` there is refused, not mixed in), and
    /// written at its end (`O_APPEND`: a rotation that empties it under the job leaves no gap
    /// of zero bytes).
    ///
    /// # Errors
    ///
    /// [`CliError::File`] naming the path (one that cannot be opened, locked or emptied),
    /// [`CliError::System`] for a writer thread that cannot start, [`CliError::Failure`] for a
    /// file another job writes its events to.
    pub fn create(path: &Path, job: &str) -> Result<Events, CliError> {
        let file = File::options()
            .append(true)
            .create(true)
            .open(path)
            .map_err(CliError::file("create the events file", path))?;
        let file = match file.metadata().is_ok_and(|m| m.is_file()) {
            // A pipe or a terminal: nothing to lock or empty.
            false => EventsFile::Plain(file),
            // Locked before it is emptied: a running job's events stay whole.
            true => {
                let mut file = match nix::fcntl::Flock::lock(
                    file,
                    nix::fcntl::FlockArg::LockExclusiveNonblock,
                ) {
                    Ok(locked) => EventsFile::Locked(locked),
                    Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                        return Err(CliError::Failure(format!(
                            "the events file {} is another running job's (it holds its lock): \
                             give this job a file of its own",
                            path.display()
                        )));
                    }
                    // A file system that cannot lock (NFS without its lock service):
                    // unlocked, as before locks were taken.
                    Err((
                        file,
                        nix::errno::Errno::ENOLCK
                        | nix::errno::Errno::EOPNOTSUPP
                        | nix::errno::Errno::EINVAL,
                    )) => EventsFile::Plain(file),
                    Err((_, errno)) => {
                        return Err(CliError::file("lock the events file", path)(errno.into()));
                    }
                };
                file.file()
                    .set_len(0)
                    .map_err(CliError::file("empty the events file", path))?;
                file
            }
        };
        let (lines, incoming) = mpsc::channel::<Vec<u8>>();
        let (finished, done) = mpsc::channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let (counter, shown) = (Arc::clone(&queued), path.to_path_buf());
        std::thread::Builder::new()
            .name("events".into())
            .spawn(move || {
                write_lines(file, &incoming, &counter, &shown);
                let _ = finished.send(());
            })
            .map_err(CliError::system("start the events file's writer"))?;
        Ok(Rc::new(RefCell::new(EventLog {
            lines: Some(lines),
            queued,
            dropped: 0,
            done: Some(done),
            path: path.to_path_buf(),
            job: job.to_string(),
            attempt: None,
        })))
    }

    /// Appends one event: `fields` (an object) after `time`, `event` and `job`. One `write` per
    /// line, so a reader never sees half of one; a file that cannot be written any more (a full
    /// disk) is cut back to its last whole line, said once on stderr and given up, and the job
    /// goes on.
    pub fn emit(&mut self, event: &str, fields: Value) {
        let Some(lines) = &self.lines else {
            return;
        };
        let time = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let mut object = Map::new();
        object.insert("time".into(), json!(time));
        object.insert("event".into(), json!(event));
        object.insert("job".into(), json!(self.job));
        if let Some(n) = self.attempt {
            object.insert("attempt".into(), json!(n));
        }
        if let Value::Object(more) = fields {
            object.extend(more);
        }
        let mut line = Value::Object(object).to_string();
        line.push('\n');
        if event == "telemetry" && self.queued.load(Ordering::Relaxed) + line.len() > MAX_QUEUED {
            self.dropped += 1;
            return;
        }
        self.queued.fetch_add(line.len(), Ordering::Relaxed);
        // A writer that gave up has said so; its events go nowhere.
        let _ = lines.send(line.into_bytes());
    }
}

/// The events' file: a regular file (locked for the job where its file system can lock), or a
/// pipe or terminal.
enum EventsFile {
    Plain(File),
    Locked(nix::fcntl::Flock<File>),
}

impl EventsFile {
    fn file(&mut self) -> &mut File {
        match self {
            EventsFile::Plain(f) => f,
            EventsFile::Locked(f) => f,
        }
    }
}

/// The writer thread: each line whole, at the file's end; after a failed write, a regular file
/// is cut back by what of that line got in (a reader of JSON Lines would choke on half of one;
/// never grown, should the file have been emptied meanwhile), said once, and the rest is only
/// counted off.
fn write_lines(
    mut file: EventsFile,
    incoming: &Receiver<Vec<u8>>,
    queued: &AtomicUsize,
    path: &Path,
) {
    let file = file.file();
    let regular = file.metadata().is_ok_and(|m| m.is_file());
    let mut failed = false;
    for line in incoming {
        if !failed && let Err((e, partial)) = write_whole(file, &line) {
            failed = true;
            if regular
                && partial > 0
                && let Ok(len) = file.metadata().map(|m| m.len())
                && len >= partial
            {
                let _ = file.set_len(len - partial);
            }
            let _ = writeln!(
                std::io::stderr(),
                "atlasboost: warning: cannot write the events file {}: {e}; no more events",
                path.display()
            );
        }
        queued.fetch_sub(line.len(), Ordering::Relaxed);
    }
}

/// `line` written in full, or the error and how many of its bytes got in before it.
fn write_whole(file: &mut File, line: &[u8]) -> Result<(), (std::io::Error, u64)> {
    let mut done = 0;
    while done < line.len() {
        match file.write(&line[done..]) {
            Ok(0) => return Err((std::io::ErrorKind::WriteZero.into(), done as u64)),
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err((e, done as u64)),
        }
    }
    Ok(())
}

impl Drop for EventLog {
    /// Waits (at most `LAST_WRITES`) for what is queued to be written, and says what was not.
    fn drop(&mut self) {
        self.lines = None;
        let finished = self
            .done
            .take()
            .is_some_and(|d| d.recv_timeout(LAST_WRITES).is_ok());
        let queued = self.queued.load(Ordering::Relaxed);
        if !finished && queued > 0 {
            let _ = writeln!(
                std::io::stderr(),
                "atlasboost: warning: the events file {} did not take its last {queued} bytes \
                 of events within {} s of the end: they are not written",
                self.path.display(),
                LAST_WRITES.as_secs()
            );
        }
        if self.dropped > 0 {
            let _ = writeln!(
                std::io::stderr(),
                "atlasboost: warning: the events file {} was read too slowly: {} telemetry \
                 events were dropped ({} MiB were waiting for it)",
                self.path.display(),
                self.dropped,
                MAX_QUEUED >> 20
            );
        }
    }
}

impl EventLog {
    /// The attempt whose events follow.
    pub fn set_attempt(&mut self, attempt: u32) {
        self.attempt = Some(attempt);
    }
}

/// Emits `event` if there is an event file.
pub fn emit(events: Option<&Events>, event: &str, fields: Value) {
    if let Some(e) = events {
        e.borrow_mut().emit(event, fields);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A second job's `--events` at a running job's file is refused, and the first job's
    /// events stay whole; a file emptied under the job (a rotation) goes on from its start.
    #[test]
    fn a_running_jobs_events_file_is_its_own_and_written_at_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let first = EventLog::create(&path, "ab-1").unwrap();
        emit(Some(&first), "attempt_start", json!({}));
        let Err(e) = EventLog::create(&path, "ab-2") else {
            panic!("a second job's events at a running job's file were taken");
        };
        let e = e.to_string();
        assert!(
            e.contains(&format!(
                "the events file {} is another running job's",
                path.display()
            )),
            "{e}"
        );
        emit(Some(&first), "attempt_end", json!({}));
        // Written by the time the writer has had a moment; then emptied, as copytruncate does.
        let written = |n: usize| {
            let until = std::time::Instant::now() + Duration::from_secs(10);
            while std::fs::read_to_string(&path).unwrap().lines().count() < n {
                assert!(
                    std::time::Instant::now() < until,
                    "the writer wrote nothing"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        written(2);
        std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        emit(Some(&first), "summary", json!({}));
        drop(first);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("{\""), "no gap of zero bytes: {text:?}");
        assert_eq!(text.lines().count(), 1, "{text}");
        // Its lock went with it: the next job takes the file.
        let next = EventLog::create(&path, "ab-3").unwrap();
        drop(next);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "");
    }

    #[test]
    fn every_line_is_one_object_with_time_event_and_job() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let events = EventLog::create(&path, "ab-1").unwrap();
        events.borrow_mut().set_attempt(0);
        emit(Some(&events), "attempt_start", json!({}));
        emit(Some(&events), "summary", json!({"exit_code": 3}));
        emit(None, "ignored", json!({}));
        // Written by the time the log is dropped.
        drop(events);
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["event"], "attempt_start");
        assert_eq!(lines[0]["job"], "ab-1");
        assert_eq!(lines[0]["attempt"], 0);
        assert!(lines[1]["time"].as_f64().unwrap() >= lines[0]["time"].as_f64().unwrap());
        assert_eq!(lines[1]["exit_code"], 3);
    }
}
