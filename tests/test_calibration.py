"""strategies/stats/calibration.py against independent references: Firth's penalized likelihood
maximized by a derivative-free search (scipy), the DerSimonian-Laird estimator written out
again, the Brier score and ECE by their definitions."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from scipy.optimize import minimize
from scipy.special import expit

from strategies.stats.calibration import calibration_metrics, recalibrate, shrink


def _firth_reference(score, y):
    """argmax of l(theta) + (1/2) log det I(theta), by Nelder-Mead from the origin."""

    def neg(theta):
        eta = theta[0] + theta[1] * score
        loglik = np.sum(y * eta - np.logaddexp(0.0, eta))
        p = expit(eta)
        w = p * (1 - p)
        info = np.array([[w.sum(), (w * score).sum()], [(w * score).sum(), (w * score**2).sum()]])
        return -(loglik + 0.5 * np.log(np.linalg.det(info)))

    res = minimize(neg, [0.0, 0.0], method="Nelder-Mead",
                   options={"xatol": 1e-11, "fatol": 1e-14, "maxiter": 40000})  # fmt: skip
    return res.x


@pytest.mark.parametrize("seed", range(6))
def test_recalibration_is_firths_penalized_maximum(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(12, 300))
    scale = rng.uniform(0.05, 20)
    score = scale * rng.standard_normal(n) + rng.normal(0, 3)
    truth = (-1.0 + rng.normal(), rng.uniform(0.2, 2) / scale)
    y = (rng.random(n) < expit(truth[0] + truth[1] * score)).astype(float)
    if y.min() == y.max():
        y[0] = 1 - y[0]
    got = recalibrate(score, y)
    want = _firth_reference(score, y)
    assert got["converged"]
    np.testing.assert_allclose([got["a"], got["b"]], want, rtol=1e-5, atol=1e-6)
    # the covariance: the inverse information at the estimate, written out
    p = expit(got["a"] + got["b"] * score)
    w = p * (1 - p)
    info = np.array([[w.sum(), (w * score).sum()], [(w * score).sum(), (w * score**2).sum()]])
    np.testing.assert_allclose(got["cov"], np.linalg.inv(info), rtol=1e-6)
    assert (got["n_pos"], got["n_neg"]) == (int(y.sum()), int(n - y.sum()))


def test_separated_scores_give_finite_estimates_and_one_class_none():
    score = np.arange(8.0)
    y = (score > 3).astype(float)  # the maximum likelihood estimate does not exist
    got = recalibrate(score, y)
    assert np.isfinite([got["a"], got["b"]]).all() and got["b"] > 0
    np.testing.assert_allclose([got["a"], got["b"]], _firth_reference(score, y), rtol=1e-4)
    none = recalibrate(score, np.zeros(8))
    assert np.isnan([none["a"], none["b"]]).all() and none["n_pos"] == 0


def test_shrinkage_is_dersimonian_laird():
    rng = np.random.default_rng(7)
    est = rng.normal(0, 1, 9)
    var = rng.uniform(0.05, 0.8, 9)
    est[4], var[4] = np.nan, np.nan  # a site without an estimate takes the mean
    got, mu, tau2 = shrink(est, var)
    ok = np.isfinite(est)
    e, v = est[ok], var[ok]
    w = 1 / v
    q = sum(wi * (ei - (w @ e) / w.sum()) ** 2 for wi, ei in zip(w, e, strict=True))
    want_tau2 = max(0.0, (q - (len(e) - 1)) / (w.sum() - (w**2).sum() / w.sum()))
    want_mu = np.sum(e / (v + want_tau2)) / np.sum(1 / (v + want_tau2))
    assert tau2 == pytest.approx(want_tau2, rel=1e-12) and mu == pytest.approx(want_mu)
    np.testing.assert_allclose(got[ok], want_mu + want_tau2 / (want_tau2 + v) * (e - want_mu))
    assert got[4] == pytest.approx(mu)
    # equal sites: nothing between them, every site at the common mean
    same, mu_same, tau2_same = shrink(np.full(5, 0.3), np.full(5, 0.1))
    assert tau2_same == 0.0 and np.allclose(same, 0.3) and mu_same == pytest.approx(0.3)


def test_calibration_metrics_by_their_definitions():
    rng = np.random.default_rng(3)
    prob = rng.uniform(0.02, 0.98, 4000)
    y = (rng.random(4000) < prob).astype(float)
    got = calibration_metrics(prob, y, bins=10)
    assert got["brier"] == pytest.approx(np.mean((prob - y) ** 2))
    order = np.argsort(prob, kind="stable")
    ece = sum(len(b) * abs(y[b].mean() - prob[b].mean()) for b in np.array_split(order, 10))
    assert got["ece"] == pytest.approx(ece / 4000)
    # calibrated probabilities: intercept near 0, slope near 1 (a few standard errors)
    assert abs(got["cal_intercept"]) < 0.15 and abs(got["cal_slope"] - 1) < 0.15
    # over-confident ones (logits doubled): slope near 1/2
    logit = np.log(prob / (1 - prob))
    assert calibration_metrics(expit(2 * logit), y)["cal_slope"] == pytest.approx(0.5, abs=0.08)


def test_a_site_pools_its_folds_scores_into_one_recalibration():
    from grauc_flower.client import GrAUCClient

    rng = np.random.default_rng(11)
    parts = []
    for _ in range(3):
        s = rng.normal(size=15)
        parts.append((s, (rng.random(15) < expit(0.5 + 1.5 * s)).astype(float)))
    got = GrAUCClient.pool(parts)
    want = _firth_reference(np.concatenate([p[0] for p in parts]),
                            np.concatenate([p[1] for p in parts]))  # fmt: skip
    np.testing.assert_allclose([got["cal_a"], got["cal_b"]], want, rtol=1e-5, atol=1e-6)
    assert got["cal_vaa"] > 0 and got["cal_vbb"] > 0


def test_the_bench_prints_its_calibration_and_new_site_tables(monkeypatch, tmp_path):
    """bench --calibration and --new-site: their summaries carry what the printed table
    needs, and the calibration study splits unequal sites at the median size."""
    from grauc_flower import bench

    rows = [
        {"what": "calibration", "design": d, "seed": 0, "method": "grauc", "site": f"S{k}",
         "n_train": n,
         "n_test": 10, "calibration": c, "brier": 0.1 + k / 100, "ece": 0.05, "cal_slope": 1.0}
        for d, sizes in (("equal", (30, 30)), ("unequal", (10, 50)))
        for k, n in enumerate(sizes)
        for c in bench.CALIBRATIONS
    ]  # fmt: skip
    monkeypatch.setattr(bench, "calibration_table", lambda seeds: rows)
    out = bench.calibration_run(str(tmp_path / "cal"), 1)
    text = bench.format_table(out)
    assert "[calibration]" in text and "all (one size)" in text and "larger half" in text
    small = out[(out["design"] == "unequal") & (out["sites"] == "smaller half")]
    assert small["brier"].tolist() == [0.1] * 3
    site_rows = [{"what": "new site", "design": "d", "seed": 0, "site": "S1", "scorer": r,
                  "test_auc": 0.8} for r in ("nearest", "graph")]  # fmt: skip
    monkeypatch.setattr(bench, "new_site_table", lambda seeds: site_rows)
    assert "[new site]" in bench.format_table(bench.new_site_run(str(tmp_path / "ns"), 1))


def test_a_comparators_calibration_scores_each_row_by_a_model_that_did_not_see_it(monkeypatch):
    """bench.out_of_fold_calibration: each fold's fit sees every site's rows outside the
    fold and no others, and each row's score is its site's coefficients of the fit that
    held it out (read from the scores the recalibration receives)."""
    from dataclasses import replace

    from grauc_flower import bench
    from grauc_flower.data import simulate
    from strategies.client.folds import site_folds
    from strategies.stats import calibration

    sites = simulate(n_sites=3, n_features=2, n_train=30, seed=4)
    # a row is known by its first feature; the second is 1, so site z's model of fold k,
    # (0, 100 k + z), scores every row 100 k + z
    sites = [replace(s, x_train=np.column_stack([np.arange(len(s.y_train)) + 1000.0 * z,
                                                  np.ones(len(s.y_train))]))
             for z, s in enumerate(sites)]  # fmt: skip
    seen = []

    def fake_run(cfg, part, methods, guards=None):
        assert guards is not None and guards.min_class_rows == 0  # a fold's rows
        k = len(seen)
        seen.append([set(p.x_train[:, 0].tolist()) for p in part])
        coef = np.array([[0.0, 100.0 * k + z] for z in range(len(part))])
        return {methods[0]: SimpleNamespace(coefficients=coef)}

    received = []

    def fake_recalibrate(score, y):
        received.append(np.array(score, dtype=float))
        return {"a": 0.0, "b": 1.0, "cov": np.eye(2), "n_pos": 1, "n_neg": 1}

    monkeypatch.setattr(bench.fed, "run_methods_inprocess", fake_run)
    monkeypatch.setattr(calibration, "recalibrate", fake_recalibrate)
    folds = 3
    frame = bench.out_of_fold_calibration(sites, None, "individual", folds, seed=1)
    assert list(frame["site"]) == [s.site for s in sites] and len(seen) == folds
    for z, s in enumerate(sites):
        f = site_folds(s.y_train, folds, 1, 0, s.site, True)
        for k in range(folds):
            assert seen[k][z] == set(s.x_train[f != k, 0].tolist())  # outside fold k only
        np.testing.assert_array_equal(received[z], 100.0 * f + z)


@pytest.mark.parametrize("seed", range(5))
def test_reliability_bands_hold_at_least_the_floor_and_every_row_once(seed):
    """reliability_bins against a brute-force reading: the bands are consecutive unions of
    the tenths of [0, 1], each with at least ``floor`` rows (and 3), together every row once, with
    the mean risk and observed rate of exactly its rows; no tenth with ``floor`` rows or more
    is merged into another unless the one before it was short."""
    from strategies.stats.calibration import reliability_bins

    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 80))
    prob = rng.beta(0.6, 2.0, n)  # most rows at small risks: the upper tenths are sparse
    prob[: min(2, n)] = [0.1, 1.0][: min(2, n)]  # on a band's edge
    y = (rng.random(n) < prob).astype(float)
    asked = int(rng.integers(1, 6))
    bands = reliability_bins(prob, y, asked)
    floor = max(asked, 3)  # a band describes at least 3 rows, whatever the floor asked
    if n < floor:
        assert bands == []
        return
    assert sum(b[2] for b in bands) == n
    assert bands[0][0] == 0.0 or not np.any(prob < bands[0][0])
    for lo, hi, rows, mean_p, seen in bands:
        inside = (prob >= lo) & ((prob < hi) | (hi == 1.0))
        assert rows == inside.sum() >= floor
        assert mean_p == pytest.approx(prob[inside].mean(), rel=1e-12)
        assert seen == pytest.approx(y[inside].mean(), rel=1e-12)
        assert round(lo * 10) == pytest.approx(lo * 10) and round(hi * 10) == pytest.approx(hi * 10)
    # a band spanning several tenths: every tenth but its last was short of the floor alone
    # (or it is the last band, merged backwards)
    for k, (lo, hi, *_rest) in enumerate(bands[:-1]):
        tenths = np.arange(round(lo * 10), round(hi * 10))
        counts = [np.sum((prob >= t / 10) & (prob < (t + 1) / 10)) for t in tenths]
        assert all(np.cumsum(counts)[:-1] < floor), (bands, k)
    assert reliability_bins(prob, y, 10**6) == []
