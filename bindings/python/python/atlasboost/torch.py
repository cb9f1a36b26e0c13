"""atlasboost for PyTorch (torch_npu) scripts: `import atlasboost.torch as atlasboost`.

The same functions as `atlasboost`; `init()` defaults to `frame="pytorch"`. Importing this
module does not import PyTorch.
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
)
from atlasboost._core import (
    device_id,
    launcher_rank,
    local_rank,
    local_size,
    mpi_built,
    rank,
    rank_table_file,
    set_device_id,
    shutdown,
    size,
)
from atlasboost._core import init as _init


def init(frame: str = "pytorch") -> None:
    """`atlasboost.init`, for PyTorch by default: finds this process's place in the job, makes
    sure the rank table is written, and sets the job's variables in `os.environ`."""
    _init(frame)


__all__ = [
    "AtlasBoostError",
    "ConfigError",
    "DeviceError",
    "LaunchContextError",
    "NotInitializedError",
    "RankTableError",
    "RendezvousError",
    "RendezvousTimeout",
    "device_id",
    "init",
    "launcher_rank",
    "local_rank",
    "local_size",
    "mpi_built",
    "rank",
    "rank_table_file",
    "set_device_id",
    "shutdown",
    "size",
]
