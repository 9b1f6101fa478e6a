"""Flower strategies for GrAUC-PFL and its baselines.  They unpack, call the pure steps of
:mod:`strategies.admm` and pack; all per-site state is keyed by site id."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from logging import INFO

import numpy as np
import scipy.sparse as sp
from flwr.common import (
    FitIns,
    Parameters,
    log,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.strategy import FedAvg

from . import admm, pqn
from .base import SiteStrategy
from .config import GrAUCConfig
from .errors import InputError
from .penalties import Penalty
from .registry import EMPTY, Registry


def grauc_problem(graph, n_sites: int, cfg: GrAUCConfig) -> admm.Problem:
    """The fused-lasso split ``delta = Omega beta`` with per-edge level ``lam w_e``."""
    d = admm.incidence_matrix(graph.edges, n_sites)
    lam = cfg.lam * graph.weights(cfg.w_dist, cfg.q)
    grouping = "block" if cfg.penalty == "group" else "entry"
    return admm.Problem((admm.Split(d, Penalty("lasso"), lam, grouping),), n_sites)


def initial_beta(n_sites: int, p: int, cfg: GrAUCConfig) -> np.ndarray:
    """``beta_z^0 ~ N(0, I_p)`` per site with the seed (the paper), or zeros."""
    if cfg.init == "zeros":
        return np.zeros((n_sites, p))
    return np.random.default_rng(cfg.seed).standard_normal((n_sites, p))


class GrAUCStrategy(SiteStrategy):
    """GrAUC-PFL.

    ``algorithm = "admm"`` (the paper): ``aggregate_fit`` does the fused-lasso ``delta`` and
    dual updates, and computes each site's graph pull
    ``[Omega^T (gamma + rho (Omega beta - delta))]_z`` that ``configure_fit`` sends with its
    ``beta_z`` in its own ``FitIns``.

    ``algorithm = "pqn"`` (default): each site returns its loss and gradient at the point
    sent; ``aggregate_fit`` updates the sites' BFGS models, solves the fused-lasso model
    problem on the server (ADMM, no communication) and line-searches
    (:mod:`strategies.pqn`).
    """

    first_curvature = 0.25  # B_z before its first pair: a quarter of the Lipschitz bound

    def __init__(
        self,
        cfg: GrAUCConfig,
        n_sites: int,
        registry: Registry | None = None,
        graph_edges: np.ndarray | None = None,
        progress=None,
        checkpoint: str = "",
        checkpoint_every: int = 10,
        resume: str = "",
        beta0: np.ndarray | None = None,
    ) -> None:
        super().__init__(n_sites, registry, cfg.standardize, cfg.min_fit_fraction)
        self.cfg = cfg
        self.graph_edges = graph_edges
        self.progress = progress
        self.history = admm.History()
        self.checkpoint = checkpoint
        self.checkpoint_every = int(checkpoint_every)
        self.resume = resume
        self.beta0 = beta0  # a warm start (Z, p) on the working scale, in site order

    def _setup(self) -> None:
        cfg = self.cfg
        info = [self.registry.sites[s] for s in self.sites]
        lat = np.array([i.lat for i in info])
        lon = np.array([i.lon for i in info])
        from grauc_flower.graph import build_graph  # igraph/geopy only when needed

        self.graph = build_graph(lat, lon, cfg.graph, cfg.knn_k, self.graph_edges)
        self.problem = grauc_problem(self.graph, len(self.sites), cfg)
        self.sigma_max = self.problem.sigma_max()
        if self.beta0 is not None:
            beta0 = np.array(self.beta0, dtype=float).reshape(len(self.sites), self.n_features)
        else:
            beta0 = initial_beta(len(self.sites), self.n_features, cfg)
        self.state = admm.init_state(self.problem, beta0, cfg.rho, threshold=False)
        self.loss = np.full(len(self.sites), np.nan)
        self.qn = None
        if cfg.algorithm == "pqn" and len(self.graph.edges) > 0:
            self.qn = pqn.init_qn(beta0)
        if self.resume:
            self._load_checkpoint(self.resume)
        log(
            INFO,
            "GrAUC-PFL: %d sites, %d edges (%s), p = %d, sigma_max = %.4g",
            len(self.sites),
            len(self.graph.edges),
            cfg.graph,
            self.n_features,
            self.sigma_max,
        )

    def pull(self) -> np.ndarray:
        """``[Omega^T (gamma + rho (Omega beta - delta))]_z`` for every site, ``(Z, p)``."""
        st = self.state
        a_beta = self.problem.apply_all(st.beta)
        v = tuple(
            g + st.rho * (ab - d) for g, ab, d in zip(st.gamma, a_beta, st.delta, strict=True)
        )
        return self.problem.apply_t_sum(v)

    def _instructions(self, clients):
        if len(self.graph.edges) == 0:  # no edges: each site's model is its own fit
            common = {"task": "local", **self.registry.scaling_config()}
            return [
                (c, FitIns(EMPTY, {**common, "site": self.registry.cid_to_site[c.cid]}))
                for c in clients
            ]
        if self.qn is not None:
            return self._qn_instructions(clients)
        pull = self.pull()
        common = {
            "task": "admm",
            "local-solver": self.cfg.local_solver,
            "rho-sigma": float(self.state.rho * self.sigma_max),
            **self.registry.scaling_config(),
        }
        ins = []
        for proxy in clients:
            site = self.registry.cid_to_site[proxy.cid]
            z = self.site_index[site]
            params = ndarrays_to_parameters([self.state.beta[z], pull[z]])
            ins.append((proxy, FitIns(params, {**common, "site": site})))
        return ins

    def _qn_instructions(self, clients):
        common = {
            "task": "gradient",
            "curvature": not self.qn.evaluated,
            **self.registry.scaling_config(),
        }
        ins = []
        for proxy in clients:
            site = self.registry.cid_to_site[proxy.cid]
            z = self.site_index[site]
            params = ndarrays_to_parameters([self.qn.trial[z]])
            ins.append((proxy, FitIns(params, {**common, "site": site})))
        return ins

    def _qn_aggregate(self, answered):
        _, metrics = self._qn_round(answered)
        self.state = replace(self.state, beta=self.qn.x.copy(), round=self.qn.round)
        if self.checkpoint and (self.qn.round % self.checkpoint_every == 0 or self.done):
            self._save_checkpoint(self.checkpoint)
        return ndarrays_to_parameters([self.qn.x]), metrics

    def update_shape(self) -> tuple[int, ...] | None:
        """One ``p`` vector: coefficients (ADMM) or a gradient (pqn)."""
        return self.state.beta.shape[1:]

    @property
    def rounds(self) -> int:
        """Communication rounds of the fit so far (registration excluded)."""
        return self.qn.round if self.qn is not None else self.state.round

    def _aggregate(self, server_round, answered):
        if self.qn is not None:
            return self._qn_aggregate(answered)
        beta = self.state.beta.copy()
        for site, (_, res) in answered.items():
            z = self.site_index[site]
            beta[z] = self.updates[site]
            self.loss[z] = float(res.metrics["loss"])
        rho = self.state.rho
        if len(self.graph.edges) == 0:
            self.state = admm.AdmmState(
                beta, self.state.delta, self.state.gamma, rho, self.state.round + 1
            )
            res = admm.Residuals(0.0, 0.0, 0.0, 0.0)
            self.history.append(
                round=self.state.round,
                objective=float(np.sum(self.loss)),
                primal_residual=0.0,
                dual_residual=0.0,
                rho=rho,
                n_answered=len(answered),
            )
            self.done = self.converged = len(answered) == len(self.sites)
            return ndarrays_to_parameters([beta]), {}
        self.state, res = admm.server_update(
            self.problem, self.state, beta, self.cfg.tol, self.cfg.tol
        )
        objective = float(np.sum(self.loss) + self.problem.penalty_value(beta))
        self.history.append(
            round=self.state.round,
            objective=objective,
            primal_residual=res.primal,
            dual_residual=res.dual,
            rho=rho,
            n_answered=len(answered),
        )
        self.done = res.converged or self.state.round >= self.cfg.max_rounds
        self.converged = res.converged
        if self.checkpoint and (self.state.round % self.checkpoint_every == 0 or self.done):
            self._save_checkpoint(self.checkpoint)
        if self.progress is not None:
            self.progress(self.state.round, objective, res, time.perf_counter() - self._t0)
        metrics = {"objective": objective, "primal_residual": res.primal, "dual_residual": res.dual}
        return ndarrays_to_parameters([beta]), metrics

    def coefficients_std(self) -> np.ndarray:
        return self.qn.x if self.qn is not None else self.state.beta

    # -- checkpoints ---------------------------------------------------------------------
    def _save_checkpoint(self, path: str) -> None:
        """The whole server state (beta per site, delta, gamma, rho, round, the last loss per
        site, history, site order, scaling) in one ``.npz``, written atomically."""
        extra = {
            "loss": self.loss,
            "sites": np.array(self.sites),
            "history": np.array(json.dumps(self.history.rows)),
            "lam": np.array(self.cfg.lam),
        }
        if self.registry.center is not None:
            extra.update(center=self.registry.center, scale=self.registry.scale)
        if self.qn is not None:
            extra.update({f"qn_{k}": v for k, v in self.qn.arrays().items()})
        admm.save_state(path, self.state, **extra)
        log(INFO, "checkpoint: round %d written to %s", self.state.round, path)

    def _load_checkpoint(self, path: str) -> None:
        try:
            state, extra = admm.load_state(path)
        except (OSError, KeyError, ValueError) as exc:
            raise InputError(f"resume: cannot read checkpoint {path}: {exc}") from None
        sites = [str(s) for s in extra["sites"]]
        if sites != list(self.sites):
            raise InputError(
                f"resume: the checkpoint's sites {sites[:5]} are not this "
                f"federation's {list(self.sites)[:5]}"
            )
        if state.beta.shape != self.state.beta.shape:
            raise InputError(
                f"resume: coefficients of shape {state.beta.shape}, expected "
                f"{self.state.beta.shape}"
            )
        if (
            "center" in extra
            and self.registry.center is not None
            and not np.allclose(extra["center"], self.registry.center, rtol=0, atol=0)
        ):
            raise InputError("resume: the sites' data changed since the checkpoint")
        qn = {k[3:]: v for k, v in extra.items() if k.startswith("qn_")}
        if bool(qn) != (self.qn is not None):
            raise InputError(
                f"resume: the checkpoint was written by another algorithm than "
                f"{self.cfg.algorithm!r}"
            )
        if qn:
            self.qn = pqn.QuasiNewtonState.from_arrays(qn)
        self.state = state
        self.loss = np.asarray(extra["loss"], dtype=float)
        self.history.rows = json.loads(str(extra["history"]))
        log(INFO, "resumed from %s at round %d", path, state.round)

    def clusters(self) -> np.ndarray:
        """Fused groups per coordinate, ``(Z, p)`` labels, read off ``delta`` (for ``pqn``:
        the last model problem's ``delta``)."""
        if self.qn is not None and self.qn.inner is not None:
            return admm.fused_groups(self.graph.edges, self.qn.inner.delta[0], len(self.sites))
        return admm.fused_groups(self.graph.edges, self.state.delta[0], len(self.sites))


class IndividualStrategy(SiteStrategy):
    """Individual: each site fits alone (one round, no communication of coefficients in)."""

    needs_quorum = False

    def __init__(self, cfg: GrAUCConfig, n_sites: int, registry: Registry | None = None) -> None:
        super().__init__(n_sites, registry, cfg.standardize, cfg.min_fit_fraction)
        self.cfg = cfg

    def _setup(self) -> None:
        self.beta = np.full((len(self.sites), self.n_features), np.nan)
        self.loss = np.full(len(self.sites), np.nan)

    def _instructions(self, clients):
        common = {"task": "local", **self.registry.scaling_config()}
        return [
            (c, FitIns(EMPTY, {**common, "site": self.registry.cid_to_site[c.cid]}))
            for c in clients
        ]

    def update_shape(self) -> tuple[int, ...]:
        """One ``p`` vector: the site's own coefficients."""
        return (self.n_features,)

    def _aggregate(self, server_round, answered):
        for site, (_, res) in answered.items():
            z = self.site_index[site]
            self.beta[z] = self.updates[site]
            self.loss[z] = float(res.metrics["loss"])
        self.done = not np.isnan(self.beta).any()
        self.converged = self.done
        return EMPTY, {}

    def coefficients_std(self) -> np.ndarray:
        return self.beta


class FixedModelStrategy(SiteStrategy):
    """Evaluates one given coefficient vector at every site (the pooled reference)."""

    def __init__(
        self,
        beta: np.ndarray,
        n_sites: int,
        registry: Registry | None = None,
        standardize: str = "none",
    ) -> None:
        super().__init__(n_sites, registry, standardize)
        self.beta = np.asarray(beta, dtype=float)

    def _setup(self) -> None:
        self.done = True
        self.converged = True

    def configure_fit(self, server_round, parameters, client_manager):
        if self.ready:
            return []
        ins = super().configure_fit(server_round, parameters, client_manager)
        if self.ready:  # everyone registered: nothing to fit
            return []
        return ins

    def _instructions(self, clients):
        return []

    def _aggregate(self, server_round, answered):
        return EMPTY, {}

    def coefficients_std(self) -> np.ndarray:
        return np.tile(self.beta, (len(self.sites), 1))


def _mean_auc(metrics) -> dict:
    aucs = [m["auc"] for _, m in metrics if np.isfinite(m.get("auc", np.nan))]
    return {"mean_auc": float(np.mean(aucs))} if aucs else {}


class FinalEvalFedAvg(FedAvg):
    """Flower's own FedAvg; evaluates only after its last round (every site, its test AUC).

    The surrogate clients run local gradient steps (``task = fedavg``).  Results are keyed by
    the site id each client reports.
    """

    def __init__(
        self,
        cfg: GrAUCConfig,
        n_sites: int,
        registry: Registry | None = None,
        initial: np.ndarray | None = None,
        progress=None,
    ) -> None:
        self.cfg = cfg
        self.registry = registry if registry is not None else Registry()
        self.n_sites = n_sites
        self.evaluation: dict[str, dict] = {}
        self.history = admm.History()
        self.progress = progress
        self._t0 = time.perf_counter()
        self.beta: np.ndarray | None = None
        self.offset = 0  # registration rounds before FedAvg's own
        self.done = False
        self.converged = False

        def fit_config(server_round: int):
            return {
                "task": "fedavg",
                "fedavg-local-steps": cfg.fedavg_local_steps,
                "fedavg-lr": cfg.fedavg_lr,
                **self.registry.scaling_config(),
            }

        def eval_config(server_round: int):
            return {**self.registry.scaling_config()}

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
            fit_metrics_aggregation_fn=lambda metrics: {},
            evaluate_metrics_aggregation_fn=_mean_auc,
        )

    def configure_fit(self, server_round, parameters, client_manager):
        if self.cfg.standardize == "federated" and self.registry.center is None:
            # register first: the pooled means/SDs come from every site's sums
            client_manager.wait_for(self.n_sites, timeout=600)
            clients = [client_manager.all()[cid] for cid in sorted(client_manager.all())]
            todo = self.registry.registration_instructions(clients)
            if todo or len(self.registry.sites) < self.n_sites:
                return todo
            self.registry.standardize()
        return super().configure_fit(server_round - self.offset, parameters, client_manager)

    def aggregate_fit(self, server_round, results, failures):
        if results and results[0][1].metrics.get("task") == "register":
            self.registry.handle_registrations(results)
            self.registry.log_failures(failures, server_round)
            self.offset += 1
            return None, {}
        server_round -= self.offset
        losses = {str(r.metrics["site"]): float(r.metrics["loss"]) for _, r in results}
        n = {str(r.metrics["site"]): r.num_examples for _, r in results}
        total = sum(n.values())
        params, metrics = super().aggregate_fit(server_round, results, failures)
        if params is not None:
            self.beta = parameters_to_ndarrays(params)[0]
        # objective of the previous global beta: sum_z (N_z Z / N) f_z (what FedAvg minimizes)
        objective = float(sum(len(n) * n[s] / total * losses[s] for s in losses)) if total else 0
        self.history.append(
            round=server_round,
            objective=objective,
            primal_residual=np.nan,
            dual_residual=np.nan,
            rho=np.nan,
            n_answered=len(results),
        )
        if self.progress is not None:
            self.progress(server_round, objective, None, time.perf_counter() - self._t0)
        self.done = server_round >= self.cfg.fedavg_rounds
        self.converged = self.done
        return params, metrics

    def configure_evaluate(self, server_round, parameters, client_manager):
        if server_round - self.offset < self.cfg.fedavg_rounds:
            return []
        return super().configure_evaluate(server_round, parameters, client_manager)

    def aggregate_evaluate(self, server_round, results, failures):
        for _, res in results:
            self.evaluation[str(res.metrics["site"])] = dict(res.metrics)
        return super().aggregate_evaluate(server_round, results, failures)


__all__ = [
    "GrAUCStrategy",
    "IndividualStrategy",
    "FixedModelStrategy",
    "FinalEvalFedAvg",
    "grauc_problem",
    "initial_beta",
    "sp",
    "Parameters",
]
