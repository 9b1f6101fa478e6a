"""Flower's own FedAvg, made a comparator for the personalized methods.

:class:`RegisteringFedAvg` is :class:`flwr.server.strategy.FedAvg` plus what a comparison
needs and FedAvg lacks: registration of the sites (the properties exchange, before the
first round, with the pooled scaling when ``standardize = "federated"``), answers keyed by
site id, a history row per round with the objective FedAvg minimizes, progress reports, a
round limit after which the run stops, and evaluation once after the last round.  A method's
subclass supplies the local work's settings (:meth:`RegisteringFedAvg.local_config`) and
the objective (:meth:`RegisteringFedAvg.round_objective`).
"""

from __future__ import annotations

import time

import numpy as np
from flwr.common import (
    EvaluateIns,
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import (
    FedAdagrad,
    FedAdam,
    FedAvg,
    FedAvgM,
    FedMedian,
    FedOpt,
    FedProx,
    FedTrimmedAvg,
    FedYogi,
    Krum,
)

from ..config import FEDAVG_FAMILY, GLOBAL_METHODS, PERSONAL_METHODS
from ..solvers import admm
from .base import EvaluatedOnce
from .registry import Registry

#: Flower's class behind each global-model method name.
FLOWER_CLASSES = {
    "fedavg": FedAvg,
    "fedprox": FedProx,
    "fedavgm": FedAvgM,
    "fedadagrad": FedAdagrad,
    "fedadam": FedAdam,
    "fedyogi": FedYogi,
    "fedmedian": FedMedian,
    "fedtrimmedavg": FedTrimmedAvg,
    "krum": Krum,
}
assert tuple(FLOWER_CLASSES) == GLOBAL_METHODS


def flower_options(name: str, cfg) -> dict:
    """The keyword arguments of Flower's class for a method from the settings
    (docs/methods.md 3.7).

    Parameters
    ----------
    name : str
        The method (:data:`FLOWER_CLASSES`).
    cfg : ComparatorSettings
        The method's config (:class:`strategies.config.ComparatorSettings`).

    Returns
    -------
    dict
        The options of the method's Flower class (empty for one without options).
    """
    if name == "fedprox":
        return {"proximal_mu": float(cfg.fedprox_mu)}
    if name == "fedavgm":
        return {
            "server_learning_rate": float(cfg.fedavgm_lr),
            "server_momentum": float(cfg.fedavgm_momentum),
        }
    if name in ("fedadagrad", "fedadam", "fedyogi"):
        options = {"eta": float(cfg.fedopt_eta), "tau": float(cfg.fedopt_tau)}
        if name != "fedadagrad":
            options.update(beta_1=float(cfg.fedopt_beta_1), beta_2=float(cfg.fedopt_beta_2))
        return options
    if name == "fedtrimmedavg":
        return {"beta": float(cfg.fedtrimmedavg_beta)}
    if name == "krum":
        return {
            "num_malicious_clients": int(cfg.krum_malicious),
            "num_clients_to_keep": int(cfg.krum_keep),
        }
    return {}


def round_limit(method: str, cfg) -> int:
    """A method's own round limit (what a progress line counts against).

    Parameters
    ----------
    method : str
        The method's name.
    cfg : GrAUCConfig or RowFedConfig
        The run's config.

    Returns
    -------
    int
        ``fedavg-rounds`` for the FedAvg family (a personalized one adds its personalizing
        round), ``max-rounds`` for the others.
    """
    if method in FEDAVG_FAMILY:
        return cfg.fedavg_rounds + (method in PERSONAL_METHODS)
    return cfg.max_rounds


def _no_metrics(metrics) -> dict:
    return {}


class RegisteringFedAvg(EvaluatedOnce, FedAvg):
    """Flower's FedAvg over every site, ``cfg.fedavg_rounds`` rounds, evaluated once at the
    end.

    Parameters
    ----------
    cfg : GrAUCConfig or RowFedConfig
        Read: ``fedavg_rounds``, ``fedavg_local_steps``, ``fedavg_lr``, ``standardize``.
    n_sites : int
    registry : Registry, optional
        Shared between the methods of one run (registration happens once).
    initial : ndarray, optional
        The starting global model (by default FedAvg asks one client for its zeros).
    progress : callable, optional
        ``progress(round, objective, None, elapsed)``.
    timeout : float, optional
        How long registration waits for the sites (seconds; ``None``: no limit).
    """

    count_column = "n_answered"
    #: The name of the method (:data:`FLOWER_CLASSES`); each declared comparator sets its own.
    flower_name = "fedavg"

    def __init__(
        self,
        cfg,
        n_sites: int,
        registry: Registry | None = None,
        initial: np.ndarray | None = None,
        progress=None,
        timeout: float | None = None,
    ) -> None:
        self.cfg = cfg
        self.registry = registry if registry is not None else Registry()
        self.n_sites = int(n_sites)
        self.n_rounds = int(cfg.fedavg_rounds)
        self.standardize = cfg.standardize
        self.timeout = timeout
        self.evaluation: dict[str, dict] = {}
        self.history = admm.History()
        self.progress = progress
        self._t0 = time.perf_counter()
        self.global_model: np.ndarray | None = None
        self.rounds = 0
        self.done = False
        self.converged = False
        self.evaluated = False
        super().__init__(
            fraction_fit=1.0,
            fraction_evaluate=1.0,
            min_fit_clients=n_sites,
            min_evaluate_clients=n_sites,
            min_available_clients=n_sites,
            on_fit_config_fn=lambda rnd: {**self.local_config(), **self.work_config()},
            on_evaluate_config_fn=lambda rnd: self.evaluate_config(),
            # Flower's server-optimizer classes need a model at construction: a placeholder
            # until the first round's model is known (:meth:`_begin`)
            initial_parameters=ndarrays_to_parameters([] if initial is None else [initial]),
            accept_failures=True,
            fit_metrics_aggregation_fn=_no_metrics,
            evaluate_metrics_aggregation_fn=_no_metrics,
            **flower_options(self.flower_name, cfg),
        )
        self._given_initial = initial is not None
        self._begun = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rounds={self.n_rounds})"

    def _begin(self, parameters: Parameters) -> Parameters:
        """The first round's model (returned, to be sent) is the start of the server
        optimizers' state (FedAdam's and its kin's current weights, FedAvgM's previous
        model)."""
        if isinstance(self, FedOpt):
            self.current_weights = parameters_to_ndarrays(parameters)
        if isinstance(self, FedAvgM):
            self.initial_parameters = parameters
        self._begun = True
        return parameters

    def _combine(self, server_round: int, results, failures) -> Parameters | None:
        """The new model from the round's answers (sorted by site): Flower's step, told the
        number of this aggregation rather than Flower's round (a round nobody answered does
        not count: FedAvgM's momentum starts, and FedAdam's bias correction counts, at the
        first round that aggregates)."""
        params, _ = super().aggregate_fit(self.rounds + 1, results, failures)
        return params

    @property
    def sites(self) -> list[str]:
        return self.registry.order()

    # -- what a method supplies -------------------------------------------------------------
    def local_config(self) -> dict:
        """The sites' local work: ``fedavg-local-steps`` steps of size ``fedavg-lr`` from
        the global model (a method adds what its steps need)."""
        return {
            "task": "fedavg",
            "fedavg-local-steps": self.cfg.fedavg_local_steps,
            "fedavg-lr": self.cfg.fedavg_lr,
        }

    def work_config(self) -> dict:
        """The sites' working scale (and anything else every instruction carries)."""
        return self.registry.scaling_config()

    def round_objective(
        self, losses: dict[str, float], n: dict[str, int], previous: np.ndarray | None
    ) -> float:
        """The objective FedAvg minimizes, at the global model the sites received.

        Parameters
        ----------
        losses : dict of str to float
            Each answering site's ``loss`` metric, by site id.
        n : dict of str to int
            Each answering site's number of examples, by site id.
        previous : ndarray or None
            The global model the sites received (``None`` before the first aggregation).

        Returns
        -------
        float
        """
        raise NotImplementedError

    # -- Flower hooks -----------------------------------------------------------------------
    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        """Registration (the properties exchange), then FedAvg's own start."""
        self.registry.settle(client_manager, self.n_sites, self.timeout, 0)
        # every connected site takes part; a round never waits for a node that is gone
        self.min_fit_clients = self.min_evaluate_clients = self.min_available_clients = 1
        if self.standardize == "federated" and self.registry.scale is None:
            self.registry.standardize()
        if not self._given_initial:  # Flower asks one site for its (zero) model
            self.initial_parameters = None
        return super().initialize_parameters(client_manager)

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        if self.done:
            return []
        if not self._begun:
            parameters = self._begin(parameters)
        return super().configure_fit(server_round, parameters, client_manager)

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        self.registry.log_failures(failures, server_round)
        if not results:
            return None, {}
        # by site: the weighted average does not depend on the order the answers arrived in
        order = {s: k for k, s in enumerate(self.sites)}
        results = sorted(results, key=lambda r: order.get(str(r[1].metrics["site"]), -1))
        losses = {str(r.metrics["site"]): float(r.metrics["loss"]) for _, r in results}
        n = {str(r.metrics["site"]): r.num_examples for _, r in results}
        params = self._combine(server_round, results, failures)
        previous = self.global_model
        if params is not None:
            self.global_model = parameters_to_ndarrays(params)[0]
        self.rounds += 1
        objective = self.round_objective(losses, n, previous)
        self.history.append(
            round=self.rounds,
            objective=objective,
            primal_residual=np.nan,
            dual_residual=np.nan,
            rho=np.nan,
            **{self.count_column: len(results)},
        )
        if self.progress is not None:
            self.progress(self.rounds, objective, None, time.perf_counter() - self._t0)
        self.done = self.rounds >= self.n_rounds
        self.converged = self.done
        return params, {}

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        if not self.done or self.evaluated:
            return []
        return super().configure_evaluate(server_round, parameters, client_manager)

    def objective(self) -> float:
        """The objective at the last round (``nan`` before the first)."""
        return self.history.rows[-1]["objective"] if self.history.rows else float("nan")

    def coefficients_std(self) -> np.ndarray:
        """The global model, one copy per site (working scale)."""
        g = self.global_model
        return np.broadcast_to(g, (len(self.sites),) + g.shape).copy()

    def coefficients(self) -> np.ndarray:
        """The global model on the input scale, one copy per site."""
        beta = self.coefficients_std()
        if self.registry.scale is None:
            return beta
        return beta / self.registry.scale.reshape((-1,) + (1,) * (beta.ndim - 2))


class PersonalStage:
    """A personalizing round after FedAvg's: each site turns the global model ``w`` into its
    own (docs/methods.md 3.8), sent as ``task = personalize`` with ``how``:

    - ``ditto`` (Li et al. 2021): ``argmin_b f_z(b) + (mu/2) ||b - w||^2`` (with RowFed's
      sparsity penalty), solved by the site -- Ditto's personal objective at the global
      model, ``mu = ditto-mu``;
    - ``finetune``: ``ft-steps`` of FedAvg's local steps from ``w``;
    - ``choose`` (IFCA, :class:`ClusterStage`): of the ``k`` models, the one with the least
      loss on the site's data.

    Each site is then evaluated on its own model.  Mixed in before a method's FedAvg
    comparator by the declared classes (``COMPARATORS`` of ``strategies/server/grauc.py`` and
    ``strategies/server/rowfed.py``)."""

    personal = "ditto"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.personal_coef: dict[str, np.ndarray] = {}
        self.assignment: dict[str, int] = {}  # IFCA: each site's model
        self.global_done = False

    def personal_config(self) -> dict:
        """The personalizing round's instruction (besides the site and the scale)."""
        return {
            **self.local_config(),
            "task": "personalize",
            "how": self.personal,
            "ditto-mu": float(self.cfg.ditto_mu),
            "ft-steps": int(self.cfg.ft_steps),
        }

    def _per_site(self, client_manager: ClientManager, make) -> list:
        return [(p, make(s)) for p, s in self.registry.proxies(client_manager, set(self.sites))]

    def configure_fit(self, server_round, parameters, client_manager):
        """FedAvg's instructions until its rounds are over, then the personalizing round's:
        the global model to every site with :meth:`personal_config`.

        Parameters
        ----------
        server_round : int
            Flower's round.
        parameters : flwr.common.Parameters
            The current global model (FedAvg's rounds).
        client_manager : ClientManager
            Flower's client manager.

        Returns
        -------
        list of tuple
            ``(proxy, FitIns)`` per site; empty once the method is done.
        """
        if not self.global_done:
            return super().configure_fit(server_round, parameters, client_manager)
        if self.done:
            return []
        params = ndarrays_to_parameters([self.global_model])
        config = {**self.personal_config(), **self.work_config()}
        return self._per_site(client_manager, lambda s: FitIns(params, {**config, "site": s}))

    def aggregate_fit(self, server_round, results, failures):
        """FedAvg's aggregation until its rounds are over (one personalizing round follows);
        then each site's personal model (a malformed answer counts as none) and, for IFCA,
        its chosen ``cluster``, after which the method is done.

        Parameters
        ----------
        server_round : int
            Flower's round.
        results : list of tuple
            ``(proxy, FitRes)`` per answer.
        failures : list
            Flower's failures of the round (logged).

        Returns
        -------
        tuple
            FedAvg's ``(parameters, metrics)``; ``(None, {})`` after the personalizing round.
        """
        if not self.global_done:
            params, metrics = super().aggregate_fit(server_round, results, failures)
            if self.done:  # FedAvg's rounds are over: one personalizing round follows
                self.global_done, self.done, self.converged = True, False, False
            return params, metrics
        self.registry.log_failures(failures, server_round)
        shape = self.fallback(self.sites[0]).shape
        for _, res in results:
            site = str(res.metrics.get("site"))
            arrays = parameters_to_ndarrays(res.parameters)
            ok = len(arrays) == 1 and arrays[0].shape == shape and np.all(np.isfinite(arrays[0]))
            if site in self.sites and ok:  # a malformed answer counts as none
                self.personal_coef[site] = arrays[0]
                if "cluster" in res.metrics:
                    self.assignment[site] = int(res.metrics["cluster"])
        self.rounds += 1
        self.done = self.converged = True
        return None, {}

    def configure_evaluate(self, server_round, parameters, client_manager):
        """Once the method is done, each site's evaluation of its own model
        (:meth:`coefficients_std`).

        Parameters
        ----------
        server_round : int
            Flower's round.
        parameters : flwr.common.Parameters
            Flower's current parameters (not used: each site gets its own model).
        client_manager : ClientManager
            Flower's client manager.

        Returns
        -------
        list of tuple
            ``(proxy, EvaluateIns)`` per site; empty before the method is done or once
            evaluated.
        """
        if not self.done or self.evaluated:
            return []
        coef = self.coefficients_std()
        index = {s: k for k, s in enumerate(self.sites)}
        return self._per_site(
            client_manager,
            lambda s: EvaluateIns(
                ndarrays_to_parameters([coef[index[s]]]), {"site": s, **self.evaluate_config(s)}
            ),
        )

    def fallback(self, site: str) -> np.ndarray:
        """The model of a site that did not answer the personalizing round: the global one."""
        return self.global_model

    def coefficients_std(self) -> np.ndarray:
        """Each site's personal model (:meth:`fallback` for a site that did not answer)."""
        return np.stack([self.personal_coef.get(s, self.fallback(s)) for s in self.sites])


class ClusterStage:
    """IFCA (Ghosh et al. 2020): ``k = ifca-k`` models instead of one.  Every round each site
    receives all of them (one ``(k, ...)`` array, ``task = ifca``), takes the one with the
    least loss on its own data, runs FedAvg's local steps from it and answers the new model
    with the chosen index (``cluster``); the server averages the answers of each cluster
    (weighted by the sites' sizes) and a cluster no site chose keeps its model.  The first
    round is a FedAvg round from zero; the ``k`` starting models are the centres of a
    k-means of its answers (:func:`kmeans`, seeded by ``seed``).  After ``fedavg-rounds``
    rounds the personalizing round (``how = choose``) gives each site the model it fits
    best (docs/methods.md 3.9).  Mixed in before a method's FedAvg comparator, with
    :class:`PersonalStage`, in the declared IFCA classes (``COMPARATORS``)."""

    def local_config(self) -> dict:
        return {**super().local_config(), "task": "ifca" if self.rounds else "fedavg"}

    def _combine(self, server_round: int, results, failures) -> Parameters | None:
        if self.rounds == 0:  # the FedAvg round: k-means of its answers starts the k models
            answers = [parameters_to_ndarrays(r.parameters)[0] for _, r in results]
            rng = np.random.default_rng(int(self.cfg.seed))
            return ndarrays_to_parameters([kmeans(np.stack(answers), int(self.cfg.ifca_k), rng)])
        models = np.array(self.global_model, dtype=float)  # the k models this round sent
        k = models.shape[0]
        total = np.zeros(k)
        summed = np.zeros_like(models)
        for _, res in results:
            j = int(res.metrics.get("cluster", -1))
            arrays = parameters_to_ndarrays(res.parameters)
            if not 0 <= j < k or len(arrays) != 1 or arrays[0].shape != models.shape[1:]:
                continue  # a malformed answer counts as none
            self.assignment[str(res.metrics["site"])] = j
            summed[j] += res.num_examples * arrays[0]
            total[j] += res.num_examples
        chosen = total > 0
        models[chosen] = summed[chosen] / total[chosen].reshape((-1,) + (1,) * (models.ndim - 1))
        return ndarrays_to_parameters([models])

    def round_objective(self, losses, n, previous) -> float:
        """The sites' losses at the models they chose (RowFed: without the sparsity term).

        Parameters
        ----------
        losses : dict of str to float
            Each answering site's ``loss`` metric, by site id.
        n : dict of str to int
            Each answering site's number of examples, by site id.
        previous : ndarray or None
            Not used: passed on as ``None`` (the sites received ``k`` models, not one).

        Returns
        -------
        float
        """
        return super().round_objective(losses, n, None)

    def fallback(self, site: str) -> np.ndarray:
        """A site that did not answer the last round keeps the model it chose before."""
        return self.global_model[self.assignment.get(site, 0)]


def kmeans(points: np.ndarray, k: int, rng: np.random.Generator, iters: int = 100) -> np.ndarray:
    """k-means centres: k-means++ seeding (Arthur & Vassilvitskii 2007), then Lloyd's
    iterations until the assignment no longer changes.  With fewer distinct points than
    ``k`` a centre repeats.

    Parameters
    ----------
    points : ndarray
        The points along the first axis (any trailing shape).
    k : int
        The number of centres.
    rng : numpy.random.Generator
        Draws the seeding.
    iters : int, optional
        At most this many Lloyd iterations.

    Returns
    -------
    ndarray, shape (k, *points.shape[1:])
        The centres.
    """
    flat = points.reshape(points.shape[0], -1)
    centres = [flat[rng.integers(flat.shape[0])]]
    for _ in range(1, k):
        d2 = np.min([np.sum((flat - c) ** 2, axis=1) for c in centres], axis=0)
        total = d2.sum()
        pick = rng.choice(flat.shape[0], p=d2 / total) if total > 0 else rng.integers(len(flat))
        centres.append(flat[pick])
    centres = np.array(centres, dtype=float)
    labels = None
    for _ in range(iters):
        d2 = ((flat[:, None, :] - centres[None, :, :]) ** 2).sum(axis=2)
        new = np.argmin(d2, axis=1)
        if labels is not None and np.array_equal(new, labels):
            break
        labels = new
        for j in range(k):
            if np.any(labels == j):
                centres[j] = flat[labels == j].mean(axis=0)
    return centres.reshape((k, *points.shape[1:]))
