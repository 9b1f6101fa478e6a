"""Flower strategies for GrAUC-PFL and its baselines.  They unpack, call the pure steps of
:mod:`strategies.solvers.admm` / :mod:`strategies.solvers.pqn` (through
:class:`~strategies.server.fused.FusedSiteStrategy`) and pack; all per-site state is keyed by site
id.  The geographic graph is handed in (``graph_builder``), not imported."""

from __future__ import annotations

from logging import INFO, WARNING

import numpy as np
from flwr.common import FitIns, Parameters, log
from flwr.server.client_proxy import ClientProxy
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

from .. import wire
from ..config import GrAUCConfig
from ..solvers import admm
from ..solvers.local import newton_shape, split_newton
from ..solvers.problems import grauc_problem
from ..stats import inference
from ..wire import pack
from .base import LocalOnlyStrategy, SiteStrategy
from .fedavg import ClusterStage, PersonalStage, RegisteringFedAvg
from .fused import FusedSettings, FusedSiteStrategy
from .registry import EMPTY, Registry


def initial_beta(n_sites: int, p: int, cfg: GrAUCConfig) -> np.ndarray:
    """The starting coefficients of a GrAUC-PFL fit.

    Parameters
    ----------
    n_sites : int
        The sites ``Z``.
    p : int
        The features.
    cfg : GrAUCConfig
        Read: ``init`` and ``seed``.

    Returns
    -------
    ndarray, shape (Z, p)
        ``beta_z^0 ~ N(0, I_p)`` per site with the seed (``init = random``, the paper), or
        zeros (``zeros``, and ``local`` where there is no start round: a resumed fit, which
        reads its state from the checkpoint, or a fit without edges, which is each site's
        own fit).
    """
    if cfg.init == "random":
        return np.random.default_rng(cfg.seed).standard_normal((n_sites, p))
    return np.zeros((n_sites, p))


def _local_instructions(registry: Registry, clients, config: dict):
    """Each site's own fit (``task = local``)."""
    common = {"task": "local", **config}
    return [(c, FitIns(EMPTY, {**common, "site": registry.cid_to_site[c.cid]})) for c in clients]


class GrAUCStrategy(FusedSiteStrategy):
    """GrAUC-PFL: the fused-lasso penalty over the edges of the geographic graph.

    ``algorithm = "admm"`` (the paper): ``aggregate_fit`` does the fused-lasso ``delta``
    and dual updates; ``configure_fit`` sends each site its ``[beta_z, pull_z]``.
    ``algorithm = "pqn"`` (default): each site returns its loss and gradient at the point
    sent; the server solves the fused model problem (:mod:`strategies.solvers.pqn`).

    Parameters
    ----------
    cfg : GrAUCConfig
    n_sites : int
    registry : Registry, optional
    graph_edges : ndarray, shape (n_edges, 2), optional
        A user edge list (site indices) instead of ``cfg.graph``.
    progress : callable, optional
    checkpoint, checkpoint_every, resume : see :class:`~strategies.server.fused.FusedSiteStrategy`
    beta0 : ndarray, shape (Z, p), optional
        A warm start on the working scale, in site order.
    graph_builder : callable
        ``graph_builder(lat, lon, kind, k, edges) -> graph`` with ``graph.edges`` and
        ``graph.weights(w_dist, q)`` (:func:`grauc_flower.graph.build_graph`).
    timeout : float, optional
        Seconds registration and each round wait for the sites.
    """

    first_curvature = 0.25  # B_z before its first pair: a quarter of the Lipschitz bound
    first_damping = 1.0  # exact curvature: the first Newton model damped by its mean curvature

    def start_config(self) -> dict:
        """``init = local``: each site's own fit with its ridge floored
        (:func:`grauc_flower.datafit.start_fit`)."""
        return {"task": "local", "start": True}

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
        graph_builder=None,
        timeout: float | None = None,
        fusion: str = "graph",
    ) -> None:
        super().__init__(
            n_sites,
            registry,
            standardize=cfg.standardize,
            min_fit_fraction=cfg.min_fit_fraction,
            timeout=timeout,
            settings=FusedSettings.of(cfg),
            progress=progress,
            checkpoint=checkpoint,
            checkpoint_every=checkpoint_every,
            resume=resume,
        )
        if graph_builder is None:
            raise ValueError("graph_builder: GrAUC-PFL needs the function that builds its graph")
        self.cfg = cfg
        self.fusion = fusion  # "graph" (GrAUC-PFL), or "mean" (the mean-fusion comparator)
        self.graph_edges = graph_edges
        self.graph_builder = graph_builder
        self.beta0 = beta0
        self.refit: inference.NewtonRefit | None = None

    def _setup(self) -> None:
        cfg = self.cfg
        meta = [self.registry.sites[s].meta for s in self.sites]
        lat = np.array([float(m["lat"]) for m in meta])
        lon = np.array([float(m["lon"]) for m in meta])
        self.graph = self.graph_builder(lat, lon, cfg.graph, cfg.knn_k, self.graph_edges)
        self._set_problem(grauc_problem(self.graph, len(self.sites), cfg, self.fusion))
        self.fusing = self.problem.splits[0].matrix.shape[0] > 0 and len(self.sites) > 1
        shape = (len(self.sites), self.n_features)
        if self.beta0 is not None:
            self._start(np.array(self.beta0, dtype=float).reshape(shape))
        elif cfg.init == "local" and self.fusing and not self.resume:
            self._start_round(shape[1:])
        else:
            self._start(initial_beta(*shape, cfg))
        log(
            INFO,
            "GrAUC-PFL: %d sites, %s, p = %d, sigma_max = %.4g",
            len(self.sites),
            f"{len(self.graph.edges)} edges ({cfg.graph})"
            if self.fusion == "graph"
            else "fusion toward the mean",
            self.n_features,
            self.sigma_max,
        )

    def _instructions(self, clients: list[ClientProxy]) -> list[tuple[ClientProxy, FitIns]]:
        if self.refit is not None:
            point = self.refit.point()
            common = {"task": "newton", **self.work_config()}
            ins = []
            for c in clients:
                site = self.registry.cid_to_site[c.cid]
                params = wire.to_parameters([point[self.site_index[site]]])
                ins.append((c, FitIns(params, {**common, "site": site})))
            return ins
        if not self.fusing:  # no edges: each site's model is its own fit
            return _local_instructions(self.registry, clients, self.work_config())
        return super()._instructions(clients)

    def _aggregate(self, server_round: int, answered: dict) -> tuple[Parameters, dict]:
        if self.refit is not None:
            return EMPTY, self._refit_round(server_round, answered)
        out = self._fit_round(server_round, answered)
        if self.done and self.cfg.inference == "oracle":
            self._start_refit()
        return out

    def _fit_round(self, server_round: int, answered: dict) -> tuple[Parameters, dict]:
        if self.fusing:
            return super()._aggregate(server_round, answered)
        beta = self.state.beta.copy()
        for site, (_, res) in answered.items():
            z = self.site_index[site]
            beta[z] = self.updates[site]
            self.loss[z] = float(res.metrics["loss"])
        self.state = admm.AdmmState(
            beta, self.state.delta, self.state.gamma, self.state.rho, self.state.round + 1
        )
        self.history.append(
            round=self.state.round,
            objective=float(np.sum(self.loss)),
            primal_residual=0.0,
            dual_residual=0.0,
            rho=self.state.rho,
            n_answered=len(answered),
        )
        self.done = self.converged = len(answered) == len(self.sites)
        return EMPTY, {}

    # -- oracle inference (docs/methods.md 1.10) -------------------------------------------
    def _start_refit(self) -> None:
        """After the fit: the Newton refit on its fused groups (:mod:`strategies.stats.inference`).
        A group whose sites all lack a class has no data: its coefficients stay as fitted."""
        meta = [self.registry.sites[s].meta for s in self.sites]
        has_data = np.array([int(m["n_pos"]) > 0 and int(m["n_neg"]) > 0 for m in meta])
        support = np.repeat(has_data[:, None], self.n_features, axis=1)
        self.refit_labels = self.clusters()
        self.refit = inference.start_refit(self.refit_labels, self.coefficients_std(), support)
        self.done = self.refit.done
        log(INFO, "oracle refit: %d parameters on the fused groups", self.refit.n_par)

    def _refit_round(self, server_round: int, answered: dict) -> dict:
        """One Newton round of the refit; a round without every site is asked again."""
        refit = self.refit
        if len(answered) < len(self.sites):
            refit.rounds += 1
            log(WARNING, "oracle refit: round %s lacks sites; asked again", server_round)
        else:
            answers = np.stack([self.updates[s] for s in self.sites])
            loss = np.array([float(answered[s][1].metrics["loss"]) for s in self.sites])
            inference.newton_round(refit, loss, *split_newton(answers, (self.n_features,)))
            log(
                INFO,
                "oracle refit: round %d, objective %.10g, step %g",
                refit.rounds,
                refit.value,
                refit.step,
            )
        if not refit.done and refit.rounds >= inference.REFIT_ROUNDS:
            refit.done = True
            log(WARNING, "oracle refit: no convergence in %d rounds", refit.rounds)
        self.done = refit.done
        return {"refit_objective": float(refit.value)}

    def evaluate_config(self, site: str | None = None) -> dict:
        """With inference = oracle: each site's refitted coefficients, at which it adds the
        covariance of its gradient (the sandwich's meat)."""
        config = super().evaluate_config(site)
        if self.refit is not None and self.refit.converged and site is not None:
            config["sandwich-at"] = pack(self.refit.estimate()[self.site_index[site]])
        return config

    def update_shape(self) -> tuple[int, ...] | None:
        """A Newton answer during the refit: ``[gradient | Hessian]``, ``(p, 1 + p)``."""
        if self.refit is not None:
            return newton_shape((self.n_features,))
        return super().update_shape()

    def clusters(self) -> np.ndarray:
        """Fused groups per coordinate, ``(Z, p)`` labels, read off ``delta`` (for ``pqn``:
        the last model problem's ``delta``)."""
        delta = self.state.delta[0]
        if self.qn is not None and self.qn.inner is not None:
            delta = self.qn.inner.delta[0]
        return admm.split_groups(self.problem.splits[0], delta, len(self.sites))


class IndividualStrategy(LocalOnlyStrategy):
    """Individual: each site fits alone (one round, no communication of coefficients in)."""

    def __init__(
        self,
        cfg: GrAUCConfig,
        n_sites: int,
        registry: Registry | None = None,
        timeout: float | None = None,
    ) -> None:
        super().__init__(n_sites, registry, cfg.standardize, cfg.min_fit_fraction, timeout)
        self.cfg = cfg

    def local_config(self) -> dict:
        return {"task": "local"}

    def update_shape(self) -> tuple[int, ...]:
        """One ``p`` vector: the site's own coefficients."""
        return (self.n_features,)


class FixedModelStrategy(SiteStrategy):
    """Evaluates one given coefficient vector at every site (the pooled reference)."""

    def __init__(
        self,
        beta: np.ndarray,
        n_sites: int,
        registry: Registry | None = None,
        standardize: str = "none",
        timeout: float | None = None,
    ) -> None:
        super().__init__(n_sites, registry, standardize, timeout=timeout)
        self.beta = np.asarray(beta, dtype=float)

    def _setup(self) -> None:
        self.done = True
        self.converged = True

    def _instructions(self, clients: list[ClientProxy]) -> list[tuple[ClientProxy, FitIns]]:
        return []

    def _aggregate(self, server_round: int, answered: dict) -> tuple[Parameters, dict]:
        return EMPTY, {}

    def coefficients_std(self) -> np.ndarray:
        return np.tile(self.beta, (len(self.sites), 1))


class GrAUCFedAvg(RegisteringFedAvg):
    """Flower's own FedAvg on the AUC surrogate: each site takes ``fedavg-local-steps``
    gradient steps from the global ``beta`` (``task = fedavg``)."""

    eval_metric = "auc"

    def round_objective(self, losses, n, previous) -> float:
        """``sum_z (N_z Z / N) f_z`` at the previous global ``beta`` (what FedAvg minimizes)."""
        total = sum(n.values())
        return float(sum(len(n) * n[s] / total * losses[s] for s in losses)) if total else 0.0


# -- GrAUC-PFL's FedAvg-family comparators (fit --method; docs/methods.md 3.7-3.9): Flower's
# own server step behind the comparator's registration, history and evaluation --------


class GrAUCFedProx(GrAUCFedAvg, FedProx):
    """Flower's ``FedProx`` on GrAUC-PFL's model (``method = fedprox``)."""

    flower_name = "fedprox"


class GrAUCFedAvgM(GrAUCFedAvg, FedAvgM):
    """Flower's ``FedAvgM`` on GrAUC-PFL's model (``method = fedavgm``)."""

    flower_name = "fedavgm"


class GrAUCFedAdagrad(GrAUCFedAvg, FedAdagrad):
    """Flower's ``FedAdagrad`` on GrAUC-PFL's model (``method = fedadagrad``)."""

    flower_name = "fedadagrad"


class GrAUCFedAdam(GrAUCFedAvg, FedAdam):
    """Flower's ``FedAdam`` on GrAUC-PFL's model (``method = fedadam``)."""

    flower_name = "fedadam"


class GrAUCFedYogi(GrAUCFedAvg, FedYogi):
    """Flower's ``FedYogi`` on GrAUC-PFL's model (``method = fedyogi``)."""

    flower_name = "fedyogi"


class GrAUCFedMedian(GrAUCFedAvg, FedMedian):
    """Flower's ``FedMedian`` on GrAUC-PFL's model (``method = fedmedian``)."""

    flower_name = "fedmedian"


class GrAUCFedTrimmedAvg(GrAUCFedAvg, FedTrimmedAvg):
    """Flower's ``FedTrimmedAvg`` on GrAUC-PFL's model (``method = fedtrimmedavg``)."""

    flower_name = "fedtrimmedavg"


class GrAUCKrum(GrAUCFedAvg, Krum):
    """Flower's ``Krum`` on GrAUC-PFL's model (``method = krum``)."""

    flower_name = "krum"


class GrAUCDitto(PersonalStage, GrAUCFedAvg):
    """Ditto: a personal model pulled toward the global one (``method = ditto``)."""

    personal = "ditto"


class GrAUCFedAvgFT(PersonalStage, GrAUCFedAvg):
    """FedAvg, then each site fine-tunes the global model (``method = fedavg-ft``)."""

    personal = "finetune"


class GrAUCIFCA(ClusterStage, PersonalStage, GrAUCFedAvg):
    """IFCA: k global models, each site its best (``method = ifca``)."""

    personal = "choose"


#: GrAUC-PFL's FedAvg-family comparators by method name (``fit --method``).
COMPARATORS = {
    "fedavg": GrAUCFedAvg,
    "fedprox": GrAUCFedProx,
    "fedavgm": GrAUCFedAvgM,
    "fedadagrad": GrAUCFedAdagrad,
    "fedadam": GrAUCFedAdam,
    "fedyogi": GrAUCFedYogi,
    "fedmedian": GrAUCFedMedian,
    "fedtrimmedavg": GrAUCFedTrimmedAvg,
    "krum": GrAUCKrum,
    "ditto": GrAUCDitto,
    "fedavg-ft": GrAUCFedAvgFT,
    "ifca": GrAUCIFCA,
}


__all__ = [
    "COMPARATORS",
    "GrAUCFedProx",
    "GrAUCFedAvgM",
    "GrAUCFedAdagrad",
    "GrAUCFedAdam",
    "GrAUCFedYogi",
    "GrAUCFedMedian",
    "GrAUCFedTrimmedAvg",
    "GrAUCKrum",
    "GrAUCDitto",
    "GrAUCFedAvgFT",
    "GrAUCIFCA",
    "FixedModelStrategy",
    "GrAUCFedAvg",
    "GrAUCStrategy",
    "IndividualStrategy",
    "initial_beta",
]
