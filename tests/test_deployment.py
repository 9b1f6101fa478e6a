"""Flower's Deployment Engine on loopback (:mod:`loopback`): a SuperLink with TLS and SuperNode
authentication, three SuperNodes each with its own data file.  Every process is stopped by its
pid, also when a test fails.  RowFed's deployment run is in test_deployment_rowfed.py, the
bad-input runs in test_deployment_inputs.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import numpy as np
import pandas as pd
import pytest
from loopback import FEATURES, MARKS, Federation

from strategies.config import GrAUCConfig
from strategies.runtime.deploy import start, supernode_command
from strategies.runtime.processes import free_port, stop_process

pytestmark = MARKS


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


def test_tls_auth_tuned_run_equals_inprocess(federation, tmp_path):
    """A run across SuperNodes (TLS, authentication) equals the in-process engine: the
    tuning inside the federation gives the same cross-validation table and choice, and the
    chosen setting's fit (a plain fit's rounds, federated standardization) the same
    coefficients; the run's status is ``finished:completed`` through the default
    connection.  (The killed-SuperNode run below is a plain fit.)"""
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
    assert list(coef.columns) == ["site", *FEATURES]
    assert list(coef["site"]) == ref.sites
    np.testing.assert_array_equal(coef[FEATURES].to_numpy(), ref.coefficients)
    cv = pd.read_csv(os.path.join(out, "cv.csv"))
    pd.testing.assert_frame_equal(cv, ref.extra["tuning_table"][1], check_dtype=False)
    metrics = json.load(open(os.path.join(out, "metrics.json")))
    assert metrics["tuned"] == ref.extra["tuning_metrics"]["tuned"]
    assert metrics["tuning"]["rounds"] == ref.extra["tuning_metrics"]["tuning"]["rounds"] > 0
    assert metrics["rounds"] == ref.rounds and metrics["missing_sites"] == []
    # the operations commands see the run through the default connection
    listing = json.loads(federation.flwr("ls", "--format", "json").stdout)
    assert [r["status"] for r in listing["runs"]] == ["finished:completed"]


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
