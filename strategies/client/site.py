"""What both methods' Flower clients share: ``fit`` answering the strategies' instructions,
whose task names are defined here once (:data:`TASKS`), and the site check.

Each method's client (``grauc_flower/client.py: GrAUCClient``,
``rowfed_flower/client.py: RowFedClient``) supplies what differs: its datafit on the
working scale (:meth:`SiteClient.datafit`), its individual fit (:meth:`SiteClient.local_fit`),
FedAvg's local steps (:meth:`SiteClient.local_steps`, RowFed's with its sparsity threshold)
and Ditto's personal model (:meth:`SiteClient.personal_fit`).  What leaves a site is what
each task returns: coefficients (or a gradient, or a ``p x (1 + p)`` Newton answer), the
row count and scalar metrics; never a row.
"""

from __future__ import annotations

import numpy as np
from flwr.client import NumPyClient

from ..solvers.local import admm_update, best_model, newton_answer
from ..wire.batch import TASK
from . import batch

#: The tasks of a strategy's fit instruction (``config["task"]``), besides a batch of a
#: federated tuning (:data:`strategies.TASK`): an ADMM local step, the loss and
#: gradient (pqn), the gradient and Hessian (oracle refit, exact curvature), the
#: individual fit (in a fit's start round with ``then``: followed by the first pqn answer
#: at it, one flat array), FedAvg's local steps, IFCA's choice and steps, a personal model
#: (Ditto, fine-tuning, IFCA's final choice).
TASKS = ("admm", "gradient", "newton", "local", "fedavg", "ifca", "personalize")


class SiteClient(NumPyClient):
    """A site's client: :meth:`fit` dispatches on :data:`TASKS`; subclasses hold ``data``
    (with ``site``), ``guards`` and supply the hooks below."""

    #: What a ``newton`` answer sends, in a refusal's message.
    second_moments = "second moments"

    # -- what a method supplies -------------------------------------------------------------
    @property
    def site(self) -> str:
        return str(self.data.site)

    @property
    def rows(self) -> int:
        """The training rows (the count every answer carries)."""
        raise NotImplementedError

    @property
    def n_features(self) -> int:
        raise NotImplementedError

    def datafit(self, config):
        """The site's datafit on the working scale the config names."""
        raise NotImplementedError

    def loss_and_grad(self, f, x):
        """The datafit's loss and gradient at ``x`` (by default ``f.value_and_grad``).

        Parameters
        ----------
        f : datafit
            The site's datafit (:meth:`datafit`).
        x : ndarray
            The coefficients, one block.

        Returns
        -------
        loss : float
            ``f(x)``.
        grad : ndarray
            The gradient of ``f`` at ``x``, shaped as ``x``.
        """
        return f.value_and_grad(x)

    def local_fit(self, f, config):
        """The ``local`` task's answer: the site's own fit.

        Parameters
        ----------
        f : datafit
            The site's datafit (:meth:`datafit`).
        config : dict
            The fit instruction's config.

        Returns
        -------
        ndarray
            The site's own coefficients.
        """
        raise NotImplementedError

    def local_steps(self, f, start, steps: int, lr: float, proximal_mu: float, config):
        """FedAvg's local work from ``start`` (FedProx's term when ``proximal_mu > 0``).

        Parameters
        ----------
        f : datafit
            The site's datafit (:meth:`datafit`).
        start : ndarray
            The model the steps start from (the server's, or IFCA's chosen one).
        steps : int
            The number of local steps.
        lr : float
            The step size.
        proximal_mu : float
            FedProx's proximal weight toward ``start`` (0: FedAvg).
        config : dict
            The fit instruction's config.

        Returns
        -------
        ndarray
            The coefficients after the steps.
        """
        raise NotImplementedError

    def personal_fit(self, f, w, mu: float, config):
        """Ditto's personal model: ``argmin f(b) + (mu/2) ||b - w||^2`` (with the method's
        own penalty).

        Parameters
        ----------
        f : datafit
            The site's datafit (:meth:`datafit`).
        w : ndarray
            The global model the personal one is pulled toward.
        mu : float
            The weight of the pull.
        config : dict
            The fit instruction's config.

        Returns
        -------
        ndarray
            The personal coefficients.
        """
        raise NotImplementedError

    # -- shared -----------------------------------------------------------------------------
    def _answer_at(self, task: str, f, x, config, metrics: dict):
        """A pqn answer at ``x``: the gradient (``gradient``; with the curvature bound when
        the config asks) or ``[gradient | Hessian]`` (``newton``, under the second-moment
        guard); the loss goes into ``metrics``."""
        n = self.rows
        if task == "gradient":
            loss, answer = self.loss_and_grad(f, x)
            if config.get("curvature"):
                metrics["curvature"] = float(f.lipschitz())
        else:
            self.guards.check_moments(self.site, n, self.n_features, self.second_moments)
            answer, loss = newton_answer(f, x)
        metrics["loss"] = float(loss)
        return answer

    def _check_site(self, config) -> None:
        expected = config.get("site")
        if expected is not None and str(expected) != self.site:
            raise RuntimeError(
                f"site mismatch: the server addressed {expected!r}, this is {self.site!r}"
            )

    def fit(self, parameters, config):
        task = config.get("task")
        self._check_site(config)
        if task == TASK:
            return batch.answer_fit(self, parameters, config)
        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}")
        f = self.datafit(config)
        n, metrics = self.rows, {"task": task, "site": self.site}
        lr = float(config.get("fedavg-lr", 0.0))
        if task == "admm":
            x, pull = parameters
            rho_sigma = float(config["rho-sigma"])
            new = admm_update(f, x, pull, rho_sigma, str(config["local-solver"]))
            return [new], n, {**metrics, "loss": f.value(new)}
        if task in ("gradient", "newton"):
            (x,) = parameters
            return [self._answer_at(task, f, x, config, metrics)], n, metrics
        if task == "local":
            new = self.local_fit(f, config)
            then = config.get("then")  # the start round: also the first pqn answer, at the fit
            if then is None:
                return [new], n, {**metrics, "loss": f.value(new)}
            if then not in ("gradient", "newton"):
                raise ValueError(f"unknown answer {then!r} after the start")
            answer = self._answer_at(then, f, new, config, metrics)
            parts = [np.ravel(new), np.ravel(answer)]
            if config.get("origin") and then == "gradient":  # the gradient at zero: a pair
                parts.append(np.ravel(self.loss_and_grad(f, np.zeros_like(new))[1]))
            return [np.concatenate(parts)], n, metrics
        if task == "fedavg":
            (x,) = parameters
            steps = int(config["fedavg-local-steps"])
            mu = float(config.get("proximal_mu", 0.0))
            new = self.local_steps(f, x, steps, lr, mu, config)
            return [new], n, {**metrics, "loss": f.value(x)}
        if task == "ifca":  # the best of the k models, then FedAvg's local steps from it
            (models,) = parameters
            j, loss = best_model(f, models)
            new = self.local_steps(f, models[j], int(config["fedavg-local-steps"]), lr, 0.0,
                                   config)  # fmt: skip
            return [new], n, {**metrics, "loss": loss, "cluster": j}
        # personalize: Ditto's model, fine-tuning, or IFCA's choice
        (w,) = parameters
        if config["how"] == "ditto":
            new = self.personal_fit(f, w, float(config["ditto-mu"]), config)
        elif config["how"] == "choose":
            metrics["cluster"], _ = best_model(f, w)
            new = w[metrics["cluster"]]
        else:
            new = self.local_steps(f, w, int(config["ft-steps"]), lr, 0.0, config)
        return [new], n, {**metrics, "loss": f.value(new)}


__all__ = ["TASKS", "SiteClient"]
