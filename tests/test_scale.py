"""``bench --scale`` (strategies/experiments/scale.py): the slope of a power law, the files a
run writes, each cell in its own process, and the cells both methods declare.  Times are
measured by the bench command itself, never asserted here."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from grauc_flower import scale as gscale
from rowfed_flower import scale as rscale
from strategies.experiments import scale


@pytest.mark.parametrize("power", [0.5, 1.0, 2.0])
def test_slope_of_a_power_law(power):
    sizes = np.array([1e3, 1e4, 1e5, 1e6])
    assert scale.slope(sizes, 3.0 * sizes**power) == pytest.approx(power, abs=1e-12)
    assert np.isnan(scale.slope([10.0], [1.0]))


def test_slopes_per_measurement_and_axis():
    frame = pd.DataFrame(
        {
            "method": ["m"] * 4,
            "what": ["fit", "fit", "tune", "tune"],
            "axis": ["rows"] * 4,
            "size": [10, 100, 10, 100],
            "seconds": [1.0, 10.0, 1.0, 100.0],
        }
    )
    out = scale.slopes(frame).set_index("what")
    assert out.loc["fit", "slope"] == pytest.approx(1.0)
    assert out.loc["tune", "slope"] == pytest.approx(2.0)
    assert (out["from"] == 10).all() and (out["to"] == 100).all()


def _pid() -> dict:
    return {"seconds": 0.0, "pid": os.getpid()}


def test_a_scale_run_writes_its_table_slopes_and_figure(tmp_path):
    here = f"{__name__}:_pid"
    cells = [
        scale.Cell("grauc", "gradient", "rows a site", 1000, "grauc_flower.scale:scale_gradient",
                   {"rows": 1000, "p": 3, "repeats": 1}),
        scale.Cell("grauc", "gradient", "rows a site", 2000, "grauc_flower.scale:scale_gradient",
                   {"rows": 2000, "p": 3, "repeats": 1}),
        scale.Cell("test", "pid", "rows a site", 1, here),
        scale.Cell("test", "pid", "rows a site", 2, here),
    ]  # fmt: skip
    lines: list[str] = []
    out = tmp_path / "scale"
    frame = scale.run_scale(cells, str(out), progress=lines.append)
    assert {"scale.csv", "scale.png", "slopes.csv"} <= set(os.listdir(out))
    table = pd.read_csv(out / "scale.csv")
    assert list(table["size"]) == [1000, 2000, 1, 2]
    assert (table["seconds"] >= 0).all() and (table["peak_MiB"] > 0).all()
    pids = set(frame.loc[frame["what"] == "pid", "pid"])
    assert len(pids) == 2 and os.getpid() not in pids  # each cell in a fresh process
    assert len(lines) == 4 and lines[-1].startswith("scale: cell 4/4")
    assert len(pd.read_csv(out / "slopes.csv")) == 2


def test_both_methods_declare_cells_for_every_axis():
    grauc = gscale.scale_cells(quick=False)
    assert {c.what for c in grauc} == {"gradient", "gradient, pair loop", "fit", "tune cv"}
    assert max(c.size for c in grauc if c.what == "gradient") == 1_000_000
    assert max(c.size for c in gscale.scale_cells(max_rows=10_000)) == 10_000
    rowfed = rscale.scale_cells(quick=False)
    assert {c.axis for c in rowfed} == {"clients", "p = q", "rows a client"}
    assert {c.size for c in rowfed if c.axis == "clients"} == {10, 20, 50}
    assert {c.kwargs.get("pq") for c in rowfed if c.axis == "clients"} == {100}


def test_the_scale_design_has_the_stated_prevalence():
    sites = gscale.scale_sites(5000, n_sites=3)
    share = np.mean(np.concatenate([s.y_train for s in sites]))
    assert 0.08 < share < 0.16
    assert len({(s.lat, s.lon) for s in sites}) == 3


def test_a_bad_max_rows_is_one_line(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "grauc_flower", "bench", "--scale", "--max-rows", "10",
         "--out", str(tmp_path / "o")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == ["error: --max-rows: must be at least 1000, got 10"]
    assert not (tmp_path / "o").exists()
