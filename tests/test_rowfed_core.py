"""RowFed's numerical core: datafit, local steps, reference loop vs cvxpy, metrics, data.

Tiers: pieces against closed forms and brute force; the gradient with
``check_grad``; the whole loop against cvxpy on docs/methods.md 2.2 and in the limiting cases.
"""

from __future__ import annotations

import itertools

import cvxpy as cp
import numpy as np
import pytest
import scipy.optimize as so
from numpy.testing import assert_allclose, assert_array_equal

from rowfed_flower import sources as rsources
from rowfed_flower.data import simulate
from rowfed_flower.datafit import (
    LocalLeastSquares,
    fit_rowfed,
    gic_of_fit,
    objective,
    start_fit,
)
from rowfed_flower.metrics import mean_rand_index, mse_est, mse_pred, rand_index
from rowfed_flower.realdata import load_crime
from strategies.datasets import dataset_path
from strategies.solvers.admm import all_pairs
from strategies.solvers.local import local_step
from strategies.solvers.penalties import Penalty
from strategies.solvers.problems import (
    FUSION,
    SPARSITY,
    build_problem,
    canonical_labels,
    degrees_of_freedom,
    edges_from_incidence,
    fitted_structure,
    gic,
    row_clusters,
)

M, P, Q, N = 4, 3, 2, 30
LAM1, LAM2 = 0.1, 0.1
CRIME = dataset_path("communities_crime.csv")  # the copy shipped with the package


@pytest.fixture(scope="module")
def sim():
    # row 0: one cluster, row 1: two clusters, row 2: zero (so both penalties are active)
    return simulate(M, N, 10, P, Q, seed=3, n_clusters=(1, 2))


@pytest.fixture(scope="module")
def fits(sim):
    return [LocalLeastSquares(x, y) for x, y in zip(sim.x_train, sim.y_train, strict=True)]


def cvxpy_srof(fits, lam1, lam2, sparsity, edges=None):
    """docs/methods.md 2.2 with the lasso, solved by Clarabel: (value, theta)."""
    n_sites = len(fits)
    edges = all_pairs(n_sites) if edges is None else edges
    t = [cp.Variable((fits[0].n_features, fits[0].n_responses)) for _ in range(n_sites)]
    loss = sum(
        cp.sum_squares(f.y - f.x @ tm) / (2 * f.n_samples) for f, tm in zip(fits, t, strict=True)
    )
    fusion = sum(cp.sum(cp.norm(t[u] - t[v], 2, axis=1)) for u, v in edges)
    if sparsity == "entry":
        sparse = sum(cp.sum(cp.abs(tm)) for tm in t)
    else:
        sparse = sum(cp.sum(cp.norm(tm, 2, axis=1)) for tm in t)
    prob = cp.Problem(cp.Minimize(loss + lam1 * fusion + lam2 * sparse))
    prob.solve(solver="CLARABEL", tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    assert prob.status == "optimal"
    return prob.value, np.stack([tm.value for tm in t])


@pytest.fixture(scope="module")
def references(fits):
    return {s: cvxpy_srof(fits, LAM1, LAM2, s) for s in ("entry", "row")}


# ---------------------------------------------------------------------------------------
# Datafit
# ---------------------------------------------------------------------------------------
def test_datafit_value_grad_lipschitz(fits):
    f = fits[0]
    rng = np.random.default_rng(0)
    theta = rng.standard_normal((P, Q))
    n = f.n_samples
    assert_allclose(f.value(theta), np.sum((f.y - f.x @ theta) ** 2) / (2 * n))
    assert_allclose(f.rss(theta), np.sum((f.y - f.x @ theta) ** 2))
    assert_allclose(f.grad(theta), -f.x.T @ (f.y - f.x @ theta) / n, atol=1e-12)
    assert_allclose(f.lipschitz(), np.linalg.eigvalsh(f.x.T @ f.x / n)[-1])
    err = so.check_grad(
        lambda v: f.value(v.reshape(P, Q)),
        lambda v: f.grad(v.reshape(P, Q)).ravel(),
        theta.ravel(),
    )
    assert err < 1e-5 * max(1.0, np.linalg.norm(f.grad(theta)))
    # L bounds the gradient's variation, with equality along the top eigenvector
    a, b = rng.standard_normal((2, P, Q))
    assert np.linalg.norm(f.grad(a) - f.grad(b)) <= f.lipschitz() * np.linalg.norm(a - b)


def test_datafit_vector_response_is_q1():
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((10, 3)), rng.standard_normal(10)
    f = LocalLeastSquares(x, y)
    assert f.n_responses == 1
    assert f.grad(np.zeros((3, 1))).shape == (3, 1)
    with pytest.raises(ValueError, match="x, y"):
        LocalLeastSquares(x, y[:5])


def test_linearized_step_formula(fits):
    f = fits[1]
    rng = np.random.default_rng(2)
    tt, tp = rng.standard_normal((2, P, Q))
    assert_allclose(local_step(f, tt, tp, 3.0, "linearized"), tt - f.grad(tp) / 3.0)


@pytest.mark.parametrize("c", [0.05, 1.0, 7.0])
def test_prox_step_vs_numerical_minimizer(fits, c):
    f = fits[2]
    tt = np.random.default_rng(3).standard_normal((P, Q))

    def h(v):
        t = v.reshape(P, Q)
        return f.value(t) + 0.5 * c * np.sum((t - tt) ** 2)

    def dh(v):
        t = v.reshape(P, Q)
        return (f.grad(t) + c * (t - tt)).ravel()

    ref = so.minimize(h, np.zeros(P * Q), jac=dh, method="BFGS", options={"gtol": 1e-12})
    assert_allclose(f.prox(tt, c), ref.x.reshape(P, Q), atol=1e-7)
    assert_allclose(local_step(f, tt, None, c, "prox"), f.prox(tt, c))


def test_prox_step_cache_follows_c(fits):
    f = LocalLeastSquares(fits[0].x, fits[0].y)
    tt = np.ones((P, Q))
    a = f.prox(tt, 1.0)
    b = f.prox(tt, 2.0)  # refactors
    assert_allclose(f.prox(tt, 1.0), a)
    n = f.n_samples
    exact = np.linalg.solve(f.x.T @ f.x / n + 2.0 * np.eye(P), f.x.T @ f.y / n + 2.0 * tt)
    assert_allclose(b, exact, atol=1e-12)
    with pytest.raises(ValueError, match="c"):
        f.prox(tt, 0.0)


@pytest.mark.parametrize("sparsity", ["entry", "row"])
def test_local_fit_lasso_vs_cvxpy(fits, sparsity):
    f, lam = fits[0], 0.2
    t = cp.Variable((P, Q))
    pen = cp.sum(cp.abs(t)) if sparsity == "entry" else cp.sum(cp.norm(t, 2, axis=1))
    prob = cp.Problem(cp.Minimize(cp.sum_squares(f.y - f.x @ t) / (2 * f.n_samples) + lam * pen))
    prob.solve(solver="CLARABEL", tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    fit = f.local_fit(Penalty("lasso"), lam, sparsity)
    assert_allclose(fit, t.value, atol=1e-6)


@pytest.mark.parametrize("kind", ["mcp", "scad"])
def test_local_fit_nonconvex_is_a_fixed_point(fits, kind):
    """Proximal-gradient stationarity: ``T = prox_{P/rho}(T - grad f(T)/rho)``."""
    f, lam, pen = fits[1], 0.3, Penalty(kind)
    fit = f.local_fit(pen, lam, "entry", tol=1e-13)
    rho = f.lipschitz()
    assert_allclose(pen.threshold(fit - f.grad(fit) / rho, lam, rho, False), fit, atol=1e-9)


# ---------------------------------------------------------------------------------------
# Problem, objective, curvature
# ---------------------------------------------------------------------------------------
def test_build_problem_structure():
    prob = build_problem(5, "lasso", 0.3, 0.2, "row")
    assert_allclose(prob.sigma_max(), 5 + 1)  # lambda_max(L_K5) + 1
    assert prob.splits[FUSION].grouping == "row"
    assert prob.splits[SPARSITY].grouping == "row"
    assert_array_equal(edges_from_incidence(prob.splits[FUSION].matrix), all_pairs(5))
    path = np.array([[0, 1], [1, 2], [2, 3]])
    chain = build_problem(4, Penalty("scad"), 0.3, 0.2, graph_edges=path, fusion_grouping="block")
    assert_array_equal(edges_from_incidence(chain.splits[FUSION].matrix), path)
    lap = np.diag([1, 2, 2, 1]) - (np.eye(4, k=1) + np.eye(4, k=-1))
    assert_allclose(chain.sigma_max(), np.linalg.eigvalsh(lap)[-1] + 1)
    with pytest.raises(ValueError, match="sparsity"):
        build_problem(3, "lasso", 1, 1, sparsity="block")
    with pytest.raises(ValueError, match="fusion_grouping"):
        build_problem(3, "lasso", 1, 1, fusion_grouping="entry")
    with pytest.raises(ValueError, match="graph_edges"):
        build_problem(3, "lasso", 1, 1, graph_edges=np.array([[0, 3]]))


@pytest.mark.parametrize("sparsity", ["entry", "row"])
@pytest.mark.parametrize("kind", ["lasso", "mcp"])
def test_objective_vs_double_loop(fits, sparsity, kind):
    pen = Penalty(kind)
    theta = np.random.default_rng(4).standard_normal((M, P, Q))
    theta[1, 2] = theta[0, 2]  # an exactly fused row
    theta[3, 1] = 0.0  # an exactly zero row
    prob = build_problem(M, pen, LAM1, LAM2, sparsity)
    hand = sum(f.value(t) for f, t in zip(fits, theta, strict=True))
    for u, v in itertools.combinations(range(M), 2):
        for j in range(P):
            hand += pen.value_of_norm(np.linalg.norm(theta[u, j] - theta[v, j]), LAM1)
    for m in range(M):
        for j in range(P):
            if sparsity == "row":
                hand += pen.value_of_norm(np.linalg.norm(theta[m, j]), LAM2)
            else:
                hand += sum(pen.value_of_norm(abs(theta[m, j, k]), LAM2) for k in range(Q))
    assert_allclose(objective(fits, prob, theta), hand, rtol=1e-12)


def test_initial_theta(fits):
    ridge = start_fit(fits, method="ridge", ridge=1e-3)
    for f, t in zip(fits, ridge, strict=True):
        n = f.n_samples
        assert_allclose(t, np.linalg.solve(f.x.T @ f.x / n + 1e-3 * np.eye(P), f.x.T @ f.y / n))
    prob = build_problem(M, "lasso", LAM1, LAM2, "row")
    nonfed = start_fit(fits, prob, method="nonfed")
    assert_allclose(nonfed[2], fits[2].local_fit(Penalty("lasso"), LAM2, "row"))
    with pytest.raises(ValueError, match="problem"):
        start_fit(fits, method="nonfed")


# ---------------------------------------------------------------------------------------
# The whole algorithm vs cvxpy, and limiting cases
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("participation", [1.0, 0.5])
@pytest.mark.parametrize("solver", ["linearized", "prox"])
@pytest.mark.parametrize("sparsity", ["entry", "row"])
def test_fit_rowfed_reaches_cvxpy(fits, references, sparsity, solver, participation):
    value, theta_ref = references[sparsity]
    prob = build_problem(M, "lasso", LAM1, LAM2, sparsity)
    res = fit_rowfed(
        fits, prob, rho=1.0, solver=solver, participation=participation, tol=1e-8,
        max_rounds=5000,
    )  # fmt: skip
    assert res.converged
    gap = (objective(fits, prob, res.theta) - value) / abs(value)
    assert abs(gap) <= 1e-6
    assert_allclose(res.theta, theta_ref, atol=1e-5)
    # the history's last objective is the returned estimate's
    assert_allclose(res.history.rows[-1]["objective"], objective(fits, prob, res.theta))
    assert len(res.history.rows) == res.n_rounds


def test_fit_rowfed_rho_schedule_and_nonfed_init(fits, references):
    value, theta_ref = references["entry"]
    prob = build_problem(M, "lasso", LAM1, LAM2, "entry")
    res = fit_rowfed(fits, prob, rho=0.2, alpha=1.01, tol=1e-8)
    assert res.converged
    assert abs(objective(fits, prob, res.theta) - value) <= 1e-6 * abs(value)
    rhos = [row["rho"] for row in res.history.rows]
    assert_allclose(rhos, 0.2 * 1.01 ** np.arange(len(rhos)))
    res = fit_rowfed(fits, prob, rho=1.0, init="nonfed", tol=1e-8)
    assert_allclose(res.theta, theta_ref, atol=1e-5)


def test_fit_rowfed_estimated_structure(fits, references):
    """The exact zeros of delta give the clusters and support of the cvxpy solution."""
    _, theta_ref = references["row"]
    prob = build_problem(M, "lasso", LAM1, LAM2, "row")
    res = fit_rowfed(fits, prob, rho=1.0, solver="prox", tol=1e-8)
    labels, support = fitted_structure(prob, res.state)
    ref_labels = np.zeros((M, P), dtype=int)
    for j in range(P):
        rows = np.round(theta_ref[:, j], 4)
        ref_labels[:, j] = canonical_labels(np.unique(rows, axis=0, return_inverse=True)[1])
    assert_array_equal(labels, ref_labels)
    assert_array_equal(support.any(axis=2), np.abs(theta_ref).max(axis=2) > 1e-6)


@pytest.mark.parametrize("solver", ["linearized", "prox"])
def test_zero_penalties_give_local_least_squares(fits, solver):
    prob = build_problem(M, "lasso", 0.0, 0.0, "entry")
    res = fit_rowfed(fits, prob, rho=1.0, solver=solver, tol=1e-10)
    assert res.converged
    for f, t in zip(fits, res.theta, strict=True):
        assert_allclose(t, np.linalg.lstsq(f.x, f.y, rcond=None)[0], atol=1e-6)


@pytest.mark.parametrize(
    ("kind", "fusion_grouping"), [("lasso", "row"), ("mcp", "row"), ("lasso", "block")]
)
def test_huge_lam1_fuses_all_clients(fits, kind, fusion_grouping):
    prob = build_problem(M, kind, 1e3, 0.0, "entry", fusion_grouping=fusion_grouping)
    res = fit_rowfed(fits, prob, rho=1.0, solver="prox", tol=1e-10)
    assert res.converged
    assert np.all(res.state.delta[FUSION] == 0.0)
    labels, _ = fitted_structure(prob, res.state)
    assert_array_equal(labels, 0)
    pooled = np.linalg.solve(sum(f.gram for f in fits), sum(f.xty for f in fits))
    assert_allclose(res.theta, np.broadcast_to(pooled, res.theta.shape), atol=1e-6)


def test_partial_participation_is_seeded(fits):
    prob = build_problem(M, "lasso", LAM1, LAM2, "entry")
    kw = dict(rho=1.0, participation=0.5, max_rounds=30, tol=1e-12)
    a = fit_rowfed(fits, prob, seed=7, **kw)
    b = fit_rowfed(fits, prob, seed=7, **kw)
    c = fit_rowfed(fits, prob, seed=8, **kw)
    assert_array_equal(a.theta, b.theta)
    counts = [r["n_participants"] for r in a.history.rows]
    assert counts == [r["n_participants"] for r in b.history.rows]
    assert counts != [r["n_participants"] for r in c.history.rows]
    # the draws are default_rng(seed).random(M) < pi, one vector per round
    rng = np.random.default_rng(7)
    assert counts == [int((rng.random(M) < 0.5).sum()) for _ in range(30)]


def test_round_without_participants_keeps_theta(fits):
    prob = build_problem(M, "lasso", LAM1, LAM2, "entry")
    theta0 = start_fit(fits)
    res = fit_rowfed(fits, prob, rho=1.0, participation=1e-12, max_rounds=3, theta0=theta0)
    assert_array_equal(res.theta, theta0)
    assert [r["n_participants"] for r in res.history.rows] == [0, 0, 0]
    assert not res.converged
    assert res.n_rounds == 3


def test_fit_rowfed_validates(fits):
    prob = build_problem(M, Penalty("mcp", 3.0), LAM1, LAM2)
    with pytest.raises(ValueError, match="concavity"):
        fit_rowfed(fits, prob, rho=0.2)  # MCP needs iota > 1/rho
    with pytest.raises(ValueError, match="participation"):
        fit_rowfed(fits, prob, rho=1.0, participation=0.0)
    with pytest.raises(ValueError, match="solver"):
        fit_rowfed(fits, prob, rho=1.0, solver="newton")
    with pytest.raises(ValueError, match="datafits"):
        fit_rowfed(fits[:3], prob, rho=1.0)
    with pytest.raises(ValueError, match="theta0"):
        fit_rowfed(fits, prob, rho=1.0, theta0=np.zeros((M, P, Q + 1)))


# ---------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------
def test_rand_index_by_hand():
    # pairs (01)(02)(03)(12)(13)(23): together in a: 01, 23; in b: 01, 02, 12
    # agree on 01 (both together), 03, 13 (both apart) -> 3 / 6
    assert_allclose(rand_index([0, 0, 1, 1], [0, 0, 0, 1]), 0.5)
    assert_allclose(rand_index([0, 0, 1, 1], [5, 5, 2, 2]), 1.0)  # labels are arbitrary
    assert_allclose(rand_index([0, 1, 2], [0, 0, 0]), 0.0)
    assert_allclose(rand_index([3], [4]), 1.0)
    true = np.array([[0, 0], [0, 0], [1, 0], [1, 0]])
    est = np.array([[0, 0], [0, 0], [0, 0], [1, 1]])
    assert_allclose(mean_rand_index(true, est), (0.5 + 0.5) / 2)


def test_rand_index_vs_brute_force():
    rng = np.random.default_rng(5)
    for _ in range(20):
        a, b = rng.integers(0, 3, size=(2, 6))
        agree = [(a[i] == a[k]) == (b[i] == b[k]) for i in range(6) for k in range(6) if i < k]
        assert_allclose(rand_index(a, b), sum(agree) / 15)


def test_mse_by_hand():
    rng = np.random.default_rng(6)
    th, ts = rng.standard_normal((2, 3, 4, 2))
    assert_allclose(
        mse_est(th, ts), sum(np.sum((th[m] - ts[m]) ** 2) for m in range(3)) / (3 * 4 * 2)
    )
    xs = [rng.standard_normal((n, 4)) for n in (5, 7, 9)]
    ys = [rng.standard_normal((n, 2)) for n in (5, 7, 9)]
    hand = np.mean(
        [np.sum((y - x @ t) ** 2) / (len(x) * 2) for x, y, t in zip(xs, ys, th, strict=True)]
    )
    assert_allclose(mse_pred(th, xs, ys), hand)


def test_row_clusters_from_delta():
    edges = all_pairs(4)  # (0,1)(0,2)(0,3)(1,2)(1,3)(2,3)
    delta = np.ones((6, 2, 3))
    delta[0, 0] = 0.0  # 0~1 on row 0
    delta[3, 0] = 0.0  # 1~2 on row 0 -> {0,1,2} transitively
    delta[5, 1] = 0.0  # 2~3 on row 1
    delta[2, 1, :2] = 0.0  # 0,3 differ in one entry of row 1: not fused
    labels = row_clusters(edges, delta, 4)
    assert_array_equal(labels, [[0, 0], [0, 1], [0, 2], [1, 2]])


def test_degrees_of_freedom_and_gic_by_hand():
    labels = np.array([[0, 0], [0, 1], [1, 1]])  # row 0: {0,1},{2}; row 1: {0},{1,2}
    support = np.zeros((3, 2, 3), dtype=bool)
    support[0, 0] = [1, 0, 0]
    support[1, 0] = [0, 1, 0]  # union with client 0 -> 2 non-zeros
    support[2, 0] = [1, 1, 1]  # -> 3
    support[0, 1] = [0, 0, 0]  # -> 0
    support[1, 1] = [1, 0, 0]
    support[2, 1] = [1, 0, 1]  # union -> 2
    assert degrees_of_freedom(labels, support) == 2 + 3 + 0 + 2
    n_total, p, q, m, df, rss = 90, 2, 3, 3, 7, 12.5
    hand = np.log(rss / (n_total * q)) + np.log(np.log(n_total)) * np.log(p * q * m) / n_total * df
    assert_allclose(gic(rss, n_total, p, q, m, df), hand)


def test_gic_of_fit(fits):
    prob = build_problem(M, "lasso", LAM1, LAM2, "entry")
    res = fit_rowfed(fits, prob, rho=1.0, tol=1e-8)
    labels, support = fitted_structure(prob, res.state)
    rss = sum(np.sum((f.y - f.x @ t) ** 2) for f, t in zip(fits, res.theta, strict=True))
    df = degrees_of_freedom(labels, support)
    assert 0 < df < M * P * Q
    assert_allclose(gic_of_fit(fits, prob, res.state), gic(rss, M * N, P, Q, M, df))


# ---------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------
def test_simulate_design():
    d = simulate(10, 20, 5, 8, 4, seed=11)
    assert len(d.x_train) == 10 and d.x_train[0].shape == (20, 8)
    assert d.y_test[3].shape == (5, 4)
    assert d.theta.shape == (10, 8, 4) and d.partitions.shape == (10, 8)
    assert np.all(d.theta[:, 6:] == 0.0) and np.all(d.partitions[:, 6:] == 0)
    assert_array_equal(d.partitions.max(axis=0)[:6], [0, 0, 1, 1, 2, 2])
    assert set(np.unique(d.theta)) <= {-1.0, -0.5, 0.0, 0.5, 1.0}
    for j in range(6):  # same label <=> same row vector, and non-zero rows
        for u, v in itertools.combinations(range(10), 2):
            same = d.partitions[u, j] == d.partitions[v, j]
            assert same == np.array_equal(d.theta[u, j], d.theta[v, j])
        assert np.all(np.abs(d.theta[:, j]).sum(axis=1) > 0)
    again = simulate(10, 20, 5, 8, 4, seed=11)
    assert_array_equal(again.y_train[9], d.y_train[9])
    assert not np.array_equal(simulate(10, 20, 5, 8, 4, seed=12).theta, d.theta)


def test_simulate_covariances():
    d = simulate(1, 20000, 1, 3, 3, seed=0, n_clusters=())
    x, e = d.x_train[0], d.y_train[0]  # theta = 0, so y = e
    target = 0.5 ** np.abs(np.subtract.outer(np.arange(3), np.arange(3)))
    assert_allclose(np.cov(x.T), target, atol=0.04)
    assert_allclose(np.cov(e.T), target, atol=0.04)


def test_load_crime():
    d = load_crime(CRIME, ["ViolentCrimesPerPop", "PctPopUnderPov"])
    assert len(d.x) == len(d.clients) == 43  # 46 states, three with a single community
    assert d.clients == sorted(d.clients)
    assert "PctPopUnderPov" not in d.predictors and "fold" not in d.predictors
    assert not any(c.startswith("state_") for c in d.predictors)
    assert all(x.shape[1] == len(d.predictors) for x in d.x)
    assert all(y.shape[1] == 2 and len(y) >= 3 for y in d.y)
    assert_allclose(np.mean(d.y[0], axis=0), 0.0, atol=1e-12)
    assert sum(len(x) for x in d.x) == 1993 - 3
    raw = load_crime(CRIME, ["ViolentCrimesPerPop"], min_rows=1, center=False)
    assert len(raw.clients) == 46
    assert np.all(raw.y[0] >= 0.0)
    with pytest.raises(ValueError, match="responses"):
        load_crime(CRIME, ["no_such_column"])


@pytest.mark.parametrize("algorithm", ["pqn", "admm"])
def test_mean_fusion_matches_cvxpy(algorithm):
    """The mean-fusion comparator: ``sum_m f_m + lam1 sum_m sum_j ||theta_m(j) -
    mean_m' theta_m'(j)||_2 + lam2 |Theta|_1`` (cvxpy), through the strategy; its clusters
    are the clients whose row sits at the mean."""
    from rowfed_flower import federation as fed
    from rowfed_flower import sources as rsources
    from strategies.config import RowFedConfig

    spec = rsources.DataSpec(num_clients=5, num_features=3, num_responses=2, n_train=30, seed=4)
    data = rsources.load_data(spec)
    lam1, lam2 = 0.15, 0.02
    cfg = RowFedConfig(
        **dict(lam1=lam1, lam2=lam2, intercept=False, standardize="none"),
        **dict(tol=1e-10, max_rounds=5000, algorithm=algorithm),
    )
    res = fed.run_methods_inprocess(cfg, data, ["mean-fusion"])["mean-fusion"]
    t = cp.Variable((5 * 3, 2))
    blocks = [t[3 * m : 3 * m + 3] for m in range(5)]
    mean = sum(blocks) / 5
    loss = sum(
        cp.sum_squares(c.y - c.x @ b) / (2 * c.x.shape[0])
        for c, b in zip(data.clients, blocks, strict=True)
    )
    fusion = sum(cp.sum(cp.norm(b - mean, 2, axis=1)) for b in blocks)
    prob = cp.Problem(cp.Minimize(loss + lam1 * fusion + lam2 * cp.sum(cp.abs(t))))
    prob.solve(solver="CLARABEL", tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    want = t.value.reshape(5, 3, 2)
    assert_allclose(res.coefficients, want, atol=1e-5)
    at_mean = np.linalg.norm(want - want.mean(axis=0), axis=2) < 1e-6  # (M, p)
    assert at_mean.any() and not at_mean.all()
    for j in range(3):
        labels = res.clusters[:, j]
        assert len(set(labels[at_mean[:, j]])) <= 1
        assert len(set(labels[~at_mean[:, j]])) == int((~at_mean[:, j]).sum())


@pytest.mark.parametrize(
    ("algorithm", "intercept"), [("pqn", False), ("admm", False), ("pqn", True)]
)
def test_rows_weighting_matches_cvxpy(algorithm, intercept):
    """``size-power = 1``: ``sum_m w_m f_m + lam1 fusion + lam2 |Theta|_1`` with
    ``w_m = M n_m / sum n`` -- the pooled least squares ``(M / 2N) sum_m ||Y_m - X_m
    Theta_m||^2`` -- on clients of 12 to 40 rows (cvxpy, weights computed here), through the
    strategy; it differs from the equally weighted fit."""
    import dataclasses

    from rowfed_flower import federation as fed
    from strategies.config import RowFedConfig

    spec = rsources.DataSpec(num_clients=5, num_features=3, num_responses=2, n_train=40, seed=6)
    full = rsources.load_data(spec)
    sizes = (40, 12, 25, 18, 33)
    clients = tuple(
        dataclasses.replace(c, x=c.x[:n], y=c.y[:n])
        for c, n in zip(full.clients, sizes, strict=True)
    )
    data = dataclasses.replace(full, clients=clients)
    lam1, lam2 = 0.1, 0.02
    cfg = RowFedConfig(
        lam1=lam1,
        lam2=lam2,
        intercept=intercept,
        tol=1e-10,
        max_rounds=5000,
        algorithm=algorithm,
        size_power=1.0,
        standardize="none",
    )
    res = fed.run_methods_inprocess(cfg, data, ["rowfed"])["rowfed"]
    n = np.array(sizes, dtype=float)
    omega = len(n) * n / n.sum()

    def reference(weights):
        t = [cp.Variable((3, 2)) for _ in clients]
        a = [cp.Variable(2) for _ in clients] if intercept else [0.0] * len(clients)
        loss = sum(
            w
            * cp.sum_squares(c.y - c.x @ tm - np.ones((c.n, 1)) @ cp.reshape(b, (1, 2)))
            / (2 * c.n)
            if intercept
            else w * cp.sum_squares(c.y - c.x @ tm) / (2 * c.n)
            for w, c, tm, b in zip(weights, clients, t, a, strict=True)
        )
        fusion = sum(cp.sum(cp.norm(t[u] - t[v], 2, axis=1)) for u, v in all_pairs(len(t)))
        sparse = sum(cp.sum(cp.abs(tm)) for tm in t)
        prob = cp.Problem(cp.Minimize(loss + lam1 * fusion + lam2 * sparse))
        prob.solve(solver="CLARABEL", tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
        assert prob.status == "optimal"
        return np.stack([tm.value for tm in t])

    want = reference(omega)
    assert_allclose(res.coefficients, want, atol=1e-5)
    assert np.max(np.abs(reference(np.ones(5)) - want)) > 1e-2
