"""Glue shared by the Flower app, the in-process engine and the fit command: which strategy
a method name means, the results and the output files (the data: :mod:`rowfed_flower.sources`)."""

from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from strategies.config import FEDAVG_FAMILY, ROWFED_FUSED_METHODS, ROWFED_METHODS, RowFedConfig
from strategies.errors import InputError
from strategies.runtime.engine import run_inprocess
from strategies.server.fedavg import round_limit
from strategies.server.registry import Registry
from strategies.server.rowfed import COMPARATORS, NonFedStrategy, RowFedStrategy, rowfed_registry

from .graph import build_graph
from .metrics import mean_rand_index, mse_est
from .sources import FederatedData

INTERCEPT = "(intercept)"


# ----------------------------------------------------------------------------------------
# Methods
# ----------------------------------------------------------------------------------------
FUSED_METHODS = ROWFED_FUSED_METHODS


def make_strategy(
    method: str,
    cfg: RowFedConfig,
    n_sites: int,
    registry: Registry,
    theta0: np.ndarray | None = None,
    progress=None,
    timeout: float | None = None,
):
    """The Strategy object for a method name.

    Parameters
    ----------
    method : str
        One of :data:`strategies.config.ROWFED_METHODS`.
    cfg : RowFedConfig
        The method's settings.
    n_sites : int
        The clients the strategy waits for.
    registry : Registry
        Where the clients register (shared between the methods of one run).
    theta0 : ndarray, shape (M, p, q), optional
        A fused method's working-scale start (no initialization round), e.g. a warm start.
    progress : callable, optional
        ``progress(round, objective, residuals, elapsed)`` after every round (not NonFed's).
    timeout : float, optional
        Seconds registration and each round wait for the clients.

    Returns
    -------
    Strategy
        :class:`~strategies.server.rowfed.RowFedStrategy` (a fused method),
        :class:`~strategies.server.rowfed.NonFedStrategy`, or a comparator's.
    """
    if method in FUSED_METHODS:
        grouping = "block" if method == "perfl-lsma" else "row"
        graph = functools.partial(build_graph, cfg.graph)
        return RowFedStrategy(
            cfg,
            n_sites,
            registry,
            grouping,
            theta0,
            progress,
            graph,
            timeout,
            fusion="mean" if method == "mean-fusion" else "graph",
        )
    if method == "nonfed":
        return NonFedStrategy(cfg, n_sites, registry, timeout)
    if method in FEDAVG_FAMILY:
        cls = COMPARATORS[method]
        return cls(cfg, n_sites, registry, progress=progress, timeout=timeout)
    raise InputError(f"method: must be one of {', '.join(ROWFED_METHODS)}, got {method!r}")


def max_rounds_for(method: str, cfg: RowFedConfig, tuned: bool = False, waves: int = 1) -> int:
    """A round budget for Flower's server loop: initialization, the method's own rounds and
    the evaluation after the last (the loop stops as soon as the method has finished).

    Parameters
    ----------
    method : str
        The method.
    cfg : RowFedConfig
        Its settings (``max_rounds``; a comparator's round limit).
    tuned : bool, optional
        A federated tuning: its stages each within their fits' limits.
    waves : int, optional
        A federated tuning's factor when not all its fits run at once
        (:meth:`strategies.stats.tuning.CVOptions.waves`).

    Returns
    -------
    int
    """
    if tuned:
        return waves * (2 * (cfg.max_rounds + 2) + 2)
    if method in FEDAVG_FAMILY:
        return round_limit(method, cfg) + 1
    if method in FUSED_METHODS:
        return cfg.max_rounds + 2
    return 2


@dataclass
class MethodResult:
    """What one method produced (coefficients on the input scale)."""

    method: str
    sites: list[str]
    coefficients: np.ndarray  # (M, p, q)
    intercept: np.ndarray | None  # (M, q)
    clusters: np.ndarray  # (M, p)
    history: list[dict]
    evaluation: dict[str, dict]
    converged: bool
    rounds: int
    objective: float
    gic: float
    lam1: float
    lam2: float
    coefficients_work: np.ndarray  # working scale (a warm start)
    extra: dict = field(default_factory=dict)


def oracle_inference(strategy, theta: np.ndarray, clusters: np.ndarray):
    """With ``inference = oracle``: the refit on the fit's structure from the moments in
    the clients' evaluation answers (:mod:`rowfed_flower.inference`).

    Parameters
    ----------
    strategy : Strategy
        The finished fit: its ``cfg``, ``sites`` and ``evaluation``.
    theta : ndarray, shape (M, p, q)
        Its coefficients; the non-zero entries are the refit's support.
    clusters : ndarray, shape (M, p)
        Its row clusters.

    Returns
    -------
    OracleFit or None
        ``None`` without ``inference = oracle`` or when a client's moments are missing.
    """
    from .inference import oracle_fit, read_moments

    if strategy.cfg.inference != "oracle":
        return None
    m, p, q = theta.shape
    moments = [read_moments(strategy.evaluation.get(s, {}), p, q) for s in strategy.sites]
    if any(mo is None for mo in moments):
        return None
    return oracle_fit(clusters, theta != 0.0, moments, bool(strategy.cfg.intercept))


def collect(method: str, strategy) -> MethodResult:
    """What a finished strategy produced (coefficients on the input scale); of a federated
    tuning, its result's fit with the tuning's outputs in ``extra``.

    Parameters
    ----------
    method : str
        The method's name, recorded in the result.
    strategy : Strategy
        The finished strategy (a federated tuning's
        :class:`~strategies.server.batch.BatchStrategy`, or a fit's).

    Returns
    -------
    MethodResult
    """
    from strategies.server.batch import BatchStrategy

    from .inference import without_moments

    if isinstance(strategy, BatchStrategy):
        res = collect(method, strategy.result.strategy)
        res.extra.update(strategy.describe())
        return res

    rounds = strategy.rounds
    theta, clusters = strategy.coefficients(), strategy.clusters()
    extra = {"missing": strategy.unanswered()}
    inference = oracle_inference(strategy, theta, clusters)
    if inference is not None:
        extra["inference"] = inference
    return MethodResult(
        method=method,
        sites=list(strategy.sites),
        coefficients=theta,
        intercept=strategy.intercepts(),
        clusters=clusters,
        history=list(strategy.history.rows),
        evaluation={s: without_moments(v) for s, v in strategy.evaluation.items()},
        converged=bool(strategy.converged),
        rounds=int(rounds),
        objective=float(strategy.objective()),
        gic=float(strategy.gic()),
        lam1=float(strategy.cfg.lam1),
        lam2=float(strategy.cfg.lam2),
        coefficients_work=np.array(strategy.warm_start()),
        extra=extra,
    )


def run_methods_inprocess(
    cfg: RowFedConfig,
    data: FederatedData,
    methods,
    progress=None,
    registry: Registry | None = None,
    guards=None,
) -> dict[str, MethodResult]:
    """Every method through the in-process engine (the same Strategy and NumPyClient
    objects as under ``flwr run``), sharing one registry (a method tuned inside the
    federation: :func:`rowfed_flower.federated_tuning.run_tuned_inprocess`).

    Parameters
    ----------
    cfg : RowFedConfig
        The settings of every method.
    data : FederatedData
        The clients' rows.
    methods : sequence of str
        The methods, run one after the other.
    progress : callable, optional
        ``progress(round, objective, residuals, elapsed)`` after every round.
    registry : Registry, optional
        The shared registry (a new one by default).
    guards : Guards, optional
        The clients' floors (the default ones when ``None``).

    Returns
    -------
    dict of str to MethodResult
        Each method's result.
    """
    clients = data.make_clients(guards)
    registry = registry if registry is not None else rowfed_registry()
    out = {}
    for method in methods:
        strategy = make_strategy(method, cfg, len(clients), registry, progress=progress)
        run_inprocess(strategy, clients, max_rounds_for(method, cfg))
        out[method] = collect(method, strategy)
    return out


# ----------------------------------------------------------------------------------------
# Metrics and printing
# ----------------------------------------------------------------------------------------
def mean_mse_pred(res: MethodResult) -> float:
    vals = [res.evaluation[s]["mse_pred"] for s in res.sites if s in res.evaluation]
    return float(np.mean(vals)) if len(vals) == len(res.sites) else float("nan")


def summarize(results: dict[str, MethodResult], data: FederatedData) -> pd.DataFrame:
    """One row per method: ``method, mse_est, mse_pred, ri, rounds, converged, objective``.

    Parameters
    ----------
    results : dict of str to MethodResult
        Each method's result.
    data : FederatedData
        The data they were fitted to; ``mse_est`` and ``ri`` need its truth (``nan``
        otherwise).

    Returns
    -------
    pandas.DataFrame
    """
    rows = []
    for method, res in results.items():
        truth = data.theta_true is not None
        rows.append(
            {
                "method": method,
                "mse_est": mse_est(res.coefficients, data.theta_true) if truth else np.nan,
                "mse_pred": mean_mse_pred(res),
                "ri": mean_rand_index(data.partitions_true, res.clusters) if truth else np.nan,
                "rounds": res.rounds,
                "converged": res.converged,
                "objective": res.objective,
            }
        )
    return pd.DataFrame(rows)


def format_table(summary: pd.DataFrame) -> str:
    """The per-method table ``MSE-Est, MSE-Pred, RI`` as plain text."""
    lines = ["method".ljust(12) + "MSE-Est".rjust(12) + "MSE-Pred".rjust(12) + "RI".rjust(8)]
    for _, r in summary.iterrows():

        def cell(v, width, fmt):
            return ("n/a" if not np.isfinite(v) else format(v, fmt)).rjust(width)

        lines.append(
            str(r["method"]).ljust(12)
            + cell(r["mse_est"], 12, ".5f")
            + cell(r["mse_pred"], 12, ".5f")
            + cell(r["ri"], 8, ".3f")
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------
# Output files
# ----------------------------------------------------------------------------------------
def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.bool_, bool)):
        return bool(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        v = float(value)
        return v if math.isfinite(v) else None
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    return value


def coefficients_frame(res: MethodResult, features, responses) -> pd.DataFrame:
    """``client, feature, <response>...``: one row per client and predictor (and an
    ``(intercept)`` row first when fitted), input scale.

    Parameters
    ----------
    res : MethodResult
        The fit.
    features : sequence of str
        The predictors' names.
    responses : sequence of str
        The responses' names: the columns of the coefficients.

    Returns
    -------
    pandas.DataFrame
    """
    rows = []
    for m, site in enumerate(res.sites):
        if res.intercept is not None:
            rows.append([site, INTERCEPT, *res.intercept[m]])
        for j, feat in enumerate(features):
            rows.append([site, feat, *res.coefficients[m, j]])
    return pd.DataFrame(rows, columns=["client", "feature", *responses])


def history_frame(res: MethodResult) -> pd.DataFrame:
    cols = ["round", "objective", "primal_residual", "dual_residual", "rho"]
    cols += [k for k in ("decrease", "step") if res.history and k in res.history[0]]
    return pd.DataFrame([{k: row.get(k) for k in cols} for row in res.history], columns=cols)


def clusters_frame(res: MethodResult, features) -> pd.DataFrame:
    """Per predictor: the number of client groups and each client's group label (groups
    numbered from 0 by first appearance in client order).

    Parameters
    ----------
    res : MethodResult
        The fit: its ``clusters`` ``(M, p)``, a column per client of ``res.sites``.
    features : sequence of str
        The predictors' names.

    Returns
    -------
    pandas.DataFrame
        ``feature, n_clusters`` and a column per client.
    """
    df = pd.DataFrame(res.clusters.T, columns=res.sites)
    df.insert(0, "n_clusters", [len(np.unique(res.clusters[:, j])) for j in range(len(features))])
    df.insert(0, "feature", list(features))
    return df


def mse_interval(mse: float, se, level: float = 0.95) -> tuple[float, float]:
    """Wald interval ``mse ± z·se`` for a client's expected squared prediction error, the
    lower end clipped at 0.

    Parameters
    ----------
    mse : float
        The client's mean squared prediction error.
    se : float or None
        Its standard error; ``None`` or not finite: no interval.
    level : float, optional
        The interval's coverage (``z`` is the normal quantile at ``(1 + level) / 2``).

    Returns
    -------
    lower, upper : float
        The interval's ends (NaN, NaN without a standard error).
    """
    from scipy.stats import norm

    if se is None or not math.isfinite(float(se)):
        return float("nan"), float("nan")
    half = float(norm.ppf(0.5 + level / 2)) * float(se)
    return max(0.0, mse - half), mse + half


MSE_COLUMNS = ["client", "response", "mse", "mse_se", "lower", "upper", "n_test"]


def mse_frame(metrics: dict, responses, split: str = "test", level: float = 0.95) -> pd.DataFrame:
    """Each client's MSE per response on its ``split`` rows with its Wald interval (columns
    :data:`MSE_COLUMNS`), from ``metrics.json``'s per-client evaluation.

    Parameters
    ----------
    metrics : dict
        ``metrics.json``'s content: ``clients`` holds each client's evaluation.
    responses : sequence of str
        The responses' names, in the order of the ``mse:<k>`` entries.
    split : {"test", "train"}, optional
        The rows: the clients whose evaluation scored the other rows are left out.
    level : float, optional
        The intervals' coverage.

    Returns
    -------
    pandas.DataFrame
    """
    rows = []
    for site, m in metrics["clients"].items():
        if m.get("split") != split:
            continue
        for k, name in enumerate(responses):
            mse, se = float(m[f"mse:{k}"]), m.get(f"mse_se:{k}")
            se = float("nan") if se is None else float(se)
            lower, upper = mse_interval(mse, se, level)
            values = [site, name, mse, se, lower, upper, m["n_test"]]
            rows.append(dict(zip(MSE_COLUMNS, values, strict=True)))
    return pd.DataFrame(rows, columns=MSE_COLUMNS)


def write_test_table(out_dir: str, metrics: dict, responses, level: float = 0.95) -> dict:
    """``test.csv`` (:func:`mse_frame` of the test rows, the clients that have them) and
    the summary ``metrics.json`` keeps: the mean over those clients of their MSE averaged
    over responses, and the mean over them per response.

    Parameters
    ----------
    out_dir : str
        The directory ``test.csv`` is written to.
    metrics : dict
        ``metrics.json``'s content (its ``clients``).
    responses : sequence of str
        The responses' names.
    level : float, optional
        The intervals' coverage.

    Returns
    -------
    dict
        ``mse`` (``None`` without test rows), ``mse_by_response``, ``level``, ``clients``
        (how many have test rows) and ``clients_without_test_rows``.
    """
    table = mse_frame(metrics, responses, "test", level)
    tested = list(dict.fromkeys(table["client"]))
    table.to_csv(os.path.join(out_dir, "test.csv"), index=False)
    by_response = table.groupby("response", sort=False)["mse"].mean()
    clients = metrics["clients"]
    return {
        "mse": float(np.mean([clients[s]["mse_pred"] for s in tested])) if tested else None,
        "mse_by_response": {r: float(v) for r, v in by_response.items()},
        "level": level,
        "clients": len(tested),
        "clients_without_test_rows": [s for s in clients if s not in tested],
    }


def write_result(
    out_dir: str,
    res: MethodResult,
    data: FederatedData,
    cfg: RowFedConfig,
    extra_metrics: dict | None = None,
) -> None:
    """Write ``coefficients.csv``, ``history.csv``, ``clusters.csv``, ``metrics.json`` (and
    ``inference.csv`` with the oracle refit) and, after a federated tuning, its table
    (``gic.csv`` or ``cv.csv``; ``metrics.json``'s settings: the tuned ones).

    Parameters
    ----------
    out_dir : str
        The directory, created if missing.
    res : MethodResult
        The fit.
    data : FederatedData
        The predictors' and responses' names, and the truth for ``mse_est`` and ``ri``.
    cfg : RowFedConfig
        The settings ``metrics.json`` records.
    extra_metrics : dict, optional
        More entries of ``metrics.json``.
    """
    os.makedirs(out_dir, exist_ok=True)
    if "tuning_table" in res.extra:
        name, table = res.extra["tuning_table"]
        table.to_csv(os.path.join(out_dir, name), index=False)
        extra_metrics = {**res.extra["tuning_metrics"], **(extra_metrics or {})}
        cfg = res.extra["config"]
    coefficients_frame(res, data.features, data.responses).to_csv(
        os.path.join(out_dir, "coefficients.csv"), index=False
    )
    history_frame(res).to_csv(os.path.join(out_dir, "history.csv"), index=False)
    clusters_frame(res, data.features).to_csv(os.path.join(out_dir, "clusters.csv"), index=False)
    inference = None
    if "inference" in res.extra:
        from .inference import inference_table

        fit = res.extra["inference"]
        inference_table(fit, res.sites, data.features, data.responses, cfg.level).to_csv(
            os.path.join(out_dir, "inference.csv"), index=False
        )
        inference = {
            "method": "oracle",
            "level": cfg.level,
            "sigma2": dict(zip(data.responses, fit.sigma2.tolist(), strict=True)),
            "df": dict(zip(data.responses, fit.df.tolist(), strict=True)),
        }
    elif cfg.inference == "oracle":
        inference = {"method": "oracle", "error": "a client sent no moments; no intervals"}
    summary = summarize({res.method: res}, data).iloc[0]
    metrics = {
        "method": res.method,
        "converged": res.converged,
        "rounds": res.rounds,
        "objective": res.objective,
        "lam1": res.lam1,
        "lam2": res.lam2,
        "gic": res.gic,
        "n_clients": len(res.sites),
        "n_features": len(data.features),
        "n_responses": len(data.responses),
        "mse_pred": summary["mse_pred"],
        "mse_est": summary["mse_est"],
        "ri": summary["ri"],
        "clients": {s: res.evaluation.get(s, {}) for s in res.sites},
        "missing_sites": list(res.extra.get("missing", [])),
        "config": {k.replace("_", "-"): v for k, v in vars(cfg).items()},
        **({"inference": inference} if inference else {}),
        **(extra_metrics or {}),
    }
    with open(os.path.join(out_dir, "metrics.json"), "w") as fh:
        json.dump(_jsonable(metrics), fh, indent=2)


__all__ = [
    "MethodResult",
    "collect",
    "format_table",
    "make_strategy",
    "max_rounds_for",
    "run_methods_inprocess",
    "summarize",
    "write_result",
    "write_test_table",
]
