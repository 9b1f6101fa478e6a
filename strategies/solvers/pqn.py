"""Federated proximal quasi-Newton for ``sum_z f_z(beta_z) + sum_k P_k(A_k beta)`` (Flower-free).

The communication-efficient solver of GrAUC-PFL (``grauc.algorithm = "pqn"``).  ADMM moves
information between neighbouring sites one edge per round; this method instead lets the
server solve the *whole* fused problem on a model of the sites' losses each round, so a
round costs one message each way and the count of rounds no longer grows with the graph:

1. Each site evaluates its loss and gradient at the point the server sent,
   ``f_z(x_z)`` and ``g_z = grad f_z(x_z)`` (a scalar metric and a ``p`` vector: what a
   FedSGD client sends; never a data row).
2. The server keeps, per site, a BFGS matrix ``B_z`` built from the site's successive
   gradients (the Hessian of ``F`` is block diagonal over sites, so per-site BFGS is the
   exact structure) -- or, with the ``exact`` model, the site's own ``p x p`` Hessian at its
   accepted point, sent with its gradient (a proximal Newton method) -- and solves the
   composite model problem

       d = argmin_d  sum_z g_z^T d_z + (1/2) d_z^T B_z d_z + sum_k P_k(A_k (x + d))

   to high accuracy by ADMM on the server (the same fused-lasso threshold and dual steps
   as :mod:`strategies.solvers.admm`, with exact linear solves: no communication).
3. A backtracking (Armijo) line search on ``F`` along ``d`` (Lee, Sun & Saunders 2014,
   "Proximal Newton-type methods for minimizing composite functions", SIAM J. Optim.):
   the next point sent is ``x + t d``; a rejected trial halves ``t``.
4. Stop when the predicted decrease ``-Delta = -(g^T d + P(x + d) - P(x)) <= tol max(1,
   |F(x)|)`` and the model step ``max|d| <= sqrt(tol) max(1, max|x|)`` (:func:`_converged`):
   ``tol`` is a relative objective gap (near the optimum ``F(x) - F*`` is about ``-Delta``
   and about ``d^T H d / 2``).  For a nonconvex penalty (:class:`Linearization`)
   ``Delta`` is the model's change of the target objective, curvature term included
   (:func:`_model_decrease`).

A site that does not answer keeps its last evaluated point: its block is frozen (``d_z = 0``)
until it answers again.  The penalty must be convex (lasso; entry or group).

**Partial participation** (``incremental``): a line search on ``F`` needs every site's loss
at the same trial point, so when only a random part of the sites answers each round (and
with the exact model, whose every site can be checked on its own) the server instead keeps,
for every site, its last evaluated point ``x_z``, loss, gradient and curvature model, and
each round

1. takes the answers of the sites that were asked (each at the point ``b_z`` it was sent):
   a site's move to ``b_z`` is accepted when its loss there is within the model's reach,
   ``2 (f_z(b_z) - f_z(x_z) - g_z^T s) <= (1 + KAPPA) s^T (B_z + mu_z I) s`` with
   ``s = b_z - x_z`` (then ``x_z <- b_z`` and ``mu_z <- mu_z / 4``); otherwise the site keeps
   ``x_z`` and its damping ``mu_z`` grows until the model covers the loss along ``s``; the
   curvature model learns from the pair ``(s, grad f_z(b_z) - g_z)`` either way;
2. solves the model problem on *all* the models (with ``B_z + mu_z I``; a site that has never
   answered takes the mean of the answered sites' models, :func:`_stand_ins`) for the next
   points ``b``.

The fit's coefficients are ``b`` (:func:`estimate`), not the kept points: a fused group's
kept points were set in different rounds, and the penalty charges their split at first
order.  The recorded objective is the models' value at ``b`` (:func:`estimate_objective`),
and the stopping rule reads the models' curvature along the step in place of ``-Delta``
(:func:`_stop_measure`).

When each model bounds its loss from above (a quadratic loss's secant model, the exact
model of a convex loss seen far from its minimum) every move is accepted and the sum of the
models decreases every round, the incremental majorization-minimization of Mairal (2015,
"Incremental majorization-minimization optimization", SIAM J. Optim.).  The gradients
are exact at the kept points, so a fixed point (``b = x``) is the optimum of the full
problem: partial participation changes the path, not the answer.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from . import lockstep
from .admm import Problem
from .curvature import bfgs_update, bfgs_update_many, secant_model
from .modelsolve import ModelRequest, model_scale, solve_request
from .qnstate import ModelStep, QuasiNewtonState, SiteModels, Step

ARMIJO = 1e-4  # sufficient-decrease constant
MIN_STEP = 2.0**-30
INNER_TOL = 1e-11  # the model problem's tolerance near the optimum (relative to its scale)
#: ... for a fit stopping at ``tol``: at most ``tol`` divided by this (a fit that stops at a
#: 1e-3 gap, a cross-validation fit, needs no model solution to 1e-11; at ``tol`` <= 1e-6,
#: the default, this is INNER_TOL exactly)
INNER_SHARE = 1e5
INNER_FORCING = 1e-3  # ... loosened to this share of the last step while steps are large
INNER_LOOSEST = 1e-6
#: With the exact model, ``B_z = H_z + EXACT_FLOOR max(1, tr(H_z)/p) I`` (a singular Hessian
#: -- no ridge, a separable site -- must not make the model problem singular).
EXACT_FLOOR = 1e-10
#: Partial participation: a site's move is accepted while its loss rises at most this much
#: above the model's curvature along the move (a ratio test; 0 = the model must majorize).
KAPPA = 0.5
#: ... up to the rounding of the losses, relative (steps of 1e-10 change a loss by rounding).
ROUNDING = 1e-12
#: A nonconvex penalty (local linear approximations, :class:`Linearization`): the model
#: problem is linearized again at its own solution and solved again, at most this many times
#: a round, until its solution moves less than LLA_TOL (relative to ``max(1, max|b|)``).
LLA_INNER = 30
LLA_TOL = 1e-10
#: ... and stops sooner once a solve lowers the model of the target objective by at most
#: LLA_GAIN times the fit's stopping gap ``tol max(1, |F|)`` while moving ``b`` by at most
#: LLA_MOVE times the stopping rule's step allowance ``sqrt(tol) max(1, max|b|)``: what the
#: rest of the approximations could still bring lies below what the fit resolves
#: (docs/methods.md 2.4).
LLA_GAIN = 0.1
LLA_MOVE = 0.05
#: The approximations after the second are solved only as accurately as the last one moved
#: ``b``: to LLA_FORCING times that move (relative to the model's scale), at most
#: LLA_LOOSEST (a point on the way to the fixed point needs no 1e-6 solution).
LLA_FORCING = 1e-2
LLA_LOOSEST = 1e-4


@dataclass(frozen=True)
class Linearization:
    """A nonconvex penalty (MCP/SCAD) handled by local linear approximations: ``target`` the
    problem the fit minimizes, ``at(x)`` its approximation at ``x``, a weighted lasso that
    lies above ``target``'s penalty and touches it at ``x`` (Zou & Li 2008)."""

    target: Problem
    at: Callable[[np.ndarray], Problem]


def _model_hessians(st: QuasiNewtonState) -> np.ndarray:
    """``B_z + mu_z I``: the curvature models with each site's damping."""
    sites = st.sites
    if not sites.damping.any():
        return sites.hess
    return sites.hess + sites.damping[:, None, None] * np.eye(sites.x.shape[1])[None]


def inner_floor(tol: float | None) -> float:
    """The model problem's tightest tolerance for a fit stopping at ``tol``:
    ``tol /`` :data:`INNER_SHARE`, at least :data:`INNER_TOL`, at most :data:`INNER_LOOSEST`
    (``None``: :data:`INNER_TOL`).  A model solution far more accurate than the fit's own
    stopping gap buys nothing: a fit at ``tol`` 1e-3 (the tuning's cross-validation fits)
    ends on a model solution accurate to 1e-8, one at the default 1e-6 to 1e-11."""
    if tol is None:
        return INNER_TOL
    return float(np.clip(tol / INNER_SHARE, INNER_TOL, INNER_LOOSEST))


def _inner_tol(st: QuasiNewtonState, floor: float = INNER_TOL) -> float:
    """The model problem's tolerance: ``floor`` (:func:`inner_floor`), loosened to
    :data:`INNER_FORCING` times the last direction's largest entry (relative to the scale of
    :func:`solve_model`), at most :data:`INNER_LOOSEST` -- an inexact proximal Newton
    method (Lee, Sun & Saunders 2014, §3.2: the model needs solving only as accurately as
    the step it yields is small; the tolerance tightens as the fit converges).  A fit's first
    model (no step yet to measure it by) is solved to :data:`INNER_LOOSEST`: it is solved
    again to ``floor`` if its step would end the fit (:func:`_new_direction`)."""
    if st.inner is None:
        return max(floor, INNER_LOOSEST)
    last = float(np.max(np.abs(st.search.direction), initial=0.0))
    if last == 0.0:
        return floor
    scale = model_scale(st.sites.x, st.sites.grad)
    return float(np.clip(INNER_FORCING * last / scale, floor, INNER_LOOSEST))


def _new_direction(
    problem: Problem, st: QuasiNewtonState, tol: float | None, may_end: bool = True
) -> tuple[QuasiNewtonState, int]:
    """The model step at the kept point (direction, predicted decrease, trial point), the
    model problem solved to :func:`_inner_tol`.  When that step would end the fit (the
    stopping rule at ``tol``; only if ``may_end``) or promises no decrease, it is solved again
    to :func:`inner_floor`, so a fit ends on an accurate model solution (its fused groups and
    zeros are read from it).  Returns the new state and the inner iterations."""
    floor = inner_floor(tol)
    inner = _inner_tol(st, floor)
    st, it = _solve_direction(problem, st, inner)
    if inner > floor and (
        st.search.decrease >= 0.0
        or (may_end and tol is not None and st.evaluated and _converged(tol, st))
    ):
        st, more = _solve_direction(problem, st, floor)
        it += more
    return st, it


def _lla_direction(
    problem: Problem, st: QuasiNewtonState, tol: float | None, lla: Linearization,
    may_end: bool = True,
) -> tuple[QuasiNewtonState, int]:  # fmt: skip
    """The model step for a nonconvex penalty: the model problem on ``problem`` (the
    approximation at the kept point), then linearized again at its solution ``b`` and solved
    again until ``b`` settles (:data:`LLA_INNER`, :data:`LLA_TOL`, :data:`LLA_GAIN`): the
    local linear approximations run towards their fixed point on the server's models, at no
    cost in rounds.  Each solve lowers the model of the target objective, ``sum_z g_z^T d_z
    + (1/2) d_z^T B_z d_z + P(x + d)`` (the approximation majorizes ``P`` and touches it at
    the point it was taken), so ``b`` ends near a stationary point of that model.  The
    decrease is then the model's predicted change of the target objective, including the
    curvature term (:func:`_model_decrease`).  Returns the new state and the inner
    iterations."""
    floor = inner_floor(tol)
    st, it = _new_direction(problem, st, tol, may_end)
    judged = tol is not None and st.evaluated and math.isfinite(st.objective)
    model = _model_value(lla.target, st) if judged else 0.0
    moved = None
    for _ in range(LLA_INNER - 1):
        b = st.sites.x + st.search.direction
        before = st.search.direction
        problem = lla.at(b)
        if moved is None:
            st, more = _new_direction(problem, st, tol, may_end)
        else:
            st, more = _solve_direction(problem, st, _pass_tol(st, floor, moved))
        it += more
        scale = max(1.0, float(np.max(np.abs(b), initial=0.0)))
        moved = float(np.max(np.abs(st.search.direction - before), initial=0.0))
        if moved <= LLA_TOL * scale:
            break
        if judged:
            now = _model_value(lla.target, st)  # P(x) is the same for every pass
            gain, model = model - now, now
            if gain <= LLA_GAIN * tol * max(1.0, abs(st.objective)) and (
                moved <= LLA_MOVE * math.sqrt(tol) * scale
            ):
                break
    st = _predicting(st, _model_decrease(lla.target, st))
    if may_end and tol is not None and st.evaluated and _converged(tol, st):
        # the step that ends the fit: its model solution to the floor (its zeros and fused
        # groups are the fit's), as _new_direction does for a convex penalty
        st, more = _solve_direction(problem, st, floor)
        it += more
        st = _predicting(st, _model_decrease(lla.target, st))
    return st, it


def _predicting(st: QuasiNewtonState, decrease: float) -> QuasiNewtonState:
    """The state with the model step's predicted decrease set to ``decrease``."""
    return replace(st, search=replace(st.search, decrease=decrease))


def _pass_tol(st: QuasiNewtonState, floor: float, moved: float) -> float:
    """The inner tolerance of a later approximation's model problem: :data:`LLA_FORCING`
    times the last approximation's move of ``b`` (relative to the model's scale), between
    ``floor`` and :data:`LLA_LOOSEST`, and never tighter than :func:`_inner_tol`."""
    scale = model_scale(st.sites.x, st.sites.grad)
    forced = np.clip(LLA_FORCING * moved / scale, floor, LLA_LOOSEST)
    return max(_inner_tol(st, floor), float(forced))


def _direction(
    problem: Problem, st: QuasiNewtonState, tol: float | None, lla: Linearization | None,
    may_end: bool = True,
) -> tuple[QuasiNewtonState, int]:  # fmt: skip
    """The model step on ``problem`` (:func:`_new_direction`), or with a nonconvex penalty
    from its approximation ``problem`` towards the approximations' fixed point
    (:func:`_lla_direction`).  Returns the new state and the inner iterations."""
    if lla is None:
        return _new_direction(problem, st, tol, may_end)
    return _lla_direction(problem, st, tol, lla, may_end)


def _model_value(target: Problem, st: QuasiNewtonState) -> float:
    """The models' value of the target objective at the step, less ``sum_z f_z(x_z)``:
    ``sum_z [g_z^T d_z + (1/2) d_z^T (B_z + mu_z I) d_z] + P(x + d)``."""
    x, d = st.sites.x, st.search.direction
    smooth = float(np.sum(st.sites.grad * d) + 0.5 * _curvature_terms(st).sum())
    return smooth + target.penalty_value(x + d)


def _model_decrease(target: Problem, st: QuasiNewtonState) -> float:
    """The models' predicted change of the target objective along the direction,
    ``sum_z [g_z^T d_z + (1/2) d_z^T (B_z + mu_z I) d_z] + P(x + d) - P(x)``."""
    return _model_value(target, st) - target.penalty_value(st.sites.x)


def _stand_ins(st: QuasiNewtonState) -> tuple[np.ndarray, np.ndarray]:
    """The models the model problem is solved on: each site's own, and for a site that has
    not answered yet (partial participation) the mean of the answered sites' models,
    ``q(b) = mean_s [g_s^T (b - x_s) + (1/2) (b - x_s)^T B_s (b - x_s)]``, written at the
    site's start: until it answers, a site is taken to be an average site, so its first
    evaluation is at a point its neighbours' information has moved (not at its start)."""
    sites = st.sites
    hess = _model_hessians(st)
    waiting = st.settings.incremental & ~sites.seen
    if not waiting.any() or not sites.seen.any():
        return sites.grad, hess
    seen = sites.seen
    grad, hess = sites.grad.copy(), hess.copy()
    mean_h = hess[seen].mean(axis=0)
    x3 = sites.x.reshape(sites.x.shape[0], sites.x.shape[1], -1)
    g3 = sites.grad.reshape(x3.shape)
    # mean_s [g_s - B_s x_s] + mean_s[B_s] x_z: the mean model's gradient at x_z
    offset = (g3[seen] - np.einsum("zij,zjk->zik", hess[seen], x3[seen])).mean(axis=0)
    grad.reshape(x3.shape)[waiting] = offset + np.einsum("ij,zjk->zik", mean_h, x3[waiting])
    hess[waiting] = mean_h
    return grad, hess


def _solve_direction(
    problem: Problem, st: QuasiNewtonState, inner_tol: float
) -> tuple[QuasiNewtonState, int]:
    """The model problem on ``problem`` solved to ``inner_tol`` from the last solution: the
    state with its step (at step 1) and the inner solution, and the inner iterations."""
    x = st.sites.x
    grad, hess = _stand_ins(st)
    # here, or beside the other fits' of a batched run (strategies.solvers.lockstep)
    request = ModelRequest(
        problem, x, grad, hess, st.frozen, st.inner, inner_tol, st.settings.min_rho
    )
    sol = lockstep.call(solve_request, request)
    d = sol.b - x
    d[st.frozen] = 0.0
    decrease = float(np.sum(grad * d) + problem.penalty_value(x + d) - problem.penalty_value(x))
    search = ModelStep(trial=x + d, direction=d, step=1.0, decrease=decrease)
    return replace(st, search=search, inner=sol), sol.iterations


def qn_round(
    problem: Problem,
    st: QuasiNewtonState,
    answered: dict[int, tuple],
    tol: float,
    lla: Linearization | None = None,
) -> tuple[QuasiNewtonState, Step]:
    """Take the sites' answers for the current trial point and advance: accept or shorten
    the step, update the curvature models, find the next direction.

    Parameters
    ----------
    problem : Problem
        The penalty side; with ``lla``, its approximation at the accepted point.
    st : QuasiNewtonState
        The state before the round (not changed: the round builds new records, in arrays
        of their own).
    answered : dict of int to tuple
        ``{z: (f_z(trial_z), grad f_z(trial_z))}`` (with the ``exact`` model
        ``(f_z, grad f_z, hess f_z)``), for the sites that answered.
    tol : float
        The stopping rule's relative objective gap.
    lla : Linearization, optional
        A nonconvex penalty's local linear approximations: the objective the line search
        reads is the target's; a newly accepted point gets a new approximation (in the
        incremental form the estimate the sites were sent, every round), and each model
        step runs the approximations towards their fixed point on the models
        (:func:`_lla_direction`).  The strategy reads the last approximation from
        ``lla.at``'s calls.

    Returns
    -------
    state : QuasiNewtonState
        The new state (the next point to send is ``state.search.trial``).
    step : Step
        What the round did, with its time in seconds.
    """
    t0 = time.perf_counter()
    advance = _advance_incremental if st.settings.incremental else _advance
    st, step = advance(problem, replace(st, round=st.round + 1), answered, tol, lla)
    return st, replace(step, seconds=time.perf_counter() - t0)


def _exact(hess: np.ndarray) -> np.ndarray:
    """``B_z`` of the exact model from a site's Hessian (:data:`EXACT_FLOOR`)."""
    hess = 0.5 * (hess + hess.T)
    p = hess.shape[0]
    return hess + EXACT_FLOOR * max(1.0, float(np.trace(hess)) / p) * np.eye(p)


def _take(sites: SiteModels, model: str, z: int, answer: tuple) -> None:
    """Site ``z``'s answer at its kept point into ``sites`` (a round's own copy): its loss,
    gradient and, with the exact model, its Hessian."""
    sites.value[z], sites.grad[z] = answer[0], answer[1]
    sites.seen[z] = True
    if model == "exact":
        sites.hess[z] = _exact(np.asarray(answer[2], dtype=float))


def _advance(
    problem: Problem,
    st: QuasiNewtonState,
    answered: dict[int, tuple],
    tol: float,
    lla: Linearization | None = None,
) -> tuple[QuasiNewtonState, Step]:
    """A round of the plain form: every site evaluated at one trial point, a line search on
    ``F`` (module docstring)."""
    n_sites = st.sites.x.shape[0]
    model = st.settings.model
    judge = problem if lla is None else lla.target  # the objective the line search reads

    def direction(st: QuasiNewtonState, may_end: bool = True) -> tuple[QuasiNewtonState, int]:
        at = problem if lla is None else lla.at(st.sites.x)  # the approximation at x
        return _direction(at, st, tol, lla, may_end)

    missing = np.array([z not in answered for z in range(n_sites)])
    moved = np.any(st.search.direction.reshape(n_sites, -1) != 0.0, axis=1) & ~st.frozen
    if not st.evaluated:
        # first answers: the starting point itself
        sites = st.sites.copy()
        for z, answer in answered.items():
            _take(sites, model, z, answer)
        st = replace(st, sites=sites)
        if missing.any():  # wait for everyone's first evaluation
            return st, Step(False, np.inf, np.inf, False, 0)
        objective = float(sites.value.sum() + judge.penalty_value(sites.x))
        st, it = direction(replace(st, evaluated=True, objective=objective))
        return st, Step(True, st.objective, -st.search.decrease, _converged(tol, st), it)
    if np.any(missing & moved):
        # a site that was to move did not answer: freeze it at its last point, re-plan
        sites = st.sites.copy()
        for z, answer in answered.items():  # answers at x_z for the frozen ones only
            if not moved[z]:
                _take(sites, model, z, answer)
        st, it = direction(replace(st, sites=sites, frozen=st.frozen | missing), may_end=False)
        return st, Step(False, st.objective, -st.search.decrease, False, it)
    value, grad = st.sites.value.copy(), st.sites.grad.copy()
    for z, answer in answered.items():
        value[z], grad[z] = answer[0], answer[1]
    search = st.search
    f_trial = float(value.sum() + judge.penalty_value(search.trial))
    accept = (
        f_trial <= st.objective + ARMIJO * search.step * search.decrease or search.step <= MIN_STEP
    )
    frozen = missing.copy()  # answered sites are live again
    if not accept:
        t = _backtrack(search.step, search.decrease, f_trial - st.objective)
        search = replace(search, step=t, trial=st.sites.x + t * search.direction)
        st = replace(st, search=search, frozen=frozen)
        return st, Step(False, st.objective, -search.decrease, False, 0)
    sites = _learned(st, answered, search.trial, grad)
    sites = replace(sites, x=search.trial.copy(), value=value, grad=grad)
    st, it = direction(replace(st, sites=sites, frozen=frozen, objective=f_trial))
    return st, Step(True, f_trial, -st.search.decrease, _converged(tol, st), it)


def _learned(
    st: QuasiNewtonState, answered: dict[int, tuple], trial: np.ndarray, grad: np.ndarray
) -> SiteModels:
    """The sites' models after an accepted step to ``trial``, where the gradients are
    ``grad``: each site that stepped learns from its pair (with the exact model, every
    answering site's Hessian at the new point is its model); in arrays of their own."""
    sites = st.sites.copy()
    n_sites = sites.x.shape[0]
    s_all = trial - sites.x
    y_all = grad - sites.grad
    stepped = np.any(s_all.reshape(n_sites, -1) != 0.0, axis=1)
    if st.settings.model == "exact":  # the Hessians at the accepted point
        for z, answer in answered.items():
            sites.hess[z] = _exact(np.asarray(answer[2], dtype=float))
    elif st.settings.model == "secant":
        for z in np.flatnonzero(stepped):
            _learn(sites, "secant", z, s_all[z], y_all[z])
    elif stepped.any():
        sites.hess[stepped] = bfgs_update_many(
            sites.hess[stepped], s_all[stepped], y_all[stepped], ~sites.paired[stepped]
        )
    sites.paired[stepped] = True
    return sites


def learn(st: QuasiNewtonState, pairs: dict[int, tuple]) -> QuasiNewtonState:
    """The sites' curvature models learn from step pairs (BFGS or secant).

    Parameters
    ----------
    st : QuasiNewtonState
        The state (unchanged).
    pairs : dict of int to tuple
        ``{z: (s, y)}``: a step of site ``z``'s block and the change of its gradient along
        it.

    Returns
    -------
    QuasiNewtonState
        The state whose sites' models (``hess``, ``paired`` and, for the secant model,
        ``ss`` and ``ys``) have learned from the pairs.
    """
    if not pairs:
        return st
    sites = st.sites.copy()
    for z, (s, y) in pairs.items():
        _learn(sites, st.settings.model, z, s, y)
    return replace(st, sites=sites)


def _learn(sites: SiteModels, model: str, z: int, s: np.ndarray, y: np.ndarray) -> None:
    """Site ``z``'s model learns from one pair, in ``sites`` (a round's own copy)."""
    if model == "secant":
        s_z = s.reshape(s.shape[0], -1)
        y_z = y.reshape(s_z.shape)
        sites.ss[z] += s_z @ s_z.T
        sites.ys[z] += y_z @ s_z.T
        sites.hess[z] = secant_model(sites.ss[z], sites.ys[z], sites.curvature[z])
    elif model == "bfgs":
        sites.hess[z] = bfgs_update(sites.hess[z], s, y, not sites.paired[z])
    sites.paired[z] = True


def _visit(sites: SiteModels, model: str, trial: np.ndarray, z: int, answer: tuple) -> None:
    """Site ``z`` answered at the point ``trial`` it was sent: accept the move or damp the
    model (module docstring, partial participation), in ``sites`` (a round's own copy)."""
    s = trial - sites.x[z]
    value, grad = float(answer[0]), np.asarray(answer[1], dtype=float)
    if not np.any(s):
        sites.value[z], sites.grad[z] = value, grad
        if model == "exact":
            sites.hess[z] = _exact(np.asarray(answer[2], dtype=float))
        return
    s3 = s.reshape(s.shape[0], -1)
    curve = float(np.sum(s3 * (sites.hess[z] @ s3)))
    norm2 = float(np.sum(s * s))
    actual = 2.0 * (value - sites.value[z] - float(np.sum(sites.grad[z] * s)))
    y = grad - sites.grad[z]
    noise = ROUNDING * max(abs(value), abs(float(sites.value[z])))  # the losses' own rounding
    damping = sites.damping[z]
    if np.isfinite(actual) and actual <= (1.0 + KAPPA) * (curve + damping * norm2) + noise:
        scale = max(float(np.trace(sites.hess[z])) / sites.hess.shape[1], 1e-300)
        sites.damping[z] = 0.0 if damping < 1e-12 * scale else damping / 4.0
        sites.x[z], sites.value[z], sites.grad[z] = trial, value, grad
        if model == "exact":
            sites.hess[z] = _exact(np.asarray(answer[2], dtype=float))
        else:
            _learn(sites, model, z, s, y)
        return
    need = (actual - curve) / norm2 if np.isfinite(actual) else 0.0
    sites.damping[z] = max(2.0 * damping, 2.0 * need, 1e-8 * max(curve / norm2, 1e-300))
    if model != "exact" and np.all(np.isfinite(y)):
        _learn(sites, model, z, s, y)


def _advance_incremental(
    problem: Problem,
    st: QuasiNewtonState,
    answered: dict[int, tuple],
    tol: float,
    lla: Linearization | None = None,
) -> tuple[QuasiNewtonState, Step]:
    """A round of the per-site form: partial participation, or exact curvature (module
    docstring)."""
    trial, model = st.search.trial, st.settings.model
    if lla is not None and st.sites.seen.any():
        # at the estimate the sites were sent (the last model solution), not at the kept
        # points, whose fused groups are split by their lag
        problem = lla.at(trial)
    sites = st.sites.copy()
    for z, answer in answered.items():
        if sites.seen[z]:
            _visit(sites, model, trial[z], z, answer)
        else:  # first answer: at the point it was sent
            sites.x[z] = trial[z]
            _take(sites, model, z, answer)
            if model == "exact":
                c = float(np.trace(sites.hess[z])) / sites.hess.shape[1]
                sites.damping[z] = st.settings.first_damping * max(c, 0.0)
    if not sites.seen.any():
        return replace(st, sites=sites), Step(False, np.inf, np.inf, False, 0)
    evaluated = bool(sites.seen.all())
    objective = (
        float(sites.value.sum() + problem.penalty_value(sites.x)) if evaluated else float("inf")
    )
    # a waiting site moves on the mean model
    st = replace(st, sites=sites, frozen=np.zeros_like(sites.seen), evaluated=evaluated,
                 objective=objective)  # fmt: skip
    st, it = _direction(problem, st, tol, lla)
    if st.evaluated:  # the model's value at the estimate (module docstring)
        st = replace(st, objective=estimate_objective(problem if lla is None else lla.target, st))
    converged = st.evaluated and _converged(tol, st)
    return st, Step(True, st.objective, _stop_measure(st), converged, it)


def estimate(st: QuasiNewtonState) -> np.ndarray:
    """The fit's coefficients: the accepted point, or in the incremental form the last model
    solution ``b`` (module docstring)."""
    return st.search.trial if st.settings.incremental else st.sites.x


def _curvature_terms(st: QuasiNewtonState) -> np.ndarray:
    """``d_z^T (B_z + mu_z I) d_z`` per site for the current direction (a waiting site's:
    the mean model it was solved with, :func:`_stand_ins`)."""
    x = st.sites.x
    d3 = st.search.direction.reshape(x.shape[0], x.shape[1], -1)
    waiting = st.settings.incremental and not st.sites.seen.all()
    hess = _stand_ins(st)[1] if waiting else _model_hessians(st)
    return np.einsum("zik,zij,zjk->z", d3, hess, d3)


def estimate_objective(problem: Problem, st: QuasiNewtonState) -> float:
    """``F`` at :func:`estimate`: at the accepted point its value; in the incremental form the
    model's value there, ``sum_z [f_z(x_z) + g_z^T d_z + (1/2) d_z^T (B_z + mu_z I) d_z] +
    P(b)``: a prediction (exact only where ``d_z = 0``), which the sites' answers at ``b``
    check in the next rounds.

    Parameters
    ----------
    problem : Problem
        The penalty side (for a nonconvex penalty, the target problem).
    st : QuasiNewtonState
        The state.

    Returns
    -------
    float
        The objective.
    """
    sites = st.sites
    if not st.settings.incremental:
        return float(sites.value.sum() + problem.penalty_value(sites.x))
    d = st.search.direction
    smooth = sites.value.sum() + np.sum(sites.grad * d) + 0.5 * _curvature_terms(st).sum()
    return float(smooth + problem.penalty_value(st.search.trial))


def _stop_measure(st: QuasiNewtonState) -> float:
    """What the stopping rule compares with ``tol max(1, |F|)``: the predicted decrease
    ``-Delta``; in the incremental form the models' curvature along the step, ``sum_z d_z^T
    (B_z + mu_z I) d_z`` (:func:`_converged`)."""
    if st.settings.incremental:
        return float(_curvature_terms(st).sum())
    return -st.search.decrease


def _backtrack(t: float, decrease: float, change: float) -> float:
    """The next trial step after ``t`` failed: the minimizer of the quadratic through
    ``F(x)``, the predicted slope ``decrease`` and the observed ``F(x + t d) - F(x) =
    change`` (Nocedal & Wright 2006, eq. 3.57), kept in ``[t/10, t/2]``."""
    curve = change - t * decrease  # > 0: the rise above the line (Armijo failed)
    if not np.isfinite(change) or curve <= 0:
        return 0.1 * t
    return float(np.clip(-decrease * t * t / (2.0 * curve), 0.1 * t, 0.5 * t))


def _converged(tol: float, st: QuasiNewtonState) -> bool:
    """``tol`` read as a relative objective gap: the predicted decrease
    ``-Delta <= tol max(1, |F(x)|)`` and the model step ``max|d| <= sqrt(tol) max(1,
    max|x|)`` (near the optimum the gap is about ``d^T H d / 2``: a step of order
    ``sqrt(tol)`` is a gap of order ``tol``; the step test keeps a flat model from stopping
    a fit far from the optimum).  A site whose model has not yet learned its curvature (no
    step pair yet, unless the model is the exact Hessian: its first model is a bound, not the
    curvature) needs ``max|d_z| <= tol max(1, max|x|)``: a warm start's first round cannot
    end a fit on a guessed model.  A damped site's step counts ``1 + mu_z / c_z`` times
    (``c_z`` its model's mean curvature): damping shortens a step, not the distance to the
    optimum.  In the incremental form ``-Delta`` is replaced by :func:`_stop_measure`; with
    a nonconvex penalty ``Delta`` is :func:`_model_decrease`."""
    sites = st.sites
    d = np.abs(st.search.direction).reshape(sites.x.shape[0], -1).max(axis=1, initial=0.0)
    if sites.damping.any():
        c = np.maximum(np.trace(sites.hess, axis1=1, axis2=2) / sites.x.shape[1], 1e-300)
        d = d * (1.0 + sites.damping / c)
    learned = sites.paired if st.settings.model != "exact" else np.ones_like(sites.paired)
    scale = max(1.0, float(np.max(np.abs(sites.x), initial=0.0)))
    allowed = np.where(learned, math.sqrt(tol), tol) * scale
    return bool(np.all(d <= allowed)) and _stop_measure(st) <= tol * max(1.0, abs(st.objective))
