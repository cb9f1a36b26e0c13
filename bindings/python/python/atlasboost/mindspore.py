"""atlasboost for MindSpore scripts: `import atlasboost.mindspore as atlasboost`.

The same functions as `atlasboost`; `init()` defaults to `frame="mindspore"`. Importing this
module does not import MindSpore.
"""

from atlasboost import *  # noqa: F403  (the same API as the package)
from atlasboost import __all__ as __all__
from atlasboost._core import init_for

init = init_for("mindspore")
