"""``bench --scale`` of both methods: what one evaluation, one default fit and one tuning
cost against the data's size, with the fitted log-log slope.

Each method lists its cells (:class:`Cell`: what is measured, along which axis, at which
size, by which function); this module runs every cell in a fresh process (spawned, so its
peak resident memory is its own and nothing is cached from the cell before), prints a line
per cell with the time left, and writes ``scale.csv`` (a row per cell), ``slopes.csv`` (a
row per measurement and axis: the least-squares slope of log time on log size) and
``scale.png`` (one log-log panel per axis).  A cell's function returns a dict with at least
``seconds``; ``peak_MiB`` is added here.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import resource
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..runtime.cli import atomic_output_dir
from .benchtable import check_out


@dataclass(frozen=True)
class Cell:
    """One measurement: ``what`` (e.g. ``gradient``, ``fit``, ``tune``) along ``axis`` (e.g.
    ``rows a site``, ``clients``, ``p = q``) at ``size``, by ``call``
    (``"module:function"``, run with ``kwargs``)."""

    method: str
    what: str
    axis: str
    size: int
    call: str
    kwargs: dict = field(default_factory=dict)


def _run_cell(call: str, kwargs: dict) -> dict:
    module, name = call.split(":")
    out = dict(getattr(importlib.import_module(module), name)(**kwargs))
    out["peak_MiB"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return out


def slope(sizes: Sequence[float], seconds: Sequence[float]) -> float:
    """The least-squares slope of ``log(seconds)`` on ``log(size)``: 1 is linear, 2
    quadratic.

    Parameters
    ----------
    sizes : sequence of float
        The sizes.
    seconds : sequence of float
        The time at each size; only pairs with a positive size and time count.

    Returns
    -------
    float
        The slope; nan for fewer than two sizes.
    """
    x, y = np.asarray(sizes, float), np.asarray(seconds, float)
    keep = (x > 0) & (y > 0)
    x, y = np.log(x[keep]), np.log(y[keep])
    if x.size < 2 or np.ptp(x) == 0:
        return float("nan")
    return float(np.polyfit(x, y, 1)[0])


def slopes(frame: pd.DataFrame) -> pd.DataFrame:
    """A row per (method, what, axis): the sizes' range and the slope of the time on them."""
    rows = []
    for (method, what, axis), part in frame.groupby(["method", "what", "axis"], sort=False):
        part = part.sort_values("size")
        rows.append(
            {
                "method": method,
                "what": what,
                "axis": axis,
                "from": int(part["size"].iloc[0]),
                "to": int(part["size"].iloc[-1]),
                "slope": slope(part["size"], part["seconds"]),
            }
        )
    return pd.DataFrame(rows)


def figure(frame: pd.DataFrame, path: str) -> None:
    """One log-log panel per axis: seconds against size, a line per measurement, each
    labelled with its slope.

    Parameters
    ----------
    frame : pandas.DataFrame
        The cells' table (:func:`run_scale`): ``method``, ``what``, ``axis``, ``size`` and
        ``seconds``.
    path : str
        Where the figure is saved.
    """
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes_names = list(dict.fromkeys(frame["axis"]))
    fig, axes = plt.subplots(
        1, len(axes_names), figsize=(4.4 * len(axes_names), 4.6), squeeze=False
    )
    for ax, name in zip(axes[0], axes_names, strict=True):
        part = frame[frame["axis"] == name]
        for (method, what), line in part.groupby(["method", "what"], sort=False):
            line = line.sort_values("size")
            k = slope(line["size"], line["seconds"])
            label = f"{method} {what}" + (f" (slope {k:.2f})" if np.isfinite(k) else "")
            ax.plot(line["size"], line["seconds"], marker="o", label=label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        sizes = sorted(set(part["size"]))
        ax.set_xticks(sizes, [f"{v:,}" for v in sizes])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel(name)
        ax.set_ylabel("seconds")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_scale(
    cells: Sequence[Cell], out: str = "", progress: Callable[[str], None] | None = None
) -> pd.DataFrame:
    """Run the cells, each in a fresh process, and write ``scale.csv``, ``slopes.csv`` and
    ``scale.png``.

    Parameters
    ----------
    cells : sequence of Cell
        The measurements.
    out : str, optional
        The output directory (written atomically); empty: nothing is written.
    progress : callable, optional
        ``progress(line)``: a line before each cell (the cell, the seconds so far and an
        estimate of those left).

    Returns
    -------
    pandas.DataFrame
        The cells' table: a row per cell, ``method``, ``what``, ``axis``, ``size`` and what
        its function returned, with ``peak_MiB``.
    """
    check_out(out)
    rows = []
    t0 = time.perf_counter()
    context = multiprocessing.get_context("spawn")
    for i, cell in enumerate(cells):
        if progress is not None:
            done = time.perf_counter() - t0
            left = f"; about {done / i * (len(cells) - i):.0f} s left" if i else ""
            progress(
                f"scale: cell {i + 1}/{len(cells)} {cell.method} {cell.what}, "
                f"{cell.axis} {cell.size} ({done:.0f} s{left})"
            )
        with ProcessPoolExecutor(1, mp_context=context) as pool:
            result = pool.submit(_run_cell, cell.call, cell.kwargs).result()
        rows.append(
            {"method": cell.method, "what": cell.what, "axis": cell.axis, "size": cell.size}
            | result
        )
    frame = pd.DataFrame(rows)
    if out:
        with atomic_output_dir(out) as tmp:
            frame.to_csv(os.path.join(tmp, "scale.csv"), index=False)
            slopes(frame).to_csv(os.path.join(tmp, "slopes.csv"), index=False)
            figure(frame, os.path.join(tmp, "scale.png"))
    return frame


def add_scale_option(parser) -> None:
    """``--scale`` of a ``bench`` command (both methods: the same option, the same files)."""
    parser.add_argument(
        "--scale",
        action="store_true",
        help="instead: time and peak memory of one evaluation, one default fit and one "
        "tuning against the data's size, each in a fresh process (scale.csv, slopes.csv, "
        "scale.png; --quick: the small end)",
    )


def format_scale(frame: pd.DataFrame) -> str:
    """The cells and the slopes as text."""
    cols = [c for c in ("method", "what", "axis", "size", "seconds", "peak_MiB", "rounds")
            if c in frame.columns]  # fmt: skip
    lines = [frame[cols].to_string(index=False, float_format=lambda v: f"{v:.4g}"), ""]
    lines.append(slopes(frame).to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    return "\n".join(lines)


__all__ = ["Cell", "add_scale_option", "figure", "format_scale", "run_scale", "slope", "slopes"]
