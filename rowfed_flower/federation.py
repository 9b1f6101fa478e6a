"""Glue shared by the Flower app, the in-process engine and the fit command: where the
data come from, which strategy a method name means, and the output files."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from strategies.config import FEDAVG_FAMILY, ROWFED_FUSED_METHODS, ROWFED_METHODS, RowFedConfig
from strategies.datasets.tables import read_table, stripped_ids
from strategies.errors import InputError, bad_cell
from strategies.fedavg import comparator_class, round_limit
from strategies.registry import Registry
from strategies.rowfed import NonFedStrategy, RowFedAvg, RowFedStrategy, rowfed_registry
from strategies.runtime.engine import run_inprocess

from .client import ClientSamples, RowFedClient
from .data import N_CLUSTERS, read_graph, simulate
from .metrics import mean_rand_index, mse_est

#: Run-config prefix of the data keys (``rowfed-data.*``).
DATA_PREFIX = "rowfed-data"
INTERCEPT = "(intercept)"


# ----------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RowFedDataSpec:
    """Where a RowFed federation's data come from (run-config keys ``rowfed-data.*``).

    ``simulated``: docs/methods.md 2.8 with ``M = num-clients``, ``n_m = n-train`` (and
    ``n-test`` test rows per client), ``p = num-features``, ``q = num-responses``.
    ``csv``: the fit command's format (``path``, ``responses`` comma-separated,
    ``client-column``).
    """

    source: str = "simulated"  # [rowfed-data.source] simulated | csv | deployment
    num_clients: int = 10  # [rowfed-data.num-clients]
    n_train: int = 100  # [rowfed-data.n-train]
    n_test: int = 100  # [rowfed-data.n-test]
    num_features: int = 20  # [rowfed-data.num-features]
    num_responses: int = 20  # [rowfed-data.num-responses]
    seed: int = 0  # [rowfed-data.seed]
    path: str = ""  # [rowfed-data.path]
    responses: str = ""  # [rowfed-data.responses]
    client_column: str = "client"  # [rowfed-data.client-column]
    test_path: str = ""  # [rowfed-data.test-path] csv: a test file with the data's columns
    holdout: float = 0.0  # [rowfed-data.holdout] csv: share of each client's rows held out

    @classmethod
    def from_run_config(cls, rc: dict) -> RowFedDataSpec:
        kinds = {
            "source": str,
            "path": str,
            "responses": str,
            "client_column": str,
            "test_path": str,
            "holdout": float,
        }
        kwargs = {}
        for key, value in rc.items():
            if not key.startswith(DATA_PREFIX + "."):
                continue
            name = key[len(DATA_PREFIX) + 1 :].replace("-", "_")
            if name not in cls.__dataclass_fields__:
                raise InputError(f"{key}: unknown setting")
            kind = kinds.get(name, int)
            try:
                kwargs[name] = kind(value)
            except (TypeError, ValueError):
                raise InputError(f"{key}: expected {kind.__name__}, got {value!r}") from None
        spec = cls(**kwargs)
        if spec.source not in ("simulated", "csv", "deployment"):
            raise InputError(
                f"{DATA_PREFIX}.source: must be simulated, csv or deployment, got {spec.source!r}"
            )
        if not 0 <= spec.holdout < 1:
            raise InputError(f"{DATA_PREFIX}.holdout: must be in [0, 1), got {spec.holdout!r}")
        for name in ("num_clients", "n_train", "num_features", "num_responses"):
            if getattr(spec, name) < 1:
                key = f"{DATA_PREFIX}.{name.replace('_', '-')}"
                raise InputError(f"{key}: must be >= 1, got {getattr(spec, name)!r}")
        return spec

    def to_run_config(self) -> dict:
        return {
            f"{DATA_PREFIX}.{name.replace('_', '-')}": getattr(self, name)
            for name in self.__dataclass_fields__
        }


@dataclass(frozen=True)
class FederatedData:
    """All clients' data (in federation order), names, and the truth when simulated."""

    clients: tuple[ClientSamples, ...]
    features: tuple[str, ...]
    responses: tuple[str, ...]
    theta_true: np.ndarray | None = None  # (M, p, q)
    partitions_true: np.ndarray | None = None  # (M, p)

    @property
    def sites(self) -> list[str]:
        return [c.site for c in self.clients]

    def make_clients(self, guards=None) -> list[RowFedClient]:
        """The clients with ``guards`` (the default floors when ``None``; a fold's rows:
        :meth:`strategies.guards.Guards.for_view`)."""
        return [RowFedClient(c, k, self.features, guards) for k, c in enumerate(self.clients)]


def simulated_data(spec: RowFedDataSpec, n_clusters=N_CLUSTERS) -> FederatedData:
    """docs/methods.md 2.8 simulated federation; client ids ``"0" .. "M-1"`` (the partition
    ids); ``n_clusters``: the client clusters of each non-zero row."""
    d = simulate(
        spec.num_clients,
        spec.n_train,
        spec.n_test,
        spec.num_features,
        spec.num_responses,
        spec.seed,
        n_clusters=n_clusters,
    )
    clients = tuple(
        ClientSamples(str(m), d.x_train[m], d.y_train[m], d.x_test[m], d.y_test[m])
        for m in range(spec.num_clients)
    )
    features = tuple(f"x{j + 1}" for j in range(spec.num_features))
    responses = tuple(f"y{k + 1}" for k in range(spec.num_responses))
    return FederatedData(clients, features, responses, d.theta, d.partitions)


def _numeric_column(df: pd.DataFrame, col: str, key: str = "data") -> np.ndarray:
    raw = df[col].str.strip()
    missing = raw.eq("") | raw.str.upper().isin(["NA", "NAN", "?"])
    if missing.any():
        row = int(np.flatnonzero(missing.to_numpy())[0])
        raise InputError(f"{key}: {bad_cell(col, '', row)}")
    values = pd.to_numeric(raw, errors="coerce")
    bad = values.isna() | ~np.isfinite(values.to_numpy(dtype=float))
    if bad.any():
        k = int(np.flatnonzero(bad.to_numpy())[0])
        value = df[col].iloc[k]
        raise InputError(f"{key}: {bad_cell(col, value, k)}")
    return values.to_numpy(dtype=float)


def read_fit_csv(
    path: str, responses, client_column: str = "client", key: str = "data", min_rows: int = 2
) -> FederatedData:
    """The fit command's data: a ``client`` column, the response columns, predictors (every
    other column).  Clients in order of first appearance; each needs ``min_rows`` rows.
    Errors name ``key``.

    Raises :class:`InputError` with a one-line message naming the column on bad input.
    """
    if isinstance(responses, str):
        responses = [r.strip() for r in responses.split(",")]
    responses = [r for r in responses if r]
    if not responses:
        raise InputError("responses: give one or more response columns")
    if len(set(responses)) != len(responses):
        raise InputError(f"responses: a column is named twice: {','.join(responses)}")
    df = read_table(path, key, dtype=str, keep_default_na=False, skipinitialspace=True)
    df.columns = [str(c).strip() for c in df.columns]
    if client_column not in df.columns:
        raise InputError(f"{key}: no {client_column!r} column in {path!r}")
    for r in responses:
        if r not in df.columns:
            raise InputError(f"responses: {r!r} is not a column of {path!r}")
        if r == client_column:
            raise InputError(f"responses: {r!r} is the client column")
    predictors = [c for c in df.columns if c != client_column and c not in responses]
    if not predictors:
        raise InputError(f"{key}: {path!r} has no predictor columns")
    if len(df) == 0:
        raise InputError(f"{key}: {path!r} has no rows")
    client = stripped_ids(df[client_column], f"{key}: column {client_column!r}")
    if client.eq("").any():
        row = int(np.flatnonzero(client.eq("").to_numpy())[0])
        raise InputError(f"{key}: {bad_cell(client_column, '', row)}")
    y = np.column_stack([_numeric_column(df, c, key) for c in responses])
    x = np.column_stack([_numeric_column(df, c, key) for c in predictors])
    order = list(dict.fromkeys(client))
    counts = client.value_counts()
    for c in order:
        if counts[c] < min_rows:
            raise InputError(
                f"{key}: client {c!r} has {counts[c]} row; each client needs >= {min_rows}"
            )
    ids = client.to_numpy()
    clients = tuple(ClientSamples(c, x[ids == c], y[ids == c]) for c in order)
    return FederatedData(clients, tuple(predictors), tuple(responses))


@functools.lru_cache(maxsize=4)
def load_data(spec: RowFedDataSpec) -> FederatedData:
    """The federation's data for ``spec`` (cached per process)."""
    if spec.source == "simulated":
        return simulated_data(spec)
    if not spec.path or not spec.responses:
        raise InputError(f"{DATA_PREFIX}.path: the csv source needs path and responses")
    data = read_fit_csv(spec.path, spec.responses, spec.client_column)
    return with_test_set(data, spec.test_path, spec.holdout, spec.seed, spec.client_column)


def with_test_set(
    data: FederatedData, test_path: str, holdout: float, seed: int, client_column: str
) -> FederatedData:
    """``data`` with each client's test rows: from ``test_path`` (the data's columns, in any
    order; only known clients) or a random ``holdout`` share of its rows (at least one row
    kept for training; the client's own seeded stream)."""
    from strategies.tuning import holdout_mask, site_rng

    if test_path and holdout:
        raise InputError("holdout: give a test file or a holdout share, not both")
    if test_path:
        test = read_fit_csv(test_path, data.responses, client_column, "test-data", 1)
        if sorted(test.features) != sorted(data.features):
            extra = sorted(set(test.features) - set(data.features))
            missing = sorted(set(data.features) - set(test.features))
            what = f"extra column {extra[0]!r}" if extra else f"missing predictor {missing[0]!r}"
            raise InputError(f"test-data: {what} (the columns must match the training data)")
        known = set(data.sites)
        unknown = [c.site for c in test.clients if c.site not in known]
        if unknown:
            raise InputError(f"test-data: client {unknown[0]!r} is not a client of the data")
        order = [test.features.index(f) for f in data.features]
        rows = {c.site: c for c in test.clients}
        clients = tuple(
            ClientSamples(c.site, c.x, c.y, rows[c.site].x[:, order], rows[c.site].y)
            if c.site in rows
            else c
            for c in data.clients
        )
        return dataclasses.replace(data, clients=clients)
    if holdout:
        clients = []
        for c in data.clients:
            mask = holdout_mask(None, c.n, holdout, site_rng(seed, c.site))
            clients.append(ClientSamples(c.site, c.x[~mask], c.y[~mask], c.x[mask], c.y[mask]))
        return dataclasses.replace(data, clients=tuple(clients))
    return data


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
    """The Strategy object for a method name (``timeout``: seconds registration and each
    round wait for the clients)."""
    if method in FUSED_METHODS:
        grouping = "block" if method == "perfl-lsma" else "row"
        graph = functools.partial(read_graph, cfg.graph)
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
        cls = comparator_class(RowFedAvg, method)
        return cls(cfg, n_sites, registry, progress=progress, timeout=timeout)
    raise InputError(f"method: must be one of {', '.join(ROWFED_METHODS)}, got {method!r}")


def max_rounds_for(method: str, cfg: RowFedConfig, tuned: bool = False) -> int:
    """A round budget for Flower's server loop: initialization, the method's own rounds and
    the evaluation after the last (the loop stops as soon as the method has finished); a
    federated tuning's stages each within their fits' limits."""
    if tuned:
        return 2 * (cfg.max_rounds + 2) + 2
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
    theta: np.ndarray  # (M, p, q)
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
    theta_work: np.ndarray
    extra: dict = field(default_factory=dict)


def oracle_inference(strategy, theta: np.ndarray, clusters: np.ndarray):
    """With ``inference = oracle``: the refit on the fit's structure from the moments in
    the clients' evaluation answers (:mod:`rowfed_flower.inference`); ``None`` otherwise or
    when a client's moments are missing."""
    from .inference import oracle_refit, read_moments

    if strategy.cfg.inference != "oracle":
        return None
    m, p, q = theta.shape
    moments = [read_moments(strategy.evaluation.get(s, {}), p, q) for s in strategy.sites]
    if any(mo is None for mo in moments):
        return None
    return oracle_refit(clusters, theta != 0.0, moments, bool(strategy.cfg.intercept))


def collect(method: str, strategy) -> MethodResult:
    """What a finished strategy produced (coefficients on the input scale); of a federated
    tuning, its result's fit with the tuning's outputs in ``extra``."""
    from strategies.batch import BatchStrategy

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
        theta=theta,
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
        theta_work=np.array(strategy.warm_start()),
        extra=extra,
    )


def run_methods_inprocess(
    cfg: RowFedConfig,
    data: FederatedData,
    methods,
    progress=None,
    registry: Registry | None = None,
) -> dict[str, MethodResult]:
    """Every method through the in-process engine (the same Strategy and NumPyClient
    objects as under ``flwr run``), sharing one registry (a method tuned inside the
    federation: :func:`rowfed_flower.tuning.run_tuned_inprocess`)."""
    clients = data.make_clients()
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
    """One row per method: ``method, mse_est, mse_pred, ri, rounds, converged, objective``
    (``mse_est`` and ``ri`` need the truth: ``nan`` otherwise)."""
    rows = []
    for method, res in results.items():
        truth = data.theta_true is not None
        rows.append(
            {
                "method": method,
                "mse_est": mse_est(res.theta, data.theta_true) if truth else np.nan,
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
    ``(intercept)`` row first when fitted), input scale."""
    rows = []
    for m, site in enumerate(res.sites):
        if res.intercept is not None:
            rows.append([site, INTERCEPT, *res.intercept[m]])
        for j, feat in enumerate(features):
            rows.append([site, feat, *res.theta[m, j]])
    return pd.DataFrame(rows, columns=["client", "feature", *responses])


def history_frame(res: MethodResult) -> pd.DataFrame:
    cols = ["round", "objective", "primal_residual", "dual_residual", "rho"]
    cols += [k for k in ("decrease", "step") if res.history and k in res.history[0]]
    return pd.DataFrame([{k: row.get(k) for k in cols} for row in res.history], columns=cols)


def clusters_frame(res: MethodResult, features) -> pd.DataFrame:
    """Per predictor: the number of client groups and each client's group label (groups
    numbered from 0 by first appearance in client order)."""
    df = pd.DataFrame(res.clusters.T, columns=res.sites)
    df.insert(0, "n_clusters", [len(np.unique(res.clusters[:, j])) for j in range(len(features))])
    df.insert(0, "feature", list(features))
    return df


def mse_interval(mse: float, se, level: float = 0.95) -> tuple[float, float]:
    """Wald interval ``mse ± z·se`` for a client's expected squared prediction error, the
    lower end clipped at 0 (NaN, NaN without a standard error)."""
    from scipy.stats import norm

    if se is None or not math.isfinite(float(se)):
        return float("nan"), float("nan")
    half = float(norm.ppf(0.5 + level / 2)) * float(se)
    return max(0.0, mse - half), mse + half


MSE_COLUMNS = ["client", "response", "mse", "mse_se", "lower", "upper", "n_test"]


def mse_frame(metrics: dict, responses, split: str = "test", level: float = 0.95) -> pd.DataFrame:
    """Each client's MSE per response on its ``split`` rows (``test`` or ``train``) with its
    Wald interval at ``level`` (columns :data:`MSE_COLUMNS`), from ``metrics.json``'s
    per-client evaluation."""
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
    over responses, and the mean over them per response."""
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
    """Write ``coefficients.csv``, ``history.csv``, ``clusters.csv``, ``metrics.json`` and,
    after a federated tuning, its table (``gic.csv`` or ``cv.csv``; ``metrics.json``'s
    settings: the tuned ones)."""
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
    "FederatedData",
    "MethodResult",
    "RowFedDataSpec",
    "collect",
    "format_table",
    "load_data",
    "make_strategy",
    "max_rounds_for",
    "read_fit_csv",
    "run_methods_inprocess",
    "simulated_data",
    "summarize",
    "with_test_set",
    "write_result",
    "write_test_table",
]
