"""Oracle inference (``--inference oracle``) of both methods.

RowFed: the estimates and standard errors computed by the server from the clients'
sufficient statistics equal a least-squares fit of the stacked raw data on the same
structure, done here with numpy's lstsq.  GrAUC-PFL: the refit equals a direct minimization
of the surrogate on the fused groups (scipy), and the sandwich equals one computed pair by
pair; its variance matches the spread of the estimator over replications.  In both, the
extra summaries leave a site only when asked."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from conftest import write_grauc_csv
from scipy.optimize import minimize
from scipy.stats import norm
from scipy.stats import t as student
from test_rowfed_fit import SIZES, make_data, run_fit

from grauc_flower.client import GrAUCClient
from grauc_flower.data import SiteData, simulate
from grauc_flower.datafit import PairwiseLogistic, newton_minimize
from grauc_flower.inference import SANDWICH_KEY
from rowfed_flower.client import ClientSamples, RowFedClient
from rowfed_flower.inference import MOMENT_KEYS
from strategies.wire import pack


@pytest.fixture(scope="module")
def data_frame():
    return make_data(seed=321)


def _stacked_refit(df: pd.DataFrame, clusters: pd.DataFrame, coef: pd.DataFrame, k: str):
    """The refit of response ``k`` on the raw rows: a column per client intercept and one
    per (feature, client group) with a non-zero coefficient; OLS by lstsq."""
    clients = list(dict.fromkeys(coef["client"]))
    features = [f for f in dict.fromkeys(coef["feature"]) if f != "(intercept)"]
    value = coef.set_index(["client", "feature"])[k]
    columns = {}
    for f in features:
        labels = clusters.set_index("feature").loc[f, clients]
        for g in dict.fromkeys(labels):
            members = [c for c in clients if labels[c] == g]
            if any(value[(c, f)] != 0.0 for c in members):
                columns[(f, g)] = members
    rows = df.reset_index(drop=True)
    design = np.zeros((len(rows), len(clients) + len(columns)))
    for i, c in enumerate(clients):
        design[:, i] = (rows["client"] == c).to_numpy(float)
    for t, ((f, _), members) in enumerate(columns.items()):
        mask = rows["client"].isin(members).to_numpy()
        design[mask, len(clients) + t] = rows.loc[mask, f].to_numpy(float)
    y = rows[k].to_numpy(float)
    beta, *_ = np.linalg.lstsq(design, y, rcond=None)
    resid = y - design @ beta
    df_resid = len(y) - np.linalg.matrix_rank(design)
    sigma2 = resid @ resid / df_resid
    cov = sigma2 * np.linalg.inv(design.T @ design)
    out = {}
    for t, ((f, _), members) in enumerate(columns.items()):
        for c in members:
            out[(c, f)] = (beta[len(clients) + t], np.sqrt(cov[len(clients) + t][len(clients) + t]))
    return out, df_resid


def test_oracle_intervals_equal_a_stacked_least_squares_refit(data_frame, tmp_path):
    data_csv = tmp_path / "data.csv"
    data_frame.to_csv(data_csv, index=False)
    out = tmp_path / "out"
    assert (
        run_fit(str(data_csv), out, "--lam1", "0.08", "--lam2", "0.06", "--inference", "oracle")
        == 0
    )
    table = pd.read_csv(out / "inference.csv")
    clusters = pd.read_csv(out / "clusters.csv")
    coef = pd.read_csv(out / "coefficients.csv")
    assert {"fused", "zero"} <= set(table["kind"])  # the structure has both kinds to check
    assert len(table) == len(SIZES) * 4 * 3
    for k in ("Y1", "Y2", "Y3"):
        expected, df_resid = _stacked_refit(data_frame, clusters, coef, k)
        rows = table[table["response"] == k].set_index(["client", "feature"])
        for key, row in rows.iterrows():
            if row["kind"] == "zero":
                assert key not in expected
                assert row["estimate"] == 0.0 and np.isnan(row["se"])
                continue
            est, se = expected[key]
            assert row["estimate"] == pytest.approx(est, rel=1e-8, abs=1e-10)
            assert row["se"] == pytest.approx(se, rel=1e-8)
            half = student.ppf(0.975, df_resid) * se
            assert row["lower"] == pytest.approx(est - half, rel=1e-8, abs=1e-10)
            assert row["upper"] == pytest.approx(est + half, rel=1e-8, abs=1e-10)
            assert (row["kind"] == "fused") == (row["group_size"] > 1)


def test_moments_leave_a_client_only_when_asked():
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(12, 3)), rng.normal(size=(12, 2))
    client = RowFedClient(ClientSamples("a", x, y))
    theta = [np.zeros((3, 2))]
    _, _, plain = client.evaluate(theta, {"site": "a", "intercept": True})
    assert not set(MOMENT_KEYS) & set(plain)
    _, _, asked = client.evaluate(theta, {"site": "a", "intercept": True, "moments": True})
    assert set(MOMENT_KEYS) <= set(asked)


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--level", "1.5"], "level: must be in (0, 1)"),
        (["--level", "0"], "level:"),
    ],
)
def test_bad_level_is_one_line(data_frame, tmp_path, capsys, extra, words):
    data_csv = tmp_path / "data.csv"
    data_frame.to_csv(data_csv, index=False)
    out = tmp_path / "out"
    assert run_fit(str(data_csv), out, "--inference", "oracle", *extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0]
    assert not out.exists()


# ---------------------------------------------------------------------------------------
# GrAUC-PFL


def _pairs(x_pos, x_neg):
    """Every pair's difference ``d_ij = x+_i - x-_j``, ``(n, m, p)``."""
    return x_pos[:, None, :] - x_neg[None, :, :]


def _brute_site(x_pos, x_neg, beta, eta):
    """Value, gradient, Hessian and the Hájek covariance of one site's surrogate at
    ``beta``, pair by pair."""
    d = _pairs(x_pos, x_neg)
    t = d @ beta
    n, m = t.shape
    value = np.mean(np.log1p(np.exp(-t))) + 0.5 * eta * beta @ beta
    psi = -(1 / (1 + np.exp(t)))[..., None] * d  # each pair's gradient
    grad = psi.mean(axis=(0, 1)) + eta * beta
    w = 1 / (1 + np.exp(-t)) / (1 + np.exp(t))
    hess = np.einsum("ij,ijk,ijl->kl", w, d, d) / (n * m) + eta * np.eye(beta.size)
    a = psi.mean(axis=1)  # each positive's average over the negatives
    c = psi.mean(axis=0)  # each negative's average over the positives
    meat = np.cov(a.T, ddof=1) / n + np.cov(c.T, ddof=1) / m
    return value, grad, hess, meat


def test_hajek_covariance_equals_pair_by_pair(rng):
    x_pos, x_neg = rng.normal(size=(9, 3)) + 0.4, rng.normal(size=(14, 3))
    beta = rng.normal(size=3)
    f = PairwiseLogistic(x_pos, x_neg, eta=0.3, chunk_elements=20)  # several chunks
    _, grad, hess, meat = _brute_site(x_pos, x_neg, beta, 0.3)
    np.testing.assert_allclose(f.hajek(beta), meat, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(f.hessian(beta), hess, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(f.grad(beta), grad, rtol=1e-12, atol=1e-15)


def test_grauc_oracle_refit_and_sandwich_equal_a_direct_computation(tmp_path, capsys):
    """The fit's fused groups (clusters.csv) define the refit; scipy minimizes the summed
    surrogate over one coefficient per (feature, group) and the sandwich is assembled pair by
    pair; inference.csv must agree."""
    from grauc_flower.cli import main

    sites = simulate(simulation=1, n_sites=5, n_features=3, n_train=30, seed=4417)
    data, site_file = write_grauc_csv(str(tmp_path), sites)
    out = tmp_path / "out"
    eta = 0.01
    args = ["fit", "--data", data, "--sites", site_file, "--out", str(out), "--quiet"]
    args += ["--lam", "0.05", "--ridge", str(eta), "--inference", "oracle", "--level", "0.9"]
    assert main([*args, "--standardize", "none"]) == 0  # the direct computation's scale
    table = pd.read_csv(out / "inference.csv", dtype={"site": str})
    clusters = pd.read_csv(out / "clusters.csv", dtype={"site": str}).set_index("site")
    names = list(clusters.columns)
    order = [s.site for s in sites]
    labels = clusters.loc[order].to_numpy()
    assert 0 < len(np.unique(labels[:, 0])) < len(sites) or len(np.unique(labels)) < labels.size
    # the parameters: one per feature and group, numbered independently of the implementation
    index = {}
    for z in range(len(sites)):
        for j in range(len(names)):
            index.setdefault((j, labels[z, j]), len(index))
    cols = np.array([[index[(j, labels[z, j])] for j in range(len(names))] for z in range(5)])
    split = [(s.x_train[s.y_train == 1], s.x_train[s.y_train == 0]) for s in sites]

    def total(theta):
        parts = [_brute_site(xp, xn, theta[cols[z]], eta) for z, (xp, xn) in enumerate(split)]
        g = np.zeros(len(index))
        for z, part in enumerate(parts):
            np.add.at(g, cols[z], part[1])
        return sum(part[0] for part in parts), g

    theta0 = np.zeros(len(index))
    ref = minimize(total, theta0, jac=True, method="BFGS", options={"gtol": 1e-12, "maxiter": 5000})
    got = table.set_index(["site", "feature"])
    estimate = np.array([[got.loc[(s, f), "estimate"] for f in names] for s in order])
    theta = np.zeros(len(index))
    theta[cols.ravel()] = estimate.ravel()
    np.testing.assert_allclose(theta, ref.x, rtol=0, atol=1e-6)
    bread = np.zeros((len(index), len(index)))
    meat = np.zeros_like(bread)
    for z, (xp, xn) in enumerate(split):
        _, _, h, s = _brute_site(xp, xn, theta[cols[z]], eta)
        np.add.at(bread, np.ix_(cols[z], cols[z]), h)
        np.add.at(meat, np.ix_(cols[z], cols[z]), s)
    inv = np.linalg.inv(bread)
    se = np.sqrt(np.diag(inv @ meat @ inv))
    z90 = norm.ppf(0.95)
    for (s, f), row in got.iterrows():
        k = index[(names.index(f), labels[order.index(s), names.index(f)])]
        assert row["se"] == pytest.approx(se[k], rel=1e-8)
        assert row["lower"] == pytest.approx(row["estimate"] - z90 * se[k], rel=1e-10)
        assert row["upper"] == pytest.approx(row["estimate"] + z90 * se[k], rel=1e-10)
        assert row["kind"] == ("fused" if row["group_size"] > 1 else "unique")
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["inference"]["level"] == 0.9 and "error" not in metrics["inference"]
    assert not any(SANDWICH_KEY in m for m in metrics["auc"].values())


def test_grauc_sandwich_variance_matches_the_spread_of_the_estimator():
    """One site, 300 replications: the mean sandwich variance of each coefficient is within
    20% of the estimator's variance over replications, and the 95% intervals cover the
    estimator's mean (a proxy for the population minimizer) at 0.92-0.98."""
    rng = np.random.default_rng(20261201)
    b_true = np.array([1.0, -0.5])
    fits, variances = [], []
    for _ in range(300):
        x_pos = rng.normal(size=(60, 2)) + b_true * 0.8
        x_neg = rng.normal(size=(90, 2))
        f = PairwiseLogistic(x_pos, x_neg, eta=0.05)
        beta = newton_minimize(f, np.zeros(2))[0]
        h_inv = np.linalg.inv(f.hessian(beta))
        fits.append(beta)
        variances.append(np.diag(h_inv @ f.hajek(beta) @ h_inv))
    fits, variances = np.array(fits), np.array(variances)
    ratio = variances.mean(axis=0) / fits.var(axis=0, ddof=1)
    assert np.all((ratio > 0.8) & (ratio < 1.25)), ratio
    cover = np.abs(fits - fits.mean(axis=0)) <= 1.96 * np.sqrt(variances)
    assert np.all((cover.mean(axis=0) > 0.92) & (cover.mean(axis=0) < 0.98)), cover.mean(axis=0)


def test_gradient_covariance_leaves_a_site_only_when_asked():
    rng = np.random.default_rng(8)
    x = rng.normal(size=(30, 3))
    y = (rng.random(30) < 0.4).astype(int)
    site = SiteData("a", 0.0, 0.0, x, y, x[:0], y[:0], [f"f{k}" for k in range(3)])
    client = GrAUCClient(site, ridge=0.1)
    beta = [np.array([0.2, -0.1, 0.3])]
    _, _, plain = client.evaluate(beta, {"site": "a"})
    assert SANDWICH_KEY not in plain
    _, _, asked = client.evaluate(beta, {"site": "a", "sandwich-at": pack(beta[0])})
    assert SANDWICH_KEY in asked
    answer, _, metrics = client.fit(beta, {"site": "a", "task": "newton"})
    f = PairwiseLogistic(x[y == 1], x[y == 0], eta=0.1)
    np.testing.assert_allclose(answer[0][:, 0], f.grad(beta[0]), rtol=1e-12)
    np.testing.assert_allclose(answer[0][:, 1:], f.hessian(beta[0]), rtol=1e-12)
    assert metrics["loss"] == pytest.approx(f.value(beta[0]), rel=1e-12)


@pytest.mark.parametrize("level", ["1", "0", "nan"])
def test_grauc_bad_level_is_one_line(small_federation, tmp_path, capsys, level):
    from grauc_flower.cli import main

    _, data, site_file = small_federation
    out = tmp_path / "out"
    args = ["fit", "--data", data, "--sites", site_file, "--out", str(out), "--quiet"]
    assert main([*args, "--inference", "oracle", "--level", level]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: level:"), err
    assert not out.exists()


def test_grauc_separable_data_without_ridge_give_no_intervals_and_say_why(tmp_path, capsys):
    """Perfectly separated classes and no ridge: the surrogate has no finite minimizer, so
    the refit cannot converge; the fit still succeeds, reports why and writes no table."""
    from grauc_flower.cli import main

    rng = np.random.default_rng(77)
    frames = []
    for site in ("A", "B"):
        for y in (0, 1):
            x = rng.normal(size=(10, 2)) + np.array([6.0 * y, 0.0])
            frames.append(pd.DataFrame({"site": site, "y": y, "f0": x[:, 0], "f1": x[:, 1]}))
    pd.concat(frames).to_csv(tmp_path / "d.csv", index=False)
    sites = pd.DataFrame({"site": ["A", "B"], "lat": [40.0, 41.0], "lon": [-100.0, -101.0]})
    sites.to_csv(tmp_path / "s.csv", index=False)
    out = tmp_path / "out"
    args = ["fit", "--data", str(tmp_path / "d.csv"), "--sites", str(tmp_path / "s.csv")]
    args += ["--out", str(out), "--quiet", "--ridge", "0", "--max-rounds", "20"]
    assert main([*args, "--inference", "oracle"]) == 0
    err = capsys.readouterr().err
    assert "warning: no confidence intervals: the refit did not converge" in err
    assert not (out / "inference.csv").exists()
    info = json.loads((out / "metrics.json").read_text())["inference"]
    assert "separable" in info["error"]
