"""Oracle inference for RowFed (docs/methods.md 3.5): least squares on the identified
structure, from each client's sufficient statistics.

Once RowFed has found which clients share each predictor's row and which coefficients are
zero, its estimator behaves like the least-squares fit that knows that structure.  That fit
needs from client m only ``S_m = X̃_mᵀX̃_m`` (p × p), ``X̃_mᵀỸ_m`` (p × q), the diagonal of
``Ỹ_mᵀỸ_m`` and ``n_m`` -- with an intercept, X̃ and Ỹ are centred at the client's own means
(the intercept is the client's own).  :func:`client_moments` is what a client sends (in its
evaluation answer, only with ``inference = oracle``); :func:`oracle_fit` is the server's
computation.

Per response k, the parameters are one coefficient per (predictor j, group g of clients
sharing row j) whose entry k is non-zero in at least one member of the group.  With
``A_m`` the 0/1 map from the parameters to client m's p coefficients,

    β̂_k = G_k⁻¹ h_k,   G_k = Σ_m A_mᵀ S_m A_m,   h_k = Σ_m A_mᵀ X̃_mᵀỹ_mk,
    RSS_k = Σ_m ỹ_mkᵀỹ_mk − β̂_kᵀ h_k,   df_k = N − M·[intercept] − P_k,
    σ̂²_k = RSS_k / df_k,   Cov(β̂_k) = σ̂²_k G_k⁻¹,

and the interval is β̂ ± t_{df_k, (1+level)/2}·SE.  These are post-selection intervals:
valid when the structure is right, not otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from strategies.stats import inference as oracle
from strategies.wire import pack, unpack

#: The keys of a client's moments in its evaluation metrics.
MOMENT_KEYS = ("moments:xtx", "moments:xty", "moments:yty", "moments:n")


def client_moments(x: np.ndarray, y: np.ndarray, intercept: bool) -> dict:
    """What a client sends for oracle inference: ``X̃ᵀX̃``, ``X̃ᵀỸ``, ``diag(ỸᵀỸ)`` (packed
    float64, input scale) and ``n``.

    Parameters
    ----------
    x : ndarray, shape (n, p)
        The client's training predictors.
    y : ndarray, shape (n, q)
        Its training responses.
    intercept : bool
        Centre ``x`` and ``y`` at the client's own means first.

    Returns
    -------
    dict
        The evaluation metrics :data:`MOMENT_KEYS`.
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if intercept:
        x = x - x.mean(axis=0)
        y = y - y.mean(axis=0)
    return {
        "moments:xtx": pack((x.T @ x).ravel()),
        "moments:xty": pack((x.T @ y).ravel()),
        "moments:yty": pack(np.einsum("nk,nk->k", y, y)),
        "moments:n": int(x.shape[0]),
    }


@dataclass(frozen=True)
class Moments:
    xtx: np.ndarray  # (p, p)
    xty: np.ndarray  # (p, q)
    yty: np.ndarray  # (q,)
    n: int


def read_moments(metrics: dict, p: int, q: int) -> Moments | None:
    """A client's moments from its evaluation metrics (``None`` when it sent none).

    Parameters
    ----------
    metrics : dict
        The client's evaluation metrics.
    p, q : int
        The predictors and responses: the shapes of the packed arrays.

    Returns
    -------
    Moments or None
    """
    if any(k not in metrics for k in MOMENT_KEYS):
        return None
    return Moments(
        unpack(metrics["moments:xtx"], p * p).reshape(p, p),
        unpack(metrics["moments:xty"], p * q).reshape(p, q),
        unpack(metrics["moments:yty"], q),
        int(metrics["moments:n"]),
    )


def without_moments(metrics: dict) -> dict:
    """The metrics a result keeps (the moments are used once, then dropped)."""
    return {k: v for k, v in metrics.items() if k not in MOMENT_KEYS}


@dataclass
class OracleFit:
    """The refit: ``estimate``, ``se`` ``(M, p, q)`` (zeros: estimate 0, se NaN), the
    residual variance and degrees of freedom per response, the group sizes ``(M, p)``."""

    estimate: np.ndarray
    se: np.ndarray
    sigma2: np.ndarray
    df: np.ndarray
    group_size: np.ndarray
    support: np.ndarray  # (M, p, q): the entries that are parameters of the refit


def oracle_fit(
    labels: np.ndarray, support: np.ndarray, moments: list[Moments], intercept: bool
) -> OracleFit:
    """Least squares on the structure from each client's :class:`Moments` (docstring of this
    module).

    Parameters
    ----------
    labels : ndarray, shape (M, p)
        Clients with the same label share predictor j's row.
    support : ndarray of bool, shape (M, p, q)
        The non-zero entries.
    moments : list of Moments
        Each client's, in the order of ``labels``.
    intercept : bool
        Each client has its own intercept (its moments centred): ``df`` loses ``M``.

    Returns
    -------
    OracleFit
    """
    labels = np.asarray(labels)
    support = np.asarray(support, dtype=bool)
    m, p, q = support.shape
    n_total = sum(mo.n for mo in moments)
    estimate = np.zeros((m, p, q))
    se = np.full((m, p, q), np.nan)
    sigma2 = np.full(q, np.nan)
    df = np.zeros(q, dtype=int)
    used = np.zeros((m, p, q), dtype=bool)
    for k in range(q):
        cols, n_par = oracle.parameter_map(labels, support[:, :, k])
        gram = oracle.gather_matrix(cols, [mo.xtx for mo in moments], n_par)
        rhs = oracle.gather(cols, np.stack([mo.xty[:, k] for mo in moments]), n_par)
        yty = float(sum(mo.yty[k] for mo in moments))
        df[k] = n_total - (m if intercept else 0) - n_par
        if n_par:
            beta, *_ = np.linalg.lstsq(gram, rhs, rcond=None)
            rank = np.linalg.matrix_rank(gram)
        else:
            beta, rank = np.zeros(0), 0
        rss = max(yty - float(beta @ rhs), 0.0)
        if df[k] > 0:
            sigma2[k] = rss / df[k]
        on = cols >= 0
        used[:, :, k] = on
        estimate[:, :, k] = oracle.lift(cols, beta)
        if rank == n_par and df[k] > 0 and n_par:
            var = sigma2[k] * np.diag(np.linalg.inv(gram))
            se[:, :, k][on] = np.sqrt(np.maximum(var, 0.0))[cols[on]]
    return OracleFit(estimate, se, sigma2, df, oracle.group_sizes(labels), used)


def inference_table(fit: OracleFit, clients, features, responses, level: float) -> pd.DataFrame:
    """``inference.csv``: ``client, feature, response, kind, group_size, estimate, se,
    lower, upper`` (kind: ``fused`` -- a row shared with other clients, ``unique``, or
    ``zero``; zeros have no interval); t intervals with the refit's degrees of freedom.

    Parameters
    ----------
    fit : OracleFit
        The refit.
    clients : sequence of str
        The clients' ids, in the fit's order.
    features, responses : sequence of str
        The predictors' and responses' names.
    level : float
        The intervals' coverage.

    Returns
    -------
    pandas.DataFrame
    """
    shared = (fit.group_size > 1)[:, :, None]
    kind = np.where(~fit.support, "zero", np.where(shared, "fused", "unique"))
    return oracle.interval_frame(
        "client",
        clients,
        features,
        fit.estimate,
        fit.se,
        kind,
        fit.group_size,
        level,
        df=fit.df,
        responses=responses,
    )


__all__ = [
    "MOMENT_KEYS",
    "Moments",
    "OracleFit",
    "client_moments",
    "inference_table",
    "oracle_fit",
    "read_moments",
    "without_moments",
]
