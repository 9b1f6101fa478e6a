"""The server's model problem of :mod:`strategies.solvers.pqn`, solved without communication:
``min_d sum_z [g_z'd_z + d_z'B_z d_z / 2] + P(x + d)`` by an inner ADMM with exact linear
solves (dense, sparse, or block elimination on a forest; all pairs by per-site solves),
Anderson acceleration (:mod:`strategies.solvers.anderson`), the exact polish on a tree
(:mod:`strategies.solvers.polish`) and fused rows held compactly
(:mod:`strategies.solvers.fusedrows`);
docs/methods.md 1.4 step 3 and 2.4."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.linalg import cho_factor, cho_solve
from scipy.sparse.csgraph import connected_components
from scipy.sparse.linalg import splu

from . import fusedrows
from .admm import Problem
from .anderson import Anderson, splitting_step
from .polish import POLISH_FIRST, Forest, forest, polish, rooted

DENSE_LIMIT = 3000  # model problems up to this many unknowns per column use dense Cholesky
#: ... unless the graph is a forest and a dense solve (``n^2`` flops) costs more than a
#: block elimination's Python sweep over the forest's levels (about this many flops a level)
FOREST_LEVEL = 4e4
RELAX = 1.6  # the inner ADMM's over-relaxation
#: Residual balancing, split by split: every 10 iterations a split's rho doubles (halves)
#: when its primal (dual) residual exceeds the other this many times (Boyd et al. 2011
#: §3.4.1, applied to each split's own residuals; 3 halved RowFed's inner iterations but
#: changed a degenerate fit's support, docs/performance.md).
BALANCE = 10.0
#: The inner ADMM's iteration limit: where a model problem's solution is degenerate (a row
#: about to fuse or vanish) ADMM's rate collapses; the outer method absorbs an inexact step
#: (docs/methods.md 1.4 step 3 has the measurement behind the limit).
INNER_MAX_ITER = 2000
ANDERSON_MEMORY = 5  # the inner ADMM's Anderson acceleration: iterates it combines (0: off)


def model_scale(x: np.ndarray, grad: np.ndarray) -> float:
    """The scale the model problem's tolerance is relative to: ``max(1, max|x|, max|g|)``.

    Parameters
    ----------
    x : ndarray
        The point of the model problem.
    grad : ndarray
        The gradient at ``x``.

    Returns
    -------
    float
        ``max(1, max|x|, max|g|)``.
    """
    return max(1.0, float(np.max(np.abs(x))), float(np.max(np.abs(grad))))


@dataclass(frozen=True)
class ModelSolution:
    """The model problem's minimizer ``b = x + d`` and the inner ADMM state (warm start)."""

    b: np.ndarray
    delta: tuple[np.ndarray, ...]
    u: tuple[np.ndarray, ...]  # scaled duals, split k's by rho * weights[k]
    rho: float
    iterations: int
    #: each split's penalty relative to ``rho`` (powers of two; ``()``: all 1)
    weights: tuple[float, ...] = ()

    def split_weights(self, n_splits: int) -> np.ndarray:
        return np.asarray(self.weights, float) if self.weights else np.ones(n_splits)


def rebalance(
    rho: float, weights: np.ndarray, r: np.ndarray, s: np.ndarray, min_rho: float
) -> np.ndarray:
    """Residual balancing split by split (Boyd et al. 2011 §3.4.1 on each split's residuals).

    One penalty for all splits balances the sum of the residuals, which the largest split
    rules: RowFed's fusion over M (M - 1) / 2 pairs against M sparsity blocks (balanced
    split by split, its M = 50 fits at (100, 100) took 1.6-2.5 times fewer inner
    iterations, docs/performance.md).

    Parameters
    ----------
    rho : float
        The base penalty; split ``k``'s is ``rho * weights[k]``.
    weights : ndarray, shape (K,)
    r, s : ndarray, shape (K,)
        Each split's primal residual ``||A_k b - delta_k||`` and dual residual
        ``rho w_k ||A_k^T (delta_k - delta_k_old)||``.
    min_rho : float
        No split's penalty goes below it (MCP, SCAD).

    Returns
    -------
    rho, weights : float, ndarray
        The new penalties (split 0's stays the base: ``weights[0] = 1``).
    factor : ndarray, shape (K,)
        Each split's factor: 2 where ``r > BALANCE s``, 1/2 where ``s > BALANCE r``, else 1;
        its scaled dual is divided by it.
    """
    up, down = r > BALANCE * s, s > BALANCE * r
    factor = np.where(up, 2.0, np.where(down, 0.5, 1.0))
    factor[rho * weights * factor < min_rho] = 1.0
    return rho * factor[0], weights * factor / factor[0], factor


def site_gram(problem: Problem, weights: np.ndarray | None = None) -> sp.csr_matrix:
    """The site Gram matrix of the splits, weighted.

    Parameters
    ----------
    problem : Problem
    weights : ndarray, shape (K,), optional
        One per split; ``None`` (or all 1): the problem's own :meth:`Problem.gram`.

    Returns
    -------
    scipy.sparse.csr_matrix, shape (Z, Z)
        ``sum_k w_k A_k^T A_k``.
    """
    if weights is None or np.all(weights == 1.0):
        return problem.gram()
    g = sp.csr_matrix((problem.n_sites, problem.n_sites))
    for w, split in zip(weights, problem.splits, strict=True):
        g = g + w * (split.matrix.T @ split.matrix)
    return sp.csr_matrix(g)


def _complete_diagonal(gram: sp.csr_matrix, frozen: np.ndarray) -> tuple[np.ndarray, float] | None:
    """``(e, c)`` when the site Gram matrix among the live sites is ``c (diag(e) - 1 1^T)``
    (fusion over all pairs, any identity splits besides; RowFed's default graph), else
    ``None``.  Any other graph (a tree: O(Z) entries) is turned away by its count of entries
    before a dense matrix is formed."""
    live = ~np.asarray(frozen, bool)
    if live.sum() < 2 or gram.nnz != gram.shape[0] ** 2:
        return None
    g = gram.toarray()[np.ix_(live, live)]
    off = g[~np.eye(len(g), dtype=bool)]
    c = -float(off[0])
    if c <= 0.0 or not np.all(off == -c):
        return None
    return np.diag(g) / c + 1.0, c


def _complete_solver(hess: np.ndarray, e: np.ndarray, rho: float) -> Callable:
    """Solve ``(blockdiag(B_z) + rho ((diag(e) - 1 1^T) kron I_p)) b = r`` for the ``m`` live
    sites in ``O(m p^3)`` instead of ``O((m p)^3)``.  With ``K_z = B_z + rho e_z I`` and the
    sum ``s = sum_z b_z``, ``b_z = K_z^{-1} (r_z + rho s)``; summing gives ``C s = sum_z
    K_z^{-1} r_z`` with ``C = I - rho sum_z K_z^{-1} = sum_z K_z^{-1} (B_z / m + rho (e_z / m
    - 1) I)`` -- written so that no difference of nearly equal matrices is formed (``e_z >=
    m``: a site's degree counts every live site)."""
    m, p = hess.shape[:2]
    eye = np.eye(p)
    k = hess + (rho * e)[:, None, None] * eye
    k_inv = np.linalg.inv(k)
    c = np.einsum("zij,zjk->ik", k_inv, hess / m + (rho * (e / m - 1.0))[:, None, None] * eye)
    c_inv = np.linalg.inv(c)

    def solve(r: np.ndarray) -> np.ndarray:
        r3 = np.asarray(r).reshape(m, p, -1)
        kr = np.matmul(k_inv, r3)  # batched BLAS (einsum would loop)
        total = c_inv @ kr.sum(axis=0)
        out = kr + rho * np.matmul(k_inv, total)
        return out.reshape(np.shape(r))

    return solve


@dataclass(frozen=True)
class _Elimination:
    """A forest's elimination order: ``parent`` (-1 at roots), the off-diagonal entry to the
    parent ``weight``, and the sites by depth (``levels[0]``: the roots)."""

    parent: np.ndarray
    weight: np.ndarray
    levels: tuple[np.ndarray, ...]


def _elimination(gram: sp.spmatrix) -> _Elimination | None:
    """The elimination order of ``gram`` when its off-diagonal entries form a forest (a
    tree's Laplacian, with or without an identity split besides: GrAUC-PFL's graph, a
    RowFed tree), else ``None``."""
    g = sp.csr_matrix(gram)
    n = g.shape[0]
    off = sp.csr_matrix(g - sp.diags(g.diagonal()))
    off.eliminate_zeros()
    n_comp, label = connected_components(off, directed=False)
    if off.nnz != 2 * (n - n_comp):  # a cycle (or an asymmetric entry)
        return None
    parent, depth = rooted(off, label)
    has = parent >= 0
    weight = np.zeros(n)
    weight[has] = np.asarray(g[np.flatnonzero(has), parent[has]]).ravel()
    levels = tuple(np.flatnonzero(depth == k) for k in range(int(depth.max()) + 1))
    return _Elimination(parent, weight, levels)


def _forest_solver(hess: np.ndarray, gram: sp.spmatrix, order: _Elimination, rho: float):
    """Solve ``(blockdiag(B_z) + rho (G kron I_p)) b = r`` when ``G``'s off-diagonal entries
    form a forest, by block elimination from the leaves to the roots (``O(Z p^3)``; block
    Gaussian elimination on a tree keeps every Schur complement a ``p x p`` block).  With
    ``a = rho G_{c, parent}``: a child's block ``K_c`` (its own, less its children's
    ``a^2 K^{-1}``) leaves ``- a^2 K_c^{-1}`` on its parent's block and ``- a K_c^{-1} r_c`` on
    its parent's right-hand side; back down, ``b_c = K_c^{-1} (r_c - a b_parent)``.  Each
    level is one batched inversion of positive definite blocks."""
    n, p = hess.shape[:2]
    k = hess + (rho * np.asarray(sp.csr_matrix(gram).diagonal()))[:, None, None] * np.eye(p)
    a = rho * order.weight
    k_inv = np.empty_like(k)
    for level in reversed(order.levels):
        k_inv[level] = np.linalg.inv(k[level])
        below = level[order.parent[level] >= 0]
        np.subtract.at(k, order.parent[below], a[below, None, None] ** 2 * k_inv[below])

    def solve(r: np.ndarray) -> np.ndarray:
        rr = np.array(r, dtype=float).reshape(n, p, -1)
        for level in reversed(order.levels[1:]):
            t = np.einsum("zij,zjk->zik", k_inv[level], rr[level])
            np.subtract.at(rr, order.parent[level], a[level, None, None] * t)
        out = np.empty_like(rr)
        roots = order.levels[0]
        out[roots] = np.einsum("zij,zjk->zik", k_inv[roots], rr[roots])
        for level in order.levels[1:]:
            pull = rr[level] - a[level, None, None] * out[order.parent[level]]
            out[level] = np.einsum("zij,zjk->zik", k_inv[level], pull)
        return out.reshape(np.shape(r))

    return solve


def _tree_of(problem: Problem, x: np.ndarray, frozen: np.ndarray) -> Forest | None:
    """The forest to polish on (:mod:`strategies.solvers.polish`): one entrywise lasso split on a
    forest incidence with a level per edge (not per entry: a local linear approximation's),
    vector blocks, no frozen site; else ``None``.  Cached on the split."""
    if len(problem.splits) != 1 or x.ndim != 2 or frozen.any():
        return None
    split = problem.splits[0]
    if split.grouping != "entry" or split.penalty.kind != "lasso" or np.ndim(split.lam) > 1:
        return None
    if "_forest" not in split.__dict__:
        object.__setattr__(split, "_forest", forest(split.matrix))
    return split.__dict__["_forest"]


def linear_solver(
    problem: Problem, hess: np.ndarray, frozen: np.ndarray, x_flat: np.ndarray
) -> Callable[..., tuple[Callable, np.ndarray | float]]:
    """``factor(rho, weights=None) -> (solve, rhs_fixed)`` for the model problem's linear
    system ``(blockdiag(B_z) + rho (G kron I_p)) b = r``, ``G = sum_k w_k A_k^T A_k``
    (:func:`site_gram`), over the live sites' rows of ``b``: per-site solves for all pairs,
    block elimination on a forest, dense Cholesky when small, sparse LU otherwise.

    Parameters
    ----------
    problem : Problem
        The splits, whose weighted Gram matrix is ``G``.
    hess : ndarray, shape (Z, p, p)
        Each site's model ``B_z``.
    frozen : ndarray of bool, shape (Z,)
        The sites held at ``x``: their rows are left out of the system.
    x_flat : ndarray, shape (Z p, k)
        ``x`` flattened; a frozen site's rows stay at ``x`` and enter the right-hand side
        as ``rhs_fixed``.

    Returns
    -------
    callable
        ``factor(rho, weights=None)``, returning ``solve`` (the live rows of ``b`` from
        those of ``r``) and ``rhs_fixed`` (the frozen sites' share of the right-hand side,
        to subtract; ``0.0`` with none frozen).  The graph's kind is worked out once per
        weighting.
    """
    p = hess.shape[1]
    free = np.repeat(~frozen, p)
    live = ~frozen
    big = free.sum() ** 2 > FOREST_LEVEL  # else a dense solve is always cheaper
    shapes = {}  # the graph's kind (complete, forest order) for each weighting, worked out once

    def factor(rho, weights=None):
        key = None if weights is None else tuple(weights)
        if key not in shapes:
            g = site_gram(problem, weights)
            complete = _complete_diagonal(g, frozen)
            order = _elimination(g[live][:, live]) if complete is None and big else None
            gram = None  # G kron I_p, where a solve or the frozen sites need it
            if complete is None or (~free).any():
                gram = sp.kron(g, sp.identity(p), format="csr")
            shapes[key] = g, complete, order, gram
        g, complete, order, gram = shapes[key]
        rhs_fixed = 0.0
        if (~free).any():
            rhs_fixed = rho * (gram[free][:, ~free] @ x_flat[~free])
        if complete is not None:  # all pairs: per-site solves and one p x p system
            e, c = complete
            return _complete_solver(hess[live], e, rho * c), rhs_fixed
        if order is not None and len(order.levels) * FOREST_LEVEL < free.sum() ** 2:  # forest
            return _forest_solver(hess[live], g[live][:, live], order, rho), rhs_fixed
        gram_ff = gram[free][:, free] if (~free).any() else gram
        blocks = sp.block_diag(list(hess[live]), format="csr")  # the live sites' B_z
        matrix = blocks + rho * gram_ff  # symmetric positive definite
        if matrix.shape[0] <= DENSE_LIMIT:  # small (or dense): Cholesky
            chol = cho_factor(matrix.toarray())
            return (lambda r: cho_solve(chol, r, check_finite=False)), rhs_fixed
        # a symmetric fill-reducing ordering keeps a tree's sparsity (4x fewer nonzeros
        # than the default ordering for Z = 2000, p = 20)
        lu = splu(sp.csc_matrix(matrix), permc_spec="MMD_AT_PLUS_A")
        return (lambda r: lu.solve(np.asfortranarray(r))), rhs_fixed

    return factor


def solve_model(
    problem: Problem,
    x: np.ndarray,
    grad: np.ndarray,
    hess: np.ndarray,
    frozen: np.ndarray | None = None,
    warm: ModelSolution | None = None,
    tol: float = 1e-11,
    max_iter: int = INNER_MAX_ITER,
    min_rho: float = 0.0,
) -> ModelSolution:
    """Minimize ``sum_z <g_z, b_z - x_z> + (1/2) <b_z - x_z, B_z (b_z - x_z)> + sum_k
    P_k(A_k b)`` over ``b`` (``frozen`` sites held at ``x_z``) by ADMM with exact solves and
    residual balancing (Boyd et al. 2011 §3.4.1).

    With one entrywise lasso split on a forest (GrAUC-PFL's tree, ``l1``) and no frozen site,
    the answer is made exact by :func:`strategies.solvers.polish.polish`: first from the warm
    start's pattern (or, with no warm start, from the fusions of ``x`` itself, if it has any), then
    from ADMM's after 10, 20, 40, ... iterations; the first verified pattern is returned (the
    minimizer to rounding error, typically after one linear solve).  RowFed's problem
    (:func:`strategies.solvers.fusedrows.eligible`) is solved with its fused rows held
    compactly (:func:`strategies.solvers.fusedrows.solve_rows`).

    Parameters
    ----------
    problem : Problem
        The penalty side: the splits ``A_k`` and their penalties ``P_k``.
    x : ndarray, shape (Z, p) or (Z, p, q)
        The point; blocks are vectors or matrices (``B_z`` acts on each of the ``q``
        columns, so one factorization serves them all).
    grad : ndarray, shape of ``x``
        Each site's gradient ``g_z`` at ``x``.
    hess : ndarray, shape (Z, p, p)
        Each site's curvature model ``B_z``.
    frozen : ndarray of bool, shape (Z,), optional
        The sites held at ``x_z``; ``None``: none.
    warm : ModelSolution, optional
        A previous solution whose ``delta``, ``u``, ``rho`` and weights start the ADMM (and
        whose pattern is polished first); ``None``: ``delta = A x``, ``u = 0``.
    tol : float, optional
        The ADMM stops when the primal and dual residuals are at most ``tol`` relative to
        the problem's scale (:func:`model_scale`).
    max_iter : int, optional
        The inner ADMM's iteration limit.
    min_rho : float, optional
        Keeps the inner penalty above a nonconvex threshold's bound (MCP, SCAD).

    Returns
    -------
    ModelSolution
        The minimizer ``b`` and the inner ADMM state, a warm start for the next call.
    """
    n_sites, p = x.shape[:2]
    frozen = np.zeros(n_sites, bool) if frozen is None else np.asarray(frozen, bool)
    free = np.repeat(~frozen, p)
    splits = problem.splits
    if warm is not None:
        delta, u, rho = warm.delta, warm.u, max(warm.rho, min_rho)
        weights = warm.split_weights(len(splits))
    else:
        rho = max(float(np.median(np.trace(hess, axis1=1, axis2=2)) / p), min_rho)
        weights = np.ones(len(splits))
        a_x = problem.apply_all(x)
        delta = tuple(a.copy() for a in a_x)
        u = tuple(np.zeros_like(a) for a in a_x)
    x3 = x.reshape(n_sites, p, -1)
    linear = np.einsum("zij,zjk->zik", hess, x3) - grad.reshape(x3.shape)  # B x - g
    x_flat = x3.reshape(n_sites * p, -1)

    tree = _tree_of(problem, x, frozen)

    def polished(delta_guess: np.ndarray, done: int) -> ModelSolution | None:
        res = polish(tree, splits[0].lam, linear.reshape(x.shape), hess, delta_guess)
        if res is None:
            return None
        return ModelSolution(res.b, (res.delta,), (res.nu / rho,), rho, done + res.iterations)

    def weighted(vs: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
        return tuple(v if w == 1.0 else w * v for w, v in zip(weights, vs, strict=True))

    # last round's pattern is usually right; without one, a point with fused entries (a
    # warm start along a lam path) offers its own
    if tree is not None and (warm is not None or (delta[0] == 0.0).any()):
        sol = polished(delta[0], 0)
        if sol is not None:
            return sol
    factor = linear_solver(problem, hess, frozen, x_flat)
    if tree is None and fusedrows.eligible(problem, x):  # RowFed: fused rows held compactly
        return fusedrows.solve_rows(
            problem, x, hess, linear, factor, frozen, warm, tol, max_iter, min_rho,
            model_scale(x, grad), Anderson(ANDERSON_MEMORY), RELAX, ModelSolution,
            rebalance=rebalance,
        )  # fmt: skip
    next_polish = POLISH_FIRST
    solve, rhs_fixed = factor(rho, weights)
    b = x.copy()
    scale = model_scale(x, grad)
    accel = Anderson(ANDERSON_MEMORY)
    it = 0
    for it in range(1, max_iter + 1):  # noqa: B007
        pull = problem.apply_t_sum(weighted(tuple(d - uu for d, uu in zip(delta, u, strict=True))))
        rhs = linear + rho * pull.reshape(linear.shape)
        b_flat = x_flat.copy()
        b_flat[free] = solve(np.asarray(rhs.reshape(x_flat.shape)[free] - rhs_fixed))
        b = b_flat.reshape(x.shape)
        a_b = problem.apply_all(b)
        # over-relaxation (Boyd et al. 2011 §3.4.3; Eckstein & Bertsekas 1992)
        relaxed = tuple(RELAX * ab + (1.0 - RELAX) * d for ab, d in zip(a_b, delta, strict=True))
        new_delta = tuple(
            s.threshold(ab + uu, rho * w)
            for s, w, ab, uu in zip(splits, weights, relaxed, u, strict=True)
        )
        new_u = tuple(uu + ab - d for uu, ab, d in zip(u, relaxed, new_delta, strict=True))
        r_k = np.array([np.sum((ab - d) ** 2) for ab, d in zip(a_b, new_delta, strict=True)])
        moved = weighted(tuple(dn - do for dn, do in zip(new_delta, delta, strict=True)))
        r, s = np.sqrt(r_k.sum()), rho * np.linalg.norm(problem.apply_t_sum(moved))
        if r <= tol * scale and s <= tol * scale:
            delta, u = new_delta, new_u
            break
        # the next point: this iterate, or Anderson's combination of the last few
        proxes = tuple(
            lambda xi, s=s, rho=rho * w: s.threshold(xi, rho)
            for s, w in zip(splits, weights, strict=True)
        )
        pairs = splitting_step(
            accel, tuple(zip(delta, u, strict=True)), tuple(zip(new_delta, new_u, strict=True)),
            proxes,
        )  # fmt: skip
        delta, u = tuple(d for d, _ in pairs), tuple(uu for _, uu in pairs)
        if tree is not None and it == next_polish:  # ADMM finds the pattern early
            next_polish *= 2
            sol = polished(new_delta[0], it)
            if sol is not None:
                return sol
        if it % 10 == 0:  # residual balancing, split by split
            if len(splits) == 1:
                s_k = np.array([s])
            else:
                # moved_k holds w_k (delta_k - delta_k_old): s_k = rho w_k ||A_k^T ...||
                s_k = rho * np.array([np.linalg.norm(sp_.apply_t(m)) for sp_, m in zip(
                    splits, moved, strict=True)])  # fmt: skip
            rho, weights, change = rebalance(rho, weights, np.sqrt(r_k), s_k, min_rho)
            if np.any(change != 1.0):
                u = tuple(uu / f for uu, f in zip(u, change, strict=True))
                accel.reset()  # another penalty is another fixed-point map
                solve, rhs_fixed = factor(rho, weights)
    kept = tuple(map(float, weights)) if len(splits) > 1 else ()
    return ModelSolution(b, delta, u, rho, it, kept)


@dataclass(frozen=True)
class ModelRequest:
    """The arguments of one :func:`solve_model` call: a fit's model problem, solved where it
    is asked for or, in a batched run, with the other fits' (:mod:`strategies.server.workers`)."""

    problem: Problem
    x: np.ndarray
    grad: np.ndarray
    hess: np.ndarray
    frozen: np.ndarray
    warm: ModelSolution | None
    tol: float
    min_rho: float


def solve_request(req: ModelRequest) -> ModelSolution:
    """:func:`solve_model` of one request."""
    return solve_model(
        req.problem, req.x, req.grad, req.hess, req.frozen, req.warm, tol=req.tol,
        min_rho=req.min_rho,
    )  # fmt: skip
