"""The base of the per-site strategies: registration, keyed by site id, evaluation once."""

from __future__ import annotations

import time
from logging import WARNING

import numpy as np
from flwr.common import EvaluateIns, log, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.strategy import Strategy

from . import pqn
from .registry import EMPTY, Registry


class SiteStrategy(Strategy):
    """Base: registers every site first (one round), then runs the method's rounds.

    Subclasses implement ``_setup()``, ``_instructions(clients)`` and ``_aggregate(...)``.
    ``done`` turns true when the method has finished; evaluation then runs once.
    """

    def __init__(
        self,
        n_sites: int,
        registry: Registry | None = None,
        standardize: str = "none",
        min_fit_fraction: float = 1.0,
    ) -> None:
        super().__init__()
        self.n_sites = int(n_sites)
        self.registry = registry if registry is not None else Registry()
        self.standardize = standardize
        self.min_fit_fraction = float(min_fit_fraction)
        self.done = False
        self.ready = False
        self.evaluation: dict[str, dict] = {}
        self.evaluated = False
        self.missing: set[str] = set()
        self.updates: dict[str, np.ndarray] = {}  # this round's decoded answers, by site
        self._t0 = time.perf_counter()

    #: Whether a round with fewer than ``min_fit_fraction`` of the sites is skipped.
    needs_quorum = True

    # -- Flower hooks -----------------------------------------------------------------------
    def initialize_parameters(self, client_manager):
        return EMPTY

    def _clients(self, client_manager):
        if not self.ready:  # registration waits for every site; later rounds use who is there
            client_manager.wait_for(self.n_sites, timeout=600)
        return [client_manager.all()[cid] for cid in sorted(client_manager.all())]

    def configure_fit(self, server_round, parameters, client_manager):
        if self.done:
            return []
        clients = self._clients(client_manager)
        todo = self.registry.registration_instructions(clients)
        if not self.ready:
            if len(self.registry.sites) >= self.n_sites:
                self._become_ready()  # more nodes than sites: they are asked to register
            else:
                return todo
        # sites that registered after the federation was fixed take no part in this run
        known = [c for c in clients if self.registry.cid_to_site.get(c.cid) in self.site_index]
        ins = self._instructions(known)
        self._asked = {str(fi.config["site"]) for _, fi in ins if "site" in fi.config}
        return todo + ins

    def aggregate_fit(self, server_round, results, failures):
        results = self.registry.handle_registrations(results)
        failed = self.registry.log_failures(failures, server_round)
        if not self.ready:
            return EMPTY, {}
        answered = {
            str(res.metrics["site"]): (proxy, res)
            for proxy, res in results
            if str(res.metrics["site"]) in self.site_index
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
        silent = (set(failed) | getattr(self, "_asked", set())) - set(answered)
        for site in sorted(silent):
            log(
                WARNING,
                "round %s: no answer from site %s; it keeps its coefficients",
                server_round,
                site,
            )
        self.missing.update(silent)
        needed = int(np.ceil(self.min_fit_fraction * self.n_sites))
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

    def update_shape(self) -> tuple[int, ...] | None:
        """The shape of the one array a site's fit answer must carry (``None``: any shape)."""
        return None

    def _decode(self, res) -> tuple[list[np.ndarray], str]:
        """A fit answer's arrays, decoded once (kept in ``self.updates`` by site for
        ``_aggregate``), and why they cannot be used ('' if they can): one finite array of
        :meth:`update_shape`, and a finite ``loss`` metric when there is one."""
        try:
            arrays = parameters_to_ndarrays(res.parameters)
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

    def configure_evaluate(self, server_round, parameters, client_manager):
        if not self.done or self.evaluated:
            return []
        ins = []
        for proxy in self._clients(client_manager):
            site = self.registry.cid_to_site.get(proxy.cid)
            if site is None or site not in self.site_index:
                continue
            beta = self.coefficients_std()[self.site_index[site]]
            cfg = {"site": site, **self.registry.scaling_config()}
            ins.append((proxy, EvaluateIns(ndarrays_to_parameters([beta]), cfg)))
        return ins

    def aggregate_evaluate(self, server_round, results, failures):
        self.registry.log_failures(failures, server_round)
        for _, res in results:
            self.evaluation[str(res.metrics["site"])] = dict(res.metrics)
        self.evaluated = True
        aucs = [m["auc"] for m in self.evaluation.values() if np.isfinite(m["auc"])]
        return None, {"mean_auc": float(np.mean(aucs)) if aucs else float("nan")}

    def evaluate(self, server_round, parameters):
        return None

    # -- shared ----------------------------------------------------------------------------
    #: ``B_z`` before site ``z``'s first gradient pair, as a multiple of the ``curvature`` it
    #: reports with its first answer (a bound on its loss's Hessian).
    first_curvature = 1.0
    #: The history column counting the sites that answered.
    count_column = "n_answered"

    def _qn_round(self, answered) -> tuple[pqn.Step, dict[str, float]]:
        """One round of the proximal quasi-Newton server (:mod:`strategies.pqn`) on the sites'
        losses and gradients, for subclasses with ``qn``, ``problem``, ``cfg``, ``history``
        and ``progress``: advances ``qn``, records the round, sets ``done``/``converged``;
        returns the step and the round's metrics."""
        values = {}
        for site, (_, res) in answered.items():
            z = self.site_index[site]
            values[z] = (float(res.metrics["loss"]), self.updates[site])
            if not self.qn.evaluated and "curvature" in res.metrics:
                pqn.set_curvature(
                    self.qn, z, self.first_curvature * float(res.metrics["curvature"])
                )
        self.qn, step = pqn.qn_round(self.problem, self.qn, values, self.cfg.tol)
        self.loss = self.qn.value.copy()
        self.history.append(
            round=self.qn.round,
            objective=step.objective,
            primal_residual=np.nan,
            dual_residual=np.nan,
            rho=np.nan,
            **{self.count_column: len(values)},
            decrease=step.decrease,
            step=1.0 if step.accepted else self.qn.step,
        )
        self.converged = step.converged
        self.done = step.converged or self.qn.round >= self.cfg.max_rounds
        if self.progress is not None:
            self.progress(self.qn.round, step.objective, step, time.perf_counter() - self._t0)
        return step, {"objective": step.objective, "decrease": step.decrease}

    def _become_ready(self) -> None:
        if self.standardize == "federated" and self.registry.center is None:
            self.registry.standardize()
        self.sites = self.registry.order()
        self.site_index = {s: k for k, s in enumerate(self.sites)}
        first = self.registry.sites[self.sites[0]]
        self.n_features = int(first.sum_x.shape[0])
        self._setup()
        self.ready = True

    def coefficients_std(self) -> np.ndarray:
        """Coefficients on the (possibly standardized) working scale, ``(Z, p)``."""
        raise NotImplementedError

    def coefficients(self) -> np.ndarray:
        """Coefficients on the input scale of the features, ``(Z, p)``."""
        beta = self.coefficients_std()
        if self.registry.scale is None:
            return beta
        return beta / self.registry.scale
