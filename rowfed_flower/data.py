"""RowFed data: the simulation of §2.8 and the Communities and Crime loader (Flower-free)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from strategies.datasets.tables import read_table
from strategies.errors import InputError
from strategies.problems import canonical_labels

#: Row ``j < 6`` of the true ``Theta`` has ``N_CLUSTERS[j]`` client clusters (docs/methods.md 2.8).
N_CLUSTERS = (1, 1, 2, 2, 3, 3)
#: Entries of a cluster's row vector and their probabilities (about a third zero, §2.8).
ENTRY_VALUES = (-1.0, -0.5, 0.0, 0.5, 1.0)
ENTRY_PROBS = (1 / 6, 1 / 6, 1 / 3, 1 / 6, 1 / 6)


def ar1_covariance(d: int, r: float = 0.5) -> np.ndarray:
    """``Sigma_ij = r^|i - j|`` (``d x d``)."""
    idx = np.arange(d)
    return r ** np.abs(idx[:, None] - idx[None, :])


@dataclass(frozen=True)
class SimulatedData:
    """Output of :func:`simulate`.

    ``x_train[m]`` ``(n_train, p)``, ``y_train[m]`` ``(n_train, q)`` (same for test),
    ``theta`` the true ``Theta*`` ``(M, p, q)``, ``partitions`` ``(M, p)``: the true cluster
    label of client ``m`` for row ``j`` (one cluster for zero rows).
    """

    x_train: list[np.ndarray]
    y_train: list[np.ndarray]
    x_test: list[np.ndarray]
    y_test: list[np.ndarray]
    theta: np.ndarray
    partitions: np.ndarray


def true_theta(
    n_sites: int,
    p: int,
    q: int,
    rng: np.random.Generator,
    n_clusters: Sequence[int] = N_CLUSTERS,
) -> tuple[np.ndarray, np.ndarray]:
    """True ``Theta*`` ``(M, p, q)`` and row partitions ``(M, p)`` of docs/methods.md 2.8.

    Notes
    -----
    **[choice]** (the paper's design is lost): rows ``j < len(n_clusters)`` are non-zero,
    the rest zero.  Row ``j`` has ``K_j = n_clusters[j]`` clusters; each cluster's q-vector
    has i.i.d. entries from ``ENTRY_VALUES`` with probabilities ``ENTRY_PROBS``, redrawn
    until the ``K_j`` vectors are non-zero and distinct (so the true partition is the one
    drawn).  Clients are assigned to clusters by a fresh random permutation per row, cut
    into ``K_j`` near-equal parts (``K_j <= M`` clusters, none empty), independently across
    rows.
    """
    theta = np.zeros((n_sites, p, q))
    parts = np.zeros((n_sites, p), dtype=np.int64)
    for j, k in enumerate(n_clusters[:p]):
        k = min(int(k), n_sites)
        while True:
            vecs = rng.choice(ENTRY_VALUES, size=(k, q), p=ENTRY_PROBS)
            nonzero = np.all(np.any(vecs != 0, axis=1))
            distinct = len({tuple(v) for v in vecs}) == k
            if nonzero and distinct:
                break
        lab = np.empty(n_sites, dtype=np.int64)
        lab[rng.permutation(n_sites)] = np.arange(n_sites) % k
        lab = canonical_labels(lab)
        parts[:, j] = lab
        theta[:, j, :] = vecs[lab]
    return theta, parts


def simulate(
    n_sites: int,
    n_train: int,
    n_test: int,
    p: int,
    q: int,
    seed: int,
    corr: float = 0.5,
    noise: float = 1.0,
    n_clusters: Sequence[int] = N_CLUSTERS,
) -> SimulatedData:
    """The docs/methods.md 2.8 simulation: ``Y_m = X_m Theta*_m + E_m``.

    Parameters
    ----------
    n_sites : int
        ``M`` (paper: 10, 20, 50).
    n_train, n_test : int
        Samples per client.
    p, q : int
    seed : int
        ``numpy.random.default_rng(seed)`` drives everything.
    corr : float
        ``Sigma_x = (corr^|i-j|)`` (``p x p``) and ``Sigma_e = (corr^|i-j|)`` (``q x q``).
    noise : float
        ``E_m`` rows ``~ N(0, noise^2 Sigma_e)``.
    n_clusters : sequence of int
        ``K_j`` of the non-zero rows (see :func:`true_theta`).

    Returns
    -------
    SimulatedData
    """
    rng = np.random.default_rng(seed)
    theta, parts = true_theta(n_sites, p, q, rng, n_clusters)
    lx = np.linalg.cholesky(ar1_covariance(p, corr))
    le = np.linalg.cholesky(ar1_covariance(q, corr))
    out: dict[str, list[np.ndarray]] = {k: [] for k in ("xtr", "ytr", "xte", "yte")}
    for m in range(n_sites):
        for n, kx, ky in ((n_train, "xtr", "ytr"), (n_test, "xte", "yte")):
            x = rng.standard_normal((n, p)) @ lx.T
            e = noise * rng.standard_normal((n, q)) @ le.T
            out[kx].append(x)
            out[ky].append(x @ theta[m] + e)
    return SimulatedData(out["xtr"], out["ytr"], out["xte"], out["yte"], theta, parts)


@dataclass(frozen=True)
class ClientData:
    """Per-client real data: ``x[m]`` ``(n_m, p)``, ``y[m]`` ``(n_m, q)`` (centred when
    loaded with ``center=True``; ``x_mean[m]``, ``y_mean[m]`` undo it), ``clients`` the
    state FIPS codes, and the column names used."""

    x: list[np.ndarray]
    y: list[np.ndarray]
    clients: list[int]
    predictors: list[str]
    responses: list[str]
    x_mean: list[np.ndarray]
    y_mean: list[np.ndarray]


def load_crime(
    path: str,
    responses: Sequence[str],
    min_rows: int = 3,
    predictors: Sequence[str] | None = None,
    exclude: Sequence[str] = (),
    center: bool = True,
) -> ClientData:
    """Communities and Crime with US states as clients (docs/methods.md 2.9).

    Parameters
    ----------
    path : str
        A CSV with a header: the normalized copy (one-hot ``state_<FIPS>`` columns) or a
        file with a ``state`` (FIPS) column such as the UCI unnormalized data with its
        column names; ``?`` is read as missing.  Empty: the normalized copy shipped with
        the package (``strategies/datasets/communities_crime.csv``).
    responses : sequence of str
        Response columns (``q = len(responses)``).
    min_rows : int
        Keep states with at least this many communities (paper: 3).
    predictors : sequence of str, optional
        Predictor columns; by default every numeric column that is not a response, a state
        column, in ``strategies.datasets.crime.NOT_PREDICTORS`` or in ``exclude``.  Default
        predictors with any missing value are dropped **[choice]**; then rows with a
        missing value are dropped.
    exclude : sequence of str
        Further columns to leave out of the default predictors (e.g. the other crime
        variables of the unnormalized file).
    center : bool
        Centre ``x`` and ``y`` within each client **[choice]**: the model (§2.1) has no
        intercept, so centring gives each state its own intercept.

    Returns
    -------
    ClientData
        Clients ordered by FIPS code.
    """
    import pandas as pd

    from strategies.datasets.crime import crime_predictors, crime_table

    df, state = crime_table(path)
    path = path or "the shipped copy"
    responses = list(responses)
    if not responses:
        raise InputError("responses: give one or more response columns")
    missing = [c for c in responses if c not in df.columns]
    if missing:
        raise InputError(f"responses: columns not in {path}: {missing}")
    unknown = [c for c in exclude if c not in df.columns]
    if unknown:
        raise InputError(f"exclude: columns not in {path}: {unknown}")
    if predictors is None:
        candidates = crime_predictors(df, {*responses, *exclude})
        predictors = [c for c in candidates if not df[c].isna().any()]
    predictors = list(predictors)
    absent = [c for c in predictors if c not in df.columns]
    if absent:
        raise InputError(f"predictors: columns not in {path}: {absent}")
    if not predictors:
        raise InputError("predictors: no predictor column is left")
    try:
        data = df[predictors + responses].astype(float)
    except (TypeError, ValueError):
        bad = next(c for c in predictors + responses if not pd.api.types.is_numeric_dtype(df[c]))
        raise InputError(f"data: column {bad!r} is not numeric") from None
    keep_rows = ~data.isna().any(axis=1).to_numpy()
    data, state = data[keep_rows], np.asarray(state)[keep_rows]
    xs, ys, clients, x_means, y_means = [], [], [], [], []
    for s in np.unique(state):
        rows = state == s
        if rows.sum() < min_rows:
            continue
        x = data.loc[rows, predictors].to_numpy()
        y = data.loc[rows, responses].to_numpy()
        xm = x.mean(axis=0) if center else np.zeros(x.shape[1])
        ym = y.mean(axis=0) if center else np.zeros(y.shape[1])
        xs.append(x - xm)
        ys.append(y - ym)
        x_means.append(xm)
        y_means.append(ym)
        clients.append(int(s))
    return ClientData(xs, ys, clients, predictors, responses, x_means, y_means)


def split_clients(
    data: ClientData, train_fraction: float, seed: int, min_test: int = 1
) -> list[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """A random train/test split within each client of :func:`load_crime`'s data (load it
    with ``center=False``: the fit's own intercept then plays the centring's part).

    Client ``m`` with ``n`` rows gets ``n_test = max(min_test, round(n (1 -
    train_fraction)))`` test rows (rounded half up), at most ``n - 2`` (so at least two
    training rows), drawn with ``numpy.random.default_rng([seed, FIPS])`` (a client's split
    does not depend on the others).  Returns ``(client, x_train, y_train, x_test,
    y_test)`` per client; clients with fewer than ``2 + min_test`` rows are left out.
    """
    if not 0 < train_fraction < 1:
        raise InputError(f"train_fraction: must be in (0, 1), got {train_fraction!r}")
    out = []
    for client, x, y, xm, ym in zip(
        data.clients, data.x, data.y, data.x_mean, data.y_mean, strict=True
    ):
        n = x.shape[0]
        if n < 2 + min_test:
            continue
        n_test = int(np.floor(n * (1.0 - train_fraction) + 0.5))
        n_test = min(max(n_test, min_test), n - 2)
        rng = np.random.default_rng([int(seed), int(client)])
        idx = rng.permutation(n)
        test, train = np.sort(idx[:n_test]), np.sort(idx[n_test:])
        x, y = x + xm, y + ym  # undo a centring, if any
        out.append((client, x[train], y[train], x[test], y[test]))
    return out


def read_graph(graph: str, sites: list[str]) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Fusion graph over ``sites`` (client ids, in federation order).

    Parameters
    ----------
    graph : str
        ``"all-pairs"`` (returns ``(None, None)``: :func:`strategies.problems.build_problem`'s
        default) or a CSV path whose first two columns are client ids ``u, v`` (one edge a
        row) and whose optional ``weight`` column (``>= 0``) multiplies ``lam1`` per edge.
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
