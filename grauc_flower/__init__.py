"""GrAUC-PFL on Flower (see README.md); from Python: :class:`GrAUCPFL` (docs/api.md)."""

import strategies  # noqa: F401  (first: single-threaded BLAS before numpy loads)

__all__ = ["GrAUCPFL"]


def __getattr__(name: str):
    # loaded when asked for: a ClientApp imports this package in every message's process
    if name == "GrAUCPFL":
        from .api import GrAUCPFL

        return GrAUCPFL
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
