"""atlasboost for TensorFlow scripts: `import atlasboost.tensorflow.mpi_ops as atlasboost`, as
the original tool spelled it (`atlasboost.tensorflow` has the same functions). Importing it does
not import TensorFlow.
"""

from atlasboost.tensorflow.mpi_ops import *  # noqa: F403
from atlasboost.tensorflow.mpi_ops import __all__ as __all__
