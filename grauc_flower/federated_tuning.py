"""GrAUC-PFL's tuning inside the federation (docs/methods.md 3.12): the top of each ``lam``
path, every (fold, setting) fit beside the all-rows fit at every setting, the choice and
the refit, as one batched Flower run (:class:`strategies.server.batch.BatchStrategy`) on every
engine; a plain fit's calibration is the same plan at one setting."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pandas as pd

from strategies.config import GRAUC_FUSED_METHODS, GrAUCConfig
from strategies.errors import InputError
from strategies.server.batch import pooled_by_site
from strategies.server.registry import Registry
from strategies.stats import tuning

from .federation import clients_of
from .tuning import LAM_RATIO, N_LAM, PARAMS, RIDGE_GRID, SIMPLEST, W_DIST_GRID, Grid

#: A fusion level far above any ``lam_max``: the fit at it is each component's common fit
#: (the top of the path; docs/methods.md 3.12).
COMMON_LAM = 1e12


def check_folds(registry: Registry, k: int, borrow: bool = False) -> tuple[list, dict]:
    """The sites with fewer than :data:`strategies.stats.tuning.SMALL_FOLD` validation rows of a
    class per fold, and ``{site: folds it scores}`` for the sites with fewer rows of a class
    than ``k``: such a site trains in every fold and has a validation AUC in the folds that
    hold both its classes (its smaller class is dealt one row a fold), its other folds adding
    nothing to the criterion.

    Parameters
    ----------
    registry : Registry
        The registered sites (their class counts ``n_pos``, ``n_neg``).
    k : int
        The number of folds; an error when no site has ``k`` rows of each class.
    borrow : bool, optional
        ``missing-class = borrow``: a site without a class takes part without an AUC of its
        own (in neither result).

    Returns
    -------
    small : list of str
        The sites with small folds.
    partial : dict of str to int
        The sites with fewer than ``k`` rows of a class, each with its smaller class's
        count (the folds it scores).
    """
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
    """The plan of :class:`strategies.server.batch.BatchStrategy` that tunes ``method`` (GrAUC-PFL
    or mean fusion) inside the federation (docs/methods.md 3.12):

    1. *top of the path*: one fit per ``(ridge, size_power)`` and graph component pattern at
       :data:`COMMON_LAM` (each component's common fit); each site's gradient there gives
       ``lam_max`` per ``(ridge, w_dist, size_power)`` (:func:`strategies.stats.tuning.lam_max`);
       skipped when ``grid.lam`` is given;
    2. *cross-validation*: every ``(fold, setting)`` fit side by side on each site's own
       folds (stratified, :func:`strategies.client.folds.site_folds`), and, alongside, the fit on
       all rows at every setting (the refit, so that it costs no rounds of its own; not with
       ``inference = oracle``, whose refit follows the choice); then one batched evaluation:
       each site's AUC and surrogate loss per fold and its AUC of the pooled out-of-fold
       scores per setting;
    3. the choice (:func:`strategies.stats.tuning.choose` by ``opts.criterion`` and ``opts.rule``);
       the result is the all-rows fit at the chosen setting.

    Fits start as a plain fit does (``cfg.init``); the refit therefore equals a plain fit at
    the chosen setting.

    Parameters
    ----------
    cfg : GrAUCConfig
        The settings the grid does not vary.
    method : str
        ``"grauc"`` or ``"mean-fusion"`` (which has one ``w_dist``: ``cfg``'s).
    grid : Grid
        The values tuned (an empty ``lam``: each path from its ``lam_max``; an empty
        ``size_power``: from the sites' sizes).
    opts : CVOptions
        The folds, their repeats and seed, the criterion and rule, the fits' tolerance and
        round limit.

    Returns
    -------
    callable
        ``plan(batch)``, a generator of the stages; it leaves ``batch.outputs`` (``table``
        (``cv.csv``), ``summary``, ``tuned``, ``small_sites``, ``calibration``, ...) and
        returns the refit's job key.
    """
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
        from strategies.server.grauc import GrAUCStrategy

        return GrAUCStrategy(point, len(registry.sites), registry, graph_builder=build_graph,
                             fusion=fuse)  # fmt: skip

    def plan(batch):
        from strategies.server.batch import Job, Stage

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
        lams = yield from _path_tops(batch, cfg, method, grid, w_grid, powers, strategy)
        # 2. every (fold, setting) fit, and the all-rows fit at every setting
        settings = [
            {"lam": lam, "w_dist": w, "ridge": r, "size_power": a}
            for r in grid.ridge
            for a in powers
            for w in w_grid
            for lam in lams[(r, w, a)]
        ]
        cv_jobs = _fold_jobs(batch, base, settings, opts, params, strategy)
        full = {}
        if cfg.inference == "none":  # the refit beside the folds, at every setting
            full = {i: Job(f"full/{i}", strategy(cfg.replace(**setting), registry),
                           {"ridge": setting["ridge"]})
                    for i, setting in enumerate(settings)}  # fmt: skip
        yield Stage(cv_jobs, evaluate=True, name="cross-validation", also=list(full.values()))
        # 3. the choice
        table, site_table = federated_tables(cv_jobs, batch.pooled, settings, params, order)
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


def _fold_jobs(batch, base: GrAUCConfig, settings: list, opts, params, strategy) -> list:
    """:func:`federated_plan`'s cross-validation jobs: a fit of each setting on each
    ``(repeat, fold)`` view of every site's rows, at ``base`` (the fits' tolerance and
    round limit); its scores are keyed by the fold (and repeat) and the tuned parameters."""
    from strategies.server.batch import Job

    cv_jobs = []
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
    return cv_jobs


def _path_tops(batch, cfg: GrAUCConfig, method: str, grid: Grid, w_grid, powers, strategy):
    """:func:`federated_plan`'s first stage: each ``(ridge, size_power)`` and graph
    component pattern's common fit at :data:`COMMON_LAM`, whose sites' gradients give
    ``lam_max`` and so the ``lam`` path of each ``(ridge, w_dist, size_power)`` (a stage of
    its own; none when ``grid.lam`` is given).  Returns ``{(ridge, w_dist, size_power):
    lam values}``."""
    from strategies.server.batch import Job, Stage

    from .graph import build_graph

    registry = batch.registry
    order = registry.order()
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
                grads = np.asarray(qn.sites.grad, dtype=float)
            for w in w_grid:
                weights = graph.weights(w, cfg.q)
                if tuple(tuning.components(graph.edges, weights, len(order))) != labels:
                    continue
                if method == "mean-fusion":
                    top, _ = tuning.lam_max_mean(grads, cfg.penalty == "group")
                else:
                    top, _ = tuning.lam_max(graph.edges, weights, grads, cfg.penalty == "group")
                lams[(r, w, a)] = tuning.log_path(top, N_LAM, LAM_RATIO)
    return lams


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
    :meth:`strategies.stats.tuning.CVOptions.waves` of the most fits a stage of
    :func:`federated_plan` starts (every setting's folds and its all-rows fit)."""
    opts, grid = tune
    lams = len(set(grid.lam)) or N_LAM + 1
    powers = len(set(grid.size_power)) or 2
    settings = lams * len(set(grid.w_dist)) * len(set(grid.ridge)) * powers
    return opts.waves(settings * (opts.folds * opts.repeats + 1))


def federated_strategy(cfg, method, opts, grid, n_sites, registry, timeout=None, progress=None):
    """The :class:`strategies.server.batch.BatchStrategy` of :func:`federated_plan`: tuning and
    refit of ``method`` as one Flower run, on either engine.

    Parameters
    ----------
    cfg : GrAUCConfig
        The settings the grid does not vary (each grid value of ``ridge`` and ``w_dist`` is
        checked against them).
    method : str
        ``"grauc"`` or ``"mean-fusion"``.
    opts : CVOptions
        The cross-validation's options (also the batch's worker processes and most fits at
        once).
    grid : Grid
        The values tuned.
    n_sites : int
        The number of sites the run waits for.
    registry : Registry
        The sites' registry.
    timeout : float, optional
        Seconds registration and each round wait for the sites.
    progress : callable, optional
        ``progress(line)``: a line per round.

    Returns
    -------
    BatchStrategy
        The batched run.
    """
    from strategies.server.batch import tuning_batch

    for value in grid.ridge:
        cfg.replace(ridge=value)  # a value out of range names the setting
    for value in grid.w_dist:
        cfg.replace(w_dist=value)
    plan = federated_plan(cfg, method, grid, opts)
    return tuning_batch(plan, n_sites, registry, opts, timeout, progress)


def tuned_strategy(method, cfg, n_sites, registry, tune, progress=None, timeout=None):
    """``method`` tuned inside the federation and refitted, as one batched run; its result adds
    :func:`federated_outputs`.

    Parameters
    ----------
    method : str
        A fused method (``"grauc"``, ``"mean-fusion"``); another is an error.
    cfg : GrAUCConfig
        The settings the grid does not vary.
    n_sites : int
        The number of sites the run waits for.
    registry : Registry
        The sites' registry.
    tune : tuple
        ``(CVOptions, Grid)``.
    progress : callable, optional
        ``progress(line)``: a line per round.
    timeout : float, optional
        Seconds registration and each round wait for the sites.

    Returns
    -------
    BatchStrategy
        The batched run, its ``describe()`` giving :func:`federated_outputs`.
    """
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
    """``method`` tuned inside the federation (as ``tune.by = "cv"`` does) and refitted,
    through the in-process engine.

    Parameters
    ----------
    cfg : GrAUCConfig
        The settings the grid does not vary.
    sites : sequence of SiteData
        The sites' data.
    method : str
        A fused method (``"grauc"``, ``"mean-fusion"``).
    tune : tuple
        ``(CVOptions, Grid)``.
    progress : callable, optional
        ``progress(line)``: a line per round.
    guards : Guards, optional
        The sites' floors.

    Returns
    -------
    MethodResult
        The refit, the tuning's outputs in ``extra``
        (:class:`~grauc_flower.federation.MethodResult`).
    """
    from strategies.runtime.engine import run_inprocess

    from .federation import collect, max_rounds_for

    clients = clients_of(sites, cfg.ridge, guards)
    strategy = tuned_strategy(method, cfg, len(sites), Registry(), tune, progress=progress)
    run_inprocess(strategy, clients, max_rounds_for(method, cfg, True, tuning_waves(tune)))
    return collect(method, strategy)


def federated_outputs(batch, method: str, opts: tuning.CVOptions) -> dict:
    """What a finished federated tuning adds to its fit's outputs, by RowFed's keys.

    Parameters
    ----------
    batch : BatchStrategy
        The finished run (its ``outputs``, rounds, fits and refit).
    method : str
        The tuned method.
    opts : CVOptions
        The cross-validation's options.

    Returns
    -------
    dict
        ``tuning_table`` (``("cv.csv", table)``), ``tuning_metrics`` (``tuned``, ``cv`` with
        the criterion, ``tuning`` with the rounds and fits it took, ``tuning_time``,
        ``calibration``),
        ``calibration`` (the table) and the chosen ``config``.
    """
    from strategies.runtime.tuning_options import tuning_metrics

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
    return {"tuning_table": ("cv.csv", out["table"]), "tuning_metrics": metrics, "calibration": cal,
            "config": batch.result.strategy.cfg}  # fmt: skip


def calibration_table(pooled: dict, i: int, order) -> pd.DataFrame:
    """``calibration.csv``: each site's logistic recalibration of its pooled out-of-fold
    scores at setting ``i`` (the mean over repeats of the folds), its standard errors, and
    the estimates shrunk toward the sites' mean (``intercept``, ``slope``: what ``predict
    --probability`` uses; strategies/stats/calibration.py, docs/methods.md 3.14).

    Parameters
    ----------
    pooled : dict
        The batch's pooled out-of-fold results (:attr:`BatchStrategy.pooled`).
    i : int
        The setting's index.
    order : sequence of str
        The sites, in the table's order (a site without results gets NaN).

    Returns
    -------
    pandas.DataFrame
        The table, a row per site.
    """
    from strategies.stats.calibration import calibration_frame

    cols = ("cal_a", "cal_b", "cal_vaa", "cal_vbb", "n_pos", "n_neg")
    got = {c: pooled_by_site(pooled, i, c) for c in cols}
    nan = float("nan")
    column = {c: [got[c].get(s, nan) for s in order] for c in cols}
    return calibration_frame(order, column["n_pos"], column["n_neg"], column["cal_a"],
                             column["cal_b"], column["cal_vaa"], column["cal_vbb"])  # fmt: skip


def federated_tables(cv_jobs, pooled, settings, params, order):
    """``cv.csv`` (a row per fold and setting: the sites' mean validation AUC and surrogate
    loss, the setting's mean pooled out-of-fold AUC, rounds, converged) and the per-site
    table of the pooled AUC (the ``pooled`` criterion's).

    Parameters
    ----------
    cv_jobs : list of strategies.server.batch.Job
        The cross-validation's finished jobs (a fold at a setting each), evaluated.
    pooled : dict
        The batch's pooled out-of-fold scores (``BatchStrategy.pooled``): by the jobs'
        group, each site's scores.
    settings : list of dict
        The settings of the grid, in the order of the groups (:func:`pooled_by_site`).
    params : sequence of str
        The tuned parameters (the settings' keys the tables carry).
    order : sequence of str
        The sites in federation order.

    Returns
    -------
    table : pandas.DataFrame
        ``cv.csv``'s rows, by fold (and repeat) then setting.
    site_table : pandas.DataFrame
        A row per site and setting: its pooled out-of-fold AUC.
    """
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
    "federated_tables",
    "run_tuned_inprocess",
    "tuned_strategy",
    "tuning_waves",
]
