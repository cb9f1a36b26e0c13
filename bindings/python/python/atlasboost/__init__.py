"""atlasboost: launch distributed training on Huawei Ascend NPU clusters, and find your place
in a job from inside a worker.

Library mode, as in the original tool::

    import atlasboost.tensorflow.mpi_ops as atlasboost   # or atlasboost, atlasboost.mindspore,
    atlasboost.init(frame="tensorflow")                 # atlasboost.torch
    atlasboost.set_device_id(atlasboost.local_rank())

`init()` works under `atlasboost run`, `mpirun` (across hosts when built with MPI support,
which `pip install` does where it finds an MPI: see `build_info()`), torchrun, Slurm, or
alone. Every other function needs `init()` first and raises NotInitializedError
otherwise. Errors are subclasses of AtlasBoostError.

The `atlasboost` command (`atlasboost run --sim 4 -- python3 train.py`) is installed with the
package; `python -m atlasboost` is the same.

Importing atlasboost is cheap: it imports no framework and opens no connection.
"""

# The native module links the MPI library when the package was built with MPI support: where
# that library cannot be loaded (an HPC module not loaded, MPI removed), the import of the API
# fails, naming why and what to do, but `import atlasboost` itself does not, so that the
# `atlasboost` command (a program of its own, started by `atlasboost._cli`) still runs.
try:
    from atlasboost._atlasboost import (
        AtlasBoostError,
        ConfigError,
        DeviceError,
        LaunchContextError,
        NotInitializedError,
        RankTableError,
        RendezvousError,
        RendezvousTimeout,
        __version__,
    )
    from atlasboost._core import (
        build_info,
        device_id,
        heartbeat,
        init,
        launcher_rank,
        local_rank,
        local_size,
        mpi_built,
        mpi_rank,
        rank,
        rank_table_file,
        record,
        set_device_id,
        shutdown,
        size,
    )
except ImportError as _error:
    if isinstance(_error, ModuleNotFoundError) and _error.name != "atlasboost._atlasboost":
        raise
    _unloadable = _error

__all__ = [
    "AtlasBoostError",
    "ConfigError",
    "DeviceError",
    "LaunchContextError",
    "NotInitializedError",
    "RankTableError",
    "RendezvousError",
    "RendezvousTimeout",
    "__version__",
    "build_info",
    "device_id",
    "heartbeat",
    "init",
    "launcher_rank",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_rank",
    "rank",
    "rank_table_file",
    "record",
    "set_device_id",
    "shutdown",
    "size",
]


def __getattr__(name: str) -> object:
    """Only reached when the native module could not be loaded (see the import above)."""
    error = globals().get("_unloadable")
    if error is not None and name in __all__:
        raise ImportError(_why_unloadable(error)) from error
    raise AttributeError(f"module 'atlasboost' has no attribute {name!r}")


def _why_unloadable(error: ImportError) -> str:
    """The message of an API import that failed because the native module could not load."""
    reinstall = "reinstall the package (pip install --force-reinstall ./bindings/python)"
    if isinstance(error, ModuleNotFoundError):
        return f"atlasboost's native module is missing ({error}): {reinstall}"
    # The MPI library by its file name (libmpi.so.40, libmpi.so.12, libmpi_mpifh...), not
    # "mpi" anywhere: a path such as a virtual environment's may hold those letters.
    if "libmpi" in str(error):
        return (
            f"atlasboost's native module cannot be loaded: {error}. This package was built with "
            "MPI support, and the MPI library it was built with cannot be loaded here: make it "
            "loadable (load the MPI it was built with, e.g. `module load openmpi`, or add its "
            "lib directory to LD_LIBRARY_PATH), or reinstall without MPI support "
            "(ATLASBOOST_WITH_MPI=0 pip install --force-reinstall ./bindings/python). The "
            "`atlasboost` command works either way."
        )
    return f"atlasboost's native module cannot be loaded: {error}; {reinstall}"

