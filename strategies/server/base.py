"""The base of the per-site strategies: registration, answers keyed by site id, evaluation
once at the end."""

from __future__ import annotations

import time
from logging import WARNING

import numpy as np
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    log,
)
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy
from flwr.server.strategy.aggregate import weighted_loss_avg

from .. import wire
from ..client.guards import refuse_moments
from .registry import EMPTY, Registry


class EvaluatedOnce:
    """What every strategy of a run shares at its end: ``finished`` once the method is
    ``done`` and its one evaluation is in; :meth:`aggregate_evaluate` keeps each site's
    metrics by site id in ``evaluation`` and gives Flower's history the example-weighted
    mean loss (as Flower's FedAvg reports it) and ``mean_<eval_metric>`` over the sites."""

    #: The metric that :meth:`aggregate_evaluate` averages over sites.
    eval_metric = "auc"
    done = False
    evaluated = False

    @property
    def finished(self) -> bool:
        """The method is done and its evaluation is in."""
        return self.done and self.evaluated

    #: Each site's calibration of its score, ``{site: (intercept, slope)}``, once a tuning
    #: has fitted it (:meth:`calibrate`); the final evaluation then carries the site's.
    calibration: dict | None = None

    def evaluate_config(self, site: str | None = None) -> dict:
        """What the final evaluation asks of ``site`` (of every site when ``None``): its
        working scale (``work_config``), its calibration when there is one (``cal-a``,
        ``cal-b``: the site adds its calibrated risks' metrics), and whatever else a
        method's evaluation needs."""
        config = self.work_config()
        cal = (self.calibration or {}).get(site)
        if cal is not None:
            config["cal-a"], config["cal-b"] = float(cal[0]), float(cal[1])
        return config

    def calibrate(self, calibration: dict) -> None:
        """Set each site's calibration (``{site: (intercept, slope)}``, finite values);
        an evaluation already in is asked again, with it."""
        self.calibration = {
            s: (float(a), float(b))
            for s, (a, b) in calibration.items()
            if np.isfinite(a) and np.isfinite(b)
        }
        if self.evaluated:
            self.evaluated = False
            self.evaluation = {}

    def unanswered(self) -> list[str]:
        """The sites without a result at the end: not answering when the method ended, not
        evaluated, or never registered (absent when a quorum started the run)."""
        missing = set(getattr(self, "missing", ()))
        return sorted(
            missing | (set(self.sites) - set(self.evaluation)) | set(self.registry.absent)
        )

    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        """Keep each site's evaluation metrics by site id (in federation order) and mark the
        evaluation in.

        Parameters
        ----------
        server_round : int
            Flower's round.
        results : list of tuple
            ``(proxy, EvaluateRes)`` per answer; each carries its ``site``.
        failures : list
            Flower's failures of the round (logged).

        Returns
        -------
        loss : float or None
            The example-weighted mean loss (``None`` without examples).
        metrics : dict
            ``mean_<eval_metric>``: the mean over the sites with a finite value (``nan``
            when none).
        """
        self.registry.log_failures(failures, server_round)
        for _, res in results:
            self.evaluation[str(res.metrics["site"])] = dict(res.metrics)
        # in federation order: a mean over sites is the same number whichever order Flower
        # hands the answers over in (from a set of finished futures, in no fixed order)
        order = {s: k for k, s in enumerate(self.sites)}
        self.evaluation = dict(
            sorted(self.evaluation.items(), key=lambda item: order.get(item[0], len(order)))
        )
        self.evaluated = True
        values = [m[self.eval_metric] for m in self.evaluation.values()]
        values = [v for v in values if np.isfinite(v)]
        pairs = [(r.num_examples, r.loss) for _, r in results]
        loss = weighted_loss_avg(pairs) if sum(n for n, _ in pairs) > 0 else None
        return loss, {f"mean_{self.eval_metric}": float(np.mean(values)) if values else np.nan}


class SiteStrategy(EvaluatedOnce, Strategy):
    """Base: registers every site (properties exchange) before the first round, then runs
    the method's rounds.

    Subclasses implement ``_setup()``, ``_instructions(clients)`` and
    ``_aggregate(server_round, answered)`` and :meth:`coefficients_std`.  ``done`` turns
    true when the method has finished; evaluation then runs once and ``finished`` follows.
    """

    #: Whether a round with fewer than ``min_fit_fraction`` of the sites is skipped.
    needs_quorum = True

    def __init__(
        self,
        n_sites: int,
        registry: Registry | None = None,
        standardize: str = "none",
        min_fit_fraction: float = 1.0,
        timeout: float | None = None,
    ) -> None:
        super().__init__()
        self.n_sites = int(n_sites)
        self.registry = registry if registry is not None else Registry()
        self.standardize = standardize
        self.min_fit_fraction = float(min_fit_fraction)
        self.timeout = timeout
        self.done = False
        self.converged = False
        self.ready = False
        self.evaluation: dict[str, dict] = {}
        self.evaluated = False
        self.missing: set[str] = set()
        self.updates: dict[str, np.ndarray] = {}  # this round's decoded answers, by site
        self._asked: set[str] = set()
        self._t0 = time.perf_counter()

    # -- Flower hooks -----------------------------------------------------------------------
    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        """Registration: every site's properties before the first round."""
        self._register(client_manager, 0)
        return EMPTY

    def _register(self, client_manager: ClientManager, server_round: int) -> list[ClientProxy]:
        """Register the connected nodes not yet known; before the federation is fixed, wait
        for the sites first (afterwards a round goes on with the nodes that are there)."""
        clients = self.registry.settle(client_manager, self.n_sites, self.timeout, server_round)
        if not self.ready:
            self._become_ready()
        return clients

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        if self.done:
            return []
        clients = self._register(client_manager, server_round)  # a restarted node, or late
        if not self.ready:
            return []
        # sites that registered after the federation was fixed take no part in this run
        known = [c for c in clients if self.registry.cid_to_site.get(c.cid) in self.site_index]
        ins = self._instructions(known)
        self._asked = {str(fi.config["site"]) for _, fi in ins if "site" in fi.config}
        return ins

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        failed = self.registry.log_failures(failures, server_round)
        if not self.ready:
            return EMPTY, {}
        answered = {
            str(res.metrics["site"]): (proxy, res)
            for proxy, res in results
            if str(res.metrics.get("site")) in self.site_index
        }
        self.updates = {}
        for site in list(answered):
            arrays, problem = self._decode(answered[site][1])
            if not problem:
                self.updates[site] = arrays[0]
            else:  # counted as no answer: the site keeps its coefficients
                log(
                    WARNING,
                    "round %s: site %s sent a malformed update (%s); ignored",
                    server_round,
                    site,
                    problem,
                )
                del answered[site]
        for site in answered:
            self.missing.discard(site)
        silent = (set(failed) | self._asked) - set(answered)
        for site in sorted(silent):
            log(
                WARNING,
                "round %s: no answer from site %s; it keeps its coefficients",
                server_round,
                site,
            )
        self.missing.update(silent)
        needed = int(np.ceil(self.min_fit_fraction * self.round_size()))
        if len(answered) < needed and self.needs_quorum:
            log(
                WARNING,
                "round %s: %d of %d sites answered (need %d); round skipped",
                server_round,
                len(answered),
                self.n_sites,
                needed,
            )
            return EMPTY, {}
        return self._aggregate(server_round, answered)

    def round_size(self) -> int:
        """The sites this round was meant for (``min_fit_fraction`` is a share of them):
        every site, unless a subclass draws a part."""
        return self.n_sites

    def update_shape(self) -> tuple[int, ...] | None:
        """The shape of the one array a site's fit answer must carry (``None``: any shape)."""
        return None

    def _decode(self, res: FitRes) -> tuple[list[np.ndarray], str]:
        """A fit answer's arrays, decoded once (kept in ``self.updates`` by site for
        ``_aggregate``), and why they cannot be used ('' if they can): one finite array of
        :meth:`update_shape`, and a finite ``loss`` metric when there is one."""
        try:
            arrays = wire.from_parameters(res.parameters)
        except Exception as exc:  # noqa: BLE001 - whatever the bytes were, they are unusable
            return [], f"undecodable parameters: {type(exc).__name__}"
        shape = self.update_shape()
        if len(arrays) != 1 or (shape is not None and arrays[0].shape != tuple(shape)):
            got = [a.shape for a in arrays]
            want = "one array" + ("" if shape is None else f" of shape {tuple(shape)}")
            return arrays, f"expected {want}, got {got}"
        if not all(np.all(np.isfinite(a)) for a in arrays if a.dtype.kind in "fc"):
            return arrays, "non-finite values"
        loss = res.metrics.get("loss")
        if loss is not None and not np.isfinite(float(loss)):
            return arrays, "non-finite loss"
        return arrays, ""

    def work_config(self) -> dict:
        """What every instruction carries besides its task: the sites' working scale."""
        return self.registry.scaling_config()

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        if not self.done or self.evaluated:
            return []
        coef = self.coefficients_std()
        return [
            (
                proxy,
                EvaluateIns(
                    wire.to_parameters([coef[self.site_index[site]]]),
                    {"site": site, **self.evaluate_config(site)},
                ),
            )
            for proxy, site in self.registry.proxies(client_manager, self.site_index)
        ]

    def evaluate(
        self, server_round: int, parameters: Parameters
    ) -> tuple[float, dict[str, Scalar]] | None:
        return None

    # -- shared ----------------------------------------------------------------------------
    def _become_ready(self) -> None:
        if self.standardize == "federated" and self.registry.scale is None:
            self.registry.standardize()
        self.sites = self.registry.order()
        self.n_sites = len(self.sites)  # fewer than asked for when a quorum went on
        self.site_index = {s: k for k, s in enumerate(self.sites)}
        first = self.registry.sites[self.sites[0]]
        self.n_features = int(first.sum_x.shape[0])
        needs = self.moments_needed()
        if needs:  # the sites' own guards, reported at registration (strategies/client/guards.py)
            refuse_moments(self.registry, self.sites, needs)
        self._setup()
        self.ready = True

    def moments_needed(self) -> str:
        """The setting for which this run asks the sites for second moments (a Hessian,
        ``X'X``, a covariance), or ``""``."""
        return ""

    def _setup(self) -> None:
        raise NotImplementedError

    def _instructions(self, clients: list[ClientProxy]) -> list[tuple[ClientProxy, FitIns]]:
        raise NotImplementedError

    def _aggregate(self, server_round: int, answered: dict) -> tuple[Parameters, dict]:
        raise NotImplementedError

    def coefficients_std(self) -> np.ndarray:
        """Coefficients on the (possibly standardized) working scale, one row per site."""
        raise NotImplementedError

    def coefficients(self) -> np.ndarray:
        """Coefficients on the input scale of the features, one row per site."""
        beta = self.coefficients_std()
        if self.registry.scale is None:
            return beta
        return beta / self.registry.scale.reshape((-1,) + (1,) * (beta.ndim - 2))


class LocalOnlyStrategy(SiteStrategy):
    """The local-only comparator of either method: each site fits alone, once.  A site is
    asked (``local_config()`` plus the working scale) until it has answered; the method is
    done when every site has.  ``coef`` holds one :meth:`update_shape` array per site."""

    needs_quorum = False

    def local_config(self) -> dict:
        """The site's local task and its settings."""
        raise NotImplementedError

    def _setup(self) -> None:
        self.coef = np.full((len(self.sites), *self.update_shape()), np.nan)
        self.loss = np.full(len(self.sites), np.nan)

    def _instructions(self, clients: list[ClientProxy]) -> list[tuple[ClientProxy, FitIns]]:
        config = {**self.local_config(), **self.work_config()}
        out = []
        for c in clients:
            site = self.registry.cid_to_site[c.cid]
            if np.isnan(self.coef[self.site_index[site]]).any():
                out.append((c, FitIns(EMPTY, {**config, "site": site})))
        return out

    def _aggregate(self, server_round: int, answered: dict) -> tuple[Parameters, dict]:
        for site, (_, res) in answered.items():
            z = self.site_index[site]
            self.coef[z] = self.updates[site]
            self.loss[z] = float(res.metrics["loss"])
        self.done = self.converged = not np.isnan(self.coef).any()
        return EMPTY, {}

    def coefficients_std(self) -> np.ndarray:
        return self.coef
