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

import itertools

import numpy as np
import pandas as pd

from strategies.client.guards import Guards
from strategies.config import FEDAVG_FAMILY, RowFedConfig
from strategies.errors import InputError
from strategies.runtime.engine import run_inprocess
from strategies.runtime.pieces import PieceProgress, run_items
from strategies.server.rowfed import rowfed_registry
from strategies.solvers.problems import degrees_of_freedom
from strategies.stats import tuning

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
#: ``--tune``'s information criteria and their df scaling (:func:`strategies.solvers.problems.gic`):
#: the paper's GIC, and the GIC with its df term over the ``N q`` residuals.
GIC_BY = {"gic": "n", "gic-nq": "nq"}
#: The methods ``--tune gic`` chooses levels for (GIC needs a fused structure's df).
TUNABLE = ("rowfed", "perfl-lsma", "mean-fusion", "nonfed")
#: The methods ``--tune cv`` chooses settings for: also the FedAvg family (``lam2`` and the
#: comparator's own setting, :data:`strategies.stats.tuning.KNOBS`).
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
    methods' ``(lam1, lam2)`` snake (:func:`grid_levels`), once per site weighting; a
    comparator's ``lam2`` (descending) crossed with its knob.

    Parameters
    ----------
    method : str
        The tuned method.
    cfg : RowFedConfig
        The default settings: NonFed's ``lam1``, the default ``size_power``; a
        comparator's knob values are checked against it.
    lam1_grid, lam2_grid : sequence of float
        The levels' grids (a comparator's: ``lam2_grid`` only).
    knob_grid : str or sequence, optional
        A comparator's knob values (default: its knob's grid); an error for the others.
    powers : sequence of float, optional
        The fused methods' site weightings (``size_power``), each walking the snake
        (default: ``cfg``'s).

    Returns
    -------
    list of dict
    """
    if method not in FEDAVG_FAMILY:
        if knob_grid is not None:
            raise InputError(f"knob-grid: {method} has no setting to tune besides its levels")
        levels = grid_levels(method, cfg, lam1_grid, lam2_grid)
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


def grid_levels(method: str, cfg: RowFedConfig, lam1_grid, lam2_grid):
    """The grid, checked, in walking order: ``[(lam1, lam2), ...]`` (NonFed: ``lam2`` only).

    Parameters
    ----------
    method : str
        One of :data:`TUNABLE`.
    cfg : RowFedConfig
        Its ``lam1`` is NonFed's.
    lam1_grid, lam2_grid : sequence of float
        The grids: values ``>= 0``, walked descending without repeats.

    Returns
    -------
    list of tuple of float
    """
    if method not in TUNABLE:
        raise InputError(f"tune: available for {', '.join(TUNABLE)}, not {method}")
    lam1s, lam2s = _checked("lam1", lam1_grid), _checked("lam2", lam2_grid)
    if method == "nonfed":
        lam1s = [cfg.lam1]
    return _snake(lam1s, lam2s)


def grid_values(text, default, key: str):
    """A ``lam1``/``lam2`` grid option: :data:`AUTO`, or its numbers.

    Parameters
    ----------
    text : str, sequence of float or None
        The option's value (``None``: ``default``).
    default : str or sequence of float
        The default grid.
    key : str
        The option's name, which starts an error's message.

    Returns
    -------
    str or tuple of float
        :data:`AUTO`, or the grid's values.
    """
    if isinstance(text, str) and text.strip().lower() == AUTO:
        return AUTO
    return tuning.parse_grid(default if text is None else text, key)


def check_auto(lam1_grid, lam2_grid, where: str = "") -> bool:
    """Whether the grids are the paths from the data; both or neither (an error naming the
    option otherwise).

    Parameters
    ----------
    lam1_grid, lam2_grid : str or sequence of float
        The grids (:func:`grid_values`).
    where : str, optional
        A prefix of the option's name in the error (``tune.``).

    Returns
    -------
    bool
    """
    auto1, auto2 = lam1_grid == AUTO, lam2_grid == AUTO
    if auto1 != auto2:
        key = "lam2-grid" if auto1 else "lam1-grid"
        raise InputError(f"{where}{key}: give auto for both grids (the paths are drawn together)")
    return auto1


def sparsity_level(grads: np.ndarray, sparsity: str) -> float:
    """``lam2_max``: the smallest sparsity level at which every client's own fit is zero.
    Fused clients are zero sooner.

    Parameters
    ----------
    grads : ndarray, shape (M, p, q)
        Each client's gradient at ``Theta = 0`` (working scale).
    sparsity : {"entry", "row"}
        The largest entry (``entry`` sparsity) or row norm (``row``) is the level.

    Returns
    -------
    float
    """
    g = np.abs(np.asarray(grads, dtype=float))
    if sparsity == "row":
        return float(np.sqrt((g * g).sum(axis=-1)).max())
    return float(g.max())


def fusion_level(grads: np.ndarray, edges, weights, grouping: str, fusion: str) -> float:
    """``lam1_max``: a fusion level at which the clients' common fit solves the fused problem;
    exact on a tree and an upper bound with cycles.

    Parameters
    ----------
    grads : ndarray, shape (M, p, q)
        Each client's gradient at that fit.
    edges : ndarray of int, shape (E, 2), or None
        The fusion graph (``None``: all pairs, weight 1).
    weights : ndarray, shape (E,), or None
        The edges' weights (``None``: 1).
    grouping : {"row", "block"}
        The groups: each row, or the whole matrix.
    fusion : {"graph", "mean"}
        Fusion over the edges (:func:`strategies.stats.tuning.lam_max`) or mean fusion
        (:func:`strategies.stats.tuning.lam_max_mean`).

    Returns
    -------
    float
        The largest level over the groups.
    """
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
    """The top of the path (a plan's stages, as ``yield from``): per site weighting, a fit at
    ``Theta = 0`` gives each client's gradient there and so :func:`sparsity_level`;
    ``N_LAM2`` levels below it; then the clients' common fit at the smallest of them gives
    :func:`fusion_level` and ``N_LAM1`` levels from it down.

    Parameters
    ----------
    cfg : RowFedConfig
        The fit's settings (these fits run pqn, without inference).
    method : str
        The tuned method (NonFed's gradients come from RowFed's fits).
    powers : sequence of float
        The site weightings (``size_power``).
    strategy : callable
        ``strategy(cfg, registry, method)``: the strategy of a fit.
    registry : Registry
        The federation's registry.

    Returns
    -------
    dict or None
        ``{power: [(lam1, lam2), ...]}`` in walking order (NonFed: ``lam1`` as ``cfg``'s), or
        ``None`` when a fit gave no gradients.

    Yields
    ------
    Stage
        The fits at ``Theta = 0``, then the common fits.
    """
    from strategies.server.batch import Job, Stage

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
        top = sparsity_level(job.strategy.qn.sites.grad, cfg.sparsity)  # its fits are all zero
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
        level = fusion_level(st.qn.sites.grad, st.edges, st.weights, st.fusion_grouping, st.fusion)
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
    only.

    Parameters
    ----------
    cfg : RowFedConfig
        The settings of every fit but its levels.
    data : FederatedData
        The clients' rows.
    method : str
        One of :data:`TUNABLE`.
    lam1_grid, lam2_grid : sequence of float
        The grids.
    progress : callable, optional
        ``progress(round, objective, residuals, elapsed)`` after every round of every fit.

    Returns
    -------
    fit : MethodResult
        The fit with the smallest GIC.
    table : pandas.DataFrame
        The whole table: ``lam1, lam2, gic, rss, df, rounds, converged, objective,
        selected``.
    """
    levels = grid_levels(method, cfg, lam1_grid, lam2_grid)
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
            theta0 = res.coefficients_work
    table, best = gic_table(rows)
    return fits[best], table


def gic_table(rows: list[dict], column: str = "gic") -> tuple[pd.DataFrame, int]:
    """The GIC table of a grid's rows with its ``selected`` column (the smallest
    ``column``), and the chosen row.

    Parameters
    ----------
    rows : list of dict
        A row per grid point.
    column : str, optional
        The criterion.

    Returns
    -------
    table : pandas.DataFrame
    best : int
        The chosen row's position.
    """
    table = pd.DataFrame(rows)
    gics = table[column].to_numpy(dtype=float)
    if not np.isfinite(gics).any():
        raise InputError("tune: no grid point gave a finite GIC")
    best = int(np.nanargmin(gics))
    table["selected"] = np.arange(len(table)) == best
    return table, best


def fold_data(data: rsources.FederatedData, folds, k: int) -> rsources.FederatedData:
    """Each client's rows outside fold ``k`` for training, fold ``k`` as its test rows.

    Parameters
    ----------
    data : FederatedData
        The clients' rows.
    folds : sequence of ndarray of int
        Each client's fold of each row.
    k : int
        The fold.

    Returns
    -------
    FederatedData
    """
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
    (:func:`params_of`), ``val_mse, rounds, converged``.

    Parameters
    ----------
    cfg : RowFedConfig
        The default settings.
    data : FederatedData
        The clients' rows.
    method : str
        One of :data:`CV_TUNABLE`.
    lam1_grid, lam2_grid : sequence of float
        The levels' grids (:func:`settings_grid`).
    opts : CVOptions, optional
        The folds, their seed, the worker processes and the progress; CV fits use
        ``opts.tol`` and ``opts.max_rounds``.
    knob_grid : str or sequence, optional
        A comparator's knob values.
    size_power_grid : str or sequence of float, optional
        The site weightings the fused methods try
        (:func:`strategies.stats.tuning.size_powers`; else both ends when the clients
        differ in size).

    Returns
    -------
    pandas.DataFrame
        A row per fold and setting.
    """
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
    progress = PieceProgress(f"{method} cv", len(pieces), opts.quiet)
    rows = run_items(cv_piece, pieces, opts.workers(len(pieces)), progress)
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
    """Cross-validate and choose the setting: the lowest mean validation MSE, or the ``1se``
    rule: the largest ``lam1``, then ``lam2`` -- for a comparator ``lam2``, then its knob's
    simpler end (:class:`strategies.stats.tuning.Knob`) -- within one standard error.

    Parameters
    ----------
    cfg : RowFedConfig
        The default settings.
    data : FederatedData
        The clients' rows.
    method : str
        One of :data:`CV_TUNABLE`.
    lam1_grid, lam2_grid : sequence of float
        The levels' grids.
    opts : CVOptions, optional
        As for :func:`cross_validate`; ``opts.rule`` chooses.
    knob_grid : str or sequence, optional
        A comparator's knob values.
    size_power_grid : str or sequence of float, optional
        The site weightings the fused methods try.

    Returns
    -------
    cfg : RowFedConfig
        ``cfg`` at the chosen setting.
    table : pandas.DataFrame
        The per-fold table (``cv.csv``).
    summary : pandas.DataFrame
        The per-setting summary.
    """
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


__all__ = [
    "COMMON_LAM",
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
    "gic_table",
    "grid_levels",
    "CV_TUNABLE",
    "DEFAULT_LAM1_GRID",
    "DEFAULT_LAM2_GRID",
    "PARAMS",
    "cross_validate",
    "params_of",
    "settings_grid",
    "cv_piece",
    "fold_data",
    "tune",
    "tune_gic",
]
