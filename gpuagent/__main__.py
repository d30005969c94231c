"""``python -m gpuagent``: the same as the ``gpuagent`` console script."""

import sys

from gpuagent.cli import main

if __name__ == "__main__":
    sys.exit(main())
