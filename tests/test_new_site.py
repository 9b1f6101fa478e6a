"""A site outside the federation (``predict --site``, docs/methods.md 3.13): the fused
penalty's answer for a site without rows against a conic solver, the new site's graph
neighbours against a minimum spanning tree computed here by brute force, the scores of the
command against those references, and every bad input one line, exit 2, nothing written."""

from __future__ import annotations

import json

import cvxpy as cp
import numpy as np
import pandas as pd
import pytest
from geopy.distance import geodesic
from scipy.sparse.csgraph import minimum_spanning_tree

from grauc_flower import federation as gfed
from grauc_flower.cli import main as grauc_main
from grauc_flower.data import simulate
from grauc_flower.graph import build_graph, edge_weights, new_site_neighbours
from strategies.config import GrAUCConfig
from strategies.stats.predict import combine, geometric_median, weighted_median

FEATURES = ["age", "bmi", "sbp"]


def _penalty_minimum(values, weights, norm):
    b = cp.Variable(values.shape[1])
    terms = [w * cp.norm(b - v, norm) for v, w in zip(values, weights, strict=True)]
    problem = cp.Problem(cp.Minimize(sum(terms)))
    problem.solve(solver=cp.CLARABEL)
    return problem.value


def _objective(b, values, weights, norm):
    return float(sum(w * np.linalg.norm(b - v, norm) for v, w in zip(values, weights, strict=True)))


@pytest.mark.parametrize("seed", range(6))
def test_weighted_median_minimizes_the_l1_penalty(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 7))
    values = rng.standard_normal((n, 4))
    values[rng.random((n, 4)) < 0.3] = 0.5  # shared values, as fused fits have
    weights = rng.choice([0.5, 1.0, 2.0], n) if seed % 2 else rng.random(n) + 0.1
    got = weighted_median(values, weights)
    want = _penalty_minimum(values, weights, 1)
    assert _objective(got, values, weights, 1) <= want + 1e-7 * max(1.0, abs(want))


def test_weighted_median_takes_the_middle_of_a_tie():
    # two equal weights: every point between them is a minimizer; the midpoint is chosen
    got = weighted_median(np.array([[0.0, 4.0], [2.0, -4.0]]), np.array([1.0, 1.0]))
    np.testing.assert_array_equal(got, [1.0, 0.0])
    # one heavier neighbour decides alone
    got = weighted_median(np.array([[0.0], [2.0], [7.0]]), np.array([1.0, 3.0, 1.0]))
    np.testing.assert_array_equal(got, [2.0])


@pytest.mark.parametrize("seed", range(6))
def test_geometric_median_minimizes_the_group_penalty(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 6))
    values = rng.standard_normal((n, 3))
    weights = rng.random(n) + 0.1
    if seed == 3:  # one heavy point: the answer is that point
        weights[0] = weights[1:].sum() + 1.0
    got = geometric_median(values, weights)
    want = _penalty_minimum(values, weights, 2)
    assert _objective(got, values, weights, 2) <= want + 1e-7 * max(1.0, abs(want))
    if seed == 3:
        np.testing.assert_array_equal(got, values[0])


def test_combine_on_the_working_scale():
    rng = np.random.default_rng(4)
    values, weights = rng.standard_normal((4, 3)), rng.random(4) + 0.5
    scale = np.array([1.0, 10.0, 0.1])
    got = combine(values, weights, "graph", "group", scale)
    want = geometric_median(values * scale, weights) / scale
    np.testing.assert_allclose(got, want, rtol=1e-12)
    # l1 is coordinate-wise: the scale does not matter
    np.testing.assert_allclose(
        combine(values, weights, "graph", "l1", scale), weighted_median(values, weights)
    )
    np.testing.assert_allclose(
        combine(values, weights, "inverse-distance"), weights @ values / weights.sum()
    )


def _geodesic(a, b):
    return geodesic(a, b).km


@pytest.mark.parametrize("seed", range(4))
def test_new_site_edges_are_its_edges_in_the_grown_spanning_tree(seed):
    rng = np.random.default_rng(seed)
    z = 9
    lat, lon = rng.uniform(30, 45, z), rng.uniform(-120, -80, z)
    new = (float(rng.uniform(30, 45)), float(rng.uniform(-120, -80)))
    points = [*zip(lat, lon, strict=True), new]
    d = np.array([[_geodesic(a, b) for b in points] for a in points])
    tree = minimum_spanning_tree(d).toarray()
    want = sorted(int(u) for u in range(z) if tree[u, z] > 0 or tree[z, u] > 0)
    u, dist, w = new_site_neighbours(lat, lon, *new, rule="graph", w_dist=1.5, q=0.01)
    assert list(u) == want
    np.testing.assert_allclose(dist, d[z, u], rtol=1e-9)
    # the fit's weights: the bandwidth of the fitted sites (median squared distance)
    h = np.median(d[:z, :z][np.triu_indices(z, 1)] ** 2)
    np.testing.assert_allclose(w, np.maximum(np.exp(-1.5 * d[z, u] ** 2 / h), 0.01), rtol=1e-9)
    assert build_graph(lat, lon).bandwidth == pytest.approx(h, rel=1e-9)
    # nearest and inverse distance by brute force
    order = np.argsort(d[z, :z])
    u, _, w = new_site_neighbours(lat, lon, *new, rule="nearest")
    assert list(u) == [order[0]] and list(w) == [1.0]
    u, dist, w = new_site_neighbours(lat, lon, *new, rule="inverse-distance")
    assert list(u) == list(order[:3])
    np.testing.assert_allclose(w, 1.0 / d[z, order[:3]], rtol=1e-9)


def test_new_site_edges_in_a_knn_and_a_complete_graph():
    rng = np.random.default_rng(7)
    lat, lon = rng.uniform(30, 45, 8), rng.uniform(-120, -80, 8)
    u, d, w = new_site_neighbours(lat, lon, 38.0, -100.0, rule="graph", kind="complete")
    assert list(u) == list(range(8)) and np.all(w == 1.0)
    u, d, _ = new_site_neighbours(lat, lon, 38.0, -100.0, rule="graph", kind="knn", k=2)
    far = [_geodesic((38.0, -100.0), p) for p in zip(lat, lon, strict=True)]
    assert set(np.argsort(far)[:2]) <= set(u)  # its own two nearest, and any site that has it
    assert edge_weights(d, 1.0, 0.0, 0.01).tolist() == [1.0] * len(d)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A GrAUC-PFL fit of 8 sites at a small lam (the sites' coefficients differ), written
    as the fit command writes it (coefficients.csv, metrics.json, sites.csv)."""
    root = tmp_path_factory.mktemp("newsite")
    sites = simulate(n_sites=8, n_features=3, n_train=40, seed=11)
    cfg = GrAUCConfig(lam=0.002, w_dist=1.0, max_rounds=60)
    res = gfed.run_methods_inprocess(cfg, sites, ["grauc"])["grauc"]
    model = root / "model"
    gfed.write_result(str(model), res, tuple(FEATURES), cfg)
    gfed.sites_table(sites).to_csv(model / "sites.csv", index=False)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((10, 3))
    return model, res, sites, x


def _predict(model, frame, tmp_path, *extra):
    frame.to_csv(tmp_path / "new.csv", index=False)
    out = tmp_path / "scores.csv"
    args = ["--model", model, "--data", tmp_path / "new.csv", "--out", out, *extra]
    try:
        code = grauc_main(["predict", *map(str, args)])
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    return code, out


@pytest.mark.parametrize("rule", ["graph", "nearest", "inverse-distance"])
def test_predict_scores_a_new_site_by_its_rule(fitted, tmp_path, capsys, rule):
    model, res, sites, x = fitted
    assert len({tuple(np.round(b, 6)) for b in res.coefficients}) > 2  # sites differ
    lat = np.array([s.lat for s in sites])
    lon = np.array([s.lon for s in sites])
    here = (float(lat.mean()) + 0.3, float(lon.mean()) - 0.2)
    frame = pd.DataFrame(x, columns=FEATURES)
    frame.insert(0, "site", ["NEW"] * 6 + [sites[2].site] * 4)
    code, out = _predict(model, frame, tmp_path, "--site", "NEW", "--lat", here[0], "--lon",
                         here[1], "--new-site-rule", rule)  # fmt: skip
    said = capsys.readouterr().out
    assert code == 0
    got = pd.read_csv(out, dtype={"site": str})
    assert list(got.columns) == ["row", "site", "score", "extrapolated"]
    assert got["extrapolated"].tolist() == [True] * 6 + [False] * 4
    # the reference: neighbours by geodesic brute force, coefficients by the rule
    d = np.array([_geodesic(here, p) for p in zip(lat, lon, strict=True)])
    if rule == "nearest":
        beta = res.coefficients[np.argmin(d)]
    elif rule == "inverse-distance":
        near = np.argsort(d)[:3]
        beta = (res.coefficients[near] / d[near, None]).sum(axis=0) / (1.0 / d[near]).sum()
    else:
        u, _, w = new_site_neighbours(lat, lon, *here, rule="graph", w_dist=1.0, q=0.01)
        values = res.coefficients[u]
        beta = weighted_median(values, w)
        assert _objective(beta, values, w, 1) <= _penalty_minimum(values, w, 1) + 1e-7
    np.testing.assert_allclose(got["score"][:6], x[:6] @ beta, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got["score"][6:], x[6:] @ res.coefficients[2], rtol=1e-12)
    assert "NEW was not in the federation" in said and "extrapolation" in said


def test_predict_a_new_site_at_a_fitted_sites_place_gets_its_model(fitted, tmp_path):
    model, res, sites, x = fitted
    frame = pd.DataFrame(x, columns=FEATURES)  # no site column: every row is --site's
    s = sites[5]
    code, out = _predict(model, frame, tmp_path, "--site", "H1", "--lat", s.lat, "--lon", s.lon)
    assert code == 0
    got = pd.read_csv(out)
    np.testing.assert_allclose(got["score"], x @ res.coefficients[5], rtol=1e-12)
    assert set(got["site"]) == {"H1"}


def test_predict_new_sites_from_a_file(fitted, tmp_path, capsys):
    model, res, sites, x = fitted
    places = {"site": ["H1", "H2"], "lat": [sites[0].lat, sites[1].lat]}
    places["lon"] = [sites[0].lon, sites[1].lon]
    pd.DataFrame(places).to_csv(tmp_path / "places.csv", index=False)
    frame = pd.DataFrame(x[:4], columns=FEATURES)
    frame.insert(0, "site", ["H1", "H2", "H2", sites[3].site])
    code, out = _predict(model, frame, tmp_path, "--sites", tmp_path / "places.csv",
                         "--new-site-rule", "nearest")  # fmt: skip
    assert code == 0
    got = pd.read_csv(out)
    want = [x[0] @ res.coefficients[0], x[1] @ res.coefficients[1], x[2] @ res.coefficients[1],
            x[3] @ res.coefficients[3]]  # fmt: skip
    np.testing.assert_allclose(got["score"], want, rtol=1e-12)
    assert capsys.readouterr().out.count("not in the federation") == 2


def test_metrics_record_the_working_scale(fitted):
    model, res, _, _ = fitted
    metrics = json.loads((model / "metrics.json").read_text())
    np.testing.assert_allclose(metrics["feature_scale"], res.extra["scale"])
    assert np.all(np.asarray(metrics["feature_scale"]) > 0)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--site", "NEW", "--lat", "35"], "site: 'NEW' needs both --lat and --lon"),
        (["--lat", "35", "--lon", "-100"], "site: --lat and --lon place the site named by --site"),
        (["--site", "NEW", "--lat", "95", "--lon", "0"], "lat must be within [-90, 90]"),
        (["--site", "NEW", "--lat", "35", "--lon", "-190"], "lon must be within [-180, 180]"),
        (["--site", "S1", "--lat", "35", "--lon", "-100"], "site: 'S1' is a site of the model"),
        ([], "site: 'NEW' is not a site of the model"),
        (["--site", "NEW", "--lat", "35", "--lon", "-100", "--new-site-rule", "kriging"],
         "argument --new-site-rule: invalid choice"),
    ],
)  # fmt: skip
def test_bad_new_site_input_is_one_line(fitted, tmp_path, capsys, extra, message):
    model, _, _, x = fitted
    frame = pd.DataFrame(x, columns=FEATURES)
    frame.insert(0, "site", "NEW")
    code, out = _predict(model, frame, tmp_path, *extra)
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1, err
    assert not out.exists()


def test_a_model_without_locations_refuses_a_new_site(fitted, tmp_path, capsys):
    model, _, _, x = fitted
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("coefficients.csv", "metrics.json"):
        (bare / name).write_text((model / name).read_text())
    frame = pd.DataFrame(x, columns=FEATURES)
    code, out = _predict(bare, frame, tmp_path, "--site", "NEW", "--lat", "35", "--lon", "-100")
    err = capsys.readouterr().err
    assert code == 2 and "model: no sites.csv in" in err and not out.exists()


def test_the_default_rule_is_nearest(fitted, tmp_path, capsys):
    model, res, sites, x = fitted
    lat = np.array([s.lat for s in sites])
    lon = np.array([s.lon for s in sites])
    here = (float(lat.mean()) + 0.3, float(lon.mean()) - 0.2)
    d = np.array([_geodesic(here, p) for p in zip(lat, lon, strict=True)])
    near = np.argsort(d)[:3]
    idw = (res.coefficients[near] / d[near, None]).sum(axis=0) / (1.0 / d[near]).sum()
    assert not np.allclose(idw, res.coefficients[near[0]])  # the rules differ here
    frame = pd.DataFrame(x, columns=FEATURES)
    place = ["--site", "NEW", "--lat", here[0], "--lon", here[1]]
    code, out = _predict(model, frame, tmp_path, *place)
    assert code == 0 and "by the nearest rule" in capsys.readouterr().out
    got = pd.read_csv(out)["score"].to_numpy()
    np.testing.assert_allclose(got, x @ res.coefficients[near[0]], rtol=1e-12)


def test_one_location_check_for_sites_files_node_configs_and_predict(tmp_path):
    """grauc_flower/data.py: location is the check behind a sites file, a node config and
    predict's --lat/--lon: the poles and the antimeridian pass, anything else is named."""
    from grauc_flower.data import load_site_file, location, read_sites
    from strategies.errors import InputError

    assert location("90", -180) == (90.0, -180.0) and location(-90.0, 180) == (-90.0, 180.0)
    for lat, lon, words in [
        (90.5, 0, "lat must be within [-90, 90], got 90.5"),
        (0, -180.01, "lon must be within [-180, 180], got -180.01"),
        (float("nan"), 0, "lat must be within [-90, 90], got nan"),
        ("north", 0, "lat must be a number, got 'north'"),
    ]:
        with pytest.raises(InputError) as exc:
            location(lat, lon)
        assert str(exc.value) == words
    sites = tmp_path / "sites.csv"
    sites.write_text("site,lat,lon\nA,10,20\nB,91,0\n")
    with pytest.raises(InputError, match=r"^sites: lat must be within \[-90, 90\] for site 'B'"):
        read_sites(str(sites))
    data = tmp_path / "a.csv"
    data.write_text("y,x1\n0,1.0\n1,2.0\n")
    with pytest.raises(InputError, match=r"^node-config: lon must be a number, got 'east'"):
        load_site_file(str(data), {"site": "A", "lat": "10", "lon": "east"})
    assert load_site_file(str(data), {"site": "A", "lat": "10", "lon": "-20.5"}).lon == -20.5
