"""GrAUC-PFL's datafit (Flower-free): the pairwise AUC surrogate of a site, its gradient,
Lipschitz constant and proximal step, the damped Newton method that minimizes it, and the
individual (local-only) fit.  Notation follows docs/methods.md 1.1: a site holds ``n``
positives ``x_pos`` (``n x p``) and ``m`` negatives ``x_neg`` (``m x p``).  The ADMM local
step of both methods is :func:`strategies.solvers.local.admm_update`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace

import numpy as np
from scipy.special import expit

from strategies.solvers import pairsum

#: Elements of the ``n x m`` pair matrix held in memory at once (8 MiB per float64 array).
DEFAULT_CHUNK_ELEMENTS = 1 << 20

#: ``pairs = "auto"`` sums the pairs one by one up to this many (``n m``) and on the score
#: grid (:mod:`strategies.solvers.pairsum`) above it; the crossover measured in docs/performance.md.
GRID_PAIRS = 1 << 16

#: Points whose value and gradient a datafit keeps (:meth:`PairwiseLogistic.value_and_grad`).
MEMO_POINTS = 4

#: How a datafit sums over its pairs.
PAIR_MODES = ("auto", "exact", "grid")


def _row_chunks(n: int, m: int, chunk_elements: int):
    rows = max(1, chunk_elements // max(m, 1))
    for start in range(0, n, rows):
        yield start, min(n, start + rows)


@dataclass(frozen=True)
class PairwiseLogistic:
    """``f(b) = w [(1/(n m)) sum_ij log(1 + exp(-b^T (x+_i - x-_j))) + (eta/2) ||b||^2]``.

    Parameters
    ----------
    x_pos : ndarray, shape (n, p)
    x_neg : ndarray, shape (m, p)
    eta : float
        Ridge ``eta >= 0``.
    chunk_elements : int
        At most this many pair terms are held in memory at once.
    weight : float
        The site's weight ``w > 0`` in the fused objective (1: every site counts once;
        :func:`strategies.solvers.local.site_weight`); it scales the value, gradient, Hessian and
        Lipschitz bound (and the gradient's covariance by ``w^2``).
    pairs : {"auto", "exact", "grid"}
        How the pair sums are taken: ``"exact"`` one pair at a time (the reference),
        ``"grid"`` by grid summation in time linear in ``n + m`` (:mod:`strategies.solvers.pairsum`,
        relative error near 1e-13), ``"auto"`` exact up to :data:`GRID_PAIRS` pairs and on
        the grid above.

    Notes
    -----
    Exact value and gradient cost ``O(n m + (n + m) p)``: scores ``s+ = X+ b``,
    ``s- = X- b``, then the pair matrix ``W_ij = sigma(-(s+_i - s-_j))`` (chunked over rows),
    its row sums ``r`` and column sums ``k``, and ``grad = -(X+^T r - X-^T k) / (n m) + eta b``
    (docs/methods.md 1.1).  ``log(1 + exp(-t))`` is ``logaddexp(0, -t)``.  On the grid the
    same row and column sums cost ``O((n + m) q)``, the value is
    ``sum_ij h(t_ij) - sum_i s+_i r_i + sum_j s-_j k_j`` with the flat kernel ``h``, and the
    features are centred on their mean over both classes first (every quantity depends on
    the rows only through differences ``x+_i - x-_j``), which keeps the sums free of the
    features' offsets (docs/methods.md 1.11).
    """

    x_pos: np.ndarray
    x_neg: np.ndarray
    eta: float = 0.0
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS
    weight: float = 1.0
    pairs: str = "auto"

    def __post_init__(self) -> None:
        if self.pairs not in PAIR_MODES:
            raise ValueError(f"pairs: must be one of {', '.join(PAIR_MODES)}, got {self.pairs!r}")
        object.__setattr__(self, "x_pos", np.ascontiguousarray(self.x_pos, dtype=float))
        object.__setattr__(self, "x_neg", np.ascontiguousarray(self.x_neg, dtype=float))

    @property
    def n_pos(self) -> int:
        return self.x_pos.shape[0]

    @property
    def n_neg(self) -> int:
        return self.x_neg.shape[0]

    @property
    def empty(self) -> bool:
        """True when one class is missing: the surrogate is then only the ridge term."""
        return self.n_pos == 0 or self.n_neg == 0

    def value(self, b: np.ndarray) -> float:
        return self.value_and_grad(b, need_grad=False)[0]

    def grad(self, b: np.ndarray) -> np.ndarray:
        return self.value_and_grad(b)[1]

    def value_and_grad(self, b: np.ndarray, need_grad: bool = True):
        """``(f(b), grad f(b))``.  The last few points asked for are kept: a tuning's fits that
        share this datafit (a fold of a site at one ridge) all ask for the gradient at the same
        start.

        Parameters
        ----------
        b : ndarray, shape (p,)
            The point.
        need_grad : bool, optional
            Whether to compute the gradient too.

        Returns
        -------
        value : float
            ``f(b)``.
        grad : ndarray, shape (p,) or None
            ``grad f(b)``; None unless ``need_grad``.
        """
        b = np.asarray(b, dtype=float)
        key = (b.tobytes(), need_grad)
        memo, lock = self.once("_memo", lambda: ({}, threading.Lock()))
        with lock:
            hit = memo.get(key)
        if hit is not None:
            return hit[0], None if hit[1] is None else hit[1].copy()
        value, grad = self._value_and_grad(b, need_grad)
        with lock:
            memo[key] = (value, None if grad is None else grad.copy())
            while len(memo) > MEMO_POINTS:
                memo.pop(next(iter(memo)))
        return value, grad

    def _value_and_grad(self, b: np.ndarray, need_grad: bool):
        weight = self.weight
        ridge = 0.5 * self.eta * float(b @ b)
        if self.empty:
            return weight * ridge, weight * self.eta * b
        n, m = self.n_pos, self.n_neg
        grid = self._grid(b)
        if grid is not None:
            (xp, xn), (s_pos, s_neg), pairs = grid
            row = pairs.at_pos("sigmoid")
            col = pairs.at_neg("sigmoid")
            total = pairs.total("value") - float(s_pos @ row) + float(s_neg @ col)
            value = weight * (total / (n * m) + ridge)
            if not need_grad:
                return value, None
            grad = -(xp.T @ row - xn.T @ col) / (n * m) + self.eta * b
            return value, weight * grad
        s_pos = self.x_pos @ b
        s_neg = self.x_neg @ b
        total = 0.0
        row = np.empty(n) if need_grad else None
        col = np.zeros(m) if need_grad else None
        for i0, i1 in _row_chunks(n, m, self.chunk_elements):
            diff = s_pos[i0:i1, None] - s_neg[None, :]
            total += float(np.logaddexp(0.0, -diff).sum())
            if need_grad:
                w = expit(-diff)
                row[i0:i1] = w.sum(axis=1)
                col += w.sum(axis=0)
        value = weight * (total / (n * m) + ridge)
        if not need_grad:
            return value, None
        grad = -(self.x_pos.T @ row - self.x_neg.T @ col) / (n * m) + self.eta * b
        return value, weight * grad

    def hessian(self, b: np.ndarray) -> np.ndarray:
        """``w [(1/(n m)) sum_ij sigma(t_ij) sigma(-t_ij) d_ij d_ij^T + eta I]``.

        Cost ``O(n m p + (n + m) p^2)``, chunked like the gradient.
        """
        b = np.asarray(b, dtype=float)
        p = b.shape[0]
        h = self.eta * np.eye(p)
        if self.empty:
            return self.weight * h
        n, m = self.n_pos, self.n_neg
        grid = self._grid(b)
        if grid is not None:
            (xp, xn), _, pairs = grid
            row = pairs.at_pos("curvature")
            col = pairs.at_neg("curvature")
            cross = np.reshape(pairs.total("curvature", xp, xn), (p, p))
            a = (xp * row[:, None]).T @ xp + (xn * col[:, None]).T @ xn
            return self.weight * (h + (a - cross - cross.T) / (n * m))
        s_pos = self.x_pos @ b
        s_neg = self.x_neg @ b
        row = np.empty(n)
        col = np.zeros(m)
        cross = np.zeros((p, p))
        for i0, i1 in _row_chunks(n, m, self.chunk_elements):
            t = s_pos[i0:i1, None] - s_neg[None, :]
            w = expit(t) * expit(-t)
            row[i0:i1] = w.sum(axis=1)
            col += w.sum(axis=0)
            cross += self.x_pos[i0:i1].T @ (w @ self.x_neg)
        a = (self.x_pos * row[:, None]).T @ self.x_pos + (self.x_neg * col[:, None]).T @ self.x_neg
        return self.weight * (h + (a - cross - cross.T) / (n * m))

    def hajek(self, b: np.ndarray) -> np.ndarray:
        """The estimated covariance of the data term's gradient at ``b`` from its Hájek
        projection (a two-sample U-statistic): ``S10 / n + S01 / m``.

        Notes
        -----
        With ``psi_ij = -sigma(-t_ij) d_ij`` the gradient of pair ``(i, j)``'s loss, the
        per-case averages over the other class are ``a_i = (1/m) sum_j psi_ij`` (each positive)
        and ``c_j = (1/n) sum_i psi_ij`` (each negative); ``S10`` and ``S01`` are their sample
        covariances (divisor ``n - 1``, ``m - 1``; zero for a single case), as DeLong's
        variance of the AUC (docs/methods.md 1.10).  The ridge is not random and adds nothing.
        Cost ``O(n m p)``, chunked like the gradient.
        """
        b = np.asarray(b, dtype=float)
        p = b.shape[0]
        if self.empty:
            return np.zeros((p, p))
        n, m = self.n_pos, self.n_neg
        grid = self._grid(b)
        if grid is not None:
            (xp, xn), _, pairs = grid
            row = pairs.at_pos("sigmoid")
            col = pairs.at_neg("sigmoid")
            a = -(row[:, None] * xp - pairs.at_pos("sigmoid", xn).reshape(n, p)) / m
            c = (col[:, None] * xn - pairs.at_neg("sigmoid", xp).reshape(m, p)) / n
            return self.weight**2 * (_cov(a, p) / n + _cov(c, p) / m)
        s_pos = self.x_pos @ b
        s_neg = self.x_neg @ b
        a = np.empty((n, p))
        c = np.zeros((m, p))
        col = np.zeros(m)
        for i0, i1 in _row_chunks(n, m, self.chunk_elements):
            w = expit(-(s_pos[i0:i1, None] - s_neg[None, :]))
            a[i0:i1] = -(w.sum(axis=1)[:, None] * self.x_pos[i0:i1] - w @ self.x_neg) / m
            c -= w.T @ self.x_pos[i0:i1]
            col += w.sum(axis=0)
        c = (c + col[:, None] * self.x_neg) / n
        return self.weight**2 * (_cov(a, p) / n + _cov(c, p) / m)

    def uses_grid(self) -> bool:
        """True when the pair sums go on the score grid (``pairs`` and the site's size)."""
        if self.empty or self.pairs == "exact":
            return False
        return self.pairs == "grid" or self.n_pos * self.n_neg > GRID_PAIRS

    def __getstate__(self) -> dict:
        """Pickled without the kept gradients and their lock (computed again on demand)."""
        return {k: v for k, v in self.__dict__.items() if k != "_memo"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def once(self, name: str, compute):
        """``compute()`` the first time ``name`` is asked for, the kept result after: the data
        never change, so whatever depends only on them is computed once per datafit.

        Parameters
        ----------
        name : str
            The attribute the result is kept under.
        compute : callable
            ``compute()`` returns the result.

        Returns
        -------
        object
            The kept result.
        """
        if name not in self.__dict__:
            object.__setattr__(self, name, compute())
        return self.__dict__[name]

    def _centered(self) -> tuple[np.ndarray, np.ndarray]:
        """Both classes' features less their joint mean (computed once per datafit)."""

        def center():
            mean = (self.x_pos.sum(axis=0) + self.x_neg.sum(axis=0)) / (self.n_pos + self.n_neg)
            return self.x_pos - mean, self.x_neg - mean

        return self.once("_xc", center)

    def _grid(self, b: np.ndarray):
        """``((X+, X-) centred, (s+, s-), ScoreGrid)`` at ``b``, or None for the pair loop
        (``pairs``, the site's size, or scores spread too wide for a grid)."""
        if not self.uses_grid():
            return None
        xp, xn = self._centered()
        s_pos, s_neg = xp @ b, xn @ b
        pairs = pairsum.score_grid(s_pos, s_neg)
        return None if pairs is None else ((xp, xn), (s_pos, s_neg), pairs)

    def prox(self, center: np.ndarray, c: float, x0: np.ndarray | None = None) -> np.ndarray:
        """``argmin_b f(b) + (c/2) ||b - center||^2`` by damped Newton, to machine precision
        (:func:`newton_minimize`).

        Parameters
        ----------
        center : ndarray, shape (p,)
            The proximal term's center.
        c : float
            The proximal term's curvature.
        x0 : ndarray, shape (p,), optional
            The start (default ``center``).

        Returns
        -------
        ndarray, shape (p,)
            The minimizer.
        """
        start = center if x0 is None else x0
        return newton_minimize(self, start, c=c, center=center)[0]

    def lipschitz(self) -> float:
        """``mu = w [lambda_max((1/(4 n m)) sum_ij d_ij d_ij^T) + eta]`` in ``O((n+m) p^2)``.

        Notes
        -----
        ``sum_ij d d^T = m X+^T X+ + n X-^T X- - S+ S-^T - S- S+^T`` with ``S+ = sum_i x+_i``
        (docs/methods.md 1.1; the paper's ``mu_z``).
        """
        return self.once("_mu", self._lipschitz)

    def _lipschitz(self) -> float:
        if self.empty:
            return self.weight * float(self.eta)
        n, m = self.n_pos, self.n_neg
        s_pos = self.x_pos.sum(axis=0)
        s_neg = self.x_neg.sum(axis=0)
        outer = np.outer(s_pos, s_neg)
        mat = m * (self.x_pos.T @ self.x_pos) + n * (self.x_neg.T @ self.x_neg) - outer - outer.T
        top = float(np.linalg.eigvalsh(mat / (4.0 * n * m))[-1])
        return self.weight * (top + float(self.eta))


def _cov(rows: np.ndarray, p: int) -> np.ndarray:
    """Sample covariance of the rows (divisor ``N - 1``; zero for a single row)."""
    if rows.shape[0] < 2:
        return np.zeros((p, p))
    return np.cov(rows, rowvar=False, ddof=1).reshape(p, p)


def split_by_class(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows of ``x`` by class.

    Parameters
    ----------
    x : ndarray, shape (N, p)
        The features.
    y : ndarray, shape (N,)
        The outcomes, 0 or 1.

    Returns
    -------
    x_pos : ndarray, shape (n, p)
        The rows with ``y == 1``.
    x_neg : ndarray, shape (m, p)
        The rows with ``y == 0``.
    """
    y = np.asarray(y)
    return x[y == 1], x[y == 0]


def newton_minimize(
    f: PairwiseLogistic,
    x0: np.ndarray,
    c: float = 0.0,
    center: np.ndarray | None = None,
    gtol: float = 1e-11,
    max_iter: int = 100,
) -> tuple[np.ndarray, int]:
    """Minimize ``h(b) = f(b) + (c/2) ||b - center||^2`` by damped Newton (Armijo backtracking).

    Stops when ``||grad h||_inf <= gtol * max(1, ||grad h(x0)||_inf)`` or when a step no
    longer decreases ``h`` (the minimum to machine precision).  With ``c = 0`` and ``f`` not
    strongly convex (separable data, ``eta = 0``) the minimizer may not exist: the iteration
    then stops at ``max_iter``.

    Parameters
    ----------
    f : PairwiseLogistic
        The datafit.
    x0 : ndarray, shape (p,)
        The start.
    c : float, optional
        The proximal term's curvature (0: none).
    center : ndarray, shape (p,), optional
        The proximal term's center (default zeros).
    gtol : float, optional
        The relative gradient tolerance.
    max_iter : int, optional
        The most Newton steps.

    Returns
    -------
    b : ndarray, shape (p,)
        The minimizer.
    iterations : int
        The Newton steps taken.
    """
    b = np.array(x0, dtype=float)
    center = np.zeros_like(b) if center is None else np.asarray(center, dtype=float)
    p = b.shape[0]

    def h_val(x):
        return f.value(x) + 0.5 * c * float((x - center) @ (x - center))

    val, g = f.value_and_grad(b)
    val += 0.5 * c * float((b - center) @ (b - center))
    g = g + c * (b - center)
    g0 = max(1.0, float(np.max(np.abs(g)))) if p else 1.0
    it = 0
    for it in range(1, max_iter + 1):
        if p == 0 or np.max(np.abs(g)) <= gtol * g0:
            return b, it - 1
        hess = f.hessian(b) + c * np.eye(p)
        try:
            step = -np.linalg.solve(hess, g)
        except np.linalg.LinAlgError:
            step = -np.linalg.lstsq(hess, g, rcond=None)[0]
        slope = float(g @ step)
        if slope >= 0:  # not a descent direction (numerically singular Hessian)
            step, slope = -g, -float(g @ g)
        t = 1.0
        while True:
            cand = b + t * step
            cand_val = h_val(cand)
            if cand_val <= val + 1e-4 * t * slope or t < 1e-12:
                break
            t *= 0.5
        if t < 1e-12 and cand_val >= val:
            return b, it  # no further decrease: at the minimum to machine precision
        b = cand
        if np.max(np.abs(t * step)) <= 1e-14 * (1.0 + np.max(np.abs(b))):
            return b, it  # the step is below machine precision: converged
        val, g = f.value_and_grad(b)
        val += 0.5 * c * float((b - center) @ (b - center))
        g = g + c * (b - center)
    return b, it


def local_fit(f: PairwiseLogistic, x0: np.ndarray | None = None) -> np.ndarray:
    """``argmin_b f(b)``: the individual (local-only) fit.

    Parameters
    ----------
    f : PairwiseLogistic
        The site's datafit.
    x0 : ndarray, shape (p,), optional
        The start; without it, from zeros, computed once per datafit (a tuning's fits at one
        fold and ridge share it).

    Returns
    -------
    ndarray, shape (p,)
        The site's own fit.
    """
    if x0 is not None:
        return newton_minimize(f, x0)[0]
    p = f.x_pos.shape[1]
    return f.once("_local", lambda: newton_minimize(f, np.zeros(p))[0]).copy()


#: The start round's floor on a site's ridge, as a share of the largest eigenvalue of its
#: pairwise second moments' curvature bound (docs/methods.md 1.3).
START_RIDGE = 0.01


def start_fit(f: PairwiseLogistic) -> np.ndarray:
    """A site's start (``init = local``): its own fit with the ridge raised to at least
    ``START_RIDGE`` times ``lambda_max((1/(4 n m)) sum_ij d_ij d_ij^T)``.  Without the
    floor a site whose classes separate has no finite fit, and a nearly separable one a
    fit far out where the surrogate is flat; with it the start is finite and well inside
    the region where the fused optimum lies.  Only the start: the fit minimizes the site's
    own loss."""

    def fit():
        bound = f.lipschitz() / f.weight - f.eta
        return local_fit(replace(f, eta=max(f.eta, START_RIDGE * bound)))

    return f.once("_start", fit).copy()
