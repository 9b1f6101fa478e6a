"""What crosses the wire: float vectors packed into config bytes, and Flower's
``Parameters`` (each tensor one ``.npy`` file) encoded and decoded without ``np.save`` /
``np.load`` per array.

A federated tuning moves hundreds of thousands of small arrays a run (every fit's point
for every site, every round); ``np.load`` parses each header with ``ast.literal_eval``
(about 25 us an array) and ``np.save`` formats one.  The headers repeat -- the same dtype
and shape, round after round -- so :func:`to_parameters` and :func:`from_parameters` keep
the headers they have seen and otherwise only copy bytes.  The bytes are exactly
``np.save``'s (``allow_pickle=False``: Flower's ``ndarrays_to_parameters``), so either end
may use Flower's functions instead; anything unusual (a header not yet seen, a version
other than 1.0, an object array) goes through numpy itself, with numpy's errors.
"""

from __future__ import annotations

import io

import numpy as np
from flwr.common import Parameters

TENSOR_TYPE = "numpy.ndarray"
#: At most this many headers are kept each way (then the cache starts again).
MAX_HEADERS = 512
_MAGIC_V1 = b"\x93NUMPY\x01\x00"

_headers_out: dict[tuple, bytes] = {}
_headers_in: dict[bytes, tuple[np.dtype, tuple[int, ...], bool, int]] = {}


def pack(a: np.ndarray) -> bytes:
    """A float vector as little-endian float64 bytes (a Flower config ``Scalar``)."""
    return np.ascontiguousarray(a, dtype="<f8").tobytes()


def unpack(b: bytes | None, size: int | None = None) -> np.ndarray | None:
    """The float vector of :func:`pack`'s bytes.

    Parameters
    ----------
    b : bytes or None
        Little-endian float64 bytes.
    size : int, optional
        The number of values expected; a different count is a ``ValueError``.

    Returns
    -------
    ndarray or None
        A writable copy; ``None`` for ``None`` or empty bytes.
    """
    if b is None or len(b) == 0:
        return None
    a = np.frombuffer(b, dtype="<f8").copy()
    if size is not None and a.size != size:
        raise ValueError(f"expected {size} values, got {a.size}")
    return a


def _save(a: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, a, allow_pickle=False)
    return out.getvalue()


def array_bytes(a) -> bytes:
    """``a`` as the bytes ``np.save(..., allow_pickle=False)`` writes."""
    a = np.asarray(a)
    if a.dtype.hasobject:
        return _save(a)  # numpy refuses it, with its own error
    fortran = bool(a.flags.f_contiguous and not a.flags.c_contiguous)
    key = (a.dtype, a.shape, fortran)
    header = _headers_out.get(key)
    data = a.tobytes(order="F" if fortran else "C")
    if header is None:
        whole = _save(a)
        header = whole[: len(whole) - len(data)]
        if len(_headers_out) >= MAX_HEADERS:
            _headers_out.clear()
        _headers_out[key] = header
    return header + data


def bytes_array(b: bytes) -> np.ndarray:
    """The array of one ``.npy`` tensor (a writable copy, as ``np.load`` gives)."""
    if b[:8] == _MAGIC_V1 and len(b) >= 10:
        end = 10 + int.from_bytes(b[8:10], "little")
        known = _headers_in.get(b[:end])
        if known is not None:
            dtype, shape, fortran, nbytes = known
            if len(b) == end + nbytes:
                flat = np.frombuffer(b, dtype=dtype, offset=end)
                return flat.reshape(shape, order="F" if fortran else "C").copy(order="K")
        a = np.load(io.BytesIO(b), allow_pickle=False)
        if len(b) == end + a.nbytes:  # a plain array: its header can be reused
            if len(_headers_in) >= MAX_HEADERS:
                _headers_in.clear()
            fortran = bool(a.flags.f_contiguous and not a.flags.c_contiguous)
            _headers_in[b[:end]] = (a.dtype, a.shape, fortran, a.nbytes)
        return a
    return np.load(io.BytesIO(b), allow_pickle=False)


def to_parameters(arrays) -> Parameters:
    """Flower's ``ndarrays_to_parameters``, with the headers kept."""
    return Parameters(tensors=[array_bytes(a) for a in arrays], tensor_type=TENSOR_TYPE)


def from_parameters(params: Parameters) -> list[np.ndarray]:
    """Flower's ``parameters_to_ndarrays``, with the headers kept."""
    return [bytes_array(t) for t in params.tensors]


__all__ = ["array_bytes", "bytes_array", "from_parameters", "pack", "to_parameters", "unpack"]
