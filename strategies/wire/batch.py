"""A batched message's format, the same at both ends: the task name, the config fields, a
view's row-selecting keys, and the jobs' records as one JSON string."""

from __future__ import annotations

import base64
import json

import numpy as np

#: The task name of a batched message (fit and evaluate), and the config field that holds
#: the jobs' own configs.
TASK = "batch"
FIELD = "batch"
#: The property a registration asks with for a view's counts and sums.
VIEW_FIELD = "batch-view"
#: The keys of a view that select rows (the rest, e.g. GrAUC-PFL's ``ridge``, change the
#: fit, not the rows): the registry of a view is keyed by these.
DATA_KEYS = ("fold", "folds", "fold-seed", "repeat")


def _encode_value(v):
    if isinstance(v, bytes):
        return {"b64": base64.b64encode(v).decode("ascii")}
    if isinstance(v, np.generic):
        return v.item()
    return v


def _decode_value(v):
    if isinstance(v, dict) and set(v) == {"b64"}:
        return base64.b64decode(v["b64"])
    return v


def encode(items) -> str:
    """A list of ``{..., "config": {key: Scalar}}`` records as one JSON string (bytes as
    base64).  Bytes that recur (a view's centring and scale, the same for each of its hundreds
    of fits) are written once, under ``shared``, and referred to by their place."""
    counts: dict[bytes, int] = {}
    for it in items:
        for v in it["config"].values():
            if isinstance(v, bytes):
                counts[v] = counts.get(v, 0) + 1
    shared = [v for v, n in counts.items() if n > 1]
    at = {v: k for k, v in enumerate(shared)}

    def value(v):
        if isinstance(v, bytes) and v in at:
            return {"ref": at[v]}
        return _encode_value(v)

    records = [{**it, "config": {k: value(v) for k, v in it["config"].items()}} for it in items]
    if not shared:
        return json.dumps(records)
    blobs = [base64.b64encode(v).decode("ascii") for v in shared]
    return json.dumps({"shared": blobs, "records": records})


def decode(text: str) -> list[dict]:
    """The records of :func:`encode`."""
    obj = json.loads(text)
    shared: list[bytes] = []
    if isinstance(obj, dict):
        shared = [base64.b64decode(b) for b in obj["shared"]]
        obj = obj["records"]

    def value(v):
        if isinstance(v, dict) and set(v) == {"ref"}:
            return shared[int(v["ref"])]
        return _decode_value(v)

    return [{**it, "config": {k: value(v) for k, v in it["config"].items()}} for it in obj]


def data_view(view: dict) -> dict:
    """The row-selecting part of a view (:data:`DATA_KEYS`)."""
    return {k: view[k] for k in DATA_KEYS if k in view}


def split_properties(props: dict, n_views: int) -> list[dict]:
    """The per-view properties of a combined answer (:func:`answer_properties`).

    Parameters
    ----------
    props : dict
        The combined answer, each key prefixed with its view's place (``"2:n"``).
    n_views : int
        The number of views.

    Returns
    -------
    list of dict
        Each view's properties, the prefixes removed.
    """
    out: list[dict] = [{} for _ in range(n_views)]
    for key, value in props.items():
        at, _, name = key.partition(":")
        out[int(at)][name] = value
    return out
