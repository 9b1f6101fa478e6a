"""Choosing RowFed's levels ``(lam1, lam2)`` from the data (docs/methods.md 2.5, 4):
``fit --tune gic`` and ``fit --tune cv``, and the studies.

Both walk the same grid in the same order, with warm starts: ``lam1`` descending, ``lam2``
descending then ascending alternately (a snake), each fit starting from the previous fit's
``Theta`` (duals reset).  GIC needs one pass on all the data (each client uploads its
residual sum of squares); cross-validation one pass per fold, the folds random within each
client, the criterion the mean validation MSE over clients (each client's MSE averaged over
its responses).  The folds run in a process pool.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pandas as pd

from strategies import tuning
from strategies.batch import pooled_by_site
from strategies.config import FEDAVG_FAMILY, RowFedConfig
from strategies.errors import InputError
from strategies.guards import Guards
from strategies.problems import degrees_of_freedom
from strategies.rowfed import rowfed_registry
from strategies.runtime.engine import run_inprocess

from . import federation as fed
from . import sources as rsources
from .client import ClientSamples

#: ``--tune`` grids when ``--lam1-grid`` / ``--lam2-grid`` are not given.
DEFAULT_LAM1_GRID = (0.5, 0.2, 0.1, 0.05, 0.02, 0.01)
DEFAULT_LAM2_GRID = (0.1, 0.05, 0.02, 0.01, 0.005)
PARAMS = ("lam1", "lam2")
#: The automatic grid of the federated tuning (docs/methods.md 2.5): ``N_LAM2`` sparsity
#: levels below ``lam2_max`` and ``N_LAM1`` fusion levels from ``lam1_max`` down, each path
#: spanning a factor ``LAM_RATIO``.
N_LAM1, N_LAM2, LAM_RATIO = 6, 5, 1e-2
#: A grid given as this word: the paths from the data (:func:`auto_levels`), for both levels.
AUTO = "auto"
#: A level far above any ``lam_max``: the fit at it is all fused (``lam1``) or zero (``lam2``).
COMMON_LAM = 1e12
#: ``--tune``'s information criteria and their df scaling (:func:`strategies.problems.gic`):
#: the paper's GIC, and the GIC with its df term over the ``N q`` residuals.
GIC_BY = {"gic": "n", "gic-nq": "nq"}
#: The methods ``--tune gic`` chooses levels for (GIC needs a fused structure's df).
TUNABLE = ("rowfed", "perfl-lsma", "mean-fusion", "nonfed")
#: The methods ``--tune cv`` chooses settings for: also the FedAvg family (``lam2`` and the
#: comparator's own setting, :data:`strategies.tuning.KNOBS`).
CV_TUNABLE = TUNABLE + FEDAVG_FAMILY


def params_of(method: str) -> tuple[str, ...]:
    """The columns naming a setting of ``method`` (``cv.csv``; ``metrics.json: tuned``)."""
    if method in FEDAVG_FAMILY:
        return ("lam2", tuning.KNOBS[method].name) if method in tuning.KNOBS else ("lam2",)
    return (*PARAMS, "size_power") if method in fed.FUSED_METHODS else PARAMS


def used_levels(method: str) -> tuple[str, ...]:
    """The settings ``method`` reads, as its fit's summary line names them: NonFed's
    sparsity level alone (no fusion), else :func:`params_of`."""
    return ("lam2",) if method == "nonfed" else params_of(method)


def settings_grid(method: str, cfg: RowFedConfig, lam1_grid, lam2_grid, knob_grid=None, powers=()):
    """The grid of ``method`` in walking order, as ``[{setting: value}, ...]``: the fused
    methods' ``(lam1, lam2)`` snake (:func:`_levels`), once per site weighting in
    ``powers`` (default: ``cfg``'s ``size_power``); a comparator's ``lam2`` (descending)
    crossed with its knob."""
    if method not in FEDAVG_FAMILY:
        if knob_grid is not None:
            raise InputError(f"knob-grid: {method} has no setting to tune besides its levels")
        levels = _levels(method, cfg, lam1_grid, lam2_grid)
        if method not in fed.FUSED_METHODS:
            return [{"lam1": a, "lam2": b} for a, b in levels]
        return [
            {"lam1": a, "lam2": b, "size_power": w}
            for w in powers or (cfg.size_power,)
            for a, b in levels
        ]
    lam2s = _checked("lam2", lam2_grid)
    knobs = tuning.knob_values(method, cfg, knob_grid)
    name = tuning.KNOBS[method].name if knobs else None
    return [
        {"lam2": lam2, **({name: v} if name else {})}
        for lam2 in lam2s
        for v in sorted(knobs, reverse=True) or (None,)
    ]


def _checked(key: str, grid) -> list[float]:
    values = sorted({float(v) for v in grid}, reverse=True)
    if not values:
        raise InputError(f"{key}-grid: give one or more values")
    if min(values) < 0:
        raise InputError(f"{key}-grid: values must be >= 0, got {min(values)!r}")
    return values


def _levels(method: str, cfg: RowFedConfig, lam1_grid, lam2_grid):
    """The grid, checked, in walking order: ``[(lam1, lam2), ...]`` (NonFed: ``lam2`` only)."""
    if method not in TUNABLE:
        raise InputError(f"tune: available for {', '.join(TUNABLE)}, not {method}")
    lam1s, lam2s = _checked("lam1", lam1_grid), _checked("lam2", lam2_grid)
    if method == "nonfed":
        lam1s = [cfg.lam1]
    return _snake(lam1s, lam2s)


def grid_values(text, default, key: str):
    """A ``lam1``/``lam2`` grid option: :data:`AUTO`, or its numbers (``None``: ``default``)."""
    if isinstance(text, str) and text.strip().lower() == AUTO:
        return AUTO
    return tuning.parse_grid(default if text is None else text, key)


def check_auto(lam1_grid, lam2_grid, where: str = "") -> bool:
    """Whether the grids are the paths from the data; both or neither (an error naming the
    option otherwise)."""
    auto1, auto2 = lam1_grid == AUTO, lam2_grid == AUTO
    if auto1 != auto2:
        key = "lam2-grid" if auto1 else "lam1-grid"
        raise InputError(f"{where}{key}: give auto for both grids (the paths are drawn together)")
    return auto1


def sparsity_level(grads: np.ndarray, sparsity: str) -> float:
    """``lam2_max``: the smallest sparsity level at which every client's own fit is zero,
    from each client's gradient at ``Theta = 0`` ``(M, p, q)`` (working scale): the largest
    entry (``entry`` sparsity) or row norm (``row``).  Fused clients are zero sooner."""
    g = np.abs(np.asarray(grads, dtype=float))
    if sparsity == "row":
        return float(np.sqrt((g * g).sum(axis=-1)).max())
    return float(g.max())


def fusion_level(grads: np.ndarray, edges, weights, grouping: str, fusion: str) -> float:
    """``lam1_max``: a fusion level at which the clients' common fit solves the fused problem,
    from each client's gradient at that fit ``(M, p, q)``.  Each row (``grouping = "row"``)
    or the whole matrix (``"block"``) is a group: :func:`strategies.tuning.lam_max` over the
    edges (``None``: all pairs, weight 1), exact on a tree and an upper bound with cycles;
    mean fusion: :func:`strategies.tuning.lam_max_mean`.  Returns the largest over groups."""
    g = np.asarray(grads, dtype=float)
    m = g.shape[0]
    if edges is None:
        edges = np.array(list(itertools.combinations(range(m), 2)), dtype=np.int64)
    edges = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    weights = np.ones(len(edges)) if weights is None else np.asarray(weights, dtype=float)
    if fusion == "mean":
        groups = [g.reshape(m, -1)] if grouping == "block" else [g[:, j] for j in range(g.shape[1])]
        return max(tuning.lam_max_mean(x, True)[0] for x in groups)
    size = 0 if grouping == "block" else g.shape[2]  # each row its own group: one solve
    return tuning.lam_max(edges, weights, g.reshape(m, -1), True, group_size=size)[0]


def _snake(lam1s, lam2s) -> list[tuple[float, float]]:
    """``lam1`` descending; ``lam2`` descending then ascending alternately."""
    return [(a, b) for i, a in enumerate(lam1s) for b in (lam2s if i % 2 == 0 else lam2s[::-1])]


def auto_levels(cfg: RowFedConfig, method: str, powers, strategy, registry):
    """The top of the path (a plan's stages, as ``yield from``): per site weighting in
    ``powers``, a fit at ``Theta = 0`` gives each client's gradient there and so
    :func:`sparsity_level`; ``N_LAM2`` levels below it; then the clients' common fit at the
    smallest of them gives :func:`fusion_level` and ``N_LAM1`` levels from it down.  Returns
    ``{power: [(lam1, lam2), ...]}`` in walking order (NonFed: ``lam1`` as ``cfg``'s), or
    ``None`` when a fit gave no gradients."""
    from strategies.batch import Job, Stage

    base = cfg.replace(algorithm="pqn", inference="none")
    own = "rowfed" if method == "nonfed" else method
    zeros = {
        a: Job(f"top/zero/a{a!r}", strategy(base.replace(lam1=COMMON_LAM, lam2=COMMON_LAM,
                                                         size_power=a), registry, own))
        for a in powers
    }  # fmt: skip
    yield Stage(list(zeros.values()), name="top of the path")
    lam2s = {}
    for a, job in zeros.items():
        if job.strategy.qn is None:
            return None
        top = sparsity_level(job.strategy.qn.grad, cfg.sparsity)  # its fits are all zero
        lam2s[a] = list(tuning.log_path(top, N_LAM2 + 1, LAM_RATIO, zero=False)[1:])
    if method == "nonfed":
        return {a: [(cfg.lam1, b) for b in values] for a, values in lam2s.items()}
    commons = {
        a: Job(f"top/common/a{a!r}", strategy(base.replace(lam1=COMMON_LAM, lam2=lam2s[a][-1],
                                                           size_power=a), registry, own))
        for a in powers if lam2s[a]
    }  # fmt: skip
    yield Stage(list(commons.values()), name="top of the fusion path")
    out = {}
    for a, job in commons.items():
        st = job.strategy
        if st.qn is None:
            return None
        level = fusion_level(st.qn.grad, st.edges, st.weights, st.fusion_grouping, st.fusion)
        out[a] = _snake(list(tuning.log_path(level, N_LAM1, LAM_RATIO, zero=False)), lam2s[a])
    return out


def tune_gic(
    cfg: RowFedConfig,
    data: rsources.FederatedData,
    method: str,
    lam1_grid,
    lam2_grid,
    progress=None,
) -> tuple[fed.MethodResult, pd.DataFrame]:
    """GIC over a ``(lam1, lam2)`` grid with warm starts (docs/methods.md 2.5).

    Grid order: ``lam1`` decreasing; ``lam2`` decreasing, then increasing, alternately (a
    snake), each fit starting from the previous fit's ``Theta`` (duals reset).  Each client
    uploads only its residual sum of squares (the evaluation round).  NonFed uses ``lam2``
    only.  Returns the fit with the smallest GIC and the whole table (``lam1, lam2, gic,
    rss, df, rounds, converged, objective, selected``).
    """
    levels = _levels(method, cfg, lam1_grid, lam2_grid)
    clients = data.make_clients()
    registry = rowfed_registry()
    rows, fits = [], []
    theta0 = None
    for lam1, lam2 in levels:
        point = cfg.replace(lam1=lam1, lam2=lam2)
        strategy = fed.make_strategy(method, point, len(clients), registry, theta0, progress)
        run_inprocess(strategy, clients, fed.max_rounds_for(method, point))
        res = fed.collect(method, strategy)
        labels, support = strategy.structure()
        rows.append(
            {
                "lam1": lam1,
                "lam2": lam2,
                "gic": res.gic,
                "rss": strategy.rss(),
                "df": degrees_of_freedom(labels, support),
                "rounds": res.rounds,
                "converged": res.converged,
                "objective": res.objective,
            }
        )
        fits.append(res)
        if method != "nonfed":
            theta0 = res.theta_work
    table, best = gic_table(rows)
    return fits[best], table


def gic_table(rows: list[dict], column: str = "gic") -> tuple[pd.DataFrame, int]:
    """The GIC table of a grid's rows with its ``selected`` column (the smallest
    ``column``), and the chosen row."""
    table = pd.DataFrame(rows)
    gics = table[column].to_numpy(dtype=float)
    if not np.isfinite(gics).any():
        raise InputError("tune: no grid point gave a finite GIC")
    best = int(np.nanargmin(gics))
    table["selected"] = np.arange(len(table)) == best
    return table, best


def fold_data(data: rsources.FederatedData, folds, k: int) -> rsources.FederatedData:
    """Each client's rows outside fold ``k`` for training, fold ``k`` as its test rows."""
    clients = tuple(
        ClientSamples(c.site, c.x[f != k], c.y[f != k], c.x[f == k], c.y[f == k])
        for c, f in zip(data.clients, folds, strict=True)
    )
    return rsources.FederatedData(clients, data.features, data.responses)


def cv_piece(piece) -> list[dict]:
    """One fold: the whole grid walked with warm starts; validation MSE per setting."""
    method, k, data, cfg, levels = piece
    clients = data.make_clients(Guards().for_view())  # a fold's rows
    registry = rowfed_registry()
    rows, theta0 = [], None
    for k_set, setting in enumerate(levels):
        if k_set and setting.get("size_power") != levels[k_set - 1].get("size_power"):
            theta0 = None  # a new weighting starts its path as the first one did
        point = cfg.replace(**setting)
        strategy = fed.make_strategy(method, point, len(clients), registry, theta0)
        run_inprocess(strategy, clients, fed.max_rounds_for(method, point))
        mse = [m["mse_pred"] for m in strategy.evaluation.values()]
        rows.append(
            {
                "fold": k,
                **setting,
                "val_mse": float(np.mean(mse)) if mse else float("nan"),
                "rounds": int(strategy.rounds),
                "converged": bool(strategy.converged),
            }
        )
        if method in fed.FUSED_METHODS:  # warm starts along the fused path
            theta0 = np.array(strategy.warm_start())
    return rows


def cross_validate(
    cfg: RowFedConfig,
    data: rsources.FederatedData,
    method: str,
    lam1_grid,
    lam2_grid,
    opts: tuning.CVOptions | None = None,
    knob_grid=None,
    size_power_grid=None,
) -> pd.DataFrame:
    """Validation MSE for every setting and fold: ``fold``, the settings
    (:func:`params_of`), ``val_mse, rounds, converged``.  The fused methods also try the
    site weightings of :func:`strategies.tuning.size_powers` (``size_power_grid``, else both
    ends when the clients differ in size).  CV fits use ``opts.tol`` and
    ``opts.max_rounds``."""
    opts = opts or tuning.CVOptions()
    if method not in CV_TUNABLE:
        raise InputError(f"tune: cv is available for {', '.join(CV_TUNABLE)}, not {method}")
    powers = ()
    if method in fed.FUSED_METHODS:
        powers = tuning.size_powers([c.n for c in data.clients], cfg, size_power_grid)
    levels = settings_grid(method, cfg, lam1_grid, lam2_grid, knob_grid, powers)
    small = [c.site for c in data.clients if c.n < opts.folds]
    if small:
        raise InputError(f"folds: client {small[0]!r} has fewer rows than the {opts.folds} folds")
    rng = np.random.default_rng([opts.seed, 2])
    folds = [tuning.row_folds(c.n, opts.folds, rng) for c in data.clients]
    base = opts.fit_config(cfg)
    pieces = [(method, k, fold_data(data, folds, k), base, levels) for k in range(opts.folds)]
    progress = tuning.PieceProgress(f"{method} cv", len(pieces), opts.quiet)
    rows = tuning.run_items(cv_piece, pieces, opts.workers(len(pieces)), progress)
    return pd.DataFrame([r for piece in rows for r in piece])


def tune(
    cfg: RowFedConfig,
    data: rsources.FederatedData,
    method: str,
    lam1_grid,
    lam2_grid,
    opts: tuning.CVOptions | None = None,
    knob_grid=None,
    size_power_grid=None,
) -> tuple[RowFedConfig, pd.DataFrame, pd.DataFrame]:
    """Cross-validate; returns ``cfg`` at the chosen setting (lowest mean validation MSE,
    or the ``1se`` rule: the largest ``lam1``, then ``lam2`` -- for a comparator ``lam2``,
    then its knob's simpler end (:class:`strategies.tuning.Knob`) -- within one standard
    error), the per-fold
    table (``cv.csv``) and the per-setting summary."""
    opts = opts or tuning.CVOptions()
    table = cross_validate(
        cfg, data, method, lam1_grid, lam2_grid, opts, knob_grid, size_power_grid
    )
    params = params_of(method)
    knob = tuning.KNOBS.get(method)
    # the levels (lam1, then lam2) or a comparator's lam2 and knob; the site weighting has
    # no simpler end
    simplest = PARAMS if knob is None else (params[0], *knob.simplest)
    chosen, summary = tuning.choose(table, params, "val_mse", False, opts.rule, simplest)
    if knob is not None and knob.integer and knob.name in chosen:
        chosen[knob.name] = int(chosen[knob.name])
    return cfg.replace(**chosen), table, summary


# ---------------------------------------------------------------------------------------
# The federated tuning: GIC or the cross-validation as one batched Flower run
# ---------------------------------------------------------------------------------------
#: The methods the federated tuning tunes (a fused penalty, or NonFed's ``lam2``).
FEDERATED_TUNABLE = TUNABLE


def check_folds(registry, k: int) -> tuple[list, dict]:
    """The clients with fewer than :data:`strategies.tuning.SMALL_FOLD` validation rows per
    fold, and ``{client: folds it scores}`` for the clients with fewer rows than ``k``: such
    a client trains in every fold and has a validation MSE in the folds that hold one of its
    rows (they are dealt one a fold), its other folds adding nothing to the criterion."""
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
    """The plan of :class:`strategies.batch.BatchStrategy` that tunes ``method`` inside the
    federation (docs/methods.md 3.12).

    ``by = "gic"``: every grid point fitted side by side on all rows, one batched evaluation
    (each client's residual sum of squares), the smallest GIC (docs/methods.md 2.5); the
    result is that fit.  ``by = "cv"``: every ``(fold, setting)`` fit on each client's own
    random folds and, alongside, the all-rows fit at every setting (the refit; not with
    ``inference = oracle``, whose refit follows the choice); one batched evaluation (each
    client's validation MSE per fold and of its pooled out-of-fold predictions); the choice
    by ``opts.criterion`` (``loss`` is the MSE, as ``folds``) and ``opts.rule``.  Every fit
    starts from its own start (``cfg.init``), so the result equals a plain fit at the chosen
    levels.  Leaves ``batch.outputs``."""
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
        from strategies.batch import Job, Stage

        registry = batch.registry
        order = registry.order()
        if by in GIC_BY:
            found = None
            if auto:
                found = yield from auto_levels(cfg, method, (cfg.size_power,), strategy, registry)
            levels = (found or {}).get(cfg.size_power) or _levels(method, cfg, lam1_grid, lam2_grid)
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
        rows, site_rows = [], []
        for job in cv_jobs:
            ev = job.strategy.evaluation
            # a client with fewer rows than folds has no validation rows in some folds
            # (it then scores its training rows): those add nothing
            mse = [ev[s]["mse_pred"] for s in order if ev.get(s, {}).get("split") == "test"]
            oof = batch.pooled.get(job.group, {})
            pooled = [oof[s]["mse"] for s in order if s in oof]
            rows.append({**job.setting, "val_mse": float(np.mean(mse)) if mse else np.nan,
                         "pooled_mse": float(np.mean(pooled)) if pooled else np.nan,
                         "rounds": int(job.strategy.rounds),
                         "converged": bool(job.strategy.converged)})  # fmt: skip
        for i, setting in enumerate(settings):
            for site, value in pooled_by_site(batch.pooled, i, "mse").items():
                site_rows.append({"site": site, **setting, "pooled_mse": value})
        table = pd.DataFrame(rows)
        order_cols = [c for c in ("fold", "repeat") if c in table.columns]
        table = table.sort_values(order_cols, kind="stable").reset_index(drop=True)
        score, frame = ("pooled_mse", pd.DataFrame(site_rows)) if opts.criterion == "pooled" else (
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

    return plan


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
    :meth:`strategies.tuning.CVOptions.waves` of the most fits a stage of
    :func:`federated_plan` starts (GIC: the grid; cv: every setting's folds and its
    all-rows fit, at up to two site weightings)."""
    by, (opts, lam1, lam2, powers) = tune
    n1 = max(N_LAM1, len(DEFAULT_LAM1_GRID)) if lam1 == AUTO else len(set(lam1))
    n2 = max(N_LAM2, len(DEFAULT_LAM2_GRID)) if lam2 == AUTO else len(set(lam2))
    if by in GIC_BY:
        return opts.waves(n1 * n2)
    return opts.waves(n1 * n2 * (len(set(powers or ())) or 2) * (opts.folds * opts.repeats + 1))


def federated_strategy(cfg, method, by, tune, n_sites, registry, timeout=None, progress=None):
    """The :class:`strategies.batch.BatchStrategy` of :func:`federated_plan`."""
    from strategies.batch import tuning_batch

    opts, lam1, lam2, powers = tune
    if not check_auto(lam1, lam2, "tune."):
        _levels(method, cfg, lam1, lam2)  # the grids checked before any round
    plan = federated_plan(cfg, method, by, opts, lam1, lam2, powers)
    batch = tuning_batch(plan, n_sites, registry, opts, timeout, progress)
    batch.method, batch.opts, batch.by = method, opts, by
    return batch


def tuned_strategy(method, cfg, n_sites, registry, tune, progress=None, timeout=None):
    """``method`` tuned inside the federation (``tune = (by, options)``: GIC or CV) and
    refitted, as one batched run; its result adds :func:`federated_outputs`."""
    by, options = tune
    batch = federated_strategy(cfg, method, by, options, n_sites, registry, timeout, progress)
    batch.describe = functools.partial(federated_outputs, batch)
    return batch


def run_tuned_inprocess(cfg, data, method: str, tune, progress=None, registry=None, guards=None):
    """``method`` tuned inside the federation (``tune = (by, options)``, as ``tune.by``
    does) and refitted, through the in-process engine: its
    :class:`~rowfed_flower.federation.MethodResult` (``guards``: the clients' floors)."""
    clients = data.make_clients(guards)
    registry = registry if registry is not None else rowfed_registry()
    strategy = tuned_strategy(method, cfg, len(clients), registry, tune, progress)
    run_inprocess(strategy, clients, fed.max_rounds_for(method, cfg, True, tuning_waves(tune)))
    return fed.collect(method, strategy)


def federated_outputs(batch) -> dict:
    """What a finished federated tuning adds to its fit's outputs: its table (``cv.csv`` or
    ``gic.csv``), the metrics and the chosen ``config``."""
    from strategies.runtime.cli import tuning_metrics

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
    "COMMON_LAM",
    "FEDERATED_TUNABLE",
    "GIC_BY",
    "LAM_RATIO",
    "N_LAM1",
    "N_LAM2",
    "AUTO",
    "auto_levels",
    "check_auto",
    "grid_values",
    "fusion_level",
    "sparsity_level",
    "federated_options",
    "federated_outputs",
    "federated_plan",
    "federated_strategy",
    "gic_table",
    "CV_TUNABLE",
    "DEFAULT_LAM1_GRID",
    "DEFAULT_LAM2_GRID",
    "PARAMS",
    "cross_validate",
    "params_of",
    "settings_grid",
    "cv_piece",
    "fold_data",
    "run_tuned_inprocess",
    "tune",
    "tune_gic",
    "tuned_strategy",
    "tuning_waves",
]
