"""Glue shared by the Flower apps, the in-process engine and the fit command: where the
data come from, which strategy a method name means, and what a finished run produced."""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from strategies import admm
from strategies.config import GRAUC_METHODS, GrAUCConfig, from_run_config, parse_methods
from strategies.engine import run_inprocess
from strategies.errors import InputError
from strategies.grauc import (
    FinalEvalFedAvg,
    FixedModelStrategy,
    GrAUCStrategy,
    IndividualStrategy,
)
from strategies.registry import Registry

from .auc import PairwiseLogistic, split_by_class
from .client import GrAUCClient
from .data import SiteData, load_csv, simulate
from .local import local_fit


@dataclass(frozen=True)
class DataSpec:
    """Where a federation's data come from (run-config keys ``data.*``)."""

    source: str = "simulated"  # simulated | csv
    simulation: int = 1
    n_sites: int = 20
    n_features: int = 10
    n_train: int = 50
    n_test: int = 200
    prevalence: float = 0.3
    level: int = 3
    data_seed: int = 0
    data_path: str = ""
    sites_path: str = ""
    allow_missing_class: bool = False

    @classmethod
    def from_run_config(cls, rc: dict) -> DataSpec:
        return cls(
            source=str(rc.get("data.source", "simulated")),
            simulation=int(rc.get("data.simulation", 1)),
            n_sites=int(rc.get("data.num-sites", 20)),
            n_features=int(rc.get("data.num-features", 10)),
            n_train=int(rc.get("data.n-train", 50)),
            n_test=int(rc.get("data.n-test", 200)),
            prevalence=float(rc.get("data.prevalence", 0.3)),
            level=int(rc.get("data.level", 3)),
            data_seed=int(rc.get("data.seed", 0)),
            data_path=str(rc.get("data.path", "")),
            sites_path=str(rc.get("data.sites-path", "")),
            allow_missing_class=str(rc.get("grauc.missing-class", "error")) == "borrow",
        )

    def to_run_config(self) -> dict:
        return {
            "data.source": self.source,
            "data.simulation": self.simulation,
            "data.num-sites": self.n_sites,
            "data.num-features": self.n_features,
            "data.n-train": self.n_train,
            "data.n-test": self.n_test,
            "data.prevalence": self.prevalence,
            "data.level": self.level,
            "data.seed": self.data_seed,
            "data.path": self.data_path,
            "data.sites-path": self.sites_path,
        }


@functools.lru_cache(maxsize=4)
def load_sites(spec: DataSpec) -> tuple[tuple[SiteData, ...], tuple[str, ...]]:
    """All sites' data for ``spec`` (cached per process)."""
    if spec.source == "simulated":
        sites = simulate(
            spec.simulation,
            spec.n_sites,
            spec.n_features,
            spec.n_train,
            spec.n_test,
            spec.prevalence,
            spec.level,
            spec.data_seed,
        )
        return tuple(sites), tuple(f"x{k + 1}" for k in range(spec.n_features))
    if spec.source == "csv":
        if not spec.data_path or not spec.sites_path:
            raise InputError("data.path: the csv source needs data.path and data.sites-path")
        sites, features = load_csv(spec.data_path, spec.sites_path, spec.allow_missing_class)
        return tuple(sites), tuple(features)
    raise InputError(f"data.source: must be simulated or csv, got {spec.source!r}")


def grauc_config(rc: dict) -> GrAUCConfig:
    return from_run_config(GrAUCConfig, rc, "grauc")


def grauc_methods(rc: dict) -> list[str]:
    return parse_methods(rc.get("method", "grauc"), GRAUC_METHODS)


def pooled_fit(sites, cfg: GrAUCConfig, registry: Registry | None) -> np.ndarray:
    """The non-private central reference: one surrogate over all pairs of the pooled data.

    The server reads every site's data here; this method exists for comparison only.
    """
    x = np.vstack([s.x_train for s in sites])
    y = np.concatenate([s.y_train for s in sites])
    if registry is not None and registry.center is not None:
        x = (x - registry.center) / registry.scale
    return local_fit(PairwiseLogistic(*split_by_class(x, y), eta=cfg.ridge))


def pooled_objective(sites, cfg: GrAUCConfig, beta, registry: Registry | None) -> float:
    x = np.vstack([s.x_train for s in sites])
    y = np.concatenate([s.y_train for s in sites])
    if registry is not None and registry.center is not None:
        x = (x - registry.center) / registry.scale
    return PairwiseLogistic(*split_by_class(x, y), eta=cfg.ridge).value(beta)


def make_strategy(
    method: str,
    cfg: GrAUCConfig,
    n_sites: int,
    registry: Registry,
    sites=None,
    graph_edges=None,
    progress=None,
):
    """The Strategy object for a method name."""
    if method == "grauc":
        return GrAUCStrategy(cfg, n_sites, registry, graph_edges, progress)
    if method == "individual":
        return IndividualStrategy(cfg, n_sites, registry)
    if method == "fedavg":
        return FinalEvalFedAvg(cfg, n_sites, registry, progress=progress)
    if method == "pooled":
        if sites is None:
            raise InputError("method: pooled needs the data at the server (simulated or csv)")
        if cfg.standardize == "federated" and registry.center is None:
            _standardize_from_data(registry, sites)
        beta = pooled_fit(sites, cfg, registry)
        strategy = FixedModelStrategy(beta, n_sites, registry, cfg.standardize)
        strategy.pooled_objective = pooled_objective(sites, cfg, beta, registry)
        return strategy
    raise InputError(f"method: must be one of {', '.join(GRAUC_METHODS)}, got {method!r}")


def _standardize_from_data(registry: Registry, sites) -> None:
    x = np.vstack([s.x_train for s in sites])
    n = x.shape[0]
    mean = x.mean(axis=0)
    sd = np.sqrt(np.maximum((x * x).sum(axis=0) - n * mean**2, 0.0) / max(n - 1, 1))
    registry.center = mean
    registry.scale = np.where(sd > 1e-12 * np.maximum(1.0, np.abs(mean)), sd, 1.0)


def max_rounds_for(method: str, cfg: GrAUCConfig) -> int:
    """A round budget for the server loop (registration + the method's own rounds)."""
    if method == "fedavg":
        return cfg.fedavg_rounds + 3
    if method == "grauc":
        return cfg.max_rounds + 3
    return 4


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
    if method == "fedavg":
        sites = (
            strategy.registry.order() if strategy.registry.sites else sorted(strategy.evaluation)
        )
        beta = strategy.beta
        if strategy.registry.scale is not None:
            beta = beta / strategy.registry.scale
        coef = np.tile(beta, (len(sites), 1))
        return MethodResult(
            method,
            sites,
            coef,
            strategy.history.rows,
            strategy.evaluation,
            strategy.converged,
            len(strategy.history.rows),
        )
    extra = {}
    if method == "grauc":
        extra = {
            "graph": strategy.graph,
            "weights": strategy.graph.weights(strategy.cfg.w_dist, strategy.cfg.q),
            "clusters": strategy.clusters(),
            "beta_std": strategy.coefficients_std(),
        }
        history = strategy.history.rows
        rounds = strategy.state.round
    else:
        history, rounds = [], 1
        if method == "pooled":
            extra["pooled_objective"] = strategy.pooled_objective
    return MethodResult(
        method,
        list(strategy.sites),
        strategy.coefficients(),
        history,
        strategy.evaluation,
        bool(getattr(strategy, "converged", True)),
        rounds,
        extra,
    )


def run_methods_inprocess(
    cfg: GrAUCConfig, sites, methods, graph_edges=None, progress=None
) -> dict[str, MethodResult]:
    """Every method through the in-process engine, sharing one registry."""
    clients = [GrAUCClient(s, cfg.ridge, index=k) for k, s in enumerate(sites)]
    registry = Registry()
    out = {}
    for method in methods:
        strategy = make_strategy(method, cfg, len(sites), registry, sites, graph_edges, progress)
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
    ``edges.csv`` and ``clusters.csv`` into ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    coef = pd.DataFrame(res.coefficients, columns=list(features))
    coef.insert(0, "site", res.sites)
    coef.to_csv(os.path.join(out_dir, "coefficients.csv"), index=False)
    hist = pd.DataFrame(
        res.history, columns=["round", "objective", "primal_residual", "dual_residual", "rho"]
    )
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
        clusters = pd.DataFrame(res.extra["clusters"], columns=list(features))
        clusters.insert(0, "site", res.sites)
        clusters.to_csv(os.path.join(out_dir, "clusters.csv"), index=False)
    aucs = {s: m for s, m in res.evaluation.items()}
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
        "sites_without_auc": sorted(s for s, m in aucs.items() if not np.isfinite(m["auc"])),
        "config": {k.replace("_", "-"): v for k, v in vars(cfg).items()},
        **(extra_metrics or {}),
    }
    with open(os.path.join(out_dir, "metrics.json"), "w") as fh:
        json.dump(metrics, fh, indent=2, default=float)


def history_rows(res: MethodResult) -> list[dict]:
    return list(res.history)


__all__ = ["admm"]
