"""Glue shared by the Flower apps, the in-process engine and the fit command: where the
data come from, which strategy a method name means, and what a finished run produced."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from strategies.config import (
    FEDAVG_FAMILY,
    GRAUC_FUSED_METHODS,
    GRAUC_METHODS,
    CheckpointConfig,
    GrAUCConfig,
)
from strategies.errors import InputError
from strategies.runtime.engine import run_inprocess
from strategies.server.fedavg import round_limit
from strategies.server.grauc import (
    COMPARATORS,
    FixedModelStrategy,
    GrAUCStrategy,
    IndividualStrategy,
)
from strategies.server.registry import Registry, pooled_scaling
from strategies.solvers import admm
from strategies.stats.inference import REFIT_ROUNDS

from .client import GrAUCClient
from .datafit import PairwiseLogistic, local_fit, split_by_class
from .graph import build_graph
from .inference import OracleFit, inference_table, oracle_fit, read_sandwich, without_sandwich
from .sources import DataSpec, load_sites  # noqa: F401  (the apps and benches read them here)


def pooled_datafit(sites, cfg: GrAUCConfig, registry: Registry | None) -> PairwiseLogistic:
    """The non-private central reference: one surrogate over all pairs of the pooled data
    (on the working scale).  The server reads every site's data here; this exists for
    comparison only.

    Parameters
    ----------
    sites : sequence of SiteData
        The sites whose training rows are pooled.
    cfg : GrAUCConfig
        The settings; ``cfg.ridge`` is the surrogate's ridge.
    registry : Registry or None
        Its ``center`` and ``scale``, when set, standardize the pooled rows.

    Returns
    -------
    PairwiseLogistic
        The pooled surrogate.
    """
    x = np.vstack([s.x_train for s in sites])
    y = np.concatenate([s.y_train for s in sites])
    if registry is not None and registry.center is not None:
        x = (x - registry.center) / registry.scale
    return PairwiseLogistic(*split_by_class(x, y), eta=cfg.ridge)


def pooled_fit(sites, cfg: GrAUCConfig, registry: Registry | None) -> np.ndarray:
    """The minimizer of :func:`pooled_datafit`.

    Parameters
    ----------
    sites : sequence of SiteData
        The sites whose training rows are pooled.
    cfg : GrAUCConfig
        The settings (the ridge).
    registry : Registry or None
        The standardization, as in :func:`pooled_datafit`.

    Returns
    -------
    ndarray, shape (p,)
        The pooled fit's coefficients on the working scale.
    """
    return local_fit(pooled_datafit(sites, cfg, registry))


def pooled_objective(sites, cfg: GrAUCConfig, beta, registry: Registry | None) -> float:
    """The value of :func:`pooled_datafit` at ``beta`` (the ``pooled`` method's objective).

    Parameters
    ----------
    sites : sequence of SiteData
        The sites whose training rows are pooled.
    cfg : GrAUCConfig
        The settings (the ridge).
    beta : ndarray, shape (p,)
        The coefficients, on the working scale.
    registry : Registry or None
        The standardization, as in :func:`pooled_datafit`.

    Returns
    -------
    float
        The pooled surrogate's value at ``beta``.
    """
    return pooled_datafit(sites, cfg, registry).value(beta)


FUSED_METHODS = GRAUC_FUSED_METHODS


def make_strategy(
    method: str,
    cfg: GrAUCConfig,
    n_sites: int,
    registry: Registry,
    sites=None,
    graph_edges=None,
    progress=None,
    checkpoint: dict | None = None,
    timeout: float | None = None,
    beta0: np.ndarray | None = None,
):
    """The Strategy object for a method name.

    Parameters
    ----------
    method : str
        One of :data:`strategies.config.GRAUC_METHODS`.
    cfg : GrAUCConfig
        The method's settings.
    n_sites : int
        The number of sites the strategy waits for.
    registry : Registry
        The sites' registry (shared by the methods of one run).
    sites : sequence of SiteData, optional
        The sites' data; ``pooled`` needs them (it fits at the server).
    graph_edges : ndarray, shape (n_edges, 2), optional
        A user edge list (site indices) instead of ``cfg.graph`` (the fused methods).
    progress : callable, optional
        Called after each round (the fused methods and the FedAvg family).
    checkpoint : dict, optional
        GrAUC-PFL's ``checkpoint`` (file written every ``checkpoint_every`` rounds) and
        ``resume`` (file to start from).
    timeout : float, optional
        Seconds registration and each round wait for the sites.
    beta0 : ndarray, shape (Z, p), optional
        A fused method's warm start on the working scale, in site order.

    Returns
    -------
    Strategy
        :class:`~strategies.server.grauc.GrAUCStrategy` (``grauc`` with the graph's fusion,
        ``mean-fusion`` with the mean's), ``IndividualStrategy``, a FedAvg-family comparator,
        or for ``pooled`` a ``FixedModelStrategy`` holding the pooled fit.
    """
    if method in FUSED_METHODS:
        return GrAUCStrategy(
            cfg,
            n_sites,
            registry,
            graph_edges,
            progress,
            **(checkpoint or {}),
            beta0=beta0,
            graph_builder=build_graph,
            timeout=timeout,
            fusion="graph" if method == "grauc" else "mean",
        )
    if method == "individual":
        return IndividualStrategy(cfg, n_sites, registry, timeout=timeout)
    if method in FEDAVG_FAMILY:
        cls = COMPARATORS[method]
        return cls(cfg, n_sites, registry, progress=progress, timeout=timeout)
    if method == "pooled":
        if sites is None:
            raise InputError("method: pooled needs the data at the server (simulated or csv)")
        if cfg.standardize == "federated" and registry.center is None:
            _standardize_from_data(registry, sites)
        beta = pooled_fit(sites, cfg, registry)
        strategy = FixedModelStrategy(beta, n_sites, registry, cfg.standardize, timeout)
        strategy.pooled_objective = pooled_objective(sites, cfg, beta, registry)
        return strategy
    raise InputError(f"method: must be one of {', '.join(GRAUC_METHODS)}, got {method!r}")


def _standardize_from_data(registry: Registry, sites) -> None:
    """The pooled scaling from the pooled rows (the pooled method holds them anyway)."""
    x = np.vstack([s.x_train for s in sites])
    registry.center, registry.scale = pooled_scaling(x.shape[0], x.sum(axis=0), (x * x).sum(axis=0))


def checkpoint_settings(rc: dict) -> dict:
    """The strategy's checkpoint arguments from a run config's ``checkpoint.*`` keys
    (:class:`strategies.config.CheckpointConfig`)."""
    return CheckpointConfig.from_run_config(rc).strategy_kwargs()


def max_rounds_for(method: str, cfg: GrAUCConfig, tuned: bool = False, waves: int = 1) -> int:
    """A round budget for Flower's server loop: the method's own rounds, and one for the
    evaluation after the last (the loop stops as soon as the method has finished).

    Parameters
    ----------
    method : str
        The method's name.
    cfg : GrAUCConfig
        Its settings (``max_rounds``, ``inference``, a FedAvg-family method's rounds).
    tuned : bool, optional
        A federated tuning: its stages each within their fits' limits.
    waves : int, optional
        How many times over a tuning's budget is needed when not all its fits run at once
        (:meth:`strategies.stats.tuning.CVOptions.waves`).

    Returns
    -------
    int
        The number of rounds.
    """
    if tuned:
        return waves * (3 * (cfg.max_rounds + 1) + REFIT_ROUNDS)
    if method in FEDAVG_FAMILY:
        return round_limit(method, cfg) + 1
    if method in FUSED_METHODS:
        return cfg.max_rounds + 1 + (REFIT_ROUNDS if cfg.inference == "oracle" else 0)
    return 2


@dataclass
class MethodResult:
    """What one method produced."""

    method: str
    sites: list[str]
    coefficients: np.ndarray  # (Z, p), input scale
    history: list[dict]
    evaluation: dict[str, dict]
    converged: bool
    rounds: int
    extra: dict = field(default_factory=dict)


def collect(method: str, strategy) -> MethodResult:
    """What a finished strategy produced (coefficients on the input scale); of a federated
    tuning, its refit with the tuning's outputs in ``extra``.

    Parameters
    ----------
    method : str
        The method the strategy ran.
    strategy : Strategy
        The finished strategy (a :class:`~strategies.server.batch.BatchStrategy` for a
        federated tuning).

    Returns
    -------
    MethodResult
        Its sites, coefficients, history, evaluation, convergence and rounds; ``extra`` holds
        a fused method's clusters (and graph), the oracle inference, the pooled objective
        and the sites that did not answer.
    """
    from strategies.server.batch import BatchStrategy

    if isinstance(strategy, BatchStrategy):
        res = collect(method, strategy.result.strategy)
        res.extra.update(strategy.describe())
        return res
    if method in FEDAVG_FAMILY:
        return MethodResult(
            method,
            list(strategy.sites),
            strategy.coefficients(),
            strategy.history.rows,
            strategy.evaluation,
            strategy.converged,
            strategy.rounds,
        )
    extra = {}
    if method in FUSED_METHODS:
        extra = {"clusters": strategy.clusters(), "beta_std": strategy.coefficients_std()}
        if strategy.registry.scale is not None:  # the working scale (a new site's median)
            extra["scale"] = np.asarray(strategy.registry.scale, dtype=float)
        if method == "grauc":  # mean-fusion has no graph (its map shows the sites alone)
            extra["graph"] = strategy.graph
            extra["weights"] = strategy.graph.weights(strategy.cfg.w_dist, strategy.cfg.q)
        history = strategy.history.rows
        rounds = strategy.rounds
        if strategy.refit is not None:
            extra["inference"] = oracle_inference(strategy)
    else:
        history, rounds = [], 1
        if method == "pooled":
            extra["pooled_objective"] = strategy.pooled_objective
    extra["missing"] = strategy.unanswered()
    return MethodResult(
        method,
        list(strategy.sites),
        strategy.coefficients(),
        history,
        {s: without_sandwich(m) for s, m in strategy.evaluation.items()},
        bool(getattr(strategy, "converged", True)),
        rounds,
        extra,
    )


def oracle_inference(strategy: GrAUCStrategy) -> OracleFit | str:
    """With inference = oracle: the refit and its sandwich errors from the sites' answers
    (:mod:`grauc_flower.inference`), or why there are none."""
    refit = strategy.refit
    if not refit.converged:
        return f"the refit did not converge in {refit.rounds} rounds (separable data? ridge > 0)"
    p = strategy.n_features
    meats = [read_sandwich(strategy.evaluation.get(s, {}), p) for s in strategy.sites]
    if any(m is None for m in meats):
        return "a site sent no gradient covariance; no intervals"
    return oracle_fit(refit, strategy.refit_labels, meats, strategy.registry.scale)


def clients_of(sites, ridge: float, guards=None) -> list[GrAUCClient]:
    """The sites' clients, each at its place in the list.

    Parameters
    ----------
    sites : sequence of SiteData
        The sites' data.
    ridge : float
        Each datafit's ridge.
    guards : Guards, optional
        The sites' floors (the default floors when ``None``; a fold's rows:
        :meth:`strategies.client.guards.Guards.for_view`).

    Returns
    -------
    list of GrAUCClient
        A client per site, its ``index`` its place in ``sites``.
    """
    return [GrAUCClient(s, ridge, index=z, guards=guards) for z, s in enumerate(sites)]


def run_methods_inprocess(
    cfg: GrAUCConfig,
    sites,
    methods,
    graph_edges=None,
    progress=None,
    checkpoint=None,
    guards=None,
) -> dict[str, MethodResult]:
    """Every method through the in-process engine, sharing one registry (a method tuned
    inside the federation: :func:`grauc_flower.federated_tuning.run_tuned_inprocess`).

    Parameters
    ----------
    cfg : GrAUCConfig
        The settings of every method.
    sites : sequence of SiteData
        The sites' data.
    methods : sequence of str
        The methods to run, one after another.
    graph_edges : ndarray, shape (n_edges, 2), optional
        A user edge list instead of ``cfg.graph`` (:func:`make_strategy`).
    progress : callable, optional
        The strategies' per-round callback.
    checkpoint : dict, optional
        GrAUC-PFL's checkpoint arguments (:func:`make_strategy`).
    guards : Guards, optional
        The sites' floors (:func:`clients_of`).

    Returns
    -------
    dict of str to MethodResult
        Each method's result.
    """
    clients = clients_of(sites, cfg.ridge, guards)
    registry = Registry()
    out = {}
    for method in methods:
        strategy = make_strategy(
            method, cfg, len(sites), registry, sites, graph_edges, progress, checkpoint
        )
        run_inprocess(strategy, clients, max_rounds_for(method, cfg))
        out[method] = collect(method, strategy)
    return out


# ---------------------------------------------------------------------------------------
# outputs


def auc_table(results: dict[str, MethodResult]) -> pd.DataFrame:
    """Tidy per-site AUC: ``method, site, auc, auc_se, n_pos, n_neg, split``."""
    rows = []
    for method, res in results.items():
        for site in res.sites:
            m = res.evaluation.get(site)
            if m is None:
                rows.append(
                    {
                        "method": method,
                        "site": site,
                        "auc": np.nan,
                        "auc_se": np.nan,
                        "n_pos": 0,
                        "n_neg": 0,
                        "split": "missing",
                    }
                )
            else:
                rows.append(
                    {
                        "method": method,
                        "site": site,
                        "auc": m["auc"],
                        "auc_se": m["auc_se"],
                        "n_pos": m["n_pos"],
                        "n_neg": m["n_neg"],
                        "split": m["split"],
                    }
                )
    return pd.DataFrame(rows)


def format_auc_table(results: dict[str, MethodResult]) -> str:
    """Per-institution AUC (one column per method) and the mean, as plain text."""
    df = auc_table(results)
    wide = df.pivot(index="site", columns="method", values="auc")[list(results)]
    lines = []
    split = set(df["split"])
    what = "test" if split == {"test"} else "/".join(sorted(split))
    lines.append(f"Per-institution {what} AUC")
    header = "site".ljust(10) + "".join(m.rjust(12) for m in wide.columns)
    lines.append(header)
    for site, row in wide.iterrows():
        cells = "".join(("n/a" if not np.isfinite(v) else f"{v:.4f}").rjust(12) for v in row)
        lines.append(str(site).ljust(10) + cells)
    no_auc = df[~np.isfinite(df["auc"].astype(float))]
    means = "".join(f"{np.nanmean(wide[m]):.4f}".rjust(12) for m in wide.columns)
    lines.append("mean".ljust(10) + means)
    lines.append(
        "rounds: "
        + ", ".join(
            f"{m} {res.rounds}" + ("" if res.converged else " (round limit)")
            for m, res in results.items()
        )
    )
    for _, r in no_auc.iterrows():
        lines.append(
            f"note: {r['method']} at site {r['site']}: no AUC (a class is missing "
            "from its evaluation data)"
        )
    return "\n".join(lines)


def write_result(
    out_dir: str, res: MethodResult, features, cfg: GrAUCConfig, extra_metrics: dict | None = None
) -> None:
    """Write ``coefficients.csv``, ``history.csv``, ``metrics.json`` and (GrAUC-PFL)
    ``edges.csv``, ``clusters.csv``, with inference = oracle ``inference.csv``, and after a
    federated tuning ``cv.csv`` into ``out_dir``.

    Parameters
    ----------
    out_dir : str
        The directory (made when missing).
    res : MethodResult
        What the method produced.
    features : sequence of str
        The feature names (the coefficients' columns).
    cfg : GrAUCConfig
        The settings ``metrics.json`` records; after a federated tuning the tuned ones
        (``res.extra["config"]``) instead.
    extra_metrics : dict, optional
        More ``metrics.json`` entries, over the others (after a federated tuning, over the
        tuning's own).
    """
    os.makedirs(out_dir, exist_ok=True)
    if "tuning_table" in res.extra:
        name, table = res.extra["tuning_table"]
        table.to_csv(os.path.join(out_dir, name), index=False)
    if "calibration" in res.extra:
        res.extra["calibration"].to_csv(os.path.join(out_dir, "calibration.csv"), index=False)
    if "tuning_table" in res.extra:
        extra_metrics = {**res.extra["tuning_metrics"], **(extra_metrics or {})}
        cfg = res.extra["config"]
    coef = pd.DataFrame(res.coefficients, columns=list(features))
    coef.insert(0, "site", res.sites)
    coef.to_csv(os.path.join(out_dir, "coefficients.csv"), index=False)
    columns = ["round", "objective", "primal_residual", "dual_residual", "rho"]
    columns += [
        k for k in ("n_answered", "decrease", "step") if res.history and k in res.history[0]
    ]
    hist = pd.DataFrame(res.history, columns=columns)
    hist.to_csv(os.path.join(out_dir, "history.csv"), index=False)
    if "graph" in res.extra:
        g = res.extra["graph"]
        edges = pd.DataFrame(
            {
                "site_u": [res.sites[u] for u in g.edges[:, 0]],
                "site_v": [res.sites[v] for v in g.edges[:, 1]],
                "distance_km": g.length_km,
                "weight": res.extra["weights"],
            }
        )
        edges.to_csv(os.path.join(out_dir, "edges.csv"), index=False)
    if "clusters" in res.extra:
        clusters = pd.DataFrame(res.extra["clusters"], columns=list(features))
        clusters.insert(0, "site", res.sites)
        clusters.to_csv(os.path.join(out_dir, "clusters.csv"), index=False)
    inference = None
    if "inference" in res.extra:
        fit = res.extra["inference"]
        inference = {"method": "oracle", "level": cfg.level, "interval": "normal (sandwich)"}
        if isinstance(fit, str):
            inference["error"] = fit
        else:
            table = inference_table(fit, res.sites, features, cfg.level)
            table.to_csv(os.path.join(out_dir, "inference.csv"), index=False)
            inference.update(refit_rounds=fit.rounds, refit_objective=fit.objective)
    # a site's reliability bands go to reliability.csv, not into metrics.json
    aucs = {s: {k: v for k, v in m.items() if k != "reliability"}
            for s, m in res.evaluation.items()}  # fmt: skip
    bands = reliability_table(res.evaluation, res.sites)
    if len(bands):
        bands.to_csv(os.path.join(out_dir, "reliability.csv"), index=False)
    finite = [m["auc"] for m in aucs.values() if np.isfinite(m["auc"])]
    metrics = {
        "method": res.method,
        "converged": res.converged,
        "rounds": res.rounds,
        "objective": res.history[-1]["objective"]
        if res.history
        else res.extra.get("pooled_objective"),
        "mean_auc": float(np.mean(finite)) if finite else None,
        "auc": {
            s: {
                k: (None if isinstance(v, float) and not np.isfinite(v) else v)
                for k, v in m.items()
            }
            for s, m in aucs.items()
        },
        "missing_sites": list(res.extra.get("missing", [])),
        "sites_without_auc": sorted(s for s, m in aucs.items() if not np.isfinite(m["auc"])),
        "config": {k.replace("_", "-"): v for k, v in vars(cfg).items()},
        **({"feature_scale": res.extra["scale"].tolist()} if "scale" in res.extra else {}),
        **({"inference": inference} if inference else {}),
        **(extra_metrics or {}),
    }
    with open(os.path.join(out_dir, "metrics.json"), "w") as fh:
        json.dump(metrics, fh, indent=2, default=float)


RELIABILITY_COLUMNS = ["site", "split", "lower", "upper", "rows", "mean_probability", "observed"]


def reliability_table(evaluation: dict, order) -> pd.DataFrame:
    """``reliability.csv``: each site's reliability bands of its calibrated risks on its
    evaluation rows (:func:`strategies.stats.calibration.reliability_bins`, as the site sent
    them; ``split``: its test rows, or its training rows when it has none).

    Parameters
    ----------
    evaluation : dict
        Each site's evaluation metrics (``reliability``: the bands as JSON text).
    order : sequence of str
        The sites, in the table's order.

    Returns
    -------
    pandas.DataFrame
        Columns :data:`RELIABILITY_COLUMNS`, a row per band; empty when no site sent any.
    """
    rows = []
    for site in order:
        m = evaluation.get(site, {})
        text = m.get("reliability")
        for band in json.loads(str(text)) if text else []:
            values = [site, m.get("split", "test"), *band]
            rows.append(dict(zip(RELIABILITY_COLUMNS, values, strict=True)))
    return pd.DataFrame(rows, columns=RELIABILITY_COLUMNS)


def sites_table(sites) -> pd.DataFrame:
    """``sites.csv``: each site's coordinates and its counts of training and test rows by
    class (what the report's map and data summary show)."""
    return pd.DataFrame(
        [
            {
                "site": s.site,
                "lat": s.lat,
                "lon": s.lon,
                "n_pos": int(np.sum(s.y_train == 1)),
                "n_neg": int(np.sum(s.y_train == 0)),
                "n_test_pos": int(np.sum(s.y_test == 1)),
                "n_test_neg": int(np.sum(s.y_test == 0)),
            }
            for s in sites
        ]
    )


def new_site_model(args, model):
    """``predict``'s sites outside the federation added to ``model`` with coefficients borrowed
    from the fitted sites (docs/methods.md 3.13).

    Parameters
    ----------
    args : argparse.Namespace
        ``predict``'s options: ``site``, ``lat``, ``lon`` (one new site) and/or ``sites`` (a
        file of them), ``new_site_rule``, and ``model`` (the fit's directory: its
        ``sites.csv`` gives the fitted sites' locations, its ``metrics.json`` the graph,
        weights, penalty and working scale).
    model : FittedModel
        The fitted model read from ``args.model``.

    Returns
    -------
    model : FittedModel
        ``model`` with the new sites (unchanged when there are none).
    borrowed : list of Borrowed
        What each new site borrowed (:class:`strategies.stats.predict.Borrowed`).
    """
    from strategies.stats.predict import Borrowed, combine

    from .data import location, read_sites
    from .graph import new_site_neighbours

    new: list[tuple[str, float, float]] = []
    if args.site.strip() or args.lat is not None or args.lon is not None:
        if not args.site.strip():
            raise InputError("site: --lat and --lon place the site named by --site")
        if args.lat is None or args.lon is None:
            raise InputError(f"site: {args.site.strip()!r} needs both --lat and --lon")
        new.append((args.site.strip(), *location(args.lat, args.lon)))
    if args.sites:
        frame = read_sites(args.sites)
        new += [(str(s), float(a), float(b)) for s, a, b in frame[["site", "lat", "lon"]].values]
    if not new:
        return model, []
    names = [s for s, _, _ in new]
    twice = [s for s in dict.fromkeys(names) if names.count(s) > 1]
    if twice:
        raise InputError(f"site: {twice[0]!r} is given twice (--site and --sites)")
    fitted = [s for s in names if s in model.sites]
    if fitted:
        raise InputError(
            f"site: {fitted[0]!r} is a site of the model (its rows use its own coefficients); "
            "a site outside the federation needs a name of its own"
        )
    path = os.path.join(args.model, "sites.csv")
    if not os.path.isfile(path):
        raise InputError(f"model: no sites.csv in {args.model} (the fitted sites' locations)")
    at = read_sites(path).set_index("site")
    absent = [s for s in model.sites if s not in at.index]
    if absent:
        raise InputError(f"model: site {absent[0]!r} has no location in {path}")
    lat = at.loc[list(model.sites), "lat"].to_numpy(dtype=float)
    lon = at.loc[list(model.sites), "lon"].to_numpy(dtype=float)
    try:
        with open(os.path.join(args.model, "metrics.json")) as fh:
            metrics = json.load(fh)
        cfg = metrics["config"]
        graph = dict(kind=str(cfg["graph"]), k=int(cfg["knn-k"]), w_dist=float(cfg["w-dist"]),
                     q=float(cfg["q"]))  # fmt: skip
        penalty = str(cfg["penalty"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        msg = f"model: no readable metrics.json settings in {args.model} ({exc})"
        raise InputError(msg) from None
    scale = metrics.get("feature_scale")
    rule = args.new_site_rule
    coef, borrowed = [], []
    for site, a, b in new:
        u, d, w = new_site_neighbours(lat, lon, a, b, rule, **graph)
        coef.append(combine(model.coef[u, :, 0], w, rule, penalty, scale))
        borrowed.append(Borrowed(site, tuple(int(i) for i in u), tuple(d), tuple(w)))
    return model.with_new_sites(names, np.array(coef)), borrowed


def registered_sites_table(registry, sites) -> pd.DataFrame:
    """``sites.csv`` as the server knows it (a run across hospitals: no rows at the server).

    Parameters
    ----------
    registry : Registry
        The run's registry, each site's registration ``meta``.
    sites : sequence of str
        The sites, in the table's order.

    Returns
    -------
    pandas.DataFrame
        Each site's ``site, lat, lon, n_pos, n_neg`` (training counts by class).
    """
    rows = []
    for s in sites:
        meta = registry.sites[s].meta
        rows.append({"site": s, "lat": float(meta["lat"]), "lon": float(meta["lon"]),
                     "n_pos": int(meta["n_pos"]), "n_neg": int(meta["n_neg"])})  # fmt: skip
    return pd.DataFrame(rows)


AUC_COLUMNS = ["site", "auc", "auc_se", "lower", "upper", "n_pos", "n_neg"]


def auc_frame(metrics: dict, order, split: str = "test", level: float = 0.95) -> pd.DataFrame:
    """Each site's AUC evaluated on ``split`` rows with its DeLong interval, from
    ``metrics.json``'s per-site evaluation.

    Parameters
    ----------
    metrics : dict
        ``metrics.json``'s content (its ``auc``: each site's evaluation).
    order : sequence of str
        The sites, in the table's order.
    split : str, optional
        ``"test"`` or ``"train"``: a site evaluated on the other rows is left out.
    level : float, optional
        The intervals' confidence level.

    Returns
    -------
    pandas.DataFrame
        Columns :data:`AUC_COLUMNS`; after a tuning also each site's calibrated risks' Brier
        score, calibration error, intercept and slope
        (:data:`strategies.stats.calibration.TEST_COLUMNS`).
    """
    from strategies.stats.calibration import TEST_COLUMNS

    from .metrics import auc_interval

    def number(v):
        return np.nan if v is None else float(v)

    rows = []
    calibrated = False
    for site in order:
        m = metrics["auc"].get(site, {})
        if m.get("split") != split:
            continue
        a, se = number(m["auc"]), number(m["auc_se"])
        lower, upper = auc_interval(a, se, level)
        values = [site, a, se, lower, upper, m["n_pos"], m["n_neg"]]
        row = dict(zip(AUC_COLUMNS, values, strict=True))
        if "brier" in m:
            calibrated = True
            row.update({c: number(m.get(c)) for c in TEST_COLUMNS})
        rows.append(row)
    columns = AUC_COLUMNS + (list(TEST_COLUMNS) if calibrated else [])
    return pd.DataFrame(rows, columns=columns)


def write_test_table(out_dir: str, metrics: dict, order, level: float = 0.95) -> dict:
    """``test.csv`` (:func:`auc_frame` of the test rows) and the summary ``metrics.json``
    keeps.

    Parameters
    ----------
    out_dir : str
        The directory ``test.csv`` goes into.
    metrics : dict
        ``metrics.json``'s content.
    order : sequence of str
        The sites, in the table's order.
    level : float, optional
        The intervals' confidence level.

    Returns
    -------
    dict
        ``mean_auc`` (over sites with a test AUC), ``level``, ``sites``,
        ``sites_without_test_auc``; with calibrated risks also the mean Brier score (over
        sites and over rows) and the median calibration error and slope.
    """
    table = auc_frame(metrics, order, "test", level)
    table.to_csv(os.path.join(out_dir, "test.csv"), index=False)
    finite = table["auc"][np.isfinite(table["auc"].astype(float))]
    out = {
        "mean_auc": float(finite.mean()) if len(finite) else None,
        "level": level,
        "sites": int(len(table)),
        "sites_without_test_auc": sorted(set(metrics["auc"]) - set(table["site"][finite.index])),
    }
    if "brier" in table.columns:  # the calibrated risks: means over sites, and over rows
        rows = (table["n_pos"] + table["n_neg"]).to_numpy(dtype=float)
        brier = table["brier"].to_numpy(dtype=float)
        ok = np.isfinite(brier)
        some = bool(ok.any())
        out["mean_brier"] = float(np.mean(brier[ok])) if some else None
        out["brier_over_rows"] = float(np.average(brier[ok], weights=rows[ok])) if some else None
        for c in ("ece", "cal_slope"):
            v = table[c].to_numpy(dtype=float)
            out[f"median_{c}"] = float(np.nanmedian(v)) if np.isfinite(v).any() else None
    return out


def history_rows(res: MethodResult) -> list[dict]:
    return list(res.history)


__all__ = ["admm"]
