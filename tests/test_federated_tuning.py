"""``fit --tune cv`` of GrAUC-PFL inside the federation (strategies/server/batch.py,
grauc_flower/federated_tuning.py: federated_plan), checked against independent references.

What is checked against what: each batched (fold, setting) fit against the same fit run
alone on folds rebuilt here from ``site_folds`` (validation AUC and pairwise surrogate loss
by brute force over pairs, the pooled out-of-fold AUC from each fold's own fit); the top of
the automatic lam path against the in-process L-BFGS ``lam_maxes`` and the grid below it
against ``log_path``; the choice of each criterion against cv.csv's means (pandas); the
refit against a plain fit at the chosen values; bad input: one line, exit 2, nothing
written; the Flower engine against the in-process one."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from conftest import ROOT, write_grauc_csv

from grauc_flower.data import SiteData, simulate

K, SEED = 3, 9  # folds and fold seed (--data-seed) of the shared runs
#: An explicit grid on which the three criteria pick three different settings, each the
#: unique best of its criterion (asserted below); no lam = 0, where w_dist makes no
#: difference and the settings would tie.
GRID = ("--lam-grid", "2,0.5,0.2,0.05,0.01", "--w-dist-grid", "0,2", "--ridge-grid", "0.1")
KEYS = ["lam", "w_dist", "ridge", "size_power"]
CRITERIA = {"folds": ("val_auc", True), "loss": ("val_loss", False), "pooled": ("pooled_auc", True)}


def _main(capsys, *args) -> tuple[int, str]:
    from grauc_flower.cli import main

    capsys.readouterr()
    try:
        code = main([str(a) for a in args])
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def _ok(*args) -> None:
    """Run ``python -m grauc_flower args`` in this process; assert it succeeded."""
    from grauc_flower.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:
            code = exc.code
    assert code == 0, err.getvalue()[-3000:]


def _rejected(code, err, out, *words):
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for w in words:
        assert w in lines[0], lines[0]
    assert not os.path.exists(out)


def _read(out, name):
    return pd.read_csv(os.path.join(out, name))


def _metrics(out):
    with open(os.path.join(out, "metrics.json")) as fh:
        return json.load(fh)


def _pairs(scores, y) -> tuple[float, float]:
    """AUC (ties 1/2) and the mean pairwise logistic loss, by brute force over all pairs."""
    d = scores[y == 1][:, None] - scores[y == 0][None, :]
    return float(((d > 0) + 0.5 * (d == 0)).mean()), float(np.log1p(np.exp(-d)).mean())


def _fold_sites(sites, k, repeat=0, folds=K, seed=SEED) -> list[SiteData]:
    """Each site's rows outside fold ``k`` of its own stratified folds for training, fold
    ``k`` for validation (the folds rebuilt here from ``site_folds``)."""
    from strategies.client.folds import site_folds

    out = []
    for s in sites:
        fold = site_folds(s.y_train, folds, seed, repeat, s.site, stratified=True)
        tr, va = fold != k, fold == k
        out.append(
            SiteData(
                s.site, s.lat, s.lon, s.x_train[tr], s.y_train[tr], s.x_train[va],
                s.y_train[va], s.features,
            )
        )  # fmt: skip
    return out


def _alone(sites, lam, w_dist, ridge, guards=None):
    """The fit of one (fold, setting) run alone: the CLI's defaults at the CV tolerance."""
    from grauc_flower.federation import run_methods_inprocess
    from strategies.config import GrAUCConfig
    from strategies.stats.tuning import CVOptions

    opts = CVOptions()
    point = GrAUCConfig().replace(
        lam=lam, w_dist=w_dist, ridge=ridge, tol=opts.tol, max_rounds=opts.max_rounds
    )
    return run_methods_inprocess(point, sites, ["grauc"], guards=guards)["grauc"]


# ---------------------------------------------------------------------------------------
# Fixtures: four sites of 36 rows (14 positive), three features
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("federated_cv"))
    sites = simulate(1, 4, 3, 36, 60, 0.4, 3, seed=4242)
    data, site_file = write_grauc_csv(root, sites)
    test = [pd.DataFrame(s.x_test, columns=["f0", "f1", "f2"]).assign(y=s.y_test, site=s.site)
            for s in sites]  # fmt: skip
    pd.concat(test).to_csv(os.path.join(root, "test.csv"), index=False)  # the tuned runs'
    return sites, data, site_file, root


def _fit_args(files, out, *extra):
    _, data, site_file, _ = files
    return ("fit", "--data", data, "--sites", site_file, "--out", out, "--quiet", *extra)


@pytest.fixture(scope="module")
def tuned(files):
    """``tuned(criterion)``: the output directory of ``fit --tune cv`` on :data:`GRID` with
    that criterion (each run once per module)."""
    done: dict[str, str] = {}

    def get(criterion: str) -> str:
        if criterion not in done:
            out = os.path.join(files[3], f"tuned-{criterion}")
            extra = ("--tune", "cv", "--folds", K, "--data-seed", SEED, *GRID,
                     "--test-data", os.path.join(files[3], "test.csv"))  # fmt: skip
            _ok(*_fit_args(files, out, *extra, "--cv-criterion", criterion))
            done[criterion] = out
        return done[criterion]

    return get


# ---------------------------------------------------------------------------------------
# 1. Multiplexing is exact
# ---------------------------------------------------------------------------------------
def test_each_batched_fit_equals_the_same_fit_alone(files, tuned):
    """For two settings, every fold: the fit run alone on folds rebuilt from
    ``site_folds`` gives cv.csv's val_auc, val_loss (brute force over validation pairs, mean
    over sites), rounds and converged; each site's AUC of its out-of-fold scores from the
    three folds' own fits, averaged over sites, gives pooled_auc."""
    from strategies.config import GrAUCConfig

    sites = files[0]
    out = tuned("folds")
    cv = _read(out, "cv.csv")
    assert list(cv.columns) == [
        "fold", "lam", "w_dist", "ridge", "size_power", "val_auc", "val_loss", "pooled_auc",
        "rounds", "converged",
    ]  # fmt: skip
    assert len(cv) == K * 5 * 2 and set(cv["fold"]) == set(range(K))
    # the run's settings are the CLI's defaults (those the fits alone use) at the choice
    m = _metrics(out)
    t = m["tuned"]
    want = GrAUCConfig().replace(lam=t["lam"], w_dist=t["w_dist"], ridge=t["ridge"])
    assert m["config"] == {k.replace("_", "-"): v for k, v in vars(want).items()}

    worst = 0.0
    for lam, w_dist in ((0.5, 2.0), (0.05, 0.0)):
        pooled: dict[str, tuple[list, list]] = {s.site: ([], []) for s in sites}
        for k in range(K):
            fold_sites = _fold_sites(sites, k)
            res = _alone(fold_sites, lam, w_dist, 0.1)
            aucs, losses = [], []
            for z, s in enumerate(fold_sites):
                scores = s.x_test @ res.coefficients[z]
                a, loss = _pairs(scores, s.y_test)
                aucs.append(a)
                losses.append(loss)
                pooled[s.site][0].append(scores)
                pooled[s.site][1].append(s.y_test)
            row = cv[(cv["fold"] == k) & (cv["lam"] == lam) & (cv["w_dist"] == w_dist)]
            assert len(row) == 1
            row = row.iloc[0]
            worst = max(worst, abs(row["val_auc"] - np.mean(aucs)))
            worst = max(worst, abs(row["val_loss"] - np.mean(losses)))
            assert row["val_auc"] == pytest.approx(np.mean(aucs), abs=1e-10)
            assert row["val_loss"] == pytest.approx(np.mean(losses), abs=1e-10)
            assert (row["rounds"], bool(row["converged"])) == (res.rounds, res.converged)
        oof = np.mean(
            [_pairs(np.concatenate(sc), np.concatenate(y))[0] for sc, y in pooled.values()]
        )
        got = cv[(cv["lam"] == lam) & (cv["w_dist"] == w_dist)]["pooled_auc"]
        worst = max(worst, float(np.max(np.abs(got - oof))))
        np.testing.assert_allclose(got, oof, rtol=0, atol=1e-10)
    assert worst < 1e-10, worst


def test_calibration_is_each_sites_recalibration_of_its_out_of_fold_scores(
    files, tuned, tmp_path, capsys
):
    """calibration.csv: per site, Firth's logistic recalibration (maximized here by a
    derivative-free search) of the out-of-fold scores of the chosen setting's three fold
    fits, each run alone; predict --probability writes expit(intercept + slope * score)
    with the site's shrunk row, a site outside the federation the sites' mean; without
    calibration.csv it refuses in one line and writes nothing."""
    from scipy.special import expit
    from test_calibration import _firth_reference

    from strategies.stats.calibration import shrink

    sites = files[0]
    out = tuned("folds")
    t = _metrics(out)["tuned"]
    cal = _read(out, "calibration.csv")
    assert list(cal["site"]) == [s.site for s in sites]
    pooled = {s.site: ([], []) for s in sites}
    for k in range(K):
        fold_sites = _fold_sites(sites, k)
        res = _alone(fold_sites, t["lam"], t["w_dist"], t["ridge"])
        for z, s in enumerate(fold_sites):
            pooled[s.site][0].append(s.x_test @ res.coefficients[z])
            pooled[s.site][1].append(s.y_test)
    for site, (scores, ys) in pooled.items():
        row = cal[cal["site"] == site].iloc[0]
        want = _firth_reference(np.concatenate(scores), np.concatenate(ys))
        np.testing.assert_allclose(
            row[["site_intercept", "site_slope"]].to_numpy(float), want, rtol=1e-4, atol=1e-6
        )
        assert row["n_pos"] + row["n_neg"] == sum(len(y) for y in ys)
    shrunk, mu_a, _ = shrink(cal["site_intercept"], cal["site_intercept_se"] ** 2)
    np.testing.assert_allclose(cal["intercept"], shrunk)

    coef = _read(out, "coefficients.csv")
    rows = pd.DataFrame(np.random.default_rng(2).normal(size=(8, 3)), columns=coef.columns[1:])
    rows.insert(0, "site", [s.site for s in sites] * 2)
    data = str(tmp_path / "new.csv")
    rows.to_csv(data, index=False)
    pred_path = str(tmp_path / "pred.csv")
    code, err = _main(capsys, "predict", "--model", out, "--data", data, "--out", pred_path,
                      "--probability")  # fmt: skip
    assert code == 0, err
    pred = pd.read_csv(pred_path)
    assert list(pred.columns) == ["row", "site", "score", "probability"]
    at = cal.set_index("site")
    want = expit(at.loc[pred["site"], "intercept"].to_numpy()
                 + at.loc[pred["site"], "slope"].to_numpy() * pred["score"].to_numpy())  # fmt: skip
    np.testing.assert_allclose(pred["probability"], want, rtol=1e-12)
    one = rows[rows["site"] == sites[0].site].drop(columns="site")
    one.to_csv(data, index=False)
    code, err = _main(capsys, "predict", "--model", out, "--data", data, "--out", pred_path,
                      "--probability", "--site", "NEW", "--lat", "40", "--lon", "-100")  # fmt: skip
    assert code == 0, err
    pred = pd.read_csv(pred_path)
    mu_b = shrink(cal["site_slope"], cal["site_slope_se"] ** 2)[1]
    np.testing.assert_allclose(pred["probability"], expit(mu_a + mu_b * pred["score"]))

    plain = str(tmp_path / "plain")  # a fit without its calibration
    _ok(*_fit_args(files, plain, "--lam", "0.1", "--no-calibration"))
    gone = str(tmp_path / "none.csv")
    code, err = _main(capsys, "predict", "--model", plain, "--data", data, "--out", gone,
                      "--probability", "--site", "NEW", "--lat", "40", "--lon", "-100")  # fmt: skip
    _rejected(code, err, gone, "probability: no calibration.csv", "--no-calibration")
    # the report's accuracy section shows the calibration of a calibrated fit only
    with open(os.path.join(out, "report.html")) as fh:
        page = fh.read()
    # the table's numbers: rounded to 4 decimals, shown to 4 significant digits
    assert "Calibrated risks" in page and f"{round(cal['slope'].iloc[0], 4):.4g}" in page
    with open(os.path.join(plain, "report.html")) as fh:
        assert "Calibrated risks" not in fh.read()


def test_the_refits_evaluation_scores_each_sites_calibrated_risks(files, tuned):
    """test.csv after a tuning: per site the Brier score, the expected calibration error
    (equal-count bins, by hand), and the calibration intercept and slope (Firth's fit by a
    derivative-free search) of expit(intercept + slope * score) on its test rows, with the
    score from coefficients.csv and the calibration from calibration.csv; reliability.csv:
    bands of the site's rows by probability, each of at least 3 rows (the default guard),
    together every test row once; metrics.json keeps the means, not the bands."""
    from scipy.special import expit, logit
    from test_calibration import _firth_reference

    sites = files[0]
    out = tuned("folds")
    test = _read(out, "test.csv").set_index("site")
    cal = _read(out, "calibration.csv").set_index("site")
    coef = _read(out, "coefficients.csv").set_index("site")
    bands = _read(out, "reliability.csv")
    assert (bands["split"] == "test").all()  # every site has test rows here
    briers = []
    for s in sites:
        score = s.x_test @ coef.loc[s.site].to_numpy()
        prob = expit(cal.loc[s.site, "intercept"] + cal.loc[s.site, "slope"] * score)
        y = s.y_test.astype(float)
        row = test.loc[s.site]
        briers.append(np.mean((prob - y) ** 2))
        assert row["brier"] == pytest.approx(briers[-1], rel=1e-9)
        order = np.argsort(prob, kind="stable")
        ece = sum(len(b) * abs(y[b].mean() - prob[b].mean()) for b in np.array_split(order, 10))
        assert row["ece"] == pytest.approx(ece / len(y), rel=1e-9)
        want = _firth_reference(logit(prob), y)
        np.testing.assert_allclose(row[["cal_intercept", "cal_slope"]].to_numpy(float), want,
                                   rtol=1e-4, atol=1e-6)  # fmt: skip
        mine = bands[bands["site"] == s.site]
        assert (mine["rows"] >= 3).all() and mine["rows"].sum() == len(y)
        assert (mine["lower"].to_numpy()[1:] == mine["upper"].to_numpy()[:-1]).all()
        for _, b in mine.iterrows():
            inside = (prob >= b["lower"]) & ((prob < b["upper"]) | (b["upper"] == 1.0))
            assert inside.sum() == b["rows"]
            assert b["mean_probability"] == pytest.approx(prob[inside].mean(), rel=1e-9)
            assert b["observed"] == pytest.approx(y[inside].mean(), rel=1e-12)
    m = _metrics(out)
    assert m["test"]["mean_brier"] == pytest.approx(np.mean(briers), rel=1e-9)
    assert all("reliability" not in v for v in m["auc"].values())
    with open(os.path.join(out, "report.html")) as fh:
        assert "Reliability" in fh.read()


def test_repeats_draw_each_sites_folds_again(files):
    """``repeats = 2``: one row per (fold, repeat), each the fit alone on the folds of
    ``site_folds(..., repeat, ...)``; the mean and SE are over all R*K folds."""
    from grauc_flower.federated_tuning import run_tuned_inprocess
    from grauc_flower.tuning import Grid
    from strategies.config import GrAUCConfig
    from strategies.stats.tuning import CVOptions

    sites = files[0]
    opts = CVOptions(folds=2, repeats=2, seed=SEED, quiet=True)
    grid = Grid(lam=(0.3,), w_dist=(1.0,), ridge=(0.1,))
    res = run_tuned_inprocess(GrAUCConfig(), sites, "grauc", (opts, grid))
    cv = res.extra["tuning_table"][1]
    assert sorted(zip(cv["fold"], cv["repeat"], strict=True)) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    values = []
    for _, row in cv.iterrows():
        fold_sites = _fold_sites(sites, int(row["fold"]), int(row["repeat"]), folds=2)
        alone = _alone(fold_sites, 0.3, 1.0, 0.1)
        pairs = [
            _pairs(s.x_test @ alone.coefficients[z], s.y_test) for z, s in enumerate(fold_sites)
        ]
        assert row["val_auc"] == pytest.approx(np.mean([a for a, _ in pairs]), abs=1e-10)
        assert row["val_loss"] == pytest.approx(np.mean([v for _, v in pairs]), abs=1e-10)
        assert row["rounds"] == alone.rounds
        values.append(np.mean([a for a, _ in pairs]))
    # the second repeat drew other folds (else the test could not tell them apart)
    assert not np.allclose(cv.sort_values(["repeat", "fold"])["val_loss"].iloc[:2],
                           cv.sort_values(["repeat", "fold"])["val_loss"].iloc[2:])  # fmt: skip
    stats = res.extra["tuning_metrics"]["cv"]
    assert stats["repeats"] == 2
    assert stats["mean"] == pytest.approx(np.mean(values), abs=1e-12)
    assert stats["se"] == pytest.approx(np.std(values, ddof=1) / 2, rel=1e-9)


# ---------------------------------------------------------------------------------------
# 2. The top of the path
# ---------------------------------------------------------------------------------------
#: The batched lam_max (the gradients at a pqn fit stopped at tol 1e-6) against the L-BFGS
#: one (gtol 1e-10): observed relative differences 1.1e-5 (ridge 1) and 1.5e-4 (ridge 0.01).
TOP_RTOL = 3e-4


def test_top_of_the_path_is_lam_max(files, tmp_path):
    """Automatic lam grid: per (ridge, w_dist) the largest lam is ``lam_maxes`` (the
    in-process L-BFGS reference), the grid below it ``log_path(top, 12, 1e-3)`` and 0; the
    fits: one top fit per ridge (the graph is connected at both w_dist), one per (fold,
    setting) and one on all rows per setting."""
    from grauc_flower.graph import build_graph
    from grauc_flower.tuning import lam_maxes
    from strategies.config import GrAUCConfig
    from strategies.stats.tuning import components, log_path

    sites = files[0]
    ridges, w_dists = (0.01, 1.0), (0.0, 2.0)
    out = str(tmp_path / "auto")
    extra = ("--tune", "cv", "--folds", "2", "--w-dist-grid", "0,2", "--ridge-grid", "0.01,1")
    _ok(*_fit_args(files, out, *extra))
    cv = _read(out, "cv.csv")
    cfg = GrAUCConfig()
    ref = lam_maxes(sites, cfg, ridges, w_dists)
    tops = {}
    for (ridge, w), grp in cv.groupby(["ridge", "w_dist"]):
        lams = tuple(sorted(grp["lam"].unique(), reverse=True))
        tops[(ridge, w)] = lams[0]
        assert lams[0] == pytest.approx(ref[(ridge, w)], rel=TOP_RTOL), (
            ridge, w, lams[0] / ref[(ridge, w)] - 1,
        )  # fmt: skip
        np.testing.assert_allclose(lams, log_path(lams[0], 12, 1e-3), rtol=1e-12, atol=0)
        assert len(lams) == 13 and lams[-1] == 0.0
        assert len(grp) == 2 * 13
    assert set(tops) == {(r, w) for r in ridges for w in w_dists}
    # lam_max depends on w_dist (the graph's weights): the test tells the paths apart
    assert tops[(0.01, 2.0)] > 2 * tops[(0.01, 0.0)]

    graph = build_graph(
        np.array([s.lat for s in sites]), np.array([s.lon for s in sites]), cfg.graph, cfg.knn_k
    )
    for w in w_dists:
        assert len(set(components(graph.edges, graph.weights(w, cfg.q), len(sites)))) == 1
    n_settings = len(ridges) * len(w_dists) * 13
    assert _metrics(out)["tuning"]["fits"] == len(ridges) + 2 * n_settings + n_settings


# ---------------------------------------------------------------------------------------
# 3. The choice follows the criterion; 4. the refit is a plain fit
# ---------------------------------------------------------------------------------------
def _per_setting(cv, column):
    if column == "pooled_auc":  # one value per setting, repeated on its folds' rows
        assert (cv.groupby(KEYS)[column].nunique() == 1).all()
        return cv.groupby(KEYS)[column].first()
    return cv.groupby(KEYS)[column].mean()


def _best(series, maximize):
    value = series.max() if maximize else series.min()
    assert int((series == value).sum()) == 1, "a tie: choose other data"
    return series.idxmax() if maximize else series.idxmin(), float(value)


@pytest.mark.parametrize("criterion", list(CRITERIA))
def test_choice_follows_the_criterion(tuned, criterion):
    """The tuned setting is the argmax mean val_auc (folds), argmin mean val_loss (loss) or
    argmax pooled_auc (pooled) of cv.csv; on these data each criterion picks another
    setting, so each check tells the criteria apart."""
    out = tuned(criterion)
    cv = _read(out, "cv.csv")
    m = _metrics(out)
    column, maximize = CRITERIA[criterion]
    best, value = _best(_per_setting(cv, column), maximize)
    assert tuple(m["tuned"][k] for k in KEYS) == pytest.approx(best)
    assert m["cv"]["criterion"] == criterion and m["cv"]["score"] == column
    assert m["cv"]["mean"] == pytest.approx(value, abs=1e-12)
    if criterion != "pooled":  # the SE over folds
        rows = cv[(cv[KEYS] == pd.Series(dict(zip(KEYS, best, strict=True)))).all(axis=1)]
        assert len(rows) == K
        se = rows[column].std(ddof=1) / np.sqrt(K)
        assert m["cv"]["se"] == pytest.approx(se, rel=1e-9)
    others = {
        c: _best(_per_setting(cv, col), mx)[0]
        for c, (col, mx) in CRITERIA.items()
        if c != criterion
    }
    assert all(o != best for o in others.values()), others


def test_table_does_not_depend_on_the_criterion(tuned):
    base = _read(tuned("folds"), "cv.csv")
    for criterion in ("loss", "pooled"):
        pd.testing.assert_frame_equal(_read(tuned(criterion), "cv.csv"), base, check_exact=True)


@pytest.mark.parametrize("criterion", list(CRITERIA))
def test_refit_equals_a_plain_fit(files, tuned, tmp_path, criterion):
    """coefficients.csv of the tuned fit and of ``fit --lam --w-dist --ridge`` at the tuned
    values agree to 1e-12, and so do the rounds and objective."""
    out = tuned(criterion)
    t = _metrics(out)["tuned"]
    plain = str(tmp_path / "plain")
    _ok(
        *_fit_args(
            files, plain, "--lam", repr(float(t["lam"])), "--w-dist", repr(float(t["w_dist"])),
            "--ridge", repr(float(t["ridge"])),
        )
    )  # fmt: skip
    got, want = _read(out, "coefficients.csv"), _read(plain, "coefficients.csv")
    assert list(got["site"]) == list(want["site"]) and list(got.columns) == list(want.columns)
    diff = float(np.max(np.abs(got.iloc[:, 1:].to_numpy() - want.iloc[:, 1:].to_numpy())))
    assert diff < 1e-12, diff
    a, b = _metrics(out), _metrics(plain)
    assert a["rounds"] == b["rounds"]
    assert a["objective"] == pytest.approx(b["objective"], rel=1e-12)


# ---------------------------------------------------------------------------------------
# 5. Bad input
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("extra", "words", "absent"),
    [
        (("--tune", "cv", "--folds", "15", "--lam-grid", "0.1"), ("folds:", "at most 14"), "S3"),
        (("--tune", "cv", "--ridge-grid", "-1"), ("ridge-grid",), None),
        (("--tune", "cv", "--max-fits", "-1"), ("max-fits", ">= 0"), None),
        (
            ("--tune", "cv", "--cv-criterion", "pooled", "--method", "fedavg", "--folds", "2",
             "--ridge-grid", "0.1", "--rounds-grid", "2", "--jobs", "1"),
            ("cv-criterion", "fedavg"),
            None,
        ),
    ],
)  # fmt: skip
def test_bad_input_is_one_line(files, capsys, tmp_path, extra, words, absent):
    """Exit 2, one ``error:`` line naming the field (the folds: more than any site can fill,
    the largest 14 positive rows; S3 with 4 would take part), no traceback, no output
    directory."""
    _, data, site_file, _ = files
    frame = pd.read_csv(data)
    few = frame[(frame["site"] == "S3") & (frame["y"] == 1)].index[4:]
    small = str(tmp_path / "small.csv")
    frame.drop(index=few).to_csv(small, index=False)
    out = str(tmp_path / "never")
    code, err = _main(
        capsys, "fit", "--data", small, "--sites", site_file, "--out", out, "--quiet", *extra
    )
    _rejected(code, err, out, *words)
    if absent:
        assert absent not in err


# ---------------------------------------------------------------------------------------
# 6. The Flower engine
# ---------------------------------------------------------------------------------------
def _ours(marker: str) -> dict[int, str]:
    """Live processes whose environment holds ``marker`` (the SuperLink, Ray and their
    workers inherit the run's environment): pid -> command line."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if marker.encode() not in fh.read():
                    continue
            with open(f"/proc/{entry}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                found[int(entry)] = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
    return found


def _run_watched(args, env, marker, log_dir) -> tuple[subprocess.Popen, str, dict]:
    """``python -m grauc_flower args`` with ``env``; returns the process, its stderr and
    every process seen carrying ``marker`` while it ran."""
    import time

    err_path = os.path.join(log_dir, "stderr.txt")
    seen: dict[int, str] = {}
    with open(err_path, "w") as err, open(os.devnull, "w") as null:
        proc = subprocess.Popen(
            [sys.executable, "-m", "grauc_flower", *args], stdout=null, stderr=err, cwd=ROOT,
            env=env,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 600
            while proc.poll() is None and time.monotonic() < deadline:
                seen.update(_ours(marker))
                time.sleep(0.5)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    with open(err_path) as fh:
        return proc, fh.read(), seen


@pytest.mark.slow
@pytest.mark.flower
def test_flower_engine_equals_inprocess(files, tmp_path):
    """``fit --tune cv`` (tiny grid) through ``--engine flower`` and in process: the same
    cv.csv, choice and coefficients, to the last digit; the SuperLink and Ray, seen while
    the run lasted, are gone when it ends."""
    import signal

    # a marker in the environment, to find the run's processes (not TMPDIR: Ray's sockets
    # under a long pytest path exceed AF_UNIX's 107 bytes and the simulation fails)
    value = f"{os.getpid()}-{id(tmp_path)}"
    marker = f"PFL_TEST_RUN={value}"
    env = {**os.environ, "PFL_TEST_RUN": value}
    extra = ("--tune", "cv", "--folds", "2", "--lam-grid", "0.3,0.03", "--w-dist-grid", "1")
    extra += ("--ridge-grid", "0.1")
    outs = {}
    try:
        for engine in ("inprocess", "flower"):
            out = str(tmp_path / engine)
            os.makedirs(tmp_path / f"log-{engine}")
            args = (*_fit_args(files, out, *extra), "--engine", engine)
            proc, err, seen = _run_watched(args, env, marker, str(tmp_path / f"log-{engine}"))
            assert proc.returncode == 0, err[-3000:]
            outs[engine] = out
        assert any("flower-superlink" in cmd for cmd in seen.values()), seen
        left = _ours(marker)
        assert not left, f"processes of the Flower run still alive: {left}"
    finally:
        for pid in _ours(marker):  # only the processes this test started
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    a, b = _read(outs["inprocess"], "cv.csv"), _read(outs["flower"], "cv.csv")
    assert list(a.columns) == list(b.columns) and len(a) == len(b) == 2 * 2
    numbers = a.select_dtypes("number").columns
    diff = float(np.max(np.abs(a[numbers].to_numpy(float) - b[numbers].to_numpy(float))))
    assert diff == 0.0, f"cv.csv: max abs difference {diff:g}"
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    ca, cb = _read(outs["inprocess"], "coefficients.csv"), _read(outs["flower"], "coefficients.csv")
    assert list(ca["site"]) == list(cb["site"])
    diff = float(np.max(np.abs(ca.iloc[:, 1:].to_numpy() - cb.iloc[:, 1:].to_numpy())))
    assert diff == 0.0, f"coefficients.csv: max abs difference {diff:g}"
    ma, mb = _metrics(outs["inprocess"]), _metrics(outs["flower"])
    assert ma["tuned"] == mb["tuned"] and ma["tuning"] == mb["tuning"]
    for m in (ma, mb):  # the clock: every round, the server's part and the sites'
        t = m["tuning_time"]
        assert t["rounds"] == m["tuning"]["rounds"]
        assert 0 < t["server_seconds_per_round"] <= t["server_seconds_max"]
        assert 0 < t["sites_seconds_per_round"] <= t["sites_seconds_max"]
        assert 0 <= t["rounds_server_slower"] <= t["rounds"]
    assert (ma["engine"], mb["engine"]) == ("inprocess", "flower")


def _most_running(lines: list[str]) -> int:
    """The most fits a tuning's progress lines say ran at once."""
    counts = [int(m.group(1)) for line in lines if (m := re.search(r"(\d+) fits running", line))]
    return max(counts)


@pytest.mark.parametrize("method", ["grauc", "rowfed"])
def test_at_most_max_fits_run_at_once_with_the_same_results(method, files, rowfed_data):
    """``max_fits = 2``: no round runs more than two fits, the others wait their turn, and
    the tuning's table, choice and coefficients are those of the run with every fit at
    once, to the last digit (each fit advances as it would alone); it takes more rounds."""
    from strategies.stats.tuning import CVOptions

    runs = {}
    for cap in (0, 2):
        lines: list[str] = []
        opts = CVOptions(folds=2, seed=SEED, quiet=True, max_fits=cap)
        if method == "grauc":
            from grauc_flower.federated_tuning import run_tuned_inprocess
            from grauc_flower.tuning import Grid
            from strategies.config import GrAUCConfig

            grid = Grid(lam=(0.3, 0.03), w_dist=(1.0,), ridge=(0.1,))
            res = run_tuned_inprocess(
                GrAUCConfig(), files[0], "grauc", (opts, grid), progress=lines.append
            )
            coef = res.coefficients
        else:
            from rowfed_flower.federated_tuning import run_tuned_inprocess
            from strategies.config import RowFedConfig

            tune = ("cv", (opts, *ROWFED_GRID, None))
            res = run_tuned_inprocess(
                RowFedConfig(), rowfed_data, "rowfed", tune, progress=lines.append
            )
            coef = res.coefficients
        # both methods' tuned results: (file name, table) and the metrics, by the same keys
        name, table = res.extra["tuning_table"]
        assert name == "cv.csv"
        rounds = res.extra["tuning_metrics"]["tuning"]["rounds"]
        runs[cap] = table, coef, rounds, _most_running(lines)
    (table, coef, rounds, most), (table2, coef2, rounds2, most2) = runs[0], runs[2]
    assert most > 2 and most2 == 2
    pd.testing.assert_frame_equal(table, table2, check_exact=True)
    np.testing.assert_array_equal(coef, coef2)
    assert rounds2 > rounds


def test_the_batch_clock_splits_each_round_between_server_and_sites(monkeypatch):
    """A round's hooks count as the server's time, but for their waits on the sites'
    registrations; from a configure that sent messages to the aggregate that takes the
    answers, as the sites'; a configure that sent nothing starts no wait."""
    from strategies.server import batch as batch_module
    from strategies.server.batch import BatchStrategy

    now = [0.0]
    monkeypatch.setattr(batch_module.time, "perf_counter", lambda: now[0])

    class Clocked(BatchStrategy):
        def __init__(self):  # only the clock's state
            self.clock, self._sent, self._hook_start, self._waited = {}, None, 0.0, 0.0

        @batch_module._clocked(sends=True)
        def configure_fit(self, server_round, parameters, client_manager):
            now[0] += 1.0
            if server_round == 1:  # a registration's wait for the sites
                now[0] += 0.5
                self._waited += 0.5
            return ["message"] if server_round < 3 else []

        @batch_module._clocked(sends=False)
        def aggregate_fit(self, server_round, results, failures):
            now[0] += 2.0

    b = Clocked()
    for rnd, wait in ((1, 3.0), (2, 0.5)):
        b.configure_fit(server_round=rnd, parameters=None, client_manager=None)
        now[0] += wait
        b.aggregate_fit(rnd, [], [])
    b.configure_fit(3, None, None)  # nothing sent
    now[0] += 10.0
    assert b.clock == {1: [3.0, 3.5], 2: [3.0, 0.5], 3: [1.0, 0.0]}
    assert b.timing() == {
        "rounds": 2,
        "server_seconds_per_round": 3.0,
        "sites_seconds_per_round": 2.0,
        "server_seconds_max": 3.0,
        "sites_seconds_max": 3.5,
        "rounds_server_slower": 1,
    }


def test_a_round_reads_the_node_list_once_not_once_per_fit(rowfed_data, monkeypatch):
    """Across hospitals Flower's client manager asks the SuperLink for the nodes on every
    all(); the batch hands its fits one list per hook, so a round of 18 fits reads it a
    few times, not 18 times or more (each fit registering)."""
    from flwr.server.client_manager import SimpleClientManager

    from rowfed_flower import federation as fed
    from rowfed_flower.federated_tuning import tuned_strategy
    from strategies.config import RowFedConfig
    from strategies.experiments.benchtable import timed_tuning
    from strategies.server.rowfed import rowfed_registry
    from strategies.stats.tuning import CVOptions

    calls = [0]
    inner = SimpleClientManager.all

    def counted(self):
        calls[0] += 1
        return inner(self)

    monkeypatch.setattr(SimpleClientManager, "all", counted)
    cfg = RowFedConfig()
    opts = (CVOptions(folds=2, quiet=True, jobs=1), (0.3, 0.05, 0.01), (0.05, 0.005), None)
    batch = tuned_strategy("rowfed", cfg, len(rowfed_data.clients), rowfed_registry(),
                           ("cv", opts))  # fmt: skip
    row = timed_tuning(batch, rowfed_data.make_clients(), fed.max_rounds_for("rowfed", cfg, True))
    assert row["fits"] >= 18 and row["rounds"] >= 2
    assert calls[0] <= 2 * (row["rounds"] + 2) + len(rowfed_data.clients)


def test_a_stages_views_register_in_one_message_per_site(rowfed_data, monkeypatch):
    """The folds' views register together: each site answers one properties message for
    its whole data and one for all three folds (not one per fold), and the tuning's
    table and choice are those of one message per view."""
    from rowfed_flower import federation as fed
    from rowfed_flower.client import RowFedClient
    from rowfed_flower.federated_tuning import tuned_strategy
    from strategies.config import RowFedConfig
    from strategies.experiments.benchtable import timed_tuning
    from strategies.server.batch import BatchStrategy
    from strategies.server.rowfed import rowfed_registry
    from strategies.stats.tuning import CVOptions
    from strategies.wire.batch import VIEW_FIELD

    def run():
        asked: list[str] = []
        inner = RowFedClient.get_properties

        def counted(self, config):
            asked.append(str(config.get(VIEW_FIELD, "")))
            return inner(self, config)

        monkeypatch.setattr(RowFedClient, "get_properties", counted)
        cfg = RowFedConfig()
        opts = (CVOptions(folds=3, quiet=True, jobs=1), (0.3, 0.05), (0.05,), None)
        batch = tuned_strategy("rowfed", cfg, len(rowfed_data.clients), rowfed_registry(),
                               ("cv", opts))  # fmt: skip
        timed_tuning(batch, rowfed_data.make_clients(), fed.max_rounds_for("rowfed", cfg, True))
        monkeypatch.setattr(RowFedClient, "get_properties", inner)
        return asked, fed.collect("rowfed", batch)

    asked, res = run()
    m = len(rowfed_data.clients)
    views = [a for a in asked if a]  # the messages that carry views (not a view's own call)
    assert len(views) == m and all(a.startswith("[") for a in views)  # the three folds at once
    monkeypatch.setattr(BatchStrategy, "_register_views", lambda *a: None)
    asked_one_by_one, ref = run()
    assert len([a for a in asked_one_by_one if a]) == 3 * m
    assert res.extra["tuning_table"][1].equals(ref.extra["tuning_table"][1])
    np.testing.assert_array_equal(res.coefficients, ref.coefficients)


# ---------------------------------------------------------------------------------------
# 7. RowFed: GIC and CV inside the federation
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def rowfed_data():
    """Six clients, five predictors, two responses; clients 0-2 share a slope."""
    from rowfed_flower.client import ClientSamples
    from rowfed_flower.sources import FederatedData

    rng = np.random.default_rng(2026)
    clients = []
    for m in range(6):
        theta = np.array([[1.0, -0.5], [0.0, 0.0], [0.5, 0.5], [0.0, 1.0], [0.0, 0.0]])
        theta[0] += 0.8 * (m >= 3)
        x = rng.standard_normal((40 + 5 * m, 5))
        y = 0.3 * m + x @ theta + 0.4 * rng.standard_normal((len(x), 2))
        clients.append(ClientSamples(f"c{m}", x, y))
    return FederatedData(tuple(clients), tuple(f"x{j}" for j in range(5)), ("Y1", "Y2"))


ROWFED_GRID = ((0.3, 0.05, 0.01), (0.05, 0.005))


def test_rowfed_gic_inside_the_federation_equals_the_warm_started_walk(rowfed_data):
    """The lasso's optimum is unique: the batched GIC (every grid point from its own start,
    side by side) and the in-process walk with warm starts give the same GIC table (to the
    fits' tolerance), the same choice and the same coefficients."""
    from rowfed_flower import tuning as rtuning
    from rowfed_flower.federated_tuning import run_tuned_inprocess
    from strategies.config import RowFedConfig
    from strategies.stats.tuning import CVOptions

    cfg = RowFedConfig(tol=1e-10)
    tune = ("gic", (CVOptions(quiet=True), *ROWFED_GRID, None))
    res = run_tuned_inprocess(cfg, rowfed_data, "rowfed", tune)
    name, table = res.extra["tuning_table"]
    old, want = rtuning.tune_gic(cfg, rowfed_data, "rowfed", *ROWFED_GRID)
    assert name == "gic.csv" and len(table) == len(want) == 6
    np.testing.assert_allclose(table["gic"], want["gic"], rtol=1e-6)
    np.testing.assert_array_equal(table["df"], want["df"])
    assert (res.lam1, res.lam2) == (old.lam1, old.lam2)
    np.testing.assert_allclose(res.coefficients, old.coefficients, atol=1e-6)
    tuning_info = res.extra["tuning_metrics"]["tuning"]
    assert tuning_info["fits"] == 6 and 0 < tuning_info["rounds"] < table["rounds"].sum()
    # the choice's place in each grid (lam1 over 3 values, lam2 over 2: both at an edge)
    lam1s, lam2s = (sorted(set(g)) for g in ROWFED_GRID)
    want = {"lam1": "smallest" if res.lam1 == lam1s[0] else "largest"}
    want["lam2"] = "smallest" if res.lam2 == lam2s[0] else "largest"
    if lam1s[0] < res.lam1 < lam1s[-1]:
        del want["lam1"]
    assert res.extra["tuning_metrics"]["at_grid_edge"] == want


def _rowfed_fold(data, k: int, folds: int = 3, seed: int = 4):
    """Each client's rows outside fold ``k`` of its own folds for training, fold ``k`` for
    validation (the folds rebuilt here from ``site_folds``)."""
    from rowfed_flower.client import ClientSamples
    from rowfed_flower.sources import FederatedData
    from strategies.client.folds import site_folds

    parts = []
    for c in data.clients:
        f = site_folds(np.zeros(c.n), folds, seed, 0, c.site, False)
        parts.append(ClientSamples(c.site, c.x[f != k], c.y[f != k], c.x[f == k], c.y[f == k]))
    return FederatedData(tuple(parts), data.features, data.responses)


def test_rowfed_cv_fold_fit_equals_the_same_fit_alone(rowfed_data):
    """A (fold, setting) row of the batched RowFed CV: the same fit run alone on that
    fold's rows (each client's own random folds) gives the same validation MSE (the mean
    over clients of each client's mean squared error, computed here) and rounds; the pooled
    MSE is each client's squared errors over all its folds' validation rows."""
    from rowfed_flower import federation as rfed
    from rowfed_flower.federated_tuning import run_tuned_inprocess
    from strategies.config import RowFedConfig
    from strategies.stats.tuning import CVOptions

    cfg = RowFedConfig()
    opts = CVOptions(folds=3, quiet=True, seed=4)
    tune = ("cv", (opts, (0.05,), (0.02, 0.005), None))
    res = run_tuned_inprocess(cfg, rowfed_data, "rowfed", tune)
    name, table = res.extra["tuning_table"]
    assert name == "cv.csv" and len(table) == 3 * 2 * 2  # sizes differ: size_power 0 and 1
    for lam2 in (0.02, 0.005):
        sse = {c.site: 0.0 for c in rowfed_data.clients}
        count = dict.fromkeys(sse, 0)
        for k in range(3):
            alone = _rowfed_fold(rowfed_data, k)
            point = cfg.replace(lam1=0.05, lam2=lam2, tol=opts.tol, max_rounds=opts.max_rounds)
            fit = rfed.run_methods_inprocess(point, alone, ["rowfed"])["rowfed"]
            mses = []
            for z, c in enumerate(alone.clients):
                pred = c.x_test @ fit.coefficients[z] + fit.intercept[z]
                err = c.y_test - pred
                mses.append(np.mean(err**2))
                sse[c.site] += float(np.sum(err**2))
                count[c.site] += err.size
            row = table[(table["fold"] == k) & (table["lam2"] == lam2) & (table["size_power"] == 0)]
            assert len(row) == 1
            assert row["val_mse"].iloc[0] == pytest.approx(np.mean(mses), rel=1e-9)
            assert row["rounds"].iloc[0] == fit.rounds
        pooled = np.mean([sse[s] / count[s] for s in sse])
        assert row["pooled_mse"].iloc[0] == pytest.approx(pooled, rel=1e-9)
    # the refit is a plain fit at the chosen levels
    chosen = res.extra["tuning_metrics"]["tuned"]
    plain = rfed.run_methods_inprocess(cfg.replace(**chosen), rowfed_data, ["rowfed"])["rowfed"]
    np.testing.assert_array_equal(res.coefficients, plain.coefficients)


def test_rowfed_client_with_fewer_rows_than_folds_takes_part(rowfed_data):
    """A client with 2 rows and 3 folds takes part: it trains in every fold, has a
    validation MSE in the 2 folds that hold one of its rows, and in the third the fold's
    criterion is the mean over the other clients only (counted here from the same fit run
    alone on that fold); the output names it with the folds it scores."""
    from rowfed_flower import federation as rfed
    from rowfed_flower.client import ClientSamples
    from rowfed_flower.federated_tuning import run_tuned_inprocess
    from rowfed_flower.sources import FederatedData
    from strategies.client.guards import Guards
    from strategies.config import RowFedConfig
    from strategies.stats.tuning import CVOptions

    first = rowfed_data.clients[0]
    small = ClientSamples(first.site, first.x[:2], first.y[:2])
    data = FederatedData(
        (small, *rowfed_data.clients[1:]), rowfed_data.features, rowfed_data.responses
    )
    cfg = RowFedConfig(size_power=0.0)
    opts = CVOptions(folds=3, quiet=True, seed=4)
    tune = ("cv", (opts, (0.05,), (0.02,), (0.0,)))
    res = run_tuned_inprocess(cfg, data, "rowfed", tune, guards=Guards.off())
    _, table = res.extra["tuning_table"]
    assert res.extra["tuning_metrics"]["tuning"]["partial_sites"] == {first.site: 2}
    scored = 0
    for k in range(3):
        alone = _rowfed_fold(data, k)
        point = cfg.replace(lam1=0.05, lam2=0.02, tol=opts.tol, max_rounds=opts.max_rounds)
        fit = rfed.run_methods_inprocess(point, alone, ["rowfed"], guards=Guards.off())["rowfed"]
        mses = [
            np.mean((c.y_test - c.x_test @ fit.coefficients[z] - fit.intercept[z]) ** 2)
            for z, c in enumerate(alone.clients)
            if len(c.y_test)
        ]
        scored += len(alone.clients[0].y_test) > 0
        row = table[table["fold"] == k]
        assert row["val_mse"].iloc[0] == pytest.approx(np.mean(mses), rel=1e-9)
    assert scored == 2  # the small client has validation rows in 2 of the 3 folds


@pytest.mark.slow
@pytest.mark.flower
def test_rowfed_gic_through_flwr_run_equals_inprocess(rowfed_data, tmp_path, capsys):
    """``fit --tune gic`` through ``flwr run`` and in process: the same GIC table and the
    same coefficients, to the last digit."""
    import importlib

    frames = []
    for c in rowfed_data.clients:
        frame = pd.DataFrame(c.x, columns=list(rowfed_data.features))
        frame.insert(0, "client", c.site)
        frame["Y1"], frame["Y2"] = c.y[:, 0], c.y[:, 1]
        frames.append(frame)
    data = str(tmp_path / "data.csv")
    pd.concat(frames).to_csv(data, index=False)
    main = importlib.import_module("rowfed_flower.cli").main
    outs = {}
    for engine in ("inprocess", "flower"):
        outs[engine] = str(tmp_path / engine)
        args = ["fit", "--data", data, "--responses", "Y1,Y2", "--tune", "gic", "--out"]
        args += [outs[engine], "--lam1-grid", "0.3,0.05", "--lam2-grid", "0.05,0.005"]
        assert main([*args, "--engine", engine]) == 0, capsys.readouterr().err[-3000:]
    a, b = (pd.read_csv(os.path.join(outs[e], "gic.csv")) for e in ("inprocess", "flower"))
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    ca, cb = (pd.read_csv(os.path.join(outs[e], "coefficients.csv")) for e in outs)
    diff = float(
        np.max(
            np.abs(ca.select_dtypes("number").to_numpy() - cb.select_dtypes("number").to_numpy())
        )
    )
    assert diff == 0.0, f"coefficients.csv: max abs difference {diff:g}"
    ma, mb = _metrics(outs["inprocess"]), _metrics(outs["flower"])
    assert ma["tuning"]["selected"] == mb["tuning"]["selected"]
    assert ma["tuning"]["rounds"] == mb["tuning"]["rounds"] > 0


def test_rowfed_sparsity_level_is_where_each_client_alone_is_zero():
    """``lam2_max`` from the gradients at zero: a client's own lasso (NonFed, solved by
    cvxpy here) is zero just above it and not just below, for entry and row sparsity."""
    cp = pytest.importorskip("cvxpy")
    from rowfed_flower.tuning import sparsity_level

    rng = np.random.default_rng(7)
    x = rng.standard_normal((30, 3))
    y = x @ rng.standard_normal((3, 2)) + rng.standard_normal((30, 2))
    x, y = x - x.mean(0), y - y.mean(0)
    grads = (-(x.T @ y) / len(x))[None]  # one client's gradient of ||Y - X T||^2 / (2n) at 0
    for sparsity in ("entry", "row"):
        top = sparsity_level(grads, sparsity)
        for factor, zero in ((1.01, True), (0.95, False)):
            t = cp.Variable((3, 2))
            pen = cp.sum(cp.abs(t)) if sparsity == "entry" else cp.sum(cp.norm(t, 2, axis=1))
            loss = cp.sum_squares(y - x @ t) / (2 * len(x))
            cp.Problem(cp.Minimize(loss + factor * top * pen)).solve()
            assert (np.abs(t.value).max() < 1e-6) == zero, (sparsity, factor)


def test_rowfed_fusion_level_fuses_every_row():
    """``lam1_max`` from the gradients at the clients' common fit: the fused problem
    (cvxpy) is all fused just above it; with two clients (one edge, a tree) it is exact, so
    just below the rows part."""
    cp = pytest.importorskip("cvxpy")
    from rowfed_flower.tuning import fusion_level

    rng = np.random.default_rng(11)
    for m in (2, 4):
        xs = [rng.standard_normal((25, 2)) for _ in range(m)]
        ys = [x @ rng.standard_normal((2, 2)) + 0.3 * rng.standard_normal((25, 2)) for x in xs]
        common = np.linalg.lstsq(np.vstack(xs), np.vstack(ys), rcond=None)[0]
        grads = np.stack([-(x.T @ (y - x @ common)) / len(x) for x, y in zip(xs, ys, strict=True)])
        top = fusion_level(grads, None, None, "row", "graph")
        pairs = [(a, b) for a in range(m) for b in range(a + 1, m)]
        for factor in (1.01, 0.95):
            ts = [cp.Variable((2, 2)) for _ in range(m)]
            loss = sum(
                cp.sum_squares(y - x @ t) / (2 * len(x)) for x, y, t in zip(xs, ys, ts, strict=True)
            )
            fuse = sum(cp.sum(cp.norm(ts[a] - ts[b], 2, axis=1)) for a, b in pairs)
            cp.Problem(cp.Minimize(loss + factor * top * fuse)).solve()
            spread = max(np.abs(ts[a].value - ts[b].value).max() for a, b in pairs)
            if factor > 1:
                assert spread < 1e-5, m
            elif m == 2:
                assert spread > 1e-4


def test_rowfed_auto_gic_path_starts_at_the_data(rowfed_data):
    """With ``auto`` grids, the federated GIC walks paths from the data: the largest lam1 fuses
    every row (one cluster a row), the lam2 levels lie below lam2_max and span a factor
    100, and ``gic-nq`` chooses the smallest df-over-Nq GIC (computed here by hand); no
    grid-edge note for the top of the lam1 path."""
    from rowfed_flower.federated_tuning import run_tuned_inprocess
    from rowfed_flower.tuning import LAM_RATIO, N_LAM1, N_LAM2
    from strategies.config import RowFedConfig
    from strategies.stats.tuning import CVOptions

    tune = ("gic-nq", (CVOptions(quiet=True), "auto", "auto", None))
    res = run_tuned_inprocess(RowFedConfig(), rowfed_data, "rowfed", tune)
    _, table = res.extra["tuning_table"]
    lam1s, lam2s = np.unique(table["lam1"]), np.unique(table["lam2"])
    assert len(table) == N_LAM1 * N_LAM2 and len(lam1s) == N_LAM1 and len(lam2s) == N_LAM2
    np.testing.assert_allclose(lam1s[-1] / lam1s[0], 1 / LAM_RATIO)
    clients = rowfed_data.clients
    n, q, p, m = sum(c.n for c in clients), clients[0].q, clients[0].p, len(clients)
    hand = np.log(table["rss"] / (n * q)) + np.log(np.log(n)) * np.log(p * q * m) * table["df"] / (
        n * q
    )
    np.testing.assert_allclose(table["gic_nq"], hand, rtol=1e-12)
    assert table["selected"].to_numpy().argmax() == int(np.argmin(hand))
    top = table[table["lam1"] == lam1s[-1]]
    assert (top["df"] <= p * q).all()  # one cluster a row: at most p q numbers
    edges = res.extra["tuning_metrics"]["at_grid_edge"]
    assert edges.get("lam1") != "largest"
    assert res.extra["tuning_metrics"]["tuning"]["grid"] == "lam_max"


def test_a_site_with_fewer_rows_of_a_class_than_folds_takes_part(tmp_path):
    """A site with 2 positive rows and 3 folds takes part in ``fit --tune cv``: it trains
    in every fold and has a validation AUC in the 2 folds that hold one of its positives;
    each fold's ``val_auc`` is the mean over the sites that fold can score (counted here,
    brute force over pairs, from the same fit run alone); metrics.json names the site."""
    from strategies.client.guards import Guards

    sites = simulate(1, 4, 3, 36, 60, 0.4, 3, seed=4242)
    pos = np.flatnonzero(sites[1].y_train == 1)
    keep = np.ones(len(sites[1].y_train), bool)
    keep[pos[2:]] = False
    s = sites[1]
    sites[1] = SiteData(s.site, s.lat, s.lon, s.x_train[keep], s.y_train[keep], s.x_test,
                        s.y_test, s.features)  # fmt: skip
    data, site_file = write_grauc_csv(str(tmp_path), sites)
    out = str(tmp_path / "fit")
    _ok("fit", "--data", data, "--sites", site_file, "--out", out, "--quiet", "--tune", "cv",
        "--folds", K, "--data-seed", SEED, "--lam-grid", "0.2", "--w-dist-grid", "1",
        "--ridge-grid", "0.1", "--size-power-grid", "0")  # fmt: skip
    assert _metrics(out)["tuning"]["partial_sites"] == {sites[1].site: 2}
    table = _read(out, "cv.csv")
    scored = 0
    for k in range(K):
        fold = _fold_sites(sites, k)
        fit = _alone(fold, 0.2, 1.0, 0.1, Guards.off())
        aucs = []
        for z, f in enumerate(fold):
            if 0 < f.y_test.sum() < len(f.y_test):  # both classes in this fold
                aucs.append(_pairs(f.x_test @ fit.coefficients[z], f.y_test)[0])
        scored += 0 < fold[1].y_test.sum()
        row = table[table["fold"] == k]
        assert len(row) == 1 and row["val_auc"].iloc[0] == pytest.approx(np.mean(aucs), rel=1e-9)
    assert scored == 2


def test_a_plain_fit_is_calibrated_from_its_own_settings_folds(files, tmp_path, capsys):
    """A fit without --tune: calibration.csv is each site's Firth recalibration of the
    out-of-fold scores of its own setting's fold fits (each run alone here), the
    coefficients are those of the fit without calibration (to the last digit), nothing is
    chosen (no cv.csv, no ``tuned``), and predict --probability works."""
    from test_calibration import _firth_reference

    sites = files[0]
    out, bare = str(tmp_path / "calibrated"), str(tmp_path / "bare")
    setting = ("--lam", "0.2", "--w-dist", "1", "--ridge", "0.1")
    _ok(*_fit_args(files, out, *setting, "--folds", K, "--data-seed", SEED))
    _ok(*_fit_args(files, bare, *setting, "--no-calibration"))
    got, want = _read(out, "coefficients.csv"), _read(bare, "coefficients.csv")
    assert np.array_equal(got.iloc[:, 1:].to_numpy(), want.iloc[:, 1:].to_numpy())
    m = _metrics(out)
    assert "tuned" not in m and not os.path.exists(os.path.join(out, "cv.csv"))
    assert m["calibration"]["folds"] == K and m["tuning"]["purpose"] == "calibration"
    cal = _read(out, "calibration.csv")
    for z, s in enumerate(sites):
        scores, ys = [], []
        for k in range(K):
            fold_sites = _fold_sites(sites, k)
            res = _alone(fold_sites, 0.2, 1.0, 0.1)
            scores.append(fold_sites[z].x_test @ res.coefficients[z])
            ys.append(fold_sites[z].y_test)
        row = cal[cal["site"] == s.site].iloc[0]
        ref = _firth_reference(np.concatenate(scores), np.concatenate(ys))
        np.testing.assert_allclose(
            row[["site_intercept", "site_slope"]].to_numpy(float), ref, rtol=1e-4, atol=1e-6
        )
    rows = pd.DataFrame(np.random.default_rng(5).normal(size=(4, 3)), columns=got.columns[1:])
    rows.insert(0, "site", [s.site for s in sites])
    data, pred = str(tmp_path / "new.csv"), str(tmp_path / "pred.csv")
    rows.to_csv(data, index=False)
    code, err = _main(capsys, "predict", "--model", out, "--data", data, "--out", pred,
                      "--probability")  # fmt: skip
    assert code == 0, err
    assert pd.read_csv(pred)["probability"].between(0, 1).all()


@pytest.mark.parametrize("method", ["grauc", "rowfed"])
def test_the_tuning_options_reach_a_flower_run(method):
    """``fit --engine flower`` passes the tuning's options as ``tune.*`` run-config keys:
    each method's ServerApp reads back the options ``fit`` was given."""
    from strategies.config import tune_config
    from strategies.runtime.tuning_options import tune_run_config
    from strategies.stats.tuning import CVOptions

    given = CVOptions(folds=4, rule="1se", tol=1e-4, max_rounds=33, seed=5, criterion="pooled",
                      repeats=2, max_fits=7)  # fmt: skip
    rc = tune_run_config("cv", given, {})
    if method == "grauc":
        from grauc_flower.federated_tuning import federated_options

        opts, _ = federated_options(tune_config(rc))
    else:
        from rowfed_flower.federated_tuning import federated_options

        opts = federated_options(tune_config(rc))[0]
    names = ("folds", "rule", "tol", "max_rounds", "seed", "criterion", "repeats", "max_fits")
    assert {k: getattr(opts, k) for k in names} == {k: getattr(given, k) for k in names}


def test_fifty_one_states_with_a_state_of_four_negatives_tune_to_the_end(tmp_path, capsys):
    """The issue's case at its size: 51 sites at the shipped state centroids, 30-200 rows
    each, DC with 4 negative rows: ``fit --tune cv`` with the default 5 folds runs to the
    end, DC trains in every fold and validates in the 4 it fills (named in ``metrics.json``),
    and every state has its own coefficients."""
    from strategies.datasets import __file__ as datasets_init

    states = pd.read_csv(os.path.join(os.path.dirname(datasets_init), "us_state_centroids.csv"))
    assert len(states) == 51
    rng = np.random.default_rng(51)
    sims = simulate(1, len(states), 4, 200, 0, 0.3, 3, seed=5151)
    frames = []
    for state, s in zip(states["state"], sims, strict=True):
        keep = rng.permutation(len(s.y_train))[: rng.integers(30, 200)]
        x, y = s.x_train[keep], s.y_train[keep]
        if state == "DC":
            keep = np.concatenate([np.flatnonzero(y == 0)[:4], np.flatnonzero(y == 1)])
            x, y = x[keep], y[keep]
        frame = pd.DataFrame(x, columns=[f"f{k}" for k in range(4)])
        frame.insert(0, "y", y)
        frame.insert(0, "site", state)
        frames.append(frame)
    data = pd.concat(frames)
    counts = data.groupby("site")["y"].agg(["size", "sum"])
    assert counts.loc["DC", "size"] - counts.loc["DC", "sum"] == 4
    assert ((counts["size"] - counts["sum"]).drop("DC") >= 5).all() and (counts["sum"] >= 5).all()
    data.to_csv(tmp_path / "data.csv", index=False)
    states.rename(columns={"state": "site"})[["site", "lat", "lon"]].to_csv(
        tmp_path / "sites.csv", index=False
    )
    out = str(tmp_path / "out")
    code, err = _main(capsys, "fit", "--data", tmp_path / "data.csv", "--sites",
                      tmp_path / "sites.csv", "--out", out, "--tune", "cv", "--lam-grid",
                      "0.3,0.03", "--w-dist-grid", "1", "--ridge-grid", "0.1")  # fmt: skip
    assert code == 0, err[-2000:]
    metrics = _metrics(out)
    assert metrics["tuning"]["partial_sites"] == {"DC": 4}
    cv = _read(out, "cv.csv")
    assert sorted(set(cv["fold"])) == [0, 1, 2, 3, 4]
    coef = _read(out, "coefficients.csv")
    assert sorted(coef["site"]) == sorted(states["state"])
