"""`python -m atlasboost ...`: the same as the `atlasboost` command."""

import sys

from atlasboost._cli import main

if __name__ == "__main__":
    sys.exit(main())
