"""Flower strategies for RowFed and its baselines (METHODS.md B.3, B.5).

They unpack, call the pure steps of :mod:`strategies.admm` and :mod:`rowfed_flower.core`,
and pack.  All per-client state is keyed by the site id each client reports at
registration, never by node id.

- :class:`RowFedStrategy`: registration round, one oracle-initialization round (each client
  returns its own ridge or NonFed fit: ``rowfed.init``), then linearized ADMM rounds with
  seeded partial participation.  ``fusion_grouping="block"`` gives PerFL-LSMA.
- :class:`NonFedStrategy`: registration, then one round of local fits (same sparsity).
- :class:`RowFedAvg`: Flower's own :class:`~flwr.server.strategy.FedAvg` on one common
  ``Theta`` (clients take local proximal-gradient steps), evaluated only at the end.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from logging import INFO

import numpy as np
from flwr.common import (
    EvaluateIns,
    FitIns,
    log,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.strategy import FedAvg

from strategies import admm, pqn
from strategies.base import SiteStrategy
from strategies.errors import InputError
from strategies.registry import EMPTY, Registry
from strategies.wire import pack

from .config import RowFedConfig
from .core import FUSION, SPARSITY, build_problem, fitted_structure
from .data import canonical_labels
from .metrics import degrees_of_freedom, gic


# ----------------------------------------------------------------------------------------
# Registry and graph
# ----------------------------------------------------------------------------------------
@dataclass
class ClientInfo:
    """What a client reports at registration."""

    site: str
    n: int
    p: int
    q: int
    index: int
    sum_x: np.ndarray
    sum_x2: np.ndarray
    sum_y: np.ndarray
    features: tuple[str, ...] = ()


def input_scale(theta: np.ndarray, registry) -> np.ndarray:
    """Coefficients ``(M, p, q)`` on the predictors' input scale (a copy)."""
    if registry.scale is None:
        return np.array(theta, copy=True)
    return theta / registry.scale[None, :, None]


def fitted_intercepts(cfg, registry, sites, coef: np.ndarray) -> np.ndarray | None:
    """``b_m = ybar_m - xbar_m^T Theta_m`` (input scale) ``(M, q)``, or ``None``."""
    if not cfg.intercept:
        return None
    x_mean, y_mean = registry.means(sites)
    return y_mean - np.einsum("mp,mpq->mq", x_mean, coef)


class RowFedRegistry(Registry):
    """:class:`strategies.registry.Registry` for RowFed clients (``n, p, q`` instead of a
    location and class counts).  Standardization divides by the pooled SD only: with an
    intercept each client centres its own data, without one a centring would add one."""

    def make_info(self, metrics: dict, arrays: list[np.ndarray]) -> ClientInfo:
        site = str(metrics["site"])
        p, q = int(metrics["p"]), int(metrics["q"])
        info = ClientInfo(
            site=site,
            n=int(metrics["n"]),
            p=p,
            q=q,
            index=int(metrics.get("index", -1)),
            sum_x=np.asarray(arrays[0], dtype=float) if arrays else np.zeros(p),
            sum_x2=np.asarray(arrays[1], dtype=float) if len(arrays) > 1 else np.zeros(p),
            sum_y=np.asarray(arrays[2], dtype=float) if len(arrays) > 2 else np.zeros(q),
            features=tuple(str(metrics["features"]).split(",")) if metrics.get("features") else (),
        )
        return info

    def scaling_config(self) -> dict:
        if self.scale is None:
            return {}
        return {"scale": pack(self.scale)}

    def dims(self, sites: list[str]) -> tuple[int, int]:
        """``(p, q)`` shared by ``sites``; :class:`InputError` when they disagree."""
        pq = {(self.sites[s].p, self.sites[s].q) for s in sites}
        if len(pq) != 1:
            raise InputError(f"data: clients report different (p, q): {sorted(pq)}")
        return pq.pop()

    def means(self, sites: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Per-client training means of ``x`` ``(M, p)`` and ``y`` ``(M, q)``, input scale."""
        info = [self.sites[s] for s in sites]
        return (
            np.stack([i.sum_x / i.n for i in info]),
            np.stack([i.sum_y / i.n for i in info]),
        )


def read_graph(graph: str, sites: list[str]) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Fusion graph over ``sites`` (client ids, in federation order).

    Parameters
    ----------
    graph : str
        ``"all-pairs"`` (returns ``(None, None)``: :func:`rowfed_flower.core.build_problem`'s
        default) or a CSV path whose first two columns are client ids ``u, v`` (one edge a
        row) and whose optional ``weight`` column (``>= 0``) multiplies ``lam1`` per edge.
    sites : list of str

    Returns
    -------
    edges : ndarray, shape (n_edges, 2), or None
    weights : ndarray, shape (n_edges,), or None
    """
    if graph == "all-pairs":
        return None, None
    import pandas as pd

    if not os.path.isfile(graph):
        raise InputError(f"graph: no such file {graph!r} (give all-pairs or an edge CSV)")
    try:
        df = pd.read_csv(graph, dtype=str)
    except Exception as exc:  # pandas raises several kinds
        raise InputError(f"graph: cannot read {graph!r}: {exc}") from None
    if df.shape[1] < 2 or len(df) == 0:
        raise InputError(f"graph: {graph!r} needs two columns of client ids and >= 1 edge")
    index = {s: k for k, s in enumerate(sites)}
    u_col, v_col = df.columns[:2]
    edges = []
    for u, v in zip(df[u_col].str.strip(), df[v_col].str.strip(), strict=True):
        for c in (u, v):
            if c not in index:
                raise InputError(f"graph: unknown client {c!r} in {graph!r}")
        if u == v:
            raise InputError(f"graph: self-loop at client {u!r} in {graph!r}")
        edges.append((index[u], index[v]))
    weights = None
    if "weight" in df.columns:
        w = pd.to_numeric(df["weight"], errors="coerce").to_numpy(dtype=float)
        if not np.all(np.isfinite(w)) or np.any(w < 0):
            raise InputError(f"graph: weights in {graph!r} must be numbers >= 0")
        weights = w
    return np.array(edges, dtype=np.int64).reshape(-1, 2), weights


def rowfed_problem(
    cfg: RowFedConfig,
    n_sites: int,
    edges: np.ndarray | None = None,
    weights: np.ndarray | None = None,
    fusion_grouping: str = "row",
) -> admm.Problem:
    """:func:`rowfed_flower.core.build_problem` with the settings of ``cfg``."""
    lam1 = cfg.lam1 if weights is None else cfg.lam1 * np.asarray(weights, dtype=float)
    return build_problem(
        n_sites, cfg.penalty_obj(), lam1, cfg.lam2, cfg.sparsity, edges, fusion_grouping
    )


def exact_row_clusters(theta: np.ndarray) -> np.ndarray:
    """Row partitions ``(M, p)``: clients share row ``j`` when their rows are exactly equal
    (for fits without a fusion ``delta``: NonFed, FedAvg)."""
    m, p = theta.shape[:2]
    labels = np.zeros((m, p), dtype=np.int64)
    for j in range(p):
        _, inv = np.unique(theta[:, j, :], axis=0, return_inverse=True)
        labels[:, j] = canonical_labels(inv.reshape(-1))
    return labels


# ----------------------------------------------------------------------------------------
# Shared base
# ----------------------------------------------------------------------------------------
class _RowFedSites(SiteStrategy):
    """Registration (by :class:`SiteStrategy`), per-client evaluation and the input-scale
    read-out shared by the RowFed strategies.  ``theta_work`` is ``(M, p, q)`` on the
    working scale (``x / scale``, centred per client with an intercept)."""

    def __init__(self, cfg: RowFedConfig, n_sites: int, registry: Registry | None = None):
        super().__init__(
            n_sites,
            registry if registry is not None else RowFedRegistry(),
            cfg.standardize,
            min_fit_fraction=0.0,  # failures are non-participants (METHODS.md B.3)
        )
        self.cfg = cfg
        self.history = admm.History()
        self.converged = False

    def update_shape(self) -> tuple[int, ...] | None:
        """One ``p x q`` matrix: coefficients (ADMM, initialization) or a gradient (pqn)."""
        return (self.n_features, self.n_responses)

    def _become_ready(self) -> None:
        if self.standardize == "federated" and self.registry.center is None:
            self.registry.standardize()
        self.sites = self.registry.order()
        self.site_index = {s: k for k, s in enumerate(self.sites)}
        self.n_features, self.n_responses = self.registry.dims(self.sites)
        self._setup()
        self.ready = True

    def _common(self) -> dict:
        return {"intercept": bool(self.cfg.intercept), **self.registry.scaling_config()}

    def _local_config(self, init: str) -> dict:
        cfg = self.cfg
        return {
            "task": "local",
            "init": init,
            "penalty": cfg.penalty,
            "concavity": float(cfg.concavity),
            "lam2": float(cfg.lam2),
            "sparsity": cfg.sparsity,
            **self._common(),
        }

    @property
    def theta_work(self) -> np.ndarray:
        raise NotImplementedError

    def estimate(self) -> np.ndarray:
        """The reported ``Theta_hat`` on the working scale, ``(M, p, q)``."""
        return self.theta_work

    def configure_evaluate(self, server_round, parameters, client_manager):
        if not self.done or self.evaluated:
            return []
        theta = self.estimate()
        ins = []
        for proxy in self._clients(client_manager):
            site = self.registry.cid_to_site.get(proxy.cid)
            if site is None or site not in self.site_index:
                continue
            params = ndarrays_to_parameters([theta[self.site_index[site]]])
            ins.append((proxy, EvaluateIns(params, {"site": site, **self._common()})))
        return ins

    def aggregate_evaluate(self, server_round, results, failures):
        self.registry.log_failures(failures, server_round)
        for _, res in results:
            self.evaluation[str(res.metrics["site"])] = dict(res.metrics)
        self.evaluated = True
        mse = [m["mse_pred"] for m in self.evaluation.values()]
        return None, {"mse_pred": float(np.mean(mse)) if mse else float("nan")}

    # -- read-out ---------------------------------------------------------------------------
    def coefficients_std(self) -> np.ndarray:
        return self.estimate()

    def coefficients(self) -> np.ndarray:
        """``Theta_hat_m`` on the input scale of the predictors, ``(M, p, q)``."""
        return input_scale(self.estimate(), self.registry)

    def intercepts(self) -> np.ndarray | None:
        """``b_m = ybar_m - xbar_m^T Theta_m`` (input scale) ``(M, q)``, or ``None``."""
        return fitted_intercepts(self.cfg, self.registry, self.sites, self.coefficients())

    def structure(self) -> tuple[np.ndarray, np.ndarray]:
        """Row clusters ``(M, p)`` and support ``(M, p, q)`` of the fit."""
        theta = self.estimate()
        return exact_row_clusters(theta), theta != 0.0

    def clusters(self) -> np.ndarray:
        return self.structure()[0]

    def rss(self) -> float:
        """``sum_m ||Y_m - X_m Theta_m||_F^2`` from the clients' evaluation answers."""
        if len(self.evaluation) < len(self.sites):
            return float("nan")
        return float(sum(m["rss"] for m in self.evaluation.values()))

    def gic(self) -> float:
        """GIC of the fit (METHODS.md B.4) from the uploaded RSS; ``nan`` before evaluation."""
        rss = self.rss()
        if not np.isfinite(rss):
            return float("nan")
        labels, support = self.structure()
        n_total = sum(self.registry.sites[s].n for s in self.sites)
        m, p, q = self.estimate().shape
        return gic(rss, n_total, p, q, m, degrees_of_freedom(labels, support))


# ----------------------------------------------------------------------------------------
# RowFed and PerFL-LSMA
# ----------------------------------------------------------------------------------------
class RowFedStrategy(_RowFedSites):
    """RowFed (METHODS.md B.3): linearized ADMM with seeded partial participation.

    Rounds: registration; one oracle-initialization round (``rowfed.init``: each client
    returns its ridge or NonFed fit; skipped when ``theta0`` is given, e.g. a warm start);
    then ADMM rounds.  In each ADMM round ``configure_fit`` draws the participants
    (``numpy.random.default_rng(seed)``, one vector ``rng.random(M) < pi`` per round, as
    :func:`rowfed_flower.core.fit_rowfed`) and sends each its own ``[Theta_m, pull_m]``
    with ``pull = sum_k A_k^T (gamma_k + rho (A_k Theta - delta_k))`` and ``rho sigma_max``;
    ``aggregate_fit`` puts the answers in ``Theta`` (non-participants, and clients that
    failed, keep ``Theta_m``), then calls :func:`strategies.admm.server_update` (the
    delta/eta thresholds, the dual updates and ``rho <- alpha rho``).  A draw with no
    participant is a round with ``Theta`` unchanged, done at once inside ``configure_fit``
    (Flower skips a round without instructions).  It stops when the residuals are within
    tolerance in consecutive rounds during which every client has answered at least once,
    or after ``max_rounds`` ADMM rounds.

    Parameters
    ----------
    cfg : RowFedConfig
    n_sites : int
    registry : RowFedRegistry, optional
        Shared between methods of one run (registration happens once).
    fusion_grouping : {"row", "block"}
        Row-wise fusion (RowFed) or matrix-wise fusion (PerFL-LSMA).
    theta0 : ndarray, shape (M, p, q), optional
        Working-scale start in federation order (no initialization round).
    progress : callable, optional
        ``progress(round, objective, residuals, elapsed)``.
    """

    count_column = "n_participants"
    first_curvature = 1.0  # L_m = lambda_max(X_m^T X_m / n_m): B_z >= the exact Hessian

    def __init__(
        self,
        cfg: RowFedConfig,
        n_sites: int,
        registry: Registry | None = None,
        fusion_grouping: str = "row",
        theta0: np.ndarray | None = None,
        progress=None,
    ) -> None:
        super().__init__(cfg, n_sites, registry)
        self.fusion_grouping = fusion_grouping
        self.theta0 = None if theta0 is None else np.array(theta0, dtype=float)
        self.progress = progress

    def _setup(self) -> None:
        cfg = self.cfg
        m = len(self.sites)
        self.edges, self.weights = read_graph(cfg.graph, self.sites)
        self.problem = rowfed_problem(cfg, m, self.edges, self.weights, self.fusion_grouping)
        self.sigma_max = self.problem.sigma_max()
        self.rng = np.random.default_rng(cfg.seed)
        self.loss = np.full(m, np.nan)
        self.seen = np.zeros(m, dtype=bool)
        shape = (m, self.n_features, self.n_responses)
        if self.theta0 is not None:
            if self.theta0.shape != shape:
                raise InputError(f"theta0: need shape {shape}, got {self.theta0.shape}")
            self._start(self.theta0)
        else:
            self.phase = "init"
            self.theta_init = np.full(shape, np.nan)
        log(
            INFO,
            "RowFed (%s fusion): %d clients, %d edges, p = %d, q = %d, sigma_max = %.4g",
            self.fusion_grouping,
            m,
            self.problem.splits[FUSION].matrix.shape[0],
            self.n_features,
            self.n_responses,
            self.sigma_max,
        )

    def _start(self, theta0: np.ndarray) -> None:
        self.state = admm.init_state(self.problem, theta0, self.cfg.rho, threshold=True)
        self.phase = "admm"
        self.qn = None
        if self.cfg.resolved_algorithm == "pqn":
            # the least-squares loss is quadratic: the secant model becomes X^T X / n
            self.qn = pqn.init_qn(theta0, model="secant")

    @property
    def rounds(self) -> int:
        """Communication rounds after the initialization round."""
        if self.phase != "admm":
            return 0
        return self.qn.round if self.qn is not None else self.state.round

    @property
    def theta_work(self) -> np.ndarray:
        if self.phase == "init":
            return self.theta_init
        return self.state.beta

    def estimate(self) -> np.ndarray:
        """``Theta`` with the exact zeros of the sparsity split's ``eta`` (B.3): entries (or
        rows) that ``eta`` sets to zero are zero; they differ from ``Theta`` by at most the
        primal residual.  Fused rows are read from ``delta`` (:meth:`clusters`)."""
        if self.phase != "admm":
            return self.theta_init
        if self.qn is not None:  # pqn: the zeros of the last model problem's eta
            if self.qn.inner is None:
                return self.qn.x
            return np.where(self.qn.inner.delta[SPARSITY] == 0.0, 0.0, self.qn.x)
        eta = self.state.delta[SPARSITY]
        return np.where(eta == 0.0, 0.0, self.state.beta)

    def pull(self) -> np.ndarray:
        """``sum_k A_k^T (gamma_k + rho (A_k Theta - delta_k))``, ``(M, p, q)``: row ``m`` is
        what client ``m`` needs (with its own ``c_m``) for ``Theta_tilde_m``."""
        st = self.state
        a_theta = self.problem.apply_all(st.beta)
        v = tuple(
            g + st.rho * (at - d) for g, at, d in zip(st.gamma, a_theta, st.delta, strict=True)
        )
        return self.problem.apply_t_sum(v)

    def draw(self) -> np.ndarray:
        """This round's participants (bool ``(M,)``), seeded as in ``fit_rowfed``."""
        m = len(self.sites)
        if self.cfg.participation < 1.0:
            return self.rng.random(m) < self.cfg.participation
        return np.ones(m, dtype=bool)

    def _instructions(self, clients):
        by_site = {self.registry.cid_to_site[c.cid]: c for c in clients}
        if self.phase == "init":
            config = self._local_config(self.cfg.init)
            return [
                (by_site[s], FitIns(EMPTY, {**config, "site": s}))
                for s in self.sites
                if s in by_site and np.isnan(self.theta_init[self.site_index[s]]).any()
            ]
        if self.qn is not None:
            common = {"task": "gradient", "curvature": not self.qn.evaluated, **self._common()}
            return [
                (
                    by_site[s],
                    FitIns(
                        ndarrays_to_parameters([self.qn.trial[self.site_index[s]]]),
                        {**common, "site": s},
                    ),
                )
                for s in self.sites
                if s in by_site
            ]
        while not self.done:
            drawn = self.draw()
            ins = []
            if drawn.any():
                pull = self.pull()
                common = {
                    "task": "admm",
                    "local-solver": self.cfg.local_solver,
                    "rho-sigma": float(self.state.rho * self.sigma_max),
                    **self._common(),
                }
                for z in np.flatnonzero(drawn):
                    site = self.sites[z]
                    if site not in by_site:
                        continue
                    params = ndarrays_to_parameters([self.state.beta[z], pull[z]])
                    ins.append((by_site[site], FitIns(params, {**common, "site": site})))
            if ins:
                return ins
            self._advance(self.state.beta.copy(), np.zeros(len(self.sites), dtype=bool))
        return []

    def _aggregate(self, server_round, answered):
        if self.phase == "init":
            for site, (_, res) in answered.items():
                z = self.site_index[site]
                self.theta_init[z] = self.updates[site]
                self.loss[z] = float(res.metrics["loss"])
            if not np.isnan(self.theta_init).any():
                self._start(self.theta_init)
            return EMPTY, {}
        if self.qn is not None:
            return EMPTY, self._qn_round(answered)[1]
        theta = self.state.beta.copy()
        took_part = np.zeros(len(self.sites), dtype=bool)
        for site, (_, res) in answered.items():
            z = self.site_index[site]
            theta[z] = self.updates[site]  # decoded and checked by SiteStrategy
            self.loss[z] = float(res.metrics["loss"])
            took_part[z] = True
        res = self._advance(theta, took_part)
        metrics = {
            "objective": self.history.rows[-1]["objective"],
            "primal_residual": res.primal,
            "dual_residual": res.dual,
        }
        return EMPTY, metrics

    def _advance(self, theta: np.ndarray, took_part: np.ndarray) -> admm.Residuals:
        """One server half-round on the new ``Theta`` (B.3 steps 1-2) and the stopping rule."""
        cfg = self.cfg
        rho = self.state.rho
        self.state, res = admm.server_update(
            self.problem, self.state, theta, cfg.tol, cfg.tol, cfg.alpha
        )
        objective = float(np.sum(self.loss) + self.problem.penalty_value(theta))
        self.history.append(
            round=self.state.round,
            objective=objective,
            primal_residual=res.primal,
            dual_residual=res.dual,
            rho=rho,
            n_participants=int(took_part.sum()),
        )
        if res.converged:
            self.seen |= took_part
        else:
            self.seen[:] = False
        self.converged = bool(self.seen.all())
        self.done = self.converged or self.state.round >= cfg.max_rounds
        if self.progress is not None:
            self.progress(self.state.round, objective, res, time.perf_counter() - self._t0)
        return res

    def structure(self) -> tuple[np.ndarray, np.ndarray]:
        """Clusters from the fusion ``delta``, support from the sparsity ``eta`` (B.3)."""
        if self.phase != "admm":
            return super().structure()
        if self.qn is not None:
            if self.qn.inner is None:
                return super().structure()
            inner = self.qn.inner
            state = admm.AdmmState(self.qn.x, inner.delta, inner.u, inner.rho, self.qn.round)
            return fitted_structure(self.problem, state)
        return fitted_structure(self.problem, self.state)

    def objective(self) -> float:
        return self.history.rows[-1]["objective"] if self.history.rows else float("nan")


# ----------------------------------------------------------------------------------------
# NonFed
# ----------------------------------------------------------------------------------------
class NonFedStrategy(_RowFedSites):
    """NonFed (B.5): every client fits alone with the same sparsity penalty (one round)."""

    def _setup(self) -> None:
        m = len(self.sites)
        self.theta = np.full((m, self.n_features, self.n_responses), np.nan)
        self.loss = np.full(m, np.nan)

    @property
    def theta_work(self) -> np.ndarray:
        return self.theta

    def _instructions(self, clients):
        config = self._local_config("nonfed")
        out = []
        for c in clients:
            site = self.registry.cid_to_site[c.cid]
            if np.isnan(self.theta[self.site_index[site]]).any():
                out.append((c, FitIns(EMPTY, {**config, "site": site})))
        return out

    def _aggregate(self, server_round, answered):
        for site, (_, res) in answered.items():
            z = self.site_index[site]
            self.theta[z] = self.updates[site]
            self.loss[z] = float(res.metrics["loss"])
        self.done = not np.isnan(self.theta).any()
        self.converged = self.done
        if self.done:
            penalty = rowfed_problem(self.cfg, len(self.sites)).splits[SPARSITY]
            self.history.append(
                round=1,
                objective=float(np.sum(self.loss) + penalty.value(self.theta)),
                primal_residual=np.nan,
                dual_residual=np.nan,
                rho=np.nan,
                n_participants=len(answered),
            )
        return EMPTY, {}

    def objective(self) -> float:
        return self.history.rows[-1]["objective"] if self.history.rows else float("nan")


# ----------------------------------------------------------------------------------------
# FedAvg
# ----------------------------------------------------------------------------------------
def _no_metrics(fit_metrics) -> dict:
    return {}


class RowFedAvg(FedAvg):
    """Flower's own FedAvg on one common ``Theta`` with the sparsity penalty (B.5).

    A registration round comes first (unless the shared registry already knows every
    client): it gives the site ids and, with ``standardize = federated``, the pooled SD.
    Clients take ``fedavg-local-steps`` proximal-gradient steps (``task = fedavg``); the
    server averages weighted by ``n_m`` (Flower's ``aggregate``).  Evaluation runs once,
    after the last of ``fedavg-rounds`` rounds.
    """

    def __init__(
        self,
        cfg: RowFedConfig,
        n_sites: int,
        registry: Registry | None = None,
        initial: np.ndarray | None = None,
        progress=None,
    ) -> None:
        self.cfg = cfg
        self.registry = registry if registry is not None else RowFedRegistry()
        self.n_sites = int(n_sites)
        self.evaluation: dict[str, dict] = {}
        self.history = admm.History()
        self.progress = progress
        self._t0 = time.perf_counter()
        self.theta: np.ndarray | None = None
        self.rounds_done = 0
        self.done = False
        self.converged = False
        self.evaluated = False
        self.sparsity = rowfed_problem(cfg, 1).splits[SPARSITY]

        def fit_config(server_round: int):
            return {
                "task": "fedavg",
                "fedavg-local-steps": cfg.fedavg_local_steps,
                "fedavg-lr": cfg.fedavg_lr,
                "penalty": cfg.penalty,
                "concavity": float(cfg.concavity),
                "lam2": float(cfg.lam2),
                "sparsity": cfg.sparsity,
                "intercept": bool(cfg.intercept),
                **self.registry.scaling_config(),
            }

        def eval_config(server_round: int):
            return {"intercept": bool(cfg.intercept), **self.registry.scaling_config()}

        super().__init__(
            fraction_fit=1.0,
            fraction_evaluate=1.0,
            min_fit_clients=n_sites,
            min_evaluate_clients=n_sites,
            min_available_clients=n_sites,
            on_fit_config_fn=fit_config,
            on_evaluate_config_fn=eval_config,
            initial_parameters=None if initial is None else ndarrays_to_parameters([initial]),
            accept_failures=True,
            fit_metrics_aggregation_fn=_no_metrics,
            evaluate_metrics_aggregation_fn=_no_metrics,
        )

    def __repr__(self) -> str:
        return f"RowFedAvg(rounds={self.cfg.fedavg_rounds})"

    def _registered(self) -> bool:
        return len(self.registry.sites) >= self.n_sites

    def configure_fit(self, server_round, parameters, client_manager):
        if self.done:
            return []
        if not self._registered():
            client_manager.wait_for(self.n_sites, timeout=600)
            clients = [client_manager.all()[cid] for cid in sorted(client_manager.all())]
            return self.registry.registration_instructions(clients)
        return super().configure_fit(server_round, parameters, client_manager)

    def aggregate_fit(self, server_round, results, failures):
        results = self.registry.handle_registrations(results)
        self.registry.log_failures(failures, server_round)
        if self._registered() and self.cfg.standardize == "federated":
            if self.registry.scale is None:
                self.registry.standardize()
        if not results:  # the registration round, or nobody answered
            return None, {}
        losses = [float(r.metrics["loss"]) for _, r in results]
        params, metrics = super().aggregate_fit(server_round, results, failures)
        previous = self.theta
        if params is not None:
            self.theta = parameters_to_ndarrays(params)[0]
        self.rounds_done += 1
        # B.2 restricted to a common Theta (fusion = 0), at the Theta the clients received
        objective = float("nan")
        if len(results) == self.n_sites:
            start = previous if previous is not None else np.zeros_like(self.theta)
            objective = float(sum(losses) + self.n_sites * self.sparsity.value(start[None]))
        self.history.append(
            round=self.rounds_done,
            objective=objective,
            primal_residual=np.nan,
            dual_residual=np.nan,
            rho=np.nan,
            n_participants=len(results),
        )
        if self.progress is not None:
            self.progress(self.rounds_done, objective, None, time.perf_counter() - self._t0)
        self.done = self.rounds_done >= self.cfg.fedavg_rounds
        self.converged = self.done
        return params, metrics

    def configure_evaluate(self, server_round, parameters, client_manager):
        if not self.done or self.evaluated:
            return []
        return super().configure_evaluate(server_round, parameters, client_manager)

    def aggregate_evaluate(self, server_round, results, failures):
        for _, res in results:
            self.evaluation[str(res.metrics["site"])] = dict(res.metrics)
        self.evaluated = True
        return super().aggregate_evaluate(server_round, results, failures)

    # -- read-out (same interface as the site strategies) -------------------------------------
    @property
    def sites(self) -> list[str]:
        return self.registry.order()

    @property
    def theta_work(self) -> np.ndarray:
        return np.broadcast_to(self.theta, (len(self.sites),) + self.theta.shape).copy()

    def coefficients(self) -> np.ndarray:
        return input_scale(self.theta_work, self.registry)

    def intercepts(self) -> np.ndarray | None:
        return fitted_intercepts(self.cfg, self.registry, self.sites, self.coefficients())

    def structure(self) -> tuple[np.ndarray, np.ndarray]:
        theta = self.theta_work
        return exact_row_clusters(theta), theta != 0.0

    def clusters(self) -> np.ndarray:
        return self.structure()[0]

    def objective(self) -> float:
        return self.history.rows[-1]["objective"] if self.history.rows else float("nan")

    def gic(self) -> float:
        return float("nan")


__all__ = [
    "ClientInfo",
    "NonFedStrategy",
    "RowFedAvg",
    "RowFedRegistry",
    "RowFedStrategy",
    "exact_row_clusters",
    "read_graph",
    "rowfed_problem",
]
