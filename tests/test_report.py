"""report.html of a fit (both methods), read back with an HTML parser: every section there,
every image embedded, nothing fetched from outside, and the numbers it shows are the ones in
the fit's files.  Also the test MSE intervals RowFed writes, recomputed by hand."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest
from conftest import assert_self_contained, parse_page
from scipy.stats import norm

from grauc_flower.cli import main as grauc_main
from rowfed_flower.cli import main as rowfed_main
from strategies.report import FIT_SECTIONS


def _section_table(page: dict, section: str, columns: int) -> np.ndarray:
    cells = [c for s, c in page["cells"] if s == section]
    assert len(cells) % columns == 0
    return np.array(cells, dtype=object).reshape(-1, columns)


def _images(page: dict) -> dict[str, int]:
    counts: dict[str, int] = {}
    for section, _ in page["images"]:
        counts[section] = counts.get(section, 0) + 1
    return counts


def _grauc_fit(small_federation, out, *extra) -> dict:
    """Fit the small federation into ``out``; return its parsed page."""
    _, data, site_file = small_federation
    argv = ["fit", "--data", data, "--sites", site_file, "--out", str(out), "--quiet", *extra]
    assert grauc_main(argv) == 0
    return parse_page(str(out / "report.html"))


def test_grauc_fit_report(small_federation, tmp_path, capsys):
    out = tmp_path / "out"
    page = _grauc_fit(
        small_federation, out, "--holdout", "0.3", "--inference", "oracle", "--no-calibration"
    )
    assert page["sections"] == list(FIT_SECTIONS)
    assert_self_contained(page)
    images = _images(page)
    for section in ("map", "coefficients", "accuracy", "convergence"):
        assert images.get(section, 0) >= 1, section
    # the heatmap and the forest plot of the oracle intervals
    assert images["coefficients"] == 2 and "Oracle inference" in page["text"]
    assert "cv" not in images  # not tuned: a sentence, no curve
    assert "not tuned" in page["text"]

    test = pd.read_csv(out / "test.csv", dtype={"site": str})
    shown = _section_table(page, "accuracy", len(test.columns))
    assert list(shown[:, 0]) == list(test["site"])
    np.testing.assert_allclose(shown[:, 1].astype(float), test["auc"], rtol=1e-3)
    np.testing.assert_allclose(shown[:, 3].astype(float), test["lower"], rtol=1e-3)
    sites = pd.read_csv(out / "sites.csv", dtype={"site": str})
    assert list(sites["site"]) == list(test["site"])
    assert (sites["n_test_pos"] + sites["n_test_neg"] == test["n_pos"] + test["n_neg"]).all()

    # the page is rebuilt from the files alone
    os.remove(out / "report.html")
    capsys.readouterr()
    assert grauc_main(["report", "--model", str(out)]) == 0
    again = parse_page(str(out / "report.html"))
    assert again["sections"] == page["sections"] and len(again["images"]) == len(page["images"])


def test_grauc_report_without_test_rows_shows_in_sample_auc(small_federation, tmp_path):
    out = tmp_path / "out"
    page = _grauc_fit(small_federation, out, "--method", "individual")
    assert page["sections"] == list(FIT_SECTIONS)
    assert "in-sample" in page["text"]
    assert "one round" in page["text"]  # no convergence history for a one-round method
    metrics = json.loads((out / "metrics.json").read_text())
    shown = _section_table(page, "accuracy", 7)  # site, auc, auc_se, lower, upper, n_pos, n_neg
    for site, auc in zip(shown[:, 0], shown[:, 1].astype(float), strict=True):
        assert auc == pytest.approx(metrics["auc"][site]["auc"], rel=1e-3)


def test_report_of_a_directory_that_is_no_fit(tmp_path, capsys):
    code = rowfed_main(["report", "--model", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: model:")
    assert not os.path.exists(tmp_path / "report.html")


def _rowfed_frames(seed: int = 7):
    """Five clients, three predictors, two responses; a test file of new rows."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    for k in range(5):
        theta = np.array([[1.0, -0.5], [0.5 if k < 3 else -0.5, 0.0], [0.0, 0.0]])
        for rows, frames in ((40, train), (15, test)):
            x = rng.normal(size=(rows, 3))
            y = x @ theta + 0.5 * k + rng.normal(scale=0.6, size=(rows, 2))
            df = pd.DataFrame(x, columns=["a", "b", "c"])
            df.insert(0, "Y2", y[:, 1])
            df.insert(0, "Y1", y[:, 0])
            df.insert(0, "client", f"k{k}")
            frames.append(df)
    return pd.concat(train, ignore_index=True), pd.concat(test, ignore_index=True)


def test_rowfed_tuned_fit_report_and_test_intervals(tmp_path, capsys):
    train, test = _rowfed_frames()
    train_csv, test_csv = tmp_path / "train.csv", tmp_path / "test.csv"
    train.to_csv(train_csv, index=False)
    test.to_csv(test_csv, index=False)
    out = tmp_path / "out"
    argv = ["fit", "--data", str(train_csv), "--responses", "Y1,Y2", "--out", str(out)]
    grid = ["--tune", "cv", "--folds", "2", "--lam1-grid", "0.02,0.3", "--lam2-grid", "0.01,0.1"]
    oracle = ["--inference", "oracle"]
    assert rowfed_main([*argv, *grid, "--test-data", str(test_csv), "--jobs", "1", *oracle]) == 0
    page = parse_page(str(out / "report.html"))
    assert page["sections"] == list(FIT_SECTIONS)
    assert_self_contained(page)
    images = _images(page)
    for section in ("map", "coefficients", "cv", "accuracy", "convergence"):
        assert images.get(section, 0) >= 1, section
    # the heatmaps, the client groups and the forest plot of the oracle intervals
    assert images["coefficients"] == 3 and "Oracle inference" in page["text"]
    metrics = json.loads((out / "metrics.json").read_text())
    tuned = metrics["tuned"]
    assert f"chose lam1 = {tuned['lam1']:g}, lam2 = {tuned['lam2']:g}" in page["text"]

    # test.csv against predictions made here from coefficients.csv
    coef = pd.read_csv(out / "coefficients.csv")
    table = pd.read_csv(out / "test.csv")
    z = norm.ppf(0.975)
    for client, rows in test.groupby("client"):
        c = coef[coef["client"] == client].set_index("feature")
        pred = rows[["a", "b", "c"]].to_numpy() @ c.loc[["a", "b", "c"], ["Y1", "Y2"]].to_numpy()
        pred = pred + c.loc["(intercept)", ["Y1", "Y2"]].to_numpy(float)
        sq = (rows[["Y1", "Y2"]].to_numpy() - pred) ** 2
        for k, name in enumerate(("Y1", "Y2")):
            got = table[(table["client"] == client) & (table["response"] == name)].iloc[0]
            mse, se = sq[:, k].mean(), sq[:, k].std(ddof=1) / np.sqrt(len(sq))
            assert got["mse"] == pytest.approx(mse, rel=1e-8)
            assert got["mse_se"] == pytest.approx(se, rel=1e-8)
            assert got["lower"] == pytest.approx(max(0.0, mse - z * se), rel=1e-8, abs=1e-12)
            assert got["upper"] == pytest.approx(mse + z * se, rel=1e-8)
    shown = _section_table(page, "accuracy", len(table.columns))
    np.testing.assert_allclose(shown[:, 2].astype(float), table["mse"], rtol=1e-3)


@pytest.mark.parametrize("n_other", [3, 24])
def test_cv_curve_names_each_line_or_greys_out_all_but_the_chosen(n_other):
    """The CV figure's legend: a few settings each get a coloured, named line; many get one
    coloured line (the chosen setting's) and one grey entry for the rest -- never a legend
    of dozens of colours.  The star sits at the chosen setting's mean."""
    from matplotlib.colors import to_rgba

    from strategies.report import CV_LINES_IN_COLOUR, fig_cv_curve

    rng = np.random.default_rng(0)
    lam = np.r_[0.0, np.geomspace(1e-3, 1.0, 29)]  # the x axis: more values than ridge
    rows = [
        {"lam": v, "ridge": float(r), "mean": 0.8 + 0.1 * rng.random(), "se": 0.01}
        for r in range(n_other)
        for v in lam
    ]
    summary = pd.DataFrame(rows)
    pick = summary.iloc[3 * len(lam) - 4] if n_other > 2 else summary.iloc[5]
    chosen = {"lam": float(pick["lam"]), "ridge": float(pick["ridge"])}
    fig = fig_cv_curve(summary, ["lam", "ridge"], chosen, "mean validation AUC")
    ax = fig.axes[0]
    names = [t.get_text() for t in ax.get_legend().get_texts()]
    star = next(line for line in ax.get_lines() if line.get_marker() == "*")
    assert star.get_ydata()[0] == pytest.approx(pick["mean"])
    assert f"chosen: lam {chosen['lam']:g}" in names
    if n_other <= CV_LINES_IN_COLOUR:
        assert [n for n in names if n.startswith("ridge")] == [
            f"ridge {r:g}" for r in range(n_other)
        ]
    else:
        assert names == [f"ridge {chosen['ridge']:g}", "the other 23 settings", names[-1]]
        grey = [
            line
            for line in ax.get_lines()
            if line.get_label().startswith("_") and to_rgba(line.get_color())[:3] == (0.65,) * 3
        ]
        assert len(grey) == n_other - 1


def test_coefficient_colours_are_scaled_per_feature_and_the_values_shown(
    small_federation, tmp_path
):
    """The heatmap's colours divide each feature by its largest |coefficient| (so one large
    feature does not wash out the others); the values themselves are in a table beside it,
    equal to coefficients.csv."""
    from grauc_flower.figures import scaled_by_feature

    coef = np.array([[100.0, 0.1, 0.0], [-50.0, -0.3, 0.0], [25.0, 0.2, 0.0]])
    scaled, scale = scaled_by_feature(coef)
    np.testing.assert_allclose(scale, [100.0, 0.3, 1.0])
    np.testing.assert_allclose(scaled[:, 1], [1 / 3, -1.0, 2 / 3])
    assert np.abs(scaled).max(axis=0).tolist() == [1.0, 1.0, 0.0]

    out = tmp_path / "out"
    page = _grauc_fit(small_federation, out)
    table = pd.read_csv(out / "coefficients.csv", dtype={"site": str})
    shown = _section_table(page, "coefficients", len(table.columns))
    assert list(shown[:, 0]) == list(table["site"])
    np.testing.assert_allclose(
        shown[:, 1:].astype(float), table.iloc[:, 1:].to_numpy(), rtol=1e-3, atol=1e-4
    )


def _quiet_report(fit_report, out_dir) -> list[str]:
    """``fit_report(out_dir)`` again, recording every warning it raises (a library's
    warning would reach the user's terminal)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit_report(str(out_dir))
    return [f"{w.category.__name__}: {w.message}" for w in caught]


@pytest.mark.slow
def test_reports_at_the_papers_sizes_are_readable_and_quiet(tmp_path, capsys):
    """RowFed's report of 50 clients at p = q = 100 and GrAUC-PFL's of 50 sites at p = 100:
    no warning from any library, figures of a readable size (no side over 30 inches),
    at most 20 predictors (RowFed) or 30 features (GrAUC-PFL) in the coefficient heatmaps,
    chosen by how much they differ across sites, and the page under 2 MB."""
    import matplotlib.pyplot as plt

    from grauc_flower.figures import HEATMAP_FEATURES
    from grauc_flower.fitreport import fit_report as grauc_report
    from rowfed_flower.figures import MAX_VARIABLES
    from rowfed_flower.fitreport import fit_report as rowfed_report
    from rowfed_flower.fitreport import shown_predictors

    rng = np.random.default_rng(3)
    m, p, q, n = 50, 100, 100, 200
    frames = []
    for k in range(m):
        x = rng.standard_normal((n, p))
        y = x[:, :2] @ rng.standard_normal((2, q)) + rng.standard_normal((n, q))
        cols = {f"x{j}": x[:, j] for j in range(p)} | {f"Y{j}": y[:, j] for j in range(q)}
        frames.append(pd.DataFrame({"client": f"c{k:02d}", **cols}))
    data = tmp_path / "rowfed.csv"
    pd.concat(frames).to_csv(data, index=False)
    out = tmp_path / "rowfed"
    responses = ",".join(f"Y{j}" for j in range(q))
    args = ["fit", "--data", str(data), "--responses", responses, "--method", "nonfed"]
    assert rowfed_main([*args, "--out", str(out), "--quiet"]) == 0
    sizes = []
    real = plt.Figure.savefig

    def measured(fig, *a, **kw):
        sizes.append(tuple(fig.get_size_inches()))
        return real(fig, *a, **kw)

    plt.Figure.savefig = measured
    try:
        assert _quiet_report(rowfed_report, out) == []
        coef = pd.read_csv(out / "coefficients.csv")
        shown = shown_predictors(coef, [f"Y{j}" for j in range(4)])
        assert len(shown) == MAX_VARIABLES and {"x0", "x1"} <= set(shown)
        # GrAUC-PFL: 50 sites, 100 features
        rows, places = [], []
        for k in range(m):
            x = rng.standard_normal((60, p))
            y = (x[:, 0] + rng.standard_normal(60) > 0).astype(int)
            frame = pd.DataFrame(x, columns=[f"f{j}" for j in range(p)])
            frame.insert(0, "y", y)
            frame.insert(0, "site", f"H{k:02d}")
            rows.append(frame)
            places.append({"site": f"H{k:02d}", "lat": 30 + 15 * rng.random(),
                           "lon": -120 + 45 * rng.random()})  # fmt: skip
        pd.concat(rows).to_csv(tmp_path / "grauc.csv", index=False)
        pd.DataFrame(places).to_csv(tmp_path / "sites.csv", index=False)
        gout = tmp_path / "grauc"
        assert grauc_main(["fit", "--data", str(tmp_path / "grauc.csv"), "--sites",
                           str(tmp_path / "sites.csv"), "--method", "individual", "--out",
                           str(gout), "--quiet"]) == 0  # fmt: skip
        assert _quiet_report(grauc_report, gout) == []
    finally:
        plt.Figure.savefig = real
    assert sizes and max(max(s) for s in sizes) <= 30, sizes
    page = (gout / "report.html").read_text()
    assert f"the {HEATMAP_FEATURES} of {p} features whose coefficients differ most" in page
    for where in (out, gout):
        assert os.path.getsize(where / "report.html") < 2_000_000
