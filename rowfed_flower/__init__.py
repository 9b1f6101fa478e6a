"""RowFed on Flower (see README.md); from Python: :class:`RowFed` (docs/api.md)."""

import strategies  # noqa: F401  (first: single-threaded BLAS before numpy loads)

__all__ = ["RowFed"]


def __getattr__(name: str):
    # loaded when asked for: a ClientApp imports this package in every message's process
    if name == "RowFed":
        from .api import RowFed

        return RowFed
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
