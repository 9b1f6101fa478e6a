"""``fit --tune cv`` and the held-out test sets of both methods, through the commands.

What is checked against what: the chosen setting against the per-fold table's means
(recomputed here), the refit against a plain fit at the chosen values, the test AUC and its
DeLong interval against a brute-force computation from ``coefficients.csv`` and the test
file, RowFed's test MSE against ``intercept + x Theta`` from ``coefficients.csv``, parallel
folds against serial ones; every bad input: one line, exit 2, nothing written."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest
from conftest import write_grauc_csv

from grauc_flower.data import simulate


def _main(module: str, capsys, *args) -> tuple[int, str]:
    import importlib

    main = importlib.import_module(f"{module}.cli").main
    capsys.readouterr()
    try:
        code = main([str(a) for a in args])
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def _rejected(code, err, out, *words):
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for w in words:
        assert w in lines[0], lines[0]
    assert not os.path.exists(out)


def _read(out, name):
    return pd.read_csv(os.path.join(out, name))


def _same_coefficients(a, b):
    """The two fits' coefficients.csv agree (1e-10): a tuned refit and a plain fit."""
    got, want = _read(a, "coefficients.csv"), _read(b, "coefficients.csv")
    np.testing.assert_allclose(got.iloc[:, 1:], want.iloc[:, 1:], atol=1e-10)


def _metrics(out):
    with open(os.path.join(out, "metrics.json")) as fh:
        return json.load(fh)


# ---------------------------------------------------------------------------------------
# GrAUC-PFL
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def grauc_files(tmp_path_factory):
    """Four sites, three features; a test file with the features in another order."""
    root = tmp_path_factory.mktemp("grauc_cv")
    sites = simulate(1, 4, 3, 36, 60, 0.4, 3, seed=4242)
    data, site_file = write_grauc_csv(str(root), sites)
    rows = []
    for s in sites:
        frame = pd.DataFrame(s.x_test, columns=["f0", "f1", "f2"])
        frame.insert(0, "y", s.y_test)
        frame.insert(0, "site", s.site)
        rows.append(frame)
    test = os.path.join(root, "test.csv")
    pd.concat(rows)[["site", "f2", "y", "f0", "f1"]].to_csv(test, index=False)
    return sites, data, site_file, test, root


def _grauc(capsys, files, out, *extra):
    _, data, site_file, _, _ = files
    return _main(
        "grauc_flower", capsys, "fit", "--data", data, "--sites", site_file, "--out", out,
        "--quiet", *extra,
    )  # fmt: skip


CV = ("--tune", "cv", "--folds", "3", "--w-dist-grid", "1", "--ridge-grid", "0.01,1")


def _delong(scores, y):
    """AUC and DeLong SE by brute force over all pairs."""
    pos, neg = scores[y == 1], scores[y == 0]
    psi = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])
    a = psi.mean()
    v10, v01 = psi.mean(axis=1), psi.mean(axis=0)
    var = v10.var(ddof=1) / len(pos) + v01.var(ddof=1) / len(neg)
    return a, np.sqrt(var)


def _assert_grid_edges(cv, params, m, err, skip=()):
    """``metrics.json: at_grid_edge`` and the warnings on stderr name exactly the tuned
    settings at the first or last value tried with the others at their tuned values (read
    off cv.csv) that is also the first or last of all the values that setting took, less
    ``skip``."""
    tuned = m["tuned"]
    want = {}
    for p in params:
        rows = cv
        for q in params:
            if q != p:
                rows = rows[rows[q] == tuned[q]]
        values, every = sorted(set(rows[p])), sorted(set(cv[p]))
        if len(values) > 1 and tuned[p] == values[0] == every[0]:
            want[p] = "smallest"
        elif len(values) > 1 and tuned[p] == values[-1] == every[-1]:
            want[p] = "largest"
    want = {p: e for p, e in want.items() if (p, e) not in skip}
    assert m["at_grid_edge"] == want
    lines = [x for x in err.splitlines() if x.startswith("warning: the tuned")]
    assert len(lines) == len(want), err
    for p, end in want.items():
        assert any(f"tuned {p} = " in x and f"the {end} value of its grid" in x for x in lines)
        assert any(f"widen --{p.replace('_', '-')}-grid" in x for x in lines)


def test_grauc_tune_cv_and_test_file(grauc_files, capsys, tmp_path):
    sites, _, _, test_file, _ = grauc_files
    out = str(tmp_path / "tuned")
    code, err = _grauc(capsys, grauc_files, out, *CV, "--jobs", "1", "--test-data", test_file)
    assert code == 0, err
    cv = _read(out, "cv.csv")
    assert list(cv.columns) == [
        "fold", "lam", "w_dist", "ridge", "size_power", "val_auc", "val_loss", "pooled_auc",
        "rounds", "converged",
    ]  # fmt: skip
    # 13 lam values (12 below lam_max and 0) per ridge, each in 3 folds; sites of one size:
    # one weighting (size_power 0, the default)
    assert len(cv) == 3 * 2 * 13 and set(cv["size_power"]) == {0.0}
    for _, grp in cv.groupby("ridge"):
        lams = np.sort(grp["lam"].unique())[::-1]
        assert lams[-1] == 0.0 and len(lams) == 13
        np.testing.assert_allclose(lams[1] / lams[0], 10 ** (-3 / 11), rtol=1e-12)
    mean = cv.groupby(["lam", "w_dist", "ridge"])["val_auc"].mean()
    best = max(mean.index[mean == mean.max()])  # ties: the most regularized
    m = _metrics(out)
    assert (m["tuned"]["lam"], m["tuned"]["w_dist"], m["tuned"]["ridge"]) == pytest.approx(best)
    assert m["cv"]["mean"] == pytest.approx(mean.max())
    # the automatic path's top is lam_max (every site fused): not an edge to widen
    _assert_grid_edges(cv, ["lam", "w_dist", "ridge"], m, err, skip=[("lam", "largest")])

    # the refit equals a plain fit at the chosen values
    plain = str(tmp_path / "plain")
    code, err = _grauc(
        capsys, grauc_files, plain,
        "--lam", repr(float(best[0])), "--w-dist", repr(float(best[1])),
        "--ridge", repr(float(best[2])),
    )  # fmt: skip
    assert code == 0, err
    _same_coefficients(out, plain)

    # test.csv: AUC and DeLong interval from coefficients.csv and the test file
    coef = _read(out, "coefficients.csv").set_index("site")
    test = pd.read_csv(test_file)
    table = _read(out, "test.csv").set_index("site")
    assert list(table.index) == [s.site for s in sites]
    for site, row in table.iterrows():
        rows = test[test["site"] == site]
        scores = rows[coef.columns].to_numpy() @ coef.loc[site].to_numpy()
        a, se = _delong(scores, rows["y"].to_numpy())
        assert row["auc"] == pytest.approx(a, abs=1e-12)
        assert row["auc_se"] == pytest.approx(se, rel=1e-9)
        assert row["lower"] == pytest.approx(max(a - 1.959963984540054 * se, 0), rel=1e-9)
        assert row["upper"] == pytest.approx(min(a + 1.959963984540054 * se, 1), rel=1e-9)
        assert (row["n_pos"], row["n_neg"]) == (int(rows["y"].sum()), int((rows["y"] == 0).sum()))
    assert m["test"]["mean_auc"] == pytest.approx(table["auc"].mean())
    assert m["split"]["test"] == "file" and m["split"]["n_test"] == len(test)


def test_grauc_parallel_folds_equal_serial_folds(grauc_files, capsys, tmp_path):
    grid = ("--tune", "cv", "--folds", "2", "--lam-grid", "1,0.1,0", "--w-dist-grid", "0,2")
    grid += ("--ridge-grid", "0.1,1")
    tables = []
    for jobs in ("1", "2"):
        out = str(tmp_path / f"jobs{jobs}")
        code, err = _grauc(capsys, grauc_files, out, *grid, "--jobs", jobs)
        assert code == 0, err
        tables.append(_read(out, "cv.csv"))
    pd.testing.assert_frame_equal(tables[0], tables[1])
    assert set(tables[0]["lam"]) == {1.0, 0.1, 0.0}


def test_grauc_baselines_tune_their_ridge_and_rounds(grauc_files, capsys, tmp_path):
    out = str(tmp_path / "fedavg")
    extra = ("--method", "fedavg", "--tune", "cv", "--folds", "2", "--ridge-grid", "0.01,1")
    code, err = _grauc(capsys, grauc_files, out, *extra, "--rounds-grid", "5,20", "--jobs", "1")
    assert code == 0, err
    cv = _read(out, "cv.csv")
    assert list(cv.columns) == [
        "fold", "ridge", "fedavg_rounds", "val_auc", "rounds", "converged",
    ]  # fmt: skip
    m = _metrics(out)
    added = m["cv"].get("extended", {}).get("fedavg_rounds", [])  # widened while rising
    assert sorted(set(cv["fedavg_rounds"])) == [5, 20, *added]
    assert len(cv) == 2 * 2 * (2 + len(added))
    mean = cv.groupby(["ridge", "fedavg_rounds"])["val_auc"].mean()
    best = max(mean.index[mean == mean.max()])  # ties: the larger ridge, more rounds
    assert (m["tuned"]["ridge"], m["tuned"]["fedavg_rounds"]) == pytest.approx(best)
    assert m["rounds"] == best[1]
    _assert_grid_edges(cv, ["ridge", "fedavg_rounds"], m, err)


@pytest.mark.parametrize(
    ("method", "knob", "grid"),
    [("ditto", "ditto_mu", "0.01,1"), ("ifca", "ifca_k", "1,2"), ("fedprox", "fedprox_mu", None)],
)
def test_grauc_comparators_tune_their_own_setting(
    grauc_files, capsys, tmp_path, method, knob, grid
):
    """A comparator's CV: ridge x its own setting (the default grid, or --knob-grid); the
    choice is the best mean validation AUC of cv.csv, and the refit uses it."""
    from strategies.stats.tuning import KNOBS

    out = str(tmp_path / method)
    extra = ("--method", method, "--tune", "cv", "--folds", "2", "--ridge-grid", "0.01,1")
    extra += ("--fedavg-rounds", "8", "--jobs", "1")
    code, err = _grauc(capsys, grauc_files, out, *extra, *(("--knob-grid", grid) if grid else ()))
    assert code == 0, err
    cv = _read(out, "cv.csv")
    assert list(cv.columns) == ["fold", "ridge", knob, "val_auc", "rounds", "converged"]
    values = [float(v) for v in grid.split(",")] if grid else list(KNOBS[method].grid)
    assert sorted(set(cv[knob])) == sorted(values)
    assert len(cv) == 2 * 2 * len(values)
    mean = cv.groupby(["ridge", knob], sort=False)["val_auc"].mean()
    best = mean.index[int(np.argmax(mean.to_numpy()))]  # ties: the first in grid order
    m = _metrics(out)
    assert (m["tuned"]["ridge"], m["tuned"][knob]) == pytest.approx(best)
    assert m["config"][knob.replace("_", "-")] == pytest.approx(best[1])


def test_fedavg_rounds_path_continues_one_run(grauc_files):
    """The CV's rounds path (5, then 15 more from the 5-round model) equals 20 rounds."""
    from grauc_flower.tuning import cv_piece
    from strategies.config import GrAUCConfig
    from strategies.runtime.engine import run_inprocess
    from strategies.server.grauc import GrAUCFedAvg
    from strategies.server.registry import Registry

    sites = grauc_files[0]
    cfg = GrAUCConfig(ridge=0.1)
    rows = cv_piece(("fedavg", 0, sites, cfg, (), {}, (5, 20), ()))
    from grauc_flower.client import GrAUCClient

    clients = [GrAUCClient(s, cfg.ridge, index=z) for z, s in enumerate(sites)]
    strategy = GrAUCFedAvg(cfg.replace(fedavg_rounds=20), len(sites), Registry())
    run_inprocess(strategy, clients, 21)
    aucs = [m["auc"] for m in strategy.evaluation.values()]
    assert rows[1]["val_auc"] == pytest.approx(np.mean(aucs), abs=1e-12)


def test_grauc_holdout(grauc_files, capsys, tmp_path):
    sites = grauc_files[0]
    out = str(tmp_path / "holdout")
    code, err = _grauc(capsys, grauc_files, out, "--holdout", "0.25", "--data-seed", "7")
    assert code == 0, err
    m = _metrics(out)
    expected = 0
    for s in sites:
        for cls in (0, 1):
            n = int(np.sum(s.y_train == cls))
            expected += min(int(np.floor(0.25 * n + 0.5)), n - 1)
    assert m["split"]["n_test"] == expected
    assert m["split"]["n_train"] + expected == sum(len(s.y_train) for s in sites)
    table = _read(out, "test.csv")
    assert int(table["n_pos"].sum() + table["n_neg"].sum()) == expected
    # the same seed draws the same rows; another seed others
    again = str(tmp_path / "again")
    assert _grauc(capsys, grauc_files, again, "--holdout", "0.25", "--data-seed", "7")[0] == 0
    pd.testing.assert_frame_equal(table, _read(again, "test.csv"))
    other = str(tmp_path / "other")
    assert _grauc(capsys, grauc_files, other, "--holdout", "0.25", "--data-seed", "8")[0] == 0
    assert not np.allclose(table["auc"], _read(other, "test.csv")["auc"])


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (("--holdout", "1.5"), ("holdout:", "(0, 1), got 1.5")),
        (("--holdout", "0"), ("holdout:", "got 0; leave --holdout out for no test set")),
        (("--holdout", "0.2", "--test-data", "TEST"), ("holdout:", "not both")),
        (("--test-data", "/no/such.csv"), ("test-data:", "not found")),
        (("--test-data", "UNKNOWN_SITE"), ("test-data:", "'zz'")),
        (("--test-data", "MISSING_FEATURE"), ("test-data:", "'f1'")),
        (("--tune", "cv", "--lam", "0.1"), ("lam:", "--lam-grid")),
        (("--tune", "cv", "--ridge", "0.1"), ("ridge:", "--ridge-grid")),
        (("--lam-grid", "1,0.1"), ("lam-grid:", "--tune cv")),
        (("--tune", "cv", "--folds", "1"), ("folds:", ">= 2")),
        (("--tune", "cv", "--lam-grid", "1,x"), ("lam-grid:",)),
        (("--tune", "cv", "--method", "pooled"), ("tune:",)),
        (("--tune", "cv", "--method", "fedavg", "--rounds-grid", "2.5"), ("rounds-grid:",)),
        (("--method", "ditto", "--knob-grid", "1"), ("knob-grid:", "--tune cv")),
        (("--tune", "cv", "--method", "ifca", "--knob-grid", "1.5"), ("knob-grid:", "integers")),
        (("--tune", "cv", "--method", "ditto", "--knob-grid", "0"), ("knob-grid:", "ditto-mu")),
        (("--tune", "cv", "--method", "krum", "--knob-grid", "1"), ("knob-grid:", "krum")),
        (("--tune", "cv", "--method", "fedavg", "--knob-grid", "1"), ("knob-grid:", "fedavg")),
        (("--tune", "cv", "--knob-grid", "1"), ("knob-grid:", "grauc")),
        (("--tune", "cv", "--method", "ditto", "--ditto-mu", "1"), ("ditto-mu:", "--knob-grid")),
    ],
)
def test_grauc_bad_tuning_and_test_input(grauc_files, capsys, tmp_path, extra, words):
    _, _, _, test_file, root = grauc_files
    test = pd.read_csv(test_file)
    files = {
        "TEST": test_file,
        "UNKNOWN_SITE": test.assign(site="zz"),
        "MISSING_FEATURE": test.drop(columns=["f1"]),
    }
    args = []
    for a in extra:
        if a in files and isinstance(files[a], pd.DataFrame):
            path = str(tmp_path / f"{a}.csv")
            files[a].to_csv(path, index=False)
            a = path
        elif a in files:
            a = files[a]
        args.append(a)
    out = str(tmp_path / "never")
    _rejected(*_grauc(capsys, grauc_files, out, *args), out, *words)


def test_real_sources_keep_their_own_split(capsys, tmp_path):
    out = str(tmp_path / "never")
    code, err = _main(
        "grauc_flower", capsys, "fit", "--source", "crime", "--holdout", "0.2", "--out", out
    )
    _rejected(code, err, out, "holdout:", "--train-fraction")


def test_grauc_tune_cv_weighs_sites_of_different_sizes_both_ways(capsys, tmp_path):
    """Sites of different sizes: the default grid tries the equal weighting and the one by
    rows (size_power 0 and 1), each with its own lam path (lam_max depends on the weights);
    the choice is cv.csv's best mean and the refit is a plain fit at it."""
    sites = simulate(2, 4, 3, 0, 60, 0.4, 3, seed=515)
    assert len({len(s.y_train) for s in sites}) > 1
    data, site_file = write_grauc_csv(str(tmp_path), sites)
    out = str(tmp_path / "tuned")
    base = ("fit", "--data", data, "--sites", site_file, "--quiet", "--ridge", "0.1")
    code, err = _main(
        "grauc_flower", capsys, *base[:-2], "--out", out, "--tune", "cv", "--folds", "3",
        "--w-dist-grid", "1", "--ridge-grid", "0.1", "--jobs", "1",
    )  # fmt: skip
    assert code == 0, err
    cv = _read(out, "cv.csv")
    assert set(cv["size_power"]) == {0.0, 1.0} and len(cv) == 3 * 2 * 13
    tops = cv.groupby("size_power")["lam"].max()
    assert abs(tops[0.0] - tops[1.0]) > 1e-6 * tops[0.0]
    mean = cv.groupby(["lam", "w_dist", "ridge", "size_power"])["val_auc"].mean()
    chosen = _metrics(out)["tuned"]
    got = (chosen["lam"], chosen["w_dist"], chosen["ridge"], chosen["size_power"])
    assert mean[got] == pytest.approx(mean.max())
    plain = str(tmp_path / "plain")
    code, err = _main(
        "grauc_flower", capsys, *base, "--out", plain, "--lam", repr(float(got[0])),
        "--w-dist", "1", "--size-power", repr(float(got[3])),
    )  # fmt: skip
    assert code == 0, err
    _same_coefficients(out, plain)
    bad = str(tmp_path / "bad")
    code, err = _main(
        "grauc_flower", capsys, *base[:-2], "--out", bad, "--tune", "cv", "--size-power", "1"
    )
    _rejected(code, err, bad, "size-power", "--size-power-grid")
    code, err = _main(
        "grauc_flower", capsys, *base[:-2], "--out", bad, "--tune", "cv", "--size-power-grid", "0,2"
    )
    _rejected(code, err, bad, "size-power")
    code, err = _main(
        "grauc_flower", capsys, *base[:-2], "--out", bad, "--method", "fedavg", "--tune", "cv",
        "--size-power-grid", "0,1",
    )  # fmt: skip
    _rejected(code, err, bad, "size-power-grid", "fedavg")


# ---------------------------------------------------------------------------------------
# RowFed
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def rowfed_files(tmp_path_factory):
    """Five clients, four predictors, two responses; clients 0-2 share a slope."""
    root = tmp_path_factory.mktemp("rowfed_cv")
    rng = np.random.default_rng(777)
    frames, tests = [], []
    for m in range(5):
        theta = np.array([[1.0, -0.5], [0.0, 0.0], [0.5, 0.5], [0.0, 1.0]])
        theta[0] += 0.8 * (m >= 3)
        for n, sink in ((30, frames), (12, tests)):
            x = rng.standard_normal((n, 4))
            y = 0.3 * m + x @ theta + 0.4 * rng.standard_normal((n, 2))
            frame = pd.DataFrame(x, columns=[f"x{j}" for j in range(4)])
            frame.insert(0, "client", f"c{m}")
            frame["Y1"], frame["Y2"] = y[:, 0], y[:, 1]
            sink.append(frame)
    data, test = os.path.join(root, "data.csv"), os.path.join(root, "test.csv")
    pd.concat(frames).to_csv(data, index=False)
    pd.concat(tests)[["Y2", "x3", "client", "x1", "x0", "Y1", "x2"]].to_csv(test, index=False)
    return data, test


def _rowfed(capsys, files, out, *extra):
    return _main(
        "rowfed_flower", capsys, "fit", "--data", files[0], "--responses", "Y1,Y2", "--out",
        out, *extra,
    )  # fmt: skip


def test_rowfed_tune_cv_and_test_file(rowfed_files, capsys, tmp_path):
    out = str(tmp_path / "tuned")
    grids = ("--lam1-grid", "0.3,0.05,0.01", "--lam2-grid", "0.05,0.005")
    code, err = _rowfed(
        capsys, rowfed_files, out, "--tune", "cv", "--folds", "3", *grids, "--jobs", "1",
        "--test-data", rowfed_files[1],
    )  # fmt: skip
    assert code == 0, err
    cv = _read(out, "cv.csv")
    columns = ["fold", "lam1", "lam2", "size_power", "val_mse", "pooled_mse", "rounds"]
    columns += ["converged"]
    assert list(cv.columns) == columns
    assert len(cv) == 3 * 3 * 2 and set(cv["size_power"]) == {0.0}  # clients of one size
    mean = cv.groupby(["lam1", "lam2"])["val_mse"].mean()
    m = _metrics(out)
    assert (m["tuned"]["lam1"], m["tuned"]["lam2"]) == pytest.approx(mean.idxmin())
    assert (m["lam1"], m["lam2"]) == pytest.approx(mean.idxmin())
    _assert_grid_edges(cv, ["lam1", "lam2"], m, err)

    coef = _read(out, "coefficients.csv")
    test = pd.read_csv(rowfed_files[1])
    table = _read(out, "test.csv")
    assert len(table) == 5 * 2
    for client, grp in coef.groupby("client"):
        rows = test[test["client"] == client]
        grp = grp.set_index("feature")
        x = rows[[f"x{j}" for j in range(4)]].to_numpy()
        pred = (
            grp.loc["(intercept)", ["Y1", "Y2"]].to_numpy()
            + x @ grp.loc[[f"x{j}" for j in range(4)], ["Y1", "Y2"]].to_numpy()
        )
        mse = ((rows[["Y1", "Y2"]].to_numpy() - pred) ** 2).mean(axis=0)
        got = table[table["client"] == client].set_index("response")["mse"]
        np.testing.assert_allclose(got[["Y1", "Y2"]].to_numpy(), mse, rtol=1e-9)
    assert m["test"]["mse"] == pytest.approx(table["mse"].mean())


def test_rowfed_tune_cv_weighs_clients_of_different_sizes_both_ways(rowfed_files, capsys, tmp_path):
    """Clients of 8 to 30 rows: the default grid tries size_power 0 and 1 for every
    (lam1, lam2); the choice is cv.csv's least mean and the refit is a plain fit at it."""
    frame = pd.read_csv(rowfed_files[0])
    keep = {"c0": 30, "c1": 8, "c2": 20, "c3": 12, "c4": 30}
    frame = frame[frame.groupby("client").cumcount() < frame["client"].map(keep)]
    data = str(tmp_path / "uneven.csv")
    frame.to_csv(data, index=False)
    files = (data, rowfed_files[1])
    out = str(tmp_path / "tuned")
    grids = ("--lam1-grid", "0.3,0.01", "--lam2-grid", "0.05")
    code, err = _rowfed(capsys, files, out, "--tune", "cv", "--folds", "3", *grids, "--jobs", "1")
    assert code == 0, err
    cv = _read(out, "cv.csv")
    assert set(cv["size_power"]) == {0.0, 1.0} and len(cv) == 3 * 2 * 2
    mean = cv.groupby(["lam1", "lam2", "size_power"])["val_mse"].mean()
    chosen = _metrics(out)["tuned"]
    assert mean[(chosen["lam1"], chosen["lam2"], chosen["size_power"])] == pytest.approx(mean.min())
    plain = str(tmp_path / "plain")
    code, err = _rowfed(
        capsys, files, plain, "--lam1", repr(chosen["lam1"]), "--lam2", repr(chosen["lam2"]),
        "--size-power", repr(chosen["size_power"]),
    )  # fmt: skip
    assert code == 0, err
    got, want = _read(out, "coefficients.csv"), _read(plain, "coefficients.csv")
    np.testing.assert_allclose(got.iloc[:, 2:], want.iloc[:, 2:], atol=1e-8)
    bad = str(tmp_path / "bad")
    code, err = _rowfed(capsys, files, bad, "--tune", "cv", "--size-power", "1")
    _rejected(code, err, bad, "size-power", "--size-power-grid")
    code, err = _rowfed(capsys, files, bad, "--size-power-grid", "0,1")
    _rejected(code, err, bad, "size-power-grid", "--tune cv")
    code, err = _rowfed(capsys, files, bad, "--tune", "cv", "--size-power-grid", "0,1.5")
    _rejected(code, err, bad, "size-power")
    code, err = _rowfed(
        capsys, files, bad, "--method", "nonfed", "--tune", "cv", "--size-power-grid", "0,1"
    )
    _rejected(code, err, bad, "size-power-grid", "nonfed")


def test_rowfed_comparator_tunes_lam2_and_its_own_setting(rowfed_files, capsys, tmp_path):
    """RowFed's Ditto by CV: lam2 x ditto-mu; the choice is cv.csv's least mean validation
    MSE, and the refit uses it."""
    out = str(tmp_path / "ditto")
    extra = ("--method", "ditto", "--tune", "cv", "--folds", "3", "--lam2-grid", "0.05,0.005")
    code, err = _rowfed(capsys, rowfed_files, out, *extra, "--knob-grid", "0.01,1", "--jobs", "1")
    assert code == 0, err
    cv = _read(out, "cv.csv")
    assert list(cv.columns) == ["fold", "lam2", "ditto_mu", "val_mse", "rounds", "converged"]
    assert len(cv) == 3 * 2 * 2
    mean = cv.groupby(["lam2", "ditto_mu"], sort=False)["val_mse"].mean()
    best = mean.index[int(np.argmin(mean.to_numpy()))]
    m = _metrics(out)
    assert (m["tuned"]["lam2"], m["tuned"]["ditto_mu"]) == pytest.approx(best)
    assert (m["config"]["lam2"], m["config"]["ditto-mu"]) == pytest.approx(best)


def test_rowfed_one_se_rule_picks_no_less_regularization(rowfed_files, capsys, tmp_path):
    grids = ("--lam1-grid", "0.3,0.05,0.01", "--lam2-grid", "0.05,0.005", "--folds", "3")
    chosen = {}
    for rule in ("best", "1se"):
        out = str(tmp_path / rule)
        code, err = _rowfed(
            capsys, rowfed_files, out, "--tune", "cv", *grids, "--cv-rule", rule, "--jobs", "1"
        )
        assert code == 0, err
        chosen[rule] = _metrics(out)["tuned"]
    cv = _read(str(tmp_path / "1se"), "cv.csv")
    stats = cv.groupby(["lam1", "lam2"])["val_mse"].agg(["mean", "std"])
    best = stats["mean"].idxmin()
    limit = stats.loc[best, "mean"] + stats.loc[best, "std"] / np.sqrt(3)
    near = stats[stats["mean"] <= limit].index
    assert (chosen["1se"]["lam1"], chosen["1se"]["lam2"]) == max(near)
    assert chosen["1se"]["lam1"] >= chosen["best"]["lam1"]


def test_rowfed_holdout(rowfed_files, capsys, tmp_path):
    out = str(tmp_path / "holdout")
    code, err = _rowfed(capsys, rowfed_files, out, "--holdout", "0.2")
    assert code == 0, err
    m = _metrics(out)
    assert m["split"]["n_test"] == 5 * 6 and m["split"]["n_train"] == 5 * 24
    assert set(_read(out, "test.csv")["client"]) == {f"c{m}" for m in range(5)}


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (("--holdout", "1.2"), ("holdout:",)),
        (("--holdout", "0"), ("holdout:", "leave --holdout out for no test set")),
        (("--holdout", "0.2", "--test-data", "TEST"), ("holdout:", "not both")),
        (("--test-data", "UNKNOWN"), ("test-data:", "'zz'")),
        (("--test-data", "MISSING"), ("test-data:", "'x2'")),
        (("--tune", "cv", "--lam2", "0.1"), ("lam2:", "--lam2-grid")),
        (("--tune", "cv", "--folds", "1"), ("folds:",)),
        (("--tune", "cv", "--folds", "31"), ("folds:", "no client has 31", "at most 30")),
        (("--lam2-grid", "0.1"), ("lam2-grid:", "--tune")),
        (("--method", "ditto", "--knob-grid", "1"), ("knob-grid:", "--tune cv")),
        (("--tune", "gic", "--method", "ditto"), ("tune:", "--tune cv")),
        (("--tune", "cv", "--method", "ifca", "--knob-grid", "0"), ("knob-grid:", "ifca-k")),
        (("--tune", "cv", "--method", "rowfed", "--knob-grid", "1"), ("knob-grid:", "rowfed")),
        (("--tune", "cv", "--method", "ditto", "--ditto-mu", "1"), ("ditto-mu:", "--knob-grid")),
    ],
)
def test_rowfed_bad_tuning_and_test_input(rowfed_files, capsys, tmp_path, extra, words):
    test = pd.read_csv(rowfed_files[1])
    made = {"UNKNOWN": test.assign(client="zz"), "MISSING": test.drop(columns=["x2"])}
    args = []
    for a in extra:
        if a == "TEST":
            a = rowfed_files[1]
        elif a in made:
            path = str(tmp_path / f"{a}.csv")
            made[a].to_csv(path, index=False)
            a = path
        args.append(a)
    out = str(tmp_path / "never")
    _rejected(*_rowfed(capsys, rowfed_files, out, *args), out, *words)


# ---------------------------------------------------------------------------------------
# stopping
# ---------------------------------------------------------------------------------------
def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry))
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_sigterm_stops_the_cv_workers(tmp_path):
    """A fit stopped while its folds run in worker processes: one line, exit 2, nothing
    written, and no worker left running."""
    import signal
    import subprocess
    import sys
    import time

    from conftest import ROOT

    out = str(tmp_path / "never")
    # a comparator's cross-validation runs in worker processes (a fused method's in the
    # federation, one batched run)
    cmd = [sys.executable, "-m", "grauc_flower", "fit", "--source", "simulated", "--tune", "cv"]
    cmd += ["--method", "ditto"]
    proc = subprocess.Popen(
        [*cmd, "--jobs", "2", "--out", out], cwd=ROOT, stderr=subprocess.PIPE, text=True
    )
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while len(workers) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
            workers = _children(proc.pid)
        assert len(workers) >= 2, "the worker processes did not start"
        time.sleep(2)
        proc.send_signal(signal.SIGTERM)
        err = proc.communicate(timeout=60)[1]
        assert proc.returncode == 2
        assert err.strip().splitlines()[-1] == "error: interrupted"
        assert "Traceback" not in err
        time.sleep(1)
        assert not [w for w in workers if _alive(w)]
        assert not os.path.exists(out)
    finally:
        for pid in [proc.pid, *workers]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        proc.wait()


def test_fedavg_rounds_grid_is_widened_while_cv_chooses_its_largest(grauc_files, capsys, tmp_path):
    """FedAvg still improving at the most rounds tried: the rounds grid is doubled (up to
    ROUNDS_BOUND times its largest value) and the cross-validation redone; the choice is the
    best of the widened grid, and metrics.json says what was added."""
    from grauc_flower.tuning import ROUNDS_BOUND

    out = str(tmp_path / "fedavg")
    extra = ("--method", "fedavg", "--tune", "cv", "--folds", "2", "--ridge-grid", "0.01")
    code, err = _grauc(capsys, grauc_files, out, *extra, "--rounds-grid", "1,2", "--jobs", "1")
    assert code == 0, err
    cv = _read(out, "cv.csv")
    m = _metrics(out)
    tried = sorted(set(cv["fedavg_rounds"]))
    added = m["cv"].get("extended", {}).get("fedavg_rounds", [])
    assert tried == [1, 2, *added] and max(tried) <= ROUNDS_BOUND * 2
    mean = cv.groupby("fedavg_rounds")["val_auc"].mean()
    assert m["tuned"]["fedavg_rounds"] == max(mean.index[mean == mean.max()])
    # each widening happened because the grid before it chose its largest value
    for k, r in enumerate(added):
        before = mean.loc[[1, 2, *added[:k]]]
        assert max(before.index[before == before.max()]) == r // 2
    assert added, "one or two rounds of FedAvg should leave the CV rising"
    if added[-1] < ROUNDS_BOUND * 2:  # stopped before the bound: the choice is inside
        assert m["tuned"]["fedavg_rounds"] < added[-1]
    else:
        assert ("fedavg_rounds" in m["at_grid_edge"]) == (m["tuned"]["fedavg_rounds"] == 8)
