"""The Parameters codec of strategies/wire/ against numpy's own .npy writer and reader
(Flower's ndarrays_to_parameters / parameters_to_ndarrays)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

from strategies import wire

RNG = np.random.default_rng(3)
ARRAYS = [
    RNG.normal(size=20),
    RNG.normal(size=(4, 3)),
    np.asfortranarray(RNG.normal(size=(4, 3))),
    RNG.normal(size=(5, 6))[:, ::2],  # neither C- nor F-contiguous
    RNG.normal(size=(2, 3, 4)).transpose(2, 0, 1),
    np.float64(2.5),
    np.zeros(0),
    np.zeros((0, 3)),
    RNG.normal(size=7).astype(">f8"),
    RNG.normal(size=7).astype(np.float32),
    RNG.integers(-5, 5, size=9),
    RNG.integers(0, 2, size=9).astype(bool),
    RNG.normal(size=3) + 1j * RNG.normal(size=3),
]


@pytest.mark.parametrize("a", ARRAYS, ids=range(len(ARRAYS)))
def test_bytes_are_numpys_and_read_back_as_numpy_reads_them(a):
    for _ in range(2):  # a header not seen yet, then a kept one
        ours = wire.to_parameters([a])
        ref = ndarrays_to_parameters([a])
        assert ours.tensors == ref.tensors and ours.tensor_type == ref.tensor_type
        got, want = wire.from_parameters(ref)[0], parameters_to_ndarrays(ref)[0]
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.flags.f_contiguous == want.flags.f_contiguous
        assert got.flags.writeable
        np.testing.assert_array_equal(got, want)


def test_the_same_header_with_other_values_and_a_copy_not_a_view():
    first = np.arange(6.0)
    wire.from_parameters(wire.to_parameters([first]))
    second = np.arange(6.0)[::-1].copy()
    params = wire.to_parameters([second])
    out = wire.from_parameters(params)[0]
    np.testing.assert_array_equal(out, second)
    out[0] = -1.0  # a writable copy: the message's bytes stay as they were
    np.testing.assert_array_equal(wire.from_parameters(params)[0], second)


def test_bad_bytes_fail_as_numpy_fails():
    good = wire.to_parameters([np.arange(4.0)]).tensors[0]
    wire.bytes_array(good)  # its header is kept: a cut copy must not pass on it
    for bad in (b"", b"not an array", good[:-3]):
        with pytest.raises(Exception) as numpys:
            np.load(io.BytesIO(bad), allow_pickle=False)
        with pytest.raises(numpys.type):
            wire.bytes_array(bad)
    with pytest.raises(ValueError):
        wire.array_bytes(np.array([{"a": 1}], dtype=object))


def test_a_batched_message_writes_recurring_bytes_once():
    """strategies/wire/batch.py: encode/decode give back every record as it was; bytes that
    recur across records (a view's centring) are written once."""
    import json

    from strategies.wire.batch import decode, encode

    centre = np.arange(10.0).tobytes()
    records = [
        {"job": f"cv/{k}", "n": 1, "config": {"task": "gradient", "center": centre,
                                              "own": np.float64(k).tobytes(), "k": np.int64(k),
                                              "lam": 0.1 * k, "flag": True}}
        for k in range(50)
    ]  # fmt: skip
    text = encode(records)
    back = decode(text)
    for got, want in zip(back, records, strict=True):
        assert got["job"] == want["job"] and got["n"] == want["n"]
        assert got["config"] == {**want["config"], "k": int(want["config"]["k"])}
        assert isinstance(got["config"]["center"], bytes)
    assert text.count(json.dumps(__import__("base64").b64encode(centre).decode())) == 1
    plain = [{"job": "a", "n": 0, "config": {"x": b"\x01\x02", "y": "text"}}]
    assert decode(encode(plain)) == plain and encode(plain).startswith("[")
