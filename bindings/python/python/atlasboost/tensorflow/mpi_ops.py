"""The original tool's TensorFlow module: `import atlasboost.tensorflow.mpi_ops as atlasboost`.

The same functions as `atlasboost`; `init()` defaults to `frame="tensorflow"`. Importing this
module does not import TensorFlow.
"""

from atlasboost import *  # noqa: F403  (the same API as the package)
from atlasboost import __all__ as __all__
from atlasboost._core import init_for

init = init_for("tensorflow")
