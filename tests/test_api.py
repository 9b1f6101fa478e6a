"""The Python API (docs/api.md): its fits equal the command line's, bit for bit; its
files are the command line's; its predictions and scores agree with the command line's
``predict`` and with sums computed here from the coefficients; its errors name the
parameter; and every code block of docs/api.md runs."""

from __future__ import annotations

import json
import os
import re
import sys

import numpy as np
import pandas as pd
import pytest

from grauc_flower import GrAUCPFL
from grauc_flower.cli import main as grauc_main
from rowfed_flower import RowFed
from rowfed_flower.cli import main as rowfed_main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_rowfed_fit import make_data  # noqa: E402

RESPONSES = ["Y1", "Y2", "Y3"]


def _grauc_files(small_federation, tmp_path):
    sites, data, site_file = small_federation
    test = os.path.join(tmp_path, "test.csv")
    parts = []
    for s in sites:
        part = pd.DataFrame(s.x_test, columns=[f"f{k}" for k in range(s.x_test.shape[1])])
        part.insert(0, "y", s.y_test)
        part.insert(0, "site", s.site)
        parts.append(part)
    pd.concat(parts).to_csv(test, index=False)
    return data, site_file, test


def _coef(out: str, index) -> pd.DataFrame:
    frame = pd.read_csv(os.path.join(out, "coefficients.csv"), dtype={"site": str, "client": str})
    return frame.set_index(index)


def _files(out: str) -> set[str]:
    return {f for f in os.listdir(out) if not f.startswith(".")}


@pytest.mark.parametrize("method", ["grauc", "fedavg"])
def test_grauc_api_fit_is_the_command_lines(small_federation, tmp_path, method):
    """The same rows as data frames through the API and as files through ``fit``: the
    coefficients are equal bit for bit, ``save`` writes the same files, and ``load`` of
    the command line's directory reads the same model."""
    data, site_file, test = _grauc_files(small_federation, tmp_path)
    out = str(tmp_path / "cli")
    args = ["fit", "--data", data, "--sites", site_file, "--test-data", test, "--out", out]
    assert grauc_main([*args, "--method", method, "--quiet"]) == 0
    frame = pd.read_csv(data, dtype={"site": str})
    where = pd.read_csv(site_file, dtype={"site": str})
    model = GrAUCPFL(method=method).fit(frame, where, test_data=pd.read_csv(test))
    cli = _coef(out, "site")
    assert list(model.coef_.index) == list(cli.index)
    assert np.abs(model.coef_.to_numpy() - cli.to_numpy()).max() == 0.0
    assert model.metrics_["data"].startswith("(a data frame")
    saved = model.save(tmp_path / "api")
    assert _files(saved) == _files(out)
    with (
        open(os.path.join(saved, "coefficients.csv"), "rb") as a,
        open(os.path.join(out, "coefficients.csv"), "rb") as b,
    ):
        assert a.read() == b.read()
    loaded = GrAUCPFL.load(out)
    assert loaded.method_ == method and loaded.coef_.equals(model.coef_)
    assert loaded.n_rounds_ == model.n_rounds_


def test_grauc_predictions_and_scores(small_federation, tmp_path):
    """``predict_table`` (with risks) equals ``predict --probability``'s file;
    ``predict`` is ``x'beta`` of each row's site computed here; ``score``'s AUCs are the
    share of (positive, negative) pairs ranked right, counted pair by pair."""
    data, site_file, test = _grauc_files(small_federation, tmp_path)
    out = str(tmp_path / "cli")
    assert grauc_main(["fit", "--data", data, "--sites", site_file, "--out", out, "--quiet"]) == 0
    model = GrAUCPFL.load(out)
    pred = str(tmp_path / "pred.csv")
    args = ["predict", "--model", out, "--data", test, "--out", pred, "--probability"]
    assert grauc_main(args) == 0
    rows = pd.read_csv(test, dtype={"site": str})
    table = model.predict_table(rows, probability=True)
    expected = pd.read_csv(pred, dtype={"site": str})
    assert list(table.columns) == list(expected.columns)
    assert np.abs(table["score"] - expected["score"]).max() <= 1e-12
    assert np.abs(model.predict_proba(rows)[:, 1] - expected["probability"]).max() <= 1e-12
    features = [c for c in rows.columns if c not in ("site", "y")]
    beta = model.coef_.loc[rows["site"], features].to_numpy()
    by_hand = np.einsum("np,np->n", rows[features].to_numpy(), beta)
    assert np.abs(model.predict(rows) - by_hand).max() <= 1e-12
    scores = model.score(rows).set_index("site")
    for site, part in rows.assign(s=by_hand).groupby("site"):
        pos, neg = part.s[part.y == 1].to_numpy(), part.s[part.y == 0].to_numpy()
        diff = pos[:, None] - neg[None, :]
        auc = ((diff > 0).sum() + 0.5 * (diff == 0).sum()) / diff.size
        assert abs(scores.loc[site, "auc"] - auc) <= 1e-12
        assert scores.loc[site, "lower"] < auc < scores.loc[site, "upper"]
        assert (scores.loc[site, "n_pos"], scores.loc[site, "n_neg"]) == (len(pos), len(neg))


def _rowfed_csv(tmp_path) -> str:
    path = str(tmp_path / "rowfed.csv")
    make_data().to_csv(path, index=False)
    return path


@pytest.mark.parametrize(
    ("method", "extra"),
    [("rowfed", {"penalty": "scad"}), ("fedavg", {}), ("rowfed", {"tune": "gic"})],
)
def test_rowfed_api_fit_is_the_command_lines(tmp_path, method, extra):
    """RowFed (SCAD, and tuned by GIC) and FedAvg: the API's fit of the data frame equals
    ``fit`` of the file, bit for bit, with the same files and the same chosen levels."""
    data = _rowfed_csv(tmp_path)
    out = str(tmp_path / "cli")
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in extra.items()]
    args = ["fit", "--data", data, "--responses", ",".join(RESPONSES), "--out", out]
    assert rowfed_main([*args, "--method", method, "--holdout", "0.25", *flags, "--quiet"]) == 0
    frame = pd.read_csv(data, dtype={"client": str})
    model = RowFed(method=method, **extra).fit(frame, RESPONSES, holdout=0.25)
    cli = _coef(out, ["client", "feature"])
    cli = cli[cli.index.get_level_values("feature") != "(intercept)"]
    assert np.abs(model.coef_.to_numpy() - cli.to_numpy()).max() == 0.0
    assert model.tuned_ == json.load(open(os.path.join(out, "metrics.json"))).get(
        "tuned",
        (json.load(open(os.path.join(out, "metrics.json"))).get("tuning") or {}).get("selected"),
    )
    assert _files(model.save(tmp_path / "api")) == _files(out)


def test_rowfed_predictions_and_scores(tmp_path):
    """``predict`` is ``b_m + x'Theta_m`` of each row's client, computed here from
    ``coef_`` and ``intercept_``; ``score`` is each client's mean squared error of it."""
    frame = make_data()
    model = RowFed(intercept=True, lam1=0.08, lam2=0.06).fit(frame, RESPONSES)
    assert model.intercept_ is not None
    features = list(model.feature_names_in_)
    clients = frame["client"].astype(str)
    by_hand = np.stack(
        [
            model.intercept_.loc[c, RESPONSES].to_numpy()
            + x @ model.coef_.loc[c].loc[features, RESPONSES].to_numpy()
            for c, x in zip(clients, frame[features].to_numpy(), strict=True)
        ]
    )
    assert np.abs(model.predict(frame) - by_hand).max() <= 1e-12
    sq = ((frame[RESPONSES].to_numpy() - by_hand) ** 2).mean(axis=1)
    score = model.score(frame).set_index("client")
    for c in clients.unique():
        assert abs(score.loc[c, "mse"] - sq[clients.to_numpy() == c].mean()) <= 1e-12
        assert score.loc[c, "n"] == (clients == c).sum()


def test_errors_name_the_parameter(small_federation, tmp_path, capsys):
    """A bad value is a ValueError starting with the parameter's Python name; the same
    value on the command line is one ``error:`` line naming its option, exit 2."""
    cases = [
        (lambda: GrAUCPFL(w_dist=-1.0), "w_dist: must be >= 0"),
        (lambda: GrAUCPFL(lam="big"), "lam: must be a number"),
        (lambda: GrAUCPFL(max_rounds=2.5), "max_rounds: must be an integer"),
        (lambda: GrAUCPFL(method="svm"), "method: must be one of grauc"),
        (lambda: GrAUCPFL(calibration="yes"), "calibration: must be True or False"),
        (lambda: GrAUCPFL(sites="x.csv"), "sites: an argument of fit()"),
        (lambda: RowFed(penalty="ridge"), "penalty: must be one of"),
        (lambda: RowFed(lam1=-0.1), "lam1: must be >= 0"),
        (lambda: RowFed(colour=1), "colour: not a parameter of RowFed"),
        (lambda: RowFed().save(tmp_path / "x"), "model: this RowFed is not fitted"),
        (lambda: GrAUCPFL().fit(), "data: give data and sites"),
    ]
    for make, start in cases:
        with pytest.raises(ValueError) as err:
            make()
        assert str(err.value).startswith(start), (str(err.value), start)
        assert "\n" not in str(err.value)
    _, data, site_file = small_federation
    frame = pd.read_csv(data)
    with pytest.raises(ValueError, match=r"^folds: must be an integer >= 2"):
        GrAUCPFL(tune="cv", folds=1).fit(frame, pd.read_csv(site_file))
    out = tmp_path / "cli"
    code = grauc_main(["fit", "--data", data, "--sites", site_file, "--out", str(out),
                       "--w-dist", "-1"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and err == "error: w-dist: must be >= 0, got -1.0\n"
    assert not out.exists()


def test_params_round_trip(small_federation):
    """``get_params`` gives what was set; an estimator built from them fits the same."""
    _, data, site_file = small_federation
    frame, where = pd.read_csv(data), pd.read_csv(site_file)
    model = GrAUCPFL(lam=0.05, w_dist=2.0, calibration=False)
    assert model.get_params() == {"lam": 0.05, "w_dist": 2.0, "calibration": False}
    twin = GrAUCPFL(**model.get_params()).set_params(lam=0.05)
    assert "lam" in GrAUCPFL.param_names() and "data" not in GrAUCPFL.param_names()
    a, b = model.fit(frame, where), twin.fit(frame, where)
    assert a.coef_.equals(b.coef_) and a.settings_["lam"] == 0.05
    assert "calibration.csv" not in a._files  # calibration=False as on the command line


@pytest.mark.slow
@pytest.mark.flower
def test_engine_flower_gives_the_inprocess_numbers(small_federation):
    """``engine="flower"`` runs the fit through ``flwr run`` (a simulated SuperNode per
    site) and ends at the in-process fit's coefficients."""
    _, data, site_file = small_federation
    frame, where = pd.read_csv(data), pd.read_csv(site_file)
    here = GrAUCPFL(calibration=False).fit(frame, where)
    there = GrAUCPFL(calibration=False, engine="flower").fit(frame, where)
    assert there.metrics_["engine"] == "flower" and here.metrics_["engine"] == "inprocess"
    assert np.abs(here.coef_.to_numpy() - there.coef_.to_numpy()).max() <= 1e-12
    assert here.n_rounds_ == there.n_rounds_


@pytest.mark.slow
def test_docs_api_page_runs(tmp_path, monkeypatch, capsys):
    """Every ``python`` block of docs/api.md, in order, in one namespace."""
    with open(os.path.join(ROOT, "docs", "api.md"), encoding="utf-8") as fh:
        blocks = re.findall(r"```python\n(.*?)```", fh.read(), re.S)
    assert len(blocks) >= 8
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for k, code in enumerate(blocks):
        exec(compile(code, f"docs/api.md block {k + 1}", "exec"), namespace)  # noqa: S102
    shown = capsys.readouterr().out
    assert "GrAUCPFL(lam=0.1, w_dist=1.0)" in shown
    assert "w_dist: must be >= 0, got -1.0" in shown
    assert namespace["risk"].min() > 0 and namespace["risk"].max() < 1
    methods = [m for m, _ in namespace["rows"]]
    assert methods == ["grauc", "fedavg", "individual"]


def test_readme_python_lines_run(tmp_path, monkeypatch, capsys):
    """The README's five lines of Python run as shown and print the test AUC."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as fh:
        (code,) = re.findall(r"```python\n(.*?)```", fh.read(), re.S)
    assert len([line for line in code.splitlines() if line.strip()]) == 5
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert 0.5 < float(last.split()[-1]) <= 1.0
    assert namespace["model"].coef_.shape == (20, 10)


def test_frames_read_as_their_csv_files_would_be(tmp_path):
    """What a data frame holds that a CSV file cannot (float32, a date, a missing id) is
    read as the file would be; a file edited between two fits is read again; ids read from
    a file keep their zeros; a RowFed fit's own client column predicts."""
    from grauc_flower.api import example_data as grauc_data
    from rowfed_flower.api import example_data as rowfed_data

    train, test, sites = grauc_data(n_sites=4, n_train=40, n_test=20)
    f32 = train.astype({c: np.float32 for c in train.columns if c.startswith("x")})
    f32.to_csv(tmp_path / "f32.csv", index=False)
    sites.to_csv(tmp_path / "sites.csv", index=False)
    here = GrAUCPFL(calibration=False).fit(f32, sites).coef_
    there = GrAUCPFL(calibration=False).fit(str(tmp_path / "f32.csv"), str(tmp_path / "sites.csv"))
    assert np.abs(here.to_numpy() - there.coef_.to_numpy()).max() == 0.0
    with pytest.raises(ValueError, match=r"^data: column 'when' has a non-numeric value"):
        GrAUCPFL().fit(train.assign(when=pd.Timestamp("2020-01-01")), sites)
    flipped = f32.assign(x1=-f32["x1"])
    flipped.to_csv(tmp_path / "f32.csv", index=False)  # the same path, new rows
    again = GrAUCPFL(calibration=False).fit(str(tmp_path / "f32.csv"), str(tmp_path / "sites.csv"))
    assert np.allclose(again.coef_["x1"], -there.coef_["x1"], atol=1e-6)
    padded = test.assign(site="0" + test["site"].str[-1])
    where = sites.assign(site="0" + sites["site"].str[-1])
    model = GrAUCPFL(calibration=False).fit(train.assign(site="0" + train["site"].str[-1]), where)
    padded.to_csv(tmp_path / "test.csv", index=False)
    assert list(model.score(str(tmp_path / "test.csv"))["site"]) == list(where["site"])
    tr, te, resp = rowfed_data(num_clients=3, num_features=3, num_responses=2, n_train=30)
    holes = tr.astype({"client": object})
    holes.loc[5, "client"] = np.nan
    with pytest.raises(ValueError, match=r"^data: column 'client' has a missing value"):
        RowFed(lam1=0.1, lam2=0.1).fit(holes, resp)
    named = tr.rename(columns={"client": "h"})
    own = RowFed(lam1=0.1, lam2=0.1).fit(named, resp, client_column="h")
    assert list(own.score(te.rename(columns={"client": "h"}))["client"]) == ["0", "1", "2"]
    assert GrAUCPFL(seed=2**53 + 1).get_params()["seed"] == 2**53 + 1
    with pytest.raises(ValueError, match=r"^max_rounds: must be a finite number"):
        GrAUCPFL(max_rounds=float("inf"))


def test_load_restores_the_settings_the_fit_ran_with(tmp_path):
    """A loaded fit's parameters are the settings it ran with (a tuned fit's chosen
    levels, not its grid): refitting the loaded estimator gives the same coefficients."""
    from grauc_flower.api import example_data as grauc_data
    from rowfed_flower.api import example_data as rowfed_data

    train, _, sites = grauc_data(n_sites=5, n_train=60)
    fitted = GrAUCPFL(lam=0.05, w_dist=2.0, calibration=False).fit(train, sites)
    loaded = GrAUCPFL.load(fitted.save(tmp_path / "grauc"))
    assert loaded.get_params()["lam"] == 0.05 and loaded.get_params()["w_dist"] == 2.0
    again = loaded.set_params(calibration=False).fit(train, sites)
    assert np.abs(again.coef_.to_numpy() - fitted.coef_.to_numpy()).max() == 0.0
    tr, _, resp = rowfed_data(num_clients=3, num_features=3, num_responses=2, n_train=30)
    scad = RowFed(lam1=0.1, lam2=0.05, penalty="scad").fit(tr, resp)
    back = RowFed.load(scad.save(tmp_path / "rowfed"))
    assert back.get_params()["penalty"] == "scad" and back.method_ == "rowfed"
    assert np.abs(back.fit(tr, resp).coef_.to_numpy() - scad.coef_.to_numpy()).max() == 0.0
    tuned = RowFed(tune="gic").fit(tr, resp)
    chosen = RowFed.load(tuned.save(tmp_path / "tuned")).get_params()
    assert chosen["lam1"] == tuned.tuned_["lam1"] and "tune" not in chosen
