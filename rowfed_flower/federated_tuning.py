"""RowFed's tuning inside the federation (docs/methods.md 2.5, 3.12): GIC over the grid, or
every (fold, setting) fit beside the all-rows fit at every setting, then the choice and the
refit, as one batched Flower run (:class:`strategies.server.batch.BatchStrategy`) on every
engine."""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd

from strategies.config import RowFedConfig
from strategies.errors import InputError
from strategies.runtime.engine import run_inprocess
from strategies.server.batch import pooled_by_site
from strategies.server.rowfed import rowfed_registry
from strategies.solvers.problems import degrees_of_freedom
from strategies.stats import tuning

from . import federation as fed
from .tuning import (
    AUTO,
    DEFAULT_LAM1_GRID,
    DEFAULT_LAM2_GRID,
    GIC_BY,
    N_LAM1,
    N_LAM2,
    PARAMS,
    TUNABLE,
    auto_levels,
    check_auto,
    gic_table,
    grid_levels,
    grid_values,
    params_of,
    settings_grid,
)

#: The methods the federated tuning tunes (a fused penalty, or NonFed's ``lam2``).
FEDERATED_TUNABLE = TUNABLE


def check_folds(registry, k: int) -> tuple[list, dict]:
    """The clients with small folds, and those with fewer rows than ``k``: such a client trains
    in every fold and has a validation MSE in the folds that hold one of its rows (they are
    dealt one a fold), its other folds adding nothing to the criterion.  An error when no
    client has ``k`` rows.

    Parameters
    ----------
    registry : Registry
        The federation's registry (each client's rows ``n``).
    k : int
        The number of folds.

    Returns
    -------
    small : list of str
        The clients with fewer than :data:`strategies.stats.tuning.SMALL_FOLD` validation
        rows per fold.
    partial : dict of str to int
        ``{client: folds it scores}`` for the clients with fewer rows than ``k``.
    """
    small, partial = [], {}
    for site in registry.order():
        n = registry.sites[site].n
        if n < k:
            partial[site] = n
        elif n / k < tuning.SMALL_FOLD:
            small.append(site)
    most = max((registry.sites[s].n for s in registry.order()), default=0)
    if most < k:  # then some fold has validation rows at no client: it could score nothing
        raise InputError(
            f"folds: no client has {k} training rows (at most {most}); give fewer --folds"
        )
    return small, partial


def federated_plan(
    cfg: RowFedConfig, method: str, by: str, opts: tuning.CVOptions, lam1_grid, lam2_grid,
    size_power_grid=None,
):  # fmt: skip
    """The plan of :class:`strategies.server.batch.BatchStrategy` that tunes ``method`` inside the
    federation (docs/methods.md 3.12).

    Every fit starts from its own start (``cfg.init``), so the result equals a plain fit at
    the chosen levels.  Leaves ``batch.outputs``.

    Parameters
    ----------
    cfg : RowFedConfig
        The fit's settings; the tuning chooses its levels.
    method : str
        One of :data:`FEDERATED_TUNABLE`.
    by : {"gic", "gic-nq", "cv"}
        ``gic`` or ``gic-nq`` (:data:`rowfed_flower.tuning.GIC_BY`): every grid point fitted
        side by side on all rows, one batched evaluation (each client's residual sum of
        squares), the smallest criterion (docs/methods.md 2.5); the result is that fit.  ``cv``:
        every ``(fold, setting)`` fit on each client's own random folds and, alongside, the
        all-rows fit at every setting (the refit; not with ``inference = oracle``, whose refit
        follows the choice); one batched evaluation (each client's validation MSE per fold
        and of its pooled out-of-fold predictions); the choice by ``opts.criterion``
        (``loss`` is the MSE, as ``folds``) and ``opts.rule``.
    opts : CVOptions
        The cross-validation's options (``cv``): folds, repeats, fold seed, criterion, rule
        and the fits' ``tol`` and ``max_rounds``.
    lam1_grid, lam2_grid : sequence of float or str
        The grids; :data:`rowfed_flower.tuning.AUTO` (both): the paths from the data
        (:func:`rowfed_flower.tuning.auto_levels`), the default grids where they cannot be
        drawn.
    size_power_grid : sequence of float, optional
        ``cv`` of a fused method: the site weightings to try
        (:func:`strategies.stats.tuning.size_powers`).

    Returns
    -------
    callable
        ``plan(batch)``: a generator that yields the stages and returns the chosen fit's
        job key.
    """
    if method not in FEDERATED_TUNABLE:
        raise InputError(
            f"tune: the federated tuning is for {', '.join(FEDERATED_TUNABLE)}, not {method} "
            "(fit --tune cv tunes the comparators in process)"
        )
    params = params_of(method) if by == "cv" else PARAMS

    def strategy(point, registry, own=method):
        return fed.make_strategy(own, point, len(registry.sites), registry)

    auto = check_auto(lam1_grid, lam2_grid)
    if auto:  # if the paths cannot be drawn (a fit without gradients): the fixed grids
        lam1_grid, lam2_grid = DEFAULT_LAM1_GRID, DEFAULT_LAM2_GRID

    def plan(batch):
        if by in GIC_BY:
            choice = yield from _gic_stages(batch, cfg, method, by, auto, (lam1_grid, lam2_grid),
                                            strategy)  # fmt: skip
            return choice
        choice = yield from _cv_stages(batch, cfg, method, opts, auto, (lam1_grid, lam2_grid),
                                       size_power_grid, params, strategy)  # fmt: skip
        return choice

    return plan


def _gic_stages(batch, cfg: RowFedConfig, method: str, by: str, auto: bool, grids, strategy):
    """:func:`federated_plan`'s stages for ``by`` in :data:`GIC_BY`: the paths' top (if
    ``auto``), every grid point's fit on all rows, one batched evaluation, the smallest
    criterion.  Returns the chosen fit's job key."""
    from strategies.server.batch import Job, Stage

    lam1_grid, lam2_grid = grids
    registry = batch.registry
    found = None
    if auto:
        found = yield from auto_levels(cfg, method, (cfg.size_power,), strategy, registry)
    levels = (found or {}).get(cfg.size_power) or grid_levels(method, cfg, lam1_grid, lam2_grid)
    jobs = [
        Job(
            f"gic/{i}",
            strategy(cfg.replace(lam1=a, lam2=b), registry),
            {},
            {"lam1": a, "lam2": b},
        )  # fmt: skip
        for i, (a, b) in enumerate(levels)
    ]
    yield Stage(jobs, evaluate=True, name="gic")
    rows = []
    for job in jobs:
        st = job.strategy
        labels, support = st.structure()
        rows.append(
            {
                **job.setting,
                "gic": st.gic(),
                **({"gic_nq": st.gic("nq")} if by == "gic-nq" else {}),
                "rss": st.rss(),
                "df": degrees_of_freedom(labels, support),
                "rounds": st.rounds,
                "converged": bool(st.converged),
                "objective": st.objective(),
            }
        )
    column = "gic_nq" if by == "gic-nq" else "gic"
    table, best = gic_table(rows, column)
    batch.outputs = {"table": table, "by": by, "best": rows[best], "column": column,
                     "lam_path": found is not None}  # fmt: skip
    return jobs[best].key


def _cv_stages(batch, cfg: RowFedConfig, method: str, opts: tuning.CVOptions, auto: bool,
               grids, size_power_grid, params, strategy):  # fmt: skip
    """:func:`federated_plan`'s stages for ``by = "cv"``: the paths' top (if ``auto``), every
    ``(fold, setting)`` fit beside the all-rows fit at every setting, one batched evaluation,
    the choice and, if its all-rows fit did not run alongside, the refit.  Returns the
    chosen fit's job key."""
    from strategies.server.batch import Job, Stage

    lam1_grid, lam2_grid = grids
    registry = batch.registry
    order = registry.order()
    sizes = [registry.sites[s].n for s in order]
    powers = ()
    if method in fed.FUSED_METHODS:
        powers = tuning.size_powers(sizes, cfg, size_power_grid)
    found = None
    if auto:
        found = yield from auto_levels(cfg, method, powers or (cfg.size_power,), strategy,
                                       registry)  # fmt: skip
    if found and all(found.values()):
        weighted = method in fed.FUSED_METHODS
        settings = [
            {"lam1": a, "lam2": b, **({"size_power": w} if weighted else {})}
            for w, levels in found.items()
            for a, b in levels
        ]
    else:
        found = None
        settings = settings_grid(method, cfg, lam1_grid, lam2_grid, None, powers)
    small, partial = check_folds(registry, opts.folds)
    tuning.warn_small_folds(small, "client", "rows", "MSEs")
    tuning.note_partial_folds(partial, opts.folds, "client", "rows", "MSE")
    base = opts.fit_config(cfg)
    speculative = cfg.inference == "none"
    cv_jobs, full = [], {}
    for i, setting in enumerate(settings):
        for rep in range(opts.repeats):
            for k in range(opts.folds):
                view = {"fold": k, "folds": opts.folds, "fold-seed": opts.seed}
                if opts.repeats > 1:
                    view["repeat"] = rep
                label = {"fold": k, **({"repeat": rep} if opts.repeats > 1 else {})}
                cv_jobs.append(
                    Job(
                        f"cv/{i}/{rep}/{k}",
                        strategy(base.replace(**setting), batch.registry_for(view)),
                        view,
                        {**label, **setting},
                        group=f"s{i}/r{rep}",
                    )  # fmt: skip
                )
        if speculative:
            full[i] = Job(f"full/{i}", strategy(cfg.replace(**setting), registry))
    yield Stage(cv_jobs, evaluate=True, name="cross-validation", also=list(full.values()))
    table, site_table = _cv_tables(cv_jobs, batch.pooled, settings, order)
    score, frame = ("pooled_mse", site_table) if opts.criterion == "pooled" else (
        "val_mse", table)  # fmt: skip
    knob = tuning.KNOBS.get(method)
    simplest = PARAMS if knob is None else (params[0], *knob.simplest)
    chosen, summary = tuning.choose(frame, params, score, False, opts.rule, simplest)
    i = next(j for j, s in enumerate(settings) if all(s[p] == chosen[p] for p in params))
    batch.outputs = {"table": table, "by": "cv", "summary": summary, "tuned": chosen,
                     "score": score, "small_sites": small, "partial_sites": partial,
                     "lam_path": found is not None}  # fmt: skip
    if i not in full:
        full[i] = Job(f"full/{i}", strategy(cfg.replace(**settings[i]), registry))
        yield Stage([full[i]], name="refit")
    return full[i].key


def _cv_tables(cv_jobs, pooled: dict, settings, order) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``cv.csv`` (a row per ``(fold, setting)``: the clients' mean validation MSE, their
    mean pooled out-of-fold MSE, rounds, converged; by fold, then repeat) and the per-client
    pooled MSEs of every setting."""
    rows, site_rows = [], []
    for job in cv_jobs:
        ev = job.strategy.evaluation
        # a client with fewer rows than folds has no validation rows in some folds
        # (it then scores its training rows): those add nothing
        mse = [ev[s]["mse_pred"] for s in order if ev.get(s, {}).get("split") == "test"]
        oof = pooled.get(job.group, {})
        pooled_mse = [oof[s]["mse"] for s in order if s in oof]
        rows.append({**job.setting, "val_mse": float(np.mean(mse)) if mse else np.nan,
                     "pooled_mse": float(np.mean(pooled_mse)) if pooled_mse else np.nan,
                     "rounds": int(job.strategy.rounds),
                     "converged": bool(job.strategy.converged)})  # fmt: skip
    for i, setting in enumerate(settings):
        for site, value in pooled_by_site(pooled, i, "mse").items():
            site_rows.append({"site": site, **setting, "pooled_mse": value})
    table = pd.DataFrame(rows)
    order_cols = [c for c in ("fold", "repeat") if c in table.columns]
    table = table.sort_values(order_cols, kind="stable").reset_index(drop=True)
    return table, pd.DataFrame(site_rows)


def federated_options(tc) -> tuple[tuning.CVOptions, tuple, tuple, tuple | None]:
    """The options and grids of a :class:`strategies.config.TuneConfig` (``tune.*``)."""
    opts = tuning.CVOptions(
        folds=tc.folds, rule=tc.rule, tol=tc.tol, max_rounds=tc.max_rounds, seed=tc.fold_seed,
        quiet=True, criterion=tc.criterion, repeats=tc.repeats, jobs=tc.jobs,
        max_fits=tc.max_fits,
    )  # fmt: skip
    lam1 = grid_values(tc.lam1_grid or None, DEFAULT_LAM1_GRID, "tune.lam1-grid")
    lam2 = grid_values(tc.lam2_grid or None, DEFAULT_LAM2_GRID, "tune.lam2-grid")
    powers = tc.size_power_grid or None
    return opts, lam1, lam2, powers


def tuning_waves(tune) -> int:
    """The factor on a federated tuning's round budget (``tune``: ``(by, options)``):
    :meth:`strategies.stats.tuning.CVOptions.waves` of the most fits a stage of
    :func:`federated_plan` starts (GIC: the grid; cv: every setting's folds and its
    all-rows fit, at up to two site weightings)."""
    by, (opts, lam1, lam2, powers) = tune
    n1 = max(N_LAM1, len(DEFAULT_LAM1_GRID)) if lam1 == AUTO else len(set(lam1))
    n2 = max(N_LAM2, len(DEFAULT_LAM2_GRID)) if lam2 == AUTO else len(set(lam2))
    if by in GIC_BY:
        return opts.waves(n1 * n2)
    return opts.waves(n1 * n2 * (len(set(powers or ())) or 2) * (opts.folds * opts.repeats + 1))


def federated_strategy(cfg, method, by, tune, n_sites, registry, timeout=None, progress=None):
    """The :class:`strategies.server.batch.BatchStrategy` of :func:`federated_plan`.

    Parameters
    ----------
    cfg : RowFedConfig
        The fit's settings; the tuning chooses its levels.
    method : str
        The tuned method.
    by : {"gic", "gic-nq", "cv"}
        The criterion (:func:`federated_plan`).
    tune : tuple
        ``(opts, lam1_grid, lam2_grid, size_power_grid)`` (:func:`federated_options`); fixed
        grids are checked before any round.
    n_sites : int
        The clients the run waits for.
    registry : Registry
        The federation's registry.
    timeout : float, optional
        Seconds registration waits for the clients.
    progress : callable, optional
        ``progress(line)``: a line per round.

    Returns
    -------
    BatchStrategy
        With ``method``, ``opts`` and ``by`` as attributes.
    """
    from strategies.server.batch import tuning_batch

    opts, lam1, lam2, powers = tune
    if not check_auto(lam1, lam2, "tune."):
        grid_levels(method, cfg, lam1, lam2)  # the grids checked before any round
    plan = federated_plan(cfg, method, by, opts, lam1, lam2, powers)
    batch = tuning_batch(plan, n_sites, registry, opts, timeout, progress)
    batch.method, batch.opts, batch.by = method, opts, by
    return batch


def tuned_strategy(method, cfg, n_sites, registry, tune, progress=None, timeout=None):
    """``method`` tuned inside the federation and refitted, as one batched run; its result adds
    :func:`federated_outputs`.

    Parameters
    ----------
    method : str
        The tuned method.
    cfg : RowFedConfig
        The fit's settings; the tuning chooses its levels.
    n_sites : int
        The clients the run waits for.
    registry : Registry
        The federation's registry.
    tune : tuple
        ``(by, options)``: the criterion (GIC or CV, :func:`federated_plan`) and
        :func:`federated_options`'s tuple.
    progress : callable, optional
        ``progress(line)``: a line per round.
    timeout : float, optional
        Seconds registration waits for the clients.

    Returns
    -------
    BatchStrategy
    """
    by, options = tune
    batch = federated_strategy(cfg, method, by, options, n_sites, registry, timeout, progress)
    batch.describe = functools.partial(federated_outputs, batch)
    return batch


def run_tuned_inprocess(cfg, data, method: str, tune, progress=None, registry=None, guards=None):
    """``method`` tuned inside the federation (as ``tune.by`` does) and refitted, through the
    in-process engine.

    Parameters
    ----------
    cfg : RowFedConfig
        The fit's settings; the tuning chooses its levels.
    data : FederatedData
        The clients' rows.
    method : str
        The tuned method.
    tune : tuple
        ``(by, options)`` (:func:`tuned_strategy`).
    progress : callable, optional
        ``progress(line)``: a line per round.
    registry : Registry, optional
        The registry to use (a new one by default).
    guards : Guards, optional
        The clients' floors (the default ones when ``None``).

    Returns
    -------
    MethodResult
        The refit's (:class:`~rowfed_flower.federation.MethodResult`), the tuning's outputs in
        its ``extra``.
    """
    clients = data.make_clients(guards)
    registry = registry if registry is not None else rowfed_registry()
    strategy = tuned_strategy(method, cfg, len(clients), registry, tune, progress)
    run_inprocess(strategy, clients, fed.max_rounds_for(method, cfg, True, tuning_waves(tune)))
    return fed.collect(method, strategy)


def federated_outputs(batch) -> dict:
    """What a finished federated tuning adds to its fit's outputs: its table (``cv.csv`` or
    ``gic.csv``), the metrics and the chosen ``config``."""
    from strategies.runtime.tuning_options import tuning_metrics

    out = batch.outputs
    rounds = {"engine": "federated", "rounds": int(batch.rounds), "fits": int(batch.fits)}
    # an automatic path's largest lam1 fuses every row: nothing lies beyond it
    no_edge = (("lam1", "largest"),) if out["lam_path"] else ()
    if out["by"] in GIC_BY:
        best = out["best"]
        selected = {k: best[k] for k in ("lam1", "lam2", out["column"])}
        tuned = {"criterion": out["by"], "grid_size": len(out["table"]),
                 "grid": "lam_max" if out["lam_path"] else "fixed", **rounds}  # fmt: skip
        edges = tuning.grid_edges(out["table"], PARAMS, selected)
        edges = {p: end for p, end in edges.items() if (p, end) not in no_edge}
        metrics = {"tuning": {**tuned, "selected": selected}, "at_grid_edge": edges}
        name = "gic.csv"
    else:
        opts = batch.opts
        metrics = tuning_metrics(
            out["summary"], params_of(batch.method), out["score"], False, opts, no_edge
        )
        metrics["cv"].update(criterion=opts.criterion, repeats=opts.repeats)
        metrics["tuning"] = {**rounds, "small_sites": list(out["small_sites"]),
                             "partial_sites": dict(out["partial_sites"])}  # fmt: skip
        name = "cv.csv"
    metrics["tuning_time"] = batch.timing()
    return {"tuning_table": (name, out["table"]), "tuning_metrics": metrics,
            "config": batch.result.strategy.cfg}  # fmt: skip


__all__ = [
    "FEDERATED_TUNABLE",
    "federated_options",
    "federated_outputs",
    "federated_plan",
    "federated_strategy",
    "run_tuned_inprocess",
    "tuned_strategy",
    "tuning_waves",
]
