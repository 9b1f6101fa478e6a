"""GrAUC-PFL's numerical core, piece by piece.

Each piece is checked against a brute force written here from §1.1–§1.2 and §1.8
(double loops over pairs, enumeration of spanning trees, placement values), gradients and
Hessians with ``scipy.optimize.check_grad``, and the local steps against their optimality
conditions and a generic minimizer.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import scipy.optimize as so
from geopy.distance import geodesic
from numpy.testing import assert_allclose, assert_array_equal
from scipy.sparse.csgraph import minimum_spanning_tree

from grauc_flower.data import (
    GROUP_CENTRES,
    class_sizes,
    load_csv,
    mean_shift,
    read_data,
    read_sites,
    simulate,
)
from grauc_flower.datafit import (
    START_RIDGE,
    PairwiseLogistic,
    local_fit,
    newton_minimize,
    split_by_class,
    start_fit,
)
from grauc_flower.graph import (
    build_graph,
    distance_matrix,
    edge_weights,
    geodesic_km,
    knn_edges,
    mst_edges,
    unit_vectors,
)
from grauc_flower.metrics import auc, delong
from strategies.errors import InputError
from strategies.solvers.admm import all_pairs
from strategies.solvers.local import PROX_SLACK, curvature, local_step

P = 4


def make_site(n, m, p=P, seed=0, shift=0.7):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, p)) + shift, rng.standard_normal((m, p))


# ---------------------------------------------------------------------------------------
# brute-force references (docs/methods.md 1.1), one pair at a time
# ---------------------------------------------------------------------------------------
def pair_differences(x_pos, x_neg):
    return np.array([xp - xn for xp in x_pos for xn in x_neg])


def brute_value(x_pos, x_neg, b, eta):
    total = 0.0
    for xp in x_pos:
        for xn in x_neg:
            t = float(b @ (xp - xn))
            total += math.log1p(math.exp(-t))
    return total / (len(x_pos) * len(x_neg)) + 0.5 * eta * float(b @ b)


def brute_grad(x_pos, x_neg, b, eta):
    g = np.zeros_like(b)
    for xp in x_pos:
        for xn in x_neg:
            d = xp - xn
            g -= d / (1.0 + math.exp(float(b @ d)))
    return g / (len(x_pos) * len(x_neg)) + eta * b


def brute_hessian(x_pos, x_neg, b, eta):
    h = eta * np.eye(len(b))
    nm = len(x_pos) * len(x_neg)
    for xp in x_pos:
        for xn in x_neg:
            d = xp - xn
            s = 1.0 / (1.0 + math.exp(-float(b @ d)))
            h += s * (1.0 - s) * np.outer(d, d) / nm
    return h


def brute_auc(scores, y):
    pos, neg = scores[y == 1], scores[y == 0]
    psi = [[1.0 if a > b else 0.5 if a == b else 0.0 for b in neg] for a in pos]
    return float(np.mean(psi))


def brute_delong_se(scores, y):
    pos, neg = scores[y == 1], scores[y == 0]
    psi = np.array([[1.0 if a > b else 0.5 if a == b else 0.0 for b in neg] for a in pos])
    v10 = psi.mean(axis=1)
    v01 = psi.mean(axis=0)
    return math.sqrt(np.var(v10, ddof=1) / len(pos) + np.var(v01, ddof=1) / len(neg))


# ---------------------------------------------------------------------------------------
# the surrogate
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("eta", [0.0, 0.3])
def test_value_and_grad_vs_double_loop(eta):
    x_pos, x_neg = make_site(7, 11, seed=1)
    f = PairwiseLogistic(x_pos, x_neg, eta=eta)
    rng = np.random.default_rng(2)
    for b in (np.zeros(P), rng.standard_normal(P), 5.0 * rng.standard_normal(P)):
        assert_allclose(f.value(b), brute_value(x_pos, x_neg, b, eta), rtol=1e-12)
        assert_allclose(f.grad(b), brute_grad(x_pos, x_neg, b, eta), rtol=1e-10, atol=1e-14)
        v, g = f.value_and_grad(b)
        assert_allclose(v, f.value(b), rtol=1e-14)
        assert_allclose(g, f.grad(b), rtol=1e-14)
    # at b = 0 every pair contributes log 2, whatever the data
    assert_allclose(f.value(np.zeros(P)), math.log(2.0))


def test_value_is_stable_for_large_scores():
    """``logaddexp``: no overflow for huge margins either way (log(1+exp(-t)) ~ -t)."""
    x_pos, x_neg = np.array([[1.0, 0.0]]), np.array([[0.0, 0.0]])
    f = PairwiseLogistic(x_pos, x_neg)
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        assert_allclose(f.value(np.array([-1000.0, 0.0])), 1000.0)
        assert f.value(np.array([1000.0, 0.0])) == pytest.approx(0.0, abs=1e-300)
        assert_allclose(f.grad(np.array([-1000.0, 0.0])), [-1.0, 0.0])


@pytest.mark.parametrize("eta", [0.0, 0.2])
def test_hessian_vs_double_loop(eta):
    x_pos, x_neg = make_site(6, 9, seed=3)
    f = PairwiseLogistic(x_pos, x_neg, eta=eta)
    b = np.random.default_rng(4).standard_normal(P)
    assert_allclose(f.hessian(b), brute_hessian(x_pos, x_neg, b, eta), rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("chunk", [1, 3, 7, 11, 12, 1000])
def test_chunking_gives_the_same_results(chunk):
    x_pos, x_neg = make_site(13, 11, seed=5)
    b = np.random.default_rng(6).standard_normal(P)
    whole = PairwiseLogistic(x_pos, x_neg, eta=0.1)
    part = PairwiseLogistic(x_pos, x_neg, eta=0.1, chunk_elements=chunk)
    assert_allclose(part.value(b), whole.value(b), rtol=1e-13)
    assert_allclose(part.grad(b), whole.grad(b), rtol=1e-12, atol=1e-15)
    assert_allclose(part.hessian(b), whole.hessian(b), rtol=1e-12, atol=1e-15)
    assert_allclose(part.lipschitz(), whole.lipschitz(), rtol=1e-14)


@pytest.mark.parametrize("eta", [0.0, 0.05])
def test_gradient_and_hessian_check_grad(eta):
    x_pos, x_neg = make_site(9, 14, seed=7)
    f = PairwiseLogistic(x_pos, x_neg, eta=eta, chunk_elements=20)
    rng = np.random.default_rng(8)
    for _ in range(3):
        b = rng.standard_normal(P)
        scale = max(1.0, np.linalg.norm(f.grad(b)))
        assert so.check_grad(f.value, f.grad, b) < 1e-6 * scale
        for k in range(P):
            err = so.check_grad(lambda v, k=k: f.grad(v)[k], lambda v, k=k: f.hessian(v)[k], b)
            assert err < 1e-6 * max(1.0, np.linalg.norm(f.hessian(b)[k]))
    # the Hessian is symmetric positive semidefinite (plus eta)
    h = f.hessian(b)
    assert_allclose(h, h.T, atol=1e-15)
    assert np.linalg.eigvalsh(h)[0] >= eta - 1e-12


@pytest.mark.parametrize("eta", [0.0, 0.4])
def test_lipschitz_vs_brute_force(eta):
    x_pos, x_neg = make_site(8, 5, seed=9)
    f = PairwiseLogistic(x_pos, x_neg, eta=eta)
    d = pair_differences(x_pos, x_neg)
    brute = np.linalg.eigvalsh(d.T @ d / (4.0 * len(d)))[-1] + eta
    assert_allclose(f.lipschitz(), brute, rtol=1e-12)
    # mu bounds the Hessian everywhere (sigma(1 - sigma) <= 1/4) and the gradient's variation
    rng = np.random.default_rng(10)
    for _ in range(5):
        a, b = rng.standard_normal((2, P))
        assert np.linalg.eigvalsh(f.hessian(a))[-1] <= f.lipschitz() + 1e-12
        assert np.linalg.norm(f.grad(a) - f.grad(b)) <= f.lipschitz() * np.linalg.norm(a - b)
    # equality at b = 0, where sigma(0)(1 - sigma(0)) = 1/4 exactly
    assert_allclose(np.linalg.eigvalsh(f.hessian(np.zeros(P)))[-1], f.lipschitz(), rtol=1e-12)


def test_empty_class_is_ridge_only():
    x_pos = np.zeros((0, 3))
    x_neg = np.random.default_rng(0).standard_normal((5, 3))
    f = PairwiseLogistic(x_pos, x_neg, eta=0.5)
    b = np.array([1.0, -2.0, 0.5])
    assert f.empty
    assert_allclose(f.value(b), 0.25 * b @ b)
    assert_allclose(f.grad(b), 0.5 * b)
    assert_allclose(f.hessian(b), 0.5 * np.eye(3))
    assert_allclose(f.lipschitz(), 0.5)


def test_split_by_class():
    x = np.arange(12.0).reshape(6, 2)
    y = np.array([1, 0, 0, 1, 1, 0])
    xp, xn = split_by_class(x, y)
    assert_array_equal(xp, x[[0, 3, 4]])
    assert_array_equal(xn, x[[1, 2, 5]])


# ---------------------------------------------------------------------------------------
# AUC and DeLong
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("levels", [None, 3, 2])
def test_auc_vs_brute_force_with_ties(levels):
    rng = np.random.default_rng(11)
    y = (rng.random(40) < 0.4).astype(int)
    y[:2] = [0, 1]
    s = rng.standard_normal(40) + y
    if levels is not None:  # many ties: only a few distinct scores
        s = np.floor(levels * (s - s.min()) / (np.ptp(s) + 1e-9))
    assert_allclose(auc(s, y), brute_auc(s, y), rtol=1e-14)
    a, se = delong(s, y)
    assert_allclose(a, brute_auc(s, y), rtol=1e-14)
    assert_allclose(se, brute_delong_se(s, y), rtol=1e-12)


def test_auc_edge_cases():
    y = np.array([1, 1, 0, 0, 0])
    assert auc(np.ones(5), y) == pytest.approx(0.5)  # all tied
    assert auc(np.array([5.0, 4.0, 1.0, 2.0, 3.0]), y) == pytest.approx(1.0)
    assert auc(-np.array([5.0, 4.0, 1.0, 2.0, 3.0]), y) == pytest.approx(0.0)
    assert math.isnan(auc(np.ones(3), np.ones(3)))
    assert all(math.isnan(v) for v in delong(np.ones(3), np.zeros(3)))
    a, se = delong(np.array([5.0, 4.0, 1.0, 2.0, 3.0]), y)  # perfect separation: no spread
    assert a == pytest.approx(1.0)
    assert se == pytest.approx(0.0, abs=1e-15)


def test_delong_invariant_under_monotone_transform():
    rng = np.random.default_rng(12)
    y = np.repeat([1, 0], [15, 25])
    s = rng.standard_normal(40) + 0.8 * y
    assert_allclose(delong(np.exp(s), y), delong(s, y), rtol=1e-13)
    assert_allclose(brute_delong_se(s, y), delong(s, y)[1], rtol=1e-12)


# ---------------------------------------------------------------------------------------
# local solvers
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("eta", [0.0, 0.1])
@pytest.mark.parametrize("c", [0.05, 1.0, 20.0])
def test_prox_step_optimality_and_vs_scipy(eta, c):
    x_pos, x_neg = make_site(10, 12, seed=13)
    f = PairwiseLogistic(x_pos, x_neg, eta=eta)
    t = np.random.default_rng(14).standard_normal(P)
    b = f.prox(t, c)
    assert_allclose(f.grad(b) + c * (b - t), 0.0, atol=1e-10)

    def h(v):
        return brute_value(x_pos, x_neg, v, eta) + 0.5 * c * float((v - t) @ (v - t))

    def dh(v):
        return brute_grad(x_pos, x_neg, v, eta) + c * (v - t)

    ref = so.minimize(h, np.zeros(P), jac=dh, method="BFGS", options={"gtol": 1e-12})
    assert_allclose(b, ref.x, atol=1e-6)
    # the start does not matter
    assert_allclose(f.prox(t, c, x0=10 * np.ones(P)), b, atol=1e-9)


def test_linearized_step_formula():
    x_pos, x_neg = make_site(5, 8, seed=15)
    f = PairwiseLogistic(x_pos, x_neg, eta=0.2)
    rng = np.random.default_rng(16)
    t, prev = rng.standard_normal((2, P))
    expected = t - brute_grad(x_pos, x_neg, prev, 0.2) / 3.0
    assert_allclose(local_step(f, t, prev, 3.0, "linearized"), expected, atol=1e-13)


@pytest.mark.parametrize("eta", [0.0, 1e-3])
def test_local_fit_is_stationary(eta):
    x_pos, x_neg = make_site(12, 20, seed=17, shift=0.3)  # overlapping: a finite minimizer
    f = PairwiseLogistic(x_pos, x_neg, eta=eta)
    b = local_fit(f)
    assert_allclose(f.grad(b), 0.0, atol=1e-10)
    ref = so.minimize(f.value, np.zeros(P), jac=f.grad, method="BFGS", options={"gtol": 1e-12})
    assert f.value(b) <= f.value(ref.x) + 1e-12


@pytest.mark.parametrize(
    ("eta", "separable", "weight"), [(0.0, True, 1.0), (0.0, False, 2.5), (1.0, False, 1.0)]
)
def test_start_fit_minimizes_the_loss_with_its_ridge_floored(eta, separable, weight):
    """The start round's fit (``init = local``): the minimizer of the brute-force surrogate
    with ridge ``max(eta, START_RIDGE lambda_max(sum_ij d d^T / (4 n m)))`` (the bound
    computed here from the pairs), found by a generic minimizer; finite on separable data,
    where the site's own loss has no minimizer; the site's own fit when its ridge is
    already above the floor."""
    x_pos, x_neg = make_site(6, 9, seed=21, shift=4.0 if separable else 0.3)
    f = PairwiseLogistic(x_pos, x_neg, eta=eta, weight=weight)
    d = pair_differences(x_pos, x_neg)
    floor = START_RIDGE * np.linalg.eigvalsh(d.T @ d / (4 * len(d)))[-1]
    ridge = max(eta, floor)
    ref = so.minimize(
        lambda b: brute_value(x_pos, x_neg, b, ridge),
        np.zeros(P),
        jac=lambda b: brute_grad(x_pos, x_neg, b, ridge),
        method="BFGS",
        options={"gtol": 1e-11},
    )
    got = start_fit(f)
    assert np.all(np.isfinite(got))
    assert_allclose(brute_grad(x_pos, x_neg, got, ridge), 0.0, atol=1e-9)
    assert_allclose(got, ref.x, atol=1e-6)
    if eta >= floor:
        assert_allclose(got, local_fit(f), atol=1e-12)


def test_newton_on_separable_data_without_ridge_stops():
    """eta = 0 and separable data: no finite minimizer; the iteration must still end."""
    x_pos = np.array([[2.0, 0.0], [3.0, 1.0]])
    x_neg = np.array([[-1.0, 0.0], [-2.0, 1.0]])
    f = PairwiseLogistic(x_pos, x_neg)
    b, it = newton_minimize(f, np.zeros(2), max_iter=30)
    assert np.all(np.isfinite(b))
    assert it <= 30
    assert f.value(b) < f.value(np.zeros(2))
    # with a prox term it is strongly convex again and solved exactly
    t = np.array([0.5, -0.5])
    b = f.prox(t, 0.1)
    assert_allclose(f.grad(b) + 0.1 * (b - t), 0.0, atol=1e-10)


def test_curvature():
    """Both methods' sites use this one function (RowFed's L_m in place of mu_z)."""
    mu = np.array([0.3, 1.2])
    assert_allclose(curvature("linearized", mu, 0.5 * 4.0), mu + 2.0)
    assert_allclose(curvature("prox", mu, 0.5 * 4.0), 2.0 * (1 + PROX_SLACK))
    assert np.all(curvature("prox", mu, 0.5 * 4.0) > 0.5 * 4.0)  # strictly above rho sigma
    assert_allclose(curvature("linearized", mu, 0.0), mu)
    assert np.all(curvature("prox", mu, 0.0) > 0)
    assert float(curvature("prox", 2.0, 3.0)) == 3.0 * (1 + PROX_SLACK)  # a scalar L
    with pytest.raises(ValueError, match="local-solver"):
        curvature("newton", mu, 2.0)


# ---------------------------------------------------------------------------------------
# the graph (docs/methods.md 1.2)
# ---------------------------------------------------------------------------------------
LAX = (33.9425, -118.4081)
JFK = (40.6398, -73.7789)


def test_geodesic_known_distance():
    d = geodesic_km(*LAX, *JFK)
    assert d == pytest.approx(3983.0, abs=5.0)  # WGS-84 geodesic LAX-JFK (about 2475 mi)
    assert geodesic_km(*JFK, *LAX) == pytest.approx(d, rel=1e-12)
    assert geodesic_km(*LAX, *LAX) == 0.0
    # a quarter meridian on WGS-84 is 10001.966 km
    assert geodesic_km(0.0, 0.0, 90.0, 0.0) == pytest.approx(10001.966, abs=0.01)


def random_sites(z, seed, lat=(25.0, 48.0), lon=(-122.0, -70.0)):
    rng = np.random.default_rng(seed)
    return rng.uniform(*lat, z), rng.uniform(*lon, z)


def test_distance_matrix():
    lat, lon = random_sites(5, 0)
    d = distance_matrix(lat, lon)
    assert_allclose(d, d.T)
    assert_array_equal(np.diag(d), 0.0)
    for u, v in itertools.combinations(range(5), 2):
        assert_allclose(d[u, v], geodesic((lat[u], lon[u]), (lat[v], lon[v])).km, rtol=1e-12)


def is_spanning_tree(edges, z):
    parent = list(range(z))

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    if len(edges) != z - 1:
        return False
    for u, v in edges:
        ru, rv = find(int(u)), find(int(v))
        if ru == rv:
            return False
        parent[ru] = rv
    return True


def kruskal_lexicographic(dist):
    """Kruskal with ties broken by (u, v): the tree the code promises."""
    z = dist.shape[0]
    cand = sorted((dist[u, v], u, v) for u, v in itertools.combinations(range(z), 2))
    parent = list(range(z))

    def find(a):
        while parent[a] != a:
            a = parent[a]
        return a

    out = []
    for _, u, v in cand:
        ru, rv = find(u), find(v)
        if ru != rv:
            parent[ru] = rv
            out.append((u, v))
    return np.array(sorted(out))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mst_is_minimum_by_enumeration(seed):
    z = 6
    lat, lon = random_sites(z, seed)
    dist = distance_matrix(lat, lon)
    edges = mst_edges(dist)
    assert edges.shape == (z - 1, 2)
    assert np.all(edges[:, 0] < edges[:, 1])
    assert is_spanning_tree(edges, z)
    pairs = list(itertools.combinations(range(z), 2))
    best = min(
        sum(dist[u, v] for u, v in tree)
        for tree in itertools.combinations(pairs, z - 1)
        if is_spanning_tree(tree, z)
    )
    assert_allclose(dist[edges[:, 0], edges[:, 1]].sum(), best, rtol=1e-12)
    g = build_graph(lat, lon, "mst")
    assert_array_equal(g.edges, edges)
    assert_allclose(g.length_km, dist[edges[:, 0], edges[:, 1]])


def test_mst_ties_are_deterministic():
    # Manhattan distances on a 3 x 3 grid: many equal lengths
    pts = np.array([(i, j) for i in range(3) for j in range(3)], dtype=float)
    dist = np.abs(pts[:, None, :] - pts[None, :, :]).sum(axis=2)
    edges = mst_edges(dist)
    assert_array_equal(edges, kruskal_lexicographic(dist))
    assert_array_equal(mst_edges(dist.copy()), edges)
    # all distances equal: the lexicographically first tree is the star at site 0
    flat = np.ones((5, 5)) - np.eye(5)
    assert_array_equal(mst_edges(flat), [[0, 1], [0, 2], [0, 3], [0, 4]])
    # relabelled sites: still a minimum tree, and the rule (length, u, v) still decides
    rng = np.random.default_rng(0)
    for _ in range(5):
        perm = rng.permutation(9)
        dp = dist[np.ix_(perm, perm)]
        ep = mst_edges(dp)
        assert is_spanning_tree(ep, 9)
        assert_allclose(dp[ep[:, 0], ep[:, 1]].sum(), dist[edges[:, 0], edges[:, 1]].sum())
        assert_array_equal(ep, kruskal_lexicographic(dp))


def test_mst_equivariant_when_distances_distinct():
    lat, lon = random_sites(9, 3)
    edges = mst_edges(distance_matrix(lat, lon))
    perm = np.random.default_rng(1).permutation(9)
    ep = mst_edges(distance_matrix(lat[perm], lon[perm]))
    back = np.sort(perm[ep], axis=1)
    assert_array_equal(back[np.lexsort((back[:, 1], back[:, 0]))], edges)


def test_coincident_sites_still_give_a_tree():
    lat = np.array([40.0, 40.0, 40.0, 35.0, 35.0])
    lon = np.array([-100.0, -100.0, -100.0, -90.0, -90.0])
    g = build_graph(lat, lon, "mst")
    assert is_spanning_tree(g.edges, 5)
    same = build_graph(np.full(4, 10.0), np.full(4, 20.0), "mst")
    assert is_spanning_tree(same.edges, 4)
    assert same.bandwidth == 0.0
    assert_array_equal(same.weights(1.0, 0.01), np.ones(3))
    assert_array_equal(build_graph([1.0], [2.0]).edges.shape, (0, 2))


def chord_mst(lat, lon):
    phi, lam = np.radians(lat), np.radians(lon)
    pts = np.column_stack([np.cos(phi) * np.cos(lam), np.cos(phi) * np.sin(lam), np.sin(phi)])
    chord = np.linalg.norm(pts[:, None] - pts[None, :], axis=2)
    t = minimum_spanning_tree(np.triu(chord)).tocoo()
    e = np.sort(np.column_stack([t.row, t.col]), axis=1)
    return e[np.lexsort((e[:, 1], e[:, 0]))], pts


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_mst_equals_chord_mst(seed):
    """Great-circle MST = 3-D Euclidean MST on the unit sphere (docs/methods.md 1.2 scale note);
    the ellipsoidal geodesic agrees on generic random points."""
    lat, lon = random_sites(25, seed, lat=(-60.0, 70.0), lon=(-180.0, 180.0))
    ref, pts = chord_mst(lat, lon)
    assert_allclose(unit_vectors(lat, lon), pts, atol=1e-15)
    assert_array_equal(mst_edges(distance_matrix(lat, lon)), ref)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_knn_symmetric_with_at_least_k_neighbours(k):
    z = 8
    lat, lon = random_sites(z, 4)
    dist = distance_matrix(lat, lon)
    edges = knn_edges(dist, k)
    assert np.all(edges[:, 0] < edges[:, 1])
    assert len({tuple(e) for e in edges}) == len(edges)
    adj = np.zeros((z, z), dtype=bool)
    adj[edges[:, 0], edges[:, 1]] = adj[edges[:, 1], edges[:, 0]] = True
    for u in range(z):
        assert adj[u].sum() >= k
        nearest = np.argsort(np.where(np.arange(z) == u, np.inf, dist[u]))[:k]
        assert adj[u, nearest].all()
    # an edge only if one end is among the other's k nearest
    for u, v in edges:
        ru = np.sum(dist[u] < dist[u, v]) - 1  # sites closer to u than v (minus u itself)
        rv = np.sum(dist[v] < dist[u, v]) - 1
        assert min(ru, rv) < k
    g = build_graph(lat, lon, "knn", k=k)
    assert_array_equal(g.edges, edges)
    # k >= Z - 1: the complete graph
    assert_array_equal(knn_edges(dist, 50), all_pairs(z))


def test_complete_and_user_edges():
    lat, lon = random_sites(4, 5)
    g = build_graph(lat, lon, "complete")
    assert len(g.edges) == 6
    user = build_graph(lat, lon, edges=np.array([[2, 0], [1, 3], [0, 2]]))
    assert_array_equal(user.edges, [[0, 2], [1, 3]])
    with pytest.raises(ValueError, match="itself"):
        build_graph(lat, lon, edges=np.array([[1, 1]]))
    with pytest.raises(ValueError, match="graph"):
        build_graph(lat, lon, "delaunay")


def test_edge_weights_formula():
    d = np.array([0.0, 100.0, 500.0, 5000.0])
    h = 250.0**2
    assert_allclose(edge_weights(d, h, 2.0, 0.0), np.exp(-2.0 * d**2 / h))
    w = edge_weights(d, h, 2.0, 0.01)
    assert_allclose(w, np.maximum(np.exp(-2.0 * d**2 / h), 0.01))
    assert w[-1] == 0.01 and w[0] == 1.0  # floor q far away, 1 at distance 0
    assert_array_equal(edge_weights(d, h, 0.0, 0.01), np.ones(4))
    assert np.all(np.diff(w) <= 0)


def test_build_graph_bandwidth_is_median_squared_distance():
    lat, lon = random_sites(7, 6)
    g = build_graph(lat, lon, "mst")
    sq = [
        geodesic((lat[u], lon[u]), (lat[v], lon[v])).km ** 2
        for u, v in itertools.combinations(range(7), 2)
    ]
    assert_allclose(g.bandwidth, np.median(sq), rtol=1e-12)
    assert_allclose(
        g.weights(1.5, 0.2), np.maximum(np.exp(-1.5 * g.length_km**2 / np.median(sq)), 0.2)
    )


# ---------------------------------------------------------------------------------------
# simulated data (docs/methods.md 1.8)
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("prevalence", [0.3, 0.25, 0.2, 0.15, 0.1, 0.05])
@pytest.mark.parametrize("n_train", [50, 300])
def test_simulate_class_sizes_and_prevalence(prevalence, n_train):
    sites = simulate(
        1, n_sites=4, n_features=5, n_train=n_train, n_test=200, prevalence=prevalence, seed=1
    )
    for s in sites:
        for y in (s.y_train, s.y_test):
            total = 200 if y is s.y_test else n_train
            n_pos, n_neg = int(np.sum(y == 1)), int(np.sum(y == 0))
            assert n_pos >= 4 and n_neg >= 4
            assert set(np.unique(y)) == {0, 1}
            if prevalence * total >= 4:
                assert n_pos + n_neg == total
                assert abs(n_pos - prevalence * total) <= 0.5
            else:
                assert n_pos == 4
        assert s.x_train.shape == (len(s.y_train), 5)
        assert s.x_test.shape == (len(s.y_test), 5)
    assert class_sizes(10, 0.05) == (4, 6)
    assert class_sizes(6, 0.5) == (4, 4)


def test_simulate_reproducible_by_seed():
    a = simulate(2, n_sites=6, n_features=3, seed=7)
    b = simulate(2, n_sites=6, n_features=3, seed=7)
    c = simulate(2, n_sites=6, n_features=3, seed=8)
    for sa, sb in zip(a, b, strict=True):
        assert sa.site == sb.site and sa.lat == sb.lat and sa.lon == sb.lon
        assert_array_equal(sa.x_train, sb.x_train)
        assert_array_equal(sa.y_train, sb.y_train)
        assert_array_equal(sa.x_test, sb.x_test)
    assert not all(
        sa.x_train.shape == sc.x_train.shape and np.array_equal(sa.x_train, sc.x_train)
        for sa, sc in zip(a, c, strict=True)
    )
    sizes = {len(s.y_train) for s in simulate(2, n_sites=20, seed=3)}
    assert sizes <= {30, 50, 100, 200, 300} and len(sizes) > 1


def test_simulate_geography():
    sites = simulate(1, n_sites=20, n_features=3, n_train=20, n_test=10, seed=2)
    assert len({s.site for s in sites}) == 20
    for k, s in enumerate(sites):
        clat, clon = GROUP_CENTRES[0 if k < 10 else 1]
        assert abs(s.lat - clat) <= 1.0 and abs(s.lon - clon) <= 1.0


def inferred_groups(sites):
    """Group of each site from its positives: mu* = (1.8, 0.9, 0) or (0, 0.9, 1.8)."""
    out = []
    for s in sites:
        xp = s.x_train[s.y_train == 1]
        diff = xp[:, 0].mean() - xp[:, 2].mean()
        assert abs(abs(diff) - 1.8) < 0.8  # clearly one of the two groups
        out.append(0 if diff > 0 else 1)
    return np.array(out)


def test_sim1_groups_follow_geography():
    sites = simulate(1, n_sites=20, n_features=4, n_train=300, n_test=5, level=3, seed=4)
    assert_array_equal(inferred_groups(sites), np.repeat([0, 1], 10))


def test_sim3_groups_unrelated_to_geography():
    geo = np.repeat([0, 1], 10)
    agree = []
    for seed in range(3):
        sites = simulate(3, n_sites=20, n_features=4, n_train=300, n_test=5, level=3, seed=seed)
        g = inferred_groups(sites)
        assert g.sum() == 10  # still two groups of ten
        agree.append(np.mean(g == geo))
        assert 0.0 < agree[-1] < 1.0  # neither geography nor its mirror image
    assert len(set(agree)) > 1  # assignments change with the seed


def test_sim4_identical_means():
    assert_array_equal(mean_shift(0, 0, 6), mean_shift(0, 1, 6))
    assert_array_equal(mean_shift(0, 0, 6), [0.9, 0.9, 0.9, 0, 0, 0])
    assert_allclose(mean_shift(2, 0, 4), [1.5, 0.9, 0.3, 0.0])
    assert_allclose(mean_shift(2, 1, 4), [0.3, 0.9, 1.5, 0.0])
    sites = simulate(4, n_sites=20, n_features=4, n_train=300, n_test=5, level=3, seed=5)
    means = np.array([s.x_train[s.y_train == 1].mean(axis=0) for s in sites])
    se = 1.0 / np.sqrt(min(s.n_pos for s in sites))
    assert np.all(np.abs(means - [0.9, 0.9, 0.9, 0.0]) < 5 * se)
    neg = np.vstack([s.x_train[s.y_train == 0] for s in sites])
    assert np.all(np.abs(neg.mean(axis=0)) < 5 / np.sqrt(len(neg)))
    with pytest.raises(InputError, match="simulation"):
        simulate(5)


# ---------------------------------------------------------------------------------------
# CSV input: bad files raise InputError naming the field
# ---------------------------------------------------------------------------------------
SITES_OK = "site,lat,lon\nA,34.0,-118.0\nB,40.7,-74.0\n"
DATA_OK = "site,y,x1,x2\nA,1,0.5,1.0\nA,0,0.1,0.2\nB,1,1.5,0.0\nB,0,-0.3,0.4\nB,0,0.0,0.0\n"


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_load_csv_ok(tmp_path):
    sites, features = load_csv(
        write(tmp_path, "d.csv", DATA_OK), write(tmp_path, "s.csv", SITES_OK)
    )
    assert features == ["x1", "x2"]
    assert [s.site for s in sites] == ["A", "B"]
    assert_array_equal(sites[1].x_train, [[1.5, 0.0], [-0.3, 0.4], [0.0, 0.0]])
    assert_array_equal(sites[1].y_train, [1, 0, 0])
    assert sites[0].lat == 34.0 and sites[1].lon == -74.0


@pytest.mark.parametrize(
    "sites_text, data_text, match",
    [
        ("site,lat\nA,1\n", DATA_OK, "lon"),
        ("site,lat,lon\nA,95,0\nB,1,1\n", DATA_OK, "lat"),
        ("site,lat,lon\nA,1,200\nB,1,1\n", DATA_OK, "lon"),
        ("site,lat,lon\nA,1,1\nA,2,2\nB,1,1\n", DATA_OK, "twice"),
        ("site,lat,lon\nA,x,1\nB,1,1\n", DATA_OK, "lat"),
        (SITES_OK, "site,y,x1\nA,2,0.1\nA,0,0.1\n", "'y'"),
        (SITES_OK, "site,y,x1\nA,1,abc\nA,0,0.1\n", "x1"),
        (SITES_OK, "site,y,x1\nA,1,\nA,0,0.1\n", "missing"),
        (SITES_OK, "site,y\nA,1\nA,0\n", "feature"),
        (SITES_OK, "site,y,x1\nA,1,0.1\nA,0,0.1\nC,1,0.0\nC,0,1.0\n", "'C'"),
        (SITES_OK, "site,y,x1\nA,1,0.1\nA,1,0.2\n", "negatives"),
        ("", DATA_OK, "empty"),
    ],
)
def test_csv_validation(tmp_path, sites_text, data_text, match):
    with pytest.raises(InputError, match=match):
        load_csv(write(tmp_path, "d.csv", data_text), write(tmp_path, "s.csv", sites_text))


def test_csv_missing_file(tmp_path):
    with pytest.raises(InputError, match="not found"):
        read_sites(str(tmp_path / "nope.csv"))
    with pytest.raises(InputError, match="not found"):
        read_data(str(tmp_path / "nope.csv"))


def test_simulated_sites_at_counties():
    """``counties``: the sites are those counties, named by their codes, at the shipped
    centroids; each is in the mean group of the nearer of Los Angeles and New York (by a
    haversine distance computed here); a code not in the table names the field."""
    import pandas as pd

    from grauc_flower.data import GROUP_CENTRES, mean_shift, site_means
    from strategies.datasets import dataset_path

    codes = ["06037", "17031", "48113", "36059", "53033", "12086"]
    table = pd.read_csv(dataset_path("us_county_centroids.csv"), dtype={"county_fips": str})
    table = table.set_index("county_fips")
    sites = simulate(1, n_sites=99, n_features=3, n_train=40, level=2, seed=4, counties=codes)
    assert [s.site for s in sites] == codes
    means = site_means(1, n_features=3, level=2, seed=4, counties=",".join(codes))

    def haversine(a, b):
        (la1, lo1), (la2, lo2) = np.radians(a), np.radians(b)
        h = np.sin((la2 - la1) / 2) ** 2 + np.cos(la1) * np.cos(la2) * np.sin((lo2 - lo1) / 2) ** 2
        return 2 * 6371.0 * np.arcsin(np.sqrt(h))

    for s, mu in zip(sites, means, strict=True):
        assert (s.lat, s.lon) == (table.at[s.site, "lat"], table.at[s.site, "lon"])
        group = int(np.argmin([haversine((s.lat, s.lon), c) for c in GROUP_CENTRES]))
        assert_allclose(mu, mean_shift(2, group, 3))
    west = [s.site for s, mu in zip(sites, means, strict=True) if np.allclose(mu, means[0])]
    assert west == ["06037", "48113", "53033"]  # Los Angeles, Dallas, Seattle's King
    with pytest.raises(InputError, match="data.counties: 99999 is not a county FIPS code"):
        simulate(1, counties=["06037", "99999"])
