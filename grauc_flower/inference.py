"""Oracle inference for GrAUC-PFL (docs/methods.md 1.10): the surrogate refitted on the
identified fused groups, with sandwich standard errors.

After the fit, each feature's sites fall into fused groups (``clusters.csv``).  The refit
minimizes ``F(theta) = sum_z f_z(A_z theta)`` -- the sites' surrogates with the ridge as
fitted, one coefficient per (feature, group), no fusion penalty -- by damped Newton rounds
(:func:`strategies.stats.inference.newton_round`): the server sends each site its coefficients
``A_z theta``; the site answers with its loss, gradient and ``p x p`` Hessian there
(``task = newton``, :func:`strategies.solvers.local.newton_answer`).  At the refit, each
site sends once the ``p x p`` covariance ``Sigma_z`` of its gradient from the Hájek projection
(:meth:`grauc_flower.datafit.PairwiseLogistic.hajek`, :func:`sandwich_metrics`), and

    Cov(theta) = H^-1 S H^-1,   H = sum_z A_z^T H_z A_z,   S = sum_z A_z^T Sigma_z A_z

(sites are independent, so the variances of their gradients add).  Intervals are normal:
``theta -/+ z_{(1+level)/2} se``.  Estimates and standard errors are reported on the input
scale (divided by the federated scale when the features were standardized).  These are
post-selection intervals: valid when the groups are right, not otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from strategies.stats import inference as oracle
from strategies.wire import pack, unpack

#: The key of a site's ``Sigma_z`` in its evaluation metrics (only with inference = oracle).
SANDWICH_KEY = "sandwich:s"


def sandwich_metrics(f, beta: np.ndarray) -> dict:
    """What a site adds to its evaluation answer at the refit point ``beta``: ``Sigma_z``.

    Parameters
    ----------
    f : PairwiseLogistic
        The site's datafit on the working scale.
    beta : ndarray, shape (p,)
        The site's refitted coefficients.

    Returns
    -------
    dict
        ``{SANDWICH_KEY: Sigma_z}``, the ``p x p`` covariance of the gradient at ``beta``
        (:meth:`~grauc_flower.datafit.PairwiseLogistic.hajek`), packed.
    """
    return {SANDWICH_KEY: pack(f.hajek(beta).ravel())}


def read_sandwich(metrics: dict, p: int) -> np.ndarray | None:
    """A site's ``Sigma_z`` from its evaluation metrics.

    Parameters
    ----------
    metrics : dict
        The site's evaluation metrics.
    p : int
        The number of features.

    Returns
    -------
    ndarray, shape (p, p) or None
        ``Sigma_z``; ``None`` when the site sent none.
    """
    if SANDWICH_KEY not in metrics:
        return None
    return unpack(metrics[SANDWICH_KEY], p * p).reshape(p, p)


def without_sandwich(metrics: dict) -> dict:
    """The metrics a result keeps (``Sigma_z`` is used once, then dropped)."""
    return {k: v for k, v in metrics.items() if k != SANDWICH_KEY}


@dataclass
class OracleFit:
    """The refit on the input scale: ``estimate``, ``se`` ``(Z, p)`` (``se`` NaN where a
    coefficient is not a parameter: a group of sites without both classes), ``kind``
    (``fused``, ``unique``, ``no-data``), group sizes, and the refit's rounds, objective and
    convergence."""

    estimate: np.ndarray
    se: np.ndarray
    kind: np.ndarray
    group_size: np.ndarray
    rounds: int
    objective: float
    converged: bool


def oracle_fit(
    refit: oracle.NewtonRefit, labels: np.ndarray, meats: list[np.ndarray], scale=None
) -> OracleFit:
    """The estimates and sandwich standard errors of a finished refit from the sites'
    ``Sigma_z``.

    Parameters
    ----------
    refit : NewtonRefit
        The finished refit (its estimate, Hessian, parameter columns, rounds, value and
        convergence).
    labels : ndarray of int, shape (Z, p)
        Each feature's fused groups of sites (their sizes, whether a coefficient is fused).
    meats : list of ndarray, shape (p, p)
        The sites' ``Sigma_z``, in federation order.
    scale : ndarray, shape (p,), optional
        The features' federated scale: estimates and standard errors are divided by it (the
        input scale).

    Returns
    -------
    OracleFit
        The refit on the input scale; ``se`` is NaN when the refit did not converge.
    """
    bread = refit.hess
    meat = oracle.gather_matrix(refit.cols, meats, refit.n_par)
    cov = oracle.sandwich(bread, meat) if bread is not None else None
    estimate = refit.estimate()
    se = np.full(estimate.shape, np.nan)
    if cov is not None and refit.converged:
        on = refit.cols >= 0
        se[on] = np.sqrt(np.maximum(np.diag(cov), 0.0))[refit.cols[on]]
    if scale is not None:
        estimate = estimate / scale
        se = se / scale
    size = oracle.group_sizes(labels)
    kind = np.where(refit.cols < 0, "no-data", np.where(size > 1, "fused", "unique"))
    return OracleFit(
        estimate, se, kind, size, refit.rounds, float(refit.value), bool(refit.converged)
    )


def inference_table(fit: OracleFit, sites, features, level: float) -> pd.DataFrame:
    """``inference.csv``: ``site, feature, kind, group_size, estimate, se, lower, upper``
    with normal intervals at ``level``.

    Parameters
    ----------
    fit : OracleFit
        The refit.
    sites : sequence of str
        The sites, in federation order.
    features : sequence of str
        The feature names.
    level : float
        The intervals' confidence level.

    Returns
    -------
    pandas.DataFrame
        A row per site and feature (no interval where ``se`` is not finite).
    """
    return oracle.interval_frame(
        "site", sites, features, fit.estimate, fit.se, fit.kind, fit.group_size, level
    )


__all__ = [
    "SANDWICH_KEY",
    "OracleFit",
    "inference_table",
    "oracle_fit",
    "read_sandwich",
    "sandwich_metrics",
    "without_sandwich",
]
