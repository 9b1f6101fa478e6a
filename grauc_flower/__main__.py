"""``python -m grauc_flower``: see :mod:`grauc_flower.cli`."""

import sys

from .cli import main

if __name__ == "__main__":  # not when a worker process imports it
    sys.exit(main())
