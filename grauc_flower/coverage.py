"""The GrAUC-PFL coverage study (docs/studies.md, "Coverage studies"):
``python -m grauc_flower study --config configs/coverage_grauc.toml``.

A study config with a ``[coverage]`` table.  One task simulates the docs/methods.md 1.8
sites, fits GrAUC-PFL at the config's fixed ``lam`` and ``w-dist`` with ``inference =
oracle``, and scores the intervals of its ``inference.csv`` against the population
coefficients (:mod:`strategies.experiments.coverage`): per kind of true coefficient
(``fused``: shared with other sites; ``unique``: the site's own) and whether every
feature's fused groups were identified exactly.

The truth (docs/methods.md 1.10).  A simulated site's positives are ``N(mu, I)``, its
negatives ``N(0, I)``, so a case-control difference is ``d ~ N(mu, 2I)``.  The population
surrogate ``g(b) = E log(1 + exp(-b'd)) + (eta/2)||b||^2`` is minimized at ``b = c mu``: for
``b = a mu/|mu| + b_perp``, ``b_perp'd`` is centred and independent of ``mu'd``, so by Jensen
it can only raise the first term, and it raises the ridge.  With ``T = mu'd ~ N(|mu|^2,
2|mu|^2)``, ``c`` minimizes ``E log(1 + exp(-c T)) + (eta/2) c^2 |mu|^2``, a one-dimensional
convex problem solved here by Gauss-Hermite quadrature (:func:`population_scale`).  Sites
with the same ``mu`` share every coefficient; two groups share feature ``j`` where their
coefficients are equal.  This is the exact population minimizer that a fit on a much
larger pooled sample approximates (tests/test_coverage.py checks the two agree).
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd
from scipy.optimize import brentq
from scipy.special import expit

from strategies import quiet_flower
from strategies.experiments.coverage import (
    identified,
    run_coverage,
    score_table,
    task_frame,
    true_kinds,
)
from strategies.stats.inference import group_sizes

from .data import site_means
from .study import parse_settings, simulated_sites, simulation_arguments

TASK = "grauc_flower.coverage:run_task"
#: The design key the coverage figure puts on its x axis.
SIZE_KEY = "n_train"
#: Gauss-Hermite nodes of the population expectation.
NODES = 200


@functools.lru_cache(maxsize=64)
def population_scale(norm2: float, ridge: float) -> float:
    """``c >= 0`` minimizing ``E log(1 + exp(-c T)) + (ridge/2) c^2 norm2`` for
    ``T ~ N(norm2, 2 norm2)``.

    Parameters
    ----------
    norm2 : float
        ``|mu|^2``, the squared norm of the site's positives' mean.
    ridge : float
        The ridge ``eta``.

    Returns
    -------
    float
        The scale ``c`` (0 when ``norm2 = 0``).
    """
    if norm2 <= 0:
        return 0.0
    x, w = np.polynomial.hermite_e.hermegauss(NODES)
    t = norm2 + np.sqrt(2.0 * norm2) * x
    w = w / w.sum()

    def slope(c: float) -> float:  # h'(c), increasing in c
        return float(np.sum(w * -t * expit(-c * t)) + ridge * c * norm2)

    hi = 1.0
    while slope(hi) < 0:
        hi *= 2.0
        if hi > 1e8:
            raise ValueError("population_scale: no finite minimizer (ridge 0, separable)")
    return float(brentq(slope, 0.0, hi, xtol=1e-14, rtol=1e-14))


def population_coefficients(means: np.ndarray, ridge: float) -> np.ndarray:
    """Each site's population coefficients ``c(|mu_z|^2) mu_z``.

    Parameters
    ----------
    means : ndarray, shape (Z, p)
        Each site's positives' mean ``mu_z`` (its negatives' is 0).
    ridge : float
        The ridge ``eta``.

    Returns
    -------
    ndarray, shape (Z, p)
        The population minimizers (:func:`population_scale` times the means).
    """
    means = np.asarray(means, dtype=float)
    scale = [population_scale(float(np.sum(mu * mu)), float(ridge)) for mu in means]
    return np.asarray(scale)[:, None] * means


def true_labels(truth: np.ndarray, rel: float = 1e-9) -> np.ndarray:
    """Per feature, the sites' groups of equal true coefficients.

    Parameters
    ----------
    truth : ndarray, shape (Z, p)
        The true coefficients.
    rel : float, optional
        Coefficients equal to this relative precision (of the feature's largest) share a
        group, so that round-off does not split a group.

    Returns
    -------
    ndarray of int, shape (Z, p)
        Each site's group label per feature.
    """
    truth = np.asarray(truth, dtype=float)
    digits = int(-np.log10(rel))
    labels = np.empty(truth.shape, dtype=np.int64)
    for j in range(truth.shape[1]):
        col = truth[:, j]
        scale = max(float(np.max(np.abs(col))), 1e-300)
        _, labels[:, j] = np.unique(np.round(col / scale, digits), return_inverse=True)
    return labels


def run_task(settings: dict, cell: dict, rep: int, seed: int) -> dict[str, pd.DataFrame]:
    """One (cell, replication): ``results`` with one row per kind of coefficient.

    Parameters
    ----------
    settings : dict
        The study config's tables but ``[design]``.
    cell : dict
        The design values of the task's cell.
    rep : int
        The replication.
    seed : int
        The task's seed (the simulation's and the fit's).

    Returns
    -------
    dict of str to pandas.DataFrame
        ``{"results": frame}`` (:func:`strategies.experiments.coverage.task_frame`).
    """
    quiet_flower()
    from .federation import run_methods_inprocess
    from .inference import inference_table

    st = parse_settings(settings, tuple(cell))
    sites, features = simulated_sites(st, cell, seed)
    args = simulation_arguments(st, cell)
    means = site_means(
        args["simulation"], args["n_sites"], args["n_features"], args["level"], seed,
        counties=args["counties"],
    )  # fmt: skip
    truth = population_coefficients(means, st.cfg.ridge)
    cfg = st.cfg.replace(seed=seed)
    res = run_methods_inprocess(cfg, sites, ["grauc"])["grauc"]
    fit = res.extra.get("inference")
    if fit is None or isinstance(fit, str):
        raise RuntimeError(f"no oracle refit: {fit or 'inference off'}")
    table = inference_table(fit, res.sites, features, cfg.level)
    labels = true_labels(truth)
    ident = identified(labels, res.extra["clusters"])
    rows = score_table("grauc", table, truth, true_kinds(group_sizes(labels)), ident)
    return {"results": task_frame(rows, cell, rep, seed, res)}


def run(a, study, st) -> int:
    """The ``study`` command on a coverage config.

    Parameters
    ----------
    a : argparse.Namespace
        The ``study`` command's options.
    study : Study
        The study config.
    st : Settings
        Its parsed settings (``st.coverage``: the intervals' nominal level).

    Returns
    -------
    int
        The exit status.
    """
    return run_coverage(a, study, TASK, st.coverage, SIZE_KEY)


__all__ = [
    "TASK",
    "population_coefficients",
    "population_scale",
    "run",
    "run_task",
    "true_labels",
]
