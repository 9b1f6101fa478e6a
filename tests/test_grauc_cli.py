"""The fit command's contract: outputs, bad input (one line, exit 2, nothing written), edge
cases that must work."""

from __future__ import annotations

import json
import os
from typing import NamedTuple

import numpy as np
import pandas as pd
import pytest
from conftest import flwr_warnings, run_module, write_grauc_csv

from grauc_flower.data import simulate


def _fit(data, sites, out, *extra):
    return run_module(
        "grauc_flower", "fit", "--data", data, "--sites", sites, "--out", out, "--quiet", *extra
    )


class _Proc(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def _fit_here(capsys, data, sites, out, *extra) -> _Proc:
    """The fit command in this process (``python -m grauc_flower`` calls the same
    ``main``); one test below runs it as a real process."""
    from grauc_flower.cli import main

    capsys.readouterr()
    try:
        code = main(["fit", "--data", data, "--sites", sites, "--out", out, "--quiet", *extra])
    except SystemExit as exc:  # argparse's errors
        code = exc.code
    captured = capsys.readouterr()
    return _Proc(code, captured.out, captured.err)


def _assert_rejected(proc, out, *words):
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in proc.stderr + proc.stdout
    for w in words:
        assert w in lines[0], lines[0]
    assert not os.path.exists(out)


HISTORY_COLUMNS = ["round", "objective", "primal_residual", "dual_residual", "rho", "n_answered"]


def test_fit_writes_the_contract(small_federation, tmp_path):
    sites, data, site_file = small_federation
    out = str(tmp_path / "out")
    proc = _fit(data, site_file, out, "--max-rounds", "40", "--algorithm", "admm")
    assert proc.returncode == 0, proc.stderr
    coef = pd.read_csv(os.path.join(out, "coefficients.csv"))
    assert list(coef.columns) == ["site", "f0", "f1", "f2", "f3"]
    assert list(coef["site"]) == [s.site for s in sites]
    hist = pd.read_csv(os.path.join(out, "history.csv"))
    assert list(hist.columns) == HISTORY_COLUMNS
    assert (hist["n_answered"] == len(sites)).all()
    assert len(hist) == 40 and list(hist["round"]) == list(range(1, 41))
    edges = pd.read_csv(os.path.join(out, "edges.csv"))
    assert len(edges) == len(sites) - 1
    assert {"site_u", "site_v", "distance_km", "weight"} <= set(edges.columns)
    metrics = json.load(open(os.path.join(out, "metrics.json")))
    assert metrics["rounds"] == 40 and metrics["engine"] == "inprocess"
    assert set(metrics["auc"]) == {s.site for s in sites}


def test_fit_pqn_history(small_federation, tmp_path):
    """The default algorithm adds its stopping measures to history.csv and converges."""
    sites, data, site_file = small_federation
    out = str(tmp_path / "out")
    proc = _fit(data, site_file, out, "--max-rounds", "60")
    assert proc.returncode == 0, proc.stderr
    hist = pd.read_csv(os.path.join(out, "history.csv"))
    assert list(hist.columns) == [*HISTORY_COLUMNS, "decrease", "step"]
    metrics = json.load(open(os.path.join(out, "metrics.json")))
    assert metrics["converged"] and metrics["rounds"] == len(hist) < 60
    # accepted steps never increase the objective (Armijo)
    assert (hist["objective"].diff().dropna() <= 1e-12).all()


def _frames(small_federation):
    sites, data, site_file = small_federation
    return pd.read_csv(data, dtype={"site": str}), pd.read_csv(site_file, dtype={"site": str})


@pytest.mark.parametrize(
    "case,words",
    [
        ("no_y", ["'y'"]),
        ("y_not_binary", ["'y'", "must be 0 or 1, found 2 at line 5 of the file"]),
        ("y_missing", ["'y'"]),
        ("feature_text", ["'f2'", "non-numeric value ('abc') at line 9 of the file"]),
        ("feature_inf", ["'f1'", "has an infinite value at line 4 of the file"]),
        ("feature_missing", ["'f1'", "missing"]),
        ("no_lat", ["'lat'"]),
        ("lat_range", ["lat", "must be within [-90, 90]"]),
        ("lon_range", ["lon", "must be within [-180, 180]"]),
        ("site_unknown", ["ZZ"]),
        ("site_twice", ["S1", "twice"]),
        ("missing_class", ["S2", "no positives"]),
        ("empty_data", ["empty"]),
        ("feature_twice", ["'f1'", "twice"]),
    ],
)
def test_bad_input_is_rejected(small_federation, tmp_path, capsys, case, words):
    data, sites = _frames(small_federation)
    if case == "no_y":
        data = data.drop(columns="y")
    elif case == "y_not_binary":
        data.loc[3, "y"] = 2
    elif case == "y_missing":
        data["y"] = data["y"].astype(object)
        data.loc[5, "y"] = None
    elif case == "feature_text":
        data["f2"] = data["f2"].astype(object)
        data.loc[7, "f2"] = "abc"
    elif case == "feature_inf":
        data.loc[2, "f1"] = np.inf
    elif case == "feature_missing":
        data.loc[4, "f1"] = np.nan
    elif case == "no_lat":
        sites = sites.drop(columns="lat")
    elif case == "lat_range":
        sites.loc[0, "lat"] = 95.0
    elif case == "lon_range":
        sites.loc[1, "lon"] = -200.0
    elif case == "site_unknown":
        data.loc[0, "site"] = "ZZ"
    elif case == "site_twice":
        sites = pd.concat([sites, sites.iloc[[0]].assign(lat=sites.loc[0, "lat"] + 1)])
    elif case == "missing_class":
        data = data[~((data["site"] == "S2") & (data["y"] == 1))]
    elif case == "feature_twice":  # pandas would read the second as 'f1.1'
        data = data.assign(extra=data["f2"]).rename(columns={"extra": "f1"})
    d = str(tmp_path / "d.csv")
    s = str(tmp_path / "s.csv")
    if case == "empty_data":
        open(d, "w").close()
    else:
        data.to_csv(d, index=False)
    sites.to_csv(s, index=False)
    out = str(tmp_path / "out")
    _assert_rejected(_fit_here(capsys, d, s, out), out, *words)


@pytest.mark.parametrize(
    "option,value,word",
    [
        ("--lam", "-0.1", "lam"),
        ("--rho", "0", "rho"),
        ("--ridge", "-1", "ridge"),
        ("--q", "1.5", "q"),
        ("--max-rounds", "0", "max-rounds"),
        ("--tol", "-1e-6", "tol"),
        ("--graph", "ring", "graph"),
        ("--lam", "inf", "lam: must be a finite number"),
        ("--ridge", "nan", "ridge: must be a finite number"),
        ("--checkpoint", "/no/such/dir/state.npz", "checkpoint: must be a file in an existing"),
        ("--participation", "0", "participation: must be in (0, 1]"),
        ("--participation", "1.5", "participation: must be in (0, 1]"),
    ],
)
def test_bad_settings_are_rejected(small_federation, tmp_path, capsys, option, value, word):
    _, data, sites = small_federation
    out = str(tmp_path / "out")
    _assert_rejected(_fit_here(capsys, data, sites, out, option, value), out, word)


@pytest.mark.parametrize("where", ["", "{tmp}/a-file/out", "/proc/no-such/out"])
def test_out_must_be_a_directory_we_can_write(small_federation, tmp_path, capsys, where):
    _, data, sites = small_federation
    (tmp_path / "a-file").write_text("")
    proc = _fit_here(capsys, data, sites, where.format(tmp=tmp_path))
    _assert_rejected(proc, str(tmp_path / "never"), "out: ")


def test_missing_data_file(small_federation, tmp_path):
    _, _, sites = small_federation
    out = str(tmp_path / "out")
    _assert_rejected(_fit(str(tmp_path / "nope.csv"), sites, out), out, "not found")


def test_missing_class_borrow_takes_the_neighbours_model(small_federation, tmp_path):
    data, sites = _frames(small_federation)
    data = data[~((data["site"] == "S2") & (data["y"] == 1))]
    d, s = str(tmp_path / "d.csv"), str(tmp_path / "s.csv")
    data.to_csv(d, index=False)
    sites.to_csv(s, index=False)
    out = str(tmp_path / "out")
    proc = _fit(
        d,
        s,
        out,
        "--missing-class",
        "borrow",
        "--lam",
        "0.5",
        "--tol",
        "1e-8",
        "--max-rounds",
        "2000",
        "--inference",
        "oracle",
    )
    assert proc.returncode == 0, proc.stderr
    coef = pd.read_csv(os.path.join(out, "coefficients.csv")).set_index("site")
    edges = pd.read_csv(os.path.join(out, "edges.csv"), dtype={"site_u": str, "site_v": str})
    nbrs = set(edges.loc[edges.site_u == "S2", "site_v"]) | set(
        edges.loc[edges.site_v == "S2", "site_u"]
    )
    # S2 has no datafit: its coefficients are fused to (lie between) its neighbours'
    lo = coef.loc[sorted(nbrs)].min(axis=0) - 1e-4
    hi = coef.loc[sorted(nbrs)].max(axis=0) + 1e-4
    assert ((coef.loc["S2"] >= lo) & (coef.loc["S2"] <= hi)).all()
    metrics = json.load(open(os.path.join(out, "metrics.json")))
    assert "S2" in metrics["sites_without_auc"]
    # the refit: where S2 is fused with sites that have data it shares their interval; where
    # it is alone it has no data and keeps its fitted coefficient without an interval
    inf = pd.read_csv(os.path.join(out, "inference.csv"), dtype={"site": str})
    clusters = pd.read_csv(os.path.join(out, "clusters.csv"), dtype={"site": str})
    clusters = clusters.set_index("site")
    s2 = inf[inf["site"] == "S2"].set_index("feature")
    for feature, row in s2.iterrows():
        alone = (clusters[feature] == clusters.loc["S2", feature]).sum() == 1
        assert row["kind"] == ("no-data" if alone else "fused")
        assert np.isnan(row["se"]) == alone
        if alone:
            assert row["estimate"] == pytest.approx(coef.loc["S2", feature], abs=1e-12)
    others = inf[inf["site"] != "S2"]
    assert np.isfinite(others["se"]).all() and (others["se"] > 0).all()


def test_valid_edge_cases(tmp_path):
    sites = simulate(n_sites=4, n_features=3, n_train=30, seed=4242)
    # one site alone
    d, s = write_grauc_csv(str(tmp_path), sites[:1])
    proc = _fit(d, s, str(tmp_path / "one"), "--inference", "oracle")
    assert proc.returncode == 0, proc.stderr
    coef = pd.read_csv(tmp_path / "one" / "coefficients.csv")
    assert len(coef) == 1
    # alone, the refit is the site's own fit: the same coefficients, each with an interval
    inf = pd.read_csv(tmp_path / "one" / "inference.csv")
    assert list(inf["kind"]) == ["unique"] * 3 and (inf["se"] > 0).all()
    np.testing.assert_allclose(inf["estimate"], coef.iloc[0, 1:].to_numpy(float), atol=1e-8)
    # all sites at the same place, and a constant feature
    same = [s_.__class__(**{**s_.__dict__, "lat": 10.0, "lon": 20.0}) for s_ in sites]
    const = [
        s_.__class__(
            **{**s_.__dict__, "x_train": np.column_stack([s_.x_train, np.ones(len(s_.y_train))])}
        )
        for s_ in same
    ]
    (tmp_path / "b").mkdir()
    d, s = write_grauc_csv(str(tmp_path / "b"), const)
    for standardize in ("none", "federated"):
        out = tmp_path / f"same-{standardize}"
        proc = _fit(
            d, s, str(out), "--standardize", standardize, "--max-rounds", "50", "--init", "zeros"
        )
        assert proc.returncode == 0, proc.stderr
        coef = pd.read_csv(out / "coefficients.csv")
        assert np.isfinite(coef.iloc[:, 1:].to_numpy()).all()
        assert len(pd.read_csv(out / "edges.csv")) == 3
        # the constant feature carries no information: from zero it stays exactly zero
        np.testing.assert_allclose(coef["f3"].to_numpy(), 0.0, atol=1e-8)


def test_spaced_site_ids_and_sites_without_data_are_read_with_a_warning(
    small_federation, tmp_path, caplog
):
    """Site ids with spaces around them are read stripped (same sites, same rows as the
    clean files) and a sites-file site with no data is left out; each says so in a warning."""
    from grauc_flower.data import load_csv

    _, data_path, sites_path = small_federation
    want, _ = load_csv(data_path, sites_path)
    data, sites = _frames(small_federation)
    first = sites["site"].iloc[0]
    data["site"] = data["site"].where(data["site"] != first, f"  {first} ")
    sites["site"] = sites["site"].where(sites["site"] != first, f"{first}  ")
    sites = pd.concat([sites, sites.iloc[[1]].assign(site="NO_DATA")])
    d, s = str(tmp_path / "d.csv"), str(tmp_path / "s.csv")
    data.to_csv(d, index=False)
    sites.to_csv(s, index=False)
    (got, _), warned = flwr_warnings(caplog, lambda: load_csv(d, s))
    assert [g.site for g in got] == [w.site for w in want]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g.x_train, w.x_train)
    assert any("data: column 'site'" in m and f"read as {first!r}" in m for m in warned), warned
    assert any(m.startswith("sites: column 'site'") for m in warned), warned
    assert any("no data rows" in m and "'NO_DATA'" in m for m in warned), warned
    _, clean = flwr_warnings(caplog, lambda: load_csv(data_path, sites_path))
    assert not [m for m in clean if "spaces" in m or "no data rows" in m]


@pytest.mark.parametrize(
    ("method", "words", "absent"),
    [
        ("grauc", ["grauc: converged after", "; lam = 0.1, w_dist = 1, ridge = 0.001;"], []),
        ("fedavg", ["fedavg: ran 100 rounds (a fixed count);", "; ridge = 0.001;"], ["lam ="]),
        ("individual", ["individual: converged after 1 round;"], ["objective", "lam ="]),
    ],
)
def test_the_summary_line_is_true_to_each_method(
    small_federation, tmp_path, capsys, method, words, absent
):
    """How the fit ended in the method's own terms (a fixed count of rounds for FedAvg, no
    objective where there is none), the levels it reads and no others; both methods print
    it by one function (strategies.runtime.cli.fit_summary)."""
    _, data, sites = small_federation
    out = str(tmp_path / "out")
    proc = _fit_here(capsys, data, sites, out, "--method", method)
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip().splitlines()[-1]
    for w in words:
        assert w in line, line
    for w in absent:
        assert w not in line, line
    assert line.endswith(f"wrote {out}") and "None" not in line, line


@pytest.mark.parametrize("package", ["grauc_flower", "rowfed_flower"])
def test_both_mains_return_their_exit_status(package, capsys):
    """Both methods' ``main`` (strategies/runtime/cli.py: run_main) return argparse's
    status instead of raising it: 0 for --help, 2 and one error line for a usage error."""
    import importlib

    main = importlib.import_module(f"{package}.cli").main
    assert main(["--help"]) == 0
    capsys.readouterr()
    assert main(["no-such-command"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: argument command: invalid choice: 'no-such-command'")


@pytest.mark.parametrize(
    "raised, line",
    [
        (ValueError("lam: must be\n   >= 0"), "error: lam: must be >= 0"),
        (
            FileNotFoundError(2, "No such file or directory", "x.csv"),
            "error: No such file or directory: x.csv",
        ),  # fmt: skip
        (RuntimeError("the run failed\ndetails"), "error: the run failed"),
        (KeyError("k"), "error: unexpected KeyError: 'k'"),
        (KeyboardInterrupt(), "error: interrupted"),
    ],
)
def test_run_main_turns_every_failure_into_one_line(raised, line, capsys):
    import argparse
    import logging

    from flwr.common.logger import FLOWER_LOGGER

    from strategies.runtime.cli import run_main

    def dispatch(args):
        raise raised

    parser = argparse.ArgumentParser()
    parser.add_argument("--verbose", action="store_true")
    FLOWER_LOGGER.setLevel(logging.INFO)
    assert run_main(parser, dispatch, ["--verbose"]) == 2
    assert FLOWER_LOGGER.level == logging.INFO  # --verbose keeps Flower's log
    assert capsys.readouterr().err.strip().splitlines() == [line]
    assert run_main(parser, dispatch, []) == 2
    assert FLOWER_LOGGER.level == logging.WARNING
