"""The two algorithms behind :class:`strategies.server.fused.FusedSiteStrategy`, one object
each: :class:`AdmmRounds`, the server's half of the paper's ADMM, and :class:`QnRounds`, the
proximal quasi-Newton server.  Both answer the same calls -- ``rounds``, ``instructions``,
``aggregate``, ``estimate``, ``answer_shape``, ``release``, ``arrays`` and ``load`` -- so the
strategy holds one of them and never asks which.  What both share stays with the strategy
(their ``host``): the sites and their draws, the losses, the history, the stopping flags,
progress and checkpoints."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from flwr.common import FitIns, Scalar
from flwr.server.client_proxy import ClientProxy

from .. import wire
from ..errors import InputError
from ..solvers import admm, pqn, qnstate
from ..solvers.local import newton_shape, split_newton


class AdmmRounds:
    """The paper's ADMM (docs/methods.md 1.3, 2.3): each drawn site gets its coefficients and
    its graph pull, takes its local step, and the server thresholds and updates the duals.
    Its state is the host's ``state`` (:class:`strategies.solvers.admm.AdmmState`).

    Parameters
    ----------
    host : FusedSiteStrategy
        The strategy it runs in.
    """

    def __init__(self, host) -> None:
        self.host = host

    @property
    def rounds(self) -> int:
        """Rounds so far."""
        return self.host.state.round

    def answer_shape(self, block: tuple[int, ...]) -> tuple[int, ...]:
        """A site answers with new coefficients of shape ``block``."""
        return tuple(block)

    def estimate(self) -> np.ndarray:
        """The coefficients (working scale)."""
        return self.host.state.beta

    def instructions(self, by_site: dict) -> list[tuple[ClientProxy, FitIns]]:
        """Each drawn site's ``[beta_z, pull_z]``.  A draw with nobody reachable is a round
        with the coefficients unchanged, done at once (Flower skips a round without
        instructions)."""
        host = self.host
        while not host.done:
            drawn = host.draw()
            ins = []
            if drawn.any():
                pull = host.pull()
                common = {
                    "task": "admm",
                    "local-solver": host.settings.local_solver,
                    "rho-sigma": float(host.state.rho * host.sigma_max),
                    **host.work_config(),
                }
                for z in np.flatnonzero(drawn):
                    site = host.sites[z]
                    if site not in by_site:
                        continue
                    params = wire.to_parameters([host.state.beta[z], pull[z]])
                    ins.append((by_site[site], FitIns(params, {**common, "site": site})))
            if ins:
                return ins
            self.advance(host.state.beta.copy(), np.zeros(len(host.sites), dtype=bool))
        return []

    def aggregate(self, answered: dict) -> dict[str, Scalar]:
        """The answering sites' new coefficients into a server step (:meth:`advance`)."""
        host = self.host
        beta = host.state.beta.copy()
        took_part = np.zeros(len(host.sites), dtype=bool)
        for site, (_, res) in answered.items():
            z = host.site_index[site]
            beta[z] = host.updates[site]  # decoded and checked by SiteStrategy
            host.loss[z] = float(res.metrics["loss"])
            took_part[z] = True
        res = self.advance(beta, took_part)
        return {
            "objective": host.history.rows[-1]["objective"],
            "primal_residual": res.primal,
            "dual_residual": res.dual,
        }

    def advance(self, beta: np.ndarray, took_part: np.ndarray) -> admm.Residuals:
        """The server's half of an ADMM round on the new coefficients (thresholds, duals,
        ``rho <- alpha rho``), the history row and the stopping rule.

        Stops when the residuals are within tolerance in consecutive rounds during which
        every site has answered at least once (with every site answering: the first round
        within tolerance), or after ``max_rounds``.

        Parameters
        ----------
        beta : ndarray
            Every site's coefficients after the round (the others' as they were).
        took_part : ndarray of bool
            The sites that answered.

        Returns
        -------
        Residuals
            The round's residuals and whether they are within tolerance.
        """
        host, settings = self.host, self.host.settings
        rho = host.state.rho
        host.state, res = admm.server_update(
            host.problem, host.state, beta, settings.tol, settings.tol, settings.alpha, took_part
        )
        objective = float(np.sum(host.loss) + host.problem.penalty_value(beta))
        host.history.append(
            round=host.state.round,
            objective=objective,
            primal_residual=res.primal,
            dual_residual=res.dual,
            rho=rho,
            **{host.count_column: int(took_part.sum())},
        )
        if res.converged:
            host.seen |= took_part
        else:
            host.seen[:] = False
        host.converged = bool(host.seen.all())
        host.done = host.converged or host.state.round >= settings.max_rounds
        host._after_round(host.state.round, objective, res)
        return res

    def release(self) -> None:
        """Nothing to drop: the state is the coefficients and the duals."""

    def arrays(self) -> dict[str, np.ndarray]:
        """Nothing besides the host's ADMM state."""
        return {}

    def load(self, arrays: dict[str, np.ndarray]) -> None:
        """A checkpoint's pqn arrays (``arrays``) belong to another algorithm."""
        if arrays:
            raise InputError("resume: the checkpoint was written by another algorithm than 'admm'")


class QnRounds:
    """The proximal quasi-Newton server (:mod:`strategies.solvers.pqn`; docs/methods.md 1.4,
    2.4): each site (each drawn site, with partial participation) returns its loss and
    gradient at the point sent; the server updates its curvature models, solves the fused
    model problem and line-searches.  It keeps the host's ``state`` in step (coefficients and
    round), which readers of either algorithm use.

    Parameters
    ----------
    host : FusedSiteStrategy
        The strategy it runs in.
    qn : QuasiNewtonState
        The start.
    """

    def __init__(self, host, qn: qnstate.QuasiNewtonState) -> None:
        self.host = host
        self.qn = qn

    @property
    def rounds(self) -> int:
        """Rounds so far."""
        return self.qn.round

    def answer_shape(self, block: tuple[int, ...]) -> tuple[int, ...]:
        """A site answers with a gradient of shape ``block``, or with exact curvature
        ``[gradient | Hessian]`` (:func:`strategies.solvers.local.newton_shape`)."""
        if self.qn.settings.model == "exact":
            return newton_shape(tuple(block))
        return tuple(block)

    def estimate(self) -> np.ndarray:
        """The coefficients (working scale): :func:`strategies.solvers.pqn.estimate`."""
        return pqn.estimate(self.qn)

    def instructions(self, by_site: dict) -> list[tuple[ClientProxy, FitIns]]:
        """Each site's (each drawn site's, with partial participation) trial point.  A draw
        with nobody reachable is a round in which nothing changes, done at once (as in
        ADMM; the round limit bounds them)."""
        host = self.host
        common = {"task": "newton" if self.qn.settings.model == "exact" else "gradient"}
        common.update(host.work_config())
        reachable = np.array([s in by_site for s in host.sites])
        asked = reachable
        if self.qn.settings.incremental and reachable.any():
            asked = host.draw() & reachable
            while not asked.any():
                if self.idle():
                    return []
                asked = host.draw() & reachable
        out = []
        for z in np.flatnonzero(asked):
            site = host.sites[z]
            config = {**common, "site": site}
            if common["task"] == "gradient":  # a bound on its curvature with its first answer
                config["curvature"] = not bool(self.qn.sites.seen[z])
            params = wire.to_parameters([self.qn.search.trial[z]])
            out.append((by_site[site], FitIns(params, config)))
        return out

    def aggregate(self, answered: dict, pairs: dict | None = None) -> dict[str, Scalar]:
        """One round: the sites' losses and gradients update their models (and ``pairs``,
        ``{z: (s, y)}``: the start round's curvature pairs, learned after each site's first
        bound); the fused model problem is solved and line-searched; records the round and
        the stopping rule.

        Parameters
        ----------
        answered : dict
            ``{site: (proxy, FitRes)}`` of the sites that answered.
        pairs : dict, optional
            The start round's step pairs.

        Returns
        -------
        dict
            The round's metrics (objective, stopping measure).
        """
        host = self.host
        values, bounds = {}, {}
        block = self.qn.sites.x.shape[1:]
        for site, (_, res) in answered.items():
            z = host.site_index[site]
            if self.qn.settings.model == "exact":
                values[z] = (float(res.metrics["loss"]), *split_newton(host.updates[site], block))
            else:
                values[z] = (float(res.metrics["loss"]), host.updates[site])
            if not self.qn.sites.seen[z] and "curvature" in res.metrics:
                bounds[z] = host.first_curvature * float(res.metrics["curvature"])
        self.qn = qnstate.set_curvature(self.qn, bounds)
        self.qn = pqn.learn(self.qn, pairs or {})  # after the bound: the start's pairs
        taken: list = []  # the approximations the round takes, in order
        lla = pqn.Linearization(host.target, self._approximation(taken)) if host.lla else None
        self.qn, step = pqn.qn_round(host.problem, self.qn, values, host.settings.tol, lla)
        if taken:  # the next round starts from the round's last approximation
            host.problem = taken[-1]
        if host.lla and np.isfinite(step.objective):  # record the target's objective
            step = replace(step, objective=pqn.estimate_objective(host.target, self.qn))
            if not self.qn.settings.incremental and step.decrease <= 0.0:
                # (full participation) the approximation at x promises no decrease: x is its
                # minimizer to the inner solver's accuracy, a fixed point (the approximations
                # converge linearly, and at a tight tol the step test meets rounding first)
                step = replace(step, converged=True)
        host.loss = self.qn.sites.value.copy()
        host.state = replace(host.state, beta=pqn.estimate(self.qn).copy(), round=self.qn.round)
        self._row(
            step.objective,
            len(values),
            step.decrease,
            1.0 if step.accepted else self.qn.search.step,
        )
        host.converged = step.converged
        host.done = step.converged or self.qn.round >= host.settings.max_rounds
        host._after_round(self.qn.round, step.objective, step)
        return {"objective": step.objective, "decrease": step.decrease}

    def _approximation(self, taken: list):
        """MCP/SCAD by pqn: ``x -> `` the penalty's local linear approximation (a weighted
        lasso) at ``x``, each one appended to ``taken``; the round's last becomes the next
        round's problem once the round is over (nothing changes while it runs).  Each
        accepted step lowers the nonconvex objective (the approximation majorizes it and
        touches it at the point: Zou & Li 2008); a fixed point is a stationary point of it."""
        target = self.host.target

        def at(x: np.ndarray):
            taken.append(target.linearized(x))
            return taken[-1]

        return at

    def _row(self, objective: float, answered: int, decrease: float, step: float) -> None:
        """The history row of a pqn round (the ADMM columns empty)."""
        self.host.history.append(
            round=self.qn.round,
            objective=objective,
            primal_residual=np.nan,
            dual_residual=np.nan,
            rho=np.nan,
            **{self.host.count_column: answered},
            decrease=decrease,
            step=step,
        )

    def idle(self) -> bool:
        """A round in which nobody was drawn: counted, recorded, nothing changes.  Returns
        whether the round limit is reached."""
        host = self.host
        self.qn = replace(self.qn, round=self.qn.round + 1)
        host.state = replace(host.state, round=self.qn.round)
        last = host.history.rows[-1] if host.history.rows else {}
        self._row(last.get("objective", np.inf), 0, last.get("decrease", np.nan), np.nan)
        host.done = self.qn.round >= host.settings.max_rounds
        step = qnstate.Step(False, last.get("objective", np.inf), np.nan, False, 0)
        host._after_round(self.qn.round, step.objective, step)
        return host.done

    def release(self) -> None:
        """Drop the sites' curvature models (only further rounds read them)."""
        empty = np.zeros(0)
        sites = replace(self.qn.sites, hess=empty, ss=empty, ys=empty)
        self.qn = replace(self.qn, sites=sites)

    def arrays(self) -> dict[str, np.ndarray]:
        """The pqn state for a checkpoint (entries ``qn_<name>``)."""
        return {f"qn_{k}": v for k, v in self.qn.arrays().items()}

    def load(self, arrays: dict[str, np.ndarray]) -> None:
        """The pqn state of a checkpoint (its ``qn_`` entries, prefix removed); with MCP/SCAD
        the host's problem becomes the approximation at the fit's estimate."""
        if not arrays:
            raise InputError("resume: the checkpoint was written by another algorithm than 'pqn'")
        self.qn = qnstate.QuasiNewtonState.from_arrays(arrays)
        if self.host.lla:  # the approximation at the fit's estimate (the accepted point, or b)
            self.host.problem = self.host.target.linearized(pqn.estimate(self.qn))
