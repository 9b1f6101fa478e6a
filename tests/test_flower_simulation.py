"""Flower's simulation engine (a real SuperLink, real Ray): the same numbers as in-process,
and the main job of the README."""

from __future__ import annotations

import os
import re

import numpy as np
import pandas as pd
import pytest
from conftest import ROOT, run_module

pytestmark = [pytest.mark.flower, pytest.mark.slow]


def test_flower_engine_equals_inprocess(small_federation, tmp_path):
    """``fit --engine flower`` against the in-process engine, with partial participation
    (full participation through ``flwr run``: the main job below)."""
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
            "--inference",
            "oracle",
            "--participation",
            "0.5",  # a seeded half of the sites per round: the same draws in both engines
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
    assert list(hb["n_answered"]) == list(ha["n_answered"])
    assert hb["n_answered"].min() < len(a)  # some rounds asked only part of the sites
    ia = pd.read_csv(os.path.join(outs["inprocess"], "inference.csv"))
    ib = pd.read_csv(os.path.join(outs["flower"], "inference.csv"))
    assert ia[["site", "feature", "kind"]].equals(ib[["site", "feature", "kind"]])
    for column in ("estimate", "se", "lower", "upper"):
        np.testing.assert_allclose(ib[column], ia[column], rtol=0, atol=1e-8)


def test_main_job_prints_auc_table(tmp_path):
    """The README's main job: GrAUC-PFL vs FedAvg vs individual on the default simulated
    data, per-institution and mean test AUC; GrAUC-PFL's mean is the highest."""
    proc = run_module("grauc_flower", "run", "--out", str(tmp_path / "main"), timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # progress by default: each method's round lines, not Flower's own log
    for method, limit in (("grauc", 300), ("fedavg", 100)):
        assert re.search(rf"^{method}: round 1/{limit}, objective ", proc.stderr, re.M)
    assert "configure_fit" not in proc.stderr and "[ROUND" not in proc.stderr
    assert "INFO" not in proc.stdout
    lines = proc.stdout.splitlines()
    header = next(ln for ln in lines if ln.startswith("site"))
    assert header.split()[1:] == ["grauc", "fedavg", "individual"]
    rows = [ln.split() for ln in lines if re.match(r"^S\d+\s", ln)]
    assert len(rows) == 20
    mean = next(ln.split() for ln in lines if ln.startswith("mean"))
    means = dict(zip(header.split()[1:], map(float, mean[1:]), strict=True))
    assert means["grauc"] > means["fedavg"] and means["grauc"] > means["individual"]
    rounds = dict(
        part.split()[:2]
        for part in next(ln for ln in lines if ln.startswith("rounds: "))[8:].split(", ")
    )
    assert 5 <= int(rounds["grauc"]) <= 30  # the default converges in a few rounds (25)
    # each method's directory has the sites' places and counts, from their registration
    where = pd.read_csv(tmp_path / "main" / "grauc" / "sites.csv", dtype={"site": str})
    from grauc_flower import federation as fed

    sites, _ = fed.load_sites(fed.DataSpec())
    assert list(where["site"]) == [s.site for s in sites]
    np.testing.assert_allclose(where[["lat", "lon"]], [[s.lat, s.lon] for s in sites])
    assert list(where["n_pos"]) == [s.n_pos for s in sites]
    auc = pd.read_csv(tmp_path / "main" / "auc.csv")
    assert set(auc["method"]) == {"grauc", "fedavg", "individual"}
    np.testing.assert_allclose(
        auc.groupby("method")["auc"].mean()["grauc"], means["grauc"], atol=1e-4
    )


def test_rowfed_app_prints_three_metrics_for_four_methods():
    """``python -m rowfed_flower run`` with the RowFed config's settings: MSE-Est, MSE-Pred
    and RI for RowFed, NonFed, FedAvg and PerFL-LSMA (the run command's default methods) on
    the built-in simulated data; RowFed's MSE-Est is the lowest; no Flower log line.
    (Round limits are lowered so the test stays short.)"""
    import json
    import tomllib

    with open(os.path.join(ROOT, "configs", "rowfed_sim.toml"), "rb") as fh:
        doc = tomllib.load(fh)
    rc = {f"rowfed.{k}": v for k, v in doc["rowfed"].items()}
    rc.update({"rowfed.max-rounds": 40, "rowfed.fedavg-rounds": 12})
    items = [arg for k, v in rc.items() for arg in ("--run-config", f"{k}={json.dumps(v)}")]
    proc = run_module("rowfed_flower", "run", "--num-clients", "10", *items, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "INFO" not in proc.stdout
    lines = proc.stdout.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("method") and "MSE-Est" in ln)
    table = {}
    for ln in lines[start + 1 : start + 5]:
        name, est, pred, ri = ln.split()
        table[name] = (float(est), float(pred), float(ri))
    assert set(table) == {"rowfed", "nonfed", "fedavg", "perfl-lsma"}
    assert min(table, key=lambda m: table[m][0]) == "rowfed"
    assert all(np.isfinite(v).all() for v in map(np.array, table.values()))
