"""Calibrated risks from a ranking score (Flower-free): each site's logistic recalibration.

GrAUC-PFL's fit gives site ``z`` a score ``s = x' beta_z`` with no intercept: it ranks, it
is not a probability.  A site maps it to ``P(y = 1 | s) = expit(a_z + b_z s)``:

- :func:`recalibrate`: ``(a_z, b_z)`` from one site's out-of-fold scores (each row scored by
  a model that did not see it), by logistic regression with Firth's bias reduction
  (Firth 1993; Heinze & Schemper 2002), which keeps the estimates finite when a small
  site's scores separate its classes, and their covariance (the inverse information).
- :func:`shrink`: the sites' estimates drawn toward their precision-weighted mean by a
  random-effects model per coefficient (DerSimonian & Laird 1986; the empirical Bayes
  estimate ``mu + tau^2 / (tau^2 + v_z) (theta_z - mu)``): a small site's noisy
  calibration borrows from the others, a large one keeps its own.
- :func:`calibration_metrics`: Brier score, expected calibration error (equal-count bins)
  and the calibration intercept and slope of probabilities against outcomes.
- :func:`reliability_bins` and :func:`calibrated_evaluation`: what a site sends of its calibrated
  risks on its test rows at the final evaluation: the four numbers above and the rows of a
  reliability diagram (probability bands of at least a floor of rows each).
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit

#: Newton iterations of :func:`recalibrate` at most, and its tolerance on the step.
MAX_ITER = 100
TOL = 1e-10
#: Bins of the expected calibration error (equal counts).
ECE_BINS = 10
#: Probability bands of a reliability diagram (equal widths before merging).
RELIABILITY_BANDS = 10
#: The metrics a site's calibrated evaluation adds (:func:`calibrated_evaluation`).
TEST_COLUMNS = ("brier", "ece", "cal_intercept", "cal_slope")


def _design(score: np.ndarray) -> np.ndarray:
    return np.column_stack([np.ones(len(score)), np.asarray(score, dtype=float)])


def firth_loglik(theta: np.ndarray, score: np.ndarray, y: np.ndarray) -> float:
    """Firth's penalized log-likelihood ``l(theta) + (1/2) log det I(theta)``.

    Parameters
    ----------
    theta : ndarray, shape (2,)
        Intercept and slope.
    score : ndarray, shape (n,)
        The scores.
    y : ndarray, shape (n,)
        The outcomes (0/1).

    Returns
    -------
    float
        The penalized log-likelihood; ``-inf`` when the information is not positive
        definite.
    """
    x = _design(score)
    eta = x @ theta
    loglik = float(np.sum(y * eta - np.logaddexp(0.0, eta)))
    p = expit(eta)
    info = x.T @ (x * (p * (1 - p))[:, None])
    sign, logdet = np.linalg.slogdet(info)
    return loglik + 0.5 * logdet if sign > 0 else -np.inf


def recalibrate(score, y) -> dict:
    """One site's recalibration ``P(y=1) = expit(a + b s)``, by Firth-penalized logistic
    regression (module docstring).

    Parameters
    ----------
    score : array_like, shape (n,)
        The site's scores.
    y : array_like, shape (n,)
        Its outcomes (0/1).

    Returns
    -------
    dict
        ``a``, ``b``, their covariance ``cov`` (2 x 2), the counts ``n_pos``, ``n_neg`` and
        ``converged``.  With no row of one class (or scores all equal) there is nothing to
        calibrate: ``a``, ``b`` and ``cov`` are NaN.
    """
    score = np.asarray(score, dtype=float).ravel()
    y = np.asarray(y, dtype=float).ravel()
    n_pos, n_neg = int(np.sum(y == 1)), int(np.sum(y == 0))
    nan = {"a": np.nan, "b": np.nan, "cov": np.full((2, 2), np.nan)}
    if n_pos == 0 or n_neg == 0 or np.ptp(score) == 0.0:
        return {**nan, "n_pos": n_pos, "n_neg": n_neg, "converged": False}
    # the slope on a standardized score, mapped back at the end (a well-scaled system)
    centre, spread = float(np.mean(score)), float(np.std(score))
    x = _design((score - centre) / spread)
    theta = np.array([np.log((n_pos + 0.5) / (n_neg + 0.5)), 0.0])
    converged = False
    for _ in range(MAX_ITER):
        p = expit(x @ theta)
        w = p * (1 - p)
        info = x.T @ (x * w[:, None])
        info_inv = np.linalg.inv(info)
        hat = w * np.einsum("ij,jk,ik->i", x, info_inv, x)  # leverages
        step = info_inv @ (x.T @ (y - p + hat * (0.5 - p)))
        # halve a step that lowers the penalized likelihood (Heinze & Schemper's safeguard)
        base = firth_loglik(theta, x[:, 1], y)
        t = 1.0
        while firth_loglik(theta + t * step, x[:, 1], y) < base - 1e-12 and t > 1e-6:
            t /= 2
        theta = theta + t * step
        if np.max(np.abs(t * step)) < TOL:
            converged = True
            break
    p = expit(x @ theta)
    cov_std = np.linalg.inv(x.T @ (x * (p * (1 - p))[:, None]))
    # back to the raw score: a = a' - b' centre / spread, b = b' / spread
    jac = np.array([[1.0, -centre / spread], [0.0, 1.0 / spread]])
    a, b = jac @ theta
    return {"a": float(a), "b": float(b), "cov": jac @ cov_std @ jac.T, "n_pos": n_pos,
            "n_neg": n_neg, "converged": converged}  # fmt: skip


def shrink(estimates: np.ndarray, variances: np.ndarray) -> tuple[np.ndarray, float, float]:
    """Random-effects shrinkage of one coefficient over sites.

    Parameters
    ----------
    estimates : ndarray, shape (Z,)
        Each site's estimate (NaN: a site without an estimate, which gets the mean).
    variances : ndarray, shape (Z,)
        Their variances (NaN or not positive: a site without an estimate).

    Returns
    -------
    shrunk : ndarray, shape (Z,)
        The shrunken estimates; all NaN when no site has an estimate.
    mu : float
        The precision-weighted mean.
    tau2 : float
        The between-site variance ``tau^2`` (DerSimonian-Laird, at least 0).
    """
    est = np.asarray(estimates, dtype=float)
    var = np.asarray(variances, dtype=float)
    ok = np.isfinite(est) & np.isfinite(var) & (var > 0)
    if not ok.any():
        return np.full(est.shape, np.nan), np.nan, np.nan
    w = 1.0 / var[ok]
    mu_fixed = float(np.sum(w * est[ok]) / np.sum(w))
    q = float(np.sum(w * (est[ok] - mu_fixed) ** 2))
    k = int(ok.sum())
    denom = float(np.sum(w) - np.sum(w**2) / np.sum(w))
    tau2 = max(0.0, (q - (k - 1)) / denom) if k > 1 and denom > 0 else 0.0
    w_re = 1.0 / (var[ok] + tau2)
    mu = float(np.sum(w_re * est[ok]) / np.sum(w_re))
    out = np.full(est.shape, mu)
    out[ok] = mu + tau2 / (tau2 + var[ok]) * (est[ok] - mu)
    return out, mu, tau2


def calibration_mean(frame) -> tuple[float, float]:
    """The sites' random-effects mean intercept and slope from a ``calibration.csv`` frame
    (each site's own estimates and standard errors; what a site without one takes)."""
    _, mu_a, _ = shrink(frame["site_intercept"], np.asarray(frame["site_intercept_se"]) ** 2)
    _, mu_b, _ = shrink(frame["site_slope"], np.asarray(frame["site_slope_se"]) ** 2)
    return mu_a, mu_b


def calibration_frame(sites, n_pos, n_neg, a, b, var_a, var_b):
    """``calibration.csv``'s table: per site its counts, its own recalibration
    (``site_intercept``, ``site_slope`` and their standard errors; NaN for a site without
    one) and the estimates shrunk toward the sites' mean by :func:`shrink` (``intercept``,
    ``slope``: what ``predict --probability`` uses).

    Parameters
    ----------
    sites : iterable of str
        The sites.
    n_pos, n_neg : array_like, shape (Z,)
        Each site's counts of positives and negatives.
    a, b : array_like, shape (Z,)
        Each site's own intercept and slope.
    var_a, var_b : array_like, shape (Z,)
        Their variances.

    Returns
    -------
    pandas.DataFrame
        One row per site; ``attrs["tau2"]``: the between-site variances of intercept and
        slope.
    """
    import pandas as pd

    frame = pd.DataFrame(
        {
            "site": list(sites),
            "n_pos": np.asarray(n_pos, dtype=float),
            "n_neg": np.asarray(n_neg, dtype=float),
            "site_intercept": np.asarray(a, dtype=float),
            "site_slope": np.asarray(b, dtype=float),
            "site_intercept_se": np.sqrt(np.asarray(var_a, dtype=float)),
            "site_slope_se": np.sqrt(np.asarray(var_b, dtype=float)),
        }
    )
    sa, _, tau2_a = shrink(frame["site_intercept"], frame["site_intercept_se"] ** 2)
    sb, _, tau2_b = shrink(frame["site_slope"], frame["site_slope_se"] ** 2)
    frame["intercept"], frame["slope"] = sa, sb
    frame.attrs["tau2"] = (tau2_a, tau2_b)
    return frame


def calibration_metrics(prob, y, bins: int = ECE_BINS) -> dict:
    """Brier score, expected calibration error and the calibration intercept and slope.

    Parameters
    ----------
    prob : array_like, shape (n,)
        Predicted probabilities (clipped to ``[1e-12, 1 - 1e-12]``).
    y : array_like, shape (n,)
        Outcomes (0/1).
    bins : int, optional
        The expected calibration error's equal-count bins.

    Returns
    -------
    dict
        ``brier``; ``ece``, the mean over rows of ``|mean outcome - mean probability|`` of
        the row's bin; ``cal_intercept`` and ``cal_slope``, the logistic regression of
        ``y`` on ``logit(prob)`` (0 and 1 when the probabilities are calibrated).
    """
    prob = np.clip(np.asarray(prob, dtype=float).ravel(), 1e-12, 1 - 1e-12)
    y = np.asarray(y, dtype=float).ravel()
    brier = float(np.mean((prob - y) ** 2))
    order = np.argsort(prob, kind="stable")
    ece = 0.0
    for part in np.array_split(order, min(bins, len(prob))):
        if len(part):
            ece += len(part) * abs(float(np.mean(y[part])) - float(np.mean(prob[part])))
    fit = recalibrate(np.log(prob / (1 - prob)), y)
    return {"brier": brier, "ece": ece / max(len(prob), 1), "cal_intercept": fit["a"],
            "cal_slope": fit["b"]}  # fmt: skip


#: The fewest rows a reliability band describes when the site's floors are lower (``fit``
#: in process applies no floor unless asked): a band of one or two rows says nothing.
BAND_ROWS = 3


def reliability_bins(prob, y, floor: int, bands: int = RELIABILITY_BANDS) -> list[list[float]]:
    """A site's reliability diagram: its rows grouped by predicted probability into
    ``bands`` equal bands of ``[0, 1]``, each band with fewer than ``floor`` rows (at least
    :data:`BAND_ROWS`) merged into the next (the last into the one before), so that no band
    sent describes fewer rows than the site's floor.

    Parameters
    ----------
    prob : array_like, shape (n,)
        Predicted probabilities.
    y : array_like, shape (n,)
        Outcomes (0/1).
    floor : int
        The fewest rows a band describes (raised to :data:`BAND_ROWS`).
    bands : int, optional
        The equal bands before merging.

    Returns
    -------
    list of list of float
        Each band: ``[lower, upper, rows, mean probability, observed rate]``; empty bands
        are left out, and with fewer rows than the floor there is none.
    """
    prob = np.asarray(prob, dtype=float).ravel()
    y = np.asarray(y, dtype=float).ravel()
    floor = max(int(floor), BAND_ROWS)
    if len(prob) < floor:
        return []
    edges = np.linspace(0.0, 1.0, bands + 1)
    band = np.clip(np.searchsorted(edges, prob, side="right") - 1, 0, bands - 1)
    count = np.bincount(band, minlength=bands)
    starts = [0]  # the first band of each merged group
    for k in range(1, bands):
        if count[starts[-1] : k].sum() >= floor:
            starts.append(k)
    if len(starts) > 1 and count[starts[-1] :].sum() < floor:
        starts.pop()  # the last group joins the one before
    out = []
    for lo, hi in zip(starts, [*starts[1:], bands], strict=True):
        rows = (band >= lo) & (band < hi)
        if rows.any():
            out.append([round(float(edges[lo]), 9), round(float(edges[hi]), 9), int(rows.sum()),
                        float(prob[rows].mean()), float(y[rows].mean())])  # fmt: skip
    return out


def calibrated_evaluation(score, y, a: float, b: float, floor: int) -> dict:
    """What a site reports of its calibrated risks ``expit(a + b score)`` on its test
    rows.

    Parameters
    ----------
    score : array_like, shape (n,)
        The test rows' scores.
    y : array_like, shape (n,)
        Their outcomes (0/1).
    a, b : float
        The site's calibration intercept and slope.
    floor : int
        The site's floor of rows, for :func:`reliability_bins`.

    Returns
    -------
    dict
        :func:`calibration_metrics` (``brier``, ``ece``, ``cal_intercept``, ``cal_slope``;
        NaN without rows) and ``reliability``, its :func:`reliability_bins` as a JSON
        string (a metric is a scalar).
    """
    import json

    score = np.asarray(score, dtype=float).ravel()
    y = np.asarray(y, dtype=float).ravel()
    if not len(score):
        return {**dict.fromkeys(TEST_COLUMNS, float("nan")), "reliability": "[]"}
    prob = expit(a + b * score)
    out = calibration_metrics(prob, y)
    out["reliability"] = json.dumps(reliability_bins(prob, y, floor))
    return out


__all__ = [
    "calibrated_evaluation",
    "calibration_frame",
    "calibration_mean",
    "calibration_metrics",
    "firth_loglik",
    "recalibrate",
    "reliability_bins",
    "shrink",
]
