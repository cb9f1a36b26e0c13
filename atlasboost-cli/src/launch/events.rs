//! `--events FILE` (SPEC §13): what happens to a job, one JSON object per line, written as it
//! happens — for dashboards, schedulers and post-mortems that should not parse the console. The
//! schema is in docs/events.md; every object has `time` (Unix seconds, fractional), `event` and
//! `job`, then the event's own fields.

use std::cell::RefCell;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use serde_json::{Map, Value, json};

use crate::error::CliError;

/// The event file of a job; shared by the launcher and each attempt's output.
pub type Events = Rc<RefCell<EventLog>>;

/// An open event file.
#[derive(Debug)]
pub struct EventLog {
    file: Option<File>,
    /// Bytes of whole lines written so far: where a line cut short is cut back to.
    written: u64,
    path: PathBuf,
    job: String,
    /// The attempt under way: every event of it carries its number.
    attempt: Option<u32>,
}

impl EventLog {
    /// Creates (or truncates) `path` for job `job`.
    ///
    /// # Errors
    ///
    /// [`CliError::File`] naming the path.
    pub fn create(path: &Path, job: &str) -> Result<Events, CliError> {
        let file = File::create(path).map_err(CliError::file("create the events file", path))?;
        Ok(Rc::new(RefCell::new(EventLog {
            file: Some(file),
            written: 0,
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
        let Some(file) = &mut self.file else {
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
        match file.write_all(line.as_bytes()) {
            Ok(()) => self.written += line.len() as u64,
            Err(e) => self.give_up(&e),
        }
    }

    /// After a failed write: no half line stays in the file (a reader of JSON Lines would
    /// choke on it), and no more events are written.
    fn give_up(&mut self, e: &std::io::Error) {
        if let Some(file) = self.file.take() {
            // (Only a regular file: not a pipe or a terminal.)
            if file.metadata().is_ok_and(|m| m.is_file()) {
                let _ = file.set_len(self.written);
            }
            let _ = writeln!(
                std::io::stderr(),
                "atlasboost: warning: cannot write the events file {}: {e}; no more events",
                self.path.display()
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

    #[test]
    fn every_line_is_one_object_with_time_event_and_job() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let events = EventLog::create(&path, "ab-1").unwrap();
        events.borrow_mut().set_attempt(0);
        emit(Some(&events), "attempt_start", json!({}));
        emit(Some(&events), "summary", json!({"exit_code": 3}));
        emit(None, "ignored", json!({}));
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
