"""Disclosure guards a site sets for itself (strategies/client/guards.py): a site below its floor
of rows (of a class) refuses to register, a site below its floor of rows per feature
refuses second moments; the server stops such a run before its first round naming the
site and the guard; the node config's keys are checked; the CLI's refusal is one line."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from grauc_flower import federation as gfed
from grauc_flower.cli import main as grauc_main
from grauc_flower.client import GrAUCClient
from grauc_flower.data import SiteData, simulate
from rowfed_flower import federation as rfed
from rowfed_flower import sources as rsources
from rowfed_flower.client import ClientSamples, RowFedClient
from strategies.client.guards import Guards
from strategies.config import GrAUCConfig, RowFedConfig
from strategies.errors import InputError, SiteInputError
from strategies.runtime.engine import run_inprocess
from strategies.server.registry import Registry


def _with_positives(site: SiteData, k: int) -> SiteData:
    """``site`` with only its first ``k`` positive training rows."""
    pos = np.flatnonzero(site.y_train == 1)
    keep = np.ones(len(site.y_train), bool)
    keep[pos[k:]] = False
    return SiteData(site.site, site.lat, site.lon, site.x_train[keep], site.y_train[keep],
                    site.x_test, site.y_test, site.features)  # fmt: skip


def test_node_config_keys():
    assert Guards.from_node_config({}) == Guards(3, 3, 3.0)
    got = Guards.from_node_config(
        {"min-rows": 10, "min-class-rows": "5", "min-rows-per-feature": 0.5, "site": "H1"}
    )
    assert got == Guards(10, 5, 0.5)
    assert got.moment_floor(7) == 4  # ceil(0.5 * 7)
    bad = [("min-rows", -1), ("min-class-rows", 2.5), ("min-rows", "many")]
    bad += [("min-rows-per-feature", float("inf")), ("min-rows-per-feature", -0.1)]
    for key, value in bad:
        with pytest.raises(InputError, match=f"node-config: {key} must be"):
            Guards.from_node_config({key: value})


def test_a_site_below_its_class_floor_refuses_and_the_run_names_it():
    sites = simulate(n_sites=4, n_features=3, n_train=40, seed=2)
    sites[2] = _with_positives(sites[2], 2)  # two rows of a class: refused by default
    with pytest.raises(SiteInputError) as err:
        gfed.run_methods_inprocess(GrAUCConfig(), sites, ["grauc"])
    text = str(err.value)
    assert text.startswith(f"site {sites[2].site}: min-class-rows: refuses to take part")
    assert "2 rows of class 1, below its floor of 3" in text
    # the site's own floor decides: at 5, three rows refuse; at 1, a lone row takes part
    sites[2] = _with_positives(simulate(n_sites=4, n_features=3, n_train=40, seed=2)[2], 3)
    strict = GrAUCClient(sites[2], 1e-3, guards=Guards(min_class_rows=5))
    with pytest.raises(InputError, match="3 rows of class 1, below its floor of 5"):
        strict.get_properties({})
    sites[2] = _with_positives(sites[2], 1)
    clients = [GrAUCClient(s, 1e-3, index=k, guards=Guards(min_class_rows=1))
               for k, s in enumerate(sites)]  # fmt: skip
    strategy = gfed.make_strategy("grauc", GrAUCConfig(max_rounds=5), 4, Registry(), sites)
    run_inprocess(strategy, clients, 6)
    assert set(strategy.evaluation) == {s.site for s in sites}


def test_a_class_the_site_lacks_is_no_cell():
    sites = simulate(n_sites=4, n_features=3, n_train=40, seed=2)
    sites[1] = _with_positives(sites[1], 0)
    cfg = GrAUCConfig(missing_class="borrow", max_rounds=5)
    res = gfed.run_methods_inprocess(cfg, sites, ["grauc"])["grauc"]
    assert res.coefficients.shape == (4, 3)


def test_rows_floor_for_rowfed():
    rng = np.random.default_rng(0)
    client = RowFedClient(ClientSamples("c1", rng.standard_normal((2, 3)), rng.random((2, 2))))
    with pytest.raises(InputError, match="input error at site c1: min-rows: refuses to take "
                       "part with 2 rows, below its floor of 3"):  # fmt: skip
        client.get_properties({})
    assert RowFedClient(client.data, guards=Guards(min_rows=2)).get_properties({})["n"] == 2
    # the problem family's sites (a crime state of two communities) take part, moments too
    bench = RowFedClient(client.data, guards=Guards.for_benchmark())
    assert bench.get_properties({})["n"] == 2
    assert Guards.for_benchmark() == Guards(0, 0, 0.0)


def test_each_client_refuses_second_moments_itself():
    site = simulate(n_sites=1, n_features=5, n_train=12, seed=1)[0]  # 12 rows < 3 x 5
    client = GrAUCClient(site, 1e-3)
    with pytest.raises(InputError, match="min-rows-per-feature: refuses to send a Hessian "
                       "with 12 rows, below its floor of 15"):  # fmt: skip
        client.fit([np.zeros(5)], {"task": "newton"})
    with pytest.raises(InputError, match="refuses to send a covariance"):
        client.evaluate([np.zeros(5)], {"sandwich-at": np.zeros(5).tobytes()})
    assert client.fit([np.zeros(5)], {"task": "gradient"})[0][0].shape == (5,)  # first moments
    open_site = GrAUCClient(site, 1e-3, guards=Guards(min_rows_per_feature=2.0))
    assert open_site.fit([np.zeros(5)], {"task": "newton"})[0][0].shape == (5, 6)
    rng = np.random.default_rng(1)
    rowfed = RowFedClient(ClientSamples("c1", rng.standard_normal((8, 4)), rng.random((8, 2))))
    with pytest.raises(InputError, match="refuses to send X'X with 8 rows, below its floor of 12"):
        rowfed.fit([np.zeros((4, 2))], {"task": "newton", "scale": None})


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ({"curvature": "exact"}, "curvature = exact"),
        ({"inference": "oracle"}, "inference = oracle"),
    ],
)
def test_the_server_refuses_a_run_needing_moments_before_its_first_round(setting, named):
    sites = simulate(n_sites=4, n_features=5, n_train=40, seed=3)
    small = sites[3]
    keep = np.r_[np.flatnonzero(small.y_train == 1)[:7], np.flatnonzero(small.y_train == 0)[:7]]
    sites[3] = SiteData(small.site, small.lat, small.lon, small.x_train[keep],
                        small.y_train[keep], small.x_test, small.y_test)  # fmt: skip
    clients = [GrAUCClient(s, 1e-3, index=k) for k, s in enumerate(sites)]
    strategy = gfed.make_strategy("grauc", GrAUCConfig(**setting), 4, Registry(), sites)
    with pytest.raises(InputError) as err:
        run_inprocess(strategy, clients, 5)
    text = str(err.value)
    assert text.startswith(f"{named}: needs second moments, which site(s) {sites[3].site} "
                           "(14 rows, floor 15) refuse")  # fmt: skip
    assert strategy.rounds == 0  # stopped before its first round


def test_rowfed_server_names_the_guard(tmp_path):
    rng = np.random.default_rng(4)
    frames = []
    for m, n in enumerate((40, 40, 10)):
        f = pd.DataFrame(rng.standard_normal((n, 5)), columns=[f"x{j}" for j in range(5)])
        f.insert(0, "Y1", rng.standard_normal(n))
        f.insert(0, "client", f"c{m}")
        frames.append(f)
    pd.concat(frames).to_csv(tmp_path / "train.csv", index=False)
    data = rsources.read_fit_csv(str(tmp_path / "train.csv"), "Y1")
    with pytest.raises(InputError, match=r"curvature = exact: needs second moments, which "
                       r"site\(s\) c2 \(10 rows, floor 15\)"):  # fmt: skip
        rfed.run_methods_inprocess(RowFedConfig(curvature="exact"), data, ["rowfed"])


def test_fit_applies_a_floor_only_when_asked_and_names_the_sites(tmp_path, capsys):
    """In ``fit`` every row is on the user's machine: a site below the default floors takes
    part, named in one note and in ``metrics.json``; the same floor given as an option
    stops the fit in one line (exit 2, nothing written), as a site's node config would."""
    import json

    sites = simulate(n_sites=3, n_features=2, n_train=30, seed=5)
    sites[0] = _with_positives(sites[0], 1)
    rows, places = [], []
    for s in sites:
        frame = pd.DataFrame(s.x_train, columns=["a", "b"])
        frame.insert(0, "y", s.y_train)
        frame.insert(0, "site", s.site)
        rows.append(frame)
        places.append({"site": s.site, "lat": s.lat, "lon": s.lon})
    pd.concat(rows).to_csv(tmp_path / "data.csv", index=False)
    pd.DataFrame(places).to_csv(tmp_path / "sites.csv", index=False)
    base = ["fit", "--data", str(tmp_path / "data.csv"), "--sites", str(tmp_path / "sites.csv")]
    out = tmp_path / "fit"
    assert grauc_main([*base, "--out", str(out), "--quiet"]) == 0
    err = capsys.readouterr().err
    note = [line for line in err.splitlines() if line.startswith("note: across hospitals")]
    assert len(note) == 1 and f"{sites[0].site} (min-class-rows: 1 row of class 1" in note[0]
    guards = json.loads((out / "metrics.json").read_text())["guards"]
    assert guards["applied"] == {"min_rows": 0, "min_class_rows": 0, "min_rows_per_feature": 0}
    assert list(guards["refused_at_default_floors"]) == [sites[0].site]
    strict = tmp_path / "strict"
    code = grauc_main([*base, "--out", str(strict), "--min-class-rows", "3"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error: site "), err
    assert "min-class-rows: refuses to take part with 1 row of class 1" in err[-1]
    assert err[-1].endswith("below its floor of 3 (fit's --min-class-rows)"), err[-1]
    assert not strict.exists()
    assert grauc_main([*base, "--out", str(strict), "--min-rows", "-1"]) == 2
    assert capsys.readouterr().err.strip().endswith("error: min-rows: must be >= 0, got -1")
    assert not strict.exists()


def test_a_fold_is_checked_for_moments_not_rows():
    site = _with_positives(simulate(n_sites=1, n_features=2, n_train=12, seed=3)[0], 3)
    client = GrAUCClient(site, 1e-3, guards=Guards(min_class_rows=3, min_rows_per_feature=5))
    assert client.get_properties({})["n_pos"] == 3  # the site meets its floor
    fold = client.view({"fold": 0, "folds": 3})
    assert min(fold.data.n_pos, fold.data.n_neg) < 3  # below the floor, yet it registers
    assert fold.get_properties({})["n"] == len(fold.data.y_train)
    with pytest.raises(InputError, match="min-rows-per-feature: refuses to send a Hessian"):
        fold.fit([np.zeros(2)], {"task": "newton"})
