"""The model problem's ADMM with fused rows held compactly (Flower-free; docs/methods.md 2.4).

RowFed fuses every pair of clients row by row: the inner ADMM of
:func:`strategies.pqn.solve_model` keeps, for the fusion split, ``delta`` and its scaled dual
``u`` for every pair ``(m, m')`` and every row ``j`` -- ``M (M - 1) / 2 x p x q`` numbers
each (12 million at ``M = 50``, ``p = q = 100``), touched several times an iteration.  Yet at
a solution most rows are *fused*: ``delta_mm'(j) = 0`` for every pair (in the paper's
designs, every zero row and every row without client clusters).

A row ``j`` whose ``delta`` is zero for every pair and whose dual lies in the range of the
incidence matrix ``D``, ``u(j) = D a(j)`` with one *potential* ``a_m(j)`` per client, is held
as ``a(j)`` (``M x q``) instead of ``(delta(j), u(j))``.  The ADMM step keeps it in that form
exactly, as long as every pair stays below its threshold:

- the over-relaxed image is ``1.6 D b(j) - 0.6 delta(j) = D (1.6 b(j))``, so the threshold's
  argument is ``D c`` with ``c = 1.6 b(j) + a(j)``: every pair is zeroed when
  ``max_mm' ||c_m - c_m'|| <= lam(j) / rho``, checked from the points' spread;
- the dual step is ``u <- u + D (1.6 b(j)) - 0 = D (a(j) + 1.6 b(j))``, the potentials
  kept at mean zero (``D 1 = 0``: a shift of every ``a_m`` leaves ``u`` as it is);
- its pull on ``b`` is ``D^T (0 - D a) = -(M a - 1 1^T a)`` (``D^T D = M I - 1 1^T``), and its
  primal residual ``||D b(j)||^2 = M sum_m ||b_m(j)||^2 - ||sum_m b_m(j)||^2``.

So its cost is ``O(M q)`` instead of ``O(M^2 q)``, and the iterates are the ADMM's own.  A
row whose pair would leave zero is expanded (``u(j) = D a(j)``) before the step, and goes
on as before.  A row is compressed where its ``delta`` is zero for every pair: at the start
(a warm start's fused rows; a fused start) and at :data:`EVENTS` points of a solve (every 5
iterations at first, then at growing intervals).  Its dual is then replaced by its
least-squares projection ``a = D^T u / M`` (``D^T u`` is unchanged, so is the next ``b``):
a restart of the ADMM from another point, which converges from any; finitely many restarts
keep it convergent.

Used for a problem of one all-pairs, row-grouped lasso fusion split (any levels; a row is
held compactly only while its pairs' levels are equal) and one identity sparsity split:
RowFed's model problem, MCP and SCAD through their local linear approximations.
"""

from __future__ import annotations

import math

import numpy as np

from .admm import Problem, all_pairs, incidence_matrix

#: Compression events per solve: every EVENT_EVERY iterations for the first EVENTS_EARLY,
#: then at doubling intervals, EVENTS in all (a finite number keeps the ADMM convergent).
EVENT_EVERY = 5
EVENTS_EARLY = 8
EVENTS = 12
#: Expanded states (entries of the fusion's delta) above this size take the plain ADMM
#: step: Anderson's combination costs several passes over the state, and while many rows
#: are still expanded the compression events restart it anyway.
PLAIN_SIZE = 2_000_000


def eligible(problem: Problem, x: np.ndarray) -> bool:
    """True for one all-pairs row-grouped lasso fusion split and one identity split, over
    matrix blocks (RowFed's model problem)."""
    if x.ndim != 3 or len(problem.splits) != 2:
        return False
    fusion, sparsity = problem.splits
    n = problem.n_sites
    if n < 3 or fusion.kind != "edges" or fusion.grouping != "row":
        return False
    if fusion.penalty.kind != "lasso" or sparsity.penalty.kind != "lasso":
        return False
    if sparsity.kind != "identity" or fusion.matrix.shape != (n * (n - 1) // 2, n):
        return False
    if "_all_pairs" not in fusion.__dict__:
        same = (fusion.matrix != incidence_matrix(all_pairs(n), n)).nnz == 0
        object.__setattr__(fusion, "_all_pairs", bool(same))
    return fusion.__dict__["_all_pairs"]


class _Rows:
    """The fusion split's state: ``delta`` and ``u`` of the expanded rows ``E``, the
    potentials ``a`` of the compressed rows ``C`` (``u = D a``, ``delta = 0``)."""

    def __init__(self, split, n: int, p: int, q: int) -> None:
        self.split = split
        self.d = split.matrix
        self.d_t = split.matrix.T.tocsr()
        self.n, self.p, self.q = n, p, q
        lam = np.asarray(split.lam, dtype=float)
        # per row j, the level when it is the same for every pair (else nan: never compact)
        if lam.ndim == 1:
            same = np.all(lam == lam[0])
            self.row_level = np.full(p, lam[0] if same else np.nan)
            self.lam_rows = lambda rows: lam[:, None, None]
        else:
            col = lam.reshape(lam.shape[0], p)
            uniform = np.all(col == col[:1], axis=0)
            self.row_level = np.where(uniform, col[0], np.nan)
            self.lam_rows = lambda rows: col[:, rows, None]

    # -- D and D^T on a set of rows -------------------------------------------------------
    def apply(self, b_rows: np.ndarray) -> np.ndarray:
        """``D b`` for ``b_rows`` of shape ``(M, k, q)``."""
        k = b_rows.shape[1]
        return np.asarray(self.d @ b_rows.reshape(self.n, k * self.q)).reshape(
            self.d.shape[0], k, self.q
        )

    def apply_t(self, v_rows: np.ndarray) -> np.ndarray:
        k = v_rows.shape[1]
        return np.asarray(self.d_t @ v_rows.reshape(v_rows.shape[0], k * self.q)).reshape(
            self.n, k, self.q
        )

    def laplacian(self, a: np.ndarray) -> np.ndarray:
        """``D^T D a = M a - 1 1^T a`` (all pairs)."""
        return self.n * a - a.sum(axis=0, keepdims=True)

    def spread_fits(self, c: np.ndarray, kappa: np.ndarray) -> np.ndarray:
        """Per row of ``c`` (``(M, k, q)``): True when every pair ``||c_m - c_m'|| <= kappa``."""
        centred = c - c.mean(axis=0, keepdims=True)
        radius = np.sqrt(np.max(np.sum(centred**2, axis=2), axis=0))
        ok = 2.0 * radius <= kappa  # sufficient: the spread's diameter bound
        unsure = np.flatnonzero(~ok & (radius <= kappa))  # diameter >= radius
        for j in unsure:
            pts = centred[:, j, :]
            sq = np.sum(pts * pts, axis=1)
            dist2 = sq[:, None] + sq[None, :] - 2.0 * (pts @ pts.T)
            ok[j] = float(np.max(dist2)) <= kappa[j] ** 2
        return ok


def solve_rows(
    problem: Problem,
    x: np.ndarray,
    hess: np.ndarray,
    linear: np.ndarray,
    factor,
    frozen: np.ndarray,
    warm,
    tol: float,
    max_iter: int,
    min_rho: float,
    scale: float,
    accel,
    relax: float,
    solution,
    trace: list | None = None,
):
    """:func:`strategies.pqn.solve_model`'s ADMM for an :func:`eligible` problem with the
    fused rows held compactly.  ``linear = B x - g``, ``factor`` the model's linear solver
    (:func:`strategies.pqn.linear_solver`), ``accel`` an empty
    :class:`strategies.pqn.Anderson`, ``solution`` the :class:`strategies.pqn.ModelSolution`
    class; the rest as there.  Returns the same solution (full ``delta`` and ``u``);
    ``trace``, when given, gets ``(iteration, rows held compactly)`` at every event."""
    n, p, q = x.shape
    fusion, sparsity = problem.splits
    rows = _Rows(fusion, n, p, q)
    x_flat = x.reshape(n * p, q)
    free = np.repeat(~frozen, p)
    if warm is not None:
        d_full, u_full = np.asarray(warm.delta[0]), np.asarray(warm.u[0])
        eta, v = np.array(warm.delta[1]), np.array(warm.u[1])
        rho = max(warm.rho, min_rho)
    else:
        rho = max(float(np.median(np.trace(hess, axis1=1, axis2=2)) / p), min_rho)
        d_full, u_full = rows.apply(x), np.zeros((n * (n - 1) // 2, p, q))
        eta, v = x.copy(), np.zeros_like(x)
    compact = np.all(d_full == 0.0, axis=(0, 2)) & np.isfinite(rows.row_level)
    expanded = np.flatnonzero(~compact)
    held = np.flatnonzero(compact)
    d_e, u_e = d_full[:, expanded].copy(), u_full[:, expanded].copy()
    a_c = rows.apply_t(u_full[:, held]) / n
    del d_full, u_full

    solve, rhs_fixed = factor(rho)
    b = x.copy()
    events, next_event = 0, EVENT_EVERY
    it = 0
    for it in range(1, max_iter + 1):  # noqa: B007
        # b: the linear solve on the pull of both splits
        pull = eta - v
        pull[:, expanded] += rows.apply_t(d_e - u_e)
        pull[:, held] -= rows.laplacian(a_c)
        rhs = linear + rho * pull
        b_flat = x_flat.copy()
        b_flat[free] = solve(np.asarray(rhs.reshape(n * p, q)[free] - rhs_fixed))
        b = b_flat.reshape(n, p, q)
        # compressed rows whose pairs would leave zero: expand them first
        c = relax * b[:, held] + a_c
        fits = rows.spread_fits(c, rows.row_level[held] / rho)
        if not fits.all():
            go = held[~fits]
            d_e = np.concatenate([d_e, np.zeros((d_e.shape[0], go.size, q))], axis=1)
            u_e = np.concatenate([u_e, rows.apply(a_c[:, ~fits])], axis=1)
            expanded = np.concatenate([expanded, go])
            held, a_c, c = held[fits], a_c[:, fits], c[:, fits]
            accel.reset()  # another state layout
        # the splits' steps (over-relaxed), expanded rows as in solve_model
        db_e = rows.apply(b[:, expanded])
        relaxed_e = relax * db_e + (1.0 - relax) * d_e
        lam_e = rows.lam_rows(expanded)
        new_d = fusion.penalty.threshold(relaxed_e + u_e, lam_e, rho, True)
        new_u = u_e + relaxed_e - new_d
        # u + D(1.6 b) = D(a + 1.6 b), delta stays 0; the potentials are defined up to a
        # common shift (D 1 = 0), kept at mean zero so that a fixed point of the ADMM is
        # one of this map (Anderson reads its residual)
        new_a = c - c.mean(axis=0, keepdims=True)
        relaxed_s = relax * b + (1.0 - relax) * eta
        new_eta = sparsity.threshold(relaxed_s + v, rho)
        new_v = v + relaxed_s - new_eta
        # residuals, as solve_model's
        b_c = b[:, held]
        r2 = float(np.sum((db_e - new_d) ** 2)) + float(np.sum((b - new_eta) ** 2))
        r2 += float(n * np.sum(b_c**2) - np.sum(b_c.sum(axis=0) ** 2))
        change = new_eta - eta
        change[:, expanded] += rows.apply_t(new_d - d_e)
        r, s = math.sqrt(max(r2, 0.0)), rho * float(np.linalg.norm(change))
        if r <= tol * scale and s <= tol * scale:
            d_e, u_e, a_c, eta, v = new_d, new_u, new_a, new_eta, new_v
            break
        if d_e.size > PLAIN_SIZE:  # a large expanded state: the plain iteration
            d_e, u_e, a_c, eta, v = new_d, new_u, new_a, new_eta, new_v
        else:
            point = ((d_e, u_e, a_c, eta, v),)
            image = ((new_d, new_u, new_a, new_eta, new_v),)
            ((d_e, u_e, a_c, eta, v),) = accel.step(point, image)
        if it == next_event and events < EVENTS:  # rows fused since: hold them compactly
            events += 1
            next_event += EVENT_EVERY if events < EVENTS_EARLY else next_event // 2
            now = np.all(d_e == 0.0, axis=(0, 2)) & np.isfinite(rows.row_level[expanded])
            if trace is not None:
                trace.append((it, int(held.size + now.sum())))
            if now.any():
                a_c = np.concatenate([a_c, rows.apply_t(u_e[:, now]) / n], axis=1)
                held = np.concatenate([held, expanded[now]])
                d_e, u_e, expanded = d_e[:, ~now], u_e[:, ~now], expanded[~now]
                accel.reset()
        if it % 10 == 0 and (r > 10 * s or s > 10 * r):  # residual balancing
            factor_ = 2.0 if r > s else 0.5
            if rho * factor_ < min_rho:
                continue
            rho *= factor_
            u_e, a_c, v = u_e / factor_, a_c / factor_, v / factor_
            accel.reset()
            solve, rhs_fixed = factor(rho)
    d_full = np.zeros((n * (n - 1) // 2, p, q))
    u_full = np.empty_like(d_full)
    d_full[:, expanded] = d_e
    u_full[:, expanded] = u_e
    u_full[:, held] = rows.apply(a_c)
    return solution(b, (d_full, eta), (u_full, v), rho, it)
