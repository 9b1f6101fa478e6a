"""RowFed's client graph (Flower-free): the fusion graph a run asks for, all pairs or an
edge file, checked against the client ids."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

from strategies.datasets.tables import read_table
from strategies.errors import InputError


def build_graph(graph: str, sites: list[str]) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Fusion graph over ``sites`` (client ids, in federation order).

    Parameters
    ----------
    graph : str
        ``"all-pairs"`` (returns ``(None, None)``:
        :func:`strategies.solvers.problems.build_problem`'s default) or a CSV path whose
        first two columns are client ids ``u, v`` (one edge a row) and whose optional
        ``weight`` column (``>= 0``) multiplies ``lam1`` per edge.
    sites : list of str

    Returns
    -------
    edges : ndarray, shape (n_edges, 2), or None
    weights : ndarray, shape (n_edges,), or None
    """
    if graph == "all-pairs":
        return None, None
    if not os.path.isfile(graph):
        raise InputError(f"graph: no such file {graph!r} (give all-pairs or an edge CSV)")
    df = read_table(graph, "graph", dtype=str)
    if df.shape[1] < 2 or len(df) == 0:
        raise InputError(f"graph: {graph!r} needs two columns of client ids and >= 1 edge")
    index = {s: k for k, s in enumerate(sites)}
    u_col, v_col = df.columns[:2]
    edges = []
    for u, v in zip(df[u_col].str.strip(), df[v_col].str.strip(), strict=True):
        for c in (u, v):
            if c not in index:
                raise InputError(f"graph: unknown client {c!r} in {graph!r}")
        if u == v:
            raise InputError(f"graph: self-loop at client {u!r} in {graph!r}")
        edges.append((index[u], index[v]))
    weights = None
    if "weight" in df.columns:
        w = pd.to_numeric(df["weight"], errors="coerce").to_numpy(dtype=float)
        if not np.all(np.isfinite(w)) or np.any(w < 0):
            raise InputError(f"graph: weights in {graph!r} must be numbers >= 0")
        weights = w
    return np.array(edges, dtype=np.int64).reshape(-1, 2), weights
