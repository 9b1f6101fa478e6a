"""GrAUC-PFL's datafit (Flower-free): the pairwise AUC surrogate of a site, its gradient,
Lipschitz constant and proximal step, the damped Newton method that minimizes it, and the
individual (local-only) fit.  Notation follows docs/methods.md 1.1: a site holds ``n``
positives ``x_pos`` (``n x p``) and ``m`` negatives ``x_neg`` (``m x p``).  The ADMM local
step of both methods is :func:`strategies.local.admm_update`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from scipy.special import expit

#: Elements of the ``n x m`` pair matrix held in memory at once (8 MiB per float64 array).
DEFAULT_CHUNK_ELEMENTS = 1 << 20


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
        :func:`strategies.local.site_weight`); it scales the value, gradient, Hessian and
        Lipschitz bound (and the gradient's covariance by ``w^2``).

    Notes
    -----
    Value and gradient cost ``O(n m + (n + m) p)``: scores ``s+ = X+ b``, ``s- = X- b``, then
    the pair matrix ``W_ij = sigma(-(s+_i - s-_j))`` (chunked over rows), its row sums ``r``
    and column sums ``k``, and ``grad = -(X+^T r - X-^T k) / (n m) + eta b``
    (docs/methods.md 1.1).  ``log(1 + exp(-t))`` is ``logaddexp(0, -t)``.
    """

    x_pos: np.ndarray
    x_neg: np.ndarray
    eta: float = 0.0
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS
    weight: float = 1.0

    def __post_init__(self) -> None:
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
        b = np.asarray(b, dtype=float)
        weight = self.weight
        ridge = 0.5 * self.eta * float(b @ b)
        if self.empty:
            return weight * ridge, weight * self.eta * b
        n, m = self.n_pos, self.n_neg
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
        s10 = np.cov(a, rowvar=False, ddof=1).reshape(p, p) if n > 1 else np.zeros((p, p))
        s01 = np.cov(c, rowvar=False, ddof=1).reshape(p, p) if m > 1 else np.zeros((p, p))
        return self.weight**2 * (s10 / n + s01 / m)

    def prox(self, center: np.ndarray, c: float, x0: np.ndarray | None = None) -> np.ndarray:
        """``argmin_b f(b) + (c/2) ||b - center||^2`` by damped Newton from ``x0`` (default
        ``center``), to machine precision (:func:`newton_minimize`)."""
        start = center if x0 is None else x0
        return newton_minimize(self, start, c=c, center=center)[0]

    def lipschitz(self) -> float:
        """``mu = w [lambda_max((1/(4 n m)) sum_ij d_ij d_ij^T) + eta]`` in ``O((n+m) p^2)``.

        Notes
        -----
        ``sum_ij d d^T = m X+^T X+ + n X-^T X- - S+ S-^T - S- S+^T`` with ``S+ = sum_i x+_i``
        (docs/methods.md 1.1; the paper's ``mu_z``).
        """
        cached = self.__dict__.get("_mu")
        if cached is not None:  # the data never change: computed once per datafit
            return cached
        object.__setattr__(self, "_mu", self._lipschitz())
        return self.__dict__["_mu"]

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


def split_by_class(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
    longer decreases ``h`` (the minimum to machine precision).  Returns ``(b, iterations)``.
    With ``c = 0`` and ``f`` not strongly convex (separable data, ``eta = 0``) the minimizer
    may not exist: the iteration then stops at ``max_iter``.
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
    """``argmin_b f(b)``: the individual (local-only) fit."""
    p = f.x_pos.shape[1]
    start = np.zeros(p) if x0 is None else x0
    return newton_minimize(f, start)[0]


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
    bound = f.lipschitz() / f.weight - f.eta
    return local_fit(replace(f, eta=max(f.eta, START_RIDGE * bound)))
