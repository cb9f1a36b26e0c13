//! Snapshots (`insta`) of what users read: `--help` of every command, and the main error
//! messages. A wording change fails here until its new snapshot is reviewed and accepted
//! (`cargo insta review`, or `INSTA_UPDATE=always cargo test -p atlasboost-cli` and a look at
//! the diff), so no message changes by accident.

use std::path::Path;

use crate::cli::{Output, run_env, tempdir};

/// What a user sees: the exit code, then standard output and standard error, with the test's
/// temporary directory written as `<dir>`.
fn shown(out: &Output, dir: &Path) -> String {
    let dir = dir.display().to_string();
    format!(
        "exit {}\n--- stdout\n{}--- stderr\n{}",
        out.code,
        out.stdout.replace(&dir, "<dir>"),
        out.stderr.replace(&dir, "<dir>")
    )
}

#[test]
fn help_of_every_command() {
    let dir = tempdir();
    for command in [
        &[][..],
        &["run"],
        &["ranktable"],
        &["merge"],
        &["validate"],
        &["probe"],
    ] {
        let args: Vec<&str> = command.iter().copied().chain(["--help"]).collect();
        // clap wraps help at $COLUMNS when not on a terminal: one width everywhere.
        let out = run_env(dir.path(), &args, &[("COLUMNS", "100")]);
        let name = if command.is_empty() {
            "help".to_string()
        } else {
            format!("help_{}", command[0])
        };
        insta::assert_snapshot!(name, shown(&out, dir.path()));
    }
}

/// A snapshot's name, the arguments, and variables to set.
type Case<'a> = (&'a str, &'a [&'a str], &'a [(&'a str, &'a str)]);

/// The main refusals, one per family: flags that contradict each other, bad hosts, bad
/// exports, bad ranks, a table that breaks HCCL's rules, what is missing.
#[test]
fn main_error_messages() {
    let dir = tempdir();
    std::fs::write(
        dir.path().join("hosts"),
        "node1 slots=4\nnode2 slots=four\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("bad.json"),
        r#"{"version": "1.0", "server_count": "1", "status": "completed",
            "server_list": [{"server_id": "10.0.0.1", "device": [
              {"device_id": "0", "device_ip": "192.168.1.1", "rank_id": "0"},
              {"device_id": "0", "device_ip": "192.168.1.1", "rank_id": "2"}]}]}"#,
    )
    .unwrap();
    let cases: &[Case] = &[
        (
            "probe_sim_without_a_count",
            &["probe", "--probe", "sim"],
            &[],
        ),
        (
            "sim_and_a_real_probe",
            &["probe", "--sim", "2", "--probe", "dsmi"],
            &[],
        ),
        (
            "hostfile_line",
            &["run", "--sim", "2", "--hostfile", "hosts", "--", "true"],
            &[],
        ),
        (
            "export_not_set",
            &[
                "run",
                "--sim",
                "2",
                "-x",
                "E2E_NOT_SET_ANYWHERE",
                "--",
                "true",
            ],
            &[],
        ),
        (
            "ranks_beyond_the_job",
            &["run", "--sim", "2", "-n", "2", "--ranks", "5", "--", "true"],
            &[],
        ),
        (
            "grace_not_a_number",
            &["run", "--grace", "soon", "--", "true"],
            &[],
        ),
        ("empty_command", &["run", "--sim", "2", "--", ""], &[]),
        ("invalid_table", &["validate", "bad.json"], &[]),
        ("missing_table", &["validate", "missing.json"], &[]),
        ("merge_needs_two_tables", &["merge", "bad.json"], &[]),
        (
            "sim_faults_malformed",
            &["probe", "--sim", "2"],
            &[("ATLASBOOST_SIM_FAULTS", "0:melted")],
        ),
    ];
    for (name, args, env) in cases {
        let out = run_env(dir.path(), args, env);
        assert_ne!(out.code, 0, "{name}: {args:?} must fail\n{out:#?}");
        insta::assert_snapshot!(format!("error_{name}"), shown(&out, dir.path()));
    }
}
