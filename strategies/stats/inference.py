"""Oracle inference that both methods share (docs/methods.md 3.5): the refit's parameter map,
the sandwich, the Newton refit of a smooth sum of site losses, and the intervals table.

After a fused fit, each predictor's sites fall into groups that share its coefficient
(``labels``, one row per site), and some coefficients may be exactly zero.  The *oracle
refit* estimates one parameter per (predictor, group) with the groups and zeros held fixed
and no fusion penalty.  Site ``z``'s coefficients are then ``A_z theta``, with ``A_z`` the
0/1 map from the parameters to its ``p`` coefficients: :func:`parameter_map` stores ``A_z``
as an index per (site, predictor) (``-1`` for a coefficient held at zero), so that

- :func:`lift`          ``theta -> (A_z theta)_z``,
- :func:`gather`        ``(v_z)_z -> sum_z A_z^T v_z``,
- :func:`gather_matrix` ``(M_z)_z -> sum_z A_z^T M_z A_z``

never form ``A_z``.  RowFed's refit is least squares in closed form from the clients'
moments (:mod:`rowfed_flower.inference`); GrAUC-PFL's is a smooth convex surrogate, refitted by
the damped Newton rounds of :func:`newton_round` from each site's gradient and Hessian, with the
sandwich covariance :func:`sandwich`.  Flower-free.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

#: ``inference`` values: no intervals, or intervals from the oracle refit.
INFERENCE_CHOICES = ("none", "oracle")

#: The refit's round limit (GrAUC-PFL: Newton rounds after the fit).
REFIT_ROUNDS = 50


def parameter_map(labels: np.ndarray, support: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """The refit's parameters: one per (predictor ``j``, group of ``labels[:, j]``) with
    ``support`` true at some member.  Parameters are numbered predictor by predictor,
    groups in order of first appearance.

    Parameters
    ----------
    labels : ndarray, shape (Z, p)
        Each site's group per predictor.
    support : ndarray of bool, shape (Z, p), optional
        The coefficients that are not held at zero; default: every group is a parameter.

    Returns
    -------
    cols : ndarray of int, shape (Z, p)
        ``cols[z, j]`` is the parameter of site ``z``'s coefficient ``j``, or ``-1`` when
        that coefficient is not a parameter (held where it is).
    n_par : int
        The number of parameters.
    """
    labels = np.asarray(labels)
    m, p = labels.shape
    support = np.ones((m, p), dtype=bool) if support is None else np.asarray(support, dtype=bool)
    cols = np.full((m, p), -1)
    n_par = 0
    for j in range(p):
        for g in dict.fromkeys(labels[:, j].tolist()):
            members = labels[:, j] == g
            if support[members, j].any():
                cols[members, j] = n_par
                n_par += 1
    return cols, n_par


def group_sizes(labels: np.ndarray) -> np.ndarray:
    """``(Z, p)``: how many sites share site ``z``'s group for predictor ``j``."""
    labels = np.asarray(labels)
    return (labels[:, None, :] == labels[None, :, :]).sum(axis=1)


def lift(cols: np.ndarray, theta: np.ndarray, fixed: np.ndarray | None = None) -> np.ndarray:
    """``(A_z theta)_z`` as ``(Z, p)``.

    Parameters
    ----------
    cols : ndarray of int, shape (Z, p)
        The parameter map (:func:`parameter_map`).
    theta : ndarray, shape (n_par,)
        The parameters.
    fixed : ndarray, shape (Z, p), optional
        What the coefficients that are not parameters take (default 0).

    Returns
    -------
    ndarray, shape (Z, p)
        Each site's coefficients.
    """
    out = np.zeros(cols.shape) if fixed is None else np.array(fixed, dtype=float)
    on = cols >= 0
    out[on] = np.asarray(theta, dtype=float)[cols[on]]
    return out


def gather(cols: np.ndarray, vectors: np.ndarray, n_par: int) -> np.ndarray:
    """``sum_z A_z^T v_z``.

    Parameters
    ----------
    cols : ndarray of int, shape (Z, p)
        The parameter map (:func:`parameter_map`).
    vectors : ndarray, shape (Z, p)
        The ``v_z``.
    n_par : int
        The number of parameters.

    Returns
    -------
    ndarray, shape (n_par,)
        The sum.
    """
    on = cols >= 0
    return np.bincount(cols[on], weights=np.asarray(vectors, dtype=float)[on], minlength=n_par)


def gather_matrix(cols: np.ndarray, mats, n_par: int) -> np.ndarray:
    """``sum_z A_z^T M_z A_z``.

    Parameters
    ----------
    cols : ndarray of int, shape (Z, p)
        The parameter map (:func:`parameter_map`).
    mats : ndarray, shape (Z, p, p)
        The ``M_z``.
    n_par : int
        The number of parameters.

    Returns
    -------
    ndarray, shape (n_par, n_par)
        The sum.
    """
    out = np.zeros((n_par, n_par))
    for c, mat in zip(cols, mats, strict=True):
        on = np.flatnonzero(c >= 0)
        if on.size:
            np.add.at(out, np.ix_(c[on], c[on]), np.asarray(mat, dtype=float)[np.ix_(on, on)])
    return out


def sandwich(bread: np.ndarray, meat: np.ndarray, max_condition: float = 1e12) -> np.ndarray | None:
    """``H^-1 S H^-1``.

    Parameters
    ----------
    bread : ndarray, shape (k, k)
        ``H``.
    meat : ndarray, shape (k, k)
        ``S``.
    max_condition : float, optional
        ``H``'s largest condition number.

    Returns
    -------
    ndarray, shape (k, k) or None
        The symmetric covariance; ``None`` when ``H`` is not finite or its condition number
        exceeds ``max_condition``.
    """
    if bread.size == 0:
        return np.zeros((0, 0))
    if not np.isfinite(bread).all() or np.linalg.cond(bread) > max_condition:
        return None
    inv = np.linalg.inv(bread)
    cov = inv @ meat @ inv
    return 0.5 * (cov + cov.T)


def half_width(se, level: float, df=None):
    """Half the interval width: ``z_{(1+level)/2} se`` or ``t_{df,(1+level)/2} se``.

    Parameters
    ----------
    se : float or array_like
        The standard errors.
    level : float
        The interval's coverage, e.g. 0.95.
    df : float or array_like, optional
        Degrees of freedom of Student's t; ``None``: the normal quantile.

    Returns
    -------
    ndarray
        The half widths, shaped as ``se``.
    """
    from scipy.stats import norm, t

    q = norm.ppf(0.5 + level / 2) if df is None else t.ppf(0.5 + level / 2, df)
    return np.asarray(q, dtype=float) * np.asarray(se, dtype=float)


# ---------------------------------------------------------------------------------------
# the Newton refit (GrAUC-PFL)


@dataclass
class NewtonRefit:
    """The server's state of a damped Newton refit of ``F(theta) = sum_z f_z(A_z theta)``.

    ``trial`` is the point the sites evaluate this round; ``theta`` the last accepted point
    with its value, gradient ``grad`` and Hessian ``hess`` (``sum_z A_z^T H_z A_z``);
    ``direction`` and ``step`` the line search; ``done`` once the Newton step is below
    ``xtol`` relative to ``theta`` (or the line search can no longer decrease ``F``).
    """

    cols: np.ndarray
    n_par: int
    fixed: np.ndarray  # (Z, p): the coefficients that are not parameters
    trial: np.ndarray
    theta: np.ndarray | None = None
    value: float = np.inf
    grad: np.ndarray | None = None
    hess: np.ndarray | None = None
    site_hess: np.ndarray | None = None  # (Z, p, p) at theta
    direction: np.ndarray | None = None
    step: float = 1.0
    rounds: int = 0
    done: bool = False
    converged: bool = False
    history: list = field(default_factory=list)

    def point(self) -> np.ndarray:
        """Each site's coefficients at ``trial``, ``(Z, p)``."""
        return lift(self.cols, self.trial, self.fixed)

    def estimate(self) -> np.ndarray:
        """Each site's refitted coefficients, ``(Z, p)``."""
        return lift(self.cols, self.theta if self.theta is not None else self.trial, self.fixed)


def start_refit(labels: np.ndarray, beta: np.ndarray, support: np.ndarray | None = None):
    """A refit on the structure ``labels`` from the fit ``beta``: each parameter starts at
    its group's mean coefficient.

    Parameters
    ----------
    labels : ndarray, shape (Z, p)
        Each site's group per predictor.
    beta : ndarray, shape (Z, p)
        The fit's coefficients.
    support : ndarray of bool, shape (Z, p), optional
        The coefficients refitted; those outside it stay as fitted (default: all).

    Returns
    -------
    NewtonRefit
        The refit's state, its ``trial`` the start (done at once with no parameter).
    """
    beta = np.asarray(beta, dtype=float)
    cols, n_par = parameter_map(labels, support)
    counts = gather(cols, np.ones_like(beta), n_par)
    theta0 = gather(cols, beta, n_par) / np.maximum(counts, 1)
    fixed = np.where(cols >= 0, 0.0, beta)
    return NewtonRefit(cols, n_par, fixed, theta0, done=n_par == 0, converged=n_par == 0)


def newton_round(
    state: NewtonRefit,
    loss: np.ndarray,
    grads: np.ndarray,
    hessians: np.ndarray,
    xtol: float = 1e-10,
    armijo: float = 1e-4,
) -> NewtonRefit:
    """One round: accepts the trial when it decreases ``F`` enough (Armijo; the first point
    always), then takes the Newton direction ``-H^-1 g`` with step 1; otherwise halves the
    step.

    Parameters
    ----------
    state : NewtonRefit
        The refit's state, changed in place.
    loss : ndarray, shape (Z,)
        Every site's loss at ``state.point()``.
    grads : ndarray, shape (Z, p)
        Their gradients there.
    hessians : ndarray, shape (Z, p, p)
        Their Hessians there.
    xtol : float, optional
        Done when the Newton step is below ``xtol (1 + |theta|_inf)``.
    armijo : float, optional
        The sufficient-decrease constant.

    Returns
    -------
    NewtonRefit
        ``state``.
    """
    value = float(np.sum(loss))
    rel = 1e-13 * max(1.0, abs(state.value)) if np.isfinite(state.value) else 0.0
    state.rounds += 1
    slope = float(state.grad @ state.direction) * state.step if state.theta is not None else 0.0
    accept = state.theta is None or value <= state.value + armijo * slope + rel
    state.history.append({"round": state.rounds, "objective": value, "step": state.step})
    if not accept:
        state.step *= 0.5
        if state.step < 1e-12:  # no decrease left to find: at the minimum to precision
            state.done = True
            state.converged = True
            return state
        state.trial = state.theta + state.step * state.direction
        return state
    state.theta = state.trial.copy()
    state.value = value
    state.grad = gather(state.cols, grads, state.n_par)
    state.hess = gather_matrix(state.cols, hessians, state.n_par)
    state.site_hess = np.asarray(hessians, dtype=float)
    try:
        direction = -np.linalg.solve(state.hess, state.grad)
    except np.linalg.LinAlgError:
        direction = -np.linalg.lstsq(state.hess, state.grad, rcond=None)[0]
    if float(state.grad @ direction) >= 0:  # numerically singular: steepest descent
        direction = -state.grad
    scale = 1.0 + float(np.max(np.abs(state.theta))) if state.n_par else 1.0
    if not state.n_par or float(np.max(np.abs(direction))) <= xtol * scale:
        state.done = state.converged = True
        return state
    state.direction = direction
    state.step = 1.0
    state.trial = state.theta + direction
    return state


# ---------------------------------------------------------------------------------------
# the table


def interval_frame(
    entity: str,
    entities,
    features,
    estimate: np.ndarray,
    se: np.ndarray,
    kind: np.ndarray,
    group_size: np.ndarray,
    level: float,
    df=None,
    responses=None,
) -> pd.DataFrame:
    """``inference.csv``: ``<entity>, feature, [response,] kind, group_size, estimate, se,
    lower, upper``.  A row without a finite ``se`` has no interval.

    Parameters
    ----------
    entity : str
        The name of the first column (the sites' kind, e.g. ``site``).
    entities : iterable of str
        The sites, in the order of the arrays' first axis.
    features : iterable of str
        The predictors.
    estimate, se : ndarray, shape (Z, p), or (Z, p, q) with ``responses``
        The estimates and their standard errors.
    kind : ndarray of str, shape of ``estimate``
        What each coefficient is (e.g. ``fused``, ``unique``).
    group_size : ndarray of int, shape (Z, p)
        How many sites share the coefficient.
    level : float
        The intervals' coverage.
    df : float or sequence of float, optional
        Degrees of freedom of Student's t (with ``responses``, one per response); ``None``:
        normal intervals.
    responses : sequence of str, optional
        The responses; ``None``: one response and no ``response`` column.

    Returns
    -------
    pandas.DataFrame
        One row per site, predictor (and response).
    """
    estimate = np.asarray(estimate, dtype=float)
    if responses is None:
        estimate, se, kind = (
            estimate[..., None],
            np.asarray(se)[..., None],
            np.asarray(kind)[..., None],
        )
        dfs = [df]
    else:
        dfs = [None] * len(responses) if df is None else list(df)
    se = np.asarray(se, dtype=float)
    half = np.stack([half_width(se[..., k], level, dfs[k]) for k in range(se.shape[-1])], axis=-1)
    z, p, q = estimate.shape
    frame = pd.DataFrame(
        {
            entity: np.repeat(np.asarray(list(entities), dtype=object), p * q),
            "feature": np.tile(np.repeat(np.asarray(list(features), dtype=object), q), z),
            "response": np.tile(np.asarray(list(responses or [""]), dtype=object), z * p),
            "kind": np.asarray(kind).reshape(-1),
            "group_size": np.repeat(np.asarray(group_size, dtype=int).reshape(-1), q),
            "estimate": estimate.reshape(-1),
            "se": se.reshape(-1),
            "lower": (estimate - half).reshape(-1),
            "upper": (estimate + half).reshape(-1),
        }
    )
    return frame if responses is not None else frame.drop(columns="response")


__all__ = [
    "INFERENCE_CHOICES",
    "NewtonRefit",
    "REFIT_ROUNDS",
    "gather",
    "gather_matrix",
    "group_sizes",
    "half_width",
    "interval_frame",
    "lift",
    "newton_round",
    "parameter_map",
    "sandwich",
    "start_refit",
]
