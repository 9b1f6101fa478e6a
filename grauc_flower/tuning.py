"""Cross-validation of GrAUC-PFL and its baselines (docs/methods.md 3.4): ``fit --tune cv``
and the studies.

GrAUC-PFL: a grid over ``lam x w_dist x ridge``; for each ``(ridge, w_dist)`` the ``lam``
path is fitted in descending order with warm starts.  By default the ``lam`` grid starts at
``lam_max`` (:func:`lam_max_of`: the smallest level at which every site of a component has
the same coefficients) and goes down to ``lam_max * 1e-3`` (12 values) and 0.  Individual
fits: a grid over ``ridge``.  FedAvg: ``ridge x fedavg_rounds`` (the rounds path continues
one run: FedAvg's next round depends only on the global model).  The other comparators:
``ridge x`` their own setting (:data:`strategies.stats.tuning.KNOBS`: FedProx's and Ditto's
``mu``, the adaptive servers' ``eta``, IFCA's ``k``, ...).  The criterion is the mean
validation AUC over sites (sites whose validation fold lacks a class are left out).

The pieces run in a process pool, one per ``(fold, ridge)``.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from strategies.config import FEDAVG_FAMILY, GRAUC_FUSED_METHODS, GrAUCConfig
from strategies.errors import InputError
from strategies.runtime.pieces import PieceProgress, run_items
from strategies.server.registry import Registry
from strategies.stats import tuning

from .data import SiteData
from .federation import clients_of

#: Default grids (``fit --tune cv``).
W_DIST_GRID = (0.0, 1.0, 2.0)
RIDGE_GRID = (1e-3, 1e-2, 0.1, 1.0)
ROUNDS_GRID = (10, 25, 50, 100, 200)
#: FedAvg's rounds grid is doubled while CV chooses its largest value, up to this many
#: times the largest value given (then the choice is reported at the grid's edge).
ROUNDS_BOUND = 4
N_LAM = 12
LAM_RATIO = 1e-3


@dataclass(frozen=True)
class Grid:
    """The settings tried.  ``lam = ()``: automatic from ``lam_max`` (per ``ridge`` and
    ``w_dist``)."""

    lam: tuple[float, ...] = ()
    w_dist: tuple[float, ...] = W_DIST_GRID
    ridge: tuple[float, ...] = RIDGE_GRID
    fedavg_rounds: tuple[int, ...] = ROUNDS_GRID
    knob: tuple | None = None  # a comparator's own setting (strategies.stats.tuning.KNOBS)
    #: The fused methods' site weighting ``size_power`` (empty: the config's value).
    size_power: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "lam", tuple(sorted(set(self.lam), reverse=True)))
        rounds = tuple(sorted({int(r) for r in self.fedavg_rounds}))
        if not rounds or rounds[0] < 1:
            raise InputError(f"rounds-grid: values must be integers >= 1, got {rounds!r}")
        object.__setattr__(self, "fedavg_rounds", rounds)


#: The columns naming a setting, per method (``cv.csv``; ``metrics.json: tuned``): the
#: ridge and, for a comparator, its knob (:data:`strategies.stats.tuning.KNOBS`).
PARAMS = {
    "grauc": ("lam", "w_dist", "ridge", "size_power"),
    "mean-fusion": ("lam", "ridge", "size_power"),
    "individual": ("ridge",),
    "fedavg": ("ridge", "fedavg_rounds"),
    **{
        m: ("ridge", tuning.KNOBS[m].name) if m in tuning.KNOBS else ("ridge",)
        for m in FEDAVG_FAMILY[1:]
    },
}


def used_levels(method: str) -> tuple[str, ...]:
    """The settings ``method`` reads, as its fit's summary line names them: those it is
    tuned over (:data:`PARAMS`) but FedAvg's rounds (the line gives its rounds)."""
    return tuple(p for p in PARAMS[method] if p != "fedavg_rounds")


#: The most regularized first, for the ``1se`` rule.
SIMPLEST = {
    "grauc": ("lam", "ridge"),
    "mean-fusion": ("lam", "ridge"),
    "individual": ("ridge",),
    "fedavg": ("ridge",),
    **{
        m: ("ridge", *(tuning.KNOBS[m].simplest if m in tuning.KNOBS else ()))
        for m in FEDAVG_FAMILY[1:]
    },
}


def lam_max_of(sites, cfg: GrAUCConfig) -> float:
    """``lam_max`` at ``cfg``'s ridge, w_dist, q, graph and penalty (:func:`lam_maxes`).

    Parameters
    ----------
    sites : sequence of SiteData
        The sites' data.
    cfg : GrAUCConfig
        The settings.

    Returns
    -------
    float
        The smallest ``lam`` at which every site of a graph component has the same
        coefficients.
    """
    return lam_maxes(sites, cfg, (cfg.ridge,), (cfg.w_dist,))[(cfg.ridge, cfg.w_dist)]


def _gradients(sites, cfg: GrAUCConfig, ridge: float):
    """``answers(members, b)``: the listed sites' ``(loss, gradient)`` at ``b``, each from its
    own client (a ``gradient`` instruction, as in a ``pqn`` round; the pooled scaling when
    ``standardize = "federated"``)."""
    clients = clients_of(sites, ridge)
    registry = Registry()
    for z, c in enumerate(clients):
        registry.register(str(z), c.get_properties({}))
    if cfg.standardize == "federated":
        registry.standardize()
    work = {**registry.scaling_config(), **registry.weight_config(cfg.size_power)}

    def answers(members, b):
        got = []
        for z in members:
            config = {"task": "gradient", "site": sites[z].site, **work}
            arrays, _, metrics = clients[z].fit([b], config)
            got.append((float(metrics["loss"]), arrays[0]))
        return got

    return answers


def lam_maxes(sites, cfg: GrAUCConfig, ridges, w_dists) -> dict[tuple[float, float], float]:
    """``lam_max`` per ``(ridge, w_dist)``, from the sites' own gradients at each graph
    component's common fit (:func:`strategies.stats.tuning.common_fit`, then
    :func:`strategies.stats.tuning.lam_max`).

    The sites answer ``gradient`` instructions, as in a ``pqn`` round; the server sums them.
    The common fit depends on the ridge only, so it is computed once per ridge (and
    component).  On a tree the level is exact; for ``knn``/``complete`` graphs exact with the
    L1 penalty and an upper bound with the group penalty.

    Parameters
    ----------
    sites : sequence of SiteData
        The sites' data.
    cfg : GrAUCConfig
        The other settings: the graph, ``q``, the penalty, the standardization and the site
        weighting.
    ridges : iterable of float
        The ridge values.
    w_dists : iterable of float
        The ``w_dist`` values.

    Returns
    -------
    dict of (float, float) to float
        ``{(ridge, w_dist): lam_max}``.
    """
    from .graph import build_graph

    lat = np.array([s.lat for s in sites])
    lon = np.array([s.lon for s in sites])
    graph = build_graph(lat, lon, cfg.graph, cfg.knn_k)
    p = sites[0].x_train.shape[1]
    out = {}
    for ridge in ridges:
        answers = _gradients(sites, cfg, ridge)
        fitted: dict[tuple, np.ndarray] = {}  # component -> its sites' gradients
        for w in w_dists:
            weights = graph.weights(w, cfg.q)
            labels = tuning.components(graph.edges, weights, len(sites))
            grads = np.zeros((len(sites), p))
            for c in np.unique(labels):
                members = tuple(int(z) for z in np.flatnonzero(labels == c))
                if len(members) < 2:
                    continue
                if members not in fitted:

                    def oracle(b, members=members, answers=answers):
                        got = answers(members, b)
                        return sum(v for v, _ in got), np.sum([g for _, g in got], axis=0)

                    b, _ = tuning.common_fit(oracle, p)
                    fitted[members] = np.array([g for _, g in answers(members, b)])
                grads[list(members)] = fitted[members]
            level, _ = tuning.lam_max(graph.edges, weights, grads, cfg.penalty == "group")
            out[(ridge, w)] = level
    return out


def lam_maxes_mean(sites, cfg: GrAUCConfig, ridges) -> dict[float, float]:
    """``lam_max`` of the mean-fusion comparator per ridge: the sites' gradients at the
    common fit of all of them (as :func:`lam_maxes`), then
    :func:`strategies.stats.tuning.lam_max_mean`.

    Parameters
    ----------
    sites : sequence of SiteData
        The sites' data.
    cfg : GrAUCConfig
        The other settings (the penalty, the standardization and the site weighting).
    ridges : iterable of float
        The ridge values.

    Returns
    -------
    dict of float to float
        ``{ridge: lam_max}``.
    """
    p = sites[0].x_train.shape[1]
    everyone = tuple(range(len(sites)))
    out = {}
    for ridge in ridges:
        answers = _gradients(sites, cfg, ridge)

        def oracle(b, answers=answers):
            got = answers(everyone, b)
            return sum(v for v, _ in got), np.sum([g for _, g in got], axis=0)

        b, _ = tuning.common_fit(oracle, p)
        grads = np.array([g for _, g in answers(everyone, b)])
        out[ridge], _ = tuning.lam_max_mean(grads, cfg.penalty == "group")
    return out


def lam_grids(
    sites, cfg: GrAUCConfig, grid: Grid, method: str = "grauc"
) -> dict[tuple[float, float], tuple]:
    """The ``lam`` values per ``(ridge, w_dist)``: ``grid.lam`` when given, else
    :func:`strategies.stats.tuning.log_path` below :func:`lam_maxes` (mean-fusion:
    :func:`lam_maxes_mean`, the same for every ``w_dist``).

    Parameters
    ----------
    sites : sequence of SiteData
        The sites' data.
    cfg : GrAUCConfig
        The other settings (:func:`lam_maxes`).
    grid : Grid
        The ridge, ``w_dist`` and ``lam`` values.
    method : str, optional
        ``"grauc"`` or ``"mean-fusion"``.

    Returns
    -------
    dict of (float, float) to tuple of float
        ``{(ridge, w_dist): lam values}``, descending.
    """
    if grid.lam:
        return {(r, w): grid.lam for r in grid.ridge for w in grid.w_dist}
    if method == "mean-fusion":
        tops = lam_maxes_mean(sites, cfg, grid.ridge)
        return {
            (r, w): tuning.log_path(tops[r], N_LAM, LAM_RATIO)
            for r in grid.ridge
            for w in grid.w_dist
        }
    tops = lam_maxes(sites, cfg, grid.ridge, grid.w_dist)
    return {key: tuning.log_path(top, N_LAM, LAM_RATIO) for key, top in tops.items()}


def fold_sites(sites, folds, k: int) -> list[SiteData]:
    """Each site's training rows outside fold ``k`` for training, fold ``k`` for validation.

    Parameters
    ----------
    sites : sequence of SiteData
        The sites' data.
    folds : sequence of ndarray of int
        Each site's fold per training row, in site order.
    k : int
        The fold held out.

    Returns
    -------
    list of SiteData
        The sites, fold ``k`` as their test rows.
    """
    out = []
    for s, f in zip(sites, folds, strict=True):
        train, val = f != k, f == k
        out.append(
            SiteData(
                s.site,
                s.lat,
                s.lon,
                s.x_train[train],
                s.y_train[train],
                s.x_train[val],
                s.y_train[val],
                s.features,
            )
        )
    return out


def _mean_auc(strategy) -> float:
    aucs = [m["auc"] for m in strategy.evaluation.values()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(np.nanmean(aucs)) if aucs else float("nan")


def _row(k, setting: dict, strategy) -> dict:
    return {
        "fold": k,
        **setting,
        "val_auc": _mean_auc(strategy),
        "rounds": int(getattr(strategy, "rounds", 1)),
        "converged": bool(getattr(strategy, "converged", True)),
    }


def cv_piece(piece) -> list[dict]:
    """One ``(fold, ridge)`` piece: every fit of ``method`` (checked by
    :func:`cross_validate`) on that fold at that ridge."""
    from strategies.runtime.engine import run_inprocess

    from .federation import make_strategy, max_rounds_for

    method, k, sites, cfg, w_grid, lams, rounds_grid, knobs = piece
    from strategies.client.guards import Guards

    clients = clients_of(sites, cfg.ridge, Guards().for_view())  # a fold's rows
    registry = Registry()
    rows = []
    if method in GRAUC_FUSED_METHODS:
        start = None
        for w in w_grid:
            beta0 = start
            for lam in lams[w]:
                point = cfg.replace(lam=lam, w_dist=w)
                strategy = make_strategy(method, point, len(sites), registry, beta0=beta0)
                run_inprocess(strategy, clients, max_rounds_for(method, point))
                beta0 = strategy.coefficients_std()
                start = beta0 if start is None else start
                setting = {
                    "lam": lam,
                    "w_dist": w,
                    "ridge": cfg.ridge,
                    "size_power": cfg.size_power,
                }
                rows.append(_row(k, {p: setting[p] for p in PARAMS[method]}, strategy))
    elif method == "individual":
        strategy = make_strategy("individual", cfg, len(sites), registry)
        run_inprocess(strategy, clients, max_rounds_for("individual", cfg))
        rows.append(_row(k, {"ridge": cfg.ridge}, strategy))
    elif method == "fedavg":
        from strategies.server.grauc import GrAUCFedAvg

        model, done = None, 0
        for total in rounds_grid:  # one FedAvg run, evaluated at each round count
            point = cfg.replace(fedavg_rounds=total - done)
            strategy = GrAUCFedAvg(point, len(sites), registry, initial=model)
            run_inprocess(strategy, clients, max_rounds_for("fedavg", point))
            model, done = strategy.global_model, total
            row = _row(k, {"ridge": cfg.ridge, "fedavg_rounds": total}, strategy)
            row["rounds"] = total
            rows.append(row)
    else:  # a comparator: its knob's values at this ridge (one fit without a knob)
        name = tuning.KNOBS[method].name if knobs else None
        for value in knobs or (None,):
            point = cfg if name is None else cfg.replace(**{name: value})
            strategy = make_strategy(method, point, len(sites), registry)
            run_inprocess(strategy, clients, max_rounds_for(method, point))
            setting = {"ridge": cfg.ridge, **({name: value} if name else {})}
            rows.append(_row(k, setting, strategy))
    return rows


def cross_validate(
    sites,
    cfg: GrAUCConfig,
    method: str = "grauc",
    grid: Grid | None = None,
    opts: tuning.CVOptions | None = None,
) -> pd.DataFrame:
    """Validation AUC for every setting of ``grid`` and fold.

    Folds are stratified within each site (seeded by ``opts.seed``).  For GrAUC-PFL each
    ``w_dist`` path after the first starts from the first one's largest-``lam`` fit (duals at
    zero).  The fused methods' pieces are ``(fold, ridge, size_power)``; the others'
    ``(fold, ridge)``.  CV fits use ``opts.tol`` and ``opts.max_rounds``.

    Parameters
    ----------
    sites : sequence of SiteData
        The sites' data.
    cfg : GrAUCConfig
        The settings the grid does not vary.
    method : str, optional
        A method of :data:`PARAMS`.
    grid : Grid, optional
        The values tried (default :class:`Grid`).
    opts : CVOptions, optional
        The folds, their seed, the fits' tolerance and round limit, the workers.

    Returns
    -------
    pandas.DataFrame
        One row per fold and setting: ``fold``, the method's :data:`PARAMS`, ``val_auc,
        rounds, converged``.
    """
    grid = grid or Grid()
    opts = opts or tuning.CVOptions()
    if method not in PARAMS:
        raise InputError(f"tune: cv is available for {', '.join(PARAMS)}, not {method}")
    knobs = tuning.knob_values(method, cfg, grid.knob) if method in FEDAVG_FAMILY[1:] else ()
    rng = np.random.default_rng([opts.seed, 1])
    folds = [tuning.stratified_folds(s.y_train, opts.folds, rng) for s in sites]
    if method == "mean-fusion":  # no graph: one lam path per ridge
        grid = replace(grid, w_dist=(cfg.w_dist,))
    fused = method in GRAUC_FUSED_METHODS
    powers = (
        tuple(dict.fromkeys(grid.size_power)) if fused and grid.size_power else (cfg.size_power,)
    )
    # the lam paths per (ridge, w_dist), for each site weighting (lam_max depends on it)
    lams = (
        {a: lam_grids(sites, cfg.replace(size_power=a), grid, method) for a in powers}
        if fused
        else {}
    )
    base = opts.fit_config(cfg)
    pieces = []
    for k in range(opts.folds):
        train = fold_sites(sites, folds, k)
        for ridge in grid.ridge:
            for a in powers:
                path = {w: lams[a][(ridge, w)] for w in grid.w_dist} if fused else {}
                point = base.replace(ridge=ridge, size_power=a)
                rounds = grid.fedavg_rounds
                pieces.append((method, k, train, point, grid.w_dist, path, rounds, knobs))
    progress = PieceProgress(f"{method} cv", len(pieces), opts.quiet)
    rows = run_items(cv_piece, pieces, opts.workers(len(pieces)), progress)
    table = pd.DataFrame([r for piece in rows for r in piece])
    order = ["fold", *PARAMS[method]]
    return table.sort_values(order, kind="stable", ascending=[True] + [False] * (len(order) - 1))


def tune(
    sites,
    cfg: GrAUCConfig,
    method: str = "grauc",
    grid: Grid | None = None,
    opts: tuning.CVOptions | None = None,
    widen: bool = False,
) -> tuple[GrAUCConfig, pd.DataFrame, pd.DataFrame]:
    """Cross-validate and choose the settings (:func:`cross_validate`, then
    :func:`strategies.stats.tuning.choose` by ``opts.rule``).

    Parameters
    ----------
    sites : sequence of SiteData
        The sites' data.
    cfg : GrAUCConfig
        The settings the grid does not vary.
    method : str, optional
        A method of :data:`PARAMS`.
    grid : Grid, optional
        The values tried (default :class:`Grid`).
    opts : CVOptions, optional
        The cross-validation's options.
    widen : bool, optional
        The fit command's: FedAvg's rounds grid is doubled while the choice is its largest
        value, up to :data:`ROUNDS_BOUND` times it (``table.attrs["extended"]``); a study
        keeps the grid it was given, as part of its design.

    Returns
    -------
    cfg : GrAUCConfig
        ``cfg`` with the tuned values.
    table : pandas.DataFrame
        The per-fold table (``cv.csv``).
    summary : pandas.DataFrame
        The per-setting summary (``mean, se, folds, chosen``).
    """
    opts = opts or tuning.CVOptions()
    grid = grid or Grid()
    table = cross_validate(sites, cfg, method, grid, opts)
    chosen, summary = tuning.choose(
        table, PARAMS[method], "val_auc", True, opts.rule, SIMPLEST[method]
    )
    if method == "fedavg" and widen:  # still rising at the most rounds tried: twice as many
        rounds, limit, added = grid.fedavg_rounds, ROUNDS_BOUND * max(grid.fedavg_rounds), []
        while int(chosen["fedavg_rounds"]) == max(rounds) and 2 * max(rounds) <= limit:
            added.append(2 * max(rounds))
            rounds = (*rounds, added[-1])
            if not opts.quiet:
                sys.stderr.write(
                    f"cv: fedavg chose the most rounds tried ({max(rounds) // 2}); trying "
                    f"{added[-1]} (up to {limit}, {ROUNDS_BOUND}x the grid's largest)\n"
                )
            table = cross_validate(sites, cfg, method, replace(grid, fedavg_rounds=rounds), opts)
            chosen, summary = tuning.choose(
                table, PARAMS[method], "val_auc", True, opts.rule, SIMPLEST[method]
            )
        table.attrs["extended"] = {"fedavg_rounds": added} if added else {}
    knob = tuning.KNOBS.get(method)
    integers = ["fedavg_rounds"] + ([knob.name] if knob is not None and knob.integer else [])
    for name in integers:
        if name in chosen:
            chosen[name] = int(chosen[name])
    return cfg.replace(**chosen), table, summary


__all__ = [
    "Grid",
    "PARAMS",
    "cross_validate",
    "cv_piece",
    "fold_sites",
    "lam_grids",
    "lam_max_of",
    "lam_maxes",
    "tune",
]
