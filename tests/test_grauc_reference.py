"""GrAUC-PFL end to end against a central convex solver.

The objective of docs/methods.md 1.1 is written here from scratch in cvxpy (``cp.logistic`` on the
matrix of pair differences, the ridge, and ``lam * sum_e w_e ||beta_u - beta_v||``) with the
graph and weights of §1.2 rebuilt independently (geopy distances, scipy's MST, the median
heuristic).  The federation runs through the in-process engine (the real Strategy and
NumPyClient objects, Flower's serialization); our objective is recomputed here from the
returned coefficients, never read from the method's history.
"""

from __future__ import annotations

import itertools

import cvxpy as cp
import numpy as np
import pytest
from geopy.distance import geodesic
from numpy.testing import assert_allclose, assert_array_equal
from scipy.sparse.csgraph import minimum_spanning_tree
from scipy.special import expit

from grauc_flower.data import SiteData
from grauc_flower.federation import run_methods_inprocess
from strategies.config import GrAUCConfig

Z, P = 5, 3
LAM, RIDGE, W_DIST, Q = 0.05, 1e-3, 1.0, 0.01
GAP = 1e-6


def make_sites(seed=0, z=Z, p=P, scales=None):
    """Small sites, two groups of score directions, random locations in the US.

    ``scales`` multiplies the feature columns (the same draws otherwise): unequal scales make
    the linearized solver slow, so they are used only where standardization is tested.
    """
    rng = np.random.default_rng(seed)
    directions = np.array([[1.2, 0.8, 0.0], [0.0, 0.8, 1.2]])[:, :p]
    sites = []
    for k in range(z):
        n = int(rng.integers(20, 41))
        y = (rng.random(n) < 0.35).astype(np.int64)
        y[:4], y[4:8] = 1, 0  # at least four of each class
        mu = directions[k % 2] + 0.3 * rng.standard_normal(p)
        x = rng.standard_normal((n, p)) + np.outer(y, mu) + 0.5  # an offset: not centred
        if scales is not None:
            x = x * np.asarray(scales)
        sites.append(
            SiteData(
                site=f"site{k}",
                lat=float(rng.uniform(26, 48)),
                lon=float(rng.uniform(-122, -70)),
                x_train=x,
                y_train=y,
                x_test=x[:0],
                y_test=y[:0],
            )
        )
    return sites


SITES = make_sites()
SCALES = np.array([1.0, 3.0, 0.5])[:P]
SITES_SCALED = make_sites(scales=SCALES)


# ---------------------------------------------------------------------------------------
# the reference: docs/methods.md 1.1 and docs/methods.md 1.2 written independently
# ---------------------------------------------------------------------------------------
def pair_matrix(x, y):
    xp, xn = x[y == 1], x[y == 0]
    return (xp[:, None, :] - xn[None, :, :]).reshape(-1, x.shape[1])


def f_numpy(d, b, ridge):
    return float(np.mean(np.logaddexp(0.0, -d @ b)) + 0.5 * ridge * b @ b)


def f_cvxpy(d, b, ridge):
    return cp.sum(cp.logistic(-d @ b)) / d.shape[0] + 0.5 * ridge * cp.sum_squares(b)


def mst_graph(sites, w_dist=W_DIST, q=Q):
    """Edges ``(u, v)`` with ``u < v`` and weights ``max(exp(-w d^2 / H), q)``."""
    z = len(sites)
    dist = np.zeros((z, z))
    for u, v in itertools.combinations(range(z), 2):
        a, b = sites[u], sites[v]
        dist[u, v] = dist[v, u] = geodesic((a.lat, a.lon), (b.lat, b.lon)).km
    tree = minimum_spanning_tree(np.triu(dist)).tocoo()
    edges = np.sort(np.column_stack([tree.row, tree.col]), axis=1)
    edges = edges[np.lexsort((edges[:, 1], edges[:, 0]))]
    h = np.median(dist[np.triu_indices(z, 1)] ** 2)
    w = np.maximum(np.exp(-w_dist * dist[edges[:, 0], edges[:, 1]] ** 2 / h), q)
    return edges, w


def standardized(sites):
    """Pooled mean and SD (ddof 1) of every training row, and the standardized copies."""
    x = np.vstack([s.x_train for s in sites])
    center, scale = x.mean(axis=0), x.std(axis=0, ddof=1)
    return [(s.x_train - center) / scale for s in sites], scale


def penalty_numpy(beta, edges, w, lam, penalty):
    diff = beta[edges[:, 0]] - beta[edges[:, 1]]
    norms = np.abs(diff).sum(axis=1) if penalty == "l1" else np.linalg.norm(diff, axis=1)
    return lam * float(w @ norms)


def objective(beta, ds, edges, w, lam, ridge, penalty):
    """F(beta) of docs/methods.md 1.1."""
    loss = sum(f_numpy(d, b, ridge) for d, b in zip(ds, beta, strict=True))
    return loss + penalty_numpy(beta, edges, w, lam, penalty)


def solve(problem, **extra):
    """Clarabel to 1e-11 (``extra``: its options, e.g. a smaller static regularization,
    which the weighted problems need to end ``optimal`` rather than ``optimal_inaccurate``)."""
    problem.solve(solver="CLARABEL", tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11, **extra)
    assert problem.status == "optimal"


def cvxpy_grauc(ds, edges, w, lam, ridge, penalty):
    b = cp.Variable((len(ds), ds[0].shape[1]))
    loss = sum(f_cvxpy(d, b[k], ridge) for k, d in enumerate(ds))
    norm = (lambda v: cp.norm1(v)) if penalty == "l1" else (lambda v: cp.norm(v, 2))
    pen = sum(w[e] * norm(b[u] - b[v]) for e, (u, v) in enumerate(edges))
    solve(cp.Problem(cp.Minimize(loss + lam * pen)))
    return b.value


def cvxpy_shared(ds, ridge, weights=None):
    """``argmin_b sum_z weight_z f_z(b)``: one coefficient vector for all sites."""
    weights = np.ones(len(ds)) if weights is None else weights
    b = cp.Variable(ds[0].shape[1])
    solve(
        cp.Problem(
            cp.Minimize(sum(c * f_cvxpy(d, b, ridge) for c, d in zip(weights, ds, strict=True)))
        )
    )
    return b.value


def cvxpy_single(d, ridge):
    b = cp.Variable(d.shape[1])
    solve(cp.Problem(cp.Minimize(f_cvxpy(d, b, ridge))))
    return b.value


def run(methods, sites=SITES, **kw):
    """In-process fit on the features as given (the references are on that scale) unless
    ``standardize`` is passed; ``tol`` 1e-9 for ADMM's residuals, 1e-12 for pqn's relative
    gap (coefficients to about 1e-6)."""
    tol = 1e-9 if kw.get("algorithm") == "admm" else 1e-12
    base = {"lam": LAM, "ridge": RIDGE, "tol": tol, "max_rounds": 5000, "standardize": "none"}
    cfg = GrAUCConfig(**{**base, **kw})
    return run_methods_inprocess(cfg, sites, methods)


def site_pairs(sites, xs=None):
    xs = [s.x_train for s in sites] if xs is None else xs
    return [pair_matrix(x, s.y_train) for x, s in zip(xs, sites, strict=True)]


# ---------------------------------------------------------------------------------------
# the whole algorithm vs cvxpy
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def graph():
    return mst_graph(SITES)


@pytest.fixture(scope="module")
def references(graph):
    """cvxpy optima: on the raw features of ``SITES`` and on the standardized features of
    ``SITES_SCALED`` (pooled mean and SD of all training rows)."""
    edges, w = graph
    xs_std, scale = standardized(SITES_SCALED)
    out = {}
    for std, ds in (("none", site_pairs(SITES)), ("federated", site_pairs(SITES_SCALED, xs_std))):
        for penalty in ("l1", "group"):
            beta = cvxpy_grauc(ds, edges, w, LAM, RIDGE, penalty)
            out[std, penalty] = (ds, beta, objective(beta, ds, edges, w, LAM, RIDGE, penalty))
    return out, scale


def test_reference_problem_is_not_trivial(graph, references):
    """The chosen lam fuses some edges and coordinates but not all (else the test is weak)."""
    edges, w = graph
    refs, scale = references
    for std in ("none", "federated"):
        _, beta, _ = refs[std, "l1"]
        diff = np.abs(beta[edges[:, 0]] - beta[edges[:, 1]])
        assert np.sum(diff < 1e-6) >= 1
        assert np.sum(diff > 1e-3) >= 1
    assert np.all(w >= Q) and np.ptp(w) > 0.1
    assert np.ptp(scale) > 1.0  # standardization changes the problem


@pytest.mark.parametrize("standardize", ["none", "federated"])
@pytest.mark.parametrize("penalty", ["l1", "group"])
@pytest.mark.parametrize("solver", ["pqn", "prox", "linearized"])
def test_grauc_matches_cvxpy(graph, references, solver, penalty, standardize):
    edges, w = graph
    refs, scale = references
    ds, beta_ref, f_ref = refs[standardize, penalty]
    sites = SITES_SCALED if standardize == "federated" else SITES
    algo = (
        {"algorithm": "pqn"} if solver == "pqn" else {"algorithm": "admm", "local_solver": solver}
    )
    res = run(["grauc"], sites=sites, penalty=penalty, standardize=standardize, **algo)["grauc"]
    assert res.sites == [s.site for s in sites]
    assert_array_equal(res.extra["graph"].edges, edges)
    assert_allclose(res.extra["weights"], w, rtol=1e-10)
    if standardize == "federated":  # coefficients on the input scale = beta_std / scale
        beta = res.coefficients * scale
        assert_allclose(res.extra["beta_std"], beta, rtol=1e-12)
    else:
        beta = res.coefficients
    f_ours = objective(beta, ds, edges, w, LAM, RIDGE, penalty)
    gap = (f_ours - f_ref) / abs(f_ref)
    assert -GAP <= gap <= GAP, gap
    assert_allclose(beta, beta_ref, atol=2e-3)


def test_default_fit_standardizes_and_reports_the_input_scale(references):
    """With ``standardize`` left at its default the fit is cvxpy's optimum on the pooled
    standardized features, written out on the input scale (beta_std / scale)."""
    refs, scale = references
    _, beta_ref, _ = refs["federated", "l1"]
    cfg = GrAUCConfig(lam=LAM, ridge=RIDGE, tol=1e-12, max_rounds=5000)
    assert cfg.standardize == "federated"
    res = run_methods_inprocess(cfg, SITES_SCALED, ["grauc"])["grauc"]
    assert_allclose(res.coefficients * scale, beta_ref, atol=2e-3)
    assert np.max(np.abs(res.coefficients - beta_ref)) > 0.1  # the scale matters here


def test_grauc_without_ridge(graph):
    """eta = 0 is the paper's objective; it must work when every site's data overlap."""
    edges, w = graph
    ds = site_pairs(SITES)
    beta_ref = cvxpy_grauc(ds, edges, w, LAM, 0.0, "l1")
    f_ref = objective(beta_ref, ds, edges, w, LAM, 0.0, "l1")
    res = run(["grauc"], ridge=0.0)["grauc"]
    f_ours = objective(res.coefficients, ds, edges, w, LAM, 0.0, "l1")
    assert abs(f_ours - f_ref) / abs(f_ref) <= GAP


# ---------------------------------------------------------------------------------------
# limiting cases
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def individual_refs():
    return np.array([cvxpy_single(d, RIDGE) for d in site_pairs(SITES)])


def test_lambda_zero_equals_individual_fits(individual_refs):
    res = run(["grauc", "individual"], lam=0.0)
    assert_allclose(res["grauc"].coefficients, individual_refs, atol=1e-5)
    assert_allclose(res["grauc"].coefficients, res["individual"].coefficients, atol=1e-5)


def test_individual_is_per_site_argmin(individual_refs):
    res = run(["individual"])["individual"]
    assert res.converged
    assert_allclose(res.coefficients, individual_refs, atol=1e-6)
    ds = site_pairs(SITES)
    for d, b, b_ref in zip(ds, res.coefficients, individual_refs, strict=True):
        assert f_numpy(d, b, RIDGE) <= f_numpy(d, b_ref, RIDGE) + 1e-10


@pytest.mark.parametrize("penalty", ["l1", "group"])
def test_huge_lambda_fuses_all_sites(penalty):
    ds = site_pairs(SITES)
    shared = cvxpy_shared(ds, RIDGE)
    res = run(["grauc"], lam=1e4, penalty=penalty, rho=0.3)["grauc"]
    beta = res.coefficients
    assert np.ptp(beta, axis=0).max() < 1e-6
    assert_allclose(beta, np.tile(shared, (Z, 1)), atol=1e-5)
    assert np.all(res.extra["clusters"] == 0)  # one fused group per coordinate


def test_single_site_is_its_individual_fit(individual_refs):
    """One institution: no edges, no penalty; GrAUC-PFL is the site's own fit."""
    res = run(["grauc"], sites=SITES[:1])["grauc"]
    assert res.converged
    assert_allclose(res.coefficients, individual_refs[:1], atol=1e-6)


def test_pooled_equals_all_pairs_pooled():
    x = np.vstack([s.x_train for s in SITES])
    y = np.concatenate([s.y_train for s in SITES])
    ref = cvxpy_single(pair_matrix(x, y), RIDGE)
    res = run(["pooled"])["pooled"]
    assert_allclose(res.coefficients, np.tile(ref, (Z, 1)), atol=1e-6)
    # pooling pairs across sites is not the sum over sites of the site surrogates
    assert np.max(np.abs(ref - cvxpy_shared(site_pairs(SITES), RIDGE))) > 1e-3


def test_pooled_standardized():
    xs, scale = standardized(SITES)
    y = np.concatenate([s.y_train for s in SITES])
    ref = cvxpy_single(pair_matrix(np.vstack(xs), y), RIDGE)
    res = run(["pooled"], standardize="federated")["pooled"]
    assert_allclose(res.coefficients * scale, np.tile(ref, (Z, 1)), atol=1e-6)


def test_fedavg_converges_to_weighted_shared_minimizer():
    """One local gradient step of a fixed size per round is gradient descent on
    ``sum_z (N_z / N) f_z``: FedAvg must reach ``argmin sum_z N_z f_z``."""
    ridge = 0.05  # well conditioned, so a few hundred rounds suffice
    ds = site_pairs(SITES)
    sizes = np.array([len(s.y_train) for s in SITES], dtype=float)
    ref = cvxpy_shared(ds, ridge, sizes / sizes.sum())
    res = run(["fedavg"], ridge=ridge, fedavg_local_steps=1, fedavg_lr=0.5, fedavg_rounds=1500)[
        "fedavg"
    ]
    assert_allclose(res.coefficients, np.tile(ref, (Z, 1)), atol=1e-6)
    # and that is not the unweighted minimizer (the sites have different sizes)
    assert np.max(np.abs(ref - cvxpy_shared(ds, ridge))) > 1e-4


def grad_numpy(d, b, ridge):
    return -(d.T @ expit(-(d @ b))) / d.shape[0] + ridge * b


@pytest.mark.parametrize(
    "methods",
    [
        ["fedavg"],
        ["individual", "fedavg"],
    ],
)
def test_fedavg_one_step_is_gradient_descent_on_standardized_data(methods):
    """With one local step of size lr, a FedAvg round is
    ``beta <- beta - lr sum_z (N_z / N) grad f_z(beta)`` on the standardized features,
    whichever methods ran before it."""
    ridge, lr, rounds = 0.05, 0.3, 25
    xs, scale = standardized(SITES_SCALED)
    ds = site_pairs(SITES_SCALED, xs)
    sizes = np.array([len(s.y_train) for s in SITES_SCALED], dtype=float)
    beta = np.zeros(P)
    for _ in range(rounds):
        beta = beta - lr * sum(
            n / sizes.sum() * grad_numpy(d, beta, ridge) for n, d in zip(sizes, ds, strict=True)
        )
    res = run(
        methods,
        sites=SITES_SCALED,
        ridge=ridge,
        standardize="federated",
        fedavg_local_steps=1,
        fedavg_lr=lr,
        fedavg_rounds=rounds,
    )["fedavg"]
    assert_allclose(res.coefficients * scale, np.tile(beta, (Z, 1)), rtol=1e-9)


# ---------------------------------------------------------------------------------------
# mean-fusion: the same penalty toward the federation's mean (docs/methods.md 3.10)
# ---------------------------------------------------------------------------------------
def mean_objective(beta, ds, lam, ridge, penalty):
    loss = sum(f_numpy(d, b, ridge) for d, b in zip(ds, beta, strict=True))
    dev = beta - beta.mean(axis=0)
    pen = np.abs(dev).sum() if penalty == "l1" else np.linalg.norm(dev, axis=1).sum()
    return loss + lam * pen


@pytest.mark.parametrize("penalty", ["l1", "group"])
@pytest.mark.parametrize("algorithm", ["pqn", "admm"])
def test_mean_fusion_matches_cvxpy(penalty, algorithm):
    """``sum_z f_z(b_z) + lam sum_z ||b_z - mean(b)||`` (cvxpy) at a level where part of
    the sites are pulled onto the mean; the fused groups are the sites at the mean."""
    ds = site_pairs(SITES)
    lam = 0.05 if penalty == "l1" else 0.35
    b = cp.Variable((len(ds), P))
    loss = sum(f_cvxpy(d, b[k], RIDGE) for k, d in enumerate(ds))
    dev = b - cp.sum(b, axis=0, keepdims=True) / len(ds)
    pen = cp.sum(cp.abs(dev)) if penalty == "l1" else cp.sum(cp.norm(dev, 2, axis=1))
    solve(cp.Problem(cp.Minimize(loss + lam * pen)))
    f_ref = mean_objective(b.value, ds, lam, RIDGE, penalty)
    res = run(["mean-fusion"], lam=lam, penalty=penalty, algorithm=algorithm)["mean-fusion"]
    f_ours = mean_objective(res.coefficients, ds, lam, RIDGE, penalty)
    assert -GAP <= (f_ours - f_ref) / abs(f_ref) <= GAP
    assert_allclose(res.coefficients, b.value, atol=2e-3)
    # the sites the reference puts at the mean share one cluster, the others stand alone
    at_mean = np.abs(b.value - b.value.mean(axis=0)) < 1e-5  # (Z, P)
    for k in range(P):
        if penalty == "group":
            at_mean[:, k] = np.all(at_mean, axis=1)
        labels = res.extra["clusters"][:, k]
        on = labels[at_mean[:, k]]
        assert len(set(on)) <= 1
        assert len(set(labels[~at_mean[:, k]])) == int((~at_mean[:, k]).sum())
        assert not set(on) & set(labels[~at_mean[:, k]])
    assert at_mean.any() and not at_mean.all()  # a level that does something


def test_mean_fusion_lam_max_is_where_the_sites_meet():
    """lam_max of the fusion toward the mean (L1, exact): cvxpy's solution at 1.01 lam_max
    gives every site the same coefficients, at 0.97 lam_max it does not."""
    from grauc_flower.tuning import lam_maxes_mean

    ds = site_pairs(SITES)
    top = lam_maxes_mean(SITES, GrAUCConfig(ridge=RIDGE, standardize="none"), (RIDGE,))[RIDGE]
    spreads = []
    for factor in (1.01, 0.97):
        b = cp.Variable((len(ds), P))
        loss = sum(f_cvxpy(d, b[k], RIDGE) for k, d in enumerate(ds))
        dev = b - cp.sum(b, axis=0, keepdims=True) / len(ds)
        solve(cp.Problem(cp.Minimize(loss + factor * top * cp.sum(cp.abs(dev)))))
        spreads.append(np.ptp(b.value, axis=0).max())
    assert spreads[0] < 1e-6 < 1e-4 < spreads[1]


# ---------------------------------------------------------------------------------------
# size-power = 1: each site's whole surrogate weighted by Z n_z / sum n (docs 3.11)
# ---------------------------------------------------------------------------------------
def row_weights(sites, power=1.0):
    n = np.array([len(s.y_train) for s in sites], dtype=float)
    return len(sites) * n**power / np.sum(n**power)


def weighted_objective(beta, ds, omega, edges, w, lam, ridge, penalty):
    loss = sum(c * f_numpy(d, b, ridge) for c, d, b in zip(omega, ds, beta, strict=True))
    return loss + penalty_numpy(beta, edges, w, lam, penalty)


@pytest.mark.parametrize(
    ("penalty", "algorithm", "power"),
    [("l1", "pqn", 1.0), ("l1", "admm", 1.0), ("group", "pqn", 1.0), ("l1", "pqn", 0.5)],
)
def test_rows_weighting_matches_cvxpy(graph, penalty, algorithm, power):
    """``sum_z w_z f_z(beta_z) + lam sum_e w_e ||beta_u - beta_v||`` with the weights
    ``Z n_z^a / sum n^a`` computed here from the row counts; the fit differs from the
    equally weighted one."""
    edges, w = graph
    ds = site_pairs(SITES)
    omega = row_weights(SITES, power)
    assert np.ptp(omega) > 0.15 and abs(omega.mean() - 1) < 1e-12
    b = cp.Variable((Z, P))
    loss = sum(c * f_cvxpy(d, b[k], RIDGE) for k, (c, d) in enumerate(zip(omega, ds, strict=True)))
    norm = (lambda v: cp.norm1(v)) if penalty == "l1" else (lambda v: cp.norm(v, 2))
    pen = sum(w[e] * norm(b[u] - b[v]) for e, (u, v) in enumerate(edges))
    solve(cp.Problem(cp.Minimize(loss + LAM * pen)), static_regularization_constant=1e-9)
    f_ref = weighted_objective(b.value, ds, omega, edges, w, LAM, RIDGE, penalty)
    res = run(["grauc"], penalty=penalty, algorithm=algorithm, size_power=power)["grauc"]
    f_ours = weighted_objective(res.coefficients, ds, omega, edges, w, LAM, RIDGE, penalty)
    assert -GAP <= (f_ours - f_ref) / abs(f_ref) <= GAP
    assert_allclose(res.coefficients, b.value, atol=2e-3)
    equal = cvxpy_grauc(ds, edges, w, LAM, RIDGE, penalty)
    assert np.max(np.abs(equal - b.value)) > 1e-2  # the weighting changes the answer


def test_rows_weighting_keeps_both_ends_of_the_path(graph, individual_refs):
    """lam = 0: each site's own fit (its weight scales its whole objective); at the top of
    the path (1.01 lam_max, from :func:`lam_max_of` with the weights) cvxpy's weighted
    solution gives every site the row-weighted shared fit, at 0.97 lam_max it does not."""
    from grauc_flower.tuning import lam_max_of

    res = run(["grauc"], lam=0.0, size_power=1.0)["grauc"]
    assert_allclose(res.coefficients, individual_refs, atol=1e-5)
    edges, w = graph
    ds = site_pairs(SITES)
    omega = row_weights(SITES)
    cfg = GrAUCConfig(ridge=RIDGE, w_dist=W_DIST, q=Q, size_power=1.0, standardize="none")
    top = lam_max_of(SITES, cfg)
    assert abs(top - lam_max_of(SITES, cfg.replace(size_power=0.0))) > 1e-3 * top
    shared = cvxpy_shared(ds, RIDGE, omega)
    spreads = []
    for factor in (1.01, 0.97):
        b = cp.Variable((Z, P))
        loss = sum(
            c * f_cvxpy(d, b[k], RIDGE) for k, (c, d) in enumerate(zip(omega, ds, strict=True))
        )
        pen = sum(w[e] * cp.norm1(b[u] - b[v]) for e, (u, v) in enumerate(edges))
        solve(
            cp.Problem(cp.Minimize(loss + factor * top * pen)),
            static_regularization_constant=1e-9,
        )
        spreads.append(np.ptp(b.value, axis=0).max())
        if factor > 1:
            assert_allclose(b.value, np.tile(shared, (Z, 1)), atol=1e-5)
    assert spreads[0] < 1e-6 < 1e-4 < spreads[1]
