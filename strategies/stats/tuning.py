"""Choosing the penalty levels from the data, the same way for both methods
(docs/methods.md 3.4).

- Folds inside each site: :func:`stratified_folds` (a binary outcome: each class dealt
  round-robin) and :func:`row_folds` (any outcome).
- The top of a fused-penalty path (docs/methods.md 3.4): :func:`common_fit`, the minimizer of
  ``sum_z f_z(b)`` over one coefficient vector shared by the sites of a component of the
  graph (a quasi-Newton loop on the sites' summed losses and gradients, what the sites send
  in a ``gradient`` round); :func:`lam_max`, the smallest fusion level at which that common
  fit solves the fused problem; :func:`log_path`, the grid below it.
- :func:`choose`: the setting with the best mean validation score over folds, or (``1se``)
  the most regularized one within one standard error of it.

Flower-free: the method packages supply the fits and the validation scores.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import scipy.optimize
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from ..client.folds import row_folds, site_folds, stratified_folds  # noqa: F401 - their home here
from ..errors import InputError
from ..runtime.pieces import default_jobs
from ..solvers.admm import incidence_matrix

RULES = ("best", "1se")
#: Cross-validation criteria (docs/methods.md 3.4): ``pooled``, each site's score of its
#: out-of-fold predictions all folds together, averaged over sites; ``folds``, each fold's
#: score averaged over the sites and then the folds; ``loss``, the validation loss (GrAUC-PFL:
#: the pairwise surrogate; RowFed: the MSE), averaged as ``folds``.
CRITERIA = ("pooled", "folds", "loss")
#: Fewer validation rows than this of a class (GrAUC-PFL) or in all (RowFed) per fold make a
#: site's fold score noisy; the tuning says which sites (glmnet refuses AUC below 10).
SMALL_FOLD = 10


@dataclass(frozen=True)
class Knob:
    """A comparator's own setting that cross-validation chooses (besides the method's
    level: GrAUC-PFL's ridge, RowFed's ``lam2``): the settings field, its default grid, and
    which end is nearer one shared model -- the ``1se`` rule's simpler end: ``"larger"``
    (a proximal weight), ``"smaller"`` (IFCA's number of models, fine-tuning's steps) or
    ``""`` (no order: an optimizer's step or momentum)."""

    name: str
    grid: tuple
    simpler: str = ""
    integer: bool = False

    @property
    def simplest(self) -> tuple[str, ...]:
        """The knob's entry in :func:`choose`'s ``simplest``: ``name``, ``-name`` or none."""
        return {"larger": (self.name,), "smaller": (f"-{self.name}",), "": ()}[self.simpler]


_ETA = Knob("fedopt_eta", (0.01, 0.03, 0.1, 0.3))
#: The knob of each FedAvg-family comparator that has one (docs/methods.md 3.4, 3.7–3.9);
#: FedAvg's is its number of rounds (GrAUC-PFL), FedMedian and Krum have none.
KNOBS = {
    "fedprox": Knob("fedprox_mu", (0.001, 0.01, 0.1, 1.0), simpler="larger"),
    "fedavgm": Knob("fedavgm_momentum", (0.0, 0.5, 0.9)),
    "fedadagrad": _ETA,
    "fedadam": _ETA,
    "fedyogi": _ETA,
    "fedtrimmedavg": Knob("fedtrimmedavg_beta", (0.1, 0.2, 0.3, 0.4)),
    "ditto": Knob("ditto_mu", (0.01, 0.1, 1.0, 10.0), simpler="larger"),
    "fedavg-ft": Knob("ft_steps", (1, 3, 10, 30), simpler="smaller", integer=True),
    "ifca": Knob("ifca_k", (1, 2, 3, 4), simpler="smaller", integer=True),
}


def knob_values(method: str, cfg, given=None) -> tuple:
    """The values of ``method``'s knob to try, each checked against the setting's own range.

    Parameters
    ----------
    method : str
        The comparator (a key of :data:`KNOBS`).
    cfg : object
        The method's settings; ``cfg.replace(**{knob: value})`` checks a value.
    given : str or sequence of float, optional
        ``--knob-grid``'s text or a sequence; ``None``: the knob's default grid.

    Returns
    -------
    tuple
        The values (integers for an integer knob, repeats dropped); ``()`` for a method
        without a knob.
    """
    knob = KNOBS.get(method)
    if knob is None:
        if given is not None:
            raise InputError(f"knob-grid: {method} has no setting to tune besides its level")
        return ()
    values = knob.grid if given is None else parse_grid(given, "knob-grid")
    if knob.integer:
        if any(float(v) != int(v) for v in values):
            raise InputError(f"knob-grid: {knob.name.replace('_', '-')} takes integers")
        values = tuple(dict.fromkeys(int(v) for v in values))
    for v in values:
        try:
            cfg.replace(**{knob.name: v})
        except InputError as exc:
            raise InputError(f"knob-grid: {exc}") from None
    return tuple(values)


@dataclass(frozen=True)
class CVOptions:
    """How a cross-validation runs, for either method (``fit --tune cv``, the studies)."""

    folds: int = 5  # K, stratified within each site (GrAUC) or random within each client
    rule: str = "best"  # best | 1se
    tol: float = 1e-3  # the CV fits' stopping tolerance (looser than a final fit's)
    max_rounds: int = 100  # the CV fits' round limit
    jobs: int = 0  # processes; 0: one per core, at most one per piece
    seed: int = 0  # the folds
    quiet: bool = False  # no progress lines
    criterion: str = "folds"  # CRITERIA
    repeats: int = 1  # the folds drawn this many times (each site's own stream per repeat)
    max_fits: int = 0  # the federated tuning: at most this many fits at once (0: no limit)

    def __post_init__(self) -> None:
        if isinstance(self.folds, bool) or not isinstance(self.folds, int) or self.folds < 2:
            raise InputError(f"folds: must be an integer >= 2, got {self.folds!r}")
        if self.rule not in RULES:
            raise InputError(f"cv-rule: must be one of {', '.join(RULES)}, got {self.rule!r}")
        if not (isinstance(self.tol, (int, float)) and math.isfinite(self.tol) and self.tol > 0):
            raise InputError(f"cv-tol: must be > 0, got {self.tol!r}")
        if self.max_rounds < 1:
            raise InputError(f"cv-max-rounds: must be >= 1, got {self.max_rounds!r}")
        if self.jobs < 0:
            raise InputError(f"jobs: must be >= 0, got {self.jobs!r}")
        if self.criterion not in CRITERIA:
            raise InputError(
                f"cv-criterion: must be one of {', '.join(CRITERIA)}, got {self.criterion!r}"
            )
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or self.repeats < 1:
            raise InputError(f"cv-repeats: must be an integer >= 1, got {self.repeats!r}")
        fits = self.max_fits
        if isinstance(fits, bool) or not isinstance(fits, int) or fits < 0:
            raise InputError(f"max-fits: must be an integer >= 0, got {fits!r}")

    def fit_config(self, cfg):
        """The settings of a CV fit: ``cfg`` with this looser tolerance and round limit,
        and no intervals (a validation score needs none)."""
        return cfg.replace(tol=self.tol, max_rounds=self.max_rounds, inference="none")

    def workers(self, n_items: int) -> int:
        return self.jobs if self.jobs > 0 else default_jobs(n_items)

    def waves(self, fits: int) -> int:
        """A factor on a federated tuning's round budget: a stage of up to ``fits`` fits,
        at most :attr:`max_fits` of them at once, takes at most this many times the rounds
        of its slowest fit (one more than the waves, for the fits that started last)."""
        if self.max_fits <= 0 or fits <= self.max_fits:
            return 1
        return math.ceil(fits / self.max_fits) + 1


# ---------------------------------------------------------------------------------------
# Folds
# ---------------------------------------------------------------------------------------
def site_rng(seed: int, site: str) -> np.random.Generator:
    """A site's own random stream: its draws do not depend on which other sites take part.

    Parameters
    ----------
    seed : int
        The seed.
    site : str
        The site's name.

    Returns
    -------
    numpy.random.Generator
        The stream of ``(seed, site)``.
    """
    return np.random.default_rng([int(seed), zlib.crc32(str(site).encode())])


def warn_small_folds(small: Sequence[str], entity: str, rows: str, score: str) -> None:
    """The one warning naming the sites with fewer than :data:`SMALL_FOLD` validation rows
    per fold, whose fold scores are noisy; none when there are no such sites.

    Parameters
    ----------
    small : sequence of str
        The sites.
    entity : str
        What a site is called (``site`` or ``client``).
    rows : str
        What is counted (e.g. ``rows of a class``).
    score : str
        What a fold's scores are called, plural (e.g. ``AUCs``).
    """
    if not small:
        return
    from ..datasets.tables import named, warn

    warn(
        f"cv: {len(small)} {entity}(s) have fewer than {SMALL_FOLD} validation {rows} per fold "
        f"({named(small)}); their fold {score} are noisy (the pooled criterion takes all "
        "folds together)"
    )


def note_partial_folds(partial: dict, k: int, entity: str, rows: str, score: str) -> None:
    """The one note naming the sites with fewer rows than the folds: they train in every
    fold and are scored only in the folds that hold what their score needs.

    Parameters
    ----------
    partial : dict of str to int
        ``{site: folds it scores}``; empty: no note.
    k : int
        The number of folds.
    entity : str
        What a site is called (``site`` or ``client``).
    rows : str
        What is counted (e.g. ``rows of a class``).
    score : str
        What a fold's score is called (e.g. ``AUC``).
    """
    if not partial:
        return
    from ..datasets.tables import named, warn

    warn(
        f"cv: {len(partial)} {entity}(s) have fewer {rows} than the {k} folds "
        f"({named([f'{s} ({n} of {k})' for s, n in partial.items()])}): each trains in every "
        f"fold and has a validation {score} in as many folds as it fills (the counts given); "
        "the criterion averages what each fold scores"
    )


def holdout_mask(y: np.ndarray | None, n: int, fraction: float, rng) -> np.ndarray:
    """Rows held out for testing, rounded half up and leaving at least one row of each class
    (or row) for training when there are two or more.

    Parameters
    ----------
    y : ndarray, shape (n,), or None
        A binary outcome: ``fraction`` of each class is held out; ``None``: of all rows.
    n : int
        The number of rows.
    fraction : float
        The share held out.
    rng : numpy.random.Generator
        The stream the rows are drawn from.

    Returns
    -------
    ndarray of bool, shape (n,)
        True for a held-out row.
    """
    mask = np.zeros(n, dtype=bool)
    groups = [np.arange(n)] if y is None else [np.flatnonzero(y == c) for c in (1, 0)]
    for idx in groups:
        take = int(math.floor(fraction * len(idx) + 0.5))
        take = min(take, max(len(idx) - 1, 0))
        mask[rng.permutation(idx)[:take]] = True
    return mask


# ---------------------------------------------------------------------------------------
# The top of the path
# ---------------------------------------------------------------------------------------
def components(edges: np.ndarray, weights: np.ndarray, n_sites: int) -> np.ndarray:
    """Component label per site of the graph's positive-weight edges (a zero-weight edge
    carries no penalty, so it cannot fuse its ends).

    Parameters
    ----------
    edges : ndarray, shape (n_edges, 2)
        The graph's edges.
    weights : ndarray, shape (n_edges,)
        Their weights.
    n_sites : int
        The number of sites.

    Returns
    -------
    ndarray of int, shape (n_sites,)
        Each site's component.
    """
    edges = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    keep = np.asarray(weights, dtype=float) > 0
    e = edges[keep]
    adj = sp.coo_matrix((np.ones(len(e)), (e[:, 0], e[:, 1])), shape=(n_sites, n_sites))
    return connected_components(adj, directed=False)[1]


def common_fit(
    oracle: Callable[[np.ndarray], tuple[float, np.ndarray]],
    p: int,
    start: np.ndarray | None = None,
    gtol: float = 1e-10,
    max_rounds: int = 500,
) -> tuple[np.ndarray, int]:
    """``argmin_b sum_z f_z(b)`` by L-BFGS.

    Parameters
    ----------
    oracle : callable
        ``oracle(b)`` returns the sites' summed loss and gradient at ``b`` (one gradient
        round per call).
    p : int
        The number of coefficients.
    start : ndarray, shape (p,), optional
        The start; default zero.
    gtol : float, optional
        Bounds the summed gradient's largest entry at the end.
    max_rounds : int, optional
        L-BFGS's iteration limit.

    Returns
    -------
    b : ndarray, shape (p,)
        The minimizer.
    rounds : int
        The number of calls of ``oracle``.
    """
    calls = [0]

    def fun(b):
        calls[0] += 1
        value, grad = oracle(b)
        return float(value), np.asarray(grad, dtype=float)

    x0 = np.zeros(p) if start is None else np.asarray(start, dtype=float)
    res = scipy.optimize.minimize(
        fun,
        x0,
        jac=True,
        method="L-BFGS-B",
        options={"gtol": gtol, "ftol": 0.0, "maxiter": max_rounds, "maxcor": 20},
    )
    return np.asarray(res.x, dtype=float), calls[0]


def lam_max(
    edges: np.ndarray,
    weights: np.ndarray,
    grads: np.ndarray,
    grouped: bool = False,
    group_size: int = 0,
) -> tuple[float, bool]:
    """The smallest fusion level at which fused coefficients solve the fused problem.

    Fused coefficients are optimal at level ``lam`` when edge vectors ``u_e`` exist with
    ``D' U = -G`` (``D`` the signed incidence matrix) and ``||u_e|| <= lam w_e`` (the
    max-norm per coordinate for the L1 penalty, the Euclidean norm for the group penalty).
    So the level is ``min over U of max_e ||u_e|| / w_e``.

    On a tree (each component) ``U`` is unique, the subtree sums of the gradients, and the
    level is exact.  With cycles the L1 level is a linear program per coordinate (exact);
    the group level is bounded above by the ``1/w_e²``-weighted least-norm ``U`` (fused at
    it, possibly already below).  A zero-weight edge carries no penalty, so it splits the
    graph: the level is the largest over the components, each fused on its own.

    Parameters
    ----------
    edges : ndarray, shape (n_edges, 2)
        The graph's edges.
    weights : ndarray, shape (n_edges,)
        Their weights ``w_e``; zero-weight edges are dropped.
    grads : ndarray, shape (Z, p)
        Each site's gradient of its own loss at its component's common fit
        (:func:`common_fit`, each component's own).
    grouped : bool, optional
        The group penalty rather than the L1 penalty.
    group_size : int, optional
        Grouped only: the columns of ``grads`` are consecutive groups of that many, each
        fused on its own (a RowFed row of q responses): the level is the largest over the
        groups, from one solve for all of them.  0: one group of all columns.

    Returns
    -------
    level : float
        The level.
    exact : bool
        False where it is the group penalty's upper bound on a graph with cycles.
    """

    def norms(u: np.ndarray) -> np.ndarray:  # (E,) or (E, groups)
        if not grouped:
            return np.abs(u).max(axis=1)
        if group_size:
            return np.linalg.norm(u.reshape(u.shape[0], -1, group_size), axis=2)
        return np.linalg.norm(u, axis=1)

    grads = np.asarray(grads, dtype=float)
    edges = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    weights = np.asarray(weights, dtype=float)
    n_sites, p = grads.shape
    keep = weights > 0
    edges, weights = edges[keep], weights[keep]
    labels = components(edges, np.ones(len(edges)), n_sites)
    level, exact = 0.0, True
    for c in np.unique(labels):
        nodes = np.flatnonzero(labels == c)
        if len(nodes) < 2:
            continue
        index = {int(v): k for k, v in enumerate(nodes)}
        mine = np.isin(edges[:, 0], nodes)
        e = np.array([[index[int(u)], index[int(v)]] for u, v in edges[mine]]).reshape(-1, 2)
        w = weights[mine]
        dt = incidence_matrix(e, len(nodes)).T.toarray()  # (Z_c, E_c)
        g = grads[nodes]
        if len(e) == len(nodes) - 1:  # a tree: D' has full column rank, U is unique
            u = np.linalg.lstsq(dt, -g, rcond=None)[0]
            level = max(level, float(np.max(norms(u).T / w)))
        elif not grouped:
            level = max(level, max(_l1_level(dt, w, g[:, j]) for j in range(p)))
        else:
            winv = np.diag(w**2)  # least ||u_e||^2 / w_e^2 subject to D' U = -G
            u = winv @ dt.T @ np.linalg.lstsq(dt @ winv @ dt.T, -g, rcond=None)[0]
            level = max(level, float(np.max(norms(u).T / w)))
            exact = False
    return level, exact


def lam_max_mean(grads: np.ndarray, group: bool = False) -> tuple[float, bool]:
    """``lam_max`` of the fusion toward the mean (``lam sum_z ||b_z - mean(b)||``, the
    ``mean-fusion`` comparator), and whether it is exact.  The common point is optimal iff
    some ``s_z`` in the dual-norm unit ball has ``s_z - mean(s) = -g_z / lam``; as the
    ``g_z`` sum to zero, ``s_z = c - g_z/lam`` for any ``c``: with L1, ``lam_max = max_k
    (max_z g_zk - min_z g_zk) / 2`` (exact); with the group norm the radius of the smallest
    ball holding the ``g_z``, bounded here by the ball around their centre of range,
    ``max_z ||g_z - c||`` (an upper bound).

    Parameters
    ----------
    grads : ndarray, shape (Z, p)
        The sites' gradients at the common fit.
    group : bool, optional
        The group norm rather than L1.

    Returns
    -------
    level : float
        ``lam_max``; 0 with fewer than two sites.
    exact : bool
        False for the group norm's upper bound.
    """
    grads = np.asarray(grads, dtype=float)
    if grads.shape[0] < 2:
        return 0.0, True
    mid = 0.5 * (grads.max(axis=0) + grads.min(axis=0))
    if not group:
        return float(np.max(grads.max(axis=0) - mid)), True
    return float(np.max(np.linalg.norm(grads - mid, axis=1))), False


def _l1_level(dt: np.ndarray, w: np.ndarray, g: np.ndarray) -> float:
    """``min t`` subject to ``D' u = -g`` and ``|u_e| <= t w_e`` (one coordinate)."""
    n_edges = dt.shape[1]
    c = np.zeros(n_edges + 1)
    c[-1] = 1.0
    eye = np.eye(n_edges)
    a_ub = np.block([[eye, -w[:, None]], [-eye, -w[:, None]]])
    a_eq = np.hstack([dt, np.zeros((dt.shape[0], 1))])
    bounds = [(None, None)] * n_edges + [(0, None)]
    res = scipy.optimize.linprog(
        c, A_ub=a_ub, b_ub=np.zeros(2 * n_edges), A_eq=a_eq, b_eq=-g, bounds=bounds
    )
    if res.status != 0:
        raise RuntimeError(f"lam_max: the linear program failed: {res.message}")
    return float(res.x[-1])


def log_path(top: float, num: int = 12, ratio: float = 1e-3, zero: bool = True) -> tuple:
    """``num`` levels log-spaced from ``top`` down to ``top * ratio`` (descending), and 0.

    Parameters
    ----------
    top : float
        The largest level; not finite or not positive: no level but 0.
    num : int, optional
        The number of positive levels (1: ``top`` alone).
    ratio : float, optional
        The smallest level relative to ``top``.
    zero : bool, optional
        Append 0.

    Returns
    -------
    tuple of float
        The levels, descending.
    """
    if not (math.isfinite(top) and top > 0):
        return (0.0,) if zero else ()
    grid = [float(v) for v in np.geomspace(top, top * ratio, num)] if num > 1 else [top]
    return tuple(grid + ([0.0] if zero else []))


# ---------------------------------------------------------------------------------------
# Choosing
# ---------------------------------------------------------------------------------------
def summarize(table: pd.DataFrame, params: Sequence[str], score: str) -> pd.DataFrame:
    """Mean and standard error of ``score`` over folds per setting (grid order kept).

    Parameters
    ----------
    table : pandas.DataFrame
        One row per setting and fold.
    params : sequence of str
        The columns that make a setting.
    score : str
        The column of the validation score.

    Returns
    -------
    pandas.DataFrame
        Columns ``params..., mean, se, folds`` (folds with a finite score), one row per
        setting.
    """
    rows = []
    for key, grp in table.groupby(list(params), sort=False):
        vals = grp[score].to_numpy(dtype=float)
        vals = vals[np.isfinite(vals)]
        k = len(vals)
        key = key if isinstance(key, tuple) else (key,)
        rows.append(
            {
                **dict(zip(params, key, strict=True)),
                "mean": float(vals.mean()) if k else float("nan"),
                "se": float(vals.std(ddof=1) / math.sqrt(k)) if k > 1 else float("nan"),
                "folds": k,
            }
        )
    return pd.DataFrame(rows)


def grid_edges(table: pd.DataFrame, params: Sequence[str], chosen: dict) -> dict[str, str]:
    """``{setting: "smallest" | "largest"}`` for each setting of ``chosen`` at an end of the
    values tried with the other settings at their chosen values (settings with one value
    there left out) that is also an end of that setting's whole grid: a choice there may
    have its optimum beyond it, and only a wider grid can tell.  (Where one setting's
    values depend on another's -- GrAUC-PFL's lam path on w_dist -- the values tried at the
    chosen others may be fewer than the grid: a choice inside the grid is no edge.)

    Parameters
    ----------
    table : pandas.DataFrame
        The settings tried, a column per setting.
    params : sequence of str
        The settings.
    chosen : dict
        The chosen value of each setting.

    Returns
    -------
    dict of str to str
        ``"smallest"`` or ``"largest"`` for each setting chosen at an end.
    """
    out = {}
    for p in params:
        mask = np.ones(len(table), bool)
        for q in params:
            if q != p:
                mask &= table[q].to_numpy(dtype=float) == float(chosen[q])
        values = np.unique(table.loc[mask, p].to_numpy(dtype=float))
        if len(values) < 2:
            continue
        grid = np.unique(table[p].to_numpy(dtype=float))
        value = float(chosen[p])
        if value == values[0] == grid[0]:
            out[p] = "smallest"
        elif value == values[-1] == grid[-1]:
            out[p] = "largest"
    return out


def choose(
    table: pd.DataFrame,
    params: Sequence[str],
    score: str,
    maximize: bool,
    rule: str = "best",
    simplest: Sequence[str] = (),
) -> tuple[dict, pd.DataFrame]:
    """The chosen setting and the summary.

    Parameters
    ----------
    table : pandas.DataFrame
        One row per setting and fold.
    params : sequence of str
        The columns that make a setting.
    score : str
        The column of the validation score.
    maximize : bool
        Higher scores are better.
    rule : {"best", "1se"}, optional
        ``best``: the highest (``maximize``) or lowest mean score; ties go to the earlier
        setting in grid order.  ``1se``: among the settings whose mean is within one
        standard error (of the best setting) of the best mean, the most regularized (by
        ``simplest``), then the best mean.
    simplest : sequence of str, optional
        For ``1se``: the settings whose largest values are the most regularized, in that
        order of priority; ``-name``: the smallest values of ``name``.

    Returns
    -------
    chosen : dict
        The chosen value of each of ``params``.
    summary : pandas.DataFrame
        :func:`summarize`'s, with a ``chosen`` column.
    """
    if rule not in RULES:
        raise InputError(f"cv-rule: must be one of {', '.join(RULES)}, got {rule!r}")
    summary = summarize(table, params, score)
    mean = summary["mean"].to_numpy(dtype=float)
    if not np.isfinite(mean).any():
        raise InputError(f"tune: no setting has a finite validation {score}")
    sign = 1.0 if maximize else -1.0
    best = int(np.nanargmax(sign * mean))
    pick = best
    if rule == "1se":
        se = summary["se"].iloc[best]
        se = 0.0 if not np.isfinite(se) else float(se)
        near = np.flatnonzero(np.isfinite(mean) & (sign * mean >= sign * mean[best] - se))
        signed = [(c[1:], 1.0) if c.startswith("-") else (c, -1.0) for c in simplest]
        order = sorted(
            near,
            key=lambda i: (
                tuple(s * float(summary[c].iloc[i]) for c, s in signed) + (-sign * mean[i],)
            ),
        )
        pick = int(order[0])
    summary["chosen"] = np.arange(len(summary)) == pick
    chosen = {c: summary[c].iloc[pick] for c in params}
    chosen = {c: (v.item() if hasattr(v, "item") else v) for c, v in chosen.items()}
    return chosen, summary


#: The site weightings ``size-power`` cross-validation tries when the sites differ in size:
#: every site once, and by rows (docs/methods.md 3.11).
SIZE_POWER_GRID = (0.0, 1.0)


def size_powers(sizes: Sequence[int], cfg, given=None) -> tuple[float, ...]:
    """The ``size-power`` values a fused method's cross-validation tries.

    Parameters
    ----------
    sizes : sequence of int
        The sites' training rows.
    cfg : object
        The method's settings: its ``size_power``, and ``cfg.replace(size_power=v)`` checks
        a value.
    given : str or sequence of float, optional
        ``--size-power-grid``'s text or a sequence, each checked as the setting; ``None``
        or empty: :data:`SIZE_POWER_GRID` when ``sizes`` differ, else ``cfg``'s value alone
        (equal sizes make every weighting the same fit).

    Returns
    -------
    tuple of float
        The values.
    """
    if given is None or len(given) == 0:
        return SIZE_POWER_GRID if len(set(sizes)) > 1 else (float(cfg.size_power),)
    values = parse_grid(given, "size-power-grid")
    for v in values:
        try:
            cfg.replace(size_power=v)
        except InputError as exc:
            raise InputError(f"size-power-grid: {exc}") from None
    return values


def parse_grid(text: str | Sequence[float], key: str, minimum: float = 0.0) -> tuple:
    """Comma-separated numbers (or a sequence), each finite and ``>= minimum``.

    Parameters
    ----------
    text : str or sequence of float
        The numbers.
    key : str
        The option's name, as an error names it.
    minimum : float, optional
        The least value allowed.

    Returns
    -------
    tuple of float
        The values, repeats dropped, in order.
    """
    if isinstance(text, str):
        try:
            values = [float(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise InputError(f"{key}: expected comma-separated numbers, got {text!r}") from None
    else:
        values = [float(v) for v in text]
    if not values:
        raise InputError(f"{key}: give one or more values")
    if not all(math.isfinite(v) for v in values):
        raise InputError(f"{key}: values must be finite numbers, got {text!r}")
    if min(values) < minimum:
        raise InputError(f"{key}: values must be >= {minimum:g}, got {min(values)!r}")
    return tuple(dict.fromkeys(values))


__all__ = [
    "CRITERIA",
    "SMALL_FOLD",
    "SIZE_POWER_GRID",
    "size_powers",
    "CVOptions",
    "KNOBS",
    "Knob",
    "RULES",
    "choose",
    "common_fit",
    "components",
    "holdout_mask",
    "knob_values",
    "lam_max",
    "lam_max_mean",
    "log_path",
    "parse_grid",
    "row_folds",
    "site_folds",
    "site_rng",
    "stratified_folds",
    "summarize",
    "warn_small_folds",
]
