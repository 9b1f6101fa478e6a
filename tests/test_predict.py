"""``predict`` for both methods: new rows scored with their own site's coefficients, the
same numbers as the fitted model's arrays; every bad input one line, exit 2, nothing
written."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from grauc_flower import federation as gfed
from grauc_flower.cli import main as grauc_main
from grauc_flower.data import simulate
from rowfed_flower import federation as rfed
from rowfed_flower import sources as rsources
from rowfed_flower.cli import main as rowfed_main
from strategies.config import GrAUCConfig, RowFedConfig

FEATURES = ["age", "bmi", "sbp"]


@pytest.fixture(scope="module")
def grauc_model(tmp_path_factory):
    root = tmp_path_factory.mktemp("grauc")
    sites = simulate(n_sites=4, n_features=3, n_train=40, seed=5)
    cfg = GrAUCConfig(max_rounds=20)
    res = gfed.run_methods_inprocess(cfg, sites, ["grauc"])["grauc"]
    gfed.write_result(str(root / "model"), res, tuple(FEATURES), cfg)
    rng = np.random.default_rng(0)
    picks = rng.integers(0, len(sites), 25)
    new = pd.DataFrame(rng.standard_normal((25, 3)), columns=FEATURES)
    new.insert(0, "site", [sites[z].site for z in picks])
    new.insert(1, "y", rng.integers(0, 2, 25))
    return root, res, new


@pytest.fixture(scope="module")
def rowfed_model(tmp_path_factory):
    root = tmp_path_factory.mktemp("rowfed")
    rng = np.random.default_rng(2)
    frames = []
    for m in range(3):
        x = rng.standard_normal((30, 3))
        y = x @ rng.standard_normal((3, 2)) + 1.5 + 0.3 * rng.standard_normal((30, 2))
        f = pd.DataFrame(x, columns=FEATURES)
        f.insert(0, "Y2", y[:, 1])
        f.insert(0, "Y1", y[:, 0])
        f.insert(0, "client", f"c{m}")
        frames.append(f)
    pd.concat(frames).to_csv(root / "train.csv", index=False)
    data = rsources.read_fit_csv(str(root / "train.csv"), "Y1,Y2")
    cfg = RowFedConfig()
    res = rfed.run_methods_inprocess(cfg, data, ["rowfed"])["rowfed"]
    rfed.write_result(str(root / "model"), res, data, cfg)
    new = pd.DataFrame(rng.standard_normal((12, 3)), columns=FEATURES)
    new.insert(0, "client", [f"c{k % 3}" for k in range(12)])
    return root, res, new


def run(main, *args):
    return main(["predict", *map(str, args)])


def predicted(main, model, new: pd.DataFrame, tmp_path, site_column: str) -> pd.DataFrame:
    """``predict`` on ``new`` (exit status 0 asserted); its output, read back."""
    new.to_csv(tmp_path / "new.csv", index=False)
    out = tmp_path / "predicted.csv"
    assert run(main, "--model", model, "--data", tmp_path / "new.csv", "--out", out) == 0
    return pd.read_csv(out, dtype={site_column: str})


def test_grauc_scores_are_each_sites_linear_score(grauc_model, tmp_path, capsys):
    root, res, new = grauc_model
    got = predicted(grauc_main, root / "model", new, tmp_path, "site")
    assert list(got.columns) == ["row", "site", "score"]
    assert list(got["row"]) == list(range(1, len(new) + 1))
    z = [res.sites.index(s) for s in new["site"]]
    want = np.einsum("np,np->n", new[FEATURES].to_numpy(), res.coefficients[z])
    np.testing.assert_allclose(got["score"], want, rtol=1e-12, atol=1e-12)
    assert "predicted 25 rows" in capsys.readouterr().out
    # the features in another order (every name there): the same scores
    shuffled = new[["site", "sbp", "age", "bmi"]]
    pd.testing.assert_frame_equal(
        predicted(grauc_main, root / "model", shuffled, tmp_path, "site"), got
    )


def test_rowfed_predictions_are_intercept_plus_theta(rowfed_model, tmp_path, capsys):
    root, res, new = rowfed_model
    got = predicted(rowfed_main, root / "model", new, tmp_path, "client")
    assert "predicted 12 rows for 3 clients;" in capsys.readouterr().out
    assert list(got.columns) == ["row", "client", "Y1", "Y2"]
    z = [res.sites.index(s) for s in new["client"]]
    x = new[FEATURES].to_numpy()
    want = res.intercept[z] + np.einsum("np,npq->nq", x, res.coefficients[z])
    np.testing.assert_allclose(got[["Y1", "Y2"]].to_numpy(), want, rtol=1e-12, atol=1e-12)
    assert np.abs(res.intercept).max() > 0.5  # the intercept is really used


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda f: f.assign(site=f["site"].where(f.index != 3, "ZZ")), "site: 'ZZ' is not a site"),
        (lambda f: f.drop(columns="bmi"), "features: missing from the data: bmi"),
        (lambda f: f.assign(chol=1.0), "features: not in the model: chol"),
        (lambda f: f.assign(age=f["age"].astype(object).where(f.index != 2, "old")), "'age'"),
        (lambda f: f.drop(columns="site"), "data: no 'site' column"),
    ],
)
def test_bad_data_is_refused_with_one_line(grauc_model, tmp_path, capsys, edit, message):
    root, _, new = grauc_model
    edit(new.copy()).to_csv(tmp_path / "new.csv", index=False)
    out = tmp_path / "scores.csv"
    code = run(grauc_main, "--model", root / "model", "--data", tmp_path / "new.csv", "--out", out)
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and message in err, err
    assert err.count("\n") == 1
    assert not out.exists() and list(tmp_path.iterdir()) == [tmp_path / "new.csv"]


def test_bad_model_or_output_is_refused(grauc_model, rowfed_model, tmp_path, capsys):
    root, _, new = grauc_model
    new.to_csv(tmp_path / "new.csv", index=False)
    cases = [
        (grauc_main, tmp_path, tmp_path / "s.csv", "model: no coefficients.csv in"),
        (grauc_main, tmp_path / "none", tmp_path / "s.csv", "model: not a directory"),
        (grauc_main, root / "model", tmp_path / "no" / "s.csv", "out: parent directory"),
        (rowfed_main, root / "model", tmp_path / "s.csv", "not a RowFed coefficients file"),
    ]
    for main, model, out, message in cases:
        code = run(main, "--model", model, "--data", tmp_path / "new.csv", "--out", out)
        err = capsys.readouterr().err
        assert code == 2 and message in err, err
        assert not out.exists()
