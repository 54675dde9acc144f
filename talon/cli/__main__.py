"""``python -m talon.cli``: the same as the ``talon`` command."""

import sys

from talon.cli import main

if __name__ == "__main__":
    sys.exit(main())
