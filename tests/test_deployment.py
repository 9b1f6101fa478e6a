"""Flower's Deployment Engine on loopback: a SuperLink with TLS and SuperNode authentication,
three SuperNodes each with its own data file.  Every process is stopped by its pid, also when
a test fails."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import tomli_w
from conftest import ROOT

from grauc_flower import federation as fed
from grauc_flower.data import simulate
from strategies.config import GrAUCConfig
from strategies.runtime.deploy import (
    PlanSite,
    make_certificates,
    make_node_key,
    make_plan,
    start,
    supernode_command,
)
from strategies.runtime.launch import run_id_of
from strategies.runtime.processes import (
    console_script,
    flower_env,
    free_port,
    stop_process,
    wait_for_port,
)

pytestmark = [pytest.mark.deployment, pytest.mark.slow]

if shutil.which("openssl") is None or shutil.which("ssh-keygen") is None:
    pytest.skip("openssl and ssh-keygen are needed", allow_module_level=True)

FEATURES = ["age", "bmi", "sbp"]


class Federation:
    """The documented deployment (:func:`strategies.runtime.deploy.make_plan`, the commands
    docs/deployment.md shows) on loopback: a SuperLink with TLS and SuperNode
    authentication, a default connection, registered keys, one SuperNode per site, runs
    through the plan's launcher; every process started and stopped by its pid."""

    def __init__(self, root: str, pki: dict, n_sites: int = 3, base: dict | None = None) -> None:
        self.root = root
        self.home = os.path.join(root, "flwr-home")
        os.makedirs(self.home, exist_ok=True)
        self.procs: list[subprocess.Popen] = []
        self.nodes: dict[str, subprocess.Popen] = {}
        self.sites = simulate(n_sites=n_sites, n_features=len(FEATURES), n_train=40, seed=31337)
        self.certs = pki["certs"]
        self.keys = pki["keys"]  # the last key is never registered
        for s in self.sites:
            frame = pd.DataFrame(s.x_train, columns=FEATURES)
            frame.insert(0, "y", s.y_train)
            frame.to_csv(self.data_path(s.site), index=False)
        self.port = free_port()
        self.run_config_path = os.path.join(root, "run_config.toml")
        self.plan = make_plan(
            f"127.0.0.1:{self.port}",
            pki["dir"],
            [
                PlanSite(s.site, self.data_path(s.site), s.lat, s.lon, port=free_port())
                for s in self.sites
            ],
            base or {"task": "grauc", "method": "grauc", "data.num-sites": n_sites},
            superlink_host="127.0.0.1",
            database=os.path.join(self.home, "state.db"),
            run_config_path=self.run_config_path,
            app_dir=ROOT,
            python=sys.executable,
        )
        self.superlink = start(self.plan.superlink, self.home, "superlink.log")
        self.procs.append(self.superlink)
        try:  # a failure here (a refused registration) still stops the SuperLink by its pid
            wait_for_port(self.port, self.superlink)
            with open(os.path.join(self.home, "config.toml"), "wb") as fh:
                tomli_w.dump(self.plan.flower_config, fh)
            for cmd in self.plan.register:
                self.flwr(*cmd[1:])
        except BaseException:
            self.close()
            raise

    def data_path(self, site: str) -> str:
        return os.path.join(self.root, f"{site}.csv")

    def flwr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [console_script("flwr"), *args],
            env=flower_env(self.home),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return proc

    def start_node(self, k: int, node_config: str | None = None) -> subprocess.Popen:
        """Site ``k``'s SuperNode as planned (``node_config`` replaces its node config)."""
        site = self.sites[k].site
        cmd = list(self.plan.supernodes[site])
        if node_config is not None:
            cmd[cmd.index("--node-config") + 1] = node_config
        proc = start(
            cmd, self.home, f"supernode-{k}-{len(self.procs)}.log", self.plan.supernode_env
        )
        self.procs.append(proc)
        self.nodes[site] = proc
        return proc

    def launch(self, run_config: dict) -> subprocess.Popen:
        """The plan's run command (the project's launcher) with ``run_config`` added."""
        with open(self.run_config_path, "wb") as fh:
            tomli_w.dump({**self.plan.run_config, **run_config}, fh)
        proc = subprocess.Popen(
            self.plan.run,
            cwd=ROOT,
            env=flower_env(self.home),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.procs.append(proc)
        return proc

    def run(self, run_config: dict, timeout: float = 900) -> tuple[int, str]:
        """Launch and wait: ``(exit status, output)``."""
        proc = self.launch(run_config)
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out

    def close(self) -> None:
        for proc in reversed(self.procs):
            stop_process(proc, grace=5)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, the SuperLink's certificate and four SuperNode key pairs, made once (RSA-4096
    keys take seconds) for every SuperLink of this module."""
    out = str(tmp_path_factory.mktemp("certs"))
    return {
        "dir": out,
        "certs": make_certificates(out),
        "keys": [make_node_key(out, f"node-{k + 1}") for k in range(4)],
    }


@pytest.fixture(scope="module")
def federation(tmp_path_factory, pki):
    fedn = Federation(str(tmp_path_factory.mktemp("deploy")), pki)
    try:
        for k in range(len(fedn.sites)):
            fedn.start_node(k)
        yield fedn
    finally:
        fedn.close()
        assert all(p.poll() is not None for p in fedn.procs)


def test_tls_auth_run_equals_inprocess(federation, tmp_path):
    out = str(tmp_path / "out")
    rounds = 3
    code, text = federation.run(
        {"grauc.max-rounds": rounds, "grauc.standardize": "federated", "out-dir": out}
    )
    assert code == 0, text[-3000:]
    coef = pd.read_csv(os.path.join(out, "coefficients.csv"))
    assert list(coef.columns) == ["site", *FEATURES]
    ref = fed.run_methods_inprocess(
        GrAUCConfig(max_rounds=rounds, standardize="federated"), federation.sites, ["grauc"]
    )["grauc"]
    assert list(coef["site"]) == ref.sites
    np.testing.assert_allclose(coef[FEATURES].to_numpy(), ref.coefficients, rtol=0, atol=1e-8)
    metrics = json.load(open(os.path.join(out, "metrics.json")))
    assert metrics["rounds"] == rounds and metrics["missing_sites"] == []
    # the operations commands see the run through the default connection
    listing = json.loads(federation.flwr("ls", "--format", "json").stdout)
    assert [r["status"] for r in listing["runs"]] == ["finished:completed"]


def test_tls_auth_tuned_run_equals_inprocess(federation, tmp_path):
    """The tuning inside the federation across SuperNodes (TLS, authentication): the same
    cross-validation table, choice and coefficients as the in-process engine."""
    from grauc_flower.federated_tuning import run_tuned_inprocess
    from grauc_flower.tuning import Grid
    from strategies.stats.tuning import CVOptions

    out = str(tmp_path / "tuned")
    tune = {"tune.by": "cv", "tune.folds": 2, "tune.lam-grid": "0.3,0.03"}
    tune.update({"tune.w-dist-grid": "1.0", "tune.ridge-grid": "0.1"})
    code, text = federation.run({**tune, "grauc.max-rounds": 30, "out-dir": out})
    assert code == 0, text[-3000:]
    grid = Grid(lam=(0.3, 0.03), w_dist=(1.0,), ridge=(0.1,))
    ref = run_tuned_inprocess(
        GrAUCConfig(max_rounds=30), federation.sites, "grauc", (CVOptions(folds=2), grid)
    )
    coef = pd.read_csv(os.path.join(out, "coefficients.csv"))
    np.testing.assert_array_equal(coef[FEATURES].to_numpy(), ref.coefficients)
    cv = pd.read_csv(os.path.join(out, "cv.csv"))
    pd.testing.assert_frame_equal(cv, ref.extra["tuning_table"][1], check_dtype=False)
    metrics = json.load(open(os.path.join(out, "metrics.json")))
    assert metrics["tuned"] == ref.extra["tuning_metrics"]["tuned"]
    assert metrics["tuning"]["rounds"] == ref.extra["tuning_metrics"]["tuning"]["rounds"] > 0


def test_unregistered_supernode_is_refused(federation):
    cmd = supernode_command(
        f"127.0.0.1:{federation.port}",
        federation.certs["ca"],
        federation.keys[-1][0],
        free_port(),
        'site="intruder"',
    )
    proc = start(cmd, federation.home, "intruder.log")
    federation.procs.append(proc)
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("an unregistered SuperNode was not refused within 120 s")
    log = open(proc.log_path).read()
    assert proc.returncode != 0
    assert "305" in log or "Failed to activate SuperNode" in log


def test_killed_supernode_run_finishes_and_reports(federation, tmp_path):
    out = str(tmp_path / "out")
    victim = federation.sites[2].site
    run = federation.launch(
        {
            "grauc.max-rounds": 4,
            "grauc.min-fit-fraction": 0.6,
            "round-timeout": 15.0,
            "out-dir": out,
        }
    )
    lines, killed = [], False
    deadline = time.monotonic() + 900
    for line in run.stdout:
        lines.append(line)
        if not killed and re.search(r"grauc round 2(/\d+)?:", line):
            stop_process(federation.nodes[victim], grace=2)  # by its pid
            killed = True
        assert time.monotonic() < deadline, "the run did not finish"
    run.wait(timeout=60)
    text = "".join(lines)
    assert killed, text[-3000:]
    assert run.returncode == 0, text[-3000:]
    metrics = json.load(open(os.path.join(out, "metrics.json")))
    assert metrics["rounds"] == 4
    assert metrics["missing_sites"] == [victim]
    assert text.count(f"no answer at the end from site(s) {victim}") == 1, text[-3000:]


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
    """Two hospitals, the second absent, then with a wrong file or node config, or with a
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
        frame = pd.read_csv(path)
        frame.loc[0, "y"] = 2
        frame.to_csv(str(tmp_path / "y2.csv"), index=False)
        cases = {
            f'data-path="{tmp_path / "y2.csv"}" site="{bad}" lat=40.0 lon=-75.0 index=1': (
                f"site {bad}: data: column 'y' must be 0 or 1"
            ),
            f'site="{bad}" lat=40.0 lon=-75.0 index=1': (
                f"site {bad}: data-path: missing from the SuperNode's node config"
            ),
            f'data-path="{path}" site="{bad}" lat=123.4 lon=0 index=1': (
                f"site {bad}: node-config: lat must be within [-90, 90], got 123.4"
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


def test_rowfed_runs_the_same_way(tmp_path, pki):
    """RowFed in deployment, as planned for ``--task rowfed``: the server has no data
    (``rowfed-data.source = deployment``); each SuperNode reads its own file; the
    coefficients equal the in-process fit; then the GIC tuning inside the federation equals
    the in-process tuning."""
    from rowfed_flower import federation as rfed
    from rowfed_flower import sources as rsources
    from rowfed_flower.federated_tuning import run_tuned_inprocess
    from strategies.config import RowFedConfig
    from strategies.stats.tuning import CVOptions

    base = {
        "task": "rowfed",
        "method": "rowfed",
        "rowfed-data.source": "deployment",
        "rowfed-data.num-clients": 3,
        "rowfed-data.responses": "Y1,Y2",
    }
    fedn = Federation(str(tmp_path), pki, n_sites=3, base=base)
    try:
        rng = np.random.default_rng(4)
        frames = []
        for k, s in enumerate(fedn.sites):
            x = rng.standard_normal((30, 3))
            y = x @ rng.standard_normal((3, 2)) + 0.3 * rng.standard_normal((30, 2))
            frame = pd.DataFrame(x, columns=FEATURES)
            frame.insert(0, "Y2", y[:, 1])
            frame.insert(0, "Y1", y[:, 0])
            frame.insert(0, "client", s.site)
            frame.to_csv(fedn.data_path(s.site), index=False)
            frames.append(frame)
            fedn.start_node(k)
        out = str(tmp_path / "out")
        rounds = 3
        code, text = fedn.run(
            {"rowfed.max-rounds": rounds, "rowfed.participation": 0.7, "out-dir": out}
        )
        assert code == 0, text[-3000:]
        got = pd.read_csv(os.path.join(out, "coefficients.csv"), dtype={"client": str})
        pooled = str(tmp_path / "all.csv")
        pd.concat(frames).to_csv(pooled, index=False)
        data = rsources.read_fit_csv(pooled, "Y1,Y2")
        cfg = RowFedConfig(max_rounds=rounds, participation=0.7)
        ref = rfed.run_methods_inprocess(cfg, data, ["rowfed"])["rowfed"]
        want = rfed.coefficients_frame(ref, data.features, data.responses)
        assert list(got["client"]) == list(want["client"].astype(str))
        assert list(got["feature"]) == list(want["feature"])
        np.testing.assert_allclose(
            got[["Y1", "Y2"]].to_numpy(), want[["Y1", "Y2"]].to_numpy(), rtol=0, atol=1e-8
        )
        # the GIC tuning inside the federation, on the same SuperNodes: the in-process
        # tuning's table, choice and coefficients
        tuned = str(tmp_path / "tuned")
        grids = {"tune.lam1-grid": "0.3,0.03", "tune.lam2-grid": "0.05,0.005"}
        code, text = fedn.run({"tune.by": "gic", **grids, "out-dir": tuned})
        assert code == 0, text[-3000:]
        options = (CVOptions(quiet=True), (0.3, 0.03), (0.05, 0.005), None)
        ref = run_tuned_inprocess(RowFedConfig(), data, "rowfed", ("gic", options))
        name, table = ref.extra["tuning_table"]
        pd.testing.assert_frame_equal(
            pd.read_csv(os.path.join(tuned, name)), table, check_dtype=False
        )
        got = pd.read_csv(os.path.join(tuned, "coefficients.csv"), dtype={"client": str})
        want = rfed.coefficients_frame(ref, data.features, data.responses)
        np.testing.assert_allclose(
            got[["Y1", "Y2"]].to_numpy(), want[["Y1", "Y2"]].to_numpy(), rtol=0, atol=1e-8
        )
        metrics = json.load(open(os.path.join(tuned, "metrics.json")))
        assert metrics["tuning"]["selected"] == ref.extra["tuning_metrics"]["tuning"]["selected"]
        assert metrics["tuning"]["rounds"] == ref.extra["tuning_metrics"]["tuning"]["rounds"]
    finally:
        fedn.close()
        assert all(p.poll() is not None for p in fedn.procs)
