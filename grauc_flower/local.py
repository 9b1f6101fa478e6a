"""Local solvers for an institution's ADMM step (Flower-free).

Both solve (exactly or approximately) ``argmin_b f_z(b) + (c_z/2) ||b - beta_tilde_z||^2``
(METHODS.md A.4):

- ``linearized`` (the paper's): one gradient step at the previous ``beta_z``,
  ``beta_tilde_z - grad f_z(beta_z) / c_z`` with ``c_z = mu_z + rho lambda_max(L)``;
- ``prox``: the exact proximal step, by damped Newton, with ``c_z = rho lambda_max(L) (1+eps)``.
"""

from __future__ import annotations

import numpy as np

from .auc import PairwiseLogistic

LOCAL_SOLVERS = ("prox", "linearized")
#: Relative slack in the prox step's curvature: ``c = rho lambda_max(L) (1 + PROX_SLACK)``.
PROX_SLACK = 1e-6


def linearized_step(
    f: PairwiseLogistic, beta_tilde: np.ndarray, beta_prev: np.ndarray, c: float
) -> np.ndarray:
    """``beta_tilde - grad f(beta_prev) / c`` (one linearized ADMM step)."""
    return beta_tilde - f.grad(beta_prev) / c


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


def prox_step(
    f: PairwiseLogistic, beta_tilde: np.ndarray, c: float, x0: np.ndarray | None = None
) -> np.ndarray:
    """``argmin_b f(b) + (c/2) ||b - beta_tilde||^2`` (exact to machine precision)."""
    start = beta_tilde if x0 is None else x0
    return newton_minimize(f, start, c=c, center=beta_tilde)[0]


def local_fit(f: PairwiseLogistic, x0: np.ndarray | None = None) -> np.ndarray:
    """``argmin_b f(b)``: the individual (local-only) fit."""
    p = f.x_pos.shape[1]
    start = np.zeros(p) if x0 is None else x0
    return newton_minimize(f, start)[0]


def curvature(solver: str, mu: np.ndarray, rho: float, sigma_max: float) -> np.ndarray:
    """Per-site ``c_z``: ``mu_z + rho sigma_max`` (linearized) or ``rho sigma_max (1+eps)`` (prox).

    A site with no neighbours (``sigma_max == 0``) gets ``c_z = mu_z`` (linearized) or the
    ``rho (1+eps)`` (prox): its step is then its own local fit.
    """
    mu = np.asarray(mu, dtype=float)
    if solver == "linearized":
        return mu + rho * sigma_max
    if solver == "prox":
        base = sigma_max if sigma_max > 0 else 1.0
        return np.full_like(mu, rho * base * (1.0 + PROX_SLACK))
    raise ValueError(f"local-solver: must be one of {LOCAL_SOLVERS}, got {solver!r}")
