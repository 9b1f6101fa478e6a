"""A site whose own data or node config is wrong ends the run once, naming the site and the
field: the ClientApp marks its input errors with the site, the server finds the mark in the
failure Flower reports and stops (no re-asking every round)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from flwr.app import Context, RecordDict

from grauc_flower import federation as fed
from grauc_flower.client import GrAUCClient
from grauc_flower.data import simulate
from strategies.app import _client_fn
from strategies.config import GrAUCConfig
from strategies.errors import InputError, SiteInputError, at_site, site_input_error
from strategies.runtime.engine import run_inprocess
from strategies.server.registry import Registry


def _context(node_config: dict, task: str = "grauc") -> Context:
    return Context(
        run_id=1,
        node_id=7,
        node_config=node_config,
        state=RecordDict(),
        run_config={"task": task},
    )


def _site_file(tmp_path, y) -> str:
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.standard_normal((len(y), 2)), columns=["x1", "x2"])
    frame.insert(0, "y", y)
    path = tmp_path / "site.csv"
    frame.to_csv(path, index=False)
    return str(path)


@pytest.mark.parametrize("task", ["grauc", "rowfed"])
def test_a_deployed_node_without_data_path_is_an_error_not_simulated_data(task):
    with pytest.raises(InputError) as err:
        _client_fn(_context({"site": "H09"}, task))
    assert str(err.value).startswith("input error at site H09: data-path: missing")
    assert str(site_input_error(err.value)).startswith("site H09: data-path: missing")


def test_y_outside_0_1_names_the_site_and_column(tmp_path):
    path = _site_file(tmp_path, [0, 1, 2, 1, 0])
    node = {"data-path": path, "site": "H03", "lat": 40.7, "lon": -74.0}
    with pytest.raises(InputError) as err:
        _client_fn(_context(node))
    assert str(site_input_error(err.value)) == (
        "site H03: data: column 'y' must be 0 or 1 with no missing values"
    )


@pytest.mark.parametrize(("key", "value"), [("lat", 123.4), ("lon", -181.0), ("lat", "north")])
def test_location_out_of_range_names_the_site_and_key(tmp_path, key, value):
    path = _site_file(tmp_path, [0, 1, 0, 1])
    node = {"data-path": path, "site": "H03", "lat": 40.7, "lon": -74.0, key: value}
    with pytest.raises(InputError) as err:
        _client_fn(_context(node))
    message = str(site_input_error(err.value))
    assert message.startswith(f"site H03: node-config: {key} ")


def _rowfed_file(tmp_path, edit=None) -> str:
    rng = np.random.default_rng(1)
    frame = pd.DataFrame(rng.standard_normal((6, 2)), columns=["x1", "x2"])
    frame.insert(0, "Y1", rng.standard_normal(6))
    frame.insert(0, "client", "c1")
    if edit is not None:
        frame = edit(frame)
    path = tmp_path / "client.csv"
    frame.to_csv(path, index=False)
    return str(path)


def _rowfed_context(node: dict) -> Context:
    ctx = _context(node, "rowfed")
    ctx.run_config.update({"rowfed-data.source": "deployment", "rowfed-data.responses": "Y1"})
    return ctx


@pytest.mark.parametrize(
    ("edit", "node", "message"),
    [
        (None, {"index": "first"}, "node-config: index must be an integer, got 'first'"),
        (None, {"index": -3}, "node-config: index must be >= 0 (or -1: none), got -3"),
        (None, {"client": "c9"}, "data-path: need exactly one client"),
        (lambda f: f.assign(x2="high"), {}, "data: column 'x2'"),
        (lambda f: f.drop(columns="Y1"), {}, "Y1"),
        ("missing", {}, "not found"),
    ],
)
def test_a_rowfed_site_checks_its_own_data_and_node_config(tmp_path, edit, node, message):
    path = str(tmp_path / "nowhere.csv") if edit == "missing" else _rowfed_file(tmp_path, edit)
    with pytest.raises(InputError) as err:
        _client_fn(_rowfed_context({"data-path": path, "client": "c1", **node}))
    found = str(site_input_error(err.value))
    assert found.startswith("site c") and message in found, found


def test_a_rowfed_site_with_good_input_answers(tmp_path):
    client = _client_fn(_rowfed_context({"data-path": _rowfed_file(tmp_path), "index": 2}))
    assert client is not None


def test_the_mark_is_found_whatever_carried_it():
    inner = at_site("H03", InputError("data: column 'y' must be 0 or 1"))
    flower_deployment = ValueError(
        f"Message contains an Error (reason: <class 'strategies.errors.InputError'>:<'{inner}'>)."
        " It originated during client-side execution of a message."
    )
    flower_simulation = RuntimeError(f"\nException ClientAppException occurred. Message: {inner}\n")
    for failure in (inner, flower_deployment, flower_simulation):
        assert str(site_input_error(failure)) == "site H03: data: column 'y' must be 0 or 1"
    assert site_input_error(RuntimeError("site offline")) is None
    assert site_input_error(InputError("data: column 'y' must be 0 or 1")) is None


class _BadAtRound(GrAUCClient):
    """A site whose data turn out wrong when it is first asked to fit (``at``: "fit"), or
    when it registers ("register")."""

    fits = 0

    def __init__(self, *args, at, **kwargs):
        super().__init__(*args, **kwargs)
        self.at = at

    def get_properties(self, config):
        if self.at == "register":
            raise at_site(self.data.site, InputError("data: column 'y' must be 0 or 1"))
        return super().get_properties(config)

    def fit(self, parameters, config):
        type(self).fits += 1
        if self.at == "fit":
            raise at_site(self.data.site, InputError("data: column 'x2' is not numeric"))
        return super().fit(parameters, config)


@pytest.mark.parametrize("at", ["register", "fit"])
def test_the_run_ends_at_the_first_input_error_naming_the_site(at):
    sites = simulate(n_sites=4, n_features=3, n_train=30, seed=5)
    cfg = GrAUCConfig(max_rounds=50, min_fit_fraction=0.5)
    clients = [GrAUCClient(s, cfg.ridge, index=k) for k, s in enumerate(sites)]
    clients[2] = _BadAtRound(sites[2], cfg.ridge, index=2, at=at)
    strategy = fed.make_strategy("grauc", cfg, len(sites), Registry(), sites)
    with pytest.raises(SiteInputError) as err:
        run_inprocess(strategy, clients, cfg.max_rounds)
    field = "column 'y'" if at == "register" else "column 'x2'"
    assert str(err.value).startswith(f"site {sites[2].site}: data: {field}")
    assert strategy.rounds == 0  # no round completed; the site was not asked again
    assert _BadAtRound.fits <= 1
