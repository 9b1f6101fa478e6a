"""The GrAUC-PFL ``NumPyClient``: an institution's local work, on its own data only.

What leaves the client: coefficient vectors, counts, per-feature sums (for federated
standardization), its location and scalar metrics (loss, AUC).  Never a data row.

Tasks (``config["task"]``):

Registration is Flower's properties exchange (``get_properties``): ``site, n, index,
features`` and the packed per-feature sums ``sum_x, sum_x2`` (for standardization), with
``lat, lon, n_pos, n_neg`` (:func:`strategies.server.registry.registration_properties`).

``admm``      <- ``[beta_z, pull_z]`` and ``rho-sigma``, ``local-solver``: forms
                 ``beta_tilde = beta_z - pull_z / c_z`` with its own curvature ``c_z`` and takes
                 the local step -> ``[beta_z_new]``, metrics ``site, loss``.
``gradient``  <- ``[beta_z]`` -> ``[grad f_z(beta_z)]``, metrics ``site, loss`` (and, when
                 ``curvature`` is true, the Lipschitz bound ``mu_z`` of the gradient, a
                 scalar): the proximal quasi-Newton algorithm (what a FedSGD client sends).
``local``     -> the individual fit ``argmin f_z`` -> ``[beta_z]``.
``newton``    <- ``[beta_z]`` -> ``[grad f_z(beta_z) | Hessian]`` (one ``p x (1 + p)`` array,
                 :func:`strategies.solvers.local.newton_answer`), metrics ``site, loss``: a round of
                 the oracle refit (inference = oracle) or of pqn with ``curvature = exact``.
``personalize`` <- ``[w]`` (FedAvg's global model), ``how``: ``ditto`` ->
                 ``argmin f_z(b) + (ditto-mu/2)||b - w||^2`` (the datafit's exact prox);
                 ``finetune`` -> ``ft-steps`` of the ``fedavg`` task's steps from ``w``;
                 ``choose`` (``w`` holds IFCA's k models) -> the one of least loss, metric
                 ``cluster``.
``ifca``      <- ``[W]`` (k models): the one of least loss, then the ``fedavg`` task's
                 steps from it -> ``[beta]``, metrics ``site, loss, cluster``.
``fedavg``    <- ``[beta]``: ``fedavg-local-steps`` gradient steps of size ``fedavg-lr`` (or
                 ``1/(mu_z + proximal_mu)``), with FedProx's proximal term when the config
                 carries ``proximal_mu`` -> ``[beta]``, metrics ``site, loss`` (at the
                 received beta).  Every global-model comparator (FedAvg, FedProx, FedAdam,
                 ...) sends this task: they differ on the server.
Every task may carry ``center``/``scale`` bytes: the site standardizes ``(x - center)/scale``.
With inference = oracle the evaluation carries ``sandwich-at`` (the refitted coefficients) and
the site adds the ``p x p`` covariance of its gradient there (:mod:`grauc_flower.inference`).
After a tuning it carries the site's calibration ``cal-a``, ``cal-b``: the site adds its
calibrated risks' Brier score, calibration error, intercept and slope and its reliability
bands, each of at least its guards' floor of rows (:mod:`strategies.stats.calibration`).
"""

from __future__ import annotations

import json

import numpy as np

from strategies.client import batch
from strategies.client.folds import site_folds
from strategies.client.guards import MOMENT_FLOOR, Guards
from strategies.client.site import SiteClient
from strategies.server.registry import grauc_meta, registration_properties
from strategies.solvers.local import local_descent, site_weight
from strategies.wire import unpack
from strategies.wire.batch import TASK, VIEW_FIELD

from .data import SiteData
from .datafit import PairwiseLogistic, local_fit, split_by_class, start_fit
from .inference import sandwich_metrics
from .metrics import auc, delong


class GrAUCClient(SiteClient):
    """One institution.  ``index`` is its position in the federation's site list."""

    second_moments = "a Hessian"

    def __init__(
        self, data: SiteData, ridge: float, index: int = -1, guards: Guards | None = None
    ) -> None:
        self.data = data
        self.ridge = float(ridge)
        self.index = int(index)
        self.guards = guards or Guards()  # the site's own floors (strategies/client/guards.py)
        self._cache: dict = {}
        self._views: dict = {}

    # -- views of the rows (a federated tuning's folds: strategies/client/batch.py) ---------------
    def view(self, spec: dict) -> GrAUCClient:
        """This site on a view of its rows: ``fold`` ``k`` of ``folds`` (its training rows
        outside the fold to fit, the fold to validate; stratified, from its own seeded
        stream: :func:`strategies.stats.tuning.site_folds`), at ``ridge`` when given."""
        key = json.dumps(spec, sort_keys=True)
        if key not in self._views:
            d = self.data
            if "fold" in spec:
                fold = site_folds(
                    d.y_train, int(spec["folds"]), int(spec.get("fold-seed", 0)),
                    int(spec.get("repeat", 0)), d.site, stratified=True,
                )  # fmt: skip
                train, val = fold != int(spec["fold"]), fold == int(spec["fold"])
                d = SiteData(
                    d.site, d.lat, d.lon, d.x_train[train], d.y_train[train],
                    d.x_train[val], d.y_train[val], d.features,
                )  # fmt: skip
            ridge = float(spec.get("ridge", self.ridge))
            self._views[key] = GrAUCClient(d, ridge, self.index, self.guards.for_view())
        return self._views[key]

    def oof_part(self, parameters, config) -> tuple[np.ndarray, np.ndarray]:
        """The scores of this view's validation rows (pooled over a setting's folds), on the
        input scale: ``x'beta`` of the model as written out.  The score has no intercept,
        so the centering of standardized features would shift each fold's scores by its own
        constant and mix them when the folds are ranked together.

        Parameters
        ----------
        parameters : list of ndarray
            ``[beta]``, the fold's fit on the working scale, shape (p,).
        config : dict
            The instruction's config (its ``scale`` bytes, when the features are standardized).

        Returns
        -------
        scores : ndarray, shape (n_val,)
            The validation rows' scores.
        y : ndarray, shape (n_val,)
            Their outcomes.
        """
        (beta,) = parameters
        return self._input_score(self.data.x_test, beta, config), self.data.y_test

    @staticmethod
    def pool(parts) -> dict:
        """The AUC of a setting's out-of-fold scores, all folds ranked together, and the
        site's logistic recalibration of them (strategies/stats/calibration.py: ``cal_a``,
        ``cal_b`` and their covariance): two numbers and their precision, no row."""
        from strategies.stats.calibration import recalibrate

        scores = np.concatenate([s for s, _ in parts])
        y = np.concatenate([y for _, y in parts])
        n_pos, n_neg = int(np.sum(y == 1)), int(np.sum(y == 0))
        value = auc(scores, y) if n_pos and n_neg else float("nan")
        cal = recalibrate(scores, y)
        cov = cal["cov"]
        return {"auc": float(value), "n_pos": n_pos, "n_neg": n_neg,
                "cal_a": cal["a"], "cal_b": cal["b"], "cal_vaa": float(cov[0, 0]),
                "cal_vab": float(cov[0, 1]), "cal_vbb": float(cov[1, 1])}  # fmt: skip

    # -- helpers ----------------------------------------------------------------------------
    def _scaling(self, config) -> tuple[np.ndarray | None, np.ndarray | None]:
        p = self.data.n_features
        return unpack(config.get("center"), p), unpack(config.get("scale"), p)

    def _input_score(self, x: np.ndarray, beta: np.ndarray, config) -> np.ndarray:
        """``x'beta`` with the working-scale ``beta`` as written out (on the input scale,
        without the centring's constant): the score ``predict`` and a calibration use."""
        _, scale = self._scaling(config)
        return x @ beta if scale is None else (x / scale) @ beta

    def _transform(self, x: np.ndarray, config) -> np.ndarray:
        center, scale = self._scaling(config)
        if center is None:
            return x
        return (x - center) / scale

    def datafit(self, config) -> PairwiseLogistic:
        weight = site_weight(config, self.data.y_train.shape[0])
        key = (config.get("center"), config.get("scale"), weight)
        if key not in self._cache:
            x = self._transform(self.data.x_train, config)
            x_pos, x_neg = split_by_class(x, self.data.y_train)
            self._cache = {key: PairwiseLogistic(x_pos, x_neg, eta=self.ridge, weight=weight)}
        return self._cache[key]

    # -- Flower API ---------------------------------------------------------------------------
    def get_parameters(self, config):
        return [np.zeros(self.data.n_features)]

    def get_properties(self, config):
        """Registration: who this site is, where, its counts and per-feature sums (of a view
        of its rows when the config names one)."""
        if VIEW_FIELD in config:
            return batch.answer_properties(self, config)
        d = self.data
        self.guards.check_rows(d.site, d.y_train.shape[0], {"1": d.n_pos, "0": d.n_neg})
        return registration_properties(
            d.site,
            d.y_train.shape[0],
            self.index,
            d.x_train,
            d.feature_names,
            **grauc_meta(d.lat, d.lon, d.n_pos, d.n_neg),
            **{MOMENT_FLOOR: self.guards.moment_floor(d.n_features)},
        )

    # -- the hooks of strategies/client/site.py: SiteClient ------------------------------------
    @property
    def rows(self) -> int:
        return int(self.data.y_train.shape[0])

    @property
    def n_features(self) -> int:
        return self.data.n_features

    def local_fit(self, f, config):
        """The site's own fit; the start round's (``start``) with its ridge floored."""
        return start_fit(f) if config.get("start") else local_fit(f)

    def local_steps(self, f, start, steps, lr, proximal_mu, config):
        return local_descent(f, start, steps, lr, proximal_mu)

    def personal_fit(self, f, w, mu, config):
        return f.prox(w, mu)  # the datafit's exact prox

    def evaluate(self, parameters, config):
        """Test AUC (DeLong SE) of ``parameters[0]``; on the training data when the site has
        no test data (``split = train`` in the metrics)."""
        self._check_site(config)
        if config.get("task") == TASK:
            return batch.answer_evaluate(self, parameters, config)
        (beta,) = parameters
        if self.data.y_test.shape[0] > 0:
            x, y, split = self.data.x_test, self.data.y_test, "test"
        else:
            x, y, split = self.data.x_train, self.data.y_train, "train"
        scores = self._transform(x, config) @ beta
        a, se = delong(scores, y)
        n_pos = int(np.sum(y == 1))
        n_neg = int(np.sum(y == 0))
        metrics = {
            "site": self.data.site,
            "auc": a,
            "auc_se": se,
            "n_pos": n_pos,
            "n_neg": n_neg,
            "split": split,
        }
        x_pos, x_neg = split_by_class(self._transform(x, config), y)
        loss = PairwiseLogistic(x_pos, x_neg).value(beta) if n_pos and n_neg else 0.0
        if config.get("cal-a") is not None:  # a tuned fit's calibrated risks on these rows
            from strategies.stats.calibration import calibrated_evaluation

            raw = self._input_score(x, beta, config)
            floor = max(self.guards.min_rows, self.guards.min_class_rows)
            metrics.update(
                calibrated_evaluation(raw, y, float(config["cal-a"]), float(config["cal-b"]), floor)
            )
        if config.get("sandwich-at") is not None:  # inference = oracle, on the training data
            d = self.data
            self.guards.check_moments(d.site, d.y_train.shape[0], d.n_features, "a covariance")
            at = unpack(config["sandwich-at"], self.data.n_features)
            metrics.update(sandwich_metrics(self.datafit(config), at))
        return float(loss), int(y.shape[0]), metrics
