"""Waiting for the sites before the first round (``registration.*``): sites registered as
their nodes connect, the missing ones named while waiting and at the timeout, a quorum
that lets a run go on, sites that are not expected refused.  Real Flower client manager,
nodes answering the properties exchange as a site's ClientApp does."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest
from flwr.common import Code, GetPropertiesRes, Status
from flwr.server.client_manager import SimpleClientManager
from flwr.server.client_proxy import ClientProxy

from strategies.config import RegistrationConfig, registration_config
from strategies.errors import InputError
from strategies.server.registry import Registry, registration_properties


class SiteNode(ClientProxy):
    """A node that answers the properties exchange for ``site`` (and nothing else)."""

    def __init__(self, cid: str, site: str, index: int = -1) -> None:
        super().__init__(cid)
        self.site, self.index, self.asked = site, index, 0

    def get_properties(self, ins, timeout, group_id):
        self.asked += 1
        x = np.arange(6.0).reshape(3, 2)
        props = registration_properties(self.site, 3, self.index, x, ("a", "b"))
        return GetPropertiesRes(Status(Code.OK, ""), props)

    def fail(self, *args, **kwargs):
        raise AssertionError("registration only asks for properties")

    get_parameters = fit = evaluate = reconnect = fail


def manager(*sites: str) -> SimpleClientManager:
    mgr = SimpleClientManager()
    for k, s in enumerate(sites):
        mgr.register(SiteNode(f"node-{k}", s, k))
    return mgr


def messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records]


def test_every_site_there_registers_at_once():
    reg = Registry(waiting=RegistrationConfig(timeout=60.0))
    t0 = time.monotonic()
    clients = reg.settle(manager("H1", "H2", "H3"), 3, None, 0)
    assert time.monotonic() - t0 < 5
    assert reg.order() == ["H1", "H2", "H3"] and len(clients) == 3
    assert reg.settled and reg.absent == []


def test_a_site_that_connects_while_waiting_is_registered():
    mgr = manager("H1", "H2")
    reg = Registry(waiting=RegistrationConfig(timeout=60.0, log_every=0.2))
    late = threading.Timer(0.5, lambda: mgr.register(SiteNode("node-late", "H3", 2)))
    late.start()
    t0 = time.monotonic()
    try:
        reg.settle(mgr, 3, None, 0)
    finally:
        late.cancel()
    assert 0.4 < time.monotonic() - t0 < 10
    assert reg.order() == ["H1", "H2", "H3"]


def test_missing_sites_are_named_while_waiting_and_at_the_timeout(caplog):
    reg = Registry(waiting=RegistrationConfig(timeout=0.8, log_every=0.25, sites="H1,H2,H3"))
    mgr = manager("H1", "H2")
    with caplog.at_level(logging.INFO, logger="flwr"):
        with pytest.raises(InputError) as err:
            reg.settle(mgr, 3, None, 0)
    assert str(err.value) == (
        "registration.timeout: 2 of 3 sites registered within 0.8 s; missing: H3"
    )
    waiting = [m for m in messages(caplog) if m.startswith("registration: 2 of 3 sites after")]
    assert len(waiting) >= 2, messages(caplog)
    assert all(m.endswith("(H1, H2); waiting for H3") for m in waiting)
    # each node was asked once, not once per poll
    assert [n.asked for n in mgr.all().values()] == [1, 1]


def test_without_expected_names_the_count_is_given():
    reg = Registry(waiting=RegistrationConfig(timeout=0.3))
    with pytest.raises(InputError, match=r"1 of 3 sites .* missing: \(unnamed 2: name the"):
        reg.settle(manager("H1"), 3, None, 0)


def test_a_quorum_goes_on_without_the_absent_site(caplog):
    reg = Registry(waiting=RegistrationConfig(timeout=0.3, quorum=0.6, sites="H1,H2,H3"))
    with caplog.at_level(logging.WARNING, logger="flwr"):
        reg.settle(manager("H1", "H2"), 3, None, 0)
    assert reg.order() == ["H1", "H2"] and reg.absent == ["H3"]
    assert any("going on without H3" in m for m in messages(caplog))
    # below the quorum the run does not start
    reg = Registry(waiting=RegistrationConfig(timeout=0.3, quorum=0.7, sites="H1,H2,H3"))
    with pytest.raises(InputError, match="missing: H3"):
        reg.settle(manager("H1", "H2"), 3, None, 0)


def test_an_unexpected_site_is_refused_once(caplog):
    mgr = manager("H1", "X9", "H2")
    reg = Registry(waiting=RegistrationConfig(timeout=0.5, quorum=0.5, sites="H1,H2,H3"))
    with caplog.at_level(logging.WARNING, logger="flwr"):
        reg.settle(mgr, 3, None, 0)
    assert reg.order() == ["H1", "H2"]
    assert mgr.all()["node-1"].asked == 1
    assert any(
        "site X9 (node node-1) is not among registration.sites" in m for m in messages(caplog)
    )
    reg.settle(mgr, 3, None, 1)  # settled: later calls register newcomers only
    assert mgr.all()["node-1"].asked == 1


def test_later_calls_do_not_wait():
    reg = Registry(waiting=RegistrationConfig(timeout=0.2, quorum=0.5))
    mgr = manager("H1", "H2")
    reg.settle(mgr, 3, None, 0)
    t0 = time.monotonic()
    reg.settle(mgr, 3, None, 1)
    assert time.monotonic() - t0 < 0.1


@pytest.mark.parametrize(
    ("rc", "message"),
    [
        ({"registration.timeout": 0.0}, "registration.timeout: must be > 0, got 0.0"),
        ({"registration.log-every": -1.0}, "registration.log-every: must be > 0, got -1.0"),
        ({"registration.quorum": 1.5}, "registration.quorum: must be in (0, 1], got 1.5"),
        ({"registration.sites": "A,B,A"}, "registration.sites: names a site twice, got 'A,B,A'"),
        ({"registration.bogus": 1}, "registration.bogus: unknown setting"),
        ({"registration.timeout": "soon"}, "timeout: expected a float, got 'soon'"),
    ],
)
def test_bad_registration_settings_name_the_key(rc, message):
    with pytest.raises(InputError) as err:
        registration_config(rc)
    assert message in str(err.value)


def test_expected_sites_must_match_the_number_of_sites():
    reg = Registry(waiting=RegistrationConfig(sites="H1,H2"))
    with pytest.raises(InputError, match="registration.sites: names 2 sites, the run has 3"):
        reg.settle(manager("H1", "H2"), 3, None, 0)


def test_weight_config_gives_each_site_its_share_of_the_rows():
    """``size-power a``: each site weights its loss by ``Z n_z^a / sum n^a`` (brute force
    over the registered sizes); ``a = 0`` sends nothing and every weight is 1."""
    from strategies.server.registry import Registry
    from strategies.solvers.local import site_weight

    sizes = {"a": 10, "b": 30, "c": 60}
    registry = Registry()
    for k, (site, n) in enumerate(sizes.items()):
        registry.register(str(k), {"site": site, "n": n})
    assert registry.weight_config(0.0) == {}
    assert site_weight({}, 10) == 1.0
    for power in (1.0, 0.5):
        config = registry.weight_config(power)
        got = np.array([site_weight(config, n) for n in sizes.values()])
        n = np.array(list(sizes.values()), dtype=float)
        np.testing.assert_allclose(got, 3 * n**power / (n**power).sum(), rtol=1e-14)
    np.testing.assert_allclose(
        [site_weight(registry.weight_config(1.0), n) for n in sizes.values()], [0.3, 0.9, 1.8]
    )
    # a node that registers later does not change the weights of the federation's sites
    before = registry.weight_config(1.0, ["a", "b", "c"])
    registry.register("9", {"site": "late", "n": 500})
    assert registry.weight_config(1.0, ["a", "b", "c"]) == before
    assert registry.weight_config(1.0) != before
