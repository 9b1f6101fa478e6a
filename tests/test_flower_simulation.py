"""Flower's simulation engine (a real SuperLink, real Ray): the same numbers as in-process,
and the main job of the README."""

from __future__ import annotations

import os
import re

import numpy as np
import pandas as pd
import pytest
from conftest import run_module

pytestmark = [pytest.mark.flower, pytest.mark.slow]


def test_flower_engine_equals_inprocess(small_federation, tmp_path):
    _, data, sites = small_federation
    outs = {}
    for engine in ("inprocess", "flower"):
        out = str(tmp_path / engine)
        proc = run_module(
            "grauc_flower",
            "fit",
            "--data",
            data,
            "--sites",
            sites,
            "--out",
            out,
            "--engine",
            engine,
            "--quiet",
            "--max-rounds",
            "60",
            "--standardize",
            "federated",
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        outs[engine] = out
    a = pd.read_csv(os.path.join(outs["inprocess"], "coefficients.csv"))
    b = pd.read_csv(os.path.join(outs["flower"], "coefficients.csv"))
    assert list(a["site"]) == list(b["site"])
    np.testing.assert_allclose(
        b.iloc[:, 1:].to_numpy(), a.iloc[:, 1:].to_numpy(), rtol=0, atol=1e-8
    )
    ha = pd.read_csv(os.path.join(outs["inprocess"], "history.csv"))
    hb = pd.read_csv(os.path.join(outs["flower"], "history.csv"))
    np.testing.assert_allclose(hb["objective"], ha["objective"], rtol=1e-12)


def test_main_job_prints_auc_table(tmp_path):
    """The README's main job: GrAUC-PFL vs FedAvg vs individual on the default simulated
    data, per-institution and mean test AUC; GrAUC-PFL's mean is the highest."""
    proc = run_module("grauc_flower", "run", "--out", str(tmp_path / "main"), timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    header = next(ln for ln in lines if ln.startswith("site"))
    assert header.split()[1:] == ["grauc", "fedavg", "individual"]
    rows = [ln.split() for ln in lines if re.match(r"^S\d+\s", ln)]
    assert len(rows) == 20
    mean = next(ln.split() for ln in lines if ln.startswith("mean"))
    means = dict(zip(header.split()[1:], map(float, mean[1:]), strict=True))
    assert means["grauc"] > means["fedavg"] and means["grauc"] > means["individual"]
    auc = pd.read_csv(tmp_path / "main" / "auc.csv")
    assert set(auc["method"]) == {"grauc", "fedavg", "individual"}
    np.testing.assert_allclose(
        auc.groupby("method")["auc"].mean()["grauc"], means["grauc"], atol=1e-4
    )
