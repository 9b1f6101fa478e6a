"""Penalties and thresholds (strategies/solvers/penalties.py) against hand formulas and brute force.

Each threshold is checked as what it claims to be, ``argmin_x (rho/2)||x - v||^2 +
P_lam(||x||)``, by minimizing over a fine grid (then a finer grid around the coarse
minimizer: the objective is strictly convex when the concavity condition holds).
"""

from __future__ import annotations

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal
from scipy.integrate import quad

from strategies.solvers.penalties import Penalty, soft_threshold

LAMS = (0.5, 1.3)
# rho values satisfying the concavity condition for the default iota (3 for MCP: rho > 1/3;
# 3.7 for SCAD: rho > 1/2.7)
RHOS = {"lasso": (0.3, 1.0, 2.5), "mcp": (0.4, 1.0, 2.5), "scad": (0.4, 1.0, 2.5)}
CASES = [(k, rho, lam) for k in ("lasso", "mcp", "scad") for rho in RHOS[k] for lam in LAMS]
GROUP_CASES = [(k, rho, LAMS[i % 2]) for k in RHOS for i, rho in enumerate(RHOS[k])]


def hand_value(kind: str, r: np.ndarray, lam: float, iota: float) -> np.ndarray:
    """Fan & Li (2001) SCAD, Zhang (2010) MCP, written independently of the module."""
    t = np.abs(np.asarray(r, dtype=float))
    if kind == "lasso":
        return lam * t
    if kind == "mcp":
        return np.where(t <= iota * lam, lam * t - t * t / (2 * iota), iota * lam**2 / 2)
    conds = [t <= lam, t <= iota * lam]
    vals = [lam * t, (2 * iota * lam * t - t * t - lam**2) / (2 * (iota - 1))]
    return np.select(conds, vals, default=lam**2 * (iota + 1) / 2)


def brute_scalar(kind, v, lam, rho, iota):
    """``argmin_s (rho/2)(s - v)^2 + P(|s|)`` for each ``v``, by grid then local refinement."""
    out = np.empty_like(v)
    coarse = np.arange(-6.0, 6.0 + 1e-9, 2e-4)
    pen = hand_value(kind, coarse, lam, iota)
    for i, vi in enumerate(v):
        s = coarse[np.argmin(0.5 * rho * (coarse - vi) ** 2 + pen)]
        fine = np.linspace(s - 2e-3, s + 2e-3, 20001)
        fine = np.append(fine, 0.0)  # the kink
        h = 0.5 * rho * (fine - vi) ** 2 + hand_value(kind, fine, lam, iota)
        out[i] = fine[np.argmin(h)]
    return out


def brute_group(kind, v, lam, rho, iota):
    """``argmin_x (rho/2)||x - v||^2 + P(||x||)`` over a 2-D grid, refined twice."""
    center, half, n = np.zeros(2), 5.0, 401
    for _ in range(4):
        axis = np.linspace(-half, half, n)
        gx, gy = np.meshgrid(center[0] + axis, center[1] + axis, indexing="ij")
        pts = np.vstack([np.column_stack([gx.ravel(), gy.ravel()]), np.zeros(2)])  # + kink
        norm = np.sqrt(np.sum(pts**2, axis=1))
        h = 0.5 * rho * np.sum((pts - v) ** 2, axis=1) + hand_value(kind, norm, lam, iota)
        center = pts[np.argmin(h)]
        half = 8 * (2 * half / (n - 1))
    return center


@pytest.mark.parametrize(("kind", "rho", "lam"), CASES)
def test_entrywise_threshold_vs_brute_force(kind, rho, lam):
    pen = Penalty(kind)
    iota = float(pen.concavity)
    v = np.concatenate(
        [
            np.linspace(-4.5, 4.5, 37),
            # region boundaries: lam/rho, lam (1 + 1/rho), iota lam
            np.array([lam / rho, lam * (1 + 1 / rho), min(iota * lam, 5.0)]),
        ]
    )
    got = pen.threshold(v, lam, rho, group=False)
    assert_allclose(got, brute_scalar(kind, v, lam, rho, iota), atol=2e-6)
    assert_allclose(pen.threshold_norm(np.abs(v), lam, rho), np.abs(got), atol=1e-15)


@pytest.mark.parametrize(("kind", "rho", "lam"), GROUP_CASES)
def test_group_threshold_vs_brute_force(kind, rho, lam):
    pen = Penalty(kind)
    iota = float(pen.concavity)
    directions = np.array([[0.6, -0.8], [-1.0, 0.0], [0.28, 0.96]])
    norms = np.array([0.3 * lam / rho, 1.5 * lam / rho, 1.2 * lam * (1 + 1 / rho), 2.5, 4.5])
    for d in directions:
        for r in norms:
            v = r * d
            got = pen.threshold(v, lam, rho, group=True)
            assert_allclose(got, brute_group(kind, v, lam, rho, iota), atol=1e-5)


def test_group_threshold_is_scalar_rule_on_norm():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 4)) * 2
    for kind in ("lasso", "mcp", "scad"):
        pen = Penalty(kind)
        norm = np.linalg.norm(x, axis=1, keepdims=True)
        expected = x / norm * pen.threshold_norm(norm, 0.7, 1.5)
        assert_allclose(pen.threshold(x, 0.7, 1.5, group=True), expected, atol=1e-15)


@pytest.mark.parametrize("kind", ["lasso", "mcp", "scad"])
@pytest.mark.parametrize("group", [False, True])
def test_threshold_at_exactly_zero(kind, group):
    pen = Penalty(kind)
    x = np.zeros((3, 4))
    x[1] = [0.0, 5.0, 0.0, 0.0]  # a live row next to zero rows
    lam = np.array([[0.5], [0.5], [0.0]])  # also lam = 0 on a zero row
    with np.errstate(all="raise"):
        out = pen.threshold(x, lam, 2.0, group)
    assert np.all(np.isfinite(out))
    assert_array_equal(out[[0, 2]], 0.0)
    assert_allclose(out[1], pen.threshold(x[1], 0.5, 2.0, group))
    assert pen.value(np.zeros((2, 3)), 0.5, group) == 0.0


def test_lasso_threshold_is_soft_threshold():
    v = np.linspace(-3, 3, 13)
    assert_allclose(Penalty("lasso").threshold(v, 1.0, 2.0, False), soft_threshold(v, 0.5))
    g = np.array([[3.0, 4.0]])  # norm 5 -> norm 4.5
    assert_allclose(Penalty("lasso").threshold(g, 1.0, 2.0, True), [[2.7, 3.6]])


def test_values_by_hand():
    mcp, scad, lasso = Penalty("mcp", 3.0), Penalty("scad", 3.7), Penalty("lasso")
    r = np.array([0.0, 0.5, 2.0, 5.0])
    assert_allclose(lasso.value_of_norm(r, 1.0), r)
    # MCP lam = 1, iota = 3: r - r^2/6 up to 3, then 3/2
    assert_allclose(mcp.value_of_norm(r, 1.0), [0.0, 0.5 - 0.25 / 6, 2 - 4 / 6, 1.5])
    # SCAD lam = 1, iota = 3.7: r; (7.4 r - r^2 - 1)/5.4; 4.7/2
    assert_allclose(scad.value_of_norm(r, 1.0), [0.0, 0.5, (14.8 - 4 - 1) / 5.4, 2.35])
    # entrywise vs group sums
    x = np.array([[3.0, -4.0], [0.0, 0.5]])
    assert_allclose(mcp.value(x, 1.0, group=True), 1.5 + (0.5 - 0.25 / 6))
    assert_allclose(mcp.value(x, 1.0, group=False), 1.5 + 1.5 + 0.0 + (0.5 - 0.25 / 6))
    # per-group lam broadcasts over groups
    assert_allclose(lasso.value(x, np.array([[1.0], [2.0]]), group=True), 5.0 + 1.0)


@pytest.mark.parametrize(("kind", "iota"), [("mcp", 3.0), ("mcp", 1.5), ("scad", 3.7)])
def test_values_are_integrals_of_the_derivative(kind, iota):
    """``P(r) = int_0^r P'(t) dt``, ``P' = (lam - t/iota)_+`` (MCP),
    ``lam 1{t <= lam} + (iota lam - t)_+/(iota - 1) 1{t > lam}`` (SCAD)."""
    lam, pen = 0.8, Penalty(kind, iota)

    def dp(t):
        if kind == "mcp":
            return max(lam - t / iota, 0.0)
        return lam if t <= lam else max(iota * lam - t, 0.0) / (iota - 1)

    for r in (0.1, 0.8, 1.7, 2.9, 6.0):
        integral = quad(dp, 0.0, r, points=[lam, iota * lam], limit=200)[0]
        assert_allclose(pen.value_of_norm(r, lam), integral, rtol=1e-10)


def test_thresholds_are_continuous():
    r = np.linspace(0.0, 8.0, 80001)
    for kind in ("lasso", "mcp", "scad"):
        s = Penalty(kind).threshold_norm(r, 1.1, 0.9)
        assert np.max(np.abs(np.diff(s))) < 1e-3
        assert np.all(np.diff(s) >= -1e-15)  # monotone


@pytest.mark.parametrize("iota", [1e9, np.inf])
def test_mcp_with_infinite_concavity_is_lasso(iota):
    mcp, lasso = Penalty("mcp", iota), Penalty("lasso")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 3)) * 3
    for group in (False, True):
        assert_allclose(
            mcp.threshold(x, 0.7, 1.3, group), lasso.threshold(x, 0.7, 1.3, group), atol=1e-8
        )
        assert_allclose(mcp.value(x, 0.7, group), lasso.value(x, 0.7, group), rtol=1e-8)


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_mcp_infinite_concavity_at_zero_lam():
    """MCP with iota = inf is the lasso; at lam = 0 both values are 0 (no inf * 0)."""
    assert_allclose(Penalty("mcp", np.inf).value_of_norm(np.array([0.0, 1.0]), 0.0), 0.0)


def test_check_rho():
    Penalty("lasso").check_rho(1e-6)  # never raises
    Penalty("mcp", 3.0).check_rho(0.34)
    with pytest.raises(ValueError, match="concavity"):
        Penalty("mcp", 3.0).check_rho(1 / 3)  # iota = 1/rho
    with pytest.raises(ValueError, match="concavity"):
        Penalty("mcp", 2.0).check_rho(0.2)  # iota < 1/rho
    Penalty("scad", 3.7).check_rho(0.38)
    with pytest.raises(ValueError, match="concavity"):
        Penalty("scad", 3.0).check_rho(0.5)  # iota = 1 + 1/rho
    with pytest.raises(ValueError, match="concavity"):
        Penalty("scad", 3.7).check_rho(0.3)


def test_constructor_validates():
    assert Penalty("mcp").concavity == 3.0 and Penalty("scad").concavity == 3.7
    with pytest.raises(ValueError, match="penalty"):
        Penalty("ridge")
    with pytest.raises(ValueError, match="concavity"):
        Penalty("mcp", 0.0)
    with pytest.raises(ValueError, match="concavity"):
        Penalty("scad", 1.0)


@pytest.mark.parametrize("kind", ["lasso", "mcp", "scad"])
def test_lla_weights_are_the_derivative_and_majorize(kind):
    """``derivative_of_norm`` against central differences of ``value_of_norm`` (away from the
    kinks), and the local linear approximation majorizes the penalty and touches it at its
    point: ``P(r) <= P(r0) + P'(r0)(r - r0)`` for every r >= 0 (concavity on [0, inf))."""
    pen = Penalty(kind, None if kind == "lasso" else 3.0)
    lam = 0.7
    r = np.linspace(0.013, 4.0, 397)
    kinks = np.array([lam, 3.0 * lam])
    r = r[np.min(np.abs(r[:, None] - kinks[None]), axis=1) > 1e-3]
    h = 1e-6
    numeric = (pen.value_of_norm(r + h, lam) - pen.value_of_norm(r - h, lam)) / (2 * h)
    assert_allclose(pen.derivative_of_norm(r, lam), numeric, rtol=0, atol=1e-7)
    assert pen.derivative_of_norm(0.0, lam) == lam  # the right derivative at 0
    grid = np.linspace(0.0, 5.0, 1001)
    for r0 in (0.0, 0.3, lam, 1.2, 3.0 * lam, 4.5):
        line = pen.value_of_norm(r0, lam) + pen.derivative_of_norm(r0, lam) * (grid - r0)
        assert np.all(pen.value_of_norm(grid, lam) <= line + 1e-12)
