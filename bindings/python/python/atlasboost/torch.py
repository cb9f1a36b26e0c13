"""atlasboost for PyTorch (torch_npu) scripts: `import atlasboost.torch as atlasboost`.

The same functions as `atlasboost`; `init()` defaults to `frame="pytorch"`. Importing this
module does not import PyTorch.
"""

from atlasboost import *  # noqa: F403  (the same API as the package)
from atlasboost import __all__ as __all__
from atlasboost._core import init_for

init = init_for("pytorch")
