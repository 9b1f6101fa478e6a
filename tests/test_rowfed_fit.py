"""The fit command (``python -m rowfed_flower fit``): it reaches a cvxpy solution of §2.2
(lasso; entry and row sparsity; full and partial participation; with and without an
intercept; with federated standardization), writes the documented files, tunes by GIC,
and rejects bad input with one line and exit code 2 without writing anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import cvxpy as cp
import numpy as np
import pandas as pd
import pytest
from numpy.testing import assert_allclose

from rowfed_flower.cli import main
from rowfed_flower.datafit import LocalLeastSquares, fit_rowfed, gic_of_fit
from strategies.solvers.problems import build_problem

SIZES = (22, 30, 26, 35)  # rows per client (unequal on purpose)
P, Q = 4, 3
LAM1, LAM2 = 0.08, 0.06


def make_data(seed: int = 123):
    """Four clients; row 0 shared, row 1 two groups, row 2 client-specific, row 3 zero."""
    rng = np.random.default_rng(seed)
    m = len(SIZES)
    theta = np.zeros((m, P, Q))
    theta[:, 0] = [1.0, -0.5, 0.0]
    theta[:2, 1], theta[2:, 1] = [0.5, 0.5, -1.0], [-0.5, 0.0, 1.0]
    theta[:, 2] = rng.normal(scale=0.4, size=(m, Q))
    frames = []
    for k, n in enumerate(SIZES):
        x = rng.normal(size=(n, P)) * [1.0, 2.0, 0.5, 1.0] + [0.0, 1.0, -2.0, 0.5]
        y = x @ theta[k] + rng.normal(scale=0.7, size=(n, Q)) + np.array([1.0, -2.0, 0.5]) * (k + 1)
        df = pd.DataFrame(x, columns=[f"x{j}" for j in range(P)])
        for r in range(Q):
            df.insert(r, f"Y{r + 1}", y[:, r])  # responses before predictors: order is free
        df.insert(0, "client", f"site{k}")
        frames.append(df)
    df = pd.concat(frames, ignore_index=True)
    return df.sample(frac=1.0, random_state=seed)  # rows of clients interleaved


@pytest.fixture(scope="module")
def data_csv(tmp_path_factory):
    path = tmp_path_factory.mktemp("fitdata") / "data.csv"
    make_data().to_csv(path, index=False)
    return str(path)


@pytest.fixture(scope="module")
def blocks(data_csv):
    df = pd.read_csv(data_csv)
    out = []
    for k in range(len(SIZES)):
        d = df[df["client"] == f"site{k}"]
        out.append((d[[f"x{j}" for j in range(P)]].to_numpy(), d[["Y1", "Y2", "Y3"]].to_numpy()))
    return out


def srof_cvxpy(blocks, sparsity, intercept, scale=None):
    """§2.2 with the lasso (intercepts free), by Clarabel.  ``scale``: the penalty acts on
    ``scale_j theta_j`` (federated standardization).  Returns the optimal value."""
    m = len(blocks)
    s = np.ones(P) if scale is None else scale
    t = [cp.Variable((P, Q)) for _ in range(m)]
    b = [cp.Variable(Q) for _ in range(m)] if intercept else [np.zeros(Q)] * m
    loss = 0
    for (x, y), tm, bm in zip(blocks, t, b, strict=True):
        fitted = x @ tm + (
            np.ones((len(x), 1)) @ cp.reshape(bm, (1, Q), order="C") if intercept else 0
        )
        loss = loss + cp.sum_squares(y - fitted) / (2 * len(x))
    st = [np.diag(s) @ tm for tm in t]
    fusion = sum(
        cp.sum(cp.norm(st[u] - st[v], 2, axis=1)) for u in range(m) for v in range(u + 1, m)
    )
    if sparsity == "entry":
        sparse = sum(cp.sum(cp.abs(tm)) for tm in st)
    else:
        sparse = sum(cp.sum(cp.norm(tm, 2, axis=1)) for tm in st)
    prob = cp.Problem(cp.Minimize(loss + LAM1 * fusion + LAM2 * sparse))
    prob.solve(solver="CLARABEL", tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11)
    assert prob.status == "optimal"
    return prob.value


def srof_value(blocks, coef: pd.DataFrame, sparsity, scale=None):
    """docs/methods.md 2.2 at the coefficients read back from coefficients.csv."""
    s = np.ones(P) if scale is None else scale
    thetas, total = [], 0.0
    for k, (x, y) in enumerate(blocks):
        rows = coef[coef["client"] == f"site{k}"].set_index("feature")
        theta = rows.loc[[f"x{j}" for j in range(P)], ["Y1", "Y2", "Y3"]].to_numpy()
        b = (
            rows.loc["(intercept)", ["Y1", "Y2", "Y3"]].to_numpy()
            if "(intercept)" in rows.index
            else 0
        )
        total += np.sum((y - x @ theta - b) ** 2) / (2 * len(x))
        thetas.append(theta * s[:, None])
    th = np.stack(thetas)
    for u in range(len(th)):
        for v in range(u + 1, len(th)):
            total += LAM1 * np.sum(np.linalg.norm(th[u] - th[v], axis=1))
    if sparsity == "entry":
        total += LAM2 * np.sum(np.abs(th))
    else:
        total += LAM2 * np.sum(np.linalg.norm(th, axis=2))
    return total


def run_fit(data_csv, out, *extra):
    args = ["fit", "--data", data_csv, "--responses", "Y1,Y2,Y3", "--out", str(out), *extra]
    return main([str(a) for a in args])


# ---------------------------------------------------------------------------------------
# Central optimum
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("participation", ["1", "0.5"])
@pytest.mark.parametrize("sparsity", ["entry", "row"])
def test_fit_reaches_cvxpy(data_csv, blocks, tmp_path, sparsity, participation, capsys):
    out = tmp_path / "out"
    code = run_fit(
        data_csv,
        out,
        "--lam1",
        LAM1,
        "--lam2",
        LAM2,
        "--sparsity",
        sparsity,
        "--participation",
        participation,
        "--no-intercept",
        "--standardize",
        "none",
        "--tol",
        "1e-10",
        "--max-rounds",
        "20000",
        "--seed",
        "4",
    )
    assert code == 0, capsys.readouterr().err
    coef = pd.read_csv(out / "coefficients.csv")
    value = srof_cvxpy(blocks, sparsity, intercept=False)
    gap = (srof_value(blocks, coef, sparsity) - value) / abs(value)
    assert gap <= 1e-6
    assert gap >= -1e-9  # not below the optimum
    assert "(intercept)" not in set(coef["feature"])
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["converged"] is True
    assert metrics["config"]["participation"] == float(participation)


def test_fit_with_intercept_reaches_cvxpy(data_csv, blocks, tmp_path):
    out = tmp_path / "out"
    code = run_fit(
        data_csv,
        out,
        *("--lam1", LAM1, "--lam2", LAM2, "--standardize", "none"),
        *("--tol", "1e-10", "--max-rounds", "20000"),
    )
    assert code == 0
    coef = pd.read_csv(out / "coefficients.csv")
    assert list(coef.columns) == ["client", "feature", "Y1", "Y2", "Y3"]
    assert (coef["feature"] == "(intercept)").sum() == len(SIZES)
    value = srof_cvxpy(blocks, "entry", intercept=True)
    assert (srof_value(blocks, coef, "entry") - value) / abs(value) <= 1e-6


@pytest.mark.parametrize("flag", [("--standardize", "federated"), ()], ids=["given", "default"])
def test_fit_with_federated_standardization_reaches_cvxpy(data_csv, blocks, tmp_path, flag):
    out = tmp_path / "out"
    code = run_fit(
        data_csv,
        out,
        "--lam1",
        LAM1,
        "--lam2",
        LAM2,
        "--sparsity",
        "row",
        *flag,
        "--tol",
        "1e-10",
        "--max-rounds",
        "20000",
    )
    assert code == 0
    x = np.vstack([b[0] for b in blocks])
    scale = x.std(axis=0, ddof=1)  # pooled SD (from the clients' sums)
    coef = pd.read_csv(out / "coefficients.csv")
    value = srof_cvxpy(blocks, "row", intercept=True, scale=scale)
    assert (srof_value(blocks, coef, "row", scale) - value) / abs(value) <= 1e-6


# ---------------------------------------------------------------------------------------
# Output files
# ---------------------------------------------------------------------------------------
def test_output_files(data_csv, tmp_path, capsys):
    out = tmp_path / "out"
    assert run_fit(data_csv, out, "--lam1", "0.5", "--lam2", LAM2) == 0
    assert "converged" in capsys.readouterr().out
    assert sorted(os.listdir(out)) == [
        ".outputs",  # the files written, so that a later result here replaces this one
        "clusters.csv",
        "coefficients.csv",
        "history.csv",
        "metrics.json",
        "report.html",
    ]
    coef = pd.read_csv(out / "coefficients.csv")
    assert len(coef) == len(SIZES) * (P + 1)
    assert list(coef["client"].unique()) == ["site0", "site2", "site3", "site1"] or set(
        coef["client"]
    ) == {f"site{k}" for k in range(4)}
    hist = pd.read_csv(out / "history.csv")
    assert list(hist.columns) == [
        "round",
        "objective",
        "primal_residual",
        "dual_residual",
        "rho",
        "decrease",  # the lasso with full participation: the pqn algorithm's columns
        "step",
    ]
    assert hist["round"].tolist() == list(range(1, len(hist) + 1))
    clusters = pd.read_csv(out / "clusters.csv")
    assert list(clusters.columns[:2]) == ["feature", "n_clusters"]
    assert clusters["feature"].tolist() == [f"x{j}" for j in range(P)]
    assert set(clusters.columns[2:]) == {f"site{k}" for k in range(4)}
    labels = clusters.iloc[:, 2:].to_numpy()
    assert_allclose(clusters["n_clusters"], [len(set(r)) for r in labels])
    assert clusters.loc[0, "n_clusters"] == 1  # lam1 = 0.5 fuses the shared row 0
    # clients fused on a row have equal coefficient rows (up to the ADMM tolerance)
    row0 = coef[coef["feature"] == "x0"][["Y1", "Y2", "Y3"]].to_numpy()
    assert np.ptp(row0, axis=0).max() < 1e-4
    metrics = json.loads((out / "metrics.json").read_text())
    for key in (
        "method",
        "converged",
        "rounds",
        "objective",
        "lam1",
        "lam2",
        "gic",
        "clients",
        "config",
    ):
        assert key in metrics
    assert metrics["lam1"] == 0.5 and metrics["method"] == "rowfed"
    # writing again into an existing directory replaces the files
    assert run_fit(data_csv, out, "--method", "nonfed") == 0
    assert json.loads((out / "metrics.json").read_text())["method"] == "nonfed"


@pytest.mark.parametrize("method", ["nonfed", "fedavg", "perfl-lsma"])
def test_baselines_write_files(data_csv, tmp_path, method):
    out = tmp_path / method
    assert run_fit(data_csv, out, "--method", method, "--fedavg-rounds", "20") == 0
    coef = pd.read_csv(out / "coefficients.csv")
    theta = coef[coef["feature"] != "(intercept)"][["Y1", "Y2", "Y3"]].to_numpy()
    theta = theta.reshape(len(SIZES), P, Q)
    if method == "fedavg":  # one common Theta (intercepts stay per client)
        assert_allclose(theta, np.broadcast_to(theta[0], theta.shape))
    assert json.loads((out / "metrics.json").read_text())["method"] == method


# ---------------------------------------------------------------------------------------
# GIC tuning
# ---------------------------------------------------------------------------------------
def test_tune_gic(data_csv, blocks, tmp_path):
    out = tmp_path / "gic"
    code = run_fit(
        data_csv,
        out,
        "--tune",
        "gic",
        "--lam1-grid",
        "0.3,0.05",
        "--lam2-grid",
        "0.2,0.02",
        "--no-intercept",
        "--standardize",
        "none",
        "--tol",
        "1e-9",
        "--max-rounds",
        "20000",
    )
    assert code == 0
    table = pd.read_csv(out / "gic.csv")
    assert list(table.columns) == [
        "lam1",
        "lam2",
        "gic",
        "rss",
        "df",
        "rounds",
        "converged",
        "objective",
        "selected",
    ]
    assert len(table) == 4 and table["selected"].sum() == 1
    assert table["converged"].all()
    # warm-start order: lam1 decreasing, lam2 snaking
    assert table[["lam1", "lam2"]].values.tolist() == [
        [0.3, 0.2],
        [0.3, 0.02],
        [0.05, 0.02],
        [0.05, 0.2],
    ]
    best = table.loc[table["gic"].idxmin()]
    assert table.loc[table["selected"]].index[0] == table["gic"].idxmin()
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["tuning"]["selected"]["lam1"] == best["lam1"]
    assert metrics["tuning"]["selected"]["lam2"] == best["lam2"]
    assert metrics["lam1"] == best["lam1"]
    # each GIC equals the reference loop's GIC at that pair (a cold start, same optimum)
    fits = [LocalLeastSquares(x, y) for x, y in blocks]
    for _, row in table.iterrows():
        prob = build_problem(len(fits), "lasso", row["lam1"], row["lam2"], "entry")
        ref = fit_rowfed(fits, prob, rho=1.0, solver="prox", tol=1e-9, max_rounds=20000)
        assert_allclose(
            row["rss"], sum(f.rss(t) for f, t in zip(fits, ref.theta, strict=True)), rtol=1e-5
        )
        assert_allclose(row["gic"], gic_of_fit(fits, prob, ref.state), rtol=1e-4)


# ---------------------------------------------------------------------------------------
# Bad input: one line on stderr, exit code 2, no traceback, nothing written
# ---------------------------------------------------------------------------------------
def _bad_csv(tmp_path, kind):
    df = make_data()
    if kind == "text":
        df["x1"] = df["x1"].astype(object)
        df.iloc[5, df.columns.get_loc("x1")] = "abc"
    elif kind == "missing":
        df.iloc[3, df.columns.get_loc("Y2")] = np.nan
    elif kind == "one-row":
        df = pd.concat([df, df.iloc[[0]].assign(client="lonely")])
    elif kind == "x1-twice":  # pandas would read the second as 'x1.1'
        df = df.assign(extra=df["x2"]).rename(columns={"extra": "x1"})
    path = tmp_path / f"{kind}.csv"
    df.to_csv(path, index=False)
    return str(path)


CASES = [
    ("good", ["--responses", "Y1,Y9"], "responses: 'Y9' is not a column"),
    ("text", [], "column 'x1' has a non-numeric value"),
    ("missing", [], "column 'Y2' has a missing value at line 5 of the file"),
    ("one-row", [], "client 'lonely' has 1 row"),
    ("good", ["--penalty", "mcp", "--concavity", "0.5", "--rho", "1"], "concavity: MCP"),
    ("good", ["--penalty", "scad", "--concavity", "1.8", "--rho", "1"], "concavity: SCAD"),
    ("good", ["--participation", "0"], "participation: must be in (0, 1]"),
    ("good", ["--participation", "1.5"], "participation: must be in (0, 1]"),
    ("good", ["--lam1", "-0.1"], "lam1: must be >= 0"),
    ("good", ["--lam2", "-2"], "lam2: must be >= 0"),
    ("good", ["--lam1", "inf"], "lam1: must be a finite number"),
    ("good", ["--rho", "nan"], "rho: must be a finite number"),
    ("x1-twice", [], "data: column 'x1' appears twice"),
]


@pytest.mark.parametrize(("kind", "extra", "message"), CASES)
def test_bad_input_subprocess(tmp_path, kind, extra, message):
    data = _bad_csv(tmp_path, kind)
    out = tmp_path / "never"
    args = ["--data", data, "--responses", "Y1,Y2,Y3", "--out", str(out)]
    if "--responses" in extra:
        args = ["--data", data, "--out", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "rowfed_flower", "fit", *args, *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert message in lines[0]
    assert "Traceback" not in proc.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--tune", "gic", "--method", "fedavg"], "tune: gic is available for"),
        (["--participation", "2"], "participation: must be in (0, 1]"),
        (["--graph", "/no/such/graph.csv"], "graph: no such file"),
        (["--lam1", "abc"], "--lam1"),
        (["--tune", "gic", "--lam1", "0.1"], "lam1: chosen by --tune gic"),
        (["--tune", "gic", "--lam1-grid", "0.1,x"], "lam1-grid"),
        (["--tune", "gic", "--lam1-grid=nan"], "lam1-grid: values must be finite"),
        (["--tune", "gic", "--lam2-grid", ""], "lam2-grid: give one or more values"),
        (["--method", "fedavg", "--tune", "gic"], "tune:"),
        (["--max-rounds", "0"], "max-rounds: must be >= 1"),
    ],
)
def test_bad_options_inprocess(data_csv, tmp_path, capsys, extra, message):
    out = tmp_path / "never"
    assert run_fit(data_csv, out, *extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]
    assert not out.exists()


def test_graph_with_unknown_client(data_csv, tmp_path, capsys):
    graph = tmp_path / "g.csv"
    graph.write_text("u,v\nsite0,site1\nsite1,nowhere\n")
    assert run_fit(data_csv, tmp_path / "never", "--graph", graph) == 2
    assert "graph: unknown client 'nowhere'" in capsys.readouterr().err
    graph.write_text("u,v\nsite0,site1\nsite1,site2\nsite2,site3\n")
    assert run_fit(data_csv, tmp_path / "chain", "--graph", graph) == 0


def test_a_new_result_replaces_the_old_one(data_csv, tmp_path):
    """A second fit into the same folder leaves no file of the first that it did not write
    itself (an untuned fit writes no gic.csv), and never touches other files."""
    out = tmp_path / "out"
    grid = ["--tune", "gic", "--lam1-grid", "0.3,0.05", "--lam2-grid", "0.2"]
    assert run_fit(data_csv, out, *grid) == 0
    assert (out / "gic.csv").exists()
    (out / "notes.txt").write_text("mine")
    assert run_fit(data_csv, out, "--lam1", "0.5", "--lam2", LAM2) == 0
    written = (out / ".outputs").read_text().split()
    assert sorted(os.listdir(out)) == sorted([".outputs", "notes.txt", *written])
    assert "gic.csv" not in written and not (out / "gic.csv").exists()


def test_bench_checks_out_before_it_runs(tmp_path, capsys):
    from rowfed_flower.cli import main

    taken = tmp_path / "file"
    taken.write_text("")
    assert main(["bench", "--quick", "--out", str(taken)]) == 2  # at once, not after the runs
    assert "out: " in capsys.readouterr().err


def test_missing_parent_of_out_is_rejected(data_csv, tmp_path, capsys):
    out = tmp_path / "no" / "such" / "out"
    assert run_fit(data_csv, out) == 2
    assert "out: parent directory does not exist" in capsys.readouterr().err
    assert not (tmp_path / "no").exists()


# ---------------------------------------------------------------------------------------
# Through Flower's simulation engine (needs the rowfed keys in pyproject.toml)
# ---------------------------------------------------------------------------------------
@pytest.mark.flower
@pytest.mark.slow
def test_flower_engine_equals_inprocess(data_csv, tmp_path):
    outs = {}
    for engine in ("inprocess", "flower"):
        out = tmp_path / engine
        code = run_fit(
            data_csv,
            out,
            "--engine",
            engine,
            "--lam1",
            LAM1,
            "--lam2",
            LAM2,
            "--participation",
            "0.5",
            "--no-intercept",
            "--tol",
            "1e-8",
            "--max-rounds",
            "40",  # the engines agree round by round; reaching cvxpy: test_fit_reaches_cvxpy
            "--inference",
            "oracle",  # the moments travel in the evaluation answers of both engines
        )
        assert code == 0
        outs[engine] = out
    a = pd.read_csv(outs["inprocess"] / "coefficients.csv")
    b = pd.read_csv(outs["flower"] / "coefficients.csv")
    assert a[["client", "feature"]].equals(b[["client", "feature"]])
    assert_allclose(b[["Y1", "Y2", "Y3"]], a[["Y1", "Y2", "Y3"]], rtol=0, atol=1e-12)
    ha = pd.read_csv(outs["inprocess"] / "history.csv")
    hb = pd.read_csv(outs["flower"] / "history.csv")
    assert_allclose(hb.to_numpy(), ha.to_numpy(), rtol=1e-12)
    assert 1 < len(hb) < 40  # pqn with partial participation converged: its rounds, not ADMM's
    assert json.loads((outs["flower"] / "metrics.json").read_text())["converged"] is True
    ia = pd.read_csv(outs["inprocess"] / "inference.csv")
    ib = pd.read_csv(outs["flower"] / "inference.csv")
    assert ia[["client", "feature", "response", "kind"]].equals(
        ib[["client", "feature", "response", "kind"]]
    )
    assert_allclose(ib[["estimate", "se"]], ia[["estimate", "se"]], rtol=1e-10)


def test_spaced_client_ids_are_read_stripped_with_a_warning(tmp_path, caplog):
    """Client ids with spaces around them: the same clients and rows as the clean file, and
    a warning naming the column and the first such id."""
    from conftest import flwr_warnings

    from rowfed_flower.sources import read_fit_csv

    df = make_data()
    clean, spaced = str(tmp_path / "clean.csv"), str(tmp_path / "spaced.csv")
    df.to_csv(clean, index=False)
    first = df["client"].iloc[0]
    df.assign(client=df["client"].where(df["client"] != first, f"{first}   ")).to_csv(
        spaced, index=False
    )
    want = read_fit_csv(clean, "Y1,Y2,Y3")
    got, warned = flwr_warnings(caplog, lambda: read_fit_csv(spaced, "Y1,Y2,Y3"))
    assert [c.site for c in got.clients] == [c.site for c in want.clients]
    for g, w in zip(got.clients, want.clients, strict=True):
        np.testing.assert_array_equal(g.x, w.x)
    assert any(m.startswith("data: column 'client'") and "spaces" in m for m in warned), warned


@pytest.mark.parametrize(
    ("method", "words", "absent"),
    [
        ("rowfed", ["rowfed: converged after", "; lam1 = 0.05, lam2 = 0.02;"], []),
        ("nonfed", ["nonfed: converged after", "; lam2 = 0.02;"], ["lam1"]),
        (
            "fedprox",
            ["fedprox: ran 100 rounds (a fixed count);", "lam2 = 0.02, fedprox_mu = 0.01"],
            ["lam1"],
        ),
    ],
)
def test_the_summary_line_names_only_the_levels_the_method_reads(
    tmp_path, capsys, method, words, absent
):
    from rowfed_flower.cli import main

    data = str(tmp_path / "data.csv")
    make_data().to_csv(data, index=False)
    out = str(tmp_path / "out")
    capsys.readouterr()
    assert (
        main(["fit", "--data", data, "--responses", "Y1,Y2,Y3", "--method", method, "--out", out])
        == 0
    )
    line = capsys.readouterr().out.strip().splitlines()[-1]
    for w in words:
        assert w in line, line
    for w in absent:
        assert w not in line, line
    assert line.endswith(f"wrote {out}"), line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--num-clients", "0"], "error: num-clients: must be >= 1, got 0"),
        (["run", "--run-config", "rowfed.lam1"], "error: run-config: expected KEY=VALUE"),
    ],
)
def test_run_refuses_bad_input_in_one_line(args, message, capsys):
    """``run`` (both methods share it: strategies/runtime/cli.py) checks its input before
    Flower starts."""
    from grauc_flower.cli import main as grauc_main

    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err
    grauc_args = [a.replace("num-clients", "num-sites") for a in args]
    assert grauc_main(grauc_args) == 2
    err = capsys.readouterr().err
    assert err.startswith(message.replace("num-clients", "num-sites")), err
