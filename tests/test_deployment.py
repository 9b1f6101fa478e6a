"""Flower's Deployment Engine on loopback: a SuperLink with TLS and SuperNode authentication,
three SuperNodes each with its own data file.  Every process is stopped by its pid, also when
a test fails."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
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
    make_certificates,
    make_node_key,
    start_superlink,
    start_supernode,
)
from strategies.runtime.simulation import _bin, flower_env, free_port, stop_process, wait_for_port

pytestmark = [pytest.mark.deployment, pytest.mark.slow]

if shutil.which("openssl") is None or shutil.which("ssh-keygen") is None:
    pytest.skip("openssl and ssh-keygen are needed", allow_module_level=True)

FEATURES = ["age", "bmi", "sbp"]


class Federation:
    """A SuperLink (TLS + SuperNode auth) and SuperNodes, all started and stopped by pid."""

    def __init__(self, root: str, pki: dict, n_sites: int = 3) -> None:
        self.root = root
        self.home = os.path.join(root, "flwr-home")
        os.makedirs(self.home, exist_ok=True)
        self.procs: list[subprocess.Popen] = []
        self.nodes: dict[str, subprocess.Popen] = {}
        self.sites = simulate(n_sites=n_sites, n_features=len(FEATURES), n_train=40, seed=31337)
        self.certs = pki["certs"]
        self.keys = pki["keys"][: n_sites + 1]  # the last key is never registered
        for s in self.sites:
            frame = pd.DataFrame(s.x_train, columns=FEATURES)
            frame.insert(0, "y", s.y_train)
            frame.to_csv(self.data_path(s.site), index=False)
        self.port = free_port()
        self.superlink = start_superlink(self.home, self.port, self.certs, auth=True)
        self.procs.append(self.superlink)
        wait_for_port(self.port, self.superlink)
        with open(os.path.join(self.home, "config.toml"), "wb") as fh:
            tomli_w.dump(
                {
                    "superlink": {
                        "default": "hospitals",
                        "hospitals": {
                            "address": f"127.0.0.1:{self.port}",
                            "root-certificates": self.certs["ca"],
                        },
                    }
                },
                fh,
            )
        for _, pub in self.keys[:n_sites]:
            self.flwr("supernode", "register", pub, "hospitals")

    def data_path(self, site: str) -> str:
        return os.path.join(self.root, f"{site}.csv")

    def flwr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [_bin("flwr"), *args],
            env=flower_env(self.home),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return proc

    def start_node(self, k: int, key_index: int | None = None) -> subprocess.Popen:
        s = self.sites[k]
        node_config = (
            f'data-path="{self.data_path(s.site)}" site="{s.site}" lat={s.lat} '
            f"lon={s.lon} index={k}"
        )
        private = self.keys[k if key_index is None else key_index][0]
        proc = start_supernode(
            self.home,
            f"127.0.0.1:{self.port}",
            free_port(),
            node_config,
            self.certs["ca"],
            private,
            f"supernode-{k}-{len(self.procs)}.log",
        )
        self.procs.append(proc)
        self.nodes[s.site] = proc
        return proc

    def run(self, run_config: dict, timeout: float = 900) -> str:
        path = os.path.join(self.root, f"run-{len(self.procs)}.toml")
        with open(path, "wb") as fh:
            tomli_w.dump(run_config, fh)
        return self.flwr(
            "run", ROOT, "hospitals", "--stream", "--run-config", path, timeout=timeout
        ).stdout

    def close(self) -> None:
        for proc in reversed(self.procs):
            stop_process(proc, grace=5)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, the SuperLink's certificate and four SuperNode key pairs, made once (RSA-4096
    keys take seconds) for every SuperLink of this module."""
    out = str(tmp_path_factory.mktemp("certs"))
    return {
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
    rounds = 4
    federation.run(
        {
            "method": "grauc",
            "data.num-sites": 3,
            "grauc.max-rounds": rounds,
            "grauc.standardize": "federated",
            "out-dir": out,
        }
    )
    coef = pd.read_csv(os.path.join(out, "coefficients.csv"))
    assert list(coef.columns) == ["site", *FEATURES]
    ref = fed.run_methods_inprocess(
        GrAUCConfig(max_rounds=rounds, standardize="federated"), federation.sites, ["grauc"]
    )["grauc"]
    assert list(coef["site"]) == ref.sites
    np.testing.assert_allclose(coef[FEATURES].to_numpy(), ref.coefficients, rtol=0, atol=1e-8)
    metrics = json.load(open(os.path.join(out, "metrics.json")))
    assert metrics["rounds"] == rounds and metrics["missing_sites"] == []
    # the operations commands see the run
    listing = federation.flwr("ls").stdout
    assert "finished" in listing.lower()


def test_unregistered_supernode_is_refused(federation):
    proc = start_supernode(
        federation.home,
        f"127.0.0.1:{federation.port}",
        free_port(),
        'site="intruder"',
        federation.certs["ca"],
        federation.keys[-1][0],
        "intruder.log",
    )
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
    run_config = {
        "method": "grauc",
        "data.num-sites": 3,
        "grauc.max-rounds": 5,
        "grauc.min-fit-fraction": 0.6,
        "round-timeout": 15.0,
        "out-dir": out,
    }
    path = os.path.join(federation.root, "kill.toml")
    with open(path, "wb") as fh:
        tomli_w.dump(run_config, fh)
    run = subprocess.Popen(
        [_bin("flwr"), "run", ROOT, "hospitals", "--stream", "--run-config", path],
        env=flower_env(federation.home),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    federation.procs.append(run)
    lines, killed = [], False
    deadline = time.monotonic() + 900
    for line in run.stdout:
        lines.append(line)
        if not killed and "grauc round 2:" in line:
            stop_process(federation.nodes[victim], grace=2)  # by its pid
            killed = True
        assert time.monotonic() < deadline, "the run did not finish"
    run.wait(timeout=60)
    text = "".join(lines)
    assert killed, text[-3000:]
    assert run.returncode == 0, text[-3000:]
    metrics = json.load(open(os.path.join(out, "metrics.json")))
    assert metrics["rounds"] == 5
    assert metrics["missing_sites"] == [victim]
    assert f"no answer at the end from site(s) {victim}" in text
    coef = pd.read_csv(os.path.join(out, "coefficients.csv"))
    assert np.isfinite(coef[FEATURES].to_numpy()).all()


def test_a_site_with_bad_data_ends_the_run_naming_it(tmp_path, pki):
    """``y = 2`` in one hospital's file: the run ends at registration (not after a round
    limit of re-asking), its log names the site and the column, and its status is failed."""
    fedn = Federation(str(tmp_path), pki, n_sites=2)
    try:
        bad = fedn.sites[1].site
        frame = pd.read_csv(fedn.data_path(bad))
        frame.loc[0, "y"] = 2
        frame.to_csv(fedn.data_path(bad), index=False)
        for k in range(2):
            fedn.start_node(k)
        path = os.path.join(fedn.root, "bad.toml")
        with open(path, "wb") as fh:
            tomli_w.dump({"method": "grauc", "data.num-sites": 2, "round-timeout": 60.0}, fh)
        t0 = time.monotonic()
        proc = subprocess.run(
            [_bin("flwr"), "run", ROOT, "hospitals", "--stream", "--run-config", path],
            env=flower_env(fedn.home),
            capture_output=True,
            text=True,
            timeout=300,
        )
        text = proc.stdout + proc.stderr
        assert time.monotonic() - t0 < 60, text[-3000:]  # within one round timeout
        assert f"error: site {bad}: data: column 'y' must be 0 or 1" in text, text[-3000:]
        assert "grauc round 1" not in text
        listing = fedn.flwr("ls", "--format", "json").stdout
        assert '"finished:failed"' in listing.replace(" ", ""), listing
    finally:
        fedn.close()


def test_rowfed_runs_the_same_way(tmp_path, pki):
    """RowFed in deployment: the server has no data (``rowfed-data.source = deployment``);
    each SuperNode reads its own file; the coefficients equal the in-process fit."""
    from rowfed_flower import federation as rfed
    from strategies.config import RowFedConfig

    fedn = Federation(str(tmp_path), pki, n_sites=3)
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
            node_config = f'data-path="{fedn.data_path(s.site)}" index={k}'
            fedn.procs.append(
                start_supernode(
                    fedn.home,
                    f"127.0.0.1:{fedn.port}",
                    free_port(),
                    node_config,
                    fedn.certs["ca"],
                    fedn.keys[k][0],
                    f"rowfed-{k}.log",
                )
            )
        out = str(tmp_path / "out")
        rounds = 3
        fedn.run(
            {
                "task": "rowfed",
                "method": "rowfed",
                "rowfed-data.source": "deployment",
                "rowfed-data.num-clients": 3,
                "rowfed-data.responses": "Y1,Y2",
                "rowfed.max-rounds": rounds,
                "rowfed.participation": 0.7,
                "out-dir": out,
            }
        )
        got = pd.read_csv(os.path.join(out, "coefficients.csv"), dtype={"client": str})
        pooled = str(tmp_path / "all.csv")
        pd.concat(frames).to_csv(pooled, index=False)
        data = rfed.read_fit_csv(pooled, "Y1,Y2")
        cfg = RowFedConfig(max_rounds=rounds, participation=0.7)
        ref = rfed.run_methods_inprocess(cfg, data, ["rowfed"])["rowfed"]
        want = rfed.coefficients_frame(ref, data.features, data.responses)
        assert list(got["client"]) == list(want["client"].astype(str))
        assert list(got["feature"]) == list(want["feature"])
        np.testing.assert_allclose(
            got[["Y1", "Y2"]].to_numpy(), want[["Y1", "Y2"]].to_numpy(), rtol=0, atol=1e-8
        )
    finally:
        fedn.close()
        assert all(p.poll() is not None for p in fedn.procs)
