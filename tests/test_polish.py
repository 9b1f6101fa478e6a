"""Exact polishing of the fused-lasso model problem on a tree (strategies.solvers.polish) against
independent references: a conic solver (cvxpy), a dense least-squares solve for the tree's
flows, and the optimality conditions written out directly."""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest
import scipy.sparse as sp
from numpy.testing import assert_allclose

from strategies.solvers import admm, modelsolve
from strategies.solvers import polish as polish_module
from strategies.solvers.penalties import Penalty
from strategies.solvers.polish import cluster_solve, forest, polish


def random_forest(n_sites, n_trees, seed):
    """A random forest on ``n_sites`` sites: each site after the first of its tree joins a
    random earlier site of the same tree."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n_sites)
    trees = np.array_split(perm, n_trees)
    edges = []
    for t in trees:
        for k in range(1, len(t)):
            u, v = t[k], t[rng.integers(k)]
            edges.append((u, v) if rng.random() < 0.5 else (v, u))
    return np.array(edges)


def random_model(n_sites, p, seed, lam_level):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_sites, p))
    g = rng.standard_normal((n_sites, p))
    a = rng.standard_normal((n_sites, p, p))
    hess = np.einsum("zij,zkj->zik", a, a) / p + 0.1 * np.eye(p)
    return x, g, hess


def cvxpy_solution(edges, lam, x, g, hess):
    n_sites, p = x.shape
    b = cp.Variable((n_sites, p))
    obj = sum(
        g[z] @ (b[z] - x[z]) + 0.5 * cp.quad_form(b[z] - x[z], hess[z]) for z in range(n_sites)
    )
    obj += sum(lam[e] * cp.norm(b[u] - b[v], 1) for e, (u, v) in enumerate(edges))
    cp.Problem(cp.Minimize(obj)).solve(
        solver="CLARABEL", tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11
    )
    return b.value


def test_forest_recognizes_trees_only():
    edges = random_forest(12, 3, 0)
    assert forest(admm.incidence_matrix(edges, 12)) is not None
    cycle = np.vstack([edges, [edges[0][0], edges[1][1]]])
    if not np.array_equal(np.sort(cycle[-1]), np.sort(edges[1])):
        assert forest(admm.incidence_matrix(cycle, 12)) is None  # one edge too many
    assert forest(admm.incidence_matrix(np.vstack([edges, edges[:1]]), 12)) is None  # twice
    assert forest(np.eye(4)) is None  # a sparsity split, not differences


@pytest.mark.parametrize("seed", range(4))
def test_fused_clusters_are_scipys_connected_components(seed):
    """The sweep down the forest's levels labels the fused coordinates as
    scipy.sparse.csgraph.connected_components does, numbering included."""
    from scipy.sparse.csgraph import connected_components

    rng = np.random.default_rng(seed)
    for _ in range(40):
        z, p = int(rng.integers(2, 30)), int(rng.integers(1, 5))
        perm = rng.permutation(z)
        edges = [
            (perm[int(rng.integers(0, i))], perm[i]) for i in range(1, z) if rng.random() < 0.85
        ]
        if not edges:
            continue
        edges = np.array([e if rng.random() < 0.5 else e[::-1] for e in edges])
        tree = forest(admm.incidence_matrix(edges, z))
        fused = rng.random((len(edges), p)) < 0.5
        e, j = np.nonzero(fused)
        links = sp.coo_matrix(
            (np.ones(len(e)), (edges[e, 0] * p + j, edges[e, 1] * p + j)), shape=(z * p,) * 2
        )
        want_n, want = connected_components(links, directed=False)
        got_n, got = tree.clusters(fused)
        assert got_n == want_n
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_subtree_flow_solves_the_tree_equations(seed):
    n_sites, n_trees = 25, 3
    edges = random_forest(n_sites - 1, n_trees, seed)  # and the last site on its own
    d = admm.incidence_matrix(edges, n_sites).toarray()
    tree = forest(d)
    rng = np.random.default_rng(seed)
    nu_true = rng.standard_normal((len(edges), 4))
    q = d.T @ nu_true  # sums to zero over every tree
    assert_allclose(tree.subtree_flow(q), nu_true, atol=1e-12)
    # and D^T nu = q has one solution: the dense least-squares one
    assert_allclose(np.linalg.lstsq(d.T, q, rcond=None)[0], nu_true, atol=1e-10)


@pytest.mark.parametrize("solver", ["lu", "schur"])
@pytest.mark.parametrize("lam_level", [0.05, 0.5, 5.0])  # little, much and (almost) all fusion
@pytest.mark.parametrize("seed", [0, 1])
def test_polish_from_a_perturbed_pattern_matches_cvxpy(lam_level, seed, solver, monkeypatch):
    monkeypatch.setattr(polish_module, "SCHUR_MIN_P", 1 if solver == "schur" else 10**9)
    n_sites, p = 30, 3
    edges = random_forest(n_sites, 2, seed)
    lam = lam_level * np.random.default_rng(seed).uniform(0.5, 1.5, len(edges))
    x, g, hess = random_model(n_sites, p, seed, lam_level)
    ref = cvxpy_solution(edges, lam, x, g, hess)
    delta_ref = ref[edges[:, 0]] - ref[edges[:, 1]]
    guess = np.where(np.abs(delta_ref) < 1e-7, 0.0, delta_ref)
    flip = np.random.default_rng(seed + 10).random(guess.shape) < 0.1  # 10% of the pattern wrong
    guess = np.where(flip, np.where(guess == 0.0, 1.0, 0.0), guess)
    tree = forest(admm.incidence_matrix(edges, n_sites))
    c = np.einsum("zij,zj->zi", hess, x) - g
    res = polish(tree, lam, c, hess, guess)
    assert res is not None
    assert_allclose(res.b, ref, atol=1e-6)
    assert np.array_equal(res.delta == 0.0, np.abs(delta_ref) < 1e-7)
    # the optimality conditions, written out: B b - c + D^T nu = 0 and nu in lam d|D b|
    d = admm.incidence_matrix(edges, n_sites).toarray()
    stat = np.einsum("zij,zj->zi", hess, res.b) - c + d.T @ res.nu
    assert np.abs(stat).max() < 1e-9 * max(1.0, np.abs(c).max())
    free = res.delta != 0.0
    assert_allclose(res.nu[free], (lam[:, None] * np.sign(res.delta))[free], rtol=1e-12)
    assert np.all(np.abs(res.nu) <= lam[:, None] * (1 + 1e-9))


@pytest.mark.parametrize("fusion", [0.0, 0.3, 0.8, 1.0])
def test_cluster_solve_equals_a_dense_solve_of_the_assembled_system(fusion, monkeypatch):
    """A pattern's linear system ``sum_z E_z^T B_z E_z y = r``, assembled entry by entry in
    loops and solved densely, against both of :func:`cluster_solve`'s routes (the Schur
    complement onto the shared clusters and the sparse LU); a singular system gives
    ``None``."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    n_sites, p = 12, 4
    rng = np.random.default_rng(int(10 * fusion))
    edges = random_forest(n_sites, 2, 3)
    tree = forest(admm.incidence_matrix(edges, n_sites))
    _, _, hess = random_model(n_sites, p, 4, 0.0)
    e, j = np.nonzero(rng.random((len(edges), p)) < fusion)
    links = coo_matrix(
        (np.ones(len(e)), (tree.plus[e] * p + j, tree.minus[e] * p + j)), shape=(n_sites * p,) * 2
    )
    n_clusters, cluster = connected_components(links, directed=False)
    dense = np.zeros((n_clusters, n_clusters))
    for z in range(n_sites):
        for a in range(p):
            for b in range(p):
                dense[cluster[z * p + a], cluster[z * p + b]] += hess[z, a, b]
    rhs = rng.standard_normal(n_clusters)
    want = np.linalg.solve(dense, rhs)
    for min_p in (1, 10**9):
        monkeypatch.setattr(polish_module, "SCHUR_MIN_P", min_p)
        assert_allclose(cluster_solve(tree, cluster, n_clusters, hess, rhs), want, atol=1e-10)
        if fusion == 0.0:  # site 0 alone in its clusters, its block zero: singular
            bad = hess.copy()
            bad[0] = 0.0
            assert cluster_solve(tree, cluster, n_clusters, bad, rhs) is None


def test_polish_gives_up_on_a_hopeless_start():
    """From the pattern 'nothing fused, every sign wrong' with strong fusion the active-set
    steps need not settle; then the answer is None (ADMM goes on), never a wrong answer."""
    n_sites, p = 30, 3
    edges = random_forest(n_sites, 1, 4)
    lam = np.full(len(edges), 5.0)
    x, g, hess = random_model(n_sites, p, 4, 5.0)
    ref = cvxpy_solution(edges, lam, x, g, hess)
    tree = forest(admm.incidence_matrix(edges, n_sites))
    c = np.einsum("zij,zj->zi", hess, x) - g
    delta_ref = ref[edges[:, 0]] - ref[edges[:, 1]]
    res = polish(tree, lam, c, hess, -np.sign(delta_ref + 1e-3) * 1.0, max_iter=2)
    assert res is None or np.abs(res.b - ref).max() < 1e-6


@pytest.mark.parametrize("graph", ["tree", "cycle"])
def test_solve_model_exact_on_trees_and_right_elsewhere(graph):
    """``solve_model`` polishes on a tree (exact fusions, few iterations) and falls back to
    ADMM on a graph with a cycle; both match cvxpy."""
    n_sites, p = 30, 3
    edges = random_forest(n_sites, 1, 7)
    if graph == "cycle":
        edges = np.vstack([edges, [[0, 1], [2, 3]]])
        edges = np.unique(np.sort(edges, axis=1), axis=0)
    lam = np.full(len(edges), 0.3)
    x, g, hess = random_model(n_sites, p, 7, 0.3)
    prob = admm.Problem(
        (admm.Split(admm.incidence_matrix(edges, n_sites), Penalty("lasso"), lam),), n_sites
    )
    sol = modelsolve.solve_model(prob, x, g, hess)
    ref = cvxpy_solution(edges, lam, x, g, hess)
    assert_allclose(sol.b, ref, atol=1e-6)
    fused_ref = np.abs(ref[edges[:, 0]] - ref[edges[:, 1]]) < 1e-7
    assert np.array_equal(sol.delta[0] == 0.0, fused_ref)
    assert (modelsolve._tree_of(prob, x, np.zeros(n_sites, bool)) is not None) == (graph == "tree")


def test_solve_model_without_a_warm_start_polishes_from_the_points_own_fusions():
    """A point with fused entries (a warm start along a lam path) and no previous model
    solution: ``solve_model`` tries the point's own pattern before any ADMM iteration (no
    factorization of the full system) and still matches cvxpy; a point with nothing fused
    goes through ADMM first."""
    n_sites, p = 30, 3
    edges = random_forest(n_sites, 1, 11)
    lam = np.full(len(edges), 0.3)
    _, g, hess = random_model(n_sites, p, 11, 0.3)
    prob = admm.Problem(
        (admm.Split(admm.incidence_matrix(edges, n_sites), Penalty("lasso"), lam),), n_sites
    )
    x0 = np.random.default_rng(11).standard_normal((n_sites, p))
    fused_point = modelsolve.solve_model(prob, x0, g, hess).b  # exact fusions
    assert (fused_point[edges[:, 0]] == fused_point[edges[:, 1]]).any()
    g2 = g + 0.05 * np.random.default_rng(12).standard_normal(g.shape)
    sol = modelsolve.solve_model(prob, fused_point, g2, hess)
    assert sol.iterations < modelsolve.POLISH_FIRST  # polished without the inner ADMM
    assert_allclose(sol.b, cvxpy_solution(edges, lam, fused_point, g2, hess), atol=1e-6)
    plain = modelsolve.solve_model(prob, x0, g2, hess)
    assert plain.iterations >= modelsolve.POLISH_FIRST  # nothing fused at x0: ADMM first
