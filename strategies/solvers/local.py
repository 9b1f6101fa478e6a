"""A site's local ADMM step, written once for every datafit (Flower-free).

A *datafit* is a site's smooth loss ``f`` with

- ``value(b)`` and ``grad(b)``;
- ``lipschitz()``: a bound ``L`` on the curvature of ``f`` (the Lipschitz constant of its
  gradient);
- ``prox(center, c, x0=None)``: ``argmin_b f(b) + (c/2) ||b - center||^2`` (exactly, or to
  machine precision; ``x0`` is a start for iterative solvers);
- ``hessian(b)``: the ``p x p`` Hessian (for a matrix block ``b`` of shape ``(p, q)``: the
  one acting on each column), only for the Newton answers (:func:`newton_answer`).

The AUC surrogate of GrAUC-PFL (:class:`grauc_flower.datafit.PairwiseLogistic`) and the
least-squares loss of RowFed (:class:`rowfed_flower.datafit.LocalLeastSquares`) both are.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

#: The local solvers: the exact proximal step, or the paper's one linearized gradient step.
LOCAL_SOLVERS = ("prox", "linearized")
#: Relative slack in the prox step's curvature: ``c = rho sigma_max (1 + PROX_SLACK)``.
PROX_SLACK = 1e-6


class Datafit(Protocol):
    """What the local solvers need of a site's loss."""

    def value(self, b: np.ndarray) -> float: ...

    def grad(self, b: np.ndarray) -> np.ndarray: ...

    def lipschitz(self) -> float: ...

    def prox(self, center: np.ndarray, c: float, x0: np.ndarray | None = None) -> np.ndarray:
        """``argmin_b f(b) + (c/2) ||b - center||^2``, exactly or to machine precision.

        Parameters
        ----------
        center : ndarray
            The proximal term's center.
        c : float
            The proximal term's curvature.
        x0 : ndarray, optional
            A start for iterative solvers.

        Returns
        -------
        ndarray
            The minimizer, shaped as ``center``.
        """
        ...


def site_weight(config, n: int) -> float:
    """The weight of a site's whole loss in the fused objective, ``n^a * norm`` with the
    ``size-power`` ``a`` and ``size-norm`` the server sent
    (:meth:`strategies.server.registry.Registry.weight_config`), else 1 (docs/methods.md 3.11).

    Parameters
    ----------
    config : dict
        The server's config: ``size-power`` and ``size-norm``, when it weighs sites by size.
    n : int
        The site's rows.

    Returns
    -------
    float
        The weight; 1.0 without ``size-power``.
    """
    power = config.get("size-power")
    if power is None:
        return 1.0
    return float(n) ** float(power) * float(config["size-norm"])


def curvature(solver: str, lipschitz, rho_sigma: float):
    """The curvature ``c_z`` of a site's local step (scalar or array, as ``lipschitz``).

    Parameters
    ----------
    solver : {"prox", "linearized"}
    lipschitz : float or ndarray
        The site's bound ``L_z`` (``mu_z`` in GrAUC-PFL).
    rho_sigma : float
        ``rho sigma_max``, with ``sigma_max = lambda_max(A^T A)`` of the penalty's splits.

    Notes
    -----
    ``linearized``: ``c_z = L_z + rho sigma_max``, a majorizer of the augmented Lagrangian
    (``f`` by its ``L``-quadratic bound, the augmented term by its ``rho sigma_max`` bound).
    ``prox``: ``c_z = rho sigma_max (1 + PROX_SLACK)``; the linearized augmented term alone
    needs ``c > rho sigma_max``.  A site without neighbours (``rho sigma_max = 0``) gets
    ``c = 1 + PROX_SLACK`` for ``prox``: its own fit with a unit proximal term.
    """
    lipschitz = np.asarray(lipschitz, dtype=float)
    if solver == "linearized":
        return lipschitz + rho_sigma
    if solver == "prox":
        base = rho_sigma if rho_sigma > 0 else 1.0
        return np.full_like(lipschitz, base * (1.0 + PROX_SLACK))
    raise ValueError(f"local-solver: must be one of {', '.join(LOCAL_SOLVERS)}, got {solver!r}")


def local_step(
    f: Datafit, tilde: np.ndarray, previous: np.ndarray, c: float, solver: str
) -> np.ndarray:
    """A site's new coefficients from the server's ``tilde``.

    Parameters
    ----------
    f : Datafit
        The site's loss.
    tilde : ndarray
        The server's global component for the site.
    previous : ndarray
        The site's coefficients before the step: where ``linearized`` takes the gradient,
        and the start of an iterative ``prox``.
    c : float
        The step's curvature (:func:`curvature`).
    solver : {"prox", "linearized"}
        ``prox``: ``argmin_b f(b) + (c/2) ||b - tilde||^2``; ``linearized``:
        ``tilde - grad f(previous) / c`` (the same problem with ``f`` linearized at
        ``previous``).

    Returns
    -------
    ndarray
        The new coefficients.
    """
    if solver == "linearized":
        return tilde - f.grad(previous) / c
    if solver == "prox":
        return f.prox(tilde, c, x0=previous)
    raise ValueError(f"local-solver: must be one of {', '.join(LOCAL_SOLVERS)}, got {solver!r}")


def admm_update(
    f: Datafit, beta: np.ndarray, pull: np.ndarray, rho_sigma: float, solver: str
) -> np.ndarray:
    """What a site does with an ADMM instruction ``[beta_z, pull_z]``.

    It forms its global component ``tilde = beta_z - pull_z / c_z`` with its own curvature
    ``c_z`` (:func:`curvature`, from its own ``L_z``) and takes the local step.

    Parameters
    ----------
    f : Datafit
        The site's loss.
    beta : ndarray
        The site's current coefficients ``beta_z``.
    pull : ndarray
        The server's pull ``[Omega^T (gamma + rho (Omega beta - delta))]_z``
        (:meth:`strategies.server.fused.FusedSiteStrategy.pull`), shaped as ``beta``.
    rho_sigma : float
        ``rho sigma_max`` (:func:`curvature`).
    solver : {"prox", "linearized"}
        The local solver (:func:`local_step`).

    Returns
    -------
    ndarray
        The site's new coefficients.
    """
    c = float(curvature(solver, f.lipschitz(), rho_sigma))
    return local_step(f, beta - pull / c, beta, c, solver)


def newton_answer(f, b: np.ndarray) -> tuple[np.ndarray, float]:
    """A site's answer to a ``newton`` instruction at ``b``: its gradient and Hessian side by
    side, ``[grad | H]`` of shape ``(p, k + p)`` (``k = 1`` for a vector ``b``, ``q`` for a
    ``(p, q)`` block), and its loss.  The pqn server with exact curvature and GrAUC-PFL's
    oracle refit read it with :func:`split_newton`.

    Parameters
    ----------
    f : datafit
        The site's loss, with ``hessian`` (and ``value_and_grad``, used when it has one).
    b : ndarray, shape (p,) or (p, q)
        The coefficients.

    Returns
    -------
    answer : ndarray, shape (p, k + p)
        ``[grad | H]``.
    loss : float
        ``f(b)``.
    """
    b = np.asarray(b, dtype=float)
    if hasattr(f, "value_and_grad"):  # one pass over the data
        value, grad = f.value_and_grad(b)
    else:
        value, grad = f.value(b), f.grad(b)
    p = b.shape[0]
    grad = np.asarray(grad, dtype=float).reshape(p, -1)
    return np.hstack([grad, np.asarray(f.hessian(b), dtype=float)]), float(value)


def split_newton(answer: np.ndarray, block_shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """``(gradient of shape block_shape, p x p Hessian)`` of a :func:`newton_answer` array (or a
    stack of them, sites first).

    Parameters
    ----------
    answer : ndarray, shape (..., p, k + p)
        A :func:`newton_answer` array, or a stack of them.
    block_shape : tuple of int
        The shape of one site's coefficients, ``(p,)`` or ``(p, q)``.

    Returns
    -------
    grad : ndarray, shape (..., *block_shape)
        The gradient(s).
    hess : ndarray, shape (..., p, p)
        The Hessian(s).
    """
    answer = np.asarray(answer, dtype=float)
    p = block_shape[0]
    lead = answer.shape[:-2]
    return answer[..., :-p].reshape(*lead, *block_shape), answer[..., -p:]


def newton_shape(block_shape: tuple[int, ...]) -> tuple[int, int]:
    """The shape of a :func:`newton_answer` for coefficients of ``block_shape``."""
    p = block_shape[0]
    k = int(np.prod(block_shape[1:], dtype=int)) if len(block_shape) > 1 else 1
    return (p, k + p)


def local_descent(
    f: Datafit,
    start: np.ndarray,
    steps: int,
    lr: float = 0.0,
    proximal_mu: float = 0.0,
    prox=None,
    admissible=None,
) -> np.ndarray:
    """``steps`` (proximal-)gradient steps from ``start`` on ``f(b) + (mu/2) ||b - start||^2``:
    the local work of FedAvg (``mu = 0``) and of FedProx (Li et al. 2020, ``mu > 0``).

    ``b <- prox(b - (grad f(b) + mu (b - start)) / r, r)`` (docs/methods.md 3.7).

    Parameters
    ----------
    f : Datafit
        The site's loss.
    start : ndarray
        The model the steps start from, and the center of FedProx's term.
    steps : int
        The number of steps.
    lr : float, optional
        The step size: ``r = 1 / lr``; 0: ``r = L + mu`` (the step that decreases the
        objective for any smooth ``f`` with curvature at most ``L``).
    proximal_mu : float, optional
        FedProx's ``mu`` (0: FedAvg).
    prox : callable, optional
        ``prox(v, r)``, the proximal map of a non-smooth term at curvature ``r``; ``None``:
        the identity.
    admissible : callable, optional
        ``admissible(r)``: whether ``r`` is a curvature at which ``prox`` is defined
        (MCP/SCAD need it large enough); ``r`` is doubled until it is.

    Returns
    -------
    ndarray
        The coefficients after the steps.
    """
    r = 1.0 / lr if lr > 0 else max(f.lipschitz() + proximal_mu, 1e-12)
    while admissible is not None and not admissible(r):
        r *= 2.0
    anchor = np.asarray(start, dtype=float)
    b = anchor.copy()
    for _ in range(int(steps)):
        g = f.grad(b)
        if proximal_mu > 0:
            g = g + proximal_mu * (b - anchor)
        b = b - g / r
        if prox is not None:
            b = prox(b, r)
    return b


def best_model(f: Datafit, models: np.ndarray) -> tuple[int, float]:
    """IFCA's choice: the index of the model (along the first axis of ``models``) with the
    least loss ``f`` on the site's own data, and that loss (the first of equal ones).

    Parameters
    ----------
    f : Datafit
        The site's loss.
    models : ndarray, shape (k, *block)
        The candidate models.

    Returns
    -------
    index : int
        The chosen model's index.
    loss : float
        Its loss.
    """
    losses = [float(f.value(m)) for m in models]
    j = int(np.argmin(losses))
    return j, losses[j]
