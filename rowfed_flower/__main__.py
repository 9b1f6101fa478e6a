"""``python -m rowfed_flower fit ...`` (see :mod:`rowfed_flower.cli`)."""

from .cli import main

if __name__ == "__main__":  # not when a worker process imports it
    raise SystemExit(main())
