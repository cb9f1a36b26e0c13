//! The C ABI as C sees it: `tests/c/test_init.c` compiled with the system C compiler (`cc`, or
//! `$CC`) against `libatlasboost.so` from this test's target directory, then run under
//! `atlasboost run`, alone, and where `init` must fail. The program checks each answer itself
//! (it prints `ok: ...` per check and exits 1 on the first mismatch); these tests check its exit
//! status and its last lines.
//!
//! Every process runs with a time limit: past it, it is killed and the test fails with what it
//! printed.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use atlasboost_e2e::{atlasboost_bin, free_port_pair, is_hermetic};

/// How long any one process (compiler, launcher, program) may take.
const LIMIT: Duration = Duration::from_secs(60);

/// `target/<profile>/deps`, where this test executable is, and where cargo put
/// `libatlasboost.so` when it built the library for this test.
fn deps_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("no current_exe: {e}"));
    exe.parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| panic!("{} has no parent directory", exe.display()))
}

/// The directory with `libatlasboost.so`: next to this test (`deps/`), else `target/<profile>`
/// (where `cargo build -p atlasboost-c` puts it).
fn library_dir() -> PathBuf {
    let deps = deps_dir();
    let candidates = [
        deps.clone(),
        deps.parent().map(Path::to_path_buf).unwrap_or_default(),
    ];
    candidates
        .iter()
        .find(|d| d.join("libatlasboost.so").is_file())
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "no libatlasboost.so in {} or its parent: run `cargo build -p atlasboost-c`",
                deps.display()
            )
        })
}

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// What a finished process left.
#[derive(Debug)]
struct Finished {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    what: String,
}

impl Finished {
    fn show(&self) -> String {
        format!(
            "{}: {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.what, self.status, self.stdout, self.stderr
        )
    }

    fn assert_success(&self) -> &Finished {
        assert!(self.status.success(), "{}", self.show());
        self
    }

    fn assert_stdout_has(&self, text: &str) -> &Finished {
        assert!(self.stdout.contains(text), "no {text:?} in {}", self.show());
        self
    }

    fn assert_stderr_has(&self, text: &str) -> &Finished {
        assert!(self.stderr.contains(text), "no {text:?} in {}", self.show());
        self
    }
}

/// Runs `cmd` in `dir` with the environment cleaned (the tests' one list, [`is_hermetic`];
/// `ATLASBOOST_BIN` names the binary under test), stdin closed and its
/// output in files of `dir`; kills it and fails the test after [`LIMIT`].
fn run(mut cmd: Command, dir: &Path) -> Finished {
    let set_by_test: Vec<_> = cmd.get_envs().map(|(k, _)| k.to_owned()).collect();
    for (name, _) in std::env::vars_os() {
        let n = name.to_string_lossy();
        let launcher_variable = is_hermetic(&n) && n != "ATLASBOOST_BIN";
        if launcher_variable && !set_by_test.contains(&name) {
            cmd.env_remove(&name);
        }
    }
    let what = format!(
        "{} {}",
        cmd.get_program().to_string_lossy(),
        cmd.get_args()
            .map(OsStr::to_string_lossy)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let out_path = dir.join("stdout.txt");
    let err_path = dir.join("stderr.txt");
    let file = |p: &Path| {
        std::fs::File::create(p).unwrap_or_else(|e| panic!("cannot create {}: {e}", p.display()))
    };
    cmd.current_dir(dir)
        .stdin(Stdio::null())
        .stdout(file(&out_path))
        .stderr(file(&err_path));
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    let status = wait_bounded(child, &what);
    let read =
        |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
    let (stdout, stderr) = (read(&out_path), read(&err_path));
    let Some(status) = status else {
        panic!(
            "{what} did not finish within {LIMIT:?}: killed\n--- stdout ---\n{stdout}\n--- stderr \
             ---\n{stderr}"
        );
    };
    Finished {
        status,
        stdout,
        stderr,
        what,
    }
}

/// Waits for `child` at most [`LIMIT`]; past it kills it (SIGKILL: a launcher's lifeline then
/// stops its workers) and returns `None`.
fn wait_bounded(mut child: Child, what: &str) -> Option<ExitStatus> {
    let deadline = Instant::now() + LIMIT;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            Err(e) => panic!("cannot wait for {what}: {e}"),
        }
    }
}

/// `$var`, else `default`: the C compiler is `$CC`, else `cc`.
fn compiler(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_string())
}

/// Fails the test, saying what to install, when `program` cannot be run.
fn require(program: &str, what: &str, var: &str) {
    let found = Command::new(program)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()
        .and_then(|child| wait_bounded(child, program))
        .is_some_and(|status| status.success());
    assert!(
        found,
        "these tests need {what}: `{program}` cannot be run (install gcc and g++, e.g. \
         `apt-get install gcc g++`, or name another one in ${var})"
    );
}

/// A temporary directory for one test: the program, its table and its output.
fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("atlasboost-c-test-")
        .tempdir()
        .unwrap_or_else(|e| panic!("cannot make a temporary directory: {e}"))
}

/// Compiles `source` with `compiler` at language standard `std` (warnings are errors) into
/// `dir/name`, linked to the library found by [`library_dir`], which the program finds again
/// through its rpath.
fn compile(compiler: &str, std: &str, source: &Path, dir: &Path, name: &str) -> PathBuf {
    let lib = library_dir();
    let out = dir.join(name);
    let mut cmd = Command::new(compiler);
    cmd.arg(format!("-std={std}"))
        .args(["-Wall", "-Wextra", "-pedantic", "-Werror", "-I"])
        .arg(crate_dir().join("include"))
        .arg(source)
        .arg("-L")
        .arg(&lib)
        .arg("-latlasboost")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-o")
        .arg(&out);
    run(cmd, dir).assert_success();
    out
}

/// `tests/c/test_init.c` compiled as strict C99, once for all the tests of this file (in
/// cargo's temporary directory for tests).
fn compile_test_program() -> &'static Path {
    static PROGRAM: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PROGRAM.get_or_init(|| {
        let cc = compiler("CC", "cc");
        require(&cc, "a C compiler", "CC");
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("c-program");
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot make {}: {e}", dir.display()));
        let source = crate_dir().join("tests").join("c").join("test_init.c");
        compile(&cc, "c99", &source, &dir, "test_init")
    })
}

/// A job of `ranks` test programs in "launched" mode succeeded, and each rank passed its checks.
fn assert_every_rank_passed(finished: &Finished, ranks: u32) {
    finished.assert_success();
    for rank in 0..ranks {
        finished.assert_stdout_has(&format!("test_init: launched: rank {rank}: "));
    }
    let passed = finished
        .stdout
        .lines()
        .filter(|l| l.contains("test_init: launched: rank ") && l.ends_with(" checks passed"))
        .count();
    assert_eq!(passed, ranks as usize, "{}", finished.show());
    assert!(!finished.stderr.contains("FAILED"), "{}", finished.show());
}

#[test]
fn every_rank_of_a_launched_job_sees_its_own_place() {
    let dir = scratch();
    let program = compile_test_program();
    let mut cmd = Command::new(atlasboost_bin());
    cmd.args(["run", "--sim", "4", "-H", "127.0.0.1:2,127.0.0.2:2", "--"])
        .arg(program)
        .arg("launched");
    let finished = run(cmd, dir.path());
    assert_every_rank_passed(&finished, 4);
    assert!(dir.path().join("rank_table.json").is_file());
}

/// init, finalize, init again, in a job of two processes on two simulated hosts whose names
/// sort against their launcher ranks (the table's rank 0 is launcher rank 1): the first init
/// exports the table's `RANK` over torchrun's, and the second must still find each process's
/// place from the launcher's.
#[test]
fn a_second_init_after_finalize_finds_the_launchers_place_again() {
    let program = compile_test_program();
    let port = free_port_pair().to_string();
    let hosts = ["127.0.0.9", "127.0.0.10"];
    let finished: Vec<Finished> = std::thread::scope(|s| {
        let runs: Vec<_> = hosts
            .iter()
            .enumerate()
            .map(|(rank, host)| {
                let port = &port;
                s.spawn(move || {
                    let dir = scratch();
                    let mut cmd = Command::new(program);
                    cmd.arg("reinit")
                        .env("RANK", rank.to_string())
                        .env("WORLD_SIZE", "2")
                        .env("LOCAL_RANK", "0")
                        .env("LOCAL_WORLD_SIZE", "1")
                        .env("MASTER_ADDR", "127.0.0.1")
                        .env("MASTER_PORT", port)
                        .env("ATLASBOOST_SERVER_ID", host)
                        .env("ATLASBOOST_SIM", "1")
                        .env("ATLASBOOST_RENDEZVOUS_TIMEOUT", "20");
                    run(cmd, dir.path())
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    for (rank, f) in finished.iter().enumerate() {
        f.assert_success()
            .assert_stdout_has(&format!("test_init: reinit: launcher rank {rank}: "));
    }
}

#[test]
fn before_init_every_call_says_to_call_init_first() {
    let dir = scratch();
    let program = compile_test_program();
    let mut cmd = Command::new(program);
    cmd.arg("before-init");
    run(cmd, dir.path())
        .assert_success()
        .assert_stdout_has(
            "ok: rank() before init returns ATLASBOOST_ERR_NOT_INITIALIZED (got -1 = \
             ATLASBOOST_ERR_NOT_INITIALIZED; last error: atlasboost is not initialised: call \
             init() first)",
        )
        .assert_stdout_has("ok: rank_table_file() is NULL before init")
        .assert_stdout_has("expected one of tensorflow, mindspore, pytorch")
        .assert_stdout_has("ok: init(\"caffe\") returns ATLASBOOST_ERR_INVALID_ARGUMENT")
        .assert_stdout_has("test_init: before-init: ")
        // The same words as `atlasboost --version`, for the features this library was built
        // with.
        .assert_stdout_has(&format!(
            "build: atlasboost {} (MPI support: {})\n",
            env!("CARGO_PKG_VERSION"),
            if cfg!(feature = "mpi") { "yes" } else { "no" }
        ));
    // Nothing was initialised, so nothing was written.
    assert!(!dir.path().join("rank_table.json").exists());
}

/// A heartbeat file that cannot be opened: nobody hears the beats (0), and the worker is told
/// once on stderr, since the launcher's watchdog would take it for hung.
#[test]
fn a_heartbeat_file_that_cannot_be_opened_is_said_once() {
    let dir = scratch();
    let program = compile_test_program();
    let mut cmd = Command::new(program);
    cmd.arg("before-init")
        .env("ATLASBOOST_HEARTBEAT_FILE", "/nonexistent/beats");
    let f = run(cmd, dir.path());
    let note = "atlasboost: heartbeat: cannot open ATLASBOOST_HEARTBEAT_FILE=/nonexistent/beats: \
                No such file or directory";
    f.assert_success()
        .assert_stdout_has("ok: heartbeat() alone returns 0 (no launcher listens)")
        .assert_stderr_has(note);
    assert_eq!(f.stderr.matches(note).count(), 1, "{}", f.show());
}

#[test]
fn alone_with_simulated_devices_init_makes_a_world_of_one() {
    let dir = scratch();
    let program = compile_test_program();
    let mut cmd = Command::new(program);
    cmd.arg("alone")
        .env("ATLASBOOST_PROBE", "sim")
        .env("ATLASBOOST_SIM", "2")
        .env("CM_CHIEF_IP", "10.0.0.1");
    run(cmd, dir.path())
        .assert_success()
        .assert_stdout_has("test_init: alone: ")
        .assert_stdout_has("ok: init removed CM_CHIEF_IP")
        .assert_stderr_has("world of one")
        .assert_stderr_has("CM_CHIEF_IP is set, for another way of starting a job");
    assert!(dir.path().join("rank_table.json").is_file());
}

#[test]
fn a_failed_init_returns_the_code_of_its_kind() {
    let dir = scratch();
    let program = compile_test_program();
    // A free port on loopback that nobody answers on: the rendezvous times out.
    let port = free_port_pair().to_string();
    // The fake driver (built with the workspace), for a device that is not healthy.
    let fake_driver = deps_dir()
        .parent()
        .map(|d| d.join("libdrvdsmi_host.so"))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| panic!("no fake driver: run `cargo build -p atlasboost-fake-dsmi`"));
    let fake_driver = fake_driver.to_string_lossy();
    // A launcher's table of 2 ranks on host 10.0.0.1, and a FIFO where a table should be.
    std::fs::write(
        dir.path().join("t.json"),
        r#"{"version": "1.0", "server_count": "1", "server_list": [{"server_id": "10.0.0.1",
            "device": [{"device_id": "0", "device_ip": "192.168.100.101", "rank_id": "0"},
                       {"device_id": "1", "device_ip": "192.168.100.102", "rank_id": "1"}],
            "host_nic_ip": "reserve"}], "status": "completed"}"#,
    )
    .unwrap();
    let fifo = dir.path().join("fifo.json");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let fifo = fifo.to_string_lossy();
    // What `atlasboost run` sets for rank 1 (device 1 of 10.0.0.1) of a job of `size`, whose
    // table is at `table`.
    let launched = |size: &'static str, table: &'static str| -> Vec<(&'static str, String)> {
        [
            ("ATLASBOOST_RANK", "1"),
            ("ATLASBOOST_SIZE", size),
            ("ATLASBOOST_LOCAL_RANK", "1"),
            ("ATLASBOOST_LOCAL_SIZE", "2"),
            ("ATLASBOOST_PHYSICAL_ID", "1"),
            ("ATLASBOOST_DEVICE_ID", "1"),
            ("ATLASBOOST_SERVER_ID", "10.0.0.1"),
            ("ATLASBOOST_JOB_ID", "j"),
            ("ATLASBOOST_RANK_TABLE_FILE", table),
        ]
        .map(|(k, v)| (k, v.to_string()))
        .to_vec()
    };
    // A table of another job: of another size (its path, given relative, is named made
    // absolute), without this device, or not a file at all.
    let other_size = launched("4", "t.json");
    let mut other_host = launched("2", "t.json");
    other_host.push(("ATLASBOOST_SERVER_ID", "10.0.0.9".into()));
    let mut not_a_file = launched("2", "t.json");
    not_a_file.push(("ATLASBOOST_RANK_TABLE_FILE", fifo.to_string()));
    /// The code, the words its message must hold, and the environment.
    type TableCase<'a> = (&'a str, String, Vec<(&'a str, String)>);
    let table_cases: Vec<TableCase<'_>> = vec![
        (
            "ATLASBOOST_ERR_RANK_TABLE",
            format!(
                "ATLASBOOST_SIZE=4 but the rank table holds 2 ranks (ATLASBOOST_RANK_TABLE_FILE={}): \
                 a rank table of another job?",
                dir.path().join("t.json").display()
            ),
            other_size,
        ),
        (
            "ATLASBOOST_ERR_RANK_TABLE",
            "device with physical id 1 of server 10.0.0.9 is not in the rank table \
             (ATLASBOOST_RANK_TABLE_FILE="
                .to_string(),
            other_host,
        ),
        (
            "ATLASBOOST_ERR_RANK_TABLE",
            format!("the rank table {fifo} is not a regular file"),
            not_a_file,
        ),
    ];
    // Each with the words its message must hold (the variable to blame, where one is).
    type Case<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)]);
    let cases: [Case<'_>; 9] = [
        // The driver probe's own settings are settings, not a device's trouble.
        (
            "ATLASBOOST_ERR_CONFIG",
            "ATLASBOOST_DSMI_RETRY_SECS=\"soon\": expected a number of seconds",
            &[
                ("RANK", "0"),
                ("WORLD_SIZE", "1"),
                ("LOCAL_RANK", "0"),
                ("ATLASBOOST_PROBE", "dsmi"),
                ("ATLASBOOST_DSMI_RETRY_SECS", "soon"),
            ],
        ),
        // An unhealthy NPU is a device's trouble, not the table's; the hint fits library mode.
        (
            "ATLASBOOST_ERR_DEVICE",
            "is critical (3); leave it out with --devices (in library mode, hide it with \
             ASCEND_RT_VISIBLE_DEVICES)",
            &[
                ("RANK", "0"),
                ("WORLD_SIZE", "1"),
                ("LOCAL_RANK", "0"),
                ("ATLASBOOST_PROBE", "dsmi"),
                ("ATLASBOOST_DSMI_LIB", &fake_driver),
                ("ATLASBOOST_FAKE_DSMI_DEVICES", "2"),
                ("ATLASBOOST_FAKE_DSMI_FAULTS", "unhealthy:0"),
            ],
        ),
        (
            "ATLASBOOST_ERR_CONFIG",
            "ATLASBOOST_FRAMEWORK=caffe",
            &[("ATLASBOOST_FRAMEWORK", "caffe")],
        ),
        // The probe's settings are settings too, not a device that is missing.
        (
            "ATLASBOOST_ERR_CONFIG",
            "ATLASBOOST_SIM=0: expected a number of simulated devices, 1 to 255",
            &[
                ("RANK", "0"),
                ("WORLD_SIZE", "1"),
                ("LOCAL_RANK", "0"),
                ("ATLASBOOST_SIM", "0"),
            ],
        ),
        (
            "ATLASBOOST_ERR_CONFIG",
            "ATLASBOOST_PROBE=foo: expected auto, dsmi, hccn or sim",
            &[
                ("RANK", "0"),
                ("WORLD_SIZE", "1"),
                ("LOCAL_RANK", "0"),
                ("ATLASBOOST_PROBE", "foo"),
            ],
        ),
        (
            "ATLASBOOST_ERR_CONFIG",
            "ATLASBOOST_PROBE=hccn",
            &[
                ("RANK", "0"),
                ("WORLD_SIZE", "1"),
                ("LOCAL_RANK", "0"),
                ("ATLASBOOST_PROBE", "hccn"),
                ("ATLASBOOST_SIM", "4"),
            ],
        ),
        // Refused also where nobody is met (a world of one), as it is in a larger one.
        (
            "ATLASBOOST_ERR_CONFIG",
            "ATLASBOOST_SECRET is not 64 hexadecimal digits",
            &[
                ("RANK", "0"),
                ("WORLD_SIZE", "1"),
                ("LOCAL_RANK", "0"),
                ("ATLASBOOST_SIM", "1"),
                ("ATLASBOOST_SECRET", "zz"),
            ],
        ),
        (
            "ATLASBOOST_ERR_LAUNCH_CONTEXT",
            "MASTER_ADDR",
            &[("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1")],
        ),
        (
            "ATLASBOOST_ERR_RENDEZVOUS_TIMEOUT",
            "no answer from the coordinator",
            &[
                ("RANK", "1"),
                ("WORLD_SIZE", "2"),
                ("LOCAL_RANK", "1"),
                ("MASTER_ADDR", "127.0.0.1"),
                ("ATLASBOOST_RENDEZVOUS_PORT", &port),
                ("ATLASBOOST_RENDEZVOUS_TIMEOUT", "1"),
                ("ATLASBOOST_PROBE", "sim"),
                ("ATLASBOOST_SIM", "2"),
            ],
        ),
    ];
    let cases = cases.iter().map(|&(code, mentions, env)| {
        let env = env.iter().map(|&(k, v)| (k, v.to_string())).collect();
        (code, mentions.to_string(), env)
    });
    for (code, mentions, env) in table_cases.into_iter().chain(cases) {
        let mut cmd = Command::new(program);
        cmd.args(["init-fails", code]);
        for (k, v) in env {
            cmd.env(k, v);
        }
        run(cmd, dir.path())
            .assert_success()
            .assert_stdout_has(&format!("ok: init(NULL) returns {code}"))
            .assert_stdout_has("test_init: init-fails: ")
            .assert_stdout_has(&mentions);
    }
}

#[test]
fn the_program_fails_on_a_mismatch() {
    // Not under a launcher, "launched" finds no RANK_ID: the program must say so and exit 1,
    // or the tests above could pass without checking anything.
    let dir = scratch();
    let program = compile_test_program();
    let mut cmd = Command::new(program);
    cmd.arg("launched");
    let finished = run(cmd, dir.path());
    assert_eq!(finished.status.code(), Some(1), "{}", finished.show());
    finished.assert_stderr_has("test_init: FAILED (launched): RANK_ID is not set");
}

#[test]
fn the_header_compiles_and_links_as_cpp() {
    let dir = scratch();
    let cxx = compiler("CXX", "c++");
    require(&cxx, "a C++ compiler", "CXX");
    let source = dir.path().join("uses_header.cpp");
    std::fs::write(
        &source,
        "#include \"atlasboost.h\"\n\
         #include <cstdio>\n\
         int main() {\n\
             int rc = atlasboost_rank();\n\
             std::printf(\"%s %s\\n\", atlasboost_error_name(rc), atlasboost_last_error());\n\
             return rc == ATLASBOOST_ERR_NOT_INITIALIZED ? 0 : 1;\n\
         }\n",
    )
    .unwrap_or_else(|e| panic!("cannot write {}: {e}", source.display()));
    // Linking proves the declarations are extern "C" in C++ (no mangled names).
    let out = compile(&cxx, "c++11", &source, dir.path(), "uses_header");
    run(Command::new(&out), dir.path())
        .assert_success()
        .assert_stdout_has(
            "ATLASBOOST_ERR_NOT_INITIALIZED atlasboost is not initialised: call init() first",
        );
}

/// The system libraries a program linked against `libatlasboost.a` needs, as README's "C and
/// C++" section gives them (rustc's `--print native-static-libs`, which lists the C++ runtime
/// that the vendored libzmq needs); an MPI build needs MPI's own too.
const STATIC_LIBS: &[&str] = &[
    "-lstdc++",
    "-lgcc_s",
    "-lpthread",
    "-ldl",
    "-lm",
    "-lrt",
    "-lutil",
];

#[test]
fn the_static_archive_links_with_readmes_libraries_and_runs_a_job() {
    let dir = scratch();
    let cc = compiler("CC", "cc");
    require(&cc, "a C compiler", "CC");
    // Cargo puts the archive beside the shared library.
    let archive = library_dir().join("libatlasboost.a");
    assert!(
        archive.is_file(),
        "no {}: run `cargo build -p atlasboost-c`",
        archive.display()
    );
    let program = dir.path().join("test_init_static");
    let mut cmd = Command::new(&cc);
    cmd.args(["-std=c99", "-Wall", "-Wextra", "-pedantic", "-Werror", "-I"])
        .arg(crate_dir().join("include"))
        .arg(crate_dir().join("tests").join("c").join("test_init.c"))
        .arg(&archive)
        .args(STATIC_LIBS);
    if cfg!(feature = "mpi") {
        // The MPI build links the MPI library the archive was built against.
        let link = Command::new("mpicc")
            .arg("--showme:link")
            .output()
            .unwrap_or_else(|e| panic!("the MPI build's archive needs mpicc --showme:link: {e}"));
        cmd.args(String::from_utf8_lossy(&link.stdout).split_whitespace());
    }
    cmd.arg("-o").arg(&program);
    run(cmd, dir.path()).assert_success();
    // Linked without -L or an rpath: nothing of libatlasboost.so can be loaded at run time.
    let mut job = Command::new(atlasboost_bin());
    job.args(["run", "--sim", "4", "-H", "127.0.0.1:2,127.0.0.2:2", "--"])
        .arg(&program)
        .arg("launched");
    assert_every_rank_passed(&run(job, dir.path()), 4);
    let mut alone = Command::new(&program);
    alone.arg("before-init");
    run(alone, dir.path())
        .assert_success()
        .assert_stdout_has(&format!(
            "build: atlasboost {} (MPI support: {})\n",
            env!("CARGO_PKG_VERSION"),
            if cfg!(feature = "mpi") { "yes" } else { "no" }
        ));
}
