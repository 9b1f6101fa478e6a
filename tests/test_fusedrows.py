"""RowFed's model problem with fused rows held compactly (strategies/solvers/fusedrows.py).

The reference is a conic solver (cvxpy, Clarabel) on the model problem written out here
(every client pair, row groups, entrywise sparsity, matrix blocks), and the generic inner
ADMM of strategies/solvers/pqn.py (``eligible`` switched off): the compact path must reach the same
minimizer with the same fused rows, hold rows compactly where they are fused, and expand a
row whose pairs leave zero.
"""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest
from numpy.testing import assert_allclose

from strategies.solvers import admm, anderson, fusedrows, modelsolve
from strategies.solvers.penalties import Penalty
from strategies.solvers.problems import build_problem

M, P, Q = 6, 5, 3


def model(seed: int, spread: float = 0.3):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((M, P, Q)) * spread
    g = rng.standard_normal((M, P, Q)) * 0.4
    a = rng.standard_normal((M, 3 * P, P))
    hess = np.einsum("zki,zkj->zij", a, a) / (3 * P) + 0.05 * np.eye(P)
    return x, g, hess


def cvxpy_rows(x, g, hess, lam1, lam2, frozen=None):
    """The model problem: sum_m <g_m, B_m - X_m> + 1/2 tr((B_m - X_m)' H_m (B_m - X_m))
    + sum_pairs sum_j lam1_(pair, j) ||b_m(j) - b_m'(j)|| + sum lam2 |b|."""
    lam1 = np.broadcast_to(
        np.reshape(lam1, (-1, 1) if np.ndim(lam1) == 1 else np.shape(lam1)[:2]),
        (M * (M - 1) // 2, P),
    )
    b = [cp.Variable((P, Q)) for _ in range(M)]
    obj = 0
    for m in range(M):
        d = b[m] - x[m]
        obj += cp.sum(cp.multiply(g[m], d))
        obj += 0.5 * sum(cp.quad_form(d[:, k], hess[m]) for k in range(Q))
        obj += lam2 * cp.sum(cp.abs(b[m]))
    for e, (u, v) in enumerate(admm.all_pairs(M)):
        obj += cp.sum(cp.multiply(lam1[e], cp.norm(b[u] - b[v], 2, axis=1)))
    cons = [] if frozen is None else [b[m] == x[m] for m in np.flatnonzero(frozen)]
    prob = cp.Problem(cp.Minimize(obj), cons)
    prob.solve(solver="CLARABEL", tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    return np.stack([v.value for v in b]), prob.value


def model_value(b, x, g, hess, prob):
    d = b - x
    quad = 0.5 * np.einsum("zik,zij,zjk->", d, hess, d)
    return float(np.sum(g * d) + quad + prob.penalty_value(b))


def solve(prob, x, g, hess, frozen=None, warm=None, compact=True, trace=None, monkeypatch=None):
    frozen = np.zeros(M, bool) if frozen is None else frozen
    if not compact:
        monkeypatch.setattr(fusedrows, "eligible", lambda *a: False)
        return modelsolve.solve_model(prob, x, g, hess, frozen, warm=warm)
    assert fusedrows.eligible(prob, x)
    x_flat = x.reshape(M * P, Q)
    b_minus_g = np.einsum("zij,zjk->zik", hess, x) - g
    ms = modelsolve
    return fusedrows.solve_rows(
        prob, x, hess, b_minus_g, ms.linear_solver(prob, hess, frozen, x_flat), frozen,
        warm, 1e-11, 20000, 0.0, ms.model_scale(x, g), anderson.Anderson(ms.ANDERSON_MEMORY),
        ms.RELAX, ms.ModelSolution, trace, rebalance=ms.rebalance,
    )  # fmt: skip


def fused_rows(delta):
    return np.all(delta == 0.0, axis=(0, 2))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n_frozen", [0, 2])
def test_compact_rows_reach_the_conic_minimizer(seed, n_frozen, monkeypatch):
    x, g, hess = model(seed)
    prob = build_problem(M, "lasso", 0.12, 0.05)
    frozen = np.zeros(M, bool)
    frozen[[1, 4][:n_frozen]] = True
    trace: list = []
    sol = solve(prob, x, g, hess, frozen, trace=trace)
    ref, ref_val = cvxpy_rows(x, g, hess, 0.12, 0.05, frozen)
    assert_allclose(sol.b[frozen], x[frozen], rtol=0, atol=0)
    assert model_value(sol.b, x, g, hess, prob) - ref_val <= 1e-8 * max(1.0, abs(ref_val))
    assert_allclose(sol.b, ref, atol=1e-5)
    generic = solve(prob, x, g, hess, frozen, compact=False, monkeypatch=monkeypatch)
    assert_allclose(sol.b, generic.b, atol=1e-8)
    # the same rows fused exactly, and those the reference fuses
    assert np.array_equal(fused_rows(sol.delta[0]), fused_rows(generic.delta[0]))
    spread = np.ptp(ref, axis=0).max(axis=1)
    assert np.array_equal(fused_rows(sol.delta[0]), spread < 1e-6)


def test_fused_rows_are_held_compactly_and_a_fused_start_from_the_start():
    x, g, hess = model(3)
    x[:] = x[0]  # every client at the same point: every row fused at the start
    prob = build_problem(M, "lasso", 0.4, 0.02)
    trace: list = []
    sol = solve(prob, x, g, hess, trace=trace)
    ref, _ = cvxpy_rows(x, g, hess, 0.4, 0.02)
    assert_allclose(sol.b, ref, atol=1e-5)
    assert fused_rows(sol.delta[0]).any()
    assert trace and trace[0][1] >= 1  # rows held compactly from the first event on


def test_a_compact_row_whose_pairs_leave_zero_is_expanded(monkeypatch):
    """From a start where every row is fused, a weak fusion splits rows apart: they start
    compact and must be expanded to reach the minimizer."""
    x, g, hess = model(4)
    x[:] = x[0]
    g = g * 4.0  # strong, differing gradients: the clients pull apart
    prob = build_problem(M, "lasso", 0.01, 0.01)
    calls = []
    original = fusedrows._Held.check

    def spy(self, c, kappa):
        out = original(self, c, kappa)
        calls.append(int((~out).sum()))
        return out

    monkeypatch.setattr(fusedrows._Held, "check", spy)
    sol = solve(prob, x, g, hess)
    ref, ref_val = cvxpy_rows(x, g, hess, 0.01, 0.01)
    assert sum(calls) > 0  # some compact row was expanded
    assert_allclose(sol.b, ref, atol=1e-5)
    assert not fused_rows(sol.delta[0]).all()


def test_per_group_levels_of_a_local_linear_approximation(monkeypatch):
    """MCP's approximation: a level per (pair, row); rows whose pairs' levels differ are
    never held compactly, and the minimizer is the weighted problem's."""
    x, g, hess = model(5)
    scad = build_problem(M, Penalty("mcp"), 0.15, 0.05)
    lla = scad.linearized(x)
    lam1 = np.asarray(lla.splits[0].lam).reshape(-1, P)
    assert not np.all(lam1 == lam1[:1])  # levels differ between pairs somewhere
    lam2 = np.asarray(lla.splits[1].lam)
    assert fusedrows.eligible(lla, x)
    sol = solve(lla, x, g, hess)
    generic = solve(lla, x, g, hess, compact=False, monkeypatch=monkeypatch)
    assert_allclose(sol.b, generic.b, atol=1e-8)
    assert (
        abs(model_value(sol.b, x, g, hess, lla) - model_value(generic.b, x, g, hess, lla)) <= 1e-9
    )
    assert lam2.size >= 1


def test_a_warm_start_from_a_nearby_solution_gives_the_same_answer():
    x, g, hess = model(6)
    prob = build_problem(M, "lasso", 0.2, 0.05)
    first = solve(prob, x, g, hess)
    moved = solve(prob, x + 1e-3, g, hess, warm=first)
    cold = solve(prob, x + 1e-3, g, hess)
    assert_allclose(moved.b, cold.b, atol=1e-7)
    assert moved.iterations < cold.iterations


def test_only_rowfeds_model_problem_is_eligible():
    x = np.zeros((M, P, Q))
    assert fusedrows.eligible(build_problem(M, "lasso", 0.1, 0.1), x)
    assert not fusedrows.eligible(build_problem(M, "lasso", 0.1, 0.1), x[:, :, 0])
    chain = np.column_stack([np.arange(M - 1), np.arange(1, M)])
    assert not fusedrows.eligible(build_problem(M, "lasso", 0.1, 0.1, graph_edges=chain), x)
    block = build_problem(M, "lasso", 0.1, 0.1, fusion_grouping="block")
    assert not fusedrows.eligible(block, x)
    assert not fusedrows.eligible(build_problem(M, "scad", 0.1, 0.1), x)  # not linearized


def test_the_spread_of_nearly_equal_rows_keeps_its_digits():
    """The compact rows' primal residual ``sum_pairs ||b_m(j) - b_m'(j)||^2`` against the
    pair loop, for rows fused up to 1e-6 far from zero (a difference of sums of squares
    would be rounding noise there)."""
    rng = np.random.default_rng(9)
    b = 1e3 + 1e-6 * rng.standard_normal((M, P, Q))
    want = sum(float(np.sum((b[u] - b[v]) ** 2)) for u, v in admm.all_pairs(M))
    assert fusedrows.pair_spread(b) == pytest.approx(want, rel=1e-9)


def test_without_layout_changes_the_compact_iterates_are_the_generic_ones(monkeypatch):
    """Every row compact from the start and none expanded (a strong fusion): the accelerated
    compact iteration weighs the potentials as the duals they stand for, so its first
    iterates are the generic ADMM's (up to Anderson's single-precision differences)."""
    x, g, hess = model(8)
    x[:] = x[0]
    prob = build_problem(M, "lasso", 2.0, 0.05)
    monkeypatch.setattr(fusedrows, "EVENT_EVERY", 10**9)
    frozen = np.zeros(M, bool)
    b_minus_g = np.einsum("zij,zjk->zik", hess, x) - g
    for steps in (3, 6, 25):  # 25: past two residual balancings
        ms = modelsolve
        compact = fusedrows.solve_rows(
            prob, x, hess, b_minus_g, ms.linear_solver(prob, hess, frozen, x.reshape(M * P, Q)),
            frozen, None, 1e-14, steps, 0.0, ms.model_scale(x, g),
            anderson.Anderson(ms.ANDERSON_MEMORY), ms.RELAX, ms.ModelSolution,
            rebalance=ms.rebalance,
        )  # fmt: skip
        monkeypatch.setattr(fusedrows, "eligible", lambda *a: False)
        generic = modelsolve.solve_model(prob, x, g, hess, frozen, tol=1e-14, max_iter=steps)
        monkeypatch.undo()
        monkeypatch.setattr(fusedrows, "EVENT_EVERY", 10**9)
        assert fused_rows(compact.delta[0]).all()
        assert_allclose(compact.b, generic.b, rtol=0, atol=1e-7)
        assert compact.rho == generic.rho and compact.weights == generic.weights
    assert compact.weights[1] != 1.0  # by 25 steps the two splits' penalties have parted


@pytest.mark.parametrize(("seed", "lam1", "lam2"), [(3, 1.0, 0.2), (8, 1.0, 0.2), (3, 0.3, 0.05)])
def test_without_acceleration_the_compact_path_is_the_generic_admm_balancing_included(
    seed, lam1, lam2, monkeypatch
):
    """From a fused start (both paths' cold start), without Anderson acceleration, the compact
    path runs the generic ADMM's iterations: rows leave and rejoin the compact form, and each
    split balances its own penalty on its own residuals, so the two paths end on the same
    iteration with the same penalties (the splits parted: a dual residual weighted twice
    in one path would show here)."""
    x, g, hess = model(seed)
    x[:] = x[0]
    prob = build_problem(M, "lasso", lam1, lam2)
    frozen = np.zeros(M, bool)
    ms = modelsolve
    compact = fusedrows.solve_rows(
        prob, x, hess, np.einsum("zij,zjk->zik", hess, x) - g,
        ms.linear_solver(prob, hess, frozen, x.reshape(M * P, Q)), frozen, None, 1e-10, 5000,
        0.0, ms.model_scale(x, g), anderson.Anderson(0), ms.RELAX, ms.ModelSolution,
        rebalance=ms.rebalance,
    )  # fmt: skip
    monkeypatch.setattr(fusedrows, "eligible", lambda *a: False)
    monkeypatch.setattr(modelsolve, "ANDERSON_MEMORY", 0)
    generic = modelsolve.solve_model(prob, x, g, hess, frozen, tol=1e-10, max_iter=5000)
    assert compact.iterations == generic.iterations < 5000
    assert compact.rho == generic.rho and compact.weights == generic.weights
    assert_allclose(compact.b, generic.b, rtol=0, atol=1e-12)
    if lam1 == 1.0:
        assert compact.weights[1] < 1.0  # the sparsity split's penalty went its own way
