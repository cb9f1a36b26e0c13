//! What a worker tells its launcher beside its output (SPEC §12): heartbeats for the hang
//! watchdog, and the record of its own failure.
//!
//! - **Heartbeats**: [`heartbeat`] counts calls and keeps the last step; the launcher's agent
//!   on the worker's host reads them from the file `ATLASBOOST_HEARTBEAT_FILE` names: 16 bytes,
//!   the count then the step, each a little-endian 64-bit integer (the step `i64::MIN` when none
//!   was given). The file's record is mapped into memory, shared: a call stores the two
//!   numbers there, which the launcher's next read of the file sees, at the cost of a lock and
//!   two stores, not a system call (cheap enough for every training step), and a hung worker's
//!   last beat is never held back. Where the file cannot be mapped, each call writes it.
//!   The file must keep its length while the worker runs (a store past the end of a shared
//!   mapping is SIGBUS): it lives in the launcher's directory of rank files, mode 0700, which
//!   only the launcher's user can reach.
//! - **Errors**: a worker that fails records why in `ATLASBOOST_ERROR_FILE`, as JSON in the
//!   form torch's `@record` writes to `TORCHELASTIC_ERROR_FILE`, so both are read the same way:
//!   `{"message": {"message": "ValueError: ...", "extraInfo": {"py_callstack": "...",
//!   "timestamp": "1733050000"}}}`. [`RecordedError::parse`] reads either.

use std::fs::File;
use std::num::NonZeroUsize;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Mutex;

use nix::sys::mman::{MapFlags, ProtFlags};

use atlasboost_core::EnvVars;

/// The step of a heartbeat that gave none, in the file.
const NO_STEP: i64 = i64::MIN;

/// The record's length in the file.
const RECORD: usize = 16;

/// The same, as `mmap` takes it.
const RECORD_LENGTH: NonZeroUsize = NonZeroUsize::new(RECORD).unwrap();

struct Beats {
    /// `None`: no launcher listens (the variable is unset or the file cannot be opened).
    file: Option<Record>,
    count: u64,
    step: Option<i64>,
}

/// Where a worker's beats go.
enum Record {
    /// The file's first [`RECORD`] bytes, mapped shared.
    Mapped(Mapped),
    /// The file itself, written at each call (it could not be mapped).
    Written(File),
}

/// A shared mapping of a file's first [`RECORD`] bytes, kept for the life of the process.
struct Mapped(NonNull<std::ffi::c_void>);

// SAFETY: the mapping is only written with the BEATS lock held; the pointer is valid for the
// life of the process (never unmapped).
unsafe impl Send for Mapped {}

impl Record {
    /// Opens `path` and maps its record (written first, so that the file is long enough).
    fn open(path: &Path) -> std::io::Result<Record> {
        use std::os::unix::fs::OpenOptionsExt;
        // Without waiting: a FIFO under that name would hold the open until a reader came.
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(nix::libc::O_NONBLOCK)
            .open(path)?;
        if !file.metadata()?.is_file() {
            return Err(std::io::Error::other("not a regular file"));
        }
        file.write_all_at(&encode(0, None), 0)?;
        // SAFETY: a new shared mapping of a file opened for reading and writing; nothing else
        // in this process maps it.
        let mapped = unsafe {
            nix::sys::mman::mmap(
                None,
                RECORD_LENGTH,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                &file,
                0,
            )
        };
        Ok(match mapped {
            Ok(at) => Record::Mapped(Mapped(at)),
            Err(_) => Record::Written(file),
        })
    }

    fn store(&self, bytes: [u8; RECORD]) {
        match self {
            // SAFETY: the mapping is RECORD bytes, writable, and alive (never unmapped).
            Record::Mapped(m) => unsafe {
                std::ptr::write_volatile(m.0.as_ptr().cast::<[u8; RECORD]>(), bytes);
            },
            Record::Written(file) => {
                let _ = file.write_all_at(&bytes, 0);
            }
        }
    }
}

static BEATS: Mutex<Option<Beats>> = Mutex::new(None);

/// Tells the launcher this worker is making progress (`step`: the training step, if known).
/// Returns whether a launcher listens (`atlasboost run --hang-timeout` set
/// `ATLASBOOST_HEARTBEAT_FILE`); without one it does nothing. A file the variable names but
/// that cannot be opened is said once on stderr (the watchdog would take the worker for hung),
/// and counts as nobody listening.
pub fn heartbeat(step: Option<i64>) -> bool {
    let mut guard = BEATS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let beats = guard.get_or_insert_with(|| Beats {
        file: std::env::var_os(EnvVars::ATLASBOOST_HEARTBEAT_FILE)
            .filter(|p| !p.is_empty())
            .and_then(|p| {
                let opened = Record::open(Path::new(&p));
                if let Err(e) = &opened {
                    crate::init::to_stderr(&format!(
                        "atlasboost: heartbeat: cannot open {}={}: {e}; the launcher's hang \
                         watchdog will not see this worker's heartbeats\n",
                        EnvVars::ATLASBOOST_HEARTBEAT_FILE,
                        Path::new(&p).display()
                    ));
                }
                opened.ok()
            }),
        count: 0,
        step: None,
    });
    let Some(file) = &beats.file else {
        return false;
    };
    beats.count += 1;
    if step.is_some() {
        beats.step = step;
    }
    file.store(encode(beats.count, beats.step));
    true
}

fn encode(count: u64, step: Option<i64>) -> [u8; RECORD] {
    let mut bytes = [0u8; RECORD];
    bytes[..8].copy_from_slice(&count.to_le_bytes());
    bytes[8..].copy_from_slice(&step.unwrap_or(NO_STEP).to_le_bytes());
    bytes
}

/// A worker's heartbeats so far, from its file: the count and the last step. `None` when the
/// file is missing, shorter than a record or counts none (the worker has not called
/// [`heartbeat`]).
pub fn read_beats(path: &Path) -> Option<(u64, Option<i64>)> {
    let file = File::open(path).ok()?;
    // The worker stores into its mapping while this reads: two reads that agree are one
    // record, not halves of two (a few tries, then the last read).
    let read = || {
        let mut bytes = [0u8; RECORD];
        file.read_exact_at(&mut bytes, 0).ok().map(|()| bytes)
    };
    let mut bytes = read()?;
    for _ in 0..3 {
        let again = read()?;
        if again == bytes {
            break;
        }
        bytes = again;
    }
    let (count, step) = bytes.split_at(8);
    let count = u64::from_le_bytes(count.try_into().ok()?);
    let step = i64::from_le_bytes(step.try_into().ok()?);
    // 0: the record a worker writes before its first beat is stored.
    (count > 0).then_some((count, (step != NO_STEP).then_some(step)))
}

/// What a failed worker recorded about its failure.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedError {
    /// The error, e.g. `ValueError: the loss is NaN`.
    pub message: String,
    /// Its traceback (Python's, as printed), if recorded.
    pub traceback: Option<String>,
    /// When it happened, in seconds since the epoch, if recorded.
    pub timestamp: Option<f64>,
}

impl RecordedError {
    /// Reads an error file's JSON (atlasboost's or torch's `@record`'s).
    ///
    /// # Errors
    ///
    /// What is wrong with it: not JSON, or no message where one belongs (`message.message`).
    pub fn parse(text: &[u8]) -> Result<RecordedError, String> {
        let value: serde_json::Value =
            serde_json::from_slice(text).map_err(|e| format!("not JSON: {e}"))?;
        let outer = value
            .get("message")
            .ok_or("no \"message\" key at the top level")?;
        let (message, info) = match outer {
            serde_json::Value::String(s) => (s.clone(), None),
            serde_json::Value::Object(o) => (
                o.get("message")
                    .and_then(|m| m.as_str())
                    .ok_or("no string at message.message")?
                    .to_string(),
                o.get("extraInfo"),
            ),
            _ => return Err("\"message\" is neither a string nor an object".into()),
        };
        let traceback = info
            .and_then(|i| i.get("py_callstack"))
            .and_then(|t| t.as_str())
            .map(str::to_string);
        // torch writes the time stamp as a string of whole seconds.
        let timestamp = info.and_then(|i| i.get("timestamp")).and_then(|t| match t {
            serde_json::Value::String(s) => s.parse().ok(),
            other => other.as_f64(),
        });
        Ok(RecordedError {
            message,
            traceback,
            timestamp,
        })
    }

    /// `text` with a whole-second time stamp made precise by `written`, when the file was
    /// written, if that falls within the stamp's second. torch stamps whole seconds, and
    /// whether a record came before or after a stop begun in that second decides whether it is
    /// a root cause or the stop's own error (a SIGTERM handler's). Anything else is returned as
    /// it is.
    #[must_use]
    pub fn with_precise_time(text: Vec<u8>, written: std::time::SystemTime) -> Vec<u8> {
        let Ok(mut value) = serde_json::from_slice::<serde_json::Value>(&text) else {
            return text;
        };
        let Some(stamp) = value
            .get_mut("message")
            .and_then(|m| m.get_mut("extraInfo"))
            .and_then(|i| i.get_mut("timestamp"))
        else {
            return text;
        };
        let whole = match &*stamp {
            serde_json::Value::String(s) => s.parse::<f64>().ok(),
            other => other.as_f64(),
        };
        let Some(whole) = whole.filter(|t| t.fract() == 0.0) else {
            return text;
        };
        let Ok(at) = written.duration_since(std::time::UNIX_EPOCH) else {
            return text;
        };
        let at = at.as_secs_f64();
        if at < whole || at >= whole + 1.0 {
            return text;
        }
        *stamp = serde_json::Value::String(format!("{at:.6}"));
        serde_json::to_vec(&value).unwrap_or(text)
    }

    /// The traceback's innermost `File "...", line N, in f` line, if any.
    pub fn innermost_frame(&self) -> Option<&str> {
        self.traceback
            .as_deref()?
            .lines()
            .rev()
            .map(str::trim)
            .find(|l| l.starts_with("File \""))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// torch's whole-second stamp takes the file's time when it falls in that second; any other
    /// stamp, or a time outside it, is left as it was.
    #[test]
    fn a_whole_second_stamp_is_made_precise_by_the_files_time() {
        let at = |secs: f64| std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(secs);
        let torch = br#"{"message": {"message": "E", "extraInfo": {"timestamp": "1700000000"}}}"#;
        let precise = RecordedError::with_precise_time(torch.to_vec(), at(1_700_000_000.25));
        let t = RecordedError::parse(&precise).unwrap().timestamp.unwrap();
        assert!((t - 1_700_000_000.25).abs() < 1e-3, "{t}");
        for (text, written) in [
            (&torch[..], 1_700_000_001.5),
            (&torch[..], 1_699_999_999.5),
            (
                &br#"{"message": {"message": "E", "extraInfo": {"timestamp": 1700000000.5}}}"#[..],
                1_700_000_000.75,
            ),
            (&br#"{"message": "E"}"#[..], 1_700_000_000.5),
            (&b"not json"[..], 1_700_000_000.5),
        ] {
            assert_eq!(
                RecordedError::with_precise_time(text.to_vec(), at(written)),
                text,
                "{}",
                String::from_utf8_lossy(text)
            );
        }
    }

    #[test]
    fn beats_round_trip_through_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("beat");
        assert_eq!(read_beats(&path), None);
        std::fs::write(&path, encode(3, Some(-7))).unwrap();
        assert_eq!(read_beats(&path), Some((3, Some(-7))));
        std::fs::write(&path, encode(u64::MAX, None)).unwrap();
        assert_eq!(read_beats(&path), Some((u64::MAX, None)));
        std::fs::write(&path, b"short").unwrap();
        assert_eq!(read_beats(&path), None);
        std::fs::write(&path, encode(0, None)).unwrap();
        assert_eq!(read_beats(&path), None, "no beat yet");
    }

    /// Each beat is in the file at once (a worker that hangs right after beating is not
    /// reported with older beats).
    #[test]
    fn every_beat_is_in_the_file_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("beat");
        let record = Record::open(&path).unwrap();
        assert!(matches!(record, Record::Mapped(_)), "the file is mapped");
        assert_eq!(read_beats(&path), None);
        for count in 1..=50u64 {
            record.store(encode(count, Some(count as i64 - 1)));
            assert_eq!(read_beats(&path), Some((count, Some(count as i64 - 1))));
        }
    }

    #[test]
    fn torch_and_atlasboost_records_read_alike() {
        let torch = br#"{"message": {"message": "RuntimeError: boom", "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  File \"/w/train.py\", line 12, in main\n    raise RuntimeError('boom')\nRuntimeError: boom\n", "timestamp": "1733050000"}}}"#;
        let e = RecordedError::parse(torch).unwrap();
        assert_eq!(e.message, "RuntimeError: boom");
        assert_eq!(e.timestamp, Some(1_733_050_000.0));
        assert_eq!(
            e.innermost_frame(),
            Some("File \"/w/train.py\", line 12, in main")
        );
        let plain = RecordedError::parse(br#"{"message": "killed by the OOM killer"}"#).unwrap();
        assert_eq!(plain.message, "killed by the OOM killer");
        assert_eq!(plain.innermost_frame(), None);
        assert!(
            RecordedError::parse(b"{")
                .unwrap_err()
                .starts_with("not JSON")
        );
        assert!(
            RecordedError::parse(br#"{"message": {"extraInfo": {}}}"#)
                .unwrap_err()
                .contains("message.message")
        );
    }
}
