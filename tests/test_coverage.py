"""Coverage studies of the oracle intervals (issue 13 item 3): the population truth of the
GrAUC-PFL simulations against quadrature and a large-sample fit, the scoring of intervals
against brute force, the summary arithmetic, both studies end to end, and their config
errors."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
from conftest import parse_page
from scipy import integrate, optimize

from grauc_flower.cli import main as grauc_main
from grauc_flower.coverage import population_coefficients, population_scale, true_labels
from grauc_flower.data import simulate, site_means
from grauc_flower.datafit import PairwiseLogistic
from rowfed_flower.cli import main as rowfed_main
from strategies.experiments.coverage import (
    covered,
    identified,
    score_table,
    summarize_coverage,
    true_kinds,
)


# ---------------------------------------------------------------------------------------
# the GrAUC-PFL truth
@pytest.mark.parametrize("norm2, ridge", [(1.62, 1e-3), (4.05, 0.0), (0.3, 0.1), (9.0, 1e-3)])
def test_population_scale_matches_adaptive_quadrature(norm2, ridge):
    """c minimizes E log(1 + exp(-c T)) + (ridge/2) c^2 |mu|^2, T ~ N(|mu|^2, 2|mu|^2):
    checked by scipy's adaptive quadrature and a bounded scalar minimizer."""
    sd = np.sqrt(2 * norm2)

    def h(c):
        def f(t):
            return np.logaddexp(0, -c * t) * np.exp(-0.5 * ((t - norm2) / sd) ** 2)

        val = integrate.quad(f, norm2 - 12 * sd, norm2 + 12 * sd, epsabs=1e-13, limit=200)[0]
        return val / (sd * np.sqrt(2 * np.pi)) + 0.5 * ridge * c * c * norm2

    ref = optimize.minimize_scalar(h, bounds=(0, 20), method="bounded", options={"xatol": 1e-10})
    assert population_scale(norm2, ridge) == pytest.approx(ref.x, abs=1e-6)


def test_population_coefficients_are_what_a_large_sample_fit_approaches():
    """The truth of the coverage study is the minimizer of the population surrogate: a fit
    of the site surrogate on 3,000 positives and 3,000 negatives (9e6 pairs; over 100x a
    site's sample) lands on it to within sampling error, and puts ~0 on a feature whose
    mean does not shift."""
    rng = np.random.default_rng(3)
    mu = np.array([1.8, 0.9, 0.0])
    ridge = 1e-3
    pos = rng.standard_normal((3000, 3)) + mu
    neg = rng.standard_normal((3000, 3))
    f = PairwiseLogistic(pos, neg, ridge)
    fit = optimize.minimize(f.value_and_grad, np.zeros(3), jac=True, method="BFGS")
    truth = population_coefficients(mu[None, :], ridge)[0]
    assert np.abs(fit.x - truth).max() < 0.06, (fit.x, truth)
    assert truth[2] == 0.0
    # the truth is not trivially close: a wrong scale would be far off
    assert np.abs(truth).max() > 0.5


def test_true_groups_of_simulation_one_follow_the_mean_groups():
    """Simulation 1, level 3: features 1 and 3 split the sites by coast (their means differ);
    feature 2 (the same mean, and the same |mu| on both coasts) and the features without a
    shift are shared by all sites."""
    means = site_means(1, 8, 5, 3, seed=4)
    truth = population_coefficients(means, 1e-3)
    labels = true_labels(truth)
    coast = np.repeat([0, 1], 4)
    for j in (0, 2):
        assert identified(coast[:, None], labels[:, [j]])
    for j in (1, 3, 4):
        assert len(set(labels[:, j])) == 1
    assert np.all(truth[:, 3:] == 0)
    # site_means replays simulate's draws: simulation 3 assigns the groups at random
    sites = simulate(3, 8, 5, 40, 8, 0.3, 3, seed=9)
    means3 = site_means(3, 8, 5, 3, seed=9)
    for s, mu in zip(sites, means3, strict=True):
        pos = s.x_train[s.y_train == 1]
        # the positives' sample mean is within 5 SE of the recorded mean
        assert np.all(np.abs(pos.mean(axis=0) - mu) < 5 / np.sqrt(len(pos)))


# ---------------------------------------------------------------------------------------
# scoring
def test_covered_and_kinds_against_brute_force():
    rng = np.random.default_rng(0)
    truth = rng.choice([0.0, 0.5, -1.0], size=(5, 4, 3))
    estimate = truth + rng.normal(0, 0.3, truth.shape)
    estimate[truth == 0] = np.where(rng.random((truth == 0).sum()) < 0.5, 0.0, 0.2)
    half = np.abs(rng.normal(0.3, 0.1, truth.shape))
    lower, upper = estimate - half, estimate + half
    no_interval = estimate == 0
    lower[no_interval] = np.nan
    upper[no_interval] = np.nan
    hit = covered(truth, estimate, lower, upper)
    sizes = rng.integers(1, 4, size=(5, 4))
    kind = true_kinds(sizes[:, :, None], truth == 0)
    for idx in np.ndindex(truth.shape):
        if no_interval[idx]:
            want = truth[idx] == 0
        else:
            want = lower[idx] <= truth[idx] <= upper[idx]
        assert hit[idx] == want
        t = truth[idx]
        want_kind = "zero" if t == 0 else ("fused" if sizes[idx[:2]] > 1 else "unique")
        assert kind[idx] == want_kind


def test_identified_compares_partitions_up_to_relabelling_and_the_zeros():
    a = np.array([[0, 1], [0, 1], [1, 0]])
    b = np.array([[5, 2], [5, 2], [7, 9]])
    assert identified(a, b)
    assert not identified(a, np.array([[0, 1], [1, 1], [1, 0]]))
    support = np.ones((3, 2, 2), bool)
    off = support.copy()
    off[0, 0, 1] = False
    assert identified(a, b, support, support)
    assert not identified(a, b, support, off)


def test_score_table_reads_the_inference_table_in_its_row_order():
    truth = np.array([[1.0, 0.0], [2.0, 0.0]])
    table = pd.DataFrame(
        {
            "estimate": [1.1, 0.0, 2.5, 0.3],
            "lower": [0.9, np.nan, 2.2, -0.1],
            "upper": [1.3, np.nan, 2.8, 0.7],
        }
    )
    kind = true_kinds(np.array([[1, 2], [1, 2]]), truth == 0)
    rows = {r["kind"]: r for r in score_table("m", table, truth, kind, True)}
    assert rows["unique"]["n_coef"] == 2 and rows["unique"]["n_covered"] == 1
    assert rows["zero"]["n_coef"] == 2 and rows["zero"]["n_covered"] == 2
    assert rows["unique"]["width"] == pytest.approx(0.5)
    assert rows["zero"]["width"] == pytest.approx(0.8)


def test_summary_pools_coefficients_and_separates_identified_replications():
    rows = []
    for rep, (n, hit, ident) in enumerate([(10, 9, True), (10, 10, False), (20, 18, True)]):
        rows.append(
            {
                "n_m": 100,
                "rep": rep,
                "method": "rowfed",
                "kind": "fused",
                "n_coef": n,
                "n_covered": hit,
                "coverage": hit / n,
                "width": 0.2,
                "identified": ident,
            }
        )
    out = summarize_coverage(pd.DataFrame(rows), ["n_m"]).iloc[0]
    assert out["n_reps"] == 3
    assert out["identified"] == pytest.approx(2 / 3)
    assert out["coverage"] == pytest.approx(37 / 40)
    assert out["coverage_identified"] == pytest.approx(27 / 30)
    assert out["n_identified"] == 2
    assert out["coverage_mcse"] == pytest.approx(np.std([0.9, 1.0, 0.9], ddof=1) / np.sqrt(3))


# ---------------------------------------------------------------------------------------
# the studies end to end
GRAUC_COVERAGE = """
study = "grauc"
replications = 2
seed = 3
methods = ["grauc"]
[design]
simulation = [1]
n_train = [40, 120]
prevalence = [0.3]
level = [3]
[data]
n_sites = 6
n_features = 4
n_test = 8
[grauc]
lam = 0.5
w-dist = 0.0
[coverage]
level = 0.9
"""

ROWFED_COVERAGE = """
study = "rowfed"
replications = 2
seed = 3
methods = ["rowfed"]
[design]
M = [4]
n_m = [60, 400]
p = [6]
q = [3]
[data]
n_test = 5
clusters = [1, 2, 4]
[rowfed]
penalty = "scad"
lam1 = 0.3
lam2 = 0.15
[coverage]
"""


def _study(main, capsys, tmp_path, text, *extra):
    cfg = tmp_path / "coverage.toml"
    cfg.write_text(text)
    out = tmp_path / "out"
    code = main(["study", "--config", str(cfg), "--out", str(out), "--quiet", *extra])
    return code, capsys.readouterr().err, str(out)


@pytest.mark.parametrize(
    "main, text, per_rep",
    [(grauc_main, GRAUC_COVERAGE, 6 * 4), (rowfed_main, ROWFED_COVERAGE, 4 * 6 * 3)],
    ids=["grauc", "rowfed"],
)
def test_coverage_study_writes_its_tables_figure_and_page(tmp_path, capsys, main, text, per_rep):
    code, err, out = _study(main, capsys, tmp_path, text)
    assert code == 0, err
    results = pd.read_csv(os.path.join(out, "results.csv"))
    # every true coefficient is counted once per replication, under one kind
    per = results.groupby(["n_train" if "n_train" in results else "n_m", "rep"])["n_coef"].sum()
    assert (per == per_rep).all()
    assert results["n_covered"].le(results["n_coef"]).all()
    summary = pd.read_csv(os.path.join(out, "summary.csv"))
    assert set(summary["kind"]) <= {"fused", "unique", "zero"}
    assert summary["n_reps"].eq(2).all()
    table = pd.read_csv(os.path.join(out, "summary_table.csv"))
    assert list(table.columns[-5:]) == [
        "reps",
        "identified",
        "coverage",
        "coverage_identified",
        "width",
    ]
    assert os.path.isfile(os.path.join(out, "fig_coverage.png"))
    page = parse_page(os.path.join(out, "report.html"))
    assert "fig_coverage.png" in page["text"]


def test_rowfed_coverage_counts_kinds_from_the_true_theta(tmp_path, capsys):
    """The kinds follow the truth: with clusters [1, 2, 4] over 4 clients, row 3 is every
    client's own (unique) and rows 4-6 are zero; a rerun of a task gives the same rows."""
    from rowfed_flower import coverage
    from rowfed_flower.study import parse_settings, simulated_federation
    from strategies.experiments.design import read_toml

    path = tmp_path / "c.toml"
    path.write_text(ROWFED_COVERAGE)
    settings = {k: v for k, v in read_toml(str(path)).items() if k != "design"}
    cell = {"M": 4, "n_m": 400, "p": 6, "q": 3}
    frame = coverage.run_task(settings, cell, 0, 11)["results"].set_index("kind")
    data = simulated_federation(parse_settings(settings, tuple(cell)), cell, 11)
    theta = data.theta_true
    assert frame.loc["zero", "n_coef"] == (theta == 0).sum()
    assert frame.loc["unique", "n_coef"] == (theta[:, 2, :] != 0).sum()
    assert frame.loc["fused", "n_coef"] == (theta[:, :2, :] != 0).sum()
    again = coverage.run_task(settings, cell, 0, 11)["results"].set_index("kind")
    pd.testing.assert_frame_equal(frame, again)


@pytest.mark.parametrize(
    "main, text, old, new, words",
    [
        (
            grauc_main,
            GRAUC_COVERAGE,
            'methods = ["grauc"]',
            'methods = ["grauc", "fedavg"]',
            ["methods", "coverage study fits 'grauc' only"],
        ),
        (
            grauc_main,
            GRAUC_COVERAGE,
            "[coverage]",
            "[tuning]\nfolds = 3\n[coverage]",
            ["tuning: a coverage study fits at fixed values"],
        ),
        (grauc_main, GRAUC_COVERAGE, "level = 0.9", "level = 1.5", ["coverage.level"]),
        (grauc_main, GRAUC_COVERAGE, "level = 0.9", "colour = 1", ["coverage.colour"]),
        (
            grauc_main,
            GRAUC_COVERAGE,
            "w-dist = 0.0",
            "standardize = 'federated'",
            ["grauc.standardize"],
        ),
        (grauc_main, GRAUC_COVERAGE, "w-dist = 0.0", "level = 0.8", ["grauc.level"]),
        (
            grauc_main,
            GRAUC_COVERAGE,
            "[data]",
            "[data]\nsource = 'crime'",
            ["data.source", "simulated"],
        ),
        (
            rowfed_main,
            ROWFED_COVERAGE,
            "clusters = [1, 2, 4]",
            "clusters = [1, 0]",
            ["data.clusters"],
        ),
        (
            rowfed_main,
            ROWFED_COVERAGE,
            'penalty = "scad"',
            'inference = "none"',
            ["rowfed.inference"],
        ),
        (
            rowfed_main,
            ROWFED_COVERAGE.replace("[coverage]\n", ""),
            "lam1 = 0.3",
            "lam1 = 0.3",
            ["rowfed.lam1", "chosen by GIC"],
        ),
    ],
)
def test_coverage_config_errors_are_one_line(tmp_path, capsys, main, text, old, new, words):
    assert old in text
    code, err, out = _study(main, capsys, tmp_path, text.replace(old, new))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for w in words:
        assert w in lines[0], lines[0]
    assert not os.path.exists(out)
