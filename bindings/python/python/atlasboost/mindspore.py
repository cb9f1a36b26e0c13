"""atlasboost for MindSpore scripts: `import atlasboost.mindspore as atlasboost`.

The same functions as `atlasboost`; `init()` defaults to `frame="mindspore"`. Importing this
module does not import MindSpore.
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


def init(frame: str = "mindspore") -> None:
    """`atlasboost.init`, for MindSpore by default: finds this process's place in the job, makes
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
