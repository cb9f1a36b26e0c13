"""The library-mode API, shared by `atlasboost` and its framework submodules.

The work is done in Rust (`atlasboost._atlasboost`); this module adds what belongs to Python:
the job's variables go to `os.environ`, and `set_device_id` tells MindSpore and torch_npu when
they are installed. Nothing here imports a framework at import time.
"""

import _thread
import os
import sys

from atlasboost import _atlasboost as _native

_shutdown_at_exit = False

# What init() replaced in os.environ: {name: [the launcher's value or None, the value set
# last]}. An init() after shutdown() puts the launcher's values back first (RANK is the
# table's rank after init(), MASTER_ADDR the table's rank 0's host), so that it finds this
# process's place as the first did.
_replaced = {}

# Annotations that newer Pythons spell `str | None` are strings here (3.9 runs this module),
# rather than `from __future__ import annotations`, one import less for `import atlasboost`.


def init(frame: "str | None" = None) -> None:
    """Finds this process's place in the job and makes sure the rank table is written.

    However the process was started: by `atlasboost run` (no network), by `mpirun` (a
    rendezvous over MPI, in a package built with MPI support), by torchrun, Slurm or any
    launcher that sets RANK/WORLD_SIZE/LOCAL_RANK and MASTER_ADDR (a ZeroMQ rendezvous with
    rank 0 as coordinator), or by hand (a world of one, with a note on stderr).

    Then sets the job's variables in `os.environ` (RANK_TABLE_FILE, RANK_ID, RANK_SIZE,
    DEVICE_ID, ...), as the original tool did, so that the framework and child processes see
    them. A second call keeps the first job (and its framework).

    `frame` is "tensorflow", "mindspore" or "pytorch"; the default is the framework of
    `atlasboost run --framework` (ATLASBOOST_FRAMEWORK), else "tensorflow".

    Raises ConfigError (also a ValueError) for a bad `frame`, and the other AtlasBoostError
    subclasses for a failed start. Other Python threads run while it waits for the other
    processes over ZeroMQ (not under MPI, whose rendezvous holds the GIL); a signal handler that
    raises during that wait ends it with its exception, one that returns lets it go on.
    """
    # One init() at a time: another thread's waits here, without the GIL, for the first to be
    # done, and then keeps its job, or raises its failure (rather than wait a whole rendezvous
    # again). Re-entrant: a signal handler's init() during the wait is refused by the native
    # module rather than waiting for itself.
    global _starts, _last_failure
    seen = _starts
    with _init_lock:
        # (Not a KeyboardInterrupt or SystemExit of the other thread's: its own to take.)
        if _starts != seen and isinstance(_last_failure, _native.AtlasBoostError):
            raise _last_failure
        try:
            _init(frame)
        except BaseException as e:
            _last_failure = e
            raise
        else:
            _last_failure = None
        finally:
            _starts += 1


# (`_thread`'s: always loaded; `import atlasboost` imports no more than it needs.)
_init_lock = _thread.RLock()
# How many init() calls have ended, and how the last one failed (None: it did not).
_starts = 0
_last_failure = None


def _init(frame: "str | None") -> None:
    global _shutdown_at_exit
    # Before the rendezvous: its own failure (a timeout) ends the MPI job too.
    _end_the_job_on_failure()
    if _replaced and not _initialized():
        for name, (before, value) in _replaced.items():
            if os.environ.get(name) == value:
                if before is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = before
    env, env_if_unset, env_remove = _native.init(frame)
    # Another way of starting a job (HCCL's CM_*, MindSpore's MS_ROLE): said on stderr.
    for name in env_remove:
        os.environ.pop(name, None)
    for name, value in env:
        _replaced.setdefault(name, [os.environ.get(name), value])[1] = value
        os.environ[name] = value
    for name, value in env_if_unset:
        if name not in os.environ:
            _replaced.setdefault(name, [None, value])[1] = value
            os.environ[name] = value
    if not _shutdown_at_exit:
        # Under mpirun, a process that initialised MPI must finalise it before it exits.
        import atexit

        atexit.register(_native.shutdown)
        _shutdown_at_exit = True
        _watch_failures()


# The stack file faulthandler writes to, kept open for the life of the process.
_stack_file = None

# Whether init() put its hook on sys.excepthook.
_hooked = False


def _end_the_job_on_failure() -> None:
    """An uncaught exception (after the traceback is printed) is recorded in
    ATLASBOOST_ERROR_FILE under `atlasboost run` (the launcher names it as the root cause;
    KeyboardInterrupt is not a failure to record), and ends the whole job under mpirun
    (`MPI_Abort`): MPI_Finalize at exit would wait for every other rank, and they may wait in a
    collective for this one. As `python -m mpi4py` does. Once."""
    global _hooked
    if _hooked:
        return
    _hooked = True
    previous = sys.excepthook

    def record_report_and_abort(kind, value, tb):
        interrupted = kind is not None and issubclass(kind, KeyboardInterrupt)
        try:
            if not interrupted:
                _record(kind, value, tb)
            previous(kind, value, tb)
        finally:
            # MPI_Abort ends the process at once: what Python still buffers (a pipe's stdout
            # is block-buffered) is written first, the failing rank's last lines above all.
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # noqa: BLE001 (a closed or broken stream: nothing to save)
                    pass
            code = 130 if interrupted else 1
            if _native.abort_mpi(code):
                _abort_through_mpi4py(code)

    sys.excepthook = record_report_and_abort


def _abort_through_mpi4py(code: int) -> None:
    """The same ending through mpi4py, for a build without MPI support (whose abort_mpi cannot
    call MPI) in a program that initialised MPI through mpi4py: else its MPI_Finalize at exit
    waits for the other ranks, which wait in a collective for this one, and the job hangs.
    Under `atlasboost run --mpi` (ATLASBOOST_RELAYED=1) only this process ends, without
    MPI_Finalize, as the build with MPI support does."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None:
        return
    try:
        if not mpi.Is_initialized() or mpi.Is_finalized():
            return
        if os.environ.get("ATLASBOOST_RELAYED") == "1":
            os._exit(code)
        mpi.COMM_WORLD.Abort(code)
    except Exception:  # noqa: BLE001 (an mpi4py that cannot abort: the exit goes on as before)
        pass


def _watch_failures() -> None:
    """Under `atlasboost run`: SIGUSR1 writes every thread's stack to ATLASBOOST_STACK_FILE
    (what `--hang-dump` asks for when py-spy is not installed)."""
    global _stack_file
    stacks = os.environ.get("ATLASBOOST_STACK_FILE")
    if stacks and _stack_file is None:
        import faulthandler
        import signal

        try:
            _stack_file = open(stacks, "a")  # noqa: SIM115 (open for the process's life)
            faulthandler.register(signal.SIGUSR1, file=_stack_file, all_threads=True)
        except (OSError, ValueError, AttributeError):
            _stack_file = None


def _record(kind, value, tb) -> None:
    """Writes an exception to ATLASBOOST_ERROR_FILE as torch's `@record` writes its own: the
    first failure of the process is kept."""
    path = os.environ.get("ATLASBOOST_ERROR_FILE")
    if not path or os.path.exists(path) or kind is None:
        return
    import json
    import time
    import traceback

    record = {
        "message": {
            "message": "".join(traceback.format_exception_only(kind, value)).strip(),
            "extraInfo": {
                "py_callstack": "".join(traceback.format_exception(kind, value, tb)),
                "timestamp": f"{time.time():.6f}",
            },
        }
    }
    try:
        partial = f"{path}.{os.getpid()}.tmp"
        with open(partial, "w") as f:
            json.dump(record, f)
        os.replace(partial, path)
    except OSError:
        pass


def record(fn):
    """Decorator for a worker's main function: an exception escaping it is recorded in
    ATLASBOOST_ERROR_FILE before it propagates, so `atlasboost run` names it, with its
    traceback, as the job's root cause (as torch's `torch.distributed.elastic` `@record`).
    SystemExit and KeyboardInterrupt are not failures to record. Needs no `init()`."""
    import functools

    @functools.wraps(fn)
    def recorded(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException:
            _record(*sys.exc_info())
            raise

    return recorded


def heartbeat(step: "int | None" = None) -> bool:
    """Tells `atlasboost run --hang-timeout` that this worker is making progress (`step`: the
    training step, shown when a hang is reported). A rank that prints nothing but beats is
    never reported as hung. Cheap enough for every step; needs no `init()`. Returns whether
    the launcher gave this worker a heartbeat file (`atlasboost run`): False, and nothing is
    done, elsewhere (and where that file cannot be opened: said once on stderr)."""
    try:
        return _native.heartbeat(step)
    except OverflowError:
        # The native message ("too large to convert to C long") names no argument.
        raise OverflowError(f"heartbeat(step={step}): a step is a signed 64-bit integer") from None


def init_for(framework: str):  # -> a function like `init`
    """`init` for a framework's module (`atlasboost.torch`, ...): `frame` defaults to it."""

    def init_framework(frame: str = framework) -> None:
        init(frame)

    init_framework.__doc__ = (
        f'`atlasboost.init`, with `frame="{framework}"` by default.\n\n' + (init.__doc__ or "")
    )
    init_framework.__name__ = init_framework.__qualname__ = "init"
    return init_framework


def rank() -> int:
    """This process's rank: its `rank_id` in the rank table (RANK_ID)."""
    return _native.rank()


def size() -> int:
    """The number of processes of the job (RANK_SIZE)."""
    return _native.size()


def local_rank() -> int:
    """This process's rank among the processes of its host."""
    return _native.local_rank()


def local_size() -> int:
    """The number of processes of this host."""
    return _native.local_size()


def launcher_rank() -> int:
    """This process's rank as its launcher (mpirun, torchrun, ...) numbered it.

    It may differ from `rank()`, which is the rank table's order.
    """
    return _native.launcher_rank()


# The original tool's name (SPEC §10): the rank mpirun gave this process.
mpi_rank = launcher_rank


def device_id() -> int:
    """The logical id of this process's device (DEVICE_ID)."""
    return _native.device_id()


def rank_table_file() -> str:
    """The rank table's absolute path (RANK_TABLE_FILE)."""
    return _native.rank_table_file()


def set_device_id(device_id: int) -> None:
    """Selects this process's device: `device_id` must be its entry in the rank table.

    Sets DEVICE_ID and ASCEND_DEVICE_ID, and selects the device in the job's framework (the
    `frame` of `init()`) where it is installed: MindSpore's (`mindspore.set_device("Ascend",
    id)`, or `set_context(device_id=id)` on older versions) for "mindspore", torch_npu's
    (`torch.npu.set_device(id)`) for "pytorch"; for "tensorflow", the default, whichever of
    the two is installed. A framework that is not installed, or not the job's, is not imported.

    Raises DeviceError naming both devices when `device_id` is not this rank's device, and
    TypeError for what is no integer (a bool included).
    """
    _native.check_device(device_id)
    # check_device took it as an integer (`__index__`): a numpy integer becomes a plain int.
    device_id = int(device_id)
    value = str(device_id)
    os.environ["DEVICE_ID"] = value
    os.environ["ASCEND_DEVICE_ID"] = value
    # init() set it: the frame it was given, or ATLASBOOST_FRAMEWORK's.
    framework = os.environ.get("ATLASBOOST_FRAMEWORK", "tensorflow")
    if framework in ("mindspore", "tensorflow") and _installed("mindspore"):
        import mindspore

        if hasattr(mindspore, "set_device"):
            mindspore.set_device("Ascend", device_id)
        else:
            mindspore.set_context(device_id=device_id)
    if framework in ("pytorch", "tensorflow") and _installed("torch_npu"):
        import torch
        import torch_npu  # noqa: F401  (adds torch.npu)

        torch.npu.set_device(device_id)


def _initialized() -> bool:
    try:
        _native.rank()
    except _native.NotInitializedError:
        return False
    return True


def shutdown() -> None:
    """Ends the job: MPI is finalised if atlasboost initialised it.

    Later calls need `init()` again. Before `init()` it does nothing, so that it is safe in a
    `finally:` block. It also runs when the interpreter exits.
    """
    _native.shutdown()


def mpi_built() -> bool:
    """Whether this build meets over MPI when started by `mpirun` (the `mpi` feature)."""
    return _native.mpi_built()


def build_info() -> dict:
    """What this build of atlasboost has::

        {"version": "0.1.0", "mpi": True, "mpi_library": "Open MPI v4.1.4, ..."}

    `mpi`: whether `init()` meets over MPI under `mpirun` (`pip install` builds it when it
    finds an MPI; without it, plain `mpirun` still works on one host). `mpi_library`: the MPI
    library it runs against, as the library names itself (None without MPI support).
    """
    version, mpi, library = _native.build_info()
    return {"version": version, "mpi": mpi, "mpi_library": library}


def _installed(name: str) -> bool:
    """Whether top-level module `name` can be imported, without importing it."""
    if name in sys.modules:
        return sys.modules[name] is not None
    from importlib.util import find_spec

    try:
        return find_spec(name) is not None
    except (ImportError, ValueError):
        return False
