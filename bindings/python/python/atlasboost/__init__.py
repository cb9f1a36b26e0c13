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
