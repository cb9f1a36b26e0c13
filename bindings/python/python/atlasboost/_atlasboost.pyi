"""Type stubs of the native module `atlasboost._atlasboost` (bindings/python/src/lib.rs).

Use the `atlasboost` package: these functions are its implementation.
"""

__version__: str

class AtlasBoostError(Exception):
    """The base of every error atlasboost raises."""

class ConfigError(AtlasBoostError, ValueError):
    """A value is malformed: init()'s frame, or an ATLASBOOST_* variable."""

class LaunchContextError(AtlasBoostError):
    """A launcher's variables are partly set, malformed, or not enough to meet."""

class DeviceError(AtlasBoostError):
    """A process has no device, or set_device_id() was given another rank's device."""

class RendezvousError(AtlasBoostError):
    """The processes of the job could not agree on the rank table."""

class RendezvousTimeout(RendezvousError):
    """The rendezvous ran out of time: a process never arrived."""

class RankTableError(AtlasBoostError):
    """The rank table cannot be built, validated, read or written."""

class NotInitializedError(AtlasBoostError):
    """A call that needs init() came before it (or after shutdown())."""

def init(frame: str | None = None) -> tuple[list[tuple[str, str]], list[tuple[str, str]], list[str]]:
    """Initialises the job once; returns its variables: (to set, to set where unset, to remove)."""

def rank() -> int: ...
def size() -> int: ...
def local_rank() -> int: ...
def local_size() -> int: ...
def launcher_rank() -> int: ...
def device_id() -> int: ...
def rank_table_file() -> str: ...
def check_device(device_id: int) -> None:
    """Raises DeviceError unless `device_id` is this rank's device in the table."""

def shutdown() -> None: ...
def abort_mpi(code: int) -> bool: ...
def mpi_built() -> bool: ...
def build_info() -> tuple[str, bool, str | None]:
    """(version, MPI support, the MPI library's version line or None)."""

def heartbeat(step: int | None = None) -> bool:
    """Progress, for `atlasboost run --hang-timeout`; whether a launcher listens."""
