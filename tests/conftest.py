"""Shared fixtures: small federations written to real CSV files."""

from __future__ import annotations

import os
import sys

import numpy as np
import pandas as pd
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")


def write_grauc_csv(tmp_path, sites, features=None) -> tuple[str, str]:
    """Write ``sites`` (``SiteData`` list) as DATA.csv and SITES.csv; return their paths."""
    p = sites[0].x_train.shape[1]
    features = features or [f"f{k}" for k in range(p)]
    rows = []
    for s in sites:
        frame = pd.DataFrame(s.x_train, columns=features)
        frame.insert(0, "y", s.y_train)
        frame.insert(0, "site", s.site)
        rows.append(frame)
    data = os.path.join(tmp_path, "data.csv")
    pd.concat(rows).to_csv(data, index=False)
    site_file = os.path.join(tmp_path, "sites.csv")
    pd.DataFrame([{"site": s.site, "lat": s.lat, "lon": s.lon} for s in sites]).to_csv(
        site_file, index=False
    )
    return data, site_file


@pytest.fixture
def small_federation(tmp_path):
    """Six sites, four features, from a seed the implementation never uses elsewhere."""
    from grauc_flower.data import simulate

    sites = simulate(simulation=1, n_sites=6, n_features=4, n_train=40, seed=90210)
    data, site_file = write_grauc_csv(str(tmp_path), sites)
    return sites, data, site_file


def run_module(module: str, *args: str, timeout: float = 600):
    """Run ``python -m module args`` and return the CompletedProcess."""
    import subprocess

    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


@pytest.fixture
def rng():
    return np.random.default_rng(12345)
