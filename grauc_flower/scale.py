"""``python -m grauc_flower bench --scale``: GrAUC-PFL's cost against a site's rows
(:mod:`strategies.experiments.scale` runs the cells): one surrogate gradient from 10^3 to
10^6 rows, a default fit of 12 sites and its ``--tune cv``, with their peak memory."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd

from strategies.config import GrAUCConfig

from . import federation as fed
from .datafit import PairwiseLogistic

#: Sites, features and share of positives of the scale design (hospital-like: 12 sites).
SCALE_SITES, SCALE_FEATURES, SCALE_PREVALENCE = 12, 8, 0.12


def scale_sites(rows: int, n_sites: int = SCALE_SITES, p: int = SCALE_FEATURES, seed: int = 0):
    """``n_sites`` sites of ``rows`` training rows each: standard normal features, a logistic
    outcome of about :data:`SCALE_PREVALENCE` from two score directions split by longitude
    (east and west of 100 W), sites drawn over the contiguous United States.

    Parameters
    ----------
    rows : int
        The training rows per site.
    n_sites : int, optional
        The number of sites.
    p : int, optional
        The number of features.
    seed : int, optional
        The seed of every draw.

    Returns
    -------
    list of SiteData
        The sites, without test rows.
    """
    from .data import SiteData

    rng = np.random.default_rng(seed)
    lat, lon = rng.uniform(30, 45, n_sites), rng.uniform(-120, -75, n_sites)
    sites = []
    for z in range(n_sites):
        beta = np.zeros(p)
        beta[:3] = (1.0, 0.5 + 0.3 * (lon[z] > -100), -0.5)[: min(3, p)]
        x = rng.standard_normal((rows, p))
        y = (rng.random(rows) < 1.0 / (1.0 + np.exp(-(x @ beta - 2.6)))).astype(np.int64)
        sites.append(SiteData(f"S{z:02d}", float(lat[z]), float(lon[z]), x, y, x[:0], y[:0]))
    return sites


def scale_gradient(rows: int, p: int = 20, repeats: int = 5, exact: bool = False) -> dict:
    """One value and gradient of a site's surrogate at ``rows`` rows (10% positives), the
    median of ``repeats`` at fresh points.

    Parameters
    ----------
    rows : int
        The site's rows.
    p : int, optional
        The number of features.
    repeats : int, optional
        The number of timed evaluations.
    exact : bool, optional
        Sum the pairs one by one (``pairs = "exact"``) instead of ``"auto"``.

    Returns
    -------
    dict
        ``seconds`` (the median) and ``pairs`` (the mode used).
    """
    rng = np.random.default_rng(0)
    n = max(1, rows // 10)
    f = PairwiseLogistic(
        rng.standard_normal((n, p)) + 0.3,
        rng.standard_normal((rows - n, p)),
        pairs="exact" if exact else "auto",
    )
    f.value_and_grad(rng.standard_normal(p) * 0.1)  # the centred features, once
    times = []
    for _ in range(repeats):
        b = rng.standard_normal(p) * 0.1
        t0 = time.perf_counter()
        f.value_and_grad(b)
        times.append(time.perf_counter() - t0)
    return {"seconds": float(np.median(times)), "pairs": "exact" if exact else "auto"}


def scale_fit(rows: int) -> dict:
    """A default GrAUC-PFL fit (in process) of the scale design at ``rows`` rows a site."""
    sites = scale_sites(rows)
    t0 = time.perf_counter()
    res = fed.run_methods_inprocess(GrAUCConfig(), sites, ["grauc"])["grauc"]
    return {"seconds": time.perf_counter() - t0, "rounds": int(res.rounds)}


def scale_tune(rows: int) -> dict:
    """``fit --tune cv`` (inside the federation, in process, default grid and 5 folds) of
    the scale design at ``rows`` rows a site: tuning and refit."""
    from strategies.stats.tuning import CVOptions

    from . import federated_tuning, tuning

    sites = scale_sites(rows)
    t0 = time.perf_counter()
    res = federated_tuning.run_tuned_inprocess(
        GrAUCConfig(), sites, "grauc", (CVOptions(quiet=True), tuning.Grid())
    )
    return {"seconds": time.perf_counter() - t0, "rounds": int(res.rounds)}


def scale_cells(quick: bool = False, max_rows: int = 1_000_000) -> list:
    """The cells of ``bench --scale``: a site's gradient from 10^3 to ``max_rows`` rows (the
    pair loop up to 2 10^4), a default fit of 12 sites up to 10^5 rows a site, and a tuning
    up to 10^4 rows a site.

    Parameters
    ----------
    quick : bool, optional
        Smaller cells: up to 10^4 rows a site, fits up to 10^4 and tunings up to 10^3.
    max_rows : int, optional
        The largest site measured (rows).

    Returns
    -------
    list of Cell
        The measurements (:class:`strategies.experiments.scale.Cell`).
    """
    from strategies.experiments.scale import Cell

    here = "grauc_flower.scale"
    sizes = [r for r in (1_000, 10_000, 100_000, 1_000_000) if r <= max_rows]
    if quick:
        sizes = [r for r in sizes if r <= 10_000]
    cells = [Cell("grauc", "gradient", "rows a site", r, f"{here}:scale_gradient",
                  {"rows": r}) for r in sizes]  # fmt: skip
    exact = {"exact": True, "repeats": 1}
    cells += [Cell("grauc", "gradient, pair loop", "rows a site", r, f"{here}:scale_gradient",
                   {"rows": r, **exact}) for r in sizes if r <= 20_000]  # fmt: skip
    fits = [r for r in sizes if r <= (10_000 if quick else 100_000)]
    cells += [Cell("grauc", "fit", "rows a site", r, f"{here}:scale_fit", {"rows": r})
              for r in fits]  # fmt: skip
    tunes = [r for r in sizes if r <= (1_000 if quick else 10_000)]
    cells += [Cell("grauc", "tune cv", "rows a site", r, f"{here}:scale_tune", {"rows": r})
              for r in tunes]  # fmt: skip
    return cells


def scale_run(out: str, quick: bool = False, max_rows: int = 1_000_000) -> pd.DataFrame:
    """``bench --scale``: the cells of :func:`scale_cells` run, each in a fresh process
    (:func:`strategies.experiments.scale.run_scale`), with a progress line per cell on stderr.

    Parameters
    ----------
    out : str
        The output directory for ``scale.csv``, ``slopes.csv`` and ``scale.png`` (empty:
        nothing is written).
    quick : bool, optional
        Smaller cells (:func:`scale_cells`).
    max_rows : int, optional
        The largest site measured (rows).

    Returns
    -------
    pandas.DataFrame
        A row per cell, with what it measured and its peak memory.
    """
    from strategies.experiments.scale import run_scale
    from strategies.runtime.cli import line_to_stderr

    return run_scale(scale_cells(quick, max_rows), out, progress=line_to_stderr)
