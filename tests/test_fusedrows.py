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

from strategies.solvers import admm, anderson, fusedrows, modelsolve, rowpolish
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
    + sum_pairs sum_j lam1_(pair, j) ||b_m(j) - b_m'(j)|| + sum lam2_mjk |b_mjk|."""
    lam1 = np.broadcast_to(
        np.reshape(lam1, (-1, 1) if np.ndim(lam1) == 1 else np.shape(lam1)[:2]),
        (M * (M - 1) // 2, P),
    )
    lam2 = np.broadcast_to(lam2, x.shape)  # one level, or one per entry
    b = [cp.Variable((P, Q)) for _ in range(M)]
    obj = 0
    for m in range(M):
        d = b[m] - x[m]
        obj += cp.sum(cp.multiply(g[m], d))
        obj += 0.5 * sum(cp.quad_form(d[:, k], hess[m]) for k in range(Q))
        obj += cp.sum(cp.multiply(lam2[m], cp.abs(b[m])))
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
    monkeypatch.setattr(fusedrows, "_polisher", lambda *a: None)  # the ADMM's iterates
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
        monkeypatch.setattr(fusedrows, "_polisher", lambda *a: None)
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
    monkeypatch.setattr(fusedrows, "_polisher", lambda *a: None)  # the ADMM's iterates
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


# -- the exact solve on an identified pattern (strategies/solvers/rowpolish.py) ------------


def levels_of(prob, x):
    """The fusion levels per (pair, row) and the sparsity levels per entry of ``prob``."""
    fusion, sparsity = prob.splits
    lam = np.asarray(fusion.lam, float)
    lam_f = np.broadcast_to(lam.reshape(lam.shape[0], -1), (lam.shape[0], P)).copy()
    lam = np.asarray(sparsity.lam, float)
    lam_s = np.broadcast_to(lam.reshape(lam.shape + (1,) * (3 - lam.ndim)), x.shape).copy()
    return lam_f, lam_s


def rough_admm(prob, x, g, hess, tol, monkeypatch):
    """The inner ADMM alone (no polish), stopped at ``tol``."""
    with monkeypatch.context() as patch:
        patch.setattr(fusedrows, "_polisher", lambda *a: None)
        return modelsolve.solve_model(prob, x, g, hess, tol=tol)


def assert_kkt(b, x, g, hess, lam_f, lam_s, y_f, y_s):
    """The optimality conditions, checked on their own: stationarity, each multiplier in its
    level's subdifferential (``lam d / ||d||`` where a pair's rows differ, within the ball
    where they are equal; ``lam2 sign b`` off zero, within the box at zero)."""
    plus, minus = admm.all_pairs(M).T
    pull = np.zeros_like(b)
    np.add.at(pull, plus, y_f)
    np.add.at(pull, minus, -y_f)
    station = g + np.einsum("zij,zjk->zik", hess, b - x) + pull + y_s
    assert np.abs(station).max() <= 1e-9
    d = b[plus] - b[minus]
    dist = np.linalg.norm(d, axis=2)
    apart = dist > 0
    unit = d / np.where(apart, dist, 1.0)[:, :, None]
    assert_allclose(y_f[apart], (lam_f[:, :, None] * unit)[apart], rtol=0, atol=1e-12)
    assert np.all(np.linalg.norm(y_f, axis=2)[~apart] <= lam_f[~apart] * (1 + 1e-9) + 1e-12)
    on = b != 0
    assert_allclose(y_s[on], (lam_s * np.sign(b))[on], rtol=0, atol=1e-12)
    assert np.all(np.abs(y_s[~on]) <= lam_s[~on] * (1 + 1e-9) + 1e-12)


def polished_and_reference(prob, x, g, hess, monkeypatch):
    """The polish of the inner ADMM's iterate at 1e-5 (asserted to be certified), and the
    conic solver's minimizer and value."""
    lam_f, lam_s = levels_of(prob, x)
    rough = rough_admm(prob, x, g, hess, 1e-5, monkeypatch)
    res = rowpolish.polish_rows(
        x, g, hess, lam_f, lam_s, np.all(rough.delta[0] == 0.0, axis=2), rough.delta[1],
        rough.b, lambda: rough.rho * rough.u[0], modelsolve.model_scale(x, g),
    )  # fmt: skip
    assert res is not None
    return (res, *cvxpy_rows(x, g, hess, lam_f, lam_s))


POLISH_CASES = [(0, 0.12, 0.05), (1, 0.3, 0.1), (2, 0.05, 0.2), (4, 0.25, 0.02), (7, 0.6, 0.08)]


@pytest.mark.parametrize(("seed", "lam1", "lam2"), POLISH_CASES)
def test_the_pattern_polish_is_the_conic_minimizer_with_exact_multipliers(
    seed, lam1, lam2, monkeypatch
):
    """From an ADMM iterate at 1e-5, the polish ends at the conic solver's minimizer (its
    objective no higher), with multipliers that satisfy the optimality conditions to
    rounding, rows fused and entries zero exactly where the reference has them."""
    x, g, hess = model(seed)
    prob = build_problem(M, "lasso", lam1, lam2)
    lam_f, lam_s = levels_of(prob, x)
    res, ref, ref_val = polished_and_reference(prob, x, g, hess, monkeypatch)
    assert_allclose(res.b, ref, rtol=0, atol=1e-6)
    assert model_value(res.b, x, g, hess, prob) <= ref_val + 1e-10 * max(1.0, abs(ref_val))
    assert_kkt(res.b, x, g, hess, lam_f, lam_s, *res.y)
    plus, minus = admm.all_pairs(M).T
    equal = np.all(res.b[plus] == res.b[minus], axis=2)  # (pair, row) fused exactly
    assert np.array_equal(equal, np.linalg.norm(ref[plus] - ref[minus], axis=2) < 1e-7)
    assert np.array_equal(res.b == 0.0, np.abs(ref) < 1e-7)
    assert np.array_equal(res.delta[0], res.b[plus] - res.b[minus])  # zero where fused


def test_the_preconditioner_is_the_inverse_of_the_hessians_diagonal(monkeypatch):
    """Newton's conjugate gradients are preconditioned by the reduced Hessian's diagonal:
    brute force (each unit vector through the Hessian operator) on a pattern with clusters
    of several sizes, zero entries and pairs of clusters apart."""
    x, g, hess = model(1)
    prob = build_problem(M, "lasso", 0.3, 0.1)
    lam_f, lam_s = levels_of(prob, x)
    rough = rough_admm(prob, x, g, hess, 1e-5, monkeypatch)
    pat, v = rowpolish.read_pattern(
        np.all(rough.delta[0] == 0.0, axis=2), rough.delta[1], rough.b, lam_f
    )
    assert np.unique(pat.size).size > 1 and pat.zero.any() and pat.level.size
    red = rowpolish._Reduced(pat, x, g, hess, lam_s)
    op, inv = red.newton_system(v)
    diag = np.array([op.matvec(e)[i] for i, e in enumerate(np.eye(v.size))])
    free = ~pat.zero.ravel()
    assert np.all(diag[free] > 0) and np.all(diag[~free] == 0)
    got = inv.matvec(np.ones(v.size))
    assert_allclose(got[free], 1.0 / diag[free], rtol=1e-12)
    assert np.all(got[~free] == 1.0)


def test_a_tight_cut_is_carried_at_full_level_and_keeps_the_balance():
    """A cluster whose first member must send the flow F to the others across pairs of
    unequal levels summing exactly to ||F|| (the boundary case of two clusters that just
    met): from multipliers that balance it but stray by 1e-4 off the only feasible flow
    across (as an inner ADMM's do), some pairs over their levels, the cut puts every pair
    across at its level and keeps what the multipliers balance, exactly."""
    n, q = 6, 3
    pairs = admm.all_pairs(n)
    first = pairs[:, 0] == 0  # the pairs (0, b): across the cut {0} | {1, ..., 5}
    lam = np.ones(len(pairs))
    lam[first] = [0.5, 1.0, 1.5, 2.0, 1.0]
    flow = np.array([3.0, -4.0, 12.0]) / 13.0 * lam[first].sum()
    exact = np.zeros((len(pairs), q))
    exact[first] = lam[first][:, None] * flow / lam[first].sum()
    d = admm.incidence_matrix(pairs, n).toarray()
    need = d.T @ exact
    z = np.random.default_rng(0).normal(size=exact.shape)
    y = exact + 1e-4 * (z - d @ (d.T @ z) / n)  # plus a circulation: D^T y = need still
    assert_allclose(d.T @ y, need, atol=1e-14)
    allowed = lam * (1 + 1e-9)
    assert np.any(np.linalg.norm(y, axis=1) > allowed)
    cut = rowpolish._across_cut(y, np.ones(len(pairs), bool), np.zeros(n, int), lam, allowed, n)
    assert cut is not None
    assert_allclose(d.T @ cut, need, atol=1e-12)
    norm = np.linalg.norm(cut, axis=1)
    assert np.all(norm <= allowed)
    assert_allclose(norm[first], lam[first], rtol=1e-12)  # the cut's pairs at their levels


def test_the_cases_hold_clusters_zeros_and_nonzeros():
    """The polish cases are not degenerate: between them, rows fused at every client, rows
    fused at some clients only, zero entries and nonzero ones."""
    kinds = set()
    for seed, lam1, lam2 in POLISH_CASES:
        x, g, hess = model(seed)
        ref, _ = cvxpy_rows(x, g, hess, lam1, lam2)
        plus, minus = admm.all_pairs(M).T
        close = np.linalg.norm(ref[plus] - ref[minus], axis=2) < 1e-7  # (E, P)
        kinds |= {"all fused"} if np.any(close.all(axis=0)) else set()
        kinds |= {"some fused"} if np.any(close.any(axis=0) & ~close.all(axis=0)) else set()
        kinds |= {"zeros"} if np.any(np.abs(ref) < 1e-7) else set()
        kinds |= {"nonzeros"} if np.any(np.abs(ref) > 1e-3) else set()
    assert kinds == {"all fused", "some fused", "zeros", "nonzeros"}


def test_the_polish_of_an_approximation_with_levels_per_pair_and_entry(monkeypatch):
    """MCP's local linear approximation (a level per pair and row, one per entry): the
    polished point is the weighted problem's conic minimizer."""
    x, g, hess = model(5)
    lla = build_problem(M, Penalty("mcp"), 0.15, 0.05).linearized(x)
    lam_f, lam_s = levels_of(lla, x)
    assert np.ptp(lam_f) > 0 and np.ptp(lam_s) > 0
    res, ref, ref_val = polished_and_reference(lla, x, g, hess, monkeypatch)
    assert_allclose(res.b, ref, rtol=0, atol=1e-5)  # the conic solver's own accuracy here
    assert model_value(res.b, x, g, hess, lla) <= ref_val + 1e-10 * max(1.0, abs(ref_val))
    assert_kkt(res.b, x, g, hess, lam_f, lam_s, *res.y)


def test_a_wrong_pattern_is_corrected_or_refused_never_answered(monkeypatch):
    """The minimizer's pattern with one entry's zero flipped, entry by entry: the polish
    returns the minimizer (the zero set corrected: a zero released, an entry held at zero)
    or nothing, never another point; a pattern fusing rows that differ at the minimum cannot
    be corrected and is refused."""
    x, g, hess = model(2)
    prob = build_problem(M, "lasso", 0.05, 0.2)
    lam_f, lam_s = levels_of(prob, x)
    ref, _ = cvxpy_rows(x, g, hess, lam_f, lam_s)
    exact = rough_admm(prob, x, g, hess, 1e-11, monkeypatch)
    scale = modelsolve.model_scale(x, g)
    fused = np.all(exact.delta[0] == 0.0, axis=2)

    def y():
        return exact.rho * exact.u[0]

    outcome = {True: [], False: []}  # by whether the flipped entry was zero
    for idx in np.ndindex(exact.delta[1].shape):
        delta_s = exact.delta[1].copy()
        was_zero = bool(delta_s[idx] == 0.0)
        delta_s[idx] = 1e-3 if was_zero else 0.0
        res = rowpolish.polish_rows(x, g, hess, lam_f, lam_s, fused, delta_s, exact.b, y, scale)
        if res is not None:
            assert_allclose(res.b, ref, rtol=0, atol=1e-6)
        outcome[was_zero].append(res is not None)
    for answered in outcome.values():  # both kinds of error occur, and are corrected
        assert len(answered) >= 10 and np.mean(answered) >= 0.5
    all_fused = np.ones_like(fused)
    plus, minus = admm.all_pairs(M).T
    assert np.any(np.linalg.norm(ref[plus] - ref[minus], axis=2) > 1e-3)
    wrong = rowpolish.polish_rows(
        x, g, hess, lam_f, lam_s, all_fused, exact.delta[1], exact.b, y, scale
    )
    assert wrong is None


def test_model_solutions_are_polished_and_warm_start_at_once():
    """Through ``solve_model``: asked for 1e-6, the answer is exact (entries zero exactly as
    the conic reference has them, where the inner ADMM alone needs 86 iterations to 1e-6),
    and a warm start from it on the same problem ends on its pattern with no ADMM iteration
    and no Newton step."""
    x, g, hess = model(2)
    prob = build_problem(M, "lasso", 0.05, 0.2)
    sol = modelsolve.solve_model(prob, x, g, hess, tol=1e-6)
    ref, _ = cvxpy_rows(x, g, hess, 0.05, 0.2)
    assert_allclose(sol.b, ref, rtol=0, atol=1e-7)
    assert np.array_equal(sol.b == 0.0, np.abs(ref) < 1e-7)
    again = modelsolve.solve_model(prob, x, g, hess, warm=sol, tol=1e-11)
    assert again.iterations == 0
    assert_allclose(again.b, sol.b, rtol=0, atol=1e-12)
