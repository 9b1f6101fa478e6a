"""Cross-validation of GrAUC-PFL and its baselines (docs/methods.md 3.4): ``fit --tune cv``
and the studies.

GrAUC-PFL: a grid over ``lam x w_dist x ridge``; for each ``(ridge, w_dist)`` the ``lam``
path is fitted in descending order with warm starts.  By default the ``lam`` grid starts at
``lam_max`` (:func:`lam_max_of`: the smallest level at which every site of a component has
the same coefficients) and goes down to ``lam_max * 1e-3`` (12 values) and 0.  Individual
fits: a grid over ``ridge``.  FedAvg: ``ridge x fedavg_rounds`` (the rounds path continues
one run: FedAvg's next round depends only on the global model).  The other comparators:
``ridge x`` their own setting (:data:`strategies.tuning.KNOBS`: FedProx's and Ditto's
``mu``, the adaptive servers' ``eta``, IFCA's ``k``, ...).  The criterion is the mean
validation AUC over sites (sites whose validation fold lacks a class are left out).

The pieces run in a process pool, one per ``(fold, ridge)``.
"""

from __future__ import annotations

import functools
import sys
import warnings
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from strategies import tuning
from strategies.batch import pooled_by_site
from strategies.config import FEDAVG_FAMILY, GRAUC_FUSED_METHODS, GrAUCConfig
from strategies.errors import InputError
from strategies.registry import Registry

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
    knob: tuple | None = None  # a comparator's own setting (strategies.tuning.KNOBS)
    #: The fused methods' site weighting ``size_power`` (empty: the config's value).
    size_power: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "lam", tuple(sorted(set(self.lam), reverse=True)))
        rounds = tuple(sorted({int(r) for r in self.fedavg_rounds}))
        if not rounds or rounds[0] < 1:
            raise InputError(f"rounds-grid: values must be integers >= 1, got {rounds!r}")
        object.__setattr__(self, "fedavg_rounds", rounds)


#: The columns naming a setting, per method (``cv.csv``; ``metrics.json: tuned``): the
#: ridge and, for a comparator, its knob (:data:`strategies.tuning.KNOBS`).
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
    """``lam_max`` at ``cfg``'s ridge, w_dist, q, graph and penalty (:func:`lam_maxes`)."""
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
    component's common fit (:func:`strategies.tuning.common_fit`, then
    :func:`strategies.tuning.lam_max`).

    The sites answer ``gradient`` instructions, as in a ``pqn`` round; the server sums them.
    The common fit depends on the ridge only, so it is computed once per ridge (and
    component).  On a tree the level is exact; for ``knn``/``complete`` graphs exact with the
    L1 penalty and an upper bound with the group penalty."""
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
    :func:`strategies.tuning.lam_max_mean`."""
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
    :func:`strategies.tuning.log_path` below :func:`lam_maxes` (mean-fusion:
    :func:`lam_maxes_mean`, the same for every ``w_dist``)."""
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
    """Each site's training rows outside fold ``k`` for training, fold ``k`` for validation."""
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
    from strategies.guards import Guards

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
        from strategies.grauc import GrAUCFedAvg

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
    """Validation AUC for every setting of ``grid`` and fold: one row per fold and setting
    (columns ``fold``, the method's :data:`PARAMS`, ``val_auc, rounds, converged``).

    Folds are stratified within each site (seeded by ``opts.seed``).  For GrAUC-PFL each
    ``w_dist`` path after the first starts from the first one's largest-``lam`` fit (duals at
    zero).  The fused methods' pieces are ``(fold, ridge, size_power)``; the others'
    ``(fold, ridge)``.  CV fits use ``opts.tol`` and ``opts.max_rounds``."""
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
    progress = tuning.PieceProgress(f"{method} cv", len(pieces), opts.quiet)
    rows = tuning.run_items(cv_piece, pieces, opts.workers(len(pieces)), progress)
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
    """Cross-validate and return the settings chosen (``cfg`` with the tuned values), the
    per-fold table (``cv.csv``) and the per-setting summary (``mean, se, folds, chosen``).

    ``widen`` (the fit command's): FedAvg's rounds grid is doubled while the choice is its
    largest value, up to :data:`ROUNDS_BOUND` times it (``table.attrs["extended"]``); a
    study keeps the grid it was given, as part of its design."""
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


# ---------------------------------------------------------------------------------------
# The federated tuning: the whole cross-validation as one batched Flower run
# ---------------------------------------------------------------------------------------
#: A fusion level far above any ``lam_max``: the fit at it is each component's common fit
#: (the top of the path; docs/methods.md 3.12).
COMMON_LAM = 1e12


def check_folds(registry: Registry, k: int, borrow: bool = False) -> tuple[list, dict]:
    """The sites with fewer than :data:`strategies.tuning.SMALL_FOLD` validation rows of a
    class per fold, and ``{site: folds it scores}`` for the sites with fewer rows of a class
    than ``k``: such a site trains in every fold
    and has a validation AUC in the folds that hold both its classes (its smaller class is
    dealt one row a fold), its other folds adding nothing to the criterion.  With ``borrow``
    (``missing-class = borrow``) a site without a class takes part without an AUC of its
    own."""
    small, partial, most = [], {}, 0
    for site in registry.order():
        meta = registry.sites[site].meta
        least = min(int(meta["n_pos"]), int(meta["n_neg"]))
        most = max(most, least)
        if borrow and least == 0:
            continue
        if least < k:
            partial[site] = least
        elif least / k < tuning.SMALL_FOLD:
            small.append(site)
    if most < k:  # then some fold holds both classes at no site: it could score nothing
        raise InputError(
            f"folds: no site has {k} training rows of each class (at most {most}); give fewer "
            "--folds"
        )
    return small, partial


def federated_plan(cfg: GrAUCConfig, method: str, grid: Grid, opts: tuning.CVOptions):
    """The plan of :class:`strategies.batch.BatchStrategy` that tunes ``method`` (GrAUC-PFL
    or mean fusion) inside the federation (docs/methods.md 3.12):

    1. *top of the path*: one fit per ``(ridge, size_power)`` and graph component pattern at
       :data:`COMMON_LAM` (each component's common fit); each site's gradient there gives
       ``lam_max`` per ``(ridge, w_dist, size_power)`` (:func:`strategies.tuning.lam_max`);
       skipped when ``grid.lam`` is given;
    2. *cross-validation*: every ``(fold, setting)`` fit side by side on each site's own
       folds (stratified, :func:`strategies.folds.site_folds`), and, alongside, the fit on
       all rows at every setting (the refit, so that it costs no rounds of its own; not with
       ``inference = oracle``, whose refit follows the choice); then one batched evaluation:
       each site's AUC and surrogate loss per fold and its AUC of the pooled out-of-fold
       scores per setting;
    3. the choice (:func:`strategies.tuning.choose` by ``opts.criterion`` and ``opts.rule``);
       the result is the all-rows fit at the chosen setting.

    Fits start as a plain fit does (``cfg.init``); the refit therefore equals a plain fit at
    the chosen setting.  The plan leaves ``batch.outputs``: ``table`` (``cv.csv``),
    ``summary``, ``tuned``, ``small_sites``."""
    from .graph import build_graph

    if method not in GRAUC_FUSED_METHODS:
        raise InputError(
            f"tune: the federated cv is available for grauc, mean-fusion, not {method}"
        )
    base = opts.fit_config(cfg)
    fusion = "graph" if method == "grauc" else "mean"
    w_grid = grid.w_dist if method == "grauc" else (cfg.w_dist,)
    params = PARAMS[method]

    def strategy(point: GrAUCConfig, registry, fuse: str = fusion):
        from strategies.grauc import GrAUCStrategy

        return GrAUCStrategy(point, len(registry.sites), registry, graph_builder=build_graph,
                             fusion=fuse)  # fmt: skip

    def plan(batch):
        from strategies.batch import Job, Stage

        registry = batch.registry
        order = registry.order()
        sizes = [registry.sites[s].n for s in order]
        powers = tuple(dict.fromkeys(grid.size_power)) or tuning.size_powers(sizes, cfg)
        small, partial = check_folds(registry, opts.folds, cfg.missing_class == "borrow")
        # the notes are about choosing: a one-setting plan (a plain fit's calibration)
        # chooses nothing, and its pooled out-of-fold scores take every fold a site fills
        one = len(grid.lam) == 1 and len(w_grid) == 1 and len(grid.ridge) == 1
        if not (one and len(powers) == 1):
            tuning.warn_small_folds(small, "site", "rows of a class", "AUCs")
            tuning.note_partial_folds(partial, opts.folds, "site", "rows of a class", "AUC")
        # 1. the top of each path
        lams: dict[tuple, tuple] = {}
        if grid.lam:
            lams = {(r, w, a): grid.lam for r in grid.ridge for w in w_grid for a in powers}
        else:
            meta = [registry.sites[s].meta for s in order]
            lat = np.array([float(m["lat"]) for m in meta])
            lon = np.array([float(m["lon"]) for m in meta])
            graph = build_graph(lat, lon, cfg.graph, cfg.knn_k)
            patterns: dict[tuple, float] = {}  # component labels -> a w_dist that has them
            for w in w_grid:
                labels = tuning.components(graph.edges, graph.weights(w, cfg.q), len(order))
                patterns.setdefault(tuple(labels), w)
            tops = {}
            for r in grid.ridge:
                for a in powers:
                    for labels, w in patterns.items():
                        point = cfg.replace(
                            lam=COMMON_LAM, w_dist=w, ridge=r, size_power=a, inference="none"
                        )
                        key = f"top/r{r!r}/a{a!r}/w{w!r}"
                        tops[(r, a, labels)] = Job(key, strategy(point, registry), {"ridge": r})
            yield Stage(list(tops.values()), name="top of the path")
            for (r, a, labels), job in tops.items():
                qn = job.strategy.qn
                grads = np.zeros((len(order), registry.sites[order[0]].sum_x.shape[0]))
                if qn is not None:
                    grads = np.asarray(qn.grad, dtype=float)
                for w in w_grid:
                    weights = graph.weights(w, cfg.q)
                    if tuple(tuning.components(graph.edges, weights, len(order))) != labels:
                        continue
                    if method == "mean-fusion":
                        top, _ = tuning.lam_max_mean(grads, cfg.penalty == "group")
                    else:
                        top, _ = tuning.lam_max(graph.edges, weights, grads, cfg.penalty == "group")
                    lams[(r, w, a)] = tuning.log_path(top, N_LAM, LAM_RATIO)
        # 2. every (fold, setting) fit, and the all-rows fit at every setting
        settings = [
            {"lam": lam, "w_dist": w, "ridge": r, "size_power": a}
            for r in grid.ridge
            for a in powers
            for w in w_grid
            for lam in lams[(r, w, a)]
        ]
        speculative = cfg.inference == "none"
        cv_jobs, full = [], {}
        for i, setting in enumerate(settings):
            for rep in range(opts.repeats):
                for k in range(opts.folds):
                    view = {"fold": k, "folds": opts.folds, "fold-seed": opts.seed,
                            "ridge": setting["ridge"]}  # fmt: skip
                    if opts.repeats > 1:
                        view["repeat"] = rep
                    job = Job(
                        f"cv/{i}/{rep}/{k}",
                        strategy(base.replace(**setting), batch.registry_for(view)),
                        view,
                        {"fold": k, **({"repeat": rep} if opts.repeats > 1 else {}),
                         **{p: setting[p] for p in params}},
                        group=f"s{i}/r{rep}",
                    )  # fmt: skip
                    cv_jobs.append(job)
            if speculative:
                full[i] = Job(
                    f"full/{i}",
                    strategy(cfg.replace(**setting), registry),
                    {"ridge": setting["ridge"]},
                )
        yield Stage(cv_jobs, evaluate=True, name="cross-validation", also=list(full.values()))
        # 3. the choice
        table, site_table = _federated_tables(cv_jobs, batch.pooled, settings, params, order)
        score, maximize, frame = {
            "folds": ("val_auc", True, table),
            "loss": ("val_loss", False, table),
            "pooled": ("pooled_auc", True, site_table),
        }[opts.criterion]
        chosen, summary = tuning.choose(frame, params, score, maximize, opts.rule, SIMPLEST[method])
        i = next(j for j, s in enumerate(settings) if all(s[p] == chosen[p] for p in params))
        cal = calibration_table(batch.pooled, i, order)
        batch.outputs = {"table": table, "summary": summary, "tuned": chosen, "score": score,
                         "maximize": maximize, "small_sites": small,
                         "partial_sites": partial,
                         "lam_path": not grid.lam, "calibration": cal}  # fmt: skip
        # the refit's evaluation scores each site's calibrated risks on its test rows (a
        # refit that ran beside the folds and was evaluated with them is asked once more)
        shrunk = zip(cal["site"], cal["intercept"], cal["slope"], strict=True)
        site_cal = {s: (a, b) for s, a, b in shrunk}
        refit = i not in full
        if refit:
            full[i] = Job(
                f"full/{i}",
                strategy(cfg.replace(**settings[i]), registry),
                {"ridge": settings[i]["ridge"]},
            )
        full[i].strategy.calibrate(site_cal)
        if refit:
            yield Stage([full[i]], name="refit")
        return full[i].key

    return plan


def federated_options(tc) -> tuple[tuning.CVOptions, Grid]:
    """The options and grid of a :class:`strategies.config.TuneConfig` (``tune.*`` keys)."""

    def values(text: str, key: str) -> tuple:
        return tuning.parse_grid(text, key) if text.strip() else ()

    opts = tuning.CVOptions(
        folds=tc.folds, rule=tc.rule, tol=tc.tol, max_rounds=tc.max_rounds, seed=tc.fold_seed,
        quiet=True, criterion=tc.criterion, repeats=tc.repeats, jobs=tc.jobs,
        max_fits=tc.max_fits,
    )  # fmt: skip
    grid = Grid(
        lam=values(tc.lam_grid, "tune.lam-grid"),
        w_dist=values(tc.w_dist_grid, "tune.w-dist-grid") or W_DIST_GRID,
        ridge=values(tc.ridge_grid, "tune.ridge-grid") or RIDGE_GRID,
        size_power=values(tc.size_power_grid, "tune.size-power-grid"),
    )
    return opts, grid


def tuning_waves(tune) -> int:
    """The factor on a federated tuning's round budget (``tune``: ``(CVOptions, Grid)``):
    :meth:`strategies.tuning.CVOptions.waves` of the most fits a stage of
    :func:`federated_plan` starts (every setting's folds and its all-rows fit)."""
    opts, grid = tune
    lams = len(set(grid.lam)) or N_LAM + 1
    powers = len(set(grid.size_power)) or 2
    settings = lams * len(set(grid.w_dist)) * len(set(grid.ridge)) * powers
    return opts.waves(settings * (opts.folds * opts.repeats + 1))


def federated_strategy(cfg, method, opts, grid, n_sites, registry, timeout=None, progress=None):
    """The :class:`strategies.batch.BatchStrategy` of :func:`federated_plan`: tuning and
    refit of ``method`` as one Flower run, on either engine."""
    from strategies.batch import tuning_batch

    for value in grid.ridge:
        cfg.replace(ridge=value)  # a value out of range names the setting
    for value in grid.w_dist:
        cfg.replace(w_dist=value)
    plan = federated_plan(cfg, method, grid, opts)
    return tuning_batch(plan, n_sites, registry, opts, timeout, progress)


def tuned_strategy(method, cfg, n_sites, registry, tune, progress=None, timeout=None):
    """``method`` tuned inside the federation and refitted, as one batched run (``tune``:
    ``(CVOptions, Grid)``); its result adds :func:`federated_outputs`."""
    opts, grid = tune
    if method not in GRAUC_FUSED_METHODS:
        raise InputError(
            f"tune.by: the federated tuning is for {', '.join(GRAUC_FUSED_METHODS)}, not "
            f"{method} (fit --tune cv tunes the comparators in process)"
        )
    batch = federated_strategy(cfg, method, opts, grid, n_sites, registry, timeout, progress)
    batch.method, batch.opts = method, opts
    batch.describe = functools.partial(federated_outputs, batch, method, opts)
    return batch


def run_tuned_inprocess(
    cfg: GrAUCConfig, sites, method: str, tune, progress=None, guards=None
):  # fmt: skip
    """``method`` tuned inside the federation (``tune``: ``(CVOptions, Grid)``, as
    ``tune.by = "cv"`` does) and refitted, through the in-process engine: its
    :class:`~grauc_flower.federation.MethodResult` (``guards``: the sites' floors)."""
    from strategies.runtime.engine import run_inprocess

    from .federation import collect, max_rounds_for

    clients = clients_of(sites, cfg.ridge, guards)
    strategy = tuned_strategy(method, cfg, len(sites), Registry(), tune, progress=progress)
    run_inprocess(strategy, clients, max_rounds_for(method, cfg, True, tuning_waves(tune)))
    return collect(method, strategy)


def federated_outputs(batch, method: str, opts: tuning.CVOptions) -> dict:
    """What a finished federated tuning adds to its fit's outputs: ``cv_table``
    (``cv.csv``), the metrics (``tuned``, ``cv`` with the criterion, ``tuning`` with the
    rounds and fits it took) and the chosen ``config``."""
    from strategies.runtime.cli import tuning_metrics

    out = batch.outputs
    # an automatic path's largest lam is lam_max: every site fused, nothing beyond it
    top = (("lam", "largest"),) if out["lam_path"] else ()
    metrics = tuning_metrics(
        out["summary"], PARAMS[method], out["score"], out["maximize"], opts, no_edge=top
    )
    metrics["cv"].update(criterion=opts.criterion, repeats=opts.repeats)
    metrics["tuning"] = {
        "engine": "federated",
        "rounds": int(batch.rounds),
        "fits": int(batch.fits),
        "small_sites": list(out["small_sites"]),
        "partial_sites": dict(out["partial_sites"]),
    }
    metrics["tuning_time"] = batch.timing()
    cal = out["calibration"]
    metrics["calibration"] = {
        "from": "each site's pooled out-of-fold scores at the chosen setting",
        "model": "expit(intercept + slope * score), per site, shrunk toward the sites' mean",
        "between_site_variance": {"intercept": cal.attrs["tau2"][0], "slope": cal.attrs["tau2"][1]},
    }
    return {"cv_table": out["table"], "cv_metrics": metrics, "calibration": cal,
            "config": batch.result.strategy.cfg}  # fmt: skip


def calibration_table(pooled: dict, i: int, order) -> pd.DataFrame:
    """``calibration.csv``: each site's logistic recalibration of its pooled out-of-fold
    scores at setting ``i`` (the mean over repeats of the folds), its standard errors, and
    the estimates shrunk toward the sites' mean (``intercept``, ``slope``: what ``predict
    --probability`` uses; strategies/calibration.py, docs/methods.md 3.14)."""
    from strategies.calibration import calibration_frame

    cols = ("cal_a", "cal_b", "cal_vaa", "cal_vbb", "n_pos", "n_neg")
    got = {c: pooled_by_site(pooled, i, c) for c in cols}
    nan = float("nan")
    column = {c: [got[c].get(s, nan) for s in order] for c in cols}
    return calibration_frame(order, column["n_pos"], column["n_neg"], column["cal_a"],
                             column["cal_b"], column["cal_vaa"], column["cal_vbb"])  # fmt: skip


def _federated_tables(cv_jobs, pooled, settings, params, order):
    """``cv.csv`` (a row per fold and setting: the sites' mean validation AUC and surrogate
    loss, the setting's mean pooled out-of-fold AUC, rounds, converged) and the per-site
    table of the pooled AUC (the ``pooled`` criterion's)."""
    rows = []
    for job in cv_jobs:
        ev = job.strategy.evaluation
        aucs = np.array([ev[s]["auc"] for s in order if s in ev], dtype=float)
        losses = np.array([ev[s]["loss"] for s in order if s in ev], dtype=float)
        per_site = pooled.get(job.group, {})
        oof = np.array([per_site[s]["auc"] for s in order if s in per_site], dtype=float)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            rows.append(
                {
                    **job.setting,
                    "val_auc": float(np.nanmean(aucs)) if aucs.size else np.nan,
                    "val_loss": float(np.nanmean(losses)) if losses.size else np.nan,
                    "pooled_auc": float(np.nanmean(oof)) if oof.size else np.nan,
                    "rounds": int(job.strategy.rounds),
                    "converged": bool(job.strategy.converged),
                }
            )
    table = pd.DataFrame(rows)
    order = [c for c in ("fold", "repeat") if c in table.columns] + list(params)
    up = [True] * (len(order) - len(params)) + [False] * len(params)
    table = table.sort_values(order, kind="stable", ascending=up).reset_index(drop=True)
    site_rows = []
    for i, setting in enumerate(settings):
        for site, value in pooled_by_site(pooled, i, "auc").items():
            site_rows.append({"site": site, **{p: setting[p] for p in params}, "pooled_auc": value})
    return table, pd.DataFrame(site_rows)


__all__ = [
    "COMMON_LAM",
    "federated_options",
    "federated_outputs",
    "federated_plan",
    "federated_strategy",
    "Grid",
    "PARAMS",
    "cross_validate",
    "cv_piece",
    "fold_sites",
    "lam_grids",
    "lam_max_of",
    "lam_maxes",
    "run_tuned_inprocess",
    "tune",
    "tuned_strategy",
    "tuning_waves",
]
