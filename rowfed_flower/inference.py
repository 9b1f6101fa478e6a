"""Oracle inference for RowFed (docs/methods.md 3.5): least squares on the identified
structure, from each client's sufficient statistics.

Once RowFed has found which clients share each predictor's row and which coefficients are
zero, its estimator behaves like the least-squares fit that knows that structure.  That fit
needs from client m only ``S_m = X̃_mᵀX̃_m`` (p × p), ``X̃_mᵀỸ_m`` (p × q), the diagonal of
``Ỹ_mᵀỸ_m`` and ``n_m`` -- with an intercept, X̃ and Ỹ are centred at the client's own means
(the intercept is the client's own).  :func:`client_moments` is what a client sends (in its
evaluation answer, only with ``inference = oracle``); :func:`oracle_refit` is the server's
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

from strategies.wire import pack, unpack

#: The keys of a client's moments in its evaluation metrics.
MOMENT_KEYS = ("moments:xtx", "moments:xty", "moments:yty", "moments:n")


def client_moments(x: np.ndarray, y: np.ndarray, intercept: bool) -> dict:
    """What a client sends for oracle inference: ``X̃ᵀX̃``, ``X̃ᵀỸ``, ``diag(ỸᵀỸ)`` (packed
    float64, input scale, centred at its own means when ``intercept``) and ``n``."""
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
    """A client's moments from its evaluation metrics (``None`` when it sent none)."""
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


def oracle_refit(
    labels: np.ndarray, support: np.ndarray, moments: list[Moments], intercept: bool
) -> OracleFit:
    """Least squares on the structure ``labels`` ``(M, p)`` (clients with the same label
    share predictor j's row) and ``support`` ``(M, p, q)`` (non-zero entries), from each
    client's :class:`Moments` (docstring of this module)."""
    labels = np.asarray(labels)
    support = np.asarray(support, dtype=bool)
    m, p, q = support.shape
    n_total = sum(mo.n for mo in moments)
    estimate = np.zeros((m, p, q))
    se = np.full((m, p, q), np.nan)
    sigma2 = np.full(q, np.nan)
    df = np.zeros(q, dtype=int)
    group_size = np.array(
        [[np.sum(labels[:, j] == labels[c, j]) for j in range(p)] for c in range(m)]
    )
    used = np.zeros((m, p, q), dtype=bool)
    for k in range(q):
        index = {}  # (j, label) -> parameter
        for j in range(p):
            for g in dict.fromkeys(labels[:, j]):
                members = labels[:, j] == g
                if support[members, j, k].any():
                    index[(j, g)] = len(index)
        n_par = len(index)
        cols = np.full((m, p), -1)
        for c in range(m):
            for j in range(p):
                cols[c, j] = index.get((j, labels[c, j]), -1)
        gram = np.zeros((n_par, n_par))
        rhs = np.zeros(n_par)
        yty = 0.0
        for c, mo in enumerate(moments):
            a = np.zeros((p, n_par))  # the 0/1 map from the parameters to client c's row
            on = cols[c] >= 0
            a[np.flatnonzero(on), cols[c][on]] = 1.0
            gram += a.T @ mo.xtx @ a
            rhs += a.T @ mo.xty[:, k]
            yty += float(mo.yty[k])
        df[k] = n_total - (m if intercept else 0) - n_par
        if n_par:
            beta, *_ = np.linalg.lstsq(gram, rhs, rcond=None)
            rank = np.linalg.matrix_rank(gram)
        else:
            beta, rank = np.zeros(0), 0
        rss = max(yty - float(beta @ rhs), 0.0)
        if df[k] > 0:
            sigma2[k] = rss / df[k]
        cov_ok = rank == n_par and df[k] > 0
        cov = sigma2[k] * np.linalg.inv(gram) if cov_ok and n_par else None
        for c in range(m):
            for j in range(p):
                t = cols[c, j]
                if t < 0:
                    continue
                used[c, j, k] = True
                estimate[c, j, k] = beta[t]
                if cov is not None:
                    se[c, j, k] = float(np.sqrt(max(cov[t, t], 0.0)))
    return OracleFit(estimate, se, sigma2, df, group_size, used)


def inference_table(fit: OracleFit, clients, features, responses, level: float) -> pd.DataFrame:
    """``inference.csv``: ``client, feature, response, kind, group_size, estimate, se,
    lower, upper`` (kind: ``fused`` -- a row shared with other clients, ``unique``, or
    ``zero``; zeros have no interval)."""
    from scipy.stats import t as student

    rows = []
    for c, client in enumerate(clients):
        for j, feature in enumerate(features):
            for k, response in enumerate(responses):
                est, s = fit.estimate[c, j, k], fit.se[c, j, k]
                if not fit.support[c, j, k]:
                    kind = "zero"
                else:
                    kind = "fused" if fit.group_size[c, j] > 1 else "unique"
                half = (
                    float(student.ppf(0.5 + level / 2, fit.df[k])) * s if np.isfinite(s) else np.nan
                )
                rows.append(
                    {
                        "client": client,
                        "feature": feature,
                        "response": response,
                        "kind": kind,
                        "group_size": int(fit.group_size[c, j]),
                        "estimate": est,
                        "se": s,
                        "lower": est - half,
                        "upper": est + half,
                    }
                )
    return pd.DataFrame(rows)


__all__ = [
    "MOMENT_KEYS",
    "Moments",
    "OracleFit",
    "client_moments",
    "inference_table",
    "oracle_refit",
    "read_moments",
    "without_moments",
]
