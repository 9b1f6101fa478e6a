"""RowFed's numerical core (Flower-free): datafit, local steps, problem, reference loop.

The SROF objective (docs/methods.md 2.2) is::

    F(Theta) = sum_m (1/(2 n_m)) ||Y_m - X_m Theta_m||_F^2
               + sum_j sum_{(m,m') in G} P_lam1(||theta_m(j) - theta_m'(j)||_2)     (fusion)
               + sum_m sum_j P_lam2(||theta_m(j)||_2)  or  sum_{m,j,k} P_lam2(|theta_mjk|)

with ``Theta`` stacked as an array of shape ``(M, p, q)``.  The penalty side is a
:class:`strategies.solvers.admm.Problem` with two splits, in this order:

- ``problem.splits[FUSION]``: the signed incidence matrix of ``G`` (all pairs by default),
  grouped by rows ``theta_m(j)`` (``"row"``), or by whole matrices (``"block"``, PerFL-LSMA);
- ``problem.splits[SPARSITY]``: the identity ``I_M``, grouped entrywise or by rows.

One round of linearized ADMM with partial participation (docs/methods.md 2.3) is, with the
server's state ``(Theta, delta, gamma, rho)`` produced by
``init_state(problem, Theta0, rho, threshold=True)``::

    Theta_tilde = global_component(problem, state, c)                      (server, step 3)
    Theta_m     <- local_step(f_m, Theta_tilde_m, Theta_m, c_m)  for m in S  (clients, step 4)
    state       <- server_update(problem, state, Theta)          (server, steps 1-2 of t+1)

:func:`fit_rowfed` is that loop in plain numpy (the reference the Flower strategy must
reproduce).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.linalg import cho_factor, cho_solve

from strategies.solvers.admm import (
    AdmmState,
    History,
    Problem,
    global_component,
    init_state,
    server_update,
)
from strategies.solvers.local import LOCAL_SOLVERS, curvature, local_step
from strategies.solvers.penalties import Penalty
from strategies.solvers.problems import (  # noqa: F401 - the penalty side, defined once there
    FUSION,
    SPARSITIES,
    SPARSITY,
    build_problem,
    degrees_of_freedom,
    fitted_structure,
    gic,
)

INITS = ("ridge", "nonfed")


# ----------------------------------------------------------------------------------------
# Datafit
# ----------------------------------------------------------------------------------------
class LocalLeastSquares:
    """One client's multi-response least-squares loss and its local solvers.

    Parameters
    ----------
    x : ndarray, shape (n, p)
        Design ``X_m``.
    y : ndarray, shape (n, q) or (n,)
        Responses ``Y_m`` (a vector is read as ``q = 1``).

    Notes
    -----
    ``f(Theta) = (w/(2n)) ||Y - X Theta||_F^2`` (docs/methods.md 2.2) with gradient
    ``grad f(Theta) = -w X^T (Y - X Theta) / n = G Theta - w X^T Y / n`` where
    ``G = w X^T X / n``, and Lipschitz constant ``L = lambda_max(G)``; the weight ``w`` is 1
    unless the fused objective weights clients by their rows
    (:func:`strategies.solvers.local.site_weight`).  Only ``G``, ``w X^T Y / n`` and ``||Y||_F^2``
    are kept after construction (besides ``x`` and ``y`` themselves).
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, weight: float = 1.0) -> None:
        x = np.asarray(x, dtype=float)
        y = np.asarray(y, dtype=float)
        if y.ndim == 1:
            y = y[:, None]
        if x.ndim != 2 or y.ndim != 2 or x.shape[0] != y.shape[0]:
            raise ValueError(f"x, y: need shapes (n, p) and (n, q), got {x.shape}, {y.shape}")
        if x.shape[0] == 0:
            raise ValueError("x: a client needs at least one sample")
        self.x = x
        self.y = y
        n = x.shape[0]
        self.weight = float(weight)
        self.gram = self.weight * (x.T @ x) / n
        self.xty = self.weight * (x.T @ y) / n
        self._lipschitz: float | None = None
        self._chol: tuple[float, tuple] | None = None  # (c, cho_factor(G + c I))

    @property
    def n_samples(self) -> int:
        return self.x.shape[0]

    @property
    def n_features(self) -> int:
        return self.x.shape[1]

    @property
    def n_responses(self) -> int:
        return self.y.shape[1]

    def rss(self, theta: np.ndarray) -> float:
        """Residual sum of squares ``||Y - X Theta||_F^2`` (what a client uploads for GIC)."""
        r = self.y - self.x @ theta
        return float(np.sum(r * r))

    def value(self, theta: np.ndarray) -> float:
        """``f(Theta) = w ||Y - X Theta||_F^2 / (2n)``; ``theta`` of shape ``(p, q)``."""
        return 0.5 * self.weight * self.rss(theta) / self.n_samples

    def grad(self, theta: np.ndarray) -> np.ndarray:
        """``grad f(Theta) = -X^T (Y - X Theta) / n``, shape ``(p, q)``."""
        return self.gram @ theta - self.xty

    def hessian(self, theta: np.ndarray | None = None) -> np.ndarray:
        """``X^T X / n``: the Hessian acting on each column of ``Theta`` (constant)."""
        return self.gram

    def lipschitz(self) -> float:
        """``L = lambda_max(X^T X) / n``, the Lipschitz constant of ``grad f`` (cached)."""
        if self._lipschitz is None:
            p = self.n_features
            self._lipschitz = float(np.linalg.eigvalsh(self.gram)[-1]) if p else 0.0
        return self._lipschitz

    def _factor(self, c: float) -> tuple:
        if self._chol is None or self._chol[0] != c:
            p = self.n_features
            self._chol = (c, cho_factor(self.gram + c * np.eye(p), lower=True))
        return self._chol[1]

    def prox(self, theta_tilde: np.ndarray, c: float, x0: np.ndarray | None = None) -> np.ndarray:
        """Exact local step ``argmin_T f(T) + (c/2) ||T - Theta_tilde||_F^2`` (closed form).

        Parameters
        ----------
        theta_tilde : ndarray, shape (p, q)
            ``Theta_tilde``, the point the proximal term pulls towards.
        c : float
            The step's curvature, ``> 0``.
        x0 : ndarray, shape (p, q), optional
            The start of an iterative step (:func:`strategies.solvers.local.local_step` passes
            the client's previous coefficients); not needed: the step has a closed form.

        Returns
        -------
        ndarray, shape (p, q)

        Notes
        -----
        The first-order condition ``G T - X^T Y / n + c (T - Theta_tilde) = 0`` gives
        ``T = (X^T X / n + c I)^{-1} (X^T Y / n + c Theta_tilde)``; the Cholesky factor of
        ``X^T X / n + c I`` is cached for the last ``c`` (it changes only with a ``rho``
        schedule).  With ``Theta_tilde = 0`` this is ridge regression with penalty
        ``(c/2)||T||^2``.
        """
        if c <= 0:
            raise ValueError(f"c: the prox step needs c > 0, got {c}")
        return cho_solve(self._factor(float(c)), self.xty + c * np.asarray(theta_tilde))

    def local_fit(
        self,
        penalty: Penalty,
        lam2: float,
        sparsity: str = "entry",
        theta0: np.ndarray | None = None,
        tol: float = 1e-10,
        max_iter: int = 20000,
        anchor: np.ndarray | None = None,
        mu: float = 0.0,
    ) -> np.ndarray:
        """The NonFed fit ``argmin_T f(T) + sum P_lam2`` (entrywise or by rows); with
        ``anchor`` and ``mu > 0``, plus ``(mu/2) ||T - anchor||_F^2`` (Ditto's personal
        model around the global ``anchor``).

        Parameters
        ----------
        penalty : Penalty
        lam2 : float
            Sparsity level.
        sparsity : {"entry", "row"}
            ``sum_{j,k} P(|T_jk|)`` or ``sum_j P(||T_j||_2)``.
        theta0 : ndarray, shape (p, q), optional
            Start (zeros by default).
        tol : float
            Stop when ``||T_new - T||_F <= tol max(1, ||T||_F)``.
        max_iter : int
        anchor : ndarray, shape (p, q), optional
            The centre of the proximal term (zeros by default): Ditto's global model.
        mu : float, optional
            The proximal term's weight (0: no term).

        Returns
        -------
        ndarray, shape (p, q)

        Notes
        -----
        Proximal gradient with step ``1/rho``: ``T <- prox_{P/rho}(Z - grad f(Z)/rho)``,
        ``rho = L`` (doubled until ``penalty.check_rho(rho)`` passes for MCP/SCAD).  Convex
        penalties use FISTA (Beck & Teboulle 2009) with the gradient-based adaptive restart of
        O'Donoghue & Candes (2015); non-convex ones plain proximal gradient (``Z = T``), which
        decreases the objective monotonically to a stationary point (docs/methods.md 2.6 NonFed).
        """
        if sparsity not in SPARSITIES:
            raise ValueError(f"sparsity: must be one of {SPARSITIES}, got {sparsity!r}")
        group = sparsity == "row"
        p, q = self.n_features, self.n_responses
        theta = np.zeros((p, q)) if theta0 is None else np.array(theta0, dtype=float)
        center = np.zeros((p, q)) if anchor is None else np.asarray(anchor, dtype=float)
        rho = max(self.lipschitz() + mu, 1e-12)
        while True:
            try:
                penalty.check_rho(rho)
                break
            except ValueError:
                rho *= 2.0
        accelerate = penalty.convex
        z = theta.copy()
        t = 1.0
        for _ in range(max_iter):
            grad = self.grad(z) + mu * (z - center) if mu > 0 else self.grad(z)
            new = penalty.threshold(z - grad / rho, lam2, rho, group)
            change = np.linalg.norm(new - theta)
            if accelerate:
                if np.sum((z - new) * (new - theta)) > 0:  # restart momentum
                    t = 1.0
                    z = new
                else:
                    t_new = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * t * t))
                    z = new + ((t - 1.0) / t_new) * (new - theta)
                    t = t_new
            else:
                z = new
            theta = new
            if change <= tol * max(1.0, np.linalg.norm(theta)):
                break
        return theta


# ----------------------------------------------------------------------------------------
# Objective
# ----------------------------------------------------------------------------------------
def objective(datafits: Sequence[LocalLeastSquares], problem: Problem, theta: np.ndarray) -> float:
    """``F(Theta) = sum_m f_m(Theta_m) + sum_k P_k(A_k Theta)`` (docs/methods.md 2.2).

    Parameters
    ----------
    datafits : sequence of LocalLeastSquares, length M
        Each client's ``f_m``.
    problem : Problem
        The penalty side: its splits' ``P_k`` and ``A_k``.
    theta : ndarray, shape (M, p, q)
        ``Theta``.

    Returns
    -------
    float
    """
    loss = sum(f.value(t) for f, t in zip(datafits, theta, strict=True))
    return float(loss + problem.penalty_value(theta))


def start_fit(
    datafits: Sequence[LocalLeastSquares],
    problem: Problem | None = None,
    method: str = "ridge",
    ridge: float = 1e-3,
) -> np.ndarray:
    """Per-client ("oracle") initial estimates, shape ``(M, p, q)`` (docs/methods.md 2.3).

    Parameters
    ----------
    datafits : sequence of LocalLeastSquares
    problem : Problem, optional
        Needed for ``method="nonfed"`` (its sparsity split gives penalty, ``lam2``, grouping).
    method : {"ridge", "nonfed"}
        ``ridge`` (default **[choice]**): ``(X^T X/n + kappa I)^{-1} X^T Y / n``, defined
        also when ``p > n_m``; ``nonfed``: :meth:`LocalLeastSquares.local_fit`.
    ridge : float
        ``kappa`` on the scale of ``X^T X / n``.
    """
    if method == "ridge":
        return np.stack([f.prox(np.zeros((f.n_features, f.n_responses)), ridge) for f in datafits])
    if method == "nonfed":
        if problem is None:
            raise ValueError("problem: needed for method='nonfed'")
        s = problem.splits[SPARSITY]
        return np.stack(
            [f.local_fit(s.penalty, float(s.lam[m]), s.grouping) for m, f in enumerate(datafits)]
        )
    raise ValueError(f"method: must be one of {INITS}, got {method!r}")


# ----------------------------------------------------------------------------------------
# Reference loop
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RowFedResult:
    """Output of :func:`fit_rowfed`.

    ``theta`` (``(M, p, q)``) is ``state.beta``; ``state`` holds ``delta`` (exact zeros:
    fused rows and sparse entries) and the duals; ``history.rows`` has one dict per round
    (``round, objective, primal_residual, dual_residual, rho, n_participants``).
    """

    theta: np.ndarray
    state: AdmmState
    history: History
    converged: bool

    @property
    def n_rounds(self) -> int:
        return self.state.round


def fit_rowfed(
    datafits: Sequence[LocalLeastSquares],
    problem: Problem,
    rho: float,
    solver: str = "linearized",
    participation: float = 1.0,
    seed: int = 0,
    alpha: float = 1.0,
    tol: float = 1e-6,
    max_rounds: int = 5000,
    theta0: np.ndarray | None = None,
    init: str = "ridge",
    record_objective: bool = True,
) -> RowFedResult:
    """RowFed: linearized ADMM with seeded partial participation (docs/methods.md 2.3).

    Parameters
    ----------
    datafits : sequence of LocalLeastSquares, length M
    problem : Problem
        From :func:`build_problem` (or any two-split problem over ``M`` sites).
    rho : float
        Initial ADMM penalty.
    solver : {"linearized", "prox"}
        Local step: one gradient step (the paper's) or the exact prox step.
    participation : float in (0, 1]
        ``pi``: each client takes part in a round independently with probability ``pi``,
        drawn from ``numpy.random.default_rng(seed)``.
    seed : int
    alpha : float >= 1
        ``rho <- alpha rho`` after every round (curvatures recomputed each round).
    tol : float
        Boyd's absolute and relative tolerances on the primal/dual residuals.
    max_rounds : int
    theta0 : ndarray, shape (M, p, q), optional
        Start; by default :func:`start_fit` with ``method=init``.
    init : {"ridge", "nonfed"}
    record_objective : bool
        Evaluate ``F(Theta)`` every round for the history (``nan`` otherwise).

    Returns
    -------
    RowFedResult

    Notes
    -----
    Round order: ``init_state(threshold=True)`` does steps 1-2 of round 0 on ``Theta^0``;
    every round then computes ``Theta_tilde`` (step 3), the drawn clients' local steps
    (step 4; the others, and everybody in a round where nobody is drawn, keep ``Theta_m``),
    and the server's thresholds and dual update on the new ``Theta`` (steps 1-2 of the next
    round).  Stopping **[choice]**: the residuals are within tolerance in consecutive rounds
    during which every client has taken at least one local step (with ``pi = 1``: the first
    such round), so that a client that happened to sit out cannot fake convergence.
    """
    if solver not in LOCAL_SOLVERS:
        raise ValueError(f"solver: must be one of {LOCAL_SOLVERS}, got {solver!r}")
    if not 0.0 < participation <= 1.0:
        raise ValueError(f"participation: must lie in (0, 1], got {participation}")
    if not rho > 0:
        raise ValueError(f"rho: must be > 0, got {rho}")
    if not alpha >= 1.0:
        raise ValueError(f"alpha: must be >= 1, got {alpha}")
    n_sites = problem.n_sites
    if len(datafits) != n_sites:
        raise ValueError(f"datafits: need {n_sites} clients, got {len(datafits)}")
    for s in problem.splits:
        s.penalty.check_rho(rho)
    if theta0 is None:
        theta0 = start_fit(datafits, problem, method=init)
    theta0 = np.array(theta0, dtype=float)
    shape = (n_sites, datafits[0].n_features, datafits[0].n_responses)
    if theta0.shape != shape:
        raise ValueError(f"theta0: need shape {shape}, got {theta0.shape}")

    rng = np.random.default_rng(seed)
    sigma_max = problem.sigma_max()
    lipschitz = np.array([f.lipschitz() for f in datafits])
    state = init_state(problem, theta0, rho, threshold=True)
    history = History()
    seen = np.zeros(n_sites, dtype=bool)
    converged = False
    for _ in range(max_rounds):
        c = curvature(solver, lipschitz, state.rho * sigma_max)
        if participation < 1.0:
            drawn = rng.random(n_sites) < participation
        else:
            drawn = np.ones(n_sites, dtype=bool)
        theta = state.beta.copy()
        if drawn.any():
            theta_tilde = global_component(problem, state, c)
            for m in np.flatnonzero(drawn):
                theta[m] = local_step(datafits[m], theta_tilde[m], state.beta[m], c[m], solver)
        rho_now = state.rho
        state, res = server_update(problem, state, theta, tol, tol, alpha, drawn)
        history.append(
            round=state.round,
            objective=objective(datafits, problem, state.beta) if record_objective else np.nan,
            primal_residual=res.primal,
            dual_residual=res.dual,
            rho=rho_now,
            n_participants=int(drawn.sum()),
        )
        if res.converged:
            seen |= drawn
            if seen.all():
                converged = True
                break
        else:
            seen[:] = False
    return RowFedResult(theta=state.beta, state=state, history=history, converged=converged)


# ----------------------------------------------------------------------------------------
# Fitted structure and GIC
# ----------------------------------------------------------------------------------------
def gic_of_fit(datafits: Sequence[LocalLeastSquares], problem: Problem, state: AdmmState) -> float:
    """GIC (docs/methods.md 2.5) of a fit: ``RSS`` summed over clients, ``df`` from
    :func:`fitted_structure`.

    Parameters
    ----------
    datafits : sequence of LocalLeastSquares, length M
        Each client's datafit.
    problem : Problem
        The fit's penalty side.
    state : AdmmState
        The fit's state: ``state.beta`` ``(M, p, q)`` and the splits' ``delta``.

    Returns
    -------
    float
    """
    labels, support = fitted_structure(problem, state)
    rss = sum(f.rss(t) for f, t in zip(datafits, state.beta, strict=True))
    n_total = sum(f.n_samples for f in datafits)
    _, p, q = state.beta.shape
    return gic(rss, n_total, p, q, problem.n_sites, degrees_of_freedom(labels, support))
