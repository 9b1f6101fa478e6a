"""The model problem's ADMM with fused rows held compactly (Flower-free; docs/methods.md 2.4).

RowFed fuses every pair of clients row by row: the inner ADMM of
:func:`strategies.solvers.modelsolve.solve_model` keeps, for the fusion split, ``delta`` and
its scaled dual ``u`` for every pair ``(m, m')`` and every row ``j`` --
``M (M - 1) / 2 x p x q`` numbers each (12 million at ``M = 50``, ``p = q = 100``), touched
several times an iteration.  Yet at a solution most rows are *fused*: ``delta_mm'(j) = 0``
for every pair (in the paper's designs, every zero row and every row without client
clusters).

A row ``j`` whose ``delta`` is zero for every pair is held as one *potential* per client,
``a(j)`` (``M x q``), and a remainder ``w(j)``: its dual split as ``u(j) = D a(j) + w(j)``
with ``w`` orthogonal to the range of the incidence matrix ``D`` (``a = D^T u / M``, the
least-squares part).  While every pair of the row stays at zero the ADMM step changes only
the potentials, so the row costs ``O(M q)`` an iteration instead of ``O(M^2 q)``, and the
iterates are the ADMM's own:

- the over-relaxed image is ``1.6 D b(j) - 0.6 delta(j) = D (1.6 b(j))``, so the threshold's
  argument is ``D c + w`` with ``c = 1.6 b(j) + a(j)``: every pair stays at zero when
  ``||c_m - c_m' + w_mm'|| <= lam(j) / rho`` for all pairs, settled from the points'
  spread and ``max ||w||`` where possible (``2 max_m ||c_m - mean(c)|| + max ||w||`` below
  the level: all stay; ``max_m ||c_m - mean(c)|| - max ||w||`` above it: one leaves), else
  pair by pair;
- the dual step is ``u <- u + D (1.6 b(j)) = D (a(j) + 1.6 b(j)) + w(j)``: ``w`` stays, the
  potentials move (kept at mean zero: ``D 1 = 0``, a shift of every ``a_m`` leaves ``u``);
- its pull on ``b`` is ``D^T (0 - u) = -(M a - 1 1^T a)`` (``D^T D = M I - 1 1^T``,
  ``D^T w = 0``), and its primal residual ``||D b(j)||^2 = M sum_m ||b_m(j)||^2 -
  ||sum_m b_m(j)||^2``.

A row whose pair would leave zero is expanded (``u(j) = D a(j) + w(j)``) before the step
and goes on as the generic ADMM; rows are held compactly again wherever their ``delta`` is
zero for every pair, at the start (a warm start's fused rows, a fused start) and every
:data:`EVENT_EVERY` iterations.  Nothing is projected or restarted.

Used for a problem of one all-pairs, row-grouped lasso fusion split (any levels; a row is
held compactly only while its pairs' levels are equal) and one identity sparsity split:
RowFed's model problem, MCP and SCAD through their local linear approximations.
"""

from __future__ import annotations

import math

import numpy as np

from .admm import Problem, all_pairs, incidence_matrix
from .anderson import splitting_step
from .polish import POLISH_FIRST
from .rowpolish import CG_BUDGET, PRODUCTS_PER_STEP, STABLE, polish_rows

#: Rows whose pairs all sit at zero are held compactly every this many iterations.
EVENT_EVERY = 5
#: Expanded states (entries of the fusion's delta) above this size take the plain ADMM
#: step: Anderson's combination costs several passes over the state, and while many rows
#: are still expanded their compression resets it anyway.
PLAIN_SIZE = 2_000_000


def eligible(problem: Problem, x: np.ndarray) -> bool:
    """True for one all-pairs row-grouped lasso fusion split and one identity split, over
    matrix blocks (RowFed's model problem).

    Parameters
    ----------
    problem : Problem
        The model problem's splits; whether the fusion's matrix is the all-pairs incidence
        is cached on the split.
    x : ndarray
        The point; matrix blocks are of shape ``(M, p, q)``.

    Returns
    -------
    bool
        Whether :func:`solve_rows` applies (at least 3 sites).
    """
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


def pair_spread(b_rows: np.ndarray) -> float:
    """``sum_j sum_{m < m'} ||b_m(j) - b_m'(j)||^2`` for ``b_rows`` of shape ``(M, k, q)``:
    ``M sum_m ||b_m(j) - mean_m b(j)||^2``, centred first so that nearly equal rows (fused
    rows are) lose no digits to a difference of large sums."""
    centred = b_rows - b_rows.mean(axis=0, keepdims=True)
    return b_rows.shape[0] * float(np.sum(centred * centred))


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


class _Held:
    """The rows held compactly: potentials ``a`` (``M x k x q``), the remainder ``w``
    (a ``P x q`` array a row, ``None`` where it is zero: a fused start's rows) of each row's
    dual and its largest pair norm ``w_max``, and for the
    test of :meth:`check`: each row's centred point set at its last check ``prev``, the
    room ``slack`` its pairs then had below the level, and how far the points have moved
    since (``drift``, a bound on any pair's change)."""

    def __init__(self, rows: _Rows, u_rows: np.ndarray | None, k: int = 0) -> None:
        """From the duals ``u_rows`` of the rows to hold, or ``k`` rows at zero dual."""
        self.rows = rows
        if u_rows is None:
            self.a, self.w, self.w_max = np.zeros((rows.n, k, rows.q)), [None] * k, np.zeros(k)
        else:
            self.a, self.w, self.w_max = self._split(u_rows)
        self._fresh(self.a.shape[1])

    def _split(self, u_rows: np.ndarray):
        """``a = D^T u / M`` (mean zero: ``1^T D^T = 0``) and ``w = u - D a``, orthogonal to
        the range of ``D`` (zero for a dual that came from potentials), kept row by row so
        that rows joining or leaving copy nothing else (``P x q`` a row: 1 MB at M = 50)."""
        a = self.rows.apply_t(u_rows) / self.rows.n
        w = u_rows - self.rows.apply(a)
        w_max = np.sqrt(np.max(np.sum(w * w, axis=2), axis=0)) if w.shape[0] else np.zeros(0)
        w_rows = [w[:, j].copy() if w_max[j] > 0.0 else None for j in range(w.shape[1])]
        return a, w_rows, w_max

    def remainder(self, idx: np.ndarray) -> np.ndarray | float:
        """``w`` of the held rows ``idx`` (``P x len(idx) x q``), or ``0.0`` if all are zero."""
        parts = [self.w[j] for j in idx]
        if all(w is None for w in parts):
            return 0.0
        out = np.zeros((self.rows.d.shape[0], len(parts), self.rows.q))
        for k, w in enumerate(parts):
            if w is not None:
                out[:, k] = w
        return out

    def _fresh(self, k: int) -> None:
        self.prev = np.zeros((self.rows.n, k, self.rows.q))
        self.slack = np.full(k, -np.inf)  # checked pair by pair first
        self.drift = np.zeros(k)

    @property
    def size(self) -> int:
        return self.a.shape[1]

    def add(self, u_rows: np.ndarray) -> None:
        a, w, w_max = self._split(u_rows)
        prev, slack, drift = self.prev, self.slack, self.drift
        self.a = np.concatenate([self.a, a], axis=1)
        self.w = self.w + w
        self.w_max = np.concatenate([self.w_max, w_max])
        self._fresh(a.shape[1])
        self.prev = np.concatenate([prev, self.prev], axis=1)
        self.slack = np.concatenate([slack, self.slack])
        self.drift = np.concatenate([drift, self.drift])

    def dual(self, mask: np.ndarray) -> np.ndarray:
        """``u = D a + w`` of the rows in ``mask``."""
        return self.rows.apply(self.a[:, mask]) + self.remainder(np.flatnonzero(mask))

    def write(self, out: np.ndarray, rows: np.ndarray, a: np.ndarray | None = None) -> None:
        """``u = D a + w`` of every held row into ``out[:, rows]`` (``out`` the full ``P x p x
        q`` dual, ``rows`` the held rows' indices; ``a`` the potentials, by default the
        held ones), with no other array of that size."""
        out[:, rows] = self.rows.apply(self.a if a is None else a)
        for j, w in zip(rows, self.w, strict=True):
            if w is not None:
                out[:, j] += w

    def keep(self, mask: np.ndarray) -> None:
        for name in ("a", "prev"):
            setattr(self, name, getattr(self, name)[:, mask])
        self.w = [w for w, k in zip(self.w, mask, strict=True) if k]
        for name in ("w_max", "slack", "drift"):
            setattr(self, name, getattr(self, name)[mask])

    def scale(self, factor: float) -> None:
        """The dual rescaled with ``rho`` (``u / factor``); the level moves too: check anew."""
        self.a, self.w_max = self.a / factor, self.w_max / factor
        self.w = [None if w is None else w / factor for w in self.w]
        self.slack[:] = -np.inf

    def check(self, c: np.ndarray, kappa: np.ndarray) -> np.ndarray:
        """Per row: True when every pair's ``||c_m - c_m' + w_mm'|| <= kappa`` (the threshold
        keeps it at zero), with ``c = 1.6 b + a`` (``M x k x q``).  A pair's norm moves by
        at most twice the largest move of a point, so a row whose points moved less, since
        its last check, than the room its pairs had then is settled without a look; else the
        spread settles it (``2 radius + max ||w||`` below the level: every pair stays;
        ``radius - max ||w||`` above it: one leaves), else its pairs are checked one by one.
        """
        centred = c - c.mean(axis=0, keepdims=True)
        self.drift += 2.0 * np.sqrt(np.max(np.sum((centred - self.prev) ** 2, axis=2), axis=0))
        self.prev = centred
        ok = self.drift <= self.slack
        look = np.flatnonzero(~ok)
        if look.size:
            radius = np.sqrt(np.max(np.sum(centred[:, look] ** 2, axis=2), axis=0))
            bound = 2.0 * radius + self.w_max[look]
            spread_ok = bound <= kappa[look]
            ok[look[spread_ok]] = True
            self.slack[look[spread_ok]] = kappa[look[spread_ok]] - bound[spread_ok]
            self.drift[look[spread_ok]] = 0.0
            rest = look[~spread_ok & (radius - self.w_max[look] <= kappa[look])]
            if rest.size:
                v = self.rows.apply(c[:, rest]) + self.remainder(rest)
                top = np.sqrt(np.max(np.sum(v * v, axis=2), axis=0))
                ok[rest] = top <= kappa[rest]
                self.slack[rest] = kappa[rest] - top
                self.drift[rest] = 0.0
        return ok


def _polisher(problem: Problem, x, hess, linear, frozen, scale: float, solution):
    """``attempt(fused, delta_s, b, u_f, rho, weights, done, budget)``: the exact solution on the
    pattern of an ADMM state (:func:`strategies.solvers.rowpolish.polish_rows`; ``fused``
    the fused pair rows, ``u_f()`` the fusion's scaled duals, asked for only to certify) as
    a ``solution``, or ``None``; ``None`` itself where the polish does not apply (a frozen
    site: left to ADMM; sparsity by row)."""
    fusion, sparsity = problem.splits
    if np.any(frozen) or sparsity.grouping != "entry":
        return None
    n, p, q = x.shape
    lam = np.asarray(fusion.lam, dtype=float)
    lam_f = np.broadcast_to(lam.reshape(lam.shape[0], -1), (lam.shape[0], p))
    lam = np.asarray(sparsity.lam, dtype=float)
    lam_s = np.broadcast_to(lam.reshape(lam.shape + (1,) * (3 - lam.ndim)), x.shape)
    grad = []  # the model's gradient at x, computed at the first attempt

    def attempt(fused, delta_s, b, u_f, rho, weights, done, budget=CG_BUDGET):
        if not grad:
            grad.append(np.matmul(hess, x) - linear)

        def y_f():
            y = u_f()
            y *= rho * weights[0]
            return y

        res = polish_rows(x, grad[0], hess, lam_f, lam_s, fused, delta_s, b, y_f, scale, budget)
        if res is None:
            return None
        u = tuple(y / (rho * w) for y, w in zip(res.y, weights, strict=True))
        return solution(res.b, res.delta, u, rho, done + res.steps, tuple(map(float, weights)))

    return attempt


def _pattern_of(d_e, expanded, eta, pairs: int, p: int) -> tuple[np.ndarray, np.ndarray]:
    """An ADMM state's pattern: the fused pair rows (``E x p``; the held rows all fused) and
    the zero entries."""
    fused = np.ones((pairs, p), bool)
    fused[:, expanded] = np.all(d_e == 0.0, axis=2)
    return fused, eta == 0.0


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
    *,
    rebalance,
):
    """:func:`strategies.solvers.modelsolve.solve_model`'s ADMM for an :func:`eligible` problem with
    the fused rows held compactly.

    Parameters
    ----------
    problem : Problem
        The model problem's splits: the fusion, then the sparsity.
    x : ndarray, shape (M, p, q)
        The point.
    hess : ndarray, shape (M, p, p)
        Each site's curvature model ``B``.
    linear : ndarray, shape (M, p, q)
        ``B x - g``.
    factor : callable
        The model's linear solver (:func:`strategies.solvers.modelsolve.linear_solver`).
    frozen : ndarray of bool, shape (M,)
        The sites held at ``x``.
    warm : ModelSolution or None
        A previous solution to start from; ``None``: a fused start (every row held
        compactly, at zero dual).
    tol : float
        The residuals' tolerance, relative to ``scale``.
    max_iter : int
        The iteration limit.
    min_rho : float
        No split's penalty goes below it.
    scale : float
        The scale the tolerance is relative to
        (:func:`strategies.solvers.modelsolve.model_scale`).
    accel : Anderson
        An empty :class:`strategies.solvers.anderson.Anderson`.
    relax : float
        The over-relaxation.
    solution : type
        The :class:`strategies.solvers.modelsolve.ModelSolution` class.
    trace : list, optional
        When given, gets ``(iteration, rows held compactly)`` at every event.
    rebalance : callable
        The residual balancing rule (:func:`strategies.solvers.modelsolve.rebalance`, split
        by split: ``rho`` is the fusion's, the sparsity's ``rho * w``).

    Returns
    -------
    ModelSolution
        The same solution as ``solve_model``'s (full ``delta`` and ``u``), or the exact one
        on the pattern of the warm start or of an iterate whose pattern has settled (tried
        every 10 iterations, waiting twice as long after each refusal;
        :mod:`strategies.solvers.rowpolish`), where it is certified.
    """
    n, p, q = x.shape
    fusion, sparsity = problem.splits
    attempt = _polisher(problem, x, hess, linear, frozen, scale, solution)
    if attempt is not None and warm is not None:  # last round's pattern may still hold
        w_0 = warm.split_weights(2)
        fused = np.all(warm.delta[0] == 0.0, axis=2)
        sol = attempt(fused, warm.delta[1], warm.b, lambda: warm.u[0] * (warm.rho / max(
            warm.rho, min_rho)), max(warm.rho, min_rho), w_0, 0)  # fmt: skip
        if sol is not None:
            return sol
    rows = _Rows(fusion, n, p, q)
    x_flat = x.reshape(n * p, q)
    free = np.repeat(~frozen, p)
    pairs = n * (n - 1) // 2
    if warm is not None:
        d_full, u_full = np.asarray(warm.delta[0]), np.asarray(warm.u[0])
        eta, v = np.array(warm.delta[1]), np.array(warm.u[1])
        rho = max(warm.rho, min_rho)
        weights = warm.split_weights(2)
        compact = np.all(d_full == 0.0, axis=(0, 2)) & np.isfinite(rows.row_level)
        expanded, held = np.flatnonzero(~compact), np.flatnonzero(compact)
        d_e, u_e = d_full[:, expanded].copy(), u_full[:, expanded].copy()
        held_rows = _Held(rows, u_full[:, held])
        del d_full, u_full
    else:
        # a cold start is a fused one: every row held compactly, its pairs at zero with zero
        # duals (any start is ADMM's; from delta = D x, every row is expanded until ADMM
        # fuses it, tens of iterations over all M (M - 1) / 2 pairs at large M)
        rho = max(float(np.median(np.trace(hess, axis1=1, axis2=2)) / p), min_rho)
        eta, v = x.copy(), np.zeros_like(x)
        weights = np.ones(2)
        compact = np.isfinite(rows.row_level)  # else pair levels differ: never compact
        expanded, held = np.flatnonzero(~compact), np.flatnonzero(compact)
        d_e = np.zeros((pairs, expanded.size, q))
        u_e = np.zeros_like(d_e)
        held_rows = _Held(rows, None, held.size)
    a_c = held_rows.a

    solve, rhs_fixed = factor(rho, weights)
    b = x.copy()
    it = 0
    next_polish, gap, last_polish = POLISH_FIRST, POLISH_FIRST, 0
    seen = _pattern_of(d_e, expanded, eta, pairs, p)  # the pattern, every POLISH_FIRST its
    for it in range(1, max_iter + 1):  # noqa: B007
        # b: the linear solve on the pull of both splits
        w_s = weights[1]  # the sparsity split's penalty is rho * w_s
        pull = eta - v if w_s == 1.0 else w_s * (eta - v)
        pull[:, expanded] += rows.apply_t(d_e - u_e)
        pull[:, held] -= rows.laplacian(a_c)
        rhs = linear + rho * pull
        b_flat = x_flat.copy()
        b_flat[free] = solve(np.asarray(rhs.reshape(n * p, q)[free] - rhs_fixed))
        b = b_flat.reshape(n, p, q)
        # compressed rows whose pairs would leave zero: expand them first
        held_rows.a = a_c
        c = relax * b[:, held] + a_c
        fits = held_rows.check(c, rows.row_level[held] / rho)
        if not fits.all():
            go = held[~fits]
            d_e = np.concatenate([d_e, np.zeros((d_e.shape[0], go.size, q))], axis=1)
            u_e = np.concatenate([u_e, held_rows.dual(~fits)], axis=1)
            expanded = np.concatenate([expanded, go])
            held_rows.keep(fits)
            held, a_c, c = held[fits], held_rows.a, c[:, fits]
            accel.reset()  # another state layout
        # the splits' steps (over-relaxed), expanded rows as in solve_model
        db_e = rows.apply(b[:, expanded])
        relaxed_e = relax * db_e + (1.0 - relax) * d_e
        lam_e = rows.lam_rows(expanded)
        new_d = fusion.penalty.threshold(relaxed_e + u_e, lam_e, rho, True)
        new_u = u_e + relaxed_e - new_d
        # u + D(1.6 b) = D(a + 1.6 b) + w, delta stays 0; the potentials are defined up to a
        # common shift (D 1 = 0), kept at mean zero so that a fixed point of the ADMM is
        # one of this map (Anderson reads its residual)
        new_a = c - c.mean(axis=0, keepdims=True)
        relaxed_s = relax * b + (1.0 - relax) * eta
        new_eta = sparsity.threshold(relaxed_s + v, rho * w_s)
        new_v = v + relaxed_s - new_eta
        # residuals, as solve_model's
        b_c = b[:, held]
        r_f2 = float(np.sum((db_e - new_d) ** 2)) + pair_spread(b_c)
        r_s2 = float(np.sum((b - new_eta) ** 2))
        change = new_eta - eta if w_s == 1.0 else w_s * (new_eta - eta)
        moved_f = rows.apply_t(new_d - d_e)
        if it % 10 == 0:  # each split's dual residual, for the balancing below
            s_k = rho * np.array([np.linalg.norm(moved_f), np.linalg.norm(change)])
        change[:, expanded] += moved_f
        r, s = math.sqrt(max(r_f2 + r_s2, 0.0)), rho * float(np.linalg.norm(change))
        if r <= tol * scale and s <= tol * scale:
            d_e, u_e, a_c, eta, v = new_d, new_u, new_a, new_eta, new_v
            break
        if attempt is not None and it % POLISH_FIRST == 0:
            # ADMM finds the pattern early: tried once it changes little, then less often
            now = _pattern_of(new_d, expanded, new_eta, pairs, p)
            changed = sum(int(np.sum(new != old)) for new, old in zip(now, seen, strict=True))
            settled = changed <= STABLE * sum(int(mask.sum()) for mask in now)
            seen = now
        if attempt is not None and it % POLISH_FIRST == 0 and it >= next_polish and settled:
            budget = PRODUCTS_PER_STEP * (it - last_polish)
            next_polish, gap, last_polish = it + gap, 2 * gap, it

            def duals(held=held, new_u=new_u, new_a=new_a, expanded=expanded):
                u_full = np.empty((pairs, p, q))
                u_full[:, expanded] = new_u
                held_rows.write(u_full, held, new_a)
                return u_full

            sol = attempt(seen[0], new_eta, b, duals, rho, weights, it, budget)
            if sol is not None:
                return sol
        if d_e.size > PLAIN_SIZE:  # a large expanded state: the plain iteration
            d_e, u_e, a_c, eta, v = new_d, new_u, new_a, new_eta, new_v
        else:
            # the potentials weighed as the duals they stand for: ||D a||^2 = M ||a||^2 for
            # mean-zero a, so Anderson combines the iterates as it would the generic ADMM's
            root = math.sqrt(n)
            point = ((d_e, u_e), (None, root * a_c), (eta, v))
            image = ((new_d, new_u), (None, root * new_a), (new_eta, new_v))
            proxes = (
                lambda xi, lam=lam_e, rho=rho: fusion.penalty.threshold(xi, lam, rho, True),
                None,
                lambda xi, rho=rho * w_s: sparsity.threshold(xi, rho),
            )
            (d_e, u_e), (_, a_c), (eta, v) = splitting_step(accel, point, image, proxes)
            a_c = a_c / root
        if it % EVENT_EVERY == 0:  # rows fused since: hold them compactly
            now = np.all(d_e == 0.0, axis=(0, 2)) & np.isfinite(rows.row_level[expanded])
            if trace is not None:
                trace.append((it, int(held.size + now.sum())))
            if now.any():
                held_rows.a = a_c
                held_rows.add(u_e[:, now])
                a_c = held_rows.a
                held = np.concatenate([held, expanded[now]])
                d_e, u_e, expanded = d_e[:, ~now], u_e[:, ~now], expanded[~now]
                accel.reset()
        if it % 10 == 0:  # residual balancing, split by split
            r_k = np.sqrt([max(r_f2, 0.0), r_s2])
            rho, weights, change_k = rebalance(rho, weights, r_k, s_k, min_rho)
            if np.any(change_k != 1.0):
                f_f, f_s = change_k
                held_rows.a = a_c
                if f_f != 1.0:
                    held_rows.scale(f_f)
                u_e, a_c, v = u_e / f_f, held_rows.a, v / f_s
                accel.reset()
                solve, rhs_fixed = factor(rho, weights)
    d_full = np.zeros((pairs, p, q))
    u_full = np.empty_like(d_full)
    d_full[:, expanded] = d_e
    u_full[:, expanded] = u_e
    held_rows.a = a_c
    held_rows.write(u_full, held)
    return solution(b, (d_full, eta), (u_full, v), rho, it, tuple(map(float, weights)))
