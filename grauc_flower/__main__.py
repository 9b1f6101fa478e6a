"""``python -m grauc_flower``: see :mod:`grauc_flower.cli`."""

import sys

from .cli import main

sys.exit(main())
