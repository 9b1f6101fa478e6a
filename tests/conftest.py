"""Shared fixtures: small federations written to real CSV files."""

from __future__ import annotations

import os
import sys

import numpy as np
import pandas as pd
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")

#: Seconds each test file took with ``python -m pytest -n 2`` (two busy cores), rounded: the
#: order in which xdist hands the files out (``--dist loadfile --no-loadscope-reorder``),
#: longest first, so that the short files fill the end of both workers.  A file not listed
#: counts 0.3 s a test.  Only the order depends on these numbers, never a result.
FILE_SECONDS = {
    "test_flower_simulation.py": 180,
    "test_deployment.py": 150,
    "test_federated_tuning.py": 100,
    "test_api.py": 95,
    "test_flower_family.py": 70,
    "test_rowfed_fit.py": 60,
    "test_study.py": 60,
    "test_deployment_inputs.py": 55,
    "test_pqn.py": 55,
    "test_deployment_rowfed.py": 45,
    "test_fit_tuning.py": 40,
    "test_grauc_cli.py": 27,
    "test_grauc_reference.py": 26,
    "test_launch.py": 20,
    "test_report.py": 20,
    "test_rowfed_strategy.py": 19,
}


def pytest_collection_modifyitems(config, items):
    """On an xdist worker, the test files longest first (:data:`FILE_SECONDS`); within a
    file, the collected order."""
    if not hasattr(config, "workerinput"):
        return
    counts: dict[str, int] = {}
    for item in items:
        counts[item.path.name] = counts.get(item.path.name, 0) + 1

    def seconds(item) -> float:
        name = item.path.name
        return FILE_SECONDS.get(name, 0.3 * counts[name])

    items.sort(key=lambda item: -seconds(item))  # stable: a file's tests keep their order


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


def parse_page(path: str) -> dict:
    """Read a report page with the standard library's HTML parser: its section ids in
    order, its images' ``src`` and every ``src``/``href`` attribute, the tags used, and the
    text of each table cell.  Asserts nothing; the tests do."""
    from html.parser import HTMLParser

    class Page(HTMLParser):
        def __init__(self):
            super().__init__()
            self.sections, self.images, self.links, self.tags, self.cells = [], [], [], set(), []
            self._cell = None

        def handle_starttag(self, tag, attrs):
            attrs = dict(attrs)
            self.tags.add(tag)
            if tag == "section":
                self.sections.append(attrs.get("id"))
            if tag == "img":
                self.images.append((self.sections[-1] if self.sections else None, attrs["src"]))
            self.links += [v for k, v in attrs.items() if k in ("src", "href") and v]
            if tag == "td":
                self._cell = ""

        def handle_endtag(self, tag):
            if tag == "td" and self._cell is not None:
                self.cells.append((self.sections[-1] if self.sections else None, self._cell))
                self._cell = None

        def handle_data(self, data):
            if self._cell is not None:
                self._cell += data

    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    page = Page()
    page.feed(text)
    return {
        "sections": page.sections,
        "images": page.images,
        "links": page.links,
        "tags": page.tags,
        "cells": page.cells,
        "text": text,
    }


def assert_self_contained(page: dict) -> None:
    """Every image a PNG inside the page; no script, style sheet link, frame or URL out."""
    import base64

    assert page["images"], "no image"
    for _, src in page["images"]:
        assert src.startswith("data:image/png;base64,"), src[:60]
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    for link in page["links"]:
        assert link.startswith(("data:", "#")), link[:60]
    assert not page["tags"] & {"script", "link", "iframe", "object", "embed"}
    assert "http://" not in page["text"] and "https://" not in page["text"]


def flwr_warnings(caplog, fn):
    """``fn()`` and the warnings it logged on Flower's logger (which may not propagate)."""
    import logging

    flwr_logger = logging.getLogger("flwr")
    flwr_logger.addHandler(caplog.handler)
    caplog.clear()
    try:
        with caplog.at_level(logging.WARNING, logger="flwr"):
            out = fn()
    finally:
        flwr_logger.removeHandler(caplog.handler)
    # a record reaches the handler twice when Flower's logger also propagates to the root
    records = {id(r): r for r in caplog.records}.values()
    return out, [r.getMessage() for r in records if r.levelno == logging.WARNING]


@pytest.fixture(scope="session")
def pki(tmp_path_factory):
    """A CA, a SuperLink certificate and four SuperNode key pairs for the deployment tests
    (:mod:`loopback`), made once per test process: RSA-4096 keys take seconds."""
    from strategies.runtime.deploy import make_certificates, make_node_key

    out = str(tmp_path_factory.mktemp("certs"))
    return {
        "dir": out,
        "certs": make_certificates(out),
        "keys": [make_node_key(out, f"node-{k + 1}") for k in range(4)],
    }
