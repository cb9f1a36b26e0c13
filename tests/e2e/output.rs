//! Workers' output (SPEC: output): every line once, whole, in order, tagged; `\r`, a last line
//! without newline and raw bytes; `--no-tag`, `--timestamp`, `--log-dir`, `--ranks`.

use std::time::{Duration, Instant, SystemTime};

use atlasboost_e2e::{Finished, Run};

use crate::split_tag;

const LINES: u64 = 100_000;

/// Checks that `text` has, for each of `ranks`, exactly the lines `rank R <word> 0..LINES` in
/// order, tagged `[R]<stream>:`; other lines must be atlasboost's own (when `own_allowed`).
fn check_bulk(r: &Finished, text: &str, stream: &str, word: &str, ranks: u32, own_allowed: bool) {
    check_bulk_lines(r, text, stream, word, ranks, own_allowed, LINES);
}

/// [`check_bulk`] with `lines` lines per rank instead of `LINES`.
pub(crate) fn check_bulk_lines(
    r: &Finished,
    text: &str,
    stream: &str,
    word: &str,
    ranks: u32,
    own_allowed: bool,
    lines: u64,
) {
    let mut next = vec![0u64; ranks as usize];
    for (n, line) in text.lines().enumerate() {
        let Some((rank, rest)) = split_tag(line, stream) else {
            let own = line.starts_with("atlasboost:")
                || line.starts_with("error:")
                || line.starts_with(' ')
                || line.is_empty();
            assert!(
                own_allowed && own,
                "{stream} line {n} is not a whole tagged worker line: {line:?}"
            );
            continue;
        };
        assert!(rank < ranks, "{stream} line {n}: no rank {rank}: {line:?}");
        let want = format!("rank {rank} {word} {}", next[rank as usize]);
        assert_eq!(
            rest, want,
            "{stream} line {n}: torn, lost, repeated or out of order"
        );
        next[rank as usize] += 1;
    }
    assert!(
        next.iter().all(|&n| n == lines),
        "{stream}: lines per rank {next:?}, expected {lines} each\n{}",
        r.describe()
    );
}

#[test]
fn a_hundred_thousand_lines_per_rank_arrive_whole_once_and_in_order() {
    let awk = format!(
        "BEGIN {{ r = ENVIRON[\"RANK_ID\"]; \
           for (i = 0; i < {LINES}; i++) {{ \
             printf \"rank %s line %d\\n\", r, i; printf \"rank %s err %d\\n\", r, i > \"/dev/stderr\" }} }}"
    );
    let r = Run::new(["run", "--sim", "4", "-H", "127.0.0.1", "--log-dir", "logs"])
        .args(["--", "awk", &awk])
        .timeout(Duration::from_secs(120))
        .run();
    r.assert_code(0);
    check_bulk(&r, &r.out(), "stdout", "line", 4, false);
    check_bulk(&r, &r.err(), "stderr", "err", 4, true);
    for rank in 0..4 {
        for (stream, word) in [("stdout", "line"), ("stderr", "err")] {
            let path = r
                .dir()
                .join(format!("logs/latest/rank.{rank}/{stream}.log"));
            let log = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let want: String = (0..LINES)
                .map(|i| format!("rank {rank} {word} {i}\n"))
                .collect();
            assert!(
                log == want,
                "{} is not every line, untagged",
                path.display()
            );
        }
    }
}

/// Workers that write lines in pieces, slowly, while the others write: each line whole.
#[test]
fn lines_written_in_pieces_are_never_torn_or_interleaved() {
    let script = r#"
import os, sys, time
r = os.environ["RANK_ID"]
for i in range(40):
    sys.stdout.write(f"rank {r} begins {i}")
    sys.stdout.flush()
    time.sleep(0.003)
    sys.stdout.write(" ... ")
    sys.stdout.flush()
    time.sleep(0.003)
    sys.stdout.write(f"ends {i}\n")
    sys.stdout.flush()
# One long line, longer than any pipe buffer, in one write.
sys.stdout.write(r * 300000 + "\n")
sys.stdout.flush()
"#;
    let r = Run::new([
        "run",
        "--sim",
        "4",
        "-H",
        "127.0.0.1",
        "--",
        "python3",
        "-c",
        script,
    ])
    .run();
    r.assert_code(0);
    let by_rank = crate::lines_by_rank(&r.out(), "stdout");
    assert_eq!(by_rank.len(), 4, "{}", r.describe());
    for (rank, lines) in &by_rank {
        let mut want: Vec<String> = (0..40)
            .map(|i| format!("rank {rank} begins {i} ... ends {i}"))
            .collect();
        want.push(rank.to_string().repeat(300_000));
        assert!(
            *lines == want,
            "rank {rank}: lines are torn or out of order: {:?}",
            lines
                .iter()
                .map(|l| l.chars().take(80).collect::<String>())
                .collect::<Vec<_>>()
        );
    }
    assert_eq!(
        r.out().lines().count(),
        4 * 41,
        "nothing but whole tagged lines on stdout"
    );
}

/// One worker writing `\r`-updates (the first after a `\r`, as tqdm writes each bar), raw bytes
/// and a last line without newline, on both streams.
const ODD: &str =
    r"printf '\rp1\rp2\rp3\nraw \377\376\200 end\nlast-no-newline'; printf 'e1\re2\nerr-last' >&2";

fn odd(extra: &[&str]) -> Finished {
    let r = Run::new(["run", "--sim", "1", "-H", "127.0.0.1"])
        .args(extra)
        .args(["--", "sh", "-c", ODD])
        .run();
    r.assert_code(0);
    r
}

/// The stderr lines of workers: those not atlasboost's own.
fn worker_err_lines(r: &Finished, prefix: &str) -> Vec<Vec<u8>> {
    r.stderr
        .split(|b| *b == b'\n')
        .filter(|l| l.starts_with(prefix.as_bytes()))
        .map(<[u8]>::to_vec)
        .collect()
}

#[test]
fn carriage_returns_raw_bytes_and_a_last_line_without_newline() {
    let r = odd(&["--log-dir", "logs"]);
    assert_eq!(
        String::from_utf8_lossy(&r.stdout),
        String::from_utf8_lossy(
            b"[0]<stdout>:p1\n[0]<stdout>:p2\n[0]<stdout>:p3\n[0]<stdout>:raw \xff\xfe\x80 end\n\
              [0]<stdout>:last-no-newline\n"
        ),
        "{}",
        r.describe()
    );
    assert_eq!(
        r.stdout,
        b"[0]<stdout>:p1\n[0]<stdout>:p2\n[0]<stdout>:p3\n[0]<stdout>:raw \xff\xfe\x80 end\n\
          [0]<stdout>:last-no-newline\n",
        "non-UTF-8 bytes pass through unchanged"
    );
    assert_eq!(
        worker_err_lines(&r, "[0]"),
        [
            &b"[0]<stderr>:e1"[..],
            b"[0]<stderr>:e2",
            b"[0]<stderr>:err-last"
        ],
        "{}",
        r.describe()
    );
    let log = |name: &str| std::fs::read(r.dir().join("logs/latest/rank.0").join(name)).unwrap();
    assert_eq!(
        log("stdout.log"),
        b"p1\np2\np3\nraw \xff\xfe\x80 end\nlast-no-newline\n",
        "the log has the same lines, untagged, bytes unchanged"
    );
    assert_eq!(log("stderr.log"), b"e1\ne2\nerr-last\n");
}

#[test]
fn no_tag_prints_the_bare_lines() {
    let r = odd(&["--no-tag"]);
    assert_eq!(
        r.stdout,
        b"p1\np2\np3\nraw \xff\xfe\x80 end\nlast-no-newline\n",
        "{}",
        r.describe()
    );
    let err = r.err();
    for line in ["e1", "e2", "err-last"] {
        assert!(
            err.lines().any(|l| l == line),
            "stderr has {line:?}\n{}",
            r.describe()
        );
    }
    assert!(!err.contains("<stderr>:"), "{}", r.describe());
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `2026-11-30T04:36:20.123Z ` at the start of `line`: milliseconds since the epoch, and the
/// rest of the line.
fn parse_stamp(line: &[u8]) -> Option<(i64, &[u8])> {
    let stamp = std::str::from_utf8(line.get(..25)?).ok()?;
    let b = stamp.as_bytes();
    let shape = b"dddd-dd-ddTdd:dd:dd.dddZ ";
    for (c, s) in b.iter().zip(shape) {
        let ok = if *s == b'd' {
            c.is_ascii_digit()
        } else {
            c == s
        };
        if !ok {
            return None;
        }
    }
    let n = |r: std::ops::Range<usize>| stamp[r].parse::<i64>().ok();
    let days = days_from_civil(n(0..4)?, n(5..7)?, n(8..10)?);
    let (h, mi, s, ms) = (n(11..13)?, n(14..16)?, n(17..19)?, n(20..23)?);
    if !(1..=12).contains(&n(5..7)?) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    Some((
        (((days * 24 + h) * 60 + mi) * 60 + s) * 1000 + ms,
        &line[25..],
    ))
}

#[test]
fn timestamp_starts_every_line_before_the_tag() {
    let before = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let r = odd(&["--timestamp"]);
    let after = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let want: [&[u8]; 5] = [
        b"[0]<stdout>:p1",
        b"[0]<stdout>:p2",
        b"[0]<stdout>:p3",
        b"[0]<stdout>:raw \xff\xfe\x80 end",
        b"[0]<stdout>:last-no-newline",
    ];
    let lines: Vec<&[u8]> = r.stdout.split(|b| *b == b'\n').collect();
    assert_eq!(lines.len(), want.len() + 1, "{}", r.describe());
    assert!(lines[want.len()].is_empty());
    let mut last = 0;
    for (line, want) in lines.iter().zip(want) {
        let (t, rest) = parse_stamp(line).unwrap_or_else(|| {
            panic!(
                "no `2026-11-30T04:36:20.123Z ` at the start of {:?}",
                String::from_utf8_lossy(line)
            )
        });
        assert_eq!(rest, want, "then the tagged line");
        assert!(
            (before - 1000..=after + 1000).contains(&t),
            "the time is now (UTC): {:?}",
            String::from_utf8_lossy(line)
        );
        assert!(t >= last, "times do not go back");
        last = t;
    }
    let err_lines: Vec<Vec<u8>> = r
        .stderr
        .split(|b| *b == b'\n')
        .filter(|l| l.windows(12).any(|w| w == b"[0]<stderr>:"))
        .map(<[u8]>::to_vec)
        .collect();
    assert_eq!(err_lines.len(), 3, "{}", r.describe());
    for l in &err_lines {
        let (_, rest) = parse_stamp(l).unwrap_or_else(|| {
            panic!("stderr line without time: {:?}", String::from_utf8_lossy(l))
        });
        assert!(rest.starts_with(b"[0]<stderr>:"));
    }
}

#[test]
fn ranks_filters_the_console_and_log_dir_keeps_everything() {
    let script = r#"for i in 0 1 2; do echo "out $RANK_ID $i"; echo "err $RANK_ID $i" >&2; done; printf "tail $RANK_ID""#;
    let r = Run::new(["run", "--sim", "4", "-H", "127.0.0.1", "--ranks", "0,2"])
        .args(["--log-dir", "logs", "--", "sh", "-c", script])
        .run();
    r.assert_code(0);
    let out = crate::lines_by_rank(&r.out(), "stdout");
    let err = crate::lines_by_rank(&r.err(), "stderr");
    assert_eq!(
        out.keys().copied().collect::<Vec<_>>(),
        [0, 2],
        "--ranks 0,2 shows only ranks 0 and 2 on stdout\n{}",
        r.describe()
    );
    assert_eq!(
        err.keys().copied().collect::<Vec<_>>(),
        [0, 2],
        "--ranks 0,2 shows only ranks 0 and 2 on stderr\n{}",
        r.describe()
    );
    assert_eq!(
        r.out().lines().count(),
        8,
        "nothing else on stdout\n{}",
        r.describe()
    );
    for rank in [0, 2] {
        assert_eq!(
            out[&rank],
            [
                format!("out {rank} 0"),
                format!("out {rank} 1"),
                format!("out {rank} 2"),
                format!("tail {rank}")
            ]
        );
        assert_eq!(
            err[&rank],
            [
                format!("err {rank} 0"),
                format!("err {rank} 1"),
                format!("err {rank} 2")
            ]
        );
    }
    for rank in 0..4 {
        let dir = r.dir().join(format!("logs/latest/rank.{rank}"));
        let read = |name: &str| {
            std::fs::read_to_string(dir.join(name))
                .unwrap_or_else(|e| panic!("{}/{name}: {e}\n{}", dir.display(), r.describe()))
        };
        assert_eq!(
            read("stdout.log"),
            format!("out {rank} 0\nout {rank} 1\nout {rank} 2\ntail {rank}\n"),
            "rank {rank}'s stdout.log: every line, untagged"
        );
        assert_eq!(
            read("stderr.log"),
            format!("err {rank} 0\nerr {rank} 1\nerr {rank} 2\n"),
            "rank {rank}'s stderr.log: every line, untagged"
        );
    }
}

/// The launcher's stdout may be a non-blocking pipe (a parent left `O_NONBLOCK` on it) that
/// is full for a while: every line must still arrive, whole.
#[test]
fn a_full_non_blocking_stdout_loses_no_line() {
    let r = Run::new([
        "run",
        "--sim",
        "2",
        "-H",
        "127.0.0.1",
        "--",
        "seq",
        "1",
        "20000",
    ])
    .nonblocking_stdout(Duration::from_millis(500))
    .run();
    r.assert_code(0);
    crate::assert_seq_by_rank(
        &r.out(),
        2,
        20_000,
        &format!(
            "stdout non-blocking, read after 0.5 s; last lines of stdout: {:?}\nstderr:\n{}",
            r.out().lines().rev().take(3).collect::<Vec<_>>(),
            r.err()
        ),
    );
    assert_eq!(
        r.out().lines().count(),
        40_000,
        "nothing else, nothing torn"
    );
}

/// `2>&1` into a pipe read slowly: the launcher writes both streams through one non-blocking
/// buffer, so partial writes never cut a line with the other stream's bytes, and every line
/// of each rank and stream arrives, in order.
#[test]
fn both_streams_into_one_slow_pipe_stay_whole_and_ordered() {
    use std::io::Read;
    // Close-on-exec: a job that the other test thread starts meanwhile must not hold it too.
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    let write2 = write.try_clone().unwrap();
    let wdir = tempfile::tempdir().unwrap();
    let mut launcher = std::process::Command::new(atlasboost_e2e::atlasboost_bin())
        .args([
            "run",
            "-q",
            "--sim",
            "2",
            "-H",
            "127.0.0.1",
            "--",
            "sh",
            "-c",
        ])
        .arg("i=0; while [ $i -lt 3000 ]; do echo out$i; echo err$i >&2; i=$((i + 1)); done")
        .current_dir(wdir.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::from(write))
        .stderr(std::process::Stdio::from(write2))
        .spawn()
        .unwrap();
    // A reader slower than the job: 4 KiB, then a pause.
    let mut pipe = std::fs::File::from(read);
    let mut text = Vec::new();
    let mut chunk = vec![0u8; 4096];
    let started = Instant::now();
    loop {
        match pipe.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => text.extend_from_slice(&chunk[..n]),
        }
        std::thread::sleep(Duration::from_millis(2));
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the pipe never closed"
        );
    }
    assert!(launcher.wait().unwrap().success());
    let text = String::from_utf8(text).unwrap();
    let mut next: std::collections::HashMap<(String, String), u32> = Default::default();
    for line in text.lines() {
        // `[r]<stdout>:outN` or `[r]<stderr>:errN`, whole.
        let (tag, body) = line
            .split_once(">:")
            .unwrap_or_else(|| panic!("a torn or untagged line: {line:?}"));
        let (rank, stream) = tag
            .strip_prefix('[')
            .and_then(|t| t.split_once("]<"))
            .unwrap_or_else(|| panic!("a torn line: {line:?}"));
        let want = match stream {
            "stdout" => "out",
            "stderr" => "err",
            _ => panic!("a torn line: {line:?}"),
        };
        let n: u32 = body
            .strip_prefix(want)
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("a torn line: {line:?}"));
        let seen = next
            .entry((rank.to_string(), stream.to_string()))
            .or_insert(0);
        assert_eq!(n, *seen, "rank {rank} {stream} out of order at {line:?}");
        *seen += 1;
    }
    assert_eq!(next.len(), 4, "{next:?}");
    assert!(next.values().all(|&n| n == 3000), "{next:?}");
}

/// A console read only after a while holds the workers' output back longer than
/// `--hang-timeout`: that silence is the console's, not a hang, and nothing is lost.
#[test]
fn a_console_held_back_is_not_a_hang() {
    let r = Run::new([
        "run",
        "--sim",
        "2",
        "-H",
        "127.0.0.1",
        "--hang-timeout",
        "1",
        "--",
        "seq",
        "1",
        "300000",
    ])
    .nonblocking_stdout(Duration::from_secs(3))
    .run();
    r.assert_code(0);
    crate::assert_seq_by_rank(&r.out(), 2, 300_000, &r.err());
}
