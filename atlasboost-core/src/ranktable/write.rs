//! Writing rank tables so that no reader ever sees half a file.

use std::fs::{self, File, Permissions};
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::model::RankTable;
use super::validate::{Violation, errors_fail, validate_table};
use crate::device::Chip;
use crate::error::{Error, Result};

/// Why HCCL would refuse to load a rank table from `path`, if it would. HCCL takes the first
/// `.json` in the path as the end of the table's name (`CheckFilePath`: it must end the path,
/// so `/jobs/a.json.d/t.json` is refused), and refuses an empty name before it (`GetFileName`:
/// `dir/.json`).
#[must_use]
pub fn hccl_name_problem(path: &Path) -> Option<String> {
    use std::os::unix::ffi::OsStrExt;
    const SUFFIX: &[u8] = b".json";
    let bytes = path.as_os_str().as_bytes();
    if !bytes.ends_with(SUFFIX) {
        return Some("HCCL only loads rank tables whose name ends in .json".into());
    }
    let first = bytes.windows(SUFFIX.len()).position(|w| w == SUFFIX);
    if let Some(at) = first.filter(|&at| at + SUFFIX.len() != bytes.len()) {
        let name_len = path.file_name().map_or(0, |n| n.as_bytes().len());
        let remedy = match at >= bytes.len() - name_len {
            true => "name the file with \".json\" only at its end",
            false => "choose a directory whose name has no \".json\"",
        };
        return Some(format!(
            "HCCL takes the first \".json\" in a rank table's path as the end of its name, and \
             this path has one earlier ({}): HCCL refuses it; {remedy}",
            String::from_utf8_lossy(&bytes[..at + SUFFIX.len()])
        ));
    }
    if path.file_name().is_some_and(|n| n.as_bytes() == SUFFIX) {
        return Some(
            "its name is \".json\" alone: HCCL refuses a rank table whose name before .json is \
             empty"
                .into(),
        );
    }
    None
}

/// Validates `table` for `chip` and writes it to `path` atomically (see [`write_atomically`]).
///
/// # Errors
///
/// [`Error::BadPath`] if HCCL would refuse the path ([`hccl_name_problem`]), [`Error::Invalid`] if
/// the table breaks a rule (nothing is written), [`Error::Io`] if the file cannot be written.
/// Returns the table's warnings (what HCCL only recommends), for the caller to show.
pub fn write_table(path: &Path, table: &RankTable, chip: Chip) -> Result<Vec<Violation>> {
    // As given: HCCL checks the path it is given (`t.json` in a directory named `x.json` is
    // loaded as `t.json`, not from the root; `run` gives its workers the path from the root,
    // and checks that one).
    if let Some(reason) = hccl_name_problem(path) {
        return Err(Error::BadPath {
            path: path.to_path_buf(),
            reason,
        });
    }
    let warnings = errors_fail(validate_table(table, chip), || {
        format!("the table for {}", path.display())
    })?;
    write_atomically(path, table.to_json_pretty().as_bytes())?;
    Ok(warnings)
}

/// Writes `contents` to `path` atomically: a temporary file in the same directory, fsync, mode
/// 0644, rename over `path`, fsync of the directory. A reader sees the old file or the new one.
///
/// # Errors
///
/// [`Error::Io`] naming the file or directory that could not be written.
pub fn write_atomically(path: &Path, contents: &[u8]) -> Result<()> {
    // A symbolic link (to a shared table, say) stays one: the file it names is replaced.
    let followed = link_target(path);
    let path = followed.as_deref().unwrap_or(path);
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let io = |action: &'static str, p: &Path| {
        let p = p.to_path_buf();
        move |source| Error::Io {
            action,
            path: p,
            source,
        }
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".atlasboost-")
        .suffix(".json.tmp")
        .tempfile_in(dir)
        .map_err(io("cannot create a temporary file in", dir))?;
    // Errors name the file the user asked for, not the temporary one (which goes with the
    // error); written through the file itself, as the temporary file's own writer adds its
    // path to the error.
    tmp.as_file_mut()
        .write_all(contents)
        .map_err(io("cannot write", path))?;
    tmp.as_file()
        .set_permissions(Permissions::from_mode(0o644))
        .map_err(io("cannot set the mode of the new", path))?;
    tmp.as_file()
        .sync_all()
        .map_err(io("cannot flush the new", path))?;
    tmp.persist(path)
        .map_err(|e| io("cannot rename a temporary file to", path)(e.error))?;
    // The rename is durable only once the directory entry is.
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("cannot flush the directory", dir))?;
    Ok(())
}

/// Where the symbolic link `path` leads (through any chain of links, even to a file not made
/// yet); `None` if `path` is not a link, or a link of another user's: one planted in a shared
/// directory (`/tmp/rank_table.json -> /home/you/.bashrc`) is replaced, not followed, as the
/// kernel's `protected_symlinks` would refuse to follow it.
fn link_target(path: &Path) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let me = nix::unistd::geteuid().as_raw();
    let mut at = path.to_path_buf();
    // As the kernel's limit on a chain of links.
    for _ in 0..40 {
        let link = std::fs::symlink_metadata(&at)
            .ok()
            .filter(|m| m.file_type().is_symlink());
        let Some(link) = link else {
            return (at != path).then_some(at);
        };
        if link.uid() != me {
            return None;
        }
        let next = std::fs::read_link(&at).ok()?;
        at = match at.parent() {
            Some(dir) if next.is_relative() => dir.join(next),
            _ => next,
        };
    }
    // A loop: the link itself is replaced.
    None
}

/// Reads a JSON file (bytes that are not UTF-8 are a JSON error with line and column).
///
/// # Errors
///
/// [`Error::Io`] if it cannot be read, [`Error::Json`] if it is not JSON.
pub fn read_json(path: &Path) -> Result<serde_json::Value> {
    read_json_bytes(path).map(|(value, _)| value)
}

/// [`read_json`], with the file's bytes (for [`duplicate_keys`](super::duplicate_keys), which
/// the parsed value can no longer show).
///
/// # Errors
///
/// As [`read_json`].
pub fn read_json_bytes(path: &Path) -> Result<(serde_json::Value, Vec<u8>)> {
    let file = fs::File::open(path).map_err(|source| Error::Io {
        action: "cannot read",
        path: path.to_path_buf(),
        source,
    })?;
    // A regular file too large is refused unread (a pipe or a device is read up to the limit).
    if file
        .metadata()
        .is_ok_and(|m| m.is_file() && m.len() > TABLE_SIZE_LIMIT)
    {
        return Err(too_large(path));
    }
    read_json_from(file, path)
}

fn too_large(path: &Path) -> Error {
    Error::BadPath {
        path: path.to_path_buf(),
        reason: format!(
            "holds more than {} MiB, far more than any rank table",
            TABLE_SIZE_LIMIT >> 20
        ),
    }
}

/// The most of a file read as a rank table: far more than any real one (a table of 10,000
/// servers of 16 devices is about 30 MB), and a bound on what `/dev/zero` or a stray log
/// would cost.
pub const TABLE_SIZE_LIMIT: u64 = 256 << 20;

/// [`read_json_bytes`] of what `reader` gives (a file, standard input), named `path` in
/// errors; at most [`TABLE_SIZE_LIMIT`] bytes.
///
/// # Errors
///
/// As [`read_json`]; [`Error::BadPath`] for more than the limit.
pub fn read_json_from(reader: impl Read, path: &Path) -> Result<(serde_json::Value, Vec<u8>)> {
    let mut bytes = Vec::new();
    reader
        .take(TABLE_SIZE_LIMIT + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| Error::Io {
            action: "cannot read",
            path: path.to_path_buf(),
            source,
        })?;
    if bytes.len() as u64 > TABLE_SIZE_LIMIT {
        return Err(too_large(path));
    }
    // JSON has no byte-order mark; an editor's one would otherwise be "expected value at
    // line 1 column 1".
    if bytes.starts_with(b"\xef\xbb\xbf") {
        return Err(Error::ByteOrderMark {
            path: path.to_path_buf(),
        });
    }
    let value = serde_json::from_slice(&bytes).map_err(|source| Error::Json {
        path: path.to_path_buf(),
        source,
    })?;
    Ok((value, bytes))
}

/// Reads a table file and validates it for `chip`.
///
/// # Errors
///
/// [`Error::Io`] if it cannot be read, [`Error::Json`] if it is not JSON (line and column),
/// [`Error::Invalid`] with every violation.
pub fn read_table(path: &Path, chip: Chip) -> Result<RankTable> {
    RankTable::from_value(read_json(path)?, &path.display().to_string(), chip)
}
