"""The pair sums on the score grid (strategies/solvers/pairsum.py) against the pair loop.

The reference is the sum over every (positive, negative) pair, written here from the
kernels' definitions (docs/methods.md 1.1, 1.12): the grid must agree with it to 1e-10
relative on random score layouts and on adversarial ones, and the datafit's value, gradient,
Hessian and Hájek covariance on the grid must agree with the exact datafit's.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.optimize as so
from scipy.special import expit

import grauc_flower.datafit as datafit
from grauc_flower.data import SiteData
from grauc_flower.datafit import PairwiseLogistic, local_fit
from grauc_flower.federation import run_methods_inprocess
from strategies.config import GrAUCConfig
from strategies.solvers import pairsum

TOL = 1e-10


def brute(kernel: str, s_pos, s_neg, w_neg=None, w_pos=None):
    """The pair loop: ``K(t_ij)`` for every pair from the kernels' definitions."""
    t = s_pos[:, None] - s_neg[None, :]
    if kernel == "sigmoid":
        k = 1.0 / (1.0 + np.exp(np.clip(t, -700, 700)))
    elif kernel == "curvature":
        k = expit(t) * expit(-t)
    else:  # log(1 + e^-t) + t sigma(-t)
        k = np.logaddexp(0.0, -t) + t * expit(-t)
    at_pos = k @ (np.ones(len(s_neg)) if w_neg is None else w_neg)
    at_neg = k.T @ (np.ones(len(s_pos)) if w_pos is None else w_pos)
    return at_pos, at_neg, k


#: The absolute floor of a grid sum, per pair and per unit of the kernel's peak: the FFT's
#: rounding, which matters only where every pair's kernel is far below its peak.
FLOOR = 1e-12
PEAK = {"sigmoid": 1.0, "curvature": 0.25, "value": np.log(2.0)}


def close(got, want, kernel, pairs, weights=1.0) -> bool:
    """Within ``TOL`` relative, or within the absolute floor of ``pairs`` pairs."""
    err = np.linalg.norm(np.asarray(got, dtype=float) - want)
    return err <= TOL * np.linalg.norm(want) + FLOOR * pairs * PEAK[kernel] * weights


def rel(a, b) -> float:
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    scale = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / scale) if scale > 0 else float(np.linalg.norm(a))


def layouts():
    rng = np.random.default_rng(11)
    yield "normal", rng.normal(1.0, 2.0, 400), rng.normal(0.0, 2.0, 1500)
    yield "all equal", np.full(40, 3.0), np.full(90, 3.0)
    yield (
        "two far clusters",
        np.r_[rng.normal(-400, 1, 100), rng.normal(400, 1, 150)],
        np.r_[rng.normal(-401, 1, 500), rng.normal(399, 1, 300)],
    )
    yield "span 1e3", rng.uniform(-1000, 1000, 500), rng.uniform(-1000, 1000, 1800)
    yield "heavy ties", rng.integers(0, 4, 600) * 0.7, rng.integers(0, 4, 900) * 0.7
    yield "one positive", np.array([0.3]), rng.normal(0, 1, 700)
    yield "one negative", rng.normal(0, 1, 700), np.array([-0.2])
    yield "misranked", rng.normal(-30, 1, 300), rng.normal(30, 1, 300)
    # gaps far wider than the kernels' reach: the grid is laid on shortened gaps
    yield (
        "gaps of 1e5",
        np.r_[rng.normal(0, 1, 100), rng.normal(1e5, 1, 100), rng.normal(3e5, 2, 50)],
        np.r_[rng.normal(0.5, 1, 300), rng.normal(1e5 - 1, 1, 200), rng.normal(2e5, 1, 80)],
    )


@pytest.mark.parametrize("case", list(layouts()), ids=lambda c: c[0])
@pytest.mark.parametrize("kernel", sorted(pairsum.KERNELS))
def test_kernel_sums_match_the_pair_loop(case, kernel):
    _, s_pos, s_neg = case
    rng = np.random.default_rng(3)
    w_neg = rng.normal(size=(s_neg.size, 3))
    w_pos = rng.normal(size=(s_pos.size, 3))
    grid = pairsum.ScoreGrid(s_pos, s_neg)
    n, m = s_pos.size, s_neg.size
    w = float(max(np.abs(w_neg).max(), np.abs(w_pos).max()))
    at_pos, at_neg, k = brute(kernel, s_pos, s_neg)
    assert close(grid.at_pos(kernel), at_pos, kernel, m)
    assert close(grid.at_neg(kernel), at_neg, kernel, n)
    vp, vn, _ = brute(kernel, s_pos, s_neg, w_neg, w_pos)
    assert close(grid.at_pos(kernel, w_neg), vp, kernel, m, w)
    assert close(grid.at_neg(kernel, w_pos), vn, kernel, n, w)
    assert close(grid.total(kernel), k.sum(), kernel, n * m)
    assert close(grid.total(kernel, w_pos, w_neg), w_pos.T @ k @ w_neg, kernel, n * m, w * w)


def test_far_gaps_are_shortened_and_near_ones_kept():
    scores = np.array([5.0, 1e6, 0.0, 1e6 + 3.0, 2.5e6, 30.0])
    out = pairsum.compressed(scores)
    order = np.argsort(scores)
    steps = np.diff(out[order])
    assert np.allclose(steps, np.minimum(np.diff(scores[order]), pairsum.GAP))
    assert out.max() < 5 * pairsum.GAP  # a grid of a few thousand nodes, not 2.5e7


def test_the_kernels_are_flat_beyond_the_gap():
    t = np.array([pairsum.GAP, 10 * pairsum.GAP])
    for name, kernel in pairsum.KERNELS.items():
        limit_pos = kernel(np.array([1e6]))
        limit_neg = kernel(np.array([-1e6]))
        assert np.all(np.abs(kernel(t) - limit_pos) < 1e-20), name
        assert np.all(np.abs(kernel(-t) - limit_neg) < 1e-20), name


def test_lagrange_weights_reproduce_polynomials():
    q = pairsum.NODES
    y = np.linspace(q / 2 - 1, q / 2, 7, endpoint=False)
    w = pairsum._lagrange(y, q)
    nodes = np.arange(q, dtype=float)
    for degree in range(q):
        assert np.allclose(w.T @ nodes**degree, y**degree, rtol=1e-12, atol=1e-12)


def test_too_wide_a_grid_is_refused(monkeypatch):
    monkeypatch.setattr(pairsum, "GRID_MAX", 1000)
    s = np.linspace(0, 500, 50)  # gaps of about 10: nothing to shorten, 5,000 nodes
    assert pairsum.score_grid(s, s + 0.1) is None
    with pytest.raises(pairsum.GridTooLarge):
        pairsum.ScoreGrid(s, s + 0.1)


# ---------------------------------------------------------------------------------------
# the datafit on the grid against the exact datafit
# ---------------------------------------------------------------------------------------
def site(n, m, p, seed, offset=0.0, scale=1.0):
    rng = np.random.default_rng(seed)
    xp = rng.normal(0.4, 1.0, (n, p)) * scale + offset
    xn = rng.normal(0.0, 1.0, (m, p)) * scale + offset
    return xp, xn


SITES = {
    "standard": (site(300, 900, 5, 0), 0.8),
    "offset and scales": (site(200, 700, 4, 1, offset=1e3, scale=np.array([1, 10, 0.1, 3])), 0.3),
    "one positive": (site(1, 600, 3, 2), 1.0),
    "large scores": (site(150, 400, 3, 3, scale=200.0), 1.0),
}


@pytest.mark.parametrize("name", sorted(SITES))
def test_datafit_on_the_grid_matches_the_exact_one(name):
    (xp, xn), size = SITES[name]
    rng = np.random.default_rng(5)
    b = size * rng.normal(size=xp.shape[1])
    # the surrogate depends on the rows only through x+_i - x-_j: the exact reference on
    # rows centred here, so that offsets do not cost the reference its own digits
    mean = np.vstack([xp, xn]).mean(axis=0)
    exact = PairwiseLogistic(xp - mean, xn - mean, eta=0.01, weight=1.7, pairs="exact")
    grid = PairwiseLogistic(xp, xn, eta=0.01, weight=1.7, pairs="grid")
    assert grid.uses_grid() and not exact.uses_grid()
    v_e, g_e = exact.value_and_grad(b)
    v_g, g_g = grid.value_and_grad(b)
    assert abs(v_g - v_e) <= TOL * abs(v_e)
    assert rel(g_g, g_e) <= TOL
    assert rel(grid.hessian(b), exact.hessian(b)) <= TOL
    assert rel(grid.hajek(b), exact.hajek(b)) <= TOL


def test_grid_gradient_and_hessian_are_derivatives():
    (xp, xn), _ = SITES["standard"]
    f = PairwiseLogistic(xp, xn, eta=0.0, pairs="grid")
    b0 = np.random.default_rng(2).normal(size=xp.shape[1])
    assert so.check_grad(f.value, f.grad, b0) <= 1e-6 * np.linalg.norm(f.grad(b0))
    num = so.approx_fprime(b0, f.grad, 1e-6)
    assert np.allclose(num, f.hessian(b0), rtol=1e-4, atol=1e-6)


def test_value_of_a_perfectly_ranked_site_stays_positive_and_small():
    xp, xn = site(300, 300, 1, 4)
    xp, xn = xp + 40.0, xn - 40.0  # every pair ranked right by a margin of about 80
    b = np.ones(1)
    f = PairwiseLogistic(xp, xn, pairs="grid")
    exact = np.mean(np.logaddexp(0, -(xp @ b)[:, None] + (xn @ b)[None, :]))
    # the exact value is about e^-80: the grid's absolute error stays at rounding level
    assert exact < 1e-30
    assert abs(f.value(b)) < 1e-13


def test_auto_takes_the_grid_above_the_crossover_only():
    small = PairwiseLogistic(*site(100, 200, 2, 0))
    large = PairwiseLogistic(*site(300, 300, 2, 0))
    assert small.n_pos * small.n_neg <= datafit.GRID_PAIRS < large.n_pos * large.n_neg
    assert not small.uses_grid() and large.uses_grid()
    assert not PairwiseLogistic(*site(300, 300, 2, 0), pairs="exact").uses_grid()
    with pytest.raises(ValueError, match="pairs"):
        PairwiseLogistic(*site(3, 3, 2, 0), pairs="fast")


def test_a_wide_site_falls_back_to_the_pair_loop(monkeypatch):
    monkeypatch.setattr(pairsum, "GRID_MAX", 64)
    (xp, xn), _ = SITES["standard"]
    b = np.full(xp.shape[1], 0.5)
    grid = PairwiseLogistic(xp, xn, pairs="grid")
    exact = PairwiseLogistic(xp, xn, pairs="exact")
    assert grid.value_and_grad(b)[0] == exact.value_and_grad(b)[0]
    assert np.array_equal(grid.hessian(b), exact.hessian(b))


def test_newton_on_the_grid_ends_at_the_exact_minimum():
    xp, xn = site(900, 2600, 6, 7)
    exact = PairwiseLogistic(xp, xn, eta=1e-3, pairs="exact")
    grid = PairwiseLogistic(xp, xn, eta=1e-3, pairs="grid")
    b_e, b_g = local_fit(exact), local_fit(grid)
    assert abs(exact.value(b_g) - exact.value(b_e)) <= 1e-12 * abs(exact.value(b_e))
    assert np.linalg.norm(exact.grad(b_g)) <= 1e-9


def mid_size_sites(seed=0, z=4, p=4):
    rng = np.random.default_rng(seed)
    out = []
    for k in range(z):
        n = int(rng.integers(2500, 4000))
        y = (rng.random(n) < 0.2).astype(np.int64)
        x = rng.standard_normal((n, p)) + np.outer(y, [0.8, 0.4 * (k % 2), 0.0, -0.3][:p])
        out.append(
            SiteData(
                site=f"s{k}",
                lat=float(rng.uniform(30, 45)),
                lon=float(rng.uniform(-120, -75)),
                x_train=x,
                y_train=y,
                x_test=x[:0],
                y_test=y[:0],
            )
        )
    return out


def test_federated_fit_on_the_grid_ends_at_the_exact_paths_objective(monkeypatch):
    sites = mid_size_sites()
    assert all(np.sum(s.y_train) * np.sum(1 - s.y_train) > datafit.GRID_PAIRS for s in sites)
    cfg = GrAUCConfig(lam=0.05, tol=1e-12, max_rounds=200)
    fast = run_methods_inprocess(cfg, sites, ["grauc"])["grauc"]
    monkeypatch.setattr(datafit, "GRID_PAIRS", 1 << 62)
    exact = run_methods_inprocess(cfg, sites, ["grauc"])["grauc"]
    f_fast = fast.history[-1]["objective"]
    f_exact = exact.history[-1]["objective"]
    assert abs(f_fast - f_exact) <= 1e-9 * abs(f_exact)
