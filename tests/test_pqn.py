"""The proximal quasi-Newton pieces against independent references: the server's model
problem against a conic solver (cvxpy), BFGS against its defining equations, and the whole
method with a site that stops answering against the optimum with that site held fixed."""

from __future__ import annotations

import dataclasses

import cvxpy as cp
import numpy as np
import pytest
import scipy.sparse as sp
from numpy.testing import assert_allclose

from grauc_flower.datafit import PairwiseLogistic
from rowfed_flower import sources as rsources
from strategies.solvers import admm, anderson, curvature, modelsolve, pqn, qnstate
from strategies.solvers.penalties import Penalty

Z, P = 7, 3
EDGES = np.array([[0, 1], [1, 2], [1, 3], [3, 4], [4, 5], [2, 6]])


def problem(grouping="entry", lam=None):
    lam = np.linspace(0.05, 0.4, len(EDGES)) if lam is None else lam
    d = admm.incidence_matrix(EDGES, Z)
    return admm.Problem((admm.Split(d, Penalty("lasso"), lam, grouping),), Z)


def random_model(seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((Z, P))
    g = rng.standard_normal((Z, P)) * 0.3
    a = rng.standard_normal((Z, P, P))
    hess = np.einsum("zij,zkj->zik", a, a) + 0.05 * np.eye(P)
    return x, g, hess


def cvxpy_model(x, g, hess, lam, grouping, frozen):
    b = cp.Variable((Z, P))
    obj = 0
    for z in range(Z):
        obj += g[z] @ (b[z] - x[z]) + 0.5 * cp.quad_form(b[z] - x[z], hess[z])
    for e, (u, v) in enumerate(EDGES):
        diff = b[u] - b[v]
        obj += lam[e] * (cp.norm(diff, 2) if grouping == "block" else cp.norm(diff, 1))
    cons = [b[z] == x[z] for z in np.flatnonzero(frozen)]
    prob = cp.Problem(cp.Minimize(obj), cons)
    prob.solve(solver="CLARABEL", tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    return b.value, prob.value


def model_value(b, x, g, hess, prob):
    d = b - x
    return float(np.sum(g * d) + 0.5 * np.einsum("zi,zij,zj->", d, hess, d) + prob.penalty_value(b))


@pytest.mark.parametrize("solver", ["dense", "forest"])
@pytest.mark.parametrize("grouping", ["entry", "block"])
@pytest.mark.parametrize("n_frozen", [0, 2])
@pytest.mark.parametrize("seed", [0, 1])
def test_model_problem_matches_cvxpy(grouping, n_frozen, seed, solver, monkeypatch):
    if solver == "forest":  # the tree's block elimination however small the problem
        monkeypatch.setattr(modelsolve, "FOREST_LEVEL", 0.0)
    x, g, hess = random_model(seed)
    prob = problem(grouping)
    frozen = np.zeros(Z, bool)
    frozen[[2, 5][:n_frozen]] = True
    sol = modelsolve.solve_model(prob, x, g, hess, frozen)
    ref, ref_val = cvxpy_model(x, g, hess, prob.splits[0].lam, grouping, frozen)
    assert_allclose(sol.b[frozen], x[frozen], rtol=0, atol=0)
    ours = model_value(sol.b, x, g, hess, prob)
    assert ours - ref_val <= 1e-8 * max(1.0, abs(ref_val))
    assert_allclose(sol.b, ref, atol=1e-5)
    # exact fusions: the solver's delta has exact zeros where the reference fuses
    fused_ref = np.abs(ref[EDGES[:, 0]] - ref[EDGES[:, 1]]) < 1e-7
    if grouping == "block":
        fused_ref = fused_ref.all(axis=1, keepdims=True) & np.ones((1, P), bool)
    assert np.array_equal(sol.delta[0] == 0.0, fused_ref)


def _dense_system_solution(prob, hess, frozen, rho, weights, x, r):
    """The model problem's linear system written out densely: ``blockdiag(B_z) + rho (G kron
    I_p)``, ``G = sum_k w_k A_k^T A_k``; frozen sites' rows held at ``x``."""
    gram = sum(
        w * (s.matrix.T @ s.matrix).toarray() for w, s in zip(weights, prob.splits, strict=True)
    )
    k = np.zeros((Z * P, Z * P))
    for z in range(Z):
        k[z * P : (z + 1) * P, z * P : (z + 1) * P] = hess[z]
    k += rho * np.kron(gram, np.eye(P))
    free = np.repeat(~frozen, P)
    rhs = r - k[np.ix_(free, ~free)] @ x.reshape(Z * P, -1)[~free]
    return np.linalg.solve(k[np.ix_(free, free)], rhs)


def _check_linear_solver(prob, frozen, q, seed, weights):
    rng = np.random.default_rng(seed)
    _, _, hess = random_model(seed)
    x = rng.standard_normal((Z, P, q))
    free = np.repeat(~frozen, P)
    r = rng.standard_normal((free.sum(), q))
    factor = modelsolve.linear_solver(prob, hess, frozen, x.reshape(Z * P, q))
    w = None if weights is None else np.asarray(weights, float)
    solve, rhs_fixed = factor(0.7, w)
    ref = _dense_system_solution(prob, hess, frozen, 0.7, w if w is not None else [1.0] * len(
        prob.splits), x, r)  # fmt: skip
    assert_allclose(solve(r - rhs_fixed), ref, rtol=0, atol=1e-10)


@pytest.mark.parametrize("weights", [None, (0.25, 1.0), (1.0, 4.0)])
@pytest.mark.parametrize("n_frozen", [0, 2])
@pytest.mark.parametrize("q", [1, 3])
def test_all_pairs_linear_solve_equals_the_dense_solve(n_frozen, q, weights):
    """Fusion over all pairs plus an identity split (RowFed's default), each split with its
    own penalty: the per-site solver of the model problem's linear system against a dense
    solve of the whole system; a tree is not taken for all pairs."""
    prob = admm.Problem(
        (
            admm.Split(admm.incidence_matrix(admm.all_pairs(Z), Z), Penalty("lasso"), 0.1),
            admm.Split(sp.identity(Z, format="csr"), Penalty("lasso"), 0.1),
        ),
        Z,
    )
    frozen = np.zeros(Z, bool)
    frozen[[1, 4][:n_frozen]] = True
    w = np.ones(2) if weights is None else np.asarray(weights)
    assert modelsolve._complete_diagonal(modelsolve.site_gram(prob, w), frozen) is not None
    assert modelsolve._complete_diagonal(problem().gram(), frozen) is None  # a tree: no
    _check_linear_solver(prob, frozen, q, n_frozen + q, weights)


@pytest.mark.parametrize("weights", [None, (0.5, 2.0)])
@pytest.mark.parametrize("identity", [False, True])
@pytest.mark.parametrize("n_frozen", [0, 2, 3])
@pytest.mark.parametrize("q", [1, 3])
def test_forest_linear_solve_equals_the_dense_solve(n_frozen, q, identity, weights, monkeypatch):
    """A tree (GrAUC-PFL's graph; with an identity split besides, RowFed on a tree; frozen
    sites cut it into a forest), splits with their own penalties: the block elimination
    against a dense solve of the whole system; a graph with a cycle is turned away."""
    splits = [admm.Split(admm.incidence_matrix(EDGES, Z), Penalty("lasso"), 0.1)]
    if identity:
        splits.append(admm.Split(sp.identity(Z, format="csr"), Penalty("lasso"), 0.1))
    prob = admm.Problem(tuple(splits), Z)
    weights = None if weights is None else weights[: len(splits)]
    frozen = np.zeros(Z, bool)
    frozen[[1, 4, 3][:n_frozen]] = True  # site 1 is the hub: three trees remain
    live = ~frozen
    order = modelsolve._elimination(prob.gram()[live][:, live])
    assert order is not None
    # the forest's elimination, forced (the solver takes it above a size only)
    monkeypatch.setattr(modelsolve, "FOREST_LEVEL", 0.0)
    _check_linear_solver(prob, frozen, q, 10 * n_frozen + q + 7, weights)
    cycle = admm.incidence_matrix(np.vstack([EDGES, [[0, 6]]]), Z)
    assert modelsolve._elimination(sp.csr_matrix(cycle.T @ cycle)) is None


@pytest.mark.parametrize("n_frozen", [0, 2])
def test_all_pairs_model_problem_matches_cvxpy(n_frozen):
    x, g, hess = random_model(5)
    edges = admm.all_pairs(Z)
    lam = np.linspace(0.02, 0.2, len(edges))
    prob = admm.Problem((admm.Split(admm.incidence_matrix(edges, Z), Penalty("lasso"), lam),), Z)
    frozen = np.zeros(Z, bool)
    frozen[[2, 5][:n_frozen]] = True
    sol = modelsolve.solve_model(prob, x, g, hess, frozen)
    b = cp.Variable((Z, P))
    obj = sum(g[z] @ (b[z] - x[z]) + 0.5 * cp.quad_form(b[z] - x[z], hess[z]) for z in range(Z))
    obj += sum(lam[k] * cp.norm(b[u] - b[v], 1) for k, (u, v) in enumerate(edges))
    ref = cp.Problem(cp.Minimize(obj), [b[z] == x[z] for z in np.flatnonzero(frozen)])
    ref.solve(solver="CLARABEL", tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    assert model_value(sol.b, x, g, hess, prob) - ref.value <= 1e-8 * max(1.0, abs(ref.value))
    assert_allclose(sol.b, b.value, atol=1e-5)


def test_model_problem_warm_start_gives_the_same_answer():
    x, g, hess = random_model(3)
    prob = problem()
    cold = modelsolve.solve_model(prob, x, g, hess)
    warm = modelsolve.solve_model(prob, x + 1e-3, g, hess, warm=cold)
    again = modelsolve.solve_model(prob, x + 1e-3, g, hess)
    assert_allclose(warm.b, again.b, atol=1e-7)
    assert warm.iterations < again.iterations


def test_bfgs_secant_symmetry_and_skip():
    rng = np.random.default_rng(0)
    b = np.eye(4) * 2.0
    for first in (True, False):
        s, y = rng.standard_normal(4), rng.standard_normal(4)
        y = y if s @ y > 0 else -y
        new = curvature.bfgs_update(b, s, y, first)
        assert_allclose(new @ s, y, rtol=1e-12, atol=1e-12)  # the secant equation
        assert_allclose(new, new.T, atol=1e-14)
        assert np.linalg.eigvalsh(new).min() > 0
        b = new
    assert curvature.bfgs_update(b, s, -y, False) is b  # negative curvature: skipped


def test_bfgs_many_sites_at_once():
    """The stacked update satisfies every site's secant equation, rescales on a first pair,
    and leaves a site with non-positive curvature alone."""
    rng = np.random.default_rng(1)
    n, p = 6, 4
    a = rng.standard_normal((n, p, p))
    hess = np.einsum("zij,zkj->zik", a, a) + np.eye(p)
    s, y = rng.standard_normal((n, p)), rng.standard_normal((n, p))
    y *= np.sign(np.einsum("zi,zi->z", s, y))[:, None]
    y[2] = -y[2]  # negative curvature: skipped
    first = np.array([True, False, False, True, False, False])
    new = curvature.bfgs_update_many(hess, s, y, first)
    for z in range(n):
        if z == 2:
            assert_allclose(new[z], hess[z], rtol=0, atol=0)
            continue
        assert_allclose(new[z] @ s[z], y[z], rtol=1e-10, atol=1e-12)
        assert np.linalg.eigvalsh(new[z]).min() > 0
    # a first pair forgets the old matrix: B = c I - c s s^T / s^T s + y y^T / s^T y
    c = y[0] @ y[0] / (s[0] @ y[0])
    expect = c * np.eye(p) - c * np.outer(s[0], s[0]) / (s[0] @ s[0])
    expect += np.outer(y[0], y[0]) / (s[0] @ y[0])
    assert_allclose(new[0], expect, rtol=1e-12, atol=1e-12)


def _sites(seed=5, n=30):
    rng = np.random.default_rng(seed)
    out = []
    for z in range(Z):
        mu = np.array([0.8, 0.5 * (z % 2), -0.4])
        out.append(
            PairwiseLogistic(rng.normal(mu, 1.0, (n // 3, P)), rng.normal(0, 1, (n, P)), eta=1e-2)
        )
    return out


def drive(fs, prob, drop_after=None, dropped=3, rounds=80, tol=1e-9):
    st = qnstate.init_qn(np.zeros((Z, P)), 0.25 * np.array([f.lipschitz() for f in fs]))
    for r in range(1, rounds + 1):
        answered = {
            z: f.value_and_grad(st.search.trial[z])
            for z, f in enumerate(fs)
            if not (drop_after is not None and z == dropped and r > drop_after)
        }
        st, step = pqn.qn_round(prob, st, answered, tol)
        if step.converged:
            return st, r
    return st, rounds


def cvxpy_grauc(fs, lam, fixed=None):
    """The penalized surrogate (l1 fusion) by a conic solver; ``fixed = (z, beta_z)``."""
    b = cp.Variable((Z, P))
    obj = 0
    for z, f in enumerate(fs):
        diffs = np.repeat(f.x_pos, len(f.x_neg), axis=0) - np.tile(f.x_neg, (len(f.x_pos), 1))
        obj += cp.sum(cp.logistic(-diffs @ b[z])) / len(diffs) + f.eta / 2 * cp.sum_squares(b[z])
    for e, (u, v) in enumerate(EDGES):
        obj += lam[e] * cp.norm(b[u] - b[v], 1)
    cons = [] if fixed is None else [b[fixed[0]] == fixed[1]]
    prob = cp.Problem(cp.Minimize(obj), cons)
    prob.solve(solver="CLARABEL", tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11)
    return b.value, prob.value


def objective(fs, prob, beta):
    return sum(f.value(b) for f, b in zip(fs, beta, strict=True)) + prob.penalty_value(beta)


def test_pqn_reaches_the_conic_optimum():
    fs = _sites()
    prob = problem()
    st, rounds = drive(fs, prob)
    ref, ref_val = cvxpy_grauc(fs, prob.splits[0].lam)
    assert (objective(fs, prob, st.sites.x) - ref_val) / abs(ref_val) <= 1e-8
    assert_allclose(st.sites.x, ref, atol=2e-4)
    assert rounds < 40


def test_a_silent_site_is_held_at_its_last_point():
    fs = _sites()
    prob = problem()
    st, _ = drive(fs, prob, drop_after=4)
    assert st.frozen[3] and not st.frozen[np.arange(Z) != 3].any()
    held = st.sites.x[3].copy()
    # the point it holds is one it was evaluated at (it answered 4 times)
    before, _ = drive(fs, prob, rounds=4)
    assert np.any(np.all(np.isclose(held, [before.sites.x[3], before.search.trial[3]]), axis=1))
    ref, ref_val = cvxpy_grauc(fs, prob.splits[0].lam, fixed=(3, held))
    assert (objective(fs, prob, st.sites.x) - ref_val) / abs(ref_val) <= 1e-8


def test_exact_curvature_reaches_the_same_optimum_in_fewer_rounds():
    """curvature = exact (the sites send their Hessians): the same minimizer as the learned
    models, in fewer rounds, for both methods; refused without pqn."""
    from grauc_flower.data import simulate
    from grauc_flower.federation import run_methods_inprocess
    from rowfed_flower import federation as rf
    from rowfed_flower import sources as rsources
    from strategies.config import GrAUCConfig, RowFedConfig
    from strategies.errors import InputError

    sites = simulate(1, 12, 5, 40, 8, 0.3, 3, seed=2)
    fits = {
        c: run_methods_inprocess(GrAUCConfig(curvature=c, tol=1e-15), sites, ["grauc"])["grauc"]
        for c in ("learned", "exact")
    }
    np.testing.assert_allclose(fits["exact"].coefficients, fits["learned"].coefficients, atol=1e-7)
    assert fits["exact"].converged and fits["exact"].rounds < fits["learned"].rounds
    data = rsources.simulated_data(
        rsources.DataSpec(num_clients=4, n_train=40, num_features=6, num_responses=3, seed=1)
    )
    cfg = RowFedConfig(penalty="lasso", lam1=0.2, lam2=0.05, tol=1e-15)
    rows = {
        c: rf.run_methods_inprocess(cfg.replace(curvature=c), data, ["rowfed"])["rowfed"]
        for c in ("learned", "exact")
    }
    np.testing.assert_allclose(rows["exact"].coefficients, rows["learned"].coefficients, atol=1e-7)
    assert rows["exact"].rounds <= rows["learned"].rounds
    with pytest.raises(InputError, match="curvature: exact needs algorithm = pqn"):
        GrAUCConfig(curvature="exact", algorithm="admm")
    with pytest.raises(InputError, match="curvature: exact needs the pqn algorithm"):
        RowFedConfig(curvature="exact", penalty="scad", algorithm="admm")
    assert RowFedConfig(curvature="exact", penalty="scad").resolved_algorithm == "pqn"


# -- partial participation (the incremental form) -------------------------------------------
def drive_partial(fs, prob, share, seed, curvature=0.25, rounds=400, tol=1e-10):
    """Each round a seeded random part of the sites answers at the point it was sent."""
    rng = np.random.default_rng(seed)
    st = qnstate.init_qn(
        np.zeros((Z, P)), curvature * np.array([f.lipschitz() for f in fs]), incremental=True
    )
    damped = False
    for r in range(1, rounds + 1):
        drawn = np.flatnonzero(rng.random(Z) < share)
        st, step = pqn.qn_round(
            prob, st, {z: fs[z].value_and_grad(st.search.trial[z]) for z in drawn}, tol
        )
        damped |= bool(st.sites.damping.any())
        if step.converged:
            return st, r, damped
    return st, rounds, damped


@pytest.mark.parametrize("share", [0.5, 0.8])
def test_partial_participation_reaches_the_conic_optimum(share):
    """A random half of the sites per round: the same minimizer as the conic solver (the
    gradients are exact at the kept points, so the fixed point is the full problem's)."""
    fs = _sites()
    prob = problem()
    st, rounds, _ = drive_partial(fs, prob, share, seed=3)
    ref, ref_val = cvxpy_grauc(fs, prob.splits[0].lam)
    assert st.sites.seen.all() and rounds < 400
    est = pqn.estimate(st)  # the last model solution, not the kept points
    assert (objective(fs, prob, est) - ref_val) / abs(ref_val) <= 1e-8
    assert_allclose(est, ref, atol=2e-4)


def test_partial_participation_damps_a_model_that_underestimates_the_loss():
    """Start the models a thousand times too flat: the first moves overshoot, are refused and
    damped (a site keeps its point), and the method still ends at the conic optimum."""
    fs = _sites()
    prob = problem()
    st, rounds, damped = drive_partial(fs, prob, 0.5, seed=4, curvature=1e-4)
    assert damped
    ref, ref_val = cvxpy_grauc(fs, prob.splits[0].lam)
    assert (objective(fs, prob, pqn.estimate(st)) - ref_val) / abs(ref_val) <= 1e-8


def test_a_refused_move_keeps_the_point_and_damps_enough():
    """One site, a loss far more curved than its model: the move is refused, the point kept,
    and the new damping makes the model cover the loss along the refused step."""
    f = _sites()[0]
    x0 = np.zeros(P)
    sites = qnstate.init_qn(x0[None], np.array([1e-4]), incremental=True).sites
    sites.seen[:] = True
    sites.value[0], sites.grad[0] = f.value_and_grad(x0)
    trial = x0 - sites.grad[0] / 1e-4  # the model's minimizer: far too long
    s = trial - x0
    value, grad = f.value_and_grad(trial)
    before = sites.copy()
    pqn._visit(sites, "bfgs", trial, 0, (value, grad))
    assert_allclose(sites.x[0], x0, rtol=0, atol=0)
    model = before.value[0] + before.grad[0] @ s + 0.5 * (1e-4 + sites.damping[0]) * (s @ s)
    assert model >= value


def test_partial_participation_strategies_reach_the_full_participation_optimum():
    """Both methods' strategies at participation 0.5 (pqn, incremental) end at the optimum of
    full participation (1e-8), with a different, seeded path; the same seed repeats it."""
    from grauc_flower.data import simulate
    from grauc_flower.federation import run_methods_inprocess
    from rowfed_flower import federation as rf
    from strategies.config import GrAUCConfig, RowFedConfig

    sites = simulate(1, 10, 4, 40, 8, 0.3, 3, seed=5)
    # a relative gap: coefficients to ~1e-8 on these features (not rescaled to the input)
    cfg = GrAUCConfig(tol=1e-15, max_rounds=600, standardize="none")
    full = run_methods_inprocess(cfg, sites, ["grauc"])["grauc"]
    runs = [
        run_methods_inprocess(cfg.replace(participation=0.5, seed=s), sites, ["grauc"])["grauc"]
        for s in (0, 0, 1)
    ]
    f_full = full.history[-1]["objective"]
    for r in runs:
        assert r.converged
        assert abs(r.history[-1]["objective"] - f_full) <= 1e-14 * abs(f_full)
        # at a 1e-15 gap a fused group's coefficient along the flattest direction is fixed to
        # about 1e-8 (measured 1.1e-8 between the two forms, both partial runs agreeing)
        assert_allclose(r.coefficients, full.coefficients, rtol=0, atol=2e-8)
    assert runs[0].history == runs[1].history
    assert min(h["n_answered"] for h in runs[0].history) < 10

    data = rsources.simulated_data(
        rsources.DataSpec(num_clients=6, n_train=40, num_features=5, num_responses=3, seed=2)
    )
    rcfg = RowFedConfig(tol=1e-15, max_rounds=600, standardize="none")
    rfull = rf.run_methods_inprocess(rcfg, data, ["rowfed"])["rowfed"]
    part = rf.run_methods_inprocess(rcfg.replace(participation=0.5, seed=3), data, ["rowfed"])
    assert part["rowfed"].converged
    assert_allclose(part["rowfed"].coefficients, rfull.coefficients, rtol=0, atol=1e-8)


# -- MCP and SCAD by pqn: the local linear approximation --------------------------------------
@pytest.fixture(scope="module")
def scad_fits():
    from rowfed_flower import federation as rf
    from strategies.config import RowFedConfig

    data = rsources.simulated_data(
        rsources.DataSpec(num_clients=5, n_train=40, num_features=6, num_responses=3, seed=4)
    )
    cfg = RowFedConfig(
        penalty="scad", lam1=0.3, lam2=0.1, intercept=False, tol=1e-9, standardize="none"
    )
    fits = {
        algo: rf.run_methods_inprocess(
            cfg.replace(
                algorithm=algo,
                max_rounds=20000 if algo == "admm" else 400,
                tol=1e-9 if algo == "admm" else 1e-12,  # pqn: a gap; coefficients to ~1e-6
            ),
            data,
            ["rowfed"],
        )["rowfed"]
        for algo in ("admm", "pqn")
    }
    return data, cfg, fits


def test_scad_by_pqn_ends_no_higher_than_the_papers_admm_in_far_fewer_rounds(scad_fits):
    """On this design (measured 2026-12-02: the ADMM's fixed point, 1e-10 lower, in 30
    rounds against 467); not promised on every problem (docs/methods.md 2.4)."""
    _, _, fits = scad_fits
    assert fits["pqn"].converged and fits["admm"].converged
    assert fits["pqn"].objective <= fits["admm"].objective * (1 + 1e-9)
    assert fits["pqn"].rounds < fits["admm"].rounds / 5


def test_scad_by_pqn_is_a_fixed_point_of_its_weighted_lasso(scad_fits):
    """The end point minimizes the weighted lasso whose weights are SCAD's derivative there
    (a stationary point of the SCAD objective), checked by a conic solver."""
    from strategies.solvers.problems import rowfed_problem

    data, cfg, fits = scad_fits
    theta = fits["pqn"].coefficients_work
    m, p, q = theta.shape
    lla = rowfed_problem(cfg, m).linearized(theta)
    fusion, sparsity = lla.splits
    t = [cp.Variable((p, q)) for _ in range(m)]
    obj = 0
    for z in range(m):
        x, y = data.clients[z].x, data.clients[z].y
        obj += cp.sum_squares(y - x @ t[z]) / (2 * len(x))
        obj += cp.sum(cp.multiply(sparsity.lam[z], cp.abs(t[z])))
    d = fusion.matrix.toarray()
    for e in range(d.shape[0]):
        u, v = np.flatnonzero(d[e] == 1)[0], np.flatnonzero(d[e] == -1)[0]
        diff = t[u] - t[v]
        obj += sum(fusion.lam[e, j] * cp.norm(diff[j], 2) for j in range(p))
    prob = cp.Problem(cp.Minimize(obj))
    prob.solve(solver="CLARABEL", tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    ref = np.stack([v.value for v in t])
    assert_allclose(theta, ref, rtol=0, atol=1e-5)


def test_a_participation_so_small_that_nobody_is_drawn_ends_at_the_round_limit():
    """π = 1e-9: every draw is empty; each is a round in which nothing changes, and the fit
    ends at its round limit with its start (no endless redrawing)."""
    from grauc_flower.data import simulate
    from grauc_flower.federation import run_methods_inprocess
    from strategies.config import GrAUCConfig
    from strategies.server.grauc import initial_beta

    sites = simulate(1, 6, 3, 30, 8, 0.3, 3, seed=1)
    # a start the test knows (the start round of init = local asks every site, drawn or not)
    cfg = GrAUCConfig(participation=1e-9, max_rounds=7, standardize="none", init="random")
    res = run_methods_inprocess(cfg, sites, ["grauc"])["grauc"]
    assert not res.converged and res.rounds == 7
    assert [h["n_answered"] for h in res.history] == [0] * 7
    assert_allclose(res.coefficients, initial_beta(6, 3, cfg), rtol=0, atol=0)


def test_the_stopping_rule_reads_tol_as_a_gap_once_the_models_are_learned():
    """``_converged``: the predicted decrease within ``tol`` of ``|F|`` and each site's step
    within ``sqrt(tol)`` -- or within ``tol`` while its model is still the first guess (no
    step pair yet; the exact Hessian counts as learned)."""
    from strategies.solvers.pqn import _converged

    tol = 1e-6

    def state(step, decrease, paired, model="bfgs", incremental=False, curvature=1.0):
        z, p = 3, 2
        direction = np.zeros((z, p))
        direction[1, 0] = step
        sites = qnstate.SiteModels(
            x=np.full((z, p), 0.5),  # max|x| < 1: the scale is 1
            value=np.zeros(z),
            grad=np.zeros((z, p)),
            hess=np.tile(curvature * np.eye(p), (z, 1, 1)),
            paired=np.array(paired),
            curvature=np.ones(z),
            ss=np.zeros(0),
            ys=np.zeros(0),
            damping=np.zeros(z),
            seen=np.ones(z, bool),  # every site has answered
        )
        return qnstate.QuasiNewtonState(
            sites=sites,
            search=qnstate.ModelStep(sites.x + direction, direction, decrease=-decrease),
            settings=qnstate.QnSettings(model=model, incremental=incremental),
            objective=2.0,
        )

    learned = [True, True, True]
    assert _converged(tol, state(5e-4, 1e-6, learned))  # step < 1e-3, decrease < 2e-6
    assert not _converged(tol, state(2e-3, 1e-6, learned))  # step > sqrt(tol)
    assert not _converged(tol, state(5e-4, 3e-6, learned))  # decrease > tol |F|
    guessed = [True, False, True]  # the moving site has no pair yet
    assert not _converged(tol, state(5e-4, 1e-6, guessed))
    assert _converged(tol, state(5e-7, 1e-6, guessed))
    assert _converged(tol, state(5e-4, 1e-6, guessed, model="exact"))
    # the incremental form: the models' curvature along the step, d^T B d, not -Delta (the
    # kept points of a fused group lag one another: -Delta holds their first-order split)
    assert _converged(tol, state(5e-4, 1.0, learned, incremental=True))  # 2.5e-7 <= 2e-6
    assert not _converged(tol, state(5e-4, 0.0, learned, incremental=True, curvature=10.0))
    assert _converged(tol, state(5e-4, 0.0, learned, incremental=True, curvature=7.9))


def _fixed_point(memory, m, c, tol=1e-10, limit=20000):
    """Iterate ``z <- M z + c`` (split into two parts, as the inner ADMM's (delta, u)) with
    :class:`anderson.Anderson`; returns the point and the iterations."""
    accel = anderson.Anderson(memory)
    z = np.zeros(len(c))
    for it in range(1, limit + 1):
        image = m @ z + c
        if np.linalg.norm(image - z) <= tol:
            return image, it
        half = len(c) // 2
        point = ((z[:half],), (z[half:],))
        out = accel.step(point, ((image[:half],), (image[half:],)))
        z = np.concatenate([out[0][0], out[1][0]])
    return z, limit


def test_anderson_reaches_a_linear_fixed_point_in_far_fewer_steps():
    rng = np.random.default_rng(0)
    n = 40
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    m = q @ np.diag(np.linspace(-0.5, 0.995, n)) @ q.T  # contraction, slow along one direction
    c = rng.standard_normal(n)
    exact = np.linalg.solve(np.eye(n) - m, c)
    plain, plain_its = _fixed_point(0, m, c)
    fast, fast_its = _fixed_point(5, m, c)
    assert_allclose(plain, exact, atol=1e-7)
    assert_allclose(fast, exact, atol=1e-7)
    assert fast_its * 5 < plain_its


def test_anderson_falls_back_to_the_plain_image_when_a_combination_does_worse():
    accel = anderson.Anderson(3)

    def pt(v):
        return ((np.array([v, 0.0]),), (np.array([0.0]),))

    first = pt(1.0)
    assert accel.step(pt(0.0), first) is first  # nothing to combine yet
    image = pt(1.5)
    combined = accel.step(first, image)
    assert combined is not image  # a combination of the two
    worse = pt(combined[0][0][0] + 100.0)  # the residual there is far larger
    assert accel.step(combined, worse) is image  # the plain image of the point before
    assert accel.count == 0  # and the memory starts again


def _all_pairs_group_problem(seed: int):
    """RowFed's model problem on random data: every pair, row groups, matrix blocks (q = 2)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((Z, P, 2))
    g = rng.standard_normal((Z, P, 2)) * 0.3
    a = rng.standard_normal((Z, P, P))
    hess = np.einsum("zij,zkj->zik", a, a) + 0.05 * np.eye(P)
    edges = admm.all_pairs(Z)
    lam = np.full(len(edges), 0.15)
    split = admm.Split(admm.incidence_matrix(edges, Z), Penalty("lasso"), lam, "row")
    return admm.Problem((split,), Z), x, g, hess


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_accelerated_all_pairs_group_model_problem_matches_cvxpy(seed, monkeypatch):
    """RowFed's model problem (every pair, row groups, matrix blocks) with and without the
    acceleration: the same minimizer as the conic solver's; the acceleration in fewer
    iterations."""
    prob, x, g, hess = _all_pairs_group_problem(seed)
    q, edges, lam = 2, admm.all_pairs(Z), prob.splits[0].lam
    fast = modelsolve.solve_model(prob, x, g, hess)
    monkeypatch.setattr(modelsolve, "ANDERSON_MEMORY", 0)
    plain = modelsolve.solve_model(prob, x, g, hess)
    b = cp.Variable((Z * P, q))
    obj = 0
    for z in range(Z):
        d = b[z * P : (z + 1) * P] - x[z]
        obj += cp.sum(cp.multiply(g[z], d))
        obj += 0.5 * sum(cp.quad_form(d[:, j], hess[z]) for j in range(q))
    for k, (u, v) in enumerate(edges):
        diff = b[u * P : (u + 1) * P] - b[v * P : (v + 1) * P]
        obj += lam[k] * cp.sum(cp.norm(diff, 2, axis=1))
    ref = cp.Problem(cp.Minimize(obj))
    ref.solve(solver="CLARABEL", tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    want = b.value.reshape(Z, P, q)
    assert_allclose(fast.b, want, atol=1e-5)
    assert_allclose(plain.b, want, atol=1e-5)
    assert_allclose(fast.b, plain.b, atol=1e-8)
    assert fast.iterations <= 1.05 * plain.iterations  # one problem: at worst a tie


def test_acceleration_cuts_the_all_pairs_model_problems_iterations_over_a_family(monkeypatch):
    """Over eight random all-pairs group problems (as above), Anderson acceleration takes
    at most 80% of the plain ADMM's iterations in all."""
    fast_total = plain_total = 0
    for seed in range(8):
        prob, x, g, hess = _all_pairs_group_problem(seed)
        fast_total += modelsolve.solve_model(prob, x, g, hess).iterations
        with monkeypatch.context() as m:
            m.setattr(modelsolve, "ANDERSON_MEMORY", 0)
            plain_total += modelsolve.solve_model(prob, x, g, hess).iterations
    assert fast_total <= 0.8 * plain_total


def test_the_model_problems_floor_follows_the_fits_tolerance():
    assert pqn.inner_floor(None) == pqn.INNER_TOL
    assert pqn.inner_floor(1e-6) == pqn.INNER_TOL  # the default fit: unchanged
    assert pqn.inner_floor(1e-9) == pqn.INNER_TOL
    assert pqn.inner_floor(1e-3) == pytest.approx(1e-8)
    assert pqn.inner_floor(1.0) == pqn.INNER_LOOSEST


def _record_model_tolerances(monkeypatch) -> list:
    """The tolerance of every model problem solved from now on, in order."""
    asked = []
    solve = modelsolve.solve_request

    def spy(req):
        asked.append(req.tol)
        return solve(req)

    monkeypatch.setattr(pqn, "solve_request", spy)
    return asked


@pytest.mark.parametrize("tol", [1e-3, 1e-6])
def test_a_loose_fit_solves_its_model_problems_no_tighter_than_its_floor(tol, monkeypatch):
    asked = _record_model_tolerances(monkeypatch)
    fs = _sites()
    prob = problem()
    st, _ = drive(fs, prob, tol=tol)
    floor = pqn.inner_floor(tol)
    assert min(asked) == pytest.approx(floor)  # the last solve reaches it
    # the first model, with no step to measure it by, is solved only to the loosest level
    assert asked[0] == pytest.approx(max(floor, pqn.INNER_LOOSEST))
    assert asked[-1] == pytest.approx(floor)
    _, ref_val = cvxpy_grauc(fs, prob.splits[0].lam)
    assert (objective(fs, prob, st.sites.x) - ref_val) / abs(ref_val) <= tol


def _record_fits(monkeypatch) -> list:
    """Every GrAUC-PFL site's fit answers from now on, as ``(site, config, answer)``."""
    from grauc_flower.client import GrAUCClient

    calls = []
    fit = GrAUCClient.fit

    def recording(self, parameters, config):
        out = fit(self, parameters, config)
        calls.append((self.data.site, dict(config), out))
        return out

    monkeypatch.setattr(GrAUCClient, "fit", recording)
    return calls


def test_grauc_starts_from_each_sites_floored_fit_in_its_first_round(monkeypatch):
    """``init = local`` (the default): the first round asks every site for its own fit with
    the ridge floored (``task = local``, ``start``) and, in the same answer, its loss,
    gradient and curvature bound there (``then = gradient``), all equal to what the site's
    rows give here; that round is the fit's first, and the second is a pqn round."""
    from grauc_flower.data import simulate
    from grauc_flower.datafit import split_by_class, start_fit
    from grauc_flower.federation import run_methods_inprocess
    from strategies.config import GrAUCConfig

    sites = simulate(1, 6, 3, 30, 8, 0.3, 3, seed=1)
    cfg = GrAUCConfig(max_rounds=2, standardize="none")
    assert cfg.init == "local"
    calls = _record_fits(monkeypatch)
    res = run_methods_inprocess(cfg, sites, ["grauc"])["grauc"]
    assert res.rounds == 2 and len(calls) == 2 * len(sites)
    first, second = calls[: len(sites)], calls[len(sites) :]
    assert {site for site, _, _ in first} == {s.site for s in sites}
    by_site = {s.site: s for s in sites}
    for site, config, (arrays, _, metrics) in first:
        assert config["task"] == "local" and config["start"] and config["then"] == "gradient"
        s = by_site[site]
        own = PairwiseLogistic(*split_by_class(s.x_train, s.y_train), eta=cfg.ridge)
        b = start_fit(own)
        (answer,) = arrays
        assert_allclose(answer, np.concatenate([b, own.grad(b)]), rtol=0, atol=1e-12)
        assert metrics["loss"] == pytest.approx(own.value(b), rel=1e-13)
        assert metrics["curvature"] == pytest.approx(own.lipschitz(), rel=1e-13)
    assert all(c["task"] == "gradient" for _, c, _ in second)


def test_with_exact_curvature_the_start_answer_carries_the_newton_answer(monkeypatch):
    """``curvature = exact``: the start round's answer is the site's fit followed by its
    ``[gradient | Hessian]`` there (brute force from the site's rows), one flat array."""
    from grauc_flower.data import simulate
    from grauc_flower.datafit import split_by_class, start_fit
    from grauc_flower.federation import run_methods_inprocess
    from strategies.config import GrAUCConfig

    sites = simulate(1, 5, 3, 30, 8, 0.3, 3, seed=2)
    cfg = GrAUCConfig(max_rounds=1, standardize="none", curvature="exact")
    first = _record_fits(monkeypatch)
    run_methods_inprocess(cfg, sites, ["grauc"])
    assert len(first) == len(sites)
    by_site = {s.site: s for s in sites}
    for site, config, (arrays, _, metrics) in first:
        assert config["then"] == "newton"
        s = by_site[site]
        x_pos, x_neg = split_by_class(s.x_train, s.y_train)
        own = PairwiseLogistic(x_pos, x_neg, eta=cfg.ridge)
        b = start_fit(own)
        d = (x_pos[:, None, :] - x_neg[None, :, :]).reshape(-1, 3)
        w = 1.0 / (1.0 + np.exp(d @ b))  # sigma(-b'd): the pairs' weights in the gradient
        grad = -(d * w[:, None]).mean(axis=0) + cfg.ridge * b
        hess = (d.T * (w * (1.0 - w))) @ d / len(d) + cfg.ridge * np.eye(3)
        want = np.concatenate([b, np.hstack([grad[:, None], hess]).ravel()])
        assert_allclose(arrays[0], want, rtol=0, atol=1e-12)
        assert metrics["loss"] == pytest.approx(own.value(b), rel=1e-13)


@pytest.mark.parametrize("name", ["scad", "mcp"])
def test_a_nonconvex_model_step_runs_the_linear_approximations_to_their_fixed_point(name):
    """MCP/SCAD: each round's model step linearizes the penalty again at its own solution
    and solves again (on the server, no round) until the solution settles.  It ends at a
    fixed point of the approximations on the model (the approximation at ``b``, solved on
    the same model, gives ``b`` back), with the model's value under the penalty itself
    (brute force) below a single approximation's step, and the predicted decrease is that
    value's change."""
    x, g, hess = random_model(4)
    d = admm.incidence_matrix(EDGES, Z)
    target = admm.Problem((admm.Split(d, Penalty(name), 0.6, "entry"),), Z)
    lla = pqn.Linearization(target, target.linearized)

    st = qnstate.init_qn(x)
    st = dataclasses.replace(
        st, sites=dataclasses.replace(st.sites, hess=hess.copy(), grad=g.copy()), evaluated=True
    )
    one, _ = pqn._new_direction(target.linearized(x), st, 1e-9)
    st, _ = pqn._lla_direction(target.linearized(x), st, 1e-9, lla)
    b = st.sites.x + st.search.direction
    again = modelsolve.solve_model(target.linearized(b), x, g, hess)
    assert_allclose(again.b, b, atol=1e-6)
    assert (
        model_value(b, x, g, hess, target)
        < model_value(x + one.search.direction, x, g, hess, target) - 1e-4
    )
    want = model_value(b, x, g, hess, target) - target.penalty_value(x)
    assert st.search.decrease == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert st.search.decrease < 0


@pytest.mark.parametrize("name, seed, lam", [("mcp", 1, 0.2), ("scad", 5, 0.05)])
def test_a_nonconvex_fit_ends_on_a_model_solution_solved_to_the_floor(name, seed, lam, monkeypatch):
    """MCP/SCAD: the model step that ends a fit is solved to :func:`pqn.inner_floor` (its
    zeros and fused groups are the fit's), as for a convex penalty, although the stopping
    rule reads the model's change of the target objective (the cases are ones where the
    last approximation's solve had been looser)."""
    asked = _record_model_tolerances(monkeypatch)
    fs = _sites(seed=seed)
    d = admm.incidence_matrix(EDGES, Z)
    target = admm.Problem((admm.Split(d, Penalty(name), lam, "entry"),), Z)
    lla = pqn.Linearization(target, target.linearized)
    st = qnstate.init_qn(np.zeros((Z, P)), 0.25 * np.array([f.lipschitz() for f in fs]))
    tol = 1e-4
    for _ in range(100):
        answered = {z: f.value_and_grad(st.search.trial[z]) for z, f in enumerate(fs)}
        st, step = pqn.qn_round(target.linearized(st.sites.x), st, answered, tol, lla)
        if step.converged:
            break
    assert step.converged
    assert asked[-1] == pytest.approx(pqn.inner_floor(tol))


def _snapshot(st) -> dict:
    """Every array a state holds (its inner solution's too), copied."""
    out = {k: np.array(v, copy=True) for k, v in st.arrays().items()}
    if st.inner is not None:
        out["inner_b"] = np.array(st.inner.b, copy=True)
    return out


@pytest.mark.parametrize("incremental", [False, True])
def test_a_round_leaves_the_state_it_was_given_unchanged(incremental):
    """``qn_round`` returns a new state and never writes into its input: a state kept from
    an earlier round (a caller's, a checkpoint's) has the same arrays after the next
    rounds, and those rounds go exactly as from a fresh copy of it."""
    fs, prob = _sites(), problem()
    rng = np.random.default_rng(11)
    st = qnstate.init_qn(
        np.zeros((Z, P)), 0.25 * np.array([f.lipschitz() for f in fs]), incremental=incremental
    )
    kept = []
    for _ in range(8):
        drawn = np.flatnonzero(rng.random(Z) < 0.6) if incremental else range(Z)
        before = _snapshot(st)
        answers = {z: fs[z].value_and_grad(st.search.trial[z]) for z in drawn}
        new, _ = pqn.qn_round(prob, st, answers, 1e-10)
        after = _snapshot(st)
        assert before.keys() == after.keys()
        for key in before:
            assert np.array_equal(before[key], after[key]), key
        kept.append((st, answers, new))
        st = new
    with pytest.raises(dataclasses.FrozenInstanceError):  # records are written once
        st.sites.x = np.zeros((Z, P))
    with pytest.raises(dataclasses.FrozenInstanceError):
        st.search = None
    old, answers, new = kept[3]  # the round again from the kept state: the same result
    again, _ = pqn.qn_round(prob, old, answers, 1e-10)
    for key, value in _snapshot(new).items():
        assert np.array_equal(value, _snapshot(again)[key]), key


def test_state_arrays_round_trip_every_field():
    """``arrays`` writes every field of the state (its inner solution by split) and
    ``from_arrays`` gives each back with its type; a checkpoint written before partial
    participation (no ``seen``, ``damping``, ...) reads as that version ran."""
    fs, prob = _sites(), problem()
    st = qnstate.init_qn(np.zeros((Z, P)), 0.25 * np.array([f.lipschitz() for f in fs]))
    for _ in range(3):
        answers = {z: f.value_and_grad(st.search.trial[z]) for z, f in enumerate(fs)}
        st, _ = pqn.qn_round(prob, st, answers, 1e-9)
    saved = st.arrays()
    records = (st.sites, st.search, st.settings, st)
    names = {f.name for r in records for f in dataclasses.fields(r)}
    names -= {"sites", "search", "settings", "inner"}
    assert names <= set(saved) and st.inner is not None and "inner_rho" in saved
    back = qnstate.QuasiNewtonState.from_arrays(saved)
    for key, value in back.arrays().items():
        assert np.array_equal(value, saved[key]) and value.dtype == saved[key].dtype, key
    assert back.sites.paired.dtype == bool and isinstance(back.round, int)
    assert back.settings == st.settings
    # an inner solution whose splits have their own penalties keeps them (its duals' units)
    parted = dataclasses.replace(st, inner=dataclasses.replace(st.inner, weights=(1.0, 0.25)))
    assert qnstate.QuasiNewtonState.from_arrays(parted.arrays()).inner.weights == (1.0, 0.25)
    older = {k: v for k, v in saved.items() if k not in ("seen", "damping", "incremental")}
    older = {k: v for k, v in older.items() if k != "inner_weights"}
    assert qnstate.QuasiNewtonState.from_arrays(older).inner.weights == ()
    old = qnstate.QuasiNewtonState.from_arrays(older)
    assert old.sites.seen.all() == bool(st.evaluated) and not old.settings.incremental
    assert not old.sites.damping.any()


def _nonconvex_fit(penalty: str, seed: int, lam1: float, monkeypatch, full: bool):
    """A default RowFed fit (in process) with MCP or SCAD on a small simulation: its objective,
    rounds and model problems solved.  ``full``: every approximation of a round run to the
    fixed point (or the limit) and solved to the fit's own inner tolerance."""
    from rowfed_flower import federation as rf
    from strategies.config import RowFedConfig

    with monkeypatch.context() as mp:
        asked = _record_model_tolerances(mp)
        if full:
            mp.setattr(pqn, "LLA_GAIN", -np.inf)
            mp.setattr(pqn, "LLA_FORCING", 0.0)
        data = rsources.simulated_data(
            rsources.DataSpec(num_clients=6, n_train=30, num_features=12, num_responses=4,
                              seed=seed)
        )  # fmt: skip
        cfg = RowFedConfig(penalty=penalty, lam1=lam1, lam2=0.05, standardize="none")
        res = rf.run_methods_inprocess(cfg, data, ["rowfed"])["rowfed"]
    return res.objective, res.rounds, len(asked)


@pytest.mark.slow
@pytest.mark.parametrize("penalty", ["scad", "mcp"])
def test_the_approximations_stop_once_the_rest_lies_below_the_fits_tolerance(penalty, monkeypatch):
    """MCP/SCAD: a round's approximations stop once one gains less than a tenth of the fit's
    stopping gap and moves ``b`` within a twentieth of its step allowance, and the later
    ones are solved only as accurately as the last one moved ``b``.  Over a family of
    small designs (p = 12 > n_m / 3, clients' rows fused and apart) the fits end within the
    stopping gap of fits that run every approximation to its fixed point (tol = 1e-6
    relative), in at most one round more, and solve a fifth fewer model problems in all
    (measured 2026-12-07 over these and two more seeds: 11 of 12 fits within 6e-9 and in
    the same rounds; MCP with seed 5 ended at another stationary point, 2.7e-4 higher, in 5
    rounds against 8)."""
    fast_solves = full_solves = 0
    for seed, lam1 in [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.05)]:
        fast, fast_rounds, n_fast = _nonconvex_fit(penalty, seed, lam1, monkeypatch, False)
        full, full_rounds, n_full = _nonconvex_fit(penalty, seed, lam1, monkeypatch, True)
        assert abs(fast - full) <= 1e-6 * max(1.0, abs(full)), (seed, fast, full)
        assert fast_rounds <= full_rounds + 1, (seed, fast_rounds, full_rounds)
        fast_solves, full_solves = fast_solves + n_fast, full_solves + n_full
    assert fast_solves < 0.8 * full_solves, (fast_solves, full_solves)
