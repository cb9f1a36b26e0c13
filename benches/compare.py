#!/usr/bin/env python3
"""Side-by-side benchmarks of `atlasboost run` against OpenMPI's `mpirun` (Python 3 stdlib only).

    python3 benches/compare.py launch [--runs 20] [--cpu RUNS]
    python3 benches/compare.py output [--runs 3] [--lines 250000] [--ranks 8]
    python3 benches/compare.py memory [--ranks 64] [--seconds 5]
    python3 benches/compare.py ssh [--runs 10] [--hosts 3]
    python3 benches/compare.py init [--runs 10]
    python3 benches/compare.py pip [--runs 1] [--warm]
    python3 benches/compare.py restart [--runs 5] [--torchrun PATH] [--python PATH]
    python3 benches/compare.py local-hosts [--runs 3] [--hosts 256,512,1024]
    tests/slurm-cluster.sh python3 benches/compare.py slurm [--runs 10]

- launch: wall time of starting 8 ranks of `true` and waiting for them (targets:
  atlasboost/mpirun median <= 1.0; `atlasboost run --mpi`, which starts mpirun, <= 1.1).
  `wrapper`: mpirun starting a static C program per rank that forks `true` and waits for it,
  the floor of any process between mpirun and each worker (needs a C compiler). `--cpu RUNS`:
  then the CPU time of each kind of process per launch (launcher, relays, mpirun, workers),
  from the scheduler's events under `perf record -a` (needs perf, root): where the launch is
  CPU-bound, a contender's extra wall time is about its extra CPU over the cores.
- output: 8 ranks each print LINES lines as fast as they can; every launcher's stdout goes to a
  file, and the file must hold every line (targets: atlasboost line rate >= 4x mpirun's with
  --tag-output, with and without --mpi, and atlasboost time <= 3x a raw `sh` pipe with no
  launcher at all). `--only ssh-flat,ssh-chain`: half the ranks on each of 2 hosts over a real
  sshd on 127.0.0.2-3, the launch tree flat and a chain (--fanout 1: the second host's lines pass
  through the first host's agent), to compare the rate of lines passed up the tree.
- memory: the launcher's own peak resident memory while 64 ranks print continuously
  (target < 64 MiB).
- ssh: the time from the launcher's start to the last worker started, for 1, 2 and 3 hosts x 4
  workers reached over ssh (a real sshd on 127.0.0.2-4, started by the script), against mpirun
  over the same ssh set-up (`--mca plm_rsh_agent`). Needs openssh-server.
- monitor: the CPU time of the launcher and of each agent over a 60 s job of 2 hosts x 8
  simulated devices over ssh (a real sshd on 127.0.0.2-3), with --monitor-interval 1 against
  off (target: < 1 % of one core extra).
- ssh-netns: the same for 3 and 6 hosts that are network namespaces (each its own sshd, on a
  bridge; run as root), against mpirun with its tree spawn on and against plain ssh sessions to
  every host at once (the floor); `atlasboost-nagle` is atlasboost with ssh's own connection
  (ATLASBOOST_SSH_NODELAY=0). --clean-login gives each sshd a home with Debian's default
  .bashrc in place of this machine's /root (whose .bashrc may run slow tools at every login).
  --kex ALGORITHMS sets ssh's KexAlgorithms for every contender (e.g. curve25519-sha256,
  OpenSSH's default before 9.0). Target: atlasboost <= 0.6x mpirun at 6 hosts.
- init: library mode. 8 example workers (examples/init_worker.rs) calling init() under
  `atlasboost run` and under `mpirun` (MPI rendezvous), against a C program doing only
  MPI_Init + MPI_Allgather + MPI_Finalize under mpirun (target: atlasboost run < 0.5x the bare
  MPI program). Needs `cargo build --release -p atlasboost-examples --examples --features mpi` and mpicc.
- pip: wall time of `pip install ./bindings/python` in a new virtual environment, with MPI
  support required (ATLASBOOST_WITH_MPI=1) and without it (=0), each in an empty cargo target
  directory (--warm: the workspace's). Needs the network to PyPI (pip fetches maturin).
- restart: 8 ranks (atlasboost: 2 local simulated hosts x 4) of a worker that writes its start
  time; rank 3 exits 1 on the first attempt. The time from that exit to the last rank of the
  second attempt starting, `atlasboost run --max-restarts 1 --restart-delay 0` against
  `torchrun --standalone --nproc-per-node 8 --max-restarts 1` (target: atlasboost <= 0.2x
  torchrun), with a shell worker and with a Python one; and the cost of Python's
  `atlasboost.heartbeat()` (target < 2 us). torchrun comes from a virtual environment of the
  benchmark's own (--torchrun, default target/bench-venv/bin/torchrun: `python3 -m venv
  target/bench-venv && target/bench-venv/bin/pip install torch`); the Python package from
  --python (default target/python-venv/bin/python, made by scripts/test-python.sh).
- local-hosts: `atlasboost run --sim 1 -H <N local addresses>` of `true` (every host is this
  machine: 127.0.x.y), against the floor: N `true` started by one shell at once; for N = 256,
  512 and 1,024, with the launcher's peak resident memory (targets: 1,024 hosts <= 3 s and
  <= 64 MiB).

- slurm: inside one Slurm allocation of every node (taken with salloc when not inside one
  already), the launch time of `atlasboost run --launcher slurm --sim 4 -- true` (one srun
  step of agents, the rendezvous, the table, 4 workers per node) against plain `srun -N<nodes>
  --ntasks-per-node=4 true`, which does no table (target: atlasboost <= 1.5x srun), and
  against srun-agents: the step atlasboost itself runs (one task per node, its options), with
  `true` for the agent. Run it inside the real Slurm of tests/slurm-cluster.sh (or any Slurm
  with a few idle nodes).

Needs `cargo build --release -p atlasboost-cli` (or --atlasboost PATH), then, for launch's
`run --mpi`, `scripts/build-static-relay.sh` (the relay each rank runs, static; the launch
prints which relay it measures), and, for launch and output, OpenMPI (`apt-get install
openmpi-bin`). As root, mpirun needs --allow-run-as-root, which these commands pass;
--oversubscribe lets 8 ranks share fewer cores. The exact command lines and the machine are printed first, for docs/PERFORMANCE.md.
`--only` restricts a benchmark to some of its contenders (e.g. `--only mpirun,raw`).
"""

import argparse
import atexit
import math
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_ATLASBOOST = REPO / "target" / "release" / "atlasboost"
MPIRUN_FLAGS = ["--allow-run-as-root", "--oversubscribe"]
# One line as a training script prints it; every rank prints it LINES times.
OUTPUT_LINE = "step 000123 loss 2.345678 lr 0.000100 throughput 1234.5 samples/s"
MEMORY_LINE = "step 000123 loss 2.345678"
MEMORY_LINES_PER_RANK = 2_000_000
DEVICES_PER_HOST = 8


def die(msg):
    print(f"compare.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


def generator(line, lines):
    """The shell pipeline each rank runs: `line` printed `lines` times."""
    return f"yes {shlex.quote(line)} | head -n {lines}"


# ---------------------------------------------------------------- tools and machine


def find_atlasboost(path):
    p = Path(path) if path else DEFAULT_ATLASBOOST
    if not (p.is_file() and os.access(p, os.X_OK)):
        if path:
            die(f"--atlasboost {path}: no such executable file")
        die(f"no atlasboost executable at {p}; build it with `cargo build --release -p atlasboost-cli` in {REPO}")
    return str(p)


def find_mpirun():
    p = shutil.which("mpirun")
    if not p:
        die("mpirun not found; install OpenMPI: apt-get install -y openmpi-bin libopenmpi-dev")
    return p


def first_line(cmd):
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
        text = (out.stdout or out.stderr).strip()
        return text.splitlines()[0] if text else "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def proc_field(path, key):
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def print_machine(tools):
    nproc = len(os.sched_getaffinity(0))
    print("## machine")
    print(f"date:       {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"nproc:      {nproc} ({proc_field('/proc/cpuinfo', 'model name')})")
    mem_kib = proc_field("/proc/meminfo", "MemTotal").split()[0]
    mem = f"{int(mem_kib) / 2**20:.1f} GiB" if mem_kib.isdigit() else "?"
    try:
        load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        load = "?"
    print(f"memory:     {mem}")
    print(f"kernel:     {platform.system()} {os.uname().release}")
    print(f"load:       {load} (1, 5, 15 min, at start)")
    print(f"python:     {platform.python_version()}")
    for name, exe in tools.items():
        print(f"{name + ':':<12}{exe} ({first_line([exe, '--version'])})")
    print()


def show(cmd):
    """A command line to paste into a shell; double quotes where they read better than shlex's."""
    def quote(arg):
        if "'" in arg and not any(c in arg for c in '"$`\\!'):
            return f'"{arg}"'
        return shlex.quote(arg)
    return " ".join(quote(a) for a in cmd)


def print_commands(cmds):
    print("## commands")
    for name, cmd in cmds.items():
        print(f"{name}: {show(cmd)}")
    print()


def print_table(header, rows):
    """A small aligned table: the first column left-aligned, the others right-aligned."""
    rows = [header] + rows
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(header))]
    for n, r in enumerate(rows):
        cells = [str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths))]
        print("  ".join(cells).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))


def verdict(ok):
    return "met" if ok else "NOT MET"


def selected(only, names):
    if not only:
        return list(names)
    chosen = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in names]
    if unknown:
        die(f"--only: unknown {', '.join(unknown)}; choose from {', '.join(names)}")
    return [n for n in names if n in chosen]


# ---------------------------------------------------------------- running


def run_checked(name, cmd, stdout, stderr_path=None, env=None):
    """Run `cmd` to completion and return its wall time in seconds; fail loudly unless it exits 0."""
    if stderr_path is None:
        start = time.perf_counter()
        rc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.DEVNULL,
                            env=env).returncode
        elapsed = time.perf_counter() - start
        tail = "(stderr discarded; run the command by hand to see it)"
    else:
        with open(stderr_path, "wb") as err:
            start = time.perf_counter()
            rc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=stdout, stderr=err, env=env).returncode
            elapsed = time.perf_counter() - start
        tail = Path(stderr_path).read_text(errors="replace")[-2000:] or "(stderr empty)"
    if rc != 0:
        die(f"{name} exited with {rc}: {show(cmd)}\n{tail}")
    return elapsed


def baseline_of(n):
    """The baseline contender of atlasboost contender `n` (`None` if `n` is not one)."""
    if n.startswith("atlasboost"):
        return n.replace("atlasboost", "baseline", 1)
    if n.startswith("ssh-"):
        return f"baseline-{n}"
    return None


def add_baseline(args, names, tools, cmds, envs=None):
    """With --baseline PATH: the same atlasboost commands with that binary (another build, e.g.
    before a change), as contenders `baseline`, `baseline-mpi`, `baseline-ssh-flat`...,
    alternating with the rest (with the same environment, in `envs`)."""
    if not getattr(args, "baseline", None):
        return
    tools["baseline"] = find_atlasboost(args.baseline)
    for n in [n for n in names if baseline_of(n)]:
        b = baseline_of(n)
        cmds[b] = [tools["baseline"], *cmds[n][1:]]
        if envs is not None and n in envs:
            envs[b] = envs[n]
        names.append(b)


def print_baseline_ratios(names, median, what):
    for n in [n for n in names if baseline_of(n) and not n.startswith("baseline")]:
        b = baseline_of(n)
        if b in names:
            print(f"{n}/{b} {what}: {median[n] / median[b]:.2f} (the same work before and after: ~1.00 is within noise)")


def time_alternating(names, cmds, runs):
    """Wall times of `runs` runs of each command, alternating, after 2 warm-up runs of each."""
    print(f"{runs} runs of each, alternating, after 2 warm-up runs of each; stdout and stderr to /dev/null\n")
    times = {n: [] for n in names}
    for _ in range(2):
        for n in names:
            run_checked(n, cmds[n], subprocess.DEVNULL)
    for _ in range(runs):
        for n in names:
            times[n].append(run_checked(n, cmds[n], subprocess.DEVNULL))
    return times


def check_lines(name, path, expected, line):
    """Count the lines of `path` and those that arrived whole; return (bytes, torn lines).

    Every line must arrive: a benchmark that loses lines is wrong, so a short count is fatal.
    A torn line (pieces of two ranks' lines glued together) is reported, not fatal: mpirun
    --tag-output tags each chunk it reads rather than each line, and the raw pipe interleaves
    whatever blocks `head` writes.
    """
    data = Path(path).read_bytes()
    total = data.count(b"\n")
    whole = data.count(line.encode() + b"\n")
    if total != expected:
        die(f"{name} wrote {total} lines to {path}, expected {expected}; first line: {data[:200].splitlines()[:1]}")
    return len(data), total - whole


def scratch_dir():
    """tmpfs if there is one, to keep the disk out of the measurement."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def ms(seconds):
    return f"{seconds * 1000:.1f}"


# ---------------------------------------------------------------- launch


# The least a process per rank can cost under mpirun: fork, exec the rank's command, wait, and
# exit with its code. A statically linked C program, so that no loader's work is counted.
WRAPPER_C = r"""
#include <sys/wait.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (argc < 2) return 2;
    pid_t pid = fork();
    if (pid == 0) { execvp(argv[1], argv + 1); _exit(127); }
    int status;
    if (pid < 0 || waitpid(pid, &status, 0) < 0) return 1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
"""


def build_wrapper(tmp):
    """The per-rank wrapper of WRAPPER_C, compiled with the system's C compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        die("no C compiler for the wrapper contender; install one (apt-get install -y gcc) or leave it out with --only")
    src = Path(tmp) / "wrapper.c"
    src.write_text(WRAPPER_C)
    exe = Path(tmp) / "wrapper"
    # Static where the C library allows it, else as the system links by default.
    if subprocess.run([cc, "-O2", "-static", "-o", str(exe), str(src)], stderr=subprocess.DEVNULL).returncode != 0:
        subprocess.run([cc, "-O2", "-o", str(exe), str(src)], check=True)
    return cc, str(exe)


def describe_relay(atlasboost):
    """Which relay `run --mpi` starts as each rank, as the launcher chooses it (every rank on
    this machine): `atlasboost-relay` beside it, and whether that is statically linked."""
    relay = Path(atlasboost).resolve().parent / "atlasboost-relay"
    if not (relay.is_file() and os.access(relay, os.X_OK)):
        return f"`{atlasboost} relay` (no {relay}: build it with scripts/build-static-relay.sh)"
    check = subprocess.run(["bash", str(REPO / "scripts" / "build-static-relay.sh"), "--check", str(relay)],
                           capture_output=True, text=True)
    said = (check.stdout or check.stderr).strip()
    if check.returncode == 1:
        said += ": scripts/build-static-relay.sh links it statically"
    return said


def cmd_launch(args):
    if args.runs < 1:
        die("--runs must be at least 1")
    if args.cpu < 0:
        die("--cpu must be at least 1 (or 0: off)")
    names = selected(args.only, ["atlasboost", "atlasboost-mpi", "mpirun", "wrapper"])
    tools, cmds = {}, {}
    if "atlasboost" in names or "atlasboost-mpi" in names:
        tools["atlasboost"] = find_atlasboost(args.atlasboost)
    if "atlasboost" in names:
        cmds["atlasboost"] = [tools["atlasboost"], "run", "-q", "--sim", "8", "--", "true"]
    if "atlasboost-mpi" in names:
        # mpirun starts the ranks; each is a relay that runs `true` and reports to atlasboost.
        cmds["atlasboost-mpi"] = [tools["atlasboost"], "run", "-q", "--mpi", "--sim", "8", "--", "true"]
    if "mpirun" in names:
        tools["mpirun"] = find_mpirun()
        # The placement `run --mpi` asks for, so that both start the same mpirun job.
        cmds["mpirun"] = [tools["mpirun"], *MPIRUN_FLAGS, "-np", "8", "-H", "localhost:8",
                          "-bind-to", "none", "-map-by", "slot", "true"]
    tmp = None
    if "wrapper" in names:
        # mpirun starting a process per rank that starts `true`: the floor of any design with
        # a process of its own between mpirun and each worker, as `run --mpi`'s relays are.
        tools.setdefault("mpirun", find_mpirun())
        tmp = tempfile.mkdtemp(prefix="atlasboost-launch-", dir=scratch_dir())
        tools["cc"], wrapper = build_wrapper(tmp)
        cmds["wrapper"] = [tools["mpirun"], *MPIRUN_FLAGS, "-np", "8", "-H", "localhost:8",
                           "-bind-to", "none", "-map-by", "slot", wrapper, "true"]
    add_baseline(args, names, tools, cmds)
    print("# launch: start 8 ranks of `true` and wait for them\n")
    print_machine(tools)
    if "atlasboost-mpi" in names:
        print(f"relay:      {describe_relay(tools['atlasboost'])}\n")
    print_commands(cmds)
    times = time_alternating(names, cmds, args.runs)
    rows = [[n, ms(statistics.median(t)), ms(min(t)), ms(max(t))] for n, t in times.items()]
    print_table(["launcher", "median ms", "min ms", "max ms"], rows)
    if "mpirun" in names:
        print()
        for n, target in (("atlasboost", 1.0), ("atlasboost-mpi", 1.1)):
            if n in names:
                ratio = statistics.median(times[n]) / statistics.median(times["mpirun"])
                print(f"{n}/mpirun median: {ratio:.2f} (target <= {target}: {verdict(ratio <= target)})")
        if "wrapper" in names:
            ratio = statistics.median(times["wrapper"]) / statistics.median(times["mpirun"])
            print(f"wrapper/mpirun median: {ratio:.2f} (no target: the floor of a process per rank)")
    print_baseline_ratios(names, {n: statistics.median(t) for n, t in times.items()}, "median time")
    if args.cpu:
        cpu_budget(names, cmds, args.cpu)
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)


def cpu_budget(names, cmds, runs):
    """CPU time of each kind of process in a launch, from the scheduler's own events (`perf
    record -a` of sched_switch, fork, exec, exit; root): each contender runs `runs` times in a
    loop, and the time every thread of the loop's process tree spent on a CPU is summed by the
    name of its process (the program it last exec'd; a child mpirun forked counts as mpirun
    until it execs; a thread counts as its process). On a machine where the launch is
    CPU-bound, the wall time a contender adds is about the CPU it adds over the cores it
    shares."""
    perf = shutil.which("perf")
    if not perf:
        die("--cpu needs perf (Debian: apt-get install linux-perf)")
    if runs < 1:
        die("--cpu must be at least 1")
    events = "sched:sched_switch,sched:sched_process_fork,sched:sched_process_exec,sched:sched_process_exit"
    budgets = {}
    with tempfile.TemporaryDirectory(prefix="atlasboost-cpu-", dir=scratch_dir()) as tmp:
        for n in names:
            data = Path(tmp) / f"{n}.data"
            pidfile = Path(tmp) / f"{n}.pid"
            loop = ["sh", "-c", f'echo $$ > "{pidfile}"; i=0; while [ $i -lt {runs} ]; do "$@" >/dev/null || exit 1; '
                    'i=$((i+1)); done', "loop", *cmds[n]]
            rec = subprocess.run([perf, "record", "-a", "-e", events, "-o", str(data), "--", *loop],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if rec.returncode != 0:
                die(f"perf record of {n} failed ({rec.returncode}): {rec.stderr.strip()[-400:]}")
            if re.search(r"lost \d+ chunks|lost \d+ events", rec.stderr, re.IGNORECASE):
                die(f"perf record of {n} lost events (the sums would be wrong): {rec.stderr.strip()[-400:]}")
            script = subprocess.run([perf, "script", "-i", str(data), "-F", "comm,pid,tid,cpu,time,event,trace"],
                                    capture_output=True, text=True, check=True)
            budgets[n] = on_cpu_by_name(script.stdout, int(pidfile.read_text()), runs)
            if not budgets[n]:
                die(f"no CPU time found for {n}'s processes in perf's events")
    kinds = sorted({k for b in budgets.values() for k in b}, key=lambda k: -max(b.get(k, 0) for b in budgets.values()))
    rows = [[k, *(f"{budgets[n].get(k, 0.0):.2f}" for n in names)] for k in kinds]
    rows.append(["total", *(f"{sum(budgets[n].values()):.2f}" for n in names)])
    print(f"\n# CPU per launch (ms), by process, mean of {runs} launches each\n")
    print_table(["process", *names], rows)


SCHED_LINE = re.compile(r"\s*(.+?)\s+(\d+)/(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+sched:(\w+):\s+(.*)")


def on_cpu_by_name(script, root, runs):
    """ms on a CPU per launch, by process name, of the threads descended from the process
    `root` in `perf script` output (comm,pid,tid,cpu,time,event,trace): a process is named by
    the program it exec'd last (its parent's name until then); a task leaves the tree at its
    last switch after its exit, so a reused pid is not counted."""
    tree, dying, names, running, spent = {root}, set(), {}, {}, {}
    for line in script.splitlines():
        m = SCHED_LINE.match(line)
        if not m:
            continue
        comm, tgid, tid, cpu, t, event, trace = (m.group(1), int(m.group(2)), int(m.group(3)),
                                                  int(m.group(4)), float(m.group(5)), m.group(6), m.group(7))
        if event == "sched_process_fork" and tid in tree:
            child = re.search(r"child_pid=(\d+)", trace)
            if child:
                tree.add(int(child.group(1)))
                names[int(child.group(1))] = names.get(tgid, comm)
        elif event == "sched_process_exec" and tid in tree:
            names[tgid] = Path(trace.split("filename=", 1)[-1].split()[0]).name or comm
        elif event == "sched_process_exit" and tid in tree:
            dying.add(tid)
        elif event == "sched_switch":
            sw = re.search(r"prev_pid=(\d+) .*next_pid=(\d+)", trace)
            if not sw:
                continue
            prev, following = int(sw.group(1)), int(sw.group(2))
            if cpu in running and running[cpu][0] == prev and prev in tree and prev != root:
                name = names.get(tgid, comm)
                spent[name] = spent.get(name, 0.0) + (t - running[cpu][1]) * 1000
            if prev in dying:
                dying.discard(prev)
                tree.discard(prev)
            running[cpu] = (following, t)
    return {k: v / runs for k, v in spent.items()}

# ---------------------------------------------------------------- init (library mode)

BARE_MPI_C = r"""
#include <mpi.h>
#include <stdlib.h>
/* What every MPI program pays before its first useful collective. */
int main(int argc, char **argv) {
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int *all = malloc(sizeof(int) * size);
    MPI_Allgather(&rank, 1, MPI_INT, all, 1, MPI_INT, MPI_COMM_WORLD);
    int ok = 1;
    for (int i = 0; i < size; i++) ok &= all[i] == i;
    free(all);
    MPI_Finalize();
    return ok ? 0 : 1;
}
"""


def find_init_worker(path):
    p = Path(path) if path else REPO / "target" / "release" / "examples" / "init-worker"
    if not (p.is_file() and os.access(p, os.X_OK)):
        die(f"no init-worker at {p}; build it with `cargo build --release -p atlasboost-examples --examples --features mpi` in {REPO}")
    # Absolute: the workers run in another directory.
    return str(p.resolve())


def cmd_init(args):
    if args.runs < 1:
        die("--runs must be at least 1")
    names = selected(args.only, ["atlasboost", "mpirun-init", "bare-mpi"])
    tmp = tempfile.mkdtemp(prefix="atlasboost-init-", dir=scratch_dir())
    tools, cmds = {}, {}
    worker = find_init_worker(args.init_worker)
    if "atlasboost" in names:
        tools["atlasboost"] = find_atlasboost(args.atlasboost)
        cmds["atlasboost"] = [tools["atlasboost"], "run", "-q", "--sim", "8", "--wdir", tmp, "--", worker]
    if names != ["atlasboost"]:
        tools["mpirun"] = find_mpirun()
    if "mpirun-init" in names:
        cmds["mpirun-init"] = [tools["mpirun"], *MPIRUN_FLAGS, "-np", "8", "-x", "ATLASBOOST_SIM=8",
                               "-x", f"ATLASBOOST_RANK_TABLE_FILE={tmp}/rank_table_mpi.json", worker]
    if "bare-mpi" in names:
        mpicc = shutil.which("mpicc")
        if not mpicc:
            die("mpicc not found; install it: apt-get install -y libopenmpi-dev")
        src = Path(tmp) / "bare_mpi.c"
        src.write_text(BARE_MPI_C)
        exe = Path(tmp) / "bare_mpi"
        subprocess.run([mpicc, "-O2", "-o", str(exe), str(src)], check=True)
        tools["mpicc"] = mpicc
        cmds["bare-mpi"] = [tools["mpirun"], *MPIRUN_FLAGS, "-np", "8", str(exe)]
    print("# init: 8 workers start, learn their rank and device, and have a rank table (or an all-gather)\n")
    print_machine(tools)
    print_commands(cmds)
    times = time_alternating(names, cmds, args.runs)
    shutil.rmtree(tmp, ignore_errors=True)
    rows = [[n, ms(statistics.median(t)), ms(min(t)), ms(max(t))] for n, t in times.items()]
    print_table(["contender", "median ms", "min ms", "max ms"], rows)
    if "bare-mpi" in names:
        base = statistics.median(times["bare-mpi"])
        for n in [n for n in names if n != "bare-mpi"]:
            ratio = statistics.median(times[n]) / base
            target = f" (target < 0.5: {verdict(ratio < 0.5)})" if n == "atlasboost" else ""
            print(f"{n}/bare-mpi median: {ratio:.2f}{target}")


# ---------------------------------------------------------------- output


def cmd_output(args):
    if args.runs < 1 or args.lines < 1 or args.ranks < 1:
        die("--runs, --lines and --ranks must be at least 1")
    # ssh-flat and ssh-chain (the ranks on 3 hosts reached over a real sshd on 127.0.0.2-4; the
    # launch tree flat, and a chain: --fanout 1) only when asked for by --only.
    all_names = ["atlasboost", "atlasboost-mpi", "mpirun", "raw", "ssh-flat", "ssh-chain"]
    names = selected(args.only or "atlasboost,atlasboost-mpi,mpirun,raw", all_names)
    gen = generator(OUTPUT_LINE, args.lines)
    tools, cmds = {}, {}
    if "atlasboost" in names or "atlasboost-mpi" in names:
        tools["atlasboost"] = find_atlasboost(args.atlasboost)
    if "atlasboost" in names:
        cmds["atlasboost"] = [tools["atlasboost"], "run", "-q", "--sim", str(args.ranks), "--", "sh", "-c", gen]
    if "atlasboost-mpi" in names:
        # mpirun starts the ranks; their relays send the lines to atlasboost, which tags them.
        cmds["atlasboost-mpi"] = [tools["atlasboost"], "run", "-q", "--mpi", "--sim", str(args.ranks),
                                  "--", "sh", "-c", gen]
    if "mpirun" in names or "atlasboost-mpi" in names:
        tools["mpirun"] = find_mpirun()
    if "mpirun" in names:
        cmds["mpirun"] = [tools["mpirun"], *MPIRUN_FLAGS, "--tag-output", "-np", str(args.ranks), "sh", "-c", gen]
    if "raw" in names:
        # The same ranks with no launcher: one shell starts them all on one shared pipe, untagged.
        cmds["raw"] = ["sh", "-c", f"{gen} & " * args.ranks + "wait"]
    envs = {}
    if "ssh-flat" in names or "ssh-chain" in names:
        tools["atlasboost"] = find_atlasboost(args.atlasboost)
        if args.ranks % 2 or (args.ranks // 2) not in (1, 2, 4, 8):
            die("ssh-flat and ssh-chain put half the ranks on each of 2 hosts: --ranks 2, 4, 8 or 16")
        ssh_dir = tempfile.TemporaryDirectory(prefix="atlasboost-output-ssh-")
        sshd, config = start_sshd(Path(ssh_dir.name))
        # Stopped whatever happens next (die() exits).
        atexit.register(lambda: (sshd.kill(), sshd.wait(), ssh_dir.cleanup()))
        per = args.ranks // 2
        hl = f"{SSH_HOSTS[0]}:{per},{SSH_HOSTS[1]}:{per}"
        for n, fanout in (("ssh-flat", "32"), ("ssh-chain", "1")):
            if n in names:
                cmds[n] = [tools["atlasboost"], "run", "-q", "--fanout", fanout, "--sim", str(per),
                           "-H", hl, "--", "sh", "-c", gen]
                envs[n] = dict(os.environ, ATLASBOOST_SSH_ALL_HOSTS="1", ATLASBOOST_SSH_OPTIONS=f"-F {config}")
    add_baseline(args, names, tools, cmds, envs)
    expected = args.ranks * args.lines
    where = scratch_dir() or tempfile.gettempdir()
    print(f"# output: {args.ranks} ranks x {args.lines} lines, stdout to a file in {where}\n")
    print_machine(tools)
    print_commands(cmds)
    print(f"{args.runs} runs, the contenders alternating within each; every file must hold all {expected:,} lines\n")

    times = {n: [] for n in names}
    sizes, torn = {}, {n: 0 for n in names}
    with tempfile.TemporaryDirectory(prefix="atlasboost-bench-", dir=scratch_dir()) as tmp:
        for _ in range(args.runs):
            for n in names:
                out_path, err_path = os.path.join(tmp, f"{n}.out"), os.path.join(tmp, f"{n}.err")
                with open(out_path, "wb") as out:
                    times[n].append(run_checked(n, cmds[n], out, err_path, envs.get(n)))
                sizes[n], t = check_lines(n, out_path, expected, OUTPUT_LINE)
                torn[n] = max(torn[n], t)
                os.remove(out_path)

    med = {n: statistics.median(t) for n, t in times.items()}
    rate = {n: expected / med[n] for n in names}
    rows = [
        [n, f"{med[n]:.3f}", f"{min(times[n]):.3f}", f"{max(times[n]):.3f}", f"{rate[n]:,.0f}",
         f"{sizes[n] / med[n] / 2**20:.0f}", f"{torn[n]:,}"]
        for n in names
    ]
    print_table(["way", "median s", "min s", "max s", "lines/s", "MiB/s", "torn lines"], rows)
    print(f"(torn lines: the most, over the runs, that did not arrive whole out of {expected:,})")
    print()
    for n in ("atlasboost", "atlasboost-mpi"):
        if n in names and "mpirun" in names:
            r = rate[n] / rate["mpirun"]
            print(f"{n} rate / mpirun rate: {r:.2f} (target >= 4: {verdict(r >= 4)})")
    if "atlasboost" in names and "raw" in names:
        r = med["atlasboost"] / med["raw"]
        print(f"atlasboost time / raw time:    {r:.2f} (target <= 3: {verdict(r <= 3)})")
    if "mpirun" in names and "raw" in names:
        print(f"mpirun time / raw time:        {med['mpirun'] / med['raw']:.2f} (for reference)")
    print_baseline_ratios(names, med, "median time")
    if "ssh-flat" in names and "ssh-chain" in names:
        print(f"ssh-chain rate / ssh-flat rate: {rate['ssh-chain'] / rate['ssh-flat']:.2f} "
              "(half the lines through an agent above their host, against none)")

    for n in ("atlasboost", "atlasboost-mpi"):
        if torn.get(n):
            print(f"WARNING: {n} tore {torn[n]:,} lines; it should deliver every line whole")


# ---------------------------------------------------------------- memory


def memory_hosts(ranks):
    """ceil(ranks/8) hosts 127.0.0.1, 127.0.0.2, ... of 8 slots each, the last with the remainder."""
    hosts, left = [], ranks
    for i in range(math.ceil(ranks / DEVICES_PER_HOST)):
        slots = min(DEVICES_PER_HOST, left)
        hosts.append(f"127.0.0.{i + 1}:{slots}")
        left -= slots
    return ",".join(hosts)


def read_status_kib(pid):
    """VmHWM and VmRSS of `pid` in KiB, or None once it is gone or a zombie (no Vm* lines)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if line.startswith(("VmHWM", "VmRSS")))
        return int(fields["VmHWM"].split()[0]), int(fields["VmRSS"].split()[0])
    except (OSError, KeyError, ValueError):
        return None


def cmd_memory(args):
    if not 1 <= args.ranks <= 253 * DEVICES_PER_HOST:
        die("--ranks must be between 1 and 2024 (hosts are 127.0.0.1 .. 127.0.0.253)")
    atlasboost = find_atlasboost(args.atlasboost)
    gen = generator(MEMORY_LINE, MEMORY_LINES_PER_RANK)
    cmd = [atlasboost, "run", "-q", "--sim", str(DEVICES_PER_HOST), "-H", memory_hosts(args.ranks),
           "--no-tag", "--", "sh", "-c", gen]
    print(f"# memory: the launcher's peak resident memory, {args.ranks} ranks printing continuously\n")
    print_machine({"atlasboost": atlasboost})
    print_commands({"atlasboost": cmd})
    print(f"stdout to /dev/null; /proc/<pid>/status sampled every 50 ms; SIGINT after {args.seconds} s\n")

    # We read VmHWM, the kernel's high-water mark of the launcher's own resident memory: it
    # catches a peak that falls between two samples, which VmRSS alone would miss. wait4()'s
    # ru_maxrss is no good here: the kernel folds into it the peak of every descendant the
    # launcher has reaped, so it reports max(launcher, largest worker) -- a worker's footprint
    # (a real training script's is gigabytes), not the launcher's.
    hwm = rss = samples = 0
    interrupted = False
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        start = time.perf_counter()
        try:
            while proc.poll() is None:
                status = read_status_kib(proc.pid)
                if status:
                    samples += 1
                    hwm, rss = max(hwm, status[0]), max(rss, status[1])
                elapsed = time.perf_counter() - start
                if not interrupted and elapsed >= args.seconds:
                    proc.send_signal(signal.SIGINT)
                    interrupted = True
                elif interrupted and elapsed >= args.seconds + 30:
                    die("the launcher did not stop within 30 s of SIGINT")  # killed by `finally`
                time.sleep(0.05)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        elapsed = time.perf_counter() - start
        err.seek(0)
        stderr = err.read().decode(errors="replace")[-2000:]
    if not interrupted and proc.returncode != 0:
        die(f"atlasboost exited with {proc.returncode} before the end of the sampling:\n{stderr}")
    if samples == 0:
        die(f"no sample of /proc/<pid>/status was taken; the launcher ended at once:\n{stderr}")

    rc = proc.returncode
    code = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit {rc}"
    how = f"stopped with SIGINT after {args.seconds} s ({code})" if interrupted else "exited 0 by itself"
    print(f"launcher {how}, {elapsed:.1f} s, {samples} samples\n")
    print_table(["launcher", "peak VmHWM MiB", "max VmRSS MiB"], [["atlasboost", f"{hwm / 1024:.1f}", f"{rss / 1024:.1f}"]])
    print(f"\npeak {hwm / 1024:.1f} MiB (target < 64 MiB: {verdict(hwm < 64 * 1024)})")


# ---------------------------------------------------------------- main


# ---------------------------------------------------------------- ssh


SSH_HOSTS = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_sshd(tmp):
    """A real OpenSSH server on a free port of 127.0.0.2-4, with generated keys.

    Returns (sshd process, path of an ssh_config that reaches it)."""
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    if not os.path.exists(sshd):
        die("sshd not found: apt-get install -y openssh-server")
    for key in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / key)], check=True)
    shutil.copy(tmp / "client_key.pub", tmp / "authorized_keys")
    port = free_port()
    listen = "".join(f"ListenAddress {h}\n" for h in SSH_HOSTS)
    (tmp / "sshd_config").write_text(
        f"Port {port}\n{listen}HostKey {tmp}/host_key\nAuthorizedKeysFile {tmp}/authorized_keys\n"
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
        f"KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPidFile {tmp}/sshd.pid\n"
    )
    (tmp / "ssh_config").write_text(
        f"Host *\n  Port {port}\n  IdentityFile {tmp}/client_key\n  IdentitiesOnly yes\n"
        "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
    )
    os.makedirs("/run/sshd", exist_ok=True)
    proc = subprocess.Popen([sshd, "-D", "-f", str(tmp / "sshd_config"), "-E", str(tmp / "sshd.log")])
    import socket
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection((SSH_HOSTS[0], port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                die(f"sshd did not start; its log: {(tmp / 'sshd.log').read_text()}")
            time.sleep(0.05)
    return proc, tmp / "ssh_config"


def time_workers_started(cmds, names, env, stamps, runs, hosts, cwd=None, retry=(), failures=None):
    """Runs each command `runs` times (after one warm-up run of each), alternating; each of its
    4 x `hosts` workers appends its start time (ns) to `stamps`. Returns, per command, the times
    from its start to its last worker's start, in seconds. A contender in `retry` that fails
    is run again (up to 3 times); each failure's last line goes to `failures[name]`."""
    started = {n: [] for n in names}
    for i in range(runs + 1):
        for n in names:
            for _ in range(3 if n in retry else 1):
                stamps.write_text("")
                t0 = time.time_ns()
                r = subprocess.run(cmds[n], env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, timeout=120)
                if r.returncode == 0 or n not in retry:
                    break
                # The first line that says something (Open MPI frames its messages in dashes).
                said = [l.strip() for l in r.stderr.decode(errors="replace").splitlines()
                        if l.strip().strip("-")]
                failures.setdefault(n, []).append(said[0] if said else f"exit {r.returncode}")
            if r.returncode != 0:
                die(f"{n} with {hosts} hosts exited {r.returncode}: {r.stderr.decode(errors='replace')}")
            got = [int(x) for x in stamps.read_text().split()]
            if len(got) != 4 * hosts:
                die(f"{n} with {hosts} hosts started {len(got)} workers, not {4 * hosts}")
            if i > 0:  # the first round warms up
                started[n].append((max(got) - t0) / 1e9)
    return started


def cmd_ssh(args):
    """Time from the launcher's start to the last worker started, over ssh."""
    if args.runs < 1:
        die("--runs must be at least 1")
    names = selected(args.only, ["atlasboost", "mpirun"])
    tools = {}
    if "atlasboost" in names:
        tools["atlasboost"] = find_atlasboost(args.atlasboost)
    if "mpirun" in names:
        tools["mpirun"] = find_mpirun()
    print("# ssh: time from the launcher's start to the last of N hosts x 4 workers started\n")
    print_machine(tools)
    with tempfile.TemporaryDirectory(prefix="atlasboost-ssh-bench-") as d:
        tmp = Path(d)
        sshd, config = start_sshd(tmp)
        try:
            stamps = tmp / "stamps"
            # Each worker appends the time it started, in ns since the epoch.
            worker = ["sh", "-c", f"date +%s%N >> {stamps}"]
            env = dict(os.environ, ATLASBOOST_SSH_ALL_HOSTS="1", ATLASBOOST_SSH_OPTIONS=f"-F {config}")
            rows, ratios = [], []
            for hosts in range(1, args.hosts + 1):
                hl = ",".join(f"{h}:4" for h in SSH_HOSTS[:hosts])
                cmds = {
                    "atlasboost": [str(tools.get("atlasboost")), "run", "-q", "--sim", "4", "-H", hl, "--", *worker],
                    "mpirun": [str(tools.get("mpirun")), *MPIRUN_FLAGS, "--mca", "plm_rsh_agent",
                               f"ssh -F {config}", "-H", hl, "-np", str(4 * hosts), *worker],
                }
                if hosts == 1:
                    print_commands({n: cmds[n] for n in names})
                started = time_workers_started(cmds, names, env, stamps, args.runs, hosts)
                for n in names:
                    t = started[n]
                    rows.append([f"{hosts} x 4", n, ms(statistics.median(t)), ms(min(t)), ms(max(t))])
                if len(names) == 2:
                    ratio = statistics.median(started["atlasboost"]) / statistics.median(started["mpirun"])
                    ratios.append((hosts, ratio))
            print(f"{args.runs} runs of each, alternating, after one warm-up run of each\n")
            print_table(["hosts", "launcher", "median ms", "min ms", "max ms"], rows)
            for hosts, ratio in ratios:
                print(f"{hosts} host(s): atlasboost/mpirun median {ratio:.2f}")
        finally:
            sshd.kill()
            sshd.wait()


# ---------------------------------------------------------------- ssh across network namespaces

def start_netns_hosts(tmp, count, clean_login=False, kex=None):
    """`count` hosts, each a network namespace with its own sshd on port 22, on a bridge with
    10.215.S.1 in the root namespace. With `clean_login`, each sshd (and so every login) sees
    a home of its own in place of /root, with Debian's default .bashrc and .profile. Returns
    (their addresses, an ssh_config, the bridge's name, a function that removes everything)."""
    tag = str(os.getpid())
    bridge, spaces = f"abbb{tag}", [f"abnb{i}-{tag}" for i in range(1, count + 1)]
    used = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True).stdout
    net = next((f"10.215.{n}" for n in range(256) if f" 10.215.{n}." not in used), None)
    if net is None:
        die("every 10.215.S.0/24 subnet is in use")
    procs = []

    def cleanup():
        for p in procs:
            p.kill()
            p.wait()
        for ns in spaces:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except OSError:
                    pass
            subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)
        for i in range(1, count + 1):
            subprocess.run(["ip", "link", "del", f"abvb{i}r{tag}"], stderr=subprocess.DEVNULL)
        subprocess.run(["ip", "link", "del", bridge], stderr=subprocess.DEVNULL)

    def ip(*a):
        r = subprocess.run(["ip", *a], capture_output=True, text=True)
        if r.returncode != 0:
            cleanup()
            die(f"ip {' '.join(a)}: {r.stderr.strip()}")

    ip("link", "add", bridge, "type", "bridge")
    ip("addr", "add", f"{net}.1/24", "dev", bridge)
    ip("link", "set", bridge, "up")
    for key in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / key)], check=True)
    shutil.copy(tmp / "client_key.pub", tmp / "authorized_keys")
    (tmp / "ssh_config").write_text(
        f"Host *\n  IdentityFile {tmp}/client_key\n  IdentitiesOnly yes\n"
        "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
        + (f"  KexAlgorithms {kex}\n" if kex else "")
    )
    os.makedirs("/run/sshd", exist_ok=True)
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    addrs = []
    for i, ns in enumerate(spaces, 1):
        addr = f"{net}.{10 + i}"
        addrs.append(addr)
        ip("netns", "add", ns)
        ip("link", "add", f"abvb{i}r{tag}", "type", "veth", "peer", "name", f"abvb{i}n{tag}", "netns", ns)
        ip("link", "set", f"abvb{i}r{tag}", "master", bridge, "up")
        ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", ns, "addr", "add", f"{addr}/24", "dev", f"abvb{i}n{tag}")
        ip("-n", ns, "link", "set", f"abvb{i}n{tag}", "up")
        conf = tmp / f"sshd-{i}.conf"
        conf.write_text(
            f"ListenAddress {addr}\nPort 22\nHostKey {tmp}/host_key\nAuthorizedKeysFile {tmp}/authorized_keys\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            f"UsePAM no\nStrictModes no\nPidFile {tmp}/sshd-{i}.pid\n"
        )
        run_sshd = [sshd, "-D", "-f", str(conf), "-E", str(tmp / f"sshd-{i}.log")]
        if clean_login:
            home = tmp / "home"
            home.mkdir(exist_ok=True)
            for name in ("bashrc", "profile"):
                shutil.copy(f"/usr/share/base-files/dot.{name}", home / f".{name}")
            # A mount namespace of its own, where that home hides /root.
            run_sshd = ["unshare", "--mount", "sh", "-c", f'mount --bind {home} /root && exec "$@"',
                        "sh", *run_sshd]
        procs.append(subprocess.Popen(["ip", "netns", "exec", ns, *run_sshd]))
    import socket
    deadline = time.monotonic() + 15
    for addr in addrs:
        while True:
            try:
                socket.create_connection((addr, 22), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    cleanup()
                    die(f"sshd on {addr} did not start within 15 s")
                time.sleep(0.05)
    return addrs, tmp / "ssh_config", bridge, cleanup


def cmd_ssh_netns(args):
    """Time from the launcher's start to the last worker started, over ssh to hosts that are
    network namespaces (each its own sshd): atlasboost run against mpirun with its tree spawn."""
    if args.runs < 1:
        die("--runs must be at least 1")
    if os.geteuid() != 0:
        die("needs root (network namespaces)")
    names = selected(args.only, ["atlasboost", "atlasboost-nagle", "mpirun", "ssh"])
    tools = {}
    if "atlasboost" in names or "atlasboost-nagle" in names:
        tools["atlasboost"] = find_atlasboost(args.atlasboost)
    if "mpirun" in names:
        tools["mpirun"] = find_mpirun()
    if args.clean_login and not os.path.exists("/usr/share/base-files/dot.bashrc"):
        die("--clean-login needs Debian's /usr/share/base-files/dot.bashrc")
    sizes = sorted({min(h, args.hosts) for h in (3, args.hosts)})
    print(f"# ssh-netns: time from the launcher's start to the last of N hosts x 4 workers started; "
          f"hosts are network namespaces, each with its own sshd\n")
    print_machine(tools)
    with tempfile.TemporaryDirectory(prefix="atlasboost-ssh-netns-") as d:
        tmp = Path(d)
        addrs, config, _, cleanup = start_netns_hosts(tmp, args.hosts, args.clean_login, args.kex)
        login = "a clean home (Debian's default .bashrc)" if args.clean_login else "this machine's /root"
        # ssh names a KexAlgorithms it does not know when it reads the config.
        checked = subprocess.run(["ssh", "-F", str(config), "-G", addrs[0]], capture_output=True, text=True)
        if checked.returncode != 0:
            cleanup()
            die(f"ssh refuses the config (--kex {args.kex}?): {checked.stderr.strip()}")
        kex = next((l.split(None, 1)[1] for l in checked.stdout.splitlines() if l.startswith("kexalgorithms ")), "?")
        print(f"logins: {login}\nkey exchange offered by ssh: {kex}\n")
        try:
            stamps = tmp / "stamps"
            worker = ["sh", "-c", f"date +%s%N >> {stamps}"]
            env = dict(os.environ, ATLASBOOST_SSH_OPTIONS=f"-F {config}")
            env.pop("ATLASBOOST_SSH_ALL_HOSTS", None)
            rows, ratios, failures = [], [], {}
            for hosts in sizes:
                hl = ",".join(f"{h}:4" for h in addrs[:hosts])
                cmds = {
                    "atlasboost": [str(tools.get("atlasboost")), "run", "-q", "--sim", "4", "-H", hl,
                                   "--wdir", str(tmp), "--", *worker],
                    # ssh's own connection, with Nagle's algorithm on (what the default avoids).
                    "atlasboost-nagle": ["env", "ATLASBOOST_SSH_NODELAY=0", str(tools.get("atlasboost")),
                                         "run", "-q", "--sim", "4", "-H", hl, "--wdir", str(tmp), "--",
                                         *worker],
                    # Its tree spawn on (the default, said explicitly), its daemons on the bridge.
                    "mpirun": [str(tools.get("mpirun")), *MPIRUN_FLAGS, "--mca", "plm_rsh_agent",
                               f"ssh -F {config}", "--mca", "plm_rsh_no_tree_spawn", "0",
                               "--mca", "oob_tcp_if_include", f"{addrs[0].rsplit('.', 1)[0]}.0/24",
                               "-H", hl, "-np", str(4 * hosts), *worker],
                    # The floor: one plain ssh session per host at once, writing 4 stamps.
                    "ssh": ["sh", "-c", " ".join(
                        f"ssh -F {config} {h} 'for i in 1 2 3 4; do date +%s%N >> {stamps}; done' &"
                        for h in addrs[:hosts]) + " wait"],
                }
                if hosts == sizes[0]:
                    print_commands({n: cmds[n] for n in names})
                started = time_workers_started(cmds, names, env, stamps, args.runs, hosts, cwd=tmp,
                                               retry=("mpirun",), failures=failures)
                for n in names:
                    t = started[n]
                    rows.append([f"{hosts} x 4", n, ms(statistics.median(t)), ms(min(t)), ms(max(t))])
                if "atlasboost" in names:
                    for other in ("mpirun", "ssh", "atlasboost-nagle"):
                        if other in names:
                            ratio = statistics.median(started["atlasboost"]) / statistics.median(started[other])
                            ratios.append((hosts, other, ratio))
            print(f"{args.runs} runs of each, alternating, after one warm-up run of each\n")
            print_table(["hosts", "launcher", "median ms", "min ms", "max ms"], rows)
            for hosts, other, ratio in ratios:
                print(f"{hosts} host(s): atlasboost/{other} median {ratio:.2f}")
            for n, said in failures.items():
                print(f"{n} failed {len(said)} time(s), each run again; it said: {'; '.join(sorted(set(said)))}")
        finally:
            cleanup()


# ---------------------------------------------------------------- slurm

def cmd_slurm(args):
    """Launch time inside one Slurm allocation: atlasboost run --launcher slurm against srun."""
    if args.runs < 1:
        die("--runs must be at least 1")
    if "SLURM_JOB_ID" not in os.environ:
        # One allocation for every run of both, as a user's salloc would hold it.
        nodes = args.nodes or len(os.environ.get("SLURM_CLUSTER_NODES", "x x x").split())
        cmd = ["salloc", f"-N{nodes}", "--quiet", sys.executable, *sys.argv]
        os.execvp(cmd[0], cmd)
    nodes = int(os.environ.get("SLURM_JOB_NUM_NODES", "0")) or die("SLURM_JOB_NUM_NODES is not set")
    names = selected(args.only, ["atlasboost", "srun", "srun-agents"])
    tools = {"atlasboost": find_atlasboost(args.atlasboost), "srun": shutil.which("srun") or die("no srun")}
    cmds = {
        "atlasboost": [str(tools["atlasboost"]), "run", "-q", "--launcher", "slurm", "--sim", "4",
                       "--wdir", tempfile.gettempdir(), "--", "true"],
        "srun": ["srun", f"-N{nodes}", "--ntasks-per-node=4", "true"],
        # The step atlasboost itself runs, with `true` for the agent: what srun costs it.
        "srun-agents": ["srun", f"-N{nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
                        "--cpu-bind=none", "--whole", "--input=all", "--label", "--unbuffered", "true"],
    }
    print(f"# slurm: start {nodes} nodes x 4 ranks of `true` and wait for them, in allocation "
          f"{os.environ['SLURM_JOB_ID']} ({os.environ.get('SLURM_JOB_NODELIST')})\n")
    print_machine(tools)
    print_commands({n: cmds[n] for n in names})
    times = time_alternating(names, cmds, args.runs)
    rows = [[n, ms(statistics.median(t)), ms(min(t)), ms(max(t))] for n, t in times.items()]
    print_table(["launcher", "median ms", "min ms", "max ms"], rows)
    if "atlasboost" in names and "srun" in names:
        ratio = statistics.median(times["atlasboost"]) / statistics.median(times["srun"])
        print(f"\natlasboost/srun median: {ratio:.2f} (target <= 1.5: {verdict(ratio <= 1.5)})")
    if "atlasboost" in names and "srun-agents" in names:
        ratio = statistics.median(times["atlasboost"]) / statistics.median(times["srun-agents"])
        print(f"atlasboost/srun-agents median: {ratio:.2f} (what atlasboost adds to its own step)")


# ---------------------------------------------------------------- monitoring overhead

def proc_cpu_seconds(pid):
    """CPU seconds `pid` has run so far (its main thread, from /proc/PID/schedstat: in
    nanoseconds, where /proc/PID/stat counts 10 ms ticks), or None once it is gone."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def watch_cpu(cmd, env):
    """Runs `cmd` to its end, sampling every 0.2 s the CPU seconds of every process of its
    binary (`cmd[0]`: the launcher and its lifeline, the agents and theirs; not other jobs' of
    other builds). Returns (wall seconds, launcher's CPU seconds, agents' CPU seconds)."""
    seen = {}
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    while proc.poll() is None:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if not cmdline or cmdline[0] != os.fsencode(cmd[0]):
                continue
            cpu = proc_cpu_seconds(pid)
            if cpu is not None:
                seen[pid] = (b"agent" in cmdline[1:2], cpu)
        time.sleep(0.2)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        die(f"{show(cmd)} exited {proc.returncode}: {proc.stderr.read().decode(errors='replace')[-2000:]}")
    launcher = sum(cpu for agent, cpu in seen.values() if not agent)
    agents = sum(cpu for agent, cpu in seen.values() if agent)
    return wall, launcher, agents


def cmd_monitor(args):
    """CPU time of the launcher and of an agent with monitoring every second, 16 simulated
    devices on 2 hosts over ssh, against monitoring off, in one run."""
    if args.runs < 1 or args.seconds < 1:
        die("--runs and --seconds must be at least 1")
    tool = str(find_atlasboost(args.atlasboost))
    print(f"# monitor: CPU of the launcher and the agents over {args.seconds} s, 2 hosts x 8 simulated "
          "devices over ssh, --monitor-interval 1 against off\n")
    print_machine({"atlasboost": tool})
    with tempfile.TemporaryDirectory(prefix="atlasboost-monitor-") as d:
        tmp = Path(d)
        sshd, config = start_sshd(tmp)
        atexit.register(lambda: (sshd.kill(), sshd.wait()))
        env = dict(os.environ, ATLASBOOST_SSH_ALL_HOSTS="1", ATLASBOOST_SSH_OPTIONS=f"-F {config}")
        hl = f"{SSH_HOSTS[0]}:8,{SSH_HOSTS[1]}:8"
        runs = {"on (1 s)": [], "off": []}
        for _ in range(args.runs):
            for name, interval in (("on (1 s)", "1"), ("off", "off")):
                cmd = [tool, "run", "-q", "--sim", "8", "-H", hl, "--monitor-interval", interval,
                       "--", "sleep", str(args.seconds)]
                runs[name].append(watch_cpu(cmd, env))
        print_table(["monitoring", "launcher CPU s", "per agent CPU s", "wall s"], [
            [name, f"{l:.3f}", f"{a / 2:.3f}", f"{w:.1f}"] for name, rs in runs.items() for w, l, a in rs
        ])
        med = {n: (statistics.median(l for _, l, _ in rs), statistics.median(a / 2 for _, _, a in rs))
               for n, rs in runs.items()}
        extra_l = (med["on (1 s)"][0] - med["off"][0]) / args.seconds * 100
        extra_a = (med["on (1 s)"][1] - med["off"][1]) / args.seconds * 100
        print(f"\nextra CPU with monitoring every second (medians): the launcher {extra_l:.3f} % of one core, "
              f"an agent {extra_a:.3f} % (target < 1 %)")

    # The output benchmark's job (8 local ranks printing as fast as they can), with monitoring
    # every second and without, alternating: its line rate must not change beyond noise.
    lines = 250_000
    gen = generator(OUTPUT_LINE, lines)
    times = {"on (1 s)": [], "off": []}
    with tempfile.TemporaryDirectory(prefix="atlasboost-monitor-out-", dir=scratch_dir()) as d:
        for _ in range(max(3, args.runs)):
            for name, interval in (("on (1 s)", "1"), ("off", "off")):
                out_path = os.path.join(d, "out")
                cmd = [tool, "run", "-q", "--sim", "8", "--monitor-interval", interval, "--", "sh", "-c", gen]
                with open(out_path, "wb") as out:
                    times[name].append(run_checked(name, cmd, out))
                check_lines(name, out_path, 8 * lines, OUTPUT_LINE)
    rate = {n: 8 * lines / statistics.median(t) for n, t in times.items()}
    print()
    print_table(["monitoring", "median s", "min s", "max s", "lines/s"], [
        [n, f"{statistics.median(t):.3f}", f"{min(t):.3f}", f"{max(t):.3f}", f"{rate[n]:,.0f}"]
        for n, t in times.items()
    ])
    print(f"\noutput rate with monitoring every second / without: {rate['on (1 s)'] / rate['off']:.2f}")


# ---------------------------------------------------------------- pip install


def cmd_pip(args):
    """Wall time of `pip install ./bindings/python` as a user runs it (an isolated build), with
    MPI support required and without it; cold (an empty cargo target directory) unless --warm."""
    if args.runs < 1:
        die("--runs must be at least 1")
    print("# pip: `pip install ./bindings/python`, with MPI support (ATLASBOOST_WITH_MPI=1) and without (=0)\n")
    print_machine({"cargo": shutil.which("cargo") or "cargo", "mpicc": shutil.which("mpicc") or "mpicc"})
    print(f"{'warm: the workspace target/ directory, already built' if args.warm else 'cold: a new, empty CARGO_TARGET_DIR for every build'}; "
          f"a new virtual environment for every build; {args.runs} run(s) of each, alternating\n")
    times = {"with MPI": [], "without MPI": []}
    for _ in range(args.runs):
        for name, value in (("with MPI", "1"), ("without MPI", "0")):
            with tempfile.TemporaryDirectory(prefix="atlasboost-pip-") as d:
                venv = Path(d) / "venv"
                subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
                env = dict(os.environ, ATLASBOOST_WITH_MPI=value, PIP_DISABLE_PIP_VERSION_CHECK="1")
                if not args.warm:
                    env["CARGO_TARGET_DIR"] = str(Path(d) / "target")
                cmd = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(REPO / "bindings" / "python")]
                log = Path(d) / "pip.log"
                times[name].append(run_checked(f"pip install ({name})", cmd, subprocess.DEVNULL, log, env))
                info = subprocess.run([str(venv / "bin" / "python"), "-c",
                                       "import atlasboost; print(atlasboost.build_info()['mpi'])"],
                                      capture_output=True, text=True, check=True).stdout.strip()
                if info != ("True" if value == "1" else "False"):
                    die(f"pip install ({name}) built a package whose build_info()['mpi'] is {info}")
    rows = [[n, f"{statistics.median(t):.0f}", f"{min(t):.0f}", f"{max(t):.0f}"] for n, t in times.items()]
    print_table(["build", "median s", "min s", "max s"], rows)


# ---------------------------------------------------------------- restart

RESTART_SH = """#!/bin/sh
# Writes its start time; rank 3 fails on the first attempt, the others wait to be stopped.
attempt=${ATLASBOOST_RESTART_COUNT:-$TORCHELASTIC_RESTART_COUNT}
t=$(date +%s.%N)
echo "$t" > "$BENCH_DIR/start.$attempt.$RANK"
if [ "$attempt" = 0 ]; then
    if [ "$RANK" = 3 ]; then date +%s.%N > "$BENCH_DIR/fail"; exit 1; fi
    exec sleep 30
fi
"""

RESTART_PY = """import os, sys, time
t = time.time()
attempt = os.environ.get("ATLASBOOST_RESTART_COUNT") or os.environ["TORCHELASTIC_RESTART_COUNT"]
rank, d = os.environ["RANK"], os.environ["BENCH_DIR"]
open(f"{d}/start.{attempt}.{rank}", "w").write(repr(t))
if attempt == "0":
    if rank == "3":
        open(f"{d}/fail", "w").write(repr(time.time()))
        sys.exit(1)
    time.sleep(30)
"""

HEARTBEAT_PY = """import os, sys, tempfile, time
os.environ["ATLASBOOST_HEARTBEAT_FILE"] = os.path.join(tempfile.mkdtemp(), "beat")
import atlasboost
assert atlasboost.heartbeat(0)
n = 1_000_000
best = None
for _ in range(5):
    t = time.perf_counter()
    for i in range(n):
        atlasboost.heartbeat(i)
    per = (time.perf_counter() - t) / n
    best = per if best is None else min(best, per)
t = time.perf_counter()
for i in range(n):
    pass
print(best, (time.perf_counter() - t) / n)
"""


def restart_latency(name, cmd, bench_dir, env):
    """One restart: seconds from rank 3's failure to the last rank of attempt 1 starting."""
    for f in Path(bench_dir).iterdir():
        f.unlink()
    run_checked(name, cmd, subprocess.DEVNULL, env={**env, "BENCH_DIR": bench_dir})
    fail = float(Path(bench_dir, "fail").read_text())
    starts = [float(Path(bench_dir, f"start.1.{r}").read_text()) for r in range(8)]
    return max(starts) - fail


HANG_SH = """#!/bin/sh
# Rank 1 writes the time and goes silent; the others print every 50 ms.
if [ "$RANK" = 1 ]; then date +%s.%N > "$BENCH_DIR/silent"; exec sleep 30; fi
i=0; while [ $i -lt 600 ]; do echo tick; i=$((i+1)); sleep 0.05; done
"""


def hang_detection(atlasboost, tmp, env, runs, timeout=1.1):
    """The watchdog's detection latency: from a rank's last sign of life to the launcher's
    report, minus --hang-timeout."""
    sh = Path(tmp, "hang.sh")
    sh.write_text(HANG_SH)
    sh.chmod(0o755)
    bench_dir = Path(tmp, "hang")
    bench_dir.mkdir(exist_ok=True)
    cmd = [atlasboost, "run", "--sim", "4", "--hang-timeout", str(timeout), "--grace", "0.5", "--", str(sh)]
    print("## hang detection\n")
    print_commands({"atlasboost": cmd})
    late = []
    for _ in range(runs):
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             env={**env, "BENCH_DIR": str(bench_dir)}, text=True)
        reported = None
        for line in p.stderr:
            if "hang:" in line and reported is None:
                reported = time.time()
        if p.wait() != 124 or reported is None:
            die(f"the hang was not reported (exit {p.returncode}): {show(cmd)}")
        late.append(reported - float(Path(bench_dir, "silent").read_text()) - timeout)
    print(f"{runs} runs: reported {ms(statistics.median(late))} ms after the timeout (median; "
          f"min {ms(min(late))}, max {ms(max(late))}); the watch looks every 250 ms\n")


def cmd_restart(args):
    names = selected(args.only, ["atlasboost", "torchrun"])
    tools = {}
    if "atlasboost" in names:
        tools["atlasboost"] = find_atlasboost(args.atlasboost)
    if "torchrun" in names:
        torchrun = Path(args.torchrun) if args.torchrun else REPO / "target" / "bench-venv" / "bin" / "torchrun"
        if not torchrun.is_file():
            die(f"no torchrun at {torchrun}: python3 -m venv target/bench-venv && "
                "target/bench-venv/bin/pip install torch (or --torchrun PATH, or --only atlasboost)")
        tools["torchrun"] = str(torchrun)
    tmp = tempfile.mkdtemp(prefix="atlasboost-restart-", dir=scratch_dir())
    sh = Path(tmp, "worker.sh")
    sh.write_text(RESTART_SH)
    sh.chmod(0o755)
    py = Path(tmp, "worker.py")
    py.write_text(RESTART_PY)
    python = sys.executable
    bench_dir = Path(tmp, "out")
    bench_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATLASBOOST_", "TORCHELASTIC_"))}
    print("# restart: from rank 3's failure to the last rank of attempt 1 started, 8 ranks\n")
    print_machine(tools)
    for worker, program in (("shell", [str(sh)]), ("python", [python, str(py)])):
        cmds = {}
        if "atlasboost" in names:
            cmds["atlasboost"] = [tools["atlasboost"], "run", "-q", "--sim", "4", "-H", "127.0.0.1,127.0.0.2",
                                  "--max-restarts", "1", "--restart-delay", "0", "--", *program]
        if "torchrun" in names:
            tr = [tools["torchrun"], "--standalone", "--nproc-per-node", "8", "--max-restarts", "1"]
            cmds["torchrun"] = [*tr, "--no-python", *program] if worker == "shell" else [*tr, str(py)]
        print(f"## {worker} worker\n")
        print_commands(cmds)
        times = {n: [] for n in names}
        for _ in range(args.runs):
            for n in names:
                times[n].append(restart_latency(n, cmds[n], str(bench_dir), env))
        rows = [[n, ms(statistics.median(t)), ms(min(t)), ms(max(t))] for n, t in times.items()]
        print(f"{args.runs} runs of each, alternating\n")
        print_table(["launcher", "median ms", "min ms", "max ms"], rows)
        if len(names) == 2:
            ratio = statistics.median(times["atlasboost"]) / statistics.median(times["torchrun"])
            print(f"\natlasboost/torchrun median: {ratio:.2f} (target <= 0.2: {verdict(ratio <= 0.2)})\n")
    if "atlasboost" in names:
        hang_detection(tools["atlasboost"], tmp, env, args.runs)
    python_pkg = Path(args.python) if args.python else REPO / "target" / "python-venv" / "bin" / "python"
    if python_pkg.is_file():
        out = subprocess.run([str(python_pkg), "-c", HEARTBEAT_PY], capture_output=True, text=True, env=env)
        if out.returncode != 0:
            die(f"timing atlasboost.heartbeat() failed:\n{out.stderr}")
        per_call, empty = (float(x) for x in out.stdout.split())
        print(f"atlasboost.heartbeat(step) in Python: {per_call * 1e9:.0f} ns per call, best of 5 x 1,000,000 "
              f"(an empty loop: {empty * 1e9:.0f} ns) (target < 2 us: {verdict(per_call < 2e-6)})")
    else:
        print(f"(no Python package at {python_pkg}: heartbeat() not timed; run scripts/test-python.sh)")
    shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------- local hosts


def local_host_list(n):
    """N addresses of this machine: 127.0.0.1 ... (250 per /24), one device each."""
    return ",".join(f"127.0.{i // 250}.{i % 250 + 1}:1" for i in range(n))


def run_measured(cmd):
    """Wall time and the child's own peak resident memory (KiB), failing loudly unless it exits 0."""
    start = time.perf_counter()
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    elapsed = time.perf_counter() - start
    err = p.stderr.read().decode(errors="replace")
    p.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        die(f"exit {os.waitstatus_to_exitcode(status)}: {show(cmd[:6])} ...\n{err[-2000:]}")
    return elapsed, usage.ru_maxrss


def cmd_local_hosts(args):
    atlasboost = find_atlasboost(args.atlasboost)
    sizes = [int(x) for x in args.hosts.split(",")]
    print("# local hosts: N hosts x 1 device of `true`, every host this machine\n")
    print_machine({"atlasboost": atlasboost})
    print(f"{args.runs} runs of each, alternating; the floor: one shell starting N `true` at once\n")
    rows = []
    for n in sizes:
        ab = [atlasboost, "run", "-q", "--sim", "1", "-H", local_host_list(n), "--", "true"]
        floor = ["sh", "-c", f"i=0; while [ $i -lt {n} ]; do true & i=$((i+1)); done; wait"]
        t_ab, t_floor, mem = [], [], []
        for _ in range(args.runs):
            t, kib = run_measured(ab)
            t_ab.append(t)
            mem.append(kib)
            t_floor.append(run_measured(floor)[0])
        med_ab, med_floor = statistics.median(t_ab), statistics.median(t_floor)
        rows.append([str(n), f"{med_ab:.3f}", f"{med_floor:.3f}", f"{med_ab / med_floor:.1f}",
                     f"{max(mem) / 1024:.1f}"])
    print_table(["hosts", "atlasboost s", "floor s", "ratio", "peak MiB"], rows)
    if 1024 in sizes:
        r = rows[sizes.index(1024)]
        ok = float(r[1]) <= 3.0 and float(r[4]) <= 64
        print(f"\n1,024 hosts: {r[1]} s, {r[4]} MiB (targets <= 3 s and <= 64 MiB: {verdict(ok)})")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="bench", required=True, metavar="BENCH")

    def add(name, help, only):
        s = sub.add_parser(name, help=help, description=help)
        s.add_argument("--atlasboost", metavar="PATH", help=f"the atlasboost binary (default {DEFAULT_ATLASBOOST})")
        if name in ("launch", "output"):
            s.add_argument("--baseline", metavar="PATH",
                           help="another atlasboost binary (e.g. before a change), run alternating as `baseline`")
        if only:
            s.add_argument("--only", metavar="LIST", help=f"only these, comma-separated: {only}")
        return s

    s = add("launch", "Time starting 8 ranks of `true`: atlasboost run (and run --mpi) vs mpirun.",
            "atlasboost,atlasboost-mpi,mpirun")
    s.add_argument("--runs", type=int, default=20, help="timed runs of each (default 20)")
    s.add_argument("--cpu", type=int, metavar="RUNS", default=0,
                   help="then run each RUNS times more under `perf record -a` and print the CPU time of each "
                        "kind of process per launch (needs perf and root)")
    s.set_defaults(func=cmd_launch)

    s = add("init", "Library mode: 8 init-workers under atlasboost run and under mpirun vs a bare MPI "
            "program (MPI_Init + MPI_Allgather + MPI_Finalize).", "atlasboost,mpirun-init,bare-mpi")
    s.add_argument("--runs", type=int, default=10, help="timed runs of each (default 10)")
    s.add_argument("--init-worker", metavar="PATH", help="the init-worker (default target/release/examples/init-worker)")
    s.set_defaults(func=cmd_init)

    s = add("output", "Line throughput of 8 chatty ranks: atlasboost run (and run --mpi) vs mpirun "
            "--tag-output vs a raw pipe; with --only ssh-flat,ssh-chain, over ssh to 3 hosts with "
            "the launch tree flat and a chain.", "atlasboost,atlasboost-mpi,mpirun,raw,ssh-flat,ssh-chain")
    s.add_argument("--runs", type=int, default=3, help="runs of each (default 3)")
    s.add_argument("--lines", type=int, default=250_000, help="lines per rank (default 250000)")
    s.add_argument("--ranks", type=int, default=8, help="ranks (default 8)")
    s.set_defaults(func=cmd_output)

    s = add("memory", "Peak resident memory of the atlasboost launcher with many chatty ranks.", None)
    s.add_argument("--ranks", type=int, default=64, help="ranks, 8 per simulated host (default 64)")
    s.add_argument("--seconds", type=float, default=5, help="SIGINT the launcher after this long (default 5)")
    s.set_defaults(func=cmd_memory)

    s = add("ssh", "Time to all workers started on 1..3 hosts x 4 over ssh: atlasboost run vs mpirun.",
            "atlasboost,mpirun")
    s.add_argument("--runs", type=int, default=10, help="timed runs of each (default 10)")
    s.add_argument("--hosts", type=int, default=3, choices=[1, 2, 3], help="up to this many hosts (default 3)")
    s.set_defaults(func=cmd_ssh)

    s = add("monitor", "CPU of the launcher and an agent with --monitor-interval 1 (16 simulated devices, "
            "2 hosts over ssh) against monitoring off.", None)
    s.add_argument("--runs", type=int, default=1, help="runs of each (default 1)")
    s.add_argument("--seconds", type=int, default=60, help="how long each job runs (default 60)")
    s.set_defaults(func=cmd_monitor)

    s = add("ssh-netns", "Time to all workers started on 3 and 6 namespace hosts x 4 over ssh: "
            "atlasboost run vs mpirun (tree spawn on) vs plain ssh sessions (the floor).",
            "atlasboost,atlasboost-nagle,mpirun,ssh")
    s.add_argument("--runs", type=int, default=10, help="timed runs of each (default 10)")
    s.add_argument("--hosts", type=int, default=6, help="the most hosts (default 6; also 3)")
    s.add_argument("--kex", metavar="ALGORITHMS",
                   help="KexAlgorithms for every contender's ssh (in the shared ssh_config)")
    s.add_argument("--clean-login", action="store_true",
                   help="each sshd gets a home with Debian's default .bashrc in place of /root")
    s.set_defaults(func=cmd_ssh_netns)

    s = add("restart", "Time from a failed rank to every rank restarted: atlasboost --max-restarts vs "
            "torchrun --max-restarts; and the cost of heartbeat().", "atlasboost,torchrun")
    s.add_argument("--runs", type=int, default=5, help="restarts timed of each (default 5)")
    s.add_argument("--torchrun", metavar="PATH", help="torchrun (default target/bench-venv/bin/torchrun)")
    s.add_argument("--python", metavar="PATH",
                   help="a Python with the atlasboost package (default target/python-venv/bin/python)")
    s.set_defaults(func=cmd_restart)

    s = add("slurm", "Launch time in one Slurm allocation: atlasboost run --launcher slurm vs srun.",
            "atlasboost,srun,srun-agents")
    s.add_argument("--runs", type=int, default=10, help="timed runs of each (default 10)")
    s.add_argument("--nodes", type=int, help="nodes to allocate (default: SLURM_CLUSTER_NODES's, else 3)")
    s.set_defaults(func=cmd_slurm)

    s = add("local-hosts", "Launch time and peak memory of N local simulated hosts against N `true` from a shell.",
            None)
    s.add_argument("--runs", type=int, default=3, help="runs of each size (default 3)")
    s.add_argument("--hosts", default="256,512,1024", help="host counts, comma-separated (default 256,512,1024)")
    s.set_defaults(func=cmd_local_hosts)

    s = sub.add_parser("pip", help=cmd_pip.__doc__, description=cmd_pip.__doc__)
    s.add_argument("--runs", type=int, default=1, help="builds of each (default 1: a cold build takes minutes)")
    s.add_argument("--warm", action="store_true", help="build in the workspace's target/ (what was built stays)")
    s.set_defaults(func=cmd_pip)

    args = p.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # results in order with errors, even through a pipe
    args.func(args)


if __name__ == "__main__":
    main()
