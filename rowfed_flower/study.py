"""The RowFed simulation study (docs/methods.md 2.5–2.8): ``python -m rowfed_flower study``.

One task = one (cell, replication): simulate the §2.8 federation with the task's seed, tune
RowFed, PerFL-LSMA and NonFed by GIC over a ``(lam1, lam2)`` grid (the existing
:func:`rowfed_flower.tuning.tune_gic`, warm starts along the grid), fit FedAvg with
NonFed's chosen ``lam2`` (both have only the sparsity penalty; so do the other global-model
methods, :data:`strategies.config.FEDAVG_FAMILY`), and score every method:
MSE-Est, MSE-Pred (test data) and RI (docs/methods.md 2.7).

Config (``configs/rowfed_dims.toml``, ``configs/rowfed_sizes.toml``)::

    study = "rowfed"
    replications = 100
    seed = 11
    methods = ["rowfed", "nonfed", "fedavg", "perfl-lsma"]
    [design]                  # keys M (clients), n_m (training rows per client), p, q
    pq = [{p = 20, q = 20}, {p = 50, q = 50}, {p = 100, q = 100}]   # a linked factor
    M = [10]
    n_m = [100]
    [data]
    n_test = 100              # test rows per client
    [tuning]
    lam1 = [0.5, 0.3, 0.2, 0.1]
    lam2 = [0.3, 0.2, 0.1, 0.05]
    criterion = "gic"         # docs/methods.md 2.5; "gic-nq": the df penalty over N q (see below)
    fedavg_lam2 = "nonfed"    # or a number
    [tuning.perfl-lsma]       # per-method grids override (lam1 and/or lam2)
    lam1 = [2.0, 1.0, 0.5]
    [rowfed]                  # RowFedConfig settings (run-config names); lam1, lam2 tuned
    penalty = "scad"

Real data (``configs/crime_rowfed.toml``): ``[data] source = "crime"`` (Communities and
Crime, US states as clients, :func:`rowfed_flower.realdata.load_crime`), the design's one
required key ``train_fraction`` (each state's rows split at random into training and a
held-out test set; a replication is a new split), and ``[data] responses`` (the q response
columns), ``exclude`` (columns left out of the predictors), ``min_rows``, ``path``.  There
is no true Theta, so the results hold MSE-Pred only (per state, on its test rows, overall
and per response; MSE-Est and RI are not defined and not written)::

    [design]
    train_fraction = [0.7]
    [data]
    source = "crime"
    responses = ["ViolentCrimesPerPop", "PctPopUnderPov"]
    exclude = []
    min_rows = 3

``criterion = "gic-nq"`` **[choice, not the paper's]**: ``log(RSS/(N q)) + log(log N)
log(p q M) df / (N q)`` — the same GIC with the df penalty spread over the ``N q`` scalar
responses instead of the ``N`` rows; the point is picked from :func:`tune_gic`'s table and
refitted.  It exists to study the GIC's choice (see the study's report), not as a default.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from strategies import quiet_flower
from strategies.config import (
    FEDAVG_FAMILY,
    ROWFED_METHODS,
    RowFedConfig,
    Table,
    from_run_config,
    listing,
    setting,
)
from strategies.errors import InputError
from strategies.experiments.coverage import coverage_setting
from strategies.experiments.design import (
    Study,
    data_source,
    figure_cell_setting,
    load_study,
    read_config,
    study_methods,
)
from strategies.experiments.runner import add_study_parser, run_study_args
from strategies.solvers.problems import gic
from strategies.stats.tuning import KNOBS, CVOptions

from . import sources as rsources
from . import tuning as grid_search
from .data import N_CLUSTERS

DESIGN_TYPES = {"M": int, "n_m": int, "p": int, "q": int}
REQUIRED = ("M", "n_m", "p", "q")
#: The tuning values a coverage study fixes in the method's table.
COVERAGE_FIXED = ("lam1", "lam2")
SECTIONS = ("data", "tuning", "rowfed", "figures", "coverage")
TUNED = ("rowfed", "perfl-lsma", "mean-fusion", "nonfed")
CRITERIA = ("gic", "gic-nq")
TASK = "rowfed_flower.study:run_task"
#: Real data (``[data] source``): design keys and the ``[data]`` settings with defaults.
REAL_SOURCES = ("crime",)
REAL_DESIGN_TYPES = {"train_fraction": float, "min_rows": int}
REAL_REQUIRED = ("train_fraction",)


@dataclass(frozen=True)
class MethodGrids(Table):
    """``[tuning.<method>]``: a tuned method's own grids (empty: the study's)."""

    prefix = "tuning.<method>"

    lam1: tuple[float, ...] = listing((), "the method's lam1 grid", at_least=0, descending=True)
    lam2: tuple[float, ...] = listing((), "the method's lam2 grid", at_least=0, descending=True)


@dataclass(frozen=True)
class StudyTuning(Table):
    """``[tuning]`` of a RowFed study (each tuned method's own table: :class:`MethodGrids`)."""

    prefix = "tuning"

    lam1: tuple[float, ...] = listing(
        (0.5, 0.3, 0.2, 0.1), "the lam1 (fusion) grid", at_least=0, descending=True
    )
    lam2: tuple[float, ...] = listing(
        (0.3, 0.2, 0.1, 0.05), "the lam2 (sparsity) grid", at_least=0, descending=True
    )
    criterion: str = setting(
        "gic", "gic (the paper's) or gic-nq (its df penalty over N q)", CRITERIA
    )
    fedavg_lam2: float | str = setting(
        "nonfed", "FedAvg's lam2: a number, or nonfed (NonFed's tuned one)", at_least=0,
        words=("nonfed",),
    )  # fmt: skip
    comparators: bool = setting(False, "tune each comparator's own setting by cross-validation")


@dataclass(frozen=True)
class SimulatedData(Table):
    """``[data]`` of a simulation study."""

    prefix = "data"

    source: str = setting("simulated", "where the clients come from", ("simulated",))
    n_test: int = setting(100, "test rows per client", at_least=1)
    clusters: tuple[int, ...] = listing(
        N_CLUSTERS, "the client clusters of each non-zero row", "int", at_least=1, repeats=True
    )


@dataclass(frozen=True)
class RealData(Table):
    """``[data]`` of a real-data study (:func:`rowfed_flower.realdata.load_crime`)."""

    prefix = "data"

    source: str = setting("crime", "the real data set", REAL_SOURCES)
    path: str = setting("", "the CSV (empty: the shipped copy)")
    responses: tuple[str, ...] = listing((), "the q response columns", "str")
    exclude: tuple[str, ...] = listing(
        (), "columns left out of the predictors", "str", nonempty=False
    )
    min_rows: int = setting(3, "rows a state needs (2 training rows and 1 test row)", at_least=3)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.responses:
            raise InputError("data.responses: give one or more response columns")
        both = set(self.responses) & set(self.exclude)
        if both:
            raise InputError(f"data.exclude: {sorted(both)[0]!r} is also a response")


@dataclass(frozen=True)
class Settings:
    """The parsed non-design part of a RowFed study config."""

    methods: tuple[str, ...]
    n_test: int  # simulations: test rows per client
    real: dict | None  # [data] of a real source (None: simulated)
    grids: dict  # method -> (lam1 grid, lam2 grid), each descending
    criterion: str  # gic | gic-nq
    fedavg_lam2: float | str  # FedAvg's lam2: a number, or "nonfed" (NonFed's tuned one)
    comparators: bool  # [tuning] comparators: tune each comparator's own setting too
    cfg: RowFedConfig
    figure_cell: dict | None
    clusters: tuple[int, ...]  # simulations: the client clusters of each non-zero row
    coverage: float | None = None  # [coverage] level: a coverage study at fixed lam1, lam2


def parse_settings(settings: dict, keys=REQUIRED) -> Settings:
    """Check and parse the tables of a RowFed study config (everything but ``[design]``).

    Parameters
    ----------
    settings : dict
        The config's tables but ``[design]`` (``Study.settings``).
    keys : sequence of str, optional
        The design keys (``[figures] cell`` may name only these).

    Returns
    -------
    Settings
    """
    coverage = coverage_setting(settings, "rowfed", COVERAGE_FIXED)
    methods = study_methods(settings, ROWFED_METHODS, ("rowfed", "nonfed", "fedavg", "perfl-lsma"))
    data = settings.get("data", {})
    real = None
    sim = SimulatedData()
    if data_source(data, REAL_SOURCES) == "simulated":
        sim = SimulatedData.from_table(data)
    else:
        real = asdict(RealData.from_table(data))
    table = settings.get("tuning", {})
    tuning = StudyTuning.from_table(table, TUNED)
    grids = {}
    for m in TUNED:
        own = MethodGrids.from_table(table.get(m, {}), prefix=f"tuning.{m}")
        grids[m] = (own.lam1 or tuning.lam1, own.lam2 or tuning.lam2)
    rc = {f"rowfed.{k}": v for k, v in settings.get("rowfed", {}).items()}
    for key in ("rowfed.lam1", "rowfed.lam2"):
        if key in rc and coverage is None:
            raise InputError(f"{key}: chosen by GIC in a study; give tuning.lam1 / tuning.lam2")
    for key in ("rowfed.inference", "rowfed.level"):
        if key in rc and coverage is not None:
            raise InputError(f"{key}: a coverage study sets it; give coverage.level")
    if "rowfed.intercept" in rc and not isinstance(rc["rowfed.intercept"], bool):
        raise InputError("rowfed.intercept: expected true or false")
    cfg = from_run_config(RowFedConfig, rc, "rowfed")
    if coverage is not None:
        cfg = cfg.replace(inference="oracle", level=coverage)
    cell = figure_cell_setting(settings, keys)
    return Settings(
        methods=tuple(methods),
        n_test=sim.n_test,
        real=real,
        grids=grids,
        criterion=tuning.criterion,
        fedavg_lam2=tuning.fedavg_lam2,
        comparators=tuning.comparators,
        cfg=cfg,
        figure_cell=cell,
        clusters=sim.clusters,
        coverage=coverage,
    )


@functools.lru_cache(maxsize=2)
def _crime(path: str, responses: tuple, min_rows: int, exclude: tuple):
    from .realdata import load_crime

    return load_crime(path, responses, min_rows=min_rows, exclude=exclude, center=False)


def real_federation(real: dict, cell: dict, seed: int):
    """A real source's federation for one task: the states with at least ``min_rows``
    communities, each split at random into training and test rows.  Client ids are the
    states' postal codes.

    Parameters
    ----------
    real : dict
        The ``[data]`` table of a real source (the fields of :class:`RealData`).
    cell : dict
        The design cell: ``train_fraction``, and any ``[data]`` setting it gives
        (``min_rows``) over ``real``'s.
    seed : int
        The split's seed.

    Returns
    -------
    FederatedData
    """
    from strategies.datasets import state_centroids

    from .client import ClientSamples
    from .realdata import split_clients
    from .sources import FederatedData

    d = {**real, **{k: v for k, v in cell.items() if k in real}}
    crime = _crime(d["path"], tuple(d["responses"]), d["min_rows"], tuple(d["exclude"]))
    codes = state_centroids().set_index("state_fips")["state"]
    parts = split_clients(crime, cell["train_fraction"], seed)
    if len(parts) < 2:
        raise InputError(f"data.min_rows: only {len(parts)} state(s) kept; RowFed needs >= 2")
    clients = tuple(ClientSamples(str(codes.get(c, c)), x, y, xt, yt) for c, x, y, xt, yt in parts)
    return FederatedData(clients, tuple(crime.predictors), tuple(crime.responses))


def check_real_cell(cell: dict, real: dict) -> None:
    """Reject a real-data cell before anything runs (the data are read once here).

    Parameters
    ----------
    cell : dict
        The design cell: ``train_fraction`` in (0, 1), ``min_rows`` (if given) at least 3.
    real : dict
        The study's ``[data]`` table.
    """
    label = ", ".join(f"{k}={v}" for k, v in cell.items())
    if not 0 < cell["train_fraction"] < 1:
        raise InputError(f"design.train_fraction: must be in (0, 1) (cell {label})")
    if "min_rows" in cell and cell["min_rows"] < 3:
        raise InputError(f"design.min_rows: must be >= 3 (cell {label})")
    real_federation(real, cell, 0)


def check_cell(cell: dict) -> None:
    label = ", ".join(f"{k}={v}" for k, v in cell.items())
    for key, low in (("M", 2), ("n_m", 2), ("p", 1), ("q", 1)):
        if cell[key] < low:
            raise InputError(f"design.{key}: must be >= {low} (cell {label})")


def load(path: str) -> tuple[Study, Settings]:
    raw = read_config(path)
    coverage_setting(raw, "rowfed", COVERAGE_FIXED)  # before the design's keys are checked
    if data_source(raw.get("data", {}), REAL_SOURCES) == "simulated":
        study = load_study(path, "rowfed", DESIGN_TYPES, REQUIRED, SECTIONS)
    else:
        study = load_study(path, "rowfed", REAL_DESIGN_TYPES, REAL_REQUIRED, SECTIONS)
    settings = parse_settings(study.settings, study.keys)
    for cell in study.cells:
        if settings.real is None:
            check_cell(cell)
        else:
            check_real_cell(cell, settings.real)
    return study, settings


# ---------------------------------------------------------------------------------------
# One task
# ---------------------------------------------------------------------------------------
def gic_nq(table: pd.DataFrame, n_total: int, p: int, q: int, m: int) -> np.ndarray:
    """``log(RSS/(N q)) + log(log N) log(p q M) df / (N q)`` for every row of a GIC table
    (:func:`strategies.solvers.problems.gic` with ``per = "nq"``).

    Parameters
    ----------
    table : pandas.DataFrame
        A GIC table with its ``rss`` and ``df`` columns
        (:func:`rowfed_flower.tuning.tune_gic`).
    n_total : int
        ``N``, the training rows of all clients.
    p, q : int
        The predictors and responses.
    m : int
        ``M``, the clients.

    Returns
    -------
    ndarray
        The criterion of each row.
    """
    return gic(table["rss"], n_total, p, q, m, table["df"], per="nq")


def fit_methods(st: Settings, data, cfg) -> tuple[dict, list[pd.DataFrame]]:
    """Every method of ``st.methods`` on ``data``: the tuned ones by GIC over their
    grids (``gic-nq``: picked from the same table and refitted), FedAvg with NonFed's
    ``lam2`` (or ``tuning.fedavg_lam2``).

    Parameters
    ----------
    st : Settings
        The study's settings: the methods, their grids, the criterion, FedAvg's ``lam2``
        and whether the comparators' own settings are tuned.
    data : FederatedData
        The task's federation.
    cfg : RowFedConfig
        The settings every fit starts from.

    Returns
    -------
    fits : dict of str to MethodResult
        Each method's fit.
    tables : list of pandas.DataFrame
        The tuned methods' GIC tables (with a ``method`` column).
    """
    from . import federation as fed

    m_clients = len(data.clients)
    n_total = sum(c.n for c in data.clients)
    p, q = len(data.features), len(data.responses)
    fits, tables = {}, []
    for method in st.methods:
        if method not in TUNED:
            continue
        lam1s, lam2s = st.grids[method]
        res, table = grid_search.tune_gic(cfg, data, method, lam1s, lam2s)
        table = table.assign(method=method)
        if st.criterion == "gic-nq":
            crit = gic_nq(table, n_total, p, q, m_clients)
            best = int(np.nanargmin(crit))
            table["gic_nq"] = crit
            table["selected"] = np.arange(len(table)) == best
            lam1, lam2 = float(table["lam1"].iloc[best]), float(table["lam2"].iloc[best])
            if (lam1, lam2) != (res.lam1, res.lam2):  # refit the chosen point
                res, _ = grid_search.tune_gic(cfg, data, method, [lam1], [lam2])
        fits[method] = res
        tables.append(table)
    shared = [m for m in st.methods if m in FEDAVG_FAMILY]
    if shared:
        lam2 = st.fedavg_lam2
        if lam2 == "nonfed":
            lam2 = fits["nonfed"].lam2 if "nonfed" in fits else cfg.lam2
        point = cfg.replace(lam2=float(lam2))
        for method in shared:
            own = point
            if st.comparators and method in KNOBS:  # its own setting, by CV
                opts = CVOptions(folds=5, jobs=1, seed=int(cfg.seed), quiet=True)
                own, _, _ = grid_search.tune(point, data, method, [], [point.lam2], opts)
            fits.update(fed.run_methods_inprocess(own, data, [method]))
            if own is not point:
                name = KNOBS[method].name
                fits[method].extra["tuned"] = f"{name}={getattr(own, name):g}"
    return fits, tables


def _tuning_columns(method: str, res) -> dict:
    return {
        "lam1": res.lam1 if method in TUNED[:3] else np.nan,
        "lam2": res.lam2,
        "gic": res.gic,
        "rounds": res.rounds,
        "converged": res.converged,
        "tuned": res.extra.get("tuned", ""),  # a comparator's own setting, when tuned
    }


def response_mse(res, data) -> np.ndarray:
    """Test MSE per client and response: ``mean_i (y_ik - x_i theta_k - a_k)^2`` on the input
    scale (its row mean is the client's MSE-Pred of docs/methods.md 2.7).

    Parameters
    ----------
    res : MethodResult
        The fit: its coefficients and intercepts on the input scale.
    data : FederatedData
        The clients' test rows.

    Returns
    -------
    ndarray, shape (M, q)
    """
    out = np.empty((len(data.clients), len(data.responses)))
    for m, c in enumerate(data.clients):
        pred = c.x_test @ res.coefficients[m]
        if res.intercept is not None:
            pred = pred + res.intercept[m]
        out[m] = np.mean((c.y_test - pred) ** 2, axis=0)
    return out


def simulated_federation(st: Settings, cell: dict, seed: int):
    """The §2.8 federation of a simulated cell.

    Parameters
    ----------
    st : Settings
        The study's settings: ``[data] n_test`` and ``clusters``.
    cell : dict
        The design cell: ``M``, ``n_m``, ``p``, ``q``.
    seed : int
        The simulation's seed.

    Returns
    -------
    FederatedData
    """

    spec = rsources.DataSpec(
        num_clients=cell["M"],
        n_train=cell["n_m"],
        n_test=st.n_test,
        num_features=cell["p"],
        num_responses=cell["q"],
        seed=seed,
    )
    return rsources.simulated_data(spec, st.clusters)


def run_task(settings: dict, cell: dict, rep: int, seed: int) -> dict[str, pd.DataFrame]:
    """One (cell, replication).

    Simulations: one row per method (MSE-Est, MSE-Pred, RI).  Real data: one row per method
    and client (state): ``mse_pred`` on its test rows, ``n_train``, ``n_test`` and
    ``mse_<response>`` per response.

    Parameters
    ----------
    settings : dict
        The study config's tables but ``[design]`` (:func:`parse_settings`).
    cell : dict
        The design cell's values.
    rep : int
        The replication's number, recorded in the rows.
    seed : int
        The task's seed: the data's (the simulation, or the real data's split) and the fits'.

    Returns
    -------
    dict of str to pandas.DataFrame
        ``results``, ``clusters`` (estimated row partitions, ``method, client,
        <predictor>...``; simulations add the truth) and ``gic`` (every tuned method's grid).
    """
    quiet_flower()
    from . import federation as fed
    from .metrics import mean_rand_index, mse_est

    st = parse_settings(settings, tuple(cell))
    if st.real is None:
        data = simulated_federation(st, cell, seed)
    else:
        data = real_federation(st.real, cell, seed)
    cfg = st.cfg.replace(seed=seed)
    fits, tables = fit_methods(st, data, cfg)
    rows = []
    for method in st.methods:
        res = fits[method]
        if st.real is None:
            rows.append(
                {
                    **cell,
                    "rep": rep,
                    "method": method,
                    "mse_est": mse_est(res.coefficients, data.theta_true),
                    "mse_pred": fed.mean_mse_pred(res),
                    "ri": mean_rand_index(data.partitions_true, res.clusters),
                    **_tuning_columns(method, res),
                    "seed": seed,
                }
            )
            continue
        per_response = response_mse(res, data)
        for m, c in enumerate(data.clients):
            ev = res.evaluation.get(c.site, {})
            rows.append(
                {
                    **cell,
                    "rep": rep,
                    "method": method,
                    "client": c.site,
                    "mse_pred": float(ev.get("mse_pred", np.nan)),
                    "n_train": c.n,
                    "n_test": int(c.x_test.shape[0]),
                    **{f"mse_{r}": per_response[m, k] for k, r in enumerate(data.responses)},
                    **_tuning_columns(method, res),
                    "seed": seed,
                }
            )
    features = list(data.features)
    parts = [(m, fits[m].clusters) for m in st.methods]
    if data.partitions_true is not None:
        parts.insert(0, ("truth", data.partitions_true))
    clusters = []
    for method, labels in parts:
        frame = pd.DataFrame(np.asarray(labels), columns=features)
        frame.insert(0, "client", data.sites)
        frame.insert(0, "method", method)
        clusters.append(frame)
    frames = {
        "results": pd.DataFrame(rows),
        "clusters": pd.concat(clusters, ignore_index=True),
    }
    if tables:
        frames["gic"] = pd.concat(tables, ignore_index=True)
    return frames


# ---------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------
def add_parser(sub) -> None:
    """The ``study`` subcommand."""
    add_study_parser(sub)


def cmd_study(a, study, st) -> int:
    """A study of the config ``a.config`` read as ``(study, st)`` by :func:`load` (a
    coverage study is :func:`rowfed_flower.coverage.run`'s).

    Parameters
    ----------
    a : argparse.Namespace
        The ``study`` subcommand's options.
    study : Study
        The parsed config.
    st : Settings
        Its parsed settings.

    Returns
    -------
    int
        The exit code.
    """
    from .figures import make_figures

    if st.real is None:
        metrics = ("mse_est", "mse_pred", "ri")
    else:  # no true Theta: prediction error only (overall and per response)
        metrics = ("mse_pred", *(f"mse_{r}" for r in st.real["responses"]))
    return run_study_args(a, study, TASK, metrics, make_figures)


__all__ = [
    "Settings",
    "cmd_study",
    "fit_methods",
    "gic_nq",
    "load",
    "parse_settings",
    "real_federation",
    "response_mse",
    "run_task",
    "simulated_federation",
]
