"""Bad input in deployment (the federation of :mod:`loopback`): an absent site, a node config
without its data file, a disclosure guard a site's rows do not meet.  Its own file, so that
xdist can run it beside the other deployment tests.  Every input check is also tested
without Flower (test_site_errors.py, test_guards.py, test_registration.py); here the error
travels from a SuperNode to the launcher's last line."""

from __future__ import annotations

import json
import re
import time

from loopback import MARKS, Federation

from strategies.runtime.launch import run_id_of
from strategies.runtime.processes import stop_process

pytestmark = MARKS


def _fails_naming(fedn: Federation, run_config: dict, message: str, within: float) -> str:
    """The launcher exits 1 within ``within`` seconds with ``error: <message>`` as its last
    line, no round ran, and the run's status is failed."""
    t0 = time.monotonic()
    code, text = fedn.run({"round-timeout": 60.0, **run_config}, timeout=300)
    assert time.monotonic() - t0 < within, text[-3000:]
    assert code == 1, text[-3000:]
    assert text.splitlines()[-1].startswith(f"error: {message}"), text[-3000:]
    assert "grauc round 1" not in text
    run_id = run_id_of(text)
    listing = json.loads(fedn.flwr("ls", "--run-id", run_id, "--format", "json").stdout)
    assert [r["status"] for r in listing["runs"]] == ["finished:failed"]
    return text


def _online(fedn: Federation) -> int:
    nodes = json.loads(fedn.flwr("supernode", "ls", "--format", "json").stdout)["nodes"]
    return sum(n["status"] == "online" for n in nodes)


def test_bad_input_or_an_absent_site_ends_the_run_naming_it(tmp_path, pki):
    """Two hospitals, the second absent, then with no data file in its node config, or with a
    disclosure guard its rows do not meet: each run ends at registration within one round
    timeout (not after a round limit of re-asking); the launcher's last line names the site
    and the field, its exit status is 1 and the run's status failed.  One SuperLink; the
    second SuperNode restarts for each case."""
    fedn = Federation(str(tmp_path), pki, n_sites=2)
    try:
        here, bad = (s.site for s in fedn.sites)
        fedn.start_node(0)
        rc = {"registration.timeout": 8.0, "registration.log-every": 3.0}
        message = f"registration.timeout: 1 of 2 sites registered within 8 s; missing: {bad}"
        text = _fails_naming(fedn, rc, message, within=60)
        waiting = rf"registration: 1 of 2 sites after \d+ s \({here}\); waiting for {bad}"
        assert re.search(waiting, text), text[-3000:]

        path = fedn.data_path(bad)
        cases = {
            f'site="{bad}" lat=40.0 lon=-75.0 index=1': (
                f"site {bad}: data-path: missing from the SuperNode's node config"
            ),
            # a disclosure guard the hospital sets itself (strategies/client/guards.py)
            f'data-path="{path}" site="{bad}" lat=40.0 lon=-75.0 index=1 min-class-rows=100000': (
                f"site {bad}: min-class-rows: refuses to take part with"
            ),
        }
        for node_config, message in cases.items():
            node = fedn.start_node(1, node_config)
            _fails_naming(fedn, {}, message, within=60)
            stop_process(node, grace=5)  # a stopped SuperNode leaves the SuperLink's list
            deadline = time.monotonic() + 90
            while _online(fedn) > 1:
                assert time.monotonic() < deadline, "the stopped SuperNode is still online"
                time.sleep(1)
    finally:
        fedn.close()
