"""The curvature models of :mod:`strategies.solvers.pqn`: self-scaling BFGS for a smooth loss and
the secant model of a quadratic one (docs/methods.md 1.4 step 2, 2.4)."""

from __future__ import annotations

import numpy as np

#: the BFGS models' self-scaling on every pair after the first (Oren-Luenberger's
#: tau = min(1, s'y / s'Bs)); False: plain BFGS after the first pair's y'y / s'y start
SELF_SCALING = True


def bfgs_update(hess: np.ndarray, s: np.ndarray, y: np.ndarray, first: bool) -> np.ndarray:
    """One self-scaling BFGS update of ``B`` with the pair ``(s, y)``; skipped unless ``s^T y``
    is safely positive.  On the first pair ``B`` is rescaled to ``(y^T y / s^T y) I`` first
    (Nocedal & Wright 2006, eq. 6.20); on later pairs ``B`` is first multiplied by ``tau =
    min(1, s^T y / s^T B s)`` (Oren & Luenberger 1974, "Self-scaling variable metric (SSVM)
    algorithms", Management Sci. 20(5); the ``min(1, .)`` form of Nocedal & Yuan 1993,
    "Analysis of a self-scaling quasi-Newton method", Math. Program. 61): a model that
    overstates the curvature along the last step is shrunk, where plain BFGS corrects one
    direction per pair.

    Parameters
    ----------
    hess : ndarray, shape (p, p)
        The model ``B``.
    s, y : ndarray, shape (p,)
        The step and the change of the gradient along it.
    first : bool
        The first pair: ``B`` is rescaled to ``(y^T y / s^T y) I`` before the update.

    Returns
    -------
    ndarray, shape (p, p)
        The updated model; ``hess`` itself when the update is skipped.
    """
    new = bfgs_update_many(hess[None], s[None], y[None], np.array([first]))
    return hess if np.array_equal(new[0], hess) else new[0]


def bfgs_update_many(
    hess: np.ndarray, s: np.ndarray, y: np.ndarray, first: np.ndarray
) -> np.ndarray:
    """:func:`bfgs_update` for a stack of sites at once; a new array.

    Parameters
    ----------
    hess : ndarray, shape (Z, p, p)
        Each site's model ``B``.
    s, y : ndarray, shape (Z, p)
        Each site's step and change of the gradient along it.
    first : ndarray of bool, shape (Z,)
        The sites whose pair is their first (their ``B`` rescaled before the update).

    Returns
    -------
    ndarray, shape (Z, p, p)
        The updated models (a site whose ``s^T y`` is not safely positive keeps its own).
    """
    hess = np.array(hess, dtype=float, copy=True)
    sy = np.einsum("zi,zi->z", s, y)
    norms = np.linalg.norm(s, axis=1) * np.linalg.norm(y, axis=1)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(sy) & (sy > 1e-10 * norms)
    if not ok.any():
        return hess
    h, s_, y_, sy_ = hess[ok], s[ok], y[ok], sy[ok]
    restart = np.asarray(first, bool)[ok]
    if restart.any():
        yy = np.einsum("zi,zi->z", y_[restart], y_[restart])
        h[restart] = (yy / sy_[restart])[:, None, None] * np.eye(s.shape[1])
    bs = np.einsum("zij,zj->zi", h, s_)
    sbs = np.einsum("zi,zi->z", s_, bs)
    # self-scaling: a model that overstates the curvature along s is shrunk first
    tau = np.where(restart | (not SELF_SCALING), 1.0, np.minimum(1.0, sy_ / sbs))
    h, bs, sbs = h * tau[:, None, None], bs * tau[:, None], sbs * tau
    h = h - bs[:, :, None] * bs[:, None, :] / sbs[:, None, None]
    h = h + y_[:, :, None] * y_[:, None, :] / sy_[:, None, None]
    hess[ok] = h
    return hess


def secant_model(ss: np.ndarray, ys: np.ndarray, curvature: float) -> np.ndarray:
    """The curvature model of a *quadratic* loss from all its step pairs so far.

    A block loss ``f(T) = (1/2) <T, S T> + ...`` with ``T`` of shape ``(p, q)`` has gradient
    differences ``Y = S D`` for steps ``D``; from ``ss = sum D D^T`` and ``ys = sum Y D^T`` the
    server knows ``S P = ys ss^+`` on the span ``P`` of the steps.  The model is
    ``B = S P + P S - P S P + c (I - P)``: exactly ``S`` once the steps span ``R^p`` (after one
    round when ``q >= p``), and ``B >= S`` whenever ``c`` bounds ``S``'s largest eigenvalue
    (then every model step decreases ``F``).

    Parameters
    ----------
    ss : ndarray, shape (p, p)
        ``sum D D^T`` over the steps ``D``.
    ys : ndarray, shape (p, p)
        ``sum Y D^T`` over the steps and their gradient differences ``Y``.
    curvature : float
        ``c``, the model's curvature off the span of the steps.

    Returns
    -------
    ndarray, shape (p, p)
        The symmetric model ``B``.
    """
    p = ss.shape[0]
    w, v = np.linalg.eigh(ss)
    keep = w > 1e-10 * max(float(w.max(initial=0.0)), 1e-300)
    vk = v[:, keep]
    proj = vk @ vk.T
    sp_ = ys @ (vk / w[keep]) @ vk.T
    b = sp_ + sp_.T - proj @ sp_ + curvature * (np.eye(p) - proj)
    return 0.5 * (b + b.T)
