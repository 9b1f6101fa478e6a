"""``python -m rowfed_flower fit ...`` (see :mod:`rowfed_flower.cli`)."""

from .cli import main

raise SystemExit(main())
