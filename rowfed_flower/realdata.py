"""Real data for RowFed (Flower-free, docs/methods.md 2.9): UCI Communities and Crime with
US states as clients, and the per-client train/test split."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from strategies.errors import InputError


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
    """A random train/test split within each client of :func:`load_crime`'s data.

    Client ``m`` with ``n`` rows gets ``n_test = max(min_test, round(n (1 -
    train_fraction)))`` test rows (rounded half up), at most ``n - 2`` (so at least two
    training rows); clients with fewer than ``2 + min_test`` rows are left out.

    Parameters
    ----------
    data : ClientData
        The clients' rows; load them with ``center=False``: the fit's own intercept then
        plays the centring's part.
    train_fraction : float
        The share of each client's rows kept for training, in (0, 1).
    seed : int
        Client ``m``'s rows are drawn with ``numpy.random.default_rng([seed, FIPS])`` (a
        client's split does not depend on the others).
    min_test : int, optional
        The fewest test rows a client gets.

    Returns
    -------
    list of tuple
        ``(client, x_train, y_train, x_test, y_test)`` per client kept.
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
