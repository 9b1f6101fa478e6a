"""Flower strategies for RowFed and its baselines.

They unpack, call the pure steps of :mod:`strategies.solvers.admm` / :mod:`strategies.solvers.pqn`
(through :class:`~strategies.server.fused.FusedSiteStrategy`) and pack.  All per-client state is
keyed by the site id each client reports at registration, never by node id.

- :class:`RowFedStrategy`: the start round, the paper's oracle initialization (each client
  returns its own ridge or NonFed fit: ``rowfed.init``; with pqn also its first answer
  there), then ADMM rounds with seeded partial participation, or pqn rounds.
  ``fusion_grouping="block"`` gives PerFL-LSMA.
- :class:`NonFedStrategy`: one round of local fits (same sparsity).
- :class:`RowFedAvg`: Flower's own FedAvg on one common ``Theta`` (clients take local
  proximal-gradient steps), evaluated only at the end.
"""

from __future__ import annotations

from logging import INFO

import numpy as np
from flwr.common import Parameters, log
from flwr.server.strategy import (
    FedAdagrad,
    FedAdam,
    FedAvgM,
    FedMedian,
    FedProx,
    FedTrimmedAvg,
    FedYogi,
    Krum,
)

from ..config import RegistrationConfig, RowFedConfig
from ..errors import InputError
from ..solvers import admm, pqn
from ..solvers.problems import (
    FUSION,
    SPARSITY,
    degrees_of_freedom,
    exact_row_clusters,
    fitted_structure,
    gic,
    rowfed_problem,
)
from ..wire import unpack
from .base import LocalOnlyStrategy
from .fedavg import ClusterStage, PersonalStage, RegisteringFedAvg
from .fused import FusedSettings, FusedSiteStrategy
from .registry import Registry


def rowfed_registry(waiting: RegistrationConfig | None = None) -> Registry:
    """The registry of a RowFed run: standardization divides by the pooled SD only (with
    an intercept each client centres its own data; without one a centring would add one)."""
    return Registry(centre=False, waiting=waiting or RegistrationConfig())


def dims(registry: Registry, sites: list[str]) -> tuple[int, int]:
    """The dimensions the clients share; :class:`InputError` when they disagree.

    Parameters
    ----------
    registry : Registry
        The run's registry (each client's ``p`` and ``q`` in its ``meta``).
    sites : list of str
        The clients' site ids.

    Returns
    -------
    p, q : int
    """
    pq = {(int(registry.sites[s].meta["p"]), int(registry.sites[s].meta["q"])) for s in sites}
    if len(pq) != 1:
        raise InputError(f"data: clients report different (p, q): {sorted(pq)}")
    return pq.pop()


def client_means(registry: Registry, sites: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Per-client training means of ``x`` and ``y``, input scale, from the registration sums.

    Parameters
    ----------
    registry : Registry
        The run's registry.
    sites : list of str
        The clients' site ids, in the rows' order.

    Returns
    -------
    x_mean : ndarray, shape (M, p)
    y_mean : ndarray, shape (M, q)
    """
    info = [registry.sites[s] for s in sites]
    return (
        np.stack([i.sum_x / i.n for i in info]),
        np.stack([unpack(i.meta["sum_y"]) / i.n for i in info]),
    )


class _RowFedOutputs:
    """What every RowFed comparator reports: coefficients on the input scale, intercepts,
    the row structure and the objective (``coefficients_std()`` is ``(M, p, q)``)."""

    eval_metric = "mse_pred"

    def evaluate_config(self, site: str | None = None) -> dict:
        """The working scale; with ``inference = oracle`` also ask each client for its
        sufficient statistics (:func:`rowfed_flower.inference.client_moments`)."""
        config = self.work_config()
        if self.cfg.inference == "oracle":
            config["moments"] = True
        return config

    def intercepts(self) -> np.ndarray | None:
        """``b_m = ybar_m - xbar_m^T Theta_m`` (input scale) ``(M, q)``, or ``None``."""
        if not self.cfg.intercept:
            return None
        x_mean, y_mean = client_means(self.registry, self.sites)
        return y_mean - np.einsum("mp,mpq->mq", x_mean, self.coefficients())

    def structure(self) -> tuple[np.ndarray, np.ndarray]:
        """Row clusters ``(M, p)`` and support ``(M, p, q)`` of the fit."""
        theta = self.coefficients_std()
        return exact_row_clusters(theta), theta != 0.0

    def clusters(self) -> np.ndarray:
        return self.structure()[0]

    def rss(self) -> float:
        """``sum_m ||Y_m - X_m Theta_m||_F^2`` from the clients' evaluation answers."""
        if any(s not in self.evaluation for s in self.sites):
            return float("nan")
        # summed in federation order: the same number whichever order the answers came in
        return float(sum(self.evaluation[s]["rss"] for s in self.sites))

    def gic(self, per: str = "n") -> float:
        """GIC of the fit from the uploaded RSS (:func:`strategies.solvers.problems.gic`, its df
        term over ``N`` or, ``per = "nq"``, over ``N q``); ``nan`` before evaluation."""
        rss = self.rss()
        if not np.isfinite(rss):
            return float("nan")
        labels, support = self.structure()
        n_total = sum(self.registry.sites[s].n for s in self.sites)
        m, p, q = self.coefficients_std().shape
        return gic(rss, n_total, p, q, m, degrees_of_freedom(labels, support), per)


def _local_config(cfg: RowFedConfig, init: str) -> dict:
    """A client's own fit: the oracle start (``init = ridge``) or NonFed (``nonfed``)."""
    return {
        "task": "local",
        "init": init,
        "penalty": cfg.penalty,
        "concavity": float(cfg.concavity),
        "lam2": float(cfg.lam2),
        "sparsity": cfg.sparsity,
    }


class RowFedStrategy(_RowFedOutputs, FusedSiteStrategy):
    """RowFed: linearized ADMM with seeded partial participation, or pqn.

    Rounds: the start round (``rowfed.init``: each client returns its ridge or NonFed fit,
    the paper's oracle initialization; skipped when ``theta0`` is given, e.g. a warm start),
    then the method's rounds (:class:`~strategies.server.fused.FusedSiteStrategy`).  Failures are
    non-participants.

    Parameters
    ----------
    cfg : RowFedConfig
    n_sites : int
    registry : Registry, optional
        Shared between methods of one run (registration happens once).
    fusion_grouping : {"row", "block"}
        Row-wise fusion (RowFed) or matrix-wise fusion (PerFL-LSMA).
    theta0 : ndarray, shape (M, p, q), optional
        Working-scale start in federation order (no initialization round).
    progress : callable, optional
        ``progress(round, objective, residuals, elapsed)``.
    graph_builder : callable, optional
        ``graph_builder(sites) -> (edges, weights)`` for ``cfg.graph`` other than
        ``all-pairs`` (:func:`rowfed_flower.graph.build_graph`).
    timeout : float, optional
    """

    count_column = "n_participants"
    first_curvature = 1.0  # L_m = lambda_max(X_m^T X_m / n_m): B_z >= the exact Hessian
    qn_model = "secant"  # the least-squares loss is quadratic: the model becomes X^T X / n
    start_pair = True  # ... learned from the gradient at zero at once (FusedSiteStrategy)
    threshold_start = True  # each round starts with the thresholds (round 0's half-step)

    def __init__(
        self,
        cfg: RowFedConfig,
        n_sites: int,
        registry: Registry | None = None,
        fusion_grouping: str = "row",
        theta0: np.ndarray | None = None,
        progress=None,
        graph_builder=None,
        timeout: float | None = None,
        fusion: str = "graph",
    ) -> None:
        super().__init__(
            n_sites,
            registry if registry is not None else rowfed_registry(),
            standardize=cfg.standardize,
            min_fit_fraction=0.0,  # failures are non-participants
            timeout=timeout,
            settings=FusedSettings.of(cfg, algorithm=cfg.resolved_algorithm),
            progress=progress,
        )
        self.cfg = cfg
        self.fusion_grouping = fusion_grouping
        self.fusion = fusion  # "mean": the mean-fusion comparator, rows toward the mean
        self.theta0 = None if theta0 is None else np.array(theta0, dtype=float)
        self.graph_builder = graph_builder

    def work_config(self) -> dict:
        return {"intercept": bool(self.cfg.intercept), **super().work_config()}

    def start_config(self) -> dict:
        return _local_config(self.cfg, self.cfg.init)

    def _become_ready(self) -> None:
        self.n_responses = dims(self.registry, self.registry.order())[1]
        super()._become_ready()

    def _setup(self) -> None:
        cfg = self.cfg
        m = len(self.sites)
        if cfg.graph == "all-pairs" or self.fusion == "mean":
            self.edges, self.weights = None, None
        elif self.graph_builder is None:
            raise ValueError(f"graph_builder: needed for graph {cfg.graph!r}")
        else:
            self.edges, self.weights = self.graph_builder(self.sites)
        self._set_problem(
            rowfed_problem(cfg, m, self.edges, self.weights, self.fusion_grouping, self.fusion)
        )
        shape = (m, self.n_features, self.n_responses)
        if self.theta0 is not None:
            if self.theta0.shape != shape:
                raise InputError(f"theta0: need shape {shape}, got {self.theta0.shape}")
            self._start(self.theta0)
        else:
            self._start_round(shape[1:])
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

    def coefficients_std(self) -> np.ndarray:
        """``Theta`` with the exact zeros of the sparsity split's ``eta``: entries (or rows)
        that ``eta`` sets to zero are zero; they differ from ``Theta`` by at most the primal
        residual.  Fused rows are read from ``delta`` (:meth:`clusters`)."""
        if self.phase == "start":
            return self.start_fits
        if self.qn is not None:  # pqn: the zeros of the last model problem's eta
            theta = pqn.estimate(self.qn)
            if self.qn.inner is None:
                return theta
            return np.where(self.qn.inner.delta[SPARSITY] == 0.0, 0.0, theta)
        eta = self.state.delta[SPARSITY]
        return np.where(eta == 0.0, 0.0, self.state.beta)

    def warm_start(self) -> np.ndarray:
        """The working-scale coefficients to start a neighbouring fit from."""
        return self.start_fits if self.phase == "start" else np.array(self.state.beta)

    def structure(self) -> tuple[np.ndarray, np.ndarray]:
        """Clusters from the fusion ``delta``, support from the sparsity ``eta``."""
        if self.phase == "start":
            return super().structure()
        if self.qn is not None:
            if self.qn.inner is None:
                return super().structure()
            inner = self.qn.inner
            state = admm.AdmmState(
                pqn.estimate(self.qn), inner.delta, inner.u, inner.rho, self.qn.round
            )
            return fitted_structure(self.problem, state)
        return fitted_structure(self.problem, self.state)


class NonFedStrategy(_RowFedOutputs, LocalOnlyStrategy):
    """NonFed: every client fits alone with the same sparsity penalty (one round)."""

    def __init__(
        self,
        cfg: RowFedConfig,
        n_sites: int,
        registry: Registry | None = None,
        timeout: float | None = None,
    ) -> None:
        super().__init__(
            n_sites,
            registry if registry is not None else rowfed_registry(),
            cfg.standardize,
            min_fit_fraction=0.0,
            timeout=timeout,
        )
        self.cfg = cfg
        self.history = admm.History()

    def work_config(self) -> dict:
        return {"intercept": bool(self.cfg.intercept), **self.registry.scaling_config()}

    def local_config(self) -> dict:
        return _local_config(self.cfg, "nonfed")

    def update_shape(self) -> tuple[int, ...]:
        return (self.n_features, dims(self.registry, self.sites)[1])

    def _aggregate(self, server_round: int, answered: dict) -> tuple[Parameters, dict]:
        out = super()._aggregate(server_round, answered)
        if self.done:
            penalty = rowfed_problem(self.cfg, len(self.sites)).splits[SPARSITY]
            self.history.append(
                round=1,
                objective=float(np.sum(self.loss) + penalty.value(self.coef)),
                primal_residual=np.nan,
                dual_residual=np.nan,
                rho=np.nan,
                n_participants=len(answered),
            )
        return out

    @property
    def rounds(self) -> int:
        return 1

    def warm_start(self) -> np.ndarray:
        return self.coef

    def objective(self) -> float:
        return self.history.rows[-1]["objective"] if self.history.rows else float("nan")


class RowFedAvg(_RowFedOutputs, RegisteringFedAvg):
    """Flower's own FedAvg on one common ``Theta`` with the sparsity penalty: clients take
    ``fedavg-local-steps`` proximal-gradient steps (``task = fedavg``); the server averages
    weighted by ``n_m`` (Flower's ``aggregate``)."""

    count_column = "n_participants"

    def __init__(
        self,
        cfg: RowFedConfig,
        n_sites: int,
        registry: Registry | None = None,
        initial: np.ndarray | None = None,
        progress=None,
        timeout: float | None = None,
    ) -> None:
        self.sparsity = rowfed_problem(cfg, 1).splits[SPARSITY]
        registry = registry if registry is not None else rowfed_registry()
        super().__init__(cfg, n_sites, registry, initial, progress, timeout)

    def local_config(self) -> dict:
        cfg = self.cfg
        return {
            **super().local_config(),
            "penalty": cfg.penalty,
            "concavity": float(cfg.concavity),
            "lam2": float(cfg.lam2),
            "sparsity": cfg.sparsity,
        }

    def work_config(self) -> dict:
        return {"intercept": bool(self.cfg.intercept), **self.registry.scaling_config()}

    def round_objective(self, losses, n, previous) -> float:
        """The objective restricted to a common ``Theta`` (fusion = 0), at the ``Theta`` the
        clients received; ``nan`` when a client did not answer."""
        if len(losses) != self.n_sites:
            return float("nan")
        start = previous if previous is not None else np.zeros_like(self.global_model)
        return float(sum(losses.values()) + self.n_sites * self.sparsity.value(start[None]))

    def warm_start(self) -> np.ndarray:
        return self.coefficients_std()

    def gic(self, per: str = "n") -> float:
        return float("nan")


# -- RowFed's FedAvg-family comparators (fit --method; docs/methods.md 3.7-3.9): Flower's
# own server step behind the comparator's registration, history and evaluation --------


class RowFedProx(RowFedAvg, FedProx):
    """Flower's ``FedProx`` on RowFed's model (``method = fedprox``)."""

    flower_name = "fedprox"


class RowFedAvgM(RowFedAvg, FedAvgM):
    """Flower's ``FedAvgM`` on RowFed's model (``method = fedavgm``)."""

    flower_name = "fedavgm"


class RowFedAdagrad(RowFedAvg, FedAdagrad):
    """Flower's ``FedAdagrad`` on RowFed's model (``method = fedadagrad``)."""

    flower_name = "fedadagrad"


class RowFedAdam(RowFedAvg, FedAdam):
    """Flower's ``FedAdam`` on RowFed's model (``method = fedadam``)."""

    flower_name = "fedadam"


class RowFedYogi(RowFedAvg, FedYogi):
    """Flower's ``FedYogi`` on RowFed's model (``method = fedyogi``)."""

    flower_name = "fedyogi"


class RowFedMedian(RowFedAvg, FedMedian):
    """Flower's ``FedMedian`` on RowFed's model (``method = fedmedian``)."""

    flower_name = "fedmedian"


class RowFedTrimmedAvg(RowFedAvg, FedTrimmedAvg):
    """Flower's ``FedTrimmedAvg`` on RowFed's model (``method = fedtrimmedavg``)."""

    flower_name = "fedtrimmedavg"


class RowFedKrum(RowFedAvg, Krum):
    """Flower's ``Krum`` on RowFed's model (``method = krum``)."""

    flower_name = "krum"


class RowFedDitto(PersonalStage, RowFedAvg):
    """Ditto: a personal model pulled toward the global one (``method = ditto``)."""

    personal = "ditto"


class RowFedAvgFT(PersonalStage, RowFedAvg):
    """FedAvg, then each site fine-tunes the global model (``method = fedavg-ft``)."""

    personal = "finetune"


class RowFedIFCA(ClusterStage, PersonalStage, RowFedAvg):
    """IFCA: k global models, each site its best (``method = ifca``)."""

    personal = "choose"


#: RowFed's FedAvg-family comparators by method name (``fit --method``).
COMPARATORS = {
    "fedavg": RowFedAvg,
    "fedprox": RowFedProx,
    "fedavgm": RowFedAvgM,
    "fedadagrad": RowFedAdagrad,
    "fedadam": RowFedAdam,
    "fedyogi": RowFedYogi,
    "fedmedian": RowFedMedian,
    "fedtrimmedavg": RowFedTrimmedAvg,
    "krum": RowFedKrum,
    "ditto": RowFedDitto,
    "fedavg-ft": RowFedAvgFT,
    "ifca": RowFedIFCA,
}


__all__ = [
    "COMPARATORS",
    "RowFedProx",
    "RowFedAvgM",
    "RowFedAdagrad",
    "RowFedAdam",
    "RowFedYogi",
    "RowFedMedian",
    "RowFedTrimmedAvg",
    "RowFedKrum",
    "RowFedDitto",
    "RowFedAvgFT",
    "RowFedIFCA",
    "NonFedStrategy",
    "RowFedAvg",
    "RowFedStrategy",
    "client_means",
    "dims",
    "rowfed_registry",
]
