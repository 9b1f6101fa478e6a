"""The RowFed simulation study (METHODS.md B.4–B.7): ``python -m rowfed_flower study``.

One task = one (cell, replication): simulate the B.7 federation with the task's seed, tune
RowFed, PerFL-LSMA and NonFed by GIC over a ``(lam1, lam2)`` grid (the existing
:func:`rowfed_flower.federation.tune_gic`, warm starts along the grid), fit FedAvg with
NonFed's chosen ``lam2`` (both have only the sparsity penalty), and score every method:
MSE-Est, MSE-Pred (test data) and RI (B.6).

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
    criterion = "gic"         # METHODS.md B.4; "gic-nq": the df penalty over N q (see below)
    fedavg_lam2 = "nonfed"    # or a number
    [tuning.perfl-lsma]       # per-method grids override (lam1 and/or lam2)
    lam1 = [2.0, 1.0, 0.5]
    [rowfed]                  # RowFedConfig settings (run-config names); lam1, lam2 tuned
    penalty = "scad"

``criterion = "gic-nq"`` **[choice, not the paper's]**: ``log(RSS/(N q)) + log(log N)
log(p q M) df / (N q)`` — the same GIC with the df penalty spread over the ``N q`` scalar
responses instead of the ``N`` rows; the point is picked from :func:`tune_gic`'s table and
refitted.  It exists to study the GIC's choice (see the study's report), not as a default.
"""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from strategies.config import from_run_config
from strategies.errors import InputError
from strategies.study_runner import Study, add_study_options, load_study, run_study

from .config import ROWFED_METHODS, RowFedConfig

DESIGN_TYPES = {"M": int, "n_m": int, "p": int, "q": int}
REQUIRED = ("M", "n_m", "p", "q")
SECTIONS = ("data", "tuning", "rowfed", "figures")
TUNED = ("rowfed", "perfl-lsma", "nonfed")
CRITERIA = ("gic", "gic-nq")
TASK = "rowfed_flower.study:run_task"
DEFAULT_LAM1 = (0.5, 0.3, 0.2, 0.1)
DEFAULT_LAM2 = (0.3, 0.2, 0.1, 0.05)


def _grid(value, key: str) -> tuple[float, ...]:
    if not isinstance(value, list):
        value = [value]
    if not value:
        raise InputError(f"{key}: give one or more values")
    for v in value:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0:
            raise InputError(f"{key}: expected numbers >= 0, got {v!r}")
    return tuple(sorted({float(v) for v in value}, reverse=True))


def parse_settings(settings: dict, keys=REQUIRED) -> dict:
    """Check the tables of a RowFed study config; returns ``methods``, ``n_test``,
    ``grids`` (method -> (lam1 grid, lam2 grid)), ``criterion``, ``fedavg_lam2``, ``cfg``
    and ``figure_cell``."""
    methods = settings.get("methods", list(ROWFED_METHODS))
    if isinstance(methods, str):
        methods = [m.strip() for m in methods.split(",")]
    if not isinstance(methods, list) or not methods:
        raise InputError("methods: give a list of one or more methods")
    for m in methods:
        if m not in ROWFED_METHODS:
            raise InputError(f"methods: must be among {', '.join(ROWFED_METHODS)}, got {m!r}")
    data = settings.get("data", {})
    for key in data:
        if key != "n_test":
            raise InputError(f"data.{key}: unknown setting (allowed: n_test)")
    n_test = data.get("n_test", 100)
    if not isinstance(n_test, int) or isinstance(n_test, bool) or n_test < 1:
        raise InputError(f"data.n_test: must be an integer >= 1, got {n_test!r}")
    tuning = dict(settings.get("tuning", {}))
    allowed = {"lam1", "lam2", "criterion", "fedavg_lam2", *TUNED}
    for key in tuning:
        if key not in allowed:
            raise InputError(f"tuning.{key}: unknown setting (allowed: {', '.join(allowed)})")
    lam1 = _grid(tuning.get("lam1", list(DEFAULT_LAM1)), "tuning.lam1")
    lam2 = _grid(tuning.get("lam2", list(DEFAULT_LAM2)), "tuning.lam2")
    grids = {}
    for m in TUNED:
        own = tuning.get(m, {})
        if not isinstance(own, dict):
            raise InputError(f"tuning.{m}: expected a table with lam1 and/or lam2")
        for key in own:
            if key not in ("lam1", "lam2"):
                raise InputError(f"tuning.{m}.{key}: unknown setting (allowed: lam1, lam2)")
        grids[m] = (
            _grid(own["lam1"], f"tuning.{m}.lam1") if "lam1" in own else lam1,
            _grid(own["lam2"], f"tuning.{m}.lam2") if "lam2" in own else lam2,
        )
    criterion = tuning.get("criterion", "gic")
    if criterion not in CRITERIA:
        raise InputError(
            f"tuning.criterion: must be one of {', '.join(CRITERIA)}, got {criterion!r}"
        )
    fedavg_lam2 = tuning.get("fedavg_lam2", "nonfed")
    if fedavg_lam2 != "nonfed" and (
        isinstance(fedavg_lam2, bool)
        or not isinstance(fedavg_lam2, (int, float))
        or fedavg_lam2 < 0
    ):
        raise InputError(f"tuning.fedavg_lam2: 'nonfed' or a number >= 0, got {fedavg_lam2!r}")
    rc = {f"rowfed.{k}": v for k, v in settings.get("rowfed", {}).items()}
    for key in ("rowfed.lam1", "rowfed.lam2"):
        if key in rc:
            raise InputError(f"{key}: chosen by GIC in a study; give tuning.lam1 / tuning.lam2")
    if "rowfed.intercept" in rc and not isinstance(rc["rowfed.intercept"], bool):
        raise InputError("rowfed.intercept: expected true or false")
    cfg = from_run_config(RowFedConfig, rc, "rowfed")
    figures = settings.get("figures", {})
    for key in figures:
        if key != "cell":
            raise InputError(f"figures.{key}: unknown setting (allowed: cell)")
    cell = figures.get("cell")
    if cell is not None:
        if not isinstance(cell, dict):
            raise InputError("figures.cell: expected a table of design values")
        for key in cell:
            if key not in keys:
                raise InputError(f"figures.cell: {key!r} is not a design key")
    return {
        "methods": tuple(methods),
        "n_test": n_test,
        "grids": grids,
        "criterion": criterion,
        "fedavg_lam2": fedavg_lam2,
        "cfg": cfg,
        "figure_cell": cell,
    }


def check_cell(cell: dict) -> None:
    label = ", ".join(f"{k}={v}" for k, v in cell.items())
    for key, low in (("M", 2), ("n_m", 2), ("p", 1), ("q", 1)):
        if cell[key] < low:
            raise InputError(f"design.{key}: must be >= {low} (cell {label})")


def load(path: str) -> tuple[Study, dict]:
    study = load_study(path, "rowfed", DESIGN_TYPES, REQUIRED, SECTIONS)
    settings = parse_settings(study.settings, study.keys)
    for cell in study.cells:
        check_cell(cell)
    return study, settings


# ---------------------------------------------------------------------------------------
# One task
# ---------------------------------------------------------------------------------------
def gic_nq(table: pd.DataFrame, n_total: int, p: int, q: int, m: int) -> np.ndarray:
    """``log(RSS/(N q)) + log(log N) log(p q M) df / (N q)`` for every row of a GIC table."""
    rss = table["rss"].to_numpy(dtype=float)
    df = table["df"].to_numpy(dtype=float)
    return np.log(rss / (n_total * q)) + np.log(np.log(n_total)) * np.log(p * q * m) * df / (
        n_total * q
    )


def _quiet() -> None:
    from flwr.common.logger import FLOWER_LOGGER

    FLOWER_LOGGER.setLevel(logging.WARNING)


def run_task(settings: dict, cell: dict, rep: int, seed: int) -> dict[str, pd.DataFrame]:
    """One (cell, replication).  Frames: ``results`` (one row per method), ``clusters``
    (estimated and true row partitions, ``method, client, x1..xp``) and ``gic`` (every
    tuned method's grid)."""
    _quiet()
    from . import federation as fed
    from .metrics import mean_rand_index, mse_est

    st = parse_settings(settings, tuple(cell))
    spec = fed.RowFedDataSpec(
        num_clients=cell["M"],
        n_train=cell["n_m"],
        n_test=st["n_test"],
        num_features=cell["p"],
        num_responses=cell["q"],
        seed=seed,
    )
    data = fed.simulated_data(spec)
    cfg = st["cfg"].replace(seed=seed)
    n_total = cell["M"] * cell["n_m"]
    fits, tables = {}, []
    for method in st["methods"]:
        if method not in TUNED:
            continue
        lam1s, lam2s = st["grids"][method]
        res, table = fed.tune_gic(cfg, data, method, lam1s, lam2s)
        table = table.assign(method=method)
        if st["criterion"] == "gic-nq":
            crit = gic_nq(table, n_total, cell["p"], cell["q"], cell["M"])
            best = int(np.nanargmin(crit))
            table["gic_nq"] = crit
            table["selected"] = np.arange(len(table)) == best
            lam1, lam2 = float(table["lam1"].iloc[best]), float(table["lam2"].iloc[best])
            if (lam1, lam2) != (res.lam1, res.lam2):  # refit the chosen point
                res, _ = fed.tune_gic(cfg, data, method, [lam1], [lam2])
        fits[method] = res
        tables.append(table)
    if "fedavg" in st["methods"]:
        lam2 = st["fedavg_lam2"]
        if lam2 == "nonfed":
            lam2 = fits["nonfed"].lam2 if "nonfed" in fits else cfg.lam2
        point = cfg.replace(lam2=float(lam2))
        fits["fedavg"] = fed.run_methods_inprocess(point, data, ["fedavg"])["fedavg"]
    rows = []
    for method in st["methods"]:
        res = fits[method]
        rows.append(
            {
                **cell,
                "rep": rep,
                "method": method,
                "mse_est": mse_est(res.theta, data.theta_true),
                "mse_pred": fed.mean_mse_pred(res),
                "ri": mean_rand_index(data.partitions_true, res.clusters),
                "lam1": res.lam1 if method in ("rowfed", "perfl-lsma") else np.nan,
                "lam2": res.lam2,
                "gic": res.gic,
                "rounds": res.rounds,
                "converged": res.converged,
                "seed": seed,
            }
        )
    features = [f"x{j + 1}" for j in range(cell["p"])]
    parts = [("truth", data.partitions_true)] + [(m, fits[m].clusters) for m in st["methods"]]
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
    """The ``study`` subcommand of ``python -m rowfed_flower``."""
    p = sub.add_parser("study", help="a simulation study driven by a TOML config")
    add_study_options(p)


def cmd_study(a) -> int:
    from .figures import make_figures

    study, _ = load(a.config)
    return run_study(
        study,
        TASK,
        a.out,
        reps=a.reps,
        only=a.only,
        workers=a.workers,
        ray_address=a.ray_address,
        metrics=("mse_est", "mse_pred", "ri"),
        figures=None if a.no_figures else make_figures,
        quiet=a.quiet,
    )


__all__ = ["cmd_study", "gic_nq", "load", "parse_settings", "run_task"]
