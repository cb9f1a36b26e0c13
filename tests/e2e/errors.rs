//! Bad input (SPEC: exit codes): each ends with its exit code and one `error:` line that names
//! the culprit, before any worker runs.

use atlasboost_e2e::{Finished, Run};

/// The worker of these tests: it must never get to run.
const RAN: [&str; 4] = ["--", "sh", "-c", "echo WORKER-RAN"];

/// Runs `atlasboost run ARGS` in a directory where `setup` wrote its files.
fn run_with(args: &[&str], setup: impl FnOnce(&Run)) -> Finished {
    let run = Run::new(["run"]).args(args);
    setup(&run);
    run.run()
}

fn assert_error(r: &Finished, code: i32, culprits: &[&str]) {
    r.assert_code(code);
    let errors = r.error_lines();
    assert_eq!(
        errors.len(),
        1,
        "exactly one line starting with `error:`\n{}",
        r.describe()
    );
    for c in culprits {
        assert!(
            errors[0].contains(c),
            "the error names {c:?}: {}\n{}",
            errors[0],
            r.describe()
        );
    }
    assert!(
        !r.out().contains("WORKER-RAN"),
        "no worker may run\n{}",
        r.describe()
    );
}

/// `run ARGS -- <worker>` is refused as a usage error (2), naming the culprits.
fn usage(args: &[&str], culprits: &[&str]) {
    refused(args, 2, culprits);
}

/// `run ARGS -- <worker>` is refused as bad input (125), naming the culprits.
fn bad_input(args: &[&str], culprits: &[&str]) {
    refused(args, 125, culprits);
}

fn refused(args: &[&str], code: i32, culprits: &[&str]) {
    let args: Vec<&str> = args.iter().chain(RAN.iter()).copied().collect();
    assert_error(&run_with(&args, |_| {}), code, culprits);
}

#[test]
fn an_unknown_option_value_is_a_usage_error() {
    usage(
        &["--sim", "2", "-H", "127.0.0.1", "--framework", "foo"],
        &["foo", "--framework"],
    );
}

#[test]
fn a_bad_host_list_is_a_usage_error() {
    usage(&["--sim", "2", "-H", "127.0.0.1:x"], &["127.0.0.1:x"]);
    usage(
        &["--sim", "2", "-H", "127.0.0.1:2,127.0.0.2:0"],
        &["127.0.0.2:0"],
    );
}

#[test]
fn a_bad_hostfile_line_is_named_by_file_and_line() {
    let r = run_with(
        &[
            "--sim",
            "2",
            "--hostfile",
            "hosts.txt",
            RAN[0],
            RAN[1],
            RAN[2],
            RAN[3],
        ],
        |run| {
            run.file(
                "hosts.txt",
                "# comment\n127.0.0.1 slots=2\n127.0.0.2 slots=two\n",
                false,
            );
        },
    );
    assert_error(&r, 2, &["hosts.txt:3", "two"]);
    let r = run_with(
        &[
            "--sim",
            "2",
            "--hostfile",
            "hosts.txt",
            RAN[0],
            RAN[1],
            RAN[2],
            RAN[3],
        ],
        |run| {
            run.file(
                "hosts.txt",
                "127.0.0.1 slots=2\n127.0.0.2 max_slots=4\n",
                false,
            );
        },
    );
    assert_error(&r, 2, &["hosts.txt:2", "max_slots"]);
    // A hostfile that cannot be read is bad input (125), as every file a flag names; so is a
    // --wdir that is not a directory.
    bad_input(
        &["--sim", "2", "--hostfile", "no-such-hostfile"],
        &["cannot read hostfile", "no-such-hostfile"],
    );
    bad_input(
        &["--sim", "2", "--wdir", "no-such-dir"],
        &["--wdir", "no-such-dir: does not exist"],
    );
    bad_input(
        &["--sim", "2", "--wdir", "/proc/version"],
        &["--wdir /proc/version: not a directory"],
    );
}

/// Values that are not UTF-8 where the workers need text are refused naming them: a table
/// path (through `--wdir`'s directory; it was given to the workers with its bad bytes
/// replaced, a file that does not exist, and the job went on), `--rank-table`, and `-x NAME=`
/// (which points to `-x NAME`, whose value goes on byte for byte).
#[test]
fn values_that_are_not_utf8_are_refused_by_name() {
    use std::os::unix::ffi::OsStrExt;
    let bad = |s: &[u8]| std::ffi::OsStr::from_bytes(s).to_os_string();
    // With --mpi too (refused before mpirun would start).
    for mode in [&["--sim", "1"][..], &["--mpi", "--sim", "1"]] {
        let run = Run::new(["run", "-q"]).args(mode).args(["--wdir"]);
        std::fs::create_dir(run.dir().join(bad(b"dir\xfe"))).unwrap();
        let r = run.args([bad(b"dir\xfe")]).args(["--", "true"]).run();
        assert_error(
            &r,
            125,
            &[
                "rank table path",
                "dir\u{fffd}/rank_table.json",
                "is not UTF-8",
            ],
        );
    }
    let r = Run::new(["run", "-q", "--sim", "1", "--rank-table"])
        .args([bad(b"t\xfe.json")])
        .args(["--", "true"])
        .run();
    assert_error(&r, 2, &["--rank-table", "t\u{fffd}.json is not UTF-8"]);
    let r = Run::new(["run", "-q", "--sim", "1", "-x"])
        .args([bad(b"V=x\xff")])
        .args(["--", "true"])
        .run();
    assert_error(
        &r,
        2,
        &["--env", "V=x\u{fffd} is not UTF-8", "give -x NAME"],
    );
    let r = Run::new(["run", "-q", "--sim", "1", "-x", "V", "--", "sh", "-c"])
        .args([r#"test "$V" = "$(printf 'x\377')" && echo same"#])
        .env("V", bad(b"x\xff"))
        .run();
    r.assert_code(0);
    assert!(r.out().contains("same"), "{}", r.describe());
}

#[test]
fn more_workers_than_slots_is_a_usage_error() {
    usage(
        &["--sim", "4", "-n", "9", "-H", "127.0.0.1:4,127.0.0.2:4"],
        &["9"],
    );
    usage(
        &["--sim", "4", "-np", "9", "-H", "127.0.0.1:4,127.0.0.2:4"],
        &["9"],
    );
}

#[test]
fn a_bad_export_is_a_usage_error() {
    usage(
        &["--sim", "2", "-H", "127.0.0.1", "-x", "1BAD=x"],
        &["1BAD"],
    );
    usage(
        &[
            "--sim",
            "2",
            "-H",
            "127.0.0.1",
            "-x",
            "ATLASBOOST_E2E_SURELY_UNSET_VARIABLE",
        ],
        &["ATLASBOOST_E2E_SURELY_UNSET_VARIABLE"],
    );
}

#[test]
fn a_device_the_host_lacks_is_an_atlasboost_failure() {
    let args: Vec<&str> = ["--sim", "8", "-H", "127.0.0.1", "--devices", "9"]
        .iter()
        .chain(RAN.iter())
        .copied()
        .collect();
    let r = run_with(&args, |_| {});
    assert_error(&r, 125, &["127.0.0.1", "--devices", "9"]);
}

#[test]
fn a_remote_host_ssh_cannot_reach_is_named() {
    // 192.0.2.1 is TEST-NET-1 (RFC 5737): never a local address, never reachable, so the
    // launcher's ssh to it fails (at once, or after ssh's ConnectTimeout).
    let args: Vec<&str> = ["--sim", "2", "-H", "127.0.0.1:2,192.0.2.1:2"]
        .iter()
        .chain(RAN.iter())
        .copied()
        .collect();
    assert_error(&run_with(&args, |_| {}), 125, &["192.0.2.1"]);
}

#[test]
fn a_command_that_does_not_exist_exits_127() {
    let r = run_with(
        &[
            "--sim",
            "2",
            "-H",
            "127.0.0.1",
            "--",
            "atlasboost-e2e-no-such-command",
        ],
        |_| {},
    );
    assert_error(&r, 127, &["atlasboost-e2e-no-such-command"]);
    // Not found either when the last PATH entry is a file (the search ends on ENOTDIR).
    let run = Run::new(["run", "--sim", "2", "-H", "127.0.0.1", "--"])
        .args(["atlasboost-e2e-no-such-command"]);
    let file = run.file("not-a-dir", "", false);
    let path = format!(
        "{}:{}",
        std::env::var("PATH").unwrap_or_default(),
        file.display()
    );
    let r = run.env("PATH", path).run();
    assert_error(
        &r,
        127,
        &["atlasboost-e2e-no-such-command", "command not found"],
    );
    let r = run_with(
        &["--sim", "2", "-H", "127.0.0.1", "--", "./missing.sh"],
        |_| {},
    );
    assert_error(&r, 127, &["missing.sh"]);
}

#[test]
fn a_command_that_is_not_executable_exits_126() {
    let r = run_with(
        &["--sim", "2", "-H", "127.0.0.1", "--", "./not-executable.sh"],
        |run| {
            run.file("not-executable.sh", "#!/bin/sh\necho WORKER-RAN\n", false);
        },
    );
    assert_error(
        &r,
        126,
        &["not-executable.sh", "permission denied (not executable)"],
    );
    let r = run_with(
        &["--sim", "2", "-H", "127.0.0.1", "--", "./a-directory"],
        |run| {
            std::fs::create_dir(run.dir().join("a-directory")).unwrap();
        },
    );
    assert_error(&r, 126, &["./a-directory on host", ": it is a directory"]);
    // What a shell also cannot execute (126): a loop of symbolic links, a name too long.
    let r = run_with(&["--sim", "2", "-H", "127.0.0.1", "--", "./loop1"], |run| {
        std::os::unix::fs::symlink("loop2", run.dir().join("loop1")).unwrap();
        std::os::unix::fs::symlink("loop1", run.dir().join("loop2")).unwrap();
    });
    assert_error(&r, 126, &["./loop1 on host", "symbolic links"]);
    let long = format!("./{}", "a".repeat(5000));
    let r = run_with(&["--sim", "2", "-H", "127.0.0.1", "--", &long], |_| {});
    assert_error(&r, 126, &["File name too long"]);
}

/// A script whose `#!` interpreter is missing fails as a missing command does (ENOENT, 127),
/// and the message names the interpreter, not the script that is there.
#[test]
fn a_script_whose_interpreter_is_missing_names_it() {
    let r = run_with(
        &["--sim", "2", "-H", "127.0.0.1", "--", "./old.sh"],
        |run| {
            run.file("old.sh", "#!/nonexistent/python9 -u\nprint(1)\n", true);
        },
    );
    assert_error(
        &r,
        127,
        &[
            "./old.sh on host",
            ": its interpreter \"/nonexistent/python9\" (its #! line) is not found",
        ],
    );
    // A script saved with CRLF line ends: its interpreter is "/bin/sh\r", named so.
    let r = run_with(
        &["--sim", "2", "-H", "127.0.0.1", "--", "./crlf.sh"],
        |run| {
            run.file("crlf.sh", "#!/bin/sh\r\necho hi\r\n", true);
        },
    );
    assert_error(
        &r,
        127,
        &[": its interpreter \"/bin/sh\\r\" (its #! line) is not found"],
    );
}
