"""The server side that GrAUC-PFL and RowFed share: one site strategy for a fused penalty.

Both methods minimize ``sum_z f_z(beta_z) + penalty(A beta)`` over per-site coefficients
``beta_z`` (a vector for GrAUC-PFL, a ``p x q`` matrix for RowFed), with the penalty side an
:class:`strategies.solvers.admm.Problem`.  :class:`FusedSiteStrategy` owns everything that does not
depend on the loss:

- the algorithm's rounds, handed to one object (:mod:`strategies.server.rounds`): the
  ADMM round (``algorithm = "admm"``, :class:`~strategies.server.rounds.AdmmRounds`): each
  drawn site gets its ``[beta_z, pull_z]`` with the graph pull
  :meth:`FusedSiteStrategy.pull` and takes its local step
  (:func:`strategies.solvers.local.admm_update`), then the server's threshold and dual
  updates (:func:`strategies.solvers.admm.server_update`) and the stopping rule; or the
  proximal quasi-Newton round (``algorithm = "pqn"``,
  :class:`~strategies.server.rounds.QnRounds`): each site (each drawn site, with partial
  participation) returns its loss and gradient at the point sent, and the server advances
  :mod:`strategies.solvers.pqn`;
- the start round: each site fits alone (:meth:`FusedSiteStrategy.start_config`, the
  method's own fit) and its coefficients become its start (:meth:`_start_round`); the
  fit's rounds are counted after it;
- seeded partial participation, the round history, progress reports and checkpoints.

A method's subclass builds its problem in ``_setup`` and either calls :meth:`_start` with
its start or :meth:`_start_round`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, fields
from logging import INFO

import numpy as np
from flwr.common import FitIns, Parameters, Scalar, log
from flwr.server.client_proxy import ClientProxy

from ..errors import InputError
from ..solvers import admm, qnstate
from ..solvers.local import newton_shape
from .base import SiteStrategy
from .registry import EMPTY
from .rounds import AdmmRounds, QnRounds


@dataclass(frozen=True)
class FusedSettings:
    """What :class:`FusedSiteStrategy` reads of a method's settings, as one frozen record
    (both methods' configs name them alike: :meth:`of`).

    Parameters
    ----------
    algorithm : str
        ``"pqn"`` or ``"admm"``.
    rho, alpha : float
        ADMM penalty and its growth ``rho <- alpha rho`` per round.
    tol : float
        Stopping tolerance (ADMM: absolute and relative residual tolerance; pqn: relative
        objective gap, :func:`strategies.solvers.pqn._converged`).
    max_rounds : int
        Round limit of the method.
    participation : float
        Each site takes part in a round with this probability (seeded by ``seed``); below 1
        pqn runs its incremental form (:mod:`strategies.solvers.pqn`).
    seed : int
        The seed of the participation draws.
    local_solver : {"prox", "linearized"}
        The sites' ADMM local step.
    curvature : {"learned", "exact"}
        pqn's curvature models: learned from the sites' gradients, or the sites' Hessians.
    size_power : float
        Each site's loss is weighted by its rows to this power (0: equal; sent with every
        instruction: :meth:`work_config`).
    """

    algorithm: str = "pqn"
    rho: float = 1.0
    alpha: float = 1.0
    tol: float = 1e-6
    max_rounds: int = 300
    participation: float = 1.0
    seed: int = 0
    local_solver: str = "prox"
    curvature: str = "learned"
    size_power: float = 0.0

    def __post_init__(self) -> None:
        for name, kind in _KINDS.items():  # a config may give 1 for 1.0
            object.__setattr__(self, name, kind(getattr(self, name)))

    @classmethod
    def of(cls, cfg, **given) -> FusedSettings:
        """The record of a method's settings.

        Parameters
        ----------
        cfg : GrAUCConfig or RowFedConfig
            The method's settings; a field it lacks keeps the record's default.
        **given
            Fields taken as given instead of from ``cfg``.

        Returns
        -------
        FusedSettings
        """
        read = {f.name: getattr(cfg, f.name) for f in fields(cls) if hasattr(cfg, f.name)}
        return cls(**{**read, **given})


_KINDS = {"rho": float, "alpha": float, "tol": float, "max_rounds": int,
          "participation": float, "seed": int, "size_power": float}  # fmt: skip


class FusedSiteStrategy(SiteStrategy):
    """A per-site strategy for a fused penalty, solved by ADMM or by pqn.

    Parameters (keyword, besides :class:`~strategies.server.base.SiteStrategy`'s)
    ----------------------------------------------------------------------
    settings : FusedSettings
        The algorithm and its settings.
    progress : callable, optional
        ``progress(round, objective, residuals_or_step, elapsed)``.
    checkpoint, checkpoint_every, resume : str, int, str
        Server state written every ``checkpoint_every`` rounds to ``checkpoint``; ``resume``
        a checkpoint to start from.
    """

    #: ``B_z`` before site ``z``'s first gradient pair, as a multiple of the ``curvature``
    #: it reports with its first answer (a bound on its loss's Hessian).
    first_curvature = 1.0
    #: The pqn curvature model: ``"bfgs"`` or ``"secant"`` (exact for a quadratic loss).
    qn_model = "bfgs"
    #: With exact curvature, a site's first model is damped by this multiple of its mean
    #: curvature (:func:`strategies.solvers.qnstate.init_qn`; 0 for a quadratic loss).
    first_damping = 0.0
    #: The history column counting the sites that answered.
    count_column = "n_answered"
    #: ADMM starts from ``delta = threshold(A beta0)`` (True) or ``delta = A beta0``.
    threshold_start = False
    #: Whether the penalty fuses anything (a method without edges fits each site alone).
    fusing = True
    #: With pqn and a learned curvature model, each site also sends in the start round its
    #: gradient at zero coefficients, and its model learns from the pair (zero, its fit)
    #: before the first model step (for a quadratic loss the pair is exact: ``q`` columns
    #: of the Hessian's action, all of it when ``q >= p``).
    start_pair = False

    def __init__(
        self,
        n_sites: int,
        registry=None,
        *,
        standardize: str = "none",
        min_fit_fraction: float = 1.0,
        timeout: float | None = None,
        settings: FusedSettings = FusedSettings(),
        progress=None,
        checkpoint: str = "",
        checkpoint_every: int = 10,
        resume: str = "",
    ) -> None:
        super().__init__(n_sites, registry, standardize, min_fit_fraction, timeout)
        self.settings = settings
        self.n_drawn = n_sites
        self.progress = progress
        self.checkpoint = checkpoint
        self.checkpoint_every = int(checkpoint_every)
        self.resume = resume
        self.history = admm.History()
        #: the algorithm's rounds (:mod:`strategies.server.rounds`), from :meth:`_start`
        self.algo: AdmmRounds | QnRounds | None = None
        self.state: admm.AdmmState | None = None
        self.phase = "fit"  # "start" during the start round (:meth:`_start_round`)

    def moments_needed(self) -> str:
        """``curvature = exact`` (pqn's Newton answers) or ``inference = oracle`` (the
        refit's Hessians and covariances), when set."""
        cfg = getattr(self, "cfg", None)
        if self.settings.curvature == "exact":
            return "curvature = exact"
        if cfg is not None and getattr(cfg, "inference", "none") == "oracle":
            return "inference = oracle"
        return ""

    def work_config(self) -> dict:
        """The working scale, and the sites' weighting when ``size_power > 0`` (over the
        federation's sites: a node that registers later changes no weight)."""
        weights = self.registry.weight_config(self.settings.size_power, self.sites)
        return {**super().work_config(), **weights}

    # -- set-up -----------------------------------------------------------------------------
    def _set_problem(self, problem) -> None:
        """The penalty side (:class:`strategies.solvers.admm.Problem`) and its ``sigma_max``."""
        self.problem = problem
        self.target = problem  # what the fit minimizes (pqn with MCP/SCAD: see _start)
        self.sigma_max = problem.sigma_max()

    @property
    def _uses_qn(self) -> bool:
        """pqn, where there is a fused penalty (without one each site's fit is its own)."""
        return self.settings.algorithm == "pqn" and self.fusing

    def _start(self, beta0: np.ndarray, loss: np.ndarray | None = None) -> None:
        """ADMM state (and pqn state: :attr:`_uses_qn`) from ``beta0`` (working scale, sites
        in federation order) and the sites' losses there when known; resumes from ``resume``
        when set."""
        use_qn = self._uses_qn
        m = len(self.sites)
        self.rng = np.random.default_rng(self.settings.seed)
        self.loss = np.full(m, np.nan) if loss is None else np.array(loss, dtype=float)
        self.seen = np.zeros(m, dtype=bool)
        self.state = admm.init_state(self.problem, beta0, self.settings.rho, self.threshold_start)
        self.lla = use_qn and not self.target.convex
        if self.lla:
            # MCP/SCAD by pqn: the local linear approximation at the start (the paper's ADMM
            # starts there too), then at each accepted point
            self.problem = self.target.linearized(beta0)
        model = "exact" if self.settings.curvature == "exact" else self.qn_model
        # the line search needs every site's loss at one trial point: with partial
        # participation, and with exact curvature (each site's model checked on its own),
        # pqn takes its incremental form (strategies/solvers/pqn.py)
        incremental = self.settings.participation < 1.0 or model == "exact"
        if use_qn:
            qn = qnstate.init_qn(
                beta0, model=model, incremental=incremental, first_damping=self.first_damping
            )
            self.algo = QnRounds(self, qn)
        else:
            self.algo = AdmmRounds(self)
        if self.resume:
            self._load_checkpoint(self.resume)

    # -- the start round --------------------------------------------------------------------
    def start_config(self) -> dict:
        """The start round's instruction: the method's own fit of a site alone (``task =
        local``), whose coefficients become the site's start."""
        raise NotImplementedError

    def _start_round(self, shape: tuple[int, ...]) -> None:
        """Start from each site's own fit (coefficients of ``shape`` per site): a round in
        which the sites fit alone, asked again until every site has answered; then
        :meth:`_start` from their fits and their losses there.  With pqn each site answers
        at its fit as in a pqn round (its gradient, or its Newton answer with exact
        curvature) in the same message, so the start round is the fit's first round."""
        m = len(self.sites)
        self.start_fits = np.full((m, *shape), np.nan)
        self.loss = np.full(m, np.nan)
        self.start_answers: dict = {}
        self.phase = "start"

    def _then(self) -> str | None:
        """What a site sends after its fit in the start round: the first pqn answer at it
        (``gradient`` or ``newton``), or nothing (ADMM, or no fused penalty)."""
        if not self._uses_qn:
            return None
        return "newton" if self.settings.curvature == "exact" else "gradient"

    @property
    def _pairs_at_start(self) -> bool:
        """Whether the start answers carry the gradient at zero (:attr:`start_pair`)."""
        return self.start_pair and self._then() == "gradient"

    def _start_parts(self) -> tuple[tuple[int, ...], ...]:
        """The shapes of a start answer's parts: the fit; then, with pqn, the answer at it;
        then, with :attr:`start_pair`, the gradient at zero."""
        block = self.start_fits.shape[1:]
        then = self._then()
        if then is None:
            return (block,)
        parts = (block, newton_shape(block) if then == "newton" else block)
        return parts + ((block,) if self._pairs_at_start else ())

    def _start_instructions(self, by_site: dict) -> list[tuple[ClientProxy, FitIns]]:
        config = {**self.start_config(), **self.work_config()}
        then = self._then()
        if then is not None:
            config["then"] = then
            config["curvature"] = then == "gradient"  # the bound with the first gradient
        if self._pairs_at_start:
            config["origin"] = True
        waiting = np.isnan(self.start_fits.reshape(len(self.sites), -1)).any(axis=1)
        return [
            (by_site[s], FitIns(EMPTY, {**config, "site": s}))
            for z, s in enumerate(self.sites)
            if waiting[z] and s in by_site
        ]

    def _start_answers(self, answered: dict) -> dict[str, Scalar]:
        shapes = self._start_parts()
        ends = np.cumsum([int(np.prod(s, dtype=int)) for s in shapes])[:-1]
        for site, (proxy, res) in answered.items():
            z = self.site_index[site]
            parts = np.split(np.ravel(self.updates[site]), ends)
            parts = [part.reshape(s) for part, s in zip(parts, shapes, strict=True)]
            self.start_fits[z] = parts[0]
            self.loss[z] = float(res.metrics["loss"])
            if len(parts) > 1:
                self.start_answers[site] = (proxy, res, *parts[1:])
        if np.isnan(self.start_fits).any():
            return {}
        self._start(self.start_fits, self.loss)
        self.phase = "fit"
        if len(shapes) == 1:
            return {}
        pairs = {}  # the step (zero, the fit) and its gradient change; a zero fit is none
        if self._pairs_at_start:
            for site, (_, _, answer, origin) in self.start_answers.items():
                z = self.site_index[site]
                if np.any(self.start_fits[z]):
                    pairs[z] = (self.start_fits[z], answer - origin)
        # the answers at the start are the first pqn round's
        for site, (_, _, answer, *_) in self.start_answers.items():
            self.updates[site] = answer
        first = {site: (proxy, res) for site, (proxy, res, *_) in self.start_answers.items()}
        self.start_answers = {}
        return self.algo.aggregate(first, pairs)

    @property
    def rounds(self) -> int:
        """Communication rounds of the fit so far (registration excluded)."""
        if self.state is None:
            return 0
        return self.algo.rounds

    @property
    def qn(self) -> qnstate.QuasiNewtonState | None:
        """The pqn state, when the fit runs pqn (``None`` with ADMM or before the start)."""
        return self.algo.qn if isinstance(self.algo, QnRounds) else None

    def update_shape(self) -> tuple[int, ...] | None:
        """One array the shape of a site's coefficients: its own fit (the start round), new
        coefficients (ADMM) or a gradient (pqn); with exact curvature a Newton answer
        (:meth:`answer_shape`)."""
        if self.phase == "start":
            shapes = self._start_parts()
            if len(shapes) == 1:
                return shapes[0]
            return (sum(int(np.prod(s, dtype=int)) for s in shapes),)
        return self.answer_shape(self.state.beta.shape[1:]) if self.state is not None else None

    def answer_shape(self, block: tuple[int, ...]) -> tuple[int, ...]:
        """A fit answer's shape for coefficients of shape ``block``: ``[gradient | Hessian]``
        (:func:`strategies.solvers.local.newton_shape`) in pqn rounds with exact curvature, else
        ``block``."""
        if self.algo is None:
            return tuple(block)
        return self.algo.answer_shape(block)

    # -- the graph pull ---------------------------------------------------------------------
    def pull(self) -> np.ndarray:
        """``[Omega^T (gamma + rho (Omega beta - delta))]_z`` for every site
        (:func:`strategies.solvers.admm.pull`): what site ``z`` needs, with its own curvature
        ``c_z``, for its global component ``beta_z - pull_z / c_z``."""
        return admm.pull(self.problem, self.state)

    # -- instructions -----------------------------------------------------------------------
    def draw(self) -> np.ndarray:
        """This round's participants (bool, one per site): ``rng.random(Z) < participation``
        from ``numpy.random.default_rng(seed)``, or everyone."""
        m = len(self.sites)
        drawn = np.ones(m, dtype=bool)
        if self.settings.participation < 1.0:
            drawn = self.rng.random(m) < self.settings.participation
        self.n_drawn = int(drawn.sum())
        return drawn

    def round_size(self) -> int:
        """The sites drawn for this round (every site with full participation)."""
        return self.n_drawn

    def _instructions(self, clients: list[ClientProxy]) -> list[tuple[ClientProxy, FitIns]]:
        by_site = {self.registry.cid_to_site[c.cid]: c for c in clients}
        if self.phase == "start":
            return self._start_instructions(by_site)
        return self.algo.instructions(by_site)

    # -- aggregation ------------------------------------------------------------------------
    def _aggregate(self, server_round: int, answered: dict) -> tuple[Parameters, dict]:
        if self.phase == "start":
            return EMPTY, self._start_answers(answered)
        return EMPTY, self.algo.aggregate(answered)

    def _after_round(self, rnd: int, objective: float, res) -> None:
        if self.checkpoint and (rnd % self.checkpoint_every == 0 or self.done):
            self._save_checkpoint(self.checkpoint)
        if self.progress is not None:
            self.progress(rnd, objective, res, time.perf_counter() - self._t0)

    def release(self) -> None:
        """Drop what only further rounds would read (the sites' curvature models): a
        finished fit keeps its coefficients, its last model solution (whose fused
        structure the coefficients are read from), gradients and history.  A tuning's fold
        fits are released as they finish (docs/performance.md, "Memory")."""
        if self.algo is not None:
            self.algo.release()

    def coefficients_std(self) -> np.ndarray:
        if self.phase == "start":
            return self.start_fits
        return self.algo.estimate()

    def objective(self) -> float:
        """The objective at the last round (``nan`` before the first)."""
        return self.history.rows[-1]["objective"] if self.history.rows else float("nan")

    # -- checkpoints ------------------------------------------------------------------------
    def _save_checkpoint(self, path: str) -> None:
        """The whole server state (coefficients per site, delta, gamma, rho, round, the last
        loss per site, history, site order, scaling, the pqn state, the participation draws'
        generator) in one ``.npz``, written atomically."""
        extra = {
            "loss": self.loss,
            "sites": np.array(self.sites),
            "history": np.array(json.dumps(self.history.rows)),
        }
        if self.registry.center is not None:
            extra.update(center=self.registry.center, scale=self.registry.scale)
        extra.update(self.algo.arrays())
        extra["draws"] = np.array(json.dumps(self.rng.bit_generator.state))
        extra["size_power"] = np.array(self.settings.size_power)
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
        power, here = float(extra.get("size_power", 0.0)), self.settings.size_power
        if power != here:
            raise InputError(
                f"resume: the checkpoint weights the sites with size-power {power:g}, this "
                f"run with {here:g}"
            )
        self.algo.load({k[3:]: v for k, v in extra.items() if k.startswith("qn_")})
        if "draws" in extra:  # the participation draws go on where they stopped
            self.rng.bit_generator.state = json.loads(str(extra["draws"]))
        self.state = state
        self.loss = np.asarray(extra["loss"], dtype=float)
        self.history.rows = json.loads(str(extra["history"]))
        log(INFO, "resumed from %s at round %d", path, state.round)
