"""The RowFed ``NumPyClient``: one client's local work, on its own data only.

What leaves the client: ``p x q`` coefficient matrices, its counts and per-column sums
(``sum x``, ``sum x^2``, ``sum y``: for federated standardization and the input-scale
intercept), gradients of its loss at coefficients the server chose (the pqn algorithm),
``lambda_max(X^T X / n)`` once (pqn's curvature bound), and scalar metrics (loss, residual
sum of squares, prediction error).  Never a data row, never ``X^T X`` itself -- although a
server can infer ``X^T X / n`` from the gradients of a quadratic loss at enough points (the
pqn server does, for its curvature model), as it could from ADMM's exact local steps.

Tasks (``config["task"]``):

Registration is Flower's properties exchange (``get_properties``): ``site, n, index,
features``, the packed sums ``sum_x, sum_x2`` and ``p, q, sum_y``
(:func:`strategies.server.registry.registration_properties`).

``local``     <- ``init`` (ridge | nonfed), ``penalty``, ``concavity``, ``lam2``, ``sparsity``:
                 the client's own fit (the oracle initial estimate, or the NonFed baseline
                 with the same sparsity) -> ``[Theta_m]``, metrics ``task, site, loss``.
``admm``      <- ``[Theta_m, pull_m]``, ``rho-sigma`` (``rho sigma_max``), ``local-solver``:
                 ``c_m`` from its own ``L_m`` (:func:`strategies.solvers.local.curvature`),
                 ``Theta_tilde_m = Theta_m - pull_m / c_m`` and one local step
                 (docs/methods.md 2.3 step 4) -> ``[Theta_m_new]``, metrics ``task, site, loss``.
``gradient``  <- ``[Theta_m]`` -> ``[grad f_m(Theta_m)]``, metrics ``task, site, loss`` (and,
                 when ``curvature`` is true, ``L_m``): the proximal quasi-Newton algorithm.
``newton``    <- ``[Theta_m]`` -> ``[grad f_m(Theta_m) | X'X/n]`` (one ``p x (q + p)`` array,
                 :func:`strategies.solvers.local.newton_answer`), metrics ``task, site, loss``: pqn
                 with ``curvature = exact``.
``fedavg``    <- ``[Theta]`` (common), ``fedavg-local-steps``, ``fedavg-lr`` and the sparsity
                 penalty (and FedProx's ``proximal_mu``): proximal-gradient steps ->
                 ``[Theta]``, metrics ``task, site, loss`` (the loss at the received
                 ``Theta``); every global-model comparator sends this task.
``personalize`` <- ``[W]`` (FedAvg's common model), ``how``: ``ditto`` -> ``argmin f_m +
                 P_lam2 + (ditto-mu/2)||Theta - W||^2`` (:meth:`LocalLeastSquares.local_fit`);
                 ``finetune`` -> ``ft-steps`` of the ``fedavg`` task's steps from ``W``;
                 ``choose`` (``W`` holds IFCA's k models) -> the one of least loss.
``ifca``      <- ``[W]`` (k models): the one of least loss, then the ``fedavg`` task's
                 steps from it -> ``[Theta]``, metrics ``site, loss, cluster``.
``evaluate``  <- ``[Theta_m]``: metrics ``site, mse_pred`` (on its test data, else on its
                 training data; ``split`` says which), ``rss`` (training data), ``n_train``,
                 ``n_test``.

Every task carries ``intercept`` (bool) and may carry ``scale`` bytes: the client works with
``x / scale`` and, with an intercept, centres ``x`` and ``y`` by its own training means (a
free intercept per client is exactly a within-client centring, so the intercept is never
penalized).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from strategies.client import batch
from strategies.client.folds import site_folds
from strategies.client.guards import MOMENT_FLOOR, Guards
from strategies.client.site import SiteClient
from strategies.server.registry import registration_properties, rowfed_meta
from strategies.solvers.local import local_descent, site_weight
from strategies.solvers.penalties import Penalty
from strategies.wire import unpack
from strategies.wire.batch import TASK, VIEW_FIELD

from .datafit import LocalLeastSquares, start_fit


@dataclass(frozen=True)
class ClientSamples:
    """One client's data: training ``x`` ``(n, p)``, ``y`` ``(n, q)``; test data may have
    zero rows.  ``site`` is the client's id (what the server keys its state by)."""

    site: str
    x: np.ndarray
    y: np.ndarray
    x_test: np.ndarray | None = None
    y_test: np.ndarray | None = None

    def __post_init__(self) -> None:
        x = np.asarray(self.x, dtype=float)
        y = np.asarray(self.y, dtype=float)
        if y.ndim == 1:
            y = y[:, None]
        object.__setattr__(self, "x", x)
        object.__setattr__(self, "y", y)
        p, q = x.shape[1], y.shape[1]
        xt = np.zeros((0, p)) if self.x_test is None else np.asarray(self.x_test, dtype=float)
        yt = np.zeros((0, q)) if self.y_test is None else np.asarray(self.y_test, dtype=float)
        object.__setattr__(self, "x_test", xt)
        object.__setattr__(self, "y_test", yt.reshape(len(yt), q))

    @property
    def n(self) -> int:
        return self.x.shape[0]

    @property
    def p(self) -> int:
        return self.x.shape[1]

    @property
    def q(self) -> int:
        return self.y.shape[1]


def fedavg_local_steps(
    f: LocalLeastSquares,
    theta: np.ndarray,
    penalty: Penalty,
    lam2: float,
    sparsity: str,
    steps: int,
    lr: float = 0.0,
    proximal_mu: float = 0.0,
) -> np.ndarray:
    """``steps`` proximal-gradient steps on ``f + P_lam2`` (plus FedProx's
    ``(mu/2) ||Theta - theta||^2``) from ``theta``: FedAvg's local work
    (:func:`strategies.solvers.local.local_descent` with the sparsity threshold as the prox; its
    curvature doubled until ``penalty.check_rho`` holds for MCP/SCAD).

    Parameters
    ----------
    f : LocalLeastSquares
        The client's datafit on the working scale.
    theta : ndarray, shape (p, q)
        The start: the model the server sent (FedProx's anchor).
    penalty : Penalty
        The sparsity penalty.
    lam2 : float
        The sparsity level.
    sparsity : {"entry", "row"}
        Thresholds entrywise or by rows.
    steps : int
        The number of steps.
    lr : float, optional
        The step size (0: ``1 / (L + mu)``, ``L`` the datafit's Lipschitz constant).
    proximal_mu : float, optional
        FedProx's ``mu`` (0: FedAvg).

    Returns
    -------
    ndarray, shape (p, q)
        The client's model after the steps.
    """
    group = sparsity == "row"

    def admissible(r: float) -> bool:
        try:
            penalty.check_rho(r)
        except ValueError:
            return False
        return True

    return local_descent(
        f,
        theta,
        steps,
        lr,
        proximal_mu,
        prox=lambda v, r: penalty.threshold(v, lam2, r, group),
        admissible=admissible,
    )


def _penalty(config) -> Penalty:
    kind = str(config.get("penalty", "lasso"))
    iota = float(config.get("concavity", 0.0))
    return Penalty(kind, None if kind == "lasso" or iota <= 0 else iota)


class RowFedClient(SiteClient):
    """One client of the federation; ``index`` is its position in the client list."""

    second_moments = "X'X"

    def __init__(
        self,
        data: ClientSamples,
        index: int = -1,
        features: tuple[str, ...] = (),
        guards: Guards | None = None,
    ) -> None:
        self.data = data
        self.index = int(index)
        self.features = tuple(features)
        self.guards = guards or Guards()  # the client's own floors (strategies/client/guards.py)
        self._cache: dict = {}
        self._views: dict = {}

    # -- views of the rows (a federated tuning's folds: strategies/client/batch.py) ---------------
    def view(self, spec: dict) -> RowFedClient:
        """This client on fold ``k`` of ``folds`` of its rows (the rows outside it to fit,
        the fold to validate; random, from its own seeded stream:
        :func:`strategies.client.folds.site_folds`), or on all its rows."""
        key = json.dumps(spec, sort_keys=True)
        if key not in self._views:
            d = self.data
            if "fold" in spec:
                fold = site_folds(
                    np.zeros(d.n), int(spec["folds"]), int(spec.get("fold-seed", 0)),
                    int(spec.get("repeat", 0)), d.site, stratified=False,
                )  # fmt: skip
                train, val = fold != int(spec["fold"]), fold == int(spec["fold"])
                d = ClientSamples(d.site, d.x[train], d.y[train], d.x[val], d.y[val])
            self._views[key] = RowFedClient(d, self.index, self.features, self.guards.for_view())
        return self._views[key]

    def oof_part(self, parameters, config) -> tuple[float, int]:
        """The squared errors of this view's validation rows, summed, and their count.

        Parameters
        ----------
        parameters : list of ndarray
            ``[Theta]``: the fit's coefficients on the working scale, shape ``(p, q)``.
        config : dict
            The instruction: its ``scale`` and ``intercept`` define the working scale.

        Returns
        -------
        sse : float
            The squared errors summed over the validation rows and responses.
        count : int
            The number of squared errors (rows times responses).
        """
        (theta,) = parameters
        _, scale, x_mean, y_mean = self._work(config)
        d = self.data
        resid = (d.y_test - y_mean) - (d.x_test / scale - x_mean) @ theta
        return float(np.sum(resid * resid)), int(resid.size)

    @staticmethod
    def pool(parts) -> dict:
        """The MSE of a setting's out-of-fold predictions, all folds together."""
        sse, count = sum(s for s, _ in parts), sum(c for _, c in parts)
        return {"mse": sse / count if count else float("nan"), "n": int(count)}

    # -- working scale --------------------------------------------------------------------
    def _work(self, config) -> tuple[LocalLeastSquares, np.ndarray, np.ndarray, np.ndarray]:
        """Datafit on the working scale, and ``(scale, x_mean, y_mean)`` that define it."""
        scale_b = config.get("scale")
        intercept = bool(config.get("intercept", False))
        weight = site_weight(config, self.data.n)
        key = (scale_b, intercept, weight)
        if key not in self._cache:
            d = self.data
            scale = unpack(scale_b, d.p)
            scale = np.ones(d.p) if scale is None else scale
            x = d.x / scale
            if intercept:
                x_mean, y_mean = x.mean(axis=0), d.y.mean(axis=0)
            else:
                x_mean, y_mean = np.zeros(d.p), np.zeros(d.q)
            f = LocalLeastSquares(x - x_mean, d.y - y_mean, weight)
            self._cache = {key: (f, scale, x_mean, y_mean)}
        return self._cache[key]

    # -- Flower API ---------------------------------------------------------------------------
    def get_parameters(self, config):
        return [np.zeros((self.data.p, self.data.q))]

    def get_properties(self, config):
        """Registration: who this client is, its counts and per-column sums (of a view of
        its rows when the config names one)."""
        if VIEW_FIELD in config:
            return batch.answer_properties(self, config)
        d = self.data
        self.guards.check_rows(d.site, d.n)
        meta = {**rowfed_meta(d.p, d.q, d.y), MOMENT_FLOOR: self.guards.moment_floor(d.p)}
        return registration_properties(d.site, d.n, self.index, d.x, self.features, **meta)

    # -- the hooks of strategies/client/site.py: SiteClient ------------------------------------
    @property
    def rows(self) -> int:
        return self.data.n

    @property
    def n_features(self) -> int:
        return self.data.p

    def datafit(self, config) -> LocalLeastSquares:
        return self._work(config)[0]

    def loss_and_grad(self, f, x):
        return f.value(x), f.grad(x)

    def local_fit(self, f, config):
        if str(config.get("init", "ridge")) == "nonfed":
            return f.local_fit(_penalty(config), float(config["lam2"]), str(config["sparsity"]))
        return start_fit([f], method="ridge")[0]

    def local_steps(self, f, start, steps, lr, proximal_mu, config):
        lam2, sparsity = float(config["lam2"]), str(config["sparsity"])
        return fedavg_local_steps(
            f, start, _penalty(config), lam2, sparsity, steps, lr, proximal_mu
        )

    def personal_fit(self, f, w, mu, config):
        lam2, sparsity = float(config["lam2"]), str(config["sparsity"])
        return f.local_fit(_penalty(config), lam2, sparsity, theta0=w, anchor=w, mu=mu)

    def evaluate(self, parameters, config):
        """Prediction error of ``parameters[0]`` (working scale): ``mse_pred`` over all
        responses, ``mse:<k>`` for response ``k`` (0-based) with ``mse_se:<k>``, the standard
        error of that mean of squared errors (their SD over the rows / sqrt(rows); NaN with
        one row), and the training RSS."""
        self._check_site(config)
        if config.get("task") == TASK:
            return batch.answer_evaluate(self, parameters, config)
        (theta,) = parameters
        d = self.data
        f, scale, x_mean, y_mean = self._work(config)
        if d.x_test.shape[0] > 0:
            x, y, split = d.x_test, d.y_test, "test"
        else:
            x, y, split = d.x, d.y, "train"
        resid = (y - y_mean) - (x / scale - x_mean) @ theta
        mse = float(np.mean(resid * resid))
        metrics = {
            "site": d.site,
            "mse_pred": mse,
            "rss": f.rss(theta),
            "loss": f.value(theta),
            "n_train": d.n,
            "n_test": int(d.x_test.shape[0]),
            "split": split,
        }
        sq = resid * resid
        n_rows = sq.shape[0]
        se = (
            sq.std(axis=0, ddof=1) / np.sqrt(n_rows) if n_rows > 1 else np.full(sq.shape[1], np.nan)
        )
        for k, value in enumerate(np.mean(sq, axis=0)):
            metrics[f"mse:{k}"] = float(value)
            metrics[f"mse_se:{k}"] = float(se[k])
        if config.get("moments"):  # inference = oracle: the training data's moments
            self.guards.check_moments(d.site, d.n, d.p, "X'X")
            from .inference import client_moments

            metrics.update(client_moments(d.x, d.y, bool(config.get("intercept", True))))
        return mse, int(x.shape[0]), metrics


__all__ = ["ClientSamples", "RowFedClient", "fedavg_local_steps"]
