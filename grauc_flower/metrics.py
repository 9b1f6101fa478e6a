"""GrAUC-PFL's evaluation metrics (Flower-free, docs/methods.md 1.7): the empirical AUC,
its DeLong standard error and interval."""

from __future__ import annotations

import numpy as np


def _sorted_midranks(xs: np.ndarray) -> np.ndarray:
    """Midranks of an ascending array, in its own order."""
    n = xs.size
    starts = np.flatnonzero(np.concatenate([[True], xs[1:] != xs[:-1]])) if n else np.zeros(0, int)
    ends = np.concatenate([starts[1:], [n]])
    mid = (starts + ends + 1) / 2.0  # average of 1-based ranks starts+1 .. ends
    return np.repeat(mid, ends - starts)


def rankdata(x: np.ndarray) -> np.ndarray:
    """Midranks (1-based; ties get the average of their ranks), as ``scipy.stats.rankdata``."""
    x = np.asarray(x, dtype=float)
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(x.size)
    ranks[order] = _sorted_midranks(x[order])
    return ranks


def auc(scores: np.ndarray, y: np.ndarray) -> float:
    """Empirical AUC with ties counted ½ (the Mann–Whitney statistic; pROC's AUC).

    Parameters
    ----------
    scores : ndarray, shape (N,)
        The rows' scores.
    y : ndarray, shape (N,)
        Their outcomes, 1 for a positive and 0 for a negative.

    Returns
    -------
    float
        The AUC; ``nan`` when a class is missing (callers report that explicitly).
    """
    scores = np.asarray(scores, dtype=float)
    y = np.asarray(y)
    n = int(np.sum(y == 1))
    m = int(np.sum(y == 0))
    if n == 0 or m == 0:
        return float("nan")
    ranks = rankdata(scores)
    return float((ranks[y == 1].sum() - n * (n + 1) / 2.0) / (n * m))


def delong(scores: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """AUC and its DeLong (1988) standard error (pROC's default ``var(roc)``).

    Parameters
    ----------
    scores : ndarray, shape (N,)
        The rows' scores.
    y : ndarray, shape (N,)
        Their outcomes, 1 for a positive and 0 for a negative.

    Returns
    -------
    auc, se : float
        The AUC and its standard error; both ``nan`` when a class is missing.

    Notes
    -----
    Placement values ``V10_i = (1/m) sum_j psi(x+_i, x-_j)``,
    ``V01_j = (1/n) sum_i psi(x+_i, x-_j)`` with ``psi = 1, 1/2, 0`` for ``>, =, <``;
    ``Var = S10 / n + S01 / m`` with ``S`` the sample variances (divisor ``n - 1``).
    Computed from midranks in ``O(N log N)`` (Sun & Xu 2014).
    """
    scores = np.asarray(scores, dtype=float)
    y = np.asarray(y)
    pos, neg = scores[y == 1], scores[y == 0]
    n, m = pos.size, neg.size
    if n == 0 or m == 0:
        return float("nan"), float("nan")
    # one sort: each class's own midranks come from its rows in the joint order
    both = np.concatenate([pos, neg])
    order = np.argsort(both, kind="mergesort")
    xs = both[order]
    r_all = _sorted_midranks(xs)
    is_pos = order < n
    v10 = (r_all[is_pos] - _sorted_midranks(xs[is_pos])) / m
    v01 = 1.0 - (r_all[~is_pos] - _sorted_midranks(xs[~is_pos])) / n
    a = float(v10.mean())
    s10 = v10.var(ddof=1) if n > 1 else 0.0
    s01 = v01.var(ddof=1) if m > 1 else 0.0
    return a, float(np.sqrt(s10 / n + s01 / m))


def auc_interval(a: float, se: float, level: float = 0.95) -> tuple[float, float]:
    """The Wald interval ``a -/+ z se`` clipped to ``[0, 1]``.

    Parameters
    ----------
    a : float
        The AUC.
    se : float
        Its (DeLong) standard error.
    level : float, optional
        The confidence level; ``z`` is the normal quantile of ``(1 + level) / 2``.

    Returns
    -------
    lower, upper : float
        The interval; ``nan`` when ``a`` or ``se`` is not finite.
    """
    from scipy.stats import norm

    if not (np.isfinite(a) and np.isfinite(se)):
        return float("nan"), float("nan")
    z = float(norm.ppf(0.5 + level / 2))
    return float(max(a - z * se, 0.0)), float(min(a + z * se, 1.0))
