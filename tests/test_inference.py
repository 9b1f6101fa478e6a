"""RowFed's oracle inference (``--inference oracle``): the estimates and standard errors
computed by the server from the clients' sufficient statistics equal a least-squares fit of
the stacked raw data on the same structure, done here with numpy's lstsq; only the moments
leave a client, and only when asked."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.stats import t as student
from test_rowfed_fit import SIZES, make_data, run_fit

from rowfed_flower.client import ClientSamples, RowFedClient
from rowfed_flower.inference import MOMENT_KEYS


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
