"""Helpers for what crosses the wire: float vectors packed into config bytes."""

from __future__ import annotations

import numpy as np


def pack(a: np.ndarray) -> bytes:
    """A float vector as little-endian float64 bytes (a Flower config ``Scalar``)."""
    return np.ascontiguousarray(a, dtype="<f8").tobytes()


def unpack(b: bytes | None, size: int | None = None) -> np.ndarray | None:
    if b is None or len(b) == 0:
        return None
    a = np.frombuffer(b, dtype="<f8").copy()
    if size is not None and a.size != size:
        raise ValueError(f"expected {size} values, got {a.size}")
    return a
